/*
 * dtype.h - element types shared by weights, buffers and kernels.
 *
 * Block formats (Q8_0, Q4_0, Q4_1) store `block` elements in `block_bytes`
 * bytes exactly as GGUF does (research/techniques.md §1.1); a row of K
 * elements (K a multiple of 32) is K/32 consecutive blocks:
 *   Q8_0  {f16 d; i8 qs[32]}          w[j] = d * qs[j]
 *   Q4_0  {f16 d; u8 qs[16]}          w[j] = d * ((qs[j] & 15) - 8), w[j+16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1  {f16 d; f16 m; u8 qs[16]}   w[j] = d * (qs[j] & 15) + m,   w[j+16] = d * (qs[j] >> 4) + m
 *   Q5_0  {f16 d; u8 qh[4]; u8 qs[16]}
 *         w[j] = d * ((qs[j] & 15 | h(j) << 4) - 16), w[j+16] = d * ((qs[j] >> 4 | h(j+16) << 4) - 16),
 *         h(i) = bit i of the little-endian u32 qh
 *   Q5_1  {f16 d; f16 m; u8 qh[4]; u8 qs[16]}   as Q5_0 without the - 16, times d, then + m
 * and GGUF's k-quants, super-blocks of 256 (K a multiple of 256):
 *   Q4_K  {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: sub-block s (32
 *         elements) has 6-bit sc_s and m_s (ggml's get_scale_min_k4, in
 *         quant.c); element 64c+l (l < 32) is the low nibble of qs[32c+l]
 *         (sub-block 2c), element 64c+32+l its high nibble (2c+1);
 *         w = (d * sc_s) * q - dmin * m_s
 *   Q5_K  {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K's
 *         nibbles plus a fifth bit: bit 2c of qh[l] for element 64c+l,
 *         bit 2c+1 for element 64c+32+l
 *   Q6_K  {u8 ql[128]; u8 qh[64]; i8 sc[16]; f16 d}: in each half h of 128
 *         elements (ql + 64h, qh + 32h, sc + 8h), element 32i+l (i < 4,
 *         l < 32) takes 4 low bits from ql[l + 32(i&1)] (low nibble for
 *         i < 2, high for i >= 2) and 2 high bits from qh[l] >> 2i;
 *         w = (d * sc[2i + l/16]) * (q - 32)
 *   Q3_K  {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: 16 sub-blocks
 *         of 16; in each half h of 128 elements, element 128h+32i+l (i < 4,
 *         l < 32) takes 2 low bits from qs[32h+l] >> 2i and a high bit from
 *         hmask[l] >> (4h+i) (bit set: +0, clear: -4); sub-block s's 6-bit
 *         scale is (s < 8 ? scales[s] & 15 : scales[s-8] >> 4) | ((scales[8
 *         + s%4] >> 2(s/4)) & 3) << 4, minus 32;
 *         w = (d * sc) * (q_low - (h ? 0 : 4))
 *   Q2_K  {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: 16 sub-blocks of 16,
 *         element 128h+32i+l takes 2 bits from qs[32h+l] >> 2i; sub-block s
 *         has sc = scales[s] & 15 and m = scales[s] >> 4;
 *         w = (d * sc) * q - (dmin * m)
 * and the non-linear 4-bit ones (GGUF's IQ4), whose nibble n stands for
 * kv[n] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53,
 * 69, 89, 113}:
 *   IQ4_NL {f16 d; u8 qs[16]}: Q4_0's nibble order; w = d * kv[n]
 *   IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: 8 sub-blocks
 *         of 32 (K a multiple of 256), sub-block s's nibbles in qs[16s..]
 *         in Q4_0's order, its 6-bit scale ls = (scales_l[s/2] >> 4(s%2) &
 *         15) | (scales_h >> 2s & 3) << 4; w = (d * (ls - 32)) * kv[n]
 *
 * W8 and W4G* are megac's own quantized layouts (issue: quantized GEMV).
 * They are *row-blocked*: every row of a [rows][K] matrix is a
 * self-contained record of dtype_row_bytes(t, K) bytes, rows back to back,
 * so a tile of rows is one contiguous byte range and any K is allowed.
 * All multi-byte fields are little-endian; every record is a multiple of
 * 4 bytes (so rows stay 4-byte aligned when the matrix is).
 *   W8 (per-row int8, symmetric):
 *     row = {f32 s; i8 q[K]; zero bytes up to a multiple of 4}
 *     w[j] = s * q[j],  q in [-127, 127]
 *   W4G<G> (G = 32, 64, 128; group-wise along K, asymmetric, 4-bit):
 *     row = ceil(K/G) group records; group g holds elements
 *     [g*G, min(K, (g+1)*G)), L of them (the last group of a row is
 *     shorter when G does not divide K):
 *       {f16 s; u8 z; u8 0; u8 qs[16 * ceil(L/32)]}
 *     qs is cut in chunks of 16 bytes, one per 32 elements, laid out like
 *     Q4_0: byte 16c+i holds element 32c+i of the group in its low nibble
 *     and element 32c+16+i in its high nibble (i < 16). Nibbles past L hold
 *     z (they dequantize to 0 and are never read).
 *       w = s * (q - z),  q, z in [0, 15]; computed in f32 as
 *       s * (float)(q - z) (one rounding), by every backend and the
 *       reference alike.
 * For row-blocked types the table's `block` is the group along K (W8: 1)
 * and `block_bytes` the bytes of one full group (W8: 1, the scale apart).
 *
 * W8A8, W4A8G<G>, Q4_0A8, Q4_1A8, Q5_0A8, Q5_1A8, Q8_0A8, Q2_KA8,
 * Q3_KA8, Q4_KA8, Q5_KA8, Q6_KA8, IQ4_NLA8 and IQ4_XSA8 have exactly the
 * bytes of W8, W4G<G> and GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS (whose blocks stay as
 * stored: a GGUF file with int8 activations, as llama.cpp runs it); the
 * name
 * tells the GEMV to quantize its input too: x is cut in blocks of 32 along
 * K (the last one shorter), each block b gets d_b = max|x_b| / 127 (f32)
 * and xq_j = rint(x_j / d_b) in [-127, 127] (f32 division, nearest with
 * ties to even; 0 when d_b is 0), and the
 * products are integer sums per block:
 *   W8A8:    y = s * sum_b d_b * sum_{j in b} q_j * xq_j
 *   W4A8G:   y = sum_g s_g * sum_{b in g} d_b * sum_{j in b} (q_j - z_g) * xq_j
 *   Q4_1A8:  y = sum_b d_b * (dw_b * sum_{j in b} q_j * xq_j + m_b * sum_{j in b} xq_j)
 *   Q4_0A8:  y = sum_b d_b * dw_b * (sum_{j in b} q_j * xq_j - 8 * sum_{j in b} xq_j)
 *   Q5_0A8:  y = sum_b d_b * dw_b * (sum_{j in b} q_j * xq_j - 16 * sum_{j in b} xq_j)
 *   Q5_1A8:  y = sum_b d_b * (dw_b * sum_{j in b} q_j * xq_j + m_b * sum_{j in b} xq_j)
 *   Q8_0A8:  y = sum_b d_b * dw_b * sum_{j in b} q_j * xq_j
 *   Q2_KA8 to Q6_KA8, IQ4_NLA8, IQ4_XSA8: y = sum_b d_b * sum_{j in b}
 *            w_j * xq_j, w_j the format's own value of weight j (d sc q -
 *            dmin m for Q2_K, Q4_K, Q5_K, d sc (q - 32) for Q6_K, d sc
 *            (q - 4) for Q3_K, d kv[n] for IQ4; per sub-block, the
 *            integer sums times its scales)
 *            (dw_b, m_b: the weight block's scale and min; Q5's q_j has
 *            its fifth bit)
 * (groups are multiples of 32, so blocks never straddle a group).
 */
#ifndef MEGAC_DTYPE_H
#define MEGAC_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*      name    text     block block_bytes */
#define DTYPE_LIST(X)                  \
    X(F32, "f32", 1, 4)                \
    X(F16, "f16", 1, 2)                \
    X(BF16, "bf16", 1, 2)              \
    X(I32, "i32", 1, 4)                \
    X(I8, "i8", 1, 1)                  \
    X(Q8_0, "q8_0", 32, 34)            \
    X(Q4_0, "q4_0", 32, 18)            \
    X(Q4_1, "q4_1", 32, 20)            \
    X(W8, "w8", 1, 1)                  \
    X(W4G32, "w4g32", 32, 20)          \
    X(W4G64, "w4g64", 64, 36)          \
    X(W4G128, "w4g128", 128, 68)       \
    X(W8A8, "w8a8", 1, 1)              \
    X(W4A8G32, "w4a8g32", 32, 20)      \
    X(W4A8G64, "w4a8g64", 64, 36)      \
    X(W4A8G128, "w4a8g128", 128, 68)  \
    X(Q4_1A8, "q4_1a8", 32, 20)        \
    X(Q8_0A8, "q8_0a8", 32, 34)        \
    X(Q5_0, "q5_0", 32, 22)            \
    X(Q5_1, "q5_1", 32, 24)            \
    X(Q4_K, "q4_k", 256, 144)          \
    X(Q5_K, "q5_k", 256, 176)          \
    X(Q6_K, "q6_k", 256, 210)          \
    X(Q5_0A8, "q5_0a8", 32, 22)        \
    X(Q5_1A8, "q5_1a8", 32, 24)        \
    X(Q4_KA8, "q4_ka8", 256, 144)      \
    X(Q5_KA8, "q5_ka8", 256, 176)      \
    X(Q6_KA8, "q6_ka8", 256, 210)      \
    X(Q4_0A8, "q4_0a8", 32, 18)        \
    X(IQ4_NL, "iq4_nl", 32, 18)        \
    X(IQ4_XS, "iq4_xs", 256, 136)      \
    X(Q3_K, "q3_k", 256, 110)          \
    X(Q2_K, "q2_k", 256, 84)           \
    X(IQ4_NLA8, "iq4_nla8", 32, 18)    \
    X(IQ4_XSA8, "iq4_xsa8", 256, 136)  \
    X(Q3_KA8, "q3_ka8", 256, 110)      \
    X(Q2_KA8, "q2_ka8", 256, 84)

typedef enum {
#define X(n, s, b, bb) DT_##n,
    DTYPE_LIST(X)
#undef X
    DT_COUNT
} DType;

const char *dtype_name(DType t);
int dtype_from_name(const char *s);         /* -1 if unknown */
int dtype_block(DType t);                   /* elements per block (group) */
int dtype_block_bytes(DType t);
/* Bytes for n elements (n must be a multiple of the block). For a
 * row-blocked type, n is taken as one row (dtype_row_bytes). */
size_t dtype_bytes(DType t, int64_t n);
/* True for W8 and W4G*: byte sizes depend on the row length. */
bool dtype_is_rowwise(DType t);
/* True for the weight-only formats (GGUF blocks, W8, W4G*, and the A8
 * variants of W8 and W4G*). */
bool dtype_is_quant(DType t);
/* True for W8A8, W4A8G* and the GGUF blocks' A8 forms (Q4_0A8, Q4_1A8,
 * Q5_0A8, Q5_1A8, Q8_0A8, Q2_KA8 to Q6_KA8, IQ4_NLA8, IQ4_XSA8): the GEMV
 * quantizes its input to int8.
 * (Inline, like dtype_layout: the CPU kernel body, which links nothing of
 * ir/, uses them too.) */
static inline bool dtype_is_a8(DType t)
{
    return t == DT_W8A8 || t == DT_W4A8G32 || t == DT_W4A8G64 || t == DT_W4A8G128 || t == DT_Q4_1A8 ||
           t == DT_Q5_0A8 || t == DT_Q5_1A8 || t == DT_Q8_0A8 || t == DT_Q4_KA8 || t == DT_Q5_KA8 || t == DT_Q6_KA8 ||
           t == DT_Q4_0A8 || t == DT_IQ4_NLA8 || t == DT_IQ4_XSA8 || t == DT_Q3_KA8 || t == DT_Q2_KA8;
}

/* True for the dtypes a CUDA bundle stores in its own block order
 * (compiler/quant.c: quant_kernel_order; kernel_body.cuh's mk_is_planar):
 * Q4_0, Q4_1, Q8_0 and W4. */
static inline bool dtype_is_cuda_ordered(DType t)
{
    return t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q8_0 || t == DT_W4G32 || t == DT_W4G64 || t == DT_W4G128;
}

/* True for GGUF's k-quants (Q2_K to Q6_K): super-blocks of 256. */
static inline bool dtype_is_kquant(DType t)
{
    return t == DT_Q4_K || t == DT_Q5_K || t == DT_Q6_K || t == DT_Q3_K || t == DT_Q2_K;
}

/* The A16 dtype with the same bytes (W8A8 -> W8, W4A8G32 -> W4G32,
 * Q4_1A8 -> Q4_1, Q5_0A8 -> Q5_0, Q8_0A8 -> Q8_0, ...);
 * t itself for the others. */
static inline DType dtype_layout(DType t)
{
    switch (t) {
    case DT_W8A8: return DT_W8;
    case DT_W4A8G32: return DT_W4G32;
    case DT_W4A8G64: return DT_W4G64;
    case DT_W4A8G128: return DT_W4G128;
    case DT_Q4_0A8: return DT_Q4_0;
    case DT_Q4_1A8: return DT_Q4_1;
    case DT_Q5_0A8: return DT_Q5_0;
    case DT_Q5_1A8: return DT_Q5_1;
    case DT_Q8_0A8: return DT_Q8_0;
    case DT_Q4_KA8: return DT_Q4_K;
    case DT_Q5_KA8: return DT_Q5_K;
    case DT_Q6_KA8: return DT_Q6_K;
    case DT_IQ4_NLA8: return DT_IQ4_NL;
    case DT_IQ4_XSA8: return DT_IQ4_XS;
    case DT_Q3_KA8: return DT_Q3_K;
    case DT_Q2_KA8: return DT_Q2_K;
    default: return t;
    }
}
/* Bytes of one row of k elements (block formats: k a multiple of the
 * block). */
size_t dtype_row_bytes(DType t, int64_t k);
/* Bytes of a whole tensor: rows = product of all but the last dim, each a
 * row of shape[rank-1] elements (rank 0: one element). */
size_t dtype_tensor_bytes(DType t, int rank, const int64_t *shape);

#endif
