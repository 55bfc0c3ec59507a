/*
 * test_ir.c - the schedule IR: op table, targets, the .sched format (round
 * trip of every tests/sched/ file, exact parse errors) and op footprints.
 */
#include "ir/ir.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

Test(ops, table)
{
    cr_assert_eq(op_from_name("gemv"), OP_GEMV);
    cr_assert_eq(op_from_name("argmax_combine"), OP_ARGMAX_COMBINE);
    cr_assert_eq(op_from_name("gemm"), -1);
    const OpInfo *g = op_info(OP_GEMV);
    cr_assert_eq(g->noperands, 5);
    cr_assert_str_eq(g->operand[3], "nw");
    cr_assert(g->optional[3] && g->optional[4] && !g->optional[2]);
    cr_assert_eq(g->nparams, 4);
    cr_assert_str_eq(g->param[3], "flags");
    for (int i = 0; i < OP_COUNT; i++) {
        cr_assert_eq(op_from_name(op_info(i)->name), i);
        cr_assert(op_info(i)->noperands >= 1 && op_info(i)->nparams >= 1);
    }
}

Test(target, lookup)
{
    Diag d;
    diag_init(&d);
    const Target *t = target_lookup("sm_90", &d);
    cr_assert(t && t->sms == 132 && t->smem_per_sm == 228 * 1024 && t->arch == 90);
    cr_assert_eq(target_lookup("sm_120", &d)->max_threads_per_sm, 1536);
    cr_assert_eq(target_lookup("sm_80", &d)->default_workers, 108);
    cr_assert_eq(target_lookup("host-cuda", &d)->default_workers, 4);
    cr_assert_geq(target_lookup("cpu", &d)->default_workers, 1);
    cr_assert_eq(d.nerrors, 0);
    char buf[256] = {0};
    d.out = fmemopen(buf, sizeof buf, "w");
    cr_assert_null(target_lookup("sm_89", &d));
    fclose(d.out);
    cr_assert_eq(d.nerrors, 1);
    cr_assert(strstr(buf, "unknown target 'sm_89'"), "%s", buf);
}

/* The text with comments and blank lines removed: what the printer makes
 * of a canonical file. */
static char *strip_comments(const char *t)
{
    char *out = malloc(strlen(t) + 1), *o = out;
    while (*t) {
        const char *e = strchr(t, '\n');
        size_t n = e ? (size_t)(e - t) : strlen(t);
        const char *c = memchr(t, '#', n);
        size_t k = c ? (size_t)(c - t) : n;
        while (k > 0 && (t[k - 1] == ' ' || t[k - 1] == '\t'))
            k--;
        size_t lead = strspn(t, " \t");
        if (k > lead) {
            memcpy(o, t, k);
            o += k;
            *o++ = '\n';
        }
        t += n + (e != NULL);
    }
    *o = 0;
    return out;
}

/* Calls fn on every *.sched under dir, recursively. */
static int each_sched(const char *dir, void (*fn)(const char *path))
{
    DIR *dp = opendir(dir);
    int n = 0;
    if (!dp)
        return 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char *p = xasprintf("%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode))
            n += each_sched(p, fn);
        else if (strlen(p) > 6 && strcmp(p + strlen(p) - 6, ".sched") == 0) {
            fn(p);
            n++;
        }
        free(p);
    }
    closedir(dp);
    return n;
}

/* A file the validator tests expect to fail parsing carries
 * `# expect-error: parse`; every other file round-trips exactly. */
static void roundtrip_one(const char *path)
{
    size_t len;
    char *text = read_file(path, &len);
    cr_assert_not_null(text, "%s", path);
    Diag d;
    diag_init(&d);
    bool parse_error_expected = strstr(text, "expect-error: parse") != NULL;
    if (parse_error_expected)
        d.out = fopen("/dev/null", "w");
    Schedule *s = sched_parse(path, text, len, &d);
    if (parse_error_expected) {
        fclose(d.out);
        cr_assert_null(s, "%s: expected a parse error", path);
        free(text);
        return;
    }
    cr_assert_not_null(s, "%s does not parse", path);
    char *printed = sched_to_string(s), *want = strip_comments(text);
    cr_assert_str_eq(printed, want, "%s: print(parse(x)) != x", path);
    Schedule *s2 = sched_parse(path, printed, strlen(printed), &d);
    cr_assert_not_null(s2);
    cr_assert_eq(sched_hash(s), sched_hash(s2));
    sched_free(s2);
    free(printed);
    free(want);
    sched_free(s);
    free(text);
}

Test(sched_text, roundtrip_all_files)
{
    int n = each_sched(MEGAC_SRC "/tests/sched", roundtrip_one);
    cr_assert_geq(n, 2, "found only %d .sched files", n);
}

/* Parses `text`, expecting failure; returns the diagnostics printed. */
static char *parse_errors(const char *text, int *nerrors)
{
    static char buf[4096];
    memset(buf, 0, sizeof buf);
    Diag d;
    diag_init(&d);
    d.out = fmemopen(buf, sizeof buf, "w");
    Schedule *s = sched_parse("t.sched", text, strlen(text), &d);
    fclose(d.out);
    cr_assert_null(s);
    *nerrors = d.nerrors;
    return buf;
}

#define HDR "schedule t target cpu workers 1\n" \
            "shape dim=4 hidden=8 layers=1 heads=1 kv_heads=1 head_dim=4 vocab=4 max_seq=8 eps=1e-05 pairing=adjacent\n"

Test(sched_text, errors_line_col)
{
    int n;
    char *e = parse_errors(HDR "buffer x f32 [4] scratch\nbuffer x f32 [4] scratch\nworker 0\n", &n);
    cr_assert_eq(n, 1);
    cr_assert(strstr(e, "t.sched:4:8: error: buffer 'x' is declared twice\n"
                        "    4 | buffer x f32 [4] scratch\n"
                        "      |        ^\n"), "%s", e);

    e = parse_errors(HDR "buffer x f33 [4] scratch\ncounter c\nworker 0\n  wait d >= 1\n  signal c 1\n", &n);
    cr_assert_eq(n, 3, "%s", e);
    cr_assert(strstr(e, "t.sched:3:10: error: unknown dtype 'f33'"), "%s", e);
    cr_assert(strstr(e, "t.sched:6:8: error: unknown counter 'd'"), "%s", e);
    cr_assert(strstr(e, "t.sched:7:12: error: expected '+'"), "%s", e);

    e = parse_errors(HDR "buffer x f32 [4] scratch\nworker 0\n"
                         "  op rmsnorm(n=4) x: r x[0:4], w: r y[0:4], out: w x[0:4]\n"
                         "  op rmsnorm(m=4) x: r x[0:4], w: r x[0:4], out: w x[0:4]\n"
                         "  op rmsnorm(n=4) x: r x[0:4], w: - , out: w x[0:4]\n"
                         "  op gemv(r0=0, r1=1, k=4, flags=norm|acum) w: r x[0:4], x: r x[0:4], y: w x[0:1], nw: -, b: -\n"
                         "  op rmsnorm(n=4) x: r x[0:4*pos+], w: r x[0:4], out: w x[0:4]\n",
                     &n);
    cr_assert_eq(n, 5, "%s", e);
    cr_assert(strstr(e, "t.sched:5:37: error: unknown buffer 'y'"), "%s", e);
    cr_assert(strstr(e, "t.sched:6:14: error: expected param 'n', found 'm'"), "%s", e);
    cr_assert(strstr(e, "t.sched:7:35: error: operand 'w' of rmsnorm is not optional"), "%s", e);
    cr_assert(strstr(e, "t.sched:8:39: error: unknown flag 'acum'"), "%s", e);
    cr_assert(strstr(e, "t.sched:9:34: error: expected a range bound"), "%s", e);

    /* a param short (a schedule written before kv_evict had nsplit), and one too many */
    e = parse_errors(HDR "buffer x f32 [4] scratch\nworker 0\n"
                         "  op rmsnorm() x: r x[0:4], w: r x[0:4], out: w x[0:4]\n"
                         "  op silu_mul(r0=0) g: r x[0:4], u: r x[0:4], out: w x[0:4]\n"
                         "  op silu_mul(r0=0, r1=4, r2=5) g: r x[0:4], u: r x[0:4], out: w x[0:4]\n",
                     &n);
    cr_assert_eq(n, 3, "%s", e);
    cr_assert(strstr(e, "t.sched:5:14: error: rmsnorm takes 1 param (n): 'n' is missing"), "%s", e);
    cr_assert(strstr(e, "t.sched:6:19: error: silu_mul takes 2 params (r0, r1): 'r1' is missing"), "%s", e);
    cr_assert(strstr(e, "t.sched:7:25: error: silu_mul takes 2 params (r0, r1); this has more"), "%s", e);
}

Test(sched_text, errors_structure)
{
    int n;
    char *e = parse_errors("shape dim=4\n", &n);
    cr_assert(strstr(e, "t.sched:1:1: error: expected 'schedule'"), "%s", e);
    e = parse_errors(HDR "worker 1\n", &n);
    cr_assert(strstr(e, "t.sched:3:8: error: expected 'worker 0'"), "%s", e);
    e = parse_errors("schedule t target cpu workers 2\n"
                     "shape dim=4 hidden=8 layers=1 heads=1 kv_heads=1 head_dim=4 vocab=4 max_seq=8 eps=1e-05 pairing=adjacent\n"
                     "worker 0\n  # only one\n",
                     &n);
    cr_assert(strstr(e, "t.sched:4:1: error: missing 'worker 1'"), "%s", e);
    e = parse_errors("schedule t target cpu workers 1\n"
                     "shape dim=4 hidden=8 layers=1 heads=1 head_dim=4 vocab=4 max_seq=8 eps=1e-05 pairing=adjacent\n",
                     &n);
    cr_assert(strstr(e, "t.sched:2:39: error: expected shape key 'kv_heads'"), "%s", e);
    e = parse_errors(HDR "worker 0\nbuffer x f32 [4] scratch\n", &n);
    cr_assert(strstr(e, "t.sched:4:1: error: declarations must come before the first worker"), "%s", e);
}

/* Each dimension is in range but their product is not (2^64 elements): an
 * error at the buffer's name, not a signed overflow. */
Test(sched_text, errors_buffer_too_large)
{
    int n;
    char *e = parse_errors(HDR "buffer embed f32 [4294967296, 4294967296] weight\nworker 0\n", &n);
    cr_assert_eq(n, 1, "%s", e);
    cr_assert(strstr(e, "t.sched:3:8: error: buffer 'embed' has too many elements\n"), "%s", e);
    e = parse_errors(HDR "buffer embed f32 [1048576, 1048576, 2] weight\nworker 0\n", &n);
    cr_assert(strstr(e, "t.sched:3:8: error: buffer 'embed' has too many elements\n"), "%s", e);
}

/* Each term of a range bound is at most 2^50, but many of them add up past
 * int64: an error at the term, not a signed overflow. */
Test(sched_text, errors_range_bound_too_large)
{
    int n;
    char *big = malloc(1 << 20);
    int k = snprintf(big, 1 << 20, "%sbuffer x f32 [4] scratch\nworker 0\n  op rmsnorm(n=4) x: r x[0:", HDR);
    for (int i = 0; i < 2000; i++)
        k += snprintf(big + k, (size_t)(1 << 20) - (size_t)k, "%s1125899906842624*pos", i ? "+" : "");
    snprintf(big + k, (size_t)(1 << 20) - (size_t)k, "], w: r x[0:4], out: w x[0:4]\n");
    char *e = parse_errors(big, &n);
    cr_assert(strstr(e, "error: the range bound's sum of pos terms is too large"), "%s", e);
    k = snprintf(big, 1 << 20, "%sbuffer x f32 [4] scratch\nworker 0\n  op rmsnorm(n=4) x: r x[0:", HDR);
    for (int i = 0; i < 2000; i++)
        k += snprintf(big + k, (size_t)(1 << 20) - (size_t)k, "%s1125899906842624", i ? "-" : "-");
    snprintf(big + k, (size_t)(1 << 20) - (size_t)k, "], w: r x[0:4], out: w x[0:4]\n");
    e = parse_errors(big, &n);
    cr_assert(strstr(e, "error: the range bound's sum of constants is too large"), "%s", e);
    free(big);
}

/* A long source line prints as a window of 100 bytes around the caret, with
 * "..." for what was left out, so a minified JSON file does not flood stderr. */
static char *diag_snippet(const char *text, int line, int col)
{
    static char buf[4096];
    memset(buf, 0, sizeof buf);
    Diag d;
    diag_init(&d);
    d.out = fmemopen(buf, sizeof buf - 1, "w");
    SrcFile src = {"big.json", text, strlen(text)};
    diag_error(&d, &src, line, col, "bad");
    fclose(d.out);
    return buf;
}

Test(diag, long_line_clipped)
{
    char *text = xmalloc(100002);
    for (int i = 0; i < 100000; i++)
        text[i] = (char)('a' + i % 26);
    text[100000] = '\n';
    text[100001] = 0;
    text[50000] = '!';
    char *e = diag_snippet(text, 1, 50001);
    char want[512];
    snprintf(want, sizeof want, "big.json:1:50001: error: bad\n    1 | ...%.100s...\n      |    %50s^\n",
             text + 49950, "");
    cr_assert_str_eq(e, want);
    e = diag_snippet(text, 1, 3);  /* near the start: no leading "..." */
    snprintf(want, sizeof want, "big.json:1:3: error: bad\n    1 | %.100s...\n      |   ^\n", text);
    cr_assert_str_eq(e, want);
    e = diag_snippet(text, 1, 100000);  /* near the end: a full window ending there */
    snprintf(want, sizeof want, "big.json:1:100000: error: bad\n    1 | ...%.100s\n      |    %99s^\n",
             text + 99900, "");
    cr_assert_str_eq(e, want);
    text[110] = '\n';  /* a line of 110 bytes prints whole */
    e = diag_snippet(text, 1, 100);
    snprintf(want, sizeof want, "big.json:1:100: error: bad\n    1 | %.110s\n      | %99s^\n", text, "");
    cr_assert_str_eq(e, want);
    free(text);
}

/* A directory is not a file: "Is a directory", not an I/O error. */
Test(diag, read_file_directory)
{
    errno = 0;
    cr_assert_null(read_file("/tmp", NULL));
    cr_assert_eq(errno, EISDIR, "%s", strerror(errno));
}

/* A number that is not an integer where one is expected is named as such
 * at its first character (dim=1e999 said "expected shape key 'hidden'" at
 * the 'e', where parsing had stopped); eps must be a positive finite number
 * (inf and nan were accepted; found by fuzzing). */
Test(sched_text, errors_not_an_integer_and_eps)
{
    static const struct {
        const char *from, *to, *want;
    } cases[] = {
        {"dim=4 ", "dim=1e999 ", "t.sched:2:11: error: dim must be an integer in [1, 2147483647], not '1e999'\n"},
        {"vocab=4 ", "vocab=4.5 ", "t.sched:2:67: error: vocab must be an integer in [1, 2147483647], not '4.5'\n"},
        {"workers 1", "workers 1e+3", "t.sched:1:31: error: worker count must be an integer in [1, 65535], not "
                                      "'1e+3'\n"},
        {"eps=1e-05", "eps=inf", "t.sched:2:83: error: eps must be a positive finite number, not 'inf'\n"},
        {"eps=1e-05", "eps=nan", "t.sched:2:83: error: eps must be a positive finite number, not 'nan'\n"},
        {"eps=1e-05", "eps=-1e-05", "t.sched:2:83: error: eps must be a positive finite number, not '-1e-05'\n"},
        {"eps=1e-05", "eps=1e-05x", "t.sched:2:83: error: eps must be a positive finite number, not '1e-05x'\n"},
        {"eps=1e-05", "eps=1e-999", "t.sched:2:83: error: eps must be a positive finite number, not '1e-999'\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024];
        const char *hdr = HDR "worker 0\n", *at = strstr(hdr, cases[i].from);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - hdr), hdr, cases[i].to, at + strlen(cases[i].from));
        int n;
        char *e = parse_errors(text, &n);
        cr_assert_eq(n, 1, "%s: %s", cases[i].to, e);
        cr_assert(strstr(e, cases[i].want), "%s: %s", cases[i].to, e);
    }
    int n;
    char *e = parse_errors(HDR "buffer x f32 [4, 2x] scratch\nworker 0\n", &n);
    cr_assert(strstr(e, "t.sched:3:18: error: dimension must be an integer in [1, 1099511627776], not '2x'\n"), "%s",
              e);
}

/* /dev/zero is not read until memory runs out: read_file refuses a device
 * with ENODEV, and sched_load says "not a regular file", not strerror's
 * "No such device" (found by fuzzing). */
Test(sched_text, load_refuses_a_device)
{
    static char buf[1024];
    Diag d;
    diag_init(&d);
    d.out = fmemopen(buf, sizeof buf - 1, "w");
    cr_assert_null(sched_load("/dev/zero", &d));
    fclose(d.out);
    cr_assert_str_eq(buf, "/dev/zero: error: cannot read: not a regular file (a device)\n");
    errno = 0;
    cr_assert_null(read_file("/dev/zero", NULL));
    cr_assert_eq(errno, ENODEV, "%s", strerror(errno));
}

/* An unknown target in the header is an error at the target's column. */
Test(sched_text, errors_unknown_target)
{
    int n;
    char *e = parse_errors("schedule t target gpu9 workers 1\n", &n);
    cr_assert_eq(n, 1, "%s", e);
    cr_assert(strstr(e, "t.sched:1:19: error: unknown target 'gpu9'"), "%s", e);
    e = parse_errors("schedule t target sm_91 workers 1\n", &n);
    cr_assert(strstr(e, "t.sched:1:19: error: unknown target 'sm_91' (did you mean 'sm_90'?)"), "%s", e);
}

Test(sched_text, affine_forms)
{
    const char *t = HDR "buffer kc f32 [1, 8, 4] kv\nworker 0\n"
                        "  op rmsnorm(n=4) x: r kc[ 8 + 4*pos : 4 * pos+12 ], w: r kc[pos-0:1*pos], out: w kc[-pos+3:0]\n";
    Diag d;
    diag_init(&d);
    Schedule *s = sched_parse("t.sched", t, strlen(t), &d);
    cr_assert_not_null(s);
    Access *a = &s->accs[s->workers[0].insts[0].acc];
    cr_assert(a[0].lo.c == 8 && a[0].lo.k == 4 && a[0].hi.c == 12 && a[0].hi.k == 4);
    cr_assert(a[2].lo.c == 3 && a[2].lo.k == -1);
    char *p = sched_to_string(s);
    cr_assert(strstr(p, "x: r kc[4*pos+8:4*pos+12], w: r kc[pos:pos], out: w kc[-pos+3:0]\n"), "%s", p);
    free(p);
    sched_free(s);
}

/* Footprints of one instruction of each kind, from the formulas of ops.h. */
static Schedule *fp_sched(void)
{
    Schedule *s = sched_new("fp", "cpu", 1);
    s->shape = (ModelShape){.dim = 64, .hidden_dim = 172, .n_layers = 1, .n_heads = 8, .n_kv_heads = 4,
                            .head_dim = 8, .vocab_size = 512, .max_seq = 512, .norm_eps = 1e-5};
    int64_t wq[2] = {64, 64}, kc[3] = {4, 512, 8}, v64[1] = {64}, part[4] = {4, 2, 2, 10};
    sched_add_buffer(s, "wq", DT_F32, BUF_WEIGHT, 2, wq);
    sched_add_buffer(s, "x", DT_F32, BUF_SCRATCH, 1, v64);
    sched_add_buffer(s, "kc", DT_F32, BUF_KV, 3, kc);
    sched_add_buffer(s, "part", DT_F32, BUF_SCRATCH, 4, part);
    return s;
}

static void fp_check(const Access *a, int mode, int64_t lo_c, int64_t lo_k, int64_t hi_c, int64_t hi_k)
{
    cr_assert_eq(a->mode, mode);
    cr_assert(a->lo.c == lo_c && a->lo.k == lo_k && a->hi.c == hi_c && a->hi.k == hi_k,
              "[%lld+%lld*pos : %lld+%lld*pos]", (long long)a->lo.c, (long long)a->lo.k, (long long)a->hi.c,
              (long long)a->hi.k);
}

Test(ops, footprint)
{
    Schedule *s = fp_sched();
    Access in[5] = {{0, ACC_R, {0, 0}, {0, 0}}, {1, ACC_R, {0, 0}, {0, 0}}, {1, ACC_W, {0, 0}, {0, 0}},
                    {1, ACC_R, {0, 0}, {0, 0}}, {BUF_NONE, 0, {0, 0}, {0, 0}}};
    sched_op(s, 0, OP_GEMV, (int32_t[]){8, 40, 64, GEMV_ACCUM | GEMV_NORM}, in);
    Access out[5];
    const char *why = NULL;
    cr_assert(op_footprint(s, &s->workers[0].insts[0], out, &why));
    fp_check(&out[0], ACC_R, 8 * 64, 0, 40 * 64, 0);
    fp_check(&out[1], ACC_R, 0, 0, 64, 0);
    fp_check(&out[2], ACC_RW, 8, 0, 40, 0);
    fp_check(&out[3], ACC_R, 0, 0, 64, 0);
    cr_assert_eq(out[4].buf, BUF_NONE);
    cr_assert_eq(out[0].buf, 0);

    Access kv[4] = {{1, 0, {0, 0}, {0, 0}}, {1, 0, {0, 0}, {0, 0}}, {2, 0, {0, 0}, {0, 0}}, {2, 0, {0, 0}, {0, 0}}};
    sched_op(s, 0, OP_KV_APPEND, (int32_t[]){3}, kv);
    cr_assert(op_footprint(s, &s->workers[0].insts[1], out, &why));
    fp_check(&out[2], ACC_W, 3 * 512 * 8, 8, 3 * 512 * 8 + 8, 8);
    fp_check(&out[0], ACC_R, 24, 0, 32, 0);

    Access at[5] = {{1, 0, {0, 0}, {0, 0}}, {2, 0, {0, 0}, {0, 0}}, {2, 0, {0, 0}, {0, 0}}, {3, 0, {0, 0}, {0, 0}},
                    {BUF_NONE, 0, {0, 0}, {0, 0}}};
    sched_op(s, 0, OP_ATTN, (int32_t[]){1, 1, 2, 16, 0}, at);
    cr_assert(op_footprint(s, &s->workers[0].insts[2], out, &why));
    fp_check(&out[0], ACC_R, 16, 0, 32, 0);
    fp_check(&out[1], ACC_R, 4096, 0, 4096 + 8, 8); /* the last split: rows [0, pos] */
    fp_check(&out[3], ACC_W, 3 * 20, 0, 4 * 20, 0);
    cr_assert_eq(out[4].buf, BUF_NONE);
    /* split 0 of 2 never holds row pos: rows [0, pos); rope = 1 reads the table's row pos */
    at[4].buf = 1;
    sched_op(s, 0, OP_ATTN, (int32_t[]){1, 0, 2, 16, 1}, at);
    cr_assert(op_footprint(s, &s->workers[0].insts[3], out, &why));
    fp_check(&out[1], ACC_R, 4096, 0, 4096, 8);
    fp_check(&out[2], ACC_R, 4096, 0, 4096, 8);
    fp_check(&out[4], ACC_R, 0, 8, 8, 8);
    fp_check(&out[3], ACC_W, 2 * 20, 0, 3 * 20, 0);

    /* invalid params: rows past the weight, kv head out of range */
    sched_op(s, 0, OP_GEMV, (int32_t[]){0, 65, 64, 0}, in);
    cr_assert_not(op_footprint(s, &s->workers[0].insts[4], out, &why));
    cr_assert(strstr(why, "r1"), "%s", why);
    sched_op(s, 0, OP_KV_APPEND, (int32_t[]){4}, kv);
    cr_assert_not(op_footprint(s, &s->workers[0].insts[5], out, &why));
    cr_assert(strstr(why, "kv_heads"), "%s", why);
    sched_free(s);
}

Test(sched_text, hash_follows_text)
{
    const char *t = HDR "buffer x f32 [4] scratch\ncounter c\nworker 0\n  signal c +1\n";
    Diag d;
    diag_init(&d);
    Schedule *a = sched_parse("a.sched", t, strlen(t), &d), *b = sched_parse("b.sched", t, strlen(t), &d);
    cr_assert(a && b);
    cr_assert_eq(sched_hash(a), sched_hash(b));
    b->workers[0].insts[0].amount = 2;
    cr_assert_neq(sched_hash(a), sched_hash(b));
    sched_free(a);
    sched_free(b);
}
