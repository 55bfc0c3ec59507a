/*
 * cuda_driver.c - dlopen the CUDA driver and resolve its entry points.
 */
#include "runtime/cuda_driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

bool cuda_driver_load(CudaDriver *drv, char *err, size_t errlen)
{
    memset(drv, 0, sizeof *drv);
    drv->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!drv->lib) {
        const char *why = dlerror();
        snprintf(err, errlen, "no CUDA driver: cannot load libcuda.so.1 (%s)", why ? why : "not found");
        return false;
    }
#define X(name, args)                                                                       \
    *(void **)&drv->name = dlsym(drv->lib, #name);                                          \
    if (!drv->name) {                                                                       \
        snprintf(err, errlen, "CUDA driver too old: libcuda.so.1 has no %s", #name);        \
        cuda_driver_unload(drv);                                                            \
        return false;                                                                       \
    }
    CUDA_DRIVER_FNS(X)
#undef X
    CUresult r = drv->cuInit(0);
    if (r != 0) {
        snprintf(err, errlen, "cuInit failed: %s", cuda_driver_error(drv, r));
        cuda_driver_unload(drv);
        return false;
    }
    return true;
}

void cuda_driver_unload(CudaDriver *drv)
{
    if (drv->lib)
        dlclose(drv->lib);
    memset(drv, 0, sizeof *drv);
}

const char *cuda_driver_error(const CudaDriver *drv, CUresult r)
{
    const char *s = NULL;
    if (drv->cuGetErrorString && drv->cuGetErrorString(r, &s) == 0 && s)
        return s;
    return "unknown CUDA error";
}
