/*
 * megac.h - the megac runtime: open a compiled bundle (NAME.megac/), feed a
 * prompt, decode, sample, read logits. It links no compiler code and no
 * LLVM; the CUDA driver is loaded with dlopen when a bundle needs it.
 *
 * Every call returns MEGAC_OK or an error status; megac_error() gives the
 * message. The runtime never exits the process. A NULL model or pointer
 * argument is refused with MEGAC_ERR_ARG (the facts of a NULL model read 0,
 * or -1 for token ids). megac_error(m) is cleared when a call on m that can
 * fail starts: it is "" after a success. megac_error(NULL) (the same as
 * megac_last_open_error) is this thread's last error of a call without a
 * model: a failed megac_open, a NULL model, megac_sample; never NULL.
 * megac_close frees m and the memory megac_logits pointed to.
 *
 * Threads: one model may be used from several threads; its calls that run
 * or change it (step, reset, generate, encode, decode) take the model's
 * lock, so they run one at a time, in some order. megac_logits, argmax,
 * position, error and the text megac_decode returns are the model's latest
 * results, whichever thread's call made them, read without the lock: a
 * thread that reads them while another's call on the model runs races
 * with it, so a thread that needs its own step's results keeps the model
 * to itself (or orders its calls with its own lock). Distinct models (also
 * of one bundle) run in parallel. A model belongs to the process that
 * opened it: after fork() its steps are refused in the child (its worker
 * threads, a device's context, stayed in the parent), which opens the
 * bundle again.
 *
 * Text is encoded as the tokenizer's source does: the text of a special
 * token (e.g. "<|im_start|>") in it becomes that token, as HF tokenizers
 * do by default; a caller that passes untrusted text where it builds a
 * chat turn takes them out first.
 */
#ifndef MEGAC_H
#define MEGAC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MEGAC_OK = 0,
    MEGAC_ERR_IO,           /* a file could not be read */
    MEGAC_ERR_FORMAT,       /* a bundle file is malformed or mismatched */
    MEGAC_ERR_ARG,          /* bad argument (token id, position past context) */
    MEGAC_ERR_DEVICE,       /* no driver / GPU, or a driver call failed */
    MEGAC_ERR_KERNEL,       /* the kernel aborted (watchdog), or its logits are NaN/Inf */
    MEGAC_ERR_NOMEM,
    MEGAC_ERR_UNSUPPORTED,  /* the bundle cannot do it (megac_shift of an evicting cache) */
} megac_status;

typedef struct megac_model megac_model;

typedef struct megac_sampler {
    float temperature;      /* 0 = greedy; else finite and > 0 */
    int top_k;              /* 0 = off; negative is refused */
    float top_p;            /* 1 (or more) = off; NaN or < 0 is refused */
    uint64_t seed;
} megac_sampler;

typedef struct megac_stats {
    int prompt_tokens, generated_tokens;
    double prefill_s, decode_s;     /* wall time */
    int stop_token;                 /* the stop token (BOS, EOS or a stop id) the model chose, which ended
                                       generation (not counted, not passed to the callback); -1 if none */
} megac_stats;

/* Called for every generated token with its decoded text; return non-zero
 * to stop. */
typedef int (*megac_token_cb)(void *user, int token, const char *text);

megac_status megac_open(const char *bundle_dir, megac_model **out);
void megac_close(megac_model *m);
const char *megac_error(const megac_model *m);          /* last error of m */
const char *megac_last_open_error(void);                /* why open failed */
/* The target a bundle was compiled for ("cpu", "host-cuda", "sm_90", ...),
 * read from its manifest.yaml alone, and the line and column of its
 * `target` key there (line, col may be NULL): to refuse a bundle meant for
 * another device before opening it. On failure the message is in
 * megac_last_open_error(). */
megac_status megac_bundle_target(const char *bundle_dir, char *target, size_t cap, int *line, int *col);
/* What megac_open checks of a bundle's files, without loading its kernel
 * or starting anything (so on any machine, for any target): the manifest,
 * the schedule's hash, the kernel file's size and hash, weights.bin's size,
 * the tokenizer. MEGAC_OK, or the error megac_open would give for those,
 * in megac_last_open_error(); what only the kernel states (its facts: the
 * arena's size, the io offsets) and a device's presence are checked by
 * megac_open alone. */
megac_status megac_bundle_check(const char *bundle_dir);

/* Model facts. */
int megac_vocab_size(const megac_model *m);
int megac_max_seq(const megac_model *m);
int megac_bos(const megac_model *m);
int megac_eos(const megac_model *m);
/* 1 when generation stops at `token`: BOS, EOS, or another end-of-generation
 * id of the model (a config's eos list, GGUF eot/eom: Llama 3's <|eot_id|>). */
int megac_is_stop(const megac_model *m, int token);
int megac_num_workers(const megac_model *m);
uint64_t megac_weights_bytes(const megac_model *m);
/* 1 when the weights were read into the process's memory (huge pages asked
 * for: a host kernel's, when they take at most half the free memory and
 * MEGAC_WEIGHTS_MMAP is not set), 0 when they are mapped from weights.bin. */
int megac_weights_in_memory(const megac_model *m);

megac_status megac_reset(megac_model *m);               /* position back to 0, no prompt end */
/* The position of the last token of the prompt being fed (-1: none, the
 * default; at most max_seq - 1). SnapKV layers (kv_policy snapkv) compress
 * their cache at the end of that step; megac_generate sets it for its
 * prompt. */
megac_status megac_set_prompt_end(megac_model *m, int pos);
/* Runs one decode step: token at the current position; advances it.
 * MEGAC_ERR_KERNEL (the position advanced: the cache took the token) where
 * the logits are not finite, naming the position; megac_logits returns
 * them. */
megac_status megac_step(megac_model *m, int token);
/* Runs one step whose outputs are not wanted (a prompt token before the
 * last): the kernel skips the ops that only compute the logits and the
 * argmax (the output matrix: a fifth of a small model's weights), so it is
 * faster than megac_step; the state and KV cache advance the same, bit for
 * bit. megac_logits and megac_argmax then return NULL and -1 until the
 * next megac_step. */
megac_status megac_feed(megac_model *m, int token);
/* A context shift: drops positions [keep, keep + n) from the KV cache and
 * moves the later ones down by n, as if their tokens had been decoded
 * there (their keys turned back by n positions of RoPE, in f32 and rounded
 * again to the cache's type, as llama.cpp's context shift), so the
 * position goes back by n; no step runs. The moved rows keep what the
 * dropped tokens contributed to them (a model of more than one layer
 * differs from one fed the kept tokens afresh by that); a key moved k
 * times is rounded k more times: nothing on an f32 cache, about 1e-5 of
 * the logits per shift on an f16 one and 1e-4 on bf16, which add up over
 * hundreds of shifts of the same rows. With n > 0 megac_logits is NULL
 * until the next megac_step; n = 0 changes nothing (MEGAC_OK where the
 * bundle can shift: a probe). MEGAC_ERR_ARG unless 0 <= keep, 0 <= n and
 * keep + n <= the position; MEGAC_ERR_UNSUPPORTED where the bundle's cache
 * is not rows by position (an evicting kv_policy) or the kernel keeps
 * state about the rows (Quest pages, SnapKV): reset and feed the kept
 * tokens there. Another error while the rows move (a device's copy)
 * leaves the cache reset (position 0), not half moved. */
megac_status megac_shift(megac_model *m, int keep, int n);
/* Logits of the last step (vocab floats, owned by m); NULL before any
 * step, after megac_feed or megac_reset. */
const float *megac_logits(const megac_model *m);
/* The kernel's own greedy choice for the last step. */
int megac_argmax(const megac_model *m);
int megac_position(const megac_model *m);

/* Tokenizer of the bundle. encode: returns the number of ids written
 * (at most cap), or -1 with megac_error set. add_bos: 1 yes, 0 no, -1 the
 * tokenizer's default (BOS first for SPM/byte vocabularies, and for
 * byte-level BPE whose source says so, else only for an empty text; never
 * before a text that starts with the BOS token itself). */
int megac_encode(megac_model *m, const char *text, int add_bos, int *ids, int cap);
/* megac_encode for text that continues the text encoded before it (a
 * later turn of a conversation): no BOS, and an SPM vocabulary's dummy
 * prefix (the ' ' before a text) is not put before it. */
int megac_encode_more(megac_model *m, const char *text, int *ids, int cap);
/* How many characters of the text the last megac_encode on m dropped
 * because the tokenizer has no piece and no byte token for them (0: none;
 * bytes of such a character that have a token are kept). *first gets the
 * first one's code point (-1 when its bytes are not UTF-8: text[*at] is
 * then the byte) and *at its byte offset in the text; either may be NULL. */
int megac_encode_dropped(const megac_model *m, int *first, size_t *at);
/* 1 if the tokenizer's default puts BOS before `text` (see above). */
int megac_wants_bos(const megac_model *m, const char *text);
/* The chat format the model's chat template writes (0 unknown, 1 ChatML,
 * 2 Llama 3, 3 Zephyr, 4 Llama 2, 5 Llama 3.1, 6 Llama 3.1 with the day it
 * runs: runtime/tokenizer.h's ChatKind), and in *default_system (may be
 * NULL) the text that goes with it, or NULL: for ChatML the system turn
 * it writes when a conversation gives none, for 5 and 6 the preamble of
 * the system turn it always writes (tokenizer.h). */
int megac_chat_format(const megac_model *m, const char **default_system);
/* Text of one token (valid until the next call on m: the text a token
 * callback is given is this one's, so a callback that decodes copies it
 * first); handles byte pieces and the leading-space rule after BOS; "" for
 * an id outside the vocabulary. */
const char *megac_decode(megac_model *m, int prev_token, int token);

/* Picks a token from n logits: returns its id in [0, n), or a negative
 * status (-MEGAC_ERR_ARG: n < 1, a NULL pointer, bad sampler settings, or
 * logits holding NaN/+Inf or only -Inf; -MEGAC_ERR_NOMEM) with the message in
 * megac_error(NULL). *rng_state starts at 0 (seeded from s->seed). Keeps
 * a candidate array per thread (n entries of 24 bytes, and 32 KiB) between calls,
 * freed when the thread exits. */
int megac_sample(const float *logits, int n, const megac_sampler *s, uint64_t *rng_state);

/* Feeds the prompt (already tokenized), then samples up to n_new tokens,
 * calling cb for each; stops at a stop token (megac_is_stop), when cb
 * returns non-zero, or at the context's end (the position reaches
 * megac_max_seq: MEGAC_OK, fewer tokens generated). s NULL is greedy; bad
 * settings, a token id outside the vocabulary and a prompt longer than
 * the positions left are refused before any step runs. */
megac_status megac_generate(megac_model *m, const int *prompt, int nprompt, int n_new,
                            const megac_sampler *s, megac_token_cb cb, void *user, megac_stats *st);
/* megac_generate with the sampler's state in *rng_state (megac_sample's):
 * 0 seeds it from s->seed, as megac_generate does at each call; it holds
 * the state after the call, so a generation continued in pieces (after a
 * megac_shift, or over the turns of a conversation) draws as one. */
megac_status megac_generate_rng(megac_model *m, const int *prompt, int nprompt, int n_new,
                                const megac_sampler *s, uint64_t *rng_state, megac_token_cb cb, void *user,
                                megac_stats *st);

#ifdef __cplusplus
}
#endif
#endif
