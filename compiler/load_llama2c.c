/*
 * load_llama2c.c - llama2.c checkpoints (the "v0" .bin written by
 * export.py --version 0 and by the original run.c era).
 *
 * Layout (all little-endian):
 *   header: int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 *           vocab_size (negative: an unshared classifier follows at the end),
 *           seq_len
 *   float32 token_embedding (vocab, dim)
 *           rms_att (L, dim)      wq (L, dim, dim)     wk (L, kv_dim, dim)
 *           wv (L, kv_dim, dim)   wo (L, dim, dim)     rms_ffn (L, dim)
 *           w1 (L, hidden, dim)   w2 (L, dim, hidden)  w3 (L, hidden, dim)
 *           rms_final (dim)
 *           freq_cis_real (seq_len, head_size/2)  freq_cis_imag (same; unused)
 *           [wcls (vocab, dim) when vocab_size < 0]
 * with kv_dim = dim * n_kv_heads / n_heads and head_size = dim / n_heads.
 * Every header field must agree with the description, and the file size
 * must be exactly what the header implies. RoPE pairs are adjacent.
 */
#include "compiler/weights_impl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum { HDR_DIM, HDR_HIDDEN, HDR_LAYERS, HDR_HEADS, HDR_KV_HEADS, HDR_VOCAB, HDR_SEQ, HDR_N };

/* One run of floats in the file: name (as export.py calls it), per-layer
 * tensor kind (or a global one), and floats per layer (or in total). */
typedef struct {
    const char *name;
    WKind kind;             /* WK_COUNT: skipped (freq_cis) */
    bool per_layer;
    int64_t n;              /* floats per layer, or in all */
} L2cRun;

static bool l2c_header_check(const Weights *w, const WFile *f, const int32_t *h, Diag *d)
{
    static const char *const names[HDR_N] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
                                             "vocab_size", "seq_len"};
    const ModelDesc *m = w->m;
    static const DescSrcField field[HDR_N] = {DSRC_DIM, DSRC_HIDDEN, DSRC_LAYERS, DSRC_HEADS, DSRC_KV_HEADS,
                                              DSRC_VOCAB, DSRC_MAX_SEQ};
    int want[HDR_N] = {m->dim, m->hidden_dim, m->n_layers, m->n_heads, m->n_kv_heads, m->vocab_size, 0};
    bool ok = true;
    for (int i = 0; i < HDR_SEQ; i++) {
        int got = i == HDR_VOCAB && h[i] != INT32_MIN ? abs(h[i]) : h[i];
        if (got != want[i] || (i == HDR_VOCAB && h[i] == INT32_MIN)) {
            diag_file_error(d, f->path, "header: %s is %d, but the model description says %d", names[i], h[i],
                            want[i]);
            desc_note_set(d, m, field[i]);
            ok = false;
        }
    }
    if (!ok)
        return false;
    if (m->head_dim * m->n_heads != m->dim) {
        diag_file_error(d, f->path, "llama2.c checkpoints need head_dim * n_heads == dim (%d * %d != %d)",
                        m->head_dim, m->n_heads, m->dim);
        return false;
    }
    if (h[HDR_SEQ] <= 0 || h[HDR_SEQ] > (1 << 24)) {
        diag_file_error(d, f->path, "header: seq_len %d is out of range", h[HDR_SEQ]);
        return false;
    }
    if ((h[HDR_VOCAB] > 0) != m->tie_embeddings) {
        diag_file_error(d, f->path, "header: the classifier is %s, but the model description says %s",
                        h[HDR_VOCAB] > 0 ? "shared with the embedding" : "separate",
                        m->tie_embeddings ? "tie_embeddings: true" : "tie_embeddings: false");
        return false;
    }
    if (m->max_seq > h[HDR_SEQ]) {
        SrcFile src = {.path = f->path};
        diag_warning(d, &src, 0, 0, "the model's max_seq %d exceeds the checkpoint's seq_len %d", m->max_seq,
                     h[HDR_SEQ]);
    }
    if (m->qkv_bias) {
        diag_file_error(d, f->path, "llama2.c checkpoints have no q/k/v biases, but the model says qkv_bias");
        return false;
    }
    return weights_pairing_check(w, d, f->path, ROPE_ADJACENT);
}

/* Each tensor's name in llama2.c's export (its TransformerWeights fields). */
static const char *const l2c_names[WK_COUNT] = {
    [WK_EMBED] = "token_embedding_table", [WK_ATTN_NORM] = "rms_att_weight", [WK_WQ] = "wq", [WK_WK] = "wk",
    [WK_WV] = "wv", [WK_WO] = "wo", [WK_FFN_NORM] = "rms_ffn_weight", [WK_W_GATE] = "w1", [WK_W_DOWN] = "w2",
    [WK_W_UP] = "w3", [WK_FINAL_NORM] = "rms_final_weight", [WK_LM_HEAD] = "wcls",
};

char *wslot_l2c_name(Arena *a, const WSlot *s)
{
    const char *n = l2c_names[s->kind] ? l2c_names[s->kind] : wkind_canon(s->kind);
    return wkind_is_per_layer(s->kind) ? arena_printf(a, "%s (layer %d)", n, s->layer) : arena_strdup(a, n);
}

static int l2c_runs(const ModelDesc *m, int seq_len, bool shared, L2cRun *r)
{
    int64_t dim = m->dim, kv = (int64_t)m->n_kv_heads * m->head_dim, hid = m->hidden_dim;
    int64_t freq = (int64_t)seq_len * (m->head_dim / 2);
    int n = 0;
    r[n++] = (L2cRun){l2c_names[WK_EMBED], WK_EMBED, false, m->vocab_size * dim};
    r[n++] = (L2cRun){l2c_names[WK_ATTN_NORM], WK_ATTN_NORM, true, dim};
    r[n++] = (L2cRun){l2c_names[WK_WQ], WK_WQ, true, dim * dim};
    r[n++] = (L2cRun){l2c_names[WK_WK], WK_WK, true, kv * dim};
    r[n++] = (L2cRun){l2c_names[WK_WV], WK_WV, true, kv * dim};
    r[n++] = (L2cRun){l2c_names[WK_WO], WK_WO, true, dim * dim};
    r[n++] = (L2cRun){l2c_names[WK_FFN_NORM], WK_FFN_NORM, true, dim};
    r[n++] = (L2cRun){l2c_names[WK_W_GATE], WK_W_GATE, true, hid * dim};
    r[n++] = (L2cRun){l2c_names[WK_W_DOWN], WK_W_DOWN, true, dim * hid};
    r[n++] = (L2cRun){l2c_names[WK_W_UP], WK_W_UP, true, hid * dim};
    r[n++] = (L2cRun){l2c_names[WK_FINAL_NORM], WK_FINAL_NORM, false, dim};
    r[n++] = (L2cRun){"freq_cis_real", WK_COUNT, false, freq};
    r[n++] = (L2cRun){"freq_cis_imag", WK_COUNT, false, freq};
    if (!shared)
        r[n++] = (L2cRun){l2c_names[WK_LM_HEAD], WK_LM_HEAD, false, m->vocab_size * dim};
    return n;
}

/* Copies every run, after checking the file holds exactly all of them
 * (only checks, when w holds dtypes only: lower, validate). */
static bool l2c_copy(Weights *w, const WFile *f, const L2cRun *r, int nrun, Diag *d)
{
    uint64_t off = HDR_N * 4, total = off;
    for (int i = 0; i < nrun; i++)
        total += (uint64_t)r[i].n * (r[i].per_layer ? (uint64_t)w->m->n_layers : 1) * 4;
    if (f->size != total) {
        const char *first = NULL;
        for (int i = 0; i < nrun && !first; i++) {
            off += (uint64_t)r[i].n * (r[i].per_layer ? (uint64_t)w->m->n_layers : 1) * 4;
            if (off > f->size)
                first = r[i].name;
        }
        if (first)
            diag_file_error(d, f->path, "file is truncated: %zu bytes, but the header implies %" PRIu64
                            " (tensor '%s' runs past the end)", f->size, total, first);
        else
            diag_file_error(d, f->path, "file has %zu bytes, but the header implies %" PRIu64
                            " (trailing data)", f->size, total);
        return false;
    }
    if (w->dtypes_only)
        return true;
    const unsigned char *p = f->map + HDR_N * 4;
    for (int i = 0; i < nrun; i++) {
        int reps = r[i].per_layer ? w->m->n_layers : 1;
        for (int l = 0; l < reps; l++, p += r[i].n * 4) {
            int layer = r[i].per_layer ? l : -1;
            if (r[i].kind == WK_COUNT)
                continue;
            convert_to_f32(weights_slot_dst(w, r[i].kind, layer), p, r[i].n, SRC_F32);
            if (!weights_slot_done(w, r[i].kind, layer, NULL, d))
                return false;
        }
    }
    return true;
}

bool load_llama2c(Weights *w, const char *path, Diag *d)
{
    WFile f;
    if (!path) {
        diag_file_error(d, w->m->path ? w->m->path : "megac", "llama2.c weights need a path");
        return false;
    }
    if (!wfile_open(&f, path, d))
        return false;
    bool ok = false;
    int32_t h[HDR_N];
    if (f.size < sizeof h) {
        diag_file_error(d, path, "file is truncated: %zu bytes, but a llama2.c header alone is %zu", f.size,
                        sizeof h);
    } else {
        memcpy(h, f.map, sizeof h);
        w->pairing = ROPE_ADJACENT;
        if (l2c_header_check(w, &f, h, d)) {
            L2cRun runs[16];
            int n = l2c_runs(w->m, h[HDR_SEQ], h[HDR_VOCAB] > 0, runs);
            ok = l2c_copy(w, &f, runs, n, d);
        }
    }
    wfile_close(&f);
    return ok;
}
