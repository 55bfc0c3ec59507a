/*
 * driver.c - the compiler's pass list, in order, as `megac compile` and
 * `megac run MODEL.yaml` run it:
 *
 *   desc_load           the model description (YAML), with --set overrides
 *   tok_import          its tokenizer (before the weights: a missing or bad
 *                       tokenizer is found in a moment, not after minutes)
 *   weights_load        its weights (llama2.c, safetensors, GGUF, synthetic)
 *   lower_model         one decode step as a Schedule for W workers
 *   val_schedule_check  deadlock and race freedom; a schedule that fails is
 *                       never compiled (exit 1 with the findings)
 *   cg_*_compile        kernel.so (cpu, host-cuda) or kernel.sm_XX.cubin
 *   bundle_write        weights.bin, schedule.sched, tokenizer.bin, manifest
 *
 * The schedule is validated in its printed form: it is printed, parsed back
 * with the bundle's schedule.sched as its file name, and that parsed copy is
 * what is checked, compiled and shipped, so diagnostics cite .sched lines.
 *
 * The bundle is built in a sibling folder, DIR.tmp<pid>, and renamed onto
 * -o DIR only when every pass succeeded, so a failed or interrupted compile
 * leaves DIR as it was. DIR may be absent, an empty folder or a megac
 * bundle (replaced); anything else is refused before any work. SIGINT,
 * SIGTERM and SIGHUP remove the temporary folder; one left by a killed
 * process is swept by the next compile to the same DIR.
 */
#include "compiler/driver.h"
#include "compiler/cli.h"
#include "compiler/compile.h"
#include "compiler/quant.h"
#include "codegen/codegen.h"
#include "validator/validator.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

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
    char *out;                  /* -o without trailing slashes */
    char *tmp;                  /* out.tmp<pid>: where the passes write */
    bool replace;               /* out exists (a bundle or empty): replace it */
    bool unchecked;             /* the validator's budget refused the schedule (not unsafe) */
    char *kernel_path;
    const char *kernel_file;
    double t0;
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

/* The matrices a knob asks to be a8: how many got int8 inputs, and which
 * dtypes have no such form (those keep exact inputs). */
static void a8_summary(const Weights *w, char *out, size_t n)
{
    int a8 = 0, exact = 0, nt = 0;
    DType kept[4];
    char name[64];
    for (int i = 0; quant_matrix_name(w, i, name, sizeof name); i++) {
        if (w->m->quant[quant_tensor_class(name)].kind != QUANT_A8)
            continue;
        DType t = weights_dtype(w, name);
        if (dtype_is_a8(t)) {
            a8++;
            continue;
        }
        exact++;
        bool seen = false;
        for (int j = 0; j < nt; j++)
            seen |= kept[j] == t;
        if (!seen && nt < 4)
            kept[nt++] = t;
    }
    if (!a8 && !exact)
        return;
    size_t at = (size_t)snprintf(out, n, "; a8: %d with int8 inputs", a8);
    for (int j = 0; j < nt && at < n; j++)
        at += (size_t)snprintf(out + at, n - at, "%s%s", j ? ", " : ", exact inputs for ", dtype_name(kept[j]));
    if (exact && at < n)
        snprintf(out + at, n - at, " (%d: no int8 form)", exact);
}

/* ---- room for the weights ----
 * A compile holds the stored weights in memory until it writes them into
 * the bundle (weights_load_ex, WEIGHTS_STORED_ONLY), so a model whose
 * stored weights exceed the memory it may use was killed by the kernel's
 * OOM killer partway through loading (Llama-3.1-8B in f32: 32 GB, on a
 * 24 GB machine, after 40 s and 24 GB read), with no word of why. The
 * stored bytes are known from the files' headers (WEIGHTS_DTYPES_ONLY),
 * so the compile checks them first, against the memory available and the
 * free space where the bundle is written. */

/* The kB value of `key` in /proc/meminfo, or -1. */
static long long meminfo_kb(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    return p ? atoll(p + strlen(key)) : -1;
}

/* The bytes this process may still take: MemAvailable + SwapFree, no more
 * than what the cgroup v2 memory limit leaves (a container), or
 * MEGAC_MEMORY_MB when set (the user's own bound); 0 when unknown. *src
 * says which. */
static size_t memory_available(const char **src)
{
    const char *env = getenv("MEGAC_MEMORY_MB");
    if (env && *env) {
        char *end;
        double mb = strtod(env, &end);
        if (*end == 0 && mb > 0) {
            *src = "MEGAC_MEMORY_MB";
            return (size_t)(mb * 1e6);
        }
        fprintf(stderr, "megac: warning: MEGAC_MEMORY_MB='%.32s' is not a number of megabytes above 0; ignored\n",
                env);
    }
    *src = "/proc/meminfo: MemAvailable + SwapFree";
    char buf[8192];
    size_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        long long a = meminfo_kb(buf, "MemAvailable:"), sw = meminfo_kb(buf, "SwapFree:");
        if (a >= 0)
            avail = (size_t)(a + (sw > 0 ? sw : 0)) * 1024;
    }
    /* cgroup v2: the line "0::/path" of /proc/self/cgroup */
    char path[1024] = "";
    if ((f = fopen("/proc/self/cgroup", "r"))) {
        while (fgets(buf, sizeof buf, f))
            if (!strncmp(buf, "0::", 3)) {
                buf[strcspn(buf, "\n")] = 0;
                snprintf(path, sizeof path, "/sys/fs/cgroup%.900s", buf + 3);
            }
        fclose(f);
    }
    long long max = -1, cur = -1;
    char file[1100];
    snprintf(file, sizeof file, "%s/memory.max", path);
    if (*path && (f = fopen(file, "r"))) {
        if (fgets(buf, sizeof buf, f) && isdigit((unsigned char)buf[0]))
            max = atoll(buf);
        fclose(f);
    }
    snprintf(file, sizeof file, "%s/memory.current", path);
    if (max >= 0 && (f = fopen(file, "r"))) {
        if (fgets(buf, sizeof buf, f))
            cur = atoll(buf);
        fclose(f);
    }
    if (max >= 0 && cur >= 0) {
        size_t left = max > cur ? (size_t)(max - cur) : 0;
        if (!avail || left < avail) {
            avail = left;
            *src = "the cgroup's memory.max - memory.current";
        }
    }
    return avail;
}

/* bytes as "N.NN GB", or "N.NN MB" below a tenth of a GB (a 1 MB model
 * and a 1 MB limit both read "0.00 GB"), into buf. */
static const char *size_str(char *buf, size_t cap, size_t bytes)
{
    snprintf(buf, cap, bytes < 100000000 ? "%.2f MB" : "%.2f GB", bytes < 100000000 ? bytes / 1e6 : bytes / 1e9);
    return buf;
}

/* Refuses a model whose stored weights do not fit in the memory available
 * or on the disk that holds dir (NULL: no disk check); true when they fit
 * or cannot be told. `what` says who holds them ("a compile holds ...");
 * knobs: the quant knobs could store them smaller (the error says how). */
bool driver_weights_fit(const ModelDesc *m, const char *what, const char *dir, bool knobs, Diag *d)
{
    Weights w;
    if (!weights_load_ex(&w, m, WEIGHTS_DTYPES_ONLY, NULL, d))
        return false; /* its errors said why */
    int f32;
    size_t need = weights_stored_bytes(&w, &f32);
    weights_free(&w);
    const char *src, *name = m->path ? m->path : "megac";
    size_t avail = memory_available(&src);
    char size[96], hint[128] = "", num[32];
    int at = snprintf(size, sizeof size, "%s for this model", size_str(num, sizeof num, need));
    if (f32)
        snprintf(size + at, sizeof size - (size_t)at, " (%d matrices in f32)", f32);
    if (f32 && knobs)
        snprintf(hint, sizeof hint, "store the matrices smaller (--set quant.default=bf16, w8a16 or w4a16-g128), or ");
    if (avail && need > avail) {
        diag_file_error(d, name, "%s: %s, but %s are available (%s); %suse a machine with more memory", what,
                        size, size_str(num, sizeof num, avail), src, hint);
        return false;
    }
    struct statvfs fs;
    if (dir && statvfs(dir, &fs) == 0) {
        size_t free_b = (size_t)fs.f_bavail * fs.f_frsize;
        if (need > free_b) {
            diag_file_error(d, name,
                            "the bundle's weights take %s, but %s has %s free; %swrite the bundle to a disk "
                            "with more room",
                            size, dir, size_str(num, sizeof num, free_b), hint);
            return false;
        }
    }
    return true;
}

static bool pass_weights_load(Compilation *c)
{
    if (!driver_weights_fit(&c->m, "a compile holds the stored weights in memory until it writes them", c->tmp,
                            true, &c->d))
        return pass_done(c, "weights_load", false, "");
    /* a line every few seconds (an 8B model takes a minute or more) */
    CliProgress pc;
    WeightsProgress p = cli_progress(&pc, "compile", "weights_load", "read");
    c->have_weights = weights_load_ex(&c->w, &c->m, WEIGHTS_STORED_ONLY, c->o->quiet ? NULL : &p, &c->d);
    c->w.progress = NULL;
    char detail[256] = "";
    if (c->have_weights)
        snprintf(detail, sizeof detail, "%.1f MB f32 read, %.1f MB stored", c->w.loaded_bytes / 1e6,
                 weights_held_bytes(&c->w) / 1e6);
    if (c->have_weights && c->w.stored_kept)
        snprintf(detail + strlen(detail), sizeof detail - strlen(detail), " (%d matrices as the file stores them)",
                 c->w.stored_kept);
    if (c->have_weights)
        a8_summary(&c->w, detail + strlen(detail), sizeof detail - strlen(detail));
    return pass_done(c, "weights_load", c->have_weights, detail);
}

static bool pass_tok_import(Compilation *c)
{
    c->tok = tok_import(&c->m, &c->d);
    char detail[128] = "";
    const char *sys;
    ChatKind k = c->tok ? tok_chat(c->tok, &sys) : CHAT_UNKNOWN;
    bool dated = chat_kind_dated(k);
    if (c->tok)
        snprintf(detail, sizeof detail, "%d tokens%s%s%s", tok_vocab(c->tok), k ? ", chat template: " : "",
                 k ? chat_kind_name(k) : "",
                 dated ? " (a system turn always)" : k && sys ? " (with a default system turn)" : "");
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
    char *path = xasprintf("%s/schedule.sched", c->out);
    c->src = (SrcFile){path, c->sched_text, strlen(c->sched_text)};
    c->s = sched_parse(path, c->sched_text, c->src.len, &c->d);
    if (!c->s)
        die("the printed schedule does not parse back (errors above)");
    sched_layout(c->s);
    char detail[160];
    snprintf(detail, sizeof detail, "%u worker%s, %u buffers, %u counters, %.1f MB weights, %.1f MB arena",
             c->s->nworkers, c->s->nworkers == 1 ? "" : "s", c->s->nbufs, c->s->nctrs, c->s->weights_bytes / 1e6, c->s->arena_bytes / 1e6);
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
    c->unchecked = !ok && r.nlimit == r.nerrors;
    char detail[160];
    snprintf(detail, sizeof detail, "%d errors, %llu access pairs checked%s", r.nerrors,
             (unsigned long long)r.pairs_checked, info ? " (with the kernel's resources)" : "");
    return pass_done(c, "val_schedule_check", ok, detail);
}

/* Writes text to out with every tmp in it replaced by dir. */
static void diag_text_rename(FILE *out, const char *text, const char *tmp, const char *dir)
{
    size_t n = strlen(tmp);
    for (const char *p; (p = strstr(text, tmp)); text = p + n) {
        fwrite(text, 1, (size_t)(p - text), out);
        fputs(dir, out);
    }
    fputs(text, out);
}

/* A pass line for each NVRTC compile that spilled, so that a long search
 * does not pass in silence (each line's time is its own compile's). */
static void codegen_cuda_retry(void *ctx, double seconds, const char *what)
{
    (void)seconds; /* pass_done's clock, which the line resets, measured the same */
    pass_done(ctx, "cg_cuda_compile", true, what);
}

/* Runs the target's code generator into the temporary folder; *pass names it. */
static bool codegen_run(Compilation *c, CudaKernelInfo *info, const char **pass)
{
    const Target *t = c->target;
    if (t->kind == TARGET_CPU) {
        c->kernel_file = "kernel.so";
        c->kernel_path = xasprintf("%s/%s", c->tmp, c->kernel_file);
        CpuOptions co = {c->o->cpu, false, false};
        *pass = "cg_cpu_compile";
        return cg_cpu_compile(c->s, &co, c->kernel_path, &c->d);
    }
    if (t->kind == TARGET_HOST_CUDA) {
        c->kernel_file = "kernel.so";
        c->kernel_path = xasprintf("%s/%s", c->tmp, c->kernel_file);
        *pass = "cg_hostcuda_compile";
        return cg_hostcuda_compile(c->s, c->kernel_path, &c->d);
    }
    c->kernel_file = arena_printf(&c->arena, "kernel.%s.cubin", t->name);
    c->kernel_path = xasprintf("%s/%s", c->tmp, c->kernel_file);
    *pass = "cg_cuda_compile";
    CgCudaProgress p = {codegen_cuda_retry, c};
    return cg_cuda_compile_ex(c->s, t->name, c->kernel_path, info, &p, &c->d);
}

/* Code generation writes into DIR.tmp<pid>; its messages are held and
 * printed with the path the user named (DIR/kernel.so). */
static bool pass_codegen(Compilation *c, CudaKernelInfo *info)
{
    char *buf = NULL;
    size_t len = 0;
    const char *pass = NULL;
    FILE *real = c->d.out, *held = open_memstream(&buf, &len);
    if (!held)
        die("open_memstream: %s", strerror(errno));
    c->d.out = held;
    bool ok = codegen_run(c, info, &pass);
    c->d.out = real;
    if (fclose(held) != 0)
        die("open_memstream: %s", strerror(errno));
    diag_text_rename(real, buf, c->tmp, c->out);
    free(buf);
    if (ok && c->target->kind == TARGET_CUDA && info && info->regs_per_thread > 0) {
        char *detail = arena_printf(&c->arena,
                                    "%s (%d threads x %d registers, %d bytes shared per block, %d weight loads "
                                    "a lane before a GEMV's wait, %d in flight%s%s)",
                                    c->kernel_file, info->threads_per_block, info->regs_per_thread,
                                    info->smem_per_block, info->preloads, info->vloads,
                                    info->block_lanes ? ", short block rows side by side" : "",
                                    info->wpipe ? arena_printf(&c->arena, ", a weight pipe of %d stages", info->wpipe)
                                                : "");
        return pass_done(c, pass, ok, detail);
    }
    return pass_done(c, pass, ok, c->kernel_file);
}

/* ---- the output folder ---- */

/* What the handler of SIGINT/SIGTERM/SIGHUP removes while a compile runs:
 * every file a compile may write into the temporary folder, then the folder.
 * Filled before the handler is installed and only read by it. While the
 * finished bundle is renamed into place (committing), a signal only waits
 * in `pending`, to be raised once the folders are consistent. */
enum { OUT_NSIGS = 3, OUT_NFILES = 9 };
static const int out_sigs[OUT_NSIGS] = {SIGINT, SIGTERM, SIGHUP};
static struct {
    char dir[PATH_MAX];
    char files[OUT_NFILES][PATH_MAX];
    struct sigaction old[OUT_NSIGS];
    volatile sig_atomic_t committing;
    volatile sig_atomic_t pending;
} out_guard;

/* Async-signal-safe. */
static void signal_default(int sig)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
}

/* Async-signal-safe: unlink, rmdir, sigaction and raise only. */
static void out_on_signal(int sig)
{
    if (out_guard.committing) {
        out_guard.pending = sig;
        return;
    }
    for (int i = 0; i < OUT_NFILES; i++)
        if (out_guard.files[i][0])
            unlink(out_guard.files[i]);
    rmdir(out_guard.dir);
    /* then what was there before: a handler of the caller's (a temporary
     * bundle's, below) runs next; else the default, which ends the process */
    for (int i = 0; i < OUT_NSIGS; i++) {
        const struct sigaction *old = &out_guard.old[i];
        bool chain = old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN;
        if (out_sigs[i] == sig && chain)
            sigaction(sig, old, NULL);
        else if (out_sigs[i] == sig)
            signal_default(sig);
    }
    raise(sig);
}

/* The files a compile may write into a bundle folder but the cubin (whose
 * name has the target's). */
static const char *const out_file_names[OUT_NFILES - 1] = {"manifest.yaml", "schedule.sched", "weights.bin",
                                                           "tokenizer.bin", "kernel.so",      "kernel.so.o",
                                                           "kernel.ll",     "kernel.host.c"};

/* Installs handler for out_sigs, the handlers before it into old. */
static void signals_install(void (*handler)(int), struct sigaction old[OUT_NSIGS])
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < OUT_NSIGS; i++)
        sigaction(out_sigs[i], &sa, &old[i]);
}

static void out_guard_install(const char *tmp, const Target *t)
{
    memset(&out_guard, 0, sizeof out_guard);
    snprintf(out_guard.dir, sizeof out_guard.dir, "%s", tmp);
    for (int i = 0; i < OUT_NFILES - 1; i++)
        snprintf(out_guard.files[i], PATH_MAX, "%s/%s", tmp, out_file_names[i]);
    snprintf(out_guard.files[OUT_NFILES - 1], PATH_MAX, "%s/kernel.%s.cubin", tmp, t->name);
    signals_install(out_on_signal, out_guard.old);
}

/* Restores the handlers, then raises a signal that came while committing. */
static void out_guard_remove(void)
{
    for (int i = 0; i < OUT_NSIGS; i++)
        sigaction(out_sigs[i], &out_guard.old[i], NULL);
    int sig = out_guard.pending;
    out_guard.committing = 0;
    out_guard.pending = 0;
    if (sig)
        raise(sig);
}

/* A file name a compile writes into a bundle folder. */
static bool out_is_bundle_file(const char *name)
{
    return !strcmp(name, "manifest.yaml") || !strcmp(name, "schedule.sched") || !strcmp(name, "weights.bin") ||
           !strcmp(name, "tokenizer.bin") || !strncmp(name, "kernel.", 7);
}

bool driver_bundle_remove(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT;
    bool ours = true;
    for (struct dirent *e; ours && (e = readdir(d));) {
        struct stat sb;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        ours = out_is_bundle_file(e->d_name) && fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
               S_ISREG(sb.st_mode);
    }
    rewinddir(d);
    for (struct dirent *e; ours && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    return ours && rmdir(dir) == 0;
}

/* The pid of a name "<base>.tmp<pid>" or "<base>.old<pid>" (any base when
 * base is NULL), else 0. */
static long out_tmp_pid(const char *name, const char *base)
{
    size_t n = strlen(name), nb = base ? strlen(base) : 0;
    if (base && (strncmp(name, base, nb) != 0 || n < nb + 5))
        return 0;
    const char *p = base ? name + nb : strrchr(name, '.');
    if (!p || p == name || (strncmp(p, ".tmp", 4) != 0 && strncmp(p, ".old", 4) != 0) || !isdigit((unsigned char)p[4]))
        return 0;
    char *end;
    long pid = strtol(p + 4, &end, 10);
    return *end || pid <= 0 ? 0 : pid;
}

void driver_tmp_sweep(const char *parent, const char *base)
{
    DIR *d = opendir(parent);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        long pid = out_tmp_pid(e->d_name, base);
        if (!pid || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char *p = xasprintf("%s/%s", parent, e->d_name);
        driver_bundle_remove(p);
        free(p);
    }
    closedir(d);
}

/* A megac bundle: a folder whose manifest.yaml has a `format:` line among
 * its first lines (runtime/bundle.c reads the rest). */
static bool out_is_bundle(const char *dir)
{
    char *path = xasprintf("%s/manifest.yaml", dir), line[256];
    FILE *f = fopen_read(path);
    free(path);
    bool yes = false;
    for (int i = 0; f && !yes && i < 8 && fgets(line, sizeof line, f); i++)
        yes = strncmp(line, "format:", 7) == 0;
    if (f)
        fclose(f);
    return yes;
}

/* True, with its name, when the folder holds an entry that is not a
 * bundle's file (a regular file of out_is_bundle_file's names). */
static bool out_foreign_file(const char *dir, char *name, size_t cap)
{
    DIR *d = opendir(dir);
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        struct stat sb;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        found = !out_is_bundle_file(e->d_name) || fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(sb.st_mode);
        if (found)
            snprintf(name, cap, "%s", e->d_name);
    }
    if (d)
        closedir(d);
    return found;
}

static bool out_is_empty_dir(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return d && n == 0;
}

/* Checks -o before any work: absent, an empty folder or a megac bundle. */
static bool out_check(Compilation *c)
{
    c->out = xstrdup(c->o->out);
    for (size_t n = strlen(c->out); n > 1 && c->out[n - 1] == '/'; n--)
        c->out[n - 1] = 0;
    const char *base = strrchr(c->out, '/');
    base = base ? base + 1 : c->out;
    if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
        diag_file_error(&c->d, c->o->out, "-o must name the bundle folder itself, such as NAME.megac");
        return false;
    }
    struct stat sb;
    if (lstat(c->out, &sb) != 0)
        return true;
    c->replace = S_ISDIR(sb.st_mode) && (out_is_bundle(c->out) || out_is_empty_dir(c->out));
    if (!c->replace) {
        diag_file_error(&c->d, c->out, "exists and is not a megac bundle; not overwriting it (remove it or choose "
                                       "another -o)");
        return false;
    }
    char other[256];
    if (out_foreign_file(c->out, other, sizeof other)) {   /* a replaced bundle's files are all removed */
        diag_file_error(&c->d, c->out, "is a megac bundle that also holds '%s', which is not a bundle's file; not "
                                       "overwriting it (move that out, or choose another -o)", other);
        c->replace = false;
        return false;
    }
    return true;
}

/* Creates out.tmp<pid> and guards it against signals. */
static bool out_tmp_make(Compilation *c)
{
    char *slash = strrchr(c->out, '/');
    char *parent = slash ? xasprintf("%.*s", slash == c->out ? 1 : (int)(slash - c->out), c->out) : xstrdup(".");
    driver_tmp_sweep(parent, slash ? slash + 1 : c->out);
    c->tmp = xasprintf("%s.tmp%ld", c->out, (long)getpid());
    driver_bundle_remove(c->tmp);
    out_guard_install(c->tmp, c->target);      /* first: a signal may come as soon as it exists */
    if (mkdir(c->tmp, 0777) == 0) {
        free(parent);
        return true;
    }
    int e = errno;
    struct stat sb;
    if (e == ENOENT || (stat(parent, &sb) == 0 && !S_ISDIR(sb.st_mode)))   /* the folder it goes in: say so */
        diag_file_error(&c->d, c->out, "cannot create the bundle: its folder %s %s", parent,
                        e == ENOENT ? "does not exist" : "is not a folder");
    else
        diag_file_error(&c->d, c->out, "cannot create the bundle folder %s: %s", c->tmp, strerror(e));
    free(parent);
    out_guard_remove();
    free(c->tmp);
    c->tmp = NULL;
    return false;
}

/* Renames the finished bundle onto out: an old one is renamed aside first,
 * put back if the new one cannot go in, else removed. With keep_existing, a
 * bundle that appeared at out meanwhile (a concurrent `megac run`) wins. */
static bool out_commit(Compilation *c)
{
    out_guard.committing = 1;
    if (rename(c->tmp, c->out) == 0)
        return true;
    int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) {
        if (c->o->keep_existing) {
            driver_bundle_remove(c->tmp);
            return true;
        }
        if (!out_is_bundle(c->out)) {
            diag_file_error(&c->d, c->out, "appeared during the compile and is not a megac bundle; not replacing it");
            return false;
        }
        char *old = xasprintf("%s.old%ld", c->out, (long)getpid());
        bool aside = rename(c->out, old) == 0;
        err = errno;
        if (aside && rename(c->tmp, c->out) == 0) {
            if (!driver_bundle_remove(old))
                fprintf(stderr, "megac compile: warning: could not remove the replaced bundle %s\n", old);
            free(old);
            return true;
        }
        if (aside) {
            err = errno;
            rename(old, c->out);
        }
        free(old);
    }
    diag_file_error(&c->d, c->out, "cannot move the bundle into place: %s", strerror(err));
    return false;
}

/* Ends the compile's hold on the temporary folder: gone unless renamed. */
static void out_tmp_close(Compilation *c)
{
    if (!c->tmp)
        return;
    out_guard.committing = 1;
    driver_bundle_remove(c->tmp);
    out_guard_remove();
}

/* The pass list; returns the exit status. */
static int compile_passes(Compilation *c)
{
    c->target = target_lookup(c->o->target, &c->d);     /* before any work */
    if (!c->target || !out_check(c) || !out_tmp_make(c) || !pass_desc_load(c) || !pass_tok_import(c) ||
        !pass_weights_load(c) || !pass_lower_model(c))
        return 2;
    if (!pass_validate(c, NULL)) {
        fprintf(stderr, "megac compile: the schedule %s; no code was generated\n",
                c->unchecked ? "is past what the validator can check (above)" : "is not safe");
        return c->unchecked ? 2 : 1;
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
    CliProgress pc;
    WeightsProgress p = cli_progress(&pc, "compile", "bundle_write", "written");
    bool ok = bundle_write(c->tmp, &c->m, &c->w, c->tok, c->s, c->kernel_file, c->o->quiet ? NULL : &p, &c->d) &&
              out_commit(c);
    return pass_done(c, "bundle_write", ok, c->out) ? 0 : 2;
}

int driver_compile(const CompileOptions *o)
{
    Compilation c;
    memset(&c, 0, sizeof c);
    c.o = o;
    diag_init(&c.d);
    c.d.prog = "megac compile";
    c.t0 = now_s();
    double start = c.t0;
    int rc = compile_passes(&c);
    out_tmp_close(&c);
    if (rc == 0 && !o->quiet)
        fprintf(stderr, "megac compile: wrote %s in %.2f s\n", c.out, now_s() - start);
    if (c.s)
        sched_free(c.s);
    if (c.lowered)
        sched_free(c.lowered);
    free(c.sched_text);
    free((char *)c.src.path);
    free(c.kernel_path);
    free(c.out);
    free(c.tmp);
    if (c.tok)
        tok_free(c.tok);
    if (c.have_weights)
        weights_free(&c.w);
    arena_free(&c.arena);
    return rc;
}


/* The temporary bundles open (driver_tmp_bundle_open), which a SIGINT,
 * SIGTERM or SIGHUP removes before the process ends: their files (the
 * names a bundle's files have, so none of another kind is touched), the
 * bundle folder and the temporary folder around it. A slot is marked used
 * (the handlers installed while any is) before its folder exists, its
 * names filled as what they name is made (an empty name removes nothing). */
enum { TMP_SLOTS = 4 };
static struct {
    struct {
        char dir[256], files[OUT_NFILES][320];
        volatile sig_atomic_t used;
    } slot[TMP_SLOTS];
    struct sigaction old[OUT_NSIGS];
    int n;
} tmp_guard;

static void tmp_on_signal(int sig)
{
    for (int i = 0; i < TMP_SLOTS; i++) {
        if (!tmp_guard.slot[i].used)
            continue;
        for (int f = 0; f < OUT_NFILES; f++)
            unlink(tmp_guard.slot[i].files[f]);
        rmdir(tmp_guard.slot[i].files[0]);  /* files[0] holds the bundle folder itself */
        rmdir(tmp_guard.slot[i].dir);
    }
    signal_default(sig);
    raise(sig);
}

/* Makes b's temporary folder from the template in b->dir (mkdtemp) inside
 * a guard slot whose handlers are already in place, so that a signal at
 * any moment finds what exists (the folder was made first, and a signal
 * before the slot was marked left it behind); then names b's bundle path
 * (tag) and files there. False, after mkdtemp failed (errno), with b->dir
 * emptied. Every slot taken: made unguarded. */
static bool tmp_guard_make(DriverTmpBundle *b, const char *tag)
{
    int i = 0;
    while (i < TMP_SLOTS && tmp_guard.slot[i].used)
        i++;
    if (i == TMP_SLOTS) {
        if (!mkdtemp(b->dir))
            return b->dir[0] = 0, false;
        snprintf(b->path, sizeof b->path, "%s/%.16s.megac", b->dir, tag);
        return true;
    }
    char *dir = tmp_guard.slot[i].dir;
    snprintf(dir, sizeof tmp_guard.slot[i].dir, "%s", b->dir);
    for (int f = 0; f < OUT_NFILES; f++)
        tmp_guard.slot[i].files[f][0] = 0;
    if (tmp_guard.n++ == 0)
        signals_install(tmp_on_signal, tmp_guard.old);
    tmp_guard.slot[i].used = 1;
    if (!mkdtemp(dir)) { /* the slot's own copy: its name is there before the folder exists */
        int e = errno;
        tmp_guard.slot[i].used = 0;
        if (--tmp_guard.n == 0)
            for (int s = 0; s < OUT_NSIGS; s++)
                sigaction(out_sigs[s], &tmp_guard.old[s], NULL);
        b->dir[0] = 0;
        errno = e;
        return false;
    }
    snprintf(b->dir, sizeof b->dir, "%s", dir);
    snprintf(b->path, sizeof b->path, "%s/%.16s.megac", b->dir, tag);
    for (int f = 1; f < OUT_NFILES; f++)   /* a cpu bundle's files (no cubin) */
        snprintf(tmp_guard.slot[i].files[f], sizeof tmp_guard.slot[i].files[f], "%s/%s", b->path,
                 out_file_names[f - 1]);
    snprintf(tmp_guard.slot[i].files[0], sizeof tmp_guard.slot[i].files[0], "%s", b->path);
    return true;
}

static void tmp_guard_drop(const DriverTmpBundle *b)
{
    for (int i = 0; i < TMP_SLOTS; i++) {
        if (!tmp_guard.slot[i].used || strcmp(tmp_guard.slot[i].dir, b->dir))
            continue;
        tmp_guard.slot[i].used = 0;
        if (--tmp_guard.n == 0)
            for (int s = 0; s < OUT_NSIGS; s++)
                sigaction(out_sigs[s], &tmp_guard.old[s], NULL);
    }
}

bool driver_tmp_bundle_open(DriverTmpBundle *b, const char *model, const DescOverride *sets, int nsets,
                            const char *tag, Diag *d)
{
    memset(b, 0, sizeof *b);
    if (nsets > DRIVER_MAX_SETS) {
        diag_file_error(d, model ? model : "megac", "a cpu bundle takes at most %d --set overrides here, not %d",
                        DRIVER_MAX_SETS, nsets);
        return false;
    }
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 200)
        tmp = "/tmp";
    snprintf(b->dir, sizeof b->dir, "%s/megac_%.16s_XXXXXX", tmp, tag);
    if (!tmp_guard_make(b, tag)) {
        diag_file_error(d, tmp, "cannot create a temporary folder: %s", strerror(errno));
        return false;
    }
    CompileOptions o = {.model = model, .target = "cpu", .out = b->path, .quiet = true, .nsets = nsets};
    for (int i = 0; i < nsets; i++)
        o.sets[i] = sets[i];
    int rc = driver_compile(&o);
    if (rc == 0 && megac_open(b->path, &b->mm) == MEGAC_OK)
        return true;
    diag_file_error(d, model ? model : "megac", "the cpu bundle could not be %s: %s", rc ? "compiled" : "opened",
                    rc ? "see above" : megac_last_open_error());
    driver_tmp_bundle_close(b);
    return false;
}

void driver_tmp_bundle_close(DriverTmpBundle *b)
{
    if (b->mm)
        megac_close(b->mm);
    if (b->dir[0]) {
        driver_bundle_remove(b->path);
        rmdir(b->dir);
        tmp_guard_drop(b);
    }
    memset(b, 0, sizeof *b);
}
