/*
 * load_gguf.c - weights from a GGUF file (llama.cpp's names), dequantized
 * to f32 exactly as ggml's reference dequantizers do:
 *   F32, F16, BF16   converted
 *   Q8_0   block of 32: {f16 d; i8 qs[32]}            w[j] = d * qs[j]
 *   Q4_0   block of 32: {f16 d; u8 qs[16]}            w[j] = d * ((qs[j] & 15) - 8),
 *                                                     w[j+16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1   block of 32: {f16 d; f16 m; u8 qs[16]}     w[j] = d * (qs[j] & 15) + m,
 *                                                     w[j+16] = d * (qs[j] >> 4) + m
 * (each product and sum rounded to f32 separately). GGUF dims are listed
 * fastest-first, so [cols, rows] is our (rows, cols). RoPE pairing follows
 * llama.cpp's rope type for general.architecture: for "llama" (and any
 * architecture not listed below) its converter un-permutes HF q/k rows and
 * pairs are adjacent; "qwen2", "phi3" and the "gemma" family keep HF's
 * rotate-half order (llama.cpp's NEOX rope). The file's `<arch>.*`
 * hyperparameters, when present, must agree with the description.
 */
#include "compiler/gguf.h"
#include "compiler/weights_impl.h"

#include <inttypes.h>
#include <string.h>

enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8, GGML_BF16 = 30 };

static float f16_at(const unsigned char *p)
{
    return f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static void dequant_q8_0(float *y, const unsigned char *b, int64_t nblocks)
{
    for (int64_t i = 0; i < nblocks; i++, b += 34, y += 32) {
        float d = f16_at(b);
        for (int j = 0; j < 32; j++)
            y[j] = d * (float)(int8_t)b[2 + j];
    }
}

static void dequant_q4_0(float *y, const unsigned char *b, int64_t nblocks)
{
    for (int64_t i = 0; i < nblocks; i++, b += 18, y += 32) {
        float d = f16_at(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 15) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

static void dequant_q4_1(float *y, const unsigned char *b, int64_t nblocks)
{
    for (int64_t i = 0; i < nblocks; i++, b += 20, y += 32) {
        float d = f16_at(b), m = f16_at(b + 2);
        for (int j = 0; j < 16; j++) {
            float lo = d * (float)(b[4 + j] & 15);
            float hi = d * (float)(b[4 + j] >> 4);
            y[j] = lo + m;
            y[j + 16] = hi + m;
        }
    }
}

/* Converts t (whose shape was checked: n elements) into dst; false for
 * types we cannot load. */
static bool gguf_dequant(float *dst, const GgufTensor *t, int64_t n)
{
    switch (t->ggml_type) {
    case GGML_F32: convert_to_f32(dst, t->data, n, SRC_F32); return true;
    case GGML_F16: convert_to_f32(dst, t->data, n, SRC_F16); return true;
    case GGML_BF16: convert_to_f32(dst, t->data, n, SRC_BF16); return true;
    case GGML_Q8_0: dequant_q8_0(dst, t->data, n / 32); return true;
    case GGML_Q4_0: dequant_q4_0(dst, t->data, n / 32); return true;
    case GGML_Q4_1: dequant_q4_1(dst, t->data, n / 32); return true;
    default: return false;
    }
}

static bool gguf_has(void *ctx, const char *name)
{
    return gguf_find_tensor(ctx, name) != NULL;
}

static int gguf_fetch(void *ctx, const char *name, const WSlot *s, float *dst, Diag *d)
{
    const GgufFile *g = ctx;
    const GgufTensor *t = gguf_find_tensor(g, name);
    if (!t)
        return 0;
    int64_t shape[4];
    for (uint32_t i = 0; i < t->ndim; i++)
        shape[i] = (int64_t)t->dims[t->ndim - 1 - i];
    if (!wslot_shape_check(s, d, g->path, name, (int)t->ndim, shape))
        return -1;
    if (!t->data || !gguf_dequant(dst, t, wslot_nelem(s))) {
        diag_file_error(d, g->path, "tensor '%s': type %s (%u) is not supported (F32, F16, BF16, Q8_0, Q4_0 "
                        "and Q4_1 are)", name, gguf_type_name(t->ggml_type), t->ggml_type);
        return -1;
    }
    return 1;
}

/* `<arch>.<key>` must equal the description's value when present. */
static bool gguf_hparam_check(const GgufFile *g, const char *arch, const char *key, int want, Diag *d)
{
    char full[160];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int64_t v;
    if (!gguf_get_int(g, full, &v) || v == want)
        return true;
    diag_file_error(d, g->path, "key '%s' is %" PRId64 ", but the model description says %d", full, v, want);
    return false;
}

static bool gguf_hparams_check(const GgufFile *g, const ModelDesc *m, Diag *d)
{
    GgufStr a;
    if (!gguf_get_str(g, "general.architecture", &a))
        return true;
    char arch[64];
    snprintf(arch, sizeof arch, "%.*s", (int)(a.len < 63 ? a.len : 63), a.s);
    bool ok = gguf_hparam_check(g, arch, "embedding_length", m->dim, d);
    ok &= gguf_hparam_check(g, arch, "feed_forward_length", m->hidden_dim, d);
    ok &= gguf_hparam_check(g, arch, "block_count", m->n_layers, d);
    ok &= gguf_hparam_check(g, arch, "attention.head_count", m->n_heads, d);
    ok &= gguf_hparam_check(g, arch, "attention.head_count_kv", m->n_kv_heads, d);
    return ok;
}

static RopePairing gguf_pairing(const GgufFile *g)
{
    static const char *const neox[] = {"qwen2", "phi3", "gemma", "gemma2", "gemma3"};
    GgufStr a;
    if (!gguf_get_str(g, "general.architecture", &a))
        return ROPE_ADJACENT;
    for (size_t i = 0; i < sizeof neox / sizeof *neox; i++)
        if (a.len == strlen(neox[i]) && memcmp(a.s, neox[i], a.len) == 0)
            return ROPE_HALF;
    return ROPE_ADJACENT;
}

bool load_gguf(Weights *w, const char *path, Diag *d)
{
    if (!path) {
        diag_file_error(d, w->m->path ? w->m->path : "megac", "GGUF weights need a path");
        return false;
    }
    GgufFile *g = gguf_open(path, d);
    if (!g)
        return false;
    w->pairing = gguf_pairing(g);
    bool ok = weights_pairing_check(w, d, path, w->pairing) && gguf_hparams_check(g, w->m, d);
    if (ok) {
        WSource src = {.ctx = g, .path = g->path, .name = wslot_gguf_name, .fetch = gguf_fetch, .has = gguf_has};
        ok = weights_fill(w, &src, d);
    }
    gguf_close(g);
    return ok;
}
