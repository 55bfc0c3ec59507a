/*
 * cmd_validate.c - `megac validate X.sched|-|MODEL [--target T]`: parses a
 * schedule (or lowers a model, as `megac lower` does) and runs the static
 * validator on it. Exit 0 when it is safe (a one-line summary goes to
 * stderr), 1 with diagnostics when not, 2 when the input cannot be read or
 * parsed, the options are wrong, or the schedule is past the validator's
 * memory or time budget (NOT CHECKED: neither safe nor unsafe).
 */
#include "compiler/cli.h"
#include "compiler/compile.h"
#include "compiler/driver.h"
#include "runtime/backend.h"
#include "validator/validator.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void validate_usage(FILE *out)
{
    fprintf(out, "usage: megac validate X.sched|-|B.megac|MODEL [--target T] [--threads N] [--regs N] [--smem BYTES]\n"
                 "                      [--workers N] [--set key=value]...\n\n"
                 "Proves the schedule free of deadlocks, data races, uninitialized scratch reads,\n"
                 "outputs left unwritten and KV-order violations for every pos in [0, max_seq),\n"
                 "and checks its structure and that its workers can all be resident on the\n"
                 "target. '-' reads stdin, a bundle (NAME.megac/) its schedule.sched. A model (a\n"
                 "description, GGUF file, HF folder or llama2.c checkpoint) is lowered first, as\n"
                 "`megac lower` lowers it: the schedule `megac compile` builds.\n\n"
                 "  --target T     check against target T instead of the schedule's own (a\n"
                 "                 model's: its description's first target, else cpu)\n"
                 "  --threads N    threads per block of the kernel, 1..1024 (CUDA co-residency)\n"
                 "  --regs N       registers per thread, 1..255\n"
                 "  --smem BYTES   shared memory per block\n"
                 "  --workers N    a model's worker count (as megac lower)\n"
                 "  --set k=v      override a model's description key (repeatable)\n"
                 "--regs and --smem need --threads; all three apply to CUDA targets. Without them a\n"
                 "CUDA target is assumed to hold one block per SM. A bundle's schedule.sched and\n"
                 "weights.bin must match their hashes in its manifest, and its weights_read_bytes\n"
                 "the schedule's.\n\n"
                 "Exit status: 0 safe, 1 findings, 2 unreadable input, bad options, or a schedule past\n"
                 "the validator's budget (NOT CHECKED; MEGAC_VALIDATE_MAX_GB sets its memory, default 8).\n");
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
    long v;
    if (!cli_parse_long(s, r->lo, r->hi, &v)) {
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

/* Validates s (parsed from src) against target tname (NULL: its own) and
 * prints the one-line summary. Exit status as the command's. */
static int validate_sched(const Schedule *s, const SrcFile *src, const char *tname, ValOptions *o)
{
    Diag d;
    diag_init(&d);
    d.prog = "megac validate";
    o->target = target_lookup(tname ? tname : s->target, &d);
    if (!o->target)
        return 2;
    if (o->target->kind != TARGET_CUDA && o->threads_per_block) {
        fprintf(stderr, "megac validate: --threads, --regs and --smem apply to CUDA targets, not %s\n",
                o->target->name);
        return 2;
    }
    o->src = src;
    ValResult r;
    double t0 = now_ms();
    bool ok = val_schedule_check(s, o, &d, &r);
    double ms = now_ms() - t0;
    uint64_t ninst = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        ninst += s->workers[w].ninst;
    bool unchecked = r.nlimit > 0 && r.nerrors == r.nlimit; /* nothing unsafe found, nothing decided */
    fprintf(stderr,
            "megac validate: %s: %s: %llu instructions, %u workers, target %s, %llu access pairs checked, %.1f ms",
            src->path, ok ? "safe" : unchecked ? "NOT CHECKED" : "UNSAFE", (unsigned long long)ninst, s->nworkers,
            o->target->name, (unsigned long long)r.pairs_checked, ms);
    if (!ok && !unchecked)
        fprintf(stderr, "; %d errors (structure %d, deadlock %d, race %d, uninit %d, residency %d)", r.nerrors,
                r.nstructure, r.ndeadlock, r.nrace, r.nuninit, r.nresidency);
    fputc('\n', stderr);
    return ok ? 0 : unchecked ? 2 : 1;
}

/* weights.bin must be the file the compile wrote (its size and
 * hash_bulk): a damaged copy runs, and gives non-finite logits or, worse,
 * other text. False (reported) when it is not. */
static bool validate_bundle_weights(const char *dir, const RtManifest *man)
{
    char *wpath = xasprintf("%s/weights.bin", dir);
    uint64_t bytes = 0, hash = 0;
    bool ok = file_hash_bulk(wpath, &bytes, &hash);
    if (!ok)
        fprintf(stderr, "megac validate: %s: cannot read: %s\n", wpath,
                errno == ENODEV ? "not a regular file" : strerror(errno));
    else if (bytes != man->weights_bytes || hash != man->weights_hash)
        fprintf(stderr, "%s: error: %s (the file was changed or damaged after compilation: recompile the bundle)\n",
                wpath, bytes != man->weights_bytes ? "its size is not the manifest's weights_bytes"
                                                   : "its hash is not the manifest's weights_hash");
    ok = ok && bytes == man->weights_bytes && hash == man->weights_hash;
    free(wpath);
    return ok;
}

/* The manifest's weights_bytes must be the schedule's weight layout (the
 * kernel was built for that layout: megac_open refuses the bundle
 * otherwise), and its weights_read_bytes, which nothing hashes and only
 * `megac bench` read (for its GB/s), what the schedule reads. */
static bool validate_bundle_reads(const char *dir, const RtManifest *man, Schedule *s)
{
    sched_layout(s);    /* the offsets a compile gave it (a parsed schedule has none) */
    uint64_t reads = bundle_read_bytes(s);
    if (s->weights_bytes != man->weights_bytes)
        fprintf(stderr, "%s/manifest.yaml: error: weights_bytes is %llu, but the schedule lays out %llu weight bytes "
                        "(the manifest and weights.bin were changed after compilation: recompile the bundle)\n",
                dir, (unsigned long long)man->weights_bytes, (unsigned long long)s->weights_bytes);
    else if (reads != man->weights_read_bytes)
        fprintf(stderr, "%s/manifest.yaml: error: weights_read_bytes is %llu, but the schedule reads %llu weight bytes "
                        "a step (the manifest was edited)\n",
                dir, (unsigned long long)man->weights_read_bytes, (unsigned long long)reads);
    return s->weights_bytes == man->weights_bytes && reads == man->weights_read_bytes;
}

/* A bundle must be one megac_open accepts (megac_bundle_check: its
 * schedule.sched the one the manifest was written for, the manifest's
 * target the schedule's, the kernel file and the tokenizer whole):
 * validating it otherwise would say "safe" of a bundle that cannot run;
 * and its weights must be whole (above). The manifest into *man; false
 * (reported) when any is not so. */
static bool validate_bundle_manifest(const char *dir, RtManifest *man)
{
    char *mpath = xasprintf("%s/manifest.yaml", dir), err[512], *mtext = NULL;
    size_t mlen = 0;
    bool ok = false;
    /* the runtime's check first: it refuses members that are not regular
     * files (a FIFO would read as empty here) */
    if (megac_bundle_check(dir) != MEGAC_OK)
        fprintf(stderr, "%s\n", megac_last_open_error());
    else if (!(mtext = read_file(mpath, &mlen)))
        fprintf(stderr, "megac validate: %s: cannot read: %s\n", mpath,
                errno == ENODEV ? "not a regular file (a device)" : strerror(errno));
    else if (rt_manifest_parse(man, mpath, mtext, mlen, err, sizeof err) != MEGAC_OK)
        fprintf(stderr, "%s\n", err);
    else
        ok = validate_bundle_weights(dir, man);
    free(mpath);
    free(mtext);
    return ok;
}

/* A schedule's text: X.sched, '-' for stdin, or a bundle's schedule.sched
 * (bundle: its folder), which must also be the manifest's (above). */
static int validate_file(const char *path, const char *bundle, const char *tname, ValOptions *o)
{
    Diag d;
    SrcFile src;
    diag_init(&d);
    d.prog = "megac validate";
    bool in = !strcmp(path, "-");
    if (!srcfile_load(&src, in ? "/dev/stdin" : path)) {
        diag_file_error(&d, path, "cannot read: %s",
                        errno == ENODEV ? "not a regular file (a device)" : strerror(errno));
        return 2;
    }
    if (in) {
        free((char *)src.path);
        src.path = xstrdup(path = "<stdin>");
    }
    RtManifest man;
    Schedule *s = NULL;
    int rc = 2;
    if ((!bundle || validate_bundle_manifest(bundle, &man)) && (s = sched_parse(path, src.text, src.len, &d)) != NULL &&
        (!bundle || validate_bundle_reads(bundle, &man, s)))
        rc = validate_sched(s, &src, tname, o);
    sched_free(s);
    srcfile_free(&src);
    return rc;
}

/* A model (description, GGUF file, HF folder): lowered as `megac lower`
 * lowers it (the schedule `megac compile` builds), printed, parsed back
 * and validated; errors quote the lines of that text, named
 * "<lowered PATH>". */
static int validate_model(const char *path, const char *tname, int workers, const DescOverride *set, int nset,
                          ValOptions *o)
{
    Arena arena = {0};
    ModelDesc *m = ARENA_NEW(&arena, ModelDesc);
    Diag d;
    diag_init(&d);
    d.prog = "megac validate";
    int rc = 2;
    if (desc_load(m, &arena, path, set, nset, &d)) {
        const Target *t = target_lookup(tname ? tname : m->targets[0] ? m->targets[0] : "cpu", &d);
        Schedule *low = t ? lower_model_stored(m, t, workers, &d) : NULL;
        if (low) {
            char *text = sched_to_string(low);
            SrcFile src = {xasprintf("<lowered %s>", path), text, strlen(text)};
            Schedule *s = sched_parse(src.path, text, src.len, &d);
            if (!s)
                fprintf(stderr, "megac validate: the lowered schedule does not parse back (a bug; errors above)\n");
            else if ((rc = validate_sched(s, &src, t->name, o)) == 1) {
                char wn[32] = "";
                if (workers)
                    snprintf(wn, sizeof wn, " --workers %d", workers);
                fprintf(stderr,
                        "megac validate: note: the lines quoted are the output of 'megac lower %s --target %s%s'%s\n",
                        path, t->name, wn, nset ? " with the same --set options" : "");
            }
            sched_free(s);
            free((char *)src.path);
            free(text);
        }
        sched_free(low);
    }
    arena_free(&arena);
    return rc;
}

/* Whether path names a schedule rather than a model: '-' and *.sched
 * always, a folder or 'default' (the embedded model) never, else a file
 * whose first word (past blank and comment lines) is 'schedule'. */
static bool validate_is_schedule(const char *path)
{
    size_t n = strlen(path);
    if (!strcmp(path, "-") || (n > 6 && !strcmp(path + n - 6, ".sched")))
        return true;
    if (driver_is_default_model(path) || !*path)   /* '': desc_load says the model's path is empty */
        return false;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
        return true; /* a pipe (<(megac lower ...)) is read once, as a schedule: peeking would eat its start */
    FILE *f = fopen(path, "rb");
    if (!f)
        return true; /* validate_file says why it cannot be read */
    char buf[4096];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    const char *p = buf, *end = buf + len;
    while (p < end) {
        if (*p == '#')
            while (p < end && *p != '\n')
                p++;
        else if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
            p++;
        else
            break;
    }
    return end - p > 8 && !memcmp(p, "schedule", 8) && (p[8] == ' ' || p[8] == '\t');
}

/* A bundle folder's schedule (xmalloc'd "DIR/schedule.sched"), or NULL
 * when path is not a bundle (no manifest.yaml in it). */
static char *validate_bundle_schedule(const char *path)
{
    struct stat st;
    char *manifest = xasprintf("%s/manifest.yaml", path);
    bool bundle = stat(path, &st) == 0 && S_ISDIR(st.st_mode) && access(manifest, F_OK) == 0;
    free(manifest);
    return bundle ? xasprintf("%s/schedule.sched", path) : NULL;
}

#define VALIDATE_MAX_SETS 64

int cmd_validate(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        validate_usage(stdout);
        return 0;
    }
    ValOptions o = {0};
    const char *path = NULL, *tname = NULL;
    int workers = 0, nset = 0, rc = 2;
    DescOverride set[VALIDATE_MAX_SETS];
    char *inner = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc, ok = true;
        if (!strcmp(a, "--target") && has_val)
            tname = argv[++i];
        else if (!strcmp(a, "--threads") && has_val)
            ok = int_arg(a, argv[++i], &o.threads_per_block);
        else if (!strcmp(a, "--regs") && has_val)
            ok = int_arg(a, argv[++i], &o.regs_per_thread);
        else if (!strcmp(a, "--smem") && has_val)
            ok = int_arg(a, argv[++i], &o.smem_per_block);
        else if (!strcmp(a, "--workers") && has_val)
            ok = cli_workers_parse("validate", argv[++i], &workers);
        else if (!strcmp(a, "--set") && has_val)
            ok = cli_set_add("validate", argv[++i], set, &nset, VALIDATE_MAX_SETS);
        else if ((a[0] != '-' || !strcmp(a, "-")) && path) {
            fprintf(stderr, "megac validate: one schedule or model at a time ('%s', '%s')\n", path, a);
            ok = false;
        } else if (a[0] != '-' || !strcmp(a, "-")) {
            path = a;
        } else {
            bool known = !strcmp(a, "--target") || !strcmp(a, "--threads") || !strcmp(a, "--regs") ||
                         !strcmp(a, "--smem") || !strcmp(a, "--workers") || !strcmp(a, "--set");
            cli_bad_arg("validate", a, known);
            validate_usage(stderr);
            ok = false;
        }
        if (!ok)
            goto out;
    }
    if (!o.threads_per_block && (o.regs_per_thread || o.smem_per_block)) {
        fprintf(stderr, "megac validate: --regs and --smem need --threads (the kernel's threads per block)\n");
        goto out;
    }
    const char *bundle = NULL;
    if (path && (inner = validate_bundle_schedule(path)) != NULL)
        bundle = path, path = inner;
    if (!path) {
        validate_usage(stderr);
    } else if (validate_is_schedule(path)) {
        if (workers || nset)
            fprintf(stderr, "megac validate: --workers and --set apply to a model; '%s' is a schedule\n", path);
        else
            rc = validate_file(path, bundle, tname, &o);
    } else {
        rc = validate_model(path, tname, workers, set, nset, &o);
    }
out:
    free(inner);
    cli_sets_free(set, nset);
    return rc;
}
