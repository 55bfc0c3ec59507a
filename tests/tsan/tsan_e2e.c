/*
 * tsan_e2e.c - the runtime and a generated CPU kernel under ThreadSanitizer.
 * Not a Criterion test (Criterion crashes under TSan here): a plain program,
 * built and registered with ctest only in the MEGAC_TSAN configuration,
 * where megac's libraries, this program and (by default, see cpu_emit.c)
 * the generated kernel.so are all instrumented. TSan then watches the
 * runtime's worker pool and the kernel's own loads, stores and counter
 * atomics, and so checks dynamically that the validated schedule is
 * race-free.
 *
 *   tsan_e2e           compiles the embedded default model, and
 *                      stories260K when ../shared has it, for 1, 2 and 3
 *                      workers (driver_compile, as `megac compile` does),
 *                      then per bundle: prompt + greedy decode, reset, the
 *                      same again, and megac_generate. Exit 1 unless the
 *                      logits repeat bit for bit after the reset, every step
 *                      agrees with the reference engine (ref_step, float64:
 *                      same argmax, logits within tolerance), the tokens are
 *                      the same at every worker count, and megac_generate
 *                      picks them too. A TSan report makes the exit status 66.
 *   tsan_e2e --race    the negative control: lowers the default model for 2
 *                      workers, drops the first wait whose absence the
 *                      validator reports as a race, compiles that schedule
 *                      anyway (cg_cpu_compile; the validator is bypassed)
 *                      and runs it. TSan must report a data race in
 *                      kernel.so; ctest checks the report's text.
 */
#include "runtime/megac.h"
#include "compiler/compile.h"
#include "compiler/driver.h"
#include "codegen/codegen.h"
#include "validator/validator.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROMPT "Once upon a time"
#define STORIES_YAML MEGAC_SRC "/models/stories260k.yaml"
#define STORIES_BIN MEGAC_SRC "/../shared/models/stories260K.bin"
#define MAX_PROMPT 64
#define NDECODE 40
#define ATOL 1e-4
#define RTOL 1e-5

static const int worker_counts[] = {1, 2, 3};
#define NCOUNTS (int)(sizeof worker_counts / sizeof worker_counts[0])

/* One sequence through a bundle: what was fed and what came out. */
typedef struct Run {
    int ntok, vocab;
    int tokens[MAX_PROMPT + NDECODE];   /* fed at each position */
    int argmax[MAX_PROMPT + NDECODE];   /* the kernel's greedy choice after it */
    float *logits;                      /* (ntok, vocab) */
} Run;

static int failures;

static void fail(const char *fmt, ...) MEGAC_PRINTF(1, 2);
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tsan_e2e: FAIL: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    failures++;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_tree(const char *dir)
{
    if (nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS) != 0)
        perror(dir);
}

/* A model's description and weights; `model` is "default" (embedded) or
 * a description file. */
typedef struct Model {
    Arena arena;
    ModelDesc m;
    Weights w;
} Model;

static bool model_load(Model *md, const char *model)
{
    memset(md, 0, sizeof *md);
    Diag d;
    diag_init(&d);
    bool ok = strcmp(model, "default") == 0
                  ? desc_parse(&md->m, &md->arena, "<embedded>", desc_default_yaml, strlen(desc_default_yaml),
                               NULL, 0, &d)
                  : desc_load(&md->m, &md->arena, model, NULL, 0, &d);
    return ok && weights_load(&md->w, &md->m, &d);
}

static void model_free(Model *md)
{
    weights_free(&md->w);
    arena_free(&md->arena);
}

/* ---- the clean run ---- */

/* `megac compile MODEL --target cpu --workers w -o out`, in process. */
static bool bundle_compile(const char *model, int w, const char *out)
{
    CompileOptions o;
    memset(&o, 0, sizeof o);
    o.model = model;
    o.target = "cpu";
    o.workers = w;
    o.out = out;
    o.quiet = true;
    return driver_compile(&o) == 0;
}

/* reset, the prompt, then NDECODE greedy steps fed the kernel's choice. */
static bool run_sequence(megac_model *mm, const int *prompt, int nprompt, Run *r)
{
    r->vocab = megac_vocab_size(mm);
    r->ntok = 0;
    r->logits = realloc(r->logits, sizeof(float) * (size_t)r->vocab * (MAX_PROMPT + NDECODE));
    if (!r->logits || megac_reset(mm) != MEGAC_OK)
        return false;
    int tok = prompt[0];
    for (int pos = 0; pos < nprompt + NDECODE; pos++) {
        if (pos < nprompt)
            tok = prompt[pos];
        if (megac_step(mm, tok) != MEGAC_OK) {
            fail("megac_step at position %d: %s", pos, megac_error(mm));
            return false;
        }
        r->tokens[pos] = tok;
        r->argmax[pos] = tok = megac_argmax(mm);
        memcpy(r->logits + (size_t)pos * (size_t)r->vocab, megac_logits(mm), sizeof(float) * (size_t)r->vocab);
        r->ntok = pos + 1;
    }
    return true;
}

static bool run_equal(const Run *a, const Run *b)
{
    return a->ntok == b->ntok && a->vocab == b->vocab &&
           !memcmp(a->tokens, b->tokens, sizeof(int) * (size_t)a->ntok) &&
           !memcmp(a->argmax, b->argmax, sizeof(int) * (size_t)a->ntok) &&
           !memcmp(a->logits, b->logits, sizeof(float) * (size_t)a->ntok * (size_t)a->vocab);
}

typedef struct Collected {
    int n;
    int tokens[NDECODE];
} Collected;

static int collect_token(void *user, int token, const char *text)
{
    (void)text;
    Collected *c = user;
    if (c->n < NDECODE)
        c->tokens[c->n++] = token;
    return 0;
}

/* megac_generate (greedy) picks what the step loop picked, until it stops
 * (at EOS/BOS, or after NDECODE tokens). */
static void check_generate(megac_model *mm, const int *prompt, int nprompt, const Run *r, int w)
{
    megac_sampler greedy = {0.0f, 0, 1.0f, 0};
    Collected c = {0};
    if (megac_reset(mm) != MEGAC_OK ||
        megac_generate(mm, prompt, nprompt, NDECODE, &greedy, collect_token, &c, NULL) != MEGAC_OK) {
        fail("megac_generate at %d workers: %s", w, megac_error(mm));
        return;
    }
    for (int i = 0; i < c.n; i++)
        if (c.tokens[i] != r->argmax[nprompt - 1 + i])
            fail("megac_generate at %d workers: token %d is %d, the step loop's %d", w, i, c.tokens[i],
                 r->argmax[nprompt - 1 + i]);
}

/* One bundle: two sequences around a reset (bit-identical), and generate. */
static bool bundle_exercise(const char *dir, const int *prompt, int nprompt, int w, Run *r)
{
    megac_model *mm;
    if (megac_open(dir, &mm) != MEGAC_OK) {
        fail("megac_open at %d workers: %s", w, megac_last_open_error());
        return false;
    }
    Run again = {0};
    bool ok = run_sequence(mm, prompt, nprompt, r) && run_sequence(mm, prompt, nprompt, &again);
    if (ok && !run_equal(r, &again))
        fail("at %d workers the sequence after a reset is not bit-identical", w);
    if (ok)
        check_generate(mm, prompt, nprompt, r, w);
    free(again.logits);
    megac_close(mm);
    return ok;
}

/* Every step of r against ref_step: logits within atol + rtol * max|logit|
 * (f32 kernel, f64 reference) and the same argmax. */
static void check_reference(const Model *md, const Run *r, int w)
{
    RefState *ref = ref_new(&md->w);
    double worst = 0;
    for (int pos = 0; pos < r->ntok; pos++) {
        const float *want = ref_step(ref, r->tokens[pos], pos);
        const float *got = r->logits + (size_t)pos * (size_t)r->vocab;
        double scale = 0, err = 0;
        int best = 0;
        for (int i = 0; i < r->vocab; i++) {
            scale = fmax(scale, fabs(want[i]));
            err = fmax(err, fabs((double)got[i] - (double)want[i]));
            best = want[i] > want[best] ? i : best;
        }
        worst = fmax(worst, err);
        if (err > ATOL + RTOL * scale)
            fail("%s at %d workers, position %d: max |logit diff| %.3g from the reference", md->m.name, w, pos,
                 err);
        if (best != r->argmax[pos])
            fail("%s at %d workers, position %d: the kernel picks %d, the reference %d", md->m.name, w, pos,
                 r->argmax[pos], best);
    }
    fprintf(stderr, "tsan_e2e: %s, %d workers: %d steps, twice; max |logit diff| from the reference %.3g\n",
            md->m.name, w, r->ntok, worst);
    ref_free(ref);
}

/* The first prompt of a bundle, tokenized by the bundle's tokenizer. */
static int prompt_encode(const char *dir, int *prompt)
{
    megac_model *mm;
    if (megac_open(dir, &mm) != MEGAC_OK) {
        fail("megac_open: %s", megac_last_open_error());
        return -1;
    }
    int n = megac_encode(mm, PROMPT, -1, prompt, MAX_PROMPT);
    megac_close(mm);
    return n;
}

/* One model at every worker count, its bundles in tmp. */
static void clean_model(const char *model, const char *tmp)
{
    char dirs[NCOUNTS][64];
    for (int i = 0; i < NCOUNTS; i++) {
        snprintf(dirs[i], sizeof dirs[i], "%s/w%d.megac", tmp, worker_counts[i]);
        if (!bundle_compile(model, worker_counts[i], dirs[i])) {
            fail("compiling %s for %d workers", model, worker_counts[i]);
            return;
        }
    }
    Model md;
    int prompt[MAX_PROMPT], nprompt = prompt_encode(dirs[0], prompt);
    if (nprompt < 1 || !model_load(&md, model)) {
        fail("cannot tokenize the prompt or load %s", model);
        return;
    }
    Run runs[NCOUNTS] = {{0}};
    for (int i = 0; i < NCOUNTS; i++) {
        if (!bundle_exercise(dirs[i], prompt, nprompt, worker_counts[i], &runs[i]))
            continue;
        check_reference(&md, &runs[i], worker_counts[i]);
        if (memcmp(runs[i].argmax, runs[0].argmax, sizeof runs[0].argmax) != 0)
            fail("%s: %d workers pick other tokens than %d", md.m.name, worker_counts[i], worker_counts[0]);
    }
    for (int i = 0; i < NCOUNTS; i++)
        free(runs[i].logits);
    model_free(&md);
}

static int run_clean(void)
{
    char tmp[] = "/tmp/megac-tsan-XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 2;
    }
    clean_model("default", tmp);
    rm_tree(tmp);
    if (access(STORIES_BIN, R_OK) == 0 && mkdtemp(strcpy(tmp, "/tmp/megac-tsan-XXXXXX"))) {
        clean_model(STORIES_YAML, tmp);
        rm_tree(tmp);
    } else
        fprintf(stderr, "tsan_e2e: stories260K skipped: %s is absent\n", STORIES_BIN);
    fprintf(stderr, "tsan_e2e: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

/* ---- the negative control ---- */

static void inst_remove(Worker *w, uint32_t i)
{
    memmove(w->insts + i, w->insts + i + 1, sizeof(Inst) * (w->ninst - i - 1));
    w->ninst--;
}

static void inst_insert(Worker *w, uint32_t i, Inst in)
{
    memmove(w->insts + i + 1, w->insts + i, sizeof(Inst) * (w->ninst - i));
    w->insts[i] = in;
    w->ninst++;
}

static int races_found(const Schedule *s, const Target *t, FILE *out)
{
    ValOptions vo = {t, 0, 0, 0, NULL};
    ValResult r;
    memset(&r, 0, sizeof r);
    Diag d;
    diag_init(&d);
    d.out = out;
    d.max_errors = 2;
    val_schedule_check(s, &vo, &d, &r);
    return r.nrace;
}

/* Removes the first wait whose absence the validator calls a race. */
static bool wait_drop(Schedule *s, const Target *t)
{
    FILE *null = fopen("/dev/null", "w");
    if (!null)
        return false;
    for (uint32_t w = 0; w < s->nworkers; w++) {
        Worker *wk = &s->workers[w];
        for (uint32_t i = 0; i < wk->ninst; i++) {
            Inst in = wk->insts[i];
            if (in.kind != INST_WAIT)
                continue;
            inst_remove(wk, i);
            if (races_found(s, t, null) > 0) {
                fclose(null);
                fprintf(stderr, "tsan_e2e: dropped worker %u's instruction %u (wait c%u >= %u); the validator says:\n",
                        w, i, in.counter, in.amount);
                races_found(s, t, stderr);
                return true;
            }
            inst_insert(wk, i, in);
        }
    }
    fclose(null);
    return false;
}

/* Writes the racy bundle to dir: lower, drop a wait, cg_cpu_compile (no
 * validator), bundle_write. */
static bool racy_bundle_write(Model *md, const char *dir)
{
    Diag d;
    diag_init(&d);
    const Target *t = target_lookup("cpu", &d);
    Tokenizer *tok = tok_import(&md->m, &d);
    Schedule *s = t && tok ? lower_model(&md->m, t, 2, &d) : NULL;
    bool ok = s != NULL;
    if (ok) {
        sched_layout(s);
        ok = wait_drop(s, t);
        if (!ok)
            fprintf(stderr, "tsan_e2e: no single wait of the schedule is needed against a race\n");
    }
    char *so = xasprintf("%s/kernel.so", dir);
    ok = ok && mkdir(dir, 0777) == 0 && cg_cpu_compile(s, NULL, so, &d) &&
         bundle_write(dir, &md->m, &md->w, tok, s, "kernel.so", NULL, &d);
    free(so);
    if (s)
        sched_free(s);
    if (tok)
        tok_free(tok);
    return ok;
}

/* Runs in a child process: TSan's halt_on_error ends it at the race, and
 * the parent removes the folder either way. */
static int race_child(const char *tmp)
{
    Model md;
    if (!model_load(&md, "default")) {
        fprintf(stderr, "tsan_e2e: cannot load the model\n");
        return 2;
    }
    char dir[64];
    snprintf(dir, sizeof dir, "%s/race.megac", tmp);
    int rc = 2;
    megac_model *mm;
    if (racy_bundle_write(&md, dir) && megac_open(dir, &mm) == MEGAC_OK) {
        int tok = megac_bos(mm);
        for (int pos = 0; pos < 16 && megac_step(mm, tok) == MEGAC_OK; pos++)
            tok = megac_argmax(mm);
        megac_close(mm);
        fprintf(stderr, "tsan_e2e: ran the racy kernel\n");
        rc = 0;
    }
    model_free(&md);
    return rc;
}

static int run_race(void)
{
    char tmp[] = "/tmp/megac-tsan-race-XXXXXX";
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "tsan_e2e: cannot make a folder: %s\n", strerror(errno));
        return 2;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(race_child(tmp));
    int st = 0, rc = 2;
    if (pid < 0)
        fprintf(stderr, "tsan_e2e: fork: %s\n", strerror(errno));
    else if (waitpid(pid, &st, 0) == pid)
        rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    rm_tree(tmp);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--race"))
        return run_race();
    if (argc != 1) {
        fprintf(stderr, "usage: tsan_e2e [--race]\n");
        return 2;
    }
    return run_clean();
}
