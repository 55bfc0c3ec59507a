/*
 * cuda_nvrtc.c - cg_cuda_compile: the kernel source (cuda_source.c) through
 * NVRTC to a cubin for one architecture, with
 *   --gpu-architecture=sm_XX -default-device -lineinfo --ptxas-options=-v
 * The program log is printed whenever compilation fails. The registers,
 * shared memory and local memory (stack frame, spills) ptxas reports for
 * `megac_kernel` are read back into CudaKernelInfo: the validator's
 * co-residency check uses them, and a kernel that spills is refused.
 */
#include "codegen/cuda/cuda.h"

#include <errno.h>
#include <nvrtc.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* "sm_90" -> 90; 0 if not one of the backend's architectures. */
static int nvrtc_arch(const char *arch)
{
    static const char *const names[] = {"sm_80", "sm_90", "sm_120", NULL};
    static const int nums[] = {80, 90, 120};
    for (int i = 0; names[i]; i++)
        if (strcmp(arch, names[i]) == 0)
            return nums[i];
    return 0;
}

static bool nvrtc_check(nvrtcResult r, const char *call, const char *path, Diag *d)
{
    if (r == NVRTC_SUCCESS)
        return true;
    diag_file_error(d, path, "%s failed: %s", call, nvrtcGetErrorString(r));
    return false;
}

static char *nvrtc_log(nvrtcProgram prog)
{
    size_t n = 0;
    if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0)
        return xstrdup("");
    char *log = xmalloc(n + 1);
    if (nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS)
        log[0] = 0;
    log[n] = 0;
    return log;
}

/* A number before `what` on the line starting at p ("40 registers"). */
static bool ptxas_number_before(const char *line, const char *end, const char *what, int *out)
{
    const char *w = strstr(line, what);
    if (!w || w >= end)
        return false;
    const char *q = w;
    while (q > line && q[-1] == ' ')
        q--;
    while (q > line && q[-1] >= '0' && q[-1] <= '9')
        q--;
    if (q == w || !(*q >= '0' && *q <= '9'))
        return false;
    *out = atoi(q);
    return true;
}

bool cuda_ptxas_info_parse(const char *log, CudaKernelInfo *info)
{
    const char *p = strstr(log, "Compiling entry function 'megac_kernel'");
    bool regs = false, frame = false;
    int spill = 0, v;
    while (p && *p) {
        const char *end = strchr(p, '\n');
        if (!end)
            end = p + strlen(p);
        if (regs && frame && strstr(p, "Compiling entry function") && strstr(p, "Compiling entry function") < end)
            break;
        if (ptxas_number_before(p, end, "bytes stack frame", &v)) {
            info->local_bytes = v;
            frame = true;
        }
        if (ptxas_number_before(p, end, "bytes spill stores", &v))
            spill += v;
        if (ptxas_number_before(p, end, "registers", &v)) {
            info->regs_per_thread = v;
            regs = true;
        }
        if (ptxas_number_before(p, end, "bytes smem", &v))
            info->smem_per_block = v;
        p = *end ? end + 1 : end;
    }
    if (spill > info->local_bytes)
        info->local_bytes = spill;
    return regs && frame;
}

static bool nvrtc_write(const char *path, const void *data, size_t n, Diag *d)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        diag_file_error(d, path, "cannot write the cubin: %s", strerror(errno));
        return false;
    }
    bool ok = fwrite(data, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok)
        diag_file_error(d, path, "cannot write the cubin: %s", strerror(errno));
    return ok;
}

/* Compiles prog; on failure the error and the whole program log. */
static bool nvrtc_build(nvrtcProgram prog, int arch, const char *path, char **log, Diag *d)
{
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=sm_%d", arch);
    const char *opts[] = {archopt, "-default-device", "-lineinfo", "--ptxas-options=-v", "-std=c++17"};
    nvrtcResult r = nvrtcCompileProgram(prog, (int)(sizeof opts / sizeof *opts), opts);
    *log = nvrtc_log(prog);
    if (r == NVRTC_SUCCESS)
        return true;
    diag_file_error(d, path, "nvrtcCompileProgram (%s) failed: %s; program log:", archopt, nvrtcGetErrorString(r));
    diag_log(d, *log);
    return false;
}

static bool nvrtc_cubin_save(nvrtcProgram prog, const char *path, Diag *d)
{
    size_t n = 0;
    if (!nvrtc_check(nvrtcGetCUBINSize(prog, &n), "nvrtcGetCUBINSize", path, d))
        return false;
    char *cubin = xmalloc(n ? n : 1);
    bool ok = nvrtc_check(nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN", path, d) && nvrtc_write(path, cubin, n, d);
    free(cubin);
    return ok;
}

/* Resources from the log; a kernel that uses local memory is refused
 * (with spilled: quietly, *spilled set). */
static bool nvrtc_resources(const char *log, int threads, const char *path, CudaKernelInfo *info, bool *spilled,
                            Diag *d)
{
    memset(info, 0, sizeof *info);
    info->threads_per_block = threads;
    if (!cuda_ptxas_info_parse(log, info)) {
        diag_file_error(d, path, "no ptxas resource usage for megac_kernel in the NVRTC log:");
        diag_log(d, log);
        return false;
    }
    if (info->local_bytes > 0 && spilled) {
        *spilled = true;
        return false;
    }
    if (info->local_bytes > 0) {
        diag_file_error(d, path, "megac_kernel uses %d bytes of local memory (stack frame or spills); log:",
                        info->local_bytes);
        diag_log(d, log);
        return false;
    }
    return true;
}

bool cuda_nvrtc_compile(const char *src, const char *arch, int threads, const char *cubin_path, CudaKernelInfo *info,
                        bool *spilled, Diag *d)
{
    int a = nvrtc_arch(arch);
    if (!a) {
        diag_file_error(d, cubin_path, "unknown CUDA architecture '%s' (sm_80, sm_90 or sm_120)", arch);
        return false;
    }
    /* With a GPU driver present, NVRTC serves a program it has compiled
     * before from the CUDA compute cache, and then the log has no ptxas
     * resource lines (seen on an H200: the second of two identical
     * compiles failed here). The resources are part of the contract with
     * the validator, so this process compiles without that cache. */
    setenv("CUDA_CACHE_DISABLE", "1", 1);
    nvrtcProgram prog;
    if (!nvrtc_check(nvrtcCreateProgram(&prog, src, "megac_kernel.cu", 0, NULL, NULL), "nvrtcCreateProgram",
                     cubin_path, d))
        return false;
    char *log = NULL;
    CudaKernelInfo ki;
    bool ok = nvrtc_build(prog, a, cubin_path, &log, d) &&
              nvrtc_resources(log, threads, cubin_path, &ki, spilled, d) && nvrtc_cubin_save(prog, cubin_path, d);
    if (ok && info)
        *info = ki;
    free(log);
    nvrtcDestroyProgram(&prog);
    return ok;
}

/* Seconds since t0 (CLOCK_MONOTONIC). */
static double nvrtc_seconds(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

bool cg_cuda_compile(const Schedule *s, const char *arch, const char *cubin_path, CudaKernelInfo *info, Diag *d)
{
    return cg_cuda_compile_ex(s, arch, cubin_path, info, NULL, d);
}

bool cg_cuda_compile_ex(const Schedule *s, const char *arch, const char *cubin_path, CudaKernelInfo *info,
                        const CgCudaProgress *p, Diag *d)
{
    if (!nvrtc_arch(arch)) {
        diag_file_error(d, cubin_path, "unknown CUDA architecture '%s' (sm_80, sm_90 or sm_120)", arch);
        return false;
    }
    if (!cuda_schedule_check(s, d))
        return false;
    /* Each weight load a lane issues before a GEMV's wait holds 4
     * registers across the wait, each load in flight in the GEMV rows 4
     * more, and the block formats' rows side by side (mk_gemv_nl) some:
     * where ptxas spills, fewer preloads, then (none left) the block rows
     * one a warp, then fewer loads in flight, two at a time down to 2. */
    CudaLayout l = cuda_layout(s, false);
    for (;;) {
        char *src = cuda_source_build(s, &l, false);
        bool spilled = false, retry = l.preloads > 0 || l.block_lanes || l.vloads > 2;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        bool ok = cuda_nvrtc_compile(src, arch, l.threads, cubin_path, info, retry ? &spilled : NULL, d);
        free(src);
        if (ok && info) {
            info->preloads = l.preloads;
            info->vloads = l.vloads;
            info->block_lanes = l.block_lanes;
            info->wpipe = l.wpipe;
            info->dyn_smem = cuda_layout_dyn_smem(&l); /* not in ptxas' count */
            info->smem_per_block += info->dyn_smem;
        }
        if (ok || !spilled)
            return ok;
        char what[160];
        if (l.preloads > 0) {
            snprintf(what, sizeof what, "%s spills with %d weight load%s a lane before a GEMV's wait; again with %d",
                     arch, l.preloads, l.preloads == 1 ? "" : "s", l.preloads - 1);
            l.preloads--;
        } else if (l.block_lanes) {
            snprintf(what, sizeof what, "%s spills with short block rows side by side; again with a row a warp", arch);
            l.block_lanes = 0;
        } else {
            snprintf(what, sizeof what, "%s spills with %d weight loads in flight a lane; again with %d", arch,
                     l.vloads, l.vloads - 2);
            l.vloads -= 2;
        }
        if (p && p->fn)
            p->fn(p->ctx, nvrtc_seconds(&t0), what);
    }
}
