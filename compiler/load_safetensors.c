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
 */
#include "compiler/doc.h"
#include "compiler/weights_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
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
typedef struct {
    Arena a;
    const char *path;       /* what the description named */
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
            diag_file_error(d, path, "no model.safetensors or model.safetensors.index.json in this folder");
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

/* The file a fetched tensor came from (its shard, already open). */
static const char *st_file_of(void *ctx, const char *name)
{
    StModel *sm = ctx;
    bool listed;
    StFile *sf = st_model_shard(sm, name, &listed, NULL);
    return sf ? sf->path : sm->path;
}

static int st_fetch(void *ctx, const char *name, const WSlot *s, float *dst, Diag *d)
{
    StModel *sm = ctx;
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
    if (!wslot_shape_check(sm->w->m, s, d, sf->path, name, e->ndim, e->shape))
        return -1;
    SrcType st = (SrcType)st_dtypes[e->dtype].src;
    DType dt = st == SRC_F16 ? DT_F16 : st == SRC_BF16 ? DT_BF16 : DT_F32;
    int r = weights_fetch_stored(sm->w, s, dst, dt, sf->data + e->begin, sf->path, name, d);
    if (r)
        return r;
    convert_to_f32(dst, sf->data + e->begin, wslot_nelem(s), st);
    weights_keep_stored(sm->w, s, dst, dt, sf->data + e->begin);
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
    if (ok) {
        WSource src = {.ctx = &sm, .path = sm.path, .name = wslot_hf_name, .fetch = st_fetch, .has = st_has,
                       .file = st_file_of};
        ok = weights_fill(w, &src, d);
    }
    st_model_close(&sm);
    return ok;
}
