/*
 * tok_import.c - builds the runtime Tokenizer from the source the model
 * description names (m->tok_format, m->tok_path):
 *   TOKFMT_LLAMA2C  llama2.c tokenizer.bin (vocab size from the model)
 *   TOKFMT_HF       HF tokenizer.json, byte-level BPE only: model.vocab,
 *                   model.merges ("a b" strings or [a, b] pairs; rank =
 *                   index), added_tokens (all matched verbatim), and one of
 *                   three pre-tokenizers (GPT-2 ByteLevel regex; Digits with
 *                   individual_digits then ByteLevel; Llama-3 Split regex
 *                   then ByteLevel without regex)
 *   TOKFMT_GGUF     tokenizer.ggml.* of the weights' GGUF file ("llama" =
 *                   SPM, "gpt2" = byte-level BPE)
 *   TOKFMT_BYTES    the built-in byte tokenizer
 *
 * Byte-level BPE pieces are written in GPT-2's byte-to-unicode alphabet
 * (each byte one printable char: 33-126, 161-172, 174-255 stand for
 * themselves, the other 68 bytes for U+0100...U+0143 in order); they are
 * mapped back to raw bytes here so that the runtime only sees bytes. SPM
 * pieces from GGUF have U+2581 turned back into ' ', as llama2.c's export
 * does.
 */
#include "compiler/compile.h"
#include "compiler/doc.h"
#include "compiler/gguf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- GPT-2 byte-to-unicode, inverted ---- */

static bool bytelevel_is_self(int b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* The byte that codepoint cp stands for, or -1. */
static int bytelevel_byte(uint32_t cp)
{
    static int inv[324];
    static bool ready;
    if (!ready) {
        memset(inv, 0xff, sizeof inv);
        for (int b = 0, extra = 0; b < 256; b++)
            inv[bytelevel_is_self(b) ? b : 256 + extra++] = b;
        ready = true;
    }
    return cp < 324 ? inv[cp] : -1;
}

/* Maps a byte-level string to raw bytes in out (at least len bytes);
 * false if a char is outside the alphabet or the UTF-8 is bad. */
static bool bytelevel_decode(const char *s, size_t len, char *out, size_t *outlen)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        unsigned c = (unsigned char)s[i];
        uint32_t cp;
        if (c < 0x80)
            cp = c, i += 1;
        else if ((c & 0xE0) == 0xC0 && i + 1 < len && ((unsigned char)s[i + 1] & 0xC0) == 0x80)
            cp = (uint32_t)(c & 0x1F) << 6 | ((unsigned char)s[i + 1] & 0x3F), i += 2;
        else
            return false;
        int b = bytelevel_byte(cp);
        if (b < 0)
            return false;
        out[n++] = (char)b;
    }
    *outlen = n;
    return true;
}

/* ---- HF tokenizer.json ---- */

/* Llama-3's Split regex with `digits` after \p{N}; Qwen2's is the same
 * with one digit a word. */
#define LLAMA3_STYLE_REGEX(digits)                                                                            \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" digits "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
static const char llama3_regex[] = LLAMA3_STYLE_REGEX("{1,3}");
static const char qwen2_regex[] = LLAMA3_STYLE_REGEX("");

typedef struct {
    Doc doc;
    Diag *d;
    const ModelDesc *m;
    Tokenizer *t;
    unsigned char *seen;    /* (top) ids given a piece so far */
    int top;                /* one past the tokenizer's largest id */
} HfImport;

/* A scalar child as a string, or NULL (no error) when absent / not a scalar. */
static const char *hf_str(const DocNode *map, const char *key)
{
    const DocNode *n = doc_get(map, key);
    return n && n->kind == DOC_SCALAR && !doc_is_null(n) ? n->str : NULL;
}

static bool hf_flag(const DocNode *map, const char *key, bool dflt)
{
    const char *s = hf_str(map, key);
    return s ? strcmp(s, "true") == 0 : dflt;
}

/* ByteLevel with add_prefix_space false and the given use_regex. */
static bool hf_is_bytelevel(const DocNode *n, bool use_regex)
{
    const char *type = hf_str(n, "type");
    return type && strcmp(type, "ByteLevel") == 0 && !hf_flag(n, "add_prefix_space", true) &&
           hf_flag(n, "use_regex", true) == use_regex;
}

/* A Split on `regex`, behavior Isolated, not inverted. */
static bool hf_is_split(const DocNode *n, const char *regex)
{
    const char *type = hf_str(n, "type"), *behavior = hf_str(n, "behavior");
    const char *re = hf_str(doc_get(n, "pattern"), "Regex");
    return type && strcmp(type, "Split") == 0 && behavior && strcmp(behavior, "Isolated") == 0 && re &&
           strcmp(re, regex) == 0 && !hf_flag(n, "invert", false);
}

/* The pre-tokenizer, one of the three supported shapes. */
static bool hf_pretok(HfImport *h, const DocNode *pt, PreTokKind *out)
{
    const DocNode *seq = doc_get(pt, "pretokenizers");
    if (pt && hf_is_bytelevel(pt, true)) {
        *out = PRETOK_GPT2;
        return true;
    }
    if (seq && seq->kind == DOC_SEQ && seq->n == 2) {
        const DocNode *a = seq->items[0], *b = seq->items[1];
        const char *ta = hf_str(a, "type");
        if (ta && strcmp(ta, "Digits") == 0 && hf_flag(a, "individual_digits", false) && hf_is_bytelevel(b, true)) {
            *out = PRETOK_GPT2_DIGITS;
            return true;
        }
        if (hf_is_split(a, llama3_regex) && hf_is_bytelevel(b, false)) {
            *out = PRETOK_LLAMA3;
            return true;
        }
        if (hf_is_split(a, qwen2_regex) && hf_is_bytelevel(b, false)) {
            *out = PRETOK_QWEN2;
            return true;
        }
    }
    doc_error(&h->doc, h->d, pt ? pt : h->doc.root,
              "pre-tokenizer not supported yet (supported: GPT-2 ByteLevel, Digits + ByteLevel, Llama-3 or Qwen2 Split + "
              "ByteLevel)");
    return false;
}

/* Checks the parts of tokenizer.json this importer does not implement. */
static bool hf_check_model(HfImport *h, const DocNode *model)
{
    const DocNode *root = h->doc.root;
    const char *type = hf_str(model, "type");
    const DocNode *norm = doc_get(root, "normalizer");
    if (!model || model->kind != DOC_MAP) {
        doc_error(&h->doc, h->d, root, "not a tokenizer.json (no 'model')");
        return false;
    }
    if (!type || strcmp(type, "BPE") != 0) {
        doc_error(&h->doc, h->d, model ? model : root, "only BPE tokenizer models are supported yet");
        return false;
    }
    if (norm && !doc_is_null(norm)) {
        doc_error(&h->doc, h->d, norm, "normalizers are not supported yet");
        return false;
    }
    if (hf_flag(model, "byte_fallback", false) || hf_str(model, "continuing_subword_prefix") ||
        hf_str(model, "end_of_word_suffix")) {
        doc_error(&h->doc, h->d, model,
                  "BPE byte_fallback / continuing_subword_prefix / end_of_word_suffix are not supported yet");
        return false;
    }
    return true;
}

/* The id of a vocab or added-token entry, range-checked. */
static bool hf_id(HfImport *h, const DocNode *n, int limit, int *id)
{
    int64_t v;
    if (!n || !doc_int(&h->doc, h->d, n, &v))
        return false;
    if (v < 0 || v >= limit) {
        doc_error(&h->doc, h->d, n, "token id %lld out of range [0, %d)", (long long)v, limit);
        return false;
    }
    *id = (int)v;
    return true;
}

/* The vocabulary size: one past the largest id, or the model's if larger;
 * -1 after an error. */
static int hf_vocab_size(HfImport *h, const DocNode *vocab, const DocNode *added)
{
    int64_t max = -1, v;
    for (int i = 0; i < vocab->n; i++) {
        if (!doc_int(&h->doc, h->d, vocab->items[i], &v))
            return -1;
        max = v > max ? v : max;
    }
    for (int i = 0; added && i < added->n; i++) {
        const DocNode *id = doc_get(added->items[i], "id");
        if (!id)
            doc_error(&h->doc, h->d, added->items[i], "added token without an id");
        if (!id || !doc_int(&h->doc, h->d, id, &v))
            return -1;
        max = v > max ? v : max;
    }
    if ((h->m->vocab_size > 0 && max >= h->m->vocab_size) || max >= (1 << 24)) {
        doc_error(&h->doc, h->d, vocab, "tokenizer has id %lld but the model's vocab_size is %d", (long long)max,
                  h->m->vocab_size);
        return -1;
    }
    h->top = (int)max + 1;
    return h->m->vocab_size > max ? h->m->vocab_size : (int)max + 1;
}

static bool hf_vocab(HfImport *h, const DocNode *vocab)
{
    bool ok = true;
    char buf[1024];
    for (int i = 0; i < vocab->n && ok; i++) {
        const DocNode *k = vocab->keys[i];
        int id;
        size_t n;
        if (!hf_id(h, vocab->items[i], tok_vocab(h->t), &id))
            return false;
        if (h->seen[id]) {
            doc_error(&h->doc, h->d, vocab->items[i], "vocab id %d is given to two pieces", id);
            return false;
        }
        h->seen[id] = 1;
        if (k->len > sizeof buf || !bytelevel_decode(k->str, k->len, buf, &n)) {
            doc_error(&h->doc, h->d, k, "vocab piece is not in the byte-level alphabet");
            return false;
        }
        tok_set_piece(h->t, id, buf, n, 0.0f);
    }
    return ok;
}

static bool hf_added(HfImport *h, const DocNode *added)
{
    for (int i = 0; added && i < added->n; i++) {
        const DocNode *a = added->items[i], *content = doc_get(a, "content");
        int id;
        if (!hf_id(h, doc_get(a, "id"), tok_vocab(h->t), &id))
            return false;
        if (!content || content->kind != DOC_SCALAR || content->len == 0) {
            doc_error(&h->doc, h->d, a, "added token without content");
            return false;
        }
        tok_set_piece(h->t, id, content->str, content->len, 0.0f);
        tok_set_special(h->t, id);
        h->seen[id] = 1;
    }
    return true;
}

/* Every id below the largest has a piece (vocab or added token). */
static bool hf_no_gaps(HfImport *h, const DocNode *vocab)
{
    for (int id = 0; id < h->top; id++)
        if (!h->seen[id]) {
            doc_error(&h->doc, h->d, vocab, "no vocab piece or added token has id %d (the ids run to %d)", id,
                      h->top - 1);
            return false;
        }
    return true;
}

/* One merge: "a b" or [a, b], both byte-level strings. */
static bool hf_merge(HfImport *h, const DocNode *n, int rank)
{
    const char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    if (n->kind == DOC_SCALAR) {
        const char *sp = memchr(n->str, ' ', n->len);
        if (sp)
            a = n->str, alen = (size_t)(sp - n->str), b = sp + 1, blen = n->len - alen - 1;
    } else if (n->kind == DOC_SEQ && n->n == 2 && n->items[0]->kind == DOC_SCALAR && n->items[1]->kind == DOC_SCALAR) {
        a = n->items[0]->str, alen = n->items[0]->len, b = n->items[1]->str, blen = n->items[1]->len;
    }
    char ra[512], rb[512];
    size_t na, nb;
    if (!a || alen > sizeof ra || blen > sizeof rb || !bytelevel_decode(a, alen, ra, &na) ||
        !bytelevel_decode(b, blen, rb, &nb) || !tok_add_merge(h->t, ra, na, rb, nb, rank)) {
        doc_error(&h->doc, h->d, n, "bad merge: not two vocab pieces whose concatenation is a piece");
        return false;
    }
    return true;
}

static bool hf_merges(HfImport *h, const DocNode *merges)
{
    for (int i = 0; i < merges->n; i++)
        if (!hf_merge(h, merges->items[i], i))
            return false;
    return true;
}

/* True when the post-processor (a TemplateProcessing, alone or in a
 * Sequence) starts a single sequence with the special token whose id is
 * bos: Llama 3's tokenizer.json prepends <|begin_of_text|> so. */
static bool hf_post_bos(const DocNode *pp, int bos)
{
    const char *type = hf_str(pp, "type");
    if (!type || bos < 0)
        return false;
    const DocNode *seq = doc_get(pp, "processors");
    if (strcmp(type, "Sequence") == 0 && seq && seq->kind == DOC_SEQ) {
        for (int i = 0; i < seq->n; i++)
            if (hf_post_bos(seq->items[i], bos))
                return true;
        return false;
    }
    const DocNode *single = doc_get(pp, "single");
    if (strcmp(type, "TemplateProcessing") != 0 || !single || single->kind != DOC_SEQ || single->n == 0)
        return false;
    const char *name = hf_str(doc_get(single->items[0], "SpecialToken"), "id");
    const DocNode *ids = name ? doc_get(doc_get(doc_get(pp, "special_tokens"), name), "ids") : NULL;
    const char *id = ids && ids->kind == DOC_SEQ && ids->n == 1 && ids->items[0]->kind == DOC_SCALAR
                         ? ids->items[0]->str : NULL;
    char *end;
    return id && strtol(id, &end, 10) == bos && !*end;
}

static bool hf_build(HfImport *h)
{
    const DocNode *root = h->doc.root, *model = doc_get(root, "model");
    const DocNode *vocab = doc_get(model, "vocab"), *merges = doc_get(model, "merges");
    const DocNode *added = doc_get(root, "added_tokens");
    PreTokKind pk;
    if (!hf_check_model(h, model) || !hf_pretok(h, doc_get(root, "pre_tokenizer"), &pk))
        return false;
    if (!vocab || vocab->kind != DOC_MAP || !merges || merges->kind != DOC_SEQ ||
        (added && added->kind != DOC_SEQ)) {
        doc_error(&h->doc, h->d, model, "expected model.vocab (map), model.merges and added_tokens (lists)");
        return false;
    }
    if (hf_flag(model, "ignore_merges", false) != (pk == PRETOK_LLAMA3)) {
        doc_error(&h->doc, h->d, model, "ignore_merges is supported only with (and required by) the Llama-3 pre-tokenizer");
        return false;
    }
    int nv = hf_vocab_size(h, vocab, added);
    if (nv <= 0)
        return false;
    if (!(h->t = tok_new(TOK_BPE, nv)))
        die("out of memory");
    tok_set_pretok(h->t, pk);
    tok_set_ids(h->t, h->m->bos_id, h->m->eos_id);
    tok_set_always_bos(h->t, hf_post_bos(doc_get(root, "post_processor"), h->m->bos_id));
    h->seen = xcalloc((size_t)nv, 1);
    bool ok = hf_vocab(h, vocab) && hf_added(h, added) && hf_no_gaps(h, vocab) && hf_merges(h, merges);
    free(h->seen);
    return ok;
}

/* ---- chat templates ---- */

static void chat_warn(const char *path, const char *what, Diag *d)
{
    SrcFile src = {.path = path};
    diag_warning(d, &src, 0, 0, "%s; `megac run --chat` will look for a chat format's special tokens instead",
                 what);
}

/* The template's format, read from `path`: one megac does not recognize
 * is warned about (a Mistral [INST] one, say: --chat would otherwise write
 * Llama 3's turns from the special tokens without a word). */
static void chat_set(Tokenizer *t, const char *tmpl, size_t len, const char *path, Diag *d)
{
    char *sys;
    ChatKind k = chat_template_kind(tmpl, len, &sys);
    tok_set_chat(t, k, sys);
    free(sys);
    if (k == CHAT_UNKNOWN && len)
        chat_warn(path, "its chat template is not one megac recognizes (ChatML, Llama 3 or 3.1, Zephyr, Llama 2, Phi-3)",
                  d);
}

void tok_chat_template_files(const char *tok_path, char **jinja, char **config)
{
    const char *slash = strrchr(tok_path, '/');
    int dir = slash ? (int)(slash - tok_path) : 1;
    *jinja = xasprintf("%.*s/chat_template.jinja", dir, slash ? tok_path : ".");
    *config = xasprintf("%.*s/tokenizer_config.json", dir, slash ? tok_path : ".");
}

/* An HF folder's chat template: chat_template.jinja beside tokenizer.json
 * (transformers writes it there since 4.43), else tokenizer_config.json's
 * chat_template (a string, or a list of {name, template}: "default"). */
static void hf_chat_template(Tokenizer *t, const char *tok_path, Diag *d)
{
    char *jinja, *cfg;
    tok_chat_template_files(tok_path, &jinja, &cfg);
    size_t n;
    char *text = access(jinja, F_OK) == 0 ? read_file(jinja, &n) : NULL;
    if (text) {
        chat_set(t, text, n, jinja, d);
        free(text);
    } else if (access(cfg, F_OK) == 0) {
        Diag quiet = {.silent = true};
        Doc doc = {0};
        const DocNode *ct = NULL;
        if (doc_load(&doc, cfg, &quiet) && doc.root && (ct = doc_get(doc.root, "chat_template"))) {
            for (int i = 0; ct->kind == DOC_SEQ && i < ct->n; i++) {
                const DocNode *name = doc_get(ct->items[i], "name"), *tmpl = doc_get(ct->items[i], "template");
                if (name && tmpl && name->kind == DOC_SCALAR && !strcmp(name->str, "default"))
                    ct = tmpl;
            }
            if (ct->kind == DOC_SCALAR)
                chat_set(t, ct->str, ct->len, cfg, d);
            else
                chat_warn(cfg, "its chat_template is neither a string nor a list with a 'default' template", d);
        } else if (!doc.root || quiet.nerrors) {
            chat_warn(cfg, "this file does not read as JSON, so the chat template in it is not known", d);
        }
        doc_free(&doc);
    }
    free(jinja);
    free(cfg);
}

static Tokenizer *tok_import_hf(const ModelDesc *m, Diag *d)
{
    HfImport h = {.d = d, .m = m};
    if (!doc_load(&h.doc, m->tok_path, d)) {
        doc_free(&h.doc);
        return NULL;
    }
    bool ok = h.doc.root && hf_build(&h);
    if (!h.doc.root)
        diag_file_error(d, m->tok_path, "empty tokenizer file");
    if (ok)
        hf_chat_template(h.t, m->tok_path, d);
    if (ok)
        tok_finish(h.t);
    if (ok && tok_error(h.t)) {
        diag_file_error(d, m->tok_path, "%s", tok_error(h.t));
        ok = false;
    }
    doc_free(&h.doc);
    if (!ok) {
        if (h.t)
            tok_free(h.t);
        return NULL;
    }
    return h.t;
}

/* ---- GGUF tokenizer.ggml.* ---- */

/* An array key of element type `et` and exactly n elements (n = 0: any). */
static const GgufKV *gguf_array(const GgufFile *g, const char *key, GgufType et, uint64_t n, Diag *d)
{
    const GgufKV *kv = gguf_find(g, key);
    if (!kv)
        diag_file_error(d, g->path, "key '%s' is missing", key);
    else if (kv->type != GGUF_T_ARRAY || kv->arr_type != et)
        diag_file_error(d, g->path, "key '%s' must be an array of %s, not %s%s", key, gguf_value_type_name(et),
                        kv->type == GGUF_T_ARRAY ? "an array of " : "a ",
                        gguf_value_type_name(kv->type == GGUF_T_ARRAY ? kv->arr_type : kv->type));
    else if (n && kv->arr_n != n)
        diag_file_error(d, g->path, "key '%s' has %llu elements, but tokenizer.ggml.tokens has %llu", key,
                        (unsigned long long)kv->arr_n, (unsigned long long)n);
    return kv && kv->type == GGUF_T_ARRAY && kv->arr_type == et && (!n || kv->arr_n == n) ? kv : NULL;
}

/* An optional array: absent is fine (*out = NULL), malformed is an error. */
static bool gguf_array_opt(const GgufFile *g, const char *key, GgufType et, uint64_t n, Diag *d, const GgufKV **out)
{
    *out = gguf_find(g, key) ? gguf_array(g, key, et, n, d) : NULL;
    return *out || !gguf_find(g, key);
}

static int32_t gguf_i32_at(const GgufKV *kv, uint64_t i)
{
    int32_t v;
    memcpy(&v, (const char *)kv->data + 4 * i, 4);
    return v;
}

static float gguf_f32_at(const GgufKV *kv, uint64_t i)
{
    float v;
    memcpy(&v, (const char *)kv->data + 4 * i, 4);
    return v;
}

/* SPM piece: U+2581 back to ' '. */
static bool gguf_spm_piece(Tokenizer *t, int id, GgufStr s, float score)
{
    char *buf = xmalloc(s.len + 1);
    size_t n = 0;
    for (uint64_t i = 0; i < s.len; i++) {
        if (i + 2 < s.len && memcmp(s.s + i, "\xE2\x96\x81", 3) == 0)
            buf[n++] = ' ', i += 2;
        else
            buf[n++] = s.s[i];
    }
    tok_set_piece(t, id, buf, n, score);
    free(buf);
    return true;
}

/* BPE piece: byte-level chars back to bytes; control / user-defined
 * tokens are kept verbatim. */
static bool gguf_bpe_piece(Tokenizer *t, int id, GgufStr s, bool special)
{
    char *buf = xmalloc(s.len + 1);
    size_t n = 0;
    bool ok = special || bytelevel_decode(s.s, s.len, buf, &n);
    if (special)
        tok_set_piece(t, id, s.s, s.len, 0.0f);
    else if (ok)
        tok_set_piece(t, id, buf, n, 0.0f);
    free(buf);
    return ok;
}

static bool gguf_merges(Tokenizer *t, const GgufFile *g, Diag *d)
{
    const GgufKV *mk = gguf_array(g, "tokenizer.ggml.merges", GGUF_T_STRING, 0, d);
    if (!mk)
        return false;
    char ra[512], rb[512];
    for (uint64_t i = 0; i < mk->arr_n; i++) {
        GgufStr s = mk->strs[i];
        const char *sp = memchr(s.s, ' ', s.len);
        size_t alen = sp ? (size_t)(sp - s.s) : 0, blen = sp ? s.len - alen - 1 : 0, na, nb;
        if (!sp || alen > sizeof ra || blen > sizeof rb || !bytelevel_decode(s.s, alen, ra, &na) ||
            !bytelevel_decode(sp + 1, blen, rb, &nb) || !tok_add_merge(t, ra, na, rb, nb, (int)i)) {
            diag_file_error(d, g->path, "tokenizer.ggml.merges[%llu]: '%.*s' is not a merge of two pieces",
                            (unsigned long long)i, (int)(s.len < 64 ? s.len : 64), s.s);
            return false;
        }
    }
    return true;
}

/* The pre-tokenizer a tokenizer.ggml.pre name stands for. */
static bool gguf_pretok(const GgufFile *g, Diag *d, PreTokKind *out)
{
    GgufStr pre = {0, NULL};
    if (!gguf_get_str(g, "tokenizer.ggml.pre", &pre)) {
        diag_file_error(d, g->path, "a BPE vocabulary without %s (llama.cpp then splits text with its 'default' "
                        "pre-tokenizer, which megac does not have yet: gpt-2, smollm, starcoder, llama-bpe, qwen2)",
                        gguf_find(g, "tokenizer.ggml.pre") ? "a string tokenizer.ggml.pre" : "tokenizer.ggml.pre");
        return false;
    }
    static const struct { const char *name; PreTokKind k; } names[] = {
        {"gpt-2", PRETOK_GPT2}, {"smollm", PRETOK_GPT2_DIGITS}, {"starcoder", PRETOK_GPT2_DIGITS},
        {"llama-bpe", PRETOK_LLAMA3}, {"llama3", PRETOK_LLAMA3}, {"qwen2", PRETOK_QWEN2},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        if (strlen(names[i].name) == pre.len && memcmp(names[i].name, pre.s, pre.len) == 0) {
            *out = names[i].k;
            return true;
        }
    }
    diag_file_error(d, g->path, "tokenizer.ggml.pre '%.*s' is not supported yet (gpt-2, smollm, starcoder, llama-bpe, qwen2)",
                    (int)pre.len, pre.s);
    return false;
}

/* tokenizer.ggml.token_type values: llama.cpp's llama_token_type (gguf-py
 * writes 1..6; llama.cpp also knows 0). Control and user-defined tokens
 * are matched verbatim. */
enum {
    GGUF_TOK_UNDEFINED, GGUF_TOK_NORMAL, GGUF_TOK_UNKNOWN, GGUF_TOK_CONTROL, GGUF_TOK_USER_DEFINED, GGUF_TOK_UNUSED,
    GGUF_TOK_BYTE
};

static bool gguf_is_special(int32_t type)
{
    return type == GGUF_TOK_CONTROL || type == GGUF_TOK_USER_DEFINED;
}

/* Token i's type, and for SPM its text, as tok_utf8_valid / tok_byte_piece
 * say: a type outside the enum, a byte token that is not <0xNN> (megac's
 * encoder finds byte pieces by that text) or a piece that is not UTF-8
 * would load and decode garbage. */
static bool gguf_token_check(const GgufFile *g, uint64_t i, int32_t type, GgufStr s, bool spm, Diag *d)
{
    char esc[96];
    if (type < GGUF_TOK_UNDEFINED || type > GGUF_TOK_BYTE) {
        tok_escape(s.s, s.len, esc, sizeof esc);
        diag_file_error(d, g->path, "tokenizer.ggml.token_type[%llu] is %d, not a token type (0 undefined, 1 normal, "
                        "2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte); the token is '%s'",
                        (unsigned long long)i, type, esc);
        return false;
    }
    if (spm && type == GGUF_TOK_BYTE && !tok_byte_piece(s.s, s.len)) {
        tok_escape(s.s, s.len, esc, sizeof esc);
        diag_file_error(d, g->path, "tokenizer.ggml.tokens[%llu] '%s' is a byte token (tokenizer.ggml.token_type 6) "
                        "but not <0xNN>", (unsigned long long)i, esc);
        return false;
    }
    if (spm && type != GGUF_TOK_BYTE && !tok_utf8_valid(s.s, s.len)) {
        tok_escape(s.s, s.len, esc, sizeof esc);
        diag_file_error(d, g->path, "tokenizer.ggml.tokens[%llu] '%s' is not valid UTF-8", (unsigned long long)i,
                        esc);
        return false;
    }
    return true;
}

typedef struct {
    GgufStr s;
    uint64_t i;             /* its index in tokenizer.ggml.tokens */
} GgufTokRef;

/* By text, then by index. */
static int gguf_tokref_cmp(const void *x, const void *y)
{
    const GgufTokRef *a = x, *b = y;
    int c = memcmp(a->s.s, b->s.s, a->s.len < b->s.len ? a->s.len : b->s.len);
    if (c == 0 && a->s.len != b->s.len)
        c = a->s.len < b->s.len ? -1 : 1;
    return c ? c : (a->i > b->i) - (a->i < b->i);
}

static bool gguf_tokref_same(const GgufTokRef *a, const GgufTokRef *b)
{
    return a->s.len == b->s.len && memcmp(a->s.s, b->s.s, a->s.len) == 0;
}

/* Empty and repeated normal tokens of an SPM vocabulary. SentencePiece
 * writes neither, but converted GGUF vocabularies hold them (llama.cpp
 * warns of an empty token; official Gemma 4 GGUFs repeat three texts),
 * and they are harmless here: an empty piece matches nothing, and encoding takes
 * the lowest id of a text. So one warning each, naming the first and
 * counting all. */
static void gguf_spm_warn(const GgufFile *g, const GgufKV *tokens, const GgufKV *types, Diag *d)
{
    SrcFile src = {.path = g->path};
    GgufTokRef *refs = xmalloc(tokens->arr_n * sizeof *refs);
    uint64_t nref = 0, nempty = 0, empty_at = 0, ndup = 0, first = 0, a = 0, b = UINT64_MAX;
    for (uint64_t i = 0; i < tokens->arr_n; i++) {
        if (types && gguf_i32_at(types, i) != GGUF_TOK_NORMAL)
            continue;
        if (tokens->strs[i].len == 0 && nempty++ == 0)
            empty_at = i;
        else if (tokens->strs[i].len > 0)
            refs[nref++] = (GgufTokRef){tokens->strs[i], i};
    }
    qsort(refs, nref, sizeof *refs, gguf_tokref_cmp);
    for (uint64_t k = 0; k < nref; k++) {
        if (k == 0 || !gguf_tokref_same(&refs[k - 1], &refs[k]))
            first = refs[k].i;
        else if (++ndup && refs[k].i < b)   /* the pair whose repeat comes first */
            a = first, b = refs[k].i;
    }
    if (nempty)
        diag_warning(d, &src, 0, 0, "tokenizer.ggml.tokens[%llu] is an empty normal token (%llu in all); encoding "
                     "never produces one", (unsigned long long)empty_at, (unsigned long long)nempty);
    if (ndup) {
        char esc[96];
        tok_escape(tokens->strs[b].s, tokens->strs[b].len, esc, sizeof esc);
        diag_warning(d, &src, 0, 0, "tokenizer.ggml.tokens[%llu] and [%llu] are the same normal token '%s' (%llu "
                     "repeat an earlier one's text); encoding produces only the first", (unsigned long long)a,
                     (unsigned long long)b, esc, (unsigned long long)ndup);
    }
    free(refs);
}

static bool gguf_vocab(Tokenizer *t, const GgufFile *g, bool spm, Diag *d)
{
    uint64_t n = (uint64_t)tok_vocab(t);
    const GgufKV *tokens = gguf_array(g, "tokenizer.ggml.tokens", GGUF_T_STRING, 0, d);
    const GgufKV *types = NULL, *scores = NULL;   /* optional, as in llama.cpp: normal, score 0 */
    if (!tokens || !gguf_array_opt(g, "tokenizer.ggml.token_type", GGUF_T_I32, tokens->arr_n, d, &types) ||
        !gguf_array_opt(g, "tokenizer.ggml.scores", GGUF_T_F32, tokens->arr_n, d, &scores))
        return false;
    for (uint64_t i = 0; i < tokens->arr_n && i < n; i++) {
        int32_t type = types ? gguf_i32_at(types, i) : GGUF_TOK_NORMAL;
        bool special = gguf_is_special(type);
        if (!gguf_token_check(g, i, type, tokens->strs[i], spm, d))
            return false;
        bool ok = spm ? gguf_spm_piece(t, (int)i, tokens->strs[i], scores ? gguf_f32_at(scores, i) : 0.0f)
                      : gguf_bpe_piece(t, (int)i, tokens->strs[i], special);
        if (!ok) {
            diag_file_error(d, g->path, "tokenizer.ggml.tokens[%llu] is not in the byte-level alphabet",
                            (unsigned long long)i);
            return false;
        }
        if (special)
            tok_set_special(t, (int)i);
        if (spm && scores && !isfinite(gguf_f32_at(scores, i))) {
            diag_file_error(d, g->path, "tokenizer.ggml.scores[%llu] is not finite", (unsigned long long)i);
            return false;
        }
    }
    if (spm)
        gguf_spm_warn(g, tokens, types, d);
    return true;
}

/* One of tokenizer.ggml.bos_token_id / eos_token_id: -1 when absent; an
 * id outside the vocabulary, or not an integer, is an error. */
static bool gguf_id(const Tokenizer *t, const GgufFile *g, const char *key, int64_t *id, Diag *d)
{
    *id = -1;
    const GgufKV *kv = gguf_find(g, key);
    if (!kv)
        return true;
    if (!gguf_get_int(g, key, id)) {
        diag_file_error(d, g->path, "%s must be an integer", key);
        return false;
    }
    if (*id < 0 || *id >= tok_vocab(t)) {
        diag_file_error(d, g->path, "%s %lld is outside the vocabulary (%d)", key, (long long)*id, tok_vocab(t));
        return false;
    }
    return true;
}

/* bos/eos: the model description's, else the file's; the file's
 * end-of-turn and end-of-message ids (llama.cpp's eot/eom: Llama 3's
 * <|eot_id|>, <|eom_id|>) end generation too. */
static bool gguf_ids(Tokenizer *t, const GgufFile *g, const ModelDesc *m, Diag *d)
{
    int64_t bos = m->bos_id, eos = m->eos_id, eot = -1, eom = -1;
    if ((m->bos_id < 0 && !gguf_id(t, g, "tokenizer.ggml.bos_token_id", &bos, d)) ||
        (m->eos_id < 0 && !gguf_id(t, g, "tokenizer.ggml.eos_token_id", &eos, d)) ||
        !gguf_id(t, g, "tokenizer.ggml.eot_token_id", &eot, d) || !gguf_id(t, g, "tokenizer.ggml.eom_token_id", &eom, d))
        return false;
    tok_set_ids(t, (int)bos, (int)eos);
    if (eot >= 0)
        tok_set_stop(t, (int)eot);
    if (eom >= 0)
        tok_set_stop(t, (int)eom);
    return true;
}

static Tokenizer *gguf_build(const GgufFile *g, const ModelDesc *m, Diag *d)
{
    GgufStr model = {0, NULL};
    const GgufKV *tokens = gguf_find(g, "tokenizer.ggml.tokens");
    if (!gguf_get_str(g, "tokenizer.ggml.model", &model) || !tokens || tokens->type != GGUF_T_ARRAY) {
        diag_file_error(d, g->path, "no tokenizer.ggml.model / tokenizer.ggml.tokens in the file");
        return NULL;
    }
    bool spm = model.len == 5 && memcmp(model.s, "llama", 5) == 0;
    bool bpe = model.len == 4 && memcmp(model.s, "gpt2", 4) == 0;
    PreTokKind pk = PRETOK_NONE;
    if (!spm && !bpe) {
        diag_file_error(d, g->path, "tokenizer.ggml.model '%.*s' is not supported yet (llama, gpt2)", (int)model.len,
                        model.s);
        return NULL;
    }
    const GgufKV *sp = gguf_find(g, "tokenizer.ggml.add_space_prefix");
    if (spm && sp && (sp->type != GGUF_T_BOOL || !sp->v.b)) {  /* megac's SPM always adds the dummy prefix */
        diag_file_error(d, g->path, "an SPM vocabulary without its dummy prefix (tokenizer.ggml.add_space_prefix "
                        "false) is not supported yet");
        return NULL;
    }
    if (bpe && !gguf_pretok(g, d, &pk))
        return NULL;
    if (tokens->arr_n == 0) {
        diag_file_error(d, g->path, "the vocabulary (tokenizer.ggml.tokens) is empty");
        return NULL;
    }
    if ((m->vocab_size > 0 && tokens->arr_n > (uint64_t)m->vocab_size) || tokens->arr_n > (1u << 24)) {
        diag_file_error(d, g->path, "%llu tokens do not fit the model's vocab_size %d",
                        (unsigned long long)tokens->arr_n, m->vocab_size);
        return NULL;
    }
    int nv = m->vocab_size > 0 ? m->vocab_size : (int)tokens->arr_n;
    Tokenizer *t = tok_new(spm ? TOK_SPM : TOK_BPE, nv);
    if (!t)
        die("out of memory");
    tok_set_pretok(t, pk);
    const GgufKV *ab = gguf_find(g, "tokenizer.ggml.add_bos_token");
    if (ab && ab->type != GGUF_T_BOOL) {
        diag_file_error(d, g->path, "tokenizer.ggml.add_bos_token must be a bool");
        tok_free(t);
        return NULL;
    }
    tok_set_always_bos(t, ab && ab->v.b);
    GgufStr ct;
    if (gguf_get_str(g, "tokenizer.chat_template", &ct))
        chat_set(t, ct.s, (size_t)ct.len, g->path, d);
    else if (gguf_find(g, "tokenizer.chat_template"))
        chat_warn(g->path, "tokenizer.chat_template is not a string", d);
    if (!gguf_ids(t, g, m, d) || !gguf_vocab(t, g, spm, d) || (bpe && !gguf_merges(t, g, d))) {
        tok_free(t);
        return NULL;
    }
    return t;
}

static Tokenizer *tok_import_gguf(const ModelDesc *m, Diag *d)
{
    GgufFile *g = gguf_open(m->tok_path, d);
    if (!g)
        return NULL;
    Tokenizer *t = gguf_build(g, m, d);
    gguf_close(g);
    if (t)
        tok_finish(t);
    if (t && tok_error(t)) {
        diag_file_error(d, m->tok_path, "%s", tok_error(t));
        tok_free(t);
        t = NULL;
    }
    return t;
}

/* ---- driver ---- */

/* How many whole tokens a llama2.c tokenizer file holds (it does not say:
 * u32 max_len, then {f32 score, i32 len, len bytes} to the end); -1 when
 * unreadable (tok_load_llama2c reports that). */
static long llama2c_token_count(const char *path)
{
    size_t n;
    unsigned char *b = (unsigned char *)read_file(path, &n);
    if (!b)
        return -1;
    long count = 0;
    for (size_t at = 4; at + 8 <= n; count++) {
        int32_t len;
        memcpy(&len, b + at + 4, 4);
        if (len < 0 || (size_t)len > n - at - 8)
            break;
        at += 8 + (size_t)len;
    }
    free(b);
    return count;
}

static Tokenizer *tok_import_llama2c(const ModelDesc *m, Diag *d)
{
    char err[512];
    if (m->vocab_size <= 0) {
        diag_file_error(d, m->tok_path, "a llama2.c tokenizer needs the model's vocab_size");
        return NULL;
    }
    Tokenizer *t = tok_load_llama2c(m->tok_path, m->vocab_size, err, sizeof err);
    if (!t) {
        size_t np = strlen(m->tok_path);    /* the message starts "path: "; the diagnostic names it already */
        bool named = strncmp(err, m->tok_path, np) == 0 && strncmp(err + np, ": ", 2) == 0;
        diag_file_error(d, m->tok_path, "%s", named ? err + np + 2 : err);
        return NULL;
    }
    long have = llama2c_token_count(m->tok_path);
    if (have > m->vocab_size) {
        SrcFile src = {.path = m->tok_path};
        diag_warning(d, &src, 0, 0, "the file holds %ld tokens; the model's vocab_size is %d, so only the first %d "
                     "are used", have, m->vocab_size, m->vocab_size);
    }
    if (m->bos_id >= 0 || m->eos_id >= 0)
        tok_set_ids(t, m->bos_id >= 0 ? m->bos_id : tok_bos(t), m->eos_id >= 0 ? m->eos_id : tok_eos(t));
    return t;
}

static Tokenizer *tok_import_format(const ModelDesc *m, Diag *d)
{
    Tokenizer *t = NULL;
    if (m->tok_format != TOKFMT_BYTES && m->tok_format != TOKFMT_NONE && !m->tok_path) {
        diag_file_error(d, m->path, "the tokenizer's file is not given");
        return NULL;
    }
    switch (m->tok_format) {
    case TOKFMT_LLAMA2C:
        return tok_import_llama2c(m, d);
    case TOKFMT_HF:
        return tok_import_hf(m, d);
    case TOKFMT_GGUF:
        return tok_import_gguf(m, d);
    case TOKFMT_BYTES:
        t = tok_new_bytes();
        if (!t)
            diag_file_error(d, m->path, "out of memory building the byte tokenizer");
        return t;
    case TOKFMT_NONE:
        break;
    }
    size_t np = strlen(m->path);
    if (m->weights_format == WFMT_SAFETENSORS && np >= 12 && !strcmp(m->path + np - 12, "/config.json"))
        diag_file_error(d, m->path, "no tokenizer.json beside this config.json: megac reads an HF checkpoint "
                        "folder's tokenizer from there; copy the model's tokenizer.json into the folder");
    else if (m->weights_format == WFMT_LLAMA2C && m->weights_path && !strcmp(m->path, m->weights_path))
        diag_file_error(d, m->path, "no tokenizer beside this checkpoint: megac looks in its folder for "
                        "tok%d.bin, then tokenizer.bin (llama2.c's names); put it there, or write a description "
                        "that names it (`megac describe` prints one to start from)", m->vocab_size);
    else
        diag_file_error(d, m->path, "the model names no tokenizer");
    return NULL;
}

/* Special tokens that end a generation wherever a model writes them, as
 * llama.cpp's end-of-generation set has them: SmolLM2-Instruct's eos is
 * <|im_end|>, but it writes <|endoftext|> (a document's end) too, which
 * was printed as text. */
static const char *const eog_texts[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                                        "<|end|>",       "<end_of_turn>", "<|end_of_text|>", NULL};

static void eog_stops(Tokenizer *t)
{
    for (int id = 0; id < tok_vocab(t); id++) {
        size_t len;
        const char *p = tok_piece(t, id, &len);
        if (!p || !tok_is_special(t, id) || len < 5 || p[0] != '<')
            continue;
        for (int i = 0; eog_texts[i]; i++)
            if (len == strlen(eog_texts[i]) && !memcmp(p, eog_texts[i], len))
                tok_set_stop(t, id);
    }
}

Tokenizer *tok_import(const ModelDesc *m, Diag *d)
{
    Tokenizer *t = tok_import_format(m, d);
    for (int i = 0; t && i < m->n_stop; i++)   /* the rest of an eos list (desc_check: in the vocabulary) */
        tok_set_stop(t, m->stop_ids[i]);
    if (t)
        eog_stops(t);
    if (t && tok_error(t)) {
        diag_file_error(d, m->path, "%s", tok_error(t));
        tok_free(t);
        return NULL;
    }
    return t;
}
