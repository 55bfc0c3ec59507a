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
#include <stdbool.h>
#include <stdlib.h>

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

static int sample_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* Highest logit first; equal logits by lower index. */
static int sample_cand_cmp(const void *a, const void *b)
{
    const SampleCand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Fills c with softmax(logits / temp) over all n tokens. */
static void sample_softmax(const float *logits, int n, double temp, SampleCand *c)
{
    double mx = logits[sample_argmax(logits, n)], sum = 0;
    for (int i = 0; i < n; i++) {
        c[i].id = i;
        c[i].logit = logits[i];
        c[i].p = exp(((double)logits[i] - mx) / temp);
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++)
        c[i].p /= sum;
}

/* How many of the first n sorted candidates the nucleus keeps (at least
 * one); their mass is renormalized first, so top-p applies after top-k. */
static int sample_nucleus(const SampleCand *c, int n, double top_p)
{
    double total = 0, cum = 0;
    for (int i = 0; i < n; i++)
        total += c[i].p;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (cum >= top_p * total)
            return i + 1;
    }
    return n;
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
    return NULL;
}

int rt_logits_bad(const float *logits, int n)
{
    bool finite = false;
    for (int i = 0; i < n; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return i;
        finite |= logits[i] != -INFINITY;
    }
    return finite ? -1 : 0;
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
    if (s->temperature == 0.0f)
        return sample_argmax(logits, n);
    SampleCand *c = malloc(sizeof *c * (size_t)n);
    if (!c)
        return -(int)rt_loose_fail(MEGAC_ERR_NOMEM, "megac_sample: no memory for %d candidates", n);
    sample_softmax(logits, n, s->temperature, c);
    int keep = n;
    bool sorted = s->top_k > 0 || s->top_p < 1.0f;
    if (sorted)
        qsort(c, (size_t)n, sizeof *c, sample_cand_cmp);
    if (s->top_k > 0 && s->top_k < keep)
        keep = s->top_k;
    if (s->top_p < 1.0f)
        keep = sample_nucleus(c, keep, s->top_p);
    double u = sample_uniform(rng_state, s->seed);
    int tok = sample_draw(c, keep, u);
    free(c);
    return tok;
}
