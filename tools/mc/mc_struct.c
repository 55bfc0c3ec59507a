/*
 * mc_struct.c - the model checker's own structure checks, written from the
 * op meanings and layouts in ops.h (not from op_footprint): what each op
 * touches, that the declared accesses say exactly that, bounds over all
 * pos (ranges are affine, so the extremes at pos 0 and max_seq-1 decide),
 * no writes to weights, dtypes (f32 activations, i32 token ids, eviction
 * meta, quest page lists and SnapKV's snap, f32/f16/bf16 KV caches with
 * an instruction's k and v rows alike), the layouts of the KV caches
 * (dense or slots), rope table, eviction state, quest bounds and SnapKV
 * state, no wait >= 0 or signal +0, the shape line against the buffers (a
 * K and a V cache per layer, a [vocab, dim] embedding table), and
 * residency.
 */
#include "tools/mc/mc_int.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

bool mc_fail(Mc *m, bool *flag, const char *fmt, ...)
{
    *flag = true;
    if (!m->r->why[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->r->why, sizeof m->r->why, fmt, ap);
        va_end(ap);
    }
    return false;
}

static Access span(int mode, int64_t lo, int64_t hi)
{
    return (Access){.mode = (uint8_t)mode, .lo = {lo, 0}, .hi = {hi, 0}};
}

static Access span_pos(int mode, int64_t c, int64_t k, int64_t len)
{
    return (Access){.mode = (uint8_t)mode, .lo = {c, k}, .hi = {c + len, k}};
}

/* Rows [0, pos] of kv head h in a [n_kv_heads][S][hd] cache. */
static Access cache_rows(const ModelShape *sh, int64_t h)
{
    int64_t hd = sh->head_dim, S = sh->max_seq;
    return (Access){.mode = ACC_R, .lo = {h * S * hd, 0}, .hi = {h * S * hd + hd, hd}};
}

/* Score entries per split and q head of an evicting layer of cap slots
 * read in ns splits (ops.h): the blocks of SPARSE_BLOCK slots of a whole
 * cache, shared out over the splits, rounded up. */
static int64_t mc_score_rows(int64_t cap, int64_t ns)
{
    int64_t blocks = (cap + SPARSE_BLOCK - 1) / SPARSE_BLOCK;
    return SPARSE_BLOCK * ((blocks + ns - 1) / ns);
}

/* ATTN_SPARSE h s nsplit kind a b: the rows `kind` selects lie in head h's
 * rows [0, pos] (sink_window, quest, snap, rows) or in its cap = a slots
 * (slots); aux is absent, sel[h] (quest, read), split s's piece of the
 * scores of h's q heads (slots, b = 1), snap[h] (snap, read) or the list
 * of kv head a (rows, read). */
static bool mc_attn_sparse(const ModelShape *sh, const int32_t *p, Access *e, bool *present)
{
    int64_t hd = sh->head_dim, S = sh->max_seq, G = sh->n_kv_heads > 0 ? sh->n_heads / sh->n_kv_heads : 0;
    int64_t h = p[0], sp = p[1], ns = p[2], kind = p[3], a = p[4], b = p[5];
    bool ok = h >= 0 && h < sh->n_kv_heads && sp >= 0 && sp < ns;
    switch (kind) {
    case SPARSE_SINK_WINDOW: ok &= a >= 0 && b > 0; break;     /* the window holds pos itself */
    case SPARSE_QUEST: ok &= a > 0 && a <= S && b > 0; break;
    case SPARSE_SLOTS: ok &= a > 0 && a <= S && (b == 0 || b == 1); break;
    case SPARSE_SNAP: ok &= a > 0 && a <= S && b == 0; break;
    case SPARSE_ROWS: ok &= a >= 0 && a < sh->n_kv_heads && b > 0 && b <= S; break;
    default: return false;
    }
    if (!ok)
        return false;
    e[0] = span(ACC_R, h * G * hd, (h + 1) * G * hd);
    e[1] = kind == SPARSE_SLOTS ? span(ACC_R, h * a * hd, (h + 1) * a * hd) : cache_rows(sh, h), e[2] = e[1];
    e[3] = span(ACC_W, (h * ns + sp) * G * (hd + 2), (h * ns + sp + 1) * G * (hd + 2));
    present[4] = kind == SPARSE_QUEST || kind == SPARSE_SNAP || kind == SPARSE_ROWS || (kind == SPARSE_SLOTS && b == 1);
    if (kind == SPARSE_QUEST)
        e[4] = span(ACC_R, h * b, (h + 1) * b);
    else if (kind == SPARSE_ROWS)
        e[4] = span(ACC_R, a * b, (a + 1) * b);
    else if (kind == SPARSE_SNAP)
        e[4] = span(ACC_R, h * (a + 2), (h + 1) * (a + 2));
    else if (kind == SPARSE_SLOTS) {
        int64_t piece = G * mc_score_rows(a, ns);
        e[4] = span(ACC_W, (h * ns + sp) * piece, (h * ns + sp + 1) * piece);
    }
    return true;
}

/* KV_EVICT policy cap sinks window nsplit: every kv head's meta, H2O's
 * acc, and all the pieces of the layer's scores for H2O and TOVA. */
static bool mc_kv_evict(const ModelShape *sh, const int32_t *p, Access *e, bool *present)
{
    int64_t kv = sh->n_kv_heads, pol = p[0], cap = p[1], sinks = p[2], window = p[3], ns = p[4];
    if (pol < 0 || pol >= KV_POLICY_COUNT || cap <= 0 || cap > sh->max_seq || sinks < 0 || window < 0 || ns <= 0)
        return false;
    e[0] = span(ACC_R, 0, sh->n_heads * ns * mc_score_rows(cap, ns)), present[0] = pol != KV_POLICY_STREAMING;
    e[1] = span(ACC_RW, 0, kv * (cap + 1));
    e[2] = span(ACC_RW, 0, kv * cap), present[2] = pol == KV_POLICY_H2O;
    return (pol != KV_POLICY_STREAMING || sinks < cap) && (pol != KV_POLICY_H2O || window < cap);
}

/* KV_SNAP budget window safe: all q heads' q, any alive row of any kv
 * head (the whole cache), and the layer's qwin, snap and sc, all of them. */
static bool mc_kv_snap(const ModelShape *sh, const int32_t *p, Access *e)
{
    int64_t kv = sh->n_kv_heads, hd = sh->head_dim, S = sh->max_seq, budget = p[0], window = p[1], safe = p[2];
    if (window <= 0 || window >= budget || budget > S || safe < 0)
        return false;
    e[0] = span(ACC_R, 0, sh->n_heads * hd);
    e[1] = span(ACC_R, 0, kv * S * hd);
    e[2] = span(ACC_RW, 0, window * sh->n_heads * hd);
    e[3] = span(ACC_RW, 0, kv * (snap_list_cap(budget, safe, kv, S) + 2));
    e[4] = span(ACC_RW, 0, (kv + 2) * S);
    return true;
}

/* Pages of a quest layer's bounds: ceil(S / page). */
static int64_t quest_pages(const ModelShape *sh, int64_t page)
{
    return (sh->max_seq + page - 1) / page;
}

/* What op `in` touches per ops.h; false if the params make no sense. */
static bool mc_expected(const Schedule *s, const Inst *in, Access *e, bool *present)
{
    const ModelShape *sh = &s->shape;
    const int32_t *p = in->p;
    int64_t hd = sh->head_dim, S = sh->max_seq, G = sh->n_kv_heads > 0 ? sh->n_heads / sh->n_kv_heads : 0;
    for (int i = 0; i < OP_MAX_OPERANDS; i++)
        present[i] = true;
    switch (in->op) {
    case OP_EMBED:
        e[0] = span(ACC_R, 0, 1), e[1] = span(ACC_R, 0, (int64_t)sh->vocab_size * sh->dim), e[2] = span(ACC_W, p[0], p[1]);
        return p[0] >= 0 && p[0] < p[1] && p[1] <= sh->dim;
    case OP_RMSNORM:
        e[0] = span(ACC_R, 0, p[0]), e[1] = span(ACC_R, 0, p[0]), e[2] = span(ACC_W, 0, p[0]);
        return p[0] > 0;
    case OP_GEMV:
        e[0] = span(ACC_R, (int64_t)p[0] * p[2], (int64_t)p[1] * p[2]);
        e[1] = span(ACC_R, 0, p[2]);
        e[2] = span((p[3] & GEMV_ACCUM) ? ACC_RW : ACC_W, p[0], p[1]);
        e[3] = span(ACC_R, 0, p[2]), present[3] = (p[3] & GEMV_NORM) != 0;
        e[4] = span(ACC_R, p[0], p[1]), present[4] = (p[3] & GEMV_BIAS) != 0;
        return p[0] >= 0 && p[0] < p[1] && p[2] > 0 && (p[3] & ~7) == 0;
    case OP_ROPE:
        e[0] = span(ACC_RW, (int64_t)p[0] * hd, (int64_t)p[1] * hd);
        e[1] = span_pos(ACC_R, 0, hd, hd);
        return p[0] >= 0 && p[0] < p[1] && hd % 2 == 0;
    case OP_KV_APPEND:
        e[0] = span(ACC_R, p[0] * hd, (p[0] + 1) * hd), e[1] = e[0];
        e[2] = span_pos(ACC_W, p[0] * S * hd, hd, hd), e[3] = e[2];
        return p[0] >= 0 && p[0] < sh->n_kv_heads;
    case OP_ATTN: /* the last split reads rows [0, pos], the others [0, pos): the last block is the last split's */
        e[0] = span(ACC_R, p[0] * G * hd, (p[0] + 1) * G * hd);
        e[1] = (Access){.mode = ACC_R, .lo = {p[0] * S * hd, 0}, .hi = {p[0] * S * hd + (p[1] == p[2] - 1) * hd, hd}};
        e[2] = e[1];
        e[3] = span(ACC_W, ((int64_t)p[0] * p[2] + p[1]) * G * (hd + 2), ((int64_t)p[0] * p[2] + p[1] + 1) * G * (hd + 2));
        e[4] = span_pos(ACC_R, 0, hd, hd), present[4] = p[4] == 1; /* rope: the table's row pos */
        return p[0] >= 0 && p[0] < sh->n_kv_heads && p[1] >= 0 && p[1] < p[2] && p[3] > 0 && (p[4] == 0 || p[4] == 1);
    case OP_ATTN_COMBINE:
        e[0] = span(ACC_R, (int64_t)p[0] * p[1] * G * (hd + 2), (int64_t)(p[0] + p[2]) * p[1] * G * (hd + 2));
        e[1] = span(ACC_W, p[0] * G * hd, (int64_t)(p[0] + p[2]) * G * hd);
        return p[0] >= 0 && p[2] > 0 && (int64_t)p[0] + p[2] <= sh->n_kv_heads && p[1] > 0;
    case OP_SILU_MUL:
        e[0] = span(ACC_R, p[0], p[1]), e[1] = e[0], e[2] = span(ACC_W, p[0], p[1]);
        return p[0] >= 0 && p[0] < p[1];
    case OP_ADD:
        e[0] = span(ACC_RW, p[0], p[1]), e[1] = span(ACC_R, p[0], p[1]);
        return p[0] >= 0 && p[0] < p[1];
    case OP_ARGMAX:
        e[0] = span(ACC_R, p[0], p[1]), e[1] = span(ACC_W, 2 * (int64_t)p[2], 2 * (int64_t)p[2] + 2);
        return p[0] >= 0 && p[0] < p[1] && p[2] >= 0;
    case OP_ARGMAX_COMBINE:
        e[0] = span(ACC_R, 0, 2 * (int64_t)p[0]), e[1] = span(ACC_W, 0, 1);
        return p[0] > 0;
    case OP_KV_STORE: {
        int64_t h = p[0], cap = p[1];
        if (h < 0 || h >= sh->n_kv_heads || cap <= 0 || cap > S)
            return false;
        e[0] = span(ACC_R, h * hd, (h + 1) * hd), e[1] = e[0];
        e[2] = span(ACC_W, h * cap * hd, (h + 1) * cap * hd), e[3] = e[2];     /* the slot is data */
        e[4] = span(ACC_RW, h * (cap + 1), (h + 1) * (cap + 1));
        return true;
    }
    case OP_ATTN_SPARSE:
        return mc_attn_sparse(sh, p, e, present);
    case OP_QUEST_SELECT: {
        int64_t h = p[0], page = p[1], np = p[2];
        if (h < 0 || h >= sh->n_kv_heads || page <= 0 || page > S || np <= 0)
            return false;
        int64_t region = quest_pages(sh, page) * 2 * hd;
        e[0] = span(ACC_R, h * G * hd, (h + 1) * G * hd);
        e[1] = cache_rows(sh, h);
        e[2] = span(ACC_RW, h * region, (h + 1) * region);
        e[3] = span(ACC_W, h * np, (h + 1) * np);
        return true;
    }
    case OP_KV_EVICT:
        return mc_kv_evict(sh, p, e, present);
    case OP_KV_SNAP:
        return mc_kv_snap(sh, p, e);
    case OP_TOPK_SELECT: { /* q of kv head h, its rows [0, pos], its scratch [G + 1][S], its k entries of sel */
        int64_t h = p[0], k = p[1], b = p[2], ppm = p[3];
        if (h < 0 || h >= sh->n_kv_heads || k <= 0 || k > S || b <= 0 || b > k || ppm < 0 || ppm > 1000000)
            return false;
        e[0] = span(ACC_R, h * G * hd, (h + 1) * G * hd);
        e[1] = cache_rows(sh, h);
        e[2] = span(ACC_W, h * (G + 1) * S, (h + 1) * (G + 1) * S);
        e[3] = span(ACC_W, h * k, (h + 1) * k);
        return true;
    }
    default:
        return false;
    }
}

static bool same_range(const Access *a, const Access *e)
{
    return a->mode == e->mode && a->lo.c == e->lo.c && a->lo.k == e->lo.k && a->hi.c == e->hi.c && a->hi.k == e->hi.k;
}

/* Integer operands: the token, the sampled id, eviction meta, quest sel,
 * SnapKV's snap. */
static bool mc_is_i32(const Inst *in, int i)
{
    switch (in->op) {
    case OP_EMBED: return i == 0;
    case OP_ARGMAX_COMBINE: return i == 1;
    case OP_KV_STORE: return i == 4;
    case OP_ATTN_SPARSE:
        return i == 4 && (in->p[3] == SPARSE_QUEST || in->p[3] == SPARSE_SNAP || in->p[3] == SPARSE_ROWS);
    case OP_QUEST_SELECT: return i == 3;
    case OP_KV_EVICT: return i == 1;
    case OP_KV_SNAP: case OP_TOPK_SELECT: return i == 3;
    default: return false;
    }
}

/* Operands named kc and vc in ops.h are the KV cache's k and v rows: f32,
 * f16 or bf16, both of one instruction alike. */
static int mc_cache(const Inst *in, int i)
{
    const char *n = op_info(in->op)->operand[i];
    return strcmp(n, "kc") == 0 ? 1 : strcmp(n, "vc") == 0 ? 2 : 0;
}

/* The element count ops.h fixes for operand i's whole buffer (0: any):
 * the KV caches ([kv][S][hd], or [kv][cap][hd] for an evicting layer),
 * the rope table, eviction meta and acc, quest bounds, SnapKV's snap
 * ([kv][list + 2]), qwin ([window][n_heads][hd]) and sc ([kv + 2][S]),
 * top-k's scratch ([n_heads + kv][S]) and rows ([kv][k]). */
static int64_t mc_layout(const ModelShape *sh, const Inst *in, int i)
{
    int64_t kv = sh->n_kv_heads, S = sh->max_seq, hd = sh->head_dim;
    int64_t cap = in->p[1], page = in->p[1];    /* kv_store, kv_evict; quest_select */
    switch (in->op) {
    case OP_ROPE: return i == 1 ? S * hd : 0;
    case OP_KV_APPEND: return i >= 2 ? kv * S * hd : 0;
    case OP_ATTN: return i == 1 || i == 2 ? kv * S * hd : i == 4 ? S * hd : 0;
    case OP_KV_STORE: return i == 2 || i == 3 ? kv * cap * hd : i == 4 ? kv * (cap + 1) : 0;
    case OP_ATTN_SPARSE:
        if (i == 4)
            return in->p[3] == SPARSE_SNAP ? kv * (in->p[4] + 2) : in->p[3] == SPARSE_ROWS ? kv * in->p[5] : 0;
        if (i != 1 && i != 2)
            return 0;
        return in->p[3] == SPARSE_SLOTS ? kv * in->p[4] * hd : kv * S * hd;
    case OP_QUEST_SELECT: return i == 1 ? kv * S * hd : i == 2 ? kv * quest_pages(sh, page) * 2 * hd : 0;
    case OP_KV_EVICT: return i == 1 ? kv * (cap + 1) : i == 2 ? kv * cap : 0;
    case OP_KV_SNAP: {
        int64_t budget = in->p[0], window = in->p[1], list = snap_list_cap(budget, in->p[2], kv, S);
        int64_t want[OP_MAX_OPERANDS] = {0, kv * S * hd, window * sh->n_heads * hd, kv * (list + 2), (kv + 2) * S};
        return i < OP_MAX_OPERANDS ? want[i] : 0;
    }
    case OP_TOPK_SELECT: return i == 1 ? kv * S * hd : i == 2 ? (sh->n_heads + kv) * S : i == 3 ? kv * in->p[1] : 0;
    default: return 0;
    }
}

static bool mc_op_check(Mc *m, uint32_t w, uint32_t t, const Inst *in)
{
    const Schedule *s = m->s;
    Access e[OP_MAX_OPERANDS];
    bool present[OP_MAX_OPERANDS];
    int64_t S = s->shape.max_seq;
    int cache_dt = -1;
    memset(e, 0, sizeof e);
    if (in->op >= OP_COUNT || in->nacc != op_info(in->op)->noperands || in->acc + in->nacc > s->naccs)
        return mc_fail(m, &m->r->structure, "w%u i%u: malformed op", w, t);
    if (!mc_expected(s, in, e, present))
        return mc_fail(m, &m->r->structure, "w%u i%u: bad params for %s", w, t, op_info(in->op)->name);
    for (int i = 0; i < in->nacc; i++) {
        const Access *a = &s->accs[in->acc + i];
        if (!present[i] || a->buf == BUF_NONE) {
            if (present[i] != (a->buf != BUF_NONE))
                return mc_fail(m, &m->r->structure, "w%u i%u: operand %d presence", w, t, i);
            continue;
        }
        if (a->buf >= s->nbufs || !same_range(a, &e[i]))
            return mc_fail(m, &m->r->structure, "w%u i%u: operand %d differs from the op's footprint", w, t, i);
        const Buffer *b = &s->bufs[a->buf];
        int64_t l0 = affine_at(a->lo, 0), l1 = affine_at(a->lo, S - 1);
        int64_t h0 = affine_at(a->hi, 0), h1 = affine_at(a->hi, S - 1);
        if (l0 < 0 || l1 < 0 || h0 > b->nelem || h1 > b->nelem || l0 > h0 || l1 > h1)
            return mc_fail(m, &m->r->structure, "w%u i%u: operand %d out of bounds of %s", w, t, i, b->name);
        if ((a->mode & ACC_W) && b->cls == BUF_WEIGHT)
            return mc_fail(m, &m->r->structure, "w%u i%u: writes weight %s", w, t, b->name);
        if (mc_cache(in, i)) {
            if (b->cls == BUF_WEIGHT ? b->dtype == DT_I32
                                     : b->dtype != DT_F32 && b->dtype != DT_F16 && b->dtype != DT_BF16)
                return mc_fail(m, &m->r->structure, "w%u i%u: cache operand %d is %s", w, t, i, dtype_name(b->dtype));
            if (cache_dt >= 0 && (int)b->dtype != cache_dt)
                return mc_fail(m, &m->r->structure, "w%u i%u: k and v rows of two dtypes", w, t);
            cache_dt = (int)b->dtype;
        } else if (b->cls == BUF_WEIGHT ? b->dtype == DT_I32 : b->dtype != (mc_is_i32(in, i) ? DT_I32 : DT_F32)) {
            return mc_fail(m, &m->r->structure, "w%u i%u: operand %d has the wrong dtype", w, t, i);
        }
        int64_t want = mc_layout(&s->shape, in, i);
        if (want && b->nelem != want)
            return mc_fail(m, &m->r->structure, "w%u i%u: operand %d: %s is not laid out as ops.h says", w, t, i,
                           b->name);
    }
    return true;
}

/* The shape line says what the buffers also say: a schedule with KV
 * caches has a K and a V cache per layer; an embed op's table is
 * [vocab, dim]. */
static bool mc_shape_check(Mc *m)
{
    const Schedule *s = m->s;
    int64_t caches = 0;
    for (uint32_t b = 0; b < s->nbufs; b++)
        if (s->bufs[b].cls == BUF_KV)
            caches++;
    if (caches > 0 && caches != 2 * (int64_t)s->shape.n_layers)
        return mc_fail(m, &m->r->structure, "%lld kv buffers for %d layers", (long long)caches, s->shape.n_layers);
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = &s->workers[w].insts[t];
            if (in->kind != INST_OP || in->op != OP_EMBED || in->nacc < 2)
                continue;
            uint32_t tb = s->accs[in->acc + 1].buf;
            if (tb == BUF_NONE || tb >= s->nbufs)
                continue;
            const Buffer *b = &s->bufs[tb];
            if (b->rank != 2 || b->shape[0] != s->shape.vocab_size || b->shape[1] != s->shape.dim)
                return mc_fail(m, &m->r->structure, "w%u i%u: embed table %s is not [vocab, dim]", w, t, b->name);
        }
    return true;
}

bool mc_structure_check(Mc *m)
{
    const Schedule *s = m->s;
    if (s->shape.max_seq <= 0 || s->nworkers == 0)
        return mc_fail(m, &m->r->structure, "empty shape or no workers");
    if (!mc_shape_check(m))
        return false;
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = &s->workers[w].insts[t];
            if (in->kind == INST_OP) {
                if (!mc_op_check(m, w, t, in))
                    return false;
            } else if (in->kind != INST_SIGNAL && in->kind != INST_WAIT) {
                return mc_fail(m, &m->r->structure, "w%u i%u: bad kind", w, t);
            } else if (in->counter >= s->nctrs || in->amount == 0) {
                return mc_fail(m, &m->r->structure, "w%u i%u: bad counter or amount 0", w, t);
            }
        }
    /* the kernels' counters are 32 bits: a counter's signals must not
     * add up past them */
    uint64_t *sum = xcalloc(s->nctrs ? s->nctrs : 1, sizeof *sum);
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = &s->workers[w].insts[t];
            if (in->kind == INST_SIGNAL)
                sum[in->counter] += in->amount;
        }
    bool ok = true;
    for (uint32_t c = 0; c < s->nctrs && ok; c++)
        if (sum[c] > UINT32_MAX)
            ok = mc_fail(m, &m->r->structure, "counter %u: signals add up to %llu", c, (unsigned long long)sum[c]);
    free(sum);
    /* an io buffer is an input some op reads or an output some op writes;
     * a KV buffer some op reads is one some op writes (the step's new rows:
     * the rows earlier steps read are the ones their steps wrote) */
    uint8_t *used = xcalloc(s->nbufs ? s->nbufs : 1, 1); /* bit 0 accessed, bit 1 written */
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = &s->workers[w].insts[t];
            for (int i = 0; in->kind == INST_OP && i < in->nacc; i++) {
                const Access *a = &s->accs[in->acc + i];
                if (a->buf != BUF_NONE)
                    used[a->buf] |= (uint8_t)(1 | (a->mode != ACC_R ? 2 : 0));
            }
        }
    for (uint32_t b = 0; b < s->nbufs && ok; b++)
        if (s->bufs[b].cls == BUF_IO && !used[b])
            ok = mc_fail(m, &m->r->uninit, "io buffer %s: no op reads or writes it", s->bufs[b].name);
        else if (s->bufs[b].cls == BUF_KV && used[b] == 1)
            ok = mc_fail(m, &m->r->uninit, "kv buffer %s: read, and no op of the step writes it", s->bufs[b].name);
    free(used);
    return ok;
}

/* A persistent kernel's blocks must all be resident at once. */
bool mc_residency_check(Mc *m)
{
    const Target *t = m->o->target;
    if (!t || t->kind != TARGET_CUDA)
        return true;
    int64_t fit = 1;
    if (m->o->threads_per_block > 0) {
        int64_t th = m->o->threads_per_block, lim[4] = {t->max_blocks_per_sm, t->max_threads_per_sm / th,
                                                        m->o->regs_per_thread > 0 ? t->regs_per_sm / (th * m->o->regs_per_thread) : INT64_MAX,
                                                        m->o->smem_per_block > 0 ? t->smem_per_sm / m->o->smem_per_block : INT64_MAX};
        fit = lim[0];
        for (int i = 1; i < 4; i++)
            fit = lim[i] < fit ? lim[i] : fit;
    }
    if ((int64_t)m->s->nworkers > fit * t->sms)
        return mc_fail(m, &m->r->residency, "%u workers > %lld resident blocks", m->s->nworkers, (long long)(fit * t->sms));
    return true;
}
