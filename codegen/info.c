/*
 * info.c - what the code generators can use on this machine, for
 * `megac doctor`: NVRTC's version and the architectures it can target.
 * The LLVM side is in cpu/cpu_info.c (cpu_disabled.c without the CPU
 * backend).
 */
#include "codegen/codegen.h"

#include <nvrtc.h>
#include <stdlib.h>
#include <string.h>

bool cg_nvrtc_version(int *major, int *minor)
{
    return nvrtcVersion(major, minor) == NVRTC_SUCCESS;
}

bool cg_nvrtc_supports(int arch)
{
    int n = 0;
    if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0)
        return false;
    int *archs = xmalloc(sizeof(int) * (size_t)n);
    bool found = false;
    if (nvrtcGetSupportedArchs(archs) == NVRTC_SUCCESS)
        for (int i = 0; i < n; i++)
            found |= archs[i] == arch;
    free(archs);
    return found;
}
