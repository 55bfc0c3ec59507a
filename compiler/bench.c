/*
 * bench.c - the two measurements of `megac bench`.
 *
 * Decode rate: steps of the compiled kernel through the public runtime API,
 * timed over `ntok` tokens after a BOS step, each step fed the kernel's own
 * argmax (what greedy generation does, minus detokenization).
 *
 * Read ceiling: the read bandwidth plain code reaches on this machine right
 * now. A buffer several times the last-level cache is touched first (so
 * page faults are not timed), then in each pass every CPU runs one thread
 * over its own slice, reading `streams` sequential streams interleaved one
 * cache line at a time (what hardware prefetchers like, and what a GEMV over
 * several rows looks like); a pass is timed from a common start to the last
 * thread's finish. The caller interleaves passes with decode runs, so both
 * see the same machine (other load, frequency).
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

typedef struct ReadJob {
    const v2u64 *base;          /* this thread's slice */
    size_t nvec;                /* 16-byte vectors in the slice */
    int streams;
    atomic_int *go;             /* set once every thread exists */
    uint64_t sink;              /* keeps the loads alive */
    double end;                 /* finish time of the pass */
} ReadJob;

/* Reads the slice as `streams` sequential streams, one 64-byte line of each
 * in turn. */
static void *read_job_run(void *p)
{
    ReadJob *j = p;
    size_t per = j->nvec / (size_t)j->streams / 4 * 4;
    v2u64 acc0 = {0, 0}, acc1 = {0, 0};
    while (!atomic_load_explicit(j->go, memory_order_acquire))
        ;
    for (size_t i = 0; i < per; i += 4) {
        for (int s = 0; s < j->streams; s++) {
            const v2u64 *q = j->base + (size_t)s * per + i;
            acc0 ^= q[0] ^ q[1];
            acc1 ^= q[2] ^ q[3];
        }
    }
    j->end = now_s();
    v2u64 acc = acc0 ^ acc1;
    j->sink = acc[0] ^ acc[1];
    return NULL;
}

/* One timed pass over the whole buffer; seconds, or negative on failure. */
static double read_pass(const v2u64 *buf, size_t nvec, int threads, int streams)
{
    ReadJob *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    atomic_int go = 0;
    double secs = -1;
    if (!jobs || !th)
        goto out;
    size_t slice = nvec / (size_t)threads;
    int started = 0;
    for (; started < threads; started++) {
        jobs[started] = (ReadJob){buf + (size_t)started * slice, slice, streams, &go, 0, 0};
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

static size_t ceiling_buffer_bytes(void)
{
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    size_t want = llc > 0 ? (size_t)llc * 4 : (size_t)256 << 20;
    if (want < ((size_t)256 << 20))
        want = (size_t)256 << 20;
    if (want > ((size_t)2 << 30))
        want = (size_t)2 << 30;
    if (pages > 0 && psz > 0 && want > (size_t)pages * (size_t)psz / 4)
        want = (size_t)pages * (size_t)psz / 4;
    return want;
}

struct BenchCeiling {
    v2u64 *buf;
    size_t len;                 /* bytes mapped */
    int threads, streams;
};

BenchCeiling *bench_ceiling_new(size_t bytes, int threads, int streams)
{
    if (threads <= 0)
        threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads <= 0)
        threads = 1;
    if (bytes == 0)
        bytes = ceiling_buffer_bytes();
    if (streams < 1 || bytes < (size_t)threads * (size_t)streams * 64)
        return NULL;
    BenchCeiling *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->len = bytes / sizeof(v2u64) * sizeof(v2u64);
    c->threads = threads;
    c->streams = streams;
    void *buf = mmap(NULL, c->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        free(c);
        return NULL;
    }
    madvise(buf, c->len, MADV_HUGEPAGE);    /* fewer faults and TLB misses; advisory */
    memset(buf, 1, c->len);
    c->buf = buf;
    read_pass(c->buf, c->len / sizeof(v2u64), threads, streams);     /* warm-up */
    return c;
}

double bench_ceiling_pass(BenchCeiling *c)
{
    size_t nvec = c->len / sizeof(v2u64);
    size_t per_thread = nvec / (size_t)c->threads / (size_t)c->streams / 4 * 4 * (size_t)c->streams;
    double read = (double)(per_thread * (size_t)c->threads * sizeof(v2u64));
    double s = read_pass(c->buf, nvec, c->threads, c->streams);
    return s > 0 ? read / s / 1e9 : -1;
}

int bench_ceiling_threads(const BenchCeiling *c) { return c->threads; }
size_t bench_ceiling_bytes(const BenchCeiling *c) { return c->len; }

void bench_ceiling_free(BenchCeiling *c)
{
    if (!c)
        return;
    munmap(c->buf, c->len);
    free(c);
}

double bench_decode_tok_s(megac_model *m, int context, int ntok)
{
    int last = megac_max_seq(m) - 1, ctx = context < 1 ? 1 : context > last ? last : context;
    /* the positions before the timed ones are the prompt: SnapKV layers compress at its end */
    if (megac_reset(m) || megac_set_prompt_end(m, ctx - 1) || megac_step(m, megac_bos(m)))
        return -1;
    for (int pos = 1; pos < ctx; pos++)
        if (megac_step(m, megac_argmax(m)))
            return -1;
    int n = ntok < last - ctx + 1 ? ntok : last - ctx + 1;
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        if (megac_step(m, megac_argmax(m)))
            return -1;
    double t = now_s() - t0;
    return n > 0 && t > 0 ? n / t : -1;
}
