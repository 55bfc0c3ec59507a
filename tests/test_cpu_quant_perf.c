/*
 * test_cpu_quant_perf.c - the CPU backend's quantized GEMV kernels
 * (codegen/cpu/kernel_body.c: four rows per pass, the AVX-512 table
 * lookups, the int8 dot products) against quant.c's references, for every
 * weight dtype, compiled for this host and for the portable levels
 * (x86-64-v3 and plain x86-64: the instruction-set versions must fold away
 * there), on row ranges that are not multiples of four and on k that is
 * (576, SmolLM2's dim: a short last W4G128 group) or is not (200) a
 * multiple of 32.
 *
 * MEGAC_CPU_BENCH=1 also measures each dtype's GEMV alone on SmolLM2-135M
 * shaped rows (k = 576, 256 MB of weights: far past the last-level cache),
 * with 1 and 2 workers, next to an f32 GEMV of the same rows, and prints
 * GB/s of weight bytes read (wall time, and per CPU time, which excludes
 * preemption on a shared machine). MEGAC_QBENCH_MB sets the weight size,
 * MEGAC_QBENCH_DTYPE picks one dtype, MEGAC_QBENCH_OP_ROWS cuts each
 * worker's rows into ops of that many rows, MEGAC_QBENCH_SCATTER=1 runs
 * those ops in a scattered order (as a decode step's tiles are),
 * MEGAC_QBENCH_SYNC=1 cuts each op among the workers instead and has them
 * all wait for each other after it (as a decode step's GEMVs do),
 * MEGAC_QBENCH_REPS=R times R calls per run (small weights in cache then
 * give the kernels' arithmetic rate, not the threads' start-up), and
 * MEGAC_QBENCH_K=K sets the row length.
 */
#include "codegen/codegen.h"
#include "codegen/cpu/kernel_table.h"
#include "compiler/quant.h"
#include "ir/dtype.h"
#include "ir/ir.h"
#include "runtime/kernel_abi.h"
#include "tests/cpuinfo.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef void (*QWorker)(const MegacArgs *, uint32_t);

static float lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
}

static void put_f16(unsigned char *p, float f)
{
    uint16_t h = f32_to_f16(f);
    p[0] = (unsigned char)(h & 0xff);
    p[1] = (unsigned char)(h >> 8);
}

/* GGUF blocks of 32 from floats (round to nearest; ir/dtype.h layouts). */
static void gguf_block(DType t, const float *w, unsigned char *b)
{
    float lo = w[0], hi = w[0], amax = 0;
    for (int j = 0; j < 32; j++) {
        lo = w[j] < lo ? w[j] : lo;
        hi = w[j] > hi ? w[j] : hi;
        amax = fabsf(w[j]) > amax ? fabsf(w[j]) : amax;
    }
    if (t == DT_Q8_0) {
        float d = amax / 127.0f;
        put_f16(b, d);
        for (int j = 0; j < 32; j++)
            b[2 + j] = (unsigned char)(int8_t)(d > 0 ? rintf(w[j] / d) : 0);
        return;
    }
    float d = t == DT_Q4_0 ? amax / 8.0f : (hi - lo) / 15.0f, m = t == DT_Q4_0 ? -8.0f * d : lo;
    int hdr = t == DT_Q4_0 ? 2 : 4;
    put_f16(b, d);
    if (t == DT_Q4_1)
        put_f16(b + 2, m);
    memset(b + hdr, 0, 16);
    for (int j = 0; j < 32; j++) {
        float q = d > 0 ? rintf((w[j] - m) / d) : 0;
        unsigned n = (unsigned)(q < 0 ? 0 : q > 15 ? 15 : q);
        b[hdr + j % 16] |= (unsigned char)(j < 16 ? n : n << 4);
    }
}

/* Q5_0, Q5_1, the k-quants and IQ4 have no quantizer here (nor in gguf-py):
 * random blocks (every byte pattern is one), seeded by the row's first
 * weight, with the f16 scales and mins of ir/dtype.h kept to the size of
 * real ones, of both signs. */
static bool random_gguf_row(DType t, const float *w, int64_t k, unsigned char *out)
{
    int bb = dtype_block_bytes(t), nb = (int)(k / dtype_block(t)), d = 0, m = -1;
    float ds, ms = 0;
    switch (t) {
    case DT_Q5_0: ds = 0.01f; break;
    case DT_Q5_1: ds = 0.005f, m = 2, ms = 0.1f; break;
    case DT_Q4_K: ds = 2e-4f, m = 2, ms = 1e-3f; break;
    case DT_Q5_K: ds = 1e-4f, m = 2, ms = 1e-3f; break;
    case DT_Q6_K: ds = 2e-5f, d = 208; break;
    case DT_Q3_K: ds = 4e-4f, d = 108; break;
    case DT_Q2_K: ds = 1e-3f, d = 80, m = 82, ms = 1e-3f; break;
    case DT_IQ4_NL: ds = 4e-4f; break;
    case DT_IQ4_XS: ds = 2e-5f; break;
    default: return false;
    }
    uint32_t bits;
    memcpy(&bits, w, 4);
    uint64_t seed = bits;
    for (int b = 0; b < nb; b++) {
        unsigned char *p = out + (size_t)b * (size_t)bb;
        for (int i = 0; i < bb; i++)
            p[i] = (unsigned char)(lcg(&seed) * 128.0f + 128.0f);
        put_f16(p + d, ds * lcg(&seed));
        if (m >= 0)
            put_f16(p + m, ms * lcg(&seed));
    }
    return true;
}

static void quantize_row(DType t, const float *w, int64_t k, unsigned char *out)
{
    t = dtype_layout(t);
    if (random_gguf_row(t, w, k, out))
        return;
    if (t == DT_Q8_0 || t == DT_Q4_0 || t == DT_Q4_1) {
        for (int64_t j = 0; j < k; j += 32)
            gguf_block(t, w + j, out + j / 32 * dtype_block_bytes(t));
        return;
    }
    quant_row_quantize(dtype_layout(t), w, k, out);
}

/* rows of raw bytes (ir/dtype.h) into a kernel's weights: in the CPU
 * kernel's order where it packs them (compiler/quant.h). */
static void kernel_rows_put(DType t, int64_t rows, int64_t k, const unsigned char *raw, unsigned char *dst)
{
    if (quant_cpu_packed(t, k))
        quant_cpu_pack(t, rows, k, raw, dst);
    else
        memcpy(dst, raw, (size_t)rows * dtype_row_bytes(t, k));
}

/* n rows of k random weights (0.05 * lcg) as dtype t's bytes (ir/dtype.h). */
static unsigned char *random_rows(DType t, int64_t n, int64_t k, uint64_t *seed)
{
    size_t rb = dtype_row_bytes(t, k);
    unsigned char *raw = malloc(rb * (size_t)n);
    float *w = malloc(sizeof(float) * (size_t)k);
    for (int64_t r = 0; r < n; r++) {
        for (int64_t j = 0; j < k; j++)
            w[j] = 0.05f * lcg(seed);
        quantize_row(t, w, k, raw + (size_t)r * rb);
    }
    free(w);
    return raw;
}

typedef struct QKern {
    Schedule *s;
    char dir[64], so[96];
    void *dl;
    QWorker fn;
    unsigned char *wts, *arena;
    size_t wts_len;
    uint32_t *ctrs;
} QKern;

static void *alloc64(size_t n)
{
    void *p = NULL;
    cr_assert_eq(posix_memalign(&p, 64, n ? n : 64), 0);
    memset(p, 0, n);
    return p;
}

/* The weights as a bundle's are read (runtime/bundle.c, weights_copy):
 * an anonymous mapping with transparent huge pages asked for. On 4 KB
 * pages the kernels stream differently: on the Intel Xeon host one 50 MB
 * Q4_0A8 GEMV's adjacent rows read at 39-42 GB/s on two workers where
 * far quads read 53-55, and in huge pages the two alike (a scratch
 * benchmark of the rows' loads and arithmetic: 54.5 and 55.0). */
static unsigned char *alloc_weights(size_t n)
{
    void *p = mmap(NULL, n ? n : 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED, "cannot map %zu bytes of weights", n);
#ifdef MADV_HUGEPAGE
    madvise(p, n ? n : 64, MADV_HUGEPAGE);
#endif
    memset(p, 0, n); /* zero already; touched now so that no timed run takes its page faults */
    return p;
}

static void qkern_build(QKern *k, Schedule *s, const char *cpu)
{
    memset(k, 0, sizeof *k);
    k->s = s;
    sched_layout(s);
    strcpy(k->dir, "/tmp/megac_qperf_XXXXXX");
    cr_assert_not_null(mkdtemp(k->dir));
    snprintf(k->so, sizeof k->so, "%s/kernel.so", k->dir);
    Diag d;
    diag_init(&d);
    CpuOptions o = {.cpu = cpu};
    cr_assert(cg_cpu_compile(s, &o, k->so, &d), "cg_cpu_compile (%s) failed", cpu ? cpu : "host");
    k->dl = dlopen(k->so, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(k->dl, "dlopen: %s", dlerror());
    k->fn = (QWorker)(uintptr_t)dlsym(k->dl, "megac_worker");
    cr_assert_not_null(k->fn);
    k->wts = alloc_weights(s->weights_bytes);
    k->wts_len = s->weights_bytes;
    k->arena = alloc64(s->arena_bytes);
    k->ctrs = alloc64(4 * (s->nctrs + 1));
}

static void qkern_free(QKern *k)
{
    dlclose(k->dl);
    if (getenv("MEGAC_CPU_KEEP")) { /* for perf annotate */
        fprintf(stderr, "kept %s\n", k->so);
    } else {
        unlink(k->so);
        rmdir(k->dir);
    }
    munmap(k->wts, k->wts_len ? k->wts_len : 64);
    free(k->arena);
    free(k->ctrs);
    sched_free(k->s);
}

typedef struct QJob {
    QKern *k;
    MegacArgs *args;
    uint32_t w;
    int reps;
    double cpu_s;
} QJob;

static double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *qjob_main(void *p)
{
    QJob *j = p;
    double t0 = thread_cpu_s();
    for (int i = 0; i < j->reps; i++)
        j->k->fn(j->args, j->w);
    j->cpu_s = thread_cpu_s() - t0;
    return NULL;
}

/* One run of every worker (reps runs each, one after another: the
 * benchmark's schedules have no waits); returns the largest worker CPU
 * time. */
static double qkern_steps(QKern *k, int reps)
{
    uint32_t n = k->s->nworkers;
    memset(k->ctrs, 0, 4 * (k->s->nctrs + 1));
    MegacAbort ab = {0};
    MegacArgs args = {k->wts, k->arena, k->ctrs, &ab, 0, 0, -1, 0, 0};
    pthread_t th[4];
    QJob jobs[4];
    cr_assert(n <= 4);
    for (uint32_t w = 0; w < n; w++) {
        jobs[w] = (QJob){k, &args, w, reps, 0};
        cr_assert_eq(pthread_create(&th[w], NULL, qjob_main, &jobs[w]), 0);
    }
    double cpu = 0;
    for (uint32_t w = 0; w < n; w++) {
        pthread_join(th[w], NULL);
        cpu = jobs[w].cpu_s > cpu ? jobs[w].cpu_s : cpu;
    }
    cr_assert_eq(ab.flag, 0);
    return cpu;
}

static double qkern_step(QKern *k)
{
    return qkern_steps(k, 1);
}

/* Every dtype the CPU GEMV takes besides f32. */
static const DType all_dtypes[] = {DT_W8,      DT_Q8_0,     DT_Q4_0,    DT_Q4_1,     DT_W4G32,  DT_W4G64,  DT_W4G128,
                                   DT_W8A8,    DT_W4A8G32,  DT_W4A8G64, DT_W4A8G128, DT_Q4_1A8, DT_Q8_0A8, DT_F16,
                                   DT_BF16,    DT_Q5_0,     DT_Q5_1,    DT_Q4_K,     DT_Q5_K,   DT_Q6_K,   DT_Q5_0A8,
                                   DT_Q5_1A8,  DT_Q4_KA8,   DT_Q5_KA8,  DT_Q6_KA8,   DT_Q4_0A8, DT_Q3_K,   DT_Q2_K,
                                   DT_IQ4_NL,  DT_IQ4_XS,   DT_IQ4_NLA8, DT_IQ4_XSA8, DT_Q3_KA8, DT_Q2_KA8};
#define NDT (sizeof all_dtypes / sizeof *all_dtypes)

/* Whether dtype t can hold rows of k elements: GGUF blocks (32, or 256
 * for the k-quants) need whole ones. */
static bool fits(DType t, int64_t k)
{
    t = dtype_layout(t);
    bool gguf = t == DT_Q8_0 || t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q5_0 || t == DT_Q5_1 || dtype_is_kquant(t) ||
                t == DT_IQ4_NL || t == DT_IQ4_XS;
    return !gguf || k % dtype_block(t) == 0;
}

static ModelShape gemv_shape(int64_t k)
{
    return (ModelShape){.dim = (int)k, .hidden_dim = (int)k, .n_layers = 1, .n_heads = 1, .n_kv_heads = 1,
                        .head_dim = 2, .vocab_size = 16, .max_seq = 4, .norm_eps = 1e-5};
}

/* y_t[r0:r1] = W_t[r0:r1] . x for one dtype, rows split at `cut`. */
static void add_gemvs(Schedule *s, DType t, int64_t rows, int64_t k, int64_t cut, uint32_t xb, uint32_t *wb,
                      uint32_t *yb)
{
    int64_t sw[2] = {rows, k}, sy[1] = {rows};
    char name[32];
    snprintf(name, sizeof name, "w_%s", dtype_name(t));
    *wb = sched_add_buffer(s, name, t, BUF_WEIGHT, 2, sw);
    snprintf(name, sizeof name, "y_%s", dtype_name(t));
    *yb = sched_add_buffer(s, name, DT_F32, BUF_SCRATCH, 1, sy);
    int64_t r[3] = {0, cut, rows};
    for (int i = 0; i < 2; i++) {
        Access acc[5] = {{*wb, ACC_R, {r[i] * k, 0}, {r[i + 1] * k, 0}}, {xb, ACC_R, {0, 0}, {k, 0}},
                         {*yb, ACC_W, {r[i], 0}, {r[i + 1], 0}}, {BUF_NONE, 0, {0, 0}, {0, 0}},
                         {BUF_NONE, 0, {0, 0}, {0, 0}}};
        sched_op(s, 0, OP_GEMV, (int32_t[]){(int32_t)r[i], (int32_t)r[i + 1], (int32_t)k, 0}, acc);
    }
}

/* The CPU targets whose integer kernels the tests below check: the
 * host's, and the 256-bit ones where this host runs them (x86-64-v3:
 * vpmaddubsw; alderlake: AVX-VNNI's vpdpbusd). */
static int int_targets(const char *cpu[3])
{
    int n = 0;
    cpu[n++] = NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        cpu[n++] = "x86-64-v3";
        if (test_cpuinfo_has("flags", " avx_vnni") == 1)
            cpu[n++] = "alderlake";
    }
    return n;
}

/* A kernel on one CPU target with a GEMV of `rows` rows for each dtype
 * of a list (those that fit k), each split between two ops at `cut`, so
 * that a test compiles a kernel per target and not per dtype and input (a
 * compile takes about a second; these tests made some 200 of them). */
typedef struct GemvSet {
    QKern q;
    size_t n;
    DType ts[NDT];
    uint32_t xb, wb[NDT], yb[NDT];
    int64_t rows, k;
} GemvSet;

static void gset_build(GemvSet *g, const char *cpu, const DType *ts, size_t n, int64_t rows, int64_t k, int64_t cut)
{
    cr_assert(n <= NDT);
    memset(g, 0, sizeof *g);
    Schedule *s = sched_new("qset", "cpu", 1);
    s->shape = gemv_shape(k);
    int64_t sx[1] = {k};
    g->xb = sched_add_buffer(s, "x", DT_F32, BUF_STATE, 1, sx);
    for (size_t i = 0; i < n; i++) {
        g->ts[i] = ts[i];
        if (fits(ts[i], k))
            add_gemvs(s, ts[i], rows, k, cut, g->xb, &g->wb[i], &g->yb[i]);
    }
    g->n = n, g->rows = rows, g->k = k;
    qkern_build(&g->q, s, cpu);
}

/* y = W x for the set's dtype t (raw: its rows as quantize_row writes
 * them); y's buffer is filled with 1e30 first, so a row the kernel left
 * unwritten shows. */
static void gset_run(GemvSet *g, DType t, const unsigned char *raw, const float *x, float *y)
{
    size_t i = 0;
    while (i < g->n && g->ts[i] != t)
        i++;
    cr_assert(i < g->n && fits(t, g->k), "%s is not in the kernel", dtype_name(t));
    const Schedule *s = g->q.s;
    float *out = (float *)(g->q.arena + s->bufs[g->yb[i]].offset);
    for (int64_t r = 0; r < g->rows; r++)
        out[r] = 1e30f;
    kernel_rows_put(t, g->rows, g->k, raw, g->q.wts + s->bufs[g->wb[i]].offset);
    memcpy(g->q.arena + s->bufs[g->xb].offset, x, sizeof(float) * (size_t)g->k);
    qkern_step(&g->q);
    memcpy(y, out, sizeof(float) * (size_t)g->rows);
}

/* A set for each of the n CPU targets in cpu[]. */
static void gsets_build(GemvSet *g, const char *const *cpu, int n, const DType *ts, size_t nt, int64_t rows, int64_t k,
                        int64_t cut)
{
    for (int c = 0; c < n; c++)
        gset_build(&g[c], cpu[c], ts, nt, rows, k, cut);
}

static void gsets_free(GemvSet *g, int n)
{
    for (int c = 0; c < n; c++)
        qkern_free(&g[c].q);
}

/* y within 2e-6 of the sum of |w x| of the float64 GEMV of raw's rows. */
static void expect_ref(DType t, const unsigned char *raw, int64_t rows, int64_t k, const float *x, const float *y,
                       const char *what)
{
    double *ref = malloc(sizeof(double) * (size_t)rows);
    float *deq = malloc(sizeof(float) * (size_t)k);
    quant_gemv_ref(t, raw, rows, k, x, ref);
    for (int64_t r = 0; r < rows; r++) {
        quant_row_dequant(dtype_layout(t), raw + (size_t)r * dtype_row_bytes(t, k), k, deq);
        double mag = 0;
        for (int64_t j = 0; j < k; j++)
            mag += fabs((double)deq[j] * x[j]);
        cr_assert_leq(fabs(y[r] - ref[r]), 2e-6 * mag, "%s, %s: row %ld is %.9g, not %.9g (sum |w x| %g)",
                      dtype_name(t), what, (long)r, y[r], ref[r], mag);
    }
    free(deq);
    free(ref);
}

/* Negative scales in some groups (W4G*, W4A8G*: every third) or rows
 * (W8, W8A8: odd ones), as GGUF Q4_0 blocks regrouped into W4G32 have
 * (ggml's Q4_0 d is negative when the largest |w| is positive): the
 * kernels must not assume s >= 0. */
static void flip_some_scales(DType t, unsigned char *row, int64_t r, int64_t k)
{
    DType l = dtype_layout(t);
    if (l == DT_W8) {
        if (r % 2)
            row[3] ^= 0x80; /* sign of the f32 row scale */
        return;
    }
    int64_t gs = l == DT_W4G32 ? 32 : l == DT_W4G64 ? 64 : l == DT_W4G128 ? 128 : 0;
    for (int64_t j = 0, g = 0; gs && j < k; j += gs, g++) {
        int64_t len = k - j < gs ? k - j : gs;
        if (g % 3 == 1)
            row[1] ^= 0x80; /* sign of the f16 group scale */
        row += 4 + 16 * ((len + 31) / 32);
    }
}

/* Whether this host runs AVX-512 F/BW/VL/DQ code (Skylake-X), and with
 * vnni AVX-512 VNNI code too (Cascade Lake). */
static bool host_runs_avx512(bool vnni)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           (!vnni || __builtin_cpu_supports("avx512vnni"));
}

/* All dtypes (GGUF ones where k is whole blocks) on one CPU target, rows
 * of k in two GEMVs cut at row `cut`. */
static void check_all_rows(const char *cpu, int64_t k, int64_t rows, int64_t cut)
{
    GemvSet g; /* every dtype at once: one step checks them all */
    gset_build(&g, cpu, all_dtypes, NDT, rows, k, cut);
    QKern *q = &g.q;
    const Schedule *s = q->s;
    const uint32_t *wb = g.wb, *yb = g.yb;
    float *w = malloc(sizeof(float) * (size_t)(rows * k)), *x = (float *)(q->arena + s->bufs[g.xb].offset);
    uint64_t seed = 7;
    for (int64_t j = 0; j < k; j++)
        x[j] = lcg(&seed) * (j % 37 == 0 ? 8.0f : 1.0f); /* a few outliers per block */
    for (int64_t j = 0; j < rows * k; j++)
        w[j] = 0.05f * lcg(&seed) + (j % 29 == 0 ? 0.02f : 0.0f);
    unsigned char *raw[NDT] = {0};
    for (size_t i = 0; i < NDT; i++) {
        if (!fits(all_dtypes[i], k))
            continue;
        size_t rb = dtype_row_bytes(all_dtypes[i], k);
        raw[i] = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) {
            quantize_row(all_dtypes[i], w + r * k, k, raw[i] + (size_t)r * rb);
            flip_some_scales(all_dtypes[i], raw[i] + (size_t)r * rb, r, k);
        }
        kernel_rows_put(all_dtypes[i], rows, k, raw[i], q->wts + s->bufs[wb[i]].offset);
    }
    qkern_step(q);
    double *ref = malloc(sizeof(double) * (size_t)rows), *mag = malloc(sizeof(double) * (size_t)rows);
    float *deq = malloc(sizeof(float) * (size_t)k);
    for (size_t i = 0; i < NDT; i++) {
        DType t = all_dtypes[i];
        if (!fits(t, k))
            continue;
        const unsigned char *W = raw[i];
        const float *y = (const float *)(q->arena + s->bufs[yb[i]].offset);
        if (dtype_is_a8(t))
            quant_gemv_a8_ref(t, W, rows, k, x, ref);
        else
            quant_gemv_ref(t, W, rows, k, x, ref);
        for (int64_t r = 0; r < rows; r++) {
            quant_row_dequant(dtype_layout(t), W + (size_t)r * dtype_row_bytes(t, k), k, deq);
            mag[r] = 0;
            for (int64_t j = 0; j < k; j++)
                mag[r] += fabs((double)deq[j] * x[j]);
            cr_assert_leq(fabs(y[r] - ref[r]), 2e-6 * mag[r] + 1e-30, "%s %s k=%ld row %ld: %.9g vs %.9g",
                          cpu ? cpu : "host", dtype_name(t), (long)k, (long)r, y[r], ref[r]);
        }
    }
    free(deq);
    free(mag);
    free(ref);
    free(w);
    for (size_t i = 0; i < NDT; i++)
        free(raw[i]);
    qkern_free(q);
}

static void check_all(const char *cpu, int64_t k)
{
    check_all_rows(cpu, k, 30, 13);
}

/* Segments of 512 KB or more, which a kernel tuned for an Intel CPU reads
 * as far quads (kernel_body.c: seg_far_quads), and one for AMD Zen 3 where
 * its 256-bit rows go one after another (KT_TUNE_FAR_SEQ): 1003 rows of
 * 2048, cut at 501 (Q4_0: 577 KB and 578 KB; 125 quads a segment and one
 * or two rows after them), and for Zen 3, whose rows of 576 ask for no
 * lines ahead (seg_trickle), 3301 rows cut at 1650 (Q4_0: 534 KB). The
 * host's kernel, Zen 3's where the host runs AVX2, and Cascade Lake's (an
 * Intel CPU) where the host runs AVX-512 VNNI. */
Test(cpu_quant_perf, far_quads, .timeout = 300)
{
    check_all_rows(NULL, 2048, 1003, 501);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        check_all_rows("znver3", 2048, 1003, 501);
        check_all_rows("znver3", 576, 3301, 1650);
    }
    if (!host_runs_avx512(true))
        cr_skip_test("this host cannot run Cascade Lake code (AVX-512 VNNI): the host's kernel only");
    check_all_rows("cascadelake", 2048, 1003, 501);
}

Test(cpu_quant_perf, every_dtype_host)
{
    check_all(NULL, 576);  /* packed 4-bit rows: 4 superblocks and a short one of 2 blocks */
    check_all(NULL, 224);  /* a short superblock of 3 */
    check_all(NULL, 160);  /* a short superblock of 1 */
    check_all(NULL, 200);
    check_all(NULL, 768);  /* the k-quants: 3 super-blocks */
    check_all(NULL, 96);   /* no whole superblock, nor a whole group of 128 */
}

Test(cpu_quant_perf, every_dtype_x86_64_v3)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        cr_skip_test("this host cannot run x86-64-v3 code");
    check_all("x86-64-v3", 576);
    check_all("x86-64-v3", 768); /* the k-quants */
}

/* The AVX2 kernels with their prefetches spread at every k (an Intel CPU:
 * KT_TUNE_TRICKLE_ALL), where x86-64-v3's spread them from WS_TRICKLE_K. */
Test(cpu_quant_perf, every_dtype_haswell)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        cr_skip_test("this host cannot run Haswell code");
    check_all("haswell", 576);
    check_all("haswell", 160);
}

/* Intel's named CPUs and an Intel host spread the GEMVs' prefetches at
 * every k and read far quads; Zen 3 (named, or a host of AMD's family 19h
 * without AVX-512) reads its 256-bit rows' long segments as far quads;
 * the other AMD CPUs and the x86-64 levels (either vendor) do none of it. */
Test(cpu_quant_perf, prefetch_tuning_by_vendor)
{
    const char *intel[] = {"haswell", "skylake", "skylake-avx512", "cascadelake", "icelake-server",
                           "sapphirerapids", "alderlake"};
    const char *other[] = {"znver2", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"};
    for (size_t i = 0; i < sizeof intel / sizeof *intel; i++)
        cr_assert_eq(cg_cpu_tune(intel[i]), KT_TUNE_TRICKLE_ALL | KT_TUNE_FAR_QUADS, "%s", intel[i]);
    for (size_t i = 0; i < sizeof other / sizeof *other; i++)
        cr_assert_eq(cg_cpu_tune(other[i]), 0, "%s", other[i]);
    cr_assert_eq(cg_cpu_tune("znver3"), KT_TUNE_FAR_SEQ);
    int vendor = test_cpuinfo_has("vendor_id", "GenuineIntel"); /* 1 Intel, 0 another */
    if (vendor < 0)
        cr_skip_test("no vendor_id in /proc/cpuinfo");
    int zen3 = test_cpuinfo_has("vendor_id", "AuthenticAMD") == 1 && test_cpuinfo_has("cpu family", "25") == 1 &&
               test_cpuinfo_has("flags", "avx512f") == 0;
    cr_assert_eq(cg_cpu_tune(NULL), vendor ? KT_TUNE_TRICKLE_ALL | KT_TUNE_FAR_QUADS : zen3 ? KT_TUNE_FAR_SEQ : 0);
    cr_assert_eq(cg_cpu_tune("host"), cg_cpu_tune(NULL));
}

/* AVX-512 VNNI without GFNI (Cascade Lake): the packed rows' high nibbles
 * by a shift and a mask, where the host (with GFNI) takes vgf2p8affineqb;
 * needs a host that runs avx512vnni. */
Test(cpu_quant_perf, every_dtype_cascadelake)
{
    if (!host_runs_avx512(true))
        cr_skip_test("this host cannot run Cascade Lake code (AVX-512 VNNI)");
    check_all("cascadelake", 576);
    check_all("cascadelake", 224);
}

/* AVX-512 without VNNI (Skylake-X): the int8 inputs by the AVX-512
 * quantizer (kernel_act.inc), the packed A8 rows by the 256-bit ones and
 * their AVX2 preparation; needs a host that runs AVX-512 BW/VL/DQ. */
Test(cpu_quant_perf, every_dtype_skylake_avx512)
{
    if (!host_runs_avx512(false))
        cr_skip_test("this host cannot run Skylake-X code (AVX-512)");
    check_all("skylake-avx512", 576);
    check_all("skylake-avx512", 224); /* a short superblock of 3 */
}

/* AVX-VNNI without AVX-512 (its 256-bit vpdpbusd kernels: the A8 rows,
 * and kernel_q256.inc's against x's planes); needs a host that runs
 * avxvnni. */
Test(cpu_quant_perf, every_dtype_alderlake)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2"))
        cr_skip_test("this host has no AVX2");
    if (test_cpuinfo_has("flags", " avx_vnni") != 1)
        cr_skip_test("this host has no AVX-VNNI");
    check_all("alderlake", 576);
    check_all("alderlake", 224); /* a short superblock of 3 */
    check_all("alderlake", 160); /* a short superblock of 1 */
    check_all("alderlake", 768); /* the k-quants */
}

Test(cpu_quant_perf, every_dtype_x86_64)
{
    check_all("x86-64", 576);
    check_all("x86-64", 160); /* a short superblock of 1 */
    check_all("x86-64", 200);
    check_all("x86-64", 512);
}

/* The 8-bit A16 rows at the integer kernels' bounds (VNNI hosts: Q8_0 with
 * x as 23-bit fixed point per block, each 32-bit lane's four q xi up to 4
 * 128 (2^22 - 1); W8 with x as 30-bit fixed point per op in four planes,
 * each plane's lane summing k / 16 products): every weight at +-max and
 * |x| equal across a block, with x's signs all +, all - and alternating,
 * so lanes reach the bound; a lane that wrapped would miss by ~2^32. */
Test(cpu_quant_perf, q8_lane_bound)
{
    const int64_t rows = 4, k = 576;
    const DType ts[] = {DT_Q8_0, DT_W8};
    const char *pattern[3] = {"x all +", "x all -", "x alternating"}, *cpu[3];
    int nc = int_targets(cpu);
    float x[576], w[576], y[4];
    GemvSet set[3];
    gsets_build(set, cpu, nc, ts, sizeof ts / sizeof *ts, rows, k, 2);
    for (size_t ti = 0; ti < sizeof ts / sizeof *ts; ti++) {
        DType t = ts[ti];
        size_t rb = dtype_row_bytes(t, k);
        unsigned char *raw = malloc(rb * rows);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t j = 0; j < k; j++) /* rows: all +, all -, alternating, by blocks */
                w[j] = 0.5f * (r == 0 ? 1.0f : r == 1 ? -1.0f : r == 2 ? (j % 2 ? -1.0f : 1.0f) : (j / 32 % 2 ? -1.0f : 1.0f));
            quantize_row(t, w, k, raw + (size_t)r * rb);
        }
        for (int xs = 0; xs < 3; xs++) {
            for (int64_t j = 0; j < k; j++)
                x[j] = (xs == 0 ? 1.0f : xs == 1 ? -1.0f : (j % 2 ? -1.0f : 1.0f)) * (1.0f + (float)(j / 32));
            for (int c = 0; c < nc; c++) {
                char what[64];
                snprintf(what, sizeof what, "%s, %s", cpu[c] ? cpu[c] : "host", pattern[xs]);
                gset_run(&set[c], t, raw, x, y);
                expect_ref(t, raw, rows, k, x, y, what);
            }
        }
        free(raw);
    }
    gsets_free(set, nc);
}

/* An activation outlier 10^4 times the rest (LLMs have them): the 8-bit
 * A16 rows still within 2e-6 of the sum of |w x| of the float64 GEMV, also
 * in rows whose weight at the outlier is zero (where the integer kernels'
 * fixed point of x, one scale per block or per op, is set by it and the
 * row does not see it). */
Test(cpu_quant_perf, q8_outlier_x)
{
    const int64_t rows = 8, k = 1536;
    const DType ts[] = {DT_Q8_0, DT_W8};
    float x[1536], w[1536], y[8];
    const char *cpu[3];
    int nc = int_targets(cpu);
    GemvSet set[3];
    gsets_build(set, cpu, nc, ts, sizeof ts / sizeof *ts, rows, k, 4);
    for (size_t ti = 0; ti < sizeof ts / sizeof *ts; ti++) {
        DType t = ts[ti];
        uint64_t seed = 11;
        for (int64_t j = 0; j < k; j++)
            x[j] = lcg(&seed);
        x[100] = 1e4f;
        size_t rb = dtype_row_bytes(t, k);
        unsigned char *raw = malloc(rb * rows);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t j = 0; j < k; j++)
                w[j] = 0.05f * lcg(&seed);
            if (r % 2)
                for (int64_t j = 96; j < 128; j++) /* the outlier's block: zero weights */
                    w[j] = 0.0f;
            quantize_row(t, w, k, raw + (size_t)r * rb);
        }
        for (int c = 0; c < nc; c++) {
            gset_run(&set[c], t, raw, x, y);
            expect_ref(t, raw, rows, k, x, y, cpu[c] ? cpu[c] : "host");
        }
        free(raw);
    }
    gsets_free(set, nc);
}

/* x far below 1 (1e-31: the integer kernels' fixed point of x would need
 * subnormal scales; they take the float kernels) and all zero: still the
 * float64 GEMV's values, for the A16 rows that take integer kernels. */
Test(cpu_quant_perf, tiny_x)
{
    const int64_t rows = 8, k = 768;
    const DType ts[] = {DT_Q8_0, DT_W8, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_W4G32, DT_W4G64, DT_W4G128, DT_Q4_K, DT_Q6_K};
    float x[768], y[8];
    const char *cpu[3];
    int nc = int_targets(cpu);
    GemvSet set[3];
    gsets_build(set, cpu, nc, ts, sizeof ts / sizeof *ts, rows, k, 4);
    for (size_t ti = 0; ti < sizeof ts / sizeof *ts; ti++) {
        uint64_t seed = 13;
        unsigned char *raw = random_rows(ts[ti], rows, k, &seed);
        for (int zero = 0; zero < 2; zero++) {
            for (int64_t j = 0; j < k; j++)
                x[j] = zero ? 0.0f : 1e-31f * lcg(&seed);
            for (int c = 0; c < nc; c++) {
                char what[64];
                snprintf(what, sizeof what, "%s, %s", cpu[c] ? cpu[c] : "host", zero ? "x zero" : "x tiny");
                gset_run(&set[c], ts[ti], raw, x, y);
                expect_ref(ts[ti], raw, rows, k, x, y, what);
            }
        }
        free(raw);
    }
    gsets_free(set, nc);
}

/* ---- packed 4-bit rows (compiler/quant.h: quant_cpu_pack) ---- */

static const DType packed_dtypes[] = {DT_Q4_0,   DT_Q4_1,   DT_W4G32,  DT_W4A8G32, DT_Q5_0,
                                      DT_Q5_1,   DT_Q4_1A8, DT_Q5_0A8, DT_Q5_1A8,  DT_Q4_0A8,
                                      DT_Q8_0,   DT_Q8_0A8, DT_IQ4_NL, DT_IQ4_NLA8};
#define NPACKED (sizeof packed_dtypes / sizeof *packed_dtypes)

/* Packing moves bytes only: any bytes come back from unpacking, and only
 * the 4-bit formats (IQ4_NL too) and Q8_0 (A16 and A8) with k % 32 == 0
 * are packed. */
Test(cpu_quant_perf, pack_round_trip)
{
    const int64_t ks[] = {32, 96, 128, 160, 576};
    uint64_t seed = 11;
    for (size_t ti = 0; ti < NPACKED; ti++) {
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
            DType t = packed_dtypes[ti];
            int64_t k = ks[ki], rows = 3;
            size_t n = (size_t)rows * dtype_row_bytes(t, k);
            unsigned char *a = malloc(n), *b = malloc(n), *c = malloc(n);
            for (size_t i = 0; i < n; i++)
                a[i] = (unsigned char)(lcg(&seed) * 127.0f + 128.0f);
            cr_assert(quant_cpu_packed(t, k));
            quant_cpu_pack(t, rows, k, a, b);
            quant_cpu_unpack(t, rows, k, b, c);
            cr_assert(memcmp(a, c, n) == 0, "%s k=%ld: unpack(pack(x)) != x", dtype_name(t), (long)k);
            cr_assert(k == 32 || memcmp(a, b, n) != 0, "%s k=%ld: packing changed nothing", dtype_name(t), (long)k);
            free(a), free(b), free(c);
        }
    }
    cr_assert(!quant_cpu_packed(DT_W4G32, 200) && !quant_cpu_packed(DT_Q8_0, 16384 + 32) &&
              !quant_cpu_packed(DT_W4A8G64, 576) && !quant_cpu_packed(DT_W4G128, 576) &&
              !quant_cpu_packed(DT_W4A8G32, 200));
}

/* The embedding gather reads packed rows element by element: every
 * element of a token's row, as quant.c dequantizes the unpacked row. */
static void check_packed_embed(DType t, int64_t k)
{
    const int64_t V = 16;
    Schedule *s = sched_new("pembed", "cpu", 1);
    s->shape = gemv_shape(k);
    int64_t st[2] = {V, k}, so[1] = {k}, one = 1;
    uint32_t tb = sched_add_buffer(s, "tok", DT_I32, BUF_IO, 1, &one);
    uint32_t wb = sched_add_buffer(s, "table", t, BUF_WEIGHT, 2, st);
    uint32_t ob = sched_add_buffer(s, "out", DT_F32, BUF_SCRATCH, 1, so);
    Access acc[5] = {{tb, ACC_R, {0, 0}, {1, 0}}, {wb, ACC_R, {0, 0}, {V * k, 0}}, {ob, ACC_W, {0, 0}, {k, 0}},
                     {BUF_NONE, 0, {0, 0}, {0, 0}}, {BUF_NONE, 0, {0, 0}, {0, 0}}};
    sched_op(s, 0, OP_EMBED, (int32_t[]){0, (int32_t)k}, acc);
    QKern q;
    qkern_build(&q, s, NULL);
    size_t rb = dtype_row_bytes(t, k);
    uint64_t seed = 5;
    unsigned char *raw = random_rows(t, V, k, &seed);
    float *want = malloc(sizeof(float) * (size_t)k);
    kernel_rows_put(t, V, k, raw, q.wts + s->bufs[wb].offset);
    *(int32_t *)(q.arena + s->bufs[tb].offset) = 13;
    qkern_step(&q);
    quant_row_dequant(dtype_layout(t), raw + 13 * rb, k, want);
    const float *got = (const float *)(q.arena + s->bufs[ob].offset);
    for (int64_t j = 0; j < k; j++)
        cr_assert_leq(fabsf(got[j] - want[j]), 1e-7f * fabsf(want[j]) + 1e-12f, "%s k=%ld element %ld: %g vs %g",
                      dtype_name(t), (long)k, (long)j, got[j], want[j]);
    free(raw), free(want);
    qkern_free(&q);
}

Test(cpu_quant_perf, packed_embed)
{
    for (size_t ti = 0; ti < NPACKED; ti++) {
        check_packed_embed(packed_dtypes[ti], 576);
        check_packed_embed(packed_dtypes[ti], 96);
    }
}

/* A NaN or an infinity in x reaches every output row of a packed A16
 * GEMV and of the 8-bit A16 ones (the integer kernels on VNNI hosts fall
 * back to the float ones for them). W4A8G32 is left out: its input is
 * int8 by definition. */
Test(cpu_quant_perf, packed_nonfinite_x)
{
    const int64_t rows = 8, k = 576;
    const float bad[2] = {NAN, INFINITY};
    const DType ts[] = {DT_Q4_0, DT_Q4_1, DT_W4G32, DT_W4G64, DT_W4G128, DT_Q8_0, DT_W8, DT_IQ4_NL};
    const char *cpu[3];
    int nc = int_targets(cpu);
    GemvSet set[3];
    gsets_build(set, cpu, nc, ts, sizeof ts / sizeof *ts, rows, k, 3);
    for (size_t ti = 0; ti < sizeof ts / sizeof *ts; ti++) {
        for (int bi = 0; bi < 2; bi++) {
            DType t = ts[ti];
            uint64_t seed = 9;
            unsigned char *raw = random_rows(t, rows, k, &seed);
            float x[576], y[8];
            for (int64_t j = 0; j < k; j++)
                x[j] = lcg(&seed);
            x[100] = bad[bi];
            for (int c = 0; c < nc; c++) {
                gset_run(&set[c], t, raw, x, y);
                for (int64_t r = 0; r < rows; r++)
                    cr_assert(!isfinite(y[r]), "%s %s, x with %g: row %ld is %g", cpu[c] ? cpu[c] : "host",
                              dtype_name(t), (double)bad[bi], (long)r, y[r]);
            }
            free(raw);
        }
    }
    gsets_free(set, nc);
}

/* The float one ulp from f away from zero (u > 0) or toward it. */
static float ulps_from(float f, int u)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    b = (uint32_t)((int64_t)b + u);
    memcpy(&f, &b, 4);
    return f;
}

/* x whose blocks of 32 each hold their largest |x| first and the rest
 * near half-integer multiples of d = max|x| / 127. In even blocks each
 * other element is the nearest float (within 8 ulps) to (n + 1/2) d whose
 * x * (1 / d) is no tie but rounds to another integer than x / d does,
 * where one exists, else (n + 1/4) d, so that no element there is a tie
 * either way; odd blocks hold the nearest floats to (n + 1/2) d (ties of
 * x / d among them). Returns how many elements are in the first kind,
 * i.e. come out one off from a kernel that takes x * (1 / d) for x / d. */
static int64_t near_half_x(float *x, int64_t k, uint64_t *seed)
{
    int64_t off = 0;
    for (int64_t b = 0; b < k / 32; b++) {
        float amax = 1.0f + 0.9f * fabsf(lcg(seed)), d = amax / 127.0f, r = 1.0f / d;
        x[32 * b] = b % 2 ? -amax : amax;
        for (int j = 1; j < 32; j++) {
            int n = (int)(125.0f * lcg(seed));
            float c = ((float)n + (n < 0 ? -0.5f : 0.5f)) * d, v = b % 2 ? c : ((float)n + 0.25f) * d;
            for (int u = 0; u <= 16 && b % 2 == 0; u++) {
                float t = ulps_from(c, u % 2 ? (u + 1) / 2 : -(u / 2)), p = t * r;
                if (fabsf(t) < amax && rintf(p) != rintf(t / d) && fabsf(p - rintf(p)) < 0.5f) {
                    v = t;
                    off++;
                    break;
                }
            }
            x[32 * b + j] = v;
        }
    }
    return off;
}

/* The int8 inputs of every A8 dtype are rint(x / d) (ir/dtype.h), also
 * where x times a rounded 1 / d lands on the other side of a half-integer
 * (the AVX-512 kernels quantize by that product and check how near a
 * half-integer it is: kernel_body.c, isa_avx512_act_block) and on exact
 * ties (k 576: a short last superblock, taken twice by the 512-bit packed
 * rows; 768: the k-quants). Against quant_gemv_a8_ref, which divides: one
 * input one off moves a row by |w| d, about 1e-4 of its sum of |w x|. */
Test(cpu_quant_perf, a8_inputs_round_as_divided)
{
    const DType ts[] = {DT_W8A8,   DT_W4A8G32, DT_W4A8G64, DT_W4A8G128, DT_Q8_0A8, DT_Q4_0A8, DT_Q4_1A8,
                        DT_Q5_0A8, DT_Q5_1A8,  DT_Q4_KA8,  DT_Q5_KA8,   DT_Q6_KA8};
    const int64_t ks[] = {576, 768}, rows = 9;
    const char *cpu[3];
    int nc = int_targets(cpu);
    for (size_t ki = 0; ki < 2; ki++) {
        int64_t k = ks[ki];
        float x[768], y[9];
        double ref[9];
        uint64_t seed = 17;
        int64_t off = near_half_x(x, k, &seed);
        cr_assert_geq(off, k / 32, "k %ld: only %ld inputs where x * (1 / d) rounds otherwise", (long)k, (long)off);
        GemvSet set[3];
        gsets_build(set, cpu, nc, ts, sizeof ts / sizeof *ts, rows, k, 5);
        for (size_t ti = 0; ti < sizeof ts / sizeof *ts; ti++) {
            if (!fits(ts[ti], k))
                continue;
            unsigned char *raw = random_rows(ts[ti], rows, k, &seed);
            quant_gemv_a8_ref(ts[ti], raw, rows, k, x, ref);
            float *deq = malloc(sizeof(float) * (size_t)k);
            for (int c = 0; c < nc; c++) {
                gset_run(&set[c], ts[ti], raw, x, y);
                for (int64_t r = 0; r < rows; r++) {
                    quant_row_dequant(dtype_layout(ts[ti]), raw + (size_t)r * dtype_row_bytes(ts[ti], k), k, deq);
                    double mag = 0;
                    for (int64_t j = 0; j < k; j++)
                        mag += fabs((double)deq[j] * x[j]);
                    cr_assert_leq(fabs(y[r] - ref[r]), 2e-6 * mag, "%s %s k %ld: row %ld is %.9g, not %.9g",
                                  cpu[c] ? cpu[c] : "host", dtype_name(ts[ti]), (long)k, (long)r, y[r], ref[r]);
                }
            }
            free(deq);
            free(raw);
        }
        gsets_free(set, nc);
    }
}

/* ---- GEMV bandwidth per dtype (MEGAC_CPU_BENCH=1) ---- */

static double elapsed_s(struct timespec a)
{
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
}

/* A switch in the environment: set, and neither empty nor "0". */
static bool env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static void bench_dtype(DType t, int nw, int64_t rows, int64_t k)
{
    Schedule *s = sched_new("qbench", "cpu", nw);
    s->shape = gemv_shape(k);
    int64_t sw[2] = {rows, k}, sx[1] = {k}, sy[1] = {rows};
    uint32_t wb = sched_add_buffer(s, "w", t, BUF_WEIGHT, 2, sw);
    uint32_t xb = sched_add_buffer(s, "x", DT_F32, BUF_STATE, 1, sx);
    uint32_t yb = sched_add_buffer(s, "y", DT_F32, BUF_SCRATCH, 1, sy);
    /* ops of at most op_rows rows (a decode step's GEMVs are small) */
    int64_t op_rows = getenv("MEGAC_QBENCH_OP_ROWS") ? atoll(getenv("MEGAC_QBENCH_OP_ROWS")) : rows;
    /* MEGAC_QBENCH_SCATTER=1: each worker visits its ops' row ranges in a
     * scattered order, so consecutive ops are not adjacent in memory (as in
     * a decode step, where a worker's next tile is in another matrix) */
    bool scatter = env_on("MEGAC_QBENCH_SCATTER");
    /* MEGAC_QBENCH_SYNC=1: ops as a decode step's GEMVs are: op i's rows
     * (op_rows a worker) cut into adjacent pieces, one a worker, and every
     * worker signals and then waits for all the others after each op */
    bool sync = env_on("MEGAC_QBENCH_SYNC");
    uint32_t done = sync ? sched_add_counter(s, "done") : 0;
    int64_t step = op_rows * nw, nsteps = sync ? (rows + step - 1) / step : 0;
    for (int64_t i = 0; i < nsteps; i++) {
        int64_t j = scatter && nsteps % 7919 ? i * 7919 % nsteps : i;
        for (int w = 0; w < nw; w++) {
            int64_t r0 = j * step + step * w / nw, r1 = j * step + step * (w + 1) / nw;
            r0 = r0 < rows ? r0 : rows, r1 = r1 < rows ? r1 : rows;
            if (r1 > r0) {
                Access acc[5] = {{wb, ACC_R, {r0 * k, 0}, {r1 * k, 0}}, {xb, ACC_R, {0, 0}, {k, 0}},
                                 {yb, ACC_W, {r0, 0}, {r1, 0}}, {BUF_NONE, 0, {0, 0}, {0, 0}},
                                 {BUF_NONE, 0, {0, 0}, {0, 0}}};
                sched_op(s, w, OP_GEMV, (int32_t[]){(int32_t)r0, (int32_t)r1, (int32_t)k, 0}, acc);
            }
            sched_signal(s, w, done, 1);
            sched_wait(s, w, done, (uint32_t)(nw * (i + 1)));
        }
    }
    for (int w = 0; w < nw && !sync; w++) {
        int64_t b = rows * w / nw, end = rows * (w + 1) / nw, nops = (end - b + op_rows - 1) / op_rows;
        for (int64_t i = 0; i < nops; i++) {
            int64_t j = scatter && nops % 7919 ? i * 7919 % nops : i; /* a permutation: 7919 is prime */
            int64_t r0 = b + j * op_rows, r1 = r0 + op_rows < end ? r0 + op_rows : end;
            Access acc[5] = {{wb, ACC_R, {r0 * k, 0}, {r1 * k, 0}}, {xb, ACC_R, {0, 0}, {k, 0}},
                             {yb, ACC_W, {r0, 0}, {r1, 0}}, {BUF_NONE, 0, {0, 0}, {0, 0}},
                             {BUF_NONE, 0, {0, 0}, {0, 0}}};
            sched_op(s, w, OP_GEMV, (int32_t[]){(int32_t)r0, (int32_t)r1, (int32_t)k, 0}, acc);
        }
    }
    QKern q;
    qkern_build(&q, s, getenv("MEGAC_CPU_TARGET"));
    uint64_t seed = 3;
    float *x = (float *)(q.arena + s->bufs[xb].offset);
    size_t rb = dtype_row_bytes(t, k);
    for (int64_t j = 0; j < k; j++)
        x[j] = lcg(&seed);
    int64_t nd = rows < 64 ? rows : 64; /* distinct rows, repeated */
    unsigned char *raw = random_rows(t, nd, k, &seed);
    kernel_rows_put(t, nd, k, raw, q.wts);
    for (int64_t r = nd; r < rows; r++)
        memcpy(q.wts + (size_t)r * rb, q.wts + (size_t)(r % nd) * rb, rb);
    free(raw);
    qkern_step(&q);
    /* MEGAC_QBENCH_REPS=R: each timed run calls each worker R times in a
     * row (times are per call), so that small weights in cache measure
     * the GEMV rather than the threads' start */
    int reps = getenv("MEGAC_QBENCH_REPS") ? atoi(getenv("MEGAC_QBENCH_REPS")) : 1;
    reps = reps < 1 ? 1 : reps > 100000 ? 100000 : reps;
    if (sync && reps > 1) /* the counters are reset per run, not per call */
        cr_assert_fail("MEGAC_QBENCH_SYNC takes one call per run: leave MEGAC_QBENCH_REPS unset");
    double best = 1e9, best_cpu = 1e9;
    for (int i = 0; i < 20; i++) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        double cpu = qkern_steps(&q, reps) / reps, dt = elapsed_s(t0) / reps;
        best = dt < best ? dt : best;
        best_cpu = cpu < best_cpu ? cpu : best_cpu;
    }
    double bytes = (double)rb * (double)rows;
    fprintf(stderr, "gemv %-9s %ldx%ld, %d worker(s): %7.1f MB, best %.2f ms = %5.1f GB/s (CPU time %5.1f GB/s)\n",
            dtype_name(t), (long)rows, (long)k, nw, bytes / 1e6, best * 1e3, bytes / best / 1e9,
            bytes / best_cpu / 1e9);
    qkern_free(&q);
}

Test(cpu_quant_perf, bandwidth, .timeout = 300)
{
    if (!getenv("MEGAC_CPU_BENCH"))
        cr_skip_test("set MEGAC_CPU_BENCH=1 to measure quantized GEMV bandwidth");
    const char *only = getenv("MEGAC_QBENCH_DTYPE");
    /* MEGAC_QBENCH_MB: weight megabytes (default 256, far past the caches;
     * ~1 fits in L2 and gives the kernels' arithmetic rate) */
    double mb = getenv("MEGAC_QBENCH_MB") ? atof(getenv("MEGAC_QBENCH_MB")) : 256.0;
    if (!(mb >= 0.1 && mb <= 4096))
        cr_assert_fail("MEGAC_QBENCH_MB=%s: want 0.1 to 4096", getenv("MEGAC_QBENCH_MB"));
    const DType ts[] = {DT_F32,    DT_W8,       DT_Q8_0,   DT_Q4_0,   DT_Q4_1, DT_W4G32, DT_W4G64,
                        DT_W4G128, DT_W8A8,     DT_W4A8G32, DT_W4A8G64, DT_W4A8G128, DT_Q4_1A8,
                        DT_Q8_0A8, DT_Q5_0,     DT_Q5_1,   DT_Q4_K,   DT_Q5_K, DT_Q6_K, DT_Q5_0A8, DT_Q5_1A8,
                        DT_Q4_KA8, DT_Q5_KA8, DT_Q6_KA8, DT_Q4_0A8};
    bool listed = !only;
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        listed |= only && strcmp(only, dtype_name(ts[i])) == 0;
    if (!listed)
        cr_assert_fail("MEGAC_QBENCH_DTYPE=%s: not a dtype this benchmark measures", only);
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
        if (only && strcmp(only, dtype_name(ts[i])) != 0)
            continue;
        /* MEGAC_QBENCH_K: the row length (default SmolLM2's 576, 768 for
         * the k-quants' whole super-blocks) */
        int64_t k = getenv("MEGAC_QBENCH_K") ? atoll(getenv("MEGAC_QBENCH_K")) : dtype_is_kquant(dtype_layout(ts[i])) ? 768 : 576;
        if (k < 1 || k > 65536)
            cr_assert_fail("MEGAC_QBENCH_K=%s: want 1 to 65536", getenv("MEGAC_QBENCH_K"));
        if (!fits(ts[i], k)) {
            fprintf(stderr, "gemv %-9s k=%ld: not whole blocks, skipped\n", dtype_name(ts[i]), (long)k);
            continue;
        }
        int64_t rows = (int64_t)(mb * 1e6 / (double)dtype_row_bytes(ts[i], k)) / 8 * 8;
        if (rows < 8)
            cr_assert_fail("MEGAC_QBENCH_MB=%g holds fewer than 8 %s rows of %ld", mb, dtype_name(ts[i]), (long)k);
        for (int nw = 1; nw <= 2; nw++)
            bench_dtype(ts[i], nw, rows, k);
    }
}
