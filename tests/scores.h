/*
 * scores.h - where ir/ops.h puts an evicting layer's attention scores,
 * computed the plain way (a split at a time) for the op tests of both
 * backends.
 */
#ifndef MEGAC_TEST_SCORES_H
#define MEGAC_TEST_SCORES_H

#include "ir/ops.h"

#include <stdint.h>

/* The index of q head qh's score of slot t < n, with G q heads per kv
 * head, in the scores of a cache of cap slots whose attention ran in ns
 * splits: the piece of the split whose blocks [s*nb/ns, (s+1)*nb/ns)
 * (nb = ceil(n / SPARSE_BLOCK)) hold t, sparse_score_rows entries per q
 * head. -1 if no split holds t (t >= n). */
static inline int64_t test_score_index(int64_t qh, int64_t t, int64_t n, int64_t cap, int64_t ns, int64_t G)
{
    int64_t nb = (n + SPARSE_BLOCK - 1) / SPARSE_BLOCK, R = sparse_score_rows(cap, ns);
    for (int64_t s = 0; s < ns; s++) {
        int64_t lo = s * nb / ns * SPARSE_BLOCK, hi = (s + 1) * nb / ns * SPARSE_BLOCK;
        if (t >= lo && t < hi && t < n)
            return ((qh / G * ns + s) * G + qh % G) * R + t - lo;
    }
    return -1;
}

#endif
