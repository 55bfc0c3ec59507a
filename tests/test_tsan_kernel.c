/*
 * test_tsan_kernel.c - the ThreadSanitizer kernel in an ordinary build:
 * `MEGAC_KERNEL_TSAN=1 megac compile` writes a kernel.so whose accesses and
 * counter atomics call the TSan runtime (its undefined symbols say so), and
 * a process without that runtime refuses it at megac_open, naming the
 * missing symbol. MEGAC_KERNEL_TSAN=0 gives the plain kernel. The checks
 * that LLVM's TSan pass does not place (wide vectors, masked loads and
 * gathers) are where they belong in the IR. The kernel actually running
 * under TSan is tests/tsan (MEGAC_TSAN builds only).
 */
#include "runtime/megac.h"
#include "compiler/compile.h"
#include "codegen/codegen.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Compiles the default model for 2 workers with MEGAC_KERNEL_TSAN=flag
 * into dir/NAME.megac; returns the undefined symbols of its kernel.so. */
static char *compile_with(const char *dir, const char *flag)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "MEGAC_KERNEL_TSAN=%s %s compile default --workers 2 -q -o '%s/t%s.megac' 2>&1 && "
             "nm -D --undefined-only '%s/t%s.megac/kernel.so'",
             flag, MEGAC_BIN, dir, flag, dir, flag);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    static char out[1 << 15];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s\n%s", cmd, out);
    return strdup(out);
}

Test(tsan_kernel, env_var_instruments_the_kernel)
{
    char dir[] = "/tmp/megac-tsank-XXXXXX";
    cr_assert(mkdtemp(dir));
    char *on = compile_with(dir, "1"), *off = compile_with(dir, "0");
    static const char *const want[] = {"__tsan_init", "__tsan_func_entry", "__tsan_read_range",
                                       "__tsan_write_range", "__tsan_atomic32_fetch_add", "__tsan_atomic32_load",
                                       NULL};
    for (int i = 0; want[i]; i++)
        cr_expect(strstr(on, want[i]), "instrumented kernel.so lacks %s:\n%s", want[i], on);
    cr_expect(!strstr(off, "__tsan"), "plain kernel.so refers to TSan:\n%s", off);

    char path[256];
    megac_model *m;
    snprintf(path, sizeof path, "%s/t1.megac", dir);
    cr_expect_eq(megac_open(path, &m), MEGAC_ERR_IO);
    cr_expect(strstr(megac_last_open_error(), "undefined symbol: __tsan_"), "%s", megac_last_open_error());
    snprintf(path, sizeof path, "%s/t0.megac", dir);
    cr_assert_eq(megac_open(path, &m), MEGAC_OK, "%s", megac_last_open_error());
    cr_expect_eq(megac_step(m, megac_bos(m)), MEGAC_OK, "%s", megac_error(m));
    megac_close(m);
    free(on);
    free(off);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* A stories260K-shaped model for 3 workers, for AVX-512 (not run here):
 * the one shape whose O3 output is known to hold a masked gather. Every
 * llvm.masked.* call comes right after the range check of its last lane. */
Test(tsan_kernel, masked_and_wide_accesses_are_checked)
{
    ModelDesc m = {.name = "toy", .dim = 64, .hidden_dim = 172, .n_layers = 5, .n_heads = 8, .n_kv_heads = 4,
                   .head_dim = 8, .vocab_size = 512, .max_seq = 512, .norm_eps = 1e-5, .tie_embeddings = true,
                   .rope_theta = 10000, .rope_pairing = ROPE_ADJACENT, .act_dtype = DT_F32};
    Diag d;
    diag_init(&d);
    Schedule *s = lower_model(&m, target_lookup("cpu", &d), 3, &d);
    cr_assert(s);
    sched_layout(s);
    char dir[] = "/tmp/megac-tsank-XXXXXX", so[128], ll[128];
    cr_assert(mkdtemp(dir));
    snprintf(so, sizeof so, "%s/kernel.so", dir);
    snprintf(ll, sizeof ll, "%s/kernel.ll", dir);
    CpuOptions o = {.cpu = "x86-64-v4", .keep_ir = true};
    cr_assert_eq(setenv("MEGAC_KERNEL_TSAN", "1", 1), 0);
    bool ok = cg_cpu_compile(s, &o, so, &d);
    unsetenv("MEGAC_KERNEL_TSAN");
    cr_assert(ok, "cg_cpu_compile of the instrumented kernel failed");
    FILE *f = fopen(ll, "r");
    cr_assert(f);
    static char line[1 << 16], prev[1 << 16];
    int nmasked = 0, nrange = 0;
    prev[0] = 0;
    while (fgets(line, sizeof line, f)) {
        bool range = strstr(line, "call void @__tsan_read_range(") || strstr(line, "call void @__tsan_write_range(");
        nrange += range;
        if (strstr(line, "@llvm.masked.") && strstr(line, " call ")) {
            nmasked++;
            cr_expect(strstr(prev, "@__tsan_read_range(") || strstr(prev, "@__tsan_write_range("),
                      "unchecked masked access:\n%s%s", prev, line);
        }
        memcpy(prev, line, sizeof line);
    }
    fclose(f);
    cr_expect_gt(nrange, 0, "no range checks: the 16-float vector accesses went unchecked");
    cr_log_info("%d range checks, %d masked accesses", nrange, nmasked);
    sched_free(s);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}
