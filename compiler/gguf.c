/*
 * gguf.c - a GGUF reader (versions 2 and 3, little-endian), the file
 * mmap'd read-only.
 *
 * Format:
 *   file    := "GGUF" u32 version u64 n_tensors u64 n_kv kv[n_kv]
 *              tensor_info[n_tensors] padding data
 *   kv      := string key, u32 type, value
 *   value   := u8|i8|u16|i16|u32|i32|u64|i64|f32|f64|bool(u8)|string
 *            | array: u32 elem_type, u64 n, value[n]   (no nested arrays)
 *   string  := u64 len, len bytes (not NUL-terminated)
 *   tensor_info := string name, u32 n_dims, u64 dims[n_dims] (dims[0] is
 *              the fastest-varying), u32 ggml_type, u64 offset
 * The data section starts at the first multiple of general.alignment
 * (default 32) after the tensor infos; tensor offsets are relative to it
 * and must be multiples of the alignment.
 *
 * Every length is checked against the bytes left before it is used, and
 * every tensor's bytes against the data section (types whose block size is
 * unknown here keep data NULL and cannot be loaded, but do not stop the
 * metadata from being read). Errors are one "path: error: ..." naming the
 * key or tensor.
 */
#include "compiler/gguf.h"
#include "compiler/weights_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    GgufFile pub;           /* first: gguf_close casts back */
    WFile f;
    Arena a;
} GgufImpl;

typedef struct {
    const unsigned char *p, *end, *start;
    const char *path;
    Diag *d;
    bool ok;
} Cursor;

/* ggml tensor types: elements per block and bytes per block (0 = unknown). */
static const struct { int block, size; const char *name; } ggml_types[] = {
    [0] = {1, 4, "F32"},      [1] = {1, 2, "F16"},       [2] = {32, 18, "Q4_0"},   [3] = {32, 20, "Q4_1"},
    [6] = {32, 22, "Q5_0"},   [7] = {32, 24, "Q5_1"},    [8] = {32, 34, "Q8_0"},   [9] = {32, 40, "Q8_1"},
    [10] = {256, 84, "Q2_K"}, [11] = {256, 110, "Q3_K"}, [12] = {256, 144, "Q4_K"}, [13] = {256, 176, "Q5_K"},
    [14] = {256, 210, "Q6_K"}, [15] = {256, 292, "Q8_K"}, [16] = {256, 66, "IQ2_XXS"}, [17] = {256, 74, "IQ2_XS"},
    [18] = {256, 98, "IQ3_XXS"}, [19] = {256, 50, "IQ1_S"}, [20] = {32, 18, "IQ4_NL"}, [21] = {256, 110, "IQ3_S"},
    [22] = {256, 82, "IQ2_S"}, [23] = {256, 136, "IQ4_XS"}, [24] = {1, 1, "I8"},    [25] = {1, 2, "I16"},
    [26] = {1, 4, "I32"},     [27] = {1, 8, "I64"},      [28] = {1, 8, "F64"},     [29] = {256, 56, "IQ1_M"},
    [30] = {1, 2, "BF16"},    [34] = {256, 54, "TQ1_0"}, [35] = {256, 66, "TQ2_0"},
};
#define GGML_NTYPES ((uint32_t)(sizeof ggml_types / sizeof *ggml_types))

const char *gguf_type_name(uint32_t t)
{
    return t < GGML_NTYPES && ggml_types[t].name ? ggml_types[t].name : "unknown";
}

/* A metadata value's type, as the GGUF specification names it. */
const char *gguf_value_type_name(uint32_t t)
{
    static const char *const names[] = {"uint8", "int8",   "uint16", "int16", "uint32", "int32", "float32",
                                        "bool",  "string", "array",  "uint64", "int64", "float64"};
    return t < sizeof names / sizeof *names ? names[t] : "unknown";
}

/* ---- cursor ---- */

static bool cur_need(Cursor *c, uint64_t n, const char *what)
{
    if (c->ok && (uint64_t)(c->end - c->p) < n) {
        diag_file_error(c->d, c->path,
                        "file is truncated or corrupt: %s (at byte %zu) runs past the end of the file: it needs %" PRIu64
                        " bytes, %zu are left",
                        what, (size_t)(c->p - c->start), n, (size_t)(c->end - c->p));
        c->ok = false;
    }
    return c->ok;
}

/* An array of n elements (what: their kind, "uint32", "strings") of size
 * bytes each (of at least size bytes: strings) at the cursor: false (error
 * reported) when they cannot fit in what is left of the file. */
static bool cur_need_array(Cursor *c, uint64_t n, uint64_t size, const char *key, const char *what)
{
    uint64_t left = (uint64_t)(c->end - c->p);
    if (c->ok && n > left / size) {
        char need[64];
        if (n > UINT64_MAX / size)
            snprintf(need, sizeof need, "more than 2^64 bytes");
        else
            snprintf(need, sizeof need, "%s%" PRIu64 " bytes", strcmp(what, "strings") == 0 ? "at least " : "",
                     n * size);
        diag_file_error(c->d, c->path,
                        "file is truncated or corrupt: %s (at byte %zu), an array of %" PRIu64
                        " %s, runs past the end of the file: it needs %s, %" PRIu64 " are left",
                        key, (size_t)(c->p - c->start), n, what, need, left);
        c->ok = false;
    }
    return c->ok;
}

static uint64_t cur_uint(Cursor *c, int nbytes, const char *what)
{
    uint64_t v = 0;
    if (!cur_need(c, (uint64_t)nbytes, what))
        return 0;
    for (int i = 0; i < nbytes; i++)
        v |= (uint64_t)c->p[i] << (8 * i);
    c->p += nbytes;
    return v;
}

static GgufStr cur_str(Cursor *c, const char *what)
{
    GgufStr s = {0, ""};
    uint64_t n = cur_uint(c, 8, what);
    if (!cur_need(c, n, what))
        return s;
    s.len = n;
    s.s = (const char *)c->p;
    c->p += n;
    return s;
}

static const char *str_arena(Arena *a, GgufStr s)
{
    return arena_strndup(a, s.s, (size_t)s.len);
}

/* ---- metadata ---- */

static int gguf_scalar_size(GgufType t)
{
    static const int sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t <= GGUF_T_F64 ? sizes[t] : 0;
}

/* Reads one scalar of type t (not an array) into kv->v. */
static void gguf_scalar_read(Cursor *c, GgufKV *kv, GgufType t, const char *what)
{
    uint64_t u;
    float f;
    switch (t) {
    case GGUF_T_U8: case GGUF_T_U16: case GGUF_T_U32: case GGUF_T_U64:
        kv->v.u = cur_uint(c, gguf_scalar_size(t), what);
        break;
    case GGUF_T_I8: kv->v.i = (int8_t)cur_uint(c, 1, what); break;
    case GGUF_T_I16: kv->v.i = (int16_t)cur_uint(c, 2, what); break;
    case GGUF_T_I32: kv->v.i = (int32_t)cur_uint(c, 4, what); break;
    case GGUF_T_I64: kv->v.i = (int64_t)cur_uint(c, 8, what); break;
    case GGUF_T_F32:
        u = cur_uint(c, 4, what);
        memcpy(&f, &(uint32_t){(uint32_t)u}, 4);
        kv->v.f = f;
        break;
    case GGUF_T_F64:
        u = cur_uint(c, 8, what);
        memcpy(&kv->v.f, &u, 8);
        break;
    case GGUF_T_BOOL: kv->v.b = cur_uint(c, 1, what) != 0; break;
    case GGUF_T_STRING: kv->v.s = cur_str(c, what); break;
    case GGUF_T_ARRAY: die("gguf_scalar_read: array");
    }
}

/* array := u32 elem_type, u64 n, elements */
static void gguf_array_read(Cursor *c, GgufKV *kv, Arena *a, const char *key)
{
    uint32_t t = (uint32_t)cur_uint(c, 4, key);
    kv->arr_n = cur_uint(c, 8, key);
    if (!c->ok)
        return;
    if (t > GGUF_T_F64 || t == GGUF_T_ARRAY) {
        diag_file_error(c->d, c->path, "key '%s': array of %s is not supported", key,
                        t == GGUF_T_ARRAY ? "arrays" : "an unknown type");
        c->ok = false;
        return;
    }
    kv->arr_type = (GgufType)t;
    kv->data = c->p;
    if (t != GGUF_T_STRING) {
        if (cur_need_array(c, kv->arr_n, (uint64_t)gguf_scalar_size(kv->arr_type), key,
                           gguf_value_type_name(t)))
            c->p += kv->arr_n * (uint64_t)gguf_scalar_size(kv->arr_type);
        return;
    }
    if (!cur_need_array(c, kv->arr_n, 8, key, "strings")) /* each string takes at least 8 bytes */
        return;
    kv->strs = ARENA_ARRAY(a, GgufStr, kv->arr_n);
    for (uint64_t i = 0; i < kv->arr_n && c->ok; i++)
        kv->strs[i] = cur_str(c, key);
}

static void gguf_kv_read(Cursor *c, GgufKV *kv, Arena *a)
{
    kv->key = cur_str(c, "a metadata key");
    const char *key = c->ok ? str_arena(a, kv->key) : "?";
    uint32_t t = (uint32_t)cur_uint(c, 4, key);
    if (!c->ok)
        return;
    if (t > GGUF_T_F64) {
        diag_file_error(c->d, c->path, "key '%s': unknown value type %u", key, t);
        c->ok = false;
        return;
    }
    kv->type = (GgufType)t;
    if (kv->type == GGUF_T_ARRAY)
        gguf_array_read(c, kv, a, key);
    else
        gguf_scalar_read(c, kv, kv->type, key);
}

/* ---- tensor infos ---- */

static void gguf_tensor_read(Cursor *c, GgufTensor *t, Arena *a)
{
    t->name = cur_str(c, "a tensor name");
    const char *name = c->ok ? str_arena(a, t->name) : "?";
    t->ndim = (uint32_t)cur_uint(c, 4, name);
    if (c->ok && (t->ndim == 0 || t->ndim > 4)) {
        diag_file_error(c->d, c->path, "tensor '%s': %u dimensions (1 to 4 allowed)", name, t->ndim);
        c->ok = false;
    }
    for (uint32_t i = 0; i < t->ndim && c->ok; i++)
        t->dims[i] = cur_uint(c, 8, name);
    t->ggml_type = (uint32_t)cur_uint(c, 4, name);
    t->offset = cur_uint(c, 8, name);
}

/* Size in bytes of t's data; false (reported) for bad shapes. */
static bool gguf_tensor_size(const GgufFile *g, GgufTensor *t, Diag *d)
{
    uint64_t nel = 1;
    for (uint32_t i = 0; i < t->ndim; i++) {
        if (t->dims[i] > ((uint64_t)1 << 40) || (t->dims[i] && nel > ((uint64_t)1 << 50) / t->dims[i])) {
            diag_file_error(d, g->path, "tensor '%.*s': dimensions are too large", (int)t->name.len, t->name.s);
            return false;
        }
        nel *= t->dims[i];
    }
    if (t->ggml_type >= GGML_NTYPES || !ggml_types[t->ggml_type].size)
        return true; /* unknown type: data stays NULL */
    uint64_t block = (uint64_t)ggml_types[t->ggml_type].block;
    if (t->dims[0] % block) {
        diag_file_error(d, g->path, "tensor '%.*s': %" PRIu64 " columns is not a multiple of the %s block size %"
                        PRIu64, (int)t->name.len, t->name.s, t->dims[0], ggml_types[t->ggml_type].name, block);
        return false;
    }
    t->nbytes = nel / block * (uint64_t)ggml_types[t->ggml_type].size;
    return true;
}

static int tensor_cmp(const void *a, const void *b)
{
    const GgufTensor *x = *(const GgufTensor *const *)a, *y = *(const GgufTensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Places every tensor in the data section: aligned, inside, no overlap, and
 * no gap of a whole alignment unit after it (when every type is known). */
static bool gguf_tensors_place(GgufImpl *gi, uint64_t data_start, Diag *d)
{
    GgufFile *g = &gi->pub;
    uint64_t data_len = g->size - data_start;
    GgufTensor **v = ARENA_ARRAY(&gi->a, GgufTensor *, g->ntensors);
    uint64_t n = 0;
    bool sized = true;      /* every tensor's type has a known size */
    for (uint64_t i = 0; i < g->ntensors; i++) {
        GgufTensor *t = &g->tensors[i];
        sized &= t->ggml_type < GGML_NTYPES && ggml_types[t->ggml_type].size;
        if (!gguf_tensor_size(g, t, d))
            return false;
        if (t->offset % g->alignment || t->offset > data_len || t->nbytes > data_len - t->offset) {
            diag_file_error(d, g->path, "tensor '%.*s': data at offset %" PRIu64 " (%" PRIu64 " bytes) %s",
                            (int)t->name.len, t->name.s, t->offset, t->nbytes,
                            t->offset % g->alignment ? "is not aligned" : "runs past the end of the file");
            return false;
        }
        if (t->nbytes)
            v[n++] = t;
        if (t->ggml_type < GGML_NTYPES && ggml_types[t->ggml_type].size)
            t->data = g->map + data_start + t->offset;
    }
    qsort(v, (size_t)n, sizeof *v, tensor_cmp);
    for (uint64_t i = 1; i < n; i++) {
        const GgufTensor *p = v[i - 1], *t = v[i];
        if (t->offset < p->offset + p->nbytes) {
            diag_file_error(d, g->path, "tensor '%.*s': data overlaps tensor '%.*s'", (int)t->name.len,
                            t->name.s, (int)p->name.len, p->name.s);
            return false;
        }
        /* Writers pad each tensor only up to the alignment: a larger gap
         * means a type or shape that claims fewer bytes than were written. */
        if (sized && t->offset - (p->offset + p->nbytes) >= g->alignment) {
            diag_file_error(d, g->path, "tensor '%.*s': %" PRIu64 " bytes of type %s end %" PRIu64 " bytes before "
                            "the next tensor '%.*s' starts (is its type right?)", (int)p->name.len, p->name.s,
                            p->nbytes, gguf_type_name(p->ggml_type), t->offset - (p->offset + p->nbytes),
                            (int)t->name.len, t->name.s);
            return false;
        }
    }
    return true;
}

static bool str_is(GgufStr s, const char *p, size_t n)
{
    return s.len == n && memcmp(s.s, p, n) == 0;
}

/* ---- the file ---- */

static bool gguf_header_read(GgufImpl *gi, Cursor *c, Diag *d)
{
    GgufFile *g = &gi->pub;
    if (g->size < 4 || memcmp(g->map, "GGUF", 4) != 0) {
        const unsigned char *m = g->map;
        if (g->size < 4)
            diag_file_error(d, g->path, "not a GGUF file: %zu bytes long, where a GGUF file starts with the 4 bytes "
                            "'GGUF'", (size_t)g->size);
        else
            diag_file_error(d, g->path, "not a GGUF file: it starts with the bytes %02x %02x %02x %02x, not 'GGUF' "
                            "(47 47 55 46)", m[0], m[1], m[2], m[3]);
        return false;
    }
    c->p += 4;
    g->version = (uint32_t)cur_uint(c, 4, "the header");
    if (c->ok && g->version != 2 && g->version != 3) {
        diag_file_error(d, g->path, "GGUF version %u is not supported (2 and 3 are)", g->version);
        return false;
    }
    g->ntensors = cur_uint(c, 8, "the header");
    g->nkv = cur_uint(c, 8, "the header");
    if (!c->ok)
        return false;
    /* each kv takes at least 12 bytes, each tensor info at least 28 */
    uint64_t left = (uint64_t)(c->end - c->p);
    if (g->nkv > left / 12 || g->ntensors > left / 28) {
        diag_file_error(d, g->path, "file is truncated: %" PRIu64 " keys and %" PRIu64 " tensors do not fit in it",
                        g->nkv, g->ntensors);
        return false;
    }
    return true;
}

static bool gguf_alignment_read(GgufFile *g, Diag *d)
{
    g->alignment = 32;
    const GgufKV *kv = gguf_find(g, "general.alignment");
    if (!kv)
        return true;
    int64_t a;
    if (!gguf_get_int(g, "general.alignment", &a) || a <= 0 || (a & (a - 1)) || a > (1 << 24)) {
        diag_file_error(d, g->path, "key 'general.alignment': must be a power of two");
        return false;
    }
    g->alignment = (uint64_t)a;
    return true;
}

static int gguf_str_cmp(const void *x, const void *y)
{
    const GgufStr *a = *(const GgufStr *const *)x, *b = *(const GgufStr *const *)y;
    int c = memcmp(a->s, b->s, a->len < b->len ? a->len : b->len);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

/* The first of n names that appears twice, or NULL: sorted, so that a
 * file of many keys costs n log n, not n^2. */
static const GgufStr *gguf_str_repeated(const GgufStr **v, uint64_t n)
{
    qsort(v, n, sizeof *v, gguf_str_cmp);
    for (uint64_t i = 1; i < n; i++)
        if (gguf_str_cmp(&v[i - 1], &v[i]) == 0)
            return v[i];
    return NULL;
}

static bool gguf_dup_check(const GgufFile *g, Diag *d)
{
    uint64_t n = g->nkv > g->ntensors ? g->nkv : g->ntensors;
    const GgufStr **v = xmalloc((n ? n : 1) * sizeof *v);
    for (uint64_t i = 0; i < g->nkv; i++)
        v[i] = &g->kv[i].key;
    const GgufStr *r = gguf_str_repeated(v, g->nkv);
    if (r)
        diag_file_error(d, g->path, "key '%.*s' appears twice", (int)r->len, r->s);
    for (uint64_t i = 0; !r && i < g->ntensors; i++)
        v[i] = &g->tensors[i].name;
    const GgufStr *t = r ? NULL : gguf_str_repeated(v, g->ntensors);
    if (t)
        diag_file_error(d, g->path, "tensor '%.*s' appears twice", (int)t->len, t->s);
    free(v);
    return !r && !t;
}

static bool gguf_parse(GgufImpl *gi, Diag *d)
{
    GgufFile *g = &gi->pub;
    Cursor c = {g->map, g->map + g->size, g->map, g->path, d, true};
    if (!gguf_header_read(gi, &c, d))
        return false;
    g->kv = ARENA_ARRAY(&gi->a, GgufKV, g->nkv);
    for (uint64_t i = 0; i < g->nkv && c.ok; i++)
        gguf_kv_read(&c, &g->kv[i], &gi->a);
    g->tensors = ARENA_ARRAY(&gi->a, GgufTensor, g->ntensors);
    for (uint64_t i = 0; i < g->ntensors && c.ok; i++)
        gguf_tensor_read(&c, &g->tensors[i], &gi->a);
    if (!c.ok || !gguf_alignment_read(g, d) || !gguf_dup_check(g, d))
        return false;
    uint64_t pos = (uint64_t)(c.p - g->map);
    uint64_t data_start = (pos + g->alignment - 1) / g->alignment * g->alignment;
    if (data_start > g->size) {
        if (g->ntensors == 0)
            data_start = g->size;
        else {
            diag_file_error(d, g->path, "file is truncated: the data section would start past its end");
            return false;
        }
    }
    return gguf_tensors_place(gi, data_start, d);
}

GgufFile *gguf_open(const char *path, Diag *d)
{
    GgufImpl *gi = xcalloc(1, sizeof *gi);
    if (!wfile_open(&gi->f, path, d)) {
        free(gi);
        return NULL;
    }
    gi->pub.path = arena_strdup(&gi->a, path);
    gi->pub.map = gi->f.map;
    gi->pub.size = gi->f.size;
    if (!gguf_parse(gi, d)) {
        gguf_close(&gi->pub);
        return NULL;
    }
    return &gi->pub;
}

void gguf_close(GgufFile *g)
{
    if (!g)
        return;
    GgufImpl *gi = (GgufImpl *)g;
    wfile_close(&gi->f);
    arena_free(&gi->a);
    free(gi);
}

/* ---- lookups ---- */

const GgufKV *gguf_find(const GgufFile *g, const char *key)
{
    size_t n = strlen(key);
    for (uint64_t i = 0; i < g->nkv; i++)
        if (str_is(g->kv[i].key, key, n))
            return &g->kv[i];
    return NULL;
}

const GgufTensor *gguf_find_tensor_n(const GgufFile *g, const char *name, size_t n)
{
    for (uint64_t i = 0; i < g->ntensors; i++)
        if (str_is(g->tensors[i].name, name, n))
            return &g->tensors[i];
    return NULL;
}

const GgufTensor *gguf_find_tensor(const GgufFile *g, const char *name)
{
    return gguf_find_tensor_n(g, name, strlen(name));
}

bool gguf_get_int(const GgufFile *g, const char *key, int64_t *out)
{
    const GgufKV *kv = gguf_find(g, key);
    if (!kv)
        return false;
    switch (kv->type) {
    case GGUF_T_U8: case GGUF_T_U16: case GGUF_T_U32: case GGUF_T_U64:
        if (kv->v.u > (uint64_t)INT64_MAX)
            return false;
        *out = (int64_t)kv->v.u;
        return true;
    case GGUF_T_I8: case GGUF_T_I16: case GGUF_T_I32: case GGUF_T_I64:
        *out = kv->v.i;
        return true;
    default:
        return false;
    }
}

bool gguf_get_float(const GgufFile *g, const char *key, double *out)
{
    const GgufKV *kv = gguf_find(g, key);
    if (!kv || (kv->type != GGUF_T_F32 && kv->type != GGUF_T_F64))
        return false;
    *out = kv->v.f;
    return true;
}

int gguf_arch_int(const GgufFile *g, const char *arch, const char *key, char *full, int64_t *out, Diag *d)
{
    snprintf(full, 160, "%s.%s", arch, key);
    const GgufKV *kv = gguf_find(g, full);
    if (!kv)
        return 0;
    if (gguf_get_int(g, full, out))
        return 1;
    diag_file_error(d, g->path, "key '%s' must be an integer%s", full,
                    kv->type == GGUF_T_ARRAY ? " (per-layer values are not supported)" : "");
    return -1;
}

int gguf_arch_float(const GgufFile *g, const char *arch, const char *key, char *full, double *out, Diag *d)
{
    snprintf(full, 160, "%s.%s", arch, key);
    const GgufKV *kv = gguf_find(g, full);
    if (!kv)
        return 0;
    int64_t i;
    bool num = gguf_get_float(g, full, out);
    if (!num && gguf_get_int(g, full, &i)) /* an integer-typed theta (10000) is taken at its value */
        *out = (double)i, num = true;
    if (num && isfinite(*out) && *out > 0)
        return 1;
    if (num)
        diag_file_error(d, g->path, "key '%s' is %g; it must be a positive finite number", full, *out);
    else
        diag_file_error(d, g->path, "key '%s' must be a number, not a %s", full, gguf_value_type_name(kv->type));
    return -1;
}

bool gguf_get_str(const GgufFile *g, const char *key, GgufStr *out)
{
    const GgufKV *kv = gguf_find(g, key);
    if (!kv || kv->type != GGUF_T_STRING)
        return false;
    *out = kv->v.s;
    return true;
}
