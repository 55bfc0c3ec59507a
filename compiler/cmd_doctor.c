/*
 * cmd_doctor.c - `megac doctor`: what this machine offers megac. Prints the
 * LLVM version and host CPU (name, vector features, the kernels' prefetch
 * tuning for it: cg_cpu_tune), NVRTC's version and
 * the architectures megac targets, memory and its huge page mode, whether
 * libcuda.so.1 and a GPU are present, and which megac features are usable
 * here.
 */
#include "codegen/codegen.h"
#include "codegen/cpu/kernel_table.h"
#include "compiler/cli.h"
#include "runtime/cuda_driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool has_feature(const char *features, const char *f)
{
    char want[64];
    snprintf(want, sizeof want, "+%s", f);
    for (const char *p = features; (p = strstr(p, want)); p += strlen(want)) {
        char end = p[strlen(want)];
        if (end == ',' || end == 0)
            return true;
    }
    return false;
}

/* Memory, and the transparent huge page mode (the bracketed word of
 * /sys/kernel/mm/transparent_hugepage/enabled): the runtime reads a host
 * bundle's weights into memory with huge pages asked for when they take at
 * most half the free memory (runtime/bundle.c), which THP "never" turns
 * into 4 KB pages. */
static void memory_report(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    char mode[64] = "unknown", line[256];
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f && fgets(line, sizeof line, f)) {
        char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
        if (a && b && b - a - 1 < (long)sizeof mode)
            snprintf(mode, sizeof mode, "%.*s", (int)(b - a - 1), a + 1);
    }
    if (f)
        fclose(f);
    double gib = 1024.0 * 1024.0 * 1024.0;
    printf("memory:        %.1f GiB, %.1f GiB free; transparent huge pages: %s (host bundles' weights up to "
           "%.1f GiB are read into memory)\n",
           pages > 0 && psz > 0 ? (double)pages * (double)psz / gib : 0.0,
           avail > 0 && psz > 0 ? (double)avail * (double)psz / gib : 0.0, mode,
           avail > 0 && psz > 0 ? (double)avail * (double)psz / gib / 2 : 0.0);
}

static bool program_on_path(const char *name)
{
    const char *path = getenv("PATH");
    if (!path)
        return false;
    char *dirs = xstrdup(path);
    bool found = false;
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char *p = xasprintf("%s/%s", d, name);
        found = access(p, X_OK) == 0;
        free(p);
    }
    free(dirs);
    return found;
}

static int gpu_report(void)
{
    CudaDriver drv;
    char err[256];
    if (!cuda_driver_load(&drv, err, sizeof err)) {
        printf("cuda driver:   %s\n", err);
        return 0;
    }
    int ver = 0, n = 0;
    drv.cuDriverGetVersion(&ver);
    drv.cuDeviceGetCount(&n);
    printf("cuda driver:   libcuda.so.1, version %d.%d, %d device(s)\n", ver / 1000, ver % 1000 / 10, n);
    for (int i = 0; i < n; i++) {
        CUdevice dev;
        char name[128] = "?";
        int maj = 0, min = 0, sms = 0, coop = 0;
        size_t mem = 0;
        drv.cuDeviceGet(&dev, i);
        drv.cuDeviceGetName(name, sizeof name, dev);
        drv.cuDeviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
        drv.cuDeviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
        drv.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
        drv.cuDeviceGetAttribute(&coop, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, dev);
        drv.cuDeviceTotalMem_v2(&mem, dev);
        printf("  gpu %d:       %s, sm_%d%d, %d SMs, %.1f GiB, cooperative launch %s\n", i, name, maj, min,
               sms, (double)mem / (1u << 30), coop ? "yes" : "no");
    }
    cuda_driver_unload(&drv);
    return n;
}

int cmd_doctor(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: megac doctor\n\nReports the LLVM version and host CPU, memory and its transparent huge page\n"
               "mode, NVRTC, the CUDA driver and GPUs, and which megac features are usable on\n"
               "this machine.\n");
        return 0;
    }
    if (argc > 1) {
        cli_bad_arg("doctor", argv[1], false);
        return 2;
    }
    char *cpu = NULL, *features = NULL;
    bool llvm_ok = cg_llvm_host(&cpu, &features);
    printf("llvm:          %s\n", cg_llvm_version());
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (llvm_ok) {
        printf("host cpu:      %s, %ld cores, vector:", cpu, cores);
        const char *vec[] = {"sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vnni",
                             "avxvnni", "gfni", "avx512bf16"};
        for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++)
            if (has_feature(features, vec[i]))
                printf(" %s", vec[i]);
        printf("\n");
        int tune = cg_cpu_tune(NULL);
        printf("cpu tuning:    %s%s\n",
               tune & KT_TUNE_TRICKLE_ALL ? "GEMV prefetches spread over rows of every length"
                                          : "GEMV prefetches spread over rows of 1024 or more",
               tune & KT_TUNE_FAR_QUADS ? ", far quads (an Intel CPU)"
               : tune & KT_TUNE_FAR_SEQ ? ", the 256-bit rows of long segments as far quads (AMD Zen 3)"
                                        : "");
    } else {
        printf("host cpu:      LLVM has no native target here\n");
    }
    memory_report();
    int maj = 0, min = 0;
    bool nvrtc_ok = cg_nvrtc_version(&maj, &min);
    if (nvrtc_ok) {
        printf("nvrtc:         %d.%d, targets:", maj, min);
        const int archs[] = {80, 90, 120};
        for (size_t i = 0; i < 3; i++)
            printf(" sm_%d%s", archs[i], cg_nvrtc_supports(archs[i]) ? "" : "(unsupported)");
        printf("\n");
    } else {
        printf("nvrtc:         not usable\n");
    }
    int ngpu = gpu_report();
    bool cc = program_on_path("cc");
    printf("linker:        %s\n", cc ? "cc found" : "cc not found on PATH");

    printf("\nusable here:\n");
    printf("  %-34s %s\n", "lower / validate", "yes");
    printf("  %-34s %s\n", "reference engine", "yes");
    printf("  %-34s %s\n", "cpu megakernel (compile + run)", llvm_ok && cc ? "yes" : "no");
    printf("  %-34s %s\n", "cuda codegen (cubin via NVRTC)", nvrtc_ok ? "yes" : "no");
    printf("  %-34s %s\n", "host-cuda (CUDA C run on the host)", cc ? "yes" : "no");
    printf("  %-34s %s\n", "cuda run (needs driver + GPU)", ngpu > 0 ? "yes" : "no");
    free(cpu);
    free(features);
    return 0;
}
