/*
 * quant_eval.c - teacher-forced fidelity of quantized formats, measured the
 * way llama.cpp's `perplexity --kl-divergence` does (research/techniques.md
 * §4); `megac eval-quant` (cmd_eval_quant.c) prints it, tests compare it
 * with recorded figures.
 *
 * A fixed token stream is made once: BOS (when the tokenizer adds one) and
 * the prompt, continued greedily by the baseline, i.e. the model as loaded
 * with quant none everywhere (a GGUF file's own blocks). The float64
 * reference then runs teacher-forced over that stream for the baseline, and
 * the reference or a compiled CPU bundle (the kernel path; the only one
 * for w8a8/w4a8) for each format (applied to the chosen tensor classes),
 * and per format we
 * measure the mean KL divergence KL(P_base || P_fmt) over positions, the
 * same-top-1 rate, the first position whose top-1 differs, the stream's
 * perplexity and the bits per matrix weight as stored.
 */
#include "compiler/compile.h"
#include "compiler/driver.h"
#include "compiler/quant.h"
#include "runtime/megac.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The baseline's stream and its log-probabilities. */
typedef struct EvalBase {
    int n, vocab;
    int *stream;            /* (n) tokens fed at positions 0..n-1 */
    double *logp;           /* (n, vocab) log-softmax of the baseline */
    int *top;               /* (n) baseline argmax */
} EvalBase;

/* out[0:v] = log softmax(logits); returns the argmax (lowest on ties). */
static int eval_log_softmax(const float *logits, int v, double *out)
{
    int top = 0;
    for (int i = 1; i < v; i++)
        top = logits[i] > logits[top] ? i : top;
    double mx = logits[top], sum = 0;
    for (int i = 0; i < v; i++)
        sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < v; i++)
        out[i] = (double)logits[i] - lse;
    return top;
}

/* The model with the classes in `classes` set to q, the others to none. */
static ModelDesc eval_desc(const ModelDesc *m, unsigned classes, QuantSpec q)
{
    ModelDesc f = *m;
    for (int c = 0; c < TCLASS_COUNT; c++)
        f.quant[c] = classes & 1u << c ? q : (QuantSpec){QUANT_NONE, 0};
    return f;
}

/* BOS + the prompt's ids into b->stream; returns how many (at most b->n). */
static int eval_prompt(const ModelDesc *m, const char *prompt, EvalBase *b, Diag *d)
{
    Tokenizer *t = tok_import(m, d);
    if (!t)
        return -1;
    const char *text = prompt ? prompt : "";
    bool add_bos = (tok_kind(t) != TOK_BPE || !*text) && tok_bos(t) >= 0;
    int cap = (int)strlen(text) + 8, *ids = xmalloc(sizeof(int) * (size_t)cap);
    int n = tok_encode(t, text, add_bos, ids, cap);
    tok_free(t);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->vocab_size)
            n = -1;
    if (n < 1)
        diag_file_error(d, m->path ? m->path : "megac", "the prompt could not be encoded for this model");
    if (n > b->n)
        fprintf(stderr, "megac eval-quant: note: the prompt has %d tokens; evaluating its first %d (--tokens)\n", n,
                b->n);
    n = n > b->n ? b->n : n;
    if (n > 0)
        memcpy(b->stream, ids, sizeof(int) * (size_t)n);
    free(ids);
    return n;
}

/* Runs the baseline, extending the stream greedily past the prompt. */
static bool eval_base(const ModelDesc *m, const char *prompt, EvalBase *b, QuantEval *e, Diag *d)
{
    ModelDesc mb = eval_desc(m, 0, (QuantSpec){QUANT_NONE, 0});
    int np = eval_prompt(m, prompt, b, d);
    Weights w;
    if (np < 1 || !driver_weights_fit(&mb, "eval-quant holds the unquantized model's weights in memory", NULL, false, d) ||
        !weights_load_ex(&w, &mb, WEIGHTS_STORED_ONLY, NULL, d))
        return false;
    RefState *r = ref_new(&w);
    double nll = 0;
    for (int pos = 0; pos < b->n; pos++) {
        double *lp = b->logp + (size_t)pos * (size_t)b->vocab;
        b->top[pos] = eval_log_softmax(ref_step(r, b->stream[pos], pos), b->vocab, lp);
        if (pos + 1 < b->n && pos + 1 >= np)
            b->stream[pos + 1] = b->top[pos];
        if (pos + 1 < b->n)
            nll -= lp[b->stream[pos + 1]];
    }
    *e = (QuantEval){.spec = {QUANT_NONE, 0}, .top1 = 1, .ppl = exp(nll / (b->n - 1)),
                     .bpw = quant_bits_per_weight(&w), .first_diff = -1};
    ref_free(r);
    weights_free(&w);
    return true;
}

/* One format's decoder: the reference on its quantized weights, or a CPU
 * bundle compiled into a temporary folder and run through the runtime. */
typedef struct EvalDec {
    Weights w;
    RefState *ref;
    DriverTmpBundle b;
} EvalDec;

static char *eval_quant_flow(unsigned classes, QuantSpec q)
{
    static const char *const names[] = {
#define X(n, s) s,
        TCLASS_LIST(X)
#undef X
    };
    char b[32], *out = xstrdup("{");
    quant_spec_str(q, b, sizeof b);
    for (int c = 0; c < TCLASS_COUNT; c++) {
        char *t = xasprintf("%s%s%s: %s", out, c ? ", " : "", names[c], classes & 1u << c ? b : "none");
        free(out);
        out = t;
    }
    char *t = xasprintf("%s}", out);
    free(out);
    return t;
}

/* Compiles the model with format q for the cpu and opens the bundle. */
static bool eval_dec_open_cpu(EvalDec *x, const QuantEvalRun *r, QuantSpec q, Diag *d)
{
    DescOverride sets[DRIVER_MAX_SETS];
    ASSERT(r->nsets < DRIVER_MAX_SETS);
    for (int i = 0; i < r->nsets; i++)
        sets[i] = r->sets[i];
    char *flow = eval_quant_flow(r->classes, q);
    sets[r->nsets] = (DescOverride){"quant", flow};
    bool ok = driver_tmp_bundle_open(&x->b, r->model, sets, r->nsets + 1, "evalq", d);
    free(flow);
    return ok;
}

static bool eval_dec_open(EvalDec *x, const ModelDesc *m, const QuantEvalRun *r, QuantSpec q, Diag *d)
{
    ModelDesc mf = eval_desc(m, r->classes, q);
    memset(x, 0, sizeof *x);
    if (!driver_weights_fit(&mf, "eval-quant holds each format's weights in memory", NULL, false, d) ||
        !weights_load_ex(&x->w, &mf, WEIGHTS_STORED_ONLY, NULL, d))
        return false;
    x->w.m = m; /* mf dies here; the reference reads only shapes, which agree */
    if (r->engine && !strcmp(r->engine, "cpu"))
        return eval_dec_open_cpu(x, r, q, d);
    x->ref = ref_new(&x->w);
    return true;
}

static const float *eval_dec_step(EvalDec *x, int tok, int pos)
{
    if (x->ref)
        return ref_step(x->ref, tok, pos);
    /* logits that are not finite (a format whose numbers overflow) are
     * still the step's: measured as the reference's are (a NaN KL), not
     * the end of every format's evaluation */
    megac_status st = megac_step(x->b.mm, tok);
    if (st != MEGAC_OK && !(st == MEGAC_ERR_KERNEL && megac_logits(x->b.mm)))
        die("eval-quant: megac_step at %d: %s", pos, megac_error(x->b.mm));
    return megac_logits(x->b.mm);
}

static void eval_dec_close(EvalDec *x)
{
    if (x->ref)
        ref_free(x->ref);
    driver_tmp_bundle_close(&x->b);
    weights_free(&x->w);
}

/* Teacher-forces an open decoder over the stream. */
static void eval_score(EvalDec *x, const EvalBase *b, QuantEval *e)
{
    double *lp = xmalloc(sizeof(double) * (size_t)b->vocab), kl = 0, nll = 0;
    int same = 0;
    for (int pos = 0; pos < b->n; pos++) {
        const double *lb = b->logp + (size_t)pos * (size_t)b->vocab;
        int top = eval_log_softmax(eval_dec_step(x, b->stream[pos], pos), b->vocab, lp);
        double k = 0;
        for (int i = 0; i < b->vocab; i++)
            k += exp(lb[i]) * (lb[i] - lp[i]);
        kl += k;
        same += top == b->top[pos];
        if (top != b->top[pos] && e->first_diff < 0)
            e->first_diff = pos;
        if (pos + 1 < b->n)
            nll -= lp[b->stream[pos + 1]];
    }
    e->mean_kl = kl / b->n;
    e->top1 = (double)same / b->n;
    e->ppl = exp(nll / (b->n - 1));
    free(lp);
}

static bool eval_format(const ModelDesc *m, const QuantEvalRun *r, QuantSpec q, const EvalBase *b, QuantEval *e,
                        Diag *d)
{
    bool cpu = r->engine && !strcmp(r->engine, "cpu");
    if (!cpu && (q.kind == QUANT_W8A8 || q.kind == QUANT_W4A8 || q.kind == QUANT_A8)) {
        diag_file_error(d, m->path ? m->path : "megac", "w8a8, w4a8 and a8 quantize the GEMV inputs, which the "
                        "reference does not model: evaluate them with the cpu engine");
        return false;
    }
    EvalDec x;
    bool ok = eval_dec_open(&x, m, r, q, d);
    *e = (QuantEval){.spec = q, .bpw = ok ? quant_bits_per_weight(&x.w) : 0, .first_diff = -1};
    if (ok)
        eval_score(&x, b, e);
    eval_dec_close(&x);
    return ok;
}

bool quant_eval(const ModelDesc *m, const QuantEvalRun *r, const QuantSpec *fmts, int nfmt, QuantEval *out,
                Diag *d)
{
    ASSERT(r->ntokens >= 2 && r->ntokens <= m->max_seq);
    EvalBase b = {.n = r->ntokens, .vocab = m->vocab_size};
    b.stream = xcalloc((size_t)b.n, sizeof *b.stream);
    b.top = xcalloc((size_t)b.n, sizeof *b.top);
    b.logp = xmalloc(sizeof(double) * (size_t)b.n * (size_t)b.vocab);
    if (r->progress)
        fprintf(stderr, "megac eval-quant: [1/%d] the baseline (quant none), %d positions\n", nfmt + 1, b.n);
    bool ok = eval_base(m, r->prompt, &b, &out[0], d);
    for (int i = 0; ok && i < nfmt; i++) {
        char name[64];
        if (r->progress)
            fprintf(stderr, "megac eval-quant: [%d/%d] %s on the %s engine\n", i + 2, nfmt + 1,
                    quant_spec_str(fmts[i], name, sizeof name), r->engine ? r->engine : "reference");
        ok = eval_format(m, r, fmts[i], &b, &out[i + 1], d);
    }
    free(b.stream);
    free(b.top);
    free(b.logp);
    return ok;
}
