/*
 * ir.c - building a Schedule in memory: buffers, counters, per-worker
 * instruction lists and their accesses, the memory layout (weights blob and
 * runtime arena offsets) and the schedule's hash.
 *
 * Names live in the schedule's arena; arrays grow with VEC_*; everything is
 * released at once by sched_free.
 */
#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

static const char *const bufclass_names[] = {"weight", "state", "kv", "scratch", "io"};
_Static_assert(sizeof bufclass_names / sizeof bufclass_names[0] == BUF_CLASS_COUNT, "bufclass names");

const char *bufclass_name(BufClass c)
{
    ASSERT(c < BUF_CLASS_COUNT);
    return bufclass_names[c];
}

Schedule *sched_new(const char *name, const char *target, int nworkers)
{
    ASSERT(nworkers >= 0);
    Schedule *s = xcalloc(1, sizeof *s);
    s->name = arena_strdup(&s->arena, name);
    s->target = arena_strdup(&s->arena, target);
    s->nworkers = (uint32_t)nworkers;
    s->workers = xcalloc(nworkers ? (size_t)nworkers : 1, sizeof *s->workers);
    return s;
}

void sched_free(Schedule *s)
{
    if (!s)
        return;
    for (uint32_t w = 0; w < s->nworkers; w++)
        free(s->workers[w].insts);
    free(s->workers);
    free(s->bufs);
    free(s->ctrs);
    free(s->accs);
    arena_free(&s->arena);
    free(s);
}

uint32_t sched_add_buffer(Schedule *s, const char *name, DType t, BufClass c, int rank, const int64_t *shape)
{
    ASSERT(rank >= 1 && rank <= 4 && t < DT_COUNT && c < BUF_CLASS_COUNT);
    Buffer b = {.name = arena_strdup(&s->arena, name), .dtype = t, .cls = c, .rank = rank, .nelem = 1};
    for (int i = 0; i < rank; i++) {
        ASSERT(shape[i] > 0);
        b.shape[i] = shape[i];
        b.nelem *= shape[i];
    }
    VEC_PUSH(s->bufs, s->nbufs, s->capbufs, b);
    return s->nbufs - 1;
}

uint32_t sched_add_counter(Schedule *s, const char *name)
{
    Counter c = {.name = arena_strdup(&s->arena, name)};
    VEC_PUSH(s->ctrs, s->nctrs, s->capctrs, c);
    return s->nctrs - 1;
}

int64_t sched_find_buffer(const Schedule *s, const char *name)
{
    for (uint32_t i = 0; i < s->nbufs; i++)
        if (strcmp(s->bufs[i].name, name) == 0)
            return i;
    return -1;
}

int64_t sched_find_counter(const Schedule *s, const char *name)
{
    for (uint32_t i = 0; i < s->nctrs; i++)
        if (strcmp(s->ctrs[i].name, name) == 0)
            return i;
    return -1;
}

static Inst *sched_inst_push(Schedule *s, int w, Inst in)
{
    ASSERT(w >= 0 && (uint32_t)w < s->nworkers);
    Worker *wk = &s->workers[w];
    VEC_PUSH(wk->insts, wk->ninst, wk->cap, in);
    return &wk->insts[wk->ninst - 1];
}

void sched_op(Schedule *s, int w, int op, const int32_t *params, const Access *acc)
{
    const OpInfo *oi = op_info(op);
    Inst in = {.kind = INST_OP, .op = (uint8_t)op, .nacc = (uint16_t)oi->noperands, .acc = s->naccs};
    for (int i = 0; i < oi->nparams; i++)
        in.p[i] = params[i];
    for (int i = 0; i < oi->noperands; i++)
        VEC_PUSH(s->accs, s->naccs, s->capaccs, acc[i]);
    sched_inst_push(s, w, in);
}

void sched_signal(Schedule *s, int w, uint32_t counter, uint32_t k)
{
    ASSERT(counter < s->nctrs);
    sched_inst_push(s, w, (Inst){.kind = INST_SIGNAL, .counter = counter, .amount = k});
}

void sched_wait(Schedule *s, int w, uint32_t counter, uint32_t n)
{
    ASSERT(counter < s->nctrs);
    sched_inst_push(s, w, (Inst){.kind = INST_WAIT, .counter = counter, .amount = n});
}

static uint64_t align64(uint64_t x)
{
    return (x + 63) & ~(uint64_t)63;
}

void sched_layout(Schedule *s)
{
    uint64_t wofs = 0, aofs = 0;
    for (uint32_t i = 0; i < s->nbufs; i++) {
        Buffer *b = &s->bufs[i];
        uint64_t n = dtype_tensor_bytes(b->dtype, b->rank, b->shape);
        uint64_t *ofs = b->cls == BUF_WEIGHT ? &wofs : &aofs;
        b->offset = *ofs;
        *ofs = align64(*ofs + n);
    }
    s->weights_bytes = wofs;
    s->arena_bytes = aofs;
}

uint64_t sched_hash(const Schedule *s)
{
    char *t = sched_to_string(s);
    uint64_t h = hash_fnv1a(t, strlen(t), HASH_FNV_INIT);
    free(t);
    return h;
}

/* An op is output-only when it writes something and every buffer it writes
 * is in `out`. */
bool sched_inst_output_only(const Schedule *s, const Inst *in, const bool *out)
{
    if (in->kind != INST_OP)
        return false;
    int writes = 0;
    for (uint32_t i = 0; i < in->nacc; i++) {
        const Access *a = &s->accs[in->acc + i];
        if (a->buf == BUF_NONE || !(a->mode & ACC_W))
            continue;
        if (!out[a->buf])
            return false;
        writes++;
    }
    return writes > 0;
}

bool *sched_output_bufs(const Schedule *s)
{
    bool *out = xcalloc(s->nbufs ? s->nbufs : 1, sizeof *out);
    for (uint32_t b = 0; b < s->nbufs; b++)
        out[b] = s->bufs[b].cls == BUF_IO || s->bufs[b].cls == BUF_SCRATCH;
    /* Greatest fixpoint: a buffer that an op which runs anyway reads must be
     * written in every step. Each pass removes at least one buffer or ends. */
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t w = 0; w < s->nworkers; w++)
            for (uint32_t j = 0; j < s->workers[w].ninst; j++) {
                const Inst *in = &s->workers[w].insts[j];
                if (in->kind != INST_OP || sched_inst_output_only(s, in, out))
                    continue;
                for (uint32_t i = 0; i < in->nacc; i++) {
                    const Access *a = &s->accs[in->acc + i];
                    if (a->buf != BUF_NONE && (a->mode & ACC_R) && out[a->buf]) {
                        out[a->buf] = false;
                        changed = true;
                    }
                }
            }
    }
    return out;
}
