/*
 * load_gguf.c - weights from a GGUF file (llama.cpp's names). Every tensor
 * gets its f32 view, dequantized exactly as ggml's reference dequantizers
 * do (quant_row_dequant); matrices in a GGUF block format, f16 or bf16 also
 * keep their bytes as they are, as a QTensor (weights_keep_stored), so that
 * a GGUF model runs on its own weights (layouts: ir/dtype.h). A compile
 * makes no f32 view of the matrices it stores as they are
 * (weights_fetch_stored).
 *   F32, F16, BF16   converted
 *   Q8_0   block of 32: {f16 d; i8 qs[32]}            w[j] = d * qs[j]
 *   Q4_0   block of 32: {f16 d; u8 qs[16]}            w[j] = d * ((qs[j] & 15) - 8),
 *                                                     w[j+16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1   block of 32: {f16 d; f16 m; u8 qs[16]}     w[j] = d * (qs[j] & 15) + m,
 *                                                     w[j+16] = d * (qs[j] >> 4) + m
 *   Q5_0, Q5_1, the k-quants Q2_K to Q6_K (super-blocks of 256), IQ4_NL
 *   and IQ4_XS (non-linear 4-bit values)
 * (each product and sum rounded to f32 separately). GGUF dims are listed
 * fastest-first, so [cols, rows] is our (rows, cols). general.architecture
 * must be "llama" or "qwen2"; RoPE pairing follows llama.cpp's rope type for
 * it: for "llama" its converter un-permutes HF q/k rows and pairs are
 * adjacent; "qwen2" keeps HF's rotate-half order (llama.cpp's NEOX rope).
 * The file's `<arch>.*` hyperparameters, when present, must have their
 * types and agree with the description (a shorter context_length is a
 * warning), and so must the RoPE frequencies of its rope_freqs.weight.
 */
#include "compiler/gguf.h"
#include "compiler/quant.h"
#include "compiler/weights_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_IQ4_NL = 20,
    GGML_IQ4_XS = 23, GGML_BF16 = 30
};

/* The storage dtype of a GGUF type we load; -1 for the others. */
static int gguf_dtype(uint32_t ggml_type)
{
    switch (ggml_type) {
    case GGML_F32: return DT_F32;
    case GGML_F16: return DT_F16;
    case GGML_BF16: return DT_BF16;
    case GGML_Q8_0: return DT_Q8_0;
    case GGML_Q4_0: return DT_Q4_0;
    case GGML_Q4_1: return DT_Q4_1;
    case GGML_Q5_0: return DT_Q5_0;
    case GGML_Q5_1: return DT_Q5_1;
    case GGML_Q4_K: return DT_Q4_K;
    case GGML_Q5_K: return DT_Q5_K;
    case GGML_Q6_K: return DT_Q6_K;
    case GGML_Q3_K: return DT_Q3_K;
    case GGML_Q2_K: return DT_Q2_K;
    case GGML_IQ4_NL: return DT_IQ4_NL;
    case GGML_IQ4_XS: return DT_IQ4_XS;
    default: return -1;
    }
}

/* What load_gguf hands to weights_fill. */
typedef struct GgufCtx {
    const GgufFile *g;
    Weights *w;
} GgufCtx;

static bool gguf_has(void *ctx, const char *name)
{
    return gguf_find_tensor(((GgufCtx *)ctx)->g, name) != NULL;
}

static int gguf_fetch(void *ctx, const char *name, const WSlot *s, float *dst, Diag *d)
{
    const GgufFile *g = ((GgufCtx *)ctx)->g;
    const GgufTensor *t = gguf_find_tensor(g, name);
    if (!t)
        return 0;
    int64_t shape[4];
    for (uint32_t i = 0; i < t->ndim; i++)
        shape[i] = (int64_t)t->dims[t->ndim - 1 - i];
    WSlot whole = wslot_file_shape(s);
    if (!wslot_shape_check(((GgufCtx *)ctx)->w->m, &whole, d, g->path, name, (int)t->ndim, shape))
        return -1;
    int dt = gguf_dtype(t->ggml_type);
    if (!t->data || dt < 0) {
        diag_file_error(d, g->path,
                        "tensor '%s': type %s (%u) is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
                        "Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS are)",
                        name, gguf_type_name(t->ggml_type), t->ggml_type);
        return -1;
    }
    int64_t cols = s->cols ? s->cols : s->rows, rows = s->cols ? s->rows : 1;
    Weights *w = ((GgufCtx *)ctx)->w;
    size_t rb = dtype_row_bytes((DType)dt, cols);
    const unsigned char *data = (const unsigned char *)t->data + (size_t)s->row0 * rb;  /* a fused tensor's part */
    int kept = weights_fetch_stored(w, s, dst, (DType)dt, data, g->path, name, d);
    if (kept)
        return kept;
    for (int64_t r = 0; r < rows; r++)
        quant_row_dequant((DType)dt, data + (size_t)r * rb, cols, dst + r * cols);
    weights_keep_stored(w, s, dst, (DType)dt, data);
    return 1;
}

static const char *gguf_tensor_name(void *ctx, int64_t i, size_t *len)
{
    const GgufFile *g = ((GgufCtx *)ctx)->g;
    if ((uint64_t)i >= g->ntensors)
        return NULL;
    *len = (size_t)g->tensors[i].name.len;
    return g->tensors[i].name.s;
}

/* Tensors a file may hold beside the model's: rope_freqs.weight is read
 * by gguf_rope_freqs_check; blk.N.attn_rot_embd is llama.cpp's name for
 * an HF checkpoint's rotary_emb.inv_freq, which RoPE recomputes. */
static const char *const gguf_known[] = {"rope_freqs.weight",        "attn_rot_embd", "attn_qkv.weight",
                                        "rope_factors_long.weight", "rope_factors_short.weight", NULL};
/* Phi-3's (llama.cpp's phi3): q, k and v in attn_qkv; gate and up in
 * ffn_up, twice the rows, with no ffn_gate */
static const WFused gguf_fused[] = {{"attn_qkv.weight", {WK_WQ, WK_WK, WK_WV, WK_COUNT}},
                                    {"ffn_up.weight", {WK_W_GATE, WK_W_UP, WK_COUNT}},
                                    {NULL, {WK_COUNT}}};

/* `<arch>.<key>` must be an integer equal to the description's value when
 * present. */
static bool gguf_hparam_check(const GgufFile *g, const char *arch, const char *key, const ModelDesc *m,
                              DescSrcField f, int want, Diag *d)
{
    char full[160];
    int64_t v;
    int r = gguf_arch_int(g, arch, key, full, &v, d);
    if (r <= 0)
        return r == 0;      /* absent, or an error reported */
    if (v == want)
        return true;
    diag_file_error(d, g->path, "key '%s' is %" PRId64 ", but the model description says %d", full, v, want);
    desc_note_set(d, m, f);
    return false;
}

/* `<arch>.<key>` must be a positive, finite float within a relative 1e-4
 * of the description's value (an f32 in the file) when present. */
static bool gguf_hparam_float_check(const GgufFile *g, const char *arch, const char *key, const ModelDesc *m,
                                    DescSrcField f, double want, const char *what, Diag *d)
{
    char full[160];
    double v;
    int r = gguf_arch_float(g, arch, key, full, &v, d);
    if (r <= 0)
        return r == 0;
    if (fabs(v - want) <= 1e-4 * fabs(want))
        return true;
    diag_file_error(d, g->path, "key '%s' is %g, but the model description says %s %g", full, v, what, want);
    desc_note_set(d, m, f);
    return false;
}

/* The file's context length may be shorter than the description's max_seq:
 * a warning, as for a llama2.c checkpoint's seq_len. */
static bool gguf_context_check(const GgufFile *g, const char *arch, const ModelDesc *m, Diag *d)
{
    char full[160];
    snprintf(full, sizeof full, "%s.context_length", arch);
    int64_t v;
    if (!gguf_find(g, full))
        return true;
    if (!gguf_get_int(g, full, &v) || v <= 0) {
        diag_file_error(d, g->path, "key '%s' must be a positive integer", full);
        return false;
    }
    if (m->max_seq > v) {
        SrcFile src = {.path = g->path};
        diag_warning(d, &src, 0, 0, "the model's max_seq %d exceeds the file's %s %" PRId64, m->max_seq, full, v);
    }
    return true;
}

int gguf_factor_tensor(const GgufFile *g, const char *name, int half, double *out, Diag *d)
{
    const GgufTensor *t = gguf_find_tensor(g, name);
    if (!t)
        return 0;
    if (t->ggml_type != GGML_F32 || t->ndim != 1 || half < 1 || t->dims[0] != (uint64_t)half) {
        diag_file_error(d, g->path, "tensor '%s' must be %d f32 values (head_dim / 2)", name, half);
        return -1;
    }
    for (int i = 0; i < half; i++) {
        float f;
        memcpy(&f, (const unsigned char *)t->data + 4 * (size_t)i, 4);
        if (!isfinite(f) || f <= 0) {
            diag_file_error(d, g->path, "tensor '%s': element %d is %g, not a positive number", name, i, (double)f);
            return -1;
        }
        out[i] = f;
    }
    return 1;
}

int gguf_rope_factors(const GgufFile *g, int half, double *out, Diag *d)
{
    return gguf_factor_tensor(g, "rope_freqs.weight", half, out, d);
}

/* A file's rope_freqs.weight must give the description's frequencies
 * within 1e-5: a description without the scaling the file was converted
 * with would rotate long contexts wrong. */
static bool gguf_rope_freqs_check(const GgufFile *g, const ModelDesc *m, Diag *d)
{
    int half = m->head_dim / 2;
    double *want = xmalloc(2 * sizeof(double) * (size_t)(half > 0 ? half : 1)), *f = want + half;
    int r = gguf_rope_factors(g, half, f, d);
    if (r > 0)
        rope_freqs(m, want);
    bool ok = r >= 0;
    for (int i = 0; ok && r > 0 && i < half; i++) {
        double got = pow(m->rope_theta, -2.0 * i / m->head_dim) / f[i];
        if (!(fabs(got - want[i]) <= 1e-5 * want[i])) {
            diag_file_error(d, g->path, "tensor 'rope_freqs.weight' gives RoPE pair %d the frequency %g, but the "
                            "model description %g (its rope.scaling: arch: {from-gguf: ...} reads the file's)", i,
                            got, want[i]);
            ok = false;
        }
    }
    free(want);
    return ok;
}

static bool gguf_hparams_check(const GgufFile *g, const ModelDesc *m, const char *arch, Diag *d)
{
    bool ok = gguf_hparam_check(g, arch, "embedding_length", m, DSRC_DIM, m->dim, d);
    ok &= gguf_hparam_check(g, arch, "feed_forward_length", m, DSRC_HIDDEN, m->hidden_dim, d);
    ok &= gguf_hparam_check(g, arch, "block_count", m, DSRC_LAYERS, m->n_layers, d);
    ok &= gguf_hparam_check(g, arch, "attention.head_count", m, DSRC_HEADS, m->n_heads, d);
    ok &= gguf_hparam_check(g, arch, "attention.head_count_kv", m, DSRC_KV_HEADS, m->n_kv_heads, d);
    ok &= gguf_hparam_check(g, arch, "vocab_size", m, DSRC_VOCAB, m->vocab_size, d);
    ok &= gguf_hparam_check(g, arch, "rope.dimension_count", m, DSRC_HEAD_DIM, m->head_dim, d);
    ok &= gguf_hparam_float_check(g, arch, "rope.freq_base", m, DSRC_THETA, m->rope_theta, "rope theta", d);
    ok &= gguf_hparam_float_check(g, arch, "attention.layer_norm_rms_epsilon", m, DSRC_EPS, m->norm_eps,
                                  "norm_eps", d);
    ok &= gguf_context_check(g, arch, m, d);
    return ok && gguf_rope_freqs_check(g, m, d);
}

bool gguf_model_arch(const GgufFile *g, char *arch, size_t n, RopePairing *pairing, Diag *d)
{
    static const struct { const char *name; RopePairing pairing; } archs[] = {
        {"llama", ROPE_ADJACENT}, {"qwen2", ROPE_HALF}, {"phi3", ROPE_HALF},
    };
    GgufStr a;
    if (!gguf_find(g, "general.architecture")) { /* llama.cpp refuses such a file too */
        diag_file_error(d, g->path, "key 'general.architecture' is missing (llama, qwen2 or phi3)");
        return false;
    }
    if (!gguf_get_str(g, "general.architecture", &a)) {
        diag_file_error(d, g->path, "key 'general.architecture' must be a string");
        return false;
    }
    snprintf(arch, n, "%.*s", (int)(a.len < 63 ? a.len : 63), a.s);
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
        if (a.len == strlen(archs[i].name) && memcmp(a.s, archs[i].name, a.len) == 0) {
            *pairing = archs[i].pairing;
            return true;
        }
    if (memchr(a.s, 0, a.len))
        diag_file_error(d, g->path, "key 'general.architecture' holds a NUL character (after '%s')", arch);
    else
        diag_file_error(d, g->path, "architecture '%s' is not supported (llama, qwen2, phi3)", arch);
    return false;
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
    char arch[64];
    bool ok = gguf_model_arch(g, arch, sizeof arch, &w->pairing, d) && weights_pairing_check(w, d, path, w->pairing) &&
              gguf_hparams_check(g, w->m, arch, d);
    if (ok) {
        GgufCtx c = {g, w};
        WSource src = {.ctx = &c, .path = g->path, .name = wslot_gguf_name, .fetch = gguf_fetch, .has = gguf_has,
                       .tensor = gguf_tensor_name, .layer_prefix = "blk.", .known = gguf_known, .fused = gguf_fused};
        ok = weights_fill(w, &src, d);
    }
    gguf_close(g);
    return ok;
}
