/*
 * structure.c - the structure pass: everything that must hold before the
 * schedule's behaviour can be reasoned about.
 *
 * First the references (op codes, access lists, buffers, counters), which
 * later passes index with; when one does not resolve the run stops here.
 * Then, per op: the params are valid for the shape and the declared access
 * list equals op_footprint (buffer, mode, both ends as affine functions, so
 * for every pos); per access: non-empty-or-empty but ordered and inside the
 * buffer for every pos in [0, max_seq); no writes to weights; activations
 * are not block-quantized; the buffers the lowering names have the shapes
 * the shape line gives them. Per sync instruction: signals add at least 1,
 * waits have a threshold of at least 1 on a counter someone signals.
 */
#include "validator/val_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool inst_refs_check(Val *v, uint32_t w, uint32_t t)
{
    const Schedule *s = v->s;
    const Inst *in = val_inst(v, w, t);
    int *n = &v->r->nstructure;
    if (in->kind == INST_SIGNAL || in->kind == INST_WAIT) {
        if (in->counter >= s->nctrs) {
            val_error(v, n, in->line, "structure: worker %u inst %u: counter #%u does not exist", w, t, in->counter);
            return false;
        }
        return true;
    }
    if (in->kind != INST_OP || in->op >= OP_COUNT) {
        val_error(v, n, in->line, "structure: worker %u inst %u: unknown instruction kind %d / op %d", w, t, in->kind, in->op);
        return false;
    }
    const OpInfo *oi = op_info(in->op);
    if (in->nacc != oi->noperands || (uint64_t)in->acc + in->nacc > s->naccs) {
        val_error(v, n, in->line, "structure: worker %u inst %u: op %s has %u accesses, expected %d", w, t, oi->name,
                  in->nacc, oi->noperands);
        return false;
    }
    bool ok = true;
    for (int i = 0; i < in->nacc; i++) {
        const Access *a = &s->accs[in->acc + i];
        if (a->buf == BUF_NONE) {
            if (!oi->optional[i]) {
                val_error(v, n, in->line, "structure: worker %u inst %u: op %s: operand '%s' is required", w, t,
                          oi->name, oi->operand[i]);
                ok = false;
            }
        } else if (a->buf >= s->nbufs || a->mode < ACC_R || a->mode > ACC_RW) {
            val_error(v, n, in->line, "structure: worker %u inst %u: op %s: operand '%s' names no buffer or mode", w,
                      t, oi->name, oi->operand[i]);
            ok = false;
        }
    }
    return ok;
}

static const char *mode_str(int m)
{
    return m == ACC_R ? "r" : m == ACC_W ? "w" : m == ACC_RW ? "rw" : "?";
}

static const char *acc_str(const Val *v, const Access *a, char *buf, size_t n)
{
    char lo[48], hi[48];
    if (a->buf == BUF_NONE)
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, "%s %s[%s:%s]", mode_str(a->mode), v->s->bufs[a->buf].name, affine_str(a->lo, lo, sizeof lo),
                 affine_str(a->hi, hi, sizeof hi));
    return buf;
}

static bool acc_equal(const Access *a, const Access *b)
{
    if (a->buf == BUF_NONE || b->buf == BUF_NONE)
        return a->buf == b->buf;
    return a->buf == b->buf && a->mode == b->mode && a->lo.c == b->lo.c && a->lo.k == b->lo.k &&
           a->hi.c == b->hi.c && a->hi.k == b->hi.k;
}

/* Params valid for the shape, and the declared accesses are the footprint. */
static void op_footprint_check(Val *v, uint32_t w, uint32_t t)
{
    const Inst *in = val_inst(v, w, t);
    const OpInfo *oi = op_info(in->op);
    Access fp[OP_MAX_OPERANDS];
    const char *why = NULL;
    memset(fp, 0, sizeof fp);
    if (!op_footprint(v->s, in, fp, &why)) {
        val_error(v, &v->r->nstructure, in->line, "structure: worker %u inst %u: op %s: invalid params: %s", w, t,
                  oi->name, why ? why : "rejected by the op");
        return;
    }
    for (int i = 0; i < in->nacc; i++) {
        const Access *a = &v->s->accs[in->acc + i];
        char b1[160], b2[160];
        if (fp[i].buf == BUF_NONE && fp[i].mode != 0) {
            val_error(v, &v->r->nstructure, in->line,
                      "structure: worker %u inst %u: op %s: operand '%s' is required by the params but absent", w, t,
                      oi->name, oi->operand[i]);
            continue;
        }
        if (acc_equal(a, &fp[i]))
            continue;
        val_error(v, &v->r->nstructure, in->line,
                  "structure: worker %u inst %u: op %s: operand '%s' is declared as %s but the op accesses %s", w, t,
                  oi->name, oi->operand[i], acc_str(v, a, b1, sizeof b1), acc_str(v, &fp[i], b2, sizeof b2));
    }
}

/* In bounds and ordered for every pos; class, dtype and layout rules. */
static void access_check(Val *v, uint32_t w, uint32_t t, int i)
{
    const Inst *in = val_inst(v, w, t);
    const Access *a = &v->s->accs[in->acc + i];
    if (a->buf == BUF_NONE)
        return;
    const Buffer *b = &v->s->bufs[a->buf];
    const char *opn = op_info(in->op)->name, *arg = op_info(in->op)->operand[i];
    int *n = &v->r->nstructure;
    int64_t lo = affine_min(a->lo, v->nseq), hi = affine_max(a->hi, v->nseq);
    Affine diff = {a->hi.c - a->lo.c, a->hi.k - a->lo.k};
    if (lo < 0 || hi > b->nelem)
        val_error(v, n, in->line,
                  "structure: worker %u inst %u: op %s: operand '%s' reaches %s[%lld:%lld], outside its %lld elements "
                  "for some pos in [0, %lld)",
                  w, t, opn, arg, b->name, (long long)lo, (long long)hi, (long long)b->nelem, (long long)v->nseq);
    if (affine_min(diff, v->nseq) < 0)
        val_error(v, n, in->line, "structure: worker %u inst %u: op %s: operand '%s': range on %s ends before it starts",
                  w, t, opn, arg, b->name);
    if ((a->mode & ACC_W) && b->cls == BUF_WEIGHT)
        val_error(v, n, in->line, "structure: worker %u inst %u: op %s writes weight buffer %s", w, t, opn, b->name);
    DType want = op_operand_dtype(in, i);
    bool cache = op_operand_is_cache(in, i), ok = cache ? dtype_is_cache(b->dtype) : b->dtype == want;
    if (b->cls != BUF_WEIGHT ? !ok : b->dtype == DT_I32)
        val_error(v, n, in->line, "structure: worker %u inst %u: op %s: operand '%s' cannot be %s buffer %s of dtype %s",
                  w, t, opn, arg, bufclass_name(b->cls), b->name, dtype_name(b->dtype));
    int kc = op_cache_operand(in, 0);
    if (cache && i == op_cache_operand(in, 1) && v->s->accs[in->acc + kc].buf != BUF_NONE) {
        const Buffer *k = &v->s->bufs[v->s->accs[in->acc + kc].buf];
        if (k->dtype != b->dtype)
            val_error(v, n, in->line,
                      "structure: worker %u inst %u: op %s: the cache's k rows (%s) are %s but its v rows (%s) are %s",
                      w, t, opn, k->name, dtype_name(k->dtype), b->name, dtype_name(b->dtype));
    }
    int64_t rows = op_operand_nelem(v->s, in, i);
    if (rows && b->nelem != rows)
        val_error(v, n, in->line,
                  "structure: worker %u inst %u: op %s: operand '%s' needs %lld elements (its layout in ops.h), %s has "
                  "%lld",
                  w, t, opn, arg, (long long)rows, b->name, (long long)b->nelem);
}

static void sync_check(Val *v, uint32_t w, uint32_t t)
{
    const Inst *in = val_inst(v, w, t);
    const char *cn = v->s->ctrs[in->counter].name;
    int *n = &v->r->nstructure;
    if (in->kind == INST_SIGNAL && in->amount == 0)
        val_error(v, n, in->line, "structure: worker %u inst %u: signal %s +0 does nothing", w, t, cn);
    if (in->kind != INST_WAIT)
        return;
    if (in->amount == 0)
        val_error(v, n, in->line, "structure: worker %u inst %u: wait %s >= 0 always passes and orders nothing", w, t, cn);
    else if (v->ctotal[in->counter] == 0)
        val_error(v, n, in->line, "structure: worker %u inst %u: waits on counter %s, which nothing signals", w, t, cn);
}

/* The shapes of the buffers the lowering names (compiler/lower.c), in the
 * shape line's terms, one letter a dimension: D dim, H hidden, V vocab, S
 * max_seq, h heads, k kv_heads, d head_dim, Q heads*head_dim, K
 * kv_heads*head_dim, r head_dim/2, G heads/kv_heads, P head_dim+2, 2 two,
 * R 1..max_seq (an evicting layer's cache holds its budget), * any.
 * "L." names are per layer (L0.wq), "x." ones too (kc.0), "x.w" ones per
 * worker (att.w3: in_o's merged attention, one a worker); a buffer of
 * another class than the lowering gives the name is not one of these
 * (a hand-written schedule's state x). Shapes are in
 * elements whatever the dtype (a quantized row's bytes are its dtype's
 * business), and embed is checked against its ops by shape_check. */
static const struct {
    const char *name, *dims;
    BufClass cls;
} shaped_bufs[] = {
    {"L.attn_norm", "D", BUF_WEIGHT}, {"L.wq", "QD", BUF_WEIGHT}, {"L.wk", "KD", BUF_WEIGHT},
    {"L.wv", "KD", BUF_WEIGHT}, {"L.bq", "Q", BUF_WEIGHT}, {"L.bk", "K", BUF_WEIGHT},
    {"L.bv", "K", BUF_WEIGHT}, {"L.wo", "DQ", BUF_WEIGHT}, {"L.ffn_norm", "D", BUF_WEIGHT},
    {"L.w_gate", "HD", BUF_WEIGHT}, {"L.w_up", "HD", BUF_WEIGHT}, {"L.w_down", "DH", BUF_WEIGHT},
    {"final_norm", "D", BUF_WEIGHT}, {"lm_head", "VD", BUF_WEIGHT}, {"rope", "Sr2", BUF_WEIGHT},
    {"logits", "V", BUF_IO}, {"kc.", "kRd", BUF_KV}, {"vc.", "kRd", BUF_KV},
    {"meta.", "k*", BUF_STATE}, {"acc.", "k*", BUF_STATE}, {"snap.", "k*", BUF_STATE},
    {"qwin.", "*hd", BUF_STATE}, {"bounds.", "k*2d", BUF_STATE}, {"snapsc", "*S", BUF_STATE},
    {"sel", "k*", BUF_SCRATCH}, {"kidx.", "k*", BUF_SCRATCH}, {"topksc", "*S", BUF_SCRATCH}, {"score", "h*", BUF_SCRATCH}, {"x", "D", BUF_SCRATCH},
    {"q", "Q", BUF_SCRATCH}, {"k", "K", BUF_SCRATCH}, {"v", "K", BUF_SCRATCH},
    {"att", "Q", BUF_SCRATCH}, {"part", "k*GP", BUF_SCRATCH}, {"gate", "H", BUF_SCRATCH},
    {"up", "H", BUF_SCRATCH}, {"hb", "H", BUF_SCRATCH}, {"att.w", "Q", BUF_SCRATCH},
};

/* The size dimension letter c stands for; -1: any. */
static int64_t shape_dim(const ModelShape *m, char c)
{
    int64_t hd = m->head_dim;
    switch (c) {
    case 'D': return m->dim;
    case 'H': return m->hidden_dim;
    case 'V': return m->vocab_size;
    case 'S': return m->max_seq;
    case 'h': return m->n_heads;
    case 'k': return m->n_kv_heads;
    case 'd': return hd;
    case 'Q': return m->n_heads * hd;
    case 'K': return m->n_kv_heads * hd;
    case 'r': return hd / 2;
    case 'G': return m->n_kv_heads > 0 ? m->n_heads / m->n_kv_heads : -1;
    case 'P': return hd + 2;
    case '2': return 2;
    default: return -1;
    }
}

/* The dims of the shaped_bufs entry a buffer's name and class match
 * (*layer: its layer, or -1), or NULL. */
static const char *shaped_dims(const char *name, BufClass cls, int *layer)
{
    char key[48];
    const char *dot = strchr(name, '.'), *num = name[0] == 'L' && dot ? name + 1 : dot ? dot + 1 : NULL;
    *layer = -1;
    if (dot && num == dot + 1 && num[0] == 'w' && num[1] >= '0' && num[1] <= '9' &&
        strspn(num + 1, "0123456789") == strlen(num + 1) && dot - name < 32) {
        snprintf(key, sizeof key, "%.*s.w", (int)(dot - name), name); /* att.w3 -> att.w */
        name = key;
    } else if (num && *num >= '0' && *num <= '9') {
        char *end;
        long l = strtol(num, &end, 10);
        bool prefix = name[0] == 'L' && end == dot, suffix = !prefix && dot && num == dot + 1 && !*end;
        if ((prefix || suffix) && l <= 1 << 20) {
            if (prefix)
                snprintf(key, sizeof key, "L%s", dot);                      /* L0.wq -> L.wq */
            else
                snprintf(key, sizeof key, "%.*s.", (int)(dot - name), name); /* kc.0 -> kc. */
            *layer = (int)l;
            name = key;
        }
    }
    for (size_t i = 0; i < sizeof shaped_bufs / sizeof *shaped_bufs; i++)
        if (strcmp(shaped_bufs[i].name, name) == 0 && shaped_bufs[i].cls == cls)
            return shaped_bufs[i].dims;
    return NULL;
}

static void dims_str(const int64_t *d, int rank, char *buf, size_t cap)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < rank && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
}

/* Each buffer the lowering names has the shape the shape line gives it
 * (reported at the buffer's line), and a per-layer one a layer below
 * layers=. */
static void buffer_shapes_check(Val *v)
{
    const ModelShape *m = &v->s->shape;
    for (uint32_t i = 0; i < v->s->nbufs; i++) {
        const Buffer *b = &v->s->bufs[i];
        int layer;
        const char *dims = shaped_dims(b->name, b->cls, &layer);
        if (!dims)
            continue;
        if (layer >= m->n_layers) {
            val_error(v, &v->r->nstructure, b->line, "structure: buffer %s belongs to layer %d, but the shape says "
                      "layers=%d", b->name, layer, m->n_layers);
            continue;
        }
        int rank = (int)strlen(dims);
        bool ok = b->rank == rank;
        int64_t want[4];
        for (int d = 0; d < rank; d++) {
            want[d] = shape_dim(m, dims[d]);
            if (dims[d] == 'R') {
                ok &= b->rank == rank && b->shape[d] >= 1 && b->shape[d] <= m->max_seq;
                want[d] = m->max_seq;
            }
            else if (want[d] >= 0)
                ok &= b->rank == rank && b->shape[d] == want[d];
            else
                want[d] = b->rank == rank ? b->shape[d] : 0;
        }
        if (ok)
            continue;
        char has[96], should[96];
        dims_str(b->shape, b->rank, has, sizeof has);
        dims_str(want, rank, should, sizeof should);
        val_error(v, &v->r->nstructure, b->line,
                  "structure: buffer %s is %s, but the shape line (dim=%d hidden=%d heads=%d kv_heads=%d "
                  "head_dim=%d vocab=%d max_seq=%d) makes it %s%s",
                  b->name, has, m->dim, m->hidden_dim, m->n_heads, m->n_kv_heads, m->head_dim, m->vocab_size,
                  m->max_seq, should, strchr(dims, 'R') ? " (its rows at most max_seq)" : "");
    }
}

/* The header's shape facts that the buffers also state: two KV caches per
 * layer (in a schedule that has any: a fragment may have none), and the
 * embedding table of every embed op is [vocab, dim] (the
 * kernels index it with both). A disagreement is reported at the shape key. */
static void shape_check(Val *v)
{
    const Schedule *s = v->s;
    const ModelShape *m = &s->shape;
    int *n = &v->r->nstructure, line, col;
    uint32_t nkv = 0;
    for (uint32_t b = 0; b < s->nbufs; b++)
        nkv += s->bufs[b].cls == BUF_KV;
    if (nkv && nkv != 2 * (uint64_t)m->n_layers) {
        line = val_key_line(v, "shape", "layers", &col);
        val_error_at(v, n, line, col, "structure: the shape says layers=%d, but the schedule declares %u KV cache "
                     "buffers (two per layer)", m->n_layers, nkv);
    }
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = val_inst(v, w, t);
            if (in->kind != INST_OP || in->op != OP_EMBED || s->accs[in->acc + 1].buf == BUF_NONE)
                continue;
            const Buffer *b = &s->bufs[s->accs[in->acc + 1].buf];
            if (b->rank == 2 && b->shape[0] == m->vocab_size && b->shape[1] == m->dim)
                continue;
            bool vocab = b->rank < 1 || b->shape[0] != m->vocab_size;
            line = val_key_line(v, "shape", vocab ? "vocab" : "dim", &col);
            val_error_at(v, n, line, col, "structure: the shape says vocab=%d dim=%d, but the embedding table %s "
                         "of worker %u inst %u is not [%d, %d]", m->vocab_size, m->dim, b->name, w, t,
                         m->vocab_size, m->dim);
            if (b->line)
                val_note(v, b->line, "%s is declared here", b->name);
            return;
        }
}

bool val_structure_check(Val *v)
{
    const Schedule *s = v->s;
    bool refs = true;
    if (s->nworkers == 0)
        val_error(v, &v->r->nstructure, 0, "structure: the schedule has no workers");
    if (s->shape.max_seq <= 0)
        val_error(v, &v->r->nstructure, 0, "structure: max_seq must be positive");
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++)
            refs &= inst_refs_check(v, w, t);
    if (!refs)
        return false;
    shape_check(v);
    buffer_shapes_check(v);
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = val_inst(v, w, t);
            if (in->kind != INST_SIGNAL)
                continue;
            uint64_t before = v->ctotal[in->counter];
            v->ctotal[in->counter] += in->amount;
            if (before <= UINT32_MAX && v->ctotal[in->counter] > UINT32_MAX)
                val_error(v, &v->r->nstructure, in->line,
                          "structure: worker %u inst %u: counter %s's signals add up to more than its 32 bits hold "
                          "(%u): it would wrap",
                          w, t, s->ctrs[in->counter].name, UINT32_MAX);
        }
    for (uint32_t w = 0; w < v->nw; w++)
        for (uint32_t t = 0; t < s->workers[w].ninst; t++) {
            const Inst *in = val_inst(v, w, t);
            if (in->kind != INST_OP) {
                sync_check(v, w, t);
                continue;
            }
            op_footprint_check(v, w, t);
            for (int i = 0; i < in->nacc; i++)
                access_check(v, w, t, i);
        }
    return true;
}
