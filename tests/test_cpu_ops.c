/*
 * test_cpu_ops.c - the CPU backend end to end: small schedules built in
 * memory with the ir.h API are compiled by cg_cpu_compile into a temporary
 * kernel.so, loaded with dlopen and run by a small pthread harness (one
 * thread per worker, counters zeroed before each step), on random inputs.
 * Every op is compared against a scalar double-precision implementation
 * written here from the semantics of ir/ops.h; then a multi-worker
 * signal/wait chain, the wait watchdog and spin policy, and the bad-position
 * guard.
 *
 * MEGAC_CPU_BENCH=1 also runs a large GEMV and prints its bandwidth;
 * MEGAC_CPU_TARGET=x86-64-v3 compiles for a named CPU instead of the host;
 * MEGAC_CPU_KEEP=1 keeps each kernel.so and its kernel.ll in /tmp.
 */
#include "compiler/compile.h"
#include "codegen/codegen.h"
#include "codegen/cpu/kernel_table.h"
#include "runtime/kernel_abi.h"
#include "tests/harness.h"
#include "tests/scores.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>

/* ---- harness ---- */

typedef void (*WorkerFn)(const MegacArgs *, uint32_t);

typedef struct Kern {
    Schedule *s;
    char dir[64], so[96];
    void *dl;
    WorkerFn worker;
    char *weights, *arena;
    uint32_t *ctrs;
    MegacAbort abort_info;
    int64_t prompt_end;     /* MegacArgs.prompt_end of the steps (-1: none) */
    uint64_t flags;         /* MegacArgs.flags of the steps */
} Kern;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static void *zalloc64(uint64_t n)
{
    size_t m = (size_t)((n + 63) / 64 * 64);
    void *p = aligned_alloc(64, m ? m : 64);
    cr_assert_not_null(p);
    memset(p, 0, m ? m : 64);
    return p;
}

static void kern_build(Kern *k, Schedule *s)
{
    memset(k, 0, sizeof *k);
    k->s = s;
    k->prompt_end = -1;
    sched_layout(s);
    strcpy(k->dir, "/tmp/megac_cpu_XXXXXX");
    cr_assert_not_null(mkdtemp(k->dir));
    snprintf(k->so, sizeof k->so, "%s/kernel.so", k->dir);
    Diag d;
    diag_init(&d);
    CpuOptions o = {.cpu = getenv("MEGAC_CPU_TARGET"), .verbose = getenv("MEGAC_CPU_VERBOSE") != NULL,
                    .keep_ir = getenv("MEGAC_CPU_KEEP") != NULL};
    cr_assert(cg_cpu_compile(s, &o, k->so, &d), "cg_cpu_compile failed");
    k->dl = dlopen(k->so, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(k->dl, "dlopen: %s", dlerror());
    k->worker = (WorkerFn)(uintptr_t)dlsym(k->dl, "megac_worker");
    cr_assert_not_null(k->worker);
    const uint64_t *abi = dlsym(k->dl, "megac_kernel_abi"), *hash = dlsym(k->dl, "megac_schedule_hash");
    const uint32_t *nw = dlsym(k->dl, "megac_num_workers");
    cr_assert(abi && hash && nw);
    cr_assert_eq(*abi, MEGAC_KERNEL_ABI);
    cr_assert_eq(*hash, sched_hash(s));
    cr_assert_eq(*nw, s->nworkers);
    k->weights = zalloc64(s->weights_bytes);
    k->arena = zalloc64(s->arena_bytes);
    k->ctrs = zalloc64(4 * (s->nctrs + 1));
}

static void kern_free(Kern *k)
{
    dlclose(k->dl);
    if (getenv("MEGAC_CPU_KEEP")) {
        fprintf(stderr, "kept %s\n", k->dir);
    } else {
        unlink(k->so);
        rmdir(k->dir);
    }
    free(k->weights);
    free(k->arena);
    free(k->ctrs);
    sched_free(k->s);
}

static void *buf(Kern *k, uint32_t b)
{
    const Buffer *bf = &k->s->bufs[b];
    return (bf->cls == BUF_WEIGHT ? k->weights : k->arena) + bf->offset;
}

static void fill(Kern *k, uint32_t b)
{
    float *p = buf(k, b);
    for (int64_t i = 0; i < k->s->bufs[b].nelem; i++)
        p[i] = rnd();
}

typedef struct {
    Kern *k;
    MegacArgs *args;
    uint32_t w;
    double cpu_s;           /* CPU time the worker spent in the step */
} Job;

static double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Largest CPU time a worker spent in the last step (benchmarks: unlike
 * wall time, it does not count time the thread was preempted). */
static double last_step_cpu_s;

static void *job_main(void *p)
{
    Job *j = p;
    double t0 = thread_cpu_s();
    j->k->worker(j->args, j->w);
    j->cpu_s = thread_cpu_s() - t0;
    return NULL;
}

/* One decode step: counters zeroed, one thread per worker. */
static void kern_step(Kern *k, int64_t pos, uint64_t timeout_ns)
{
    uint32_t n = k->s->nworkers;
    memset(k->ctrs, 0, 4 * (k->s->nctrs + 1));
    last_step_cpu_s = 0;
    MegacArgs args = {k->weights, k->arena, k->ctrs, &k->abort_info, pos, timeout_ns, k->prompt_end, 0, k->flags};
    pthread_t th[16];
    Job jobs[16];
    cr_assert(n <= 16);
    for (uint32_t w = 0; w < n; w++) {
        jobs[w] = (Job){k, &args, w, 0};
        cr_assert_eq(pthread_create(&th[w], NULL, job_main, &jobs[w]), 0);
    }
    for (uint32_t w = 0; w < n; w++) {
        pthread_join(th[w], NULL);
        last_step_cpu_s = jobs[w].cpu_s > last_step_cpu_s ? jobs[w].cpu_s : last_step_cpu_s;
    }
}

static uint32_t add_buf(Schedule *s, const char *name, BufClass c, int64_t n)
{
    return sched_add_buffer(s, name, DT_F32, c, 1, &n);
}

/* Op with whole-buffer accesses (the backend only uses the buffer). */
static void add_op(Schedule *s, int w, int op, const int32_t *p, const uint32_t *bufs)
{
    const OpInfo *oi = op_info(op);
    Access acc[OP_MAX_OPERANDS];
    for (int i = 0; i < oi->noperands; i++) {
        uint32_t b = bufs[i];
        int64_t n = b == BUF_NONE ? 0 : s->bufs[b].nelem;
        acc[i] = (Access){b, (uint8_t)(i == 0 ? ACC_RW : ACC_R), affine_const(0), affine_const(n)};
    }
    sched_op(s, w, op, p, acc);
}

static void expect_close(const char *what, const float *got, const double *ref, const double *mag, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double scale = mag ? mag[i] : fabs(ref[i]);
        double tol = 1e-5 * (scale + 1e-2);
        cr_assert(fabs((double)got[i] - ref[i]) <= tol, "%s[%ld]: got %.9g, want %.9g (tol %.3g)", what, (long)i,
                  (double)got[i], ref[i], tol);
    }
}

/* ---- reference ops, in double ---- */

static double ref_rms_scale(const float *x, int64_t n, double eps)
{
    double ss = 0;
    for (int64_t j = 0; j < n; j++)
        ss += (double)x[j] * x[j];
    return 1.0 / sqrt(ss / (double)n + eps);
}

/* y[r] for r in [r0, r1); other entries keep y0. */
static void ref_gemv(const float *W, const float *x, const float *nw, const float *b, const float *y0, int64_t rows,
                     int64_t r0, int64_t r1, int64_t k, int flags, double eps, double *y, double *mag)
{
    double sc = (flags & GEMV_NORM) ? ref_rms_scale(x, k, eps) : 1.0;
    for (int64_t r = 0; r < rows; r++) {
        y[r] = y0[r];
        mag[r] = fabs(y0[r]);
        if (r < r0 || r >= r1)
            continue;
        double acc = 0, m = 0;
        for (int64_t j = 0; j < k; j++) {
            double xin = (flags & GEMV_NORM) ? x[j] * sc * nw[j] : x[j];
            acc += (double)W[r * k + j] * xin;
            m += fabs((double)W[r * k + j] * xin);
        }
        if (flags & GEMV_BIAS)
            acc += b[r], m += fabs(b[r]);
        y[r] = (flags & GEMV_ACCUM) ? y0[r] + acc : acc;
        mag[r] = m + ((flags & GEMV_ACCUM) ? fabs(y0[r]) : 0);
    }
}

static void ref_rope(const float *v, int64_t n, const float *tab, int64_t pos, int64_t h0, int64_t h1, int64_t hd,
                     int half, double *out)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = v[i];
    for (int64_t h = h0; h < h1; h++) {
        for (int64_t i = 0; i < hd / 2; i++) {
            int64_t i0 = half ? i : 2 * i, i1 = half ? i + hd / 2 : 2 * i + 1;
            double c = tab[(pos * (hd / 2) + i) * 2], s = tab[(pos * (hd / 2) + i) * 2 + 1];
            double x0 = v[h * hd + i0], x1 = v[h * hd + i1];
            out[h * hd + i0] = x0 * c - x1 * s;
            out[h * hd + i1] = x0 * s + x1 * c;
        }
    }
}

/* ---- the op schedule ---- */

enum { HD = 20, NH = 4, NKV = 2, G = NH / NKV, DIM = NH * HD, HID = 100, VOCAB = 37, SEQ = 16, NSPLIT = 3, BLOCK = 2 };

typedef struct OpBufs {
    uint32_t tok, table, emb_out;
    uint32_t rx, rw, rout;
    uint32_t W1, x1, nw1, b1, y_plain, y_acc, y_norm;
    uint32_t W2, x2, nw2, b2, y_all;
    uint32_t vq, rope;
    uint32_t kin, vin, kca, vca;
    uint32_t q, kc, vc, part;
    uint32_t partc, outc;
    uint32_t sg, su, sout, aa, ab;
    uint32_t xam, amax, amaxc, amout;
} OpBufs;

static ModelShape op_shape(int pairing)
{
    return (ModelShape){.dim = DIM, .hidden_dim = HID, .n_layers = 1, .n_heads = NH, .n_kv_heads = NKV,
                        .head_dim = HD, .vocab_size = VOCAB, .max_seq = SEQ, .norm_eps = 1e-5,
                        .rope_pairing = pairing};
}

static void op_buffers(Schedule *s, OpBufs *b)
{
    int64_t one = 1, tshape[2] = {VOCAB, DIM};
    b->tok = sched_add_buffer(s, "tok", DT_I32, BUF_IO, 1, &one);
    b->table = sched_add_buffer(s, "embed", DT_F32, BUF_WEIGHT, 2, tshape);
    b->emb_out = add_buf(s, "emb_out", BUF_SCRATCH, DIM);
    b->rx = add_buf(s, "rx", BUF_STATE, DIM), b->rw = add_buf(s, "rw", BUF_WEIGHT, DIM);
    b->rout = add_buf(s, "rout", BUF_SCRATCH, DIM);
    b->W1 = add_buf(s, "W1", BUF_WEIGHT, 37 * DIM), b->x1 = add_buf(s, "x1", BUF_STATE, DIM);
    b->nw1 = add_buf(s, "nw1", BUF_WEIGHT, DIM), b->b1 = add_buf(s, "b1", BUF_WEIGHT, 37);
    b->y_plain = add_buf(s, "y_plain", BUF_SCRATCH, 37), b->y_acc = add_buf(s, "y_acc", BUF_SCRATCH, 37);
    b->y_norm = add_buf(s, "y_norm", BUF_SCRATCH, 37);
    b->W2 = add_buf(s, "W2", BUF_WEIGHT, 23 * HID), b->x2 = add_buf(s, "x2", BUF_STATE, HID);
    b->nw2 = add_buf(s, "nw2", BUF_WEIGHT, HID), b->b2 = add_buf(s, "b2", BUF_WEIGHT, 23);
    b->y_all = add_buf(s, "y_all", BUF_SCRATCH, 23);
    b->vq = add_buf(s, "vq", BUF_SCRATCH, NH * HD), b->rope = add_buf(s, "rope", BUF_WEIGHT, SEQ * HD);
    b->kin = add_buf(s, "kin", BUF_SCRATCH, NKV * HD), b->vin = add_buf(s, "vin", BUF_SCRATCH, NKV * HD);
    b->kca = add_buf(s, "kca", BUF_KV, NKV * SEQ * HD), b->vca = add_buf(s, "vca", BUF_KV, NKV * SEQ * HD);
    b->q = add_buf(s, "q", BUF_SCRATCH, NH * HD);
    b->kc = add_buf(s, "kc", BUF_KV, NKV * SEQ * HD), b->vc = add_buf(s, "vc", BUF_KV, NKV * SEQ * HD);
    b->part = add_buf(s, "part", BUF_SCRATCH, NKV * NSPLIT * G * (HD + 2));
    b->partc = add_buf(s, "partc", BUF_SCRATCH, NKV * NSPLIT * G * (HD + 2));
    b->outc = add_buf(s, "outc", BUF_SCRATCH, NH * HD);
    b->sg = add_buf(s, "sg", BUF_SCRATCH, HID), b->su = add_buf(s, "su", BUF_SCRATCH, HID);
    b->sout = add_buf(s, "sout", BUF_SCRATCH, HID);
    b->aa = add_buf(s, "aa", BUF_SCRATCH, HID), b->ab = add_buf(s, "ab", BUF_SCRATCH, HID);
    b->xam = add_buf(s, "xam", BUF_SCRATCH, VOCAB), b->amax = add_buf(s, "amax", BUF_SCRATCH, 6);
    b->amaxc = add_buf(s, "amaxc", BUF_SCRATCH, 8);
    b->amout = sched_add_buffer(s, "amout", DT_I32, BUF_IO, 1, &one);
}

#define OP(o, p, ...) add_op(s, (w++) % nw, o, (const int32_t[])p, (const uint32_t[]){__VA_ARGS__})
#define P(...) {__VA_ARGS__}

/* Every op at least once, independent of each other, round-robin over the
 * workers (no op reads what another writes, so no sync is needed). */
static void op_insts(Schedule *s, const OpBufs *b, int nw)
{
    int w = 0;
    const uint32_t N = BUF_NONE;
    OP(OP_EMBED, P(8, 72), b->tok, b->table, b->emb_out);
    OP(OP_RMSNORM, P(DIM), b->rx, b->rw, b->rout);
    OP(OP_GEMV, P(0, 37, DIM, 0), b->W1, b->x1, b->y_plain, N, N);
    OP(OP_GEMV, P(5, 31, DIM, GEMV_ACCUM | GEMV_BIAS), b->W1, b->x1, b->y_acc, N, b->b1);
    OP(OP_GEMV, P(0, 37, DIM, GEMV_NORM), b->W1, b->x1, b->y_norm, b->nw1, N);
    OP(OP_GEMV, P(2, 23, HID, GEMV_NORM | GEMV_ACCUM | GEMV_BIAS), b->W2, b->x2, b->y_all, b->nw2, b->b2);
    OP(OP_ROPE, P(1, 4), b->vq, b->rope);
    OP(OP_KV_APPEND, P(1), b->kin, b->vin, b->kca, b->vca);
    for (int h = 0; h < NKV; h++)
        for (int sp = 0; sp < NSPLIT; sp++)
            OP(OP_ATTN, P(h, sp, NSPLIT, BLOCK, 0), b->q, b->kc, b->vc, b->part, BUF_NONE);
    OP(OP_ATTN_COMBINE, P(0, NSPLIT, NKV), b->partc, b->outc); /* every head in one op */
    OP(OP_SILU_MUL, P(3, 90), b->sg, b->su, b->sout);
    OP(OP_ADD, P(0, HID), b->aa, b->ab);
    OP(OP_ARGMAX, P(0, 13, 0), b->xam, b->amax);
    OP(OP_ARGMAX, P(13, 26, 1), b->xam, b->amax);
    OP(OP_ARGMAX, P(26, 37, 2), b->xam, b->amax);
    OP(OP_ARGMAX_COMBINE, P(4), b->amaxc, b->amout);
}

static Kern op_kernel(int nw, int pairing, OpBufs *b)
{
    Schedule *s = sched_new("cpu_ops", "cpu", nw);
    s->shape = op_shape(pairing);
    op_buffers(s, b);
    op_insts(s, b, nw);
    Kern k;
    kern_build(&k, s);
    return k;
}

/* Random inputs, with the structure some ops need. */
static void op_inputs(Kern *k, const OpBufs *b)
{
    for (uint32_t i = 0; i < k->s->nbufs; i++)
        if (k->s->bufs[i].dtype == DT_F32)
            fill(k, i);
    *(int32_t *)buf(k, b->tok) = 29;
    float *xam = buf(k, b->xam);
    xam[2] = xam[5] = 3.0f;   /* tie inside slot 0: 2 wins */
    xam[17] = xam[30] = 5.0f; /* equal maxima of slots 1 and 2 */
    float *pc = buf(k, b->partc);
    for (int i = 0; i < NKV * NSPLIT * G; i++) {
        float *e = pc + i * (HD + 2);
        e[HD] = 2.0f * rnd();
        e[HD + 1] = 1.5f + rnd();
        if (i % 5 == 3) /* an empty split */
            memset(e, 0, HD * sizeof(float)), e[HD] = -INFINITY, e[HD + 1] = 0;
    }
    float *am = buf(k, b->amaxc);
    float vals[8] = {3, 40, 7, 12, 7, 9, 2, 41};
    memcpy(am, vals, sizeof vals); /* max 7 at indices 12 and 9: 9 wins */
    *(int32_t *)buf(k, b->amout) = -1;
}

/* Snapshot of a buffer before the step, for in-place and untouched parts. */
static float *snap(Kern *k, uint32_t b)
{
    size_t n = (size_t)k->s->bufs[b].nelem * sizeof(float);
    float *p = malloc(n);
    memcpy(p, buf(k, b), n);
    return p;
}

static void check_gemv(Kern *k, const char *what, uint32_t W, uint32_t x, uint32_t nw, uint32_t bb, uint32_t y,
                       const float *y0, int64_t r0, int64_t r1, int64_t kk, int flags)
{
    int64_t rows = k->s->bufs[y].nelem;
    double ref[128], mag[128];
    ref_gemv(buf(k, W), buf(k, x), buf(k, nw), buf(k, bb), y0, rows, r0, r1, kk, flags, 1e-5, ref, mag);
    expect_close(what, buf(k, y), ref, mag, rows);
}

/* Whether entry x of n falls in split sp of ns: blocks of `block`
 * entries, split sp taking the blocks [sp*nb/ns, (sp+1)*nb/ns) of the nb
 * (ir/ops.h). Written from that text, not from the kernels. */
static bool in_split(int64_t x, int64_t n, int64_t block, int ns, int sp)
{
    int64_t j = x / block, nb = (n + block - 1) / block;
    return sp * nb / ns <= j && j < (sp + 1) * nb / ns;
}

/* The float64 partial of OP_ATTN for q head g of kv head h (g q heads a
 * kv head, rows of hd, seq a head in the caches kc, vc, given in double:
 * the values the cache holds), split sp of nsplit in blocks of `block` over
 * rows [0, pos]: want[0:hd] the outputs, want[hd] m, want[hd + 1] l, and
 * mag the size of the terms each sums (o may cancel). */
static void ref_attn_part(const float *q, const double *kc, const double *vc, int hd, int gq, int64_t seq, int h,
                          int g, int64_t pos, int64_t block, int nsplit, int sp, double *want, double *mag)
{
    double m = -INFINITY, *sc = malloc(sizeof(double) * (size_t)(pos + 1));
    cr_assert_not_null(sc);
    memset(want, 0, sizeof(double) * (size_t)(hd + 2));
    memset(mag, 0, sizeof(double) * (size_t)(hd + 2));
    for (int64_t t = 0; t <= pos; t++) {
        sc[t] = -INFINITY;
        if (!in_split(t, pos + 1, block, nsplit, sp))
            continue;
        double d = 0;
        for (int j = 0; j < hd; j++)
            d += (double)q[(h * gq + g) * hd + j] * kc[(h * seq + t) * hd + j];
        sc[t] = d / sqrt((double)hd);
        m = fmax(m, sc[t]);
    }
    for (int64_t t = 0; t <= pos; t++) {
        if (sc[t] == -INFINITY)
            continue;
        double e = exp(sc[t] - m);
        want[hd + 1] += e;
        for (int j = 0; j < hd; j++) {
            want[j] += e * vc[(h * seq + t) * hd + j];
            mag[j] += fabs(e * vc[(h * seq + t) * hd + j]);
        }
    }
    want[hd] = m, mag[hd] = fabs(m), mag[hd + 1] = want[hd + 1];
    free(sc);
}

/* The partials of OP_ATTN over caches kc, vc (given in double: the values
 * the cache holds) against the kernel's part. */
static void check_attn_parts(const float *q, const double *kc, const double *vc, const float *part, int64_t pos)
{
    for (int h = 0; h < NKV; h++)
        for (int sp = 0; sp < NSPLIT; sp++)
            for (int g = 0; g < G; g++) {
                double want[HD + 2], mag[HD + 2];
                ref_attn_part(q, kc, vc, HD, G, SEQ, h, g, pos, BLOCK, NSPLIT, sp, want, mag);
                double m = want[HD];
                const float *got = part + ((h * NSPLIT + sp) * G + g) * (HD + 2);
                if (m == -INFINITY) {
                    cr_assert(got[HD] == -INFINITY && got[HD + 1] == 0, "empty split h%d s%d: m %g l %g", h, sp,
                              (double)got[HD], (double)got[HD + 1]);
                    expect_close("attn empty split", got, want, NULL, HD);
                } else {
                    expect_close("attn partial", got, want, mag, HD + 2); /* to the terms' size: o may cancel */
                }
            }
}

static void check_attn(Kern *k, const OpBufs *b, int64_t pos)
{
    static double kc[NKV * SEQ * HD], vc[NKV * SEQ * HD];
    const float *kf = buf(k, b->kc), *vf = buf(k, b->vc);
    for (int i = 0; i < NKV * SEQ * HD; i++)
        kc[i] = kf[i], vc[i] = vf[i];
    check_attn_parts(buf(k, b->q), kc, vc, buf(k, b->part), pos);
}

/* The test's own merge of the ns partials of q head g of kv head h
 * (layout [kv][ns][g][hd + 2], as ops.h says) into o[0:hd], normalized. */
static void combine_partials(const float *part, int h, int ns, int g, int groups, int hd, double *o)
{
    double M = -INFINITY, L = 0;
    for (int sp = 0; sp < ns; sp++)
        M = fmax(M, part[((h * ns + sp) * groups + g) * (hd + 2) + hd]);
    for (int j = 0; j < hd; j++)
        o[j] = 0;
    for (int sp = 0; sp < ns; sp++) {
        const float *e = part + ((h * ns + sp) * groups + g) * (hd + 2);
        if (e[hd] == -INFINITY)
            continue;
        double f = exp(e[hd] - M);
        L += e[hd + 1] * f;
        for (int j = 0; j < hd; j++)
            o[j] += e[j] * f;
    }
    for (int j = 0; j < hd; j++)
        o[j] /= L;
}

static void check_attn_combine(Kern *k, const OpBufs *b)
{
    const float *pc = buf(k, b->partc);
    double ref[NH * HD];
    for (int h = 0; h < NKV; h++)
        for (int g = 0; g < G; g++)
            combine_partials(pc, h, NSPLIT, g, G, HD, ref + (h * G + g) * HD);
    expect_close("attn_combine", buf(k, b->outc), ref, NULL, NH * HD);
}

static void check_elementwise(Kern *k, const OpBufs *b, const float *aa0)
{
    double ref[HID > VOCAB ? HID : VOCAB];
    const float *g = buf(k, b->sg), *u = buf(k, b->su), *sout = buf(k, b->sout), *ab = buf(k, b->ab);
    for (int r = 3; r < 90; r++)
        ref[r - 3] = g[r] / (1.0 + exp(-(double)g[r])) * u[r];
    expect_close("silu_mul", sout + 3, ref, NULL, 87);
    for (int r = 0; r < HID; r++)
        ref[r] = (double)aa0[r] + ab[r];
    expect_close("add", buf(k, b->aa), ref, NULL, HID);
}

static void check_argmax(Kern *k, const OpBufs *b)
{
    const float *x = buf(k, b->xam), *am = buf(k, b->amax);
    int bounds[4] = {0, 13, 26, 37};
    for (int sl = 0; sl < 3; sl++) {
        int best = bounds[sl];
        for (int r = bounds[sl]; r < bounds[sl + 1]; r++)
            if (x[r] > x[best])
                best = r;
        cr_assert_eq(am[2 * sl], x[best], "argmax slot %d value", sl);
        cr_assert_eq(am[2 * sl + 1], (float)best, "argmax slot %d index %g, want %d", sl, (double)am[2 * sl + 1], best);
    }
    cr_assert_eq(am[1], 2.0f, "a tie inside a slot keeps the first index");
    cr_assert(am[3] == 17.0f && am[5] == 30.0f);
    cr_assert_eq(*(int32_t *)buf(k, b->amout), 9, "argmax_combine: lowest index among equal maxima");
}

static void check_misc(Kern *k, const OpBufs *b, const float *emb0, const float *vq0, int64_t pos, int half)
{
    const float *out = buf(k, b->emb_out), *tab = buf(k, b->table);
    for (int c = 0; c < DIM; c++)
        cr_assert_eq(out[c], c >= 8 && c < 72 ? tab[29 * DIM + c] : emb0[c], "embed[%d]", c);
    double ref[NH * HD], mag[NH * HD];
    double sc = ref_rms_scale(buf(k, b->rx), DIM, 1e-5);
    const float *rx = buf(k, b->rx), *rw = buf(k, b->rw);
    for (int j = 0; j < DIM; j++)
        ref[j] = rx[j] * sc * rw[j];
    expect_close("rmsnorm", buf(k, b->rout), ref, NULL, DIM);
    ref_rope(vq0, NH * HD, buf(k, b->rope), pos, 1, 4, HD, half, ref);
    for (int j = 0; j < NH * HD; j++)
        mag[j] = 2.0;
    expect_close("rope", buf(k, b->vq), ref, mag, NH * HD);
    const float *kin = buf(k, b->kin), *vin = buf(k, b->vin), *kca = buf(k, b->kca), *vca = buf(k, b->vca);
    cr_assert(memcmp(kca + (1 * SEQ + pos) * HD, kin + HD, HD * sizeof(float)) == 0, "kv_append k row");
    cr_assert(memcmp(vca + (1 * SEQ + pos) * HD, vin + HD, HD * sizeof(float)) == 0, "kv_append v row");
}

/* Builds the op schedule for nw workers and checks every op at a few
 * positions (pos 1 leaves attention splits empty). */
static void run_ops(int nw, int pairing)
{
    OpBufs b;
    Kern k = op_kernel(nw, pairing, &b);
    int64_t positions[] = {0, 1, 7, SEQ - 1};
    for (int i = 0; i < 4; i++) {
        op_inputs(&k, &b);
        float *y_acc = snap(&k, b.y_acc), *y_all = snap(&k, b.y_all), *y_plain = snap(&k, b.y_plain);
        float *y_norm = snap(&k, b.y_norm), *emb = snap(&k, b.emb_out), *vq = snap(&k, b.vq), *aa = snap(&k, b.aa);
        kern_step(&k, positions[i], 0);
        cr_assert_eq(k.abort_info.flag, 0);
        check_gemv(&k, "gemv plain", b.W1, b.x1, b.nw1, b.b1, b.y_plain, y_plain, 0, 37, DIM, 0);
        check_gemv(&k, "gemv accum+bias", b.W1, b.x1, b.nw1, b.b1, b.y_acc, y_acc, 5, 31, DIM, GEMV_ACCUM | GEMV_BIAS);
        check_gemv(&k, "gemv norm", b.W1, b.x1, b.nw1, b.b1, b.y_norm, y_norm, 0, 37, DIM, GEMV_NORM);
        check_gemv(&k, "gemv norm+accum+bias", b.W2, b.x2, b.nw2, b.b2, b.y_all, y_all, 2, 23, HID,
                   GEMV_NORM | GEMV_ACCUM | GEMV_BIAS);
        check_misc(&k, &b, emb, vq, positions[i], pairing);
        check_attn(&k, &b, positions[i]);
        check_attn_combine(&k, &b);
        check_elementwise(&k, &b, aa);
        check_argmax(&k, &b);
        free(y_acc), free(y_all), free(y_plain), free(y_norm), free(emb), free(vq), free(aa);
    }
    kern_free(&k);
}

/* ---- f16 and bf16 KV caches (compile.kv_dtype) ---- */

static uint16_t half_bits(DType t, float f)
{
    return t == DT_F16 ? f32_to_f16(f) : f32_to_bf16(f);
}

static double half_value(DType t, uint16_t h)
{
    return t == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* kv_append writes each element as ir/util.c rounds it (to nearest even,
 * with the edge cases in k: ties, the f16 overflow edge, subnormals), and
 * attn over a random f16 or bf16 cache gives the float64 attention over
 * the values stored, at 1 and 2 workers. */
Test(cpu_ops, half_caches)
{
    const DType types[] = {DT_F16, DT_BF16};
    const float edge[] = {65504.0f, 65519.0f, 65520.0f, -1e6f, 1e-6f, -3e-7f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f,
                          1.0f + 0x1p-8f, 1.0f + 0x3p-8f, 0.0f, -0.0f, 6.1035156e-5f, 3.0e-8f};
    for (int ti = 0; ti < 2; ti++)
        for (int nw = 1; nw <= 2; nw++) {
            DType t = types[ti];
            Schedule *s = sched_new("half_caches", "cpu", nw);
            s->shape = op_shape(0);
            int64_t ncache = NKV * SEQ * HD;
            uint32_t kin = add_buf(s, "kin", BUF_SCRATCH, NKV * HD), vin = add_buf(s, "vin", BUF_SCRATCH, NKV * HD);
            uint32_t kca = sched_add_buffer(s, "kca", t, BUF_KV, 1, &ncache);
            uint32_t vca = sched_add_buffer(s, "vca", t, BUF_KV, 1, &ncache);
            uint32_t q = add_buf(s, "q", BUF_SCRATCH, NH * HD);
            uint32_t kc = sched_add_buffer(s, "kc", t, BUF_KV, 1, &ncache);
            uint32_t vc = sched_add_buffer(s, "vc", t, BUF_KV, 1, &ncache);
            uint32_t part = add_buf(s, "part", BUF_SCRATCH, NKV * NSPLIT * G * (HD + 2));
            int w = 0;
            for (int h = 0; h < NKV; h++)
                OP(OP_KV_APPEND, P(h), kin, vin, kca, vca);
            for (int h = 0; h < NKV; h++)
                for (int sp = 0; sp < NSPLIT; sp++)
                    OP(OP_ATTN, P(h, sp, NSPLIT, BLOCK, 0), q, kc, vc, part, BUF_NONE);
            Kern k;
            kern_build(&k, s);
            static double kd[NKV * SEQ * HD], vd[NKV * SEQ * HD];
            uint16_t *kh = buf(&k, kc), *vh = buf(&k, vc);
            for (int64_t i = 0; i < ncache; i++) {
                kh[i] = half_bits(t, 3.0f * rnd()), vh[i] = half_bits(t, 3.0f * rnd());
                kd[i] = half_value(t, kh[i]), vd[i] = half_value(t, vh[i]);
            }
            int64_t positions[] = {0, 5, SEQ - 1};
            for (int i = 0; i < 3; i++) {
                int64_t pos = positions[i];
                fill(&k, kin), fill(&k, vin), fill(&k, q);
                float *kf = buf(&k, kin), *vf = buf(&k, vin);
                for (size_t e = 0; e < sizeof edge / sizeof edge[0]; e++)
                    kf[e] = edge[e], vf[NKV * HD - 1 - e] = -edge[e];
                kern_step(&k, pos, 0);
                cr_assert_eq(k.abort_info.flag, 0);
                const uint16_t *ka = buf(&k, kca), *va = buf(&k, vca);
                for (int h = 0; h < NKV; h++)
                    for (int j = 0; j < HD; j++) {
                        int64_t c = (h * SEQ + pos) * HD + j;
                        cr_assert_eq(ka[c], half_bits(t, kf[h * HD + j]), "%s kv_append k[%d][%d] = %.9g: %04x, want %04x",
                                     dtype_name(t), h, j, (double)kf[h * HD + j], ka[c], half_bits(t, kf[h * HD + j]));
                        cr_assert_eq(va[c], half_bits(t, vf[h * HD + j]), "%s kv_append v[%d][%d]", dtype_name(t), h, j);
                    }
                check_attn_parts(buf(&k, q), kd, vd, buf(&k, part), pos);
            }
            kern_free(&k);
        }
}

/* attn for shapes that take every path of the kernel's head tiles and row
 * pieces: more q heads a kv head than one tile holds (5, 9), rows of 64
 * elements and more with a rest of 16s and single ones (84), rows under 16
 * (8, as stories260K), in f32, f16 and bf16 caches, over two chunks of rows
 * and a last group of one row (pos 100); against the float64 attention
 * over the stored values. */
Test(cpu_ops, attn_head_tiles_and_row_pieces)
{
    static const struct { int hd, g, nkv; } shapes[] = {{84, 5, 1}, {16, 9, 1}, {8, 2, 2}, {64, 3, 2}};
    const DType types[] = {DT_F32, DT_F16, DT_BF16};
    enum { S = 128, POS = 100, HDMAX = 84 };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int ti = 0; ti < 3; ti++) {
            int hd = shapes[si].hd, gq = shapes[si].g, nkv = shapes[si].nkv;
            cr_assert(hd <= HDMAX);
            DType t = types[ti];
            Schedule *s = sched_new("attn_tiles", "cpu", 1);
            s->shape = (ModelShape){.dim = nkv * gq * hd, .hidden_dim = 16, .n_layers = 1, .n_heads = nkv * gq,
                                    .n_kv_heads = nkv, .head_dim = hd, .vocab_size = 8, .max_seq = S,
                                    .norm_eps = 1e-5};
            int64_t ncache = (int64_t)nkv * S * hd;
            uint32_t q = add_buf(s, "q", BUF_SCRATCH, nkv * gq * hd);
            uint32_t kc = sched_add_buffer(s, "kc", t, BUF_KV, 1, &ncache);
            uint32_t vc = sched_add_buffer(s, "vc", t, BUF_KV, 1, &ncache);
            uint32_t part = add_buf(s, "part", BUF_SCRATCH, nkv * gq * (hd + 2));
            for (int h = 0; h < nkv; h++)
                add_op(s, 0, OP_ATTN, (int32_t[]){h, 0, 1, 32, 0}, (uint32_t[]){q, kc, vc, part, BUF_NONE});
            Kern k;
            kern_build(&k, s);
            double *kd = malloc(sizeof(double) * (size_t)ncache), *vd = malloc(sizeof(double) * (size_t)ncache);
            cr_assert(kd && vd);
            for (int64_t i = 0; i < ncache; i++) {
                float a = 3.0f * rnd(), b = 3.0f * rnd();
                if (t == DT_F32) {
                    ((float *)buf(&k, kc))[i] = a, ((float *)buf(&k, vc))[i] = b;
                    kd[i] = a, vd[i] = b;
                } else {
                    uint16_t *kh = buf(&k, kc), *vh = buf(&k, vc);
                    kh[i] = half_bits(t, a), vh[i] = half_bits(t, b);
                    kd[i] = half_value(t, kh[i]), vd[i] = half_value(t, vh[i]);
                }
            }
            fill(&k, q);
            kern_step(&k, POS, 0);
            cr_assert_eq(k.abort_info.flag, 0);
            const float *qf = buf(&k, q), *got = buf(&k, part);
            for (int h = 0; h < nkv; h++)
                for (int g = 0; g < gq; g++) {
                    double want[HDMAX + 2], mag[HDMAX + 2];
                    ref_attn_part(qf, kd, vd, hd, gq, S, h, g, POS, 32, 1, 0, want, mag);
                    char what[128];
                    snprintf(what, sizeof what, "hd %d, %d q heads, %s: kv head %d, q head %d", hd, gq, dtype_name(t),
                             h, g);
                    expect_close(what, got + (h * gq + g) * (hd + 2), want, mag, hd + 2);
                }
            free(kd);
            free(vd);
            kern_free(&k);
        }
}

/* argmax over slots long enough for the vector passes, against the scan
 * it replaces (take x[r] when x[r] > best, from -inf at r0): ties within
 * and across vector lanes keep the first index, NaN never wins, all -inf
 * and NaN give -inf at r0, and an infinity wins at its first place. */
Test(cpu_ops, argmax_long_slots)
{
    enum { N = 1000 };
    Schedule *s = sched_new("argmax", "cpu", 1);
    s->shape = op_shape(0);
    uint32_t x = add_buf(s, "x", BUF_SCRATCH, N), am = add_buf(s, "am", BUF_SCRATCH, 6);
    const int32_t bounds[4] = {3, 350, 351, N}; /* an unaligned start, a slot of one, a long tail */
    for (int sl = 0; sl < 3; sl++)
        add_op(s, 0, OP_ARGMAX, (const int32_t[]){bounds[sl], bounds[sl + 1], sl}, (const uint32_t[]){x, am});
    Kern k;
    kern_build(&k, s);
    float *xv = buf(&k, x);
    const float *out = buf(&k, am);
    for (int pat = 0; pat < 7; pat++) {
        uint64_t seed = 11 + (uint64_t)pat;
        for (int r = 0; r < N; r++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            xv[r] = (float)(seed >> 40) / (float)(1 << 24) - 0.5f;
        }
        if (pat == 1) /* the maximum twice, in different lanes, the later one first in its lane */
            xv[700] = xv[413] = 2.0f;
        if (pat == 2) /* the maximum twice in one vector, and again at the tail */
            xv[100] = xv[104] = xv[999] = 3.0f;
        if (pat == 3) /* NaNs, at the slots' starts too, and above the maximum's value's place */
            for (int r = 3; r < N; r += 7)
                xv[r] = __builtin_nanf("");
        if (pat == 4) /* all -inf and NaN */
            for (int r = 0; r < N; r++)
                xv[r] = r % 3 ? -__builtin_inff() : __builtin_nanf("");
        if (pat == 5) /* infinities */
            xv[600] = xv[20] = xv[800] = __builtin_inff();
        if (pat == 6) /* the maximum in the last element */
            xv[N - 1] = 9.0f;
        kern_step(&k, 0, 0);
        for (int sl = 0; sl < 3; sl++) {
            float best = -__builtin_inff();
            int idx = bounds[sl];
            for (int r = bounds[sl]; r < bounds[sl + 1]; r++)
                if (xv[r] > best)
                    best = xv[r], idx = r;
            cr_assert(out[2 * sl] == best || (isnan(out[2 * sl]) && isnan(best)), "pattern %d slot %d: max %g, want %g",
                      pat, sl, (double)out[2 * sl], (double)best);
            cr_assert_eq(out[2 * sl + 1], (float)idx, "pattern %d slot %d: index %g, want %d", pat, sl,
                         (double)out[2 * sl + 1], idx);
        }
    }
    kern_free(&k);
}

Test(cpu_ops, every_op_one_worker_adjacent_rope)
{
    run_ops(1, 0);
}

Test(cpu_ops, every_op_three_workers_half_rope)
{
    run_ops(3, 1);
}

/* ---- synchronization ---- */

enum { CN = 1000 };

/* A value chain that hops across three workers through signal/wait,
 * including a counter that two workers signal and one waits for twice. */
Test(cpu_ops, signal_wait_chain)
{
    Schedule *s = sched_new("chain", "cpu", 3);
    s->shape = op_shape(0);
    uint32_t x = add_buf(s, "x", BUF_STATE, CN), y = add_buf(s, "y", BUF_STATE, CN);
    uint32_t u = add_buf(s, "u", BUF_STATE, CN), t = add_buf(s, "t", BUF_SCRATCH, CN);
    uint32_t z = add_buf(s, "z", BUF_STATE, CN);
    uint32_t c[7];
    for (int i = 0; i < 7; i++) {
        char name[16];
        snprintf(name, sizeof name, "c%d", i);
        c[i] = sched_add_counter(s, name);
    }
    const int32_t all[2] = {0, CN};
    add_op(s, 0, OP_ADD, all, (uint32_t[]){x, y});                  /* x += y */
    sched_signal(s, 0, c[0], 1);
    sched_wait(s, 1, c[0], 1);
    add_op(s, 1, OP_SILU_MUL, all, (uint32_t[]){x, u, t});          /* t = silu(x) u */
    sched_signal(s, 1, c[1], 1);
    sched_wait(s, 2, c[1], 1);
    add_op(s, 2, OP_ADD, all, (uint32_t[]){x, t});                  /* x += t */
    sched_signal(s, 2, c[2], 1);
    sched_wait(s, 0, c[2], 1);
    add_op(s, 0, OP_SILU_MUL, all, (uint32_t[]){x, u, t});          /* t = silu(x) u */
    sched_signal(s, 0, c[3], 1);
    sched_wait(s, 1, c[3], 1);
    add_op(s, 1, OP_ADD, all, (uint32_t[]){x, t});                  /* x += t */
    sched_signal(s, 1, c[4], 2);
    sched_signal(s, 1, c[6], 1);
    sched_wait(s, 2, c[4], 2);
    add_op(s, 2, OP_ADD, all, (uint32_t[]){z, x});                  /* z += x */
    sched_signal(s, 2, c[6], 1);
    sched_wait(s, 0, c[6], 2);
    add_op(s, 0, OP_ADD, all, (uint32_t[]){z, x});                  /* z += x */
    Kern k;
    kern_build(&k, s);
    for (int step = 0; step < 50; step++) {
        fill(&k, x), fill(&k, y), fill(&k, u), fill(&k, z);
        double rx[CN], rz[CN];
        const float *px = buf(&k, x), *py = buf(&k, y), *pu = buf(&k, u), *pz = buf(&k, z);
        for (int i = 0; i < CN; i++) {
            float xv = px[i] + py[i];
            xv += xv / (1.0f + expf(-xv)) * pu[i];
            xv += xv / (1.0f + expf(-xv)) * pu[i];
            rx[i] = xv;
            rz[i] = (double)pz[i] + 2.0 * xv;
        }
        kern_step(&k, 0, 0);
        cr_assert_eq(k.abort_info.flag, 0, "step %d aborted", step);
        expect_close("chain x", buf(&k, x), rx, NULL, CN);
        expect_close("chain z", buf(&k, z), rz, NULL, CN);
    }
    kern_free(&k);
}

static double elapsed_s(struct timespec a)
{
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
}

/* Worker 0 waits for 3 on a counter that only reaches 2: the watchdog must
 * stop it and record exactly where; worker 1 finishes normally. */
Test(cpu_ops, watchdog)
{
    Schedule *s = sched_new("watchdog", "cpu", 2);
    s->shape = op_shape(0);
    uint32_t a = add_buf(s, "a", BUF_STATE, 16), b = add_buf(s, "b", BUF_STATE, 16);
    uint32_t c0 = sched_add_counter(s, "c0"), c1 = sched_add_counter(s, "c1");
    sched_signal(s, 0, c1, 1);
    add_op(s, 0, OP_ADD, (int32_t[]){0, 16}, (uint32_t[]){a, b});
    sched_wait(s, 0, c0, 3);
    add_op(s, 0, OP_ADD, (int32_t[]){0, 16}, (uint32_t[]){a, b});
    sched_wait(s, 1, c1, 1);
    sched_signal(s, 1, c0, 2);
    Kern k;
    kern_build(&k, s);
    fill(&k, a), fill(&k, b);
    float a0 = ((float *)buf(&k, a))[3], b0 = ((float *)buf(&k, b))[3];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kern_step(&k, 0, 50 * 1000 * 1000);
    double dt = elapsed_s(t0);
    cr_assert(dt >= 0.045 && dt < 1.5, "watchdog after %.3f s", dt);
    MegacAbort *ab = &k.abort_info;
    cr_assert_eq(ab->flag, KT_ABORT_TIMEOUT);
    cr_assert_eq(ab->worker, 0);
    cr_assert_eq(ab->pc, 2);
    cr_assert_eq(ab->counter, c0);
    cr_assert_eq(ab->value, 2);
    cr_assert_eq(ab->threshold, 3);
    cr_assert_eq(((float *)buf(&k, a))[3], a0 + b0, "the op after the failed wait must not run");

    /* With the flag already set, a hung wait returns at once. */
    *ab = (MegacAbort){.flag = KT_ABORT_TIMEOUT, .worker = 7};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kern_step(&k, 0, 10ull * 1000 * 1000 * 1000);
    cr_assert(elapsed_s(t0) < 1.0, "a set abort flag stops waiting workers");
    cr_assert_eq(ab->worker, 7, "the first abort is kept");
    kern_free(&k);
}

/* Spins until *stop is set. */
static void *hog_main(void *p)
{
    while (!__atomic_load_n((int *)p, __ATOMIC_ACQUIRE))
        ;
    return NULL;
}

/* Times the waiting thread was switched out while it could run (a yield
 * that gave the CPU away counts so). */
static long thread_preemptions(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_nivcsw : 0;
}

typedef struct {
    Job job;
    long preempted;
} SpinJob;

static void *spin_job_main(void *p)
{
    SpinJob *sj = p;
    long n0 = thread_preemptions();
    job_main(&sj->job);
    sj->preempted = thread_preemptions() - n0;
    return NULL;
}

/* One worker waits for counter c, which this thread bumps 0.2 s into the
 * step (as another worker would, but without waking a sleeper: it re-checks
 * within 1 ms); returns the counter's word, whose bit 31 a sleeper sets,
 * and into *preempted how often the waiting thread was switched out. With
 * `hog`, a thread that spins shares the waiter's CPU (both pinned to it). */
static uint32_t spin_wait_word(Kern *k, uint32_t c, uint64_t spin_ns, uint64_t timeout_ns, int hog,
                               long *preempted)
{
    memset(k->ctrs, 0, 4 * (k->s->nctrs + 1));
    memset(&k->abort_info, 0, sizeof k->abort_info);
    MegacArgs args = {k->weights, k->arena, k->ctrs, &k->abort_info, 0, timeout_ns, -1, spin_ns, 0};
    SpinJob sj = {{k, &args, 0, 0}, 0};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    int stop = 0;
    pthread_t th, hog_th;
    if (hog) {
        cpu_set_t allowed, one;
        cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
        int cpu = 0;
        while (!CPU_ISSET(cpu, &allowed))
            cpu++;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        cr_assert_eq(pthread_attr_setaffinity_np(&attr, sizeof one, &one), 0);
        cr_assert_eq(pthread_create(&hog_th, &attr, hog_main, &stop), 0);
    }
    cr_assert_eq(pthread_create(&th, &attr, spin_job_main, &sj), 0);
    usleep(200 * 1000);
    __atomic_fetch_add(&k->ctrs[c], 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    if (hog) {
        __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
        pthread_join(hog_th, NULL);
    }
    pthread_attr_destroy(&attr);
    if (preempted)
        *preempted = sj.preempted;
    return k->ctrs[c];
}

/* MegacArgs.spin_ns: a worker with a CPU of its own keeps spinning through
 * a 0.2 s wait (a futex sleeper's vCPU can take ~0.3 ms to wake) unless a
 * yield shows another thread wants its CPU (then it sleeps at once: here a
 * spinning thread pinned to the same CPU; in a loaded test run, other
 * tests); one on shared CPUs (spin_ns 0) sleeps after ~0.1 ms; the watchdog
 * holds in all. */
Test(cpu_ops, waits_spin_only_when_asked)
{
    Schedule *s = sched_new("spin", "cpu", 1);
    s->shape = op_shape(0);
    uint32_t a = add_buf(s, "a", BUF_STATE, 16), b = add_buf(s, "b", BUF_STATE, 16);
    uint32_t c0 = sched_add_counter(s, "c0");
    sched_wait(s, 0, c0, 1);
    add_op(s, 0, OP_ADD, (int32_t[]){0, 16}, (uint32_t[]){a, b});
    Kern k;
    kern_build(&k, s);
    fill(&k, a), fill(&k, b);
    float a0 = ((float *)buf(&k, a))[5], b0 = ((float *)buf(&k, b))[5];

    uint32_t shared = spin_wait_word(&k, c0, 0, 0, 0, NULL);
    cr_assert_eq(k.abort_info.flag, 0);
    float want = a0 + b0;
    cr_assert_eq(((float *)buf(&k, a))[5], want, "the op after the wait ran");
    cr_assert_eq(shared, 0x80000001u, "a 0.2 s wait on shared CPUs slept on its counter (word %#x)", shared);

    /* The kernel sleeps at once when a yield keeps its CPU away for 50 us.
     * Within the guest that shows as a switch (counted), but the host can
     * also take the whole vCPU for that long (steal time, invisible to the
     * thread): so up to three tries, and a kernel that always sleeps fails
     * all three. */
    long preempted = 0;
    uint32_t spun = 0;
    int tries = 0;
    do {
        spun = spin_wait_word(&k, c0, 2000000000ull, 0, 0, &preempted);
        cr_assert_eq(k.abort_info.flag, 0);
        want += b0;
        cr_assert_eq(((float *)buf(&k, a))[5], want, "the op after the wait ran");
        tries++;
    } while (spun != 1u && preempted == 0 && tries < 3);
    cr_assert(spun == 1u || preempted > 0,
              "a 0.2 s wait with spin_ns 2 s slept (word %#x) in %d tries though nothing took its CPU", spun,
              tries);

    uint32_t yielded = spin_wait_word(&k, c0, 2000000000ull, 0, 1, &preempted);
    cr_assert_eq(k.abort_info.flag, 0);
    cr_assert_eq(yielded, 0x80000001u, "a wait with spin_ns 2 s whose CPU a spinning thread shares sleeps "
                 "(word %#x, switched out %ld times)", yielded, preempted);
    want += b0;
    cr_assert_eq(((float *)buf(&k, a))[5], want, "the op after each wait ran");

    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    spin_wait_word(&k, c0, 10000000000ull, 50 * 1000 * 1000, 0, NULL);
    cr_assert_eq(k.abort_info.flag, KT_ABORT_TIMEOUT, "the watchdog (50 ms) stops a wait that would spin 10 s");
    cr_assert(elapsed_s(t0) < 1.5);
    kern_free(&k);
}

Test(cpu_ops, bad_position_runs_nothing)
{
    Schedule *s = sched_new("badpos", "cpu", 1);
    s->shape = op_shape(0);
    uint32_t a = add_buf(s, "a", BUF_STATE, 16), b = add_buf(s, "b", BUF_STATE, 16);
    add_op(s, 0, OP_ADD, (int32_t[]){0, 16}, (uint32_t[]){a, b});
    Kern k;
    kern_build(&k, s);
    fill(&k, a), fill(&k, b);
    float a0 = ((float *)buf(&k, a))[0];
    kern_step(&k, SEQ, 0);
    cr_assert_eq(k.abort_info.flag, KT_ABORT_BAD_POS);
    cr_assert_eq(k.abort_info.value, SEQ);
    cr_assert_eq(((float *)buf(&k, a))[0], a0);
    kern_free(&k);
}

/* Compiles s for the CPU, which must fail; its messages go to out.
 * Returns the error count. */
static int compile_errors(const Schedule *s, char *out, size_t cap)
{
    FILE *f = fmemopen(out, cap, "w");
    Diag d;
    diag_init(&d);
    d.out = f;
    cr_assert_not(cg_cpu_compile(s, NULL, "/tmp/megac_cpu_never.so", &d));
    fclose(f);
    return d.nerrors;
}

Test(cpu_ops, unsupported_dtype_is_an_error)
{
    Schedule *s = sched_new("i8", "cpu", 1);
    s->shape = op_shape(0);
    int64_t shp[2] = {8, 16};
    uint32_t w = sched_add_buffer(s, "w", DT_I8, BUF_WEIGHT, 2, shp);
    uint32_t x = add_buf(s, "x", BUF_STATE, 16), y = add_buf(s, "y", BUF_SCRATCH, 8);
    add_op(s, 0, OP_GEMV, (int32_t[]){0, 8, 16, 0}, (uint32_t[]){w, x, y, BUF_NONE, BUF_NONE});
    sched_layout(s);
    char out[1024] = {0};
    cr_assert_eq(compile_errors(s, out, sizeof out), 1);
    cr_assert(strstr(out, "gemv operand 'w' (buffer 'w') of dtype i8 is not supported"), "%s", out);
    sched_free(s);
}

/* ---- GEMV bandwidth (MEGAC_CPU_BENCH=1) ---- */

static void bench_gemv(int nw, int64_t rows, int64_t kk)
{
    Schedule *s = sched_new("bench", "cpu", nw);
    s->shape = op_shape(0);
    uint32_t W = add_buf(s, "W", BUF_WEIGHT, rows * kk), x = add_buf(s, "x", BUF_STATE, kk);
    uint32_t y = add_buf(s, "y", BUF_SCRATCH, rows);
    for (int w = 0; w < nw; w++)
        add_op(s, w, OP_GEMV, (int32_t[]){(int32_t)(rows * w / nw), (int32_t)(rows * (w + 1) / nw), (int32_t)kk, 0},
               (uint32_t[]){W, x, y, BUF_NONE, BUF_NONE});
    Kern k;
    kern_build(&k, s);
    fill(&k, W), fill(&k, x);
    kern_step(&k, 0, 0);
    double best = 1e9, total = 0, best_cpu = 1e9;
    int reps = 20;
    for (int i = 0; i < reps; i++) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        kern_step(&k, 0, 0);
        double dt = elapsed_s(t0);
        best = dt < best ? dt : best;
        best_cpu = last_step_cpu_s < best_cpu ? last_step_cpu_s : best_cpu;
        total += dt;
    }
    const float *pw = buf(&k, W), *px = buf(&k, x), *py = buf(&k, y);
    for (int64_t r = 0; r < rows; r += rows / 7) {
        double acc = 0, mag = 0;
        for (int64_t j = 0; j < kk; j++)
            acc += (double)pw[r * kk + j] * px[j], mag += fabs((double)pw[r * kk + j] * px[j]);
        cr_assert(fabs(py[r] - acc) <= 1e-5 * mag, "bench row %ld", (long)r);
    }
    double bytes = (double)rows * (double)kk * 4.0;
    fprintf(stderr, "gemv f32 %ldx%ld, %d worker(s): best %.3f ms = %.1f GB/s, mean %.1f GB/s; CPU time %.1f GB/s\n",
            (long)rows, (long)kk, nw, best * 1e3, bytes / best / 1e9, bytes * reps / total / 1e9, bytes / best_cpu / 1e9);
    kern_free(&k);
}

Test(cpu_ops, gemv_bandwidth, .timeout = 120)
{
    if (!getenv("MEGAC_CPU_BENCH"))
        cr_skip_test("set MEGAC_CPU_BENCH=1 to measure GEMV bandwidth");
    bench_gemv(1, 8192, 8192);
    bench_gemv(2, 8192, 8192);
}

/* ---- whole lowered models ---- */

static ModelDesc toy_model(int dim, int hid, int layers, int heads, int kv, int hd, int vocab, int seq, int pairing)
{
    return (ModelDesc){.name = "toy", .dim = dim, .hidden_dim = hid, .n_layers = layers, .n_heads = heads,
                       .n_kv_heads = kv, .head_dim = hd, .vocab_size = vocab, .max_seq = seq, .norm_eps = 1e-5,
                       .tie_embeddings = true, .rope_theta = 10000, .rope_pairing = (RopePairing)pairing,
                       .act_dtype = DT_F32};
}

static Schedule *lower_for_cpu(const ModelDesc *m, int workers)
{
    Diag d;
    diag_init(&d);
    const Target *t = target_lookup("cpu", &d);
    cr_assert_not_null(t);
    Schedule *s = lower_model(m, t, workers, &d);
    cr_assert_not_null(s, "lower_model failed");
    return s;
}

/* Random weights, scaled like a trained model's (rows of norm ~1); norm
 * weights near 1; the rope table from the standard frequencies. */
static void toy_weights(Kern *k, const ModelDesc *m)
{
    for (uint32_t i = 0; i < k->s->nbufs; i++) {
        const Buffer *b = &k->s->bufs[i];
        if (b->cls != BUF_WEIGHT)
            continue;
        float *p = buf(k, i);
        bool norm = strstr(b->name, "norm") != NULL;
        float scale = sqrtf(3.0f / (float)(b->rank == 2 ? b->shape[1] : 1));
        for (int64_t j = 0; j < b->nelem; j++)
            p[j] = norm ? 1.0f + 0.2f * rnd() : rnd() * scale;
    }
    float *rope = buf(k, (uint32_t)sched_find_buffer(k->s, "rope"));
    for (int pos = 0; pos < m->max_seq; pos++)
        for (int i = 0; i < m->head_dim / 2; i++) {
            double a = pos * pow(m->rope_theta, -2.0 * i / m->head_dim);
            rope[(pos * (m->head_dim / 2) + i) * 2] = (float)cos(a);
            rope[(pos * (m->head_dim / 2) + i) * 2 + 1] = (float)sin(a);
        }
}

/* Plain double-precision Llama decode over the same weights. */
typedef struct RefModel {
    const ModelDesc *m;
    Kern *k;
    double *kc, *vc;        /* [layers][kv_heads][seq][hd] */
} RefModel;

static const float *W(RefModel *r, int l, const char *name)
{
    char n[64];
    if (l >= 0)
        snprintf(n, sizeof n, "L%d.%s", l, name);
    else
        snprintf(n, sizeof n, "%s", name);
    int64_t id = sched_find_buffer(r->k->s, n);
    cr_assert(id >= 0, "no buffer %s", n);
    return buf(r->k, (uint32_t)id);
}

static void ref_matvec(const float *w, const double *x, int64_t rows, int64_t cols, double *y)
{
    for (int64_t i = 0; i < rows; i++) {
        double a = 0;
        for (int64_t j = 0; j < cols; j++)
            a += (double)w[i * cols + j] * x[j];
        y[i] = a;
    }
}

static void ref_norm(const double *x, const float *w, int64_t n, double eps, double *out)
{
    double ss = 0;
    for (int64_t j = 0; j < n; j++)
        ss += x[j] * x[j];
    double s = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t j = 0; j < n; j++)
        out[j] = x[j] * s * w[j];
}

static void ref_rotate(RefModel *r, double *v, int nheads, int pos)
{
    int hd = r->m->head_dim, half = hd / 2;
    const float *tab = W(r, -1, "rope") + (int64_t)pos * half * 2;
    for (int h = 0; h < nheads; h++)
        for (int i = 0; i < half; i++) {
            int i0 = r->m->rope_pairing == ROPE_HALF ? i : 2 * i;
            int i1 = r->m->rope_pairing == ROPE_HALF ? i + half : 2 * i + 1;
            double c = tab[2 * i], s = tab[2 * i + 1], x0 = v[h * hd + i0], x1 = v[h * hd + i1];
            v[h * hd + i0] = x0 * c - x1 * s;
            v[h * hd + i1] = x0 * s + x1 * c;
        }
}

static void ref_attention(RefModel *r, int l, const double *q, int pos, double *att)
{
    const ModelDesc *m = r->m;
    int hd = m->head_dim, grp = m->n_heads / m->n_kv_heads;
    double *sc = malloc(sizeof(double) * (size_t)(pos + 1));
    for (int qh = 0; qh < m->n_heads; qh++) {
        int64_t base = ((int64_t)l * m->n_kv_heads + qh / grp) * m->max_seq * hd;
        double mx = -INFINITY, sum = 0;
        for (int t = 0; t <= pos; t++) {
            double d = 0;
            for (int j = 0; j < hd; j++)
                d += q[qh * hd + j] * r->kc[base + (int64_t)t * hd + j];
            sc[t] = d / sqrt((double)hd);
            mx = fmax(mx, sc[t]);
        }
        for (int j = 0; j < hd; j++)
            att[qh * hd + j] = 0;
        for (int t = 0; t <= pos; t++) {
            double e = exp(sc[t] - mx);
            sum += e;
            for (int j = 0; j < hd; j++)
                att[qh * hd + j] += e * r->vc[base + (int64_t)t * hd + j];
        }
        for (int j = 0; j < hd; j++)
            att[qh * hd + j] /= sum;
    }
    free(sc);
}

static void ref_layer(RefModel *r, int l, double *x, int pos, double *tmp)
{
    const ModelDesc *m = r->m;
    int hd = m->head_dim, qd = m->n_heads * hd, kvd = m->n_kv_heads * hd, dim = m->dim, hid = m->hidden_dim;
    double *xn = tmp, *q = xn + dim, *kk = q + qd, *v = kk + kvd, *att = v + kvd, *o = att + qd, *g = o + dim,
           *u = g + hid;
    ref_norm(x, W(r, l, "attn_norm"), dim, m->norm_eps, xn);
    ref_matvec(W(r, l, "wq"), xn, qd, dim, q);
    ref_matvec(W(r, l, "wk"), xn, kvd, dim, kk);
    ref_matvec(W(r, l, "wv"), xn, kvd, dim, v);
    ref_rotate(r, q, m->n_heads, pos);
    ref_rotate(r, kk, m->n_kv_heads, pos);
    for (int h = 0; h < m->n_kv_heads; h++)
        for (int j = 0; j < hd; j++) {
            int64_t at = (((int64_t)l * m->n_kv_heads + h) * m->max_seq + pos) * hd + j;
            r->kc[at] = kk[h * hd + j];
            r->vc[at] = v[h * hd + j];
        }
    ref_attention(r, l, q, pos, att);
    ref_matvec(W(r, l, "wo"), att, dim, qd, o);
    for (int j = 0; j < dim; j++)
        x[j] += o[j];
    ref_norm(x, W(r, l, "ffn_norm"), dim, m->norm_eps, xn);
    ref_matvec(W(r, l, "w_gate"), xn, hid, dim, g);
    ref_matvec(W(r, l, "w_up"), xn, hid, dim, u);
    for (int j = 0; j < hid; j++)
        g[j] = g[j] / (1.0 + exp(-g[j])) * u[j];
    ref_matvec(W(r, l, "w_down"), g, dim, hid, o);
    for (int j = 0; j < dim; j++)
        x[j] += o[j];
}

static void toy_ref_step(RefModel *r, int tok, int pos, double *logits)
{
    const ModelDesc *m = r->m;
    size_t ntmp = (size_t)(4 * m->dim + 4 * m->n_heads * m->head_dim + 2 * m->hidden_dim);
    double *x = malloc(sizeof(double) * (size_t)m->dim), *tmp = malloc(sizeof(double) * ntmp);
    const float *emb = W(r, -1, "embed");
    for (int j = 0; j < m->dim; j++)
        x[j] = emb[(int64_t)tok * m->dim + j];
    for (int l = 0; l < m->n_layers; l++)
        ref_layer(r, l, x, pos, tmp);
    ref_norm(x, W(r, -1, "final_norm"), m->dim, m->norm_eps, tmp);
    ref_matvec(emb, tmp, m->vocab_size, m->dim, logits);
    free(x);
    free(tmp);
}

/* Decodes `steps` positions of a lowered toy model with `workers` workers
 * and compares logits and the greedy token with the double reference. */
static void run_model(const ModelDesc *m, int workers, int steps)
{
    Kern k;
    kern_build(&k, lower_for_cpu(m, workers));
    toy_weights(&k, m);
    size_t kvn = (size_t)m->n_layers * (size_t)m->n_kv_heads * (size_t)m->max_seq * (size_t)m->head_dim;
    RefModel r = {m, &k, calloc(kvn, sizeof(double)), calloc(kvn, sizeof(double))};
    double *ref = malloc(sizeof(double) * (size_t)m->vocab_size);
    double *mag = malloc(sizeof(double) * (size_t)m->vocab_size);
    int32_t *tokp = buf(&k, (uint32_t)sched_find_buffer(k.s, "tok"));
    const int32_t *next = buf(&k, (uint32_t)sched_find_buffer(k.s, "next"));
    const float *logits = buf(&k, (uint32_t)sched_find_buffer(k.s, "logits"));
    int tok = 1;
    for (int pos = 0; pos < steps; pos++) {
        *tokp = tok;
        kern_step(&k, pos, 0);
        cr_assert_eq(k.abort_info.flag, 0, "W=%d pos %d: aborted at worker %u pc %u", workers, pos,
                     k.abort_info.worker, k.abort_info.pc);
        toy_ref_step(&r, tok, pos, ref);
        int best = 0;
        for (int i = 0; i < m->vocab_size; i++) {
            mag[i] = 1.0;
            best = ref[i] > ref[best] ? i : best;
        }
        expect_close("logits", logits, ref, mag, m->vocab_size);
        int kbest = 0;
        for (int i = 0; i < m->vocab_size; i++)
            kbest = logits[i] > logits[kbest] ? i : kbest;
        cr_assert_eq(*next, kbest, "W=%d pos %d: next %d is not the argmax %d of the logits", workers, pos, *next,
                     kbest);
        /* Greedy agrees with the reference unless the top two are within rounding. */
        double gap = ref[best] - ref[kbest];
        cr_assert(kbest == best || gap < 1e-5, "W=%d pos %d: greedy %d, reference %d", workers, pos, kbest, best);
        tok = (kbest * 7 + pos) % m->vocab_size; /* varied inputs */
    }
    free(r.kc), free(r.vc), free(ref), free(mag);
    kern_free(&k);
}

Test(cpu_ops, lowered_model_matches_reference)
{
    ModelDesc a = toy_model(128, 200, 2, 4, 2, 32, 300, 80, ROPE_HALF);
    run_model(&a, 3, 70);   /* 3 blocks of 32 rows, 1 split per kv head */
    run_model(&a, 8, 70);   /* more workers than cores; 3 splits */
    ModelDesc b = toy_model(64, 172, 2, 8, 4, 8, 512, 48, ROPE_ADJACENT);
    run_model(&b, 1, 20);
    run_model(&b, 5, 20);
}

/* Lowering and compiling a SmolLM2-135M-shaped model (30 layers, 9/3 heads,
 * 49152 vocab): the schedule is far larger than the toy ones; no weights
 * are needed to compile. */
Test(cpu_ops, compiles_smollm2_135m_shape, .timeout = 120)
{
    ModelDesc m = toy_model(576, 1536, 30, 9, 3, 64, 49152, 8192, ROPE_HALF);
    if (getenv("MEGAC_CPU_LLAMA8B")) /* Llama-3.1-8B's shape instead */
        m = toy_model(4096, 14336, 32, 32, 8, 128, 128256, 8192, ROPE_HALF);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int nw = getenv("MEGAC_CPU_WORKERS") ? atoi(getenv("MEGAC_CPU_WORKERS")) : 2;
    Schedule *s = lower_for_cpu(&m, nw);
    sched_layout(s);
    double t_lower = elapsed_s(t0);
    char dir[] = "/tmp/megac_cpu_XXXXXX", so[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(so, sizeof so, "%s/kernel.so", dir);
    Diag d;
    diag_init(&d);
    CpuOptions o = {.verbose = getenv("MEGAC_CPU_VERBOSE") != NULL};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert(cg_cpu_compile(s, &o, so, &d));
    double t_cc = elapsed_s(t0);
    void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(dl, "%s", dlerror());
    const uint32_t *knw = dlsym(dl, "megac_num_workers");
    cr_assert(knw && *knw == (uint32_t)nw);
    uint32_t ninst = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        ninst += s->workers[w].ninst;
    fprintf(stderr, "%s shape, %d workers, %u instructions: lower %.2f s, cg_cpu_compile %.2f s\n",
            getenv("MEGAC_CPU_LLAMA8B") ? "Llama-3.1-8B" : "SmolLM2-135M", nw,
            ninst, t_lower, t_cc);
    dlclose(dl);
    unlink(so);
    rmdir(dir);
    sched_free(s);
}

/* A whole decode step of a SmolLM2-135M-shaped model (f32, random weights,
 * context cut to 1024): step time and weight bytes read per second. */
Test(cpu_ops, decode_step_bandwidth, .timeout = 300)
{
    if (!getenv("MEGAC_CPU_BENCH"))
        cr_skip_test("set MEGAC_CPU_BENCH=1 to measure a whole decode step");
    int nw = getenv("MEGAC_CPU_WORKERS") ? atoi(getenv("MEGAC_CPU_WORKERS")) : 2;
    ModelDesc m = toy_model(576, 1536, 30, 9, 3, 64, 49152, 1024, ROPE_HALF);
    Kern k;
    kern_build(&k, lower_for_cpu(&m, nw));
    toy_weights(&k, &m);
    *(int32_t *)buf(&k, (uint32_t)sched_find_buffer(k.s, "tok")) = 1;
    double gb = (double)k.s->weights_bytes / 1e9;
    /* Early positions, then late ones: there attention reads 2 * pos rows
     * of KV per kv head and layer on top of the weights. */
    int64_t starts[2] = {0, m.max_seq - 24};
    for (int run = 0; run < 2; run++) {
        double best = 1e9, total = 0, best_cpu = 1e9;
        int steps = 24, warm = 4;
        for (int i = 0; i < steps; i++) {
            int64_t pos = starts[run] + i;
            struct timespec t0;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            kern_step(&k, pos, 0);
            double dt = elapsed_s(t0);
            cr_assert_eq(k.abort_info.flag, 0);
            if (i >= warm) {
                best = dt < best ? dt : best;
                best_cpu = last_step_cpu_s < best_cpu ? last_step_cpu_s : best_cpu;
                total += dt;
            }
        }
        double kv = 2.0 * m.n_layers * m.n_kv_heads * (double)(starts[run] + steps) * m.head_dim * 4 / 1e9;
        fprintf(stderr,
                "SmolLM2-135M shape f32, %d workers, pos %ld..: %.3f GB weights + %.3f GB KV, best %.2f ms/step = "
                "%.1f GB/s, mean %.1f GB/s; worker CPU time best %.2f ms = %.1f GB/s\n",
                nw, (long)starts[run], gb, kv, best * 1e3, (gb + kv) / best, (gb + kv) * (steps - warm) / total,
                best_cpu * 1e3, (gb + kv) / best_cpu);
    }
    kern_free(&k);
}

/* Params an op body could not run with are refused at compile time. */
Test(cpu_ops, bad_params_are_errors)
{
    Schedule *s = sched_new("badparams", "cpu", 1);
    s->shape = op_shape(0);
    uint32_t q = add_buf(s, "q", BUF_SCRATCH, NH * HD), kc = add_buf(s, "kc", BUF_KV, NKV * SEQ * HD);
    uint32_t vc = add_buf(s, "vc", BUF_KV, NKV * SEQ * HD), part = add_buf(s, "part", BUF_SCRATCH, 1024);
    add_op(s, 0, OP_ATTN, (int32_t[]){0, 0, 1, 0, 0}, (uint32_t[]){q, kc, vc, part, BUF_NONE});
    sched_layout(s);
    char out[1024] = {0};
    cr_assert_eq(compile_errors(s, out, sizeof out), 1);
    cr_assert(strstr(out, "error: attn: attn needs nsplit > 0, 0 <= s < nsplit, block > 0 and rope 0 or 1"), "%s",
              out);
    sched_free(s);
}

/* attn with rope = 1 on unrotated q gives, bit for bit, the partials of
 * rope then attn (rope = 0), and leaves q alone: both pairings, 3 splits,
 * positions on both sides of a block edge. */
Test(cpu_ops, attn_rope_is_rope_then_attn)
{
    for (int pairing = 0; pairing < 2; pairing++) {
        Schedule *s = sched_new("attn_rope", "cpu", 1);
        s->shape = op_shape(pairing);
        uint32_t qa = add_buf(s, "qa", BUF_SCRATCH, NH * HD), qb = add_buf(s, "qb", BUF_SCRATCH, NH * HD);
        uint32_t kc = add_buf(s, "kc", BUF_KV, NKV * SEQ * HD), vc = add_buf(s, "vc", BUF_KV, NKV * SEQ * HD);
        uint32_t rope = add_buf(s, "rope", BUF_WEIGHT, SEQ * HD);
        uint32_t pa = add_buf(s, "pa", BUF_SCRATCH, NKV * NSPLIT * G * (HD + 2));
        uint32_t pb = add_buf(s, "pb", BUF_SCRATCH, NKV * NSPLIT * G * (HD + 2));
        add_op(s, 0, OP_ROPE, (int32_t[]){0, NH}, (uint32_t[]){qa, rope});
        for (int h = 0; h < NKV; h++)
            for (int sp = 0; sp < NSPLIT; sp++) {
                add_op(s, 0, OP_ATTN, (int32_t[]){h, sp, NSPLIT, BLOCK, 0}, (uint32_t[]){qa, kc, vc, pa, BUF_NONE});
                add_op(s, 0, OP_ATTN, (int32_t[]){h, sp, NSPLIT, BLOCK, 1}, (uint32_t[]){qb, kc, vc, pb, rope});
            }
        Kern k;
        kern_build(&k, s);
        fill(&k, rope), fill(&k, kc), fill(&k, vc);
        for (int64_t pos = 0; pos < SEQ; pos += 3) {
            fill(&k, qb);
            memcpy(buf(&k, qa), buf(&k, qb), sizeof(float) * NH * HD);
            float q0[NH * HD];
            memcpy(q0, buf(&k, qb), sizeof q0);
            kern_step(&k, pos, 0);
            cr_assert_eq(k.abort_info.flag, 0);
            cr_assert(memcmp(buf(&k, pa), buf(&k, pb), sizeof(float) * NKV * NSPLIT * G * (HD + 2)) == 0,
                      "pairing %d, pos %ld: partials differ", pairing, (long)pos);
            cr_assert(memcmp(buf(&k, qb), q0, sizeof q0) == 0, "attn with rope wrote q");
            cr_assert(memcmp(buf(&k, qa), q0, sizeof q0) != 0 || pos == 0, "rope did nothing at pos %ld", (long)pos);
        }
        kern_free(&k);
    }
}

/* Attention alone at a late position: 30 layers of SmolLM2-shaped KV
 * (3 kv heads, G = 3, hd = 64), one split, every row written first.
 * MEGAC_CPU_KV=f16|bf16 for a half cache, MEGAC_CPU_HD and MEGAC_CPU_G for
 * other head shapes, MEGAC_CPU_LAYERS=1 for a cache that stays in L2 (the
 * attention's arithmetic rate). */
Test(cpu_ops, attention_bandwidth, .timeout = 120)
{
    if (!getenv("MEGAC_CPU_BENCH"))
        cr_skip_test("set MEGAC_CPU_BENCH=1 to measure attention bandwidth");
    enum { KV = 3, S = 1024 };
    int L = getenv("MEGAC_CPU_LAYERS") ? atoi(getenv("MEGAC_CPU_LAYERS")) : 30;
    int D = getenv("MEGAC_CPU_HD") ? atoi(getenv("MEGAC_CPU_HD")) : 64;
    int GG = getenv("MEGAC_CPU_G") ? atoi(getenv("MEGAC_CPU_G")) : 3;
    const char *kvs = getenv("MEGAC_CPU_KV") ? getenv("MEGAC_CPU_KV") : "f32";
    DType t = !strcmp(kvs, "f16") ? DT_F16 : !strcmp(kvs, "bf16") ? DT_BF16 : DT_F32;
    cr_assert(L > 0 && D > 0 && D <= 256 && GG > 0 && GG <= 16 && (t != DT_F32 || !strcmp(kvs, "f32")),
              "MEGAC_CPU_LAYERS, _HD (1-256), _G (1-16) or _KV (f32, f16, bf16) out of range");
    Schedule *s = sched_new("attn_bench", "cpu", 1);
    s->shape = (ModelShape){.dim = 576, .hidden_dim = 1536, .n_layers = L, .n_heads = KV * GG, .n_kv_heads = KV,
                            .head_dim = D, .vocab_size = 8, .max_seq = S, .norm_eps = 1e-5};
    uint32_t q = add_buf(s, "q", BUF_SCRATCH, KV * GG * D), part = add_buf(s, "part", BUF_SCRATCH, KV * GG * (D + 2));
    int64_t ncache = (int64_t)KV * S * D;
    for (int l = 0; l < L; l++) {
        char n[16];
        snprintf(n, sizeof n, "kc%d", l);
        uint32_t kc = sched_add_buffer(s, n, t, BUF_KV, 1, &ncache);
        snprintf(n, sizeof n, "vc%d", l);
        uint32_t vc = sched_add_buffer(s, n, t, BUF_KV, 1, &ncache);
        for (int h = 0; h < KV; h++)
            add_op(s, 0, OP_ATTN, (int32_t[]){h, 0, 1, 32, 0}, (uint32_t[]){q, kc, vc, part, BUF_NONE});
    }
    Kern k;
    kern_build(&k, s);
    for (uint32_t i = 0; i < s->nbufs; i++) {
        if (s->bufs[i].dtype == DT_F32) {
            fill(&k, i);
            continue;
        }
        uint16_t *h = buf(&k, i);
        for (int64_t e = 0; e < s->bufs[i].nelem; e++)
            h[e] = half_bits(t, rnd());
    }
    int64_t pos = S - 1;
    double best = 1e9;
    for (int i = 0; i < 20; i++) {
        kern_step(&k, pos, 0);
        best = last_step_cpu_s < best ? last_step_cpu_s : best;
    }
    double gb = 2.0 * L * KV * (double)(pos + 1) * D * (t == DT_F32 ? 4 : 2) / 1e9;
    fprintf(stderr,
            "attention (%s cache, hd %d, %d q heads a kv head), %d layers x %d kv heads, pos %ld: %.3f GB KV, CPU time "
            "%.3f ms = %.1f GB/s, %.2f ns a row\n",
            kvs, D, GG, L, KV, (long)pos, gb, best * 1e3, gb / best, best * 1e9 / ((double)L * KV * (pos + 1)));
    kern_free(&k);
}

/* ---- stories260K against the llama2.c-checked goldens (../shared) ---- */

#define SHARED MEGAC_SRC "/../shared/"

/* Copies n floats from the llama2.c file cursor into buffer name[l]. */
static const float *l2c_take(Kern *k, const float *src, const char *name, int layers, int64_t per_layer)
{
    for (int l = 0; l < (layers ? layers : 1); l++) {
        char n[64];
        if (layers)
            snprintf(n, sizeof n, "L%d.%s", l, name);
        else
            snprintf(n, sizeof n, "%s", name);
        int64_t id = sched_find_buffer(k->s, n);
        cr_assert(id >= 0 && k->s->bufs[id].nelem == per_layer, "buffer %s", n);
        memcpy(buf(k, (uint32_t)id), src, (size_t)per_layer * sizeof(float));
        src += per_layer;
    }
    return src;
}

/* llama2.c v0 layout: config, then each tensor for all layers in turn. */
static void l2c_load(Kern *k, const ModelDesc *m, const float *w)
{
    int64_t dim = m->dim, hid = m->hidden_dim, kvd = (int64_t)m->n_kv_heads * m->head_dim;
    int L = m->n_layers;
    w = l2c_take(k, w, "embed", 0, m->vocab_size * dim);
    w = l2c_take(k, w, "attn_norm", L, dim);
    w = l2c_take(k, w, "wq", L, dim * dim);
    w = l2c_take(k, w, "wk", L, kvd * dim);
    w = l2c_take(k, w, "wv", L, kvd * dim);
    w = l2c_take(k, w, "wo", L, dim * dim);
    w = l2c_take(k, w, "ffn_norm", L, dim);
    w = l2c_take(k, w, "w_gate", L, hid * dim);
    w = l2c_take(k, w, "w_down", L, dim * hid);
    w = l2c_take(k, w, "w_up", L, hid * dim);
    w = l2c_take(k, w, "final_norm", 0, dim);
    w += (int64_t)m->max_seq * m->head_dim; /* llama2.c's own freq_cis tables */
    if (!m->tie_embeddings)
        l2c_take(k, w, "lm_head", 0, m->vocab_size * dim);
    float *rope = buf(k, (uint32_t)sched_find_buffer(k->s, "rope"));
    for (int pos = 0; pos < m->max_seq; pos++)
        for (int i = 0; i < m->head_dim / 2; i++) {
            double a = pos * pow(10000.0, -2.0 * i / m->head_dim);
            rope[(pos * (m->head_dim / 2) + i) * 2] = (float)cos(a);
            rope[(pos * (m->head_dim / 2) + i) * 2 + 1] = (float)sin(a);
        }
}

static int json_ids(const char *text, const char *key, int *ids, int max)
{
    const char *p = strstr(text, key);
    cr_assert_not_null(p, "no %s in the golden json", key);
    p = strchr(p, '[');
    int n = 0;
    while (p && *p != ']' && n < max) {
        char *e;
        long v = strtol(p + 1, &e, 10);
        if (e == p + 1)
            break;
        ids[n++] = (int)v;
        p = e;
        while (*p == ' ' || *p == '\n')
            p++;
    }
    return n;
}

/* Logits of the first 16 steps against the float64 golden (atol 1e-4, as
 * its README says), then greedy decoding from BOS against llama2.c's
 * tokens, with 3 workers. */
Test(cpu_ops, stories260k_matches_goldens)
{
    size_t nbin, nlog, njs;
    char *bin = read_file(SHARED "models/stories260K.bin", &nbin);
    char *lg = read_file(SHARED "golden/stories260K_logits_first16.f32", &nlog);
    char *js = read_file(SHARED "golden/stories260K_greedy.json", &njs);
    if (!bin || !lg || !js)
        cr_skip_test("../shared/models/stories260K.bin or its goldens are not present");
    int32_t cfg[7];
    memcpy(cfg, bin, sizeof cfg);
    ModelDesc m = toy_model(cfg[0], cfg[1], cfg[2], cfg[3], cfg[4], cfg[0] / cfg[3], abs(cfg[5]), cfg[6],
                            ROPE_ADJACENT);
    m.tie_embeddings = cfg[5] > 0;
    Kern k;
    kern_build(&k, lower_for_cpu(&m, 3));
    l2c_load(&k, &m, (const float *)(bin + sizeof cfg));
    int ids[512];
    int nids = json_ids(js, "\"greedy_token_ids\"", ids, 512);
    cr_assert(nids > 64 && nlog == 16 * (size_t)m.vocab_size * sizeof(float));
    const float *gold = (const float *)lg;
    int32_t *tok = buf(&k, (uint32_t)sched_find_buffer(k.s, "tok"));
    const int32_t *next = buf(&k, (uint32_t)sched_find_buffer(k.s, "next"));
    const float *logits = buf(&k, (uint32_t)sched_find_buffer(k.s, "logits"));
    for (int pos = 0; pos + 1 < nids && pos < 128; pos++) {
        *tok = ids[pos];
        kern_step(&k, pos, 0);
        cr_assert_eq(k.abort_info.flag, 0);
        for (int i = 0; pos < 16 && i < m.vocab_size; i++)
            cr_assert(fabsf(logits[i] - gold[pos * m.vocab_size + i]) <= 1e-4f, "pos %d logit %d: %.7f, golden %.7f",
                      pos, i, (double)logits[i], (double)gold[pos * m.vocab_size + i]);
        cr_assert_eq(*next, ids[pos + 1], "pos %d: greedy %d, llama2.c %d", pos, *next, ids[pos + 1]);
    }
    kern_free(&k);
    free(bin), free(lg), free(js);
}

/* Failures of the toolchain steps come back as errors, not crashes. */
Test(cpu_ops, toolchain_errors_are_reported)
{
    Schedule *s = sched_new("errs", "cpu", 1);
    s->shape = op_shape(0);
    uint32_t a = add_buf(s, "a", BUF_STATE, 16), b = add_buf(s, "b", BUF_STATE, 16);
    add_op(s, 0, OP_ADD, (int32_t[]){0, 16}, (uint32_t[]){a, b});
    sched_layout(s);
    const struct {
        const char *cpu, *so, *want;
    } cases[] = {
        {"pentium-9000", "/tmp/megac_cpu_never.so", "unknown CPU 'pentium-9000'"},
        {NULL, "/nonexistent-dir/kernel.so", "LLVMTargetMachineEmitToFile failed"},
    };
    for (int i = 0; i < 2; i++) {
        char out[1024] = {0};
        FILE *f = fmemopen(out, sizeof out, "w");
        Diag d;
        diag_init(&d);
        d.out = f;
        CpuOptions o = {.cpu = cases[i].cpu};
        cr_assert_not(cg_cpu_compile(s, &o, cases[i].so, &d));
        fclose(f);
        cr_assert_eq(d.nerrors, 1, "%s", out);
        cr_assert(strstr(out, cases[i].want), "%s", out);
    }
    sched_free(s);
}

/* ---- eviction and sparse attention (ir/ops.h, the comment above
 * SPARSE_SINK_WINDOW) ---- */

enum { SP_HD = 20, SP_NH = 6, SP_NKV = 2, SP_G = SP_NH / SP_NKV, SP_SEQ = 160, SP_PE = SP_G * (SP_HD + 2) };

static ModelShape sp_shape(void)
{
    return (ModelShape){.dim = SP_NH * SP_HD, .hidden_dim = 64, .n_layers = 1, .n_heads = SP_NH,
                        .n_kv_heads = SP_NKV, .head_dim = SP_HD, .vocab_size = 8, .max_seq = SP_SEQ,
                        .norm_eps = 1e-5};
}

static uint32_t add_i32(Schedule *s, const char *name, BufClass c, int64_t n)
{
    return sched_add_buffer(s, name, DT_I32, c, 1, &n);
}

static int32_t *ibuf(Kern *k, uint32_t b)
{
    return buf(k, b);
}

/* The attn_sparse variants that select every row (at every pos < SP_SEQ),
 * with the sel each Quest one reads (every page, ascending). */
/* Where ops.h puts q head qh's score of slot t < n (tests/scores.h). */
static int64_t evict_score_index(int qh, int t, int n, int cap, int ns)
{
    int64_t at = test_score_index(qh, t, n, cap, ns, SP_G);
    cr_assert(at >= 0, "slot %d of %d in no split", t, n);
    return at;
}

enum { SPV_ONE_RUN, SPV_SINKS_WINDOW, SPV_ALL_SINKS, SPV_QUEST16, SPV_QUEST7, SPV_SLOTS, SPV_ROWS, SPV_COUNT };

/* Every attn_sparse that selects all rows gives OP_ATTN's partials (block
 * 32) bit for bit, with 1 and 3 splits; slots also write their scores;
 * rows read the next kv head's list (of every row). */
Test(cpu_ops, attn_sparse_all_rows_is_attn)
{
    Schedule *s = sched_new("sparse_all", "cpu", 2);
    s->shape = sp_shape();
    uint32_t q = add_buf(s, "q", BUF_SCRATCH, SP_NH * SP_HD);
    uint32_t kc = add_buf(s, "kc", BUF_KV, SP_NKV * SP_SEQ * SP_HD), vc = add_buf(s, "vc", BUF_KV, SP_NKV * SP_SEQ * SP_HD);
    uint32_t sel16 = add_i32(s, "sel16", BUF_STATE, SP_NKV * 10), sel7 = add_i32(s, "sel7", BUF_STATE, SP_NKV * 23);
    uint32_t list = add_i32(s, "list", BUF_STATE, SP_NKV * SP_SEQ);
    const int32_t kinds[SPV_COUNT][3] = {{SPARSE_SINK_WINDOW, 0, SP_SEQ}, {SPARSE_SINK_WINDOW, 40, 200},
                                         {SPARSE_SINK_WINDOW, SP_SEQ, 1},  {SPARSE_QUEST, 16, 10},
                                         {SPARSE_QUEST, 7, 23},            {SPARSE_SLOTS, SP_SEQ, 0},
                                         {SPARSE_ROWS, 0, SP_SEQ}};
    const int nsplits[2] = {1, 3};
    uint32_t pa[2], ps[2][SPV_COUNT];
    int w = 0;
    for (int i = 0; i < 2; i++) {
        int ns = nsplits[i];
        char name[16];
        snprintf(name, sizeof name, "pa%d", ns);
        pa[i] = add_buf(s, name, BUF_SCRATCH, SP_NKV * ns * SP_PE);
        snprintf(name, sizeof name, "score%d", ns);
        uint32_t score = add_buf(s, name, BUF_SCRATCH, SP_NH * ns * sparse_score_rows(SP_SEQ, ns));
        for (int h = 0; h < SP_NKV; h++)
            for (int sp = 0; sp < ns; sp++)
                add_op(s, (w++) % 2, OP_ATTN, (int32_t[]){h, sp, ns, SPARSE_BLOCK, 0}, (uint32_t[]){q, kc, vc, pa[i], BUF_NONE});
        for (int v = 0; v < SPV_COUNT; v++) {
            snprintf(name, sizeof name, "ps%d_%d", ns, v);
            ps[i][v] = add_buf(s, name, BUF_SCRATCH, SP_NKV * ns * SP_PE);
            int32_t kind = kinds[v][0], b = kinds[v][2];
            uint32_t aux = v == SPV_QUEST16 ? sel16 : v == SPV_QUEST7 ? sel7 : v == SPV_ROWS ? list : BUF_NONE;
            if (v == SPV_SLOTS)
                b = 1, aux = score;
            for (int h = 0; h < SP_NKV; h++)
                for (int sp = 0; sp < ns; sp++)
                    add_op(s, (w++) % 2, OP_ATTN_SPARSE,
                           (int32_t[]){h, sp, ns, kind, v == SPV_ROWS ? (h + 1) % SP_NKV : kinds[v][1], b},
                           (uint32_t[]){q, kc, vc, ps[i][v], aux});
        }
    }
    Kern k;
    kern_build(&k, s);
    for (int h = 0; h < SP_NKV; h++) {
        for (int j = 0; j < 10; j++)
            ibuf(&k, sel16)[h * 10 + j] = j;
        for (int j = 0; j < 23; j++)
            ibuf(&k, sel7)[h * 23 + j] = j;
        for (int j = 0; j < SP_SEQ; j++)
            ibuf(&k, list)[h * SP_SEQ + j] = j;
    }
    const int64_t positions[] = {0, 5, 31, 32, 70, 100, SP_SEQ - 1};
    for (int pi = 0; pi < 7; pi++) {
        int64_t pos = positions[pi];
        fill(&k, q), fill(&k, kc), fill(&k, vc);
        kern_step(&k, pos, 0);
        cr_assert_eq(k.abort_info.flag, 0);
        for (int i = 0; i < 2; i++) {
            size_t bytes = (size_t)(SP_NKV * nsplits[i] * SP_PE) * sizeof(float);
            for (int v = 0; v < SPV_COUNT; v++)
                cr_assert(memcmp(buf(&k, pa[i]), buf(&k, ps[i][v]), bytes) == 0,
                          "attn_sparse variant %d, nsplit %d, pos %ld: partials differ from attn's", v, nsplits[i],
                          (long)pos);
        }
    }
    kern_free(&k);
}

/* ---- attn_sparse against double precision over the expected rows ---- */

enum { SR_CAP = 50, SR_PAGE = 8, SR_NP = 6 };
enum { SRV_SINK_WINDOW, SRV_QUEST, SRV_SLOTS, SRV_COUNT };

typedef struct SparseRef {
    Kern k;
    uint32_t q, kc, vc, kcs, vcs, sel, score[2]; /* [nsplit 1, 3] */
    uint32_t part[2][SRV_COUNT]; /* [nsplit 1, 3][variant] */
} SparseRef;

static const int sr_nsplit[2] = {1, 3};

static void sparse_ref_build(SparseRef *r)
{
    Schedule *s = sched_new("sparse_ref", "cpu", 3);
    s->shape = sp_shape();
    r->q = add_buf(s, "q", BUF_SCRATCH, SP_NH * SP_HD);
    r->kc = add_buf(s, "kc", BUF_KV, SP_NKV * SP_SEQ * SP_HD), r->vc = add_buf(s, "vc", BUF_KV, SP_NKV * SP_SEQ * SP_HD);
    r->kcs = add_buf(s, "kcs", BUF_KV, SP_NKV * SR_CAP * SP_HD), r->vcs = add_buf(s, "vcs", BUF_KV, SP_NKV * SR_CAP * SP_HD);
    r->sel = add_i32(s, "sel", BUF_STATE, SP_NKV * SR_NP);
    int w = 0;
    for (int i = 0; i < 2; i++) {
        int ns = sr_nsplit[i];
        char sname[16];
        snprintf(sname, sizeof sname, "score%d", ns);
        r->score[i] = add_buf(s, sname, BUF_SCRATCH, SP_NH * ns * sparse_score_rows(SR_CAP, ns));
        for (int v = 0; v < SRV_COUNT; v++) {
            char name[16];
            snprintf(name, sizeof name, "p%d_%d", ns, v);
            r->part[i][v] = add_buf(s, name, BUF_SCRATCH, SP_NKV * ns * SP_PE);
            int32_t p[6] = {0, 0, ns, SPARSE_SINK_WINDOW, 3, 50};
            uint32_t ops[5] = {r->q, r->kc, r->vc, r->part[i][v], BUF_NONE};
            if (v == SRV_QUEST)
                p[3] = SPARSE_QUEST, p[4] = SR_PAGE, p[5] = SR_NP, ops[4] = r->sel;
            if (v == SRV_SLOTS)
                p[3] = SPARSE_SLOTS, p[4] = SR_CAP, p[5] = 1, ops[1] = r->kcs, ops[2] = r->vcs,
                ops[4] = r->score[i];
            for (int h = 0; h < SP_NKV; h++)
                for (int sp = 0; sp < ns; sp++) {
                    p[0] = h, p[1] = sp;
                    add_op(s, (w++) % 3, OP_ATTN_SPARSE, p, ops);
                }
        }
    }
    kern_build(&r->k, s);
}

/* The hand-written Quest selection at pos: pages {0, 2, 3, 7, 11} below
 * the current one (2 and 3 adjacent), then the current page, -1 after. */
static void sparse_ref_sel(int32_t *sel, int64_t pos)
{
    const int32_t pick[5] = {0, 2, 3, 7, 11};
    int32_t c = (int32_t)(pos / SR_PAGE);
    int n = 0;
    for (int i = 0; i < 5; i++)
        if (pick[i] < c)
            sel[n++] = pick[i];
    sel[n++] = c;
    while (n < SR_NP)
        sel[n++] = -1;
}

/* The rows variant v selects at pos, ascending, from the test's own
 * reading of ops.h; returns their count. */
static int sparse_ref_rows(int v, int64_t pos, const int32_t *sel, int *rows)
{
    int n = 0;
    for (int t = 0; t <= pos; t++) {
        bool in = false;
        if (v == SRV_SINK_WINDOW)
            in = t < 3 || t > pos - 50;
        else if (v == SRV_SLOTS)
            in = t < SR_CAP;
        else
            for (int j = 0; j < SR_NP; j++)
                in = in || (sel[j] >= 0 && t / SR_PAGE == sel[j]);
        if (in)
            rows[n++] = t;
    }
    return n;
}

/* Each split's partial (rows whose index in the list is in its blocks)
 * against double precision, then all splits combined against plain
 * attention over the rows. */
static void sparse_ref_check(SparseRef *r, int v, int i, int64_t pos)
{
    Kern *k = &r->k;
    int ns = sr_nsplit[i], rows[SP_SEQ];
    int n = sparse_ref_rows(v, pos, ibuf(k, r->sel), rows);
    int64_t S = v == SRV_SLOTS ? SR_CAP : SP_SEQ;
    const float *q = buf(k, r->q), *kc = buf(k, v == SRV_SLOTS ? r->kcs : r->kc);
    const float *vc = buf(k, v == SRV_SLOTS ? r->vcs : r->vc), *part = buf(k, r->part[i][v]);
    for (int h = 0; h < SP_NKV; h++)
        for (int g = 0; g < SP_G; g++) {
            const float *qg = q + (h * SP_G + g) * SP_HD;
            double sc[SP_SEQ], M = -INFINITY, L = 0, out[SP_HD] = {0}, mag[SP_HD] = {0};
            for (int x = 0; x < n; x++) {
                double d = 0;
                for (int j = 0; j < SP_HD; j++)
                    d += (double)qg[j] * kc[(h * S + rows[x]) * SP_HD + j];
                sc[x] = d / sqrt((double)SP_HD);
                M = fmax(M, sc[x]);
            }
            for (int sp = 0; sp < ns; sp++) {
                double m = -INFINITY, l = 0, want[SP_HD + 2] = {0}, wmag[SP_HD + 2] = {0};
                for (int x = 0; x < n; x++)
                    if (in_split(x, n, SPARSE_BLOCK, ns, sp))
                        m = fmax(m, sc[x]);
                for (int x = 0; x < n; x++) {
                    if (!in_split(x, n, SPARSE_BLOCK, ns, sp))
                        continue;
                    double e = exp(sc[x] - m);
                    l += e;
                    for (int j = 0; j < SP_HD; j++) {
                        want[j] += e * vc[(h * S + rows[x]) * SP_HD + j];
                        wmag[j] += fabs(e * vc[(h * S + rows[x]) * SP_HD + j]);
                    }
                }
                const float *got = part + ((h * ns + sp) * SP_G + g) * (SP_HD + 2);
                want[SP_HD] = m, want[SP_HD + 1] = l;
                wmag[SP_HD] = fabs(m), wmag[SP_HD + 1] = l;
                if (m == -INFINITY) {
                    cr_assert(got[SP_HD] == -INFINITY && got[SP_HD + 1] == 0, "v%d ns%d pos %ld: empty split", v, ns,
                              (long)pos);
                    expect_close("attn_sparse empty split", got, want, NULL, SP_HD);
                } else {
                    expect_close("attn_sparse split partial", got, want, wmag, SP_HD + 2);
                }
            }
            /* the test's own combine of the kernel's splits */
            double comb[SP_HD];
            combine_partials(part, h, ns, g, SP_G, SP_HD, comb);
            for (int x = 0; x < n; x++) {
                double e = exp(sc[x] - M);
                L += e;
                for (int j = 0; j < SP_HD; j++)
                    out[j] += e * vc[(h * S + rows[x]) * SP_HD + j], mag[j] += fabs(e * vc[(h * S + rows[x]) * SP_HD + j]);
            }
            for (int j = 0; j < SP_HD; j++) {
                double got = comb[j], want = out[j] / L, tol = 1e-5 * (mag[j] / L + 1e-3);
                cr_assert(fabs(got - want) <= tol, "v%d ns%d pos %ld h%d g%d: combined[%d] %.9g, want %.9g", v, ns,
                          (long)pos, h, g, j, got, want);
            }
        }
}

static const int64_t sr_positions[] = {0, 9, 40, 77, 130, SP_SEQ - 1};

/* Sink+window, Quest with gaps in sel, and slots, with 1 and 3 splits. */
Test(cpu_ops, attn_sparse_matches_double)
{
    SparseRef r;
    sparse_ref_build(&r);
    for (int pi = 0; pi < 6; pi++) {
        int64_t pos = sr_positions[pi];
        fill(&r.k, r.q), fill(&r.k, r.kc), fill(&r.k, r.vc), fill(&r.k, r.kcs), fill(&r.k, r.vcs);
        for (int h = 0; h < SP_NKV; h++)
            sparse_ref_sel(ibuf(&r.k, r.sel) + h * SR_NP, pos);
        kern_step(&r.k, pos, 0);
        cr_assert_eq(r.k.abort_info.flag, 0);
        for (int i = 0; i < 2; i++)
            for (int v = 0; v < SRV_COUNT; v++)
                sparse_ref_check(&r, v, i, pos);
    }
    kern_free(&r.k);
}

/* Slots with b = 1 store q . k / sqrt(hd) of the filled slots where
 * ops.h puts them, with 1 and 3 splits; the rest of the scores is left
 * alone. */
Test(cpu_ops, attn_sparse_slots_scores)
{
    SparseRef r;
    sparse_ref_build(&r);
    for (int pi = 0; pi < 6; pi++) {
        int64_t pos = sr_positions[pi], n = pos + 1 < SR_CAP ? pos + 1 : SR_CAP;
        fill(&r.k, r.q), fill(&r.k, r.kcs), fill(&r.k, r.vcs);
        for (int i = 0; i < 2; i++)
            for (int64_t j = 0; j < r.k.s->bufs[r.score[i]].nelem; j++)
                ((float *)buf(&r.k, r.score[i]))[j] = 777.0f;
        kern_step(&r.k, pos, 0);
        cr_assert_eq(r.k.abort_info.flag, 0);
        const float *q = buf(&r.k, r.q), *kc = buf(&r.k, r.kcs);
        for (int i = 0; i < 2; i++) {
            int ns = sr_nsplit[i];
            float *score = buf(&r.k, r.score[i]);
            int64_t nsc = r.k.s->bufs[r.score[i]].nelem, seen = 0;
            for (int qh = 0; qh < SP_NH; qh++)
                for (int64_t t = 0; t < n; t++) {
                    int64_t at = evict_score_index(qh, (int)t, (int)n, SR_CAP, ns);
                    float got = score[at];
                    score[at] = 777.0f, seen++; /* checked: the rest must be untouched */
                    double d = 0, m = 0;
                    for (int j = 0; j < SP_HD; j++) {
                        double x = (double)q[qh * SP_HD + j] * kc[((qh / SP_G) * SR_CAP + t) * SP_HD + j];
                        d += x, m += fabs(x);
                    }
                    double want = d / sqrt((double)SP_HD), tol = 1e-5 * (m / sqrt((double)SP_HD) + 1e-3);
                    cr_assert(fabs(got - want) <= tol, "%d splits, pos %ld: score of q head %d, slot %ld %.9g, want %.9g",
                              ns, (long)pos, qh, (long)t, (double)got, want);
                }
            cr_assert_eq(seen, SP_NH * n);
            for (int64_t j = 0; j < nsc; j++)
                cr_assert_eq(score[j], 777.0f, "%d splits, pos %ld: score entry %ld, no filled slot's, was written", ns,
                             (long)pos, (long)j);
        }
    }
    kern_free(&r.k);
}

/* ---- kv_store ---- */

enum { KS_CAP = 5 };

/* Rows land in the slot meta[h][cap] names, meta records the position,
 * and pos 0 empties meta and starts at slot 0 (also a second time). */
Test(cpu_ops, kv_store_slots)
{
    Schedule *s = sched_new("kv_store", "cpu", 2);
    s->shape = sp_shape();
    uint32_t kin = add_buf(s, "k", BUF_SCRATCH, SP_NKV * SP_HD), vin = add_buf(s, "v", BUF_SCRATCH, SP_NKV * SP_HD);
    uint32_t kc = add_buf(s, "kc", BUF_KV, SP_NKV * KS_CAP * SP_HD), vc = add_buf(s, "vc", BUF_KV, SP_NKV * KS_CAP * SP_HD);
    uint32_t meta = add_i32(s, "meta", BUF_STATE, SP_NKV * (KS_CAP + 1));
    for (int h = 0; h < SP_NKV; h++)
        add_op(s, h, OP_KV_STORE, (int32_t[]){h, KS_CAP}, (uint32_t[]){kin, vin, kc, vc, meta});
    Kern k;
    kern_build(&k, s);
    fill(&k, kc), fill(&k, vc);
    int32_t *mt = ibuf(&k, meta);
    for (int i = 0; i < SP_NKV * (KS_CAP + 1); i++)
        mt[i] = 3; /* garbage, slot 3 included: pos 0 must reset it */
    float ekc[SP_NKV * KS_CAP * SP_HD], evc[SP_NKV * KS_CAP * SP_HD];
    int32_t emeta[SP_NKV * (KS_CAP + 1)];
    memcpy(ekc, buf(&k, kc), sizeof ekc);
    memcpy(evc, buf(&k, vc), sizeof evc);
    /* the slot each head is told to take at steps 1.. (pos 0 always 0) */
    const int32_t plan[2][13] = {{1, 2, 3, 4, 2, 0, 4, 4, 1, 0, 1, 2, 3}, {1, 2, 3, 4, 3, 3, 0, 1, 2, 0, 4, 1, 1}};
    const int64_t poss[13] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3}; /* a restart at step 9 */
    for (int st = 0; st < 13; st++) {
        int64_t pos = poss[st];
        fill(&k, kin), fill(&k, vin);
        for (int h = 0; h < SP_NKV; h++) {
            if (pos > 0)
                mt[h * (KS_CAP + 1) + KS_CAP] = plan[h][st - 1];
            int32_t *em = emeta + h * (KS_CAP + 1);
            if (pos == 0) {
                for (int t = 0; t < KS_CAP; t++)
                    em[t] = -1;
                em[KS_CAP] = 0;
            } else {
                em[KS_CAP] = plan[h][st - 1];
            }
            int slot = em[KS_CAP];
            em[slot] = (int32_t)pos;
            memcpy(ekc + (h * KS_CAP + slot) * SP_HD, (float *)buf(&k, kin) + h * SP_HD, SP_HD * sizeof(float));
            memcpy(evc + (h * KS_CAP + slot) * SP_HD, (float *)buf(&k, vin) + h * SP_HD, SP_HD * sizeof(float));
        }
        kern_step(&k, pos, 0);
        cr_assert_eq(k.abort_info.flag, 0);
        for (int i = 0; i < SP_NKV * (KS_CAP + 1); i++)
            cr_assert_eq(mt[i], emeta[i], "step %d (pos %ld): meta[%d] = %d, want %d", st, (long)pos, i, mt[i],
                         emeta[i]);
        cr_assert(memcmp(buf(&k, kc), ekc, sizeof ekc) == 0, "step %d: k rows", st);
        cr_assert(memcmp(buf(&k, vc), evc, sizeof evc) == 0, "step %d: v rows", st);
    }
    kern_free(&k);
}

/* ---- quest_select ---- */

enum { QS_PAGE = 8, QS_PAGES = SP_SEQ / QS_PAGE, QS_NP = 5 };

/* The test's selection for kv head h at pos from its own page bounds (min
 * and max of kc rows, in double): page c, then the QS_NP-1 pages j < c of
 * largest U (lower page on ties), ascending, -1 padding. Returns false
 * when the last kept and the first dropped page are within rounding of
 * each other (but not equal), so the order is not a test of anything. */
static bool quest_ref_sel(const float *q, const float *kc, int h, int64_t pos, int32_t *sel)
{
    int c = (int)(pos / QS_PAGE), order[QS_PAGES];
    double u[QS_PAGES];
    for (int j = 0; j <= c; j++) {
        u[j] = 0;
        for (int i = 0; i < SP_HD; i++) {
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t t = j * QS_PAGE; t < (j + 1) * QS_PAGE && t <= pos; t++) {
                double x = kc[(h * SP_SEQ + t) * SP_HD + i];
                lo = fmin(lo, x), hi = fmax(hi, x);
            }
            for (int g = 0; g < SP_G; g++) {
                double qv = q[(h * SP_G + g) * SP_HD + i];
                u[j] += fmax(qv * lo, qv * hi);
            }
        }
    }
    for (int j = 0; j < c; j++) { /* insertion sort: larger U first, lower page on ties */
        int x = j;
        while (x > 0 && u[order[x - 1]] < u[j])
            order[x] = order[x - 1], x--;
        order[x] = j;
    }
    int keep = c < QS_NP - 1 ? c : QS_NP - 1;
    bool clear = true;
    if (keep < c) {
        double a = u[order[keep - 1]], b = u[order[keep]];
        clear = a == b || fabs(a - b) > 1e-4 * (fabs(a) + 1);
    }
    bool chosen[QS_PAGES] = {false};
    for (int x = 0; x < keep; x++)
        chosen[order[x]] = true;
    chosen[c] = true;
    int n = 0;
    for (int j = 0; j <= c; j++)
        if (chosen[j])
            sel[n++] = j;
    while (n < QS_NP)
        sel[n++] = -1;
    return clear;
}

/* Steps pos = 0..last of a quest_select per kv head: page c's bounds are
 * exactly the min and max of its rows, and sel is the test's ranking. */
static int quest_run(Kern *k, uint32_t q, uint32_t kc, uint32_t bounds, uint32_t sel, int64_t last, bool refill_q)
{
    int unclear = 0;
    for (int64_t pos = 0; pos <= last; pos++) {
        if (refill_q)
            fill(k, q);
        kern_step(k, pos, 0);
        cr_assert_eq(k->abort_info.flag, 0);
        const float *kcp = buf(k, kc), *bd = buf(k, bounds);
        int c = (int)(pos / QS_PAGE);
        for (int h = 0; h < SP_NKV; h++) {
            const float *lo = bd + ((h * QS_PAGES + c) * 2) * SP_HD, *hi = lo + SP_HD;
            for (int i = 0; i < SP_HD; i++) {
                float mn = INFINITY, mx = -INFINITY;
                for (int64_t t = c * QS_PAGE; t <= pos; t++)
                    mn = fminf(mn, kcp[(h * SP_SEQ + t) * SP_HD + i]), mx = fmaxf(mx, kcp[(h * SP_SEQ + t) * SP_HD + i]);
                cr_assert(lo[i] == mn && hi[i] == mx, "pos %ld h%d: bounds of page %d lane %d", (long)pos, h, c, i);
            }
            int32_t want[QS_NP];
            const int32_t *got = ibuf(k, sel) + h * QS_NP;
            bool clear = quest_ref_sel(buf(k, q), kcp, h, pos, want);
            bool has_c = false;
            for (int j = 0; j < QS_NP; j++)
                has_c = has_c || got[j] == c;
            cr_assert(has_c, "pos %ld h%d: the current page %d is not selected", (long)pos, h, c);
            if (!clear) {
                unclear++;
                continue;
            }
            for (int j = 0; j < QS_NP; j++)
                cr_assert_eq(got[j], want[j], "pos %ld h%d: sel[%d] = %d, want %d", (long)pos, h, j, got[j], want[j]);
        }
    }
    return unclear;
}

Test(cpu_ops, quest_select_pages)
{
    Schedule *s = sched_new("quest", "cpu", 2);
    s->shape = sp_shape();
    uint32_t q = add_buf(s, "q", BUF_SCRATCH, SP_NH * SP_HD), kc = add_buf(s, "kc", BUF_KV, SP_NKV * SP_SEQ * SP_HD);
    uint32_t bounds = add_buf(s, "bounds", BUF_STATE, SP_NKV * QS_PAGES * 2 * SP_HD);
    uint32_t sel = add_i32(s, "sel", BUF_STATE, SP_NKV * QS_NP);
    for (int h = 0; h < SP_NKV; h++)
        add_op(s, h, OP_QUEST_SELECT, (int32_t[]){h, QS_PAGE, QS_NP}, (uint32_t[]){q, kc, bounds, sel});
    Kern k;
    kern_build(&k, s);
    fill(&k, kc), fill(&k, bounds);
    int unclear = quest_run(&k, q, kc, bounds, sel, SP_SEQ - 1, true);
    cr_assert(unclear < 8, "%d of %d selections had near ties", unclear, 2 * SP_SEQ);
    /* -1 padding while fewer pages exist than npages */
    fill(&k, q);
    kern_step(&k, 2 * QS_PAGE + 3, 0);
    for (int h = 0; h < SP_NKV; h++) {
        const int32_t *got = ibuf(&k, sel) + h * QS_NP;
        cr_assert(got[0] == 0 && got[1] == 1 && got[2] == 2 && got[3] == -1 && got[4] == -1,
                  "h%d: pages 0..2 then padding, got %d %d %d %d %d", h, got[0], got[1], got[2], got[3], got[4]);
    }
    /* every row alike: every U equal, the lowest pages win the ties */
    float *kcp = buf(&k, kc);
    for (int64_t t = 1; t < SP_NKV * SP_SEQ; t++)
        memcpy(kcp + t * SP_HD, kcp, SP_HD * sizeof(float));
    cr_assert_eq(quest_run(&k, q, kc, bounds, sel, 100, false), 0);
    for (int h = 0; h < SP_NKV; h++) {
        const int32_t *got = ibuf(&k, sel) + h * QS_NP;
        cr_assert(got[0] == 0 && got[1] == 1 && got[2] == 2 && got[3] == 3 && got[4] == 100 / QS_PAGE,
                  "h%d: ties go to the lower pages, got %d %d %d %d %d", h, got[0], got[1], got[2], got[3], got[4]);
    }
    kern_free(&k);
}

/* ---- topk_select ---- */

/* Kascade's top-k rows (ops.h) on the rows of harness_topk_level, at every
 * position, for fixed k of 1, 5 and 40 and two growing with the rows. */
Test(cpu_ops, topk_select_rows)
{
    Schedule *s = sched_new("topk", "cpu", 2);
    s->shape = sp_shape();
    uint32_t q = add_buf(s, "q", BUF_SCRATCH, SP_NH * SP_HD), kc = add_buf(s, "kc", BUF_KV, SP_NKV * SP_SEQ * SP_HD);
    uint32_t sc = add_buf(s, "topksc", BUF_SCRATCH, (SP_NH + SP_NKV) * SP_SEQ), sel[HARNESS_NTOPK];
    for (int i = 0; i < HARNESS_NTOPK; i++) {
        HarnessTopk c = harness_topks[i];
        char name[16];
        snprintf(name, sizeof name, "kidx%d", i);
        sel[i] = add_i32(s, name, BUF_STATE, SP_NKV * c.k);
        for (int h = 0; h < SP_NKV; h++)
            add_op(s, h, OP_TOPK_SELECT, (int32_t[]){h, c.k, c.b, c.ppm}, (uint32_t[]){q, kc, sc, sel[i]});
    }
    Kern k;
    kern_build(&k, s);
    float *qp = buf(&k, q), *kcp = buf(&k, kc);
    for (int i = 0; i < SP_NH * SP_HD; i++)
        qp[i] = 0.5f + 0.5f * (float)(i % 7) / 7.0f;
    for (int h = 0; h < SP_NKV; h++)
        for (int64_t t = 0; t < SP_SEQ; t++)
            for (int j = 0; j < SP_HD; j++)
                kcp[(h * SP_SEQ + t) * SP_HD + j] = (float)(harness_topk_level((int)t) * (0.5 + 0.25 * (j % 3)));
    for (int64_t pos = 0; pos < SP_SEQ; pos++) {
        kern_step(&k, pos, 0);
        cr_assert_eq(k.abort_info.flag, 0);
        for (int i = 0; i < HARNESS_NTOPK; i++) {
            int want[40], kk = harness_topks[i].k;
            harness_topk_want((int)pos, harness_topks[i], want);
            for (int h = 0; h < SP_NKV; h++) {
                const int32_t *got = ibuf(&k, sel[i]) + h * kk;
                for (int j = 0; j < kk; j++)
                    cr_assert_eq(got[j], want[j], "pos %ld h%d case %d: sel[%d] = %d, want %d", (long)pos, h, i, j,
                                 got[j], want[j]);
            }
        }
    }
    kern_free(&k);
}

/* ---- kv_evict ---- */

enum { KE_CAPMAX = 70, KE_SINKS = 2, KE_WINDOW = 2 };

/* What kv_store then kv_evict of one layer keep, in double, for a cache
 * of cap slots. */
typedef struct EvictModel {
    int pol, cap;
    int32_t meta[SP_NKV][KE_CAPMAX + 1];
    double acc[SP_NKV][KE_CAPMAX];
} EvictModel;

/* score[qh][t] (rows of KE_CAPMAX) is the step's scores, slot by slot. */
static void evict_model_step(EvictModel *m, const float *score, int64_t pos)
{
    int pol = m->pol, cap = m->cap;
    if (pos == 0)
        for (int h = 0; h < SP_NKV; h++) {
            for (int t = 0; t < cap; t++)
                m->meta[h][t] = -1, m->acc[h][t] = 0;
            m->meta[h][cap] = 0;
        }
    for (int h = 0; h < SP_NKV; h++)
        m->meta[h][m->meta[h][cap]] = (int32_t)pos;
    int n = pos + 1 < cap ? (int)pos + 1 : cap;
    double p[SP_NH][KE_CAPMAX], mean[KE_CAPMAX] = {0};
    for (int qh = 0; qh < SP_NH; qh++) {
        double mx = -INFINITY, z = 0;
        for (int t = 0; t < n; t++)
            mx = fmax(mx, score[qh * KE_CAPMAX + t]);
        for (int t = 0; t < n; t++)
            z += exp(score[qh * KE_CAPMAX + t] - mx);
        for (int t = 0; t < n; t++) {
            p[qh][t] = exp(score[qh * KE_CAPMAX + t] - mx) / z;
            mean[t] += p[qh][t] / SP_NH;
            if (pol == KV_POLICY_H2O)
                m->acc[qh / SP_G][t] += p[qh][t];
        }
    }
    for (int h = 0; h < SP_NKV; h++) {
        if (pos + 1 < cap) {
            m->meta[h][cap] = (int32_t)pos + 1;
            continue;
        }
        int v = -1;
        for (int t = 0; t < cap; t++) {
            int32_t ps = m->meta[h][t];
            if (pol == KV_POLICY_STREAMING && ps >= KE_SINKS && (v < 0 || ps < m->meta[h][v]))
                v = t;
            if (pol == KV_POLICY_H2O && ps <= pos - KE_WINDOW && (v < 0 || m->acc[h][t] < m->acc[h][v]))
                v = t;
            if (pol == KV_POLICY_TOVA && (v < 0 || mean[t] < mean[v]))
                v = t;
        }
        cr_assert(v >= 0);
        if (pol == KV_POLICY_H2O)
            m->acc[h][v] = 0;
        m->meta[h][cap] = v;
    }
}

/* kv_store + kv_evict of three layers (streaming, h2o, tova) over steps,
 * with a restart, against EvictModel: a small cache read as one split,
 * and one of three blocks read as three splits (scores in three pieces). */
Test(cpu_ops, kv_evict_policies)
{
    static const struct { int cap, ns, steps, restart; } cfg[] = {{6, 1, 30, 21}, {70, 3, 150, 110}};
    for (int c = 0; c < 2; c++) {
        int cap = cfg[c].cap, ns = cfg[c].ns;
        Schedule *s = sched_new("kv_evict", "cpu", 1);
        s->shape = sp_shape();
        uint32_t kin = add_buf(s, "k", BUF_SCRATCH, SP_NKV * SP_HD), vin = add_buf(s, "v", BUF_SCRATCH, SP_NKV * SP_HD);
        int64_t nsc = SP_NH * ns * sparse_score_rows(cap, ns);
        uint32_t score = add_buf(s, "score", BUF_SCRATCH, nsc);
        uint32_t meta[KV_POLICY_COUNT], acc = add_buf(s, "acc", BUF_STATE, SP_NKV * cap);
        for (int pol = 0; pol < KV_POLICY_COUNT; pol++) {
            char name[16];
            snprintf(name, sizeof name, "meta%d", pol);
            meta[pol] = add_i32(s, name, BUF_STATE, SP_NKV * (cap + 1));
            snprintf(name, sizeof name, "kc%d", pol);
            uint32_t kc = add_buf(s, name, BUF_KV, SP_NKV * cap * SP_HD);
            snprintf(name, sizeof name, "vc%d", pol);
            uint32_t vc = add_buf(s, name, BUF_KV, SP_NKV * cap * SP_HD);
            for (int h = 0; h < SP_NKV; h++)
                add_op(s, 0, OP_KV_STORE, (int32_t[]){h, cap}, (uint32_t[]){kin, vin, kc, vc, meta[pol]});
            int32_t p[5] = {pol, cap, pol == KV_POLICY_STREAMING ? KE_SINKS : 0, pol == KV_POLICY_H2O ? KE_WINDOW : 0,
                            ns};
            add_op(s, 0, OP_KV_EVICT, p,
                   (uint32_t[]){pol == KV_POLICY_STREAMING ? BUF_NONE : score, meta[pol],
                                pol == KV_POLICY_H2O ? acc : BUF_NONE});
        }
        Kern k;
        kern_build(&k, s);
        EvictModel em[KV_POLICY_COUNT];
        for (int pol = 0; pol < KV_POLICY_COUNT; pol++) {
            em[pol].pol = pol, em[pol].cap = cap;
            for (int i = 0; i < SP_NKV * (cap + 1); i++)
                ibuf(&k, meta[pol])[i] = 4; /* garbage: pos 0 resets it */
        }
        float *ac = buf(&k, acc), *sc = buf(&k, score);
        for (int i = 0; i < SP_NKV * cap; i++)
            ac[i] = 5.0f;
        int victims = 0;
        static float logical[SP_NH * KE_CAPMAX];
        for (int st = 0; st < cfg[c].steps; st++) {
            int64_t pos = st < cfg[c].restart ? st : st - cfg[c].restart;
            int n = pos + 1 < cap ? (int)pos + 1 : cap;
            fill(&k, kin), fill(&k, vin);
            for (int64_t i = 0; i < nsc; i++)
                sc[i] = 30.0f; /* entries no slot t < n maps to must not count */
            for (int qh = 0; qh < SP_NH; qh++)
                for (int t = 0; t < n; t++)
                    sc[evict_score_index(qh, t, n, cap, ns)] = logical[qh * KE_CAPMAX + t] = 3.0f * rnd();
            kern_step(&k, pos, 0);
            cr_assert_eq(k.abort_info.flag, 0);
            for (int pol = 0; pol < KV_POLICY_COUNT; pol++) {
                evict_model_step(&em[pol], logical, pos);
                const int32_t *mt = ibuf(&k, meta[pol]);
                for (int h = 0; h < SP_NKV; h++)
                    for (int t = 0; t <= cap; t++)
                        cr_assert_eq(mt[h * (cap + 1) + t], em[pol].meta[h][t],
                                     "cap %d, %d splits, policy %d, pos %ld: meta[%d][%d] = %d, want %d", cap, ns, pol,
                                     (long)pos, h, t, mt[h * (cap + 1) + t], em[pol].meta[h][t]);
                if (pos + 1 < cap)
                    continue;
                victims++;
                if (pol == KV_POLICY_STREAMING)
                    for (int h = 0; h < SP_NKV; h++) {
                        int kept = 0;
                        for (int t = 0; t < cap; t++)
                            kept += mt[h * (cap + 1) + t] < KE_SINKS;
                        cr_assert_eq(kept, KE_SINKS, "streaming keeps the sinks");
                        cr_assert(mt[h * (cap + 1) + mt[h * (cap + 1) + cap]] >= KE_SINKS);
                    }
                if (pol == KV_POLICY_TOVA)
                    cr_assert_eq(mt[cap], mt[2 * cap + 1], "tova: one victim for every kv head");
                if (pol == KV_POLICY_H2O)
                    for (int h = 0; h < SP_NKV; h++)
                        cr_assert_eq(ac[h * cap + mt[h * (cap + 1) + cap]], 0.0f, "h2o zeroes the victim's acc");
            }
            double want[SP_NKV * KE_CAPMAX];
            for (int h = 0; h < SP_NKV; h++)
                for (int t = 0; t < cap; t++)
                    want[h * cap + t] = em[KV_POLICY_H2O].acc[h][t];
            expect_close("h2o acc", ac, want, NULL, SP_NKV * cap);
        }
        cr_assert(victims > 30, "%d victims", victims);
        kern_free(&k);
    }
}

/* cpu_check: meta and sel must be i32, an optional operand the params use
 * must be there, and quest_select's npages has a limit. */
Test(cpu_ops, sparse_ops_bad_operands_are_errors)
{
    Schedule *s = sched_new("sparse_bad", "cpu", 1);
    s->shape = sp_shape();
    uint32_t q = add_buf(s, "q", BUF_SCRATCH, SP_NH * SP_HD), kc = add_buf(s, "kc", BUF_KV, SP_NKV * SP_SEQ * SP_HD);
    uint32_t vc = add_buf(s, "vc", BUF_KV, SP_NKV * SP_SEQ * SP_HD), part = add_buf(s, "part", BUF_SCRATCH, 1024);
    uint32_t fmeta = add_buf(s, "fmeta", BUF_STATE, SP_NKV * 6), sel = add_i32(s, "sel", BUF_STATE, 8);
    uint32_t bounds = add_buf(s, "bounds", BUF_STATE, SP_NKV * SP_SEQ * 2 * SP_HD);
    add_op(s, 0, OP_KV_STORE, (int32_t[]){0, 5}, (uint32_t[]){q, q, kc, vc, fmeta});
    add_op(s, 0, OP_ATTN_SPARSE, (int32_t[]){0, 0, 1, SPARSE_QUEST, 8, 4}, (uint32_t[]){q, kc, vc, part, BUF_NONE});
    add_op(s, 0, OP_QUEST_SELECT, (int32_t[]){0, 1, 5000}, (uint32_t[]){q, kc, bounds, sel});
    sched_layout(s);
    char out[2048] = {0};
    cr_assert_eq(compile_errors(s, out, sizeof out), 3, "%s", out);
    cr_assert(strstr(out, "kv_store operand 'meta' (buffer 'fmeta') of dtype f32 is not supported"), "%s", out);
    cr_assert(strstr(out, "attn_sparse operand 'aux' is absent but its params need it"), "%s", out);
    cr_assert(strstr(out, "quest_select with npages = 5000 > 4096 is not supported"), "%s", out);
    sched_free(s);
}
