/*
 * tokenizer.h - tokenizers in C: encode and decode for
 *   TOK_SPM    score-driven merges with byte fallback (llama2.c tokenizer.bin,
 *              GGUF "llama" vocabularies)
 *   TOK_BPE    byte-level BPE with merges by rank and a pre-tokenizer split
 *              (HF tokenizer.json of SmolLM2 / Llama-3; GGUF "gpt2")
 *   TOK_BYTES  the built-in byte tokenizer of the embedded default model
 * plus a compact native file (tokenizer.bin in a bundle) that the runtime
 * reads; importers from the source formats live in compiler/tok_import.c.
 */
#ifndef MEGAC_TOKENIZER_H
#define MEGAC_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { TOK_SPM = 1, TOK_BPE = 2, TOK_BYTES = 3 } TokKind;
/* Pre-tokenizer splits before BPE (see tokenizer.c for the exact rules):
 *   PRETOK_GPT2         the GPT-2 regex
 *   PRETOK_LLAMA3       the Llama-3 regex (and a word that is a whole piece
 *                       is one token: "ignore_merges")
 *   PRETOK_GPT2_DIGITS  every \p{N} char split off alone, then the GPT-2
 *                       regex (SmolLM2, StarCoder; GGUF pre "smollm")
 *   PRETOK_QWEN2        the Llama-3 regex with one digit a word (\p{N}
 *                       for \p{N}{1,3}), merges not ignored (Qwen2) */
typedef enum {
    PRETOK_NONE = 0, PRETOK_GPT2 = 1, PRETOK_LLAMA3 = 2, PRETOK_GPT2_DIGITS = 3, PRETOK_QWEN2 = 4
} PreTokKind;

typedef struct Tokenizer Tokenizer;     /* opaque; see tokenizer.c */

/* The chat format a model's chat template writes (the importers read the
 * template; `megac run --chat` writes turns in it). CHAT_UNKNOWN: no
 * template, or one megac does not recognize (the run then looks for a
 * format's special tokens). With each kind the tokenizer keeps a text
 * (tok_set_chat's default_system): for ChatML the system turn the template
 * writes when a conversation gives none; for the two Llama 3.1 kinds (Llama
 * 3 turns, and a system turn always written, which starts with a preamble:
 * "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
 * then the conversation's system text, if any) that preamble, whole for
 * CHAT_LLAMA31, and for CHAT_LLAMA31_TODAY without its "Today Date: ...\n\n"
 * line, which then gives the day the model runs (Llama 3.2's templates call
 * strftime_now); no text for the others. */
typedef enum {
    CHAT_UNKNOWN = 0, CHAT_CHATML = 1, CHAT_LLAMA3 = 2, CHAT_ZEPHYR = 3, CHAT_LLAMA2 = 4,
    CHAT_LLAMA31 = 5, CHAT_LLAMA31_TODAY = 6, CHAT_PHI3 = 7,
    CHAT_KINDS      /* one past the last */
} ChatKind;
/* A Llama 3.1 kind: a system turn always, starting with its preamble. */
static inline bool chat_kind_dated(ChatKind k)
{
    return k == CHAT_LLAMA31 || k == CHAT_LLAMA31_TODAY;
}
#define TOK_MAX_SYSTEM 65536    /* bytes of a template's default system turn */

/* Builders (used by importers): a tokenizer of `kind` with n pieces. */
Tokenizer *tok_new(TokKind kind, int n_vocab);
/* Sets piece id (bytes, not NUL-terminated) and its score (SPM) . */
void tok_set_piece(Tokenizer *t, int id, const char *bytes, size_t len, float score);
/* BPE: merge of pieces a + b with rank r (lower merges first). */
bool tok_add_merge(Tokenizer *t, const char *a, size_t alen, const char *b, size_t blen, int rank);
/* Marks id as special (matched verbatim in the input, never split). */
void tok_set_special(Tokenizer *t, int id);
/* Marks id as ending generation besides eos (Llama 3's <|eot_id|> and
 * <|eom_id|> beside <|end_of_text|>: the ids a config lists as eos). */
void tok_set_stop(Tokenizer *t, int id);
/* eos, or an id marked with tok_set_stop. */
bool tok_is_stop(const Tokenizer *t, int id);
void tok_set_ids(Tokenizer *t, int bos, int eos);
void tok_set_pretok(Tokenizer *t, PreTokKind k);
/* Every prompt starts with BOS, as the source says (GGUF add_bos_token,
 * a tokenizer.json whose post-processor prepends BOS: Llama 3); otherwise
 * tok_default_bos's rule for the kind. */
void tok_set_always_bos(Tokenizer *t, bool always);
/* The chat format and the system turn the template writes when a
 * conversation has none (NULL: none; at most TOK_MAX_SYSTEM bytes). */
void tok_set_chat(Tokenizer *t, ChatKind k, const char *default_system);
ChatKind tok_chat(const Tokenizer *t, const char **default_system);
/* Call once after building: builds lookup tables. */
void tok_finish(Tokenizer *t);
void tok_free(Tokenizer *t);
/* NULL when every builder call so far succeeded, else what went wrong
 * first (an id out of range, out of memory, a merge of unknown pieces). */
const char *tok_error(const Tokenizer *t);

/* Native file. Errors into err (a message naming the file). */
Tokenizer *tok_load(const char *path, char *err, size_t errlen);
/* A whole regular file, NUL-terminated (*len without the NUL), for the
 * runtime's readers; NULL with errno EISDIR (a folder), EINVAL (a FIFO or
 * device: opened without waiting, never read), ENOMEM or EIO. */
char *rt_slurp(const char *path, size_t *len);
bool tok_save(const Tokenizer *t, const char *path, char *err, size_t errlen);
/* llama2.c tokenizer.bin (needs the vocab size from the model header). */
Tokenizer *tok_load_llama2c(const char *path, int n_vocab, char *err, size_t errlen);

/* Piece checks, one rule for every reader of SPM vocabularies (llama2.c
 * tokenizer.bin, GGUF "llama", the native file): a piece is UTF-8 text
 * (strict: no overlong forms, surrogates or code points past U+10FFFF),
 * and a byte piece is exactly <0xNN> with upper-case hex digits. */
bool tok_utf8_valid(const char *s, size_t len);
/* The length of the well-formed UTF-8 character at s (n >= 1 bytes): 1 for
 * ASCII, 2..4, or 0 when it is not one. tok_utf8_valid reads by it; so do
 * the compiler's text checks (YAML, printed paths, JSON). */
int tok_utf8_len(const char *s, size_t n);
bool tok_byte_piece(const char *s, size_t len);
/* s[0..len) for a message (cap >= 4): printable ASCII as is, \\ and \'
 * escaped, any other byte as \xNN; cut with "..." where it does not fit.
 * Returns the length written. */
size_t tok_escape(const char *s, size_t len, char *buf, size_t cap);

int tok_vocab(const Tokenizer *t);
int tok_bos(const Tokenizer *t);
int tok_eos(const Tokenizer *t);
TokKind tok_kind(const Tokenizer *t);
PreTokKind tok_pretok(const Tokenizer *t);
bool tok_always_bos(const Tokenizer *t);
int tok_nmerges(const Tokenizer *t);
/* The bytes of piece id (not NUL-terminated) and its length; NULL if id is
 * out of range. */
const char *tok_piece(const Tokenizer *t, int id, size_t *len);
bool tok_is_special(const Tokenizer *t, int id);
/* The built-in byte tokenizer (TOK_BYTES); NULL when out of memory. */
Tokenizer *tok_new_bytes(void);

/* Encodes text; returns the number of ids (at most cap; -1 if cap is too
 * small). Special tokens written in the text are recognized. */
int tok_encode(const Tokenizer *t, const char *text, bool add_bos, int *ids, int cap);
/* The characters tok_encode_drops left out: those with no piece and no
 * byte token (bytes of them that have one are kept). */
typedef struct TokDrops {
    int n;                  /* characters dropped */
    int32_t first;          /* the first one's code point; -1: its bytes are not UTF-8 */
    size_t first_at;        /* its byte offset in the text */
} TokDrops;
/* tok_encode, also saying what it dropped (drops may be NULL). */
int tok_encode_drops(const Tokenizer *t, const char *text, bool add_bos, int *ids, int cap, TokDrops *drops);
/* Encodes text that continues a text encoded before (a later turn of a
 * conversation), as the two would encode as one where they meet at a
 * special token or a space: no BOS, and no SPM dummy prefix at its start. */
int tok_encode_more(const Tokenizer *t, const char *text, int *ids, int cap, TokDrops *drops);
/* Whether a prompt should start with BOS: yes for SPM and byte tokenizers
 * and for those set always-BOS (Llama 3); for other byte-level BPE only
 * when the text is empty (SmolLM2's chat format carries its own
 * <|im_start|>); never when the text starts with the BOS token itself (a
 * chat format's <|begin_of_text|>: one BOS, as HF's chat template gives).
 * One rule for every engine. */
bool tok_default_bos(const Tokenizer *t, const char *text);
/* The pre-tokenizer's words of text (special tokens not handled): writes
 * the end byte offset of each word to ends; returns the count, or -1 if cap
 * is too small. For tests and tools. */
int tok_split(const Tokenizer *t, const char *text, size_t *ends, int cap);
/* The bytes of `id` as text, given the previous id (SPM drops the leading
 * space after BOS; byte pieces <0xXX> become the byte). Writes into buf
 * (NUL-terminated) and returns its length. */
int tok_decode(const Tokenizer *t, int prev, int id, char *buf, size_t cap);

#endif
