/*
 * cpu_info.c - the LLVM version and the host CPU as LLVM sees it (name and
 * vector features), for `megac doctor`.
 */
#include "codegen/codegen.h"

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm/Config/llvm-config.h>

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
