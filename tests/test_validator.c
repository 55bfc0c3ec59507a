/*
 * test_validator.c - the static validator: every tests/sched/valid file is
 * accepted; every tests/sched/invalid file reports exactly the kinds at the
 * lines its `# expect-error:` comments name, and nothing else; exact affine
 * reasoning; a schedule built in memory; the `megac validate` exit codes;
 * and a small adversarial campaign against the model checker.
 */
#include "sched_corpus.h"
#include "validator/val_int.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs the validator on a file; fills the (line, kind) of each error. */
static bool validate_file(const char *path, Expect *got, int *ngot, ValResult *r)
{
    SrcFile src;
    Diag d;
    char *out = NULL;
    size_t outlen = 0;
    cr_assert(srcfile_load(&src, path), "%s", path);
    diag_init(&d);
    d.max_errors = 1000;
    d.out = open_memstream(&out, &outlen);
    cr_assert_not_null(d.out);
    Schedule *s = sched_parse(path, src.text, src.len, &d);
    cr_assert_not_null(s, "%s does not parse", path);
    ValOptions o = {.target = target_lookup(s->target, &d), .src = &src};
    bool ok = val_schedule_check(s, &o, &d, r);
    fclose(d.out);
    *ngot = 0;
    for (char *p = out; p && *p;) {
        char *eol = strchr(p, '\n');
        if (eol)
            *eol = 0;
        int line, col;
        char kind[16];
        size_t plen = strlen(path);
        if (strncmp(p, path, plen) == 0 && sscanf(p + plen, ":%d:%d: error: %15[a-z]:", &line, &col, kind) == 3) {
            got[*ngot].line = line;
            snprintf(got[*ngot].kind, sizeof got[*ngot].kind, "%s", kind);
            (*ngot)++;
        }
        p = eol ? eol + 1 : NULL;
    }
    cr_assert_eq(*ngot, r->nerrors, "%s: %d diagnostics parsed, %d errors counted:\n%s", path, *ngot, r->nerrors, out);
    free(out);
    sched_free(s);
    srcfile_free(&src);
    return ok;
}

static bool expect_has(const Expect *e, int n, int line, const char *kind)
{
    for (int i = 0; i < n; i++)
        if (e[i].line == line && strcmp(e[i].kind, kind) == 0)
            return true;
    return false;
}

Test(validator, valid_files_pass)
{
    char *files[CORPUS_MAX];
    int n = corpus_list(MEGAC_SRC "/tests/sched/valid", files);
    cr_assert_geq(n, 2);
    for (int i = 0; i < n; i++) {
        Expect got[256];
        int ngot;
        ValResult r;
        cr_assert(validate_file(files[i], got, &ngot, &r), "%s rejected (first at line %d: %s)", files[i],
                  ngot ? got[0].line : 0, ngot ? got[0].kind : "");
        cr_assert_gt(r.pairs_checked, 0);
        free(files[i]);
    }
}

/* Real lowerings (fixtures made by `megac lower`) are accepted. */
Test(validator, lowered_fixtures_pass)
{
    static const char *files[] = {"stories260k_w2.sched", "stories260k_w3.sched", "stories260k_w8.sched"};
    for (int i = 0; i < 3; i++) {
        char *path = xasprintf("%s/tests/sched/roundtrip/%s", MEGAC_SRC, files[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            cr_skip("%s not present", path);
        fclose(f);
        Expect got[256];
        int ngot;
        ValResult r;
        cr_assert(validate_file(path, got, &ngot, &r), "%s rejected (first at line %d: %s)", path,
                  ngot ? got[0].line : 0, ngot ? got[0].kind : "");
        free(path);
    }
}

Test(validator, invalid_files_report_exactly_their_expectations)
{
    char *files[CORPUS_MAX];
    int n = corpus_list(MEGAC_SRC "/tests/sched/invalid", files);
    cr_assert_geq(n, 15);
    for (int i = 0; i < n; i++) {
        Expect want[32], got[256];
        int ngot;
        ValResult r;
        char *text = read_file(files[i], NULL);
        int nwant = corpus_expects(text, want, 32);
        cr_assert_gt(nwant, 0, "%s has no expect-error comment", files[i]);
        cr_assert_not(validate_file(files[i], got, &ngot, &r), "%s accepted", files[i]);
        for (int k = 0; k < nwant; k++)
            cr_assert(expect_has(got, ngot, want[k].line, want[k].kind), "%s:%d: expected %s, not reported",
                      files[i], want[k].line, want[k].kind);
        for (int k = 0; k < ngot; k++)
            cr_assert(expect_has(want, nwant, got[k].line, got[k].kind), "%s:%d: unexpected %s", files[i],
                      got[k].line, got[k].kind);
        free(text);
        free(files[i]);
    }
}

Test(validator, every_kind_is_covered)
{
    static const char *kinds[] = {"structure", "deadlock", "race", "uninit", "residency"};
    char *files[CORPUS_MAX];
    int n = corpus_list(MEGAC_SRC "/tests/sched/invalid", files);
    for (int k = 0; k < 5; k++) {
        bool seen = false;
        for (int i = 0; i < n; i++) {
            char *text = read_file(files[i], NULL);
            Expect e[32];
            int ne = corpus_expects(text, e, 32);
            for (int j = 0; j < ne; j++)
                seen |= strcmp(e[j].kind, kinds[k]) == 0;
            free(text);
        }
        cr_assert(seen, "no golden file for kind %s", kinds[k]);
    }
    for (int i = 0; i < n; i++)
        free(files[i]);
}

/* Two workers: worker 0 writes x[lo0:hi0], worker 1 reads x[lo1:hi1], with
 * an optional signal/wait pair between them. */
static Schedule *pair_sched(Affine lo0, Affine hi0, Affine lo1, Affine hi1, bool ordered)
{
    Schedule *s = sched_new("pair", "cpu", 2);
    s->shape = (ModelShape){.dim = 64, .hidden_dim = 64, .n_layers = 1, .n_heads = 1, .n_kv_heads = 1,
                            .head_dim = 64, .vocab_size = 64, .max_seq = 16, .norm_eps = 1e-5};
    int64_t shape[1] = {256};
    uint32_t x = sched_add_buffer(s, "x", DT_F32, BUF_STATE, 1, shape);
    uint32_t y = sched_add_buffer(s, "y", DT_F32, BUF_STATE, 1, shape);
    uint32_t c = sched_add_counter(s, "c");
    int32_t p[OP_MAX_PARAMS] = {0};
    /* add(a, b): a[r0:r1] rw, b[r0:r1] r */
    Access a0[2] = {{x, ACC_RW, lo0, hi0}, {y, ACC_R, lo0, hi0}};
    Access a1[2] = {{y, ACC_RW, lo1, hi1}, {x, ACC_R, lo1, hi1}};
    p[0] = (int32_t)lo0.c, p[1] = (int32_t)hi0.c;
    sched_op(s, 0, OP_ADD, p, a0);
    sched_signal(s, 0, c, 1);
    if (ordered)
        sched_wait(s, 1, c, 1);
    p[0] = (int32_t)lo1.c, p[1] = (int32_t)hi1.c;
    sched_op(s, 1, OP_ADD, p, a1);
    return s;
}

static ValResult check_quiet(const Schedule *s)
{
    Diag d;
    ValResult r;
    diag_init(&d);
    d.out = fopen("/dev/null", "w");
    val_schedule_check(s, NULL, &d, &r);
    fclose(d.out);
    return r;
}

Test(validator, in_memory_race_and_order)
{
    Schedule *s = pair_sched(affine_const(0), affine_const(32), affine_const(32), affine_const(64), false);
    ValResult r = check_quiet(s);
    cr_assert_eq(r.nerrors, 0, "disjoint ranges need no order");
    sched_free(s);
    s = pair_sched(affine_const(0), affine_const(33), affine_const(32), affine_const(64), false);
    r = check_quiet(s);
    cr_assert_eq(r.nrace, 2, "x[32] and y[32] are both shared, unordered (got %d)", r.nrace);
    sched_free(s);
    s = pair_sched(affine_const(0), affine_const(33), affine_const(32), affine_const(64), true);
    r = check_quiet(s);
    cr_assert_eq(r.nerrors, 0);
    sched_free(s);
}

/* Worker 0 signals c n times; worker 1 waits for each count in turn. */
static char *chain_text(int n)
{
    char *t = xasprintf("schedule x target cpu workers 2\nshape dim=64 hidden=172 layers=5 heads=8 kv_heads=4 "
                        "head_dim=8 vocab=512 max_seq=512 eps=1e-05 pairing=adjacent\ncounter c\nworker 0\n");
    for (int w = 0; w < 2; w++)
        for (int i = 1; i <= n; i++) {
            char *u = w == 0 ? xasprintf("%s  signal c +1\n", t)
                             : xasprintf("%s%s  wait c >= %d\n", t, i == 1 ? "worker 1\n" : "", i);
            free(t);
            t = u;
        }
    return t;
}

/* A schedule past the validator's budget is reported as not checked
 * (neither safe nor unsafe), before the analysis allocates anything: its
 * clocks and signal-order tables against MEGAC_VALIDATE_MAX_GB, and the
 * happens-before analysis's steps (k^2 per distinct threshold of a counter
 * of k signals) against 1e10; fuzzing found schedules of a few MB that
 * took 10 GB, or minutes (found by fuzzing). Below the budget the same
 * schedules are checked. */
Test(validator, past_the_budget_is_not_checked)
{
    Diag d;
    diag_init(&d);
    d.out = fopen("/dev/null", "w");
    char *text = chain_text(2500); /* 2500 thresholds x 2500^2: 1.6e10 steps */
    Schedule *s = sched_parse("chain.sched", text, strlen(text), &d);
    cr_assert_not_null(s);
    ValResult r;
    cr_assert_not(val_schedule_check(s, NULL, &d, &r));
    cr_assert(r.nlimit == 1 && r.nerrors == 1, "limit %d, errors %d", r.nlimit, r.nerrors);
    sched_free(s);
    free(text);
    text = chain_text(300); /* 2.7e7 steps: checked, safe */
    s = sched_parse("chain.sched", text, strlen(text), &d);
    cr_assert(val_schedule_check(s, NULL, &d, &r), "errors %d", r.nerrors);
    setenv("MEGAC_VALIDATE_MAX_GB", "0.00005", 1); /* its 300^2 bytes of tables are past 53 KB */
    cr_assert_not(val_schedule_check(s, NULL, &d, &r));
    cr_assert(r.nlimit == 1 && r.nerrors == 1, "limit %d, errors %d", r.nlimit, r.nerrors);
    unsetenv("MEGAC_VALIDATE_MAX_GB");
    sched_free(s);
    fclose(d.out);
    /* the command: not checked exits 2, and says so */
    char path[] = "/tmp/megac_val_XXXXXX", cmd[1024], out[4096];
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "MEGAC_VALIDATE_MAX_GB=0.00005 %s validate %s 2>&1", MEGAC_BIN, path);
    FILE *p = popen(cmd, "r");
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(WEXITSTATUS(pclose(p)), 2, "%s", out);
    cr_assert(strstr(out, ":1:1: error: not checked: its happens-before clocks (300 waits x 2 workers") &&
              strstr(out, ": NOT CHECKED: 600 instructions"), "%s", out);
    unlink(path);
    free(text);
    /* a compile stops there, with its own word for it, and writes nothing */
    snprintf(cmd, sizeof cmd, "MEGAC_VALIDATE_MAX_GB=1e-8 %s compile default -o /tmp/megac_val_nc.megac 2>&1",
             MEGAC_BIN);
    p = popen(cmd, "r");
    n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(WEXITSTATUS(pclose(p)), 2, "%s", out);
    cr_assert(strstr(out, "the schedule is past what the validator can check (above); no code was generated"), "%s",
              out);
    cr_assert_neq(access("/tmp/megac_val_nc.megac", F_OK), 0);
}

Test(affine, overlap_is_exact)
{
    /* row pos of a [S][8] buffer against rows 0..pos: always overlap */
    cr_assert_eq(affine_overlap_pos((Affine){0, 8}, (Affine){8, 8}, (Affine){0, 0}, (Affine){8, 8}, 16), 0);
    /* row pos against row 10: only at pos 10 */
    cr_assert_eq(affine_overlap_pos((Affine){0, 8}, (Affine){8, 8}, (Affine){80, 0}, (Affine){88, 0}, 16), 10);
    cr_assert_eq(affine_overlap_pos((Affine){0, 8}, (Affine){8, 8}, (Affine){80, 0}, (Affine){88, 0}, 10), -1);
    /* rows > pos against row pos: never */
    cr_assert_eq(affine_overlap_pos((Affine){0, 8}, (Affine){8, 8}, (Affine){8, 8}, (Affine){128, 0}, 16), -1);
    /* empty ranges never overlap */
    cr_assert_eq(affine_overlap_pos((Affine){5, 0}, (Affine){5, 0}, (Affine){0, 0}, (Affine){10, 0}, 4), -1);
    /* negative slopes: [20-pos, 21-pos) meets [15, 16) at pos 5 */
    cr_assert_eq(affine_overlap_pos((Affine){20, -1}, (Affine){21, -1}, (Affine){15, 0}, (Affine){16, 0}, 8), 5);
}

Test(cli, validate_exit_codes)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s validate %s/tests/sched/valid/tiny_layer.sched 2>/dev/null", MEGAC_BIN, MEGAC_SRC);
    cr_assert_eq(WEXITSTATUS(system(cmd)), 0);
    snprintf(cmd, sizeof cmd, "%s validate %s/tests/sched/invalid/deadlock_cycle.sched 2>/dev/null", MEGAC_BIN, MEGAC_SRC);
    cr_assert_eq(WEXITSTATUS(system(cmd)), 1);
    snprintf(cmd, sizeof cmd, "%s validate /nonexistent.sched 2>/dev/null", MEGAC_BIN);
    cr_assert_eq(WEXITSTATUS(system(cmd)), 2);
    char tmp[] = "/tmp/megac_val_XXXXXX";
    int fd = mkstemp(tmp);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "schedule x target cpu workers 1\nshape dim=\n", 43), 43);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s validate %s 2>/dev/null", MEGAC_BIN, tmp);
    cr_assert_eq(WEXITSTATUS(system(cmd)), 2, "a parse error exits 2");
    unlink(tmp);
    snprintf(cmd, sizeof cmd, "%s validate %s/tests/sched/valid/tiny_layer.sched --target sm_99 2>/dev/null", MEGAC_BIN,
             MEGAC_SRC);
    cr_assert_eq(WEXITSTATUS(system(cmd)), 2, "an unknown target exits 2");
    snprintf(cmd, sizeof cmd, "%s validate --help >/dev/null", MEGAC_BIN);
    cr_assert_eq(WEXITSTATUS(system(cmd)), 0);
    snprintf(cmd, sizeof cmd, "%s fuzz-validator --help >/dev/null", MEGAC_BIN);
    cr_assert_eq(WEXITSTATUS(system(cmd)), 0);
    snprintf(cmd, sizeof cmd, "%s fuzz-validator --workers-max 9 2>/dev/null", MEGAC_BIN);
    cr_assert_eq(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "%s validate %s/tests/sched/valid/tiny_layer.sched --target sm_90 2>/dev/null", MEGAC_BIN,
             MEGAC_SRC);
    cr_assert_eq(WEXITSTATUS(system(cmd)), 0);
}

/* Kernel resources out of CUDA's range, or given where they mean nothing,
 * are bad options (2), not findings; '-' reads stdin; two schedules are
 * refused. */
Test(cli, validate_options_and_operands)
{
    static const struct {
        const char *args, *want;
        int rc;
    } cases[] = {
        {"tiny_layer.sched --threads 0", "megac validate: --threads needs a number in 1..1024, not '0'", 2},
        {"tiny_layer.sched --threads 100000", "megac validate: --threads needs a number in 1..1024, not '100000'", 2},
        {"tiny_layer.sched --regs 256", "megac validate: --regs needs a number in 1..255, not '256'", 2},
        {"tiny_layer.sched tiny_layer_sm90.sched", "megac validate: one schedule or model at a time", 2},
        {"- < tiny_layer.sched", "megac validate: <stdin>: safe:", 0},
        {"tiny_layer_sm90.sched --threads 1024 --regs 64", "safe", 0},
        {"tiny_layer_sm90.sched --smem 1024", "megac validate: --regs and --smem need --threads", 2},
        {"tiny_layer.sched --threads 128", "megac validate: --threads, --regs and --smem apply to CUDA targets, not cpu",
         2},
        {"/dev/zero", "/dev/zero: error: cannot read: not a regular file (a device)", 2},
        /* /dev/null reads as an empty file */
        {"/dev/null", "/dev/null:1:1: error: expected 'schedule NAME target TARGET workers N'", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[1024], out[4096];
        snprintf(cmd, sizeof cmd, "cd %s/tests/sched/valid && %s validate %s 2>&1", MEGAC_SRC, MEGAC_BIN,
                 cases[i].args);
        FILE *p = popen(cmd, "r");
        cr_assert_not_null(p);
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        int st = pclose(p);
        cr_assert_eq(WEXITSTATUS(st), cases[i].rc, "%s: %s", cases[i].args, out);
        cr_assert(strstr(out, cases[i].want), "%s: %s", cases[i].args, out);
    }
}
