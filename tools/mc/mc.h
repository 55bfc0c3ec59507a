/*
 * mc.h - an explicit-state model checker for small schedules, the oracle
 * the validator is compared against (ARCHITECTURE.md §3.4). It shares no
 * code with validator/: it uses ir/ only for the Schedule struct, op names
 * and arities.
 *
 * It explores every interleaving (state = per-worker pc; counter values
 * follow from the pcs; each instruction is one atomic step) with a hash set
 * of visited states, and reports
 *   deadlock   a reachable state where no worker can move and not all are done
 *   race       two ops of different workers, an overlapping range at some
 *              pos, one a write, both enabled in one reachable state
 *   uninit     a scratch read enabled in a state where the writes already
 *              executed do not cover it
 *   kv-order   a KV read enabled while an overlapping write of the step has
 *              not run yet
 *   structure  its own op footprints (from the meanings in ops.h), bounds,
 *              writes to weights, waits with threshold 0, signals of 0
 *   residency  more workers than the target can hold resident
 * Positions: every pos in [0, max_seq) when max_seq <= MC_ALL_POS, else
 * 0, 1, 2, max_seq/2, max_seq-2, max_seq-1 (bounds use the affine extremes,
 * which are exact).
 */
#ifndef MEGAC_MC_H
#define MEGAC_MC_H

#include "ir/ir.h"

#define MC_ALL_POS 256
#define MC_MAX_WORKERS 6

typedef enum { MC_SAFE, MC_UNSAFE, MC_UNKNOWN } McVerdict;

typedef struct McOptions {
    const Target *target;       /* NULL: no residency check */
    int threads_per_block, regs_per_thread, smem_per_block;    /* 0 = unknown */
    uint64_t max_states;        /* 0 = 4,000,000 */
} McOptions;

typedef struct McResult {
    McVerdict verdict;
    bool deadlock, race, uninit, kv_order, structure, residency;
    uint64_t states;            /* distinct states visited */
    char why[256];              /* first finding, or why the result is unknown */
} McResult;

McVerdict mc_check(const Schedule *s, const McOptions *o, McResult *r);

#endif
