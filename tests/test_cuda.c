/*
 * test_cuda.c - the CUDA backend without a GPU, and with one when present.
 *
 *   nvrtc      lowered models compile through NVRTC to cubins with no local
 *              memory (stack frame or spills), resources read back, the
 *              exported constants present in the cubin: every model in
 *              models/ for sm_80, sm_90 and sm_120; ptxas log parsing.
 *   host-cuda  the same generated CUDA C run on the host (host_shim.h):
 *              `megac compile --target host-cuda` at 1, 2, 3 and 5 blocks,
 *              greedy decode next to the reference engine (ref_step):
 *              logits within atol + rtol * max|logit|, identical argmax;
 *              `megac run` of stories260K prints llama2.c's text exactly.
 *   watchdog   a schedule whose wait can never be satisfied returns
 *              MEGAC_ERR_KERNEL naming the worker, pc and counter.
 *   gpu        with a CUDA driver and a GPU: the sm_XX bundle of the same
 *              models against the reference; skipped (with the reason)
 *              otherwise.
 * ../shared is optional: tests that need it skip themselves.
 */
#include "codegen/codegen.h"
#include "codegen/cuda/cuda.h"
#include "runtime/cuda_driver.h"
#include "runtime/kernel_abi.h"
#include "runtime/megac.h"
#include "compiler/compile.h"
#include "compiler/model.h"

#include "tests/harness.h"

#include "tests/tmpdir.h"
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The source root and megac are the build's (MEGAC_SRC, MEGAC_BIN) unless
 * MEGAC_TEST_SRC / MEGAC_TEST_BIN name others: scripts/gpu-check.sh runs a
 * test_cuda built on another machine against the checkout it was sent. */
static const char *test_src(void)
{
    const char *e = getenv("MEGAC_TEST_SRC");
    return e && *e ? e : MEGAC_SRC;
}

static const char *test_bin(void)
{
    const char *e = getenv("MEGAC_TEST_BIN");
    return e && *e ? e : MEGAC_BIN;
}

/* test_src() + rel, in one of a few rotating buffers (a test uses at most
 * two at once). */
static const char *src_path(const char *rel)
{
    static char buf[4][4096];
    static unsigned next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s%s", test_src(), rel);
    return p;
}

#define SHARED_PATH(rel) src_path("/../shared" rel)
#define STORIES_YAML src_path("/models/stories260k.yaml")
#define GOLDEN SHARED_PATH("/golden/stories260K_once_upon_a_time_n200.txt")

#define ATOL 1e-4
#define RTOL 1e-5

/* GQA (3 q heads per kv head), untied, bias-free, half-pair RoPE. */
static const char synth_yaml[] = "name: synth-cuda\n"
                                 "arch:\n"
                                 "  dim: 96\n"
                                 "  hidden_dim: 200\n"
                                 "  n_layers: 2\n"
                                 "  n_heads: 6\n"
                                 "  n_kv_heads: 2\n"
                                 "  vocab_size: 300\n"
                                 "  max_seq: 128\n"
                                 "norm_eps: 1e-5\n"
                                 "tie_embeddings: false\n"
                                 "rope: {theta: 10000, pairing: half}\n"
                                 "weights: {format: synthetic, seed: 11}\n"
                                 "tokenizer: {format: bytes}\n";

static bool file_exists(const char *p) { return access(p, R_OK) == 0; }

static char *tmp_dir(void)
{
    return test_tmp_dir("cuda");
}

static char *write_synth(const char *dir)
{
    char *path = malloc(1200);
    snprintf(path, 1200, "%s/synth.yaml", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(synth_yaml, f);
    cr_assert_eq(fclose(f), 0);
    return path;
}

/* Runs a shell command; its output (both streams) into out. */
static int sh(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    return pclose(p);
}

/* megac compile MODEL --target T --workers W -o DIR/T.wW.megac (W = 0:
 * the description's or the target's worker count) */
static char *compile_bundle(const char *model, const char *target, int workers, const char *dir)
{
    char *out = malloc(1200), cmd[4096];
    static char log[1 << 16];
    snprintf(out, 1200, "%s/%s.w%d.megac", dir, target, workers);
    char wopt[32] = "";
    if (workers)
        snprintf(wopt, sizeof wopt, "--workers %d", workers);
    snprintf(cmd, sizeof cmd, "%s compile '%s' --target %s %s -q -o '%s' 2>&1", test_bin(), model, target, wopt, out);
    cr_assert_eq(sh(cmd, log, sizeof log), 0, "%s failed:\n%s", cmd, log);
    return out;
}

/* ---- lowering in this process ---- */

typedef struct {
    Arena arena;
    ModelDesc m;
    Weights w;
    bool have_w;
    RefState *ref;
} Model;

static void model_open(Model *r, const char *path, bool weights)
{
    memset(r, 0, sizeof *r);
    Diag d;
    diag_init(&d);
    cr_assert(desc_load(&r->m, &r->arena, path, NULL, 0, &d), "cannot load %s", path);
    if (weights) {
        cr_assert(weights_load(&r->w, &r->m, &d), "cannot load the weights of %s", path);
        r->have_w = true;
        r->ref = ref_new(&r->w);
    }
}

static void model_close(Model *r)
{
    if (r->ref)
        ref_free(r->ref);
    if (r->have_w)
        weights_free(&r->w);
    arena_free(&r->arena);
}

static Schedule *model_lower(Model *r, const char *target, int workers)
{
    Diag d;
    diag_init(&d);
    const Target *t = target_lookup(target, &d);
    cr_assert(t);
    Schedule *s = lower_model(&r->m, t, workers ? workers : r->m.workers, &d);
    cr_assert(s, "lowering %s for %s failed", r->m.name, target);
    sched_layout(s);
    return s;
}

/* ---- nvrtc ---- */

static void cubin_compile(const char *yaml, const char *arch)
{
    Model r;
    model_open(&r, yaml, false);
    Schedule *s = model_lower(&r, arch, 0);
    char *dir = tmp_dir(), path[1200];
    snprintf(path, sizeof path, "%s/kernel.%s.cubin", dir, arch);
    Diag d;
    diag_init(&d);
    CudaKernelInfo info;
    memset(&info, 0, sizeof info);
    cr_assert(cg_cuda_compile(s, arch, path, &info, &d), "%s for %s: cg_cuda_compile failed", yaml, arch);
    cr_assert_eq(info.threads_per_block, CUDA_THREADS_GPU);
    cr_assert(info.regs_per_thread > 0 && info.regs_per_thread <= 65536 / CUDA_THREADS_GPU, "%d registers",
              info.regs_per_thread);
    cr_assert(info.smem_per_block > 0 && info.smem_per_block <= 48 * 1024, "%d bytes smem", info.smem_per_block);
    cr_assert_eq(info.local_bytes, 0, "%s for %s spills: %d bytes of local memory", yaml, arch, info.local_bytes);
    size_t n = 0;
    char *cubin = read_file(path, &n);
    cr_assert(cubin && n > 4 && memcmp(cubin, "\177ELF", 4) == 0, "%s is not an ELF cubin", path);
    static const char *const syms[] = {"megac_kernel", "megac_kernel_abi", "megac_schedule_hash", "megac_num_workers"};
    for (int i = 0; i < 4; i++)
        cr_assert(memmem(cubin, n, syms[i], strlen(syms[i]) + 1), "%s: no symbol %s", path, syms[i]);
    cr_log_info("%s %s: %u workers, %d regs, %d B smem", r.m.name, arch, s->nworkers, info.regs_per_thread,
                info.smem_per_block);
    free(cubin);
    sched_free(s);
    test_rm_rf(dir);
    model_close(&r);
}

/* Every description in models/ compiles for every architecture. */
Test(cuda_nvrtc, every_model_every_arch, .timeout = 900)
{
    static const char *const archs[] = {"sm_80", "sm_90", "sm_120"};
    glob_t g;
    cr_assert_eq(glob(src_path("/models/*.yaml"), 0, NULL, &g), 0, "no models/*.yaml");
    for (size_t m = 0; m < g.gl_pathc; m++) {
        const char *path = g.gl_pathv[m];
        if (strstr(path, "-hf.yaml") && !file_exists(SHARED_PATH("/hf-configs/SmolLM2-135M.config.json"))) {
            cr_log_warn("%s skipped: ../shared/hf-configs is absent", path);
            continue;
        }
        for (int a = 0; a < 3; a++)
            cubin_compile(path, archs[a]);
    }
    globfree(&g);
}

Test(cuda_nvrtc, ptxas_log_parse)
{
    const char *log = "ptxas info    : 0 bytes gmem\n"
                      "ptxas info    : Compiling entry function 'other' for 'sm_90'\n"
                      "ptxas info    : Function properties for other\n"
                      "    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                      "ptxas info    : Used 12 registers, used 0 barriers, 0 bytes smem\n"
                      "ptxas info    : Compiling entry function 'megac_kernel' for 'sm_90'\n"
                      "ptxas info    : Function properties for megac_kernel\n"
                      "    0 bytes stack frame, 16 bytes spill stores, 16 bytes spill loads\n"
                      "ptxas info    : Used 96 registers, used 1 barriers, 33100 bytes smem, 400 bytes cmem[0]\n";
    CudaKernelInfo k;
    memset(&k, 0, sizeof k);
    cr_assert(cuda_ptxas_info_parse(log, &k));
    cr_assert_eq(k.regs_per_thread, 96);
    cr_assert_eq(k.smem_per_block, 33100);
    cr_assert_eq(k.local_bytes, 16);
    cr_assert_not(cuda_ptxas_info_parse("ptxas info    : Used 12 registers\n", &k));
}

Test(cuda_nvrtc, unknown_arch_is_an_error)
{
    Model r;
    model_open(&r, src_path("/models/default.yaml"), false);
    Schedule *s = model_lower(&r, "sm_90", 4);
    Diag d;
    diag_init(&d);
    d.out = fopen("/dev/null", "w");
    cr_assert_not(cg_cuda_compile(s, "sm_75", "/tmp/never.cubin", NULL, &d));
    cr_assert_eq(d.nerrors, 1);
    fclose(d.out);
    sched_free(s);
    model_close(&r);
}

Test(cuda_nvrtc, failure_prints_the_program_log)
{
    char path[] = "/tmp/megac-cuda-log-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *err = fdopen(fd, "w+");
    Diag d;
    diag_init(&d);
    d.out = err;
    const char *src = "extern \"C\" __global__ void megac_kernel(int a) { undeclared_thing(a); }\n";
    cr_assert_not(cuda_nvrtc_compile(src, "sm_90", 512, "/tmp/never.cubin", NULL, &d));
    cr_assert_eq(d.nerrors, 1);
    fflush(err);
    rewind(err);
    static char text[1 << 14];
    size_t n = fread(text, 1, sizeof text - 1, err);
    text[n] = 0;
    cr_assert(strstr(text, "nvrtcCompileProgram (--gpu-architecture=sm_90) failed") && strstr(text, "program log") &&
                  strstr(text, "undeclared_thing"),
              "%s", text);
    fclose(err);
    unlink(path);
}

/* A weight dtype the kernel body has no GEMV for: an error at the
 * instruction, no NVRTC run. */
Test(cuda_nvrtc, unsupported_dtype_is_an_error)
{
    Schedule *s = sched_new("bf16", "sm_90", 1);
    s->shape = (ModelShape){.dim = 64, .hidden_dim = 64, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                            .head_dim = 8, .vocab_size = 16, .max_seq = 16, .norm_eps = 1e-5};
    int64_t wn[2] = {4, 64}, kn = 64, rn = 4;
    uint32_t w = sched_add_buffer(s, "w", DT_W8A8, BUF_WEIGHT, 2, wn); /* int8 inputs: CPU only */
    uint32_t x = sched_add_buffer(s, "x", DT_F32, BUF_STATE, 1, &kn), y = sched_add_buffer(s, "y", DT_F32, BUF_STATE, 1, &rn);
    int32_t p[OP_MAX_PARAMS] = {0, 4, 64, 0};
    Access acc[5] = {{w, ACC_R, affine_const(0), affine_const(256)},
                     {x, ACC_R, affine_const(0), affine_const(64)},
                     {y, ACC_W, affine_const(0), affine_const(4)},
                     {BUF_NONE, ACC_R, affine_const(0), affine_const(0)},
                     {BUF_NONE, ACC_R, affine_const(0), affine_const(0)}};
    sched_op(s, 0, OP_GEMV, p, acc);
    sched_layout(s);
    Diag d;
    diag_init(&d);
    d.out = fopen("/dev/null", "w");
    cr_assert_not(cg_cuda_compile(s, "sm_90", "/tmp/never.cubin", NULL, &d));
    cr_assert_not(cg_hostcuda_compile(s, "/tmp/never.so", &d));
    cr_assert_eq(d.nerrors, 2);
    fclose(d.out);
    sched_free(s);
}

/* ---- host-cuda: GEMV paths, op by op ---- */

typedef void (*WorkerFn)(const MegacArgs *, uint32_t);

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

typedef struct {
    int r0, r1, rows, k, flags;
    uint32_t w, x, y, nw, b;
} GemvCase;

/* Every GEMV path of kernel_body.cuh on one host block, for f32 and bf16
 * weights: rows split over warps (1 and 2 rows), a row length that is not
 * a multiple of the vector width, warp per row, and an input too long for
 * the shared scratch (read from the arena), each against a double sum. */
Test(cuda_host, gemv_paths_match_double)
{
    static const int spec[][6] = {
        {0, 1, 3, 64, GEMV_NORM | GEMV_BIAS, DT_F32}, {3, 5, 6, 68, GEMV_ACCUM, DT_F32},
        {0, 7, 7, 66, GEMV_BIAS, DT_F32},           {0, 50, 50, 64, GEMV_NORM | GEMV_ACCUM, DT_F32},
        {1, 4, 4, 8200, 0, DT_F32},                 {0, 2, 2, 64, GEMV_ACCUM, DT_BF16},
        {0, 9, 9, 128, GEMV_NORM, DT_BF16},         {0, 3, 3, 60, GEMV_BIAS, DT_BF16},
    };
    enum { N = 8 };
    Schedule *s = sched_new("gemv", "host-cuda", 1);
    s->shape = (ModelShape){.dim = 64, .hidden_dim = 64, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                            .head_dim = 8, .vocab_size = 16, .max_seq = 16, .norm_eps = 1e-5};
    GemvCase c[N];
    for (int i = 0; i < N; i++) {
        char name[32];
        GemvCase *g = &c[i];
        g->r0 = spec[i][0], g->r1 = spec[i][1], g->rows = spec[i][2], g->k = spec[i][3], g->flags = spec[i][4];
        int64_t wn[2] = {g->rows, g->k}, kn = g->k, rn = g->rows;
        snprintf(name, sizeof name, "w%d", i);
        g->w = sched_add_buffer(s, name, (DType)spec[i][5], BUF_WEIGHT, 2, wn);
        snprintf(name, sizeof name, "nw%d", i);
        g->nw = sched_add_buffer(s, name, DT_F32, BUF_WEIGHT, 1, &kn);
        snprintf(name, sizeof name, "b%d", i);
        g->b = sched_add_buffer(s, name, DT_F32, BUF_WEIGHT, 1, &rn);
        snprintf(name, sizeof name, "x%d", i);
        g->x = sched_add_buffer(s, name, DT_F32, BUF_STATE, 1, &kn);
        snprintf(name, sizeof name, "y%d", i);
        g->y = sched_add_buffer(s, name, DT_F32, BUF_STATE, 1, &rn);
        int32_t p[OP_MAX_PARAMS] = {g->r0, g->r1, g->k, g->flags};
        Access acc[5] = {
            {g->w, ACC_R, affine_const((int64_t)g->r0 * g->k), affine_const((int64_t)g->r1 * g->k)},
            {g->x, ACC_R, affine_const(0), affine_const(g->k)},
            {g->y, (uint8_t)(g->flags & GEMV_ACCUM ? ACC_RW : ACC_W), affine_const(g->r0), affine_const(g->r1)},
            {g->flags & GEMV_NORM ? g->nw : BUF_NONE, ACC_R, affine_const(0), affine_const(g->k)},
            {g->flags & GEMV_BIAS ? g->b : BUF_NONE, ACC_R, affine_const(g->r0), affine_const(g->r1)},
        };
        if (!(g->flags & GEMV_NORM))
            acc[3].hi = affine_const(0);
        if (!(g->flags & GEMV_BIAS))
            acc[4].lo = acc[4].hi = affine_const(0);
        sched_op(s, 0, OP_GEMV, p, acc);
    }
    sched_layout(s);
    char *dir = tmp_dir(), so[1200];
    snprintf(so, sizeof so, "%s/kernel.so", dir);
    Diag d;
    diag_init(&d);
    cr_assert(cg_hostcuda_compile(s, so, &d));
    void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert(dl, "%s", dlerror());
    WorkerFn fn = (WorkerFn)(uintptr_t)dlsym(dl, "megac_worker");
    cr_assert(fn);
    char *weights = aligned_alloc(64, (s->weights_bytes + 63) / 64 * 64);
    char *arena = aligned_alloc(64, (s->arena_bytes + 63) / 64 * 64);
    cr_assert(weights && arena);
    for (uint32_t b = 0; b < s->nbufs; b++) {
        char *p = (s->bufs[b].cls == BUF_WEIGHT ? weights : arena) + s->bufs[b].offset;
        for (int64_t i = 0; i < s->bufs[b].nelem; i++) {
            if (s->bufs[b].dtype == DT_BF16)
                ((uint16_t *)p)[i] = f32_to_bf16(rnd());
            else
                ((float *)p)[i] = rnd();
        }
    }
    /* the expected results, from the inputs before the step */
    double *want[N];
    for (int i = 0; i < N; i++) {
        GemvCase *g = &c[i];
        const char *W = weights + s->bufs[g->w].offset;
        const float *x = (const float *)(arena + s->bufs[g->x].offset);
        bool bf = s->bufs[g->w].dtype == DT_BF16;
        const float *nw = (const float *)(weights + s->bufs[g->nw].offset), *b = (const float *)(weights + s->bufs[g->b].offset);
        const float *y = (const float *)(arena + s->bufs[g->y].offset);
        double ss = 0;
        for (int j = 0; j < g->k; j++)
            ss += (double)x[j] * x[j];
        double sc = 1.0 / sqrt(ss / g->k + 1e-5);
        want[i] = malloc(sizeof(double) * (size_t)g->rows);
        for (int r = 0; r < g->rows; r++) {
            want[i][r] = y[r];
            if (r < g->r0 || r >= g->r1)
                continue;
            double acc = 0;
            for (int j = 0; j < g->k; j++)
            {
                int64_t e = (int64_t)r * g->k + j;
                double wv = bf ? bf16_to_f32(((const uint16_t *)W)[e]) : ((const float *)W)[e];
                acc += wv * ((g->flags & GEMV_NORM) ? x[j] * sc * nw[j] : x[j]);
            }
            if (g->flags & GEMV_BIAS)
                acc += b[r];
            want[i][r] = (g->flags & GEMV_ACCUM) ? want[i][r] + acc : acc;
        }
    }
    uint32_t ctr[1] = {0};
    MegacAbort ab;
    memset(&ab, 0, sizeof ab);
    MegacArgs args = {weights, arena, ctr, &ab, 0, 0};
    fn(&args, 0);
    cr_assert_eq(ab.flag, 0);
    for (int i = 0; i < N; i++) {
        const float *y = (const float *)(arena + s->bufs[c[i].y].offset);
        for (int r = 0; r < c[i].rows; r++)
            cr_assert(fabs(y[r] - want[i][r]) <= 1e-4 * (1 + sqrt((double)c[i].k)),
                      "case %d (rows [%d, %d) of %d, k %d, flags %d): y[%d] = %.7g, want %.7g", i, c[i].r0, c[i].r1,
                      c[i].rows, c[i].k, c[i].flags, r, y[r], want[i][r]);
        free(want[i]);
    }
    dlclose(dl);
    free(weights);
    free(arena);
    sched_free(s);
    test_rm_rf(dir);
}

/* ---- host-cuda ---- */


/* The model's bundle for `target` at each worker count vs the reference. */
static void bundles_vs_reference(const char *yaml, const char *target, const int *workers, int nw, int ntok)
{
    Model r;
    model_open(&r, yaml, true);
    char *dir = tmp_dir();
    for (int i = 0; i < nw; i++) {
        char *b = compile_bundle(yaml, target, workers[i], dir);
        megac_model *mm;
        cr_assert_eq(megac_open(b, &mm), MEGAC_OK, "%s", megac_last_open_error());
        cr_assert(!workers[i] || megac_num_workers(mm) == workers[i]);
        char what[256];
        snprintf(what, sizeof what, "%s on %s, %d blocks", r.m.name, target, workers[i]);
        int n = ntok < megac_max_seq(mm) ? ntok : megac_max_seq(mm);
        harness_compare_greedy(mm, r.ref, r.m.vocab_size, n, ATOL, RTOL, what);
        megac_close(mm);
        free(b);
    }
    test_rm_rf(dir);
    model_close(&r);
}

static const int host_blocks[] = {1, 2, 3, 5};

Test(cuda_host, stories260K_matches_reference, .timeout = 300)
{
    if (!file_exists(SHARED_PATH("/models/stories260K.bin")))
        cr_skip("../shared/models/stories260K.bin is absent");
    bundles_vs_reference(STORIES_YAML, "host-cuda", host_blocks, 4, 32);
}

Test(cuda_host, synthetic_model_matches_reference, .timeout = 300)
{
    char *dir = tmp_dir(), *yaml = write_synth(dir);
    bundles_vs_reference(yaml, "host-cuda", host_blocks, 4, 32);
    free(yaml);
    test_rm_rf(dir);
}

Test(cuda_host, default_model_matches_reference, .timeout = 300)
{
    static const int w[] = {3};
    bundles_vs_reference(src_path("/models/default.yaml"), "host-cuda", w, 1, 64);
}

Test(cuda_host, stories260K_run_gives_llama2c_text, .timeout = 300)
{
    if (!file_exists(SHARED_PATH("/models/stories260K.bin")) || !file_exists(GOLDEN))
        cr_skip("../shared/models/stories260K.bin or the golden text is absent");
    char *dir = tmp_dir(), *b = compile_bundle(STORIES_YAML, "host-cuda", 4, dir), cmd[4096];
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd, "%s run '%s' --engine host-cuda --prompt 'Once upon a time' -n 200 --temp 0 2>/dev/null",
             test_bin(), b);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    size_t n = 0;
    char *want = read_file(GOLDEN, &n);
    cr_assert(want);
    cr_assert_str_eq(out, want);
    free(want);
    free(b);
    test_rm_rf(dir);
}

/* ---- watchdog ---- */

/* Rewrites the manifest's schedule_hash line. */
static void manifest_set_hash(const char *bundle, uint64_t hash)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/manifest.yaml", bundle);
    size_t n = 0;
    char *text = read_file(path, &n);
    cr_assert(text);
    char *h = strstr(text, "schedule_hash: ");
    cr_assert(h);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
    memcpy(h + strlen("schedule_hash: "), hex, 16);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    cr_assert_eq(fwrite(text, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
    free(text);
}

/* Rewrites the manifest's kernel_bytes and kernel_hash lines for the
 * kernel file now at kernel_path (rebuilt by the test). */
static void manifest_set_kernel(const char *bundle, const char *kernel_path)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/manifest.yaml", bundle);
    size_t n = 0, klen = 0;
    char *text = read_file(path, &n), *k = read_file(kernel_path, &klen);
    cr_assert(text && k);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "kernel_bytes:", 13) == 0)
            fprintf(f, "kernel_bytes: %zu\n", klen);
        else if (strncmp(line, "kernel_hash:", 12) == 0)
            fprintf(f, "kernel_hash: %016llx\n", (unsigned long long)hash_fnv1a(k, klen, HASH_FNV_INIT));
        else
            fprintf(f, "%s\n", line);
    }
    cr_assert_eq(fclose(f), 0);
    free(text);
    free(k);
}

/* A bundle for `target` (host-cuda or a GPU architecture) whose worker 1
 * ends with `wait c0 >= 1000000`, which nothing satisfies (the validator
 * would refuse it, so the kernel is built here): the step fails with
 * MEGAC_ERR_KERNEL naming worker 1, the wait's pc and counter 0, and the
 * model stays usable. */
static void watchdog_check(const char *target)
{
    char *dir = tmp_dir(), *b = compile_bundle(src_path("/models/default.yaml"), target, 2, dir);
    char path[1400];
    snprintf(path, sizeof path, "%s/schedule.sched", b);
    Diag d;
    diag_init(&d);
    Schedule *s = sched_load(path, &d);
    cr_assert(s);
    sched_layout(s);
    uint32_t pc = s->workers[1].ninst;
    sched_wait(s, 1, 0, 1000000);
    char *text = sched_to_string(s);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    free(text);
    manifest_set_hash(b, sched_hash(s));
    if (!strcmp(target, "host-cuda")) {
        snprintf(path, sizeof path, "%s/kernel.so", b);
        cr_assert(cg_hostcuda_compile(s, path, &d));
    } else {
        snprintf(path, sizeof path, "%s/kernel.%s.cubin", b, target);
        CudaKernelInfo info;
        memset(&info, 0, sizeof info);
        cr_assert(cg_cuda_compile(s, target, path, &info, &d));
    }
    manifest_set_kernel(b, path);
    /* Long enough that a healthy wait never trips it on a loaded, sanitized
     * 2-core CI machine (100 ms did once: worker 0 gave up on a legitimate
     * wait while worker 1 was descheduled); the stuck wait costs this much. */
    setenv("MEGAC_WATCHDOG_MS", "1500", 1);
    megac_model *m;
    megac_status st = megac_open(b, &m);
    unsetenv("MEGAC_WATCHDOG_MS");
    cr_assert_eq(st, MEGAC_OK, "%s", megac_last_open_error());
    cr_assert_eq(megac_step(m, 5), MEGAC_ERR_KERNEL);
    char want[128];
    snprintf(want, sizeof want, "worker 1, pc %u waited on counter 0", pc);
    cr_assert(strstr(megac_error(m), want) && strstr(megac_error(m), "threshold 1000000"), "%s", megac_error(m));
    cr_assert_eq(megac_position(m), 0, "a failed step must not advance");
    megac_close(m);
    sched_free(s);
    free(b);
    test_rm_rf(dir);
}

Test(cuda_host, watchdog_names_the_stuck_wait, .timeout = 120)
{
    watchdog_check("host-cuda");
}

/* The synthetic model with its matrices stored as bf16, f16, w8a16 and
 * w4a16 (g32, and g128 whose k = 96 is one short group) for `target`: the
 * fused dequantizing GEMVs against the reference engine on the same
 * (dequantized) weights. */
static void stored_formats_check(const char *target, const int *workers, int nw)
{
    static const char *const fmts[] = {"bf16", "f16", "w8a16", "w4a16-g32", "w4a16-g128"};
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        char *dir = tmp_dir(), *yaml = write_synth(dir);
        FILE *f = fopen(yaml, "a");
        cr_assert(f);
        fprintf(f, "compile:\n  quant: {default: %s}\n", fmts[i]);
        cr_assert_eq(fclose(f), 0);
        cr_log_info("%s, stored as %s", target, fmts[i]);
        bundles_vs_reference(yaml, target, workers, nw, 48);
        free(yaml);
        test_rm_rf(dir);
    }
}

Test(cuda_host, stored_formats_match_reference, .timeout = 300)
{
    static const int w[] = {2};
    stored_formats_check("host-cuda", w, 1);
}

/* ---- on a GPU ---- */

/* Skips the test unless a CUDA driver and a device are present. */
static void gpu_require(void)
{
    CudaDriver drv;
    char err[512];
    if (!cuda_driver_load(&drv, err, sizeof err))
        cr_skip("no GPU: %s", err);
    int n = 0;
    drv.cuDeviceGetCount(&n);
    cuda_driver_unload(&drv);
    if (n < 1)
        cr_skip("no GPU: the CUDA driver sees no device");
}

/* The compute capability of device 0 as a target name (sm_80, sm_90, sm_120). */
static const char *gpu_target(void)
{
    CudaDriver drv;
    char err[512];
    cr_assert(cuda_driver_load(&drv, err, sizeof err), "%s", err);
    CUdevice dev;
    int major = 0;
    cr_assert_eq(drv.cuDeviceGet(&dev, 0), 0);
    cr_assert_eq(drv.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), 0);
    cuda_driver_unload(&drv);
    if (major == 8)
        return "sm_80";
    if (major == 9)
        return "sm_90";
    if (major == 12)
        return "sm_120";
    cr_skip("no megac target for a compute capability %d.x GPU", major);
    return NULL;
}

Test(cuda_gpu, stories260K_matches_reference, .timeout = 300)
{
    gpu_require();
    if (!file_exists(SHARED_PATH("/models/stories260K.bin")))
        cr_skip("../shared/models/stories260K.bin is absent");
    static const int w[] = {1, 3, 16, 0};
    bundles_vs_reference(STORIES_YAML, gpu_target(), w, 4, 200);
}

Test(cuda_gpu, synthetic_model_matches_reference, .timeout = 300)
{
    gpu_require();
    static const int w[] = {2, 7, 0};
    char *dir = tmp_dir(), *yaml = write_synth(dir);
    bundles_vs_reference(yaml, gpu_target(), w, 3, 100);
    free(yaml);
    test_rm_rf(dir);
}

Test(cuda_gpu, stories260K_run_gives_llama2c_text, .timeout = 300)
{
    gpu_require();
    if (!file_exists(SHARED_PATH("/models/stories260K.bin")) || !file_exists(GOLDEN))
        cr_skip("../shared/models/stories260K.bin or the golden text is absent");
    char *dir = tmp_dir(), *b = compile_bundle(STORIES_YAML, gpu_target(), 0, dir), cmd[4096];
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd, "%s run '%s' --engine cuda --prompt 'Once upon a time' -n 200 --temp 0 2>/dev/null",
             test_bin(), b);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    size_t n = 0;
    char *want = read_file(GOLDEN, &n);
    cr_assert(want);
    cr_assert_str_eq(out, want);
    free(want);
    free(b);
    test_rm_rf(dir);
}

/* The stuck wait on the device: the kernel returns within the deadline and
 * the error names the wait. */
Test(cuda_gpu, watchdog_names_the_stuck_wait, .timeout = 120)
{
    gpu_require();
    watchdog_check(gpu_target());
}

Test(cuda_gpu, stored_formats_match_reference, .timeout = 300)
{
    gpu_require();
    static const int w[] = {3, 0};
    stored_formats_check(gpu_target(), w, 2);
}

Test(cuda_runtime, without_a_driver_the_error_is_clear)
{
    CudaDriver drv;
    char err[512];
    if (cuda_driver_load(&drv, err, sizeof err)) {
        cuda_driver_unload(&drv);
        cr_skip("a CUDA driver is present");
    }
    char *dir = tmp_dir(), *b = compile_bundle(src_path("/models/default.yaml"), "sm_90", 4, dir);
    megac_model *m;
    cr_assert_eq(megac_open(b, &m), MEGAC_ERR_DEVICE);
    cr_assert(strstr(megac_last_open_error(), "no CUDA driver"), "%s", megac_last_open_error());
    free(b);
    test_rm_rf(dir);
}
