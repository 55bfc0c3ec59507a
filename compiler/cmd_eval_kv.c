/*
 * cmd_eval_kv.c - `megac eval-kv`: how much the description's sparse
 * attention and KV eviction change a model's predictions, measured on the
 * float64 reference (whose selection the kernels are tested to match) the
 * way eval-quant measures formats (research/techniques.md §4):
 *
 *   megac eval-kv MODEL.yaml|default [--set key=value]... [--tokens N]
 *                 [--prompt TEXT] [--copy L] [--seed S] [--prompt-end P]
 *
 * The baseline is the same model with every layer dense and full, its KV
 * cache f32 (so compile.kv_dtype's cost is measured too). Both run
 * teacher-forced over one stream:
 *   - by default BOS + the prompt, continued greedily by the baseline;
 *   - with --copy L the induction-copy stream: BOS, L random tokens, random
 *     filler, then the same L tokens again. A model that copies predicts
 *     the second copy from the first, so it needs the first copy kept (or
 *     selected); evicting it before the second copy begins is the
 *     question-agnostic setting. Reported as the accuracy of the next-token
 *     argmax over the second copy, for the baseline and the configuration.
 * Positions [0, P] count as the prompt, where SnapKV compresses (default:
 * the prompt's last token; with --copy the one before the second copy).
 * Printed: mean KL(P_dense || P_sparse) over positions, the same-top-1 rate,
 * the first position whose argmax differs, and the copy accuracies. Both
 * models run on the float64 reference, or (--engine cpu) as CPU bundles
 * compiled into a temporary folder: the kernels, far faster at long
 * streams.
 *
 * With --plan-kascade N [--budget K] it measures instead how well each
 * layer's top-K rows serve each later layer on the dense model over the
 * stream, maps each later layer's kv heads to the earlier layer's that
 * serve them best, picks N Kascade anchors by Kascade's dynamic program
 * and prints them as a compile.attention setting (evkv_plan, below).
 */
#include "compiler/cli.h"
#include "compiler/compile.h"
#include "compiler/driver.h"
#include "runtime/megac.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EVKV_MAX_SETS 64

typedef struct {
    const char *model, *prompt;
    const char *engine;             /* "reference" or "cpu" */
    int tokens, copy, prompt_end;   /* prompt_end -1: the stream's own (below) */
    int plan, budget;               /* --plan-kascade N (0: off), --budget K */
    double fraction;                /* --fraction F (0: a fixed K) */
    bool same_heads;                /* --same-heads: plan without kv head maps */
    const char *plan_opt;           /* the last planning option given (an error without --plan-kascade) */
    unsigned seed;
    DescOverride set[EVKV_MAX_SETS];
    int nset;
} EvKvArgs;

static void evkv_usage(FILE *out)
{
    fprintf(out, "usage: megac eval-kv MODEL [--set key=value]... [--tokens N] [--prompt TEXT]\n"
                 "                     [--copy L] [--seed S] [--prompt-end P] [--engine E]\n"
                 "                     [--plan-kascade N [--budget K] [--fraction F] [--same-heads]]\n\n"
                 "Teacher-forced fidelity of the description's sparse attention, KV eviction and\n"
                 "KV cache dtype (compile.attention, compile.kv_policy, compile.kv_dtype; give them\n"
                 "with --set) against the same model with every layer dense and full and an f32\n"
                 "cache, both on the float64 reference (or --engine cpu): mean KL\n"
                 "divergence from dense, the same-top-1 rate and the first differing position.\n\n"
                 "  --set key=value override a description key (repeatable), e.g.\n"
                 "                  --set 'compile.kv_policy=[{layers: all, policy: tova, budget: 64}]'\n"
                 "  --tokens N      positions, 2 to the model's max_seq (default 256)\n"
                 "  --prompt TEXT   start of the stream (default \"Once upon a time\"), continued\n"
                 "                  greedily by the dense model\n"
                 "  --copy L        the induction-copy stream instead: L random tokens, random\n"
                 "                  filler, the L tokens again; also prints how often each model\n"
                 "                  predicts the second copy's next token\n"
                 "  --seed S        seed of the copy stream's tokens (default 1)\n"
                 "  --prompt-end P  positions [0, P] are the prompt, where SnapKV layers compress\n"
                 "                  (default: the prompt's last token; with --copy the last before\n"
                 "                  the second copy: question-agnostic; later is question-aware)\n"
                 "  --engine E      what runs both models: reference (float64, default) or cpu\n"
                 "                  (CPU bundles compiled into a temporary folder: the kernels,\n"
                 "                  ~100x faster on long streams; not with --plan-kascade)\n"
                 "  --plan-kascade N  instead, profile the dense model over the stream and print N\n"
                 "                  Kascade anchors (layer 0 the first) as a compile.attention\n"
                 "                  setting: those whose top-K rows (--budget) keep the most of\n"
                 "                  every layer's attention, each layer's share given (* anchors)\n"
                 "  --budget K      the rows each anchor picks per kv head (default 64)\n"
                 "  --fraction F    or F of the rows when that is more (0 < F <= 1; the paper's\n"
                 "                  max(128, 10%% of n) is --budget 128 --fraction 0.1)\n"
                 "  --same-heads    plan without kv head maps: each reuse layer's kv head reads\n"
                 "                  the anchor's of the same index (by default each reads the\n"
                 "                  anchor kv head whose rows keep the most of its attention)\n");
}

static bool evkv_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    long v;
    if (!cli_parse_long(s, lo, hi, &v)) {
        fprintf(stderr, "megac eval-kv: %s needs a number from %ld to %ld, not '%s'\n", opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

static bool evkv_args(EvKvArgs *a, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool opt = s[0] == '-' && s[1];
        if (!strcmp(s, "--same-heads")) {
            a->same_heads = true;
            a->plan_opt = s;
            continue;
        }
        bool known = !strcmp(s, "--set") || !strcmp(s, "--tokens") || !strcmp(s, "--prompt") ||
                     !strcmp(s, "--copy") || !strcmp(s, "--seed") || !strcmp(s, "--prompt-end") ||
                     !strcmp(s, "--plan-kascade") || !strcmp(s, "--budget") || !strcmp(s, "--fraction") ||
                     !strcmp(s, "--engine");
        long v;
        if (opt && (!known || i + 1 >= argc))
            return cli_bad_arg("eval-kv", s, known);
        if (!strcmp(s, "--set")) {
            if (!cli_set_add("eval-kv", argv[++i], a->set, &a->nset, EVKV_MAX_SETS))
                return false;
        } else if (!strcmp(s, "--tokens")) {
            if (!evkv_int(s, argv[++i], 2, 1000000, &v))
                return false;
            a->tokens = (int)v;
        } else if (!strcmp(s, "--copy")) {
            if (!evkv_int(s, argv[++i], 2, 100000, &v))
                return false;
            a->copy = (int)v;
        } else if (!strcmp(s, "--prompt-end")) {
            if (!evkv_int(s, argv[++i], 0, 1000000, &v))
                return false;
            a->prompt_end = (int)v;
        } else if (!strcmp(s, "--seed")) {
            if (!evkv_int(s, argv[++i], 0, 2147483647L, &v))
                return false;
            a->seed = (unsigned)v;
        } else if (!strcmp(s, "--plan-kascade")) {
            if (!evkv_int(s, argv[++i], 1, MODEL_MAX_LAYERS, &v))
                return false;
            a->plan = (int)v;
        } else if (!strcmp(s, "--budget")) {
            if (!evkv_int(s, argv[++i], 1, 1000000, &v))
                return false;
            a->budget = (int)v;
            a->plan_opt = s;
        } else if (!strcmp(s, "--fraction")) {
            const char *f = argv[++i];
            if (!cli_parse_double(f, 0.0, 1.0, &a->fraction) || a->fraction == 0.0) {
                fprintf(stderr, "megac eval-kv: --fraction needs a number above 0 and at most 1, not '%s'\n", f);
                return false;
            }
            a->plan_opt = s;
        } else if (!strcmp(s, "--prompt")) {
            a->prompt = argv[++i];
        } else if (!strcmp(s, "--engine")) {
            a->engine = argv[++i];
            if (strcmp(a->engine, "reference") && strcmp(a->engine, "cpu")) {
                fprintf(stderr, "megac eval-kv: --engine is reference or cpu, not '%s'\n", a->engine);
                return false;
            }
        } else if (a->model) {
            return cli_bad_arg("eval-kv", s, false);
        } else {
            a->model = s;
        }
    }
    if (a->plan_opt && !a->plan) {
        fprintf(stderr, "megac eval-kv: %s is an option of --plan-kascade, which is not given\n", a->plan_opt);
        return false;
    }
    if (a->plan && strcmp(a->engine, "reference")) {
        fprintf(stderr, "megac eval-kv: --plan-kascade profiles on the reference engine (its attention weights), "
                        "not --engine %s\n", a->engine);
        return false;
    }
    if (!a->model)
        fprintf(stderr, "megac eval-kv: no model given\n");
    return a->model != NULL;
}

/* log softmax of logits into out; returns the argmax (lowest on ties). */
static int evkv_log_softmax(const float *logits, int v, double *out)
{
    int top = 0;
    for (int i = 1; i < v; i++)
        top = logits[i] > logits[top] ? i : top;
    double sum = 0;
    for (int i = 0; i < v; i++)
        sum += exp((double)logits[i] - logits[top]);
    double lse = logits[top] + log(sum);
    for (int i = 0; i < v; i++)
        out[i] = (double)logits[i] - lse;
    return top;
}

/* The copy stream: BOS, span, filler, span; returns where the second
 * span starts. Tokens avoid the low ids (specials in most vocabularies). */
static int evkv_copy_stream(int *stream, int n, int span, int bos, int vocab, unsigned seed)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ seed;
    int lo = vocab > 64 ? 16 : 0, at = 0;
    if (bos >= 0)
        stream[at++] = bos;
    int first = at, second = n - span;
    for (int i = at; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        stream[i] = i >= second ? stream[first + i - second] : lo + (int)(x % (uint64_t)(vocab - lo));
    }
    return second;
}

/* ---- --plan-kascade: Kascade's anchors from a profile (research/techniques.md, 2.3) ---- */

/* At every position past the budget, each layer's top-K rows per kv head
 * (pos and the K - 1 others of most attention summed over the kv head's q
 * heads, as TOPK_SELECT picks them), and the attention-mass recall
 * (research/techniques.md, section 4) each of its kv heads h would have at
 * that step: over its own rows (self[l][h], an anchor), and over those of
 * each kv head h' of an earlier layer i (pair[i][l][h][h'], reusing them).
 * Summed over the steps; evkv_plan turns the sums into the similarity the
 * dynamic program reads: a reuse layer's kv head h reads the anchor kv head
 * whose rows keep the most of its attention on the mean (its head map, or
 * h with --same-heads), and a layer counts as its least-served kv head. */
typedef struct {
    int L, nkv, K, steps;   /* K: the most rows an anchor picks (the lists' stride) */
    int b, ppm, kk;         /* the budget, the fraction in millionths; this step's rows (topk_rows) */
    int *top;           /* [L][nkv][K]: this step's picks */
    double *a;          /* [nkv][pos + 1] of the current layer: attention summed over q heads */
    double *self;       /* [L][nkv] */
    double *pair;       /* [L][L][nkv][nkv] (i < l) */
    int *order;         /* scratch */
    int cap;
} KPlan;

static const double *kplan_key;

static int kplan_cmp(const void *x, const void *y)
{
    int i = *(const int *)x, j = *(const int *)y;
    if (kplan_key[i] != kplan_key[j])
        return kplan_key[i] > kplan_key[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

static void kplan_hook(void *ctx, int l, int h, int pos, const int *rows, int n, const double *p, int G,
                       size_t stride)
{
    KPlan *k = ctx;
    k->kk = (int)topk_rows(k->K, k->b, k->ppm, pos + 1);
    if (k->kk == pos + 1 || n != pos + 1)
        return; /* every row fits (or a layer that is not dense) */
    double *a = k->a + (size_t)h * k->cap;
    for (int t = 0; t <= pos; t++) {
        a[t] = 0;
        for (int g = 0; g < G; g++)
            a[rows[t]] += p[(size_t)g * stride + t];
    }
    for (int t = 0; t < pos; t++)
        k->order[t] = t;
    kplan_key = a;
    qsort(k->order, (size_t)pos, sizeof *k->order, kplan_cmp);
    int *top = k->top + ((size_t)l * k->nkv + h) * k->K;
    top[0] = pos;
    for (int i = 1; i < k->kk; i++)
        top[i] = k->order[i - 1];
    /* the weights sum to G: recall = mass / G; layer i < l's picks are all made */
    for (int i = 0; i <= l; i++)
        for (int h2 = i == l ? h : 0; h2 < (i == l ? h + 1 : k->nkv); h2++) {
            const int *ti = k->top + ((size_t)i * k->nkv + h2) * k->K;
            double got = 0;
            for (int r = 0; r < k->kk; r++)
                got += a[ti[r]];
            if (i == l)
                k->self[(size_t)l * k->nkv + h] += got / G;
            else
                k->pair[(((size_t)i * k->L + l) * k->nkv + h) * k->nkv + h2] += got / G;
        }
    if (h == k->nkv - 1 && l == k->L - 1)
        k->steps++;
}

/* The kv head of layer i that serves layer j's kv head h best (h itself on
 * a tie with it, else the lowest; h with same_heads), and its mean recall
 * in *r. */
static int kplan_head(const KPlan *k, int i, int j, int h, bool same_heads, double *r)
{
    const double *row = k->pair + (((size_t)i * k->L + j) * k->nkv + h) * k->nkv;
    int best = h;
    for (int h2 = 0; !same_heads && h2 < k->nkv; h2++)
        if (row[h2] > row[best])
            best = h2;
    *r = row[best] / k->steps;
    return best;
}

/* N anchors a_1 = 0 < ... < a_N, layer j reusing the last anchor at or
 * before it: the most sum over layers of their recall (layer 0 dense: 1;
 * an anchor a: sim[a][a]; a reuse layer j of anchor a: sim[a][j]), by
 * dynamic programming over (anchors placed, the last one). */
static double kplan_pick(const double *sim, int L, int N, int *anchors)
{
    double *seg = xcalloc((size_t)L * (L + 1), sizeof(double)); /* seg[a][b]: anchor a, layers (a, b) reuse it */
    for (int a = 0; a < L; a++) {
        seg[(size_t)a * (L + 1) + a + 1] = a == 0 ? 1.0 : sim[(size_t)a * L + a];
        for (int b = a + 2; b <= L; b++)
            seg[(size_t)a * (L + 1) + b] = seg[(size_t)a * (L + 1) + b - 1] + sim[(size_t)a * L + b - 1];
    }
    double *g = xcalloc((size_t)(N + 1) * L, sizeof(double));
    int *from = xcalloc((size_t)(N + 1) * L, sizeof(int));
    for (int i = 0; i < (N + 1) * L; i++)
        g[i] = -1;
    g[(size_t)1 * L + 0] = 0;
    for (int m = 2; m <= N; m++)
        for (int b = 1; b < L; b++)
            for (int a = 0; a < b; a++)
                if (g[(size_t)(m - 1) * L + a] >= 0) {
                    double v = g[(size_t)(m - 1) * L + a] + seg[(size_t)a * (L + 1) + b];
                    if (v > g[(size_t)m * L + b])
                        g[(size_t)m * L + b] = v, from[(size_t)m * L + b] = a;
                }
    int last = 0;
    double best = -1;
    for (int a = 0; a < L; a++)
        if (g[(size_t)N * L + a] >= 0 && g[(size_t)N * L + a] + seg[(size_t)a * (L + 1) + L] > best)
            best = g[(size_t)N * L + a] + seg[(size_t)a * (L + 1) + L], last = a;
    for (int m = N; m >= 1; m--) {
        anchors[m - 1] = last;
        last = from[(size_t)m * L + last];
    }
    free(seg);
    free(g);
    free(from);
    return best;
}

/* Whether position pos of n is one to report: on a terminal every 64th,
 * rewritten in place; in a log a line at each quarter. */
static bool evkv_progress_due(bool tty, int pos, int n)
{
    if (tty)
        return pos % 64 == 63 || pos == n - 1;
    return pos == n - 1 || (n >= 64 && (pos + 1) % ((n + 3) / 4) == 0);
}

/* Prints the kascade_reuse entries of layers lo..hi reusing anchor i,
 * consecutive layers with the same head map as one entry. */
static void kplan_print_reuse(const KPlan *k, int i, int lo, int hi, bool same_heads)
{
    int nkv = k->nkv, *map = xcalloc((size_t)nkv * (hi - lo + 1), sizeof(int));
    double r;
    for (int j = lo; j <= hi; j++)
        for (int h = 0; h < nkv; h++)
            map[(size_t)(j - lo) * nkv + h] = kplan_head(k, i, j, h, same_heads, &r);
    for (int j = lo, e; j <= hi; j = e + 1) {
        const int *mj = map + (size_t)(j - lo) * nkv;
        for (e = j; e < hi && !memcmp(mj, map + (size_t)(e + 1 - lo) * nkv, sizeof(int) * nkv); e++) {
        }
        bool identity = true;
        for (int h = 0; h < nkv; h++)
            identity &= mj[h] == h;
        printf(", {layers: %d", j);
        if (e > j)
            printf("-%d", e);
        printf(", kind: kascade_reuse, anchor: %d", i);
        for (int h = 0; !identity && h < nkv; h++)
            printf("%s%d", h ? ", " : ", heads: [", mj[h]);
        printf(identity ? "}" : "]}");
    }
    free(map);
}

static void evkv_plan(const EvKvArgs *a, const ModelDesc *m, RefState *rd, int *stream, int n, int np)
{
    int L = m->n_layers, N = a->plan < L ? a->plan : L, K = a->budget, nkv = m->n_kv_heads;
    if (a->plan > L)
        fprintf(stderr, "megac eval-kv: note: --plan-kascade %d is more than the model's %d layers; planning %d\n",
                a->plan, L, L);
    bool same = a->same_heads || nkv > ATTN_MAX_HEAD_MAP;
    int ppm = (int)(a->fraction * 1e6 + 0.5), cap = (int)topk_rows(n, K, ppm, n); /* the most rows a step picks */
    KPlan k = {L, nkv, cap, 0, K, ppm, 0, NULL, NULL, NULL, NULL, NULL, n};
    k.top = xcalloc((size_t)L * nkv * k.K, sizeof(int));
    k.a = xcalloc((size_t)nkv * n, sizeof(double));
    k.self = xcalloc((size_t)L * nkv, sizeof(double));
    k.pair = xcalloc((size_t)L * L * nkv * nkv, sizeof(double));
    k.order = xcalloc((size_t)n, sizeof(int));
    ref_set_attn_hook(rd, kplan_hook, &k);
    double *pd = xmalloc(sizeof(double) * (size_t)m->vocab_size);
    bool tty = isatty(STDERR_FILENO);
    for (int pos = 0; pos < n; pos++) {
        int td = evkv_log_softmax(ref_step(rd, stream[pos], pos), m->vocab_size, pd);
        if (pos + 1 < n && pos + 1 >= np)
            stream[pos + 1] = td;
        if (evkv_progress_due(tty, pos, n))
            fprintf(stderr, "megac eval-kv: profiled %d of %d positions%s", pos + 1, n,
                    tty && pos < n - 1 ? "\r" : "\n");
    }
    char frac[64] = "", more[64] = "";
    if (ppm) {
        snprintf(frac, sizeof frac, ", fraction: %.9g", a->fraction);
        snprintf(more, sizeof more, " (or %.9g of the rows when more)", a->fraction);
    }
    printf("model %s: %d positions, Kascade anchors of %d rows per kv head%s%s\n", m->name, n, K, more,
           same ? ", each reuse kv head reading the anchor's of its index" : "");
    if (!k.steps) {
        printf("  no position picks fewer rows than it has: every layer's top-k is all of them (raise --tokens)\n");
    } else {
        /* sim[i][j]: layer j's least-served kv head's mean recall reusing layer i's rows (i < j), or its own */
        double *sim = xcalloc((size_t)L * L, sizeof(double)), r;
        for (int j = 0; j < L; j++)
            for (int i = 0; i <= j; i++) {
                double least = 2;
                for (int h = 0; h < nkv; h++) {
                    if (i == j)
                        r = k.self[(size_t)j * nkv + h] / k.steps;
                    else
                        kplan_head(&k, i, j, h, same, &r);
                    least = r < least ? r : least;
                }
                sim[(size_t)i * L + j] = least;
            }
        int *an = xcalloc((size_t)N, sizeof(int));
        double score = kplan_pick(sim, L, N, an);
        printf("  anchors");
        for (int i = 0; i < N; i++)
            printf("%s %d", i ? "," : "", an[i]);
        printf(": the layers keep %.3f of their attention on the mean (over %d positions; each layer its\n"
               "  least-served kv head's mean; layer 0 all of it)\n",
               score / L, k.steps);
        printf("  layer:recall");
        for (int j = 0, m2 = 0; j < L; j++) {
            while (m2 + 1 < N && an[m2 + 1] <= j)
                m2++;
            printf(" %d%s:%.3f", j, an[m2] == j ? "*" : "", j == 0 ? 1.0 : sim[(size_t)an[m2] * L + j]);
        }
        printf("\n  --set 'compile.attention=[");
        for (int i = 0; i < N; i++) {
            int end = i + 1 < N ? an[i + 1] - 1 : L - 1;
            printf("%s{layers: %d, kind: kascade, budget: %d%s}", i ? ", " : "", an[i], K, frac);
            if (end > an[i])
                kplan_print_reuse(&k, an[i], an[i] + 1, end, same);
        }
        printf("]'\n");
        free(an);
        free(sim);
    }
    free(pd);
    free(k.top);
    free(k.a);
    free(k.self);
    free(k.pair);
    free(k.order);
}

/* One of the two models eval-kv compares: the reference on the shared
 * weights, or a CPU bundle compiled into a temporary folder. */
typedef struct {
    RefState *ref;
    DriverTmpBundle b;
} EvKvEngine;

/* Compiles the model with the --set overrides, then `extra`, for the cpu
 * into a temporary folder (`what` names it) and opens it. */
static bool evkv_open_cpu(EvKvEngine *e, const EvKvArgs *a, const DescOverride *extra, int nextra,
                          const char *what, Diag *d)
{
    DescOverride sets[EVKV_MAX_SETS + 3];
    int n = 0;
    for (int i = 0; i < a->nset; i++)
        sets[n++] = a->set[i];
    for (int i = 0; i < nextra && n < EVKV_MAX_SETS + 3; i++)
        sets[n++] = extra[i];
    fprintf(stderr, "megac eval-kv: compiling the %s model for the cpu\n", what);
    return driver_tmp_bundle_open(&e->b, a->model, sets, n, what, d);
}

/* The logits of token tok at pos, or NULL (reported). */
static const float *evkv_step(EvKvEngine *e, int tok, int pos)
{
    if (e->ref)
        return ref_step(e->ref, tok, pos);
    megac_status st = megac_step(e->b.mm, tok);
    if (st == MEGAC_OK || (st == MEGAC_ERR_KERNEL && megac_logits(e->b.mm))) /* non-finite: as the reference's */
        return megac_logits(e->b.mm);
    fprintf(stderr, "megac eval-kv: the cpu bundle's step at position %d: %s\n", pos, megac_error(e->b.mm));
    return NULL;
}

static void evkv_close(EvKvEngine *e)
{
    if (e->ref)
        ref_free(e->ref);
    driver_tmp_bundle_close(&e->b);
    e->ref = NULL;
}

static int evkv_run(const EvKvArgs *a)
{
    Arena arena = {0};
    ModelDesc sparse, dense;
    Diag d;
    diag_init(&d);
    d.prog = "megac eval-kv";
    bool ok = driver_is_default_model(a->model)
                  ? desc_parse(&sparse, &arena, "<embedded>", desc_default_yaml, strlen(desc_default_yaml), a->set,
                               a->nset, &d)
                  : desc_load(&sparse, &arena, a->model, a->set, a->nset, &d);
    if (!ok || !desc_check(&sparse, &d)) {
        arena_free(&arena);
        return 2;
    }
    dense = sparse;
    dense.kv_dtype = DT_F32;
    for (int l = 0; l < MODEL_MAX_LAYERS; l++) {
        dense.attn[l] = (AttnSpec){.kind = ATTN_DENSE};
        dense.kv[l] = (KvPolicy){.kind = KV_FULL};
    }
    if (sparse.max_seq < 2) { /* as eval-quant: --tokens is 2 or more */
        fprintf(stderr, "megac eval-kv: the model's max_seq is %d; a measure needs at least 2 positions\n",
                sparse.max_seq);
        arena_free(&arena);
        return 2;
    }
    int n = a->tokens < sparse.max_seq ? a->tokens : sparse.max_seq, v = sparse.vocab_size;
    if (n < a->tokens)
        fprintf(stderr, "megac eval-kv: note: --tokens %d is more than the model's max_seq; evaluating %d\n",
                a->tokens, n);
    if (a->copy && 2 * a->copy + 2 > n) {
        fprintf(stderr, "megac eval-kv: --copy %d needs --tokens of at least %d\n", a->copy, 2 * a->copy + 2);
        arena_free(&arena);
        return 2;
    }
    Weights w;
    memset(&w, 0, sizeof w);
    bool cpu = !strcmp(a->engine, "cpu"); /* else the reference, which holds the weights here */
    if (!cpu && (!driver_weights_fit(&dense, "eval-kv holds the model's stored weights in memory", NULL, true, &d) ||
                 !weights_load_ex(&w, &dense, WEIGHTS_STORED_ONLY, NULL, &d))) {
        arena_free(&arena);
        return 2;
    }
    int *stream = xcalloc((size_t)n, sizeof *stream), second = -1, np = 1;
    if (a->copy) {
        second = evkv_copy_stream(stream, n, a->copy, sparse.bos_id, v, a->seed);
        np = n;
    } else {
        Tokenizer *t = tok_import(&sparse, &d);
        if (!t) {
            free(stream);
            weights_free(&w);
            arena_free(&arena);
            return 2;
        }
        int cap = (int)strlen(a->prompt) + 8, *ids = xmalloc(sizeof(int) * (size_t)cap);
        np = tok_encode(t, a->prompt, tok_bos(t) >= 0, ids, cap);
        if (np > n)     /* as eval-quant */
            fprintf(stderr, "megac eval-kv: note: the prompt has %d tokens; evaluating its first %d (--tokens)\n",
                    np, n);
        np = np > n ? n : np < 1 ? 1 : np;
        memcpy(stream, ids, sizeof(int) * (size_t)np);
        free(ids);
        tok_free(t);
    }
    int pe = a->prompt_end >= 0 ? a->prompt_end : a->copy ? second - 1 : np - 1;
    if (pe >= n) {
        fprintf(stderr, "megac eval-kv: --prompt-end %d is past the stream's %d positions\n", pe, n);
        free(stream);
        weights_free(&w);
        arena_free(&arena);
        return 2;
    }
    if (a->plan) { /* w describes the dense model */
        RefState *rp = ref_new(&w);
        evkv_plan(a, &dense, rp, stream, n, np);
        ref_free(rp);
        free(stream);
        weights_free(&w);
        arena_free(&arena);
        return 0;
    }
    EvKvEngine ed = {0}, es = {0};
    if (cpu) { /* dense: every layer's attention dense, its cache full and f32 */
        static const DescOverride plain[] = {
            {"compile.attention", "[]"}, {"compile.kv_policy", "[]"}, {"compile.kv_dtype", "f32"}};
        if (!evkv_open_cpu(&ed, a, plain, 3, "dense", &d) || !evkv_open_cpu(&es, a, NULL, 0, "configured", &d) ||
            megac_set_prompt_end(es.b.mm, pe) != MEGAC_OK) {
            evkv_close(&ed);
            evkv_close(&es);
            free(stream);
            arena_free(&arena);
            return 2;
        }
    } else { /* both references share the weights: the policies live in the descriptions */
        ed.ref = ref_new(&w);
        const ModelDesc *held = w.m;
        w.m = &sparse;
        es.ref = ref_new(&w);
        w.m = held;
        ref_set_prompt_end(es.ref, pe);
    }
    double *pd = xmalloc(sizeof(double) * (size_t)v), *ps = xmalloc(sizeof(double) * (size_t)v);
    double kl = 0;
    int same = 0, first_diff = -1, copy_d = 0, copy_s = 0, copy_n = 0, rc = 0;
    bool tty = isatty(STDERR_FILENO);
    for (int pos = 0; pos < n; pos++) {
        const float *ld = evkv_step(&ed, stream[pos], pos), *ls = ld ? evkv_step(&es, stream[pos], pos) : NULL;
        if (!ls) {
            rc = 1;
            n = pos;
            break;
        }
        int td = evkv_log_softmax(ld, v, pd), ts = evkv_log_softmax(ls, v, ps);
        if (evkv_progress_due(tty, pos, n))
            fprintf(stderr, "megac eval-kv: %d of %d positions%s", pos + 1, n, tty && pos < n - 1 ? "\r" : "\n");
        double k = 0;
        for (int i = 0; i < v; i++)
            k += exp(pd[i]) * (pd[i] - ps[i]);
        kl += k;
        same += td == ts;
        if (td != ts && first_diff < 0)
            first_diff = pos;
        if (pos + 1 < n && pos + 1 >= np)
            stream[pos + 1] = td;
        if (second >= 0 && pos >= second && pos + 1 < n) {
            copy_n++;
            copy_d += td == stream[pos + 1];
            copy_s += ts == stream[pos + 1];
        }
    }
    if (!rc) {
        printf("model %s: %d positions, %s stream, the prompt ends at %d%s\n", sparse.name, n,
               a->copy ? "induction-copy" : "greedy (dense)", pe, cpu ? " (cpu bundles)" : "");
        printf("  mean KL from dense  %.4g nats\n", kl / n);
        printf("  same top-1          %.1f%%\n", 100.0 * same / n);
        if (first_diff < 0)
            printf("  first difference    none\n");
        else
            printf("  first difference    at position %d\n", first_diff);
        if (second >= 0)
            printf("  copy accuracy       dense %.1f%%, configured %.1f%% (%d predictions; the second copy starts "
                   "%d positions after the first)\n",
                   100.0 * copy_d / copy_n, 100.0 * copy_s / copy_n, copy_n, second - (sparse.bos_id >= 0));
    }
    evkv_close(&ed);
    evkv_close(&es);
    free(pd);
    free(ps);
    free(stream);
    weights_free(&w);
    arena_free(&arena);
    return rc;
}

int cmd_eval_kv(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        evkv_usage(stdout);
        return 0;
    }
    EvKvArgs a = {.prompt = "Once upon a time", .engine = "reference", .tokens = 256, .seed = 1, .prompt_end = -1,
                  .budget = 64};
    int rc = 2;
    if (!evkv_args(&a, argc, argv))
        evkv_usage(stderr);
    else
        rc = evkv_run(&a);
    cli_sets_free(a.set, a.nset);
    return rc;
}
