/*
 * bench.h - measurements behind `megac bench` (bench.c): decode speed of a
 * bundle and the machine's own read-bandwidth ceiling, measured in the same
 * run so the ratio between them means something.
 */
#ifndef MEGAC_BENCH_H
#define MEGAC_BENCH_H

#include "runtime/megac.h"

#include <stddef.h>

/* The read-bandwidth probe: a buffer of `bytes`, touched, and `threads`
 * threads (0 = all online CPUs) that each read their slice as `streams`
 * interleaved sequential streams, as many times per pass as make
 * `pass_bytes` in all (at least once). NULL if memory or arguments do not
 * allow it. */
typedef struct BenchCeiling BenchCeiling;
BenchCeiling *bench_ceiling_new(size_t bytes, size_t pass_bytes, int threads, int streams);
/* The probe's buffer size for a decode step that reads `step_bytes` of
 * weights: the same working set, so that it sits in the caches exactly when
 * the weights can (a model that fits in a large last-level cache is read
 * from there by both), within 1 MiB .. 2 GiB and a quarter of memory; and
 * into *pass_bytes (if not NULL) what a pass reads: what `steps` decode
 * steps read, within 512 MiB .. 16 GiB. */
size_t bench_ceiling_size(unsigned long long step_bytes, int steps, size_t *pass_bytes);
/* One timed pass over the whole buffer: GB/s (1e9 bytes/s), or negative
 * if a thread could not start. */
double bench_ceiling_pass(BenchCeiling *c);
int bench_ceiling_threads(const BenchCeiling *c);
int bench_ceiling_sweeps(const BenchCeiling *c);
size_t bench_ceiling_bytes(const BenchCeiling *c);
void bench_ceiling_free(BenchCeiling *c);

/* Feeds BOS and then the model's own argmax up to position `context`
 * (untimed), then decodes `ntok` greedy tokens more and returns their rate
 * in tokens/s, or a negative value with the runtime's error in
 * megac_error(m). Positions stop at the model's max_seq - 1. With `fed`
 * (not NULL), the timed positions are run as steps without outputs
 * (megac_feed, as a prompt's tokens are) of the tokens in fed[], and the
 * rate is theirs; without, the tokens decoded go to toks[] (if not NULL,
 * ntok entries). */
double bench_decode_tok_s(megac_model *m, int context, int ntok, const int *fed, int *toks);

/* Median of n values (sorts v in place). */
double bench_median(double *v, int n);

/* The per-run ratios num[r] / den[r] of n paired runs (n <= 4096): their
 * median, and their min and max into *lo, *hi. num and den are left as
 * they are, so that each ratio is of two figures from the same run. */
double bench_ratio_median(const double *num, const double *den, int n, double *lo, double *hi);

#endif
