/*
 * reference.c - the oracle: a plain-C, batch-1 decode of a Llama-family
 * model with a KV cache, one function per op, float64 everywhere except the
 * f32 weights. Every backend is tested against it, so it favours being
 * obviously right over being fast.
 *
 * One step (token at position pos):
 *   x = embed[token]
 *   per layer l:
 *     xb = rmsnorm(x, attn_norm)
 *     q, k, v = Wq xb (+bq), Wk xb (+bk), Wv xb (+bv)
 *     rope(q), rope(k) at pos;  K[l][pos] = k, V[l][pos] = v
 *       (rounded from f32 to compile.kv_dtype's f16 or bf16 if it says so)
 *     x += Wo attention(q, K[l][0..pos], V[l][0..pos])
 *     xb = rmsnorm(x, ffn_norm)
 *     x += Wdown (silu(Wgate xb) * Wup xb)
 *   logits = lm_head rmsnorm(x, final_norm)
 * The KV cache (double) grows with the positions actually fed, so a model
 * with a long context costs memory only for the rows it uses.
 *
 * Sparse attention and eviction (ir/ops.h gives the rules) are done here
 * in position space, apart from how the kernels do them: the whole cache is
 * kept, and each kv head attends the positions its layer's kind selects
 * (sink_window: a mask; quest: page bounds recomputed from the cached keys
 * every step; kascade: the anchor's top-k of this step, scored from its
 * whole cache) or, on an evicting layer, the positions still alive. After
 * the layer's attention the policy marks one position dead once the cache
 * holds its budget, by the same rule the kernels apply to their slots.
 * SnapKV layers keep the q of their last `window` steps and, after the
 * prompt's last step, keep `budget` positions per kv head (or the layer's
 * budget pooled over its kv heads, Ada-KV) by the window's attention (the
 * rule of ir/ops.h, in position space).
 */
#include "compiler/reference.h"

#include "compiler/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A matrix as the reference reads it: its f32 view, or else its stored
 * rows (q). */
typedef struct {
    const float *f;
    const QTensor *q;
} RefMat;

enum { REF_WQ, REF_WK, REF_WV, REF_WO, REF_GATE, REF_UP, REF_DOWN, REF_NMATS };

struct RefState {
    const Weights *w;
    const ModelDesc *m;
    RefMat *mats;           /* (n_layers, REF_NMATS) */
    RefMat embed, head;
    float *wrow;            /* a stored row, dequantized: (the longest row) */
    int q_dim, kv_dim;      /* n_heads*hd, n_kv_heads*hd */
    double *freq;           /* (hd/2) */
    double *x, *xb, *tmp;   /* (dim) */
    double *q, *att;        /* (q_dim) */
    double *k, *v;          /* (kv_dim) */
    double *hg, *hu;        /* (hidden_dim) */
    double *scores;         /* (rows_cap) */
    double *logits_d;       /* (vocab) */
    float *logits;          /* (vocab) */
    double **kc, **vc;      /* (n_layers) x (rows_cap, kv_dim) */
    int rows_cap;           /* KV rows allocated per layer */
    int npos;               /* tokens fed since the last reset */
    /* sparse attention and eviction */
    int *rows;              /* (rows_cap) positions one kv head attends */
    double *probs;          /* (n_heads, rows_cap) their softmax weights, in row order */
    double *wpos;           /* (rows_cap) scratch per position */
    unsigned char **alive;  /* (n_layers) x (rows_cap, n_kv_heads), evicting layers only */
    double **acc;           /* (n_layers) x (rows_cap, n_kv_heads), H2O's sums */
    double **qwin;          /* (n_layers) x (window, q_dim): SnapKV's last q, step p in p % window */
    int **kidx;             /* (n_layers) x (n_kv_heads, k): a Kascade anchor's rows this step, -1 padded */
    int prompt_end;         /* the prompt's last position, -1: none */
    RefAttnHook hook;       /* ref_set_attn_hook's, or NULL */
    void *hook_ctx;
};

/* ---- ops ---- */

void ref_embed(const float *table, int dim, int tok, double *out)
{
    const float *row = table + (size_t)tok * (size_t)dim;
    for (int i = 0; i < dim; i++)
        out[i] = row[i];
}

void ref_rmsnorm(const double *x, const float *w, int n, double eps, double *out)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r * w[i];
}

void ref_matvec(const float *w, const float *b, const double *x, int rows, int cols, double *y)
{
    for (int i = 0; i < rows; i++) {
        const float *row = w + (size_t)i * (size_t)cols;
        double s = b ? b[i] : 0.0;
        for (int j = 0; j < cols; j++)
            s += row[j] * x[j];
        y[i] = s;
    }
}

void ref_rope(double *v, int nheads, int hd, int pos, const double *freq, RopePairing p)
{
    int half = hd / 2;
    for (int h = 0; h < nheads; h++) {
        double *head = v + (size_t)h * (size_t)hd;
        for (int i = 0; i < half; i++) {
            int a = p == ROPE_ADJACENT ? 2 * i : i;
            int b = p == ROPE_ADJACENT ? 2 * i + 1 : i + half;
            double c = cos(pos * freq[i]), s = sin(pos * freq[i]);
            double x0 = head[a], x1 = head[b];
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}

/* Softmax in place over n values (max subtracted first). */
static void ref_softmax(double *x, int n)
{
    double mx = x[0], sum = 0;
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) {
        x[i] = exp(x[i] - mx);
        sum += x[i];
    }
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

void ref_attention(const double *q, const double *kc, const double *vc, int n_heads,
                   int n_kv_heads, int hd, int npos, double *scores, double *out)
{
    int group = n_heads / n_kv_heads, kv_dim = n_kv_heads * hd;
    double scale = 1.0 / sqrt((double)hd);
    for (int h = 0; h < n_heads; h++) {
        const double *qh = q + (size_t)h * hd;
        size_t off = (size_t)(h / group) * hd;
        for (int t = 0; t < npos; t++) {
            const double *kt = kc + (size_t)t * kv_dim + off;
            double s = 0;
            for (int i = 0; i < hd; i++)
                s += qh[i] * kt[i];
            scores[t] = s * scale;
        }
        ref_softmax(scores, npos);
        double *oh = out + (size_t)h * hd;
        for (int i = 0; i < hd; i++)
            oh[i] = 0;
        for (int t = 0; t < npos; t++) {
            const double *vt = vc + (size_t)t * kv_dim + off;
            for (int i = 0; i < hd; i++)
                oh[i] += scores[t] * vt[i];
        }
    }
}

void ref_swiglu(const double *g, const double *u, int n, double *out)
{
    for (int i = 0; i < n; i++)
        out[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
}

void ref_add(double *a, const double *b, int n)
{
    for (int i = 0; i < n; i++)
        a[i] += b[i];
}

/* y = W x (+ b) for a matrix held either way: a stored one a row at a
 * time, dequantized into wrow, with the same sums as ref_matvec's. */
static void ref_mat_vec(RefState *s, const RefMat *w, const float *b, const double *x, int rows, int cols, double *y)
{
    if (w->f) {
        ref_matvec(w->f, b, x, rows, cols, y);
        return;
    }
    size_t rb = dtype_row_bytes(w->q->dtype, cols);
    for (int i = 0; i < rows; i++) {
        quant_row_dequant(w->q->dtype, w->q->data + (size_t)i * rb, cols, s->wrow);
        double sum = b ? b[i] : 0.0;
        for (int j = 0; j < cols; j++)
            sum += s->wrow[j] * x[j];
        y[i] = sum;
    }
}

/* ---- state ---- */

/* Matrix `name` of w: its f32 view f, or its stored rows when it has none. */
static RefMat ref_mat(const Weights *w, const float *f, const char *name, int64_t rows, int64_t cols)
{
    RefMat r = {.f = f};
    if (!f) {
        r.q = weights_qtensor(w, name);
        ASSERT(r.q && r.q->data && r.q->rows == rows && r.q->cols == cols);
    }
    return r;
}

static void ref_mats_resolve(RefState *s)
{
    const Weights *w = s->w;
    const ModelDesc *m = s->m;
    static const char *const names[REF_NMATS] = {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"};
    s->mats = xcalloc((size_t)m->n_layers * REF_NMATS, sizeof *s->mats);
    for (int l = 0; l < m->n_layers; l++) {
        const LayerWeights *lw = &w->layers[l];
        const float *f[REF_NMATS] = {lw->wq, lw->wk, lw->wv, lw->wo, lw->w_gate, lw->w_up, lw->w_down};
        int64_t rows[REF_NMATS] = {s->q_dim, s->kv_dim, s->kv_dim, m->dim, m->hidden_dim, m->hidden_dim, m->dim};
        int64_t cols[REF_NMATS] = {m->dim, m->dim, m->dim, s->q_dim, m->dim, m->dim, m->hidden_dim};
        for (int i = 0; i < REF_NMATS; i++) {
            char name[32];
            snprintf(name, sizeof name, "L%d.%s", l, names[i]);
            s->mats[(size_t)l * REF_NMATS + i] = ref_mat(w, f[i], name, rows[i], cols[i]);
        }
    }
    s->embed = ref_mat(w, w->tok_embed, "embed", m->vocab_size, m->dim);
    /* tied and not split: the classifier is the embedding, either way */
    bool own = w->lm_head ? w->lm_head != w->tok_embed : weights_qtensor(w, "lm_head") != NULL;
    s->head = own ? ref_mat(w, w->lm_head, "lm_head", m->vocab_size, m->dim) : s->embed;
    int longest = m->dim > m->hidden_dim ? m->dim : m->hidden_dim;
    s->wrow = xcalloc((size_t)(longest > s->q_dim ? longest : s->q_dim), sizeof(float));
}

static double *ref_vec(int n)
{
    return xcalloc((size_t)n, sizeof(double));
}

RefState *ref_new(const Weights *w)
{
    const ModelDesc *m = w->m;
    ASSERT(m->n_heads > 0 && m->n_kv_heads > 0 && m->n_heads % m->n_kv_heads == 0);
    ASSERT(m->head_dim > 0 && m->head_dim % 2 == 0);
    RefState *s = xcalloc(1, sizeof *s);
    s->w = w;
    s->m = m;
    s->q_dim = m->n_heads * m->head_dim;
    s->kv_dim = m->n_kv_heads * m->head_dim;
    s->freq = ref_vec(m->head_dim / 2);
    rope_freqs(m, s->freq);
    s->x = ref_vec(m->dim);
    s->xb = ref_vec(m->dim);
    s->tmp = ref_vec(m->dim);
    s->q = ref_vec(s->q_dim);
    s->att = ref_vec(s->q_dim);
    s->k = ref_vec(s->kv_dim);
    s->v = ref_vec(s->kv_dim);
    s->hg = ref_vec(m->hidden_dim);
    s->hu = ref_vec(m->hidden_dim);
    s->logits_d = ref_vec(m->vocab_size);
    s->logits = xcalloc((size_t)m->vocab_size, sizeof(float));
    s->kc = xcalloc((size_t)m->n_layers, sizeof(double *));
    s->vc = xcalloc((size_t)m->n_layers, sizeof(double *));
    s->alive = xcalloc((size_t)m->n_layers, sizeof(unsigned char *));
    s->acc = xcalloc((size_t)m->n_layers, sizeof(double *));
    s->qwin = xcalloc((size_t)m->n_layers, sizeof(double *));
    s->kidx = xcalloc((size_t)m->n_layers, sizeof(int *));
    for (int l = 0; l < m->n_layers; l++) {
        if (m->kv[l].kind == KV_SNAPKV)
            s->qwin[l] = ref_vec(m->kv[l].window * s->q_dim);
        if (m->attn[l].kind == ATTN_KASCADE)
            s->kidx[l] = xcalloc((size_t)m->n_kv_heads * (size_t)kascade_list_len(m, l), sizeof(int));
    }
    s->prompt_end = -1;
    ref_mats_resolve(s);
    return s;
}

void ref_free(RefState *s)
{
    if (!s)
        return;
    for (int l = 0; l < s->m->n_layers; l++) {
        free(s->kc[l]);
        free(s->vc[l]);
        free(s->alive[l]);
        free(s->acc[l]);
        free(s->qwin[l]);
        free(s->kidx[l]);
    }
    free(s->qwin);
    free(s->kidx);
    free(s->kc);
    free(s->vc);
    free(s->alive);
    free(s->acc);
    free(s->rows);
    double *vecs[] = {s->freq, s->x, s->xb, s->tmp, s->q, s->att, s->k,
                      s->v, s->hg, s->hu, s->scores, s->logits_d, s->probs, s->wpos};
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        free(vecs[i]);
    free(s->logits);
    free(s->mats);
    free(s->wrow);
    free(s);
}

void ref_reset(RefState *s)
{
    s->npos = 0;
    s->prompt_end = -1;
}

void ref_set_prompt_end(RefState *s, int pos)
{
    s->prompt_end = pos;
}

/* Makes room for KV row `pos` in every layer (doubling, capped at max_seq). */
static void ref_kv_reserve(RefState *s, int pos)
{
    if (pos < s->rows_cap)
        return;
    int cap = s->rows_cap ? s->rows_cap : 64;
    while (cap <= pos)
        cap *= 2;
    if (cap > s->m->max_seq)
        cap = s->m->max_seq;
    size_t bytes = (size_t)cap * (size_t)s->kv_dim * sizeof(double);
    size_t flags = (size_t)cap * (size_t)s->m->n_kv_heads;
    for (int l = 0; l < s->m->n_layers; l++) {
        s->kc[l] = xrealloc(s->kc[l], bytes);
        s->vc[l] = xrealloc(s->vc[l], bytes);
        if (s->m->kv[l].kind != KV_FULL) {
            s->alive[l] = xrealloc(s->alive[l], flags);
            s->acc[l] = xrealloc(s->acc[l], flags * sizeof(double));
        }
    }
    s->scores = xrealloc(s->scores, (size_t)cap * sizeof(double));
    s->rows = xrealloc(s->rows, (size_t)cap * sizeof(int));
    s->probs = xrealloc(s->probs, (size_t)cap * (size_t)s->m->n_heads * sizeof(double));
    s->wpos = xrealloc(s->wpos, (size_t)cap * sizeof(double));
    s->rows_cap = cap;
}

/* Tokens an evicting layer keeps (0: the full cache; also when the budget
 * reaches max_seq, as lower.c does). */
static int ref_kv_cap(const ModelDesc *m, int l)
{
    const KvPolicy *kv = &m->kv[l];
    long long cap = kv->kind == KV_STREAMING                          ? (long long)kv->sinks + kv->window
                    : kv->kind == KV_FULL || kv->kind == KV_SNAPKV ? 0
                                                                    : kv->budget;
    return cap >= m->max_seq ? 0 : (int)cap;
}

/* SnapKV's budget (0: not SnapKV, or one that holds the whole context). */
static int ref_snap(const ModelDesc *m, int l)
{
    return m->kv[l].kind == KV_SNAPKV && m->kv[l].budget < m->max_seq ? m->kv[l].budget : 0;
}

/* Quest: the pages kv head h of layer l attends at pos, as rows. */
static int ref_quest_rows(RefState *s, int l, int h, int pos, int *rows)
{
    const ModelDesc *m = s->m;
    int hd = m->head_dim, G = m->n_heads / m->n_kv_heads, page = m->attn[l].page, cur = pos / page;
    long long np = ((long long)m->attn[l].budget + page - 1) / page;
    double *u = s->wpos; /* one bound per page: pages <= positions */
    for (int j = 0; j <= cur; j++) {
        double sum = 0;
        for (int i = 0; i < hd; i++) {
            double lo = INFINITY, hi = -INFINITY;
            for (int t = j * page; t < (j + 1) * page && t <= pos; t++) {
                double k = s->kc[l][(size_t)t * s->kv_dim + (size_t)h * hd + i];
                lo = k < lo ? k : lo;
                hi = k > hi ? k : hi;
            }
            for (int g = 0; g < G; g++) {
                double q = s->q[(size_t)(h * G + g) * hd + i];
                sum += q * lo > q * hi ? q * lo : q * hi;
            }
        }
        u[j] = sum;
    }
    /* page cur, then the best np-1 others (the lower page on ties) */
    int *sel = xcalloc((size_t)cur + 1, sizeof *sel);
    sel[cur] = 1;
    for (long long n = 1; n < np; n++) {
        int best = -1;
        for (int j = 0; j < cur; j++)
            if (!sel[j] && (best < 0 || u[j] > u[best]))
                best = j;
        if (best < 0)
            break;
        sel[best] = 1;
    }
    int n = 0;
    for (int j = 0; j <= cur; j++)
        for (int t = j * page; sel[j] && t < (j + 1) * page && t <= pos; t++)
            rows[n++] = t;
    free(sel);
    return n;
}

/* The positions kv head h of layer l attends at pos, ascending. */
static int ref_layer_rows(RefState *s, int l, int h, int pos, int *rows)
{
    const ModelDesc *m = s->m;
    const AttnSpec *a = &m->attn[l];
    int n = 0;
    if (ref_kv_cap(m, l) || ref_snap(m, l)) {
        for (int t = 0; t <= pos; t++)
            if (s->alive[l][(size_t)t * m->n_kv_heads + h])
                rows[n++] = t;
    } else if (a->kind == ATTN_SINK_WINDOW) {
        for (int t = 0; t <= pos; t++)
            if (t < a->sinks || t > pos - a->window)
                rows[n++] = t;
    } else if (a->kind == ATTN_QUEST) {
        n = ref_quest_rows(s, l, h, pos, rows);
    } else if ((a->kind == ATTN_KASCADE && l > 0) || a->kind == ATTN_KASCADE_REUSE) {
        int src = a->kind == ATTN_KASCADE ? l : a->anchor, k = kascade_list_len(m, src);
        const int *list = s->kidx[src] + (size_t)(a->kind == ATTN_KASCADE ? h : attn_list_head(a, h)) * k;
        for (int i = 0; i < k; i++)
            if (list[i] >= 0)
                rows[n++] = list[i];
    } else {
        for (int t = 0; t <= pos; t++)
            rows[n++] = t;
    }
    return n;
}

/* p[0:n] = the softmax over rows[0:n] of layer l's kv head h of
 * q . k / sqrt(hd). */
static void ref_weights(const RefState *s, int l, int h, const double *q, const int *rows, int n, double *p)
{
    int hd = s->m->head_dim;
    double scale = 1.0 / sqrt((double)hd);
    for (int i = 0; i < n; i++) {
        const double *k = s->kc[l] + (size_t)rows[i] * s->kv_dim + (size_t)h * hd;
        double d = 0;
        for (int j = 0; j < hd; j++)
            d += q[j] * k[j];
        p[i] = d * scale;
    }
    ref_softmax(p, n);
}

/* Attention of the q heads of kv head h over rows[0:n] of layer l; the
 * weights stay in s->probs[q head][0:n]. */
static void ref_head_attention(RefState *s, int l, int h, const int *rows, int n)
{
    const ModelDesc *m = s->m;
    int hd = m->head_dim, G = m->n_heads / m->n_kv_heads;
    for (int qh = h * G; qh < (h + 1) * G; qh++) {
        double *p = s->probs + (size_t)qh * s->rows_cap, *o = s->att + (size_t)qh * hd;
        ref_weights(s, l, h, s->q + (size_t)qh * hd, rows, n, p);
        for (int j = 0; j < hd; j++)
            o[j] = 0;
        for (int i = 0; i < n; i++) {
            const double *v = s->vc[l] + (size_t)rows[i] * s->kv_dim + (size_t)h * hd;
            for (int j = 0; j < hd; j++)
                o[j] += p[i] * v[j];
        }
    }
}

/* After layer l's attention at pos: H2O adds this step's weights, and once
 * the cache holds its budget each kv head loses one position. */
static void ref_evict(RefState *s, int l, int pos)
{
    const ModelDesc *m = s->m;
    const KvPolicy *kv = &m->kv[l];
    int cap = ref_kv_cap(m, l), nkv = m->n_kv_heads, G = m->n_heads / nkv;
    unsigned char *alive = s->alive[l];
    double *acc = s->acc[l];
    if (kv->kind == KV_TOVA) { /* one victim for the layer: the least mean weight over all heads */
        for (int t = 0; t <= pos; t++)
            s->wpos[t] = 0;
        for (int h = 0; h < nkv; h++) {
            int n = ref_layer_rows(s, l, h, pos, s->rows);
            for (int qh = h * G; qh < (h + 1) * G; qh++)
                for (int i = 0; i < n; i++)
                    s->wpos[s->rows[i]] += s->probs[(size_t)qh * s->rows_cap + i] / m->n_heads;
        }
    }
    for (int h = 0; h < nkv; h++) {
        int n = ref_layer_rows(s, l, h, pos, s->rows), victim = -1;
        if (kv->kind == KV_H2O)
            for (int qh = h * G; qh < (h + 1) * G; qh++)
                for (int i = 0; i < n; i++)
                    acc[(size_t)s->rows[i] * nkv + h] += s->probs[(size_t)qh * s->rows_cap + i];
        if (pos + 1 < cap)
            continue;
        for (int i = 0; i < n; i++) {
            int t = s->rows[i];
            if (kv->kind == KV_STREAMING) {
                if (t >= kv->sinks && victim < 0)
                    victim = t; /* rows ascend: the oldest past the sinks */
            } else if (kv->kind == KV_H2O) {
                if (t <= pos - kv->window && (victim < 0 || acc[(size_t)t * nkv + h] < acc[(size_t)victim * nkv + h]))
                    victim = t;
            } else if (victim < 0 || s->wpos[t] < s->wpos[victim]) {
                victim = t;
            }
        }
        ASSERT(victim >= 0);
        alive[(size_t)victim * nkv + h] = 0;
    }
}

/* A scored row of a kv head, and the order SnapKV keeps them in: the
 * larger pooled score first, then the lower head, then the lower position. */
typedef struct {
    double score;
    int head, pos;
} RefRank;

static int ref_rank_cmp(const void *x, const void *y)
{
    const RefRank *a = x, *b = y;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->head != b->head)
        return a->head < b->head ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* SnapKV after layer l's attention at pos, the prompt's last position
 * (ir/ops.h): when some kv head has more than the budget C alive, every
 * head keeps its window (its alive positions among the last W), its own
 * min(safe, quota) scored rows of largest pooled score, and the heads'
 * remaining quotas go to the largest of the rows left over all heads. */
static void ref_snap_compress(RefState *s, int l, int pos)
{
    const ModelDesc *m = s->m;
    int C = ref_snap(m, l), W = m->kv[l].window, nkv = m->n_kv_heads, G = m->n_heads / nkv, hd = m->head_dim;
    int safe = kv_snap_safe(&m->kv[l]), over = 0;
    for (int h = 0; h < nkv; h++)
        over |= ref_layer_rows(s, l, h, pos, s->rows) > C;
    if (!over)
        return;
    unsigned char *alive = s->alive[l];
    double *sc = xcalloc((size_t)pos + 1, sizeof(double)), *pool = xcalloc((size_t)pos + 1, sizeof(double));
    double *lg = xcalloc((size_t)pos + 1, sizeof(double));
    RefRank *left = xcalloc((size_t)nkv * ((size_t)pos + 1), sizeof *left); /* every head's rows not yet kept */
    int nleft = 0, pooled = 0;
    for (int h = 0; h < nkv; h++) {
        int n = ref_layer_rows(s, l, h, pos, s->rows), w0 = pos - W + 1 > 0 ? pos - W + 1 : 0, nwin = 0;
        for (int i = 0; i < n; i++) {
            sc[s->rows[i]] = 0;
            nwin += s->rows[i] >= w0;
        }
        for (int w = w0; w <= pos; w++)
            for (int g = 0; g < G; g++) {
                const double *q = s->qwin[l] + (size_t)(w % W) * s->q_dim + (size_t)(h * G + g) * hd;
                int k = 0;
                while (k < n && s->rows[k] <= w) /* the alive rows <= w */
                    k++;
                ref_weights(s, l, h, q, s->rows, k, lg);
                for (int i = 0; i < k; i++)
                    sc[s->rows[i]] += lg[i] / G;
            }
        int nsc = n - nwin; /* the scored rows: rows[0:nsc], ascending */
        for (int i = 0; i < nsc; i++) { /* their max pool, kernel 7 */
            int t = s->rows[i], j = i;
            pool[t] = sc[t];
            while (j > 0 && s->rows[j - 1] >= t - 3)
                j--;
            for (; j < nsc && s->rows[j] <= t + 3; j++)
                pool[t] = sc[s->rows[j]] > pool[t] ? sc[s->rows[j]] : pool[t];
        }
        for (int i = 0; i < n; i++)
            alive[(size_t)s->rows[i] * nkv + h] = i >= nsc;
        RefRank *r = left + nleft;
        for (int i = 0; i < nsc; i++)
            r[i] = (RefRank){pool[s->rows[i]], h, s->rows[i]};
        qsort(r, (size_t)nsc, sizeof *r, ref_rank_cmp);
        int quota = C - nwin < nsc ? C - nwin : nsc, sure = safe < quota ? safe : quota;
        for (int i = 0; i < sure; i++)
            alive[(size_t)r[i].pos * nkv + h] = 1;
        memmove(r, r + sure, (size_t)(nsc - sure) * sizeof *r);
        nleft += nsc - sure;
        pooled += quota - sure;
    }
    qsort(left, (size_t)nleft, sizeof *left, ref_rank_cmp);
    for (int i = 0; i < pooled; i++)
        alive[(size_t)left[i].pos * nkv + left[i].head] = 1;
    free(left);
    free(sc);
    free(pool);
    free(lg);
}

/* Kascade's anchor layer l at pos (ir/ops.h, TOPK_SELECT): kv head h's
 * rows are pos and the n - 1 others of largest attention summed over its
 * q heads (ties: the lower row), ascending, -1 padded to the list's
 * length k; n is the budget, or the fraction of the pos + 1 rows when that
 * is more, at most k. */
static void ref_kascade_select(RefState *s, int l, int pos)
{
    const ModelDesc *m = s->m;
    int nkv = m->n_kv_heads, G = m->n_heads / nkv, hd = m->head_dim, k = kascade_list_len(m, l);
    double *p = xcalloc((size_t)pos + 1, sizeof(double)), *lg = xcalloc((size_t)pos + 1, sizeof(double));
    RefRank *r = xcalloc((size_t)pos + 1, sizeof *r);
    for (int t = 0; t <= pos; t++)
        s->rows[t] = t;
    for (int h = 0; h < nkv; h++) {
        int *out = s->kidx[l] + (size_t)h * k, n = 0;
        for (int t = 0; t <= pos; t++)
            p[t] = 0;
        for (int g = 0; g < G; g++) {
            ref_weights(s, l, h, s->q + (size_t)(h * G + g) * hd, s->rows, pos + 1, lg);
            for (int t = 0; t <= pos; t++)
                p[t] += lg[t];
        }
        for (int t = 0; t < pos; t++)
            r[t] = (RefRank){p[t], 0, t};
        qsort(r, (size_t)pos, sizeof *r, ref_rank_cmp);
        int keep = (int)topk_rows(k, kascade_budget(m, l), attn_topk_ppm(&m->attn[l]), pos + 1) - 1;
        for (int t = 0; t < pos; t++)
            lg[t] = 0;
        for (int i = 0; i < keep; i++)
            lg[r[i].pos] = 1;
        for (int t = 0; t < pos; t++)
            if (lg[t] != 0)
                out[n++] = t;
        out[n++] = pos;
        while (n < k)
            out[n++] = -1;
    }
    free(p);
    free(lg);
    free(r);
}

/* A cache row: x[0:n] as compile.kv_dtype holds it. An f16 or bf16 cache
 * rounds the f32 value (what the kernels compute) to nearest even; the
 * reference then attends those values in float64. */
static void ref_cache_put(DType t, double *row, const double *x, int n)
{
    for (int i = 0; i < n; i++) {
        float f = (float)x[i];
        row[i] = t == DT_F16 ? f16_to_f32(f32_to_f16(f)) : t == DT_BF16 ? bf16_to_f32(f32_to_bf16(f)) : x[i];
    }
}

/* The attention half of layer l: x += Wo attn(rope(Wq xb), K, V). */
static void ref_layer_attention(RefState *s, int l, int pos)
{
    const ModelDesc *m = s->m;
    const LayerWeights *lw = &s->w->layers[l];
    const RefMat *mat = &s->mats[(size_t)l * REF_NMATS];
    int hd = m->head_dim;
    ref_rmsnorm(s->x, lw->attn_norm, m->dim, m->norm_eps, s->xb);
    ref_mat_vec(s, &mat[REF_WQ], lw->bq, s->xb, s->q_dim, m->dim, s->q);
    ref_mat_vec(s, &mat[REF_WK], lw->bk, s->xb, s->kv_dim, m->dim, s->k);
    ref_mat_vec(s, &mat[REF_WV], lw->bv, s->xb, s->kv_dim, m->dim, s->v);
    ref_rope(s->q, m->n_heads, hd, pos, s->freq, s->w->pairing);
    ref_rope(s->k, m->n_kv_heads, hd, pos, s->freq, s->w->pairing);
    double g = rope_attn_scale(m);  /* LongRoPE's attention factor: on q and k, as on the kernels' cos and sin */
    for (int i = 0; g != 1.0 && i < m->n_heads * hd; i++)
        s->q[i] *= g;
    for (int i = 0; g != 1.0 && i < m->n_kv_heads * hd; i++)
        s->k[i] *= g;
    size_t row = (size_t)pos * (size_t)s->kv_dim;
    ref_cache_put(m->kv_dtype, s->kc[l] + row, s->k, s->kv_dim);
    ref_cache_put(m->kv_dtype, s->vc[l] + row, s->v, s->kv_dim);
    if (m->attn[l].kind == ATTN_DENSE && m->kv[l].kind == KV_FULL && !s->hook) {
        ref_attention(s->q, s->kc[l], s->vc[l], m->n_heads, m->n_kv_heads, hd, pos + 1, s->scores, s->att);
    } else {
        bool evicts = ref_kv_cap(m, l) > 0, snap = ref_snap(m, l) > 0;
        if (m->attn[l].kind == ATTN_KASCADE)
            ref_kascade_select(s, l, pos);
        for (int h = 0; (evicts || snap) && h < m->n_kv_heads; h++) {
            s->alive[l][(size_t)pos * m->n_kv_heads + h] = 1;
            s->acc[l][(size_t)pos * m->n_kv_heads + h] = 0;
        }
        if (snap)
            memcpy(s->qwin[l] + (size_t)(pos % m->kv[l].window) * s->q_dim, s->q, (size_t)s->q_dim * sizeof(double));
        for (int h = 0; h < m->n_kv_heads; h++) {
            int n = ref_layer_rows(s, l, h, pos, s->rows), G = m->n_heads / m->n_kv_heads;
            ref_head_attention(s, l, h, s->rows, n);
            if (s->hook)
                s->hook(s->hook_ctx, l, h, pos, s->rows, n, s->probs + (size_t)h * G * s->rows_cap, G, s->rows_cap);
        }
        if (evicts)
            ref_evict(s, l, pos);
        if (snap && pos == s->prompt_end)
            ref_snap_compress(s, l, pos);
    }
    ref_mat_vec(s, &mat[REF_WO], NULL, s->att, m->dim, s->q_dim, s->tmp);
    ref_add(s->x, s->tmp, m->dim);
}

/* The feed-forward half of layer l: x += Wdown (silu(Wgate xb) * Wup xb). */
static void ref_layer_ffn(RefState *s, int l)
{
    const ModelDesc *m = s->m;
    const LayerWeights *lw = &s->w->layers[l];
    const RefMat *mat = &s->mats[(size_t)l * REF_NMATS];
    ref_rmsnorm(s->x, lw->ffn_norm, m->dim, m->norm_eps, s->xb);
    ref_mat_vec(s, &mat[REF_GATE], NULL, s->xb, m->hidden_dim, m->dim, s->hg);
    ref_mat_vec(s, &mat[REF_UP], NULL, s->xb, m->hidden_dim, m->dim, s->hu);
    ref_swiglu(s->hg, s->hu, m->hidden_dim, s->hg);
    ref_mat_vec(s, &mat[REF_DOWN], NULL, s->hg, m->dim, m->hidden_dim, s->tmp);
    ref_add(s->x, s->tmp, m->dim);
}

/* The step up to the final norm: the cache and the state advance. */
static void ref_advance(RefState *s, int token, int pos)
{
    const ModelDesc *m = s->m;
    ASSERT(pos == s->npos && pos < m->max_seq);
    ASSERT(token >= 0 && token < m->vocab_size);
    ref_kv_reserve(s, pos);
    if (s->embed.f) {
        ref_embed(s->embed.f, m->dim, token, s->x);
    } else {
        const QTensor *e = s->embed.q;
        quant_row_dequant(e->dtype, e->data + (size_t)token * dtype_row_bytes(e->dtype, m->dim), m->dim, s->wrow);
        for (int i = 0; i < m->dim; i++)
            s->x[i] = s->wrow[i];
    }
    for (int l = 0; l < m->n_layers; l++) {
        ref_layer_attention(s, l, pos);
        ref_layer_ffn(s, l);
    }
    s->npos++;
}

void ref_feed(RefState *s, int token, int pos)
{
    ref_advance(s, token, pos);
}

void ref_set_attn_hook(RefState *s, RefAttnHook fn, void *ctx)
{
    s->hook = fn, s->hook_ctx = ctx;
}

int ref_kv_rows(RefState *s, int l, int h, int pos)
{
    const ModelDesc *m = s->m;
    if (l < 0 || l >= m->n_layers || h < 0 || h >= m->n_kv_heads || pos < 0 || pos >= m->max_seq)
        return -1;
    if (!ref_kv_cap(m, l) && !ref_snap(m, l))
        return pos + 1;
    int n = 0;
    for (int t = 0; t <= pos; t++)
        n += s->alive[l][(size_t)t * m->n_kv_heads + h] != 0;
    return n;
}

const float *ref_step(RefState *s, int token, int pos)
{
    const ModelDesc *m = s->m;
    ref_advance(s, token, pos);
    ref_rmsnorm(s->x, s->w->final_norm, m->dim, m->norm_eps, s->xb);
    ref_mat_vec(s, &s->head, NULL, s->xb, m->vocab_size, m->dim, s->logits_d);
    for (int i = 0; i < m->vocab_size; i++)
        s->logits[i] = (float)s->logits_d[i];
    return s->logits;
}

bool ref_can_shift(const ModelDesc *m)
{
    for (int l = 0; l < m->n_layers; l++)
        if (m->kv[l].kind != KV_FULL || m->attn[l].kind == ATTN_QUEST)
            return false;
    return true;
}

bool ref_shift(RefState *s, int keep, int n)
{
    const ModelDesc *m = s->m;
    if (keep < 0 || n < 0 || keep > s->npos || n > s->npos - keep || !ref_can_shift(m))
        return false;
    size_t kd = (size_t)s->kv_dim;
    for (int l = 0; l < m->n_layers; l++)
        for (int p = keep + n; p < s->npos; p++) {
            double *k = s->k;
            memcpy(k, s->kc[l] + (size_t)p * kd, kd * sizeof *k);
            ref_rope(k, m->n_kv_heads, m->head_dim, -n, s->freq, s->w->pairing);
            ref_cache_put(m->kv_dtype, s->kc[l] + (size_t)(p - n) * kd, k, s->kv_dim);
            memcpy(s->vc[l] + (size_t)(p - n) * kd, s->vc[l] + (size_t)p * kd, kd * sizeof *k);
        }
    s->npos -= n;
    s->prompt_end = -1;
    return true;
}
