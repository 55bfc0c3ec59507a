/*
 * mc.c - explicit-state exploration of every interleaving of a small
 * schedule (see mc.h for what is reported).
 *
 * A state is the vector of per-worker pcs, packed 10 bits per worker into
 * 64 bits; counter values are the increments of the signals before the
 * pcs. A depth-first search visits each reachable state once (hash set).
 * In every state the checker looks at what is enabled: nothing enabled
 * and not all done is a deadlock; two enabled ops of different workers
 * that conflict (same buffer, overlapping at some checked pos, one
 * writes) are a race; an enabled scratch read not covered by the writes
 * already executed is uninit, and so is an output's (an io buffer some op
 * writes: logits, next), whose elements must all be written when every
 * worker is done; an io buffer no op reads or writes is uninit too, and so
 * is a KV buffer some op reads and none writes; an enabled KV read overlapping a write of
 * the step that has not executed is a kv-order violation.
 *
 * Why "both enabled in one reachable state" is the race definition that
 * matches the validator's happens-before: reachable pc vectors are closed
 * under componentwise max (replay the second execution's steps from the
 * first state: every wait sees at least the counter values it saw, since
 * counters only grow), so two ops can run in either order iff some
 * reachable state has both at their workers' pcs. The validator orders a
 * pair only through signals a wait cannot pass without, which holds in
 * every execution, so a pair it orders is never co-enabled here; a pair it
 * leaves unordered is reported by both, unless the counter arithmetic
 * orders it in a way the validator does not claim (a false reject, never
 * a false accept).
 */
#include "tools/mc/mc_int.h"

#include <stdlib.h>
#include <string.h>

#define PC_BITS 10
#define PC_MASK ((1u << PC_BITS) - 1)

static uint32_t pc_of(uint64_t st, uint32_t w)
{
    return (uint32_t)(st >> (w * PC_BITS)) & PC_MASK;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static void set_grow(Mc *m)
{
    uint64_t oldcap = m->setcap, *old = m->set;
    m->setcap = oldcap ? oldcap * 2 : 1 << 12;
    m->set = xcalloc(m->setcap, sizeof *m->set);
    m->nset = 0;
    for (uint64_t i = 0; i < oldcap; i++)
        if (old[i]) {
            uint64_t h = mix(old[i]) & (m->setcap - 1);
            while (m->set[h])
                h = (h + 1) & (m->setcap - 1);
            m->set[h] = old[i];
            m->nset++;
        }
    free(old);
}

/* True if st was not visited before. */
static bool set_insert(Mc *m, uint64_t st)
{
    if ((m->nset + 1) * 2 > m->setcap)
        set_grow(m);
    uint64_t key = st + 1, h = mix(key) & (m->setcap - 1);
    while (m->set[h]) {
        if (m->set[h] == key)
            return false;
        h = (h + 1) & (m->setcap - 1);
    }
    m->set[h] = key;
    m->nset++;
    return true;
}

static const Inst *inst_at(const Mc *m, uint32_t w, uint32_t t)
{
    return &m->s->workers[w].insts[t];
}

static uint64_t counter_value(const Mc *m, uint64_t st, uint32_t c)
{
    uint64_t v = 0;
    for (uint32_t w = 0; w < m->nw; w++)
        v += m->sigpre[(size_t)(m->base[w] + w + pc_of(st, w)) * m->s->nctrs + c];
    return v;
}

static bool enabled(const Mc *m, uint64_t st, uint32_t w)
{
    uint32_t pc = pc_of(st, w);
    if (pc >= m->s->workers[w].ninst)
        return false;
    const Inst *in = inst_at(m, w, pc);
    return in->kind != INST_WAIT || counter_value(m, st, in->counter) >= in->amount;
}

static bool ranges_meet(const Mc *m, const Access *a, const Access *b)
{
    for (int i = 0; i < m->npos; i++) {
        int64_t p = m->pos[i];
        int64_t alo = affine_at(a->lo, p), ahi = affine_at(a->hi, p);
        int64_t blo = affine_at(b->lo, p), bhi = affine_at(b->hi, p);
        if (alo < ahi && blo < bhi && alo < bhi && blo < ahi)
            return true;
    }
    return false;
}

static bool ops_conflict(Mc *m, uint32_t ga, const Inst *a, uint32_t gb, const Inst *b)
{
    uint8_t *memo = &m->conf[(size_t)ga * m->ntotal + gb];
    if (*memo)
        return *memo == 2;
    bool hit = false;
    for (int i = 0; i < a->nacc && !hit; i++)
        for (int j = 0; j < b->nacc && !hit; j++) {
            const Access *x = &m->s->accs[a->acc + i], *y = &m->s->accs[b->acc + j];
            if (x->buf == BUF_NONE || x->buf != y->buf || !((x->mode | y->mode) & ACC_W))
                continue;
            hit = ranges_meet(m, x, y);
        }
    *memo = hit ? 2 : 1;
    m->conf[(size_t)gb * m->ntotal + ga] = *memo;
    return hit;
}

static bool const_range(const Access *a)
{
    return a->lo.k == 0 && a->hi.k == 0;
}

/* Is read `r` of a scratch or output buffer covered by executed writes at pos p? */
static bool covered(Mc *m, uint64_t st, const Access *r, int64_t p)
{
    int64_t lo = affine_at(r->lo, p), hi = affine_at(r->hi, p);
    if (lo >= hi)
        return true;
    memset(m->mark + lo, 0, (size_t)(hi - lo));
    for (uint32_t w = 0; w < m->nw; w++)
        for (uint32_t t = 0; t < pc_of(st, w); t++) {
            const Inst *in = inst_at(m, w, t);
            for (int i = 0; in->kind == INST_OP && i < in->nacc; i++) {
                const Access *a = &m->s->accs[in->acc + i];
                if (a->buf != r->buf || !(a->mode & ACC_W))
                    continue;
                int64_t l = affine_at(a->lo, p), h = affine_at(a->hi, p);
                for (int64_t e = l > lo ? l : lo; e < h && e < hi; e++)
                    m->mark[e] = 1;
            }
        }
    for (int64_t e = lo; e < hi; e++)
        if (!m->mark[e])
            return false;
    return true;
}

/* Does a write to r's KV buffer overlapping r still have to run? */
static bool kv_pending(Mc *m, uint64_t st, uint32_t rw, const Access *r)
{
    for (uint32_t w = 0; w < m->nw; w++)
        for (uint32_t t = pc_of(st, w) + (w == rw); t < m->s->workers[w].ninst; t++) {
            const Inst *in = inst_at(m, w, t);
            for (int i = 0; in->kind == INST_OP && i < in->nacc; i++) {
                const Access *a = &m->s->accs[in->acc + i];
                if (a->buf == r->buf && (a->mode & ACC_W) && ranges_meet(m, a, r))
                    return true;
            }
        }
    return false;
}

static bool reads_check(Mc *m, uint64_t st, uint32_t w)
{
    const Inst *in = inst_at(m, w, pc_of(st, w));
    for (int i = 0; i < in->nacc; i++) {
        const Access *a = &m->s->accs[in->acc + i];
        if (a->buf == BUF_NONE || !(a->mode & ACC_R))
            continue;
        BufClass cls = m->s->bufs[a->buf].cls;
        if (cls == BUF_KV && kv_pending(m, st, w, a))
            return mc_fail(m, &m->r->kv_order, "w%u i%u reads KV %s before its write this step", w, pc_of(st, w),
                           m->s->bufs[a->buf].name);
        if (cls != BUF_SCRATCH && !m->output[a->buf])
            continue;
        int np = const_range(a) ? 1 : m->npos;
        for (int k = 0; k < np; k++)
            if (!covered(m, st, a, m->pos[k]))
                return mc_fail(m, &m->r->uninit, "w%u i%u reads unwritten %s at pos %lld", w, pc_of(st, w),
                               m->s->bufs[a->buf].name, (long long)m->pos[k]);
    }
    return true;
}

/* The checks of one state; false at the first finding. */
static bool state_check(Mc *m, uint64_t st, bool *any_enabled)
{
    bool all_done = true;
    *any_enabled = false;
    for (uint32_t w = 0; w < m->nw; w++) {
        uint32_t pw = pc_of(st, w);
        all_done &= pw >= m->s->workers[w].ninst;
        if (!enabled(m, st, w))
            continue;
        *any_enabled = true;
        const Inst *a = inst_at(m, w, pw);
        if (a->kind != INST_OP)
            continue;
        if (!reads_check(m, st, w))
            return false;
        for (uint32_t u = 0; u < w; u++) {
            uint32_t pu = pc_of(st, u);
            if (pu < m->s->workers[u].ninst && inst_at(m, u, pu)->kind == INST_OP &&
                ops_conflict(m, m->base[w] + pw, a, m->base[u] + pu, inst_at(m, u, pu)))
                return mc_fail(m, &m->r->race, "w%u i%u and w%u i%u conflict while both enabled", u, pu, w, pw);
        }
    }
    if (!all_done && !*any_enabled)
        return mc_fail(m, &m->r->deadlock, "deadlock: no worker can move");
    for (uint32_t b = 0; all_done && b < m->s->nbufs; b++) {
        Access whole = {.buf = b, .mode = ACC_R, .lo = {0, 0}, .hi = {m->s->bufs[b].nelem, 0}};
        for (int k = 0; m->output[b] && k < m->npos; k++)
            if (!covered(m, st, &whole, m->pos[k]))
                return mc_fail(m, &m->r->uninit, "output %s is not all written at the end (pos %lld)",
                               m->s->bufs[b].name, (long long)m->pos[k]);
    }
    return true;
}

static McVerdict explore(Mc *m)
{
    uint64_t max = m->o->max_states ? m->o->max_states : 4000000;
    uint64_t *stack = NULL;
    size_t n = 0, cap = 0;
    McVerdict v = MC_SAFE;
    set_insert(m, 0);
    VEC_PUSH(stack, n, cap, 0);
    while (n && v == MC_SAFE) {
        uint64_t st = stack[--n];
        bool any;
        if (!state_check(m, st, &any)) {
            v = MC_UNSAFE;
            break;
        }
        for (uint32_t w = 0; w < m->nw; w++) {
            if (!enabled(m, st, w))
                continue;
            uint64_t nx = st + ((uint64_t)1 << (w * PC_BITS));
            if (set_insert(m, nx))
                VEC_PUSH(stack, n, cap, nx);
        }
        if (m->nset > max) {
            snprintf(m->r->why, sizeof m->r->why, "more than %llu states", (unsigned long long)max);
            v = MC_UNKNOWN;
        }
    }
    free(stack);
    return v;
}

static void mc_prepare(Mc *m)
{
    const Schedule *s = m->s;
    uint32_t nc = s->nctrs;
    for (uint32_t w = 0; w < m->nw; w++)
        m->base[w + 1] = m->base[w] + s->workers[w].ninst;
    m->ntotal = m->base[m->nw];
    m->sigpre = xcalloc((size_t)(m->ntotal + m->nw) * (nc ? nc : 1), sizeof *m->sigpre);
    for (uint32_t w = 0; w < m->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            uint32_t *cur = &m->sigpre[(size_t)(m->base[w] + w + t) * nc], *next = cur + nc;
            memcpy(next, cur, nc * sizeof *cur);
            const Inst *in = inst_at(m, w, t);
            if (in->kind == INST_SIGNAL)
                next[in->counter] += in->amount;
        }
    int64_t S = s->shape.max_seq;
    if (S <= MC_ALL_POS) {
        for (int64_t p = 0; p < S; p++)
            m->pos[m->npos++] = p;
    } else {
        int64_t cand[] = {0, 1, 2, S / 2, S - 2, S - 1};
        for (int i = 0; i < 6; i++)
            m->pos[m->npos++] = cand[i];
    }
    m->conf = xcalloc((size_t)m->ntotal * m->ntotal + 1, 1);
    m->output = xcalloc(s->nbufs ? s->nbufs : 1, 1);
    for (uint32_t w = 0; w < m->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = inst_at(m, w, t);
            for (int i = 0; in->kind == INST_OP && i < in->nacc; i++) {
                const Access *a = &s->accs[in->acc + i];
                if (a->buf != BUF_NONE && (a->mode & ACC_W) && s->bufs[a->buf].cls == BUF_IO)
                    m->output[a->buf] = 1;
            }
        }
    int64_t big = 1;
    for (uint32_t b = 0; b < s->nbufs; b++)
        if ((s->bufs[b].cls == BUF_SCRATCH || m->output[b]) && s->bufs[b].nelem > big)
            big = s->bufs[b].nelem;
    m->mark = xcalloc((size_t)big, 1);
}

McVerdict mc_check(const Schedule *s, const McOptions *o, McResult *r)
{
    static const McOptions none;
    Mc m;
    memset(&m, 0, sizeof m);
    memset(r, 0, sizeof *r);
    m.s = s;
    m.o = o ? o : &none;
    m.r = r;
    if (!mc_residency_check(&m) || !mc_structure_check(&m))
        return r->verdict = MC_UNSAFE;
    if (s->nworkers > MC_MAX_WORKERS) {
        snprintf(r->why, sizeof r->why, "%u workers: at most %d", s->nworkers, MC_MAX_WORKERS);
        return r->verdict = MC_UNKNOWN;
    }
    for (uint32_t w = 0; w < s->nworkers; w++)
        if (s->workers[w].ninst >= PC_MASK) {
            snprintf(r->why, sizeof r->why, "worker %u has %u instructions", w, s->workers[w].ninst);
            return r->verdict = MC_UNKNOWN;
        }
    m.nw = s->nworkers;
    mc_prepare(&m);
    r->verdict = explore(&m);
    r->states = m.nset;
    free(m.sigpre);
    free(m.conf);
    free(m.mark);
    free(m.output);
    free(m.set);
    return r->verdict;
}
