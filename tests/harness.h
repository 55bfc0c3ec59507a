/*
 * harness.h - shared by the tests: a compiled bundle decoded next to the
 * reference engine, step by step, and the rows of the top-k op tests.
 *
 * Tolerance: every logit within atol + rtol * max|reference logit| of that
 * step, and the kernel's own argmax equal to the reference's.
 */
#ifndef MEGAC_TEST_HARNESS_H
#define MEGAC_TEST_HARNESS_H

#include "compiler/model.h"
#include "runtime/megac.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Whether this is the sanitized suite (scripts/test.sh sets
 * MEGAC_SANITIZED=1 for the ASan build): the slowest tests then run fewer
 * steps, worker counts or architectures. */
static inline bool harness_sanitized(void)
{
    return getenv("MEGAC_SANITIZED") != NULL;
}

/* Whether case i runs variant j of n (a worker count, an architecture)
 * when the plain suite runs `per` of each case's variants: those from
 * i % n on, so that across the cases every variant runs, each beside
 * several others; the sanitized suite, where such runs' time goes to LLVM
 * or NVRTC (not sanitized), runs the first of them only. */
static inline bool harness_variants_wanted(size_t i, size_t j, size_t n, size_t per)
{
    return (j + n - i % n) % n < (harness_sanitized() ? 1 : per);
}

/* Every variant of every case in the plain suite; one a case, in turn, in
 * the sanitized one. */
static inline bool harness_variant_wanted(size_t i, size_t j, size_t n)
{
    return harness_variants_wanted(i, j, n, n);
}

/* A case's number from its name (a model's file name), for the turns of
 * harness_variant_wanted where cases are not numbered. */
static inline size_t harness_case_id(const char *name)
{
    size_t id = 0;
    for (const char *c = name; *c; c++)
        id = id * 31 + (unsigned char)*c;
    return id;
}

/* Index of the largest value, lowest index on ties (as the kernels do). */
/* topk_select's op tests (CPU and host-CUDA): row t of every kv head is
 * harness_topk_level(t) times one positive vector, and every q is
 * positive, so the q heads' weights rank the rows as their levels do; 23
 * levels, so rows tie exactly and the lower one must win. */
static inline double harness_topk_level(int t)
{
    return (double)((t * 37) % 23) * 0.05;
}

/* topk_select's params in those tests: a list of k, b rows or ppm
 * millionths of the rows when that is more. */
typedef struct {
    int k, b, ppm;
} HarnessTopk;
static const HarnessTopk harness_topks[] = {{1, 1, 0}, {5, 5, 0}, {40, 40, 0}, {40, 3, 150000}, {12, 4, 100000}};
#define HARNESS_NTOPK ((int)(sizeof harness_topks / sizeof harness_topks[0]))

/* What topk_select picks at pos on those rows (ir/ops.h): pos and the
 * others of highest level (ties: the lower row), as many as the larger of
 * b and ceil((pos + 1) ppm / 10^6) in all, at most k and pos + 1;
 * ascending, -1 after. Counted here, not with ops.h's topk_rows. */
static inline void harness_topk_want(int pos, HarnessTopk c, int *want)
{
    bool taken[pos + 1];
    memset(taken, 0, sizeof taken);
    int rows = c.b, k = c.k, n = 0;
    while ((long long)rows * 1000000 < (long long)(pos + 1) * c.ppm) /* the fraction's rows, rounded up */
        rows++;
    rows = rows < k ? rows : k;
    int keep = rows - 1 < pos ? rows - 1 : pos;
    for (int r = 0; r < keep; r++) {
        int best = -1;
        for (int t = 0; t < pos; t++)
            if (!taken[t] && (best < 0 || harness_topk_level(t) > harness_topk_level(best)))
                best = t;
        taken[best] = true;
    }
    for (int t = 0; t < pos; t++)
        if (taken[t])
            want[n++] = t;
    want[n++] = pos;
    while (n < k)
        want[n++] = -1;
}

static inline int harness_argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* Decodes ntok greedy tokens from BOS with the bundle and the reference,
 * the first prompt_end + 1 of them counting as the prompt (-1: none; SnapKV
 * layers compress at its end); returns the largest |logit difference|. */
static inline double harness_compare_prompted(megac_model *mm, RefState *ref, int vocab, int ntok, int prompt_end,
                                              double atol, double rtol, const char *what)
{
    cr_assert_eq(megac_vocab_size(mm), vocab);
    ref_reset(ref);
    cr_assert_eq(megac_reset(mm), MEGAC_OK);
    ref_set_prompt_end(ref, prompt_end);
    cr_assert_eq(megac_set_prompt_end(mm, prompt_end), MEGAC_OK);
    int tok = megac_bos(mm);
    double worst = 0;
    for (int pos = 0; pos < ntok; pos++) {
        cr_assert_eq(megac_step(mm, tok), MEGAC_OK, "%s: %s", what, megac_error(mm));
        const float *got = megac_logits(mm);
        const float *want = ref_step(ref, tok, pos);
        double scale = 0;
        for (int i = 0; i < vocab; i++)
            scale = fmax(scale, fabs(want[i]));
        double tol = atol + rtol * scale;
        for (int i = 0; i < vocab; i++) {
            double e = fabs((double)got[i] - (double)want[i]);
            worst = fmax(worst, e);
            cr_assert(e <= tol, "%s: pos %d logit %d: kernel %.7g, reference %.7g (|diff| %.3g > %.3g)", what, pos,
                      i, got[i], want[i], e, tol);
        }
        int k = megac_argmax(mm), r = harness_argmax(want, vocab);
        cr_assert_eq(k, r, "%s: pos %d: kernel picks %d, reference %d", what, pos, k, r);
        tok = k;
    }
    cr_log_info("%s: %d steps, max |logit diff| %.3g", what, ntok, worst);
    return worst;
}

/* harness_compare_prompted with no prompt. */
static inline double harness_compare_greedy(megac_model *mm, RefState *ref, int vocab, int ntok, double atol,
                                            double rtol, const char *what)
{
    return harness_compare_prompted(mm, ref, vocab, ntok, -1, atol, rtol, what);
}

/* megac_feed on bundle b: the step skips the output matrix and the argmax
 * (the logits that the model holds, the arena's or the staging copy the
 * CUDA backend fills, keep the step before's values, and megac_logits says
 * there are none), and the state advances as megac_step's does: each later
 * step's logits equal, within tol * max|logit| (0: bit for bit), those of a
 * model that stepped through every token; over npos positions (three of
 * every four fed). */
static inline void harness_feed_check(const char *b, double tol, int npos)
{
    megac_model *fed, *stepped;
    cr_assert_eq(megac_open(b, &fed), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_open(b, &stepped), MEGAC_OK, "%s", megac_last_open_error());
    int V = megac_vocab_size(fed), toks[] = {1, 403, 26, 77, 9, 311, 58, 120, 4, 200};
    size_t bytes = sizeof(float) * (size_t)V;
    float *before = malloc(bytes);
    const float *held = NULL;   /* fed's logits, as its last step left them */
    for (int i = 0; i < npos; i++) {
        int tok = (i < 10 ? toks[i] : 7919 * i + 13) % V;
        cr_assert_eq(megac_step(stepped, tok), MEGAC_OK, "%s", megac_error(stepped));
        if (i % 4 != 0) {   /* positions 1-3, 5-7 and 9 fed, 0, 4 and 8 stepped */
            cr_assert_eq(megac_feed(fed, tok), MEGAC_OK, "%s", megac_error(fed));
            cr_assert_null(megac_logits(fed));
            cr_assert_eq(megac_argmax(fed), -1);
            cr_assert_eq(megac_position(fed), i + 1);
            cr_assert_arr_eq(held, before, bytes, "%s: the feed at position %d wrote the logits", b, i);
            continue;
        }
        cr_assert_eq(megac_step(fed, tok), MEGAC_OK, "%s", megac_error(fed));
        held = megac_logits(fed);
        const float *want = megac_logits(stepped);
        cr_assert_not_null(held);
        double scale = 0;
        for (int j = 0; j < V; j++)
            scale = fmax(scale, fabs(want[j]));
        for (int j = 0; j < V; j++)
            cr_assert(fabs((double)held[j] - (double)want[j]) <= tol * scale, "%s: position %d logit %d: %.9g, %.9g",
                      b, i, j, held[j], want[j]);
        if (tol == 0)
            cr_assert_eq(megac_argmax(fed), megac_argmax(stepped));
        memcpy(before, held, bytes);
    }
    cr_assert_eq(megac_feed(fed, V), MEGAC_ERR_ARG);
    cr_assert_eq(megac_feed(NULL, 1), MEGAC_ERR_ARG);
    free(before);
    megac_close(fed);
    megac_close(stepped);
}

/* megac_shift on bundle b, a model of one layer (so each cache row depends
 * on its token and position alone, and a shifted cache is the one the kept
 * tokens give): for each case, a model that decoded `len` tokens and
 * dropped positions [keep, keep + n) gives over the next 10 steps the
 * logits of one that decoded only the kept tokens, within tol * max|logit|
 * (the keys turned in f32 and rounded again to the cache's type), and the
 * same argmax. Then the calls it refuses. */
static inline void harness_shift_check(const char *b, double tol)
{
    megac_model *shifted, *fresh;
    cr_assert_eq(megac_open(b, &shifted), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_open(b, &fresh), MEGAC_OK, "%s", megac_last_open_error());
    int V = megac_vocab_size(shifted), S = megac_max_seq(shifted);
    static const struct {
        int keep, n, len;
    } cases[] = {{5, 12, 30}, {0, 1, 30}, {1, 120, 200}, {29, 1, 30}, {7, 0, 20}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int keep = cases[c].keep, n = cases[c].n, len = cases[c].len, tok[220];
        cr_assert(len + 10 <= S && len + 10 <= 220);
        for (int i = 0; i < len + 10; i++)
            tok[i] = i == 0 ? megac_bos(shifted) : (7919 * i + 13 * (int)c) % V;
        cr_assert_eq(megac_reset(shifted), MEGAC_OK);
        cr_assert_eq(megac_reset(fresh), MEGAC_OK);
        for (int i = 0; i < len; i++) {
            cr_assert_eq(megac_feed(shifted, tok[i]), MEGAC_OK, "%s", megac_error(shifted));
            if (i < keep || i >= keep + n)
                cr_assert_eq(megac_feed(fresh, tok[i]), MEGAC_OK, "%s", megac_error(fresh));
        }
        cr_assert_eq(megac_shift(shifted, keep, n), MEGAC_OK, "%s: %s", b, megac_error(shifted));
        cr_assert_eq(megac_position(shifted), len - n);
        cr_assert_null(megac_logits(shifted));
        double worst = 0;
        for (int i = len; i < len + 10; i++) {
            cr_assert_eq(megac_step(shifted, tok[i]), MEGAC_OK, "%s", megac_error(shifted));
            cr_assert_eq(megac_step(fresh, tok[i]), MEGAC_OK, "%s", megac_error(fresh));
            const float *got = megac_logits(shifted), *want = megac_logits(fresh);
            double scale = 0;
            for (int j = 0; j < V; j++)
                scale = fmax(scale, fabs(want[j]));
            for (int j = 0; j < V; j++) {
                double e = fabs((double)got[j] - (double)want[j]);
                worst = fmax(worst, e / scale);
                cr_assert(e <= tol * scale, "%s: drop [%d, %d + %d) of %d: step %d logit %d: %.7g, kept tokens "
                          "decoded %.7g", b, keep, keep, n, len, i - len, j, got[j], want[j]);
            }
            cr_assert_eq(megac_argmax(shifted), megac_argmax(fresh), "%s: step %d", b, i - len);
        }
        cr_log_info("%s: drop [%d, %d + %d) of %d: max |logit diff| / max |logit| %.3g", b, keep, keep, n, len, worst);
    }
    int pos = megac_position(shifted);
    cr_assert_eq(megac_shift(shifted, -1, 1), MEGAC_ERR_ARG);
    cr_assert_eq(megac_shift(shifted, 0, -1), MEGAC_ERR_ARG);
    cr_assert_eq(megac_shift(shifted, pos, 1), MEGAC_ERR_ARG);
    cr_assert_eq(megac_shift(shifted, 1, pos), MEGAC_ERR_ARG);
    cr_assert(strstr(megac_error(shifted), "megac_shift: cannot drop positions ["), "%s", megac_error(shifted));
    cr_assert_eq(megac_position(shifted), pos);
    cr_assert_eq(megac_shift(shifted, pos, 0), MEGAC_OK);
    cr_assert_eq(megac_shift(NULL, 0, 0), MEGAC_ERR_ARG);
    megac_close(shifted);
    megac_close(fresh);
}

#endif
