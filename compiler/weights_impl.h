/*
 * weights_impl.h - what the weight loaders share (private to compiler/):
 * the list of tensors a model needs ("slots", each with its canonical,
 * HF and GGUF name and its expected shape), a read-only file mapping, and
 * the f16/bf16 -> f32 conversion. weights.c allocates every slot's f32
 * buffer in Weights.arena before a loader runs; a loader only fills them.
 *
 * Sections follow the file that defines each prototype.
 */
#ifndef MEGAC_WEIGHTS_IMPL_H
#define MEGAC_WEIGHTS_IMPL_H

#include "compiler/model.h"

/* Tensor kinds: enum name, canonical name (weights_tensor), HF suffix,
 * GGUF suffix. Per-layer kinds get "L<l>.", "model.layers.<l>." and
 * "blk.<l>." prefixes; the global ones are full names. */
#define WKIND_LIST(X)                                                              \
    X(EMBED, "embed", "model.embed_tokens.weight", "token_embd.weight")            \
    X(ATTN_NORM, "attn_norm", "input_layernorm.weight", "attn_norm.weight")        \
    X(WQ, "wq", "self_attn.q_proj.weight", "attn_q.weight")                        \
    X(WK, "wk", "self_attn.k_proj.weight", "attn_k.weight")                        \
    X(WV, "wv", "self_attn.v_proj.weight", "attn_v.weight")                        \
    X(BQ, "bq", "self_attn.q_proj.bias", "attn_q.bias")                            \
    X(BK, "bk", "self_attn.k_proj.bias", "attn_k.bias")                            \
    X(BV, "bv", "self_attn.v_proj.bias", "attn_v.bias")                            \
    X(WO, "wo", "self_attn.o_proj.weight", "attn_output.weight")                   \
    X(FFN_NORM, "ffn_norm", "post_attention_layernorm.weight", "ffn_norm.weight")  \
    X(W_GATE, "w_gate", "mlp.gate_proj.weight", "ffn_gate.weight")                 \
    X(W_UP, "w_up", "mlp.up_proj.weight", "ffn_up.weight")                         \
    X(W_DOWN, "w_down", "mlp.down_proj.weight", "ffn_down.weight")                 \
    X(FINAL_NORM, "final_norm", "model.norm.weight", "output_norm.weight")         \
    X(LM_HEAD, "lm_head", "lm_head.weight", "output.weight")

typedef enum {
#define X(e, c, h, g) WK_##e,
    WKIND_LIST(X)
#undef X
    WK_COUNT
} WKind;

/* One tensor the model needs. cols == 0 marks a vector of `rows` floats.
 * A slot read out of a fused tensor (Phi-3's qkv_proj, gate_up_proj: a
 * WFused) is its rows [row0, row0 + rows) of fused_rows (0: not fused). */
typedef struct WSlot {
    WKind kind;
    int layer;              /* -1 for global tensors */
    int64_t rows, cols;
    float *dst;             /* rows * max(cols, 1) floats in Weights.arena */
    int64_t row0, fused_rows;
} WSlot;

/* A layer's tensor that holds several matrices' rows one after another
 * (q, k and v; gate and up), read where the layer lacks the first one's
 * own tensor. name: what follows "<prefix><layer>."; kinds: in row order,
 * WK_COUNT-terminated. */
typedef struct WFused {
    const char *name;
    WKind kinds[4];
} WFused;

/* Element types a source tensor can have. */
typedef enum { SRC_F32, SRC_F16, SRC_BF16 } SrcType;

/* A whole file mapped read-only. size may be 0 (then map is NULL). */
typedef struct WFile {
    const char *path;
    const unsigned char *map;
    size_t size;
} WFile;

/* ---- weights.c ---- */
bool wfile_open(WFile *f, const char *path, Diag *d);
void wfile_close(WFile *f);
/* The slots of w (buffers allocated by weights_load), listed in arena a in
 * a fixed order: embed, then per layer attn_norm wq wk wv [bq bk bv] wo
 * ffn_norm w_gate w_up w_down, then final_norm, then lm_head unless tied. */
const WSlot *weights_slots(const Weights *w, Arena *a, int *n);
bool wkind_is_per_layer(WKind k);
const char *wkind_canon(WKind k);
/* "L3.wq", "model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight"
 * (arena-allocated). */
char *wslot_canon_name(Arena *a, const WSlot *s);
char *wslot_hf_name(Arena *a, const WSlot *s);
char *wslot_gguf_name(Arena *a, const WSlot *s);
/* llama2.c's name: "w1 (layer 3)", "token_embedding_table" (load_llama2c.c). */
char *wslot_l2c_name(Arena *a, const WSlot *s);
int64_t wslot_nelem(const WSlot *s);
/* The buffer of tensor k in layer `layer` (-1 for global ones); NULL when
 * the model has no such tensor. */
float *weights_slot_dst(Weights *w, WKind k, int layer);
/* Formats a shape as "[a, b]" into buf. */
const char *shape_str(char *buf, size_t n, int ndim, const int64_t *shape);
/* Checks a source tensor's shape (outermost first) against the slot;
 * reports "tensor 'name': shape [..] does not match the model (expected
 * [..])" on a mismatch. */
bool wslot_shape_check(const ModelDesc *m, const WSlot *s, Diag *d, const char *path, const char *name, int ndim,
                       const int64_t *shape);
/* Converts n little-endian elements at src (any alignment) to f32. */
void convert_to_f32(float *dst, const void *src, int64_t n, SrcType t);
/* Holds matrix `name` (canonical) in dtype t: returns its QTensor with
 * nbytes of zeroed storage in w->arena (none, data NULL, under
 * WEIGHTS_DTYPES_ONLY), replacing any earlier one. */
QTensor *weights_qtensor_put(Weights *w, const char *name, DType t, int64_t rows, int64_t cols);
/* A loader's matrix as its file stores it: slot s (filled into dst, its
 * f32 view) keeps the file's bytes of dtype dt (GGUF blocks, f16, bf16)
 * as a QTensor, so that quant none stores them as they are. Nothing for
 * f32, vectors, or a fetch into scratch (dst is not the slot's). */
void weights_keep_stored(Weights *w, const WSlot *s, const float *dst, DType dt, const void *bytes);
/* A fetch's first step: under WEIGHTS_STORED_ONLY, a matrix (a layer's,
 * the embedding, the classifier) that its knob stores from the file's
 * bytes alone (quant_stored_suffices) is
 * kept (weights_keep_stored) without writing its f32 view, after a
 * non-finite check of those bytes (the same error as the f32 scan's,
 * against file, with the file's tensor name): WFETCH_STORED, or -1 after
 * that error. 0: convert it into dst as usual (then weights_keep_stored).
 * Under WEIGHTS_DTYPES_ONLY every slot is done here, its bytes unread:
 * the file's dtype recorded as weights_keep_stored would, WFETCH_DTYPE. */
int weights_fetch_stored(Weights *w, const WSlot *s, const float *dst, DType dt, const void *bytes,
                         const char *file, const char *name, Diag *d);
/* The embedding's f32 values (vocab x dim) into out: its view, or its
 * stored bytes dequantized when it was kept from them (embed_unwritten). */
void weights_embed_f32(const Weights *w, float *out);
/* Forgets the non-f32 storage of `name` (its f32 view stays). */
void weights_qtensor_drop(Weights *w, const char *name);
/* An f32 buffer of n floats for a matrix, mapped on its own (NULL when it
 * cannot be mapped). */
float *weights_view_new(Weights *w, int64_t n);
/* Every loader calls this after filling a slot from `file` (named in the
 * error for a non-finite value; NULL: the description's weights path).
 * Under WEIGHTS_STORED_ONLY a layer's matrix is stored at once
 * (quant_slot) and, when that leaves it in another dtype, its f32 view is
 * unmapped. False after an error. */
bool weights_slot_done(Weights *w, WKind k, int layer, const char *file, Diag *d);
/* weights_slot_done of a slot whose f32 view was not written (stored:
 * fetch returned WFETCH_STORED): no f32 scan. */
bool weights_slot_done_ex(Weights *w, WKind k, int layer, const char *file, bool stored, Diag *d);
/* Errors when the source's RoPE pairing differs from the description's. */
bool weights_pairing_check(const Weights *w, Diag *d, const char *path, RopePairing src);

/* A source of named tensors (safetensors, GGUF) for weights_fill. fetch
 * converts tensor `name` into dst after checking its shape against the
 * slot: it returns 1 when done, 0 when the source has no such tensor, -1
 * after reporting an error, or WFETCH_STORED when it kept the tensor's
 * bytes and checked them finite without writing dst, or WFETCH_DTYPE when
 * it only recorded the tensor's dtype (both from weights_fetch_stored). */
enum { WFETCH_STORED = 2, WFETCH_DTYPE = 3 };
typedef struct WSource {
    void *ctx;
    const char *path;                               /* named in "missing" errors */
    char *(*name)(Arena *a, const WSlot *s);         /* wslot_hf_name, wslot_gguf_name */
    int (*fetch)(void *ctx, const char *name, const WSlot *s, float *dst, Diag *d);
    bool (*has)(void *ctx, const char *name);
    const char *(*file)(void *ctx, const char *name); /* the file a fetched tensor came from; NULL: path */
    /* Every tensor name the file lists, for the check of names no slot
     * takes: the i-th (not NUL-terminated; its length in *len), NULL past
     * the last. */
    const char *(*tensor)(void *ctx, int64_t i, size_t *len);
    const char *layer_prefix;                       /* "model.layers.", "blk.": a name so begun is a layer's */
    /* Names the loader reads itself or passes over on purpose (a layer's
     * as what follows "<prefix><l>.", others whole), and suffixes that
     * stand for a matrix's ".weight" (AWQ's ".qweight", ...); both
     * NULL-terminated, or NULL. */
    const char *const *known;
    const char *const *weight_parts;
    const WFused *fused;    /* terminated by a NULL name, or NULL */
} WSource;

/* The slot's shape as its tensor in the file has it: the fused tensor's
 * rows where it is read out of one. */
static inline WSlot wslot_file_shape(const WSlot *s)
{
    WSlot f = *s;
    if (s->fused_rows)
        f.rows = s->fused_rows;
    return f;
}
/* Fills every slot of w from src, reporting each missing or bad tensor;
 * also refuses tensors the description says the model lacks (q/k/v biases
 * without qkv_bias, a separate lm_head that differs from the embedding
 * when tied) and tensor names that are empty or name a layer the model
 * does not have (at or past n_layers, negative, not a number), and warns
 * once of names it does not know at all (the first and their count). */
bool weights_fill(Weights *w, const WSource *src, Diag *d);

/* ---- quant.c (beyond compiler/quant.h) ---- */
/* Applies the quant knob of slot s's class to it (nothing for vectors, or
 * for a matrix whose view was already released). False after an error. */
bool quant_slot(Weights *w, const WSlot *s, Diag *d);
/* Whether matrix `canon`, stored by its file in dtype src (f16, bf16, a
 * GGUF block dtype), ends up in a dtype quant_slot makes from those bytes
 * alone (src itself, or a dtype with src's layout), so that its f32 view
 * is never read under WEIGHTS_STORED_ONLY. */
bool quant_stored_suffices(const Weights *w, const char *canon, DType src);
/* The first non-finite element of a tensor of rows x cols in dtype t (f16,
 * bf16, a GGUF block dtype, or W4G<G> from an AWQ or GPTQ checkpoint) at
 * data, or -1, read from the stored bytes:
 * for blocks, the first element of the first block whose f16 scales are
 * not finite (a block dequantizes to finite values exactly when its scales
 * are, and its first element is then not), so where an f32 scan stops. */
int64_t quant_stored_first_non_finite(DType t, const unsigned char *data, int64_t rows, int64_t cols);

/* ---- gguf.c (beyond compiler/gguf.h) ---- */
typedef struct GgufTensor GgufTensor;
typedef struct GgufFile GgufFile;
/* A tensor by name of n bytes (not NUL-terminated). */
const GgufTensor *gguf_find_tensor_n(const GgufFile *g, const char *name, size_t n);
/* "Q4_0", "F16", ...; "unknown" for types this reader has no size for. */
const char *gguf_type_name(uint32_t ggml_type);

/* ---- load_llama2c.c, load_safetensors.c, load_gguf.c, synthetic.c ---- */
bool load_llama2c(Weights *w, const char *path, Diag *d);
bool load_safetensors(Weights *w, const char *path, Diag *d);
bool load_gguf(Weights *w, const char *path, Diag *d);
bool synthetic_fill(Weights *w, Diag *d);
/* The synthetic value generator, exposed for tests: element i of the
 * tensor named `canon` (e.g. "L0.wq") before scaling, in [-1, 1). */
float synthetic_uniform(uint64_t seed, const char *canon, int64_t i);

#endif
