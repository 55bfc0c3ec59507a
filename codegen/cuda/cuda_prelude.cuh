/*
 * cuda_prelude.cuh - the platform primitives kernel_body.cuh is written
 * against, for NVRTC (a GPU). host_shim.h defines the same names for the
 * host. Pasted first into every GPU kernel source; nothing here includes a
 * header, so NVRTC needs no include path.
 */
#define MK_DEV __device__
#define MK_INLINE __device__ __forceinline__
#define MK_SHARED __shared__
#define MK_ALIGN16 __align__(16)
#define MK_INF __int_as_float(0x7f800000)
#define MK_EXPORT extern "C" __device__
#define MK_TABLE static __device__ const

/* runtime/kernel_abi.h's structs, with the same layout (cuda_source.c
 * emits MK_ARGS_BYTES and the offsets it checks from the C definitions). */
typedef struct MegacAbort {
    unsigned flag;
    unsigned worker, pc, counter, value, threshold;
} MegacAbort;

typedef struct MegacArgs {
    const void *weights;
    void *arena;
    unsigned *counters;
    MegacAbort *abort_info;
    long long pos;
    unsigned long long timeout_ns;
    long long prompt_end;
    unsigned long long spin_ns;
    unsigned long long flags;
} MegacArgs;

MK_INLINE unsigned mk_tid(void) { return threadIdx.x; }
MK_INLINE void mk_sync(void) { __syncthreads(); }
MK_INLINE int mk_sync_or(int pred) { return __syncthreads_or(pred); }
MK_INLINE float mk_shfl_xor_f(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
MK_INLINE int mk_shfl_xor_i(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
MK_INLINE uint4 mk_ldg4u(const uint4 *p) { return __ldg(p); }
/* The same load, not allocated in L1 (a weight read once per step). */
MK_INLINE uint4 mk_ldg4u_na(const uint4 *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
MK_INLINE unsigned mk_ldgu(const unsigned *p) { return __ldg(p); }
MK_INLINE unsigned mk_ldgus(const unsigned short *p) { return __ldg(p); }
/* 16 bytes from global memory to shared memory by an asynchronous copy
 * (cp.async, sm_80+: no register holds them); mk_cp_wait waits for all of
 * this thread's. */
MK_INLINE void mk_cp16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(__cvta_generic_to_global(src))
                 : "memory");
}
/* The first n (1-16) of those 16 bytes, the rest of dst zero-filled: no
 * read past them. */
MK_INLINE void mk_cp16_part(void *dst, const void *src, int n)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(__cvta_generic_to_global(src)), "r"(n)
                 : "memory");
}
MK_INLINE void mk_cp_wait(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* The weight pipe's groups (kernel_body.cuh: mk_gemv_pipe): close this
 * thread's copies issued since the last into a group; wait until no more
 * than n (a constant) of its groups are still in flight. */
MK_INLINE void mk_cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
#define MK_CP_WAIT_GROUP(n) asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory")
/* The weight stage: dynamic shared memory, sized at launch. */
#define MK_WSTAGE_DECL(name, bytes) extern __shared__ __align__(16) uint4 name[]
MK_INLINE unsigned mk_prmt(unsigned x, unsigned y, unsigned s) { return __byte_perm(x, y, s); }
MK_INLINE float mk_as_float(unsigned u) { return __uint_as_float(u); }
/* The f16 in the low 16 bits of h as a float: one exact conversion. */
MK_INLINE float mk_f16(unsigned h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
}
MK_INLINE unsigned mk_as_uint(float f) { return __float_as_uint(f); }
MK_INLINE void mk_fence(void) { __threadfence(); }
/* An add to shared memory from many threads of the block. */
MK_INLINE void mk_sm_addf(float *p, float v) { atomicAdd(p, v); }
/* A signal: add with release semantics at GPU scope. After the block's
 * barrier it publishes every thread's writes (PTX release cumulativity),
 * without a separate full fence. */
MK_INLINE void mk_signal_add(unsigned *p, unsigned v)
{
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
MK_INLINE unsigned mk_cas(unsigned *p, unsigned cmp, unsigned v) { return atomicCAS(p, cmp, v); }
MK_INLINE void mk_nanosleep(unsigned ns) { __nanosleep(ns); }

MK_INLINE unsigned mk_ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

MK_INLINE unsigned long long mk_time_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
