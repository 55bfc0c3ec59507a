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
    X(ATTN, "attn", "q kc vc part rope?", "h s nsplit block rope",                          \
      "partials over split s of rows 0..pos (blocks of `block` rows, cut contiguously)")    \
    X(ATTN_COMBINE, "attn_combine", "part out", "h nsplit nh",                              \
      "out[q heads of kv heads h..h+nh) = softmax-weighted merge of each one's nsplit "     \
      "partials")                                                                           \
    X(SILU_MUL, "silu_mul", "g u out", "r0 r1",                                             \
      "out[r0:r1] = silu(g[r0:r1]) * u[r0:r1]")                                             \
    X(ADD, "add", "a b", "r0 r1",                                                           \
      "a[r0:r1] += b[r0:r1]")                                                               \
    X(ARGMAX, "argmax", "x amax", "r0 r1 slot",                                             \
      "amax[slot] = (max, first index of max) of x[r0:r1]")                                 \
    X(ARGMAX_COMBINE, "argmax_combine", "amax out", "nslot",                                \
      "out[0] = index of the largest of amax[0:nslot] (lowest index on ties)")              \
    X(KV_STORE, "kv_store", "k v kc vc meta", "h cap",                                      \
      "slot = meta[h][cap] (0 at pos 0, which also empties meta); kc/vc[h][slot] = k/v "    \
      "of head h; meta[h][slot] = pos")                                                     \
    X(ATTN_SPARSE, "attn_sparse", "q kc vc part aux?", "h s nsplit kind a b",               \
      "attn partials of split s over the rows `kind` selects (sink_window, quest, slots, snap, rows)")  \
    X(QUEST_SELECT, "quest_select", "q kc bounds sel", "h page npages",                     \
      "bounds of page pos/page from kc; sel[h] = that page + the top npages-1 by bound")    \
    X(KV_EVICT, "kv_evict", "score? meta acc?", "policy cap sinks window nsplit",           \
      "every kv head: meta[h][cap] = the slot the next token takes (a victim when full)")   \
    X(KV_SNAP, "kv_snap", "q kc qwin snap sc", "budget window safe",                        \
      "every kv head: at the prompt's last step, keep `budget` rows by the last `window` "  \
      "queries' attention (SnapKV; Ada-KV's pooled budget when safe < budget)")               \
    X(TOPK_SELECT, "topk_select", "q kc sc sel", "h k b ppm",                               \
      "sel[h] = pos and the rows < pos of most attention from kv head h's q heads, "        \
      "topk_rows(k, b, ppm, pos+1) in all (Kascade's anchors)")

typedef enum {
#define X(n, s, o, p, m) OP_##n,
    OP_LIST(X)
#undef X
    OP_COUNT
} OpCode;

/* ATTN_SPARSE kinds (param `kind`); a and b are per kind:
 *   SPARSE_SINK_WINDOW  a = sinks, b = window; kc/vc [n_kv_heads][S][hd];
 *                       rows [0, min(a, pos+1)) then [max(a, pos+1-b), pos+1);
 *                       aux absent
 *   SPARSE_QUEST        a = page, b = npages; kc/vc [n_kv_heads][S][hd];
 *                       aux = sel (i32 [n_kv_heads][b], read): for each
 *                       sel[h][j] >= 0, rows [p*a, min((p+1)*a, pos+1))
 *   SPARSE_SLOTS        a = cap, b = 1 if scores are written; kc/vc
 *                       [n_kv_heads][cap][hd] (an evicting layer's slots);
 *                       rows [0, min(pos+1, cap)); aux = score (f32,
 *                       written when b = 1): split s of kv head h writes
 *                       the scaled scores q . k[t] / sqrt(hd) of its rows
 *                       [lo, hi) into its own piece of the buffer (below)
 *   SPARSE_SNAP         a = the snap list's capacity L (snap_list_cap),
 *                       b = 0; kc/vc [n_kv_heads][S][hd]; aux = snap
 *                       (i32 [n_kv_heads][a + 2], read): the rows alive
 *                       at pos (SnapKV state, below)
 *   SPARSE_ROWS         a = the kv head whose list is read (0 <= a <
 *                       n_kv_heads), b = the list's length; kc/vc
 *                       [n_kv_heads][S][hd]; aux = sel (i32
 *                       [n_kv_heads][b], read): the rows sel[a][j] >= 0
 *                       (Kascade's top-k lists, TOPK_SELECT; a reuse
 *                       layer's kv head h may read another head's)
 * The selected rows, run after run, are cut into blocks of
 * SPARSE_BLOCK and split as ATTN's rows are (below). Partials are laid
 * out as for ATTN (an empty split leaves zeros, -inf, 0).
 *
 * Splits (ATTN, ATTN_SPARSE): n rows (entries) in nb = ceil(n / block)
 * blocks; split s of nsplit takes the blocks [s*nb/nsplit, (s+1)*nb/nsplit)
 * (integer division), so each split reads one contiguous range and the
 * splits of a head differ by at most one block. The last block, which
 * holds row pos, is always the last split's: ATTN's other splits read
 * rows [0, pos) only (their footprint), and need not wait for row pos.
 *
 * ATTN with rope = 1 reads q unrotated: it rotates the G q heads it
 * attends with at pos as it loads them (ROPE's arithmetic, rope: the
 * table's row pos), and leaves q as it is. With rope = 0 (operand absent)
 * q is used as it is.
 *
 * Scores of an evicting layer (SPARSE_SLOTS with b = 1, read by KV_EVICT
 * with the same nsplit): R = sparse_score_rows(cap, nsplit) entries per
 * split and q head, enough for any split's rows; q head g of kv head h,
 * slot t, held by split s (the split whose [lo, hi) has t) is at
 *   score[((h * nsplit + s) * G + g) * R + t - lo]
 * so each split writes one contiguous range of G * R entries and the
 * buffer holds n_heads * nsplit * R.
 *
 * Eviction state of a layer (KV_STORE, KV_EVICT):
 *   meta   (i32, class state) [n_kv_heads][cap + 1]: the position each slot
 *          holds (-1: empty), then the slot the next token goes to
 *   acc    (f32, class state) [n_kv_heads][cap]: H2O's accumulated
 *          attention per slot (the sum over the kv head's q heads)
 * KV_EVICT runs once per layer and step, after the layer's attention: with
 * n = min(pos+1, cap) slots filled, p[q head][t] = softmax over t < n of
 * the q head's scores (written by the nsplit splits, laid out as above).
 * H2O first adds p (summed over each kv head's q heads) into acc (zeroed
 * at pos 0). While pos+1 < cap the next slot is pos+1;
 * after that it is the victim of the policy, per kv head:
 *   KV_POLICY_STREAMING  the slot with the oldest position >= sinks
 *   KV_POLICY_H2O        the least acc among slots whose position is at
 *                        most pos - window (the last `window` positions are
 *                        kept); its acc is zeroed for the newcomer
 *   KV_POLICY_TOVA       the least p averaged over all q heads of the layer
 *                        (the same slot for every kv head)
 * Ties go to the lowest slot. score is read by H2O and TOVA, acc only by H2O.
 *
 * SnapKV (KV_SNAP, SPARSE_SNAP), on a layer whose cache keeps every row;
 * C = budget, W = window, L = snap_list_cap(C, safe, n_kv_heads, S):
 *   snap   (i32, class state) [n_kv_heads][L + 2]: cut, the position of
 *          the step at which the head was last compressed (-1: never),
 *          then n, how many positions <= cut it kept, then those n
 *          positions, ascending (n <= L)
 *   qwin   (f32, class state) [W][n_heads][hd]: q of the last W steps, the
 *          step at position p in entry p % W
 *   sc     (f32, class state) [n_kv_heads + 2][S]: the op's scratch
 * The rows of kv head h alive at a step pos: when 0 <= cut < pos, the n
 * kept ones and (cut, pos]; otherwise [0, pos].
 * KV_SNAP runs once per layer and step, after the layer's attention. At pos
 * 0 it sets every cut to -1; it stores this step's q into qwin; then, when
 * pos is the position of the prompt's last token (MegacArgs.prompt_end)
 * and some kv head has more than C rows alive, the layer is compressed.
 * For every kv head h: its window V_h is its alive rows in
 * [pos - W + 1, pos]; every other alive row t (the scored rows R_h) scores
 *   s[t] = sum over the queries w of the positions max(0, pos-W+1)..pos
 *          and over the kv head's q heads g of softmax_wg(t) / G,
 * softmax_wg over the alive rows <= w of q_wg . k / sqrt(hd) (q_wg from
 * qwin); pooled, s'[t] = the largest s[t'] of the scored rows t' with
 * |t' - t| <= 3 (SnapKV's max pool, kernel 7). The head's quota is
 * q_h = min(C - |V_h|, |R_h|). Each head keeps V_h and its own
 * min(safe, q_h) scored rows of largest s' (ties: the lower position);
 * then, of all the heads' scored rows not kept yet, the
 * sum_h (q_h - min(safe, q_h)) of largest s' are kept (ties: the lower
 * head, then the lower position): Ada-KV's budget pooled over the layer
 * (arXiv 2407.11550), with safe the rows each head is sure of. With
 * safe >= C (flat SnapKV) every head keeps exactly its top q_h. Every
 * head then has cut = pos and its kept scored rows and V_h as its list.
 * Rows after pos are alive as they come; a later prompt compresses again,
 * among the alive.
 * Top-k rows (TOPK_SELECT, Kascade's anchor layers): for kv head h at pos,
 * every row t <= pos of kc[h] gets
 *   p[t] = sum over the kv head's q heads g of softmax_g(t),
 * softmax_g over the rows [0, pos] of q_g . k_t / sqrt(hd) (q as it is:
 * rotated before); sel[h][0:k] (i32, [n_kv_heads][k]) = the
 * n = topk_rows(k, b, ppm, pos + 1) rows made of pos and the n - 1 others
 * t < pos of largest p (ties: the lower row), ascending, padded with -1:
 * b rows, or ppm millionths of the rows when that is more (Kascade's
 * max(128, 10% of n)), never more than k (the list's length) or pos + 1.
 * sc (f32, class scratch) [n_kv_heads][G + 1][S] is the op's scratch (kv
 * head h's part only, written before it is read).
 * Layers that attend over such a list (the anchor's own, and Kascade's
 * reuse layers, which read an anchor's) use ATTN_SPARSE's SPARSE_ROWS
 * with b = k: the anchor's kv head h its own list (a = h), a reuse layer's
 * kv head h the list of the anchor's kv head its head map names.
 *
 * Quest page bounds (QUEST_SELECT): bounds (f32, class state)
 * [n_kv_heads][ceil(S/page)][2][hd] = the elementwise min and max of the k
 * rows of each page. The op recomputes page c = pos/page from kc rows
 * [c*page, pos], then scores pages j <= c by
 * U_j = sum over the kv head's q heads g and lanes i of
 * max(q_g[i]*min_j[i], q_g[i]*max_j[i]); sel[h] holds page c, then the
 * npages-1 other pages of largest U (ties: lower page first), in
 * ascending page order, padded with -1. */
enum { SPARSE_SINK_WINDOW, SPARSE_QUEST, SPARSE_SLOTS, SPARSE_SNAP, SPARSE_ROWS, SPARSE_KIND_COUNT };
/* Whether ATTN_SPARSE of this kind reads an i32 list of rows or pages as aux. */
static inline bool sparse_reads_list(long long kind)
{
    return kind == SPARSE_QUEST || kind == SPARSE_SNAP || kind == SPARSE_ROWS;
}
enum { KV_POLICY_STREAMING, KV_POLICY_H2O, KV_POLICY_TOVA, KV_POLICY_COUNT };
#define SPARSE_BLOCK 32

/* Rows TOPK_SELECT picks among n (above): the larger of b and
 * ceil(n ppm / 10^6), at most k and n. */
static inline long long topk_rows(long long k, long long b, long long ppm, long long n)
{
    long long share = (n * ppm + 999999) / 1000000, r = share > b ? share : b;
    r = r < k ? r : k;
    return r < n ? r : n;
}

/* The most rows a SnapKV head keeps in its list (above): C with flat
 * budgets (safe >= C); pooled, a head may take up to the whole layer's
 * (and never more than max_seq). */
static inline long long snap_list_cap(long long budget, long long safe, long long n_kv_heads, long long max_seq)
{
    long long pooled = budget * n_kv_heads;
    return safe >= budget ? budget : pooled < max_seq ? pooled : max_seq;
}

/* Score entries per split and q head of an evicting layer (above): the
 * most rows a split of cap rows in blocks of SPARSE_BLOCK can take. */
static inline long long sparse_score_rows(long long cap, long long nsplit)
{
    long long nb = (cap + SPARSE_BLOCK - 1) / SPARSE_BLOCK;
    return (nb + nsplit - 1) / nsplit * SPARSE_BLOCK;
}

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
