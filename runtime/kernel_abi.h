/*
 * kernel_abi.h - the contract between generated kernels and the runtime.
 *
 * CPU kernels (kernel.so) and host-executed CUDA kernels (kernel.host.so)
 * export:
 *   const uint64_t megac_kernel_abi;        == MEGAC_KERNEL_ABI
 *   const uint64_t megac_schedule_hash;     == sched_hash() of schedule.sched
 *   const uint32_t megac_num_workers;
 *   void megac_worker(const MegacArgs *a, uint32_t worker);
 *        runs worker `worker`'s instruction list for one step and returns;
 *        the runtime calls it from W threads at once, with the counters
 *        zeroed before the step.
 * CUDA cubins export `megac_kernel(MegacArgs a)` launched cooperatively
 * with one block per worker, plus the same three constants as __device__
 * globals (read with cuModuleGetGlobal).
 *
 * Buffers are addressed by the byte offsets recorded in the schedule
 * (Buffer.offset): weights relative to `weights`, everything else relative
 * to `arena`.
 */
#ifndef MEGAC_KERNEL_ABI_H
#define MEGAC_KERNEL_ABI_H

#include <stdint.h>

#define MEGAC_KERNEL_ABI 1u

typedef struct MegacAbort {
    uint32_t flag;          /* non-zero once a wait timed out */
    uint32_t worker, pc, counter, value, threshold;
} MegacAbort;

typedef struct MegacArgs {
    const void *weights;    /* weights.bin, mapped */
    void *arena;            /* state, kv, scratch and io buffers */
    uint32_t *counters;     /* nctrs counters, zeroed before each step */
    MegacAbort *abort_info; /* set by a wait that passes its deadline */
    int64_t pos;            /* decode position of this step */
    uint64_t timeout_ns;    /* wait watchdog deadline; 0 = default (2 s) */
} MegacArgs;

#endif
