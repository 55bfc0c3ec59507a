/*
 * quant.h - weight quantization (issue: quantized GEMV).
 *
 * Formats (byte layouts in ir/dtype.h):
 *   w8a16        DT_W8: int8, one symmetric f32 scale per output row,
 *                s = max|w_row| / 127, q = round(w / s)
 *   w4a16-gG     DT_W4G<G>: 4-bit, group G = 32/64/128 along K, an f16
 *                scale and a 4-bit zero per group (asymmetric, the range
 *                widened to hold 0), q = clamp(round(w / s) + z, 0, 15); a
 *                row whose K is not a multiple of G ends with a shorter
 *                group
 *   w8a8, w4a8-gG  the same weights (DT_W8A8, DT_W4A8G<G>), but the
 *                GEMV also quantizes its input to int8 per block of 32
 *                and sums integers (CPU backend only); the reference,
 *                computing on float inputs, is not exact for them
 *   f16, bf16    rounded to nearest even
 *   none         the source as it is: GGUF blocks (Q8_0, Q4_0, Q4_1, Q5_0,
 *                Q5_1, Q2_K to Q6_K, IQ4_NL, IQ4_XS) are kept
 *                block-exact (never through a float round trip)
 * All are round-to-nearest from the f32 view of the loaded weights, done
 * once at compile time. After quant_apply, each quantized matrix's f32 view
 * holds exactly the dequantized values of its bytes (dequantized in f32 as
 * the kernels do), so the float64 reference decodes the very weights the
 * kernels read; a dequantized copy never reaches a kernel.
 *
 * Sections follow the file that defines each prototype.
 */
#ifndef MEGAC_QUANT_H
#define MEGAC_QUANT_H

#include "compiler/model.h"
#include "ir/ir.h"

/* ---- quant.c: rows ---- */

/* Quantizes one row of k floats into out (dtype_row_bytes(t, k) bytes).
 * t: DT_F32, DT_F16, DT_BF16, DT_W8, DT_W4G32/64/128. */
void quant_row_quantize(DType t, const float *w, int64_t k, unsigned char *out);
/* Dequantizes one row of k elements of any weight dtype into out (f32,
 * the exact arithmetic every backend uses; out does not overlap row). */
void quant_row_dequant(DType t, const unsigned char *row, int64_t k, float *restrict out);
/* Scalar reference GEMV on stored bytes: y[r] = sum_j w[r][j] * x[j] for
 * rows rows of k, dequantized in f32, accumulated in double (for an A8
 * dtype: its weights with x unquantized, the float64 A16 reference). */
void quant_gemv_ref(DType t, const unsigned char *w, int64_t rows, int64_t k, const float *x, double *y);
/* The A8 GEMV as ir/dtype.h defines it (x quantized per block of 32,
 * integer sums per block), block sums scaled in double. */
void quant_gemv_a8_ref(DType t, const unsigned char *w, int64_t rows, int64_t k, const float *x, double *y);

/* ---- quant.c: the CPU kernel's byte order for 4-bit rows ---- */

/* The CPU kernel reads Q4_0, Q4_1, W4G32 and W4A8G32 rows of k elements (k % 32 ==
 * 0) packed: the same bytes per row, moved within the row (layout in
 * codegen/cpu/kernel_table.h). Whoever writes a CPU kernel's weights
 * (bundles, tests) packs every [rows][k] weight for which
 * quant_cpu_packed() says so; unpacking restores the bytes exactly. */
bool quant_cpu_packed(DType t, int64_t k);
void quant_cpu_pack(DType t, int64_t rows, int64_t k, const unsigned char *in, unsigned char *out);
void quant_cpu_unpack(DType t, int64_t rows, int64_t k, const unsigned char *in, unsigned char *out);

/* ---- quant.c: the CUDA kernel's byte order for block rows ---- */

/* The CUDA kernels read Q4_0, Q4_1, Q8_0 and W4G32/64/128 rows with the
 * block headers moved around the blocks' data, so that the data starts on
 * a 16-byte boundary (layout in quant.c; kernel_body.cuh: mk_planar). The
 * same bytes per row, moved within the row, for any k; unordering
 * restores them exactly. */
bool quant_cuda_ordered(DType t);
void quant_cuda_order(DType t, int64_t rows, int64_t k, const unsigned char *in, unsigned char *out);
void quant_cuda_unorder(DType t, int64_t rows, int64_t k, const unsigned char *in, unsigned char *out);

/* Writes [rows][k] stored weights of dtype t into out in the byte order
 * of target's kernel (the CPU's packing, CUDA's order) and returns true,
 * or returns false when that kernel reads them as stored. Whoever writes a
 * kernel's weights (bundles, tests) goes through this. */
bool quant_kernel_order(const char *target, DType t, int64_t rows, int64_t k, const unsigned char *in,
                        unsigned char *out);

/* ---- quant.c: knobs and the pass ---- */

/* The storage dtype a knob asks for, given the source's (DT_F32 or a GGUF
 * block type); -1 for a bad group. */
int quant_spec_dtype(QuantSpec q, DType src);
/* The tensor class of a matrix by canonical name ("L3.wq" -> TCLASS_ATTN);
 * -1 for vectors (norms, biases). */
int quant_tensor_class(const char *canon);
/* Applies the description's quant knobs to every matrix of w: quantizes
 * (or keeps, or drops to f32) and rewrites f32 views to the dequantized
 * values. A tied model whose embed and lm_head classes resolve to
 * different dtypes gets a separate lm_head. False (with an error) for a
 * format that cannot be applied. */
bool quant_apply(Weights *w, Diag *d);
/* Parses a format name as the quant knobs and eval-quant write it:
 * none f32 f16 bf16 w8a16 w4a16[-gG]. False if unknown. */
bool quant_spec_parse(const char *s, QuantSpec *q);
/* "w4a16-g32", "w8a16", ... into buf. */
const char *quant_spec_str(QuantSpec q, char *buf, size_t n);

/* Bits per weight over the matrices of w (embed, projections, a separate
 * lm_head), as stored. */
double quant_bits_per_weight(const Weights *w);
/* Name i of the model's matrices (embed, L<l>.wq ... L<l>.w_down layer by
 * layer, then lm_head where it is a tensor of its own) into name; false
 * past the last. */
bool quant_matrix_name(const Weights *w, int i, char *name, size_t n);

/* ---- quant_eval.c: teacher-forced fidelity ---- */

/* One format's figures against the baseline (the model as loaded, quant
 * none everywhere), over the same token stream. */
typedef struct QuantEval {
    QuantSpec spec;
    double mean_kl;         /* mean over positions of KL(P_base || P_fmt), nats */
    double top1;            /* fraction of positions whose argmax agrees */
    double ppl;             /* perplexity of the stream's next tokens */
    double bpw;             /* bits per matrix weight as stored */
    int first_diff;         /* first position whose argmax differs; -1 none */
} QuantEval;

/* What to evaluate. The stream: BOS (when the tokenizer adds one) +
 * prompt, continued greedily by the baseline up to ntokens positions. Each
 * format applies to the tensor classes in `classes` (bit 1 << TensorClass);
 * the others keep their source (quant none). The baseline always runs on
 * the float64 reference; the formats on `engine`:
 *   "reference"  the float64 reference on the quantized weights (exact
 *                for the A16 formats; refuses w8a8/w4a8, whose int8
 *                inputs it does not model)
 *   "cpu"        a CPU bundle compiled from `model` with `sets` and the
 *                format (driver_compile into a temporary folder), run
 *                through the runtime: the kernel path */
typedef struct QuantEvalRun {
    const char *prompt;
    int ntokens;
    unsigned classes;
    const char *engine;
    const char *model;              /* the description, for engine cpu */
    const DescOverride *sets;
    int nsets;
    bool progress;                  /* a line on stderr as each format starts */
} QuantEvalRun;

/* out has nfmt + 1 entries: out[0] is the baseline (kl 0, top1 1). False
 * with errors in d (or on stderr, from the compile pipeline). */
bool quant_eval(const ModelDesc *m, const QuantEvalRun *r, const QuantSpec *fmts, int nfmt, QuantEval *out,
                Diag *d);

/* ---- lower.c ---- */

/* lower_model with each weight buffer's dtype taken from the loaded (and
 * quantized) weights, so GGUF blocks and quantized matrices are lowered as
 * they are stored. w == NULL: dtypes from the description's knobs alone
 * (a GGUF source with quant none is then lowered as f32). */
Schedule *lower_model_weights(const ModelDesc *m, const Weights *w, const Target *t, int workers, Diag *d);

#endif
