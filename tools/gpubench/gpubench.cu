/*
 * gpubench.cu - the baseline megac's CUDA decode is compared with: one
 * batch-1 decode step of a Llama-shaped model done the usual way, with
 * cuBLAS bf16 GEMVs (cublasGemmEx, bf16 weights and inputs, f32 compute
 * and outputs) and small hand-written kernels for RMSNorm, RoPE + KV
 * append, attention, SiLU*mul, residual adds and the argmax, all captured
 * once into a CUDA graph and replayed. Synthetic weights; the attention
 * reads `pos + 1` cached rows.
 *
 *   gpubench DIM HIDDEN LAYERS HEADS KV_HEADS HEAD_DIM VOCAB POS [ITERS]
 *   gpubench --read-gbps [MIB]
 *
 * The first prints one JSON object: us_per_token, weight_bytes, kv_bytes,
 * gbps. The second measures the device's read-bandwidth ceiling (a kernel
 * that only reads MIB mebibytes, default 4096, with 16-byte loads; median
 * of 15 runs) and prints {"read_gbps": ...}.
 * Built by scripts/gpu-check.sh with nvcc (-lcublas); not part of megac.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define CB(x)                                                                                  \
    do {                                                                                       \
        cublasStatus_t s_ = (x);                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, (int)s_);        \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

typedef __nv_bfloat16 bf16;

struct Shape {
    int dim, hidden, layers, heads, kv_heads, hd, vocab, pos;
};

struct Layer {
    bf16 *wq, *wk, *wv, *wo, *wg, *wu, *wd, *kc, *vc;
    float *an, *fn;
};

__global__ void fill_bf16(bf16 *p, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        p[i] = __float2bfloat16(((h >> 8) & 0xffff) / 65536.0f * 0.04f - 0.02f);
    }
}

__global__ void fill_f32(float *p, size_t n, float v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

/* out = bf16(x * w / rms(x)); one block */
__global__ void rmsnorm(const float *x, const float *w, bf16 *out, int n)
{
    __shared__ float red[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += x[i] * x[i];
    for (int m = 16; m; m >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, m);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        for (int m = 16; m; m >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, m);
        if (threadIdx.x == 0)
            red[0] = s;
    }
    __syncthreads();
    float r = rsqrtf(red[0] / n + 1e-5f);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        out[i] = __float2bfloat16(x[i] * r * w[i]);
}

/* rotate q and k (half pairing), append k and v at pos; one block per head */
__global__ void rope_append(float *q, float *k, const float *v, bf16 *kc, bf16 *vc, int heads, int kvh, int hd, int S,
                            int pos)
{
    int h = blockIdx.x, half = hd / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float f = powf(10000.0f, -2.0f * i / hd) * pos, c = cosf(f), s = sinf(f);
        float *x = q + h * hd;
        float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = a * s + b * c;
        if (h < kvh) {
            float *y = k + h * hd;
            a = y[i];
            b = y[i + half];
            float r0 = a * c - b * s, r1 = a * s + b * c;
            kc[((size_t)h * S + pos) * hd + i] = __float2bfloat16(r0);
            kc[((size_t)h * S + pos) * hd + i + half] = __float2bfloat16(r1);
            vc[((size_t)h * S + pos) * hd + i] = __float2bfloat16(v[h * hd + i]);
            vc[((size_t)h * S + pos) * hd + i + half] = __float2bfloat16(v[h * hd + i + half]);
        }
    }
}

/* one block per q head: scores in shared memory, softmax, weighted V */
__global__ void attention(const float *q, const bf16 *kc, const bf16 *vc, bf16 *out, int heads, int kvh, int hd, int S,
                          int pos)
{
    extern __shared__ float sc[];
    __shared__ float red[2];
    int h = blockIdx.x, kh = h / (heads / kvh), n = pos + 1;
    const bf16 *K = kc + (size_t)kh * S * hd, *V = vc + (size_t)kh * S * hd;
    float scale = rsqrtf((float)hd);
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        float s = 0.0f;
        for (int d = 0; d < hd; d++)
            s += q[h * hd + d] * __bfloat162float(K[(size_t)t * hd + d]);
        sc[t] = s * scale;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = -INFINITY, l = 0.0f;
        for (int t = 0; t < n; t++)
            m = fmaxf(m, sc[t]);
        for (int t = 0; t < n; t++)
            l += __expf(sc[t] - m);
        red[0] = m;
        red[1] = l;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int t = 0; t < n; t++)
            o += __expf(sc[t] - red[0]) * __bfloat162float(V[(size_t)t * hd + d]);
        out[h * hd + d] = __float2bfloat16(o / red[1]);
    }
}

__global__ void silu_mul(const float *g, const float *u, bf16 *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = __float2bfloat16(g[i] / (1.0f + __expf(-g[i])) * u[i]);
}

__global__ void add(float *x, const float *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += y[i];
}

__global__ void argmax(const float *x, int n, int *out)
{
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    float best = -INFINITY;
    int idx = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (x[i] > best) {
            best = x[i];
            idx = i;
        }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = idx;
    __syncthreads();
    for (int s = blockDim.x / 2; s; s >>= 1) {
        if (threadIdx.x < s && (bv[threadIdx.x + s] > bv[threadIdx.x] ||
                                (bv[threadIdx.x + s] == bv[threadIdx.x] && bi[threadIdx.x + s] < bi[threadIdx.x]))) {
            bv[threadIdx.x] = bv[threadIdx.x + s];
            bi[threadIdx.x] = bi[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *out = bi[0];
}

/* Reads n uint4 and keeps a value the compiler cannot drop. */
__global__ void read_only(const uint4 *p, size_t n, unsigned *sink)
{
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u)
        *sink = acc;
}

static int read_gbps(size_t mib)
{
    size_t bytes = mib << 20, n = bytes / sizeof(uint4);
    uint4 *p;
    unsigned *sink;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMalloc(&sink, sizeof(unsigned)));
    CK(cudaMemset(p, 1, bytes));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms(15);
    for (int r = -2; r < (int)ms.size(); r++) {
        CK(cudaEventRecord(e0));
        read_only<<<sms * 8, 512>>>(p, n, sink);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        if (r >= 0)
            CK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    printf("{\"read_gbps\": %.1f, \"bytes\": %zu}\n", bytes / (ms[ms.size() / 2] * 1e6), bytes);
    return 0;
}

static bf16 *alloc_bf16(size_t n, unsigned seed)
{
    bf16 *p;
    CK(cudaMalloc(&p, n * sizeof(bf16)));
    fill_bf16<<<1024, 256>>>(p, n, seed);
    return p;
}

static float *alloc_f32(size_t n, float v)
{
    float *p;
    CK(cudaMalloc(&p, n * sizeof(float)));
    fill_f32<<<256, 256>>>(p, n, v);
    return p;
}

/* y[rows] = W[rows][cols] . x, bf16 in, f32 out */
static void gemv(cublasHandle_t h, const bf16 *W, const bf16 *x, float *y, int rows, int cols)
{
    const float one = 1.0f, zero = 0.0f;
    CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, 1, cols, &one, W, CUDA_R_16BF, cols, x, CUDA_R_16BF, cols,
                    &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--read-gbps"))
        return read_gbps(argc > 2 ? (size_t)atoll(argv[2]) : 4096);
    if (argc < 9) {
        fprintf(stderr, "usage: gpubench DIM HIDDEN LAYERS HEADS KV_HEADS HEAD_DIM VOCAB POS [ITERS]\n"
                        "       gpubench --read-gbps [MIB]\n");
        return 2;
    }
    Shape s = {atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7]),
               atoi(argv[8])};
    int iters = argc > 9 ? atoi(argv[9]) : 200, S = s.pos + 1, qd = s.heads * s.hd, kvd = s.kv_heads * s.hd;
    std::vector<Layer> L(s.layers);
    size_t wbytes = 0;
    for (int l = 0; l < s.layers; l++) {
        unsigned seed = 100u * l;
        L[l].wq = alloc_bf16((size_t)qd * s.dim, seed + 1);
        L[l].wk = alloc_bf16((size_t)kvd * s.dim, seed + 2);
        L[l].wv = alloc_bf16((size_t)kvd * s.dim, seed + 3);
        L[l].wo = alloc_bf16((size_t)s.dim * qd, seed + 4);
        L[l].wg = alloc_bf16((size_t)s.hidden * s.dim, seed + 5);
        L[l].wu = alloc_bf16((size_t)s.hidden * s.dim, seed + 6);
        L[l].wd = alloc_bf16((size_t)s.dim * s.hidden, seed + 7);
        L[l].kc = alloc_bf16((size_t)kvd * S, seed + 8);
        L[l].vc = alloc_bf16((size_t)kvd * S, seed + 9);
        L[l].an = alloc_f32(s.dim, 1.0f);
        L[l].fn = alloc_f32(s.dim, 1.0f);
        wbytes += 2 * ((size_t)(qd + 2 * kvd) * s.dim + (size_t)s.dim * qd + 3 * (size_t)s.hidden * s.dim) + 8 * s.dim;
    }
    bf16 *lm = alloc_bf16((size_t)s.vocab * s.dim, 7);
    float *fnorm = alloc_f32(s.dim, 1.0f);
    wbytes += 2 * (size_t)s.vocab * s.dim + 4 * s.dim;
    float *x = alloc_f32(s.dim, 0.5f), *q = alloc_f32(qd, 0), *k = alloc_f32(kvd, 0), *v = alloc_f32(kvd, 0);
    float *o = alloc_f32(s.dim, 0), *g = alloc_f32(s.hidden, 0), *u = alloc_f32(s.hidden, 0);
    float *logits = alloc_f32(s.vocab, 0);
    bf16 *xn = alloc_bf16(s.hidden > qd ? s.hidden : qd, 1), *att = alloc_bf16(qd, 2), *hb = alloc_bf16(s.hidden, 3);
    int *next;
    CK(cudaMalloc(&next, sizeof(int)));
    CK(cudaDeviceSynchronize());

    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cublasHandle_t h;
    CB(cublasCreate(&h));
    CB(cublasSetStream(h, st));
    void *ws;
    CK(cudaMalloc(&ws, 32 << 20));
    CB(cublasSetWorkspace(h, ws, 32 << 20));
    int blk = 256, smem = S * (int)sizeof(float);
    CK(cudaFuncSetAttribute(attention, cudaFuncAttributeMaxDynamicSharedMemorySize, smem > 48 * 1024 ? smem : 48 * 1024));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < s.layers; l++) {
        rmsnorm<<<1, 1024, 0, st>>>(x, L[l].an, xn, s.dim);
        gemv(h, L[l].wq, xn, q, qd, s.dim);
        gemv(h, L[l].wk, xn, k, kvd, s.dim);
        gemv(h, L[l].wv, xn, v, kvd, s.dim);
        rope_append<<<s.heads, 64, 0, st>>>(q, k, v, L[l].kc, L[l].vc, s.heads, s.kv_heads, s.hd, S, s.pos);
        attention<<<s.heads, 128, smem, st>>>(q, L[l].kc, L[l].vc, att, s.heads, s.kv_heads, s.hd, S, s.pos);
        gemv(h, L[l].wo, att, o, s.dim, qd);
        add<<<(s.dim + blk - 1) / blk, blk, 0, st>>>(x, o, s.dim);
        rmsnorm<<<1, 1024, 0, st>>>(x, L[l].fn, xn, s.dim);
        gemv(h, L[l].wg, xn, g, s.hidden, s.dim);
        gemv(h, L[l].wu, xn, u, s.hidden, s.dim);
        silu_mul<<<(s.hidden + blk - 1) / blk, blk, 0, st>>>(g, u, hb, s.hidden);
        gemv(h, L[l].wd, hb, o, s.dim, s.hidden);
        add<<<(s.dim + blk - 1) / blk, blk, 0, st>>>(x, o, s.dim);
    }
    rmsnorm<<<1, 1024, 0, st>>>(x, fnorm, xn, s.dim);
    gemv(h, lm, xn, logits, s.vocab, s.dim);
    argmax<<<1, 1024, 0, st>>>(logits, s.vocab, next);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));

    for (int i = 0; i < 20; i++)
        CK(cudaGraphLaunch(exec, st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < iters; i++)
        CK(cudaGraphLaunch(exec, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    double us = 1e3 * ms / iters;
    size_t kvbytes = 2ull * 2 * s.layers * (size_t)kvd * (s.pos + 1);
    printf("{\"us_per_token\": %.2f, \"weight_bytes\": %zu, \"kv_bytes\": %zu, \"gbps\": %.1f}\n", us, wbytes,
           kvbytes, (wbytes + kvbytes) / (us * 1e3));
    return 0;
}
