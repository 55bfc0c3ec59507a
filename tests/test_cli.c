/*
 * test_cli.c - what `megac` does to the files around it: `compile -o` never
 * overwrites a folder that is not a bundle, replaces a bundle whole, and
 * leaves nothing behind when it fails or is interrupted; `lower -o` and
 * `eval-quant --json` refuse to overwrite their input; `run`'s cache heals
 * a damaged entry and sweeps the folders of killed compiles. Plus the
 * option parsing of `run` (wording of bad flags, -n=3, default, --set), and
 * `lower` and `validate` of a model seeing the schedule a compile builds.
 * Each test works in its own temporary folder.
 */
#include "tests/cpuinfo.h"
#include "tests/tmpdir.h"
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_YAML MEGAC_SRC "/models/default.yaml"

static char *tmp_dir(void)
{
    return test_tmp_dir("cli");
}

/* Runs `cd dir && ENV megac ARGS 2>&1` (env: variable assignments, or "");
 * returns the exit status, output in out. */
static int megac_env(const char *dir, const char *env, const char *args, char *out, size_t cap)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && %s %s %s 2>&1", dir, env, MEGAC_BIN, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Runs `cd dir && megac ARGS 2>&1`; returns the exit status, output in out. */
static int megac(const char *dir, const char *args, char *out, size_t cap)
{
    return megac_env(dir, "", args, out, cap);
}

/* A compile whose code generation fails, after lowering: without a cc on
 * PATH kernel.so cannot be linked. */
#define NO_CC "PATH=/nonexistent"

static void file_write(const char *dir, const char *name, const char *text)
{
    char p[1200];
    cr_assert(snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p, "path too long: %s/%s", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert(f, "%s", p);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
}

/* The file's text (at most cap - 1 bytes), "" if it cannot be read. */
static char *file_read(const char *dir, const char *name, char *buf, size_t cap)
{
    char p[1200];
    cr_assert(snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p, "path too long: %s/%s", dir, name);
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
    return buf;
}

/* The folder's entries, sorted and space-separated ("" when empty). */
static char *dir_list(const char *dir, char *buf, size_t cap)
{
    struct dirent **e;
    int n = scandir(dir, &e, NULL, alphasort);
    cr_assert(n >= 0, "%s", dir);
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(e[i]->d_name, ".") && strcmp(e[i]->d_name, ".."))
            snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", buf[0] ? " " : "", e[i]->d_name);
        free(e[i]);
    }
    free(e);
    return buf;
}

/* ---- compile -o ---- */

/* `megac doctor` reports memory and the huge page mode the runtime's weight
 * reading depends on. */
Test(cli, doctor_reports_memory_and_huge_pages)
{
    char out[8192];
    cr_assert_eq(megac("/", "doctor", out, sizeof out), 0, "%s", out);
    const char *m = strstr(out, "\nmemory:");
    cr_assert(m, "no memory line: %s", out);
    double total = 0, free_gib = -1;
    cr_assert_eq(sscanf(m + 1, "memory: %lf GiB, %lf GiB free;", &total, &free_gib), 2, "%s", m + 1);
    cr_assert(total > 0 && free_gib >= 0 && free_gib <= total, "%s", m + 1);
    cr_assert(strstr(m, "transparent huge pages: "), "%s", m + 1);
    if (strstr(out, "\nhost cpu:      LLVM has no native target"))
        return;
    const char *t = strstr(out, "\ncpu tuning:    GEMV prefetches spread over rows of ");
    cr_assert(t, "no cpu tuning line: %s", out);
    int intel = test_cpuinfo_has("vendor_id", "GenuineIntel");
    const char *every = strstr(t, "every length");
    if (intel >= 0)
        cr_assert_eq(every && every < strchr(t + 1, '\n'), intel, "%s", t + 1);
}

Test(cli, compile_refuses_a_folder_that_is_not_a_bundle)
{
    char *d = tmp_dir(), out[8192], buf[256];
    char proj[1200];
    snprintf(proj, sizeof proj, "%s/proj", d);
    cr_assert_eq(mkdir(proj, 0777), 0);
    file_write(proj, "manifest.yaml", "my notes\n");
    file_write(proj, "weights.bin", "data\n");
    cr_assert_eq(megac(d, "compile default -q -o proj", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "proj: error: exists and is not a megac bundle"), "%s", out);
    cr_assert_str_eq(file_read(proj, "manifest.yaml", buf, sizeof buf), "my notes\n");
    cr_assert_str_eq(file_read(proj, "weights.bin", buf, sizeof buf), "data\n");
    cr_assert_str_eq(dir_list(proj, buf, sizeof buf), "manifest.yaml weights.bin");
    cr_assert_str_eq(dir_list(d, buf, sizeof buf), "proj");
    /* A file, '.' and '/' are refused too, and nothing is written. */
    cr_assert_eq(megac(d, "compile default -q -o proj/weights.bin", out, sizeof out), 2, "%s", out);
    cr_assert_str_eq(file_read(proj, "weights.bin", buf, sizeof buf), "data\n");
    cr_assert_eq(megac(proj, "compile default -q -o .", out, sizeof out), 2, "%s", out);
    cr_assert_eq(megac(d, "compile default -q -o /", out, sizeof out), 2, "%s", out);
    cr_assert_str_eq(dir_list(proj, buf, sizeof buf), "manifest.yaml weights.bin");
    test_rm_rf(d);
}

Test(cli, compile_replaces_a_bundle_and_fills_an_empty_folder)
{
    char *d = tmp_dir(), out[8192], buf[4096], b[1200];
    cr_assert_eq(megac(d, "compile default -q -o b.megac/", out, sizeof out), 0, "%s", out);
    snprintf(b, sizeof b, "%s/b.megac", d);
    cr_assert(strstr(file_read(b, "manifest.yaml", buf, sizeof buf), "\nformat: "), "%s", buf);
    cr_assert_eq(megac(d, "compile default -q --set max_seq=64 -o b.megac", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(file_read(b, "manifest.yaml", buf, sizeof buf), "\nmax_seq: 64\n"), "%s", buf);
    cr_assert_str_eq(dir_list(d, buf, sizeof buf), "b.megac");
    cr_assert_str_eq(dir_list(b, buf, sizeof buf), "kernel.so manifest.yaml schedule.sched tokenizer.bin weights.bin");
    cr_assert_eq(megac(d, "run b.megac -n 4 --temp 0", out, sizeof out), 0, "%s", out);
    char empty[1200];
    snprintf(empty, sizeof empty, "%s/empty", d);
    cr_assert_eq(mkdir(empty, 0777), 0);
    cr_assert_eq(megac(d, "compile default -q -o empty", out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(dir_list(empty, buf, sizeof buf),
                     "kernel.so manifest.yaml schedule.sched tokenizer.bin weights.bin");
    test_rm_rf(d);
}

Test(cli, a_failed_compile_leaves_nothing)
{
    char *d = tmp_dir(), out[8192], buf[4096], b[1200];
    cr_assert_eq(megac_env(d, NO_CC, "compile default -q -o new.megac", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "linking kernel.so"), "%s", out);
    cr_assert_str_eq(dir_list(d, buf, sizeof buf), "");
    /* Over an existing bundle: the old one stays as it was. */
    cr_assert_eq(megac(d, "compile default -q --set max_seq=64 -o b.megac", out, sizeof out), 0, "%s", out);
    cr_assert_eq(megac_env(d, NO_CC, "compile default -q -o b.megac", out, sizeof out), 2, "%s", out);
    cr_assert_str_eq(dir_list(d, buf, sizeof buf), "b.megac");
    snprintf(b, sizeof b, "%s/b.megac", d);
    cr_assert(strstr(file_read(b, "manifest.yaml", buf, sizeof buf), "\nmax_seq: 64\n"), "%s", buf);
    test_rm_rf(d);
}

/* A model whose stored weights exceed the memory a compile may use is
 * refused before anything is loaded, with the sizes, and nothing is
 * written (it used to be killed by the OOM killer partway through
 * loading); the sizes are the stored ones, not f32's: SmolLM2-135M in f32
 * is 0.54 GB, at W4A16-g32 85 MB, which fits in 100 MB. The reference
 * engine, eval-quant and eval-kv check the same. MEGAC_MEMORY_MB stands in
 * for the machine. */
Test(cli, weights_past_the_memory_are_refused_before_loading, .timeout = 120)
{
    char *d = tmp_dir(), out[8192], buf[256];
    const char *lm = MEGAC_SRC "/models/smollm2-135m.yaml";
    char args[1400];
    snprintf(args, sizeof args, "compile %s -o s.megac", lm);
    cr_assert_eq(megac_env(d, "MEGAC_MEMORY_MB=100", args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "smollm2-135m.yaml: error: a compile holds the stored weights in memory until it writes "
                          "them: 0.54 GB for this model (211 matrices in f32), but 0.10 GB are available "
                          "(MEGAC_MEMORY_MB); store the matrices smaller (--set quant.default=bf16"),
              "%s", out);
    cr_assert(strstr(out, "weights_load") && strstr(out, "FAILED") && !strstr(out, "f32 read"), "%s", out);
    cr_assert_str_eq(dir_list(d, buf, sizeof buf), "");
    /* small sizes in MB (both read "0.00 GB") */
    cr_assert_eq(megac_env(d, "MEGAC_MEMORY_MB=0.01", "compile default -o s.megac", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, " MB for this model (") && strstr(out, "but 0.01 MB are available (MEGAC_MEMORY_MB)"), "%s",
              out);
    snprintf(args, sizeof args, "compile %s -q --set quant.default=w4a16-g32 -o s.megac", lm);
    cr_assert_eq(megac_env(d, "MEGAC_MEMORY_MB=100", args, out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(dir_list(d, buf, sizeof buf), "s.megac");
    snprintf(args, sizeof args, "run %s --engine reference -n 2", lm);
    cr_assert_eq(megac_env(d, "MEGAC_MEMORY_MB=100", args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "error: the reference engine holds the stored weights in memory: 0.54 GB"), "%s", out);
    /* eval-quant's baseline is f32 whatever the knobs: no formats named */
    snprintf(args, sizeof args, "eval-quant %s --tokens 4", lm);
    cr_assert_eq(megac_env(d, "MEGAC_MEMORY_MB=100", args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "error: eval-quant holds the unquantized model's weights in memory: 0.54 GB") &&
                  !strstr(out, "--set quant.default"),
              "%s", out);
    snprintf(args, sizeof args, "eval-kv %s --tokens 4", lm);
    cr_assert_eq(megac_env(d, "MEGAC_MEMORY_MB=100", args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "error: eval-kv holds the model's stored weights in memory: 0.54 GB"), "%s", out);
    test_rm_rf(d);
}

/* SIGINT as soon as the temporary folder exists, and while the kernel
 * compiles: the folder goes with the process. */
Test(cli, an_interrupted_compile_leaves_nothing)
{
    for (int delay_ms = 0; delay_ms <= 300; delay_ms += 300) {
        char *d = tmp_dir(), buf[4096], tmp[1400];
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
            if (chdir(d) == 0 && freopen("/dev/null", "w", stderr))
                execl(MEGAC_BIN, MEGAC_BIN, "compile", "default", "-q", "-o", "b.megac", (char *)NULL);
            _exit(127);
        }
        snprintf(tmp, sizeof tmp, "%s/b.megac.tmp%ld", d, (long)pid);
        struct timespec ms = {0, 1000000}, delay = {0, delay_ms * 1000000L};
        for (int i = 0; i < 20000 && access(tmp, F_OK) != 0; i++)
            nanosleep(&ms, NULL);
        cr_assert_eq(access(tmp, F_OK), 0, "the compile never made %s", tmp);
        nanosleep(&delay, NULL);
        cr_assert_eq(kill(pid, SIGINT), 0);
        int st;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT, "delay %d ms: status %#x", delay_ms, st);
        cr_assert_str_eq(dir_list(d, buf, sizeof buf), "", "delay %d ms", delay_ms);
        test_rm_rf(d);
    }
}

/* eval-kv --engine cpu compiles two bundles into temporary folders under
 * $TMPDIR: SIGINT or SIGTERM while they are compiled or run removes them
 * (they were left behind, ~95 MB each for SmolLM2). */
Test(cli, an_interrupted_eval_leaves_no_temporary_bundle, .timeout = 120)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGTERM};
    for (int k = 0; k < 3; k++) {
        char *d = tmp_dir(), buf[4096];
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
            if (setenv("TMPDIR", d, 1) == 0 && freopen("/dev/null", "w", stderr) && freopen("/dev/null", "w", stdout))
                execl(MEGAC_BIN, MEGAC_BIN, "eval-kv", "default", "--engine", "cpu", "--tokens", "250", "--set",
                      "compile.kv_policy=[{layers: all, policy: tova, budget: 8}]", (char *)NULL);
            _exit(127);
        }
        /* until the first folder exists (k 0: its bundle compiling), its
         * bundle is compiled (k 1: being opened, or open), or the second
         * folder exists (k 2: the first bundle open, the second compiling) */
        struct timespec ms = {0, 1000000};
        for (int i = 0; i < 60000; i++) {
            dir_list(d, buf, sizeof buf);
            char *dense = strstr(buf, "megac_dense_"), path[1400];
            if (k == 1 && dense)
                snprintf(path, sizeof path, "%s/%.*s/dense.megac/kernel.so", d, (int)strcspn(dense, " "), dense);
            if (k == 0 ? buf[0] != 0 : k == 1 ? dense && access(path, F_OK) == 0 : !!strstr(buf, "megac_configured_"))
                break;
            nanosleep(&ms, NULL);
        }
        cr_assert_neq(buf[0], 0, "eval-kv made no temporary folder");
        cr_assert_eq(kill(pid, sigs[k]), 0);
        int st;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == sigs[k], "case %d: status %#x", k, st);
        cr_assert_str_eq(dir_list(d, buf, sizeof buf), "", "case %d", k);
        test_rm_rf(d);
    }
}

/* ---- outputs that are inputs ---- */

Test(cli, outputs_never_overwrite_the_input)
{
    char *d = tmp_dir(), out[8192], buf[8192], want[8192];
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/self.yaml' && ln '%s/self.yaml' '%s/hard.yaml'", DEFAULT_YAML, d, d, d);
    cr_assert_eq(system(cmd), 0);
    file_read(d, "self.yaml", want, sizeof want);
    cr_assert_eq(megac(d, "lower self.yaml -o self.yaml", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "megac lower: the output 'self.yaml' is the input file"), "%s", out);
    cr_assert_eq(megac(d, "lower self.yaml -o ./hard.yaml", out, sizeof out), 2, "%s", out);
    cr_assert_eq(megac(d, "eval-quant self.yaml --tokens 2 --formats w8a16 --json self.yaml", out, sizeof out), 2,
                 "%s", out);
    cr_assert(strstr(out, "megac eval-quant: the output 'self.yaml' is the input file"), "%s", out);
    cr_assert_str_eq(file_read(d, "self.yaml", buf, sizeof buf), want);
    cr_assert_eq(megac(d, "lower self.yaml -o x.sched", out, sizeof out), 0, "%s", out);
    test_rm_rf(d);
}

/* ---- run's cache ---- */

/* The one entry of DIR/.megac-cache. */
static char *cache_entry(const char *d, char *buf, size_t cap)
{
    char c[1200];
    snprintf(c, sizeof c, "%s/.megac-cache", d);
    dir_list(c, buf, cap);
    cr_assert(buf[0] && !strchr(buf, ' '), "cache: '%s'", buf);
    return buf;
}

Test(cli, a_damaged_cache_entry_is_rebuilt)
{
    char *d = tmp_dir(), out[16384], e[256], cmd[1600];
    cr_assert_eq(megac(d, "run -n 3 --temp 0", out, sizeof out), 0, "%s", out);
    cache_entry(d, e, sizeof e);
    /* A truncated weights.bin: the bundle does not open. */
    snprintf(cmd, sizeof cmd, "truncate -s 100 '%s/.megac-cache/%s/weights.bin'", d, e);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(megac(d, "run -n 3 --temp 0", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "does not open") && strstr(out, "discarding it and recompiling"), "%s", out);
    cr_assert_eq(megac(d, "run -n 3 --temp 0", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "using the cached bundle"), "%s", out);
    /* No manifest at all. */
    snprintf(cmd, sizeof cmd, "rm '%s/.megac-cache/%s/manifest.yaml'", d, e);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(megac(d, "run -n 3 --temp 0", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "is incomplete; recompiling it"), "%s", out);
    cr_assert_str_eq(cache_entry(d, e, sizeof e), e);
    test_rm_rf(d);
}

/* Folders of killed compiles (their pid is gone) are swept; a folder
 * that holds anything but bundle files is left alone. */
Test(cli, run_sweeps_the_folders_of_killed_compiles)
{
    char *d = tmp_dir(), out[16384], buf[1024], c[1200], t[1400];
    pid_t pid = fork();     /* a pid that is surely dead */
    cr_assert(pid >= 0);
    if (pid == 0)
        _exit(0);
    cr_assert_eq(waitpid(pid, NULL, 0), pid);
    snprintf(c, sizeof c, "%s/.megac-cache", d);
    cr_assert_eq(mkdir(c, 0777), 0);
    snprintf(t, sizeof t, "%s/0123.megac.tmp%ld", c, (long)pid);
    cr_assert_eq(mkdir(t, 0777), 0);
    file_write(t, "weights.bin", "partial");
    file_write(t, "kernel.so.o", "partial");
    snprintf(t, sizeof t, "%s/mine.tmp%ld", c, (long)pid);
    cr_assert_eq(mkdir(t, 0777), 0);
    file_write(t, "notes.txt", "keep me");
    cr_assert_eq(megac(d, "run -n 3 --temp 0", out, sizeof out), 0, "%s", out);
    snprintf(t, sizeof t, "mine.tmp%ld", (long)pid);
    cr_assert(strstr(dir_list(c, buf, sizeof buf), t) && !strstr(buf, "0123"), "%s", buf);
    test_rm_rf(d);
}

/* The cache keeps the MEGAC_CACHE_KEEP most recently used bundles: three
 * model variants with a keep of 2 leave the two last used, and using an
 * old one again makes it the one kept. */
Test(cli, run_cache_keeps_the_most_recently_used)
{
    char *d = tmp_dir(), out[16384], buf[1024], c[1200], first[1024];
    snprintf(c, sizeof c, "%s/.megac-cache", d);
    cr_assert_eq(megac(d, "run -n 3 --temp 0 --set max_seq=64", out, sizeof out), 0, "%s", out);
    snprintf(first, sizeof first, "%s", dir_list(c, buf, sizeof buf));
    cr_assert_eq(megac(d, "run -n 3 --temp 0 --set max_seq=65", out, sizeof out), 0, "%s", out);
    sleep(1);   /* distinct modification times, even on coarse clocks */
    cr_assert_eq(megac(d, "run -n 3 --temp 0 --set max_seq=64", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "using the cached bundle"), "%s", out);
    sleep(1);
    setenv("MEGAC_CACHE_KEEP", "2", 1);
    cr_assert_eq(megac(d, "run -n 3 --temp 0 --set max_seq=66", out, sizeof out), 0, "%s", out);
    unsetenv("MEGAC_CACHE_KEEP");
    cr_assert(strstr(out, "removed 1 least recently used cached bundle"), "%s", out);
    dir_list(c, buf, sizeof buf);
    cr_assert(strstr(buf, first), "the bundle used again stays: %s", buf);
    cr_assert_eq(megac(d, "run -n 3 --temp 0 --set max_seq=66", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "using the cached bundle"), "%s", out);
    cr_assert(strchr(buf, ' ') && !strchr(strchr(buf, ' ') + 1, ' '), "two bundles: %s", buf);
    test_rm_rf(d);
}

/* `megac bench` takes a model as `megac run` does: compiled into the same
 * cache (a run then finds it there), with --set and --workers for the
 * models given (a model named twice is compiled once), and refused for a
 * bundle. */
Test(cli, bench_compiles_a_model_into_the_run_cache)
{
    char *d = tmp_dir(), out[16384], e[256];
    const char *fast = "-n 4 --runs 1 --ceiling-mb 8";
    char args[512];
    snprintf(args, sizeof args, "bench default %s", fast);
    cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "megac bench: compiling default for cpu into .megac-cache/") && strstr(out, "\ntok_s="),
              "%s", out);
    cache_entry(d, e, sizeof e);
    cr_assert_eq(megac(d, "run -n 3 --temp 0", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "megac run: using the cached bundle .megac-cache/") && strstr(out, e), "%s", out);
    snprintf(args, sizeof args, "bench default --versus default --set max_seq=64 --workers 1 %s", fast);
    cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
    const char *c = strstr(out, "megac bench: compiling default"), *u = strstr(out, "megac bench: using the cached");
    cr_assert(c && u && c < u && !strstr(c + 1, "megac bench: compiling") && strstr(out, "(1 worker)"), "%s", out);
    cr_assert(strstr(out, "\nversus_tok_s="), "%s", out);
    char bundle[1400];
    snprintf(bundle, sizeof bundle, "bench .megac-cache/%s --set max_seq=64 %s", e, fast);
    cr_assert_eq(megac(d, bundle, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "megac bench: --set applies to model descriptions, not bundles"), "%s", out);
    cr_assert_eq(megac(d, "bench nothere.yaml", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "nothere.yaml: error: cannot read model description"), "%s", out);
    test_rm_rf(d);
}

/* ---- option parsing ---- */

/* One wording per kind of bad argument, whichever the command. */
Test(cli, bad_arguments_read_the_same_everywhere)
{
    char *d = tmp_dir(), out[16384];
    static const struct {
        const char *args, *want;
    } cases[] = {
        {"run default --bogus", "megac run: unknown option '--bogus'"},
        {"run default --bogus x", "megac run: unknown option '--bogus'"},
        {"run default -n", "megac run: option '-n' needs a value"},
        {"compile default --bogus", "megac compile: unknown option '--bogus'"},
        {"compile default -o", "megac compile: option '-o' needs a value"},
        {"compile default other", "megac compile: unexpected argument 'other'"},
        {"bench b.megac --bogus", "megac bench: unknown option '--bogus'"},
        {"validate x.sched --bogus", "megac validate: unknown option '--bogus'"},
        {"fuzz-validator --bogus", "megac fuzz-validator: unknown option '--bogus'"},
        {"lower default --bogus", "megac lower: unknown option '--bogus'"},
        {"eval-quant default --bogus", "megac eval-quant: unknown option '--bogus'"},
        {"eval-quant default --json", "megac eval-quant: option '--json' needs a value"},
        {"doctor x", "megac doctor: unexpected argument 'x'"},
        {"describe default --bogus", "megac describe: unknown option '--bogus'"},
        {"describe default other", "megac describe: unexpected argument 'other'"},
        {"describe", "megac describe: no model given"},
        {"describe default --set nokey", "megac describe: --set needs KEY=VALUE (at most 64 of them), not 'nokey'"},
        {"lower default --set =1", "megac lower: --set needs KEY=VALUE (at most 64 of them), not '=1'"},
        {"run default --set x", "megac run: --set needs KEY=VALUE (at most 64 of them), not 'x'"},
        {"compile default --set x", "megac compile: --set needs KEY=VALUE"},
        {"fuzz-validator --model default --set x", "megac fuzz-validator: --set needs KEY=VALUE"},
        {"fuzz-validator --count 0x10", "megac fuzz-validator: bad value for --count: '0x10'"},
        {"fuzz-validator --count 0", "megac fuzz-validator: bad value for --count: '0'"},
        {"lower default --target bogus", "megac lower: error: unknown target 'bogus'"},
        {"compile default --target sm_91", "megac compile: error: unknown target 'sm_91' (did you mean 'sm_90'?)"},
        {"run default -n +5", "megac run: -n needs a number in 0..1073741824 (0: the model's context), not '+5'"},
        {"run default -n 0x10", "megac run: -n needs a number"},
        {"run default --temp 0x1p3", "megac run: --temp needs a number in 0..1e6 (0: greedy), not '0x1p3'"},
        {"run default --temp nan", "megac run: --temp needs a number"},
        {"validate x.sched --threads ' 64'", "megac validate: --threads needs a number in 1..1024, not ' 64'"},
        {"eval-kv default --tokens 1e3", "megac eval-kv: --tokens needs a number"},
        {"eval-quant default --formats w8a16,,f16", "megac eval-quant: bad format ''"},
        {"eval-quant default --formats w8a16,", "megac eval-quant: bad format ''"},
        {"eval-quant default --classes attn,,mlp", "megac eval-quant: unknown tensor class ''"},
        {"eval-quant default --set max_seq=1", "megac eval-quant: the model's max_seq is 1; a measure needs at least 2"},
        {"eval-kv default --set max_seq=1", "megac eval-kv: the model's max_seq is 1; a measure needs at least 2"},
        {"lower default -o /dev/full", "megac lower: error writing /dev/full: No space left on device"},
        {"help nonexist", "megac: unknown command 'nonexist'"},
        {"help run lower", "megac help: one command at a time"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(megac(d, cases[i].args, out, sizeof out), 2, "%s: %s", cases[i].args, out);
        cr_assert(strstr(out, cases[i].want), "%s: %s", cases[i].args, out);
    }
    char many[1024] = "describe default";   /* one --set past the 64 a command holds */
    for (int i = 0; i < 65; i++)
        strcat(many, " --set a=1");
    cr_assert_eq(megac(d, many, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "megac describe: at most 64 --set options; 'a=1' is one too many"), "%s", out);
    test_rm_rf(d);
}

/* `megac validate B.megac` checks the bundle's schedule, and that it is the
 * one the manifest was written for: another one (here a 1-worker bundle's)
 * had been judged safe although the runtime refuses the bundle. Commands
 * that take a model say a bundle is one ("holds no config.json" before). */
Test(cli, validate_checks_a_bundles_schedule_hash)
{
    char *d = tmp_dir(), out[16384];
    cr_assert_eq(megac(d, "compile default -q --workers 1 -o b1.megac", out, sizeof out), 0, "%s", out);
    cr_assert_eq(megac(d, "compile default -q --workers 2 -o b2.megac", out, sizeof out), 0, "%s", out);
    cr_assert_eq(megac(d, "validate b2.megac", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "b2.megac/schedule.sched: safe"), "%s", out);
    cr_assert_eq(megac(d, "lower b2.megac", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "b2.megac: error: this is a compiled bundle, not a model description"), "%s", out);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp '%s/b1.megac/schedule.sched' '%s/b2.megac/schedule.sched'", d, d);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(megac(d, "validate b2.megac", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "b2.megac/schedule.sched: error: schedule hash") &&
                  strstr(out, "does not match the manifest's"),
              "%s", out);
    /* the manifest's weights_read_bytes (bench's GB/s; not hashed) edited */
    cr_assert_eq(megac(d, "validate b1.megac", out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "cd '%s/b1.megac' && cp manifest.yaml m.bak && "
             "sed -i 's/^weights_read_bytes: .*/weights_read_bytes: 99999999999999/' manifest.yaml", d);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(megac(d, "validate b1.megac", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "b1.megac/manifest.yaml: error: weights_read_bytes is 99999999999999, but the schedule reads"),
              "%s", out);
    snprintf(cmd, sizeof cmd, "mv '%s/b1.megac/m.bak' '%s/b1.megac/manifest.yaml'", d, d);
    cr_assert_eq(system(cmd), 0);
    /* a weights.bin with one byte changed runs (it gives other logits): validate finds it */
    cr_assert_eq(megac(d, "validate b1.megac", out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "printf '\\001' | dd of='%s/b1.megac/weights.bin' bs=1 seek=100 conv=notrunc 2>/dev/null",
             d);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(megac(d, "validate b1.megac", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "b1.megac/weights.bin: error: its hash is not the manifest's weights_hash"), "%s", out);
    /* and the rest of what megac_open checks: the kernel, the tokenizer, the manifest's target */
    static const struct {
        const char *edit, *want;
    } damage[] = {
        {"printf '\\001' | dd of=kernel.so bs=1 seek=200 conv=notrunc 2>/dev/null",
         "b2.megac/kernel.so: error: its hash is "},
        {"rm kernel.so", "b2.megac/kernel.so: cannot read the kernel: No such file or directory"},
        /* emptied, with its size and hash in the manifest made to match: validate said "safe" */
        {": > kernel.so && sed -i 's/^kernel_bytes: .*/kernel_bytes: 0/; s/^kernel_hash: .*/kernel_hash: "
         "cbf29ce484222325/' manifest.yaml",
         "b2.megac/kernel.so: error: not an ELF file"},
        {"rm tokenizer.bin", "b2.megac/tokenizer.bin"},
        {"sed -i 's/^target: cpu$/target: host-cuda/' manifest.yaml",
         "b2.megac/manifest.yaml:4:1: error: target 'host-cuda', but the schedule (and its kernel) was built for 'cpu'"},
        {"rm manifest.yaml", "b2.megac: error: this folder holds a schedule.sched but no manifest.yaml"},
        {"rm manifest.yaml && ln -s nowhere manifest.yaml",
         "b2.megac/manifest.yaml: error: cannot read: No such file or directory (a symbolic link that leads to no "
         "file"},
    };
    cr_assert_eq(megac(d, "compile default -q -o b3.megac", out, sizeof out), 0, "%s", out);
    for (size_t i = 0; i < sizeof damage / sizeof *damage; i++) {
        snprintf(cmd, sizeof cmd, "cd '%s' && rm -rf b2.megac && cp -r b3.megac b2.megac", d);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
        cr_assert_eq(megac(d, "validate b2.megac", out, sizeof out), 0, "%s", out);
        snprintf(cmd, sizeof cmd, "cd '%s/b2.megac' && %s", d, damage[i].edit);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
        cr_assert_eq(megac(d, "validate b2.megac", out, sizeof out), 2, "%s: %s", damage[i].edit, out);
        cr_assert(strstr(out, damage[i].want), "%s: %s", damage[i].edit, out);
    }
    test_rm_rf(d);
}

/* A run the model ends by choosing a stop token says so, on every engine:
 * the default model's first greedy token made its EOS ends the text at
 * once, with no token generated. */
Test(cli, run_says_which_stop_token_ended_it)
{
    char *d = tmp_dir(), out[16384], cmd[256];
    cr_assert_eq(megac(d, "run default --engine reference -n 2 --temp 0", out, sizeof out), 0, "%s", out);
    unsigned char c = (unsigned char)out[0];
    cr_assert(c > 0x20 && c < 0x7f, "the default model's first greedy byte is not printable (0x%02X): %s", c, out);
    int id = 3 + c; /* the bytes tokenizer: byte b is id 3 + b */
    static const char *const engines[] = {"reference", "cpu"};
    for (int e = 0; e < 2; e++) {
        snprintf(cmd, sizeof cmd, "run default --engine %s --set eos=%d -n 8 --temp 0", engines[e], id);
        cr_assert_eq(megac(d, cmd, out, sizeof out), 0, "%s", out);
        char want[128];
        snprintf(want, sizeof want, "megac run: the model ended the text: it chose token %d, its EOS\n", id);
        cr_assert(strstr(out, want), "%s: %s", engines[e], out);
        cr_assert(strstr(out, "prompt tokens: 1, generated tokens: 0,"), "%s: %s", engines[e], out);
    }
    cr_assert_eq(megac(d, "run default --engine reference -n 8 --temp 0", out, sizeof out), 0, "%s", out);
    cr_assert(!strstr(out, "ended the text"), "no stop token: nothing said: %s", out);
    test_rm_rf(d);
}

/* `megac help CMD` is `megac CMD --help`; --version names the kernel ABI. */
Test(cli, help_names_a_command_and_version)
{
    char *d = tmp_dir(), out[16384];
    cr_assert_eq(megac(d, "help compile", out, sizeof out), 0, "%s", out);
    cr_assert(!strncmp(out, "usage: megac compile", 20), "%s", out);
    cr_assert_eq(megac(d, "--version", out, sizeof out), 0, "%s", out);
    cr_assert(!strncmp(out, "megac ", 6) && strstr(out, "kernel ABI"), "%s", out);
    test_rm_rf(d);
}

Test(cli, run_takes_default_short_equals_and_notes_clamping)
{
    char *d = tmp_dir(), out[16384];
    cr_assert_eq(megac(d, "compile default -q --set max_seq=32 -o b.megac", out, sizeof out), 0, "%s", out);
    cr_assert_eq(megac(d, "run b.megac -n=3 --temp 0", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "prompt tokens: 1, generated tokens: 3"), "%s", out);
    /* past the context: the cache shifted as it fills (prompt kept, half
     * the rest dropped), every position run; with --no-context-shift, or a
     * cache that cannot shift, a note and the context's positions; the
     * text is the same up to the first shift */
    char shifted[16384], capped[16384];
    cr_assert_eq(megac(d, "run b.megac -n 100 --temp 0 2>/dev/null >t.txt && cat t.txt", shifted, sizeof shifted), 0);
    cr_assert_eq(megac(d, "run b.megac -n 100 --temp 0", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "megac run: the context is full (32 positions): dropped 15 after the first 1; shifted the 16 "
                          "kept down over them\n") && strstr(out, "prompt tokens: 1, generated tokens: 100,"), "%s", out);
    cr_assert_eq(megac(d, "run b.megac -n 1000 --temp 0 --no-context-shift", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "megac run: note: -n 1000 is more than the model's context; running 32 positions\n"), "%s",
              out);
    cr_assert_eq(megac(d, "run b.megac -n 1000 --temp 0 --no-context-shift 2>/dev/null >t.txt && cat t.txt", capped,
                       sizeof capped), 0);
    cr_assert(strlen(capped) > 16 && !strncmp(shifted, capped, 16), "%s\n%s", shifted, capped);
    cr_assert_eq(megac(d, "compile default -q --set max_seq=32 --set kv_policy='[{layers: all, policy: streaming, "
                          "sinks: 4, window: 8}]' -o e.megac", out, sizeof out), 0, "%s", out);
    cr_assert_eq(megac(d, "run e.megac -n 1000 --temp 0", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "megac run: note: -n 1000 is more than the model's context; running 32 positions (this "
                          "bundle's cache cannot be shifted)\n"), "%s", out);
    cr_assert_eq(megac(d, "run b.megac --set workers=4 -n 3", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--set applies to model descriptions, not bundles"), "%s", out);
    cr_assert_eq(megac(d, "run default --engine reference -n 3 --temp 0", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "engine reference"), "%s", out);
    test_rm_rf(d);
}

/* A prompt longer than the positions run is refused by every engine, with
 * the same words; with -n 0 (or beyond the context) it is the model's
 * context that is too short. */
Test(cli, run_long_prompt_is_refused_by_every_engine)
{
    char *d = tmp_dir(), out[16384];
    const char *prompt = "--prompt 'Once upon a time there was'";
    char args[512];
    cr_assert_eq(megac(d, "compile default -q --set max_seq=32 -o b.megac", out, sizeof out), 0, "%s", out);
    const char *models[] = {"b.megac", "default --set max_seq=32 --engine reference"};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "run %s -n 3 --temp 0 %s", models[i], prompt);
        cr_assert_eq(megac(d, args, out, sizeof out), 2, "%s: %s", args, out);
        cr_assert(strstr(out, "megac run: the prompt has 27 tokens, more than the 3 positions asked for"), "%s: %s",
                  args, out);
    }
    cr_assert_eq(megac(d, "run default --set max_seq=4 --engine reference -n 0 --temp 0 "
                          "--prompt 'Once upon a time there was'", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "megac run: the prompt has 27 tokens, more than the model's context (4 positions)"), "%s",
              out);
    test_rm_rf(d);
}

/* Text made of byte tokens (UTF-8 split over <0xXX> pieces) prints the
 * same from a bundle as from the reference: the bundle engine had dropped
 * every lone byte >= 0x80, printing "caf " for "café". */
Test(cli, run_prints_byte_tokens_the_same_on_every_engine)
{
    char *d = tmp_dir(), out[2][16384];
    cr_assert_eq(megac(d, "compile default -q --set max_seq=32 -o b.megac", out[0], sizeof out[0]), 0, "%s", out[0]);
    const char *models[] = {"b.megac", "default --set max_seq=32 --engine reference"};
    for (int i = 0; i < 2; i++) {
        char args[512];
        snprintf(args, sizeof args, "run %s -n 24 --temp 0 --prompt 'caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac'",
                 models[i]);
        cr_assert_eq(megac(d, args, out[i], sizeof out[i]), 0, "%s: %s", args, out[i]);
        cr_assert(!strncmp(out[i], "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac", 11), "%s: %s", args, out[i]);
        char *eol = strchr(out[i], '\n');
        cr_assert(eol, "%s: %s", args, out[i]);
        *eol = 0;
    }
    cr_assert_str_eq(out[0], out[1]);
    test_rm_rf(d);
}

/* A model read from a pipe is read once, as its text: describe peeked at
 * its first bytes for a GGUF magic, and the description it then parsed
 * had lost them ("empty model description"). */
Test(cli, describe_and_validate_read_a_pipe)
{
    char out[16384], cmd[2048];
    snprintf(cmd, sizeof cmd, "cat '%s' | %s describe /dev/stdin 2>&1", DEFAULT_YAML, MEGAC_BIN);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s", out);
    cr_assert(strstr(out, "\nname: default\n") && strstr(out, "  dim: 64\n"), "%s", out);
    /* validate reads a pipe once, as a schedule (<(megac lower ...)): it peeked at its first 4096 bytes to
     * tell a schedule from a model, and then parsed the rest */
    char *d = tmp_dir();
    snprintf(cmd, sizeof cmd, "cd '%s' && mkfifo f && (%s lower default 2>/dev/null > f &) && %s validate f 2>&1", d,
             MEGAC_BIN, MEGAC_BIN);
    p = popen(cmd, "r");
    n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s", out);
    cr_assert(strstr(out, "megac validate: f: safe: 90 instructions, 2 workers"), "%s", out);
    test_rm_rf(d);
}

/* One worker range, 1..4096, and one message for it, in every command. */
Test(cli, workers_have_one_range)
{
    char *d = tmp_dir(), out[16384];
    const char *cases[] = {"compile default --workers 10000", "lower default --workers 4097",
                           "run default --workers 0", "compile default --workers 2x"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(megac(d, cases[i], out, sizeof out), 2, "%s: %s", cases[i], out);
        cr_assert(strstr(out, "--workers needs a number in 1..4096, not '"), "%s: %s", cases[i], out);
    }
    cr_assert_eq(megac(d, "lower default --set workers=4097", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "must be between 1 and 4096, found 4097"), "%s", out);
    test_rm_rf(d);
}

/* A code generator's message names the bundle's path, not the temporary
 * folder the compile writes into. */
Test(cli, codegen_errors_name_the_bundle_path)
{
    char *d = tmp_dir(), out[16384];
    cr_assert_eq(megac_env(d, NO_CC, "compile default -o n.megac", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "n.megac/kernel.so: error: cc -shared (linking kernel.so) failed"), "%s", out);
    cr_assert(!strstr(out, ".tmp"), "%s", out);
    test_rm_rf(d);
}

/* An unknown --cpu is a usage error before any work, naming the option
 * and the names it takes: it was found only after lowering, and reported
 * at "<out>/kernel.so", a path that did not exist yet (found by fuzzing).
 * The names are the code generator's own (cg_cpu_names). */
Test(cli, compile_checks_cpu_before_any_work)
{
    char *d = tmp_dir(), out[16384], buf[256];
    cr_assert_eq(megac(d, "compile default --cpu bogus -o x.megac", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "megac compile: --cpu: unknown CPU 'bogus'; use host (this machine's) or one of x86-64, "
                          "x86-64-v2, x86-64-v3, x86-64-v4, "), "%s", out);
    cr_assert(!strstr(out, "desc_load") && !strstr(out, "kernel.so"), "%s", out);
    cr_assert_str_eq(dir_list(d, buf, sizeof buf), "");
    cr_assert_eq(megac(d, "compile default -q --cpu x86-64-v2 -o x.megac", out, sizeof out), 0, "%s", out);
    test_rm_rf(d);
}

/* eval-quant: an empty list is an error line, a --json that cannot be
 * written is refused before the evaluation, a format named twice is
 * measured once, a long prompt is cut with a note. */
Test(cli, eval_quant_checks_before_evaluating)
{
    char *d = tmp_dir(), out[16384];
    cr_assert_eq(megac(d, "eval-quant default --formats ''", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "megac eval-quant: --formats names no format\n"), "%s", out);
    cr_assert_eq(megac(d, "eval-quant default --classes ''", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "megac eval-quant: --classes names no tensor class\n"), "%s", out);
    cr_assert_eq(megac(d, "eval-quant default --json nope/x.json", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "megac eval-quant: cannot write 'nope/x.json': No such file or directory\n"), "%s", out);
    cr_assert(!strstr(out, "baseline"), "refused before evaluating: %s", out);
    cr_assert_eq(megac(d, "eval-quant default --json . --formats w8a16", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "cannot write '.': Is a directory"), "%s", out);
    /* a format named twice is measured once (it made a row each time) */
    cr_assert_eq(megac(d, "eval-quant default --tokens 4 --formats w4a16,w8a16,w4a16-g128,w4a16-g32", out, sizeof out),
                 0, "%s", out);
    cr_assert(strstr(out, "megac eval-quant: note: format 'w4a16-g128' is named again; measured once\n"), "%s", out);
    cr_assert(strstr(out, "] w4a16-g32 on the reference engine") && strstr(out, "\nw4a16-g32 ") &&
                  strstr(out, "\nw4a16-g128 ") && !strstr(strstr(out, "\nw4a16-g128 ") + 1, "\nw4a16-g128 "),
              "%s", out);
    cr_assert_eq(megac(d, "eval-quant default --tokens 4 --formats w8a16 --prompt 'Once upon a time'", out,
                       sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "megac eval-quant: note: the prompt has 17 tokens; evaluating its first 4 (--tokens)"), "%s",
              out);
    cr_assert_eq(megac(d, "eval-quant default --set max_seq=16 --tokens 64 --formats f16", out, sizeof out), 0, "%s",
                 out);
    cr_assert(strstr(out, "megac eval-quant: note: --tokens 64 is more than the model's max_seq; evaluating 16"), "%s",
              out);
    /* --json is JSON whatever the prompt's bytes: escapes, and U+FFFD for a
     * byte outside UTF-8 (it had been written raw) */
    cr_assert_eq(megac(d, "eval-quant default --tokens 4 --formats f16 --json j.json "
                          "--prompt \"$(printf 'a\\042b\\134c\\001\\377 \\303\\251')\"", out, sizeof out), 0,
                 "%s", out);
    char json[8192];
    file_read(d, "j.json", json, sizeof json);
    cr_assert(strstr(json, "\"prompt\": \"a\\\"b\\\\c\\u0001\\ufffd \xc3\xa9\""), "%s", json);
    test_rm_rf(d);
}

/* The "mean KL from dense" figure of eval-kv's output (-1 if absent). */
static double eval_kv_kl(const char *out)
{
    const char *p = strstr(out, "mean KL from dense");
    return p ? strtod(p + strlen("mean KL from dense"), NULL) : -1;
}

/* eval-kv --engine cpu: the same measure on CPU bundles (compiled into a
 * temporary folder, removed after): within 1% of the reference's, a budget
 * that holds every row of an f32 cache dense bit for bit; planning stays
 * on the reference. */
Test(cli, eval_kv_on_cpu_bundles, .timeout = 300)
{
    char *d = tmp_dir(), out[16384], args[1024];
    const char *set = "--set 'compile.attention=[{layers: 0, kind: kascade, budget: 16, fraction: 0.1}, {layers: 1, "
                      "kind: kascade_reuse, anchor: 0, heads: [1, 0]}]'";
    snprintf(args, sizeof args, "eval-kv default --tokens 160 %s", set);
    cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
    double ref = eval_kv_kl(out);
    snprintf(args, sizeof args, "eval-kv default --tokens 160 %s --engine cpu", set);
    cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
    double cpu = eval_kv_kl(out);
    cr_assert(strstr(out, "(cpu bundles)") && strstr(out, "compiling the dense model for the cpu"), "%s", out);
    cr_assert(ref > 1e-4 && fabs(cpu - ref) <= 0.01 * ref, "KL on the reference %g, on cpu bundles %g", ref, cpu);
    cr_assert_eq(megac(d, "eval-kv default --tokens 64 --engine cpu --set compile.kv_dtype=f32 --set "
                          "'compile.kv_policy=[{layers: all, policy: tova, budget: 100}]'", out, sizeof out),
                 0, "%s", out);
    cr_assert(eval_kv_kl(out) == 0 && strstr(out, "first difference    none\n"), "%s", out);
    cr_assert_eq(megac(d, "eval-kv default --engine gpu", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--engine is reference or cpu, not 'gpu'"), "%s", out);
    cr_assert_eq(megac(d, "eval-kv default --engine cpu --plan-kascade 1", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--plan-kascade profiles on the reference engine"), "%s", out);
    test_rm_rf(d);
}

/* eval-kv: a budget that holds every position is dense (KL 0, no
 * difference); a small one is not; bad settings are refused first. */
Test(cli, eval_kv_measures_against_dense)
{
    char *d = tmp_dir(), out[16384];
    cr_assert_eq(megac(d, "eval-kv default --tokens 64 --set 'compile.kv_policy=[{layers: all, policy: tova, "
                          "budget: 100}]'", out, sizeof out), 0, "%s", out);
    cr_assert(eval_kv_kl(out) >= 0 && eval_kv_kl(out) < 1e-9, "%s", out);
    cr_assert(strstr(out, "same top-1          100.0%\n") && strstr(out, "first difference    none\n"), "%s", out);
    cr_assert_eq(megac(d, "eval-kv default --tokens 64 --set 'compile.kv_policy=[{layers: all, policy: tova, "
                          "budget: 8}]'", out, sizeof out), 0, "%s", out);
    cr_assert(eval_kv_kl(out) > 1e-4, "%s", out);
    cr_assert(strstr(out, "first difference    at position "), "%s", out);
    cr_assert_eq(megac(d, "eval-kv default --tokens 64 --copy 40", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "megac eval-kv: --copy 40 needs --tokens of at least 82\n"), "%s", out);
    cr_assert_eq(megac(d, "eval-kv default --set 'compile.kv_policy=[{layers: all, policy: snapkv, budget: 8, window: "
                          "8}]'",
                       out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "error: snapkv's observation window (8) must be smaller than its budget (8)"), "%s", out);
    cr_assert(!strstr(out, "mean KL"), "refused before evaluating: %s", out);
    /* SnapKV compresses where the prompt ends: before it, the dense model's predictions */
    cr_assert_eq(megac(d, "eval-kv default --tokens 64 --prompt-end 40 --set 'compile.kv_policy=[{layers: all, "
                          "policy: snapkv, budget: 8}]'",
                       out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "the prompt ends at 40\n") && strstr(out, "first difference    at position "), "%s", out);
    int at = atoi(strstr(out, "first difference    at position ") + 32);
    cr_assert_gt(at, 40, "%s", out);
    cr_assert_eq(megac(d, "eval-kv default --tokens 64 --prompt-end 64", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "megac eval-kv: --prompt-end 64 is past the stream's 64 positions"), "%s", out);
    test_rm_rf(d);
}

/* eval-kv --plan-kascade: N anchors from a profile of the dense model,
 * printed as a setting that compiles and evaluates; as many anchors as
 * layers leave no reuse layer; a budget that holds every position has
 * nothing to choose. */
Test(cli, eval_kv_plans_kascade_anchors)
{
    char *d = tmp_dir(), out[16384], args[4096];
    cr_assert_eq(megac(d, "eval-kv default --tokens 96 --plan-kascade 1 --budget 16", out, sizeof out), 0, "%s",
                 out);
    cr_assert(strstr(out, "  anchors 0: the layers keep ") && strstr(out, "layer:recall 0*:1.000 1:"), "%s", out);
    double mapped = atof(strstr(out, "layer:recall 0*:1.000 1:") + strlen("layer:recall 0*:1.000 1:"));
    const char *set = strstr(out, "--set '");
    cr_assert(set && strstr(set, "{layers: 0, kind: kascade, budget: 16}, {layers: 1, kind: kascade_reuse, "
                                 "anchor: 0"), "%s", out);
    int len = (int)(strchr(set + 7, '\'') - set) + 1;
    snprintf(args, sizeof args, "eval-kv default --tokens 96 %.*s", len, set);
    cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
    cr_assert(eval_kv_kl(out) > 0, "16 rows of 96: not dense: %s", out);
    /* each kv head the anchor's that serves it best, or the same index: never better */
    cr_assert_eq(megac(d, "eval-kv default --tokens 96 --plan-kascade 1 --budget 16 --same-heads", out, sizeof out),
                 0, "%s", out);
    cr_assert(strstr(out, "reading the anchor's of its index") && !strstr(out, "heads: ["), "%s", out);
    double same = atof(strstr(out, "layer:recall 0*:1.000 1:") + strlen("layer:recall 0*:1.000 1:"));
    cr_assert(same > 0 && same <= mapped, "the same heads keep %g, the mapped ones %g", same, mapped);
    cr_assert_eq(megac(d, "eval-kv default --tokens 96 --plan-kascade 2 --budget 16", out, sizeof out), 0, "%s",
                 out);
    cr_assert(strstr(out, "  anchors 0, 1: ") && !strstr(out, "kascade_reuse"), "%s", out);
    cr_assert_eq(megac(d, "eval-kv default --tokens 32 --plan-kascade 1 --budget 64", out, sizeof out), 0, "%s",
                 out);
    cr_assert(strstr(out, "no position picks fewer rows than it has"), "%s", out);
    cr_assert_eq(megac(d, "eval-kv default --plan-kascade 0", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--plan-kascade needs a number from 1 to"), "%s", out);
    /* a top-k growing with the rows: planned so, printed so, and read back */
    cr_assert_eq(megac(d, "eval-kv default --tokens 200 --plan-kascade 1 --budget 16 --fraction 0.25", out,
                       sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "(or 0.25 of the rows when more)"), "%s", out);
    const char *rk = "layer:recall 0*:1.000 1:";
    double grown = atof(strstr(out, rk) + strlen(rk));
    set = strstr(out, "--set '");
    cr_assert(set && strstr(set, "{layers: 0, kind: kascade, budget: 16, fraction: 0.25}"), "%s", out);
    len = (int)(strchr(set + 7, '\'') - set) + 1;
    snprintf(args, sizeof args, "eval-kv default --tokens 96 %.*s", len, set);
    cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
    cr_assert_eq(megac(d, "eval-kv default --tokens 200 --plan-kascade 1 --budget 16", out, sizeof out), 0, "%s", out);
    double fixed = atof(strstr(out, rk) + strlen(rk));
    cr_assert(fixed > 0 && fixed < grown, "16 rows keep %g of layer 1's attention, up to 50 %g", fixed, grown);
    cr_assert_eq(megac(d, "eval-kv default --budget 16", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--budget is an option of --plan-kascade, which is not given"), "%s", out);
    cr_assert_eq(megac(d, "eval-kv default --plan-kascade 1 --fraction 0", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--fraction needs a number above 0 and at most 1, not '0'"), "%s", out);
    test_rm_rf(d);
}

/* `megac describe` prints what megac reads, as YAML it reads back: the
 * printed description of a GGUF file, saved (here or elsewhere) and
 * described again, prints the same; compile names a bundle after the file
 * or the folder. */
Test(cli, describe_reads_back_and_compile_names_the_bundle)
{
    const char *gguf = MEGAC_SRC "/tests/fixtures/weights/llama3.gguf";
    if (access(gguf, R_OK) != 0)
        cr_skip("fixtures absent; run tests/fixtures/weights/make_gguf_models.py");
    char *d = tmp_dir(), out[16384], again[16384], args[2048];
    snprintf(args, sizeof args, "describe %s --set compile.max_seq=64", gguf);
    cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "name: llama3\n") && strstr(out, "  max_seq: 64\n") && strstr(out, "type: factors"), "%s",
              out);
    file_write(d, "l3.yaml", out);
    cr_assert_eq(megac(d, "describe l3.yaml", again, sizeof again), 0, "%s", again);
    cr_assert_str_eq(strchr(again, '\n'), strchr(out, '\n'), "only the first line (the source) differs");
    snprintf(args, sizeof args, "compile %s -q && %s compile %s/tests/fixtures/weights/hf-llama3/ -q", gguf, MEGAC_BIN,
             MEGAC_SRC);
    cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(dir_list(d, out, sizeof out), "hf-llama3.megac l3.yaml llama3.megac");
    /* a file name that is not UTF-8: the description says why it will not
     * read back (one warning: the tokenizer is the same file) */
    snprintf(args, sizeof args, "cp %s '%s/l\xe9" "3.gguf'", gguf, d);
    cr_assert_eq(system(args), 0, "%s", args);
    cr_assert_eq(megac(d, "describe 'l\xe9" "3.gguf'", out, sizeof out), 0, "%s", out);
    char *w = strstr(out, "megac describe: warning: the path 'l\xe9" "3.gguf' is not UTF-8, which YAML cannot hold; "
                          "the description will not load back until the file is renamed (megac run and compile take "
                          "the file itself)\n");
    cr_assert(w && !strstr(w + 1, "megac describe: warning"), "one warning: %s", out);
    /* a file named relative to the working directory, its description saved
     * in another folder: it reads back there (its paths are absolute; they
     * were relative to the working directory, the saved file's to its own
     * folder) */
    snprintf(args, sizeof args, "cp %s '%s/m.gguf' && mkdir '%s/sub'", gguf, d, d);
    cr_assert_eq(system(args), 0, "%s", args);
    cr_assert_eq(megac(d, "describe m.gguf", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "path: \"/") && strstr(out, "/m.gguf\"}"), "%s", out);
    file_write(d, "sub/m.yaml", out);
    cr_assert_eq(megac(d, "describe sub/m.yaml", again, sizeof again), 0, "%s", again);
    cr_assert_str_eq(strchr(again, '\n'), strchr(out, '\n'));
    test_rm_rf(d);
}

/* `megac lower` and `megac validate MODEL` see the schedule `megac compile`
 * builds: a GGUF's Q8_0 matrices lowered as Q8_0, not as the f32 an
 * unloaded description would give (which tiles the rows differently). */
Test(cli, lower_and_validate_see_the_compiled_schedule)
{
    const char *gguf = MEGAC_SRC "/tests/fixtures/weights/llama3.gguf";
    if (access(gguf, R_OK) != 0)
        cr_skip("fixtures absent; run tests/fixtures/weights/make_gguf_models.py");
    /* a tied GGUF whose classifier the knobs split off, an HF checkpoint, a
     * llama2.c one, GGUF blocks (lower reads only their headers) */
    static const struct {
        const char *model, *set, *want;
    } cases[] = {
        {"tests/fixtures/weights/qwen2.gguf", "--set 'quant={default: none, embed: f16, lm_head: w8a16}'",
         "buffer lm_head w8 "},
        {"tests/fixtures/weights/hf-llama3", "--set quant.mlp=w4a8-g32", "buffer L1.w_down w4a8g32 "},
        {"tests/fixtures/weights/tiny.gguf", "--set quant.default=a8", "buffer L1.wk q4_1a8 "},
        {"models/stories260k.yaml", "--set quant.lm_head=w4a16-g32", "buffer lm_head w4g32 "},
        {"tests/fixtures/weights/llama3.gguf", "", "buffer L0.wq q8_0 "}, /* last: l.sched is read below */
    };
    char *d = tmp_dir(), out[16384], lowered[65536], compiled[65536], args[4096];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (strstr(cases[i].model, "stories") && access(MEGAC_SRC "/../shared/models/stories260K.bin", R_OK) != 0)
            continue;
        snprintf(args, sizeof args,
                 "compile %s/%s --workers 3 %s -q -o b.megac && %s lower %s/%s --workers 3 %s -o l.sched", MEGAC_SRC,
                 cases[i].model, cases[i].set, MEGAC_BIN, MEGAC_SRC, cases[i].model, cases[i].set);
        cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
        file_read(d, "l.sched", lowered, sizeof lowered);
        file_read(d, "b.megac/schedule.sched", compiled, sizeof compiled);
        cr_assert(strlen(compiled) > 1000 && strlen(compiled) < sizeof compiled - 1, "%zu bytes", strlen(compiled));
        cr_assert(strstr(lowered, cases[i].want), "%s: no '%s'", cases[i].model, cases[i].want);
        cr_assert_str_eq(lowered, compiled, "%s %s", cases[i].model, cases[i].set);
    }

    snprintf(args, sizeof args, "validate %s --workers 3", gguf);
    cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
    char want[1200];
    snprintf(want, sizeof want, "megac validate: <lowered %s>: safe: ", gguf);
    cr_assert(strstr(out, want), "%s", out);
    char *n = strstr(out, "safe: "), *e = n ? strstr(n, " access pairs checked") : NULL;
    cr_assert(e, "%s", out);
    e[0] = 0; /* the counts, not the time */
    cr_assert_eq(megac(d, "validate l.sched", lowered, sizeof lowered), 0, "%s", lowered);
    cr_assert(strstr(lowered, n), "the same counts as the schedule's file:\n%s\n%s", n, lowered);
    test_rm_rf(d);
}

/* quant a8 says what it did: how many matrices take int8 inputs, and
 * which stored dtypes have no such form (tiny.gguf: Q4_0, Q4_1, Q8_0 do;
 * its f16 wv and bf16 w_gate do not); a class not asked is not counted.
 * The reference engine says it does not model the int8 inputs, and a GPU
 * compile refuses them in one error. */
Test(cli, compile_a8_summary)
{
    if (access(MEGAC_SRC "/tests/fixtures/weights/tiny.gguf", R_OK) != 0)
        cr_skip("fixtures absent; run tests/fixtures/weights/make_gguf_models.py");
    static const struct {
        const char *set, *want;
    } cases[] = {
        {"--set quant.default=a8", "; a8: 12 with int8 inputs, exact inputs for f16, bf16 (4: no int8 form)\n"},
        {"--set quant.attn=a8", "; a8: 6 with int8 inputs, exact inputs for f16 (2: no int8 form)\n"},
    };
    char *d = tmp_dir(), out[16384], args[4096];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, "compile %s/tests/fixtures/weights/tiny.gguf --target cpu %s -o b.megac",
                 MEGAC_SRC, cases[i].set);
        cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, cases[i].want), "%s: no '%s' in\n%s", cases[i].set, cases[i].want, out);
    }
    snprintf(args, sizeof args, "run %s/tests/fixtures/weights/tiny.gguf --set quant.default=a8 --engine reference "
             "-n 2 --prompt ''", MEGAC_SRC);
    cr_assert_eq(megac(d, args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "megac run: note: the reference engine runs int8-input formats (w8a8, w4a8, a8) on their "
                          "weights with exact inputs; their int8 inputs are modelled by the cpu engine\n"), "%s", out);
    /* for a GPU, or the CUDA C on the host: one error from the lowering,
     * not one per instruction (host-cuda gave those, naming a schedule file
     * never written), and `lower` and `validate` of the model refuse it as
     * `compile` does (they called its schedule safe) */
    static const char *const cuda[] = {"sm_90", "host-cuda"};
    static const char *const cmd[] = {"compile", "lower", "validate"};
    for (int i = 0; i < 6; i++) {
        snprintf(args, sizeof args, "%s %s/tests/fixtures/weights/tiny.gguf --target %s --set quant.default=a8%s",
                 cmd[i / 2], MEGAC_SRC, cuda[i % 2], i / 2 == 2 ? "" : " -o g.megac");
        cr_assert_eq(megac(d, args, out, sizeof out), 2, "%s: %s", args, out);
        char want[512];
        snprintf(want, sizeof want, "tiny.gguf: error: matrix 'embed' is q8_0a8: int8-input formats (w8a8, w4a8, a8) "
                 "run on the CPU backend only (--target cpu); for %s, choose an A16 format (none, w8a16, w4a16)\n",
                 cuda[i % 2]);
        cr_assert(strstr(out, want), "%s: %s", args, out);
        cr_assert(!strstr(out, "CUDA backend yet") && !strstr(out, "safe") && !strstr(out, "error: matrix 'L0"),
                  "%s: %s", args, out);
    }
    test_rm_rf(d);
}

/* A MEGAC_* setting its reader would not take is warned of (they fell back
 * to their defaults silently), whatever the command; good ones are not. */
Test(cli, env_settings_warned)
{
    char *d = tmp_dir(), out[8192];
    cr_assert_eq(megac_env(d, "MEGAC_VALIDATE_MAX_GB=8GB MEGAC_CACHE_KEEP=0 MEGAC_WATCHDOG_MS=-5", "validate default",
                           out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "megac: warning: MEGAC_VALIDATE_MAX_GB='8GB' is not a number of gigabytes above 0; 8 is "
                          "used\n"), "%s", out);
    cr_assert(strstr(out, "megac: warning: MEGAC_CACHE_KEEP='0' is not a count of bundles, 1..100000; 8 is used\n"),
              "%s", out);
    cr_assert(strstr(out, "megac: warning: MEGAC_WATCHDOG_MS='-5' is not a number of milliseconds (digits only); the "
                          "kernel's default deadline is used\n"), "%s", out);
    cr_assert(strstr(out, ": safe: "), "%s", out);
    /* the validator takes the default for such a value too (atof read
     * '1e-9x' as 1e-9 GB, which leaves the schedule unchecked) */
    cr_assert_eq(megac_env(d, "MEGAC_VALIDATE_MAX_GB=1e-9x", "validate default", out, sizeof out), 0, "%s", out);
    cr_assert_eq(megac_env(d, "MEGAC_VALIDATE_MAX_GB=1e-9", "validate default", out, sizeof out), 2, "%s", out);
    cr_assert(!strstr(out, "warning"), "%s", out);
    cr_assert_eq(megac_env(d, "MEGAC_VALIDATE_MAX_GB=0.5 MEGAC_CACHE_KEEP=3 MEGAC_WATCHDOG_MS=0", "validate default",
                           out, sizeof out), 0, "%s", out);
    cr_assert(!strstr(out, "warning"), "%s", out);
    test_rm_rf(d);
}

/* What `megac validate` does with a model: its description's target and
 * workers, --set and --workers, findings quoted from the lowered text with
 * a note saying how to get it, and no model options for a schedule; and
 * with a bundle: its schedule.sched. */
Test(cli, validate_takes_a_model)
{
    char *d = tmp_dir(), out[16384];
    static const struct {
        const char *args, *want;
        int rc;
    } cases[] = {
        {"validate " DEFAULT_YAML, "megac validate: <lowered " DEFAULT_YAML ">: safe: ", 0},
        {"validate " DEFAULT_YAML " --target host-cuda --workers 5 --set compile.kv_dtype=f16",
         ", 5 workers, target host-cuda,", 0},
        {"validate default --workers 3", " instructions, 3 workers, target cpu,", 0},
        {"validate " DEFAULT_YAML " --set compile.nope=1", "unknown key 'nope'", 2},
        {"validate x.sched --workers 2", "megac validate: --workers and --set apply to a model; 'x.sched' is a schedule",
         2},
        /* 2^20-wide matrices in 16 layers: 4.9e14 bytes of f32 views, past the address space (a
         * report, not an abort) */
        {"validate " DEFAULT_YAML " --set arch.dim=1048576 --set arch.hidden_dim=1048576 --set arch.n_heads=4096"
         " --set arch.n_kv_heads=4096 --set arch.n_layers=16 --set arch.head_dim=256",
         DEFAULT_YAML ": error: model too large for this machine's address space: 1.23e+14 parameters", 2},
        {"validate " DEFAULT_YAML " --target sm_90 --threads 1024 --regs 255",
         "note: the lines quoted are the output of 'megac lower " DEFAULT_YAML " --target sm_90'", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(megac(d, cases[i].args, out, sizeof out), cases[i].rc, "%s: %s", cases[i].args, out);
        cr_assert(strstr(out, cases[i].want), "%s: %s", cases[i].args, out);
    }
    /* the last case's finding, at the lowered text's first line */
    cr_assert(strstr(out, "<lowered " DEFAULT_YAML ">:1:1: error: residency:"), "%s", out);
    /* a bundle: its schedule.sched */
    cr_assert_eq(megac(d, "compile default -q -o b.megac", out, sizeof out), 0, "%s", out);
    cr_assert_eq(megac(d, "validate b.megac", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "megac validate: b.megac/schedule.sched: safe: "), "%s", out);
    test_rm_rf(d);
}

/* A weight file whose header disagrees with the description: the error
 * names the file's key, and a note the line that set the value (the
 * description's, or the command line's --set). */
Test(cli, header_mismatch_notes_the_line_that_set_it)
{
    char *d = tmp_dir(), out[16384];
    file_write(d, "t.yaml",
               "name: t\n"
               "arch: {dim: 32, hidden_dim: 64, n_layers: 2,\n"
               "       n_heads: 8, n_kv_heads: 2, vocab_size: 32, max_seq: 64}\n"
               "rope: {theta: 10000, pairing: adjacent}\n"
               "weights: {format: gguf, path: " MEGAC_SRC "/tests/fixtures/weights/tiny.gguf}\n");
    cr_assert_eq(megac(d, "lower t.yaml -o t.sched", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "tiny.gguf: error: key 'llama.attention.head_count' is 4, but the model description "
                          "says 8\nt.yaml:3:17: note: n_heads is set here\n"),
              "%s", out);
    cr_assert_eq(megac(d, "lower t.yaml --set arch.n_heads=4 --set arch.n_layers=3 -o t.sched", out, sizeof out), 2,
                 "%s", out);
    cr_assert(strstr(out, "error: key 'llama.block_count' is 2, but the model description says 3\n"
                          "<command line>:1:15: note: n_layers is set here\n"),
              "%s", out);
    cr_assert(!strstr(out, "head_count'"), "%s", out);
    test_rm_rf(d);
}

/* A FIFO nothing writes to, named as a schedule, a description, or a
 * bundle's member, is answered at once (it was waited on forever: fuzz
 * campaign F1); a pipe with a writer is still read (describe_and_validate_read_a_pipe). */
Test(cli, a_fifo_nothing_writes_to_is_not_waited_on, .timeout = 60)
{
    char *d = tmp_dir(), out[16384], p[1200];
    snprintf(p, sizeof p, "%s/f", d);
    cr_assert_eq(mkfifo(p, 0600), 0);
    cr_assert_eq(megac(d, "validate f", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "f:1:1: error: expected 'schedule NAME target TARGET workers N'"), "%s", out);
    cr_assert_eq(megac(d, "describe f", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "f: error: empty model description"), "%s", out);
    /* files a description names, or megac finds beside them */
    file_write(d, "c.yaml", "name: c\narch: {from-checkpoint: f}\nweights: {format: llama2c, path: f}\n");
    cr_assert_eq(megac(d, "describe c.yaml", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "does not start with a llama2.c header"), "%s", out);
    file_write(d, "h.yaml", "name: h\narch: {from-config: f}\nweights: {format: synthetic}\n");
    cr_assert_eq(megac(d, "describe h.yaml", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "f: error: empty config"), "%s", out);
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "mkdir '%s/hf' && cp '%s'/tests/fixtures/weights/hf-llama3/* '%s/hf/' && "
             "mkfifo '%s/hf/generation_config.json'", d, MEGAC_SRC, d, d);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cr_assert_eq(megac(d, "describe hf", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "generation_config.json: error: empty generation config"), "%s", out);
    cr_assert_eq(megac(d, "compile default -q -o b.megac", out, sizeof out), 0, "%s", out);
    snprintf(p, sizeof p, "%s/b.megac/schedule.sched", d);
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(mkfifo(p, 0600), 0);
    cr_assert_eq(megac(d, "validate b.megac", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "b.megac/schedule.sched: cannot read: not a regular file"), "%s", out);
    test_rm_rf(d);
}

/* An empty model path is named as such (it read ": error: cannot read
 * model description: No such file or directory", naming no file). */
Test(cli, an_empty_model_path)
{
    char *d = tmp_dir(), out[4096];
    static const char *const cmds[] = {"describe ''", "lower ''", "run '' -n 3", "validate ''"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        cr_assert_eq(megac(d, cmds[i], out, sizeof out), 2, "%s: %s", cmds[i], out);
        cr_assert(strstr(out, "error: the model's path is empty") || strstr(out, "cannot read"), "%s: %s", cmds[i],
                  out);
        cr_assert(!strstr(out, "\n: error") && strncmp(out, ": error", 7) != 0, "%s: %s", cmds[i], out);
    }
    test_rm_rf(d);
}
