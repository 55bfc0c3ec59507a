/*
 * dtype.c - the element-type table and byte sizes (layouts in dtype.h).
 */
#include "ir/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    int block, block_bytes;
} dtypes[] = {
#define X(n, s, b, bb) {s, b, bb},
    DTYPE_LIST(X)
#undef X
};
_Static_assert(sizeof dtypes / sizeof dtypes[0] == DT_COUNT, "dtype table out of sync");

const char *dtype_name(DType t)
{
    return (unsigned)t < DT_COUNT ? dtypes[t].name : "?";
}

int dtype_from_name(const char *s)
{
    for (int i = 0; i < DT_COUNT; i++)
        if (strcmp(dtypes[i].name, s) == 0)
            return i;
    return -1;
}

int dtype_block(DType t)
{
    return dtypes[t].block;
}

int dtype_block_bytes(DType t)
{
    return dtypes[t].block_bytes;
}

bool dtype_is_rowwise(DType t)
{
    t = dtype_layout(t);
    return t == DT_W8 || t == DT_W4G32 || t == DT_W4G64 || t == DT_W4G128;
}

bool dtype_is_quant(DType t)
{
    return t == DT_Q8_0 || t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q5_0 || t == DT_Q5_1 || dtype_is_kquant(t) ||
           t == DT_IQ4_NL || t == DT_IQ4_XS || dtype_is_rowwise(t);
}

/* W4 group record of L elements: header, then 16 bytes per 32 elements. */
static size_t w4_group_bytes(int64_t len)
{
    return 4 + 16 * (size_t)((len + 31) / 32);
}

size_t dtype_row_bytes(DType t, int64_t k)
{
    t = dtype_layout(t);
    if (t == DT_W8)
        return 4 + (size_t)((k + 3) / 4 * 4);
    if (dtype_is_rowwise(t)) {
        int64_t g = dtypes[t].block, full = k / g;
        size_t n = (size_t)full * (size_t)dtypes[t].block_bytes;
        return k % g ? n + w4_group_bytes(k % g) : n;
    }
    return (size_t)(k / dtypes[t].block) * (size_t)dtypes[t].block_bytes;
}

size_t dtype_bytes(DType t, int64_t n)
{
    return dtype_row_bytes(t, n);
}

size_t dtype_tensor_bytes(DType t, int rank, const int64_t *shape)
{
    if (rank <= 0)
        return dtype_row_bytes(t, 1);
    int64_t rows = 1;
    for (int i = 0; i < rank - 1; i++)
        rows *= shape[i];
    return (size_t)rows * dtype_row_bytes(t, shape[rank - 1]);
}
