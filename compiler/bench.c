/*
 * bench.c - the two measurements of `megac bench`.
 *
 * Decode rate: steps of the compiled kernel through the public runtime API,
 * timed over `ntok` tokens after a BOS step, each step fed the kernel's own
 * argmax (what greedy generation does, minus detokenization).
 *
 * Read ceiling: the read bandwidth plain code reaches on this machine right
 * now over a working set like the decode's. A buffer (as large as the
 * step's weight bytes, so that it fits in the caches exactly when the
 * weights would) is touched first (so page faults are not timed), then in
 * each pass every CPU runs one thread over its own slice, `sweeps` times,
 * reading `streams` sequential streams interleaved four cache lines at a
 * time (what hardware prefetchers like, and what a GEMV over several rows
 * looks like; read_lines below); a pass is timed from a common start to the
 * last thread's finish.
 * The caller interleaves passes with decode runs, so both see the same
 * machine (other load, frequency).
 */
#include "compiler/bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef uint64_t v2u64 __attribute__((vector_size(16)));

#define BENCH_CEILING_MIN (1ULL << 20)      /* bytes: a buffer no smaller */
#define BENCH_CEILING_MAX (2ULL << 30)      /* nor larger (nor over a quarter of memory) */
#define BENCH_PASS_MIN (512ULL << 20)       /* bytes a pass reads at least: thread starts stay < 1% */
#define BENCH_PASS_MAX (16ULL << 30)        /* and at most: models far beyond any cache */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_ratio_median(const double *num, const double *den, int n, double *lo, double *hi)
{
    double r[4096];
    n = n < 4096 ? n : 4096;
    for (int i = 0; i < n; i++)
        r[i] = num[i] / den[i];
    double med = bench_median(r, n);
    *lo = r[0];
    *hi = r[n - 1];
    return med;
}

typedef uint64_t (*ReadLinesFn)(const void *, size_t, int, int);

typedef struct ReadJob {
    const v2u64 *base;          /* this thread's slice */
    size_t nvec;                /* 16-byte vectors in the slice */
    int streams, sweeps;
    ReadLinesFn read;
    atomic_int *go;             /* set once every thread exists */
    uint64_t sink;              /* keeps the loads alive */
    double end;                 /* finish time of the pass */
} ReadJob;

/* A thread's reads: `sweeps` times over `per` 64-byte lines of each of
 * `streams` sequential streams, four lines of each in turn, each stream
 * prefetched 16 KB ahead into L2 (as the CPU kernels' weight streams are),
 * with the widest loads the CPU has (a line in one AVX-512 load, two AVX
 * ones or four SSE ones). On an Intel host reading from its L3, SmolLM2's
 * 137 MiB at two threads: 48-50 GB/s a line of each stream in turn with
 * SSE or AVX-512 loads alike, 52-54 four lines in turn with AVX-512 loads,
 * 54-55 with the prefetches too (a scratch probe). */
#define READ_LINES(NAME, ATTR, VT)                                                                        \
    static ATTR uint64_t NAME(const void *base, size_t per, int streams, int sweeps)                    \
    {                                                                                                     \
        typedef uint64_t vt __attribute__((vector_size(VT)));                                            \
        const vt *v = base;                                                                               \
        const size_t n = 64 / VT, len = per * n, ahead = 16384 / VT;                                     \
        vt acc0 = {0};                                                                                    \
        for (int sw = 0; sw < sweeps; sw++)                                                               \
            for (size_t i = 0; i < len; i += 4 * n)                                                       \
                for (int s = 0; s < streams; s++) {                                                       \
                    const vt *q = v + (size_t)s * len + i;                                                \
                    if (i + ahead < len)                                                                  \
                        for (size_t l = 0; l < 4 * n; l += n)                                             \
                            __builtin_prefetch(q + ahead + l, 0, 2);                                      \
                    vt line = q[0];                                                                       \
                    for (size_t l = 1; l < 4 * n; l++)                                                    \
                        line ^= q[l];                                                                     \
                    acc0 ^= line;                                                                         \
                }                                                                                         \
        uint64_t r = 0;                                                                                   \
        for (size_t i = 0; i < VT / 8; i++)                                                               \
            r ^= acc0[i];                                                                                 \
        return r;                                                                                         \
    }
READ_LINES(read_lines_sse, , 16)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
READ_LINES(read_lines_avx2, __attribute__((target("avx2"))), 32)
READ_LINES(read_lines_avx512, __attribute__((target("avx512f"))), 64)
#endif

static ReadLinesFn read_lines_best(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return read_lines_avx512;
    if (__builtin_cpu_supports("avx2"))
        return read_lines_avx2;
#endif
    return read_lines_sse;
}

static void *read_job_run(void *p)
{
    ReadJob *j = p;
    size_t per = j->nvec / (size_t)j->streams / 16 * 4;      /* lines a stream, a multiple of 4 */
    while (!atomic_load_explicit(j->go, memory_order_acquire))
        ;
    j->sink = j->read(j->base, per, j->streams, j->sweeps);
    j->end = now_s();
    return NULL;
}

struct BenchCeiling {
    v2u64 *buf;
    size_t len;                 /* bytes mapped */
    int threads, streams, sweeps;
    ReadLinesFn read;           /* read_lines_best(), chosen once */
};

/* One timed pass (`sweeps` times over the whole buffer); seconds, or
 * negative on failure. */
static double read_pass(const BenchCeiling *c, int sweeps)
{
    int threads = c->threads;
    size_t nvec = c->len / sizeof(v2u64);
    ReadJob *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    atomic_int go = 0;
    double secs = -1;
    if (!jobs || !th)
        goto out;
    size_t slice = nvec / (size_t)threads / 16 * 16;     /* each slice 256-byte aligned */
    int started = 0;
    for (; started < threads; started++) {
        jobs[started] = (ReadJob){c->buf + (size_t)started * slice, slice, c->streams, sweeps, c->read, &go, 0, 0};
        if (pthread_create(&th[started], NULL, read_job_run, &jobs[started]) != 0)
            break;
    }
    double t0 = now_s(), t1 = t0;
    atomic_store_explicit(&go, 1, memory_order_release);
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].end > t1)
            t1 = jobs[i].end;
    }
    secs = started == threads ? t1 - t0 : -1;
out:
    free(jobs);
    free(th);
    return secs;
}

size_t bench_ceiling_size(unsigned long long step_bytes, int steps, size_t *pass_bytes)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    unsigned long long lim = (unsigned long long)BENCH_CEILING_MAX, mem = 0;
    if (pages > 0 && psz > 0 && (mem = (unsigned long long)pages * (unsigned long long)psz / 4) < lim)
        lim = mem;
    size_t size = (size_t)(step_bytes < BENCH_CEILING_MIN ? BENCH_CEILING_MIN : step_bytes > lim ? lim : step_bytes);
    if (pass_bytes) {
        unsigned long long want = step_bytes * (unsigned long long)(steps < 1 ? 1 : steps);   /* a decode run's */
        want = want < BENCH_PASS_MIN ? BENCH_PASS_MIN : want > BENCH_PASS_MAX ? BENCH_PASS_MAX : want;
        *pass_bytes = (size_t)want;
    }
    return size;
}

BenchCeiling *bench_ceiling_new(size_t bytes, size_t pass_bytes, int threads, int streams)
{
    if (threads <= 0)
        threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads <= 0)
        threads = 1;
    if (streams < 1 || bytes < (size_t)threads * (size_t)streams * 256)
        return NULL;
    BenchCeiling *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->len = bytes / sizeof(v2u64) * sizeof(v2u64);
    c->threads = threads;
    c->streams = streams;
    c->read = read_lines_best();
    size_t sweeps = (pass_bytes + c->len / 2) / c->len;      /* nearest: len is rounded down to 16 bytes */
    c->sweeps = sweeps < 1 ? 1 : sweeps > 1 << 20 ? 1 << 20 : (int)sweeps;
    void *buf = mmap(NULL, c->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        free(c);
        return NULL;
    }
    madvise(buf, c->len, MADV_HUGEPAGE);    /* fewer faults and TLB misses; advisory */
    memset(buf, 1, c->len);
    c->buf = buf;
    read_pass(c, 1);    /* warm-up */
    return c;
}

double bench_ceiling_pass(BenchCeiling *c)
{
    size_t nvec = c->len / sizeof(v2u64);
    size_t per_thread = nvec / (size_t)c->threads / (size_t)c->streams / 16 * 16 * (size_t)c->streams;
    double read = (double)(per_thread * (size_t)c->threads * sizeof(v2u64)) * c->sweeps;
    double s = read_pass(c, c->sweeps);
    return s > 0 ? read / s / 1e9 : -1;
}

int bench_ceiling_threads(const BenchCeiling *c) { return c->threads; }
int bench_ceiling_sweeps(const BenchCeiling *c) { return c->sweeps; }
size_t bench_ceiling_bytes(const BenchCeiling *c) { return c->len; }

void bench_ceiling_free(BenchCeiling *c)
{
    if (!c)
        return;
    munmap(c->buf, c->len);
    free(c);
}

double bench_decode_tok_s(megac_model *m, int context, int ntok, const int *fed, int *toks)
{
    int last = megac_max_seq(m) - 1, ctx = context < 1 ? 1 : context > last ? last : context;
    /* decode starts from BOS; a model that names none (an HF tokenizer.json
     * without a bos_token_id) from its EOS, else from token 0 */
    int start = megac_bos(m) >= 0 ? megac_bos(m) : megac_eos(m) >= 0 ? megac_eos(m) : 0;
    /* the positions before the timed ones are the prompt: SnapKV layers compress at its end */
    if (megac_reset(m) || megac_set_prompt_end(m, ctx - 1) || megac_step(m, start))
        return -1;
    for (int pos = 1; pos < ctx; pos++)
        if (megac_step(m, megac_argmax(m)))
            return -1;
    int n = ntok < last - ctx + 1 ? ntok : last - ctx + 1;
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        int tok = fed ? fed[i] : megac_argmax(m);
        if (fed ? megac_feed(m, tok) : megac_step(m, tok))
            return -1;
        if (toks && !fed)
            toks[i] = tok;
    }
    double t = now_s() - t0;
    return n > 0 && t > 0 ? n / t : -1;
}
