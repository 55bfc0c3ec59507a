/* scratch-q4-interleave.c: a scratch benchmark (not built by CMake, not
 * part of megac) of Q4_0 rows with int8 inputs (Q4_0A8's arithmetic) in
 * three layouts, against a plain read of the same bytes:
 *   read    the bytes alone (64-byte loads, one sequential stream a thread)
 *   b4row   megac's packed rows (kernel_table.h: superblocks of four blocks,
 *           headers first), four rows side by side, as PKA8_ROWS reads them
 *   bfar4   the same rows four at a time, quad j being rows j, q + j,
 *           2q + j and 3q + j of a thread's range (q: a quarter of it):
 *           four long streams where b4row's are a row long (megac's far
 *           quads, kernel_body.c: seg_far_quads)
 *   il16x4  rows interleaved 16 at a time: per block of 32, the 16 rows'
 *           f16 scales (32 bytes), then 4 x 64 bytes whose 32-bit lane r,
 *           word m is row r's nibble bytes 4m..4m+3 (GGUF order), so that
 *           vpdpbusd against x's word m (low nibbles) and m + 4 (high ones),
 *           broadcast, gives each lane its row's sum: one scale conversion
 *           and one FMA per 16 rows and block where b4row takes a
 *           conversion, two multiplies, a permute and two FMAs per row and
 *           4 blocks; four such groups side by side
 * Each checks its y against a double-precision GEMV of the same blocks
 * (normalized squared error printed) and then reports the best of REPS
 * passes in GB/s of weight bytes.
 *   gcc -O2 -march=native -DHINT=_MM_HINT_T1 -o /tmp/il scripts/scratch-q4-interleave.c -lpthread -lm
 *   /tmp/il MB THREADS K REPS     (NPF=0: b4row and bfar4 without software prefetch;
 *                                   PF=N: the prefetch distance, 16384 by default)
 * Needs AVX-512 VNNI and F16C. Findings: docs/performance.md, "On an Intel Xeon ...". */
#ifndef HINT
#define HINT _MM_HINT_T0
#endif
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <math.h>

static int K = 2048, NB, PF = 16384, NPF = 5;
static int64_t R;
static unsigned char *WB, *WC; // layouts
static int8_t *XQ;    // x int8 [K]
static float *DX;     // per block d of x
static float *Y;
static int8_t XQP[128 * 512] __attribute__((aligned(64)));
static float DQ4[2048], DX4[2048];
static int32_t NSX8[2048];
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static uint16_t f2h(float f){ return _cvtss_sh(f, 0); }

// B: per row, superblocks of 4 blocks: 4 f16 d + 64 bytes; element 4n+i = nibble n of word i (lane l = 4b+i)
// Four such rows side by side into out[4]. Prefetches: far, each row its own
// lines PF ahead (NPF != 0); else NPF lines a superblock from the linear
// pointer *pf (up to pfe).
static inline void quad4(const unsigned char *const row[4], float out[4], int far, const char **pf, const char *pfe)
{
    int nsb = NB / 4;
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc[4];
    __m128 off[4];
    for (int i = 0; i < 4; i++) {
        acc[i] = _mm512_setzero_ps();
        off[i] = _mm_setzero_ps();
    }
    for (int sb = 0; sb < nsb; sb++) {
        __m512i xl = _mm512_load_si512(XQP + 128 * sb), xh = _mm512_load_si512(XQP + 128 * sb + 64);
        __m128 dq = _mm_load_ps(DQ4 + 4 * sb), dx = _mm_load_ps(DX4 + 4 * sb);
        for (int c = 0; !far && c < NPF; c++)
            if (*pf < pfe) {
                _mm_prefetch(*pf, HINT);
                *pf += 64;
            }
        for (int i = 0; i < 4; i++) {
            const unsigned char *w = row[i] + 72 * sb;
            if (far && NPF && (sb & 3) == 0)
                for (int c = 0; c < 5; c++)
                    _mm_prefetch((const char *)w + PF + 64 * c, HINT);
            __m512i v = _mm512_loadu_si512(w + 8);
            __m512i lo = _mm512_and_si512(v, m0f), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl);
            p = _mm512_dpbusd_epi32(p, hi, xh);
            __m128 sc = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)w)), sd = _mm_mul_ps(sc, dq);
            __m512 sd16 = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(sd));
            acc[i] = _mm512_fmadd_ps(sd16, _mm512_cvtepi32_ps(p), acc[i]);
            off[i] = _mm_fmadd_ps(sc, dx, off[i]);
        }
    }
    for (int i = 0; i < 4; i++) {
        __m128 o = off[i];
        out[i] = _mm512_reduce_add_ps(acc[i]) - 8.0f * (o[0] + o[1] + o[2] + o[3]);
    }
}

// b4row: rows r..r+3 side by side
static void kern_b(int64_t r0, int64_t r1)
{
    int64_t rb = (int64_t)NB * 18;
    const char *pf = (const char *)WB + r0 * rb + PF, *pfe = (const char *)WB + r1 * rb + PF;
    for (int64_t r = r0; r < r1; r += 4) {
        const unsigned char *row[4] = {WB + r * rb, WB + (r + 1) * rb, WB + (r + 2) * rb, WB + (r + 3) * rb};
        quad4(row, Y + r, 0, &pf, pfe);
    }
}

static void kern_d(int64_t r0, int64_t r1)
{
    int64_t gb = (int64_t)NB * 288;
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const int32_t *x32 = (const int32_t *)XQ;
    int64_t g0 = r0 / 16, g1 = r1 / 16;
    for (int64_t g = g0; g < g1; g += 4) {
        int ng = g1 - g < 4 ? (int)(g1 - g) : 4;
        const unsigned char *w[4]; const char *pf[4];
        __m512 acc[4];
        for (int i = 0; i < 4; i++) { w[i] = WC + (g + (i < ng ? i : 0)) * gb; pf[i] = (const char *)w[i] + PF / 4; acc[i] = _mm512_setzero_ps(); }
        for (int b = 0; b < NB; b++) {
            __m512 t0 = _mm512_set1_ps(DX[b]);
            for (int i = 0; i < 4; i++) {
                const unsigned char *wb = w[i] + 288 * b;
                while (pf[i] < (const char *)wb + 288 + PF / 4) { _mm_prefetch(pf[i], _MM_HINT_T0); pf[i] += 64; }
                __m512i pa = _mm512_set1_epi32(NSX8[b]), pb = _mm512_setzero_si512();
                for (int m = 0; m < 4; m++) {
                    __m512i v = _mm512_load_si512(wb + 32 + 64 * m);
                    __m512i lo = _mm512_and_si512(v, m0f), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
                    pa = _mm512_dpbusd_epi32(pa, lo, _mm512_set1_epi32(x32[8 * b + m]));
                    pb = _mm512_dpbusd_epi32(pb, hi, _mm512_set1_epi32(x32[8 * b + m + 4]));
                }
                __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)wb));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(pa, pb)), _mm512_mul_ps(d, t0), acc[i]);
            }
        }
        for (int i = 0; i < ng; i++) _mm512_storeu_ps(Y + 16 * (g + i), acc[i]);
    }
}

// bfar4: quad j is rows r0 + j + i q (q a quarter of the range)
static void kern_b1(int64_t r0, int64_t r1)
{
    int64_t rb = (int64_t)NB * 18, q = (r1 - r0) / 4; /* r1 - r0 a multiple of 4 here */
    for (int64_t j = 0; j < q; j++) {
        const unsigned char *row[4];
        float out[4];
        for (int i = 0; i < 4; i++)
            row[i] = WB + (r0 + i * q + j) * rb;
        quad4(row, out, 1, NULL, NULL);
        for (int i = 0; i < 4; i++)
            Y[r0 + i * q + j] = out[i];
    }
}

static void kern_read(int64_t r0, int64_t r1)
{
    int64_t rb = (int64_t)NB * 18;
    const char *p = (const char *)WB + r0 * rb, *e = (const char *)WB + r1 * rb;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (; p + 256 <= e; p += 256) {
        _mm_prefetch(p + PF, _MM_HINT_T0); _mm_prefetch(p + PF + 64, _MM_HINT_T0);
        _mm_prefetch(p + PF + 128, _MM_HINT_T0); _mm_prefetch(p + PF + 192, _MM_HINT_T0);
        a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(p)); a1 = _mm512_add_epi32(a1, _mm512_loadu_si512(p + 64));
        a2 = _mm512_add_epi32(a2, _mm512_loadu_si512(p + 128)); a3 = _mm512_add_epi32(a3, _mm512_loadu_si512(p + 192));
    }
    Y[r0] = (float)_mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
}

static int NT = 1, REPS = 5, WHICH;
static pthread_barrier_t bar;
static double BEST[4];
static volatile int QUIT;
static void *th(void *a)
{
    int64_t t = (intptr_t)a, per = R / NT / 64 * 64;
    int64_t r0 = t * per, r1 = t == NT - 1 ? R : r0 + per;
    for (;;) {
        pthread_barrier_wait(&bar);
        if (QUIT) return 0;
        int wh = WHICH; double t0 = now();
        if (wh == 0) kern_read(r0, r1); else if (wh == 1) kern_b(r0, r1); else if (wh == 2) kern_b1(r0, r1); else kern_d(r0, r1);
        pthread_barrier_wait(&bar);
        if (t == 0) { double dt = now() - t0; if (BEST[wh] == 0 || dt < BEST[wh]) BEST[wh] = dt; }
    }
}
int main(int argc, char **argv)
{
    double mb = argc > 1 ? atof(argv[1]) : 64; NT = argc > 2 ? atoi(argv[2]) : 1;
    K = argc > 3 ? atoi(argv[3]) : 2048; REPS = argc > 4 ? atoi(argv[4]) : 5;
    if (getenv("PF"))
        PF = atoi(getenv("PF"));
    if (getenv("NPF"))
        NPF = atoi(getenv("NPF"));
    NB = K / 32;
    R = (int64_t)(mb * 1e6 / (NB * 18)) / 16 * 16;
    size_t sz = (size_t)R * NB * 18;
    WB = mmap(0, sz + (1 << 21), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); if (!getenv("NOHUGE")) madvise(WB, sz + (1<<21), MADV_HUGEPAGE);
    WC = mmap(0, sz + (1 << 21), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); if (!getenv("NOHUGE")) madvise(WC, sz + (1<<21), MADV_HUGEPAGE);
    XQ = aligned_alloc(64, K); DX = malloc(4 * NB); Y = aligned_alloc(64, 4 * R + 64);
    float *yref = malloc(8 * R);
    srand(1);
    for (int i = 0; i < K; i++) XQ[i] = (int8_t)(rand() % 255 - 127);
    for (int b = 0; b < NB; b++) DX[b] = 0.01f + (rand() % 100) * 1e-4f;
    // native Q4_0 rows
    unsigned char *nat = malloc(sz);
    for (size_t i = 0; i < sz; i++) nat[i] = rand();
    for (int64_t r = 0; r < R; r++) for (int b = 0; b < NB; b++) { uint16_t h = f2h(0.001f * (1 + rand() % 50)); memcpy(nat + (r * NB + b) * 18, &h, 2); }
    // reference (double)
    for (int64_t r = 0; r < R; r++) {
        double s = 0;
        for (int b = 0; b < NB; b++) {
            const unsigned char *q = nat + (r * NB + b) * 18;
            float d = _cvtsh_ss(*(uint16_t *)q);
            double bs = 0;
            for (int j = 0; j < 16; j++)
                bs += ((q[2 + j] & 15) - 8) * XQ[32 * b + j] + ((q[2 + j] >> 4) - 8) * XQ[32 * b + j + 16];
            s += bs * d * DX[b];
        }
        yref[r] = s;
    }
    // layout B
    for (int64_t r = 0; r < R; r++) for (int sb = 0; sb < NB / 4; sb++) {
        unsigned char *o = WB + r * NB * 18 + 72 * sb; uint32_t words[16] = {0};
        for (int bi = 0; bi < 4; bi++) { const unsigned char *q = nat + (r * NB + 4 * sb + bi) * 18; memcpy(o + 2 * bi, q, 2);
            for (int e = 0; e < 32; e++) { int qv = e < 16 ? q[2 + e] & 15 : q[2 + e - 16] >> 4; int n = e / 4, i = e % 4; words[4 * bi + i] |= (uint32_t)qv << (4 * n); } }
        memcpy(o + 8, words, 64);
    }
    // x for B: xqp 128 B per sb: byte 4l+m of half h = element 32b + 8m + 4h + i of block b=l/4, i=l%4
    for (int sb = 0; sb < NB / 4; sb++) for (int l = 0; l < 16; l++) for (int m = 0; m < 4; m++) for (int h = 0; h < 2; h++) {
        int b = 4 * sb + l / 4, i = l % 4; XQP[128 * sb + 64 * h + 4 * l + m] = XQ[32 * b + 8 * m + 4 * h + i]; }
    // nibble n of word i = element 4n+i; lo half nibbles n even (n=2m) -> element 8m+i ; hi n=2m+1 -> 8m+4+i. ok
    for (int b = 0; b < NB; b++) { int s = 0; for (int j = 0; j < 32; j++) s += XQ[32*b+j]; DQ4[b] = DX[b]; DX4[b] = DX[b] * s; NSX8[b] = -8 * s; }
    // layout C
    for (int64_t g = 0; g < R / 16; g++) for (int b = 0; b < NB; b++) {
        unsigned char *o = WC + (g * NB + b) * 288;
        for (int r = 0; r < 16; r++) { const unsigned char *q = nat + ((16 * g + r) * NB + b) * 18; memcpy(o + 2 * r, q, 2);
            for (int m = 0; m < 4; m++) memcpy(o + 32 + 64 * m + 4 * r, q + 2 + 4 * m, 4); }
    }
    free(nat);
    pthread_barrier_init(&bar, 0, NT + 1);
    const char *nm[4] = {"read", "b4row", "bfar4", "il16x4"};
    pthread_t tt[8];
    for (int t = 0; t < NT; t++) pthread_create(&tt[t], 0, th, (void *)(intptr_t)t);
    for (WHICH = 1; WHICH <= 3; WHICH++) { pthread_barrier_wait(&bar); pthread_barrier_wait(&bar);
        double e = 0, n = 0; for (int64_t r = 0; r < R; r++) { e += (Y[r] - yref[r]) * (Y[r] - yref[r]); n += yref[r] * yref[r]; } printf("%s nse %.3g\n", nm[WHICH], e / n); }
    for (int rep = 0; rep < REPS; rep++)
        for (WHICH = 0; WHICH <= 3; WHICH++) { pthread_barrier_wait(&bar); pthread_barrier_wait(&bar); }
    for (WHICH = 0; WHICH <= 3; WHICH++) printf("%-6s %6.1f MB %d thr k %d: best %6.2f GB/s\n", nm[WHICH], sz / 1e6, NT, K, sz / BEST[WHICH] / 1e9);
    QUIT = 1; pthread_barrier_wait(&bar);
    return 0;
}
