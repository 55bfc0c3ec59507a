/*
 * ops.h - every compute op of the schedule IR, declared once.
 *
 * X(NAME, text, operands, params, meaning)
 *   operands: the op's access list, in order, space separated. Every `op`
 *             instruction carries exactly this many accesses; an operand
 *             written `name?` is optional and may be `-` (absent).
 *   params:   the op's integer parameters, in order.
 *
 * Shapes come from the schedule's ModelShape (hd = head_dim, G = n_heads /
 * n_kv_heads, S = max_seq). All activations are f32; weights may be any
 * dtype in dtype.h that the backend supports. `pos` is the decode position
 * of the step. Layouts:
 *   kc, vc (one buffer per layer, class kv): [n_kv_heads][S][hd]
 *   part   (attention partials):             [n_kv_heads][nsplit][G][hd + 2]
 *          each entry: hd unnormalized outputs, then running max m, then sum l
 *   rope   (weight, computed by the compiler): [S][hd/2][2] = cos, sin of
 *          pos * freq_i (llama3 scaling applied); pair i of a head is
 *          (2i, 2i+1) for ROPE_ADJACENT and (i, i + hd/2) for ROPE_HALF
 *   amax   (argmax partials): [nslot][2] = value, index (as f32)
 */
#ifndef MEGAC_OPS_H
#define MEGAC_OPS_H

#include <stdbool.h>

#define OP_LIST(X)                                                                          \
    X(EMBED, "embed", "tok table out", "c0 c1",                                             \
      "out[c0:c1] = table[tok[0]][c0:c1]")                                                  \
    X(RMSNORM, "rmsnorm", "x w out", "n",                                                   \
      "out[0:n] = x[0:n] * w[0:n] / sqrt(mean(x[0:n]^2) + eps)")                            \
    X(GEMV, "gemv", "w x y nw? b?", "r0 r1 k flags",                                        \
      "y[r0:r1] (+)= W[r0:r1, 0:k] . xin + b[r0:r1]; xin = x, or rmsnorm(x)*nw with NORM")  \
    X(ROPE, "rope", "v rope", "h0 h1",                                                      \
      "rotate heads [h0,h1) of v (hd each) in place at position pos")                       \
    X(KV_APPEND, "kv_append", "k v kc vc", "h",                                             \
      "kc[h][pos][:] = k[h*hd:(h+1)*hd]; vc[h][pos][:] = v[h*hd:(h+1)*hd]")                 \
    X(ATTN, "attn", "q kc vc part", "h s nsplit block",                                     \
      "partials over rows t<=pos with (t/block)%nsplit==s for the G q heads of kv head h")   \
    X(ATTN_COMBINE, "attn_combine", "part out", "h nsplit",                                 \
      "out[q heads of kv head h] = softmax-weighted merge of the nsplit partials")          \
    X(SILU_MUL, "silu_mul", "g u out", "r0 r1",                                             \
      "out[r0:r1] = silu(g[r0:r1]) * u[r0:r1]")                                             \
    X(ADD, "add", "a b", "r0 r1",                                                           \
      "a[r0:r1] += b[r0:r1]")                                                               \
    X(ARGMAX, "argmax", "x amax", "r0 r1 slot",                                             \
      "amax[slot] = (max, first index of max) of x[r0:r1]")                                 \
    X(ARGMAX_COMBINE, "argmax_combine", "amax out", "nslot",                                \
      "out[0] = index of the largest of amax[0:nslot] (lowest index on ties)")

typedef enum {
#define X(n, s, o, p, m) OP_##n,
    OP_LIST(X)
#undef X
    OP_COUNT
} OpCode;

/* GEMV flags */
enum {
    GEMV_ACCUM = 1,     /* y[r] += ... (residual), y is read and written */
    GEMV_NORM = 2,      /* input is rmsnorm(x) * nw (computed by the op) */
    GEMV_BIAS = 4,      /* + b[r] */
};

#define OP_MAX_OPERANDS 5
#define OP_MAX_PARAMS 6

typedef struct OpInfo {
    const char *name;
    const char *meaning;
    int noperands;
    const char *operand[OP_MAX_OPERANDS];   /* names without '?' */
    bool optional[OP_MAX_OPERANDS];
    int nparams;
    const char *param[OP_MAX_PARAMS];
} OpInfo;

/* Filled from OP_LIST on first use (ops.c). */
const OpInfo *op_info(int op);
int op_from_name(const char *name);     /* -1 if unknown */

#endif
