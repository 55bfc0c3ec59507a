/*
 * cmd_bench.c - `megac bench NAME.megac [-n TOKENS] [--runs R]`: decode
 * speed of a bundle against the read bandwidth this machine reaches in the
 * same run. Decode at batch 1 is bound by reading the weights once per
 * token, so tok/s times the weight bytes read per step is the kernel's
 * effective bandwidth, and its ratio to the measured ceiling says how much
 * is left. The last line is machine-readable:
 *   tok_s=... gbps=... ceiling_gbps=... ratio=...
 */
#include "compiler/bench.h"
#include "compiler/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BENCH_MAX_RUNS 64
#define BENCH_STREAMS 4
#define BENCH_PASSES 5

typedef struct {
    const char *bundle;
    int ntok, runs;
    int ceiling_mb;             /* 0: several times the last-level cache */
} BenchOptions;

static void bench_usage(FILE *out)
{
    fprintf(out,
            "usage: megac bench NAME.megac [-n TOKENS] [--runs R] [--ceiling-mb MB]\n\n"
            "Decodes TOKENS greedy tokens (default 128) R times (default 5) and reports\n"
            "the median decode rate and its spread, the weight bytes read per token,\n"
            "the effective bandwidth, and a read-bandwidth ceiling measured in the same\n"
            "run (all CPUs, %d sequential streams per thread, a buffer several times the\n"
            "last-level cache unless --ceiling-mb says otherwise, median of %d passes).\n"
            "The last line is\n"
            "  tok_s=... gbps=... ceiling_gbps=... ratio=...\n",
            BENCH_STREAMS, BENCH_PASSES);
}

/* A positive int option value, or -1. */
static int parse_count(const char *s, int max)
{
    char *end;
    long v = strtol(s, &end, 10);
    return (*s && !*end && v > 0 && v <= max) ? (int)v : -1;
}

static bool bench_args_parse(int argc, char **argv, BenchOptions *o)
{
    *o = (BenchOptions){NULL, 128, 5, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *dst = !strcmp(a, "-n") ? &o->ntok : !strcmp(a, "--runs") ? &o->runs
                 : !strcmp(a, "--ceiling-mb") ? &o->ceiling_mb : NULL;
        if (dst && i + 1 < argc) {
            int v = parse_count(argv[++i], dst == &o->runs ? BENCH_MAX_RUNS : 1 << 20);
            if (v < 0) {
                fprintf(stderr, "megac bench: bad value '%s' for %s\n", argv[i], a);
                return false;
            }
            *dst = v;
        } else if (a[0] == '-' || o->bundle) {
            fprintf(stderr, "megac bench: unexpected argument '%s'\n", a);
            return false;
        } else {
            o->bundle = a;
        }
    }
    if (!o->bundle)
        fprintf(stderr, "megac bench: no bundle given\n");
    return o->bundle != NULL;
}

/* Weight bytes the kernel reads per step, from the bundle's manifest. */
static unsigned long long bench_read_bytes(const char *bundle)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.yaml", bundle);
    FILE *f = fopen(path, "r");
    unsigned long long v = 0;
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "weights_read_bytes: %llu", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

/* Runs the decode `runs` times; fills rates; false on a runtime error. */
static bool bench_decode_runs(megac_model *m, const BenchOptions *o, double *rates)
{
    if (bench_decode_tok_s(m, o->ntok < 8 ? o->ntok : 8) < 0)    /* warm-up */
        return false;
    for (int r = 0; r < o->runs; r++)
        if ((rates[r] = bench_decode_tok_s(m, o->ntok)) < 0)
            return false;
    return true;
}

int cmd_bench(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        bench_usage(stdout);
        return 0;
    }
    BenchOptions o;
    if (!bench_args_parse(argc, argv, &o)) {
        bench_usage(stderr);
        return 2;
    }
    megac_model *m;
    if (megac_open(o.bundle, &m) != MEGAC_OK) {
        fprintf(stderr, "megac bench: %s\n", megac_last_open_error());
        return 2;
    }
    double rates[BENCH_MAX_RUNS];
    if (!bench_decode_runs(m, &o, rates)) {
        fprintf(stderr, "megac bench: %s\n", megac_error(m));
        megac_close(m);
        return 1;
    }
    int ntok = o.ntok < megac_max_seq(m) - 1 ? o.ntok : megac_max_seq(m) - 1;
    int workers = megac_num_workers(m);
    unsigned long long wbytes = megac_weights_bytes(m), rbytes = bench_read_bytes(o.bundle);
    megac_close(m);
    if (rbytes == 0)
        rbytes = wbytes;
    double lo = rates[0], hi = rates[0];
    for (int r = 1; r < o.runs; r++) {
        lo = rates[r] < lo ? rates[r] : lo;
        hi = rates[r] > hi ? rates[r] : hi;
    }
    double tok_s = bench_median(rates, o.runs);
    double gbps = tok_s * (double)rbytes / 1e9;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double ceiling = bench_read_ceiling_gbps((size_t)o.ceiling_mb << 20, 0, BENCH_STREAMS, BENCH_PASSES);
    if (ceiling <= 0) {
        fprintf(stderr, "megac bench: cannot measure the read ceiling (out of memory or threads)\n");
        return 1;
    }
    printf("bundle: %s (%d workers)\n", o.bundle, workers);
    printf("decode: %d tokens x %d runs: median %.1f tok/s (min %.1f, max %.1f, spread %.1f%%)\n", ntok, o.runs,
           tok_s, lo, hi, tok_s > 0 ? 100.0 * (hi - lo) / tok_s : 0.0);
    printf("weights read per token: %.3f MB (weights.bin %.3f MB)\n", rbytes / 1e6, wbytes / 1e6);
    printf("effective read bandwidth: %.2f GB/s\n", gbps);
    printf("read ceiling: %.2f GB/s (%ld threads x %d streams, median of %d passes)\n", ceiling, ncpu,
           BENCH_STREAMS, BENCH_PASSES);
    printf("tok_s=%.2f gbps=%.3f ceiling_gbps=%.3f ratio=%.3f\n", tok_s, gbps, ceiling, gbps / ceiling);
    return 0;
}
