/*
 * test_sampler.c - megac_sample: greedy, temperature, top-k, top-p and the
 * seeded RNG. Distribution checks draw many times with a fixed seed, so
 * they are deterministic; the tolerance is about 6 standard deviations.
 */
#include "runtime/backend.h"
#include "runtime/megac.h"

#include <criterion/criterion.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Counts the draws of each of 3 tokens over n samples. */
static void sample_counts(const float *logits, const megac_sampler *s, int n, int counts[3])
{
    uint64_t rng = 0;
    counts[0] = counts[1] = counts[2] = 0;
    for (int i = 0; i < n; i++) {
        int t = megac_sample(logits, 3, s, &rng);
        cr_assert(t >= 0 && t < 3);
        counts[t]++;
    }
}

static void assert_share(int count, int n, double p)
{
    double sd = sqrt(n * p * (1 - p));
    cr_assert(fabs(count - n * p) <= 6 * sd + 1, "count %d of %d, expected p = %g", count, n, p);
}

Test(sampler, greedy_is_argmax_lowest_on_ties)
{
    float lg[5] = {1, 3, -2, 3, 2.5f};
    megac_sampler s = {.temperature = 0, .top_p = 1, .seed = 7};
    uint64_t rng = 0;
    cr_assert_eq(megac_sample(lg, 5, &s, &rng), 1);
    float neg[3] = {-5, -1, -3};
    cr_assert_eq(megac_sample(neg, 3, &s, &rng), 1);
    cr_assert_eq(rng, 0, "greedy draws no random number");
}

Test(sampler, top_k_one_and_tiny_top_p_are_greedy)
{
    float lg[6] = {0.1f, 2, 1.9f, 2, -1, 0};
    uint64_t rng = 0;
    megac_sampler k1 = {.temperature = 1.5f, .top_k = 1, .top_p = 1, .seed = 3};
    megac_sampler p0 = {.temperature = 1.5f, .top_k = 0, .top_p = 1e-6f, .seed = 3};
    for (int i = 0; i < 200; i++) {
        cr_assert_eq(megac_sample(lg, 6, &k1, &rng), 1);
        cr_assert_eq(megac_sample(lg, 6, &p0, &rng), 1);
    }
}

/* logits (0, ln 2, ln 3): p = (1, 2, 3) / 6 at temperature 1. */
Test(sampler, softmax_distribution)
{
    float lg[3] = {0, logf(2), logf(3)};
    megac_sampler s = {.temperature = 1, .top_p = 1, .seed = 12345};
    int c[3], n = 60000;
    sample_counts(lg, &s, n, c);
    assert_share(c[0], n, 1.0 / 6);
    assert_share(c[1], n, 2.0 / 6);
    assert_share(c[2], n, 3.0 / 6);
}

/* Temperature 0.5 squares the ratios: p = (1, 4, 9) / 14. */
Test(sampler, temperature_sharpens)
{
    float lg[3] = {0, logf(2), logf(3)};
    megac_sampler s = {.temperature = 0.5f, .top_p = 1, .seed = 99};
    int c[3], n = 60000;
    sample_counts(lg, &s, n, c);
    assert_share(c[0], n, 1.0 / 14);
    assert_share(c[1], n, 4.0 / 14);
    assert_share(c[2], n, 9.0 / 14);
}

/* top-k 2 drops token 0 and renormalizes: (2, 3) / 5. */
Test(sampler, top_k_renormalizes)
{
    float lg[3] = {0, logf(2), logf(3)};
    megac_sampler s = {.temperature = 1, .top_k = 2, .top_p = 1, .seed = 5};
    int c[3], n = 30000;
    sample_counts(lg, &s, n, c);
    cr_assert_eq(c[0], 0);
    assert_share(c[1], n, 0.4);
    assert_share(c[2], n, 0.6);
}

/* top-p 0.6: sorted masses 1/2, 1/3 reach 0.6 at the second, so tokens 2
 * and 1 stay with (3, 2) / 5. top-p 0.5 keeps token 2 alone. */
Test(sampler, top_p_nucleus)
{
    float lg[3] = {0, logf(2), logf(3)};
    megac_sampler s = {.temperature = 1, .top_p = 0.6f, .seed = 8};
    int c[3], n = 30000;
    sample_counts(lg, &s, n, c);
    cr_assert_eq(c[0], 0);
    assert_share(c[1], n, 0.4);
    assert_share(c[2], n, 0.6);
    s.top_p = 0.45f;
    sample_counts(lg, &s, 1000, c);
    cr_assert_eq(c[2], 1000);
}

Test(sampler, same_seed_same_sequence)
{
    float lg[8] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
    megac_sampler a = {.temperature = 1, .top_p = 1, .seed = 42};
    megac_sampler b = {.temperature = 1, .top_p = 1, .seed = 43};
    uint64_t r1 = 0, r2 = 0, r3 = 0;
    int differ = 0;
    for (int i = 0; i < 100; i++) {
        int x = megac_sample(lg, 8, &a, &r1);
        cr_assert_eq(x, megac_sample(lg, 8, &a, &r2));
        differ += x != megac_sample(lg, 8, &b, &r3);
    }
    cr_assert_gt(differ, 10, "seeds 42 and 43 should give different draws");
    megac_sampler z = {.temperature = 1, .top_p = 1, .seed = 0};
    uint64_t r0 = 0;
    megac_sample(lg, 8, &z, &r0);
    cr_assert_neq(r0, 0, "seed 0 still starts a non-zero state");
}

/* n < 1 used to read c[-1] (n == 0) or ask malloc for 2^64 bytes (n < 0). */
Test(sampler, bad_arguments_are_refused)
{
    float lg[4] = {1, 2, 3, 0};
    uint64_t rng = 0;
    megac_sampler s = {.temperature = 1, .top_p = 1, .seed = 1}, g = {.temperature = 0, .top_p = 1};
    cr_assert_eq(megac_sample(lg, 0, &s, &rng), -MEGAC_ERR_ARG);
    cr_assert(strstr(megac_error(NULL), "n must be at least 1"), "%s", megac_error(NULL));
    cr_assert_eq(megac_sample(lg, -1, &s, &rng), -MEGAC_ERR_ARG);
    cr_assert_eq(megac_sample(lg, 0, &g, &rng), -MEGAC_ERR_ARG);
    cr_assert_eq(megac_sample(NULL, 4, &s, &rng), -MEGAC_ERR_ARG);
    cr_assert_eq(megac_sample(lg, 4, NULL, &rng), -MEGAC_ERR_ARG);
    cr_assert_eq(megac_sample(lg, 4, &s, NULL), -MEGAC_ERR_ARG);
    cr_assert_eq(megac_sample(lg, 4, &s, &rng) >= 0, true);
    cr_assert_str_eq(megac_error(NULL), "", "a success clears the message");
}

/* NaN, infinite or negative temperatures and NaN or negative top_p used to
 * give a fixed token (the last id) with no error. */
Test(sampler, bad_settings_are_refused)
{
    float lg[4] = {1, 2, 3, 0};
    megac_sampler bad[] = {
        {.temperature = NAN, .top_p = 1},      {.temperature = INFINITY, .top_p = 1},
        {.temperature = -1, .top_p = 1},       {.temperature = 1, .top_p = NAN},
        {.temperature = 1, .top_p = -0.5f},    {.temperature = -INFINITY, .top_p = 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t rng = 0;
        cr_assert_eq(megac_sample(lg, 4, &bad[i], &rng), -MEGAC_ERR_ARG, "case %zu", i);
        cr_assert(strstr(megac_error(NULL), "megac_sample: "), "%s", megac_error(NULL));
    }
}

/* NaN or +Inf logits (a diverging model) have no meaningful draw. */
Test(sampler, non_finite_logits_are_refused)
{
    float a[4] = {NAN, 1, 2, 0}, b[4] = {1, INFINITY, 2, 0}, c[3] = {-INFINITY, -INFINITY, -INFINITY};
    float d[3] = {-INFINITY, 2, -INFINITY};
    megac_sampler s = {.temperature = 1, .top_p = 1, .seed = 1}, g = {.temperature = 0, .top_p = 1};
    uint64_t rng = 0;
    cr_assert_eq(megac_sample(a, 4, &s, &rng), -MEGAC_ERR_ARG);
    cr_assert(strstr(megac_error(NULL), "logit 0 is nan"), "%s", megac_error(NULL));
    cr_assert_eq(megac_sample(b, 4, &s, &rng), -MEGAC_ERR_ARG);
    cr_assert(strstr(megac_error(NULL), "logit 1 is inf"), "%s", megac_error(NULL));
    cr_assert_eq(megac_sample(b, 4, &g, &rng), -MEGAC_ERR_ARG);
    cr_assert_eq(megac_sample(c, 3, &s, &rng), -MEGAC_ERR_ARG);
    cr_assert_eq(megac_sample(d, 3, &s, &rng), 1, "-inf masks a token");
    /* longer rows (scanned sixteen at a time, then a tail): a NaN or +Inf
     * anywhere is found, -Inf alone is not an error */
    float e[70];
    for (int at = 0; at < 70; at++)
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < 70; i++)
                e[i] = (float)(i % 7) - 3.0f;
            e[at] = k == 0 ? NAN : k == 1 ? INFINITY : -INFINITY;
            int got = megac_sample(e, 70, &g, &rng);
            cr_assert(k == 2 ? got >= 0 && got != at : got == -MEGAC_ERR_ARG, "at %d, kind %d: %d", at, k, got);
        }
}

/* At a huge temperature every p rounds to 1/n; the ranking still follows
 * the logits, so top-k 1 and a tiny top-p are the argmax, not token 0. */
Test(sampler, huge_temperature_top_k_one_is_argmax)
{
    float lg[6] = {0.1f, -2, 0.5f, 3, 1, 0.2f};
    megac_sampler k1 = {.temperature = 1e30f, .top_k = 1, .top_p = 1, .seed = 3};
    megac_sampler p0 = {.temperature = 1e30f, .top_k = 0, .top_p = 1e-9f, .seed = 3};
    uint64_t rng = 0;
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(megac_sample(lg, 6, &k1, &rng), 3);
        cr_assert_eq(megac_sample(lg, 6, &p0, &rng), 3);
    }
}

/* ---- the sampler against its definition, ranked in full ----
 * megac_sample ranks only the candidates that can be kept (a heap for
 * top-k, a cutoff for top-p). oracle_sample() is the definition written
 * plainly: softmax over all n, every candidate sorted (logit, then
 * index), top-k, then the nucleus of what is left, then the draw, with
 * the header's RNG. Both must pick the same token from the same state. */

typedef struct {
    double p;
    float logit;
    int id;
} OracleCand;

static int oracle_cmp(const void *a, const void *b)
{
    const OracleCand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The next uniform of a started state (xorshift64*, top 53 bits). */
static double oracle_uniform(uint64_t *st)
{
    uint64_t x = *st;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *st = x;
    return (double)((x * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

static int oracle_sample(const float *lg, int n, const megac_sampler *s, uint64_t *st)
{
    static OracleCand c[50000];
    double mx = lg[0], sum = 0;
    for (int i = 1; i < n; i++)
        mx = lg[i] > mx ? lg[i] : mx;
    for (int i = 0; i < n; i++) {
        c[i] = (OracleCand){exp(((double)lg[i] - mx) / s->temperature), lg[i], i};
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++)
        c[i].p /= sum;
    if (s->top_k > 0 || s->top_p < 1.0f) /* unranked, the draw runs in index order */
        qsort(c, (size_t)n, sizeof c[0], oracle_cmp);
    int keep = s->top_k > 0 && s->top_k < n ? s->top_k : n;
    if (s->top_p < 1.0f) {
        double total = 0, cum = 0;
        for (int i = 0; i < keep; i++)
            total += c[i].p;
        for (int i = 0; i < keep; i++) {
            cum += c[i].p;
            if (cum >= s->top_p * total) {
                keep = i + 1;
                break;
            }
        }
    }
    double total = 0, cum = 0;
    for (int i = 0; i < keep; i++)
        total += c[i].p;
    double r = oracle_uniform(st) * total;
    for (int i = 0; i < keep; i++) {
        cum += c[i].p;
        if (r < cum)
            return c[i].id;
    }
    return c[keep - 1].id;
}

/* Random logits with SmolLM2's vocabulary size and smaller ones, with
 * ties (values on a coarse grid), masked tokens (-inf) and a few
 * outliers; every combination of temperature, top-k and top-p below.
 * Also shows the nucleus is not cut short by ranking only part of the
 * candidates (it would pick tokens the oracle never does). */
Test(sampler, same_tokens_as_ranking_every_candidate, .timeout = 120)
{
    static float lg[49152];
    const int sizes[] = {1, 2, 7, 600, 49152};
    /* (not a huge temperature: every weight 1, the nucleus's edge lands
     * exactly on top_p * total and rounding decides it) */
    const float temps[] = {0.3f, 1.0f, 5.0f, 40.0f};
    const int top_ks[] = {0, 1, 5, 40, 600, 100000};
    /* (none whose product with a top-k is a whole number: a top-k inside a
     * run of tied logits keeps k equal weights, and the nucleus's edge
     * would land exactly on top_p * k) */
    const float top_ps[] = {1.0f, 0.9137f, 0.4711f, 0.0123f, 0.0f, 0.999999f};
    uint64_t seed = 0x1234567;
    int cases = 0, draws_differ = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int n = sizes[si];
        for (int v = 0; v < 2; v++) {
            for (int i = 0; i < n; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                int r = (int)(seed >> 40) % 1000;
                lg[i] = v ? (float)(r % 40) * 0.25f - 5.0f : (float)r * 0.013f - 6.0f; /* v: many ties */
                if (r % 97 == 0 && i)
                    lg[i] = -INFINITY;
                if (r % 251 == 0)
                    lg[i] = 9.0f + (float)(r % 3);
            }
            for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++)
                for (size_t ki = 0; ki < sizeof top_ks / sizeof top_ks[0]; ki++)
                    for (size_t pi = 0; pi < sizeof top_ps / sizeof top_ps[0]; pi++) {
                        megac_sampler s = {.temperature = temps[ti], .top_k = top_ks[ki], .top_p = top_ps[pi]};
                        uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)cases; /* started: used as it is */
                        for (int d = 0; d < (n > 1000 ? 3 : 20); d++) {
                            uint64_t orng = rng;
                            int got = megac_sample(lg, n, &s, &rng), want = oracle_sample(lg, n, &s, &orng);
                            cr_assert(got >= 0 && got < n && lg[got] != -INFINITY, "n %d: token %d", n, got);
                            draws_differ += got != want;
                            cr_assert_eq(got, want, "n %d temp %g top_k %d top_p %g draw %d: %d, the definition %d",
                                         n, (double)s.temperature, s.top_k, (double)s.top_p, d, got, want);
                            cr_assert_eq(rng, orng, "one uniform a draw");
                        }
                        cases++;
                    }
        }
    }
    cr_assert_eq(draws_differ, 0);
    cr_assert_gt(cases, 500);
}

/* Greedy and the logits' check over long rows: the maximum is taken over
 * eight lanes and the check over whole vectors, so ties across lanes and
 * in the tail, and a bad logit late in the row, must still be found
 * where a scan finds them (the first index of the largest; the first NaN
 * or +Inf). */
Test(sampler, long_rows_greedy_and_bad_logits)
{
    static float lg[1003];
    megac_sampler g = {.temperature = 0, .top_p = 1}, s = {.temperature = 1, .top_p = 0.9f, .seed = 1};
    const int n = 1003, ties[][3] = {{500, 9, 1001}, {3, 4, 1002}, {1000, 1001, 1002}, {7, 15, 8}};
    uint64_t rng = 0;
    for (size_t t = 0; t < sizeof ties / sizeof ties[0]; t++) {
        for (int i = 0; i < n; i++)
            lg[i] = (float)((i * 37) % 101) * 0.01f;
        for (int j = 0; j < 3; j++)
            lg[ties[t][j]] = 5.0f;
        int first = ties[t][0] < ties[t][1] ? ties[t][0] : ties[t][1];
        first = ties[t][2] < first ? ties[t][2] : first;
        cr_assert_eq(megac_sample(lg, n, &g, &rng), first, "ties %zu", t);
        for (int len = 1; len <= 17; len++) {   /* short rows: all in the tail, or one lane pass and a tail */
            int want = 0;
            for (int i = 1; i < len; i++)
                want = lg[i] > lg[want] ? i : want;
            cr_assert_eq(megac_sample(lg, len, &g, &rng), want, "ties %zu, n %d", t, len);
        }
    }
    for (int i = 0; i < n; i++)
        lg[i] = -INFINITY;
    cr_assert_eq(megac_sample(lg, n, &g, &rng), -MEGAC_ERR_ARG, "only -inf");
    lg[1002] = -3.0f;
    cr_assert_eq(megac_sample(lg, n, &g, &rng), 1002);
    cr_assert_eq(megac_sample(lg, n, &s, &rng), 1002, "the one token that is not masked");
    const float bad[] = {NAN, INFINITY, -NAN};
    const int at[] = {1002, 999, 8, 0};
    for (size_t b = 0; b < 3; b++)
        for (size_t a = 0; a < 4; a++) {
            for (int i = 0; i < n; i++)
                lg[i] = (float)i * 0.001f;
            lg[at[a]] = bad[b];
            lg[at[a] == 0 ? 1 : at[a] - 1] = INFINITY * (b == 1 ? 1.0f : -1.0f); /* an earlier -inf is no error */
            int want = b == 1 && at[a] > 0 ? at[a] - 1 : (int)at[a];
            cr_assert_eq(megac_sample(lg, n, &s, &rng), -MEGAC_ERR_ARG);
            char msg[64];
            snprintf(msg, sizeof msg, "logit %d is ", want);
            cr_assert(strstr(megac_error(NULL), msg), "%s (want %s)", megac_error(NULL), msg);
        }
}

/* The candidate array is kept per thread between calls and freed when the
 * thread exits: threads that sample once each and end leave nothing
 * behind (the suite's ASan pass runs LeakSanitizer, which reports what a
 * thread's exit would leave), and each draws what the calling thread
 * draws from the same state. */
static float thread_logits[49152];

static void *sample_in_thread(void *arg)
{
    megac_sampler s = {.temperature = 1, .top_p = 0.9f};
    uint64_t rng = 12345;
    *(int *)arg = megac_sample(thread_logits, 49152, &s, &rng);
    return NULL;
}

/* Bytes malloc has handed out and not had back (glibc; a sanitizer's
 * allocator answers otherwise, and its leak check covers it). */
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

Test(sampler, threads_keep_their_own_array_and_free_it)
{
    for (int i = 0; i < 49152; i++)
        thread_logits[i] = (float)((i * 7919) % 1000) * 0.01f;
    megac_sampler s = {.temperature = 1, .top_p = 0.9f};
    uint64_t rng = 12345;
    int want = megac_sample(thread_logits, 49152, &s, &rng), got[8];
    size_t before = heap_in_use();
    for (int round = 0; round < 3; round++) {
        pthread_t th[8];
        for (int i = 0; i < 8; i++)
            cr_assert_eq(pthread_create(&th[i], NULL, sample_in_thread, &got[i]), 0);
        for (int i = 0; i < 8; i++) {
            pthread_join(th[i], NULL);
            cr_assert_eq(got[i], want, "round %d thread %d", round, i);
        }
    }
    if (!getenv("MEGAC_SANITIZED")) /* 24 arrays of 768 KiB, had they stayed */
        cr_assert_lt(heap_in_use(), before + (4u << 20), "%zu bytes more in use after the threads ended",
                     heap_in_use() - before);
}

/* The weights' exp (a polynomial, eight lanes at a time) against libm's:
 * within 1e-15 relative where e^x is at least e^-708, exactly 1 for the
 * largest logit, 0 below (libm's values there are under 1e-307 of the
 * largest weight) and for -inf, at every row length (the tail of a row runs
 * as a padded group of eight); the sum is the weights'. */
Test(sampler, weights_match_libm_exp)
{
    static float lg[6007];
    static double p[6007];
    const int sizes[] = {1, 7, 8, 9, 6007};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int n = sizes[si];
        for (int i = 0; i < n; i++)     /* 0 first, then down to about -750 */
            lg[i] = i == 0 ? 0.0f : (float)(-0.1249 * i - (double)(i % 13) * 0.01);
        if (n > 100)
            lg[n / 2] = -INFINITY;
        for (int t = 0; t < 3; t++) {
            double temp = t == 0 ? 1.0 : t == 1 ? 0.7 : 3.0, sum = 0;
            double total = rt_sample_weights(lg, n, temp, p);
            cr_assert_eq(p[0], 1.0, "the largest logit's weight is %.17g", p[0]);
            for (int i = 0; i < n; i++) {
                double x = (double)lg[i] / temp, want = exp(x);
                sum += p[i];
                if (x >= -708.0)
                    cr_assert(fabs(p[i] - want) <= 1e-15 * want, "n %d, x %.17g: %.17g, libm %.17g", n, x, p[i],
                              want);
                else
                    cr_assert(p[i] == 0.0 && want < 1e-307, "n %d, x %.17g: %.17g, libm %.17g", n, x, p[i], want);
            }
            cr_assert(fabs(total - sum) <= 1e-15 * sum, "n %d: sum %.17g, the weights' %.17g", n, total, sum);
        }
    }
}
