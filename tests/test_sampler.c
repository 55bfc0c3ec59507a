/*
 * test_sampler.c - megac_sample: greedy, temperature, top-k, top-p and the
 * seeded RNG. Distribution checks draw many times with a fixed seed, so
 * they are deterministic; the tolerance is about 6 standard deviations.
 */
#include "runtime/megac.h"

#include <criterion/criterion.h>
#include <math.h>
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
