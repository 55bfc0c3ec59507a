/*
 * codegen.h - the backends: a validated Schedule in, a kernel artifact out.
 * Both consume the same op semantics (ir/ops.h) and kernel ABI
 * (runtime/kernel_abi.h).
 */
#ifndef MEGAC_CODEGEN_H
#define MEGAC_CODEGEN_H

#include "ir/ir.h"

/* ---- cpu/: LLVM C API -> kernel.so ---- */
typedef struct CpuOptions {
    const char *cpu;        /* NULL: the host (LLVMGetHostCPUName/Features);
                               or a named level such as "x86-64-v3" */
    bool verbose;           /* progress on stderr */
    bool keep_ir;           /* also write kernel.ll next to the .so */
} CpuOptions;
bool cg_cpu_compile(const Schedule *s, const CpuOptions *o, const char *so_path, Diag *d);
/* The named CPUs CpuOptions.cpu takes besides the host ("host", "native"),
 * NULL-terminated; empty in a megac built without the CPU backend. */
const char *const *cg_cpu_names(void);
/* The memory tuning bits (KT_TUNE_*, codegen/cpu/kernel_table.h) a kernel
 * for cpu gets (NULL or "host": this machine's); 0 without the backend. */
int cg_cpu_tune(const char *cpu);

/* ---- cuda/: CUDA C -> NVRTC -> cubin; and the same C on the host ---- */
typedef struct CudaKernelInfo {
    int threads_per_block;
    int regs_per_thread;    /* read back from the cubin */
    int smem_per_block;     /* static + dynamic bytes */
    int dyn_smem;           /* of those, dynamic: the kernel's stages (kernel_body.cuh) */
    int local_bytes;        /* spills: must be 0 */
    int preloads;           /* weight loads a lane issues before a GEMV's wait (MK_PRELOADS) */
    int vloads;             /* 16-byte weight loads in flight per lane in the GEMV rows (MK_VLOADS) */
    int block_lanes;        /* short rows of the block formats read side by side (MK_ROW_LANES_BLOCKS) */
    int wpipe;              /* stages of each warp's weight pipe (MK_WPIPE; 0: none) */
} CudaKernelInfo;
/* arch: "sm_80", "sm_90", "sm_120". The NVRTC log is printed on failure. */
bool cg_cuda_compile(const Schedule *s, const char *arch, const char *cubin_path, CudaKernelInfo *info,
                     Diag *d);
/* Told of each NVRTC compile of cg_cuda_compile_ex's search that spilled
 * (each takes seconds, a spilling one the longest): its seconds and a
 * sentence on what it tries next. */
typedef struct CgCudaProgress {
    void (*fn)(void *ctx, double seconds, const char *what);
    void *ctx;
} CgCudaProgress;
/* cg_cuda_compile, telling p (if any) of its retries. */
bool cg_cuda_compile_ex(const Schedule *s, const char *arch, const char *cubin_path, CudaKernelInfo *info,
                        const CgCudaProgress *p, Diag *d);
/* The generated CUDA C compiled for the host through the shim: a .so with
 * the CPU kernel ABI (one worker = one block, run as a thread). */
bool cg_hostcuda_compile(const Schedule *s, const char *so_path, Diag *d);

/* ---- codegen.c ---- */
/* Runs argv (argv[0] looked up on PATH, e.g. "cc") with stdout and stderr
 * captured into *output (xmalloc'd, always set); true when it exits 0. */
bool cg_run_cc(char *const argv[], char **output);
/* What a kernel built from s states about itself (megac_kernel_facts,
 * runtime/kernel_abi.h): v has MEGAC_NFACTS entries. */
void cg_kernel_facts(const Schedule *s, uint64_t *v);
/* megac_kv_layout of a kernel built from s (runtime/kernel_abi.h) into v,
 * which has room for MEGAC_KVL_CACHES + 2 n_layers words; returns how many
 * it holds (1, a zero, where the cache cannot be shifted). */
uint32_t cg_kv_layout(const Schedule *s, uint64_t *v);
/* The opcodes (bit o for OpCode o) and operand dtypes (bit t for DType t)
 * of s's instructions: both backends compile only those op bodies and
 * weight formats. */
void cg_used(const Schedule *s, uint32_t *ops, uint64_t *dtypes);

/* ---- info.c: for `megac doctor` ---- */
const char *cg_llvm_version(void);
bool cg_llvm_host(char **cpu, char **features);     /* xmalloc'd strings */
bool cg_nvrtc_version(int *major, int *minor);
bool cg_nvrtc_supports(int arch);                   /* e.g. 90 */

#endif
