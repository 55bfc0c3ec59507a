/*
 * cuda_host.c - cg_hostcuda_compile: the generated CUDA C, with host_shim.h
 * in place of the GPU prelude, compiled for the host by the system C
 * compiler into a .so with the CPU kernel ABI:
 *   cc -x c -std=gnu11 -O2 -fPIC -shared -U_FORTIFY_SOURCE -o kernel.so SRC -lm -pthread
 * The source is kept next to the .so (NAME.host.c) so the exact kernel
 * that ran can be read. _FORTIFY_SOURCE is off because its longjmp check
 * refuses the fiber switches between stacks. The compiler's output is
 * reported on failure.
 */
#include "codegen/cuda/cuda.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


/* kernel.so -> kernel.host.c */
static char *host_source_path(const char *so_path)
{
    size_t n = strlen(so_path);
    if (n > 3 && strcmp(so_path + n - 3, ".so") == 0)
        n -= 3;
    return xasprintf("%.*s.host.c", (int)n, so_path);
}

static bool host_write(const char *path, const char *text, Diag *d)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        diag_file_error(d, path, "cannot write the host kernel source: %s", strerror(errno));
        return false;
    }
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok)
        diag_file_error(d, path, "cannot write the host kernel source: %s", strerror(errno));
    return ok;
}

static bool host_cc(const char *src, const char *so_path, Diag *d)
{
    char *argv[] = {"cc", "-x", "c", "-std=gnu11", "-O2", "-fPIC", "-shared", "-U_FORTIFY_SOURCE",
                    "-fno-stack-protector", "-o", (char *)so_path, (char *)src, "-lm", "-pthread", NULL};
    char *out = NULL;
    bool ok = cg_run_cc(argv, &out);
    if (!ok)
        diag_file_error(d, so_path, "cc failed on the host CUDA kernel %s:\n%s", src, out);
    free(out);
    return ok;
}

bool cg_hostcuda_compile(const Schedule *s, const char *so_path, Diag *d)
{
    if (!cuda_schedule_check(s, d))
        return false;
    CudaLayout l = cuda_layout(s, true);
    char *text = cuda_source_build(s, &l, true);
    char *src = host_source_path(so_path);
    bool ok = host_write(src, text, d) && host_cc(src, so_path, d);
    free(text);
    free(src);
    return ok;
}
