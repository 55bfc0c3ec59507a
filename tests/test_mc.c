/*
 * test_mc.c - the model checker (tools/mc), the validator's independent
 * oracle: it accepts the valid golden schedules and the real lowerings,
 * rejects every invalid golden for the reason the file names, finds
 * the classic bugs on schedules built in memory, and agrees with the
 * validator on sparse-attention and KV-eviction lowerings and hand
 * mutations of them.
 */
#include "compiler/compile.h"
#include "harness.h"
#include "sched_corpus.h"
#include "tools/mc/mc.h"
#include "validator/validator.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static Schedule *load(const char *path)
{
    Diag d;
    diag_init(&d);
    Schedule *s = sched_load(path, &d);
    cr_assert_not_null(s, "%s", path);
    return s;
}

static McVerdict check_file(const char *path, McResult *r)
{
    Diag d;
    diag_init(&d);
    Schedule *s = load(path);
    McOptions o = {.target = target_lookup(s->target, &d)};
    McVerdict v = mc_check(s, &o, r);
    sched_free(s);
    return v;
}

Test(mc, valid_files_are_safe)
{
    char *files[CORPUS_MAX];
    int n = corpus_list(MEGAC_SRC "/tests/sched/valid", files);
    cr_assert_geq(n, 2);
    for (int i = 0; i < n; i++) {
        McResult r;
        cr_assert_eq(check_file(files[i], &r), MC_SAFE, "%s: %s", files[i], r.why);
        cr_assert_gt(r.states, 10);
        free(files[i]);
    }
}

Test(mc, lowered_schedules_are_safe)
{
    static const char *files[] = {MEGAC_SRC "/tests/sched/roundtrip/stories260k_w2.sched",
                                  MEGAC_SRC "/tests/sched/roundtrip/stories260k_w3.sched",
                                  MEGAC_SRC "/tests/sched/roundtrip/stories260k_hc3.sched"};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(files[i], "r");
        if (!f)
            cr_skip("%s not present", files[i]);
        fclose(f);
        McResult r;
        cr_assert_eq(check_file(files[i], &r), MC_SAFE, "%s: %s", files[i], r.why);
    }
}

/* Every invalid golden is unsafe, and for the reason its comments name;
 * a golden marked "# mc: safe" breaks a consistency rule of the validator
 * that no op depends on (its comment says why), and is judged safe. */
Test(mc, invalid_files_are_unsafe)
{
    char *files[CORPUS_MAX];
    int n = corpus_list(MEGAC_SRC "/tests/sched/invalid", files);
    cr_assert_geq(n, 15);
    for (int i = 0; i < n; i++) {
        McResult r;
        char *text = read_file(files[i], NULL);
        Expect e[32];
        int ne = corpus_expects(text, e, 32);
        if (strstr(text, "\n# mc: safe") || !strncmp(text, "# mc: safe", 10)) {
            cr_assert_eq(check_file(files[i], &r), MC_SAFE, "%s: %s", files[i], r.why);
            free(text);
            free(files[i]);
            continue;
        }
        cr_assert_eq(check_file(files[i], &r), MC_UNSAFE, "%s judged safe", files[i]);
        bool match = false;
        for (int k = 0; k < ne; k++) {
            const char *kind = e[k].kind;
            match |= (!strcmp(kind, "structure") && (r.structure || r.deadlock)) ||
                     (!strcmp(kind, "deadlock") && r.deadlock) ||
                     (!strcmp(kind, "race") && (r.race || r.kv_order || r.uninit)) ||
                     (!strcmp(kind, "uninit") && (r.uninit || r.race)) ||
                     (!strcmp(kind, "residency") && r.residency);
        }
        cr_assert(match, "%s: the checker found another problem: %s", files[i], r.why);
        free(text);
        free(files[i]);
    }
}

/* w0: write x[0:n0]; signal c | w1: [wait c >= 1]; read x[0:16] */
static Schedule *two_workers(int n0, bool wait)
{
    Schedule *s = sched_new("t", "cpu", 2);
    s->shape = (ModelShape){.dim = 16, .hidden_dim = 16, .n_layers = 1, .n_heads = 1, .n_kv_heads = 1,
                            .head_dim = 16, .vocab_size = 16, .max_seq = 8, .norm_eps = 1e-5};
    int64_t shape[1] = {16};
    uint32_t x = sched_add_buffer(s, "x", DT_F32, BUF_SCRATCH, 1, shape);
    uint32_t y = sched_add_buffer(s, "y", DT_F32, BUF_STATE, 1, shape);
    uint32_t c = sched_add_counter(s, "c");
    int32_t p0[OP_MAX_PARAMS] = {0, n0}, p1[OP_MAX_PARAMS] = {0, 16};
    Access a0[2] = {{x, ACC_RW, affine_const(0), affine_const(n0)}, {y, ACC_R, affine_const(0), affine_const(n0)}};
    Access a1[2] = {{y, ACC_RW, affine_const(0), affine_const(16)}, {x, ACC_R, affine_const(0), affine_const(16)}};
    /* silu_mul-free: x is first written by an rmsnorm of y into x */
    int32_t pn[OP_MAX_PARAMS] = {16};
    Access an[3] = {{y, ACC_R, affine_const(0), affine_const(16)}, {y, ACC_R, affine_const(0), affine_const(16)},
                    {x, ACC_W, affine_const(0), affine_const(16)}};
    sched_op(s, 0, OP_RMSNORM, pn, an);
    sched_op(s, 0, OP_ADD, p0, a0);
    sched_signal(s, 0, c, 1);
    if (wait)
        sched_wait(s, 1, c, 1);
    sched_op(s, 1, OP_ADD, p1, a1);
    return s;
}

Test(mc, in_memory_findings)
{
    McResult r;
    Schedule *s = two_workers(8, true);
    cr_assert_eq(mc_check(s, NULL, &r), MC_SAFE, "%s", r.why);
    sched_free(s);
    s = two_workers(8, false);
    cr_assert_eq(mc_check(s, NULL, &r), MC_UNSAFE);
    cr_assert(r.race || r.uninit, "%s", r.why);
    sched_free(s);
}

/* ---- sparse attention and KV eviction ---- */

/* stories260k for the CPU with compile.attention and compile.kv_policy
 * overrides (flow YAML lists) and an optional max_seq. */
static Schedule *lower_sparse(const char *attn, const char *kv, const char *max_seq, int workers)
{
    Arena a = {0};
    ModelDesc *m = ARENA_NEW(&a, ModelDesc);
    Diag d;
    diag_init(&d);
    DescOverride ov[3] = {{"compile.attention", attn}, {"compile.kv_policy", kv}, {"compile.max_seq", max_seq}};
    cr_assert(desc_load(m, &a, MEGAC_SRC "/models/stories260k.yaml", ov, max_seq ? 3 : 2, &d), "%s / %s", attn, kv);
    Schedule *s = lower_model(m, target_lookup("cpu", &d), workers, &d);
    cr_assert_not_null(s, "%s / %s, %d workers", attn, kv, workers);
    arena_free(&a);
    return s;
}

static bool validator_accepts(const Schedule *s)
{
    Diag d;
    diag_init(&d);
    d.out = fopen("/dev/null", "w");
    cr_assert_not_null(d.out);
    ValOptions vo = {.target = target_lookup("cpu", &d)};
    ValResult vr;
    bool ok = val_schedule_check(s, &vo, &d, &vr);
    fclose(d.out);
    return ok;
}

static int count_op(const Schedule *s, int op)
{
    int n = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++)
            n += s->workers[w].insts[t].kind == INST_OP && s->workers[w].insts[t].op == op;
    return n;
}

/* The first op `op` (of worker w when w >= 0); false if none. */
static bool find_op(const Schedule *s, int op, int w, uint32_t *ow, uint32_t *ot)
{
    for (uint32_t x = 0; x < s->nworkers; x++)
        for (uint32_t t = 0; t < s->workers[x].ninst; t++) {
            const Inst *in = &s->workers[x].insts[t];
            if ((w < 0 || (uint32_t)w == x) && in->kind == INST_OP && in->op == op) {
                *ow = x, *ot = t;
                return true;
            }
        }
    return false;
}

static const char *const sparse_knobs[][3] = {
    {"[{layers: 0, kind: quest, page: 16, budget: 32}]", "[{layers: 1-, policy: h2o, budget: 40}]", NULL},
    {"[{layers: 0-1, kind: sink_window, sinks: 4, window: 60}]", "[{layers: 2-, policy: tova, budget: 48}]", NULL},
    {"[{layers: 3-, kind: quest, page: 8, budget: 24}]", "[{layers: 0-2, policy: streaming, sinks: 4, window: 28}]",
     NULL},
    /* max_seq 32: the checker visits every pos, caches fill and evict */
    {"[{layers: 0, kind: quest, page: 4, budget: 8}]", "[{layers: 1-, policy: h2o, budget: 12, window: 4}]", "32"},
};

/* In the sanitized suite (its checker 4x slower) each knob set at one
 * worker count, in turn, so that every set and every count still runs. */
Test(mc, sparse_lowerings_are_safe)
{
    static const int workers[] = {1, 2, 3, 5};
    for (size_t k = 0; k < sizeof sparse_knobs / sizeof sparse_knobs[0]; k++)
        for (int i = 0; i < 4; i++) {
            if (!harness_variant_wanted(k, (size_t)i, 4))
                continue;
            Schedule *s = lower_sparse(sparse_knobs[k][0], sparse_knobs[k][1], sparse_knobs[k][2], workers[i]);
            McResult r;
            cr_assert_eq(mc_check(s, NULL, &r), MC_SAFE, "knobs %zu, %d workers: %s", k, workers[i], r.why);
            cr_assert(validator_accepts(s), "knobs %zu, %d workers", k, workers[i]);
            cr_assert_gt(count_op(s, OP_ATTN_SPARSE), 0);
            if (k == 0) {
                cr_assert_gt(count_op(s, OP_KV_STORE), 0);
                cr_assert_gt(count_op(s, OP_QUEST_SELECT), 0);
                cr_assert_eq(count_op(s, OP_KV_EVICT), 4, "one kv_evict per evicting layer");
            }
            sched_free(s);
        }
}

/* The checker finds mutant s structurally wrong (its finding says
 * `why`), and the validator rejects it too. Frees s. */
static void both_reject_structure(Schedule *s, const char *what, const char *why)
{
    McResult r;
    cr_assert_eq(mc_check(s, NULL, &r), MC_UNSAFE, "%s: judged safe", what);
    cr_assert(r.structure && strstr(r.why, why), "%s: another finding: %s", what, r.why);
    cr_assert(!validator_accepts(s), "%s: the validator accepts it", what);
    sched_free(s);
}

static Schedule *sparse_base(void)
{
    return lower_sparse(sparse_knobs[0][0], sparse_knobs[0][1], NULL, 3);
}

Test(mc, sparse_mutations_are_unsafe)
{
    uint32_t w, t;
    /* kv_store's meta range one short of the head's cap + 1 entries */
    Schedule *s = sparse_base();
    cr_assert(find_op(s, OP_KV_STORE, -1, &w, &t));
    s->accs[s->workers[w].insts[t].acc + 4].hi.c--;
    both_reject_structure(s, "short meta range", "footprint");

    /* the same meta range shifted onto the next head's entries */
    s = sparse_base();
    cr_assert(find_op(s, OP_KV_STORE, -1, &w, &t));
    Access *meta = &s->accs[s->workers[w].insts[t].acc + 4];
    meta->lo.c += 1, meta->hi.c += 1;
    both_reject_structure(s, "shifted meta range", "footprint");

    /* two splits of one kv head's attn_sparse writing the same piece of
     * the scores: split 1's declared range moved onto split 0's */
    s = sparse_base();
    Inst *in = NULL;
    for (uint32_t x = 0; x < s->nworkers && !in; x++)
        for (uint32_t i = 0; i < s->workers[x].ninst && !in; i++) {
            Inst *c = &s->workers[x].insts[i];
            if (c->kind == INST_OP && c->op == OP_ATTN_SPARSE && c->p[3] == SPARSE_SLOTS && c->p[5] == 1 && c->p[1] == 1)
                in = c;
        }
    cr_assert_not_null(in, "an evicting layer's attention in splits, with scores");
    Access *sc = &s->accs[in->acc + 4];
    int64_t piece = sc->hi.c - sc->lo.c;
    sc->lo.c -= piece, sc->hi.c -= piece;
    both_reject_structure(s, "score piece written by two splits", "footprint");

    /* the score scratch as i32, the quest page list as f32 */
    s = sparse_base();
    s->bufs[sched_find_buffer(s, "score")].dtype = DT_I32;
    both_reject_structure(s, "i32 score", "dtype");
    s = sparse_base();
    s->bufs[sched_find_buffer(s, "sel")].dtype = DT_F32;
    both_reject_structure(s, "f32 sel", "dtype");

    /* an evicting layer's cache sized for max_seq rows instead of cap */
    s = sparse_base();
    Buffer *kc = &s->bufs[sched_find_buffer(s, "kc.1")];
    kc->shape[1] = s->shape.max_seq, kc->nelem = kc->shape[0] * kc->shape[1] * kc->shape[2];
    both_reject_structure(s, "kv_store cache of S rows", "not laid out");
}

/* Without the wait before it, a kv_evict reads score rows that other
 * workers' attn_sparse ops may not have written yet. */
Test(mc, kv_evict_without_its_wait_races)
{
    Schedule *s = sparse_base();
    uint32_t w, t;
    cr_assert(find_op(s, OP_KV_EVICT, -1, &w, &t));
    Worker *wk = &s->workers[w];
    cr_assert(t > 0 && wk->insts[t - 1].kind == INST_WAIT, "kv_evict right after its wait");
    memmove(&wk->insts[t - 1], &wk->insts[t], (wk->ninst - t) * sizeof *wk->insts);
    wk->ninst--;
    McResult r;
    cr_assert_eq(mc_check(s, NULL, &r), MC_UNSAFE);
    cr_assert(r.race || r.uninit, "%s", r.why);
    cr_assert(!validator_accepts(s));
    sched_free(s);
}

/* A small adversarial campaign: no false accept, every real lowering
 * accepted (exit 0), and the last line in the documented form. */
Test(fuzz, small_campaign_has_no_false_accepts)
{
    char cmd[512], line[512], last[512] = "";
    snprintf(cmd, sizeof cmd, "%s fuzz-validator --seed 7 --count 300 --workers-max 4", MEGAC_BIN);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    bool none_row = false;
    while (fgets(line, sizeof line, p)) {
        snprintf(last, sizeof last, "%s", line);
        unsigned long long n, as, au, rs, ru, unk;
        if (sscanf(line, "unmutated %llu %llu %llu %llu %llu %llu", &n, &as, &au, &rs, &ru, &unk) == 6) {
            cr_assert_gt(n, 0);
            cr_assert_eq(as, n, "a real lowering was rejected or judged unsafe: %s", line);
            none_row = true;
        }
    }
    int st = pclose(p);
    cr_assert(none_row, "no row for unmutated lowerings");
    unsigned long long n, u, fa, fr;
    cr_assert_eq(sscanf(last, "schedules=%llu unsafe=%llu false_accepts=%llu false_rejects=%llu", &n, &u, &fa, &fr), 4,
                 "last line: %s", last);
    cr_assert_eq(n, 300);
    cr_assert_eq(fa, 0, "%s", last);
    cr_assert_gt(u, 100, "the campaign should plant mostly real defects: %s", last);
    cr_assert_eq(WEXITSTATUS(st), 0);
}

/* The campaign over sparse attention and eviction lowerings of a real
 * description (--model, --set): the checker and the validator agree on
 * every mutant. */
Test(fuzz, sparse_campaign_agrees)
{
    if (access(MEGAC_SRC "/../shared/models/stories260K.bin", R_OK) != 0)
        cr_skip_test("../shared/models/stories260K.bin is absent");
    char line[512], last[512] = "", cmd[1024];
    unsigned long long count = harness_sanitized() ? 60 : 200; /* the sanitized checker: 26 s for 200 */
    snprintf(cmd, sizeof cmd,
             MEGAC_BIN " fuzz-validator --seed 11 --count %llu --workers-max 4 --model " MEGAC_SRC
                       "/models/stories260k.yaml --set compile.max_seq=32"
                       " --set 'compile.attention=[{layers: 0, kind: quest, page: 4, budget: 8}]'"
                       " --set 'compile.kv_policy=[{layers: 1-2, policy: h2o, budget: 12},"
                       " {layers: 3, policy: tova, budget: 12}, {layers: 4, policy: streaming, sinks: 2,"
                       " window: 10}]'",
             count);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    while (fgets(line, sizeof line, p))
        snprintf(last, sizeof last, "%s", line);
    int st = pclose(p);
    unsigned long long n, u, fa, fr;
    cr_assert_eq(sscanf(last, "schedules=%llu unsafe=%llu false_accepts=%llu false_rejects=%llu", &n, &u, &fa, &fr), 4,
                 "last line: %s", last);
    cr_assert_eq(n, count);
    cr_assert_eq(fa + fr, 0, "%s", last);
    cr_assert_gt(u, count / 2, "%s", last);
    cr_assert_eq(WEXITSTATUS(st), 0);
}
