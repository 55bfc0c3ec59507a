/*
 * host_shim.h - runs the generated CUDA C on the host (target host-cuda).
 *
 * Pasted first into the host kernel source, which `cc -x c` compiles to a
 * .so exporting the CPU kernel ABI (runtime/kernel_abi.h): the runtime's
 * worker thread w calls megac_worker(a, w), and that OS thread runs block w.
 * Blocks are real threads, so they run concurrently and meet only through
 * the counters, exactly as on a GPU.
 *
 * The block's MK_THREADS CUDA threads are fibers on that OS thread (stacks
 * made once with makecontext; switches with _setjmp/_longjmp, which do not
 * touch the signal mask). A fiber runs until it reaches a barrier, then
 * yields to the block's round-robin scheduler:
 *   __syncthreads   a block barrier (all MK_THREADS fibers arrive)
 *   warp shuffles   each lane writes its value, a warp barrier (the warp's
 *                   32 fibers), each lane reads its partner's; two buffers
 *                   alternate so one barrier per shuffle suffices
 * `__shared__` data is _Thread_local (one OS thread = one block). Atomics
 * and fences are C11 atomics with the orders the GPU code uses: acquire
 * loads, seq_cst fences, relaxed adds after a fence, seq_cst CAS.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>

#define MK_DEV static
#define MK_INLINE static inline
#define MK_SHARED static _Thread_local
#define MK_ALIGN16 _Alignas(16)
#define MK_INF INFINITY
#define MK_EXPORT __attribute__((visibility("default")))
#define MK_TABLE static const

typedef struct MegacAbort {
    uint32_t flag;
    uint32_t worker, pc, counter, value, threshold;
} MegacAbort;

typedef struct MegacArgs {
    const void *weights;
    void *arena;
    uint32_t *counters;
    MegacAbort *abort_info;
    int64_t pos;
    uint64_t timeout_ns;
} MegacArgs;

typedef struct float4 {
    _Alignas(16) float x;
    float y, z, w;
} float4;
_Static_assert(sizeof(float4) == 16, "float4 is 16 bytes, as in CUDA");

typedef struct dim3 {
    unsigned x, y, z;
} dim3;

#define MK_HOST_STACK (64 * 1024)

typedef struct MkFiber {
    jmp_buf jb;
    ucontext_t uc;
    dim3 tid;
    unsigned shfl_seq;          /* shuffles done: picks the buffer */
    int started, done;
    void *stack;
} MkFiber;

typedef struct MkWarp {
    unsigned count, gen;        /* warp barrier */
    uint32_t buf[2][32];        /* shuffle values, alternating */
} MkWarp;

typedef struct MkBlock {
    MkFiber f[MK_THREADS];
    MkWarp warp[MK_THREADS / 32];
    jmp_buf sched;
    ucontext_t sched_uc;
    unsigned cur, left;
    unsigned bar_count, bar_gen;
    const MegacArgs *a;
    unsigned worker;
} MkBlock;

static _Thread_local MkBlock *mk_blk;
static pthread_key_t mk_blk_key;
static pthread_once_t mk_blk_once = PTHREAD_ONCE_INIT;

#define threadIdx (mk_blk->f[mk_blk->cur].tid)
#define blockIdx ((dim3){mk_blk->worker, 0, 0})
#define blockDim ((dim3){MK_THREADS, 1, 1})

static void mk_worker_run(const MegacArgs *a, unsigned worker);

/* Back to the scheduler; returns when the scheduler resumes this fiber. */
static void mk_yield(void)
{
    MkFiber *f = &mk_blk->f[mk_blk->cur];
    if (!_setjmp(f->jb))
        _longjmp(mk_blk->sched, 1);
}

static void __syncthreads(void)
{
    MkBlock *b = mk_blk;
    unsigned gen = b->bar_gen;
    if (++b->bar_count == MK_THREADS) {
        b->bar_count = 0;
        b->bar_gen++;
        return;
    }
    while (b->bar_gen == gen)
        mk_yield();
}

static void mk_warp_barrier(MkWarp *w)
{
    unsigned gen = w->gen;
    if (++w->count == 32) {
        w->count = 0;
        w->gen++;
        return;
    }
    while (w->gen == gen)
        mk_yield();
}

static uint32_t mk_shfl_xor_bits(uint32_t v, int m)
{
    MkFiber *f = &mk_blk->f[mk_blk->cur];
    unsigned lane = f->tid.x & 31u, par = f->shfl_seq++ & 1u;
    MkWarp *w = &mk_blk->warp[f->tid.x >> 5];
    w->buf[par][lane] = v;
    mk_warp_barrier(w);
    return w->buf[par][lane ^ (unsigned)m];
}

static float __shfl_xor_sync(unsigned mask, float v, int m)
{
    (void)mask;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u = mk_shfl_xor_bits(u, m);
    memcpy(&v, &u, sizeof v);
    return v;
}

static inline unsigned mk_tid(void) { return threadIdx.x; }
static inline void mk_sync(void) { __syncthreads(); }
static inline float mk_shfl_xor_f(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
static inline int mk_shfl_xor_i(int v, int m) { return (int)mk_shfl_xor_bits((uint32_t)v, m); }
static inline float4 mk_ldg4(const float4 *p) { return *p; }
static inline void mk_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void mk_atomic_add(unsigned *p, unsigned v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned mk_ld_acquire(const unsigned *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

static inline unsigned mk_cas(unsigned *p, unsigned cmp, unsigned v)
{
    __atomic_compare_exchange_n(p, &cmp, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}

/* The block's other fibers are parked at a barrier: let other OS threads
 * (other blocks) run. */
static inline void mk_nanosleep(unsigned ns)
{
    (void)ns;
    sched_yield();
}

static inline unsigned long long mk_time_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* ---- the block: fibers and their scheduler ---- */

/* A fiber runs the worker's program once per step, then parks. */
static void mk_fiber_main(void)
{
    for (;;) {
        mk_worker_run(mk_blk->a, mk_blk->worker);
        mk_blk->f[mk_blk->cur].done = 1;
        mk_yield();
    }
}

static void mk_block_free(void *p)
{
    MkBlock *b = (MkBlock *)p;
    for (unsigned i = 0; b && i < MK_THREADS; i++)
        free(b->f[i].stack);
    free(b);
}

static void mk_key_make(void)
{
    if (pthread_key_create(&mk_blk_key, mk_block_free) != 0)
        abort();
}

/* This OS thread's block, made on first use; freed when the thread exits. */
static MkBlock *mk_block_get(void)
{
    if (mk_blk)
        return mk_blk;
    pthread_once(&mk_blk_once, mk_key_make);
    MkBlock *b = (MkBlock *)calloc(1, sizeof *b);
    if (!b)
        abort();
    for (unsigned i = 0; i < MK_THREADS; i++) {
        MkFiber *f = &b->f[i];
        f->tid.x = i;
        f->stack = malloc(MK_HOST_STACK);
        if (!f->stack || getcontext(&f->uc) != 0)
            abort();
        f->uc.uc_stack.ss_sp = f->stack;
        f->uc.uc_stack.ss_size = MK_HOST_STACK;
        f->uc.uc_link = NULL;
        makecontext(&f->uc, mk_fiber_main, 0);
    }
    if (pthread_setspecific(mk_blk_key, b) != 0)
        abort();
    mk_blk = b;
    return b;
}

/* Runs every fiber of the block round-robin until all have finished. */
static void mk_block_run(MkBlock *b)
{
    for (unsigned i = 0; i < MK_THREADS; i++) {
        b->f[i].done = 0;
        b->f[i].shfl_seq = 0;
    }
    b->left = MK_THREADS;
    b->cur = 0;
    while (b->left) {
        MkFiber *f = &b->f[b->cur];
        if (!f->done) {
            if (!_setjmp(b->sched)) {
                if (!f->started) {
                    f->started = 1;
                    swapcontext(&b->sched_uc, &f->uc);
                } else {
                    _longjmp(f->jb, 1);
                }
            }
            f = &b->f[b->cur];
            if (f->done)
                b->left--;
        }
        b->cur = (b->cur + 1) % MK_THREADS;
    }
}

MK_EXPORT void megac_worker(const MegacArgs *a, uint32_t worker);
void megac_worker(const MegacArgs *a, uint32_t worker)
{
    MkBlock *b = mk_block_get();
    b->a = a;
    b->worker = worker;
    b->bar_count = 0;
    mk_block_run(b);
}
