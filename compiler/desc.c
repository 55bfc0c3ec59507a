/*
 * desc.c - model descriptions: models/NAME.yaml (schema: models/README.md)
 * read into a ModelDesc.
 *
 * The YAML is parsed into a DocNode tree (doc.h). `--set key=value`
 * overrides are spliced into that tree before anything is interpreted, so
 * an override is checked exactly like a line of the file, and its errors
 * point at `<command line>:1:COL`. Interpretation then walks the tree in
 * dependency order: weights (their format picks the RoPE pairing default),
 * arch (dims, possibly from an HF config.json or a llama2.c header, keys
 * beside those overriding them), top-level scalars, rope, tokenizer, and the
 * compile knobs (layer ranges need n_layers). Every error is collected,
 * none stops the walk; when the walk found none, desc_check's consistency
 * rules run and report at the key that set the offending value.
 */
#include "compiler/doc.h"
#include "compiler/gguf.h"
#include "compiler/model.h"
#include "runtime/tokenizer.h"

#include <errno.h>
#include <ctype.h>
#include <dirent.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

const char desc_default_name[] = "default";
const char desc_default_yaml[] =
    "# The default model: a tiny synthetic Llama that needs no files.\n"
    "# `megac ... default` (or desc_load with path NULL) uses this text,\n"
    "# which is embedded in megac; tests check the two copies agree.\n"
    "name: default\n"
    "arch:\n"
    "  dim: 64\n"
    "  hidden_dim: 176\n"
    "  n_layers: 2\n"
    "  n_heads: 4\n"
    "  n_kv_heads: 2\n"
    "  vocab_size: 259\n"
    "  max_seq: 256\n"
    "weights: {format: synthetic, seed: 1}\n"
    "tokenizer: {format: bytes}\n";

#define DESC_EMBEDDED_PATH "<embedded>"
/* What desc_load takes, for messages about a path it cannot take. */
#define DESC_MAX_DIM (1 << 20)
#define DESC_MAX_VOCAB (1 << 24)
#define DESC_MAX_SEQ (1 << 24)

/* Fields desc_check reasons about; Ctx.at[] remembers the node that set each. */
typedef enum {
    F_DIM, F_HIDDEN, F_LAYERS, F_HEADS, F_KV_HEADS, F_HEAD_DIM, F_VOCAB, F_MAX_SEQ,
    F_EPS, F_THETA, F_SCALING, F_TOKENIZER, F_WEIGHTS, F_BOS, F_EOS, F_STOP, F_WORKERS, F_COUNT
} Field;

_Static_assert(F_DIM == (int)DSRC_DIM && F_MAX_SEQ == (int)DSRC_MAX_SEQ && F_THETA == (int)DSRC_THETA &&
               F_EPS == (int)DSRC_EPS, "ModelDesc.src_at is indexed by Field");

/* Fields as the checks name them. */
static const char *const field_names[F_COUNT] = {
    "dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "max_seq",
    "norm_eps", "rope theta", "rope scaling", "tokenizer", "weights", "bos", "eos", "eos", "workers",
};

/* A node that did not come from the description itself (an override's
 * value, a node created for it, the HF config) and the Doc it quotes. */
typedef struct {
    Doc *doc;
    const DocNode *root;
} Origin;

typedef struct {
    ModelDesc *m;
    Arena *a;
    Diag *d;
    Doc *doc;                   /* the description */
    Origin *orig;               /* searched newest first */
    size_t norig, corig;
    const DocNode *at[F_COUNT]; /* where each checked field was last set */
    int max_pos;                /* the model's own max context, 0 if unknown */
    bool from_config;           /* arch came from an HF config (HF pairing) */
    int arch_pairing;           /* arch came from a GGUF file: its RopePairing; else -1 */
    const DocNode *kv_at[MODEL_MAX_LAYERS]; /* the kv_policy entry of each layer */
    const DocNode *attn_at[MODEL_MAX_LAYERS];   /* the attention entry of each layer */
    const DocNode *swa_at;      /* where the sliding window was set */
    const char *self;           /* the GGUF file or HF folder megac wrote the description for; NULL for a
                                 * description read from a file */
    const char *at_key[F_COUNT];    /* the GGUF key that set a field, where one did */
} Ctx;

static const char *const top_keys[] = {"name", "arch", "norm_eps", "tie_embeddings", "qkv_bias", "rope",
                                       "weights", "tokenizer", "bos", "eos", "compile", NULL};
static const char *const arch_keys[] = {"dim",        "hidden_dim",     "n_layers",    "n_heads",
                                        "n_kv_heads", "head_dim",       "vocab_size",  "max_seq",
                                        "sliding_window", "from-config", "from-checkpoint", "from-gguf", NULL};
static const char *const rope_keys[] = {"theta", "pairing", "scaling", NULL};
static const char *const scaling_keys[] = {"type",          "factor",        "low_freq_factor", "high_freq_factor",
                                           "original_max_pos", "factors",     "short_factors",   "long_factors",
                                           "attention_factor", NULL};
static const char *const weights_keys[] = {"format", "path", "seed", NULL};
static const char *const tok_keys[] = {"format", "path", NULL};
static const char *const compile_keys[] = {"act_dtype", "kv_dtype", "quant", "attention", "kv_policy",
                                           "targets", "workers", "max_seq", "attn_combine", NULL};
static const char *const quant_keys[] = {"default", "embed", "attn", "mlp", "lm_head", NULL};
static const char *const attn_keys[] = {"layers", "kind", "sinks", "window", "page", "budget", "anchor",
                                        "fraction", "heads", NULL};
static const char *const kv_keys[] = {"layers", "policy", "budget", "sinks", "window", "pyramid", "adaptive", NULL};

/* Enum spellings, in enum order. */
static const char *const weights_formats[] = {"llama2c", "safetensors", "gguf", "synthetic", NULL};
static const char *const tok_formats[] = {"none", "llama2c", "hf", "gguf", "bytes", NULL};
static const char *const pairings[] = {"adjacent", "half", NULL};
static const char *const scaling_types[] = {"llama3", "factors", "longrope", NULL};  /* RopeScaling - 1 */
static const char *const act_dtypes[] = {"f32", "f16", "bf16", NULL};
/* compile.kv_dtype: what the KV cache holds (kv_dtype_of: the DType) */
static const char *const kv_dtypes[] = {"f32", "f16", "bf16", NULL};
static const DType kv_dtype_of[] = {DT_F32, DT_F16, DT_BF16};
/* compile.attn_combine, by AttnCombine */
static const char *const attn_combines[] = {"auto", "in_o", "stage", NULL};
static const char *const quant_names[] = {"none", "f32", "f16", "bf16", "w8a16", "w4a16", "w8a8", "w4a8", "a8", NULL};
static const char *const attn_kinds[] = {"dense", "sink_window", "quest", "kascade", "kascade_reuse", NULL};
static const char *const kv_kinds[] = {"full", "streaming", "h2o", "tova", "snapkv", NULL};
static const char *const target_names[] = {"cpu", "sm_80", "sm_90", "sm_120", "host-cuda", NULL};

/* Per-kind parameters of attention entries and KV policies: the names are
 * the keys after "layers" and the kind; masks say which a kind requires and
 * which it allows. */
typedef struct {
    unsigned need, allow;       /* bit i: params[i] */
} ParamMask;
static const char *const attn_params[] = {"sinks", "window", "page", "budget", "anchor"};
static const ParamMask attn_kind_params[] = {
    [ATTN_DENSE] = {0, 0},
    [ATTN_SINK_WINDOW] = {0x3, 0x3},    /* sinks, window */
    [ATTN_QUEST] = {0xc, 0xc},          /* page, budget */
    [ATTN_KASCADE] = {0x8, 0x8},        /* budget (top-k rows) */
    [ATTN_KASCADE_REUSE] = {0x10, 0x10}, /* anchor (a kascade layer before) */
};
static const char *const kv_params[] = {"budget", "sinks", "window", "pyramid"};
static const ParamMask kv_kind_params[] = {
    [KV_FULL] = {0, 0},
    [KV_STREAMING] = {0x6, 0x6},        /* sinks, window */
    [KV_H2O] = {0x1, 0x5},              /* budget (+ recent window) */
    [KV_TOVA] = {0x1, 0x1},             /* budget */
    [KV_SNAPKV] = {0x1, 0xd},           /* budget (+ observation window, pyramid) */
};

/* ---- locating and reporting ---- */

/* errno of a failed read_file in words: ENODEV is its "not a regular
 * file" (a device such as /dev/zero, which would be read without end). */
static const char *read_error(int e)
{
    return e == ENODEV ? "not a regular file (a device)" : strerror(e);
}

static bool node_within(const DocNode *t, const DocNode *n)
{
    if (t == n)
        return true;
    if (t->kind == DOC_SCALAR)
        return false;
    for (int i = 0; i < t->n; i++)
        if ((t->kind == DOC_MAP && node_within(t->keys[i], n)) || node_within(t->items[i], n))
            return true;
    return false;
}

/* The document a node's position refers to. */
static Doc *ctx_doc_of(Ctx *c, const DocNode *n)
{
    for (size_t i = c->norig; n && i-- > 0;)
        if (node_within(c->orig[i].root, n))
            return c->orig[i].doc;
    return c->doc;
}

static void ctx_origin_add(Ctx *c, Doc *doc, const DocNode *root)
{
    Origin o = {doc, root};
    VEC_PUSH(c->orig, c->norig, c->corig, o);
}

/* A node of the text megac wrote for a GGUF file or HF folder has no
 * position anyone can look up: its reports name the file or folder. */
static void ctx_vreport(Ctx *c, const char *kind, const DocNode *n, const char *fmt, va_list ap)
{
    Doc *doc = ctx_doc_of(c, n);
    if (c->self && doc == c->doc) {
        SrcFile src = {.path = c->self};
        diag_vreport(c->d, kind, &src, 0, 0, fmt, ap);
        return;
    }
    diag_vreport(c->d, kind, &doc->src, n ? n->line : 0, n ? n->col : 0, fmt, ap);
}

static void MEGAC_PRINTF(3, 4) ctx_error(Ctx *c, const DocNode *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctx_vreport(c, "error", n, fmt, ap);
    va_end(ap);
}

static void MEGAC_PRINTF(3, 4) ctx_note(Ctx *c, const DocNode *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctx_vreport(c, "note", n, fmt, ap);
    va_end(ap);
}

/* "a, b or c" */
static const char *names_join(Arena *a, const char *const *names)
{
    const char *s = "";
    for (int i = 0; names[i]; i++)
        s = arena_printf(a, "%s%s%s", s, i == 0 ? "" : names[i + 1] ? ", " : " or ", names[i]);
    return s;
}

static int name_index(const char *s, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

/* Text from the files quoted in a message (a value, a key, a name): at most
 * QUOTE_MAX bytes of it, cut on a UTF-8 character boundary and followed by
 * "...", so that a value of megabytes (a minified config's, a fuzzer's)
 * does not make a line of megabytes. */
enum { QUOTE_MAX = 60 };

static const char *ctx_quote_n(Ctx *c, const char *s, size_t n)
{
    if (n <= QUOTE_MAX)
        return arena_strndup(c->a, s, n);
    size_t k = QUOTE_MAX;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
        k--;
    return arena_printf(c->a, "%.*s...", (int)k, s);
}

static const char *ctx_quote(Ctx *c, const char *s)
{
    return ctx_quote_n(c, s, strlen(s));
}

/* "prefix.key", or just "key" at the top level. */
static const char *key_path(Ctx *c, const char *prefix, const char *key)
{
    return prefix && *prefix ? arena_printf(c->a, "%s.%s", prefix, key) : key;
}

/* ---- typed scalars ---- */

static const char *node_found(const DocNode *n)
{
    return n->kind == DOC_SEQ ? "a list" : n->kind == DOC_MAP ? "a mapping" : n->quoted ? "a quoted string" : NULL;
}

/* True for an integer's plain spelling: [-]digits, no sign '+', no leading
 * zero (064 would be octal in YAML 1.1), no fraction or exponent. */
static bool int_spelling(const char *s)
{
    s += *s == '-';
    if (!isdigit((unsigned char)*s) || (s[0] == '0' && s[1]))
        return false;
    while (isdigit((unsigned char)*s))
        s++;
    return !*s;
}

/* INT: an unquoted decimal integer, spelled plainly (not 64.0, 6.4e1, +64 or
 * 064). */
static bool node_int(Ctx *c, const DocNode *n, const char *what, int64_t lo, int64_t hi, int64_t *out)
{
    if (node_found(n)) {
        ctx_error(c, n, "expected an integer for '%s', found %s", what, node_found(n));
        return false;
    }
    if (!int_spelling(n->str)) {
        ctx_error(c, n, "expected an integer for '%s', found '%s'", what, ctx_quote(c, n->str));
        return false;
    }
    char *end;
    errno = 0;
    long long v = strtoll(n->str, &end, 10);
    if (errno == ERANGE) {
        ctx_error(c, n, "'%s' is too large, found %s; at most %lld", what, ctx_quote(c, n->str), (long long)hi);
        return false;
    }
    if (v > hi && hi >= INT_MAX) {
        ctx_error(c, n, "'%s' is too large, found %lld; at most %lld", what, v, (long long)hi);
        return false;
    }
    if (v < lo || v > hi) {
        if (hi >= INT_MAX)
            ctx_error(c, n, "'%s' must be at least %lld, found %lld", what, (long long)lo, v);
        else
            ctx_error(c, n, "'%s' must be between %lld and %lld, found %lld", what, (long long)lo,
                      (long long)hi, v);
        return false;
    }
    *out = v;
    return true;
}

static bool node_int32(Ctx *c, const DocNode *n, const char *what, int lo, int *out)
{
    int64_t v;
    if (!node_int(c, n, what, lo, INT_MAX, &v))
        return false;
    *out = (int)v;
    return true;
}

/* NUMBER: an unquoted decimal or exponent float. */
static bool node_double(Ctx *c, const DocNode *n, const char *what, double *out)
{
    if (node_found(n)) {
        ctx_error(c, n, "expected a number for '%s', found %s", what, node_found(n));
        return false;
    }
    char *end;
    errno = 0;
    double v = strtod(n->str, &end);
    if (end == n->str || *end || !isfinite(v)) {
        ctx_error(c, n, "expected a number for '%s', found '%s'%s", what, ctx_quote(c, n->str),
                  end != n->str && !*end ? (isnan(v) ? " (not a number)" : " (past a double's range)") : "");
        return false;
    }
    if (errno == ERANGE && v == 0.0) {
        ctx_error(c, n, "'%s' is %s, too small for a double (it would read as 0)", what, ctx_quote(c, n->str));
        return false;
    }
    *out = v;
    return true;
}

/* BOOL: true | false (also True/False/yes/no, as JSON and YAML 1.1 write). */
static bool node_bool(Ctx *c, const DocNode *n, const char *what, bool *out)
{
    static const char *const yes[] = {"true", "True", "yes", NULL}, *const no[] = {"false", "False", "no", NULL};
    if (!node_found(n) && name_index(n->str, yes) >= 0) {
        *out = true;
        return true;
    }
    if (!node_found(n) && name_index(n->str, no) >= 0) {
        *out = false;
        return true;
    }
    if (node_found(n))
        ctx_error(c, n, "expected true or false for '%s', found %s", what, node_found(n));
    else
        ctx_error(c, n, "expected true or false for '%s', found '%s'", what, ctx_quote(c, n->str));
    return false;
}

static const char *node_str(Ctx *c, const DocNode *n, const char *what)
{
    if (n->kind != DOC_SCALAR) {
        ctx_error(c, n, "expected a string for '%s', found %s", what, doc_kind_name(n->kind));
        return NULL;
    }
    if (strlen(n->str) != n->len) { /* "a\x00b": the C string would stop at the NUL */
        ctx_error(c, n, "'%s' contains a NUL character", what);
        return NULL;
    }
    return n->str;
}

/* ENUM: one of `names`; -1 (and an error suggesting the closest) if not. */
static int node_enum(Ctx *c, const DocNode *n, const char *what, const char *const *names)
{
    const char *s = node_str(c, n, what);
    if (!s)
        return -1;
    int i = name_index(s, names);
    if (i >= 0)
        return i;
    const char *near = str_closest(s, names);
    if (near)
        ctx_error(c, n, "bad value '%s' for '%s'; did you mean '%s'?", ctx_quote(c, s), what, near);
    else
        ctx_error(c, n, "bad value '%s' for '%s' (expected %s)", ctx_quote(c, s), what, names_join(c->a, names));
    return -1;
}

/* Reports keys of map `n` that are not in `valid`; false if `n` is not a
 * map at all. `where` names the map ("" for the top level). */
static bool map_check(Ctx *c, const DocNode *n, const char *where, const char *const *valid)
{
    if (n->kind != DOC_MAP) {
        if (*where)
            ctx_error(c, n, "expected a mapping for '%s', found %s", where, doc_kind_name(n->kind));
        else
            ctx_error(c, n, "expected a mapping of model description keys, found %s", doc_kind_name(n->kind));
        return false;
    }
    for (int i = 0; i < n->n; i++) {
        const char *k = n->keys[i]->str;
        if (name_index(k, valid) >= 0)
            continue;
        const char *near = str_closest(k, valid);
        const char *in = *where ? arena_printf(c->a, " in '%s'", where) : "";
        if (near)
            ctx_error(c, n->keys[i], "unknown key '%s'%s; did you mean '%s'?", ctx_quote(c, k), in, near);
        else
            ctx_error(c, n->keys[i], "unknown key '%s'%s (expected %s)", ctx_quote(c, k), in,
                      names_join(c->a, valid));
    }
    return true;
}

static void missing_key(Ctx *c, const DocNode *map, const char *where, const char *key)
{
    if (*where)
        ctx_error(c, map, "missing key '%s' in '%s'", key, where);
    else
        ctx_error(c, map, "missing key '%s'", key);
}

/* Reads map[key] into *out when present; records it as field f (-1: none). */
static void field_int(Ctx *c, const DocNode *map, const char *where, const char *key, int lo, int *out, int f)
{
    const DocNode *n = doc_get(map, key);
    if (n && node_int32(c, n, key_path(c, where, key), lo, out) && f >= 0)
        c->at[f] = n;
}

static void field_double(Ctx *c, const DocNode *map, const char *where, const char *key, double *out, int f)
{
    const DocNode *n = doc_get(map, key);
    if (n && node_double(c, n, key_path(c, where, key), out) && f >= 0)
        c->at[f] = n;
}

static void field_bool(Ctx *c, const DocNode *map, const char *where, const char *key, bool *out)
{
    const DocNode *n = doc_get(map, key);
    if (n)
        node_bool(c, n, key_path(c, where, key), out);
}

/* What the description megac writes for a GGUF file names it by: the
 * file's own name need not be text YAML can hold (not UTF-8). */
static const char desc_self_path[] = "<this file>";

/* A path written in the description, resolved against its folder. */
static const char *path_resolve(Ctx *c, const char *p)
{
    const char *dir = c->m->dir;
    if (c->self && strcmp(p, desc_self_path) == 0)
        return arena_strdup(c->a, c->self);
    if (p[0] == '/' || strcmp(dir, ".") == 0)
        return arena_strdup(c->a, p);
    if (strcmp(p, ".") == 0) /* the folder itself (an HF checkpoint's weights): DIR, not DIR/. */
        return arena_strdup(c->a, dir);
    size_t n = strlen(dir);
    return arena_printf(c->a, "%s%s%s", dir, dir[n - 1] == '/' ? "" : "/", p);
}

static const char *field_path(Ctx *c, const DocNode *map, const char *where, const char *key)
{
    const DocNode *n = doc_get(map, key);
    const char *s = n ? node_str(c, n, key_path(c, where, key)) : NULL;
    if (s && !*s) {
        ctx_error(c, n, "'%s' is empty", key_path(c, where, key));
        return NULL;
    }
    return s ? path_resolve(c, s) : NULL;
}

/* ---- --set overrides ---- */

static void map_put(Arena *a, DocNode *map, DocNode *key, DocNode *val)
{
    for (int i = 0; i < map->n; i++) {
        if (strcmp(map->keys[i]->str, key->str) == 0) {
            map->items[i] = val;
            return;
        }
    }
    DocNode **keys = ARENA_ARRAY(a, DocNode *, map->n + 1), **items = ARENA_ARRAY(a, DocNode *, map->n + 1);
    if (map->n) {
        memcpy(keys, map->keys, (size_t)map->n * sizeof *keys);
        memcpy(items, map->items, (size_t)map->n * sizeof *items);
    }
    keys[map->n] = key;
    items[map->n] = val;
    map->keys = keys;
    map->items = items;
    map->n++;
}

static DocNode *override_node(Doc *od, DocKind k, const char *s, size_t n, int col)
{
    DocNode *x = ARENA_NEW(&od->arena, DocNode);
    x->kind = k;
    x->line = 1;
    x->col = col;
    if (k == DOC_SCALAR) {
        x->str = arena_strndup(&od->arena, s, n);
        x->len = n;
    }
    return x;
}

/* KEY := NAME ('.' NAME)*, NAME := [A-Za-z0-9_-]+. A first NAME that is not
 * a top-level key but a compile knob (or, failing that, an arch key) is
 * short for compile.NAME (arch.NAME): `workers=4`, `quant.default=f32`,
 * `n_layers=1`. Returns the prefix to add ("" for none), or NULL. */
static const char *override_prefix(Ctx *c, Doc *od, const char *key, size_t klen)
{
    size_t n = strcspn(key, ".");
    char *first = arena_strndup(c->a, key, n);
    for (size_t i = 0; i < klen; i++) {
        char ch = key[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                  ch == '-' || (ch == '.' && i > 0 && i + 1 < klen && key[i + 1] != '.');
        if (!ok) {
            diag_error(c->d, &od->src, 1, (int)i + 1, "bad --set key '%s' (expected NAME.NAME...)",
                       ctx_quote_n(c, key, klen));
            return NULL;
        }
    }
    if (name_index(first, top_keys) >= 0)
        return "";
    if (name_index(first, compile_keys) >= 0)
        return "compile.";
    if (name_index(first, arch_keys) >= 0)
        return "arch.";
    const char *const *lists[] = {top_keys, compile_keys, arch_keys};
    const char *all[64];
    int na = 0;
    for (int l = 0; l < 3; l++)
        for (int i = 0; lists[l][i]; i++)
            all[na++] = lists[l][i];
    all[na] = NULL;
    const char *near = str_closest(first, all);
    if (near)
        diag_error(c->d, &od->src, 1, 1, "unknown key '%s' in --set; did you mean '%s'?", ctx_quote(c, first), near);
    else
        diag_error(c->d, &od->src, 1, 1, "unknown key '%s' in --set", ctx_quote(c, first));
    return NULL;
}

/* Splices value root `v` at dotted `key` (written at column 1 of the
 * override text) into the description's root map, creating maps on the way. */
static bool override_splice(Ctx *c, Doc *od, const char *key, const char *prefix, DocNode *v)
{
    DocNode *cur = c->doc->root;
    const char *full = arena_printf(c->a, "%s%s", prefix, key);
    int shift = -(int)strlen(prefix);
    for (const char *p = full;;) {
        size_t n = strcspn(p, ".");
        int col = (int)(p - full) + shift + 1;
        DocNode *k = override_node(od, DOC_SCALAR, p, n, col < 1 ? 1 : col);
        ctx_origin_add(c, od, k);
        if (!p[n]) {
            map_put(&od->arena, cur, k, v);
            return true;
        }
        DocNode *next = doc_get(cur, k->str);
        if (!next) {
            next = override_node(od, DOC_MAP, NULL, 0, k->col);
            ctx_origin_add(c, od, next);
            map_put(&od->arena, cur, k, next);
        } else if (next->kind != DOC_MAP) {
            diag_error(c->d, &od->src, 1, k->col, "cannot set '%s': '%s' is not a mapping", ctx_quote(c, full),
                       ctx_quote_n(c, full, (size_t)(p + n - full)));
            return false;
        }
        cur = next;
        p += n + 1;
    }
}

/* Applies one `key=value`: the value is parsed as YAML (a scalar, or flow
 * `[..]`/`{..}`) in a Doc whose source line is the override text itself. */
static bool override_apply(Ctx *c, Doc *od, const DescOverride *o)
{
    size_t klen = strlen(o->key);
    char *text = xasprintf("%s=%s", o->key, o->value ? o->value : "");
    size_t len = strlen(text);
    if (klen == 0) {
        SrcFile src = {.path = "<command line>", .text = text, .len = len};
        diag_error(c->d, &src, 1, 1, "--set expects key=value");
        free(text);
        return false;
    }
    if (!doc_parse_value(od, "<command line>", text, len, klen + 1, c->d))
        return false;
    const char *prefix = override_prefix(c, od, o->key, klen);
    if (!prefix)
        return false;
    if (!od->root) {
        diag_error(c->d, &od->src, 1, (int)klen + 2, "missing value for '%s'", ctx_quote(c, o->key));
        return false;
    }
    ctx_origin_add(c, od, od->root);
    return override_splice(c, od, o->key, prefix, od->root);
}

/* ---- weights, tokenizer ---- */

/* weights: {format: llama2c|safetensors|gguf|synthetic, path: PATH, seed: INT}
 * path is required except for synthetic weights, seed only for those. */
static void desc_weights(Ctx *c, const DocNode *w)
{
    ModelDesc *m = c->m;
    c->at[F_WEIGHTS] = w;
    if (!map_check(c, w, "weights", weights_keys))
        return;
    const DocNode *f = doc_get(w, "format");
    if (!f) {
        missing_key(c, w, "weights", "format");
        return;
    }
    int fmt = node_enum(c, f, "weights.format", weights_formats);
    if (fmt < 0)
        return;
    m->weights_format = (WeightFormat)fmt;
    const DocNode *path = doc_get(w, "path"), *seed = doc_get(w, "seed");
    if (fmt == WFMT_SYNTHETIC) {
        if (path && ctx_doc_of(c, f) != ctx_doc_of(c, path)) /* --set weights.format=synthetic */
            ctx_error(c, f, "'weights.path' does not apply to synthetic weights, and the description names one: "
                            "--set 'weights={format: synthetic}' replaces the whole weights mapping");
        else if (path)
            ctx_error(c, path, "'weights.path' does not apply to synthetic weights");
        int64_t s = 0;
        if (seed && node_int(c, seed, "weights.seed", 0, INT64_MAX, &s))
            m->weights_seed = (uint64_t)s;
        return;
    }
    if (seed)
        ctx_error(c, seed, "'weights.seed' applies only to synthetic weights");
    if (!path)
        missing_key(c, w, "weights", "path");
    else
        m->weights_path = field_path(c, w, "weights", "path");
}

/* tokenizer: {format: none|llama2c|hf|gguf|bytes, path: PATH}. llama2c and
 * hf need a path; gguf defaults to the weights' GGUF file. */
static void desc_tokenizer(Ctx *c, const DocNode *t)
{
    ModelDesc *m = c->m;
    c->at[F_TOKENIZER] = t;
    if (!map_check(c, t, "tokenizer", tok_keys))
        return;
    const DocNode *f = doc_get(t, "format"), *path = doc_get(t, "path");
    if (!f) {
        missing_key(c, t, "tokenizer", "format");
        return;
    }
    int fmt = node_enum(c, f, "tokenizer.format", tok_formats);
    if (fmt < 0)
        return;
    m->tok_format = (TokFormat)fmt;
    if (fmt == TOKFMT_NONE || fmt == TOKFMT_BYTES) {
        if (path)
            ctx_error(c, path, "'tokenizer.path' does not apply to format '%s'", tok_formats[fmt]);
    } else if (path) {
        m->tok_path = field_path(c, t, "tokenizer", "path");
    } else if (fmt == TOKFMT_GGUF && m->weights_format == WFMT_GGUF) {
        m->tok_path = m->weights_path;
    } else {
        missing_key(c, t, "tokenizer", "path");
    }
}

/* ---- RoPE factor lists (YAML and config.json) ---- */

/* A list of head_dim / 2 positive RoPE factors at `key` of s into out;
 * false (reported) if it is not one. */
static bool rope_factor_list(Ctx *c, const DocNode *s, const char *where, const char *key, double *out)
{
    const DocNode *f = doc_get(s, key);
    const ModelDesc *m = c->m;   /* a config.json's head_dim may be its dim / heads, not yet worked out */
    int half = (m->head_dim ? m->head_dim : m->n_heads > 0 && m->dim % m->n_heads == 0 ? m->dim / m->n_heads : 0) / 2;
    if (!f) {
        missing_key(c, s, where, key);
        return false;
    }
    if (f->kind != DOC_SEQ || f->n != half || half > MODEL_MAX_ROPE_PAIRS) {
        ctx_error(c, f, "expected a list of %d numbers (head_dim / 2) for '%s', found %s", half,
                  key_path(c, where, key), f->kind == DOC_SEQ ? arena_printf(c->a, "%d", f->n) : doc_kind_name(f->kind));
        return false;
    }
    bool ok = true;
    for (int i = 0; i < half; i++) {
        double v;
        if (!node_double(c, f->items[i], key_path(c, where, key), &v)) {
            ok = false;
            continue;
        }
        if (!isfinite(v) || v <= 0) {
            ctx_error(c, f->items[i], "a RoPE frequency factor must be a positive number, found %g", v);
            ok = false;
        }
        out[i] = v;
    }
    return ok;
}

/* LongRoPE's attention factor where a config gives none (transformers'
 * _compute_longrope_parameters): sqrt(1 + ln(max_pos / orig) / ln(orig)),
 * 1 where the context is not longer than the original. */
static double longrope_attn_default(int max_pos, int orig)
{
    double f = orig > 1 && max_pos > 0 ? (double)max_pos / orig : 1.0;
    return f <= 1.0 ? 1.0 : sqrt(1.0 + log(f) / log((double)orig));
}

/* ---- arch from an HF config.json ---- */

typedef enum { HF_LLAMA, HF_MISTRAL, HF_QWEN2, HF_PHI3 } HfArch;

/* The architecture a config names: architectures[0], else model_type.
 * Llama, Mistral, Qwen2 and Phi-3 are the Llama family megac computes
 * (Phi-3's q/k/v and gate/up come fused: the loaders split them). */
static int config_arch(Ctx *c, const DocNode *root, const DocNode *at)
{
    static const char *const classes[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                          "Phi3ForCausalLM", NULL};
    static const char *const types[] = {"llama", "mistral", "qwen2", "phi3", NULL};
    const DocNode *archs = doc_get(root, "architectures"), *type = doc_get(root, "model_type");
    const DocNode *n = archs && archs->kind == DOC_SEQ && archs->n > 0 ? archs->items[0] : type;
    if (!n || n->kind != DOC_SCALAR) {
        ctx_error(c, n ? n : root, "config names no architecture (expected 'architectures' or 'model_type')");
        return -1;
    }
    int k = name_index(n->str, n == type ? types : classes);
    if (k < 0) {
        ctx_error(c, n, "architecture '%s' is not supported (megac computes Llama, Mistral, Qwen2 and Phi-3 models)",
                  ctx_quote(c, n->str));
        ctx_note(c, at, "config named here");
    }
    return k;
}

/* Config keys whose presence (with a non-default value) needs math megac
 * does not have: refused by name rather than silently ignored. Mistral's
 * and Phi-3's sliding windows are read here (Qwen2's, on some layers, is
 * refused). */
static void config_refuse(Ctx *c, const DocNode *root, int arch)
{
    const DocNode *act = doc_get(root, "hidden_act");
    if (act && (act->kind != DOC_SCALAR || strcmp(act->str, "silu") != 0))
        ctx_error(c, act, "hidden_act '%s' is not supported (megac computes SiLU MLPs)",
                  act->kind == DOC_SCALAR ? ctx_quote(c, act->str) : "?");
    bool b = false;
    const DocNode *n = doc_get(root, "attention_bias");
    if (n && node_bool(c, n, "attention_bias", &b) && b && arch != HF_QWEN2)
        ctx_error(c, n, "attention_bias (q/k/v/o biases) is not supported yet");
    n = doc_get(root, "mlp_bias");
    if (n && node_bool(c, n, "mlp_bias", &b) && b)
        ctx_error(c, n, "mlp_bias is not supported yet");
    const char *sw = arch == HF_QWEN2 ? "use_sliding_window" : "sliding_window";
    n = doc_get(root, sw);
    if (arch == HF_QWEN2 && n && node_bool(c, n, sw, &b) && b)
        ctx_error(c, n, "sliding window attention (use_sliding_window: true) is not supported yet");
    bool swa = arch == HF_MISTRAL || arch == HF_PHI3;
    if (swa && n && !doc_is_null(n) && node_int32(c, n, sw, 1, &c->m->sliding_window))
        c->swa_at = n;
    n = doc_get(root, "sliding_window_size");   /* MLC presets spell it so */
    if (swa && n && !doc_is_null(n) && node_int32(c, n, "sliding_window_size", 1, &c->m->sliding_window))
        c->swa_at = n;
    double prf = 1;     /* Phi-4-mini's 0.75: RoPE on part of each head */
    n = doc_get(root, "partial_rotary_factor");
    if (n && node_double(c, n, "partial_rotary_factor", &prf) && prf != 1)
        ctx_error(c, n, "RoPE on part of each head (partial_rotary_factor: %s) is not supported",
                  ctx_quote(c, n->str));
}

/* rope_scaling (or transformers 5's rope_parameters): {rope_type|type:
 * default|llama3, factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings} | {type: longrope|su, short_factor,
 * long_factor, attention_factor} (the original context there or beside
 * it); rope_parameters also holds rope_theta. */
static void config_rope(Ctx *c, const DocNode *root, const DocNode *s)
{
    ModelDesc *m = c->m;
    if (doc_is_null(s))
        return;
    if (s->kind != DOC_MAP) {
        ctx_error(c, s, "expected a mapping for 'rope_scaling', found %s", doc_kind_name(s->kind));
        return;
    }
    field_double(c, s, "", "rope_theta", &m->rope_theta, F_THETA);
    const DocNode *t = doc_get(s, "rope_type") ? doc_get(s, "rope_type") : doc_get(s, "type");
    for (int i = 0; !t && i < s->n; i++) /* a factor without a type: which scaling is it? */
        if (strcmp(s->keys[i]->str, "rope_theta") != 0) {
            ctx_error(c, s->keys[i], "'rope_scaling' has '%s' but no 'rope_type' (or 'type'): say which RoPE "
                      "scaling it is", ctx_quote(c, s->keys[i]->str));
            return;
        }
    const char *type = t ? node_str(c, t, "rope_type") : "default";
    if (!type || strcmp(type, "default") == 0)
        return;
    if (strcmp(type, "longrope") == 0 || strcmp(type, "su") == 0) {   /* Phi-3 128k, Phi-3.5 ("su": the old name) */
        m->rope_scaling = ROPE_SCALING_LONGROPE;
        c->at[F_SCALING] = s;
        rope_factor_list(c, s, "rope_scaling", "short_factor", m->rope_freq_factors);
        rope_factor_list(c, s, "rope_scaling", "long_factor", m->rope_long_factors);
        /* the original context: rope_scaling's, else the config's own key */
        const DocNode *o = doc_get(s, "original_max_position_embeddings");
        if (!o && !(o = doc_get(root, "original_max_position_embeddings")))
            missing_key(c, root, "", "original_max_position_embeddings");
        else
            node_int32(c, o, "original_max_position_embeddings", 1, &m->rope_orig_max_pos);
        m->rope_attn_factor = longrope_attn_default(c->max_pos, m->rope_orig_max_pos);
        const DocNode *a = doc_get(s, "attention_factor");
        if (a && !doc_is_null(a) && node_double(c, a, "attention_factor", &m->rope_attn_factor) &&
            !(isfinite(m->rope_attn_factor) && m->rope_attn_factor > 0))
            ctx_error(c, a, "'attention_factor' must be a positive number, found %g", m->rope_attn_factor);
        return;
    }
    if (strcmp(type, "llama3") != 0) {
        ctx_error(c, t, "RoPE scaling '%s' is not supported yet (llama3 and longrope are)", ctx_quote(c, type));
        return;
    }
    m->rope_scaling = ROPE_SCALING_LLAMA3;
    c->at[F_SCALING] = s;
    static const char *const need[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings", NULL};
    for (int i = 0; need[i]; i++)
        if (!doc_get(s, need[i]))
            missing_key(c, s, "rope_scaling", need[i]);
    field_double(c, s, "", "factor", &m->rope_factor, -1);
    field_double(c, s, "", "low_freq_factor", &m->rope_low_freq_factor, -1);
    field_double(c, s, "", "high_freq_factor", &m->rope_high_freq_factor, -1);
    field_int(c, s, "", "original_max_position_embeddings", 1, &m->rope_orig_max_pos, -1);
}

/* Parses a JSON file's text (taken over) into doc, whose nodes ctx_error
 * then places in it; false (reported) unless it holds an object. */
static bool json_object_parse(Ctx *c, Doc *doc, const char *path, char *text, size_t len, const char *in,
                              const char *what)
{
    if (!doc_parse(doc, path, text, len, c->d))
        return false;
    if (!doc->root) {
        diag_file_error(c->d, path, "empty %s", what);
        return false;
    }
    ctx_origin_add(c, doc, doc->root);
    if (doc->root->kind != DOC_MAP) {
        ctx_error(c, doc->root, "expected a JSON object in %s, found %s", in, doc_kind_name(doc->root->kind));
        return false;
    }
    return true;
}

/* bos_token_id: an id (the first of a list; an empty list is an error,
 * as null is the way to say there is none). */
static void config_token_id(Ctx *c, const DocNode *root, const char *key, int *out, int f)
{
    const DocNode *n = doc_get(root, key);
    if (n && n->kind == DOC_SEQ && n->n == 0) {
        ctx_error(c, n, "expected an id for '%s' (or null for none), found an empty list", key);
        return;
    }
    if (n && n->kind == DOC_SEQ)
        n = n->items[0];
    if (n && !doc_is_null(n) && node_int32(c, n, key, 0, out))
        c->at[f] = n;
}

/* Whether id already ends generation (the eos or a stop id). */
static bool eos_known(const ModelDesc *m, int id)
{
    bool known = id == m->eos_id;
    for (int k = 0; k < m->n_stop; k++)
        known |= m->stop_ids[k] == id;
    return known;
}

/* eos (YAML) or eos_token_id (config): an id, or a list of them whose
 * first is the eos and whose others end generation too (Llama 3 Instruct:
 * [<|end_of_text|>, <|eom_id|>, <|eot_id|>]). */
static void eos_read(Ctx *c, const DocNode *n, const char *what)
{
    ModelDesc *m = c->m;
    if (!n || doc_is_null(n))
        return;
    if (n->kind != DOC_SEQ) {
        if (node_int32(c, n, what, 0, &m->eos_id))
            c->at[F_EOS] = c->at[F_STOP] = n, m->n_stop = 0;
        return;
    }
    if (n->n < 1 || n->n > 1 + MODEL_MAX_STOPS) {
        ctx_error(c, n, "expected 1 to %d ids for '%s', found %d", 1 + MODEL_MAX_STOPS, what, n->n);
        return;
    }
    int ids[1 + MODEL_MAX_STOPS];
    for (int i = 0; i < n->n; i++)
        if (!node_int32(c, n->items[i], what, 0, &ids[i]))
            return;
    m->eos_id = ids[0];
    m->n_stop = 0;
    for (int i = 1; i < n->n; i++) /* an id listed twice ends generation once */
        if (!eos_known(m, ids[i]))
            m->stop_ids[m->n_stop++] = ids[i];
    c->at[F_EOS] = c->at[F_STOP] = n;
}

/* generation_config.json beside an HF checkpoint's config.json:
 * {eos_token_id: ID | [ID, ...], ...} (other keys ignored). Its ids end
 * generation too: they join the stop list after config.json's, whose
 * first id stays the eos (the first here is the eos only when config.json
 * names none), and no id is listed twice. Llama 3 Instruct's config.json
 * may name <|end_of_text|> alone where this file adds <|eom_id|> and
 * <|eot_id|>. */
static void config_generation_eos(Ctx *c, Doc *gen, const char *cfg_path)
{
    const char *slash = strrchr(cfg_path, '/'), *base = slash ? slash + 1 : cfg_path;
    if (strcmp(base, "config.json") != 0)
        return;
    const char *path = arena_printf(c->a, "%.*sgeneration_config.json", (int)(base - cfg_path), cfg_path);
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT)
        return;
    size_t len;
    char *text = read_file(path, &len);
    if (!text) {
        diag_file_error(c->d, path, "cannot read: %s", read_error(errno));
        return;
    }
    c->m->gen_config_path = path;
    if (!json_object_parse(c, gen, path, text, len, "generation_config.json", "generation config"))
        return;
    const DocNode *n = doc_get(gen->root, "eos_token_id");
    if (!n || doc_is_null(n))
        return;
    const DocNode *const *items = n->kind == DOC_SEQ ? (const DocNode *const *)n->items : &n;
    int count = n->kind == DOC_SEQ ? n->n : 1;
    ModelDesc *m = c->m;
    for (int i = 0; i < count; i++) {
        int id;
        if (!node_int32(c, items[i], "eos_token_id", 0, &id))
            return;
        if (eos_known(m, id))
            continue;
        if (m->eos_id < 0) {
            m->eos_id = id;
            c->at[F_EOS] = items[i];
        } else if (m->n_stop == MODEL_MAX_STOPS) {
            ctx_error(c, items[i], "more than %d ids end generation (config.json's eos_token_id and this list)",
                      1 + MODEL_MAX_STOPS);
            return;
        } else {
            m->stop_ids[m->n_stop++] = id;
            c->at[F_STOP] = items[i];
        }
    }
}

static void config_dims(Ctx *c, const DocNode *r)
{
    ModelDesc *m = c->m;
    static const char *const need[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                       "num_attention_heads", "vocab_size", "max_position_embeddings", NULL};
    for (int i = 0; need[i]; i++)
        if (!doc_get(r, need[i]))
            missing_key(c, r, "", need[i]);
    field_int(c, r, "", "hidden_size", 1, &m->dim, F_DIM);
    field_int(c, r, "", "intermediate_size", 1, &m->hidden_dim, F_HIDDEN);
    field_int(c, r, "", "num_hidden_layers", 1, &m->n_layers, F_LAYERS);
    field_int(c, r, "", "num_attention_heads", 1, &m->n_heads, F_HEADS);
    if (!doc_is_null(doc_get(r, "num_key_value_heads")))
        field_int(c, r, "", "num_key_value_heads", 1, &m->n_kv_heads, F_KV_HEADS);
    if (!doc_is_null(doc_get(r, "head_dim")))
        field_int(c, r, "", "head_dim", 1, &m->head_dim, F_HEAD_DIM);
    field_int(c, r, "", "vocab_size", 1, &m->vocab_size, F_VOCAB);
    field_int(c, r, "", "max_position_embeddings", 1, &c->max_pos, F_MAX_SEQ);
    m->max_seq = c->max_pos < 4096 ? c->max_pos : 4096;
    m->norm_eps = 1e-6;     /* transformers' default for all three */
    field_double(c, r, "", "rms_norm_eps", &m->norm_eps, F_EPS);
    field_double(c, r, "", "rope_theta", &m->rope_theta, F_THETA);
    config_rope(c, r, doc_get(r, "rope_scaling"));
    config_rope(c, r, doc_get(r, "rope_parameters"));
    m->tie_embeddings = false;
    field_bool(c, r, "", "tie_word_embeddings", &m->tie_embeddings);
    config_token_id(c, r, "bos_token_id", &m->bos_id, F_BOS);
    eos_read(c, doc_get(r, "eos_token_id"), "eos_token_id");
}

/* arch: {from-config: PATH}: reads an HF config.json (JSON is YAML flow)
 * into cfg[0], and a generation_config.json beside it into cfg[1]. */
static void arch_from_config(Ctx *c, Doc cfg[2], const DocNode *at)
{
    const char *what = "arch.from-config";
    const char *p = node_str(c, at, what);
    if (!p)
        return;
    const char *path = path_resolve(c, p);
    size_t len;
    char *text = read_file(path, &len);
    if (!text) {
        ctx_error(c, at, "cannot read config '%s': %s", path, read_error(errno));
        return;
    }
    if (!json_object_parse(c, cfg, path, text, len, "an HF config", "config"))
        return;
    int arch = config_arch(c, cfg->root, at);
    if (arch < 0)
        return;
    c->from_config = true;
    c->m->arch_path = path;
    c->m->qkv_bias = arch == HF_QWEN2;
    config_refuse(c, cfg->root, arch);
    config_dims(c, cfg->root);
    config_generation_eos(c, &cfg[1], path);
}

/* A llama2.c header's seven int32 (arch_from_checkpoint): each within the
 * bounds desc_check allows, so no text file starts with one (ASCII bytes
 * make int32 of 2^29 and more). */
static bool llama2c_header_sane(const int32_t h[7])
{
    return h[0] > 0 && h[0] <= DESC_MAX_DIM && h[1] > 0 && h[1] <= DESC_MAX_DIM && h[2] > 0 && h[2] <= 4096 &&
           h[3] > 0 && h[3] <= 4096 && h[4] > 0 && h[4] <= h[3] && h[5] != 0 && h[5] >= -DESC_MAX_VOCAB &&
           h[5] <= DESC_MAX_VOCAB && h[6] > 0 && h[6] <= DESC_MAX_SEQ;
}

/* arch: {from-checkpoint: PATH}: a llama2.c .bin header, seven int32: dim,
 * hidden_dim, n_layers, n_heads, n_kv_heads, vocab (negative: unshared
 * classifier), seq_len. */
static void arch_from_checkpoint(Ctx *c, const DocNode *at)
{
    ModelDesc *m = c->m;
    const char *p = node_str(c, at, "arch.from-checkpoint");
    if (!p)
        return;
    const char *path = path_resolve(c, p);
    FILE *f = fopen_read(path);
    if (!f) {
        ctx_error(c, at, "cannot read checkpoint '%s': %s", path, strerror(errno));
        return;
    }
    int32_t h[7];
    size_t got = fread(h, sizeof h[0], 7, f);
    fclose(f);
    if (got >= 2 && memcmp(h, "ak42", 4) == 0) { /* export.py --version 1 and 2 */
        ctx_error(c, at, "'%s' is a llama2.c version %d export (magic 'ak42'); megac reads the version 0 format "
                  "(export.py --version 0, the header of seven int32)", path, h[1]);
        return;
    }
    if (got != 7) {
        ctx_error(c, at, "'%s' does not start with a llama2.c header: it is shorter than the header's 28 bytes", path);
        return;
    }
    if (!llama2c_header_sane(h)) {
        ctx_error(c, at, "'%s' does not start with a llama2.c header (dim, hidden_dim, n_layers, n_heads, "
                  "n_kv_heads, vocab_size, seq_len as int32): it reads %d, %d, %d, %d, %d, %d, %d", path, h[0], h[1],
                  h[2], h[3], h[4], h[5], h[6]);
        return;
    }
    m->dim = h[0], m->hidden_dim = h[1], m->n_layers = h[2], m->n_heads = h[3], m->n_kv_heads = h[4];
    m->vocab_size = h[5] < 0 ? -h[5] : h[5];
    m->tie_embeddings = h[5] > 0;
    m->max_seq = c->max_pos = h[6];
    m->arch_path = path;
    m->norm_eps = 1e-5;     /* hard-coded in llama2.c */
    for (int i = F_DIM; i <= F_MAX_SEQ; i++)
        c->at[i] = at;
}

/* ---- arch from a GGUF file's metadata ---- */

/* `<arch>.<key>` as an int in [1, INT_MAX]: false (error reported) when it
 * is present with another type or out of range, or absent and needed; *out
 * is left alone when it is absent. Field f (or -1) remembers the key. */
static bool gguf_meta_int(Ctx *c, const GgufFile *g, const char *arch, const char *key, bool need, int *out, int f)
{
    char full[160];
    int64_t v;
    int r = gguf_arch_int(g, arch, key, full, &v, c->d);
    if (r == 0 && need)
        diag_file_error(c->d, g->path, "key '%s' is missing", full);
    if (r <= 0)
        return r == 0 && !need;
    if (v < 1 || v > INT_MAX) {
        diag_file_error(c->d, g->path, "key '%s' is %" PRId64 "; it must be between 1 and %d", full, v, INT_MAX);
        return false;
    }
    *out = (int)v;
    if (f >= 0)
        c->at_key[f] = arena_strdup(c->a, full);
    return true;
}

/* `<arch>.<key>` as a positive finite number, when present. */
static bool gguf_meta_double(Ctx *c, const GgufFile *g, const char *arch, const char *key, double *out, int f)
{
    char full[160];
    double v;
    int r = gguf_arch_float(g, arch, key, full, &v, c->d);
    if (r > 0) {
        *out = v;
        c->at_key[f] = arena_strdup(c->a, full);
    }
    return r >= 0;
}

/* What the file holds that megac does not compute: refused by name. */
static void gguf_refuse(Ctx *c, const GgufFile *g, const char *arch)
{
    char full[160];
    int64_t n = 0;
    /* a key of another type than the specification's is refused too, not
     * passed over as if absent */
    if (gguf_arch_int(g, arch, "expert_count", full, &n, c->d) > 0 && n > 0)
        diag_file_error(c->d, g->path, "a mixture of experts (%s = %" PRId64 ") is not supported", full, n);
    GgufStr t;
    snprintf(full, sizeof full, "%s.rope.scaling.type", arch);
    if (gguf_find(g, full) && !gguf_get_str(g, full, &t))
        diag_file_error(c->d, g->path, "key '%s' must be a string", full);
    else if (gguf_find(g, full) && !(t.len == 4 && memcmp(t.s, "none", 4) == 0))
        diag_file_error(c->d, g->path, "RoPE scaling '%s' (%s) is not supported yet", ctx_quote_n(c, t.s, t.len),
                        full);
    static const char *const biases[] = {"blk.0.attn_output.bias", "blk.0.ffn_up.bias", "blk.0.ffn_gate.bias",
                                         "blk.0.ffn_down.bias", NULL};
    for (int i = 0; biases[i]; i++)
        if (gguf_find_tensor(g, biases[i]))
            diag_file_error(c->d, g->path, "tensor '%s': biases other than q/k/v are not supported", biases[i]);
}

/* LongRoPE as llama.cpp's converter writes it for Phi-3 128k and Phi-3.5:
 * the tensors rope_factors_short.weight and rope_factors_long.weight, the
 * original context in rope.scaling.original_context_length and the
 * attention factor in rope.scaling.attn_factor (else worked out as a
 * config's is). */
static void gguf_longrope(Ctx *c, const GgufFile *g, const char *arch)
{
    ModelDesc *m = c->m;
    int half = m->head_dim / 2;
    bool s = gguf_find_tensor(g, "rope_factors_short.weight"), l = gguf_find_tensor(g, "rope_factors_long.weight");
    if (!s && !l)
        return;
    if (s != l || half > MODEL_MAX_ROPE_PAIRS) {
        diag_file_error(c->d, g->path, "LongRoPE needs both tensors rope_factors_short.weight and "
                        "rope_factors_long.weight (of head_dim / 2 values)");
        return;
    }
    if (m->rope_scaling != ROPE_SCALING_NONE) {
        diag_file_error(c->d, g->path, "the file has LongRoPE's factors and rope_freqs.weight both");
        return;
    }
    if (gguf_factor_tensor(g, "rope_factors_short.weight", half, m->rope_freq_factors, c->d) <= 0 ||
        gguf_factor_tensor(g, "rope_factors_long.weight", half, m->rope_long_factors, c->d) <= 0)
        return;
    char full[160];
    int64_t orig;
    double a;
    int r = gguf_arch_int(g, arch, "rope.scaling.original_context_length", full, &orig, c->d);
    if (r == 0)
        diag_file_error(c->d, g->path, "key '%s' is missing (LongRoPE's original context)", full);
    if (r <= 0)
        return;
    if (orig < 1 || orig > INT_MAX) {
        diag_file_error(c->d, g->path, "key '%s' is %" PRId64 "; it must be between 1 and %d", full, orig, INT_MAX);
        return;
    }
    m->rope_scaling = ROPE_SCALING_LONGROPE;
    m->rope_orig_max_pos = (int)orig;
    m->rope_attn_factor = longrope_attn_default(c->max_pos, m->rope_orig_max_pos);
    r = gguf_arch_float(g, arch, "rope.scaling.attn_factor", full, &a, c->d);
    if (r > 0 && !(isfinite(a) && a > 0))
        diag_file_error(c->d, g->path, "key '%s' is %g, not a positive number", full, a);
    else if (r > 0)
        m->rope_attn_factor = a;
}

/* The dims of a llama/qwen2 GGUF, as llama.cpp reads them: head_dim is
 * attention.key_length (default dim / heads), the vocabulary the embedding's
 * rows, the classifier tied when there is no output.weight. */
static void gguf_dims(Ctx *c, const GgufFile *g, const char *arch, const DocNode *at)
{
    ModelDesc *m = c->m;
    bool ok = gguf_meta_int(c, g, arch, "embedding_length", true, &m->dim, F_DIM);
    ok &= gguf_meta_int(c, g, arch, "feed_forward_length", true, &m->hidden_dim, F_HIDDEN);
    ok &= gguf_meta_int(c, g, arch, "block_count", true, &m->n_layers, F_LAYERS);
    ok &= gguf_meta_int(c, g, arch, "attention.head_count", true, &m->n_heads, F_HEADS);
    ok &= gguf_meta_int(c, g, arch, "attention.head_count_kv", false, &m->n_kv_heads, F_KV_HEADS);
    ok &= gguf_meta_int(c, g, arch, "context_length", true, &c->max_pos, F_MAX_SEQ);
    int kl = 0, vl = 0, rd = 0;
    ok &= gguf_meta_int(c, g, arch, "attention.key_length", false, &kl, F_HEAD_DIM);
    ok &= gguf_meta_int(c, g, arch, "attention.value_length", false, &vl, -1);
    ok &= gguf_meta_int(c, g, arch, "rope.dimension_count", false, &rd, -1);
    ok &= gguf_meta_double(c, g, arch, "rope.freq_base", &m->rope_theta, F_THETA);
    ok &= gguf_meta_double(c, g, arch, "attention.layer_norm_rms_epsilon", &m->norm_eps, F_EPS);
    ok &= gguf_meta_int(c, g, arch, "attention.sliding_window", false, &m->sliding_window, -1);  /* phi3's */
    if (!ok)
        return;
    if (m->sliding_window)
        c->swa_at = at;
    m->head_dim = kl ? kl : m->n_heads > 0 && m->dim % m->n_heads == 0 ? m->dim / m->n_heads : 0;
    if (!m->head_dim) {     /* the checks below compare with it; desc_check would say it later */
        diag_file_error(c->d, g->path, "key '%s.attention.head_count' is %d, which does not divide "
                        "'%s.embedding_length' %d, and no '%s.attention.key_length' gives a head's size",
                        arch, m->n_heads, arch, m->dim, arch);
        return;
    }
    if (vl && vl != m->head_dim)
        diag_file_error(c->d, g->path, "key '%s.attention.value_length' is %d, but a head's key size is %d: value "
                        "and key heads of different sizes are not supported", arch, vl, m->head_dim);
    if (rd > m->head_dim)
        diag_file_error(c->d, g->path, "key '%s.rope.dimension_count' is %d, more than a head's %d dims", arch, rd,
                        m->head_dim);
    else if (rd && rd != m->head_dim)
        diag_file_error(c->d, g->path, "RoPE on %d of a head's %d dims (partial rotary) is not supported", rd,
                        m->head_dim);
    const GgufTensor *e = gguf_find_tensor(g, "token_embd.weight");
    if (!e || e->ndim != 2 || e->dims[1] < 1 || e->dims[1] > INT_MAX) {
        diag_file_error(c->d, g->path, "no 2-d tensor 'token_embd.weight' gives the vocabulary size");
        return;
    }
    m->vocab_size = (int)e->dims[1];
    int64_t vs;
    char full[160];
    if (gguf_arch_int(g, arch, "vocab_size", full, &vs, c->d) > 0 && vs != m->vocab_size)
        diag_file_error(c->d, g->path, "key '%s' is %" PRId64 ", but tensor 'token_embd.weight' has %d rows", full,
                        vs, m->vocab_size);
    m->max_seq = c->max_pos < 4096 ? c->max_pos : 4096;
    m->tie_embeddings = !gguf_find_tensor(g, "output.weight");
    m->qkv_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    if (m->head_dim / 2 <= MODEL_MAX_ROPE_PAIRS && gguf_rope_factors(g, m->head_dim / 2, m->rope_freq_factors, c->d) > 0)
        m->rope_scaling = ROPE_SCALING_FACTORS;
    gguf_longrope(c, g, arch);
    for (int i = F_DIM; i <= F_THETA; i++)
        c->at[i] = at;
}

/* arch: {from-gguf: PATH}: a GGUF file's own hyperparameters (llama.cpp's
 * `<arch>.*` keys) and RoPE pairing. */
static void arch_from_gguf(Ctx *c, const DocNode *at)
{
    const char *p = node_str(c, at, "arch.from-gguf");
    if (!p)
        return;
    int errors0 = c->d->nerrors;
    const char *path = path_resolve(c, p);
    GgufFile *g = gguf_open(path, c->d);
    char arch[64];
    RopePairing pairing;
    if (g && gguf_model_arch(g, arch, sizeof arch, &pairing, c->d)) {
        c->m->arch_path = path;
        c->arch_pairing = (int)pairing;
        gguf_refuse(c, g, arch);
        gguf_dims(c, g, arch, at);
    }
    if (c->d->nerrors != errors0 && strcmp(path, c->m->path) != 0)    /* not the file itself named as the model */
        ctx_note(c, at, "GGUF named here");
    if (g)
        gguf_close(g);
}

/* arch: {dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim,
 *        vocab_size, max_seq} | {from-config: PATH, KEY: override...}
 *      | {from-checkpoint: PATH, KEY: override...} */
static void desc_arch(Ctx *c, Doc cfg[2], const DocNode *a)
{
    ModelDesc *m = c->m;
    if (!map_check(c, a, "arch", arch_keys))
        return;
    const DocNode *fc = doc_get(a, "from-config"), *fk = doc_get(a, "from-checkpoint");
    const DocNode *fg = doc_get(a, "from-gguf");
    if (!!fc + !!fk + !!fg > 1) {
        ctx_error(c, fg ? fg : fk, "only one of 'from-config', 'from-checkpoint' and 'from-gguf' can be given");
        return;
    }
    if (fc)
        arch_from_config(c, cfg, fc);
    else if (fk)
        arch_from_checkpoint(c, fk);
    else if (fg)
        arch_from_gguf(c, fg);
    static const char *const need[] = {"dim", "hidden_dim", "n_layers", "n_heads", "vocab_size", "max_seq", NULL};
    for (int i = 0; !fc && !fk && !fg && need[i]; i++)
        if (!doc_get(a, need[i]))
            missing_key(c, a, "arch", need[i]);
    field_int(c, a, "arch", "dim", 1, &m->dim, F_DIM);
    field_int(c, a, "arch", "hidden_dim", 1, &m->hidden_dim, F_HIDDEN);
    field_int(c, a, "arch", "n_layers", 1, &m->n_layers, F_LAYERS);
    field_int(c, a, "arch", "n_heads", 1, &m->n_heads, F_HEADS);
    field_int(c, a, "arch", "n_kv_heads", 1, &m->n_kv_heads, F_KV_HEADS);
    field_int(c, a, "arch", "head_dim", 1, &m->head_dim, F_HEAD_DIM);
    field_int(c, a, "arch", "vocab_size", 1, &m->vocab_size, F_VOCAB);
    if (doc_get(a, "max_seq")) {
        field_int(c, a, "arch", "max_seq", 1, &m->max_seq, F_MAX_SEQ);
        c->max_pos = m->max_seq;
    }
    const DocNode *sw = doc_get(a, "sliding_window");
    if (sw && node_int32(c, sw, "arch.sliding_window", 1, &m->sliding_window))
        c->swa_at = sw;
    if (!m->n_kv_heads) {
        m->n_kv_heads = m->n_heads;
        c->at[F_KV_HEADS] = c->at[F_HEADS];
    }
    if (!m->head_dim && m->n_heads > 0 && m->dim % m->n_heads == 0)
        m->head_dim = m->dim / m->n_heads;
}

/* ---- rope ---- */

/* scaling: {type: factors, factors: [NUMBER, ...]}: one divisor per pair
 * (head_dim / 2 of them), as a GGUF's rope_freqs.weight holds. */
static void desc_rope_factors(Ctx *c, const DocNode *s)
{
    ModelDesc *m = c->m;
    for (int i = 1; scaling_keys[i]; i++)
        if (strcmp(scaling_keys[i], "factors") != 0 && doc_get(s, scaling_keys[i]))
            ctx_error(c, doc_get(s, scaling_keys[i]), "'rope.scaling.%s' does not apply to type 'factors'",
                      scaling_keys[i]);
    m->rope_scaling = ROPE_SCALING_FACTORS;
    rope_factor_list(c, s, "rope.scaling", "factors", m->rope_freq_factors);
}

/* scaling: {type: longrope, short_factors: [...], long_factors: [...],
 *           original_max_pos: N, attention_factor: NUMBER} */
static void desc_rope_longrope(Ctx *c, const DocNode *s)
{
    ModelDesc *m = c->m;
    static const char *const apply[] = {"type", "short_factors", "long_factors", "original_max_pos",
                                        "attention_factor", NULL};
    for (int i = 0; i < s->n; i++)
        if (name_index(s->keys[i]->str, apply) < 0)
            ctx_error(c, s->keys[i], "'rope.scaling.%s' does not apply to type 'longrope'",
                      ctx_quote(c, s->keys[i]->str));
    m->rope_scaling = ROPE_SCALING_LONGROPE;
    rope_factor_list(c, s, "rope.scaling", "short_factors", m->rope_freq_factors);
    rope_factor_list(c, s, "rope.scaling", "long_factors", m->rope_long_factors);
    if (!doc_get(s, "original_max_pos"))
        missing_key(c, s, "rope.scaling", "original_max_pos");
    field_int(c, s, "rope.scaling", "original_max_pos", 1, &m->rope_orig_max_pos, -1);
    m->rope_attn_factor = longrope_attn_default(c->max_pos ? c->max_pos : m->max_seq, m->rope_orig_max_pos);
    const DocNode *a = doc_get(s, "attention_factor");
    if (a && node_double(c, a, "rope.scaling.attention_factor", &m->rope_attn_factor) &&
        !(isfinite(m->rope_attn_factor) && m->rope_attn_factor > 0))
        ctx_error(c, a, "'rope.scaling.attention_factor' must be a positive number, found %g", m->rope_attn_factor);
}

/* scaling: none | {type: llama3, factor: NUMBER, low_freq_factor: 1,
 *                  high_freq_factor: 4, original_max_pos: 8192}
 *        | {type: factors, factors: [...]} | {type: longrope, ...} */
static void desc_rope_scaling(Ctx *c, const DocNode *s)
{
    ModelDesc *m = c->m;
    c->at[F_SCALING] = s;
    if (doc_is_null(s) || (s->kind == DOC_SCALAR && !s->quoted && strcmp(s->str, "none") == 0)) {
        m->rope_scaling = ROPE_SCALING_NONE;
        return;
    }
    if (!map_check(c, s, "rope.scaling", scaling_keys))
        return;
    const DocNode *t = doc_get(s, "type");
    int type = t ? node_enum(c, t, "rope.scaling.type", scaling_types) : 0;
    if (!t)
        missing_key(c, s, "rope.scaling", "type");
    else if (type < 0)
        return;
    if (type + 1 == ROPE_SCALING_FACTORS) {
        desc_rope_factors(c, s);
        return;
    }
    if (type + 1 == ROPE_SCALING_LONGROPE) {
        desc_rope_longrope(c, s);
        return;
    }
    if (doc_get(s, "factors"))
        ctx_error(c, doc_get(s, "factors"), "'rope.scaling.factors' applies only to type 'factors'");
    static const char *const longrope_only[] = {"short_factors", "long_factors", "attention_factor", NULL};
    for (int i = 0; longrope_only[i]; i++)
        if (doc_get(s, longrope_only[i]))
            ctx_error(c, doc_get(s, longrope_only[i]), "'rope.scaling.%s' applies only to type 'longrope'",
                      longrope_only[i]);
    if (!doc_get(s, "factor"))
        missing_key(c, s, "rope.scaling", "factor");
    m->rope_scaling = ROPE_SCALING_LLAMA3;
    m->rope_low_freq_factor = 1, m->rope_high_freq_factor = 4, m->rope_orig_max_pos = 8192;
    field_double(c, s, "rope.scaling", "factor", &m->rope_factor, -1);
    field_double(c, s, "rope.scaling", "low_freq_factor", &m->rope_low_freq_factor, -1);
    field_double(c, s, "rope.scaling", "high_freq_factor", &m->rope_high_freq_factor, -1);
    field_int(c, s, "rope.scaling", "original_max_pos", 1, &m->rope_orig_max_pos, -1);
}

/* rope: {theta: NUMBER, pairing: adjacent|half, scaling: ...} */
static void desc_rope(Ctx *c, const DocNode *r)
{
    if (!map_check(c, r, "rope", rope_keys))
        return;
    field_double(c, r, "rope", "theta", &c->m->rope_theta, F_THETA);
    const DocNode *p = doc_get(r, "pairing");
    int k = p ? node_enum(c, p, "rope.pairing", pairings) : -1;
    if (k >= 0)
        c->m->rope_pairing = (RopePairing)k;
    const DocNode *s = doc_get(r, "scaling");
    if (s)
        desc_rope_scaling(c, s);
}

/* ---- compile knobs ---- */

/* QUANT := none|f32|f16|bf16|w8a16|w4a16[-gG]|w8a8|w4a8[-gG]|a8, G in 32|64|128. */
static bool quant_parse(const char *s, QuantSpec *q)
{
    char name[16];
    size_t n = strcspn(s, "-");
    if (n >= sizeof name)
        return false;
    memcpy(name, s, n);
    name[n] = 0;
    int k = name_index(name, quant_names);
    if (k < 0)
        return false;
    q->kind = (QuantKind)k;
    q->group = k == QUANT_W4A16 || k == QUANT_W4A8 ? 128 : 0;
    if (!s[n])
        return true;
    static const char *const groups[] = {"-g32", "-g64", "-g128", NULL};
    int g = name_index(s + n, groups);
    if (!q->group || g < 0)
        return false;
    q->group = 32 << g;
    return true;
}

static bool quant_node(Ctx *c, const DocNode *n, const char *what, QuantSpec *q)
{
    const char *s = node_str(c, n, what);
    if (!s)
        return false;
    if (!quant_parse(s, q)) {
        const char *near = str_closest(s, quant_names);
        if (near)
            ctx_error(c, n, "bad value '%s' for '%s'; did you mean '%s'?", ctx_quote(c, s), what, near);
        else
            ctx_error(c, n, "bad value '%s' for '%s' (expected none, f32, f16, bf16, w8a16, w4a16[-g32|-g64|-g128],"
                      " w8a8, w4a8[-g32|-g64|-g128] or a8)", ctx_quote(c, s), what);
        return false;
    }
    return true;
}

/* quant: QUANT | {default: QUANT, embed: QUANT, attn: QUANT, mlp: QUANT,
 *                 lm_head: QUANT}; a class not named takes the default. */
static void desc_quant(Ctx *c, const DocNode *q)
{
    ModelDesc *m = c->m;
    QuantSpec def = {QUANT_NONE, 0};
    if (q->kind == DOC_SCALAR) {
        quant_node(c, q, "compile.quant", &def);
        for (int i = 0; i < TCLASS_COUNT; i++)
            m->quant[i] = def;
        return;
    }
    if (!map_check(c, q, "compile.quant", quant_keys))
        return;
    if (doc_get(q, "default"))
        quant_node(c, doc_get(q, "default"), "compile.quant.default", &def);
    for (int i = 0; i < TCLASS_COUNT; i++) {
        const DocNode *n = doc_get(q, quant_keys[i + 1]);
        m->quant[i] = def;
        if (n)
            quant_node(c, n, key_path(c, "compile.quant", quant_keys[i + 1]), &m->quant[i]);
    }
}

/* Reads decimal digits at p (at least one, value at most INT_MAX); returns
 * the end, or NULL. */
static const char *range_number(const char *p, long *v)
{
    if (*p < '0' || *p > '9')
        return NULL;
    for (*v = 0; *p >= '0' && *p <= '9'; p++)
        if ((*v = *v * 10 + (*p - '0')) > INT_MAX)
            return NULL;
    return p;
}

/* RANGE := all | N | N- | N-M (layers N..M inclusive; N- is N..last).
 * Sets [*lo, *hi] within 0..nl-1, or reports why not. */
static bool range_parse(Ctx *c, const DocNode *n, const char *what, int nl, int *lo, int *hi)
{
    const char *s = node_str(c, n, what);
    if (!s)
        return false;
    if (strcmp(s, "all") == 0) {
        *lo = 0, *hi = nl - 1;
        return true;
    }
    long a = 0, b;
    const char *p = range_number(s, &a);
    b = a;
    if (p && p[0] == '-' && p[1])
        p = range_number(p + 1, &b);
    else if (p && p[0] == '-')
        b = nl - 1, p++;
    if (!p || *p) {
        ctx_error(c, n, "bad layer range '%s' (expected N, N-M, N- or all)", ctx_quote(c, s));
        return false;
    }
    if (a >= nl || b >= nl) {
        ctx_error(c, n, "layer range '%s' is out of bounds: the model has %d layers (0-%d)", ctx_quote(c, s), nl,
                  nl - 1);
        return false;
    }
    if (a > b) {
        ctx_error(c, n, "bad layer range '%s': it starts after it ends", ctx_quote(c, s));
        return false;
    }
    *lo = (int)a, *hi = (int)b;
    return true;
}

/* Claims layers lo..hi for entry `e` of a per-layer list; overlaps with an
 * earlier entry are errors. */
static bool range_claim(Ctx *c, const DocNode **owner, const DocNode *e, const DocNode *rn, const char *list, int lo,
                        int hi)
{
    for (int l = lo; l <= hi; l++) {
        if (owner[l]) {
            ctx_error(c, rn, "layer %d is already covered by an earlier entry of '%s'", l, list);
            ctx_note(c, owner[l], "the earlier entry");
            return false;
        }
    }
    for (int l = lo; l <= hi; l++)
        owner[l] = e;
    return true;
}

/* Reads the params of one entry: keys names[i] -> vals[i], checked
 * against the kind's need/allow masks. */
static bool params_read(Ctx *c, const DocNode *e, const char *list, const char *kind, const char *const *names,
                        int nnames, unsigned need, unsigned allow, int *vals)
{
    bool ok = true;
    for (int i = 0; i < nnames; i++) {
        const DocNode *n = doc_get(e, names[i]);
        const char *what = arena_printf(c->a, "%s.%s", list, names[i]);
        if (n && !(allow >> i & 1)) {
            ctx_error(c, n, "'%s' does not apply to %s '%s'", names[i], list, kind);
            ok = false;
        } else if (!n && (need >> i & 1)) {
            ctx_error(c, e, "missing key '%s' in '%s' entry (%s '%s' needs it)", names[i], list, list, kind);
            ok = false;
        } else if (n) {
            ok &= node_int32(c, n, what, strcmp(names[i], "sinks") == 0 || strcmp(names[i], "anchor") == 0 ? 0 : 1,
                             &vals[i]);
        }
    }
    return ok;
}

/* One entry of attention/kv_policy: {layers: RANGE, KINDKEY: KIND, params}.
 * Returns the kind (-1 on error) and fills lo/hi/vals. */
static int entry_read(Ctx *c, const DocNode *e, const char *list, const char *const *keys, const char *kindkey,
                      const char *const *kinds, const char *const *pnames, int np, const ParamMask *mk,
                      const DocNode **owner, int *vals)
{
    if (!map_check(c, e, arena_printf(c->a, "compile.%s entry", list), keys))
        return -1;
    const DocNode *rn = doc_get(e, "layers"), *kn = doc_get(e, kindkey);
    if (!rn)
        missing_key(c, e, arena_printf(c->a, "compile.%s entry", list), "layers");
    if (!kn)
        missing_key(c, e, arena_printf(c->a, "compile.%s entry", list), kindkey);
    if (!rn || !kn)
        return -1;
    const char *what = arena_printf(c->a, "compile.%s.%s", list, kindkey);
    int k = node_enum(c, kn, what, kinds);
    int lo = 0, hi = -1, nl = c->m->n_layers;
    bool ok = k >= 0 && params_read(c, e, list, kinds[k], pnames, np, mk[k].need, mk[k].allow, vals);
    if (nl >= 1 && nl <= MODEL_MAX_LAYERS && range_parse(c, rn, arena_printf(c->a, "compile.%s.layers", list), nl,
                                                         &lo, &hi))
        ok &= range_claim(c, owner, e, rn, arena_printf(c->a, "compile.%s", list), lo, hi);
    vals[np] = lo, vals[np + 1] = hi;
    return ok ? k : -1;
}

/* A kascade_reuse entry's `heads: [a_0, ..., a_{n_kv_heads-1}]`: kv head h
 * reads the rows of the anchor's kv head a_h. An identity map is kept as
 * none (head_map false), so that a description prints and reads back the
 * same. */
static bool desc_head_map(Ctx *c, const DocNode *n, int kind, AttnSpec *out)
{
    int nkv = c->m->n_kv_heads;
    if (kind != ATTN_KASCADE_REUSE) {
        ctx_error(c, n, "'heads' does not apply to attention '%s' (it maps a kascade_reuse layer's kv heads to "
                  "its anchor's)", attn_kinds[kind]);
        return false;
    }
    if (n->kind != DOC_SEQ) {
        ctx_error(c, n, "expected a list of %d anchor kv heads for 'compile.attention.heads', found %s", nkv,
                  doc_kind_name(n->kind));
        return false;
    }
    if (nkv > ATTN_MAX_HEAD_MAP) {
        ctx_error(c, n, "'heads' maps at most %d kv heads; the model has %d", ATTN_MAX_HEAD_MAP, nkv);
        return false;
    }
    if (n->n != nkv) {
        ctx_error(c, n, "'heads' lists %d anchor kv head%s; the model has %d kv heads (one for each)", n->n,
                  n->n == 1 ? "" : "s", nkv);
        return false;
    }
    bool ok = true, identity = true;
    for (int h = 0; h < n->n; h++) {
        int64_t v = 0;
        ok &= node_int(c, n->items[h], "compile.attention.heads", 0, nkv - 1, &v);
        out->heads[h] = (uint8_t)v;
        identity &= v == h;
    }
    out->head_map = ok && !identity;
    if (!out->head_map)
        memset(out->heads, 0, sizeof out->heads);
    return ok;
}

/* A kascade entry's `fraction: F` (0 < F <= 1): its anchors pick
 * max(budget, ceil(F rows)) rows (Kascade's max(128, 10% of n)). */
static bool desc_fraction(Ctx *c, const DocNode *n, int kind, AttnSpec *out)
{
    double f;
    if (kind != ATTN_KASCADE) {
        ctx_error(c, n, "'fraction' does not apply to attention '%s' (a kascade anchor's top-k grows with it)",
                  attn_kinds[kind]);
        return false;
    }
    if (!node_double(c, n, "compile.attention.fraction", &f))
        return false;
    if (!(f > 0.0 && f <= 1.0)) {
        ctx_error(c, n, "kascade's fraction must be above 0 and at most 1 (an anchor picks the larger of its "
                  "budget and this share of the rows), found %g", f);
        return false;
    }
    out->fraction = f;
    return true;
}

/* attention: [{layers: RANGE, kind: dense|sink_window|quest|kascade|
 * kascade_reuse, sinks, window, page, budget, anchor, fraction, heads},
 * ...]; layers not covered stay dense. A kascade_reuse layer's anchor is a
 * kascade layer before it. */
static void desc_attention(Ctx *c, const DocNode *l)
{
    if (l->kind != DOC_SEQ) {
        ctx_error(c, l, "expected a list for 'compile.attention', found %s", doc_kind_name(l->kind));
        return;
    }
    const DocNode **owner = ARENA_ARRAY(c->a, const DocNode *, MODEL_MAX_LAYERS);
    const DocNode **at = ARENA_ARRAY(c->a, const DocNode *, MODEL_MAX_LAYERS);
    for (int i = 0; i < l->n; i++) {
        int v[7] = {0};
        int k = entry_read(c, l->items[i], "attention", attn_keys, "kind", attn_kinds, attn_params, 5,
                           attn_kind_params, owner, v);
        AttnSpec spec;
        memset(&spec, 0, sizeof spec); /* padding too: layers compare by memcmp */
        spec.kind = (AttnKind)k, spec.sinks = v[0], spec.window = v[1], spec.page = v[2], spec.budget = v[3];
        spec.anchor = v[4];
        const DocNode *hn = k >= 0 ? doc_get(l->items[i], "heads") : NULL;
        const DocNode *fn = k >= 0 ? doc_get(l->items[i], "fraction") : NULL;
        bool ok = !hn || desc_head_map(c, hn, k, &spec);
        ok &= !fn || desc_fraction(c, fn, k, &spec); /* both reported */
        if (!ok)
            k = -1;
        for (int x = v[5]; k >= 0 && x <= v[6]; x++) {
            c->m->attn[x] = spec;
            at[x] = c->attn_at[x] = l->items[i];
        }
    }
    int nl = c->m->n_layers < MODEL_MAX_LAYERS ? c->m->n_layers : MODEL_MAX_LAYERS;
    for (int x = 0; x < nl; x++) {
        const AttnSpec *a = &c->m->attn[x];
        if (a->kind != ATTN_KASCADE_REUSE || !at[x])
            continue;
        const DocNode *an = doc_get(at[x], "anchor");
        if (a->anchor >= x)
            ctx_error(c, an, "layer %d reuses the rows of layer %d, which is not before it (a kascade_reuse "
                      "layer's anchor is an earlier kascade layer)", x, a->anchor);
        else if (c->m->attn[a->anchor].kind != ATTN_KASCADE)
            ctx_error(c, an, "layer %d reuses the rows of layer %d, whose attention is %s, not kascade (the anchor "
                      "picks the rows)", x, a->anchor, attn_kinds[c->m->attn[a->anchor].kind]);
        else
            continue;
        while (x + 1 < nl && at[x + 1] == at[x]) /* one error per entry */
            x++;
    }
}

/* PyramidKV's budgets (arXiv 2406.02069; the research notes'
 * techniques.md, section 3) for the n layers of one SnapKV entry whose
 * average budget is `budget`, `window` of it the observation window that
 * every layer keeps: the rest, r = budget - window, becomes a pyramid from
 * 2 r - r / beta at the entry's first layer down to r / beta at its last,
 * in equal steps, each rounded to the nearest (so the mean stays the
 * budget, within the rounding); beta 1 keeps every layer at the budget.
 * Layer i of the entry's range gets out[i] (a budget past INT_MAX, which
 * holds any context, is cut to it). Returns false where the last layer
 * would keep nothing beyond its window; *low is its budget either way. */
static bool pyramid_budgets(int budget, int beta, int window, int n, int *out, int *low)
{
    double r = (double)budget - window, lo = r / beta, hi = 2.0 * r - lo, step = n > 1 ? (hi - lo) / (n - 1) : 0.0;
    *low = n > 1 ? window + (int)lround(lo) : budget;
    if (*low <= window)
        return false;
    for (int i = 0; i < n; i++) {
        double b = n > 1 ? window + (double)lround(hi - i * step) : budget;
        out[i] = b < INT_MAX ? (int)b : INT_MAX;
    }
    return true;
}

/* kv_policy: [{layers: RANGE, policy: full|streaming|h2o|tova|snapkv,
 * budget, sinks, window, pyramid, adaptive}, ...]; layers not covered keep
 * the full cache. adaptive: ALPHA (snapkv only, 0 <= ALPHA <= 1) pools
 * each layer's budget over its kv heads (Ada-KV), every head sure of
 * ALPHA (budget - window) rows of its own; 1 is flat SnapKV. */
static void desc_kv_policy(Ctx *c, const DocNode *l)
{
    if (l->kind != DOC_SEQ) {
        ctx_error(c, l, "expected a list for 'compile.kv_policy', found %s", doc_kind_name(l->kind));
        return;
    }
    const DocNode **owner = ARENA_ARRAY(c->a, const DocNode *, MODEL_MAX_LAYERS);
    int *budgets = ARENA_ARRAY(c->a, int, MODEL_MAX_LAYERS);
    for (int i = 0; i < l->n; i++) {
        int v[6] = {0};
        int k = entry_read(c, l->items[i], "kv_policy", kv_keys, "policy", kv_kinds, kv_params, 4, kv_kind_params,
                           owner, v);
        const DocNode *wn = doc_get(l->items[i], "window");
        if (k == KV_H2O && !wn)
            v[2] = v[0] / 2; /* H2O's default: half heavy hitters, half recent */
        if (k == KV_SNAPKV && !wn)
            v[2] = v[0] / 2 < 32 ? v[0] / 2 : 32; /* SnapKV's observation window: 32, at most half */
        if ((k == KV_H2O || k == KV_SNAPKV) && v[2] >= v[0]) {
            ctx_error(c, wn ? wn : l->items[i], "%s's %s window (%d) must be smaller than its budget (%d)",
                      kv_kinds[k], k == KV_H2O ? "recent" : "observation", v[2], v[0]);
            k = -1;
        } else if ((k == KV_H2O || k == KV_SNAPKV) && v[2] < 1) { /* budget 1: a derived window of 0 */
            ctx_error(c, wn ? wn : l->items[i], "%s's %s window (%d) must be at least 1 (its budget: at least 2)",
                      kv_kinds[k], k == KV_H2O ? "recent" : "observation", v[2]);
            k = -1;
        }
        const DocNode *an = doc_get(l->items[i], "adaptive");
        double alpha = 1.0;
        if (an && k >= 0 && k != KV_SNAPKV) {
            ctx_error(c, an, "'adaptive' does not apply to kv_policy '%s' (only snapkv pools its budget)",
                      kv_kinds[k]);
            k = -1;
        } else if (an && !node_double(c, an, "compile.kv_policy.adaptive", &alpha)) {
            k = -1;
        } else if (an && (alpha < 0.0 || alpha > 1.0)) {
            ctx_error(c, an, "snapkv's adaptive safeguard must be between 0 and 1 (the share of its budget past "
                      "the window each kv head keeps for sure; 1 is flat SnapKV), found %g", alpha);
            k = -1;
        }
        const DocNode *pn = doc_get(l->items[i], "pyramid");
        int low;
        if (k == KV_SNAPKV && pn && !pyramid_budgets(v[0], v[3], v[2], v[5] - v[4] + 1, budgets, &low)) {
            ctx_error(c, pn, "snapkv's pyramid %d over layers %d-%d would give layer %d a budget of %d, which does "
                      "not exceed its observation window (%d): raise the budget (%d) or lower the pyramid",
                      v[3], v[4], v[5], v[5], low, v[2], v[0]);
            k = -1;
        }
        for (int x = v[4]; k >= 0 && x <= v[5]; x++) {
            KvPolicy *kp = &c->m->kv[x]; /* member by member: the padding stays desc_load's zeros (memcmp) */
            kp->kind = (KvPolicyKind)k, kp->budget = k == KV_SNAPKV && pn ? budgets[x - v[4]] : v[0];
            kp->sinks = v[1], kp->window = v[2], kp->adaptive = an && alpha < 1.0;
            kp->alpha = kp->adaptive ? alpha : 0.0;
            c->kv_at[x] = l->items[i];
        }
    }
}

/* targets: TARGET | [TARGET, ...], TARGET in cpu|sm_80|sm_90|sm_120|host-cuda */
static void desc_targets(Ctx *c, const DocNode *t)
{
    int n = t->kind == DOC_SEQ ? t->n : 1, nt = 0;
    for (int i = 0; i < n; i++) {
        const DocNode *x = t->kind == DOC_SEQ ? t->items[i] : t;
        int k = node_enum(c, x, "compile.targets", target_names);
        if (k < 0)
            continue;
        bool dup = false;
        for (int j = 0; j < nt; j++)
            dup |= c->m->targets[j] == target_names[k];
        if (dup)
            ctx_error(c, x, "target '%s' is listed twice", target_names[k]);
        else
            c->m->targets[nt++] = target_names[k];
    }
}

/* compile: {act_dtype, kv_dtype, quant, attention, kv_policy, targets, workers, max_seq, attn_combine} */
static void desc_compile(Ctx *c, const DocNode *k)
{
    ModelDesc *m = c->m;
    if (!map_check(c, k, "compile", compile_keys))
        return;
    const DocNode *n = doc_get(k, "act_dtype");
    int dt = n ? node_enum(c, n, "compile.act_dtype", act_dtypes) : 0;
    if (dt > 0)
        ctx_error(c, n, "activation dtype '%s' is not supported yet (only f32)", act_dtypes[dt]);
    if ((n = doc_get(k, "kv_dtype")) && (dt = node_enum(c, n, "compile.kv_dtype", kv_dtypes)) >= 0)
        m->kv_dtype = kv_dtype_of[dt];
    if ((n = doc_get(k, "quant")))
        desc_quant(c, n);
    if ((n = doc_get(k, "attention")))
        desc_attention(c, n);
    if ((n = doc_get(k, "kv_policy")))
        desc_kv_policy(c, n);
    for (int l = 0; l < m->n_layers && l < MODEL_MAX_LAYERS; l++)
        if (m->kv[l].kind != KV_FULL && m->attn[l].kind != ATTN_DENSE && c->kv_at[l])
            ctx_error(c, c->kv_at[l], "layer %d: KV policy '%s' needs dense attention, but the layer's attention is "
                      "'%s' (an evicting cache is attended whole)", l, kv_kinds[m->kv[l].kind],
                      attn_kinds[m->attn[l].kind]);
    if ((n = doc_get(k, "targets")))
        desc_targets(c, n);
    if ((n = doc_get(k, "workers"))) {
        int64_t w;
        if (node_int(c, n, "compile.workers", 1, MODEL_MAX_WORKERS, &w))
            m->workers = (int)w;
    }
    if ((n = doc_get(k, "attn_combine")) && (dt = node_enum(c, n, "compile.attn_combine", attn_combines)) >= 0)
        m->attn_combine = (AttnCombine)dt;
    if ((n = doc_get(k, "max_seq")) && node_int32(c, n, "compile.max_seq", 1, &m->max_seq)) {
        c->at[F_MAX_SEQ] = n;
        if (c->max_pos && m->max_seq > c->max_pos)
            ctx_error(c, n, "'compile.max_seq' (%d) exceeds the model's maximum context (%d)", m->max_seq,
                      c->max_pos);
    }
}

/* ---- checks ---- */

typedef struct {
    const ModelDesc *m;
    Ctx *c;                 /* NULL: report against the file as a whole */
    Diag *d;
    bool ok;
} Checker;

static void MEGAC_PRINTF(3, 4) check_fail(Checker *k, int f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (k->c) {
        Ctx *c = k->c;
        const DocNode *n = f >= 0 && c->at[f] ? c->at[f] : c->doc->root;
        ctx_vreport(c, "error", n, fmt, ap);
        if (f >= 0 && c->at_key[f] && c->self && ctx_doc_of(c, n) == c->doc)   /* not since overridden */
            ctx_note(c, n, "%s is the file's '%s'", field_names[f], c->at_key[f]);
    } else {
        SrcFile src = {.path = k->m->path ? k->m->path : "megac"};
        diag_vreport(k->d, "error", &src, 0, 0, fmt, ap);
    }
    va_end(ap);
    k->ok = false;
}

static void check_range(Checker *k, int f, const char *name, int v, int lo, int hi)
{
    if (v < lo || v > hi)
        check_fail(k, f, "%s must be between %d and %d, found %d", name, lo, hi, v);
}

static void check_dims(Checker *k)
{
    const ModelDesc *m = k->m;
    check_range(k, F_DIM, "dim", m->dim, 1, DESC_MAX_DIM);
    check_range(k, F_HIDDEN, "hidden_dim", m->hidden_dim, 1, DESC_MAX_DIM);
    check_range(k, F_LAYERS, "n_layers", m->n_layers, 1, MODEL_MAX_LAYERS);
    check_range(k, F_VOCAB, "vocab_size", m->vocab_size, 1, DESC_MAX_VOCAB);
    check_range(k, F_MAX_SEQ, "max_seq", m->max_seq, 1, DESC_MAX_SEQ);
    check_range(k, F_HEADS, "n_heads", m->n_heads, 1, 4096);
    if (m->n_heads < 1)
        return;
    if (m->n_kv_heads < 1 || m->n_heads % m->n_kv_heads)
        check_fail(k, F_KV_HEADS, "n_kv_heads (%d) must divide n_heads (%d)", m->n_kv_heads, m->n_heads);
    if (m->head_dim <= 0 && m->dim % m->n_heads)
        check_fail(k, F_HEADS, "n_heads (%d) does not divide dim (%d); give head_dim", m->n_heads, m->dim);
    else if (m->head_dim <= 0 || m->head_dim % 2 || (int64_t)m->head_dim * m->n_heads > DESC_MAX_DIM)
        check_fail(k, k->c && !k->c->at[F_HEAD_DIM] ? F_DIM : F_HEAD_DIM, /* derived: dim / n_heads */
                   "head_dim (%d) must be even, positive, and head_dim * n_heads at most %d",
                   m->head_dim, DESC_MAX_DIM);
}

static void check_rope(Checker *k)
{
    const ModelDesc *m = k->m;
    if (!(m->norm_eps > 0 && m->norm_eps < 1))
        check_fail(k, F_EPS, "norm_eps must be in (0, 1), found %g", m->norm_eps);
    if (!(m->rope_theta > 1))
        check_fail(k, F_THETA, "rope theta must be greater than 1, found %g", m->rope_theta);
    if (m->rope_scaling == ROPE_SCALING_FACTORS) {
        bool ok = m->head_dim / 2 <= MODEL_MAX_ROPE_PAIRS;
        for (int i = 0; ok && i < m->head_dim / 2; i++)
            ok = isfinite(m->rope_freq_factors[i]) && m->rope_freq_factors[i] > 0;
        if (!ok)
            check_fail(k, F_SCALING, "RoPE frequency factors need head_dim / 2 (at most %d) positive numbers",
                       MODEL_MAX_ROPE_PAIRS);
    }
    if (m->rope_scaling != ROPE_SCALING_LLAMA3)
        return;
    if (!(m->rope_factor >= 1) || !(m->rope_low_freq_factor > 0) ||
        !(m->rope_high_freq_factor > m->rope_low_freq_factor) || m->rope_orig_max_pos < 1)
        check_fail(k, F_SCALING, "llama3 RoPE scaling needs factor >= 1 and 0 < low_freq_factor <"
                   " high_freq_factor, found factor %g, low %g, high %g", m->rope_factor,
                   m->rope_low_freq_factor, m->rope_high_freq_factor);
}

static void check_io(Checker *k)
{
    const ModelDesc *m = k->m;
    if (m->weights_format != WFMT_SYNTHETIC && !m->weights_path)
        check_fail(k, F_WEIGHTS, "weights of format %s need a path", weights_formats[m->weights_format]);
    if ((m->tok_format == TOKFMT_LLAMA2C || m->tok_format == TOKFMT_HF || m->tok_format == TOKFMT_GGUF) &&
        !m->tok_path)
        check_fail(k, F_TOKENIZER, "a %s tokenizer needs a path", tok_formats[m->tok_format]);
    if (m->tok_format == TOKFMT_BYTES && m->vocab_size < 259)
        check_fail(k, F_TOKENIZER, "the bytes tokenizer needs vocab_size >= 259, found %d", m->vocab_size);
    if (m->bos_id >= m->vocab_size)
        check_fail(k, F_BOS, "bos id %d is outside the vocabulary (%d)", m->bos_id, m->vocab_size);
    if (m->eos_id >= m->vocab_size)
        check_fail(k, F_EOS, "eos id %d is outside the vocabulary (%d)", m->eos_id, m->vocab_size);
    for (int i = 0; i < m->n_stop && i < MODEL_MAX_STOPS; i++)
        if (m->stop_ids[i] < 0 || m->stop_ids[i] >= m->vocab_size)
            check_fail(k, F_STOP, "eos id %d is outside the vocabulary (%d)", m->stop_ids[i], m->vocab_size);
    if (m->workers < 0 || m->workers > MODEL_MAX_WORKERS)
        check_fail(k, F_WORKERS, "workers must be between 0 and %d, found %d", MODEL_MAX_WORKERS, m->workers);
}

/* Whether layer l attends as a sliding window of w positions does: over
 * the mask (sink_window with no sinks) or over a cache that keeps only
 * those rows (streaming with no sinks, attended whole). */
static bool layer_is_window(const ModelDesc *m, int l, int w)
{
    const AttnSpec *a = &m->attn[l];
    const KvPolicy *kv = &m->kv[l];
    return (a->kind == ATTN_SINK_WINDOW && a->sinks == 0 && a->window == w && kv->kind == KV_FULL) ||
           (a->kind == ATTN_DENSE && kv->kind == KV_STREAMING && kv->sinks == 0 && kv->window == w);
}

/* Knobs the backends do not implement yet (parsing reports these at the
 * node, so only hand-built descriptions reach this). */
static void check_knobs(Checker *k)
{
    const ModelDesc *m = k->m;
    if (m->act_dtype != DT_F32)
        check_fail(k, -1, "activation dtype %s is not supported yet", dtype_name(m->act_dtype));
    if (m->kv_dtype != DT_F32 && m->kv_dtype != DT_F16 && m->kv_dtype != DT_BF16)
        check_fail(k, -1, "KV cache dtype %s is not supported (f32, f16 or bf16)", dtype_name(m->kv_dtype));
    if (m->sliding_window < 0)
        check_fail(k, -1, "sliding_window must be 0 (none) or more, found %d", m->sliding_window);
    for (int l = 0; l < m->n_layers && l < MODEL_MAX_LAYERS; l++) {
        if (m->kv[l].kind != KV_FULL && m->attn[l].kind != ATTN_DENSE)
            check_fail(k, -1, "layer %d: KV policy %s needs dense attention, not %s", l, kv_kinds[m->kv[l].kind],
                       attn_kinds[m->attn[l].kind]);
        if (m->sliding_window > 0 && m->sliding_window < m->max_seq && !layer_is_window(m, l, m->sliding_window))
            check_fail(k, -1, "layer %d: the model's sliding window of %d positions needs sink_window {sinks: 0, "
                       "window: %d} attention (or a streaming cache of those numbers)", l, m->sliding_window,
                       m->sliding_window);
        const AttnSpec *a = &m->attn[l];
        if (a->kind == ATTN_KASCADE_REUSE && (a->anchor < 0 || a->anchor >= l ||
                                              m->attn[a->anchor].kind != ATTN_KASCADE))
            check_fail(k, -1, "layer %d: kascade_reuse's anchor (%d) must be an earlier kascade layer", l, a->anchor);
        if (a->kind == ATTN_KASCADE ? !(a->fraction >= 0.0 && a->fraction <= 1.0) : a->fraction != 0.0)
            check_fail(k, -1, "layer %d: a fraction is for kascade layers, between 0 and 1 (found %g)", l,
                       a->fraction);
        if (a->head_map && (a->kind != ATTN_KASCADE_REUSE || m->n_kv_heads > ATTN_MAX_HEAD_MAP))
            check_fail(k, -1, "layer %d: a kv head map is for kascade_reuse layers of at most %d kv heads", l,
                       ATTN_MAX_HEAD_MAP);
        for (int h = 0; a->head_map && h < m->n_kv_heads && h < ATTN_MAX_HEAD_MAP; h++)
            if (a->heads[h] >= m->n_kv_heads)
                check_fail(k, -1, "layer %d: kv head %d reads the anchor's kv head %d; the model has %d", l, h,
                           a->heads[h], m->n_kv_heads);
    }
}

static bool check_run(const ModelDesc *m, Ctx *c, Diag *d)
{
    Checker k = {m, c, d, true};
    check_dims(&k);
    check_rope(&k);
    check_io(&k);
    if (!c)
        check_knobs(&k);
    return k.ok;
}

bool desc_check(const ModelDesc *m, Diag *d)
{
    return check_run(m, NULL, d);
}

/* ---- the walk ---- */

static void desc_defaults(ModelDesc *m)
{
    memset(m, 0, sizeof *m);
    m->norm_eps = 1e-5;
    m->rope_theta = 10000;
    m->bos_id = m->eos_id = -1;
    m->act_dtype = DT_F32;
    m->kv_dtype = DT_F16;   /* as llama.cpp's default; README, What works */
}

static const char *dir_of(Arena *a, const char *path)
{
    const char *s = strrchr(path, '/');
    if (!s || strcmp(path, DESC_EMBEDDED_PATH) == 0)
        return ".";
    return s == path ? "/" : arena_strndup(a, path, (size_t)(s - path));
}

/* name: NAME, letters, digits, '.', '_' and '-' (it names the bundle), at
 * most 128 of them. */
static void desc_name(Ctx *c, const DocNode *root)
{
    const DocNode *n = doc_get(root, "name");
    const char *s = n ? node_str(c, n, "name") : NULL;
    if (!n)
        missing_key(c, root, "", "name");
    if (!s)
        return;
    if (strlen(s) > 128) {
        ctx_error(c, n, "name is %zu characters long; at most 128 are allowed", strlen(s));
        return;
    }
    if (!*s || strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != strlen(s)) {
        ctx_error(c, n, "name '%s' must be made of letters, digits, '.', '_' and '-'", ctx_quote(c, s));
        return;
    }
    c->m->name = arena_strdup(c->a, s);
}

/* A model with a sliding window below its context (Mistral 7B v0.1's 4096
 * at a longer max_seq; at most max_seq it changes nothing): each layer
 * the description leaves alone attends sink_window {sinks: 0, window: W}
 * (the same positions: the last W, the current one included); a layer it
 * sets must say the same, by the mask or by a streaming cache. */
static void desc_sliding_window(Ctx *c)
{
    ModelDesc *m = c->m;
    int w = m->sliding_window, nl = m->n_layers < MODEL_MAX_LAYERS ? m->n_layers : MODEL_MAX_LAYERS;
    if (w <= 0 || w >= m->max_seq)
        return;
    for (int l = 0; l < nl; l++) {
        if (!c->attn_at[l] && !c->kv_at[l]) {
            memset(&m->attn[l], 0, sizeof m->attn[l]);
            m->attn[l].kind = ATTN_SINK_WINDOW, m->attn[l].window = w;
            continue;
        }
        if (layer_is_window(m, l, w))
            continue;
        const DocNode *at = c->attn_at[l] ? c->attn_at[l] : c->kv_at[l];
        ctx_error(c, at, "layer %d: this model attends a sliding window of %d positions, which its max_seq (%d) "
                  "passes: the layer's attention must be {kind: sink_window, sinks: 0, window: %d} (the default), "
                  "or dense over a cache of {policy: streaming, sinks: 0, window: %d}", l, w, m->max_seq, w, w);
        if (c->swa_at)
            ctx_note(c, c->swa_at, "the sliding window is set here");
        while (l + 1 < nl && (c->attn_at[l + 1] ? c->attn_at[l + 1] : c->kv_at[l + 1]) == at)
            l++;    /* one error per entry */
    }
}

static void desc_walk(Ctx *c, Doc cfg[2])
{
    ModelDesc *m = c->m;
    const DocNode *r = c->doc->root, *n;
    if (!map_check(c, r, "", top_keys))
        return;
    desc_name(c, r);
    if ((n = doc_get(r, "weights")))
        desc_weights(c, n);
    else
        missing_key(c, r, "", "weights");
    if ((n = doc_get(r, "arch")))
        desc_arch(c, cfg, n);
    else
        missing_key(c, r, "", "arch");
    field_double(c, r, "", "norm_eps", &m->norm_eps, F_EPS);
    field_bool(c, r, "", "tie_embeddings", &m->tie_embeddings);
    field_bool(c, r, "", "qkv_bias", &m->qkv_bias);
    if (c->arch_pairing >= 0 && m->weights_format != WFMT_SAFETENSORS)
        m->rope_pairing = (RopePairing)c->arch_pairing;     /* the GGUF's own */
    else
        m->rope_pairing = m->weights_format == WFMT_SAFETENSORS ||
                          (m->weights_format == WFMT_SYNTHETIC && c->from_config) ? ROPE_HALF : ROPE_ADJACENT;
    if ((n = doc_get(r, "rope")))
        desc_rope(c, n);
    if ((n = doc_get(r, "tokenizer")))
        desc_tokenizer(c, n);
    field_int(c, r, "", "bos", 0, &m->bos_id, F_BOS);
    eos_read(c, doc_get(r, "eos"), "eos");
    if ((n = doc_get(r, "compile")))
        desc_compile(c, n);
    desc_sliding_window(c);
}

/* Keeps where the fields a weight file is compared with were set: the
 * nodes go with their Docs, a note after a mismatch needs the place. */
static void desc_src_record(Ctx *c)
{
    for (int f = 0; f < DSRC_COUNT; f++) {
        const DocNode *n = c->at[f];
        const Doc *doc = n ? ctx_doc_of(c, n) : NULL;
        if (n && !(c->self && doc == c->doc) && n->line > 0)
            c->m->src_at[f] = (DescSrc){arena_strdup(c->a, doc->src.path), n->line, n->col};
    }
}

void desc_note_set(Diag *d, const ModelDesc *m, DescSrcField f)
{
    if (f < 0 || f >= DSRC_COUNT || !m->src_at[f].path)
        return;
    const DescSrc *s = &m->src_at[f];
    SrcFile src = {.path = s->path};
    diag_note(d, &src, s->line, s->col, "%s is set here", field_names[f]);
}

/* desc_parse, where `self` (or NULL) names the GGUF file or HF folder the
 * text was written for. */
static bool desc_parse_for(ModelDesc *m, Arena *a, const char *path, const char *self, const char *text, size_t len,
                           const DescOverride *ov, int nov, Diag *d)
{
    int errors0 = d->nerrors;
    desc_defaults(m);
    m->path = arena_strdup(a, path);
    m->dir = dir_of(a, path);
    Doc doc, cfg[2];            /* config.json, generation_config.json */
    memset(cfg, 0, sizeof cfg);
    Doc *ods = xcalloc((size_t)nov + 1, sizeof *ods);
    Ctx c = {.m = m, .a = a, .d = d, .doc = &doc, .arch_pairing = -1, .self = self ? arena_strdup(a, self) : NULL};
    bool parsed = doc_parse(&doc, path, xstrndup(text, len), len, d);
    if (parsed && !doc.root)
        diag_error(d, &doc.src, 0, 0, "empty model description");
    for (int i = 0; parsed && doc.root && doc.root->kind == DOC_MAP && i < nov; i++)   /* else desc_walk says */
        override_apply(&c, &ods[i], &ov[i]);
    if (parsed && doc.root)
        desc_walk(&c, cfg);     /* a failed override left the tree intact */
    if (d->nerrors == errors0)
        check_run(m, &c, d);
    if (d->nerrors == errors0)
        desc_src_record(&c);
    for (int i = 0; i < nov; i++)
        doc_free(&ods[i]);
    free(ods);
    free(c.orig);
    doc_free(&cfg[0]);
    doc_free(&cfg[1]);
    doc_free(&doc);
    return d->nerrors == errors0;
}

bool desc_parse(ModelDesc *m, Arena *a, const char *path, const char *text, size_t len, const DescOverride *ov,
                int nov, Diag *d)
{
    return desc_parse_for(m, a, path, NULL, text, len, ov, nov, d);
}

/* ---- descriptions megac writes for a checkpoint ---- */

/* A bundle name from a file or folder name: its characters outside
 * [A-Za-z0-9._-] become '-', at most 128 of them. */
static void name_from(FILE *b, const char *base, size_t n)
{
    static const char ok[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
    if (n > 128)
        n = 128;
    if (strspn(base, ".") >= n) {   /* "", ".", ".." */
        fputs("model", b);
        return;
    }
    for (size_t i = 0; i < n; i++)
        fputc(base[i] && strchr(ok, base[i]) ? base[i] : '-', b);
}

static bool name_ends(const char *path, const char *suffix)
{
    size_t n = strlen(path), k = strlen(suffix);
    return n > k && strcasecmp(path + n - k, suffix) == 0;
}

/* A GGUF file by its magic, or by its name: a file named *.gguf is read
 * as one, so a damaged one is reported by the GGUF reader, not parsed as
 * a YAML description. */
static bool file_is_gguf(const char *path, const struct stat *st)
{
    char magic[4];
    FILE *f = S_ISREG(st->st_mode) ? fopen(path, "rb") : NULL;  /* a pipe's bytes are read once, as the text */
    bool yes = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
    if (f)
        fclose(f);
    return yes || name_ends(path, ".gguf");
}

/* A llama2.c checkpoint (the version 0 .bin), by its header, or by its
 * name (*.bin): a damaged one is then reported by arch_from_checkpoint
 * and the loader, not parsed as a YAML description. *vocab: the header's
 * vocabulary size (0 when it has none). */
static bool file_is_llama2c(const char *path, const struct stat *st, int *vocab)
{
    int32_t h[7];
    FILE *f = S_ISREG(st->st_mode) ? fopen(path, "rb") : NULL;
    bool sane = f && fread(h, sizeof h[0], 7, f) == 7 && llama2c_header_sane(h);
    if (f)
        fclose(f);
    *vocab = sane ? abs(h[5]) : 0;
    return sane || name_ends(path, ".bin");
}

/* An HF checkpoint's config.json given as a file: a JSON object (a file
 * named *.json, at most 1 MiB) with a model_type or architectures key. A
 * YAML description holds neither: it would be refused for them. */
static bool file_is_hf_config(const char *path, const struct stat *st)
{
    if (!S_ISREG(st->st_mode) || st->st_size > (1 << 20) || !name_ends(path, ".json"))
        return false;
    size_t len;
    char *text = read_file(path, &len);
    const char *t = text ? text + strspn(text, " \t\r\n") : NULL;
    bool yes = t && *t == '{' && strlen(text) == len && (strstr(t, "\"model_type\"") || strstr(t, "\"architectures\""));
    free(text);
    return yes;
}

/* A safetensors file (or a sharded checkpoint's index), by its name or by
 * its start: an 8-byte little-endian header length, then the JSON header's
 * '{'. It holds weights, not a model: desc_load says what to give instead
 * rather than parse its bytes as YAML. */
static bool file_is_safetensors(const char *path, const struct stat *st)
{
    if (name_ends(path, ".safetensors") || name_ends(path, ".safetensors.index.json"))
        return true;
    unsigned char h[9];
    FILE *f = S_ISREG(st->st_mode) ? fopen(path, "rb") : NULL;
    bool yes = f && fread(h, 1, 9, f) == 9 && h[8] == '{';
    if (f)
        fclose(f);
    uint64_t len = 0;
    for (int i = 7; yes && i >= 0; i--)
        len = len << 8 | h[i];
    return yes && len >= 2 && len <= (uint64_t)st->st_size - 8;
}

/* The text desc_source gives for a safetensors file (desc_read_text's
 * cache key), which desc_load refuses before reading it. */
static const char desc_safetensors_text[] = "# a safetensors file: weights, not a model description\n";

/* The description of an HF checkpoint in folder `dir`, for `what`: named
 * stem[0, n) (n 0: after the folder), its arch from config `cfg` (a path
 * from the folder, or desc_self_path), the folder's safetensors, and its
 * tokenizer.json when there is one. */
static void hf_desc_write(FILE *b, const char *what, const char *dir, const char *stem, size_t n, const char *cfg)
{
    char *tj = xasprintf("%s/tokenizer.json", dir), *real = n ? NULL : realpath(dir, NULL);
    struct stat lst;    /* there in any form: a folder, FIFO or loop is then reported at its name */
    bool tok = lstat(tj, &lst) == 0;
    if (!n) {           /* the folder's name: its real one, else the last part of dir */
        const char *name = real ? real : dir, *last = strrchr(name, '/');
        stem = last && last[1] ? last + 1 : name;
        n = strlen(stem);
    }
    fprintf(b, "# the description megac writes for %s\nname: ", what);
    name_from(b, stem, n);
    fprintf(b, "\narch: {from-config: \"%s\"}\nweights: {format: safetensors, path: .}\n", cfg);
    fputs(tok ? "tokenizer: {format: hf, path: tokenizer.json}\n" : "tokenizer: {format: none}\n", b);
    free(real);
    free(tj);
}

/* The text desc_load parses for `path` and the path it is parsed as (its
 * folder resolves relative paths), in *as (malloc'd):
 *  - a GGUF file: arch from its metadata, its weights and vocabulary;
 *  - a folder holding config.json (an HF checkpoint): arch from the
 *    config, the folder's safetensors, its tokenizer.json when there is one;
 *  - such a config.json given as a file (file_is_hf_config): the same, in
 *    its folder;
 *  - a llama2.c checkpoint: arch from its header, its weights, and the
 *    llama2.c tokenizer beside it (tok<vocab>.bin, else tokenizer.bin, as
 *    run.c's -z and default name it) when there is one;
 *  - a safetensors file: a placeholder (desc_load refuses it);
 *  - anything else: the file's own bytes, a YAML description.
 * *written tells which of the first three megac wrote the text for.
 * NULL with errno set when it cannot be read. */
static char *desc_source(const char *path, size_t *len, char **as, bool *written)
{
    *written = false;
    struct stat st;
    if (stat(path, &st) != 0)
        return NULL;
    if (!S_ISDIR(st.st_mode) && file_is_safetensors(path, &st)) {
        *as = xstrdup(path);    /* desc_load refuses it; a cache key needs no gigabytes of weights */
        *len = strlen(desc_safetensors_text);
        return xstrdup(desc_safetensors_text);
    }
    const char *slash = strrchr(path, '/');
    char *text = NULL;
    int vocab;
    FILE *b = open_memstream(&text, len);
    if (!b)
        die("open_memstream: %s", strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/')
            n--;
        char *cfg = xasprintf("%.*s/config.json", (int)n, path);
        if (stat(cfg, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(cfg);
            fclose(b);
            free(text);
            errno = ENOENT;
            return NULL;
        }
        char *dir = xasprintf("%.*s", (int)n, path);
        hf_desc_write(b, "an HF checkpoint folder", dir, NULL, 0, "config.json");
        free(dir);
        *as = cfg;
    } else if (file_is_hf_config(path, &st)) {
        /* as its folder is read, the config being the file named: X.config.json
         * is named X, a config.json after its folder */
        const char *base = slash ? slash + 1 : path;
        size_t n = strcasecmp(base, "config.json") == 0 ? 0 : strlen(base) - strlen(".json");
        if (n > strlen(".config") && strncasecmp(base + n - strlen(".config"), ".config", strlen(".config")) == 0)
            n -= strlen(".config");
        char *dir = slash ? xasprintf("%.*s", slash == path ? 1 : (int)(slash - path), path) : xstrdup(".");
        hf_desc_write(b, "an HF config.json", dir, base, n, desc_self_path);
        free(dir);
        *as = xstrdup(path);
    } else if (file_is_gguf(path, &st)) {
        const char *base = slash ? slash + 1 : path, *dot = strrchr(base, '.');
        size_t n = dot && dot != base && strcmp(dot, ".gguf") == 0 ? (size_t)(dot - base) : strlen(base);
        fputs("# the description megac writes for a GGUF file\nname: ", b);
        name_from(b, base, n);
        fprintf(b, "\narch: {from-gguf: \"%s\"}\nweights: {format: gguf, path: \"%s\"}\ntokenizer: {format: gguf}\n",
                desc_self_path, desc_self_path);
        *as = xstrdup(path);
    } else if (file_is_llama2c(path, &st, &vocab)) {
        const char *base = slash ? slash + 1 : path, *dot = strrchr(base, '.');
        size_t n = dot && dot != base && strcasecmp(dot, ".bin") == 0 ? (size_t)(dot - base) : strlen(base);
        fputs("# the description megac writes for a llama2.c checkpoint\nname: ", b);
        name_from(b, base, n);
        fprintf(b, "\narch: {from-checkpoint: \"%s\"}\nrope: {theta: 10000, pairing: adjacent}\n"
                   "weights: {format: llama2c, path: \"%s\"}\n",
                desc_self_path, desc_self_path);
        char *tok = NULL;
        for (int i = 0; i < 2 && !tok; i++) {
            char *t = i == 0 ? xasprintf("%.*stok%d.bin", (int)(base - path), path, vocab)
                             : xasprintf("%.*stokenizer.bin", (int)(base - path), path);
            if ((i == 0 && !vocab) || stat(t, &st) != 0 || !S_ISREG(st.st_mode))
                free(t);
            else
                tok = t;
        }
        if (tok)
            fprintf(b, "tokenizer: {format: llama2c, path: \"%s\"}\n", tok + (base - path));
        else
            fputs("tokenizer: {format: none}\n", b);
        free(tok);
        *as = xstrdup(path);
    } else {
        fclose(b);
        free(text);
        text = read_file(path, len);
        if (text)
            *as = xstrdup(path);
        return text;
    }
    fclose(b);
    *written = true;
    return text;
}

char *desc_read_text(const char *path, size_t *len)
{
    bool written;
    char *as = NULL, *text = desc_source(path, len, &as, &written);
    free(as);
    return text;
}

/* The model files a folder without config.json holds (GGUF files, by
 * name), for the message that refuses it: "; it holds X: give that" or
 * "; it holds N GGUF files: give one, such as X", else "". xmalloc'd. */
static char *dir_models_hint(const char *dir)
{
    DIR *d = opendir(dir);
    char *first = NULL;
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (name_ends(e->d_name, ".gguf") && ++n && (!first || strcmp(e->d_name, first) < 0)) {
            free(first);    /* the first by name, whatever order the folder lists them in */
            first = xstrdup(e->d_name);
        }
    if (d)
        closedir(d);
    size_t len = strlen(dir);
    const char *sep = len && dir[len - 1] == '/' ? "" : "/";
    char *hint = n == 0   ? xstrdup("")
                 : n == 1 ? xasprintf("; it holds a GGUF file: give '%s%s%s'", dir, sep, first)
                          : xasprintf("; it holds %d GGUF files: give one, such as '%s%s%s'", n, dir, sep, first);
    free(first);
    return hint;
}

/* A safetensors file named as the model: what to give instead. */
static void desc_safetensors_refuse(const char *path, Diag *d)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? xasprintf("%.*s", slash == path ? 1 : (int)(slash - path), path) : xstrdup(".");
    char *cfg = xasprintf("%s/config.json", dir);
    const char *what = name_ends(path, ".index.json") ? "a safetensors index names weights"
                                                      : "a safetensors file holds weights";
    struct stat st;
    if (stat(cfg, &st) == 0 && S_ISREG(st.st_mode))
        diag_file_error(d, path, "%s, not a model description: megac reads an HF checkpoint as its folder; give "
                        "'%s', which holds its config.json", what, dir);
    else
        diag_file_error(d, path, "%s, not a model description: megac reads an HF checkpoint as its folder "
                        "(config.json beside the safetensors); or write a description (.yaml) whose weights: "
                        "{format: safetensors, path: ...} names this file (models/README.md)", what);
    free(cfg);
    free(dir);
}

bool desc_load(ModelDesc *m, Arena *a, const char *path, const DescOverride *ov, int nov, Diag *d)
{
    if (!path || strcmp(path, desc_default_name) == 0)
        return desc_parse(m, a, DESC_EMBEDDED_PATH, desc_default_yaml, strlen(desc_default_yaml), ov, nov, d);
    if (!*path) {
        diag_file_error(d, d->prog ? d->prog : "megac", "the model's path is empty: " DESC_WHAT_A_MODEL_IS);
        return false;
    }
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode) && file_is_safetensors(path, &st)) {
        desc_safetensors_refuse(path, d);
        return false;
    }
    size_t len;
    bool written;
    char *as = NULL, *text = desc_source(path, &len, &as, &written);
    if (!text) {
        int e = errno;
        char *manifest = xasprintf("%s/manifest.yaml", path), *sched = xasprintf("%s/schedule.sched", path);
        struct stat lst;
        bool bundle = access(manifest, F_OK) == 0;
        int me = bundle ? 0 : errno;        /* why not, where it is there but a link that leads nowhere */
        bool part = access(sched, F_OK) == 0, dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
        if (me && lstat(manifest, &lst) != 0)
            me = 0;
        if (dir && me)
            diag_file_error(d, manifest, "cannot read: %s (a symbolic link that leads to no file: the bundle's "
                                         "manifest.yaml is not there)", strerror(me));
        else if (dir && bundle)
            diag_file_error(d, path, "this is a compiled bundle, not a model description (`megac run` runs it, "
                                     "`megac validate` checks its schedule)");
        else if (dir && part)
            diag_file_error(d, path, "this folder holds a schedule.sched but no manifest.yaml: a compiled bundle "
                                     "that lost its manifest (recompile it), or not a bundle at all: "
                                     DESC_WHAT_A_MODEL_IS);
        else if (dir) {
            char *hint = dir_models_hint(path);
            diag_file_error(d, path, "this folder holds no config.json: " DESC_WHAT_A_MODEL_IS "%s", hint);
            free(hint);
        }
        else if (e == ENODEV)
            diag_file_error(d, path, "not a regular file (a device): " DESC_WHAT_A_MODEL_IS);
        else
            diag_file_error(d, path, "cannot read model description: %s", strerror(e));
        free(manifest);
        free(sched);
        return false;
    }
    bool ok = desc_parse_for(m, a, as, written ? path : NULL, text, len, ov, nov, d);
    free(text);
    free(as);
    return ok;
}

/* ---- printing: the resolved description, as YAML desc_parse reads back ---- */

/* The shortest of %.15g and %.17g that reads back as v. */
static const char *double_str(char buf[40], double v)
{
    snprintf(buf, 40, "%.15g", v);
    if (strtod(buf, NULL) != v)
        snprintf(buf, 40, "%.17g", v);
    return buf;
}

static void print_double(FILE *out, const char *key, double v)
{
    char buf[40];
    fprintf(out, "%s: %s\n", key, double_str(buf, v));
}

/* s as a YAML double-quoted scalar that reads back as the same bytes (a
 * name that is not UTF-8 cannot: YAML text is Unicode). */
static void print_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(out, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(out, "\\x%02x", ch);
        else
            fputc(ch, out);
    }
    fputc('"', out);
}

static void print_quant(FILE *out, QuantSpec q)
{
    fputs(quant_names[q.kind], out);
    if (q.group)
        fprintf(out, "-g%d", q.group);
}

static void print_range(FILE *out, int lo, int hi, int nl)
{
    if (lo == 0 && hi == nl - 1)
        fputs("all", out);
    else if (lo == hi)
        fprintf(out, "%d", lo);
    else
        fprintf(out, "%d-%d", lo, hi);
}

static void print_params(FILE *out, const char *const *names, const int *vals, int n, unsigned allow)
{
    for (int i = 0; i < n; i++)
        if (allow >> i & 1)
            fprintf(out, ", %s: %d", names[i], vals[i]);
}

static bool kv_same(const KvPolicy *a, const KvPolicy *b)
{
    return a->kind == b->kind && a->budget == b->budget && a->sinks == b->sinks && a->window == b->window &&
           a->adaptive == b->adaptive && (!a->adaptive || a->alpha == b->alpha);
}

static void print_layers(const ModelDesc *m, FILE *out)
{
    int nl = m->n_layers < MODEL_MAX_LAYERS ? m->n_layers : MODEL_MAX_LAYERS;
    if (nl <= 0) {
        fputs("  attention: []\n  kv_policy: []\n", out);
        return;
    }
    fputs("  attention:\n", out);
    for (int lo = 0, hi; lo < nl; lo = hi + 1) {
        for (hi = lo; hi + 1 < nl && !memcmp(&m->attn[hi + 1], &m->attn[lo], sizeof m->attn[lo]); hi++) {
        }
        const AttnSpec *s = &m->attn[lo];
        fputs("    - {layers: ", out);
        print_range(out, lo, hi, nl);
        fprintf(out, ", kind: %s", attn_kinds[s->kind]);
        print_params(out, attn_params, (const int[]){s->sinks, s->window, s->page, s->budget, s->anchor}, 5,
                     attn_kind_params[s->kind].allow);
        char buf[40];
        if (s->fraction > 0.0)
            fprintf(out, ", fraction: %s", double_str(buf, s->fraction));
        for (int h = 0; s->head_map && h < m->n_kv_heads && h < ATTN_MAX_HEAD_MAP; h++)
            fprintf(out, "%s%d", h ? ", " : ", heads: [", s->heads[h]);
        fputs(s->head_map ? "]}\n" : "}\n", out);
    }
    fputs("  kv_policy:\n", out);
    for (int lo = 0, hi; lo < nl; lo = hi + 1) {
        for (hi = lo; hi + 1 < nl && kv_same(&m->kv[hi + 1], &m->kv[lo]); hi++) {
        }
        const KvPolicy *s = &m->kv[lo];
        fputs("    - {layers: ", out);
        print_range(out, lo, hi, nl);
        fprintf(out, ", policy: %s", kv_kinds[s->kind]);
        print_params(out, kv_params, (const int[]){s->budget, s->sinks, s->window}, 3, kv_kind_params[s->kind].allow);
        char buf[40];
        if (s->adaptive)
            fprintf(out, ", adaptive: %s", double_str(buf, s->alpha));
        fputs("}\n", out);
    }
}

static void print_compile(const ModelDesc *m, FILE *out)
{
    fprintf(out, "compile:\n  act_dtype: %s\n  kv_dtype: %s\n  quant: {", dtype_name(m->act_dtype),
            dtype_name(m->kv_dtype));
    for (int i = 0; i < TCLASS_COUNT; i++) {
        fprintf(out, "%s%s: ", i ? ", " : "", quant_keys[i + 1]);
        print_quant(out, m->quant[i]);
    }
    fputs("}\n", out);
    print_layers(m, out);
    fputs("  targets: [", out);
    for (int i = 0; i < 8 && m->targets[i]; i++)
        fprintf(out, "%s%s", i ? ", " : "", m->targets[i]);
    fputs("]\n", out);
    if (m->workers)
        fprintf(out, "  workers: %d\n", m->workers);
    if (m->attn_combine != COMBINE_AUTO)
        fprintf(out, "  attn_combine: %s\n", attn_combines[m->attn_combine]);
}

/* A path as an absolute one (the working directory before a relative
 * one, as text: no symlink resolved, so an HF cache's snapshot names stay,
 * and the files found beside them), so the printed description reads back
 * wherever it is saved: its paths are taken relative to its own folder. */
static void print_path(FILE *out, const char *path)
{
    char cwd[4096], *abs = NULL;
    if (path[0] != '/' && getcwd(cwd, sizeof cwd))
        abs = xasprintf("%s/%s", strcmp(cwd, "/") ? cwd : "", path[0] == '.' && path[1] == '/' ? path + 2 : path);
    print_str(out, abs ? abs : path);
    free(abs);
}

static void print_io(const ModelDesc *m, FILE *out)
{
    fprintf(out, "weights: {format: %s", weights_formats[m->weights_format]);
    if (m->weights_format == WFMT_SYNTHETIC)
        fprintf(out, ", seed: %llu", (unsigned long long)m->weights_seed);
    if (m->weights_path) {
        fputs(", path: ", out);
        print_path(out, m->weights_path);
    }
    fprintf(out, "}\ntokenizer: {format: %s", tok_formats[m->tok_format]);
    if (m->tok_path) {
        fputs(", path: ", out);
        print_path(out, m->tok_path);
    }
    fputs("}\n", out);
    if (m->bos_id >= 0)
        fprintf(out, "bos: %d\n", m->bos_id);
    if (m->eos_id >= 0 && m->n_stop == 0)
        fprintf(out, "eos: %d\n", m->eos_id);
    if (m->eos_id >= 0 && m->n_stop > 0) {
        fprintf(out, "eos: [%d", m->eos_id);
        for (int i = 0; i < m->n_stop; i++)
            fprintf(out, ", %d", m->stop_ids[i]);
        fputs("]\n", out);
    }
}

/* A rope.scaling list of head_dim / 2 factors, each as it reads back. */
static void print_factors(FILE *out, const ModelDesc *m, const char *key, const double *v)
{
    fprintf(out, "    %s: [", key);
    for (int i = 0; i < m->head_dim / 2 && i < MODEL_MAX_ROPE_PAIRS; i++) {
        char buf[40];
        fprintf(out, "%s%s", i ? ", " : "", double_str(buf, v[i]));
    }
    fputs("]\n", out);
}

/* Paths are printed resolved, absolute. */
void desc_print(const ModelDesc *m, FILE *out)
{
    fputs("# ", out);
    /* a newline in a file name ends no comment, nor does other text YAML
     * cannot hold make the comment unreadable: each such byte is a '?' */
    const unsigned char *p = (const unsigned char *)(m->path ? m->path : "?");
    for (size_t i = 0, n = strlen((const char *)p); i < n;) {
        int k = tok_utf8_len((const char *)p + i, n - i);
        if (k > 1) {
            fwrite(p + i, 1, (size_t)k, out);
            i += (size_t)k;
        } else {
            fputc(!k || p[i] < 0x20 || p[i] == 0x7f ? '?' : p[i], out);
            i++;
        }
    }
    fputs(" (paths made absolute)\n", out);
    fprintf(out, "name: %s\narch:\n", m->name ? m->name : "?");
    fprintf(out, "  dim: %d\n  hidden_dim: %d\n  n_layers: %d\n  n_heads: %d\n  n_kv_heads: %d\n", m->dim,
            m->hidden_dim, m->n_layers, m->n_heads, m->n_kv_heads);
    fprintf(out, "  head_dim: %d\n  vocab_size: %d\n  max_seq: %d\n", m->head_dim, m->vocab_size, m->max_seq);
    if (m->sliding_window)
        fprintf(out, "  sliding_window: %d\n", m->sliding_window);
    print_double(out, "norm_eps", m->norm_eps);
    fprintf(out, "tie_embeddings: %s\nqkv_bias: %s\nrope:\n", m->tie_embeddings ? "true" : "false",
            m->qkv_bias ? "true" : "false");
    print_double(out, "  theta", m->rope_theta);
    fprintf(out, "  pairing: %s\n", pairings[m->rope_pairing]);
    if (m->rope_scaling == ROPE_SCALING_LLAMA3) {
        fputs("  scaling:\n    type: llama3\n", out);
        print_double(out, "    factor", m->rope_factor);
        print_double(out, "    low_freq_factor", m->rope_low_freq_factor);
        print_double(out, "    high_freq_factor", m->rope_high_freq_factor);
        fprintf(out, "    original_max_pos: %d\n", m->rope_orig_max_pos);
    } else if (m->rope_scaling == ROPE_SCALING_LONGROPE) {
        fputs("  scaling:\n    type: longrope\n", out);
        print_factors(out, m, "short_factors", m->rope_freq_factors);
        print_factors(out, m, "long_factors", m->rope_long_factors);
        fprintf(out, "    original_max_pos: %d\n", m->rope_orig_max_pos);
        print_double(out, "    attention_factor", m->rope_attn_factor);
    } else if (m->rope_scaling == ROPE_SCALING_FACTORS) {
        fputs("  scaling:\n    type: factors\n", out);
        print_factors(out, m, "factors", m->rope_freq_factors);
    } else {
        fputs("  scaling: none\n", out);
    }
    print_io(m, out);
    print_compile(m, out);
}
