/*
 * kernel_abi.h - the contract between generated kernels and the runtime.
 *
 * CPU kernels (kernel.so) and host-executed CUDA kernels (kernel.host.so)
 * export:
 *   const uint64_t megac_kernel_abi;        == MEGAC_KERNEL_ABI
 *   const uint64_t megac_schedule_hash;     == sched_hash() of schedule.sched
 *   const uint32_t megac_num_workers;       (for tools; the runtime reads
 *                                            megac_kernel_facts' copy)
 *   const uint64_t megac_kernel_facts[MEGAC_NFACTS];
 *        what the kernel was built with (MegacFact order); the runtime
 *        refuses a manifest whose key disagrees with one of them;
 *   const uint64_t megac_kv_layout[];
 *        where its KV cache lives, for a context shift (megac_shift: the
 *        runtime moves the rows and turns the keys; MegacKvLayout below);
 *   void megac_worker(const MegacArgs *a, uint32_t worker);
 *        runs worker `worker`'s instruction list for one step and returns;
 *        the runtime calls it from W threads at once, with the counters
 *        zeroed before the step.
 * CUDA cubins export `megac_kernel(MegacArgs a)` launched cooperatively
 * with one block per worker, plus the same four constants as __device__
 * globals (read with cuModuleGetGlobal), and `megac_k_dyn_smem_bytes` (a
 * u32): the dynamic shared memory each block is launched with (the GEMVs'
 * weight stage and the instruction stage; 0 without them). A cubin's
 * megac_kv_layout is sized to its words.
 *
 * Buffers are addressed by the byte offsets recorded in the schedule
 * (Buffer.offset): weights relative to `weights`, everything else relative
 * to `arena`.
 */
#ifndef MEGAC_KERNEL_ABI_H
#define MEGAC_KERNEL_ABI_H

#include <stdint.h>

/* 2: megac_kernel_facts */
/* 3: MegacArgs.prompt_end */
/* 4: MegacArgs.spin_ns; 5: megac_k_dyn_smem_bytes (the instruction stage) */
/* 6: MegacArgs.flags (steps without outputs) */
#define MEGAC_KERNEL_ABI 7u    /* 7: megac_kv_layout */

/* megac_kernel_facts[]: each is the value of one manifest key. */
typedef enum MegacFact {
    MEGAC_FACT_WORKERS,         /* workers */
    MEGAC_FACT_COUNTERS,        /* counters: words of MegacArgs.counters */
    MEGAC_FACT_ARENA_BYTES,     /* arena_bytes: the highest arena offset it touches */
    MEGAC_FACT_WEIGHTS_BYTES,   /* weights_bytes */
    MEGAC_FACT_VOCAB,           /* vocab: floats of logits */
    MEGAC_FACT_MAX_SEQ,         /* max_seq: KV cache rows; later positions are refused */
    MEGAC_FACT_IO_TOK,          /* io_tok, io_logits, io_next: arena offsets */
    MEGAC_FACT_IO_LOGITS,
    MEGAC_FACT_IO_NEXT,
    MEGAC_NFACTS
} MegacFact;
/* A fact the kernel does not know (an io buffer the schedule lacks). */
#define MEGAC_FACT_NONE UINT64_MAX

/* megac_kv_layout[]'s words. KV_LAYERS is 0 where the cache cannot be
 * shifted, and no word follows: a layer's rows are slots (an evicting
 * kv_policy) or the kernel keeps state about them across steps (Quest's
 * page bounds, SnapKV's kept lists). Else every layer has a cache of
 * KV_HEADS x KV_ROWS rows (max_seq: row p holds position p) of HEAD_DIM
 * elements of type KV_ELEM (MEGAC_KV_F32, F16, BF16), its keys rotated at
 * their position by the RoPE table at weights offset ROPE ([KV_ROWS]
 * [HEAD_DIM / 2] pairs of f32 cos, sin; pair i of a head is elements
 * (2i, 2i + 1), or (i, i + HEAD_DIM / 2) where ROPE_HALF is 1), and layer
 * l's key and value caches ([KV_HEADS][KV_ROWS][HEAD_DIM]) are at arena
 * offsets megac_kv_layout[MEGAC_KVL_CACHES + 2 l] and [... + 2 l + 1]. */
typedef enum MegacKvLayout {
    MEGAC_KVL_LAYERS,
    MEGAC_KVL_HEADS,
    MEGAC_KVL_ROWS,
    MEGAC_KVL_HEAD_DIM,
    MEGAC_KVL_ELEM,
    MEGAC_KVL_ROPE_HALF,
    MEGAC_KVL_ROPE,
    MEGAC_KVL_CACHES
} MegacKvLayout;
enum { MEGAC_KV_F32, MEGAC_KV_F16, MEGAC_KV_BF16 };

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
    int64_t prompt_end;     /* position of the prompt's last token, -1: none (SnapKV compresses there) */
    uint64_t spin_ns;       /* CPU: how long a wait spins (and yields) before it
                             * sleeps, when each worker has a CPU of its own; 0 =
                             * the kernel's default for shared CPUs. GPUs ignore it. */
    uint64_t flags;         /* MEGAC_STEP_* */
} MegacArgs;

/* MegacArgs.flags: the step's outputs (logits, argmax) are not wanted, so
 * it skips the output-only ops (sched_output_bufs in ir/ir.h); the io
 * buffers they write keep what an earlier step left there. */
#define MEGAC_STEP_NO_OUTPUT 1u

#endif
