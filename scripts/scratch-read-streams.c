/* scratch-read-streams.c: a scratch benchmark (not built by CMake, not part
 * of megac) of how fast two threads read a buffer as one or several
 * sequential streams each: every thread takes half of MB megabytes, cuts
 * it into STREAMS equal parts and reads 256 bytes of each part in turn
 * (32-byte loads), with a software prefetch DIST bytes ahead when PF is 1.
 * The buffer is read as many times as make about 2 GB a pass; the best of
 * 5 passes is printed in GB/s. `megac bench`'s ceiling reads four streams
 * a thread; the 256-bit GEMV rows read one (or four, as far quads:
 * kernel_body.c, seg_far_quads and KT_TUNE_FAR_SEQ).
 *   gcc -O2 -mavx2 -o /tmp/rd scripts/scratch-read-streams.c -lpthread
 *   /tmp/rd MB STREAMS PF DIST        e.g. /tmp/rd 96 1 0 0; /tmp/rd 96 4 0 0
 * Needs AVX2. Findings: docs/performance.md, "Far quads for the 256-bit
 * rows on AMD Zen 3". */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const char *base;
    size_t bytes;
    int streams, pf, sweeps;
    size_t dist;
    uint64_t sink;
} Job;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *reader(void *arg)
{
    Job *j = arg;
    size_t per = j->bytes / (size_t)j->streams / 256 * 256;
    __m256i acc = _mm256_setzero_si256();
    for (int sw = 0; sw < j->sweeps; sw++)
        for (size_t i = 0; i < per; i += 256)
            for (int s = 0; s < j->streams; s++) {
                const char *q = j->base + (size_t)s * per + i;
                if (j->pf && i + j->dist < per)
                    for (int l = 0; l < 256; l += 64)
                        _mm_prefetch(q + j->dist + l, _MM_HINT_T1);
                for (int l = 0; l < 256; l += 32)
                    acc = _mm256_xor_si256(acc, _mm256_load_si256((const __m256i *)(q + l)));
            }
    j->sink = (uint64_t)_mm256_extract_epi64(acc, 0);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s MB STREAMS PF DIST\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)(atof(argv[1]) * 1e6) / 4096 * 4096;
    int streams = atoi(argv[2]), pf = atoi(argv[3]);
    size_t dist = (size_t)atol(argv[4]);
    if (n < 1 << 20 || streams < 1 || streams > 64) {
        fprintf(stderr, "%s: want MB >= 1 and 1 <= STREAMS <= 64\n", argv[0]);
        return 2;
    }
    char *buf = aligned_alloc(4096, n);
    if (!buf) {
        perror("aligned_alloc");
        return 1;
    }
    memset(buf, 1, n);
    int sweeps = (int)(2e9 / (double)n) + 1;
    double best = 0;
    uint64_t sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        pthread_t t[2];
        Job j[2];
        double t0 = now_s();
        for (int i = 0; i < 2; i++) {
            j[i] = (Job){buf + (size_t)i * (n / 2), n / 2, streams, pf, sweeps, dist, 0};
            pthread_create(&t[i], NULL, reader, &j[i]);
        }
        for (int i = 0; i < 2; i++) {
            pthread_join(t[i], NULL);
            sink ^= j[i].sink;
        }
        double gbs = (double)n * sweeps / (now_s() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    printf("%.0f MB, %d stream(s) a thread, prefetch %s: %.1f GB/s (sink %llu)\n", (double)n / 1e6, streams,
           pf ? argv[4] : "off", best, (unsigned long long)(sink & 1));
    free(buf);
    return 0;
}
