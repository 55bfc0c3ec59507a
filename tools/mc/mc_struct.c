/*
 * mc_struct.c - the model checker's own structure checks, written from the
 * op meanings and layouts in ops.h (not from op_footprint): what each op
 * touches, that the declared accesses say exactly that, bounds over all
 * pos (ranges are affine, so the extremes at pos 0 and max_seq-1 decide),
 * no writes to weights, dtypes (f32 activations, i32 token ids), the KV
 * and rope layouts, no wait >= 0 or signal +0, the shape line against
 * the buffers (a K and a V cache per layer, a [vocab, dim] embedding
 * table), and residency.
 */
#include "tools/mc/mc_int.h"

#include <stdarg.h>
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
    case OP_ATTN:
        e[0] = span(ACC_R, p[0] * G * hd, (p[0] + 1) * G * hd);
        e[1] = (Access){.mode = ACC_R, .lo = {p[0] * S * hd, 0}, .hi = {p[0] * S * hd + hd, hd}}, e[2] = e[1];
        e[3] = span(ACC_W, ((int64_t)p[0] * p[2] + p[1]) * G * (hd + 2), ((int64_t)p[0] * p[2] + p[1] + 1) * G * (hd + 2));
        return p[0] >= 0 && p[0] < sh->n_kv_heads && p[1] >= 0 && p[1] < p[2] && p[3] > 0;
    case OP_ATTN_COMBINE:
        e[0] = span(ACC_R, (int64_t)p[0] * p[1] * G * (hd + 2), (int64_t)(p[0] + 1) * p[1] * G * (hd + 2));
        e[1] = span(ACC_W, p[0] * G * hd, (p[0] + 1) * G * hd);
        return p[0] >= 0 && p[0] < sh->n_kv_heads && p[1] > 0;
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
    default:
        return false;
    }
}

static bool same_range(const Access *a, const Access *e)
{
    return a->mode == e->mode && a->lo.c == e->lo.c && a->lo.k == e->lo.k && a->hi.c == e->hi.c && a->hi.k == e->hi.k;
}

static bool mc_op_check(Mc *m, uint32_t w, uint32_t t, const Inst *in)
{
    const Schedule *s = m->s;
    Access e[OP_MAX_OPERANDS];
    bool present[OP_MAX_OPERANDS];
    int64_t S = s->shape.max_seq;
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
        bool ids = (in->op == OP_EMBED && i == 0) || (in->op == OP_ARGMAX_COMBINE && i == 1);
        if (b->cls == BUF_WEIGHT ? b->dtype == DT_I32 : b->dtype != (ids ? DT_I32 : DT_F32))
            return mc_fail(m, &m->r->structure, "w%u i%u: operand %d has the wrong dtype", w, t, i);
        int64_t cache = (int64_t)s->shape.n_kv_heads * S * s->shape.head_dim;
        bool is_cache = (in->op == OP_KV_APPEND && i >= 2) || (in->op == OP_ATTN && (i == 1 || i == 2));
        if ((is_cache && b->nelem != cache) || (in->op == OP_ROPE && i == 1 && b->nelem != S * s->shape.head_dim))
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
    return true;
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
