/*
 * cmd_lower.c - `megac lower`: a model description to a schedule (.sched).
 *
 *   megac lower MODEL.yaml [--target T] [--workers N] [--set k=v]... [-o X.sched]
 *
 * Reads the description (with overrides) and, from its weight files'
 * headers, the dtypes a compile stores its weights in, lowers one decode
 * step for the target and writes the schedule's text form (stdout without
 * -o). A one-line summary goes to stderr.
 */
#include "compiler/compile.h"
#include "compiler/cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LOWER_MAX_SETS 64

typedef struct LowerArgs {
    const char *model, *target, *out;
    int workers;
    DescOverride set[LOWER_MAX_SETS];
    int nset;
} LowerArgs;

static void lower_usage(FILE *out)
{
    fprintf(out, "usage: megac lower MODEL [--target T] [--workers N] [--set key=value]... [-o X.sched]\n\n"
                 "Lowers one batch-1 decode step of the model to per-worker programs and\n"
                 "writes the schedule's text form (.sched) to X.sched, or stdout. It is the\n"
                 "schedule `megac compile` builds: each matrix has the dtype a compile\n"
                 "stores it in (GGUF blocks as they are), read from the weight files'\n"
                 "headers (no tensor's values are read or checked).\n\n"
                 "  --target T      cpu, host-cuda, sm_80, sm_90 or sm_120 (default: the\n"
                 "                  description's first target, else cpu)\n"
                 "  --workers N     worker count, 1..4096 (default: the description's, else the\n"
                 "                  target's: CPU cores, 4 for host-cuda, SMs for CUDA)\n"
                 "  --set key=value override a description key (repeatable)\n"
                 "  -o X.sched      output file\n");
}

/* Parses argv; returns false (after printing why) on a usage error. */
static bool lower_args_parse(LowerArgs *a, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool has_val = i + 1 < argc;
        if ((!strcmp(s, "--target") || !strcmp(s, "-o") || !strcmp(s, "--workers") || !strcmp(s, "--set")) && !has_val) {
            return cli_bad_arg("lower", s, true);
        }
        if (!strcmp(s, "--target")) {
            a->target = argv[++i];
        } else if (!strcmp(s, "-o")) {
            a->out = argv[++i];
        } else if (!strcmp(s, "--workers")) {
            if (!cli_workers_parse("lower", argv[++i], &a->workers))
                return false;
        } else if (!strcmp(s, "--set")) {
            if (!cli_set_add("lower", argv[++i], a->set, &a->nset, LOWER_MAX_SETS))
                return false;
        } else if (s[0] == '-' && s[1]) {
            return cli_bad_arg("lower", s, false);
        } else if (a->model) {
            fprintf(stderr, "megac lower: more than one model given ('%s', '%s')\n", a->model, s);
            return false;
        } else {
            a->model = s;
        }
    }
    if (!a->model)
        fprintf(stderr, "megac lower: no model description given\n");
    return a->model != NULL;
}

static bool lower_write(const Schedule *s, const char *path)
{
    FILE *f = path ? fopen(path, "w") : stdout;
    if (!f) {
        fprintf(stderr, "megac lower: cannot write %s: %s\n", path, strerror(errno));
        return false;
    }
    sched_print(s, f);
    errno = 0;
    bool ok = fflush(f) == 0 && !ferror(f);
    int e = errno;
    if (path && fclose(f) != 0 && ok)
        ok = false, e = errno;
    if (!ok)
        fprintf(stderr, "megac lower: error writing %s: %s\n", path ? path : "stdout", e ? strerror(e) : "I/O error");
    struct stat st;
    if (!ok && path && stat(path, &st) == 0 && S_ISREG(st.st_mode))
        remove(path); /* a partial schedule would parse as far as it goes */
    return ok;
}

static void lower_summary(const Schedule *s)
{
    uint64_t ninst = 0, nops = 0, nwait = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            ninst++;
            nops += s->workers[w].insts[i].kind == INST_OP;
            nwait += s->workers[w].insts[i].kind == INST_WAIT;
        }
    fprintf(stderr,
            "megac lower: %s for %s: %u worker%s, %llu instructions (%llu ops, %llu waits), %u buffers, %u counters\n",
            s->name, s->target, s->nworkers, s->nworkers == 1 ? "" : "s", (unsigned long long)ninst, (unsigned long long)nops,
            (unsigned long long)nwait, s->nbufs, s->nctrs);
}

int cmd_lower(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        lower_usage(stdout);
        return 0;
    }
    LowerArgs a = {0};
    int rc = 2;
    Arena arena = {0};
    ModelDesc *m = ARENA_NEW(&arena, ModelDesc);
    Diag d;
    diag_init(&d);
    d.prog = "megac lower";
    Schedule *s = NULL;
    if (!lower_args_parse(&a, argc, argv)) {
        lower_usage(stderr);
    } else if (desc_load(m, &arena, a.model, a.set, a.nset, &d)) {
        const char *tname = a.target ? a.target : m->targets[0] ? m->targets[0] : "cpu";
        const Target *t = target_lookup(tname, &d);
        if (t && !(a.out && cli_out_is_input("lower", a.out, m)) &&
            (s = lower_model_stored(m, t, a.workers, &d)) != NULL && lower_write(s, a.out)) {
            lower_summary(s);
            rc = 0;
        }
    }
    sched_free(s);
    cli_sets_free(a.set, a.nset);
    arena_free(&arena);
    return rc;
}
