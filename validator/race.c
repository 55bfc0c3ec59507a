/*
 * race.c - race freedom, uninitialized scratch reads, outputs written whole, and
 * KV order.
 *
 * For each buffer that is written in the step, the accesses are grouped by
 * worker in program order. For an access a of worker j and the writes of
 * another worker i, happens-before splits i's writes into three runs,
 * found by binary search because clocks grow along program order:
 *   [0, c1)   writes that happen before a (clock_a[i] > t),
 *   [c1, c2)  writes unordered with a,
 *   [c2, n)   writes that a happens before (clock_x[j] > t_a).
 * Only the middle run needs an overlap test (exact over pos in [0,
 * max_seq), affine.c); an overlap there is a race. Write-write pairs are
 * examined once, from the worker with the higher index. No pair is
 * skipped, whatever the schedule's size. A worker's accesses are taken in
 * program order, and along it both splits only move forward (its clock
 * grows, and so does its instruction index), so each worker keeps a cursor
 * per run: the work per (access, run) is a comparison or two, not two
 * binary searches through clocks scattered over the pool.
 *
 * Scratch reads must be covered, for every pos, by writes that happen
 * before them (the first run of every worker, plus earlier writes of the
 * same worker); coverage is decided at every pos where the order of the
 * ranges' ends can change. An io buffer that the step writes is an output
 * (logits, next): its reads in the step are checked as scratch reads, and
 * the step's writes must cover all of it, since the host reads it after
 * the step; an io buffer the step neither reads nor writes is an error
 * (an output nothing writes). KV buffers: a read that overlaps a write of
 * this step must come after it (kv-order), in the same worker too, and a
 * KV buffer the step reads must be one it writes (its new rows).
 */
#include "validator/val_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct RAcc {
    uint32_t w, t;
    uint8_t mode;
    Affine lo, hi;
    int64_t hlo, hhi;       /* hull over all pos */
} RAcc;

typedef struct BufAccs {
    RAcc *all;              /* every access on the buffer, by (worker, inst) */
    uint32_t nall;
    RAcc *wr;               /* the writes, by (worker, inst) */
    uint32_t nwr;
    uint32_t *run;          /* (nrun + 1) start of each worker's writes in wr */
    uint32_t nrun;
    bool affine;            /* some range depends on pos */
} BufAccs;

typedef struct Ivl {
    int64_t lo, hi;
} Ivl;

/* Where a run of writes stands against the current access a of one worker:
 * [run start, c1) happen before a, [c2, run end) happen after it; thr is
 * the entry of wr[c2]'s clock for a's worker (a happens before wr[c2] iff
 * thr > a's instruction index). */
typedef struct Cursor {
    uint32_t c1, c2, thr;
} Cursor;

/* A read range proved covered by gathered writes (their indices in wr:
 * Race.midx[at, at + n)). After a barrier every worker that reads a vector
 * gathers the same latest writes of it, so the proof is made once. */
typedef struct CovMemo {
    uint64_t hash;
    Affine lo, hi;
    uint32_t n, at;
} CovMemo;

typedef struct Race {
    Val *v;
    BufAccs *b;
    uint32_t buf;
    Cursor *cur;            /* (nrun) for the worker whose accesses are being checked */
    RAcc **cov;             /* writes gathered for a coverage test */
    uint32_t ncov, capcov;
    Ivl *ivl;
    uint32_t capivl;
    CovMemo *memo;          /* this buffer's proofs */
    uint32_t nmemo, capmemo;
    uint32_t *midx;
    size_t nmidx, capmidx;
    uint32_t *slot;         /* (capslot, a power of two) open addressing: memo index + 1, 0 empty */
    uint32_t capslot;
    uint32_t *col;          /* (nwr x COL_BLOCK) each write's clock entries for workers col_j0.. */
    size_t capcol;
    uint32_t col_j0;        /* UINT32_MAX: not built for this buffer */
} Race;

/* Workers whose clock entries a pass over the writes copies at once: the
 * entries of one clock for 16 workers share a cache line, which serves
 * the 16 of them in turn where each would have read it apart. */
#define COL_BLOCK 16

static bool racc_overlap(const Val *v, const RAcc *a, const RAcc *b, int64_t *pos)
{
    if (a->hhi <= b->hlo || b->hhi <= a->hlo)
        return false;
    *pos = affine_overlap_pos(a->lo, a->hi, b->lo, b->hi, v->nseq);
    return *pos >= 0;
}

static const char *acc_desc(const Val *v, uint32_t buf, const RAcc *a, char *out, size_t n)
{
    char lo[48], hi[48];
    snprintf(out, n, "worker %u inst %u (%s) %s %s[%s:%s]", a->w, a->t, val_inst_name(v, a->w, a->t),
             a->mode == ACC_R ? "reads" : a->mode == ACC_W ? "writes" : "updates", v->s->bufs[buf].name,
             affine_str(a->lo, lo, sizeof lo), affine_str(a->hi, hi, sizeof hi));
    return out;
}

static void race_report(Race *rc, const RAcc *a, const RAcc *x, int64_t pos, bool kv_order)
{
    Val *v = rc->v;
    char da[256], dx[256];
    const RAcc *late = a, *early = x;
    if (!kv_order && (x->w > a->w || (x->w == a->w && x->t > a->t)))
        late = x, early = a;
    if (kv_order)
        late = a, early = x;
    acc_desc(v, rc->buf, late, da, sizeof da);
    acc_desc(v, rc->buf, early, dx, sizeof dx);
    if (kv_order)
        val_error(v, &v->r->nrace, val_inst(v, late->w, late->t)->line,
                  "race: kv-order: %s happens before %s, which writes the row this step adds (pos=%lld); the read "
                  "must come after the append",
                  da, dx, (long long)pos);
    else
        val_error(v, &v->r->nrace, val_inst(v, late->w, late->t)->line,
                  "race: %s and %s are not ordered by happens-before; they overlap at pos=%lld", da, dx,
                  (long long)pos);
    val_note(v, val_inst(v, early->w, early->t)->line, "the other access: %s", dx);
}

/* Splits wr into one run per worker (wr is sorted by worker). */
static void runs_build(BufAccs *b)
{
    b->run = xmalloc((b->nwr + 1) * sizeof *b->run);
    b->nrun = 0;
    for (uint32_t k = 0; k < b->nwr; k++)
        if (k == 0 || b->wr[k].w != b->wr[k - 1].w)
            b->run[b->nrun++] = k;
    b->run[b->nrun] = b->nwr;
}

/* The clock of access a's instruction (NULL: nothing happens before it). */
static const uint32_t *racc_clock(const Val *v, const RAcc *a)
{
    uint32_t id = v->seg[v->base[a->w] + a->t];
    return id == UINT32_MAX ? NULL : val_clock(v, id);
}

/* How many of worker i's instructions happen before access a (its own
 * worker: those before it). */
static uint32_t hb_bound(const RAcc *a, const uint32_t *clk_a, uint32_t i)
{
    return i == a->w ? a->t : clk_a ? clk_a[i] : 0;
}

/* First index in the run [lo, hi) of worker i whose write does not happen
 * before a (the writes of worker i before instruction hb_bound do). */
static uint32_t split_before(const RAcc *wr, uint32_t lo, uint32_t hi, const RAcc *a, const uint32_t *clk_a)
{
    uint32_t bound = hb_bound(a, clk_a, wr[lo].w);
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (wr[mid].t < bound)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The entry of write wr[k]'s clock for worker j (0: nothing of j before
 * it), from the columns built for j's block. */
static uint32_t clock_entry(const Race *rc, uint32_t k, uint32_t j)
{
    return rc->col[(size_t)k * COL_BLOCK + (j - rc->col_j0)];
}

/* Copies the clock entries of every write for the block of workers that
 * holds j (once per block and buffer). */
static void columns_build(Race *rc, uint32_t j)
{
    const Val *v = rc->v;
    const BufAccs *b = rc->b;
    uint32_t j0 = j - j % COL_BLOCK, n = v->nw - j0 < COL_BLOCK ? v->nw - j0 : COL_BLOCK;
    if (rc->col_j0 == j0)
        return;
    if ((size_t)b->nwr * COL_BLOCK > rc->capcol) {
        rc->capcol = (size_t)b->nwr * COL_BLOCK;
        rc->col = xrealloc(rc->col, rc->capcol * sizeof *rc->col);
    }
    for (uint32_t k = 0; k < b->nwr; k++) {
        uint32_t id = v->seg[v->base[b->wr[k].w] + b->wr[k].t], *dst = rc->col + (size_t)k * COL_BLOCK;
        if (id == UINT32_MAX)
            memset(dst, 0, n * sizeof *dst);
        else
            memcpy(dst, val_clock(v, id) + j0, n * sizeof *dst);
    }
    rc->col_j0 = j0;
}

/* Starts the cursors of every run over for the accesses of a new worker. */
static void cursors_reset(Race *rc, uint32_t j)
{
    const BufAccs *b = rc->b;
    columns_build(rc, j);
    for (uint32_t r = 0; r < b->nrun; r++) {
        uint32_t s = b->run[r];
        rc->cur[r] = (Cursor){s, s, clock_entry(rc, s, j)};
    }
}

/* Moves run r's cursor to access a, which follows (in its worker's program
 * order) every access the cursor was moved to before. */
static Cursor *cursor_at(Race *rc, uint32_t r, const RAcc *a, const uint32_t *clk_a)
{
    const BufAccs *b = rc->b;
    Cursor *cu = &rc->cur[r];
    uint32_t e = b->run[r + 1], bound = hb_bound(a, clk_a, b->wr[b->run[r]].w);
    while (cu->c1 < e && b->wr[cu->c1].t < bound)
        cu->c1++;
    if (cu->c2 < cu->c1) {
        cu->c2 = cu->c1;
        cu->thr = cu->c2 < e ? clock_entry(rc, cu->c2, a->w) : 0;
    }
    while (cu->c2 < e && cu->thr <= a->t) {
        cu->c2++;
        cu->thr = cu->c2 < e ? clock_entry(rc, cu->c2, a->w) : 0;
    }
    return cu;
}

static void cov_push(Race *rc, RAcc *x)
{
    VEC_PUSH(rc->cov, rc->ncov, rc->capcov, x);
}

static int ivl_cmp(const void *pa, const void *pb)
{
    const Ivl *a = pa, *b = pb;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Is a's range at pos covered by the gathered writes? *gap = first hole. */
static bool covered_at(Race *rc, const RAcc *a, int64_t pos, int64_t *gap)
{
    int64_t lo = affine_at(a->lo, pos), hi = affine_at(a->hi, pos);
    if (rc->ncov > rc->capivl) {
        rc->capivl = rc->ncov * 2;
        rc->ivl = xrealloc(rc->ivl, rc->capivl * sizeof *rc->ivl);
    }
    uint32_t n = 0;
    for (uint32_t k = 0; k < rc->ncov; k++)
        rc->ivl[n++] = (Ivl){affine_at(rc->cov[k]->lo, pos), affine_at(rc->cov[k]->hi, pos)};
    bool sorted = true;
    for (uint32_t k = 1; k < n && sorted; k++)
        sorted = rc->ivl[k - 1].lo <= rc->ivl[k].lo;
    if (!sorted)
        qsort(rc->ivl, n, sizeof *rc->ivl, ivl_cmp);
    int64_t cur = lo;
    for (uint32_t k = 0; k < n && cur < hi; k++) {
        if (rc->ivl[k].lo > cur)
            break;
        if (rc->ivl[k].hi > cur)
            cur = rc->ivl[k].hi;
    }
    *gap = cur;
    return cur >= hi;
}

static void crossings_add(int64_t **pts, uint32_t *n, uint32_t *cap, Affine p, Affine q, int64_t nseq)
{
    if (p.k == q.k)
        return;
    int64_t num = q.c - p.c, den = p.k - q.k;
    int64_t f = num / den - ((num % den != 0) && ((num < 0) != (den < 0)));
    for (int64_t x = f - 1; x <= f + 1; x++)
        if (x >= 0 && x < nseq)
            VEC_PUSH(*pts, *n, *cap, x);
}

/* Coverage for every pos: test each pos where the ends' order can change. */
static bool covered_all(Race *rc, const RAcc *a, int64_t *bad_pos, int64_t *gap)
{
    Val *v = rc->v;
    if (!rc->b->affine) {
        *bad_pos = 0;
        return covered_at(rc, a, 0, gap);
    }
    int64_t *pts = NULL;
    uint32_t n = 0, cap = 0;
    VEC_PUSH(pts, n, cap, 0);
    VEC_PUSH(pts, n, cap, v->nseq - 1);
    Affine e[2] = {a->lo, a->hi};
    for (uint32_t k = 0; k < rc->ncov; k++)
        for (int j = 0; j < 2; j++) {
            crossings_add(&pts, &n, &cap, e[j], rc->cov[k]->lo, v->nseq);
            crossings_add(&pts, &n, &cap, e[j], rc->cov[k]->hi, v->nseq);
            for (uint32_t m = 0; m < k; m++) {
                crossings_add(&pts, &n, &cap, rc->cov[m]->lo, j ? rc->cov[k]->hi : rc->cov[k]->lo, v->nseq);
                crossings_add(&pts, &n, &cap, rc->cov[m]->hi, j ? rc->cov[k]->hi : rc->cov[k]->lo, v->nseq);
            }
        }
    bool ok = true;
    for (uint32_t k = 0; k < n && ok; k++)
        if (!covered_at(rc, a, pts[k], gap))
            ok = false, *bad_pos = pts[k];
    free(pts);
    return ok;
}

/* Gathers writes that happen before a: all of them, or (quick) only the
 * latest overlapping one of each worker. The cursors of the other workers'
 * runs stand at a. */
static void cov_gather(Race *rc, const RAcc *a, bool quick)
{
    const BufAccs *b = rc->b;
    const uint32_t *clk = racc_clock(rc->v, a);
    rc->ncov = 0;
    for (uint32_t r = 0; r < b->nrun; r++) {
        uint32_t s = b->run[r], e = b->run[r + 1];
        uint32_t c1 = b->wr[s].w == a->w ? split_before(b->wr, s, e, a, clk) : rc->cur[r].c1;
        for (uint32_t k = c1, seen = 0; k > s && (!quick || seen < 8); k--, seen++) {
            RAcc *x = &b->wr[k - 1];
            if (x->hhi <= a->hlo || a->hhi <= x->hlo)
                continue;
            cov_push(rc, x);
            if (quick)
                break;
        }
    }
}

static bool affine_eq(Affine x, Affine y)
{
    return x.k == y.k && x.c == y.c;
}

static uint64_t memo_hash(const Race *rc, const RAcc *a)
{
    int64_t key[4] = {a->lo.k, a->lo.c, a->hi.k, a->hi.c};
    uint64_t h = hash_fnv1a(key, sizeof key, HASH_FNV_INIT);
    for (uint32_t k = 0; k < rc->ncov; k++) {
        uint32_t idx = (uint32_t)(rc->cov[k] - rc->b->wr);
        h = hash_fnv1a(&idx, sizeof idx, h);
    }
    return h ^ h >> 29;     /* the table takes the low bits */
}

static bool memo_same(const Race *rc, const CovMemo *m, const RAcc *a, uint64_t h)
{
    if (m->hash != h || m->n != rc->ncov || !affine_eq(m->lo, a->lo) || !affine_eq(m->hi, a->hi))
        return false;
    for (uint32_t k = 0; k < m->n; k++)
        if (rc->midx[m->at + k] != (uint32_t)(rc->cov[k] - rc->b->wr))
            return false;
    return true;
}

/* Has the range of a been proved covered by the writes just gathered? */
static bool memo_find(const Race *rc, const RAcc *a, uint64_t h)
{
    for (uint32_t i = (uint32_t)h & (rc->capslot - 1); rc->capslot && rc->slot[i];
         i = (i + 1) & (rc->capslot - 1))
        if (memo_same(rc, &rc->memo[rc->slot[i] - 1], a, h))
            return true;
    return false;
}

static void memo_slot_put(Race *rc, uint32_t m)
{
    uint32_t i = (uint32_t)rc->memo[m].hash & (rc->capslot - 1);
    while (rc->slot[i])
        i = (i + 1) & (rc->capslot - 1);
    rc->slot[i] = m + 1;
}

/* Records the proof; past 16M remembered writes a buffer's proofs are no
 * longer kept (each is then made again). */
static void memo_add(Race *rc, const RAcc *a, uint64_t h)
{
    if (rc->nmidx + rc->ncov > ((size_t)1 << 24))
        return;
    if (2 * (rc->nmemo + 1) > rc->capslot) {
        rc->capslot = rc->capslot ? 2 * rc->capslot : 64;
        rc->slot = xrealloc(rc->slot, rc->capslot * sizeof *rc->slot);
        memset(rc->slot, 0, rc->capslot * sizeof *rc->slot);
        for (uint32_t m = 0; m < rc->nmemo; m++)
            memo_slot_put(rc, m);
    }
    CovMemo m = {h, a->lo, a->hi, rc->ncov, (uint32_t)rc->nmidx};
    for (uint32_t k = 0; k < rc->ncov; k++)
        VEC_PUSH(rc->midx, rc->nmidx, rc->capmidx, (uint32_t)(rc->cov[k] - rc->b->wr));
    VEC_PUSH(rc->memo, rc->nmemo, rc->capmemo, m);
    memo_slot_put(rc, rc->nmemo - 1);
}

static void memo_clear(Race *rc)
{
    if (rc->nmemo)
        memset(rc->slot, 0, rc->capslot * sizeof *rc->slot);
    rc->nmemo = 0;
    rc->nmidx = 0;
}

static void uninit_check(Race *rc, const RAcc *a)
{
    Val *v = rc->v;
    int64_t pos = 0, gap = 0;
    if (affine_overlap_pos(a->lo, a->hi, a->lo, a->hi, v->nseq) < 0)
        return;     /* empty for every pos */
    cov_gather(rc, a, true);
    uint64_t h = memo_hash(rc, a);
    if (memo_find(rc, a, h))
        return;
    if (covered_all(rc, a, &pos, &gap)) {
        memo_add(rc, a, h);
        return;
    }
    cov_gather(rc, a, false);
    if (covered_all(rc, a, &pos, &gap))
        return;
    char da[256];
    acc_desc(v, rc->buf, a, da, sizeof da);
    val_error(v, &v->r->nuninit, val_inst(v, a->w, a->t)->line,
              "uninit: %s, but element %lld (pos=%lld) of %s buffer %s is not written by anything that "
              "happens before it",
              da, (long long)gap, (long long)pos, v->s->bufs[rc->buf].cls == BUF_IO ? "output" : "scratch",
              v->s->bufs[rc->buf].name);
    for (uint32_t k = 0; k < rc->b->nwr; k++) {
        const RAcc *x = &rc->b->wr[k];
        int64_t p;
        if ((x->w != a->w || x->t != a->t) && racc_overlap(v, a, x, &p)) {
            char dx[256];
            val_note(v, val_inst(v, x->w, x->t)->line, "written by %s, which is not ordered before the read",
                     acc_desc(v, rc->buf, x, dx, sizeof dx));
            break;
        }
    }
}

/* a against the writes of another worker's run r. */
static void pair_check(Race *rc, const RAcc *a, const uint32_t *clk, uint32_t r)
{
    Val *v = rc->v;
    const BufAccs *b = rc->b;
    uint32_t s = b->run[r], e = b->run[r + 1], i = b->wr[s].w;
    bool a_writes = a->mode & ACC_W;
    if (a_writes && !(a->mode & ACC_R) && i > a->w)
        return;     /* write-write: examined from worker i's side */
    const Cursor *cu = cursor_at(rc, r, a, clk);
    v->r->pairs_checked += (uint64_t)(e - s);
    for (uint32_t k = cu->c1; k < cu->c2; k++) {
        const RAcc *x = &b->wr[k];
        int64_t pos;
        if (a_writes && i > a->w && (x->mode & ACC_R) == 0)
            continue;   /* write-write seen from the other side */
        if (racc_overlap(v, a, x, &pos))
            race_report(rc, a, x, pos, false);
    }
    if (v->s->bufs[rc->buf].cls == BUF_KV && a->mode == ACC_R)
        for (uint32_t k = cu->c2; k < e; k++) {
            int64_t pos;
            if (racc_overlap(v, a, &b->wr[k], &pos))
                race_report(rc, a, &b->wr[k], pos, true);
        }
}

/* KV: a read before a later write of the same worker to an overlapping row. */
static void kv_same_worker_check(Race *rc, const RAcc *a, uint32_t s, uint32_t e)
{
    for (uint32_t k = s; k < e; k++) {
        int64_t pos;
        if (rc->b->wr[k].t > a->t && racc_overlap(rc->v, a, &rc->b->wr[k], &pos))
            race_report(rc, a, &rc->b->wr[k], pos, true);
    }
}

static void buffer_check(Race *rc)
{
    Val *v = rc->v;
    BufAccs *b = rc->b;
    const Buffer *buf = &v->s->bufs[rc->buf];
    rc->cur = xrealloc(rc->cur, (b->nrun ? b->nrun : 1) * sizeof *rc->cur);
    for (uint32_t k = 0; k < b->nall; k++) {
        const RAcc *a = &b->all[k];
        const uint32_t *clk = racc_clock(v, a);
        if (k == 0 || a->w != b->all[k - 1].w)
            cursors_reset(rc, a->w);
        for (uint32_t r = 0; r < b->nrun; r++) {
            uint32_t s = b->run[r], e = b->run[r + 1];
            if (b->wr[s].w != a->w)
                pair_check(rc, a, clk, r);
            else if (buf->cls == BUF_KV && a->mode == ACC_R)
                kv_same_worker_check(rc, a, s, e);
        }
        if ((buf->cls == BUF_SCRATCH || buf->cls == BUF_IO) && (a->mode & ACC_R))
            uninit_check(rc, a);
    }
}

/* An output (an io buffer the step writes) must be written whole, for
 * every pos: the host reads it after the step. */
static void output_check(Race *rc)
{
    Val *v = rc->v;
    const Buffer *buf = &v->s->bufs[rc->buf];
    RAcc whole = {.lo = {.c = 0}, .hi = {.c = buf->nelem}, .hlo = 0, .hhi = buf->nelem};
    rc->ncov = 0;
    for (uint32_t k = 0; k < rc->b->nwr; k++)
        cov_push(rc, &rc->b->wr[k]);
    int64_t pos = 0, gap = 0;
    if (!covered_all(rc, &whole, &pos, &gap))
        val_error(v, &v->r->nuninit, buf->line,
                  "uninit: element %lld (pos=%lld) of output buffer %s is written by nothing in the step; the "
                  "host reads it after the step",
                  (long long)gap, (long long)pos, buf->name);
}

/* Buckets every access on a buffer that is written or is scratch. */
static BufAccs *accesses_collect(Val *v)
{
    const Schedule *s = v->s;
    BufAccs *ba = xcalloc(s->nbufs ? s->nbufs : 1, sizeof *ba);
    uint32_t *cap_all = xcalloc(s->nbufs ? s->nbufs : 1, sizeof *cap_all);
    uint32_t *cap_wr = xcalloc(s->nbufs ? s->nbufs : 1, sizeof *cap_wr);
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = val_inst(v, w, t);
            for (int i = 0; in->kind == INST_OP && i < in->nacc; i++) {
                const Access *a = &s->accs[in->acc + i];
                if (a->buf == BUF_NONE || s->bufs[a->buf].cls == BUF_WEIGHT)
                    continue;
                RAcc r = {w, t, a->mode, a->lo, a->hi, affine_min(a->lo, v->nseq), affine_max(a->hi, v->nseq)};
                BufAccs *b = &ba[a->buf];
                VEC_PUSH(b->all, b->nall, cap_all[a->buf], r);
                if (a->mode & ACC_W)
                    VEC_PUSH(b->wr, b->nwr, cap_wr[a->buf], r);
                b->affine |= a->lo.k != 0 || a->hi.k != 0;
            }
        }
    free(cap_all);
    free(cap_wr);
    return ba;
}

void val_race_check(Val *v)
{
    BufAccs *ba = accesses_collect(v);
    Race rc = {.v = v};
    for (uint32_t b = 0; b < v->s->nbufs; b++) {
        BufClass cls = v->s->bufs[b].cls;
        if (cls == BUF_IO && ba[b].nall == 0)
            val_error(v, &v->r->nuninit, v->s->bufs[b].line,
                      "uninit: io buffer %s is neither read nor written by the step (an input nothing reads, or "
                      "an output nothing writes)",
                      v->s->bufs[b].name);
        if (cls == BUF_KV && ba[b].nwr == 0 && ba[b].nall > 0) {
            const RAcc *a = &ba[b].all[0];
            val_error(v, &v->r->nuninit, val_inst(v, a->w, a->t)->line,
                      "uninit: kv buffer %s is read (worker %u inst %u, %s) but no op of the step writes it: the "
                      "rows a step adds (kv_append, kv_store) are never written, so every later step reads rows "
                      "no step wrote",
                      v->s->bufs[b].name, a->w, a->t, val_inst_name(v, a->w, a->t));
        }
        if (ba[b].nwr == 0 && cls != BUF_SCRATCH)
            continue;
        rc.b = &ba[b];
        rc.buf = b;
        memo_clear(&rc);
        rc.col_j0 = UINT32_MAX;
        runs_build(rc.b);
        buffer_check(&rc);
        if (cls == BUF_IO)
            output_check(&rc);
    }
    for (uint32_t b = 0; b < v->s->nbufs; b++) {
        free(ba[b].all);
        free(ba[b].wr);
        free(ba[b].run);
    }
    free(ba);
    free(rc.cov);
    free(rc.ivl);
    free(rc.cur);
    free(rc.memo);
    free(rc.midx);
    free(rc.slot);
    free(rc.col);
}
