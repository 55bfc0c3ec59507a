/*
 * cuda_check.c - what the CUDA kernel body (kernel_body.cuh) can run. The
 * validator has already proved the schedule well formed, free of deadlocks
 * and races; this pass rejects what the body does not implement yet (f32
 * activations; f32, bf16, f16 or weight-only quantized GEMV weights and
 * embeddings; an i32 token; i32 eviction meta and page selections),
 * params of the sparse-attention and eviction ops their bodies cannot run,
 * a normalized GEMV input too long for the shared scratch, an attention head
 * group too large for it, and a schedule without a buffer layout. Errors
 * cite the instruction's .sched line.
 */
#include "codegen/cuda/cuda.h"

static SrcFile check_src(const Schedule *s)
{
    return (SrcFile){.path = s->path ? s->path : (s->name ? s->name : "<schedule>"), .text = NULL, .len = 0};
}

/* Whether the body reads operand i of `in` in dtype t: GEMV weights and
 * the embedding table f32, bf16, f16 or a quantized format other than the
 * int8-activation ones (w8a8, w4a8); the argmax result i32 or f32; every
 * other operand the dtype ops.c's op_operand_dtype gives (the token, the
 * eviction meta and Quest's sel i32, the rest f32), the KV caches f32,
 * f16 or bf16. */
static bool check_dtype_ok(const Inst *in, int i, DType t)
{
    if (in->op == OP_ARGMAX_COMBINE && i == 1)
        return t == DT_F32 || t == DT_I32;
    if ((in->op == OP_GEMV && i == 0) || (in->op == OP_EMBED && i == 1))
        return t == DT_F32 || t == DT_BF16 || t == DT_F16 || (dtype_is_quant(t) && !dtype_is_a8(t));
    if (op_operand_is_cache(in, i))
        return dtype_is_cache(t);
    return t == op_operand_dtype(in, i);
}

/* The new ops' params the bodies cannot run (the validator checks the
 * footprint; these are the bodies' own limits). */
static const char *check_params(const Schedule *s, const Inst *in)
{
    const int32_t *p = in->p;
    switch (in->op) {
    case OP_KV_STORE:
        return p[1] <= 0 ? "kv_store needs cap > 0" : NULL;
    case OP_ATTN_SPARSE:
        if (p[2] <= 0 || p[1] < 0 || p[1] >= p[2])
            return "attn_sparse needs nsplit > 0 and 0 <= s < nsplit";
        if (p[3] < 0 || p[3] >= SPARSE_KIND_COUNT)
            return "attn_sparse has an unknown kind";
        if (p[3] == SPARSE_SINK_WINDOW && (p[4] < 0 || p[5] <= 0))
            return "attn_sparse sink_window needs sinks >= 0 and window > 0";
        if (p[3] == SPARSE_QUEST && (p[4] <= 0 || p[5] <= 0))
            return "attn_sparse quest needs page > 0 and npages > 0";
        if (p[3] == SPARSE_SLOTS && (p[4] <= 0 || (p[5] != 0 && p[5] != 1)))
            return "attn_sparse slots needs cap > 0 and b (scores) 0 or 1";
        if (p[3] == SPARSE_SNAP && (p[4] <= 0 || p[5] != 0))
            return "attn_sparse snap needs a list capacity > 0 and b 0";
        if (p[3] == SPARSE_ROWS && (p[4] < 0 || p[4] >= s->shape.n_kv_heads || p[5] <= 0))
            return "attn_sparse rows needs 0 <= list head < kv_heads and a length > 0";
        return NULL;
    case OP_KV_SNAP:
        return p[1] <= 0 || p[1] >= p[0] || p[2] < 0 || s->shape.max_seq >= (1 << 24)
                   ? "kv_snap needs 0 < window < budget, safe >= 0, and max_seq < 2^24 (rows go through f32)"
                   : NULL;
    case OP_QUEST_SELECT:
        return p[1] <= 0 || p[2] <= 0 ? "quest_select needs page > 0 and npages > 0" : NULL;
    case OP_TOPK_SELECT:
        return p[1] <= 0 || p[2] <= 0 || p[2] > p[1] || p[3] < 0 || p[3] > 1000000 || s->shape.max_seq >= (1 << 24)
                   ? "topk_select needs 0 < b <= k, 0 <= ppm <= 10^6 and max_seq < 2^24"
                   : NULL;
    case OP_KV_EVICT:
        if (p[0] < 0 || p[0] >= KV_POLICY_COUNT)
            return "kv_evict has an unknown policy";
        if (p[1] <= 0 || p[1] >= (1 << 24) || p[2] < 0 || p[3] < 0 || p[4] <= 0)
            return "kv_evict needs 0 < cap < 2^24 (slot indices go through f32), sinks >= 0, window >= 0 and "
                   "nsplit > 0";
        if (p[0] != KV_POLICY_STREAMING && 2 * s->shape.n_heads > CUDA_SMEM_FLOATS_LIMIT)
            return "kv_evict keeps two floats per q head in shared memory: too many heads";
        return NULL;
    default:
        return NULL;
    }
}

static void check_operands(const Schedule *s, const Inst *in, Diag *d)
{
    const OpInfo *oi = op_info(in->op);
    SrcFile src = check_src(s);
    for (int i = 0; i < oi->noperands; i++) {
        uint32_t b = s->accs[in->acc + (uint32_t)i].buf;
        if (b == BUF_NONE && op_operand_needed(in, i))
            diag_error(d, &src, in->line, 1, "%s operand '%s' must be present with these params", oi->name,
                       oi->operand[i]);
        if (b == BUF_NONE)
            continue;
        DType t = s->bufs[b].dtype;
        if (!check_dtype_ok(in, i, t))
            diag_error(d, &src, in->line, 1,
                       "%s operand '%s' (buffer '%s') of dtype %s is not supported by the CUDA backend yet", oi->name,
                       oi->operand[i], s->bufs[b].name, dtype_name(t));
    }
}

static void check_inst(const Schedule *s, const Inst *in, Diag *d)
{
    SrcFile src = check_src(s);
    if (in->kind != INST_OP) {
        if (in->counter >= s->nctrs)
            diag_error(d, &src, in->line, 1, "counter %u out of range", in->counter);
        return;
    }
    if (in->op >= OP_COUNT || in->nacc != op_info(in->op)->noperands) {
        diag_error(d, &src, in->line, 1, "malformed op instruction (opcode %u, %u operands)", in->op, in->nacc);
        return;
    }
    check_operands(s, in, d);
    const char *why = check_params(s, in);
    if (why)
        diag_error(d, &src, in->line, 1, "%s: not supported by the CUDA backend", why);
    if (in->op == OP_GEMV && (in->p[3] & GEMV_NORM) && in->p[2] > CUDA_SMEM_FLOATS_MAX)
        diag_error(d, &src, in->line, 1,
                   "gemv with norm over k = %d > %d inputs is not supported by the CUDA backend yet", in->p[2],
                   CUDA_SMEM_FLOATS_MAX);
}

static void check_shape(const Schedule *s, Diag *d)
{
    const ModelShape *sh = &s->shape;
    const char *path = check_src(s).path;
    if (sh->head_dim <= 0 || sh->head_dim % 2 != 0)
        diag_file_error(d, path, "head_dim %d: RoPE needs a positive even head size", sh->head_dim);
    if (sh->n_kv_heads <= 0 || sh->n_heads % sh->n_kv_heads != 0)
        diag_file_error(d, path, "%d heads do not group over %d kv heads", sh->n_heads, sh->n_kv_heads);
    else if ((sh->n_heads / sh->n_kv_heads) * (sh->head_dim + 2) > CUDA_SMEM_FLOATS_LIMIT)
        diag_file_error(d, path, "a group of %d q heads of size %d does not fit the CUDA backend's shared memory",
                        sh->n_heads / sh->n_kv_heads, sh->head_dim);
    if (s->nbufs != 0 && s->weights_bytes == 0 && s->arena_bytes == 0)
        diag_file_error(d, path, "schedule has no buffer layout (sched_layout was not run)");
    if (s->nworkers == 0)
        diag_file_error(d, path, "schedule has no workers");
}

DType cuda_cache_dtype(const Schedule *s)
{
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            const Inst *in = &s->workers[w].insts[i];
            int kc = in->kind == INST_OP && in->op < OP_COUNT ? op_cache_operand(in, 0) : -1;
            if (kc >= 0 && kc < (int)in->nacc && s->accs[in->acc + kc].buf != BUF_NONE)
                return s->bufs[s->accs[in->acc + kc].buf].dtype;
        }
    return DT_F32;
}

/* The body is compiled for one cache dtype (MK_KVT): every cache operand
 * has it. */
static void check_caches(const Schedule *s, Diag *d)
{
    DType t = cuda_cache_dtype(s);
    SrcFile src = check_src(s);
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            const Inst *in = &s->workers[w].insts[i];
            for (int j = 0; in->kind == INST_OP && in->op < OP_COUNT && j < (int)in->nacc; j++) {
                uint32_t b = s->accs[in->acc + j].buf;
                if (op_operand_is_cache(in, j) && b != BUF_NONE && s->bufs[b].dtype != t)
                    diag_error(d, &src, in->line, 1,
                               "cache buffer '%s' is %s, another is %s: the CUDA backend keeps one cache dtype per "
                               "schedule", s->bufs[b].name, dtype_name(s->bufs[b].dtype), dtype_name(t));
            }
        }
}

bool cuda_schedule_check(const Schedule *s, Diag *d)
{
    int before = d->nerrors;
    check_shape(s, d);
    check_caches(s, d);
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++)
            check_inst(s, &s->workers[w].insts[i], d);
    return d->nerrors == before;
}
