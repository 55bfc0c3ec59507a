/*
 * cpu_check.c - what the CPU backend can run. The validator has already
 * proved the schedule well formed, free of deadlocks and races; this pass
 * only rejects what the kernel body does not implement yet (activations
 * other than f32; weights other than f32, or, for the GEMV matrix and the
 * embedding table, the dtypes check_gemv_weight lists; oversized
 * normalized or int8-quantized GEMV inputs), op
 * params the bodies' loops cannot run with (op_footprint's checks: the
 * validator reports them too, but a kernel must never loop forever), and a
 * schedule whose buffers have no offsets, each as an error at the
 * instruction's .sched line. Operands follow op_operand_dtype (meta and
 * sel i32), an optional operand the params use must be there, and
 * quest_select's npages is at most CPU_QUEST_NPAGES_MAX.
 */
#include "codegen/cpu/cpu.h"
#include "codegen/cpu/kernel_table.h"

/* kernel_body.c's gemv_a8 has no unpacked rows for the GGUF 4- and 5-bit
 * A8 dtypes: every k it takes is packed. */
_Static_assert(CPU_NORM_K_MAX <= KT_PACK_K_MAX, "A8 GEMVs over k <= CPU_NORM_K_MAX must be packable");

/* Largest npages of a quest_select: op_quest_select (kernel_body.c)
 * ranks pages in a stack array of npages entries of 8 bytes. */
#define CPU_QUEST_NPAGES_MAX 4096

static SrcFile check_src(const Schedule *s)
{
    return (SrcFile){.path = s->path ? s->path : (s->name ? s->name : "<schedule>"), .text = NULL, .len = 0};
}

static const Buffer *check_operand(const Schedule *s, const Inst *in, int i)
{
    uint32_t b = s->accs[in->acc + (uint32_t)i].buf;
    return b == BUF_NONE ? NULL : &s->bufs[b];
}

/* Weight dtypes the GEMV body has a row kernel for (and the embedding a
 * gather for). A new one needs a case here and one in gemv_rows() and
 * qelem() of kernel_body.c. */
static bool check_gemv_weight(DType t)
{
    switch (t) {
    case DT_F32: case DT_F16: case DT_BF16: case DT_Q8_0: case DT_Q4_0: case DT_Q4_1: case DT_W8: case DT_W4G32:
    case DT_W4G64: case DT_W4G128: case DT_W8A8: case DT_W4A8G32: case DT_W4A8G64: case DT_W4A8G128:
    case DT_Q4_1A8: case DT_Q8_0A8: case DT_Q5_0A8: case DT_Q5_1A8: case DT_Q4_KA8: case DT_Q5_KA8: case DT_Q6_KA8:
    case DT_Q4_0A8: case DT_Q5_0: case DT_Q5_1: case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: case DT_Q3_K:
    case DT_Q2_K: case DT_IQ4_NL: case DT_IQ4_XS: case DT_IQ4_NLA8: case DT_IQ4_XSA8: case DT_Q3_KA8: case DT_Q2_KA8:
        return true;
    default:
        return false;
    }
}

/* Whether the kernel body handles operand i of the op in dtype t: GEMV
 * weights and the embedding table as check_gemv_weight says, the argmax
 * result i32 or f32, every other operand the dtype op_operand_dtype
 * (ir/ops.c) gives: the token, eviction meta and Quest's sel i32, the
 * rest (activations, norms, scores, bounds) f32; the KV caches f32, f16
 * or bf16. */
static bool check_dtype_ok(const Inst *in, int i, DType t)
{
    if ((in->op == OP_GEMV && i == 0) || (in->op == OP_EMBED && i == 1))
        return check_gemv_weight(t);
    if (in->op == OP_ARGMAX_COMBINE && i == 1)
        return t == DT_I32 || t == DT_F32;
    if (op_operand_is_cache(in, i))
        return dtype_is_cache(t);
    return t == op_operand_dtype(in, i);
}

static void check_operands(const Schedule *s, const Inst *in, Diag *d)
{
    const OpInfo *oi = op_info(in->op);
    SrcFile src = check_src(s);
    for (int i = 0; i < oi->noperands; i++) {
        const Buffer *b = check_operand(s, in, i);
        if (!b && op_operand_needed(in, i))
            diag_error(d, &src, in->line, 1, "%s operand '%s' is absent but its params need it", oi->name,
                       oi->operand[i]);
        if (!b)
            continue;
        if (!check_dtype_ok(in, i, b->dtype))
            diag_error(d, &src, in->line, 1, "%s operand '%s' (buffer '%s') of dtype %s is not supported by the CPU backend yet",
                       oi->name, oi->operand[i], b->name, dtype_name(b->dtype));
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
    Access fp[OP_MAX_OPERANDS];
    const char *why = NULL;
    if (!op_footprint(s, in, fp, &why)) /* params the bodies' loops rely on */
        diag_error(d, &src, in->line, 1, "%s: %s", op_info(in->op)->name, why);
    check_operands(s, in, d);
    const Buffer *w = in->op == OP_GEMV ? check_operand(s, in, 0) : NULL;
    if (w && dtype_is_a8(w->dtype) && in->p[2] > CPU_NORM_K_MAX)
        diag_error(d, &src, in->line, 1, "gemv with int8 activations over k = %d > %d inputs is not supported by "
                   "the CPU backend yet", in->p[2], CPU_NORM_K_MAX);
    if (in->op == OP_QUEST_SELECT && in->p[2] > CPU_QUEST_NPAGES_MAX)
        diag_error(d, &src, in->line, 1, "quest_select with npages = %d > %d is not supported by the CPU backend "
                   "(its page ranking keeps npages candidates on the stack)", in->p[2], CPU_QUEST_NPAGES_MAX);
    if (in->op == OP_GEMV && (in->p[3] & GEMV_NORM) && in->p[2] > CPU_NORM_K_MAX)
        diag_error(d, &src, in->line, 1, "gemv with norm over k = %d > %d inputs is not supported by the CPU backend yet",
                   in->p[2], CPU_NORM_K_MAX);
}

static bool check_layout(const Schedule *s, Diag *d)
{
    if (s->nbufs == 0 || s->weights_bytes != 0 || s->arena_bytes != 0)
        return true;
    diag_file_error(d, check_src(s).path, "schedule has no buffer layout (sched_layout was not run)");
    return false;
}

bool cpu_schedule_check(const Schedule *s, Diag *d)
{
    int before = d->nerrors;
    if (s->nworkers == 0)
        diag_file_error(d, check_src(s).path, "schedule has no workers");
    if (s->shape.head_dim % 2 != 0)
        diag_file_error(d, check_src(s).path, "head_dim %d is odd: RoPE needs pairs", s->shape.head_dim);
    check_layout(s, d);
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++)
            check_inst(s, &s->workers[w].insts[i], d);
    return d->nerrors == before;
}
