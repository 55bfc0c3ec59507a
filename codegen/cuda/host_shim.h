/*
 * host_shim.h - runs the generated CUDA C on the host (target host-cuda).
 *
 * Pasted first into the host kernel source, which `cc -x c` compiles to a
 * .so exporting the CPU kernel ABI (runtime/kernel_abi.h): the runtime's
 * worker thread w calls megac_worker(a, w), and that OS thread runs block w.
 * Blocks are real threads, so they run concurrently and meet only through
 * the counters, exactly as on a GPU.
 *
 * The block's MK_THREADS CUDA threads are fibers on that OS thread, made
 * once per thread (ucontext, or on x86-64 a register swap that skips the
 * signal mask). A fiber runs until it waits at a barrier, then passes
 * control straight to the next fiber that can run, round-robin:
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
    int64_t prompt_end;
    uint64_t spin_ns;
    uint64_t flags;
} MegacArgs;

typedef struct float4 {
    _Alignas(16) float x;
    float y, z, w;
} float4;
_Static_assert(sizeof(float4) == 16, "float4 is 16 bytes, as in CUDA");

typedef struct uint4 {
    _Alignas(16) unsigned x;
    unsigned y, z, w;
} uint4;

typedef struct dim3 {
    unsigned x, y, z;
} dim3;

#define MK_HOST_STACK (64 * 1024)
enum { MK_WAIT_NONE, MK_WAIT_BLOCK, MK_WAIT_WARP };

/* A fiber's saved context. On x86-64 a switch saves the callee-saved
 * registers on the old stack and swaps stack pointers (a few ns); elsewhere
 * it is ucontext's swapcontext. */
#if defined(__x86_64__)
typedef struct MkCtx {
    void *sp;
} MkCtx;
void mk_ctx_swap(MkCtx *from, MkCtx *to) __attribute__((visibility("hidden")));
__asm__(".text\n"
        ".globl mk_ctx_swap\n"
        ".hidden mk_ctx_swap\n"
        ".type mk_ctx_swap,@function\n"
        "mk_ctx_swap:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq (%rsi), %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size mk_ctx_swap, .-mk_ctx_swap\n");

/* A context that, switched to, calls fn (which never returns) on the stack. */
static void mk_ctx_make(MkCtx *c, char *stack, size_t size, void (*fn)(void))
{
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = 0;                  /* fn's return address: none */
    memcpy(--sp, &fn, sizeof fn);   /* where the first switch returns to */
    for (int i = 0; i < 6; i++)
        *--sp = 0;              /* r15 r14 r13 r12 rbx rbp */
    c->sp = sp;
}
#else
typedef struct MkCtx {
    ucontext_t uc;
} MkCtx;

static void mk_ctx_swap(MkCtx *from, MkCtx *to)
{
    if (swapcontext(&from->uc, &to->uc) != 0)
        abort();
}

static void mk_ctx_make(MkCtx *c, char *stack, size_t size, void (*fn)(void))
{
    if (getcontext(&c->uc) != 0)
        abort();
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, fn, 0);
}
#endif

typedef struct MkFiber {
    MkCtx ctx;
    dim3 tid;
    unsigned shfl_seq;          /* shuffles done: picks the buffer */
    unsigned wait_kind;         /* MK_WAIT_*: what this fiber is parked on */
    unsigned wait_gen;          /* the barrier generation it waits to pass */
    int done;
    char *stack;
} MkFiber;

typedef struct MkWarp {
    unsigned count, gen;        /* warp barrier */
    uint32_t buf[2][32];        /* shuffle values, alternating */
} MkWarp;

typedef struct MkBlock {
    MkFiber f[MK_THREADS];
    MkWarp warp[MK_THREADS / 32];
    MkCtx sched;            /* megac_worker, waiting for the step to end */
    unsigned cur, left;
    unsigned bar_count, bar_gen;
    int bar_or, bar_or_res[2];  /* mk_sync_or: the OR so far, the result by generation parity */
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

/* Whether fiber n can run: unfinished, and past the barrier it waits at. */
static int mk_runnable(const MkBlock *b, unsigned n)
{
    const MkFiber *f = &b->f[n];
    if (f->done)
        return 0;
    if (f->wait_kind == MK_WAIT_BLOCK)
        return b->bar_gen != f->wait_gen;
    if (f->wait_kind == MK_WAIT_WARP)
        return b->warp[n >> 5].gen != f->wait_gen;
    return 1;
}

/* Switches from the running fiber to the next runnable one, round-robin;
 * returns when some fiber switches back to this one. Nobody runnable means
 * a barrier that not every thread reaches: a kernel bug. */
static void mk_switch(void)
{
    MkBlock *b = mk_blk;
    unsigned me = b->cur, n = me;
    for (unsigned i = 0; i < MK_THREADS; i++) {
        n = n + 1 == MK_THREADS ? 0 : n + 1;
        if (mk_runnable(b, n)) {
            b->cur = n;
            if (n != me)
                mk_ctx_swap(&b->f[me].ctx, &b->f[n].ctx);
            return;
        }
    }
    abort();
}

/* Parks the running fiber until the barrier generation moves past gen. */
static void mk_park(unsigned kind, unsigned gen)
{
    MkFiber *f = &mk_blk->f[mk_blk->cur];
    f->wait_kind = kind;
    f->wait_gen = gen;
    mk_switch();
    f->wait_kind = MK_WAIT_NONE;
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
    mk_park(MK_WAIT_BLOCK, gen);
}

/* __syncthreads_or: every thread gets whether any passed a nonzero pred.
 * The last to arrive publishes the OR in the slot of the barrier's
 * generation; two slots alternate, and a slot is written again only two
 * barriers later, after every fiber has read it. */
static int mk_sync_or(int pred)
{
    MkBlock *b = mk_blk;
    unsigned gen = b->bar_gen;
    b->bar_or |= pred != 0;
    if (++b->bar_count == MK_THREADS) {
        b->bar_or_res[gen & 1u] = b->bar_or;
        b->bar_or = 0;
        b->bar_count = 0;
        b->bar_gen++;
        return b->bar_or_res[gen & 1u];
    }
    mk_park(MK_WAIT_BLOCK, gen);
    return b->bar_or_res[gen & 1u];
}

static void mk_warp_barrier(MkWarp *w)
{
    unsigned gen = w->gen;
    if (++w->count == 32) {
        w->count = 0;
        w->gen++;
        return;
    }
    mk_park(MK_WAIT_WARP, gen);
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
/* cp.async: a copy now; nothing to wait for. */
static inline void mk_cp16(void *dst, const void *src) { memcpy(dst, src, 16); }
static inline void mk_cp16_part(void *dst, const void *src, int n)
{
    memcpy(dst, src, (size_t)n);
    memset((char *)dst + n, 0, (size_t)(16 - n));
}
static inline void mk_cp_wait(void) {}
static inline void mk_cp_commit(void) {}
#define MK_CP_WAIT_GROUP(n) ((void)(n))
#define MK_WSTAGE_DECL(name, bytes) static _Thread_local _Alignas(16) uint4 name[(bytes) / 16]
static inline uint4 mk_ldg4u(const uint4 *p) { return *p; }
static inline uint4 mk_ldg4u_na(const uint4 *p) { return *p; }
static inline unsigned mk_ldgu(const unsigned *p) { return *p; }
static inline unsigned mk_ldgus(const unsigned short *p) { return *p; }
/* The f16 in the low 16 bits of h as a float (exact). */
static inline float mk_f16(unsigned h)
{
    uint32_t s = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu, u;
    if (e == 0)
        return s ? -((float)m * 5.9604644775390625e-8f) : (float)m * 5.9604644775390625e-8f;
    u = s | (e == 31 ? 0x7f800000u | m << 13 : (e + 112) << 23 | m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* __byte_perm: byte i of the result is byte (s >> 4i) & 7 of y:x. */
static inline unsigned mk_prmt(unsigned x, unsigned y, unsigned s)
{
    unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}

static inline float mk_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline unsigned mk_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline void mk_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
/* An add to shared memory from many threads of the block: the fibers run
 * one at a time between barriers, so a plain add is atomic among them. */
static inline void mk_sm_addf(float *p, float v) { *p += v; }
static inline void mk_signal_add(unsigned *p, unsigned v) { __atomic_fetch_add(p, v, __ATOMIC_RELEASE); }
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

/* A fiber runs the worker's program once per step, then parks; the last
 * one to finish switches back to megac_worker. */
static void mk_fiber_main(void)
{
    for (;;) {
        mk_worker_run(mk_blk->a, mk_blk->worker);
        MkBlock *b = mk_blk;
        b->f[b->cur].done = 1;
        if (--b->left == 0)
            mk_ctx_swap(&b->f[b->cur].ctx, &b->sched);
        else
            mk_switch();
    }
}

static void mk_block_free(void *p)
{
    MkBlock *b = (MkBlock *)p;
    for (unsigned i = 0; b && i < MK_THREADS; i++)
        free(b->f[i].stack);
    free(b);
}

static int mk_key_made;

static void mk_key_make(void)
{
    if (pthread_key_create(&mk_blk_key, mk_block_free) != 0)
        abort();
    mk_key_made = 1;
}

/* dlclose: the key's destructor lives in this library. The runtime joins
 * every thread that ran a block (freeing its block) before it unloads; a
 * thread that ran one itself and unloads the library (a test's harness)
 * gets its block freed here, where it leaked 8.4 MB a load. */
__attribute__((destructor)) static void mk_key_delete(void)
{
    if (mk_blk) {
        mk_block_free(mk_blk);
        mk_blk = NULL;
    }
    if (mk_key_made)
        pthread_key_delete(mk_blk_key);
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
        f->stack = (char *)malloc(MK_HOST_STACK);
        if (!f->stack)
            abort();
        /* stagger the stack tops so that the fibers' hot frames do not all
         * fall into the same cache sets */
        mk_ctx_make(&f->ctx, f->stack, MK_HOST_STACK - 64 * (i % 61), mk_fiber_main);
    }
    if (pthread_setspecific(mk_blk_key, b) != 0)
        abort();
    mk_blk = b;
    return b;
}

/* Runs every fiber of the block until all have finished. */
static void mk_block_run(MkBlock *b)
{
    for (unsigned i = 0; i < MK_THREADS; i++) {
        b->f[i].done = 0;
        b->f[i].shfl_seq = 0;
        b->f[i].wait_kind = MK_WAIT_NONE;
    }
    b->left = MK_THREADS;
    b->cur = 0;
    mk_ctx_swap(&b->sched, &b->f[0].ctx);
}

MK_EXPORT void megac_worker(const MegacArgs *a, uint32_t worker);
void megac_worker(const MegacArgs *a, uint32_t worker)
{
    MkBlock *b = mk_block_get();
    b->a = a;
    b->worker = worker;
    b->bar_count = 0;
    b->bar_or = 0;
    mk_block_run(b);
}
