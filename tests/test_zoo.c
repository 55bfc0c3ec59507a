/*
 * test_zoo.c - the compiled megakernel against the reference engine for
 * every model of models/: `megac compile` each description at several worker
 * counts (cpu: 1, 2, 3, 8; host-cuda: 1, 2, 3, 5 blocks), open the bundle
 * with the runtime, and decode greedily from BOS next to ref_step (float64):
 *   - every step's logits agree: |kernel - reference| <= ATOL + RTOL * M,
 *     M = max|reference logit| of that step (see ATOL/RTOL below);
 *   - the kernel's argmax equals the reference's at every step.
 *
 * The reference runs once per model, after the first bundle is opened (for
 * its BOS) and before any bundle steps; its logits and greedy tokens are
 * kept and its weights freed, so this process never holds two f32 copies of
 * a large model. The KV cache is cut with `--set max_seq=64`. Bundles go to
 * a temp folder (/dev/shm when the weights are small) and are deleted after
 * use.
 *
 * Models: default (all 256 positions), smollm2-135m and smollm2-135m-hf (8
 * steps), the GGUF SmolLM2 when its file is there (models/README.md, or
 * MEGAC_ZOO_GGUF=FILE); each big description shrunk by `--set` to tiny
 * shapes that keep its features (qkv bias, llama3 RoPE scaling, untied head,
 * MHA and GQA, head_dim != dim/n_heads, adjacent pairs), all 64 positions;
 * opt-in with MEGAC_ZOO_BIG=1: llama-3.2-1b and qwen2.5-0.5b at their own
 * shapes (3 steps; about 3 min and 1 min here). llama-3.1-8b is skipped when
 * its f32 weights do not fit in this machine's memory. host-cuda: default,
 * stories260k and the tiny Qwen, 64 steps. Under MEGAC_SANITIZED=1 (the ASan
 * run) the SmolLM2 shapes take 3 steps instead of 8, and each model runs at
 * one of the worker counts, in turn (harness_variant_wanted; the compiles,
 * LLVM's time, took most of this test's 149 s there, 2026-12-07).
 */
#include "runtime/megac.h"
#include "compiler/model.h"

#include "tests/harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define SHARED MEGAC_SRC "/../shared"
#define MODELS MEGAC_SRC "/models"

/* Tolerance: f32 kernel vs f64 reference, relative to the step's largest
 * logit M: |diff| <= ATOL + RTOL * M. RTOL 1e-5 is ~170 f32 ulps of M: room
 * for the rounding of f32 dot products of up to 8192 terms (error ~
 * sqrt(K) * 2^-24 of their magnitude) through up to 30 layers. Measured:
 * 3e-8 .. 9e-7 of M (the stderr line of each model). ATOL 1e-6 only
 * matters when every logit is near 0. */
#define ATOL 1e-6
#define RTOL 1e-5

#define MAX_SETS 12

/* One model run: a description plus `--set` overrides. */
typedef struct {
    const char *model;              /* a YAML path, or "default" */
    const char *sets[MAX_SETS];     /* "key=value", NULL-terminated */
} ZooModel;

/* The reference's greedy decode of n steps, kept for every bundle. */
typedef struct {
    int n, vocab;
    int *tok;           /* (n) the token fed at step i; tok[0] = BOS */
    float *logits;      /* (n, vocab) */
    double *scale;      /* (n) max|logit| of step i */
} Golden;

static bool file_exists(const char *p) { return access(p, R_OK) == 0; }

static bool big_enabled(void)
{
    const char *e = getenv("MEGAC_ZOO_BIG");
    return e && strcmp(e, "1") == 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A fresh folder for bundles of about `bytes`: /dev/shm (fast, but held in
 * memory) for bundles up to 1 GB when it has room for two of them with some
 * to spare, else /tmp. */
static char *tmp_dir(double bytes)
{
    struct statvfs sv;
    bool shm = bytes <= 1e9 && access("/dev/shm", W_OK) == 0 && statvfs("/dev/shm", &sv) == 0 &&
               (double)sv.f_bavail * (double)sv.f_frsize > 2 * bytes + 512e6;
    char *d = malloc(256);
    snprintf(d, 256, "%s/megac-zoo-XXXXXX", shm ? "/dev/shm" : "/tmp");
    cr_assert(mkdtemp(d), "mkdtemp %s", d);
    return d;
}

/* The bundle folder of the running test: removed at its end, failed or
 * not, so that a failure leaves no 500 MB bundle in /dev/shm. */
static char *zoo_dir;

static void zoo_dir_remove(void)
{
    if (!zoo_dir)
        return;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", zoo_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", zoo_dir);
    free(zoo_dir);
    zoo_dir = NULL;
}

TestSuite(zoo_cpu, .fini = zoo_dir_remove);
TestSuite(zoo_host_cuda, .fini = zoo_dir_remove);

/* megac compile MODEL --target T --workers W --set ... -o DIR/T.wW.megac */
static char *zoo_compile(const ZooModel *z, const char *target, int workers, const char *dir)
{
    char *out = malloc(1200), cmd[8192];
    static char log[1 << 16];
    snprintf(out, 1200, "%s/%s.w%d.megac", dir, target, workers);
    int n = snprintf(cmd, sizeof cmd, "%s compile '%s' --target %s --workers %d -q -o '%s'", MEGAC_BIN, z->model,
                     target, workers, out);
    for (int i = 0; i < MAX_SETS && z->sets[i]; i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " --set '%s'", z->sets[i]);
    snprintf(cmd + n, sizeof cmd - (size_t)n, " 2>&1");
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t got = fread(log, 1, sizeof log - 1, p);
    log[got] = 0;
    cr_assert_eq(pclose(p), 0, "%s failed:\n%s", cmd, log);
    return out;
}

/* The description of z with its overrides, parsed in this process. */
static void zoo_desc(const ZooModel *z, ModelDesc *m, Arena *a)
{
    DescOverride ov[MAX_SETS];
    char *kv[MAX_SETS] = {0};
    int nov = 0;
    for (; nov < MAX_SETS && z->sets[nov]; nov++) {
        kv[nov] = arena_strdup(a, z->sets[nov]);
        char *eq = strchr(kv[nov], '=');
        cr_assert(eq, "bad override %s", z->sets[nov]);
        *eq = 0;
        ov[nov] = (DescOverride){kv[nov], eq + 1};
    }
    Diag d;
    diag_init(&d);
    bool ok = strcmp(z->model, "default") == 0
                  ? desc_parse(m, a, "<embedded>", desc_default_yaml, strlen(desc_default_yaml), ov, nov, &d)
                  : desc_load(m, a, z->model, ov, nov, &d);
    cr_assert(ok, "cannot load %s", z->model);
}


/* Runs the reference engine greedily for n steps from bos into g. */
static void golden_compute(Golden *g, const ZooModel *z, int bos, int n)
{
    Arena a = {0};
    ModelDesc m;
    zoo_desc(z, &m, &a);
    if (n > m.max_seq)
        n = m.max_seq;
    Diag d;
    diag_init(&d);
    Weights w;
    cr_assert(weights_load(&w, &m, &d), "cannot load the weights of %s", z->model);
    RefState *ref = ref_new(&w);
    g->n = n;
    g->vocab = m.vocab_size;
    g->tok = malloc(sizeof *g->tok * (size_t)n);
    g->logits = malloc(sizeof *g->logits * (size_t)n * (size_t)m.vocab_size);
    g->scale = malloc(sizeof *g->scale * (size_t)n);
    cr_assert(g->tok && g->logits && g->scale);
    int tok = bos;
    for (int pos = 0; pos < n; pos++) {
        const float *l = ref_step(ref, tok, pos);
        float *dst = g->logits + (size_t)pos * (size_t)g->vocab;
        memcpy(dst, l, sizeof *dst * (size_t)g->vocab);
        g->tok[pos] = tok;
        g->scale[pos] = 0;
        for (int i = 0; i < g->vocab; i++)
            g->scale[pos] = fmax(g->scale[pos], fabs(l[i]));
        tok = harness_argmax(l, g->vocab);
    }
    ref_free(ref);
    weights_free(&w);
    arena_free(&a);
}

static void golden_free(Golden *g)
{
    free(g->tok);
    free(g->logits);
    free(g->scale);
}

/* Steps the bundle through the reference's tokens; returns the largest
 * |logit diff| relative to max|logit| over all steps. */
static double golden_check(megac_model *mm, const Golden *g, const char *what)
{
    cr_assert_eq(megac_vocab_size(mm), g->vocab, "%s: vocab", what);
    cr_assert_eq(megac_bos(mm), g->tok[0], "%s: BOS", what);
    cr_assert_eq(megac_reset(mm), MEGAC_OK);
    double worst = 0;
    for (int pos = 0; pos < g->n; pos++) {
        cr_assert_eq(megac_step(mm, g->tok[pos]), MEGAC_OK, "%s: %s", what, megac_error(mm));
        const float *got = megac_logits(mm);
        const float *want = g->logits + (size_t)pos * (size_t)g->vocab;
        double tol = ATOL + RTOL * g->scale[pos];
        for (int i = 0; i < g->vocab; i++) {
            double e = fabs((double)got[i] - (double)want[i]);
            worst = fmax(worst, e / g->scale[pos]);
            cr_assert(e <= tol, "%s: pos %d logit %d: kernel %.7g, reference %.7g (|diff| %.3g > %.3g)", what, pos,
                      i, got[i], want[i], e, tol);
        }
        int want_tok = harness_argmax(want, g->vocab);
        cr_assert_eq(megac_argmax(mm), want_tok, "%s: pos %d: kernel picks %d, reference %d", what, pos,
                     megac_argmax(mm), want_tok);
        if (pos + 1 < g->n)
            cr_assert_eq(g->tok[pos + 1], want_tok);
    }
    return worst;
}

/* f32 bytes of the model's weights. */
static double desc_f32_bytes(const ModelDesc *m)
{
    double d = m->dim, q = (double)m->n_heads * m->head_dim, kv = (double)m->n_kv_heads * m->head_dim;
    double layer = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * m->hidden_dim + (m->qkv_bias ? q + 2 * kv : 0);
    double embed = (double)m->vocab_size * d * (m->tie_embeddings ? 1 : 2);
    return 4 * (embed + d + m->n_layers * layer);
}

/* "NAME.yaml [k=v ...]" for messages. */
static void zoo_name(const ZooModel *z, char *out, size_t cap)
{
    const char *slash = strrchr(z->model, '/');
    int n = snprintf(out, cap, "%s", slash ? slash + 1 : z->model);
    for (int i = 0; i < MAX_SETS && z->sets[i] && (size_t)n < cap; i++)
        n += snprintf(out + n, cap - (size_t)n, " %s", z->sets[i]);
}

/* Compiles z for `target` at each worker count and checks nsteps greedy
 * steps of each bundle against the reference. */
static void zoo_run(const ZooModel *z, const char *target, const int *workers, int nw, int nsteps)
{
    double t0 = now_s(), t_compile = 0, t_ref = 0, t_run = 0;
    Arena a = {0};
    ModelDesc m;
    zoo_desc(z, &m, &a);
    zoo_dir = tmp_dir(desc_f32_bytes(&m));
    const char *dir = zoo_dir;
    arena_free(&a);
    Golden g = {0};
    char line[1400];
    char name[600];
    zoo_name(z, name, sizeof name);
    int nl = snprintf(line, sizeof line, "zoo: %s on %s, max |diff|/max|logit|:", name, target);
    size_t id = harness_case_id(name);
    bool first = true;
    for (int i = 0; i < nw; i++) {
        if (!harness_variant_wanted(id, (size_t)i, (size_t)nw))
            continue;
        double tc = now_s();
        char *b = zoo_compile(z, target, workers[i], dir);
        t_compile += now_s() - tc;
        megac_model *mm;
        cr_assert_eq(megac_open(b, &mm), MEGAC_OK, "%s", megac_last_open_error());
        cr_assert_eq(megac_num_workers(mm), workers[i]);
        tc = now_s();
        if (first)
            golden_compute(&g, z, megac_bos(mm), nsteps);
        first = false;
        t_ref += now_s() - tc;
        tc = now_s();
        char what[1400];
        snprintf(what, sizeof what, "%s on %s, %d workers", name, target, workers[i]);
        double worst = golden_check(mm, &g, what);
        t_run += now_s() - tc;
        nl += snprintf(line + nl, sizeof line - (size_t)nl, " w%d %.2g", workers[i], worst);
        megac_close(mm);
        char rm[1300];
        snprintf(rm, sizeof rm, "rm -rf '%s'", b);
        cr_assert_eq(system(rm), 0);
        free(b);
    }
    fprintf(stderr, "%s; %d steps, %.1f s (compiles %.1f s, reference %.1f s, bundles %.1f s)\n", line, g.n,
            now_s() - t0, t_compile, t_ref, t_run);
    golden_free(&g);
    zoo_dir_remove();
}

static const int cpu_workers[] = {1, 2, 3, 8};
static const int cuda_blocks[] = {1, 2, 3, 5};

static void zoo_cpu(const ZooModel *z, int nsteps) { zoo_run(z, "cpu", cpu_workers, 4, nsteps); }

/* ---- the descriptions in models/ ---- */

Test(zoo_cpu, default_model, .timeout = 120)
{
    ZooModel z = {"default", {NULL}};
    zoo_cpu(&z, 256);
}

Test(zoo_cpu, smollm2_135m, .timeout = 300)
{
    ZooModel z = {MODELS "/smollm2-135m.yaml", {"max_seq=64"}};
    zoo_cpu(&z, harness_sanitized() ? 3 : 8);
}

Test(zoo_cpu, smollm2_135m_hf, .timeout = 300)
{
    if (!file_exists(SHARED "/hf-configs/SmolLM2-135M.config.json"))
        cr_skip("../shared/hf-configs/SmolLM2-135M.config.json is absent");
    ZooModel z = {MODELS "/smollm2-135m-hf.yaml", {"max_seq=64"}};
    zoo_cpu(&z, harness_sanitized() ? 3 : 8);
}

/* The GGUF file is not in the repository: models/README.md says where
 * its description looks; MEGAC_ZOO_GGUF=FILE names it elsewhere. With an
 * f32 cache: an f16 one rounds k and v from the kernel's f32 values and
 * from the reference's float64 ones, and on this real model some value
 * lies close enough to the midpoint of two f16 values that the two round
 * apart (one f16 ulp, 4.9e-4 of the value), which moves the logits by
 * ~2e-5 of max|logit| (1.7e-5 at pos 0 here), past RTOL (the f16 cache's own fidelity is
 * eval-kv's measure: a mean KL of 1.2e-7, README). */
Test(zoo_cpu, smollm2_135m_instruct_gguf, .timeout = 300)
{
    ZooModel z = {MODELS "/smollm2-135m-instruct-gguf.yaml", {"max_seq=64", "compile.kv_dtype=f32"}};
    Arena a = {0};
    ModelDesc m;
    zoo_desc(&z, &m, &a);
    char set[1200];
    const char *env = getenv("MEGAC_ZOO_GGUF");
    if (!file_exists(m.weights_path) && env && file_exists(env)) {
        snprintf(set, sizeof set, "weights.path=%s", env);
        z.sets[2] = set;
    } else if (!file_exists(m.weights_path)) {
        char why[1400];
        snprintf(why, sizeof why, "%s is absent (set MEGAC_ZOO_GGUF=FILE to name it elsewhere)", m.weights_path);
        arena_free(&a);
        cr_skip("%s", why);
    }
    arena_free(&a);
    zoo_cpu(&z, harness_sanitized() ? 3 : 8);
}

/* ---- each big model's features at tiny shapes (its own YAML, overridden) ---- */

/* Llama-3.2-1B: tied, llama3 RoPE scaling (factor 32), GQA 4:1. */
Test(zoo_cpu, llama_3_2_1b_features_tiny, .timeout = 120)
{
    ZooModel z = {MODELS "/llama-3.2-1b.yaml",
                  {"dim=128", "hidden_dim=384", "n_layers=2", "head_dim=16", "vocab_size=512", "bos=1", "eos=2",
                   "max_seq=64"}};
    zoo_cpu(&z, 64);
}

/* Qwen2.5-0.5B: q/k/v bias, eps 1e-6, theta 1e6, 7:1 GQA, head_dim !=
 * dim / n_heads. */
Test(zoo_cpu, qwen2_5_0_5b_features_tiny, .timeout = 120)
{
    ZooModel z = {MODELS "/qwen2.5-0.5b.yaml",
                  {"dim=96", "hidden_dim=320", "n_layers=3", "head_dim=24", "vocab_size=600", "max_seq=64"}};
    zoo_cpu(&z, 64);
}

/* Llama-3.1-8B: untied lm_head, llama3 scaling (factor 8), here with as
 * many kv heads as q heads (MHA) and GGUF's adjacent RoPE pairs. */
Test(zoo_cpu, llama_3_1_8b_features_tiny, .timeout = 120)
{
    ZooModel z = {MODELS "/llama-3.1-8b.yaml",
                  {"dim=128", "hidden_dim=448", "n_layers=2", "n_heads=4", "n_kv_heads=4", "vocab_size=512", "bos=1",
                   "eos=2", "max_seq=64", "rope.pairing=adjacent"}};
    zoo_cpu(&z, 64);
}

/* ---- the big shapes: opt-in ---- */

/* Runs a big model when MEGAC_ZOO_BIG=1 and its f32 weights fit in memory
 * (one f32 copy at a time, plus a quarter for the rest). */
static void zoo_big(const char *yaml, int nsteps)
{
    ZooModel z = {yaml, {"max_seq=64"}};
    Arena a = {0};
    ModelDesc m;
    zoo_desc(&z, &m, &a);
    double need = 1.25 * desc_f32_bytes(&m);
    double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    arena_free(&a);
    if (need > have)
        cr_skip("%s: its weights as f32 take %.1f GB and this machine has %.1f GB of memory (the reference "
                "engine it is checked against holds every weight in f32)",
                yaml, desc_f32_bytes(&m) / 1e9, have / 1e9);
    if (!big_enabled())
        cr_skip("%s: %.1f GB of f32 weights, a bundle written per worker count (about 1 min for 2 GB); "
                "set MEGAC_ZOO_BIG=1 to run it",
                yaml, desc_f32_bytes(&m) / 1e9);
    zoo_cpu(&z, nsteps);
}

Test(zoo_cpu, llama_3_2_1b, .timeout = 3600) { zoo_big(MODELS "/llama-3.2-1b.yaml", 3); }
Test(zoo_cpu, qwen2_5_0_5b, .timeout = 3600) { zoo_big(MODELS "/qwen2.5-0.5b.yaml", 3); }
Test(zoo_cpu, llama_3_1_8b, .timeout = 3600) { zoo_big(MODELS "/llama-3.1-8b.yaml", 2); }

/* ---- host-cuda: the generated CUDA C on host threads (fibers; slow) ---- */

static void zoo_host_cuda(const ZooModel *z, int nsteps) { zoo_run(z, "host-cuda", cuda_blocks, 4, nsteps); }

Test(zoo_host_cuda, default_model, .timeout = 300)
{
    ZooModel z = {"default", {NULL}};
    zoo_host_cuda(&z, 64);
}

Test(zoo_host_cuda, stories260k, .timeout = 300)
{
    if (!file_exists(SHARED "/models/stories260K.bin"))
        cr_skip("../shared/models/stories260K.bin is absent");
    ZooModel z = {MODELS "/stories260k.yaml", {NULL}};
    zoo_host_cuda(&z, 64);
}

Test(zoo_host_cuda, qwen2_5_0_5b_features_tiny, .timeout = 300)
{
    ZooModel z = {MODELS "/qwen2.5-0.5b.yaml",
                  {"dim=96", "hidden_dim=320", "n_layers=3", "head_dim=24", "vocab_size=600", "max_seq=64"}};
    zoo_host_cuda(&z, 64);
}
