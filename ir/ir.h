/*
 * ir.h - the schedule IR: the complete plan of one decode step.
 *
 * A Schedule holds buffers, counters and one ordered instruction list per
 * worker (a CUDA block or a CPU thread). Instructions have one fixed shape:
 *   op      a compute task with its access list (buffer, mode, range)
 *   signal  c +k   release: this worker's prior writes are visible to
 *                  whoever observes the increment
 *   wait    c >= n acquire: block until counter c reaches n
 * Counters are zeroed before every step and only increase. Ranges are in
 * elements of the (flattened) buffer and may be affine in the step's
 * position: value = c + k * pos. See ../shared/ARCHITECTURE.md §2.
 *
 * Entities live in arrays and refer to each other by index, never by
 * pointer. The schedule owns an arena for its names.
 */
#ifndef MEGAC_IR_H
#define MEGAC_IR_H

#include "ir/dtype.h"
#include "ir/ops.h"
#include "ir/util.h"

typedef enum { BUF_WEIGHT, BUF_STATE, BUF_KV, BUF_SCRATCH, BUF_IO, BUF_CLASS_COUNT } BufClass;
const char *bufclass_name(BufClass c);

typedef struct Buffer {
    const char *name;       /* unique; weights use the names of weights_tensor_name() */
    DType dtype;
    BufClass cls;
    int rank;
    int64_t shape[4];
    int64_t nelem;          /* product of shape */
    uint64_t offset;        /* bytes: in the weights blob (BUF_WEIGHT) or the
                               runtime arena (others); set by sched_layout() */
    int line;               /* .sched line, 0 if built in memory */
} Buffer;

typedef struct Counter {
    const char *name;
    int line;
} Counter;

/* value = c + k * pos */
typedef struct Affine {
    int64_t c, k;
} Affine;

enum { ACC_R = 1, ACC_W = 2, ACC_RW = 3 };
#define BUF_NONE 0xffffffffu

typedef struct Access {
    uint32_t buf;           /* BUF_NONE for an absent optional operand */
    uint8_t mode;           /* ACC_R, ACC_W, ACC_RW */
    Affine lo, hi;          /* element range [lo, hi) */
} Access;

typedef enum { INST_OP, INST_SIGNAL, INST_WAIT } InstKind;

typedef struct Inst {
    uint8_t kind;           /* InstKind */
    uint8_t op;             /* OpCode, for INST_OP */
    uint16_t nacc;          /* == op_info(op)->noperands for INST_OP */
    uint32_t counter;       /* INST_SIGNAL / INST_WAIT */
    uint32_t amount;        /* signal: +k; wait: threshold n */
    int32_t p[OP_MAX_PARAMS];
    uint32_t acc;           /* first access in Schedule.accs */
    int32_t line;           /* .sched line, 0 if built in memory */
} Inst;

typedef struct Worker {
    Inst *insts;
    uint32_t ninst, cap;
} Worker;

/* The model constants op bodies are specialized to. */
typedef struct ModelShape {
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, max_seq;
    double norm_eps;
    int rope_pairing;       /* RopePairing of model.h */
} ModelShape;

typedef struct Schedule {
    Arena arena;
    const char *name;
    const char *target;     /* "cpu", "sm_90", "host-cuda", ... */
    ModelShape shape;
    Buffer *bufs;
    uint32_t nbufs, capbufs;
    Counter *ctrs;
    uint32_t nctrs, capctrs;
    Worker *workers;
    uint32_t nworkers;
    Access *accs;
    uint32_t naccs, capaccs;
    uint64_t weights_bytes; /* set by sched_layout() */
    uint64_t arena_bytes;
    const char *path;       /* .sched file it was parsed from, if any */
} Schedule;

/* ---- ir.c: construction ---- */
Schedule *sched_new(const char *name, const char *target, int nworkers);
void sched_free(Schedule *s);
uint32_t sched_add_buffer(Schedule *s, const char *name, DType t, BufClass c, int rank, const int64_t *shape);
uint32_t sched_add_counter(Schedule *s, const char *name);
int64_t sched_find_buffer(const Schedule *s, const char *name);    /* -1 if none */
int64_t sched_find_counter(const Schedule *s, const char *name);
/* Appends to worker w. `acc` has op_info(op)->noperands entries. */
void sched_op(Schedule *s, int w, int op, const int32_t *params, const Access *acc);
void sched_signal(Schedule *s, int w, uint32_t counter, uint32_t k);
void sched_wait(Schedule *s, int w, uint32_t counter, uint32_t n);
/* Assigns offsets: weights packed 64-byte aligned in the weights blob,
 * everything else in the runtime arena (64-byte aligned). */
void sched_layout(Schedule *s);
/* Stable hash of the whole schedule (text form), recorded in kernels. */
uint64_t sched_hash(const Schedule *s);
/* Steps without outputs. A step may be run only for its effect on the
 * state and the KV cache (a prompt token before the last: its logits are
 * not read). Such a step skips the output-only ops: those whose every write
 * goes to a buffer of the set sched_output_bufs returns, the greatest set
 * of io and scratch buffers that no other op reads (here: the logits, the
 * argmax partials and the argmax). Waits and signals all stay, so the
 * validator's proofs hold for it (it only removes accesses, and what a kept
 * op reads is still written). Returns nbufs flags (xmalloc'd). */
bool *sched_output_bufs(const Schedule *s);
/* Whether instruction `in` of s is output-only, given sched_output_bufs. */
bool sched_inst_output_only(const Schedule *s, const Inst *in, const bool *out);
static inline int64_t affine_at(Affine a, int64_t pos) { return a.c + a.k * pos; }
static inline Affine affine_const(int64_t c) { return (Affine){c, 0}; }

/* ---- text.c: the .sched format ---- */
void sched_print(const Schedule *s, FILE *out);
char *sched_to_string(const Schedule *s);               /* xmalloc'd */
/* Errors as path:line:col. NULL on error. */
Schedule *sched_parse(const char *path, const char *text, size_t len, Diag *d);
Schedule *sched_load(const char *path, Diag *d);

/* ---- ops.c ---- */
/* The access list an op instruction must have, computed from its params
 * and the schedule's shape (what the op body touches). Returns false if the
 * params are invalid for the shape (then `why` says why). */
bool op_footprint(const Schedule *s, const Inst *in, Access *out, const char **why);
/* The dtype an activation or state operand i of op instruction `in` must
 * have (weights may have any but i32), and the element count its layout in
 * ops.h fixes (0: any). */
DType op_operand_dtype(const Inst *in, int i);
/* The KV cache rows an op reads or writes (kc, vc): operand index of its
 * k rows (which 0) or v rows (which 1), -1 when it has none. Their
 * buffers may be f32, f16 or bf16 (compile.kv_dtype; dtype_is_cache),
 * the k and v rows of one instruction alike; op_operand_dtype gives f32
 * for them. */
int op_cache_operand(const Inst *in, int which);
bool op_operand_is_cache(const Inst *in, int i);
bool dtype_is_cache(DType t);
int64_t op_operand_nelem(const Schedule *s, const Inst *in, int i);
/* Whether optional operand i is one the params make the op use: the sel of
 * a Quest attn_sparse, the scores of slots with b = 1, kv_evict's scores
 * (h2o, tova) and acc (h2o). (GEMV's norm and bias follow its flags.) */
bool op_operand_needed(const Inst *in, int i);

/* ---- target.c: what a schedule runs on ---- */
typedef enum { TARGET_CPU, TARGET_CUDA, TARGET_HOST_CUDA } TargetKind;
typedef struct Target {
    const char *name;       /* "cpu", "sm_80", "sm_90", "sm_120", "host-cuda" */
    TargetKind kind;
    int default_workers;    /* CPU: cores; CUDA: SMs */
    int sms;                /* CUDA: SM count of the reference device */
    int max_blocks_per_sm;  /* CUDA: hardware limit */
    int regs_per_sm, smem_per_sm, max_threads_per_sm;
    int arch;               /* 80, 90, 120; 0 for CPU */
} Target;
/* NULL (and an error listing the valid names) for an unknown name. */
const Target *target_lookup(const char *name, Diag *d);
extern const char *const target_names[];    /* NULL-terminated */

#endif
