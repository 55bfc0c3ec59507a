/*
 * weights.c - loading a model's weights into f32 buffers, whatever the
 * source format.
 *
 * weights_load first lists the tensors the description implies (the
 * "slots": name, expected [rows, cols]) and allocates each one in
 * Weights.arena, then hands the slots to the format's loader
 * (load_llama2c.c, load_safetensors.c, load_gguf.c) or to the synthetic
 * generator (synthetic.c). Loaders check every source shape against its
 * slot and report errors as "path: error: tensor 'name': ..."; loading
 * stops at the first bad tensor so that one mistake gives one error.
 *
 * Then the description's quant knobs are applied (quant.c): matrices
 * may end up stored in another dtype, their f32 views dequantized from it.
 *
 * Also here: the read-only file mapping and the f16/bf16 -> f32 conversion
 * the loaders share, and weights_tensor, the lookup by schedule buffer name.
 */
#include "compiler/quant.h"
#include "compiler/weights_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const wkind_canon_names[] = {
#define X(e, c, h, g) c,
    WKIND_LIST(X)
#undef X
};
static const char *const wkind_hf_names[] = {
#define X(e, c, h, g) h,
    WKIND_LIST(X)
#undef X
};
static const char *const wkind_gguf_names[] = {
#define X(e, c, h, g) g,
    WKIND_LIST(X)
#undef X
};
_Static_assert(sizeof wkind_canon_names / sizeof *wkind_canon_names == WK_COUNT, "WKIND_LIST");

/* ---- file mapping ---- */

bool wfile_open(WFile *f, const char *path, Diag *d)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO is refused below, not waited on */
    if (fd < 0) {
        diag_file_error(d, path, "cannot open weights file: %s", strerror(errno));
        return false;
    }
    struct stat st;
    int r = fstat(fd, &st);
    if (r != 0 || !S_ISREG(st.st_mode)) {
        diag_file_error(d, path, "cannot read weights file: %s",
                        r != 0 ? strerror(errno) : S_ISDIR(st.st_mode) ? "it is a folder" : "not a regular file");
        close(fd);
        return false;
    }
    f->size = (size_t)st.st_size;
    if (f->size > 0) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            diag_file_error(d, path, "cannot map weights file: %s", strerror(errno));
            close(fd);
            return false;
        }
        f->map = p;
    }
    close(fd);
    return true;
}

void wfile_close(WFile *f)
{
    if (f->map && munmap((void *)f->map, f->size) != 0)
        die("munmap(%s): %s", f->path, strerror(errno));
    f->map = NULL;
    f->size = 0;
}

/* ---- names and shapes ---- */

bool wkind_is_per_layer(WKind k)
{
    return k != WK_EMBED && k != WK_FINAL_NORM && k != WK_LM_HEAD;
}

const char *wkind_canon(WKind k)
{
    ASSERT(k >= 0 && k < WK_COUNT);
    return wkind_canon_names[k];
}

char *wslot_canon_name(Arena *a, const WSlot *s)
{
    if (!wkind_is_per_layer(s->kind))
        return arena_strdup(a, wkind_canon_names[s->kind]);
    return arena_printf(a, "L%d.%s", s->layer, wkind_canon_names[s->kind]);
}

char *wslot_hf_name(Arena *a, const WSlot *s)
{
    if (!wkind_is_per_layer(s->kind))
        return arena_strdup(a, wkind_hf_names[s->kind]);
    return arena_printf(a, "model.layers.%d.%s", s->layer, wkind_hf_names[s->kind]);
}

char *wslot_gguf_name(Arena *a, const WSlot *s)
{
    if (!wkind_is_per_layer(s->kind))
        return arena_strdup(a, wkind_gguf_names[s->kind]);
    return arena_printf(a, "blk.%d.%s", s->layer, wkind_gguf_names[s->kind]);
}

int64_t wslot_nelem(const WSlot *s)
{
    return s->rows * (s->cols ? s->cols : 1);
}

const char *shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "[");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (off < n)
        snprintf(buf + off, n - off, "]");
    return buf;
}

bool wslot_shape_check(const ModelDesc *m, const WSlot *s, Diag *d, const char *path, const char *name, int ndim,
                       const int64_t *shape)
{
    int64_t want[2] = {s->rows, s->cols};
    int wn = s->cols ? 2 : 1;
    bool ok = ndim == wn;
    for (int i = 0; ok && i < wn; i++)
        ok = shape[i] == want[i];
    if (!ok) {
        char got[96], exp[96];
        diag_file_error(d, path, "tensor '%s': shape %s does not match the model (expected %s)", name,
                        shape_str(got, sizeof got, ndim, shape), shape_str(exp, sizeof exp, wn, want));
        /* where the expected shape came from: a config.json, a GGUF's metadata or the description */
        SrcFile from = {.path = m->arch_path ? m->arch_path : m->path ? m->path : "megac"};
        diag_note(d, &from, 0, 0, "the model's dims are read from here: dim %d, hidden_dim %d, n_heads %d, n_kv_heads "
                  "%d, head_dim %d, vocab_size %d", m->dim, m->hidden_dim, m->n_heads, m->n_kv_heads, m->head_dim,
                  m->vocab_size);
    }
    return ok;
}

bool weights_pairing_check(const Weights *w, Diag *d, const char *path, RopePairing src)
{
    static const char *const names[] = {"adjacent", "half"};
    if (w->m->rope_pairing == src)
        return true;
    diag_file_error(d, path, "this file's q/k rows use RoPE pairing '%s', but the model description says '%s'",
                    names[src], names[w->m->rope_pairing]);
    return false;
}

void convert_to_f32(float *dst, const void *src, int64_t n, SrcType t)
{
    const unsigned char *p = src;
    switch (t) {
    case SRC_F32:
        memcpy(dst, p, (size_t)n * 4); /* hosts are little-endian */
        break;
    case SRC_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        break;
    case SRC_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        break;
    }
}

/* ---- slots ---- */

static void slot_shape(const ModelDesc *m, WKind k, int64_t *rows, int64_t *cols)
{
    int64_t q = (int64_t)m->n_heads * m->head_dim, kv = (int64_t)m->n_kv_heads * m->head_dim;
    int64_t r = 0, c = 0;
    switch (k) {
    case WK_EMBED: case WK_LM_HEAD: r = m->vocab_size; c = m->dim; break;
    case WK_ATTN_NORM: case WK_FFN_NORM: case WK_FINAL_NORM: r = m->dim; break;
    case WK_WQ: r = q; c = m->dim; break;
    case WK_WK: case WK_WV: r = kv; c = m->dim; break;
    case WK_BQ: r = q; break;
    case WK_BK: case WK_BV: r = kv; break;
    case WK_WO: r = m->dim; c = q; break;
    case WK_W_GATE: case WK_W_UP: r = m->hidden_dim; c = m->dim; break;
    case WK_W_DOWN: r = m->dim; c = m->hidden_dim; break;
    case WK_COUNT: die("bad tensor kind");
    }
    *rows = r;
    *cols = c;
}

static float **slot_field(Weights *w, WKind k, int l)
{
    LayerWeights *L = l >= 0 ? &w->layers[l] : NULL;
    switch (k) {
    case WK_EMBED: return &w->tok_embed;
    case WK_FINAL_NORM: return &w->final_norm;
    case WK_LM_HEAD: return &w->lm_head;
    case WK_ATTN_NORM: return &L->attn_norm;
    case WK_WQ: return &L->wq;
    case WK_WK: return &L->wk;
    case WK_WV: return &L->wv;
    case WK_BQ: return &L->bq;
    case WK_BK: return &L->bk;
    case WK_BV: return &L->bv;
    case WK_WO: return &L->wo;
    case WK_FFN_NORM: return &L->ffn_norm;
    case WK_W_GATE: return &L->w_gate;
    case WK_W_UP: return &L->w_up;
    case WK_W_DOWN: return &L->w_down;
    case WK_COUNT: break;
    }
    die("bad tensor kind");
}

float *weights_slot_dst(Weights *w, WKind k, int layer)
{
    return *slot_field(w, k, layer);
}

/* ---- f32 views ---- */

/* A matrix's f32 view, mapped on its own: zero pages that take memory only
 * as the loader writes them (a description that claims a far larger model
 * than its file holds costs address space, not memory, until the loader
 * refuses the file), and that WEIGHTS_STORED_ONLY gives back to the
 * system once the matrix is stored. */
struct WView {
    float *p;
    size_t bytes;
};

float *weights_view_new(Weights *w, int64_t n)
{
    size_t bytes = sizeof(float) * (size_t)n;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    w->nbytes += bytes;
    ASSERT(w->nviews < w->capqt);
    w->views[w->nviews++] = (struct WView){p, bytes};
    return p;
}

/* Unmaps the view *field points to (when it is a view of its own) and
 * clears the pointer. */
static void view_release(Weights *w, float **field)
{
    for (int i = 0; i < w->nviews && *field; i++)
        if (w->views[i].p == *field) {
            munmap(w->views[i].p, w->views[i].bytes);
            w->views[i] = w->views[--w->nviews];
            break;
        }
    *field = NULL;
}

void weights_keep_stored(Weights *w, const WSlot *s, const float *dst, DType dt, const void *bytes)
{
    if (dt == DT_F32 || !s->cols || dst != s->dst)
        return;
    Arena a = {0};
    QTensor *q = weights_qtensor_put(w, wslot_canon_name(&a, s), dt, s->rows, s->cols);
    ASSERT(q->nbytes == dtype_row_bytes(dt, s->cols) * (size_t)s->rows);
    if (q->data)
        memcpy(q->data, bytes, q->nbytes);
    arena_free(&a);
}

void weights_embed_f32(const Weights *w, float *out)
{
    const ModelDesc *m = w->m;
    if (!w->embed_unwritten) {
        memcpy(out, w->tok_embed, sizeof(float) * (size_t)m->vocab_size * (size_t)m->dim);
        return;
    }
    const QTensor *e = weights_qtensor(w, "embed");
    size_t rb = dtype_row_bytes(e->dtype, e->cols);
    for (int64_t r = 0; r < e->rows; r++)
        quant_row_dequant(e->dtype, e->data + (size_t)r * rb, e->cols, out + r * e->cols);
}

/* The one wording of a tensor with a NaN or infinity at element `at`. */
static void non_finite_error(Diag *d, const char *file, const char *name, int64_t at)
{
    diag_file_error(d, file, "tensor '%s' has a non-finite value (NaN or infinity) at element %" PRId64, name, at);
}

int weights_fetch_stored(Weights *w, const WSlot *s, const float *dst, DType dt, const void *bytes,
                         const char *file, const char *name, Diag *d)
{
    if (w->dtypes_only) {
        weights_keep_stored(w, s, dst, dt, NULL);
        return WFETCH_DTYPE;
    }
    if (!w->stored_only || !s->cols || dst != s->dst || dt == DT_F32)
        return 0;
    Arena a = {0};
    bool yes = quant_stored_suffices(w, wslot_canon_name(&a, s), dt);
    arena_free(&a);
    if (!yes)
        return 0;
    int64_t at = quant_stored_first_non_finite(dt, bytes, s->rows, s->cols);
    if (at >= 0) {
        non_finite_error(d, file, name, at);
        return -1;
    }
    weights_keep_stored(w, s, dst, dt, bytes);
    return WFETCH_STORED;
}

size_t weights_held_bytes(const Weights *w)
{
    size_t n = 0;
    for (int i = 0; i < w->nqt; i++)
        n += w->qt[i].nbytes;
    if (!w->stored_only)
        return n + w->nbytes;
    for (int i = 0; i < w->nviews; i++)
        n += w->views[i].bytes;
    return n;
}

static bool slot_wanted(const ModelDesc *m, WKind k);

size_t weights_stored_bytes(const Weights *w, int *nf32)
{
    const ModelDesc *m = w->m;
    Arena a = {0};
    int n;
    const WSlot *s = weights_slots(w, &a, &n);
    size_t total = 0;
    *nf32 = 0;
    for (int i = 0; i < n; i++) {
        bool head = s[i].kind == WK_LM_HEAD;
        if ((head && m->tie_embeddings && !w->head_own) || (!head && !slot_wanted(m, s[i].kind)))
            continue;
        const QTensor *q = s[i].cols ? weights_qtensor(w, wslot_canon_name(&a, &s[i])) : NULL;
        if (q) {
            total += q->nbytes;
            continue;
        }
        total += sizeof(float) * (size_t)s[i].rows * (size_t)(s[i].cols ? s[i].cols : 1);
        *nf32 += s[i].cols > 0;
    }
    arena_free(&a);
    return total;
}

/* Allocates tensor k of layer l (-1: global): matrices as views, vectors
 * in the arena. False when a view cannot be mapped. */
static bool slot_alloc(Weights *w, WKind k, int l)
{
    int64_t rows, cols;
    slot_shape(w->m, k, &rows, &cols);
    w->nslots++;
    if (cols)
        return (*slot_field(w, k, l) = weights_view_new(w, rows * cols)) != NULL;
    *slot_field(w, k, l) = ARENA_ARRAY(&w->arena, float, rows);
    w->nbytes += (size_t)rows * sizeof(float);
    return true;
}

/* 1 when x is a NaN or an infinity (its exponent bits all set). */
static uint32_t f32_exponent_full(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7f800000u) == 0x7f800000u;
}

/* The index of the first NaN or infinity among p[0..n), or -1. The scan
 * ORs an integer test in blocks of a fixed length, which GCC vectorizes at
 * -O2 (a float compare or an open-ended loop it would not); only a bad
 * tensor is scanned twice. */
static int64_t first_non_finite(const float *p, int64_t n)
{
    enum { BLOCK = 64 };
    uint32_t bad = 0;
    int64_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        for (int j = 0; j < BLOCK; j++)
            bad |= f32_exponent_full(p[i + j]);
    for (; i < n; i++)
        bad |= f32_exponent_full(p[i]);
    for (i = 0; bad && i < n; i++)
        if (!isfinite(p[i]))
            return i;
    return -1;
}

/* A loaded tensor with a NaN or infinity is an error naming it as the
 * file does. */
static bool slot_finite_check(Weights *w, WKind k, int layer, int64_t n, const char *file, Diag *d)
{
    int64_t at = first_non_finite(*slot_field(w, k, layer), n);
    if (at < 0)
        return true;
    Arena a = {0};
    WSlot s = {.kind = k, .layer = layer};
    WeightFormat f = w->m->weights_format;
    char *name = f == WFMT_GGUF           ? wslot_gguf_name(&a, &s)
                 : f == WFMT_SAFETENSORS ? wslot_hf_name(&a, &s)
                 : f == WFMT_LLAMA2C     ? wslot_l2c_name(&a, &s)
                                         : wslot_canon_name(&a, &s);
    non_finite_error(d, file ? file : w->m->weights_path ? w->m->weights_path : w->m->path, name, at);
    arena_free(&a);
    return false;
}

bool weights_slot_done(Weights *w, WKind k, int layer, const char *file, Diag *d)
{
    return weights_slot_done_ex(w, k, layer, file, false, d);
}

bool weights_slot_done_ex(Weights *w, WKind k, int layer, const char *file, bool stored, Diag *d)
{
    int64_t rows, cols;
    slot_shape(w->m, k, &rows, &cols);
    ASSERT(!stored || (w->stored_only && cols));
    if (stored && k == WK_EMBED)
        w->embed_unwritten = true;
    bool written = !stored && !w->dtypes_only;
    if (written && !slot_finite_check(w, k, layer, rows * (cols ? cols : 1), file, d))
        return false;
    w->slots_done++;
    if (stored)
        w->stored_kept++;
    else if (written)
        w->loaded_bytes += sizeof(float) * (size_t)(rows * (cols ? cols : 1));
    if (w->progress)
        w->progress->fn(w->progress->ctx, w->slots_done, w->nslots, w->loaded_bytes);
    if (!w->stored_only || layer < 0 || !cols)
        return true;
    float **field = slot_field(w, k, layer);
    WSlot s = {.kind = k, .layer = layer, .rows = rows, .cols = cols, .dst = *field};
    Arena a = {0};
    char *name = wslot_canon_name(&a, &s);
    const QTensor *q = weights_qtensor(w, name);
    DType src = q ? q->dtype : DT_F32;
    bool ok = quant_slot(w, &s, d);
    /* kept from the file's bytes, so its view was never written: what the
     * knob made of it must come from those bytes alone */
    ASSERT(!ok || !stored ||
           ((q = weights_qtensor(w, name)) != NULL && (q->dtype == src || dtype_layout(q->dtype) == src)));
    if (ok && weights_qtensor(w, name))
        view_release(w, field);
    arena_free(&a);
    return ok;
}

static bool slot_wanted(const ModelDesc *m, WKind k)
{
    if (k == WK_BQ || k == WK_BK || k == WK_BV)
        return m->qkv_bias;
    return k != WK_LM_HEAD || !m->tie_embeddings;
}

/* Parameters of the model's matrices, the embedding and classifier both
 * counted. */
static double model_params(const ModelDesc *m)
{
    double q = (double)m->n_heads * m->head_dim, kv = (double)m->n_kv_heads * m->head_dim;
    double per_layer = 2.0 * q * m->dim + 2.0 * kv * m->dim + 3.0 * m->hidden_dim * m->dim;
    return 2.0 * m->vocab_size * m->dim + m->n_layers * per_layer;
}

/* Every tensor's storage; false (reported) when the views do not fit the
 * address space (a description far beyond any machine's models). */
static bool slots_alloc(Weights *w, Diag *d)
{
    const ModelDesc *m = w->m;
    w->layers = ARENA_ARRAY(&w->arena, LayerWeights, m->n_layers);
    w->capqt = 2 + (WK_W_DOWN - WK_ATTN_NORM + 1) * m->n_layers;
    w->qt = ARENA_ARRAY(&w->arena, QTensor, w->capqt);
    w->views = ARENA_ARRAY(&w->arena, struct WView, w->capqt);
    bool ok = slot_alloc(w, WK_EMBED, -1);
    for (int l = 0; ok && l < m->n_layers; l++)
        for (WKind k = WK_ATTN_NORM; ok && k <= WK_W_DOWN; k++)
            if (slot_wanted(m, k))
                ok = slot_alloc(w, k, l);
    ok = ok && slot_alloc(w, WK_FINAL_NORM, -1);
    w->head_own = slot_wanted(m, WK_LM_HEAD);
    if (w->head_own)
        ok = ok && slot_alloc(w, WK_LM_HEAD, -1);
    else
        w->lm_head = w->tok_embed;
    if (!ok)
        diag_file_error(d, m->path ? m->path : "megac", "model too large for this machine's address space: "
                        "%.3g parameters, mapped as f32 while they load (%s)", model_params(m), strerror(errno));
    return ok;
}

static void slot_push(Weights *w, WSlot *v, int *n, WKind k, int l)
{
    if (!slot_wanted(w->m, k))
        return;
    WSlot *s = &v[(*n)++];
    s->kind = k;
    s->layer = l;
    slot_shape(w->m, k, &s->rows, &s->cols);
    s->dst = *slot_field(w, k, l);
}

const WSlot *weights_slots(const Weights *w, Arena *a, int *n)
{
    Weights *mw = (Weights *)w; /* slot_field only reads through it here */
    WSlot *v = ARENA_ARRAY(a, WSlot, 3 + (WK_W_DOWN - WK_ATTN_NORM + 1) * w->m->n_layers);
    *n = 0;
    slot_push(mw, v, n, WK_EMBED, -1);
    for (int l = 0; l < w->m->n_layers; l++)
        for (WKind k = WK_ATTN_NORM; k <= WK_W_DOWN; k++)
            slot_push(mw, v, n, k, l);
    slot_push(mw, v, n, WK_FINAL_NORM, -1);
    slot_push(mw, v, n, WK_LM_HEAD, -1);
    return v;
}

/* ---- filling from a source of named tensors ---- */

/* A file with q/k/v biases for a model without them would load "fine" and
 * give wrong answers: refuse it. */
static bool weights_bias_check(const Weights *w, const WSource *src, Arena *a, Diag *d)
{
    for (int l = 0; l < w->m->n_layers && !w->m->qkv_bias; l++) {
        WSlot b = {.kind = WK_BQ, .layer = l};
        char *name = src->name(a, &b);
        if (src->has(src->ctx, name)) {
            diag_file_error(d, src->path, "tensor '%s': the file has q/k/v biases, but the model description "
                            "says qkv_bias: false", name);
            return false;
        }
    }
    return true;
}

/* A tied model whose file carries its own classifier: fine when it is a
 * copy of the embedding, an error when it differs. Its shape and dtype
 * are checked by a header-only read (WEIGHTS_DTYPES_ONLY) too, as a load
 * checks them, where only its values go unread. */
static bool weights_tied_check(const Weights *w, const WSource *src, Arena *a, Diag *d)
{
    const ModelDesc *m = w->m;
    WSlot head = {.kind = WK_LM_HEAD, .layer = -1, .rows = m->vocab_size, .cols = m->dim};
    char *name = src->name(a, &head);
    if (!m->tie_embeddings || !src->has(src->ctx, name))
        return true;
    if (w->dtypes_only) {
        float unread; /* not the slot's buffer: the fetch records no dtype for it */
        return src->fetch(src->ctx, name, &head, &unread, d) > 0;
    }
    size_t bytes = (size_t)wslot_nelem(&head) * sizeof(float);
    float *tmp = xmalloc(bytes), *embed = w->embed_unwritten ? xmalloc(bytes) : w->tok_embed;
    if (w->embed_unwritten)
        weights_embed_f32(w, embed);
    bool ok = src->fetch(src->ctx, name, &head, tmp, d) > 0;
    if (ok && memcmp(tmp, embed, bytes) != 0) {
        diag_file_error(d, src->path, "tensor '%s': the file has a separate classifier, but the model "
                        "description says tie_embeddings: true", name);
        ok = false;
    }
    free(tmp);
    if (embed != w->tok_embed)
        free(embed);
    return ok;
}

/* Whether `name` is the file's name of one of the model's tensors in
 * layer `layer` (-1: a global one), q/k/v biases and a tied model's
 * classifier included (weights_bias_check and weights_tied_check judge
 * those); only matrices when `matrix`. */
static bool name_is_slot(const Weights *w, const WSource *src, Arena *a, const char *name, int layer, bool matrix)
{
    for (WKind k = 0; k < WK_COUNT; k++) {
        int64_t rows, cols;
        slot_shape(w->m, k, &rows, &cols);
        WSlot s = {.kind = k, .layer = layer};
        if (wkind_is_per_layer(k) == (layer >= 0) && (!matrix || cols) && strcmp(src->name(a, &s), name) == 0)
            return true;
    }
    return false;
}

/* A name the model uses, or one the loader knows (src->known, or a
 * matrix's ".weight" spelled with one of src->weight_parts); `rest` is
 * what follows "<prefix><layer>." in a layer's name. */
static bool name_known(const Weights *w, const WSource *src, Arena *a, const char *name, const char *rest, int layer)
{
    if (name_is_slot(w, src, a, name, layer, false))
        return true;
    for (const char *const *k = src->known; k && *k; k++)
        if (strcmp(layer >= 0 ? rest : name, *k) == 0)
            return true;
    size_t n = strlen(name);
    for (const char *const *p = src->weight_parts; p && *p; p++) {
        size_t pn = strlen(*p);
        if (n > pn && strcmp(name + n - pn, *p) == 0 &&
            name_is_slot(w, src, a, arena_printf(a, "%.*s.weight", (int)(n - pn), name), layer, true))
            return true;
    }
    return false;
}

/* layer := digits without a sign or a leading zero, then '.' and more:
 * the layer number (INT_MAX for a larger one), *rest what follows the
 * '.'; -1 when the name is not so. */
static int name_layer(const char *s, const char **rest)
{
    int64_t l = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++)
        l = l * 10 + (*p - '0') > INT_MAX ? INT_MAX : l * 10 + (*p - '0');
    if (p == s || (*s == '0' && p > s + 1) || *p != '.' || !p[1])
        return -1;
    *rest = p + 1;
    return (int)l;
}

/* Every name the file lists: a tensor without a name, or with a layer the
 * model lacks (a file of more layers than the description's n_layers, or
 * a name no loader would ask for: "blk.-1.", "blk.x."), is refused, where
 * it would be dropped without a word; names neither the model nor the
 * loader knows are dropped with one warning (a newer converter may add
 * tensors megac has no use for). */
static bool weights_names_check(const Weights *w, const WSource *src, Diag *d)
{
    const ModelDesc *m = w->m;
    size_t plen = strlen(src->layer_prefix), len;
    int64_t nunknown = 0;
    char *first = NULL;
    Arena keep = {0};
    const char *s;
    for (int64_t i = 0; src->tensor && (s = src->tensor(src->ctx, i, &len)) != NULL; i++) {
        if (len == 0 || memchr(s, 0, len)) {
            if (len == 0)
                diag_file_error(d, src->path, "tensor %" PRId64 " (counting from 0) has an empty name", i);
            else
                diag_file_error(d, src->path, "tensor name '%s\\u0000...' contains a NUL character (byte %zu of the "
                                "name)", s, strlen(s));
            arena_free(&keep);
            return false;
        }
        Arena a = {0};
        char *name = arena_strndup(&a, s, len);
        const char *rest = name;
        bool per_layer = strncmp(name, src->layer_prefix, plen) == 0;
        int layer = per_layer ? name_layer(name + plen, &rest) : -1;
        bool ok = !per_layer || (layer >= 0 && layer < m->n_layers);
        if (per_layer && layer < 0)
            diag_file_error(d, src->path, "tensor '%s': a layer's tensor needs its layer number (0 to %d) and '.' "
                            "after '%s'", name, m->n_layers - 1, src->layer_prefix);
        else if (!ok)
            diag_file_error(d, src->path, "tensor '%s': the file has more layers than the model description's "
                            "n_layers (%d)", name, m->n_layers);
        else if (!name_known(w, src, &a, name, rest, layer) && !nunknown++)
            first = arena_strdup(&keep, name);
        arena_free(&a);
        if (!ok) {
            arena_free(&keep);
            return false;
        }
    }
    if (nunknown) {
        SrcFile f = {.path = src->path};
        diag_warning(d, &f, 0, 0, "ignoring %" PRId64 " tensor%s the model does not use: '%s'%s", nunknown,
                     nunknown > 1 ? "s" : "", first, nunknown > 1 ? " and others" : "");
    }
    arena_free(&keep);
    return true;
}

/* Where slot s of a layer that lacks its own tensor is read out of a
 * fused one (src->fused): *f is s as a part of it, the name its tensor's,
 * *lacks the name of the tensor whose absence says so; NULL where it is
 * not (the slot's own name is then asked for). */
static char *slot_fused(const Weights *w, const WSource *src, Arena *a, const WSlot *s, WSlot *f, char **lacks)
{
    for (const WFused *g = src->fused; g && g->name && s->layer >= 0; g++) {
        int64_t at = 0, total = 0, rows, cols;
        int i = -1;
        for (int j = 0; g->kinds[j] != WK_COUNT; j++) {
            slot_shape(w->m, g->kinds[j], &rows, &cols);
            if (g->kinds[j] == s->kind)
                i = j, at = total;
            total += rows;
        }
        if (i < 0)
            continue;
        WSlot first = {.kind = g->kinds[0], .layer = s->layer};
        char *fused = arena_printf(a, "%s%d.%s", src->layer_prefix, s->layer, g->name);
        *lacks = src->name(a, &first);
        if (src->has(src->ctx, *lacks) || !src->has(src->ctx, fused))
            return NULL;
        *f = *s;
        f->row0 = at;
        f->fused_rows = total;
        return fused;
    }
    return NULL;
}

bool weights_fill(Weights *w, const WSource *src, Diag *d)
{
    Arena a = {0};
    int n;
    const WSlot *slots = weights_slots(w, &a, &n);
    bool ok = weights_names_check(w, src, d);
    for (int i = 0; i < n && ok; i++) { /* stops at the first bad tensor: one error, not a cascade */
        WSlot part;
        char *lacks = NULL, *name = slot_fused(w, src, &a, &slots[i], &part, &lacks);
        const WSlot *s = name ? &part : &slots[i];
        if (!name)
            name = src->name(&a, s);
        int r = src->fetch(src->ctx, name, s, s->dst, d);
        if (r == 0)
            diag_file_error(d, src->path, "tensor '%s' is missing", name);
        if (r < 0 && s == &part) {  /* a damaged file may look fused where it only lacks a tensor */
            SrcFile f = {.path = src->path};
            diag_note(d, &f, 0, 0, "read as a fused tensor (Phi-3's layout: its rows %" PRId64 " to %" PRId64 "), "
                      "since layer %d has no '%s'", part.row0, part.row0 + part.rows - 1, part.layer, lacks);
        }
        ok = r > 0 && weights_slot_done_ex(w, slots[i].kind, slots[i].layer,
                                            src->file ? src->file(src->ctx, name) : src->path, r == WFETCH_STORED, d);
    }
    ok = ok && weights_bias_check(w, src, &a, d) && weights_tied_check(w, src, &a, d);
    arena_free(&a);
    return ok;
}

/* ---- the entry points ---- */

/* Refuses shapes whose element counts are nonsense (the description's own
 * checks live in desc.c; this only guards the allocation). */
/* A single weight file (llama2.c, GGUF) far too small for a large model
 * the description implies (over a GiB of f32 views): under one bit a
 * parameter (megac's smallest format takes 4.5, so that a file of a
 * format it does not read still hears about that from the loader), it is
 * refused before any view is mapped. Smaller claims are the loaders' to
 * judge, with their own messages. */
static bool weights_file_size_check(const ModelDesc *m, double params, Diag *d)
{
    struct stat st;
    if ((m->weights_format != WFMT_LLAMA2C && m->weights_format != WFMT_GGUF) || !m->weights_path ||
        stat(m->weights_path, &st) != 0 || !S_ISREG(st.st_mode))
        return true; /* the loader reports a missing file */
    if (4.0 * params <= (double)(1u << 30) || (double)st.st_size >= params / 8.0)
        return true;
    diag_file_error(d, m->weights_path,
                    "the model description implies %.3g parameters (dim %d, hidden_dim %d, %d layers, vocab %d), "
                    "but this file holds only %lld bytes",
                    params, m->dim, m->hidden_dim, m->n_layers, m->vocab_size, (long long)st.st_size);
    return false;
}

/* held: the tensors' values will be loaded (not WEIGHTS_DTYPES_ONLY, whose
 * views are never written). */
static bool weights_dims_check(const ModelDesc *m, bool held, Diag *d)
{
    const char *path = m->path ? m->path : "megac";
    if (m->dim <= 0 || m->hidden_dim <= 0 || m->n_layers <= 0 || m->n_heads <= 0 || m->n_kv_heads <= 0 ||
        m->head_dim <= 0 || m->vocab_size <= 0 || m->n_layers > MODEL_MAX_LAYERS) {
        diag_file_error(d, path, "model dimensions must be positive (and at most %d layers) to load weights",
                        MODEL_MAX_LAYERS);
        return false;
    }
    double total = model_params(m);
    if (held && total > 1e11) {
        diag_file_error(d, path, "model too large to hold in f32: %.3g parameters", total);
        return false;
    }
    /* the embedding counted once: it may be the classifier too */
    return weights_file_size_check(m, total - (double)m->vocab_size * m->dim, d);
}

/* WEIGHTS_STORED_ONLY's last step: the embedding's and classifier's f32
 * views go once they are stored (a layer's matrices went as they were
 * loaded). */
static void weights_globals_release(Weights *w)
{
    bool tied = !w->head_own;
    if (w->head_own && weights_qtensor(w, "lm_head"))
        view_release(w, &w->lm_head);
    if (weights_qtensor(w, "embed")) {
        view_release(w, &w->tok_embed);
        if (tied)
            w->lm_head = NULL;
    }
}

bool weights_load(Weights *w, const ModelDesc *m, Diag *d)
{
    return weights_load_ex(w, m, 0, NULL, d);
}

bool weights_load_ex(Weights *w, const ModelDesc *m, unsigned flags, const WeightsProgress *p, Diag *d)
{
    memset(w, 0, sizeof *w);
    w->m = m;
    w->progress = p;
    w->dtypes_only = (flags & WEIGHTS_DTYPES_ONLY) != 0;
    w->stored_only = w->dtypes_only || (flags & WEIGHTS_STORED_ONLY) != 0;
    if (!weights_dims_check(m, !w->dtypes_only, d))
        return false;
    if (!slots_alloc(w, d)) {
        weights_free(w);
        return false;
    }
    int before = d->nerrors;
    bool ok = false;
    switch (m->weights_format) {
    case WFMT_LLAMA2C: /* all f32: nothing in the file decides a dtype, but its header is checked */
        w->pairing = m->rope_pairing;
        ok = load_llama2c(w, m->weights_path, d);
        break;
    case WFMT_SAFETENSORS: ok = load_safetensors(w, m->weights_path, d); break;
    case WFMT_GGUF: ok = load_gguf(w, m->weights_path, d); break;
    case WFMT_SYNTHETIC:
        w->pairing = m->rope_pairing;
        ok = w->dtypes_only || synthetic_fill(w, d);
        break;
    }
    ok = ok && d->nerrors == before && quant_apply(w, d);
    if (!ok || d->nerrors > before) {
        weights_free(w);
        return false;
    }
    if (w->stored_only)
        weights_globals_release(w);
    return true;
}

void weights_free(Weights *w)
{
    for (int i = 0; i < w->nviews; i++)
        munmap(w->views[i].p, w->views[i].bytes);
    w->views = NULL;
    w->nviews = 0;
    arena_free(&w->arena);
    w->tok_embed = w->final_norm = w->lm_head = NULL;
    w->layers = NULL;
    w->nbytes = 0;
    w->qt = NULL;
    w->nqt = w->capqt = 0;
}

/* Parses "L<l>.<kind>" or a global name into (kind, layer). */
static bool canon_parse(const char *name, int n_layers, WKind *k, int *layer)
{
    *layer = -1;
    const char *suffix = name;
    if (name[0] == 'L' && name[1] >= '0' && name[1] <= '9') {
        char *end;
        long l = strtol(name + 1, &end, 10);
        if (*end != '.' || l >= n_layers)
            return false;
        *layer = (int)l;
        suffix = end + 1;
    }
    for (int i = 0; i < WK_COUNT; i++)
        if (strcmp(suffix, wkind_canon_names[i]) == 0 && wkind_is_per_layer((WKind)i) == (*layer >= 0)) {
            *k = (WKind)i;
            return true;
        }
    return false;
}

const float *weights_tensor(const Weights *w, const char *name, int64_t *nelem)
{
    WKind k;
    int layer;
    if (!w->layers || !canon_parse(name, w->m->n_layers, &k, &layer))
        return NULL;
    const float *p = *slot_field((Weights *)w, k, layer);
    if (!p)
        return NULL;
    int64_t rows, cols;
    slot_shape(w->m, k, &rows, &cols);
    if (nelem)
        *nelem = rows * (cols ? cols : 1);
    return p;
}

/* ---- storage in other dtypes ---- */

static QTensor *qtensor_find(const Weights *w, const char *name)
{
    for (int i = 0; i < w->nqt; i++)
        if (strcmp(w->qt[i].name, name) == 0)
            return &w->qt[i];
    return NULL;
}

QTensor *weights_qtensor_put(Weights *w, const char *name, DType t, int64_t rows, int64_t cols)
{
    QTensor *q = qtensor_find(w, name);
    if (!q) {
        ASSERT(w->nqt < w->capqt);
        q = &w->qt[w->nqt++];
        q->name = arena_strdup(&w->arena, name);
    }
    q->dtype = t;
    q->rows = rows;
    q->cols = cols;
    q->nbytes = (size_t)rows * dtype_row_bytes(t, cols);
    q->data = w->dtypes_only ? NULL : arena_alloc(&w->arena, q->nbytes);
    return q;
}

void weights_qtensor_drop(Weights *w, const char *name)
{
    QTensor *q = qtensor_find(w, name);
    if (q)
        *q = w->qt[--w->nqt];
}

bool weights_head_separate(const Weights *w)
{
    return w->head_own;
}

const QTensor *weights_qtensor(const Weights *w, const char *name)
{
    if (strcmp(name, "lm_head") == 0 && !weights_head_separate(w))
        name = "embed";
    return qtensor_find(w, name);
}

DType weights_dtype(const Weights *w, const char *name)
{
    const QTensor *q = weights_qtensor(w, name);
    return q ? q->dtype : DT_F32;
}
