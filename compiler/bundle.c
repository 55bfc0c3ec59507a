/*
 * bundle.c - writes a bundle folder NAME.megac/ next to the kernel that
 * codegen already put there:
 *   weights.bin     every BUF_WEIGHT buffer at its sched_layout offset
 *                   (64-byte aligned, gaps zero): a tensor held in the
 *                   buffer's dtype (quantized, GGUF blocks) as stored,
 *                   others converted from the loaded f32 tensors to the
 *                   buffer's dtype; "rope" is computed by rope_table_fill.
 *                   Block rows go in the byte order of the target's
 *                   kernel where it has one (quant_kernel_order: the
 *                   CPU's 4-bit packing, CUDA's aligned block data; same
 *                   bytes per row, moved within it)
 *   schedule.sched  sched_print of the schedule
 *   tokenizer.bin   tok_save
 *   manifest.yaml   flat `key: value` lines that runtime/bundle.c reads;
 *                   see there for the keys and what the runtime checks;
 *                   among them the kernel file's size and FNV-1a hash, so
 *                   that a damaged kernel is refused before it is loaded
 * The manifest is written last, so a folder without one is an unfinished
 * bundle that megac_open refuses.
 */
#include "compiler/compile.h"
#include "compiler/quant.h"
#include "runtime/kernel_abi.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define BUNDLE_FORMAT 3     /* runtime/backend.h's RT_FORMAT_VERSION */

static int buf_cmp_offset(const void *a, const void *b)
{
    const Buffer *x = *(const Buffer *const *)a, *y = *(const Buffer *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* The f32 values of weight buffer b (xmalloc'd, b->nelem of them), or NULL
 * with an error. */
static float *bundle_tensor_f32(const Buffer *b, const ModelDesc *m, const Weights *w, Diag *d)
{
    float *v = xmalloc(sizeof(float) * (size_t)b->nelem);
    if (strcmp(b->name, "rope") == 0) {
        if (b->nelem != (int64_t)m->max_seq * m->head_dim) {
            diag_file_error(d, m->path, "weight buffer 'rope' has %" PRId64 " elements, expected %d x %d",
                            b->nelem, m->max_seq, m->head_dim);
            free(v);
            return NULL;
        }
        rope_table_fill(m, v);
        return v;
    }
    int64_t n = 0;
    const float *src = weights_tensor(w, b->name, &n);
    if (!src || n != b->nelem) {
        if (!src)
            diag_file_error(d, m->path, "the schedule needs weight '%s', which the model does not have", b->name);
        else
            diag_file_error(d, m->path, "weight '%s' has %" PRId64 " elements, the schedule expects %" PRId64,
                            b->name, n, b->nelem);
        free(v);
        return NULL;
    }
    memcpy(v, src, sizeof(float) * (size_t)n);
    return v;
}

/* Converts n f32 values to dtype t into out (dtype_bytes(t, n) bytes). */
static bool bundle_convert(DType t, const float *v, int64_t n, unsigned char *out)
{
    switch (t) {
    case DT_F32:
        memcpy(out, v, sizeof(float) * (size_t)n);
        return true;
    case DT_F16:
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = t == DT_F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        return true;
    default:
        return false;
    }
}

/* Writes n zero bytes. */
static bool bundle_zeros_write(FILE *f, uint64_t n)
{
    static const unsigned char zeros[4096];
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (fwrite(zeros, 1, k, f) != k)
            return false;
        n -= k;
    }
    return true;
}

/* Writes n stored bytes at *at. */
static bool bundle_bytes_write(FILE *f, uint64_t *at, const void *p, size_t n, const char *path, Diag *d)
{
    if (fwrite(p, 1, n, f) != n) {
        diag_file_error(d, path, "cannot write: %s", strerror(errno));
        return false;
    }
    *at += n;
    return true;
}

/* Writes stored bytes of buffer b, in the byte order of target's kernel
 * (quant_kernel_order). */
static bool bundle_stored_write(FILE *f, uint64_t *at, const Buffer *b, const QTensor *q, const char *target,
                                const char *path, Diag *d)
{
    unsigned char *p = xmalloc(q->nbytes);
    bool ok = quant_kernel_order(target, b->dtype, q->rows, q->cols, q->data, p)
                  ? bundle_bytes_write(f, at, p, q->nbytes, path, d)
                  : bundle_bytes_write(f, at, q->data, q->nbytes, path, d);
    free(p);
    return ok;
}

/* Appends buffer b at its offset: zero padding up to it, then its bytes. */
static bool bundle_weight_write(FILE *f, uint64_t *at, const Buffer *b, const ModelDesc *m, const Weights *w,
                                const char *target, const char *path, Diag *d)
{
    if (b->offset < *at || b->offset % 64)
        die("weight buffer '%s' at offset %" PRIu64 " (written up to %" PRIu64 "): bad layout", b->name,
            b->offset, *at);
    if (!bundle_zeros_write(f, b->offset - *at))
        goto io;
    *at = b->offset;
    const QTensor *q = weights_qtensor(w, b->name);
    if (q && q->dtype == b->dtype) /* quantized (or GGUF) bytes as stored */
        return bundle_stored_write(f, at, b, q, target, path, d);
    float *v = bundle_tensor_f32(b, m, w, d);
    if (!v)
        return false;
    size_t bytes = dtype_tensor_bytes(b->dtype, b->rank, b->shape);
    unsigned char *out = xmalloc(bytes);
    bool ok = bundle_convert(b->dtype, v, b->nelem, out);
    if (!ok)
        diag_file_error(d, m->path, "weight '%s': dtype %s is not supported in bundles yet", b->name,
                        dtype_name(b->dtype));
    size_t wrote = ok ? fwrite(out, 1, bytes, f) : bytes;
    free(v);
    free(out);
    if (!ok)
        return false;
    if (wrote != bytes)
        goto io;
    *at += bytes;
    return true;
io:
    diag_file_error(d, path, "cannot write: %s", strerror(errno));
    return false;
}

static bool bundle_weights_write(const char *path, const Schedule *s, const ModelDesc *m, const Weights *w,
                                 const WeightsProgress *p, Diag *d)
{
    const Buffer **ws = xcalloc(s->nbufs + 1, sizeof *ws);
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nbufs; i++)
        if (s->bufs[i].cls == BUF_WEIGHT)
            ws[n++] = &s->bufs[i];
    qsort(ws, n, sizeof *ws, buf_cmp_offset);
    FILE *f = fopen(path, "wb");
    if (!f) {
        diag_file_error(d, path, "cannot create: %s", strerror(errno));
        free(ws);
        return false;
    }
    uint64_t at = 0;
    bool ok = true;
    for (uint32_t i = 0; ok && i < n; i++) {
        ok = bundle_weight_write(f, &at, ws[i], m, w, s->target, path, d);
        if (p)
            p->fn(p->ctx, (int)i + 1, (int)n, at);
    }
    if (ok && (at > s->weights_bytes || !bundle_zeros_write(f, s->weights_bytes - at))) {
        diag_file_error(d, path, "cannot write the %" PRIu64 "-byte weights: %s", s->weights_bytes, strerror(errno));
        ok = false;
    }
    if (fclose(f) != 0 && ok) {
        diag_file_error(d, path, "cannot write: %s", strerror(errno));
        ok = false;
    }
    free(ws);
    return ok;
}

uint64_t bundle_read_bytes(const Schedule *s)
{
    uint64_t total = 0;
    for (uint32_t wi = 0; wi < s->nworkers; wi++) {
        const Worker *wk = &s->workers[wi];
        for (uint32_t i = 0; i < wk->ninst; i++) {
            const Inst *in = &wk->insts[i];
            for (uint32_t a = 0; in->kind == INST_OP && a < in->nacc; a++) {
                const Access *ac = &s->accs[in->acc + a];
                if (ac->buf == BUF_NONE || s->bufs[ac->buf].cls != BUF_WEIGHT || !(ac->mode & ACC_R))
                    continue;
                const Buffer *b = &s->bufs[ac->buf];
                int64_t n = affine_at(ac->hi, 0) - affine_at(ac->lo, 0);
                if (in->op == OP_EMBED)
                    n = in->p[1] - in->p[0];
                int64_t blk = dtype_block(b->dtype), cols = b->shape[b->rank - 1];
                if (dtype_is_rowwise(b->dtype) && b->rank == 2 && n % cols == 0)
                    total += (uint64_t)(n / cols) * dtype_row_bytes(b->dtype, cols);
                else
                    total += dtype_bytes(b->dtype, (n + blk - 1) / blk * blk);
            }
        }
    }
    return total;
}

/* Arena offset of io buffer `name`, or false with an error. */
static bool bundle_io_offset(const Schedule *s, const char *name, DType t, uint64_t *off, Diag *d)
{
    int64_t b = sched_find_buffer(s, name);
    if (b < 0 || s->bufs[b].cls != BUF_IO || s->bufs[b].dtype != t) {
        diag_file_error(d, s->path ? s->path : s->name, "the schedule has no %s io buffer '%s' for the runtime",
                        dtype_name(t), name);
        return false;
    }
    *off = s->bufs[b].offset;
    return true;
}

/* Size and FNV-1a hash of the kernel file that codegen wrote. */
static bool bundle_kernel_hash(const char *path, uint64_t *bytes, uint64_t *hash, Diag *d)
{
    size_t len;
    char *text = read_file(path, &len);
    if (!text) {
        diag_file_error(d, path, "cannot read the kernel: %s", strerror(errno));
        return false;
    }
    *bytes = len;
    *hash = hash_fnv1a(text, len, HASH_FNV_INIT);
    free(text);
    return true;
}

static bool bundle_manifest_write(const char *path, const char *dir, const ModelDesc *m, const Tokenizer *t,
                                  const Schedule *s, const char *kernel_file, uint64_t hash, Diag *d)
{
    uint64_t otok, ologits, onext, kbytes, khash, wbytes, whash;
    const char *slash = strrchr(kernel_file, '/'), *kname = slash ? slash + 1 : kernel_file;
    char *kpath = xasprintf("%s/%s", dir, kname), *wpath = xasprintf("%s/weights.bin", dir);
    bool ok = bundle_kernel_hash(kpath, &kbytes, &khash, d);
    if (ok && !file_hash_bulk(wpath, &wbytes, &whash)) {
        diag_file_error(d, wpath, "cannot read it back to hash it: %s", strerror(errno));
        ok = false;
    }
    free(kpath);
    free(wpath);
    if (!ok || !bundle_io_offset(s, "tok", DT_I32, &otok, d) ||
        !bundle_io_offset(s, "logits", DT_F32, &ologits, d) || !bundle_io_offset(s, "next", DT_I32, &onext, d))
        return false;
    FILE *f = fopen(path, "w");
    if (!f) {
        diag_file_error(d, path, "cannot create: %s", strerror(errno));
        return false;
    }
    int bos = m->bos_id >= 0 ? m->bos_id : tok_bos(t), eos = m->eos_id >= 0 ? m->eos_id : tok_eos(t);
    fprintf(f, "# megac bundle: read by runtime/bundle.c, written by compiler/bundle.c\n");
    fprintf(f, "format: %d\nname: %s\ntarget: %s\nkernel: %s\n", BUNDLE_FORMAT, m->name, s->target, kname);
    fprintf(f, "kernel_bytes: %" PRIu64 "\nkernel_hash: %016" PRIx64 "\nkernel_abi: %u\n", kbytes, khash,
            MEGAC_KERNEL_ABI);
    fprintf(f, "schedule_hash: %016" PRIx64 "\nweights_bytes: %" PRIu64 "\nweights_hash: %016" PRIx64
            "\nweights_read_bytes: %" PRIu64 "\n", hash, s->weights_bytes, whash, bundle_read_bytes(s));
    fprintf(f, "arena_bytes: %" PRIu64 "\ncounters: %u\nworkers: %u\n", s->arena_bytes, s->nctrs, s->nworkers);
    fprintf(f, "vocab: %d\nmax_seq: %d\nbos: %d\neos: %d\n", m->vocab_size, m->max_seq, bos, eos);
    fprintf(f, "io_tok: %" PRIu64 "\nio_logits: %" PRIu64 "\nio_next: %" PRIu64 "\n", otok, ologits, onext);
    if (ferror(f) | (fclose(f) != 0)) {
        diag_file_error(d, path, "cannot write: %s", strerror(errno));
        return false;
    }
    return true;
}

/* schedule.sched; returns its FNV-1a hash (what the kernel records). */
static bool bundle_schedule_write(const char *path, const Schedule *s, uint64_t *hash, Diag *d)
{
    char *text = sched_to_string(s);
    size_t len = strlen(text);
    *hash = hash_fnv1a(text, len, HASH_FNV_INIT);
    if (*hash != sched_hash(s))
        die("sched_hash() is %016" PRIx64 " but the FNV-1a of the schedule text is %016" PRIx64, sched_hash(s),
            *hash);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(text, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok)
        diag_file_error(d, path, "cannot write: %s", strerror(errno));
    free(text);
    return ok;
}

bool bundle_write(const char *dir, const ModelDesc *m, const Weights *w, const Tokenizer *t, const Schedule *s,
                  const char *kernel_file, const WeightsProgress *p, Diag *d)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        diag_file_error(d, dir, "cannot create the bundle folder: %s", strerror(errno));
        return false;
    }
    if (tok_vocab(t) > m->vocab_size) {
        diag_file_error(d, m->path, "the tokenizer has %d tokens, more than the model's vocabulary of %d",
                        tok_vocab(t), m->vocab_size);
        return false;
    }
    char *manifest = xasprintf("%s/manifest.yaml", dir);
    char *weights = xasprintf("%s/weights.bin", dir);
    char *sched = xasprintf("%s/schedule.sched", dir);
    char *tokp = xasprintf("%s/tokenizer.bin", dir);
    char err[512];
    uint64_t hash = 0;
    remove(manifest);   /* a half-written bundle must not look complete */
    bool ok = bundle_schedule_write(sched, s, &hash, d) && bundle_weights_write(weights, s, m, w, p, d);
    if (ok && !tok_save(t, tokp, err, sizeof err)) {
        diag_file_error(d, tokp, "%s", err);
        ok = false;
    }
    ok = ok && bundle_manifest_write(manifest, dir, m, t, s, kernel_file, hash, d);
    free(manifest);
    free(weights);
    free(sched);
    free(tokp);
    return ok;
}
