/*
 * dtype.c - the element-type table.
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

size_t dtype_bytes(DType t, int64_t n)
{
    return (size_t)(n / dtypes[t].block) * (size_t)dtypes[t].block_bytes;
}
