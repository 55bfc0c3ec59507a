/*
 * kernel_body.cuh - the CUDA megakernel's op bodies and dispatch loop.
 *
 * Embedded in megac at build time and pasted after the generated part of a
 * kernel source (cuda_source.c), which defines the model shape (MK_DIM,
 * MK_HD, ...), the block size MK_THREADS, the shared scratch size, and the
 * validated schedule as tables: megac_k_insts (a stream of 32-bit words,
 * the instructions of each worker in order, worker w owning the words
 * [megac_k_wstart[w], megac_k_wstart[w+1])) and megac_k_bufs (a byte offset
 * per buffer, MK_ARENA_BIT set for the arena). An instruction is
 *   signal, wait:  kind | counter << 8,  amount
 *   op:            kind | op << 8 | nparams << 16 | noperands << 24,
 *                  the params, the operands' buffer indices (MK_NONE if
 *                  absent), their dtypes (5 bits each; bit 31: the op is
 *                  output-only, skipped by a step run with
 *                  MEGAC_STEP_NO_OUTPUT). Before those come the
 * platform primitives: cuda_prelude.cuh for NVRTC, host_shim.h for the host
 * (blocks as threads, CUDA threads as fibers).
 *
 * The code is the common subset of C11 and CUDA C++: explicit casts from
 * void *, no references, templates or overloads. Every block-wide step is
 * reached by all threads of the block; every warp primitive by all 32 lanes
 * of a warp. Op semantics: ir/ops.h. One block = one worker: an op is run by
 * the whole block and ends with a block barrier; `signal` is that barrier,
 * then thread 0 fences and adds; `wait` is thread 0 polling with acquire
 * loads and back-off (the watchdog records where it gave up), then a barrier.
 */

#define MK_NWARPS (MK_THREADS / 32)
#define MK_NEG_INF (-MK_INF)
#define MK_NONE 0xffffffffu
#define MK_ABORT_TIMEOUT 1u     /* kernel_table.h's KT_ABORT_* values */
#define MK_ABORT_BAD_POS 2u
#define MK_DEFAULT_TIMEOUT_NS 2000000000ull
#define MK_STEP_NO_OUTPUT 1ull  /* kernel_abi.h's MEGAC_STEP_NO_OUTPUT */

/* An op instruction's fields (cuda_source.c writes them in this order). */
#define MK_NPARAM(in) (((in)[0] >> 16) & 0xffu)
#define MK_NOPND(in) ((in)[0] >> 24)
enum { MK_INST_OP, MK_INST_SIGNAL, MK_INST_WAIT };

/* Same values as OpCode of ir/ops.h (cuda_source.c checks). */
enum {
    MK_OP_EMBED, MK_OP_RMSNORM, MK_OP_GEMV, MK_OP_ROPE, MK_OP_KV_APPEND, MK_OP_ATTN,
    MK_OP_ATTN_COMBINE, MK_OP_SILU_MUL, MK_OP_ADD, MK_OP_ARGMAX, MK_OP_ARGMAX_COMBINE,
    MK_OP_KV_STORE, MK_OP_ATTN_SPARSE, MK_OP_QUEST_SELECT, MK_OP_KV_EVICT, MK_OP_KV_SNAP, MK_OP_TOPK_SELECT
};
#define MK_GEMV_ACCUM 1
#define MK_GEMV_NORM 2
#define MK_GEMV_BIAS 4
#define MK_SPARSE_SINK_WINDOW 0 /* ATTN_SPARSE kinds, KV_EVICT policies: ops.h */
#define MK_SPARSE_QUEST 1
#define MK_SPARSE_SLOTS 2
#define MK_SPARSE_SNAP 3
#define MK_SPARSE_ROWS 4
#define MK_SPARSE_BLOCK 32
#define MK_KV_STREAMING 0
#define MK_KV_H2O 1
#define MK_KV_TOVA 2
#define MK_DT_F32 0     /* DType values of ir/dtype.h */
#define MK_DT_F16 1
#define MK_DT_BF16 2
#define MK_DT_I32 3
#define MK_DT_Q8_0 5
#define MK_DT_Q4_0 6
#define MK_DT_Q4_1 7
#define MK_DT_W8 8
#define MK_DT_W4G32 9
#define MK_DT_W4G64 10
#define MK_DT_W4G128 11
#define MK_DT_Q5_0 18
#define MK_DT_Q5_1 19
#define MK_DT_Q4_K 20
#define MK_DT_Q5_K 21
#define MK_DT_Q6_K 22
#define MK_DT_IQ4_NL 29
#define MK_DT_IQ4_XS 30
#define MK_DT_Q3_K 31
#define MK_DT_Q2_K 32

/* What the schedule uses (cuda_source.c): bit o of MK_OPS for opcode o, bit
 * t of MK_DTS for an operand of dtype t. The op bodies and weight formats
 * it does not use compile away, which keeps NVRTC's time and the kernel's
 * registers to what this model needs. Every op and dtype without them. */
#ifndef MK_OPS
#define MK_OPS 0xffffffffu
#endif
#ifndef MK_DTS
#define MK_DTS 0xffffffffffffffffull
#endif
#define MK_HAS_OP(o) ((MK_OPS >> (o)) & 1u)
#define MK_HAS_DT(t) ((unsigned)(MK_DTS >> (t)) & 1u)
#define MK_HAS_W4 (MK_HAS_DT(MK_DT_W4G32) | MK_HAS_DT(MK_DT_W4G64) | MK_HAS_DT(MK_DT_W4G128))
/* a weight row in the CUDA block order (mk_planar) */
#define MK_HAS_PLANAR (MK_HAS_W4 | MK_HAS_DT(MK_DT_Q4_0) | MK_HAS_DT(MK_DT_Q4_1) | MK_HAS_DT(MK_DT_Q8_0))
#define MK_HAS_KQ (MK_HAS_DT(MK_DT_Q4_K) | MK_HAS_DT(MK_DT_Q5_K))
/* a weight row read through mk_dot_qrow: anything but f32 and bf16 */
#define MK_HAS_QROW ((MK_DTS & ~(1ull << MK_DT_F32 | 1ull << MK_DT_BF16 | 1ull << MK_DT_I32)) != 0ull)

/* Block-shared scratch: GEMV inputs, attention partials, reductions. */
MK_SHARED MK_ALIGN16 float mk_sm[MK_SMEM_FLOATS];
MK_SHARED float mk_red[2 * 32 + 2];

/* ---- the weight stage (MK_WSTAGE_BYTES > 0) ----
 * While a block waits for a GEMV's input, the rows that GEMV will read
 * (weights never change during a step) are copied into shared memory by
 * the copy engine's asynchronous 16-byte copies (cp.async: no registers
 * held across the wait), up to MK_WSTAGE_BYTES of them, from the 16-byte
 * boundary at or before the first row. The copy keeps every address's
 * offset mod 16, so the row layouts that depend on it (W8's aligned span,
 * the block order's h0) read the same from either place. The GEMV then
 * reads each row that lies wholly in the stage from it (mk_wrow), the rest
 * from memory. The stage is dynamic shared memory: cuda_layout sizes it
 * from MEGAC_CUDA_DEFINES=MK_WSTAGE_BYTES=N, the kernel exports the size
 * (megac_k_dyn_smem_bytes, with the instruction stage's) and the runtime
 * launches with it. Weight loads are then generic (an address may be
 * shared), not the read-only path. */
#ifndef MK_WSTAGE_BYTES
#define MK_WSTAGE_BYTES 0
#endif
/* The instruction stage, after it: the buffer table (MK_NBUFS_PAD
 * offsets), then this worker's instruction words, copied there at the
 * start of each step (mk_worker_run), so that decoding an op (its words,
 * then its operands' offsets) reads shared memory rather than a chain of
 * dependent loads from L2, whose lines the weight stream evicts from L1
 * between ops. cuda_layout sizes it (0: too large, or
 * MEGAC_CUDA_DEFINES=MK_ISTAGE=0; then both are read where they lie). */
#ifndef MK_ISTAGE_BYTES
#define MK_ISTAGE_BYTES 0
#endif
/* The weight pipe, after both (MK_WPIPE stages, the layout's: 0 none):
 * each warp's ring of MK_WPIPE rounds of MK_WPIPE_V 16-byte units a lane,
 * which cp.async fills MK_WPIPE - 1 rounds ahead of the round its lanes
 * multiply (mk_gemv_pipe). */
#ifndef MK_WPIPE
#define MK_WPIPE 0
#endif
#ifndef MK_WPIPE_V
#define MK_WPIPE_V 4
#endif
#define MK_WPIPE_BYTES (MK_WPIPE * MK_WPIPE_V * 512 * MK_NWARPS)
#if MK_WSTAGE_BYTES + MK_ISTAGE_BYTES + MK_WPIPE_BYTES > 0
MK_WSTAGE_DECL(mk_wst, MK_WSTAGE_BYTES + MK_ISTAGE_BYTES + MK_WPIPE_BYTES);
#endif

/* Buffer b's entry of megac_k_bufs: its offset, MK_ARENA_BIT for the arena. */
MK_INLINE unsigned long long mk_buf(unsigned b)
{
#if MK_ISTAGE_BYTES > 0
    return ((const unsigned long long *)(const void *)(mk_wst + MK_WSTAGE_BYTES / 16))[b];
#else
    return megac_k_bufs[b];
#endif
}
/* MEGAC_CUDA_DEFINES=MK_WSTAGE_COUNT=1 (host shim only): counts the rows
 * GEMVs read from the stage, for a test to see that they did. */
#ifndef MK_WSTAGE_COUNT
#define MK_WSTAGE_COUNT 0
#endif
#if MK_WSTAGE_COUNT
#ifdef __CUDACC_RTC__
#error "MK_WSTAGE_COUNT is for the host shim"
#endif
static unsigned long megac_wstage_rows;
MK_EXPORT unsigned long megac_wstage_count(void)
{
    return __atomic_load_n(&megac_wstage_rows, __ATOMIC_RELAXED);
}
#endif

/* The staged byte range [g0, g1) of the weights (both 0: none). */
typedef struct {
    const unsigned char *g0, *g1;
} MkStage;

MK_INLINE MkStage mk_no_stage(void)
{
    MkStage st = {0, 0};
    return st;
}

/* 16-byte, 4-byte and 2-byte weight loads. The 16-byte ones are read once
 * per step and not kept in L1 (no_allocate), which then keeps what is read
 * again (the staged inputs' sources, the KV rows); on an H200 that
 * decoded 1.036x (Llama-3.2-1B) and 1.056x (SmolLM2-135M) faster, bf16.
 * MEGAC_CUDA_DEFINES=MK_WNOALLOC=0 allocates them, to time against. */
#ifndef MK_WNOALLOC
#define MK_WNOALLOC 1
#endif
MK_INLINE uint4 mk_ldw4(const uint4 *p)
{
#if MK_WSTAGE_BYTES > 0
    return *p;
#elif MK_WNOALLOC
    return mk_ldg4u_na(p);
#else
    return mk_ldg4u(p);
#endif
}

MK_INLINE unsigned mk_ldwu(const unsigned *p)
{
#if MK_WSTAGE_BYTES > 0
    return *p;
#else
    return mk_ldgu(p);
#endif
}

MK_INLINE unsigned mk_ldwus(const unsigned short *p)
{
#if MK_WSTAGE_BYTES > 0
    return *p;
#else
    return mk_ldgus(p);
#endif
}

/* MEGAC_CUDA_DEFINES=MK_XREUSE_COUNT=1 (host shim only): counts the GEMVs
 * that reused the input the GEMV before them staged (mk_gemv_restaged). */
#ifndef MK_XREUSE_COUNT
#define MK_XREUSE_COUNT 0
#endif
#if MK_XREUSE_COUNT
#ifdef __CUDACC_RTC__
#error "MK_XREUSE_COUNT is for the host shim"
#endif
static unsigned long megac_xreuse_n;
MK_EXPORT unsigned long megac_xreuse_count(void)
{
    return __atomic_load_n(&megac_xreuse_n, __ATOMIC_RELAXED);
}
#endif
/* MEGAC_CUDA_DEFINES=MK_NL_COUNT=1 (host shim only): counts the GEMVs
 * whose rows were read by 8, 16 and 32 lanes (mk_gemv_rows) and, of those,
 * the ones read through the weight pipe and the ones whose pipe was
 * primed before their wait, and the pipe's rounds copied, for a test to
 * see which. */
#ifndef MK_NL_COUNT
#define MK_NL_COUNT 0
#endif
#if MK_NL_COUNT
#ifdef __CUDACC_RTC__
#error "MK_NL_COUNT is for the host shim"
#endif
static unsigned long megac_nl_n[6]; /* 8, 16, 32 lanes; [3] those through the weight pipe, [4] primed; [5] rounds */
MK_EXPORT unsigned long megac_nl_count(int i)
{
    return __atomic_load_n(&megac_nl_n[i], __ATOMIC_RELAXED);
}
#endif
/* Row r (rb bytes) of weight matrix W: its copy in the stage when the
 * whole row is there. */
MK_INLINE const unsigned char *mk_wrow(MkStage st, const void *W, long long r, long long rb)
{
    const unsigned char *p = (const unsigned char *)W + r * rb;
#if MK_WSTAGE_BYTES > 0
    if (p >= st.g0 && p + rb <= st.g1) {
#if MK_WSTAGE_COUNT
        __atomic_fetch_add(&megac_wstage_rows, 1, __ATOMIC_RELAXED);
#endif
        return (const unsigned char *)(const void *)mk_wst + (p - st.g0);
    }
#else
    (void)st;
#endif
    return p;
}

/* ---- the staged GEMV input's layout ----
 * A GEMV lane multiplies its 16-byte weight unit by the U float4s of x
 * under it: U = 1 for f32, 2 for bf16, 4 for W8. Shared memory serves a
 * 16-byte read a quarter-warp (8 lanes) at a time, from 32 banks of 4
 * bytes: 8 float4s at distinct f mod 8 take one pass. With x in order,
 * the quarter-warp's float4s are U apart: at U = 2 two lanes meet on
 * every group of 4 banks and the read takes 2 passes, at U = 4 four (W8,
 * Q8_0's 16 int8s), at U = 8 eight (a 16-byte chunk of 32 nibbles). So
 * the input is staged swizzled, float4 f at mk_xsw(f, m = U - 1), which
 * flips f's low bits by c = f / 8 (its 32-element chunk of x): the
 * quarter-warp's 8 float4s land on 8 distinct f mod 8, from any start (a
 * W8 row's data starts 0-3 float4s into x). mk_xsw keeps f inside its
 * chunk, and adding multiples of 32 float4s commutes with it;
 * MK_SMEM_FLOATS is a multiple of 32. m = 0 is the identity: x read where
 * it lies (not staged, or read a float at a time). */
MK_INLINE int mk_xsw(int f, int m)
{
    return f ^ ((f >> 3) & m);
}

/* Element i of an x staged with mask m. */
MK_INLINE float mk_xs_at(const float *x, int i, int m)
{
    return x[4 * mk_xsw(i >> 2, m) + (i & 3)];
}

/* MEGAC_CUDA_DEFINES=MK_BANK_TRACE=1 (host shim only): every float4 read
 * of a GEMV's staged input is recorded (GEMV, thread, the thread's read
 * number in that GEMV, 4-byte word of mk_sm), so that a test can replay
 * each warp's reads as the quarter-warp passes a GPU makes of them
 * (megac_bank_trace). One block: the records carry no block. */
#ifndef MK_BANK_TRACE
#define MK_BANK_TRACE 0
#endif
#if MK_BANK_TRACE
#ifdef __CUDACC_RTC__
#error "MK_BANK_TRACE is for the host shim"
#endif
typedef struct MkBankRead {
    unsigned gemv, tid, seq, word;
} MkBankRead;
#define MK_BANK_MAX (1u << 20)
static MkBankRead mk_bank_reads[MK_BANK_MAX];
static unsigned long mk_bank_n;
MK_SHARED unsigned mk_bank_gemv[MK_THREADS], mk_bank_seq[MK_THREADS];

MK_EXPORT unsigned long megac_bank_trace(const MkBankRead **r)
{
    *r = mk_bank_reads;
    return mk_bank_n < MK_BANK_MAX ? mk_bank_n : MK_BANK_MAX;
}
#endif

/* A GEMV begins (the trace numbers its reads from here). */
MK_INLINE void mk_xtrace_start(void)
{
#if MK_BANK_TRACE
    mk_bank_gemv[mk_tid()]++;
    mk_bank_seq[mk_tid()] = 0;
#endif
}

/* A 16-byte read of a GEMV's input x. */
MK_INLINE float4 mk_xld4(const float4 *p)
{
#if MK_BANK_TRACE
    const char *c = (const char *)(const void *)p, *s = (const char *)(const void *)mk_sm;
    if (c >= s && c < s + sizeof mk_sm) {
        unsigned long i = __atomic_fetch_add(&mk_bank_n, 1, __ATOMIC_RELAXED);
        unsigned t = mk_tid();
        if (i < MK_BANK_MAX)
            mk_bank_reads[i] = (MkBankRead){mk_bank_gemv[t], t, mk_bank_seq[t]++, (unsigned)((c - s) / 4)};
    }
#endif
    return *p;
}

/* ---- helpers ---- */

MK_INLINE void *mk_opnd(const MegacArgs *a, const unsigned *in, int i)
{
    unsigned b = in[1 + MK_NPARAM(in) + i];
    if (b == MK_NONE)
        return 0;
    unsigned long long w = mk_buf(b);
    if (w & MK_ARENA_BIT)
        return (char *)a->arena + (w & ~MK_ARENA_BIT);
    return (char *)(const char *)a->weights + w;
}

MK_INLINE int mk_dtype(const unsigned *in, int i)
{
    return (int)((in[1 + MK_NPARAM(in) + MK_NOPND(in)] >> (6 * i)) & 63u);
}

/* Whether this step skips op `in` (output-only, and a step without outputs). */
MK_INLINE int mk_skipped(const MegacArgs *a, const unsigned *in)
{
    return (in[1 + MK_NPARAM(in) + MK_NOPND(in)] >> 31) && (a->flags & MK_STEP_NO_OUTPUT);
}

MK_INLINE int mk_param(const unsigned *in, int i)
{
    return (int)in[1 + i];
}

/* bf16 -> f32: the 16 bits are the top half of a float */
MK_INLINE float mk_bf16(unsigned short h) { return mk_as_float((unsigned)h << 16); }
MK_INLINE float mk_bf16_lo(unsigned u) { return mk_as_float(u << 16); }
MK_INLINE float mk_bf16_hi(unsigned u) { return mk_as_float(u & 0xffff0000u); }

MK_INLINE float mk_warp_sum(float v)
{
    for (int m = 16; m > 0; m >>= 1)
        v += mk_shfl_xor_f(v, m);
    return v;
}

/* The sum over each aligned group of nl lanes (nl a power of 2, <= 32),
 * in every lane of the group. Every lane of the warp must call it. */
MK_INLINE float mk_group_sum(float v, int nl)
{
    for (int m = nl / 2; m > 0; m >>= 1)
        v += mk_shfl_xor_f(v, m);
    return v;
}

MK_INLINE float mk_warp_max(float v)
{
    for (int m = 16; m > 0; m >>= 1)
        v = fmaxf(v, mk_shfl_xor_f(v, m));
    return v;
}

/* The sum (max: the maximum) over the block; every thread gets it. */
MK_INLINE float mk_block_reduce(float v, int max)
{
    unsigned tid = mk_tid();
    v = max ? mk_warp_max(v) : mk_warp_sum(v);
    if ((tid & 31u) == 0)
        mk_red[tid >> 5] = v;
    mk_sync();
    if (tid < 32) {
        float t = tid < MK_NWARPS ? mk_red[tid] : max ? MK_NEG_INF : 0.0f;
        t = max ? mk_warp_max(t) : mk_warp_sum(t);
        if (tid == 0)
            mk_red[64] = t;
    }
    mk_sync();
    float r = mk_red[64];
    mk_sync();
    return r;
}

MK_DEV float mk_block_sum(float v) { return mk_block_reduce(v, 0); }
MK_DEV float mk_block_max(float v) { return mk_block_reduce(v, 1); }

/* (v, i) wins over (w, j): larger value, then lower index. */
MK_INLINE int mk_better(float v, int i, float w, int j)
{
    return v > w || (v == w && i < j);
}

MK_INLINE void mk_warp_argmax(float *v, int *i)
{
    for (int m = 16; m > 0; m >>= 1) {
        float w = mk_shfl_xor_f(*v, m);
        int j = mk_shfl_xor_i(*i, m);
        if (mk_better(w, j, *v, *i)) {
            *v = w;
            *i = j;
        }
    }
}


/* The index of the least v over the block (the lowest index on ties; i <
 * 2^24, or -1 for a thread without one); every thread gets it. */
MK_DEV int mk_block_argmin(float v, int i)
{
    unsigned tid = mk_tid();
    float nv = i < 0 ? MK_NEG_INF : -v;
    if (i < 0)
        i = 1 << 30;
    mk_warp_argmax(&nv, &i);
    if ((tid & 31u) == 0) {
        mk_red[tid >> 5] = nv;
        mk_red[32 + (tid >> 5)] = (float)i;
    }
    mk_sync();
    if (tid < 32) {
        nv = tid < MK_NWARPS ? mk_red[tid] : MK_NEG_INF;
        i = tid < MK_NWARPS ? (int)mk_red[32 + tid] : 1 << 30;
        mk_warp_argmax(&nv, &i);
        if (tid == 0)
            mk_red[64] = (float)i;
    }
    mk_sync();
    int r = (int)mk_red[64];
    mk_sync();
    return r;
}

/* 1 / sqrt(mean(x[0:n]^2) + eps), over the block */
MK_DEV float mk_rms_scale(const float *x, int n)
{
    float s = 0.0f;
    for (int j = (int)mk_tid(); j < n; j += MK_THREADS)
        s += x[j] * x[j];
    s = mk_block_sum(s);
    return 1.0f / sqrtf(s / (float)n + MK_EPS);
}

/* 16-byte weight loads in flight per lane in the GEMV row loops: 8
 * (MK_VLOADS_AUTO), fewer where the kernel would spill even without
 * preloads (cg_cuda_compile; W4 schedules on sm_90 at some worker counts). */
#ifndef MK_VLOADS
#define MK_VLOADS MK_VLOADS_AUTO
#endif

/* Of a GEMV's first round, the loads that mk_gemv_preload issues before
 * the wait for its input. Their registers (4 per load) are live across
 * the wait, and a thread has 128 at 512 threads: cg_cuda_compile starts
 * at 2 (MK_PRELOADS_AUTO) and takes fewer where ptxas would spill.
 * MEGAC_CUDA_DEFINES=MK_PRELOADS=0 turns it off, to compare. MK_PRE_N
 * sizes the arrays that hold them. */
#ifndef MK_PRELOADS
#define MK_PRELOADS MK_PRELOADS_AUTO
#endif
#if MK_PRELOADS > MK_VLOADS
#undef MK_PRELOADS
#define MK_PRELOADS MK_VLOADS
#endif
#define MK_PRE_N (MK_PRELOADS > 0 ? MK_PRELOADS : 1)

/* Loads u0 <= u < u1 of a lane's round of GEMV weight loads: units
 * j + nl u of p (nl: the lanes that read the row), zeros at or past j1. */
MK_INLINE void mk_round_part(const uint4 *p, int j, int j1, int u0, int u1, uint4 *w, int nl)
{
    const uint4 z = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int u = u0; u < u1; u++)
        w[u - u0] = j + nl * u < j1 ? mk_ldw4(p + j + nl * u) : z;
}

/* A round: MK_VLOADS loads. */
MK_INLINE void mk_round_load(const uint4 *p, int j, int j1, uint4 w[MK_VLOADS], int nl)
{
    mk_round_part(p, j, j1, 0, MK_VLOADS, w, nl);
}

/* use_pre, the GEMVs' word for what was issued before their wait: 0
 * nothing, 1 the first round's MK_PRELOADS loads in pre (mk_gemv_preload),
 * MK_PIPE_PRIMED the first rounds of the weight pipe (mk_pipe_prime). */
#define MK_PIPE_PRIMED 2

/* A lane's first round: its first MK_PRELOADS loads from pre when use_pre
 * (mk_gemv_preload issued them), the rest issued now. */
MK_INLINE void mk_round_first(const uint4 *p, int j, int j1, const uint4 pre[MK_PRE_N], int use_pre,
                              uint4 w[MK_VLOADS], int nl)
{
    if (use_pre) {
#pragma unroll
        for (int u = 0; u < MK_PRELOADS; u++)
            w[u] = pre[u];
        mk_round_part(p, j, j1, MK_PRELOADS, MK_VLOADS, w + MK_PRELOADS, nl);
    } else {
        mk_round_load(p, j, j1, w, nl);
    }
}

/* ---- quantized and half-precision weights (layouts: ir/dtype.h) ----
 * Dequantized in registers inside the warp's dot product (and the
 * embedding gather): no dequantized copy of a weight exists. Row r of a
 * matrix starts at r * mk_row_bytes(t, k). Same arithmetic as the CPU body
 * and compiler/quant.c: w = d * q (Q4_1: d * q, then + m), one rounding
 * each. */

/* mk_f16 (the f16 in the low 16 bits of h as a float, exact) is the
 * prelude's: one conversion instruction on the GPU, bit arithmetic on the
 * host. */

MK_INLINE float mk_f16_at(const unsigned char *p)
{
    return mk_f16((unsigned)p[0] | (unsigned)p[1] << 8);
}

MK_INLINE float mk_bf16_at(const unsigned char *p)
{
    return mk_as_float(((unsigned)p[0] | (unsigned)p[1] << 8) << 16);
}

MK_INLINE float mk_f32_at(const unsigned char *p)
{
    return mk_as_float((unsigned)p[0] | (unsigned)p[1] << 8 | (unsigned)p[2] << 16 | (unsigned)p[3] << 24);
}

MK_INLINE long long mk_w4_gsize(int t)
{
    return t == MK_DT_W4G32 ? 32 : t == MK_DT_W4G64 ? 64 : 128;
}

MK_INLINE long long mk_w4_group_bytes(long long len)
{
    return 4 + 16 * ((len + 31) / 32);
}

/* Bytes of a row of k elements (ir/dtype.c's dtype_row_bytes). */
MK_INLINE long long mk_row_bytes(int t, long long k)
{
    long long g;
    switch (t) {
    case MK_DT_F32: return 4 * k;
    case MK_DT_F16: case MK_DT_BF16: return 2 * k;
    case MK_DT_Q8_0: return k / 32 * 34;
    case MK_DT_Q4_0: return k / 32 * 18;
    case MK_DT_Q4_1: return k / 32 * 20;
    case MK_DT_Q5_0: return k / 32 * 22;
    case MK_DT_Q5_1: return k / 32 * 24;
    case MK_DT_Q4_K: return k / 256 * 144;
    case MK_DT_Q5_K: return k / 256 * 176;
    case MK_DT_Q6_K: return k / 256 * 210;
    case MK_DT_Q3_K: return k / 256 * 110;
    case MK_DT_Q2_K: return k / 256 * 84;
    case MK_DT_IQ4_NL: return k / 32 * 18;
    case MK_DT_IQ4_XS: return k / 256 * 136;
    case MK_DT_W8: return 4 + (k + 3) / 4 * 4;
    default:
        g = mk_w4_gsize(t);
        return k / g * mk_w4_group_bytes(g) + (k % g ? mk_w4_group_bytes(k % g) : 0);
    }
}

/* ---- CUDA-ordered block rows (compiler/quant.c: the CUDA kernel's byte
 * order) ----
 * A Q4_0, Q4_1, Q8_0 or W4G<G> row holds nh headers of hb bytes (Q4_0,
 * Q8_0: {f16 d}; Q4_1: {f16 d; f16 m}; W4: {f16 s; u8 z; u8 0}, one per
 * group) and nd bytes of data, 16-byte chunks in order: 32 elements of
 * nibbles (byte i of a chunk: element i low, 16 + i high) or 16 int8s
 * of Q8_0. The first h0 headers come first, then the data, then the
 * others: h0 = min(nh, o / hb) for the o bytes from the row's start to
 * the next 16-byte boundary, so that the data is 16-byte aligned
 * whenever the headers reach the boundary. */
typedef struct {
    const unsigned char *row, *data;
    int hb, nh, h0, nd, lc; /* chunk c's header is c >> lc */
} MkPlanar;

MK_INLINE int mk_is_planar(int t)
{
    return t == MK_DT_Q4_0 || t == MK_DT_Q4_1 || t == MK_DT_Q8_0 || t == MK_DT_W4G32 || t == MK_DT_W4G64 ||
           t == MK_DT_W4G128;
}

MK_INLINE MkPlanar mk_planar(int t, const unsigned char *row, int k)
{
    MkPlanar p;
    int G = t == MK_DT_W4G64 ? 64 : t == MK_DT_W4G128 ? 128 : 32;
    p.row = row;
    p.hb = t == MK_DT_Q4_0 || t == MK_DT_Q8_0 ? 2 : 4;
    p.nh = (k + G - 1) / G;
    p.nd = t == MK_DT_Q8_0 ? k : 16 * ((k + 31) / 32);
    p.lc = t == MK_DT_W4G64 || t == MK_DT_Q8_0 ? 1 : t == MK_DT_W4G128 ? 2 : 0;
    int o = (int)((16u - ((unsigned)(unsigned long long)row & 15u)) & 15u);
    p.h0 = o / p.hb < p.nh ? o / p.hb : p.nh;
    p.data = row + p.h0 * p.hb;
    return p;
}

/* The 16-byte chunks of a row of k elements. */
MK_INLINE int mk_planar_chunks(int t, int k)
{
    return t == MK_DT_Q8_0 ? k / 16 : (k + 31) / 32;
}

/* Header i: its first 4 bytes (hb = 4), or its 2 (hb = 2). */
MK_INLINE unsigned mk_planar_hdr(MkPlanar p, int i)
{
    const unsigned char *h = p.row + p.hb * i + (i >= p.h0 ? p.nd : 0);
    return p.hb == 4 ? mk_ldwu((const unsigned *)(const void *)h) : mk_ldwus((const unsigned short *)(const void *)h);
}

/* The weight of element j: W4 s (q - z), Q4_0 d (q - 8), Q4_1 d q then
 * + m, Q8_0 d q (one rounding each, as compiler/quant.c). */
MK_INLINE float mk_planar_elem(int t, MkPlanar p, int j)
{
    if (t == MK_DT_Q8_0)
        return mk_f16(mk_planar_hdr(p, j >> 5)) * (float)(signed char)p.data[j];
    unsigned h = mk_planar_hdr(p, (j >> 5) >> p.lc), b = p.data[16 * (j >> 5) + (j & 15)];
    int q = (int)((j & 16) ? b >> 4 : b & 15u);
    if (t == MK_DT_Q4_1)
        return mk_f16(h) * (float)q + mk_f16(h >> 16);
    return mk_f16(h) * (float)(q - (t == MK_DT_Q4_0 ? 8 : (int)((h >> 16) & 0xffu)));
}

MK_INLINE unsigned mk_u32_at(const unsigned char *p)
{
    return (unsigned)p[0] | (unsigned)p[1] << 8 | (unsigned)p[2] << 16 | (unsigned)p[3] << 24;
}

/* Q5_0/Q5_1 element e (< 32) of block b: the nibble and bit e of qh. */
MK_INLINE int mk_q5(const unsigned char *b, int q51, int e)
{
    const unsigned char *qs = b + (q51 ? 8 : 6);
    return (e < 16 ? qs[e] & 15 : qs[e - 16] >> 4) | (int)(mk_u32_at(b + (q51 ? 4 : 2)) >> e & 1u) << 4;
}

/* Sub-block s's 6-bit scale (*d) and min (*m) of a Q4_K/Q5_K super-block
 * (ggml's get_scale_min_k4). */
MK_INLINE void mk_kq_scale_min(const unsigned char *sc, int s, float *d, float *m)
{
    int a = s < 4 ? sc[s] & 63 : (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
    int b = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    *d = (float)a;
    *m = (float)b;
}

/* Element 32s + l of a Q4_K/Q5_K super-block b as an integer. */
MK_INLINE int mk_q45k(const unsigned char *b, int q5, int s, int l)
{
    const unsigned char *qs = b + (q5 ? 48 : 16) + 32 * (s / 2);
    int q = s % 2 ? qs[l] >> 4 : qs[l] & 15;
    return q5 ? q + ((b[16 + l] >> s & 1) << 4) : q;
}

/* Element 128h + 32i + l of a Q6_K super-block b, minus 32. */
MK_INLINE int mk_q6k(const unsigned char *b, int h, int i, int l)
{
    const unsigned char *ql = b + 64 * h + l + 32 * (i & 1), *qh = b + 128 + 32 * h + l;
    int lo = i < 2 ? ql[0] & 15 : ql[0] >> 4;
    return (lo | ((qh[0] >> (2 * i)) & 3) << 4) - 32;
}

/* IQ4's non-linear value of nibble n (ggml's kvalues_iq4nl: -127, -104,
 * -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113), by a
 * byte permute of the values as int8 (an indexed array would live in
 * local memory). */
MK_INLINE float mk_iq4(int n)
{
    unsigned s = (unsigned)n & 7u;
    unsigned v = n & 8 ? mk_prmt(0x26190d01u, 0x71594535u, s) : mk_prmt(0xbfad9881u, 0xf6eaddcfu, s);
    return (float)(signed char)(v & 0xffu);
}

/* Element e (< 256) of a Q3_K, Q2_K or IQ4_XS super-block b (layouts:
 * ir/dtype.h), dequantized as compiler/quant.c does. */
MK_INLINE float mk_lowbit_elem(int t, const unsigned char *b, int e)
{
    int h = e / 128, i = e % 128 / 32, l = e % 32, s = e / 16;
    if (t == MK_DT_Q2_K) {
        int q = b[16 + 32 * h + l] >> (2 * i) & 3;
        return mk_f16_at(b + 80) * (float)(b[s] & 15) * (float)q - mk_f16_at(b + 82) * (float)(b[s] >> 4);
    }
    if (t == MK_DT_Q3_K) {
        const unsigned char *sc = b + 96;
        int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4, hi = sc[8 + s % 4] >> (2 * (s / 4)) & 3;
        int q = (b[32 + 32 * h + l] >> (2 * i) & 3) - ((b[l] >> (4 * h + i) & 1) ? 0 : 4);
        return mk_f16_at(b + 108) * (float)((lo | hi << 4) - 32) * (float)q;
    }
    int sb = e / 32, ls = (b[4 + sb / 2] >> (4 * (sb % 2)) & 15) | ((b[2] | b[3] << 8) >> (2 * sb) & 3) << 4;
    const unsigned char *qs = b + 8 + 16 * sb;
    return mk_f16_at(b) * (float)(ls - 32) * mk_iq4(l < 16 ? qs[l] : qs[l - 16] >> 4);
}

/* Element j of a row of k elements of dtype t, dequantized. */
MK_INLINE float mk_qelem(int t, const unsigned char *row, long long k, long long j)
{
    const unsigned char *b;
    switch (t) {
    case MK_DT_F32: return mk_f32_at(row + 4 * j);
    case MK_DT_F16: return mk_f16_at(row + 2 * j);
    case MK_DT_BF16: return mk_bf16_at(row + 2 * j);
    case MK_DT_Q8_0: case MK_DT_Q4_0: case MK_DT_Q4_1:
        return mk_planar_elem(t, mk_planar(t, row, (int)k), (int)j);
    case MK_DT_Q5_0:
        if (!MK_HAS_DT(MK_DT_Q5_0))
            break;
        b = row + j / 32 * 22;
        return mk_f16_at(b) * (float)(mk_q5(b, 0, (int)(j % 32)) - 16);
    case MK_DT_Q5_1: {
        if (!MK_HAS_DT(MK_DT_Q5_1))
            break;
        b = row + j / 32 * 24;
        float lo = mk_f16_at(b) * (float)mk_q5(b, 1, (int)(j % 32));
        return lo + mk_f16_at(b + 2);
    }
    case MK_DT_Q4_K: case MK_DT_Q5_K: {
        if (!MK_HAS_KQ)
            break;
        int q5 = t == MK_DT_Q5_K, e = (int)(j % 256);
        float sc, m;
        b = row + j / 256 * (q5 ? 176 : 144);
        mk_kq_scale_min(b + 4, e / 32, &sc, &m);
        return mk_f16_at(b) * sc * (float)mk_q45k(b, q5, e / 32, e % 32) - mk_f16_at(b + 2) * m;
    }
    case MK_DT_Q6_K: {
        if (!MK_HAS_DT(MK_DT_Q6_K))
            break;
        int e = (int)(j % 256);
        b = row + j / 256 * 210;
        return mk_f16_at(b + 208) * (float)(signed char)b[192 + 8 * (e / 128) + 2 * (e % 128 / 32) + e % 32 / 16] *
               (float)mk_q6k(b, e / 128, e % 128 / 32, e % 32);
    }
    case MK_DT_Q3_K: case MK_DT_Q2_K: case MK_DT_IQ4_XS:
        if (!(MK_HAS_DT(MK_DT_Q3_K) | MK_HAS_DT(MK_DT_Q2_K) | MK_HAS_DT(MK_DT_IQ4_XS)))
            break;
        return mk_lowbit_elem(t, row + j / 256 * mk_row_bytes(t, 256), (int)(j % 256));
    case MK_DT_IQ4_NL:
        if (!MK_HAS_DT(MK_DT_IQ4_NL))
            break;
        b = row + j / 32 * 18;
        return mk_f16_at(b) * mk_iq4(j % 32 < 16 ? b[2 + j % 16] : b[2 + j % 16] >> 4);
    case MK_DT_W8:
        if (!MK_HAS_DT(MK_DT_W8))
            break;
        return mk_f32_at(row) * (float)(signed char)row[4 + j];
    default:
        if (!MK_HAS_W4)
            break;
        return mk_planar_elem(t, mk_planar(t, row, (int)k), (int)j);
    }
    return 0.0f;    /* a dtype the schedule does not use */
}

/* Byte i of v as the float 2^23 + byte (exact): the byte lands in the low
 * mantissa of 0x4b000000 (one byte permute, no int-to-float convert). */
MK_INLINE float mk_byte_f(unsigned v, unsigned i)
{
    return mk_as_float(mk_prmt(v, 0x4b000000u, 0x7540u + i));
}

/* sum q x over the four signed bytes of word v and x (4 elements):
 * q = (2^23 + (byte ^ 0x80)) - (2^23 + 128), exact. */
MK_INLINE float mk_dot_s8x4(unsigned v, float4 x)
{
    const float off = 8388736.0f;
    v ^= 0x80808080u;
    return (mk_byte_f(v, 0) - off) * x.x + (mk_byte_f(v, 1) - off) * x.y + (mk_byte_f(v, 2) - off) * x.z +
           (mk_byte_f(v, 3) - off) * x.w;
}

/* A W8 row's bytes as mk_dot_w8 reads them: *head bytes up to the first
 * 16-byte boundary, then *nv uint4s from *qv. */
MK_INLINE void mk_w8_span(const unsigned char *row, int k, int *head, int *nv, const uint4 **qv)
{
    const unsigned char *q = row + 4;
    int h = (int)((16u - ((unsigned)(unsigned long long)q & 15u)) & 15u);
    if (h > k)
        h = k;
    *head = h;
    *nv = (k - h) / 16;
    *qv = (const uint4 *)(const void *)(q + h);
}

/* W8 row: {f32 s; i8 q[k]; pad}; returns s * sum(q x) over uint4s [j0,
 * j1) of it (j0 a multiple of 32; a slice of the split path, or all),
 * read by the nl lanes of this lane's group (lane: its index there). The
 * bytes from the first 16-byte boundary on are read as uint4s (MK_VLOADS
 * in flight per lane; the first round is pre when use_pre) against
 * float4s of x (x staged with mask m: mk_xsw); the few before that
 * boundary and after the last whole uint4 one byte per lane, by the slice
 * at j0 = 0 (none when j1 = 0: a group with no row). x must be 16-byte
 * aligned (the boundary is 4, 8 or 12 bytes in, so the data's x starts at
 * a float4). */
MK_INLINE float mk_dot_w8(const unsigned char *row, const float *x, int k, unsigned lane, int m, int j0, int j1,
                          const uint4 pre[MK_PRE_N], int use_pre, int nl)
{
    const unsigned char *q = row + 4;
    int head, nv;
    const uint4 *qv;
    mk_w8_span(row, k, &head, &nv, &qv);
    int tail0 = head + 16 * nv;
    nv = j1 < nv ? j1 : nv;
    const float4 *x4 = (const float4 *)(const void *)x;
    /* word c of unit lane + nl u multiplies float4 f + c + 4 nl u of x,
     * staged at mk_xsw(f + c, m) + 4 nl u (4 nl >= 32 float4s: commutes) */
    int f = head / 4 + 4 * (int)lane;
    int q0 = mk_xsw(f, m), q1 = mk_xsw(f + 1, m), q2 = mk_xsw(f + 2, m), q3 = mk_xsw(f + 3, m);
    float acc = 0.0f;
    for (int i = (int)lane; j0 == 0 && j1 > 0 && i < head; i += nl)
        acc += (float)(signed char)q[i] * mk_xs_at(x, i, m);
    for (int i = tail0 + (int)lane; j0 == 0 && j1 > 0 && i < k; i += nl)
        acc += (float)(signed char)q[i] * mk_xs_at(x, i, m);
    uint4 w[MK_VLOADS];
    int j = j0 + (int)lane;
    mk_round_first(qv, j, nv, pre, use_pre, w, nl);
#pragma unroll 1
    while (j < nv) {
#pragma unroll
        for (int u = 0; u < MK_VLOADS; u++)
            if (j + nl * u < nv) {
                int o = 4 * (j - (int)lane + nl * u);
                acc += mk_dot_s8x4(w[u].x, mk_xld4(x4 + q0 + o)) + mk_dot_s8x4(w[u].y, mk_xld4(x4 + q1 + o)) +
                       mk_dot_s8x4(w[u].z, mk_xld4(x4 + q2 + o)) + mk_dot_s8x4(w[u].w, mk_xld4(x4 + q3 + o));
            }
        j += nl * MK_VLOADS;
        if (j < nv)
            mk_round_load(qv, j, nv, w, nl);
    }
    return mk_f32_at(row) * mk_group_sum(acc, nl);
}

/* The dot product of CUDA-ordered chunk c (16 bytes w, its header h) and
 * x (staged with mask m): nibbles (q - z) x summed in floats, each nibble
 * (2^23 + q) - (2^23 + z) by one byte permute (exact), then scaled (Q4_1:
 * d sum q x + m sum x); Q8_0's 16 int8s as W8's. Word i of a nibble chunk
 * holds float4 8c + i of x in its low nibbles and 8c + 4 + i in its high
 * ones; of a Q8_0 chunk, float4 4c + i. */
MK_INLINE float mk_planar_chunk(int t, uint4 w, unsigned h, const float4 *x4, int m, int c)
{
    if (t == MK_DT_Q8_0) {
        int f = 4 * c;
        return mk_f16(h) * (mk_dot_s8x4(w.x, mk_xld4(x4 + mk_xsw(f, m))) + mk_dot_s8x4(w.y, mk_xld4(x4 + mk_xsw(f + 1, m))) +
                            mk_dot_s8x4(w.z, mk_xld4(x4 + mk_xsw(f + 2, m))) + mk_dot_s8x4(w.w, mk_xld4(x4 + mk_xsw(f + 3, m))));
    }
    int z = t == MK_DT_Q4_0 ? 8 : t == MK_DT_Q4_1 ? 0 : (int)((h >> 16) & 0xffu), f = 8 * c;
    float off = 8388608.0f + (float)z, sq = 0.0f, sx = 0.0f;
    unsigned v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        unsigned l = v[i] & 0x0f0f0f0fu, hi = (v[i] >> 4) & 0x0f0f0f0fu;
        float4 xl = mk_xld4(x4 + mk_xsw(f + i, m)), xh = mk_xld4(x4 + mk_xsw(f + 4 + i, m));
        sq += (mk_byte_f(l, 0) - off) * xl.x + (mk_byte_f(l, 1) - off) * xl.y + (mk_byte_f(l, 2) - off) * xl.z +
              (mk_byte_f(l, 3) - off) * xl.w + (mk_byte_f(hi, 0) - off) * xh.x + (mk_byte_f(hi, 1) - off) * xh.y +
              (mk_byte_f(hi, 2) - off) * xh.z + (mk_byte_f(hi, 3) - off) * xh.w;
        if (t == MK_DT_Q4_1)
            sx += (xl.x + xl.y) + (xl.z + xl.w) + (xh.x + xh.y) + (xh.z + xh.w);
    }
    return t == MK_DT_Q4_1 ? mk_f16(h) * sq + mk_f16(h >> 16) * sx : mk_f16(h) * sq;
}

/* One warp's dot product of chunks [c0, c1) of a CUDA-ordered block row
 * (mk_planar) and x (staged with mask m; 16-byte aligned), reduced so
 * that every lane holds it. Lanes take chunks c0 + lane + 32 u, MK_VLOADS
 * 16-byte loads in flight per lane, each with its header beside it (the
 * lanes of a group read one word: one L1 line for the warp). Elements one
 * at a time where a chunk runs past k (W4 with 32 not dividing k) or the
 * row's data is not 16-byte aligned (a row too short for its headers to
 * reach the boundary). t is a constant in each copy (mk_dot_planar), so
 * that the layout's sizes fold away. */
MK_INLINE float mk_dot_planar_t(const int t, const unsigned char *row, const float *x, int m, int k, int c0, int c1,
                                unsigned lane, int nl)
{
    MkPlanar p = mk_planar(t, row, k);
    int e = t == MK_DT_Q8_0 ? 16 : 32, whole = k / e, j1 = c1 * e < k ? c1 * e : k;
    int c2 = ((unsigned long long)p.data & 15u) ? c0 : c1 < whole ? c1 : whole;
    c2 = c2 > c0 ? c2 : c0;
    const uint4 *dv = (const uint4 *)(const void *)p.data;
    const float4 *x4 = (const float4 *)(const void *)x;
    float acc = 0.0f;
#pragma unroll 1
    for (int c = c0 + (int)lane; c < c2; c += nl * MK_VLOADS) {
        uint4 w[MK_VLOADS];
        unsigned h[MK_VLOADS];
#pragma unroll
        for (int u = 0; u < MK_VLOADS; u++)
            if (c + nl * u < c2) {
                w[u] = mk_ldw4(dv + c + nl * u);
                h[u] = mk_planar_hdr(p, (c + nl * u) >> p.lc);
            }
#pragma unroll
        for (int u = 0; u < MK_VLOADS; u++)
            if (c + nl * u < c2)
                acc += mk_planar_chunk(t, w[u], h[u], x4, m, c + nl * u);
    }
    for (int j = c2 * e + (int)lane; j < j1; j += nl)
        acc += mk_planar_elem(t, p, j) * mk_xs_at(x, j, m);
    return mk_group_sum(acc, nl);
}

MK_INLINE float mk_dot_planar(int t, const unsigned char *row, const float *x, int m, int k, int c0, int c1,
                              unsigned lane, int nl)
{
#define MK_PLANAR_CASE(T)                                          \
    if (MK_HAS_DT(T) && t == (T))                                  \
        return mk_dot_planar_t((T), row, x, m, k, c0, c1, lane, nl);
    MK_PLANAR_CASE(MK_DT_Q4_0)
    MK_PLANAR_CASE(MK_DT_Q4_1)
    MK_PLANAR_CASE(MK_DT_Q8_0)
    MK_PLANAR_CASE(MK_DT_W4G32)
    MK_PLANAR_CASE(MK_DT_W4G64)
    MK_PLANAR_CASE(MK_DT_W4G128)
#undef MK_PLANAR_CASE
    return 0.0f;
}

/* A k-quant row (Q4_K, Q5_K, Q6_K): lane l takes element l of every
 * 32 of a super-block, so each lane applies every sub-block's scale to
 * its own products. Q4_K/Q5_K: sum_s (d sc_s) q x - (dmin m_s) x. */
MK_INLINE float mk_dot_kq(int t, const unsigned char *row, const float *x, int k, unsigned lane)
{
    float acc = 0.0f;
    int l = (int)lane;
    if (MK_HAS_DT(MK_DT_Q6_K) && t == MK_DT_Q6_K) {
        for (int j = 0; j < k; j += 256, row += 210) {
            float d = mk_f16_at(row + 208);
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < 4; i++)
                    acc += (d * (float)(signed char)row[192 + 8 * h + 2 * i + l / 16]) *
                           ((float)mk_q6k(row, h, i, l) * x[j + 128 * h + 32 * i + l]);
        }
        return mk_warp_sum(acc);
    }
    int q5 = t == MK_DT_Q5_K;
    for (int j = 0; MK_HAS_KQ && j < k; j += 256, row += q5 ? 176 : 144) {
        float d = mk_f16_at(row), dmin = mk_f16_at(row + 2);
        for (int s = 0; s < 8; s++) {
            float sc, m, xv = x[j + 32 * s + l];
            mk_kq_scale_min(row + 4, s, &sc, &m);
            acc += (d * sc) * ((float)mk_q45k(row, q5, s, l) * xv) - (dmin * m) * xv;
        }
    }
    return mk_warp_sum(acc);
}

/* One group of nl lanes' dot product of a stored row with x (lane: the
 * index in the group; ok 0: the group has no row, and gives 0 after the
 * same shuffles), reduced so that every lane of the group holds it: W8
 * and the CUDA-ordered block rows by their own dots, the rest (f16, Q5_0,
 * Q5_1) element by element, lanes on consecutive elements; k-quants with
 * nl = 32 only (mk_gemv_nl). x is staged with mask m (mk_gemv_xmask). */
MK_INLINE float mk_dot_qrow(int t, const unsigned char *row, const float *x, int k, unsigned lane, int m,
                            const uint4 pre[MK_PRE_N], int use_pre, int nl, int ok)
{
    if (MK_HAS_DT(MK_DT_W8) && t == MK_DT_W8)
        return mk_dot_w8(row, x, k, lane, m, 0, ok ? k : 0, pre, use_pre, nl);
    if (MK_HAS_PLANAR && mk_is_planar(t))
        return mk_dot_planar(t, row, x, m, k, 0, ok ? mk_planar_chunks(t, k) : 0, lane, nl);
    if ((MK_HAS_KQ || MK_HAS_DT(MK_DT_Q6_K)) && (t == MK_DT_Q4_K || t == MK_DT_Q5_K || t == MK_DT_Q6_K))
        return mk_dot_kq(t, row, x, k, lane);
    float acc = 0.0f;
    for (int j = (int)lane; ok && j < k; j += nl)
        acc += mk_qelem(t, row, k, j) * mk_xs_at(x, j, m);
    return mk_group_sum(acc, nl);
}

/* ---- op bodies ---- */

/* out[c0:c1] = table[tok[0]][c0:c1], dequantized from the table's dtype;
 * an out-of-range token gives zeros. */
MK_DEV void op_embed(const MegacArgs *a, const unsigned *in)
{
    int tok = *(const int *)mk_opnd(a, in, 0), t = mk_dtype(in, 1);
    const float *table = (const float *)mk_opnd(a, in, 1);
    float *out = (float *)mk_opnd(a, in, 2);
    int c0 = mk_param(in, 0), c1 = mk_param(in, 1);
    int ok = tok >= 0 && tok < MK_VOCAB, bf = t == MK_DT_BF16;
    const unsigned char *row = (const unsigned char *)(const void *)table + (ok ? tok : 0) * mk_row_bytes(t, MK_DIM);
    for (int j = c0 + (int)mk_tid(); j < c1; j += MK_THREADS) {
        long long e = (long long)tok * MK_DIM + j;
        if (t != MK_DT_F32 && !bf)
            out[j] = ok ? mk_qelem(t, row, MK_DIM, j) : 0.0f;
        else
            out[j] = !ok ? 0.0f : bf ? mk_bf16(((const unsigned short *)(const void *)table)[e]) : table[e];
    }
}

MK_DEV void op_rmsnorm(const MegacArgs *a, const unsigned *in)
{
    const float *x = (const float *)mk_opnd(a, in, 0), *w = (const float *)mk_opnd(a, in, 1);
    float *out = (float *)mk_opnd(a, in, 2);
    int n = mk_param(in, 0);
    float s = mk_rms_scale(x, n);
    for (int j = (int)mk_tid(); j < n; j += MK_THREADS)
        out[j] = x[j] * s * w[j];
}

/* Weight unit e (w: 8 bf16 or 4 f32) times its elements of x. */
MK_INLINE float mk_unit_dot(uint4 w, int bf, const float4 *x4, unsigned e, int m)
{
    if (bf) {
        float4 xa = mk_xld4(x4 + mk_xsw(2 * (int)e, m)), xb = mk_xld4(x4 + mk_xsw(2 * (int)e + 1, m));
        return mk_bf16_lo(w.x) * xa.x + mk_bf16_hi(w.x) * xa.y + mk_bf16_lo(w.y) * xa.z + mk_bf16_hi(w.y) * xa.w +
               mk_bf16_lo(w.z) * xb.x + mk_bf16_hi(w.z) * xb.y + mk_bf16_lo(w.w) * xb.z + mk_bf16_hi(w.w) * xb.w;
    }
    float4 xa = mk_xld4(x4 + mk_xsw((int)e, m));
    return mk_as_float(w.x) * xa.x + mk_as_float(w.y) * xa.y + mk_as_float(w.z) * xa.z + mk_as_float(w.w) * xa.w;
}

/* One group of nl lanes' dot product of units [j0, j1) of a weight row
 * (f32: 4 weights per 16-byte unit, bf16: 8) and the input (staged with
 * mask m), reduced so that every lane of the group holds it (lane: the
 * index in the group): MK_VLOADS loads in flight per lane (the last
 * round's loads predicated, so that a row of up to nl * MK_VLOADS units
 * is one round trip to memory); the first round is pre when use_pre. */
MK_INLINE float mk_dot_units(const uint4 *w4, int bf, const float4 *x4, int m, int j0, int j1, unsigned lane,
                              const uint4 pre[MK_PRE_N], int use_pre, int nl)
{
    float acc[MK_VLOADS];
#pragma unroll
    for (int u = 0; u < MK_VLOADS; u++)
        acc[u] = 0.0f;
    uint4 w[MK_VLOADS];
    int j = j0 + (int)lane;
    mk_round_first(w4, j, j1, pre, use_pre, w, nl);
#pragma unroll 1
    while (j < j1) {
#pragma unroll
        for (int u = 0; u < MK_VLOADS; u++) {
            if (j + nl * u >= j1)
                continue;
            acc[u] += mk_unit_dot(w[u], bf, x4, (unsigned)(j + nl * u), m);
        }
        j += nl * MK_VLOADS;
        if (j < j1)
            mk_round_load(w4, j, j1, w, nl);
    }
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < MK_VLOADS; u++)
        s += acc[u];
    return mk_group_sum(s, nl);
}

/* A row whose length is not a multiple of the vector width. */
MK_INLINE float mk_dot1(const void *w, int bf, const float *x, int k, unsigned lane)
{
    float a0 = 0.0f;
    for (int j = (int)lane; j < k; j += 32)
        a0 += (bf ? mk_bf16(((const unsigned short *)w)[j]) : ((const float *)w)[j]) * x[j];
    return mk_warp_sum(a0);
}

/* Elements per 16-byte load for a weight dtype. */
#define MK_UNIT(bf) ((bf) ? 8 : 4)

/* Row r of an f32 or bf16 W with k columns, as 16-byte units. */
MK_INLINE const uint4 *mk_row_units(MkStage st, const void *W, int bf, long long r, int k)
{
    return (const uint4 *)(const void *)mk_wrow(st, W, r, (long long)k * (bf ? 2 : 4));
}

MK_INLINE void mk_gemv_store(float *y, const float *b, int r, float v, int flags)
{
    if (flags & MK_GEMV_BIAS)
        v += b[r];
    y[r] = (flags & MK_GEMV_ACCUM) ? y[r] + v : v;
}

/* Fewer rows than warps (2 * rows <= warps; rows of ku 16-byte units:
 * f32 or bf16 with k a multiple of the unit, or CUDA-ordered block rows'
 * chunks): `split` warps share each row, each taking a contiguous slice
 * of it (a multiple of 32 units). This warp's row (nrows and more: none)
 * and slice [*j0, *j1) of units. */
MK_INLINE int mk_split_slice(int nrows, int ku, unsigned warp, int *j0, int *j1)
{
    int split = MK_NWARPS / nrows, row = (int)warp / split, part = (int)warp % split;
    int chunk = ((ku + split - 1) / split + 31) / 32 * 32;
    *j0 = part * chunk;
    *j1 = *j0 + chunk < ku ? *j0 + chunk : ku;
    return row;
}

/* A GEMV's 16-byte units per row on the split path. */
MK_INLINE int mk_split_units(int t, int bf, int k)
{
    if (MK_HAS_DT(MK_DT_W8) && t == MK_DT_W8)
        return k / 16; /* at least a row's whole uint4s (mk_dot_w8 clips) */
    return MK_HAS_PLANAR && mk_is_planar(t) ? mk_planar_chunks(t, k) : k / MK_UNIT(bf);
}

/* The slices' sums meet in shared memory and are added in a fixed order. */
MK_DEV void mk_gemv_split(MkStage st, const void *W, int t, int bf, const float *xin, int m, float *y, const float *b,
                          int r0, int nrows, int k, int flags, const uint4 pre[MK_PRE_N], int use_pre)
{
    unsigned tid = mk_tid(), lane = tid & 31u, warp = tid >> 5;
    int split = MK_NWARPS / nrows, j0, j1, row = mk_split_slice(nrows, mk_split_units(t, bf, k), warp, &j0, &j1);
    if (row < nrows) {
        const unsigned char *qr = mk_wrow(st, W, r0 + row, mk_row_bytes(t, k));
        const uint4 *w = (const uint4 *)(const void *)qr;
        /* use_pre a constant in each call, so that pre is dead once
         * copied (a select would keep pre and a loaded round both live) */
        float v = MK_HAS_PLANAR && mk_is_planar(t) ? mk_dot_planar(t, qr, xin, m, k, j0, j1, lane, 32)
                  : MK_HAS_DT(MK_DT_W8) && t == MK_DT_W8
                      ? (use_pre ? mk_dot_w8(qr, xin, k, lane, m, j0, j1, pre, 1, 32)
                                 : mk_dot_w8(qr, xin, k, lane, m, j0, j1, pre, 0, 32))
                  : use_pre ? mk_dot_units(w, bf, (const float4 *)xin, m, j0, j1, lane, pre, 1, 32)
                            : mk_dot_units(w, bf, (const float4 *)xin, m, j0, j1, lane, pre, 0, 32);
        if (lane == 0)
            mk_red[warp] = v;
    }
    mk_sync();
    if ((int)tid < nrows) {
        float v = 0.0f;
        for (int p = 0; p < split; p++)
            v += mk_red[(int)tid * split + p];
        mk_gemv_store(y, b, r0 + (int)tid, v, flags);
    }
}

/* How GEMV `in` reads its weights. */
enum { MK_GEMV_QROW, MK_GEMV_SPLIT, MK_GEMV_ROWS, MK_GEMV_ODD };

MK_INLINE int mk_gemv_path(const unsigned *in, int *bf)
{
    int t = mk_dtype(in, 0), r0 = mk_param(in, 0), r1 = mk_param(in, 1), k = mk_param(in, 2);
    int few = r1 > r0 && 2 * (r1 - r0) <= MK_NWARPS;
    *bf = MK_HAS_DT(MK_DT_BF16) && t == MK_DT_BF16;
    if ((MK_HAS_PLANAR && mk_is_planar(t)) || (MK_HAS_DT(MK_DT_W8) && t == MK_DT_W8))
        return few ? MK_GEMV_SPLIT : MK_GEMV_QROW;
    if (MK_HAS_QROW && t != MK_DT_F32 && !*bf)
        return MK_GEMV_QROW; /* f16 and the other quantized formats: dequantized in mk_dot_qrow */
    if (k % MK_UNIT(*bf))
        return MK_GEMV_ODD;
    return few ? MK_GEMV_SPLIT : MK_GEMV_ROWS;
}

/* Lanes per row on the ROWS and QROW paths: where a row's 16-byte units
 * fit in half a round of MK_VLOADS loads, half as many lanes read it
 * (down to MK_ROW_LANES_MIN), so that a warp has 32 / nl rows' loads in
 * flight at once rather than one row's in a round that is half empty (a
 * W8 row of k = 2048, 128 units: two rows a round at 16 lanes; bf16 k =
 * 576, 72 units: two at 16; W4G128 k = 2048, 64 chunks: four at 8). f32,
 * bf16, W8 and, with MK_ROW_LANES_BLOCKS, the CUDA-ordered block rows
 * (Q4_0/1, Q8_0, W4); 32 where a lane reads elements one by one (f16,
 * Q5_0/1, k-quants, odd k). MEGAC_CUDA_DEFINES=MK_ROW_LANES_MIN=32 keeps a
 * row per warp, to time against. */
#ifndef MK_ROW_LANES_MIN
#define MK_ROW_LANES_MIN 8
#endif
/* MK_ROW_LANES_BLOCKS (the layout's: cuda_source.c) 1 lets the block
 * formats' short rows take fewer lanes too; cg_cuda_compile turns it off
 * where the kernel spills with it (W4A16 on sm_120), before it takes
 * loads in flight away. */
#ifndef MK_ROW_LANES_BLOCKS
#define MK_ROW_LANES_BLOCKS 0
#endif
/* MK_NL_USED (the layout's) which of the copies for 8, 16 and 32 lanes
 * (bits 0, 1, 2) are compiled; a width left out reads at 32. */
#ifndef MK_NL_USED
#define MK_NL_USED 7
#endif
/* MK_NL_ONE_ROW 1: where a worker's share of a GEMV whose loads can go out
 * before its wait (f32, bf16, W8) is no more rows than it has warps, each
 * warp reads its row with 32 lanes and those preloads. Rows side by side
 * save round trips only where a warp has rows one after another (the 1B
 * shape's gate/up, every lm_head); with a row a warp or less they only
 * cost the preloads (on the H200 SmolLM2-135M's W8A16 ran 1.06x faster
 * with every row at 32 lanes, whose gate/up are 12 rows a worker; the 1B
 * shape's 1.04x slower). Not yet timed itself, so 0 (fewer lanes by the
 * row's length alone, as timed) until gpu-check's onerow variants say.
 * The block formats take no preloads: their short rows go side by side
 * either way. */
#ifndef MK_NL_ONE_ROW
#define MK_NL_ONE_ROW 0
#endif
/* Lanes per row for a row of n loads (16-byte units or block chunks),
 * among the copies compiled. */
MK_INLINE int mk_gemv_nl_of(int n)
{
    int nl = 32;
    while (nl > MK_ROW_LANES_MIN && n <= nl / 2 * MK_VLOADS)
        nl /= 2;
    return MK_NL_USED & (nl == 8 ? 1 : nl == 16 ? 2 : 4) ? nl : 32;
}
MK_INLINE int mk_gemv_nl(int t, int bf, int k, int path, int nrows)
{
    int n;
    if (path == MK_GEMV_ROWS)
        n = k / MK_UNIT(bf);
    else if (path == MK_GEMV_QROW && MK_HAS_DT(MK_DT_W8) && t == MK_DT_W8)
        n = k / 16; /* its uint4s, at most (the head and tail bytes are read apart) */
    else if (MK_ROW_LANES_BLOCKS && path == MK_GEMV_QROW && MK_HAS_PLANAR && mk_is_planar(t))
        return mk_gemv_nl_of(mk_planar_chunks(t, k));
    else
        return 32;
    if (MK_NL_ONE_ROW && MK_PRELOADS > 0 && nrows <= MK_NWARPS)
        return 32;
    return mk_gemv_nl_of(n);
}

/* The swizzle mask of GEMV `in`'s staged input (mk_xsw): U - 1 for the
 * U float4s of x a 16-byte weight load meets (bf16 2, W8 and Q8_0 4,
 * nibbles 8); 0 where a lane reads one float4 per load (f32) or reads x
 * another way.
 * MEGAC_CUDA_DEFINES=MK_XSWIZZLE=0 stages every input in order, to time
 * the swizzle against. */
#ifndef MK_XSWIZZLE
#define MK_XSWIZZLE 1
#endif
MK_INLINE int mk_gemv_xmask(const unsigned *in, int path, int bf)
{
    if (!MK_XSWIZZLE)
        return 0;
    int t = mk_dtype(in, 0);
    if (MK_HAS_PLANAR && mk_is_planar(t))
        return t == MK_DT_Q8_0 ? 3 : 7;
    if (MK_HAS_DT(MK_DT_W8) && t == MK_DT_W8)
        return 3;
    if (path == MK_GEMV_QROW)
        return 0;
    return path != MK_GEMV_ODD && bf ? 1 : 0;
}

/* Issues this lane's first round of weight loads of GEMV `in` (the loads
 * its row loop would issue first) into pre; 0 when there is none to issue
 * early: the weights are read another way (f16, quantized but W8, a k
 * that is not a multiple of the unit), or this warp has no row. The
 * weights never change during a step (the arena's buffers do: a GEMV
 * over one is left alone), so these loads may go out before the waits
 * for the GEMV's input, and be in flight while the block waits. */
MK_INLINE int mk_gemv_preload(const MegacArgs *a, const unsigned *in, uint4 pre[MK_PRE_N])
{
    if (mk_buf(in[1 + MK_NPARAM(in)]) & MK_ARENA_BIT)
        return 0;
    const void *W = mk_opnd(a, in, 0);
    int r0 = mk_param(in, 0), r1 = mk_param(in, 1), k = mk_param(in, 2), bf, j0 = 0, j1;
    unsigned lane = mk_tid() & 31u, warp = mk_tid() >> 5;
    int path = mk_gemv_path(in, &bf), r = r0 + (int)warp, t = mk_dtype(in, 0);
    int w8 = MK_HAS_DT(MK_DT_W8) && t == MK_DT_W8;
    if ((MK_HAS_PLANAR && mk_is_planar(t)) || path == MK_GEMV_ODD || (path == MK_GEMV_QROW && !w8))
        return 0;
    if (path == MK_GEMV_SPLIT) { /* this warp's row and slice of units */
        r = r0 + mk_split_slice(r1 - r0, mk_split_units(t, bf, k), warp, &j0, &j1);
    } else { /* the warp's row (mk_gemv_rows): the whole row, clipped below */
        if (mk_gemv_nl(t, bf, k, path, r1 - r0) < 32)
            return 0; /* rows side by side take none (mk_gemv_rows) */
        j1 = k;
    }
    if (r >= r1)
        return 0;
    const uint4 *p = mk_row_units(mk_no_stage(), W, bf, r, k);
    if (w8) { /* the row's uint4s start at its first 16-byte boundary */
        int head, nv;
        mk_w8_span((const unsigned char *)W + r * mk_row_bytes(MK_DT_W8, k), k, &head, &nv, &p);
        j1 = j1 < nv ? j1 : nv;
    } else if (path == MK_GEMV_ROWS) {
        j1 = k / MK_UNIT(bf);
    }
    mk_round_part(p, j0 + (int)lane, j1, 0, MK_PRELOADS, pre, 32);
    return 1;
}

/* Starts copying the rows GEMV `in` reads into the stage, from the
 * 16-byte boundary at or before its first row, whole 16-byte units up to
 * MK_WSTAGE_BYTES and not past its last row; each thread issues every
 * MK_THREADS-th unit. Returns the range, the same in every thread; none
 * when there is no stage or the weights are an arena buffer (written
 * during the step). The copies land while the block waits; mk_cp_wait and
 * a barrier make them visible before the GEMV reads them. */
MK_INLINE MkStage mk_wstage_issue(const MegacArgs *a, const unsigned *in)
{
    MkStage st = mk_no_stage();
#if MK_WSTAGE_BYTES > 0
    if (mk_buf(in[1 + MK_NPARAM(in)]) & MK_ARENA_BIT)
        return st;
    int r0 = mk_param(in, 0), r1 = mk_param(in, 1), k = mk_param(in, 2);
    long long rb = mk_row_bytes(mk_dtype(in, 0), k);
    const unsigned char *lo = (const unsigned char *)mk_opnd(a, in, 0) + r0 * rb, *hi = lo + (r1 - r0) * rb;
    const unsigned char *a0 = lo - ((unsigned long long)lo & 15u);
    long long n = (long long)(hi - a0) / 16;
    if (n > MK_WSTAGE_BYTES / 16)
        n = MK_WSTAGE_BYTES / 16;
    for (long long i = mk_tid(); i < n; i += MK_THREADS)
        mk_cp16(mk_wst + i, a0 + 16 * i);
    st.g0 = a0;
    st.g1 = a0 + 16 * n;
#else
    (void)a;
    (void)in;
#endif
    return st;
}

/* ---- the weight pipe (MK_WPIPE > 1) ----
 * A warp's rows of an f32, bf16 or W8 GEMV at 32 lanes a row (the ROWS
 * path; W8's QROW) as one stream of rounds (row r, its q-th MK_WPIPE_V
 * 16-byte blocks a lane): round t + MK_WPIPE - 1 is copied into the warp's
 * ring by cp.async (no registers held: the copy engine writes shared
 * memory) before round t is multiplied, so a warp keeps MK_WPIPE - 1
 * rounds in flight across its rows and their ends, where the register
 * rounds of mk_dot_units have none in flight while they multiply and
 * reduce. Each lane reads back only the blocks it copied, so its own
 * cp.async.wait_group is the only wait: an empty group is committed where
 * the stream has ended, so that round t is always the (MK_WPIPE - 1)-th
 * group back. A GEMV right after a wait has its first MK_WPIPE - 1 rounds
 * copied before the wait (mk_pipe_prime: weights never change during a
 * step), so that they travel while the block waits, as the preloads do,
 * but into shared memory: no registers held across the wait, and
 * MK_WPIPE - 1 rounds of MK_WPIPE_V units a lane rather than MK_PRELOADS
 * units. MEGAC_CUDA_DEFINES=MK_WPIPE_PRIME=0 leaves that to the GEMV (and
 * the preloads), to time against. */
#ifndef MK_WPIPE_PRIME
#define MK_WPIPE_PRIME 1
#endif
#if MK_WPIPE > 1 && MK_WSTAGE_BYTES == 0
/* Row r as the pipe copies it: nb 16-byte blocks from base, the last one
 * `part` bytes (1-15; 16 whole). f32/bf16: the row's units. W8 ({f32 s;
 * i8 q[k]}, 4-byte aligned): the block that holds s (at byte 12 - *al)
 * and q's first min(*al, k) bytes, then its nv whole blocks from the
 * 16-byte boundary q + *al, then the block of its last *tail bytes,
 * copied up to them (no read past the row). */
typedef struct {
    const unsigned char *base;
    int nb, part, al, nv, tail;
} MkPipeRow;

MK_INLINE MkPipeRow mk_pipe_row(int w8, const void *W, long long r, long long rb, int k, int nu)
{
    MkPipeRow g;
    const unsigned char *row = (const unsigned char *)W + r * rb;
    if (!w8) {
        g.base = row, g.nb = nu, g.part = 16, g.al = g.nv = g.tail = 0;
        return g;
    }
    const unsigned char *q = row + 4;
    g.al = (int)((16u - ((unsigned)(unsigned long long)q & 15u)) & 15u);
    int h = g.al < k ? g.al : k;
    g.base = q + g.al - 16;
    g.nv = (k - h) / 16;
    g.tail = k - h - 16 * g.nv;
    g.nb = 1 + g.nv + (g.tail > 0);
    g.part = g.tail > 0 ? g.tail : 16;
    return g;
}

/* Copies this lane's blocks of round q of row g into ring slot `slot`. */
MK_INLINE void mk_pipe_issue(uint4 *slot, MkPipeRow g, int q, unsigned lane)
{
#pragma unroll
    for (int u = 0; u < MK_WPIPE_V; u++) {
        int j = q * 32 * MK_WPIPE_V + 32 * u + (int)lane;
        if (j < g.nb - 1)
            mk_cp16(slot + 32 * u + lane, g.base + 16 * (long long)j);
        else if (j == g.nb - 1)
            mk_cp16_part(slot + 32 * u + lane, g.base + 16 * (long long)j, g.part);
    }
}

/* The next round to copy: row r (geometry g), its round q, ring slot. */
typedef struct {
    int r, q, slot;
    MkPipeRow g;
} MkPipeNext;

/* Copies round *p (none past the warp's last row: an empty group) as one
 * group, and moves *p on; with issue 0 only moves it (the round was
 * copied before: mk_pipe_prime). */
MK_INLINE void mk_pipe_copy(uint4 *ring, MkPipeNext *p, int w8, const void *W, long long rb, int k, int nu, int r1,
                            unsigned lane, int issue)
{
    const int per = 32 * MK_WPIPE_V;
    if (p->r < r1) {
        if (issue) {
            mk_pipe_issue(ring + p->slot * per, p->g, p->q, lane);
#if MK_NL_COUNT
            if (lane == 0)
                __atomic_fetch_add(&megac_nl_n[5], 1, __ATOMIC_RELAXED);
#endif
        }
        if (++p->q * per >= p->g.nb) {
            p->q = 0, p->r += MK_NWARPS;
            if (p->r < r1)
                p->g = mk_pipe_row(w8, W, p->r, rb, k, nu);
        }
    }
    if (issue)
        mk_cp_commit();
    p->slot = p->slot + 1 == MK_WPIPE ? 0 : p->slot + 1;
}

/* The rows the pipe reads: f32/bf16 rows and W8's, at 32 lanes a row. */
MK_INLINE int mk_pipe_rows(int path, int t, int nl)
{
    return nl == 32 && (path == MK_GEMV_ROWS || (path == MK_GEMV_QROW && MK_HAS_DT(MK_DT_W8) && t == MK_DT_W8));
}

/* This warp's ring. */
MK_INLINE uint4 *mk_pipe_ring(void)
{
    return mk_wst + (MK_WSTAGE_BYTES + MK_ISTAGE_BYTES) / 16 + (mk_tid() >> 5) * (MK_WPIPE * 32 * MK_WPIPE_V);
}

/* The stream of this warp's rows from rw (every MK_NWARPS-th below r1)
 * past its first MK_WPIPE - 1 rounds: copied now (issue), or copied
 * before the wait (mk_pipe_prime) and only passed over. */
MK_INLINE MkPipeNext mk_pipe_begin(uint4 *ring, int w8, const void *W, long long rb, int k, int nu, int rw, int r1,
                                   unsigned lane, int issue)
{
    MkPipeNext p = {rw, 0, 0, mk_pipe_row(w8, W, rw < r1 ? rw : r1 - 1, rb, k, nu)};
#pragma unroll 1
    for (int i = 0; i < MK_WPIPE - 1; i++)
        mk_pipe_copy(ring, &p, w8, W, rb, k, nu, r1, lane, issue);
    return p;
}

/* Block j of W8 row g (wp, in the ring) times its elements of x (staged
 * with mask m); block 0 also sets *s, the row's scale. */
MK_INLINE float mk_pipe_w8(const uint4 *wp, MkPipeRow g, int j, int k, const float *x, int m, float *s)
{
    const unsigned char *bytes = (const unsigned char *)(const void *)wp;
    float acc = 0.0f;
    if (j == 0) {
        *s = mk_f32_at(bytes + 12 - g.al);
        int h = g.al < k ? g.al : k;
        for (int i = 0; i < h; i++)
            acc += (float)(signed char)bytes[16 - g.al + i] * mk_xs_at(x, i, m);
    } else if (j <= g.nv) {
        const float4 *x4 = (const float4 *)(const void *)x;
        int f = g.al / 4 + 4 * (j - 1);
        uint4 w = *wp;
        acc = mk_dot_s8x4(w.x, mk_xld4(x4 + mk_xsw(f, m))) + mk_dot_s8x4(w.y, mk_xld4(x4 + mk_xsw(f + 1, m))) +
              mk_dot_s8x4(w.z, mk_xld4(x4 + mk_xsw(f + 2, m))) + mk_dot_s8x4(w.w, mk_xld4(x4 + mk_xsw(f + 3, m)));
    } else {
        int i0 = g.al + 16 * g.nv;
        for (int i = 0; i < g.tail; i++)
            acc += (float)(signed char)bytes[i] * mk_xs_at(x, i0 + i, m);
    }
    return acc;
}

/* mk_gemv_pipe's rows from rw, every MK_NWARPS-th below r1; with primed
 * its first MK_WPIPE - 1 rounds were copied before (mk_pipe_prime). */
MK_DEV void mk_gemv_pipe(const void *W, int t, long long rb, int k, int nu, int bf, const float *x, int m, int rw,
                         int r1, float *y, const float *b, int flags, int primed)
{
    const int per = 32 * MK_WPIPE_V, w8 = MK_HAS_DT(MK_DT_W8) && t == MK_DT_W8;
    unsigned lane = mk_tid() & 31u;
#if MK_NL_COUNT
    if (mk_tid() == 0) {
        __atomic_fetch_add(&megac_nl_n[3], 1, __ATOMIC_RELAXED);
        if (primed)
            __atomic_fetch_add(&megac_nl_n[4], 1, __ATOMIC_RELAXED);
    }
#endif
    uint4 *ring = mk_pipe_ring();
    const float4 *x4 = (const float4 *)(const void *)x;
    MkPipeNext p = mk_pipe_begin(ring, w8, W, rb, k, nu, rw, r1, lane, !primed);
    float acc[MK_WPIPE_V], s = 1.0f;
#pragma unroll
    for (int u = 0; u < MK_WPIPE_V; u++)
        acc[u] = 0.0f;
    int cq = 0, cs = 0;
    MkPipeRow cg = mk_pipe_row(w8, W, rw < r1 ? rw : r1 - 1, rb, k, nu);
#pragma unroll 1
    for (int cr = rw; cr < r1;) {
        mk_pipe_copy(ring, &p, w8, W, rb, k, nu, r1, lane, 1);
        MK_CP_WAIT_GROUP(MK_WPIPE - 1); /* this lane's copies of round (cr, cq) have landed */
#pragma unroll
        for (int u = 0; u < MK_WPIPE_V; u++) {
            int j = cq * per + 32 * u + (int)lane;
            const uint4 *wp = ring + cs * per + 32 * u + lane;
            if (j < cg.nb)
                acc[u] += w8 ? mk_pipe_w8(wp, cg, j, k, x, m, &s) : mk_unit_dot(*wp, bf, x4, (unsigned)j, m);
        }
        cs = cs + 1 == MK_WPIPE ? 0 : cs + 1;
        if (++cq * per >= cg.nb) {
            float v = 0.0f;
#pragma unroll
            for (int u = 0; u < MK_WPIPE_V; u++) {
                v += acc[u];
                acc[u] = 0.0f;
            }
            v = mk_warp_sum(v);
            if (lane == 0) /* lane 0 read block 0: the W8 scale */
                mk_gemv_store(y, b, cr, w8 ? s * v : v, flags);
            cq = 0;
            cr += MK_NWARPS;
            if (cr < r1)
                cg = mk_pipe_row(w8, W, cr, rb, k, nu);
        }
    }
}

/* Whether GEMV `in`'s rows go through the weight pipe (mk_pipe_rows at
 * the lanes a row mk_gemv_rows gives them). */
MK_INLINE int mk_pipe_takes(const unsigned *in, int path, int bf)
{
    int t = mk_dtype(in, 0);
    return mk_pipe_rows(path, t, mk_gemv_nl(t, bf, mk_param(in, 2), path, mk_param(in, 1) - mk_param(in, 0)));
}

/* Before the waits for GEMV `in`'s input: copies this warp's first
 * MK_WPIPE - 1 rounds of its pipe, as mk_gemv_pipe would first (not over
 * an arena buffer, which the step writes); 1 when it did, and the GEMV
 * is then run with MK_PIPE_PRIMED. */
MK_INLINE int mk_pipe_prime(const MegacArgs *a, const unsigned *in)
{
    int bf, path = mk_gemv_path(in, &bf);
    if ((mk_buf(in[1 + MK_NPARAM(in)]) & MK_ARENA_BIT) || !mk_pipe_takes(in, path, bf))
        return 0;
    const void *W = mk_opnd(a, in, 0);
    int t = mk_dtype(in, 0), r1 = mk_param(in, 1), k = mk_param(in, 2);
    int w8 = MK_HAS_DT(MK_DT_W8) && t == MK_DT_W8, nu = path == MK_GEMV_ROWS ? k / MK_UNIT(bf) : 0;
    long long rb = mk_row_bytes(t, k);
    mk_pipe_begin(mk_pipe_ring(), w8, W, rb, k, nu, mk_param(in, 0) + (int)(mk_tid() >> 5), r1, mk_tid() & 31u, 1);
    return 1;
}
#endif

/* The rows of GEMV `in` against xin, staged with mask m: each group of
 * nl lanes (mk_gemv_nl; 32 / nl groups a warp) takes rows r0 + g, r0 + g
 * + G, ... for group g of the block's G, so a warp's groups read
 * consecutive rows side by side. A warp runs its loop while its first
 * group has a row, the groups past r1 with no units (the shuffles of a
 * dot want every lane of the warp). With use_pre, the first round of the
 * group's first row is in pre: mk_gemv_preload issued it. */
MK_INLINE void mk_gemv_rows_nl(MkStage st, const unsigned *in, const void *W, const float *xin, int m, float *y,
                               const float *b, int path, int bf, const uint4 pre[MK_PRE_N], int use_pre, const int nl)
{
    int r0 = mk_param(in, 0), r1 = mk_param(in, 1), k = mk_param(in, 2), flags = mk_param(in, 3);
    unsigned tid = mk_tid(), lane = tid & 31u;
    int t = mk_dtype(in, 0);
    long long rb = mk_row_bytes(t, k);
    int ng = 32 / nl, step = MK_NWARPS * ng;
    int rw = r0 + (int)(tid >> 5) * ng, gi = (int)lane / nl, nu = path == MK_GEMV_ROWS ? k / MK_UNIT(bf) : 0;
    unsigned sub = lane & (unsigned)(nl - 1);
    if (use_pre == 1 && rw < r1) { /* the first row apart: pre is dead after it */
        int r = rw + gi, ok = r < r1;
        const unsigned char *row = mk_wrow(st, W, ok ? r : r1 - 1, rb);
        float v = path == MK_GEMV_QROW ? mk_dot_qrow(t, row, xin, k, sub, m, pre, 1, nl, ok)
                                       : mk_dot_units((const uint4 *)(const void *)row, bf, (const float4 *)xin, m, 0,
                                                      ok ? nu : 0, sub, pre, 1, nl);
        if (ok && sub == 0)
            mk_gemv_store(y, b, r, v, flags);
        rw += step;
    }
#if MK_WPIPE > 1 && MK_WSTAGE_BYTES == 0
    if (mk_pipe_rows(path, t, nl)) {
        mk_gemv_pipe(W, t, rb, k, nu, bf, xin, m, rw, r1, y, b, flags, use_pre == MK_PIPE_PRIMED);
        return;
    }
#endif
    for (; rw < r1; rw += step) {
        int r = rw + gi, ok = r < r1;
        const unsigned char *row = mk_wrow(st, W, ok ? r : r1 - 1, rb);
        float v;
        if (path == MK_GEMV_QROW)
            v = mk_dot_qrow(t, row, xin, k, sub, m, pre, 0, nl, ok);
        else if (path == MK_GEMV_ROWS)
            v = mk_dot_units((const uint4 *)(const void *)row, bf, (const float4 *)xin, m, 0, ok ? nu : 0, sub, pre, 0,
                             nl);
        else
            v = mk_dot1((const uint4 *)(const void *)row, bf, xin, k, lane);
        if (ok && sub == 0)
            mk_gemv_store(y, b, r, v, flags);
    }
}

/* mk_gemv_rows_nl with nl a constant in each call (the loads' offsets
 * then fold into their addresses, as with a row per warp: no registers
 * spent on them). Rows of fewer lanes take no preloads (mk_gemv_preload
 * issues none for them): pre is dead there, and its registers free for
 * the rows side by side (with both, W8 kernels spilled at 2 preloads). */
MK_INLINE void mk_gemv_rows(MkStage st, const unsigned *in, const void *W, const float *xin, int m, float *y,
                            const float *b, int path, int bf, const uint4 pre[MK_PRE_N], int use_pre)
{
    int t = mk_dtype(in, 0), k = mk_param(in, 2);
    if (path == MK_GEMV_SPLIT) {
        mk_gemv_split(st, W, t, bf, xin, m, y, b, mk_param(in, 0), mk_param(in, 1) - mk_param(in, 0), k,
                      mk_param(in, 3), pre, use_pre);
        return;
    }
    int nl = mk_gemv_nl(t, bf, k, path, mk_param(in, 1) - mk_param(in, 0));
#if MK_NL_COUNT
    if (mk_tid() == 0)
        __atomic_fetch_add(&megac_nl_n[nl == 8 ? 0 : nl == 16 ? 1 : 2], 1, __ATOMIC_RELAXED);
#endif
    /* mk_gemv_nl gives only compiled widths; the constant tests let the
     * compiler drop the copies MK_NL_USED leaves out */
    if ((MK_NL_USED & 1) && nl == 8)
        mk_gemv_rows_nl(st, in, W, xin, m, y, b, path, bf, pre, 0, 8);
    else if ((MK_NL_USED & 2) && nl == 16)
        mk_gemv_rows_nl(st, in, W, xin, m, y, b, path, bf, pre, 0, 16);
    else
        mk_gemv_rows_nl(st, in, W, xin, m, y, b, path, bf, pre, use_pre, 32);
}

/* y[r0:r1] (+)= W[r0:r1, 0:k] . x (+ b), W f32 or bf16 (16-byte loads) or
 * f16 / a quantized format (dequantized in mk_dot_qrow). The input is
 * staged in shared memory (normalized there with GEMV_NORM, swizzled for
 * conflict-free 16-byte reads: mk_xsw, mk_gemv_xmask) when it fits, and
 * the rows read it there through mk_sm itself, so that the compiler
 * addresses it as shared memory (32-bit addresses, fewer registers than a
 * pointer that may be either). Inputs longer than the scratch exist only
 * where MK_GEMV_UNSTAGED says so (cuda_source.c), and are read where they
 * lie. cuda_check.c refuses a GEMV_NORM whose k does not fit. With
 * staged, the scratch already holds this GEMV's input as it would stage it
 * (mk_gemv_restaged says when). */
MK_DEV void mk_gemv(const MegacArgs *a, const unsigned *in, const uint4 pre[MK_PRE_N], int use_pre, MkStage st,
                    int staged)
{
    const void *W = mk_opnd(a, in, 0);
    const float *x = (const float *)mk_opnd(a, in, 1);
    float *y = (float *)mk_opnd(a, in, 2);
    const float *nw = (const float *)mk_opnd(a, in, 3), *b = (const float *)mk_opnd(a, in, 4);
    int k = mk_param(in, 2), flags = mk_param(in, 3), bf;
    int path = mk_gemv_path(in, &bf);
    unsigned tid = mk_tid();
    mk_xtrace_start();
#if MK_GEMV_UNSTAGED
    if (k > MK_SMEM_FLOATS) {
        mk_gemv_rows(st, in, W, x, 0, y, b, path, bf, pre, use_pre);
        return;
    }
#endif
    int m = mk_gemv_xmask(in, path, bf);
    if (!staged) {
        float s = (flags & MK_GEMV_NORM) ? mk_rms_scale(x, k) : 1.0f;
        for (int j = (int)tid; j < k; j += MK_THREADS)
            mk_sm[4 * mk_xsw(j >> 2, m) + (j & 3)] = (flags & MK_GEMV_NORM) ? x[j] * s * nw[j] : x[j];
        mk_sync();
    }
    mk_gemv_rows(st, in, W, mk_sm, m, y, b, path, bf, pre, use_pre);
}

MK_DEV void op_gemv(const MegacArgs *a, const unsigned *in)
{
    uint4 none[MK_PRE_N] = {{0u, 0u, 0u, 0u}};
    mk_gemv(a, in, none, 0, mk_no_stage(), 0);
}

/* Whether GEMV `in`, run right after GEMV `prev` by the same block with no
 * signal or wait between them (nothing another block writes can land
 * between: the validator proves every write to prev's input ordered
 * before or after both reads), finds its staged input in the scratch as prev left it: the
 * same input buffer and length, normalized by the same weights or neither,
 * staged with the same swizzle, and prev did not write it. Gate and up
 * (one input, one norm) are such a pair on every worker: the second skips
 * an RMS reduction, a read of the input and three barriers.
 * MEGAC_CUDA_DEFINES=MK_XREUSE=0 stages every input, to time against. */
#ifndef MK_XREUSE
#define MK_XREUSE 1
#endif
MK_INLINE int mk_gemv_restaged(const unsigned *prev, const unsigned *in)
{
    if (!MK_XREUSE || !prev)
        return 0;
    const unsigned *op = in + 1 + MK_NPARAM(in), *pp = prev + 1 + MK_NPARAM(prev);
    int k = mk_param(in, 2), bf0, bf1;
    if (op[1] != pp[1] || op[1] == pp[2] || op[3] != pp[3] || k != mk_param(prev, 2) ||
        ((mk_param(in, 3) ^ mk_param(prev, 3)) & MK_GEMV_NORM) || k > MK_SMEM_FLOATS)
        return 0;
    int path0 = mk_gemv_path(prev, &bf0), path1 = mk_gemv_path(in, &bf1);
    return mk_gemv_xmask(prev, path0, bf0) == mk_gemv_xmask(in, path1, bf1);
}

/* Rotates heads [h0, h1) of v by the angles of row `pos` of the rope
 * table; pair i is (2i, 2i+1), or (i, i + hd/2) with MK_ROPE_HALF. */
/* Pair (x0, x1) rotated by (c, s): the one rotation of op_rope and of
 * op_attn's rope = 1, so that both give the same bits. */
MK_INLINE void mk_rope_pair(float x0, float x1, float c, float s, float *y0, float *y1)
{
    *y0 = x0 * c - x1 * s;
    *y1 = x0 * s + x1 * c;
}

MK_DEV void op_rope(const MegacArgs *a, const unsigned *in)
{
    float *v = (float *)mk_opnd(a, in, 0);
    const float *cs = (const float *)mk_opnd(a, in, 1) + a->pos * MK_HD;
    int h0 = mk_param(in, 0), h1 = mk_param(in, 1), half = MK_HD / 2;
    for (int p = (int)mk_tid(); p < (h1 - h0) * half; p += MK_THREADS) {
        int i = p % half;
        float *x = v + (long long)(h0 + p / half) * MK_HD;
        int i0 = MK_ROPE_HALF ? i : 2 * i, i1 = MK_ROPE_HALF ? i + half : 2 * i + 1;
        float y0, y1;
        mk_rope_pair(x[i0], x[i1], cs[2 * i], cs[2 * i + 1], &y0, &y1);
        x[i0] = y0;
        x[i1] = y1;
    }
}

/* ---- the KV cache's elements: MK_KVT (the schedule's one cache dtype,
 * cuda_check.c) is f32, f16 or bf16. Rows are written rounded to nearest
 * even (the bits of runtime/half.h) and widened to f32 where they are
 * read. ---- */
#ifndef MK_KVT
#define MK_KVT MK_DT_F32
#endif
#if MK_KVT == MK_DT_F32
typedef float mk_kv;
MK_INLINE float mk_kv_get(const mk_kv *p, long long i) { return p[i]; }
MK_INLINE void mk_kv_set(mk_kv *p, long long i, float x) { p[i] = x; }
#else
typedef unsigned short mk_kv;
MK_INLINE float mk_kv_get(const mk_kv *p, long long i)
{
    return MK_KVT == MK_DT_BF16 ? mk_as_float((unsigned)p[i] << 16) : mk_f16(p[i]);
}
MK_INLINE unsigned mk_f16_bits(float f)
{
    unsigned u = mk_as_uint(f), sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, man = u & 0x7fffffu;
    if (exp == 0xffu)
        return sign | 0x7c00u | (man ? 0x200u : 0u);
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return sign | 0x7c00u;
    if (e <= 0) { /* a subnormal f16, or zero */
        if (e < -10)
            return sign;
        man |= 0x800000u;
        int shift = 14 - e;
        unsigned h = man >> shift, rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
        h += rem > half || (rem == half && (h & 1u));
        return sign | h;
    }
    unsigned h = ((unsigned)e << 10) | (man >> 13), rem = man & 0x1fffu;
    h += rem > 0x1000u || (rem == 0x1000u && (h & 1u)); /* may carry into the exponent: correct */
    return sign | h;
}
MK_INLINE unsigned mk_bf16_bits(float f)
{
    unsigned u = mk_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
MK_INLINE void mk_kv_set(mk_kv *p, long long i, float x)
{
    p[i] = (unsigned short)(MK_KVT == MK_DT_BF16 ? mk_bf16_bits(x) : mk_f16_bits(x));
}
#endif

MK_DEV void op_kv_append(const MegacArgs *a, const unsigned *in)
{
    const float *k = (const float *)mk_opnd(a, in, 0), *v = (const float *)mk_opnd(a, in, 1);
    mk_kv *kc = (mk_kv *)mk_opnd(a, in, 2), *vc = (mk_kv *)mk_opnd(a, in, 3);
    long long h = mk_param(in, 0), row = (h * MK_MAX_SEQ + a->pos) * MK_HD;
    for (int d = (int)mk_tid(); d < MK_HD; d += MK_THREADS) {
        mk_kv_set(kc, row + d, k[h * MK_HD + d]);
        mk_kv_set(vc, row + d, v[h * MK_HD + d]);
    }
}

#define MK_E (MK_HD + 2)     /* one partial: hd outputs, m, l */

/* A warp's online-softmax state for the G q heads of a kv head: lanes
 * hold MK_HDL elements of each head (mk_attn_warp, op_attn_sparse).
 * The helpers below are force-inlined, so the arrays stay in registers. */
MK_INLINE void mk_attn_init_rope(const float *q, int h, unsigned lane, float qv[MK_G][MK_HDL],
                                 float acc[MK_G][MK_HDL], float *m, float *l, const float *cs)
{
#pragma unroll
    for (int g = 0; g < MK_G; g++) {
        m[g] = MK_NEG_INF;
        l[g] = 0.0f;
        const float *x = q + (long long)(h * MK_G + g) * MK_HD;
#pragma unroll
        for (int i = 0; i < MK_HDL; i++) {
            int d = (int)lane + 32 * i, half = MK_HD / 2;
            qv[g][i] = d < MK_HD ? x[d] : 0.0f;
            acc[g][i] = 0.0f;
            if (cs && d < MK_HD) { /* element d of its pair, rotated at pos */
                int p = MK_ROPE_HALF ? d % half : d / 2, i0 = MK_ROPE_HALF ? p : 2 * p;
                int i1 = MK_ROPE_HALF ? p + half : 2 * p + 1;
                float y0, y1;
                mk_rope_pair(x[i0], x[i1], cs[2 * p], cs[2 * p + 1], &y0, &y1);
                qv[g][i] = d == i0 ? y0 : y1;
            }
        }
    }
}

MK_INLINE void mk_attn_init(const float *q, int h, unsigned lane, float qv[MK_G][MK_HDL], float acc[MK_G][MK_HDL],
                            float *m, float *l)
{
    mk_attn_init_rope(q, h, lane, qv, acc, m, l, 0);
}

/* Adds row (kr, vr) of hd elements to the state; with sc_out (ATTN_SPARSE
 * slots) lane 0 writes each head g's scaled score to sc_out[g * scap]. */
MK_INLINE void mk_attn_row(const mk_kv *kr_, const mk_kv *vr_, unsigned lane, float qv[MK_G][MK_HDL],
                           float acc[MK_G][MK_HDL], float *m, float *l, float *sc_out, int scap)
{
    const float scale = 1.0f / sqrtf((float)MK_HD);
    float kr[MK_HDL], vr[MK_HDL];
#pragma unroll
    for (int i = 0; i < MK_HDL; i++) {
        int d = (int)lane + 32 * i;
        kr[i] = d < MK_HD ? mk_kv_get(kr_, d) : 0.0f;
        vr[i] = d < MK_HD ? mk_kv_get(vr_, d) : 0.0f;
    }
#pragma unroll
    for (int g = 0; g < MK_G; g++) {
        float sc = 0.0f;
#pragma unroll
        for (int i = 0; i < MK_HDL; i++)
            sc += qv[g][i] * kr[i];
        sc = mk_warp_sum(sc) * scale;
        if (sc_out && lane == 0)
            sc_out[(long long)g * scap] = sc;
        if (sc > m[g]) {
            float r = m[g] == MK_NEG_INF ? 0.0f : expf(m[g] - sc);
#pragma unroll
            for (int i = 0; i < MK_HDL; i++)
                acc[g][i] *= r;
            l[g] *= r;
            m[g] = sc;
        }
        float e = expf(sc - m[g]);
#pragma unroll
        for (int i = 0; i < MK_HDL; i++)
            acc[g][i] += e * vr[i];
        l[g] += e;
    }
}

/* The warp's (acc, m, l) to its slot of the shared scratch. */
MK_INLINE void mk_attn_store(unsigned warp, unsigned lane, float acc[MK_G][MK_HDL], const float *m, const float *l)
{
    float *mine = mk_sm + warp * MK_G * MK_E;
#pragma unroll
    for (int g = 0; g < MK_G; g++) {
#pragma unroll
        for (int i = 0; i < MK_HDL; i++)
            if ((int)lane + 32 * i < MK_HD)
                mine[g * MK_E + (int)lane + 32 * i] = acc[g][i];
        if (lane == 0) {
            mine[g * MK_E + MK_HD] = m[g];
            mine[g * MK_E + MK_HD + 1] = l[g];
        }
    }
}

/* Score entries per split and q head of an evicting layer
 * (sparse_score_rows in ir/ops.h). */
MK_INLINE int mk_score_rows(int cap, int nsplit)
{
    int nb = (cap + MK_SPARSE_BLOCK - 1) / MK_SPARSE_BLOCK;
    return (nb + nsplit - 1) / nsplit * MK_SPARSE_BLOCK;
}

/* Split s of nsplit over n entries (rows) cut into blocks of `block`:
 * entries [*lo, *hi), the blocks [s*nb/nsplit, (s+1)*nb/nsplit) of
 * nb = ceil(n / block) (ATTN, ATTN_SPARSE in ir/ops.h). */
MK_INLINE void mk_split_range(int n, int block, int s, int nsplit, int *lo, int *hi)
{
    long long nb = (n + block - 1) / block, b0 = s * nb / nsplit * block, b1 = (s + 1) * nb / nsplit * block;
    *lo = b0 < n ? (int)b0 : n;
    *hi = b1 < n ? (int)b1 : n;
}

/* One warp's online softmax for the G q heads of kv head h over rows
 * lo + warp, lo + warp + MK_AW, ... below hi (q rotated by the rope row
 * cs as it is loaded, when cs is given). */
MK_DEV void mk_attn_warp(const float *q, const mk_kv *kh, const mk_kv *vh, int h, int lo, int hi, unsigned warp,
                         unsigned lane, const float *cs)
{
    float qv[MK_G][MK_HDL], acc[MK_G][MK_HDL], m[MK_G], l[MK_G];
    mk_attn_init_rope(q, h, lane, qv, acc, m, l, cs);
#pragma unroll 1
    for (long long t = lo + (int)warp; t < hi; t += MK_AW)
        mk_attn_row(kh + t * MK_HD, vh + t * MK_HD, lane, qv, acc, m, l, 0, 0);
    mk_attn_store(warp, lane, acc, m, l);
}

/* The block merges the MK_AW warps' partials (after the warps and a
 * barrier), in warp order, into p ([G][hd + 2]). An empty split leaves
 * zeros, -inf, 0. */
MK_DEV void mk_attn_merge(float *p)
{
    for (int j = (int)mk_tid(); j < MK_G * MK_E; j += MK_THREADS) {
        int g = j / MK_E, d = j % MK_E;
        float M = MK_NEG_INF, o = 0.0f;
        for (int w = 0; w < MK_AW; w++)
            M = fmaxf(M, mk_sm[(w * MK_G + g) * MK_E + MK_HD]);
        for (int w = 0; w < MK_AW && M != MK_NEG_INF && d != MK_HD; w++) {
            const float *pw = mk_sm + (w * MK_G + g) * MK_E;
            if (pw[MK_HD] != MK_NEG_INF)
                o += pw[d] * expf(pw[MK_HD] - M);
        }
        p[j] = d == MK_HD ? M : o;
    }
}

/* Split s of kv head h: warps 0..MK_AW-1 each run mk_attn_warp, then the
 * block merges the warps' partials into part[h][s] ([G][hd + 2]). With
 * rope = 1, q is rotated at pos as the warps load it. */
MK_DEV void op_attn(const MegacArgs *a, const unsigned *in)
{
    const float *q = (const float *)mk_opnd(a, in, 0);
    const float *cs = mk_param(in, 4) ? (const float *)mk_opnd(a, in, 4) + a->pos * MK_HD : 0;
    const mk_kv *kc = (const mk_kv *)mk_opnd(a, in, 1), *vc = (const mk_kv *)mk_opnd(a, in, 2);
    float *part = (float *)mk_opnd(a, in, 3);
    int h = mk_param(in, 0), s = mk_param(in, 1), nsplit = mk_param(in, 2), lo, hi;
    unsigned tid = mk_tid(), warp = tid >> 5;
    mk_split_range((int)a->pos + 1, mk_param(in, 3), s, nsplit, &lo, &hi);
    if (warp < MK_AW)
        mk_attn_warp(q, kc + (long long)h * MK_MAX_SEQ * MK_HD, vc + (long long)h * MK_MAX_SEQ * MK_HD, h, lo, hi,
                     warp, tid & 31u, cs);
    mk_sync();
    mk_attn_merge(part + (long long)(h * nsplit + s) * MK_G * MK_E);
}

/* The rows ATTN_SPARSE reads (ops.h): runs of consecutive rows, whose
 * concatenation is cut into blocks of MK_SPARSE_BLOCK entries. */
typedef struct MkRows {
    int kind;           /* an MK_SPARSE_* kind */
    int a, b;           /* the kind's params; MK_SPARSE_SNAP: a = the list's capacity, b = its kept rows */
    const int *sel;     /* MK_SPARSE_QUEST: the kv head's b pages; MK_SPARSE_SNAP: its snap[a + 2] */
} MkRows;

/* The rows of a SnapKV head alive at pos (ops.h), with sel its snap[L + 2]:
 * r.b = how many kept rows come first (n once compressed: 0 <= cut < pos,
 * else 0), then the rows from *base on; returns how many are alive. */
MK_INLINE int mk_snap_rows(MkRows *r, int pos, int *base)
{
    int cut = r->sel[0], done = cut >= 0 && cut < pos, n = r->sel[1] < 0 ? 0 : r->sel[1] > r->a ? r->a : r->sel[1];
    r->b = done ? n : 0;
    *base = done ? cut + 1 : 0;
    return r->b + pos + 1 - *base;
}

/* Run j of r at pos: its length (rows from *r0 on), 0 for an empty run,
 * -1 past the last run. Rows and entries are below max_seq < 2^31. */
MK_INLINE int mk_rows_run(MkRows r, int j, int pos, int *r0)
{
    int n = pos + 1, lo = 0, hi;
    switch (r.kind) {
    case MK_SPARSE_SINK_WINDOW:
        if (j > 1)
            return -1;
        if (j == 0) {
            hi = r.a < n ? r.a : n;
        } else {
            lo = n - r.b > r.a ? n - r.b : r.a;
            hi = n;
        }
        break;
    case MK_SPARSE_QUEST: {
        if (j >= r.b)
            return -1;
        long long p = r.sel[j];
        int in = p >= 0 && p * r.a < n;
        lo = in ? (int)p * r.a : 0;
        hi = in ? (n - lo > r.a ? lo + r.a : n) : 0;
        break;
    }
    default: /* slots */
        if (j > 0)
            return -1;
        hi = r.a < n ? r.a : n;
        break;
    }
    *r0 = lo;
    return hi > lo ? hi - lo : 0;
}

/* The row at entry e of r's runs concatenated, or -1 past their end. */
MK_INLINE int mk_rows_at(MkRows r, int pos, int e)
{
    if (r.kind == MK_SPARSE_SNAP) { /* the kept rows, then (cut, pos]: r.b set by mk_snap_rows */
        int cut = r.sel[0], base = cut >= 0 && cut < pos ? cut + 1 : 0;
        return e < r.b ? r.sel[2 + e] : base + e - r.b <= pos ? base + e - r.b : -1;
    }
    int off = 0, r0 = 0;
    for (int j = 0;; j++) {
        int len = mk_rows_run(r, j, pos, &r0);
        if (len < 0)
            return -1;
        if (e < off + len)
            return r0 + (e - off);
        off += len;
    }
}

/* How many rows r selects at pos (SnapKV: mk_snap_rows's count). */
MK_INLINE int mk_rows_count(MkRows r, int pos)
{
    int n = 0, r0, len;
    for (int j = 0; (len = mk_rows_run(r, j, pos, &r0)) >= 0; j++)
        n += len;
    return n;
}

/* Split entries per chunk of op_attn_sparse: a multiple of MK_AW that fits
 * the shared scratch. */
#define MK_SPCH ((MK_SMEM_FLOATS < 2048 ? MK_SMEM_FLOATS : 2048) / MK_AW * MK_AW)

/* Split s of kv head h over the rows `kind` selects (ops.h): its entries
 * [lo, hi) of the runs concatenated (mk_split_range over their count, in
 * blocks of MK_SPARSE_BLOCK; one split takes them all, ended by
 * mk_rows_at, and needs no count). In chunks of MK_SPCH split entries,
 * the block writes the rows into mk_sm (as floats: rows < 2^24), then
 * warp w < MK_AW adds rows w, w + MK_AW, ... of the chunk to its online
 * softmax: the order
 * mk_attn_warp takes its rows in, so with every row selected the result
 * is op_attn's at block 32. The hot loop keeps no run cursor (the
 * registers of op_attn's). Rows are hd apart in kc/vc[h], whose head
 * stride is S rows, or cap for slots; slots with b = 1 write each row's
 * scaled scores into the split's piece of the scores (ops.h). Then the
 * merge of op_attn. */
MK_DEV void op_attn_sparse(const MegacArgs *a, const unsigned *in)
{
    const float *q = (const float *)mk_opnd(a, in, 0);
    const mk_kv *kc = (const mk_kv *)mk_opnd(a, in, 1), *vc = (const mk_kv *)mk_opnd(a, in, 2);
    float *part = (float *)mk_opnd(a, in, 3);
    int h = mk_param(in, 0), s = mk_param(in, 1), nsplit = mk_param(in, 2), pos = (int)a->pos;
    MkRows rows = {mk_param(in, 3), mk_param(in, 4), mk_param(in, 5), 0};
    if (rows.kind == MK_SPARSE_QUEST)
        rows.sel = (const int *)mk_opnd(a, in, 4) + (long long)h * rows.b;
    if (rows.kind == MK_SPARSE_ROWS) { /* kv head a's list of rows: Quest's pages of one row */
        rows.sel = (const int *)mk_opnd(a, in, 4) + (long long)rows.a * rows.b;
        rows.kind = MK_SPARSE_QUEST, rows.a = 1;
    }
    int n = 0, lo = 0, hi = MK_MAX_SEQ;
    if (rows.kind == MK_SPARSE_SNAP) {
        int base;
        rows.sel = (const int *)mk_opnd(a, in, 4) + (long long)h * (rows.a + 2);
        n = mk_snap_rows(&rows, pos, &base);
    }
    if (nsplit > 1)
        mk_split_range(rows.kind == MK_SPARSE_SNAP ? n : mk_rows_count(rows, pos), MK_SPARSE_BLOCK, s, nsplit, &lo,
                       &hi);
    int slots = rows.kind == MK_SPARSE_SLOTS, cap = rows.a, nsc = slots ? mk_score_rows(cap, nsplit) : 0;
    float *score = slots && rows.b == 1 ? (float *)mk_opnd(a, in, 4) + (long long)(h * nsplit + s) * MK_G * nsc : 0;
    long long head = (long long)h * (slots ? cap : MK_MAX_SEQ) * MK_HD;
    const mk_kv *kh = kc + head, *vh = vc + head;
    unsigned tid = mk_tid(), warp = tid >> 5, lane = tid & 31u;
    float qv[MK_G][MK_HDL], acc[MK_G][MK_HDL], m[MK_G], l[MK_G];
    mk_attn_init(q, h, lane, qv, acc, m, l);
    for (int c0 = 0;; c0 += MK_SPCH) {
        for (int i = (int)tid; i < MK_SPCH; i += MK_THREADS) {
            int e = lo + c0 + i;
            mk_sm[i] = e < hi ? (float)mk_rows_at(rows, pos, e) : -1.0f;
        }
        mk_sync();
        int last = mk_sm[MK_SPCH - 1] < 0.0f;
        for (int i = (int)warp; warp < MK_AW && i < MK_SPCH; i += MK_AW) {
            float tf = mk_sm[i];
            if (tf < 0.0f)
                break;
            long long t = (long long)tf;
            mk_attn_row(kh + t * MK_HD, vh + t * MK_HD, lane, qv, acc, m, l, score ? score + (t - lo) : 0, nsc);
        }
        mk_sync();
        if (last)
            break;
    }
    if (warp < MK_AW)
        mk_attn_store(warp, lane, acc, m, l);
    mk_sync();
    mk_attn_merge(part + (long long)(h * nsplit + s) * MK_G * MK_E);
}

/* out[q head] = sum_s o_s * e^(m_s - M) / sum_s l_s * e^(m_s - M), for
 * the nh * G q heads of kv heads [h0, h0 + nh) (q head q of the op: kv
 * head h0 + q / G, g = q % G, output row h0 * G + q). The splits' maxima
 * and sums are read once, in parallel, into shared memory (at early
 * positions most splits are empty, m_s = -inf); then each output element
 * reads only the non-empty splits' partial outputs. */
MK_DEV void op_attn_combine(const MegacArgs *a, const unsigned *in)
{
    const float *part = (const float *)mk_opnd(a, in, 0);
    float *out = (float *)mk_opnd(a, in, 1);
    int h0 = mk_param(in, 0), nsplit = mk_param(in, 1), nh = mk_param(in, 2);
    const int E = MK_E, n = nh * MK_G * nsplit;
    if (2 * n > MK_SMEM_FLOATS) { /* does not fit: straight from memory */
        for (int j = (int)mk_tid(); j < nh * MK_G * MK_HD; j += MK_THREADS) {
            int q = j / MK_HD, d = j % MK_HD, h = h0 + q / MK_G, g = q % MK_G;
            float M = MK_NEG_INF, L = 0.0f, o = 0.0f;
            for (int s = 0; s < nsplit; s++)
                M = fmaxf(M, part[((long long)(h * nsplit + s) * MK_G + g) * E + MK_HD]);
            for (int s = 0; s < nsplit; s++) {
                const float *p = part + ((long long)(h * nsplit + s) * MK_G + g) * E;
                if (p[MK_HD] == MK_NEG_INF)
                    continue;
                float e = expf(p[MK_HD] - M);
                L += p[MK_HD + 1] * e;
                o += p[d] * e;
            }
            out[(long long)(h0 * MK_G + q) * MK_HD + d] = L > 0.0f ? o * (1.0f / L) : 0.0f;
        }
        return;
    }
    /* mk_sm[q * nsplit + s] = m, mk_sm[n + q * nsplit + s] = l */
    for (int i = (int)mk_tid(); i < n; i += MK_THREADS) {
        int q = i / nsplit, s = i % nsplit, h = h0 + q / MK_G, g = q % MK_G;
        const float *p = part + ((long long)(h * nsplit + s) * MK_G + g) * E;
        mk_sm[i] = p[MK_HD];
        mk_sm[n + i] = p[MK_HD + 1];
    }
    mk_sync();
    for (int j = (int)mk_tid(); j < nh * MK_G * MK_HD; j += MK_THREADS) {
        int q = j / MK_HD, d = j % MK_HD, h = h0 + q / MK_G, g = q % MK_G;
        const float *m = mk_sm + q * nsplit, *l = mk_sm + n + q * nsplit;
        float M = MK_NEG_INF, L = 0.0f, o = 0.0f;
        for (int s = 0; s < nsplit; s++)
            M = fmaxf(M, m[s]);
        for (int s = 0; s < nsplit; s++) {
            if (m[s] == MK_NEG_INF)
                continue;
            float e = expf(m[s] - M);
            L += l[s] * e;
            o += part[((long long)(h * nsplit + s) * MK_G + g) * E + d] * e;
        }
        out[(long long)(h0 * MK_G + q) * MK_HD + d] = L > 0.0f ? o * (1.0f / L) : 0.0f;
    }
}

MK_DEV void op_silu_mul(const MegacArgs *a, const unsigned *in)
{
    const float *g = (const float *)mk_opnd(a, in, 0), *u = (const float *)mk_opnd(a, in, 1);
    float *out = (float *)mk_opnd(a, in, 2);
    for (int r = mk_param(in, 0) + (int)mk_tid(); r < mk_param(in, 1); r += MK_THREADS)
        out[r] = g[r] / (1.0f + expf(-g[r])) * u[r];
}

MK_DEV void op_add(const MegacArgs *a, const unsigned *in)
{
    float *x = (float *)mk_opnd(a, in, 0);
    const float *y = (const float *)mk_opnd(a, in, 1);
    for (int r = mk_param(in, 0) + (int)mk_tid(); r < mk_param(in, 1); r += MK_THREADS)
        x[r] += y[r];
}

/* amax[slot] = (max of x[r0:r1], first index of it) */
MK_DEV void op_argmax(const MegacArgs *a, const unsigned *in)
{
    const float *x = (const float *)mk_opnd(a, in, 0);
    float *amax = (float *)mk_opnd(a, in, 1);
    int r0 = mk_param(in, 0), r1 = mk_param(in, 1), slot = mk_param(in, 2);
    unsigned tid = mk_tid();
    float best = MK_NEG_INF;
    int idx = r0;
    for (int r = r0 + (int)tid; r < r1; r += MK_THREADS)
        if (x[r] > best) {
            best = x[r];
            idx = r;
        }
    mk_warp_argmax(&best, &idx);
    if ((tid & 31u) == 0) {
        mk_red[tid >> 5] = best;
        mk_red[32 + (tid >> 5)] = (float)idx;
    }
    mk_sync();
    if (tid < 32) {
        best = tid < MK_NWARPS ? mk_red[tid] : MK_NEG_INF;
        idx = tid < MK_NWARPS ? (int)mk_red[32 + tid] : r0;
        mk_warp_argmax(&best, &idx);
        if (tid == 0) {
            amax[2 * slot] = best;
            amax[2 * slot + 1] = (float)idx;
        }
    }
}

/* out[0] = index of the largest partial; the lowest index wins ties. */
MK_DEV void op_argmax_combine(const MegacArgs *a, const unsigned *in)
{
    if (mk_tid() != 0)
        return;
    const float *amax = (const float *)mk_opnd(a, in, 0);
    int nslot = mk_param(in, 0);
    float best = amax[0], idx = amax[1];
    for (int i = 1; i < nslot; i++) {
        float v = amax[2 * i], j = amax[2 * i + 1];
        if (v > best || (v == best && j < idx)) {
            best = v;
            idx = j;
        }
    }
    if (mk_dtype(in, 1) == MK_DT_I32)
        *(int *)mk_opnd(a, in, 1) = (int)idx;
    else
        *(float *)mk_opnd(a, in, 1) = idx;
}

/* ---- eviction and page selection (ops.h, "Eviction state", "Quest") ---- */

/* kc/vc[h][slot] = k/v of head h, meta[h][slot] = pos, slot = meta[h][cap]
 * (at pos 0 meta[h] is emptied first, and the slot is 0; a slot out of
 * [0, cap) is taken as 0). The barrier orders the reset before the read. */
MK_DEV void op_kv_store(const MegacArgs *a, const unsigned *in)
{
    const float *k = (const float *)mk_opnd(a, in, 0), *v = (const float *)mk_opnd(a, in, 1);
    mk_kv *kc = (mk_kv *)mk_opnd(a, in, 2), *vc = (mk_kv *)mk_opnd(a, in, 3);
    int h = mk_param(in, 0), cap = mk_param(in, 1);
    int *meta = (int *)mk_opnd(a, in, 4) + (long long)h * (cap + 1);
    unsigned tid = mk_tid();
    if (a->pos == 0) {
        for (int t = (int)tid; t < cap; t += MK_THREADS)
            meta[t] = -1;
        if (tid == 0)
            meta[cap] = 0;
        mk_sync();
    }
    int slot = meta[cap];
    if (slot < 0 || slot >= cap)
        slot = 0;
    long long row = ((long long)h * cap + slot) * MK_HD;
    for (int d = (int)tid; d < MK_HD; d += MK_THREADS) {
        mk_kv_set(kc, row + d, k[h * MK_HD + d]);
        mk_kv_set(vc, row + d, v[h * MK_HD + d]);
    }
    if (tid == 0)
        meta[slot] = (int)a->pos;
}

/* The bound U of page p ([2][hd]: min, max) for the G q heads in qv, over
 * the warp; +0 for -0, so that equal bounds compare equal as keys. */
MK_INLINE float mk_quest_u(const float *bp, float qv[MK_G][MK_HDL], unsigned lane)
{
    float u = 0.0f;
#pragma unroll
    for (int i = 0; i < MK_HDL; i++) {
        int d = (int)lane + 32 * i;
        if (d < MK_HD) {
            float lo = bp[d], hi = bp[MK_HD + d];
#pragma unroll
            for (int g = 0; g < MK_G; g++)
                u += fmaxf(qv[g][i] * lo, qv[g][i] * hi);
        }
    }
    return mk_warp_sum(u) + 0.0f;
}

/* A float as an unsigned that orders as the float does. */
MK_INLINE unsigned mk_fkey(float v)
{
    unsigned u = mk_as_uint(v);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

MK_INLINE float mk_fkey_value(unsigned k)
{
    return mk_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

#define MK_QBINS 256        /* radix digits of 8 bits: 4 passes */
#define MK_QCAND MK_QBINS   /* mk_sm: bins, one bound per warp, digit, rank */

/* One round of pages [j0, j0 + MK_NWARPS) (< c): warp w's bound into
 * mk_sm[MK_QCAND + w], then a barrier. */
MK_INLINE void mk_quest_round(const float *bh, float qv[MK_G][MK_HDL], int j0, int c, unsigned warp,
                              unsigned lane)
{
    int j = j0 + (int)warp;
    if (j < c) {
        float u = mk_quest_u(bh + (long long)j * 2 * MK_HD, qv, lane);
        if (lane == 0)
            mk_sm[MK_QCAND + warp] = u;
    }
    mk_sync();
}

/* Page c = pos/page of kv head h: its bounds from kc rows [c*page, pos];
 * then sel[h] = the npages-1 pages j < c of largest U (lower page on
 * ties) and c, in ascending page order, padded with -1. The selection
 * keeps no per-page state: a radix select (4 passes of 8-bit digits over
 * the float keys, each recomputing U and counting digits in mk_sm, a
 * thread per bin) finds the (npages-1)-th largest U, T, and how many
 * pages equal to T to take; a last pass writes the pages above T and the
 * first of those equal, lowest first. */
MK_DEV void op_quest_select(const MegacArgs *a, const unsigned *in)
{
    const float *q = (const float *)mk_opnd(a, in, 0);
    const mk_kv *kc = (const mk_kv *)mk_opnd(a, in, 1);
    float *bounds = (float *)mk_opnd(a, in, 2);
    int h = mk_param(in, 0), page = mk_param(in, 1), np = mk_param(in, 2);
    int *sel = (int *)mk_opnd(a, in, 3) + (long long)h * np;
    int c = (int)(a->pos / page), npg = (MK_MAX_SEQ + page - 1) / page, K = np - 1;
    unsigned tid = mk_tid(), warp = tid >> 5, lane = tid & 31u;
    float *bh = bounds + (long long)h * npg * 2 * MK_HD;
    const mk_kv *kh = kc + (long long)h * MK_MAX_SEQ * MK_HD;
    for (int d = (int)tid; d < MK_HD; d += MK_THREADS) {
        float lo = MK_INF, hi = MK_NEG_INF;
        for (long long t = (long long)c * page; t <= a->pos; t++) {
            float x = mk_kv_get(kh, t * MK_HD + d);
            lo = fminf(lo, x);
            hi = fmaxf(hi, x);
        }
        bh[(long long)c * 2 * MK_HD + d] = lo;
        bh[(long long)c * 2 * MK_HD + MK_HD + d] = hi;
    }
    if (c <= K) { /* every page */
        for (int i = (int)tid; i < np; i += MK_THREADS)
            sel[i] = i <= c ? i : -1;
        return;
    }
    float qv[MK_G][MK_HDL];
#pragma unroll
    for (int g = 0; g < MK_G; g++)
#pragma unroll
        for (int i = 0; i < MK_HDL; i++) {
            int d = (int)lane + 32 * i;
            qv[g][i] = d < MK_HD ? q[(long long)(h * MK_G + g) * MK_HD + d] : 0.0f;
        }
    unsigned prefix = 0, mask = 0;
    int rank = K; /* the rank of T among the keys that match prefix */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = (int)tid; b < MK_QBINS; b += MK_THREADS)
            mk_sm[b] = 0.0f;
        for (int j0 = 0; j0 < c; j0 += MK_NWARPS) {
            mk_quest_round(bh, qv, j0, c, warp, lane);
            for (int b = (int)tid; b < MK_QBINS; b += MK_THREADS) {
                int n = 0;
                for (int w = 0; w < MK_NWARPS && j0 + w < c; w++) {
                    unsigned k = mk_fkey(mk_sm[MK_QCAND + w]);
                    n += (k & mask) == prefix && (int)((k >> shift) & 255u) == b;
                }
                mk_sm[b] += (float)n;
            }
            mk_sync();
        }
        if (tid == 0) {
            int b = MK_QBINS - 1, above = 0;
            for (; b > 0 && above + (int)mk_sm[b] < rank; b--)
                above += (int)mk_sm[b];
            mk_sm[MK_QCAND + MK_NWARPS] = (float)b;
            mk_sm[MK_QCAND + MK_NWARPS + 1] = (float)(rank - above);
        }
        mk_sync();
        prefix |= (unsigned)mk_sm[MK_QCAND + MK_NWARPS] << shift;
        mask |= 255u << shift;
        rank = (int)mk_sm[MK_QCAND + MK_NWARPS + 1];
        mk_sync();
    }
    float T = mk_fkey_value(prefix);
    int n = 0, ties = 0;
    for (int j0 = 0; j0 < c; j0 += MK_NWARPS) {
        mk_quest_round(bh, qv, j0, c, warp, lane);
        if (tid == 0)
            for (int w = 0; w < MK_NWARPS && j0 + w < c; w++) {
                float u = mk_sm[MK_QCAND + w];
                if (u > T || (u == T && ties < rank)) {
                    ties += u == T;
                    sel[n++] = j0 + w;
                }
            }
        mk_sync();
    }
    if (tid == 0) {
        sel[n++] = c;
        while (n < np)
            sel[n++] = -1;
    }
}

/* An evicting layer's scores as its nsplit splits wrote them (ops.h), n
 * slots filled, nsc entries per split and q head. */
typedef struct {
    const float *p;
    int n, nsplit, nsc;
} MkScores;

/* Where slot t < n's scores are: the split s whose range (mk_split_range)
 * has t's block b, s = ceil((b + 1) nsplit / nb) - 1, and t's offset in
 * that split's pieces. Computed once per slot, for all its q heads. */
MK_INLINE void mk_score_slot(MkScores sc, int t, int *s, int *off)
{
    long long nb = (sc.n + MK_SPARSE_BLOCK - 1) / MK_SPARSE_BLOCK, b = t / MK_SPARSE_BLOCK;
    long long sp = ((b + 1) * sc.nsplit - 1) / nb;
    *s = (int)sp;
    *off = t - (int)(sp * nb / sc.nsplit) * MK_SPARSE_BLOCK;
}

/* q head qh's entry at offset off of split s's piece. */
MK_INLINE float mk_score_at(MkScores sc, int qh, int s, int off)
{
    return sc.p[((long long)(qh / MK_G * sc.nsplit + s) * MK_G + qh % MK_G) * sc.nsc + off];
}

/* The splits' ranges in order, without a division per split (the
 * schedules of a GPU cut a head into tens of splits): block b(s) =
 * floor(s nb / nsplit) = s q + floor(s r / nsplit) with q, r = nb / nsplit,
 * nb % nsplit; acc = s r mod nsplit, and b(s + 1) - b(s) = q + (acc + r >=
 * nsplit). mk_walk_next gives split s's [lo, hi) of n rows (mk_split_range). */
typedef struct {
    int n, nsplit, q, r, acc, b;
} MkSplitWalk;

MK_INLINE MkSplitWalk mk_walk_start(int n, int nsplit)
{
    int nb = (n + MK_SPARSE_BLOCK - 1) / MK_SPARSE_BLOCK;
    MkSplitWalk w = {n, nsplit, nb / nsplit, nb % nsplit, 0, 0};
    return w;
}

MK_INLINE void mk_walk_next(MkSplitWalk *w, int *lo, int *hi)
{
    int carry = w->acc + w->r >= w->nsplit, b1 = w->b + w->q + carry;
    w->acc += carry ? w->r - w->nsplit : w->r;
    *lo = w->b * MK_SPARSE_BLOCK < w->n ? w->b * MK_SPARSE_BLOCK : w->n;
    *hi = b1 * MK_SPARSE_BLOCK < w->n ? b1 * MK_SPARSE_BLOCK : w->n;
    w->b = b1;
}

/* mk_sm[2i], mk_sm[2i + 1] = the max and the sum of e^(x - max) over
 * q head qh's scores x, t < n, for q heads qh < MK_NH: a warp per head,
 * a split's piece at a time (slot order); ends with a barrier. */
MK_DEV void mk_softmax_stats(MkScores sc)
{
    unsigned tid = mk_tid(), lane = tid & 31u;
    for (int qh = (int)(tid >> 5); qh < MK_NH; qh += MK_NWARPS) {
        float m = MK_NEG_INF, l = 0.0f;
        int lo, hi;
        MkSplitWalk w = mk_walk_start(sc.n, sc.nsplit);
        for (int s = 0; s < sc.nsplit; s++) {
            mk_walk_next(&w, &lo, &hi);
            for (int t = lo + (int)lane; t < hi; t += 32)
                m = fmaxf(m, mk_score_at(sc, qh, s, t - lo));
        }
        m = mk_warp_max(m);
        w = mk_walk_start(sc.n, sc.nsplit);
        for (int s = 0; s < sc.nsplit; s++) {
            mk_walk_next(&w, &lo, &hi);
            for (int t = lo + (int)lane; t < hi; t += 32)
                l += expf(mk_score_at(sc, qh, s, t - lo) - m);
        }
        l = mk_warp_sum(l);
        if (lane == 0) {
            mk_sm[2 * qh] = m;
            mk_sm[2 * qh + 1] = l;
        }
    }
    mk_sync();
}

/* p[qh] of the slot at offset off of split s, from the stats in mk_sm. */
MK_INLINE float mk_softmax_p(MkScores sc, int qh, int s, int off)
{
    return expf(mk_score_at(sc, qh, s, off) - mk_sm[2 * qh]) / mk_sm[2 * qh + 1];
}

/* Every kv head: meta[h][cap] = the slot the next token takes: pos + 1
 * while pos + 1 < cap, then the policy's victim (ops.h); H2O first adds
 * this step's p, summed over the head's q heads, to acc (zeroed at pos 0)
 * and zeroes the victim's. Per-slot values are read from memory each time
 * (a block-wide argmin per head); only the softmax stats of the q heads
 * are kept, in mk_sm (cuda_layout sizes it). */
MK_DEV void op_kv_evict(const MegacArgs *a, const unsigned *in)
{
    const float *score = (const float *)mk_opnd(a, in, 0);
    int *meta = (int *)mk_opnd(a, in, 1);
    float *acc = (float *)mk_opnd(a, in, 2);
    int pol = mk_param(in, 0), cap = mk_param(in, 1), sinks = mk_param(in, 2), window = mk_param(in, 3);
    int nsplit = mk_param(in, 4);
    long long pos = a->pos;
    int n = pos + 1 < cap ? (int)pos + 1 : cap, full = pos + 1 >= cap;
    MkScores sc = {score, n, nsplit, mk_score_rows(cap, nsplit)};
    unsigned tid = mk_tid();
    if (pol == MK_KV_H2O) {
        if (pos == 0) {
            for (long long i = tid; i < (long long)MK_NKV * cap; i += MK_THREADS)
                acc[i] = 0.0f;
            mk_sync();
        }
        mk_softmax_stats(sc);
        for (int t = (int)tid; t < n; t += MK_THREADS) { /* a slot's place once, for every head */
            int sp, off;
            mk_score_slot(sc, t, &sp, &off);
            for (int h = 0; h < MK_NKV; h++) {
                float p = 0.0f;
                for (int g = 0; g < MK_G; g++)
                    p += mk_softmax_p(sc, h * MK_G + g, sp, off);
                acc[(long long)h * cap + t] += p;
            }
        }
        mk_sync();
    }
    if (!full) {
        for (int h = (int)tid; h < MK_NKV; h += MK_THREADS)
            meta[(long long)h * (cap + 1) + cap] = (int)pos + 1;
        return;
    }
    if (pol == MK_KV_TOVA) {
        mk_softmax_stats(sc);
        float best = 0.0f;
        int idx = -1;
        for (int t = (int)tid; t < n; t += MK_THREADS) {
            float p = 0.0f;
            int sp, off;
            mk_score_slot(sc, t, &sp, &off);
            for (int qh = 0; qh < MK_NH; qh++)
                p += mk_softmax_p(sc, qh, sp, off);
            if (idx < 0 || p < best) {
                best = p;
                idx = t;
            }
        }
        int victim = mk_block_argmin(best, idx);
        for (int h = (int)tid; h < MK_NKV; h += MK_THREADS)
            meta[(long long)h * (cap + 1) + cap] = victim;
        return;
    }
    for (int h = 0; h < MK_NKV; h++) {
        const int *mh = meta + (long long)h * (cap + 1);
        float best = 0.0f;
        int idx = -1;
        for (int t = (int)tid; t < n; t += MK_THREADS) {
            float v = pol == MK_KV_STREAMING ? (mh[t] >= sinks ? (float)mh[t] : MK_INF)
                                             : (mh[t] <= pos - window ? acc[(long long)h * cap + t] : MK_INF);
            if (idx < 0 || v < best) {
                best = v;
                idx = t;
            }
        }
        int victim = mk_block_argmin(best, idx);
        if (tid == 0) {
            meta[(long long)h * (cap + 1) + cap] = victim;
            if (pol == MK_KV_H2O)
                acc[(long long)h * cap + victim] = 0.0f;
        }
    }
}

/* ---- SnapKV (ops.h) ---- */

/* One kv head's pooled scores (sh its snap, L its list's capacity, kh
 * its rows): the window queries' weights summed into s[t] (t < w0; -1
 * marks a row not alive), each query's logits first in lg by position;
 * the max pool into pl (-1: not scored). Returns how many alive rows the
 * window holds (*nsc: the scored ones); block-uniform. */
MK_DEV int mk_snap_score(const int *sh, int L, int W, int pos, const mk_kv *kh, const float *qwin, int h, float *s,
                         float *lg, float *pl, int *nsc)
{
    unsigned tid = mk_tid(), warp = tid >> 5, lane = tid & 31u;
    MkRows r = {MK_SPARSE_SNAP, L, 0, sh};
    int base, n = mk_snap_rows(&r, pos, &base), w0 = pos - W + 1 > 0 ? pos - W + 1 : 0;
    float scale = 1.0f / sqrtf((float)MK_HD);
    for (int t = (int)tid; t < w0; t += MK_THREADS)
        s[t] = -1.0f;
    mk_sync();
    float nw = 0.0f;
    for (int e = (int)tid; e < n; e += MK_THREADS) {
        int t = mk_rows_at(r, pos, e);
        if (t < w0)
            s[t] = 0.0f;
        else
            nw += 1.0f;
    }
    int nwin = (int)mk_block_sum(nw); /* (a barrier) */
    for (int w = w0; w <= pos; w++)
        for (int g = 0; g < MK_G; g++) {
            const float *qv = qwin + ((long long)(w % W) * MK_NH + h * MK_G + g) * MK_HD;
            float m = MK_NEG_INF;
            for (int e = (int)warp; e < n; e += MK_NWARPS) {
                int t = mk_rows_at(r, pos, e);
                if (t > w)
                    break; /* rows ascend */
                float d = 0.0f;
                for (int i = (int)lane; i < MK_HD; i += 32)
                    d += qv[i] * mk_kv_get(kh, (long long)t * MK_HD + i);
                d = mk_warp_sum(d) * scale;
                if (lane == 0)
                    lg[t] = d;
                m = fmaxf(m, d);
            }
            m = mk_block_max(m); /* (barriers: lg is written) */
            float z = 0.0f;
            for (int e = (int)tid; e < n; e += MK_THREADS) {
                int t = mk_rows_at(r, pos, e);
                if (t <= w)
                    z += expf(lg[t] - m);
            }
            z = mk_block_sum(z);
            for (int e = (int)tid; e < n; e += MK_THREADS) {
                int t = mk_rows_at(r, pos, e);
                if (t < w0 && t <= w)
                    s[t] += expf(lg[t] - m) / z * (1.0f / (float)MK_G);
            }
            mk_sync();
        }
    for (int t = (int)tid; t < w0; t += MK_THREADS) { /* max pool, kernel 7 */
        float v = -1.0f;
        for (int u = t - 3 < 0 ? 0 : t - 3; s[t] >= 0.0f && u <= t + 3 && u < w0; u++)
            v = fmaxf(v, s[u]);
        pl[t] = v;
    }
    mk_sync();
    *nsc = n - nwin;
    return nwin;
}

/* A radix select of the K largest values >= 0 among v[h * S + t], h <
 * nseg, t < n: each pass the block's threads take the values in turn and
 * add each matching key's digit into 256 bins in mk_sm (shared adds),
 * thread 0 picks the bin; *T, the key of the K-th largest, and *take, how
 * many keys equal to T to take, the first in the order h, t; block-uniform
 * (counts as floats: below 2^24). */
MK_DEV void mk_radix_select(const float *v, int nseg, int n, int K, unsigned *T, int *take)
{
    unsigned tid = mk_tid(), prefix = 0, mask = 0;
    int rank = K;
    long long all = (long long)nseg * n;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = (int)tid; b < MK_QBINS; b += MK_THREADS)
            mk_sm[b] = 0.0f;
        mk_sync();
        for (long long e = tid; e < all; e += MK_THREADS) {
            float x = v[e / n * MK_MAX_SEQ + e % n];
            unsigned k = mk_fkey(x);
            if (x >= 0.0f && (k & mask) == prefix)
                mk_sm_addf(&mk_sm[(k >> shift) & 255u], 1.0f);
        }
        mk_sync();
        if (tid == 0) {
            int b = MK_QBINS - 1, above = 0;
            for (; b > 0 && above + (int)mk_sm[b] < rank; b--)
                above += (int)mk_sm[b];
            mk_sm[MK_QBINS] = (float)b;
            mk_sm[MK_QBINS + 1] = (float)(rank - above);
        }
        mk_sync();
        prefix |= (unsigned)mk_sm[MK_QBINS] << shift;
        mask |= 255u << shift;
        rank = (int)mk_sm[MK_QBINS + 1];
        mk_sync();
    }
    *T = prefix, *take = rank;
}

/* Every step: pos 0 clears every head's cut; q into qwin[pos % window].
 * At the prompt's last step (MegacArgs.prompt_end), when some kv head has
 * more than `budget` rows alive, the layer is compressed (ops.h): every
 * head's pooled scores into pl[h] (mk_snap_score); thread 0 raises each
 * head's `sure` best to +inf; one select over all heads takes the sum of
 * their quotas (the raised first); thread 0 writes each head's list, the
 * taken rows then its window (the last alive rows), through s into its
 * snap. sc: [nkv + 2][S], scores and logits by position, then pl. */
MK_DEV void op_kv_snap(const MegacArgs *a, const unsigned *in)
{
    const float *q = (const float *)mk_opnd(a, in, 0);
    const mk_kv *kc = (const mk_kv *)mk_opnd(a, in, 1);
    float *qwin = (float *)mk_opnd(a, in, 2), *sc = (float *)mk_opnd(a, in, 4);
    int *snap = (int *)mk_opnd(a, in, 3);
    int C = mk_param(in, 0), W = mk_param(in, 1), safe = mk_param(in, 2), pos = (int)a->pos;
    long long pooled = (long long)C * MK_NKV;
    int L = safe >= C ? C : pooled < MK_MAX_SEQ ? (int)pooled : MK_MAX_SEQ, stride = L + 2; /* snap_list_cap */
    unsigned tid = mk_tid();
    if (pos == 0)
        for (int h = (int)tid; h < MK_NKV; h += MK_THREADS)
            snap[(long long)h * stride] = -1;
    for (int j = (int)tid; j < MK_NH * MK_HD; j += MK_THREADS)
        qwin[(long long)(pos % W) * MK_NH * MK_HD + j] = q[j];
    if (pos != a->prompt_end)
        return;
    mk_sync();
    int over = 0, base, w0 = pos - W + 1 > 0 ? pos - W + 1 : 0, total = 0, take;
    for (int h = 0; h < MK_NKV; h++) {
        MkRows r = {MK_SPARSE_SNAP, L, 0, snap + (long long)h * stride};
        over |= mk_snap_rows(&r, pos, &base) > C;
    }
    if (!over)
        return;
    float *s = sc, *pl = sc + 2 * (long long)MK_MAX_SEQ;
    unsigned T;
    for (int h = 0; h < MK_NKV; h++) {
        int nsc, nwin = mk_snap_score(snap + (long long)h * stride, L, W, pos, kc + (long long)h * MK_MAX_SEQ * MK_HD,
                                      qwin, h, s, sc + MK_MAX_SEQ, pl + (long long)h * MK_MAX_SEQ, &nsc);
        int quota = C - nwin < nsc ? C - nwin : nsc, sure = safe < quota ? safe : quota;
        total += quota;
        if (sure <= 0)
            continue;
        float *ph = pl + (long long)h * MK_MAX_SEQ;
        mk_radix_select(ph, 1, w0, sure, &T, &take);
        if (tid == 0)
            for (int t = 0; t < w0; t++) {
                unsigned k = mk_fkey(ph[t]);
                if (ph[t] >= 0.0f && (k > T || (k == T && take-- > 0)))
                    ph[t] = MK_INF;
            }
        mk_sync();
    }
    mk_radix_select(pl, MK_NKV, w0, total, &T, &take);
    if (tid == 0)
        for (int h = 0; h < MK_NKV; h++) {
            int *sh = snap + (long long)h * stride, k = 0;
            const float *ph = pl + (long long)h * MK_MAX_SEQ;
            for (int t = 0; t < w0; t++) {
                unsigned key = mk_fkey(ph[t]);
                if (ph[t] >= 0.0f && (key > T || (key == T && take-- > 0)))
                    s[k++] = (float)t;
            }
            MkRows r = {MK_SPARSE_SNAP, L, 0, sh};
            int n = mk_snap_rows(&r, pos, &base), e = n;
            while (e > 0 && mk_rows_at(r, pos, e - 1) >= w0) /* the window: the last alive rows */
                e--;
            for (; e < n; e++)
                s[k++] = (float)mk_rows_at(r, pos, e);
            for (int i = 0; i < k; i++) /* k <= L (ops.h) */
                sh[2 + i] = (int)s[i];
            sh[0] = pos, sh[1] = k;
        }
    mk_sync();
}

/* ---- Kascade's top-k rows (ops.h, TOPK_SELECT) ---- */

/* ops.h's topk_rows: the larger of b and ceil(n ppm / 10^6), at most k and n. */
MK_INLINE int mk_topk_rows(int k, int b, int ppm, int n)
{
    long long share = ((long long)n * ppm + 999999) / 1000000, r = share > b ? share : b;
    r = r < k ? r : k;
    return (int)(r < n ? r : n);
}

/* kv head h's rows at pos: warp w takes rows w, w + MK_NWARPS, ... and
 * writes the logits of the G q heads into lg ([G][S]); each q head's
 * softmax is added into p; mk_radix_select finds the key T of the keep-th
 * largest p among rows < pos and how many equal to take; then each thread
 * counts its contiguous chunk of rows, thread 0 turns the counts into
 * offsets (the ties to the lowest rows), and the chunks write their rows
 * into sel, ascending, pos after them, -1 padded. mk_sm: 2 floats a thread. */
MK_DEV void op_topk_select(const MegacArgs *a, const unsigned *in)
{
    const float *q = (const float *)mk_opnd(a, in, 0);
    const mk_kv *kc = (const mk_kv *)mk_opnd(a, in, 1);
    float *sc = (float *)mk_opnd(a, in, 2);
    int h = mk_param(in, 0), k = mk_param(in, 1), pos = (int)a->pos;
    int *sel = (int *)mk_opnd(a, in, 3) + (long long)h * k;
    float *lg = sc + (long long)h * (MK_G + 1) * MK_MAX_SEQ, *p = lg + (long long)MK_G * MK_MAX_SEQ;
    const mk_kv *kh = kc + (long long)h * MK_MAX_SEQ * MK_HD;
    const float *qh = q + (long long)h * MK_G * MK_HD;
    unsigned tid = mk_tid(), warp = tid >> 5, lane = tid & 31u;
    float scale = 1.0f / sqrtf((float)MK_HD);
    for (int t = (int)warp; t <= pos; t += MK_NWARPS)
        for (int g = 0; g < MK_G; g++) {
            float d = 0.0f;
            for (int i = (int)lane; i < MK_HD; i += 32)
                d += qh[g * MK_HD + i] * mk_kv_get(kh, (long long)t * MK_HD + i);
            d = mk_warp_sum(d) * scale;
            if (lane == 0)
                lg[(long long)g * MK_MAX_SEQ + t] = d;
        }
    for (int t = (int)tid; t <= pos; t += MK_THREADS)
        p[t] = 0.0f;
    mk_sync();
    for (int g = 0; g < MK_G; g++) {
        const float *lgg = lg + (long long)g * MK_MAX_SEQ;
        float m = MK_NEG_INF, z = 0.0f;
        for (int t = (int)tid; t <= pos; t += MK_THREADS)
            m = fmaxf(m, lgg[t]);
        m = mk_block_max(m);
        for (int t = (int)tid; t <= pos; t += MK_THREADS)
            z += expf(lgg[t] - m);
        z = mk_block_sum(z);
        for (int t = (int)tid; t <= pos; t += MK_THREADS)
            p[t] += expf(lgg[t] - m) / z;
        mk_sync();
    }
    int keep = mk_topk_rows(k, mk_param(in, 2), mk_param(in, 3), pos + 1) - 1, take;
    int chunk = (pos + MK_THREADS - 1) / MK_THREADS;
    unsigned T;
    mk_radix_select(p, 1, pos, keep, &T, &take);
    int c0 = (int)tid * chunk < pos ? (int)tid * chunk : pos, c1 = c0 + chunk < pos ? c0 + chunk : pos, gt = 0, eq = 0;
    for (int t = c0; t < c1 && keep > 0; t++) {
        unsigned key = mk_fkey(p[t]);
        gt += key > T;
        eq += key == T;
    }
    mk_sm[2 * tid] = (float)gt, mk_sm[2 * tid + 1] = (float)eq;
    mk_sync();
    if (tid == 0)
        for (int i = 0, off = 0, left = take; i < MK_THREADS; i++) { /* chunk i: its offset, its ties taken */
            int g = (int)mk_sm[2 * i], e = (int)mk_sm[2 * i + 1], te = e < left ? e : left;
            mk_sm[2 * i] = (float)off, mk_sm[2 * i + 1] = (float)te;
            off += g + te, left -= te;
        }
    mk_sync();
    int off = (int)mk_sm[2 * tid], te = (int)mk_sm[2 * tid + 1];
    for (int t = c0; t < c1 && keep > 0; t++) {
        unsigned key = mk_fkey(p[t]);
        if (key > T || (key == T && te-- > 0))
            sel[off++] = t;
    }
    for (int i = keep + (int)tid; i < k; i += MK_THREADS)
        sel[i] = i == keep ? pos : -1;
    mk_sync();
}

MK_DEV void mk_op_run(const MegacArgs *a, const unsigned *in)
{
/* Each case only when the schedule has the op (MK_OPS), so that unused
 * bodies are not compiled; the instruction table holds no other op. */
#define MK_RUN(o, body) \
    case o:             \
        if (MK_HAS_OP(o)) \
            body(a, in);  \
        break;
    switch ((in[0] >> 8) & 0xffu) {
    MK_RUN(MK_OP_EMBED, op_embed)
    MK_RUN(MK_OP_RMSNORM, op_rmsnorm)
    MK_RUN(MK_OP_GEMV, op_gemv)
    MK_RUN(MK_OP_ROPE, op_rope)
    MK_RUN(MK_OP_KV_APPEND, op_kv_append)
    MK_RUN(MK_OP_ATTN, op_attn)
    MK_RUN(MK_OP_ATTN_COMBINE, op_attn_combine)
    MK_RUN(MK_OP_SILU_MUL, op_silu_mul)
    MK_RUN(MK_OP_ADD, op_add)
    MK_RUN(MK_OP_ARGMAX, op_argmax)
    MK_RUN(MK_OP_ARGMAX_COMBINE, op_argmax_combine)
    MK_RUN(MK_OP_KV_STORE, op_kv_store)
    MK_RUN(MK_OP_ATTN_SPARSE, op_attn_sparse)
    MK_RUN(MK_OP_QUEST_SELECT, op_quest_select)
    MK_RUN(MK_OP_KV_EVICT, op_kv_evict)
    MK_RUN(MK_OP_KV_SNAP, op_kv_snap)
    MK_RUN(MK_OP_TOPK_SELECT, op_topk_select)
    default: break;
    }
#undef MK_RUN
}

/* ---- synchronization (thread 0 only) ---- */

/* The first block to give up records where; the others just stop. */
MK_DEV void mk_abort_record(const MegacArgs *a, unsigned flag, unsigned worker, unsigned pc, unsigned ctr,
                            unsigned value, unsigned threshold)
{
    MegacAbort *ab = a->abort_info;
    if (!ab || mk_cas(&ab->flag, 0u, flag) != 0u)
        return;
    ab->worker = worker;
    ab->pc = pc;
    ab->counter = ctr;
    ab->value = value;
    ab->threshold = threshold;
    mk_fence();
}

#ifndef MK_SKIP_OPS
#define MK_SKIP_OPS 0
#endif
#ifndef MK_WAIT_SLEEP_MAX
#define MK_WAIT_SLEEP_MAX 256
#endif

/* wait c >= n: acquire loads (at GPU scope; the block's barrier after the
 * wait passes the ordering on to its other threads) with exponential
 * back-off. Returns 0 when the
 * block must stop: the deadline passed (recorded) or another block gave up. */
MK_DEV unsigned mk_wait(const MegacArgs *a, unsigned worker, unsigned pc, unsigned c, unsigned n)
{
    unsigned *ctr = a->counters + c;
    if (mk_ld_acquire(ctr) >= n)
        return 1;
    unsigned long long limit = a->timeout_ns ? a->timeout_ns : MK_DEFAULT_TIMEOUT_NS;
    unsigned long long t0 = mk_time_ns();
    unsigned ns = 32;
    for (;;) {
        for (int i = 0; i < 16; i++) {
            if (mk_ld_acquire(ctr) >= n)
                return 1;
            if (MK_WAIT_SLEEP_MAX) {
                mk_nanosleep(ns);
                ns = ns < MK_WAIT_SLEEP_MAX ? 2 * ns : ns;
            }
        }
        if (a->abort_info && mk_ld_acquire(&a->abort_info->flag) != 0)
            return 0;
        unsigned long long t = mk_time_ns();
        if (t - t0 > limit) {
            /* one last look: a signal at the deadline is no abort, and the
             * value recorded is the one that was short */
            unsigned v = mk_ld_acquire(ctr);
            if (v >= n)
                return 1;
            mk_abort_record(a, MK_ABORT_TIMEOUT, worker, pc, c, v, n);
            return 0;
        }
    }
}

/* ---- profile (MEGAC_CUDA_DEFINES=MK_PROFILE=1, GPU only) ----
 * Thread 0 of each block adds the SM cycles of every instruction it runs
 * (its op and the barrier after it, a signal, a wait) to its worker's row
 * of mk_prof: slots 0..15 by op code, 16 signals, 17 waits, 18 launches;
 * a wait's cycles also go to its counter's total in mk_prof_ctr (all
 * workers), so that the runtime can say which stage's waits cost most.
 * The runtime prints the tables when MEGAC_CUDA_PROFILE is set. */
#if MK_PROFILE && defined(__CUDACC_RTC__)
#define MK_PROF_SLOTS 20
extern "C" {
__device__ unsigned long long mk_prof[MK_NWORKERS * MK_PROF_SLOTS];
__device__ unsigned long long mk_prof_ctr[MK_NCTRS];
}
MK_DEV void mk_prof_wait_add(unsigned w, unsigned c, long long t0)
{
    unsigned long long d = (unsigned long long)(clock64() - t0);
    mk_prof[w * MK_PROF_SLOTS + 17] += d;
    atomicAdd(&mk_prof_ctr[c], d);
}
#define MK_PROF_T0() long long mk_t0_ = clock64()
#define MK_PROF_T0_AGAIN() (mk_t0_ = clock64())
#define MK_PROF_ADD(w, slot) (tid == 0 ? (void)(mk_prof[(w) * MK_PROF_SLOTS + (slot)] += clock64() - mk_t0_) : (void)0)
#define MK_PROF_WAIT(w, c) (tid == 0 ? mk_prof_wait_add((w), (c), mk_t0_) : (void)0)
#else
#define MK_PROF_T0() (void)0
#define MK_PROF_T0_AGAIN() (void)0
#define MK_PROF_ADD(w, slot) (void)0
#define MK_PROF_WAIT(w, c) (void)0
#endif

/* ---- one worker's program ---- */

MK_DEV void mk_worker_run(const MegacArgs *a, unsigned worker)
{
    unsigned tid = mk_tid();
    if (worker >= MK_NWORKERS)
        return;
    if (a->pos < 0 || a->pos >= MK_MAX_SEQ) {
        if (tid == 0)
            mk_abort_record(a, MK_ABORT_BAD_POS, worker, 0xffffffffu, 0xffffffffu, (unsigned)a->pos,
                            (unsigned)MK_MAX_SEQ);
        return;
    }
    /* the program: p indexes prog[0, end) */
    int p = 0, end = megac_k_wstart[worker + 1] - megac_k_wstart[worker];
    const unsigned *prog = megac_k_insts + megac_k_wstart[worker];
#if MK_ISTAGE_BYTES > 0
    {
        unsigned long long *bufs = (unsigned long long *)(void *)(mk_wst + MK_WSTAGE_BYTES / 16);
        unsigned *words = (unsigned *)(void *)(bufs + MK_NBUFS_PAD);
        for (int i = (int)tid; i < (int)(sizeof megac_k_bufs / sizeof megac_k_bufs[0]); i += MK_THREADS)
            bufs[i] = megac_k_bufs[i];
        for (int i = (int)tid; i < end; i += MK_THREADS)
            words[i] = prog[i];
        mk_sync();
        prog = words;
    }
#endif
#if MK_PROFILE && defined(__CUDACC_RTC__)
    if (tid == 0)
        mk_prof[worker * MK_PROF_SLOTS + 18] += 1;
#endif
    const unsigned *prev = 0; /* the instruction before, when it was a GEMV */
    for (unsigned pc = 0; p < end; pc++) {
        const unsigned *in = prog + p;
        unsigned kind = in[0] & 0xffu;
        MK_PROF_T0();
        if (kind == MK_INST_OP && mk_skipped(a, in)) {
            prev = 0; /* every thread of the block skips it */
            p += 2 + (int)MK_NPARAM(in) + (int)MK_NOPND(in);
            continue;
        }
        if (kind == MK_INST_OP) {
            int gemv = MK_HAS_OP(MK_OP_GEMV) && ((in[0] >> 8) & 0xffu) == MK_OP_GEMV;
#if !MK_SKIP_OPS
            if (gemv && mk_gemv_restaged(prev, in)) {
                uint4 none[MK_PRE_N] = {{0u, 0u, 0u, 0u}};
#if MK_XREUSE_COUNT
                if (tid == 0)
                    __atomic_fetch_add(&megac_xreuse_n, 1, __ATOMIC_RELAXED);
#endif
                mk_gemv(a, in, none, 0, mk_no_stage(), 1);
            } else {
                mk_op_run(a, in);
            }
#endif
            prev = gemv ? in : 0;
            mk_sync();
            MK_PROF_ADD(worker, (in[0] >> 8) & 15u);
            p += 2 + (int)MK_NPARAM(in) + (int)MK_NOPND(in);
            continue;
        }
        p += 2;
        prev = 0; /* a signal or a wait: the next GEMV stages its input */
        if (kind == MK_INST_SIGNAL) {
            /* the op before ended with a barrier: the block's writes are
             * done, and the release add publishes them */
            if (tid == 0)
                mk_signal_add(a->counters + (in[0] >> 8), in[1]);
            MK_PROF_ADD(worker, 16);
        } else if (kind == MK_INST_WAIT) {
            /* A GEMV right after this run of waits issues its first
             * round of weight loads now (mk_gemv_preload), or copies its
             * first rounds into the weight pipe (mk_pipe_prime) or its
             * rows into the stage (mk_wstage_issue), so that they travel
             * while the block waits. */
            const unsigned *g = 0;
            uint4 pre[MK_PRE_N];
            int use_pre = 0;
            MkStage st = mk_no_stage();
            if ((MK_PRELOADS > 0 || MK_WSTAGE_BYTES > 0 || MK_WPIPE > 1) && MK_HAS_OP(MK_OP_GEMV)) {
                int q = p;
                while (q < end && (prog[q] & 0xffu) == MK_INST_WAIT)
                    q += 2;
                if (q < end && (prog[q] & 0xffu) == MK_INST_OP &&
                    ((prog[q] >> 8) & 0xffu) == MK_OP_GEMV && !mk_skipped(a, prog + q)) {
                    g = prog + q;
#if MK_WPIPE > 1 && MK_WSTAGE_BYTES == 0
                    if (MK_WPIPE_PRIME && mk_pipe_prime(a, g))
                        use_pre = MK_PIPE_PRIMED;
                    else
#endif
                    if (MK_PRELOADS > 0)
                        use_pre = mk_gemv_preload(a, g, pre);
                    st = mk_wstage_issue(a, g);
                }
            }
            for (;;) {
                /* thread 0 waits; the barrier tells every thread whether
                 * it gave up (a flag in shared memory would be rewritten
                 * by thread 0 at the next wait before the others read it) */
                int stop = mk_sync_or(tid == 0 && !mk_wait(a, worker, pc, in[0] >> 8, in[1]));
                MK_PROF_WAIT(worker, in[0] >> 8);
                if (stop) {
                    mk_cp_wait(); /* no copy outlives the block */
                    return;
                }
                if (!g || (prog[p] & 0xffu) != MK_INST_WAIT)
                    break;
                in = prog + p; /* the run's next wait */
                p += 2;
                pc++;
                MK_PROF_T0_AGAIN();
            }
            if (g) { /* the GEMV, its first round in pre or its rows staged */
                pc++;
                MK_PROF_T0_AGAIN();
                if (st.g1 != st.g0) { /* each thread's copies done, then everyone's */
                    mk_cp_wait();
                    mk_sync();
                }
#if !MK_SKIP_OPS
                mk_gemv(a, g, pre, use_pre, st, 0);
#endif
                prev = g;
                mk_sync();
                MK_PROF_ADD(worker, (g[0] >> 8) & 15u);
                p += 2 + (int)MK_NPARAM(g) + (int)MK_NOPND(g);
            }
        }
    }
}
