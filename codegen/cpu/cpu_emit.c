/*
 * cpu_emit.c - cg_cpu_compile: the CPU backend's driver. In order:
 *   check    what the kernel body supports (cpu_check.c)
 *   parse    the kernel body bitcode embedded in megac (kernel_body.c)
 *   glue     the schedule's tables and shape as constants (cpu_glue.c)
 *   link     glue into body (LLVMLinkModules2)
 *   target   triple, data layout, target-cpu/features on every function,
 *            and megac_k_isa: the KT_ISA_* bits of the target (host
 *            features, or those of a named level), which pick the kernel
 *            body's instruction-set versions, and megac_k_tune: its
 *            KT_TUNE_* bits (cg_cpu_tune; kernel_table.h)
 *   extern   internalize all but the four symbols the runtime reads
 *   opt      LLVMRunPasses("default<O3>"), delete the isa_* versions left
 *            without callers (a called one the target lacks is a bug),
 *            then LLVMVerifyModule
 *   tsan     only for a ThreadSanitizer kernel (see below)
 *   emit     object file (PIC), then `cc -shared` -> kernel.so
 * Every LLVM call is checked; its message (and whatever LLVM reported
 * through the context's diagnostic handler) goes to the Diag.
 *
 * ThreadSanitizer kernel: when megac itself is built with TSan, or when
 * MEGAC_KERNEL_TSAN=1 (=0 turns it off), every function gets the
 * sanitize_thread attribute before O3 (so O3 introduces no racy
 * speculation, as under clang -fsanitize=thread), and after O3 LLVM's TSan
 * passes instrument every load, store and atomic, as clang places them.
 * LLVM 14's pass ignores accesses that are not 1, 2, 4, 8 or 16 bytes
 * wide, which are most of the kernel's (16-float vectors), and masked
 * loads, stores, gathers and scatters, so those get
 * __tsan_read_range/__tsan_write_range calls first. kernel.so then refers to
 * __tsan_* symbols, which resolve at dlopen against the TSan runtime of a
 * host process built with -fsanitize=thread (in any other process the
 * dlopen fails and names the symbol).
 */
#include "codegen/cpu/cpu.h"
#include "codegen/cpu/kernel_table.h"

#include <errno.h>
#include <llvm-c/Analysis.h>
#include <llvm-c/BitReader.h>
#include <llvm-c/Linker.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


typedef struct CpuJob {
    const Schedule *s;
    const CpuOptions *o;
    const char *so_path;
    Diag *d;
    LLVMContextRef ctx;
    LLVMModuleRef mod;
    LLVMTargetMachineRef tm;
    char *triple;
    char *cpu, *features;   /* LLVM-owned when taken from the host */
    bool host;
    bool tsan;              /* instrument for ThreadSanitizer */
    char log[2048];         /* messages from the diagnostic handler */
    struct timespec t0;
} CpuJob;

static const char *const cpu_exports[] = {"megac_worker", "megac_kernel_abi", "megac_schedule_hash",
                                          "megac_num_workers", "megac_kernel_facts", "megac_kv_layout", NULL};

/* Named CPUs accepted besides the host ("host" or NULL). */
static const char *const cpu_levels[] = {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "haswell",
                                         "skylake", "skylake-avx512", "cascadelake", "icelake-server",
                                         "sapphirerapids",
                                         "znver2", "znver3", "alderlake", NULL};

const char *const *cg_cpu_names(void)
{
    return cpu_levels;
}

static void job_progress(CpuJob *j, const char *what)
{
    if (!j->o->verbose)
        return;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double dt = (double)(t.tv_sec - j->t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - j->t0.tv_nsec);
    fprintf(stderr, "megac: cpu: %-44s %7.3f s\n", what, dt);
}

/* LLVM reports some errors (bitcode, linker) only through this handler. */
static void job_llvm_diag(LLVMDiagnosticInfoRef di, void *p)
{
    CpuJob *j = p;
    if (LLVMGetDiagInfoSeverity(di) != LLVMDSError)
        return;
    char *msg = LLVMGetDiagInfoDescription(di);
    size_t n = strlen(j->log);
    snprintf(j->log + n, sizeof j->log - n, "%s%s", n ? "; " : "", msg);
    LLVMDisposeMessage(msg);
}

static bool job_fail(CpuJob *j, const char *call, const char *msg)
{
    const char *m = msg && *msg ? msg : (j->log[0] ? j->log : "no message");
    diag_file_error(j->d, j->so_path, "%s failed: %s", call, m);
    return false;
}

static bool job_parse(CpuJob *j)
{
    LLVMMemoryBufferRef buf =
        LLVMCreateMemoryBufferWithMemoryRange((const char *)cpu_body_bc, cpu_body_bc_len, "kernel_body.bc", 0);
    if (!buf)
        return job_fail(j, "LLVMCreateMemoryBufferWithMemoryRange", NULL);
    LLVMBool bad = LLVMParseBitcodeInContext2(j->ctx, buf, &j->mod);
    LLVMDisposeMemoryBuffer(buf);
    if (bad)
        return job_fail(j, "LLVMParseBitcodeInContext2 (kernel body)", NULL);
    job_progress(j, "parsed kernel body bitcode");
    return true;
}

static bool job_link(CpuJob *j)
{
    LLVMModuleRef glue = cpu_glue_build(j->ctx, j->s);
    if (LLVMLinkModules2(j->mod, glue))
        return job_fail(j, "LLVMLinkModules2 (kernel body + schedule tables)", NULL);
    job_progress(j, "built and linked the schedule tables");
    return true;
}

/* AVX512-FP16 is turned off on every target: the body does no half
 * arithmetic, only half-to-float conversions of block scales, and with it
 * LLVM picks vcvtph2psx for those, which measured 2-7% slower in the 4-bit
 * GEMVs on Sapphire Rapids than F16C's vcvtph2ps. */
static bool job_pick_cpu(CpuJob *j)
{
    const char *name = j->o->cpu;
    j->host = !name || !strcmp(name, "host") || !strcmp(name, "native");
    if (j->host) {
        j->cpu = LLVMGetHostCPUName();
        j->features = LLVMGetHostCPUFeatures();
        char *fp16 = strstr(j->features, "+avx512fp16");
        if (fp16)
            *fp16 = '-';
        return true;
    }
    for (int i = 0; cpu_levels[i]; i++) {
        if (!strcmp(name, cpu_levels[i])) {
            j->cpu = xstrdup(name);
            j->features = xstrdup(!strcmp(name, "sapphirerapids") ? "-avx512fp16" : "");
            return true;
        }
    }
    diag_file_error(j->d, j->so_path, "unknown CPU '%s' (use host, x86-64, x86-64-v2, x86-64-v3, x86-64-v4, ...)",
                    name);
    return false;
}

static bool job_target_machine(CpuJob *j)
{
    LLVMTargetRef t;
    char *err = NULL;
    if (LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter())
        return job_fail(j, "LLVMInitializeNativeTarget", "no native target in this LLVM");
    j->triple = LLVMGetDefaultTargetTriple();
    if (LLVMGetTargetFromTriple(j->triple, &t, &err)) {
        job_fail(j, "LLVMGetTargetFromTriple", err);
        LLVMDisposeMessage(err);
        return false;
    }
    if (!job_pick_cpu(j))
        return false;
    j->tm = LLVMCreateTargetMachine(t, j->triple, j->cpu, j->features, LLVMCodeGenLevelAggressive, LLVMRelocPIC,
                                    LLVMCodeModelDefault);
    if (!j->tm)
        return job_fail(j, "LLVMCreateTargetMachine", j->cpu);
    return true;
}

static bool job_has_avx512(const CpuJob *j)
{
    if (j->host)
        return strstr(j->features, "+avx512f") != NULL;
    return !strcmp(j->cpu, "x86-64-v4") || strstr(j->cpu, "avx512") || strstr(j->cpu, "icelake") ||
           strstr(j->cpu, "sapphire") || strstr(j->cpu, "cascade");
}

static void job_set_fn_attr(LLVMContextRef ctx, LLVMValueRef f, const char *k, const char *v)
{
    LLVMRemoveStringAttributeAtIndex(f, LLVMAttributeFunctionIndex, k, (unsigned)strlen(k));
    if (v)
        LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex,
                                LLVMCreateStringAttribute(ctx, k, (unsigned)strlen(k), v, (unsigned)strlen(v)));
}

/* The bitcode was compiled for generic x86-64: retarget every function. */
static void job_retarget(CpuJob *j)
{
    const char *width = job_has_avx512(j) ? "512" : "256";
    for (LLVMValueRef f = LLVMGetFirstFunction(j->mod); f; f = LLVMGetNextFunction(f)) {
        if (LLVMIsDeclaration(f))
            continue;
        job_set_fn_attr(j->ctx, f, "target-cpu", j->cpu);
        job_set_fn_attr(j->ctx, f, "target-features", *j->features ? j->features : NULL);
        job_set_fn_attr(j->ctx, f, "tune-cpu", NULL);
        job_set_fn_attr(j->ctx, f, "prefer-vector-width", width);
        job_set_fn_attr(j->ctx, f, "min-legal-vector-width", width);
    }
}

/* Whether the feature list "+a,-b,+c" enables feature f (a whole name). */
static bool features_have(const char *list, const char *f)
{
    size_t n = strlen(f);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (p[0] == '+' && !strncmp(p + 1, f, n) && (p[1 + n] == ',' || p[1 + n] == '\0'))
            return true;
    return false;
}

/* The named CPUs' KT_ISA_* and KT_TUNE_* bits (those not here: none).
 * KT_TUNE_TRICKLE_ALL and KT_TUNE_FAR_QUADS on Intel's, KT_TUNE_FAR_SEQ on
 * Zen 3, none on the x86-64 levels, which run on either (their kernels
 * keep the rules measured on Zen 4). */
#define T_INTEL (KT_TUNE_TRICKLE_ALL | KT_TUNE_FAR_QUADS)
static const struct { const char *name; int32_t isa, tune; } cpu_named[] = {
    {"x86-64-v3", KT_ISA_AVX2, 0}, {"haswell", KT_ISA_AVX2, T_INTEL}, {"skylake", KT_ISA_AVX2, T_INTEL},
    {"znver2", KT_ISA_AVX2, 0}, {"znver3", KT_ISA_AVX2, KT_TUNE_FAR_SEQ},
    {"x86-64-v4", KT_ISA_AVX2 | KT_ISA_AVX512, 0},
    {"skylake-avx512", KT_ISA_AVX2 | KT_ISA_AVX512, T_INTEL},
    {"cascadelake", KT_ISA_AVX2 | KT_ISA_AVX512 | KT_ISA_VNNI512, T_INTEL},
    {"icelake-server", KT_ISA_AVX2 | KT_ISA_AVX512 | KT_ISA_VNNI512 | KT_ISA_GFNI512, T_INTEL},
    {"sapphirerapids", KT_ISA_AVX2 | KT_ISA_AVX512 | KT_ISA_VNNI512 | KT_ISA_AVXVNNI | KT_ISA_GFNI512, T_INTEL},
    {"alderlake", KT_ISA_AVX2 | KT_ISA_AVXVNNI, T_INTEL},
};
#undef T_INTEL

/* The KT_ISA_* bits of a named CPU level (cpu_levels). */
static int32_t job_isa_named(const char *cpu)
{
    for (size_t i = 0; i < sizeof cpu_named / sizeof *cpu_named; i++)
        if (!strcmp(cpu, cpu_named[i].name))
            return cpu_named[i].isa;
    return 0;
}

/* KT_TUNE_TRICKLE_ALL and KT_TUNE_FAR_QUADS for an Intel host (its vendor)
 * or a named Intel CPU (cpu_named). On an Intel Xeon (2026-12-05), ops of
 * SmolLM2-sized rows (k 576, two workers) streamed 1.10-1.20x faster with
 * the first (8-bit rows in one long segment, from the L3 or memory) and
 * 1.06-1.13x (packed 4-bit rows), where on Zen 4 the same choices had
 * measured 1.01-1.09x slower; the second took Llama-3.2-1B-shaped files
 * 1.07-1.19x faster there (kernel_body.c: seg_far_quads). KT_TUNE_FAR_SEQ
 * for AMD Zen 3 (family 19h without AVX-512; Zen 4 has it): there
 * (2026-12-07) two threads read 1.1-1.5x faster as four sequential
 * streams each than as one (scripts/scratch-read-streams.c), and
 * Llama-3.2-1B-shaped models decoded 1.04-1.16x (W4A8) and 1.07-1.12x
 * (W8A16) faster with their 256-bit rows read as far quads (Zen 2 and
 * Zen 4 not measured, so not theirs). */
int cg_cpu_tune(const char *cpu)
{
    if (!cpu || !strcmp(cpu, "host") || !strcmp(cpu, "native")) {
        __builtin_cpu_init();
        if (__builtin_cpu_is("intel"))
            return KT_TUNE_TRICKLE_ALL | KT_TUNE_FAR_QUADS;
        return __builtin_cpu_is("amdfam19h") && !__builtin_cpu_supports("avx512f") ? KT_TUNE_FAR_SEQ : 0;
    }
    for (size_t i = 0; i < sizeof cpu_named / sizeof *cpu_named; i++)
        if (!strcmp(cpu, cpu_named[i].name))
            return cpu_named[i].tune;
    return 0;
}

/* The KT_ISA_* bits of the target: the host's from its feature list. */
static int32_t job_isa(const CpuJob *j)
{
    if (!j->host)
        return job_isa_named(j->cpu);
    const char *f = j->features;
    int32_t isa = 0;
    if (features_have(f, "avx2") && features_have(f, "fma") && features_have(f, "f16c"))
        isa |= KT_ISA_AVX2;
    if ((isa & KT_ISA_AVX2) && features_have(f, "avx512f") && features_have(f, "avx512bw") &&
        features_have(f, "avx512vl") && features_have(f, "avx512dq"))
        isa |= KT_ISA_AVX512;
    if ((isa & KT_ISA_AVX512) && features_have(f, "avx512vnni"))
        isa |= KT_ISA_VNNI512;
    if ((isa & KT_ISA_AVX2) && features_have(f, "avxvnni"))
        isa |= KT_ISA_AVXVNNI;
    if ((isa & KT_ISA_VNNI512) && features_have(f, "gfni"))
        isa |= KT_ISA_GFNI512;
    return isa;
}

/* Defines the i32 constant sym (kernel_table.h), which the body declares. */
static void job_const_define(CpuJob *j, const char *sym, int32_t v)
{
    LLVMValueRef g = LLVMGetNamedGlobal(j->mod, sym);
    if (!g || !LLVMIsDeclaration(g))
        die("kernel body does not declare %s", sym);
    LLVMSetInitializer(g, LLVMConstInt(LLVMInt32TypeInContext(j->ctx), (unsigned long long)v, 0));
    LLVMSetGlobalConstant(g, 1);
}

/* The KT_ISA_* bits an isa_* function of the body needs, from its name:
 * isa_avx2_*, isa_avx512_*, isa_vnni512_*, isa_avxvnni_*, isa_gfni512_*. */
static int32_t isa_fn_needs(const char *name)
{
    const char *p = name + strlen(KT_ISA_PREFIX);
    if (!strncmp(p, "avx2_", 5))
        return KT_ISA_AVX2;
    if (!strncmp(p, "avx512_", 7))
        return KT_ISA_AVX512;
    if (!strncmp(p, "vnni512_", 8))
        return KT_ISA_VNNI512;
    if (!strncmp(p, "avxvnni_", 8))
        return KT_ISA_AVXVNNI;
    if (!strncmp(p, "gfni512_", 8))
        return KT_ISA_GFNI512 | KT_ISA_VNNI512;
    die("kernel body function %s names no instruction set", name);
}

/* After O3 the isa_* versions the target cannot run must be gone (their
 * calls folded away): unused ones are deleted, a used one is a bug. */
static void job_isa_prune(CpuJob *j)
{
    int32_t isa = job_isa(j);
    LLVMValueRef f = LLVMGetFirstFunction(j->mod);
    while (f) {
        LLVMValueRef next = LLVMGetNextFunction(f);
        const char *name = LLVMGetValueName(f);
        if (!LLVMIsDeclaration(f) && !strncmp(name, KT_ISA_PREFIX, strlen(KT_ISA_PREFIX))) {
            int32_t need = isa_fn_needs(name);
            if (!LLVMGetFirstUse(f))
                LLVMDeleteFunction(f);
            else if ((need & isa) != need)
                die("kernel function %s is still called on a target without its instruction set", name);
        }
        f = next;
    }
}

static bool job_target(CpuJob *j)
{
    if (!job_target_machine(j))
        return false;
    LLVMSetTarget(j->mod, j->triple);
    LLVMTargetDataRef td = LLVMCreateTargetDataLayout(j->tm);
    char *dl = LLVMCopyStringRepOfTargetData(td);
    LLVMSetDataLayout(j->mod, dl);
    LLVMDisposeMessage(dl);
    LLVMDisposeTargetData(td);
    job_retarget(j);
    int32_t isa = job_isa(j), tune = cg_cpu_tune(j->host ? NULL : j->cpu);
    /* MEGAC_CPU_TUNE=N (developers): build with the KT_TUNE_* bits N in
     * place of the CPU's, to time one choice against another */
    const char *te = getenv("MEGAC_CPU_TUNE");
    if (te && *te)
        tune = (int32_t)strtol(te, NULL, 0);
    job_const_define(j, KT_SYM_ISA, isa);
    job_const_define(j, KT_SYM_TUNE, tune);
    if (j->o->verbose)
        fprintf(stderr, "megac: cpu: target %s, cpu %s%s, isa bits %d, tune bits %d\n", j->triple, j->cpu,
                job_has_avx512(j) ? " (avx512)" : "", (int)isa, (int)tune);
    return true;
}

static bool job_is_export(const char *name)
{
    for (int i = 0; cpu_exports[i]; i++)
        if (!strcmp(name, cpu_exports[i]))
            return true;
    return false;
}

/* Everything but the ABI symbols becomes internal, so O3 may specialize,
 * inline and fold the tables' loads; the exports must all be defined. */
static bool job_internalize(CpuJob *j)
{
    for (LLVMValueRef f = LLVMGetFirstFunction(j->mod); f; f = LLVMGetNextFunction(f))
        if (!LLVMIsDeclaration(f) && !job_is_export(LLVMGetValueName(f)))
            LLVMSetLinkage(f, LLVMInternalLinkage);
    for (LLVMValueRef g = LLVMGetFirstGlobal(j->mod); g; g = LLVMGetNextGlobal(g))
        if (!LLVMIsDeclaration(g) && !job_is_export(LLVMGetValueName(g)) &&
            strncmp(LLVMGetValueName(g), "llvm.", 5) != 0) /* llvm.global_dtors etc. keep theirs */
            LLVMSetLinkage(g, LLVMInternalLinkage);
    for (int i = 0; cpu_exports[i]; i++) {
        LLVMValueRef v = i == 0 ? LLVMGetNamedFunction(j->mod, cpu_exports[i]) : LLVMGetNamedGlobal(j->mod, cpu_exports[i]);
        if (!v || LLVMIsDeclaration(v))
            die("kernel symbol %s is not defined after linking", cpu_exports[i]);
        LLVMSetVisibility(v, LLVMDefaultVisibility);
    }
    return true;
}

static bool job_verify(CpuJob *j, const char *when)
{
    char *msg = NULL;
    if (LLVMVerifyModule(j->mod, LLVMReturnStatusAction, &msg)) {
        char *what = xasprintf("LLVMVerifyModule (%s)", when);
        job_fail(j, what, msg);
        free(what);
        LLVMDisposeMessage(msg);
        return false;
    }
    LLVMDisposeMessage(msg);
    return true;
}

static bool job_optimize(CpuJob *j)
{
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
    LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
    LLVMPassBuilderOptionsSetLoopUnrolling(po, 1);
    LLVMErrorRef e = LLVMRunPasses(j->mod, "default<O3>", j->tm, po);
    LLVMDisposePassBuilderOptions(po);
    if (e) {
        char *msg = LLVMGetErrorMessage(e);
        job_fail(j, "LLVMRunPasses(default<O3>)", msg);
        LLVMDisposeErrorMessage(msg);
        return false;
    }
    job_isa_prune(j);
    job_progress(j, "optimized (default<O3>)");
    return job_verify(j, "after O3");
}

/* ---- ThreadSanitizer kernel ---- */

#if defined(__SANITIZE_THREAD__)
#define CPU_HOST_TSAN true
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CPU_HOST_TSAN true
#endif
#endif
#ifndef CPU_HOST_TSAN
#define CPU_HOST_TSAN false
#endif

/* MEGAC_KERNEL_TSAN=1 or 0 decides; unset, a TSan-built megac instruments. */
static bool job_wants_tsan(void)
{
    const char *e = getenv("MEGAC_KERNEL_TSAN");
    if (e && *e)
        return strcmp(e, "0") != 0;
    return CPU_HOST_TSAN;
}

/* sanitize_thread on every function, before O3 (as clang's front end). */
static bool job_tsan_mark(CpuJob *j)
{
    if (!j->tsan)
        return true;
    unsigned kind = LLVMGetEnumAttributeKindForName("sanitize_thread", strlen("sanitize_thread"));
    if (!kind)
        die("this LLVM has no sanitize_thread attribute");
    LLVMAttributeRef a = LLVMCreateEnumAttribute(j->ctx, kind, 0);
    for (LLVMValueRef f = LLVMGetFirstFunction(j->mod); f; f = LLVMGetNextFunction(f))
        if (!LLVMIsDeclaration(f))
            LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex, a);
    return true;
}

/* The object a pointer points into: GEPs and casts stripped. */
static LLVMValueRef tsan_base(LLVMValueRef p)
{
    for (;;) {
        bool cexpr = LLVMIsAConstantExpr(p) &&
                     (LLVMGetConstOpcode(p) == LLVMGetElementPtr || LLVMGetConstOpcode(p) == LLVMBitCast);
        if (!cexpr && !LLVMIsAGetElementPtrInst(p) && !LLVMIsABitCastInst(p))
            return p;
        p = LLVMGetOperand(p, 0);
    }
}

typedef struct TsanRange {
    LLVMTargetDataRef td;
    LLVMBuilderRef b;
    LLVMTypeRef fnty, i8p, i64;
    LLVMValueRef read, write;   /* __tsan_read_range, __tsan_write_range */
    unsigned n;                 /* calls added */
} TsanRange;

static LLVMValueRef tsan_range_decl(CpuJob *j, TsanRange *r, const char *name)
{
    LLVMValueRef f = LLVMGetNamedFunction(j->mod, name);
    return f ? f : LLVMAddFunction(j->mod, name, r->fnty);
}

static void tsan_range_call(TsanRange *r, bool write, LLVMValueRef ptr, LLVMValueRef n)
{
    LLVMValueRef args[2] = {LLVMBuildPointerCast(r->b, ptr, r->i8p, ""), n};
    LLVMBuildCall2(r->b, r->fnty, write ? r->write : r->read, args, 2, "");
    r->n++;
}

/* A plain load or store of a size the TSan pass skips (not 1, 2, 4, 8 or
 * 16 bytes) gets a range check before it; stack slots and constants need
 * none, atomics are the TSan pass's. */
static void tsan_range_plain(TsanRange *r, LLVMValueRef in, bool write)
{
    if (LLVMGetOrdering(in) != LLVMAtomicOrderingNotAtomic)
        return;
    LLVMValueRef ptr = LLVMGetOperand(in, write ? 1 : 0);
    unsigned long long n = LLVMStoreSizeOfType(r->td, LLVMTypeOf(write ? LLVMGetOperand(in, 0) : in));
    LLVMValueRef base = tsan_base(ptr);
    if (n == 1 || n == 2 || n == 4 || n == 8 || n == 16 || LLVMIsAAllocaInst(base) ||
        (LLVMIsAGlobalVariable(base) && LLVMIsGlobalConstant(base)))
        return;
    LLVMPositionBuilderBefore(r->b, in);
    tsan_range_call(r, write, ptr, LLVMConstInt(r->i64, n, 0));
}

/* llvm.masked.{load,store,gather,scatter}, which the TSan pass ignores:
 * one check per lane, of the lane's size where its mask bit is set, else
 * of 0 bytes (no access; folds away for a constant mask). Operands:
 *   load(ptr, align, mask, passthru)    store(val, ptr, align, mask)
 *   gather(ptrs, align, mask, passthru) scatter(val, ptrs, align, mask) */
static void tsan_range_masked(TsanRange *r, LLVMValueRef in)
{
    LLVMValueRef callee = LLVMGetCalledValue(in);
    const char *name = callee ? LLVMGetValueName(callee) : "";
    static const char *const kinds[] = {"llvm.masked.load.", "llvm.masked.store.", "llvm.masked.gather.",
                                        "llvm.masked.scatter."};
    int k = 0;
    while (k < 4 && strncmp(name, kinds[k], strlen(kinds[k])) != 0)
        k++;
    if (k == 4)
        return;
    bool write = k == 1 || k == 3, lanes = k >= 2;
    LLVMTypeRef vty = LLVMTypeOf(write ? LLVMGetOperand(in, 0) : in);
    LLVMValueRef ptr = LLVMGetOperand(in, write ? 1 : 0), mask = LLVMGetOperand(in, write ? 3 : 2);
    unsigned long long esize = LLVMStoreSizeOfType(r->td, LLVMGetElementType(vty));
    LLVMPositionBuilderBefore(r->b, in);
    LLVMValueRef base = lanes ? NULL : LLVMBuildPointerCast(r->b, ptr, r->i8p, "");
    for (unsigned i = 0; i < LLVMGetVectorSize(vty); i++) {
        LLVMValueRef lane = LLVMConstInt(r->i64, i, 0), at;
        if (lanes)
            at = LLVMBuildExtractElement(r->b, ptr, lane, "");
        else {
            LLVMValueRef off = LLVMConstInt(r->i64, i * esize, 0);
            at = LLVMBuildGEP2(r->b, LLVMInt8TypeInContext(LLVMGetTypeContext(r->i64)), base, &off, 1, "");
        }
        LLVMValueRef on = LLVMBuildExtractElement(r->b, mask, lane, "");
        LLVMValueRef n = LLVMBuildSelect(r->b, on, LLVMConstInt(r->i64, esize, 0), LLVMConstInt(r->i64, 0, 0), "");
        tsan_range_call(r, write, at, n);
    }
}

static void tsan_range_inst(TsanRange *r, LLVMValueRef in)
{
    switch (LLVMGetInstructionOpcode(in)) {
    case LLVMLoad:
        tsan_range_plain(r, in, false);
        break;
    case LLVMStore:
        tsan_range_plain(r, in, true);
        break;
    case LLVMCall:
        tsan_range_masked(r, in);
        break;
    default:
        break;
    }
}

static void tsan_ranges(CpuJob *j, TsanRange *r)
{
    r->i8p = LLVMPointerType(LLVMInt8TypeInContext(j->ctx), 0);
    r->i64 = LLVMInt64TypeInContext(j->ctx);
    LLVMTypeRef params[2] = {r->i8p, r->i64};
    r->fnty = LLVMFunctionType(LLVMVoidTypeInContext(j->ctx), params, 2, 0);
    r->read = tsan_range_decl(j, r, "__tsan_read_range");
    r->write = tsan_range_decl(j, r, "__tsan_write_range");
    r->td = LLVMGetModuleDataLayout(j->mod);
    r->b = LLVMCreateBuilderInContext(j->ctx);
    for (LLVMValueRef f = LLVMGetFirstFunction(j->mod); f; f = LLVMGetNextFunction(f))
        for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb; bb = LLVMGetNextBasicBlock(bb))
            for (LLVMValueRef in = LLVMGetFirstInstruction(bb); in; in = LLVMGetNextInstruction(in))
                tsan_range_inst(r, in);
    LLVMDisposeBuilder(r->b);
}

/* After O3: range checks, then LLVM's TSan passes (module: __tsan_init
 * constructor; function: every access and atomic). */
static bool job_tsan(CpuJob *j)
{
    if (!j->tsan)
        return true;
    TsanRange r = {0};
    tsan_ranges(j, &r);
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    LLVMErrorRef e = LLVMRunPasses(j->mod, "tsan-module,function(tsan)", j->tm, po);
    LLVMDisposePassBuilderOptions(po);
    if (e) {
        char *msg = LLVMGetErrorMessage(e);
        job_fail(j, "LLVMRunPasses(tsan-module,function(tsan))", msg);
        LLVMDisposeErrorMessage(msg);
        return false;
    }
    char what[96];
    snprintf(what, sizeof what, "instrumented for TSan (%u range checks)", r.n);
    job_progress(j, what);
    return job_verify(j, "after TSan instrumentation");
}

static bool job_keep_ir(CpuJob *j)
{
    if (!j->o->keep_ir)
        return true;
    char *dir_ll = NULL, *err = NULL;
    const char *slash = strrchr(j->so_path, '/');
    dir_ll = slash ? xasprintf("%.*s/kernel.ll", (int)(slash - j->so_path), j->so_path) : xstrdup("kernel.ll");
    bool ok = !LLVMPrintModuleToFile(j->mod, dir_ll, &err);
    if (!ok)
        job_fail(j, "LLVMPrintModuleToFile", err);
    LLVMDisposeMessage(err);
    free(dir_ll);
    return ok;
}

static bool job_emit_object(CpuJob *j, const char *obj)
{
    char *err = NULL;
    if (LLVMTargetMachineEmitToFile(j->tm, j->mod, (char *)obj, LLVMObjectFile, &err)) {
        job_fail(j, "LLVMTargetMachineEmitToFile", err);
        LLVMDisposeMessage(err);
        return false;
    }
    job_progress(j, "emitted object file");
    return true;
}

/* cc -shared -o so obj -lm, with the linker's output captured. */
static bool job_link_so(CpuJob *j, const char *obj)
{
    char *argv[] = {"cc", "-shared", "-o", (char *)j->so_path, (char *)obj, "-lm", NULL};
    char *out = NULL;
    bool ok = cg_run_cc(argv, &out);
    if (!ok)
        job_fail(j, "cc -shared (linking kernel.so)", out[0] ? out : "linker exited with an error");
    free(out);
    if (ok)
        job_progress(j, "linked kernel.so");
    return ok;
}

static bool job_emit(CpuJob *j)
{
    char *obj = xasprintf("%s.o", j->so_path);
    bool ok = job_emit_object(j, obj) && job_link_so(j, obj);
    unlink(obj);
    free(obj);
    return ok;
}

static void job_free(CpuJob *j)
{
    if (j->mod)
        LLVMDisposeModule(j->mod);
    if (j->tm)
        LLVMDisposeTargetMachine(j->tm);
    if (j->ctx)
        LLVMContextDispose(j->ctx);
    LLVMDisposeMessage(j->triple);
    if (j->host) {
        LLVMDisposeMessage(j->cpu);
        LLVMDisposeMessage(j->features);
    } else {
        free(j->cpu);
        free(j->features);
    }
}

bool cg_cpu_compile(const Schedule *s, const CpuOptions *o, const char *so_path, Diag *d)
{
    CpuOptions none = {0};
    CpuJob j = {.s = s, .o = o ? o : &none, .so_path = so_path, .d = d};
    clock_gettime(CLOCK_MONOTONIC, &j.t0);
    if (!cpu_schedule_check(s, d))
        return false;
    j.ctx = LLVMContextCreate();
    LLVMContextSetDiagnosticHandler(j.ctx, job_llvm_diag, &j);
    j.tsan = job_wants_tsan();
    bool ok = job_parse(&j) && job_link(&j) && job_target(&j) && job_internalize(&j) &&
              job_tsan_mark(&j) && job_verify(&j, "after linking") && job_optimize(&j) && job_tsan(&j) && job_keep_ir(&j) &&
              job_emit(&j);
    job_free(&j);
    return ok;
}
