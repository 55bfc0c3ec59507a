/*
 * kernel_body.c - the CPU megakernel's op bodies and dispatch loop, in plain
 * C. It is not compiled into megac: the build turns it into LLVM bitcode
 * (clang -emit-llvm, no vectorization yet), megac embeds the bitcode, and at
 * compile time cpu_emit.c links it with a glue module that defines the
 * schedule's instruction table and the model shape as constants (see
 * kernel_table.h), then optimizes the whole for the target CPU. Loads from
 * the shape table fold to constants, so the bodies end up specialized to the
 * model; the loop over the instruction table is the validated schedule.
 *
 * Semantics of every op: ir/ops.h. Synchronization: `signal` is a release
 * atomic add; `wait` spins with acquire loads and pause, yields past a
 * bound, then sleeps on a futex (so more workers than cores stay fast;
 * where each worker has a CPU of its own, only after MegacArgs.spin_ns).
 * It gives up past the watchdog deadline, recording where in
 * MegacArgs.abort_info; a worker that sees the abort flag returns.
 *
 * Wide vectors are written with the generic vector extension (16 floats);
 * the backend splits them to what the target has (AVX2: 2 x 8, AVX-512: 1).
 * Decode reads every weight once per step, so the bodies are shaped for
 * memory streams (measured on the build host, see tests/test_cpu_ops.c):
 * GEMV reads one row at a time as a single sequential stream (faster than
 * interleaving four rows, and than software prefetch on top); attention
 * serves all q heads of a kv head from each group of k/v rows while it is
 * in L1 and prefetches rows ahead, since its work per cache line is too
 * large for the out-of-order window alone to keep the stream going.
 * Weights of the GEMV and the embedding may be f16, bf16 or quantized
 * (ir/dtype.h): they are dequantized in registers, inside the dot product.
 *
 * Quantized GEMV (decode is bound by reading weights, so these kernels must
 * keep up with memory: tests/test_cpu_quant_perf.c measures them) takes
 * four rows per pass, sharing x loads, loop overhead and the conversion of
 * group headers; a pass past the last row repeats it and drops the
 * results. Their weights are prefetched as one stream per worker that
 * runs QPF_BYTES ahead across tiles (WStream). A16 formats keep x exact
 * (exact weights, f32 sums; on AVX2 and AVX-512 VNNI hosts the 4-bit and
 * k-quant rows, on AVX-512 VNNI hosts also the Q8_0 ones, meet x as three
 * byte planes of 23-bit fixed point per block of 32, rounded to max|x_b|
 * 2^-23, in integer dot products, and W8 rows there four planes of 30-bit
 * fixed point per op; tiny or non-finite x takes the float loops); A8
 * formats (W8A8, W4A8G*, and GGUF blocks as Q4_0A8, Q4_1A8, Q5_0A8,
 * Q5_1A8, Q8_0A8, Q2_KA8 to Q6_KA8, IQ4_NLA8 and IQ4_XSA8) quantize
 * x once per op to int8 and take integer dot products per block of 32
 * (IQ4's values by vpshufb). Q4_0, Q4_1, Q5_0,
 * Q5_1, W4G32 and their A8 forms (Q4_0A8, W4A8G32, Q4_1A8, Q5_0A8,
 * Q5_1A8) rows arrive packed
 * (kernel_table.h, compiler/quant.c): in float, one AND and one
 * conversion per 16 weights, on every instruction set (W4A8G32: two u8 x
 * s8 dot products per 128 weights). GGUF's k-quants (Q2_K to Q6_K) are
 * read as stored with the same trick (Q3_K and Q2_K as integer rows with
 * AVX-512 VNNI and on AVX2-only hosts; on AVX-512 without VNNI, and for x
 * the integer rows refuse, tables of their values). IQ4_NL
 * (packed too, its nibbles as stored) and IQ4_XS rows go four at a time,
 * their nibbles looked up among the 16 values (vpermps on AVX-512, vpshufb
 * on AVX2). A run
 * of GEMVs with one input and no wait between them (q/k/v, gate/up)
 * normalizes and prepares that input once (gemv_run_length).
 *
 * Instruction sets: the bitcode is built for generic x86-64, and cpu_emit.c
 * retargets every function to the chosen CPU. Code that needs intrinsics
 * lives in functions named isa_<set>_* with __attribute__((target(...)))
 * (so clang accepts the builtins), called only under a test of
 * megac_k_isa, a constant (KT_ISA_* bits, kernel_table.h) that cpu_emit.c
 * defines from the target's features. The test folds at O3, the other
 * versions lose their callers and are deleted (cpu_emit.c checks that no
 * version the target cannot run is left). Versions:
 *   AVX-512      W4G64, W4G128: a 16-float table per group and row,
 *                T[q] = s (q - z), looked up with vpermps; Q8_0 scales by
 *                vcvtph2ps
 *   AVX-512 VNNI W8A8, W4A8G* with vpdpbusd on 512 bits; the packed
 *                4/5-bit rows, W4G64/W4G128 and the k-quants too, x as
 *                fixed point, and the k-quants' A8 forms
 *   AVX-VNNI     W8A8, W4A8G* with vpdpbusd on 256 bits
 *   AVX2         W8A8, W4A8G* with vpmaddubsw + vpmaddwd
 *   generic      everything (generic vectors), the reference for the rest
 */
#define _GNU_SOURCE
#include "codegen/cpu/kernel_table.h"
#include "ir/dtype.h"
#include "ir/ops.h"
#include "runtime/half.h"
#include "runtime/kernel_abi.h"

#include <linux/futex.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Defined by the glue module. */
extern const int64_t megac_k_insts[];
extern const int32_t megac_k_wstart[];
extern const int64_t megac_k_shape[];
extern const float megac_k_eps;
extern const uint32_t megac_k_nworkers;
extern const int32_t megac_k_isa; /* KT_ISA_* bits, defined by cpu_emit.c */
extern const int32_t megac_k_tune; /* KT_TUNE_* bits, defined by cpu_emit.c */
extern const uint32_t megac_k_ops;  /* bit o: the schedule has opcode o */
extern const uint64_t megac_k_dts;  /* bit t: an operand of dtype t */

/* Tests of these fold at O3, so the bodies of ops and weight formats the
 * schedule does not use are dropped from kernel.so (and from its compile
 * time). */
#define HAS_OP(o) ((megac_k_ops >> (o)) & 1u)
#define HAS_DT(t) ((megac_k_dts >> (t)) & 1u)

void megac_worker(const MegacArgs *a, uint32_t worker);

/* Same values as InstKind of ir/ir.h (not included: it drags in stdio). */
enum { K_INST_OP, K_INST_SIGNAL, K_INST_WAIT };

#define SHAPE(i) megac_k_shape[i]
#define NEG_INF (-__builtin_inff())

typedef float v16f __attribute__((vector_size(64)));
typedef float v16fu __attribute__((vector_size(64), aligned(4)));
#define LOAD16(p) (*(const v16fu *)(p))
#define STORE16(p, v) (*(v16fu *)(p) = (v))

/* ---- helpers ---- */

typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

/* Sum of the 16 lanes, as a tree of halving adds. */
static float hsum16(const v16f *v)
{
    v8f h8 = __builtin_shufflevector(*v, *v, 0, 1, 2, 3, 4, 5, 6, 7) +
             __builtin_shufflevector(*v, *v, 8, 9, 10, 11, 12, 13, 14, 15);
    v4f h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

/* The sums of four vectors' 16 lanes, as one vector: a tree of halving
 * adds over all four at once (~14 shuffles and adds where four hsum16
 * calls take ~36, which a four-row kernel of short rows pays per row). */
static inline __attribute__((always_inline)) v4f hsum16x4(const v16f a[4])
{
    v16f s01 = __builtin_shufflevector(a[0], a[1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[0], a[1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    v16f s23 = __builtin_shufflevector(a[2], a[3], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[2], a[3], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    /* lanes 4 i .. 4 i + 3: vector i's four partial sums */
    v16f t = __builtin_shufflevector(s01, s23, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
             __builtin_shufflevector(s01, s23, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    t += __builtin_shufflevector(t, t, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    t += __builtin_shufflevector(t, t, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return __builtin_shufflevector(t, t, 0, 4, 8, 12);
}

/* The same for four vectors of 4. */
static inline __attribute__((always_inline)) v4f hsum4x4(const v4f a[4])
{
    v4f s01 = __builtin_shufflevector(a[0], a[1], 0, 1, 4, 5) + __builtin_shufflevector(a[0], a[1], 2, 3, 6, 7);
    v4f s23 = __builtin_shufflevector(a[2], a[3], 0, 1, 4, 5) + __builtin_shufflevector(a[2], a[3], 2, 3, 6, 7);
    return __builtin_shufflevector(s01, s23, 0, 2, 4, 6) + __builtin_shufflevector(s01, s23, 1, 3, 5, 7);
}

static float dot_f32(const float *a, const float *b, int64_t n)
{
    v16f acc = {0};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        acc += LOAD16(a + j) * LOAD16(b + j);
    float s = hsum16(&acc);
    for (; j < n; j++)
        s += a[j] * b[j];
    return s;
}

/* 1 / sqrt(mean(x[0:n]^2) + eps) */
static float rms_scale(const float *x, int64_t n)
{
    return 1.0f / sqrtf(dot_f32(x, x, n) / (float)n + megac_k_eps);
}

/* Address of operand i of an instruction; NULL when absent. */
static void *opnd(const MegacArgs *a, const int64_t *in, int i)
{
    uint64_t w = (uint64_t)in[KT_OPND + i];
    if (w == KT_NONE)
        return NULL;
    if (w & KT_ARENA)
        return (char *)a->arena + (w & ~KT_ARENA);
    return (char *)(uintptr_t)a->weights + w;
}

/* Whether this step skips op `in`: it is output-only and the step was run
 * without outputs (MEGAC_STEP_NO_OUTPUT). */
static int op_skipped(const MegacArgs *a, const int64_t *in)
{
    return ((uint64_t)in[KT_DTYPES] & KT_OUTPUT_ONLY) && (a->flags & MEGAC_STEP_NO_OUTPUT);
}

static int opnd_dtype(const int64_t *in, int i)
{
    return (int)(((uint64_t)in[KT_DTYPES] >> (8 * i)) & 0xff);
}

/* Bytes of a KV cache element of dtype kt (f32, f16, bf16: kv_put). */
static inline __attribute__((always_inline)) int64_t kv_esize(int kt)
{
    return kt == DT_F32 ? 4 : 2;
}

/* The dtype of an instruction's cache rows (its k rows' operand). */
static int kv_dtype(const int64_t *in, int kc)
{
    int t = opnd_dtype(in, kc);
    return t == DT_F16 || t == DT_BF16 ? t : DT_F32;
}

/* ---- quantized and half-precision weights (layouts: ir/dtype.h) ----
 * Dequantization happens in registers inside the dot products: a block's
 * integers are widened to floats, multiplied with x, and the block (or
 * row, or group) scale is applied to the partial sum. No dequantized copy
 * of a weight exists. Row r of a matrix starts at r * qrow_bytes(t, k). */

typedef int8_t v16i8 __attribute__((vector_size(16), aligned(1)));
typedef uint8_t v16u8 __attribute__((vector_size(16), aligned(1)));

static float f16_at(const unsigned char *p)
{
    return half_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static float bf16_at(const unsigned char *p)
{
    return half_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* W4 group size of a W4G* dtype. */
static int64_t w4_gsize(int t)
{
    return t == DT_W4G32 ? 32 : t == DT_W4G64 ? 64 : 128;
}

static int64_t w4_group_bytes(int64_t len)
{
    return 4 + 16 * ((len + 31) / 32);
}

/* The A16 dtype with the same bytes (ir/dtype.h). */
static int qlayout(int t)
{
    return (int)dtype_layout((DType)t);
}

/* Bytes of a row of k elements (ir/dtype.c's dtype_row_bytes). */
static int64_t qrow_bytes(int t, int64_t k)
{
    switch (qlayout(t)) {
    case DT_F32: return 4 * k;
    case DT_F16: case DT_BF16: return 2 * k;
    case DT_Q8_0: return k / 32 * 34;
    case DT_Q4_0: return k / 32 * 18;
    case DT_Q4_1: return k / 32 * 20;
    case DT_Q5_0: return k / 32 * 22;
    case DT_Q5_1: return k / 32 * 24;
    case DT_Q4_K: return k / 256 * 144;
    case DT_Q5_K: return k / 256 * 176;
    case DT_Q6_K: return k / 256 * 210;
    case DT_Q3_K: return k / 256 * 110;
    case DT_Q2_K: return k / 256 * 84;
    case DT_IQ4_NL: return k / 32 * 18;
    case DT_IQ4_XS: return k / 256 * 136;
    case DT_W8: return 4 + (k + 3) / 4 * 4;
    default: {
        int64_t g = w4_gsize(qlayout(t));
        return k / g * w4_group_bytes(g) + (k % g ? w4_group_bytes(k % g) : 0);
    }
    }
}

/* Element j of a W4 group: the Q4_0-like nibble of chunk j / 32. */
static int w4_nib(const unsigned char *qs, int64_t j)
{
    int64_t i = j % 32;
    unsigned b = qs[16 * (j / 32) + i % 16];
    return (int)(i < 16 ? b & 15 : b >> 4);
}

/* ---- Q5_0, Q5_1 and the k-quants (layouts: ir/dtype.h) ----
 * Blocks as GGUF stores them; the values are those of compiler/quant.c
 * (ggml's dequantizers): (d * sc) * q - dmin * m for Q4_K/Q5_K,
 * (d * sc) * (q - 32) for Q6_K. The dot products apply a sub-block's
 * scale to its partial sum (sum (s q - m) x = s sum q x - m sum x). */

/* Sub-block s's 6-bit scale and min of a Q4_K/Q5_K super-block. */
static void kq_scale_min(const unsigned char *sc, int s, float *d, float *m)
{
    int a = s < 4 ? sc[s] & 63 : (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
    int b = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    *d = (float)a;
    *m = (float)b;
}

static uint32_t u32_at(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Q3_K's 6-bit scale of sub-block s (< 16), less 32 (ggml's packing:
 * 4 low bits in scales[s % 8], by nibble s / 8; 2 high bits in
 * scales[8 + s % 4] at bit 2 (s / 4)). */
static int q3k_scale(const unsigned char *sc, int s)
{
    int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4, hi = sc[8 + s % 4] >> (2 * (s / 4)) & 3;
    return (lo | hi << 4) - 32;
}

/* IQ4's non-linear 4-bit values (ggml's kvalues_iq4nl), and as floats. */
static const int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const float iq4_values_f[16] __attribute__((aligned(64))) = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                                    1,    13,   25,  38,  53,  69,  89,  113};

/* ls - 32 of sub-block s (< 8) of the IQ4_XS super-block b. */
static int iq4xs_ls(const unsigned char *b, int s)
{
    return ((b[4 + s / 2] >> (4 * (s % 2)) & 15) | ((b[2] | b[3] << 8) >> (2 * s) & 3) << 4) - 32;
}

/* d * (ls - 32) of sub-block s (< 8) of the IQ4_XS super-block b. */
static float iq4xs_scale(const unsigned char *b, int s)
{
    return f16_at(b) * (float)iq4xs_ls(b, s);
}

/* Element j of a Q5_0/Q5_1/Q2_K-Q6_K/IQ4_XS row. */
static float gguf_elem(int t, const unsigned char *row, int64_t j)
{
    if (t == DT_Q5_0 || t == DT_Q5_1) {
        int q51 = t == DT_Q5_1, e = (int)(j % 32);
        const unsigned char *b = row + j / 32 * (q51 ? 24 : 22), *qs = b + (q51 ? 8 : 6);
        int q = (e < 16 ? qs[e] & 15 : qs[e - 16] >> 4) | (int)(u32_at(b + (q51 ? 4 : 2)) >> e & 1) << 4;
        return q51 ? f16_at(b) * (float)q + f16_at(b + 2) : f16_at(b) * (float)(q - 16);
    }
    int e = (int)(j % 256);
    if (t == DT_Q6_K) {
        const unsigned char *b = row + j / 256 * 210;
        int h = e / 128, i = e % 128 / 32, l = e % 32;
        const unsigned char *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        int lo = i < 2 ? ql[l + 32 * (i & 1)] & 15 : ql[l + 32 * (i & 1)] >> 4;
        int v = (lo | ((qh[l] >> (2 * i)) & 3) << 4) - 32;
        return f16_at(b + 208) * (float)(int8_t)b[192 + 8 * h + 2 * i + l / 16] * (float)v;
    }
    if (t == DT_Q3_K || t == DT_Q2_K) {
        int h = e / 128, i = e % 128 / 32, l = e % 32, sb = e / 16;
        if (t == DT_Q2_K) {
            const unsigned char *b = row + j / 256 * 84;
            int q = b[16 + 32 * h + l] >> (2 * i) & 3;
            return f16_at(b + 80) * (float)(b[sb] & 15) * (float)q - f16_at(b + 82) * (float)(b[sb] >> 4);
        }
        const unsigned char *b = row + j / 256 * 110;
        int q = (b[32 + 32 * h + l] >> (2 * i) & 3) - ((b[l] >> (4 * h + i) & 1) ? 0 : 4);
        return f16_at(b + 108) * (float)q3k_scale(b + 96, sb) * (float)q;
    }
    if (t == DT_IQ4_XS) {
        const unsigned char *b = row + j / 256 * 136, *qs = b + 8 + 16 * (e / 32);
        int l = e % 32;
        return iq4xs_scale(b, e / 32) * (float)iq4_values[l < 16 ? qs[l] & 15 : qs[l - 16] >> 4];
    }
    int q5 = t == DT_Q5_K, s = e / 32, l = e % 32;
    const unsigned char *b = row + j / 256 * (q5 ? 176 : 144), *qs = b + (q5 ? 48 : 16) + 32 * (s / 2);
    int q = s % 2 ? qs[l] >> 4 : qs[l] & 15;
    if (q5)
        q += (b[16 + l] >> s & 1) << 4;
    float sc, m;
    kq_scale_min(b + 4, s, &sc, &m);
    return f16_at(b) * sc * (float)q - f16_at(b + 2) * m;
}

/* Header bytes per block of a packed 4-bit dtype (kernel_table.h). */
static int pk_hdr(int t)
{
    return t == DT_Q4_0 || t == DT_IQ4_NL ? 2 : t == DT_Q5_0 ? 6 : t == DT_Q5_1 ? 8 : 4;
}

/* Rows of t at k in the 4-bit packed order (superblocks of four blocks:
 * gemv_packed, gemv_pka8); Q8_0's packing is its own (the four-row Q8_0
 * kernels read it), and IQ4_NL's nibbles stay in their own order (the IQ4
 * kernels read it: iq4nl_block). */
static int pk_nib_rows(int t, int64_t k)
{
    return qlayout(t) != DT_Q8_0 && qlayout(t) != DT_IQ4_NL && kt_row_packed(t, k);
}

/* Block b of an IQ4_NL row of k elements, packed (kernel_table.h) or as
 * stored: its 16 bytes of nibbles, and where its f16 scale is (*d). */
static inline __attribute__((always_inline)) const unsigned char *iq4nl_block(const unsigned char *row, int64_t k,
                                                                             int64_t b, const unsigned char **d)
{
    if (!kt_row_packed(DT_IQ4_NL, k)) {
        *d = row + 18 * b;
        return row + 18 * b + 2;
    }
    int64_t s0 = b / 4 * 4, nb = k / 32;
    int nblk = nb - s0 < 4 ? (int)(nb - s0) : 4, i = (int)(b - s0);
    const unsigned char *sb = row + 18 * s0;
    *d = sb + 2 * i;
    return sb + 2 * nblk + 16 * i;
}

/* A two-block last superblock's inputs duplicated for the kernels that
 * take two rows' such superblocks as one (pk_tail2): superblock nsb - 1's
 * `chunk` bytes of x (planes of 128 bytes, each two halves of 16 lanes)
 * copied to superblock nsb's, each half's lanes 0-7 also in lanes 8-15,
 * and its blocks' per-block values (sums, scales) as blocks 0, 1, 0, 1. */
static void pk_tail_dup(int8_t *xq, int64_t chunk, float *f0, float *f1, int64_t nsb)
{
    const int8_t *src = xq + chunk * (nsb - 1);
    int8_t *dst = xq + chunk * nsb;
    for (int64_t h = 0; h < chunk; h += 64) {
        memcpy(dst + h, src + h, 32);
        memcpy(dst + h + 32, src + h, 32);
    }
    for (int i = 0; i < 4; i++) {
        f0[4 * nsb + i] = f0[4 * (nsb - 1) + i % 2];
        if (f1)
            f1[4 * nsb + i] = f1[4 * (nsb - 1) + i % 2];
    }
}

/* Element j of a packed row of k elements (kernel_table.h). */
static float pk_elem(int t, const unsigned char *row, int64_t k, int64_t j)
{
    t = qlayout(t);
    if (t == DT_Q8_0) /* the row's scales, then its integers */
        return f16_at(row + 2 * (j / 32)) * (float)(int8_t)row[2 * (k / 32) + j];
    int64_t nb = k / 32, blk = j / 32, s0 = blk / 4 * 4;
    int nblk = nb - s0 < 4 ? (int)(nb - s0) : 4, i = (int)(blk - s0), e = (int)(j % 32), n = e / 4;
    int hdr = pk_hdr(t);
    const unsigned char *sb = row + s0 * (hdr + 16);
    float d = f16_at(sb + 2 * i);
    if (t == DT_IQ4_NL) /* its nibbles as stored */
        return d * (float)iq4_values[(sb[2 * nblk + 16 * i + e % 16] >> (e < 16 ? 0 : 4)) & 15];
    int q = (sb[hdr * nblk + 16 * i + 4 * (e % 4) + n / 2] >> (4 * (n % 2))) & 15;
    if (t == DT_Q5_0 || t == DT_Q5_1)
        q |= (int)(u32_at(sb + (t == DT_Q5_0 ? 2 : 4) * nblk + 4 * i) >> e & 1) << 4;
    if (t == DT_Q4_0)
        return d * (float)(q - 8);
    if (t == DT_Q5_0)
        return d * (float)(q - 16);
    if (t == DT_Q4_1 || t == DT_Q5_1)
        return d * (float)q + f16_at(sb + 2 * nblk + 2 * i);
    return d * (float)(q - sb[2 * nblk + i]);
}

/* Element j of row `row` (k elements) of dtype t, dequantized: for the
 * embedding gather, one row per step. */
static float qelem(int t, const unsigned char *row, int64_t k, int64_t j)
{
    const unsigned char *b;
    if (kt_row_packed(t, k))
        return pk_elem(t, row, k, j);
    t = qlayout(t);
    switch (t) {
    case DT_F32: { float f; memcpy(&f, row + 4 * j, 4); return f; }
    case DT_F16: return f16_at(row + 2 * j);
    case DT_BF16: return bf16_at(row + 2 * j);
    case DT_Q8_0: b = row + j / 32 * 34; return f16_at(b) * (float)(int8_t)b[2 + j % 32];
    case DT_Q4_0: b = row + j / 32 * 18; return f16_at(b) * (float)(((b[2 + j % 16] >> (j % 32 < 16 ? 0 : 4)) & 15) - 8);
    case DT_Q4_1: {
        b = row + j / 32 * 20;
        float lo = f16_at(b) * (float)((b[4 + j % 16] >> (j % 32 < 16 ? 0 : 4)) & 15);
        return lo + f16_at(b + 2);
    }
    case DT_Q5_0: case DT_Q5_1: case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: case DT_Q3_K: case DT_Q2_K: case DT_IQ4_XS:
        return gguf_elem(t, row, j);
    case DT_IQ4_NL:
        b = row + j / 32 * 18;
        return f16_at(b) * (float)iq4_values[(b[2 + j % 16] >> (j % 32 < 16 ? 0 : 4)) & 15];
    case DT_W8: { float s; memcpy(&s, row, 4); return s * (float)(int8_t)row[4 + j]; }
    default: {
        int64_t g = w4_gsize(t);
        b = row + j / g * w4_group_bytes(g);
        (void)k;
        return f16_at(b) * (float)(w4_nib(b + 4, j % g) - b[2]);
    }
    }
}

/* Widening loads (macros: a v16f return value would change the ABI). */
#define WIDEN_I8(p) __builtin_convertvector(*(const v16i8 *)(p), v16f)
#define NIB_LO(q) __builtin_convertvector((q) & (uint8_t)15, v16f)
#define NIB_HI(q) __builtin_convertvector((q) >> (uint8_t)4, v16f)

/* Q8_0 in the stored order: rows of k > QFAST_K_MAX (= KT_PACK_K_MAX), which
 * are not packed (the shorter ones take q8_0_groups4 and its kin). */
static float dot_q8_0(const unsigned char *b, const float *x, int64_t k)
{
    v16f acc = {0};
    for (int64_t j = 0; j < k; j += 32, b += 34)
        acc += f16_at(b) * (WIDEN_I8(b + 2) * LOAD16(x + j) + WIDEN_I8(b + 18) * LOAD16(x + j + 16));
    return hsum16(&acc);
}

static float dot_q4_0(const unsigned char *b, const float *x, int64_t k)
{
    v16f acc = {0};
    for (int64_t j = 0; j < k; j += 32, b += 18) {
        v16u8 q = *(const v16u8 *)(b + 2);
        acc += f16_at(b) * ((NIB_LO(q) - 8.0f) * LOAD16(x + j) + (NIB_HI(q) - 8.0f) * LOAD16(x + j + 16));
    }
    return hsum16(&acc);
}

/* sum (d q + m) x = d sum q x + m sum x, per block */
static float dot_q4_1(const unsigned char *b, const float *x, int64_t k)
{
    v16f acc = {0};
    for (int64_t j = 0; j < k; j += 32, b += 20) {
        v16u8 q = *(const v16u8 *)(b + 4);
        v16f x0 = LOAD16(x + j), x1 = LOAD16(x + j + 16);
        acc += f16_at(b) * (NIB_LO(q) * x0 + NIB_HI(q) * x1) + f16_at(b + 2) * (x0 + x1);
    }
    return hsum16(&acc);
}

static float dot_w8(const unsigned char *row, const float *x, int64_t k)
{
    float s;
    memcpy(&s, row, 4);
    const unsigned char *q = row + 4;
    v16f acc = {0};
    int64_t j = 0;
    for (; j + 16 <= k; j += 16)
        acc += WIDEN_I8(q + j) * LOAD16(x + j);
    float t = hsum16(&acc);
    for (; j < k; j++)
        t += (float)(int8_t)q[j] * x[j];
    return s * t;
}

/* One W4 group of len elements at g against x[0:len]: the full chunks of
 * 32 into *acc (scaled), the rest returned as a scalar. */
static float dot_w4_group(const unsigned char *g, const float *x, int64_t len, v16f *acc)
{
    float z = (float)g[2], s = f16_at(g);
    const unsigned char *qs = g + 4;
    v16f ga = {0};
    int64_t j = 0;
    for (; j + 32 <= len; j += 32, qs += 16) {
        v16u8 q = *(const v16u8 *)qs;
        ga += (NIB_LO(q) - z) * LOAD16(x + j) + (NIB_HI(q) - z) * LOAD16(x + j + 16);
    }
    *acc += s * ga;
    float t = 0;
    for (int64_t i = 0; j + i < len; i++)
        t += (float)(w4_nib(qs, i) - g[2]) * x[j + i];
    return s * t;
}

static float dot_w4(int t, const unsigned char *row, const float *x, int64_t k)
{
    int64_t gs = w4_gsize(t);
    v16f acc = {0};
    float tail = 0;
    for (int64_t j = 0; j < k; j += gs) {
        int64_t len = k - j < gs ? k - j : gs;
        tail += dot_w4_group(row, x + j, len, &acc);
        row += w4_group_bytes(len);
    }
    return hsum16(&acc) + tail;
}

typedef uint16_t v16u16 __attribute__((vector_size(32), aligned(2)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));

/* N f16 values (vector h) to f32 (vector out; VU/VF the N-lane u32 and
 * f32 vector types), with masks instead of branches: normal numbers by
 * rebiasing the exponent, subnormals as u * 2^-24, inf/nan kept. (A macro:
 * a vector return value would change the ABI.) */
#define F16XN(h, out, VU, VF)                                                            \
    do {                                                                                 \
        VU u_ = __builtin_convertvector((h) & (uint16_t)0x7fff, VU);                     \
        VU s_ = __builtin_convertvector((h) & (uint16_t)0x8000, VU) << 16;               \
        VF sf_ = __builtin_convertvector(u_, VF) * 0x1p-24f;                             \
        VU sub_ = (VU)sf_, big_ = (u_ << 13) | 0x7f800000u;                              \
        VU nrm_ = (u_ << 13) + 0x38000000u;                                              \
        VU m1_ = (VU)(u_ < 0x400u), m2_ = (VU)(u_ >= 0x7c00u);                           \
        VU r_ = (sub_ & m1_) | (~m1_ & ((big_ & m2_) | (nrm_ & ~m2_)));                  \
        (out) = (VF)(r_ | s_);                                                           \
    } while (0)
#define F16X16(h, out) F16XN(h, out, v16u32, v16f)

static float dot_half(int t, const unsigned char *row, const float *x, int64_t k)
{
    v16f acc = {0}, w;
    int64_t j = 0;
    for (; j + 16 <= k; j += 16) {
        v16u16 h = *(const v16u16 *)(row + 2 * j);
        if (t == DT_F16)
            F16X16(h, w);
        else
            w = (v16f)(__builtin_convertvector(h, v16u32) << 16);
        acc += w * LOAD16(x + j);
    }
    float s = hsum16(&acc);
    for (; j < k; j++)
        s += (t == DT_F16 ? f16_at(row + 2 * j) : bf16_at(row + 2 * j)) * x[j];
    return s;
}

/* ---- Q5_0, Q5_1 and k-quant rows (gguf_elem above) ---- */

static const v16u32 iota16 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* Q5_0 (m = 0, bias 16) and Q5_1 (m = the block's min, bias 0). */
static float dot_q5(int q51, const unsigned char *b, const float *x, int64_t k)
{
    v16f acc = {0};
    int64_t bb = q51 ? 24 : 22, h = q51 ? 4 : 2;
    float bias = q51 ? 0.0f : 16.0f;
    for (int64_t j = 0; j < k; j += 32, b += bb) {
        v16u8 q = *(const v16u8 *)(b + h + 4);
        v16u32 qh = (v16u32){0} + u32_at(b + h);
        v16f h0 = __builtin_convertvector((qh >> iota16 & 1u) << 4, v16f);
        v16f h1 = __builtin_convertvector((qh >> (iota16 + 16u) & 1u) << 4, v16f);
        v16f x0 = LOAD16(x + j), x1 = LOAD16(x + j + 16);
        acc += f16_at(b) * ((NIB_LO(q) + h0 - bias) * x0 + (NIB_HI(q) + h1 - bias) * x1);
        if (q51)
            acc += f16_at(b + 2) * (x0 + x1);
    }
    return hsum16(&acc);
}

/* Q4_K and Q5_K: per sub-block, (d sc) sum q x - (dmin m) sum x. */
static float dot_q45k(int q5, const unsigned char *b, const float *x, int64_t k)
{
    v16f acc = {0};
    for (int64_t j = 0; j < k; j += 256, b += q5 ? 176 : 144) {
        float d = f16_at(b), dmin = f16_at(b + 2);
        const unsigned char *qs = b + (q5 ? 48 : 16);
        v16u8 h0 = {0}, h1 = {0};
        if (q5) {
            h0 = *(const v16u8 *)(b + 16);
            h1 = *(const v16u8 *)(b + 32);
        }
        for (int c = 0; c < 4; c++, qs += 32) {
            v16u8 q0 = *(const v16u8 *)qs, q1 = *(const v16u8 *)(qs + 16);
            const float *xc = x + j + 64 * c;
            v16f xa = LOAD16(xc), xb = LOAD16(xc + 16), xd = LOAD16(xc + 32), xe = LOAD16(xc + 48);
            v16f lo0 = NIB_LO(q0), lo1 = NIB_LO(q1), hi0 = NIB_HI(q0), hi1 = NIB_HI(q1);
            if (q5) {
                uint8_t sl = (uint8_t)(2 * c), sh = (uint8_t)(2 * c + 1);
                lo0 += __builtin_convertvector((h0 >> sl & 1) << 4, v16f);
                lo1 += __builtin_convertvector((h1 >> sl & 1) << 4, v16f);
                hi0 += __builtin_convertvector((h0 >> sh & 1) << 4, v16f);
                hi1 += __builtin_convertvector((h1 >> sh & 1) << 4, v16f);
            }
            float s0, m0, s1, m1;
            kq_scale_min(b + 4, 2 * c, &s0, &m0);
            kq_scale_min(b + 4, 2 * c + 1, &s1, &m1);
            acc += (d * s0) * (lo0 * xa + lo1 * xb) - (dmin * m0) * (xa + xb);
            acc += (d * s1) * (hi0 * xd + hi1 * xe) - (dmin * m1) * (xd + xe);
        }
    }
    return hsum16(&acc);
}

/* Q6_K: per 16 elements, (d sc) sum (q - 32) x. */
static float dot_q6k(const unsigned char *b, const float *x, int64_t k)
{
    v16f acc = {0};
    for (int64_t j = 0; j < k; j += 256, b += 210) {
        float d = f16_at(b + 208);
        for (int h = 0; h < 2; h++) {
            const unsigned char *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
            for (int i = 0; i < 4; i++)
                for (int u = 0; u < 2; u++) {
                    v16u8 l4 = *(const v16u8 *)(ql + 32 * (i & 1) + 16 * u);
                    v16u8 h2 = *(const v16u8 *)(qh + 16 * u);
                    v16u8 q = (i < 2 ? l4 & 15 : l4 >> 4) | (h2 >> (uint8_t)(2 * i) & 3) << 4;
                    v16f w = __builtin_convertvector(q, v16f) - 32.0f;
                    acc += (d * (float)sc[2 * i + u]) * (w * LOAD16(x + j + 128 * h + 32 * i + 16 * u));
                }
        }
    }
    return hsum16(&acc);
}

/* Q3_K: per 16 elements, (d sc) sum q x, q = 2 low bits - 4 where the
 * hmask bit is clear. */
static float dot_q3k(const unsigned char *b, const float *x, int64_t k)
{
    v16f acc = {0};
    for (int64_t j = 0; j < k; j += 256, b += 110) {
        float d = f16_at(b + 108);
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 4; i++)
                for (int u = 0; u < 2; u++) {
                    v16u8 q2 = *(const v16u8 *)(b + 32 + 32 * h + 16 * u), hm = *(const v16u8 *)(b + 16 * u);
                    v16u8 q = (q2 >> (uint8_t)(2 * i) & 3) + ((hm >> (uint8_t)(4 * h + i) & 1) << 2);
                    v16f w = __builtin_convertvector(q, v16f) - 4.0f;
                    acc += (d * (float)q3k_scale(b + 96, 8 * h + 2 * i + u)) *
                           (w * LOAD16(x + j + 128 * h + 32 * i + 16 * u));
                }
    }
    return hsum16(&acc);
}

/* Q2_K: per 16 elements, (d sc) sum q x - (dmin m) sum x. */
static float dot_q2k(const unsigned char *b, const float *x, int64_t k)
{
    v16f acc = {0};
    for (int64_t j = 0; j < k; j += 256, b += 84) {
        float d = f16_at(b + 80), dmin = f16_at(b + 82);
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 4; i++)
                for (int u = 0; u < 2; u++) {
                    int sb = 8 * h + 2 * i + u;
                    v16u8 q2 = *(const v16u8 *)(b + 16 + 32 * h + 16 * u);
                    v16f q = __builtin_convertvector(q2 >> (uint8_t)(2 * i) & 3, v16f);
                    v16f xv = LOAD16(x + j + 128 * h + 32 * i + 16 * u);
                    acc += (d * (float)(b[sb] & 15)) * (q * xv) - (dmin * (float)(b[sb] >> 4)) * xv;
                }
    }
    return hsum16(&acc);
}

/* *acc += d sum kv[n] x over 32 IQ4 nibbles in Q4_0's order (qs: 16
 * bytes). */
static inline __attribute__((always_inline)) void iq4_block(const unsigned char *qs, const float *x, float d,
                                                            v16f *acc)
{
    float w[32] __attribute__((aligned(64)));
    for (int i = 0; i < 16; i++) {
        w[i] = iq4_values_f[qs[i] & 15];
        w[i + 16] = iq4_values_f[qs[i] >> 4];
    }
    *acc += d * (LOAD16(w) * LOAD16(x) + LOAD16(w + 16) * LOAD16(x + 16));
}

/* IQ4_NL: per block of 32, d sum kv[n] x. */
static float dot_iq4nl(const unsigned char *row, const float *x, int64_t k)
{
    v16f acc = {0};
    for (int64_t b = 0; b < k / 32; b++) {
        const unsigned char *d, *qs = iq4nl_block(row, k, b, &d);
        iq4_block(qs, x + 32 * b, f16_at(d), &acc);
    }
    return hsum16(&acc);
}

/* IQ4_XS: per sub-block of 32, (d (ls - 32)) sum kv[n] x. */
static float dot_iq4xs(const unsigned char *b, const float *x, int64_t k)
{
    v16f acc = {0};
    for (int64_t j = 0; j < k; j += 256, b += 136) {
        float d = f16_at(b); /* once a super-block: f16_at converts in software */
        for (int s = 0; s < 8; s++)
            iq4_block(b + 8 + 16 * s, x + j + 32 * s, d * (float)iq4xs_ls(b, s), &acc);
    }
    return hsum16(&acc);
}

/* ---- int8 activations (W8A8, W4A8G*: ir/dtype.h) ---- */

typedef int32_t v16i32 __attribute__((vector_size(64)));
#define WIDEN_I8_I32(p) __builtin_convertvector(*(const v16i8 *)(p), v16i32)
#define NIB_LO_I32(q) __builtin_convertvector((q) & (uint8_t)15, v16i32)
#define NIB_HI_I32(q) __builtin_convertvector((q) >> (uint8_t)4, v16i32)
#define WIDEN_U8_I32(p) __builtin_convertvector(*(const v16u8 *)(p), v16i32)

static int a8_is(int t)
{
    return dtype_is_a8((DType)t);
}

/* One block of len <= 32 of x to int8 (ir/dtype.h): the largest |x| by
 * the integer order of the magnitude bits (NaNs count as 0, as a float
 * comparison would skip them), so that both loops vectorize; f32 division
 * and rint as the definition has them. */
static inline __attribute__((always_inline)) void act_block(const float *x, int64_t len, int8_t *xq, float *dq)
{
    uint32_t amax = 0;
    for (int64_t j = 0; j < len; j++) {
        uint32_t u;
        memcpy(&u, x + j, 4);
        u &= 0x7fffffffu;
        u = u > 0x7f800000u ? 0 : u;
        amax = u > amax ? u : amax;
    }
    float m;
    memcpy(&m, &amax, 4);
    float d = m / 127.0f;
    *dq = d;
    for (int64_t j = 0; j < len; j++) {
        float r = d > 0 ? rintf(x[j] / d) : 0.0f;
        xq[j] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
    }
}

/* x[0:k] to int8 per block of 32: xq[k] and one scale per block in dq. */
static void act_quantize(const float *x, int64_t k, int8_t *xq, float *dq)
{
    int64_t b = 0;
    for (; b + 32 <= k; b += 32)
        act_block(x + b, 32, xq + b, dq + b / 32);
    if (b < k)
        act_block(x + b, k - b, xq + b, dq + b / 32);
}

/* W8A8 row: s * sum_b d_b * (integer sum of block b). */
static float dot_w8a8(const unsigned char *row, const int8_t *xq, const float *dq, int64_t k)
{
    float s;
    memcpy(&s, row, 4);
    const unsigned char *q = row + 4;
    v16f acc = {0};
    int64_t j = 0;
    for (; j + 32 <= k; j += 32) {
        v16i32 p = WIDEN_I8_I32(q + j) * WIDEN_I8_I32(xq + j) + WIDEN_I8_I32(q + j + 16) * WIDEN_I8_I32(xq + j + 16);
        acc += dq[j / 32] * __builtin_convertvector(p, v16f);
    }
    int32_t tail = 0;
    for (int64_t i = j; i < k; i++)
        tail += (int8_t)q[i] * xq[i];
    return s * (hsum16(&acc) + (j < k ? dq[j / 32] * (float)tail : 0.0f));
}

/* One W4A8 group of len elements (x blocks start at xq, dq). */
static float dot_w4a8_group(const unsigned char *g, const int8_t *xq, const float *dq, int64_t len)
{
    int32_t z = g[2];
    const unsigned char *qs = g + 4;
    v16f acc = {0};
    int64_t j = 0;
    for (; j + 32 <= len; j += 32, qs += 16) {
        v16u8 q = *(const v16u8 *)qs;
        v16i32 p = (NIB_LO_I32(q) - z) * WIDEN_I8_I32(xq + j) + (NIB_HI_I32(q) - z) * WIDEN_I8_I32(xq + j + 16);
        acc += dq[j / 32] * __builtin_convertvector(p, v16f);
    }
    int32_t tail = 0;
    for (int64_t i = 0; j + i < len; i++)
        tail += (w4_nib(qs, i) - z) * xq[j + i];
    return f16_at(g) * (hsum16(&acc) + (j < len ? dq[j / 32] * (float)tail : 0.0f));
}

static float dot_w4a8(int t, const unsigned char *row, const int8_t *xq, const float *dq, int64_t k)
{
    int64_t gs = t == DT_W4A8G32 ? 32 : t == DT_W4A8G64 ? 64 : 128;
    float s = 0;
    for (int64_t j = 0; j < k; j += gs) {
        int64_t len = k - j < gs ? k - j : gs;
        s += dot_w4a8_group(row, xq + j, dq + j / 32, len);
        row += w4_group_bytes(len);
    }
    return s;
}

/* A Q8_0A8 row (GGUF Q8_0 blocks, packed: kernel_table.h; every A8 GEMV
 * has k <= CPU_NORM_K_MAX, so its rows are) on the quantized input: per
 * block d dw sum q xq. */
static float dot_q8_0a8(const unsigned char *row, const int8_t *xq, const float *dq, int64_t k)
{
    float s = 0;
    const unsigned char *q = row + 2 * (k / 32);
    for (int64_t b = 0; b < k / 32; b++, q += 32) {
        int32_t qx = 0;
        for (int j = 0; j < 32; j++)
            qx += (int8_t)q[j] * xq[32 * b + j];
        s += dq[b] * f16_at(row + 2 * b) * (float)qx;
    }
    return s;
}

/* A k-quant or IQ4 A8 row (layout l) on the quantized input without
 * AVX2 (IQ4: without AVX-512 VNNI): per block of 32, d times the sum of
 * the weights' values times xq. */
static float dot_kqa8(int l, const unsigned char *row, const int8_t *xq, const float *dq, int64_t k)
{
    float s = 0;
    for (int64_t b = 0; b < k / 32; b++) {
        float p = 0;
        for (int j = 0; j < 32; j++)
            p += qelem(l, row, k, 32 * b + j) * (float)xq[32 * b + j];
        s += dq[b] * p;
    }
    return s;
}

static float isa_avx512_dot_iq4(int t, const unsigned char *b, const float *x, int64_t k);
static float isa_avx512_dot_q23k(int t, const unsigned char *b, const float *x, int64_t k);
static float isa_avx2_dot_iq4(int t, const unsigned char *b, const float *x, int64_t k);
static float isa_avx2_dot_q23k(int t, const unsigned char *b, const float *x, int64_t k);

/* Row . x for any weight dtype but f32. */
static float qdot(int t, const unsigned char *row, const float *x, int64_t k)
{
    if ((HAS_DT(DT_IQ4_NL) | HAS_DT(DT_IQ4_XS)) && (t == DT_IQ4_NL || t == DT_IQ4_XS) &&
        (megac_k_isa & KT_ISA_AVX2))
        return megac_k_isa & KT_ISA_AVX512 ? isa_avx512_dot_iq4(t, row, x, k) : isa_avx2_dot_iq4(t, row, x, k);
    if ((HAS_DT(DT_Q3_K) | HAS_DT(DT_Q2_K)) && (t == DT_Q3_K || t == DT_Q2_K) && (megac_k_isa & KT_ISA_AVX2))
        return megac_k_isa & KT_ISA_AVX512 ? isa_avx512_dot_q23k(t, row, x, k) : isa_avx2_dot_q23k(t, row, x, k);
    switch (t) {
    case DT_Q8_0: return dot_q8_0(row, x, k);
    case DT_Q4_0: return dot_q4_0(row, x, k);
    case DT_Q4_1: return dot_q4_1(row, x, k);
    case DT_Q5_0: return dot_q5(0, row, x, k);
    case DT_Q5_1: return dot_q5(1, row, x, k);
    case DT_Q4_K: return dot_q45k(0, row, x, k);
    case DT_Q5_K: return dot_q45k(1, row, x, k);
    case DT_Q6_K: return dot_q6k(row, x, k);
    case DT_Q3_K: return dot_q3k(row, x, k);
    case DT_Q2_K: return dot_q2k(row, x, k);
    case DT_IQ4_NL: return dot_iq4nl(row, x, k);
    case DT_IQ4_XS: return dot_iq4xs(row, x, k);
    case DT_W8: return dot_w8(row, x, k);
    case DT_W4G32: case DT_W4G64: case DT_W4G128: return dot_w4(t, row, x, k);
    default: return dot_half(t, row, x, k);
    }
}

/* ---- op bodies ---- */

/* out[c0:c1] = table[tok[0]][c0:c1] (dequantized from any weight dtype);
 * an out-of-range token gives zeros. */
static void op_embed(const MegacArgs *a, const int64_t *in)
{
    int32_t tok = *(const int32_t *)opnd(a, in, 0);
    const float *table = opnd(a, in, 1);
    float *out = opnd(a, in, 2);
    int64_t c0 = in[KT_PARAM], c1 = in[KT_PARAM + 1], dim = SHAPE(KS_DIM);
    if (tok < 0 || tok >= SHAPE(KS_VOCAB)) {
        memset(out + c0, 0, (size_t)(c1 - c0) * sizeof(float));
        return;
    }
    int t = opnd_dtype(in, 1);
    if (t == DT_F32) {
        memcpy(out + c0, table + (int64_t)tok * dim + c0, (size_t)(c1 - c0) * sizeof(float));
        return;
    }
    const unsigned char *row = (const unsigned char *)table + tok * qrow_bytes(t, dim);
    for (int64_t j = c0; j < c1; j++)
        out[j] = qelem(t, row, dim, j);
}

static void op_rmsnorm(const MegacArgs *a, const int64_t *in)
{
    const float *x = opnd(a, in, 0), *w = opnd(a, in, 1);
    float *out = opnd(a, in, 2);
    int64_t n = in[KT_PARAM];
    float s = rms_scale(x, n);
    for (int64_t j = 0; j < n; j++)
        out[j] = x[j] * s * w[j];
}

/* ---- the weight stream ----
 * A worker's GEMVs read their weights as one stream: each instruction's
 * rows [r0, r1), in program order. A decode step's tiles are small
 * (~50-250 KB per worker) and scattered (the next one is in another
 * matrix), so prefetching only inside a tile leaves each one starting
 * cold and wastes its last QPF_BYTES of prefetches past its end (a GEMV
 * over scattered 52 KB tiles ran at 0.6x the speed of one over adjacent
 * tiles: MEGAC_QBENCH_SCATTER in tests/test_cpu_quant_perf.c). So the
 * kernels report the bytes they read (ws_read), four rows at a time, and
 * the stream keeps the worker's next QPF_BYTES asked for, crossing from
 * one tile to the next (and past waits); the 8-bit kernels (not the
 * 256-bit int8-input ones) ask for them a few lines at a time as they
 * read (ws_trickle). Only hints: nothing is read.
 * On SmolLM2-135M at 2 workers this took Q4_0, Q4_1, Q8_0 and W4A8G32
 * decode 6-11% faster than prefetching inside each tile, which it
 * replaces (a wait that asked for the next tile's first 256 KB, as the
 * kernel used to, now only took bandwidth from the worker it waited for).
 * f32 rows do not ask (gemv_f32).
 * The hints fill L2, not L1 (prefetcht1, QPF_LOCALITY 2): on Zen 4
 * (2-vCPU EPYC guest) prefetcht0 took SmolLM2-135M decode to 0.5-0.7x
 * of what prefetcht1 gives (Q8_0, Q4_1, Q4_K_M files, exact and int8
 * inputs; why was not measured: no HW counters in the guest); on Zen 3
 * the two were within noise. Both knobs are the developers' (cmake
 * -DMEGAC_CPU_BODY_DEFS='-DQPF_BYTES=N;-DQPF_LOCALITY=L'), and so is
 * -DQPF_OFF, which asks for nothing at all (what the asks buy: on the
 * Intel Xeon host a Llama-3.2-1B-shaped Q4_0 file with int8 inputs
 * decoded 0.74x so, and one GEMV from memory streamed 16 GB/s, not 23). */
#ifndef QPF_BYTES
#define QPF_BYTES 16384
#endif
#ifndef QPF_LOCALITY
#define QPF_LOCALITY 2
#endif

#define ATTN_CHUNK 64     /* rows scored before their softmax update */
#define SPARSE_GATHER 8   /* attn_sparse copies runs shorter than this together */

typedef struct WStream {
    const MegacArgs *a;
    const int64_t *next, *end;  /* instructions still to look at */
    const char *p, *stop;       /* what is left of the range being asked for */
    int64_t ahead;              /* bytes asked for beyond what was read */
    /* an attention op's rows, as op_attn reads them: rows [t, last) in
     * chunks of ATTN_CHUNK rows, each chunk's k rows and then its v rows */
    const char *kh, *vh;
    int64_t rowb, t, n, last;
    int in_v;
    int64_t group;              /* bytes of the four rows a kernel spreads asks over (seg_trickle) */
    /* a far quad's stream (far_stream): its four rows, and how far into
     * them the kernel has read */
    const unsigned char *far_row[4];
    int64_t far_at;
    int far;
} WStream;

/* Split s of nsplit over n entries (rows) cut into blocks of `block`:
 * entries [*lo, *hi), the blocks [s*nb/nsplit, (s+1)*nb/nsplit) of
 * nb = ceil(n / block) (ATTN, ATTN_SPARSE in ir/ops.h). */
static void split_range(int64_t n, int64_t block, int64_t s, int64_t nsplit, int64_t *lo, int64_t *hi)
{
    int64_t nb = (n + block - 1) / block, b0 = s * nb / nsplit * block, b1 = (s + 1) * nb / nsplit * block;
    *lo = b0 < n ? b0 : n;
    *hi = b1 < n ? b1 : n;
}

/* Points ws at rows [lo, hi) of the k and v rows kh, vh. */
static void ws_attn_start(WStream *ws, const char *kh, const char *vh, int64_t rowb, int64_t lo, int64_t hi)
{
    ws->kh = kh;
    ws->vh = vh;
    ws->rowb = rowb;
    ws->t = lo;
    ws->last = hi;
    ws->n = 0;
}

/* Moves ws to the next chunk of k or v rows of its attention op; 0 when
 * the op has none left. */
static int ws_attn_next(WStream *ws)
{
    if (!ws->kh)
        return 0;
    if (!ws->in_v && ws->n) { /* the chunk's v rows after its k rows */
        ws->in_v = 1;
        ws->p = ws->vh + ws->t * ws->rowb;
        ws->stop = ws->p + ws->n * ws->rowb;
        return 1;
    }
    ws->t += ws->n;
    if (ws->t >= ws->last) {
        ws->kh = NULL;
        return 0;
    }
    ws->n = ws->last - ws->t < ATTN_CHUNK ? ws->last - ws->t : ATTN_CHUNK;
    ws->in_v = 0;
    ws->p = ws->kh + ws->t * ws->rowb;
    ws->stop = ws->p + ws->n * ws->rowb;
    return 1;
}

/* Moves ws to the next range its worker reads: a GEMV's weight rows, or
 * a chunk of an attention op's k or v rows. 0 when there is none. */
static int ws_advance(WStream *ws)
{
    if (ws_attn_next(ws))
        return 1;
    for (; ws->next < ws->end; ws->next += KT_STRIDE) {
        const int64_t *in = ws->next;
        if (in[KT_KIND] != K_INST_OP || op_skipped(ws->a, in))
            continue;
        if (in[KT_OP] == OP_ATTN) {
            int64_t h = in[KT_PARAM], s = in[KT_PARAM + 1], nsplit = in[KT_PARAM + 2], block = in[KT_PARAM + 3];
            int64_t hd = SHAPE(KS_HEAD_DIM), rowb = hd * kv_esize(kv_dtype(in, 1)), off = h * SHAPE(KS_MAX_SEQ) * rowb;
            int64_t lo, hi;
            split_range(ws->a->pos + 1, block, s, nsplit, &lo, &hi);
            ws_attn_start(ws, (const char *)opnd(ws->a, in, 1) + off, (const char *)opnd(ws->a, in, 2) + off, rowb,
                          lo, hi);
            ws->next += KT_STRIDE;
            if (ws_attn_next(ws))
                return 1;
            continue;
        }
        if (in[KT_OP] == OP_ATTN_SPARSE && in[KT_PARAM + 3] == SPARSE_SLOTS) {
            /* split s of an evicting layer's filled slots, one run: known before the step */
            int64_t h = in[KT_PARAM], s = in[KT_PARAM + 1], nsplit = in[KT_PARAM + 2], cap = in[KT_PARAM + 4];
            int64_t hd = SHAPE(KS_HEAD_DIM), rowb = hd * kv_esize(kv_dtype(in, 1)), off = h * cap * rowb, lo, hi;
            split_range(ws->a->pos + 1 < cap ? ws->a->pos + 1 : cap, SPARSE_BLOCK, s, nsplit, &lo, &hi);
            ws_attn_start(ws, (const char *)opnd(ws->a, in, 1) + off, (const char *)opnd(ws->a, in, 2) + off, rowb, lo,
                          hi);
            ws->next += KT_STRIDE;
            if (ws_attn_next(ws))
                return 1;
            continue;
        }
        if (in[KT_OP] != OP_GEMV || ((uint64_t)in[KT_OPND] & KT_ARENA))
            continue;
        int t = opnd_dtype(in, 0);
        int64_t k = in[KT_PARAM + 2], rb = t == DT_F32 ? 4 * k : qrow_bytes(t, k);
        const char *w = opnd(ws->a, in, 0);
        ws->p = w + in[KT_PARAM] * rb;
        ws->stop = w + in[KT_PARAM + 1] * rb;
        ws->next += KT_STRIDE;
        return 1;
    }
    return 0;
}

/* Asks for the stream until `target` bytes past what was read. */
static void ws_fill(WStream *ws, int64_t target)
{
#ifdef QPF_OFF
    ws->ahead = INT64_MAX / 2;
    (void)target;
    return;
#endif
    while (ws->ahead < target) {
        if (ws->p >= ws->stop && !ws_advance(ws)) {
            ws->ahead = INT64_MAX / 2;  /* nothing left to ask for */
            return;
        }
        int64_t left = ws->stop - ws->p;
        if (ws->ahead < 0) { /* the kernels read past it: skip that */
            int64_t skip = -ws->ahead < left ? -ws->ahead : left;
            ws->p += skip;
            ws->ahead += skip;
            continue;
        }
        int64_t n = (target - ws->ahead + 63) / 64, m = (left + 63) / 64;
        n = n < m ? n : m;
        for (int64_t i = 0; i < n; i++)
            __builtin_prefetch(ws->p + 64 * i, 0, QPF_LOCALITY);
        int64_t adv = 64 * n < left ? 64 * n : left;
        ws->p += adv;
        ws->ahead += adv;
    }
}

/* Profile builds (MEGAC_CPU_PROFILE): when this worker's current GEMV
 * run first read (ws_read) or asked for (ws_trickle) weights, i.e. when its
 * input had been prepared (normalized, quantized, packed); 0 until then.
 * f32 rows tell the stream nothing: their runs count as all rows. */
#ifdef MEGAC_CPU_PROFILE
static _Thread_local uint64_t prof_rows_at;
/* and when its rows reported (ws_read) PROF_HEAD_BYTES or more, how many */
#define PROF_HEAD_BYTES 16384
static _Thread_local uint64_t prof_head_at, prof_head_bytes, prof_run_bytes;
#define PROF_ROWS_BEGIN()                                   \
    do {                                                    \
        if (!prof_rows_at)                                  \
            prof_rows_at = __builtin_ia32_rdtsc();          \
    } while (0)
#else
#define PROF_ROWS_BEGIN() (void)0
#endif

/* The kernels read `bytes` more of the stream. */
static inline __attribute__((always_inline)) void ws_read(WStream *ws, int64_t bytes)
{
    PROF_ROWS_BEGIN();
#ifdef MEGAC_CPU_PROFILE
    prof_run_bytes += (uint64_t)bytes;
    if (!prof_head_at && prof_run_bytes >= PROF_HEAD_BYTES) {
        prof_head_at = __builtin_ia32_rdtsc();
        prof_head_bytes = prof_run_bytes;
    }
#endif
    ws->ahead -= bytes;
    if (ws->ahead < QPF_BYTES)
        ws_fill(ws, QPF_BYTES);
}

/* A far quad's line asks (seg_far_quads): each of its rows' bytes
 * [at + QPF_BYTES, + step), the step a kernel is about to read, so many
 * bytes ahead, every line of them (a 256-bit kernel that reads the rows
 * one after another asks once per row, a quarter row of each: 4-18 lines
 * at k 2048). */
static inline __attribute__((always_inline)) void far_prefetch(const unsigned char *const row[4], int64_t at,
                                                              int64_t step)
{
    _Pragma("clang loop unroll(full)")
    for (int i = 0; i < 4; i++) {
        for (int64_t o = 0; o < step - 1; o += 64)
            __builtin_prefetch(row[i] + at + QPF_BYTES + o, 0, QPF_LOCALITY);
        __builtin_prefetch(row[i] + at + QPF_BYTES + step - 1, 0, QPF_LOCALITY);
    }
}

/* Asks for a line more than `bytes` of the stream while a kernel reads a
 * group of rows (ws->group bytes, which it reports with ws_read when done),
 * as long as that stays within QPF_BYTES of the group's end. A kernel that
 * calls this once per step of its inner loop (`bytes`: what the step reads)
 * spreads the group's prefetches over its reads, and ws_read then finds
 * nothing left to ask for. Asked for all at once, four rows of 1536 (6.5
 * KB, 100 prefetches) at a time, they held 8-bit GEMVs from memory to 16-18
 * GB/s on one Zen 4 core (ops of 288 rows in a scattered order, as a decode
 * step's tiles are: MEGAC_QBENCH_OP_ROWS, _SCATTER), spread 20-22: Q8_0A8
 * 15.8 -> 22.1, W8A8 17.9 -> 22.4, Q8_0 17.0 -> 20.3, W8 15.9 -> 20.4; rows
 * of 576 ran as before (23.3 -> 23.8, 16.8 -> 16.1). SmolLM2-135M's down
 * projection (k 1536) went from 5.5 to 6.8 bytes per TSC cycle at a 35 GB/s
 * ceiling (6.8 to 10 at 60), and its Q8_0 file decodes 1.03-1.09x faster
 * with int8 inputs, 1.02-1.06x with exact ones, as W8A8 1.03x (at a 37 GB/s
 * ceiling) to 1.10-1.14x (at 60), as W8A16 1.04-1.08x (megac bench
 * --versus, both ways round). The AVX-512 8-bit kernels and the portable
 * W8 one do this; the AVX2 Q8_0 and W8 ones did (x86-64-v3 bundles of the
 * Q8_0 file, on the same Zen 4: 1.07-1.10x, as W8A16 1.05-1.09x) and since
 * 2026-12-06 ask once per row, as the other 256-bit rows do (the Intel
 * Xeon, --cpu haswell, two workers, rows of 576 from the L3 and from
 * memory: Q8_0 28.3 -> 32.6 and 21.1 -> 22.2 GB/s, W8 31.3 -> 34.2 and
 * 20.8 -> 22.7; the 256-bit Q8_0A8 and W8A8 kernels spreading theirs over
 * 64-byte steps had run 0.97-1.03x on Zen 4; no AMD machine at hand to
 * measure the per-row asks). Where the A16 kernels compute more per
 * byte (rows shorter than WS_TRICKLE_K: Q8_0 at 576 ran 3-8% slower so) and
 * over one long segment of short rows (WS_TRICKLE_SEG_MAX or more, k below
 * WS_TRICKLE_K: SmolLM2's tied output matrix, 15 MB a worker, ran 5% slower
 * so; the hardware prefetchers follow it) the kernels ask as before
 * (seg_trickle). Long segments of long rows do trickle: on Llama-3.2-1B's
 * shapes (gate/up 4-5 MB a worker at k 2048, down at 8192) that took W8A16
 * decode 1.21-1.26x faster, W8A8 1.16-1.18x, a Q4_K_M file (random blocks,
 * scripts/scratch-kquant-gguf.py) 1.11-1.43x with exact inputs and
 * 1.33-1.57x with int8 ones (with the k-quant and packed rows below; megac
 * bench --versus, both ways round). The k-quant rows trickle from
 * WS_TRICKLE_K (SmolLM2's Q4_K_M down projections, k 1536: from memory,
 * one core, ops of 288 rows scattered, Q6_K 9.1 -> 13.5 GB/s, Q4_K 10.4 ->
 * 12.1, with int8 inputs 12.6 -> 16.6 and 14.3 -> 16.0; the file decodes
 * 1.05-1.11x faster with exact inputs), and so do the packed and W4G64/
 * W4G128 4-bit rows (Llama-3.2-1B W4A16-g32 1.31-1.53x, as an x86-64-v3
 * bundle 1.37-1.43x); at SmolLM2's 576 the packed rows trickling ran
 * 1.01-1.09x slower (its Q4_0 file, --versus, four rounds), so they do
 * not there. The packed int8-input rows (PKA8_ROWS: Q4_0A8, Q4_1A8,
 * Q5_0A8, Q5_1A8, W4A8G32) trickle from WS_TRICKLE_K too since 2026-12-05
 * (an Intel Xeon host, from memory at k 2048, two workers: Q4_0A8 19.1-19.3
 * -> 21.2-21.7 GB/s, Q4_1A8 18.8 -> 22.4, Q5_0A8 17.4 -> 21.2; a
 * Llama-3.2-1B-shaped Q4_0 file with int8 inputs decodes 1.15-1.18x faster,
 * SmolLM2's Q4_0 and Q4_1 files 0.97-1.03x, within noise). Those rules
 * for short rows and long segments are Zen 4's; on an Intel Xeon
 * (2026-12-05) both cost: spreading the prefetches there too, ops of rows
 * of 576 (two workers; MEGAC_QBENCH_MB=100, from the L3, and 1024, from
 * memory) went Q8_0A8 37.5 -> 42.1 and 19.6 -> 22.5 GB/s, Q8_0 33 -> 39.5,
 * W8A8 40.5 -> 44.5, Q4_0 30.3 -> 34, Q4_0A8 36 -> 39 and 18.7 -> 20.8,
 * Q4_1 31.3 -> 33.8 and 18 -> 19.4, and SmolLM2's six files (Q8_0, Q4_0,
 * Q4_1, each with exact and int8 inputs) decode 1.00-1.17x faster, 1.06 at
 * the median (megac bench --versus, both ways round, two rounds; the same
 * greedy text), so a kernel for an Intel CPU spreads them always
 * (KT_TUNE_TRICKLE_ALL, cg_cpu_tune; no other Intel CPU was measured). */
#define WS_TRICKLE_K 1024
#define WS_TRICKLE_SEG_MAX (1 << 20)
static inline __attribute__((always_inline)) void ws_trickle(WStream *ws, int64_t bytes)
{
    PROF_ROWS_BEGIN();
#ifdef QPF_OFF
    (void)ws, (void)bytes;
    return;
#endif
    if (ws->far) { /* a far quad's: `bytes` is the four rows' step */
        far_prefetch(ws->far_row, ws->far_at, bytes / 4);
        ws->far_at += bytes / 4;
        return;
    }
    int n = (int)(bytes / 64) + 1;
    if (ws->ahead >= QPF_BYTES + ws->group)
        return;
    if (ws->ahead >= 0 && ws->stop - ws->p >= 64 * n) {
        for (int i = 0; i < n; i++)
            __builtin_prefetch(ws->p + 64 * i, 0, QPF_LOCALITY);
        ws->p += 64 * n;
        ws->ahead += 64 * n;
    } else {
        ws_fill(ws, ws->ahead + 64 * n);
    }
}

/* One GEMV instruction's rows: a run of GEMVs on the same input (the
 * worker loop groups them) prepares the input once and then walks every
 * instruction's rows, reporting them to ws. */
typedef struct GemvSeg {
    const unsigned char *W;
    float *y;
    const float *b;
    int64_t r0, r1;
    int accum;
    WStream *ws;
} GemvSeg;

static void gemv_store(float *y, const float *b, int64_t r, float v, int accum)
{
    if (b)
        v += b[r];
    y[r] = accum ? y[r] + v : v;
}

/* ---- A16 quantized GEMV: four rows per pass ----
 * The weight integers become floats in registers and meet x with FMAs;
 * four rows go through together, so each x vector is loaded once for all
 * four, the loop overhead and the group headers are shared, and the four
 * scales are converted from f16 as one vector. Zero points and offsets
 * are not applied per element: sum_j s (q_j - z) x_j = s sum q_j x_j -
 * s z sum x_j, with the sums of x per group computed once per op (xg). A
 * pass past the last row repeats the last row (its results are dropped),
 * so every row runs the same code. Rows of W8 take any k; the 4-bit and
 * Q8_0 kernels need k % 32 == 0 (true of every GGUF block format), other
 * rows go through qdot() one at a time. */

/* Loops over the four rows are unrolled (the bitcode is built without
 * unrolling; O3 at megac compile time honours the pragma), so that the
 * four accumulators live in registers. */
/* The fast kernels keep a copy of x (reordered or summed) on the stack:
 * longer rows take the one-row loops (qdot) instead. */
#define QFAST_K_MAX 16384
_Static_assert(QFAST_K_MAX <= KT_PACK_K_MAX, "the fast Q8_0 kernels read packed rows only");
#define UNROLL4 _Pragma("clang loop unroll(full)")

/* Rows r..r+3 of a segment for a four-row kernel (a pass past r1
 * repeats the last row), and their results back (those before r1). */
static inline __attribute__((always_inline)) void seg_quad(const GemvSeg *g, int64_t rb, int64_t r,
                                                           const unsigned char *row[4])
{
    UNROLL4
    for (int q = 0; q < 4; q++)
        row[q] = g->W + (r + q < g->r1 ? r + q : g->r1 - 1) * rb;
}

static inline __attribute__((always_inline)) void seg_quad_store(const GemvSeg *g, int64_t rb, int64_t r,
                                                                 const float out[4])
{
    ws_read(g->ws, (g->r1 - r < 4 ? g->r1 - r : 4) * rb);
    if (g->r1 - r >= 4) { /* gemv_store's sums, four rows as one vector */
        v4f v, t;
        memcpy(&v, out, sizeof v);
        if (g->b) {
            memcpy(&t, g->b + r, sizeof t);
            v += t;
        }
        if (g->accum) {
            memcpy(&t, g->y + r, sizeof t);
            v = t + v;
        }
        memcpy(g->y + r, &v, sizeof v);
        return;
    }
    for (int q = 0; q < 4 && r + q < g->r1; q++)
        gemv_store(g->y, g->b, r + q, out[q], g->accum);
}

/* The stream a four-row kernel spreads its prefetches over in segment g
 * (rows of rb bytes, k long), its group set to four rows: NULL (it does
 * not) for rows shorter than kmin, and for a segment of WS_TRICKLE_SEG_MAX
 * bytes or more of rows shorter than WS_TRICKLE_K (ws_trickle); on a
 * target with KT_TUNE_TRICKLE_ALL (Intel's cores) always. */
static inline __attribute__((always_inline)) WStream *seg_trickle(const GemvSeg *g, int64_t rb, int64_t k,
                                                                 int64_t kmin)
{
    if (!(megac_k_tune & KT_TUNE_TRICKLE_ALL) &&
        (k < kmin || ((g->r1 - g->r0) * rb >= WS_TRICKLE_SEG_MAX && k < WS_TRICKLE_K)))
        return NULL;
    g->ws->group = 4 * rb;
    return g->ws;
}

/* Far quads (KT_TUNE_FAR_QUADS): a four-row kernel may read a long
 * segment as four streams, quad j being rows r0 + j, r0 + q + j,
 * r0 + 2 q + j and r0 + 3 q + j for q = (r1 - r0) / 4 (the r1 - r0 - 4 q
 * rows left go four at a time after them), each row asking for its own
 * lines QPF_BYTES ahead (far_stream). Adjacent rows side by side are four
 * interleaved streams a row long (k 2048 Q4_0: 1152 bytes), which the
 * hardware prefetchers must find again row after row; four quarters of
 * the segment are four long ones. On the Intel Xeon host (2026-12-05;
 * scripts/scratch-q4-interleave.c, from memory, k 2048, two threads, 1 GB
 * of Q4_0 rows with int8 inputs) adjacent rows streamed 15-17 GB/s with
 * no software prefetch, far quads 24, and with each stream asking ahead
 * 26.7, a plain read's rate (25-26), where megac's kernel with its spread
 * prefetches made 22-23; a Llama-3.2-1B-shaped model decodes 1.13-1.19x
 * faster (docs/performance.md). Only segments of FAR_QUAD_MIN_BYTES or more: a short
 * one's streams 1-3 start unasked (the worker's stream asked for what
 * follows the previous segment, i.e. stream 0's start), which took
 * SmolLM2-135M's exact-input Q4_0 step (segments of 31-250 KB a worker,
 * in the L3) to 0.95x. Returns q, or 0 where the segment is read as
 * before. The ws stream is told of the far part as a whole at its end
 * (seg_far_done), so that it asks for what follows and none of its lines. */
#define FAR_QUAD_MIN_BYTES (512 << 10)
/* bits: the KT_TUNE_* bit that lets the kernel at hand read far quads
 * (KT_TUNE_FAR_QUADS, or KT_TUNE_FAR_SEQ for the 256-bit rows that go
 * one after another; 0: never). */
static inline __attribute__((always_inline)) int64_t seg_far_quads(const GemvSeg *g, int64_t rb, int32_t bits)
{
    int64_t n = g->r1 - g->r0;
    return (megac_k_tune & bits) && n >= 16 && n * rb >= FAR_QUAD_MIN_BYTES ? n / 4 : 0;
}

/* Far quad j's rows (q of them a stream), and its results back. */
static inline __attribute__((always_inline)) void seg_far_rows(const GemvSeg *g, int64_t rb, int64_t q, int64_t j,
                                                              const unsigned char *row[4])
{
    UNROLL4
    for (int i = 0; i < 4; i++)
        row[i] = g->W + (g->r0 + i * q + j) * rb;
}

static inline __attribute__((always_inline)) void seg_far_store(const GemvSeg *g, int64_t q, int64_t j,
                                                               const float out[4])
{
    UNROLL4
    for (int i = 0; i < 4; i++)
        gemv_store(g->y, g->b, g->r0 + i * q + j, out[i], g->accum);
}

/* The stream a kernel asks through (ws_trickle) while it reads far quad
 * row[4]. */
static inline __attribute__((always_inline)) WStream *far_stream(WStream *fw, const unsigned char *const row[4])
{
    fw->far = 1;
    fw->far_at = 0;
    for (int i = 0; i < 4; i++)
        fw->far_row[i] = row[i];
    return fw;
}

/* After q far quads of segment g (rows of rb bytes): the worker's stream
 * moves past them without asking for their lines, and on to what follows. */
static inline __attribute__((always_inline)) void seg_far_done(const GemvSeg *g, int64_t rb, int64_t q)
{
    if (q)
        ws_read(g->ws, 4 * q * rb);
}

/* Every row of segment g (rows of rb bytes, k long) through a four-row
 * kernel: the last argument, a statement (commas and all) that fills
 * out[4] from row[4] and asks for lines through ws (NULL: it asks for
 * none). The far quads first (where the KT_TUNE_* bit `far` and
 * seg_far_quads() allow), then the rest four at a time; where
 * seg_trickle(g, rb, k, kmin) asks for lines, a far quad asks through its
 * own stream (far_stream) and the rest through the worker's. isfar, a
 * constant in each loop, says which loop the statement is in. */
#define SEG_QUADS(g, rb, k, kmin, far, row, out, ws, isfar, ...)             \
    do {                                                                     \
        const unsigned char *row[4];                                         \
        float out[4];                                                        \
        int64_t q_ = seg_far_quads(g, rb, (far));                            \
        WStream fw_ = {0};                                                   \
        WStream *tws_ = seg_trickle(g, rb, k, kmin);                         \
        if (q_) /* (ws_read comes after them: seg_far_done) */               \
            PROF_ROWS_BEGIN();                                               \
        for (int64_t j_ = 0; j_ < q_; j_++) {                                \
            seg_far_rows(g, rb, q_, j_, row);                                \
            WStream *ws = tws_ ? far_stream(&fw_, row) : NULL;               \
            const int isfar = 1;                                             \
            (void)isfar;                                                     \
            __VA_ARGS__;                                                     \
            seg_far_store(g, q_, j_, out);                                   \
        }                                                                    \
        seg_far_done(g, rb, q_);                                             \
        for (int64_t r_ = (g)->r0 + 4 * q_; r_ < (g)->r1; r_ += 4) {         \
            WStream *ws = tws_;                                              \
            const int isfar = 0;                                             \
            (void)isfar;                                                     \
            seg_quad(g, rb, r_, row);                                        \
            __VA_ARGS__;                                                     \
            seg_quad_store(g, rb, r_, out);                                  \
        }                                                                    \
    } while (0)

typedef uint16_t v4u16 __attribute__((vector_size(8)));
typedef uint32_t v4u32 __attribute__((vector_size(16)));

#define F16X4(h, out) F16XN(h, out, v4u32, v4f)

/* The f16 at byte offset off of each of the four records w[i]. */
typedef short v8i16 __attribute__((vector_size(16)));

/* Four f16 to f32 by vcvtph2ps (F16C, part of KT_ISA_AVX2). */
static __attribute__((target("avx2,fma,f16c"))) v4f isa_avx2_f16x4(v4u16 h)
{
    v8i16 v = {(short)h[0], (short)h[1], (short)h[2], (short)h[3], 0, 0, 0, 0};
    return __builtin_ia32_vcvtph2ps(v);
}

/* The f16 at p by vcvtph2ps (F16C: in every AVX2 and AVX-512 kernel's
 * target), where f16_at() takes a dozen scalar instructions and branches. */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) float isa_f16c_at(const unsigned char *p)
{
    short h;
    memcpy(&h, p, 2);
    return __builtin_ia32_vcvtph2ps((v8i16){h, 0, 0, 0, 0, 0, 0, 0})[0];
}

static v4f f16_rows4(const unsigned char *const w[4], int off)
{
    v4u16 h;
    UNROLL4
    for (int i = 0; i < 4; i++)
        h[i] = (uint16_t)(w[i][off] | w[i][off + 1] << 8);
    if (megac_k_isa & KT_ISA_AVX2)
        return isa_avx2_f16x4(h);
    v4f f;
    F16X4(h, f);
    return f;
}

/* W4G64 and W4G128 (and W4G32 rows that are not packed) as records of
 * `gb` bytes per group of 32 * nc weights: s @0 (f16), z @2 (u8), then 16
 * bytes of nibbles per 32 (Q4_0's order) from byte 4. Each group adds
 * s * sum q x to the row's vector accumulator and -s z * (sum of x over
 * the group) to its offset term. (Q4_0, Q4_1 and W4G32 rows with k % 32
 * == 0 are packed: gemv_packed.) */
static inline __attribute__((always_inline)) void nib_groups4(const unsigned char *w[4], int64_t ng, int64_t gb,
                                                              int64_t nc, const float *x, const float *xg,
                                                              v16f acc[4], v4f *off)
{
    const int hdr = 4;
    for (int64_t g = 0; g < ng; g++, x += 32 * nc) {
        v4f s = f16_rows4(w, 0);
        v4f z = {(float)w[0][2], (float)w[1][2], (float)w[2][2], (float)w[3][2]};
        *off += -s * z * xg[g];
        v16f ga[4] = {{0}, {0}, {0}, {0}};
        for (int64_t ch = 0; ch < nc; ch++) {
            v16f x0 = LOAD16(x + 32 * ch), x1 = LOAD16(x + 32 * ch + 16);
            UNROLL4
            for (int i = 0; i < 4; i++) {
                v16u8 q = *(const v16u8 *)(w[i] + hdr + 16 * ch);
                ga[i] += NIB_LO(q) * x0 + NIB_HI(q) * x1;
            }
        }
        UNROLL4
        for (int i = 0; i < 4; i++) {
            acc[i] += s[i] * ga[i];
            w[i] += gb;
        }
    }
}

/* Q8_0 rows packed (kernel_table.h: f16 d[ng], then i8 q[ng][32]): block
 * g's scale at row + 2 g, its integers at row + 2 ng + 32 g. */
static inline __attribute__((always_inline)) void q8_0_groups4(const unsigned char *const row[4], int64_t ng,
                                                               const float *x, v16f acc[4])
{
    const unsigned char *d[4] = {row[0], row[1], row[2], row[3]}, *q[4];
    UNROLL4
    for (int i = 0; i < 4; i++)
        q[i] = row[i] + 2 * ng;
    for (int64_t g = 0; g < ng; g++, x += 32) {
        v4f s = f16_rows4(d, 0);
        v16f x0 = LOAD16(x), x1 = LOAD16(x + 16);
        UNROLL4
        for (int i = 0; i < 4; i++) {
            acc[i] += s[i] * (WIDEN_I8(q[i]) * x0 + WIDEN_I8(q[i] + 16) * x1);
            d[i] += 2;
            q[i] += 32;
        }
    }
}

/* W8: {f32 s; i8 q[k]} per row, any k. */
static void w8_rows4(const unsigned char *const row[4], const float *x, int64_t k, float out[4], WStream *ws)
{
    v16f acc[4] = {{0}, {0}, {0}, {0}};
    int64_t j = 0;
    for (; j + 64 <= k; j += 64) {
        if (ws)
            ws_trickle(ws, 4 * 64);
        v16f x0 = LOAD16(x + j), x1 = LOAD16(x + j + 16), x2 = LOAD16(x + j + 32), x3 = LOAD16(x + j + 48);
        UNROLL4
        for (int i = 0; i < 4; i++) {
            const unsigned char *q = row[i] + 4 + j;
            acc[i] += (WIDEN_I8(q) * x0 + WIDEN_I8(q + 16) * x1) + (WIDEN_I8(q + 32) * x2 + WIDEN_I8(q + 48) * x3);
        }
    }
    for (; j + 16 <= k; j += 16) {
        v16f xv = LOAD16(x + j);
        UNROLL4
        for (int i = 0; i < 4; i++)
            acc[i] += WIDEN_I8(row[i] + 4 + j) * xv;
    }
    UNROLL4
    for (int i = 0; i < 4; i++) {
        float t = hsum16(&acc[i]), s;
        for (int64_t jj = j; jj < k; jj++)
            t += (float)(int8_t)row[i][4 + jj] * x[jj];
        memcpy(&s, row[i], 4);
        out[i] = s * t;
    }
}

/* Sums of x over consecutive groups of gs (the last one shorter). */
static void x_group_sums(const float *x, int64_t k, int64_t gs, float *xg)
{
    for (int64_t j = 0; j < k; j += gs) {
        v16f a = {0};
        int64_t e = k - j < gs ? k - j : gs, i = 0;
        for (; i + 16 <= e; i += 16)
            a += LOAD16(x + j + i);
        float s = hsum16(&a);
        for (; i < e; i++)
            s += x[j + i];
        xg[j / gs] = s;
    }
}

/* ---- packed 4-bit rows (Q4_0, Q4_1, W4G32; kernel_table.h) ----
 * One superblock (four blocks of 32) of a row is one 64-byte load v; for
 * nibble n, v & (15 << 4n) converted to float is 16^n times element
 * 4n + lane % 4 of block lane / 4, and meets xp, the copy of x reordered
 * to match and scaled by 16^-n (exact: powers of two), with an FMA
 * (n = 7 takes v >> 28 instead, as the conversion is signed). Per 32
 * weights that is two ANDs, two conversions and two FMAs, no shuffles:
 * these kernels are bound by vector ops (AVX-512 on Zen 5 issues four a
 * cycle, shuffles and conversions two), and the 16-entry table lookups
 * this replaces took six ops with three shuffles, plus building the table.
 * The block scales multiply the superblock's partial sums once, as one
 * vector with each scale in its four lanes, and the offsets (Q4_1's m,
 * Q4_0's -8 d, the -8 applied once per row, W4G32's -s z) meet the
 * per-block sums of x (xs) in four lanes: sum_j (d q_j + c) x_j = d sum_j q_j x_j + c sum_j x_j. The same
 * generic-vector code serves every instruction set. */

/* xp and xs for x[0:k]: superblock s of xp is 128 floats, nibble n's 16
 * at 16 n, lane 4 b + i holding x[128 s + 32 b + 4 n + i] / 16^n (0 past
 * k); xs[b] = sum of block b of x (0 past k, up to a multiple of 4).
 * Block by block, in 4-float pieces (once per op, k floats). */
static void pk_x_prepare(const float *x, int64_t k, float *xp, float *xs)
{
    static const float sc[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
    int64_t nb = k / 32, nsb = (nb + 3) / 4;
    for (int64_t blk = 0; blk < nb; blk++) {
        float *o = xp + 128 * (blk / 4) + 4 * (blk % 4);
        v4f sum = {0};
        for (int n = 0; n < 8; n++) {
            v4f v;
            memcpy(&v, x + 32 * blk + 4 * n, 16);
            sum += v;
            v *= sc[n];
            memcpy(o + 16 * n, &v, 16);
        }
        xs[blk] = (sum[0] + sum[1]) + (sum[2] + sum[3]);
    }
    for (int64_t blk = nb; blk < 4 * nsb; blk++) {
        float *o = xp + 128 * (blk / 4) + 4 * (blk % 4);
        for (int n = 0; n < 8; n++)
            memset(o + 16 * n, 0, 16);
        xs[blk] = 0;
    }
}

/* The 128 nibbles of words *vp, each times its xp (see above), summed
 * per lane: *e over the even nibbles n = 0, 2, 4, 6, *o over the odd
 * ones. (Pointers in and out: a v16 value would change the ABI.) */
static inline __attribute__((always_inline)) void nib_sums(const v16u32 *vp, const float *xp, v16f *e, v16f *o)
{
    v16u32 v = *vp;
    v16f l0 = __builtin_convertvector((v16i32)(v & 0xfu), v16f) * LOAD16(xp);
    v16f l1 = __builtin_convertvector((v16i32)(v & 0xf0u), v16f) * LOAD16(xp + 16);
    l0 += __builtin_convertvector((v16i32)(v & 0xf00u), v16f) * LOAD16(xp + 32);
    l1 += __builtin_convertvector((v16i32)(v & 0xf000u), v16f) * LOAD16(xp + 48);
    l0 += __builtin_convertvector((v16i32)(v & 0xf0000u), v16f) * LOAD16(xp + 64);
    l1 += __builtin_convertvector((v16i32)(v & 0xf00000u), v16f) * LOAD16(xp + 80);
    l0 += __builtin_convertvector((v16i32)(v & 0xf000000u), v16f) * LOAD16(xp + 96);
    l1 += __builtin_convertvector((v16i32)(v >> 28), v16f) * LOAD16(xp + 112);
    *e = l0;
    *o = l1;
}

/* Sum over the 128 weights of a superblock's words *vp of each weight
 * times xp, as 16 lanes (lane l: block l / 4's share). */
static inline __attribute__((always_inline)) void pk_dot(const v16u32 *vp, const float *xp, v16f *out)
{
    v16f e, o;
    nib_sums(vp, xp, &e, &o);
    *out = e + o;
}

typedef uint32_t v16u32a1 __attribute__((vector_size(64), aligned(1)));
typedef uint8_t v4u8 __attribute__((vector_size(4)));

/* Four f16 to f32. */
static v4f pk_f16x4(v4u16 h)
{
    if (megac_k_isa & KT_ISA_AVX2)
        return isa_avx2_f16x4(h);
    v4f f;
    F16X4(h, f);
    return f;
}

/* Pieces of two rows' two-block last superblocks w0, w1 taken as one
 * vector (pk_tail2, PKA8_TAIL2): row w0 in lanes 0-7, w1 in 8-15 (v16
 * values through pointers: the portable callers' ABI has no 512-bit
 * registers). The
 * nibbles (past the headers of hdr bytes a block); two u16 header fields
 * of each at byte `at` (scales, Q4_1's minima); Q5's two qh words of each
 * at `at`, spread as pk_superblock spreads a superblock's four (lane
 * 4 b + i: word b shifted right by i); and a product p of those lanes and
 * four per-block offsets o4 (w0's blocks, then w1's) added to each row's
 * sums. */
static inline __attribute__((always_inline)) void pk_pair_nibbles(const unsigned char *w0, const unsigned char *w1,
                                                                  int hdr, v16u32 *v)
{
    memcpy(v, w0 + 2 * hdr, 32);
    memcpy((char *)v + 32, w1 + 2 * hdr, 32);
}

static inline __attribute__((always_inline)) v4u16 pk_pair_u16x4(const unsigned char *w0, const unsigned char *w1,
                                                                 int at)
{
    v4u16 h;
    memcpy(&h, w0 + at, 4);
    memcpy((char *)&h + 4, w1 + at, 4);
    return h;
}

static inline __attribute__((always_inline)) void pk_pair_qh(const unsigned char *w0, const unsigned char *w1, int at,
                                                             v16u32 *h)
{
    v4u32 h4;
    memcpy(&h4, w0 + at, 8);
    memcpy((char *)&h4 + 8, w1 + at, 8);
    *h = __builtin_shufflevector(h4, h4, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) >>
         (v16u32){0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
}

static inline __attribute__((always_inline)) void pk_pair_add(const v16f *p, v4f o4, v16f *acc0, v16f *acc1,
                                                             v4f *off0, v4f *off1)
{
    v16f zero = {0};
    v4f zero4 = {0};
    *acc0 += __builtin_shufflevector(*p, zero, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    *acc1 += __builtin_shufflevector(*p, zero, 16, 17, 18, 19, 20, 21, 22, 23, 8, 9, 10, 11, 12, 13, 14, 15);
    *off0 += __builtin_shufflevector(o4, zero4, 0, 1, 4, 5);
    *off1 += __builtin_shufflevector(o4, zero4, 2, 3, 4, 5);
}

/* The first nblk (< 4) blocks' 16 bytes each from p, zeros after. (Fixed
 * sizes per case: nblk is not a constant here.) */
static inline __attribute__((always_inline)) void pk_load_short(const unsigned char *p, int nblk, v16u32 *v)
{
    *v = (v16u32){0};
    switch (nblk) {
    case 1: memcpy(v, p, 16); break;
    case 2: memcpy(v, p, 32); break;
    default: memcpy(v, p, 48); break;
    }
}

/* n (<= 4) u16 from p, zeros after. Reads 8 bytes whatever n (a short
 * superblock has more than 8 bytes past any of its header fields), then
 * masks: byte-wise building through the stack stalled store forwarding,
 * a third of a 576-wide GEMV's time in its last superblock. */
static inline __attribute__((always_inline)) v4u16 pk_u16x4(const unsigned char *p, int n)
{
    v4u16 h;
    memcpy(&h, p, 8);
    if (n < 4)
        h &= (v4u16)((v4u16){0, 1, 2, 3} < (uint16_t)n);
    return h;
}

/* W4G32's n (<= 4) zero points at p as floats, zeros after (reads 4
 * bytes whatever n). */
static inline __attribute__((always_inline)) v4f pk_z4(const unsigned char *p, int n)
{
    v4u8 z;
    memcpy(&z, p, 4);
    if (n < 4)
        z &= (v4u8)((v4u8){0, 1, 2, 3} < (uint8_t)n);
    return __builtin_convertvector(z, v4f);
}

/* Q5_0/Q5_1's fifth bits of a superblock (the nblk words at qh, the rest
 * ignored: x is 0 there) against xp: lane 4b + i, step m takes bit
 * 4m + i of block b's word (element 4m + i, as nibble m of the lane), so
 * the sum is 2^i too large against xp's 16^-m; the caller scales lane i
 * by 16 / 2^i. */
static inline __attribute__((always_inline)) void pk_hbits(const unsigned char *qh, const float *xp, v16f *out)
{
    v4u32 h;
    memcpy(&h, qh, 16);
    v16u32 v = __builtin_shufflevector(h, h, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const v16u32 bit = {1, 2, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8};
    v16f l0 = __builtin_convertvector((v16i32)(v & bit), v16f) * LOAD16(xp);
    v16f l1 = __builtin_convertvector((v16i32)(v & bit << 4), v16f) * LOAD16(xp + 16);
    l0 += __builtin_convertvector((v16i32)(v & bit << 8), v16f) * LOAD16(xp + 32);
    l1 += __builtin_convertvector((v16i32)(v & bit << 12), v16f) * LOAD16(xp + 48);
    l0 += __builtin_convertvector((v16i32)(v & bit << 16), v16f) * LOAD16(xp + 64);
    l1 += __builtin_convertvector((v16i32)(v & bit << 20), v16f) * LOAD16(xp + 80);
    l0 += __builtin_convertvector((v16i32)(v & bit << 24), v16f) * LOAD16(xp + 96);
    l1 += __builtin_convertvector((v16i32)(v >> 28 & bit), v16f) * LOAD16(xp + 112);
    *out = l0 + l1;
}

/* Adds one superblock of nblk (<= 4) blocks at w, against xp and the four
 * block sums xs4, to acc (scaled sums) and off (offset terms). */
static inline __attribute__((always_inline)) void pk_superblock(int t, const unsigned char *w, int nblk,
                                                                const float *xp, v4f xs4, v16f *acc, v4f *off)
{
    int hdr = pk_hdr(t);
    v16u32 v;
    if (nblk == 4)
        v = *(const v16u32a1 *)(w + 4 * hdr);
    else
        pk_load_short(w + hdr * nblk, nblk, &v);
    v4f d = pk_f16x4(pk_u16x4(w, nblk)), c;
    if (t == DT_Q4_1 || t == DT_Q5_1) {
        c = pk_f16x4(pk_u16x4(w + 2 * nblk, nblk));
    } else if (t == DT_Q4_0 || t == DT_Q5_0) {
        c = d; /* times -8 or -16 (exact) once per row, in pk_rows4 */
    } else {
        c = -d * pk_z4(w + 2 * nblk, nblk);
    }
    v16f part;
    pk_dot(&v, xp, &part);
    if (t == DT_Q5_0 || t == DT_Q5_1) {
        v16f hs;
        const v16f f = {16, 8, 4, 2, 16, 8, 4, 2, 16, 8, 4, 2, 16, 8, 4, 2};
        pk_hbits(w + (t == DT_Q5_0 ? 2 : 4) * nblk, xp, &hs);
        part += hs * f;
    }
    *acc += __builtin_shufflevector(d, d, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) * part;
    *off += c * xs4;
}

/* Four packed rows of k elements (k % 32 == 0) into out[4]. */
static inline __attribute__((always_inline)) void pk_rows4(int t, const unsigned char *const row[4], const float *xp, const float *xs, int64_t k,
                     float out[4])
{
    int64_t nb = k / 32, sbb = 4 * (pk_hdr(t) + 16);
    v16f acc[4] = {{0}, {0}, {0}, {0}};
    v4f off[4] = {{0}, {0}, {0}, {0}};
    int64_t s = 0;
    for (; s < nb / 4; s++) {
        v4f xs4 = *(const v4f *)(xs + 4 * s);
        UNROLL4
        for (int i = 0; i < 4; i++) {
            const unsigned char *w = row[i] + s * sbb;
            pk_superblock(t, w, 4, xp + 128 * s, xs4, &acc[i], &off[i]);
        }
    }
    if (nb % 4) {
        v4f xs4 = *(const v4f *)(xs + 4 * s);
        UNROLL4
        for (int i = 0; i < 4; i++)
            pk_superblock(t, row[i] + s * sbb, (int)(nb % 4), xp + 128 * s, xs4, &acc[i], &off[i]);
    }
    float cs = t == DT_Q4_0 ? -8.0f : t == DT_Q5_0 ? -16.0f : 1.0f;
    UNROLL4
    for (int i = 0; i < 4; i++)
        out[i] = hsum16(&acc[i]) + cs * ((off[i][0] + off[i][1]) + (off[i][2] + off[i][3]));
}

typedef void (*Rows4Fn)(int t, const unsigned char *const row[4], const float *xa, const float *xb, int64_t k,
                        float out[4]);

/* Rows [r0, r1) four at a time with rows4 (a pass past r1 repeats the
 * last row); inlined with t and rows4 constants, so no test of t is left
 * in the loops. */
static inline __attribute__((always_inline)) void quad_rows(Rows4Fn rows4, int t, const GemvSeg *g, const float *xa,
                                                            const float *xb, int64_t k)
{
    int64_t rb = qrow_bytes(t, k);
    for (int64_t r = g->r0; r < g->r1; r += 4) {
        const unsigned char *row[4];
        float out[4];
        seg_quad(g, rb, r, row);
        rows4(t, row, xa, xb, k, out);
        seg_quad_store(g, rb, r, out);
    }
}

/* Every segment's rows of packed dtype t through rows4 (t a constant in
 * each case, so that rows4 inlines without tests of t). */
static inline __attribute__((always_inline)) void pk_segs(Rows4Fn rows4, int t, const GemvSeg *sg, int ns,
                                                          const float *xp, const float *xs, int64_t k)
{
    for (int i = 0; i < ns; i++) {
        const GemvSeg *g = &sg[i];
        switch (t) {
        case DT_Q4_0: quad_rows(rows4, DT_Q4_0, g, xp, xs, k); break;
        case DT_Q4_1: quad_rows(rows4, DT_Q4_1, g, xp, xs, k); break;
        case DT_Q5_0: quad_rows(rows4, DT_Q5_0, g, xp, xs, k); break;
        case DT_Q5_1: quad_rows(rows4, DT_Q5_1, g, xp, xs, k); break;
        default: quad_rows(rows4, DT_W4G32, g, xp, xs, k); break;
        }
    }
}

static int isa_vnni512_gemv_packed(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);
static int isa_gfni512_gemv_packed(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);
static void isa_avx2_gemv_packed(int t, const GemvSeg *sg, int ns, const float *xp, const float *xs, int64_t k);
static int isa_avx2_gemv_packed_q(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);
static int isa_avxvnni_gemv_packed_q(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);

/* The 256-bit u8 x s8 function `name` for this target: AVX-VNNI's
 * (vpdpbusd) where the CPU has it, else AVX2's (kernel_q256.inc and the
 * 256-bit A8 rows come in both). megac_k_isa is a constant, so the other
 * folds away. */
#define Q256_PICK(name) ((megac_k_isa & KT_ISA_AVXVNNI) ? isa_avxvnni_##name : isa_avx2_##name)

/* y[r0:r1] (+)= W . x (+ b) for packed rows, each segment's. */
static void gemv_packed(int t, const GemvSeg *sg, int ns, const float *x, int64_t k)
{
    if ((megac_k_isa & KT_ISA_GFNI512) && isa_gfni512_gemv_packed(t, sg, ns, x, k))
        return;
    if (!(megac_k_isa & KT_ISA_GFNI512) && (megac_k_isa & KT_ISA_VNNI512) && isa_vnni512_gemv_packed(t, sg, ns, x, k))
        return;
    int avx2 = (megac_k_isa & KT_ISA_AVX2) && !(megac_k_isa & KT_ISA_AVX512);
    if (avx2 && Q256_PICK(gemv_packed_q)(t, sg, ns, x, k))
        return;
    int64_t nsb = (k / 32 + 3) / 4;
    float xp[128 * nsb] __attribute__((aligned(64)));
    float xs[4 * nsb] __attribute__((aligned(16)));
    pk_x_prepare(x, k, xp, xs);
    if (avx2) { /* x is not finite (or tiny: x_integer_ok): the float kernel takes it */
        isa_avx2_gemv_packed(t, sg, ns, xp, xs, k);
        return;
    }
    pk_segs(pk_rows4, t, sg, ns, xp, xs, k);
}

/* ---- Q4_K, Q5_K and Q6_K rows, four at a time ----
 * The packed kernels' trick (above) on GGUF's own bytes, no repacking: a
 * 64-byte load v holds 128 nibbles; v & (15 << 4n) converted to float is
 * 16^n times one weight per lane, met by a copy of x reordered to match
 * and scaled by 16^-n (n = 7: v >> 28, scale 1). Per 32 weights two ANDs,
 * two conversions, two FMAs. Which sub-block a product belongs to depends
 * only on the lane and on n's parity, so the even and odd nibbles are
 * summed apart and each sum is scaled by a vector of sub-block scales.
 *
 * Q4_K (ir/dtype.h): 64 bytes are chunks c, c+1 of 32 bytes; lane L,
 * nibble n is element 64 (L / 8) + 4 (L % 8) + n / 2 + 32 (n % 2) of the
 * 128, in sub-block 2 (L / 8) + n % 2. The mins meet the sums of x per
 * sub-block: sum_s dmin m_s sum x. Q5_K adds its fifth bits the same
 * way (kq5_hbits).
 *
 * Q6_K: the 64 bytes of ql of half h: lane L, nibble n is element
 * 4L + n/2 + 64 (n % 2) of the half (sub-block of 16: L/4 + 4 (n % 2));
 * the 64 bytes of qh (both halves): lane L, byte b, pair i (bits 8b + 2i)
 * is element 128 (L / 8) + 32 i + 4 (L % 8) + b, sub-block
 * 8 (L / 8) + 2i + (L % 8) / 4, times 16; the - 32 meets the sums of x
 * per sub-block of 16. */

/* x for Q4_K rows of k (k % 256 == 0): xr, 128 floats per 128 weights as
 * above; xs[s], the sum of sub-block s (32 elements). */
static void kq4_x_prepare(const float *x, int64_t k, float *xr, float *xs)
{
    static const float sc[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
    for (int64_t g = 0; g < k / 128; g++)
        for (int n = 0; n < 8; n++)
            for (int L = 0; L < 16; L++)
                xr[128 * g + 16 * n + L] = x[128 * g + 64 * (L / 8) + 4 * (L % 8) + n / 2 + 32 * (n % 2)] * sc[n];
    for (int64_t b = 0; b < k / 32; b++) {
        v16f v = LOAD16(x + 32 * b) + LOAD16(x + 32 * b + 16);
        xs[b] = hsum16(&v);
    }
}

typedef float v8fs __attribute__((vector_size(32)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
typedef uint8_t v8u8 __attribute__((vector_size(8)));

/* The 8 sub-block scales d sc_s and mins dmin m_s of a Q4_K/Q5_K
 * super-block b (ggml's get_scale_min_k4, 8 lanes at a time); d and dmin
 * (b's f16 fields) converted by the caller. */
static inline __attribute__((always_inline)) void kq_scales(const unsigned char *b, float dd, float dmin, v8fs *d,
                                                            v8fs *m)
{
    v16u8 by = *(const v16u8 *)(b + 4); /* scales[12] and 4 bytes more */
    v8u8 sl = __builtin_shufflevector(by, by, 0, 1, 2, 3, 8, 9, 10, 11);
    v8u8 sh = __builtin_shufflevector(by, by, 0, 0, 0, 0, 0, 1, 2, 3);
    v8u8 ml = __builtin_shufflevector(by, by, 4, 5, 6, 7, 8, 9, 10, 11);
    v8u8 mh = __builtin_shufflevector(by, by, 0, 0, 0, 0, 4, 5, 6, 7);
    const v8u8 lo6 = {63, 63, 63, 63, 15, 15, 15, 15}, hi2 = {0, 0, 0, 0, 48, 48, 48, 48};
    const v8u8 msh = {0, 0, 0, 0, 4, 4, 4, 4};
    v8u8 sc = (sl & lo6) | ((sh >> 6) << 4 & hi2), mn = ((ml >> msh) & lo6) | ((mh >> 6) << 4 & hi2);
    *d = __builtin_convertvector(sc, v8fs) * dd;
    *m = __builtin_convertvector(mn, v8fs) * dmin;
}

/* Q5_K's fifth bits of group g (0, 1) of a super-block, against xr: lane
 * L's word is qh word L % 8 (bytes l = 4 (L % 8) + n / 2 for nibble n),
 * and element l of sub-block s has bit s of qh[l]; shifted right by
 * 4g + 2 (L / 8), nibble n = 2a + o's bit is bit 8a + o. Adds 16 x per
 * set bit to *e (even n) and *o (odd n), as nib_sums counts them. */
static inline __attribute__((always_inline)) void kq5_hbits(const unsigned char *qh, int g, const float *xr, v16f *e,
                                                            v16f *o)
{
    v8u32 w;
    memcpy(&w, qh, 32);
    v16u32 h = __builtin_shufflevector(w, w, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7) >>
               ((v16u32){0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2} + (uint32_t)(4 * g));
    v16f he = __builtin_convertvector((v16i32)(h & 1u), v16f) * LOAD16(xr);
    he += __builtin_convertvector((v16i32)(h & 0x100u), v16f) * LOAD16(xr + 32);
    he += __builtin_convertvector((v16i32)(h & 0x10000u), v16f) * LOAD16(xr + 64);
    he += __builtin_convertvector((v16i32)(h & 0x1000000u), v16f) * LOAD16(xr + 96);
    v16f ho = __builtin_convertvector((v16i32)(h & 2u), v16f) * LOAD16(xr + 16);
    ho += __builtin_convertvector((v16i32)(h & 0x200u), v16f) * LOAD16(xr + 48);
    ho += __builtin_convertvector((v16i32)(h & 0x20000u), v16f) * LOAD16(xr + 80);
    /* xr's n = 7 row is x itself (the nibbles use v >> 28) */
    v16f h7 = __builtin_convertvector((v16i32)(h >> 25 & 1u), v16f) * LOAD16(xr + 112);
    *e += 16.0f * he;
    *o += 128.0f * ho + 16.0f * h7;
}

/* One Q4_K or Q5_K super-block b against xr (its 256) and xs8 (its 8
 * sub-block sums): scaled sums into *acc, min terms into *off. */
static inline __attribute__((always_inline)) void kq4_superblock(int q5, const unsigned char *b, const float *xr,
                                                                 const v8fs *xs8, v16f *acc, v8fs *off)
{
    v8fs d, m;
    kq_scales(b, f16_at(b), f16_at(b + 2), &d, &m);
    *off += m * *xs8;
    const unsigned char *qs = b + (q5 ? 48 : 16);
    v16f e, o;
    v16u32 v = *(const v16u32a1 *)qs;
    nib_sums(&v, xr, &e, &o);
    if (q5)
        kq5_hbits(b + 16, 0, xr, &e, &o);
    *acc += __builtin_shufflevector(d, d, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2) * e +
            __builtin_shufflevector(d, d, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3) * o;
    v = *(const v16u32a1 *)(qs + 64);
    nib_sums(&v, xr + 128, &e, &o);
    if (q5)
        kq5_hbits(b + 16, 1, xr + 128, &e, &o);
    *acc += __builtin_shufflevector(d, d, 4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6) * e +
            __builtin_shufflevector(d, d, 5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7) * o;
}

static float kq_hsum8(const v8fs *p)
{
    v8fs v = *p;
    v4f h = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
    return (h[0] + h[2]) + (h[1] + h[3]);
}

/* x for Q6_K rows of k (k % 256 == 0): per super-block 512 floats (the
 * ql part's 2 x 128, then the qh part's 16 x 16, pair (b, i) at
 * 16 (4 i + b)) and xs[j], the sum of sub-block j (16 elements). */
static void kq6_x_prepare(const float *x, int64_t k, float *xr, float *xs)
{
    static const float sc[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
    for (int64_t s = 0; s < k / 256; s++) {
        const float *xb = x + 256 * s;
        float *o = xr + 512 * s;
        for (int h = 0; h < 2; h++)
            for (int n = 0; n < 8; n++)
                for (int L = 0; L < 16; L++)
                    o[128 * h + 16 * n + L] = xb[128 * h + 4 * L + n / 2 + 64 * (n % 2)] * sc[n];
        for (int i = 0; i < 4; i++)
            for (int b = 0; b < 4; b++)
                for (int L = 0; L < 16; L++) {
                    int sh = 8 * b + 2 * i;   /* (v >> 30 for the top pair: scale 1) */
                    float f = sh == 30 ? 16.0f : 16.0f * ldexpf(1.0f, -sh);
                    o[256 + 16 * (4 * i + b) + L] = xb[128 * (L / 8) + 32 * i + 4 * (L % 8) + b] * f;
                }
    }
    for (int64_t j = 0; j < k / 16; j++) {
        v16f v = LOAD16(x + 16 * j);
        xs[j] = hsum16(&v);
    }
}

/* One Q6_K super-block b against its 512 floats of xr and xs16: scaled
 * sums into *acc, the - 32 terms into *off. */
static inline __attribute__((always_inline)) void kq6_superblock(const unsigned char *b, const float *xr,
                                                                 const v16f *xs16, v16f *acc, v16f *off)
{
    v16f d = __builtin_convertvector(*(const v16i8 *)(b + 192), v16f) * f16_at(b + 208);
    *off += d * *xs16;
    v16f e, o;
    v16u32 v = *(const v16u32a1 *)b;
    nib_sums(&v, xr, &e, &o);
    *acc += __builtin_shufflevector(d, d, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) * e +
            __builtin_shufflevector(d, d, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7) * o;
    v = *(const v16u32a1 *)(b + 64);
    nib_sums(&v, xr + 128, &e, &o);
    *acc += __builtin_shufflevector(d, d, 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11) * e +
            __builtin_shufflevector(d, d, 12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15) * o;
    v = *(const v16u32a1 *)(b + 128);
    const float *xh = xr + 256;
#define KQ6_PAIRS(i, mask3)                                                                                   \
    do {                                                                                                      \
        v16f s_ = __builtin_convertvector((v16i32)(v & (3u << (2 * (i)))), v16f) * LOAD16(xh + 16 * (4 * (i))); \
        s_ += __builtin_convertvector((v16i32)(v & (3u << (8 + 2 * (i)))), v16f) * LOAD16(xh + 16 * (4 * (i) + 1)); \
        s_ += __builtin_convertvector((v16i32)(v & (3u << (16 + 2 * (i)))), v16f) * LOAD16(xh + 16 * (4 * (i) + 2)); \
        s_ += __builtin_convertvector((v16i32)(mask3), v16f) * LOAD16(xh + 16 * (4 * (i) + 3));               \
        *acc += __builtin_shufflevector(d, d, 2 * (i), 2 * (i), 2 * (i), 2 * (i), 2 * (i) + 1, 2 * (i) + 1,   \
                                        2 * (i) + 1, 2 * (i) + 1, 8 + 2 * (i), 8 + 2 * (i), 8 + 2 * (i),      \
                                        8 + 2 * (i), 9 + 2 * (i), 9 + 2 * (i), 9 + 2 * (i), 9 + 2 * (i)) *     \
                s_;                                                                                           \
    } while (0)
    KQ6_PAIRS(0, v & (3u << 24));
    KQ6_PAIRS(1, v & (3u << 26));
    KQ6_PAIRS(2, v & (3u << 28));
    KQ6_PAIRS(3, v >> 30);
#undef KQ6_PAIRS
}

/* nr (1 or 4, a constant) Q4_K, Q5_K or Q6_K rows of k elements
 * (k % 256 == 0) into out[nr]. */
static inline __attribute__((always_inline)) void kq_rows(int t, int nr, const unsigned char *const row[4],
                                                          const float *xr, const float *xs, int64_t k, float out[4])
{
    v16f acc[4] = {{0}, {0}, {0}, {0}}, off16[4] = {{0}, {0}, {0}, {0}};
    v8fs off8[4] = {{0}, {0}, {0}, {0}};
    int64_t bb = t == DT_Q4_K ? 144 : t == DT_Q5_K ? 176 : 210;
    for (int64_t s = 0; s < k / 256; s++) {
        if (t == DT_Q4_K || t == DT_Q5_K) {
            v8fs xs8;
            memcpy(&xs8, xs + 8 * s, 32);
            UNROLL4
            for (int i = 0; i < nr; i++)
                kq4_superblock(t == DT_Q5_K, row[i] + s * bb, xr + 256 * s, &xs8, &acc[i], &off8[i]);
        } else {
            v16f xs16 = LOAD16(xs + 16 * s);
            UNROLL4
            for (int i = 0; i < nr; i++)
                kq6_superblock(row[i] + s * bb, xr + 512 * s, &xs16, &acc[i], &off16[i]);
        }
    }
    UNROLL4
    for (int i = 0; i < nr; i++)
        out[i] = t != DT_Q6_K ? hsum16(&acc[i]) - kq_hsum8(&off8[i]) : hsum16(&acc[i]) - 32.0f * hsum16(&off16[i]);
}

/* Four rows into out[4]: side by side where a vector of 16 floats is one
 * register (AVX-512); else one after another, one sequential stream, as
 * the AVX2 A16 rows go (isa_avx2_q8_0_rows4). */
static inline __attribute__((always_inline)) void kq_rows4(int t, const unsigned char *const row[4], const float *xr,
                                                           const float *xs, int64_t k, float out[4])
{
    if (!(megac_k_isa & KT_ISA_AVX512)) {
#pragma clang loop unroll(disable)
        for (int i = 0; i < 4; i++)
            kq_rows(t, 1, row + i, xr, xs, k, out + i);
        return;
    }
    kq_rows(t, 4, row, xr, xs, k, out);
}

/* Every segment's rows of k-quant t through rows4 (t a constant in each
 * case, as pk_segs). */
static inline __attribute__((always_inline)) void kq_segs(Rows4Fn rows4, int t, const GemvSeg *sg, int ns,
                                                          const float *xr, const float *xs, int64_t k)
{
    for (int i = 0; i < ns; i++) {
        if (t == DT_Q4_K)
            quad_rows(rows4, DT_Q4_K, &sg[i], xr, xs, k);
        else if (t == DT_Q5_K)
            quad_rows(rows4, DT_Q5_K, &sg[i], xr, xs, k);
        else
            quad_rows(rows4, DT_Q6_K, &sg[i], xr, xs, k);
    }
}

/* y[r0:r1] (+)= W . x (+ b) for Q4_K, Q5_K or Q6_K rows (k % 256 == 0,
 * k <= QFAST_K_MAX), each segment's. */
static int isa_vnni512_gemv_kq(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);
static void isa_avx2_gemv_kq(int t, const GemvSeg *sg, int ns, const float *xr, const float *xs, int64_t k);
static int isa_avx2_gemv_kq_q(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);
static int isa_avxvnni_gemv_kq_q(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);

static void gemv_kq(int t, const GemvSeg *sg, int ns, const float *x, int64_t k)
{
    if ((megac_k_isa & KT_ISA_VNNI512) && isa_vnni512_gemv_kq(t, sg, ns, x, k))
        return;
    int avx2 = (megac_k_isa & KT_ISA_AVX2) && !(megac_k_isa & KT_ISA_AVX512);
    if (avx2 && Q256_PICK(gemv_kq_q)(t, sg, ns, x, k))
        return;
    float xr[2 * k] __attribute__((aligned(64)));
    float xs[k / 16];
    if (t == DT_Q6_K)
        kq6_x_prepare(x, k, xr, xs);
    else
        kq4_x_prepare(x, k, xr, xs);
    if (avx2) { /* x is not finite (or tiny: x_integer_ok): the float kernel takes it */
        isa_avx2_gemv_kq(t, sg, ns, xr, xs, k);
        return;
    }
    kq_segs(kq_rows4, t, sg, ns, xr, xs, k);
}

/* ---- AVX-512 versions (KT_ISA_AVX512; see kernel_table.h) ----
 * W4G64 and W4G128 (the packed formats' kernel above needs fewer ops per
 * weight): a 4-bit weight takes one of 16 values per group, so each row's
 * group becomes a 16-float table T[q] = s (q - z), exactly the
 * reference's dequantized values, and vpermps looks the weights up by
 * their nibbles (it reads only the low 4 bits of each index, so the low
 * nibble needs no mask): per 32 weights one widening load, one shift, two
 * lookups and two FMAs, and no per-group scaling of partial sums. The
 * load (vpmovzxbd) puts byte j of the 16 in lane j: its low nibble is
 * weight j and its high nibble weight j + 16 (every 4-bit layout here),
 * so x is read in its own order. (An earlier version broadcast the 16
 * bytes and shifted each lane by its own amount, one more ALU op per 32
 * weights, plus a reordered copy of x per op: these kernels are bound by
 * ALU ops on the build host, so that cost ~8% of Q4_1 GEMV speed, more
 * for Q4_0; MEGAC_CPU_BENCH=1 in tests/test_cpu_quant_perf.c.) */

#define ISA_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define ISA_VNNI512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define ISA_GFNI512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,gfni")))

typedef short v8i16 __attribute__((vector_size(16)));

/* nib_minus_z[z][q] = q - z: a group's table is row z times its scale. */
#define NZ_ROW(z)                                                                                        \
    {0.0f - (z), 1.0f - (z), 2.0f - (z), 3.0f - (z), 4.0f - (z), 5.0f - (z), 6.0f - (z), 7.0f - (z),      \
     8.0f - (z), 9.0f - (z), 10.0f - (z), 11.0f - (z), 12.0f - (z), 13.0f - (z), 14.0f - (z), 15.0f - (z)}
static const float nib_minus_z[16][16] __attribute__((aligned(64))) = {
    NZ_ROW(0), NZ_ROW(1), NZ_ROW(2),  NZ_ROW(3),  NZ_ROW(4),  NZ_ROW(5),  NZ_ROW(6),  NZ_ROW(7),
    NZ_ROW(8), NZ_ROW(9), NZ_ROW(10), NZ_ROW(11), NZ_ROW(12), NZ_ROW(13), NZ_ROW(14), NZ_ROW(15)};

typedef short v16i16 __attribute__((vector_size(32)));

/* The f16 at p in all 16 lanes (vpbroadcastw, vcvtph2ps). */
static inline __attribute__((always_inline)) ISA_AVX512 v16f isa_avx512_f16_splat(const unsigned char *p)
{
    short h = (short)(p[0] | p[1] << 8);
    v16i16 v = {h, h, h, h, h, h, h, h, h, h, h, h, h, h, h, h};
    return __builtin_ia32_vcvtph2ps512_mask(v, (v16f){0}, (unsigned short)0xffff, 4);
}

/* nib_groups4() by table lookups (W4G* records). */
static inline __attribute__((always_inline)) ISA_AVX512 void
isa_avx512_nib_groups4(const unsigned char *w[4], int64_t ng, int64_t gb, int64_t nc, const float *x, v16f acc[4])
{
    const int hdr = 4;
    for (int64_t g = 0; g < ng; g++, x += 32 * nc) {
        v16f tab[4];
        UNROLL4
        for (int i = 0; i < 4; i++)
            tab[i] = LOAD16(nib_minus_z[w[i][2] & 15]) * isa_avx512_f16_splat(w[i]);
        for (int64_t ch = 0; ch < nc; ch++) {
            v16f x0 = LOAD16(x + 32 * ch), x1 = LOAD16(x + 32 * ch + 16);
            UNROLL4
            for (int i = 0; i < 4; i++) {
                v16u32 q = __builtin_convertvector(*(const v16u8 *)(w[i] + hdr + 16 * ch), v16u32);
                acc[i] += __builtin_ia32_permvarsf512(tab[i], (v16i32)q) * x0;
                acc[i] += __builtin_ia32_permvarsf512(tab[i], (v16i32)(q >> 4)) * x1;
            }
        }
        UNROLL4
        for (int i = 0; i < 4; i++)
            w[i] += gb;
    }
}

/* d (ls - 32) of the 8 sub-blocks of the IQ4_XS super-block b (d: its
 * f16 scale as a float), iq4xs_scale's values at once. */
static inline __attribute__((always_inline)) void iq4xs_scales8(const unsigned char *b, float d, float out[8])
{
    uint32_t sl;
    memcpy(&sl, b + 4, 4);
    v8u32 l = ((v8u32){0} + sl) >> (v8u32){0, 4, 8, 12, 16, 20, 24, 28} & 15u;
    v8u32 h = ((v8u32){0} + (uint32_t)(b[2] | b[3] << 8)) >> (v8u32){0, 2, 4, 6, 8, 10, 12, 14} & 3u;
    v8fs v = (__builtin_convertvector(l | h << 4, v8fs) - 32.0f) * d;
    memcpy(out, &v, sizeof v);
}

/* Q3_K's 16 sub-block scales less 32 (q3k_scale) from its 12 bytes at
 * sc, as floats, by two in-register byte selections (generic vector
 * code: the AVX-512 and the 256-bit kernels inline it). */
static inline __attribute__((always_inline)) void q3k_scales16(const unsigned char *sc, v16f *out)
{
    const v16u32 lo_shift = {0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4},
                 hi_shift = {0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6};
    v16u8 sb = {0};
    memcpy(&sb, sc, 12);
    v16u32 lo = __builtin_convertvector(
        __builtin_shufflevector(sb, sb, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7), v16u32);
    v16u32 hi = __builtin_convertvector(
        __builtin_shufflevector(sb, sb, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11), v16u32);
    *out = __builtin_convertvector((v16i32)((lo >> lo_shift & 15u) | (hi >> hi_shift & 3u) << 4) - 32, v16f);
}

/* The 16 sub-block scales of a Q3_K (q3) or Q2_K super-block b as
 * floats, *d (d sc; Q3_K's sc less 32), and what meets each sub-block's
 * sum of x as an offset, *m (Q3_K: d sc again, for its - 4, which the
 * caller applies; Q2_K: dmin m). dd and dmin: b's f16 fields as floats
 * (Q3_K has no dmin), so that generic code converts none. */
static inline __attribute__((always_inline)) void kq23_scales16(int q3, const unsigned char *b, float dd,
                                                                float dmin, v16f *d, v16f *m)
{
    if (q3) {
        q3k_scales16(b + 96, d);
        *d *= dd;
        *m = *d;
        return;
    }
    v16u32 sc = __builtin_convertvector(*(const v16u8 *)b, v16u32);
    *d = __builtin_convertvector(sc & 15u, v16f) * dd;
    *m = __builtin_convertvector(sc >> 4, v16f) * dmin;
}

/* An IQ4_NL or IQ4_XS row by table lookups, as the W4G* rows above: each
 * block's (IQ4_XS: sub-block's) table is the 16 values times its scale,
 * so that the weights are the reference's dequantized ones bit for bit;
 * per 32 weights one widening load, a shift, two lookups and two FMAs. */
static ISA_AVX512 float isa_avx512_dot_iq4(int t, const unsigned char *b, const float *x, int64_t k)
{
    v16f kv = LOAD16(iq4_values_f), acc0 = {0}, acc1 = {0};
    if (t == DT_IQ4_NL) {
        for (int64_t j = 0; j < k; j += 32) {
            const unsigned char *d, *qs = iq4nl_block(b, k, j / 32, &d);
            v16f tab = kv * isa_f16c_at(d);
            v16u32 q = __builtin_convertvector(*(const v16u8 *)qs, v16u32);
            acc0 += __builtin_ia32_permvarsf512(tab, (v16i32)q) * LOAD16(x + j);
            acc1 += __builtin_ia32_permvarsf512(tab, (v16i32)(q >> 4)) * LOAD16(x + j + 16);
        }
    } else {
        for (int64_t j = 0; j < k; j += 256, b += 136) {
            float sc[8];
            iq4xs_scales8(b, isa_f16c_at(b), sc);
            for (int s = 0; s < 8; s++) {
                v16f tab = kv * sc[s];
                v16u32 q = __builtin_convertvector(*(const v16u8 *)(b + 8 + 16 * s), v16u32);
                acc0 += __builtin_ia32_permvarsf512(tab, (v16i32)q) * LOAD16(x + j + 32 * s);
                acc1 += __builtin_ia32_permvarsf512(tab, (v16i32)(q >> 4)) * LOAD16(x + j + 32 * s + 16);
            }
        }
    }
    acc0 += acc1;
    return hsum16(&acc0);
}

/* ---- IQ4_NL and IQ4_XS rows, four at a time (AVX-512) ----
 * A group is four blocks of 32 (IQ4_XS: four sub-blocks, half a
 * super-block): their 16 bytes of nibbles as one 64-byte vector, block i
 * in 128-bit lane i. Lane L's word holds bytes 4 (L % 4) .. + 3 of block
 * L / 4, so its nibble n is element 4 (L % 4) + n / 2 + 16 (n % 2) of the
 * block (a byte's low nibble is element j, its high one j + 16). x is
 * reordered once per op to match (iq4_x_prepare), so every nibble meets
 * its x with no shuffle of the weights; vpermps, which reads only an
 * index's low 4 bits, looks the nibble up among the 16 values straight
 * from v >> 4n. A lane's products all belong to one block, so its sums
 * are scaled once per group by a vector of the four blocks' scales. Per
 * 32 weights: two shifts, two lookups, two FMAs; the x vectors are
 * loaded once for the four rows. */

/* x[0:k] for the IQ4 four-row kernels: xr[128 g + 16 n + L] is element
 * 32 (L / 4) + 4 (L % 4) + n / 2 + 16 (n % 2) of group g (0 past k). */
static void iq4_x_prepare(const float *x, int64_t k, float *xr)
{
    int64_t ng = (k / 32 + 3) / 4;
    for (int64_t g = 0; g < ng; g++)
        for (int n = 0; n < 8; n++)
            for (int L = 0; L < 16; L++) {
                int64_t e = 128 * g + 32 * (L / 4) + 4 * (L % 4) + n / 2 + 16 * (n % 2);
                xr[128 * g + 16 * n + L] = e < k ? x[e] : 0.0f;
            }
}

/* Group g of an IQ4_NL row of nb blocks (packed: kernel_table.h, its
 * superblock g): the nibbles of blocks 4g .. 4g + 3 as one vector and
 * their scales; blocks past nb are zeros (x is 0 there, and so is their
 * scale). */
static inline __attribute__((always_inline)) ISA_AVX512 void isa_avx512_iq4nl_group(const unsigned char *row,
                                                                                   int64_t g, int64_t nb,
                                                                                   v16u32 *v, v4f *d)
{
    const unsigned char *sb = row + 72 * g;
    int n = nb - 4 * g < 4 ? (int)(nb - 4 * g) : 4;
    if (n == 4)
        *v = *(const v16u32a1 *)(sb + 8);
    else
        pk_load_short(sb + 2 * n, n, v);
    *d = pk_f16x4(pk_u16x4(sb, n));
}

/* One group's 128 nibbles v times xr (its 128 reordered floats), summed
 * per lane, with two chains of FMAs. */
static inline __attribute__((always_inline)) ISA_AVX512 v16f isa_avx512_iq4_sums(v16u32 v, v16f kv,
                                                                                const float *xr)
{
#define IQ4_LOOKUP(n) __builtin_ia32_permvarsf512(kv, (v16i32)(v >> (4 * (n))))
    v16f e = IQ4_LOOKUP(0) * LOAD16(xr), o = IQ4_LOOKUP(1) * LOAD16(xr + 16);
    e += IQ4_LOOKUP(2) * LOAD16(xr + 32);
    o += IQ4_LOOKUP(3) * LOAD16(xr + 48);
    e += IQ4_LOOKUP(4) * LOAD16(xr + 64);
    o += IQ4_LOOKUP(5) * LOAD16(xr + 80);
    e += IQ4_LOOKUP(6) * LOAD16(xr + 96);
    o += IQ4_LOOKUP(7) * LOAD16(xr + 112);
#undef IQ4_LOOKUP
    return e + o;
}

/* Four IQ4_NL (xs = 0) or IQ4_XS rows of nb blocks of 32 into out[4];
 * tws (if any) asks for the lines ahead. */
static inline __attribute__((always_inline)) ISA_AVX512 void isa_avx512_iq4_quad(int xs,
                                                                                const unsigned char *const row[4],
                                                                                const float *xr, int64_t nb,
                                                                                WStream *tws, float out[4])
{
    v16f kv = LOAD16(iq4_values_f), acc[4] = {{0}, {0}, {0}, {0}};
    if (xs) {
        for (int64_t s = 0; s < nb / 8; s++) {
            if (tws)
                ws_trickle(tws, 4 * 136);
            float sc[4][8] __attribute__((aligned(32)));
            UNROLL4
            for (int i = 0; i < 4; i++)
                iq4xs_scales8(row[i] + 136 * s, isa_f16c_at(row[i] + 136 * s), sc[i]);
            for (int h = 0; h < 2; h++) {
                UNROLL4
                for (int i = 0; i < 4; i++) {
                    v16u32 v;
                    v4f d;
                    memcpy(&v, row[i] + 136 * s + 8 + 64 * h, 64);
                    memcpy(&d, sc[i] + 4 * h, 16);
                    acc[i] += __builtin_shufflevector(d, d, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) *
                              isa_avx512_iq4_sums(v, kv, xr + 256 * s + 128 * h);
                }
            }
        }
    } else {
        for (int64_t g = 0; g < (nb + 3) / 4; g++) {
            if (tws)
                ws_trickle(tws, 4 * 72);
            UNROLL4
            for (int i = 0; i < 4; i++) {
                v16u32 v;
                v4f d;
                isa_avx512_iq4nl_group(row[i], g, nb, &v, &d);
                acc[i] += __builtin_shufflevector(d, d, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) *
                          isa_avx512_iq4_sums(v, kv, xr + 128 * g);
            }
        }
    }
    v4f s = hsum16x4(acc);
    memcpy(out, &s, sizeof s);
}

/* y[r0:r1] (+)= W . x for IQ4_NL and IQ4_XS rows (k <= QFAST_K_MAX),
 * four at a time. */
static ISA_AVX512 void isa_avx512_gemv_iq4(int t, const GemvSeg *sg, int ns, const float *x, int64_t k)
{
    int64_t nb = k / 32;
    float xr[128 * ((nb + 3) / 4)] __attribute__((aligned(64)));
    iq4_x_prepare(x, k, xr);
    int64_t rb = qrow_bytes(t, k);
    for (int i = 0; i < ns; i++) {
        if (t == DT_IQ4_XS)
            SEG_QUADS(&sg[i], rb, k, WS_TRICKLE_K, KT_TUNE_FAR_QUADS, row, out, ws, isfar_,
                      isa_avx512_iq4_quad(1, row, xr, nb, ws, out));
        else
            SEG_QUADS(&sg[i], rb, k, WS_TRICKLE_K, KT_TUNE_FAR_QUADS, row, out, ws, isfar_,
                      isa_avx512_iq4_quad(0, row, xr, nb, ws, out));
    }
}

/* A Q3_K or Q2_K row by table lookups: sub-block s's table holds its
 * values of q, (d sc_s) (q - 4) for Q3_K's 3 bits (q = the 2 low bits +
 * 4 where the hmask bit is set), (d sc_s) q - dmin m_s for Q2_K's 2 bits,
 * repeated to fill the 16 lanes so that an index's bits above them need
 * no mask (vpermps reads 4). Per 16 weights: a shift (and Q3_K's high
 * bit), one lookup, one FMA; each 16 bytes of fields widened once. */
static ISA_AVX512 float isa_avx512_dot_q23k(int t, const unsigned char *b, const float *x, int64_t k)
{
    const v16f q3v = {-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3},
               q2v = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    int q3 = t == DT_Q3_K;
    v16f acc0 = {0}, acc1 = {0};
    for (int64_t j = 0; j < k; j += 256, b += q3 ? 110 : 84) {
        const unsigned char *qs = b + (q3 ? 32 : 16);
        /* the 16 sub-blocks' d sc_s (and Q2_K's dmin m_s), vectors at once */
        float dsc[16] __attribute__((aligned(64))), dm[16] __attribute__((aligned(64)));
        v16u32 hm[2] = {{0}, {0}};
        if (q3) {
            v16f sc;
            q3k_scales16(b + 96, &sc);
            STORE16(dsc, isa_f16c_at(b + 108) * sc);
            for (int u = 0; u < 2; u++)
                hm[u] = __builtin_convertvector(*(const v16u8 *)(b + 16 * u), v16u32) << 2;
        } else {
            v16u32 sc = __builtin_convertvector(*(const v16u8 *)b, v16u32);
            STORE16(dsc, isa_f16c_at(b + 80) * __builtin_convertvector(sc & 15u, v16f));
            STORE16(dm, isa_f16c_at(b + 82) * __builtin_convertvector(sc >> 4, v16f));
        }
        _Pragma("clang loop unroll(full)") for (int h = 0; h < 2; h++)
        _Pragma("clang loop unroll(full)") for (int u = 0; u < 2; u++) {
            v16u32 q = __builtin_convertvector(*(const v16u8 *)(qs + 32 * h + 16 * u), v16u32);
            UNROLL4
            for (int i = 0; i < 4; i++) {
                int s = 8 * h + 2 * i + u;
                v16u32 idx = q >> (uint32_t)(2 * i);
                v16f tab;
                if (q3) {
                    tab = dsc[s] * q3v;
                    idx = (idx & 3u) | (hm[u] >> (uint32_t)(4 * h + i) & 4u);
                } else {
                    v16f dq = dsc[s] * q2v; /* two roundings, as the reference's */
                    tab = dq - dm[s];
                }
                v16f w = __builtin_ia32_permvarsf512(tab, (v16i32)idx);
                if (i % 2)
                    acc1 += w * LOAD16(x + j + 128 * h + 32 * i + 16 * u);
                else
                    acc0 += w * LOAD16(x + j + 128 * h + 32 * i + 16 * u);
            }
        }
    }
    acc0 += acc1;
    return hsum16(&acc0);
}

/* Four packed Q8_0 rows (kernel_table.h) of nb blocks: their block scales
 * as floats into sc, 16 at a time (the last conversion reads up to 15
 * past them, inside the row's integers: 34 nb >= 2 (nb - 1) + 32 bytes;
 * those are left unused), each times mul[b] where mul is not NULL (the
 * 16-aligned tail of mul read too), and where their integers start into q. */
#define Q8_SC_ROOM (KT_PACK_K_MAX / 32 + 16)
static inline __attribute__((always_inline)) ISA_AVX512 void
isa_avx512_q8_0_rows_open(const unsigned char *const row[4], int64_t nb, const float *mul, float sc[4][Q8_SC_ROOM],
                          const unsigned char *q[4])
{
    UNROLL4
    for (int i = 0; i < 4; i++) {
        for (int64_t b = 0; b < nb; b += 16) {
            v16i16 h;
            memcpy(&h, row[i] + 2 * b, sizeof h);
            v16f f = __builtin_ia32_vcvtph2ps512_mask(h, (v16f){0}, (unsigned short)0xffff, 4);
            STORE16(sc[i] + b, mul ? f * LOAD16(mul + b) : f);
        }
        q[i] = row[i] + 2 * nb;
    }
}

/* Q8_0 on AVX-512, rows packed: each row's block scales become floats
 * first (isa_avx512_q8_0_rows_open), and each block's is broadcast from
 * there, a load, where the stored order splat and converted one per
 * block (two vector ops of the nine a block took; 1.2x from L2 on Zen 4). */
static ISA_AVX512 void isa_avx512_q8_0_rows4(const unsigned char *const row[4], const float *x, int64_t k,
                                             float out[4], WStream *ws)
{
    float sc[4][Q8_SC_ROOM];
    const unsigned char *q[4];
    isa_avx512_q8_0_rows_open(row, k / 32, NULL, sc, q);
    v16f acc[4] = {{0}, {0}, {0}, {0}};
    for (int64_t j = 0, b = 0; j < k; j += 32, b++) {
        if (ws && b % 2 == 0)
            ws_trickle(ws, 4 * 64 + 8);
        v16f x0 = LOAD16(x + j), x1 = LOAD16(x + j + 16);
        UNROLL4
        for (int i = 0; i < 4; i++) {
            acc[i] += sc[i][b] * (WIDEN_I8(q[i]) * x0 + WIDEN_I8(q[i] + 16) * x1);
            q[i] += 32;
        }
    }
    v4f o = hsum16x4(acc);
    memcpy(out, &o, sizeof o);
}

/* qrows4() for W4G64 and W4G128 with k % 32 == 0. */
static ISA_AVX512 void isa_avx512_nib_rows4(int t, const unsigned char *const row[4], const float *x, int64_t k,
                                            float out[4])
{
    const unsigned char *w[4] = {row[0], row[1], row[2], row[3]};
    v16f acc[4] = {{0}, {0}, {0}, {0}};
    if (t == DT_W4G64) {
        isa_avx512_nib_groups4(w, k / 64, 36, 2, x, acc);
        if (k % 64)
            isa_avx512_nib_groups4(w, 1, 20, 1, x + k / 64 * 64, acc);
    } else {
        isa_avx512_nib_groups4(w, k / 128, 68, 4, x, acc);
        int64_t rest = k % 128 / 32;
        if (rest)
            isa_avx512_nib_groups4(w, 1, 4 + 16 * rest, rest, x + k / 128 * 128, acc);
    }
    v4f o = hsum16x4(acc);
    memcpy(out, &o, sizeof o);
}

static void isa_avx2_w8_rows4(const unsigned char *const row[4], const float *x, int64_t k, float out[4],
                              WStream *ws);
static void isa_avx2_q8_0_rows4(const unsigned char *const row[4], const float *x, int64_t k, float out[4],
                                WStream *ws);
static void isa_avx2_gemv_nib(int t, const GemvSeg *sg, int ns, const float *x, const float *xg, int64_t k);

/* Four rows of a dtype with a fast kernel into out[4]. */
/* Whether qrows4() reads t's rows with the 256-bit W8 and Q8_0 kernels,
 * one row after another (so a long segment may go as far quads:
 * KT_TUNE_FAR_SEQ). */
static inline __attribute__((always_inline)) int qrows4_seq256(int t)
{
    return (megac_k_isa & KT_ISA_AVX2) && !(megac_k_isa & KT_ISA_AVX512) && (t == DT_W8 || t == DT_Q8_0);
}

static void qrows4(int t, const unsigned char *const row[4], const float *x, const float *xg, int64_t k,
                   float out[4], WStream *ws)
{
    if (qrows4_seq256(t)) {
        if (t == DT_W8)
            isa_avx2_w8_rows4(row, x, k, out, ws);
        else
            isa_avx2_q8_0_rows4(row, x, k, out, ws);
        return;
    }
    if ((megac_k_isa & KT_ISA_AVX512) && t == DT_Q8_0) {
        isa_avx512_q8_0_rows4(row, x, k, out, ws);
        return;
    }
    if ((megac_k_isa & KT_ISA_AVX512) && t != DT_W8 && t != DT_Q8_0) {
        isa_avx512_nib_rows4(t, row, x, k, out);
        return;
    }
    const unsigned char *w[4] = {row[0], row[1], row[2], row[3]};
    v16f acc[4] = {{0}, {0}, {0}, {0}};
    v4f off = {0};
    switch (t) {
    case DT_W8: w8_rows4(row, x, k, out, ws); return;
    case DT_Q8_0: q8_0_groups4(row, k / 32, x, acc); break;
    case DT_W4G64:
        nib_groups4(w, k / 64, 36, 2, x, xg, acc, &off);
        if (k % 64) /* a last group of 32 */
            nib_groups4(w, 1, 20, 1, x + k / 64 * 64, xg + k / 64, acc, &off);
        break;
    default: {
        nib_groups4(w, k / 128, 68, 4, x, xg, acc, &off);
        int64_t rest = k % 128 / 32;
        if (rest) /* a last group of 32, 64 or 96 */
            nib_groups4(w, 1, 4 + 16 * rest, rest, x + k / 128 * 128, xg + k / 128, acc, &off);
        break;
    }
    }
    UNROLL4
    for (int i = 0; i < 4; i++)
        out[i] = hsum16(&acc[i]) + off[i];
}

/* y[r0:r1] (+)= W . x (+ b) for the A16 quantized and half dtypes. */
static int isa_vnni512_gemv_q8x(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);
static int isa_avxvnni_gemv_q8x(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);
static int isa_vnni512_gemv_nibq(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);
static int isa_gfni512_gemv_nibq(int t, const GemvSeg *sg, int ns, const float *x, int64_t k);
static void isa_avx2_gemv_iq4(int t, const GemvSeg *sg, int ns, const float *x, const int8_t *xq, const float *dq,
                              int64_t k);
static void isa_avxvnni_gemv_iq4(int t, const GemvSeg *sg, int ns, const float *x, const int8_t *xq,
                                 const float *dq, int64_t k);

static void gemv_quant(int t, const GemvSeg *sg, int ns, const float *x, int64_t k)
{
    if ((HAS_DT(DT_Q4_0) | HAS_DT(DT_Q4_1) | HAS_DT(DT_Q5_0) | HAS_DT(DT_Q5_1) | HAS_DT(DT_W4G32)) &&
        pk_nib_rows(t, k)) {
        gemv_packed(t, sg, ns, x, k);
        return;
    }
    if ((HAS_DT(DT_Q4_K) | HAS_DT(DT_Q5_K) | HAS_DT(DT_Q6_K)) && (t == DT_Q4_K || t == DT_Q5_K || t == DT_Q6_K) &&
        k <= QFAST_K_MAX) {
        gemv_kq(t, sg, ns, x, k);
        return;
    }
    /* Q3_K and Q2_K: the k-quants' integer rows with AVX-512 VNNI, or on
     * 256 bits (AVX2, AVX-VNNI), else (or for x that they do not take)
     * the table rows of qdot */
    if ((HAS_DT(DT_Q3_K) | HAS_DT(DT_Q2_K)) && (t == DT_Q3_K || t == DT_Q2_K) && k <= QFAST_K_MAX &&
        (megac_k_isa & KT_ISA_VNNI512) && isa_vnni512_gemv_kq(t, sg, ns, x, k))
        return;
    if ((HAS_DT(DT_Q3_K) | HAS_DT(DT_Q2_K)) && (t == DT_Q3_K || t == DT_Q2_K) && k <= QFAST_K_MAX &&
        (megac_k_isa & KT_ISA_AVX2) && !(megac_k_isa & KT_ISA_AVX512) && Q256_PICK(gemv_kq_q)(t, sg, ns, x, k))
        return;
    if ((HAS_DT(DT_IQ4_NL) | HAS_DT(DT_IQ4_XS)) && (t == DT_IQ4_NL || t == DT_IQ4_XS) && k <= QFAST_K_MAX &&
        (megac_k_isa & KT_ISA_AVX2)) {
        if (megac_k_isa & KT_ISA_AVX512)
            isa_avx512_gemv_iq4(t, sg, ns, x, k);
        else
            Q256_PICK(gemv_iq4)(t, sg, ns, x, NULL, NULL, k);
        return;
    }
    if ((HAS_DT(DT_Q8_0) | HAS_DT(DT_W8)) && (t == DT_Q8_0 || t == DT_W8) && (megac_k_isa & KT_ISA_VNNI512) &&
        k % 64 == 0 && k <= QFAST_K_MAX && isa_vnni512_gemv_q8x(t, sg, ns, x, k))
        return;
    if ((HAS_DT(DT_Q8_0) | HAS_DT(DT_W8)) && (t == DT_Q8_0 || t == DT_W8) && (megac_k_isa & KT_ISA_AVXVNNI) &&
        !(megac_k_isa & KT_ISA_AVX512) && k % 32 == 0 && k <= QFAST_K_MAX && isa_avxvnni_gemv_q8x(t, sg, ns, x, k))
        return;
    if ((HAS_DT(DT_W4G64) | HAS_DT(DT_W4G128)) && (t == DT_W4G64 || t == DT_W4G128) &&
        (megac_k_isa & KT_ISA_VNNI512) && k % 32 == 0 && k <= QFAST_K_MAX &&
        ((megac_k_isa & KT_ISA_GFNI512) ? isa_gfni512_gemv_nibq(t, sg, ns, x, k) : isa_vnni512_gemv_nibq(t, sg, ns, x, k)))
        return;
    int64_t rb = qrow_bytes(t, k);
    int fast = k <= QFAST_K_MAX && (t == DT_W8 || ((t == DT_Q8_0 || t == DT_W4G64 || t == DT_W4G128) && k % 32 == 0));
    if (!fast) {
        for (int i = 0; i < ns; i++)
            for (int64_t r = sg[i].r0; r < sg[i].r1; r++) {
                ws_read(sg[i].ws, rb);
                gemv_store(sg[i].y, sg[i].b, r, qdot(t, sg[i].W + r * rb, x, k), sg[i].accum);
            }
        return;
    }
    /* the group sums of x (not for the AVX-512 table kernels, whose
     * tables hold s (q - z)) */
    float xg[k / 32 + 1];
    if (t != DT_W8 && t != DT_Q8_0 && !(megac_k_isa & KT_ISA_AVX512))
        x_group_sums(x, k, t == DT_W4G64 ? 64 : 128, xg);
    if ((megac_k_isa & KT_ISA_AVX2) && !(megac_k_isa & KT_ISA_AVX512) && (t == DT_W4G64 || t == DT_W4G128)) {
        isa_avx2_gemv_nib(t, sg, ns, x, xg, k);
        return;
    }
    for (int i = 0; i < ns; i++)
        SEG_QUADS(&sg[i], rb, k, WS_TRICKLE_K, qrows4_seq256(t) ? KT_TUNE_FAR_SEQ : 0, row, out, ws, isfar_,
                  qrows4(t, row, x, xg, k, out, ws));
}

/* y[r0:r1] (+)= W[r0:r1, 0:k] . x (+ b): one row at a time, so the weights
 * are read as one sequential stream (what hardware prefetchers follow
 * best, also for short rows), with four 16-wide accumulators. The weight
 * stream does not prefetch for it (that made f32 GEMVs ~10% slower: they
 * do little work per byte, and the hardware prefetchers keep up). */
static void gemv_f32(const GemvSeg *g, const float *x, int64_t k)
{
    const float *W = (const float *)g->W, *b = g->b;
    float *y = g->y;
    for (int64_t r = g->r0; r < g->r1; r++) {
        const float *w = W + r * k;
        g->ws->ahead -= 4 * k;  /* read, not prefetched (the comment above) */
        v16f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        int64_t j = 0;
        for (; j + 64 <= k; j += 64) {
            a0 += LOAD16(w + j) * LOAD16(x + j);
            a1 += LOAD16(w + j + 16) * LOAD16(x + j + 16);
            a2 += LOAD16(w + j + 32) * LOAD16(x + j + 32);
            a3 += LOAD16(w + j + 48) * LOAD16(x + j + 48);
        }
        for (; j + 16 <= k; j += 16)
            a0 += LOAD16(w + j) * LOAD16(x + j);
        a0 += (a1 + a2) + a3;
        float s = hsum16(&a0);
        for (; j < k; j++)
            s += w[j] * x[j];
        gemv_store(y, b, r, s, g->accum);
    }
}

/* ---- int8 activations with AVX-512 VNNI (KT_ISA_VNNI512) ----
 * vpdpbusd adds four u8 x s8 products per 32-bit lane. W8A8: the weights
 * are the unsigned side after q ^ 0x80 = q + 128, so each block's sum is
 * too large by 128 sum(xq_b); scaled by d_b and summed over the row that
 * is one constant per op (a8_c), subtracted at the end. W4A8G: nibbles
 * are unsigned already; four rows' 16 bytes of one block share a vector
 * (row i in lanes 4i..4i+3), the block's xq halves are broadcast to all
 * four, and the zero points come off as sum_g s_g z_g (sum_{b in g} d_b
 * sum(xq_b)), from per-group sums of the activation side (dsx). */

typedef uint32_t v8u32u_a __attribute__((vector_size(32), aligned(1)));
typedef int32_t v16i32u __attribute__((vector_size(64), aligned(4)));
typedef uint32_t v4u32u_a __attribute__((vector_size(16), aligned(1)));
typedef uint32_t v16u32u __attribute__((vector_size(64), aligned(1)));

static inline __attribute__((always_inline)) ISA_VNNI512 v16i32 isa_vnni512_dot(v16i32 acc, v16u32 u, v16u32 s)
{
    return __builtin_ia32_vpdpbusd512(acc, (v16i32)u, (v16i32)s);
}

/* Packed 4-bit rows (kernel_table.h) with vpdpbusd: each block b of 32
 * elements of x as 23-bit fixed point of its own, xi = rint(x / u_b) with
 * u_b = max|x_b| / (2^22 - 1), cut into three signed bytes
 * xi = 2^16 X2 + 2^8 X1 + X0; the nibbles of a superblock's 64 bytes, as
 * bytes (v & 0x0f.., v >> 4 & 0x0f..), meet each plane with vpdpbusd (64
 * products per op), the planes combined by shifts in the 32-bit lanes
 * (|sum| <= 8 * 15 * 2^22 < 2^31: exact; Q5's 5-bit values, 8 * 31 *
 * 2^22, too); one conversion per superblock,
 * the block sums scaled by d_b u_b. 19 vector ops per 128 weights instead
 * of 30. The rounding of x is at most u_b / 2 = max|x_b| 2^-23 per element:
 * relative to its own block, of the order of the f32 sums' rounding (a
 * scale per GEMV, max|x| 2^-23, was too coarse next to activation
 * outliers: the real SmolLM2 Q4_1 model drifted 1e-5 x max|logit|).
 * Plane p (2: X2, 1, 0), half h (0: low nibbles, 1: high) of superblock
 * s is 64 bytes at xq + 384 s + 128 (2 - p) + 64 h; byte 4 l + m holds
 * plane p of element 32 b + 8 m + 4 h + i of block b = l / 4 (i = l % 4):
 * byte m of word i holds elements 8 m + i and 8 m + 4 + i
 * (kernel_table.h). */
#define PKQ_MAX 4194303.0f

typedef int8_t v16s8 __attribute__((vector_size(16)));
typedef int8_t v32s8 __attribute__((vector_size(32)));
typedef int8_t v16s8a1 __attribute__((vector_size(16), aligned(1)));

/* One plane of a block's 32 elements (e order, as two halves) to its
 * [low-nibble 16 | high-nibble 16] byte order: out 16 h + 4 i + m is
 * element 8 m + 4 h + i. */
static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_plane_put(const v16i32 *p0, const v16i32 *p1,
                                                                                   int8_t *lo, int8_t *hi)
{
    /* the 32-bit lanes in that order, then to bytes (a shuffle of the 32
     * bytes took a dozen instructions without AVX-512 VBMI) */
    v16i32 l = __builtin_shufflevector(*p0, *p1, 0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    v16i32 h = __builtin_shufflevector(*p0, *p1, 4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31);
    *(v16s8a1 *)lo = __builtin_convertvector(l, v16s8);
    *(v16s8a1 *)hi = __builtin_convertvector(h, v16s8);
}

/* xi = rint(16 floats at x times inv), cut into the three planes. */
/* xi = sum_p 2^(8p) pl[p] with np signed byte planes (each sign-extended
 * in its lane; the top one takes what is left). */
static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_byte_planes(v16i32 xi, int np, v16i32 *pl)
{
    UNROLL4
    for (int p = 0; p < np - 1; p++) {
        pl[p] = (xi << 24) >> 24;
        xi = (xi - pl[p]) >> 8;
    }
    pl[np - 1] = xi;
}

static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_pkq_cut(const float *x, float inv,
                                                                                 v16i32 pl[3])
{
    v16f f = LOAD16(x) * inv;
    f = (f + 12582912.0f) - 12582912.0f; /* nearest integer (|f| <= 2^22) */
    isa_vnni512_byte_planes(__builtin_convertvector(f, v16i32), 3, pl);
}

/* The largest of the 16 lanes, as a tree of halving maxima. A loop over
 * the lanes compiled to a store of the vector and 16 dependent reloads of
 * it: 5-6% of the time of SmolLM2-135M's Q4_0 GEMVs with exact inputs
 * went there, once per block of 32 of x (perf record -e cpu-clock). */
static inline __attribute__((always_inline)) uint32_t hmax16u(const v16u32 *p)
{
    v16u32 v = *p;
    v8u32 h8 = __builtin_elementwise_max(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                                         __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
    v4u32 h4 = __builtin_elementwise_max(__builtin_shufflevector(h8, h8, 0, 1, 2, 3),
                                         __builtin_shufflevector(h8, h8, 4, 5, 6, 7));
    h4 = __builtin_elementwise_max(h4, __builtin_shufflevector(h4, h4, 2, 3, 0, 1));
    h4 = __builtin_elementwise_max(h4, __builtin_shufflevector(h4, h4, 1, 0, 3, 2));
    return h4[0];
}

/* Whether the integer kernels may take x[0:k] as fixed point: all finite
 * (otherwise the float kernels run and propagate the infinity or NaN), and
 * max|x| zero or at least 2^-64 (below it the scales of the fixed point,
 * times the weights' f16 ones, would be subnormal floats: Q8_0 rows
 * against x of 1e-31 came out 7e-4 of their value off). */
static inline __attribute__((always_inline)) int x_integer_ok(const float *x, int64_t k, float *amax)
{
    v16u32 m = {0};
    for (int64_t j = 0; j < k; j += 16)
        m = __builtin_elementwise_max(m, (v16u32)LOAD16(x + j) & 0x7fffffffu);
    uint32_t mb = hmax16u(&m);
    if (amax) /* max|x|, where x is finite */
        memcpy(amax, &mb, 4);
    return mb < 0x7f800000u && (mb == 0 || mb >= 0x1f800000u); /* 0x1f800000: 2^-64 */
}

/* max|x| of each of x's nb blocks of 32 into m[0:nb] (NaNs count as 0),
 * and zeros after it to a multiple of 16 (m holds that many): the first
 * pass of cut_scales and of kernel_act.inc's act_scales. */
static inline __attribute__((always_inline)) void block_amax(const float *x, int64_t nb, float *m)
{
    for (int64_t b = 0; b < nb; b++) { /* |x| as integers: same order as the floats */
        v16u32 u0 = (v16u32)LOAD16(x + 32 * b) & 0x7fffffffu, u1 = (v16u32)LOAD16(x + 32 * b + 16) & 0x7fffffffu;
        u0 &= (v16u32)(u0 <= 0x7f800000u);
        u1 &= (v16u32)(u1 <= 0x7f800000u);
        v16u32 mx = __builtin_elementwise_max(u0, u1);
        uint32_t mb = hmax16u(&mx);
        memcpy(m + b, &mb, 4);
    }
    for (int64_t b = nb; b % 16; b++)
        m[b] = 0.0f;
}

/* The fixed point's scales of x's nb blocks of 32 (x finite:
 * x_integer_ok): inv[b] = PKQ_MAX / max|x_b| and u[b] = max|x_b| / PKQ_MAX,
 * both 0 for a block of zeros; inv holds nb rounded up to 16, u nb. All
 * the maxima first, then the divisions 16 blocks at a time (the same
 * values): done block by block, each block's maximum, divisions and cut
 * made one chain, and SmolLM2-135M's Q4_0 step with exact inputs spent
 * 5.5% of its cycles preparing them on the Xeon host (the cycle profile's
 * "inputs"). Generic vector code, inlined into each instruction set's
 * kernels (the AVX-512 VNNI and the 256-bit ones). */
static inline __attribute__((always_inline)) void cut_scales(const float *x, int64_t nb, float *inv, float *u)
{
    block_amax(x, nb, inv);
    for (int64_t b = 0; b < nb; b += 16) {
        v16f amax = LOAD16(inv + b);
        v16i32 pos = (v16i32)(amax > 0.0f);
        v16f uv = (v16f)((v16i32)(amax / PKQ_MAX) & pos);
        STORE16(inv + b, (v16f)((v16i32)(PKQ_MAX / amax) & pos));
        memcpy(u + b, &uv, sizeof(float) * (size_t)(nb - b < 16 ? nb - b : 16));
    }
}

/* Block x[0:32] as fixed point (inv: cut_scales's): the three
 * planes of its halves into a and b. */
static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_block_cut(const float *x, float inv,
                                                                                  v16i32 a[3], v16i32 b[3])
{
    isa_vnni512_pkq_cut(x, inv, a);
    isa_vnni512_pkq_cut(x + 16, inv, b);
}

/* The planes of x into xq and each block's u_b into ub (0 past k), in the
 * packed rows' byte order or, with natural, in element order (elements
 * 0-15 of block 4j + c at bytes 16c of the plane's low half, 16-31 of its
 * high half: the W4G64/W4G128 records' chunks); returns 0 (nothing
 * usable) where x_integer_ok() is not (the float kernel then takes x). */
static ISA_VNNI512 int isa_vnni512_pkq_x_prepare(const float *x, int64_t k, int natural, int8_t *xq, float *ub)
{
    int64_t nb = k / 32, nsb = (nb + 3) / 4;
    if (!x_integer_ok(x, k, NULL))
        return 0;
    float inv[nb + 16] __attribute__((aligned(64)));
    cut_scales(x, nb, inv, ub);
    memset(xq + 384 * (nb / 4), 0, (size_t)(384 * (nsb - nb / 4)));
    for (int64_t blk = nb; blk < 4 * nsb; blk++)
        ub[blk] = 0.0f;
    for (int64_t blk = 0; blk < nb; blk++) {
        int8_t *o = xq + 384 * (blk / 4) + 16 * (blk % 4);
        v16i32 a[3], b[3];
        isa_vnni512_block_cut(x + 32 * blk, inv[blk], a, b);
        UNROLL4
        for (int p = 0; p < 3; p++) { /* plane p (0: the lowest) at 256 - 128 p */
            if (natural) {
                *(v16s8a1 *)(o + 256 - 128 * p) = __builtin_convertvector(a[p], v16s8);
                *(v16s8a1 *)(o + 320 - 128 * p) = __builtin_convertvector(b[p], v16s8);
            } else {
                isa_vnni512_plane_put(&a[p], &b[p], o + 256 - 128 * p, o + 320 - 128 * p);
            }
        }
    }
    return 1;
}

/* The integer sums of a superblock's four chunks of 32 (lanes 4c..4c+3:
 * chunk c) whose nibbles are lo and hi (as bytes) against its three
 * planes xq (pkq_x_prepare's layout): (X2 . q << 8 + X1 . q) << 8 + X0 . q. */
static inline __attribute__((always_inline)) ISA_VNNI512 v16i32 isa_vnni512_pk_dots(v16u32 lo, v16u32 hi,
                                                                                  const int8_t *xq)
{
    v16i32 s = isa_vnni512_dot((v16i32){0}, lo, *(const v16u32 *)xq);
    s = isa_vnni512_dot(s, hi, *(const v16u32 *)(xq + 64));
    s = isa_vnni512_dot(s << 8, lo, *(const v16u32 *)(xq + 128));
    s = isa_vnni512_dot(s, hi, *(const v16u32 *)(xq + 192));
    s = isa_vnni512_dot(s << 8, lo, *(const v16u32 *)(xq + 256));
    return isa_vnni512_dot(s, hi, *(const v16u32 *)(xq + 320));
}

/* The packed rows' GEMV for AVX-512 VNNI, and for VNNI with GFNI: there
 * vgf2p8affineqb takes each byte's high nibble in one instruction where a
 * shift and a mask take two (llvm-mca, icelake-server, of the Q4_0 loop
 * on four rows: 29.9 -> 28.1 cycles per 256 weight bytes). */
#define PKV_ATTR ISA_VNNI512
#define PKV(name) isa_vnni512_##name
#define PKV_HI(v) (((v) >> 4) & 0x0f0f0f0fu)
#include "codegen/cpu/kernel_pk_vnni.inc"
#undef PKV_ATTR
#undef PKV
#undef PKV_HI

typedef char v64i8 __attribute__((vector_size(64)));
typedef uint64_t v8u64 __attribute__((vector_size(64)));

/* The high nibble of each byte of v, as a byte: the GF(2) affine map whose
 * matrix row i (byte 7 - i of each qword) picks bit i + 4 for i < 4. */
static inline __attribute__((always_inline)) ISA_GFNI512 v16u32 isa_gfni512_hi(v16u32 v)
{
    v8u64 m = {0x1020408000000000ull, 0x1020408000000000ull, 0x1020408000000000ull, 0x1020408000000000ull,
               0x1020408000000000ull, 0x1020408000000000ull, 0x1020408000000000ull, 0x1020408000000000ull};
    return (v16u32)__builtin_ia32_vgf2p8affineqb_v64qi((v64i8)v, (v64i8)m, 0);
}

#define PKV_ATTR ISA_GFNI512
#define PKV(name) isa_gfni512_##name
#define PKV_HI(v) isa_gfni512_hi(v)
#include "codegen/cpu/kernel_pk_vnni.inc"
#undef PKV_ATTR
#undef PKV
#undef PKV_HI

/* The four rows' s (f16 @off) and s z (z @off + 2) of a record. */
static inline __attribute__((always_inline)) ISA_VNNI512 v4f isa_vnni512_nib_s4(const unsigned char *const row[4],
                                                                             int64_t off, v4f *sz)
{
    v8i16 h = {0};
    v4f z;
    UNROLL4
    for (int i = 0; i < 4; i++) {
        h[i] = (short)(row[i][off] | row[i][off + 1] << 8);
        z[i] = (float)row[i][off + 2];
    }
    v4f s = __builtin_shufflevector(__builtin_ia32_vcvtph2ps(h), (v4f){0}, 0, 1, 2, 3);
    *sz = s * z;
    return s;
}

#define NQ(name) isa_vnni512_##name
#define NQ_ATTR ISA_VNNI512
#define NQ_HI(v) ((v) >> 4 & 0x0f0f0f0fu)
#include "codegen/cpu/kernel_nibq.inc"
#undef NQ
#undef NQ_ATTR
#undef NQ_HI
/* with GFNI, the high nibbles by one vgf2p8affineqb (isa_gfni512_hi) */
#define NQ(name) isa_gfni512_##name
#define NQ_ATTR ISA_GFNI512
#define NQ_HI(v) isa_gfni512_hi(v)
#include "codegen/cpu/kernel_nibq.inc"
#undef NQ
#undef NQ_ATTR
#undef NQ_HI

/* Q4_K, Q5_K and Q6_K rows with vpdpbusd, x in the same three planes of
 * 23-bit fixed point per block of 32 as the packed rows (above). The
 * weights are their own bytes: v & 0x0f.. and v >> 4 & 0x0f.. of a 64-byte
 * load are unsigned bytes (Q5_K ORs its fifth bits in, Q6_K its two high
 * bits), lane L summing four elements of one sub-block, so each lane's
 * integer sum is scaled by its sub-block's d sc and its x block's u once.
 * Offsets (mins, Q6_K's - 32) meet the exact float sums of x.
 * Planes: 384 bytes per 128 elements, plane p (2, 1, 0) at 128 (2 - p),
 * then part 0 and part 1 (64 bytes each), as the 64-byte loads meet them:
 *   Q4_K, Q5_K: part 0 (low nibbles) holds elements 0-31 and 64-95 of
 *               the 128, part 1 (high nibbles) 32-63 and 96-127;
 *   Q6_K:       part 0 (ql's low nibbles) elements 0-63, part 1 64-127. */

/* xq and ub (one u per block of 32) for kq rows of k (k % 256 == 0);
 * 0 where x_integer_ok() is not. */
static ISA_VNNI512 int isa_vnni512_kq_x_prepare(int q6, const float *x, int64_t k, int8_t *xq, float *ub)
{
    if (!x_integer_ok(x, k, NULL))
        return 0;
    float inv[k / 32 + 16] __attribute__((aligned(64)));
    cut_scales(x, k / 32, inv, ub);
    for (int64_t blk = 0; blk < k / 32; blk++) {
        int j = (int)(blk % 4), part = q6 ? j / 2 : j % 2, half = q6 ? j % 2 : j / 2;
        int8_t *o = xq + 384 * (blk / 4) + 64 * part + 32 * half;
        v16i32 a[3], b[3];
        isa_vnni512_block_cut(x + 32 * blk, inv[blk], a, b);
        for (int p = 0; p < 3; p++) {
            *(v16s8a1 *)(o + 128 * (2 - p)) = __builtin_convertvector(a[p], v16s8);
            *(v16s8a1 *)(o + 128 * (2 - p) + 16) = __builtin_convertvector(b[p], v16s8);
        }
    }
    return 1;
}

/* The integer sums of parts 0 and 1 of 128 weights (bytes w0, w1) against
 * their 128 np bytes of x: np = 3 planes (A16), or np = 1, x's int8
 * values (the A8 forms, isa_vnni512_gemv_kqa8). */
static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_kq_dots(int np, v16u32 w0, v16u32 w1,
                                                                                const int8_t *xq, v16f *s0,
                                                                                v16f *s1)
{
    v16i32 a = isa_vnni512_dot((v16i32){0}, w0, *(const v16u32 *)xq);
    v16i32 b = isa_vnni512_dot((v16i32){0}, w1, *(const v16u32 *)(xq + 64));
    if (np == 1) {
        *s0 = __builtin_convertvector(a, v16f);
        *s1 = __builtin_convertvector(b, v16f);
        return;
    }
    a = isa_vnni512_dot(a << 8, w0, *(const v16u32 *)(xq + 128));
    b = isa_vnni512_dot(b << 8, w1, *(const v16u32 *)(xq + 192));
    a = isa_vnni512_dot(a << 8, w0, *(const v16u32 *)(xq + 256));
    b = isa_vnni512_dot(b << 8, w1, *(const v16u32 *)(xq + 320));
    *s0 = __builtin_convertvector(a, v16f);
    *s1 = __builtin_convertvector(b, v16f);
}

/* 16 bytes at each w[i] + off, row i in lanes 4i..4i+3. */
static inline __attribute__((always_inline)) ISA_VNNI512 v16u32 isa_vnni512_rows4_chunk(const unsigned char *const w[4], int64_t off)
{
    v4u32 c0 = *(const v4u32u_a *)(w[0] + off), c1 = *(const v4u32u_a *)(w[1] + off);
    v4u32 c2 = *(const v4u32u_a *)(w[2] + off), c3 = *(const v4u32u_a *)(w[3] + off);
    v8u32 a = __builtin_shufflevector(c0, c1, 0, 1, 2, 3, 4, 5, 6, 7);
    v8u32 b = __builtin_shufflevector(c2, c3, 0, 1, 2, 3, 4, 5, 6, 7);
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* kq_scales() of four rows' Q4_K/Q5_K super-blocks at once (16 bytes at
 * each w[i] + off: d, dmin, scales[12]): dm[i] = {sc_j d (8) | mn_j dmin
 * (8)} of row i, exactly as kq_scales gives them. Row i is lane i of 128
 * bits, so kq_scales' byte selections are in-lane shuffles done once for
 * the four rows, where the row-by-row form did them four times (from L2,
 * one core, k 1536: Q4_K 12.7 -> 14.6 GB/s, Q5_K 12.9 -> 14.4, with int8
 * inputs 19.0 -> 22.0 and 18.1 -> 20.9; the same results, bit for bit). */
static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_kq_scales4(const unsigned char *const w[4],
                                                                                   int64_t off, v16f dm[4])
{
    v16u32 v = isa_vnni512_rows4_chunk(w, off);
#define KQ_LANES(...) {__VA_ARGS__, __VA_ARGS__, __VA_ARGS__, __VA_ARGS__}
    /* lane byte 4 + j is scales[j]; out bytes 0-3: scales[0..3] & 63, 4-7:
     * scales[8..11] & 15 | (scales[0..3] >> 6) << 4, 8-11: scales[4..7] & 63,
     * 12-15: scales[8..11] >> 4 | (scales[4..7] >> 6) << 4 (-1: zero) */
    const v64i8 lo = KQ_LANES(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, -1, -1, -1, -1);
    const v64i8 nib = KQ_LANES(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 12, 13, 14, 15);
    const v64i8 top = KQ_LANES(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11);
    const v64i8 m6 = KQ_LANES(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0);
#undef KQ_LANES
    v16u32 a = (v16u32)__builtin_ia32_pshufb512((v64i8)v, lo) & (v16u32)m6;
    v16u32 n = (v16u32)__builtin_ia32_pshufb512((v64i8)(v >> 4 & 0x0f0f0f0fu), nib);
    v16u32 t = (v16u32)__builtin_ia32_pshufb512((v64i8)v, top) >> 2 & 0x30303030u;
    v16u32 sc = a | n | t;
    v4u32 h = __builtin_shufflevector(v, v, 0, 4, 8, 12); /* d, dmin of each row */
    v8fs f = __builtin_ia32_vcvtph2ps256((v8i16)h);
    v16u8 q[4];
    memcpy(q, &sc, 64);
    UNROLL4
    for (int i = 0; i < 4; i++) {
        float d = f[2 * i], m = f[2 * i + 1];
        dm[i] = __builtin_convertvector(q[i], v16f) * (v16f){d, d, d, d, d, d, d, d, m, m, m, m, m, m, m, m};
    }
}

/* One Q4_K/Q5_K super-block b against its 256 np bytes of x (np planes):
 * du its 8 blocks' d sc_j u (isa_vnni512_kq_scales4 times x's u). */
static inline __attribute__((always_inline)) ISA_VNNI512 void
isa_vnni512_kq4_superblock(int np, int q5, const unsigned char *b, const int8_t *xq, v8fs du, v16f *acc)
{
    const unsigned char *qs = b + (q5 ? 48 : 16);
    v16u32 h = {0};
    if (q5) {
        v8u32 w;
        memcpy(&w, b + 16, 32);
        h = __builtin_shufflevector(w, w, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7) >>
            (v16u32){0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2};
    }
    for (int g = 0; g < 2; g++) {
        v16u32 v = *(const v16u32a1 *)(qs + 64 * g), lo = v & 0x0f0f0f0fu, hi = (v >> 4) & 0x0f0f0f0fu;
        if (q5) { /* element l of sub-block s: bit s of qh[l]; h >> 4g puts 2c, 2c + 1 at bits 0, 1 */
            v16u32 hg = h >> (uint32_t)(4 * g);
            lo |= (hg & 0x01010101u) << 4;
            hi |= (hg & 0x02020202u) << 3;
        }
        v16f s0, s1;
        isa_vnni512_kq_dots(np, lo, hi, xq + 128 * np * g, &s0, &s1);
        if (g == 0) { /* two FMAs into acc (acc + (a + b) took a multiply, an FMA and an add) */
            *acc += __builtin_shufflevector(du, du, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2) * s0;
            *acc += __builtin_shufflevector(du, du, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3) * s1;
        } else {
            *acc += __builtin_shufflevector(du, du, 4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6) * s0;
            *acc += __builtin_shufflevector(du, du, 5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7) * s1;
        }
    }
}

/* *acc += each lane's sums s0 (part 0) and s1 (part 1) of half h of a
 * super-block with sub-blocks of 16 (Q6_K's planes) times its sub-block's
 * d[] and its x block's u[]: lane L holds elements 4L.. of part 0
 * (sub-block 8h + L / 4, x block 4h + L / 8) and of part 1 (sub-block
 * 8h + 4 + L / 4, block 4h + 2 + L / 8). */
static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_kq16_add(int h, v16f d, v16f u, v16f s0,
                                                                                 v16f s1, v16f *acc)
{
    if (h == 0) {
        *acc += __builtin_shufflevector(d, d, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) *
                __builtin_shufflevector(u, u, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1) * s0;
        *acc += __builtin_shufflevector(d, d, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7) *
                __builtin_shufflevector(u, u, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3) * s1;
    } else {
        *acc += __builtin_shufflevector(d, d, 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11) *
                __builtin_shufflevector(u, u, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5) * s0;
        *acc += __builtin_shufflevector(d, d, 12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15) *
                __builtin_shufflevector(u, u, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7) * s1;
    }
}

/* One Q6_K super-block b against its planes, u8 and xs16 (its 16
 * sub-block sums of x, 16 elements each): values 0..63 as bytes, the
 * - 32 as 32 sum d sc xs. */
static inline __attribute__((always_inline)) ISA_VNNI512 void
isa_vnni512_kq6_superblock(int np, const unsigned char *b, const int8_t *xq, const v8fs *u8p, const v16f *xs16,
                           v16f *acc, v16f *off)
{
    v16f d = __builtin_convertvector(*(const v16i8 *)(b + 192), v16f) * isa_f16c_at(b + 208);
    *off += d * *xs16;
    v8fs u8 = *u8p;
    v16f u = __builtin_shufflevector(u8, u8, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    for (int h = 0; h < 2; h++) {
        v16u32 v = *(const v16u32a1 *)(b + 64 * h);
        v8u32 w;
        memcpy(&w, b + 128 + 32 * h, 32);
        v16u32 q = __builtin_shufflevector(w, w, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7) >>
                   (v16u32){0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2};
        v16u32 lo = (v & 0x0f0f0f0fu) | (q & 0x03030303u) << 4;
        v16u32 hi = (v >> 4 & 0x0f0f0f0fu) | (q & 0x30303030u); /* bits 4-5 of q are already where they go */
        v16f s0, s1;
        isa_vnni512_kq_dots(np, lo, hi, xq + 128 * np * h, &s0, &s1);
        isa_vnni512_kq16_add(h, d, u, s0, s1, acc);
    }
}

/* One Q3_K or Q2_K super-block b against its planes (Q6_K's part
 * layout: its 2-bit fields, byte l of qs + 32h holding elements 32i + l
 * of half h at bits 2i, fall as Q6_K's values do, four elements a lane
 * of one sub-block of 16), u8 and xs16 (its 16 sub-block sums of x): the
 * values as bytes q (Q3_K: q + 4 where the hmask bit is set, 0..7), each
 * lane's integer sum times d sc of its sub-block; Q3_K's - 4 as 4 sum d sc
 * xs, Q2_K's dmin m as sum dmin m xs, both into *off. */
static inline __attribute__((always_inline)) ISA_VNNI512 void
isa_vnni512_kq23_superblock(int np, int q3, const unsigned char *b, const int8_t *xq, const v8fs *u8p,
                            const v16f *xs16, v16f *acc, v16f *off)
{
    v16f d, om;
    kq23_scales16(q3, b, isa_f16c_at(b + (q3 ? 108 : 80)), q3 ? 0.0f : isa_f16c_at(b + 82), &d, &om);
    *off += om * *xs16;
    v8fs u8 = *u8p;
    v16f u = __builtin_shufflevector(u8, u8, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    v8u32 hw = {0};
    if (q3)
        memcpy(&hw, b, 32);
    for (int h = 0; h < 2; h++) {
        v8u32 w;
        memcpy(&w, b + (q3 ? 32 : 16) + 32 * h, 32);
        v16u32 q = __builtin_shufflevector(w, w, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7) >>
                   (v16u32){0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2};
        v16u32 lo = q & 0x03030303u, hi = q >> 4 & 0x03030303u;
        if (q3) { /* bit 4h + i of hmask[l]: i = 0, 1 in part 0's halves, 2, 3 in part 1's */
            v16u32 m = __builtin_shufflevector(hw, hw, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7) >>
                       (v16u32){4 * h, 4 * h, 4 * h, 4 * h, 4 * h, 4 * h, 4 * h, 4 * h, 4 * h + 1, 4 * h + 1,
                                4 * h + 1, 4 * h + 1, 4 * h + 1, 4 * h + 1, 4 * h + 1, 4 * h + 1};
            lo |= (m & 0x01010101u) << 2;
            hi |= m & 0x04040404u;
        }
        v16f s0, s1;
        isa_vnni512_kq_dots(np, lo, hi, xq + 128 * np * h, &s0, &s1);
        isa_vnni512_kq16_add(h, d, u, s0, s1, acc);
    }
}

/* Four k-quant rows side by side into out[4]; tws (if any) asks for the
 * lines ahead. */
static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_kq_quad(int t, int np,
                                                                               const unsigned char *const row[4],
                                                                               const int8_t *xq, const float *ub,
                                                                               const float *xs, int64_t k,
                                                                               WStream *tws, float out[4])
{
    int64_t bb = t == DT_Q4_K ? 144 : t == DT_Q5_K ? 176 : t == DT_Q6_K ? 210 : t == DT_Q3_K ? 110 : 84;
    v16f acc[4] = {{0}, {0}, {0}, {0}}, off16[4] = {{0}, {0}, {0}, {0}};
    v8fs off8[4] = {{0}, {0}, {0}, {0}};
    for (int64_t s = 0; s < k / 256; s++) {
        if (tws)
            ws_trickle(tws, 4 * bb);
        v8fs u8;
        memcpy(&u8, ub + 8 * s, 32);
        if (t == DT_Q3_K || t == DT_Q2_K) {
            v16f xs16 = LOAD16(xs + 16 * s);
            UNROLL4
            for (int i = 0; i < 4; i++)
                isa_vnni512_kq23_superblock(np, t == DT_Q3_K, row[i] + s * bb, xq + 256 * np * s, &u8, &xs16,
                                            &acc[i], &off16[i]);
        } else if (t == DT_Q6_K) {
            v16f xs16 = LOAD16(xs + 16 * s);
            UNROLL4
            for (int i = 0; i < 4; i++)
                isa_vnni512_kq6_superblock(np, row[i] + s * bb, xq + 256 * np * s, &u8, &xs16, &acc[i], &off16[i]);
        } else {
            v8fs xs8;
            memcpy(&xs8, xs + 8 * s, 32);
            v16f dm[4];
            isa_vnni512_kq_scales4(row, s * bb, dm);
            UNROLL4
            for (int i = 0; i < 4; i++) {
                off8[i] += __builtin_shufflevector(dm[i], dm[i], 8, 9, 10, 11, 12, 13, 14, 15) * xs8;
                isa_vnni512_kq4_superblock(np, t == DT_Q5_K, row[i] + s * bb, xq + 256 * np * s,
                                           __builtin_shufflevector(dm[i], dm[i], 0, 1, 2, 3, 4, 5, 6, 7) * u8,
                                           &acc[i]);
            }
        }
    }
    UNROLL4
    for (int i = 0; i < 4; i++)
        out[i] = t == DT_Q4_K || t == DT_Q5_K ? hsum16(&acc[i]) - kq_hsum8(&off8[i])
                 : t == DT_Q6_K               ? hsum16(&acc[i]) - 32.0f * hsum16(&off16[i])
                 : t == DT_Q3_K               ? hsum16(&acc[i]) - 4.0f * hsum16(&off16[i])
                                              : hsum16(&acc[i]) - hsum16(&off16[i]);
}

/* Rows [r0, r1) of a k-quant. */
static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_kq_rows(int t, int np, const GemvSeg *g,
                                                                                const int8_t *xq, const float *ub,
                                                                                const float *xs, int64_t k)
{
    int64_t rb = qrow_bytes(t, k);
    SEG_QUADS(g, rb, k, WS_TRICKLE_K, KT_TUNE_FAR_QUADS, row, out, ws, isfar_,
              isa_vnni512_kq_quad(t, np, row, xq, ub, xs, k, ws, out));
}

/* gemv_kq() with vpdpbusd; 0 (nothing done) where x_integer_ok() is not. */
static ISA_VNNI512 int isa_vnni512_gemv_kq(int t, const GemvSeg *sg, int ns, const float *x, int64_t k)
{
    int8_t xq[3 * k] __attribute__((aligned(64)));
    float ub[k / 32], xs[k / 16];
    int sixteen = t == DT_Q6_K || t == DT_Q3_K || t == DT_Q2_K; /* sub-blocks of 16, Q6_K's planes */
    if (!isa_vnni512_kq_x_prepare(sixteen, x, k, xq, ub))
        return 0;
    /* vector sums (a scalar loop here was one chain of k dependent adds,
     * ~3000 cycles an op at k 768), in the order the AVX2 kernels take */
    x_group_sums(x, k, sixteen ? 16 : 32, xs);
    for (int i = 0; i < ns; i++) {
        if (t == DT_Q4_K)
            isa_vnni512_kq_rows(DT_Q4_K, 3, &sg[i], xq, ub, xs, k);
        else if (t == DT_Q5_K)
            isa_vnni512_kq_rows(DT_Q5_K, 3, &sg[i], xq, ub, xs, k);
        else if (t == DT_Q6_K)
            isa_vnni512_kq_rows(DT_Q6_K, 3, &sg[i], xq, ub, xs, k);
        else if (HAS_DT(DT_Q3_K) && t == DT_Q3_K)
            isa_vnni512_kq_rows(DT_Q3_K, 3, &sg[i], xq, ub, xs, k);
        else if (HAS_DT(DT_Q2_K) && t == DT_Q2_K)
            isa_vnni512_kq_rows(DT_Q2_K, 3, &sg[i], xq, ub, xs, k);
    }
    return 1;
}

/* W8A8, k % 64 == 0; dl[j / 4]: d of the block of x[j] (16 per 64). */
static ISA_VNNI512 void isa_vnni512_w8a8_rows4(const unsigned char *const row[4], const int8_t *xq, const float *dl,
                                              float c, int64_t k, float out[4], WStream *ws)
{
    v16f acc[4] = {{0}, {0}, {0}, {0}};
    for (int64_t j = 0; j < k; j += 64) {
        if (ws)
            ws_trickle(ws, 4 * 64);
        v16u32 xv = *(const v16u32u *)(xq + j);
        v16f d = LOAD16(dl + j / 4);
        UNROLL4
        for (int i = 0; i < 4; i++) {
            v16u32 u = *(const v16u32u *)(row[i] + 4 + j) ^ 0x80808080u;
            acc[i] += __builtin_convertvector(isa_vnni512_dot((v16i32){0}, u, xv), v16f) * d;
        }
    }
    UNROLL4
    for (int i = 0; i < 4; i++) {
        float s;
        memcpy(&s, row[i], 4);
        out[i] = s * (hsum16(&acc[i]) - c);
    }
}

/* Q8_0 rows (A16) with vpdpbusd (W8 rows: below): x in the packed 4-bit rows'
 * 23-bit fixed point per block of 32 (xi = rint(x / u_b), u_b = max|x_b| /
 * PKQ_MAX, the same three signed byte planes: isa_vnni512_block_cut), kept
 * in element order (plane 2 at xq, 1 at xq + k, 0 at xq + 2 k); the
 * weights made unsigned (q ^ 0x80 = q + 128) meet each plane with
 * vpdpbusd, the planes combined by shifts in the 32-bit lanes, and 128
 * (the sum of the lane's four xi) taken off in integers (corr). Those
 * sums of (q + 128) xi may wrap around, but vpdpbusd, the shifts and the
 * subtraction are exact modulo 2^32, and what is left, the lane's sum of
 * four q xi, is at most 4 128 (2^22 - 1) < 2^31 in size: exact before its
 * conversion (cpu_quant_perf.q8_lane_bound reaches that bound; a 24-bit x
 * fails it). The rounding of x is at most max|x_b| 2^-23 per element, as
 * for the 4-bit rows. One conversion and one FMA per 64 weights of a row
 * where the float loop converted every weight: from L2 on one Zen 4 core
 * (`MEGAC_QBENCH_MB=0.2 MEGAC_QBENCH_REPS=1500`), Q8_0 at k 576 25.4 ->
 * 31.8 GB/s, at 1536 27.1 -> 31.7 (W8 this way: 25.1 -> 34.6 and 26.2 ->
 * 32.8). Non-finite or tiny x takes the float kernels (x_integer_ok). */

/* The lanes' sums of (q + 128) xi less corr: u the weights' bytes made
 * unsigned, x2, x1, x0 the planes. */
static inline __attribute__((always_inline)) ISA_VNNI512 v16i32 isa_vnni512_q8x_dot(v16u32 u, v16u32 x2, v16u32 x1,
                                                                                   v16u32 x0, v16i32 cv)
{
    v16i32 a = isa_vnni512_dot((v16i32){0}, u, x2) << 8;
    a = isa_vnni512_dot(a, u, x1) << 8;
    return isa_vnni512_dot(a, u, x0) - cv;
}

/* x's planes into xq (3 k bytes), u_b into ub and 128 (sum of xi over
 * elements 4 l..4 l + 3) into corr[l]; k % 64 == 0. 0 (nothing usable)
 * where x_integer_ok() is not. */
static ISA_VNNI512 int isa_vnni512_q8x_prepare(const float *x, int64_t k, int8_t *xq, float *ub, int32_t *corr)
{
    if (!x_integer_ok(x, k, NULL))
        return 0;
    float inv[k / 32 + 16] __attribute__((aligned(64)));
    cut_scales(x, k / 32, inv, ub);
    for (int64_t blk = 0; blk < k / 32; blk++) {
        v16i32 h[2][3];
        isa_vnni512_block_cut(x + 32 * blk, inv[blk], h[0], h[1]);
        for (int half = 0; half < 2; half++)
            for (int p = 0; p < 3; p++)
                *(v16s8a1 *)(xq + (2 - p) * k + 32 * blk + 16 * half) = __builtin_convertvector(h[half][p], v16s8);
    }
    const v16u32 ones = {0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u,
                         0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u,
                         0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u};
    for (int64_t j = 0; j + 64 <= k; j += 64) /* the lanes' sums of xi, as the rows' own */
        *(v16i32u *)(corr + j / 4) =
            isa_vnni512_q8x_dot(ones, *(const v16u32u *)(xq + j), *(const v16u32u *)(xq + k + j),
                                *(const v16u32u *)(xq + 2 * k + j), (v16i32){0})
            << 7;
    return 1;
}

/* Four packed Q8_0 rows (kernel_table.h), k % 64 == 0, against x's np = 3
 * planes (A16, above) or, np = 1, its int8 values (Q8_0A8): two blocks of
 * a row per vector (lanes 0-7 the first), one 64-byte load, weights made
 * unsigned by q ^ 0x80 = q + 128, the excess 128 * (sum of the lane's
 * four x) taken off per lane in integers (corr), so each lane is exact
 * before its conversion; the row's block scales times x's (xs: u_b or d
 * of x's block b, zeros past k / 32 to a multiple of 16) become floats
 * first (isa_avx512_q8_0_rows_open), and each pair goes to its eight
 * lanes each. */
static inline __attribute__((always_inline)) ISA_VNNI512 void
isa_vnni512_q8_0_rows4(int np, const unsigned char *const row[4], const int8_t *xq, const float *xs,
                       const int32_t *corr, int64_t k, float out[4], WStream *ws)
{
    float sc[4][Q8_SC_ROOM];
    const unsigned char *q[4];
    isa_avx512_q8_0_rows_open(row, k / 32, xs, sc, q);
    v16f acc[4] = {{0}, {0}, {0}, {0}};
    for (int64_t j = 0; j < k; j += 64) {
        if (ws)
            ws_trickle(ws, 4 * 64 + 16);
        v16u32 x2 = *(const v16u32u *)(xq + j), x1 = x2, x0 = x2;
        if (np == 3) {
            x1 = *(const v16u32u *)(xq + k + j);
            x0 = *(const v16u32u *)(xq + 2 * k + j);
        }
        v16i32 cv = *(const v16i32u *)(corr + j / 4);
        UNROLL4
        for (int i = 0; i < 4; i++) {
            v16u32 u = *(const v16u32u *)(q[i] + j) ^ 0x80808080u;
            v16i32 p = np == 3 ? isa_vnni512_q8x_dot(u, x2, x1, x0, cv) : isa_vnni512_dot((v16i32){0}, u, x2) - cv;
            v4f s4;
            memcpy(&s4, sc[i] + j / 32, sizeof s4); /* the pair's two, and two unused */
            v16f w = __builtin_shufflevector(s4, s4, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
            acc[i] += __builtin_convertvector(p, v16f) * w;
        }
    }
    v4f o = hsum16x4(acc);
    memcpy(out, &o, sizeof o);
}

/* isa_vnni512_q8_0_rows4() with int8 x (Q8_0A8; dqp: d of x's block b,
 * zeros past k / 32 to a multiple of 16). */
static ISA_VNNI512 void isa_vnni512_q8_0a8_rows4(const unsigned char *const row[4], const int8_t *xq,
                                               const float *dqp, const int32_t *corr, int64_t k, float out[4],
                                               WStream *ws)
{
    isa_vnni512_q8_0_rows4(1, row, xq, dqp, corr, k, out, ws);
}

/* W8 rows (A16; {f32 s; i8 q[k]}: one scale per row) with vpdpbusd, x as
 * one integer vector: xi = rint(x 2^-e), one power of two for the op with
 * max|x| 2^-e in [2^29, 2^30), so x is exact where |x| >= max|x| 2^-7 (a
 * float there is a multiple of 2^e already) and off by at most max|x|
 * 2^-31 elsewhere (the Q8_0 rows' planes: max|x_b| 2^-23 per element of
 * each block, which is coarser unless the block is 2^8 below the vector's
 * largest); xi cut into four signed byte planes (X3 in [-64, 64]), plane p
 * at xq + p k. The weights made unsigned (q ^ 0x80 = q + 128) meet each
 * plane with vpdpbusd into a 32-bit accumulator of its own: no shifts, and
 * no conversion before the row's end (the row has one scale and x one),
 * where the four sums less 128 sum(X_p) are combined in 64-bit integers:
 * the dot product of q and xi exactly, then one rounding to float. A
 * lane sums k / 16 products of at most 255 * 128 per plane: < 2^31 for k
 * <= QFAST_K_MAX. 5 vector ops per 64 weights of a row where three
 * planes per block took 9: from L2 on one Zen 4 core 34.4 -> 39.7 GB/s at
 * k 576, 32.8 -> 42.0 at 1536 (35.8 -> 40.9 with 0.8 MB); against one
 * outlier 10^4 times the rest a scale per block of 32 does worse (2^-23
 * of the outlier over 32 elements, where this is 2^-31 of it over k <
 * 2^8 32). */
static ISA_VNNI512 int isa_vnni512_w8x_prepare(const float *x, int64_t k, int8_t *xq, int64_t corr[4], double *u)
{
    float amax;
    if (!x_integer_ok(x, k, &amax))
        return 0;
    int ex = 0;
    if (amax > 0)
        frexpf(amax, &ex); /* amax = f 2^ex, f in [0.5, 1); ex > -64 (x_integer_ok) */
    float sc = amax > 0 ? ldexpf(1.0f, 30 - ex) : 0.0f;
    *u = amax > 0 ? ldexp(1.0, ex - 30) : 0.0;
    v16i32 c[4] = {{0}, {0}, {0}, {0}};
    for (int64_t j = 0; j < k; j += 16) {
        v16f f = LOAD16(x + j) * sc, r = (f + 12582912.0f) - 12582912.0f; /* nearest (|f| <= 2^22) */
        v16i32 fi = __builtin_convertvector(f, v16i32), small = (fi < 4194304) & (fi > -4194304);
        /* past 2^22 f is a multiple of 0.5: truncated, it is off by at most 0.5 too */
        v16i32 xi = (__builtin_convertvector(r, v16i32) & small) | (fi & ~small);
        v16i32 pl[4];
        isa_vnni512_byte_planes(xi, 4, pl);
        UNROLL4
        for (int p = 0; p < 4; p++) {
            *(v16s8a1 *)(xq + p * k + j) = __builtin_convertvector(pl[p], v16s8);
            c[p] += pl[p];
        }
    }
    for (int p = 0; p < 4; p++) {
        int64_t sum = 0;
        for (int i = 0; i < 16; i++)
            sum += c[p][i];
        corr[p] = 128 * sum;
    }
    return 1;
}

/* Sums of the 16 lanes of each v[n] into out[n] (a transposing tree: 45
 * vector ops for the 16, where a reduction each takes 8). */
static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_hsum16x16(const v16i32 v[16],
                                                                                 int32_t out[16])
{
    v16i32 w[8], y[4], z[2];
    UNROLL4
    for (int n = 0; n < 8; n++) /* w[n]: v[2n]'s 8 partial sums, then v[2n + 1]'s */
        w[n] = __builtin_shufflevector(v[2 * n], v[2 * n + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(v[2 * n], v[2 * n + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                                       30, 31);
    UNROLL4
    for (int n = 0; n < 4; n++) /* y[n]: four each of v[4n..4n + 3] */
        y[n] = __builtin_shufflevector(w[2 * n], w[2 * n + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(w[2 * n], w[2 * n + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                       31);
    UNROLL4
    for (int n = 0; n < 2; n++) /* z[n]: two each of v[8n..8n + 7] */
        z[n] = __builtin_shufflevector(y[2 * n], y[2 * n + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(y[2 * n], y[2 * n + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                                       31);
    v16i32 f = __builtin_shufflevector(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
               __builtin_shufflevector(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    memcpy(out, &f, sizeof f);
}

/* Four W8 rows against x's four planes (corr[p]: 128 sum(X_p), u: x's
 * scale), k % 64 == 0. */
static ISA_VNNI512 void isa_vnni512_w8x_rows4(const unsigned char *const row[4], const int8_t *xq,
                                             const int64_t corr[4], double u, int64_t k, float out[4], WStream *ws)
{
    v16i32 acc[16]; /* acc[4 i + p]: row i's sums of (q + 128) X_p */
    UNROLL4
    for (int n = 0; n < 16; n++)
        acc[n] = (v16i32){0};
    for (int64_t j = 0; j < k; j += 64) {
        if (ws)
            ws_trickle(ws, 4 * 64);
        v16u32 xp[4];
        UNROLL4
        for (int p = 0; p < 4; p++)
            xp[p] = *(const v16u32u *)(xq + p * k + j);
        UNROLL4
        for (int i = 0; i < 4; i++) {
            v16u32 q = *(const v16u32u *)(row[i] + 4 + j) ^ 0x80808080u;
            UNROLL4
            for (int p = 0; p < 4; p++)
                acc[4 * i + p] = isa_vnni512_dot(acc[4 * i + p], q, xp[p]);
        }
    }
    int32_t sums[16];
    isa_vnni512_hsum16x16(acc, sums);
    UNROLL4
    for (int i = 0; i < 4; i++) {
        int64_t dot = 0;
        UNROLL4
        for (int p = 0; p < 4; p++)
            dot += ((int64_t)sums[4 * i + p] - corr[p]) * ((int64_t)1 << (8 * p));
        float s;
        memcpy(&s, row[i], 4);
        out[i] = (float)((double)dot * u * (double)s);
    }
}

/* gemv_quant() for Q8_0 and W8 rows of k % 64 == 0 with vpdpbusd; 0
 * (nothing done) where x_integer_ok() is not. */
static ISA_VNNI512 int isa_vnni512_gemv_q8x(int t, const GemvSeg *sg, int ns, const float *x, int64_t k)
{
    int w8 = t == DT_W8;
    int8_t xq[(w8 ? 4 : 3) * k] __attribute__((aligned(64)));
    float ub[w8 ? 1 : k / 32 + 16];
    int32_t corr[w8 ? 1 : k / 4];
    int64_t corr4[4];
    double u = 0;
    if (w8 ? !isa_vnni512_w8x_prepare(x, k, xq, corr4, &u) : !isa_vnni512_q8x_prepare(x, k, xq, ub, corr))
        return 0;
    for (int64_t b = k / 32; !w8 && b < k / 32 + 16; b++)
        ub[b] = 0.0f;
    int64_t rb = qrow_bytes(t, k);
    for (int i = 0; i < ns; i++) {
        const GemvSeg *g = &sg[i];
        /* asks at every k, as the A8 rows (at k 576, WS_TRICKLE_K ran
         * 0.93-0.97x at a 60-65 GB/s ceiling, 1.0-1.05x at 37) */
        if (w8)
            SEG_QUADS(g, rb, k, 0, KT_TUNE_FAR_QUADS, row, out, ws, isfar_,
                      isa_vnni512_w8x_rows4(row, xq, corr4, u, k, out, ws));
        else
            SEG_QUADS(g, rb, k, 0, KT_TUNE_FAR_QUADS, row, out, ws, isfar_,
                      isa_vnni512_q8_0_rows4(3, row, xq, ub, corr, k, out, ws));
    }
    return 1;
}

/* W4A8G*, k % 32 == 0: groups of gs, the last one k % gs long. */
static ISA_VNNI512 void isa_vnni512_w4a8_rows4(int64_t gs, const unsigned char *const row[4], const int8_t *xq,
                                              const float *dq, const float *dsx, int64_t k, float out[4])
{
    const unsigned char *w[4] = {row[0], row[1], row[2], row[3]};
    v16f acc = {0};
    v4f off = {0};
    for (int64_t j = 0, g = 0; j < k; j += gs, g++) {
        int64_t nb = (k - j < gs ? k - j : gs) / 32;
        v4u16 h;
        v4f z;
        UNROLL4
        for (int i = 0; i < 4; i++) {
            h[i] = (uint16_t)(w[i][0] | w[i][1] << 8);
            z[i] = (float)w[i][2];
        }
        v4f s = __builtin_ia32_vcvtph2ps((v8i16){(short)h[0], (short)h[1], (short)h[2], (short)h[3]});
        off += s * z * dsx[g];
        v16f ga = {0};
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *xb = xq + j + 32 * b;
            v4u32 l = *(const v4u32u_a *)xb, u = *(const v4u32u_a *)(xb + 16);
            v16u32 xl = __builtin_shufflevector(l, l, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
            v16u32 xh = __builtin_shufflevector(u, u, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
            v16u32 q = isa_vnni512_rows4_chunk(w, 4 + 16 * b);
            v16i32 p = isa_vnni512_dot((v16i32){0}, q & 0x0f0f0f0fu, xl);
            p = isa_vnni512_dot(p, (q >> 4) & 0x0f0f0f0fu, xh);
            ga += __builtin_convertvector(p, v16f) * dq[j / 32 + b];
        }
        acc += ga * __builtin_shufflevector(s, s, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        UNROLL4
        for (int i = 0; i < 4; i++)
            w[i] += 4 + 16 * nb;
    }
    UNROLL4
    for (int i = 0; i < 4; i++)
        out[i] = (acc[4 * i] + acc[4 * i + 1]) + (acc[4 * i + 2] + acc[4 * i + 3]) - off[i];
}

/* W4A8G64 and W4A8G128 rows, k % 32 == 0, a row at a time within the
 * four (x shared): a superblock's 128 weights - one W4G128 record's
 * nibbles, or two W4G64 records' - as one vector in the records' own
 * chunk order (Q4_0's: byte 16c + i holds elements 32c + i and
 * 32c + 16 + i), against x's halves of the same chunks (w4ga8_x_prepare:
 * per superblock the first 16 int8 of each chunk, then the last 16), two
 * u8 x s8 dot products; lane 4c + l's sum scaled by chunk c's d times its
 * group's s, and s z times the group's sum of x (dsx) taken off at the
 * end. isa_vnni512_w4a8_rows4 (still W4A8G32's where its rows are not
 * packed) gathers four rows' 16 bytes into a vector per block of 32, about
 * 15 vector ops per 64 bytes of nibbles where this takes 9: on the Xeon
 * host, `megac bench --versus` both ways round, SmolLM2-135M with
 * W4A8-g128 everywhere 1.13-1.15x (0.60 -> 0.70 of the ceiling) and
 * Llama-3.2-1B's shape 1.16-1.17x (0.68 -> 0.81, from memory). The main
 * loop takes whole superblocks (constants: the first try, with the short
 * last one's copies inside it, spilled and ran at 0.73x); the last may hold
 * 1-3 chunks (zeros past them, in x too). */
static inline __attribute__((always_inline)) ISA_VNNI512 v16u32 isa_vnni512_w4g_nib(int64_t gs,
                                                                                 const unsigned char *row,
                                                                                 int64_t sb, int nc)
{
    if (gs == 128) {
        const unsigned char *p = row + 68 * sb + 4;
        if (nc == 4)
            return *(const v16u32u *)p;
        v16u32 v = {0};
        memcpy(&v, p, (size_t)(16 * nc));
        return v;
    }
    const unsigned char *p = row + 72 * sb + 4; /* two records of 36 bytes */
    v8u32 a = {0}, b = {0};
    memcpy(&a, p, nc >= 2 ? 32 : 16);
    if (nc > 2)
        memcpy(&b, p + 36, nc == 4 ? 32 : 16);
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

#define W4GA8_ROWS(pre, attr, hi4)                                                                              \
    /* superblock sb of the four rows, nc of its chunks (a constant) */                                        \
    static inline __attribute__((always_inline)) attr void pre##_w4ga8_sb(                                    \
        int64_t gs, int nc, const unsigned char *const row[4], int64_t sb, const int8_t *xs, const float *d16, \
        const float *dsx, v16f acc[4], v4f *off)                                                               \
    {                                                                                                          \
        int64_t sbb = gs == 128 ? 68 : 72;                                                                     \
        v16u32 xl = *(const v16u32 *)(xs + 128 * sb), xh = *(const v16u32 *)(xs + 128 * sb + 64);              \
        v16f d = *(const v16f *)(d16 + 16 * sb);                                                               \
        /* each row's group scales (f16) and zeros: g128 one group, g64 up to two */                         \
        v8i16 h = {0};                                                                                         \
        v4f z0, z1 = {0};                                                                                      \
        UNROLL4                                                                                                \
        for (int i = 0; i < 4; i++) {                                                                          \
            const unsigned char *r = row[i] + sbb * sb;                                                        \
            uint16_t hv;                                                                                       \
            memcpy(&hv, r, 2);                                                                                 \
            h[i] = (short)hv;                                                                                  \
            z0[i] = (float)r[2];                                                                               \
            if (gs == 64 && nc > 2) {                                                                          \
                memcpy(&hv, r + 36, 2);                                                                        \
                h[4 + i] = (short)hv;                                                                          \
                z1[i] = (float)r[38];                                                                          \
            }                                                                                                  \
        }                                                                                                      \
        v8f sc = __builtin_ia32_vcvtph2ps256(h);                                                               \
        v4f s0 = __builtin_shufflevector(sc, sc, 0, 1, 2, 3), s1 = __builtin_shufflevector(sc, sc, 4, 5, 6, 7); \
        int64_t g = gs == 128 ? sb : 2 * sb;                                                                   \
        *off += s0 * z0 * dsx[g];                                                                              \
        if (gs == 64 && nc > 2)                                                                                \
            *off += s1 * z1 * dsx[g + 1];                                                                      \
        UNROLL4                                                                                                \
        for (int i = 0; i < 4; i++) {                                                                          \
            v16u32 v = isa_vnni512_w4g_nib(gs, row[i], sb, nc);                                                \
            v16i32 p = isa_vnni512_dot((v16i32){0}, v & 0x0f0f0f0fu, xl);                                      \
            p = isa_vnni512_dot(p, hi4(v), xh);                                                                \
            v16f sv = gs == 128 ? (v16f){0} + s0[i]                                                            \
                                : (v16f){s0[i], s0[i], s0[i], s0[i], s0[i], s0[i], s0[i], s0[i],               \
                                         s1[i], s1[i], s1[i], s1[i], s1[i], s1[i], s1[i], s1[i]};              \
            acc[i] += __builtin_convertvector(p, v16f) * (d * sv);                                             \
        }                                                                                                      \
    }                                                                                                          \
    static inline __attribute__((always_inline)) attr void pre##_w4ga8_quad(                                  \
        int64_t gs, const unsigned char *const row[4], const int8_t *xs, const float *d16, const float *dsx,   \
        int64_t k, float out[4], WStream *ws)                                                                  \
    {                                                                                                          \
        int64_t nsb = k / 128, sbb = gs == 128 ? 68 : 72;                                                      \
        v16f acc[4] = {{0}, {0}, {0}, {0}};                                                                    \
        v4f off = {0};                                                                                         \
        for (int64_t sb = 0; sb < nsb; sb++) {                                                                 \
            if (ws)                                                                                            \
                ws_trickle(ws, 4 * sbb);                                                                       \
            pre##_w4ga8_sb(gs, 4, row, sb, xs, d16, dsx, acc, &off);                                           \
        }                                                                                                      \
        switch (k % 128 / 32) { /* the short last superblock */                                               \
        case 1: pre##_w4ga8_sb(gs, 1, row, nsb, xs, d16, dsx, acc, &off); break;                               \
        case 2: pre##_w4ga8_sb(gs, 2, row, nsb, xs, d16, dsx, acc, &off); break;                               \
        case 3: pre##_w4ga8_sb(gs, 3, row, nsb, xs, d16, dsx, acc, &off); break;                               \
        }                                                                                                      \
        UNROLL4                                                                                                \
        for (int i = 0; i < 4; i++)                                                                            \
            out[i] = hsum16(&acc[i]) - off[i];                                                                 \
    }                                                                                                          \
    static attr void pre##_w4ga8_rows4(int64_t gs, const unsigned char *const row[4], const int8_t *xs,        \
                                       const float *d16, const float *dsx, int64_t k, float out[4], WStream *ws) \
    {                                                                                                          \
        if (gs == 128)                                                                                         \
            pre##_w4ga8_quad(128, row, xs, d16, dsx, k, out, ws);                                              \
        else                                                                                                   \
            pre##_w4ga8_quad(64, row, xs, d16, dsx, k, out, ws);                                               \
    }
#define W4GA8_HI_SHIFT(v) (((v) >> 4) & 0x0f0f0f0fu)
W4GA8_ROWS(isa_vnni512, ISA_VNNI512, W4GA8_HI_SHIFT)
W4GA8_ROWS(isa_gfni512, ISA_GFNI512, isa_gfni512_hi)

/* x for the rows above: per superblock sb of 128 elements, xs[128 sb:]
 * holds the first 16 int8 of each of its four chunks of 32, then the last
 * 16 of each, and d16[16 sb:] each chunk's d four times; zeros past k. */
static void w4ga8_x_prepare(const int8_t *xq, const float *dq, int64_t k, int8_t *xs, float *d16)
{
    int64_t nsb = (k + 127) / 128;
    for (int64_t c = 0; c < 4 * nsb; c++) {
        int8_t *o = xs + 128 * (c / 4) + 16 * (c % 4);
        for (int j = 0; j < 16; j++) {
            o[j] = 32 * c < k ? xq[32 * c + j] : 0;
            o[64 + j] = 32 * c < k ? xq[32 * c + 16 + j] : 0;
        }
        for (int l = 0; l < 4; l++)
            d16[4 * c + l] = 32 * c < k ? dq[c] : 0.0f;
    }
}

/* ---- int8 activations on 256 bits (KT_ISA_AVX2, KT_ISA_AVXVNNI) ----
 * The same kernels at half width: a block's u8 x s8 products go through
 * vpdpbusd on AVX-VNNI, else vpmaddubsw + vpmaddwd (pairs of products
 * saturate at 16 bits: nibbles are <= 15, and W8A8 takes the sign of q
 * over to xq so that the unsigned side is |q| <= 127, as llama.cpp does).
 * W4A8G64/G128: a row's chunks (16 bytes, 32 weights) two to a vector,
 * against xq and dq rearranged to match (a8_pair_prepare), the rows one
 * after another (one sequential stream, as the A16 rows on these
 * targets), their horizontal sums together at the end. */

#define ISA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ISA_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

typedef int32_t v8i32 __attribute__((vector_size(32)));
typedef char v32c __attribute__((vector_size(32)));
typedef float v8fl __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) ISA_AVX2 v8i32 isa_avx2_dot(v8i32 acc, v8u32 u, v8u32 s)
{
    const v16i16 ones = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    v16i16 p = __builtin_ia32_pmaddubsw256((v32c)u, (v32c)s);
    return acc + __builtin_ia32_pmaddwd256(p, ones);
}

static inline __attribute__((always_inline)) ISA_AVXVNNI v8i32 isa_avxvnni_dot(v8i32 acc, v8u32 u, v8u32 s)
{
    return __builtin_ia32_vpdpbusd256(acc, (v8i32)u, (v8i32)s);
}

/* dot2(acc, u1, s1, u2, s2): acc plus, per 32-bit lane, the eight
 * products of u1 x s1 and u2 x s2 (u8 x s8), where u1 and u2 are the low and high nibbles of
 * the same lanes, so one block: on AVX2 two vpmaddubsw summed as i16
 * (|sum| <= 4 * 15 * 128) and one vpmaddwd (on Zen 3 the multiplies share
 * two pipes with the FMAs, conversions and shifts, so a vpmaddwd per
 * vpmaddubsw cost as much as the products); on AVX-VNNI two vpdpbusd. */
#define A8_DOT2_AVX2(acc, u1, s1, u2, s2)                                                                   \
    ((acc) + __builtin_ia32_pmaddwd256(__builtin_ia32_pmaddubsw256((v32c)(u1), (v32c)(s1)) +                   \
                                           __builtin_ia32_pmaddubsw256((v32c)(u2), (v32c)(s2)),                \
                                       (v16i16){1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}))
#define A8_DOT2_AVXVNNI(acc, u1, s1, u2, s2)                                                                \
    __builtin_ia32_vpdpbusd256(__builtin_ia32_vpdpbusd256((acc), (v8i32)(u1), (v8i32)(s1)), (v8i32)(u2),      \
                               (v8i32)(s2))
/* The f16 at p by vcvtph2ps (f16_at converts in software: a dozen scalar
 * ops and a branch per block). */
static inline __attribute__((always_inline)) float hsum8(const v8fl *p)
{
    v8fl v = *p;
    v4f h = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
    return (h[0] + h[2]) + (h[1] + h[3]);
}

typedef int8_t v8i8 __attribute__((vector_size(8)));

/* 32 IQ4 nibbles (qs, Q4_0's order) against x: sum kv[n] x, by vpshufb
 * from the 16 values as int8 (a 32-byte lookup for the 32 weights), then
 * widened to floats 8 at a time. */
/* The 32 values of an IQ4 block's 16 bytes of nibbles qs as int8, in
 * element order (a byte's low nibble is element j, its high one j + 16),
 * by one vpshufb. */
/* iq4_values in both 16-byte lanes: vpshufb's table (a constant once
 * inlined; a pointer out, as v32c values change the portable ABI). */
static inline __attribute__((always_inline)) void iq4_table32(v32c *out)
{
    v16i8 t = *(const v16i8 *)iq4_values;
    *out = (v32c)__builtin_shufflevector(t, t, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5,
                                         6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

static inline __attribute__((always_inline)) ISA_AVX2 v32c isa_avx2_iq4_values(const unsigned char *qs)
{
    v32c kv;
    iq4_table32(&kv);
    v16u8 q = *(const v16u8 *)qs, lo = q & 15, hi = q >> 4;
    v32c n = (v32c)__builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                           19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
    return __builtin_ia32_pshufb256(kv, n);
}

static inline __attribute__((always_inline)) ISA_AVX2 v8fl isa_avx2_iq4_block(const unsigned char *qs, const float *x)
{
    v32c w = isa_avx2_iq4_values(qs);
    v8fl s = {0}, xv;
#define IQ4_EIGHT(c)                                                                                         \
    do {                                                                                                     \
        v8i8 w8 = __builtin_shufflevector(w, w, 8 * (c), 8 * (c) + 1, 8 * (c) + 2, 8 * (c) + 3, 8 * (c) + 4,  \
                                          8 * (c) + 5, 8 * (c) + 6, 8 * (c) + 7);                            \
        memcpy(&xv, x + 8 * (c), sizeof xv);                                                                 \
        s += __builtin_convertvector(w8, v8fl) * xv;                                                         \
    } while (0)
    IQ4_EIGHT(0);
    IQ4_EIGHT(1);
    IQ4_EIGHT(2);
    IQ4_EIGHT(3);
#undef IQ4_EIGHT
    return s;
}

/* An IQ4_NL or IQ4_XS row on AVX2 (isa_avx512_dot_iq4's sums, the
 * scale applied to each block's). */
static ISA_AVX2 float isa_avx2_dot_iq4(int t, const unsigned char *b, const float *x, int64_t k)
{
    v8fl acc = {0};
    if (t == DT_IQ4_NL) {
        for (int64_t j = 0; j < k; j += 32) {
            const unsigned char *d, *qs = iq4nl_block(b, k, j / 32, &d);
            acc += isa_f16c_at(d) * isa_avx2_iq4_block(qs, x + j);
        }
    } else {
        for (int64_t j = 0; j < k; j += 256, b += 136) {
            float sc[8];
            iq4xs_scales8(b, isa_f16c_at(b), sc);
            for (int s = 0; s < 8; s++)
                acc += sc[s] * isa_avx2_iq4_block(b + 8 + 16 * s, x + j + 32 * s);
        }
    }
    return hsum8(&acc);
}

/* isa_avx512_dot_q23k on AVX2: 8-entry tables (vpermps reads 3 bits of
 * an index: Q3_K's q exactly, Q2_K's repeated twice), 8 weights a lookup. */
static ISA_AVX2 float isa_avx2_dot_q23k(int t, const unsigned char *b, const float *x, int64_t k)
{
    const v8fl q3v = {-4, -3, -2, -1, 0, 1, 2, 3}, q2v = {0, 1, 2, 3, 0, 1, 2, 3};
    int q3 = t == DT_Q3_K;
    v8fl acc0 = {0}, acc1 = {0};
    for (int64_t j = 0; j < k; j += 256, b += q3 ? 110 : 84) {
        const unsigned char *qs = b + (q3 ? 32 : 16);
        float dsc[16], dm[16], d = isa_f16c_at(b + (q3 ? 108 : 80)), dmin = q3 ? 0.0f : isa_f16c_at(b + 82);
        for (int s = 0; s < 16; s++) {
            dsc[s] = d * (float)(q3 ? q3k_scale(b + 96, s) : b[s] & 15);
            dm[s] = dmin * (float)(b[s] >> 4);
        }
        _Pragma("clang loop unroll(full)") for (int h = 0; h < 2; h++)
        _Pragma("clang loop unroll(full)") for (int e = 0; e < 4; e++) { /* 8 bytes of fields: lanes 8e.. */
            v8u8 q8, h8 = {0};
            memcpy(&q8, qs + 32 * h + 8 * e, 8);
            if (q3)
                memcpy(&h8, b + 8 * e, 8);
            v8u32 q = __builtin_convertvector(q8, v8u32), hm = __builtin_convertvector(h8, v8u32) << 2;
            UNROLL4
            for (int i = 0; i < 4; i++) {
                int s = 8 * h + 2 * i + e / 2;
                v8u32 idx = q >> (uint32_t)(2 * i);
                v8fl tab;
                if (q3) {
                    tab = dsc[s] * q3v;
                    idx = (idx & 3u) | (hm >> (uint32_t)(4 * h + i) & 4u);
                } else {
                    v8fl dq = dsc[s] * q2v; /* two roundings, as the reference's */
                    tab = dq - dm[s];
                }
                v8fl w = __builtin_ia32_permvarsf256(tab, (v8i32)idx), xv;
                memcpy(&xv, x + j + 128 * h + 32 * i + 8 * e, sizeof xv);
                if (i % 2)
                    acc1 += w * xv;
                else
                    acc0 += w * xv;
            }
        }
    }
    acc0 += acc1;
    return hsum8(&acc0);
}

/* The sum of v's halves: four floats, for isa_avx2_sum4. */
static inline __attribute__((always_inline)) ISA_AVX2 v4f isa_avx2_halves(v8fl v)
{
    return __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
}

/* Four rows' sums: {sum of r[0], ..., sum of r[3]} (lane i: the four
 * floats of r[i]), with three horizontal adds. */
static inline __attribute__((always_inline)) ISA_AVX2 v4f isa_avx2_sum4(const v4f r[4])
{
    return __builtin_ia32_haddps(__builtin_ia32_haddps(r[0], r[1]), __builtin_ia32_haddps(r[2], r[3]));
}

/* {a0-a3, b0-b3, c0-c3, d0-d3, a4-a7, b4-b7, c4-c7, d4-d7} (sums of those
 * lanes): four dot products' lanes added as integers, so that one
 * conversion and one FMA scale them (the A8 rows of 8-bit and k-quant
 * weights), where each took a conversion, a broadcast of its scale and
 * an FMA. */
static inline __attribute__((always_inline)) ISA_AVX2 v8i32 isa_avx2_hsum4(v8i32 a, v8i32 b, v8i32 c, v8i32 d)
{
    return __builtin_ia32_phaddd256(__builtin_ia32_phaddd256(a, b), __builtin_ia32_phaddd256(c, d));
}

/* Four rows of 8-bit weights on 256 bits: Q8_0A8 (Q80 1: rows packed,
 * f16 d[nb] then i8 q[nb][32] (kernel_table.h), each block's sum scaled
 * by its d) or W8A8 (Q80 0: {f32 s; i8 q[k]}, the row scaled by s at the
 * end). b points 2 bytes before a block's 32 weights. Each row asks for
 * its lines before it where ws is given (gemv_a8_fast: from WS_TRICKLE_K,
 * always on Intel's cores; on the Xeon at --cpu alderlake, two workers,
 * ops of 960 rows of 576, from the L3 / memory: Q8_0A8 41.3 -> 49.0 /
 * 21.3 -> 26.0 GB/s, W8A8 42.2 -> 48.6 / 22.2 -> 26.7, the same from L2;
 * the W4A8G64/G128 rows below 33.1 -> 32.1 / 19.6 -> 20.9 and 33.4 ->
 * 34.2 / 19.6 -> 22.1, from L2 0.91x). */
#define A8_256_Q8_ROWS(pre, attr, dot, name, Q80)                                                            \
    static attr void pre##_##name##_rows4(const unsigned char *const row[4], const int8_t *xq, const float *dq, \
                                          int64_t k, float out[4], WStream *ws)                             \
    {                                                                                                       \
        _Pragma("clang loop unroll(disable)") for (int i = 0; i < 4; i++)                                   \
        {                                                                                                   \
            if (ws)                                                                                         \
                ws_trickle(ws, qrow_bytes((Q80) ? DT_Q8_0A8 : DT_W8A8, k));                                \
            v8fl acc = {0};                                                                                 \
            int64_t j = 0;                                                                                  \
            for (; j + 128 <= k; j += 128) { /* four blocks, their sums added as integers */               \
                v8i32 d[4];                                                                                 \
                v4u16 h = {0};                                                                              \
                UNROLL4                                                                                     \
                for (int e = 0; e < 4; e++) {                                                               \
                    v8u32 xv = *(const v8u32u_a *)(xq + j + 32 * e);                                        \
                    const unsigned char *b = row[i] + ((Q80) ? 2 * (k / 32) - 2 : 2) + j + 32 * e;         \
                    v8u32 q = *(const v8u32u_a *)(b + 2);                                                   \
                    v8u32 u = (v8u32)__builtin_ia32_psignb256((v32c)q, (v32c)q);                            \
                    v8u32 s = (v8u32)__builtin_ia32_psignb256((v32c)xv, (v32c)q);                           \
                    d[e] = dot((v8i32){0}, u, s);                                                           \
                }                                                                                           \
                if (Q80) /* the four blocks' scales, side by side */                                        \
                    memcpy(&h, row[i] + 2 * (j / 32), 8);                                                   \
                v4f sc;                                                                                     \
                memcpy(&sc, dq + j / 32, 16);                                                              \
                if (Q80)                                                                                    \
                    sc *= isa_avx2_f16x4(h);                                                                \
                acc += __builtin_convertvector(isa_avx2_hsum4(d[0], d[1], d[2], d[3]), v8fl) *               \
                       __builtin_shufflevector(sc, sc, 0, 1, 2, 3, 0, 1, 2, 3);                             \
            }                                                                                               \
            for (; j < k; j += 32) {                                                                        \
                v8u32 xv = *(const v8u32u_a *)(xq + j);                                                     \
                const unsigned char *b = row[i] + ((Q80) ? 2 * (k / 32) - 2 : 2) + j;                       \
                v8u32 q = *(const v8u32u_a *)(b + 2);                                                       \
                v8u32 u = (v8u32)__builtin_ia32_psignb256((v32c)q, (v32c)q);                                \
                v8u32 s = (v8u32)__builtin_ia32_psignb256((v32c)xv, (v32c)q);                               \
                float sc = (Q80) ? dq[j / 32] * isa_f16c_at(row[i] + 2 * (j / 32)) : dq[j / 32];            \
                acc += __builtin_convertvector(dot((v8i32){0}, u, s), v8fl) * sc;                           \
            }                                                                                               \
            float s = 1.0f;                                                                                 \
            if (!(Q80))                                                                                     \
                memcpy(&s, row[i], 4);                                                                      \
            out[i] = s * hsum8(&acc);                                                                       \
        }                                                                                                   \
    }

/* The 256-bit kernels, for dot = isa_avx2_dot and dot2 = A8_DOT2_AVX2, or
 * the AVX-VNNI ones. */
#define A8_256_KERNELS(pre, attr, dot, dot2)                                                                   \
    A8_256_Q8_ROWS(pre, attr, dot, q8_0a8, 1)                                                                  \
    A8_256_Q8_ROWS(pre, attr, dot, w8a8, 0)                                                                    \
    /* A pair of chunks at c (the second zeros unless two) against one \
     * pair of xq2 and dq8 (a8_pair_prepare) at xp and dp. */              \
    static inline __attribute__((always_inline)) attr v8fl pre##_w4a8_pair(const unsigned char *c, int two,     \
                                                                          const int8_t *xp, const float *dp)  \
    {                                                                                                          \
        const v8u32 m = {0x0f0f0f0fu, 0x0f0f0f0fu, 0x0f0f0f0fu, 0x0f0f0f0fu,                                   \
                         0x0f0f0f0fu, 0x0f0f0f0fu, 0x0f0f0f0fu, 0x0f0f0f0fu};                                  \
        v4u32 c0 = *(const v4u32u_a *)c, c1 = {0};                                                             \
        if (two)                                                                                               \
            c1 = *(const v4u32u_a *)(c + 16);                                                                  \
        v8u32 q = __builtin_shufflevector(c0, c1, 0, 1, 2, 3, 4, 5, 6, 7);                                     \
        v8i32 d = dot2((v8i32){0}, q & m, *(const v8u32 *)xp, (q >> 4) & m, *(const v8u32 *)(xp + 32));        \
        return __builtin_convertvector(d, v8fl) * *(const v8fl *)dp;                                           \
    }                                                                                                          \
    /* One row of groups of gs (a constant): whole groups, then a short \
     * one of the k % gs elements left. */                                 \
    static inline __attribute__((always_inline)) attr v4f pre##_w4a8_row(int64_t gs, const unsigned char *w,    \
                                                                        const int8_t *xq2, const float *dq8,   \
                                                                        const float *dsx, int64_t k, float *o) \
    {                                                                                                          \
        v8fl acc = {0};                                                                                        \
        float off = 0;                                                                                         \
        int64_t ng = k / gs, np = gs / 64, g = 0;                                                              \
        for (; g < ng; g++, w += 4 + gs / 2) {                                                                 \
            v8fl ga = pre##_w4a8_pair(w + 4, 1, xq2 + 64 * np * g, dq8 + 8 * np * g);                          \
            if (np == 2)                                                                                       \
                ga += pre##_w4a8_pair(w + 36, 1, xq2 + 64 * (2 * g + 1), dq8 + 8 * (2 * g + 1));               \
            float sg = isa_f16c_at(w);                                                                         \
            acc += sg * ga;                                                                                    \
            off += sg * (float)w[2] * dsx[g];                                                                  \
        }                                                                                                      \
        if (k % gs) {                                                                                          \
            int64_t nb = k % gs / 32;                                                                          \
            v8fl ga = {0};                                                                                     \
            for (int64_t b = 0; b < nb; b += 2)                                                                \
                ga += pre##_w4a8_pair(w + 4 + 16 * b, b + 1 < nb, xq2 + 64 * (np * g + b / 2),                 \
                                      dq8 + 8 * (np * g + b / 2));                                             \
            float sg = isa_f16c_at(w);                                                                         \
            acc += sg * ga;                                                                                    \
            off += sg * (float)w[2] * dsx[g];                                                                  \
        }                                                                                                      \
        *o = off;                                                                                              \
        return isa_avx2_halves(acc);                                                                           \
    }                                                                                                          \
    static attr void pre##_w4a8_rows4(int64_t gs, const unsigned char *const row[4], const int8_t *xq2,        \
                                      const float *dq8, const float *dsx, int64_t k, float out[4], WStream *ws) \
    {                                                                                                          \
        v4f r[4], off = {0};                                                                                   \
        _Pragma("clang loop unroll(disable)")                                                                  \
        for (int i = 0; i < 4; i++) {                                                                          \
            if (ws)                                                                                            \
                ws_trickle(ws, qrow_bytes(gs == 64 ? DT_W4A8G64 : DT_W4A8G128, k));                            \
            float o;                                                                                           \
            r[i] = gs == 64 ? pre##_w4a8_row(64, row[i], xq2, dq8, dsx, k, &o)                                 \
                            : pre##_w4a8_row(128, row[i], xq2, dq8, dsx, k, &o);                               \
            off[i] = o;                                                                                        \
        }                                                                                                      \
        v4f sum = isa_avx2_sum4(r) - off;                                                                      \
        memcpy(out, &sum, 16);                                                                                 \
    }

typedef uint32_t v8u32u __attribute__((vector_size(32), aligned(1)));
A8_256_KERNELS(isa_avx2, ISA_AVX2, isa_avx2_dot, A8_DOT2_AVX2)
A8_256_KERNELS(isa_avxvnni, ISA_AVXVNNI, isa_avxvnni_dot, A8_DOT2_AVXVNNI)

/* ---- A16 on 256 bits (KT_ISA_AVX2 without KT_ISA_AVX512) ----
 * The generic kernels above are written for 16-float vectors: on AVX2
 * each is two registers, four rows' accumulators and x take all sixteen,
 * and LLVM spills (W8A16 and Q8_0 ran at ~12 GB/s from L2 on Zen 3, the
 * packed 4-bit rows at 6-8, F32 at 80). These are the same sums at 8
 * floats: per 8 weights one widening load or mask, one conversion and one
 * FMA, and no spills. Except for W4G64/W4G128 they take a quad's rows one
 * after another (see isa_avx2_q8_0_rows4). */

typedef int8_t v8i8u __attribute__((vector_size(8), aligned(1)));
typedef float v8fu __attribute__((vector_size(32), aligned(4)));
#define LOAD8F(p) (*(const v8fu *)(p))
#define Q8_SEQ_OFF 1

/* 8 int8 at p as floats (vpmovsxbd, vcvtdq2ps). */
#define I8X8(p) __builtin_convertvector(*(const v8i8u *)(p), v8fl)

/* W8: {f32 s; i8 q[k]} per row, any k. The rows go one after another
 * (one sequential stream for the prefetchers, as for Q8_0 below), four
 * chains each. */
static ISA_AVX2 void isa_avx2_w8_rows4(const unsigned char *const row[4], const float *x, int64_t k, float out[4],
                                      WStream *ws)
{
#pragma clang loop unroll(disable)
    for (int i = 0; i < 4; i++) {
        const unsigned char *q = row[i] + 4;
        v8fl a[4] = {{0}, {0}, {0}, {0}};
        int64_t j = 0;
        if (ws)
            ws_trickle(ws, 4 + k);
        for (; j + 32 <= k; j += 32) {
            UNROLL4
            for (int c = 0; c < 4; c++)
                a[c] += I8X8(q + j + 8 * c) * LOAD8F(x + j + 8 * c);
        }
        a[0] = (a[0] + a[1]) + (a[2] + a[3]);
        float t = hsum8(&a[0]), s;
        for (; j < k; j++)
            t += (float)(int8_t)q[j] * x[j];
        memcpy(&s, row[i], 4);
        out[i] = s * t;
    }
}

/* Q8_0 (rows packed: f16 d[nb], then i8 q[nb][32]; kernel_table.h): a
 * block's four products
 * in one chain, then scaled by d into the row's sum (two blocks per step,
 * two sums). The four rows go one after another, not side by side:
 * the weights are then read as one sequential stream, which the hardware
 * prefetchers follow (Zen 3: SmolLM2-135M's Q8_0 file decoded 1.13-1.19x
 * faster than with the four rows' blocks interleaved, though the
 * interleaved loop, which loads each x once for four rows, computes
 * faster from L2: 17 against 13-15 GB/s on one core). */
static ISA_AVX2 void isa_avx2_q8_0_rows4(const unsigned char *const row[4], const float *x, int64_t k,
                                        float out[4], WStream *ws)
{
#pragma clang loop unroll(disable)
    for (int i = 0; i < 4; i++) {
        v8fl a0 = {0}, a1 = {0};
        int64_t nb = k / 32;
        const unsigned char *b = row[i] + 2 * nb;
        /* the row's scales, 8 at a time (the last reads up to 7 past them,
         * inside the integers: 34 nb >= 2 (nb - 1) + 16 bytes) */
        float sc[KT_PACK_K_MAX / 32 + 8];
        for (int64_t c = 0; c < nb; c += 8) {
            v8i16 h;
            memcpy(&h, row[i] + 2 * c, sizeof h);
            v8fl f = __builtin_ia32_vcvtph2ps256(h);
            memcpy(sc + c, &f, sizeof f);
        }
        if (ws)
            ws_trickle(ws, 34 * nb);
        for (int64_t j = 0, g = 0; j < k; j += 64, b += 64, g += 2) {
            v8fl t = I8X8(b) * LOAD8F(x + j);
            t += I8X8(b + 8) * LOAD8F(x + j + 8);
            t += I8X8(b + 16) * LOAD8F(x + j + 16);
            t += I8X8(b + 24) * LOAD8F(x + j + 24);
            a0 += sc[g] * t;
            if (j + 32 < k) {
                v8fl u = I8X8(b + 32) * LOAD8F(x + j + 32);
                u += I8X8(b + 40) * LOAD8F(x + j + 40);
                u += I8X8(b + 48) * LOAD8F(x + j + 48);
                u += I8X8(b + 56) * LOAD8F(x + j + 56);
                a1 += sc[g + 1] * u;
            }
        }
        a0 += a1;
        out[i] = hsum8(&a0);
    }
}

/* The 4-bit kernels' inner step on 256 bits: the 64 nibbles of v, nibble
 * n of each lane as v & (15 << 4n) (16^n times the weight; n = 7: v >>
 * 28), converted and met by x's 8 floats at x + xst n (prescaled by
 * 16^-n), the even n summed into *e and the odd into *o (two chains).
 * With q5, nibble n's fifth bit comes in as bit 4n + 4 of he (even n) or
 * ho (odd n), and as bit 4 of h7 for n = 7. */
static inline __attribute__((always_inline)) ISA_AVX2 void isa_avx2_nibs(v8u32 v, int q5, v8u32 he, v8u32 ho,
                                                                        v8u32 h7, const float *x, int xst, v8fl *e,
                                                                        v8fl *o)
{
    UNROLL4
    for (int n = 0; n < 8; n++) {
        v8u32 q = n == 7 ? v >> 28 : v & (0xfu << 4 * n);
        if (q5)
            q |= n == 7 ? h7 : (n % 2 ? ho : he) & (0x10u << 4 * n);
        v8fl f = __builtin_convertvector((v8i32)q, v8fl) * LOAD8F(x + xst * n);
        if (n % 2)
            *o += f;
        else
            *e += f;
    }
}

/* W4G64 and W4G128 records (nib_groups4 above; k % 32 == 0): byte b of
 * a 16-byte chunk holds weight b (low nibble) and b + 16 (high). A
 * 32-byte load holds two chunks, 64 weights, and is summed as the packed
 * rows' superblocks are (v & (15 << 4n) is 16^n times one weight per
 * lane; isa_avx2_pk_sb), against xq: per pair of chunks 64 floats,
 * nibble n's 8 at 8 n, lane L holding x[32 (L / 4) + 16 (n % 2) +
 * 4 (L % 4) + n / 2] / 16^n (n = 7: v >> 28, unscaled), zeros past k.
 * (Before, four rows went side by side, each byte widened with
 * vpmovzxbd and then split by a mask and a shift: two conversions and
 * two FMAs per widening; from L2 on Zen 3 the two ran within 5%.) */
static ISA_AVX2 void isa_avx2_nib_x_prepare(const float *x, int64_t k, float *xq)
{
    static const float sc[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
    int64_t nc = k / 32;
    /* chunk c, half h: a 4x4 transpose of x[32 c + 16 h:][4 l + m] into
     * nibble n = 2 m + h, lanes 4 (c % 2) + l */
    for (int64_t c = 0; c < nc; c++) {
        float *o = xq + 64 * (c / 2) + 4 * (c % 2);
        for (int h = 0; h < 2; h++) {
            v4f a, b, cc, d;
            memcpy(&a, x + 32 * c + 16 * h, 16);
            memcpy(&b, x + 32 * c + 16 * h + 4, 16);
            memcpy(&cc, x + 32 * c + 16 * h + 8, 16);
            memcpy(&d, x + 32 * c + 16 * h + 12, 16);
            v4f ab0 = __builtin_shufflevector(a, b, 0, 4, 1, 5), ab1 = __builtin_shufflevector(a, b, 2, 6, 3, 7);
            v4f cd0 = __builtin_shufflevector(cc, d, 0, 4, 1, 5), cd1 = __builtin_shufflevector(cc, d, 2, 6, 3, 7);
            v4f m[4] = {__builtin_shufflevector(ab0, cd0, 0, 1, 4, 5), __builtin_shufflevector(ab0, cd0, 2, 3, 6, 7),
                        __builtin_shufflevector(ab1, cd1, 0, 1, 4, 5), __builtin_shufflevector(ab1, cd1, 2, 3, 6, 7)};
            for (int mi = 0; mi < 4; mi++) {
                v4f v = m[mi] * sc[2 * mi + h];
                memcpy(o + 8 * (2 * mi + h), &v, 16);
            }
        }
    }
    if (nc % 2) /* the last pair's second chunk */
        for (int n = 0; n < 8; n++)
            memset(xq + 64 * (nc / 2) + 8 * n + 4, 0, 16);
}

/* Four W4G64 (gs 64) or W4G128 rows, one after another (one sequential
 * stream), their horizontal sums together at the end; xg holds x's group
 * sums (x_group_sums). */
static inline __attribute__((always_inline)) ISA_AVX2 void isa_avx2_nib_rows4(int t, const unsigned char *const row[4],
                                                                             const float *xq, const float *xg,
                                                                             int64_t k, float out[4])
{
    const int gs = t == DT_W4G64 ? 64 : 128, gp = gs / 64;
    int64_t ng = k / gs, rest = k % gs / 32; /* full groups; chunks in a last short one */
    v4f r[4], off = {0};
#pragma clang loop unroll(disable)
    for (int i = 0; i < 4; i++) {
        const unsigned char *w = row[i];
        v8fl acc = {0};
        float o = 0;
        for (int64_t g = 0; g < ng; g++, w += 4 + 32 * gp) {
            v8fl e = {0}, od = {0};
            UNROLL4
            for (int p = 0; p < gp; p++) {
                v8u32 v;
                memcpy(&v, w + 4 + 32 * p, 32);
                isa_avx2_nibs(v, 0, (v8u32){0}, (v8u32){0}, (v8u32){0}, xq + 64 * (gp * g + p), 8, &e, &od);
            }
            float sg = isa_f16c_at(w);
            acc += sg * (e + od);
            o += sg * (float)w[2] * xg[g];
        }
        if (rest) {
            v8fl e = {0}, od = {0};
            for (int64_t c = 0; c < rest; c += 2) {
                v8u32 v = {0};
                if (rest - c >= 2) /* (fixed sizes: a call to memcpy otherwise) */
                    memcpy(&v, w + 4 + 16 * c, 32);
                else
                    memcpy(&v, w + 4 + 16 * c, 16);
                isa_avx2_nibs(v, 0, (v8u32){0}, (v8u32){0}, (v8u32){0}, xq + 64 * (gp * ng + c / 2), 8, &e, &od);
            }
            float sg = isa_f16c_at(w);
            acc += sg * (e + od);
            o += sg * (float)w[2] * xg[ng];
        }
        r[i] = isa_avx2_halves(acc);
        off[i] = o;
    }
    v4f sum = isa_avx2_sum4(r) - off;
    memcpy(out, &sum, 16);
}

static int isa_avx2_gemv_nibq(int t, const GemvSeg *sg, int ns, const float *x, const float *xg, int64_t k);
static int isa_avxvnni_gemv_nibq(int t, const GemvSeg *sg, int ns, const float *x, const float *xg, int64_t k);

/* gemv_quant's W4G64/W4G128 rows on AVX2 (xg: x's group sums): against
 * x's planes, or in float where x_integer_ok() is not. */
static ISA_AVX2 void isa_avx2_gemv_nib(int t, const GemvSeg *sg, int ns, const float *x, const float *xg, int64_t k)
{
    if (Q256_PICK(gemv_nibq)(t, sg, ns, x, xg, k))
        return;
    float xq[64 * ((k / 32 + 1) / 2)] __attribute__((aligned(32)));
    isa_avx2_nib_x_prepare(x, k, xq);
    for (int i = 0; i < ns; i++) {
        if (t == DT_W4G64)
            quad_rows(isa_avx2_nib_rows4, DT_W4G64, &sg[i], xq, xg, k);
        else
            quad_rows(isa_avx2_nib_rows4, DT_W4G128, &sg[i], xq, xg, k);
    }
}

/* Packed 4-bit rows (kernel_table.h; the sums of pk_superblock above),
 * a row at a time: a superblock's 64 bytes are two 32-byte halves
 * (blocks 0-1, 2-3), and nibble n of a half's 8 lanes meets xp + 16 n +
 * 8 h. (Rows side by side share each x load, but read the weights as
 * short interleaved streams: on Zen 3 SmolLM2-135M's Q4_0 and Q4_1 files
 * decoded 1.06-1.13x faster a row at a time than two rows at a time, at
 * the same speed from L2.) */
static inline __attribute__((always_inline)) ISA_AVX2 void isa_avx2_pk_sb(int t, const unsigned char *w, int nblk,
                                                                         const float *xp, v4f xs4, v8fl *acc,
                                                                         v4f *off)
{
    int hdr = pk_hdr(t);
    v8u32 v[2];
    if (nblk == 4)
        memcpy(v, w + 4 * hdr, 64);
    else {
        v16u32 s;
        pk_load_short(w + hdr * nblk, nblk, &s);
        memcpy(v, &s, 64);
    }
    /* two chains per half (isa_avx2_nibs: odd and even nibbles): one chain of eight
     * dependent FMAs kept Zen 3 waiting on their latency */
    v8fl pc[2][2] = {{{0}}};
    int nh = nblk > 2 ? 2 : 1; /* a short superblock's second half may be empty */
    /* Q5_0/Q5_1: lane 4 b + j's fifth bits (block b's qh word q, bit e
     * for element e) moved next to its nibbles: bit 4 n + j of q to 4 n +
     * 4 (q << 4 - j), and for n = 7 (v >> 28) bit 28 + j to 4 */
    v8u32 hs[2] = {{0}}, h7[2] = {{0}};
    if (t == DT_Q5_0 || t == DT_Q5_1) {
        const unsigned char *qh = w + (t == DT_Q5_0 ? 2 : 4) * nblk;
        UNROLL4
        for (int h = 0; h < nh; h++) {
            uint32_t q0 = 0, q1 = 0;
            if (2 * h < nblk)
                memcpy(&q0, qh + 8 * h, 4);
            if (2 * h + 1 < nblk)
                memcpy(&q1, qh + 8 * h + 4, 4);
            v8u32 qv = {q0, q0, q0, q0, q1, q1, q1, q1};
            hs[h] = qv << (v8u32){4, 3, 2, 1, 4, 3, 2, 1};
            h7[h] = qv >> (v8u32){24, 25, 26, 27, 24, 25, 26, 27} & 0x10u;
        }
    }
    UNROLL4
    for (int h = 0; h < nh; h++)
        isa_avx2_nibs(v[h], t == DT_Q5_0 || t == DT_Q5_1, hs[h], hs[h], h7[h], xp + 8 * h, 16, &pc[h][0],
                      &pc[h][1]);
    v8fl p[2];
    UNROLL4
    for (int h = 0; h < 2; h++)
        p[h] = pc[h][0] + pc[h][1];
    v4f d = pk_f16x4(pk_u16x4(w, nblk));
    UNROLL4
    for (int h = 0; h < nh; h++) {
        *acc += (h ? __builtin_shufflevector(d, d, 2, 2, 2, 2, 3, 3, 3, 3)
                   : __builtin_shufflevector(d, d, 0, 0, 0, 0, 1, 1, 1, 1)) *
                p[h];
    }
    v4f c;
    if (t == DT_Q4_1 || t == DT_Q5_1)
        c = pk_f16x4(pk_u16x4(w + 2 * nblk, nblk));
    else if (t == DT_Q4_0 || t == DT_Q5_0)
        c = d;
    else
        c = -d * pk_z4(w + 2 * nblk, nblk);
    *off += c * xs4;
}

/* Four packed rows of k elements (k % 32 == 0) into out[4], one after
 * another; their horizontal sums together at the end (each row's own
 * reduction and store had taken a fifth of a 576-wide row's time). */
static inline __attribute__((always_inline)) ISA_AVX2 void isa_avx2_pk_rows4(int t, const unsigned char *const row[4],
                                                                            const float *xp, const float *xs,
                                                                            int64_t k, float out[4])
{
    int64_t nb = k / 32, sbb = 4 * (pk_hdr(t) + 16);
    float cs = t == DT_Q4_0 ? -8.0f : t == DT_Q5_0 ? -16.0f : 1.0f;
    v4f r[4];
#pragma clang loop unroll(disable)
    for (int i = 0; i < 4; i++) {
        v8fl acc = {0};
        v4f off = {0};
        int64_t s = 0;
        for (; s < nb / 4; s++)
            isa_avx2_pk_sb(t, row[i] + s * sbb, 4, xp + 128 * s, *(const v4f *)(xs + 4 * s), &acc, &off);
        /* the short superblock, its block count a constant (an empty
         * second half then costs nothing) */
        if (nb % 4 == 1)
            isa_avx2_pk_sb(t, row[i] + s * sbb, 1, xp + 128 * s, *(const v4f *)(xs + 4 * s), &acc, &off);
        else if (nb % 4 == 2)
            isa_avx2_pk_sb(t, row[i] + s * sbb, 2, xp + 128 * s, *(const v4f *)(xs + 4 * s), &acc, &off);
        else if (nb % 4 == 3)
            isa_avx2_pk_sb(t, row[i] + s * sbb, 3, xp + 128 * s, *(const v4f *)(xs + 4 * s), &acc, &off);
        r[i] = isa_avx2_halves(acc) + cs * off;
    }
    v4f o = isa_avx2_sum4(r);
    memcpy(out, &o, 16);
}

/* gemv_packed's rows on AVX2, from its xp and xs. */
static ISA_AVX2 void isa_avx2_gemv_packed(int t, const GemvSeg *sg, int ns, const float *xp, const float *xs, int64_t k)
{
    pk_segs(isa_avx2_pk_rows4, t, sg, ns, xp, xs, k);
}

/* Block x[0:32]'s planes (pl[0]: X2, the top; inv: cut_scales's) as isa_vnni512_block_cut
 * cuts them, in the packed rows' byte order or, with natural, in element
 * order (the k-quant and W4G64/W4G128 rows), with 8-lane ops (the 16-lane
 * generic code took ~100 more cycles per block than the float kernel's
 * x_prepare, a tenth of a 288-row GEMV's time at k = 1536): y = xi +
 * 0x808080 is in [0, 2^24), and byte p of y, less 128, is plane p of xi
 * (the same signed digits); packs put elements 8 m + i (i < 4) in dword m
 * of lane 0 and 8 m + 4 + i in lane 1, and a byte shuffle within lanes
 * turns dword m byte i into byte 4 i + m (a dword permutation puts them
 * back in element order). */
static inline __attribute__((always_inline)) ISA_AVX2 void isa_avx2_pkq_cut(const float *x, float inv, int natural,
                                                                           v32c pl[3])
{
    const v32c tr = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                     0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    v8u32 a[4];
    memcpy(a, x, 128);
    v8i32 y[4];
    UNROLL4
    for (int j = 0; j < 4; j++) /* nearest integer, ties to even (as isa_vnni512_pkq_cut) */
        y[j] = __builtin_ia32_cvtps2dq256((v8fl)a[j] * inv) + 0x808080;
    UNROLL4
    for (int p = 0; p < 3; p++) {
        v8i32 b[4];
        UNROLL4
        for (int j = 0; j < 4; j++)
            b[j] = p == 2 ? y[j] >> 16 : y[j] >> 8 * p & 0xff;
        v16i16 w01 = __builtin_ia32_packusdw256(b[0], b[1]), w23 = __builtin_ia32_packusdw256(b[2], b[3]);
        v32c v = __builtin_ia32_packuswb256(w01, w23);
        if (natural) /* dwords back in element order */
            v = (v32c)__builtin_ia32_permvarsi256((v8i32)v, (v8i32){0, 4, 1, 5, 2, 6, 3, 7});
        else
            v = __builtin_ia32_pshufb256(v, tr);
        pl[2 - p] = v ^ (char)0x80;
    }
}

/* The packed rows' planes of block x[0:32] at o (xq + 384 (blk / 4) + 16
 * (blk % 4)): 16 bytes of low-nibble order, 16 of high, per plane; with
 * natural, elements 0-15 and 16-31 (W4G64/W4G128 records' chunks). */
static inline __attribute__((always_inline)) ISA_AVX2 void isa_avx2_pkq_block(const float *x, float inv, int natural,
                                                                             int8_t *o)
{
    v32c pl[3];
    isa_avx2_pkq_cut(x, inv, natural, pl);
    UNROLL4
    for (int p = 0; p < 3; p++) { /* pl[0]: the top plane */
        memcpy(o + 128 * p, &pl[p], 16);
        memcpy(o + 128 * p + 64, (const char *)&pl[p] + 16, 16);
    }
}

/* isa_vnni512_pkq_x_prepare() with isa_avx2_pkq_block (natural: its order). */
static inline __attribute__((always_inline)) ISA_AVX2 int isa_avx2_pkq_x_prepare(const float *x, int64_t k, int natural,
                                                                                 int8_t *xq, float *ub)
{
    int64_t nb = k / 32, nsb = (nb + 3) / 4;
    if (!x_integer_ok(x, k, NULL))
        return 0;
    float inv[nb + 16] __attribute__((aligned(64)));
    cut_scales(x, nb, inv, ub);
    memset(xq + 384 * (nb / 4), 0, (size_t)(384 * (nsb - nb / 4)));
    for (int64_t blk = nb; blk < 4 * nsb; blk++)
        ub[blk] = 0.0f;
    for (int64_t blk = 0; blk < nb; blk++)
        isa_avx2_pkq_block(x + 32 * blk, inv[blk], natural, xq + 384 * (blk / 4) + 16 * (blk % 4));
    return 1;
}

/* Q4_K, Q5_K and Q6_K rows on AVX2: the generic kernels' sums
 * (kq4_superblock, kq6_superblock) at 8 floats (isa_avx2_nibs). Their
 * 64-byte loads are two 32-byte pieces, the generic layout's lane L
 * being lane L % 8 of piece L / 8, so xr and xs serve as they are. A
 * piece's lanes 0-3 and 4-7 are in one or two sub-blocks;
 * isa_avx2_pair() spreads their scales. */

/* {v[s] four times, v[s + 1] four times} */
static inline __attribute__((always_inline)) ISA_AVX2 v8fl isa_avx2_pair(v8fl v, int s)
{
    return __builtin_ia32_permvarsf256(v, (v8i32){s, s, s, s, s + 1, s + 1, s + 1, s + 1});
}

/* One Q4_K or Q5_K (q5) super-block b (xr: its 256 floats, xs: its 8
 * sub-block sums): chunk c's low nibbles are sub-block 2c, its high ones
 * 2c + 1. Q5_K's qh word of lane l (bytes 4l to 4l + 3) holds, shifted
 * right by 2c, sub-block 2c's fifth bits at 8m and 2c + 1's at 8m + 1
 * for the lane's byte m: moved to 4n + 4 for nibble n = 2m (even) or
 * 2m + 1 (odd). */
static inline __attribute__((always_inline)) ISA_AVX2 void isa_avx2_kq4_sb(int q5, const unsigned char *b,
                                                                          const float *xr, const float *xs,
                                                                          v8fl acc[4], v8fl *off)
{
    v8fs d, m;
    kq_scales(b, isa_f16c_at(b), isa_f16c_at(b + 2), &d, &m);
    *off += m * LOAD8F(xs);
    v8u32 qh = {0};
    if (q5)
        memcpy(&qh, b + 16, 32);
    UNROLL4
    for (int c = 0; c < 4; c++) {
        v8u32 v, hc = qh >> (uint32_t)(2 * c);
        memcpy(&v, b + (q5 ? 48 : 16) + 32 * c, 32);
        v8fl e = {0}, o = {0};
        isa_avx2_nibs(v, q5, hc << 4, hc << 7, hc >> 21 & 0x10u, xr + 128 * (c / 2) + 8 * (c % 2), 16, &e, &o);
        acc[c] += __builtin_ia32_permvarsf256(d, (v8i32){0} + 2 * c) * e +
                  __builtin_ia32_permvarsf256(d, (v8i32){0} + 2 * c + 1) * o;
    }
}

/* One Q6_K super-block b (xr: its 512 floats, xs: its 16 sub-block sums,
 * kq6_x_prepare): scaled sums into acc, the - 32 terms' d sum x into
 * *off. */
static inline __attribute__((always_inline)) ISA_AVX2 void isa_avx2_kq6_sb(const unsigned char *b, const float *xr,
                                                                          const float *xs, v8fl acc[4], v8fl *off)
{
    float dd = isa_f16c_at(b + 208);
    v8fl d[2] = {I8X8(b + 192) * dd, I8X8(b + 200) * dd}; /* sub-blocks 0-7, 8-15 */
    *off += d[0] * LOAD8F(xs) + d[1] * LOAD8F(xs + 8);
    /* ql: half h, piece p: sub-blocks 8 h + 2 p (+ 1) for even n, + 4 for odd */
    UNROLL4
    for (int h = 0; h < 2; h++) {
        UNROLL4
        for (int p = 0; p < 2; p++) {
            v8u32 v;
            memcpy(&v, b + 64 * h + 32 * p, 32);
            v8fl e = {0}, o = {0};
            isa_avx2_nibs(v, 0, (v8u32){0}, (v8u32){0}, (v8u32){0}, xr + 128 * h + 8 * p, 16, &e, &o);
            acc[2 * h + p] += isa_avx2_pair(d[h], 2 * p) * e + isa_avx2_pair(d[h], 2 * p + 4) * o;
        }
    }
    /* qh: piece p, pair i: bits 8 j + 2 i (j = 0-3) of each lane, sub-blocks
     * 8 p + 2 i (+ 1) */
    const float *xh = xr + 256;
    UNROLL4
    for (int p = 0; p < 2; p++) {
        v8u32 v;
        memcpy(&v, b + 128 + 32 * p, 32);
        UNROLL4
        for (int i = 0; i < 4; i++) {
            v8fl t = {0};
            UNROLL4
            for (int j = 0; j < 4; j++) {
                v8u32 q = i == 3 && j == 3 ? v >> 30 : v & (3u << (8 * j + 2 * i));
                t += __builtin_convertvector((v8i32)q, v8fl) * LOAD8F(xh + 16 * (4 * i + j) + 8 * p);
            }
            acc[i] += isa_avx2_pair(d[p], 2 * i) * t;
        }
    }
}

/* Four Q4_K, Q5_K or Q6_K rows of k (k % 256 == 0), one after another, their
 * horizontal sums together at the end. Four sums per row: one would chain
 * a super-block's 8 (Q4_K) or 12 (Q6_K) FMAs one after another. */
static inline __attribute__((always_inline)) ISA_AVX2 void isa_avx2_kq_rows4(int t, const unsigned char *const row[4],
                                                                            const float *xr, const float *xs,
                                                                            int64_t k, float out[4])
{
    int64_t bb = t == DT_Q4_K ? 144 : t == DT_Q5_K ? 176 : 210;
    v4f r[4];
#pragma clang loop unroll(disable)
    for (int i = 0; i < 4; i++) {
        v8fl a[4] = {{0}, {0}, {0}, {0}}, off = {0};
        for (int64_t s = 0; s < k / 256; s++) {
            if (t != DT_Q6_K)
                isa_avx2_kq4_sb(t == DT_Q5_K, row[i] + s * bb, xr + 256 * s, xs + 8 * s, a, &off);
            else
                isa_avx2_kq6_sb(row[i] + s * bb, xr + 512 * s, xs + 16 * s, a, &off);
        }
        v8fl acc = (a[0] + a[1]) + (a[2] + a[3]) - (t != DT_Q6_K ? 1.0f : 32.0f) * off;
        r[i] = isa_avx2_halves(acc);
    }
    v4f o = isa_avx2_sum4(r);
    memcpy(out, &o, 16);
}

/* gemv_kq's rows on AVX2, from its xr and xs. */
static ISA_AVX2 void isa_avx2_gemv_kq(int t, const GemvSeg *sg, int ns, const float *xr, const float *xs, int64_t k)
{
    kq_segs(isa_avx2_kq_rows4, t, sg, ns, xr, xs, k);
}

/* x's planes (isa_vnni512_kq_x_prepare's layout) and block scales for kq
 * rows of k (k % 256 == 0); 0 where x_integer_ok() is not. */
/* Where block blk of x goes for the kq rows with np planes: its first
 * plane's 32 bytes (the others 128 bytes apart). */
static int64_t kq_x_block_at(int q6, int np, int64_t blk)
{
    int j = (int)(blk % 4), part = q6 ? j / 2 : j % 2, half = q6 ? j % 2 : j / 2;
    return 128 * np * (blk / 4) + 64 * part + 32 * half;
}

static inline __attribute__((always_inline)) ISA_AVX2 int isa_avx2_kq_x_prepare(int q6, const float *x, int64_t k,
                                                                               int8_t *xq, float *ub)
{
    if (!x_integer_ok(x, k, NULL))
        return 0;
    float inv[k / 32 + 16] __attribute__((aligned(64)));
    cut_scales(x, k / 32, inv, ub);
    for (int64_t blk = 0; blk < k / 32; blk++) {
        int8_t *o = xq + kq_x_block_at(q6, 3, blk);
        v32c pl[3];
        isa_avx2_pkq_cut(x + 32 * blk, inv[blk], 1, pl);
        UNROLL4
        for (int p = 0; p < 3; p++)
            memcpy(o + 128 * p, &pl[p], 32);
    }
    return 1;
}

/* x for the A8 kq rows of layout l: xq's blocks where the A16 rows put
 * their top plane (kq_x_block_at with one plane) in xk, and xs the
 * sub-blocks' sums of d xq. */
static void kqa8_x_prepare(int l, const int8_t *xq, const float *dq, int64_t k, int8_t *xk, float *xs)
{
    int q6 = l == DT_Q6_K || l == DT_Q3_K || l == DT_Q2_K, n = q6 ? 16 : 32; /* sub-blocks of 16: Q6_K's layout */
    for (int64_t blk = 0; blk < k / 32; blk++)
        memcpy(xk + kq_x_block_at(q6, 1, blk), xq + 32 * blk, 32);
    for (int64_t s = 0; s < k / n; s++) {
        int32_t sum = 0;
        for (int j = 0; j < n; j++)
            sum += xq[n * s + j];
        xs[s] = dq[n * s / 32] * (float)sum;
    }
}

/* Q2_KA8 to Q6_KA8 rows (layout l) with vpdpbusd: the A16 rows'
 * loops with one plane, u the blocks' d (Zen 4, one core from L2: Q4_KA8
 * 18.0 GB/s against the AVX2 loops' 16.6-16.8, Q5_KA8 17.3-17.7 against
 * 16.2-16.7, Q6_KA8 20.8-21.3 against 21.2-21.3: the scales' unpacking,
 * not the products, bounds them). */
static ISA_VNNI512 void isa_vnni512_gemv_kqa8(int l, const GemvSeg *sg, int ns, const int8_t *xq, const float *dq,
                                              int64_t k)
{
    int8_t xk[k] __attribute__((aligned(64)));
    float xs[k / 16] __attribute__((aligned(32)));
    kqa8_x_prepare(l, xq, dq, k, xk, xs);
    for (int i = 0; i < ns; i++) {
        if (l == DT_Q4_K)
            isa_vnni512_kq_rows(DT_Q4_K, 1, &sg[i], xk, dq, xs, k);
        else if (l == DT_Q5_K)
            isa_vnni512_kq_rows(DT_Q5_K, 1, &sg[i], xk, dq, xs, k);
        else if (l == DT_Q3_K)
            isa_vnni512_kq_rows(DT_Q3_K, 1, &sg[i], xk, dq, xs, k);
        else if (l == DT_Q2_K)
            isa_vnni512_kq_rows(DT_Q2_K, 1, &sg[i], xk, dq, xs, k);
        else
            isa_vnni512_kq_rows(DT_Q6_K, 1, &sg[i], xk, dq, xs, k);
    }
}

/* The 256-bit rows with u8 x s8 products (packed 4- and 5-bit, W4G64 and
 * W4G128, the k-quants, A16 against x's planes and the k-quants' A8
 * forms): AVX2's, and AVX-VNNI's with vpdpbusd (kernel_q256.inc). From
 * L2 on one core of the Xeon (a Golden Cove, the Alder Lake P-core's
 * design) at --cpu alderlake, k 576 (the k-quants 768): docs/performance.md,
 * "AVX-VNNI and the 256-bit rows". */
#define Q256(name) isa_avx2_##name
#define Q256_ATTR ISA_AVX2
#define Q256_VNNI 0
#include "codegen/cpu/kernel_q256.inc"
#undef Q256
#undef Q256_ATTR
#undef Q256_VNNI
#define Q256(name) isa_avxvnni_##name
#define Q256_ATTR ISA_AVXVNNI
#define Q256_VNNI 1
#include "codegen/cpu/kernel_q256.inc"
#undef Q256
#undef Q256_ATTR
#undef Q256_VNNI

/* ---- Q8_0 and W8 rows against x's planes on AVX-VNNI ----
 * The AVX-512 VNNI kernels' sums (isa_vnni512_q8_0_rows4,
 * isa_vnni512_w8x_rows4) on 8 lanes, a row at a time (one sequential
 * stream, as the AVX2 float rows), each row asking for its lines before
 * it. Q8_0: a block of 32 is one vector, its weights made unsigned (q ^
 * 0x80 = q + 128) meet x's three planes of that block (23-bit fixed
 * point per block, cut as isa_avx2_pkq_cut cuts them for the packed
 * rows), the excess 128 (sum of the lane's four xi) taken off per lane
 * (corr), exact before one conversion and one FMA by d_b u_b per block,
 * where the float rows widened, converted and multiplied every weight.
 * W8: x as one 30-bit fixed point per op in four planes, each plane
 * summed into its own 32-bit accumulator (a lane: k / 8 products of at
 * most 255 * 128, < 2^31 for k <= QFAST_K_MAX), combined in 64-bit
 * integers at the row's end. */

typedef int8_t v8s8 __attribute__((vector_size(8)));

/* Q8_0: x's planes (plane p, the top first, at xq + p k, element
 * order), the blocks' u into ub and corr (8 lanes a block); 0 (nothing
 * done) where x_integer_ok() is not. k % 32 == 0. */
static ISA_AVXVNNI int isa_avxvnni_q8x_prepare(const float *x, int64_t k, int8_t *xq, float *ub, int32_t *corr)
{
    if (!x_integer_ok(x, k, NULL))
        return 0;
    const v8u32 ones = {0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u,
                        0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u};
    float inv[k / 32 + 16] __attribute__((aligned(64)));
    cut_scales(x, k / 32, inv, ub);
    for (int64_t blk = 0; blk < k / 32; blk++) {
        v32c pl[3];
        isa_avx2_pkq_cut(x + 32 * blk, inv[blk], 1, pl);
        UNROLL4
        for (int p = 0; p < 3; p++)
            memcpy(xq + p * k + 32 * blk, &pl[p], 32);
        v8i32 c = __builtin_ia32_vpdpbusd256((v8i32){0}, (v8i32)ones, (v8i32)pl[0]) << 8;
        c = __builtin_ia32_vpdpbusd256(c, (v8i32)ones, (v8i32)pl[1]) << 8;
        c = __builtin_ia32_vpdpbusd256(c, (v8i32)ones, (v8i32)pl[2]) << 7;
        memcpy(corr + 8 * blk, &c, 32);
    }
    return 1;
}

/* Segment g's Q8_0 rows (packed: f16 d[nb], then i8 q[nb][32]). */
static ISA_AVXVNNI void isa_avxvnni_q8x_rows(const GemvSeg *g, const int8_t *xq, const float *ub,
                                             const int32_t *corr, int64_t k)
{
    int64_t rb = qrow_bytes(DT_Q8_0, k), nb = k / 32;
    WStream *tws = seg_trickle(g, rb, k, 0);
    float sc[KT_PACK_K_MAX / 32 + 8] __attribute__((aligned(32)));
    for (int64_t r = g->r0; r < g->r1; r += 4) {
        const unsigned char *row[4];
        seg_quad(g, rb, r, row);
        v4f rs[4];
#pragma clang loop unroll(disable)
        for (int i = 0; i < 4; i++) {
            if (tws)
                ws_trickle(tws, rb);
            /* d_b u_b, 8 at a time (the last reads up to 7 scales past
             * nb, inside the weights; ub has 8 zeros past nb) */
            for (int64_t c = 0; c < nb; c += 8) {
                v8i16 h;
                memcpy(&h, row[i] + 2 * c, sizeof h);
                v8fl f = __builtin_ia32_vcvtph2ps256(h) * LOAD8F(ub + c);
                memcpy(sc + c, &f, sizeof f);
            }
            const unsigned char *q = row[i] + 2 * nb;
            v8fl acc[2] = {{0}, {0}};
            for (int64_t b = 0; b < nb; b++) {
                v8u32 u = *(const v8u32u *)(q + 32 * b) ^ 0x80808080u;
                v8i32 s = __builtin_ia32_vpdpbusd256((v8i32){0}, (v8i32)u, *(const v8i32 *)(xq + 32 * b)) << 8;
                s = __builtin_ia32_vpdpbusd256(s, (v8i32)u, *(const v8i32 *)(xq + k + 32 * b)) << 8;
                s = __builtin_ia32_vpdpbusd256(s, (v8i32)u, *(const v8i32 *)(xq + 2 * k + 32 * b)) -
                    *(const v8i32 *)(corr + 8 * b);
                acc[b & 1] += __builtin_convertvector(s, v8fl) * sc[b];
            }
            rs[i] = isa_avx2_halves(acc[0] + acc[1]);
        }
        v4f o = isa_avx2_sum4(rs);
        float out[4];
        memcpy(out, &o, 16);
        seg_quad_store(g, rb, r, out);
    }
}

/* W8: x as xi = rint(x 2^-e) (isa_vnni512_w8x_prepare's values) in four
 * signed byte planes at xq + p k, corr[p] = 128 sum(X_p), *u = 2^e. */
static ISA_AVXVNNI int isa_avxvnni_w8x_prepare(const float *x, int64_t k, int8_t *xq, int64_t corr[4], double *u)
{
    float amax;
    if (!x_integer_ok(x, k, &amax))
        return 0;
    int ex = 0;
    if (amax > 0)
        frexpf(amax, &ex);
    float sc = amax > 0 ? ldexpf(1.0f, 30 - ex) : 0.0f;
    *u = amax > 0 ? ldexp(1.0, ex - 30) : 0.0;
    v8i32 c[4] = {{0}, {0}, {0}, {0}};
    for (int64_t j = 0; j < k; j += 8) {
        v8fl f = LOAD8F(x + j) * sc, r = (f + 12582912.0f) - 12582912.0f; /* nearest (|f| <= 2^22) */
        v8i32 fi = __builtin_convertvector(f, v8i32), small = (fi < 4194304) & (fi > -4194304);
        v8i32 xi = (__builtin_convertvector(r, v8i32) & small) | (fi & ~small);
        UNROLL4
        for (int p = 0; p < 4; p++) {
            v8i32 pl = p < 3 ? (xi << 24) >> 24 : xi;
            xi = (xi - pl) >> 8;
            v8s8 b = __builtin_convertvector(pl, v8s8);
            memcpy(xq + p * k + j, &b, 8);
            c[p] += pl;
        }
    }
    for (int p = 0; p < 4; p++) {
        int64_t sum = 0;
        for (int i = 0; i < 8; i++)
            sum += c[p][i];
        corr[p] = 128 * sum;
    }
    return 1;
}

/* Segment g's W8 rows ({f32 s; i8 q[k]}). */
static ISA_AVXVNNI void isa_avxvnni_w8x_rows(const GemvSeg *g, const int8_t *xq, const int64_t corr[4], double u,
                                             int64_t k)
{
    int64_t rb = qrow_bytes(DT_W8, k);
    WStream *tws = seg_trickle(g, rb, k, 0);
    for (int64_t r = g->r0; r < g->r1; r += 4) {
        const unsigned char *row[4];
        seg_quad(g, rb, r, row);
        float out[4];
#pragma clang loop unroll(disable)
        for (int i = 0; i < 4; i++) {
            if (tws)
                ws_trickle(tws, rb);
            const unsigned char *q = row[i] + 4;
            v8i32 acc[4] = {{0}, {0}, {0}, {0}};
            for (int64_t j = 0; j < k; j += 32) {
                v8u32 w = *(const v8u32u *)(q + j) ^ 0x80808080u;
                UNROLL4
                for (int p = 0; p < 4; p++)
                    acc[p] = __builtin_ia32_vpdpbusd256(acc[p], (v8i32)w, *(const v8i32 *)(xq + p * k + j));
            }
            v8i32 h = isa_avx2_hsum4(acc[0], acc[1], acc[2], acc[3]); /* lane p, p + 4: plane p's halves */
            int64_t dot = 0;
            UNROLL4
            for (int p = 0; p < 4; p++)
                dot += ((int64_t)h[p] + h[p + 4] - corr[p]) * ((int64_t)1 << (8 * p));
            float s;
            memcpy(&s, row[i], 4);
            out[i] = (float)((double)dot * u * (double)s);
        }
        seg_quad_store(g, rb, r, out);
    }
}

/* gemv_quant() for Q8_0 and W8 rows of k % 32 == 0 on AVX-VNNI; 0
 * (nothing done) where x_integer_ok() is not. */
static ISA_AVXVNNI int isa_avxvnni_gemv_q8x(int t, const GemvSeg *sg, int ns, const float *x, int64_t k)
{
    int w8 = t == DT_W8;
    int8_t xq[(w8 ? 4 : 3) * k] __attribute__((aligned(32)));
    float ub[w8 ? 1 : k / 32 + 8] __attribute__((aligned(32)));
    int32_t corr[w8 ? 1 : k / 4] __attribute__((aligned(32)));
    int64_t corr4[4];
    double u = 0;
    if (w8 ? !isa_avxvnni_w8x_prepare(x, k, xq, corr4, &u) : !isa_avxvnni_q8x_prepare(x, k, xq, ub, corr))
        return 0;
    for (int64_t b = k / 32; !w8 && b < k / 32 + 8; b++)
        ub[b] = 0.0f;
    for (int i = 0; i < ns; i++) {
        if (w8)
            isa_avxvnni_w8x_rows(&sg[i], xq, corr4, u, k);
        else
            isa_avxvnni_q8x_rows(&sg[i], xq, ub, corr, k);
    }
    return 1;
}

/* ---- packed W4A8G32 rows (kernel_table.h: W4G32's packed order) ----
 * A group is a block of 32, so a superblock's 64 bytes of nibbles meet
 * the int8 inputs in two u8 x s8 dot products, one per nibble half:
 *   y = sum_b s_b dq_b (sum_j q_j xq_j) - sum_b s_b z_b (dq_b sum_j xq_j)
 * The integer sums are exact (|sum| <= 32 * 15 * 127); the float part
 * meets four blocks per vector. The inputs are reordered once per op
 * (pka8_x_prepare) so that no shuffle is left in the row loop: xqp holds
 * 128 bytes per superblock, the low-nibble half then the high one; byte
 * 4 l + m of half h is element 32 b + 8 m + 4 h + i of block b = l / 4
 * (i = l % 4): the element that nibble 2 m + h of lane l holds. One
 * loop serves AVX-512 VNNI and portable code through dot16 (four products
 * per 32-bit lane: vpdpbusd, or shifts and multiplies); the 256-bit rows
 * (AVX2, AVX-VNNI) are their own, below. */

typedef int8_t v32i8a1 __attribute__((vector_size(32), aligned(1)));

static void pka8_x_prepare(const int8_t *xq, const float *dq, int64_t k, int8_t *xqp, float *dq4, float *dx4)
{
    int64_t nb = k / 32, nsb = (nb + 3) / 4;
    memset(xqp, 0, (size_t)(128 * nsb));
    for (int64_t blk = 0; blk < 4 * nsb; blk++)
        dq4[blk] = dx4[blk] = 0.0f;
    for (int64_t blk = 0; blk < nb; blk++) {
        const int8_t *xb = xq + 32 * blk;
        int8_t *o = xqp + 128 * (blk / 4) + 16 * (blk % 4);
        int32_t sum = 0;
        for (int j = 0; j < 32; j++)
            sum += xb[j];
        /* o[4 i + m] = xb[8 m + i], o[64 + 4 i + m] = xb[8 m + 4 + i]:
         * two byte shuffles where 32 scalar stores were */
        v32i8a1 v = *(const v32i8a1 *)xb;
        v16i8 lo = __builtin_shufflevector(v, v, 0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
        v16i8 hi = __builtin_shufflevector(v, v, 4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31);
        memcpy(o, &lo, 16);
        memcpy(o + 64, &hi, 16);
        dq4[blk] = dq[blk];
        dx4[blk] = dq[blk] * (float)sum;
    }
}

/* Q4_0A8 and Q5_0A8 subtract a constant offset o (8, 16) from every
 * weight: sum_j (q_j - o) xq_j = sum_j q_j xq_j - o sum_j xq_j. The
 * kernels below start each superblock's integer sums from
 * xc = -o sum xq, per 32-bit lane (the eight inputs lane l meets: bytes
 * 4 l..4 l + 3 of both halves of xqp; a 256-bit half h's lanes are
 * xc + 8 h), so the offset costs no float work per row (PKA8_FOLD; it was
 * a multiply and an add of four scales per superblock and row, and a
 * reduction per row). Exact: a lane's sum stays within 8 * 31 * 128 +
 * 16 * 8 * 128 < 2^16 in magnitude. The 256-bit rows do this since
 * 2026-12-06 (at --cpu alderlake, ops of 960 rows of 576: from L2 on one
 * worker Q4_0A8 22.7-23.4 -> 25.0-26.5 GB/s, Q5_0A8 20.3-20.6 -> 21.5-22.1;
 * two workers from memory 23.6 -> 24.6 and 22.1 -> 22.6; from the L3
 * level within noise; --cpu haswell Q4_0A8 1.01-1.03x). */
#define PKA8_FOLD(T) ((T) == DT_Q4_0A8 || (T) == DT_Q5_0A8)
static void pka8_x_corr(const int8_t *xqp, int64_t nsb, int32_t o, int32_t *xc)
{
    for (int64_t sb = 0; sb < nsb; sb++)
        for (int l = 0; l < 16; l++) {
            int32_t sum = 0;
            for (int m = 0; m < 4; m++)
                sum += xqp[128 * sb + 4 * l + m] + xqp[128 * sb + 64 + 4 * l + m];
            xc[16 * sb + l] = -o * sum;
        }
}

/* ---- int8 inputs without act_block's division per element ----
 * kernel_act.inc, once for AVX-512 (isa_avx512_*) and once for AVX2
 * (isa_avx2_*: the 256-bit rows' kernels, AVX-VNNI's included). */
typedef short v32i16 __attribute__((vector_size(64)));
typedef int32_t v4i32 __attribute__((vector_size(16)));

/* Per 32-bit lane l of a superblock's packed inputs (the 64 bytes at xqp
 * and the 64 after them: both nibble halves), the sum of its eight
 * inputs (vpmaddubsw against ones, then vpmaddwd: |sum| <= 8 * 127). */
static inline __attribute__((always_inline)) ISA_AVX512 void isa_avx512_lane_sums(const int8_t *xqp, v16i32 *out)
{
    v64i8 ones = (v64i8){0} + 1;
    v32i16 p = __builtin_ia32_pmaddubsw512(ones, *(const v64i8 *)xqp) +
               __builtin_ia32_pmaddubsw512(ones, *(const v64i8 *)(xqp + 64));
    *out = __builtin_ia32_pmaddwd512(p, (v32i16){0} + 1);
}

/* (a v16i32 result through a pointer: returned, it would change the ABI
 * of a 256-bit function) */
static inline __attribute__((always_inline)) ISA_AVX2 void isa_avx2_lane_sums(const int8_t *xqp, v16i32 *out)
{
    v32c ones = (v32c){0} + 1;
    v16i16 one16 = (v16i16){0} + 1;
    v8i32 s[2];
    UNROLL4
    for (int h = 0; h < 2; h++)
        s[h] = __builtin_ia32_pmaddwd256(__builtin_ia32_pmaddubsw256(ones, *(const v32c *)(xqp + 32 * h)) +
                                             __builtin_ia32_pmaddubsw256(ones, *(const v32c *)(xqp + 64 + 32 * h)),
                                         one16);
    *out = __builtin_shufflevector(s[0], s[1], 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

#define ACT(name) isa_avx512_##name
#define ACT_ATTR ISA_AVX512
#include "codegen/cpu/kernel_act.inc"
#undef ACT
#undef ACT_ATTR
#define ACT(name) isa_avx2_##name
#define ACT_ATTR ISA_AVX2
#include "codegen/cpu/kernel_act.inc"
#undef ACT
#undef ACT_ATTR

/* act_quantize by the widest kernel the CPU runs. */
static void act_quantize_best(const float *x, int64_t k, int8_t *xq, float *dq)
{
    if (megac_k_isa & KT_ISA_AVX512)
        isa_avx512_act_quantize(x, k, xq, dq);
    else if (megac_k_isa & KT_ISA_AVX2)
        isa_avx2_act_quantize(x, k, xq, dq);
    else
        act_quantize(x, k, xq, dq);
}

/* dot16(acc, u, s): acc += four u8 x s8 products per lane, for each
 * instruction set; macros on an lvalue (v16 arguments would change the
 * ABI of the 256-bit functions). */
#define PKA8_DOT16_PORTABLE(acc, u, s)                                                                 \
    do {                                                                                               \
        v16u32 u_ = (u), s_ = (s);                                                                     \
        UNROLL4                                                                                        \
        for (int m_ = 0; m_ < 4; m_++)                                                                 \
            acc += (v16i32)((u_ >> (uint32_t)(8 * m_)) & 0xffu) * (((v16i32)s_ << (24 - 8 * m_)) >> 24); \
    } while (0)
#define PKA8_DOT16_VNNI512(acc, u, s) acc = isa_vnni512_dot(acc, u, s)

/* What the packed A8 dtypes T (W4A8G32, Q4_0A8, Q4_1A8, Q5_0A8, Q5_1A8)
 * differ in (kernel_table.h's layouts): header bytes per block, Q5's
 * fifth bits, and what each block subtracts from its scaled sum, in
 * out = sum - off: W4A8G32 s z dx, Q4_0A8 8 d dx, Q5_0A8 16 d dx, Q4_1A8
 * and Q5_1A8 -m dx (dx: the input block's d times its sum of xq; sc: the blocks'
 * scales, f16x4 the f16 conversion of the caller's instruction set). */
#define PKA8_HDR(T) pk_hdr(qlayout(T))
#define PKA8_Q5(T) ((T) == DT_Q5_0A8 || (T) == DT_Q5_1A8)
#define PKA8_OFF(T, w, nblk, sc, dx, f16x4)                                              \
    ((T) == DT_Q4_1A8 || (T) == DT_Q5_1A8 ? -(f16x4(pk_u16x4((w) + 2 * (nblk), (nblk))) * (dx)) \
     : (T) == DT_Q5_0A8                   ? 16.0f * (sc) * (dx)                                 \
     : (T) == DT_Q4_0A8                   ? 8.0f * (sc) * (dx)                                  \
                                          : (sc) * pk_z4((w) + 2 * (nblk), (nblk)) * (dx))
/* Q5's qh words of the superblock at w (16 bytes whatever nblk: within
 * the superblock, and x is 0 past k), folded as isa_avx2_pkq_sb folds
 * them: lane 4 b + i gets block b's word shifted right by i, which puts
 * the fifth bits of byte m's two elements at bits 8 m and 8 m + 4. (A
 * byte compare against 1 << i instead of the shifts ran no faster on Zen
 * 3.) */
#define PKA8_QH(T, w, nblk, qh)                                     \
    do {                                                            \
        memcpy(&(qh), (w) + ((T) == DT_Q5_0A8 ? 2 : 4) * (nblk), 16); \
    } while (0)
#define PKA8_FOLD5(q, lo, hi)            \
    do {                                 \
        (lo) |= ((q) & 0x01010101u) << 4; \
        (hi) |= (q) & 0x10101010u;        \
    } while (0)

/* Superblock sb of the four rows, nblk of its blocks (a constant 4 in
 * the main loop, so its loads and conversions are fixed-size). */
#define PKA8_SB(dot16, hi4, nblk, T)                                                                         \
    do {                                                                                                     \
        v16u32 xl = *(const v16u32 *)(xqp + 128 * sb), xh = *(const v16u32 *)(xqp + 128 * sb + 64);          \
        v4f dq = *(const v4f *)(dq4 + 4 * sb), dx = *(const v4f *)(dx4 + 4 * sb);                            \
        v16i32 xc16 = PKA8_FOLD(T) ? *(const v16i32 *)(xc + 16 * sb) : (v16i32){0};                          \
        (void)xc16;                                                                                          \
        UNROLL4                                                                                              \
        for (int i = 0; i < 4; i++) {                                                                        \
            const unsigned char *w = row[i] + 4 * (PKA8_HDR(T) + 16) * sb;                                   \
            v16u32 v;                                                                                        \
            if ((nblk) == 4)                                                                                 \
                v = *(const v16u32a1 *)(w + 4 * PKA8_HDR(T));                                                \
            else                                                                                             \
                pk_load_short(w + PKA8_HDR(T) * (nblk), (nblk), &v);                                         \
            v16u32 lo = v & 0x0f0f0f0fu, hi = hi4(v);                                                        \
            if (PKA8_Q5(T)) {                                                                                \
                v4u32 qh;                                                                                    \
                PKA8_QH(T, w, (nblk), qh);                                                                   \
                v16u32 q5 = __builtin_shufflevector(qh, qh, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) >> \
                            (v16u32){0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};                        \
                PKA8_FOLD5(q5, lo, hi);                                                                      \
            }                                                                                                \
            v16i32 p = PKA8_FOLD(T) ? xc16 : (v16i32){0};                                                    \
            dot16(p, lo, xl);                                                                                \
            dot16(p, hi, xh);                                                                                \
            v4f sc = pk_f16x4(pk_u16x4(w, (nblk))), sd = sc * dq;                                            \
            acc[i] += __builtin_shufflevector(sd, sd, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) *      \
                      __builtin_convertvector(p, v16f);                                                      \
            if (!PKA8_FOLD(T))                                                                               \
                off[i] += PKA8_OFF(T, w, (nblk), sc, dx, pk_f16x4);                                          \
        }                                                                                                    \
    } while (0)

/* The short last superblocks of rows i0 and i1 (two blocks each) as one,
 * as pk_tail2 takes them: row i0's nibbles in lanes 0-7, i1's in 8-15,
 * against superblock sb + 1's inputs (pk_tail_dup: sb's duplicated). */
#define PKA8_TAIL2(dot16, hi4, T, i0, i1)                                                                    \
    do {                                                                                                     \
        const unsigned char *w0 = row[i0] + 4 * (PKA8_HDR(T) + 16) * sb, *w1 = row[i1] + 4 * (PKA8_HDR(T) + 16) * sb; \
        v16u32 xl = *(const v16u32 *)(xqp + 128 * (sb + 1)), xh = *(const v16u32 *)(xqp + 128 * (sb + 1) + 64); \
        v4f dq = *(const v4f *)(dq4 + 4 * (sb + 1)), dx = *(const v4f *)(dx4 + 4 * (sb + 1)), o4 = {0};      \
        v16u32 v, q5;                                                                                        \
        pk_pair_nibbles(w0, w1, PKA8_HDR(T), &v);                                                            \
        v16u32 lo = v & 0x0f0f0f0fu, hi = hi4(v);                                                            \
        if (PKA8_Q5(T)) {                                                                                    \
            pk_pair_qh(w0, w1, (T) == DT_Q5_0A8 ? 4 : 8, &q5);                                               \
            PKA8_FOLD5(q5, lo, hi);                                                                          \
        }                                                                                                    \
        v16i32 p = PKA8_FOLD(T) ? *(const v16i32 *)(xc + 16 * (sb + 1)) : (v16i32){0};                       \
        dot16(p, lo, xl);                                                                                    \
        dot16(p, hi, xh);                                                                                    \
        v4f sc = pk_f16x4(pk_pair_u16x4(w0, w1, 0)), sd = sc * dq;                                           \
        if ((T) == DT_Q4_1A8 || (T) == DT_Q5_1A8) {                                                          \
            o4 = -(pk_f16x4(pk_pair_u16x4(w0, w1, 4)) * dx);                                                 \
        } else if (!PKA8_FOLD(T)) {                                                                          \
            v4u8 z;                                                                                          \
            memcpy(&z, w0 + 4, 2);                                                                           \
            memcpy((char *)&z + 2, w1 + 4, 2);                                                               \
            o4 = sc * __builtin_convertvector(z, v4f) * dx;                                                  \
        }                                                                                                    \
        v16f pr = __builtin_shufflevector(sd, sd, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) *          \
                  __builtin_convertvector(p, v16f);                                                          \
        pk_pair_add(&pr, o4, &acc[i0], &acc[i1], &off[i0], &off[i1]);                                        \
    } while (0)

/* Four rows side by side (each x vector loaded once for all four): whole
 * superblocks, then the nb % 4 blocks left over as a short one (zeros
 * past them, in the weights as in xqp; two rows' two-block ones as one,
 * PKA8_TAIL2), into out[4]; tws (if any) asks for the lines ahead. */
#define PKA8_QUAD(dot16, hi4, T, row, out, tws)                                                        \
    do {                                                                                               \
        v16f acc[4] = {{0}, {0}, {0}, {0}};                                                            \
        v4f off[4] = {{0}, {0}, {0}, {0}};                                                             \
        int64_t sb = 0;                                                                                \
        for (; sb < nb / 4; sb++) {                                                                    \
            if (tws)                                                                                   \
                ws_trickle(tws, 16 * (PKA8_HDR(T) + 16));                                              \
            PKA8_SB(dot16, hi4, 4, T);                                                                 \
        }                                                                                              \
        if (nb % 4 == 2) {                                                                             \
            PKA8_TAIL2(dot16, hi4, T, 0, 1);                                                           \
            PKA8_TAIL2(dot16, hi4, T, 2, 3);                                                           \
        } else if (nb % 4) {                                                                           \
            PKA8_SB(dot16, hi4, (int)(nb % 4), T);                                                     \
        }                                                                                              \
        v4f o_ = hsum16x4(acc);                                                                        \
        if (!PKA8_FOLD(T))                                                                             \
            o_ -= hsum4x4(off);                                                                        \
        memcpy(out, &o_, sizeof o_);                                                                   \
    } while (0)

/* Rows [r0, r1) four at a time (SEG_QUADS). */
#define PKA8_ROWS(name, attr, dot16, hi4, T)                                                                 \
    static attr void name(const GemvSeg *g, const int8_t *xqp, const float *dq4, const float *dx4,           \
                          const int32_t *xc, int64_t k)                                                      \
    {                                                                                                        \
        int64_t rb = qrow_bytes(T, k), nb = k / 32;                                                          \
        SEG_QUADS(g, rb, k, WS_TRICKLE_K, KT_TUNE_FAR_QUADS, row, out, ws, isfar_,                           \
                  PKA8_QUAD(dot16, hi4, T, row, out, ws));                                                   \
    }
#define PKA8_HI_SHIFT(v) (((v) >> 4) & 0x0f0f0f0fu)
#define PKA8_TYPES(pre, attr, dot16, hi4)                             \
    PKA8_ROWS(pre##_rows, attr, dot16, hi4, DT_W4A8G32)               \
    PKA8_ROWS(pre##_q4_0_rows, attr, dot16, hi4, DT_Q4_0A8)           \
    PKA8_ROWS(pre##_q4_1_rows, attr, dot16, hi4, DT_Q4_1A8)           \
    PKA8_ROWS(pre##_q5_0_rows, attr, dot16, hi4, DT_Q5_0A8)           \
    PKA8_ROWS(pre##_q5_1_rows, attr, dot16, hi4, DT_Q5_1A8)
PKA8_TYPES(pka8_portable, , PKA8_DOT16_PORTABLE, PKA8_HI_SHIFT)
PKA8_TYPES(isa_vnni512_pka8, ISA_VNNI512, PKA8_DOT16_VNNI512, PKA8_HI_SHIFT)
/* with GFNI, each byte's high nibble by one vgf2p8affineqb (isa_gfni512_hi) */
PKA8_TYPES(isa_gfni512_pka8, ISA_GFNI512, PKA8_DOT16_VNNI512, isa_gfni512_hi)

/* The 256-bit rows (AVX2, AVX-VNNI), one row after another with the
 * row's sums in registers (Zen 3: one sequential weight stream decoded
 * faster than four rows side by side; when the macro above did that, it
 * kept the sums in memory, indexed by row), and a half superblock's nibbles
 * through one dot2 (A8_DOT2_AVX2: 6 vector multiplies per superblock
 * where a vpmaddwd per vpmaddubsw took 8; Q5's values are < 32, so the
 * i16 sum of the two products stays within 4 * 31 * 127). Each row asks
 * for its lines before it, by seg_trickle's rule (where a quad's were
 * asked for together before: at --cpu alderlake, two workers, ops of 960 rows of 576,
 * Q4_0A8 from the L3 31.6 -> 36.4 GB/s and from memory 19.3 -> 22.1, from
 * L2 21.7 -> 20.3; Q4_1A8 37.6 -> 39.4 and 19.7 -> 21.6). A long segment
 * goes as far quads where KT_TUNE_FAR_SEQ says (Zen 3: four streams where
 * there was one; from memory, two workers, one op of 256 MB, Q4_1A8 at k
 * 576 1.13-1.16x, Q8_0A8 1.13x, the medians of alternated runs). Q4_0A8 and
 * Q5_0A8 start their sums from xc (PKA8_FOLD, pka8_x_corr). */
#define PKA8_256_ROWS(pre, attr, dot2)                                                                         \
    /* The superblock at w (nblk of its blocks, a constant) against x's  \
     * at xs, dq, dx: its halves' sums into a[0], a[1], its offsets into   \
     * *off. */                                                            \
    static inline __attribute__((always_inline)) attr void pre##_pka8_sb(                                    \
        int T, int nblk, const unsigned char *w, const int8_t *xs, const float *dq, const float *dx,         \
        const int32_t *xc, v8fl a[2], v4f *off)                                                              \
    {                                                                                                        \
        const v8u32 m = {0x0f0f0f0fu, 0x0f0f0f0fu, 0x0f0f0f0fu, 0x0f0f0f0fu,                                 \
                         0x0f0f0f0fu, 0x0f0f0f0fu, 0x0f0f0f0fu, 0x0f0f0f0fu};                                \
        v16u32 v;                                                                                            \
        if (nblk == 4)                                                                                       \
            v = *(const v16u32a1 *)(w + 4 * PKA8_HDR(T));                                                    \
        else                                                                                                 \
            pk_load_short(w + PKA8_HDR(T) * nblk, nblk, &v);                                                 \
        v4u32 qh = {0};                                                                                      \
        if (PKA8_Q5(T))                                                                                      \
            PKA8_QH(T, w, nblk, qh);                                                                         \
        v4f sc = isa_avx2_f16x4(pk_u16x4(w, nblk)), sd = sc * *(const v4f *)dq;                              \
        v8fl sd8 = __builtin_shufflevector(sd, sd, 0, 1, 2, 3, 0, 1, 2, 3);                                  \
        UNROLL4                                                                                              \
        for (int h = 0; h < (nblk > 2 ? 2 : 1); h++) {                                                       \
            v8u32 q = h ? __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)                        \
                        : __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);                             \
            v8u32 lo = q & m, hi = (q >> 4) & m;                                                             \
            if (PKA8_Q5(T)) {                                                                                \
                v8u32 q5 = h ? __builtin_shufflevector(qh, qh, 2, 2, 2, 2, 3, 3, 3, 3)                       \
                             : __builtin_shufflevector(qh, qh, 0, 0, 0, 0, 1, 1, 1, 1);                      \
                q5 >>= (v8u32){0, 1, 2, 3, 0, 1, 2, 3};                                                      \
                PKA8_FOLD5(q5, lo, hi);                                                                      \
            }                                                                                                \
            v8i32 d0 = PKA8_FOLD(T) ? *(const v8i32 *)(xc + 8 * h) : (v8i32){0};                             \
            v8i32 d = dot2(d0, lo, *(const v8u32 *)(xs + 32 * h), hi, *(const v8u32 *)(xs + 64 + 32 * h));   \
            /* block 2 h's scale to lanes 0-3, 2 h + 1's to lanes 4-7 */                                   \
            v8fl s8 = __builtin_ia32_permvarsf256(sd8, (v8i32){2 * h, 2 * h, 2 * h, 2 * h, 2 * h + 1, 2 * h + 1, \
                                                               2 * h + 1, 2 * h + 1});                       \
            a[h] += __builtin_convertvector(d, v8fl) * s8;                                                   \
        }                                                                                                    \
        if (!PKA8_FOLD(T))                                                                                   \
            *off += PKA8_OFF(T, w, nblk, sc, *(const v4f *)dx, isa_avx2_f16x4);                              \
    }                                                                                                        \
    /* Four rows' sums into out[4], each row asking for its lines first  \
     * where ws is given. */                                               \
    static inline __attribute__((always_inline)) attr void pre##_pka8_quad(                                  \
        int T, const unsigned char *const row[4], const int8_t *xqp, const float *dq4, const float *dx4,     \
        const int32_t *xc, int64_t rb, int64_t nb, WStream *ws, float out[4])                                \
    {                                                                                                        \
        int64_t sbb = 4 * (PKA8_HDR(T) + 16);                                                                \
        v4f rs[4], off4 = {0};                                                                               \
        _Pragma("clang loop unroll(disable)") for (int i = 0; i < 4; i++)                                   \
        {                                                                                                    \
            v8fl a[2] = {{0}, {0}};                                                                          \
            v4f off = {0};                                                                                   \
            int64_t sb = 0;                                                                                  \
            if (ws)                                                                                          \
                ws_trickle(ws, rb);                                                                          \
            for (; sb < nb / 4; sb++)                                                                        \
                pre##_pka8_sb(T, 4, row[i] + sbb * sb, xqp + 128 * sb, dq4 + 4 * sb, dx4 + 4 * sb,              \
                              xc + 16 * sb, a, &off);                                                        \
            const unsigned char *w = row[i] + sbb * sb;                                                      \
            const int8_t *xs = xqp + 128 * sb;                                                               \
            if (nb % 4 == 1)                                                                                 \
                pre##_pka8_sb(T, 1, w, xs, dq4 + 4 * sb, dx4 + 4 * sb, xc + 16 * sb, a, &off);               \
            else if (nb % 4 == 2)                                                                            \
                pre##_pka8_sb(T, 2, w, xs, dq4 + 4 * sb, dx4 + 4 * sb, xc + 16 * sb, a, &off);               \
            else if (nb % 4 == 3)                                                                            \
                pre##_pka8_sb(T, 3, w, xs, dq4 + 4 * sb, dx4 + 4 * sb, xc + 16 * sb, a, &off);               \
            rs[i] = isa_avx2_halves(a[0] + a[1]);                                                            \
            off4[i] = (off[0] + off[1]) + (off[2] + off[3]);                                                 \
        }                                                                                                    \
        v4f o = isa_avx2_sum4(rs) - off4;                                                                    \
        memcpy(out, &o, 16);                                                                                 \
    }                                                                                                        \
    static inline __attribute__((always_inline)) attr void pre##_pka8_rows(                                  \
        int T, const GemvSeg *g, const int8_t *xqp, const float *dq4, const float *dx4, const int32_t *xc,   \
        int64_t k)                                                                                           \
    {                                                                                                        \
        int64_t rb = qrow_bytes(T, k), nb = k / 32;                                                          \
        SEG_QUADS(g, rb, k, WS_TRICKLE_K, KT_TUNE_FAR_SEQ, row, out, ws, isfar_,                             \
                  pre##_pka8_quad(T, row, xqp, dq4, dx4, xc, rb, nb, ws, out));                              \
    }                                                                                                        \
    /* Segment g's rows of dtype t, each dtype with its own rows. */                                       \
    static attr void pre##_pka8_seg(int t, const GemvSeg *g, const int8_t *xqp, const float *dq4,            \
                                    const float *dx4, const int32_t *xc, int64_t k)                          \
    {                                                                                                        \
        switch (t) {                                                                                         \
        case DT_Q4_0A8: pre##_pka8_rows(DT_Q4_0A8, g, xqp, dq4, dx4, xc, k); break;                              \
        case DT_Q4_1A8: pre##_pka8_rows(DT_Q4_1A8, g, xqp, dq4, dx4, xc, k); break;                              \
        case DT_Q5_0A8: pre##_pka8_rows(DT_Q5_0A8, g, xqp, dq4, dx4, xc, k); break;                              \
        case DT_Q5_1A8: pre##_pka8_rows(DT_Q5_1A8, g, xqp, dq4, dx4, xc, k); break;                              \
        default: pre##_pka8_rows(DT_W4A8G32, g, xqp, dq4, dx4, xc, k); break;                                    \
        }                                                                                                    \
    }
PKA8_256_ROWS(isa_avx2, ISA_AVX2, A8_DOT2_AVX2)
PKA8_256_ROWS(isa_avxvnni, ISA_AVXVNNI, A8_DOT2_AVXVNNI)

typedef void (*Pka8RowsFn)(const GemvSeg *, const int8_t *, const float *, const float *, const int32_t *, int64_t);

/* PKA8_TYPES(pre)'s function for t */
#define PKA8_PICK(pre, t)                                                                                       \
    ((t) == DT_Q4_0A8   ? pre##_q4_0_rows                                                                       \
     : (t) == DT_Q4_1A8 ? pre##_q4_1_rows                                                                       \
     : (t) == DT_Q5_0A8 ? pre##_q5_0_rows                                                                       \
     : (t) == DT_Q5_1A8 ? pre##_q5_1_rows                                                                       \
                        : pre##_rows)

/* The PKA8_ROWS function for t: AVX-512 VNNI's (with GFNI where the CPU
 * has it) or the portable one. */
static Pka8RowsFn pka8_rows_fn(int t)
{
    if (megac_k_isa & KT_ISA_GFNI512)
        return PKA8_PICK(isa_gfni512_pka8, t);
    if (megac_k_isa & KT_ISA_VNNI512)
        return PKA8_PICK(isa_vnni512_pka8, t);
    return PKA8_PICK(pka8_portable, t);
}

/* The offset whose sums the rows of t start from (PKA8_FOLD), else 0. */
static int32_t pka8_fold_o(int t)
{
    return t == DT_Q4_0A8 ? 8 : t == DT_Q5_0A8 ? 16 : 0;
}

/* y[r0:r1] of segments sg[0:ns] of packed W4A8G32, Q4_0A8, Q4_1A8, Q5_0A8
 * or Q5_1A8 rows (pk_nib_rows) from x[0:k], quantized here. */
static void gemv_pka8(int t, const GemvSeg *sg, int ns, const float *x, int64_t k)
{
    int64_t nsb = (k / 32 + 3) / 4;
    int8_t xqp[128 * (nsb + 1)] __attribute__((aligned(64)));
    float dq4[4 * (nsb + 1)] __attribute__((aligned(16))), dx4[4 * (nsb + 1)] __attribute__((aligned(16)));
    int32_t xc[16 * (nsb + 1)] __attribute__((aligned(64)));
    /* The 256-bit rows (AVX-VNNI, or AVX2, without AVX-512 VNNI) take x as
     * prepared and, for Q4_0A8 and Q5_0A8, xc; the 512-bit and portable
     * ones (PKA8_ROWS) also take the duplicated tail (and xc over it). */
    if (megac_k_isa & KT_ISA_VNNI512) {
        isa_avx512_pka8_x(x, k, k / 32 % 4 == 2, pka8_fold_o(t), xqp, dq4, dx4, xc);
    } else if (megac_k_isa & (KT_ISA_AVXVNNI | KT_ISA_AVX2)) {
        isa_avx2_pka8_x(x, k, 0, pka8_fold_o(t), xqp, dq4, dx4, xc);
        for (int i = 0; i < ns; i++)
            Q256_PICK(pka8_seg)(t, &sg[i], xqp, dq4, dx4, xc, k);
        return;
    } else {
        int8_t xq[k];
        float dq[k / 32];
        act_quantize(x, k, xq, dq);
        pka8_x_prepare(xq, dq, k, xqp, dq4, dx4);
        if (k / 32 % 4 == 2)
            pk_tail_dup(xqp, 128, dq4, dx4, nsb);
        if (PKA8_FOLD(t))
            pka8_x_corr(xqp, nsb + (k / 32 % 4 == 2), pka8_fold_o(t), xc);
    }
    Pka8RowsFn rows = pka8_rows_fn(t);
    for (int i = 0; i < ns; i++)
        rows(&sg[i], xqp, dq4, dx4, xc, k);
}

/* Which fast A8 kernel runs t at k: 2 AVX-512 VNNI, 1 AVX-VNNI, 0 AVX2,
 * -1 none (the portable loops of dot_w8a8 and dot_w4a8). */
static int a8_fast_kind(int t, int64_t k)
{
    if (k % 32)
        return -1;
    if ((megac_k_isa & KT_ISA_VNNI512) && ((t != DT_W8A8 && t != DT_Q8_0A8) || k % 64 == 0))
        return 2;
    if (megac_k_isa & KT_ISA_AVXVNNI)
        return 1;
    return (megac_k_isa & KT_ISA_AVX2) ? 0 : -1;
}

/* xq and dq for the 256-bit W4A8G64/G128 rows: per pair p of blocks
 * (2p, 2p + 1), xq2[64 p:] holds the first 16 of each block's 32 int8,
 * then the last 16 of each, and dq8[8 p:] the two blocks' scales, four
 * lanes each; zeros for a block past k. */
static void a8_pair_prepare(const int8_t *xq, const float *dq, int64_t k, int8_t *xq2, float *dq8)
{
    int64_t nb = k / 32;
    for (int64_t b = 0; b < nb + nb % 2; b++) {
        int8_t *o = xq2 + 64 * (b / 2) + 16 * (b % 2);
        for (int j = 0; j < 16; j++) {
            o[j] = b < nb ? xq[32 * b + j] : 0;
            o[32 + j] = b < nb ? xq[32 * b + 16 + j] : 0;
        }
        for (int l = 0; l < 4; l++)
            dq8[8 * (b / 2) + 4 * (b % 2) + l] = b < nb ? dq[b] : 0.0f;
    }
}

/* Four rows of an A8 dtype with the kernel of kind `kind`. */
static inline __attribute__((always_inline)) void a8_rows4(int kind, int t, const unsigned char *const row[4],
                                                          const int8_t *xq, const float *dq, const float *side,
                                                          const int32_t *corr, float c, int64_t k, float out[4],
                                                          WStream *ws)
{
    int64_t gs = t == DT_W8A8 || t == DT_Q8_0A8 ? 32 : w4_gsize(qlayout(t));
    if (t == DT_Q8_0A8 && kind == 2)
        isa_vnni512_q8_0a8_rows4(row, xq, dq, corr, k, out, ws);
    else if (t == DT_Q8_0A8 && kind == 1)
        isa_avxvnni_q8_0a8_rows4(row, xq, dq, k, out, ws);
    else if (t == DT_Q8_0A8)
        isa_avx2_q8_0a8_rows4(row, xq, dq, k, out, ws);
    else if (kind == 2 && t == DT_W8A8)
        isa_vnni512_w8a8_rows4(row, xq, side, c, k, out, ws);
    else if (kind == 2 && gs > 32 && (megac_k_isa & KT_ISA_GFNI512))
        isa_gfni512_w4ga8_rows4(gs, row, xq, dq, side, k, out, ws); /* xq, dq: w4ga8_x_prepare's */
    else if (kind == 2 && gs > 32)
        isa_vnni512_w4ga8_rows4(gs, row, xq, dq, side, k, out, ws);
    else if (kind == 2)
        isa_vnni512_w4a8_rows4(gs, row, xq, dq, side, k, out);
    else if (kind == 1 && t == DT_W8A8)
        isa_avxvnni_w8a8_rows4(row, xq, dq, k, out, ws);
    else if (kind == 1)
        isa_avxvnni_w4a8_rows4(gs, row, xq, dq, side, k, out, ws);
    else if (t == DT_W8A8)
        isa_avx2_w8a8_rows4(row, xq, dq, k, out, ws);
    else
        isa_avx2_w4a8_rows4(gs, row, xq, dq, side, k, out, ws);
}

/* gemv_a8() with a fast kernel: the activation side's sums first (W8A8 on
 * VNNI512: d per lane and the constant c; Q8_0A8 there: d and the
 * integer correction per lane; W4A8G: dsx per group). */
static void gemv_a8_fast(int kind, int t, const GemvSeg *sg, int ns, const int8_t *xq, const float *dq, int64_t k)
{
    int q8 = t == DT_W8A8 || t == DT_Q8_0A8;
    int64_t rb = qrow_bytes(t, k), gs = q8 ? 32 : w4_gsize(qlayout(t));
    float side[q8 ? k / 4 : k / 32 + 1], c = 0;
    int32_t corr[t == DT_Q8_0A8 ? k / 4 : 1];
    float dqp[t == DT_Q8_0A8 ? k / 32 + 16 : 1]; /* dq, zeros to a multiple of 16 (isa_vnni512_q8_0a8_rows4) */
    for (int64_t l = 0; t == DT_Q8_0A8 && l < k / 4; l++)
        corr[l] = 128 * (xq[4 * l] + xq[4 * l + 1] + xq[4 * l + 2] + xq[4 * l + 3]);
    for (int64_t b = 0; t == DT_Q8_0A8 && b < k / 32 + 16; b++)
        dqp[b] = b < k / 32 ? dq[b] : 0.0f;
    for (int64_t bl = 0; bl < k / 32; bl++) {
        int32_t sx = 0;
        for (int j = 0; j < 32; j++)
            sx += xq[32 * bl + j];
        if (q8) {
            c += dq[bl] * 128.0f * (float)sx;
            for (int l = 0; l < 8; l++)
                side[bl * 8 + l] = dq[bl];
        } else {
            side[bl * 32 / gs] = (bl * 32 % gs ? side[bl * 32 / gs] : 0.0f) + dq[bl] * (float)sx;
        }
    }
    /* W4A8G64/G128: xq and dq rearranged, on 256 bits by pairs of blocks
     * (a8_pair_prepare), on AVX-512 VNNI by superblocks (w4ga8_x_prepare) */
    int pairs = !q8 && kind < 2, sbs = !q8 && kind == 2 && gs > 32;
    int64_t np = pairs ? (k / 32 + 1) / 2 : sbs ? (k + 127) / 128 : 1;
    int8_t xq2[(pairs ? 64 : 128) * np] __attribute__((aligned(64)));
    float dq8[(pairs ? 8 : 16) * np] __attribute__((aligned(64)));
    if (pairs)
        a8_pair_prepare(xq, dq, k, xq2, dq8);
    if (sbs)
        w4ga8_x_prepare(xq, dq, k, xq2, dq8);
    const int8_t *xa = pairs || sbs ? xq2 : xq;
    const float *da = pairs || sbs ? dq8 : t == DT_Q8_0A8 ? dqp : dq;
    /* the 8-bit rows as far quads: the AVX-512 VNNI ones, and the 256-bit
     * ones (one after another) where KT_TUNE_FAR_SEQ says */
    int32_t far = !q8 ? 0 : kind == 2 ? KT_TUNE_FAR_QUADS : KT_TUNE_FAR_SEQ;
    for (int i = 0; i < ns; i++)
        SEG_QUADS(&sg[i], rb, k, kind == 2 ? 0 : WS_TRICKLE_K, far, row, out, ws, isfar,
                  a8_rows4(kind, t, row, xa, da, side, corr, c, k, out, ws));
}

/* y[r0:r1] of an A8 weight: the input quantized once, then integer rows.
 * k <= CPU_NORM_K_MAX (cpu_check.c), so the buffers stay modest VLAs. */
/* IQ4_NLA8 and IQ4_XSA8 rows with vpdpbusd. A 64-byte vector holds four
 * blocks' (IQ4_XS: sub-blocks') 16 bytes of nibbles, one a 128-bit lane;
 * vpshufb turns each nibble into its value + 128 as an unsigned byte (1 to
 * 241), against x's int8 in the same places: xl the first 16 of each
 * block's 32, xh the last 16, made once per op (zeros past k). The + 128
 * adds 128 times each lane's sum of xq, taken off by starting the lane's
 * sum from xc = -128 (that sum). Each lane's integer sum is then scaled by
 * its block's d_w d_x in float. Rows go four at a time (an IQ4_NL group read
 * from its packed superblock by isa_avx512_iq4nl_group, as for the A16
 * rows). */
static inline __attribute__((always_inline)) ISA_VNNI512 void isa_vnni512_iq4a8_quad(int xs,
                                                                                   const unsigned char *const row[4],
                                                                                   const v16u32 *xl, const v16u32 *xh,
                                                                                   const v16i32 *xc, const float *dq,
                                                                                   int64_t nb, WStream *tws,
                                                                                   float out[4])
{
    v32c t; /* the values + 128 as u8 (flipping the sign bit), in every 16-byte lane */
    iq4_table32(&t);
    v64i8 kvu = (v64i8)__builtin_shufflevector(t, t, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
                                               18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 0, 1, 2, 3,
                                               4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                               23, 24, 25, 26, 27, 28, 29, 30, 31) ^
                (char)0x80;
    v16f acc[4] = {{0}, {0}, {0}, {0}};
    float sc[4][8] __attribute__((aligned(32))); /* IQ4_XS: the super-block's sub-block scales, each row's */
    for (int64_t g = 0; g < (nb + 3) / 4; g++) {
        if (tws)
            ws_trickle(tws, 4 * (xs ? 68 : 72));
        if (xs && g % 2 == 0) {
            UNROLL4
            for (int i = 0; i < 4; i++)
                iq4xs_scales8(row[i] + 136 * (g / 2), isa_f16c_at(row[i] + 136 * (g / 2)), sc[i]);
        }
        v4f dx = *(const v4f *)(dq + 4 * g);
        UNROLL4
        for (int i = 0; i < 4; i++) {
            v16u32 v;
            v4f dw;
            if (xs) { /* sub-blocks 4 (g % 2) .. of super-block g / 2 */
                memcpy(&v, row[i] + 136 * (g / 2) + 8 + 64 * (g % 2), 64);
                memcpy(&dw, sc[i] + 4 * (g % 2), 16);
            } else {
                isa_avx512_iq4nl_group(row[i], g, nb, &v, &dw);
            }
            v16u32 wl = (v16u32)__builtin_ia32_pshufb512(kvu, (v64i8)(v & 0x0f0f0f0fu));
            v16u32 wh = (v16u32)__builtin_ia32_pshufb512(kvu, (v64i8)(v >> 4 & 0x0f0f0f0fu));
            v16i32 sum = isa_vnni512_dot(isa_vnni512_dot(xc[g], wl, xl[g]), wh, xh[g]);
            v4f d = dw * dx;
            acc[i] += __builtin_shufflevector(d, d, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3) *
                      __builtin_convertvector(sum, v16f);
        }
    }
    v4f s4 = hsum16x4(acc);
    memcpy(out, &s4, sizeof s4);
}

static ISA_VNNI512 void isa_vnni512_gemv_iq4a8(int t, const GemvSeg *sg, int ns, const float *x, int64_t k)
{
    int64_t nb = k / 32, ng = (nb + 3) / 4;
    int8_t xq[32 * 4 * ng] __attribute__((aligned(64)));
    float dq[4 * ng] __attribute__((aligned(16)));
    memset(xq, 0, sizeof xq);
    memset(dq, 0, sizeof dq);
    act_quantize_best(x, k, xq, dq);
    v16u32 xl[ng], xh[ng];
    v16i32 xc[ng];
    for (int64_t g = 0; g < ng; g++) {
        int8_t lo[64], hi[64];
        for (int b = 0; b < 4; b++) {
            memcpy(lo + 16 * b, xq + 32 * (4 * g + b), 16);
            memcpy(hi + 16 * b, xq + 32 * (4 * g + b) + 16, 16);
        }
        memcpy(&xl[g], lo, 64);
        memcpy(&xh[g], hi, 64);
        v16i32 s = isa_vnni512_dot((v16i32){0}, (v16u32){0} + 0x80808080u, xl[g]);
        xc[g] = -isa_vnni512_dot(s, (v16u32){0} + 0x80808080u, xh[g]);
    }
    int64_t rb = qrow_bytes(t, k);
    for (int i = 0; i < ns; i++) {
        if (t == DT_IQ4_XSA8)
            SEG_QUADS(&sg[i], rb, k, WS_TRICKLE_K, KT_TUNE_FAR_QUADS, row, out, ws, isfar_,
                      isa_vnni512_iq4a8_quad(1, row, xl, xh, xc, dq, nb, ws, out));
        else
            SEG_QUADS(&sg[i], rb, k, WS_TRICKLE_K, KT_TUNE_FAR_QUADS, row, out, ws, isfar_,
                      isa_vnni512_iq4a8_quad(0, row, xl, xh, xc, dq, nb, ws, out));
    }
}

static void gemv_a8(int t, const GemvSeg *sg, int ns, const float *x, int64_t k)
{
    if ((HAS_DT(DT_IQ4_NLA8) | HAS_DT(DT_IQ4_XSA8)) && (t == DT_IQ4_NLA8 || t == DT_IQ4_XSA8) &&
        (megac_k_isa & KT_ISA_VNNI512)) {
        isa_vnni512_gemv_iq4a8(t, sg, ns, x, k);
        return;
    }
    /* the GGUF 4- and 5-bit A8 rows (Q4_0A8, Q4_1A8, Q5_0A8, Q5_1A8) are
     * always packed: k is whole blocks and at most CPU_NORM_K_MAX
     * (cpu_check.c asserts it is within KT_PACK_K_MAX) */
    if (pk_nib_rows(t, k)) {
        gemv_pka8(t, sg, ns, x, k);
        return;
    }
    int8_t xq[k] __attribute__((aligned(32)));
    float dq[(k + 31) / 32];
    act_quantize_best(x, k, xq, dq);
    if ((HAS_DT(DT_IQ4_NLA8) | HAS_DT(DT_IQ4_XSA8)) && (t == DT_IQ4_NLA8 || t == DT_IQ4_XSA8) &&
        (megac_k_isa & KT_ISA_AVX2)) {
        Q256_PICK(gemv_iq4)(t, sg, ns, NULL, xq, dq, k);
        return;
    }
    int l = qlayout(t);
    if (dtype_is_kquant((DType)l) && (megac_k_isa & KT_ISA_VNNI512)) {
        isa_vnni512_gemv_kqa8(l, sg, ns, xq, dq, k);
        return;
    }
    if (dtype_is_kquant((DType)l) && (megac_k_isa & KT_ISA_AVX2)) {
        Q256_PICK(gemv_kqa8)(l, sg, ns, xq, dq, k);
        return;
    }
    int kind = dtype_is_kquant((DType)l) || l == DT_IQ4_NL || l == DT_IQ4_XS ? -1 : a8_fast_kind(t, k);
    if (kind >= 0) {
        gemv_a8_fast(kind, t, sg, ns, xq, dq, k);
        return;
    }
    int64_t rb = qrow_bytes(t, k);
    for (int i = 0; i < ns; i++)
        for (int64_t r = sg[i].r0; r < sg[i].r1; r++) {
            const unsigned char *row = sg[i].W + r * rb;
            ws_read(sg[i].ws, rb);
            float v = t == DT_W8A8                  ? dot_w8a8(row, xq, dq, k)
                      : t == DT_Q8_0A8               ? dot_q8_0a8(row, xq, dq, k)
                      : dtype_is_kquant((DType)l) || l == DT_IQ4_NL || l == DT_IQ4_XS ? dot_kqa8(l, row, xq, dq, k)
                                                     : dot_w4a8(t, row, xq, dq, k);
            gemv_store(sg[i].y, sg[i].b, r, v, sg[i].accum);
        }
}

/* The weight dtype picks the row kernel: f32 rows as float streams, the
 * others (check_gemv_weight() of cpu_check.c lists them) with the
 * dequantization fused into the dot product, the A8 ones on int8 inputs.
 * in[0..n): a run of GEMVs that gemv_shares() admits. */
#define GEMV_RUN_MAX 8

static void gemv_rows(const MegacArgs *a, const int64_t *in, int n, const float *x, WStream *ws)
{
    GemvSeg sg[GEMV_RUN_MAX];
    WStream none = {.ahead = INT64_MAX / 2};   /* a weight in the arena is no part of the stream */
    for (int i = 0; i < n; i++) {
        const int64_t *g = in + (int64_t)i * KT_STRIDE;
        sg[i] = (GemvSeg){opnd(a, g, 0),
                          opnd(a, g, 2),
                          (g[KT_PARAM + 3] & GEMV_BIAS) ? opnd(a, g, 4) : NULL,
                          g[KT_PARAM],
                          g[KT_PARAM + 1],
                          (g[KT_PARAM + 3] & GEMV_ACCUM) != 0,
                          ((uint64_t)g[KT_OPND] & KT_ARENA) ? &none : ws};
    }
    int64_t k = in[KT_PARAM + 2];
    int t = opnd_dtype(in, 0);
    if (t == DT_F32) {
        for (int i = 0; i < n; i++)
            gemv_f32(&sg[i], x, k);
    } else if (a8_is(t)) {
        if (HAS_DT(DT_W8A8) | HAS_DT(DT_W4A8G32) | HAS_DT(DT_W4A8G64) | HAS_DT(DT_W4A8G128) | HAS_DT(DT_Q4_1A8) |
            HAS_DT(DT_Q5_0A8) | HAS_DT(DT_Q5_1A8) | HAS_DT(DT_Q8_0A8) | HAS_DT(DT_Q4_KA8) | HAS_DT(DT_Q5_KA8) |
            HAS_DT(DT_Q6_KA8) | HAS_DT(DT_Q4_0A8) | HAS_DT(DT_IQ4_NLA8) | HAS_DT(DT_IQ4_XSA8))
            gemv_a8(t, sg, n, x, k);
    } else {
        gemv_quant(t, sg, n, x, k);
    }
}

/* Whether GEMV g may join a run that starts at GEMV f: the same input,
 * norm, weight dtype and output-only mark, and no GEMV of the run (g included) writes the
 * input (so what f prepared stays what g would prepare). The instructions
 * between them are GEMVs only: no wait, so no other worker may write x
 * in between (the validator proves the schedule race-free). */
static int gemv_shares(const int64_t *f, const int64_t *g)
{
    if (g[KT_KIND] != K_INST_OP || g[KT_OP] != OP_GEMV || g[KT_OPND + 1] != f[KT_OPND + 1] ||
        g[KT_OPND + 3] != f[KT_OPND + 3] || g[KT_PARAM + 2] != f[KT_PARAM + 2] ||
        ((g[KT_PARAM + 3] ^ f[KT_PARAM + 3]) & GEMV_NORM) || opnd_dtype(g, 0) != opnd_dtype(f, 0) ||
        (((uint64_t)g[KT_DTYPES] ^ (uint64_t)f[KT_DTYPES]) & KT_OUTPUT_ONLY))
        return 0;
    uint64_t x = (uint64_t)f[KT_OPND + 1], y = (uint64_t)g[KT_OPND + 2];
    if (!(x & KT_ARENA) || !(y & KT_ARENA))
        return 1; /* y is always in the arena; a weight x is never written */
    uint64_t x0 = x & ~KT_ARENA, x1 = x0 + 4 * (uint64_t)f[KT_PARAM + 2];
    uint64_t y0 = (y & ~KT_ARENA) + 4 * (uint64_t)g[KT_PARAM], y1 = (y & ~KT_ARENA) + 4 * (uint64_t)g[KT_PARAM + 1];
    return y1 <= x0 || x1 <= y0;
}

/* How many GEMVs from `in` on (at most GEMV_RUN_MAX, not past end) share
 * one prepared input; in itself counts when it does not write its input. */
static int gemv_run_length(const int64_t *in, const int64_t *end)
{
    int n = 1;
    if (!gemv_shares(in, in))
        return 1;
    while (n < GEMV_RUN_MAX && in + (int64_t)n * KT_STRIDE < end && gemv_shares(in, in + (int64_t)n * KT_STRIDE))
        n++;
    return n;
}

/* The GEMVs in[0..n) with their shared input: x, or rmsnorm(x) * nw. */
static void op_gemv(const MegacArgs *a, const int64_t *in, int n, WStream *ws)
{
    const float *x = opnd(a, in, 1);
    int64_t k = in[KT_PARAM + 2];
    if (!(in[KT_PARAM + 3] & GEMV_NORM)) {
        gemv_rows(a, in, n, x, ws);
        return;
    }
    /* k <= CPU_NORM_K_MAX (cpu_check.c), so this stays a modest VLA. */
    const float *nw = opnd(a, in, 3);
    float xin[k];
    float s = rms_scale(x, k);
    for (int64_t j = 0; j < k; j++)
        xin[j] = x[j] * s * nw[j];
    gemv_rows(a, in, n, xin, ws);
}

/* Rotates heads [h0, h1) of v by the angles of row `pos` of the rope
 * table; pair i is (2i, 2i+1) or (i, i + hd/2). */
/* dst = the nh heads of src (hd each) rotated at pos by the rope table
 * tab (dst may be src): the one rotation of OP_ROPE and of OP_ATTN's
 * rope = 1, so that both give the same bits. */
static void rope_heads(const MegacArgs *a, float *dst, const float *src, int64_t nh, const float *tab)
{
    int64_t hd = SHAPE(KS_HEAD_DIM), half = hd / 2;
    int halfpair = SHAPE(KS_ROPE_PAIRING) == 1;
    const float *cs = tab + a->pos * half * 2;
    for (int64_t h = 0; h < nh; h++) {
        const float *x = src + h * hd;
        float *y = dst + h * hd;
        for (int64_t i = 0; i < half; i++) {
            int64_t i0 = halfpair ? i : 2 * i, i1 = halfpair ? i + half : 2 * i + 1;
            float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[i0], x1 = x[i1];
            y[i0] = x0 * c - x1 * s;
            y[i1] = x0 * s + x1 * c;
        }
    }
}

static void op_rope(const MegacArgs *a, const int64_t *in)
{
    float *v = (float *)opnd(a, in, 0) + in[KT_PARAM] * SHAPE(KS_HEAD_DIM);
    rope_heads(a, v, v, in[KT_PARAM + 1] - in[KT_PARAM], opnd(a, in, 1));
}

/* ---- the KV cache's elements: f32, f16 or bf16 (compile.kv_dtype; the
 * k and v rows of an instruction alike, ir.h: op_cache_operand) ----
 * Rows are written rounded to nearest even (runtime/half.h, the
 * compiler's and the runtime's conversions too) and widened to f32 where they are read: the
 * scores, the weighted sums of v, Quest's bounds and SnapKV's scores are
 * all f32 arithmetic on the stored values. kt: the cache's dtype; the
 * readers below are inlined where kt is a constant (kv_dispatch). */

typedef short v8i16u __attribute__((vector_size(16), aligned(2)));

static ISA_AVX2 void isa_avx2_f16x16(const uint16_t *h, v16f *out)
{
    v8f lo = __builtin_ia32_vcvtph2ps256(*(const v8i16u *)h), hi = __builtin_ia32_vcvtph2ps256(*(const v8i16u *)(h + 8));
    *out = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

typedef short v16i16u __attribute__((vector_size(32), aligned(2)));

static ISA_AVX512 void isa_avx512_f16x16(const uint16_t *h, v16f *out)
{
    *out = __builtin_ia32_vcvtph2ps512_mask(*(const v16i16u *)h, (v16f){0}, (unsigned short)0xffff, 4);
}

/* out = elements j..j+15 of cache row(s) p as f32 (a macro, as F16XN). */
#define KV_LOAD16(kt, p, j, out)                                                               \
    do {                                                                                       \
        if ((kt) == DT_F32) {                                                                  \
            (out) = LOAD16((const float *)(p) + (j));                                          \
        } else {                                                                               \
            const uint16_t *h_ = (const uint16_t *)(p) + (j);                                  \
            if ((kt) == DT_BF16)                                                               \
                (out) = (v16f)(__builtin_convertvector(*(const v16u16 *)h_, v16u32) << 16);    \
            else if (megac_k_isa & KT_ISA_AVX512)                                              \
                isa_avx512_f16x16(h_, &(out));                                                 \
            else if (megac_k_isa & KT_ISA_AVX2)                                                \
                isa_avx2_f16x16(h_, &(out));                                                   \
            else                                                                               \
                F16X16(*(const v16u16 *)h_, out);                                              \
        }                                                                                      \
    } while (0)

static inline __attribute__((always_inline)) float kv_at(int kt, const void *p, int64_t j)
{
    if (kt == DT_F32)
        return ((const float *)p)[j];
    const unsigned char *b = (const unsigned char *)p + 2 * j;
    return kt == DT_BF16 ? bf16_at(b) : f16_at(b);
}

/* q[0:n] . row[0:n] */
static inline __attribute__((always_inline)) float kv_dot(int kt, const float *q, const void *row, int64_t n)
{
    v16f acc = {0};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        v16f r;
        KV_LOAD16(kt, row, j, r);
        acc += LOAD16(q + j) * r;
    }
    float s = hsum16(&acc);
    for (; j < n; j++)
        s += q[j] * kv_at(kt, row, j);
    return s;
}

/* The n elements of an f16 or bf16 cache at p, widened into out. */
static inline __attribute__((always_inline)) void kv_widen(int kt, const void *p, int64_t n, float *out)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        v16f r;
        KV_LOAD16(kt, p, j, r);
        STORE16(out + j, r);
    }
    for (; j < n; j++)
        out[j] = kv_at(kt, p, j);
}

typedef float v8fu __attribute__((vector_size(32), aligned(4)));

/* Eight floats to f16 by vcvtps2ph, rounding to nearest even (imm 0): the
 * bits of half_f32_to_f16 for every number; a NaN keeps its payload's top bits
 * where half_f32_to_f16 writes 0x200 (a NaN either way). */
static ISA_AVX2 void isa_avx2_f16x8_put(const float *src, uint16_t *out)
{
    v8i16 h = __builtin_ia32_vcvtps2ph256(*(const v8fu *)src, 0);
    memcpy(out, &h, 16);
}

/* Cache elements [j, j+n) of p = src[0:n], rounded to nearest even (f16
 * eight at a time where the CPU has F16C: kv_append runs every step). */
static void kv_put(int kt, void *p, int64_t j, const float *src, int64_t n)
{
    if (kt == DT_F32) {
        memcpy((float *)p + j, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *o = (uint16_t *)p + j;
    int64_t i = 0;
    if (kt == DT_F16 && (megac_k_isa & KT_ISA_AVX2))
        for (; i + 8 <= n; i += 8)
            isa_avx2_f16x8_put(src + i, o + i);
    for (; i < n; i++)
        o[i] = kt == DT_F16 ? half_f32_to_f16(src[i]) : half_f32_to_bf16(src[i]);
}

static void op_kv_append(const MegacArgs *a, const int64_t *in)
{
    const float *k = opnd(a, in, 0), *v = opnd(a, in, 1);
    void *kc = opnd(a, in, 2), *vc = opnd(a, in, 3);
    int64_t h = in[KT_PARAM], hd = SHAPE(KS_HEAD_DIM), kt = kv_dtype(in, 2);
    int64_t row = (h * SHAPE(KS_MAX_SEQ) + a->pos) * hd;
    kv_put((int)kt, kc, row, k + h * hd, hd);
    kv_put((int)kt, vc, row, v + h * hd, hd);
}


/* e^x for x <= 0 (softmax weights), in plain arithmetic the loop vectorizer
 * turns into vector code: x = n ln2 + r, |r| <= ln2/2 (Cody-Waite), e^r by
 * a degree-7 polynomial (Cephes expf, ~1 ulp), 2^n through the exponent
 * bits. Below -87 the result is about 1e-38 instead of a subnormal. */
static float exp_nonpos(float x)
{
    x = x > -87.0f ? (x < 0.0f ? x : 0.0f) : -87.0f; /* NaN too: no poison in the int cast */
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* ---- attention over a chunk of rows ----
 * Up to ATTN_HT q heads of a kv head go through each k and v row together
 * (with AVX-512's 32 vector registers; one at a time with AVX2's 16, where
 * four spilled: f32 rows 1.15x slower): the row is loaded (an f16 or bf16
 * row widened) once for all of them, in registers, and their 4 x ATTN_HT
 * FMA chains are independent. One call per head and four rows, the
 * scores' chains were too short for the FMA latency, and every row was read
 * (or widened into a buffer and read back) once per head. From L2, one Zen
 * 4 core, ns a row (f32 cache / f16 cache), before -> after: SmolLM2-135M's
 * shape (hd 64, 3 q heads a kv head) 11.9 -> 10.7 / 15.2 -> 11.9,
 * Llama-3.1-8B's (hd 128, 4 heads) 31.6 -> 26.5 / 40.1 -> 25.7; as
 * x86-64-v3 code 14.2 -> 14.3 / 17.2 -> 12.7 and 35.5 -> 35.7 / 43.4 ->
 * 29.8. */
#define ATTN_HT 4
#define ATTN_HT_ISA (megac_k_isa & KT_ISA_AVX512 ? ATTN_HT : 1)
#define ATTN_UNROLL _Pragma("clang loop unroll(full)")

/* sc[g][i + r] = scale * q_g . k row r, r < m <= 4 (the rows at k), for
 * the heads g0 <= g < g0 + ht: sixteen lanes at a time over the rows' first
 * hd - hd % 16 elements (a short group reads its last row again), each
 * row's lanes summed four rows at once (halves, then within 128-bit
 * lanes, on 256 bits), the rest of the row one element at a time. */
static inline __attribute__((always_inline)) void attn_scores_tile(int kt, float (*sc)[ATTN_CHUNK], const float *q,
                                                                  const char *k, int64_t i, int64_t m, int64_t hd,
                                                                  int64_t g0, int64_t ht, float scale)
{
    int64_t rowb = hd * kv_esize(kt), hd16 = hd - hd % 16;
    const char *kr[4];
    v16f acc[ATTN_HT][4];
    UNROLL4
    for (int r = 0; r < 4; r++)
        kr[r] = k + (r < m ? r : m - 1) * rowb;
    ATTN_UNROLL
    for (int h = 0; h < ATTN_HT; h++)
        UNROLL4
        for (int r = 0; r < 4; r++)
            acc[h][r] = (v16f){0};
    for (int64_t j = 0; j < hd16; j += 16) {
        v16f kv[4];
        UNROLL4
        for (int r = 0; r < 4; r++)
            KV_LOAD16(kt, kr[r], j, kv[r]);
        ATTN_UNROLL
        for (int h = 0; h < ATTN_HT; h++) {
            if (h >= ht)
                break;
            v16f qv = LOAD16(q + (g0 + h) * hd + j);
            UNROLL4
            for (int r = 0; r < 4; r++)
                acc[h][r] += kv[r] * qv;
        }
    }
    float tail[4][16]; /* the rows' last hd % 16 elements, widened once for all heads */
    for (int64_t j = hd16; j < hd; j++)
        UNROLL4
        for (int r = 0; r < 4; r++)
            tail[r][j - hd16] = kv_at(kt, kr[r], j);
    ATTN_UNROLL
    for (int h = 0; h < ATTN_HT; h++) {
        if (h >= ht)
            break;
        v8f y[4];
        UNROLL4
        for (int r = 0; r < 4; r++)
            y[r] = __builtin_shufflevector(acc[h][r], acc[h][r], 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(acc[h][r], acc[h][r], 8, 9, 10, 11, 12, 13, 14, 15);
        v8f t0 = __builtin_shufflevector(y[0], y[1], 0, 8, 1, 9, 4, 12, 5, 13) +
                 __builtin_shufflevector(y[0], y[1], 2, 10, 3, 11, 6, 14, 7, 15);
        v8f t1 = __builtin_shufflevector(y[2], y[3], 0, 8, 1, 9, 4, 12, 5, 13) +
                 __builtin_shufflevector(y[2], y[3], 2, 10, 3, 11, 6, 14, 7, 15);
        v8f u = __builtin_shufflevector(t0, t1, 0, 1, 8, 9, 4, 5, 12, 13) +
                __builtin_shufflevector(t0, t1, 2, 3, 10, 11, 6, 7, 14, 15);
        v4f s4 = __builtin_shufflevector(u, u, 0, 1, 2, 3) + __builtin_shufflevector(u, u, 4, 5, 6, 7);
        const float *qh = q + (g0 + h) * hd;
        v4f t = {0};
        for (int64_t j = hd16; j < hd; j++)
            t += qh[j] * (v4f){tail[0][j - hd16], tail[1][j - hd16], tail[2][j - hd16], tail[3][j - hd16]};
        s4 = (s4 + t) * scale;
        UNROLL4
        for (int r = 0; r < 4; r++)
            if (r < m)
                sc[g0 + h][i + r] = s4[r];
    }
}

/* p_g[d : d + 16 nv] += sum_i sc[g][i] v row i over n rows, for the heads
 * g0 <= g < g0 + ht: their outputs in registers across all rows. */
static inline __attribute__((always_inline)) void attn_accum_cols(int kt, float *p, float (*sc)[ATTN_CHUNK],
                                                                 const char *v, int64_t n, int64_t hd, int64_t d,
                                                                 int nv, int64_t g0, int64_t ht)
{
    int64_t rowb = hd * kv_esize(kt);
    v16f acc[ATTN_HT][4];
    ATTN_UNROLL
    for (int h = 0; h < ATTN_HT; h++) {
        if (h >= ht)
            break;
        UNROLL4
        for (int c = 0; c < 4; c++)
            if (c < nv)
                acc[h][c] = LOAD16(p + (g0 + h) * (hd + 2) + d + 16 * c);
    }
    for (int64_t i = 0; i < n; i++) {
        v16f vr[4];
        UNROLL4
        for (int c = 0; c < 4; c++)
            if (c < nv)
                KV_LOAD16(kt, v + i * rowb, d + 16 * c, vr[c]);
        ATTN_UNROLL
        for (int h = 0; h < ATTN_HT; h++) {
            if (h >= ht)
                break;
            float w = sc[g0 + h][i];
            UNROLL4
            for (int c = 0; c < 4; c++)
                if (c < nv)
                    acc[h][c] += w * vr[c];
        }
    }
    ATTN_UNROLL
    for (int h = 0; h < ATTN_HT; h++) {
        if (h >= ht)
            break;
        UNROLL4
        for (int c = 0; c < 4; c++)
            if (c < nv)
                STORE16(p + (g0 + h) * (hd + 2) + d + 16 * c, acc[h][c]);
    }
}

/* p_g[0:hd] += sum_i sc[g][i] v row i over n rows, for the heads
 * g0 <= g < g0 + ht: 64 outputs at a time, then 16, then single ones. */
static inline __attribute__((always_inline)) void attn_accum_tile(int kt, float *p, float (*sc)[ATTN_CHUNK],
                                                                 const char *v, int64_t n, int64_t hd, int64_t g0,
                                                                 int64_t ht)
{
    int64_t rowb = hd * kv_esize(kt), d = 0;
    for (; d + 64 <= hd; d += 64)
        attn_accum_cols(kt, p, sc, v, n, hd, d, 4, g0, ht);
    for (; d + 16 <= hd; d += 16)
        attn_accum_cols(kt, p, sc, v, n, hd, d, 1, g0, ht);
    for (; d < hd; d++) {
        float a[ATTN_HT];
        ATTN_UNROLL
        for (int h = 0; h < ATTN_HT; h++)
            a[h] = h < ht ? p[(g0 + h) * (hd + 2) + d] : 0.0f;
        for (int64_t i = 0; i < n; i++) {
            float x = kv_at(kt, v + i * rowb, d);
            ATTN_UNROLL
            for (int h = 0; h < ATTN_HT; h++)
                if (h < ht)
                    a[h] += sc[g0 + h][i] * x;
        }
        ATTN_UNROLL
        for (int h = 0; h < ATTN_HT; h++)
            if (h < ht)
                p[(g0 + h) * (hd + 2) + d] = a[h];
    }
}

/* The softmax state of one q head after a chunk with scores sc[0:n]: the
 * running max m and sum l move to the chunk's max, outputs p[0:hd] are
 * rescaled, and sc becomes the weights e^(s - m) (one vector loop). The
 * max and the sum run 16 lanes wide: as scalar chains (without
 * reassociation the loop vectorizer leaves them scalar) they took a
 * fifth of the attention's time. */
static void attn_softmax_step(float *p, float *sc, int64_t n, int64_t hd)
{
    v16f vm = {NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF,
               NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        vm = __builtin_elementwise_max(vm, LOAD16(sc + i)); /* maxnum: a NaN score is passed over */
    v8f m8 = __builtin_elementwise_max(__builtin_shufflevector(vm, vm, 0, 1, 2, 3, 4, 5, 6, 7),
                                       __builtin_shufflevector(vm, vm, 8, 9, 10, 11, 12, 13, 14, 15));
    v4f m4 = __builtin_elementwise_max(__builtin_shufflevector(m8, m8, 0, 1, 2, 3),
                                       __builtin_shufflevector(m8, m8, 4, 5, 6, 7));
    float mx = __builtin_fmaxf(__builtin_fmaxf(m4[0], m4[1]), __builtin_fmaxf(m4[2], m4[3]));
    for (; i < n; i++)
        mx = sc[i] > mx ? sc[i] : mx;
    float m = p[hd], l = p[hd + 1];
    if (mx > m) {
        float r = m == NEG_INF ? 0.0f : expf(m - mx);
        for (int64_t d = 0; d < hd; d++)
            p[d] *= r;
        l *= r;
        m = mx;
    }
    for (i = 0; i < n; i++)
        sc[i] = exp_nonpos(sc[i] - m);
    v16f vs = {0};
    for (i = 0; i + 16 <= n; i += 16)
        vs += LOAD16(sc + i);
    float t = hsum16(&vs);
    for (; i < n; i++)
        t += sc[i];
    p[hd] = m;
    p[hd + 1] = l + t;
}

/* Rows [t0, t0+n) of the online softmax for all G q heads of a kv head:
 * scores, softmax update, weighted sum of v. Each group of four k rows
 * serves every q head while it is in L1, then the heads sum the chunk's
 * v rows (ATTN_CHUNK of them stay in L1/L2 for the next); the rows are part of the
 * worker's prefetch stream (ws: the loops do too much per cache line for
 * the out-of-order window alone to keep enough of them in flight). p: G
 * entries of hd outputs, m, l. raw (NULL: none) receives q head g's scaled
 * score of row t0 + i at raw[g * rstride + i]. */
static inline __attribute__((always_inline)) void attn_chunk_kt(int kt, float *p, const float *q, const void *kh,
                                                               const void *vh, int64_t t0, int64_t n, int64_t hd,
                                                               int64_t G, float scale, WStream *ws, float *raw,
                                                               int64_t rstride)
{
    /* rows of an f16/bf16 cache whose length is no multiple of 16
     * (stories260K's 8) are widened first, a span of rows at once: one
     * element at a time, once per head, they took 1.6-2.1x the time */
    enum { F32 = DT_F32 };
    int wide = kt != DT_F32 && hd % 16;
    float sc[G][ATTN_CHUNK], rows[wide ? ATTN_CHUNK * hd : 1];
    int64_t rowb = hd * kv_esize(kt);
    const char *k = (const char *)kh + t0 * rowb, *v = (const char *)vh + t0 * rowb;
    for (int64_t i = 0; i < n; i += 4) {
        int64_t m = n - i < 4 ? n - i : 4;
        ws_read(ws, m * rowb);
        if (wide)
            kv_widen(kt, k + i * rowb, m * hd, rows);
        for (int64_t g0 = 0; g0 < G; g0 += ATTN_HT_ISA) {
            int64_t ht = G - g0 < ATTN_HT_ISA ? G - g0 : ATTN_HT_ISA;
            if (wide)
                attn_scores_tile(F32, sc, q, (const char *)rows, i, m, hd, g0, ht, scale);
            else
                attn_scores_tile(kt, sc, q, k + i * rowb, i, m, hd, g0, ht, scale);
        }
    }
    if (raw) /* the scaled scores, before the softmax turns them into weights */
        for (int64_t g = 0; g < G; g++)
            memcpy(raw + g * rstride, sc[g], (size_t)n * sizeof(float));
    for (int64_t g = 0; g < G; g++)
        attn_softmax_step(p + g * (hd + 2), sc[g], n, hd);
    ws_read(ws, n * rowb);
    if (wide)
        kv_widen(kt, v, n * hd, rows);
    for (int64_t g0 = 0; g0 < G; g0 += ATTN_HT_ISA) {
        int64_t ht = G - g0 < ATTN_HT_ISA ? G - g0 : ATTN_HT_ISA;
        if (wide)
            attn_accum_tile(F32, p, sc, (const char *)rows, n, hd, g0, ht);
        else
            attn_accum_tile(kt, p, sc, v, n, hd, g0, ht);
    }
}

/* attn_chunk_kt for the cache's dtype kt (the f16 and bf16 versions only
 * where the schedule has such operands). */
static void attn_chunk(int kt, float *p, const float *q, const void *kh, const void *vh, int64_t t0, int64_t n,
                       int64_t hd, int64_t G, float scale, WStream *ws, float *raw, int64_t rstride)
{
    if (kt == DT_F16 && HAS_DT(DT_F16))
        attn_chunk_kt(DT_F16, p, q, kh, vh, t0, n, hd, G, scale, ws, raw, rstride);
    else if (kt == DT_BF16 && HAS_DT(DT_BF16))
        attn_chunk_kt(DT_BF16, p, q, kh, vh, t0, n, hd, G, scale, ws, raw, rstride);
    else
        attn_chunk_kt(DT_F32, p, q, kh, vh, t0, n, hd, G, scale, ws, raw, rstride);
}

/* The empty partial of G q heads: zeros, m = -inf, l = 0. */
static void attn_part_init(float *p, int64_t G, int64_t hd)
{
    for (int64_t g = 0; g < G; g++) {
        memset(p + g * (hd + 2), 0, (size_t)hd * sizeof(float));
        p[g * (hd + 2) + hd] = NEG_INF;
        p[g * (hd + 2) + hd + 1] = 0.0f;
    }
}

/* Partials of split s for the G q heads of kv head h over its rows of
 * [0, pos] (split_range); an empty split leaves zeros, -inf, 0. With
 * rope = 1 the q heads are rotated into a copy first. */
static void op_attn(const MegacArgs *a, const int64_t *in, WStream *ws)
{
    const float *q = opnd(a, in, 0), *rope = opnd(a, in, 4);
    const char *kc = opnd(a, in, 1), *vc = opnd(a, in, 2);
    float *part = opnd(a, in, 3);
    int64_t h = in[KT_PARAM], s = in[KT_PARAM + 1], nsplit = in[KT_PARAM + 2], block = in[KT_PARAM + 3];
    int64_t hd = SHAPE(KS_HEAD_DIM), G = SHAPE(KS_N_HEADS) / SHAPE(KS_N_KV_HEADS);
    int kt = kv_dtype(in, 1);
    float scale = 1.0f / sqrtf((float)hd);
    float *p = part + (h * nsplit + s) * G * (hd + 2);
    attn_part_init(p, G, hd);
    int64_t head = h * SHAPE(KS_MAX_SEQ) * hd * kv_esize(kt);
    const char *kh = kc + head, *vh = vc + head;
    int64_t lo, hi;
    split_range(a->pos + 1, block, s, nsplit, &lo, &hi);
    if (lo == hi)
        return;
    /* 64-byte aligned as q is: its 16-lane loads must not split cache lines */
    float qr[in[KT_PARAM + 4] && rope ? G * hd : 1] __attribute__((aligned(64)));
    const float *qh = q + h * G * hd;
    if (in[KT_PARAM + 4] && rope)
        rope_heads(a, qr, qh, G, rope), qh = qr;
    for (int64_t t0 = lo; t0 < hi; t0 += ATTN_CHUNK)
        attn_chunk(kt, p, qh, kh, vh, t0, hi - t0 < ATTN_CHUNK ? hi - t0 : ATTN_CHUNK, hd, G, scale, ws, NULL, 0);
}

/* out[q head] = sum_s o_s * e^(m_s - M) / sum_s l_s * e^(m_s - M), for
 * the q heads of kv heads [h, h + nh) */
static void op_attn_combine(const MegacArgs *a, const int64_t *in)
{
    const float *part = opnd(a, in, 0);
    float *out = opnd(a, in, 1);
    int64_t h0 = in[KT_PARAM], nsplit = in[KT_PARAM + 1], nh = in[KT_PARAM + 2];
    int64_t hd = SHAPE(KS_HEAD_DIM), G = SHAPE(KS_N_HEADS) / SHAPE(KS_N_KV_HEADS);
    for (int64_t h = h0; h < h0 + nh; h++)
        for (int64_t g = 0; g < G; g++) {
            float *o = out + (h * G + g) * hd;
            float M = NEG_INF, L = 0.0f;
            for (int64_t s = 0; s < nsplit; s++) {
                float m = part[((h * nsplit + s) * G + g) * (hd + 2) + hd];
                M = m > M ? m : M;
            }
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int64_t s = 0; s < nsplit; s++) {
                const float *p = part + ((h * nsplit + s) * G + g) * (hd + 2);
                if (p[hd] == NEG_INF)
                    continue;
                float e = expf(p[hd] - M);
                L += p[hd + 1] * e;
                for (int64_t d = 0; d < hd; d++)
                    o[d] += p[d] * e;
            }
            float inv = L > 0.0f ? 1.0f / L : 0.0f;
            for (int64_t d = 0; d < hd; d++)
                o[d] *= inv;
        }
}

/* ---- eviction and sparse attention (semantics: the comment above
 * SPARSE_SINK_WINDOW in ir/ops.h) ---- */

/* kc/vc[h][slot] = k/v of head h, meta[h][slot] = pos, with slot =
 * meta[h][cap] (KV_EVICT's choice at the previous step); pos 0 first
 * empties meta and points it at slot 0. meta: i32 [n_kv_heads][cap + 1]. */
static void op_kv_store(const MegacArgs *a, const int64_t *in)
{
    const float *k = opnd(a, in, 0), *v = opnd(a, in, 1);
    void *kc = opnd(a, in, 2), *vc = opnd(a, in, 3);
    int64_t h = in[KT_PARAM], cap = in[KT_PARAM + 1], hd = SHAPE(KS_HEAD_DIM);
    int kt = kv_dtype(in, 2);
    int32_t *meta = (int32_t *)opnd(a, in, 4) + h * (cap + 1);
    if (a->pos == 0) {
        for (int64_t t = 0; t < cap; t++)
            meta[t] = -1;
        meta[cap] = 0;
    }
    int64_t slot = meta[cap];
    /* KV_EVICT only writes slots in [0, cap) and pos 0 resets: a slot
     * outside cannot happen, but a corrupt state must not write past the
     * head's rows, so it is clamped to slot 0 */
    if (slot < 0 || slot >= cap)
        slot = 0;
    kv_put(kt, kc, (h * cap + slot) * hd, k + h * hd, hd);
    kv_put(kt, vc, (h * cap + slot) * hd, v + h * hd, hd);
    meta[slot] = (int32_t)a->pos;
}

/* The rows ATTN_SPARSE selects for one kv head, as runs of consecutive
 * rows in the order ops.h lists them (sinks then window; Quest's pages as
 * sel lists them; the filled slots). */
typedef struct SparseRuns {
    int64_t kind, a, b, n;      /* n = pos + 1 */
    const int32_t *sel;         /* SPARSE_QUEST: the head's sel[0:b]; SPARSE_SNAP: its snap[0:a+2] */
    int64_t i;                  /* the next run to look at */
} SparseRuns;

/* Run i of the selection as [*t0, *t1) (possibly empty, always inside
 * [0, n)); 0 when there is no run i. */
static int sparse_run(const SparseRuns *r, int64_t i, int64_t *t0, int64_t *t1)
{
    switch (r->kind) {
    case SPARSE_SINK_WINDOW:
        if (i > 1)
            return 0;
        *t0 = i == 0 ? 0 : (r->a > r->n - r->b ? r->a : r->n - r->b);
        *t1 = i == 0 ? (r->a < r->n ? r->a : r->n) : r->n;
        break;
    case SPARSE_QUEST: {
        if (i >= r->b)
            return 0;
        int64_t pg = r->sel[i], e = (pg + 1) * r->a;
        *t0 = pg < 0 ? 0 : pg * r->a; /* -1 padding: empty; pages past pos: empty */
        *t1 = pg < 0 ? 0 : (e < r->n ? e : r->n);
        break;
    }
    case SPARSE_SNAP: { /* a = the list's capacity; sel[0] = cut, sel[1] = n, sel[2:n+2] the kept rows */
        int64_t cut = r->sel[0], nk = r->sel[1] < 0 ? 0 : r->sel[1] > r->a ? r->a : r->sel[1];
        if (cut < 0 || cut >= r->n - 1) { /* never compressed: every row */
            if (i > 0)
                return 0;
            *t0 = 0, *t1 = r->n;
            break;
        }
        if (i > nk)
            return 0;
        int64_t t = i < nk ? r->sel[2 + i] : cut + 1;
        *t0 = t < 0 || t >= r->n ? 0 : t; /* outside [0, pos] (never, once compressed): empty */
        *t1 = t < 0 || t >= r->n ? 0 : i < nk ? t + 1 : r->n;
        break;
    }
    default: /* SPARSE_SLOTS: a = cap */
        if (i > 0)
            return 0;
        *t0 = 0;
        *t1 = r->a < r->n ? r->a : r->n;
        break;
    }
    if (*t0 > *t1)
        *t0 = *t1;
    return 1;
}

/* The next nonempty run, with the runs after it that start where it ends
 * merged in (so that a selection of every row is the single run [0, pos]
 * that OP_ATTN walks); 0 when none is left. */
static int sparse_next(SparseRuns *r, int64_t *t0, int64_t *t1)
{
    int64_t u0, u1;
    int found = 0;
    for (; sparse_run(r, r->i, &u0, &u1); r->i++) {
        if (u0 == u1)
            continue;
        if (found && u0 != *t1)
            break; /* run i starts the next call */
        if (!found)
            *t0 = u0;
        *t1 = u1;
        found = 1;
    }
    return found;
}

_Static_assert(SPARSE_BLOCK <= ATTN_CHUNK, "a block of attn_sparse must fit one attention chunk");

/* Partials of split s over the selected rows: their list, run after run,
 * cut into blocks of SPARSE_BLOCK, split s taking entries [lo, hi)
 * (split_range over the n entries). Each run's part of them is walked in
 * ATTN_CHUNK pieces from its start, as OP_ATTN walks its split's rows:
 * with every row selected (one run) the partials are OP_ATTN's at block
 * SPARSE_BLOCK, bit for bit. Slots with b = 1 also store the scaled
 * scores of the split's rows into its piece of aux (ops.h).
 * Only slots are in the worker's prefetch stream (their rows are [0, n),
 * known before the step; ws_advance walks the split's range as this
 * loop does). Quest's rows depend on sel, written this step, and the
 * window moves with pos: those ops report their reads to a detached
 * stream that never prefetches, since reporting them to the worker's
 * would count them against the GEMV rows it has asked for. */
static void op_attn_sparse(const MegacArgs *a, const int64_t *in, WStream *ws)
{
    const float *q = opnd(a, in, 0);
    const char *kc = opnd(a, in, 1), *vc = opnd(a, in, 2);
    float *part = opnd(a, in, 3), *aux = opnd(a, in, 4);
    int kt = kv_dtype(in, 1);
    int64_t h = in[KT_PARAM], s = in[KT_PARAM + 1], nsplit = in[KT_PARAM + 2], kind = in[KT_PARAM + 3];
    int64_t pa = in[KT_PARAM + 4], pb = in[KT_PARAM + 5];
    int64_t hd = SHAPE(KS_HEAD_DIM), G = SHAPE(KS_N_HEADS) / SHAPE(KS_N_KV_HEADS);
    float scale = 1.0f / sqrtf((float)hd);
    float *p = part + (h * nsplit + s) * G * (hd + 2);
    attn_part_init(p, G, hd);
    if (sparse_reads_list(kind) && !aux)
        return;
    int64_t rows = kind == SPARSE_SLOTS ? pa : SHAPE(KS_MAX_SEQ);
    const char *kh = kc + h * rows * hd * kv_esize(kt), *vh = vc + h * rows * hd * kv_esize(kt);
    const float *qh = q + h * G * hd;
    const int32_t *sel = kind == SPARSE_QUEST ? (const int32_t *)aux + h * pb
                         : kind == SPARSE_SNAP ? (const int32_t *)aux + h * (pa + 2)
                         : kind == SPARSE_ROWS ? (const int32_t *)aux + pa * pb
                                               : NULL;
    if (kind == SPARSE_ROWS) /* kv head pa's list of rows: Quest's pages of one row */
        kind = SPARSE_QUEST, pa = 1;
    SparseRuns r = {kind, pa, pb, a->pos + 1, sel, 0};
    int64_t nraw = sparse_score_rows(pa, nsplit); /* score entries per q head (slots with b = 1) */
    float *raw = kind == SPARSE_SLOTS && pb == 1 && aux ? aux + (h * nsplit + s) * G * nraw : NULL;
    WStream none = {.a = a, .ahead = INT64_MAX / 2}, *rs = kind == SPARSE_SLOTS ? ws : &none;
    int64_t t0, t1, lo = 0, hi = INT64_MAX, e = 0; /* e: selected rows before the run */
    if (nsplit > 1) {
        int64_t n = 0;
        for (SparseRuns c = r; sparse_next(&c, &t0, &t1);)
            n += t1 - t0;
        split_range(n, SPARSE_BLOCK, s, nsplit, &lo, &hi);
    }
    /* Runs shorter than SPARSE_GATHER (Kascade's and SnapKV's single rows,
     * scattered over the cache) are copied into gk/gv and attended
     * ATTN_CHUNK at a time: one row a call, each row's misses waited for
     * in turn, took ~200 cycles a row. Slots are one run. */
    int64_t rowb = hd * kv_esize(kt), ng = 0;
    bool gather = kind != SPARSE_SLOTS;
    char gk[gather ? ATTN_CHUNK * rowb : 1], gv[gather ? ATTN_CHUNK * rowb : 1];
    for (; e < hi && sparse_next(&r, &t0, &t1); e += t1 - t0) {
        int64_t len = t1 - t0, u0 = t0 + (lo <= e ? 0 : lo - e < len ? lo - e : len);
        int64_t u1 = t0 + (hi - e < len ? hi - e : len);
        if (gather && u1 - u0 < SPARSE_GATHER) {
            for (int64_t t = u0; t < u1; t++, ng++) {
                if (ng == ATTN_CHUNK)
                    attn_chunk(kt, p, qh, gk, gv, 0, ng, hd, G, scale, rs, NULL, 0), ng = 0;
                memcpy(gk + ng * rowb, kh + t * rowb, (size_t)rowb);
                memcpy(gv + ng * rowb, vh + t * rowb, (size_t)rowb);
            }
            continue;
        }
        if (ng)
            attn_chunk(kt, p, qh, gk, gv, 0, ng, hd, G, scale, rs, NULL, 0), ng = 0;
        for (int64_t c = u0; c < u1; c += ATTN_CHUNK)
            attn_chunk(kt, p, qh, kh, vh, c, u1 - c < ATTN_CHUNK ? u1 - c : ATTN_CHUNK, hd, G, scale, rs,
                       raw ? raw + (c - lo) : NULL, nraw);
    }
    if (ng)
        attn_chunk(kt, p, qh, gk, gv, 0, ng, hd, G, scale, rs, NULL, 0);
}

/* Elementwise min and max of the k rows [t0, t1) (t1 > t0) into lo, hi. */
static void quest_bounds(int kt, const void *k, int64_t t0, int64_t t1, int64_t hd, float *lo, float *hi)
{
    for (int64_t i = 0; i < hd; i++)
        lo[i] = hi[i] = kv_at(kt, k, t0 * hd + i);
    for (int64_t t = t0 + 1; t < t1; t++)
        for (int64_t i = 0; i < hd; i++) {
            float x = kv_at(kt, k, t * hd + i);
            lo[i] = x < lo[i] ? x : lo[i];
            hi[i] = x > hi[i] ? x : hi[i];
        }
}

/* U of one page for the G q heads of qh: the sum over heads and lanes of
 * max(q*lo, q*hi), 16 lanes at a time (a scalar sum is one dependent
 * chain per page: at 4000 positions it took a third of a SmolLM2 step). */
static float quest_bound(const float *qh, const float *lo, const float *hi, int64_t G, int64_t hd)
{
    v16f acc = {0};
    float tail = 0.0f;
    for (int64_t g = 0; g < G; g++) {
        const float *q = qh + g * hd;
        int64_t i = 0;
        for (; i + 16 <= hd; i += 16) {
            v16f qv = LOAD16(q + i);
            acc += __builtin_elementwise_max(qv * LOAD16(lo + i), qv * LOAD16(hi + i));
        }
        for (; i < hd; i++) {
            float x = q[i] * lo[i], y = q[i] * hi[i];
            tail += x > y ? x : y;
        }
    }
    return hsum16(&acc) + tail;
}

/* Whether candidate x ranks below candidate y: a smaller bound, or the
 * same bound and a later page. */
static int quest_below(const float *u, const int32_t *pg, int64_t x, int64_t y)
{
    return u[x] < u[y] || (u[x] == u[y] && pg[x] > pg[y]);
}

/* Sifts entry i down the heap of n candidates whose root ranks lowest. */
static void quest_sift(float *u, int32_t *pg, int64_t i, int64_t n)
{
    for (;;) {
        int64_t c = 2 * i + 1, m = i;
        if (c < n && quest_below(u, pg, c, m))
            m = c;
        if (c + 1 < n && quest_below(u, pg, c + 1, m))
            m = c + 1;
        if (m == i)
            return;
        float tu = u[i];
        int32_t tp = pg[i];
        u[i] = u[m], pg[i] = pg[m];
        u[m] = tu, pg[m] = tp;
        i = m;
    }
}

/* Quest's page selection for kv head h: the bounds of page c = pos/page
 * from kc rows [c*page, pos], then sel[h] = c and the npages-1 pages j < c
 * of largest U_j (ties: lower page), ascending, padded with -1.
 * The best npages-1 are kept in a heap whose root is the lowest ranked
 * (O(c log npages)); then the same heap code, with every bound equal,
 * sorts them by page (heapsort). The heap is a VLA of npages entries:
 * cpu_check.c refuses npages > CPU_QUEST_NPAGES_MAX (4096, 32 KB of
 * stack), while the pages scanned (c <= S/page) need no storage. */
static void op_quest_select(const MegacArgs *a, const int64_t *in)
{
    const float *q = opnd(a, in, 0);
    const char *kc = opnd(a, in, 1);
    float *bounds = opnd(a, in, 2);
    int kt = kv_dtype(in, 1);
    int64_t h = in[KT_PARAM], page = in[KT_PARAM + 1], np = in[KT_PARAM + 2];
    int64_t hd = SHAPE(KS_HEAD_DIM), G = SHAPE(KS_N_HEADS) / SHAPE(KS_N_KV_HEADS), S = SHAPE(KS_MAX_SEQ);
    int64_t pages = (S + page - 1) / page, c = a->pos / page;
    int32_t *sel = (int32_t *)opnd(a, in, 3) + h * np;
    const float *qh = q + h * G * hd;
    float *bh = bounds + h * pages * 2 * hd;
    quest_bounds(kt, kc + h * S * hd * kv_esize(kt), c * page, a->pos + 1, hd, bh + c * 2 * hd,
                 bh + c * 2 * hd + hd);
    int64_t keep = np - 1 < c ? np - 1 : c, n = 0;
    float u[keep + 1];
    int32_t pg[keep + 1];
    for (int64_t j = 0; j < c && keep > 0; j++) {
        float uj = quest_bound(qh, bh + j * 2 * hd, bh + j * 2 * hd + hd, G, hd);
        if (n < keep) { /* the first `keep` pages fill the heap */
            u[n] = uj, pg[n] = (int32_t)j;
            if (++n == keep)
                for (int64_t i = keep / 2 - 1; i >= 0; i--)
                    quest_sift(u, pg, i, keep);
        } else if (uj > u[0]) { /* a later page wins only with a larger bound */
            u[0] = uj, pg[0] = (int32_t)j;
            quest_sift(u, pg, 0, keep);
        }
    }
    u[n] = 0.0f, pg[n++] = (int32_t)c; /* page c, then all sorted by page */
    for (int64_t i = 0; i < n; i++)
        u[i] = 0.0f;
    for (int64_t i = n / 2 - 1; i >= 0; i--)
        quest_sift(u, pg, i, n);
    for (int64_t m = n - 1; m > 0; m--) { /* the root is the latest page left */
        int32_t t = pg[0];
        pg[0] = pg[m], pg[m] = t;
        quest_sift(u, pg, 0, m);
    }
    for (int64_t i = 0; i < np; i++)
        sel[i] = i < n ? pg[i] : -1;
}

/* An evicting layer's scores as its splits wrote them (ops.h): q head qh's
 * score of slot t < n sits in split s's piece, R entries per q head. */
typedef struct {
    const float *score;
    int64_t G, nsplit, R, n;
} EvictScores;

/* Split s's piece of q head qh: the score of its first slot. */
static const float *evict_piece_at(const EvictScores *e, int64_t qh, int64_t s)
{
    return e->score + ((qh / e->G * e->nsplit + s) * e->G + qh % e->G) * e->R;
}

/* Split s's piece of q head qh: its slots [*lo, *hi), the first at the
 * pointer returned. */
static const float *evict_piece(const EvictScores *e, int64_t qh, int64_t s, int64_t *lo, int64_t *hi)
{
    split_range(e->n, SPARSE_BLOCK, s, e->nsplit, lo, hi);
    return evict_piece_at(e, qh, s);
}

#define EVICT_CHUNK 256 /* slots whose weights or TOVA sums are kept at once */

/* Max m and sum z of e^(s - m) of q head qh's scores s[0:n], 16 slots at a
 * time (the exponentials in vector code, a chunk at a time: a scalar sum
 * of them took a tenth of a worker's step with TOVA at 512 slots); its
 * weights are p[t] = e^(s[t] - m) / z. */
static void evict_softmax(const EvictScores *e, int64_t qh, float *mz)
{
    v16f vm = {NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF,
               NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF};
    v16f vz = {0};
    float m = NEG_INF, z = 0.0f, w[EVICT_CHUNK];
    int64_t lo, hi;
    for (int64_t s = 0; s < e->nsplit; s++) {
        const float *x = evict_piece(e, qh, s, &lo, &hi);
        int64_t i = 0;
        for (; i + 16 <= hi - lo; i += 16)
            vm = __builtin_elementwise_max(vm, LOAD16(x + i)); /* maxnum: a NaN score is passed over */
        for (; i < hi - lo; i++)
            m = x[i] > m ? x[i] : m;
    }
    for (int j = 0; j < 16; j++)
        m = vm[j] > m ? vm[j] : m;
    for (int64_t s = 0; s < e->nsplit; s++) {
        const float *x = evict_piece(e, qh, s, &lo, &hi);
        for (int64_t c = 0; c < hi - lo; c += EVICT_CHUNK) {
            int64_t len = hi - lo - c < EVICT_CHUNK ? hi - lo - c : EVICT_CHUNK, i = 0;
            for (int64_t j = 0; j < len; j++)
                w[j] = exp_nonpos(x[c + j] - m);
            for (; i + 16 <= len; i += 16)
                vz += LOAD16(w + i);
            for (; i < len; i++)
                z += w[i];
        }
    }
    mz[0] = m;
    mz[1] = z + hsum16(&vz);
}

/* TOVA's victim: the slot t < n of least p averaged over all nh q heads
 * (the lowest slot on ties), summed EVICT_CHUNK slots of a split at a
 * time so that each head's scores are read in order and nothing of size
 * cap is on the stack. mz: each q head's max and sum (evict_softmax). */
static int64_t evict_tova(const EvictScores *e, const float *mz, int64_t nh)
{
    int64_t best = -1, lo, hi;
    float bestv = 0.0f;
    for (int64_t s = 0; s < e->nsplit; s++) {
        split_range(e->n, SPARSE_BLOCK, s, e->nsplit, &lo, &hi);
        for (int64_t t0 = lo; t0 < hi; t0 += EVICT_CHUNK) {
            int64_t len = hi - t0 < EVICT_CHUNK ? hi - t0 : EVICT_CHUNK;
            float sum[EVICT_CHUNK] = {0};
            for (int64_t qh = 0; qh < nh; qh++) {
                const float *x = evict_piece_at(e, qh, s) + (t0 - lo);
                for (int64_t i = 0; i < len; i++)
                    sum[i] += exp_nonpos(x[i] - mz[2 * qh]) / mz[2 * qh + 1];
            }
            for (int64_t i = 0; i < len; i++) {
                float v = sum[i] / (float)nh;
                if (best < 0 || v < bestv)
                    best = t0 + i, bestv = v;
            }
        }
    }
    return best < 0 ? 0 : best;
}

/* The victim among the cap slots of one kv head (m: its meta, ac: its H2O
 * acc, tova: TOVA's layer-wide choice or -1), the lowest slot on ties:
 * STREAMING the oldest position >= sinks, H2O the least acc among
 * positions <= pos - window. With no candidate (the validated params rule
 * that out) the slot of the oldest position. */
static int64_t evict_victim(int64_t pol, const int32_t *m, const float *ac, int64_t tova, int64_t cap,
                            int64_t sinks, int64_t window, int64_t pos)
{
    int64_t v = pol == KV_POLICY_TOVA ? tova : -1;
    for (int64_t t = 0; pol == KV_POLICY_STREAMING && t < cap; t++)
        if (m[t] >= sinks && (v < 0 || m[t] < m[v]))
            v = t;
    for (int64_t t = 0; pol == KV_POLICY_H2O && ac && t < cap; t++)
        if (m[t] <= pos - window && (v < 0 || ac[t] < ac[v]))
            v = t;
    if (v < 0) {
        v = 0;
        for (int64_t t = 1; t < cap; t++)
            v = m[t] < m[v] ? t : v;
    }
    return v;
}

/* Every kv head of a layer: with n = min(pos+1, cap) slots filled, p =
 * each q head's softmax of its scores over slots [0, n); H2O adds p,
 * summed over the kv head's q heads, into acc (zeroed at pos 0). Then
 * meta[h][cap] = pos+1 while that is < cap, else the policy's victim (H2O
 * zeroes its acc for the newcomer; TOVA's is the same for every head). */
static void op_kv_evict(const MegacArgs *a, const int64_t *in)
{
    const float *score = opnd(a, in, 0);
    int32_t *meta = opnd(a, in, 1);
    float *acc = opnd(a, in, 2);
    int64_t pol = in[KT_PARAM], cap = in[KT_PARAM + 1], sinks = in[KT_PARAM + 2], window = in[KT_PARAM + 3];
    int64_t nsplit = in[KT_PARAM + 4];
    int64_t nh = SHAPE(KS_N_HEADS), nkv = SHAPE(KS_N_KV_HEADS), G = nh / nkv, pos = a->pos;
    int64_t n = pos + 1 < cap ? pos + 1 : cap;
    EvictScores e = {score, G, nsplit, sparse_score_rows(cap, nsplit), n};
    float mz[2 * nh];
    if (pol == KV_POLICY_STREAMING)
        score = NULL;
    for (int64_t qh = 0; score && qh < nh; qh++)
        evict_softmax(&e, qh, mz + 2 * qh);
    if (pol != KV_POLICY_H2O)
        acc = NULL;
    if (acc && pos == 0)
        memset(acc, 0, (size_t)(nkv * cap) * sizeof(float));
    for (int64_t qh = 0; acc && score && qh < nh; qh++) {
        float *ac = acc + qh / G * cap;
        for (int64_t s = 0, lo, hi; s < nsplit; s++) {
            const float *x = evict_piece(&e, qh, s, &lo, &hi);
            for (int64_t t = lo; t < hi; t++)
                ac[t] += exp_nonpos(x[t - lo] - mz[2 * qh]) / mz[2 * qh + 1];
        }
    }
    int64_t tova = pol == KV_POLICY_TOVA && score && pos + 1 >= cap ? evict_tova(&e, mz, nh) : -1;
    for (int64_t h = 0; h < nkv; h++) {
        int32_t *m = meta + h * (cap + 1);
        if (pos + 1 < cap) {
            m[cap] = (int32_t)(pos + 1);
            continue;
        }
        int64_t v = evict_victim(pol, m, acc ? acc + h * cap : NULL, tova, cap, sinks, window, pos);
        if (acc)
            acc[h * cap + v] = 0.0f;
        m[cap] = (int32_t)v;
    }
}

/* ---- SnapKV (semantics: ir/ops.h) ---- */

/* A float's key in an order of unsigned integers (larger float, larger key). */
static uint32_t snap_key(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

/* Adds query qv's softmax weights over the alive rows <= w of one kv head
 * (sh: its snap, L its list's capacity; kh: its rows), divided by G, into
 * s[t] for t < w0; lg: scratch by position. */
static void snap_score_query(int kt, const int32_t *sh, int64_t L, int64_t pos, const char *kh, const float *qv,
                             int64_t w, int64_t w0, int64_t hd, float inv_g, float *s, float *lg)
{
    float scale = 1.0f / sqrtf((float)hd), m = NEG_INF, z = 0.0f;
    SparseRuns r = {SPARSE_SNAP, L, 0, pos + 1, sh, 0};
    int64_t t0, t1;
    while (sparse_next(&r, &t0, &t1) && t0 <= w)
        for (int64_t t = t0; t < t1 && t <= w; t++) {
            lg[t] = kv_dot(kt, qv, kh + t * hd * kv_esize(kt), hd) * scale;
            m = lg[t] > m ? lg[t] : m;
        }
    r.i = 0;
    while (sparse_next(&r, &t0, &t1) && t0 <= w)
        for (int64_t t = t0; t < t1 && t <= w; t++)
            z += exp_nonpos(lg[t] - m);
    r.i = 0;
    while (sparse_next(&r, &t0, &t1) && t0 < w0)
        for (int64_t t = t0; t < t1 && t < w0; t++)
            s[t] += exp_nonpos(lg[t] - m) / z * inv_g;
}

/* One kv head's pooled scores: pl[t] for its alive rows t < w0 (the
 * scored ones; -1 for the others), the window queries' weights summed into
 * s first. Returns how many alive rows the window holds (*nsc: scored). */
static int64_t snap_score(int kt, const int32_t *sh, int64_t L, int64_t W, int64_t pos, const char *kh,
                          const float *qwin, int64_t h, int64_t G, int64_t nh, int64_t hd, float *s, float *lg,
                          float *pl, int64_t *nsc)
{
    int64_t w0 = pos - W + 1 > 0 ? pos - W + 1 : 0, nwin = 0, t0, t1;
    SparseRuns r = {SPARSE_SNAP, L, 0, pos + 1, sh, 0};
    *nsc = 0;
    for (int64_t t = 0; t < w0; t++)
        s[t] = -1.0f; /* not alive */
    while (sparse_next(&r, &t0, &t1))
        for (int64_t t = t0; t < t1; t++) {
            if (t < w0)
                s[t] = 0.0f, ++*nsc;
            else
                nwin++;
        }
    for (int64_t w = w0; w <= pos; w++)
        for (int64_t g = 0; g < G; g++)
            snap_score_query(kt, sh, L, pos, kh, qwin + ((w % W) * nh + h * G + g) * hd, w, w0, hd, 1.0f / (float)G,
                             s, lg);
    for (int64_t t = 0; t < w0; t++) { /* max pool, kernel 7, over the scored rows */
        float v = -1.0f;
        for (int64_t u = t - 3 < 0 ? 0 : t - 3; s[t] >= 0.0f && u <= t + 3 && u < w0; u++)
            v = s[u] > v ? s[u] : v;
        pl[t] = v;
    }
    return nwin;
}

/* A radix select (4 passes of 8 bits) of the K largest values >= 0 among
 * v[h * S + t], h < nseg, t < n: *T, the key of the K-th largest, and
 * *take, how many keys equal to T to take, the first in the order h, t.
 * The selected: v >= 0 with key > T, or key == T while take lasts. */
static void radix_select(const float *v, int64_t nseg, int64_t S, int64_t n, int64_t K, uint32_t *T, int64_t *take)
{
    int64_t rank = K;
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        int64_t bins[256] = {0};
        for (int64_t h = 0; h < nseg; h++)
            for (int64_t t = 0; t < n; t++) {
                uint32_t k = snap_key(v[h * S + t]);
                if (v[h * S + t] >= 0.0f && (k & mask) == prefix)
                    bins[(k >> shift) & 255u]++;
            }
        int b = 255;
        int64_t above = 0; /* keys matching the prefix with a larger digit: kept */
        for (; b > 0 && above + bins[b] < rank; b--)
            above += bins[b];
        rank -= above;
        prefix |= (uint32_t)b << shift;
        mask |= 255u << shift;
    }
    *T = prefix, *take = rank;
}

/* Every step: pos 0 clears every head's cut; q into qwin[pos % window].
 * At the prompt's last step (MegacArgs.prompt_end), when some kv head has
 * more than `budget` rows alive, the layer is compressed (ops.h): every
 * head's pooled scores into pl[h] (snap_score); each head's `sure` best
 * raised to +inf; then one select over all heads takes the sum of their
 * quotas (the raised rows first); each head's list, the taken rows and
 * its window, goes through s (free by then) into its snap. sc: [nkv + 2][S]
 * scratch, scores and logits by position, then the heads' pooled scores. */
static void op_kv_snap(const MegacArgs *a, const int64_t *in)
{
    const float *q = opnd(a, in, 0);
    const char *kc = opnd(a, in, 1);
    float *qwin = opnd(a, in, 2), *sc = opnd(a, in, 4);
    int kt = kv_dtype(in, 1);
    int32_t *snap = opnd(a, in, 3);
    int64_t C = in[KT_PARAM], W = in[KT_PARAM + 1], safe = in[KT_PARAM + 2], pos = a->pos;
    int64_t hd = SHAPE(KS_HEAD_DIM), nh = SHAPE(KS_N_HEADS), nkv = SHAPE(KS_N_KV_HEADS), S = SHAPE(KS_MAX_SEQ);
    int64_t L = snap_list_cap(C, safe, nkv, S), stride = L + 2;
    if (pos == 0)
        for (int64_t h = 0; h < nkv; h++)
            snap[h * stride] = -1;
    memcpy(qwin + (pos % W) * nh * hd, q, (size_t)(nh * hd) * sizeof(float));
    if (pos != a->prompt_end)
        return;
    int over = 0;
    for (int64_t h = 0; h < nkv; h++) {
        const int32_t *sh = snap + h * stride;
        int64_t cut = sh[0], n = cut >= 0 && cut < pos ? sh[1] + pos - cut : pos + 1;
        over |= n > C;
    }
    if (!over)
        return;
    float *s = sc, *pl = sc + 2 * S;
    int64_t w0 = pos - W + 1 > 0 ? pos - W + 1 : 0, total = 0, take, t0, t1;
    uint32_t T;
    for (int64_t h = 0; h < nkv; h++) {
        int64_t nsc, nwin = snap_score(kt, snap + h * stride, L, W, pos, kc + h * S * hd * kv_esize(kt), qwin, h,
                                       nh / nkv, nh, hd, s, sc + S, pl + h * S, &nsc);
        int64_t quota = C - nwin < nsc ? C - nwin : nsc, sure = safe < quota ? safe : quota;
        total += quota;
        if (sure <= 0)
            continue;
        float *ph = pl + h * S;
        radix_select(ph, 1, S, w0, sure, &T, &take);
        for (int64_t t = 0; t < w0; t++) {
            uint32_t k = snap_key(ph[t]);
            if (ph[t] >= 0.0f && (k > T || (k == T && take-- > 0)))
                ph[t] = INFINITY;
        }
    }
    radix_select(pl, nkv, S, w0, total, &T, &take);
    for (int64_t h = 0; h < nkv; h++) {
        int32_t *sh = snap + h * stride;
        const float *ph = pl + h * S;
        int64_t n = 0;
        for (int64_t t = 0; t < w0; t++) {
            uint32_t k = snap_key(ph[t]);
            if (ph[t] >= 0.0f && (k > T || (k == T && take-- > 0)))
                s[n++] = (float)t;
        }
        SparseRuns r = {SPARSE_SNAP, L, 0, pos + 1, sh, 0};
        while (sparse_next(&r, &t0, &t1)) /* the window */
            for (int64_t t = t0 > w0 ? t0 : w0; t < t1; t++)
                s[n++] = (float)t;
        for (int64_t i = 0; i < n; i++) /* n <= L: at most the layer's budget, or the head's budget when flat */
            sh[2 + i] = (int32_t)s[i];
        sh[0] = (int32_t)pos, sh[1] = (int32_t)n;
    }
}

/* ---- Kascade's top-k rows (semantics: ir/ops.h, TOPK_SELECT) ---- */

/* lg[g * S + t] = scale * q_g . k_t for rows t < n, in chunks of
 * ATTN_CHUNK rows by attention's own score tiles (each k row read once for
 * all G q heads; rows of an f16/bf16 cache of hd % 16 != 0 widened first). */
static inline __attribute__((always_inline)) void topk_logits_kt(int kt, const float *q, const char *kh, int64_t n,
                                                                int64_t hd, int64_t G, float scale, float *lg,
                                                                int64_t S)
{
    enum { F32 = DT_F32 };
    int wide = kt != DT_F32 && hd % 16;
    float sc[G][ATTN_CHUNK], rows[wide ? ATTN_CHUNK * hd : 1];
    int64_t rowb = hd * kv_esize(kt);
    for (int64_t c0 = 0; c0 < n; c0 += ATTN_CHUNK) {
        int64_t len = n - c0 < ATTN_CHUNK ? n - c0 : ATTN_CHUNK;
        const char *k = kh + c0 * rowb;
        if (wide)
            kv_widen(kt, k, len * hd, rows);
        for (int64_t i = 0; i < len; i += 4) {
            int64_t m = len - i < 4 ? len - i : 4;
            for (int64_t g0 = 0; g0 < G; g0 += ATTN_HT_ISA) {
                int64_t ht = G - g0 < ATTN_HT_ISA ? G - g0 : ATTN_HT_ISA;
                if (wide)
                    attn_scores_tile(F32, sc, q, (const char *)(rows + i * hd), i, m, hd, g0, ht, scale);
                else
                    attn_scores_tile(kt, sc, q, k + i * rowb, i, m, hd, g0, ht, scale);
            }
        }
        for (int64_t g = 0; g < G; g++)
            memcpy(lg + g * S + c0, sc[g], (size_t)len * sizeof(float));
    }
}

static void topk_logits(int kt, const float *q, const char *kh, int64_t n, int64_t hd, int64_t G, float scale,
                        float *lg, int64_t S)
{
    if (kt == DT_F16 && HAS_DT(DT_F16))
        topk_logits_kt(DT_F16, q, kh, n, hd, G, scale, lg, S);
    else if (kt == DT_BF16 && HAS_DT(DT_BF16))
        topk_logits_kt(DT_BF16, q, kh, n, hd, G, scale, lg, S);
    else
        topk_logits_kt(DT_F32, q, kh, n, hd, G, scale, lg, S);
}

/* kv head h's rows at pos: the logits of its G q heads by row into lg
 * ([G][S], topk_logits), each q head's softmax added into p,
 * then pos and the k - 1 rows < pos of largest p (radix_select, ties to
 * the lower row) into sel, ascending, -1 padded. */
static void op_topk_select(const MegacArgs *a, const int64_t *in)
{
    const float *q = opnd(a, in, 0);
    const char *kc = opnd(a, in, 1);
    float *sc = opnd(a, in, 2);
    int kt = kv_dtype(in, 1);
    int64_t h = in[KT_PARAM], k = in[KT_PARAM + 1], pos = a->pos;
    int64_t hd = SHAPE(KS_HEAD_DIM), G = SHAPE(KS_N_HEADS) / SHAPE(KS_N_KV_HEADS), S = SHAPE(KS_MAX_SEQ);
    int64_t rows = topk_rows(k, in[KT_PARAM + 2], in[KT_PARAM + 3], pos + 1);
    int32_t *sel = (int32_t *)opnd(a, in, 3) + h * k;
    float *lg = sc + h * (G + 1) * S, *p = lg + G * S, scale = 1.0f / sqrtf((float)hd);
    const char *kh = kc + h * S * hd * kv_esize(kt);
    const float *qh = q + h * G * hd;
    topk_logits(kt, qh, kh, pos + 1, hd, G, scale, lg, S);
    for (int64_t t = 0; t <= pos; t++)
        p[t] = 0.0f;
    for (int64_t g = 0; g < G; g++) { /* vector loops: max, exponentials, their sum, p (as evict_softmax) */
        v16f vm = {NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF,
                   NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF};
        v16f vz = {0};
        float m = NEG_INF, z = 0.0f, *lgg = lg + g * S;
        int64_t t = 0;
        for (; t + 16 <= pos + 1; t += 16)
            vm = __builtin_elementwise_max(vm, LOAD16(lgg + t));
        for (; t <= pos; t++)
            m = lgg[t] > m ? lgg[t] : m;
        for (int j = 0; j < 16; j++)
            m = vm[j] > m ? vm[j] : m;
        for (t = 0; t <= pos; t++)
            lgg[t] = exp_nonpos(lgg[t] - m);
        for (t = 0; t + 16 <= pos + 1; t += 16)
            vz += LOAD16(lgg + t);
        for (; t <= pos; t++)
            z += lgg[t];
        float inv = 1.0f / (z + hsum16(&vz));
        for (t = 0; t <= pos; t++)
            p[t] += lgg[t] * inv;
    }
    int64_t keep = rows - 1, take, n = 0;
    uint32_t T;
    radix_select(p, 1, S, pos, keep, &T, &take);
    for (int64_t t = 0; t < pos && keep > 0; t++) {
        uint32_t key = snap_key(p[t]);
        if (key > T || (key == T && take-- > 0))
            sel[n++] = (int32_t)t;
    }
    sel[n++] = (int32_t)pos;
    while (n < k)
        sel[n++] = -1;
}

/* silu(g) u = g sigmoid(g) u, with e^-|g| from exp_nonpos (one vector
 * loop; libm's expf per element took ~2% of a SmolLM2 step):
 * sigmoid(g) = 1 / (1 + e^-g) for g >= 0, e^g / (1 + e^g) below. */
static void op_silu_mul(const MegacArgs *a, const int64_t *in)
{
    const float *g = opnd(a, in, 0), *u = opnd(a, in, 1);
    float *out = opnd(a, in, 2);
    for (int64_t r = in[KT_PARAM]; r < in[KT_PARAM + 1]; r++) {
        float x = g[r], t = exp_nonpos(-__builtin_fabsf(x));
        out[r] = x * ((x >= 0.0f ? 1.0f : t) / (1.0f + t)) * u[r];
    }
}

static void op_add(const MegacArgs *a, const int64_t *in)
{
    float *x = opnd(a, in, 0);
    const float *y = opnd(a, in, 1);
    for (int64_t r = in[KT_PARAM]; r < in[KT_PARAM + 1]; r++)
        x[r] += y[r];
}

/* amax[slot] = (max of x[r0:r1], first index of it): what a scan that
 * takes x[r] when x[r] > best gives from best = -inf, idx = r0 (a NaN
 * never wins; all -inf or NaN give -inf at r0). In two vector passes, the
 * maximum and then the first index that holds it, where that scan's
 * dependent compare and branch per element took ~3 TSC cycles each
 * (SmolLM2-135M's 24,576 logits a worker: 1.3% of a Q4_0 step). */
static void op_argmax(const MegacArgs *a, const int64_t *in)
{
    const float *x = opnd(a, in, 0);
    float *amax = opnd(a, in, 1);
    int64_t r0 = in[KT_PARAM], r1 = in[KT_PARAM + 1], slot = in[KT_PARAM + 2], r = r0;
    float best = NEG_INF;
    v16f vb = best - (v16f){0};
    for (; r + 16 <= r1; r += 16) {
        v16f v = LOAD16(x + r);
        v16i32 gt = (v16i32)(v > vb);
        vb = (v16f)(((v16i32)v & gt) | ((v16i32)vb & ~gt));
    }
    for (int l = 0; l < 16; l++)
        best = vb[l] > best ? vb[l] : best;
    for (; r < r1; r++)
        best = x[r] > best ? x[r] : best;
    int64_t idx = r0;
    if (best > NEG_INF) {
        v16f vbest = best - (v16f){0};
        for (idx = r0; idx + 16 <= r1; idx += 16) {
            v16i32 eq = (v16i32)(LOAD16(x + idx) == vbest);
            uint32_t m = 0;
            for (int l = 0; l < 16; l++)
                m |= (uint32_t)(eq[l] & 1) << l;
            if (m) {
                idx += __builtin_ctz(m);
                break;
            }
        }
        while (x[idx] != best) /* the tail: best is there */
            idx++;
    }
    amax[2 * slot] = best;
    amax[2 * slot + 1] = (float)idx;
}

/* out[0] = index of the largest partial; the lowest index wins ties. */
static void op_argmax_combine(const MegacArgs *a, const int64_t *in)
{
    const float *amax = opnd(a, in, 0);
    int64_t nslot = in[KT_PARAM];
    float best = amax[0], idx = amax[1];
    for (int64_t i = 1; i < nslot; i++) {
        float v = amax[2 * i], j = amax[2 * i + 1];
        if (v > best || (v == best && j < idx)) {
            best = v;
            idx = j;
        }
    }
    if (opnd_dtype(in, 1) == DT_I32)
        *(int32_t *)opnd(a, in, 1) = (int32_t)idx;
    else
        *(float *)opnd(a, in, 1) = idx;
}

static void op_run(const MegacArgs *a, const int64_t *in, WStream *ws)
{
    /* each case only when the schedule has the op: the others compile away */
#define RUN(o, call) \
    case o:          \
        if (HAS_OP(o)) \
            call;      \
        break;
    switch (in[KT_OP]) {
    RUN(OP_EMBED, op_embed(a, in))
    RUN(OP_RMSNORM, op_rmsnorm(a, in))
    RUN(OP_ROPE, op_rope(a, in))
    RUN(OP_KV_APPEND, op_kv_append(a, in))
    RUN(OP_ATTN, op_attn(a, in, ws))
    RUN(OP_ATTN_COMBINE, op_attn_combine(a, in))
    RUN(OP_SILU_MUL, op_silu_mul(a, in))
    RUN(OP_ADD, op_add(a, in))
    RUN(OP_ARGMAX, op_argmax(a, in))
    RUN(OP_ARGMAX_COMBINE, op_argmax_combine(a, in))
    RUN(OP_KV_STORE, op_kv_store(a, in))
    RUN(OP_ATTN_SPARSE, op_attn_sparse(a, in, ws))
    RUN(OP_QUEST_SELECT, op_quest_select(a, in))
    RUN(OP_KV_EVICT, op_kv_evict(a, in))
    RUN(OP_KV_SNAP, op_kv_snap(a, in))
    RUN(OP_TOPK_SELECT, op_topk_select(a, in))
    default: break;
    }
#undef RUN
}

/* ---- synchronization ---- */

/* A wait spins in batches of pauses, yields its CPU after WAIT_YIELD_NS
 * (to any other thread that wants it) and sleeps on a futex after
 * WAIT_SLEEP_AFTER_NS, so that with more workers than CPUs the worker it
 * waits for gets the core (stories260K at 8 workers on 2 cores: 22 tok/s
 * with yields alone, 475 with the futex). A worker with a CPU of its own
 * (MegacArgs.spin_ns, set by the runtime) sleeps only after spin_ns: on a
 * 2-vCPU KVM guest a futex sleeper took ~0.3 ms to wake (its vCPU had gone
 * idle), and SmolLM2 at 2 workers slept in 270-690 of each worker's
 * ~30600 waits in 204 steps (those past 0.13 ms), which held 3-10% of its
 * cycles. But a yield that keeps the CPU away for WAIT_YIELD_TAKEN_NS says
 * the CPUs are shared after all (another program is running): the wait
 * then sleeps at once, leaving the CPU to that program or to the worker it
 * waits for (SmolLM2 at 2 workers beside a two-job build: 12.5 -> 35
 * tok/s). */
#define WAIT_SPIN_BATCH 64          /* pauses between clock checks */
#define WAIT_YIELD_NS 16000         /* spinning before yielding */
#define WAIT_SLEEP_AFTER_NS 128000  /* shared CPUs: waiting before sleeping */
#define WAIT_SLEEP_NS 1000000       /* a sleeper re-checks the deadline this often */
#define WAIT_YIELD_TAKEN_NS 50000   /* a yield this long: the CPU is shared now */
#define WAIT_DEFAULT_NS 2000000000ull
/* Bit 31 of a counter says "someone sleeps on me": a signal that sees it
 * wakes the sleepers. Counts stay below 2^31 (the validator bounds them by
 * the schedule's signals); waits compare the low 31 bits. */
#define CTR_SLEEPERS 0x80000000u
#define CTR_COUNT(v) ((v) & ~CTR_SLEEPERS)

static uint64_t now_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void cpu_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int abort_seen(const MegacArgs *a)
{
    return a->abort_info && __atomic_load_n(&a->abort_info->flag, __ATOMIC_ACQUIRE) != 0;
}

/* The first worker to give up records where; the others just return. */
static void abort_record(const MegacArgs *a, uint32_t flag, uint32_t worker, uint32_t pc, uint32_t ctr,
                         uint32_t value, uint32_t threshold)
{
    uint32_t zero = 0;
    MegacAbort *ab = a->abort_info;
    if (!ab || !__atomic_compare_exchange_n(&ab->flag, &zero, flag, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    ab->worker = worker;
    ab->pc = pc;
    ab->counter = ctr;
    ab->value = value;
    ab->threshold = threshold;
}

/* signal c +k: release, then wake sleepers if any. */
static void sync_signal(const MegacArgs *a, uint32_t c, uint32_t k)
{
    uint32_t *ctr = a->counters + c;
    uint32_t old = __atomic_fetch_add(ctr, k, __ATOMIC_RELEASE);
    if (old & CTR_SLEEPERS)
        syscall(SYS_futex, ctr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

/* Sleeps until *ctr changes from `seen` (or a short timeout passes). Used
 * only after spinning, when the producer is probably not running: with more
 * workers than cores, spinning would take the core from it. */
static void sync_sleep(uint32_t *ctr, uint32_t seen)
{
    uint32_t v = seen | CTR_SLEEPERS;
    if (!(seen & CTR_SLEEPERS) &&
        !__atomic_compare_exchange_n(ctr, &seen, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;     /* it moved: re-check */
    struct timespec ts = {0, WAIT_SLEEP_NS};
    syscall(SYS_futex, ctr, FUTEX_WAIT_PRIVATE, v, &ts, NULL, 0);
}

/* wait c >= n. Returns 0 when the worker must stop (deadline or abort). */
static int sync_wait(const MegacArgs *a, uint32_t worker, uint32_t pc, uint32_t c, uint32_t n)
{
    uint32_t *ctr = a->counters + c;
    if (CTR_COUNT(__atomic_load_n(ctr, __ATOMIC_ACQUIRE)) >= n)
        return 1;
    uint64_t limit = a->timeout_ns ? a->timeout_ns : WAIT_DEFAULT_NS;
    uint64_t sleep_after = a->spin_ns ? a->spin_ns : WAIT_SLEEP_AFTER_NS;
    uint64_t t0 = now_ns();
    int contended = 0;
    for (;;) {
        uint32_t v = 0;
        for (int i = 0; i < WAIT_SPIN_BATCH; i++) {
            v = __atomic_load_n(ctr, __ATOMIC_ACQUIRE);
            if (CTR_COUNT(v) >= n)
                return 1;
            cpu_pause();
        }
        if (abort_seen(a))
            return 0;
        uint64_t waited = now_ns() - t0;
        if (waited > limit) {
            /* one last look: a signal that came at the deadline is no abort,
             * and the value recorded is the one that was short */
            v = __atomic_load_n(ctr, __ATOMIC_ACQUIRE);
            if (CTR_COUNT(v) >= n)
                return 1;
            abort_record(a, KT_ABORT_TIMEOUT, worker, pc, c, CTR_COUNT(v), n);
            return 0;
        }
        if (waited > sleep_after || contended)
            sync_sleep(ctr, v);
        else if (waited > WAIT_YIELD_NS) {
            uint64_t y0 = now_ns();
            sched_yield();
            /* a yield that gave the CPU away for a while: other threads
             * want this CPU, and spinning on it keeps one of them (maybe the
             * worker this wait is for) off it */
            contended = now_ns() - y0 > WAIT_YIELD_TAKEN_NS;
        }
    }
}

/* ---- cycle profile (cmake -DMEGAC_CPU_PROFILE=ON; off by default) ----
 * Per worker: TSC cycles in each op kind and in waits, the GEMVs' weight
 * bytes (and both by weight dtype, and by run class: the row length k and
 * the run's bytes rounded down to a power of two, the first PROF_CLASSES
 * seen), and the steps run; printed to stderr
 * when kernel.so is unloaded (process exit). A developer's tool: the counters are plain per-worker
 * slots, written only by their worker. */
#ifdef MEGAC_CPU_PROFILE
#include <stdio.h>
#define PROF_WORKERS 64
#define PROF_CLASSES 16
enum { PROF_WAIT = OP_COUNT, PROF_SIGNAL, PROF_SLOTS };
struct ProfClass {
    int64_t k;
    int lg;
    uint64_t cyc, prep, bytes, runs, head_cyc, head_bytes;
};
static struct {
    uint64_t cyc[PROF_SLOTS], gemv_bytes, steps, gemv_prep;
    uint64_t dt_cyc[DT_COUNT], dt_bytes[DT_COUNT]; /* GEMVs by weight dtype */
    struct ProfClass cls[PROF_CLASSES]; /* GEMV runs by class */
    int ncls;
    char pad[64];
} prof[PROF_WORKERS];
static const char *const prof_dt_names[DT_COUNT] = {
#define X(n, s, b, bb) s,
    DTYPE_LIST(X)
#undef X
};
static const char *const prof_names[PROF_SLOTS] = {
#define X(n, s, o, p, m) s,
    OP_LIST(X)
#undef X
    "wait", "signal"};

static uint64_t prof_now(void)
{
    return __builtin_ia32_rdtsc();
}

__attribute__((destructor)) static void prof_print(void)
{
    for (uint32_t w = 0; w < megac_k_nworkers && w < PROF_WORKERS; w++) {
        uint64_t tot = 0;
        for (int i = 0; i < PROF_SLOTS; i++)
            tot += prof[w].cyc[i];
        if (!prof[w].steps || !tot)
            continue;
        fprintf(stderr, "megac profile: worker %u, %lu steps, %.0f kcycles/step:", w, (unsigned long)prof[w].steps,
                (double)tot / 1e3 / (double)prof[w].steps);
        for (int i = 0; i < PROF_SLOTS; i++)
            if (prof[w].cyc[i])
                fprintf(stderr, " %s %.1f%%", prof_names[i], 100.0 * (double)prof[w].cyc[i] / (double)tot);
        fprintf(stderr, "; gemv %.2f bytes/cycle, inputs %.1f%%",
                prof[w].cyc[OP_GEMV] ? (double)prof[w].gemv_bytes / (double)prof[w].cyc[OP_GEMV] : 0.0,
                100.0 * (double)prof[w].gemv_prep / (double)tot);
        for (int t = 0; t < DT_COUNT; t++)
            if (prof[w].dt_cyc[t])
                fprintf(stderr, "; %s %.1f%% at %.2f", prof_dt_names[t],
                        100.0 * (double)prof[w].dt_cyc[t] / (double)tot,
                        (double)prof[w].dt_bytes[t] / (double)prof[w].dt_cyc[t]);
        fputc('\n', stderr);
        for (int c = 0; c < prof[w].ncls; c++) {
            const struct ProfClass *r = &prof[w].cls[c];
            uint64_t rows = r->cyc - r->prep, rest = r->bytes - r->head_bytes;
            fprintf(stderr,
                    "  gemv runs of k %ld, %lu-%lu KiB: %.1f a step, %.1f%% of cycles, %.2f bytes/cycle; "
                    "inputs %.1f%% of cycles, rows %.2f bytes/cycle",
                    (long)r->k, (unsigned long)(1ul << r->lg >> 10), (unsigned long)(2ul << r->lg >> 10),
                    (double)r->runs / (double)prof[w].steps, 100.0 * (double)r->cyc / (double)tot,
                    (double)r->bytes / (double)r->cyc, 100.0 * (double)r->prep / (double)tot,
                    (double)r->bytes / (double)(rows + 1));
            /* (a run read as far quads reports their bytes at once) */
            if (rest && r->runs && rows > r->head_cyc)
                fprintf(stderr, " (the first %.0f KiB at %.2f, the rest at %.2f)",
                        (double)r->head_bytes / 1024.0 / (double)r->runs,
                        (double)r->head_bytes / (double)(r->head_cyc + 1),
                        (double)rest / (double)(rows - r->head_cyc));
            fputc('\n', stderr);
        }
    }
}

/* The weight bytes of GEMV in, counted for its worker and dtype, and returned. */
static uint64_t prof_gemv_bytes(uint32_t w, const int64_t *in)
{
    if (in[KT_KIND] != K_INST_OP || in[KT_OP] != OP_GEMV || w >= PROF_WORKERS)
        return 0;
    int t = opnd_dtype(in, 0);
    int64_t k = in[KT_PARAM + 2];
    uint64_t b = (uint64_t)((in[KT_PARAM + 1] - in[KT_PARAM]) * (t == DT_F32 ? 4 * k : qrow_bytes(t, k)));
    prof[w].gemv_bytes += b;
    prof[w].dt_bytes[t] += b;
    return b;
}

/* A run of GEMVs' cycles, for their weights' dtype (gemv_shares() keeps
 * a run to one). */
static void prof_gemv_cycles(uint32_t w, const int64_t *in, uint64_t t0)
{
    if (w < PROF_WORKERS)
        prof[w].dt_cyc[opnd_dtype(in, 0)] += prof_now() - t0;
}

/* A run of GEMVs (`bytes` of weights, rows of k) since t0, `prep` of it
 * preparing the input, by class; and how long its rows took to report
 * their first PROF_HEAD_BYTES (all of them where the run is shorter). */
static void prof_gemv_class(uint32_t w, int64_t k, uint64_t bytes, uint64_t t0, uint64_t prep)
{
    if (w >= PROF_WORKERS)
        return;
    int lg = 63 - __builtin_clzll(bytes | 1), c = 0;
    while (c < prof[w].ncls && (prof[w].cls[c].k != k || prof[w].cls[c].lg != lg))
        c++;
    if (c == PROF_CLASSES)
        return;
    if (c == prof[w].ncls) {
        prof[w].ncls++;
        prof[w].cls[c].k = k;
        prof[w].cls[c].lg = lg;
    }
    uint64_t now = prof_now();
    prof[w].cls[c].cyc += now - t0;
    prof[w].cls[c].prep += prep;
    if (prof_rows_at) {
        uint64_t at = prof_head_at ? prof_head_at : now;
        prof[w].cls[c].head_cyc += at > prof_rows_at ? at - prof_rows_at : 0;
        prof[w].cls[c].head_bytes += prof_head_at ? prof_head_bytes : bytes;
    }
    prof[w].cls[c].bytes += bytes;
    prof[w].cls[c].runs++;
}
#define PROF_START(w) uint64_t prof_t0 = (w) < PROF_WORKERS ? prof_now() : 0
#define PROF_END(w, slot)                                  \
    do {                                                   \
        if ((w) < PROF_WORKERS) {                          \
            uint64_t prof_t1 = prof_now();                 \
            prof[w].cyc[slot] += prof_t1 - prof_t0;        \
            prof_t0 = prof_t1;                             \
        }                                                  \
    } while (0)
#else
#define PROF_START(w) (void)0
#define PROF_END(w, slot) (void)0
#define prof_gemv_bytes(w, in) 0u
#define prof_gemv_cycles(w, in, t0) (void)0
#define prof_gemv_class(w, k, bytes, t0, prep) (void)0
#endif

/* ---- entry point ---- */

void megac_worker(const MegacArgs *a, uint32_t worker)
{
    if (worker >= megac_k_nworkers)
        return;
    if (a->pos < 0 || a->pos >= SHAPE(KS_MAX_SEQ)) {
        abort_record(a, KT_ABORT_BAD_POS, worker, UINT32_MAX, UINT32_MAX, (uint32_t)a->pos,
                     (uint32_t)SHAPE(KS_MAX_SEQ));
        return;
    }
    int32_t first = megac_k_wstart[worker], end = megac_k_wstart[worker + 1];
    WStream ws = {.a = a, .next = megac_k_insts + (int64_t)first * KT_STRIDE, .end = megac_k_insts + (int64_t)end * KT_STRIDE};
    PROF_START(worker);
    for (int32_t i = first; i < end; i++) {
        const int64_t *in = megac_k_insts + (int64_t)i * KT_STRIDE;
        switch (in[KT_KIND]) {
        case K_INST_OP:
            if (op_skipped(a, in))
                break;
            if (in[KT_OP] == OP_GEMV) {
                int n = gemv_run_length(in, megac_k_insts + (int64_t)end * KT_STRIDE);
#ifdef MEGAC_CPU_PROFILE
                prof_rows_at = prof_head_at = prof_run_bytes = 0;
#endif
                op_gemv(a, in, n, &ws);
                uint64_t prep = 0;
#ifdef MEGAC_CPU_PROFILE
                prep = prof_rows_at > prof_t0 ? prof_rows_at - prof_t0 : 0;
                if (worker < PROF_WORKERS)
                    prof[worker].gemv_prep += prep;
#endif
                uint64_t run_bytes = 0;
                for (int j = 0; j < n; j++)
                    run_bytes += prof_gemv_bytes(worker, in + (int64_t)j * KT_STRIDE);
                prof_gemv_cycles(worker, in, prof_t0);
                prof_gemv_class(worker, in[KT_PARAM + 2], run_bytes, prof_t0, prep);
                (void)run_bytes;
                (void)prep;
                i += n - 1;
            } else {
                op_run(a, in, &ws);
            }
            PROF_END(worker, in[KT_OP]);
            break;
        case K_INST_SIGNAL:
            sync_signal(a, (uint32_t)in[KT_COUNTER], (uint32_t)in[KT_AMOUNT]);
            PROF_END(worker, PROF_SIGNAL);
            break;
        case K_INST_WAIT:
            if (!sync_wait(a, worker, (uint32_t)(i - first), (uint32_t)in[KT_COUNTER], (uint32_t)in[KT_AMOUNT]))
                return;
            PROF_END(worker, PROF_WAIT);
            break;
        default:
            break;
        }
    }
#ifdef MEGAC_CPU_PROFILE
    if (worker < PROF_WORKERS)
        prof[worker].steps++;
#endif
}
