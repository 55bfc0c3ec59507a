/*
 * cmd_eval_quant.c - `megac eval-quant`: how much each quantized format
 * changes a model's predictions (quant_eval.c does the measuring).
 *
 *   megac eval-quant MODEL.yaml [--formats LIST] [--classes LIST] [--tokens N]
 *                    [--prompt TEXT] [--engine reference|cpu] [--set key=value]...
 *                    [--json FILE]
 */
#include "compiler/cli.h"
#include "compiler/compile.h"
#include "compiler/quant.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EVAL_MAX_SETS 64
#define EVAL_MAX_FORMATS 16

/* ---- the command ---- */

typedef struct EvalArgs {
    const char *model, *prompt, *json, *formats, *classes, *engine;
    int tokens;
    DescOverride set[EVAL_MAX_SETS];
    int nset;
} EvalArgs;

static void eval_usage(FILE *out)
{
    fprintf(out, "usage: megac eval-quant MODEL [--formats LIST] [--classes LIST] [--tokens N]\n"
                 "                        [--prompt TEXT] [--engine E] [--set key=value]... [--json FILE]\n\n"
                 "Teacher-forced fidelity of quantized weights: runs the float64 reference over\n"
                 "a fixed token stream (BOS and the prompt, continued greedily by the model as\n"
                 "loaded) for the baseline (quant none) and for each format, applied to the\n"
                 "chosen tensor classes, and prints the mean KL divergence from the baseline, the\n"
                 "same-top-1 rate, the first differing position, the perplexity of the stream\n"
                 "and the bits per matrix weight.\n\n"
                 "  --formats LIST  comma-separated: f32 f16 bf16 w8a16 w4a16[-g32|-g64|-g128]\n"
                 "                  w8a8 w4a8[-g32|-g64|-g128] a8 (these three with --engine cpu;\n"
                 "                  a8: the stored weights with int8 inputs where they have\n"
                 "                  such a form, e.g. a GGUF file's Q4_0/Q4_1/Q5_0/Q5_1/Q8_0)\n"
                 "                  (default w8a16,w4a16-g32,w4a16-g64,w4a16-g128)\n"
                 "  --classes LIST  tensor classes the formats apply to: embed attn mlp lm_head\n"
                 "                  (default all; the others keep their source)\n"
                 "  --tokens N      positions, 2 to the model's max_seq (default 64)\n"
                 "  --prompt TEXT   start of the stream (default \"Once upon a time\"); a prompt\n"
                 "                  of more than N tokens is cut to its first N (with a note)\n"
                 "  --engine E      what runs the formats: reference (float64, default) or cpu\n"
                 "                  (a compiled CPU bundle: the kernel path)\n"
                 "  --set key=value override a description key (repeatable)\n"
                 "  --json FILE     also write the figures as JSON (its folder must exist)\n");
}

static bool eval_args_parse(EvalArgs *a, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool opt = s[0] == '-' && s[1];
        bool known = !strcmp(s, "--formats") || !strcmp(s, "--engine") || !strcmp(s, "--classes") ||
                     !strcmp(s, "--prompt") || !strcmp(s, "--json") || !strcmp(s, "--tokens") ||
                     !strcmp(s, "--set");
        if (opt && (!known || i + 1 >= argc))
            return cli_bad_arg("eval-quant", s, known);
        if (!strcmp(s, "--formats")) {
            a->formats = argv[++i];
        } else if (!strcmp(s, "--engine")) {
            a->engine = argv[++i];
            if (strcmp(a->engine, "reference") && strcmp(a->engine, "cpu")) {
                fprintf(stderr, "megac eval-quant: --engine is reference or cpu, not '%s'\n", a->engine);
                return false;
            }
        } else if (!strcmp(s, "--classes")) {
            a->classes = argv[++i];
        } else if (!strcmp(s, "--prompt")) {
            a->prompt = argv[++i];
        } else if (!strcmp(s, "--json")) {
            a->json = argv[++i];
        } else if (!strcmp(s, "--tokens")) {
            long v;
            if (!cli_parse_long(argv[++i], 2, 1000000, &v)) {
                fprintf(stderr, "megac eval-quant: --tokens needs a number in 2..1000000, not '%s'\n", argv[i]);
                return false;
            }
            a->tokens = (int)v;
        } else if (!strcmp(s, "--set")) {
            if (!cli_set_add("eval-quant", argv[++i], a->set, &a->nset, EVAL_MAX_SETS))
                return false;
        } else if (a->model) {
            fprintf(stderr, "megac eval-quant: more than one model given ('%s', '%s')\n", a->model, s);
            return false;
        } else {
            a->model = s;
        }
    }
    if (!a->model)
        fprintf(stderr, "megac eval-quant: no model given\n");
    return a->model != NULL;
}

/* The next item of a comma-separated list at *p (cut in place; empty
 * where two commas meet or after a last comma), NULL past the end. */
static char *list_next(char **p)
{
    char *t = *p;
    if (!t)
        return NULL;
    char *c = strchr(t, ',');
    *p = c ? c + 1 : NULL;
    if (c)
        *c = 0;
    return t;
}

/* Splits the comma-separated list, each format once; false (after printing
 * why) on a bad or empty name. */
static bool eval_formats_parse(const char *list, QuantSpec *f, int *n)
{
    char *s = xstrdup(list), *at = s;
    bool ok = true;
    *n = 0;
    for (char *t = *s ? list_next(&at) : NULL; t && ok; t = list_next(&at)) {
        QuantSpec q;
        ok = *n < EVAL_MAX_FORMATS && quant_spec_parse(t, &q) && quant_spec_dtype(q, DT_F32) >= 0 &&
             q.kind != QUANT_NONE;
        if (!ok)
            fprintf(stderr, "megac eval-quant: bad format '%s' (f32, f16, bf16, w8a16, w4a16[-g32|-g64|-g128], "
                            "w8a8, w4a8[-g32|-g64|-g128], a8; at most %d)\n", t, EVAL_MAX_FORMATS);
        else {
            int j = 0;
            while (j < *n && (f[j].kind != q.kind || f[j].group != q.group))
                j++;
            if (j < *n)
                fprintf(stderr, "megac eval-quant: note: format '%s' is named again; measured once\n", t);
            else
                f[(*n)++] = q;
        }
    }
    free(s);
    if (ok && *n == 0)
        fprintf(stderr, "megac eval-quant: --formats names no format\n");
    return ok && *n > 0;
}

/* The class list as a bit set (1 << TensorClass); 0 after printing why. */
static unsigned eval_classes_parse(const char *list)
{
    static const char *const names[] = {
#define X(n, s) s,
        TCLASS_LIST(X)
#undef X
    };
    char *s = xstrdup(list), *at = s;
    unsigned set = 0;
    for (char *t = *s ? list_next(&at) : NULL; t; t = list_next(&at)) {
        int c = TCLASS_COUNT;
        while (--c >= 0 && strcmp(t, names[c]) != 0)
            ;
        if (c < 0) {
            fprintf(stderr, "megac eval-quant: unknown tensor class '%s' (embed, attn, mlp, lm_head)\n", t);
            set = 0;
            break;
        }
        set |= 1u << c;
    }
    free(s);
    if (!set && !*list)
        fprintf(stderr, "megac eval-quant: --classes names no tensor class\n");
    return set;
}

static void eval_print(FILE *out, const ModelDesc *m, const EvalArgs *a, const QuantEval *e, int n)
{
    fprintf(out, "model %s: %d positions teacher-forced (prompt \"%s\", then the baseline's greedy text); "
            "formats on %s, run by the %s\n", m->name ? m->name : "?", a->tokens, a->prompt, a->classes, a->engine);
    fprintf(out, "%-12s %7s %12s %8s %6s %10s\n", "format", "bpw", "mean_kl", "top1", "first", "ppl");
    for (int i = 0; i <= n; i++) {
        char b[32];
        fprintf(out, "%-12s %7.3f %12.4e %7.2f%% %6d %10.4f\n", i ? quant_spec_str(e[i].spec, b, sizeof b) : "baseline",
                e[i].bpw, e[i].mean_kl, 100 * e[i].top1, e[i].first_diff, e[i].ppl);
    }
}

/* s as a JSON string: quotes, backslashes and control bytes escaped, and
 * each byte that is not part of well-formed UTF-8 (a prompt given as raw
 * bytes) written as U+FFFD, since JSON text is Unicode. */
static void eval_json_str(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        int k = tok_utf8_len(s + i, n - i);
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else if (!k)
            fputs("\\ufffd", f);
        else
            fwrite(p + i, 1, (size_t)k, f), i += (size_t)k - 1;
    }
    fputc('"', f);
}

static bool eval_json_write(const char *path, const ModelDesc *m, const EvalArgs *a, const QuantEval *e, int n)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "megac eval-quant: cannot create '%s': %s\n", path, strerror(errno));
        return false;
    }
    fprintf(f, "{\"model\": ");
    eval_json_str(f, m->name ? m->name : "?");
    fprintf(f, ", \"tokens\": %d, \"prompt\": ", a->tokens);
    eval_json_str(f, a->prompt);
    fprintf(f, ", \"classes\": ");
    eval_json_str(f, a->classes);
    fprintf(f, ", \"engine\": ");
    eval_json_str(f, a->engine);
    fprintf(f, ",\n \"baseline\": {\"bpw\": %.6g, \"ppl\": %.9g},\n \"formats\": [\n", e[0].bpw, e[0].ppl);
    for (int i = 1; i <= n; i++) {
        char b[32];
        fprintf(f, "  {\"format\": \"%s\", \"bpw\": %.6g, \"mean_kl\": %.9g, \"top1\": %.9g, \"first_diff\": %d, "
                "\"ppl\": %.9g}%s\n", quant_spec_str(e[i].spec, b, sizeof b), e[i].bpw, e[i].mean_kl, e[i].top1,
                e[i].first_diff, e[i].ppl, i < n ? "," : "");
    }
    fprintf(f, " ]}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "megac eval-quant: cannot write '%s': %s\n", path, strerror(errno));
        return false;
    }
    return true;
}

/* True when path can be written: its folder is writable and it is not a
 * folder or a read-only file. Checked before the evaluation, which is long,
 * rather than found out after it. */
static bool eval_json_writable(const char *path)
{
    if (!*path) {   /* stat("") fails with ENOENT, as for a file yet to be made */
        fprintf(stderr, "megac eval-quant: --json needs a file name\n");
        return false;
    }
    const char *slash = strrchr(path, '/');
    char *dir = slash ? xstrndup(path, slash == path ? 1 : (size_t)(slash - path)) : xstrdup(".");
    struct stat st;
    int err = 0;
    if (stat(path, &st) == 0)
        err = S_ISDIR(st.st_mode) ? EISDIR : access(path, W_OK) != 0 ? errno : 0;
    else if (errno != ENOENT || access(dir, W_OK | X_OK) != 0)
        err = errno;
    free(dir);
    if (err)
        fprintf(stderr, "megac eval-quant: cannot write '%s': %s\n", path, strerror(err));
    return err == 0;
}

/* Loads the description, checks the token count, runs, reports. */
static int eval_run(EvalArgs *a, unsigned classes, const QuantSpec *f, int nf)
{
    Arena arena = {0};
    ModelDesc m;
    Diag d;
    diag_init(&d);
    d.prog = "megac eval-quant";
    int rc = 2;
    if (desc_load(&m, &arena, a->model, a->set, a->nset, &d) && desc_check(&m, &d)) {
        if (m.max_seq < 2) {
            fprintf(stderr, "megac eval-quant: the model's max_seq is %d; a measure needs at least 2 positions (a "
                            "prompt token and one to predict)\n", m.max_seq);
            arena_free(&arena);
            return 2;
        }
        if (a->tokens > m.max_seq) { /* as eval-kv and run's -n */
            fprintf(stderr, "megac eval-quant: note: --tokens %d is more than the model's max_seq; evaluating %d\n",
                    a->tokens, m.max_seq);
            a->tokens = m.max_seq;
        }
        if (!(a->json && (cli_out_is_input("eval-quant", a->json, &m) || !eval_json_writable(a->json)))) {
            QuantEval *e = xcalloc((size_t)nf + 1, sizeof *e);
            QuantEvalRun r = {a->prompt, a->tokens, classes, a->engine, a->model, a->set, a->nset, true};
            if (quant_eval(&m, &r, f, nf, e, &d)) {
                eval_print(stdout, &m, a, e, nf);
                rc = a->json && !eval_json_write(a->json, &m, a, e, nf) ? 2 : 0;
            }
            free(e);
        }
    }
    arena_free(&arena);
    return rc;
}

int cmd_eval_quant(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        eval_usage(stdout);
        return 0;
    }
    EvalArgs a = {.prompt = "Once upon a time", .formats = "w8a16,w4a16-g32,w4a16-g64,w4a16-g128",
                  .classes = "embed,attn,mlp,lm_head", .engine = "reference", .tokens = 64};
    QuantSpec f[EVAL_MAX_FORMATS];
    int nf = 0, rc = 2;
    unsigned classes = 0;
    if (!eval_args_parse(&a, argc, argv) || !eval_formats_parse(a.formats, f, &nf) ||
        !(classes = eval_classes_parse(a.classes)))
        eval_usage(stderr);
    else
        rc = eval_run(&a, classes, f, nf);
    cli_sets_free(a.set, a.nset);
    return rc;
}
