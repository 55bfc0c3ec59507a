/*
 * model.h - the compiler's view of a model: its description (parsed from
 * models/NAME.yaml, see models/README.md), its weights (loaded from llama2.c,
 * safetensors, GGUF or synthesized), and the plain-C reference decode.
 *
 * Conventions every part of megac relies on:
 *  - Matrices are row-major [out][in]: y[i] = sum_j W[i*in + j] * x[j].
 *  - Every weight has an f32 view (except after weights_load_ex with
 *    WEIGHTS_STORED_ONLY, for compiles). A matrix may also be held in another
 *    storage dtype (QTensor: GGUF blocks, Q4_0 to Q6_K and IQ4, kept as they are,
 *    or a format the quant knobs chose, see compiler/quant.h); its f32 view
 *    then holds exactly the dequantized values of those bytes, so the
 *    reference computes on the same quantized weights as the kernels.
 *  - q/k rows are kept in the order of their source; `rope_pairing` says how
 *    that source rotates: ROPE_ADJACENT pairs (2i, 2i+1) within each head
 *    (llama2.c, Meta, GGUF); ROPE_HALF pairs (i, i + head_dim/2) (HF).
 */
#ifndef MEGAC_MODEL_H
#define MEGAC_MODEL_H

#include "ir/dtype.h"
#include "ir/ops.h"
#include "ir/util.h"

typedef enum { ROPE_ADJACENT, ROPE_HALF } RopePairing;
/* ROPE_SCALING_FACTORS: pair i's frequency divided by rope_freq_factors[i]
 * (GGUF's rope_freqs.weight, what llama.cpp stores for Llama-3.x). */
/* ROPE_SCALING_LONGROPE (Phi-3 128k, Phi-3.5): pair i's frequency divided
 * by rope_freq_factors[i] (the short factors) where max_seq is at most
 * rope_orig_max_pos, else by rope_long_factors[i], chosen once for every
 * position as llama.cpp chooses them by its context size; every cos and
 * sin multiplied by rope_attn_factor (rope_attn_scale). */
typedef enum { ROPE_SCALING_NONE, ROPE_SCALING_LLAMA3, ROPE_SCALING_FACTORS, ROPE_SCALING_LONGROPE } RopeScaling;
#define MODEL_MAX_ROPE_PAIRS 256    /* head_dim / 2 with ROPE_SCALING_FACTORS */

typedef enum {
    WFMT_LLAMA2C,       /* llama2.c .bin, v0 layout */
    WFMT_SAFETENSORS,   /* a .safetensors file, or a dir / index.json for shards */
    WFMT_GGUF,          /* GGUF v3 */
    WFMT_SYNTHETIC,     /* seeded weights at the model's shapes */
} WeightFormat;

typedef enum {
    TOKFMT_NONE,
    TOKFMT_LLAMA2C,     /* tokenizer.bin */
    TOKFMT_HF,          /* tokenizer.json */
    TOKFMT_GGUF,        /* the vocabulary inside the weights' GGUF file */
    TOKFMT_BYTES,       /* built in: ids 0-2 = <unk> <s> </s>, id 3+b = byte b */
} TokFormat;

/* Tensor classes, for per-class quantization knobs. */
#define TCLASS_LIST(X) \
    X(EMBED, "embed")  \
    X(ATTN, "attn")    \
    X(MLP, "mlp")      \
    X(LM_HEAD, "lm_head")
typedef enum {
#define X(n, s) TCLASS_##n,
    TCLASS_LIST(X)
#undef X
    TCLASS_COUNT
} TensorClass;

/* Quantization formats a knob can name (compiler/quant.h): none keeps the
 * source (f16/bf16 matrices stay f16/bf16, GGUF blocks stay blocks),
 * f32/f16/bf16 store floats, w8a16 and
 * w4a16 the row-blocked W8 and W4G* of ir/dtype.h, w8a8/w4a8 their
 * int8-input forms; a8 keeps the source and gives it its int8-input form
 * where it has one (quant_spec_dtype). */
typedef enum {
    QUANT_NONE, QUANT_F32, QUANT_F16, QUANT_BF16, QUANT_W8A16, QUANT_W4A16, QUANT_W8A8, QUANT_W4A8, QUANT_A8
} QuantKind;
typedef struct {
    QuantKind kind;
    int group;              /* W4: 32, 64 or 128 */
} QuantSpec;

/* ATTN_KASCADE: an anchor layer (Kascade, arXiv 2512.16391) picks `budget`
 * rows per kv head by its exact attention, or `fraction` of the rows when
 * that is more (0: a fixed budget), and attends over them (layer 0: over
 * all); ATTN_KASCADE_REUSE attends over the rows its `anchor` layer
 * picked at the same step (ir/ops.h, TOPK_SELECT): kv head h over those
 * of the anchor's kv head heads[h] (the paper's head mapping; the same
 * index unless the description maps them). */
typedef enum { ATTN_DENSE, ATTN_SINK_WINDOW, ATTN_QUEST, ATTN_KASCADE, ATTN_KASCADE_REUSE } AttnKind;
typedef enum { KV_FULL, KV_STREAMING, KV_H2O, KV_TOVA, KV_SNAPKV } KvPolicyKind;
#define ATTN_MAX_HEAD_MAP 64    /* kv heads a kascade_reuse layer's `heads` map can name */
typedef struct {
    AttnKind kind;
    int sinks, window, page, budget;    /* meaning depends on kind */
    int anchor;                         /* kascade_reuse: the anchor layer */
    double fraction;                    /* kascade: 0, or the share of the rows picked past budget (0, 1] */
    bool head_map;                      /* kascade_reuse: heads[] maps kv heads (false: identity, heads[] 0) */
    uint8_t heads[ATTN_MAX_HEAD_MAP];   /* the anchor's kv head each kv head reads the rows of */
} AttnSpec;

/* A kascade layer's fraction in millionths (TOPK_SELECT's ppm). */
static inline int attn_topk_ppm(const AttnSpec *a)
{
    return (int)(a->fraction * 1e6 + 0.5);
}

/* The anchor kv head whose rows kv head h of a kascade_reuse layer reads. */
static inline int attn_list_head(const AttnSpec *a, int h)
{
    return a->head_map && h < ATTN_MAX_HEAD_MAP ? a->heads[h] : h;
}
typedef struct {
    KvPolicyKind kind;
    int budget, sinks, window;
    bool adaptive;              /* snapkv: Ada-KV's budget pooled over the layer's kv heads */
    double alpha;               /* its safeguard: each head is sure of alpha (budget - window) rows */
} KvPolicy;

/* The scored rows each kv head of a SnapKV layer is sure of (ir/ops.h,
 * KV_SNAP's safe): its budget when flat, else floor(alpha (budget - window)). */
static inline int kv_snap_safe(const KvPolicy *kv)
{
    return kv->adaptive ? (int)(kv->alpha * (kv->budget - kv->window)) : kv->budget;
}

#define MODEL_MAX_LAYERS 256
#define MODEL_MAX_WORKERS 4096    /* compile.workers, --workers: 1..this */
#define MODEL_MAX_STOPS 8         /* eos: [e, s1, ...]: ids after the first */

/* compile.attn_combine: where the partials of attention split over
 * workers are merged (compiler/lower.c). */
typedef enum {
    COMBINE_AUTO,               /* "auto": stage (in_o timed slower: lower.c) */
    COMBINE_IN_O,               /* "in_o": by each worker of the o projection, for its own rows */
    COMBINE_STAGE               /* "stage": one worker per kv head, which o then waits for */
} AttnCombine;

/* The fields a weight file's header is compared with, in desc.c's order,
 * and where the description set each (desc_note_set). */
typedef enum {
    DSRC_DIM, DSRC_HIDDEN, DSRC_LAYERS, DSRC_HEADS, DSRC_KV_HEADS, DSRC_HEAD_DIM, DSRC_VOCAB, DSRC_MAX_SEQ,
    DSRC_EPS, DSRC_THETA, DSRC_COUNT
} DescSrcField;
typedef struct {
    const char *path;           /* the description, its config.json, "<command line>"; NULL: no line to
                                 * point at (a default, a derived value, a GGUF file's own description) */
    int line, col;
} DescSrc;

typedef struct ModelDesc {
    const char *name;
    const char *path;           /* the YAML file it came from ("<embedded>" for the default) */
    const char *dir;            /* its folder: relative paths resolve against it */
    const char *arch_path;      /* the file arch came from (from-config, from-gguf,
                                 * from-checkpoint), resolved; NULL for explicit dims */
    const char *gen_config_path;/* generation_config.json read beside a config.json, or NULL */
    DescSrc src_at[DSRC_COUNT]; /* where each was set */

    /* architecture */
    int dim;                    /* hidden size */
    int hidden_dim;             /* intermediate (FFN) size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;               /* usually dim / n_heads */
    int vocab_size;
    int max_seq;                /* max context = KV cache rows */
    double norm_eps;
    bool tie_embeddings;        /* lm_head shares the token embedding */
    bool qkv_bias;              /* q/k/v projections carry a bias (Qwen2) */
    int sliding_window;         /* each position attends only the last this many (itself included): Mistral's
                                 * sliding window; 0: all. Where it is below max_seq, every layer's attention
                                 * is sink_window {sinks 0, window it}, or dense over a streaming cache of
                                 * the same numbers (desc.c) */

    /* RoPE */
    double rope_theta;
    RopePairing rope_pairing;
    RopeScaling rope_scaling;
    double rope_factor;         /* llama3: 8 or 32 */
    double rope_low_freq_factor;    /* llama3: 1 */
    double rope_high_freq_factor;   /* llama3: 4 */
    int rope_orig_max_pos;      /* llama3: 8192 */
    double rope_freq_factors[MODEL_MAX_ROPE_PAIRS]; /* ROPE_SCALING_FACTORS: head_dim/2 divisors (LONGROPE: short) */
    double rope_long_factors[MODEL_MAX_ROPE_PAIRS]; /* ROPE_SCALING_LONGROPE: the long factors */
    double rope_attn_factor;    /* ROPE_SCALING_LONGROPE: every cos and sin times this */

    /* where the weights and tokenizer come from */
    WeightFormat weights_format;
    const char *weights_path;   /* resolved against dir; NULL for synthetic */
    uint64_t weights_seed;      /* synthetic */
    TokFormat tok_format;
    const char *tok_path;       /* resolved; for TOKFMT_GGUF the weights file */
    int bos_id, eos_id;         /* -1 when unknown (taken from the tokenizer) */
    int stop_ids[MODEL_MAX_STOPS];  /* more ids that end generation (an eos list's rest) */
    int n_stop;

    /* compile knobs */
    DType act_dtype;            /* activation dtype: f32 only so far */
    DType kv_dtype;             /* KV cache elements: f16 (desc's default), f32 or bf16 */
    QuantSpec quant[TCLASS_COUNT];
    AttnSpec attn[MODEL_MAX_LAYERS];
    KvPolicy kv[MODEL_MAX_LAYERS];
    const char *targets[8];     /* e.g. "cpu", "sm_90"; NULL-terminated */
    int workers;                /* 0 = the target's default; at most MODEL_MAX_WORKERS */
    AttnCombine attn_combine;   /* where split attention's partials are merged */
} ModelDesc;

/* What RoPE multiplies every cos and sin by: LongRoPE's attention factor,
 * else 1 (a q.k product then grows by its square, as transformers'
 * attention_scaling makes it). */
static inline double rope_attn_scale(const ModelDesc *m)
{
    return m->rope_scaling == ROPE_SCALING_LONGROPE && m->rope_attn_factor > 0 ? m->rope_attn_factor : 1.0;
}

/* Kascade anchor layer l's budget (at most max_seq), and its list's
 * length: the most rows it picks per kv head, at max_seq rows (ir/ops.h,
 * topk_rows). */
static inline int kascade_budget(const ModelDesc *m, int l)
{
    return m->attn[l].budget < m->max_seq ? m->attn[l].budget : m->max_seq;
}

static inline int kascade_list_len(const ModelDesc *m, int l)
{
    return (int)topk_rows(m->max_seq, kascade_budget(m, l), attn_topk_ppm(&m->attn[l]), m->max_seq);
}

/* ---- desc.c: model descriptions ---- */

/* A `--set key=value` override, applied after the file is read. */
typedef struct {
    const char *key;            /* dotted path, e.g. "quant.default" */
    const char *value;          /* YAML scalar or flow text */
} DescOverride;

/* Parses a model description. Errors go to d as file:line:col; returns
 * false on any error (then *m is unspecified). `path` is a YAML
 * description, a GGUF file, or an HF checkpoint folder (config.json, its
 * safetensors and tokenizer.json): for the last two megac writes the
 * description itself (arch: {from-gguf: ...} / {from-config: ...}). */
bool desc_load(ModelDesc *m, Arena *a, const char *path, const DescOverride *ov, int nov, Diag *d);
/* The end of every message that refuses a path as a model. */
#define DESC_WHAT_A_MODEL_IS                                                                                       \
    "a model is a description (.yaml), a GGUF file, an HF checkpoint folder (config.json and safetensors), or a " \
    "llama2.c checkpoint (.bin)"

bool desc_parse(ModelDesc *m, Arena *a, const char *path, const char *text, size_t len,
                const DescOverride *ov, int nov, Diag *d);
/* The text desc_load parses for `path` (malloc'd; NULL with errno set when
 * it cannot be read). */
char *desc_read_text(const char *path, size_t *len);
/* The default model embedded in the binary (no files needed). */
extern const char desc_default_yaml[];
extern const char desc_default_name[];
/* Checks dims for consistency (heads divide, etc.). */
bool desc_check(const ModelDesc *m, Diag *d);
/* A note at the line of the description (or config.json, or --set) that
 * set field f, after an error about a file that disagrees with it; nothing
 * where no line set it. */
void desc_note_set(Diag *d, const ModelDesc *m, DescSrcField f);
void desc_print(const ModelDesc *m, FILE *out);

/* ---- weights ---- */

/* One decoder layer's tensors. Shapes are (rows, cols) = (out, in). */
typedef struct {
    float *attn_norm;   /* (dim) */
    float *wq;          /* (n_heads*head_dim, dim) */
    float *wk;          /* (n_kv_heads*head_dim, dim) */
    float *wv;          /* (n_kv_heads*head_dim, dim) */
    float *bq, *bk, *bv;/* (rows) or NULL without qkv_bias */
    float *wo;          /* (dim, n_heads*head_dim) */
    float *ffn_norm;    /* (dim) */
    float *w_gate;      /* (hidden_dim, dim)   "w1" */
    float *w_up;        /* (hidden_dim, dim)   "w3" */
    float *w_down;      /* (dim, hidden_dim)   "w2" */
} LayerWeights;

/* A matrix held in a storage dtype other than f32 (layouts in ir/dtype.h):
 * data is rows records of dtype_row_bytes(dtype, cols) bytes. */
typedef struct QTensor {
    const char *name;       /* canonical: "embed", "L0.wq", "lm_head" */
    DType dtype;
    int64_t rows, cols;
    unsigned char *data;    /* (rows, dtype_row_bytes(dtype, cols)) in Weights.arena */
    size_t nbytes;
} QTensor;

typedef struct Weights {
    const ModelDesc *m;
    float *tok_embed;   /* (vocab, dim) */
    LayerWeights *layers;   /* (n_layers) */
    float *final_norm;  /* (dim) */
    float *lm_head;     /* (vocab, dim); == tok_embed when tied */
    RopePairing pairing;    /* convention of wq/wk rows as loaded */
    Arena arena;        /* owns every tensor above */
    size_t nbytes;      /* f32 bytes of every view allocated (held, or unmapped once stored) */
    QTensor *qt;        /* (nqt) matrices held in another dtype; in arena */
    int nqt, capqt;
    bool head_own;      /* lm_head is a tensor of its own (weights_head_separate) */
    bool stored_only;   /* WEIGHTS_STORED_ONLY (or _DTYPES_ONLY): see weights_load_ex */
    bool dtypes_only;   /* WEIGHTS_DTYPES_ONLY: see weights_load_ex */
    bool embed_unwritten;   /* the embedding kept from its file's bytes, its f32 view never written */
    struct WView *views;    /* (nviews) f32 views of matrices mapped apart from the arena */
    int nviews;
    int nslots, slots_done;     /* tensors to load, loaded so far */
    size_t loaded_bytes;        /* f32 bytes of the tensors loaded so far (converted to f32) */
    int stored_kept;            /* matrices stored from their file's bytes alone, no f32 made */
    const struct WeightsProgress *progress;
} Weights;

/* Loads (or synthesizes) the weights the description names, checking every
 * shape against it, then applies its quant knobs (quant_apply). Errors
 * name the file and the tensor. */
bool weights_load(Weights *w, const ModelDesc *m, Diag *d);
/* weights_load with flags. WEIGHTS_STORED_ONLY (what a compile needs): a
 * matrix that ends up stored in another dtype (a QTensor) has no f32 view
 * afterwards (its pointer and weights_tensor are NULL); each layer's
 * matrices are quantized as soon as they are loaded and their f32 views
 * unmapped, so memory holds the stored model plus about one f32 matrix
 * (the embedding and classifier stay until the end, unless they too are
 * stored as the file stores them) instead of the whole model in f32. The
 * stored bytes are the same as weights_load's. */
enum { WEIGHTS_STORED_ONLY = 1, WEIGHTS_DTYPES_ONLY = 2 };
/* WEIGHTS_DTYPES_ONLY (what lowering needs, for `megac lower` and
 * `megac validate`): only the dtype every matrix ends up in, exactly as a
 * compile's load would leave it, from the files' headers: no tensor's
 * bytes are read, every QTensor's data is NULL and no f32 view is written.
 * The checks that need the values (non-finite elements, a tied model's
 * separate classifier equal to its embedding) are not made; the file's
 * names, shapes and dtypes are checked as usual. A llama2.c checkpoint
 * (all f32) is not opened. */
/* Called after each tensor is loaded (and stored), with the counts so far. */
typedef struct WeightsProgress {
    void (*fn)(void *ctx, int done, int total, size_t f32_bytes);
    void *ctx;
} WeightsProgress;
bool weights_load_ex(Weights *w, const ModelDesc *m, unsigned flags, const WeightsProgress *p, Diag *d);
/* Bytes the weights hold now: f32 views still mapped plus stored tensors. */
size_t weights_held_bytes(const Weights *w);
/* The bytes the weights take once stored as a compile stores them
 * (WEIGHTS_STORED_ONLY): each matrix in the dtype of its QTensor, else in
 * f32, and the vectors in f32; the same under WEIGHTS_DTYPES_ONLY, which
 * records the dtypes alone, so a compile can tell before it loads
 * anything. *nf32: how many matrices stay in f32. */
size_t weights_stored_bytes(const Weights *w, int *nf32);
void weights_free(Weights *w);
/* A tensor by its schedule buffer name: "embed", "final_norm", "lm_head",
 * "L<l>.attn_norm", "L<l>.wq", "L<l>.wk", "L<l>.wv", "L<l>.bq", "L<l>.bk",
 * "L<l>.bv", "L<l>.wo", "L<l>.ffn_norm", "L<l>.w_gate", "L<l>.w_up",
 * "L<l>.w_down". NULL if absent (bias without qkv_bias, unknown name). */
const float *weights_tensor(const Weights *w, const char *name, int64_t *nelem);
/* The storage of a matrix by the same name when it is not plain f32, else
 * NULL. "lm_head" of a tied model whose classifier was not split off by
 * quantization is the embedding's. */
const QTensor *weights_qtensor(const Weights *w, const char *name);
/* The storage dtype of a tensor: the QTensor's, else DT_F32. */
DType weights_dtype(const Weights *w, const char *name);
/* True when lm_head is a tensor of its own (untied, or a tied model whose
 * classifier and embedding were quantized to different dtypes). */
bool weights_head_separate(const Weights *w);

/* ---- load_gguf.c ---- */
/* A GGUF's general.architecture, one of the Llama-family ones megac runs
 * ("llama", "qwen2"; a file without the key is "llama"), copied into arch,
 * and the RoPE pairing of its q/k rows; false (error reported) otherwise. */
struct GgufFile;
bool gguf_model_arch(const struct GgufFile *g, char *arch, size_t n, RopePairing *pairing, Diag *d);
/* The tensor rope_freqs.weight (llama.cpp's per-pair divisors of theta^(-2i/
 * head_dim), what its converter writes for Llama-3.x's llama3 scaling) into
 * out[half]: 0 when the file has none, 1 when read, -1 (error reported) when
 * it is not `half` positive f32 values. */
int gguf_rope_factors(const struct GgufFile *g, int half, double *out, Diag *d);
/* The same for any such tensor by name (phi3's rope_factors_long.weight
 * and rope_factors_short.weight: LongRoPE's factors). */
int gguf_factor_tensor(const struct GgufFile *g, const char *name, int half, double *out, Diag *d);

/* ---- rope.c ---- */
/* Per-pair inverse frequencies (head_dim/2 values), llama3 scaling applied. */
void rope_freqs(const ModelDesc *m, double *freq);
/* The "rope" weight buffer: [max_seq][head_dim/2][2] = cos, sin of pos*freq. */
void rope_table_fill(const ModelDesc *m, float *out);

/* ---- reference.c: the oracle ---- */

/* Plain-C batch-1 decode with a KV cache: one function per op, float64
 * accumulation. Every backend is tested against it. */
typedef struct RefState RefState;
RefState *ref_new(const Weights *w);
void ref_free(RefState *s);
void ref_reset(RefState *s);
/* The position of the prompt's last token (-1: none; ref_reset clears it):
 * SnapKV layers compress after that step (megac_set_prompt_end). */
void ref_set_prompt_end(RefState *s, int pos);
/* Feeds `token` at position `pos` (0-based; must equal the number of tokens
 * fed since the last reset) and returns the logits (vocab floats, owned by
 * s, valid until the next call). */
const float *ref_step(RefState *s, int token, int pos);
/* The same step without the logits (the classifier is not run): a prompt
 * token before the last, as megac_feed runs it. */
void ref_feed(RefState *s, int token, int pos);
/* A context shift, as megac_shift: positions [keep, keep + n) leave the
 * cache, the later rows move down by n, their keys turned back by n
 * positions of RoPE (in float64) and stored again in the cache's type;
 * the next position is then n fewer. false (nothing done) for a bad range,
 * or where a layer's cache evicts or keeps Quest pages. */
bool ref_shift(RefState *s, int keep, int n);
/* Whether ref_shift can shift m's cache: every layer's rows are positions
 * (no evicting kv_policy, SnapKV or Quest). */
bool ref_can_shift(const ModelDesc *m);
/* How many of the rows 0..pos kv head h of layer l still holds after the
 * step at pos, the last one fed (pos + 1 on a layer that drops none):
 * how eviction divided the cache, for tests. */
int ref_kv_rows(RefState *s, int l, int h, int pos);
/* fn(ctx, l, h, pos, rows, n, p, G, stride) after the attention of kv head
 * h of layer l at pos, every layer's (dense ones too): the q heads' softmax
 * weights over rows[0:n] (ascending), q head h*G + g's at p + g * stride. */
typedef void (*RefAttnHook)(void *ctx, int l, int h, int pos, const int *rows, int n, const double *p, int G,
                            size_t stride);
void ref_set_attn_hook(RefState *s, RefAttnHook fn, void *ctx);

#endif
