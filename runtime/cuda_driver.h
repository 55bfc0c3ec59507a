/*
 * cuda_driver.h - the CUDA driver API, loaded at run time with
 * dlopen("libcuda.so.1") so that nothing links against a driver. Without a
 * driver or a GPU, cuda_driver_load() returns false with a message and the
 * CPU path is unaffected.
 *
 * Types are declared here (ABI-compatible with cuda.h) so the runtime
 * builds without the CUDA toolkit.
 */
#ifndef MEGAC_CUDA_DRIVER_H
#define MEGAC_CUDA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;

enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
};

/* CUfunction_attribute values */
enum {
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};

/* X(name, return, args) for every entry point megac uses. */
#define CUDA_DRIVER_FNS(X)                                                           \
    X(cuInit, (unsigned int flags))                                                  \
    X(cuDriverGetVersion, (int *v))                                                  \
    X(cuDeviceGetCount, (int *n))                                                    \
    X(cuDeviceGet, (CUdevice * d, int ordinal))                                      \
    X(cuDeviceGetName, (char *name, int len, CUdevice d))                            \
    X(cuDeviceGetAttribute, (int *v, int attrib, CUdevice d))                        \
    X(cuDeviceTotalMem_v2, (size_t * bytes, CUdevice d))                             \
    X(cuGetErrorString, (CUresult r, const char **s))                                \
    X(cuDevicePrimaryCtxRetain, (CUcontext * c, CUdevice d))                         \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice d))                                    \
    X(cuCtxSetCurrent, (CUcontext c))                                                \
    X(cuCtxSynchronize, (void))                                                      \
    X(cuModuleLoadData, (CUmodule * m, const void *image))                           \
    X(cuModuleUnload, (CUmodule m))                                                  \
    X(cuModuleGetFunction, (CUfunction * f, CUmodule m, const char *name))           \
    X(cuModuleGetGlobal_v2, (CUdeviceptr * p, size_t * bytes, CUmodule m, const char *name)) \
    X(cuFuncGetAttribute, (int *v, int attrib, CUfunction f))                        \
    X(cuFuncSetAttribute, (CUfunction f, int attrib, int v))                         \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, (int *n, CUfunction f, int block, size_t smem)) \
    X(cuMemAlloc_v2, (CUdeviceptr * p, size_t bytes))                                \
    X(cuMemFree_v2, (CUdeviceptr p))                                                 \
    X(cuMemcpyHtoD_v2, (CUdeviceptr dst, const void *src, size_t bytes))             \
    X(cuMemcpyDtoH_v2, (void *dst, CUdeviceptr src, size_t bytes))                   \
    X(cuMemsetD8_v2, (CUdeviceptr dst, unsigned char v, size_t n))                   \
    X(cuMemAllocHost_v2, (void **p, size_t bytes))                                   \
    X(cuMemFreeHost, (void *p))                                                      \
    X(cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void *src, size_t bytes, CUstream s)) \
    X(cuMemcpyDtoHAsync_v2, (void *dst, CUdeviceptr src, size_t bytes, CUstream s))  \
    X(cuMemsetD8Async, (CUdeviceptr dst, unsigned char v, size_t n, CUstream s))     \
    X(cuStreamSynchronize, (CUstream s))                                             \
    X(cuLaunchCooperativeKernel, (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, \
                                  unsigned by, unsigned bz, unsigned smem, CUstream s, void **params))

typedef struct CudaDriver {
#define X(name, args) CUresult (*name) args;
    CUDA_DRIVER_FNS(X)
#undef X
    void *lib;
} CudaDriver;

/* Loads libcuda.so.1 and calls cuInit(0). On failure writes why into err. */
bool cuda_driver_load(CudaDriver *drv, char *err, size_t errlen);
void cuda_driver_unload(CudaDriver *drv);
/* "cuXxx failed: CUDA_ERROR_... (text)" for r. */
const char *cuda_driver_error(const CudaDriver *drv, CUresult r);

#endif
