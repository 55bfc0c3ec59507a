/*
 * codegen.c - shared helpers of the CPU and CUDA backends: running the
 * system C compiler/linker (`cc`) with its output captured, so that both
 * backends report a failing link or host compile the same way.
 */
#include "codegen/codegen.h"

#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Reads fd to its end into an xmalloc'd NUL-terminated string. */
static char *drain(int fd)
{
    size_t cap = 4096, len = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (len + 1024 > cap)
            buf = xrealloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    buf[len] = 0;
    return buf;
}

bool cg_run_cc(char *const argv[], char **output)
{
    int fds[2];
    if (pipe(fds) != 0) {
        *output = xasprintf("pipe failed: %s", strerror(errno));
        return false;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        *output = xasprintf("cannot run %s: %s", argv[0], strerror(rc));
        return false;
    }
    *output = drain(fds[0]);
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            free(*output);
            *output = xasprintf("waitpid(%s) failed: %s", argv[0], strerror(errno));
            return false;
        }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
