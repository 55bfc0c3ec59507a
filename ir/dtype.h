/*
 * dtype.h - element types shared by weights, buffers and kernels.
 *
 * Block formats (Q8_0, Q4_0, Q4_1) store `block` elements in `block_bytes`
 * bytes exactly as GGUF does (research/techniques.md §1.1). W8 and W4 are
 * megac's own quantized layouts (issue: quantized GEMV).
 */
#ifndef MEGAC_DTYPE_H
#define MEGAC_DTYPE_H

#include <stddef.h>
#include <stdint.h>

/*      name    text     block block_bytes */
#define DTYPE_LIST(X)                  \
    X(F32, "f32", 1, 4)                \
    X(F16, "f16", 1, 2)                \
    X(BF16, "bf16", 1, 2)              \
    X(I32, "i32", 1, 4)                \
    X(I8, "i8", 1, 1)                  \
    X(Q8_0, "q8_0", 32, 34)            \
    X(Q4_0, "q4_0", 32, 18)            \
    X(Q4_1, "q4_1", 32, 20)

typedef enum {
#define X(n, s, b, bb) DT_##n,
    DTYPE_LIST(X)
#undef X
    DT_COUNT
} DType;

const char *dtype_name(DType t);
int dtype_from_name(const char *s);         /* -1 if unknown */
int dtype_block(DType t);                   /* elements per block */
int dtype_block_bytes(DType t);
/* Bytes for n elements (n must be a multiple of the block). */
size_t dtype_bytes(DType t, int64_t n);

#endif
