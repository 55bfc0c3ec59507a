/*
 * cpu_disabled.c - the CPU backend's entry points in a megac configured
 * with -DMEGAC_CPU_BACKEND=OFF (no LLVM): a build for machines that only
 * compile and run CUDA bundles (scripts/gpu-check.sh builds one on the GPU
 * machine, which has no LLVM). Compiling for the CPU says why it cannot.
 */
#include "codegen/codegen.h"

#include <stdlib.h>

bool cg_cpu_compile(const Schedule *s, const CpuOptions *o, const char *so_path, Diag *d)
{
    (void)s;
    (void)o;
    diag_file_error(d, so_path,
                    "this megac was built without the CPU backend (cmake -DMEGAC_CPU_BACKEND=OFF); "
                    "rebuild with LLVM 14 to compile for the cpu target");
    return false;
}

const char *cg_llvm_version(void)
{
    return "not built in (MEGAC_CPU_BACKEND=OFF)";
}

bool cg_llvm_host(char **cpu, char **features)
{
    (void)cpu;
    (void)features;
    return false;
}

const char *const *cg_cpu_names(void)
{
    static const char *const none[] = {NULL};
    return none;
}

int cg_cpu_tune(const char *cpu)
{
    (void)cpu;
    return 0;
}
