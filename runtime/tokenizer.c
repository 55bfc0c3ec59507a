/*
 * tokenizer.c - encode and decode for the three tokenizer kinds of
 * tokenizer.h, and the native tokenizer file.
 *
 * Pieces are held as raw bytes: SPM pieces with ' ' for U+2581, byte-level
 * BPE pieces already mapped back from GPT-2's byte-to-unicode alphabet (the
 * importers do that), so encode works on bytes and decode is a copy.
 *
 *  - TOK_SPM (llama2.c run.c): optional BOS; a dummy-prefix piece " " when
 *    the text is non-empty (and, as llama.cpp does, after each special
 *    token); each UTF-8 char (a lead byte and up to 3 continuation bytes) is
 *    looked up whole, else its bytes become the byte pieces <0xXX>; then the
 *    adjacent pair whose concatenation is a piece with the highest score
 *    (leftmost on ties) is merged until no pair is a piece.
 *  - TOK_BPE: special tokens are cut out first (leftmost, then longest
 *    match; never split); the text between them is split by the
 *    pre-tokenizer regex (hand-written matchers below, one function per
 *    regex), and each word, as single-byte pieces, repeatedly merges the
 *    adjacent pair of lowest merge rank (leftmost on ties), as HF tokenizers
 *    do. PRETOK_LLAMA3 first takes a word that is a whole piece as is.
 *  - TOK_BYTES: id 3+b for byte b; 0,1,2 = <unk> <s> </s>.
 * A character with no piece whose bytes (some or all) have no byte token
 * either loses those bytes; tok_encode_drops counts such characters and
 * says where the first one is, so that callers can warn.
 *
 * Unicode classes: \p{L} and \p{N} are the general categories L* and N*
 * from tok_unicode.inc (generated from Unicode 16.0 data, as HF tokenizers'
 * Oniguruma has it; the Digits split's numeric chars are HF's own); \s is the
 * White_Space property, as in Oniguruma (which HF tokenizers uses). The
 * case-insensitive contractions of Llama-3 fold ASCII and U+017F. Invalid UTF-8
 * bytes are taken one at a time as "other" (neither letter, number nor
 * space).
 *
 * Native file, little-endian (tokenizer.bin in a bundle):
 *   "MGTK" u32 version(=2) u32 kind u32 pretok u32 flags (bit 0: always BOS;
 *   version 1 files have no flags word and read as 0)
 *   i32 n_vocab i32 bos i32 eos i32 n_merges
 *   n_vocab x { u32 len, f32 score, u8 flags (bit 0: special; bit 1, from
 *   version 2: generation stops at it), len bytes }
 *   n_merges x { i32 a, i32 b }          (rank = index; a+b is a piece)
 *   from version 3: u32 chat (ChatKind), u32 len, len bytes (the chat
 *   template's default system turn; 0: none)
 * Every count and length is checked against the file size on load.
 *
 * Runtime code: no compiler headers, never ends the process; errors come back as NULL /
 * false / -1 with a message.
 */
#include "runtime/tokenizer.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct { uint32_t lo, hi; } TokRange;
#include "runtime/tok_unicode.inc"

#define TOK_MAGIC "MGTK"
#define TOKF_SPECIAL 1u     /* matched verbatim in the input */
#define TOKF_STOP 2u        /* generation stops at it (besides eos) */
#define TOK_VERSION 3u        /* 2: a flags word (bit 0: always BOS) after the pre-tokenizer; 3: the
                                 chat format after the merges */
#define TOK_MAX_VOCAB (1 << 24)
#define TOK_MAX_PIECE (1 << 16)

typedef struct {
    int a, b, out;          /* piece ids: a + b = out */
    int rank;
} TokMerge;

struct Tokenizer {
    TokKind kind;
    PreTokKind pretok;
    bool always_bos;        /* every prompt starts with BOS (Llama 3) */
    ChatKind chat;
    char *chat_system;      /* the chat template's default system turn, or NULL */
    int n_vocab;
    int bos, eos;
    char **piece;           /* (n_vocab) raw bytes, malloc'd each */
    uint32_t *plen;         /* (n_vocab) */
    float *score;           /* (n_vocab) */
    unsigned char *special; /* (n_vocab) TOKF_* bits */
    /* piece bytes -> id, open addressing (-1 empty) */
    int *hash;
    size_t hcap;
    bool hash_stale;
    /* merges, sorted by rank after tok_finish; (a,b) -> merge index */
    TokMerge *merges;
    int nmerges, mcap;
    int *mhash;
    size_t mhcap;
    int byte_id[256];       /* piece of a single byte (BPE) or <0xXX> (SPM) */
    int *specials;          /* special ids, longest content first */
    int nspecials;
    unsigned char special_first[256];
    char err[200];
};

/* ---- builder errors ---- */

static void tok_fail(Tokenizer *t, const char *fmt, ...)
{
    if (t->err[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    va_end(ap);
}

const char *tok_error(const Tokenizer *t)
{
    return t->err[0] ? t->err : NULL;
}

/* ---- construction ---- */

Tokenizer *tok_new(TokKind kind, int n_vocab)
{
    if (n_vocab <= 0 || n_vocab > TOK_MAX_VOCAB)
        return NULL;
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->kind = kind;
    t->n_vocab = n_vocab;
    t->bos = t->eos = -1;
    t->piece = calloc((size_t)n_vocab, sizeof *t->piece);
    t->plen = calloc((size_t)n_vocab, sizeof *t->plen);
    t->score = calloc((size_t)n_vocab, sizeof *t->score);
    t->special = calloc((size_t)n_vocab, 1);
    if (!t->piece || !t->plen || !t->score || !t->special) {
        tok_free(t);
        return NULL;
    }
    t->hash_stale = true;
    return t;
}

void tok_free(Tokenizer *t)
{
    if (!t)
        return;
    if (t->piece)
        for (int i = 0; i < t->n_vocab; i++)
            free(t->piece[i]);
    free(t->piece);
    free(t->chat_system);
    free(t->plen);
    free(t->score);
    free(t->special);
    free(t->hash);
    free(t->merges);
    free(t->mhash);
    free(t->specials);
    free(t);
}

void tok_set_piece(Tokenizer *t, int id, const char *bytes, size_t len, float score)
{
    if (id < 0 || id >= t->n_vocab) {
        tok_fail(t, "piece %d is out of range [0, %d)", id, t->n_vocab);
        return;
    }
    if (len > TOK_MAX_PIECE) {
        tok_fail(t, "piece %d is %zu bytes long, more than the %d bytes a piece may have", id, len, TOK_MAX_PIECE);
        return;
    }
    char *p = malloc(len ? len : 1);
    if (!p) {
        tok_fail(t, "out of memory");
        return;
    }
    if (len)
        memcpy(p, bytes, len);
    free(t->piece[id]);
    t->piece[id] = p;
    t->plen[id] = (uint32_t)len;
    t->score[id] = score;
    t->hash_stale = true;
}

void tok_set_stop(Tokenizer *t, int id)
{
    if (id < 0 || id >= t->n_vocab) {
        tok_fail(t, "stop token %d out of range", id);
        return;
    }
    t->special[id] |= TOKF_STOP;
}

bool tok_is_stop(const Tokenizer *t, int id)
{
    return id >= 0 && id < t->n_vocab && (id == t->eos || (t->special[id] & TOKF_STOP));
}

void tok_set_special(Tokenizer *t, int id)
{
    if (id < 0 || id >= t->n_vocab) {
        tok_fail(t, "special token %d out of range", id);
        return;
    }
    t->special[id] |= TOKF_SPECIAL;
    t->hash_stale = true;
}

void tok_set_always_bos(Tokenizer *t, bool always)
{
    t->always_bos = always;
}

void tok_set_chat(Tokenizer *t, ChatKind k, const char *default_system)
{
    if ((unsigned)k >= CHAT_KINDS || (default_system && strlen(default_system) > TOK_MAX_SYSTEM)) {
        tok_fail(t, "chat format %d (or its system turn) out of range", (int)k);
        return;
    }
    free(t->chat_system);
    t->chat = k;
    t->chat_system = default_system ? strdup(default_system) : NULL;
    if (default_system && !t->chat_system)
        tok_fail(t, "out of memory");
}

ChatKind tok_chat(const Tokenizer *t, const char **default_system)
{
    if (default_system)
        *default_system = t->chat_system;
    return t->chat;
}

void tok_set_ids(Tokenizer *t, int bos, int eos)
{
    if (bos < -1 || bos >= t->n_vocab || eos < -1 || eos >= t->n_vocab)
        tok_fail(t, "bos %d / eos %d out of range", bos, eos);
    else
        t->bos = bos, t->eos = eos;
}

void tok_set_pretok(Tokenizer *t, PreTokKind k)
{
    t->pretok = k;
}

/* ---- piece lookup ---- */

static uint64_t tok_hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* All pieces, lowest id first on duplicates; specials left out once
 * tok_finish runs (they are only ever matched verbatim). */
static bool tok_hash_build(Tokenizer *t, bool skip_special)
{
    size_t cap = 16;
    while (cap < (size_t)t->n_vocab * 2)
        cap <<= 1;
    int *h = malloc(cap * sizeof *h);
    if (!h)
        return false;
    memset(h, 0xff, cap * sizeof *h);
    for (int id = 0; id < t->n_vocab; id++) {
        if (!t->piece[id] || (skip_special && (t->special[id] & TOKF_SPECIAL)))
            continue;
        size_t i = tok_hash_bytes(t->piece[id], t->plen[id]) & (cap - 1);
        for (; h[i] >= 0; i = (i + 1) & (cap - 1))
            if (t->plen[h[i]] == t->plen[id] && memcmp(t->piece[h[i]], t->piece[id], t->plen[id]) == 0)
                break;
        if (h[i] < 0)
            h[i] = id;
    }
    free(t->hash);
    t->hash = h;
    t->hcap = cap;
    t->hash_stale = false;
    return true;
}

static int tok_lookup(const Tokenizer *t, const char *s, size_t n)
{
    if (!t->hash)
        return -1;
    size_t i = tok_hash_bytes(s, n) & (t->hcap - 1);
    for (; t->hash[i] >= 0; i = (i + 1) & (t->hcap - 1)) {
        int id = t->hash[i];
        if (t->plen[id] == n && memcmp(t->piece[id], s, n) == 0)
            return id;
    }
    return -1;
}

/* Lookup of a + b without a scratch buffer limit. */
static int tok_lookup2(const Tokenizer *t, int a, int b)
{
    size_t n = (size_t)t->plen[a] + t->plen[b];
    char small[256];
    char *buf = n <= sizeof small ? small : malloc(n);
    if (!buf)
        return -1;
    memcpy(buf, t->piece[a], t->plen[a]);
    memcpy(buf + t->plen[a], t->piece[b], t->plen[b]);
    int id = tok_lookup(t, buf, n);
    if (buf != small)
        free(buf);
    return id;
}

/* ---- merges ---- */

bool tok_add_merge(Tokenizer *t, const char *a, size_t alen, const char *b, size_t blen, int rank)
{
    if (t->hash_stale && !tok_hash_build(t, false)) {
        tok_fail(t, "out of memory");
        return false;
    }
    int ia = tok_lookup(t, a, alen), ib = tok_lookup(t, b, blen);
    int out = ia >= 0 && ib >= 0 ? tok_lookup2(t, ia, ib) : -1;
    if (out < 0)
        return false;
    if (t->nmerges == t->mcap) {
        int cap = t->mcap ? t->mcap * 2 : 1024;
        TokMerge *m = realloc(t->merges, (size_t)cap * sizeof *m);
        if (!m) {
            tok_fail(t, "out of memory");
            return false;
        }
        t->merges = m;
        t->mcap = cap;
    }
    t->merges[t->nmerges++] = (TokMerge){ia, ib, out, rank};
    return true;
}

static int tok_merge_cmp(const void *x, const void *y)
{
    const TokMerge *a = x, *b = y;
    return a->rank != b->rank ? (a->rank < b->rank ? -1 : 1) : (a->a != b->a ? a->a - b->a : a->b - b->b);
}

static size_t tok_mhash_slot(const Tokenizer *t, int a, int b)
{
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    k *= 0x9e3779b97f4a7c15ull;
    return (size_t)(k >> 20) & (t->mhcap - 1);
}

/* Sorts merges by rank and indexes them by pair (the first rank wins). */
static bool tok_merges_index(Tokenizer *t)
{
    if (t->nmerges > 1)
        qsort(t->merges, (size_t)t->nmerges, sizeof *t->merges, tok_merge_cmp);
    size_t cap = 16;
    while (cap < (size_t)t->nmerges * 2)
        cap <<= 1;
    free(t->mhash);
    t->mhash = malloc(cap * sizeof *t->mhash);
    if (!t->mhash)
        return false;
    memset(t->mhash, 0xff, cap * sizeof *t->mhash);
    t->mhcap = cap;
    for (int r = 0; r < t->nmerges; r++) {
        t->merges[r].rank = r;
        size_t i = tok_mhash_slot(t, t->merges[r].a, t->merges[r].b);
        for (; t->mhash[i] >= 0; i = (i + 1) & (cap - 1))
            if (t->merges[t->mhash[i]].a == t->merges[r].a && t->merges[t->mhash[i]].b == t->merges[r].b)
                break;
        if (t->mhash[i] < 0)
            t->mhash[i] = r;
    }
    return true;
}

/* The rank of merging pieces a and b, or -1. */
static int tok_merge_rank(const Tokenizer *t, int a, int b)
{
    if (!t->mhash)
        return -1;
    size_t i = tok_mhash_slot(t, a, b);
    for (; t->mhash[i] >= 0; i = (i + 1) & (t->mhcap - 1)) {
        const TokMerge *m = &t->merges[t->mhash[i]];
        if (m->a == a && m->b == b)
            return t->mhash[i];
    }
    return -1;
}

/* ---- finish ---- */

static const char hexdig[] = "0123456789ABCDEF";

static void tok_byte_ids(Tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        if (t->kind == TOK_SPM) {
            char s[6] = {'<', '0', 'x', hexdig[b >> 4], hexdig[b & 15], '>'};
            t->byte_id[b] = tok_lookup(t, s, 6);
        } else if (t->kind == TOK_BPE) {
            char c = (char)b;
            t->byte_id[b] = tok_lookup(t, &c, 1);
        } else {
            t->byte_id[b] = 3 + b < t->n_vocab ? 3 + b : -1;
        }
    }
}

typedef struct { uint32_t len; int id; } SpecialKey;

static int tok_special_cmp(const void *x, const void *y)
{
    const SpecialKey *a = x, *b = y;
    return a->len != b->len ? (a->len > b->len ? -1 : 1) : a->id - b->id;
}

/* Special ids, longest content first (so the first match is the longest). */
static bool tok_specials_index(Tokenizer *t)
{
    free(t->specials);
    t->nspecials = 0;
    t->specials = malloc((size_t)t->n_vocab * sizeof *t->specials);
    SpecialKey *keys = malloc((size_t)t->n_vocab * sizeof *keys);
    if (!t->specials || !keys) {
        free(keys);
        return false;
    }
    memset(t->special_first, 0, sizeof t->special_first);
    for (int id = 0; id < t->n_vocab; id++) {
        if ((t->special[id] & TOKF_SPECIAL) && t->piece[id] && t->plen[id] > 0) {
            keys[t->nspecials++] = (SpecialKey){t->plen[id], id};
            t->special_first[(unsigned char)t->piece[id][0]] = 1;
        }
    }
    if (t->nspecials > 1)
        qsort(keys, (size_t)t->nspecials, sizeof *keys, tok_special_cmp);
    for (int i = 0; i < t->nspecials; i++)
        t->specials[i] = keys[i].id;
    free(keys);
    return true;
}

void tok_finish(Tokenizer *t)
{
    for (int id = 0; id < t->n_vocab; id++)
        if (!t->piece[id])
            tok_set_piece(t, id, "", 0, 0.0f);
    if (!tok_hash_build(t, true) || !tok_merges_index(t) || !tok_specials_index(t))
        tok_fail(t, "out of memory");
    tok_byte_ids(t);
}

Tokenizer *tok_new_bytes(void)
{
    Tokenizer *t = tok_new(TOK_BYTES, 259);
    if (!t)
        return NULL;
    static const char *const names[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++)
        tok_set_piece(t, i, names[i], strlen(names[i]), 0.0f);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        tok_set_piece(t, 3 + b, &c, 1, 0.0f);
    }
    tok_set_ids(t, 1, 2);
    tok_finish(t);
    if (tok_error(t)) {
        tok_free(t);
        return NULL;
    }
    return t;
}

/* ---- accessors ---- */

int tok_vocab(const Tokenizer *t) { return t->n_vocab; }
int tok_bos(const Tokenizer *t) { return t->bos; }
int tok_eos(const Tokenizer *t) { return t->eos; }
TokKind tok_kind(const Tokenizer *t) { return t->kind; }
PreTokKind tok_pretok(const Tokenizer *t) { return t->pretok; }
int tok_nmerges(const Tokenizer *t) { return t->nmerges; }

const char *tok_piece(const Tokenizer *t, int id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab || !t->piece[id])
        return NULL;
    *len = t->plen[id];
    return t->piece[id];
}

bool tok_is_special(const Tokenizer *t, int id)
{
    return id >= 0 && id < t->n_vocab && (t->special[id] & TOKF_SPECIAL);
}

/* ---- output buffer of ids ---- */

typedef struct {
    int *ids;
    int n, cap;
    bool overflow;
    bool no_prefix;         /* SPM: the segment at hand gets no dummy prefix (it continues a text) */
    const char *text;       /* the whole text, for the offsets of drops */
    TokDrops drops;
} IdBuf;

static void ids_push(IdBuf *o, int id)
{
    if (o->n < o->cap)
        o->ids[o->n++] = id;
    else
        o->overflow = true;
}

static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *len);

/* Pushes the byte tokens of the char at s[0..k); a char with a byte that
 * has none is counted as dropped (its other bytes are kept). */
static void ids_push_bytes(const Tokenizer *t, IdBuf *o, int *sym, int *m, const char *s, size_t k)
{
    bool lost = false;
    for (size_t b = 0; b < k; b++) {
        int id = t->byte_id[(unsigned char)s[b]];
        if (id >= 0)
            sym[(*m)++] = id;
        lost |= id < 0;
    }
    if (lost && o->drops.n++ == 0) {
        size_t len;
        uint32_t cp = utf8_next((const unsigned char *)s, k, &len);
        o->drops.first = cp == 0xFFFFFFFFu || len != k ? -1 : (int32_t)cp;
        o->drops.first_at = (size_t)(s - o->text);
    }
}

/* The length of the char at s[0..n): a lead byte and up to 3 continuation bytes. */
static size_t utf8_len(const char *s, size_t n)
{
    size_t k = 1;
    while (k < n && k < 4 && ((unsigned char)s[k] & 0xC0) == 0x80)
        k++;
    return k;
}

/* ---- Unicode classes ---- */

typedef enum { CC_OTHER, CC_LETTER, CC_NUMBER, CC_SPACE } CharClass;

static bool tok_in_ranges(const TokRange *r, size_t n, uint32_t c)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < r[mid].lo)
            hi = mid;
        else if (c > r[mid].hi)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/* The White_Space property (Oniguruma's \s). */
static bool tok_is_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static CharClass tok_class(uint32_t c)
{
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
            return CC_LETTER;
        if (c >= '0' && c <= '9')
            return CC_NUMBER;
        return tok_is_space(c) ? CC_SPACE : CC_OTHER;
    }
    if (tok_in_ranges(tok_letters, sizeof tok_letters / sizeof *tok_letters, c))
        return CC_LETTER;
    if (tok_in_ranges(tok_numbers, sizeof tok_numbers / sizeof *tok_numbers, c))
        return CC_NUMBER;
    return tok_is_space(c) ? CC_SPACE : CC_OTHER;
}

/* Whether HF's Digits pre-tokenizer splits c off as a word of its own
 * (Rust's char::is_numeric, whose Unicode version may be newer than the
 * regex's \p{N}: tok_unicode.inc). */
static bool tok_digit_split(uint32_t c)
{
    if (c < 0x80)
        return c >= '0' && c <= '9';
    return tok_in_ranges(tok_numeric, sizeof tok_numeric / sizeof *tok_numeric, c);
}

/* Decodes one UTF-8 char at s[0..n); sets *len. Invalid or truncated
 * sequences decode as one byte of value 0xFFFFFFFF (class "other"). */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *len)
{
    int k = tok_utf8_len((const char *)s, n); /* strict: no overlong forms, surrogates or past U+10FFFF */
    if (k <= 1) {
        *len = 1;
        return k == 1 ? s[0] : 0xFFFFFFFFu;
    }
    uint32_t cp = s[0] & (0x7Fu >> k);
    for (int i = 1; i < k; i++)
        cp = (cp << 6) | (s[i] & 0x3Fu);
    *len = (size_t)k;
    return cp;
}

/* ---- pre-tokenizer: a segment as chars with classes ---- */

typedef struct {
    uint32_t *cp;           /* (n) codepoints */
    unsigned char *cls;     /* (n) CharClass */
    size_t *off;            /* (n+1) byte offsets */
    size_t n;
} Chars;

static bool chars_init(Chars *c, const char *s, size_t len)
{
    c->cp = malloc((len + 1) * sizeof *c->cp);
    c->cls = malloc(len + 1);
    c->off = malloc((len + 1) * sizeof *c->off);
    c->n = 0;
    if (!c->cp || !c->cls || !c->off)
        return false;
    for (size_t i = 0; i < len;) {
        size_t k;
        uint32_t cp = utf8_next((const unsigned char *)s + i, len - i, &k);
        c->cp[c->n] = cp;
        c->cls[c->n] = (unsigned char)(cp == 0xFFFFFFFFu ? CC_OTHER : tok_class(cp));
        c->off[c->n++] = i;
        i += k;
    }
    c->off[c->n] = len;
    return true;
}

static void chars_free(Chars *c)
{
    free(c->cp);
    free(c->cls);
    free(c->off);
}

static size_t run_of(const Chars *c, size_t i, CharClass k)
{
    while (i < c->n && c->cls[i] == k)
        i++;
    return i;
}

static bool is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

/* Case folding for the contraction letters: ASCII, and U+017F (long s),
 * the one other char whose simple case fold is among s t r e v m l d. */
static uint32_t fold(uint32_t c, bool icase)
{
    if (!icase)
        return c;
    return c >= 'A' && c <= 'Z' ? c + 32 : c == 0x17F ? 's' : c;
}

/* '(s|t|re|ve|m|ll|d), optionally ASCII case-insensitive: end index or 0. */
static size_t match_contraction(const Chars *c, size_t i, bool icase)
{
    if (c->cp[i] != '\'' || i + 1 >= c->n)
        return 0;
    uint32_t a = fold(c->cp[i + 1], icase), b = i + 2 < c->n ? fold(c->cp[i + 2], icase) : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return i + 3;
    return 0;
}

/* Whitespace at i: \s+(?!\S) then \s+ (GPT-2 and Llama-3 tails). */
static size_t match_space_tail(const Chars *c, size_t i)
{
    size_t k = run_of(c, i, CC_SPACE);
    if (k == c->n || k - 1 == i)
        return k;
    return k - 1;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const Chars *c, size_t i)
{
    size_t j = match_contraction(c, i, false);
    if (j)
        return j;
    if (c->cls[i] != CC_SPACE)
        return run_of(c, i, (CharClass)c->cls[i]);
    if (c->cp[i] == ' ' && i + 1 < c->n && c->cls[i + 1] != CC_SPACE)
        return run_of(c, i + 1, (CharClass)c->cls[i + 1]);
    return match_space_tail(c, i);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with at most `digits` (3; Qwen2: 1) \p{N} chars a word. */
static size_t match_llama3(const Chars *c, size_t i, size_t digits)
{
    size_t j = match_contraction(c, i, true);
    if (j)
        return j;
    CharClass k = (CharClass)c->cls[i];
    if (k == CC_LETTER)
        return run_of(c, i, CC_LETTER);
    if (k != CC_NUMBER && !is_nl(c->cp[i]) && i + 1 < c->n && c->cls[i + 1] == CC_LETTER)
        return run_of(c, i + 1, CC_LETTER);
    if (k == CC_NUMBER) { /* no further than the word's end: a long run of digits is read once, not per word */
        for (j = i; j < c->n && j - i < digits && c->cls[j] == CC_NUMBER; j++)
            ;
        return j;
    }
    size_t s = c->cp[i] == ' ' && i + 1 < c->n && c->cls[i + 1] == CC_OTHER ? i + 1 : i;
    if (c->cls[s] == CC_OTHER) {
        j = run_of(c, s, CC_OTHER);
        while (j < c->n && is_nl(c->cp[j]))
            j++;
        return j;
    }
    size_t end = run_of(c, i, CC_SPACE), last = end;
    for (size_t m = i; m < end; m++)
        if (is_nl(c->cp[m]))
            last = m;
    if (last != end)
        return last + 1;
    return match_space_tail(c, i);
}

/* ---- merging symbols (both SPM and BPE) ----
 *
 * Symbols sit in a linked list; candidate pairs in a binary heap ordered by
 * (cost, position of the left symbol): the lowest cost first, the leftmost
 * on ties, which is exactly "repeatedly merge the best pair, leftmost
 * first" (llama2.c scans for it; HF and SentencePiece use such a queue)
 * in O(n log n). Entries made stale by earlier merges are skipped on pop.
 */

typedef struct {
    double cost;            /* SPM: -score of the merged piece; BPE: rank */
    int out;                /* the merged piece */
    int l, r;               /* symbol indices */
    int a, b;               /* their pieces when pushed */
} MergeCand;

typedef struct {
    const Tokenizer *t;
    int *id, *prev, *next;  /* (n) symbols; prev/next -1 at the ends */
    MergeCand *heap;
    size_t nheap, capheap;
} Merger;

static bool cand_less(const MergeCand *x, const MergeCand *y)
{
    return x->cost != y->cost ? x->cost < y->cost : x->l < y->l;
}

/* The cost of merging pieces a and b, or false when they do not merge. */
static bool pair_cost(const Tokenizer *t, int a, int b, double *cost, int *out)
{
    if (t->kind == TOK_BPE) {
        int r = tok_merge_rank(t, a, b);
        if (r < 0)
            return false;
        *cost = r, *out = t->merges[r].out;
        return true;
    }
    int id = tok_lookup2(t, a, b);
    if (id < 0 || t->score[id] <= -1e10f)   /* llama2.c's best_score starts at -1e10 */
        return false;
    *cost = -(double)t->score[id], *out = id;
    return true;
}

static void heap_push(Merger *m, int l, int r)
{
    if (l < 0 || r < 0)
        return;
    MergeCand c = {0, 0, l, r, m->id[l], m->id[r]};
    if (!pair_cost(m->t, c.a, c.b, &c.cost, &c.out))
        return;
    size_t i = m->nheap++;      /* capacity: see merger_run */
    for (; i > 0 && cand_less(&c, &m->heap[(i - 1) / 2]); i = (i - 1) / 2)
        m->heap[i] = m->heap[(i - 1) / 2];
    m->heap[i] = c;
}

static MergeCand heap_pop(Merger *m)
{
    MergeCand top = m->heap[0], last = m->heap[--m->nheap];
    size_t i = 0;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= m->nheap)
            break;
        if (k + 1 < m->nheap && cand_less(&m->heap[k + 1], &m->heap[k]))
            k++;
        if (!cand_less(&m->heap[k], &last))
            break;
        m->heap[i] = m->heap[k];
        i = k;
    }
    if (m->nheap)
        m->heap[i] = last;
    return top;
}

/* Merges sym[0..n) in place; returns the new count, or -1 (no memory). */
static int merger_run(const Tokenizer *t, int *sym, int n)
{
    if (n < 2)
        return n;
    Merger m = {t, sym, malloc((size_t)n * sizeof(int)), malloc((size_t)n * sizeof(int)),
                malloc((size_t)n * 3 * sizeof(MergeCand)), 0, (size_t)n * 3};
    if (!m.prev || !m.next || !m.heap) {
        free(m.prev), free(m.next), free(m.heap);
        return -1;
    }
    for (int i = 0; i < n; i++)
        m.prev[i] = i - 1, m.next[i] = i + 1 < n ? i + 1 : -1;
    for (int i = 0; i + 1 < n; i++)
        heap_push(&m, i, i + 1);
    while (m.nheap) {   /* n - 1 initial pairs + 2 per merge (< n merges) fit in 3n */
        MergeCand c = heap_pop(&m);
        if (m.id[c.l] != c.a || m.next[c.l] != c.r || m.id[c.r] != c.b)
            continue;   /* stale */
        m.id[c.l] = c.out;
        m.id[c.r] = -1;
        m.next[c.l] = m.next[c.r];
        if (m.next[c.r] >= 0)
            m.prev[m.next[c.r]] = c.l;
        heap_push(&m, m.prev[c.l], c.l);
        heap_push(&m, c.l, m.next[c.l]);
    }
    int k = 0;
    for (int i = 0; i >= 0; i = m.next[i])
        sym[k++] = sym[i];
    free(m.prev), free(m.next), free(m.heap);
    return k;
}

/* ---- BPE ---- */

/* Merges the byte pieces of word s[0..n) by rank and appends the ids. */
static bool bpe_word(const Tokenizer *t, const char *s, size_t n, IdBuf *o)
{
    if (t->pretok == PRETOK_LLAMA3) {
        int id = tok_lookup(t, s, n);
        if (id >= 0) {
            ids_push(o, id);
            return true;
        }
    }
    int *sym = malloc((n + 1) * sizeof *sym);
    if (!sym)
        return false;
    int m = 0;
    for (size_t i = 0, k; i < n; i += k) {   /* no piece: dropped, as HF does without unk */
        k = utf8_len(s + i, n - i);
        ids_push_bytes(t, o, sym, &m, s + i, k);
    }
    m = merger_run(t, sym, m);
    for (int i = 0; i < m; i++)
        ids_push(o, sym[i]);
    free(sym);
    return m >= 0;
}

/* The end of the pre-tokenizer word at c[i]. With PRETOK_GPT2_DIGITS a
 * digit (tok_digit_split) is a word alone and the regex sees only the spans between;
 * *span caches the end of the current span (start with 0). */
static size_t pretok_next(const Tokenizer *t, const Chars *c, size_t i, size_t *span)
{
    if (t->pretok == PRETOK_LLAMA3 || t->pretok == PRETOK_QWEN2)
        return match_llama3(c, i, t->pretok == PRETOK_QWEN2 ? 1 : 3);
    if (t->pretok == PRETOK_GPT2)
        return match_gpt2(c, i);
    if (t->pretok == PRETOK_NONE)
        return c->n;
    if (tok_digit_split(c->cp[i]))
        return i + 1;
    if (*span <= i) {
        *span = i;
        while (*span < c->n && !tok_digit_split(c->cp[*span]))
            ++*span;
    }
    Chars sub = *c;
    sub.n = *span;
    return match_gpt2(&sub, i);
}

/* Splits s[0..len) with the pre-tokenizer and encodes each word. */
static bool bpe_segment(const Tokenizer *t, const char *s, size_t len, IdBuf *o)
{
    Chars c;
    bool ok = chars_init(&c, s, len);
    size_t span = 0;
    for (size_t i = 0; ok && i < c.n;) {
        size_t j = pretok_next(t, &c, i, &span);
        ok = bpe_word(t, s + c.off[i], c.off[j] - c.off[i], o);
        i = j;
    }
    chars_free(&c);
    return ok;
}

int tok_split(const Tokenizer *t, const char *text, size_t *ends, int cap)
{
    Chars c;
    int n = 0;
    if (!chars_init(&c, text, strlen(text))) {
        chars_free(&c);
        return -1;
    }
    size_t span = 0;
    for (size_t i = 0; i < c.n && n >= 0;) {
        i = pretok_next(t, &c, i, &span);
        if (n < cap)
            ends[n++] = c.off[i];
        else
            n = -1;
    }
    chars_free(&c);
    return n;
}

/* ---- SPM ---- */

/* llama2.c: each UTF-8 char (lead byte + up to 3 continuation bytes) as a
 * piece or as byte pieces, then merges by best score. */
static bool spm_segment(const Tokenizer *t, const char *s, size_t len, IdBuf *o)
{
    int *sym = malloc((len + 1) * sizeof *sym);
    if (!sym)
        return false;
    int m = 0;
    int space = tok_lookup(t, " ", 1);
    if (space >= 0 && !o->no_prefix)   /* the dummy prefix */
        sym[m++] = space;
    for (size_t i = 0, k; i < len; i += k) {
        k = utf8_len(s + i, len - i);
        int id = tok_lookup(t, s + i, k);
        if (id >= 0)
            sym[m++] = id;
        else
            ids_push_bytes(t, o, sym, &m, s + i, k);
    }
    int k = merger_run(t, sym, m);
    for (int i = 0; i < k; i++)
        ids_push(o, sym[i]);
    free(sym);
    return k >= 0;
}

/* ---- encode ---- */

/* The longest special token starting at s[0..n), or -1. */
static int special_at(const Tokenizer *t, const char *s, size_t n)
{
    if (!t->special_first[(unsigned char)s[0]])
        return -1;
    for (int i = 0; i < t->nspecials; i++) {
        int id = t->specials[i];
        if (t->plen[id] <= n && memcmp(t->piece[id], s, t->plen[id]) == 0)
            return id;
    }
    return -1;
}

static bool tok_segment(const Tokenizer *t, const char *s, size_t len, IdBuf *o)
{
    if (len == 0)
        return true;
    if (t->kind == TOK_SPM)
        return spm_segment(t, s, len, o);
    if (t->kind == TOK_BPE)
        return bpe_segment(t, s, len, o);
    int sym[4];
    for (size_t i = 0, k; i < len; i += k) {
        int m = 0;
        k = utf8_len(s + i, len - i);
        ids_push_bytes(t, o, sym, &m, s + i, k);
        for (int j = 0; j < m; j++)
            ids_push(o, sym[j]);
    }
    return true;
}

int tok_encode(const Tokenizer *t, const char *text, bool add_bos, int *ids, int cap)
{
    return tok_encode_drops(t, text, add_bos, ids, cap, NULL);
}

/* cont: the text continues one encoded before (a later turn of a
 * conversation): SPM gives its start no dummy prefix. */
static int tok_encode_at(const Tokenizer *t, const char *text, bool add_bos, bool cont, int *ids, int cap,
                         TokDrops *drops)
{
    IdBuf o = {ids, 0, cap < 0 ? 0 : cap, false, false, text, {0, 0, 0}};
    if (add_bos && t->bos >= 0)
        ids_push(&o, t->bos);
    size_t len = strlen(text), start = 0;
    bool ok = true;
    for (size_t i = 0; ok && i <= len; i++) {
        int sp = i < len && t->nspecials ? special_at(t, text + i, len - i) : -1;
        if (sp < 0 && i < len)
            continue;
        o.no_prefix = cont && start == 0;
        ok = tok_segment(t, text + start, i - start, &o);
        if (sp >= 0) {
            ids_push(&o, sp);
            i += t->plen[sp] - 1;
            start = i + 1;
        }
    }
    if (drops)
        *drops = o.drops;
    return ok && !o.overflow ? o.n : -1;
}

int tok_encode_drops(const Tokenizer *t, const char *text, bool add_bos, int *ids, int cap, TokDrops *drops)
{
    return tok_encode_at(t, text, add_bos, false, ids, cap, drops);
}

int tok_encode_more(const Tokenizer *t, const char *text, int *ids, int cap, TokDrops *drops)
{
    return tok_encode_at(t, text, false, true, ids, cap, drops);
}

/* ---- decode ---- */

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int tok_decode(const Tokenizer *t, int prev, int id, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n_vocab || cap == 0)
        return -1;
    const char *p = t->piece[id];
    size_t n = t->plen[id];
    char byte;
    if (t->kind == TOK_BYTES) {
        byte = (char)(id - 3);
        p = &byte, n = id >= 3 ? 1 : 0;
    } else if (t->kind == TOK_SPM) {
        if (prev == t->bos && prev >= 0 && n > 0 && p[0] == ' ')
            p++, n--;
        if (n == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' && hexval(p[3]) >= 0 && hexval(p[4]) >= 0) {
            byte = (char)(hexval(p[3]) * 16 + hexval(p[4]));
            p = &byte, n = 1;
        }
    }
    if (n + 1 > cap)
        return -1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return (int)n;
}

/* ---- piece checks (the importers' and the loaders' one rule) ---- */

/* RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF. */
int tok_utf8_len(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    unsigned c = p[0];
    int k = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (k == 0 || (size_t)k > n)
        return 0;
    unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    if (k > 1 && (p[1] < lo || p[1] > hi))
        return 0;
    for (int j = 2; j < k; j++)
        if ((p[j] & 0xC0) != 0x80)
            return 0;
    return k;
}

bool tok_utf8_valid(const char *s, size_t len)
{
    for (size_t i = 0, k; i < len; i += k)
        if (!(k = (size_t)tok_utf8_len(s + i, len - i)))
            return false;
    return true;
}

/* Upper-case hex, as SentencePiece writes byte pieces and as
 * tok_byte_ids looks them up: a "<0x0a>" would never be found. */
bool tok_byte_piece(const char *s, size_t len)
{
    return len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0 &&
           !islower((unsigned char)s[3]) && !islower((unsigned char)s[4]);
}

size_t tok_escape(const char *s, size_t len, char *buf, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char one[5];
        int k = c == '\\' || c == '\'' ? snprintf(one, sizeof one, "\\%c", c)
                : c >= 0x20 && c < 0x7F ? snprintf(one, sizeof one, "%c", c)
                                       : snprintf(one, sizeof one, "\\x%02x", c);
        if (n + (size_t)k + (i + 1 < len ? 3 : 0) + 1 > cap) {  /* room left for "..." and the NUL */
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
        memcpy(buf + n, one, (size_t)k);
        n += (size_t)k;
    }
    buf[n] = '\0';
    return n;
}

/* ---- native file ---- */

static void put_u32(FILE *f, uint32_t v, bool *ok)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    if (fwrite(b, 1, 4, f) != 4)
        *ok = false;
}

static void put_f32(FILE *f, float x, bool *ok)
{
    uint32_t v;
    memcpy(&v, &x, 4);
    put_u32(f, v, ok);
}

static void tok_write(const Tokenizer *t, FILE *f, bool *ok)
{
    if (fwrite(TOK_MAGIC, 1, 4, f) != 4)
        *ok = false;
    put_u32(f, TOK_VERSION, ok);
    put_u32(f, (uint32_t)t->kind, ok);
    put_u32(f, (uint32_t)t->pretok, ok);
    put_u32(f, t->always_bos ? 1u : 0u, ok);
    uint32_t hdr[4] = {(uint32_t)t->n_vocab, (uint32_t)t->bos, (uint32_t)t->eos, (uint32_t)t->nmerges};
    for (int i = 0; i < 4; i++)
        put_u32(f, hdr[i], ok);
    for (int id = 0; id < t->n_vocab && *ok; id++) {
        put_u32(f, t->plen[id], ok);
        put_f32(f, t->score[id], ok);
        if (fputc(t->special[id], f) == EOF)
            *ok = false;
        if (t->plen[id] && fwrite(t->piece[id], 1, t->plen[id], f) != t->plen[id])
            *ok = false;
    }
    for (int r = 0; r < t->nmerges; r++) {
        put_u32(f, (uint32_t)t->merges[r].a, ok);
        put_u32(f, (uint32_t)t->merges[r].b, ok);
    }
    uint32_t slen = t->chat_system ? (uint32_t)strlen(t->chat_system) : 0;
    put_u32(f, (uint32_t)t->chat, ok);
    put_u32(f, slen, ok);
    if (slen && fwrite(t->chat_system, 1, slen, f) != slen)
        *ok = false;
}

bool tok_save(const Tokenizer *t, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        return false;
    }
    bool ok = true;
    tok_write(t, f, &ok);
    if (fclose(f) != 0)
        ok = false;
    if (!ok)
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
    return ok;
}

/* A bounds-checked reader over a file's bytes. */
typedef struct {
    const unsigned char *p;
    size_t n, at;
    bool ok;
} Reader;

static const unsigned char *rd_bytes(Reader *r, size_t k)
{
    if (!r->ok || k > r->n - r->at) {
        r->ok = false;
        return NULL;
    }
    r->at += k;
    return r->p + r->at - k;
}

static uint32_t rd_u32(Reader *r)
{
    const unsigned char *b = rd_bytes(r, 4);
    return b ? (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24 : 0;
}

static float rd_f32(Reader *r)
{
    uint32_t v = rd_u32(r);
    float x;
    memcpy(&x, &v, 4);
    return x;
}

/* A file's bytes, NUL-terminated; NULL with errno set on failure (EINVAL:
 * not a regular file, so that a FIFO or /dev/zero in a bundle is an
 * error, not an endless read: slurp_error says so). Opened with
 * O_NONBLOCK, so that a FIFO is refused rather than waited on. */
char *rt_slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = S_ISDIR(sb.st_mode) ? EISDIR : EINVAL;
        close(fd);
        errno = e;
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Reads a whole file (rt_slurp); NULL with err set. */
static unsigned char *tok_slurp(const char *path, size_t *len, char *err, size_t errlen)
{
    unsigned char *buf = (unsigned char *)rt_slurp(path, len);
    if (!buf && (errno == EISDIR || errno == EINVAL || errno == ENXIO)) /* a FIFO or /dev/zero would never end;
                                                                         ENXIO: a socket */
        snprintf(err, errlen, "%s: not a regular file%s", path, errno == ENXIO ? " (a socket)" : "");
    else if (!buf)
        snprintf(err, errlen, "%s: %s: %s", path, errno == ENOMEM ? "out of memory" : errno == EIO ? "read failed"
                                                                                                   : "cannot open",
                 strerror(errno));
    return buf;
}

/* Piece flags a file of `version` may hold: TOKF_SPECIAL, and from
 * version 2 TOKF_STOP. An SPM piece is UTF-8, as every importer checked
 * (BPE pieces are raw bytes: a piece may be part of a character). */
static bool tok_read_pieces(Tokenizer *t, Reader *r, uint32_t version)
{
    unsigned known = version >= 2 ? TOKF_SPECIAL | TOKF_STOP : TOKF_SPECIAL;
    for (int id = 0; id < t->n_vocab && r->ok; id++) {
        uint32_t len = rd_u32(r);
        float score = rd_f32(r);
        const unsigned char *flags = rd_bytes(r, 1);
        const unsigned char *b = len <= TOK_MAX_PIECE ? rd_bytes(r, len) : NULL;
        if (!flags || !b || (*flags & ~known) || !isfinite(score)) {
            if (len > TOK_MAX_PIECE)
                tok_fail(t, "piece %d is %u bytes long (at most %d)", id, len, TOK_MAX_PIECE);
            else if (!flags || !b)
                tok_fail(t, "the file ends inside piece %d of %d", id, t->n_vocab);
            else if (*flags & ~known)
                tok_fail(t, "piece %d has flags 0x%02x, which a version %u file does not have", id, *flags, version);
            else
                tok_fail(t, "piece %d's score is %g", id, (double)score);
            return false;
        }
        if (t->kind == TOK_SPM && !tok_utf8_valid((const char *)b, len)) {
            char esc[96];
            tok_escape((const char *)b, len, esc, sizeof esc);
            tok_fail(t, "piece %d '%s' is not valid UTF-8", id, esc);
            return false;
        }
        tok_set_piece(t, id, (const char *)b, len, score);
        if (*flags & TOKF_SPECIAL)
            tok_set_special(t, id);
        if (*flags & TOKF_STOP)
            tok_set_stop(t, id);
    }
    return r->ok && !tok_error(t);
}

static bool tok_read_merges(Tokenizer *t, Reader *r, uint32_t nmerges)
{
    for (uint32_t i = 0; i < nmerges && r->ok; i++) {
        int32_t a = (int32_t)rd_u32(r), b = (int32_t)rd_u32(r);
        if (!r->ok) {
            tok_fail(t, "the file ends inside merge %u of %u", i, nmerges);
            return false;
        }
        if (a < 0 || b < 0 || a >= t->n_vocab || b >= t->n_vocab) {
            tok_fail(t, "merge %u joins tokens %d and %d, outside the vocabulary of %d", i, a, b, t->n_vocab);
            return false;
        }
        if (!tok_add_merge(t, t->piece[a], t->plen[a], t->piece[b], t->plen[b], (int)i)) {
            if (!tok_error(t))
                tok_fail(t, "merge %u joins tokens %d and %d, whose pieces together are no piece", i, a, b);
            return false;
        }
    }
    return r->ok;
}

/* Version 3's chat format: a known kind, and a system turn of UTF-8 text
 * without NULs. */
static bool tok_read_chat(Tokenizer *t, Reader *r)
{
    uint32_t kind = rd_u32(r), len = rd_u32(r);
    if (!r->ok)
        tok_fail(t, "the file ends inside the chat format");
    else if (kind >= CHAT_KINDS)
        tok_fail(t, "chat format %u is unknown", kind);
    else if (len > TOK_MAX_SYSTEM)
        tok_fail(t, "a chat system turn of %u bytes (at most %d)", len, TOK_MAX_SYSTEM);
    if (!r->ok || kind >= CHAT_KINDS || len > TOK_MAX_SYSTEM)
        return false;
    const unsigned char *b = len ? rd_bytes(r, len) : NULL;
    if (len && (!b || memchr(b, 0, len) || !tok_utf8_valid((const char *)b, len))) {
        tok_fail(t, !b ? "the file ends inside the chat system turn" : "the chat system turn is not UTF-8 text");
        return false;
    }
    char *sys = len ? strndup((const char *)b, len) : NULL;
    if (len && !sys)
        return false;
    tok_set_chat(t, (ChatKind)kind, sys);
    free(sys);
    return !tok_error(t);
}

static Tokenizer *tok_parse(Reader *r, const char *path, char *err, size_t errlen)
{
    const unsigned char *magic = rd_bytes(r, 4);
    if (!magic || memcmp(magic, TOK_MAGIC, 4) != 0) {
        snprintf(err, errlen, "%s: not a megac tokenizer file (bad magic)", path);
        return NULL;
    }
    uint32_t version = rd_u32(r), kind = rd_u32(r), pretok = rd_u32(r), flags = version >= 2 ? rd_u32(r) : 0;
    int32_t nv = (int32_t)rd_u32(r), bos = (int32_t)rd_u32(r), eos = (int32_t)rd_u32(r);
    uint32_t nmerges = rd_u32(r);
    const char *bad = !r->ok                                   ? "the file ends inside it"
                      : version < 1 || version > TOK_VERSION   ? "the version is not one this runtime reads"
                      : flags & ~1u                            ? "unknown flag bits"
                      : kind < TOK_SPM || kind > TOK_BYTES     ? "the kind is unknown"
                      : pretok > PRETOK_QWEN2                  ? "the pre-tokenizer is unknown"
                      : nv <= 0 || nv > TOK_MAX_VOCAB          ? "the vocabulary size is out of range"
                      : nmerges > (uint32_t)(r->n / 8)         ? "more merges than the file has bytes for"
                                                               : NULL;
    if (bad) {
        snprintf(err, errlen, "%s: bad tokenizer header: %s (version %u, flags 0x%x, kind %u, pre-tokenizer %u, vocab %d, "
                 "merges %u)", path, bad, version, flags, kind, pretok, nv, nmerges);
        return NULL;
    }
    Tokenizer *t = tok_new((TokKind)kind, nv);
    if (!t) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    tok_set_pretok(t, (PreTokKind)pretok);
    tok_set_always_bos(t, flags & 1);
    tok_set_ids(t, bos, eos);
    bool ok = !tok_error(t) && tok_read_pieces(t, r, version) && tok_read_merges(t, r, nmerges);
    if (ok && version >= 3)
        ok = tok_read_chat(t, r);
    if (ok)
        tok_finish(t);
    if (ok && !tok_error(t) && r->at != r->n)
        tok_fail(t, "%zu bytes after its end", r->n - r->at);
    if (!ok || tok_error(t) || r->at != r->n) {
        snprintf(err, errlen, "%s: corrupt tokenizer file (at byte %zu of %zu)%s%s", path, r->at, r->n,
                 tok_error(t) ? ": " : "", tok_error(t) ? tok_error(t) : "");
        tok_free(t);
        return NULL;
    }
    return t;
}

Tokenizer *tok_load(const char *path, char *err, size_t errlen)
{
    size_t n = 0;
    unsigned char *buf = tok_slurp(path, &n, err, errlen);
    if (!buf)
        return NULL;
    Reader r = {buf, n, 0, true};
    Tokenizer *t = tok_parse(&r, path, err, errlen);
    free(buf);
    return t;
}

/* ---- llama2.c tokenizer.bin ---- */

/* i32 max_token_length, then per token { f32 score, i32 len, len bytes }.
 * max_token_length bounds every len; llama2.c sizes its merge buffer from
 * it (max_token_length * 2 + 3, an int), so -1 or 2^31-1 cannot be a real
 * file's. A piece is UTF-8 text: llama2.c's export writes SentencePiece's
 * pieces (bytes as the text <0xNN>) encoded as UTF-8. */
static bool llama2c_piece_check(const char *path, int id, float score, const unsigned char *b, int32_t len,
                                char *err, size_t errlen)
{
    char esc[96];
    if (!isfinite(score)) {
        snprintf(err, errlen, "%s: token %d has a non-finite score", path, id);
        return false;
    }
    if (!tok_utf8_valid((const char *)b, (size_t)len)) {
        tok_escape((const char *)b, (size_t)len, esc, sizeof esc);
        snprintf(err, errlen, "%s: token %d '%s' is not valid UTF-8 (a byte is the piece <0xNN>)", path, id, esc);
        return false;
    }
    return true;
}

Tokenizer *tok_load_llama2c(const char *path, int n_vocab, char *err, size_t errlen)
{
    size_t n = 0;
    unsigned char *buf = tok_slurp(path, &n, err, errlen);
    if (!buf)
        return NULL;
    Reader r = {buf, n, 0, true};
    int32_t maxlen = (int32_t)rd_u32(&r);
    if (r.ok && (maxlen <= 0 || maxlen > TOK_MAX_PIECE)) {
        snprintf(err, errlen, "%s: max_token_length %d is outside [1, %d]", path, maxlen, TOK_MAX_PIECE);
        free(buf);
        return NULL;
    }
    Tokenizer *t = r.ok ? tok_new(TOK_SPM, n_vocab) : NULL;
    bool bad_piece = false;
    for (int id = 0; t && id < n_vocab && r.ok && !bad_piece; id++) {
        float score = rd_f32(&r);
        int32_t len = (int32_t)rd_u32(&r);
        const unsigned char *b = len >= 0 && len <= maxlen ? rd_bytes(&r, (size_t)len) : NULL;
        if (!b)
            r.ok = false;
        else if (!llama2c_piece_check(path, id, score, b, len, err, errlen))
            bad_piece = true;
        else
            tok_set_piece(t, id, (const char *)b, (size_t)len, score);
    }
    if (bad_piece) {
        tok_free(t);
        free(buf);
        return NULL;
    }
    if (t && r.ok && n_vocab > 2)
        tok_set_ids(t, 1, 2);
    if (t && r.ok)
        tok_finish(t);
    if (!t || !r.ok || tok_error(t)) {
        snprintf(err, errlen, "%s: not a llama2.c tokenizer of %d tokens (truncated or bad length at byte %zu)",
                 path, n_vocab, r.at);
        tok_free(t);
        t = NULL;
    }
    free(buf);
    return t;
}

bool tok_always_bos(const Tokenizer *t)
{
    return t->always_bos;
}

bool tok_default_bos(const Tokenizer *t, const char *text)
{
    if (tok_bos(t) < 0)
        return false;
    /* a text that starts with the BOS token itself (Llama 3's chat format,
     * or a prompt typed so) gets no second one */
    if (text && *text && t->nspecials && special_at(t, text, strlen(text)) == t->bos)
        return false;
    return tok_kind(t) != TOK_BPE || t->always_bos || !text || !*text;
}
