/*
 * bench.h - measurements behind `megac bench` (bench.c): decode speed of a
 * bundle and the machine's own read-bandwidth ceiling, measured in the same
 * run so the ratio between them means something.
 */
#ifndef MEGAC_BENCH_H
#define MEGAC_BENCH_H

#include "runtime/megac.h"

#include <stddef.h>

/* Read bandwidth of this machine in GB/s (1e9 bytes/s): `threads` threads
 * (0 = all online CPUs), each reading its slice of a buffer of `bytes`
 * (0 = much larger than the last-level cache) as `streams` interleaved
 * sequential streams; the median of `passes` passes. Returns a negative
 * value if the buffer cannot be allocated or a thread cannot start. */
double bench_read_ceiling_gbps(size_t bytes, int threads, int streams, int passes);

/* Decodes `ntok` greedy tokens after BOS (the model's own argmax fed back)
 * and returns the decode rate in tokens/s, or a negative value with the
 * runtime's error in megac_error(m). */
double bench_decode_tok_s(megac_model *m, int ntok);

/* Median of n values (sorts v in place). */
double bench_median(double *v, int n);

#endif
