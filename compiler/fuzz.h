/*
 * fuzz.h - the adversarial campaign of `megac fuzz-validator`: defect
 * classes, the mutators that plant them in real lowerings, and random
 * schedules (fuzz_mutate.c). The campaign itself is cmd_fuzz_validator.c.
 */
#ifndef MEGAC_FUZZ_H
#define MEGAC_FUZZ_H

#include "ir/ir.h"

#define FUZZ_CLASS_LIST(X)                                              \
    X(NONE, "unmutated")                                                \
    X(DROP_WAIT, "dropped-wait")                                        \
    X(LOWER_THRESHOLD, "threshold-lowered")                             \
    X(RAISE_THRESHOLD, "threshold-above-producers")                     \
    X(DROP_SIGNAL, "signal-removed")                                    \
    X(DUP_SIGNAL, "signal-duplicated")                                  \
    X(SWAP, "swap-in-worker")                                           \
    X(MOVE_WORKER, "moved-to-worker")                                   \
    X(WIDEN, "tile-widened-waw")                                        \
    X(READ_EARLY, "read-before-signal-raw")                             \
    X(KV_EARLY, "kv-read-before-append")                                \
    X(CYCLE, "cycle")                                                   \
    X(RESIDENCY, "not-co-resident")                                     \
    X(OOB, "out-of-bounds")                                             \
    X(BAD_PARAMS, "bad-op-params")                                      \
    X(MERGE_COUNTERS, "counters-merged")                                \
    X(SIGNAL_AMOUNT, "signal-amount-changed")                           \
    X(MOVE_WAIT, "wait-moved")                                          \
    X(CACHE_DTYPE, "cache-dtype-changed")                               \
    X(RANDOM, "random")                                                 \
    X(RANDOM_DAG, "random-dag")

typedef enum {
#define X(n, s) FUZZ_##n,
    FUZZ_CLASS_LIST(X)
#undef X
    FUZZ_CLASS_COUNT
} FuzzClass;

extern const char *const fuzz_class_names[FUZZ_CLASS_COUNT];

/* xorshift64* */
typedef struct FuzzRng {
    uint64_t s;
} FuzzRng;
uint64_t fuzz_rand(FuzzRng *r);
uint32_t fuzz_below(FuzzRng *r, uint32_t n);  /* uniform in [0, n), n > 0 */

/* A deep copy built with the ir.h construction API. */
Schedule *fuzz_clone(const Schedule *s);
/* Plants a defect of class c (not NONE or RANDOM) into s. False when the
 * schedule offers no place for it (then s may be partly changed: drop it). */
bool fuzz_mutate(Schedule *s, FuzzClass c, FuzzRng *r);
/* A random small schedule of `add` and `silu_mul` ops, signals and waits. */
Schedule *fuzz_random(FuzzRng *r, int workers_max);
/* Random tasks dealt to workers in index order, each conflicting pair
 * ordered by a wait on the earlier task's counter (counters shared by
 * several tasks, thresholds cumulative), with a few waits wrong or left
 * out: mostly safe schedules that exercise the happens-before rules. */
Schedule *fuzz_random_dag(FuzzRng *r, int workers_max);

#endif
