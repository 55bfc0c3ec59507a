/*
 * cuda.h - internals of the CUDA backend (codegen/cuda), sectioned by the
 * file that defines each prototype. The pipeline:
 *   cuda_schedule_check   what the kernel body supports (cuda_check.c)
 *   cuda_source_build     prelude or host shim + the schedule's shape and
 *                         tables + kernel_body.cuh (cuda_source.c)
 *   NVRTC -> cubin, resources read back from ptxas (cuda_nvrtc.c), or
 *   cc -x c -> kernel.so through host_shim.h (cuda_host.c)
 */
#ifndef MEGAC_CODEGEN_CUDA_H
#define MEGAC_CODEGEN_CUDA_H

#include "codegen/codegen.h"

#include <stddef.h>

#ifndef CUDA_THREADS_GPU
#define CUDA_THREADS_GPU 512    /* threads per block on a GPU (16 warps) */
#endif
#define CUDA_THREADS_HOST 128   /* on the host: 4 warps of fibers */
#define CUDA_SMEM_FLOATS_MAX 8192   /* GEMV input staging cap (32 KiB) */
#define CUDA_SMEM_FLOATS_LIMIT 12000 /* whole scratch: under 48 KiB of static smem */
#define CUDA_ARENA_BIT (1ull << 63)
#define CUDA_WSTAGE_MAX (160 * 1024) /* weight stage cap: with the static scratch, under sm_90's 227 KiB */
#define CUDA_ISTAGE_MAX (32 * 1024)  /* instruction stage cap: with 48 KiB static, under sm_120's 99 KiB a block */
#define CUDA_WPIPE_V 4           /* MK_WPIPE_V: 16-byte units a lane copies into each stage of the weight pipe */
#define CUDA_PRELOADS 2         /* MK_PRELOADS first tried (cg_cuda_compile lowers it on spills) */
#define CUDA_VLOADS 8           /* MK_VLOADS first tried (lowered on spills once there are no preloads) */

/* ---- cuda_text.c (generated at build time from the embedded sources) ---- */
extern const char cuda_text_prelude[];      /* cuda_prelude.cuh */
extern const char cuda_text_host_shim[];    /* host_shim.h */
extern const char cuda_text_body[];         /* kernel_body.cuh */

/* ---- cuda_check.c ---- */
/* Whether the kernel body can run every instruction of s; errors cite the
 * instruction's .sched line. */
bool cuda_schedule_check(const Schedule *s, Diag *d);
/* The dtype of the schedule's KV caches (f32 when it has none). */
DType cuda_cache_dtype(const Schedule *s);

/* ---- cuda_source.c ---- */
typedef struct CudaLayout {
    int threads;        /* MK_THREADS */
    int smem_floats;    /* MK_SMEM_FLOATS: GEMV inputs up to this k are staged */
    int attn_warps;     /* MK_AW: warps that share an attention split */
    int hdl;            /* MK_HDL: head elements per lane */
    int preloads;       /* MK_PRELOADS_AUTO: weight loads a lane issues before a GEMV's wait */
    int vloads;         /* MK_VLOADS_AUTO: 16-byte weight loads in flight per lane in the GEMV rows */
    int wstage;         /* MK_WSTAGE_BYTES: dynamic shared memory the GEMVs' rows are staged in (0: none) */
    int istage;         /* MK_ISTAGE_BYTES: dynamic shared memory after it for the buffer table and the
                           worker's instructions (0: read from global memory) */
    int bufs_pad;       /* MK_NBUFS_PAD: the buffer table's entries there (an even count) */
    int block_lanes;    /* MK_ROW_LANES_BLOCKS: short rows of the block formats by fewer lanes, side by
                           side (1: where the schedule has them; turned off on spills) */
    int wpipe;          /* MK_WPIPE: stages of each warp's weight pipe (0: none) */
    int wpipe_bytes;    /* its dynamic shared memory, after the two stages */
} CudaLayout;
/* The block layout for a schedule on the GPU (host = false) or the host. */
CudaLayout cuda_layout(const Schedule *s, bool host);
/* The dynamic shared memory a launch gives each block: the weight stage,
 * the instruction stage and the weight pipe. */
static inline int cuda_layout_dyn_smem(const CudaLayout *l) { return l->wstage + l->istage + l->wpipe_bytes; }
/* The whole kernel source for layout l, xmalloc'd. */
char *cuda_source_build(const Schedule *s, const CudaLayout *l, bool host);

/* ---- cuda_nvrtc.c ---- */
/* bool cg_cuda_compile(...) of codegen.h is cuda_source_build, then this:
 * NVRTC for one architecture, the program log printed on failure, the
 * ptxas resources checked (no local memory), the cubin written. With
 * spilled, a kernel that uses local memory sets *spilled and fails without
 * a diagnostic (the caller retries with fewer registers). */
bool cuda_nvrtc_compile(const char *src, const char *arch, int threads, const char *cubin_path, CudaKernelInfo *info,
                        bool *spilled, Diag *d);
/* Parses ptxas' -v lines for the entry `megac_kernel` (exposed for tests). */
bool cuda_ptxas_info_parse(const char *log, CudaKernelInfo *info);

/* ---- cuda_host.c ---- */
/* bool cg_hostcuda_compile(...) of codegen.h */

#endif
