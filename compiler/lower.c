/*
 * lower.c - the whole batch-1 decode step as per-worker programs.
 *
 * Stages of one step, in the order every worker runs them (W workers):
 *
 *   embed      x[c0:c1] = embed[tok]              a few tiles of x     -> signal embed
 *   per layer l, when kv_heads is a multiple of W (1, 2, 4, 8 workers for
 *   most models), q/k/v and attention fuse into one stage:
 *   comb.l     wait (embed | down.l-1); worker h % W, for each kv head h:
 *              the q rows of head group h and the k/v rows of head h with
 *              the fused norm, rope, kv_append, attn (nsplit 1), combine
 *                                                                      -> signal comb.l
 *   otherwise (e.g. 3 or 132 workers):
 *   qkv.l      wait (embed | down.l-1)
 *              q/k/v rows = rmsnorm(x)*attn_norm . Wq|Wk|Wv (+ bias), the
 *              concatenated rows tiled over all workers by weight bytes
 *                                                                      -> signal qkv.l
 *   attn.l     wait qkv.l; kv head h cut into nsplit contiguous splits
 *              (lower_attn_nsplit: from W / kv_heads up, until the busiest
 *              worker attends at most 1.05x its share), piece h*nsplit + s
 *              on worker i (pieces <= W) or in contiguous runs of pieces
 *              per worker (3 heads on 2 workers: 2 splits, 1.5 heads each);
 *              a worker's pieces of head h, on a dense layer:
 *                the last piece's worker: rope k head h, kv_append h (only
 *                        the last split reads row pos, ops.h)
 *                attn(h, s, rope) partials of its pieces, each rotating
 *                        the q heads of group h as it reads them: no split
 *                        waits for another
 *              on a sparse or evicting layer:
 *                the first piece's worker: rope q heads of group h and k
 *                        head h, write the cache (-> signal kv.l.h when
 *                        another worker holds pieces of h)
 *                the others: wait kv.l.h; attn_sparse of its pieces
 *              then, by compile.attn_combine (auto: stage, which timed
 *              faster on the H200 and the CPU; in_o saves o a hop but has
 *              each of its workers merge every head):
 *              in_o: every worker with pieces               -> signal attn.l
 *              stage: the last piece's worker: wait attn.l.h (the others'
 *                pieces), attn_combine h; the others: signal attn.l.h
 *                                                              -> signal comb.l
 *   o.l        in_o: wait attn.l; att.wN = attn_combine of every head
 *                (worker N's own copy), x[rows] += Wo[rows] . att.wN
 *              stage: wait comb.l; x[rows] += Wo[rows] . att
 *              tiled by bytes                                           -> signal o.l
 *   ffn.l      wait o.l; gate and up rows = rmsnorm(x)*ffn_norm . Wg|Wu,
 *              then hb = silu(gate)*up on the same rows (same worker)   -> signal ffn.l
 *   down.l     wait ffn.l; x[rows] += Wdown[rows] . hb                  -> signal down.l
 *   lm         wait down.L-1; logits rows = rmsnorm(x)*final_norm . Wlm,
 *              argmax of each tile into amax[tile]                      -> signal lm
 *              the worker of tile 0: wait lm, argmax_combine -> next
 *
 * So a layer costs 4 all-join waits when fused, else 5 (in_o: each worker
 * of o merges the n_kv_heads * nsplit partials itself, a few KB from
 * cache, rather than waiting for a merge that waited for the splits:
 * one hop fewer on the step's critical path) or, with stage, 5 plus one
 * per-head join (splits -> combine); and, on a sparse or evicting layer,
 * one small per-head wait (rope/append -> other splits).
 * Each stage waits only on the stage before it; that
 * stage's join transitively covers everything earlier, which also orders
 * the reuse of scratch buffers across layers (write-after-read). Counters
 * are never reused, so every wait is an all-join (threshold = the total of
 * the increments to its counter) and observes every signal.
 *
 * Deadlock freedom: every worker emits the stages in the same order; a
 * stage's tasks only wait on earlier stages. Inside the attention stage a
 * worker takes its heads last to first, so it writes the cache of the head
 * it shares with the next worker (of a sparse layer) and signals its
 * pieces of it before any wait; a kv.l.h wait is thus always met, and an
 * attn.l.h wait waits on pieces that wait on nothing else.
 *
 * Weight dtypes: each weight buffer has the dtype its tensor is stored in
 * (lower_model_weights: as loaded and quantized, GGUF blocks included;
 * lower_model: what the description's quant knobs ask of an f32 source).
 * A tied model whose embed and lm_head classes get different dtypes has a
 * separate lm_head buffer.
 *
 * Load balance: a GEMV stage's rows are cut into equal-byte tiles, one per
 * worker, but never below LOWER_MIN_TILE_BYTES of weights (tiny tiles are
 * merged, leaving some workers idle in that stage rather than all of them
 * paying for a trivial tile); when a stage has fewer tiles than workers the
 * first worker rotates from stage to stage so idle slots spread evenly.
 */
#include "compiler/compile.h"
#include "compiler/quant.h"

#include <stdlib.h>
#include <string.h>

/* Smallest GEMV tile, in weight bytes: below it the wait/signal pair costs
 * more than the work it parallelizes. */
#define LOWER_MIN_TILE_BYTES (16 * 1024)
/* Smallest embedding tile, in elements. */
#define LOWER_MIN_EMBED_TILE 512
/* KV rows per attention block (a split takes a contiguous run of them). */
#define LOWER_ATTN_BLOCK 32
/* How far above its share of the attention the busiest worker may be
 * before the heads are cut into more splits (lower_attn_nsplit). */
#define LOWER_ATTN_SLACK 1.05

typedef struct Lower {
    const ModelDesc *m;
    const Weights *w;       /* NULL: weight dtypes from the knobs alone */
    Schedule *s;
    int nw;                 /* workers */
    int G, hd, nsplit;
    bool fused;             /* q/k/v and attention in one stage (kv heads % W == 0) */
    bool fold;              /* split attention merged by o's workers (compile.attn_combine: in_o) */
    int rot;                /* first worker of the next GEMV stage */
    int lm_tiles;
    uint32_t *nsig;         /* per counter: total increments emitted */
    uint32_t capsig;
    bool *in_stage;         /* per worker: has waited in the current stage */
    /* buffers */
    uint32_t x, q, k, v, att, part, gate, up, hb, amax, tok, logits, next, rope, embed, final_norm, lm_head;
    uint32_t prev;          /* counter of the previous stage */
    uint32_t sel, score;    /* Quest's page lists, eviction scores (BUF_NONE if unused) */
    uint32_t snapsc;        /* SnapKV's scratch, shared by its layers (BUF_NONE if unused) */
    uint32_t topksc;        /* Kascade anchors' scratch, shared by them (BUF_NONE if unused) */
    int evict_pending;      /* layer whose kv_evict the next GEMV stage runs first, or -1 */
    bool combine_pending;   /* the next GEMV stage's workers merge the attention partials first */
    uint32_t *att_w;        /* per worker: its merged attention (fold), BUF_NONE until needed */
} Lower;

/* One matrix of a stage's concatenated row space. */
typedef struct Seg {
    uint32_t w, y, b;       /* weight, output, bias (BUF_NONE if none) */
    int64_t rows;
} Seg;

static uint32_t lower_buf(Lower *L, const char *name, DType t, BufClass c, int rank, int64_t d0, int64_t d1, int64_t d2,
                          int64_t d3)
{
    int64_t shape[4] = {d0, d1, d2, d3};
    return sched_add_buffer(L->s, name, t, c, rank, shape);
}

/* The storage dtype of weight `name`: as loaded and quantized when the
 * weights are known, else what the knob of its class asks of an f32
 * source (vectors stay f32). */
static DType lower_wdtype(const Lower *L, const char *name)
{
    if (L->w)
        return weights_dtype(L->w, name);
    int c = quant_tensor_class(name);
    int t = c < 0 ? DT_F32 : quant_spec_dtype(L->m->quant[c], DT_F32);
    ASSERT(t >= 0); /* lower_check refused the others */
    return (DType)t;
}

static uint32_t lower_wbuf(Lower *L, int l, const char *name, int rank, int64_t d0, int64_t d1)
{
    char n[64];
    snprintf(n, sizeof n, "L%d.%s", l, name);
    return lower_buf(L, n, lower_wdtype(L, n), BUF_WEIGHT, rank, d0, d1, 0, 0);
}

/* Whether lm_head is its own buffer (untied, or split by quantization). */
static bool lower_head_separate(const Lower *L)
{
    if (L->w)
        return weights_head_separate(L->w);
    return !L->m->tie_embeddings || lower_wdtype(L, "embed") != lower_wdtype(L, "lm_head");
}

/* A weight of layer l by its short name ("wq", "attn_norm", ...). */
static uint32_t lower_w(Lower *L, int l, const char *name)
{
    char n[64];
    snprintf(n, sizeof n, "L%d.%s", l, name);
    int64_t id = sched_find_buffer(L->s, n);
    return id < 0 ? BUF_NONE : (uint32_t)id;
}

static uint32_t lower_counter(Lower *L, const char *name)
{
    uint32_t c = sched_add_counter(L->s, name);
    while (L->capsig <= c) {
        L->capsig = L->capsig ? 2 * L->capsig : 256;
        L->nsig = xrealloc(L->nsig, L->capsig * sizeof *L->nsig);
    }
    L->nsig[c] = 0;
    return c;
}

static void lower_signal(Lower *L, int w, uint32_t c, uint32_t k)
{
    sched_signal(L->s, w, c, k);
    L->nsig[c] += k;
}

/* All-join: wait until every increment emitted so far to c has landed. */
static void lower_join(Lower *L, int w, uint32_t c)
{
    ASSERT(L->nsig[c] > 0);
    sched_wait(L->s, w, c, L->nsig[c]);
}

/* Starts a stage: workers wait on the previous stage once, before their
 * first task in this one. */
static void lower_stage_begin(Lower *L)
{
    memset(L->in_stage, 0, (size_t)L->nw * sizeof *L->in_stage);
}

static void lower_stage_enter(Lower *L, int w)
{
    if (L->in_stage[w])
        return;
    L->in_stage[w] = true;
    if (L->prev != UINT32_MAX)
        lower_join(L, w, L->prev);
}

/* Every worker that took part in the stage signals c once. */
static void lower_stage_end(Lower *L, uint32_t c)
{
    for (int w = 0; w < L->nw; w++)
        if (L->in_stage[w])
            lower_signal(L, w, c, 1);
    L->prev = c;
}

static Access acc_r(uint32_t b, int64_t lo, int64_t hi)
{
    return (Access){b, ACC_R, affine_const(lo), affine_const(hi)};
}

static Access acc_mode(uint32_t b, int mode, int64_t lo, int64_t hi)
{
    return (Access){b, (uint8_t)mode, affine_const(lo), affine_const(hi)};
}

static Access acc_pos(uint32_t b, int mode, Affine lo, Affine hi)
{
    return (Access){b, (uint8_t)mode, lo, hi};
}

static const Access acc_none = {BUF_NONE, 0, {0, 0}, {0, 0}};

/* ---- op emitters: each op's access list, written out per ops.h ---- */

static void lower_gemv(Lower *L, int w, const Seg *sg, uint32_t x, uint32_t nw, int64_t r0, int64_t r1, int64_t k,
                       bool accum)
{
    int flags = (accum ? GEMV_ACCUM : 0) | (nw != BUF_NONE ? GEMV_NORM : 0) | (sg->b != BUF_NONE ? GEMV_BIAS : 0);
    int32_t p[4] = {(int32_t)r0, (int32_t)r1, (int32_t)k, flags};
    Access a[5] = {acc_r(sg->w, r0 * k, r1 * k), acc_r(x, 0, k), acc_mode(sg->y, accum ? ACC_RW : ACC_W, r0, r1),
                   nw != BUF_NONE ? acc_r(nw, 0, k) : acc_none, sg->b != BUF_NONE ? acc_r(sg->b, r0, r1) : acc_none};
    sched_op(L->s, w, OP_GEMV, p, a);
}

static void lower_rope(Lower *L, int w, uint32_t v, int h0, int h1)
{
    int32_t p[2] = {h0, h1};
    Access a[2] = {acc_mode(v, ACC_RW, (int64_t)h0 * L->hd, (int64_t)h1 * L->hd),
                   acc_pos(L->rope, ACC_R, (Affine){0, L->hd}, (Affine){L->hd, L->hd})};
    sched_op(L->s, w, OP_ROPE, p, a);
}

/* ---- sparse attention and eviction, per layer ---- */

/* Slots of layer l's cache when it evicts (0: the full cache, also when
 * the budget reaches max_seq; SnapKV keeps every row). */
static int layer_cap(const ModelDesc *m, int l)
{
    const KvPolicy *kv = &m->kv[l];
    int64_t cap = kv->kind == KV_STREAMING                           ? (int64_t)kv->sinks + kv->window
                  : kv->kind == KV_FULL || kv->kind == KV_SNAPKV ? 0
                                                                     : kv->budget;
    return cap >= m->max_seq ? 0 : (int)cap; /* a cache that never fills evicts nothing */
}

/* SnapKV's budget on layer l (0: not SnapKV, or a budget that holds the
 * whole context, which never compresses). */
static int layer_snap(const ModelDesc *m, int l)
{
    return m->kv[l].kind == KV_SNAPKV && m->kv[l].budget < m->max_seq ? m->kv[l].budget : 0;
}

/* The capacity of the kept list of each kv head of SnapKV layer l. */
static int64_t layer_snap_list(const ModelDesc *m, int l)
{
    return snap_list_cap(layer_snap(m, l), kv_snap_safe(&m->kv[l]), m->n_kv_heads, m->max_seq);
}

static int layer_policy(const ModelDesc *m, int l)
{
    return m->kv[l].kind == KV_STREAMING ? KV_POLICY_STREAMING : m->kv[l].kind == KV_H2O ? KV_POLICY_H2O
                                                                                           : KV_POLICY_TOVA;
}

/* Whether layer l's attention writes scores for its eviction policy (a
 * cache that never fills evicts nothing: it is lowered dense). */
static bool layer_scores(const ModelDesc *m, int l)
{
    return (m->kv[l].kind == KV_H2O || m->kv[l].kind == KV_TOVA) && layer_cap(m, l);
}

/* Quest's page size on layer l (a page longer than the context is the
 * whole context). */
static int layer_page(const ModelDesc *m, int l)
{
    return m->attn[l].page < m->max_seq ? m->attn[l].page : m->max_seq;
}

/* Quest pages selected per kv head on layer l. */
static int layer_npages(const ModelDesc *m, int l)
{
    int64_t page = layer_page(m, l);
    int64_t np = (m->attn[l].budget + page - 1) / page, all = (m->max_seq + page - 1) / page;
    return (int)(np < 1 ? 1 : np > all ? all : np);
}

static uint32_t lower_layer_buf(Lower *L, const char *what, int l)
{
    char name[32];
    snprintf(name, sizeof name, "%s.%d", what, l);
    int64_t id = sched_find_buffer(L->s, name);
    return id < 0 ? BUF_NONE : (uint32_t)id;
}

static void lower_kv_append(Lower *L, int w, uint32_t kc, uint32_t vc, int h)
{
    int64_t hd = L->hd, base = (int64_t)h * L->m->max_seq * hd;
    int32_t p[1] = {h};
    Affine lo = {base, hd}, hi = {base + hd, hd};
    Access a[4] = {acc_r(L->k, h * hd, (h + 1) * hd), acc_r(L->v, h * hd, (h + 1) * hd), acc_pos(kc, ACC_W, lo, hi),
                   acc_pos(vc, ACC_W, lo, hi)};
    sched_op(L->s, w, OP_KV_APPEND, p, a);
}

/* Split sp of kv head h's attention over rows [0, pos]; only the last
 * split reads row pos (ops.h). rope: q is rotated as it is read. */
static void lower_attn(Lower *L, int w, uint32_t kc, uint32_t vc, int h, int sp, bool rope)
{
    int64_t hd = L->hd, g = L->G, base = (int64_t)h * L->m->max_seq * hd, e = g * (hd + 2);
    int64_t p0 = ((int64_t)h * L->nsplit + sp) * e;
    int32_t p[5] = {h, sp, L->nsplit, LOWER_ATTN_BLOCK, rope};
    Affine lo = affine_const(base), hi = {base + (sp == L->nsplit - 1 ? hd : 0), hd};
    Access a[5] = {acc_r(L->q, h * g * hd, (h + 1) * g * hd), acc_pos(kc, ACC_R, lo, hi), acc_pos(vc, ACC_R, lo, hi),
                   acc_mode(L->part, ACC_W, p0, p0 + e),
                   rope ? acc_pos(L->rope, ACC_R, (Affine){0, hd}, (Affine){hd, hd}) : acc_none};
    sched_op(L->s, w, OP_ATTN, p, a);
}

/* The q heads of kv heads [h, h + nh) from their ns splits' partials, into out. */
static void lower_attn_combine(Lower *L, int w, int h, int nh, int ns, uint32_t out)
{
    int64_t hd = L->hd, g = L->G, e = g * (hd + 2) * ns;
    int32_t p[3] = {h, ns, nh};
    Access a[2] = {acc_r(L->part, h * e, (h + nh) * e), acc_mode(out, ACC_W, h * g * hd, (h + nh) * g * hd)};
    sched_op(L->s, w, OP_ATTN_COMBINE, p, a);
}

/* Worker w merges every head's partials into its own copy of the
 * attention output (fold), and returns that buffer. */
static uint32_t lower_attn_combine_own(Lower *L, int w)
{
    if (L->att_w[w] == BUF_NONE) {
        char n[32];
        snprintf(n, sizeof n, "att.w%d", w);
        L->att_w[w] = lower_buf(L, n, DT_F32, BUF_SCRATCH, 1, (int64_t)L->m->n_heads * L->hd, 0, 0, 0);
    }
    lower_attn_combine(L, w, 0, L->m->n_kv_heads, L->nsplit, L->att_w[w]);
    return L->att_w[w];
}

/* k/v of head h into layer l's cache: appended at pos, or stored in the
 * slot an evicting layer picked; Quest layers then select pages. */
static void lower_kv_write(Lower *L, int w, int l, int h)
{
    uint32_t kc = lower_layer_buf(L, "kc", l), vc = lower_layer_buf(L, "vc", l);
    int cap = layer_cap(L->m, l);
    int64_t hd = L->hd, g = L->G, S = L->m->max_seq;
    if (!cap) {
        lower_kv_append(L, w, kc, vc, h);
    } else {
        int32_t p[2] = {h, cap};
        Access a[5] = {acc_r(L->k, h * hd, (h + 1) * hd), acc_r(L->v, h * hd, (h + 1) * hd),
                       acc_mode(kc, ACC_W, h * cap * hd, (h + 1) * cap * hd),
                       acc_mode(vc, ACC_W, h * cap * hd, (h + 1) * cap * hd),
                       acc_mode(lower_layer_buf(L, "meta", l), ACC_RW, h * (int64_t)(cap + 1),
                                (h + 1) * (int64_t)(cap + 1))};
        sched_op(L->s, w, OP_KV_STORE, p, a);
    }
    if (L->m->attn[l].kind == ATTN_QUEST) {
        int page = layer_page(L->m, l), np = layer_npages(L->m, l);
        int64_t pages = (S + page - 1) / page, base = h * S * hd;
        int32_t p[3] = {h, page, np};
        Access a[4] = {acc_r(L->q, h * g * hd, (h + 1) * g * hd), acc_pos(kc, ACC_R, affine_const(base),
                                                                            (Affine){base + hd, hd}),
                       acc_mode(lower_layer_buf(L, "bounds", l), ACC_RW, h * pages * 2 * hd,
                                (h + 1) * pages * 2 * hd),
                       acc_mode(L->sel, ACC_W, h * (int64_t)np, (h + 1) * (int64_t)np)};
        sched_op(L->s, w, OP_QUEST_SELECT, p, a);
    } else if (L->m->attn[l].kind == ATTN_KASCADE) {
        int k = kascade_list_len(L->m, l);
        int32_t p[4] = {h, k, kascade_budget(L->m, l), attn_topk_ppm(&L->m->attn[l])};
        Access a[4] = {acc_r(L->q, h * g * hd, (h + 1) * g * hd),
                       acc_pos(kc, ACC_R, affine_const(h * S * hd), (Affine){h * S * hd + hd, hd}),
                       acc_mode(L->topksc, ACC_W, h * (g + 1) * S, (h + 1) * (g + 1) * S),
                       acc_mode(lower_layer_buf(L, "kidx", l), ACC_W, h * (int64_t)k, (h + 1) * (int64_t)k)};
        sched_op(L->s, w, OP_TOPK_SELECT, p, a);
    }
}

/* Whether layer l attends over its whole cache (OP_ATTN). */
static bool layer_dense(const ModelDesc *m, int l)
{
    return m->attn[l].kind == ATTN_DENSE && !layer_cap(m, l) && !layer_snap(m, l);
}

/* Split sp of kv head h's attention on layer l: attn over the whole
 * cache (rope: rotating q as it reads it), or attn_sparse over the rows
 * the layer's kind selects (q rotated before). */
static void lower_layer_attn(Lower *L, int w, int l, int h, int sp, int ns, bool rope)
{
    const AttnSpec *as = &L->m->attn[l];
    uint32_t kc = lower_layer_buf(L, "kc", l), vc = lower_layer_buf(L, "vc", l);
    int cap = layer_cap(L->m, l), snap = layer_snap(L->m, l);
    if (layer_dense(L->m, l)) {
        lower_attn(L, w, kc, vc, h, sp, rope);
        return;
    }
    int64_t hd = L->hd, g = L->G, S = L->m->max_seq, e = g * (hd + 2), p0 = ((int64_t)h * ns + sp) * e;
    Access a[5] = {acc_r(L->q, h * g * hd, (h + 1) * g * hd), acc_none, acc_none,
                   acc_mode(L->part, ACC_W, p0, p0 + e), acc_none};
    int32_t p[6] = {h, sp, ns, 0, 0, 0};
    if (cap) {
        bool sc = layer_scores(L->m, l);
        p[3] = SPARSE_SLOTS, p[4] = cap, p[5] = sc;
        a[1] = acc_r(kc, h * cap * hd, (h + 1) * cap * hd);
        a[2] = acc_r(vc, h * cap * hd, (h + 1) * cap * hd);
        if (sc) {
            int64_t r = g * sparse_score_rows(cap, ns);
            a[4] = acc_mode(L->score, ACC_W, (h * ns + sp) * r, (h * ns + sp + 1) * r);
        }
    } else {
        Affine lo = affine_const(h * S * hd), hi = {h * S * hd + hd, hd};
        a[1] = acc_pos(kc, ACC_R, lo, hi);
        a[2] = acc_pos(vc, ACC_R, lo, hi);
        if (snap) {
            int64_t list = layer_snap_list(L->m, l);
            p[3] = SPARSE_SNAP, p[4] = (int32_t)list;
            a[4] = acc_r(lower_layer_buf(L, "snap", l), h * (list + 2), (h + 1) * (list + 2));
        } else if (as->kind == ATTN_SINK_WINDOW || (as->kind == ATTN_KASCADE && l == 0)) {
            bool all = as->kind == ATTN_KASCADE; /* Kascade's layer 0 attends over every row */
            p[3] = SPARSE_SINK_WINDOW, p[4] = all ? 0 : as->sinks, p[5] = all ? (int32_t)S : as->window;
        } else if (as->kind == ATTN_KASCADE || as->kind == ATTN_KASCADE_REUSE) {
            int src = as->kind == ATTN_KASCADE ? l : as->anchor, k = kascade_list_len(L->m, src);
            int lh = as->kind == ATTN_KASCADE ? h : attn_list_head(as, h); /* the anchor's kv head it reads */
            p[3] = SPARSE_ROWS, p[4] = lh, p[5] = k;
            a[4] = acc_r(lower_layer_buf(L, "kidx", src), lh * (int64_t)k, (lh + 1) * (int64_t)k);
        } else {
            int np = layer_npages(L->m, l);
            p[3] = SPARSE_QUEST, p[4] = layer_page(L->m, l), p[5] = np;
            a[4] = acc_r(L->sel, h * (int64_t)np, (h + 1) * (int64_t)np);
        }
    }
    sched_op(L->s, w, OP_ATTN_SPARSE, p, a);
}

/* Layer l's SnapKV step (all kv heads): q into its window, and the
 * compression at the prompt's last step. */
static void lower_kv_snap(Lower *L, int w, int l)
{
    const ModelDesc *m = L->m;
    int C = layer_snap(m, l), W = m->kv[l].window;
    int64_t S = m->max_seq, hd = L->hd, nkv = m->n_kv_heads;
    int32_t p[3] = {C, W, kv_snap_safe(&m->kv[l])};
    Access a[5] = {acc_r(L->q, 0, (int64_t)m->n_heads * hd),
                   acc_r(lower_layer_buf(L, "kc", l), 0, nkv * S * hd),
                   acc_mode(lower_layer_buf(L, "qwin", l), ACC_RW, 0, (int64_t)W * m->n_heads * hd),
                   acc_mode(lower_layer_buf(L, "snap", l), ACC_RW, 0, nkv * (layer_snap_list(m, l) + 2)),
                   acc_mode(L->snapsc, ACC_RW, 0, (nkv + 2) * S)};
    sched_op(L->s, w, OP_KV_SNAP, p, a);
}

/* Layer l's eviction decision for the next step (all kv heads). */
static void lower_kv_evict(Lower *L, int w, int l)
{
    if (layer_snap(L->m, l)) {
        lower_kv_snap(L, w, l);
        return;
    }
    int cap = layer_cap(L->m, l), pol = layer_policy(L->m, l);
    const KvPolicy *kv = &L->m->kv[l];
    int32_t p[5] = {pol, cap, pol == KV_POLICY_STREAMING ? kv->sinks : 0, pol == KV_POLICY_H2O ? kv->window : 0,
                    L->nsplit};
    int64_t nsc = (int64_t)L->m->n_heads * L->nsplit * sparse_score_rows(cap, L->nsplit);
    Access a[3] = {pol == KV_POLICY_STREAMING ? acc_none : acc_r(L->score, 0, nsc),
                   acc_mode(lower_layer_buf(L, "meta", l), ACC_RW, 0, (int64_t)L->m->n_kv_heads * (cap + 1)),
                   pol == KV_POLICY_H2O ? acc_mode(lower_layer_buf(L, "acc", l), ACC_RW, 0,
                                                   (int64_t)L->m->n_kv_heads * cap)
                                        : acc_none};
    sched_op(L->s, w, OP_KV_EVICT, p, a);
}

static void lower_silu_mul(Lower *L, int w, int64_t r0, int64_t r1)
{
    int32_t p[2] = {(int32_t)r0, (int32_t)r1};
    Access a[3] = {acc_r(L->gate, r0, r1), acc_r(L->up, r0, r1), acc_mode(L->hb, ACC_W, r0, r1)};
    sched_op(L->s, w, OP_SILU_MUL, p, a);
}

static void lower_argmax(Lower *L, int w, int64_t r0, int64_t r1, int slot)
{
    int32_t p[3] = {(int32_t)r0, (int32_t)r1, slot};
    Access a[2] = {acc_r(L->logits, r0, r1), acc_mode(L->amax, ACC_W, 2 * slot, 2 * slot + 2)};
    sched_op(L->s, w, OP_ARGMAX, p, a);
}

/* ---- tiling ---- */

/* How many tiles `rows` rows of `row_bytes` each are cut into. */
static int lower_ntiles(const Lower *L, int64_t rows, int64_t row_bytes)
{
    int64_t n = rows * row_bytes / LOWER_MIN_TILE_BYTES;
    n = n < 1 ? 1 : n > L->nw ? L->nw : n;
    return (int)(n > rows ? rows : n);
}

/* First row of tile t of n over `rows` rows (equal sizes, +-1). */
static int64_t lower_tile_lo(int64_t rows, int n, int t)
{
    return rows * t / n;
}

/* The worker of tile t in the current stage. */
static int lower_tile_worker(const Lower *L, int t)
{
    return (L->rot + t) % L->nw;
}

static void lower_rotate(Lower *L, int ntiles)
{
    if (ntiles < L->nw)
        L->rot = (L->rot + ntiles) % L->nw;
}

/* A GEMV stage over the concatenated rows of seg[0..nseg): each worker's
 * tile becomes one gemv per matrix it touches. */
static void lower_gemv_stage(Lower *L, const Seg *seg, int nseg, uint32_t x, uint32_t nw, int64_t k, bool accum,
                             uint32_t ctr)
{
    ASSERT(!L->combine_pending || x == L->att);
    int64_t rows = 0;
    for (int i = 0; i < nseg; i++)
        rows += seg[i].rows;
    int n = lower_ntiles(L, rows, (int64_t)dtype_row_bytes(L->s->bufs[seg[0].w].dtype, k));
    lower_stage_begin(L);
    for (int t = 0; t < n; t++) {
        int w = lower_tile_worker(L, t);
        int64_t a = lower_tile_lo(rows, n, t), b = lower_tile_lo(rows, n, t + 1), base = 0;
        lower_stage_enter(L, w);
        if (t == 0 && L->evict_pending >= 0) {
            lower_kv_evict(L, w, L->evict_pending);
            L->evict_pending = -1;
        }
        uint32_t xw = L->combine_pending ? lower_attn_combine_own(L, w) : x;
        for (int i = 0; i < nseg; base += seg[i++].rows) {
            int64_t r0 = a > base ? a - base : 0, r1 = b - base < seg[i].rows ? b - base : seg[i].rows;
            if (r0 < r1)
                lower_gemv(L, w, &seg[i], xw, nw, r0, r1, k, accum);
        }
    }
    L->combine_pending = false;
    lower_rotate(L, n);
    lower_stage_end(L, ctr);
}

/* ---- stages ---- */

static void lower_embed_stage(Lower *L)
{
    int64_t dim = L->m->dim;
    int n = (int)(dim / LOWER_MIN_EMBED_TILE);
    n = n < 1 ? 1 : n > L->nw ? L->nw : n;
    lower_stage_begin(L);
    for (int t = 0; t < n; t++) {
        int w = lower_tile_worker(L, t);
        int64_t c0 = lower_tile_lo(dim, n, t), c1 = lower_tile_lo(dim, n, t + 1);
        int32_t p[2] = {(int32_t)c0, (int32_t)c1};
        Access a[3] = {acc_r(L->tok, 0, 1), acc_r(L->embed, 0, (int64_t)L->m->vocab_size * dim),
                       acc_mode(L->x, ACC_W, c0, c1)};
        lower_stage_enter(L, w);
        sched_op(L->s, w, OP_EMBED, p, a);
    }
    lower_rotate(L, n);
    lower_stage_end(L, lower_counter(L, "embed"));
}

static void lower_qkv_stage(Lower *L, int l)
{
    const ModelDesc *m = L->m;
    Seg seg[3] = {
        {lower_w(L, l, "wq"), L->q, lower_w(L, l, "bq"), (int64_t)m->n_heads * L->hd},
        {lower_w(L, l, "wk"), L->k, lower_w(L, l, "bk"), (int64_t)m->n_kv_heads * L->hd},
        {lower_w(L, l, "wv"), L->v, lower_w(L, l, "bv"), (int64_t)m->n_kv_heads * L->hd},
    };
    char name[32];
    snprintf(name, sizeof name, "qkv.%d", l);
    lower_gemv_stage(L, seg, 3, L->x, lower_w(L, l, "attn_norm"), m->dim, false, lower_counter(L, name));
}

/* Splits per kv head for nkv heads on nw workers, at most maxsplit: the
 * fewest, from nw / nkv up, whose busiest worker (lower_piece_worker)
 * attends at most LOWER_ATTN_SLACK times its share, nkv / nw heads; else
 * the one that comes closest. 3 heads on 2 workers: 2 splits (1.5 heads
 * each, not 2 and 1); 3 on 132: 44; 8 on 132: 16 (1.03). */
static int lower_attn_nsplit(int nkv, int nw, int maxsplit)
{
    int ns0 = nw / nkv < 1 ? 1 : nw / nkv > maxsplit ? maxsplit : nw / nkv, best = ns0;
    double best_r = 0;
    for (int ns = ns0; ns <= nw && ns <= maxsplit; ns++) {
        int n = nkv * ns, most = (n + nw - 1) / nw;
        double r = (double)most / ns * nw / nkv;
        if (r <= LOWER_ATTN_SLACK)
            return ns;
        if (best_r == 0 || r < best_r)
            best = ns, best_r = r;
    }
    return best;
}

/* The worker of piece i = h*ns + s of the attention stage's n pieces:
 * piece i on worker i while there are enough workers, else contiguous
 * runs of pieces, one run per worker (the runs differ by at most one). */
static int lower_piece_worker(const Lower *L, int i, int n)
{
    return n <= L->nw ? i : (int)((int64_t)i * L->nw / n);
}

/* Worker w's pieces of kv head h on layer l (ns splits, pieces [i0, i1)
 * of the head on w). A dense layer's splits rotate q as they read it, and
 * only the last split reads row pos: the last piece's worker ropes k and
 * appends it before attending, and no split waits. On other layers the
 * first piece ropes q and k, writes the cache and, when other workers
 * hold pieces of the head, signals kv.l.h; the others wait for it. The
 * worker of the last piece waits for the other workers' pieces (attn.l.h)
 * and combines; the others signal attn.l.h. */
static void lower_attn_pieces(Lower *L, int w, int l, int h, int ns, int i0, int i1, const uint32_t *kv_ctr,
                              const uint32_t *attn_ctr, int *ncomb)
{
    int n = L->m->n_kv_heads * ns, first = h * ns, last = first + ns - 1;
    bool shared = lower_piece_worker(L, first, n) != lower_piece_worker(L, last, n), dense = layer_dense(L->m, l);
    lower_stage_enter(L, w);
    if (dense) {
        if (i1 - 1 == last) {
            lower_rope(L, w, L->k, h, h + 1);
            lower_kv_write(L, w, l, h);
        }
    } else if (i0 == first) {
        lower_rope(L, w, L->q, h * L->G, (h + 1) * L->G);
        lower_rope(L, w, L->k, h, h + 1);
        lower_kv_write(L, w, l, h);
        if (shared)
            lower_signal(L, w, kv_ctr[h], 1);
    } else {
        lower_join(L, w, kv_ctr[h]);
    }
    for (int i = i0; i < i1; i++)
        lower_layer_attn(L, w, l, h, i - first, ns, dense);
    if (L->fold) /* o's workers merge (lower_gemv_stage) */
        return;
    if (i1 - 1 < last) {
        lower_signal(L, w, attn_ctr[h], 1);
        return;
    }
    if (i0 != first)
        lower_join(L, w, attn_ctr[h]);
    lower_attn_combine(L, w, h, 1, ns, L->att);
    ncomb[w]++;
}

/* The attention stage of layer l: kv head h is cut into ns splits, and
 * piece h*ns + s goes to lower_piece_worker. Each worker takes its heads
 * last to first: a head it shares with the next worker (whose first
 * piece it holds) comes first, so that kv.l.h is signalled before any
 * wait of the stage; a head it shares with the worker before comes last.
 * Workers are emitted in order, so every join sees all its signals. */
static void lower_attn_stage(Lower *L, int l)
{
    int nkv = L->m->n_kv_heads, ns = L->nsplit, n = nkv * ns;
    char name[48];
    uint32_t *kv_ctr = xcalloc((size_t)nkv, sizeof *kv_ctr), *attn_ctr = xcalloc((size_t)nkv, sizeof *attn_ctr);
    int *ncomb = xcalloc((size_t)L->nw, sizeof *ncomb);
    for (int h = 0; h < nkv && ns > 1; h++) {
        if (!layer_dense(L->m, l)) { /* a dense layer's splits do not wait for the cache (lower_attn_pieces) */
            snprintf(name, sizeof name, "kv.%d.%d", l, h);
            kv_ctr[h] = lower_counter(L, name);
        }
        if (!L->fold) {
            snprintf(name, sizeof name, "attn.%d.%d", l, h);
            attn_ctr[h] = lower_counter(L, name);
        }
    }
    snprintf(name, sizeof name, L->fold ? "attn.%d" : "comb.%d", l);
    uint32_t comb = lower_counter(L, name);
    lower_stage_begin(L);
    for (int w = 0, i = 0; w < L->nw && i < n; w++) {
        int i0 = i;
        while (i < n && lower_piece_worker(L, i, n) == w)
            i++;
        for (int h = (i - 1) / ns; i0 < i && h >= i0 / ns; h--) {
            int a = h * ns > i0 ? h * ns : i0, b = (h + 1) * ns < i ? (h + 1) * ns : i;
            lower_attn_pieces(L, w, l, h, ns, a, b, kv_ctr, attn_ctr, ncomb);
        }
    }
    if (L->fold) {
        lower_stage_end(L, comb); /* every worker with pieces */
        L->combine_pending = true;
    } else {
        for (int w = 0; w < L->nw; w++)
            if (ncomb[w])
                lower_signal(L, w, comb, (uint32_t)ncomb[w]);
        L->prev = comb;
    }
    free(kv_ctr);
    free(attn_ctr);
    free(ncomb);
}

static void lower_ffn_stage(Lower *L, int l)
{
    const ModelDesc *m = L->m;
    int64_t rows = m->hidden_dim, dim = m->dim;
    Seg g = {lower_w(L, l, "w_gate"), L->gate, BUF_NONE, rows}, u = {lower_w(L, l, "w_up"), L->up, BUF_NONE, rows};
    int n = lower_ntiles(L, rows, (int64_t)(dtype_row_bytes(L->s->bufs[g.w].dtype, dim) +
                                            dtype_row_bytes(L->s->bufs[u.w].dtype, dim)));
    uint32_t nw = lower_w(L, l, "ffn_norm");
    char name[32];
    snprintf(name, sizeof name, "ffn.%d", l);
    uint32_t c = lower_counter(L, name);
    lower_stage_begin(L);
    for (int t = 0; t < n; t++) {
        int w = lower_tile_worker(L, t);
        int64_t r0 = lower_tile_lo(rows, n, t), r1 = lower_tile_lo(rows, n, t + 1);
        lower_stage_enter(L, w);
        lower_gemv(L, w, &g, L->x, nw, r0, r1, dim, false);
        lower_gemv(L, w, &u, L->x, nw, r0, r1, dim, false);
        lower_silu_mul(L, w, r0, r1);
    }
    lower_rotate(L, n);
    lower_stage_end(L, c);
}

/* Fused q/k/v + attention when kv heads divide evenly over the workers:
 * worker h % W projects the q rows of group h and k/v rows of head h, then
 * ropes, appends, attends and combines with no wait in between. */
static void lower_fused_attn_stage(Lower *L, int l)
{
    const ModelDesc *m = L->m;
    int64_t hd = L->hd, g = L->G;
    Seg q = {lower_w(L, l, "wq"), L->q, lower_w(L, l, "bq"), (int64_t)m->n_heads * hd};
    Seg k = {lower_w(L, l, "wk"), L->k, lower_w(L, l, "bk"), (int64_t)m->n_kv_heads * hd};
    Seg v = {lower_w(L, l, "wv"), L->v, lower_w(L, l, "bv"), (int64_t)m->n_kv_heads * hd};
    uint32_t nw = lower_w(L, l, "attn_norm");
    char name[32];
    snprintf(name, sizeof name, "comb.%d", l);
    uint32_t comb = lower_counter(L, name);
    lower_stage_begin(L);
    for (int h = 0; h < m->n_kv_heads; h++) {
        int w = h % L->nw;
        lower_stage_enter(L, w);
        lower_gemv(L, w, &q, L->x, nw, h * g * hd, (h + 1) * g * hd, m->dim, false);
        lower_gemv(L, w, &k, L->x, nw, h * hd, (h + 1) * hd, m->dim, false);
        lower_gemv(L, w, &v, L->x, nw, h * hd, (h + 1) * hd, m->dim, false);
        lower_rope(L, w, L->q, h * L->G, (h + 1) * L->G);
        lower_rope(L, w, L->k, h, h + 1);
        lower_kv_write(L, w, l, h);
        lower_layer_attn(L, w, l, h, 0, 1, false);
        lower_attn_combine(L, w, h, 1, 1, L->att);
    }
    lower_stage_end(L, comb);
}

static void lower_layer(Lower *L, int l)
{
    const ModelDesc *m = L->m;
    char name[32];
    if (L->fused) {
        lower_fused_attn_stage(L, l);
    } else {
        lower_qkv_stage(L, l);
        lower_attn_stage(L, l);
    }
    if (layer_cap(m, l) || layer_snap(m, l))
        L->evict_pending = l; /* after comb.l's join, before layer l+1 reuses score or q */
    Seg o = {lower_w(L, l, "wo"), L->x, BUF_NONE, m->dim};
    snprintf(name, sizeof name, "o.%d", l);
    lower_gemv_stage(L, &o, 1, L->att, BUF_NONE, (int64_t)m->n_heads * L->hd, true, lower_counter(L, name));
    lower_ffn_stage(L, l);
    Seg dn = {lower_w(L, l, "w_down"), L->x, BUF_NONE, m->dim};
    snprintf(name, sizeof name, "down.%d", l);
    lower_gemv_stage(L, &dn, 1, L->hb, BUF_NONE, m->hidden_dim, true, lower_counter(L, name));
}

/* LM head with the final norm, an argmax per tile, and the combine on the
 * worker of tile 0. */
static void lower_lm_stage(Lower *L)
{
    const ModelDesc *m = L->m;
    int64_t rows = m->vocab_size;
    int n = L->lm_tiles, w0 = lower_tile_worker(L, 0);
    Seg sg = {L->lm_head, L->logits, BUF_NONE, rows};
    uint32_t c = lower_counter(L, "lm");
    lower_stage_begin(L);
    for (int t = 0; t < n; t++) {
        int w = lower_tile_worker(L, t);
        int64_t r0 = lower_tile_lo(rows, n, t), r1 = lower_tile_lo(rows, n, t + 1);
        lower_stage_enter(L, w);
        lower_gemv(L, w, &sg, L->x, L->final_norm, r0, r1, m->dim, false);
        lower_argmax(L, w, r0, r1, t);
    }
    lower_rotate(L, n);
    lower_stage_end(L, c);
    lower_join(L, w0, c);
    int32_t p[1] = {n};
    Access a[2] = {acc_r(L->amax, 0, 2 * (int64_t)n), acc_mode(L->next, ACC_W, 0, 1)};
    sched_op(L->s, w0, OP_ARGMAX_COMBINE, p, a);
}

/* ---- buffers ---- */

static void lower_weights(Lower *L)
{
    const ModelDesc *m = L->m;
    int64_t dim = m->dim, qd = (int64_t)m->n_heads * L->hd, kvd = (int64_t)m->n_kv_heads * L->hd, hid = m->hidden_dim;
    L->embed = lower_buf(L, "embed", lower_wdtype(L, "embed"), BUF_WEIGHT, 2, m->vocab_size, dim, 0, 0);
    for (int l = 0; l < m->n_layers; l++) {
        lower_wbuf(L, l, "attn_norm", 1, dim, 0);
        lower_wbuf(L, l, "wq", 2, qd, dim);
        lower_wbuf(L, l, "wk", 2, kvd, dim);
        lower_wbuf(L, l, "wv", 2, kvd, dim);
        if (m->qkv_bias) {
            lower_wbuf(L, l, "bq", 1, qd, 0);
            lower_wbuf(L, l, "bk", 1, kvd, 0);
            lower_wbuf(L, l, "bv", 1, kvd, 0);
        }
        lower_wbuf(L, l, "wo", 2, dim, qd);
        lower_wbuf(L, l, "ffn_norm", 1, dim, 0);
        lower_wbuf(L, l, "w_gate", 2, hid, dim);
        lower_wbuf(L, l, "w_up", 2, hid, dim);
        lower_wbuf(L, l, "w_down", 2, dim, hid);
    }
    L->final_norm = lower_buf(L, "final_norm", DT_F32, BUF_WEIGHT, 1, dim, 0, 0, 0);
    L->lm_head = !lower_head_separate(L) ? L->embed
                                         : lower_buf(L, "lm_head", lower_wdtype(L, "lm_head"), BUF_WEIGHT, 2,
                                                     m->vocab_size, dim, 0, 0);
    L->rope = lower_buf(L, "rope", DT_F32, BUF_WEIGHT, 3, m->max_seq, L->hd / 2, 2, 0);
}

static void lower_buffers(Lower *L)
{
    const ModelDesc *m = L->m;
    int64_t qd = (int64_t)m->n_heads * L->hd, kvd = (int64_t)m->n_kv_heads * L->hd;
    lower_weights(L);
    L->tok = lower_buf(L, "tok", DT_I32, BUF_IO, 1, 1, 0, 0, 0);
    L->logits = lower_buf(L, "logits", DT_F32, BUF_IO, 1, m->vocab_size, 0, 0, 0);
    L->next = lower_buf(L, "next", DT_I32, BUF_IO, 1, 1, 0, 0, 0);
    int maxnp = 0;
    int64_t nscore = 0; /* score entries per q head: the most of any evicting layer */
    bool snaps = false, topk = false;
    for (int l = 0; l < m->n_layers; l++) {
        char n[32];
        int cap = layer_cap(m, l), rows = cap ? cap : m->max_seq;
        snprintf(n, sizeof n, "kc.%d", l);
        lower_buf(L, n, m->kv_dtype, BUF_KV, 3, m->n_kv_heads, rows, L->hd, 0);
        snprintf(n, sizeof n, "vc.%d", l);
        lower_buf(L, n, m->kv_dtype, BUF_KV, 3, m->n_kv_heads, rows, L->hd, 0);
        if (cap) {
            snprintf(n, sizeof n, "meta.%d", l);
            lower_buf(L, n, DT_I32, BUF_STATE, 2, m->n_kv_heads, cap + 1, 0, 0);
        }
        if (m->kv[l].kind == KV_H2O && cap) { /* a budget of max_seq or more never evicts */
            snprintf(n, sizeof n, "acc.%d", l);
            lower_buf(L, n, DT_F32, BUF_STATE, 2, m->n_kv_heads, cap, 0, 0);
        }
        if (layer_snap(m, l)) {
            snprintf(n, sizeof n, "snap.%d", l);
            lower_buf(L, n, DT_I32, BUF_STATE, 2, m->n_kv_heads, layer_snap_list(m, l) + 2, 0, 0);
            snprintf(n, sizeof n, "qwin.%d", l);
            lower_buf(L, n, DT_F32, BUF_STATE, 3, m->kv[l].window, m->n_heads, L->hd, 0);
            snaps = true;
        }
        if (layer_scores(m, l) && L->nsplit * sparse_score_rows(cap, L->nsplit) > nscore)
            nscore = L->nsplit * sparse_score_rows(cap, L->nsplit);
        if (m->attn[l].kind == ATTN_KASCADE) {
            snprintf(n, sizeof n, "kidx.%d", l);
            lower_buf(L, n, DT_I32, BUF_SCRATCH, 2, m->n_kv_heads, kascade_list_len(m, l), 0, 0);
            topk = true;
        }
        if (m->attn[l].kind == ATTN_QUEST) {
            int page = layer_page(m, l);
            snprintf(n, sizeof n, "bounds.%d", l);
            lower_buf(L, n, DT_F32, BUF_STATE, 4, m->n_kv_heads, (m->max_seq + page - 1) / page, 2, L->hd);
            maxnp = layer_npages(m, l) > maxnp ? layer_npages(m, l) : maxnp;
        }
    }
    L->sel = maxnp ? lower_buf(L, "sel", DT_I32, BUF_SCRATCH, 2, m->n_kv_heads, maxnp, 0, 0) : BUF_NONE;
    L->score = nscore ? lower_buf(L, "score", DT_F32, BUF_SCRATCH, 2, m->n_heads, nscore, 0, 0) : BUF_NONE;
    L->snapsc = snaps ? lower_buf(L, "snapsc", DT_F32, BUF_STATE, 2, m->n_kv_heads + 2, m->max_seq, 0, 0) : BUF_NONE;
    L->topksc = topk ? lower_buf(L, "topksc", DT_F32, BUF_SCRATCH, 2, (int64_t)m->n_heads + m->n_kv_heads,
                                 m->max_seq, 0, 0)
                     : BUF_NONE;
    L->x = lower_buf(L, "x", DT_F32, BUF_SCRATCH, 1, m->dim, 0, 0, 0);
    L->q = lower_buf(L, "q", DT_F32, BUF_SCRATCH, 1, qd, 0, 0, 0);
    L->k = lower_buf(L, "k", DT_F32, BUF_SCRATCH, 1, kvd, 0, 0, 0);
    L->v = lower_buf(L, "v", DT_F32, BUF_SCRATCH, 1, kvd, 0, 0, 0);
    /* with fold, each worker of o merges into its own (lower_attn_combine_own) */
    L->att = L->fold ? BUF_NONE : lower_buf(L, "att", DT_F32, BUF_SCRATCH, 1, qd, 0, 0, 0);
    L->part = lower_buf(L, "part", DT_F32, BUF_SCRATCH, 4, m->n_kv_heads, L->nsplit, L->G, L->hd + 2);
    L->gate = lower_buf(L, "gate", DT_F32, BUF_SCRATCH, 1, m->hidden_dim, 0, 0, 0);
    L->up = lower_buf(L, "up", DT_F32, BUF_SCRATCH, 1, m->hidden_dim, 0, 0, 0);
    L->hb = lower_buf(L, "hb", DT_F32, BUF_SCRATCH, 1, m->hidden_dim, 0, 0, 0);
    L->amax = lower_buf(L, "amax", DT_F32, BUF_SCRATCH, 2, L->lm_tiles, 2, 0, 0);
}

/* ---- checks ---- */

static bool lower_fail(const ModelDesc *m, Diag *d, const char *fmt, const char *what, long long v)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, what, v);
    diag_file_error(d, m->path ? m->path : m->name, "cannot lower model '%s': %s", m->name ? m->name : "?", msg);
    return false;
}

/* What the lowering (and the backends behind it) support so far. */
static bool lower_check(const ModelDesc *m, int workers, Diag *d)
{
    const struct {
        const char *what;
        long long v;
    } pos[] = {{"dim", m->dim},         {"hidden_dim", m->hidden_dim}, {"n_layers", m->n_layers},
               {"n_heads", m->n_heads}, {"n_kv_heads", m->n_kv_heads}, {"head_dim", m->head_dim},
               {"vocab_size", m->vocab_size}, {"max_seq", m->max_seq}, {"workers", workers}};
    bool ok = true;
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0 || pos[i].v > INT32_MAX / 4)
            ok = lower_fail(m, d, "%s must be positive and below 2^29 (got %lld)", pos[i].what, pos[i].v);
    if (!ok)
        return false;
    if (m->n_heads % m->n_kv_heads)
        ok = lower_fail(m, d, "%s (%lld) must divide n_heads", "n_kv_heads", m->n_kv_heads);
    if (m->head_dim % 2)
        ok = lower_fail(m, d, "%s %lld is odd (RoPE rotates pairs)", "head_dim", m->head_dim);
    if (m->n_layers > MODEL_MAX_LAYERS)
        ok = lower_fail(m, d, "%s %lld exceeds MODEL_MAX_LAYERS", "n_layers", m->n_layers);
    if (workers > 65535)
        ok = lower_fail(m, d, "%s %lld is more than 65535", "workers", workers);
    const struct {
        const char *what;
        int64_t rows;
    } mats[] = {{"the embedding (vocab_size x dim)", m->vocab_size},
                {"w_gate, w_up and w_down (hidden_dim x dim)", m->hidden_dim},
                {"wq and wo (n_heads * head_dim x dim)", (int64_t)m->n_heads * m->head_dim}};
    for (size_t i = 0; ok && i < sizeof mats / sizeof mats[0]; i++)
        if (mats[i].rows * m->dim > INT32_MAX)
            ok = lower_fail(m, d, "not supported yet: %s: %lld elements in one matrix, more than 2^31 - 1", mats[i].what,
                            (long long)(mats[i].rows * m->dim));
    if (m->act_dtype != DT_F32)
        ok = lower_fail(m, d, "%s: activation dtype %lld is not f32", "not supported yet", m->act_dtype);
    if (!dtype_is_cache(m->kv_dtype))
        ok = lower_fail(m, d, "%s: KV cache dtype %lld", "not supported", m->kv_dtype);
    for (int c = 0; c < TCLASS_COUNT; c++)
        if (quant_spec_dtype(m->quant[c], DT_F32) < 0)
            ok = lower_fail(m, d, "%s: quantization group of tensor class %lld", "not supported", c);
    for (int l = 0; ok && l < m->n_layers; l++) {
        const AttnSpec *a = &m->attn[l];
        const KvPolicy *kv = &m->kv[l];
        if (kv->kind != KV_FULL && a->kind != ATTN_DENSE)
            ok = lower_fail(m, d, "%s (layer %lld): an evicting KV cache needs dense attention", "not supported", l);
        else if ((a->kind == ATTN_SINK_WINDOW && (a->sinks < 0 || a->window < 1)) ||
                 (a->kind == ATTN_QUEST && (a->page < 1 || a->budget < 1)) ||
                 (a->kind == ATTN_KASCADE && (a->budget < 1 || !(a->fraction >= 0.0 && a->fraction <= 1.0))))
            ok = lower_fail(m, d, "%s (layer %lld): sinks >= 0, window, page and budget >= 1, fraction in [0, 1]",
                            "bad sparse attention params", l);
        else if (a->kind == ATTN_KASCADE_REUSE &&
                 (a->anchor < 0 || a->anchor >= l || m->attn[a->anchor].kind != ATTN_KASCADE))
            ok = lower_fail(m, d, "%s (layer %lld): a kascade_reuse layer's anchor is an earlier kascade layer",
                            "bad sparse attention params", l);
        else if (a->head_map && (a->kind != ATTN_KASCADE_REUSE || m->n_kv_heads > ATTN_MAX_HEAD_MAP))
            ok = lower_fail(m, d, "%s (layer %lld): a kv head map is for kascade_reuse layers",
                            "bad sparse attention params", l);
        for (int h = 0; ok && a->head_map && h < m->n_kv_heads; h++)
            if (a->heads[h] >= m->n_kv_heads)
                ok = lower_fail(m, d, "%s (layer %lld): the kv head map names a kv head past the model's",
                                "bad sparse attention params", l);
        if (!ok)
            break;
        if ((kv->kind == KV_STREAMING && (kv->sinks < 0 || kv->window < 1)) ||
            ((kv->kind == KV_H2O || kv->kind == KV_TOVA) && kv->budget < 1) ||
            (kv->kind == KV_H2O && (kv->window < 0 || kv->window >= kv->budget)) ||
            (kv->kind == KV_SNAPKV && (kv->window < 1 || kv->window >= kv->budget)) ||
            (kv->adaptive && (kv->kind != KV_SNAPKV || !(kv->alpha >= 0.0 && kv->alpha <= 1.0))))
            ok = lower_fail(m, d,
                            "%s (layer %lld): sinks >= 0, window >= 1 (h2o: 0 <= window < budget; snapkv: 1 <= "
                            "window < budget, adaptive in [0, 1]), budget >= 1",
                            "bad KV policy params", l);
    }
    return ok;
}

static ModelShape lower_shape(const ModelDesc *m)
{
    return (ModelShape){m->dim, m->hidden_dim, m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim,
                        m->vocab_size, m->max_seq, m->norm_eps, (int)m->rope_pairing};
}

Schedule *lower_model(const ModelDesc *m, const Target *t, int workers, Diag *d)
{
    return lower_model_weights(m, NULL, t, workers, d);
}

Schedule *lower_model_weights(const ModelDesc *m, const Weights *w, const Target *t, int workers, Diag *d)
{
    int nw = workers > 0 ? workers : m->workers > 0 ? m->workers : t->default_workers;
    if (!lower_check(m, nw, d))
        return NULL;
    Lower L = {.m = m, .w = w, .nw = nw, .hd = m->head_dim, .G = m->n_heads / m->n_kv_heads, .prev = UINT32_MAX,
               .evict_pending = -1};
    L.fused = m->n_kv_heads % nw == 0;
    L.fold = !L.fused && m->attn_combine == COMBINE_IN_O;
    L.att_w = xmalloc((size_t)nw * sizeof *L.att_w);
    for (int i = 0; i < nw; i++)
        L.att_w[i] = BUF_NONE;
    int maxsplit = (m->max_seq + LOWER_ATTN_BLOCK - 1) / LOWER_ATTN_BLOCK;
    L.nsplit = L.fused ? 1 : lower_attn_nsplit(m->n_kv_heads, nw, maxsplit);
    L.s = sched_new(m->name ? m->name : "model", t->name, nw);
    L.s->shape = lower_shape(m);
    L.in_stage = xcalloc((size_t)nw, sizeof *L.in_stage);
    L.lm_tiles = lower_ntiles(&L, m->vocab_size, (int64_t)dtype_row_bytes(lower_wdtype(&L, "lm_head"), m->dim));
    lower_buffers(&L);
    lower_embed_stage(&L);
    for (int l = 0; l < m->n_layers; l++)
        lower_layer(&L, l);
    lower_lm_stage(&L);
    free(L.in_stage);
    free(L.att_w);
    free(L.nsig);
    if (t->kind != TARGET_CPU) /* one error, not one per instruction (host-cuda too) */
        for (uint32_t b = 0; b < L.s->nbufs; b++)
            if (L.s->bufs[b].cls == BUF_WEIGHT && dtype_is_a8(L.s->bufs[b].dtype)) {
                diag_file_error(d, m->path ? m->path : m->name,
                                "matrix '%s' is %s: int8-input formats (w8a8, w4a8, a8) run on the CPU backend "
                                "only (--target cpu); for %s, choose an A16 format (none, w8a16, w4a16)",
                                L.s->bufs[b].name, dtype_name(L.s->bufs[b].dtype), t->name);
                sched_free(L.s);
                return NULL;
            }
    return L.s;
}

Schedule *lower_model_stored(const ModelDesc *m, const Target *t, int workers, Diag *d)
{
    Weights w;
    if (!weights_load_ex(&w, m, WEIGHTS_DTYPES_ONLY, NULL, d))
        return NULL;
    Schedule *s = lower_model_weights(m, &w, t, workers, d);
    weights_free(&w);
    return s;
}
