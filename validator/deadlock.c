/*
 * deadlock.c - deadlock freedom, co-residency, and the happens-before
 * clocks the race pass needs.
 *
 * Counters only grow and a wait only needs a counter to be large enough,
 * so an instruction that can run stays able to run: enabledness is
 * persistent and a single greedy execution (run every worker as far as it
 * can, repeat until nothing moves) decides whether the step completes, in
 * the exact per-worker order. When it stalls, every blocked wait is either
 * unsatisfiable (threshold above the counter's total increments), on a
 * never-signalled counter (a structure error), or waits for increments
 * that sit behind other blocked workers: the wait-for graph then has a
 * cycle, and the waits on cycles are reported with the blocking partner.
 *
 * Happens-before (§3): program order plus, for a wait `c >= n`, the
 * signals s to c it is guaranteed to observe: those with amount(s) >
 * total(c) - n, since without s the counter cannot reach n. Refinement:
 * a signal that follows (in its worker) a wait on c with threshold >= n
 * cannot run before c first reaches n, so it neither helps reach n nor is
 * observed; leaving those out of total(c) keeps the rule sound and orders
 * what a duplicated late signal would otherwise leave unordered. The same
 * holds for a signal that happens after such a wait through other
 * workers. And when c first reaches n, the signals that ran are closed
 * under happens-before: if s has not run, neither has any signal after
 * s, so s is guaranteed when the early increments outside s and its
 * successors sum to less than n. Finally, some early signal has run when
 * the wait passes, so the meet of their clocks happens before it too
 * (a common producer reached through different workers). The run is repeated (at most 4 more times) with the
 * happens-before of the previous run, each sound, until nothing changes.
 * Each wait gets
 * a vector clock (clock[i] = how many of worker i's instructions happen
 * before it), the join of its worker's clock and the clocks of the
 * guaranteed signals; joins are cached per (counter, threshold). The
 * greedy run is a topological order, so every guaranteed signal has run
 * (and has its clock) by the time its wait passes.
 */
#include "validator/val_int.h"

#include <stdlib.h>
#include <string.h>

#define NOCLOCK UINT32_MAX

typedef struct JoinCache {
    uint32_t counter, n, clock, next;
} JoinCache;

typedef struct Exec {
    uint32_t *pc;           /* (nw) */
    uint32_t *cur;          /* (nw) clock of each worker's current segment */
    uint64_t *value;        /* (nctrs) */
    uint32_t *sig_start;    /* (nctrs + 1) CSR of signal instructions per counter */
    uint32_t *sig;          /* global ids of signals */
    uint32_t *sig_w;        /* their workers */
    uint32_t *sig_after;    /* the largest threshold of a wait on the same counter
                               known to happen before the signal (0: none) */
    uint32_t *sigclk;       /* (nsig * nw) each signal's clock in the previous run,
                               own entry included; NULL before the second run */
    bool lower_bound;       /* a meet used a signal the run had not reached */
    size_t *after_ofs;      /* (nctrs) offset of counter c's matrix in `after` */
    uint8_t *after;         /* after[i*k + j]: signal j of c happens after signal i */
    JoinCache *jc;
    uint32_t njc, capjc;
    uint32_t *jc_head;      /* (nctrs) */
} Exec;

static uint32_t clock_new(Val *v)
{
    if (v->npool >= v->cappool) {
        v->cappool = v->cappool ? v->cappool * 2 : 64;
        v->pool = xrealloc(v->pool, v->cappool * v->nw * sizeof *v->pool);
    }
    memset(v->pool + v->npool * v->nw, 0, v->nw * sizeof *v->pool);
    return (uint32_t)v->npool++;
}

static void exec_init(Val *v, Exec *e)
{
    const Schedule *s = v->s;
    uint32_t nc = s->nctrs;
    memset(e, 0, sizeof *e);
    e->pc = xcalloc(v->nw, sizeof *e->pc);
    e->cur = xmalloc((v->nw ? v->nw : 1) * sizeof *e->cur);
    for (uint32_t w = 0; w < v->nw; w++)
        e->cur[w] = NOCLOCK;
    e->value = xcalloc(nc ? nc : 1, sizeof *e->value);
    e->sig_start = xcalloc(nc + 1, sizeof *e->sig_start);
    e->jc_head = xmalloc((nc ? nc : 1) * sizeof *e->jc_head);
    for (uint32_t c = 0; c < nc; c++)
        e->jc_head[c] = NOCLOCK;
    uint32_t nsig = 0;
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++)
            if (val_inst(v, w, t)->kind == INST_SIGNAL)
                e->sig_start[val_inst(v, w, t)->counter + 1]++, nsig++;
    for (uint32_t c = 0; c < nc; c++)
        e->sig_start[c + 1] += e->sig_start[c];
    e->sig = xmalloc((nsig ? nsig : 1) * sizeof *e->sig);
    e->sig_w = xmalloc((nsig ? nsig : 1) * sizeof *e->sig_w);
    e->sig_after = xmalloc((nsig ? nsig : 1) * sizeof *e->sig_after);
    uint32_t *fill = xcalloc(nc ? nc : 1, sizeof *fill);
    uint32_t *wmax = xcalloc(nc ? nc : 1, sizeof *wmax);
    for (uint32_t w = 0; w < v->nw; w++) {
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = val_inst(v, w, t);
            if (in->kind == INST_WAIT && in->amount > wmax[in->counter])
                wmax[in->counter] = in->amount;
            if (in->kind != INST_SIGNAL)
                continue;
            uint32_t k = e->sig_start[in->counter] + fill[in->counter]++;
            e->sig[k] = v->base[w] + t;
            e->sig_w[k] = w;
            e->sig_after[k] = wmax[in->counter];
        }
        for (uint32_t t = 0; t < s->workers[w].ninst; t++)
            if (val_inst(v, w, t)->kind == INST_WAIT)
                wmax[val_inst(v, w, t)->counter] = 0;
    }
    free(fill);
    free(wmax);
    e->after_ofs = xcalloc(nc + 1, sizeof *e->after_ofs);
    for (uint32_t c = 0; c < nc; c++) {
        size_t k = e->sig_start[c + 1] - e->sig_start[c];
        e->after_ofs[c + 1] = e->after_ofs[c] + k * k;
    }
    e->after = xcalloc(e->after_ofs[nc] + 1, 1);
    for (uint32_t c = 0; c < nc; c++) {
        uint32_t s0 = e->sig_start[c], k = e->sig_start[c + 1] - s0;
        for (uint32_t i = 0; i < k; i++)
            for (uint32_t j = 0; j < k; j++)
                e->after[e->after_ofs[c] + (size_t)i * k + j] = e->sig_w[s0 + i] == e->sig_w[s0 + j] && e->sig[s0 + j] > e->sig[s0 + i];
    }
}

static void exec_fini(Exec *e)
{
    free(e->pc);
    free(e->cur);
    free(e->value);
    free(e->sig_start);
    free(e->sig);
    free(e->sig_w);
    free(e->sig_after);
    free(e->sigclk);
    free(e->after_ofs);
    free(e->after);
    free(e->jc);
    free(e->jc_head);
}

/* At least one early signal of c has run when a wait `c >= n` passes, so
 * what happens before all of them happens before the wait: dst is joined
 * with the meet of their clocks. A signal the greedy run has not reached
 * yet contributes its worker's current clock, a lower bound of its own. */
static void meet_early(Val *v, Exec *e, uint32_t c, uint32_t n, uint32_t *dst)
{
    uint32_t *m = xmalloc(v->nw * sizeof *m);
    for (uint32_t x = 0; x < v->nw; x++)
        m[x] = UINT32_MAX;
    for (uint32_t k = e->sig_start[c]; k < e->sig_start[c + 1]; k++) {
        uint32_t w = e->sig_w[k], t = e->sig[k] - v->base[w];
        if (e->sig_after[k] >= n)
            continue;
        bool ran = e->pc[w] > t;
        uint32_t id = ran ? v->seg[e->sig[k]] : e->cur[w];
        const uint32_t *src = id == NOCLOCK ? NULL : val_clock(v, id);
        const uint32_t *prev = !ran && e->sigclk ? e->sigclk + (size_t)k * v->nw : NULL;
        e->lower_bound |= !ran;
        for (uint32_t x = 0; x < v->nw; x++) {
            uint32_t val = src ? src[x] : 0;
            if (prev && prev[x] > val)
                val = prev[x];
            if (x == w && val < t + 1)
                val = t + 1;
            if (val < m[x])
                m[x] = val;
        }
    }
    for (uint32_t x = 0; x < v->nw; x++)
        if (m[x] != UINT32_MAX && m[x] > dst[x])
            dst[x] = m[x];
    free(m);
}

/* The clock of everything a wait `c >= n` is guaranteed to observe. */
static uint32_t join_guaranteed(Val *v, Exec *e, uint32_t c, uint32_t n)
{
    for (uint32_t j = e->jc_head[c]; j != NOCLOCK; j = e->jc[j].next)
        if (e->jc[j].n == n)
            return e->jc[j].clock;
    uint32_t id = clock_new(v);
    uint32_t s0 = e->sig_start[c], ns = e->sig_start[c + 1] - s0;
    const uint8_t *after = e->after + e->after_ofs[c];
    uint64_t early = 0;     /* increments that can run before c first reaches n */
    for (uint32_t k = s0; k < s0 + ns; k++)
        if (e->sig_after[k] < n)
            early += val_inst(v, e->sig_w[k], e->sig[k] - v->base[e->sig_w[k]])->amount;
    ASSERT(early >= n);     /* the wait passed, so c reached n with these alone */
    for (uint32_t i = 0; i < ns; i++) {
        uint32_t k = s0 + i, g = e->sig[k], w = e->sig_w[k], t = g - v->base[w];
        if (e->sig_after[k] >= n)
            continue;
        /* without s, neither s nor what follows s can have run */
        uint64_t with_s = val_inst(v, w, t)->amount;
        for (uint32_t j = 0; j < ns; j++)
            if (after[(size_t)i * ns + j] && e->sig_after[s0 + j] < n)
                with_s += val_inst(v, e->sig_w[s0 + j], e->sig[s0 + j] - v->base[e->sig_w[s0 + j]])->amount;
        if (with_s <= early - n)
            continue;
        ASSERT(e->pc[w] > t);
        uint32_t *dst = v->pool + (size_t)id * v->nw;
        if (v->seg[g] != NOCLOCK) {
            const uint32_t *src = val_clock(v, v->seg[g]);
            for (uint32_t x = 0; x < v->nw; x++)
                if (src[x] > dst[x])
                    dst[x] = src[x];
        }
        if (dst[w] < t + 1)
            dst[w] = t + 1;
    }
    meet_early(v, e, c, n, v->pool + (size_t)id * v->nw);
    VEC_PUSH(e->jc, e->njc, e->capjc, ((JoinCache){c, n, id, e->jc_head[c]}));
    e->jc_head[c] = e->njc - 1;
    return id;
}

/* Passes wait (w, pc): the worker's clock becomes the join with what it observes. */
static void exec_wait(Val *v, Exec *e, uint32_t w, const Inst *in)
{
    uint32_t j = join_guaranteed(v, e, in->counter, in->amount);
    uint32_t id = clock_new(v);
    uint32_t *dst = v->pool + (size_t)id * v->nw;
    const uint32_t *src = val_clock(v, j);
    if (e->cur[w] != NOCLOCK)
        memcpy(dst, val_clock(v, e->cur[w]), v->nw * sizeof *dst);
    for (uint32_t i = 0; i < v->nw; i++)
        if (src[i] > dst[i])
            dst[i] = src[i];
    e->cur[w] = id;
}

/* Runs worker w until it blocks or finishes; true if it moved. */
static bool exec_worker(Val *v, Exec *e, uint32_t w)
{
    const Worker *wk = &v->s->workers[w];
    bool moved = false;
    while (e->pc[w] < wk->ninst) {
        const Inst *in = &wk->insts[e->pc[w]];
        if (in->kind == INST_WAIT && e->value[in->counter] < in->amount)
            break;
        v->seg[v->base[w] + e->pc[w]] = e->cur[w];
        if (in->kind == INST_WAIT)
            exec_wait(v, e, w, in);
        else if (in->kind == INST_SIGNAL)
            e->value[in->counter] += in->amount;
        e->pc[w]++;
        moved = true;
    }
    return moved;
}

/* Notes citing the signals of counter c (the first few). */
static void signals_note(Val *v, uint32_t c)
{
    int shown = 0;
    for (uint32_t w = 0; w < v->nw && shown < 4; w++)
        for (uint32_t t = 0; t < v->s->workers[w].ninst && shown < 4; t++) {
            const Inst *in = val_inst(v, w, t);
            if (in->kind == INST_SIGNAL && in->counter == c) {
                val_note(v, in->line, "worker %u inst %u signals %s +%u", w, t, v->s->ctrs[c].name, in->amount);
                shown++;
            }
        }
}

static void unsatisfiable_report(Val *v)
{
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < v->s->workers[w].ninst; t++) {
            const Inst *in = val_inst(v, w, t);
            uint64_t tot = in->kind == INST_WAIT ? v->ctotal[in->counter] : 0;
            if (in->kind == INST_WAIT && tot > 0 && in->amount > tot)
                val_error(v, &v->r->ndeadlock, in->line,
                          "deadlock: worker %u inst %u: wait %s >= %u can never pass: the step signals it only %llu "
                          "times in all",
                          w, t, v->s->ctrs[in->counter].name, in->amount, (unsigned long long)tot);
            if (in->kind == INST_WAIT && tot > 0 && in->amount > tot)
                signals_note(v, in->counter);
        }
}

/* First not-yet-run signal to counter c in worker x (the one w waits for). */
static int64_t pending_signal(const Val *v, const Exec *e, uint32_t c, uint32_t x)
{
    for (uint32_t t = e->pc[x]; t < v->s->workers[x].ninst; t++) {
        const Inst *in = val_inst(v, x, t);
        if (in->kind == INST_SIGNAL && in->counter == c)
            return t;
    }
    return -1;
}

/* The wait-for graph of the stalled run: adj[x*nw + y] when blocked worker
 * x waits on a counter that blocked worker y has yet to signal. Rows of
 * workers blocked on the same counter are computed once. */
static uint8_t *waitfor_graph(const Val *v, const Exec *e)
{
    uint32_t nw = v->nw;
    uint8_t *adj = xcalloc((size_t)nw * nw, 1);
    for (uint32_t x = 0; x < nw; x++) {
        if (e->pc[x] >= v->s->workers[x].ninst)
            continue;
        uint32_t c = val_inst(v, x, e->pc[x])->counter, same = x;
        for (uint32_t p = 0; p < x && same == x; p++)
            if (e->pc[p] < v->s->workers[p].ninst && val_inst(v, p, e->pc[p])->counter == c)
                same = p;
        for (uint32_t y = 0; y < nw; y++)
            adj[(size_t)x * nw + y] = same != x ? adj[(size_t)same * nw + y]
                                                : e->pc[y] < v->s->workers[y].ninst && pending_signal(v, e, c, y) >= 0;
    }
    return adj;
}

/* Can blocked worker `from` reach `to` in the wait-for graph? */
static bool waits_for(const Val *v, const uint8_t *adj, uint32_t from, uint32_t to, uint8_t *seen)
{
    uint32_t *stack = xmalloc(v->nw * sizeof *stack), n = 0;
    bool found = false;
    memset(seen, 0, v->nw);
    stack[n++] = from;
    seen[from] = 1;
    while (n && !found) {
        uint32_t x = stack[--n];
        for (uint32_t y = 0; y < v->nw && !found; y++) {
            if (!adj[(size_t)x * v->nw + y])
                continue;
            if (y == to)
                found = true;
            else if (!seen[y])
                seen[y] = 1, stack[n++] = y;
        }
    }
    free(stack);
    return found;
}

static void stall_report(Val *v, const Exec *e)
{
    uint8_t *seen = xmalloc(v->nw), *adj = waitfor_graph(v, e);
    for (uint32_t w = 0; w < v->nw; w++) {
        if (e->pc[w] >= v->s->workers[w].ninst)
            continue;
        const Inst *in = val_inst(v, w, e->pc[w]);
        uint64_t tot = v->ctotal[in->counter];
        if (tot == 0 || in->amount > tot || !waits_for(v, adj, w, w, seen))
            continue;
        const char *cn = v->s->ctrs[in->counter].name;
        uint32_t x = w;
        int64_t st = -1;
        for (uint32_t y = 0; y < v->nw && st < 0; y++)
            if (e->pc[y] < v->s->workers[y].ninst && (st = pending_signal(v, e, in->counter, y)) >= 0)
                x = y;
        val_error(v, &v->r->ndeadlock, in->line,
                  "deadlock: worker %u inst %u: wait %s >= %u is stuck at %llu: the missing increments (worker %u "
                  "inst %lld, signal %s) sit behind a blocked wait that (transitively) waits on this worker",
                  w, e->pc[w], cn, in->amount, (unsigned long long)e->value[in->counter], x, (long long)st, cn);
        const Inst *xb = val_inst(v, x, e->pc[x]);
        val_note(v, xb->line, "worker %u is blocked at inst %u, %s >= %u", x, e->pc[x],
                 val_inst_name(v, x, e->pc[x]), xb->amount);
    }
    if (v->r->ndeadlock == 0 && v->r->nstructure == 0)
        for (uint32_t w = 0; w < v->nw; w++)
            if (e->pc[w] < v->s->workers[w].ninst) {
                const Inst *in = val_inst(v, w, e->pc[w]);
                val_error(v, &v->r->ndeadlock, in->line, "deadlock: worker %u inst %u: %s >= %u never passes", w,
                          e->pc[w], val_inst_name(v, w, e->pc[w]), in->amount);
                break;
            }
    free(seen);
    free(adj);
}

/* One greedy run from the initial state; true if every worker finished. */
static bool exec_run(Val *v, Exec *e)
{
    memset(e->pc, 0, v->nw * sizeof *e->pc);
    memset(e->value, 0, (v->s->nctrs ? v->s->nctrs : 1) * sizeof *e->value);
    for (uint32_t w = 0; w < v->nw; w++)
        e->cur[w] = NOCLOCK;
    for (uint32_t c = 0; c < v->s->nctrs; c++)
        e->jc_head[c] = NOCLOCK;
    e->njc = 0;
    v->npool = 0;
    for (uint32_t g = 0; g < v->ntotal; g++)
        v->seg[g] = NOCLOCK;
    for (bool moved = true; moved;) {
        moved = false;
        for (uint32_t w = 0; w < v->nw; w++)
            moved |= exec_worker(v, e, w);
    }
    bool done = true;
    for (uint32_t w = 0; w < v->nw; w++)
        done &= e->pc[w] >= v->s->workers[w].ninst;
    return done;
}

/* The waits on one counter, by (worker, inst), with the running maximum of
 * their thresholds within each worker. */
typedef struct CWait {
    uint32_t w, t, pmax;
} CWait;

/* Largest threshold of a wait on c (in cw[0..n)) that happens before the
 * instruction whose clock is clk (worker w, index t). */
static uint32_t waits_before(const Val *v, const CWait *cw, uint32_t n, const uint32_t *clk, uint32_t w, uint32_t t)
{
    uint32_t best = 0;
    for (uint32_t s = 0, e; s < n; s = e) {
        uint32_t i = cw[s].w, bound = i == w ? t : clk ? clk[i] : 0;
        for (e = s; e < n && cw[e].w == i; e++)
            ;
        uint32_t lo = s, hi = e;    /* last entry with t < bound */
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (cw[mid].t < bound)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo > s && cw[lo - 1].pmax > best)
            best = cw[lo - 1].pmax;
    }
    return best;
}

/* Widens sig_after with the happens-before of the last run: a signal that
 * happens after a wait on its counter cannot help that wait's threshold be
 * reached first. True if anything changed. */
static bool exec_refine(Val *v, Exec *e)
{
    const Schedule *s = v->s;
    uint32_t nc = s->nctrs;
    uint32_t *start = xcalloc(nc + 1, sizeof *start), *fill = xcalloc(nc ? nc : 1, sizeof *fill);
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++)
            if (val_inst(v, w, t)->kind == INST_WAIT)
                start[val_inst(v, w, t)->counter + 1]++;
    for (uint32_t c = 0; c < nc; c++)
        start[c + 1] += start[c];
    CWait *cw = xmalloc((start[nc] ? start[nc] : 1) * sizeof *cw);
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = val_inst(v, w, t);
            if (in->kind != INST_WAIT)
                continue;
            uint32_t k = start[in->counter] + fill[in->counter]++;
            uint32_t prev = k > start[in->counter] && cw[k - 1].w == w ? cw[k - 1].pmax : 0;
            cw[k] = (CWait){w, t, in->amount > prev ? in->amount : prev};
        }
    bool changed = false;
    for (uint32_t c = 0; c < nc; c++)
        for (uint32_t k = e->sig_start[c]; k < e->sig_start[c + 1]; k++) {
            uint32_t g = e->sig[k], w = e->sig_w[k];
            const uint32_t *clk = v->seg[g] == NOCLOCK ? NULL : val_clock(v, v->seg[g]);
            uint32_t m = waits_before(v, cw + start[c], start[c + 1] - start[c], clk, w, g - v->base[w]);
            if (m > e->sig_after[k])
                e->sig_after[k] = m, changed = true;
        }
    for (uint32_t c = 0; c < nc; c++) {
        uint32_t s0 = e->sig_start[c], k = e->sig_start[c + 1] - s0;
        uint8_t *after = e->after + e->after_ofs[c];
        for (uint32_t j = 0; j < k; j++) {
            uint32_t gj = e->sig[s0 + j];
            if (v->seg[gj] == NOCLOCK)
                continue;
            const uint32_t *clk = val_clock(v, v->seg[gj]);
            for (uint32_t i = 0; i < k; i++) {
                uint32_t wi = e->sig_w[s0 + i];
                if (!after[(size_t)i * k + j] && wi != e->sig_w[s0 + j] && clk[wi] > e->sig[s0 + i] - v->base[wi])
                    after[(size_t)i * k + j] = 1, changed = true;
            }
        }
    }
    free(start);
    free(fill);
    free(cw);
    return changed;
}

/* Keeps each signal's clock from the run just made, for the meets of the
 * next run (a sound lower bound of the clock). True if any grew. */
static bool sigclk_update(Val *v, Exec *e)
{
    uint32_t nsig = e->sig_start[v->s->nctrs];
    bool grew = false;
    if (!e->sigclk)
        e->sigclk = xcalloc((size_t)(nsig ? nsig : 1) * v->nw, sizeof *e->sigclk);
    for (uint32_t k = 0; k < nsig; k++) {
        uint32_t g = e->sig[k], w = e->sig_w[k];
        uint32_t *dst = e->sigclk + (size_t)k * v->nw;
        const uint32_t *src = v->seg[g] == NOCLOCK ? NULL : val_clock(v, v->seg[g]);
        for (uint32_t x = 0; x < v->nw; x++) {
            uint32_t val = x == w ? g - v->base[w] + 1 : src ? src[x] : 0;
            if (val > dst[x])
                dst[x] = val, grew = true;
        }
    }
    return grew;
}

static int header_line(const Val *v);

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* What the analysis below will hold and do, known before it starts: the
 * signal-order tables (k^2 bytes for a counter of k signals), the clocks
 * (one per wait and one per distinct (counter, threshold) join, nw entries
 * each) and the guaranteed-signal scans (k^2 steps per distinct threshold
 * of a counter). A schedule past the budget is reported as not checked,
 * before anything is allocated, instead of the machine's memory ending the
 * run: clocks grow as waits x workers, about workers^2 for a model
 * (Llama-3.1-8B for the CPU: 16 MB at 132 workers, 256 MB at 512).
 * MEGAC_VALIDATE_MAX_GB sets the memory budget (default 8). Sizes the
 * clock pool once (clock_new's doubling could overshoot by 2x). */
static bool val_budget_check(Val *v)
{
    const Schedule *s = v->s;
    uint32_t nc = s->nctrs;
    uint64_t *k = xcalloc(nc ? nc : 1, sizeof *k), nwait = 0;
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = val_inst(v, w, t);
            k[in->counter] += in->kind == INST_SIGNAL;
            nwait += in->kind == INST_WAIT;
        }
    uint64_t *key = xmalloc((nwait ? nwait : 1) * sizeof *key), n = 0;
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++)
            if (val_inst(v, w, t)->kind == INST_WAIT)
                key[n++] = (uint64_t)val_inst(v, w, t)->counter << 32 | val_inst(v, w, t)->amount;
    qsort(key, n, sizeof *key, u64_cmp);
    double tables = 0, work = 0;
    uint64_t joins = 0, worst = 0;
    uint32_t worst_c = 0;
    for (uint32_t c = 0; c < nc; c++)
        tables += (double)k[c] * (double)k[c];
    for (uint64_t i = 0; i < n; i++)
        if (i == 0 || key[i] != key[i - 1]) {
            uint32_t c = (uint32_t)(key[i] >> 32);
            joins++, work += (double)k[c] * (double)k[c];
            if (k[c] > worst)
                worst = k[c], worst_c = c;
        }
    free(key);
    free(k);
    double clocks = (double)(nwait + joins) * v->nw * sizeof *v->pool, gb = 8;
    const char *env = getenv("MEGAC_VALIDATE_MAX_GB");
    char *end;
    if (env && *env && strtod(env, &end) > 0 && *end == 0) /* else the default (megac warns) */
        gb = strtod(env, NULL);
    int line = header_line(v);
    if (clocks + tables > gb * (1 << 30))
        val_error(v, &v->r->nlimit, line,
                  "not checked: its happens-before clocks (%llu waits x %u workers: %.3g GB) and signal-order "
                  "tables (%.3g GB; counter %s has %llu signals) are past the validator's budget of %g GB "
                  "(MEGAC_VALIDATE_MAX_GB)",
                  (unsigned long long)nwait, v->nw, clocks / (1 << 30), tables / (1 << 30), s->ctrs[worst_c].name,
                  (unsigned long long)worst, gb);
    else if (work > 1e10)
        val_error(v, &v->r->nlimit, line,
                  "not checked: the happens-before analysis of the counters' waits would take %.3g steps (counter %s "
                  "has %llu signals), past the validator's budget of 1e10 (minutes of work)",
                  work, s->ctrs[worst_c].name, (unsigned long long)worst);
    if (v->r->nlimit)
        return false;
    v->cappool = nwait + joins + 1;
    v->pool = xrealloc(v->pool, v->cappool * (v->nw ? v->nw : 1) * sizeof *v->pool);
    return true;
}

bool val_deadlock_check(Val *v)
{
    Exec e;
    int before = v->r->ndeadlock;
    unsatisfiable_report(v);
    if (!val_budget_check(v))
        return false;
    exec_init(v, &e);
    v->seg = xmalloc((v->ntotal ? v->ntotal : 1) * sizeof *v->seg);
    bool done = exec_run(v, &e);
    if (!done)
        stall_report(v, &e);
    for (int pass = 0; done && pass < 4; pass++) {
        bool changed = exec_refine(v, &e);
        if (e.lower_bound)
            changed |= sigclk_update(v, &e);
        if (!changed)
            break;
        e.lower_bound = false;
        exec_run(v, &e);
    }
    exec_fini(&e);
    return done && v->r->ndeadlock == before;
}

/* The line of the `schedule ...` header, for whole-schedule findings. */
static int header_line(const Val *v)
{
    const SrcFile *f = v->o ? v->o->src : NULL;
    if (!f || !f->text)
        return 0;
    int line = 1;
    for (const char *p = f->text, *end = f->text + f->len; p < end; line++) {
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if ((size_t)(end - p) >= 9 && strncmp(p, "schedule ", 9) == 0)
            return line;
        while (p < end && *p != '\n')
            p++;
        p++;
    }
    return 0;
}

/* CUDA: a persistent kernel needs all its blocks resident at once. */
void val_residency_check(Val *v)
{
    const Target *t = v->o->target;
    if (!t || t->kind != TARGET_CUDA)
        return;
    const ValOptions *o = v->o;
    int64_t per_sm = t->max_blocks_per_sm;
    if (o->threads_per_block <= 0) {
        per_sm = 1;     /* unknown kernel resources: one block per SM is all we can promise */
    } else {
        int64_t th = o->threads_per_block;
        if (t->max_threads_per_sm / th < per_sm)
            per_sm = t->max_threads_per_sm / th;
        if (o->regs_per_thread > 0 && t->regs_per_sm / (th * o->regs_per_thread) < per_sm)
            per_sm = t->regs_per_sm / (th * o->regs_per_thread);
        if (o->smem_per_block > 0 && t->smem_per_sm / o->smem_per_block < per_sm)
            per_sm = t->smem_per_sm / o->smem_per_block;
    }
    int64_t cap = per_sm * t->sms;
    if ((int64_t)v->nw > cap)
        val_error(v, &v->r->nresidency, header_line(v),
                  "residency: %u workers cannot all be resident on %s: %d SMs x %lld blocks per SM = %lld; a "
                  "persistent kernel whose blocks wait on non-resident ones spins forever",
                  v->nw, t->name, t->sms, (long long)per_sm, (long long)cap);
}
