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
 * bound, and gives up past the watchdog deadline, recording where in
 * MegacArgs.abort_info; a worker that sees the abort flag returns.
 *
 * Wide vectors are written with the generic vector extension (16 floats);
 * the backend splits them to what the target has (AVX2: 2 x 8, AVX-512: 1).
 */
#define _GNU_SOURCE
#include "codegen/cpu/kernel_table.h"
#include "ir/dtype.h"
#include "ir/ops.h"
#include "runtime/kernel_abi.h"

#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* Defined by the glue module. */
extern const int64_t megac_k_insts[];
extern const int32_t megac_k_wstart[];
extern const int64_t megac_k_shape[];
extern const float megac_k_eps;
extern const uint32_t megac_k_nworkers;

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

static int opnd_dtype(const int64_t *in, int i)
{
    return (int)(((uint64_t)in[KT_DTYPES] >> (8 * i)) & 0xff);
}

/* ---- op bodies ---- */

/* out[c0:c1] = table[tok[0]][c0:c1]; an out-of-range token gives zeros. */
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
    memcpy(out + c0, table + (int64_t)tok * dim + c0, (size_t)(c1 - c0) * sizeof(float));
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

static void gemv_store(float *y, const float *b, int64_t r, float v, int accum)
{
    if (b)
        v += b[r];
    y[r] = accum ? y[r] + v : v;
}

/* y[r0:r1] (+)= W[r0:r1, 0:k] . x (+ b): one row at a time, so the weights
 * are read as one sequential stream (what hardware prefetchers follow
 * best, also for short rows), with four 16-wide accumulators. */
static void gemv_f32(const float *W, const float *x, float *y, const float *b, int64_t r0, int64_t r1,
                     int64_t k, int accum)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *w = W + r * k;
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
        gemv_store(y, b, r, s, accum);
    }
}

/* The weight dtype picks the row kernel; cpu_check.c rejects the dtypes
 * that have none yet, so `default` is unreachable. */
static void gemv_rows(const MegacArgs *a, const int64_t *in, const float *x)
{
    float *y = opnd(a, in, 2);
    const float *b = opnd(a, in, 4);
    int64_t r0 = in[KT_PARAM], r1 = in[KT_PARAM + 1], k = in[KT_PARAM + 2];
    int accum = (in[KT_PARAM + 3] & GEMV_ACCUM) != 0;
    if (!(in[KT_PARAM + 3] & GEMV_BIAS))
        b = NULL;
    switch (opnd_dtype(in, 0)) {
    case DT_F32:
        gemv_f32(opnd(a, in, 0), x, y, b, r0, r1, k, accum);
        break;
    default:
        break;
    }
}

static void op_gemv(const MegacArgs *a, const int64_t *in)
{
    const float *x = opnd(a, in, 1);
    int64_t k = in[KT_PARAM + 2];
    if (!(in[KT_PARAM + 3] & GEMV_NORM)) {
        gemv_rows(a, in, x);
        return;
    }
    /* k <= CPU_NORM_K_MAX (cpu_check.c), so this stays a modest VLA. */
    const float *nw = opnd(a, in, 3);
    float xin[k];
    float s = rms_scale(x, k);
    for (int64_t j = 0; j < k; j++)
        xin[j] = x[j] * s * nw[j];
    gemv_rows(a, in, xin);
}

/* Rotates heads [h0, h1) of v by the angles of row `pos` of the rope
 * table; pair i is (2i, 2i+1) or (i, i + hd/2). */
static void op_rope(const MegacArgs *a, const int64_t *in)
{
    float *v = opnd(a, in, 0);
    const float *tab = opnd(a, in, 1);
    int64_t hd = SHAPE(KS_HEAD_DIM), half = hd / 2;
    int halfpair = SHAPE(KS_ROPE_PAIRING) == 1;
    const float *cs = tab + a->pos * half * 2;
    for (int64_t h = in[KT_PARAM]; h < in[KT_PARAM + 1]; h++) {
        float *x = v + h * hd;
        for (int64_t i = 0; i < half; i++) {
            int64_t i0 = halfpair ? i : 2 * i, i1 = halfpair ? i + half : 2 * i + 1;
            float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[i0], x1 = x[i1];
            x[i0] = x0 * c - x1 * s;
            x[i1] = x0 * s + x1 * c;
        }
    }
}

static void op_kv_append(const MegacArgs *a, const int64_t *in)
{
    const float *k = opnd(a, in, 0), *v = opnd(a, in, 1);
    float *kc = opnd(a, in, 2), *vc = opnd(a, in, 3);
    int64_t h = in[KT_PARAM], hd = SHAPE(KS_HEAD_DIM);
    int64_t row = (h * SHAPE(KS_MAX_SEQ) + a->pos) * hd;
    memcpy(kc + row, k + h * hd, (size_t)hd * sizeof(float));
    memcpy(vc + row, v + h * hd, (size_t)hd * sizeof(float));
}

#define ATTN_CHUNK 64     /* rows scored before their softmax update */

/* e^x for x <= 0 (softmax weights), in plain arithmetic the loop vectorizer
 * turns into vector code: x = n ln2 + r, |r| <= ln2/2 (Cody-Waite), e^r by
 * a degree-7 polynomial (Cephes expf, ~1 ulp), 2^n through the exponent
 * bits. Below -87 the result is about 1e-38 instead of a subnormal. */
static float exp_nonpos(float x)
{
    x = x < -87.0f ? -87.0f : x;
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

/* sc[i] = scale * q . k[i] for n rows of k (hd floats each), four rows at
 * a time so that the four dot products' FMA chains overlap. */
static void attn_scores(float *sc, const float *q, const float *k, int64_t n, int64_t hd, float scale)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *k0 = k + i * hd, *k1 = k0 + hd, *k2 = k1 + hd, *k3 = k2 + hd;
        v16f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        int64_t j = 0;
        for (; j + 16 <= hd; j += 16) {
            v16f qv = LOAD16(q + j);
            a0 += LOAD16(k0 + j) * qv;
            a1 += LOAD16(k1 + j) * qv;
            a2 += LOAD16(k2 + j) * qv;
            a3 += LOAD16(k3 + j) * qv;
        }
        float s0 = hsum16(&a0), s1 = hsum16(&a1), s2 = hsum16(&a2), s3 = hsum16(&a3);
        for (; j < hd; j++) {
            s0 += k0[j] * q[j];
            s1 += k1[j] * q[j];
            s2 += k2[j] * q[j];
            s3 += k3[j] * q[j];
        }
        sc[i] = s0 * scale;
        sc[i + 1] = s1 * scale;
        sc[i + 2] = s2 * scale;
        sc[i + 3] = s3 * scale;
    }
    for (; i < n; i++)
        sc[i] = dot_f32(q, k + i * hd, hd) * scale;
}

/* o[0:hd] += sum_i w[i] * v[i][0:hd] over n rows: 64 outputs at a time
 * held in four registers across all rows, then 16, then single ones. */
static void attn_accum(float *o, const float *w, const float *v, int64_t n, int64_t hd)
{
    int64_t d = 0;
    for (; d + 64 <= hd; d += 64) {
        v16f a0 = LOAD16(o + d), a1 = LOAD16(o + d + 16), a2 = LOAD16(o + d + 32), a3 = LOAD16(o + d + 48);
        for (int64_t i = 0; i < n; i++) {
            const float *vr = v + i * hd + d;
            a0 += w[i] * LOAD16(vr);
            a1 += w[i] * LOAD16(vr + 16);
            a2 += w[i] * LOAD16(vr + 32);
            a3 += w[i] * LOAD16(vr + 48);
        }
        STORE16(o + d, a0);
        STORE16(o + d + 16, a1);
        STORE16(o + d + 32, a2);
        STORE16(o + d + 48, a3);
    }
    for (; d + 16 <= hd; d += 16) {
        v16f a = LOAD16(o + d);
        for (int64_t i = 0; i < n; i++)
            a += w[i] * LOAD16(v + i * hd + d);
        STORE16(o + d, a);
    }
    for (; d < hd; d++) {
        float a = o[d];
        for (int64_t i = 0; i < n; i++)
            a += w[i] * v[i * hd + d];
        o[d] = a;
    }
}

/* Rows [t0, t0+n) of the online softmax for one q head: all scores of the
 * chunk first, one rescale of the running state, the weights e^(s - m) as
 * one vector loop, then the weighted sum of the v rows. p holds hd
 * outputs, then m, then l. */
static void attn_chunk(float *p, const float *q, const float *kh, const float *vh, int64_t t0, int64_t n,
                       int64_t hd, float scale)
{
    float sc[ATTN_CHUNK], mx = NEG_INF;
    attn_scores(sc, q, kh + t0 * hd, n, hd, scale);
    for (int64_t i = 0; i < n; i++)
        mx = sc[i] > mx ? sc[i] : mx;
    float m = p[hd], l = p[hd + 1];
    if (mx > m) {
        float r = m == NEG_INF ? 0.0f : expf(m - mx);
        for (int64_t d = 0; d < hd; d++)
            p[d] *= r;
        l *= r;
        m = mx;
    }
    for (int64_t i = 0; i < n; i++)
        sc[i] = exp_nonpos(sc[i] - m);
    for (int64_t i = 0; i < n; i++)
        l += sc[i];
    attn_accum(p, sc, vh + t0 * hd, n, hd);
    p[hd] = m;
    p[hd + 1] = l;
}

/* Partials of split s for the G q heads of kv head h over rows t <= pos
 * with (t / block) % nsplit == s; an empty split leaves zeros, -inf, 0. */
static void op_attn(const MegacArgs *a, const int64_t *in)
{
    const float *q = opnd(a, in, 0), *kc = opnd(a, in, 1), *vc = opnd(a, in, 2);
    float *part = opnd(a, in, 3);
    int64_t h = in[KT_PARAM], s = in[KT_PARAM + 1], nsplit = in[KT_PARAM + 2], block = in[KT_PARAM + 3];
    int64_t hd = SHAPE(KS_HEAD_DIM), G = SHAPE(KS_N_HEADS) / SHAPE(KS_N_KV_HEADS);
    float scale = 1.0f / sqrtf((float)hd);
    float *p = part + (h * nsplit + s) * G * (hd + 2);
    for (int64_t g = 0; g < G; g++) {
        memset(p + g * (hd + 2), 0, (size_t)hd * sizeof(float));
        p[g * (hd + 2) + hd] = NEG_INF;
        p[g * (hd + 2) + hd + 1] = 0.0f;
    }
    const float *kh = kc + h * SHAPE(KS_MAX_SEQ) * hd, *vh = vc + h * SHAPE(KS_MAX_SEQ) * hd;
    for (int64_t b0 = s * block; b0 <= a->pos; b0 += nsplit * block) {
        int64_t b1 = b0 + block <= a->pos + 1 ? b0 + block : a->pos + 1;
        for (int64_t t0 = b0; t0 < b1; t0 += ATTN_CHUNK) {
            int64_t n = b1 - t0 < ATTN_CHUNK ? b1 - t0 : ATTN_CHUNK;
            for (int64_t g = 0; g < G; g++)
                attn_chunk(p + g * (hd + 2), q + (h * G + g) * hd, kh, vh, t0, n, hd, scale);
        }
    }
}

/* out[q head] = sum_s o_s * e^(m_s - M) / sum_s l_s * e^(m_s - M) */
static void op_attn_combine(const MegacArgs *a, const int64_t *in)
{
    const float *part = opnd(a, in, 0);
    float *out = opnd(a, in, 1);
    int64_t h = in[KT_PARAM], nsplit = in[KT_PARAM + 1];
    int64_t hd = SHAPE(KS_HEAD_DIM), G = SHAPE(KS_N_HEADS) / SHAPE(KS_N_KV_HEADS);
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

static void op_silu_mul(const MegacArgs *a, const int64_t *in)
{
    const float *g = opnd(a, in, 0), *u = opnd(a, in, 1);
    float *out = opnd(a, in, 2);
    for (int64_t r = in[KT_PARAM]; r < in[KT_PARAM + 1]; r++)
        out[r] = g[r] / (1.0f + expf(-g[r])) * u[r];
}

static void op_add(const MegacArgs *a, const int64_t *in)
{
    float *x = opnd(a, in, 0);
    const float *y = opnd(a, in, 1);
    for (int64_t r = in[KT_PARAM]; r < in[KT_PARAM + 1]; r++)
        x[r] += y[r];
}

/* amax[slot] = (max of x[r0:r1], first index of it) */
static void op_argmax(const MegacArgs *a, const int64_t *in)
{
    const float *x = opnd(a, in, 0);
    float *amax = opnd(a, in, 1);
    int64_t r0 = in[KT_PARAM], r1 = in[KT_PARAM + 1], slot = in[KT_PARAM + 2];
    float best = NEG_INF;
    int64_t idx = r0;
    for (int64_t r = r0; r < r1; r++) {
        if (x[r] > best) {
            best = x[r];
            idx = r;
        }
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

static void op_run(const MegacArgs *a, const int64_t *in)
{
    switch (in[KT_OP]) {
    case OP_EMBED: op_embed(a, in); break;
    case OP_RMSNORM: op_rmsnorm(a, in); break;
    case OP_GEMV: op_gemv(a, in); break;
    case OP_ROPE: op_rope(a, in); break;
    case OP_KV_APPEND: op_kv_append(a, in); break;
    case OP_ATTN: op_attn(a, in); break;
    case OP_ATTN_COMBINE: op_attn_combine(a, in); break;
    case OP_SILU_MUL: op_silu_mul(a, in); break;
    case OP_ADD: op_add(a, in); break;
    case OP_ARGMAX: op_argmax(a, in); break;
    case OP_ARGMAX_COMBINE: op_argmax_combine(a, in); break;
    default: break;
    }
}

/* ---- synchronization ---- */

#define WAIT_SPIN_BATCH 64      /* pauses between deadline checks */
#define WAIT_YIELD_AFTER 8      /* batches of pure spinning before yielding */
#define WAIT_DEFAULT_NS 2000000000ull

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

/* wait c >= n. Returns 0 when the worker must stop (deadline or abort). */
static int sync_wait(const MegacArgs *a, uint32_t worker, uint32_t pc, uint32_t c, uint32_t n)
{
    uint32_t *ctr = a->counters + c;
    if (__atomic_load_n(ctr, __ATOMIC_ACQUIRE) >= n)
        return 1;
    uint64_t limit = a->timeout_ns ? a->timeout_ns : WAIT_DEFAULT_NS;
    uint64_t t0 = now_ns();
    for (uint64_t batch = 0;; batch++) {
        for (int i = 0; i < WAIT_SPIN_BATCH; i++) {
            if (__atomic_load_n(ctr, __ATOMIC_ACQUIRE) >= n)
                return 1;
            cpu_pause();
        }
        if (abort_seen(a))
            return 0;
        if (batch >= WAIT_YIELD_AFTER)
            sched_yield();
        if (now_ns() - t0 > limit) {
            abort_record(a, KT_ABORT_TIMEOUT, worker, pc, c, __atomic_load_n(ctr, __ATOMIC_ACQUIRE), n);
            return 0;
        }
    }
}

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
    for (int32_t i = first; i < end; i++) {
        const int64_t *in = megac_k_insts + (int64_t)i * KT_STRIDE;
        switch (in[KT_KIND]) {
        case K_INST_OP:
            op_run(a, in);
            break;
        case K_INST_SIGNAL:
            __atomic_fetch_add(a->counters + in[KT_COUNTER], (uint32_t)in[KT_AMOUNT], __ATOMIC_RELEASE);
            break;
        case K_INST_WAIT:
            if (!sync_wait(a, worker, (uint32_t)(i - first), (uint32_t)in[KT_COUNTER], (uint32_t)in[KT_AMOUNT]))
                return;
            break;
        default:
            break;
        }
    }
}
