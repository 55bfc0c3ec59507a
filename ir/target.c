/*
 * target.c - what a schedule runs on: a small device table.
 *
 *   name       kind       workers  SMs  blocks/SM  regs/SM  smem/SM   threads/SM
 *   cpu        CPU        cores     -       -         -        -          -
 *   host-cuda  host CUDA  4         -       -         -        -          -
 *   sm_80      A100       108      108     32      65536   164 KiB      2048
 *   sm_90      H100/H200  132      132     32      65536   228 KiB      2048
 *   sm_120     RTX 5090   170      170     32      65536   100 KiB      1536
 *
 * CUDA targets default to one worker (persistent block) per SM of the
 * reference device; the validator checks co-residency against these limits.
 * `host-cuda` runs the generated CUDA C on the host (threads as blocks).
 */
#include "ir/ir.h"

#include <string.h>
#include <unistd.h>

const char *const target_names[] = {"cpu", "host-cuda", "sm_80", "sm_90", "sm_120", NULL};

static const Target targets[] = {
    {"cpu", TARGET_CPU, 0, 0, 0, 0, 0, 0, 0},
    {"host-cuda", TARGET_HOST_CUDA, 4, 0, 0, 0, 0, 0, 0},
    {"sm_80", TARGET_CUDA, 108, 108, 32, 65536, 164 * 1024, 2048, 80},
    {"sm_90", TARGET_CUDA, 132, 132, 32, 65536, 228 * 1024, 2048, 90},
    {"sm_120", TARGET_CUDA, 170, 170, 32, 65536, 100 * 1024, 1536, 120},
};
_Static_assert(sizeof targets / sizeof targets[0] + 1 == sizeof target_names / sizeof target_names[0],
               "target_names must list every target");

/* The CPU target's default worker count is the number of online cores,
 * read once. */
static int target_cpu_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 1024 ? 1024 : (int)n;
}

const Target *target_lookup(const char *name, Diag *d)
{
    static Target cpu;
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        if (strcmp(targets[i].name, name) != 0)
            continue;
        if (targets[i].kind != TARGET_CPU)
            return &targets[i];
        if (!cpu.name) {
            cpu = targets[i];
            cpu.default_workers = target_cpu_cores();
        }
        return &cpu;
    }
    const char *near = str_closest(name, target_names);
    diag_error(d, NULL, 0, 0, "unknown target '%s'%s%s%s; valid targets: cpu, host-cuda, sm_80, sm_90, sm_120",
               name, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
    return NULL;
}
