/*
 * cuda_source.c - the text of a CUDA kernel for one validated schedule:
 *
 *   platform   cuda_prelude.cuh (NVRTC) or host_shim.h (the host)
 *   shape      #defines: the model constants the op bodies are specialized
 *              to, the block size, the shared scratch and attention layout,
 *              the opcodes and dtypes the schedule uses (MK_OPS, MK_DTS)
 *   schedule   megac_k_insts: the instructions as a stream of 32-bit
 *              words (2 per signal or wait, 2 + params + operands per op;
 *              kernel_body.cuh describes them), every worker's list in
 *              order; megac_k_wstart: the word where each worker's starts;
 *              megac_k_bufs: each buffer's byte offset, MK_ARENA_BIT set
 *              unless it is a weight
 *   constants  megac_kernel_abi, megac_schedule_hash, megac_num_workers,
 *              megac_kernel_facts (what the runtime checks the manifest against)
 *   body       kernel_body.cuh (op bodies, dispatch loop)
 *   entry      GPU: extern "C" __global__ megac_kernel(MegacArgs), one
 *              block per worker; host: megac_worker of host_shim.h
 */
#include "codegen/cuda/cuda.h"
#include "runtime/kernel_abi.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(INST_OP == 0 && INST_SIGNAL == 1 && INST_WAIT == 2, "kernel_body.cuh's MK_INST_* mirror InstKind");
_Static_assert(OP_EMBED == 0 && OP_RMSNORM == 1 && OP_GEMV == 2 && OP_ROPE == 3 && OP_KV_APPEND == 4 &&
                   OP_ATTN == 5 && OP_ATTN_COMBINE == 6 && OP_SILU_MUL == 7 && OP_ADD == 8 && OP_ARGMAX == 9 &&
                   OP_ARGMAX_COMBINE == 10 && OP_KV_STORE == 11 && OP_ATTN_SPARSE == 12 &&
                   OP_QUEST_SELECT == 13 && OP_KV_EVICT == 14 && OP_KV_SNAP == 15 && OP_TOPK_SELECT == 16 &&
                   OP_COUNT == 17,
               "kernel_body.cuh's MK_OP_* mirror OpCode");
_Static_assert(GEMV_ACCUM == 1 && GEMV_NORM == 2 && GEMV_BIAS == 4, "kernel_body.cuh's MK_GEMV_* mirror ops.h");
_Static_assert(SPARSE_SINK_WINDOW == 0 && SPARSE_QUEST == 1 && SPARSE_SLOTS == 2 && SPARSE_SNAP == 3 &&
                   SPARSE_ROWS == 4 && SPARSE_KIND_COUNT == 5 &&
                   SPARSE_BLOCK == 32 && KV_POLICY_STREAMING == 0 && KV_POLICY_H2O == 1 && KV_POLICY_TOVA == 2,
               "kernel_body.cuh's MK_SPARSE_* and MK_KV_* mirror ops.h");
_Static_assert(DT_F32 == 0 && DT_F16 == 1 && DT_BF16 == 2 && DT_I32 == 3 && DT_Q8_0 == 5 && DT_Q4_0 == 6 &&
                   DT_Q4_1 == 7 && DT_W8 == 8 && DT_W4G32 == 9 && DT_W4G64 == 10 && DT_W4G128 == 11 && DT_Q5_0 == 18 && DT_Q5_1 == 19 &&
                   DT_Q4_K == 20 && DT_Q5_K == 21 && DT_Q6_K == 22 && DT_IQ4_NL == 29 && DT_IQ4_XS == 30 &&
                   DT_Q3_K == 31 && DT_Q2_K == 32 && DT_COUNT <= 64,
               "kernel_body.cuh's MK_DT_*; 6 bits per dtype (5 operands and the output-only bit: 31 bits)");
_Static_assert(OP_MAX_PARAMS == 6 && OP_MAX_OPERANDS == 5, "instruction words: 6 params, 5 operands");
/* The prelude and the shim declare MegacArgs with plain C types. */
_Static_assert(sizeof(MegacArgs) == 72 && offsetof(MegacArgs, pos) == 32 && offsetof(MegacArgs, timeout_ns) == 40 &&
                   offsetof(MegacArgs, prompt_end) == 48 && offsetof(MegacArgs, spin_ns) == 56 &&
                   offsetof(MegacArgs, flags) == 64,
               "MegacArgs layout of cuda_prelude.cuh and host_shim.h");
_Static_assert(MEGAC_STEP_NO_OUTPUT == 1, "kernel_body.cuh's MK_STEP_NO_OUTPUT");
_Static_assert(sizeof(MegacAbort) == 24, "MegacAbort layout of cuda_prelude.cuh and host_shim.h");

static int source_max_gemv_k(const Schedule *s)
{
    int k = 1;
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            const Inst *in = &s->workers[w].insts[i];
            if (in->kind == INST_OP && in->op == OP_GEMV && in->p[2] > k)
                k = in->p[2];
        }
    return k;
}

/* Whether some GEMV right after a wait reads weights whose loads
 * mk_gemv_preload issues before the wait (f32, bf16, W8): without one,
 * kernel_body.cuh's preload path only costs registers (MK_PRELOADS 0). */
static bool source_preloadable(const Schedule *s)
{
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 1; i < s->workers[w].ninst; i++) {
            const Inst *in = &s->workers[w].insts[i];
            if (in->kind != INST_OP || in->op != OP_GEMV || s->workers[w].insts[i - 1].kind != INST_WAIT)
                continue;
            const Buffer *b = &s->bufs[s->accs[in->acc].buf];
            if (b->cls == BUF_WEIGHT && (b->dtype == DT_F32 || b->dtype == DT_BF16 || b->dtype == DT_W8))
                return true;
        }
    return false;
}

/* Whether a GEMV reads a weight in the CUDA block order. */
static bool source_block_rows(const Schedule *s)
{
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            const Inst *in = &s->workers[w].insts[i];
            if (in->kind != INST_OP || in->op != OP_GEMV)
                continue;
            if (dtype_is_cuda_ordered(s->bufs[s->accs[in->acc].buf].dtype))
                return true;
        }
    return false;
}

static int source_group(const Schedule *s)
{
    return s->shape.n_kv_heads > 0 ? s->shape.n_heads / s->shape.n_kv_heads : 1;
}

/* Floats of the shared scratch the serial ops use (kernel_body.cuh):
 * QUEST_SELECT 256 digit bins, a bound per warp, a digit and a rank;
 * KV_SNAP 256 bins, a digit and a rank; TOPK_SELECT those or two per thread;
 * KV_EVICT (reading scores) the max and sum of each q head's softmax. */
static int source_serial_smem(const Schedule *s, int threads)
{
    int need = 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            const Inst *in = &s->workers[w].insts[i];
            int n = 0;
            if (in->kind == INST_OP && in->op == OP_QUEST_SELECT)
                n = 256 + threads / 32 + 2;
            if (in->kind == INST_OP && in->op == OP_KV_SNAP)
                n = 256 + 2;
            if (in->kind == INST_OP && in->op == OP_TOPK_SELECT)
                n = 2 * threads > 256 + 2 ? 2 * threads : 256 + 2;
            if (in->kind == INST_OP && in->op == OP_KV_EVICT && in->p[0] != KV_POLICY_STREAMING)
                n = 2 * s->shape.n_heads;
            need = n > need ? n : need;
        }
    return need;
}

static int source_inst_encode(const Schedule *s, const Inst *in, const bool *out, uint32_t *w);

/* MEGAC_CUDA_DEFINES' NAME=N, else dflt. */
static long source_dev_int(const char *name, long dflt)
{
    size_t n = strlen(name);
    const char *e = getenv("MEGAC_CUDA_DEFINES");
    for (const char *p = e ? strstr(e, name) : NULL; p; p = strstr(p + 1, name))
        if ((p == e || p[-1] == ' ' || p[-1] == ',') && p[n] == '=')
            return strtol(p + n + 1, NULL, 10);
    return dflt;
}

/* Which lanes-per-row copies of the GEMV loop (kernel_body.cuh's
 * mk_gemv_nl: bit 0 for 8, 1 for 16, 2 for 32) this schedule's GEMVs can
 * take, with l's loads in flight and MK_NL_ONE_ROW: each copy is a whole
 * inlined loop, and compiling all three for every kernel cost NVRTC
 * 25-55% more time (Llama-3.2-1B W8A16 sm_80: 9.8 s against 7.6). A
 * superset (the split path, which takes none, counted too); a width the
 * mask leaves out reads its rows at 32 lanes, which is correct for any
 * row. */
static int source_nl_used(const Schedule *s, const CudaLayout *l)
{
    int used = 4, lanes_min = (int)source_dev_int("MK_ROW_LANES_MIN", 8), vloads = l->vloads;
    bool one_row = source_dev_int("MK_NL_ONE_ROW", 0) && source_dev_int("MK_PRELOADS", l->preloads) > 0;
    for (uint32_t w = 0; w < s->nworkers; w++)
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            const Inst *in = &s->workers[w].insts[i];
            if (in->kind != INST_OP || in->op != OP_GEMV)
                continue;
            DType t = s->bufs[s->accs[in->acc].buf].dtype;
            int k = (int)in->p[2], n;
            if ((t == DT_F32 && k % 4 == 0) || (t == DT_BF16 && k % 8 == 0))
                n = k / (t == DT_F32 ? 4 : 8);
            else if (t == DT_W8)
                n = k / 16;
            else if (l->block_lanes && dtype_is_cuda_ordered(t))
                n = t == DT_Q8_0 ? k / 16 : (k + 31) / 32;
            else
                continue;
            if (one_row && !dtype_is_cuda_ordered(t) && (int)(in->p[1] - in->p[0]) <= l->threads / 32)
                continue; /* a row a warp, with its preloads (MK_NL_ONE_ROW) */
            int nl = 32;
            while (nl > lanes_min && n <= nl / 2 * vloads)
                nl /= 2;
            used |= nl == 8 ? 1 : nl == 16 ? 2 : 4;
        }
    return used;
}

/* MEGAC_CUDA_DEFINES' MK_WSTAGE_BYTES=N (kernel_body.cuh's weight stage),
 * in whole 16-byte units: a size the launch needs as well as the kernel,
 * so the layout carries it (source_dev_defines leaves it out). */
static int source_wstage(void)
{
    long v = source_dev_int("MK_WSTAGE_BYTES", 0);
    if (v < 0)
        v = 0;
    return (int)((v > CUDA_WSTAGE_MAX ? CUDA_WSTAGE_MAX : v) / 16 * 16);
}

/* MEGAC_CUDA_DEFINES' MK_WPIPE=S (kernel_body.cuh's weight pipe): S
 * stages of CUDA_WPIPE_V 16-byte units a lane, for each warp, in dynamic
 * shared memory after the two stages; fewer where that would not fit the
 * target's shared memory a block beside 48 KiB of static scratch (sm_80
 * 163 KiB, sm_90 227, sm_120 99), none under 2 or with a weight stage. A
 * layout knob: the launch needs its size. */
static int source_wpipe(const Schedule *s, const CudaLayout *l, bool host, int *bytes)
{
    int st = (int)source_dev_int("MK_WPIPE", 0), per = (l->threads / 32) * CUDA_WPIPE_V * 32 * 16;
    long cap = 1L << 30;
    const char *t = s->target ? s->target : "";
    if (!host)
        cap = (strcmp(t, "sm_90") == 0 ? 227 : strcmp(t, "sm_80") == 0 ? 163 : 99) * 1024L - 48 * 1024L -
              l->wstage - l->istage;
    while (st > 1 && (long)st * per > cap)
        st--;
    if (st < 2 || l->wstage)
        st = 0;
    *bytes = st * per;
    return st;
}

/* The instruction stage (kernel_body.cuh): the buffer table (8 bytes a
 * buffer, padded to 16) and the longest worker's instruction words (padded
 * to 16 bytes), when both fit in CUDA_ISTAGE_MAX; else 0, and the kernel
 * reads its program from global memory. MEGAC_CUDA_DEFINES=MK_ISTAGE=0
 * turns it off, to compare. */
static int source_istage(const Schedule *s, int *bufs_pad)
{
    uint32_t enc[2 + OP_MAX_PARAMS + OP_MAX_OPERANDS];
    uint64_t most = 0;
    for (uint32_t w = 0; w < s->nworkers; w++) {
        uint64_t n = 0;
        for (uint32_t i = 0; i < s->workers[w].ninst; i++)
            n += (uint64_t)source_inst_encode(s, &s->workers[w].insts[i], NULL, enc);
        most = n > most ? n : most;
    }
    *bufs_pad = (int)((s->nbufs + 1) / 2 * 2);
    uint64_t bytes = 8 * (uint64_t)*bufs_pad + (most * 4 + 15) / 16 * 16;
    if (!source_dev_int("MK_ISTAGE", 1) || bytes > CUDA_ISTAGE_MAX)
        return 0;
    return (int)bytes;
}

CudaLayout cuda_layout(const Schedule *s, bool host)
{
    CudaLayout l;
    l.threads = host ? CUDA_THREADS_HOST : CUDA_THREADS_GPU;
    int k = source_max_gemv_k(s), per_warp = source_group(s) * (s->shape.head_dim + 2);
    l.smem_floats = k < CUDA_SMEM_FLOATS_MAX ? k : CUDA_SMEM_FLOATS_MAX;
    if (l.smem_floats < per_warp)
        l.smem_floats = per_warp;
    if (l.smem_floats < source_serial_smem(s, l.threads))
        l.smem_floats = source_serial_smem(s, l.threads);
    l.smem_floats = (l.smem_floats + 31) / 32 * 32; /* whole chunks of mk_xsw's swizzle */
    l.attn_warps = per_warp > 0 ? l.smem_floats / per_warp : 1;
    if (l.attn_warps > l.threads / 32)
        l.attn_warps = l.threads / 32;
    if (l.attn_warps < 1)
        l.attn_warps = 1;
    l.hdl = (s->shape.head_dim + 31) / 32;
    if (l.hdl < 1)
        l.hdl = 1;
    l.wstage = source_wstage();
    l.istage = source_istage(s, &l.bufs_pad);
    l.preloads = source_preloadable(s) && !l.wstage ? CUDA_PRELOADS : 0; /* the stage holds those rows */
    l.vloads = (int)source_dev_int("MK_VLOADS", CUDA_VLOADS); /* a developer's value, lowered like ours on spills */
    if (l.vloads < 2)
        l.vloads = 2;
    l.block_lanes = source_block_rows(s) && source_dev_int("MK_ROW_LANES_BLOCKS", 1) != 0;
    l.wpipe = source_wpipe(s, &l, host, &l.wpipe_bytes);
    return l;
}

/* MEGAC_CUDA_DEFINES="NAME=VALUE ..." adds #defines to the kernel: a
 * developer's knob for timing variants of the kernel body on a GPU
 * (MK_SKIP_OPS=1: synchronization only; MK_WAIT_SLEEP_MAX=0: spin without
 * __nanosleep). Bundles built with it print a warning; never for
 * measurements you report as megac's. */
static void source_dev_defines(FILE *f)
{
    const char *e = getenv("MEGAC_CUDA_DEFINES");
    if (!e || !*e)
        return;
    fprintf(stderr, "megac: warning: MEGAC_CUDA_DEFINES='%s' changes the generated kernel\n", e);
    char *copy = xstrdup(e), *save = NULL;
    for (char *t = strtok_r(copy, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        if (strncmp(t, "MK_WSTAGE_BYTES=", 16) == 0 || strncmp(t, "MK_ISTAGE=", 10) == 0 ||
            strncmp(t, "MK_VLOADS=", 10) == 0 || strncmp(t, "MK_ROW_LANES_BLOCKS=", 20) == 0 ||
            strncmp(t, "MK_WPIPE=", 9) == 0)
            continue; /* the layout's (source_wstage, source_istage, vloads, block_lanes, wpipe) */
        char *eq = strchr(t, '=');
        if (eq)
            *eq = ' ';
        fprintf(f, "#define %s\n", t);
    }
    free(copy);
}

static void source_shape(FILE *f, const Schedule *s, const CudaLayout *l)
{
    const ModelShape *sh = &s->shape;
    fprintf(f, "\n/* ---- generated by megac for schedule '%s' (target %s) ---- */\n", s->name ? s->name : "",
            s->target ? s->target : "");
    fprintf(f, "#define MK_THREADS %d\n#define MK_SMEM_FLOATS %d\n#define MK_AW %d\n#define MK_HDL %d\n", l->threads,
            l->smem_floats, l->attn_warps, l->hdl);
    fprintf(f, "#define MK_PRELOADS_AUTO %d\n#define MK_VLOADS_AUTO %d\n#define MK_WSTAGE_BYTES %d\n", l->preloads,
            l->vloads, l->wstage);
    fprintf(f, "#define MK_ISTAGE_BYTES %d\n#define MK_NBUFS_PAD %d\n", l->istage, l->bufs_pad);
    fprintf(f, "#define MK_ROW_LANES_BLOCKS %d\n", l->block_lanes);
    fprintf(f, "#define MK_WPIPE %d\n#define MK_WPIPE_V %d\n", l->wpipe, CUDA_WPIPE_V);
    fprintf(f, "#define MK_NL_USED %d\n", source_nl_used(s, l));
    /* a GEMV input longer than the staging scratch: read where it lies */
    fprintf(f, "#define MK_GEMV_UNSTAGED %d\n", source_max_gemv_k(s) > l->smem_floats);
    fprintf(f, "#define MK_DIM %d\n#define MK_HD %d\n#define MK_G %d\n#define MK_VOCAB %d\n#define MK_MAX_SEQ %d\n",
            sh->dim, sh->head_dim, source_group(s), sh->vocab_size, sh->max_seq);
    fprintf(f, "#define MK_NKV %d\n#define MK_NH (MK_G * MK_NKV)\n", sh->n_kv_heads);
    fprintf(f, "#define MK_ROPE_HALF %d\n#define MK_EPS %.9ef\n", sh->rope_pairing == 1, sh->norm_eps);
    fprintf(f, "#define MK_NWORKERS %uu\n#define MK_NCTRS %uu\n#define MK_ARENA_BIT 0x%llxull\n", s->nworkers,
            s->nctrs ? s->nctrs : 1, (unsigned long long)CUDA_ARENA_BIT);
    uint32_t ops;
    uint64_t dts;
    cg_used(s, &ops, &dts);     /* kernel_body.cuh compiles only these bodies */
    fprintf(f, "#define MK_OPS 0x%xu\n#define MK_DTS 0x%llxull\n", ops, (unsigned long long)dts);
    fprintf(f, "#define MK_KVT %d\n", (int)cuda_cache_dtype(s)); /* the caches' one dtype (cuda_check.c) */
    source_dev_defines(f);
}

/* One instruction as words of kernel_body.cuh's stream; returns how many. */
static int source_inst_encode(const Schedule *s, const Inst *in, const bool *out, uint32_t *w)
{
    if (in->kind != INST_OP) {
        ASSERT(in->counter < (1u << 24));
        w[0] = (uint32_t)in->kind | in->counter << 8;
        w[1] = in->amount;
        return 2;
    }
    const OpInfo *oi = op_info(in->op);
    int np = oi->nparams, n = 0;
    w[n++] = (uint32_t)in->kind | (uint32_t)in->op << 8 | (uint32_t)np << 16 | (uint32_t)in->nacc << 24;
    for (int i = 0; i < np; i++)
        w[n++] = (uint32_t)in->p[i];
    uint32_t dt = 0;
    for (int i = 0; i < in->nacc; i++) {
        uint32_t b = s->accs[in->acc + (uint32_t)i].buf;
        w[n++] = b;
        if (b != BUF_NONE)
            dt |= (uint32_t)s->bufs[b].dtype << (6 * i);
    }
    if (out && sched_inst_output_only(s, in, out))
        dt |= 1u << 31;     /* kernel_body.cuh's mk_skipped */
    w[n++] = dt;
    return n;
}

static void source_tables(FILE *f, const Schedule *s)
{
    uint32_t enc[2 + OP_MAX_PARAMS + OP_MAX_OPERANDS];
    uint32_t *start = xmalloc(sizeof *start * ((size_t)s->nworkers + 1));
    uint64_t n = 0;
    bool *out = sched_output_bufs(s);
    fprintf(f, "MK_TABLE unsigned megac_k_insts[] = {\n");
    for (uint32_t w = 0; w < s->nworkers; w++) {
        start[w] = (uint32_t)n;
        for (uint32_t i = 0; i < s->workers[w].ninst; i++) {
            int k = source_inst_encode(s, &s->workers[w].insts[i], out, enc);
            for (int j = 0; j < k; j++)
                fprintf(f, "%uu,", enc[j]);
            fputc(i % 8 == 7 ? '\n' : ' ', f);
            n += (uint64_t)k;
            ASSERT(n < INT32_MAX);
        }
        fputc('\n', f);
    }
    start[s->nworkers] = (uint32_t)n;
    free(out);
    if (n == 0)
        fprintf(f, "0u\n");
    fprintf(f, "};\nMK_TABLE int megac_k_wstart[] = {");
    for (uint32_t w = 0; w <= s->nworkers; w++)
        fprintf(f, "%u,", start[w]);
    free(start);
    fprintf(f, "};\nMK_TABLE unsigned long long megac_k_bufs[] = {\n");
    for (uint32_t b = 0; b < s->nbufs; b++) {
        const Buffer *bf = &s->bufs[b];
        ASSERT(bf->offset < CUDA_ARENA_BIT);
        fprintf(f, "0x%llxull, /* %s */\n",
                (unsigned long long)(bf->cls == BUF_WEIGHT ? bf->offset : bf->offset | CUDA_ARENA_BIT),
                strstr(bf->name, "*/") ? "" : bf->name);
    }
    if (s->nbufs == 0)
        fprintf(f, "0ull\n");
    fprintf(f, "};\n");
}

static void source_constants(FILE *f, const Schedule *s, const CudaLayout *l)
{
    uint64_t facts[MEGAC_NFACTS];
    cg_kernel_facts(s, facts);
    fprintf(f, "MK_EXPORT const unsigned long long megac_kernel_abi = %lluull;\n",
            (unsigned long long)MEGAC_KERNEL_ABI);
    fprintf(f, "MK_EXPORT const unsigned long long megac_schedule_hash = 0x%016llxull;\n",
            (unsigned long long)sched_hash(s));
    fprintf(f, "MK_EXPORT const unsigned megac_num_workers = %uu;\n", s->nworkers);
    /* the dynamic shared memory a launch gives each block (cuda_backend.c) */
    fprintf(f, "MK_EXPORT const unsigned megac_k_dyn_smem_bytes = %uu;\n", (unsigned)cuda_layout_dyn_smem(l));
    fprintf(f, "MK_EXPORT const unsigned long long megac_kernel_facts[%d] = {", MEGAC_NFACTS);
    for (int i = 0; i < MEGAC_NFACTS; i++)
        fprintf(f, "%s0x%llxull", i ? ", " : "", (unsigned long long)facts[i]);
    fprintf(f, "};\n");
    uint64_t *kv = xmalloc((MEGAC_KVL_CACHES + 2 * (size_t)(s->shape.n_layers > 0 ? s->shape.n_layers : 0)) * sizeof *kv);
    uint32_t n = cg_kv_layout(s, kv);
    fprintf(f, "MK_EXPORT const unsigned long long megac_kv_layout[%u] = {", n);
    for (uint32_t i = 0; i < n; i++)
        fprintf(f, "%s0x%llxull", i ? ", " : "", (unsigned long long)kv[i]);
    fprintf(f, "};\n");
    free(kv);
}

static const char source_gpu_entry[] =
    "\n/* ---- entry: one block per worker, launched cooperatively ---- */\n"
    "extern \"C\" __global__ void __launch_bounds__(MK_THREADS, 1)\n"
    "megac_kernel(const __grid_constant__ MegacArgs a)\n"
    "{\n"
    "    mk_worker_run(&a, blockIdx.x);\n"
    "}\n";

char *cuda_source_build(const Schedule *s, const CudaLayout *l, bool host)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        die("open_memstream failed");
    /* the shim needs MK_THREADS for its block struct: shape first there */
    if (host)
        source_shape(f, s, l);
    fputs(host ? cuda_text_host_shim : cuda_text_prelude, f);
    if (!host)
        source_shape(f, s, l);
    source_tables(f, s);
    source_constants(f, s, l);
    fputs(cuda_text_body, f);
    if (!host)
        fputs(source_gpu_entry, f);
    if (fclose(f) != 0)
        die("writing the kernel source failed");
    return text;
}
