/*
 * cmd_validate.c - `megac validate X.sched|- [--target T]`: parses a schedule
 * and runs the static validator on it. Exit 0 when it is safe (a one-line
 * summary goes to stderr), 1 with diagnostics when not, 2 when the input
 * cannot be read or parsed, or the options are wrong.
 */
#include "compiler/cli.h"
#include "validator/validator.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void validate_usage(FILE *out)
{
    fprintf(out, "usage: megac validate X.sched|- [--target T] [--threads N] [--regs N] [--smem BYTES]\n\n"
                 "Proves the schedule free of deadlocks, data races, uninitialized scratch reads\n"
                 "and KV-order violations for every pos in [0, max_seq), and checks its structure\n"
                 "and that its workers can all be resident on the target. '-' reads stdin.\n\n"
                 "  --target T     check against target T instead of the schedule's own\n"
                 "  --threads N    threads per block of the kernel, 1..1024 (CUDA co-residency)\n"
                 "  --regs N       registers per thread, 1..255\n"
                 "  --smem BYTES   shared memory per block\n"
                 "Without the kernel's resources a CUDA target is assumed to hold one block per SM.\n\n"
                 "Exit status: 0 safe, 1 findings, 2 unreadable input or bad options.\n");
}

/* The kernel resources the options give: CUDA's limits per block. */
typedef struct {
    const char *name;
    long lo, hi;
} ValidateRange;
static const ValidateRange validate_ranges[] = {
    {"--threads", 1, 1024},
    {"--regs", 1, 255},
    {"--smem", 0, 1 << 30},
};

/* Parses the value of option opt (one of validate_ranges) into *out; false
 * after saying so, with the range. */
static bool int_arg(const char *opt, const char *s, int *out)
{
    const ValidateRange *r = validate_ranges;
    while (strcmp(r->name, opt) != 0)
        r++;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < r->lo || v > r->hi) {
        fprintf(stderr, "megac validate: %s needs a number in %ld..%ld, not '%s'\n", opt, r->lo, r->hi, s);
        return false;
    }
    *out = (int)v;
    return true;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int validate_run(const char *path, const char *tname, ValOptions *o)
{
    Diag d;
    SrcFile src;
    diag_init(&d);
    bool in = !strcmp(path, "-");
    if (!srcfile_load(&src, in ? "/dev/stdin" : path)) {
        diag_file_error(&d, path, "cannot read: %s", strerror(errno));
        return 2;
    }
    if (in) {
        free((char *)src.path);
        src.path = xstrdup(path = "<stdin>");
    }
    Schedule *s = sched_parse(path, src.text, src.len, &d);
    if (!s) {
        srcfile_free(&src);
        return 2;
    }
    o->target = target_lookup(tname ? tname : s->target, &d);
    if (!o->target) {
        sched_free(s);
        srcfile_free(&src);
        return 2;
    }
    o->src = &src;
    ValResult r;
    double t0 = now_ms();
    bool ok = val_schedule_check(s, o, &d, &r);
    double ms = now_ms() - t0;
    uint64_t ninst = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        ninst += s->workers[w].ninst;
    fprintf(stderr,
            "megac validate: %s: %s: %llu instructions, %u workers, target %s, %llu access pairs checked, %.1f ms",
            path, ok ? "safe" : "UNSAFE", (unsigned long long)ninst, s->nworkers, o->target->name,
            (unsigned long long)r.pairs_checked, ms);
    if (!ok)
        fprintf(stderr, "; %d errors (structure %d, deadlock %d, race %d, uninit %d, residency %d)", r.nerrors,
                r.nstructure, r.ndeadlock, r.nrace, r.nuninit, r.nresidency);
    fputc('\n', stderr);
    sched_free(s);
    srcfile_free(&src);
    return ok ? 0 : 1;
}

int cmd_validate(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        validate_usage(stdout);
        return 0;
    }
    ValOptions o = {0};
    const char *path = NULL, *tname = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (!strcmp(a, "--target") && has_val)
            tname = argv[++i];
        else if (!strcmp(a, "--threads") && has_val) {
            if (!int_arg(a, argv[++i], &o.threads_per_block))
                return 2;
        } else if (!strcmp(a, "--regs") && has_val) {
            if (!int_arg(a, argv[++i], &o.regs_per_thread))
                return 2;
        } else if (!strcmp(a, "--smem") && has_val) {
            if (!int_arg(a, argv[++i], &o.smem_per_block))
                return 2;
        } else if ((a[0] != '-' || !strcmp(a, "-")) && path) {
            fprintf(stderr, "megac validate: one schedule at a time ('%s', '%s')\n", path, a);
            return 2;
        } else if (a[0] != '-' || !strcmp(a, "-")) {
            path = a;
        } else {
            bool known = !strcmp(a, "--target") || !strcmp(a, "--threads") || !strcmp(a, "--regs") ||
                         !strcmp(a, "--smem");
            cli_bad_arg("validate", a, known);
            validate_usage(stderr);
            return 2;
        }
    }
    if (!path) {
        validate_usage(stderr);
        return 2;
    }
    return validate_run(path, tname, &o);
}
