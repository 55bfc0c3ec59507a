/*
 * info.c - what the code generators can use on this machine, for
 * `megac doctor`: the LLVM version and host CPU, NVRTC's version and the
 * architectures it can target.
 */
#include "codegen/codegen.h"

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm/Config/llvm-config.h>
#include <nvrtc.h>
#include <stdlib.h>
#include <string.h>

const char *cg_llvm_version(void)
{
    return LLVM_VERSION_STRING;
}

bool cg_llvm_host(char **cpu, char **features)
{
    if (LLVMInitializeNativeTarget() != 0)
        return false;
    char *name = LLVMGetHostCPUName();
    char *feat = LLVMGetHostCPUFeatures();
    *cpu = xstrdup(name);
    *features = xstrdup(feat);
    LLVMDisposeMessage(name);
    LLVMDisposeMessage(feat);
    return true;
}

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
