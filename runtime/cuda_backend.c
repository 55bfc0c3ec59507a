/*
 * cuda_backend.c - runs a kernel.sm_XX.cubin (targets sm_80, sm_90,
 * sm_120) through the CUDA driver API, loaded with dlopen (cuda_driver.c).
 *
 * Prepare (before bundle.c reads any file past the manifest): the driver,
 * device 0 (MEGAC_CUDA_DEVICE picks another), a compute capability the
 * cubin runs on. Open: the primary context, cuModuleLoadData of
 * the cubin (its size and hash checked first, by bundle.c), its constants
 * (megac_kernel_abi, megac_schedule_hash, megac_kernel_facts) checked
 * against the manifest, and the co-residency of
 * all W blocks (cuOccupancyMaxActiveBlocksPerMultiprocessor x SMs >= W: a
 * persistent kernel whose blocks are not all resident never finishes).
 * Weights are uploaded once; the arena (state, KV cache, scratch, io),
 * the counters and the abort record live on the device.
 * Step (cuda_step): the token written into the arena, counters and abort
 * record zeroed with one memset, one cooperative launch of W blocks, then
 * the abort record, the logits and the kernel's argmax copied back into
 * pinned memory; all asynchronous, with one wait.
 */
#include "runtime/backend.h"
#include "runtime/cuda_driver.h"
#include "ir/ops.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pinned host memory for a step's transfers, so that they are
 * asynchronous and the step waits once. */
typedef struct CudaStaging {
    MegacAbort abort_info;
    int32_t tok, next;
    float logits[];             /* vocab floats; m->logits points here */
} CudaStaging;

typedef struct CudaState {
    CudaDriver drv;
    bool have_drv;
    CUdevice dev;
    CUcontext ctx;
    bool have_ctx;
    CUmodule mod;
    CUfunction fn;
    int threads;                /* block size the kernel was built for */
    unsigned dyn_smem;          /* dynamic shared memory per block: the kernel's stages */
    CUdeviceptr weights, arena;
    CUdeviceptr ctl;            /* the abort record, then the counters: one memset per step */
    MegacArgs args;             /* device pointers */
    CudaStaging *host;          /* pinned: what a step copies in and out */
} CudaState;

/* Fails with the driver's message for a call that did not succeed. */
#define CU_CHECK(m, st, call)                                                                        \
    do {                                                                                             \
        CUresult r_ = (st)->drv.call;                                                                \
        if (r_ != 0)                                                                                 \
            return rt_fail((m), MEGAC_ERR_DEVICE, "%s failed: %s (%d)", #call,                       \
                           cuda_driver_error(&(st)->drv, r_), r_);                                   \
    } while (0)

/* "sm_90" -> 90 */
static int cuda_target_arch(const char *target)
{
    if (strncmp(target, "sm_", 3) != 0)
        return 0;
    return atoi(target + 3);
}

/* A cubin runs on its own major version, at its minor version or later. */
static megac_status cuda_device_pick(megac_model *m, CudaState *st)
{
    int n = 0, ordinal = 0, major = 0, minor = 0, coop = 0;
    const char *e = getenv("MEGAC_CUDA_DEVICE");
    if (e && *e) {
        if (strspn(e, "0123456789") != strlen(e) || strlen(e) > 4)
            return rt_fail(m, MEGAC_ERR_ARG, "MEGAC_CUDA_DEVICE='%.32s' is not a device ordinal (0, 1, ...)", e);
        ordinal = atoi(e);
    }
    CU_CHECK(m, st, cuDeviceGetCount(&n));
    if (n <= ordinal)
        return rt_fail(m, MEGAC_ERR_DEVICE, "no CUDA device %d: the driver sees %d device(s)", ordinal, n);
    CU_CHECK(m, st, cuDeviceGet(&st->dev, ordinal));
    CU_CHECK(m, st, cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, st->dev));
    CU_CHECK(m, st, cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, st->dev));
    CU_CHECK(m, st, cuDeviceGetAttribute(&coop, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, st->dev));
    int want = cuda_target_arch(m->man.target);
    char name[256] = "?";
    st->drv.cuDeviceGetName(name, (int)sizeof name, st->dev);
    if (major != want / 10 || minor < want % 10)
        return rt_fail(m, MEGAC_ERR_DEVICE, "%s: the kernel is built for %s, but device %d (%s) is sm_%d%d", m->dir,
                       m->man.target, ordinal, name, major, minor);
    if (!coop)
        return rt_fail(m, MEGAC_ERR_DEVICE, "device %d (%s) does not support cooperative launches", ordinal, name);
    return MEGAC_OK;
}

static megac_status cuda_read_cubin(megac_model *m, char **data)
{
    char path[4096];
    if (!rt_path(path, sizeof path, m->dir, m->man.kernel))
        return rt_fail(m, MEGAC_ERR_ARG, "%s: bundle path too long", m->dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot open the kernel", path);
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb)
            free(buf);
        buf = nb;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf)
        return rt_fail(m, MEGAC_ERR_NOMEM, "%s: out of memory reading the kernel", path);
    if (err) {
        free(buf);
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot read the kernel", path);
    }
    *data = buf;
    return MEGAC_OK;
}

/* A __device__ constant of the module, copied to the host. */
static megac_status cuda_global(megac_model *m, CudaState *st, const char *name, void *out, size_t size)
{
    CUdeviceptr p;
    size_t bytes = 0;
    CUresult r = st->drv.cuModuleGetGlobal_v2(&p, &bytes, st->mod, name);
    if (r != 0 || bytes != size)
        return rt_fail(m, MEGAC_ERR_FORMAT, "%s/%s: error: the kernel has no %zu-byte constant '%s' (%s)", m->dir,
                       m->man.kernel, size, name, r ? cuda_driver_error(&st->drv, r) : "wrong size");
    CU_CHECK(m, st, cuMemcpyDtoH_v2(out, p, size));
    return MEGAC_OK;
}

/* An optional __device__ array of the module (size bytes), copied into
 * a malloc'd buffer; NULL when the kernel has none of that size or the
 * copy fails. */
static void *cuda_global_opt(CudaState *st, const char *name, size_t size)
{
    CUdeviceptr p;
    size_t bytes = 0;
    if (st->drv.cuModuleGetGlobal_v2(&p, &bytes, st->mod, name) != 0 || bytes != size)
        return NULL;
    void *v = malloc(size);
    if (v && st->drv.cuMemcpyDtoH_v2(v, p, size) != 0) {
        free(v);
        v = NULL;
    }
    return v;
}

static megac_status cuda_module_load(megac_model *m, CudaState *st)
{
    char *cubin = NULL;
    megac_status s = cuda_read_cubin(m, &cubin);
    if (s)
        return s;
    CUresult r = st->drv.cuModuleLoadData(&st->mod, cubin);
    free(cubin);
    if (r != 0)
        return rt_fail(m, MEGAC_ERR_DEVICE, "cuModuleLoadData(%s/%s) failed: %s", m->dir, m->man.kernel,
                       cuda_driver_error(&st->drv, r));
    CU_CHECK(m, st, cuModuleGetFunction(&st->fn, st->mod, "megac_kernel"));
    /* the kernel says how much dynamic shared memory its stages take
     * (kernel_body.cuh: the weight stage, the instruction stage) */
    CUdeviceptr p;
    size_t bytes = 0;
    st->dyn_smem = 0;
    if (st->drv.cuModuleGetGlobal_v2(&p, &bytes, st->mod, "megac_k_dyn_smem_bytes") == 0 && bytes == 4)
        CU_CHECK(m, st, cuMemcpyDtoH_v2(&st->dyn_smem, p, 4));
    if (st->dyn_smem)
        CU_CHECK(m, st, cuFuncSetAttribute(st->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)st->dyn_smem));
    uint64_t abi = 0, hash = 0, facts[MEGAC_NFACTS];
    if ((s = cuda_global(m, st, "megac_kernel_abi", &abi, 8)))
        return s;
    if (abi != MEGAC_KERNEL_ABI)
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s/%s: error: kernel ABI %" PRIu64 ", but this runtime speaks ABI %u: recompile the bundle",
                       m->dir, m->man.kernel, abi, MEGAC_KERNEL_ABI);
    if ((s = cuda_global(m, st, "megac_schedule_hash", &hash, 8)) ||
        (s = cuda_global(m, st, "megac_kernel_facts", facts, sizeof facts)))
        return s;
    if (hash != m->man.schedule_hash)
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s/%s: error: the kernel was built for schedule %016" PRIx64 ", but the manifest says %016" PRIx64,
                       m->dir, m->man.kernel, hash, m->man.schedule_hash);
    char path[4096];
    if (!rt_path(path, sizeof path, m->dir, m->man.kernel))
        return rt_fail(m, MEGAC_ERR_ARG, "%s: bundle path too long", m->dir);
    if ((s = rt_facts_check(m, facts, path, "the kernel was built with")))
        return s;
    uint64_t *kv = NULL;
    if (st->drv.cuModuleGetGlobal_v2(&p, &bytes, st->mod, "megac_kv_layout") == 0 && bytes >= 8 &&
        !(kv = cuda_global_opt(st, "megac_kv_layout", bytes)))
        return rt_fail(m, MEGAC_ERR_DEVICE, "cannot read the kernel's megac_kv_layout");
    s = rt_kv_layout_set(m, kv, kv ? bytes / 8 : 0, path);
    free(kv);
    return s;
}

/* All W blocks must be resident at once. */
static megac_status cuda_residency_check(megac_model *m, CudaState *st)
{
    int per_sm = 0, sms = 0, regs = 0, smem = 0;
    CU_CHECK(m, st, cuFuncGetAttribute(&st->threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, st->fn));
    CU_CHECK(m, st, cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, st->fn));
    CU_CHECK(m, st, cuFuncGetAttribute(&smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, st->fn));
    smem += (int)st->dyn_smem;
    CU_CHECK(m, st, cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, st->fn, st->threads, st->dyn_smem));
    CU_CHECK(m, st, cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, st->dev));
    if ((int64_t)per_sm * sms < (int64_t)m->man.workers)
        return rt_fail(m, MEGAC_ERR_DEVICE,
                       "%s: %u blocks cannot all be resident: %d per SM x %d SMs (%d threads, %d registers, %d bytes "
                       "smem per block); recompile with --workers %d",
                       m->dir, m->man.workers, per_sm, sms, st->threads, regs, smem, per_sm * sms);
    return MEGAC_OK;
}

/* Bytes of the control block: the abort record, then the counters. */
static size_t cuda_ctl_bytes(const megac_model *m)
{
    return sizeof(MegacAbort) + (m->man.counters ? m->man.counters : 1) * sizeof(uint32_t);
}

static megac_status cuda_memory_init(megac_model *m, CudaState *st)
{
    size_t arena = (size_t)(m->man.arena_bytes ? m->man.arena_bytes : 64);
    CU_CHECK(m, st, cuMemAlloc_v2(&st->weights, m->weights_len ? m->weights_len : 64));
    if (m->weights_len)
        CU_CHECK(m, st, cuMemcpyHtoD_v2(st->weights, m->weights, m->weights_len));
    CU_CHECK(m, st, cuMemAlloc_v2(&st->arena, arena));
    CU_CHECK(m, st, cuMemsetD8_v2(st->arena, 0, arena));
    CU_CHECK(m, st, cuMemAlloc_v2(&st->ctl, cuda_ctl_bytes(m)));
    void *host = NULL;
    CU_CHECK(m, st, cuMemAllocHost_v2(&host, sizeof(CudaStaging) + (size_t)m->man.vocab * sizeof(float)));
    st->host = host;
    memset(st->host, 0, sizeof(CudaStaging) + (size_t)m->man.vocab * sizeof(float));
    st->args.weights = (const void *)(uintptr_t)st->weights;
    st->args.arena = (void *)(uintptr_t)st->arena;
    st->args.abort_info = (MegacAbort *)(uintptr_t)st->ctl;
    st->args.counters = (uint32_t *)(uintptr_t)(st->ctl + sizeof(MegacAbort));
    st->args.timeout_ns = rt_watchdog_ns();
    m->logits = st->host->logits;
    return MEGAC_OK;
}

/* MEGAC_CUDA_PROFILE set and a kernel built with MK_PROFILE=1 (see
 * kernel_body.cuh): SM cycles per step by op and for signals and waits,
 * the mean over workers and the largest, then the waits by the stage of
 * the counter waited on (qkv, attn, comb, o, ...), on stderr. A
 * developer's tool. */
static void cuda_profile_print(megac_model *m, CudaState *st)
{
    enum { SLOTS = 20 };
#define X(NAME, text, operands, params, meaning) text,
    static const char *const ops[] = {OP_LIST(X)};
#undef X
    const int nops = (int)(sizeof ops / sizeof *ops);
    uint64_t *v = getenv("MEGAC_CUDA_PROFILE")
                      ? cuda_global_opt(st, "mk_prof", (size_t)m->man.workers * SLOTS * sizeof(uint64_t))
                      : NULL;
    if (!v)
        return;
    double launches = (double)(v[18] ? v[18] : 1);
    fprintf(stderr, "megac profile: %.0f steps, SM cycles per step (mean over %u workers / largest)\n", launches,
            m->man.workers);
    for (int k = 0; k < 18; k++) {
        double sum = 0, mx = 0;
        for (uint32_t w = 0; w < m->man.workers; w++) {
            double c = (double)v[w * SLOTS + k] / launches;
            sum += c;
            mx = c > mx ? c : mx;
        }
        if (mx > 0)
            fprintf(stderr, "  %-14s %12.0f %12.0f\n", k < nops ? ops[k] : k == 16 ? "signal" : k == 17 ? "wait" : "?",
                    sum / m->man.workers, mx);
    }
    free(v);
    /* the waits by the stage of their counter (mk_prof_ctr) */
    uint32_t nc = m->man.counters;
    RtStageSum g[64];
    int ng = (v = cuda_global_opt(st, "mk_prof_ctr", nc * sizeof(uint64_t))) ? rt_stage_sums(m->dir, v, nc, g, 64) : -1;
    free(v);
    if (ng > 0)
        fprintf(stderr, "megac profile: waits by the stage of their counter, SM cycles per step (mean over workers)\n");
    for (int i = 0; i < ng; i++)
        fprintf(stderr, "  wait %-9s %12.0f   (%u counters)\n", g[i].name, (double)g[i].sum / launches / m->man.workers,
                g[i].nctrs);
}

static void cuda_close(megac_model *m)
{
    CudaState *st = m->be_state;
    if (!st)
        return;
    if (st->have_ctx) {
        if (st->mod)
            cuda_profile_print(m, st);
        CUdeviceptr ptrs[] = {st->weights, st->arena, st->ctl};
        for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++)
            if (ptrs[i])
                st->drv.cuMemFree_v2(ptrs[i]);
        if (st->host)
            st->drv.cuMemFreeHost(st->host);
        if (st->mod)
            st->drv.cuModuleUnload(st->mod);
        st->drv.cuDevicePrimaryCtxRelease_v2(st->dev);
    }
    if (st->have_drv)
        cuda_driver_unload(&st->drv);
    free(st);
    m->be_state = NULL;
    m->logits = NULL;
}

/* Before the bundle's other files are read: the driver and a device of
 * the kernel's architecture. */
static megac_status cuda_prepare(megac_model *m)
{
    CudaState *st = calloc(1, sizeof *st);
    if (!st)
        return rt_fail(m, MEGAC_ERR_NOMEM, "out of memory");
    m->be_state = st;
    char err[512];
    if (!cuda_driver_load(&st->drv, err, sizeof err))
        return rt_fail(m, MEGAC_ERR_DEVICE, "%s: cannot run target %s: %s", m->dir, m->man.target, err);
    st->have_drv = true;
    return cuda_device_pick(m, st);
}

static megac_status cuda_open(megac_model *m)
{
    CudaState *st = m->be_state;
    megac_status s;
    CU_CHECK(m, st, cuDevicePrimaryCtxRetain(&st->ctx, st->dev));
    st->have_ctx = true;
    CU_CHECK(m, st, cuCtxSetCurrent(st->ctx));
    if ((s = cuda_module_load(m, st)) || (s = cuda_residency_check(m, st)) || (s = cuda_memory_init(m, st)))
        return s;
    return MEGAC_OK;
}

/* What the abort record says, as the CPU backend words it. */
static megac_status cuda_abort_report(megac_model *m, const MegacAbort *a, int pos)
{
    if (a->counter == UINT32_MAX)
        return rt_fail(m, MEGAC_ERR_KERNEL, "kernel refused position %u (flag %u, limit %u): nothing ran", a->value,
                       a->flag, a->threshold);
    return rt_fail(m, MEGAC_ERR_KERNEL,
                   "kernel aborted at position %d: worker %u, pc %u waited on counter %u, which stayed at %u below "
                   "its threshold %u (watchdog)",
                   pos, a->worker, a->pc, a->counter, a->value, a->threshold);
}

/* One step, all on the default stream with one wait at the end: the
 * token in, the abort record and counters cleared, the launch, then the
 * abort record, the kernel's argmax and the logits out (into pinned
 * memory; not for a step without outputs). A failed step leaves m->logits
 * undefined. */
static megac_status cuda_step(megac_model *m, int token, int pos)
{
    CudaState *st = m->be_state;
    CudaStaging *h = st->host;
    CU_CHECK(m, st, cuCtxSetCurrent(st->ctx));
    h->tok = token;
    CU_CHECK(m, st, cuMemcpyHtoDAsync_v2(st->arena + m->man.off_tok, &h->tok, sizeof h->tok, NULL));
    CU_CHECK(m, st, cuMemsetD8Async(st->ctl, 0, cuda_ctl_bytes(m), NULL));
    st->args.pos = pos;
    st->args.prompt_end = m->prompt_end;
    st->args.flags = m->no_output ? MEGAC_STEP_NO_OUTPUT : 0;
    void *params[] = {&st->args};
    CU_CHECK(m, st,
             cuLaunchCooperativeKernel(st->fn, m->man.workers, 1, 1, (unsigned)st->threads, 1, 1, st->dyn_smem, NULL,
                                       params));
    CU_CHECK(m, st, cuMemcpyDtoHAsync_v2(&h->abort_info, st->ctl, sizeof h->abort_info, NULL));
    if (!m->no_output) {
        CU_CHECK(m, st, cuMemcpyDtoHAsync_v2(&h->next, st->arena + m->man.off_next, sizeof h->next, NULL));
        CU_CHECK(m, st, cuMemcpyDtoHAsync_v2(h->logits, st->arena + m->man.off_logits,
                                             (size_t)m->man.vocab * sizeof(float), NULL));
    }
    CU_CHECK(m, st, cuStreamSynchronize(NULL));
    if (h->abort_info.flag)
        return cuda_abort_report(m, &h->abort_info, pos);
    m->next = h->next;
    return MEGAC_OK;
}

/* A new sequence: state and KV start from zero, as after open. */
static megac_status cuda_reset(megac_model *m)
{
    CudaState *st = m->be_state;
    CU_CHECK(m, st, cuCtxSetCurrent(st->ctx));
    CU_CHECK(m, st, cuMemsetD8_v2(st->arena, 0, (size_t)(m->man.arena_bytes ? m->man.arena_bytes : 64)));
    return MEGAC_OK;
}

static megac_status cuda_arena_copy(megac_model *m, uint64_t off, void *buf, size_t len, bool to_arena)
{
    CudaState *st = m->be_state;
    if (len == 0)
        return MEGAC_OK;
    CU_CHECK(m, st, cuCtxSetCurrent(st->ctx));
    if (to_arena)
        CU_CHECK(m, st, cuMemcpyHtoD_v2(st->arena + off, buf, len));
    else
        CU_CHECK(m, st, cuMemcpyDtoH_v2(buf, st->arena + off, len));
    return MEGAC_OK;
}

const RtBackend rt_cuda_backend = {
    .name = "cuda",
    .prepare = cuda_prepare,
    .open = cuda_open,
    .step = cuda_step,
    .arena_copy = cuda_arena_copy,
    .reset = cuda_reset,
    .close = cuda_close,
};
