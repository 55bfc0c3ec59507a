/*
 * test_lower.c - lowering a model to a schedule: the text form round-trips
 * with the same hash, every op's declared accesses equal its footprint, an
 * abstract execution (round-robin over workers, monotone counters)
 * completes, small schedules are race free under the happens-before of
 * program order plus guaranteed signal->wait edges, GEMV bytes are balanced,
 * and models that cannot be lowered are rejected with an error.
 */
#include "compiler/compile.h"
#include "compiler/fuzz.h"
#include "validator/validator.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static ModelDesc *toy(int dim, int hidden, int layers, int heads, int kv, int hd, int vocab, int seq)
{
    ModelDesc *m = calloc(1, sizeof *m);
    *m = (ModelDesc){.name = "toy", .dim = dim, .hidden_dim = hidden, .n_layers = layers, .n_heads = heads,
                     .n_kv_heads = kv, .head_dim = hd, .vocab_size = vocab, .max_seq = seq, .norm_eps = 1e-5,
                     .tie_embeddings = true, .rope_theta = 10000, .act_dtype = DT_F32};
    return m;
}

static ModelDesc *stories260k(void)
{
    return toy(64, 172, 5, 8, 4, 8, 512, 512);
}

static Schedule *lower(const ModelDesc *m, const char *target, int workers)
{
    Diag d;
    diag_init(&d);
    const Target *t = target_lookup(target, &d);
    cr_assert_not_null(t);
    Schedule *s = lower_model(m, t, workers, &d);
    cr_assert_not_null(s, "lowering failed");
    cr_assert_eq(d.nerrors, 0);
    return s;
}

static void check_roundtrip(const Schedule *s)
{
    char *t = sched_to_string(s);
    Diag d;
    diag_init(&d);
    Schedule *p = sched_parse("lowered.sched", t, strlen(t), &d);
    cr_assert_not_null(p, "lowered schedule does not parse");
    char *t2 = sched_to_string(p);
    cr_assert(strcmp(t, t2) == 0, "print(parse(print(s))) != print(s)");
    cr_assert_eq(sched_hash(s), sched_hash(p));
    free(t);
    free(t2);
    sched_free(p);
}

static bool access_eq(const Access *a, const Access *b)
{
    if (a->buf != b->buf)
        return false;
    if (a->buf == BUF_NONE)
        return true;
    return a->mode == b->mode && a->lo.c == b->lo.c && a->lo.k == b->lo.k && a->hi.c == b->hi.c &&
           a->hi.k == b->hi.k;
}

/* Every op's declared accesses equal its footprint and stay in bounds. */
static void check_footprints(const Schedule *s)
{
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            const Inst *in = &s->workers[w].insts[i];
            if (in->kind != INST_OP)
                continue;
            Access fp[OP_MAX_OPERANDS];
            const char *why = "";
            cr_assert(op_footprint(s, in, fp, &why), "worker %u inst %u (%s): %s", w, i, op_info(in->op)->name, why);
            for (int k = 0; k < in->nacc; k++) {
                const Access *a = &s->accs[in->acc + (uint32_t)k];
                cr_assert(access_eq(a, &fp[k]), "worker %u inst %u (%s) operand %s differs from its footprint", w,
                          i, op_info(in->op)->name, op_info(in->op)->operand[k]);
                if (a->buf == BUF_NONE)
                    continue;
                int64_t S = s->shape.max_seq - 1, n = s->bufs[a->buf].nelem;
                cr_assert(affine_at(a->lo, 0) >= 0 && affine_at(a->hi, S) <= n && affine_at(a->lo, S) >= 0 &&
                              affine_at(a->hi, 0) <= n,
                          "worker %u inst %u: range out of %s", w, i, s->bufs[a->buf].name);
            }
        }
}

/* Round-robin abstract execution with monotone counters. Each op gets a
 * vector clock (vc[op][w] = how many instructions of worker w happen before
 * it) when `vcs` is non-NULL: a wait joins the clocks of the signals it is
 * guaranteed to observe (the other increments cannot reach its threshold). */
typedef struct Exec {
    uint32_t **vc;      /* per worker, per instruction: nworkers entries */
} Exec;

static char exec_msg[512];

/* NULL if the execution completes, else why not. */
static const char *run_execution(const Schedule *s, Exec *ex)
{
    exec_msg[0] = 0;
    uint32_t W = s->nworkers, nc = s->nctrs;
    uint64_t *ctr = calloc(nc, sizeof *ctr), *total = calloc(nc, sizeof *total);
    uint32_t *pc = calloc(W, sizeof *pc);
    for (uint32_t w = 0; w < W; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++)
            if (s->workers[w].insts[i].kind == INST_SIGNAL)
                total[s->workers[w].insts[i].counter] += s->workers[w].insts[i].amount;
    uint32_t *cur = ex ? calloc((size_t)W * W, sizeof *cur) : NULL;
    bool progress = true;
    while (progress) {
        progress = false;
        for (uint32_t w = 0; w < W; w++) {
            const Worker *wk = &s->workers[w];
            while (pc[w] < wk->ninst) {
                const Inst *in = &wk->insts[pc[w]];
                if (in->kind == INST_WAIT) {
                    if (in->amount > total[in->counter] && !exec_msg[0])
                        snprintf(exec_msg, sizeof exec_msg, "wait %s >= %u can never be satisfied",
                                 s->ctrs[in->counter].name, in->amount);
                    if (ctr[in->counter] < in->amount)
                        break;
                    if (ex) {   /* join guaranteed signals */
                        for (uint32_t v = 0; v < W; v++)
                            for (uint32_t j = 0; j < s->workers[v].ninst; j++) {
                                const Inst *g = &s->workers[v].insts[j];
                                if (g->kind == INST_SIGNAL && g->counter == in->counter &&
                                    total[g->counter] - g->amount < in->amount)
                                    for (uint32_t u = 0; u < W; u++)
                                        if (ex->vc[v][j * W + u] > cur[w * W + u])
                                            cur[w * W + u] = ex->vc[v][j * W + u];
                            }
                    }
                }
                if (in->kind == INST_SIGNAL)
                    ctr[in->counter] += in->amount;
                if (ex) {
                    cur[w * W + w] = pc[w] + 1;
                    memcpy(&ex->vc[w][pc[w] * W], &cur[w * W], W * sizeof *cur);
                }
                pc[w]++;
                progress = true;
            }
        }
    }
    for (uint32_t w = 0; w < W && !exec_msg[0]; w++)
        if (pc[w] != s->workers[w].ninst)
            snprintf(exec_msg, sizeof exec_msg, "deadlock: worker %u stuck at instruction %u", w, pc[w]);
    free(ctr);
    free(total);
    free(pc);
    free(cur);
    return exec_msg[0] ? exec_msg : NULL;
}

static bool overlap(const Access *a, const Access *b, int64_t pos)
{
    return affine_at(a->lo, pos) < affine_at(b->hi, pos) && affine_at(b->lo, pos) < affine_at(a->hi, pos);
}

/* Two ops of different workers conflict if some access pair overlaps
 * (at pos 0, 1 or max_seq-1) on one buffer with at least one write. */
static bool ops_conflict(const Schedule *s, const Inst *x, const Inst *y, const char **buf)
{
    int64_t poss[3] = {0, 1, s->shape.max_seq - 1};
    for (int p = 0; p < x->nacc; p++)
        for (int q = 0; q < y->nacc; q++) {
            const Access *u = &s->accs[x->acc + (uint32_t)p], *v = &s->accs[y->acc + (uint32_t)q];
            if (u->buf == BUF_NONE || u->buf != v->buf || !((u->mode | v->mode) & ACC_W))
                continue;
            for (int k = 0; k < 3; k++)
                if (overlap(u, v, poss[k])) {
                    *buf = s->bufs[u->buf].name;
                    return true;
                }
        }
    return false;
}

/* NULL if every conflicting pair of ops from different workers is ordered
 * by the vector clocks (or execution fails: then why). */
static const char *find_race(const Schedule *s)
{
    static char msg[512];
    uint32_t W = s->nworkers;
    Exec ex = {calloc(W, sizeof *ex.vc)};
    for (uint32_t w = 0; w < W; w++)
        ex.vc[w] = calloc((size_t)s->workers[w].ninst * W + 1, sizeof **ex.vc);
    const char *why = run_execution(s, &ex);
    for (uint32_t a = 0; a < W && !why; a++)
        for (uint32_t i = 0; i < s->workers[a].ninst && !why; i++)
            for (uint32_t b = a + 1; b < W && !why; b++)
                for (uint32_t j = 0; j < s->workers[b].ninst && !why; j++) {
                    const Inst *x = &s->workers[a].insts[i], *y = &s->workers[b].insts[j];
                    const char *buf;
                    if (x->kind != INST_OP || y->kind != INST_OP || ex.vc[b][j * W + a] >= i + 1 ||
                        ex.vc[a][i * W + b] >= j + 1 || !ops_conflict(s, x, y, &buf))
                        continue;
                    snprintf(msg, sizeof msg, "race on %s: worker %u inst %u (%s) vs worker %u inst %u (%s)", buf, a,
                             i, op_info(x->op)->name, b, j, op_info(y->op)->name);
                    why = msg;
                }
    for (uint32_t w = 0; w < W; w++)
        free(ex.vc[w]);
    free(ex.vc);
    return why;
}

static void check_all(const Schedule *s, bool races)
{
    check_roundtrip(s);
    check_footprints(s);
    const char *why = races ? find_race(s) : run_execution(s, NULL);
    cr_assert_null(why, "%s", why);
}

Test(lower, small_models_at_1_2_3_8_workers)
{
    ModelDesc *ms[2] = {stories260k(), toy(96, 256, 2, 6, 2, 16, 300, 64)};
    ms[1]->qkv_bias = true;
    ms[1]->tie_embeddings = false;
    ms[1]->rope_pairing = ROPE_HALF;
    int ws[4] = {1, 2, 3, 8};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            Schedule *s = lower(ms[i], "cpu", ws[j]);
            cr_assert_eq(s->nworkers, (uint32_t)ws[j]);
            check_all(s, true);
            sched_free(s);
        }
    free(ms[0]);
    free(ms[1]);
}

/* The checks above can fail: dropping one wait (threshold 0 observes no
 * signal) makes a race, raising one makes a deadlock. */
Test(lower, checks_catch_broken_schedules)
{
    ModelDesc *m = stories260k();
    Schedule *s = lower(m, "cpu", 3);
    Inst *first_wait = NULL;
    for (uint32_t i = 0; i < s->workers[1].ninst && !first_wait; i++)
        if (s->workers[1].insts[i].kind == INST_WAIT)
            first_wait = &s->workers[1].insts[i];
    cr_assert_not_null(first_wait);
    uint32_t n = first_wait->amount;
    first_wait->amount = 0;
    const char *why = find_race(s);
    cr_assert(why && strstr(why, "race on"), "%s", why ? why : "no race found");
    first_wait->amount = n + 1;
    why = run_execution(s, NULL);
    cr_assert(why && strstr(why, "can never be satisfied"), "%s", why ? why : "no deadlock found");
    sched_free(s);
    free(m);
}

/* Weight bytes each worker streams in one step (GEMV weights). */
static void worker_bytes(const Schedule *s, double *out)
{
    for (uint32_t w = 0; w < s->nworkers; w++) {
        out[w] = 0;
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            const Inst *in = &s->workers[w].insts[i];
            if (in->kind == INST_OP && in->op == OP_GEMV)
                out[w] += (double)(in->p[1] - in->p[0]) * in->p[2] * 4.0;
        }
    }
}

Test(lower, llama_3_1_8b_sm_90)
{
    ModelDesc *m = toy(4096, 14336, 32, 32, 8, 128, 128256, 4096);
    m->name = "llama-3.1-8b";
    m->tie_embeddings = false;
    m->rope_pairing = ROPE_HALF;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    Schedule *s = lower(m, "sm_90", 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    uint64_t ninst = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        ninst += s->workers[w].ninst;
    cr_log_info("llama-3.1-8b sm_90: %u workers, %llu instructions, %u counters, lowered in %.1f ms", s->nworkers,
                (unsigned long long)ninst, s->nctrs, ms);
    cr_assert_eq(s->nworkers, 132);
    check_all(s, false);
    double *b = calloc(s->nworkers, sizeof *b), sum = 0, max = 0;
    worker_bytes(s, b);
    for (uint32_t w = 0; w < s->nworkers; w++) {
        sum += b[w];
        max = b[w] > max ? b[w] : max;
    }
    double all = 0;
    for (uint32_t i = 0; i < s->nbufs; i++)
        if (s->bufs[i].cls == BUF_WEIGHT && s->bufs[i].rank == 2)
            all += (double)s->bufs[i].nelem * 4.0 - (strcmp(s->bufs[i].name, "embed") == 0 ? (double)s->bufs[i].nelem * 4.0 : 0);
    cr_assert_float_eq(sum, all, 1.0, "every matrix but embed is streamed once: %.0f vs %.0f", sum, all);
    cr_assert_lt(max / (sum / s->nworkers), 1.03, "worker bytes unbalanced: max/mean = %.3f", max / (sum / s->nworkers));
    free(b);
    sched_free(s);
    free(m);
}

Test(lower, many_workers_race_free)
{
    ModelDesc *m = stories260k();
    Schedule *s = lower(m, "sm_90", 0);
    cr_assert_eq(s->nworkers, 132);
    check_all(s, true);
    sched_free(s);
    free(m);
}

Test(lower, stage_structure)
{
    ModelDesc *m = stories260k();
    m->attn_combine = COMBINE_STAGE;
    Schedule *s = lower(m, "cpu", 8);
    /* embed, lm, and per layer qkv comb o ffn down + attn.h for 4 kv heads
     * (nsplit 2); no kv.h: a dense layer's splits do not wait for the cache */
    cr_assert_eq(s->nctrs, 2 + 5 * (5 + 4));
    cr_assert_geq(sched_find_counter(s, "attn.4.3"), 0);
    cr_assert_eq(sched_find_counter(s, "kv.4.3"), -1);
    sched_free(s);
    /* in_o (the default): per layer qkv attn o ffn down, nothing per head */
    m->attn_combine = COMBINE_IN_O;
    s = lower(m, "cpu", 8);
    cr_assert_eq(s->nctrs, 2 + 5 * 5);
    cr_assert_geq(sched_find_counter(s, "attn.4"), 0);
    cr_assert_eq(sched_find_counter(s, "attn.4.3"), -1);
    cr_assert_eq(sched_find_counter(s, "comb.4"), -1);
    cr_assert_eq(sched_find_counter(s, "kv.4.3"), -1);
    cr_assert_geq(sched_find_buffer(s, "rope"), 0);
    cr_assert_eq(sched_find_buffer(s, "lm_head"), -1, "tied model: the LM head reads embed");
    int64_t part = sched_find_buffer(s, "part");
    cr_assert_eq(s->bufs[part].shape[1], 2);
    sched_layout(s);
    cr_assert_eq(s->bufs[0].offset, 0);
    for (uint32_t i = 0; i < s->nbufs; i++)
        cr_assert_eq(s->bufs[i].offset % 64, 0);
    cr_assert_geq(s->weights_bytes, 4ull * 512 * 64);
    sched_free(s);
    free(m);
}

/* The waits of worker w (w < 0: of all workers together). */
static uint32_t count_waits(const Schedule *s, int w)
{
    uint32_t n = 0, lo = w < 0 ? 0 : (uint32_t)w, hi = w < 0 ? s->nworkers : (uint32_t)w + 1;
    for (uint32_t i = lo; i < hi; i++)
        for (uint32_t j = 0; j < s->workers[i].ninst; j++)
            n += s->workers[i].insts[j].kind == INST_WAIT;
    return n;
}

/* The longest chain of waits in a step: a wait is one deeper than the
 * deepest signal to its counter (every wait is an all-join) and than what
 * its worker did before it. */
static int wait_depth(const Schedule *s)
{
    int *ctr = calloc(s->nctrs, sizeof *ctr), most = 0;
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t w = 0; w < s->nworkers; w++) {
            int d = 0;
            for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
                const Inst *in = &s->workers[w].insts[i];
                if (in->kind == INST_WAIT && ctr[in->counter] + 1 > d)
                    d = ctr[in->counter] + 1;
                else if (in->kind == INST_SIGNAL && ctr[in->counter] < d)
                    ctr[in->counter] = d, changed = true;
            }
            most = d > most ? d : most;
        }
    }
    free(ctr);
    return most;
}

/* compile.attn_combine: in_o. Every worker of o's rows merges all heads'
 * partials itself, into its own buffer, right before its GEMV reads it;
 * no other worker merges, and a worker waits once per stage: 5 times a
 * layer (qkv, attn, o, ffn, down) where the stage form has the merging
 * workers also wait for their heads' other splits and o for the merges:
 * the longest chain of waits is a hop a layer shorter. */
Test(lower, attention_merged_by_o_workers)
{
    static const struct {
        int workers, sparse;
    } cases[] = {{3, 0}, {8, 0}, {3, 1}, {132, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ModelDesc *m = stories260k();
        if (cases[c].sparse) { /* eviction and a sparse layer: kv_evict and kv.l.h waits around the merge */
            m->kv[1] = (KvPolicy){.kind = KV_TOVA, .budget = 32};
            m->attn[3] = (AttnSpec){.kind = ATTN_SINK_WINDOW, .sinks = 4, .window = 28};
        }
        int nw = cases[c].workers;
        m->attn_combine = COMBINE_IN_O;
        Schedule *s = lower(m, "cpu", nw);
        int nkv = m->n_kv_heads, merged = 0;
        for (int w = 0; w < nw; w++) {
            const Worker *wp = &s->workers[w];
            for (uint32_t i = 0; i < wp->ninst; i++) {
                const Inst *in = &wp->insts[i];
                if (in->kind != INST_OP || in->op != OP_ATTN_COMBINE)
                    continue;
                merged++;
                cr_assert_eq(in->p[0], 0);
                cr_assert_eq(in->p[2], nkv, "worker %d merges %d of %d heads", w, in->p[2], nkv);
                uint32_t own_buf = s->accs[in->acc + 1].buf;
                const char *own = s->bufs[own_buf].name;
                char want[32];
                snprintf(want, sizeof want, "att.w%d", w);
                cr_assert_str_eq(own, want);
                cr_assert(i + 1 < wp->ninst);
                const Inst *g = &wp->insts[i + 1];
                cr_assert(g->kind == INST_OP && g->op == OP_GEMV, "worker %d: the merge is right before o", w);
                cr_assert_eq(s->accs[g->acc + 1].buf, own_buf, "o reads the worker's own merge");
                cr_assert(strstr(s->bufs[s->accs[g->acc].buf].name, ".wo"));
            }
        }
        cr_assert_geq(merged, m->n_layers, "every layer is merged");
        if (!cases[c].sparse) /* per worker: embed, 5 a layer, lm (+ the argmax combine's join) */
            for (int w = 0; w < nw; w++)
                cr_assert_leq(count_waits(s, w), 1 + 5 * (uint32_t)m->n_layers + 1, "worker %d", w);
        check_all(s, true);
        m->attn_combine = COMBINE_STAGE;
        Schedule *st = lower(m, "cpu", nw);
        check_all(st, true);
        cr_assert_lt(count_waits(s, -1), count_waits(st, -1), "%d workers: in_o %u waits, stage %u", nw,
                     count_waits(s, -1), count_waits(st, -1));
        /* one hop fewer a dense layer on the step's critical path; on the
         * sparse and evicting layers, none: with stage the merging worker
         * waits for the cache write (kv.l.h) and for the other splits
         * side by side, so their hops overlap, and in_o has o wait for
         * splits that waited for the cache write: the same depth */
        int saved = m->n_layers - (cases[c].sparse ? 2 : 0);
        cr_assert_eq(wait_depth(s), wait_depth(st) - saved, "case %zu, %d workers: chain of %d waits, stage %d", c,
                     nw, wait_depth(s), wait_depth(st));
        if (!cases[c].sparse)
            cr_assert_eq(wait_depth(s), 1 + 5 * m->n_layers + 1, "embed, 5 a layer, lm's argmax");
        sched_free(st);
        sched_free(s);
        free(m);
    }
}

/* compile.attn_combine: auto is stage on every target (in_o timed
 * slower on the H200, 0.94x, and on the CPU, 0.98x); in_o where asked. */
Test(lower, attn_combine_auto_is_stage)
{
    static const char *const targets[] = {"cpu", "host-cuda", "sm_80", "sm_90", "sm_120"};
    ModelDesc *m = stories260k();
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
        for (int in_o = 0; in_o < 2; in_o++) {
            m->attn_combine = in_o ? COMBINE_IN_O : COMBINE_AUTO;
            Schedule *s = lower(m, targets[i], 3);
            cr_assert_eq(sched_find_counter(s, "attn.0") >= 0, in_o, "%s", targets[i]);
            cr_assert_eq(sched_find_counter(s, "comb.0") >= 0, !in_o, "%s", targets[i]);
            sched_free(s);
        }
    free(m);
}

/* An eviction budget that holds max_seq positions never evicts: the layer
 * lowers as a full cache (H2O's score sums included: no [kv][0] buffer). */
Test(lower, budget_past_max_seq_is_a_full_cache)
{
    ModelDesc *m = toy(64, 128, 2, 4, 2, 16, 300, 128);
    m->kv[1] = (KvPolicy){.kind = KV_H2O, .budget = 256, .window = 16};
    Schedule *s = lower(m, "cpu", 2);
    cr_assert_eq(sched_find_buffer(s, "acc.1"), -1);
    cr_assert_eq(sched_find_buffer(s, "meta.1"), -1);
    int64_t kc = sched_find_buffer(s, "kc.1");
    cr_assert_eq(s->bufs[kc].shape[1], 128, "full cache rows");
    check_all(s, true);
    sched_free(s);
    free(m);
}

static void expect_reject(ModelDesc *m, const char *what)
{
    char buf[1024] = {0};
    Diag d;
    diag_init(&d);
    d.out = fmemopen(buf, sizeof buf, "w");
    Schedule *s = lower_model(m, target_lookup("cpu", &d), 2, &d);
    fclose(d.out);
    cr_assert_null(s);
    cr_assert_geq(d.nerrors, 1);
    cr_assert(strstr(buf, what), "%s", buf);
    free(m);
}

Test(lower, rejects_unsupported_models)
{
    expect_reject(toy(63, 172, 1, 9, 3, 7, 512, 64), "head_dim 7 is odd");
    expect_reject(toy(64, 172, 1, 8, 3, 8, 512, 64), "must divide n_heads");
    expect_reject(toy(64, 0, 1, 8, 4, 8, 512, 64), "hidden_dim must be positive");
    expect_reject(toy(1 << 20, 172, 1, 1, 1, 1 << 20, 512, 64),
                  "not supported yet: wq and wo (n_heads * head_dim x dim): 1099511627776 elements in one matrix");
    expect_reject(toy(4096, 172, 1, 32, 8, 128, 1 << 20, 64), "the embedding (vocab_size x dim): 4294967296 elements");
    ModelDesc *m = stories260k();
    m->kv[2] = (KvPolicy){.kind = KV_SNAPKV, .budget = 32, .window = 32};
    expect_reject(m, "snapkv: 1 <= window < budget");
    m = stories260k();
    m->attn[1] = (AttnSpec){.kind = ATTN_QUEST, .page = 16, .budget = 32};
    m->kv[1] = (KvPolicy){.kind = KV_TOVA, .budget = 32};
    expect_reject(m, "an evicting KV cache needs dense attention");
    m = stories260k();
    m->kv[0] = (KvPolicy){.kind = KV_H2O, .budget = 32, .window = 32};
    expect_reject(m, "h2o: 0 <= window < budget");
}

Test(lower, fused_attention_stage)
{
    ModelDesc *m = stories260k();
    Schedule *s = lower(m, "cpu", 2);
    /* 4 kv heads over 2 workers: q/k/v and attention share a stage */
    cr_assert_eq(s->nctrs, 2 + 5 * 4);
    cr_assert_eq(sched_find_counter(s, "qkv.0"), -1);
    uint32_t nwait = 0;
    for (uint32_t i = 0; i < s->workers[1].ninst; i++)
        nwait += s->workers[1].insts[i].kind == INST_WAIT;
    cr_assert_leq(nwait, 1 + 5 * 4 + 1, "worker 1 waits %u times", nwait);
    sched_free(s);
    free(m);
}

Test(lower, cli)
{
    if (access(MEGAC_SRC "/../shared/models/stories260K.bin", R_OK) != 0)
        cr_skip_test("../shared/models/stories260K.bin is absent");
    char out[] = "/tmp/megac_lower_XXXXXX";
    int fd = mkstemp(out);
    cr_assert_geq(fd, 0);
    close(fd);
    char *cmd = xasprintf("%s lower %s/models/stories260k.yaml --target host-cuda --workers 3 --set max_seq=256 -o %s 2>&1",
                          MEGAC_BIN, MEGAC_SRC, out);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[512] = {0};
    cr_assert_not_null(fgets(line, sizeof line, p));
    cr_assert_eq(pclose(p), 0, "%s", line);
    cr_assert(strstr(line, "megac lower: stories260k for host-cuda: 3 workers,") && strstr(line, "buffers"), "%s", line);
    Diag d;
    diag_init(&d);
    Schedule *s = sched_load(out, &d);
    cr_assert_not_null(s);
    cr_assert_eq(s->nworkers, 3);
    cr_assert_eq(s->shape.max_seq, 256);
    check_all(s, true);
    sched_free(s);
    unlink(out);
    free(cmd);
    cmd = xasprintf("%s lower %s/models/stories260k.yaml --target sm_91 -o %s 2>&1", MEGAC_BIN, MEGAC_SRC, out);
    p = popen(cmd, "r");
    cr_assert(fgets(line, sizeof line, p));
    cr_assert_eq(WEXITSTATUS(pclose(p)), 2);
    cr_assert(strstr(line, "unknown target 'sm_91'"), "%s", line);
    free(cmd);
}

/* Sparse and eviction knobs at their extremes lower to schedules the
 * validator proves safe: a Quest page longer than the context, budgets
 * and windows past it (lowered as full or as one page: an H2O or TOVA
 * budget past max_seq once lowered its attention in nsplit splits but
 * combined one, reading partials nothing wrote), the smallest budgets. */
Test(lower, sparse_knob_extremes_validate)
{
    static const struct {
        AttnSpec a;
        KvPolicy kv;
    } cases[] = {
        {{.kind = ATTN_QUEST, .page = 100000, .budget = 5}, {.kind = KV_FULL}},
        {{.kind = ATTN_QUEST, .page = 1, .budget = 2000000000}, {.kind = KV_FULL}},
        {{.kind = ATTN_SINK_WINDOW, .sinks = 2000000000, .window = 2000000000}, {.kind = KV_FULL}},
        {{.kind = ATTN_SINK_WINDOW, .window = 1}, {.kind = KV_FULL}},
        {{.kind = ATTN_DENSE}, {.kind = KV_STREAMING, .sinks = 600, .window = 5}},
        {{.kind = ATTN_DENSE}, {.kind = KV_STREAMING, .window = 1}},
        {{.kind = ATTN_DENSE}, {.kind = KV_H2O, .budget = 1}},
        {{.kind = ATTN_DENSE}, {.kind = KV_TOVA, .budget = 1}},
        {{.kind = ATTN_DENSE}, {.kind = KV_TOVA, .budget = 2000000000}},
        {{.kind = ATTN_DENSE}, {.kind = KV_SNAPKV, .budget = 2, .window = 1}},
        {{.kind = ATTN_DENSE}, {.kind = KV_SNAPKV, .budget = 511, .window = 510}},
        {{.kind = ATTN_DENSE}, {.kind = KV_SNAPKV, .budget = 2000000000, .window = 32}},
        {{.kind = ATTN_DENSE}, {.kind = KV_SNAPKV, .budget = 2, .window = 1, .adaptive = true}},
        {{.kind = ATTN_DENSE}, {.kind = KV_SNAPKV, .budget = 511, .window = 7, .adaptive = true, .alpha = 0.5}},
    };
    static const int workers[] = {1, 3, 5, 40}; /* 40: several splits per kv head */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t wi = 0; wi < sizeof workers / sizeof workers[0]; wi++) {
            int w = workers[wi];
            ModelDesc *m = stories260k();
            for (int l = 0; l < m->n_layers; l++) {
                m->attn[l] = cases[i].a;
                m->kv[l] = cases[i].kv;
            }
            Schedule *s = lower(m, "cpu", w);
            Diag d;
            diag_init(&d);
            d.out = fopen("/dev/null", "w");
            ValResult r;
            cr_expect(val_schedule_check(s, NULL, &d, &r), "case %zu at %d workers: %d validator errors", i, w,
                      r.nerrors);
            fclose(d.out);
            sched_free(s);
            free(m);
        }
}

/* s without its output-only instructions (what a step without outputs
 * runs), as a schedule of its own. */
static Schedule *without_outputs(const Schedule *s, const bool *out)
{
    Schedule *t = fuzz_clone(s);    /* the same buffers and accesses, so `out` applies to it */
    for (uint32_t w = 0; w < t->nworkers; w++) {
        Worker *wk = &t->workers[w];
        uint32_t n = 0;
        for (uint32_t i = 0; i < wk->ninst; i++)
            if (!sched_inst_output_only(t, &wk->insts[i], out))
                wk->insts[n++] = wk->insts[i];
        wk->ninst = n;
    }
    /* such a step leaves the outputs (logits, next) as they were and the
     * host reads none of them: they are not this step's io, which the
     * validator requires to be read, or written whole */
    for (uint32_t b = 0; b < t->nbufs; b++)
        if (out[b] && t->bufs[b].cls == BUF_IO)
            t->bufs[b].cls = BUF_STATE;
    sched_layout(t);
    return t;
}

/* A step without outputs skips exactly the LM stage (the output matrix's
 * GEMVs, their argmax partials and the combine), and what it runs is a
 * schedule the validator and the race check accept on its own. */
Test(lower, steps_without_outputs_skip_the_lm_stage)
{
    ModelDesc *ms[2] = {stories260k(), toy(96, 256, 2, 6, 2, 16, 300, 64)};
    ms[1]->tie_embeddings = false;
    int ws[3] = {1, 2, 3};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            Schedule *s = lower(ms[i], "cpu", ws[j]);
            bool *out = sched_output_bufs(s);
            for (uint32_t b = 0; b < s->nbufs; b++) {
                const char *n = s->bufs[b].name;
                bool want = !strcmp(n, "logits") || !strcmp(n, "next") || !strcmp(n, "amax");
                cr_assert_eq(out[b], want, "buffer %s at %d workers", n, ws[j]);
            }
            int64_t logits = sched_find_buffer(s, "logits");
            int nskip[OP_COUNT] = {0}, gemvs_to_logits = 0;
            for (uint32_t w = 0; w < s->nworkers; w++)
                for (uint32_t k = 0; k < s->workers[w].ninst; k++) {
                    const Inst *in = &s->workers[w].insts[k];
                    if (in->kind == INST_OP && in->op == OP_GEMV && s->accs[in->acc + 2].buf == (uint32_t)logits)
                        gemvs_to_logits++;
                    if (sched_inst_output_only(s, in, out))
                        nskip[in->op]++;
                }
            cr_assert_gt(gemvs_to_logits, 0);
            cr_assert_eq(nskip[OP_GEMV], gemvs_to_logits);
            cr_assert_eq(nskip[OP_ARGMAX], gemvs_to_logits);
            cr_assert_eq(nskip[OP_ARGMAX_COMBINE], 1);
            int rest = 0;
            for (int o = 0; o < OP_COUNT; o++)
                rest += nskip[o];
            cr_assert_eq(rest, 2 * gemvs_to_logits + 1, "other ops are skipped too");
            Schedule *t = without_outputs(s, out);
            Diag d;
            diag_init(&d);
            ValResult r;
            cr_assert(val_schedule_check(t, NULL, &d, &r), "%d validator errors", r.nerrors);
            const char *why = find_race(t);
            cr_assert_null(why, "%s", why);
            sched_free(t);
            free(out);
            sched_free(s);
        }
    free(ms[0]);
    free(ms[1]);
}

/* The output set is a greatest fixpoint: a scratch buffer that only
 * output-only ops read is an output, one that any other op reads is not
 * (and then neither is what its writer writes only there). */
Test(lower, output_set_follows_the_readers)
{
    Schedule *s = sched_new("outs", "cpu", 1);
    int64_t n16[1] = {16};
    uint32_t st = sched_add_buffer(s, "st", DT_F32, BUF_STATE, 1, n16);
    uint32_t sc = sched_add_buffer(s, "sc", DT_F32, BUF_SCRATCH, 1, n16);
    uint32_t sc2 = sched_add_buffer(s, "sc2", DT_F32, BUF_SCRATCH, 1, n16);
    uint32_t io = sched_add_buffer(s, "io", DT_F32, BUF_IO, 1, n16);
    int32_t p[2] = {0, 16};
#define ACC(b, m) {(b), (m), {0, 0}, {16, 0}}
    Access a0[2] = {ACC(sc, ACC_RW), ACC(st, ACC_R)};     /* sc from the state */
    Access a1[2] = {ACC(io, ACC_RW), ACC(sc, ACC_R)};     /* the output from sc */
    Access a2[2] = {ACC(sc2, ACC_RW), ACC(st, ACC_R)};    /* sc2, read by a state update below */
    Access a3[2] = {ACC(st, ACC_RW), ACC(sc2, ACC_R)};
    sched_op(s, 0, OP_ADD, p, a0);
    sched_op(s, 0, OP_ADD, p, a1);
    sched_op(s, 0, OP_ADD, p, a2);
    sched_op(s, 0, OP_ADD, p, a3);
    bool *out = sched_output_bufs(s);
    cr_assert(!out[st] && out[sc] && !out[sc2] && out[io]);
    const Inst *in = s->workers[0].insts;
    cr_assert(sched_inst_output_only(s, &in[0], out) && sched_inst_output_only(s, &in[1], out));
    cr_assert(!sched_inst_output_only(s, &in[2], out) && !sched_inst_output_only(s, &in[3], out));
    free(out);
    Access a4[2] = {ACC(st, ACC_RW), ACC(sc, ACC_R)};     /* now the state reads sc too */
    sched_op(s, 0, OP_ADD, p, a4);
#undef ACC
    out = sched_output_bufs(s);
    cr_assert(!out[sc] && out[io]);
    in = s->workers[0].insts;
    cr_assert(!sched_inst_output_only(s, &in[0], out), "sc's writer runs: the state reads sc");
    cr_assert(sched_inst_output_only(s, &in[1], out));
    free(out);
    sched_free(s);
}
