/*
 * ops.c - the op table (built once from OP_LIST in ops.h) and each op's
 * footprint: the exact access list an op body touches, computed from the
 * instruction's params and the schedule's shape. The validator compares an
 * instruction's declared accesses against it; lowering and the tests use it
 * to build and check access lists.
 *
 * Ranges are element ranges [lo, hi) of the flattened buffer, affine in the
 * step's position `pos` (see the layouts in ops.h). Buffer ids are copied
 * from the instruction's own accesses; a footprint says modes and ranges.
 */
#include "ir/ir.h"

#include <string.h>

static OpInfo op_table[OP_COUNT];
static bool op_table_ready;

static const struct {
    const char *name, *operands, *params, *meaning;
} op_src[] = {
#define X(n, s, o, p, m) {s, o, p, m},
    OP_LIST(X)
#undef X
};
_Static_assert(sizeof op_src / sizeof op_src[0] == OP_COUNT, "op_src must list every op");

/* Splits a space-separated word list into at most `max` words (static
 * strings: the words are copied once into a static pool). */
static int op_words_split(const char *list, const char **out, bool *optional, int max)
{
    static char pool[1024];
    static size_t used;
    int n = 0;
    for (const char *p = list; *p;) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        const char *e = p;
        while (*e && *e != ' ')
            e++;
        size_t len = (size_t)(e - p);
        bool opt = len > 0 && p[len - 1] == '?';
        if (opt)
            len--;
        ASSERT(n < max && used + len + 1 <= sizeof pool);
        memcpy(pool + used, p, len);
        pool[used + len] = 0;
        out[n] = pool + used;
        if (optional)
            optional[n] = opt;
        used += len + 1;
        n++;
        p = e;
    }
    return n;
}

static void op_table_build(void)
{
    for (int i = 0; i < OP_COUNT; i++) {
        OpInfo *o = &op_table[i];
        o->name = op_src[i].name;
        o->meaning = op_src[i].meaning;
        o->noperands = op_words_split(op_src[i].operands, o->operand, o->optional, OP_MAX_OPERANDS);
        o->nparams = op_words_split(op_src[i].params, o->param, NULL, OP_MAX_PARAMS);
    }
    op_table_ready = true;
}

const OpInfo *op_info(int op)
{
    ASSERT(op >= 0 && op < OP_COUNT);
    if (!op_table_ready)
        op_table_build();
    return &op_table[op];
}

int op_from_name(const char *name)
{
    for (int i = 0; i < OP_COUNT; i++)
        if (strcmp(op_src[i].name, name) == 0)
            return i;
    return -1;
}

/* ---- footprints ---- */

typedef struct Fp {
    const Schedule *s;
    const Inst *in;
    Access *out;
    const char **why;
} Fp;

/* Sets operand i to mode m over the constant-or-affine range [lo, hi). */
static void fp_set(Fp *f, int i, int mode, Affine lo, Affine hi)
{
    f->out[i] = (Access){.buf = f->s->accs[f->in->acc + (uint32_t)i].buf, .mode = (uint8_t)mode, .lo = lo, .hi = hi};
}

static void fp_const(Fp *f, int i, int mode, int64_t lo, int64_t hi)
{
    fp_set(f, i, mode, affine_const(lo), affine_const(hi));
}

static void fp_absent(Fp *f, int i)
{
    f->out[i] = (Access){.buf = BUF_NONE};
}

/* Elements of the buffer bound to operand i (0 when absent). */
static int64_t fp_nelem(const Fp *f, int i)
{
    uint32_t b = f->s->accs[f->in->acc + (uint32_t)i].buf;
    return b == BUF_NONE || b >= f->s->nbufs ? 0 : f->s->bufs[b].nelem;
}

static bool fp_fail(Fp *f, const char *why)
{
    *f->why = why;
    return false;
}

static bool fp_embed(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    int64_t c0 = f->in->p[0], c1 = f->in->p[1];
    if (c0 < 0 || c0 >= c1 || c1 > m->dim)
        return fp_fail(f, "embed needs 0 <= c0 < c1 <= dim");
    fp_const(f, 0, ACC_R, 0, 1);
    /* the row is the token, known only at run time: the whole table */
    fp_const(f, 1, ACC_R, 0, (int64_t)m->vocab_size * m->dim);
    fp_const(f, 2, ACC_W, c0, c1);
    return true;
}

static bool fp_rmsnorm(Fp *f)
{
    int64_t n = f->in->p[0];
    if (n <= 0)
        return fp_fail(f, "rmsnorm needs n > 0");
    fp_const(f, 0, ACC_R, 0, n);
    fp_const(f, 1, ACC_R, 0, n);
    fp_const(f, 2, ACC_W, 0, n);
    return true;
}

static bool fp_gemv(Fp *f)
{
    int64_t r0 = f->in->p[0], r1 = f->in->p[1], k = f->in->p[2], fl = f->in->p[3];
    if (k <= 0 || r0 < 0 || r0 >= r1)
        return fp_fail(f, "gemv needs k > 0 and 0 <= r0 < r1");
    if (fl & ~(GEMV_ACCUM | GEMV_NORM | GEMV_BIAS))
        return fp_fail(f, "gemv has unknown flags");
    if (fp_nelem(f, 0) % k != 0 || r1 > fp_nelem(f, 0) / k)
        return fp_fail(f, "gemv rows r1 exceed the weight's rows (elements / k)");
    fp_const(f, 0, ACC_R, r0 * k, r1 * k);
    fp_const(f, 1, ACC_R, 0, k);
    fp_const(f, 2, fl & GEMV_ACCUM ? ACC_RW : ACC_W, r0, r1);
    if (fl & GEMV_NORM)
        fp_const(f, 3, ACC_R, 0, k);
    else
        fp_absent(f, 3);
    if (fl & GEMV_BIAS)
        fp_const(f, 4, ACC_R, r0, r1);
    else
        fp_absent(f, 4);
    return true;
}

static bool fp_rope(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    int64_t h0 = f->in->p[0], h1 = f->in->p[1], hd = m->head_dim;
    if (h0 < 0 || h0 >= h1 || h1 * hd > fp_nelem(f, 0))
        return fp_fail(f, "rope needs 0 <= h0 < h1 and heads [h0,h1) inside v");
    fp_const(f, 0, ACC_RW, h0 * hd, h1 * hd);
    fp_set(f, 1, ACC_R, (Affine){0, hd}, (Affine){hd, hd});
    return true;
}

static bool fp_kv_append(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    int64_t h = f->in->p[0], hd = m->head_dim, base = h * m->max_seq * hd;
    if (h < 0 || h >= m->n_kv_heads)
        return fp_fail(f, "kv_append needs 0 <= h < kv_heads");
    fp_const(f, 0, ACC_R, h * hd, (h + 1) * hd);
    fp_const(f, 1, ACC_R, h * hd, (h + 1) * hd);
    fp_set(f, 2, ACC_W, (Affine){base, hd}, (Affine){base + hd, hd});
    fp_set(f, 3, ACC_W, (Affine){base, hd}, (Affine){base + hd, hd});
    return true;
}

static bool fp_attn(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    int64_t h = f->in->p[0], sp = f->in->p[1], ns = f->in->p[2], blk = f->in->p[3], rope = f->in->p[4];
    int64_t hd = m->head_dim, g = m->n_heads / m->n_kv_heads, base = h * m->max_seq * hd;
    if (h < 0 || h >= m->n_kv_heads)
        return fp_fail(f, "attn needs 0 <= h < kv_heads");
    if (ns <= 0 || sp < 0 || sp >= ns || blk <= 0 || (rope != 0 && rope != 1))
        return fp_fail(f, "attn needs nsplit > 0, 0 <= s < nsplit, block > 0 and rope 0 or 1");
    fp_const(f, 0, ACC_R, h * g * hd, (h + 1) * g * hd);
    /* rows [0, pos] for the last split, [0, pos) for the others (ops.h) */
    Affine hi = {base + (sp == ns - 1 ? hd : 0), hd};
    fp_set(f, 1, ACC_R, affine_const(base), hi);
    fp_set(f, 2, ACC_R, affine_const(base), hi);
    int64_t e = g * (hd + 2), p0 = (h * ns + sp) * e;
    fp_const(f, 3, ACC_W, p0, p0 + e);
    if (rope)
        fp_set(f, 4, ACC_R, (Affine){0, hd}, (Affine){hd, hd});
    else
        fp_absent(f, 4);
    return true;
}

static bool fp_attn_combine(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    int64_t h = f->in->p[0], ns = f->in->p[1], nh = f->in->p[2];
    int64_t hd = m->head_dim, g = m->n_heads / m->n_kv_heads, e = g * (hd + 2);
    if (h < 0 || nh <= 0 || h + nh > m->n_kv_heads || ns <= 0)
        return fp_fail(f, "attn_combine needs 0 <= h, nh > 0, h + nh <= kv_heads and nsplit > 0");
    fp_const(f, 0, ACC_R, h * ns * e, (h + nh) * ns * e);
    fp_const(f, 1, ACC_W, h * g * hd, (h + nh) * g * hd);
    return true;
}

static bool fp_rows(Fp *f, int nin, int out_mode)
{
    int64_t r0 = f->in->p[0], r1 = f->in->p[1];
    if (r0 < 0 || r0 >= r1)
        return fp_fail(f, "needs 0 <= r0 < r1");
    for (int i = 0; i < nin; i++)
        fp_const(f, i, ACC_R, r0, r1);
    fp_const(f, nin, out_mode, r0, r1);
    return true;
}

/* a[r0:r1] += b[r0:r1]: a is read and written */
static bool fp_add(Fp *f)
{
    int64_t r0 = f->in->p[0], r1 = f->in->p[1];
    if (r0 < 0 || r0 >= r1)
        return fp_fail(f, "add needs 0 <= r0 < r1");
    fp_const(f, 0, ACC_RW, r0, r1);
    fp_const(f, 1, ACC_R, r0, r1);
    return true;
}

static bool fp_argmax(Fp *f)
{
    int64_t r0 = f->in->p[0], r1 = f->in->p[1], slot = f->in->p[2];
    if (r0 < 0 || r0 >= r1 || slot < 0)
        return fp_fail(f, "argmax needs 0 <= r0 < r1 and slot >= 0");
    fp_const(f, 0, ACC_R, r0, r1);
    fp_const(f, 1, ACC_W, 2 * slot, 2 * slot + 2);
    return true;
}

static bool fp_argmax_combine(Fp *f)
{
    int64_t n = f->in->p[0];
    if (n <= 0)
        return fp_fail(f, "argmax_combine needs nslot > 0");
    fp_const(f, 0, ACC_R, 0, 2 * n);
    fp_const(f, 1, ACC_W, 0, 1);
    return true;
}

static bool fp_kv_store(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    int64_t h = f->in->p[0], cap = f->in->p[1], hd = m->head_dim;
    if (h < 0 || h >= m->n_kv_heads)
        return fp_fail(f, "kv_store needs 0 <= h < kv_heads");
    if (cap <= 0 || cap > m->max_seq)
        return fp_fail(f, "kv_store needs 0 < cap <= max_seq");
    fp_const(f, 0, ACC_R, h * hd, (h + 1) * hd);
    fp_const(f, 1, ACC_R, h * hd, (h + 1) * hd);
    /* the slot is data: the head's whole region */
    fp_const(f, 2, ACC_W, h * cap * hd, (h + 1) * cap * hd);
    fp_const(f, 3, ACC_W, h * cap * hd, (h + 1) * cap * hd);
    fp_const(f, 4, ACC_RW, h * (cap + 1), (h + 1) * (cap + 1));
    return true;
}

static bool fp_attn_sparse(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    const int32_t *p = f->in->p;
    int64_t h = p[0], sp = p[1], ns = p[2], kind = p[3], a = p[4], b = p[5];
    int64_t hd = m->head_dim, g = m->n_heads / m->n_kv_heads, S = m->max_seq;
    if (h < 0 || h >= m->n_kv_heads)
        return fp_fail(f, "attn_sparse needs 0 <= h < kv_heads");
    if (ns <= 0 || sp < 0 || sp >= ns)
        return fp_fail(f, "attn_sparse needs nsplit > 0 and 0 <= s < nsplit");
    fp_const(f, 0, ACC_R, h * g * hd, (h + 1) * g * hd);
    int64_t e = g * (hd + 2), p0 = (h * ns + sp) * e;
    fp_const(f, 3, ACC_W, p0, p0 + e);
    switch (kind) {
    case SPARSE_SINK_WINDOW:
    case SPARSE_QUEST:
    case SPARSE_SNAP:
    case SPARSE_ROWS:
        if (kind == SPARSE_SINK_WINDOW && (a < 0 || b <= 0))
            return fp_fail(f, "attn_sparse sink_window needs sinks >= 0 and window > 0");
        if (kind == SPARSE_QUEST && (a <= 0 || b <= 0 || a > S))
            return fp_fail(f, "attn_sparse quest needs 0 < page <= max_seq and npages > 0");
        if (kind == SPARSE_SNAP && (a <= 0 || a > S || b != 0))
            return fp_fail(f, "attn_sparse snap needs 0 < list capacity <= max_seq and b 0");
        if (kind == SPARSE_ROWS && (a < 0 || a >= m->n_kv_heads || b <= 0 || b > S))
            return fp_fail(f, "attn_sparse rows needs 0 <= list head < kv_heads and 0 < length <= max_seq");
        fp_set(f, 1, ACC_R, affine_const(h * S * hd), (Affine){h * S * hd + hd, hd});
        fp_set(f, 2, ACC_R, affine_const(h * S * hd), (Affine){h * S * hd + hd, hd});
        if (kind == SPARSE_QUEST)
            fp_const(f, 4, ACC_R, h * b, (h + 1) * b);
        else if (kind == SPARSE_SNAP)
            fp_const(f, 4, ACC_R, h * (a + 2), (h + 1) * (a + 2));
        else if (kind == SPARSE_ROWS)
            fp_const(f, 4, ACC_R, a * b, (a + 1) * b);
        else
            fp_absent(f, 4);
        return true;
    case SPARSE_SLOTS:
        if (a <= 0 || a > S || (b != 0 && b != 1))
            return fp_fail(f, "attn_sparse slots needs 0 < cap <= max_seq and b (scores) 0 or 1");
        fp_const(f, 1, ACC_R, h * a * hd, (h + 1) * a * hd);
        fp_const(f, 2, ACC_R, h * a * hd, (h + 1) * a * hd);
        if (b) {
            int64_t r = g * sparse_score_rows(a, ns);
            fp_const(f, 4, ACC_W, (h * ns + sp) * r, (h * ns + sp + 1) * r);
        } else
            fp_absent(f, 4);
        return true;
    default:
        return fp_fail(f, "attn_sparse has an unknown kind");
    }
}

static bool fp_quest_select(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    int64_t h = f->in->p[0], page = f->in->p[1], np = f->in->p[2];
    int64_t hd = m->head_dim, g = m->n_heads / m->n_kv_heads, S = m->max_seq;
    if (h < 0 || h >= m->n_kv_heads)
        return fp_fail(f, "quest_select needs 0 <= h < kv_heads");
    if (page <= 0 || page > S || np <= 0)
        return fp_fail(f, "quest_select needs 0 < page <= max_seq and npages > 0");
    int64_t pages = (S + page - 1) / page;
    fp_const(f, 0, ACC_R, h * g * hd, (h + 1) * g * hd);
    fp_set(f, 1, ACC_R, affine_const(h * S * hd), (Affine){h * S * hd + hd, hd});
    fp_const(f, 2, ACC_RW, h * pages * 2 * hd, (h + 1) * pages * 2 * hd);
    fp_const(f, 3, ACC_W, h * np, (h + 1) * np);
    return true;
}

static bool fp_topk_select(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    int64_t h = f->in->p[0], k = f->in->p[1], b = f->in->p[2], ppm = f->in->p[3];
    int64_t hd = m->head_dim, g = m->n_heads / m->n_kv_heads, S = m->max_seq;
    if (h < 0 || h >= m->n_kv_heads)
        return fp_fail(f, "topk_select needs 0 <= h < kv_heads");
    if (k <= 0 || k > S || b <= 0 || b > k || ppm < 0 || ppm > 1000000)
        return fp_fail(f, "topk_select needs 0 < b <= k <= max_seq and 0 <= ppm <= 10^6");
    fp_const(f, 0, ACC_R, h * g * hd, (h + 1) * g * hd);
    fp_set(f, 1, ACC_R, affine_const(h * S * hd), (Affine){h * S * hd + hd, hd});
    fp_const(f, 2, ACC_W, h * (g + 1) * S, (h + 1) * (g + 1) * S);
    fp_const(f, 3, ACC_W, h * k, (h + 1) * k);
    return true;
}

static bool fp_kv_evict(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    int64_t pol = f->in->p[0], cap = f->in->p[1], sinks = f->in->p[2], win = f->in->p[3], ns = f->in->p[4];
    if (pol < 0 || pol >= KV_POLICY_COUNT)
        return fp_fail(f, "kv_evict has an unknown policy");
    if (cap <= 0 || cap > m->max_seq || sinks < 0 || win < 0 || ns <= 0)
        return fp_fail(f, "kv_evict needs 0 < cap <= max_seq, sinks >= 0, window >= 0 and nsplit > 0");
    if (pol == KV_POLICY_STREAMING && sinks >= cap)
        return fp_fail(f, "kv_evict streaming needs sinks < cap");
    if (pol == KV_POLICY_H2O && win >= cap)
        return fp_fail(f, "kv_evict h2o needs window < cap");
    if (pol == KV_POLICY_STREAMING)
        fp_absent(f, 0);
    else
        fp_const(f, 0, ACC_R, 0, (int64_t)m->n_heads * ns * sparse_score_rows(cap, ns));
    fp_const(f, 1, ACC_RW, 0, (int64_t)m->n_kv_heads * (cap + 1));
    if (pol == KV_POLICY_H2O)
        fp_const(f, 2, ACC_RW, 0, (int64_t)m->n_kv_heads * cap);
    else
        fp_absent(f, 2);
    return true;
}

static bool fp_kv_snap(Fp *f)
{
    const ModelShape *m = &f->s->shape;
    int64_t C = f->in->p[0], W = f->in->p[1], safe = f->in->p[2], S = m->max_seq, hd = m->head_dim;
    int64_t nkv = m->n_kv_heads;
    if (W <= 0 || W >= C || C > S || safe < 0)
        return fp_fail(f, "kv_snap needs 0 < window < budget <= max_seq and safe >= 0");
    fp_const(f, 0, ACC_R, 0, (int64_t)m->n_heads * hd);
    fp_const(f, 1, ACC_R, 0, nkv * S * hd);
    fp_const(f, 2, ACC_RW, 0, W * m->n_heads * hd);
    fp_const(f, 3, ACC_RW, 0, nkv * (snap_list_cap(C, safe, nkv, S) + 2));
    fp_const(f, 4, ACC_RW, 0, (nkv + 2) * S);
    return true;
}

bool op_footprint(const Schedule *s, const Inst *in, Access *out, const char **why)
{
    static const char *dummy;
    Fp f = {s, in, out, why ? why : &dummy};
    ASSERT(in->kind == INST_OP && in->op < OP_COUNT);
    const ModelShape *m = &s->shape;
    if (m->head_dim <= 0 || m->n_kv_heads <= 0 || m->n_heads % m->n_kv_heads != 0)
        return fp_fail(&f, "the schedule's shape is invalid (head_dim, heads, kv_heads)");
    switch ((OpCode)in->op) {
    case OP_EMBED: return fp_embed(&f);
    case OP_RMSNORM: return fp_rmsnorm(&f);
    case OP_GEMV: return fp_gemv(&f);
    case OP_ROPE: return fp_rope(&f);
    case OP_KV_APPEND: return fp_kv_append(&f);
    case OP_ATTN: return fp_attn(&f);
    case OP_ATTN_COMBINE: return fp_attn_combine(&f);
    case OP_SILU_MUL: return fp_rows(&f, 2, ACC_W);
    case OP_ADD: return fp_add(&f);
    case OP_ARGMAX: return fp_argmax(&f);
    case OP_ARGMAX_COMBINE: return fp_argmax_combine(&f);
    case OP_KV_STORE: return fp_kv_store(&f);
    case OP_ATTN_SPARSE: return fp_attn_sparse(&f);
    case OP_QUEST_SELECT: return fp_quest_select(&f);
    case OP_KV_EVICT: return fp_kv_evict(&f);
    case OP_KV_SNAP: return fp_kv_snap(&f);
    case OP_TOPK_SELECT: return fp_topk_select(&f);
    case OP_COUNT: break;
    }
    die("bad op %d", in->op);
}

int op_cache_operand(const Inst *in, int which)
{
    switch ((OpCode)in->op) {
    case OP_KV_APPEND: case OP_KV_STORE: return 2 + which;
    case OP_ATTN: case OP_ATTN_SPARSE: return 1 + which;
    case OP_QUEST_SELECT: case OP_KV_SNAP: case OP_TOPK_SELECT: return which == 0 ? 1 : -1;
    default: return -1;
    }
}

bool op_operand_is_cache(const Inst *in, int i)
{
    return i >= 0 && (i == op_cache_operand(in, 0) || i == op_cache_operand(in, 1));
}

bool dtype_is_cache(DType t)
{
    return t == DT_F32 || t == DT_F16 || t == DT_BF16;
}

DType op_operand_dtype(const Inst *in, int i)
{
    switch ((OpCode)in->op) {
    case OP_EMBED: return i == 0 ? DT_I32 : DT_F32;
    case OP_ARGMAX_COMBINE: return i == 1 ? DT_I32 : DT_F32;
    case OP_KV_STORE: return i == 4 ? DT_I32 : DT_F32;
    case OP_ATTN_SPARSE: return i == 4 && sparse_reads_list(in->p[3]) ? DT_I32 : DT_F32;
    case OP_QUEST_SELECT: return i == 3 ? DT_I32 : DT_F32;
    case OP_KV_EVICT: return i == 1 ? DT_I32 : DT_F32;
    case OP_KV_SNAP: case OP_TOPK_SELECT: return i == 3 ? DT_I32 : DT_F32;
    default: return DT_F32;
    }
}

int64_t op_operand_nelem(const Schedule *s, const Inst *in, int i)
{
    const ModelShape *m = &s->shape;
    int64_t cache = (int64_t)m->n_kv_heads * m->max_seq * m->head_dim, hd = m->head_dim;
    switch ((OpCode)in->op) {
    case OP_KV_APPEND: return i >= 2 ? cache : 0;
    case OP_ATTN: return i == 1 || i == 2 ? cache : i == 4 ? (int64_t)m->max_seq * hd : 0;
    case OP_ROPE: return i == 1 ? (int64_t)m->max_seq * hd : 0;
    case OP_KV_STORE:
        if (i == 2 || i == 3)
            return (int64_t)m->n_kv_heads * in->p[1] * hd;
        return i == 4 ? (int64_t)m->n_kv_heads * (in->p[1] + 1) : 0;
    case OP_ATTN_SPARSE:
        if (i == 1 || i == 2)
            return in->p[3] == SPARSE_SLOTS ? (int64_t)m->n_kv_heads * in->p[4] * hd : cache;
        return i == 4 && in->p[3] == SPARSE_ROWS ? (int64_t)m->n_kv_heads * in->p[5] : 0;
    case OP_QUEST_SELECT:
        if (i == 1)
            return cache;
        if (i == 2 && in->p[1] > 0)
            return (int64_t)m->n_kv_heads * ((m->max_seq + in->p[1] - 1) / in->p[1]) * 2 * hd;
        return 0;
    case OP_KV_EVICT:
        if (i == 1)
            return (int64_t)m->n_kv_heads * (in->p[1] + 1);
        return i == 2 ? (int64_t)m->n_kv_heads * in->p[1] : 0;
    case OP_KV_SNAP:
        return i == 1   ? cache
               : i == 2 ? (int64_t)in->p[1] * m->n_heads * hd
               : i == 3 ? (int64_t)m->n_kv_heads * (snap_list_cap(in->p[0], in->p[2], m->n_kv_heads, m->max_seq) + 2)
               : i == 4 ? ((int64_t)m->n_kv_heads + 2) * m->max_seq
                        : 0;
    case OP_TOPK_SELECT:
        return i == 1   ? cache
               : i == 2 ? ((int64_t)m->n_heads + m->n_kv_heads) * m->max_seq
               : i == 3 ? (int64_t)m->n_kv_heads * in->p[1]
                        : 0;
    default: return 0;
    }
}

bool op_operand_needed(const Inst *in, int i)
{
    if (in->op == OP_ATTN && i == 4)
        return in->p[4] == 1;
    if (in->op == OP_ATTN_SPARSE && i == 4)
        return sparse_reads_list(in->p[3]) || (in->p[3] == SPARSE_SLOTS && in->p[5] == 1);
    if (in->op == OP_KV_EVICT && i == 0)
        return in->p[0] != KV_POLICY_STREAMING;
    if (in->op == OP_KV_EVICT && i == 2)
        return in->p[0] == KV_POLICY_H2O;
    return false;
}
