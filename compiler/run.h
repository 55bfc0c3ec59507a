/*
 * run.h - `megac run`: the parsed options and the engines they select.
 *
 * cmd_run.c parses the command line into RunOptions and switches on the
 * engine: ENGINE_REFERENCE decodes with the plain-C reference (reference.c)
 * straight from a model description; the bundle engines (cpu, host-cuda,
 * cuda) load a compiled NAME.megac/ through the runtime and are run by
 * run_bundle(), which the runtime side provides.
 */
#ifndef MEGAC_RUN_H
#define MEGAC_RUN_H

#include "compiler/model.h"

struct megac_model;     /* runtime/megac.h */

#define RUN_ENGINE_LIST(X)              \
    X(REFERENCE, "reference")           \
    X(CPU, "cpu")                       \
    X(HOST_CUDA, "host-cuda")           \
    X(CUDA, "cuda")
typedef enum {
    ENGINE_DEFAULT = -1,    /* not given: reference for a .yaml, cpu for a bundle */
#define X(n, s) ENGINE_##n,
    RUN_ENGINE_LIST(X)
#undef X
    ENGINE_COUNT
} RunEngine;

#define RUN_MAX_SETS 64
/* The most text a prompt, a turn or a system turn may be (bytes): far more
 * than any model's context holds, and small enough for int token counts. */
#define RUN_MAX_TEXT (256u << 20)

typedef struct RunOptions {
    const char *model;      /* MODEL.yaml or NAME.megac (a bundle dir); NULL = embedded default */
    bool model_is_bundle;   /* model names a directory / ends in .megac */
    RunEngine engine;       /* resolved: never ENGINE_DEFAULT after parsing */
    bool engine_given;      /* --engine was given (else a bundle runs on the engine of its target) */
    const char *prompt;     /* NULL or "": start from BOS alone */
    char *prompt_text;      /* --prompt-file's text (prompt points at it), owned */
    int steps;              /* -n: positions including BOS; 0 = the model's max_seq */
    bool steps_given;       /* -n was given (--interactive's default is the model's max_seq) */
    float temperature;      /* 0 = greedy */
    int top_k;              /* 0 = off */
    float top_p;            /* 1 = off */
    uint64_t seed;
    bool seed_given;        /* false: seed was taken from the clock */
    DescOverride sets[RUN_MAX_SETS];    /* --set key=value, in order */
    int nsets;
    int workers;            /* --workers; 0 = the bundle's own */
    bool chat;              /* --chat: the prompt is a user turn in the model's chat format */
    bool interactive;       /* --interactive: a conversation, a user turn a line of standard input (implies chat) */
    bool no_shift;          /* --no-context-shift: -i reads the kept turns again where it drops the oldest */
    const char *system;     /* --system: a system turn first (implies chat) */
} RunOptions;

/* ---- cmd_run.c ---- */
const char *run_engine_name(RunEngine e);
/* Parses `megac run` arguments (argv[0] = "run"). Returns -1 when o is
 * ready, else the exit status to return (0 after --help, 2 on a usage
 * error, already reported on stderr). */
int run_options_parse(RunOptions *o, int argc, char **argv);
/* Frees what parsing allocated (the --set keys, --prompt-file's text). */
void run_options_free(RunOptions *o);
/* True when an n-token prompt fits the steps positions run (of a model of
 * max_seq); else says why on stderr, the same for every engine. */
bool run_prompt_fits(int n, int steps, int max_seq);
/* Where a run past the context shifts a full cache of W positions (both
 * engines): it keeps the prompt's nprompt tokens (the first alone, bos_first,
 * where the prompt is more than half of W) and drops half of the rest, at
 * least one; false where W leaves nothing to drop. */
bool run_shift_plan(int nprompt, bool bos_first, int W, int *keep, int *drop);
/* Writes a token's text (len bytes) to stdout and flushes, as llama2.c's
 * safe_printf does: a lone ASCII control byte (a raw <0xXX> piece neither
 * printable nor space) is dropped; a byte >= 0x80 is written, as it is
 * part of a UTF-8 character split over byte tokens. False when stdout
 * fails. Every engine prints with it. */
bool run_piece_write(const char *piece, int len);
/* Warns once on stderr when encoding dropped n characters of `text`, which
 * is `what` (run_text_name): how many (no piece, no byte token), and the
 * first (its code point, -1 if not UTF-8: then text[at] is the byte) with
 * its byte offset. */
void run_drops_warn(const char *text, const char *what, int n, int first, size_t at);
/* What the text run encodes is, for messages: "the prompt", or with a
 * chat format "the prompt in its chat format" ("the turn ..." for -i): the
 * offsets are the formatted text's. */
const char *run_text_name(const RunOptions *o);
/* Says on stderr that the model ended the text by choosing stop token
 * `token` (its BOS, its EOS, or another stop id), so that a run that stops
 * early says why. Every engine says it, but not a conversation's turns. */
void run_stop_say(int token, int bos, int eos);
/* Says on stderr why the prompt `text` gave no tokens: an empty one, that
 * the model knows no BOS id to start from; else that none of its
 * characters has a piece or a byte token (and no BOS was added). */
void run_no_tokens_say(const char *text);
/* What the model's tokenizer says of chat formats: the one its chat
 * template writes (ChatKind; CHAT_UNKNOWN: none known), the text that goes
 * with it (ChatML's default system turn, Llama 3.1's preamble:
 * runtime/tokenizer.h; or NULL), the EOS token's text (Zephyr's turns end
 * with it), and is_special(ctx, piece): whether the tokenizer encodes
 * piece as one token, to find a format by its special tokens where the
 * template says nothing. today: the date CHAT_LLAMA31_TODAY writes
 * ("07 Dec 2026"); NULL, the local day it runs. */
typedef struct {
    int kind;
    const char *default_system;
    const char *today;
    const char *eos;
    bool (*is_special)(void *ctx, const char *piece);
    void *ctx;
} RunChat;
/* The text to encode for o's prompt: the prompt itself, or with --chat
 * the prompt as a user turn (after a --system turn, else the template's
 * default system turn) in the model's chat format: the one its chat
 * template writes (ChatML, Llama 3, Zephyr, Llama 2), else the one whose special
 * tokens the tokenizer has (ChatML's <|im_start|>, Llama 3's
 * <|start_header_id|>), ending where the assistant's reply begins.
 * xmalloc'd; NULL (reported on stderr) when there is none. */
char *run_prompt_text(const RunOptions *o, const RunChat *c);
/* The same for one user turn `prompt` of a conversation (--interactive):
 * the first as run_prompt_text writes it, a later one after the reply
 * before it, which ended at the format's stop token: that token (not yet
 * run) and the turn. */
char *run_turn_text(const RunOptions *o, const char *prompt, bool first, const RunChat *c);
/* With --chat (-i, --system) and a model description, whether its
 * tokenizer has a chat format (false said on stderr): asked before a
 * bundle engine compiles it. True when the description or tokenizer does
 * not load (the compile says why). */
bool run_chat_known(const RunOptions *o);
/* Decodes with the reference; returns the exit status. */
int run_reference(const RunOptions *o);

/* True when a model argument names a bundle: *.megac, or a directory
 * with a manifest.yaml (any other directory is a model: an HF folder). */
bool run_model_is_bundle(const char *path);

/* The target megac builds cubins for that a GPU of compute capability
 * major.minor runs (sm_80 for 8.x, sm_90 for 9.x, sm_120 for 12.x), or
 * NULL. */
const char *run_cuda_target(int major, int minor);

/* ---- provided by the runtime side (bundle engines) ---- */
/* Opens o->model as a bundle with engine o->engine, generates, streams the
 * text to stdout and statistics to stderr; returns the exit status. */
int run_bundle(const RunOptions *o);
/* The bundle the bundle engines run for model description o->model (NULL:
 * the embedded default) with o's --set overrides and worker count, on
 * o->engine's target: compiled into the run cache (.megac-cache/) unless
 * it is there, and opened into *m (a cached copy that does not open is
 * compiled once more). Messages start with `prog` ("megac bench"). The
 * path, xmalloc'd; NULL (and *m NULL) after reporting. */
char *run_cache_open(const RunOptions *o, const char *prog, struct megac_model **m);

#endif
