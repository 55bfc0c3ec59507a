/*
 * driver.c - the compiler's pass list, in order, as `megac compile` and
 * `megac run MODEL.yaml` run it:
 *
 *   desc_load           the model description (YAML), with --set overrides
 *   weights_load        its weights (llama2.c, safetensors, GGUF, synthetic)
 *   tok_import          its tokenizer
 *   lower_model         one decode step as a Schedule for W workers
 *   val_schedule_check  deadlock and race freedom; a schedule that fails is
 *                       never compiled (exit 1 with the findings)
 *   cg_*_compile        kernel.so (cpu, host-cuda) or kernel.sm_XX.cubin
 *   bundle_write        weights.bin, schedule.sched, tokenizer.bin, manifest
 *
 * The schedule is validated in its printed form: it is printed, parsed back
 * with the bundle's schedule.sched as its file name, and that parsed copy is
 * what is checked, compiled and shipped, so diagnostics cite .sched lines.
 */
#include "compiler/driver.h"
#include "compiler/compile.h"
#include "compiler/quant.h"
#include "codegen/codegen.h"
#include "validator/validator.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* Everything one compilation owns. */
typedef struct Compilation {
    const CompileOptions *o;
    Arena arena;
    Diag d;
    ModelDesc m;
    Weights w;
    bool have_weights;
    Tokenizer *tok;
    const Target *target;
    Schedule *lowered;          /* lower_model's result */
    Schedule *s;                /* parsed back from its text: what ships */
    char *sched_text;
    SrcFile src;
    char *kernel_path;
    const char *kernel_file;
    double t0;
    double t_progress;          /* the last progress line */
} Compilation;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Prints one progress line for a pass that just ended. */
static bool pass_done(Compilation *c, const char *pass, bool ok, const char *detail)
{
    double t = now_s();
    if (!c->o->quiet)
        fprintf(stderr, "megac compile: %-20s %8.1f ms  %s%s\n", pass, 1e3 * (t - c->t0), ok ? "" : "FAILED ",
                detail ? detail : "");
    c->t0 = t;
    return ok;
}

bool driver_is_default_model(const char *model)
{
    return strcmp(model, "default") == 0 || strcmp(model, "<embedded>") == 0;
}

static bool pass_desc_load(Compilation *c)
{
    const CompileOptions *o = c->o;
    bool ok;
    if (driver_is_default_model(o->model))
        ok = desc_parse(&c->m, &c->arena, "<embedded>", desc_default_yaml, strlen(desc_default_yaml), o->sets,
                        o->nsets, &c->d);
    else
        ok = desc_load(&c->m, &c->arena, o->model, o->sets, o->nsets, &c->d);
    char detail[160] = "";
    if (ok)
        snprintf(detail, sizeof detail, "%s: %d layers, dim %d, vocab %d", c->m.name, c->m.n_layers, c->m.dim,
                 c->m.vocab_size);
    return pass_done(c, "desc_load", ok, detail);
}

/* A line every few seconds while the weights load (an 8B model takes a
 * minute or more). */
static void weights_progress(void *ctx, int done, int total, size_t f32_bytes)
{
    Compilation *c = ctx;
    double t = now_s();
    if (c->o->quiet || t - c->t_progress < 5.0)
        return;
    c->t_progress = t;
    fprintf(stderr, "megac compile: %-20s %8.1f s   %d/%d tensors, %.1f GB read\n", "weights_load", t - c->t0, done,
            total, f32_bytes / 1e9);
}

static bool pass_weights_load(Compilation *c)
{
    WeightsProgress p = {weights_progress, c};
    c->t_progress = now_s();
    c->have_weights = weights_load_ex(&c->w, &c->m, WEIGHTS_STORED_ONLY, &p, &c->d);
    c->w.progress = NULL;
    char detail[96] = "";
    if (c->have_weights)
        snprintf(detail, sizeof detail, "%.1f MB f32 read, %.1f MB stored", c->w.nbytes / 1e6,
                 weights_held_bytes(&c->w) / 1e6);
    return pass_done(c, "weights_load", c->have_weights, detail);
}

static bool pass_tok_import(Compilation *c)
{
    c->tok = tok_import(&c->m, &c->d);
    char detail[64] = "";
    if (c->tok)
        snprintf(detail, sizeof detail, "%d tokens", tok_vocab(c->tok));
    return pass_done(c, "tok_import", c->tok != NULL, detail);
}

/* Lowers, lays out, then prints and parses back the schedule. */
static bool pass_lower_model(Compilation *c)
{
    int workers = c->o->workers ? c->o->workers : c->m.workers;
    c->lowered = lower_model_weights(&c->m, c->have_weights ? &c->w : NULL, c->target, workers, &c->d);
    if (!c->lowered)
        return pass_done(c, "lower_model", false, NULL);
    sched_layout(c->lowered);
    c->sched_text = sched_to_string(c->lowered);
    char *path = xasprintf("%s/schedule.sched", c->o->out);
    c->src = (SrcFile){path, c->sched_text, strlen(c->sched_text)};
    c->s = sched_parse(path, c->sched_text, c->src.len, &c->d);
    if (!c->s)
        die("the printed schedule does not parse back (errors above)");
    sched_layout(c->s);
    char detail[160];
    snprintf(detail, sizeof detail, "%u workers, %u buffers, %u counters, %.1f MB weights, %.1f MB arena",
             c->s->nworkers, c->s->nbufs, c->s->nctrs, c->s->weights_bytes / 1e6, c->s->arena_bytes / 1e6);
    return pass_done(c, "lower_model", true, detail);
}

static bool pass_validate(Compilation *c, const CudaKernelInfo *info)
{
    ValOptions vo = {c->target, 0, 0, 0, &c->src};
    if (info) {
        vo.threads_per_block = info->threads_per_block;
        vo.regs_per_thread = info->regs_per_thread;
        vo.smem_per_block = info->smem_per_block;
    }
    ValResult r;
    memset(&r, 0, sizeof r);
    bool ok = val_schedule_check(c->s, &vo, &c->d, &r);
    char detail[160];
    snprintf(detail, sizeof detail, "%d errors, %llu access pairs checked%s", r.nerrors,
             (unsigned long long)r.pairs_checked, info ? " (with the kernel's resources)" : "");
    return pass_done(c, "val_schedule_check", ok, detail);
}

static bool pass_codegen(Compilation *c, CudaKernelInfo *info)
{
    const Target *t = c->target;
    bool ok;
    const char *pass;
    if (t->kind == TARGET_CPU) {
        c->kernel_file = "kernel.so";
        c->kernel_path = xasprintf("%s/%s", c->o->out, c->kernel_file);
        CpuOptions co = {c->o->cpu, false, false};
        pass = "cg_cpu_compile";
        ok = cg_cpu_compile(c->s, &co, c->kernel_path, &c->d);
    } else if (t->kind == TARGET_HOST_CUDA) {
        c->kernel_file = "kernel.so";
        c->kernel_path = xasprintf("%s/%s", c->o->out, c->kernel_file);
        pass = "cg_hostcuda_compile";
        ok = cg_hostcuda_compile(c->s, c->kernel_path, &c->d);
    } else {
        c->kernel_file = arena_printf(&c->arena, "kernel.%s.cubin", t->name);
        c->kernel_path = xasprintf("%s/%s", c->o->out, c->kernel_file);
        pass = "cg_cuda_compile";
        ok = cg_cuda_compile(c->s, t->name, c->kernel_path, info, &c->d);
    }
    return pass_done(c, pass, ok, c->kernel_file);
}

static bool out_dir_make(Compilation *c)
{
    struct stat sb;
    if (mkdir(c->o->out, 0777) == 0 || (errno == EEXIST && stat(c->o->out, &sb) == 0 && S_ISDIR(sb.st_mode)))
        return true;
    diag_file_error(&c->d, c->o->out, "cannot create the bundle folder: %s", strerror(errno));
    return false;
}

/* The pass list; returns the exit status. */
static int compile_passes(Compilation *c)
{
    c->target = target_lookup(c->o->target, &c->d);     /* before any work */
    if (!c->target || !pass_desc_load(c) || !pass_weights_load(c) || !pass_tok_import(c) || !out_dir_make(c) ||
        !pass_lower_model(c))
        return 2;
    if (!pass_validate(c, NULL)) {
        fprintf(stderr, "megac compile: the schedule is not safe; no code was generated\n");
        return 1;
    }
    CudaKernelInfo info;
    memset(&info, 0, sizeof info);
    if (!pass_codegen(c, &info))
        return 2;
    if (c->target->kind == TARGET_CUDA && !pass_validate(c, &info)) {
        fprintf(stderr, "megac compile: the kernel's blocks cannot all be resident; no bundle was written\n");
        remove(c->kernel_path);
        return 1;
    }
    bool ok = bundle_write(c->o->out, &c->m, &c->w, c->tok, c->s, c->kernel_file, &c->d);
    return pass_done(c, "bundle_write", ok, c->o->out) ? 0 : 2;
}

int driver_compile(const CompileOptions *o)
{
    Compilation c;
    memset(&c, 0, sizeof c);
    c.o = o;
    diag_init(&c.d);
    c.t0 = now_s();
    double start = c.t0;
    int rc = compile_passes(&c);
    if (rc == 0 && !o->quiet)
        fprintf(stderr, "megac compile: wrote %s in %.2f s\n", o->out, now_s() - start);
    if (c.s)
        sched_free(c.s);
    if (c.lowered)
        sched_free(c.lowered);
    free(c.sched_text);
    free((char *)c.src.path);
    free(c.kernel_path);
    if (c.tok)
        tok_free(c.tok);
    if (c.have_weights)
        weights_free(&c.w);
    arena_free(&c.arena);
    return rc;
}

