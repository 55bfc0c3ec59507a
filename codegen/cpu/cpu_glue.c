/*
 * cpu_glue.c - the glue module of the CPU kernel, built with the LLVM C API:
 * the validated schedule serialized as constant tables (the layout of
 * kernel_table.h, which kernel_body.c reads), the model shape as constants
 * the op bodies get specialized to, which opcodes and dtypes the schedule
 * uses (so that O3 drops the bodies of the others), and the constants the runtime reads
 * from kernel.so (megac_kernel_abi, megac_schedule_hash, megac_num_workers,
 * megac_kernel_facts).
 */
#include "codegen/cpu/cpu.h"
#include "codegen/cpu/kernel_table.h"
#include "runtime/kernel_abi.h"

#include <stdlib.h>

_Static_assert(INST_OP == 0 && INST_SIGNAL == 1 && INST_WAIT == 2, "kernel_body.c's K_INST_* mirror InstKind");
_Static_assert(KT_DTYPES < KT_STRIDE, "instruction words fit the stride");
_Static_assert(OP_MAX_PARAMS == 6 && OP_MAX_OPERANDS == 5, "kernel_table.h reserves 6 params, 5 operands");

/* Operand word: byte offset of the buffer, KT_ARENA unless it is a weight. */
static uint64_t glue_operand_word(const Schedule *s, uint32_t buf)
{
    if (buf == BUF_NONE)
        return KT_NONE;
    const Buffer *b = &s->bufs[buf];
    ASSERT(b->offset < KT_ARENA);
    return b->cls == BUF_WEIGHT ? b->offset : (b->offset | KT_ARENA);
}

void cpu_inst_encode(const Schedule *s, const Inst *in, const bool *out, uint64_t *words)
{
    for (int i = 0; i < KT_STRIDE; i++)
        words[i] = 0;
    words[KT_KIND] = in->kind;
    words[KT_OP] = in->op;
    words[KT_COUNTER] = in->counter;
    words[KT_AMOUNT] = in->amount;
    for (int i = 0; i < OP_MAX_PARAMS; i++)
        words[KT_PARAM + i] = (uint64_t)(int64_t)in->p[i];
    for (int i = 0; i < OP_MAX_OPERANDS; i++)
        words[KT_OPND + i] = KT_NONE;
    if (in->kind != INST_OP)
        return;
    for (int i = 0; i < in->nacc; i++) {
        uint32_t buf = s->accs[in->acc + (uint32_t)i].buf;
        words[KT_OPND + i] = glue_operand_word(s, buf);
        if (buf != BUF_NONE)
            words[KT_DTYPES] |= (uint64_t)s->bufs[buf].dtype << (8 * i);
    }
    if (sched_inst_output_only(s, in, out))
        words[KT_DTYPES] |= KT_OUTPUT_ONLY;
}

static LLVMValueRef glue_global(LLVMModuleRef m, const char *name, LLVMValueRef init, unsigned align)
{
    LLVMValueRef g = LLVMAddGlobal(m, LLVMTypeOf(init), name);
    LLVMSetInitializer(g, init);
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMExternalLinkage);
    if (align)
        LLVMSetAlignment(g, align);
    return g;
}

static uint32_t glue_ninst(const Schedule *s)
{
    uint64_t n = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        n += s->workers[w].ninst;
    ASSERT(n < INT32_MAX / KT_STRIDE);
    return (uint32_t)n;
}

/* megac_k_insts: every worker's instructions, in order; megac_k_wstart. */
static void glue_tables(LLVMModuleRef m, LLVMContextRef ctx, const Schedule *s)
{
    LLVMTypeRef i64 = LLVMInt64TypeInContext(ctx), i32 = LLVMInt32TypeInContext(ctx);
    uint32_t n = glue_ninst(s), k = 0;
    LLVMValueRef *words = xmalloc(((size_t)n + 1) * KT_STRIDE * sizeof *words);
    LLVMValueRef *starts = xmalloc(((size_t)s->nworkers + 1) * sizeof *starts);
    uint64_t enc[KT_STRIDE];
    bool *out = sched_output_bufs(s);
    for (uint32_t w = 0; w < s->nworkers; w++) {
        starts[w] = LLVMConstInt(i32, k, 0);
        for (uint32_t i = 0; i < s->workers[w].ninst; i++, k++) {
            cpu_inst_encode(s, &s->workers[w].insts[i], out, enc);
            for (int j = 0; j < KT_STRIDE; j++)
                words[(size_t)k * KT_STRIDE + (size_t)j] = LLVMConstInt(i64, enc[j], 0);
        }
    }
    starts[s->nworkers] = LLVMConstInt(i32, k, 0);
    if (n == 0) /* keep the array non-empty */
        for (int j = 0; j < KT_STRIDE; j++)
            words[j] = LLVMConstInt(i64, 0, 0);
    glue_global(m, KT_SYM_INSTS, LLVMConstArray(i64, words, (n ? n : 1) * KT_STRIDE), 64);
    glue_global(m, KT_SYM_WSTART, LLVMConstArray(i32, starts, s->nworkers + 1), 16);
    free(words);
    free(starts);
    free(out);
}

static void glue_shape(LLVMModuleRef m, LLVMContextRef ctx, const ModelShape *sh)
{
    LLVMTypeRef i64 = LLVMInt64TypeInContext(ctx);
    int64_t v[KS_COUNT] = {
        [KS_DIM] = sh->dim,
        [KS_HIDDEN_DIM] = sh->hidden_dim,
        [KS_N_LAYERS] = sh->n_layers,
        [KS_N_HEADS] = sh->n_heads,
        [KS_N_KV_HEADS] = sh->n_kv_heads > 0 ? sh->n_kv_heads : 1,
        [KS_HEAD_DIM] = sh->head_dim,
        [KS_VOCAB] = sh->vocab_size,
        [KS_MAX_SEQ] = sh->max_seq,
        [KS_ROPE_PAIRING] = sh->rope_pairing,
    };
    LLVMValueRef c[KS_COUNT];
    for (int i = 0; i < KS_COUNT; i++)
        c[i] = LLVMConstInt(i64, (unsigned long long)v[i], 1);
    glue_global(m, KT_SYM_SHAPE, LLVMConstArray(i64, c, KS_COUNT), 16);
    glue_global(m, KT_SYM_EPS, LLVMConstReal(LLVMFloatTypeInContext(ctx), (float)sh->norm_eps), 4);
}

/* megac_kernel_facts: what this kernel is built with (kernel_abi.h). */
static void glue_facts(LLVMModuleRef m, LLVMContextRef ctx, const Schedule *s)
{
    uint64_t v[MEGAC_NFACTS];
    cg_kernel_facts(s, v);
    LLVMTypeRef i64 = LLVMInt64TypeInContext(ctx);
    LLVMValueRef c[MEGAC_NFACTS];
    for (int i = 0; i < MEGAC_NFACTS; i++)
        c[i] = LLVMConstInt(i64, v[i], 0);
    glue_global(m, "megac_kernel_facts", LLVMConstArray(i64, c, MEGAC_NFACTS), 8);
}

/* megac_kv_layout: where the KV cache is, for a context shift (kernel_abi.h). */
static void glue_kv_layout(LLVMModuleRef m, LLVMContextRef ctx, const Schedule *s)
{
    uint64_t *v = xmalloc((MEGAC_KVL_CACHES + 2 * (size_t)(s->shape.n_layers > 0 ? s->shape.n_layers : 0)) * sizeof *v);
    uint32_t n = cg_kv_layout(s, v);
    LLVMTypeRef i64 = LLVMInt64TypeInContext(ctx);
    LLVMValueRef *c = xmalloc(n * sizeof *c);
    for (uint32_t i = 0; i < n; i++)
        c[i] = LLVMConstInt(i64, v[i], 0);
    glue_global(m, "megac_kv_layout", LLVMConstArray(i64, c, n), 8);
    free(c);
    free(v);
}

/* megac_k_ops, megac_k_dts: the opcodes and operand dtypes of the schedule. */
static void glue_used(LLVMModuleRef m, LLVMContextRef ctx, const Schedule *s)
{
    uint32_t ops;
    uint64_t dts;
    cg_used(s, &ops, &dts);
    glue_global(m, KT_SYM_OPS, LLVMConstInt(LLVMInt32TypeInContext(ctx), ops, 0), 4);
    glue_global(m, KT_SYM_DTS, LLVMConstInt(LLVMInt64TypeInContext(ctx), dts, 0), 8);
}

LLVMModuleRef cpu_glue_build(LLVMContextRef ctx, const Schedule *s)
{
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext("megac_glue", ctx);
    LLVMTypeRef i64 = LLVMInt64TypeInContext(ctx), i32 = LLVMInt32TypeInContext(ctx);
    glue_tables(m, ctx, s);
    glue_shape(m, ctx, &s->shape);
    glue_global(m, KT_SYM_NWORKERS, LLVMConstInt(i32, s->nworkers, 0), 4);
    glue_used(m, ctx, s);
    glue_global(m, "megac_kernel_abi", LLVMConstInt(i64, MEGAC_KERNEL_ABI, 0), 8);
    glue_global(m, "megac_schedule_hash", LLVMConstInt(i64, sched_hash(s), 0), 8);
    glue_global(m, "megac_num_workers", LLVMConstInt(i32, s->nworkers, 0), 4);
    glue_facts(m, ctx, s);
    glue_kv_layout(m, ctx, s);
    return m;
}
