/*
 * test_mc.c - the model checker (tools/mc), the validator's independent
 * oracle: it accepts the valid golden schedules and the real lowerings,
 * rejects every invalid golden for the reason the file names, and finds
 * the classic bugs on schedules built in memory.
 */
#include "sched_corpus.h"
#include "tools/mc/mc.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

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
                                  MEGAC_SRC "/tests/sched/roundtrip/stories260k_w3.sched"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i], "r");
        if (!f)
            cr_skip("%s not present", files[i]);
        fclose(f);
        McResult r;
        cr_assert_eq(check_file(files[i], &r), MC_SAFE, "%s: %s", files[i], r.why);
    }
}

/* Every invalid golden is unsafe, and for the reason its comments name. */
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
