/*
 * gguf.h - a GGUF v3 reader: header, metadata key/values and tensor infos,
 * with the data section mmap'd. Every offset and length is checked against
 * the file size before use; bad files get one error naming the file (and
 * the key or tensor).
 */
#ifndef MEGAC_GGUF_H
#define MEGAC_GGUF_H

#include "ir/util.h"

typedef enum {
    GGUF_T_U8 = 0, GGUF_T_I8, GGUF_T_U16, GGUF_T_I16, GGUF_T_U32, GGUF_T_I32,
    GGUF_T_F32, GGUF_T_BOOL, GGUF_T_STRING, GGUF_T_ARRAY, GGUF_T_U64, GGUF_T_I64, GGUF_T_F64,
} GgufType;

typedef struct GgufStr {
    uint64_t len;
    const char *s;          /* points into the mapping; not NUL-terminated */
} GgufStr;

typedef struct GgufKV {
    GgufStr key;
    GgufType type;
    /* scalars */
    union { uint64_t u; int64_t i; double f; bool b; GgufStr s; } v;
    /* arrays: element type, count, and the elements (strings decoded into
     * `strs`, numbers left in place at `data`) */
    GgufType arr_type;
    uint64_t arr_n;
    const void *data;
    GgufStr *strs;
} GgufKV;

typedef struct GgufTensor {
    GgufStr name;
    uint32_t ndim;
    uint64_t dims[4];       /* GGUF order: dims[0] is the fastest-varying (columns) */
    uint32_t ggml_type;     /* 0 f32, 1 f16, 8 q8_0, 2 q4_0, 3 q4_1, 30 bf16 */
    uint64_t offset;        /* relative to the data section */
    const void *data;       /* checked to lie inside the file */
    uint64_t nbytes;
} GgufTensor;

typedef struct GgufFile {
    const char *path;
    const unsigned char *map;
    size_t size;
    uint32_t version;
    GgufKV *kv;
    uint64_t nkv;
    GgufTensor *tensors;
    uint64_t ntensors;
    uint64_t alignment;
} GgufFile;

GgufFile *gguf_open(const char *path, Diag *d);
void gguf_close(GgufFile *g);
const GgufKV *gguf_find(const GgufFile *g, const char *key);
const GgufTensor *gguf_find_tensor(const GgufFile *g, const char *name);
/* Typed getters: false if absent or of another type. */
bool gguf_get_int(const GgufFile *g, const char *key, int64_t *out);
bool gguf_get_float(const GgufFile *g, const char *key, double *out);
bool gguf_get_str(const GgufFile *g, const char *key, GgufStr *out);
/* A metadata value's type as the GGUF specification names it (uint8 ... float64, string, array). */
const char *gguf_value_type_name(uint32_t t);
/* A hyperparameter `<arch>.<key>` (its full name written into full[160]):
 * 0 when absent, 1 when read, -1 when of another type (an error naming it
 * is reported; an integer array is "per-layer values"). The float must be
 * positive and finite. */
int gguf_arch_int(const GgufFile *g, const char *arch, const char *key, char *full, int64_t *out, Diag *d);
int gguf_arch_float(const GgufFile *g, const char *arch, const char *key, char *full, double *out, Diag *d);

#endif
