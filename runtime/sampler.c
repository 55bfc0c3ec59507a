/*
 * sampler.c - megac_sample: picks the next token from a row of logits.
 *
 *   temperature == 0      greedy: the argmax, lowest index on ties
 *   temperature > 0       p = softmax(logits / temperature), then
 *     top_k > 0           keep the k most probable tokens
 *     top_p < 1           keep the smallest prefix (most probable first) whose
 *                         mass reaches top_p (nucleus)
 *                         and draw from what is kept, renormalized.
 * Candidates are ranked by logit, then by index: the same order as by
 * probability for any temperature, but free of the ties that rounding makes
 * at huge temperatures (every p = 1/n), so top_k = 1 or a tiny top_p give
 * the greedy token.
 *
 * Only the candidates that can be kept are ranked: top-k picks its k with a
 * heap (n log k), and top-p alone takes its nucleus, best first, out of a
 * heap of the tokens whose p is at least (1 - top_p) / (n - 1): the others,
 * n - 1 at most, hold less than 1 - top_p of the mass together, so the
 * nucleus ends among the first (should rounding leave it short, every
 * token is ranked). Sorting all of
 * SmolLM2's 49,152 candidates took ~9 ms a token, 4x a decode step:
 * `megac run` with its default sampling (temperature 1, top-p 0.9) made
 * 85 tok/s where greedy made 355.
 *
 * Refused (-MEGAC_ERR_ARG, the message in megac_error(NULL)): n < 1, a NULL
 * pointer, a NaN, infinite or negative temperature, a NaN or negative top_p,
 * and logits holding NaN or +Inf or only -Inf (a diverging model): such rows
 * have no meaningful draw, and the old arithmetic quietly gave the last id.
 *
 * Random numbers: xorshift64* (Marsaglia's xorshift, multiplied by
 * 0x2545F4914F6CDD1D; Vigna 2016) on the caller's 64-bit state. A state of 0
 * means "not started": it is seeded from s->seed through splitmix64, so any
 * seed (0 included) gives a non-zero state, and the same seed always gives
 * the same sequence of draws. A uniform double in [0, 1) is the top 53 bits.
 *
 * Runtime code: no compiler headers; never exits.
 */
#include "runtime/backend.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double p;
    float logit;
    int id;
} SampleCand;

static uint64_t sample_splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t sample_xorshift64s(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* A uniform double in [0, 1), starting the state from the seed if needed. */
static double sample_uniform(uint64_t *state, uint64_t seed)
{
    if (*state == 0) {
        *state = sample_splitmix64(seed);
        if (*state == 0)
            *state = 0x9E3779B97F4A7C15ull;
    }
    return (double)(sample_xorshift64s(state) >> 11) * (1.0 / 9007199254740992.0);
}

/* The first index of the largest logit (no NaN: rt_logits_bad passed):
 * the maximum over eight running lanes, then the first index holding it,
 * where a scan compared and branched per element (with rt_logits_bad's
 * single pass, a greedy pick at 49,152 logits went from 112 to 20 us). */
static int sample_argmax(const float *logits, int n)
{
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            m[j] = logits[i + j] > m[j] ? logits[i + j] : m[j];
    for (; i < n; i++)
        m[0] = logits[i] > m[0] ? logits[i] : m[0];
    float mx = m[0];
    for (int j = 1; j < 8; j++)
        mx = m[j] > mx ? m[j] : mx;
    for (i = 0; i < n; i++)
        if (logits[i] == mx)
            return i;
    return 0;   /* every logit -inf */
}

/* Highest logit first; equal logits by lower index. */
static int sample_cand_cmp(const void *a, const void *b)
{
    const SampleCand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* e^x for x <= 0 in plain arithmetic, eight at a time, where libm's exp
 * is a call per element (~3.8 ns: 186 us of SmolLM2's 49,152 weights, 7%
 * of a decode step). x = k ln 2 + f with k = round(x / ln 2) (the
 * 1.5 * 2^52 shift rounds; ln 2 in two parts, the first with trailing
 * zeros so that k times it is exact), |f| <= ln2 / 2, e^f by its Taylor
 * series to f^12 (the next term is under 2e-16 of it), times 2^k built in
 * the exponent bits; 0 below -708 (and for -inf). Within 3.2e-16 of exp
 * (relative) over [-708, 0]; exp(0) is exactly 1. */
typedef double v8d __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef int64_t v8i __attribute__((vector_size(64)));
typedef uint64_t v8u __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) void sample_exp8(v8d *xe)  /* in place: no vector in the ABI */
{
    v8d x = *xe;
    v8d t = x * 0x1.71547652b82fep0 + 0x1.8p52, k = t - 0x1.8p52;
    v8d f = x - k * 0x1.62e42fee00000p-1;
    f = f - k * 0x1.a39ef35793c76p-33;
    v8d p = f * (1.0 / 479001600) + 1.0 / 39916800;
    p = p * f + 1.0 / 3628800;
    p = p * f + 1.0 / 362880;
    p = p * f + 1.0 / 40320;
    p = p * f + 1.0 / 5040;
    p = p * f + 1.0 / 720;
    p = p * f + 1.0 / 120;
    p = p * f + 1.0 / 24;
    p = p * f + 1.0 / 6;
    p = p * f + 0.5;
    p = p * f + 1.0;
    p = p * f + 1.0;
    v8u scale = ((v8u)t + 1023) << 52;  /* t's low bits hold k */
    v8i keep = x >= -708.0;             /* all ones where x is in range */
    *xe = (v8d)((v8u)(p * (v8d)scale) & (v8u)keep);
}

/* p[i] = exp((logit - max) / temp) over all n tokens (softmax without its
 * division: every use below compares or scales by sums of these); returns
 * their sum (eight running sums, then added). The tail runs as a padded
 * group of eight, so every element takes the same arithmetic. */
static inline __attribute__((always_inline)) double sample_weights_body(const float *logits, int n, double mx,
                                                                          double temp, double *p)
{
    v8d sum = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f l;
        memcpy(&l, logits + i, sizeof l);
        v8d e = (__builtin_convertvector(l, v8d) - mx) / temp;
        sample_exp8(&e);
        sum += e;
        memcpy(p + i, &e, sizeof e);
    }
    if (i < n) {
        v8f l = {0};
        for (int j = 0; i + j < n; j++)
            l[j] = logits[i + j];
        v8d e = (__builtin_convertvector(l, v8d) - mx) / temp;
        sample_exp8(&e);
        for (int j = 0; j < 8; j++) {
            if (i + j < n)
                p[i + j] = e[j];
            else
                e[j] = 0;
        }
        sum += e;
    }
    double s = 0;
    for (int j = 0; j < 8; j++)
        s += sum[j];
    return s;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f"))) static double sample_weights_avx512(const float *logits, int n, double mx,
                                                                        double temp, double *p)
{
    return sample_weights_body(logits, n, mx, temp, p);
}
#endif

double rt_sample_weights(const float *logits, int n, double temp, double *p)
{
    double mx = logits[sample_argmax(logits, n)];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return sample_weights_avx512(logits, n, mx, temp, p);
#endif
    return sample_weights_body(logits, n, mx, temp, p);
}

/* c[0:n] = every token, in id order, with its weight. */
static void sample_fill(const float *logits, const double *p, int n, SampleCand *c)
{
    for (int i = 0; i < n; i++)
        c[i] = (SampleCand){p[i], logits[i], i};
}

/* How many of the first n sorted candidates the nucleus keeps: the
 * smallest prefix whose weight reaches top_p * total (total: the weight it
 * is a share of; top-p applies after top-k). 0 when the n do not reach it. */
static int sample_nucleus(const SampleCand *c, int n, double top_p, double total)
{
    double cum = 0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (cum >= top_p * total)
            return i + 1;
    }
    return 0;
}

/* Sifts h[i] down in a heap of n whose root ranks last among them
 * (last = 1: the k best kept so far, the worst on top) or first (last =
 * 0), in sample_cand_cmp's order. */
static void sample_sift(SampleCand *h, int n, int i, int last)
{
    int dir = last ? 1 : -1;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && dir * sample_cand_cmp(&h[l], &h[w]) > 0)
            w = l;
        if (r < n && dir * sample_cand_cmp(&h[r], &h[w]) > 0)
            w = r;
        if (w == i)
            return;
        SampleCand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Moves the k best-ranked of c[0:n] to c[0:k], sorted (0 < k < n). */
static void sample_top_k(SampleCand *c, int n, int k)
{
    for (int i = k / 2 - 1; i >= 0; i--)
        sample_sift(c, k, i, 1);
    for (int i = k; i < n; i++)
        if (sample_cand_cmp(&c[0], &c[i]) > 0) {   /* c[i] beats the worst kept */
            SampleCand t = c[0];
            c[0] = c[i];
            c[i] = t;
            sample_sift(c, k, 0, 1);
        }
    qsort(c, (size_t)k, sizeof *c, sample_cand_cmp);
}

/* A weight below which the tokens hold less than `budget` of the mass
 * together (so that the nucleus, which leaves out less than 1 - top_p of
 * it, ends among those at or above it): the weights' mass by binary
 * exponent (four histograms, so that adds to one bucket do not wait on
 * each other), summed from the lightest exponent up, and the least power of
 * two of the last exponent whose lighter ones stay under the budget (a
 * little under: the nucleus sums in another order). 0 when none does. */
#define SAMPLE_HIST (4 * 1024)
static double sample_mass_cut(const double *p, int n, double budget, double (*hist)[1024])
{
    memset(hist, 0, sizeof(double) * SAMPLE_HIST);
    for (int i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, &p[i], sizeof u);
        hist[i & 3][(u >> 52) & 1023] += p[i];    /* p <= 1: the exponent field is at most 1023 */
    }
    double cum = 0;
    for (int e = 0; e < 1024; e++) {
        cum += (hist[0][e] + hist[1][e]) + (hist[2][e] + hist[3][e]);
        if (cum >= budget * (1.0 - 1e-9))
            return e > 0 ? ldexp(1.0, e - 1023) : 0.0;
    }
    return 1.0;
}

/* c[0:m] = the tokens whose weight is at least cut, in id order; returns m. */
static int sample_at_least(const float *logits, const double *p, int n, double cut, SampleCand *c)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        if (p[i] >= cut)
            c[m++] = (SampleCand){p[i], logits[i], i};
    return m;
}

/* The nucleus of c[0:m] (the smallest prefix, in rank order, whose weight
 * reaches top_p * total), moved to c[0:k] in rank order (what c holds past
 * k is then undefined); returns k, or 0 when all m do not reach it (c[0:m]
 * is then still a permutation of what it was). Takes the best out of a
 * heap one at a time, so only the nucleus is ordered (the popped ones
 * collect at the end). */
static int sample_nucleus_heap(SampleCand *c, int m, double top_p, double total)
{
    for (int i = m / 2 - 1; i >= 0; i--)
        sample_sift(c, m, i, 0);
    double cum = 0;
    for (int k = 1; k <= m; k++) {
        SampleCand best = c[0];
        c[0] = c[m - k];
        c[m - k] = best;
        sample_sift(c, m - k, 0, 0);
        cum += best.p;
        if (cum >= top_p * total) { /* c[m - 1 - i] is the i-th best: to c[i] (the rest is not kept) */
            for (int i = 0, j = k - 1; i < j; i++, j--) {
                SampleCand t = c[m - k + i];
                c[m - k + i] = c[m - k + j];
                c[m - k + j] = t;
            }
            memmove(c, c + (m - k), sizeof *c * (size_t)k);
            return k;
        }
    }
    return 0;
}

/* Draws one of the first n candidates in proportion to p. */
static int sample_draw(const SampleCand *c, int n, double u)
{
    double total = 0;
    for (int i = 0; i < n; i++)
        total += c[i].p;
    double r = u * total, cum = 0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum)
            return c[i].id;
    }
    return c[n - 1].id;
}

const char *rt_sampler_error(const megac_sampler *s)
{
    if (!s)
        return "no sampler given";
    if (!(s->temperature >= 0.0f) || isinf(s->temperature))
        return "the temperature must be 0 (greedy) or a finite positive number";
    if (!(s->top_p >= 0.0f))
        return "top_p must be a number >= 0 (1 or more: off)";
    if (s->top_k < 0)
        return "top_k must be 0 (off) or more";
    return NULL;
}

typedef uint32_t rt_v4u __attribute__((vector_size(16)));
typedef int32_t rt_v4i __attribute__((vector_size(16)));

/* Whether any of the n floats is not finite (NaN, +Inf, -Inf): sixteen at
 * a time in vectors (every step's logits pass here: the plain loop was
 * not vectorized at -O2, 51 us a step for SmolLM2's 49152 logits, 2% of a
 * step; this one 8 us). */
static bool any_nonfinite(const float *x, int n)
{
    const rt_v4u e = {0x7f800000u, 0x7f800000u, 0x7f800000u, 0x7f800000u};
    rt_v4i any = {0, 0, 0, 0};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        rt_v4u v[4];
        memcpy(v, x + i, sizeof v);
        any |= ((v[0] & e) == e) | ((v[1] & e) == e) | ((v[2] & e) == e) | ((v[3] & e) == e);
    }
    uint32_t tail = 0;
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        tail |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return tail || any[0] || any[1] || any[2] || any[3];
}

int rt_logits_bad(const float *logits, int n)
{
    if (!any_nonfinite(logits, n))
        return -1; /* the common case: all finite */
    /* one pass over the bits (NaN or +Inf anywhere; any logit but -Inf),
     * then the first bad one's index */
    uint32_t bad = 0, finite = 0;
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, logits + i, sizeof u);
        bad |= ((u & 0x7fffffffu) > 0x7f800000u) | (u == 0x7f800000u);
        finite |= u != 0xff800000u;
    }
    for (int i = 0; bad && i < n; i++)
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return i;
    return finite ? -1 : 0;
}

/* This thread's candidate and weight arrays (and histograms), grown to n and kept between
 * calls (a fresh 768 KiB for SmolLM2's vocabulary each token was an mmap,
 * ~200 page faults and an munmap); freed when the thread exits. NULL when
 * there is no memory. */
typedef struct {
    int cap;
    double *p;              /* cap weights, after the candidates */
    double (*hist)[1024];   /* sample_mass_cut's histograms, after the weights */
    SampleCand c[];
} SampleScratch;

static pthread_key_t sample_key;
static pthread_once_t sample_key_once = PTHREAD_ONCE_INIT;
static bool sample_key_ok;

static void sample_key_make(void)
{
    sample_key_ok = pthread_key_create(&sample_key, free) == 0;
}

static SampleScratch *sample_scratch(int n)
{
    pthread_once(&sample_key_once, sample_key_make);
    if (!sample_key_ok)
        return NULL;
    SampleScratch *s = pthread_getspecific(sample_key);
    if (!s || s->cap < n) {
        SampleScratch *g = malloc(sizeof *g + (sizeof g->c[0] + sizeof *g->p) * (size_t)n + sizeof(double) * SAMPLE_HIST);
        if (!g || pthread_setspecific(sample_key, g) != 0) {
            free(g);
            return NULL;
        }
        g->cap = n;
        g->p = (double *)(void *)(g->c + n);
        g->hist = (double (*)[1024])(void *)(g->p + n);
        free(s);
        s = g;
    }
    return s;
}

int megac_sample(const float *logits, int n, const megac_sampler *s, uint64_t *rng_state)
{
    rt_loose_clear();
    const char *e = rt_sampler_error(s);
    if (e)
        return -(int)rt_loose_fail(MEGAC_ERR_ARG, "megac_sample: %s", e);
    if (!logits || !rng_state || n < 1)
        return -(int)rt_loose_fail(MEGAC_ERR_ARG, "megac_sample: %s",
                                   n < 1 ? "n must be at least 1" : !logits ? "no logits given" : "no rng state given");
    int bad = rt_logits_bad(logits, n);
    if (bad >= 0)
        return -(int)rt_loose_fail(MEGAC_ERR_ARG, "megac_sample: logit %d is %g: the logits are not usable", bad,
                                   (double)logits[bad]);
    return rt_sample_checked(logits, n, s, rng_state);
}

int rt_sample_checked(const float *logits, int n, const megac_sampler *s, uint64_t *rng_state)
{
    if (s->temperature == 0.0f)
        return sample_argmax(logits, n);
    SampleScratch *sc = sample_scratch(n);
    if (!sc)
        return -(int)rt_loose_fail(MEGAC_ERR_NOMEM, "megac_sample: no memory for %d candidates", n);
    SampleCand *c = sc->c;
    double total = rt_sample_weights(logits, n, s->temperature, sc->p);
    int keep = n;
    if (s->top_k > 0 && s->top_k < n) {
        sample_fill(logits, sc->p, n, c);
        sample_top_k(c, n, s->top_k);
        keep = s->top_k;
        total = 0;
        for (int i = 0; i < keep; i++)
            total += c[i].p;
    } else if (s->top_p < 1.0f && n > 1) {
        /* the best token's weight is 1 (exp(0)): it always passes */
        double cut = fmax((1.0 - s->top_p) / (n - 1) * total,
                          sample_mass_cut(sc->p, n, (1.0 - s->top_p) * total, sc->hist));
        int m = sample_at_least(logits, sc->p, n, fmin(cut, 1.0), c);
        keep = sample_nucleus_heap(c, m, s->top_p, total);
        if (!keep) { /* rounding left it short: rank them all */
            sample_fill(logits, sc->p, n, c);
            qsort(c, (size_t)n, sizeof *c, sample_cand_cmp);
            keep = n;
        }
    } else {
        sample_fill(logits, sc->p, n, c);
        if (s->top_k > 0)
            qsort(c, (size_t)n, sizeof *c, sample_cand_cmp);
    }
    if (s->top_p < 1.0f) {
        int nk = sample_nucleus(c, keep, s->top_p, total);
        keep = nk ? nk : keep;
    }
    double u = sample_uniform(rng_state, s->seed);
    return sample_draw(c, keep, u);
}
