/*
 * load_safetensors.c - Hugging Face safetensors weights, one file or
 * sharded.
 *
 * File: u64 little-endian N, then N bytes of JSON (parsed with doc.h):
 *   {"__metadata__": {...},
 *    "<name>": {"dtype": "F32"|"F16"|"BF16"|..., "shape": [d0, d1, ...],
 *               "data_offsets": [begin, end]}, ...}
 * then the data section; offsets are relative to its first byte. Every
 * entry is checked before any is used: a name without NULs, known dtype,
 * end - begin equal to the shape's byte size, integers without leading
 * zeros (JSON has none), and the tensors tiling the data section exactly:
 * sorted by offset, the first begins at 0, each next where the previous
 * ended, the last at the section's end (no holes, overlaps or trailing
 * bytes, so a header length off by a few bytes cannot shift every tensor).
 * Duplicate names are refused by doc.c. Only F32, F16 and BF16 tensors
 * can be loaded.
 *
 * The path may name a .safetensors file, a model.safetensors.index.json
 * (its "weight_map" maps each tensor to a shard file in the same folder),
 * or a folder holding either. HF checkpoints rotate q/k with rotate-half
 * (pairs (i, i + head_dim/2)); rows are kept as stored.
 *
 * AWQ and GPTQ checkpoints (a quantization_config in the config.json
 * beside the weights) store their linear layers as 4-bit groups along K
 * instead of NAME.weight: NAME.qweight and NAME.qzeros (I32, eight
 * nibbles a word), NAME.scales (F16) and, for GPTQ, NAME.g_idx (I32).
 * For an [N, K] matrix in groups of G (research/techniques.md, section 1.1):
 *   AWQ (version gemm)  qweight [K][N/8]: column 8j + i of row k is nibble
 *                       AWQ_NIBBLE[i] of word [k][j]; qzeros [K/G][N/8]
 *                       likewise; w = s * (q - z)
 *   GPTQ                qweight [K/8][N]: row 8i + j is nibble j of word
 *                       [i][n]; qzeros [K/G][N/8]: column 8j + i is nibble
 *                       i of word [g][j], the zero minus one
 *                       (checkpoint_format gptq, the default) or the zero
 *                       itself (gptq_v2); g_idx[k] must be k / G (act
 *                       order that regroups rows is refused)
 * scales [K/G][N] either way. They become megac's W4G<G> rows, the same
 * f16 scale, integer zero and nibbles (ir/dtype.h), so nothing is
 * rounded: w = s * (q - z) is what both formats mean, bit for bit.
 */
#include "compiler/doc.h"
#include "compiler/quant.h"
#include "compiler/weights_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define ST_MAX_DIMS 8

typedef struct {
    const char *name;
    int dtype;              /* index into st_dtypes */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;    /* relative to the data section */
} StEntry;

typedef struct {
    const char *path;
    WFile f;
    const unsigned char *data;
    uint64_t data_len;
    StEntry *e;
    int ne;
} StFile;

/* A whole checkpoint: one file, or the shards an index names. */
/* How an AWQ or GPTQ checkpoint packs its linear layers (above). */
typedef enum { HQ_NONE, HQ_AWQ, HQ_GPTQ } HqMethod;
typedef struct {
    HqMethod method;
    int group;              /* 32, 64 or 128 */
    int zero_add;           /* GPTQ v1 stores the zero minus one */
} HfQuant;

typedef struct {
    Arena a;
    const char *path;       /* what the description named */
    HfQuant hq;             /* the config.json beside it says (hq_read) */
    StFile *files;
    int nfiles;
    Doc index;              /* when sharded */
    bool has_index;
    DocNode *weight_map;
    Weights *w;             /* being filled (f16/bf16 matrices keep their bytes) */
} StModel;

static const struct {
    const char *name;
    int size;
    int src;                /* SrcType, or -1: not loadable */
} st_dtypes[] = {
    {"F32", 4, SRC_F32}, {"F16", 2, SRC_F16}, {"BF16", 2, SRC_BF16}, {"F64", 8, -1},
    {"I64", 8, -1}, {"I32", 4, -1}, {"I16", 2, -1}, {"I8", 1, -1}, {"U64", 8, -1},
    {"U32", 4, -1}, {"U16", 2, -1}, {"U8", 1, -1}, {"BOOL", 1, -1},
    {"F8_E4M3", 1, -1}, {"F8_E5M2", 1, -1},
};
#define ST_NDTYPES ((int)(sizeof st_dtypes / sizeof *st_dtypes))

/* ---- one file ---- */

static int st_dtype_find(const char *s)
{
    for (int i = 0; i < ST_NDTYPES; i++)
        if (strcmp(s, st_dtypes[i].name) == 0)
            return i;
    return -1;
}

/* Reads a non-negative integer scalar without reporting at the node (the
 * header is one long line; errors name the tensor instead). JSON numbers
 * have no leading zeros: "016" and "00" are refused, "0" is not. */
static bool st_uint(const DocNode *n, uint64_t *out)
{
    if (!n || n->kind != DOC_SCALAR || n->quoted || n->len == 0 || n->len > 19 || (n->len > 1 && n->str[0] == '0'))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n->len; i++) {
        if (n->str[i] < '0' || n->str[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(n->str[i] - '0');
    }
    *out = v;
    return true;
}

/* entry := {"dtype": str, "shape": [uint...], "data_offsets": [uint, uint]} */
static bool st_entry_parse(StFile *sf, const DocNode *k, const DocNode *v, StEntry *e, Diag *d)
{
    e->name = k->str;
    const DocNode *dt = doc_get(v, "dtype"), *sh = doc_get(v, "shape"), *off = doc_get(v, "data_offsets");
    if (!dt || dt->kind != DOC_SCALAR || !sh || sh->kind != DOC_SEQ || !off || off->kind != DOC_SEQ ||
        off->n != 2) {
        diag_file_error(d, sf->path, "tensor '%s': header entry needs dtype, shape and data_offsets [begin, end]",
                        e->name);
        return false;
    }
    if ((e->dtype = st_dtype_find(dt->str)) < 0) {
        diag_file_error(d, sf->path, "tensor '%s': unknown dtype '%s'", e->name, dt->str);
        return false;
    }
    if (sh->n > ST_MAX_DIMS) {
        diag_file_error(d, sf->path, "tensor '%s': %d dimensions (at most %d)", e->name, sh->n, ST_MAX_DIMS);
        return false;
    }
    e->ndim = sh->n;
    uint64_t nel = 1;
    for (int i = 0; i < sh->n; i++) {
        uint64_t x;
        if (!st_uint(sh->items[i], &x) || x > ((uint64_t)1 << 40) || (x && nel > ((uint64_t)1 << 50) / x)) {
            diag_file_error(d, sf->path, "tensor '%s': shape entry %d is not a valid dimension", e->name, i);
            return false;
        }
        e->shape[i] = (int64_t)x;
        nel *= x;
    }
    if (!st_uint(off->items[0], &e->begin) || !st_uint(off->items[1], &e->end) || e->begin > e->end) {
        diag_file_error(d, sf->path, "tensor '%s': data_offsets must be two integers, begin <= end", e->name);
        return false;
    }
    if (e->end > sf->data_len) {
        diag_file_error(d, sf->path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of "
                        "the data section (%" PRIu64 " bytes)", e->name, e->begin, e->end, sf->data_len);
        return false;
    }
    if (e->end - e->begin != nel * (uint64_t)st_dtypes[e->dtype].size) {
        diag_file_error(d, sf->path, "tensor '%s': data_offsets span %" PRIu64 " bytes, but %s of that shape "
                        "needs %" PRIu64, e->name, e->end - e->begin, dt->str,
                        nel * (uint64_t)st_dtypes[e->dtype].size);
        return false;
    }
    return true;
}

/* By begin, then end, then name (so that an error names a fixed pair). */
static int st_entry_cmp(const void *a, const void *b)
{
    const StEntry *x = *(const StEntry *const *)a, *y = *(const StEntry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Two sorted neighbours: b starts before a ends (an empty b inside a too,
 * as the reference safetensors reader counts it). */
static bool st_overlap_report(const StFile *sf, const StEntry *a, const StEntry *b, Diag *d)
{
    if (b->begin >= a->end)
        return true;
    diag_file_error(d, sf->path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor '%s' [%" PRIu64
                    ", %" PRIu64 "]", b->name, b->begin, b->end, a->name, a->begin, a->end);
    return false;
}

/* After no overlaps: the sorted ranges v[0..n) must tile [0, data_len). */
static bool st_cover_check(const StFile *sf, const StEntry *const *v, int n, Diag *d)
{
    if (n == 0) {
        if (sf->data_len == 0)
            return true;
        diag_file_error(d, sf->path, "the data section has %" PRIu64 " bytes, but the header lists no tensor",
                        sf->data_len);
        return false;
    }
    if (v[0]->begin != 0) {
        diag_file_error(d, sf->path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "]: the first tensor "
                        "begins at byte %" PRIu64 ", not 0", v[0]->name, v[0]->begin, v[0]->end, v[0]->begin);
        return false;
    }
    for (int i = 1; i < n; i++)
        if (v[i]->begin != v[i - 1]->end) {
            diag_file_error(d, sf->path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] leave a hole of "
                            "%" PRIu64 " bytes after tensor '%s' [%" PRIu64 ", %" PRIu64 "]", v[i]->name,
                            v[i]->begin, v[i]->end, v[i]->begin - v[i - 1]->end, v[i - 1]->name, v[i - 1]->begin,
                            v[i - 1]->end);
            return false;
        }
    const StEntry *last = v[n - 1];
    if (last->end != sf->data_len) {
        diag_file_error(d, sf->path, "the data section has %" PRIu64 " bytes after the last tensor's end (tensor "
                        "'%s' [%" PRIu64 ", %" PRIu64 "], of %" PRIu64 " bytes)", sf->data_len - last->end,
                        last->name, last->begin, last->end, sf->data_len);
        return false;
    }
    return true;
}

/* The data section is the tensors' ranges laid end to end: sorted by
 * (begin, end), no two share a byte, then no holes and no trailing bytes.
 * Empty tensors are legal where the previous one ends. Uses the offsets
 * and the file size only (describe and validate read no data). */
static bool st_layout_check(StFile *sf, Diag *d)
{
    const StEntry **v = xmalloc((size_t)(sf->ne ? sf->ne : 1) * sizeof *v);
    for (int i = 0; i < sf->ne; i++)
        v[i] = &sf->e[i];
    qsort(v, (size_t)sf->ne, sizeof *v, st_entry_cmp);
    bool ok = true;
    for (int i = 1; i < sf->ne && ok; i++)
        ok = st_overlap_report(sf, v[i - 1], v[i], d);
    ok = ok && st_cover_check(sf, v, sf->ne, d);
    free(v);
    return ok;
}

/* A tensor name with a NUL would shadow the name before it (names are
 * compared as C strings); reported at its key in the header. */
static bool st_name_check(Doc *doc, const DocNode *k, Diag *d)
{
    if (!memchr(k->str, 0, k->len))
        return true;
    doc_error(doc, d, k, "tensor name '%s\\u0000...' contains a NUL character (byte %zu of the name)", k->str,
              strlen(k->str));
    return false;
}

static bool st_header_parse(StFile *sf, Doc *doc, Arena *a, Diag *d)
{
    if (!doc->root || doc->root->kind != DOC_MAP) {
        diag_file_error(d, sf->path, "the header is not a JSON object");
        return false;
    }
    const DocNode *r = doc->root;
    sf->e = ARENA_ARRAY(a, StEntry, r->n);
    for (int i = 0; i < r->n; i++) {
        if (!st_name_check(doc, r->keys[i], d))
            return false;
        if (strcmp(r->keys[i]->str, "__metadata__") == 0)
            continue;
        StEntry *e = &sf->e[sf->ne];
        if (!st_entry_parse(sf, r->keys[i], r->items[i], e, d))
            return false; /* one error per file: a truncated one would list every later tensor */
        e->name = arena_strdup(a, e->name);
        sf->ne++;
    }
    return st_layout_check(sf, d);
}

/* header := u64le N, N bytes of JSON; data follows. */
static bool st_file_open(StFile *sf, const char *path, Arena *a, Diag *d)
{
    memset(sf, 0, sizeof *sf);
    sf->path = path;
    if (!wfile_open(&sf->f, path, d))
        return false;
    if (sf->f.size < 8) {
        diag_file_error(d, path, "file is truncated: %zu bytes, but the header length alone is 8", sf->f.size);
        return false;
    }
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)sf->f.map[i] << (8 * i);
    if (n > sf->f.size - 8) {
        diag_file_error(d, path, "header length %" PRIu64 " runs past the end of the file (%zu bytes)", n,
                        sf->f.size);
        return false;
    }
    sf->data = sf->f.map + 8 + n;
    sf->data_len = sf->f.size - 8 - n;
    Doc doc;
    bool ok = doc_parse(&doc, path, xstrndup((const char *)sf->f.map + 8, (size_t)n), (size_t)n, d) &&
              st_header_parse(sf, &doc, a, d);
    doc_free(&doc);
    return ok;
}

static const StEntry *st_file_find(const StFile *sf, const char *name)
{
    for (int i = 0; i < sf->ne; i++)
        if (strcmp(sf->e[i].name, name) == 0)
            return &sf->e[i];
    return NULL;
}

/* ---- the checkpoint ---- */

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static StFile *st_model_file(StModel *sm, const char *path, Diag *d)
{
    for (int i = 0; i < sm->nfiles; i++)
        if (strcmp(sm->files[i].path, path) == 0)
            return sm->files[i].f.map || sm->files[i].ne ? &sm->files[i] : NULL;
    StFile *sf = &sm->files[sm->nfiles++];
    if (!st_file_open(sf, arena_strdup(&sm->a, path), &sm->a, d)) {
        sf->ne = 0;
        wfile_close(&sf->f);
        sf->path = arena_strdup(&sm->a, path); /* remembered as failed */
        return NULL;
    }
    return sf;
}

/* True for a shard name that is absolute or has a ".." component: the
 * index may only name files under its own folder. */
static bool st_shard_leaves(const char *name)
{
    if (name[0] == '/')
        return true;
    for (const char *p = name; p; p = strchr(p, '/')) {
        p += *p == '/';
        if (p[0] == '.' && p[1] == '.' && (p[2] == '/' || !p[2]))
            return true;
    }
    return false;
}

/* index := {"metadata": {...}, "weight_map": {tensor: "shard file", ...}} */
static bool st_index_open(StModel *sm, const char *path, Diag *d)
{
    bool loaded = doc_load(&sm->index, path, d);
    sm->has_index = true; /* st_model_close frees the Doc, parsed or not */
    if (!loaded)
        return false;
    sm->weight_map = doc_get(sm->index.root, "weight_map");
    if (!sm->weight_map || sm->weight_map->kind != DOC_MAP) {
        doc_error(&sm->index, d, sm->index.root, "expected a \"weight_map\" object");
        return false;
    }
    bool ok = true;
    for (int i = 0; i < sm->weight_map->n; i++) {
        const DocNode *f = sm->weight_map->items[i];
        if (!st_name_check(&sm->index, sm->weight_map->keys[i], d))
            ok = false;
        else if (f->kind != DOC_SCALAR || !f->quoted || !*f->str) {
            doc_error(&sm->index, d, f, "expected a shard file name (a string)");
            ok = false;
        } else if (st_shard_leaves(f->str)) {
            doc_error(&sm->index, d, f, "shard path '%s' leaves the model folder", f->str);
            ok = false;
        }
    }
    if (!ok)
        return false;
    sm->files = ARENA_ARRAY(&sm->a, StFile, sm->weight_map->n + 1);
    return true;
}

static bool st_model_open(StModel *sm, const char *path, Diag *d)
{
    memset(sm, 0, sizeof *sm);
    sm->path = path;
    if (is_dir(path)) {
        char *idx = arena_printf(&sm->a, "%s/model.safetensors.index.json", path);
        char *one = arena_printf(&sm->a, "%s/model.safetensors", path);
        struct stat st;
        if (stat(idx, &st) == 0)
            path = idx;
        else if (stat(one, &st) == 0)
            path = one;
        else {
            diag_file_error(d, path, "no model.safetensors or model.safetensors.index.json in this folder (for "
                                     "the config's shapes with random weights: --set 'weights={format: synthetic}')");
            return false;
        }
        sm->path = path;
    }
    if (ends_with(path, ".json"))
        return st_index_open(sm, path, d);
    sm->files = ARENA_ARRAY(&sm->a, StFile, 1);
    return st_model_file(sm, path, d) != NULL;
}

static void st_model_close(StModel *sm)
{
    for (int i = 0; i < sm->nfiles; i++)
        wfile_close(&sm->files[i].f);
    if (sm->has_index)
        doc_free(&sm->index);
    arena_free(&sm->a);
}

/* The shard that holds `name`, per the index; NULL if none (or it failed
 * to open, which was reported). *listed says whether the index names it. */
static StFile *st_model_shard(StModel *sm, const char *name, bool *listed, Diag *d)
{
    *listed = false;
    if (!sm->has_index)
        return &sm->files[0];
    const DocNode *f = doc_get(sm->weight_map, name);
    if (!f)
        return NULL;
    *listed = true;
    const char *dir = sm->path, *slash = strrchr(dir, '/');
    char *p = slash ? arena_printf(&sm->a, "%.*s/%s", (int)(slash - dir), dir, f->str)
                    : arena_strdup(&sm->a, f->str);
    return st_model_file(sm, p, d);
}

static bool st_has(void *ctx, const char *name)
{
    StModel *sm = ctx;
    if (sm->has_index)
        return doc_get(sm->weight_map, name) != NULL;
    return st_file_find(&sm->files[0], name) != NULL;
}

/* The i-th tensor the checkpoint lists: its index's weight_map, or its
 * one file's header. */
static const char *st_tensor_name(void *ctx, int64_t i, size_t *len)
{
    StModel *sm = ctx;
    const char *name = NULL;
    if (sm->has_index)
        name = i < sm->weight_map->n ? sm->weight_map->keys[i]->str : NULL;
    else
        name = i < sm->files[0].ne ? sm->files[0].e[i].name : NULL;
    if (name)
        *len = strlen(name); /* st_name_check refused names holding a NUL */
    return name;
}

/* A layer's rotary_emb.inv_freq, which old HF Llama checkpoints saved
 * (RoPE recomputes it); the parts of an AWQ or GPTQ matrix (hq_fetch). */
static const char *const st_known[] = {"self_attn.rotary_emb.inv_freq", "self_attn.qkv_proj.weight",
                                       "mlp.gate_up_proj.weight", NULL};
/* Phi-3's: q, k and v in one matrix, gate and up in another */
static const WFused st_fused[] = {{"self_attn.qkv_proj.weight", {WK_WQ, WK_WK, WK_WV, WK_COUNT}},
                                  {"mlp.gate_up_proj.weight", {WK_W_GATE, WK_W_UP, WK_COUNT}},
                                  {NULL, {WK_COUNT}}};
static const char *const st_weight_parts[] = {".qweight", ".qzeros", ".scales", ".g_idx", NULL};

/* The file a fetched tensor came from (its shard, already open). */
static const char *st_file_of(void *ctx, const char *name)
{
    StModel *sm = ctx;
    bool listed;
    StFile *sf = st_model_shard(sm, name, &listed, NULL);
    return sf ? sf->path : sm->path;
}

/* ---- AWQ and GPTQ ---- */

/* An unquoted integer of config.json in [lo, hi], or error at n. */
static bool hq_int(Doc *doc, const DocNode *n, const char *key, int lo, int hi, int *out, Diag *d)
{
    char *end;
    long v = n && n->kind == DOC_SCALAR && !n->quoted ? strtol(n->str, &end, 10) : 0;
    if (!n || n->kind != DOC_SCALAR || n->quoted || end == n->str || *end) {
        doc_error(doc, d, n, "quantization_config.%s: expected an integer, found %s", key,
                  !n ? "nothing" : n->kind != DOC_SCALAR ? doc_kind_name(n->kind) : "a string");
        return false;
    }
    if (v < lo || v > hi) {
        doc_error(doc, d, n, "quantization_config.%s: expected an integer from %d to %d", key, lo, hi);
        return false;
    }
    *out = (int)v;
    return true;
}

/* A string of config.json, or NULL (error at n unless absent). */
static const char *hq_str(Doc *doc, const DocNode *n, const char *key, bool *ok, Diag *d)
{
    if (!n || doc_is_null(n))
        return NULL;
    if (n->kind != DOC_SCALAR || !n->quoted) {
        doc_error(doc, d, n, "quantization_config.%s: expected a string", key);
        *ok = false;
        return NULL;
    }
    return n->str;
}

/* The quantization_config of the config.json in the weights' folder, if
 * any: {quant_method: awq|gptq, bits: 4, group_size: 32|64|128, version:
 * gemm (AWQ), checkpoint_format: gptq|gptq_v2 (GPTQ)}; sm->hq stays
 * HQ_NONE without one. False after an error at the offending key. Read
 * once, as the load starts: a method, bit width, group size or packing
 * megac refuses is an error whatever the tensors are (a checkpoint of
 * floats beside such a config is not what the config says it is). */
static bool hq_read(StModel *sm, Diag *d)
{
    const char *slash = strrchr(sm->path, '/');
    char *cfg = slash ? arena_printf(&sm->a, "%.*s/config.json", (int)(slash - sm->path), sm->path)
                      : arena_strdup(&sm->a, "config.json");
    struct stat st;
    if (stat(cfg, &st) != 0)
        return true;
    Doc doc;
    if (!doc_load(&doc, cfg, d)) {
        doc_free(&doc);
        return false;
    }
    const DocNode *q = doc.root && doc.root->kind == DOC_MAP ? doc_get(doc.root, "quantization_config") : NULL;
    bool ok = true;
    if (q && !doc_is_null(q) && q->kind != DOC_MAP) {
        doc_error(&doc, d, q, "quantization_config: expected an object, found %s", doc_kind_name(q->kind));
        ok = false;
    } else if (q && !doc_is_null(q)) {
        const char *m = hq_str(&doc, doc_get(q, "quant_method"), "quant_method", &ok, d);
        const DocNode *mn = doc_get(q, "quant_method") ? doc_get(q, "quant_method") : q;
        if (ok && (!m || (strcmp(m, "awq") && strcmp(m, "gptq")))) {
            doc_error(&doc, d, mn, "quantization_config: quant_method %s%s%s is not supported (megac reads AWQ "
                      "and GPTQ 4-bit checkpoints)", m ? "'" : "", m ? m : "absent", m ? "'" : "");
            ok = false;
        }
        int bits = 4, group = 0;
        const DocNode *bn = ok ? (doc_get(q, "bits") ? doc_get(q, "bits") : doc_get(q, "w_bit")) : NULL;
        if (bn && (ok = hq_int(&doc, bn, "bits", 1, 64, &bits, d)) && bits != 4) {
            doc_error(&doc, d, bn, "quantization_config.bits: %d-bit weights are not supported (only 4)", bits);
            ok = false;
        }
        const DocNode *gn = ok ? (doc_get(q, "group_size") ? doc_get(q, "group_size") : doc_get(q, "q_group_size"))
                               : NULL;
        if (ok && !gn) {
            doc_error(&doc, d, q, "quantization_config: group_size is missing");
            ok = false;
        }
        if (ok && (ok = hq_int(&doc, gn, "group_size", -1, 1 << 20, &group, d)) && group != 32 && group != 64 &&
            group != 128) {
            doc_error(&doc, d, gn, "quantization_config.group_size: %d is not supported (32, 64 or 128)", group);
            ok = false;
        }
        if (ok && !strcmp(m, "awq")) {
            const DocNode *vn = doc_get(q, "version");
            const char *v = hq_str(&doc, vn, "version", &ok, d);
            if (ok && v && strcasecmp(v, "gemm")) {
                doc_error(&doc, d, vn, "quantization_config.version: AWQ's '%s' packing is not supported (only "
                          "gemm)", v);
                ok = false;
            }
            const DocNode *zn = doc_get(q, "zero_point");
            if (ok && zn && zn->kind == DOC_SCALAR && !strcmp(zn->str, "false")) {
                doc_error(&doc, d, zn, "quantization_config.zero_point: AWQ without zeros is not supported");
                ok = false;
            }
            sm->hq = (HfQuant){HQ_AWQ, group, 0};
        } else if (ok) {
            const DocNode *fn = doc_get(q, "checkpoint_format");
            const char *f = hq_str(&doc, fn, "checkpoint_format", &ok, d);
            if (ok && f && strcmp(f, "gptq") && strcmp(f, "gptq_v2")) {
                doc_error(&doc, d, fn, "quantization_config.checkpoint_format: '%s' is not supported (gptq or "
                          "gptq_v2)", f);
                ok = false;
            }
            sm->hq = (HfQuant){HQ_GPTQ, group, f && !strcmp(f, "gptq_v2") ? 0 : 1};
        }
    }
    doc_free(&doc);
    return ok;
}

/* Entry `name` and the file it is in; NULL (reported) where it is
 * missing or not of dtype `dt`. */
static const StEntry *hq_entry(StModel *sm, const char *name, const char *dt, StFile **out, Diag *d)
{
    bool listed;
    StFile *sf = st_model_shard(sm, name, &listed, d);
    const StEntry *e = sf ? st_file_find(sf, name) : NULL;
    if (!e) {
        if (sf || !listed)
            diag_file_error(d, sf ? sf->path : sm->path, "tensor '%s' is missing (a quantized matrix needs it)", name);
        return NULL;
    }
    if (strcmp(st_dtypes[e->dtype].name, dt)) {
        diag_file_error(d, sf->path, "tensor '%s': dtype %s, expected %s", name, st_dtypes[e->dtype].name, dt);
        return NULL;
    }
    *out = sf;
    return e;
}

/* Entry e's shape is [a, b] (ndim 2) or [a] (ndim 1); reported otherwise. */
static bool hq_shape(const StFile *sf, const StEntry *e, int ndim, int64_t a, int64_t b, Diag *d)
{
    const int64_t want[2] = {a, b};
    if (e->ndim == ndim && e->shape[0] == a && (ndim == 1 || e->shape[1] == b))
        return true;
    char got[96], exp[96];
    diag_file_error(d, sf->path, "tensor '%s': shape %s, expected %s", e->name,
                    shape_str(got, sizeof got, e->ndim, e->shape), shape_str(exp, sizeof exp, ndim, want));
    return false;
}

static uint32_t hq_u32(const unsigned char *p, int64_t i)
{
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

/* AWQ's order of the eight columns in a word: column i is nibble AWQ_NIBBLE[i]. */
static const int AWQ_NIBBLE[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* Matrix slot s from BASE.qweight, .qzeros, .scales (and .g_idx), as
 * W4G<G> rows (above); st_fetch's contract. */
static int hq_fetch(StModel *sm, const char *base, const WSlot *s, float *dst, Diag *d)
{
    Arena *a = &sm->a;
    const char *qn = arena_printf(a, "%s.qweight", base);
    StFile *fq = NULL, *fz = NULL, *fs = NULL, *fg = NULL;
    if (sm->hq.method == HQ_NONE) {
        bool listed;
        StFile *sf = st_model_shard(sm, qn, &listed, NULL);
        diag_file_error(d, sf ? sf->path : sm->path, "tensor '%s': the matrix is stored quantized, but there is no "
                        "quantization_config in a config.json beside the weights to say how", qn);
        return -1;
    }
    int64_t n = s->rows, k = s->cols, g = sm->hq.group, ng = k / g;
    const bool awq = sm->hq.method == HQ_AWQ;
    const StEntry *eq = hq_entry(sm, qn, "I32", &fq, d);
    const StEntry *ez = eq ? hq_entry(sm, arena_printf(a, "%s.qzeros", base), "I32", &fz, d) : NULL;
    const StEntry *es = ez ? hq_entry(sm, arena_printf(a, "%s.scales", base), "F16", &fs, d) : NULL;
    if (!es)
        return -1;
    if (k % g || n % 8 || (!awq && k % 8)) {
        diag_file_error(d, fq->path, "tensor '%s': a [%" PRId64 ", %" PRId64 "] matrix in 4-bit groups of %" PRId64
                        " needs its columns a multiple of the group%s and its rows of 8", qn, n, k, g,
                        awq ? "" : " and of 8");
        return -1;
    }
    if (!hq_shape(fq, eq, 2, awq ? k : k / 8, awq ? n / 8 : n, d) || !hq_shape(fz, ez, 2, ng, n / 8, d) ||
        !hq_shape(fs, es, 2, ng, n, d))
        return -1;
    const StEntry *eg = NULL;
    const char *gn = arena_printf(a, "%s.g_idx", base);
    if (!awq && st_has(sm, gn) && (!(eg = hq_entry(sm, gn, "I32", &fg, d)) || !hq_shape(fg, eg, 1, k, 0, d)))
        return -1;
    DType t = g == 32 ? DT_W4G32 : g == 64 ? DT_W4G64 : DT_W4G128;
    if (sm->w->dtypes_only)
        return weights_fetch_stored(sm->w, s, dst, t, NULL, fq->path, qn, d);
    const unsigned char *pq = fq->data + eq->begin, *pz = fz->data + ez->begin, *ps = fs->data + es->begin;
    for (int64_t i = 0; eg && i < k; i++)
        if ((int64_t)(int32_t)hq_u32(fg->data + eg->begin, i) != i / g) {
            diag_file_error(d, fg->path, "tensor '%s': g_idx[%" PRId64 "] is %d, not %" PRId64 " (row / group_size): "
                            "act-order checkpoints that regroup rows are not supported", eg->name, i,
                            (int32_t)hq_u32(fg->data + eg->begin, i), i / g);
            return -1;
        }
    size_t rb = dtype_row_bytes(t, k), gb = rb / (size_t)ng;
    unsigned char *buf = xmalloc(rb * (size_t)n);
    memset(buf, 0, rb * (size_t)n);
    for (int64_t r = 0; r < n; r++) /* each group's s and z */
        for (int64_t gi = 0; gi < ng; gi++) {
            unsigned char *rec = buf + (size_t)r * rb + (size_t)gi * gb;
            int zs = awq ? 4 * AWQ_NIBBLE[r % 8] : 4 * (int)(r % 8);
            int z = (int)(hq_u32(pz, gi * (n / 8) + r / 8) >> zs & 15) + sm->hq.zero_add;
            if (z > 15) {
                diag_file_error(d, fz->path, "tensor '%s.qzeros': group %" PRId64 " of row %" PRId64 " stores 15, "
                                "a zero of 16 in GPTQ's format, which megac's 4-bit groups cannot hold", base, gi, r);
                free(buf);
                return -1;
            }
            memcpy(rec, ps + 2 * (gi * n + r), 2);
            rec[2] = (unsigned char)z;
        }
    /* the nibbles, a word read once: AWQ's word [kk][j] holds column kk of
     * rows 8j..8j+7, GPTQ's [k8][r] columns 8 k8..8 k8+7 of row r; rows are
     * taken a block at a time (8 for AWQ, 16 for GPTQ: a cache line of
     * words), so that both the words and the rows written stay in cache
     * (one Llama-3.1-8B-shaped layer of AWQ g128 groups, 218M weights:
     * 0.93 s of megac compile's weights_load, where row by row, each
     * weight reading its own word, took 1.25 s) */
    int gl = g == 32 ? 5 : g == 64 ? 6 : 7;
    for (int64_t r0 = 0; r0 < n; r0 += awq ? 8 : 16)
        for (int64_t kk = 0; kk < k; kk += awq ? 1 : 8)
            for (int64_t r = r0; r < r0 + (awq ? 8 : 16) && r < n; r++) {
                unsigned char *row = buf + (size_t)r * rb;
                uint32_t wd = awq ? hq_u32(pq, kk * (n / 8) + r / 8) : hq_u32(pq, (kk / 8) * n + r);
                for (int b = 0; b < (awq ? 1 : 8); b++) {
                    int64_t c = kk + b, j = c & (g - 1); /* g: 32, 64 or 128 */
                    int q = (int)(wd >> (awq ? 4 * AWQ_NIBBLE[r % 8] : 4 * b) & 15);
                    unsigned char *p = row + (size_t)(c >> gl) * gb + 4 + 16 * (j / 32) + j % 16;
                    *p |= (unsigned char)(j % 32 < 16 ? q : q << 4);
                }
            }
    int r = weights_fetch_stored(sm->w, s, dst, t, buf, fq->path, qn, d);
    if (!r) {
        for (int64_t i = 0; i < n; i++)
            quant_row_dequant(t, buf + (size_t)i * rb, k, dst + i * k);
        weights_keep_stored(sm->w, s, dst, t, buf);
        r = 1;
    }
    free(buf);
    return r;
}

static int st_fetch(void *ctx, const char *name, const WSlot *s, float *dst, Diag *d)
{
    StModel *sm = ctx;
    size_t nl = strlen(name);
    if (s->cols && nl > 7 && !strcmp(name + nl - 7, ".weight") && !st_has(sm, name)) {
        char *base = arena_printf(&sm->a, "%.*s", (int)(nl - 7), name);
        if (st_has(sm, arena_printf(&sm->a, "%s.qweight", base)))
            return hq_fetch(sm, base, s, dst, d);
    }
    bool listed;
    StFile *sf = st_model_shard(sm, name, &listed, d);
    if (!sf)
        return listed ? -1 : 0;
    const StEntry *e = st_file_find(sf, name);
    if (!e) {
        if (!sm->has_index)
            return 0;
        diag_file_error(d, sf->path, "tensor '%s' is missing (the index says it is in this file)", name);
        return -1;
    }
    if (st_dtypes[e->dtype].src < 0) {
        diag_file_error(d, sf->path, "tensor '%s': dtype %s is not supported (only F32, F16 and BF16)", name,
                        st_dtypes[e->dtype].name);
        return -1;
    }
    WSlot whole = wslot_file_shape(s);
    if (!wslot_shape_check(sm->w->m, &whole, d, sf->path, name, e->ndim, e->shape))
        return -1;
    SrcType st = (SrcType)st_dtypes[e->dtype].src;
    DType dt = st == SRC_F16 ? DT_F16 : st == SRC_BF16 ? DT_BF16 : DT_F32;
    const unsigned char *data = sf->data + e->begin + (size_t)(s->row0 * s->cols) * (size_t)st_dtypes[e->dtype].size;
    int r = weights_fetch_stored(sm->w, s, dst, dt, data, sf->path, name, d);
    if (r)
        return r;
    convert_to_f32(dst, data, wslot_nelem(s), st);
    weights_keep_stored(sm->w, s, dst, dt, data);
    return 1;
}

bool load_safetensors(Weights *w, const char *path, Diag *d)
{
    if (!path) {
        diag_file_error(d, w->m->path ? w->m->path : "megac", "safetensors weights need a path");
        return false;
    }
    w->pairing = ROPE_HALF;
    if (!weights_pairing_check(w, d, path, ROPE_HALF))
        return false;
    StModel sm;
    bool ok = st_model_open(&sm, path, d);
    sm.w = w;
    ok = ok && hq_read(&sm, d);
    if (ok) {
        WSource src = {.ctx = &sm, .path = sm.path, .name = wslot_hf_name, .fetch = st_fetch, .has = st_has,
                       .file = st_file_of, .tensor = st_tensor_name, .layer_prefix = "model.layers.",
                       .known = st_known, .weight_parts = st_weight_parts, .fused = st_fused};
        ok = weights_fill(w, &src, d);
    }
    st_model_close(&sm);
    return ok;
}
