/*
 * fuzz_mutate.c - defects planted into real lowerings, and random
 * schedules, for the validator-vs-model-checker campaign.
 *
 * Each mutator picks its site uniformly among the places the defect can
 * go (reservoir sampling over the instructions) and edits the schedule in
 * place. Mutators that change an op's params recompute its access list
 * with op_footprint, so the defect is a real overlap, order or bound
 * problem and not merely a declared range that disagrees with the op.
 * Whether a mutant is actually unsafe is for the model checker to say:
 * some are harmless (a swap of two independent ops, a duplicated signal
 * nobody can observe early).
 *
 * Sparse attention and KV eviction get defects of their own inside the
 * existing classes: half of the bad-op-params mutants change a param of
 * kv_store, attn_sparse, quest_select or kv_evict that decides what it
 * touches (cap, kind, scores, page, npages, policy, head), or cut a
 * declared range short; kv reads include attn_sparse and quest_select and
 * kv writes kv_store; dropped and early-moved waits prefer, half of the
 * time, the wait a kv_evict needs.
 */
#include "compiler/fuzz.h"

#include <stdlib.h>
#include <string.h>

const char *const fuzz_class_names[FUZZ_CLASS_COUNT] = {
#define X(n, s) s,
    FUZZ_CLASS_LIST(X)
#undef X
};

uint64_t fuzz_rand(FuzzRng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

uint32_t fuzz_below(FuzzRng *r, uint32_t n)
{
    return (uint32_t)((fuzz_rand(r) >> 16) % n);
}

Schedule *fuzz_clone(const Schedule *s)
{
    Schedule *c = sched_new(s->name, s->target, (int)s->nworkers);
    c->shape = s->shape;
    for (uint32_t b = 0; b < s->nbufs; b++)
        sched_add_buffer(c, s->bufs[b].name, s->bufs[b].dtype, s->bufs[b].cls, s->bufs[b].rank, s->bufs[b].shape);
    for (uint32_t k = 0; k < s->nctrs; k++)
        sched_add_counter(c, s->ctrs[k].name);
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = &s->workers[w].insts[t];
            if (in->kind == INST_OP)
                sched_op(c, (int)w, in->op, in->p, &s->accs[in->acc]);
            else if (in->kind == INST_SIGNAL)
                sched_signal(c, (int)w, in->counter, in->amount);
            else
                sched_wait(c, (int)w, in->counter, in->amount);
        }
    return c;
}

typedef struct Site {
    uint32_t w, t;
} Site;

typedef bool (*SitePred)(const Schedule *s, uint32_t w, uint32_t t);

/* A uniformly chosen instruction satisfying pred; false if none. */
static bool site_pick(const Schedule *s, FuzzRng *r, SitePred pred, Site *out)
{
    uint32_t n = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++)
            if (pred(s, w, t) && fuzz_below(r, ++n) == 0)
                *out = (Site){w, t};
    return n > 0;
}

static void inst_remove(Schedule *s, uint32_t w, uint32_t t)
{
    Worker *wk = &s->workers[w];
    memmove(&wk->insts[t], &wk->insts[t + 1], (wk->ninst - t - 1) * sizeof *wk->insts);
    wk->ninst--;
}

static void inst_insert(Schedule *s, uint32_t w, uint32_t t, Inst in)
{
    Worker *wk = &s->workers[w];
    VEC_GROW(wk->insts, wk->ninst, wk->cap);
    memmove(&wk->insts[t + 1], &wk->insts[t], (wk->ninst - t) * sizeof *wk->insts);
    wk->insts[t] = in;
    wk->ninst++;
}

static Inst *inst_at(Schedule *s, Site x)
{
    return &s->workers[x.w].insts[x.t];
}

static bool is_wait(const Schedule *s, uint32_t w, uint32_t t)
{
    return s->workers[w].insts[t].kind == INST_WAIT;
}

static bool is_wait2(const Schedule *s, uint32_t w, uint32_t t)
{
    return is_wait(s, w, t) && s->workers[w].insts[t].amount >= 2;
}

static bool is_signal(const Schedule *s, uint32_t w, uint32_t t)
{
    return s->workers[w].insts[t].kind == INST_SIGNAL;
}

static bool is_op(const Schedule *s, uint32_t w, uint32_t t)
{
    return s->workers[w].insts[t].kind == INST_OP;
}

/* Ops whose params p0, p1 are a range (rows or columns). */
static bool is_ranged_op(const Schedule *s, uint32_t w, uint32_t t)
{
    const Inst *in = &s->workers[w].insts[t];
    return in->kind == INST_OP && (in->op == OP_GEMV || in->op == OP_SILU_MUL || in->op == OP_ADD ||
                                   in->op == OP_ARGMAX || in->op == OP_EMBED);
}

static uint64_t counter_total(const Schedule *s, uint32_t c)
{
    uint64_t n = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++)
            if (is_signal(s, w, t) && s->workers[w].insts[t].counter == c)
                n += s->workers[w].insts[t].amount;
    return n;
}

/* Recomputes the accesses of an op from its params (keeps the old ones
 * when the params are invalid). */
static void op_refresh(Schedule *s, Inst *in)
{
    Access fp[OP_MAX_OPERANDS];
    const char *why;
    memset(fp, 0, sizeof fp);
    if (!op_footprint(s, in, fp, &why))
        return;
    for (int i = 0; i < in->nacc; i++)
        if (fp[i].buf != BUF_NONE || fp[i].mode == 0)
            s->accs[in->acc + i] = fp[i];
}

static bool mut_swap(Schedule *s, FuzzRng *r)
{
    uint32_t w = fuzz_below(r, s->nworkers);
    Worker *wk = &s->workers[w];
    if (wk->ninst < 2)
        return false;
    uint32_t a = fuzz_below(r, wk->ninst - 1), b = a + 1;
    if (fuzz_below(r, 2))
        b = a + 1 + fuzz_below(r, wk->ninst - a - 1);
    Inst t = wk->insts[a];
    wk->insts[a] = wk->insts[b];
    wk->insts[b] = t;
    return true;
}

static bool mut_move_worker(Schedule *s, FuzzRng *r)
{
    Site x;
    if (s->nworkers < 2 || !site_pick(s, r, is_op, &x))
        return false;
    Inst in = *inst_at(s, x);
    inst_remove(s, x.w, x.t);
    uint32_t to = (x.w + 1 + fuzz_below(r, s->nworkers - 1)) % s->nworkers;
    inst_insert(s, to, fuzz_below(r, s->workers[to].ninst + 1), in);
    return true;
}

static bool mut_widen(Schedule *s, FuzzRng *r)
{
    Site x;
    if (!site_pick(s, r, is_ranged_op, &x))
        return false;
    Inst *in = inst_at(s, x);
    int32_t d = 1 + (int32_t)fuzz_below(r, 3);
    if (in->p[0] >= d && fuzz_below(r, 2))
        in->p[0] -= d;
    else
        in->p[1] += d;
    op_refresh(s, in);
    return true;
}

/* Moves op x up to just before the nearest earlier instruction `stop`
 * says to pass (a wait, or a kv write). */
static bool move_before(Schedule *s, Site x, SitePred stop)
{
    for (uint32_t t = x.t; t-- > 0;)
        if (stop(s, x.w, t)) {
            Inst in = *inst_at(s, x);
            inst_remove(s, x.w, x.t);
            inst_insert(s, x.w, t, in);
            return true;
        }
    return false;
}

static bool has_wait_before(const Schedule *s, uint32_t w, uint32_t t)
{
    if (s->workers[w].insts[t].kind != INST_OP)
        return false;
    for (uint32_t k = 0; k < t; k++)
        if (is_wait(s, w, k))
            return true;
    return false;
}

static bool is_op_of(const Schedule *s, uint32_t w, uint32_t t, int op)
{
    return s->workers[w].insts[t].kind == INST_OP && s->workers[w].insts[t].op == op;
}

/* Ops that read a KV cache, and ops that write one. */
static bool is_kv_read(const Schedule *s, uint32_t w, uint32_t t)
{
    return is_op_of(s, w, t, OP_ATTN) || is_op_of(s, w, t, OP_ATTN_SPARSE) || is_op_of(s, w, t, OP_QUEST_SELECT);
}

static bool is_kv_write(const Schedule *s, uint32_t w, uint32_t t)
{
    return is_op_of(s, w, t, OP_KV_APPEND) || is_op_of(s, w, t, OP_KV_STORE);
}

static bool is_sparse_op(const Schedule *s, uint32_t w, uint32_t t)
{
    return is_op_of(s, w, t, OP_KV_STORE) || is_op_of(s, w, t, OP_ATTN_SPARSE) ||
           is_op_of(s, w, t, OP_QUEST_SELECT) || is_op_of(s, w, t, OP_KV_EVICT) || is_op_of(s, w, t, OP_KV_SNAP) ||
           is_op_of(s, w, t, OP_TOPK_SELECT);
}

/* A kv_evict or kv_snap with a wait before it on its worker. */
static bool is_evict_after_wait(const Schedule *s, uint32_t w, uint32_t t)
{
    return (is_op_of(s, w, t, OP_KV_EVICT) || is_op_of(s, w, t, OP_KV_SNAP)) && has_wait_before(s, w, t);
}

static bool mut_kv_early(Schedule *s, FuzzRng *r)
{
    Site x = {0, 0};
    if (!site_pick(s, r, is_kv_read, &x))
        return false;
    if (fuzz_below(r, 2) && move_before(s, x, is_kv_write))
        return true;
    return move_before(s, x, is_wait) || move_before(s, x, is_kv_write);
}

/* Removes the nearest wait before op x on its worker. */
static bool drop_wait_before(Schedule *s, Site x)
{
    for (uint32_t t = x.t; t-- > 0;)
        if (is_wait(s, x.w, t)) {
            inst_remove(s, x.w, t);
            return true;
        }
    return false;
}

/* A kv_evict loses (drop) or passes (move) the wait it needs: it then runs
 * with the layer's attention, whose score writes and kv_store meta
 * updates it must follow. False when no kv_evict waits. */
static bool mut_evict_wait(Schedule *s, FuzzRng *r, bool drop)
{
    Site x = {0, 0};
    if (!site_pick(s, r, is_evict_after_wait, &x))
        return false;
    return drop ? drop_wait_before(s, x) : move_before(s, x, is_wait);
}

static bool mut_cycle(Schedule *s, FuzzRng *r)
{
    if (s->nworkers < 2)
        return false;
    uint32_t a = fuzz_below(r, s->nworkers), b = (a + 1 + fuzz_below(r, s->nworkers - 1)) % s->nworkers;
    char name[32];
    snprintf(name, sizeof name, "fz.%u.x", s->nctrs);
    uint32_t cx = sched_add_counter(s, name);
    snprintf(name, sizeof name, "fz.%u.y", s->nctrs);
    uint32_t cy = sched_add_counter(s, name);
    uint32_t ia = fuzz_below(r, s->workers[a].ninst + 1), ib = fuzz_below(r, s->workers[b].ninst + 1);
    inst_insert(s, a, ia, (Inst){.kind = INST_SIGNAL, .counter = cy, .amount = 1});
    inst_insert(s, a, ia, (Inst){.kind = INST_WAIT, .counter = cx, .amount = 1});
    inst_insert(s, b, ib, (Inst){.kind = INST_SIGNAL, .counter = cx, .amount = 1});
    inst_insert(s, b, ib, (Inst){.kind = INST_WAIT, .counter = cy, .amount = 1});
    return true;
}

static bool mut_residency(Schedule *s, FuzzRng *r)
{
    uint32_t n = 109 + fuzz_below(r, 4);
    s->workers = xrealloc(s->workers, n * sizeof *s->workers);
    memset(s->workers + s->nworkers, 0, (n - s->nworkers) * sizeof *s->workers);
    s->nworkers = n;
    s->target = arena_strdup(&s->arena, "sm_80");
    return true;
}

static bool has_access(const Schedule *s, uint32_t w, uint32_t t)
{
    return is_op(s, w, t);
}

static bool mut_oob(Schedule *s, FuzzRng *r)
{
    Site x;
    if (fuzz_below(r, 2) && site_pick(s, r, is_ranged_op, &x)) {
        Inst *in = inst_at(s, x);
        const Access *y = &s->accs[in->acc + (in->op == OP_ARGMAX ? 1 : in->op == OP_ADD ? 0 : 2)];
        in->p[1] += (int32_t)(y->buf == BUF_NONE ? 1 : s->bufs[y->buf].nelem);
        op_refresh(s, in);
        return true;
    }
    if (!site_pick(s, r, has_access, &x))
        return false;
    Inst *in = inst_at(s, x);
    Access *a = &s->accs[in->acc + fuzz_below(r, in->nacc)];
    if (a->buf == BUF_NONE)
        return false;
    a->hi.c = s->bufs[a->buf].nelem + 1 + fuzz_below(r, 4) - a->hi.k * (s->shape.max_seq - 1) * (a->hi.k < 0);
    return true;
}

/* The buffer an optional operand of op `in` binds when a mutation makes it
 * present: the sel or score scratch, or the layer's acc (named as its
 * meta is). BUF_NONE if the schedule has none. */
static uint32_t aux_buffer(const Schedule *s, const Inst *in, int i)
{
    char name[64] = "score";
    if (in->op == OP_ATTN_SPARSE && in->p[3] == SPARSE_QUEST)
        snprintf(name, sizeof name, "sel");
    if (in->op == OP_ATTN_SPARSE && in->p[3] == SPARSE_ROWS)
        snprintf(name, sizeof name, "kidx.0"); /* layer 0's rows, if it is an anchor */
    if (in->op == OP_ATTN_SPARSE && in->p[3] == SPARSE_SNAP) { /* the layer's snap, named as its kc is */
        uint32_t kc = s->accs[in->acc + 1].buf;
        const char *kn = kc < s->nbufs ? s->bufs[kc].name : "";
        snprintf(name, sizeof name, "snap%s", strncmp(kn, "kc", 2) ? "" : kn + 2);
    }
    if (in->op == OP_KV_EVICT && i == 2) {
        uint32_t meta = s->accs[in->acc + 1].buf;
        const char *mn = meta < s->nbufs ? s->bufs[meta].name : "";
        snprintf(name, sizeof name, "acc%s", strncmp(mn, "meta", 4) ? "" : mn + 4);
    }
    int64_t b = sched_find_buffer(s, name);
    return b < 0 ? BUF_NONE : (uint32_t)b;
}

/* Changes param i of sparse op `in` by d (a kind or policy moves to
 * another one, a 0/1 flag flips) and recomputes its accesses, binding the
 * optional operands that become present. */
static void sparse_param_change(Schedule *s, Inst *in, int i, int32_t d)
{
    bool cyclic = (in->op == OP_ATTN_SPARSE && i == 3) || (in->op == OP_KV_EVICT && i == 0);
    bool flag = in->op == OP_ATTN_SPARSE && i == 5 && in->p[3] == SPARSE_SLOTS;
    if (cyclic)
        in->p[i] = (in->p[i] + 1 + d % 2) % (in->op == OP_ATTN_SPARSE ? SPARSE_KIND_COUNT : KV_POLICY_COUNT);
    else if (flag)
        in->p[i] = !in->p[i];
    else
        in->p[i] += in->p[i] > d && (d & 1) ? -d : d;
    const OpInfo *oi = op_info(in->op);
    for (int k = 0; k < in->nacc; k++)
        if (oi->optional[k] && s->accs[in->acc + k].buf == BUF_NONE)
            s->accs[in->acc + k].buf = aux_buffer(s, in, k);
    op_refresh(s, in);
}

/* A defect planted in kv_store, attn_sparse, quest_select, kv_evict,
 * kv_snap or topk_select: a param that decides its footprint changes
 * (accesses follow), or one of its declared ranges is cut short (the op
 * still touches it all). */
static bool mut_sparse_params(Schedule *s, FuzzRng *r)
{
    Site x = {0, 0};
    if (!site_pick(s, r, is_sparse_op, &x))
        return false;
    Inst *in = inst_at(s, x);
    if (fuzz_below(r, 4) == 0) {
        Access *a = &s->accs[in->acc + fuzz_below(r, in->nacc)];
        if (a->buf == BUF_NONE)
            return false;
        a->hi.c -= 1 + (int64_t)fuzz_below(r, 3);
        return true;
    }
    /* params worth changing: kv_store h cap; attn_sparse s nsplit kind b;
     * quest_select page npages; kv_evict policy cap nsplit; kv_snap budget window safe; topk_select h k b ppm */
    static const int8_t pick[OP_COUNT][4] = {
        [OP_KV_STORE] = {0, 1, 1, 1}, [OP_ATTN_SPARSE] = {1, 2, 3, 5},
        [OP_QUEST_SELECT] = {1, 2, 2, 1}, [OP_KV_EVICT] = {0, 1, 4, 1}, [OP_KV_SNAP] = {0, 1, 2, 1},
        [OP_TOPK_SELECT] = {0, 1, 2, 3}};
    sparse_param_change(s, in, pick[in->op][fuzz_below(r, 4)], 1 + (int32_t)fuzz_below(r, 3));
    return true;
}

static bool mut_bad_params(Schedule *s, FuzzRng *r)
{
    Site x;
    if (fuzz_below(r, 2) && mut_sparse_params(s, r))
        return true;
    if (!site_pick(s, r, is_op, &x))
        return false;
    Inst *in = inst_at(s, x);
    int i = (int)fuzz_below(r, (uint32_t)op_info(in->op)->nparams);
    switch (fuzz_below(r, 3)) {
    case 0: in->p[i] = -1 - (int32_t)fuzz_below(r, 3); break;
    case 1: in->p[i] = 1 << (20 + fuzz_below(r, 8)); break;
    default: in->p[i] += 1 + (int32_t)fuzz_below(r, 4); break;
    }
    return true;
}

/* Two counters become one (the "which producer" confusion): the waits on
 * the second keep their thresholds or count on top of the first's total. */
static bool mut_merge_counters(Schedule *s, FuzzRng *r)
{
    if (s->nctrs < 2)
        return false;
    uint32_t a = fuzz_below(r, s->nctrs), b = (a + 1 + fuzz_below(r, s->nctrs - 1)) % s->nctrs;
    uint32_t shift = fuzz_below(r, 2) ? (uint32_t)counter_total(s, a) : 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            Inst *in = &s->workers[w].insts[t];
            if (in->kind != INST_OP && in->counter == b) {
                in->counter = a;
                if (in->kind == INST_WAIT)
                    in->amount += shift;
            }
        }
    return true;
}

static bool mut_signal_amount(Schedule *s, FuzzRng *r)
{
    Site x;
    if (!site_pick(s, r, is_signal, &x))
        return false;
    Inst *in = inst_at(s, x);
    if (in->amount > 1 && fuzz_below(r, 2))
        in->amount--;
    else
        in->amount++;
    return true;
}

static bool mut_move_wait(Schedule *s, FuzzRng *r)
{
    Site x;
    if (!site_pick(s, r, is_wait, &x))
        return false;
    Inst in = *inst_at(s, x);
    inst_remove(s, x.w, x.t);
    inst_insert(s, x.w, fuzz_below(r, s->workers[x.w].ninst + 1), in);
    return true;
}

/* A KV cache buffer (BUF_KV, name kc.L or vc.L) gets another dtype: the
 * pair both f16 or both bf16 (safe), one of them f16 (its k and v rows
 * then differ), or one of them i32 (no cache dtype). A smaller element
 * keeps the layout's offsets apart; i32 has f32's size. */
static bool mut_cache_dtype(Schedule *s, FuzzRng *r)
{
    uint32_t kv[512], n = 0;
    for (uint32_t b = 0; b < s->nbufs && n < 512; b++)
        if (s->bufs[b].cls == BUF_KV && s->bufs[b].name[0] == 'k' && s->bufs[b].dtype == DT_F32)
            kv[n++] = b;
    if (n == 0)
        return false;
    Buffer *k = &s->bufs[kv[fuzz_below(r, n)]], *v = NULL;
    for (uint32_t b = 0; b < s->nbufs; b++)
        if (s->bufs[b].cls == BUF_KV && s->bufs[b].name[0] == 'v' && strcmp(s->bufs[b].name + 1, k->name + 1) == 0)
            v = &s->bufs[b];
    switch (fuzz_below(r, 3)) {
    case 0:
        k->dtype = fuzz_below(r, 2) ? DT_F16 : DT_BF16;
        if (v)
            v->dtype = k->dtype;
        break;
    case 1: (fuzz_below(r, 2) || !v ? k : v)->dtype = DT_F16; break;
    default: (fuzz_below(r, 2) || !v ? k : v)->dtype = DT_I32; break;
    }
    return true;
}

bool fuzz_mutate(Schedule *s, FuzzClass c, FuzzRng *r)
{
    Site x;
    switch (c) {
    case FUZZ_DROP_WAIT:
        if (fuzz_below(r, 2) && mut_evict_wait(s, r, true))
            return true;
        if (!site_pick(s, r, is_wait, &x))
            return false;
        inst_remove(s, x.w, x.t);
        return true;
    case FUZZ_LOWER_THRESHOLD:
        if (!site_pick(s, r, is_wait2, &x))
            return false;
        inst_at(s, x)->amount = 1 + fuzz_below(r, inst_at(s, x)->amount - 1);
        return true;
    case FUZZ_RAISE_THRESHOLD:
        if (!site_pick(s, r, is_wait, &x))
            return false;
        inst_at(s, x)->amount = (uint32_t)counter_total(s, inst_at(s, x)->counter) + 1 + fuzz_below(r, 3);
        return true;
    case FUZZ_DROP_SIGNAL:
        if (!site_pick(s, r, is_signal, &x))
            return false;
        inst_remove(s, x.w, x.t);
        return true;
    case FUZZ_DUP_SIGNAL:
        if (!site_pick(s, r, is_signal, &x))
            return false;
        inst_insert(s, x.w, x.t + 1 + fuzz_below(r, s->workers[x.w].ninst - x.t), *inst_at(s, x));
        return true;
    case FUZZ_SWAP: return mut_swap(s, r);
    case FUZZ_MOVE_WORKER: return mut_move_worker(s, r);
    case FUZZ_WIDEN: return mut_widen(s, r);
    case FUZZ_READ_EARLY:
        if (fuzz_below(r, 2) && mut_evict_wait(s, r, false))
            return true;
        return site_pick(s, r, has_wait_before, &x) && move_before(s, x, is_wait);
    case FUZZ_KV_EARLY: return mut_kv_early(s, r);
    case FUZZ_CACHE_DTYPE: return mut_cache_dtype(s, r);
    case FUZZ_CYCLE: return mut_cycle(s, r);
    case FUZZ_RESIDENCY: return mut_residency(s, r);
    case FUZZ_OOB: return mut_oob(s, r);
    case FUZZ_BAD_PARAMS: return mut_bad_params(s, r);
    case FUZZ_MERGE_COUNTERS: return mut_merge_counters(s, r);
    case FUZZ_SIGNAL_AMOUNT: return mut_signal_amount(s, r);
    case FUZZ_MOVE_WAIT: return mut_move_wait(s, r);
    case FUZZ_NONE:
    case FUZZ_RANDOM:
    case FUZZ_RANDOM_DAG:
    case FUZZ_CLASS_COUNT: break;
    }
    return false;
}

/* ---- random schedules ---- */

static void random_op(Schedule *s, FuzzRng *r, uint32_t w, const uint32_t *bufs)
{
    int32_t p[OP_MAX_PARAMS] = {0};
    Access a[OP_MAX_OPERANDS];
    int op = fuzz_below(r, 3) ? OP_ADD : OP_SILU_MUL;
    p[0] = (int32_t)fuzz_below(r, 16);
    p[1] = p[0] + 1 + (int32_t)fuzz_below(r, (uint32_t)(16 - p[0]));
    for (int i = 0; i < op_info(op)->noperands; i++)
        a[i] = (Access){.buf = bufs[fuzz_below(r, 3)]};
    sched_op(s, (int)w, op, p, a);
    op_refresh(s, &s->workers[w].insts[s->workers[w].ninst - 1]);
}

Schedule *fuzz_random(FuzzRng *r, int workers_max)
{
    uint32_t nw = 2 + fuzz_below(r, (uint32_t)(workers_max > 4 ? 3 : workers_max - 1));
    Schedule *s = sched_new("random", "cpu", (int)nw);
    s->shape = (ModelShape){.dim = 16, .hidden_dim = 16, .n_layers = 1, .n_heads = 1, .n_kv_heads = 1,
                            .head_dim = 16, .vocab_size = 16, .max_seq = 8, .norm_eps = 1e-5};
    int64_t shape[1] = {16};
    uint32_t bufs[3] = {sched_add_buffer(s, "a", DT_F32, BUF_SCRATCH, 1, shape),
                        sched_add_buffer(s, "b", DT_F32, BUF_STATE, 1, shape),
                        sched_add_buffer(s, "c", DT_F32, BUF_SCRATCH, 1, shape)};
    uint32_t nc = 1 + fuzz_below(r, 3);
    for (uint32_t k = 0; k < nc; k++) {
        char name[16];
        snprintf(name, sizeof name, "c%u", k);
        sched_add_counter(s, name);
    }
    /* worker 0 initializes the scratch buffers and publishes them on c0 */
    int32_t pn[OP_MAX_PARAMS] = {16};
    for (int i = 0; i < 2; i++) {
        Access an[3] = {{bufs[1], ACC_R, {0, 0}, {16, 0}}, {bufs[1], ACC_R, {0, 0}, {16, 0}},
                        {bufs[i * 2], ACC_W, {0, 0}, {16, 0}}};
        sched_op(s, 0, OP_RMSNORM, pn, an);
    }
    sched_signal(s, 0, 0, (uint32_t)(nw - 1));
    for (uint32_t w = 0; w < nw; w++) {
        if (w > 0 && fuzz_below(r, 10) < 7)
            sched_wait(s, (int)w, 0, nw - 1);
        for (uint32_t n = 2 + fuzz_below(r, 5); n-- > 0;) {
            uint32_t k = fuzz_below(r, 4);
            if (k < 2)
                random_op(s, r, w, bufs);
            else if (k == 2)
                sched_signal(s, (int)w, fuzz_below(r, nc), 1 + fuzz_below(r, 2));
            else
                sched_wait(s, (int)w, fuzz_below(r, nc), 1 + fuzz_below(r, 3));
        }
    }
    return s;
}

typedef struct DagTask {
    uint32_t w, a, b, ctr, amount;
    int32_t r0, r1;
    uint64_t upto;          /* increments to ctr from tasks up to this one */
} DagTask;

static bool dag_conflict(const DagTask *x, const DagTask *y)
{
    bool meet = x->r0 < y->r1 && y->r0 < x->r1;
    return meet && (x->a == y->a || x->a == y->b || y->a == x->b);
}

/* Appends the waits task j needs (on its worker), then j, then its signal. */
static void dag_emit(Schedule *s, FuzzRng *r, const DagTask *t, uint32_t j)
{
    for (uint32_t i = 0; i < j; i++) {
        if (t[i].w == t[j].w || !dag_conflict(&t[i], &t[j]))
            continue;
        uint32_t k = fuzz_below(r, 20);
        if (k == 0)
            continue;   /* forgotten */
        uint64_t thr = t[i].upto;
        if (k == 1 && thr > 1)
            thr--;      /* one short */
        sched_wait(s, (int)t[j].w, t[i].ctr, (uint32_t)thr);
    }
    int32_t p[OP_MAX_PARAMS] = {t[j].r0, t[j].r1};
    Access acc[2] = {{t[j].a, ACC_RW, {t[j].r0, 0}, {t[j].r1, 0}}, {t[j].b, ACC_R, {t[j].r0, 0}, {t[j].r1, 0}}};
    sched_op(s, (int)t[j].w, OP_ADD, p, acc);
    sched_signal(s, (int)t[j].w, t[j].ctr, t[j].amount);
}

Schedule *fuzz_random_dag(FuzzRng *r, int workers_max)
{
    uint32_t nw = 2 + fuzz_below(r, (uint32_t)(workers_max > 4 ? 3 : workers_max - 1));
    uint32_t ntask = 4 + fuzz_below(r, 7), nc = 1 + fuzz_below(r, 4);
    Schedule *s = sched_new("random-dag", "cpu", (int)nw);
    s->shape = (ModelShape){.dim = 16, .hidden_dim = 16, .n_layers = 1, .n_heads = 1, .n_kv_heads = 1,
                            .head_dim = 16, .vocab_size = 16, .max_seq = 8, .norm_eps = 1e-5};
    int64_t shape[1] = {16};
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "s%d", i);
        sched_add_buffer(s, name, DT_F32, BUF_STATE, 1, shape);
    }
    for (uint32_t k = 0; k < nc; k++) {
        char name[16];
        snprintf(name, sizeof name, "c%u", k);
        sched_add_counter(s, name);
    }
    DagTask t[16];
    uint64_t total[4] = {0};
    for (uint32_t j = 0; j < ntask; j++) {
        DagTask *x = &t[j];
        x->w = fuzz_below(r, nw);
        x->a = fuzz_below(r, 3);
        x->b = fuzz_below(r, 3);
        x->r0 = (int32_t)fuzz_below(r, 16);
        x->r1 = x->r0 + 1 + (int32_t)fuzz_below(r, (uint32_t)(16 - x->r0));
        x->ctr = fuzz_below(r, nc);
        x->amount = 1 + fuzz_below(r, 2);
        x->upto = total[x->ctr] += x->amount;
    }
    for (uint32_t j = 0; j < ntask; j++)
        dag_emit(s, r, t, j);
    return s;
}
