/*
 * codegen.c - shared helpers of the CPU and CUDA backends: running the
 * system C compiler/linker (`cc`) with its output captured, so that both
 * backends report a failing link or host compile the same way; and the
 * facts both kinds of kernel state about themselves.
 */
#include "codegen/codegen.h"
#include "runtime/kernel_abi.h"

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

/* The arena offset of io buffer `name`, or MEGAC_FACT_NONE. */
static uint64_t facts_io_offset(const Schedule *s, const char *name)
{
    int64_t b = sched_find_buffer(s, name);
    return b >= 0 && s->bufs[b].cls == BUF_IO ? s->bufs[b].offset : MEGAC_FACT_NONE;
}

_Static_assert(OP_COUNT <= 32 && DT_COUNT <= 64, "cg_used's masks have a bit per opcode and dtype");

void cg_used(const Schedule *s, uint32_t *ops, uint64_t *dtypes)
{
    *ops = *dtypes = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            const Inst *in = &s->workers[w].insts[i];
            if (in->kind != INST_OP)
                continue;
            *ops |= 1u << in->op;
            for (uint32_t k = 0; k < in->nacc; k++)
                if (s->accs[in->acc + k].buf != BUF_NONE)
                    *dtypes |= 1ull << s->bufs[s->accs[in->acc + k].buf].dtype;
        }
}

void cg_kernel_facts(const Schedule *s, uint64_t *v)
{
    v[MEGAC_FACT_WORKERS] = s->nworkers;
    v[MEGAC_FACT_COUNTERS] = s->nctrs;
    v[MEGAC_FACT_ARENA_BYTES] = s->arena_bytes;
    v[MEGAC_FACT_WEIGHTS_BYTES] = s->weights_bytes;
    v[MEGAC_FACT_VOCAB] = (uint64_t)s->shape.vocab_size;
    v[MEGAC_FACT_MAX_SEQ] = (uint64_t)s->shape.max_seq;
    v[MEGAC_FACT_IO_TOK] = facts_io_offset(s, "tok");
    v[MEGAC_FACT_IO_LOGITS] = facts_io_offset(s, "logits");
    v[MEGAC_FACT_IO_NEXT] = facts_io_offset(s, "next");
}

/* Layer l of a `kc.L` or `vc.L` buffer name (*v: 1 for vc), -1 for another. */
static int kv_cache_layer(const char *name, int *v)
{
    *v = 0;
    if ((name[0] != 'k' && name[0] != 'v') || name[1] != 'c' || name[2] != '.' || name[3] < '0' || name[3] > '9')
        return -1;
    char *end;
    long l = strtol(name + 3, &end, 10);
    *v = name[0] == 'v';
    return *end || l > INT32_MAX ? -1 : (int)l;
}

uint32_t cg_kv_layout(const Schedule *s, uint64_t *v)
{
    const ModelShape *sh = &s->shape;
    int64_t rope = sched_find_buffer(s, "rope"), hd = sh->head_dim, rows = sh->max_seq;
    uint32_t n = MEGAC_KVL_CACHES + 2 * (uint32_t)sh->n_layers, ops;
    uint64_t dts;
    v[MEGAC_KVL_LAYERS] = 0;
    cg_used(s, &ops, &dts);
    if (sh->n_layers < 1 || rope < 0 || s->bufs[rope].cls != BUF_WEIGHT || s->bufs[rope].dtype != DT_F32 ||
        s->bufs[rope].nelem != rows * hd ||
        (ops & (1u << OP_KV_STORE | 1u << OP_KV_EVICT | 1u << OP_KV_SNAP | 1u << OP_QUEST_SELECT)))
        return 1;
    for (uint32_t i = MEGAC_KVL_CACHES; i < n; i++)
        v[i] = UINT64_MAX;
    DType elem = DT_COUNT;
    for (uint32_t b = 0; b < s->nbufs; b++) {
        const Buffer *bf = &s->bufs[b];
        if (bf->cls != BUF_KV && bf->cls != BUF_STATE)
            continue;
        int isv, l = kv_cache_layer(bf->name, &isv);
        uint32_t at = MEGAC_KVL_CACHES + 2 * (uint32_t)l + (uint32_t)isv;
        if (l < 0 || l >= sh->n_layers || bf->cls != BUF_KV || v[at] != UINT64_MAX || bf->rank != 3 ||
            bf->shape[0] != sh->n_kv_heads || bf->shape[1] != rows || bf->shape[2] != hd ||
            (elem != DT_COUNT && bf->dtype != elem) ||
            (bf->dtype != DT_F32 && bf->dtype != DT_F16 && bf->dtype != DT_BF16))
            return 1; /* another buffer that lives across steps, or a cache of another shape */
        elem = bf->dtype;
        v[at] = bf->offset;
    }
    for (uint32_t i = MEGAC_KVL_CACHES; i < n; i++)
        if (v[i] == UINT64_MAX)
            return 1;
    v[MEGAC_KVL_LAYERS] = (uint64_t)sh->n_layers;
    v[MEGAC_KVL_HEADS] = (uint64_t)sh->n_kv_heads;
    v[MEGAC_KVL_ROWS] = (uint64_t)rows;
    v[MEGAC_KVL_HEAD_DIM] = (uint64_t)hd;
    v[MEGAC_KVL_ELEM] = elem == DT_F16 ? MEGAC_KV_F16 : elem == DT_BF16 ? MEGAC_KV_BF16 : MEGAC_KV_F32;
    v[MEGAC_KVL_ROPE_HALF] = sh->rope_pairing == 1;
    v[MEGAC_KVL_ROPE] = s->bufs[rope].offset;
    return n;
}
