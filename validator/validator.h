/*
 * validator.h - the static validator: proves a Schedule free of deadlocks
 * and data races for every pos in [0, max_seq) before any code is emitted
 * (../shared/ARCHITECTURE.md §3). No size cut-off.
 *
 * Diagnostics are printed as `file:line:col: error: <kind>: ...` citing
 * both instructions (worker, index, .sched line) and the counter or buffer,
 * with `note:` lines. Kinds: structure, deadlock, race, uninit, residency.
 * KV-order violations (attention reading a row before this step's
 * kv_append of it) are races, marked "race: kv-order". Races are decided
 * only on schedules with a clean structure pass and no deadlock.
 *
 * The checker tools/mc (tests and `megac fuzz-validator` only) is the
 * independent oracle this is compared against.
 */
#ifndef MEGAC_VALIDATOR_H
#define MEGAC_VALIDATOR_H

#include "ir/ir.h"

typedef struct ValOptions {
    const Target *target;       /* NULL: no co-residency check */
    /* CUDA co-residency inputs, read back from the compiled kernel (0 =
     * unknown: assume the conservative defaults of the target). */
    int threads_per_block, regs_per_thread, smem_per_block;
    const SrcFile *src;         /* .sched text for quoting lines, may be NULL */
} ValOptions;

typedef struct ValResult {
    int nstructure, ndeadlock, nrace, nuninit, nresidency;
    int nlimit;                 /* past the validator's memory or time budget: not checked */
    int nerrors;                /* sum of the above */
    uint64_t pairs_checked;     /* (access, write) pairs of different workers on one
                                   buffer whose order was established: in bulk by
                                   happens-before, or by an exact overlap test */
} ValResult;

/* Returns true when the schedule is safe. */
bool val_schedule_check(const Schedule *s, const ValOptions *o, Diag *d, ValResult *r);

#endif
