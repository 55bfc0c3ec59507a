/*
 * cmd_run.c - `megac run`: decode text from a model description (with the
 * plain-C reference) or from a compiled bundle (with the runtime).
 *
 * The generation loop follows llama2.c's run.c so that its output can be
 * compared byte for byte: the prompt is encoded (BOS first where the
 * tokenizer wants it, see run_ref_encode); position pos feeds token[pos];
 * while the prompt lasts the next token is forced, afterwards it is
 * sampled; every next token is printed as it comes (the prompt included)
 * and the loop stops when pos reaches -n (which counts BOS) or when the
 * model samples BOS or EOS (a prompt may contain them: chat formats do). A newline ends the text.
 * Statistics go to stderr so that stdout is the text alone.
 */
#include "compiler/cli.h"
#include "compiler/compile.h"
#include "compiler/driver.h"
#include "compiler/reference.h"
#include "compiler/run.h"
#include "runtime/megac.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const run_engine_names[] = {
#define X(n, s) s,
    RUN_ENGINE_LIST(X)
#undef X
};
_Static_assert(sizeof run_engine_names / sizeof run_engine_names[0] == ENGINE_COUNT && ENGINE_COUNT == 4,
               "one name per engine; run_option_apply's --engine message lists four");

const char *run_engine_name(RunEngine e)
{
    return e >= 0 && e < ENGINE_COUNT ? run_engine_names[e] : "default";
}

static void run_usage(FILE *out)
{
    fprintf(out,
            "usage: megac run [MODEL | NAME.megac] [options]\n\n"
            "Decodes text. MODEL is a description (.yaml), a GGUF file, an HF\n"
            "checkpoint folder (config.json, safetensors, tokenizer.json) or a llama2.c\n"
            "checkpoint (.bin, its tokenizer beside it); with no model\n"
            "(or 'default'), runs the embedded default model.\n\n"
            "options:\n"
            "  --engine E         cpu | host-cuda | cuda | reference (default: a bundle's\n"
            "                     own target; for a model cpu: it is compiled to a cached\n"
            "                     bundle in .megac-cache/, for cuda as the GPU's cubin\n"
            "                     with a block per SM)\n"
            "  -p, --prompt TEXT  prompt (default: none, start from BOS)\n"
            "  --prompt-file F    the prompt is file F's text ('-': standard input) but\n"
            "                     for its last newline, if it ends with one\n"
            "  -n N               positions to run, BOS and prompt included\n"
            "                     (default 256; 0 = the model's context); past the\n"
            "                     context the cache is shifted each time it fills\n"
            "                     (keeps the prompt, or BOS where the prompt is more\n"
            "                     than half of it, drops half of the rest) and goes on\n"
            "  --temp T           temperature, 0 = greedy (default 1)\n"
            "  --top-k K          keep the K most probable tokens (default 0 = off)\n"
            "  --top-p P          nucleus sampling mass (default 0.9; 1 = off)\n"
            "  --seed S           sampler seed (default: from the clock)\n"
            "  --set KEY=VALUE    override a model description key (repeatable)\n"
            "  --workers N        workers of the bundle a model is compiled into\n"
            "                     (1..4096; a bundle given keeps its own count)\n"
            "  --chat             the prompt is a user turn in the model's chat format\n"
            "                     (ChatML, Llama 3, Zephyr, Llama 2 or Phi-3, as its chat template\n"
            "                     writes, else from the tokenizer's special tokens),\n"
            "                     after the system turn the template writes when none\n"
            "                     is given (SmolLM2's, Qwen2.5's; Llama 3.1-3.3's always,\n"
            "                     dated as it dates it: 3.2's with today's date); the\n"
            "                     reply follows\n"
            "  --system TEXT      a system turn before it (implies --chat)\n"
            "  -i, --interactive  a conversation: each line of standard input is a user\n"
            "                     turn (the first may be --prompt), each reply generated\n"
            "                     on the cache the conversation left, in a window of -n\n"
            "                     positions (default: the model's context): when a turn\n"
            "                     would not fit, the oldest turns are dropped (the first\n"
            "                     prompt kept) and the cache shifted over them (the rest\n"
            "                     moved down, their keys turned to their new positions,\n"
            "                     as llama.cpp's context shift; read again where the\n"
            "                     cache evicts or keeps Quest pages); a line that is\n"
            "                     no turn it can take (a NUL byte, too many tokens even\n"
            "                     then) is skipped, said, and the status is 2 at the\n"
            "                     end; bundle engines only (implies --chat)\n"
            "  --no-context-shift no shifts: a run stops at the model's context, and -i\n"
            "                     reads the kept turns again from position 0 (slower;\n"
            "                     their cache rows then hold nothing of the dropped turns)\n"
            "  -h, --help         this text\n\n"
            "The text goes to stdout; prompt/generated token counts and tok/s to stderr.\n"
            "Exit status: 0 done, 1 the run failed (logits that cannot be sampled, a kernel\n"
            "error, stdout closed), 2 bad options or input (a prompt, a turn, standard\n"
            "input), or a model or bundle that does not load.\n");
}

/* ---- option parsing ---- */

static bool run_parse_float(const char *s, double lo, double hi, float *out)
{
    double v;
    if (!cli_parse_double(s, lo, hi, &v))
        return false;
    *out = (float)v;
    return true;
}

static RunEngine run_engine_from_name(const char *s)
{
    for (int e = 0; e < ENGINE_COUNT; e++)
        if (strcmp(s, run_engine_names[e]) == 0)
            return (RunEngine)e;
    return ENGINE_COUNT;
}

/* Any directory but a bundle is a model (an HF checkpoint folder;
 * desc_load says what one without a config.json lacks). */
bool run_model_is_bundle(const char *path)
{
    size_t n = strlen(path);
    if (n >= 6 && strcmp(path + n - 6, ".megac") == 0)
        return true;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return false;
    char *manifest = xasprintf("%s/manifest.yaml", path);
    bool bundle = access(manifest, F_OK) == 0;
    free(manifest);
    return bundle;
}

/* "megac run: OPT needs WHAT, not 'VAL'" (what: printf format and
 * arguments), as cli_workers_parse words it; returns 2. */
static int MEGAC_PRINTF(3, 4) run_bad_value(const char *opt, const char *val, const char *what, ...)
{
    fprintf(stderr, "megac run: %s needs ", opt);
    va_list ap;
    va_start(ap, what);
    vfprintf(stderr, what, ap);
    va_end(ap);
    fprintf(stderr, ", not '%.64s%s'\n", val, strlen(val) > 64 ? "..." : "");
    return 2;
}

#define RUN_MAX_STEPS (1L << 30)    /* -n and --top-k */

/* Applies one option that takes a value; returns -1 when accepted. */
static int run_option_apply(RunOptions *o, const char *opt, const char *val)
{
    long v;
    if (!strcmp(opt, "--engine")) {
        o->engine = run_engine_from_name(val);
        if (o->engine == ENGINE_COUNT)
            return run_bad_value(opt, val, "one of %s, %s, %s or %s", run_engine_names[0], run_engine_names[1],
                                 run_engine_names[2], run_engine_names[3]);
        o->engine_given = true;
    } else if (!strcmp(opt, "--prompt") || !strcmp(opt, "-p") || !strcmp(opt, "--prompt-file")) {
        if (o->prompt) {
            fprintf(stderr, "megac run: the prompt is given twice (--prompt, -p, --prompt-file)\n");
            return 2;
        }
        if (strcmp(opt, "--prompt-file")) {
            o->prompt = val;
            return -1;
        }
        size_t len = 0;
        char *t = read_file_max(strcmp(val, "-") ? val : "/dev/stdin", &len, RUN_MAX_TEXT);
        if (!t) {
            fprintf(stderr, "megac run: --prompt-file %s: cannot read: %s\n", val,
                    errno == ENODEV  ? "not a regular file (a device)"
                    : errno == EFBIG ? "more than 256 MiB, the most a prompt may be"
                                     : strerror(errno));
            return 2;
        }
        if (strlen(t) != len) {
            fprintf(stderr, "megac run: --prompt-file %s: a NUL byte at offset %zu: a prompt is text\n", val,
                    strlen(t));
            free(t);
            return 2;
        }
        if (len && t[len - 1] == '\n')  /* what an editor ends a file with; a second one stays */
            t[--len] = 0;
        o->prompt = o->prompt_text = t;
    } else if (!strcmp(opt, "-n")) {
        if (!cli_parse_long(val, 0, RUN_MAX_STEPS, &v))
            return run_bad_value(opt, val, "a number in 0..%ld (0: the model's context)", RUN_MAX_STEPS);
        o->steps = (int)v;
        o->steps_given = true;
    } else if (!strcmp(opt, "--temp")) {
        if (!run_parse_float(val, 0, 1e6, &o->temperature))
            return run_bad_value(opt, val, "a number in 0..1e6 (0: greedy)");
    } else if (!strcmp(opt, "--top-k")) {
        if (!cli_parse_long(val, 0, RUN_MAX_STEPS, &v))
            return run_bad_value(opt, val, "a number in 0..%ld (0: off)", RUN_MAX_STEPS);
        o->top_k = (int)v;
    } else if (!strcmp(opt, "--top-p")) {
        if (!run_parse_float(val, 0, 1, &o->top_p) || o->top_p <= 0)
            return run_bad_value(opt, val, "a number above 0 as a float, at most 1 (1: off)");
    } else if (!strcmp(opt, "--seed")) {
        if (!cli_parse_u64(val, &o->seed))
            return run_bad_value(opt, val, "a number in 0..%llu", (unsigned long long)UINT64_MAX);
        o->seed_given = true;
    } else if (!strcmp(opt, "--set")) {
        if (!cli_set_add("run", val, o->sets, &o->nsets, RUN_MAX_SETS))
            return 2;
    } else if (!strcmp(opt, "--workers")) {
        if (!cli_workers_parse("run", val, &o->workers))
            return 2;
    } else if (!strcmp(opt, "--system")) {
        o->system = val;
        o->chat = true;
    } else {
        fprintf(stderr, "megac run: unknown option '%s'\n", opt);
        return 2;
    }
    return -1;
}

/* ---- chat formats ---- */

/* How a format strips its texts as the template does (Jinja's trim and
 * Python's strip()): not at all, each turn's text (Llama 3's
 * `content | trim`), or the text of one [INST] block, its <<SYS>> turn and
 * the user's together (Llama 2's `content.strip()`). */
typedef enum { TRIM_NONE, TRIM_TURNS, TRIM_BLOCK } ChatTrim;

/* A chat format: the chat template kind that names it, the special token
 * that identifies it where no template does (NULL: only a template), what
 * the first turn starts with, printf formats of a system turn and a user
 * turn (the text, then the EOS token's text: "%.0s" where unused), the
 * start of the assistant's reply, what ends a reply (the stop token,
 * which generation samples but does not run, and what follows it; the
 * EOS text its one argument), and a block the system and user turns are
 * written into together ("%s"; NULL: none). */
typedef struct {
    ChatKind kind;
    const char *marker, *first, *system, *user, *reply, *end, *block;
    ChatTrim trim;
} ChatFormat;

#define LLAMA3_TURNS                                                                                                  \
    "<|begin_of_text|>", "<|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>%.0s",                           \
        "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|>%.0s",                                               \
        "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>%.0s", NULL, TRIM_TURNS

static const ChatFormat chat_formats[] = {
    {CHAT_CHATML, "<|im_start|>", "", "<|im_start|>system\n%s<|im_end|>\n%.0s", "<|im_start|>user\n%s<|im_end|>\n%.0s",
     "<|im_start|>assistant\n", "<|im_end|>\n%.0s", NULL, TRIM_NONE},
    {CHAT_LLAMA3, "<|start_header_id|>", LLAMA3_TURNS},
    /* Llama 3.1: the same turns, and a system turn always (run_turn_text) */
    {CHAT_LLAMA31, NULL, LLAMA3_TURNS},
    {CHAT_LLAMA31_TODAY, NULL, LLAMA3_TURNS},
    {CHAT_ZEPHYR, NULL, "", "<|system|>\n%s%s\n", "<|user|>\n%s%s\n", "<|assistant|>\n", "%s\n", NULL, TRIM_NONE},
    /* Llama 2: the system turn inside the first [INST]; a reply is
     * followed by ' ' and EOS (the template's ' ' + reply + ' ' + eos:
     * the reply's own first token brings the space before it) */
    {CHAT_LLAMA2, NULL, "", "<<SYS>>\n%s\n<</SYS>>\n\n%.0s", "%s%.0s", "", " %s", "<s>[INST] %s [/INST]", TRIM_BLOCK},
    /* Phi-3: Zephyr's turns, each ended by <|end|> rather than EOS */
    {CHAT_PHI3, NULL, "", "<|system|>\n%s<|end|>\n%.0s", "<|user|>\n%s<|end|>\n%.0s", "<|assistant|>\n",
     "<|end|>\n%.0s", NULL, TRIM_NONE},
};

static const ChatFormat *chat_format(const RunOptions *o, const RunChat *c)
{
    for (size_t i = 0; i < sizeof chat_formats / sizeof *chat_formats; i++)
        if (c->kind == (int)chat_formats[i].kind)
            return &chat_formats[i];
    for (size_t i = 0; i < sizeof chat_formats / sizeof *chat_formats; i++)
        if (chat_formats[i].marker && c->is_special(c->ctx, chat_formats[i].marker))
            return &chat_formats[i];
    fprintf(stderr, "megac run: %s: this model's tokenizer has no chat format megac knows (no chat template "
                    "megac recognizes, and neither ChatML's <|im_start|> nor Llama 3's <|start_header_id|>); %s\n",
            o->interactive ? "-i (a conversation in the model's chat format)" : o->system ? "--system" : "--chat",
            o->interactive ? "run it without -i, the prompt formatted as the model wants it"
                           : "give the formatted text with --prompt");
    return NULL;
}

/* Whether Python's str.isspace() holds for code point c: ASCII's white
 * space, \x1c-\x1f, and the Unicode spaces. */
static bool py_space(unsigned c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

/* text without the white space at its ends, as Python's strip(). */
static char *stripped(const char *text)
{
    size_t n = strlen(text), a = 0, b = 0;   /* [a, b): from the first character not a space to past the last */
    bool seen = false;
    for (size_t i = 0, k; i < n; i += k) {
        unsigned cp;
        k = utf8_next(text + i, n - i, &cp);
        if (py_space(cp) && k == (cp < 0x80 ? 1u : cp < 0x800 ? 2u : 3u))  /* not a stray byte 0x85 or 0xa0 */
            continue;
        if (!seen)
            a = i, seen = true;
        b = i + k;
    }
    return xstrndup(text + a, b - a);
}

/* "07 Dec 2026": the local day, as strftime_now("%d %b %Y") writes it
 * (the template's own fallback date where the clock cannot be read). */
static void today_write(char out[32])
{
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(out, 32, "%d %b %Y", &tm))
        snprintf(out, 32, "26 Jul 2024");
}

char *run_prompt_text(const RunOptions *o, const RunChat *c)
{
    return run_turn_text(o, o->prompt ? o->prompt : "", true, c);
}

char *run_turn_text(const RunOptions *o, const char *prompt, bool first, const RunChat *c)
{
    size_t len = strlen(prompt), slen = o->system ? strlen(o->system) : 0;
    if (len > RUN_MAX_TEXT || slen > RUN_MAX_TEXT) {
        fprintf(stderr, "megac run: the %s is %zu bytes: more than 256 MiB, the most megac reads\n",
                len > RUN_MAX_TEXT ? (o->interactive ? "turn" : "prompt") : "system turn",
                len > RUN_MAX_TEXT ? len : slen);
        return NULL;
    }
    if (!o->chat)
        return xstrdup(prompt);
    const ChatFormat *f = chat_format(o, c);
    if (!f)
        return NULL;
    const char *eos = c->eos ? c->eos : "";
    bool dated = chat_kind_dated(f->kind);
    /* a Llama 3.1 template's preamble, else a ChatML template's default
     * system turn where the conversation gives none */
    const char *preamble = dated && c->default_system ? c->default_system : "";
    const char *system = o->system ? o->system : dated ? NULL : c->default_system;
    char *sys = NULL;
    if (first && (system || dated)) {
        char day[32] = "";
        if (f->kind == CHAT_LLAMA31_TODAY && c->today)
            snprintf(day, sizeof day, "%s", c->today);
        else if (f->kind == CHAT_LLAMA31_TODAY)
            today_write(day);
        char *text = f->trim == TRIM_TURNS ? stripped(system ? system : "") : xstrdup(system ? system : "");
        char *whole = xasprintf("%s%s%s%s%s", preamble, *day ? "Today Date: " : "", day, *day ? "\n\n" : "", text);
        sys = xasprintf(f->system, whole, eos);
        free(text);
        free(whole);
    }
    char *text = f->trim == TRIM_TURNS ? stripped(prompt) : xstrdup(prompt);
    char *user = xasprintf(f->user, text, eos);
    free(text);
    char *turns = xasprintf("%s%s", sys ? sys : "", user);
    if (f->block) {
        char *inner = f->trim == TRIM_BLOCK ? stripped(turns) : xstrdup(turns);
        free(turns);
        turns = xasprintf(f->block, inner);
        free(inner);
    }
    char *end = xasprintf(f->end, eos);
    char *out = xasprintf("%s%s%s", first ? f->first : end, turns, f->reply);
    free(sys);
    free(user);
    free(turns);
    free(end);
    return out;
}

static void run_options_default(RunOptions *o)
{
    memset(o, 0, sizeof *o);
    o->engine = ENGINE_DEFAULT;
    o->steps = 256;
    o->temperature = 1.0f;
    o->top_p = 0.9f;
}

/* True for an option that takes a value (run_option_apply's list). */
static bool run_option_known(const char *opt)
{
    static const char *const names[] = {"--engine", "--prompt", "-p",        "--prompt-file", "-n",       "--temp",
                                        "--top-k",  "--top-p",  "--seed",    "--set",         "--workers", "--system"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(opt, names[i]))
            return true;
    return false;
}

/* Grammar: run [MODEL] {OPTION VALUE | OPTION=VALUE | -h | --help} [-- MODEL],
 * in any order; MODEL "default" is the embedded model. (Help is found here
 * rather than with cli_wants_help, which lives in main.c, so that tests can
 * call this without the driver.) */
int run_options_parse(RunOptions *o, int argc, char **argv)
{
    run_options_default(o);
    bool options = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (options && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            run_usage(stdout);
            return 0;
        }
        if (options && !strcmp(a, "--")) {
            options = false;
            continue;
        }
        if (options && !strcmp(a, "--chat")) {
            o->chat = true;
            continue;
        }
        if (options && (!strcmp(a, "--interactive") || !strcmp(a, "-i"))) {
            o->interactive = o->chat = true;
            continue;
        }
        if (options && !strcmp(a, "--no-context-shift")) {
            o->no_shift = true;
            continue;
        }
        if (!options || a[0] != '-' || !a[1]) {
            if (o->model) {
                fprintf(stderr, "megac run: more than one model given ('%s', '%s')\n", o->model, a);
                return 2;
            }
            o->model = a;
            continue;
        }
        char opt[32];
        const char *val;
        if (eq && (size_t)(eq - a) < sizeof opt) {
            memcpy(opt, a, (size_t)(eq - a));
            opt[eq - a] = 0;
            val = eq + 1;
        } else {
            snprintf(opt, sizeof opt, "%s", a);
            if (run_option_known(a) && i + 1 >= argc) {
                fprintf(stderr, "megac run: option '%s' needs a value\n", a);
                run_usage(stderr);
                return 2;
            }
            val = i + 1 < argc ? argv[++i] : "";
        }
        if (!run_option_known(opt)) {
            fprintf(stderr, "megac run: unknown option '%s'\n", a);
            return 2;
        }
        int rc = run_option_apply(o, opt, val);
        if (rc >= 0)
            return rc;
    }
    if (o->model && driver_is_default_model(o->model))
        o->model = NULL;
    o->model_is_bundle = o->model && run_model_is_bundle(o->model);
    if (o->model_is_bundle && o->nsets) {
        fprintf(stderr, "megac run: --set applies to model descriptions, not bundles ('%s')\n", o->model);
        return 2;
    }
    if (o->engine == ENGINE_DEFAULT)
        o->engine = ENGINE_CPU;
    if (!o->seed_given)
        o->seed = (uint64_t)time(NULL);
    return -1;
}

/* ---- the reference engine ---- */

bool run_prompt_fits(int n, int steps, int max_seq)
{
    if (n <= steps)
        return true;
    if (steps >= max_seq)
        fprintf(stderr, "megac run: the prompt has %d tokens, more than the model's context (%d positions)\n", n,
                max_seq);
    else
        fprintf(stderr, "megac run: the prompt has %d tokens, more than the %d positions asked for\n", n, steps);
    return false;
}

bool run_shift_plan(int nprompt, bool bos_first, int W, int *keep, int *drop)
{
    *keep = nprompt <= W / 2 ? nprompt : bos_first;
    *drop = (W - *keep) / 2 < 1 ? 1 : (W - *keep) / 2;
    return *keep + *drop <= W;
}

const char *run_text_name(const RunOptions *o)
{
    return o->interactive ? "the turn in its chat format" : o->chat ? "the prompt in its chat format" : "the prompt";
}

void run_drops_warn(const char *text, const char *what, int n, int first, size_t at)
{
    if (n <= 0)
        return;
    fprintf(stderr, "megac run: warning: %d character%s of %s ha%s no piece and no byte token in the "
            "tokenizer and %s dropped (the first: ", n, n == 1 ? "" : "s", what, n == 1 ? "s" : "ve",
            n == 1 ? "was" : "were");
    if (first >= 0)
        fprintf(stderr, "U+%04X at byte %zu)\n", (unsigned)first, at);
    else
        fprintf(stderr, "the byte 0x%02X, not UTF-8, at byte %zu)\n", (unsigned char)text[at], at);
}

void run_stop_say(int token, int bos, int eos)
{
    fprintf(stderr, "megac run: the model ended the text: it chose token %d, %s\n", token,
            token == eos ? "its EOS" : token == bos ? "its BOS (which ends a text, as in llama2.c)" : "a stop token");
}

void run_no_tokens_say(const char *text)
{
    if (!*text)
        fprintf(stderr, "megac run: an empty prompt starts from the BOS token, and this model names none (its "
                        "description's `bos: ID`, or --set bos=ID); or give a prompt\n");
    else
        fprintf(stderr, "megac run: the prompt gives no tokens: the tokenizer adds no BOS to it, and none of its "
                        "characters has a piece or a byte token\n");
}

static double run_now(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The description named by o->model (NULL or "default": the embedded one). */
static bool run_desc_load(ModelDesc *m, Arena *a, const RunOptions *o, Diag *d)
{
    return desc_load(m, a, o->model, o->sets, o->nsets, d) && desc_check(m, d);
}

bool run_piece_write(const char *piece, int len)
{
    if (len <= 0)
        return true;
    unsigned char c = (unsigned char)piece[0];
    if (len == 1 && c < 0x80 && !isprint(c) && !isspace(c))
        return true;
    return fwrite(piece, 1, (size_t)len, stdout) == (size_t)len && fflush(stdout) == 0;
}

typedef struct {
    const RunOptions *o;
    RefState *ref;
    const Tokenizer *tok;
    const ModelDesc *m;
    int bos, eos;
    int *prompt, nprompt;
    bool bos_added;         /* prompt[0] is the BOS the encoder put there */
    int generated;          /* sampled tokens */
    int positions;          /* steps run */
    bool sample_failed;     /* the sampler refused the logits (reported) */
    int stop;               /* the stop token that ended the text, or -1 */
} RunRef;

/* The llama2.c loop; returns false when stdout fails or the sampler
 * refuses (r->sample_failed, reported). */
static bool run_ref_generate(RunRef *r, const RunOptions *o, int steps)
{
    megac_sampler smp = {o->temperature, o->top_k, o->top_p, o->seed};
    uint64_t rng = 0;
    char piece[512];
    int token = r->prompt[0];
    if (!r->bos_added && !run_piece_write(piece, tok_decode(r->tok, -1, token, piece, sizeof piece)))
        return false;
    int W = r->m->max_seq, at = 0;      /* the cache's next position */
    for (int pos = 0; pos < steps; pos++, at++) {
        if (at == W) { /* past the context: shifted as a bundle's run shifts its cache */
            int keep, drop;
            if (!run_shift_plan(r->nprompt, r->prompt[0] == r->bos, W, &keep, &drop) ||
                !ref_shift(r->ref, keep, drop))
                break;
            fprintf(stderr, "megac run: the context is full (%d positions): dropped %d after the first %d; shifted "
                            "the %d kept down over them\n", W, drop, keep, W - drop - keep);
            at -= drop;
        }
        bool prompt = pos + 1 < r->nprompt;    /* the next token is given: no logits needed */
        const float *logits = NULL;
        if (prompt)
            ref_feed(r->ref, token, at);
        else
            logits = ref_step(r->ref, token, at);
        r->positions++;
        int next;
        if (prompt) {
            next = r->prompt[pos + 1];
        } else {
            next = megac_sample(logits, r->m->vocab_size, &smp, &rng);
            if (next < 0) {
                int bad = 0;
                while (bad < r->m->vocab_size && isfinite(logits[bad]))
                    bad++;
                const char *f16 = r->m->kv_dtype == DT_F16 ? " (the model's KV cache is f16, which holds values up to "
                                                             "65504: where its k or v grow past that, "
                                                             "compile.kv_dtype: bf16 or f32 holds them)"
                                                           : "";
                if (bad < r->m->vocab_size)
                    fprintf(stderr, "megac run: the logits at position %d are not finite: token %d has %g: the "
                                    "model's numbers grow past what f32 holds (weights or activations too large)%s\n",
                            pos, bad, (double)logits[bad], f16);
                else
                    fprintf(stderr, "megac run: position %d: %s\n", pos, megac_error(NULL));
                r->sample_failed = true;
                return false;
            }
            if (next == r->bos || next == r->eos || tok_is_stop(r->tok, next)) {
                r->stop = next;
                break;      /* the stop token is not counted, as in megac_generate */
            }
            r->generated++;
        }
        int len = tok_decode(r->tok, token, next, piece, sizeof piece);
        if (!run_piece_write(piece, len))
            return false;
        token = next;
    }
    return fputc('\n', stdout) != EOF && fflush(stdout) == 0;
}

/* Encodes the prompt. BOS goes first for SPM and byte tokenizers (as
 * llama2.c and llama.cpp do); byte-level BPE vocabularies (SmolLM2, Llama-3)
 * get it only for an empty prompt, since their chat formats bring their own
 * special tokens (write <|begin_of_text|> in the prompt where one is needed).
 * Checks that the ids fit the model. */
/* Whether the tokenizer encodes piece as one token. */
static bool ref_is_special(void *ctx, const char *piece)
{
    int ids[4];
    return tok_encode(ctx, piece, false, ids, 4) == 1;
}

/* The EOS token's text, for a chat format (NULL without one). */
static char *ref_eos_text(const Tokenizer *t, int eos)
{
    size_t len;
    const char *p = eos >= 0 ? tok_piece(t, eos, &len) : NULL;
    return p ? xstrndup(p, len) : NULL;
}

static bool run_ref_encode(RunRef *r, const char *prompt)
{
    const char *text = prompt ? prompt : "";
    bool add_bos = tok_default_bos(r->tok, text);
    int cap = (int)strlen(text) + 8;
    r->prompt = xmalloc(sizeof(int) * (size_t)cap);
    TokDrops drops;
    r->nprompt = tok_encode_drops(r->tok, text, add_bos, r->prompt, cap, &drops);
    run_drops_warn(text, run_text_name(r->o), drops.n, drops.first, drops.first_at);
    r->bos_added = add_bos;
    if (r->nprompt < 1) {
        run_no_tokens_say(text);
        return false;
    }
    for (int i = 0; i < r->nprompt; i++) {
        if (r->prompt[i] < 0 || r->prompt[i] >= r->m->vocab_size) {
            fprintf(stderr, "megac run: prompt token %d is outside the model's vocabulary (%d)\n",
                    r->prompt[i], r->m->vocab_size);
            return false;
        }
    }
    return true;
}

/* Runs the reference once the model and tokenizer are loaded: the weights
 * are loaded (as a compile stores them: WEIGHTS_STORED_ONLY) once the
 * prompt is known to fit, so a bad prompt costs no load. */
static int run_ref_decode(const ModelDesc *m, const Tokenizer *t, const RunOptions *o, Diag *d)
{
    RunRef r = {.o = o, .tok = t, .m = m, .stop = -1};
    r.bos = m->bos_id >= 0 ? m->bos_id : tok_bos(t);
    r.eos = m->eos_id >= 0 ? m->eos_id : tok_eos(t);
    char *eos = ref_eos_text(t, r.eos);
    RunChat chat = {.eos = eos, .is_special = ref_is_special, .ctx = (void *)r.tok};
    chat.kind = (int)tok_chat(t, &chat.default_system);
    char *text = run_prompt_text(o, &chat);
    bool encoded = text && run_ref_encode(&r, text);
    free(text);
    free(eos);
    if (!encoded) {
        free(r.prompt);
        return 2;
    }
    /* past the context the cache is shifted as it fills, where it can be */
    bool can_shift = !o->no_shift && ref_can_shift(m);
    int steps = o->steps <= 0 ? m->max_seq : o->steps > m->max_seq && !can_shift ? m->max_seq : o->steps;
    if (o->steps > steps)
        fprintf(stderr, "megac run: note: -n %d is more than the model's context; running %d positions%s\n", o->steps,
                steps, o->no_shift ? "" : " (this model's cache cannot be shifted)");
    Weights w;
    if (!run_prompt_fits(r.nprompt, steps < m->max_seq ? steps : m->max_seq, m->max_seq) || !driver_weights_fit(m, "the reference engine holds the stored weights in memory", NULL, true, d) ||
        !weights_load_ex(&w, m, WEIGHTS_STORED_ONLY, NULL, d)) {
        free(r.prompt);
        return 2;
    }
    r.ref = ref_new(&w);
    ref_set_prompt_end(r.ref, r.nprompt - 1); /* as megac_generate tells the kernels */
    double t0 = run_now();
    bool ok = run_ref_generate(&r, o, steps);
    double dt = run_now() - t0;
    ref_free(r.ref);
    weights_free(&w);
    free(r.prompt);
    if (!ok && r.sample_failed)
        return 1;   /* as a bundle's run: the model ran and gave logits it cannot sample */
    if (!ok) {
        fprintf(stderr, "megac run: writing the text failed: %s\n", strerror(errno));
        return 1;
    }
    if (r.stop >= 0)
        run_stop_say(r.stop, r.bos, r.eos);
    fprintf(stderr, "prompt tokens: %d, generated tokens: %d, %.1f tok/s (engine reference, %d positions in %.3f s)\n",
            r.nprompt, r.generated, dt > 0 ? r.positions / dt : 0.0, r.positions, dt);
    return 0;
}

int run_reference(const RunOptions *o)
{
    if (o->model_is_bundle) {
        fprintf(stderr, "megac run: engine reference runs a model description (MODEL.yaml), "
                        "not the bundle '%s'\n", o->model);
        return 2;
    }
    Arena arena = {0};
    ModelDesc m;
    Diag d;
    diag_init(&d);
    d.prog = "megac run";
    int rc = 2;
    if (run_desc_load(&m, &arena, o, &d)) {
        bool a8 = false;
        for (int k = 0; k < TCLASS_COUNT; k++)
            a8 |= m.quant[k].kind == QUANT_W8A8 || m.quant[k].kind == QUANT_W4A8 || m.quant[k].kind == QUANT_A8;
        if (a8)
            fprintf(stderr, "megac run: note: the reference engine runs int8-input formats (w8a8, w4a8, a8) on "
                            "their weights with exact inputs; their int8 inputs are modelled by the cpu engine\n");
        Tokenizer *t = tok_import(&m, &d);
        if (t) {
            rc = run_ref_decode(&m, t, o, &d);
            tok_free(t);
        }
    }
    arena_free(&arena);
    return rc;
}

bool run_chat_known(const RunOptions *o)
{
    if (!o->chat || o->model_is_bundle)
        return true;
    Arena arena = {0};
    ModelDesc m;
    Diag quiet = {.silent = true};      /* the compile reports what does not load */
    bool known = true;
    Tokenizer *t = run_desc_load(&m, &arena, o, &quiet) ? tok_import(&m, &quiet) : NULL;
    if (t) {
        char *eos = ref_eos_text(t, m.eos_id);
        RunChat c = {.eos = eos, .is_special = ref_is_special, .ctx = t};
        c.kind = (int)tok_chat(t, &c.default_system);
        char *probe = run_turn_text(o, "", true, &c);
        known = probe != NULL;
        free(probe);
        free(eos);
        tok_free(t);
    }
    arena_free(&arena);
    return known;
}

/* ---- the command ---- */

void run_options_free(RunOptions *o)
{
    cli_sets_free(o->sets, o->nsets);
    free(o->prompt_text);
}

/* A model path that names a device (/dev/zero) is refused before any
 * engine reads it, in desc_load's words: the bundle engines read the
 * description for their cache key first. A terminal passes, as read_file
 * lets it, and a pipe for the reference engine, which reads it once. */
static bool run_model_is_file(const RunOptions *o)
{
    struct stat st;
    if (!o->model || o->model_is_bundle || stat(o->model, &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))
        return true;
    if (S_ISFIFO(st.st_mode) && o->engine == ENGINE_REFERENCE)
        return true; /* read once */
    if (S_ISFIFO(st.st_mode)) { /* the cache key reads the description, then the compile does */
        Diag d;
        diag_init(&d);
        d.prog = "megac run";
        diag_file_error(&d, o->model, "a pipe: the %s engine reads the description twice (for the cache key, then "
                        "to compile it); give it as a file, or run it with --engine reference",
                        run_engine_name(o->engine));
        return false;
    }
    int fd = S_ISCHR(st.st_mode) ? open(o->model, O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
    bool tty = fd >= 0 && isatty(fd);
    if (fd >= 0)
        close(fd);
    if (!tty) {
        Diag d;
        diag_init(&d);
        d.prog = "megac run";
        diag_file_error(&d, o->model, "not a regular file (a device): " DESC_WHAT_A_MODEL_IS);
    }
    return tty;
}

int cmd_run(int argc, char **argv)
{
    RunOptions o;
    int rc = run_options_parse(&o, argc, argv);
    if (rc < 0 && !run_model_is_file(&o))
        rc = 2;
    if (rc < 0 && o.interactive && o.engine == ENGINE_REFERENCE) {
        fprintf(stderr, "megac run: --interactive runs on a bundle engine (cpu, host-cuda, cuda), not the "
                        "reference\n");
        rc = 2;
    }
    if (rc >= 0) {
        run_options_free(&o);
        return rc;
    }
    switch (o.engine) {
    case ENGINE_REFERENCE:
        rc = run_reference(&o);
        break;
    case ENGINE_CPU:
    case ENGINE_HOST_CUDA:
    case ENGINE_CUDA:
        rc = run_bundle(&o);
        break;
    default:
        die("engine %d", (int)o.engine);
    }
    run_options_free(&o);
    return rc;
}
