/*
 * test_cuda.c - the CUDA backend without a GPU, and with one when present.
 *
 *   nvrtc      lowered models compile through NVRTC to cubins with no local
 *              memory (stack frame or spills), resources read back, the
 *              exported constants present in the cubin: every model in
 *              models/ for sm_80, sm_90 and sm_120 (under
 *              MEGAC_SANITIZED=1, one of them per model, in turn); ptxas
 *              log parsing.
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
#include "compiler/quant.h"

#include "tests/harness.h"
#include "tests/scores.h"

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

/* The synthetic model, with `compile` (NULL: none) as its compile
 * section, written as DIR/NAME.yaml. */
static char *write_synth_as(const char *dir, const char *name, const char *compile)
{
    char *path = malloc(1200);
    snprintf(path, 1200, "%s/%s.yaml", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(synth_yaml, f);
    if (compile)
        fprintf(f, "compile:\n%s", compile);
    cr_assert_eq(fclose(f), 0);
    return path;
}

static char *write_synth(const char *dir)
{
    return write_synth_as(dir, "synth", NULL);
}

/* Sparse attention and eviction on the synthetic model's two layers:
 * every selector and policy at budgets the 100 compared steps overflow
 * (SnapKV's prompt: positions 0..40). */
static const char *const synth_sparse[] = {
    "  attention: [{layers: 0, kind: quest, page: 8, budget: 24}]\n"
    "  kv_policy: [{layers: 1, policy: h2o, budget: 20, window: 6}]\n",
    "  attention: [{layers: 0, kind: sink_window, sinks: 4, window: 16}]\n"
    "  kv_policy: [{layers: 1, policy: tova, budget: 24}]\n",
    "  kv_policy: [{layers: all, policy: streaming, sinks: 4, window: 20}]\n",
    "  kv_policy: [{layers: all, policy: snapkv, budget: 20, window: 6}]\n",
    /* f16 and bf16 caches (compile.kv_dtype): this model's logits stay
     * within the f32 cache's tolerance of the reference, which rounds alike */
    "  kv_dtype: f16\n",
    "  kv_dtype: f16\n"
    "  attention: [{layers: 0, kind: quest, page: 8, budget: 24}]\n"
    "  kv_policy: [{layers: 1, policy: tova, budget: 24}]\n",
    "  kv_dtype: bf16\n"
    "  kv_policy: [{layers: all, policy: snapkv, budget: 20, window: 6}]\n",
    /* Kascade: layer 0 picks 12 rows a kv head (20% of the rows past 60),
     * which layer 1's kv heads both read from kv head 1; then both layers
     * anchors, layer 1 attending over its own rows */
    "  attention: [{layers: 0, kind: kascade, budget: 12, fraction: 0.2}, {layers: 1, kind: kascade_reuse, "
    "anchor: 0, heads: [1, 1]}]\n",
    "  kv_dtype: f16\n"
    "  attention: [{layers: 0-1, kind: kascade, budget: 10}]\n",
    /* Ada-KV: SnapKV's budget pooled over the kv heads */
    "  kv_policy: [{layers: all, policy: snapkv, budget: 20, window: 6, adaptive: 0.2}]\n",
};
static const int synth_sparse_prompt_end[] = {-1, -1, -1, 40, -1, -1, 40, -1, -1, 40};
_Static_assert(sizeof synth_sparse / sizeof synth_sparse[0] ==
                   sizeof synth_sparse_prompt_end / sizeof synth_sparse_prompt_end[0],
               "a prompt end for every setting");

/* synth_sparse[first, first + n) on `target` at the given block counts. */
static void sparse_synth_check(const char *target, const int *blocks, int nb, size_t first, size_t n);
/* The synthetic model with a weight pipe (MK_WPIPE) on `target`. */
static void weight_pipe_check(const char *target, const char *defines, const int *workers, int nw);

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

/* ---- hand-built schedules ---- */

/* Appends op `op` with params p on buffers b (BUF_NONE: absent) to worker
 * 0; its accesses are the op's footprint (ir/ops.c), so params outside the
 * contract fail here. */
static void test_op(Schedule *s, int op, const int32_t *p, const uint32_t *b)
{
    const OpInfo *oi = op_info(op);
    Access acc[OP_MAX_OPERANDS], fp[OP_MAX_OPERANDS];
    int32_t pp[OP_MAX_PARAMS] = {0};
    memcpy(pp, p, sizeof(int32_t) * (size_t)oi->nparams);
    for (int i = 0; i < oi->noperands; i++)
        acc[i] = (Access){b[i], ACC_R, affine_const(0), affine_const(0)};
    sched_op(s, 0, op, pp, acc);
    const Inst *in = &s->workers[0].insts[s->workers[0].ninst - 1];
    const char *why = NULL;
    cr_assert(op_footprint(s, in, fp, &why), "%s: %s", oi->name, why ? why : "");
    for (int i = 0; i < oi->noperands; i++)
        s->accs[in->acc + (uint32_t)i] = fp[i];
}

static uint32_t test_buf(Schedule *s, const char *name, DType t, BufClass c, int64_t n0, int64_t n1, int64_t n2)
{
    int64_t shape[3] = {n0, n1, n2};
    return sched_add_buffer(s, name, t, c, n2 ? 3 : n1 ? 2 : 1, shape);
}

/* One layer of every new op (KV_STORE, ATTN_SPARSE of each kind,
 * QUEST_SELECT, KV_EVICT of each policy, KV_SNAP) next to ATTN and
 * ATTN_COMBINE, for a shape; cap is the evicting layers' budget (and
 * SnapKV's), page and np Quest's. */
static Schedule *test_sparse_schedule(const char *target, ModelShape sh, int cap, int page, int np)
{
    Schedule *s = sched_new("sparse", target, 1);
    s->shape = sh;
    int64_t hd = sh.head_dim, nkv = sh.n_kv_heads, nh = sh.n_heads, g = nh / nkv, S = sh.max_seq;
    int64_t pages = (S + page - 1) / page;
    uint32_t q = test_buf(s, "q", DT_F32, BUF_SCRATCH, nh * hd, 0, 0);
    uint32_t k = test_buf(s, "k", DT_F32, BUF_SCRATCH, nkv * hd, 0, 0);
    uint32_t v = test_buf(s, "v", DT_F32, BUF_SCRATCH, nkv * hd, 0, 0);
    uint32_t out = test_buf(s, "att", DT_F32, BUF_SCRATCH, nh * hd, 0, 0);
    uint32_t kc = test_buf(s, "kc", DT_F32, BUF_KV, nkv, S, hd), vc = test_buf(s, "vc", DT_F32, BUF_KV, nkv, S, hd);
    uint32_t ks = test_buf(s, "ks", DT_F32, BUF_KV, nkv, cap, hd), vs = test_buf(s, "vs", DT_F32, BUF_KV, nkv, cap, hd);
    uint32_t meta = test_buf(s, "meta", DT_I32, BUF_STATE, nkv, cap + 1, 0);
    uint32_t acc = test_buf(s, "acc", DT_F32, BUF_STATE, nkv, cap, 0);
    uint32_t score = test_buf(s, "score", DT_F32, BUF_SCRATCH, nh, 2 * sparse_score_rows(cap, 2), 0);
    uint32_t bounds = test_buf(s, "bounds", DT_F32, BUF_STATE, nkv * pages, 2, hd);
    uint32_t sel = test_buf(s, "sel", DT_I32, BUF_SCRATCH, nkv, np, 0);
    uint32_t part = test_buf(s, "part", DT_F32, BUF_SCRATCH, nkv * 2, g, hd + 2);
    int snapw = cap / 4 < 32 ? cap / 4 : 32;
    uint32_t snap = test_buf(s, "snap", DT_I32, BUF_STATE, nkv, cap + 2, 0);
    uint32_t qwin = test_buf(s, "qwin", DT_F32, BUF_STATE, snapw, nh, hd);
    uint32_t snapsc = test_buf(s, "snapsc", DT_F32, BUF_STATE, nkv + 2, S, 0);
    uint32_t topksc = test_buf(s, "topksc", DT_F32, BUF_SCRATCH, nh + nkv, S, 0);
    uint32_t kidx = test_buf(s, "kidx", DT_I32, BUF_SCRATCH, nkv, np, 0);
    for (int h = 0; h < nkv; h++) {
        test_op(s, OP_KV_STORE, (int32_t[]){h, cap}, (uint32_t[]){k, v, ks, vs, meta});
        test_op(s, OP_QUEST_SELECT, (int32_t[]){h, page, np}, (uint32_t[]){q, kc, bounds, sel});
        test_op(s, OP_TOPK_SELECT, (int32_t[]){h, np, 1, 250000}, (uint32_t[]){q, kc, topksc, kidx});
        test_op(s, OP_ATTN, (int32_t[]){h, 0, 2, 32, 0}, (uint32_t[]){q, kc, vc, part, BUF_NONE});
        test_op(s, OP_ATTN_SPARSE, (int32_t[]){h, 1, 2, SPARSE_SINK_WINDOW, 4, 64},
                (uint32_t[]){q, kc, vc, part, BUF_NONE});
        test_op(s, OP_ATTN_SPARSE, (int32_t[]){h, 0, 2, SPARSE_QUEST, page, np}, (uint32_t[]){q, kc, vc, part, sel});
        test_op(s, OP_ATTN_SPARSE, (int32_t[]){h, 1, 2, SPARSE_SLOTS, cap, 1}, (uint32_t[]){q, ks, vs, part, score});
        test_op(s, OP_ATTN_SPARSE, (int32_t[]){h, 1, 2, SPARSE_SNAP, cap, 0}, (uint32_t[]){q, kc, vc, part, snap});
        test_op(s, OP_ATTN_SPARSE, (int32_t[]){h, 0, 2, SPARSE_ROWS, (int32_t)((h + 1) % nkv), np},
                (uint32_t[]){q, kc, vc, part, kidx});
        test_op(s, OP_ATTN_COMBINE, (int32_t[]){h, 2, 1}, (uint32_t[]){part, out});
    }
    test_op(s, OP_ATTN_COMBINE, (int32_t[]){0, 2, (int32_t)nkv}, (uint32_t[]){part, out});
    test_op(s, OP_KV_EVICT, (int32_t[]){KV_POLICY_STREAMING, cap, 4, 0, 2}, (uint32_t[]){BUF_NONE, meta, BUF_NONE});
    test_op(s, OP_KV_EVICT, (int32_t[]){KV_POLICY_H2O, cap, 0, cap / 2, 2}, (uint32_t[]){score, meta, acc});
    test_op(s, OP_KV_EVICT, (int32_t[]){KV_POLICY_TOVA, cap, 0, 0, 2}, (uint32_t[]){score, meta, BUF_NONE});
    test_op(s, OP_KV_SNAP, (int32_t[]){cap, snapw, cap}, (uint32_t[]){q, kc, qwin, snap, snapsc});
    sched_layout(s);
    return s;
}

/* ---- nvrtc ---- */

/* s through NVRTC for arch: a cubin with no local memory (stack frame or
 * spills), registers and shared memory within one block per SM, and the
 * exported symbols; returns what ptxas reported. */
static CudaKernelInfo cubin_check(const Schedule *s, const char *arch, const char *what)
{
    char *dir = tmp_dir(), path[1200];
    snprintf(path, sizeof path, "%s/kernel.%s.cubin", dir, arch);
    Diag d;
    diag_init(&d);
    CudaKernelInfo info;
    memset(&info, 0, sizeof info);
    cr_assert(cg_cuda_compile(s, arch, path, &info, &d), "%s for %s: cg_cuda_compile failed", what, arch);
    cr_assert_eq(info.threads_per_block, CUDA_THREADS_GPU);
    cr_assert(info.regs_per_thread > 0 && info.regs_per_thread <= 65536 / CUDA_THREADS_GPU, "%d registers",
              info.regs_per_thread);
    /* static shared memory within CUDA's 48 KiB; with the dynamic stages,
     * within the architecture's per-block opt-in (its per-SM size less the
     * 1 KiB the driver reserves) */
    Diag td;
    diag_init(&td);
    const Target *t = target_lookup(arch, &td);
    cr_assert(t);
    cr_assert(info.dyn_smem >= 0 && info.smem_per_block - info.dyn_smem > 0 &&
                  info.smem_per_block - info.dyn_smem <= 48 * 1024,
              "%s for %s: %d bytes static smem", what, arch, info.smem_per_block - info.dyn_smem);
    cr_assert(info.smem_per_block <= t->smem_per_sm - 1024, "%s for %s: %d bytes smem (%d dynamic)", what, arch,
              info.smem_per_block, info.dyn_smem);
    cr_assert_eq(info.local_bytes, 0, "%s for %s spills: %d bytes of local memory", what, arch, info.local_bytes);
    size_t n = 0;
    char *cubin = read_file(path, &n);
    cr_assert(cubin && n > 4 && memcmp(cubin, "\177ELF", 4) == 0, "%s is not an ELF cubin", path);
    static const char *const syms[] = {"megac_kernel", "megac_kernel_abi", "megac_schedule_hash", "megac_num_workers"};
    for (int i = 0; i < 4; i++)
        cr_assert(memmem(cubin, n, syms[i], strlen(syms[i]) + 1), "%s: no symbol %s", path, syms[i]);
    cr_log_info("%s %s: %u workers, %d regs, %d B smem (%d dynamic), %d loads in flight, %d before waits%s%s", what,
                arch, s->nworkers, info.regs_per_thread, info.smem_per_block, info.dyn_smem, info.vloads, info.preloads,
                info.block_lanes ? ", block rows side by side" : "", info.wpipe ? ", weight pipe" : "");
    free(cubin);
    test_rm_rf(dir);
    return info;
}

/* How case i of a test is checked for architecture a of 3. The plain
 * suite compiles every one with NVRTC. The sanitized one, where NVRTC's
 * time is not sanitized code (these tests took ~110 s of the ASan suite
 * compiling one architecture a case, 2026-12-07), compiles its first
 * case's first architecture only, and of each other case builds the
 * kernel source for one architecture, in turn, so that megac's own code
 * still runs for every case under the sanitizers. */
typedef enum { NVRTC_SKIP, NVRTC_SOURCE, NVRTC_FULL } NvrtcCheck;

static NvrtcCheck nvrtc_check_for(int i, int a)
{
    if (!harness_sanitized())
        return NVRTC_FULL;
    if (a != i % 3)
        return NVRTC_SKIP;
    return i == 0 ? NVRTC_FULL : NVRTC_SOURCE;
}

/* The kernel source of s, as cg_cuda_compile builds it first. */
static void source_check(const Schedule *s, const char *arch, const char *what)
{
    CudaLayout l = cuda_layout(s, false);
    char *src = cuda_source_build(s, &l, false);
    cr_assert(src && strstr(src, "megac_kernel"), "%s for %s: no kernel source", what, arch);
    free(src);
}

/* s for arch, checked as c says: true, and *info filled, when NVRTC
 * compiled it (cubin_check); false when only its source was built. */
static bool nvrtc_case(const Schedule *s, const char *arch, const char *what, NvrtcCheck c, CudaKernelInfo *info)
{
    if (c == NVRTC_SOURCE) {
        source_check(s, arch, what);
        return false;
    }
    *info = cubin_check(s, arch, what);
    return true;
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
            /* (not cr_log_warn: with it Criterion 2.4.1 exits 1 though every test passed) */
            fprintf(stderr, "[WARN] %s skipped: ../shared/hf-configs is absent\n", path);
            continue;
        }
        for (int a = 0; a < 3; a++) {
            NvrtcCheck c = nvrtc_check_for((int)m, a);
            if (c == NVRTC_SKIP)
                continue;
            Model r;
            model_open(&r, path, false);
            Schedule *s = model_lower(&r, archs[a], 0);
            CudaKernelInfo info;
            nvrtc_case(s, archs[a], r.m.name, c, &info);
            sched_free(s);
            model_close(&r);
        }
    }
    globfree(&g);
}

/* The synthetic model stored in each format the GPU tests decode
 * (stored_formats_check) compiles for every architecture at 3 blocks
 * without local memory: on sm_90 its W4A16-g32 kernel spilled 4 bytes
 * with 8 weight loads in flight per lane, and megac refused it (seen on an
 * H200, 2026-12-04); cg_cuda_compile now takes fewer loads in flight. */
Test(cuda_nvrtc, stored_formats_every_arch, .timeout = 900)
{
    static const char *const archs[] = {"sm_80", "sm_90", "sm_120"};
    static const char *const fmts[] = {"bf16", "f16", "w8a16", "w4a16-g32", "w4a16-g128"};
    char *dir = tmp_dir();
    for (int f = 0; f < 5; f++) {
        char compile[96];
        snprintf(compile, sizeof compile, "  quant: {default: %s}\n", fmts[f]);
        char *yaml = write_synth_as(dir, fmts[f], compile);
        Model r;
        model_open(&r, yaml, false);
        for (int a = 0; a < 3; a++) {
            NvrtcCheck c = nvrtc_check_for(f, a);
            if (c == NVRTC_SKIP)
                continue;
            Schedule *s = model_lower(&r, archs[a], 3);
            CudaKernelInfo info;
            if (nvrtc_case(s, archs[a], fmts[f], c, &info))
                cr_assert(info.vloads >= 2 && info.vloads <= CUDA_VLOADS, "%d loads in flight", info.vloads);
            sched_free(s);
        }
        model_close(&r);
        free(yaml);
    }
    test_rm_rf(dir);
}

/* The GEMV weight loads a lane issues before a wait (mk_gemv_preload)
 * hold registers across it. At the Llama-3.2-1B shape (SmolLM2-135M's
 * kernels take as many registers), stored bf16 and w8a16, every
 * architecture keeps all CUDA_PRELOADS of them without spilling
 * (cg_cuda_compile would take fewer where ptxas spills, silently slower);
 * a W4 schedule, whose GEMVs cannot use them, gets none. */
Test(cuda_nvrtc, gemv_preloads_fit, .timeout = 900)
{
    static const char *const archs[] = {"sm_80", "sm_90", "sm_120"};
    static const char *const fmts[] = {"bf16", "w8a16", "w4a16-g128"};
    for (int f = 0; f < 3; f++) {
        Model r;
        memset(&r, 0, sizeof r);
        Diag d;
        diag_init(&d);
        DescOverride ov = {"quant.default", fmts[f]};
        cr_assert(desc_load(&r.m, &r.arena, src_path("/models/llama-3.2-1b.yaml"), &ov, 1, &d));
        for (int a = f == 2 ? 1 : 0; a < (f == 2 ? 2 : 3); a++) {
            /* (the W4 case: sm_90 only) */
            NvrtcCheck c = f != 2 ? nvrtc_check_for(f, a) : harness_sanitized() ? NVRTC_SOURCE : NVRTC_FULL;
            if (c == NVRTC_SKIP)
                continue;
            Schedule *s = model_lower(&r, archs[a], 0);
            char what[96];
            snprintf(what, sizeof what, "%s %s", r.m.name, fmts[f]);
            CudaKernelInfo info;
            if (nvrtc_case(s, archs[a], what, c, &info))
                cr_assert_eq(info.preloads, f == 2 ? 0 : CUDA_PRELOADS, "%s for %s: %d weight loads before waits",
                             what, archs[a], info.preloads);
            sched_free(s);
        }
        model_close(&r);
    }
}

/* The new ops' bodies in the kernel for every architecture, at a
 * Llama-3-8B shape (hd 128, 4 q heads per kv head, 128K positions) and a
 * wide-group one (hd 64, 8 per kv head): no local memory, registers and
 * shared memory within bounds (cubin_check). */
Test(cuda_nvrtc, sparse_ops_every_arch, .timeout = 900)
{
    static const char *const archs[] = {"sm_80", "sm_90", "sm_120"};
    ModelShape shapes[2] = {
        {.dim = 4096, .hidden_dim = 14336, .n_layers = 1, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
         .vocab_size = 128256, .max_seq = 131072, .norm_eps = 1e-5},
        {.dim = 2048, .hidden_dim = 8192, .n_layers = 1, .n_heads = 32, .n_kv_heads = 4, .head_dim = 64,
         .vocab_size = 32000, .max_seq = 8192, .norm_eps = 1e-5},
    };
    for (int i = 0; i < 2; i++)
        for (int a = 0; a < 3; a++) {
            NvrtcCheck c = nvrtc_check_for(i, a);
            if (c == NVRTC_SKIP)
                continue;
            Schedule *s = test_sparse_schedule(archs[a], shapes[i], 4096, 16, 64);
            char what[64];
            snprintf(what, sizeof what, "sparse ops (hd %d, G %d)", shapes[i].head_dim,
                     shapes[i].n_heads / shapes[i].n_kv_heads);
            CudaKernelInfo info;
            nvrtc_case(s, archs[a], what, c, &info);
            sched_free(s);
        }
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
    cr_assert_not(cuda_nvrtc_compile(src, "sm_90", 512, "/tmp/never.cubin", NULL, NULL, &d));
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

/* Every GEMV path of kernel_body.cuh: rows [r0, r1) of `rows`, k, flags,
 * weight dtype. Rows split over warps (1 and 2 rows), a row length that
 * is not a multiple of the vector width, warp per row, an input too long
 * for the shared scratch (read from the arena), W8 rows whose data starts
 * at each of the four float4 offsets (k = 64: rows of 68 bytes) or at one
 * (k = 1001), W4 at each group size (k = 200: a last group of 8), and
 * GGUF's blocks: Q4_0, Q4_1, Q8_0 and W4 rows in the CUDA order (rows of
 * a slice per warp, rows too short for their headers to align the data:
 * k = 64 of Q4_0, rows whose data lands on the boundary), W8 rows in
 * slices, block rows against an input too long to stage, and rows short
 * enough for 16 or 8 lanes each (W8 k = 2048, bf16 k = 576, W4G128 k =
 * 1024, Q8_0 k = 2048), 37, 21, 19 and 11 of them: the last round's
 * groups past the last row.
 * The cases are looked up by index below: new ones go at the end. */
static const int gemv_spec[][6] = {
    {0, 1, 3, 64, GEMV_NORM | GEMV_BIAS, DT_F32}, {3, 5, 6, 68, GEMV_ACCUM, DT_F32},
    {0, 7, 7, 66, GEMV_BIAS, DT_F32},           {0, 50, 50, 64, GEMV_NORM | GEMV_ACCUM, DT_F32},
    {1, 4, 4, 8200, 0, DT_F32},                 {0, 2, 2, 64, GEMV_ACCUM, DT_BF16},
    {0, 9, 9, 128, GEMV_NORM, DT_BF16},         {0, 3, 3, 60, GEMV_BIAS, DT_BF16},
    {0, 2, 2, 4096, 0, DT_BF16},                {1, 6, 7, 1001, GEMV_BIAS, DT_W8},
    {0, 9, 9, 64, 0, DT_W8},                    {0, 9, 9, 256, GEMV_NORM, DT_W4G32},
    {1, 5, 6, 200, GEMV_BIAS, DT_W4G64},        {0, 5, 5, 512, 0, DT_W4G128},
    {0, 2, 2, 256, 0, DT_Q4_0},                 {0, 5, 5, 64, GEMV_BIAS, DT_Q4_0},
    {0, 7, 7, 96, GEMV_NORM, DT_Q4_1},          {1, 2, 3, 128, GEMV_ACCUM, DT_Q8_0},
    {0, 6, 6, 160, 0, DT_Q8_0},                 {0, 1, 1, 200, 0, DT_W4G32},
    {0, 2, 2, 1001, GEMV_BIAS, DT_W8},          {1, 2, 4, 4096, GEMV_ACCUM, DT_W8},
    {0, 1, 1, 8224, 0, DT_W4G32},               {0, 3, 3, 8256, GEMV_BIAS, DT_Q8_0},
    /* rows read by 16 or 8 lanes (mk_gemv_nl), 2 or 4 a warp, the last
     * groups past the rows */
    {0, 37, 37, 2048, GEMV_BIAS, DT_W8},        {0, 21, 21, 576, GEMV_NORM, DT_BF16},
    {0, 19, 19, 1024, 0, DT_W4G128},            {2, 13, 13, 2048, GEMV_ACCUM, DT_Q8_0},
    /* short rows, no more than the host block's 4 warps: 4 a warp, or a
     * row a warp with its preloads (MK_NL_ONE_ROW=1) */
    {0, 4, 4, 128, GEMV_NORM, DT_BF16},         {1, 4, 4, 256, GEMV_BIAS, DT_W8},
    /* rows of several rounds, several a warp: through the weight pipe's
     * ring more than once (MK_WPIPE) */
    {1, 12, 12, 2056, GEMV_ACCUM | GEMV_BIAS, DT_BF16}, {0, 9, 9, 1100, GEMV_NORM, DT_F32},
    {1, 11, 11, 2100, GEMV_NORM | GEMV_ACCUM, DT_W8}, /* rows 8 bytes off 16: every head and tail */
};
enum { GEMV_N = sizeof gemv_spec / sizeof gemv_spec[0] };

/* One host block runs the cases of gemv_spec in order. Every GEMV but the
 * first comes after one or two waits (a signal of the op before, as a
 * pipeline has them), so the weight loads issued before a wait
 * (mk_gemv_preload) are exercised too: rows and slices of one round of
 * loads and of many. */
static Schedule *gemv_schedule(GemvCase c[GEMV_N])
{
    Schedule *s = sched_new("gemv", "host-cuda", 1);
    s->shape = (ModelShape){.dim = 64, .hidden_dim = 64, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                            .head_dim = 8, .vocab_size = 16, .max_seq = 16, .norm_eps = 1e-5};
    uint32_t done = sched_add_counter(s, "done");
    for (int i = 0; i < GEMV_N; i++) {
        char name[32];
        GemvCase *g = &c[i];
        const int *sp = gemv_spec[i];
        g->r0 = sp[0], g->r1 = sp[1], g->rows = sp[2], g->k = sp[3], g->flags = sp[4];
        int64_t wn[2] = {g->rows, g->k}, kn = g->k, rn = g->rows;
        snprintf(name, sizeof name, "w%d", i);
        g->w = sched_add_buffer(s, name, (DType)sp[5], BUF_WEIGHT, 2, wn);
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
        if (i > 0) {
            sched_signal(s, 0, done, 1);
            if (i % 2)
                sched_wait(s, 0, done, (uint32_t)(i - 1));
            sched_wait(s, 0, done, (uint32_t)i);
        }
        sched_op(s, 0, OP_GEMV, p, acc);
    }
    return s;
}

/* A hand-built one-worker schedule, compiled for host-cuda and loaded;
 * arena and weights zeroed. */
typedef struct {
    Schedule *s;
    char *dir;
    void *dl;
    WorkerFn fn;
    char *weights, *arena;
    int64_t prompt_end;     /* MegacArgs.prompt_end of the steps (-1: none) */
} HostKernel;

static void host_kernel_open(HostKernel *k, Schedule *s)
{
    memset(k, 0, sizeof *k);
    k->s = s;
    k->prompt_end = -1;
    sched_layout(s);
    k->dir = tmp_dir();
    char so[1200];
    snprintf(so, sizeof so, "%s/kernel.so", k->dir);
    Diag d;
    diag_init(&d);
    cr_assert(cg_hostcuda_compile(s, so, &d));
    k->dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert(k->dl, "%s", dlerror());
    k->fn = (WorkerFn)(uintptr_t)dlsym(k->dl, "megac_worker");
    cr_assert(k->fn);
    size_t wb = (s->weights_bytes + 63) / 64 * 64 + 64, ab = (s->arena_bytes + 63) / 64 * 64 + 64;
    k->weights = aligned_alloc(64, wb);
    k->arena = aligned_alloc(64, ab);
    cr_assert(k->weights && k->arena);
    memset(k->weights, 0, wb);
    memset(k->arena, 0, ab);
}

static void *host_buf(HostKernel *k, uint32_t b)
{
    return (k->s->bufs[b].cls == BUF_WEIGHT ? k->weights : k->arena) + k->s->bufs[b].offset;
}

static void host_fill(HostKernel *k, uint32_t b)
{
    float *x = host_buf(k, b);
    for (int64_t i = 0; i < k->s->bufs[b].nelem; i++)
        x[i] = rnd();
}

static void host_kernel_step(HostKernel *k, int64_t pos)
{
    uint32_t ctr[1] = {0};
    MegacAbort ab;
    memset(&ab, 0, sizeof ab);
    MegacArgs args = {k->weights, k->arena, ctr, &ab, pos, 0, k->prompt_end, 0, 0};
    k->fn(&args, 0);
    cr_assert_eq(ab.flag, 0, "the step at pos %lld aborted", (long long)pos);
}

static void host_kernel_close(HostKernel *k)
{
    dlclose(k->dl);
    free(k->weights);
    free(k->arena);
    sched_free(k->s);
    test_rm_rf(k->dir);
}

/* Random weights and inputs for gemv_schedule's kernel (quantized rows:
 * random rows quantized by compiler/quant.c, in the CUDA kernel's byte
 * order). */
static void gemv_fill(HostKernel *k)
{
    Schedule *s = k->s;
    for (uint32_t b = 0; b < s->nbufs; b++) {
        char *p = host_buf(k, b);
        DType t = s->bufs[b].dtype;
        if (t != DT_F32 && t != DT_BF16) {
            int64_t rows = s->bufs[b].shape[0], n = s->bufs[b].shape[1];
            size_t rb = dtype_row_bytes(t, n);
            float *w = malloc(sizeof(float) * (size_t)n);
            unsigned char *q = malloc(rb * (size_t)rows);
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t j = 0; j < n; j++)
                    w[j] = rnd();
                if (t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q8_0) /* blocks {f16 d; (f16 m;) random bytes} */
                    for (int64_t j = 0; j < n / 32; j++) {
                        unsigned char *blk = q + r * rb + j * (size_t)dtype_block_bytes(t);
                        int hb = t == DT_Q4_1 ? 4 : 2;
                        uint16_t d = f32_to_f16(0.02f * (1.5f + rnd())), mn = f32_to_f16(0.1f * rnd());
                        memcpy(blk, &d, 2);
                        if (t == DT_Q4_1)
                            memcpy(blk + 2, &mn, 2);
                        for (int e = hb; e < dtype_block_bytes(t); e++)
                            blk[e] = (unsigned char)lrintf(127.5f + 127.5f * rnd());
                    }
                else
                    quant_row_quantize(t, w, n, q + r * rb);
            }
            if (!quant_kernel_order(s->target, t, rows, n, q, (unsigned char *)p))
                memcpy(p, q, rb * (size_t)rows);
            free(w);
            free(q);
            continue;
        }
        for (int64_t i = 0; i < s->bufs[b].nelem; i++) {
            if (s->bufs[b].dtype == DT_BF16)
                ((uint16_t *)p)[i] = f32_to_bf16(rnd());
            else
                ((float *)p)[i] = rnd();
        }
    }
}

/* The GEMV cases on one host block, each against a double sum, in a
 * kernel built with MEGAC_CUDA_DEFINES=defines (or none); returns the
 * kernel's megac_wstage_count() after the step (0 without one), and its
 * megac_nl_count(0..5) in nl when not NULL (MK_NL_COUNT=1). */
static unsigned long gemv_paths_check_nl(const char *defines, unsigned long nl[6])
{
    enum { N = GEMV_N };
    GemvCase c[N];
    HostKernel hk;
    if (defines)
        setenv("MEGAC_CUDA_DEFINES", defines, 1);
    host_kernel_open(&hk, gemv_schedule(c));
    unsetenv("MEGAC_CUDA_DEFINES");
    gemv_fill(&hk);
    Schedule *s = hk.s;
    char *weights = hk.weights, *arena = hk.arena;
    /* the expected results, from the inputs before the step */
    double *want[N];
    for (int i = 0; i < N; i++) {
        GemvCase *g = &c[i];
        const char *W = weights + s->bufs[g->w].offset;
        const float *x = (const float *)(arena + s->bufs[g->x].offset);
        DType t = s->bufs[g->w].dtype;
        const float *nw = (const float *)(weights + s->bufs[g->nw].offset), *b = (const float *)(weights + s->bufs[g->b].offset);
        const float *y = (const float *)(arena + s->bufs[g->y].offset);
        double ss = 0;
        for (int j = 0; j < g->k; j++)
            ss += (double)x[j] * x[j];
        double sc = 1.0 / sqrt(ss / g->k + 1e-5);
        float *wr = malloc(sizeof(float) * (size_t)g->k);
        size_t rb = dtype_row_bytes(t, g->k);
        unsigned char *stored = malloc(rb * (size_t)g->rows); /* W in ir/dtype.h's order */
        memcpy(stored, W, rb * (size_t)g->rows);
        if (quant_cuda_ordered(t))
            quant_cuda_unorder(t, g->rows, g->k, (const unsigned char *)W, stored);
        want[i] = malloc(sizeof(double) * (size_t)g->rows);
        for (int r = 0; r < g->rows; r++) {
            want[i][r] = y[r];
            if (r < g->r0 || r >= g->r1)
                continue;
            for (int j = 0; j < g->k; j++) { /* the row as stored, dequantized */
                int64_t e = (int64_t)r * g->k + j;
                if (t == DT_F32 || t == DT_BF16)
                    wr[j] = t == DT_BF16 ? bf16_to_f32(((const uint16_t *)W)[e]) : ((const float *)W)[e];
            }
            if (t != DT_F32 && t != DT_BF16)
                quant_row_dequant(t, stored + (size_t)r * rb, g->k, wr);
            double acc = 0;
            for (int j = 0; j < g->k; j++)
                acc += (double)wr[j] * ((g->flags & GEMV_NORM) ? x[j] * sc * nw[j] : x[j]);
            if (g->flags & GEMV_BIAS)
                acc += b[r];
            want[i][r] = (g->flags & GEMV_ACCUM) ? want[i][r] + acc : acc;
        }
        free(wr);
        free(stored);
    }
    host_kernel_step(&hk, 0);
    for (int i = 0; i < N; i++) {
        const float *y = (const float *)(arena + s->bufs[c[i].y].offset);
        for (int r = 0; r < c[i].rows; r++)
            cr_assert(fabs(y[r] - want[i][r]) <= 1e-4 * (1 + sqrt((double)c[i].k)),
                      "case %d (rows [%d, %d) of %d, k %d, flags %d): y[%d] = %.7g, want %.7g", i, c[i].r0, c[i].r1,
                      c[i].rows, c[i].k, c[i].flags, r, y[r], want[i][r]);
        free(want[i]);
    }
    unsigned long (*count)(void) = (unsigned long (*)(void))(uintptr_t)dlsym(hk.dl, "megac_wstage_count");
    unsigned long staged = count ? count() : 0;
    unsigned long (*nlc)(int) = (unsigned long (*)(int))(uintptr_t)dlsym(hk.dl, "megac_nl_count");
    for (int i = 0; nl && i < 6; i++)
        nl[i] = nlc ? nlc(i) : 0;
    host_kernel_close(&hk);
    return staged;
}

static unsigned long gemv_paths_check(const char *defines)
{
    return gemv_paths_check_nl(defines, NULL);
}

Test(cuda_host, gemv_paths_match_double)
{
    gemv_paths_check(NULL);
}

/* Rows short enough for half a round of loads are read by 16 or 8 lanes,
 * 2 or 4 rows a warp side by side (mk_gemv_nl): the cases of gemv_spec
 * that are (W8 k = 2048, bf16 k = 576 and Q8_0 k = 2048 at 16; f32 k = 64,
 * bf16 k = 128, W8 k = 64, W4G128 k = 1024 and the short block rows at 8)
 * give the same results as the double sums either way
 * (gemv_paths_check); MK_ROW_LANES_MIN=32 reads every row with 32, and
 * MK_ROW_LANES_BLOCKS=0 the block formats' rows. MK_NL_ONE_ROW=1: where a
 * worker has no more rows of a preloadable GEMV than warps, a row a
 * warp. */
Test(cuda_host, gemv_short_rows_side_by_side)
{
    unsigned long nl[6];
    gemv_paths_check_nl("MK_NL_COUNT=1", nl);
    cr_assert_geq(nl[1], 3, "GEMVs at 16 lanes a row: %lu", nl[1]);
    cr_assert_geq(nl[0], 5, "GEMVs at 8 lanes a row: %lu", nl[0]);
    unsigned long n = nl[0] + nl[1] + nl[2], fewer = nl[0] + nl[1];
    gemv_paths_check_nl("MK_NL_COUNT=1 MK_ROW_LANES_MIN=32", nl);
    cr_assert_eq(nl[0] + nl[1], 0);
    cr_assert_eq(nl[2], n, "every GEMV of the row paths at 32 lanes");
    gemv_paths_check_nl("MK_NL_COUNT=1 MK_ROW_LANES_MIN=16", nl);
    cr_assert_eq(nl[0], 0);
    cr_assert_geq(nl[1], 6);
    gemv_paths_check_nl("MK_NL_COUNT=1 MK_ROW_LANES_BLOCKS=0", nl);
    cr_assert_lt(nl[0] + nl[1], fewer, "the block rows at 32 lanes");
    cr_assert_geq(nl[1], 2);
    /* with the rule, the two cases of a row a warp or less go a row a
     * warp, and only they */
    unsigned long base[6];
    gemv_paths_check_nl("MK_NL_COUNT=1", base);
    gemv_paths_check_nl("MK_NL_COUNT=1 MK_NL_ONE_ROW=1", nl);
    cr_assert_eq(nl[0], base[0] - 2, "at 8 lanes: %lu with the rule, %lu without", nl[0], base[0]);
    cr_assert_eq(nl[1], base[1]);
    cr_assert_eq(nl[2], base[2] + 2);
}

/* The weight pipe (MK_WPIPE=S: cp.async copies S - 1 rounds ahead into
 * each warp's ring; on the host, copies at once) gives the double sums'
 * results for every case, at 2, 3 and 4 stages; the f32, bf16 and W8
 * GEMVs at 32 lanes a row go through it, and none without it. Each of
 * those comes after a wait here, and has its first rounds copied before
 * it (mk_pipe_prime): the GEMV must go on from where that left the
 * stream (rows of one round or of many, warps with no row), copying each
 * round once, as many rounds as without the priming and the preloads
 * (MK_WPIPE_PRIME=0 MK_PRELOADS=0; with preloads a warp's first row is
 * read from them);
 * on the host a copy lands at once, so only that count sees a round
 * copied twice. */
Test(cuda_host, weight_pipe_matches_double)
{
    unsigned long nl[6];
    gemv_paths_check_nl("MK_NL_COUNT=1", nl);
    cr_assert_eq(nl[3], 0, "no weight pipe by default");
    static const char *const defs[] = {"MK_NL_COUNT=1 MK_WPIPE=2", "MK_NL_COUNT=1 MK_WPIPE=3",
                                       "MK_NL_COUNT=1 MK_WPIPE=4"};
    for (int i = 0; i < 3; i++) {
        unsigned long off[6];
        char d[128];
        snprintf(d, sizeof d, "%s MK_WPIPE_PRIME=0 MK_PRELOADS=0", defs[i]);
        gemv_paths_check_nl(d, off);
        cr_assert_eq(off[4], 0, "%s: none primed", d);
        gemv_paths_check_nl(defs[i], nl);
        cr_assert_eq(nl[3], off[3]);
        cr_assert_eq(nl[5], off[5], "%s: %lu rounds copied, %lu without priming", defs[i], nl[5], off[5]);
        cr_assert_geq(nl[3], 4, "%s: %lu GEMVs through the pipe", defs[i], nl[3]);
        cr_assert_leq(nl[3], nl[2]);
        cr_assert_eq(nl[4], nl[3], "%s: %lu of the %lu primed before their wait (all come after one)", defs[i],
                     nl[4], nl[3]);
    }
    gemv_paths_check_nl("MK_NL_COUNT=1 MK_WPIPE=1", nl);
    cr_assert_eq(nl[3], 0, "a pipe of one stage is none");
}

/* With a weight stage (MK_WSTAGE_BYTES), every GEMV after a wait reads the
 * rows that fit from its copy in shared memory: the same results on every
 * path, from a stage that holds all of every GEMV's rows, a few rows, or
 * less than a row (48 bytes: nothing staged is read, the rows straddle
 * it). Rows start at every offset mod 16 (W8 k = 64, Q4_0 k = 64), so the
 * copy must keep it. MK_WSTAGE_COUNT counts the rows read from the stage
 * (one per lane), so a stage that was never read fails. */
Test(cuda_host, gemv_rows_read_from_the_stage)
{
    unsigned long all = gemv_paths_check("MK_WSTAGE_BYTES=262144 MK_WSTAGE_COUNT=1");
    unsigned long few = gemv_paths_check("MK_WSTAGE_BYTES=1024 MK_WSTAGE_COUNT=1");
    unsigned long none = gemv_paths_check("MK_WSTAGE_BYTES=48 MK_WSTAGE_COUNT=1");
    cr_assert_gt(all, few, "a stage of 256 KiB read %lu rows, one of 1 KiB %lu", all, few);
    cr_assert_gt(few, 0);
    /* the f32 rows of k = 64 and 66 are 256 and 264 bytes: none in 48 */
    cr_assert_lt(none, few);
}

/* GEMVs one after another on one input with no wait between them: the
 * second of a pair with the same input, norm and swizzle reuses the input
 * the first staged (mk_gemv_restaged); a pair whose norm weights, norm
 * flag or swizzle differ stages its own (a reuse there gives wrong
 * results). {dtype, norm weights (0, 1; -1: none)}; 8 rows of k = 96. */
static const int reuse_spec[][2] = {
    {DT_BF16, 0}, {DT_BF16, 0}, /* reused */
    {DT_BF16, 1},               /* other norm weights */
    {DT_BF16, -1},              /* no norm */
    {DT_W8, -1},                /* W8's swizzle (4 float4s a load, bf16's 2) */
    {DT_W8, -1},                /* reused */
    {DT_W8, 0},                 /* a norm */
};
enum { REUSE_N = sizeof reuse_spec / sizeof reuse_spec[0], REUSE_K = 96, REUSE_ROWS = 8 };

Test(cuda_host, gemv_input_reused_only_when_the_same)
{
    Schedule *s = sched_new("reuse", "host-cuda", 1);
    s->shape = (ModelShape){.dim = 64, .hidden_dim = 64, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                            .head_dim = 8, .vocab_size = 16, .max_seq = 16, .norm_eps = 1e-5};
    int64_t kn = REUSE_K, rn = REUSE_ROWS, wn[2] = {REUSE_ROWS, REUSE_K};
    uint32_t x = sched_add_buffer(s, "x", DT_F32, BUF_STATE, 1, &kn), nw[2], w[REUSE_N], y[REUSE_N];
    nw[0] = sched_add_buffer(s, "nw0", DT_F32, BUF_WEIGHT, 1, &kn);
    nw[1] = sched_add_buffer(s, "nw1", DT_F32, BUF_WEIGHT, 1, &kn);
    for (int i = 0; i < REUSE_N; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        w[i] = sched_add_buffer(s, name, (DType)reuse_spec[i][0], BUF_WEIGHT, 2, wn);
        snprintf(name, sizeof name, "y%d", i);
        y[i] = sched_add_buffer(s, name, DT_F32, BUF_STATE, 1, &rn);
        int norm = reuse_spec[i][1] >= 0;
        int32_t p[OP_MAX_PARAMS] = {0, REUSE_ROWS, REUSE_K, norm ? GEMV_NORM : 0};
        Access acc[5] = {
            {w[i], ACC_R, affine_const(0), affine_const((int64_t)REUSE_ROWS * REUSE_K)},
            {x, ACC_R, affine_const(0), affine_const(REUSE_K)},
            {y[i], ACC_W, affine_const(0), affine_const(REUSE_ROWS)},
            {norm ? nw[reuse_spec[i][1]] : BUF_NONE, ACC_R, affine_const(0), affine_const(norm ? REUSE_K : 0)},
            {BUF_NONE, ACC_R, affine_const(0), affine_const(0)},
        };
        sched_op(s, 0, OP_GEMV, p, acc);
    }
    HostKernel hk;
    setenv("MEGAC_CUDA_DEFINES", "MK_XREUSE_COUNT=1", 1);
    host_kernel_open(&hk, s);
    unsetenv("MEGAC_CUDA_DEFINES");
    gemv_fill(&hk);
    host_kernel_step(&hk, 0);
    const float *xv = host_buf(&hk, x);
    double ss = 0;
    for (int j = 0; j < REUSE_K; j++)
        ss += (double)xv[j] * xv[j];
    double sc = 1.0 / sqrt(ss / REUSE_K + 1e-5);
    for (int i = 0; i < REUSE_N; i++) {
        DType t = (DType)reuse_spec[i][0];
        const unsigned char *W = host_buf(&hk, w[i]);
        const float *nv = reuse_spec[i][1] >= 0 ? host_buf(&hk, nw[reuse_spec[i][1]]) : NULL;
        size_t rb = dtype_row_bytes(t, REUSE_K);
        unsigned char *stored = malloc(rb * REUSE_ROWS);
        memcpy(stored, W, rb * REUSE_ROWS);
        if (quant_cuda_ordered(t))
            quant_cuda_unorder(t, REUSE_ROWS, REUSE_K, W, stored);
        const float *yv = host_buf(&hk, y[i]);
        for (int r = 0; r < REUSE_ROWS; r++) {
            float wr[REUSE_K];
            if (t == DT_BF16)
                for (int j = 0; j < REUSE_K; j++)
                    wr[j] = bf16_to_f32(((const uint16_t *)(const void *)W)[r * REUSE_K + j]);
            else
                quant_row_dequant(t, stored + (size_t)r * rb, REUSE_K, wr);
            double acc = 0;
            for (int j = 0; j < REUSE_K; j++)
                acc += (double)wr[j] * (nv ? xv[j] * sc * nv[j] : xv[j]);
            cr_assert(fabs(yv[r] - acc) <= 1e-4 * (1 + sqrt((double)REUSE_K)), "GEMV %d: y[%d] = %.7g, want %.7g", i,
                      r, yv[r], acc);
        }
        free(stored);
    }
    unsigned long (*count)(void) = (unsigned long (*)(void))(uintptr_t)dlsym(hk.dl, "megac_xreuse_count");
    cr_assert(count);
    cr_assert_eq(count(), 2, "%lu GEMVs reused their input, want 2 (the second of each same pair)", count());
    host_kernel_close(&hk);
}

/* A 16-byte read of a GEMV's staged input, as kernel_body.cuh's
 * MK_BANK_TRACE records it. */
typedef struct {
    unsigned gemv, tid, seq, word;
} BankRead;

static int bank_read_cmp(const void *a, const void *b)
{
    const BankRead *x = a, *y = b;
    if (x->gemv != y->gemv)
        return x->gemv < y->gemv ? -1 : 1;
    if (x->tid / 32 != y->tid / 32)
        return x->tid / 32 < y->tid / 32 ? -1 : 1;
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return x->tid < y->tid ? -1 : x->tid > y->tid;
}

/* The passes a GPU's shared memory makes of one quarter-warp's 16-byte
 * reads (n of them, at 4-byte words w[]): the most distinct float4s that
 * meet on one of the 32 banks (the same float4 is one read, broadcast). */
static int bank_passes(const unsigned *w, int n)
{
    int most = 0;
    for (int bank = 0; bank < 32; bank++) {
        unsigned seen[8];
        int ns = 0;
        for (int i = 0; i < n; i++) {
            if ((w[i] & 31u) / 4 != (unsigned)bank / 4)
                continue;
            bool dup = false;
            for (int j = 0; j < ns; j++)
                dup = dup || seen[j] == w[i] / 4;
            if (!dup)
                seen[ns++] = w[i] / 4;
        }
        most = ns > most ? ns : most;
    }
    return most;
}

/* A GEMV lane reads 1 (f32), 2 (bf16) or 4 (W8) float4s of the staged
 * input per 16-byte weight load; shared memory serves 16-byte reads a
 * quarter-warp at a time. Replayed from the kernel's own reads (the
 * MK_BANK_TRACE build of gemv_schedule, grouped by warp and read number,
 * which is the instruction a warp runs together), every quarter-warp read
 * takes one pass: with x staged in order, bf16 took two and W8 four. */
Test(cuda_host, gemv_input_reads_take_one_pass)
{
    enum { N = GEMV_N };
    GemvCase c[N];
    HostKernel hk;
    setenv("MEGAC_CUDA_DEFINES", "MK_BANK_TRACE=1", 1);
    host_kernel_open(&hk, gemv_schedule(c));
    unsetenv("MEGAC_CUDA_DEFINES");
    gemv_fill(&hk);
    host_kernel_step(&hk, 0);
    unsigned long (*trace)(const BankRead **) =
        (unsigned long (*)(const BankRead **))(uintptr_t)dlsym(hk.dl, "megac_bank_trace");
    cr_assert(trace, "the MK_BANK_TRACE kernel exports megac_bank_trace");
    const BankRead *r0;
    size_t n = trace(&r0);
    cr_assert(n > 0 && n < (1u << 20), "%zu reads recorded", n);
    BankRead *r = malloc(n * sizeof *r);
    memcpy(r, r0, n * sizeof *r);
    qsort(r, n, sizeof *r, bank_read_cmp);
    long quarters[N] = {0}, passes[N] = {0};
    for (size_t i = 0; i < n;) {
        size_t e = i;
        while (e < n && r[e].gemv == r[i].gemv && r[e].tid / 32 == r[i].tid / 32 && r[e].seq == r[i].seq)
            e++;
        cr_assert(r[i].gemv >= 1 && r[i].gemv <= N);
        for (unsigned q = 0; q < 4; q++) {
            unsigned w[8];
            int nw = 0;
            for (size_t j = i; j < e; j++)
                if (r[j].tid % 32 / 8 == q)
                    w[nw++] = r[j].word;
            if (nw) {
                quarters[r[i].gemv - 1]++;
                passes[r[i].gemv - 1] += bank_passes(w, nw);
            }
        }
        i = e;
    }
    free(r);
    for (int i = 0; i < N; i++) {
        int dt = gemv_spec[i][5];
        const char *name = dtype_name((DType)dt);
        cr_log_info("case %d (%s, rows [%d, %d), k %d): %ld quarter-warp reads, %ld passes", i, name, c[i].r0,
                    c[i].r1, c[i].k, quarters[i], passes[i]);
        cr_expect_eq(passes[i], quarters[i], "case %d (%s, k %d): %ld passes for %ld quarter-warp reads", i, name,
                     c[i].k, passes[i], quarters[i]);
    }
    /* not vacuous: each weight dtype read its staged input in 16 bytes */
    for (int i = 0; i < N; i++) { /* all but the odd-length rows and the unstaged input */
        int k = gemv_spec[i][3], dt = gemv_spec[i][5];
        bool odd = (dt == DT_F32 && k % 4) || (dt == DT_BF16 && k % 8);
        cr_assert(quarters[i] > 0 || odd || k > 8192, "case %d read no float4", i);
    }
    host_kernel_close(&hk);
}

/* ---- host-cuda: sparse attention, eviction and Quest, op by op ---- */


/* Two waits in a row, the second stuck: the watchdog names it (pc 3 of
 * gemv, signal, wait, wait, gemv), every thread of the block stops (the
 * stop flag once lived in shared memory, and thread 0 rewrote it at the
 * second wait before the others had read it after the first: on the host
 * shim the block deadlocked), and the GEMV after it never runs. The GEMV's
 * first weight loads go out before the run (mk_gemv_preload), and the run
 * is still waited for wait by wait. */
Test(cuda_host, wait_run_before_gemv_names_the_stuck_wait)
{
    Schedule *s = sched_new("waitrun", "host-cuda", 1);
    s->shape = (ModelShape){.dim = 64, .hidden_dim = 64, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                            .head_dim = 8, .vocab_size = 16, .max_seq = 16, .norm_eps = 1e-5};
    int64_t wn[2] = {8, 64}, kn = 64, rn = 8;
    uint32_t w = sched_add_buffer(s, "w", DT_F32, BUF_WEIGHT, 2, wn);
    uint32_t x = sched_add_buffer(s, "x", DT_F32, BUF_STATE, 1, &kn);
    uint32_t y0 = sched_add_buffer(s, "y0", DT_F32, BUF_STATE, 1, &rn), y1 = sched_add_buffer(s, "y1", DT_F32, BUF_STATE, 1, &rn);
    uint32_t c = sched_add_counter(s, "c");
    int32_t p[OP_MAX_PARAMS] = {0, 8, 64, 0};
    for (int i = 0; i < 2; i++) {
        Access acc[5] = {{w, ACC_R, affine_const(0), affine_const(8 * 64)},
                         {x, ACC_R, affine_const(0), affine_const(64)},
                         {i ? y1 : y0, ACC_W, affine_const(0), affine_const(8)},
                         {BUF_NONE, ACC_R, affine_const(0), affine_const(0)},
                         {BUF_NONE, ACC_R, affine_const(0), affine_const(0)}};
        if (i) {
            sched_signal(s, 0, c, 1);
            sched_wait(s, 0, c, 1);
            sched_wait(s, 0, c, 5);
        }
        sched_op(s, 0, OP_GEMV, p, acc);
    }
    HostKernel k;
    host_kernel_open(&k, s);
    host_fill(&k, w);
    host_fill(&k, x);
    uint32_t ctr[1] = {0};
    MegacAbort ab;
    memset(&ab, 0, sizeof ab);
    MegacArgs args = {k.weights, k.arena, ctr, &ab, 0, 20000000ull, -1, 0, 0};
    k.fn(&args, 0);
    cr_assert_eq(ab.flag, 1u, "flag %u: not a timeout (KT_ABORT_TIMEOUT)", ab.flag);
    cr_assert_eq(ab.pc, 3u, "the stuck wait is instruction 3, not %u", ab.pc);
    cr_assert_eq(ab.counter, c);
    cr_assert_eq(ab.value, 1u);
    cr_assert_eq(ab.threshold, 5u);
    const float *W = host_buf(&k, w), *xv = host_buf(&k, x), *Y0 = host_buf(&k, y0), *Y1 = host_buf(&k, y1);
    for (int r = 0; r < 8; r++) {
        double want = 0;
        for (int j = 0; j < 64; j++)
            want += (double)W[r * 64 + j] * xv[j];
        cr_assert(fabs(Y0[r] - want) <= 1e-4, "y0[%d] = %.7g, want %.7g", r, Y0[r], want);
        cr_assert_eq(Y1[r], 0.0f, "the GEMV after the stuck wait ran");
    }
    host_kernel_close(&k);
}

/* hd 40 (two elements per lane, the second pass partly empty), 3 q heads
 * per kv head, 256 positions. */
enum { SP_HD = 40, SP_NH = 6, SP_NKV = 2, SP_G = 3, SP_S = 256, SP_E = SP_HD + 2 };

static ModelShape sp_shape(void)
{
    return (ModelShape){.dim = SP_NH * SP_HD, .hidden_dim = 64, .n_layers = 1, .n_heads = SP_NH,
                        .n_kv_heads = SP_NKV, .head_dim = SP_HD, .vocab_size = 16, .max_seq = SP_S,
                        .norm_eps = 1e-5};
}

/* With `wide`, a GEMV over 504 inputs that the step also runs widens the
 * shared scratch to 4 attention warps (MK_AW) and 504 rows per chunk of
 * attn_sparse; without it, one warp and chunks of 128 rows. */
static void sp_widen(Schedule *s, bool wide)
{
    if (!wide)
        return;
    uint32_t w = test_buf(s, "gemv.w", DT_F32, BUF_WEIGHT, 1, 504, 0);
    uint32_t x = test_buf(s, "gemv.x", DT_F32, BUF_SCRATCH, 504, 0, 0), y = test_buf(s, "gemv.y", DT_F32, BUF_SCRATCH, 1, 0, 0);
    test_op(s, OP_GEMV, (int32_t[]){0, 1, 504, 0}, (uint32_t[]){w, x, y, BUF_NONE, BUF_NONE});
}

/* Relative closeness; infinities must be equal. */
static bool close_rel(double x, double y, double rtol)
{
    if (isinf(x) || isinf(y))
        return x == y;
    return fabs(x - y) <= rtol * fmax(1.0, fabs(y));
}

/* ATTN_SPARSE with every row 0..pos selected (sink_window with the window
 * covering all, Quest with every page in order, slots with cap = S) gives
 * OP_ATTN's partials (block 32), at nsplit 1 and 3 and positions on both
 * sides of a block edge and past a chunk of rows. */
static void sp_all_rows_check(bool wide)
{
    Schedule *s = sched_new("sparse-all", "host-cuda", 1);
    s->shape = sp_shape();
    sp_widen(s, wide);
    enum { PAGE = 8, NP = SP_S / PAGE };
    uint32_t q = test_buf(s, "q", DT_F32, BUF_SCRATCH, SP_NH * SP_HD, 0, 0);
    uint32_t kc = test_buf(s, "kc", DT_F32, BUF_KV, SP_NKV, SP_S, SP_HD);
    uint32_t vc = test_buf(s, "vc", DT_F32, BUF_KV, SP_NKV, SP_S, SP_HD);
    uint32_t sel = test_buf(s, "sel", DT_I32, BUF_SCRATCH, SP_NKV, NP, 0);
    static const int nsplits[2] = {1, 3};
    uint32_t part[2][4];
    for (int i = 0; i < 2; i++) {
        int ns = nsplits[i];
        char sname[32];
        snprintf(sname, sizeof sname, "score%d", ns);
        uint32_t score = test_buf(s, sname, DT_F32, BUF_SCRATCH, SP_NH, ns * sparse_score_rows(SP_S, ns), 0);
        for (int kind = 0; kind < 4; kind++) {
            char name[32];
            snprintf(name, sizeof name, "part%d.%d", ns, kind);
            part[i][kind] = test_buf(s, name, DT_F32, BUF_SCRATCH, SP_NKV * ns, SP_G, SP_E);
        }
        for (int h = 0; h < SP_NKV; h++)
            for (int sp = 0; sp < ns; sp++) {
                test_op(s, OP_ATTN, (int32_t[]){h, sp, ns, SPARSE_BLOCK, 0}, (uint32_t[]){q, kc, vc, part[i][3], BUF_NONE});
                test_op(s, OP_ATTN_SPARSE, (int32_t[]){h, sp, ns, SPARSE_SINK_WINDOW, 4, SP_S},
                        (uint32_t[]){q, kc, vc, part[i][0], BUF_NONE});
                test_op(s, OP_ATTN_SPARSE, (int32_t[]){h, sp, ns, SPARSE_QUEST, PAGE, NP},
                        (uint32_t[]){q, kc, vc, part[i][1], sel});
                test_op(s, OP_ATTN_SPARSE, (int32_t[]){h, sp, ns, SPARSE_SLOTS, SP_S, 1},
                        (uint32_t[]){q, kc, vc, part[i][2], score});
            }
    }
    HostKernel k;
    host_kernel_open(&k, s);
    int *selv = host_buf(&k, sel);
    for (int i = 0; i < SP_NKV * NP; i++)
        selv[i] = i % NP;
    static const int poss[] = {0, 5, 31, 32, 70, 200, 255};
    int same = 0, total = 0;
    for (size_t pi = 0; pi < sizeof poss / sizeof poss[0]; pi++) {
        host_fill(&k, q);
        host_fill(&k, kc);
        host_fill(&k, vc);
        host_kernel_step(&k, poss[pi]);
        for (int i = 0; i < 2; i++) {
            const float *want = host_buf(&k, part[i][3]);
            int64_t n = (int64_t)SP_NKV * nsplits[i] * SP_G * SP_E;
            for (int kind = 0; kind < 3; kind++) {
                const float *got = host_buf(&k, part[i][kind]);
                for (int64_t j = 0; j < n; j++) {
                    cr_assert(close_rel(got[j], want[j], 1e-5), "kind %d, nsplit %d, pos %d: part[%lld] = %.9g, attn %.9g",
                              kind, nsplits[i], poss[pi], (long long)j, got[j], want[j]);
                    same += memcmp(&got[j], &want[j], sizeof(float)) == 0;
                    total++;
                }
            }
        }
    }
    cr_log_info("attn_sparse vs attn (%s): %d of %d partial values bitwise equal", wide ? "4 warps" : "1 warp", same,
                total);
    host_kernel_close(&k);
}

/* attn with rope = 1 on unrotated q gives the partials of rope then attn
 * (rope = 0) bit for bit, and leaves q alone: both pairings, 3 splits,
 * positions on both sides of a block edge. hd 40 spans two lanes' slots. */
Test(cuda_host, attn_rope_is_rope_then_attn, .timeout = 120)
{
    for (int pairing = 0; pairing < 2; pairing++) {
        Schedule *s = sched_new("attn-rope", "host-cuda", 1);
        s->shape = sp_shape();
        s->shape.rope_pairing = (RopePairing)pairing;
        uint32_t qa = test_buf(s, "qa", DT_F32, BUF_SCRATCH, SP_NH * SP_HD, 0, 0);
        uint32_t qb = test_buf(s, "qb", DT_F32, BUF_SCRATCH, SP_NH * SP_HD, 0, 0);
        uint32_t kc = test_buf(s, "kc", DT_F32, BUF_KV, SP_NKV, SP_S, SP_HD);
        uint32_t vc = test_buf(s, "vc", DT_F32, BUF_KV, SP_NKV, SP_S, SP_HD);
        uint32_t rope = test_buf(s, "rope", DT_F32, BUF_WEIGHT, SP_S, SP_HD / 2, 2);
        uint32_t pa = test_buf(s, "pa", DT_F32, BUF_SCRATCH, SP_NKV * 3, SP_G, SP_E);
        uint32_t pb = test_buf(s, "pb", DT_F32, BUF_SCRATCH, SP_NKV * 3, SP_G, SP_E);
        test_op(s, OP_ROPE, (int32_t[]){0, SP_NH}, (uint32_t[]){qa, rope});
        for (int h = 0; h < SP_NKV; h++)
            for (int sp = 0; sp < 3; sp++) {
                test_op(s, OP_ATTN, (int32_t[]){h, sp, 3, SPARSE_BLOCK, 0}, (uint32_t[]){qa, kc, vc, pa, BUF_NONE});
                test_op(s, OP_ATTN, (int32_t[]){h, sp, 3, SPARSE_BLOCK, 1}, (uint32_t[]){qb, kc, vc, pb, rope});
            }
        HostKernel k;
        host_kernel_open(&k, s);
        host_fill(&k, rope);
        host_fill(&k, kc);
        host_fill(&k, vc);
        static const int poss[] = {0, 31, 32, 100, 255};
        for (size_t pi = 0; pi < sizeof poss / sizeof poss[0]; pi++) {
            float q0[SP_NH * SP_HD];
            host_fill(&k, qb);
            memcpy(q0, host_buf(&k, qb), sizeof q0);
            memcpy(host_buf(&k, qa), q0, sizeof q0);
            host_kernel_step(&k, poss[pi]);
            cr_assert(memcmp(host_buf(&k, pa), host_buf(&k, pb), sizeof(float) * SP_NKV * 3 * SP_G * SP_E) == 0,
                      "pairing %d, pos %d: partials differ", pairing, poss[pi]);
            cr_assert(memcmp(host_buf(&k, qb), q0, sizeof q0) == 0, "attn with rope wrote q");
        }
        host_kernel_close(&k);
    }
}

Test(cuda_host, attn_sparse_all_rows_is_attn, .timeout = 120)
{
    sp_all_rows_check(false);
    sp_all_rows_check(true);
}

/* The rows ATTN_SPARSE reads, by the text of ops.h: each kind's runs, in
 * order, for kv head h at pos. */
static int sp_rows(int kind, int a, int b, const int *sel, int pos, int *rows)
{
    int n = 0;
    if (kind == SPARSE_SINK_WINDOW) {
        for (int t = 0; t < a && t <= pos; t++)
            rows[n++] = t;
        for (int t = a > pos + 1 - b ? a : pos + 1 - b; t <= pos; t++)
            rows[n++] = t;
    } else if (kind == SPARSE_QUEST) {
        for (int j = 0; j < b; j++)
            for (int t = sel[j] * a; sel[j] >= 0 && t < (sel[j] + 1) * a && t <= pos; t++)
                rows[n++] = t;
    } else if (kind == SPARSE_ROWS) { /* sel: kv head a's list */
        for (int j = 0; j < b; j++)
            if (sel[j] >= 0 && sel[j] <= pos)
                rows[n++] = sel[j];
    } else {
        for (int t = 0; t <= pos && t < a; t++)
            rows[n++] = t;
    }
    return n;
}

/* Double attention of q head qh (q: that head) over rows[0:n] of kh/vh
 * (rows of hd): the max score m, the sum l of e^(score - m) and
 * o = sum e^(score - m) v. */
static void sp_attend(const float *q, const float *kh, const float *vh, const int *rows, int n, double *m,
                      double *l, double *o)
{
    *m = -INFINITY;
    *l = 0;
    double sc[SP_S];
    for (int i = 0; i < n; i++) {
        double d = 0;
        for (int j = 0; j < SP_HD; j++)
            d += (double)q[j] * kh[(int64_t)rows[i] * SP_HD + j];
        sc[i] = d / sqrt((double)SP_HD);
        *m = sc[i] > *m ? sc[i] : *m;
    }
    for (int j = 0; j < SP_HD; j++)
        o[j] = 0;
    for (int i = 0; i < n; i++) {
        double e = exp(sc[i] - *m);
        *l += e;
        for (int j = 0; j < SP_HD; j++)
            o[j] += e * vh[(int64_t)rows[i] * SP_HD + j];
    }
}

typedef struct {
    int kind, a, b, ns;
    uint32_t kc, vc, part, aux;
} SpCase;

/* The row lists of sp_rows_check's rows cases, [SP_NKV][SP_NR]. */
enum { SP_NR = 7 };
static const int sp_listv[SP_NKV * SP_NR] = {0, 5, 6, 7, 33, 90, -1, 2, 3, 64, 65, 66, 120, 249};

/* Each split's partial against a double attention over exactly its rows
 * (the entries of its blocks of 32 in the kind's row list, ir/ops.h): m, l, o/l, or
 * zeros, -inf, 0 when empty; the splits merged in the test against one
 * attention over all the rows. */
static void sp_case_check(HostKernel *k, const SpCase *c, uint32_t qb, const int *sel, int pos, int ci)
{
    const float *q = host_buf(k, qb), *kc = host_buf(k, c->kc), *vc = host_buf(k, c->vc);
    const float *part = host_buf(k, c->part);
    int64_t hstride = (int64_t)(c->kind == SPARSE_SLOTS ? c->a : SP_S) * SP_HD;
    int rows[SP_S], srows[SP_S];
    double m, l, o[SP_HD];
    for (int h = 0; h < SP_NKV; h++) {
        const int *hs = c->kind == SPARSE_ROWS ? sp_listv + c->a * c->b : sel ? sel + h * c->b : NULL;
        int n = sp_rows(c->kind, c->a, c->b, hs, pos, rows);
        for (int g = 0; g < SP_G; g++) {
            const float *qh = q + (h * SP_G + g) * SP_HD;
            double M = -INFINITY, L = 0, O[SP_HD] = {0};
            for (int sp = 0; sp < c->ns; sp++) { /* the merge, as attn_combine does it */
                const float *p = part + ((int64_t)(h * c->ns + sp) * SP_G + g) * SP_E;
                M = p[SP_HD] > M ? p[SP_HD] : M;
            }
            for (int sp = 0; sp < c->ns; sp++) {
                const float *p = part + ((int64_t)(h * c->ns + sp) * SP_G + g) * SP_E;
                int ns = 0;
                int nb = (n + SPARSE_BLOCK - 1) / SPARSE_BLOCK; /* split sp: blocks [sp*nb/ns, (sp+1)*nb/ns) */
                for (int e = 0; e < n; e++)
                    if (sp * nb / c->ns <= e / SPARSE_BLOCK && e / SPARSE_BLOCK < (sp + 1) * nb / c->ns)
                        srows[ns++] = rows[e];
                if (ns == 0) {
                    for (int j = 0; j < SP_HD; j++)
                        cr_assert_eq(p[j], 0.0f, "case %d: empty split %d of head %d: o[%d] = %g", ci, sp, h, j, p[j]);
                    cr_assert(isinf(p[SP_HD]) && p[SP_HD] < 0 && p[SP_HD + 1] == 0.0f, "case %d: empty split m, l",
                              ci);
                    continue;
                }
                sp_attend(qh, kc + h * hstride, vc + h * hstride, srows, ns, &m, &l, o);
                cr_assert(fabs(p[SP_HD] - m) <= 1e-5 * (1 + fabs(m)), "case %d pos %d h %d g %d split %d: m %.9g, want %.9g",
                          ci, pos, h, g, sp, p[SP_HD], m);
                cr_assert(fabs(p[SP_HD + 1] - l) <= 1e-5 * l, "case %d pos %d: l %.9g, want %.9g", ci, pos,
                          p[SP_HD + 1], l);
                for (int j = 0; j < SP_HD; j++)
                    cr_assert(fabs(p[j] / p[SP_HD + 1] - o[j] / l) <= 1e-5, "case %d pos %d h %d split %d: o[%d]", ci,
                              pos, h, sp, j);
                double e = exp(p[SP_HD] - M);
                L += p[SP_HD + 1] * e;
                for (int j = 0; j < SP_HD; j++)
                    O[j] += p[j] * e;
            }
            if (n == 0) { /* nothing selected (Quest pages past pos): every split empty */
                cr_assert_eq(L, 0.0);
                continue;
            }
            sp_attend(qh, kc + h * hstride, vc + h * hstride, rows, n, &m, &l, o);
            for (int j = 0; j < SP_HD; j++)
                cr_assert(fabs(O[j] / L - o[j] / l) <= 1e-5, "case %d pos %d h %d g %d: merged out[%d] = %.9g, want %.9g",
                          ci, pos, h, g, j, O[j] / L, o[j] / l);
        }
    }
}

/* ATTN_SPARSE of each kind against a double attention over exactly the
 * rows ops.h says: sink_window (the runs apart, adjacent, and inside the
 * sinks), Quest with a hand-written sel (gaps, adjacent pages, -1, a page
 * past pos, a partial page), slots below and at the cap (with scores =
 * q.k/sqrt(hd) for the rows read, the rest untouched, and without), and
 * lists of rows, every kv head reading kv head a's (-1, rows past pos). */
static void sp_rows_check(bool wide)
{
    Schedule *s = sched_new("sparse-rows", "host-cuda", 1);
    s->shape = sp_shape();
    sp_widen(s, wide);
    enum { CAP = 48, NPG = 5 };
    uint32_t q = test_buf(s, "q", DT_F32, BUF_SCRATCH, SP_NH * SP_HD, 0, 0);
    uint32_t kc = test_buf(s, "kc", DT_F32, BUF_KV, SP_NKV, SP_S, SP_HD);
    uint32_t vc = test_buf(s, "vc", DT_F32, BUF_KV, SP_NKV, SP_S, SP_HD);
    uint32_t ks = test_buf(s, "ks", DT_F32, BUF_KV, SP_NKV, CAP, SP_HD);
    uint32_t vs = test_buf(s, "vs", DT_F32, BUF_KV, SP_NKV, CAP, SP_HD);
    uint32_t sel = test_buf(s, "sel", DT_I32, BUF_SCRATCH, SP_NKV, NPG, 0);
    uint32_t score = test_buf(s, "score", DT_F32, BUF_SCRATCH, SP_NH, sparse_score_rows(CAP, 1), 0);
    uint32_t score2 = test_buf(s, "score2", DT_F32, BUF_SCRATCH, SP_NH, 2 * sparse_score_rows(CAP, 2), 0);
    uint32_t list = test_buf(s, "list", DT_I32, BUF_SCRATCH, SP_NKV, SP_NR, 0);
    SpCase cs[] = {
        {SPARSE_SINK_WINDOW, 5, 60, 2, kc, vc, 0, BUF_NONE}, {SPARSE_SINK_WINDOW, 3, 7, 1, kc, vc, 0, BUF_NONE},
        {SPARSE_QUEST, 8, NPG, 3, kc, vc, 0, sel},          {SPARSE_QUEST, 8, NPG, 1, kc, vc, 0, sel},
        {SPARSE_SLOTS, CAP, 1, 1, ks, vs, 0, score},        {SPARSE_SLOTS, CAP, 0, 2, ks, vs, 0, BUF_NONE},
        {SPARSE_SINK_WINDOW, 10, 200, 1, kc, vc, 0, BUF_NONE}, {SPARSE_SLOTS, CAP, 1, 2, ks, vs, 0, score2},
        {SPARSE_ROWS, 1, SP_NR, 2, kc, vc, 0, list},        {SPARSE_ROWS, 0, SP_NR, 1, kc, vc, 0, list},
    };
    enum { NC = sizeof cs / sizeof cs[0] };
    for (int i = 0; i < NC; i++) {
        char name[32];
        snprintf(name, sizeof name, "part%d", i);
        cs[i].part = test_buf(s, name, DT_F32, BUF_SCRATCH, SP_NKV * cs[i].ns, SP_G, SP_E);
        for (int h = 0; h < SP_NKV; h++)
            for (int sp = 0; sp < cs[i].ns; sp++)
                test_op(s, OP_ATTN_SPARSE, (int32_t[]){h, sp, cs[i].ns, cs[i].kind, cs[i].a, cs[i].b},
                        (uint32_t[]){q, cs[i].kc, cs[i].vc, cs[i].part, cs[i].aux});
    }
    HostKernel k;
    host_kernel_open(&k, s);
    static const int selv[SP_NKV * NPG] = {1, 3, 4, -1, 12, 0, 2, 8, 15, -1};
    memcpy(host_buf(&k, sel), selv, sizeof selv);
    memcpy(host_buf(&k, list), sp_listv, sizeof sp_listv);
    static const int poss[] = {2, 20, 47, 64, 100, 127, 250};
    for (size_t pi = 0; pi < sizeof poss / sizeof poss[0]; pi++) {
        int pos = poss[pi];
        host_fill(&k, q);
        host_fill(&k, kc);
        host_fill(&k, vc);
        host_fill(&k, ks);
        host_fill(&k, vs);
        const uint32_t scb[2] = {score, score2};
        for (int i = 0; i < 2; i++)
            for (int64_t j = 0; j < k.s->bufs[scb[i]].nelem; j++)
                ((float *)host_buf(&k, scb[i]))[j] = 12345.0f;
        host_kernel_step(&k, pos);
        for (int i = 0; i < NC; i++)
            sp_case_check(&k, &cs[i], q, selv, pos, i);
        const float *qv = host_buf(&k, q), *kv = host_buf(&k, ks);
        int n = pos + 1 < CAP ? pos + 1 : CAP;
        for (int i = 0; i < 2; i++) { /* the scores of the rows read, where ops.h puts them; nothing else */
            float *sc = host_buf(&k, scb[i]);
            for (int qh = 0; qh < SP_NH; qh++)
                for (int t = 0; t < n; t++) {
                    int64_t at = test_score_index(qh, t, n, CAP, i + 1, SP_G);
                    cr_assert(at >= 0);
                    double d = 0;
                    for (int j = 0; j < SP_HD; j++)
                        d += (double)qv[qh * SP_HD + j] * kv[((qh / SP_G) * CAP + t) * SP_HD + j];
                    d /= sqrt((double)SP_HD);
                    cr_assert(fabs(sc[at] - d) <= 1e-5 * (1 + fabs(d)),
                              "%d splits, pos %d: score of q head %d, slot %d = %.9g, want %.9g", i + 1, pos, qh, t,
                              sc[at], d);
                    sc[at] = 12345.0f;
                }
            for (int64_t j = 0; j < k.s->bufs[scb[i]].nelem; j++)
                cr_assert_eq(sc[j], 12345.0f, "%d splits, pos %d: score entry %lld, no read row's, written", i + 1, pos,
                             (long long)j);
        }
    }
    host_kernel_close(&k);
}

Test(cuda_host, attn_sparse_rows_match_double, .timeout = 120)
{
    sp_rows_check(false);
    sp_rows_check(true);
}

/* KV_STORE: at pos 0 meta is emptied and slot 0 taken; later the slot
 * meta[h][cap] names (kept apart per head), a slot out of range as 0;
 * only that slot's rows and meta entry change. */
Test(cuda_host, kv_store_places_rows, .timeout = 120)
{
    Schedule *s = sched_new("kv-store", "host-cuda", 1);
    s->shape = sp_shape();
    enum { CAP = 6, M = CAP + 1 };
    uint32_t k = test_buf(s, "k", DT_F32, BUF_SCRATCH, SP_NKV * SP_HD, 0, 0);
    uint32_t v = test_buf(s, "v", DT_F32, BUF_SCRATCH, SP_NKV * SP_HD, 0, 0);
    uint32_t kc = test_buf(s, "kc", DT_F32, BUF_KV, SP_NKV, CAP, SP_HD);
    uint32_t vc = test_buf(s, "vc", DT_F32, BUF_KV, SP_NKV, CAP, SP_HD);
    uint32_t meta = test_buf(s, "meta", DT_I32, BUF_STATE, SP_NKV, M, 0);
    for (int h = 0; h < SP_NKV; h++)
        test_op(s, OP_KV_STORE, (int32_t[]){h, CAP}, (uint32_t[]){k, v, kc, vc, meta});
    HostKernel hk;
    host_kernel_open(&hk, s);
    int *mt = host_buf(&hk, meta);
    float *kcv = host_buf(&hk, kc), *vcv = host_buf(&hk, vc);
    const float *kv = host_buf(&hk, k), *vv = host_buf(&hk, v);
    /* pos, meta[h][cap] before the step (pos 0: garbage), the slot */
    static const int steps[][5] = {{0, 77, 3, 0, 0}, {1, 3, 5, 3, 5}, {2, 9, -2, 0, 0}, {3, 1, 1, 1, 1},
                                   {0, 4, 2, 0, 0}};
    int want[SP_NKV * M];
    float kwant[SP_NKV * CAP * SP_HD], vwant[SP_NKV * CAP * SP_HD];
    host_fill(&hk, kc);
    host_fill(&hk, vc);
    for (int i = 0; i < SP_NKV * M; i++)
        mt[i] = 1000 + i;
    for (size_t st = 0; st < sizeof steps / sizeof steps[0]; st++) {
        int pos = steps[st][0];
        for (int h = 0; h < SP_NKV; h++)
            mt[h * M + CAP] = steps[st][1 + h];
        memcpy(want, mt, sizeof want);
        memcpy(kwant, kcv, sizeof kwant);
        memcpy(vwant, vcv, sizeof vwant);
        host_fill(&hk, k);
        host_fill(&hk, v);
        for (int h = 0; h < SP_NKV; h++) {
            int slot = steps[st][3 + h];
            if (pos == 0) {
                for (int t = 0; t < CAP; t++)
                    want[h * M + t] = -1;
                want[h * M + CAP] = 0;
            }
            want[h * M + slot] = pos;
            memcpy(kwant + (h * CAP + slot) * SP_HD, kv + h * SP_HD, sizeof(float) * SP_HD);
            memcpy(vwant + (h * CAP + slot) * SP_HD, vv + h * SP_HD, sizeof(float) * SP_HD);
        }
        host_kernel_step(&hk, pos);
        for (int i = 0; i < SP_NKV * M; i++)
            cr_assert_eq(mt[i], want[i], "step %zu (pos %d): meta[%d][%d] = %d, want %d", st, pos, i / M, i % M, mt[i],
                         want[i]);
        cr_assert(memcmp(kcv, kwant, sizeof kwant) == 0 && memcmp(vcv, vwant, sizeof vwant) == 0,
                  "step %zu (pos %d): kc/vc differ from the expected slots", st, pos);
    }
    host_kernel_close(&hk);
}

/* The Quest selection of ops.h in double, from the kernel's bounds:
 * page c, then the np-1 other pages of largest U (the lower on ties), in
 * ascending order, -1 after. */
static void quest_want(const float *q, const float *bh, int h, int c, int np, int *sel)
{
    double u[SP_S];
    bool taken[SP_S] = {false};
    for (int j = 0; j < c; j++) {
        u[j] = 0;
        for (int i = 0; i < SP_HD; i++)
            for (int g = 0; g < SP_G; g++) {
                double qq = q[(h * SP_G + g) * SP_HD + i], lo = bh[j * 2 * SP_HD + i], hi = bh[j * 2 * SP_HD + SP_HD + i];
                u[j] += fmax(qq * lo, qq * hi);
            }
    }
    taken[c] = true;
    for (int r = 1; r < np; r++) {
        int best = -1;
        for (int j = 0; j < c; j++)
            if (!taken[j] && (best < 0 || u[j] > u[best]))
                best = j;
        if (best >= 0)
            taken[best] = true;
    }
    int n = 0;
    for (int j = 0; j <= c; j++)
        if (taken[j])
            sel[n++] = j;
    while (n < np)
        sel[n++] = -1;
}

/* QUEST_SELECT over a decode of 256 steps (32 pages): the bounds of the current
 * page are the exact min and max of its rows so far (earlier pages keep
 * theirs), and sel matches a double selection on well-separated bounds
 * (each page's rows around its own offset, positive and negative; q all
 * positive for one kv head, all negative for the other), with np = 1,
 * 4 and more pages than exist. Pages 5 and 9 hold the same rows: an
 * exact tie at the cut, which the lower page wins. */
Test(cuda_host, quest_select_matches_double, .timeout = 120)
{
    Schedule *s = sched_new("quest", "host-cuda", 1);
    s->shape = sp_shape();
    enum { PAGE = 8, PAGES = SP_S / PAGE };
    static const int nps[3] = {1, 4, 20};
    uint32_t q = test_buf(s, "q", DT_F32, BUF_SCRATCH, SP_NH * SP_HD, 0, 0);
    uint32_t kc = test_buf(s, "kc", DT_F32, BUF_KV, SP_NKV, SP_S, SP_HD);
    uint32_t bounds = test_buf(s, "bounds", DT_F32, BUF_STATE, SP_NKV * PAGES, 2, SP_HD);
    uint32_t sel[3];
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "sel%d", nps[i]);
        sel[i] = test_buf(s, name, DT_I32, BUF_SCRATCH, SP_NKV, nps[i], 0);
        for (int h = 0; h < SP_NKV; h++)
            test_op(s, OP_QUEST_SELECT, (int32_t[]){h, PAGE, nps[i]}, (uint32_t[]){q, kc, bounds, sel[i]});
    }
    HostKernel k;
    host_kernel_open(&k, s);
    float *qv = host_buf(&k, q), *kcv = host_buf(&k, kc), *bv = host_buf(&k, bounds);
    /* page offsets: a permutation, with pages 5 and 9 equal (third best) */
    static const int rank[PAGES] = {0, 11, 22, 5, 16, 29, 27, 30, 10, 29, 21, 4, 31, 15, 26, 9, 20, 3, 14, 25, 8, 19, 2, 13, 24, 7, 18, 1, 12, 23, 6, 17};
    for (int i = 0; i < SP_NH * SP_HD; i++)
        qv[i] = (float)((i / (SP_G * SP_HD) == 0 ? 1 : -1) * (0.75 + 0.25 * rnd()));
    for (int h = 0; h < SP_NKV; h++)
        for (int t = 0; t < SP_S; t++)
            for (int j = 0; j < SP_HD; j++) {
                int pg = t / PAGE;
                float *x = kcv + ((int64_t)h * SP_S + t) * SP_HD + j;
                *x = (float)(rank[pg] - 15.5) + 0.2f * rnd();
                if (pg == 9)
                    *x = kcv[((int64_t)h * SP_S + t - 4 * PAGE) * SP_HD + j];
            }
    for (int pos = 0; pos < SP_S; pos++) {
        host_kernel_step(&k, pos);
        int c = pos / PAGE;
        for (int h = 0; h < SP_NKV; h++) {
            const float *bh = bv + (int64_t)h * PAGES * 2 * SP_HD;
            for (int j = 0; j < SP_HD; j++) {
                float lo = INFINITY, hi = -INFINITY;
                for (int t = c * PAGE; t <= pos; t++) {
                    float x = kcv[((int64_t)h * SP_S + t) * SP_HD + j];
                    lo = x < lo ? x : lo;
                    hi = x > hi ? x : hi;
                }
                cr_assert(bh[c * 2 * SP_HD + j] == lo && bh[c * 2 * SP_HD + SP_HD + j] == hi,
                          "pos %d head %d: bounds of page %d, lane %d", pos, h, c, j);
            }
            for (int i = 0; i < 3; i++) {
                int want[20];
                const int *got = (const int *)host_buf(&k, sel[i]) + h * nps[i];
                quest_want(qv, bh, h, c, nps[i], want);
                for (int j = 0; j < nps[i]; j++)
                    cr_assert_eq(got[j], want[j], "pos %d head %d npages %d: sel[%d] = %d, want %d", pos, h, nps[i], j,
                                 got[j], want[j]);
            }
        }
    }
    const int *s4 = (const int *)host_buf(&k, sel[1]);
    cr_assert(s4[0] == 5 && s4[1] == 7 && s4[2] == 12 && s4[3] == 31, "the tie at the cut: %d %d %d %d", s4[0], s4[1],
              s4[2], s4[3]);
    host_kernel_close(&k);
}

/* TOPK_SELECT on the host-CUDA kernel, as cpu_ops.topk_select_rows checks
 * the CPU's (harness_topk_level's rows): every position, fixed k of 1, 5
 * and 40 and two growing with the rows (two rows a thread for the
 * compaction once pos passes 128). */
Test(cuda_host, topk_select_matches_ranking, .timeout = 120)
{
    Schedule *s = sched_new("topk", "host-cuda", 1);
    s->shape = sp_shape();
    uint32_t q = test_buf(s, "q", DT_F32, BUF_SCRATCH, SP_NH * SP_HD, 0, 0);
    uint32_t kc = test_buf(s, "kc", DT_F32, BUF_KV, SP_NKV, SP_S, SP_HD);
    uint32_t sc = test_buf(s, "topksc", DT_F32, BUF_SCRATCH, SP_NH + SP_NKV, SP_S, 0), sel[HARNESS_NTOPK];
    for (int i = 0; i < HARNESS_NTOPK; i++) {
        HarnessTopk c = harness_topks[i];
        char name[32];
        snprintf(name, sizeof name, "kidx%d", i);
        sel[i] = test_buf(s, name, DT_I32, BUF_SCRATCH, SP_NKV, c.k, 0);
        for (int h = 0; h < SP_NKV; h++)
            test_op(s, OP_TOPK_SELECT, (int32_t[]){h, c.k, c.b, c.ppm}, (uint32_t[]){q, kc, sc, sel[i]});
    }
    HostKernel k;
    host_kernel_open(&k, s);
    float *qv = host_buf(&k, q), *kcv = host_buf(&k, kc);
    for (int i = 0; i < SP_NH * SP_HD; i++)
        qv[i] = 0.5f + 0.5f * (float)(i % 7) / 7.0f;
    for (int h = 0; h < SP_NKV; h++)
        for (int t = 0; t < SP_S; t++)
            for (int j = 0; j < SP_HD; j++)
                kcv[((int64_t)h * SP_S + t) * SP_HD + j] = (float)(harness_topk_level(t) * (0.5 + 0.25 * (j % 3)));
    for (int pos = 0; pos < SP_S; pos++) {
        host_kernel_step(&k, pos);
        for (int i = 0; i < HARNESS_NTOPK; i++) {
            int want[40], kk = harness_topks[i].k;
            harness_topk_want(pos, harness_topks[i], want);
            for (int h = 0; h < SP_NKV; h++) {
                const int *got = (const int *)host_buf(&k, sel[i]) + h * kk;
                for (int j = 0; j < kk; j++)
                    cr_assert_eq(got[j], want[j], "pos %d h%d case %d: sel[%d] = %d, want %d", pos, h, i, j, got[j],
                                 want[j]);
            }
        }
    }
    host_kernel_close(&k);
}

/* The eviction rules of ops.h, in double on the kernel's scores, for one
 * layer: meta[h][cap] after the step, and H2O's acc. */
static void evict_want(int pol, int cap, int sinks, int window, int pos, const float *score, int *meta, double *acc)
{
    int n = pos + 1 < cap ? pos + 1 : cap;
    double p[SP_NH][64];
    for (int qh = 0; qh < SP_NH; qh++) {
        double m = -INFINITY, l = 0;
        for (int t = 0; t < n; t++)
            m = fmax(m, score[qh * cap + t]);
        for (int t = 0; t < n; t++)
            l += exp(score[qh * cap + t] - m);
        for (int t = 0; t < n; t++)
            p[qh][t] = exp(score[qh * cap + t] - m) / l;
    }
    for (int h = 0; pol == KV_POLICY_H2O && h < SP_NKV; h++)
        for (int t = 0; t < cap; t++) {
            if (pos == 0)
                acc[h * cap + t] = 0;
            for (int g = 0; g < SP_G && t < n; g++)
                acc[h * cap + t] += p[h * SP_G + g][t];
        }
    int tova = -1;
    double best = 0;
    for (int t = 0; pol == KV_POLICY_TOVA && t < n; t++) {
        double a = 0;
        for (int qh = 0; qh < SP_NH; qh++)
            a += p[qh][t] / SP_NH;
        if (tova < 0 || a < best)
            tova = t, best = a;
    }
    for (int h = 0; h < SP_NKV; h++) {
        int *mh = meta + h * (cap + 1), victim = -1;
        if (pos + 1 < cap) {
            mh[cap] = pos + 1;
            continue;
        }
        for (int t = 0; t < cap; t++) {
            if (pol == KV_POLICY_STREAMING && mh[t] >= sinks && (victim < 0 || mh[t] < mh[victim]))
                victim = t;
            if (pol == KV_POLICY_H2O && mh[t] <= pos - window && (victim < 0 || acc[h * cap + t] < acc[h * cap + victim]))
                victim = t;
        }
        if (pol == KV_POLICY_TOVA)
            victim = tova;
        cr_assert(victim >= 0);
        mh[cap] = victim;
        if (pol == KV_POLICY_H2O)
            acc[h * cap + victim] = 0;
    }
}

/* A decode of `steps` steps through three evicting layers of cap slots
 * (streaming with 2 sinks, H2O with a window of 3, TOVA): kv_store,
 * attn_sparse slots (scores) in ns splits and kv_evict per step. After
 * each step meta (the slots' positions and the next slot: pos + 1 until
 * full, then the policy's victim) equals a test-side run of ops.h's rules
 * on the kernel's scores, the stored rows are this step's k/v, and H2O's
 * acc matches. */
static void evict_policies_check(const int CAP, int ns, int STEPS)
{
    Schedule *s = sched_new("kv-evict", "host-cuda", 1);
    s->shape = sp_shape();
    const int M = CAP + 1;
    cr_assert(CAP <= 64);
    static const int pols[3][3] = {{KV_POLICY_STREAMING, 2, 0}, {KV_POLICY_H2O, 0, 3}, {KV_POLICY_TOVA, 0, 0}};
    uint32_t q = test_buf(s, "q", DT_F32, BUF_SCRATCH, SP_NH * SP_HD, 0, 0);
    uint32_t k = test_buf(s, "k", DT_F32, BUF_SCRATCH, SP_NKV * SP_HD, 0, 0);
    uint32_t v = test_buf(s, "v", DT_F32, BUF_SCRATCH, SP_NKV * SP_HD, 0, 0);
    uint32_t kc[3], vc[3], meta[3], acc[3], score[3], part[3];
    for (int l = 0; l < 3; l++) {
        char name[32];
        snprintf(name, sizeof name, "kc%d", l);
        kc[l] = test_buf(s, name, DT_F32, BUF_KV, SP_NKV, CAP, SP_HD);
        snprintf(name, sizeof name, "vc%d", l);
        vc[l] = test_buf(s, name, DT_F32, BUF_KV, SP_NKV, CAP, SP_HD);
        snprintf(name, sizeof name, "meta%d", l);
        meta[l] = test_buf(s, name, DT_I32, BUF_STATE, SP_NKV, M, 0);
        snprintf(name, sizeof name, "acc%d", l);
        acc[l] = test_buf(s, name, DT_F32, BUF_STATE, SP_NKV, CAP, 0);
        snprintf(name, sizeof name, "score%d", l);
        score[l] = test_buf(s, name, DT_F32, BUF_SCRATCH, SP_NH, ns * sparse_score_rows(CAP, ns), 0);
        snprintf(name, sizeof name, "part%d", l);
        part[l] = test_buf(s, name, DT_F32, BUF_SCRATCH, SP_NKV * ns, SP_G, SP_E);
        for (int h = 0; h < SP_NKV; h++) {
            test_op(s, OP_KV_STORE, (int32_t[]){h, CAP}, (uint32_t[]){k, v, kc[l], vc[l], meta[l]});
            for (int sp = 0; sp < ns; sp++)
                test_op(s, OP_ATTN_SPARSE, (int32_t[]){h, sp, ns, SPARSE_SLOTS, CAP, 1},
                        (uint32_t[]){q, kc[l], vc[l], part[l], score[l]});
        }
        int pol = pols[l][0];
        test_op(s, OP_KV_EVICT, (int32_t[]){pol, CAP, pols[l][1], pols[l][2], ns},
                (uint32_t[]){pol == KV_POLICY_STREAMING ? BUF_NONE : score[l], meta[l],
                             pol == KV_POLICY_H2O ? acc[l] : BUF_NONE});
    }
    HostKernel hk;
    host_kernel_open(&hk, s);
    int want[3][SP_NKV * 65];
    double accw[3][SP_NKV * 64];
    float logical[SP_NH * 64];
    int victims[3] = {0};
    for (int pos = 0; pos < STEPS; pos++) {
        host_fill(&hk, q);
        host_fill(&hk, k);
        host_fill(&hk, v);
        for (int l = 0; l < 3; l++) {
            int *mt = host_buf(&hk, meta[l]);
            if (pos == 0)
                for (int i = 0; i < SP_NKV * M; i++)
                    mt[i] = 555; /* garbage: kv_store empties meta at pos 0 */
            for (int h = 0; h < SP_NKV; h++) {
                int *w = want[l] + h * M;
                if (pos == 0) {
                    for (int t = 0; t < CAP; t++)
                        w[t] = -1;
                    w[CAP] = 0;
                }
                w[w[CAP]] = pos;
            }
        }
        host_kernel_step(&hk, pos);
        const float *kv = host_buf(&hk, k);
        for (int l = 0; l < 3; l++) {
            const int *mt = host_buf(&hk, meta[l]);
            const float *kcv = host_buf(&hk, kc[l]);
            for (int h = 0; h < SP_NKV; h++) {
                int slot = want[l][h * M + CAP];
                cr_assert(memcmp(kcv + (h * CAP + slot) * SP_HD, kv + h * SP_HD, sizeof(float) * SP_HD) == 0,
                          "layer %d pos %d head %d: slot %d does not hold this step's k", l, pos, h, slot);
            }
            const float *sc = host_buf(&hk, score[l]);
            int n = pos + 1 < CAP ? pos + 1 : CAP;
            for (int qh = 0; qh < SP_NH; qh++) /* the scores slot by slot, from the splits' pieces */
                for (int t = 0; t < n; t++)
                    logical[qh * CAP + t] = sc[test_score_index(qh, t, n, CAP, ns, SP_G)];
            evict_want(pols[l][0], CAP, pols[l][1], pols[l][2], pos, logical, want[l], accw[l]);
            for (int i = 0; i < SP_NKV * M; i++)
                cr_assert_eq(mt[i], want[l][i], "policy %d pos %d: meta[%d][%d] = %d, want %d", pols[l][0], pos, i / M,
                             i % M, mt[i], want[l][i]);
            const float *av = host_buf(&hk, acc[l]);
            for (int i = 0; pols[l][0] == KV_POLICY_H2O && i < SP_NKV * CAP; i++)
                cr_assert(fabs(av[i] - accw[l][i]) <= 1e-5 * (1 + fabs(accw[l][i])), "h2o pos %d: acc[%d][%d] = %.9g, want %.9g",
                          pos, i / CAP, i % CAP, av[i], accw[l][i]);
            if (pos + 1 >= CAP)
                victims[l]++;
        }
        if (pos + 1 >= CAP) { /* TOVA: one victim for every head */
            const int *mt = host_buf(&hk, meta[2]);
            for (int h = 1; h < SP_NKV; h++)
                cr_assert_eq(mt[h * M + CAP], mt[CAP]);
        }
    }
    /* streaming keeps its sinks: positions 0 and 1 are still held */
    const int *ms = host_buf(&hk, meta[0]);
    for (int h = 0; h < SP_NKV; h++)
        cr_assert(ms[h * M + 0] == 0 && ms[h * M + 1] == 1, "streaming lost a sink");
    cr_assert_eq(victims[0], STEPS - CAP + 1);
    host_kernel_close(&hk);
}

/* A small cache read in one split, one of two blocks read in two (scores
 * in two pieces), and one of two blocks read in five (empty pieces
 * between full ones, as a GPU's many splits leave them). */
Test(cuda_host, kv_evict_policies_match_rules, .timeout = 120)
{
    evict_policies_check(8, 1, 24);
    evict_policies_check(40, 2, 60);
    evict_policies_check(64, 5, 90);
}

/* What the new ops' bodies cannot run is refused before any compiler
 * runs, each error naming the op: a Quest attn_sparse without sel, an
 * h2o kv_evict without acc, an f32 meta, an unknown kv_evict policy. */
Test(cuda_host, sparse_ops_refused_params)
{
    Schedule *s = sched_new("refused", "host-cuda", 1);
    s->shape = sp_shape();
    uint32_t q = test_buf(s, "q", DT_F32, BUF_SCRATCH, SP_NH * SP_HD, 0, 0);
    uint32_t kc = test_buf(s, "kc", DT_F32, BUF_KV, SP_NKV, SP_S, SP_HD);
    uint32_t part = test_buf(s, "part", DT_F32, BUF_SCRATCH, SP_NKV, SP_G, SP_E);
    uint32_t score = test_buf(s, "score", DT_F32, BUF_SCRATCH, SP_NH, 8, 0);
    uint32_t meta = test_buf(s, "meta", DT_I32, BUF_STATE, SP_NKV, 9, 0);
    uint32_t fmeta = test_buf(s, "fmeta", DT_F32, BUF_STATE, SP_NKV, 9, 0);
    Access none = {BUF_NONE, ACC_R, affine_const(0), affine_const(0)};
    Access a[5] = {{q, ACC_R, affine_const(0), affine_const(1)}, {kc, ACC_R, affine_const(0), affine_const(1)},
                   {kc, ACC_R, affine_const(0), affine_const(1)}, {part, ACC_W, affine_const(0), affine_const(1)}, none};
    sched_op(s, 0, OP_ATTN_SPARSE, (int32_t[]){0, 0, 1, SPARSE_QUEST, 8, 2}, a);
    Access e[3] = {{score, ACC_R, affine_const(0), affine_const(1)}, {meta, ACC_RW, affine_const(0), affine_const(1)},
                   none};
    sched_op(s, 0, OP_KV_EVICT, (int32_t[]){KV_POLICY_H2O, 8, 0, 2, 1, 0}, e);
    e[1].buf = fmeta;
    sched_op(s, 0, OP_KV_EVICT, (int32_t[]){KV_POLICY_TOVA, 8, 0, 0, 1, 0}, e);
    e[1].buf = meta;
    sched_op(s, 0, OP_KV_EVICT, (int32_t[]){7, 8, 0, 0, 1, 0}, e);
    sched_layout(s);
    char path[] = "/tmp/megac-cuda-refuse-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    Diag d;
    diag_init(&d);
    d.out = fdopen(fd, "w+");
    cr_assert_not(cg_hostcuda_compile(s, "/tmp/never.so", &d));
    cr_assert_eq(d.nerrors, 4);
    fflush(d.out);
    rewind(d.out);
    static char text[1 << 14];
    text[fread(text, 1, sizeof text - 1, d.out)] = 0;
    cr_assert(strstr(text, "attn_sparse operand 'aux' must be present") &&
                  strstr(text, "kv_evict operand 'acc' must be present") &&
                  strstr(text, "kv_evict operand 'meta' (buffer 'fmeta') of dtype f32") &&
                  strstr(text, "kv_evict has an unknown policy"),
              "%s", text);
    fclose(d.out);
    unlink(path);
    sched_free(s);
}

/* ---- host-cuda ---- */


/* The model's bundle for `target` at each worker count vs the reference,
 * positions [0, prompt_end] the prompt (-1: none). */
static void bundles_prompted_vs_reference(const char *yaml, const char *target, const int *workers, int nw, int ntok,
                                          int prompt_end)
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
        harness_compare_prompted(mm, r.ref, r.m.vocab_size, n, prompt_end, ATOL, RTOL, what);
        megac_close(mm);
        free(b);
    }
    test_rm_rf(dir);
    model_close(&r);
}

static void bundles_vs_reference(const char *yaml, const char *target, const int *workers, int nw, int ntok)
{
    bundles_prompted_vs_reference(yaml, target, workers, nw, ntok, -1);
}

static const int host_blocks[] = {1, 2, 3, 5};

static void sparse_synth_check(const char *target, const int *blocks, int nb, size_t first, size_t n)
{
    char *dir = tmp_dir();
    cr_assert_leq(first + n, sizeof synth_sparse / sizeof synth_sparse[0]);
    for (size_t i = first; i < first + n; i++) {
        char name[32];
        snprintf(name, sizeof name, "sparse%zu", i);
        char *yaml = write_synth_as(dir, name, synth_sparse[i]);
        bundles_prompted_vs_reference(yaml, target, blocks, nb, 100, synth_sparse_prompt_end[i]);
        free(yaml);
    }
    test_rm_rf(dir);
}

Test(cuda_host, sparse_synthetic_matches_reference, .timeout = 300)
{
    static const int b[] = {1, 3};
    sparse_synth_check("host-cuda", b, 2, 0, sizeof synth_sparse / sizeof synth_sparse[0]);
}

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

/* The kernels gpu-check times the defaults against (MEGAC_CUDA_DEFINES:
 * the program read from global memory, every GEMV input staged anew,
 * weight loads through L1) decode the synthetic model as the reference
 * does too. */
Test(cuda_host, timing_variants_match_reference, .timeout = 300)
{
    static const int w[] = {2};
    char *dir = tmp_dir(), *yaml = write_synth(dir);
    setenv("MEGAC_CUDA_DEFINES", "MK_ISTAGE=0 MK_XREUSE=0 MK_WNOALLOC=0", 1);
    bundles_vs_reference(yaml, "host-cuda", w, 1, 32);
    unsetenv("MEGAC_CUDA_DEFINES");
    free(yaml);
    test_rm_rf(dir);
}

Test(cuda_host, weight_pipe_model_matches_reference, .timeout = 300)
{
    static const int w[] = {1, 3};
    weight_pipe_check("host-cuda", "MK_WPIPE=3 MK_ROW_LANES_MIN=32", w, 2);
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
/* The synthetic model stored as each of fmts (NULL: as written, f32) on
 * `target`, against the reference. */
static void synth_formats_check(const char *target, const char *const *fmts, size_t n, const int *workers, int nw)
{
    for (size_t i = 0; i < n; i++) {
        char *dir = tmp_dir(), compile[64], *yaml;
        snprintf(compile, sizeof compile, "  quant: {default: %s}\n", fmts[i] ? fmts[i] : "f32");
        yaml = write_synth_as(dir, "synth", fmts[i] ? compile : NULL);
        cr_log_info("%s, stored as %s", target, fmts[i] ? fmts[i] : "f32");
        bundles_vs_reference(yaml, target, workers, nw, 48);
        free(yaml);
        test_rm_rf(dir);
    }
}

static void stored_formats_check(const char *target, const int *workers, int nw)
{
    static const char *const fmts[] = {"bf16", "f16", "w8a16", "w4a16-g32", "w4a16-g128"};
    synth_formats_check(target, fmts, sizeof fmts / sizeof fmts[0], workers, nw);
}

/* The synthetic model, f32 and stored as bf16 and w8a16, decoded by
 * kernels with a weight pipe of `defines` (MEGAC_CUDA_DEFINES: MK_WPIPE=S,
 * with MK_ROW_LANES_MIN=32 so that its short rows take the pipe too) as
 * the reference does: on a GPU, where cp.async is asynchronous, that is
 * the check of its groups and waits. */
static void weight_pipe_check(const char *target, const char *defines, const int *workers, int nw)
{
    static const char *const fmts[] = {NULL, "bf16", "w8a16"};
    setenv("MEGAC_CUDA_DEFINES", defines, 1);
    cr_log_info("%s: %s", target, defines);
    synth_formats_check(target, fmts, sizeof fmts / sizeof fmts[0], workers, nw);
    unsetenv("MEGAC_CUDA_DEFINES");
}

/* A tiny Llama of GGUF Q5_0/Q5_1/Q4_K/Q5_K/Q6_K blocks as stored
 * (tests/fixtures/weights/make_kquant.py) on `target`. */
static void gguf_kquant_check(const char *target, const int *workers, int nw)
{
    const char *gguf = src_path("/tests/fixtures/weights/kquant.gguf");
    if (!file_exists(gguf))
        cr_skip("tests/fixtures/weights/kquant.gguf is absent");
    char *dir = tmp_dir(), yaml[1200];
    snprintf(yaml, sizeof yaml, "%s/kquant.yaml", dir);
    FILE *f = fopen(yaml, "w");
    cr_assert(f);
    fprintf(f, "name: tiny-kquant\narch: {dim: 256, hidden_dim: 256, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
               "head_dim: 64, vocab_size: 260, max_seq: 64}\ntie_embeddings: false\n"
               "weights: {format: gguf, path: %s}\ntokenizer: {format: bytes}\n",
            gguf);
    cr_assert_eq(fclose(f), 0);
    bundles_vs_reference(yaml, target, workers, nw, 32);
    test_rm_rf(dir);
}

Test(cuda_host, gguf_kquant_matches_reference, .timeout = 300)
{
    static const int w[] = {2};
    gguf_kquant_check("host-cuda", w, 1);
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

/* In three tests, which Criterion runs side by side: each bundle is an
 * NVRTC compile of several seconds (the one test took 66-202 s and then
 * over 240 s on the H200's machine). */
static const int sparse_gpu_blocks[] = {2, 7, 0};

Test(cuda_gpu, sparse_synthetic_matches_reference, .timeout = 300)
{
    gpu_require();
    sparse_synth_check(gpu_target(), sparse_gpu_blocks, 3, 0, 3);
}

Test(cuda_gpu, sparse_synthetic_snapkv_f16_match_reference, .timeout = 300)
{
    gpu_require();
    sparse_synth_check(gpu_target(), sparse_gpu_blocks, 3, 3, 2);
}

Test(cuda_gpu, sparse_synthetic_caches_match_reference, .timeout = 300)
{
    gpu_require();
    sparse_synth_check(gpu_target(), sparse_gpu_blocks, 3, 5, 2);
}

Test(cuda_gpu, sparse_synthetic_kascade_adakv_match_reference, .timeout = 300)
{
    gpu_require();
    sparse_synth_check(gpu_target(), sparse_gpu_blocks, 3, 7, 3);
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

/* Steps without outputs on the device (harness_feed_check): the output
 * matrix skipped, no logits copied back, the state as megac_step leaves it
 * (within 1e-5 of the largest logit: the same kernel, but not promised
 * bit for bit across launches). */
Test(cuda_gpu, feed_skips_the_outputs, .timeout = 300)
{
    gpu_require();
    if (!file_exists(SHARED_PATH("/models/stories260K.bin")))
        cr_skip("../shared/models/stories260K.bin is absent");
    char *dir = tmp_dir(), *b = compile_bundle(STORIES_YAML, gpu_target(), 3, dir);
    harness_feed_check(b, 1e-5, 10);
    free(b);
    test_rm_rf(dir);
}

/* A context shift on the device (harness_shift_check): the cubin's
 * megac_kv_layout read with cuModuleGetGlobal, the rows moved through the
 * host (cuda_arena_copy), on a one-layer model with an f16 cache. */
Test(cuda_gpu, shift_drops_positions_and_turns_the_keys, .timeout = 300)
{
    gpu_require();
    char *dir = tmp_dir(), cmd[4096], b[1200];
    static char log[1 << 16];
    snprintf(b, sizeof b, "%s/shift.megac", dir);
    snprintf(cmd, sizeof cmd, "%s compile default --set arch.n_layers=1 --set compile.kv_dtype=f16 --target %s -q -o "
             "'%s' 2>&1", test_bin(), gpu_target(), b);
    cr_assert_eq(sh(cmd, log, sizeof log), 0, "%s failed:\n%s", cmd, log);
    harness_shift_check(b, 1e-3);
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

Test(cuda_gpu, weight_pipe_matches_reference, .timeout = 300)
{
    gpu_require();
    static const int w[] = {3, 0};
    weight_pipe_check(gpu_target(), "MK_WPIPE=4 MK_ROW_LANES_MIN=32", w, 2);
}

Test(cuda_gpu, gguf_kquant_matches_reference, .timeout = 300)
{
    gpu_require();
    static const int w[] = {3, 0};
    gguf_kquant_check(gpu_target(), w, 2);
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
