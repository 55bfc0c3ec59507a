/*
 * quant.c - round-to-nearest weight quantization into the layouts of
 * ir/dtype.h, the matching dequantizers (GGUF blocks included), a scalar
 * reference GEMV on stored bytes, the CPU kernel's packed byte order for
 * 4-bit rows, and the pass that applies a model description's quant
 * knobs to its loaded weights (see quant.h).
 *
 * Dequantization is written once here, in f32 with one rounding per
 * product (and, for Q4_1, a second for the added minimum, as ggml's
 * reference does): backends must reproduce these values.
 */
#include "compiler/quant.h"
#include "codegen/cpu/kernel_table.h"
#include "compiler/weights_impl.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static float f16_at(const unsigned char *p)
{
    return f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static void u16_put(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)(v & 255);
    p[1] = (unsigned char)(v >> 8);
}

static long clampl(long v, long lo, long hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- W8: {f32 s; i8 q[K]; pad} ---- */

static void w8_quantize(const float *w, int64_t k, unsigned char *out)
{
    float amax = 0;
    for (int64_t j = 0; j < k; j++)
        amax = fabsf(w[j]) > amax ? fabsf(w[j]) : amax;
    float s = amax / 127.0f;
    memcpy(out, &s, 4);
    memset(out + 4, 0, dtype_row_bytes(DT_W8, k) - 4);
    for (int64_t j = 0; j < k && s > 0; j++)
        out[4 + j] = (unsigned char)(int8_t)clampl(lroundf(w[j] / s), -127, 127);
}

static void w8_dequant(const unsigned char *row, int64_t k, float *restrict y)
{
    float s;
    memcpy(&s, row, 4);
    for (int64_t j = 0; j < k; j++)
        y[j] = s * (float)(int8_t)row[4 + j];
}

/* ---- W4G<G>: groups of {f16 s; u8 z; u8 0; u8 qs[16 * ceil(L/32)]} ---- */

/* Byte and shift of element j of a group (chunks of 32 laid out as Q4_0). */
static size_t w4_nibble(int64_t j, int *shift)
{
    int64_t i = j % 32;
    *shift = i < 16 ? 0 : 4;
    return (size_t)(16 * (j / 32) + i % 16);
}

/* Bytes of a W4 group record of len elements. */
static size_t w4_group_bytes_of(int64_t len)
{
    return 4 + 16 * (size_t)((len + 31) / 32);
}

/* Quantizes a group of L values; returns its record size. */
static size_t w4_group_quantize(const float *w, int64_t len, unsigned char *out)
{
    float mn = 0, mx = 0;
    for (int64_t j = 0; j < len; j++) {
        mn = w[j] < mn ? w[j] : mn;
        mx = w[j] > mx ? w[j] : mx;
    }
    float s = (mx - mn) / 15.0f;
    uint16_t sh = f32_to_f16(s < 65504.0f ? s : 65504.0f);
    float sf = f16_to_f32(sh);
    long z = sf > 0 ? clampl(lroundf(-mn / sf), 0, 15) : 0;
    size_t qbytes = 16 * (size_t)((len + 31) / 32);
    u16_put(out, sf > 0 ? sh : 0);
    out[2] = (unsigned char)z;
    out[3] = 0;
    memset(out + 4, (int)(z | z << 4), qbytes);
    for (int64_t j = 0; j < len && sf > 0; j++) {
        int sft;
        size_t b = w4_nibble(j, &sft);
        long q = clampl(lroundf(w[j] / sf) + z, 0, 15);
        out[4 + b] = (unsigned char)((out[4 + b] & ~(15 << sft)) | q << sft);
    }
    return 4 + qbytes;
}

static size_t w4_group_dequant(const unsigned char *g, int64_t len, float *restrict y)
{
    float s = f16_at(g);
    int z = g[2];
    for (int64_t j = 0; j < len; j++) {
        int sft;
        size_t b = w4_nibble(j, &sft);
        y[j] = s * (float)(((g[4 + b] >> sft) & 15) - z);
    }
    return 4 + 16 * (size_t)((len + 31) / 32);
}

static void w4_quantize(int64_t gsz, const float *w, int64_t k, unsigned char *out)
{
    for (int64_t j = 0; j < k; j += gsz)
        out += w4_group_quantize(w + j, k - j < gsz ? k - j : gsz, out);
}

static void w4_dequant(int64_t gsz, const unsigned char *row, int64_t k, float *restrict y)
{
    for (int64_t j = 0; j < k; j += gsz)
        row += w4_group_dequant(row, k - j < gsz ? k - j : gsz, y + j);
}

/* ---- GGUF blocks (ggml's dequantize_row_*) ---- */

static void q8_0_dequant(const unsigned char *b, int64_t k, float *restrict y)
{
    for (int64_t i = 0; i < k / 32; i++, b += 34, y += 32) {
        float d = f16_at(b);
        for (int j = 0; j < 32; j++)
            y[j] = d * (float)(int8_t)b[2 + j];
    }
}

static void q4_0_dequant(const unsigned char *b, int64_t k, float *restrict y)
{
    for (int64_t i = 0; i < k / 32; i++, b += 18, y += 32) {
        float d = f16_at(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 15) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

static void q4_1_dequant(const unsigned char *b, int64_t k, float *restrict y)
{
    for (int64_t i = 0; i < k / 32; i++, b += 20, y += 32) {
        float d = f16_at(b), m = f16_at(b + 2);
        for (int j = 0; j < 16; j++) {
            float lo = d * (float)(b[4 + j] & 15);
            float hi = d * (float)(b[4 + j] >> 4);
            y[j] = lo + m;
            y[j + 16] = hi + m;
        }
    }
}

/* Q5_0 and Q5_1: the fifth bit of element j is bit j of the u32 qh. */
static void q5_dequant(bool q51, const unsigned char *b, int64_t k, float *restrict y)
{
    size_t bb = q51 ? 24 : 22, h = q51 ? 4 : 2;
    for (int64_t i = 0; i < k / 32; i++, b += bb, y += 32) {
        float d = f16_at(b), m = q51 ? f16_at(b + 2) : 0.0f;
        uint32_t qh = (uint32_t)b[h] | (uint32_t)b[h + 1] << 8 | (uint32_t)b[h + 2] << 16 | (uint32_t)b[h + 3] << 24;
        const unsigned char *qs = b + h + 4;
        for (int j = 0; j < 16; j++) {
            int x0 = (qs[j] & 15) | (int)((qh >> j) & 1) << 4, x1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            if (q51) {
                float lo = d * (float)x0, hi = d * (float)x1;
                y[j] = lo + m;
                y[j + 16] = hi + m;
            } else {
                y[j] = d * (float)(x0 - 16);
                y[j + 16] = d * (float)(x1 - 16);
            }
        }
    }
}

/* Sub-block s's 6-bit scale and min of a Q4_K/Q5_K super-block (ggml's
 * get_scale_min_k4). */
static void quant_kq_scale_min(const unsigned char *scales, int s, int *sc, int *m)
{
    if (s < 4) {
        *sc = scales[s] & 63;
        *m = scales[s + 4] & 63;
    } else {
        *sc = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4;
        *m = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4;
    }
}

/* Q4_K and Q5_K (ggml's dequantize_row_q4_K / q5_K): per sub-block of 32,
 * (d * sc) * q - dmin * m, each product rounded to f32. */
static void q45k_dequant(bool q5, const unsigned char *b, int64_t k, float *restrict y)
{
    for (int64_t i = 0; i < k / 256; i++, b += q5 ? 176 : 144) {
        float d = f16_at(b), dmin = f16_at(b + 2);
        const unsigned char *sc = b + 4, *qh = b + 16, *qs = b + (q5 ? 48 : 16);
        for (int c = 0; c < 4; c++, qs += 32)
            for (int half = 0; half < 2; half++, y += 32) {
                int s = 2 * c + half, scv, mv;
                quant_kq_scale_min(sc, s, &scv, &mv);
                float d1 = d * (float)scv, m1 = dmin * (float)mv;
                for (int l = 0; l < 32; l++) {
                    int q = half ? qs[l] >> 4 : qs[l] & 15;
                    if (q5)
                        q += (qh[l] >> s & 1) << 4;
                    y[l] = d1 * (float)q - m1;
                }
            }
    }
}

/* Q6_K (ggml's dequantize_row_q6_K): (d * sc) * (q - 32). */
static void q6k_dequant(const unsigned char *b, int64_t k, float *restrict y)
{
    for (int64_t i = 0; i < k / 256; i++, b += 210) {
        float d = f16_at(b + 208);
        for (int h = 0; h < 2; h++, y += 128) {
            const unsigned char *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
            for (int q = 0; q < 4; q++)
                for (int l = 0; l < 32; l++) {
                    int lo = q < 2 ? ql[l + 32 * (q & 1)] & 15 : ql[l + 32 * (q & 1)] >> 4;
                    int v = (lo | ((qh[l] >> (2 * q)) & 3) << 4) - 32;
                    y[32 * q + l] = d * (float)sc[2 * q + l / 16] * (float)v;
                }
        }
    }
}

/* Q3_K (ggml's dequantize_row_q3_K): per sub-block of 16, (d * sc) * q,
 * q = the 2 low bits less 4 where the hmask bit is clear. */
static void q3k_dequant(const unsigned char *b, int64_t k, float *restrict y)
{
    for (int64_t i = 0; i < k / 256; i++, b += 110) {
        const unsigned char *hm = b, *qs = b + 32, *sc = b + 96;
        float d = f16_at(b + 108);
        for (int e = 0; e < 256; e++) {
            int h = e / 128, sh = e % 128 / 32, l = e % 32, s = e / 16;
            int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4, hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            int q = (qs[32 * h + l] >> (2 * sh) & 3) - ((hm[l] >> (4 * h + sh) & 1) ? 0 : 4);
            y[e] = d * (float)((lo | hi << 4) - 32) * (float)q;
        }
        y += 256;
    }
}

/* Q2_K (ggml's dequantize_row_q2_K): per sub-block of 16, (d * sc) * q -
 * dmin * m. */
static void q2k_dequant(const unsigned char *b, int64_t k, float *restrict y)
{
    for (int64_t i = 0; i < k / 256; i++, b += 84) {
        const unsigned char *sc = b, *qs = b + 16;
        float d = f16_at(b + 80), dmin = f16_at(b + 82);
        for (int e = 0; e < 256; e++) {
            int s = e / 16, q = qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32)) & 3;
            y[e] = d * (float)(sc[s] & 15) * (float)q - dmin * (float)(sc[s] >> 4);
        }
        y += 256;
    }
}

/* IQ4's non-linear 4-bit values (ggml's kvalues_iq4nl). */
static const int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* IQ4_NL (ggml's dequantize_row_iq4_nl): d * kv[n], Q4_0's nibble order. */
static void iq4nl_dequant(const unsigned char *b, int64_t k, float *restrict y)
{
    for (int64_t i = 0; i < k / 32; i++, b += 18, y += 32) {
        float d = f16_at(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)iq4_values[b[2 + j] & 15];
            y[j + 16] = d * (float)iq4_values[b[2 + j] >> 4];
        }
    }
}

/* IQ4_XS (ggml's dequantize_row_iq4_xs): per sub-block of 32, (d * (ls -
 * 32)) * kv[n]. */
static void iq4xs_dequant(const unsigned char *b, int64_t k, float *restrict y)
{
    for (int64_t i = 0; i < k / 256; i++, b += 136) {
        float d = f16_at(b);
        unsigned sh = (unsigned)(b[2] | b[3] << 8);
        for (int s = 0; s < 8; s++, y += 32) {
            int ls = (b[4 + s / 2] >> (4 * (s % 2)) & 15) | (int)(sh >> (2 * s) & 3) << 4;
            float dl = d * (float)(ls - 32);
            const unsigned char *qs = b + 8 + 16 * s;
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)iq4_values[qs[j] & 15];
                y[j + 16] = dl * (float)iq4_values[qs[j] >> 4];
            }
        }
    }
}

/* ---- rows ---- */

void quant_row_quantize(DType t, const float *w, int64_t k, unsigned char *out)
{
    t = dtype_layout(t);
    switch (t) {
    case DT_F32: memcpy(out, w, (size_t)k * 4); return;
    case DT_F16:
    case DT_BF16:
        for (int64_t j = 0; j < k; j++)
            u16_put(out + 2 * j, t == DT_F16 ? f32_to_f16(w[j]) : f32_to_bf16(w[j]));
        return;
    case DT_W8: w8_quantize(w, k, out); return;
    case DT_W4G32: case DT_W4G64: case DT_W4G128: w4_quantize(dtype_block(t), w, k, out); return;
    default: die("quant_row_quantize: cannot quantize to %s", dtype_name(t));
    }
}

void quant_row_dequant(DType t, const unsigned char *row, int64_t k, float *restrict out)
{
    t = dtype_layout(t);
    switch (t) {
    case DT_F32: memcpy(out, row, (size_t)k * 4); return;
    case DT_F16:
    case DT_BF16:
        for (int64_t j = 0; j < k; j++) {
            uint16_t h = (uint16_t)(row[2 * j] | row[2 * j + 1] << 8);
            out[j] = t == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        return;
    case DT_Q8_0: q8_0_dequant(row, k, out); return;
    case DT_Q4_0: q4_0_dequant(row, k, out); return;
    case DT_Q4_1: q4_1_dequant(row, k, out); return;
    case DT_Q5_0: q5_dequant(false, row, k, out); return;
    case DT_Q5_1: q5_dequant(true, row, k, out); return;
    case DT_Q4_K: q45k_dequant(false, row, k, out); return;
    case DT_Q5_K: q45k_dequant(true, row, k, out); return;
    case DT_Q6_K: q6k_dequant(row, k, out); return;
    case DT_Q3_K: q3k_dequant(row, k, out); return;
    case DT_Q2_K: q2k_dequant(row, k, out); return;
    case DT_IQ4_NL: iq4nl_dequant(row, k, out); return;
    case DT_IQ4_XS: iq4xs_dequant(row, k, out); return;
    case DT_W8: w8_dequant(row, k, out); return;
    case DT_W4G32: case DT_W4G64: case DT_W4G128: w4_dequant(dtype_block(t), row, k, out); return;
    default: die("quant_row_dequant: %s is not a weight dtype", dtype_name(t));
    }
}

void quant_gemv_ref(DType t, const unsigned char *w, int64_t rows, int64_t k, const float *x, double *y)
{
    float *row = xmalloc((size_t)k * sizeof *row);
    size_t rb = dtype_row_bytes(t, k);
    for (int64_t r = 0; r < rows; r++) {
        quant_row_dequant(t, w + (size_t)r * rb, k, row);
        double s = 0;
        for (int64_t j = 0; j < k; j++)
            s += (double)row[j] * (double)x[j];
        y[r] = s;
    }
    free(row);
}

/* ---- int8 activations (W8A8, W4A8G*) ---- */

/* Block b of x (len <= 32 values) to int8: returns d = max|x| / 127. */
static float quant_act_block(const float *x, int64_t len, int8_t *q)
{
    float amax = 0;
    for (int64_t j = 0; j < len; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f;
    for (int64_t j = 0; j < len; j++)
        q[j] = d > 0 ? (int8_t)clampl((long)rintf(x[j] / d), -127, 127) : 0;
    return d;
}

/* One row of an A8 dtype against x: the integer sums of dtype.h, each
 * block's sum scaled in double. */
static double quant_row_a8(DType t, const unsigned char *row, int64_t k, const float *x)
{
    int8_t xq[32];
    int64_t g = t == DT_W8A8 ? k : dtype_block(t);
    double y = 0;
    for (int64_t g0 = 0; g0 < k; g0 += g) {
        int64_t glen = k - g0 < g ? k - g0 : g;
        float s;
        int z = 0;
        if (t == DT_W8A8) {
            memcpy(&s, row, 4);
        } else {
            s = f16_at(row);
            z = row[2];
        }
        double gs = 0;
        for (int64_t b = 0; b < glen; b += 32) {
            int64_t len = glen - b < 32 ? glen - b : 32;
            float d = quant_act_block(x + g0 + b, len, xq);
            long isum = 0;
            for (int64_t j = 0; j < len; j++) {
                int q;
                if (t == DT_W8A8) {
                    q = (int8_t)row[4 + g0 + b + j];
                } else {
                    int sft;
                    size_t by = w4_nibble(b + j, &sft);
                    q = ((row[4 + by] >> sft) & 15) - z;
                }
                isum += (long)q * xq[j];
            }
            gs += (double)d * (double)isum;
        }
        y += (double)s * gs;
        if (t != DT_W8A8)
            row += w4_group_bytes_of(glen);
    }
    return y;
}

/* One Q8_0A8, Q4_0A8, Q4_1A8, Q5_0A8 or Q5_1A8 row (GGUF blocks,
 * k % 32 == 0) against x: per block dw sum q xq (less 8 or 16 dw sum xq
 * for Q4_0 and Q5_0, plus m sum xq for Q4_1 and Q5_1) in integers, scaled
 * by the block's d. */
static double quant_row_gguf_a8(DType t, const unsigned char *row, int64_t k, const float *x)
{
    int8_t xq[32];
    DType l = dtype_layout(t);
    bool min = l == DT_Q4_1 || l == DT_Q5_1, q5 = l == DT_Q5_0 || l == DT_Q5_1;
    int qs = l == DT_Q8_0 || l == DT_Q4_0 || l == DT_Q4_1 ? 2 + 2 * min : 6 + 2 * min; /* offset of the quants */
    size_t bb = (size_t)dtype_block_bytes(t);
    double y = 0;
    for (int64_t b = 0; b < k / 32; b++, row += bb) {
        float d = quant_act_block(x + 32 * b, 32, xq);
        uint32_t qh = q5 ? (uint32_t)row[qs - 4] | (uint32_t)row[qs - 3] << 8 | (uint32_t)row[qs - 2] << 16 |
                               (uint32_t)row[qs - 1] << 24
                         : 0;
        long qx = 0, sx = 0;
        for (int j = 0; j < 32; j++) {
            int q = l == DT_Q8_0 ? (int8_t)row[2 + j] : j < 16 ? row[qs + j] & 15 : row[qs + j - 16] >> 4;
            q += (int)(qh >> j & 1) << 4;
            qx += (long)q * xq[j];
            sx += xq[j];
        }
        double z = l == DT_Q5_0 ? 16.0 : l == DT_Q4_0 ? 8.0 : 0.0; /* the zero point */
        double off = min ? (double)f16_at(row + 2) * (double)sx : -z * (double)f16_at(row) * (double)sx;
        y += (double)d * ((double)f16_at(row) * (double)qx + off);
    }
    return y;
}

/* One Q2_KA8 to Q6_KA8, IQ4_NLA8 or IQ4_XSA8 row against x: per
 * block of 32, its d times the sum of the weights' values (the format's own, dequantized
 * exactly: quant_row_dequant) times xq, in double. */
static double quant_row_kq_a8(DType t, const unsigned char *row, int64_t k, const float *x)
{
    float *w = xmalloc((size_t)k * sizeof *w);
    quant_row_dequant(t, row, k, w);
    int8_t xq[32];
    double y = 0;
    for (int64_t b = 0; b < k / 32; b++) {
        float d = quant_act_block(x + 32 * b, 32, xq);
        double s = 0;
        for (int j = 0; j < 32; j++)
            s += (double)w[32 * b + j] * xq[j];
        y += (double)d * s;
    }
    free(w);
    return y;
}

void quant_gemv_a8_ref(DType t, const unsigned char *w, int64_t rows, int64_t k, const float *x, double *y)
{
    ASSERT(dtype_is_a8(t));
    size_t rb = dtype_row_bytes(t, k);
    bool values = dtype_is_kquant(dtype_layout(t)) || t == DT_IQ4_NLA8 || t == DT_IQ4_XSA8;
    for (int64_t r = 0; r < rows; r++)
        y[r] = dtype_is_rowwise(t) ? quant_row_a8(t, w + (size_t)r * rb, k, x)
               : values            ? quant_row_kq_a8(t, w + (size_t)r * rb, k, x)
                                   : quant_row_gguf_a8(t, w + (size_t)r * rb, k, x);
}

/* ---- the CPU kernel's byte order for 4-bit and Q8_0 rows ----
 * (layout: codegen/cpu/kernel_table.h) Q8_0 rows as their scales, then
 * their integers; Q4_0, Q4_1, Q5_0, Q5_1, W4G32 (W4A8G32) rows regrouped
 * into superblocks of four blocks, headers field by field, nibbles
 * reordered so that a 64-byte load and one AND per nibble give the
 * weights of four blocks without shuffles; IQ4_NL rows regrouped the
 * same way, their nibbles as stored. Packing is a permutation of a
 * row's bytes and nibbles: no value is converted, rows keep their size
 * and offset (so schedules, access ranges and bundle sizes are those of
 * ir/dtype.h), and unpacking restores the input exactly. */

bool quant_cpu_packed(DType t, int64_t k)
{
    return kt_row_packed((int)t, k) != 0;
}

/* Nibble e (< 32) of a block in ir/dtype.h's order: byte e % 16, low
 * nibble for e < 16. */
static unsigned pack_nib_get(const unsigned char *q, int e)
{
    return e < 16 ? q[e] & 15u : (unsigned)q[e - 16] >> 4;
}

/* The byte and shift of element e in the packed order: word e % 4,
 * nibble e / 4. */
static int pack_nib_byte(int e, int *shift)
{
    int n = e / 4;
    *shift = 4 * (n % 2);
    return 4 * (e % 4) + n / 2;
}

/* Packed byte 4 i + m holds elements 8 m + i (low nibble) and 8 m + 4 + i
 * (high): pack_nib_byte's order, byte by byte (element by element, with
 * a read-modify-write each, the packing took 30% of a 1B-shaped Q4_0
 * compile's time, 12.5% so). */
static void pack_nibs(const unsigned char *in, unsigned char *out)
{
    for (int i = 0; i < 4; i++)
        for (int m = 0; m < 4; m++)
            out[4 * i + m] = (unsigned char)(pack_nib_get(in, 8 * m + i) | pack_nib_get(in, 8 * m + 4 + i) << 4);
}

/* Element e of a packed block (pack_nib_byte's place). */
static unsigned unpack_nib_get(const unsigned char *in, int e)
{
    int sh, b = pack_nib_byte(e, &sh);
    return ((unsigned)in[b] >> sh) & 15u;
}

static void unpack_nibs(const unsigned char *in, unsigned char *out)
{
    for (int j = 0; j < 16; j++)
        out[j] = (unsigned char)(unpack_nib_get(in, j) | unpack_nib_get(in, j + 16) << 4);
}

/* Where the header fields of block i of a superblock of nblk blocks go:
 * field f of len[f] bytes (in the record's order: d or s; Q4_1's and
 * Q5_1's m; Q5's qh; W4G32's z and pad) at off[f], each field of all the
 * blocks together (kernel_table.h). Returns the field count. */
static int pack_block_fields(DType t, int i, int nblk, int off[3], int len[3])
{
    static const struct { DType t; int n, len[3]; } fields[] = {
        {DT_Q4_0, 1, {2}}, {DT_Q4_1, 2, {2, 2}}, {DT_W4G32, 3, {2, 1, 1}}, {DT_Q5_0, 2, {2, 4}}, {DT_Q5_1, 3, {2, 2, 4}},
        {DT_IQ4_NL, 1, {2}},
    };
    for (size_t j = 0; j < sizeof fields / sizeof *fields; j++) {
        if (fields[j].t != dtype_layout(t))
            continue;
        int prefix = 0;
        for (int f = 0; f < fields[j].n; f++) {
            len[f] = fields[j].len[f];
            off[f] = prefix * nblk + len[f] * i;
            prefix += len[f];
        }
        return fields[j].n;
    }
    die("pack_block_fields: %s rows are not packed", dtype_name(t));
}

/* Block record rec (ir/dtype.h) into slot i of superblock sb. */
static void pack_block(DType t, const unsigned char *rec, unsigned char *sb, int i, int nblk)
{
    int off[3], len[3], nf = pack_block_fields(t, i, nblk, off, len), at = 0;
    for (int f = 0; f < nf; at += len[f], f++)
        memcpy(sb + off[f], rec + at, (size_t)len[f]);
    if (dtype_layout(t) == DT_IQ4_NL) /* its nibbles as stored (kernel_table.h) */
        memcpy(sb + at * nblk + 16 * i, rec + at, 16);
    else
        pack_nibs(rec + at, sb + at * nblk + 16 * i);
}

static void unpack_block(DType t, const unsigned char *sb, unsigned char *rec, int i, int nblk)
{
    int off[3], len[3], nf = pack_block_fields(t, i, nblk, off, len), at = 0;
    for (int f = 0; f < nf; at += len[f], f++)
        memcpy(rec + at, sb + off[f], (size_t)len[f]);
    if (dtype_layout(t) == DT_IQ4_NL)
        memcpy(rec + at, sb + at * nblk + 16 * i, 16);
    else
        unpack_nibs(sb + at * nblk + 16 * i, rec + at);
}

/* One row of k elements, packed (pack) or back. */
static void pack_row_convert(DType t, int64_t k, const unsigned char *in, unsigned char *out, bool pack)
{
    int64_t nb = k / 32, bb = dtype_block_bytes(t);
    if (dtype_layout(t) == DT_Q8_0) { /* Q8_0, Q8_0A8: the row's scales, then its blocks' integers */
        for (int64_t b = 0; b < nb; b++) {
            size_t rec = (size_t)(b * bb), d = (size_t)(2 * b), q = (size_t)(2 * nb + 32 * b);
            memcpy(out + (pack ? d : rec), in + (pack ? rec : d), 2);
            memcpy(out + (pack ? q : rec + 2), in + (pack ? rec + 2 : q), 32);
        }
        return;
    }
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        int nblk = nb - b0 < 4 ? (int)(nb - b0) : 4;
        for (int i = 0; i < nblk; i++) {
            if (pack)
                pack_block(t, in + (b0 + i) * bb, out + b0 * bb, i, nblk);
            else
                unpack_block(t, in + b0 * bb, out + (b0 + i) * bb, i, nblk);
        }
    }
}

void quant_cpu_pack(DType t, int64_t rows, int64_t k, const unsigned char *in, unsigned char *out)
{
    ASSERT(quant_cpu_packed(t, k));
    size_t rb = dtype_row_bytes(t, k);
    for (int64_t r = 0; r < rows; r++)
        pack_row_convert(t, k, in + (size_t)r * rb, out + (size_t)r * rb, true);
}

void quant_cpu_unpack(DType t, int64_t rows, int64_t k, const unsigned char *in, unsigned char *out)
{
    ASSERT(quant_cpu_packed(t, k));
    size_t rb = dtype_row_bytes(t, k);
    for (int64_t r = 0; r < rows; r++)
        pack_row_convert(t, k, in + (size_t)r * rb, out + (size_t)r * rb, false);
}

/* ---- the CUDA kernel's byte order for block rows ----
 * Q4_0, Q4_1, Q8_0 and W4G32/64/128 rows are runs of units {header; data}
 * (ir/dtype.h: a block, or a W4 group whose data is 16-byte chunks of 32
 * elements). For CUDA the data of all units goes together, in order, and
 * the headers around it: the first h0 headers, the data, the others, with
 * h0 = min(nh, o / hb) for the o bytes from the row's start to the next
 * 16-byte boundary (buffers are 64-byte aligned, so that is -(r * rb) mod
 * 16 for row r), so that the data starts on the boundary wherever o is a
 * multiple of the header's hb bytes and nh headers reach it
 * (kernel_body.cuh: mk_planar). A permutation of the row's bytes: rows
 * keep their size and offset, unordering restores them exactly. */

/* The units of a row: nh headers of *hb bytes; unit i's data bytes. */
static int64_t cuda_units(DType t, int64_t k, int *hb)
{
    switch (t) {
    case DT_Q4_0: case DT_Q8_0: *hb = 2; return k / 32;
    case DT_Q4_1: *hb = 4; return k / 32;
    default: *hb = 4; return (k + dtype_block(t) - 1) / dtype_block(t);
    }
}

static int64_t cuda_unit_data(DType t, int64_t k, int64_t i)
{
    if (t == DT_Q4_0 || t == DT_Q4_1)
        return 16;
    if (t == DT_Q8_0)
        return 32;
    int64_t g = dtype_block(t), len = k - i * g < g ? k - i * g : g;
    return 16 * ((len + 31) / 32);
}

bool quant_cuda_ordered(DType t)
{
    return dtype_is_cuda_ordered(t);
}

/* Row r of rows of k (ir/dtype.h order) into the CUDA order, or back. */
static void cuda_row_convert(DType t, int64_t k, int64_t r, const unsigned char *in, unsigned char *out, bool order)
{
    int hb;
    int64_t nh = cuda_units(t, k, &hb), rb = (int64_t)dtype_row_bytes(t, k), nd = rb - nh * hb;
    int64_t o = (16 - (r * rb) % 16) % 16, h0 = o / hb < nh ? o / hb : nh, at = 0, dat = h0 * hb;
    for (int64_t i = 0; i < nh; i++) {
        int64_t n = cuda_unit_data(t, k, i), hat = hb * i + (i >= h0 ? nd : 0);
        if (order) {
            memcpy(out + hat, in + at, (size_t)hb);
            memcpy(out + dat, in + at + hb, (size_t)n);
        } else {
            memcpy(out + at, in + hat, (size_t)hb);
            memcpy(out + at + hb, in + dat, (size_t)n);
        }
        at += hb + n;
        dat += n;
    }
    ASSERT(at == rb && dat == h0 * hb + nd);
}

void quant_cuda_order(DType t, int64_t rows, int64_t k, const unsigned char *in, unsigned char *out)
{
    ASSERT(quant_cuda_ordered(t));
    size_t rb = dtype_row_bytes(t, k);
    for (int64_t r = 0; r < rows; r++)
        cuda_row_convert(t, k, r, in + (size_t)r * rb, out + (size_t)r * rb, true);
}

void quant_cuda_unorder(DType t, int64_t rows, int64_t k, const unsigned char *in, unsigned char *out)
{
    ASSERT(quant_cuda_ordered(t));
    size_t rb = dtype_row_bytes(t, k);
    for (int64_t r = 0; r < rows; r++)
        cuda_row_convert(t, k, r, in + (size_t)r * rb, out + (size_t)r * rb, false);
}

bool quant_kernel_order(const char *target, DType t, int64_t rows, int64_t k, const unsigned char *in,
                        unsigned char *out)
{
    if (strcmp(target, "cpu") == 0) {
        if (!quant_cpu_packed(t, k))
            return false;
        quant_cpu_pack(t, rows, k, in, out);
        return true;
    }
    if (!quant_cuda_ordered(t))
        return false;
    quant_cuda_order(t, rows, k, in, out);
    return true;
}

/* ---- knobs ---- */

int quant_spec_dtype(QuantSpec q, DType src)
{
    switch (q.kind) {
    case QUANT_NONE: return (int)src;
    case QUANT_F32: return DT_F32;
    case QUANT_F16: return DT_F16;
    case QUANT_BF16: return DT_BF16;
    case QUANT_W8A16: return DT_W8;
    case QUANT_W4A16:
        return q.group == 32 ? DT_W4G32 : q.group == 64 ? DT_W4G64 : q.group == 128 ? DT_W4G128 : -1;
    case QUANT_W8A8: return src == DT_Q8_0 ? DT_Q8_0A8 : DT_W8A8; /* Q8_0's own blocks (quant_apply) */
    case QUANT_W4A8:
        if (src == DT_Q4_1 && q.group == 32) /* Q4_1's own blocks (see quant_apply) */
            return DT_Q4_1A8;
        return q.group == 32 ? DT_W4A8G32 : q.group == 64 ? DT_W4A8G64 : q.group == 128 ? DT_W4A8G128 : -1;
    case QUANT_A8: /* the source's own bytes, as the A8 dtype with its layout if there is one (not floats) */
        for (int t = 0; t < DT_COUNT; t++)
            if (dtype_is_a8((DType)t) && dtype_layout((DType)t) == src)
                return t;
        return (int)src;
    }
    return -1;
}

int quant_tensor_class(const char *canon)
{
    static const char *const attn[] = {"wq", "wk", "wv", "wo"}, *const mlp[] = {"w_gate", "w_up", "w_down"};
    const char *dot = canon[0] == 'L' ? strchr(canon, '.') : NULL;
    const char *s = dot ? dot + 1 : canon;
    if (!dot)
        return !strcmp(s, "embed") ? TCLASS_EMBED : !strcmp(s, "lm_head") ? TCLASS_LM_HEAD : -1;
    for (size_t i = 0; i < sizeof attn / sizeof *attn; i++)
        if (!strcmp(s, attn[i]))
            return TCLASS_ATTN;
    for (size_t i = 0; i < sizeof mlp / sizeof *mlp; i++)
        if (!strcmp(s, mlp[i]))
            return TCLASS_MLP;
    return -1;
}

static const char *const quant_kind_names[] = {"none", "f32", "f16", "bf16", "w8a16", "w4a16", "w8a8", "w4a8", "a8"};

bool quant_spec_parse(const char *s, QuantSpec *q)
{
    for (int k = 0; k <= QUANT_A8; k++) {
        size_t n = strlen(quant_kind_names[k]);
        if (strncmp(s, quant_kind_names[k], n) != 0)
            continue;
        bool w4 = k == QUANT_W4A16 || k == QUANT_W4A8;
        *q = (QuantSpec){(QuantKind)k, w4 ? 128 : 0};
        if (!s[n])
            return true;
        if (w4 && (!strcmp(s + n, "-g32") || !strcmp(s + n, "-g64") || !strcmp(s + n, "-g128"))) {
            q->group = atoi(s + n + 2);
            return true;
        }
    }
    return false;
}

const char *quant_spec_str(QuantSpec q, char *buf, size_t n)
{
    const char *k = (unsigned)q.kind <= QUANT_A8 ? quant_kind_names[q.kind] : "?";
    if (q.kind == QUANT_W4A16 || q.kind == QUANT_W4A8)
        snprintf(buf, n, "%s-g%d", k, q.group);
    else
        snprintf(buf, n, "%s", k);
    return buf;
}

/* ---- the pass ---- */

/* Stores matrix `name` (f32 view f, rows x cols) in dtype t and rewrites
 * the view to the dequantized values; under WEIGHTS_DTYPES_ONLY only
 * records t (the dtype every way of quant_slot leaves). */
static void quant_matrix(Weights *w, const char *name, float *f, int64_t rows, int64_t cols, DType t)
{
    if (t == DT_F32) {
        weights_qtensor_drop(w, name);
        return;
    }
    QTensor *q = weights_qtensor_put(w, name, t, rows, cols);
    if (!q->data)
        return;
    size_t rb = dtype_row_bytes(t, cols);
    for (int64_t r = 0; r < rows; r++) {
        float *row = f + r * cols;
        quant_row_quantize(t, row, cols, q->data + (size_t)r * rb);
        quant_row_dequant(t, q->data + (size_t)r * rb, cols, row);
    }
}

/* A tensor whose stored blocks already are t's bytes (Q4_1 asked to be
 * w4a8-g32: Q4_1A8; Q8_0 asked to be w8a8: Q8_0A8) keeps them, under t's
 * name. False for the others. */
static bool quant_keep_blocks(Weights *w, const char *name, DType t)
{
    const QTensor *src = weights_qtensor(w, name);
    if (!src || dtype_layout(t) != src->dtype || t == src->dtype)
        return false;
    const unsigned char *in = src->data; /* stays: the arena keeps it */
    QTensor *q = weights_qtensor_put(w, name, t, src->rows, src->cols);
    memcpy(q->data, in, q->nbytes);
    return true;
}

bool quant_stored_suffices(const Weights *w, const char *canon, DType src)
{
    int cls = quant_tensor_class(canon);
    int t = cls < 0 ? -1 : quant_spec_dtype(w->m->quant[cls], src);
    return t >= 0 && (t == (int)src || dtype_layout((DType)t) == src);
}

int64_t quant_stored_first_non_finite(DType t, const unsigned char *data, int64_t rows, int64_t cols)
{
    int64_t n = rows * cols;
    if (t == DT_F16 || t == DT_BF16) { /* exponent bits all set */
        uint16_t e = t == DT_F16 ? 0x7c00 : 0x7f80, h;
        for (int64_t i = 0; i < n; i++) {
            memcpy(&h, data + 2 * i, 2);
            if ((h & e) == e)
                return i;
        }
        return -1;
    }
    if (t == DT_W4G32 || t == DT_W4G64 || t == DT_W4G128) { /* each group's f16 s, at the start of its record */
        int64_t g = dtype_block(t), ng = (cols + g - 1) / g;
        size_t rb = dtype_row_bytes(t, cols), gb = (size_t)dtype_row_bytes(t, g);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < ng; i++) {
                uint16_t h;
                memcpy(&h, data + (size_t)r * rb + (size_t)i * gb, 2);
                if ((h & 0x7c00) == 0x7c00)
                    return r * cols + i * g;
            }
        return -1;
    }
    /* the f16 scales of each block: offsets of d (and of m or dmin) */
    int a = 0, b = -1;
    switch (t) {
    case DT_Q4_1:
    case DT_Q5_1:
    case DT_Q4_K:
    case DT_Q5_K: b = 2; break;
    case DT_Q6_K: a = 208; break;
    case DT_Q3_K: a = 108; break;
    case DT_Q2_K: a = 80, b = 82; break;
    case DT_Q8_0:
    case DT_Q4_0:
    case DT_Q5_0:
    case DT_IQ4_NL:
    case DT_IQ4_XS: break;
    default: ASSERT(!"quant_stored_first_non_finite: not a dtype a file stores");
    }
    int64_t be = dtype_block(t), bb = (int64_t)dtype_row_bytes(t, be), nb = n / be;
    for (int64_t i = 0; i < nb; i++) {
        const unsigned char *p = data + i * bb;
        uint16_t h0, h1 = 0;
        memcpy(&h0, p + a, 2);
        if (b >= 0)
            memcpy(&h1, p + b, 2);
        if ((h0 & 0x7c00) == 0x7c00 || (h1 & 0x7c00) == 0x7c00)
            return i * be;
    }
    return -1;
}

/* GGUF Q4_0 blocks re-expressed as W4G32 or W4A8G32 groups without a
 * float round trip: s = d, z = 8 and the same 16 bytes of nibbles (W4's
 * chunks of 32 are laid out as Q4_0's), so s * (q - z) is Q4_0's
 * d * (q - 8) bit for bit, and the f32 view stays as it is. False (nothing
 * done) for any other pair. */
static bool quant_q4_0_regroup(Weights *w, const char *name, DType t)
{
    const QTensor *src = weights_qtensor(w, name);
    if (!src || src->dtype != DT_Q4_0 || (t != DT_W4G32 && t != DT_W4A8G32) || src->cols % 32)
        return false;
    const unsigned char *in = src->data; /* stays: the arena keeps it */
    int64_t rows = src->rows, nblk = rows * (src->cols / 32);
    QTensor *q = weights_qtensor_put(w, name, t, rows, src->cols);
    unsigned char *out = q->data;
    for (int64_t b = 0; b < nblk; b++, in += 18, out += 20) {
        memcpy(out, in, 2);
        out[2] = 8;
        out[3] = 0;
        memcpy(out + 4, in + 2, 16);
    }
    return true;
}

/* The dtype matrix `name` is to have, or -1 after an error. */
static int quant_target(const Weights *w, const char *name, DType src, Diag *d)
{
    int cls = quant_tensor_class(name);
    ASSERT(cls >= 0);
    int t = quant_spec_dtype(w->m->quant[cls], src);
    if (t < 0) {
        char b[32];
        diag_file_error(d, w->m->path ? w->m->path : "megac", "tensor '%s': quantization %s is not supported yet",
                        name, quant_spec_str(w->m->quant[cls], b, sizeof b));
    }
    return t;
}

/* A tied model whose embedding and classifier want different dtypes gets
 * its own lm_head: a copy of the embedding's f32 values (its view, or its
 * stored bytes dequantized: weights_embed_f32) and of its stored bytes. */
static bool quant_head_split(Weights *w, Diag *d)
{
    const ModelDesc *m = w->m;
    const QTensor *e = weights_qtensor(w, "embed");
    DType src = e ? e->dtype : DT_F32;
    int te = quant_target(w, "embed", src, d), th = quant_target(w, "lm_head", src, d);
    if (te < 0 || th < 0)
        return false;
    if (weights_head_separate(w) || te == th)
        return true;
    w->lm_head = weights_view_new(w, (int64_t)m->vocab_size * m->dim);
    if (!w->lm_head) {
        diag_file_error(d, m->path ? m->path : "megac", "cannot map an f32 view of the classifier: %s",
                        strerror(errno));
        return false;
    }
    if (!w->dtypes_only)
        weights_embed_f32(w, w->lm_head);
    w->head_own = true;
    if (e) {
        QTensor *h = weights_qtensor_put(w, "lm_head", e->dtype, e->rows, e->cols);
        if (h->data)
            memcpy(h->data, e->data, h->nbytes);
    }
    return true;
}

bool quant_slot(Weights *w, const WSlot *s, Diag *d)
{
    Arena a = {0};
    char *name = s->cols && s->dst ? wslot_canon_name(&a, s) : NULL;
    bool ok = true;
    if (name && quant_tensor_class(name) >= 0) {
        const QTensor *q = weights_qtensor(w, name);
        int t = quant_target(w, name, q ? q->dtype : DT_F32, d);
        ok = t >= 0;
        if (ok && t != (q ? (int)q->dtype : DT_F32) &&
            (w->dtypes_only || (!quant_keep_blocks(w, name, (DType)t) && !quant_q4_0_regroup(w, name, (DType)t))))
            quant_matrix(w, name, s->dst, s->rows, s->cols, (DType)t);
    }
    arena_free(&a);
    return ok;
}

bool quant_apply(Weights *w, Diag *d)
{
    if (!quant_head_split(w, d))
        return false;
    Arena a = {0};
    int n;
    const WSlot *slots = weights_slots(w, &a, &n);
    bool ok = true;
    for (int i = 0; i < n && ok; i++)
        ok = quant_slot(w, &slots[i], d);
    if (ok && weights_head_separate(w) && w->m->tie_embeddings) {
        WSlot head = {.kind = WK_LM_HEAD, .layer = -1, .rows = w->m->vocab_size, .cols = w->m->dim,
                      .dst = w->lm_head};
        ok = quant_slot(w, &head, d);
    }
    arena_free(&a);
    return ok;
}

/* Elements and stored bytes of matrix `name`, added to *n and *bytes (a
 * stored matrix may have no f32 view: WEIGHTS_STORED_ONLY). */
static void quant_bits_add(const Weights *w, const char *name, double *n, double *bytes)
{
    int64_t ne;
    const QTensor *q = weights_qtensor(w, name);
    if (q) {
        *n += (double)q->rows * (double)q->cols;
        *bytes += (double)q->nbytes;
    } else if (weights_tensor(w, name, &ne)) {
        *n += (double)ne;
        *bytes += 4.0 * (double)ne;
    }
}

bool quant_matrix_name(const Weights *w, int i, char *name, size_t n)
{
    static const char *const mats[] = {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"};
    int nl = w->m->n_layers;
    if (i == 0)
        snprintf(name, n, "embed");
    else if (i <= 7 * nl)
        snprintf(name, n, "L%d.%s", (i - 1) / 7, mats[(i - 1) % 7]);
    else if (i == 7 * nl + 1 && weights_head_separate(w))
        snprintf(name, n, "lm_head");
    else
        return false;
    return true;
}

double quant_bits_per_weight(const Weights *w)
{
    double n = 0, bytes = 0;
    char name[64];
    for (int i = 0; quant_matrix_name(w, i, name, sizeof name); i++)
        quant_bits_add(w, name, &n, &bytes);
    return n > 0 ? 8.0 * bytes / n : 0;
}
