/*
 * cpu_backend.c - runs a kernel.so (cpu and host-cuda targets) on W
 * persistent worker threads.
 *
 * The threads start once at open. A step: the caller zeroes the counters,
 * writes the token into the arena's `tok` buffer, bumps the step
 * generation and wakes the workers that are parked; worker w calls
 * megac_worker(&args, w) and reports done; the caller sleeps until all W
 * are done, then checks the abort flag that a kernel wait sets when its
 * watchdog expires. Between steps a worker first watches the generation
 * for CPU_SPIN_NS (when there is a CPU for each worker, and MEGAC_NO_SPIN
 * is not set), then parks on a condition variable: decode calls step
 * after step, and waking parked threads cost ~3% of a 1.7 ms SmolLM2 step
 * on a 2-vCPU VM. In that case the kernel's waits inside a step also spin
 * for CPU_WAIT_SPIN_NS before they sleep (MegacArgs.spin_ns): a worker
 * that slept on its futex took ~0.3 ms to wake there.
 *
 * The kernel is loaded from a private copy of the bytes bundle.c checked,
 * an anonymous memory file (memfd "megac-kernel.so"), else
 * $TMPDIR/megac-XXXXXX/kernel.so, removed as soon as it is loaded: dlopen
 * returns the library already loaded under the same path, so a bundle
 * recompiled while a model of it is open would otherwise get the old
 * kernel.so (a false schedule mismatch, or silently the old code). The
 * memfd leaves nothing on disk whenever the process is killed; the temp
 * file, a moment's window. Where no copy can be made or loaded (a noexec
 * temp folder), the bundle's file is loaded itself.
 *
 * MEGAC_WATCHDOG_MS in the environment (read at open, rt_watchdog_ns) sets
 * the kernel's wait deadline (MegacArgs.timeout_ns); unset, the kernel's
 * default holds.
 */
#include "runtime/backend.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a worker watches for the next step before it parks. */
#define CPU_SPIN_NS 500000
/* Arenas of at least this many bytes are reset page by page
 * (arena_zero_resident; smaller ones are zeroed whole). */
#define CPU_ARENA_PAGED_MIN (256u << 10)
/* With a CPU for each worker: how long a kernel wait spins before it
 * sleeps (MegacArgs.spin_ns; the kernel's own default is for shared CPUs). */
#define CPU_WAIT_SPIN_NS 5000000

typedef void (*megac_worker_fn)(const MegacArgs *a, uint32_t worker);

typedef struct CpuPool CpuPool;

typedef struct CpuThread {
    CpuPool *pool;
    uint32_t index;
    pthread_t th;
    bool started;
} CpuThread;

struct CpuPool {
    void *dl;
    int memfd;                  /* the memfd dl was loaded from, or -1 */
    megac_worker_fn worker;
    void *arena;                /* an anonymous mapping of arena_bytes */
    size_t arena_bytes;
    uint32_t *counters;
    MegacAbort abort_info;
    MegacArgs args;
    uint32_t nthreads;
    CpuThread *threads;
    pthread_mutex_t mu;
    pthread_cond_t go;          /* workers park here for a new generation */
    pthread_cond_t done;        /* the caller waits here for ndone == W */
    uint64_t gen;               /* step generation (atomic; written under mu) */
    uint32_t ndone;
    uint32_t parked;            /* workers waiting on `go` */
    bool spin;                  /* a CPU for each worker: watch gen before parking */
    bool quit;                  /* atomic; written under mu */
};

static uint64_t cpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Watches the generation for CPU_SPIN_NS; true when it moved (or quit). */
static bool cpu_spin_for_step(CpuPool *pool, uint64_t seen)
{
    uint64_t t0 = cpu_now_ns();
    for (;;) {
        for (int i = 0; i < 256; i++) {
            if (__atomic_load_n(&pool->gen, __ATOMIC_ACQUIRE) != seen || __atomic_load_n(&pool->quit, __ATOMIC_ACQUIRE))
                return true;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        if (cpu_now_ns() - t0 > CPU_SPIN_NS)
            return false;
        /* the caller, who has no CPU of its own, may be waiting for this
         * one between steps (sampling the next token): let it run */
        sched_yield();
    }
}

/* Worker thread: wait until the generation moves, run, report done.
 * Its float arithmetic flushes subnormal results to zero (MXCSR FTZ) and
 * reads subnormal operands as zero (DAZ): an x86 core takes a microcode
 * assist, some hundred cycles, for each instruction that meets one, and
 * a GEMV input holding them (silu of a gate below about -87, as random
 * weights give) read at a fifth of its speed: a Llama-3.2-1B-shaped
 * Q3_K_M file of random weights decoded 2.1x faster with them flushed
 * (megac bench, docs/performance.md). The values lost are below 2^-126
 * in magnitude; the application's own threads keep their MXCSR. */
static void *cpu_thread_main(void *p)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_ldmxcsr(__builtin_ia32_stmxcsr() | 0x8040u); /* FTZ (bit 15) | DAZ (bit 6) */
#endif
    CpuThread *t = p;
    CpuPool *pool = t->pool;
    uint64_t seen = 0;
    for (;;) {
        if (pool->spin)
            cpu_spin_for_step(pool, seen);
        pthread_mutex_lock(&pool->mu);
        while (pool->gen == seen && !pool->quit) {
            pool->parked++;
            pthread_cond_wait(&pool->go, &pool->mu);
            pool->parked--;
        }
        if (pool->quit) {
            pthread_mutex_unlock(&pool->mu);
            return NULL;
        }
        seen = pool->gen;
        pthread_mutex_unlock(&pool->mu);

        pool->worker(&pool->args, t->index);

        pthread_mutex_lock(&pool->mu);
        if (++pool->ndone == pool->nthreads)
            pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->mu);
    }
}

/* Whether switch `name` is on in the environment: set, not empty, not "0"
 * (MEGAC_NO_PIN=0 had turned pinning off too). */
static bool env_on(const char *name)
{
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

/* Looks up a symbol of the kernel; NULL with m->err set if absent. */
static const void *cpu_symbol(megac_model *m, void *dl, const char *path, const char *name)
{
    dlerror();
    const void *p = dlsym(dl, name);
    const char *e = dlerror();
    if (e || !p) {
        rt_fail(m, MEGAC_ERR_FORMAT, "%s: error: the kernel does not export '%s' (%s)", path, name,
                e ? e : "null");
        return NULL;
    }
    return p;
}

/* The kernel must say it is the kernel this manifest describes. */
static megac_status cpu_kernel_check(megac_model *m, CpuPool *pool, const char *path)
{
    const uint64_t *abi, *hash, *facts;
    const void *fn;
    if (!(abi = cpu_symbol(m, pool->dl, path, "megac_kernel_abi")))
        return MEGAC_ERR_FORMAT;
    if (*abi != MEGAC_KERNEL_ABI)   /* before the symbols this ABI added */
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s: error: kernel ABI %" PRIu64 ", but this runtime speaks ABI %u: recompile the bundle",
                       path, *abi, MEGAC_KERNEL_ABI);
    if (!(hash = cpu_symbol(m, pool->dl, path, "megac_schedule_hash")) ||
        !(facts = cpu_symbol(m, pool->dl, path, "megac_kernel_facts")) ||
        !(fn = cpu_symbol(m, pool->dl, path, "megac_worker")))
        return MEGAC_ERR_FORMAT;
    pool->worker = (megac_worker_fn)(uintptr_t)fn;
    if (*hash != m->man.schedule_hash)
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s: error: the kernel was built for schedule %016" PRIx64
                       ", but the manifest and schedule.sched are %016" PRIx64,
                       path, *hash, m->man.schedule_hash);
    megac_status st = rt_facts_check(m, facts, path, "the kernel was built with");
    if (st)
        return st;
    /* the KV layout, its words as many as the symbol's size says */
    const uint64_t *kv = dlsym(pool->dl, "megac_kv_layout");
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    size_t nwords = kv && dladdr1(kv, &info, (void **)&sym, RTLD_DL_SYMENT) && sym ? sym->st_size / 8 : 0;
    return rt_kv_layout_set(m, kv, nwords, path);
}

static megac_status cpu_memory_init(megac_model *m, CpuPool *pool)
{
    size_t bytes = (size_t)((m->man.arena_bytes + 63) / 64 * 64);
    if (bytes == 0)
        bytes = 64;
    /* an anonymous mapping: its pages read as zero and are committed only
     * when a step first writes them, so the KV rows past the context used
     * so far cost neither memory nor time (SmolLM2-135M's arena is 188 MB,
     * its f32 cache at 4096 rows: allocated and zeroed at open it took
     * ~0.15 s of a 0.17 s `megac run` and was all resident) */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return rt_fail(m, MEGAC_ERR_NOMEM, "cannot map the %zu-byte arena: %s", bytes, strerror(errno));
    pool->arena = p;
    pool->arena_bytes = bytes;
    pool->counters = calloc(m->man.counters ? m->man.counters : 1, sizeof(uint32_t));
    if (!pool->counters)
        return rt_fail(m, MEGAC_ERR_NOMEM, "cannot allocate %u counters", m->man.counters);
    pool->args.weights = m->weights;
    pool->args.arena = pool->arena;
    pool->args.counters = pool->counters;
    pool->args.abort_info = &pool->abort_info;
    pool->args.timeout_ns = rt_watchdog_ns();
    m->logits = (const float *)((const char *)pool->arena + m->man.off_logits);
    return MEGAC_OK;
}

/* With at least as many allowed CPUs as workers, worker i is pinned to the
 * i-th of them: a worker that lands on a busy core holds up every wait on
 * it, so the scheduler's placement decided a whole run's speed
 * (SmolLM2 Q4_0 at 2 workers: 300 or 480 tok/s from one process to the
 * next). MEGAC_NO_PIN leaves placement to the scheduler. Best effort. */
static void cpu_threads_pin(CpuPool *pool)
{
    cpu_set_t allowed;
    if (env_on("MEGAC_NO_PIN") || sched_getaffinity(0, sizeof allowed, &allowed) != 0 ||
        (uint32_t)CPU_COUNT(&allowed) < pool->nthreads)
        return;
    uint32_t i = 0;
    for (int c = 0; c < CPU_SETSIZE && i < pool->nthreads; c++) {
        if (!CPU_ISSET(c, &allowed))
            continue;
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        (void)pthread_setaffinity_np(pool->threads[i++].th, sizeof one, &one);
    }
}

static megac_status cpu_threads_start(megac_model *m, CpuPool *pool)
{
    pool->nthreads = m->man.workers;
    cpu_set_t allowed;
    pool->spin = !env_on("MEGAC_NO_SPIN") && sched_getaffinity(0, sizeof allowed, &allowed) == 0 &&
                 (uint32_t)CPU_COUNT(&allowed) >= pool->nthreads;
    pool->args.spin_ns = pool->spin ? CPU_WAIT_SPIN_NS : 0;
    pool->threads = calloc(pool->nthreads, sizeof *pool->threads);
    if (!pool->threads)
        return rt_fail(m, MEGAC_ERR_NOMEM, "cannot allocate %u threads", pool->nthreads);
    /* the workers start with every signal blocked (they inherit this
     * thread's mask): a SIGINT or SIGTERM goes to the application's own
     * threads, whose handlers then run while the application's work waits
     * (delivered to a worker, a handler removing files raced with the main
     * thread writing them) */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    megac_status st = MEGAC_OK;
    for (uint32_t i = 0; i < pool->nthreads && !st; i++) {
        CpuThread *t = &pool->threads[i];
        t->pool = pool;
        t->index = i;
        int e = pthread_create(&t->th, NULL, cpu_thread_main, t);
        if (e != 0)
            st = rt_fail(m, MEGAC_ERR_NOMEM, "pthread_create (worker %u of %u): %s", i, pool->nthreads, strerror(e));
        else
            t->started = true;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (st)
        return st;
    cpu_threads_pin(pool);
    return MEGAC_OK;
}

/* Loads the checked kernel bytes from an anonymous memory file (memfd):
 * nothing on disk, so a process killed at any moment leaves nothing
 * behind; NULL where that cannot be (no memfd, or one that may not be
 * executed: vm.memfd_noexec). */
static void *cpu_dlopen_memfd(const megac_model *m, int *memfd)
{
    int fd = m->kernel_image ? (int)syscall(SYS_memfd_create, "megac-kernel.so", 1u /* MFD_CLOEXEC */) : -1;
    if (fd < 0)
        return NULL;
    bool ok = true;
    for (size_t at = 0; ok && at < m->kernel_len;) {
        ssize_t w = write(fd, (const char *)m->kernel_image + at, m->kernel_len - at);
        ok = w > 0;
        at += ok ? (size_t)w : 0;
    }
    /* dlopen knows a library by its path first: a library still loaded
     * from an earlier memfd of the same number (one not unloaded when its
     * model closed) would be returned for this one. Such a number is
     * passed over; the memfd stays open while its library is (cpu_close),
     * so that two open models never share one. */
    char path[64];
    for (int tries = 0; ok && tries < 64; tries++) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        void *old = dlopen(path, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
        if (!old)
            break;
        dlclose(old);
        int next = fcntl(fd, F_DUPFD_CLOEXEC, fd + 1);
        close(fd);
        fd = next;
        ok = fd >= 0 && tries < 63;
    }
    void *dl = ok ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (dl)
        *memfd = fd;
    else if (fd >= 0)
        close(fd);
    return dl;
}

/* Writes the checked kernel bytes to a fresh temp folder and loads them
 * (where there is no memfd); NULL if that fails. */
static void *cpu_dlopen_copy(const megac_model *m)
{
    char copy[4096];
    const char *tmp = getenv("TMPDIR");
    char dir[4000];
    if (!m->kernel_image || !tmp || !*tmp)
        tmp = "/tmp";
    if (!m->kernel_image || snprintf(dir, sizeof dir, "%s/megac-XXXXXX", tmp) >= (int)sizeof dir || !mkdtemp(dir))
        return NULL;
    snprintf(copy, sizeof copy, "%s/kernel.so", dir);
    FILE *f = fopen(copy, "wb");
    bool ok = f && fwrite(m->kernel_image, 1, m->kernel_len, f) == m->kernel_len;
    if (f && fclose(f) != 0)
        ok = false;
    void *dl = ok ? dlopen(copy, RTLD_NOW | RTLD_LOCAL) : NULL;
    unlink(copy);       /* the mapping stays; the name is not needed */
    rmdir(dir);
    return dl;
}

static void cpu_close(megac_model *m)
{
    CpuPool *pool = m->be_state;
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    __atomic_store_n(&pool->quit, true, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->mu);
    for (uint32_t i = 0; pool->threads && i < pool->nthreads; i++)
        if (pool->threads[i].started)
            pthread_join(pool->threads[i].th, NULL);
    free(pool->threads);
    pthread_cond_destroy(&pool->go);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->mu);
    /* dlclose only after every thread that ran kernel code has exited */
    if (pool->dl)
        dlclose(pool->dl);
    if (pool->memfd >= 0)
        close(pool->memfd);
    free(pool->counters);
    if (pool->arena)
        munmap(pool->arena, pool->arena_bytes);
    free(pool);
    m->be_state = NULL;
    m->logits = NULL;
}

static megac_status cpu_open(megac_model *m)
{
    char path[4096];
    if (!rt_path(path, sizeof path, m->dir, m->man.kernel))
        return rt_fail(m, MEGAC_ERR_ARG, "%s: bundle path too long", m->dir);
    CpuPool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return rt_fail(m, MEGAC_ERR_NOMEM, "out of memory");
    pool->memfd = -1;
    if (pthread_mutex_init(&pool->mu, NULL) != 0 || pthread_cond_init(&pool->go, NULL) != 0 ||
        pthread_cond_init(&pool->done, NULL) != 0) {
        free(pool);     /* these inits cannot fail on Linux; if one did, nothing else was made */
        return rt_fail(m, MEGAC_ERR_NOMEM, "cannot create the worker pool's mutex and condition variables");
    }
    m->be_state = pool;
    pool->dl = cpu_dlopen_memfd(m, &pool->memfd);
    if (!pool->dl)
        pool->dl = cpu_dlopen_copy(m);
    if (!pool->dl)
        pool->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!pool->dl)
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot load the kernel: %s", path, dlerror());
    megac_status st;
    if ((st = cpu_kernel_check(m, pool, path)) || (st = cpu_memory_init(m, pool)) ||
        (st = cpu_threads_start(m, pool)))
        return st;
    return MEGAC_OK;
}

/* Starts one step on all workers and sleeps until every one is done. */
static void cpu_pool_run(CpuPool *pool)
{
    pthread_mutex_lock(&pool->mu);
    pool->ndone = 0;
    __atomic_store_n(&pool->gen, pool->gen + 1, __ATOMIC_RELEASE);
    if (pool->parked)
        pthread_cond_broadcast(&pool->go);
    while (pool->ndone < pool->nthreads)
        pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

static megac_status cpu_step(megac_model *m, int token, int pos)
{
    CpuPool *pool = m->be_state;
    memset(pool->counters, 0, (m->man.counters ? m->man.counters : 1) * sizeof(uint32_t));
    memset(&pool->abort_info, 0, sizeof pool->abort_info);
    int32_t tok = token;
    memcpy((char *)pool->arena + m->man.off_tok, &tok, sizeof tok);
    pool->args.pos = pos;
    pool->args.prompt_end = m->prompt_end;
    pool->args.flags = m->no_output ? MEGAC_STEP_NO_OUTPUT : 0;
    cpu_pool_run(pool);
    const MegacAbort *a = &pool->abort_info;
    if (a->flag && a->counter == UINT32_MAX)    /* the kernel refused the step itself */
        return rt_fail(m, MEGAC_ERR_KERNEL, "kernel refused position %u (flag %u, limit %u): nothing ran", a->value,
                       a->flag, a->threshold);
    if (a->flag)
        return rt_fail(m, MEGAC_ERR_KERNEL,
                       "kernel aborted at position %d: worker %u, pc %u waited on counter %u, which stayed at %u "
                       "below its threshold %u (watchdog)",
                       pos, a->worker, a->pc, a->counter, a->value, a->threshold);
    int32_t next;
    memcpy(&next, (const char *)pool->arena + m->man.off_next, sizeof next);
    m->next = next;
    return MEGAC_OK;
}

/* Zeroes the arena's pages that are in memory (mincore) and drops the
 * others (a swapped-out page would keep its data): every page reads as
 * zero after it, and the pages the last sequence used stay committed, so
 * the next one does not fault them in again (it did, a fault per page of
 * KV rows as a sequence grew: 1-1.5% of a SmolLM2-135M step on the Xeon
 * host). Costs what the last sequence used. 0 on success. */
static int arena_zero_resident(CpuPool *pool)
{
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0 || (uintptr_t)pool->arena % (uintptr_t)ps)
        return -1;
    size_t np = (size_t)((pool->arena_bytes + (uint64_t)ps - 1) / (uint64_t)ps);
    unsigned char *in = malloc(np);
    if (!in)
        return -1;
    if (mincore(pool->arena, (size_t)pool->arena_bytes, in) != 0) {
        free(in);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < np;) {
        size_t j = i;
        int res = in[i] & 1;
        while (j < np && (in[j] & 1) == res)
            j++;
        char *p = (char *)pool->arena + i * (size_t)ps;
        size_t len = (j - i) * (size_t)ps, left = (size_t)pool->arena_bytes - i * (size_t)ps;
        len = len < left ? len : left;
        if (res)
            memset(p, 0, len);
        else if (madvise(p, (j - i) * (size_t)ps, MADV_DONTNEED) != 0)
            rc = -1;
        i = j;
    }
    free(in);
    return rc;
}

/* A new sequence: state and KV start from zero, as after open. A large
 * arena zeroes only what is in memory (arena_zero_resident). */
static megac_status cpu_reset(megac_model *m)
{
    CpuPool *pool = m->be_state;
    if (pool->arena_bytes < CPU_ARENA_PAGED_MIN || arena_zero_resident(pool) != 0)
        memset(pool->arena, 0, pool->arena_bytes);
    return MEGAC_OK;
}

static megac_status cpu_arena_copy(megac_model *m, uint64_t off, void *buf, size_t len, bool to_arena)
{
    char *p = (char *)((CpuPool *)m->be_state)->arena + off;
    if (to_arena)
        memcpy(p, buf, len);
    else
        memcpy(buf, p, len);
    return MEGAC_OK;
}

const RtBackend rt_cpu_backend = {
    .name = "cpu",
    .open = cpu_open,
    .step = cpu_step,
    .reset = cpu_reset,
    .arena_copy = cpu_arena_copy,
    .close = cpu_close,
};
