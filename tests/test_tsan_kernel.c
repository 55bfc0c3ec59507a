/*
 * test_tsan_kernel.c - the ThreadSanitizer kernel in an ordinary build:
 * `MEGAC_KERNEL_TSAN=1 megac compile` writes a kernel.so whose accesses and
 * counter atomics call the TSan runtime (its undefined symbols say so), and
 * a process without that runtime refuses it at megac_open, naming the
 * missing symbol. MEGAC_KERNEL_TSAN=0 gives the plain kernel. The kernel
 * actually running under TSan is tests/tsan (MEGAC_TSAN builds only).
 */
#include "runtime/megac.h"

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
