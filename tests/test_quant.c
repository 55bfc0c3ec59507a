/*
 * test_quant.c - quantized weights: the byte layouts of ir/dtype.h (checked
 * with a decoder written here from the layout text, independent of
 * quant.c), round-trip error bounds, the shorter last group, GGUF blocks
 * (hand-made, and kept byte-exact from tests/fixtures/weights/tiny.gguf),
 * GEMV on stored bytes against a float64 GEMV, the quant pass on a model
 * (classes, tied-head split, f32 views = dequantized bytes), lowering with
 * the stored dtypes, teacher-forced fidelity against the recorded figures
 * in tests/fixtures/quant/ (a regression of more than 10% fails), and the
 * CPU and host-CUDA kernels decoding quantized models (stories260K, a
 * synthetic model, GGUF blocks, SmolLM2 Q4_1) against the reference on the
 * same quantized weights.
 */
#include "compiler/compile.h"
#include "compiler/gguf.h"
#include "compiler/quant.h"

#include "codegen/codegen.h"
#include "codegen/cuda/cuda.h"
#include "harness.h"
#include "runtime/kernel_abi.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/doc.h"

#define QFIX MEGAC_SRC "/tests/fixtures/quant"
#define SHARED MEGAC_SRC "/../shared"

static const DType wtypes[] = {DT_W8, DT_W4G32, DT_W4G64, DT_W4G128};

/* Deterministic values in [-1, 1) (an LCG; no libc rand). */
static float lcg_uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
}

static void fill(float *v, int64_t n, uint64_t seed, float scale)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = scale * lcg_uniform(&seed);
}

static float h2f(const unsigned char *p)
{
    return f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* ---- an independent decoder, written from dtype.h's text ---- */

/* Element j of a W4 row of k elements, group size g. */
static float w4_elem(const unsigned char *row, int64_t k, int g, int64_t j)
{
    const unsigned char *p = row;
    for (int64_t gs = 0; gs < j / g * g; gs += g)
        p += 4 + 16 * ((g + 31) / 32);
    (void)k;
    int64_t o = j % g, c = o / 32, i = o % 32;
    unsigned char b = p[4 + 16 * c + i % 16];
    int q = i < 16 ? b & 15 : b >> 4;
    return h2f(p) * (float)(q - p[2]);
}

static float w8_elem(const unsigned char *row, int64_t j)
{
    float s;
    memcpy(&s, row, 4);
    return s * (float)(int8_t)row[4 + j];
}

static float indep_elem(DType t, const unsigned char *row, int64_t k, int64_t j)
{
    return t == DT_W8 ? w8_elem(row, j) : w4_elem(row, k, dtype_block(t), j);
}

/* ---- sizes ---- */

Test(quant, dtype_sizes)
{
    cr_assert_eq(dtype_row_bytes(DT_W8, 172), 4 + 172);
    cr_assert_eq(dtype_row_bytes(DT_W8, 7), 4 + 8);
    cr_assert_eq(dtype_row_bytes(DT_W4G32, 172), 5 * 20 + (4 + 16));     /* last group: 12 */
    cr_assert_eq(dtype_row_bytes(DT_W4G64, 172), 2 * 36 + (4 + 32));     /* last group: 44 */
    cr_assert_eq(dtype_row_bytes(DT_W4G128, 172), 68 + (4 + 32));        /* last group: 44 */
    cr_assert_eq(dtype_row_bytes(DT_W4G128, 256), 2 * 68);
    cr_assert_eq(dtype_row_bytes(DT_Q4_1, 64), 40);
    int64_t shape[2] = {3, 172};
    cr_assert_eq(dtype_tensor_bytes(DT_W4G32, 2, shape), 3 * 120);
    cr_assert_eq(dtype_tensor_bytes(DT_F32, 2, shape), 3 * 172 * 4);
    cr_assert_eq(dtype_from_name("w4g64"), DT_W4G64);
    cr_assert_str_eq(dtype_name(DT_W8), "w8");
    cr_assert(dtype_is_rowwise(DT_W4G128) && !dtype_is_rowwise(DT_Q8_0) && dtype_is_quant(DT_Q8_0));
    cr_assert(!dtype_is_quant(DT_F16));
}

/* ---- layouts ---- */

Test(quant, w8_bytes)
{
    float w[5] = {1.0f, -0.5f, 0.25f, 0, -1.0f};
    unsigned char row[12];
    quant_row_quantize(DT_W8, w, 5, row);
    float s;
    memcpy(&s, row, 4);
    cr_assert_eq(s, 1.0f / 127.0f);
    const int8_t want[5] = {127, -64, 32, 0, -127}; /* -63.5 and 31.75 round to nearest, half away */
    for (int j = 0; j < 5; j++)
        cr_assert_eq((int8_t)row[4 + j], want[j], "q[%d] = %d", j, (int8_t)row[4 + j]);
    cr_assert(row[9] == 0 && row[10] == 0 && row[11] == 0, "padding is zero");
    float y[5];
    quant_row_dequant(DT_W8, row, 5, y);
    for (int j = 0; j < 5; j++)
        cr_assert_eq(y[j], s * (float)want[j]);
}

/* K = 40 with G = 32: a full group and a group of 8 whose scale and zero
 * come from those 8 values alone. */
Test(quant, w4_short_last_group)
{
    float w[40];
    for (int j = 0; j < 32; j++)
        w[j] = (float)(j % 17) - 8.0f;  /* -8 .. 8 */
    for (int j = 32; j < 40; j++)
        w[j] = 0.01f * (float)(j - 32); /* 0 .. 0.07 */
    unsigned char row[40];
    cr_assert_eq(dtype_row_bytes(DT_W4G32, 40), sizeof row);
    quant_row_quantize(DT_W4G32, w, 40, row);
    cr_assert_eq(h2f(row), f16_to_f32(f32_to_f16(16.0f / 15.0f)));
    cr_assert_eq(row[3], 0);
    const unsigned char *g1 = row + 20;
    cr_assert_eq(h2f(g1), f16_to_f32(f32_to_f16(0.07f / 15.0f)), "last group scale from its 8 values");
    cr_assert_eq(g1[2], 0, "range [0, 0.07] has zero point 0");
    for (int i = 8; i < 16; i++)
        cr_assert_eq(g1[4 + i], 0, "nibbles past the group's end hold z");
    float y[40];
    quant_row_dequant(DT_W4G32, row, 40, y);
    for (int j = 0; j < 40; j++) {
        cr_assert_eq(y[j], w4_elem(row, 40, 32, j), "element %d", j);
        /* RTN with an integer zero: within a step; within half a step (and
         * the f16 rounding of s) where z is exact, as in the last group */
        float s = h2f(j < 32 ? row : g1), bound = j < 32 ? s : 0.51f * s;
        cr_assert_leq(fabsf(y[j] - w[j]), bound, "element %d: %g vs %g", j, y[j], w[j]);
    }
}

/* The CUDA kernel's byte order (quant_cuda_order) moves bytes only: any
 * bytes come back from unordering. Built independently here from ir/
 * dtype.h's units {header; data}: row r's data, every unit's in order,
 * starts after its first h0 headers (h0 = min(nh, o / hb), o the bytes
 * from r * rb to a 16-byte boundary), the other headers follow it; the
 * data is 16-byte aligned wherever the headers reach the boundary, which
 * every row of a SmolLM2-sized k (576) does. */
Test(quant, cuda_order_by_hand)
{
    static const DType ts[] = {DT_Q4_0, DT_Q4_1, DT_Q8_0, DT_W4G32, DT_W4G64, DT_W4G128};
    static const int64_t ks[] = {32, 64, 200, 576, 1001};
    uint64_t seed = 5;
    for (size_t ti = 0; ti < sizeof ts / sizeof *ts; ti++) {
        DType t = ts[ti];
        bool w4 = t == DT_W4G32 || t == DT_W4G64 || t == DT_W4G128;
        int hb = t == DT_Q4_1 || w4 ? 4 : 2;
        cr_assert(quant_cuda_ordered(t));
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
            int64_t k = ks[ki], rows = 5, G = w4 ? dtype_block(t) : 32;
            if (!w4 && k % 32)
                continue;
            size_t rb = dtype_row_bytes(t, k), n = (size_t)rows * rb;
            unsigned char *a = malloc(n), *b = malloc(n), *c = malloc(n);
            for (size_t i = 0; i < n; i++)
                a[i] = (unsigned char)(int)(128.0f + 127.0f * lcg_uniform(&seed));
            quant_cuda_order(t, rows, k, a, b);
            quant_cuda_unorder(t, rows, k, b, c);
            cr_assert(memcmp(a, c, n) == 0, "%s k=%ld: unorder(order(x)) != x", dtype_name(t), (long)k);
            int64_t nh = (k + G - 1) / G, nd = (int64_t)rb - nh * hb;
            for (int64_t r = 0; r < rows; r++) {
                const unsigned char *in = a + r * rb, *out = b + r * rb;
                int64_t o = (16 - (r * (int64_t)rb) % 16) % 16, h0 = o / hb < nh ? o / hb : nh, at = 0, dat = h0 * hb;
                for (int64_t u = 0; u < nh; u++) {
                    int64_t len = k - u * G < G ? k - u * G : G;
                    int64_t nb = t == DT_Q8_0 ? 32 : 16 * ((len + 31) / 32), hat = hb * u + (u >= h0 ? nd : 0);
                    cr_assert(memcmp(out + hat, in + at, (size_t)hb) == 0, "%s k=%ld row %ld: header %ld",
                              dtype_name(t), (long)k, (long)r, (long)u);
                    cr_assert(memcmp(out + dat, in + at + hb, (size_t)nb) == 0, "%s k=%ld row %ld: data of unit %ld",
                              dtype_name(t), (long)k, (long)r, (long)u);
                    at += hb + nb;
                    dat += nb;
                }
                cr_assert_eq(at, (int64_t)rb);
                if (k == 576)
                    cr_assert_eq((r * (int64_t)rb + h0 * hb) % 16, 0, "%s k=576 row %ld: data not 16-byte aligned",
                                 dtype_name(t), (long)r);
            }
            free(a), free(b), free(c);
        }
    }
    cr_assert(!quant_cuda_ordered(DT_W8) && !quant_cuda_ordered(DT_F16) && !quant_cuda_ordered(DT_Q6_K) &&
              !quant_cuda_ordered(DT_W4A8G32));
}

Test(quant, roundtrip_bounds_and_independent_decode)
{
    const int64_t ks[] = {7, 32, 64, 172, 200, 300};
    for (size_t ti = 0; ti < sizeof wtypes / sizeof *wtypes; ti++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
            DType t = wtypes[ti];
            int64_t k = ks[ki];
            float *w = malloc(sizeof(float) * (size_t)k), *y = malloc(sizeof(float) * (size_t)k);
            unsigned char *row = malloc(dtype_row_bytes(t, k));
            fill(w, k, 17 + (uint64_t)(ti * 31 + ki), 0.3f);
            w[k / 2] = 0.9f; /* an outlier */
            quant_row_quantize(t, w, k, row);
            quant_row_dequant(t, row, k, y);
            float amax = 0;
            for (int64_t j = 0; j < k; j++)
                amax = fabsf(w[j]) > amax ? fabsf(w[j]) : amax;
            for (int64_t j = 0; j < k; j++) {
                cr_assert_eq(y[j], indep_elem(t, row, k, j), "%s k=%ld j=%ld", dtype_name(t), (long)k, (long)j);
                /* W8: half a step of amax/127; W4: a step of at most 2*amax/15 (range holds 0, f16 scale) */
                float bound = t == DT_W8 ? 0.5f * amax / 127.0f * 1.0001f : amax * 2.0f / 15.0f * 1.001f;
                cr_assert_leq(fabsf(y[j] - w[j]), bound, "%s k=%ld j=%ld", dtype_name(t), (long)k, (long)j);
            }
            free(w);
            free(y);
            free(row);
        }
}

Test(quant, gguf_blocks_by_hand)
{
    unsigned char q80[34], q40[18], q41[20];
    memset(q80, 0, sizeof q80);
    q80[0] = 0x00, q80[1] = 0x38; /* d = 0.5 */
    for (int j = 0; j < 32; j++)
        q80[2 + j] = (unsigned char)(int8_t)(j - 16);
    memcpy(q40, q80, 2);
    memcpy(q41, q80, 2);
    q41[2] = 0x00, q41[3] = 0xbc; /* m = -1 */
    for (int j = 0; j < 16; j++)
        q40[2 + j] = q41[4 + j] = (unsigned char)(j | (15 - j) << 4);
    float y[32];
    quant_row_dequant(DT_Q8_0, q80, 32, y);
    for (int j = 0; j < 32; j++)
        cr_assert_eq(y[j], 0.5f * (float)(j - 16));
    quant_row_dequant(DT_Q4_0, q40, 32, y);
    for (int j = 0; j < 16; j++) {
        cr_assert_eq(y[j], 0.5f * (float)(j - 8));
        cr_assert_eq(y[j + 16], 0.5f * (float)(15 - j - 8));
    }
    quant_row_dequant(DT_Q4_1, q41, 32, y);
    for (int j = 0; j < 16; j++) {
        cr_assert_eq(y[j], 0.5f * (float)j - 1.0f);
        cr_assert_eq(y[j + 16], 0.5f * (float)(15 - j) - 1.0f);
    }
}

/* GEMV on the stored bytes (quant.c's scalar path) against a float64 GEMV
 * over this file's own decoding: NMSE <= 1e-6 (issue bar for A16). */
Test(quant, gemv_nmse)
{
    const int64_t rows = 48, k = 172;
    float *w = malloc(sizeof(float) * rows * k), x[172];
    fill(w, rows * k, 5, 0.1f);
    fill(x, k, 6, 1.0f);
    for (size_t ti = 0; ti < sizeof wtypes / sizeof *wtypes; ti++) {
        DType t = wtypes[ti];
        size_t rb = dtype_row_bytes(t, k);
        unsigned char *q = malloc(rb * rows);
        for (int64_t r = 0; r < rows; r++)
            quant_row_quantize(t, w + r * k, k, q + r * rb);
        double y[48], num = 0, den = 0;
        quant_gemv_ref(t, q, rows, k, x, y);
        for (int64_t r = 0; r < rows; r++) {
            double ref = 0;
            for (int64_t j = 0; j < k; j++)
                ref += (double)indep_elem(t, q + r * rb, k, j) * x[j];
            num += (y[r] - ref) * (y[r] - ref);
            den += ref * ref;
        }
        cr_assert_leq(num / den, 1e-6, "%s: nmse %g", dtype_name(t), num / den);
        free(q);
    }
    free(w);
}

/* ---- the pass on a model ---- */

#define TINY_YAML                                                                                    \
    "name: qtiny\n"                                                                                  \
    "arch: {dim: 64, hidden_dim: 172, n_layers: 2, n_heads: 4, n_kv_heads: 2, vocab_size: 300,"      \
    " max_seq: 64}\n"                                                                                \
    "tie_embeddings: true\n"                                                                         \
    "weights: {format: synthetic, seed: 7}\n"                                                        \
    "tokenizer: {format: bytes}\n"

static bool desc_text(ModelDesc *m, Arena *a, const char *text, const DescOverride *ov, int nov)
{
    Diag d;
    diag_init(&d);
    return desc_parse(m, a, QFIX "/x.yaml", text, strlen(text), ov, nov, &d) && desc_check(m, &d);
}

/* Every matrix's f32 view is exactly the dequantization of its bytes. */
static void expect_views(const Weights *w)
{
    for (int i = 0; i < w->nqt; i++) {
        const QTensor *q = &w->qt[i];
        int64_t n;
        const float *f = weights_tensor(w, q->name, &n);
        cr_assert_not_null(f);
        cr_assert_eq(n, q->rows * q->cols);
        float *row = malloc(sizeof(float) * (size_t)q->cols);
        size_t rb = dtype_row_bytes(q->dtype, q->cols);
        for (int64_t r = 0; r < q->rows; r++) {
            quant_row_dequant(q->dtype, q->data + (size_t)r * rb, q->cols, row);
            cr_assert(memcmp(row, f + r * q->cols, sizeof(float) * (size_t)q->cols) == 0, "%s row %ld", q->name,
                      (long)r);
        }
        free(row);
    }
}

Test(quant, apply_classes_and_lower)
{
    Arena a = {0};
    ModelDesc m;
    DescOverride ov[] = {{"quant", "{default: w8a16, embed: f16, mlp: w4a16-g32}"}};
    cr_assert(desc_text(&m, &a, TINY_YAML, ov, 1));
    Diag d;
    diag_init(&d);
    Weights w;
    cr_assert(weights_load(&w, &m, &d));
    cr_assert_eq(weights_dtype(&w, "embed"), DT_F16);
    cr_assert_eq(weights_dtype(&w, "L1.wq"), DT_W8);
    cr_assert_eq(weights_dtype(&w, "L0.w_down"), DT_W4G32);
    cr_assert_eq(weights_dtype(&w, "lm_head"), DT_W8);
    cr_assert_eq(weights_dtype(&w, "L0.attn_norm"), DT_F32);
    cr_assert(weights_head_separate(&w), "tied model split by quantization");
    expect_views(&w);

    const Target *t = target_lookup("cpu", &d);
    Schedule *s = lower_model_weights(&m, &w, t, 3, &d);
    Schedule *s2 = lower_model(&m, t, 3, &d);
    cr_assert(s && s2);
    char *a1 = sched_to_string(s), *a2 = sched_to_string(s2);
    cr_assert_str_eq(a1, a2, "knobs alone give the dtypes the weights have");
    int64_t b = sched_find_buffer(s, "L0.w_down"), h = sched_find_buffer(s, "lm_head");
    cr_assert(b >= 0 && h >= 0);
    cr_assert_eq(s->bufs[b].dtype, DT_W4G32);
    cr_assert_eq(s->bufs[h].dtype, DT_W8);
    sched_layout(s);
    const QTensor *qd = weights_qtensor(&w, "L0.w_down");
    cr_assert_eq(dtype_tensor_bytes(s->bufs[b].dtype, s->bufs[b].rank, s->bufs[b].shape), qd->nbytes);
    Schedule *p = sched_parse("x.sched", a1, strlen(a1), &d);
    cr_assert_not_null(p);
    char *a3 = sched_to_string(p);
    cr_assert_str_eq(a1, a3, "text form keeps the dtypes");
    free(a1), free(a2), free(a3);
    sched_free(s), sched_free(s2), sched_free(p);
    weights_free(&w);
    arena_free(&a);
}

Test(quant, bad_group_refused)
{
    Arena a = {0};
    ModelDesc m;
    DescOverride ov[] = {{"quant.default", "w4a16-g48"}};
    char buf[512] = {0};
    Diag d;
    diag_init(&d);
    d.out = fmemopen(buf, sizeof buf - 1, "w");
    cr_assert_not(desc_parse(&m, &a, "x.yaml", TINY_YAML, strlen(TINY_YAML), ov, 1, &d));
    fclose(d.out);
    cr_assert(strstr(buf, "bad value 'w4a16-g48' for 'compile.quant.default'"), "%s", buf);
    arena_free(&a);
}

/* The int8-activation GEMV (quant.c's definition) is within llama.cpp's
 * bar of the float64 GEMV on the same weights: NMSE <= 5e-4. */
Test(quant, a8_gemv_reference_nmse)
{
    const DType a8[] = {DT_W8A8, DT_W4A8G32, DT_W4A8G64, DT_W4A8G128};
    const int64_t rows = 40, k = 172;
    float *w = malloc(sizeof(float) * rows * k), x[172];
    fill(w, rows * k, 11, 0.1f);
    fill(x, k, 12, 1.0f);
    for (size_t ti = 0; ti < sizeof a8 / sizeof *a8; ti++) {
        size_t rb = dtype_row_bytes(a8[ti], k);
        cr_assert_eq(rb, dtype_row_bytes(dtype_layout(a8[ti]), k));
        unsigned char *q = malloc(rb * rows);
        for (int64_t r = 0; r < rows; r++)
            quant_row_quantize(a8[ti], w + r * k, k, q + r * rb);
        double y8[40], y16[40], num = 0, den = 0;
        quant_gemv_a8_ref(a8[ti], q, rows, k, x, y8);
        quant_gemv_ref(a8[ti], q, rows, k, x, y16);
        for (int64_t r = 0; r < rows; r++) {
            num += (y8[r] - y16[r]) * (y8[r] - y16[r]);
            den += y16[r] * y16[r];
        }
        cr_assert_leq(num / den, 5e-4, "%s: nmse %g", dtype_name(a8[ti]), num / den);
        cr_assert_gt(num, 0, "%s: the inputs were quantized", dtype_name(a8[ti]));
        free(q);
    }
    free(w);
}

/* ---- GGUF blocks ---- */

#define GGUF_YAML                                                                                     \
    "name: tiny-gguf\n"                                                                               \
    "arch: {dim: 32, hidden_dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, head_dim: 8,"            \
    " vocab_size: 32, max_seq: 16}\n"                                                                 \
    "tie_embeddings: false\n"                                                                         \
    "weights: {format: gguf, path: ../weights/tiny.gguf}\n"                                           \
    "tokenizer: {format: none}\n"

/* quant none keeps a GGUF's blocks byte for byte, and its f16 and bf16
 * matrices as f16 and bf16; vectors stay f32. */
Test(quant, gguf_blocks_kept_exactly)
{
    if (access(MEGAC_SRC "/tests/fixtures/weights/tiny.gguf", R_OK) != 0)
        cr_skip("tests/fixtures/weights/tiny.gguf absent");
    Arena a = {0};
    ModelDesc m;
    cr_assert(desc_text(&m, &a, GGUF_YAML, NULL, 0));
    Diag d;
    diag_init(&d);
    Weights w;
    cr_assert(weights_load(&w, &m, &d));
    GgufFile *g = gguf_open(MEGAC_SRC "/tests/fixtures/weights/tiny.gguf", &d);
    cr_assert_not_null(g);
    const struct {
        const char *canon, *gguf;
        DType t;
    } want[] = {{"embed", "token_embd.weight", DT_Q8_0},       {"L0.wq", "blk.0.attn_q.weight", DT_Q4_0},
                {"L1.wk", "blk.1.attn_k.weight", DT_Q4_1},     {"L0.wo", "blk.0.attn_output.weight", DT_Q8_0},
                {"L1.w_up", "blk.1.ffn_up.weight", DT_Q4_1},   {"L0.w_down", "blk.0.ffn_down.weight", DT_Q4_0},
                {"lm_head", "output.weight", DT_Q8_0},         {"L0.wv", "blk.0.attn_v.weight", DT_F16},
                {"L1.w_gate", "blk.1.ffn_gate.weight", DT_BF16}, {"L0.attn_norm", NULL, DT_F32}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        cr_assert_eq(weights_dtype(&w, want[i].canon), want[i].t, "%s", want[i].canon);
        if (!want[i].gguf)
            continue;
        const QTensor *q = weights_qtensor(&w, want[i].canon);
        const GgufTensor *gt = gguf_find_tensor(g, want[i].gguf);
        cr_assert(q && gt && q->nbytes == gt->nbytes);
        cr_assert(memcmp(q->data, gt->data, q->nbytes) == 0, "%s: blocks kept byte for byte", want[i].canon);
    }
    expect_views(&w);
    Schedule *s = lower_model_weights(&m, &w, target_lookup("cpu", &d), 2, &d);
    cr_assert_not_null(s);
    cr_assert_eq(s->bufs[sched_find_buffer(s, "L1.wk")].dtype, DT_Q4_1);
    cr_assert_eq(s->bufs[sched_find_buffer(s, "embed")].dtype, DT_Q8_0);
    sched_free(s);
    gguf_close(g);
    weights_free(&w);

    /* quant f32: the same f32 views, no blocks */
    DescOverride ov[] = {{"quant", "f32"}};
    ModelDesc m2;
    cr_assert(desc_text(&m2, &a, GGUF_YAML, ov, 1));
    Weights w1, w2;
    cr_assert(weights_load(&w1, &m, &d) && weights_load(&w2, &m2, &d));
    cr_assert_eq(w2.nqt, 0);
    int64_t n;
    const float *f1 = weights_tensor(&w1, "L1.wk", &n), *f2 = weights_tensor(&w2, "L1.wk", NULL);
    cr_assert(memcmp(f1, f2, sizeof(float) * (size_t)n) == 0);
    weights_free(&w1);
    weights_free(&w2);
    arena_free(&a);
}

/* Q4_0 blocks asked to be w4a16-g32 or w4a8-g32 become those groups
 * exactly (s = d, z = 8, the same nibbles): the f32 views stay bit for
 * bit. Q4_1 blocks asked to be w4a8-g32 and Q8_0 blocks asked to be w8a8
 * stay as they are, as Q4_1A8 and Q8_0A8, whose int8-activation GEMVs are
 * within the A8 formats' error of the exact ones. */
Test(quant, gguf_q4_0_regrouped_exactly)
{
    if (access(MEGAC_SRC "/tests/fixtures/weights/tiny.gguf", R_OK) != 0)
        cr_skip("tests/fixtures/weights/tiny.gguf absent");
    Arena a = {0};
    ModelDesc m0, m1;
    DescOverride ov[] = {{"quant.attn", "w4a8-g32"}, {"quant.mlp", "w4a16-g32"}};
    cr_assert(desc_text(&m0, &a, GGUF_YAML, NULL, 0));
    cr_assert(desc_text(&m1, &a, GGUF_YAML, ov, 2));
    Diag d;
    diag_init(&d);
    Weights w0, w1;
    cr_assert(weights_load(&w0, &m0, &d) && weights_load(&w1, &m1, &d));
    const struct {
        const char *canon;
        DType t;
    } want[] = {{"L0.wq", DT_W4A8G32}, {"L0.w_down", DT_W4G32}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const QTensor *q0 = weights_qtensor(&w0, want[i].canon), *q1 = weights_qtensor(&w1, want[i].canon);
        cr_assert(q0 && q0->dtype == DT_Q4_0 && q1 && q1->dtype == want[i].t, "%s", want[i].canon);
        int64_t nblk = q0->rows * (q0->cols / 32);
        cr_assert_eq(q1->nbytes, (size_t)nblk * 20);
        for (int64_t b = 0; b < nblk; b++) {
            const unsigned char *x = q0->data + 18 * b, *y = q1->data + 20 * b;
            cr_assert(!memcmp(x, y, 2) && y[2] == 8 && y[3] == 0 && !memcmp(x + 2, y + 4, 16),
                      "%s block %ld", want[i].canon, (long)b);
        }
        int64_t n;
        const float *f0 = weights_tensor(&w0, want[i].canon, &n), *f1 = weights_tensor(&w1, want[i].canon, NULL);
        cr_assert(memcmp(f0, f1, sizeof(float) * (size_t)n) == 0, "%s: values kept bit for bit", want[i].canon);
        float *back = malloc(sizeof(float) * (size_t)q1->cols);
        size_t rb = dtype_row_bytes(q1->dtype, q1->cols);
        for (int64_t r = 0; r < q1->rows; r++) {
            quant_row_dequant(q1->dtype, q1->data + (size_t)r * rb, q1->cols, back);
            cr_assert(memcmp(back, f0 + r * q1->cols, sizeof(float) * (size_t)q1->cols) == 0, "%s row %ld",
                      want[i].canon, (long)r);
        }
        free(back);
    }
    ModelDesc m2;
    DescOverride ov2[] = {{"quant.attn", "w8a8"}};
    cr_assert(desc_text(&m2, &a, GGUF_YAML, ov2, 1));
    Weights w2;
    cr_assert(weights_load(&w2, &m2, &d));
    const struct {
        const Weights *w;
        const char *canon;
        DType src, t;
    } kept[] = {{&w1, "L1.wk", DT_Q4_1, DT_Q4_1A8}, {&w2, "L0.wo", DT_Q8_0, DT_Q8_0A8}};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        const QTensor *k0 = weights_qtensor(&w0, kept[i].canon), *k1 = weights_qtensor(kept[i].w, kept[i].canon);
        cr_assert(k0 && k0->dtype == kept[i].src && k1 && k1->dtype == kept[i].t, "%s", kept[i].canon);
        cr_assert(k1->nbytes == k0->nbytes && !memcmp(k0->data, k1->data, k0->nbytes), "%s: blocks kept",
                  kept[i].canon);
        double *y8 = malloc(sizeof(double) * (size_t)k1->rows), *y16 = malloc(sizeof(double) * (size_t)k1->rows);
        float *x = malloc(sizeof(float) * (size_t)k1->cols);
        uint64_t seed = 11;
        for (int64_t j = 0; j < k1->cols; j++)
            x[j] = (float)((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 40) / 16777216.0f - 0.5f;
        quant_gemv_a8_ref(kept[i].t, k1->data, k1->rows, k1->cols, x, y8);
        quant_gemv_ref(kept[i].src, k0->data, k0->rows, k0->cols, x, y16);
        double num = 0, den = 0;
        for (int64_t r = 0; r < k1->rows; r++)
            num += (y8[r] - y16[r]) * (y8[r] - y16[r]), den += y16[r] * y16[r];
        cr_assert(num > 0 && num / den <= 5e-4, "%s nmse %g against the exact GEMV", dtype_name(kept[i].t),
                  num / den);
        free(y8), free(y16), free(x);
    }
    weights_free(&w0);
    weights_free(&w1);
    weights_free(&w2);
    arena_free(&a);
}

/* weights_load_ex(WEIGHTS_STORED_ONLY), what a compile uses: the same
 * stored bytes, dtypes, f32 vectors and schedule as weights_load, with no
 * f32 view left for a stored matrix, and less held. */
static void stored_only_same(const ModelDesc *m)
{
    static const char *const kinds[] = {"attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down"};
    Diag d;
    diag_init(&d);
    Weights e, s;
    cr_assert(weights_load(&e, m, &d) && weights_load_ex(&s, m, WEIGHTS_STORED_ONLY, NULL, &d), "%s", m->name);
    cr_assert_eq(s.nqt, e.nqt);
    cr_assert_eq(weights_head_separate(&s), weights_head_separate(&e));
    int nn = 3 + (int)(sizeof kinds / sizeof *kinds) * m->n_layers;
    char (*names)[32] = calloc((size_t)nn, sizeof *names);
    snprintf(names[0], 32, "embed"), snprintf(names[1], 32, "lm_head"), snprintf(names[2], 32, "final_norm");
    for (int l = 0, i = 3; l < m->n_layers; l++)
        for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
            snprintf(names[i++], 32, "L%d.%s", l, kinds[k]);
    for (int i = 0; i < nn; i++) {
        const QTensor *qe = weights_qtensor(&e, names[i]), *qs = weights_qtensor(&s, names[i]);
        int64_t ne = 0, ns = 0;
        const float *fe = weights_tensor(&e, names[i], &ne), *fs = weights_tensor(&s, names[i], &ns);
        cr_assert_not_null(fe, "%s", names[i]);
        cr_assert_eq(weights_dtype(&s, names[i]), weights_dtype(&e, names[i]), "%s", names[i]);
        if (qe) {
            cr_assert(qs && qs->nbytes == qe->nbytes && qs->rows == qe->rows && qs->cols == qe->cols);
            cr_assert(memcmp(qs->data, qe->data, qe->nbytes) == 0, "%s: stored bytes", names[i]);
            cr_assert_null(fs, "%s: a stored matrix keeps no f32 view", names[i]);
        } else {
            cr_assert(!qs && fs && ns == ne, "%s", names[i]);
            cr_assert(memcmp(fs, fe, sizeof(float) * (size_t)ne) == 0, "%s: f32", names[i]);
        }
    }
    free(names);
    if (e.nqt)
        cr_assert_lt(weights_held_bytes(&s), weights_held_bytes(&e));
    const Target *t = target_lookup("cpu", &d);
    Schedule *se = lower_model_weights(m, &e, t, 2, &d), *ss = lower_model_weights(m, &s, t, 2, &d);
    cr_assert(se && ss);
    char *a1 = sched_to_string(se), *a2 = sched_to_string(ss);
    cr_assert_str_eq(a1, a2);
    free(a1), free(a2);
    sched_free(se), sched_free(ss);
    weights_free(&e);
    weights_free(&s);
}

Test(quant, stored_only_load_same_bytes, .timeout = 60)
{
    const char *knobs[] = {"f32", "{default: w8a16, embed: f16, mlp: w4a16-g32}", "{default: w4a8-g64, lm_head: w8a8}",
                           "bf16"};
    Arena a = {0};
    for (size_t i = 0; i < sizeof knobs / sizeof *knobs; i++) {
        ModelDesc m;
        DescOverride ov[] = {{"quant", knobs[i]}};
        cr_assert(desc_text(&m, &a, TINY_YAML, ov, 1));
        stored_only_same(&m);
    }
    const char *gknobs[] = {"none", "{default: w4a8-g32, lm_head: w8a8, embed: f16}", "w4a16-g32"};
    for (size_t i = 0; i < sizeof gknobs / sizeof *gknobs; i++) {
        if (access(MEGAC_SRC "/tests/fixtures/weights/tiny.gguf", R_OK) != 0)
            break;
        ModelDesc m;
        DescOverride ov[] = {{"quant", gknobs[i]}};
        cr_assert(desc_text(&m, &a, GGUF_YAML, ov, 1));
        stored_only_same(&m);
    }
    if (access(SHARED "/models/stories260K.bin", R_OK) == 0) {
        ModelDesc m;
        Diag d;
        diag_init(&d);
        DescOverride ov[] = {{"quant", "{default: w4a16-g64, lm_head: w8a16}"}};
        cr_assert(desc_load(&m, &a, MEGAC_SRC "/models/stories260k.yaml", ov, 1, &d));
        stored_only_same(&m);
    }
    arena_free(&a);
}

/* ---- fidelity against the recorded figures ---- */

typedef struct Recorded {
    int tokens;
    unsigned classes;
    char engine[16];
    char prompt[256];
    int n;
    QuantSpec spec[16];
    double kl[16], top1[16];
} Recorded;

static void recorded_load(Recorded *r, const char *path)
{
    Doc doc;
    Diag d;
    diag_init(&d);
    cr_assert(doc_load(&doc, path, &d), "cannot read %s", path);
    int64_t v;
    cr_assert(doc_int(&doc, &d, doc_get(doc.root, "tokens"), &v));
    r->tokens = (int)v;
    snprintf(r->prompt, sizeof r->prompt, "%s", doc_str(&doc, &d, doc_get(doc.root, "prompt")));
    static const char *const cls[] = {"embed", "attn", "mlp", "lm_head"};
    const char *cl = doc_str(&doc, &d, doc_get(doc.root, "classes"));
    const DocNode *en = doc_get(doc.root, "engine");
    snprintf(r->engine, sizeof r->engine, "%s", en ? doc_str(&doc, &d, en) : "reference");
    r->classes = 0;
    for (int c = 0; c < TCLASS_COUNT; c++)
        r->classes |= strstr(cl, cls[c]) ? 1u << c : 0;
    const DocNode *f = doc_get(doc.root, "formats");
    cr_assert(f && f->kind == DOC_SEQ && f->n <= 16);
    r->n = f->n;
    for (int i = 0; i < f->n; i++) {
        cr_assert(quant_spec_parse(doc_str(&doc, &d, doc_get(f->items[i], "format")), &r->spec[i]));
        cr_assert(doc_double(&doc, &d, doc_get(f->items[i], "mean_kl"), &r->kl[i]));
        cr_assert(doc_double(&doc, &d, doc_get(f->items[i], "top1"), &r->top1[i]));
    }
    doc_free(&doc);
}

/* Runs the evaluation the file records and fails on a regression of more
 * than 10%: in mean KL, or in the top-1 disagreement rate (plus one
 * position of slack, the resolution of a short stream). */
static void fidelity_check(const ModelDesc *m, const char *model, const DescOverride *sets, int nsets,
                           const char *path)
{
    Recorded r;
    recorded_load(&r, path);
    QuantEvalRun run = {r.prompt, r.tokens, r.classes, r.engine, model, sets, nsets, false};
    QuantEval *e = calloc((size_t)r.n + 1, sizeof *e);
    Diag d;
    diag_init(&d);
    cr_assert(quant_eval(m, &run, r.spec, r.n, e, &d));
    for (int i = 0; i < r.n; i++) {
        const QuantEval *q = &e[i + 1];
        char b[32];
        quant_spec_str(r.spec[i], b, sizeof b);
        cr_assert_leq(q->mean_kl, 1.1 * r.kl[i] + 1e-12, "%s: mean KL %g, recorded %g", b, q->mean_kl, r.kl[i]);
        cr_assert_leq(1 - q->top1, 1.1 * (1 - r.top1[i]) + 1.0 / r.tokens + 1e-12, "%s: top-1 %g, recorded %g", b,
                      q->top1, r.top1[i]);
    }
    free(e);
}

Test(quant, fidelity_stories260k)
{
    if (access(SHARED "/models/stories260K.bin", R_OK) != 0)
        cr_skip("../shared/models/stories260K.bin absent");
    Arena a = {0};
    ModelDesc m;
    Diag d;
    diag_init(&d);
    cr_assert(desc_load(&m, &a, MEGAC_SRC "/models/stories260k.yaml", NULL, 0, &d));
    fidelity_check(&m, NULL, NULL, 0, QFIX "/fidelity-stories260k.json");
    arena_free(&a);
}

/* The A16 formats through the float64 reference, and the int8-input ones
 * through the CPU kernel (a8: the file's own Q4_1 and Q8_0 blocks as
 * Q4_1A8 and Q8_0A8), on the real SmolLM2 file. */
Test(quant, fidelity_smollm2_gguf, .timeout = 300)
{
    const char *gguf = getenv("MEGAC_SMOLLM2_GGUF");
    if (!gguf || !*gguf)
        cr_skip("MEGAC_SMOLLM2_GGUF is not set (path of SmolLM2-135M-Instruct.Q4_1.gguf)");
    const char *path = MEGAC_SRC "/models/smollm2-135m-instruct-gguf.yaml";
    Arena a = {0};
    ModelDesc m;
    Diag d;
    diag_init(&d);
    DescOverride ov[] = {{"weights.path", gguf}};
    cr_assert(desc_load(&m, &a, path, ov, 1, &d));
    fidelity_check(&m, NULL, NULL, 0, QFIX "/fidelity-smollm2-q4_1.json");
    fidelity_check(&m, path, ov, 1, QFIX "/fidelity-smollm2-q4_1-cpu.json");
    arena_free(&a);
}
/* ---- the CPU backend on quantized weights ----
 * A model's quantized schedule compiled for cpu, its weights blob written
 * from the stored bytes (the same bytes the reference's f32 views were
 * dequantized from), decoded step by step: logits within tolerance of the
 * float64 reference on the same weights, greedy tokens identical. */

typedef void (*QWorkerFn)(const MegacArgs *, uint32_t);

typedef struct QKern {
    Schedule *s;
    char dir[64], so[96];
    void *dl;
    QWorkerFn worker;
    unsigned char *weights, *arena;
    uint32_t *ctrs;
    MegacAbort abort_info;
} QKern;

static void *qalloc64(uint64_t n)
{
    size_t m = (size_t)((n + 63) / 64 * 64);
    void *p = aligned_alloc(64, m ? m : 64);
    cr_assert_not_null(p);
    memset(p, 0, m ? m : 64);
    return p;
}

/* Writes weight buffer b: its stored bytes, the f32 view, or the rope table. */
static void qkern_weight(QKern *k, const Buffer *b, const Weights *w)
{
    unsigned char *dst = k->weights + b->offset;
    if (!strcmp(b->name, "rope")) {
        rope_table_fill(w->m, (float *)dst);
        return;
    }
    const QTensor *q = weights_qtensor(w, b->name);
    int64_t n;
    const float *f = weights_tensor(w, b->name, &n);
    cr_assert_not_null(f, "%s", b->name);
    if (q) {
        cr_assert_eq(q->dtype, b->dtype, "%s", b->name);
        if (!quant_kernel_order(k->s->target, q->dtype, q->rows, q->cols, q->data, dst)) /* the kernel's order */
            memcpy(dst, q->data, q->nbytes);
    } else {
        cr_assert_eq(b->dtype, DT_F32, "%s", b->name);
        memcpy(dst, f, sizeof(float) * (size_t)n);
    }
}

/* Lowers for target ("cpu" or "host-cuda"), compiles, loads, and writes
 * the weights blob. */
static void qkern_build(QKern *k, const ModelDesc *m, const Weights *w, const char *target, int workers)
{
    memset(k, 0, sizeof *k);
    Diag d;
    diag_init(&d);
    k->s = lower_model_weights(m, w, target_lookup(target, &d), workers, &d);
    cr_assert_not_null(k->s);
    sched_layout(k->s);
    strcpy(k->dir, "/tmp/megac_quant_XXXXXX");
    cr_assert_not_null(mkdtemp(k->dir));
    snprintf(k->so, sizeof k->so, "%s/kernel.so", k->dir);
    if (!strcmp(target, "cpu"))
        cr_assert(cg_cpu_compile(k->s, NULL, k->so, &d), "cg_cpu_compile failed");
    else
        cr_assert(cg_hostcuda_compile(k->s, k->so, &d), "cg_hostcuda_compile failed");
    k->dl = dlopen(k->so, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(k->dl, "dlopen: %s", dlerror());
    k->worker = (QWorkerFn)(uintptr_t)dlsym(k->dl, "megac_worker");
    cr_assert_not_null(k->worker);
    k->weights = qalloc64(k->s->weights_bytes);
    k->arena = qalloc64(k->s->arena_bytes);
    k->ctrs = qalloc64(4 * (k->s->nctrs + 1));
    for (uint32_t i = 0; i < k->s->nbufs; i++)
        if (k->s->bufs[i].cls == BUF_WEIGHT)
            qkern_weight(k, &k->s->bufs[i], w);
}

static void qkern_free(QKern *k)
{
    dlclose(k->dl);
    char src[80];
    snprintf(src, sizeof src, "%s/kernel.host.c", k->dir); /* host-cuda's source */
    unlink(src);
    unlink(k->so);
    rmdir(k->dir);
    free(k->weights), free(k->arena), free(k->ctrs);
    sched_free(k->s);
}

typedef struct QJob {
    QKern *k;
    MegacArgs *args;
    uint32_t w;
} QJob;

static void *qjob_main(void *p)
{
    QJob *j = p;
    j->k->worker(j->args, j->w);
    return NULL;
}

static void *qkern_buf(QKern *k, const char *name)
{
    int64_t b = sched_find_buffer(k->s, name);
    cr_assert(b >= 0);
    return k->arena + k->s->bufs[b].offset;
}

/* One step at pos with token tok; returns the logits. */
static const float *qkern_step(QKern *k, int tok, int pos)
{
    uint32_t n = k->s->nworkers;
    *(int32_t *)qkern_buf(k, "tok") = tok;
    memset(k->ctrs, 0, 4 * (k->s->nctrs + 1));
    MegacArgs args = {k->weights, k->arena, k->ctrs, &k->abort_info, pos, 0, -1, 0, 0};
    pthread_t th[16];
    QJob jobs[16];
    cr_assert(n <= 16);
    for (uint32_t w = 0; w < n; w++) {
        jobs[w] = (QJob){k, &args, w};
        cr_assert_eq(pthread_create(&th[w], NULL, qjob_main, &jobs[w]), 0);
    }
    for (uint32_t w = 0; w < n; w++)
        pthread_join(th[w], NULL);
    cr_assert_eq(k->abort_info.flag, 0, "pos %d: aborted", pos);
    return qkern_buf(k, "logits");
}

/* Decodes `steps` positions with the kernel and the reference on the same
 * quantized weights; tokens are the reference's greedy ones. */
static void kernel_vs_reference(const ModelDesc *m, const char *target, int workers, int steps)
{
    Diag d;
    diag_init(&d);
    Weights w;
    cr_assert(weights_load(&w, m, &d));
    QKern k;
    qkern_build(&k, m, &w, target, workers);
    RefState *r = ref_new(&w);
    int tok = 1;
    for (int pos = 0; pos < steps; pos++) {
        const float *ref = ref_step(r, tok, pos), *got = qkern_step(&k, tok, pos);
        float mx = 0, err = 0;
        int best = 0, kbest = 0;
        for (int i = 0; i < m->vocab_size; i++) {
            mx = fabsf(ref[i]) > mx ? fabsf(ref[i]) : mx;
            err = fabsf(got[i] - ref[i]) > err ? fabsf(got[i] - ref[i]) : err;
            best = ref[i] > ref[best] ? i : best;
            kbest = got[i] > got[kbest] ? i : kbest;
        }
        cr_assert_leq(err, 1e-3f * (mx > 1 ? mx : 1), "%s %s W=%d pos %d: logits differ by %g", m->name, target,
                      workers, pos, err);
        cr_assert(kbest == best || ref[best] - ref[kbest] < 1e-4f, "%s %s W=%d pos %d: greedy %d, reference %d",
                  m->name, target, workers, pos, kbest, best);
        cr_assert_eq(*(int32_t *)qkern_buf(&k, "next"), kbest);
        tok = best;
    }
    ref_free(r);
    qkern_free(&k);
    weights_free(&w);
}

Test(quant, cpu_stories260k_quantized, .timeout = 120)
{
    if (access(SHARED "/models/stories260K.bin", R_OK) != 0)
        cr_skip("../shared/models/stories260K.bin absent");
    const char *fmts[] = {"{default: w4a16-g32, embed: f16}", "{default: w8a16, mlp: w4a16-g128, embed: bf16}",
                          "w4a16-g64"};
    for (size_t i = 0; i < sizeof fmts / sizeof *fmts; i++) {
        Arena a = {0};
        ModelDesc m;
        Diag d;
        diag_init(&d);
        DescOverride ov[] = {{"quant", fmts[i]}};
        cr_assert(desc_load(&m, &a, MEGAC_SRC "/models/stories260k.yaml", ov, 1, &d));
        kernel_vs_reference(&m, "cpu", 1 + 2 * (int)i, 24);
        arena_free(&a);
    }
}

Test(quant, cpu_synthetic_and_gguf_blocks, .timeout = 120)
{
    Arena a = {0};
    ModelDesc m;
    DescOverride ov[] = {{"quant", "{default: w4a16-g32, attn: w8a16, lm_head: f16}"}};
    cr_assert(desc_text(&m, &a, TINY_YAML, ov, 1));
    kernel_vs_reference(&m, "cpu", 3, 16);
    if (access(MEGAC_SRC "/tests/fixtures/weights/tiny.gguf", R_OK) == 0) {
        ModelDesc g;
        cr_assert(desc_text(&g, &a, GGUF_YAML, NULL, 0));
        kernel_vs_reference(&g, "cpu", 2, 12); /* Q8_0, Q4_0, Q4_1 blocks as they are; F16/BF16 as f32 */
    }
    arena_free(&a);
}

/* The CUDA kernel body run on the host (the exact generated CUDA C, through
 * the shim): the same quantized models as on the CPU. */
Test(quant, hostcuda_quantized, .timeout = 180)
{
    Arena a = {0};
    ModelDesc m;
    DescOverride ov[] = {{"quant", "{default: w4a16-g32, attn: w8a16, lm_head: f16, embed: bf16}"}};
    cr_assert(desc_text(&m, &a, TINY_YAML, ov, 1));
    kernel_vs_reference(&m, "host-cuda", 2, 8);
    if (access(MEGAC_SRC "/tests/fixtures/weights/tiny.gguf", R_OK) == 0) {
        ModelDesc g;
        cr_assert(desc_text(&g, &a, GGUF_YAML, NULL, 0));
        kernel_vs_reference(&g, "host-cuda", 3, 8);
    }
    if (access(SHARED "/models/stories260K.bin", R_OK) == 0) {
        ModelDesc st;
        Diag d;
        diag_init(&d);
        DescOverride q[] = {{"quant", "{default: w4a16-g64, mlp: w4a16-g128, embed: w8a16}"}};
        cr_assert(desc_load(&st, &a, MEGAC_SRC "/models/stories260k.yaml", q, 1, &d));
        kernel_vs_reference(&st, "host-cuda", 4, 4);
    }
    arena_free(&a);
}

/* NVRTC compiles the quantized kernel for a GPU architecture (no GPU
 * needed to compile). */
typedef struct Retries {
    int n;
} Retries;

static void count_retry(void *ctx, double seconds, const char *what)
{
    Retries *r = ctx;
    cr_assert_gt(seconds, 0.0);
    cr_assert(strstr(what, "sm_90 spills with ") && strstr(what, "; again with "), "%s", what);
    r->n++;
}

Test(quant, cuda_nvrtc_compiles_quantized, .timeout = 180)
{
    /* three NVRTC compiles (two spill), 54 s under ASan, none of it
     * sanitized code; the sanitized test_cuda compiles each stored format */
    if (harness_sanitized())
        cr_skip_test("NVRTC only: the plain suite runs it");
    Arena a = {0};
    ModelDesc m;
    DescOverride ov[] = {{"quant", "{default: w4a16-g128, attn: w8a16, embed: f16}"}};
    cr_assert(desc_text(&m, &a, TINY_YAML, ov, 1));
    Diag d;
    diag_init(&d);
    Weights w;
    cr_assert(weights_load(&w, &m, &d));
    Schedule *s = lower_model_weights(&m, &w, target_lookup("sm_90", &d), 8, &d);
    cr_assert_not_null(s);
    sched_layout(s);
    char dir[] = "/tmp/megac_quant_cu_XXXXXX", path[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/kernel.cubin", dir);
    CudaKernelInfo info;
    Retries r = {0};
    CgCudaProgress p = {count_retry, &r};
    cr_assert(cg_cuda_compile_ex(s, "sm_90", path, &info, &p, &d), "NVRTC failed");
    cr_assert_eq(info.local_bytes, 0, "spills");
    /* every compile of the search that spilled was reported: as many as
     * the steps from the first layout to the one that fitted */
    CudaLayout l0 = cuda_layout(s, false);
    int steps = (l0.preloads - info.preloads) + (l0.block_lanes && !info.block_lanes) + (l0.vloads - info.vloads) / 2;
    cr_assert_eq(r.n, steps, "%d retries reported, %d steps taken", r.n, steps);
    unlink(path);
    rmdir(dir);
    sched_free(s);
    weights_free(&w);
    arena_free(&a);
}

/* The real SmolLM2-135M-Instruct Q4_1 GGUF on the CPU backend: its own
 * Q4_1 and Q8_0 blocks in the kernel, against the reference on the same
 * weights (MEGAC_SMOLLM2_GGUF names the file; skipped without it). */
Test(quant, cpu_smollm2_gguf_own_blocks, .timeout = 300)
{
    const char *gguf = getenv("MEGAC_SMOLLM2_GGUF");
    if (!gguf || !*gguf)
        cr_skip("MEGAC_SMOLLM2_GGUF is not set (path of SmolLM2-135M-Instruct.Q4_1.gguf)");
    Arena a = {0};
    ModelDesc m;
    Diag d;
    diag_init(&d);
    DescOverride ov[] = {{"weights.path", gguf}, {"max_seq", "64"}};
    cr_assert(desc_load(&m, &a, MEGAC_SRC "/models/smollm2-135m-instruct-gguf.yaml", ov, 2, &d));
    kernel_vs_reference(&m, "cpu", 2, 6);
    arena_free(&a);
}

/* ---- GGUF Q5_0, Q5_1 and k-quants (Q4_K, Q5_K, Q6_K) ---- */

#define KQ_FIX MEGAC_SRC "/tests/fixtures/weights"

/* A tiny Llama whose matrices are all Q5_0/Q5_1/Q4_K/Q5_K/Q6_K blocks
 * (tests/fixtures/weights/make_kquant.py). */
#define KQ_ARCH                                                                                       \
    "arch: {dim: 256, hidden_dim: 256, n_layers: 2, n_heads: 4, n_kv_heads: 2, head_dim: 64,"         \
    " vocab_size: 260, max_seq: 16}\n"                                                                \
    "tie_embeddings: false\n"
#define KQ_YAML                                                                                       \
    "name: tiny-kquant\n" KQ_ARCH "weights: {format: gguf, path: ../weights/kquant.gguf}\n"            \
    "tokenizer: {format: none}\n"
/* kquant.gguf's shapes in Q2_K, Q3_K, IQ4_NL and IQ4_XS (make_kquant.py) */
#define LOWBIT_YAML                                                                                   \
    "name: tiny-lowbit\n" KQ_ARCH "weights: {format: gguf, path: ../weights/lowbit.gguf}\n"            \
    "tokenizer: {format: none}\n"

/* A tensor (a GGUF name, or megac's canonical one) and its dtype. */
typedef struct {
    const char *name;
    DType t;
} NamedDtype;

/* quant.c's dequantizers against gguf-py's (numpy, written apart from
 * megac) on random blocks of every type in tests/fixtures/weights/
 * STEM_blocks.gguf (make_kquant.py): bit for bit. */
static void blocks_match_gguf_py(const char *stem, const NamedDtype *want, size_t n)
{
    char gpath[512], epath[512];
    snprintf(gpath, sizeof gpath, KQ_FIX "/%s_blocks.gguf", stem);
    snprintf(epath, sizeof epath, KQ_FIX "/%s_blocks.expected.bin", stem);
    if (access(gpath, R_OK) != 0 || access(epath, R_OK) != 0)
        cr_skip("tests/fixtures/weights/%s_blocks.* absent", stem);
    Diag d;
    diag_init(&d);
    GgufFile *g = gguf_open(gpath, &d);
    cr_assert_not_null(g);
    FILE *f = fopen(epath, "rb");
    cr_assert_not_null(f);
    float got[512], exp[512];
    for (size_t i = 0; i < n; i++) {
        const GgufTensor *t = gguf_find_tensor(g, want[i].name);
        cr_assert_not_null(t, "%s", want[i].name);
        cr_assert_eq(t->dims[0], 512);
        cr_assert_eq(t->nbytes, 4 * dtype_row_bytes(want[i].t, 512), "%s: bytes", want[i].name);
        for (int r = 0; r < 4; r++) {
            cr_assert_eq(fread(exp, sizeof(float), 512, f), 512);
            quant_row_dequant(want[i].t, (const unsigned char *)t->data + r * dtype_row_bytes(want[i].t, 512), 512,
                              got);
            for (int j = 0; j < 512; j++)
                cr_assert(got[j] == exp[j] || (isnan(got[j]) && isnan(exp[j])), "%s row %d [%d]: %.9g, gguf-py %.9g",
                          want[i].name, r, j, got[j], exp[j]);
        }
    }
    cr_assert_eq(fread(exp, 1, 1, f), 0, "%s: more expected values than tensors", epath);
    fclose(f);
    gguf_close(g);
}

Test(quant, gguf_kquant_blocks_match_gguf_py)
{
    static const NamedDtype want[] = {{"blocks.Q5_0", DT_Q5_0}, {"blocks.Q5_1", DT_Q5_1}, {"blocks.Q4_K", DT_Q4_K},
                                     {"blocks.Q5_K", DT_Q5_K}, {"blocks.Q6_K", DT_Q6_K}};
    blocks_match_gguf_py("kquant", want, sizeof want / sizeof *want);
}

Test(quant, gguf_lowbit_blocks_match_gguf_py)
{
    static const NamedDtype want[] = {{"blocks.Q2_K", DT_Q2_K},
                                     {"blocks.Q3_K", DT_Q3_K},
                                     {"blocks.IQ4_NL", DT_IQ4_NL},
                                     {"blocks.IQ4_XS", DT_IQ4_XS}};
    blocks_match_gguf_py("lowbit", want, sizeof want / sizeof *want);
}

/* A fixture model's description and weights: the k-quant model (yaml
 * KQ_YAML, file "kquant") or the low-bit one (LOWBIT_YAML, "lowbit"); the
 * test is skipped without its file. */
static void kq_model_load(Arena *a, ModelDesc *m, Weights *w, const char *yaml, const char *file)
{
    char path[512];
    snprintf(path, sizeof path, KQ_FIX "/%s.gguf", file);
    if (access(path, R_OK) != 0)
        cr_skip("tests/fixtures/weights/%s.gguf absent", file);
    cr_assert(desc_text(m, a, yaml, NULL, 0));
    Diag d;
    diag_init(&d);
    cr_assert(weights_load(w, m, &d));
}

/* Each named matrix of w is held in its dtype, and every matrix's f32 view
 * is the dequantization of its bytes. */
static void expect_stored(const Weights *w, const NamedDtype *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(weights_dtype(w, want[i].name), want[i].t, "%s: %s", want[i].name,
                     dtype_name(weights_dtype(w, want[i].name)));
    expect_views(w);
}

/* A model of those blocks: kept byte for byte, the f32 views are their
 * dequantization, and both kernels (the CPU's, the generated CUDA C on
 * the host) follow the reference on the same weights, step by step. */
Test(quant, gguf_kquant_model_runs_on_its_blocks, .timeout = 180)
{
    Arena a = {0};
    ModelDesc m;
    Weights w;
    kq_model_load(&a, &m, &w, KQ_YAML, "kquant");
    static const NamedDtype want[] = {{"embed", DT_Q6_K},   {"L0.wq", DT_Q4_K},    {"L0.wk", DT_Q5_K},
                                      {"L0.wv", DT_Q6_K},   {"L0.wo", DT_Q5_0},    {"L0.w_up", DT_Q5_1},
                                      {"L1.wq", DT_Q5_1},   {"L1.w_down", DT_Q6_K}, {"lm_head", DT_Q4_K}};
    expect_stored(&w, want, sizeof want / sizeof *want);
    weights_free(&w);
    kernel_vs_reference(&m, "cpu", 2, 12);
    kernel_vs_reference(&m, "host-cuda", 3, 6);
    arena_free(&a);
}

/* kquant.gguf's shapes in Q2_K, Q3_K, IQ4_NL and IQ4_XS (with a Q4_K and
 * a Q6_K matrix; make_kquant.py): kept byte for byte, and both kernels
 * follow the reference on them, as above; with int8 inputs (quant a8)
 * Q2_K and Q3_K keep their exact rows (they have no A8 form) and the
 * others take theirs (a8_keeps_stored_weights). */
Test(quant, gguf_lowbit_model_runs_on_its_blocks, .timeout = 180)
{
    Arena a = {0};
    ModelDesc m, m8;
    Weights w;
    kq_model_load(&a, &m, &w, LOWBIT_YAML, "lowbit");
    static const NamedDtype want[] = {{"embed", DT_Q3_K},     {"L0.wq", DT_Q2_K},     {"L0.wk", DT_Q3_K},
                                      {"L0.wv", DT_IQ4_NL},   {"L0.wo", DT_IQ4_XS},   {"L0.w_up", DT_Q2_K},
                                      {"L0.w_down", DT_Q4_K}, {"L1.wq", DT_IQ4_XS},   {"L1.w_up", DT_Q6_K},
                                      {"lm_head", DT_IQ4_XS}};
    expect_stored(&w, want, sizeof want / sizeof *want);
    weights_free(&w);
    DescOverride i8[] = {{"quant", "a8"}};
    cr_assert(desc_text(&m8, &a, LOWBIT_YAML, i8, 1));
    Diag d;
    diag_init(&d);
    kernel_vs_reference(&m, "cpu", 1, 12);
    kernel_vs_reference(&m, "cpu", 3, 12);
    kernel_vs_reference(&m, "host-cuda", 3, 6);
    /* int8 inputs: every stored block type has its A8 form */
    cr_assert(weights_load(&w, &m8, &d));
    cr_assert_eq(weights_dtype(&w, "L0.wq"), DT_Q2_KA8);
    cr_assert_eq(weights_dtype(&w, "L0.wk"), DT_Q3_KA8);
    cr_assert_eq(weights_dtype(&w, "L0.w_down"), DT_Q4_KA8);
    weights_free(&w);
    arena_free(&a);
}

/* AWQ and GPTQ checkpoints (tests/fixtures/weights/make_hf_quant.py): the
 * kernels on their 4-bit groups as stored (W4A16-g32 and -g64) follow the
 * reference on the same weights, on the CPU and in the generated CUDA C
 * (an f32 cache, as the other exact comparisons keep); with int8 inputs
 * (quant a8) the same bytes are kept as W4A8G* and the CPU's step stays
 * within a small KL of the stored model's. */
Test(quant, awq_gptq_models_run_on_their_groups, .timeout = 180)
{
    static const char *const dirs[] = {KQ_FIX "/awq", KQ_FIX "/gptq"};
    static const DType a16[] = {DT_W4G32, DT_W4G64}, a8[] = {DT_W4A8G32, DT_W4A8G64};
    if (access(KQ_FIX "/awq/model.safetensors", R_OK) != 0 || access(KQ_FIX "/gptq/model.safetensors", R_OK) != 0)
        cr_skip("fixtures absent; run tests/fixtures/weights/make_hf_quant.py");
    for (int c = 0; c < 2; c++) {
        Arena a = {0};
        ModelDesc m, m8;
        Diag d;
        diag_init(&d);
        /* the stored model, an f32 cache, the tokenizer megac run would need (the fixtures have none) */
        DescOverride ov[] = {{"compile.kv_dtype", "f32"}, {"tokenizer", "{format: bytes}"}}, i8[] = {{"quant", "a8"}};
        cr_assert(desc_load(&m, &a, dirs[c], ov, 2, &d) && desc_load(&m8, &a, dirs[c], i8, 1, &d), "%s", dirs[c]);
        Weights w, w8;
        cr_assert(weights_load(&w, &m, &d) && weights_load(&w8, &m8, &d));
        const QTensor *q = weights_qtensor(&w, "L1.w_down"), *q8 = weights_qtensor(&w8, "L1.w_down");
        cr_assert(q && q->dtype == a16[c] && q8 && q8->dtype == a8[c], "%s: %s, %s", dirs[c],
                  q ? dtype_name(q->dtype) : "-", q8 ? dtype_name(q8->dtype) : "-");
        cr_assert(q->nbytes == q8->nbytes && !memcmp(q->data, q8->data, q->nbytes), "%s: a8 keeps the groups",
                  dirs[c]);
        weights_free(&w);
        weights_free(&w8);
        kernel_vs_reference(&m, "cpu", 2, 12);
        kernel_vs_reference(&m, "host-cuda", 3, 6);
        QuantSpec f[1] = {{QUANT_A8, 0}};
        QuantEval e[2];
        QuantEvalRun r = {"Once upon", 16, 15, "cpu", dirs[c], ov, 2, false};
        cr_assert(quant_eval(&m, &r, f, 1, e, &d));
        cr_assert_eq(e[1].bpw, e[0].bpw, "%s: the stored bits per weight: %g, %g", dirs[c], e[1].bpw, e[0].bpw);
        /* tiny random models move more than real ones (5e-4 to 8e-4 here); a broken int8 row is far off */
        cr_assert(e[1].mean_kl < 5e-3, "%s: a8 mean KL %g", dirs[c], e[1].mean_kl);
        cr_log_info("%s: a8 against the stored groups, mean KL %.3g, same top-1 %.2f", dirs[c], e[1].mean_kl,
                    e[1].top1);
        arena_free(&a);
    }
}

/* NVRTC compiles the GEMVs of model m's blocks for sm_80/90/120 without
 * spills (the k-quant and the low-bit fixture models). */
static void nvrtc_no_spills(const ModelDesc *m, Weights *w)
{
    Diag d;
    diag_init(&d);
    const char *archs[] = {"sm_80", "sm_90", "sm_120"};
    for (int i = 0; i < 3; i++) {
        if (!harness_variant_wanted(1, (size_t)i, 3)) /* sanitized: sm_90 only */
            continue;
        Schedule *s = lower_model_weights(m, w, target_lookup(archs[i], &d), 8, &d);
        cr_assert_not_null(s);
        sched_layout(s);
        char dir[] = "/tmp/megac_kq_cu_XXXXXX", path[64];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/kernel.cubin", dir);
        CudaKernelInfo info;
        cr_assert(cg_cuda_compile(s, archs[i], path, &info, &d), "%s: NVRTC failed for %s", m->name, archs[i]);
        cr_assert_eq(info.local_bytes, 0, "%s %s: %d bytes of local memory", m->name, archs[i], (int)info.local_bytes);
        unlink(path);
        rmdir(dir);
        sched_free(s);
    }
}

Test(quant, gguf_kquant_nvrtc, .timeout = 240)
{
    static const char *const yamls[] = {KQ_YAML, LOWBIT_YAML}, *const files[] = {"kquant", "lowbit"};
    for (int i = 0; i < 2; i++) {
        Arena a = {0};
        ModelDesc m;
        Weights w;
        kq_model_load(&a, &m, &w, yamls[i], files[i]);
        nvrtc_no_spills(&m, &w);
        weights_free(&w);
        arena_free(&a);
    }
}

/* A8's NMSE against the exact GEMV of the same blocks: > 0 (the inputs
 * are quantized), within llama.cpp's 5e-4 for int8 activations. */
static void a8_near_exact(const QTensor *src, const QTensor *q)
{
    double *y8 = malloc(sizeof(double) * (size_t)q->rows), *y16 = malloc(sizeof(double) * (size_t)q->rows);
    float *x = malloc(sizeof(float) * (size_t)q->cols);
    fill(x, q->cols, 31, 1.0f);
    quant_gemv_a8_ref(q->dtype, q->data, q->rows, q->cols, x, y8);
    quant_gemv_ref(src->dtype, src->data, src->rows, src->cols, x, y16);
    double num = 0, den = 0;
    for (int64_t r = 0; r < q->rows; r++)
        num += (y8[r] - y16[r]) * (y8[r] - y16[r]), den += y16[r] * y16[r];
    cr_assert(num > 0 && num / den <= 5e-4, "%s: nmse %g against the exact GEMV", dtype_name(q->dtype), num / den);
    free(y8), free(y16), free(x);
}

/* quant a8 keeps every stored matrix's values and gives the ones with an
 * int8-input form that form: GGUF Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to
 * Q6_K and IQ4 blocks byte for byte (Q4_0A8, Q4_1A8, Q5_0A8, Q5_1A8,
 * Q8_0A8, Q2_KA8 to Q6_KA8, IQ4_NLA8, IQ4_XSA8), f16 and bf16 as they
 * are. On the k-quant and low-bit models the CPU kernel
 * path stays close to the model as stored (teacher-forced, 16
 * positions). */
Test(quant, a8_keeps_stored_weights, .timeout = 120)
{
    if (access(MEGAC_SRC "/tests/fixtures/weights/tiny.gguf", R_OK) != 0 || access(KQ_FIX "/kquant.gguf", R_OK) != 0)
        cr_skip("tests/fixtures/weights/tiny.gguf or kquant.gguf absent");
    Arena a = {0};
    Diag d;
    diag_init(&d);
    DescOverride ov[] = {{"quant", "a8"}};
    const struct {
        const char *yaml, *canon;
        DType src, t;
    } want[] = {{GGUF_YAML, "L0.wq", DT_Q4_0, DT_Q4_0A8},  {GGUF_YAML, "L0.wk", DT_Q4_1, DT_Q4_1A8},
                {GGUF_YAML, "L0.wv", DT_F16, DT_F16},      {GGUF_YAML, "L0.wo", DT_Q8_0, DT_Q8_0A8},
                {GGUF_YAML, "L0.w_gate", DT_BF16, DT_BF16}, {GGUF_YAML, "embed", DT_Q8_0, DT_Q8_0A8},
                {KQ_YAML, "L0.wo", DT_Q5_0, DT_Q5_0A8},    {KQ_YAML, "L0.w_up", DT_Q5_1, DT_Q5_1A8},
                {KQ_YAML, "L1.wv", DT_Q5_0, DT_Q5_0A8},    {KQ_YAML, "L0.wq", DT_Q4_K, DT_Q4_KA8},
                {KQ_YAML, "L0.wk", DT_Q5_K, DT_Q5_KA8},    {KQ_YAML, "L0.wv", DT_Q6_K, DT_Q6_KA8},
                {KQ_YAML, "embed", DT_Q6_K, DT_Q6_KA8},    {LOWBIT_YAML, "L0.wv", DT_IQ4_NL, DT_IQ4_NLA8},
                {LOWBIT_YAML, "L0.wo", DT_IQ4_XS, DT_IQ4_XSA8}, {LOWBIT_YAML, "lm_head", DT_IQ4_XS, DT_IQ4_XSA8},
                {LOWBIT_YAML, "L0.wq", DT_Q2_K, DT_Q2_KA8}, {LOWBIT_YAML, "L0.wk", DT_Q3_K, DT_Q3_KA8}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        ModelDesc m0, m1;
        Weights w0, w1;
        cr_assert(desc_text(&m0, &a, want[i].yaml, NULL, 0) && desc_text(&m1, &a, want[i].yaml, ov, 1));
        cr_assert(weights_load(&w0, &m0, &d) && weights_load(&w1, &m1, &d));
        const QTensor *q0 = weights_qtensor(&w0, want[i].canon), *q1 = weights_qtensor(&w1, want[i].canon);
        cr_assert(q0 && q0->dtype == want[i].src && q1 && q1->dtype == want[i].t, "%s: %s", want[i].canon,
                  q1 ? dtype_name(q1->dtype) : "-");
        int64_t n;
        const float *f0 = weights_tensor(&w0, want[i].canon, &n), *f1 = weights_tensor(&w1, want[i].canon, NULL);
        cr_assert(memcmp(f0, f1, sizeof(float) * (size_t)n) == 0, "%s: values kept bit for bit", want[i].canon);
        if (dtype_layout(want[i].t) == want[i].src) /* the same bytes */
            cr_assert(q1->nbytes == q0->nbytes && !memcmp(q0->data, q1->data, q0->nbytes), "%s: blocks kept",
                      want[i].canon);
        if (dtype_is_a8(want[i].t))
            a8_near_exact(q0, q1);
        weights_free(&w0);
        weights_free(&w1);
    }
    /* the models, compiled for the CPU with a8, against themselves as stored */
    static const char *const files[] = {"kquant", "lowbit"};
    for (int i = 0; i < 2; i++) {
        char path[] = "/tmp/megac_kq_a8_XXXXXX.yaml";
        int fd = mkstemps(path, 5);
        cr_assert(fd >= 0);
        char text[1024];
        int len = snprintf(text, sizeof text,
                           "name: tiny-%s\n" KQ_ARCH "weights: {format: gguf, path: %s/%s.gguf}\n"
                           "tokenizer: {format: bytes}\n",
                           files[i], KQ_FIX, files[i]);
        cr_assert(write(fd, text, (size_t)len) == len);
        close(fd);
        ModelDesc m;
        cr_assert(desc_load(&m, &a, path, NULL, 0, &d));
        QuantSpec f[1] = {{QUANT_A8, 0}};
        QuantEval e[2];
        QuantEvalRun r = {"Once upon", 16, 15, "cpu", path, NULL, 0, false};
        cr_assert(quant_eval(&m, &r, f, 1, e, &d));
        unlink(path);
        cr_assert_eq(e[1].bpw, e[0].bpw, "%s: the stored bits per weight: %g, %g", files[i], e[1].bpw, e[0].bpw);
        cr_assert(e[1].mean_kl > 0 && e[1].mean_kl < 1e-3, "%s: a8 mean KL %g", files[i], e[1].mean_kl);
        cr_assert_geq(e[1].top1, 0.8, "%s: a8 same top-1 %g", files[i], e[1].top1);
        cr_log_info("%s: a8 against the stored blocks, mean KL %.3g, same top-1 %.2f", files[i], e[1].mean_kl,
                    e[1].top1);
    }
    arena_free(&a);
}

/* Any model description (MEGAC_GGUF_MODEL names it; skipped without it),
 * for GGUF files too large or too foreign for the repository (a Q4_K_M
 * file made with llama.cpp's llama-quantize): its own blocks in the CPU
 * kernel against the reference on the same weights, 6 steps. */
Test(quant, cpu_gguf_model_own_blocks, .timeout = 600)
{
    const char *yaml = getenv("MEGAC_GGUF_MODEL");
    if (!yaml || !*yaml)
        cr_skip("MEGAC_GGUF_MODEL is not set (a model description)");
    Arena a = {0};
    ModelDesc m;
    Diag d;
    diag_init(&d);
    DescOverride ov[] = {{"max_seq", "64"}};
    cr_assert(desc_load(&m, &a, yaml, ov, 1, &d), "cannot load %s", yaml);
    kernel_vs_reference(&m, "cpu", 2, 6);
    arena_free(&a);
}

/* ---- int8 activations on the CPU (w8a8, w4a8) ---- */

/* One GEMV of an A8 weight compiled for the CPU: equal to quant.c's A8
 * definition up to summation order, and within 5e-4 NMSE of the float64
 * GEMV on the same weights. K = 172: a short last block and group. */
/* K 172: the portable loops; 576 (a short last g128 group) and 736 (and a
 * short last superblock of three chunks): the host's fast kernels. */
Test(quant, cpu_a8_gemv, .timeout = 60)
{
    const DType a8[] = {DT_W8A8, DT_W4A8G32, DT_W4A8G64, DT_W4A8G128};
    const int64_t R = 24, Ks[] = {172, 576, 736};
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
    for (size_t ti = 0; ti < sizeof a8 / sizeof *a8; ti++) {
        const int64_t K = Ks[ki];
        float *w = malloc(sizeof(float) * R * K), *x = malloc(sizeof(float) * K);
        fill(w, R * K, 21, 0.1f);
        fill(x, K, 22, 1.0f);
        Schedule *s = sched_new("a8", "cpu", 1);
        s->shape = (ModelShape){.dim = (int)K, .hidden_dim = (int)K, .n_layers = 1, .n_heads = 1, .n_kv_heads = 1,
                                .head_dim = 2, .vocab_size = 16, .max_seq = 4, .norm_eps = 1e-5};
        int64_t sw[2] = {R, K}, sx[1] = {K}, sy[1] = {R};
        uint32_t wb = sched_add_buffer(s, "w", a8[ti], BUF_WEIGHT, 2, sw);
        uint32_t xb = sched_add_buffer(s, "x", DT_F32, BUF_STATE, 1, sx), yb = sched_add_buffer(s, "y", DT_F32,
                                                                                              BUF_SCRATCH, 1, sy);
        Access acc[5] = {{wb, ACC_R, {0, 0}, {R * K, 0}}, {xb, ACC_R, {0, 0}, {K, 0}}, {yb, ACC_W, {0, 0}, {R, 0}},
                         {BUF_NONE, 0, {0, 0}, {0, 0}}, {BUF_NONE, 0, {0, 0}, {0, 0}}};
        sched_op(s, 0, OP_GEMV, (int32_t[]){0, (int32_t)R, (int32_t)K, 0}, acc);
        sched_layout(s);
        char dir[] = "/tmp/megac_quant_a8_XXXXXX", so[64];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(so, sizeof so, "%s/k.so", dir);
        Diag d;
        diag_init(&d);
        cr_assert(cg_cpu_compile(s, NULL, so, &d));
        void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
        cr_assert_not_null(dl, "%s", dlerror());
        QWorkerFn fn = (QWorkerFn)(uintptr_t)dlsym(dl, "megac_worker");
        unsigned char *wts = qalloc64(s->weights_bytes), *ar = qalloc64(s->arena_bytes);
        size_t rb = dtype_row_bytes(a8[ti], K);
        unsigned char *rows = malloc(rb * (size_t)R);
        for (int64_t r = 0; r < R; r++)
            quant_row_quantize(a8[ti], w + r * K, K, rows + r * rb);
        if (!quant_kernel_order("cpu", a8[ti], R, K, rows, wts + s->bufs[wb].offset)) /* the kernel's order */
            memcpy(wts + s->bufs[wb].offset, rows, rb * (size_t)R);
        memcpy(ar + s->bufs[xb].offset, x, sizeof(float) * (size_t)K);
        uint32_t ctr[4] = {0};
        MegacAbort ab = {0};
        MegacArgs args = {wts, ar, ctr, &ab, 0, 0, -1, 0, 0};
        fn(&args, 0);
        const float *y = (const float *)(ar + s->bufs[yb].offset);
        double y8[24], y16[24], num = 0, den = 0;
        quant_gemv_a8_ref(a8[ti], rows, R, K, x, y8);
        quant_gemv_ref(a8[ti], rows, R, K, x, y16);
        for (int64_t r = 0; r < R; r++) {
            cr_assert_leq(fabs(y[r] - y8[r]), 1e-5 * (fabs(y8[r]) + 1), "%s K %ld row %ld: %g vs %g",
                          dtype_name(a8[ti]), (long)K, (long)r, y[r], y8[r]);
            num += (y[r] - y16[r]) * (y[r] - y16[r]);
            den += y16[r] * y16[r];
        }
        cr_assert_leq(num / den, 5e-4, "%s K %ld: nmse %g against float64", dtype_name(a8[ti]), (long)K,
                      num / den);
        dlclose(dl);
        unlink(so);
        rmdir(dir);
        free(wts), free(ar), free(w), free(x), free(rows);
        sched_free(s);
    }
}

/* The CUDA backend has no int8-activation GEMV: it refuses, never guesses. */
Test(quant, cuda_refuses_a8)
{
    Arena a = {0};
    ModelDesc m;
    DescOverride ov[] = {{"quant", "w8a8"}};
    cr_assert(desc_text(&m, &a, TINY_YAML, ov, 1));
    char buf[4096] = {0};
    Diag d;
    diag_init(&d);
    /* the lowering for a CUDA target refuses it (one error) */
    d.out = fmemopen(buf, sizeof buf - 1, "w");
    cr_assert_null(lower_model(&m, target_lookup("sm_90", &d), 4, &d));
    fclose(d.out);
    cr_assert(strstr(buf, "int8-input formats (w8a8, w4a8, a8) run on the CPU backend only (--target cpu)"), "%s",
              buf);
    /* and the CUDA backend, given such a schedule (a .sched file), too */
    memset(buf, 0, sizeof buf);
    Schedule *s = lower_model(&m, target_lookup("cpu", &d), 4, &d);
    cr_assert_not_null(s);
    sched_layout(s);
    d.out = fmemopen(buf, sizeof buf - 1, "w");
    CudaKernelInfo info;
    cr_assert_not(cg_cuda_compile(s, "sm_90", "/tmp/megac_never.cubin", &info, &d));
    fclose(d.out);
    cr_assert(strstr(buf, "of dtype w8a8 is not supported by the CUDA backend yet"), "%s", buf);
    sched_free(s);
    arena_free(&a);
}

/* Teacher-forced fidelity of the kernel path (a CPU bundle per format):
 * the recorded w8a8/w4a8 figures hold, and for the A16 formats the kernel
 * path's KL equals the float64 reference path's (kernel correctness). */
Test(quant, fidelity_stories260k_cpu_kernel, .timeout = 120)
{
    if (access(SHARED "/models/stories260K.bin", R_OK) != 0)
        cr_skip("../shared/models/stories260K.bin absent");
    const char *path = MEGAC_SRC "/models/stories260k.yaml";
    Arena a = {0};
    ModelDesc m;
    Diag d;
    diag_init(&d);
    cr_assert(desc_load(&m, &a, path, NULL, 0, &d));
    fidelity_check(&m, path, NULL, 0, QFIX "/fidelity-stories260k-cpu.json");
    QuantSpec f[2] = {{QUANT_W8A16, 0}, {QUANT_W4A16, 32}};
    QuantEval ek[3], er[3];
    QuantEvalRun rk = {"Once upon a time", 32, 15, "cpu", path, NULL, 0, false}, rr = rk;
    rr.engine = "reference";
    cr_assert(quant_eval(&m, &rk, f, 2, ek, &d) && quant_eval(&m, &rr, f, 2, er, &d));
    for (int i = 1; i <= 2; i++) {
        cr_assert_leq(fabs(ek[i].mean_kl - er[i].mean_kl), 1e-3 * er[i].mean_kl + 1e-9, "kernel KL %g, reference %g",
                      ek[i].mean_kl, er[i].mean_kl);
        cr_assert_eq(ek[i].top1, er[i].top1);
    }
    arena_free(&a);
}
