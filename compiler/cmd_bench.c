/*
 * cmd_bench.c - `megac bench NAME.megac [-n TOKENS] [--runs R]`: decode
 * speed of a bundle against the read bandwidth this machine reaches in the
 * same run. Decode at batch 1 is bound by reading the weights once per
 * token, so tok/s times the weight bytes read per step is the kernel's
 * effective bandwidth, and its ratio to the measured ceiling says how much
 * is left. With --prefill it also times the same positions run as a
 * prompt's are (steps without outputs). The last line is machine-readable:
 *   tok_s=... gbps=... ceiling_gbps=... ratio=...
 */
#include "compiler/bench.h"
#include "compiler/cli.h"
#include "compiler/compile.h"
#include "compiler/driver.h"
#include "compiler/run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_MAX_RUNS 64
#define BENCH_STREAMS 4

typedef struct {
    const char *bundle;         /* a bundle, or a model compiled into the run cache (then replaced by its path) */
    const char *versus;         /* a second one timed in the same runs, or NULL */
    int ntok, runs, context;
    int ceiling_mb;             /* 0: the step's weight bytes */
    bool prefill;               /* --prefill */
    DescOverride sets[RUN_MAX_SETS];    /* --set, for the models given */
    int nsets;
    int workers;                /* --workers, for the models given; 0: the CPU's cores */
} BenchOptions;

static void bench_usage(FILE *out)
{
    fprintf(out,
            "usage: megac bench NAME.megac|MODEL [-n TOKENS] [--runs R] [--context N]\n"
            "                   [--versus OTHER.megac|MODEL] [--prefill] [--ceiling-mb MB]\n"
            "                   [--set key=value]... [--workers N]\n\n"
            "Decodes TOKENS greedy tokens (default 128) R times (default 5) and reports\n"
            "the median decode rate and its spread, the weight bytes read per token,\n"
            "the effective bandwidth, and a read-bandwidth ceiling measured in the same\n"
            "run: one pass after each decode run, all CPUs, %d sequential streams per\n"
            "thread (four lines of each in turn, prefetched 16 KB ahead, the CPU's\n"
            "widest loads), over a buffer as large as the weights a step reads (up to\n"
            "2 GiB), so that it sits in the caches exactly when the weights can, read\n"
            "as many times per pass as a decode run reads the weights (at least 512\n"
            "MiB, at most 16 GiB; --ceiling-mb MB: a buffer of MB read once a pass);\n"
            "median of the R passes. The ratio is the median over runs of each run's\n"
            "bandwidth over the ceiling pass after it. The last line is\n"
            "  tok_s=... gbps=... ceiling_gbps=... ratio=...\n\n"
            "  --context N          first feed N positions (untimed), then time TOKENS\n"
            "                       more: decode at a long context, where attention\n"
            "                       reads N rows per layer (the bandwidth figures count\n"
            "                       weights only)\n"
            "  --versus OTHER       also time OTHER.megac in the same runs (right after\n"
            "                       NAME's decode in odd runs, right before it in even\n"
            "                       ones) and report its rate and the speed ratio: the\n"
            "                       median over runs of NAME/OTHER within each run\n"
            "                       (e.g. sparse attention against dense):\n"
            "  versus_tok_s=... speedup=...\n"
            "  --prefill            also feed the TOKENS that NAME decoded, at the same\n"
            "                       positions, as a prompt's tokens are fed (steps\n"
            "                       without outputs: no output matrix, no argmax),\n"
            "                       right after its decode in each run, and report\n"
            "                       that rate and its ratio to the decode rate (the\n"
            "                       median over runs of prefill/decode within each run):\n"
            "  prefill_tok_s=... prefill_speedup=...\n\n"
            "A MODEL (a .yaml description, a GGUF file, an HF checkpoint folder, a\n"
            "llama2.c checkpoint; 'default': the embedded model) is first compiled for\n"
            "the cpu target, as `megac run` compiles one: into .megac-cache/, or found\n"
            "there. For the models given (NAME, OTHER or both; not bundles):\n"
            "  --set key=value      override a description key (repeatable)\n"
            "  --workers N          worker count, 1..4096 (default: the CPU's cores)\n",
            BENCH_STREAMS);
}

/* A positive int option value, or -1. */
static int parse_count(const char *s, int max)
{
    long v;
    return cli_parse_long(s, 1, max, &v) ? (int)v : -1;
}

static bool bench_args_parse(int argc, char **argv, BenchOptions *o)
{
    memset(o, 0, sizeof *o);
    o->ntok = 128;
    o->runs = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *dst = !strcmp(a, "-n") ? &o->ntok : !strcmp(a, "--runs") ? &o->runs
                 : !strcmp(a, "--ceiling-mb") ? &o->ceiling_mb : !strcmp(a, "--context") ? &o->context : NULL;
        if (!strcmp(a, "--versus") && i + 1 < argc) {
            o->versus = argv[++i];
        } else if (!strcmp(a, "--set") && i + 1 < argc) {
            if (!cli_set_add("bench", argv[++i], o->sets, &o->nsets, RUN_MAX_SETS))
                return false;
        } else if (!strcmp(a, "--workers") && i + 1 < argc) {
            if (!cli_workers_parse("bench", argv[++i], &o->workers))
                return false;
        } else if (!strcmp(a, "--prefill")) {
            o->prefill = true;
        } else if (dst && i + 1 < argc) {
            int max = dst == &o->runs ? BENCH_MAX_RUNS : 1 << 20, v = parse_count(argv[++i], max);
            if (v < 0) {
                fprintf(stderr, "megac bench: %s needs a number in 1..%d, not '%s'\n", a, max, argv[i]);
                return false;
            }
            *dst = v;
        } else if (a[0] == '-' || o->bundle) {
            return cli_bad_arg("bench", a, dst != NULL || !strcmp(a, "--versus") || !strcmp(a, "--set") ||
                                               !strcmp(a, "--workers"));
        } else {
            o->bundle = a;
        }
    }
    if (!o->bundle) {
        fprintf(stderr, "megac bench: no bundle or model given\n");
        return false;
    }
    bool models = !run_model_is_bundle(o->bundle) || (o->versus && !run_model_is_bundle(o->versus));
    if ((o->nsets || o->workers) && !models) {
        fprintf(stderr, "megac bench: %s applies to model descriptions, not bundles (compile them with it)\n",
                o->nsets ? "--set" : "--workers");
        return false;
    }
    return true;
}

/* *path as a bundle: itself, or a model compiled into the run cache (as
 * `megac run` compiles one) and opened; NULL after reporting. *owned is
 * the cached bundle's path, which replaces *path. */
static megac_model *bench_open(const char **path, const BenchOptions *o, char **owned)
{
    megac_model *m = NULL;
    *owned = NULL;
    if (run_model_is_bundle(*path)) {
        if (megac_open(*path, &m) != MEGAC_OK)
            fprintf(stderr, "megac bench: %s\n", megac_last_open_error());
        return m;
    }
    RunOptions ro;
    memset(&ro, 0, sizeof ro);
    ro.model = driver_is_default_model(*path) ? NULL : *path;
    ro.engine = ENGINE_CPU;
    memcpy(ro.sets, o->sets, sizeof(DescOverride) * (size_t)o->nsets);
    ro.nsets = o->nsets;
    ro.workers = o->workers;
    char *dir = run_cache_open(&ro, "megac bench", &m);
    if (dir)
        *owned = dir, *path = dir;
    return m;
}

/* Weight bytes the kernel reads per step: what the bundle's schedule reads
 * (megac_open has checked it is the one the manifest was written for), not
 * the manifest's weights_read_bytes, which nothing hashes (an edited one
 * had the ceiling probe map 2 GiB for a toy model). 0 when the schedule
 * does not read back. */
static uint64_t bench_read_bytes(const char *bundle)
{
    char *path = xasprintf("%s/schedule.sched", bundle);
    size_t n;
    char *text = read_file(path, &n);
    Diag d;
    diag_init(&d);
    d.silent = true;
    Schedule *s = text ? sched_parse(path, text, n, &d) : NULL;
    uint64_t v = s ? bundle_read_bytes(s) : 0;
    if (s)
        sched_free(s);
    free(text);
    free(path);
    return v;
}

/* Min, median and max of n values (sorts v). */
static void spread(double *v, int n, double *lo, double *med, double *hi)
{
    *med = bench_median(v, n);
    *lo = v[0];
    *hi = v[n - 1];
}

/* What the runs measured, run by run: NAME's decode rate, OTHER's, NAME's
 * prefill rate (--prefill), and the ceiling pass after them. */
typedef struct {
    double rate[BENCH_MAX_RUNS], vrate[BENCH_MAX_RUNS], prate[BENCH_MAX_RUNS], ceil[BENCH_MAX_RUNS];
} BenchRuns;

/* R decode runs, each followed by a ceiling pass; false on an error
 * (reported). */
static bool bench_runs(megac_model *m, megac_model *v, BenchCeiling *c, const BenchOptions *o, BenchRuns *br)
{
    megac_model *both[2] = {m, v};
    int *toks = o->prefill ? malloc(sizeof *toks * (size_t)o->ntok) : NULL;
    bool ok = false;
    if (o->prefill && !toks) {
        fprintf(stderr, "megac bench: no memory for %d tokens\n", o->ntok);
        return false;
    }
    for (int i = 0; i < 2 && both[i]; i++)
        if (bench_decode_tok_s(both[i], o->context, o->ntok < 8 ? o->ntok : 8, NULL, NULL) < 0) {    /* warm-up */
            fprintf(stderr, "megac bench: %s\n", megac_error(both[i]));
            goto out;
        }
    for (int r = 0; r < o->runs; r++) {
        /* With --versus the two take turns at going first, so that neither
         * always decodes right after the ceiling pass (which has just
         * filled the caches with its own buffer) nor always right after
         * the other. */
        for (int k = 0; k < 2; k++) {
            int which = v && r % 2 ? 1 - k : k;
            if (!both[which])
                continue;
            double t = bench_decode_tok_s(both[which], o->context, o->ntok, NULL, which ? NULL : toks);
            /* NAME's decoded tokens again, fed as a prompt's are */
            double p = t >= 0 && !which && toks ? bench_decode_tok_s(m, o->context, o->ntok, toks, NULL) : 0;
            if (t < 0 || p < 0) {
                fprintf(stderr, "megac bench: %s%s%s\n", which ? o->versus : "", which ? ": " : "",
                        megac_error(both[which]));
                goto out;
            }
            *(which ? &br->vrate[r] : &br->rate[r]) = t;
            if (!which)
                br->prate[r] = p;
        }
        if ((br->ceil[r] = bench_ceiling_pass(c)) < 0) {
            fprintf(stderr, "megac bench: a read-ceiling thread did not start\n");
            goto out;
        }
    }
    ok = true;
out:
    free(toks);
    return ok;
}

/* The context position and token count a bundle's runs time: o's, cut
 * to what its context holds. */
static void bench_clip(const megac_model *m, const BenchOptions *o, int *ctx, int *ntok)
{
    int last = megac_max_seq(m) - 1;
    *ctx = o->context < 1 ? 1 : o->context > last ? last : o->context;
    *ntok = o->ntok < last - *ctx + 1 ? o->ntok : last - *ctx + 1;
}

/* rbytes: the weight bytes a step reads (the manifest's, else all). */
static void bench_report(const BenchOptions *o, megac_model *m, unsigned long long rbytes, const BenchCeiling *c,
                         BenchRuns *br)
{
    double *rates = br->rate, *vrates = o->versus ? br->vrate : NULL, *ceil = br->ceil;
    int last = megac_max_seq(m) - 1, ctx, ntok;
    bench_clip(m, o, &ctx, &ntok);
    if (o->context > last)
        fprintf(stderr, "megac bench: note: --context %d is more than the model's context allows (%d positions); "
                "fed %d\n", o->context, last + 1, ctx);
    if (o->ntok > ntok)
        fprintf(stderr, "megac bench: note: -n %d (after --context %d) is more than the model's context allows; "
                "timed %d tokens\n", o->ntok, ctx, ntok);
    unsigned long long wbytes = megac_weights_bytes(m);
    double lo, tok_s, hi, clo, ceiling, chi, slo = 0, sp = 0, shi = 0, rlo, rhi, run_gbps[BENCH_MAX_RUNS];
    /* before the sorts below: a ratio is of two figures from one run */
    for (int r = 0; r < o->runs; r++)
        run_gbps[r] = rates[r] * (double)rbytes / 1e9;
    double ratio = bench_ratio_median(run_gbps, ceil, o->runs, &rlo, &rhi);
    if (vrates)
        sp = bench_ratio_median(rates, vrates, o->runs, &slo, &shi);
    double plo = 0, pp = 0, phi = 0;
    if (o->prefill)
        pp = bench_ratio_median(br->prate, rates, o->runs, &plo, &phi);
    spread(rates, o->runs, &lo, &tok_s, &hi);
    spread(ceil, o->runs, &clo, &ceiling, &chi);
    double gbps = tok_s * (double)rbytes / 1e9;
    printf("bundle: %s (%d worker%s)\n", o->bundle, megac_num_workers(m), megac_num_workers(m) == 1 ? "" : "s");
    printf("decode: %d tokens x %d runs from position %d: median %.2f tok/s (min %.2f, max %.2f)\n", ntok, o->runs,
           ctx, tok_s, lo, hi);
    printf("weights read per token: %.3f MB (weights.bin %.3f MB, %s)\n", rbytes / 1e6, wbytes / 1e6,
           megac_weights_in_memory(m) ? "read into memory" : "mapped from the file");
    printf("effective read bandwidth: %.2f GB/s\n", gbps);
    printf("read ceiling: median %.2f GB/s (min %.2f, max %.2f; %d threads x %d streams, %d sweep%s over %.1f MiB, "
           "one pass after each run)\n",
           ceiling, clo, chi, bench_ceiling_threads(c), BENCH_STREAMS, bench_ceiling_sweeps(c),
           bench_ceiling_sweeps(c) == 1 ? "" : "s", bench_ceiling_bytes(c) / 1048576.0);
    printf("ratio to the ceiling: median %.3f of the runs' own (min %.3f, max %.3f)\n", ratio, rlo, rhi);
    if (vrates) {
        double vlo, vt, vhi;
        spread(vrates, o->runs, &vlo, &vt, &vhi);
        printf("versus %s: median %.2f tok/s (min %.2f, max %.2f); speed ratio %.3f (per run: min %.3f, max %.3f)\n",
               o->versus, vt, vlo, vhi, sp, slo, shi);
        printf("versus_tok_s=%.2f speedup=%.3f\n", vt, sp);
    }
    if (o->prefill) {
        double lo2, pt, hi2;
        spread(br->prate, o->runs, &lo2, &pt, &hi2);
        printf("prefill: the same %d tokens fed as a prompt's (steps without outputs): median %.2f tok/s (min "
               "%.2f, max %.2f); %.3f of the decode rate (per run: min %.3f, max %.3f)\n",
               ntok, pt, lo2, hi2, pp, plo, phi);
        printf("prefill_tok_s=%.2f prefill_speedup=%.3f\n", pt, pp);
    }
    printf("tok_s=%.2f gbps=%.3f ceiling_gbps=%.3f ratio=%.3f\n", tok_s, gbps, ceiling, ratio);
}

/* Times m (and v beside it) as the options say; the exit status. */
static int bench_bundles(const BenchOptions *o, megac_model *m, megac_model *v)
{
    int ctx[2], ntok[2];
    bench_clip(m, o, &ctx[0], &ntok[0]);
    if (v)
        bench_clip(v, o, &ctx[1], &ntok[1]);
    if (v && (ctx[0] != ctx[1] || ntok[0] != ntok[1])) {   /* the ratio would be of different work */
        fprintf(stderr, "megac bench: %s times %d tokens from position %d, %s %d from %d (their contexts: %d and %d "
                        "positions); give a --context and -n that both hold\n", o->bundle, ntok[0], ctx[0], o->versus,
                ntok[1], ctx[1], megac_max_seq(m), megac_max_seq(v));
        return 2;
    }
    unsigned long long rbytes = (unsigned long long)bench_read_bytes(o->bundle);
    if (rbytes == 0)    /* a manifest without the figure: every weight byte */
        rbytes = megac_weights_bytes(m);
    size_t pass;
    size_t size = bench_ceiling_size(rbytes, o->ntok, &pass);
    if (o->ceiling_mb)   /* a buffer of the caller's size, read once a pass */
        size = pass = (size_t)o->ceiling_mb << 20;
    BenchCeiling *c = bench_ceiling_new(size, pass, 0, BENCH_STREAMS);
    BenchRuns *br = calloc(1, sizeof *br);
    int rc = 1;
    if (!c || !br)
        fprintf(stderr, "megac bench: cannot set up the read-ceiling probe (memory)\n");
    else if (bench_runs(m, v, c, o, br)) {
        bench_report(o, m, rbytes, c, br);
        rc = 0;
    }
    free(br);
    bench_ceiling_free(c);
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        bench_usage(stdout);
        return 0;
    }
    BenchOptions o;
    if (!bench_args_parse(argc, argv, &o)) {
        cli_sets_free(o.sets, o.nsets);
        bench_usage(stderr);
        return 2;
    }
    char *owned[2] = {NULL, NULL};
    megac_model *m = bench_open(&o.bundle, &o, &owned[0]), *v = NULL;
    if (m && o.versus && !(v = bench_open(&o.versus, &o, &owned[1]))) {
        megac_close(m);
        m = NULL;
    }
    int rc = m ? bench_bundles(&o, m, v) : 2;
    if (m)
        megac_close(m);
    if (v)
        megac_close(v);
    free(owned[0]);
    free(owned[1]);
    cli_sets_free(o.sets, o.nsets);
    return rc;
}
