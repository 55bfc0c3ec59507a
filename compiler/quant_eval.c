/*
 * quant_eval.c - teacher-forced fidelity of quantized formats, measured the
 * way llama.cpp's `perplexity --kl-divergence` does (research/techniques.md
 * §4); `megac eval-quant` (cmd_eval_quant.c) prints it, tests compare it
 * with recorded figures.
 *
 * A fixed token stream is made once: BOS (when the tokenizer adds one) and
 * the prompt, continued greedily by the baseline, i.e. the model as loaded
 * with quant none everywhere (a GGUF file's own blocks). The float64
 * reference then runs teacher-forced over that stream for the baseline and
 * for each format (applied to the chosen tensor classes), and per format we
 * measure the mean KL divergence KL(P_base || P_fmt) over positions, the
 * same-top-1 rate, the first position whose top-1 differs, the stream's
 * perplexity and the bits per matrix weight as stored.
 */
#include "compiler/compile.h"
#include "compiler/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    if (np < 1 || !weights_load(&w, &mb, d))
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

/* Teacher-forces format q over the stream. */
static bool eval_format(const ModelDesc *m, unsigned classes, QuantSpec q, const EvalBase *b, QuantEval *e,
                        Diag *d)
{
    ModelDesc mf = eval_desc(m, classes, q);
    Weights w;
    if (!weights_load(&w, &mf, d))
        return false;
    RefState *r = ref_new(&w);
    double *lp = xmalloc(sizeof(double) * (size_t)b->vocab), kl = 0, nll = 0;
    int same = 0;
    *e = (QuantEval){.spec = q, .bpw = quant_bits_per_weight(&w), .first_diff = -1};
    for (int pos = 0; pos < b->n; pos++) {
        const double *lb = b->logp + (size_t)pos * (size_t)b->vocab;
        int top = eval_log_softmax(ref_step(r, b->stream[pos], pos), b->vocab, lp);
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
    ref_free(r);
    weights_free(&w);
    return true;
}

bool quant_eval(const ModelDesc *m, const char *prompt, int ntokens, unsigned classes, const QuantSpec *fmts,
                int nfmt, QuantEval *out, Diag *d)
{
    ASSERT(ntokens >= 2 && ntokens <= m->max_seq);
    EvalBase b = {.n = ntokens, .vocab = m->vocab_size};
    b.stream = xcalloc((size_t)ntokens, sizeof *b.stream);
    b.top = xcalloc((size_t)ntokens, sizeof *b.top);
    b.logp = xmalloc(sizeof(double) * (size_t)ntokens * (size_t)b.vocab);
    bool ok = eval_base(m, prompt, &b, &out[0], d);
    for (int i = 0; ok && i < nfmt; i++)
        ok = eval_format(m, classes, fmts[i], &b, &out[i + 1], d);
    free(b.stream);
    free(b.top);
    free(b.logp);
    return ok;
}
