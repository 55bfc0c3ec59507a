/*
 * test_tokenizer.c - the tokenizers against outside references:
 *   - llama2.c's tok512 (stories260K): encodings pinned from
 *     fixtures/tokenizer/llama2c_ref.py (a Python model of run.c), and the
 *     golden greedy run of ../shared/golden decoded and re-encoded;
 *   - HF tokenizers with SmolLM2's tokenizer.json: every string of
 *     fixtures/tokenizer/smollm2_golden.json encodes to the same ids and
 *     decodes back, also after a native-file round trip;
 *   - the GPT-2 and Llama-3 pre-tokenizer regexes against HF's Split
 *     (fixtures/tokenizer/pretok_golden.json);
 *   - the GGUF vocabulary of SmolLM2 (env MEGAC_SMOLLM2_GGUF) against the
 *     same goldens;
 * plus the byte tokenizer, bad native files, importer errors, and the
 * piece checks every SPM reader shares (bad texts, types and lengths).
 */
#include "compiler/compile.h"
#include "compiler/doc.h"
#include "gguf_patch.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARED MEGAC_SRC "/../shared"
#define TOK512 SHARED "/models/tok512.bin"
#define SMOL_JSON SHARED "/models/smollm2-tokenizer.json"
#define STORIES_GOLDEN SHARED "/golden/stories260K_greedy.json"
#define FIXTURES MEGAC_SRC "/tests/fixtures/tokenizer"

#define MAX_IDS 4096

static void need_file(const char *path)
{
    if (access(path, R_OK) != 0)
        cr_skip_test("%s is absent", path);
}

static Tokenizer *tok512(void)
{
    char err[512];
    need_file(TOK512);
    Tokenizer *t = tok_load_llama2c(TOK512, 512, err, sizeof err);
    cr_assert(t, "%s", err);
    return t;
}

/* Concatenated decode of ids[0..n), the first given `prev`. */
static char *decode_all(const Tokenizer *t, int prev, const int *ids, int n)
{
    size_t cap = 64 + (size_t)n * 64, len = 0;
    char *out = malloc(cap);
    for (int i = 0; i < n; i++) {
        int k = tok_decode(t, i ? ids[i - 1] : prev, ids[i], out + len, cap - len);
        cr_assert(k >= 0, "decode of id %d failed", ids[i]);
        len += (size_t)k;
    }
    out[len] = '\0';
    return out;
}

static void expect_ids(const Tokenizer *t, const char *text, bool bos, const int *want, int nwant)
{
    int ids[MAX_IDS];
    int n = tok_encode(t, text, bos, ids, MAX_IDS);
    cr_assert_eq(n, nwant, "'%s': %d ids, want %d", text, n, nwant);
    for (int i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i], "'%s': id[%d] = %d, want %d", text, i, ids[i], want[i]);
}

/* ---- bytes ---- */

Test(tokenizer, bytes)
{
    Tokenizer *t = tok_new_bytes();
    cr_assert(t);
    cr_assert_eq(tok_vocab(t), 259);
    cr_assert_eq(tok_bos(t), 1);
    cr_assert_eq(tok_eos(t), 2);
    const int want[] = {1, 3 + 'h', 3 + 'i', 3 + 0xC3, 3 + 0xA9};
    expect_ids(t, "hi\xC3\xA9", true, want, 5);
    char *s = decode_all(t, -1, want, 5);
    cr_assert_str_eq(s, "hi\xC3\xA9");
    free(s);
    int ids[2];
    cr_assert_eq(tok_encode(t, "abc", false, ids, 2), -1, "a too small buffer is refused");
    tok_free(t);
}

/* ---- SPM: llama2.c tok512 ---- */

Test(tokenizer, tok512_encode)
{
    Tokenizer *t = tok512();
    static const int once[] = {1, 403, 407, 261, 378};
    static const int lily[] = {1, 317, 439, 419, 357, 336, 432, 313, 440, 417, 436, 410, 485, 410, 233, 191, 165};
    static const int cat[] = {1, 291, 280, 294, 262, 294, 353, 265, 284, 294, 426};
    static const int tom[] = {1, 274, 287, 269, 301, 425, 411, 382, 276, 374, 419, 426, 342, 397, 355, 267, 337, 443};
    static const int xy[] = {1, 410, 444, 410, 348};
    static const int cjk[] = {1, 410, 233, 154, 168, 233, 159, 175, 410, 475, 479, 472};
    static const int empty[] = {1};
    expect_ids(t, "Once upon a time", true, once, 5);
    expect_ids(t, "Once upon a time", false, once + 1, 4);
    expect_ids(t, "Lily's mom said, \"Hi\" \xC3\xA9 \xE6\xBC\xA2", true, lily, sizeof lily / sizeof *lily);
    expect_ids(t, "The cat sat on the mat.", true, cat, sizeof cat / sizeof *cat);
    expect_ids(t, "Tom and Sue were friends. They liked to play!", true, tom, sizeof tom / sizeof *tom);
    expect_ids(t, "x  y", true, xy, 5);
    expect_ids(t, "\xE6\x97\xA5\xE6\x9C\xAC 123", true, cjk, sizeof cjk / sizeof *cjk);
    expect_ids(t, "", true, empty, 1);
    expect_ids(t, "", false, empty, 0);
    tok_free(t);
}

Test(tokenizer, tok512_decode_golden)
{
    Tokenizer *t = tok512();
    need_file(STORIES_GOLDEN);
    Diag d;
    diag_init(&d);
    Doc doc;
    cr_assert(doc_load(&doc, STORIES_GOLDEN, &d));
    const DocNode *ids = doc_get(doc.root, "greedy_token_ids"), *text = doc_get(doc.root, "decoded");
    cr_assert(ids && ids->kind == DOC_SEQ && text);
    int v[1024], n = ids->n;
    cr_assert(n > 1 && n <= 1024);
    for (int i = 0; i < n; i++) {
        int64_t x;
        cr_assert(doc_int(&doc, &d, ids->items[i], &x));
        v[i] = (int)x;
    }
    cr_assert_eq(v[0], tok_bos(t));
    char *s = decode_all(t, v[0], v + 1, n - 1);
    cr_assert_str_eq(s, text->str);
    free(s);
    /* and this text encodes back to the same 256 ids (llama2c_ref.py agrees) */
    expect_ids(t, text->str, true, v, n);
    doc_free(&doc);
    tok_free(t);
}

Test(tokenizer, spm_decode_rules)
{
    Tokenizer *t = tok512();
    char buf[16];
    size_t len;
    const char *p = tok_piece(t, 407, &len);
    cr_assert(p && len == 5 && memcmp(p, " upon", 5) == 0);
    cr_assert_eq(tok_decode(t, 1, 407, buf, sizeof buf), 4, "a leading space is dropped after BOS");
    cr_assert_str_eq(buf, "upon");
    cr_assert_eq(tok_decode(t, 403, 407, buf, sizeof buf), 5);
    cr_assert_eq(tok_decode(t, 0, 3 + 0x0A, buf, sizeof buf), 1, "<0x0A> is the byte");
    cr_assert_eq(buf[0], '\n');
    cr_assert_eq(tok_decode(t, 0, 512, buf, sizeof buf), -1, "an id out of range is refused");
    cr_assert_eq(tok_decode(t, 0, 407, buf, 3), -1, "a too small buffer is refused");
    tok_free(t);
}

/* ---- BPE: SmolLM2 tokenizer.json vs HF tokenizers ---- */

/* Checks every golden case; returns the number checked. */
static int check_bpe_golden(const Tokenizer *t)
{
    Diag d;
    diag_init(&d);
    Doc doc;
    cr_assert(doc_load(&doc, FIXTURES "/smollm2_golden.json", &d));
    const DocNode *cases = doc_get(doc.root, "cases");
    cr_assert(cases && cases->kind == DOC_SEQ && cases->n >= 60);
    static int want[MAX_IDS], got[MAX_IDS];
    for (int c = 0; c < cases->n; c++) {
        const DocNode *text = doc_get(cases->items[c], "text"), *ids = doc_get(cases->items[c], "ids");
        cr_assert(text && ids && ids->kind == DOC_SEQ && ids->n < MAX_IDS);
        for (int i = 0; i < ids->n; i++) {
            int64_t x;
            cr_assert(doc_int(&doc, &d, ids->items[i], &x));
            want[i] = (int)x;
        }
        int n = tok_encode(t, text->str, false, got, MAX_IDS);
        cr_assert_eq(n, ids->n, "case %d '%s': %d ids, HF has %d", c, text->str, n, ids->n);
        for (int i = 0; i < n; i++)
            cr_assert_eq(got[i], want[i], "case %d '%s': id[%d] = %d, HF has %d", c, text->str, i, got[i], want[i]);
        char *s = decode_all(t, -1, got, n);
        cr_assert_str_eq(s, text->str, "case %d: decode(encode(s)) != s", c);
        free(s);
    }
    int n = cases->n;
    doc_free(&doc);
    return n;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

static ModelDesc model_with_tok(TokFormat f, const char *path, int vocab)
{
    ModelDesc m;
    memset(&m, 0, sizeof m);
    m.path = "test.yaml";
    m.tok_format = f;
    m.tok_path = path;
    m.vocab_size = vocab;
    m.bos_id = m.eos_id = -1;
    return m;
}

Test(tokenizer, smollm2_json_golden)
{
    need_file(SMOL_JSON);
    ModelDesc m = model_with_tok(TOKFMT_HF, SMOL_JSON, 49152);
    m.bos_id = 1, m.eos_id = 2;
    Diag d;
    diag_init(&d);
    Tokenizer *t = tok_import(&m, &d);
    cr_assert(t, "import failed");
    cr_assert_eq(tok_kind(t), TOK_BPE);
    cr_assert_eq(tok_pretok(t), PRETOK_GPT2_DIGITS);
    cr_assert_eq(tok_vocab(t), 49152);
    cr_assert_eq(tok_nmerges(t), 48900);
    cr_assert(tok_is_special(t, 1) && !tok_is_special(t, 17));
    cr_assert_eq(check_bpe_golden(t), 76);

    /* the native file holds all of it */
    char path[] = "/tmp/megac_tok_XXXXXX", err[512];
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert(tok_save(t, path, err, sizeof err), "%s", err);
    Tokenizer *u = tok_load(path, err, sizeof err);
    unlink(path);
    cr_assert(u, "%s", err);
    cr_assert_eq(tok_bos(u), 1);
    cr_assert_eq(tok_eos(u), 2);
    cr_assert_eq(tok_nmerges(u), 48900);
    check_bpe_golden(u);
    tok_free(u);
    tok_free(t);
}

/* ---- pre-tokenizer regexes vs HF Split ---- */

static void check_splits(PreTokKind k, const char *key)
{
    Tokenizer *t = tok_new(TOK_BPE, 256);
    cr_assert(t);
    tok_set_pretok(t, k);
    tok_finish(t);
    Diag d;
    diag_init(&d);
    Doc doc;
    cr_assert(doc_load(&doc, FIXTURES "/pretok_golden.json", &d));
    const DocNode *cases = doc_get(doc.root, "cases");
    cr_assert(cases && cases->n > 60);
    size_t ends[1024];
    for (int c = 0; c < cases->n; c++) {
        const char *text = doc_get(cases->items[c], "text")->str;
        const DocNode *words = doc_get(cases->items[c], key);
        int n = tok_split(t, text, ends, 1024);
        cr_assert_eq(n, words->n, "%s case %d '%s': %d words, HF has %d", key, c, text, n, words->n);
        for (int i = 0; i < n; i++) {
            size_t start = i ? ends[i - 1] : 0;
            const DocNode *w = words->items[i];
            cr_assert(ends[i] - start == w->len && memcmp(text + start, w->str, w->len) == 0,
                      "%s case %d '%s': word %d is '%.*s', HF has '%s'", key, c, text, i, (int)(ends[i] - start),
                      text + start, w->str);
        }
    }
    doc_free(&doc);
    tok_free(t);
}

Test(tokenizer, pretok_gpt2_regex)
{
    check_splits(PRETOK_GPT2, "gpt2");
}

Test(tokenizer, pretok_llama3_regex)
{
    check_splits(PRETOK_LLAMA3, "llama3");
}

Test(tokenizer, pretok_qwen2_regex)
{
    check_splits(PRETOK_QWEN2, "qwen2");
}

/* A small tokenizer.json: "a b" merges, an added token, GPT-2 regex. */
Test(tokenizer, hf_small_json)
{
    static const char json[] =
        "{\"added_tokens\": [{\"id\": 7, \"content\": \"<|x|>\", \"special\": true}],\n"
        " \"normalizer\": null,\n"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true},\n"
        " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"\u0120\": 2, \"ab\": 3, \"\u0120ab\": 4,\n"
        "   \"c\": 5, \"\u010a\": 6}, \"merges\": [\"a b\", \"\u0120 ab\"]}}\n";
    char path[] = "/tmp/megac_toksmall_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    write_bytes(path, json, strlen(json));
    ModelDesc m = model_with_tok(TOKFMT_HF, path, 0);
    Diag d;
    diag_init(&d);
    Tokenizer *t = tok_import(&m, &d);
    unlink(path);
    cr_assert(t);
    cr_assert_eq(tok_vocab(t), 8);
    cr_assert_eq(tok_pretok(t), PRETOK_GPT2);
    size_t len;
    const char *p = tok_piece(t, 6, &len);
    cr_assert(p && len == 1 && p[0] == '\n', "U+010A is byte 0x0A");
    static const int want[] = {3, 4, 6, 7, 0, 2, 5};
    expect_ids(t, "ab ab\n<|x|>a c", false, want, 7);
    char *txt = decode_all(t, -1, want, 7);
    cr_assert_str_eq(txt, "ab ab\n<|x|>a c");
    free(txt);
    tok_free(t);
}

/* PRETOK_LLAMA3 takes a word that is a whole piece as is (ignore_merges);
 * the others build it from merges only. */
Test(tokenizer, llama3_whole_word)
{
    for (int k = 0; k < 2; k++) {
        Tokenizer *t = tok_new(TOK_BPE, 257);
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            tok_set_piece(t, b, &c, 1, 0.0f);
        }
        tok_set_piece(t, 256, "hello", 5, 0.0f);
        tok_set_pretok(t, k ? PRETOK_LLAMA3 : PRETOK_GPT2);
        tok_finish(t);
        cr_assert_null(tok_error(t));
        int ids[8];
        int n = tok_encode(t, "hello", false, ids, 8);
        cr_assert_eq(n, k ? 1 : 5);
        cr_assert_eq(ids[0], k ? 256 : 'h');
        tok_free(t);
    }
}

/* Characters without a piece or byte token are dropped and counted, for
 * SPM and BPE alike: the count, the first one's code point and offset; a
 * byte that is not UTF-8 (strictly: no overlong forms, surrogates or code
 * points past U+10FFFF) is reported as -1 at its offset. */
Test(tokenizer, dropped_characters_are_counted)
{
    for (int k = 0; k < 2; k++) {
        Tokenizer *t = tok_new(k ? TOK_BPE : TOK_SPM, 3);
        tok_set_piece(t, 0, "a", 1, 0.0f);
        tok_set_piece(t, 1, "b", 1, 0.0f);
        tok_set_piece(t, 2, "\xc3\xa9", 2, 0.0f);      /* BPE: no single bytes, so é is lost too */
        tok_finish(t);
        cr_assert_null(tok_error(t));
        int ids[16];
        TokDrops d;
        int n = tok_encode_drops(t, "ab\xe2\x82\xac\xc3\xa9" "ba", false, ids, 16, &d);
        cr_assert_eq(n, k ? 4 : 5, "kind %d: %d ids", k, n);
        cr_assert_eq(d.n, k ? 2 : 1, "kind %d: %d dropped", k, d.n);
        cr_assert_eq(d.first, 0x20AC);
        cr_assert_eq(d.first_at, 2);
        n = tok_encode_drops(t, "ab\xff", false, ids, 16, &d);
        cr_assert(n == 2 && d.n == 1 && d.first == -1 && d.first_at == 2, "kind %d: %d ids, %d dropped, %d at %zu", k,
                  n, d.n, d.first, d.first_at);
        /* an overlong form, a code point past U+10FFFF: not UTF-8 (they
         * were reported as '/' and U+1FFFFF) */
        static const char *const not_utf8[] = {"ab\xc0\xaf", "ab\xc1\xbf", "ab\xf5\x80\x80\x80",
                                               "ab\xf7\xbf\xbf\xbf", "ab\xed\xa0\x80"};
        for (int i = 0; i < 5; i++) {
            n = tok_encode_drops(t, not_utf8[i], false, ids, 16, &d);
            cr_assert(n == 2 && d.n >= 1 && d.first == -1 && d.first_at == 2, "kind %d, case %d: %d ids, %d dropped, "
                      "first %d at %zu", k, i, n, d.n, d.first, d.first_at);
        }
        n = tok_encode_drops(t, "abba", false, ids, 16, &d);
        cr_assert(n == 4 && d.n == 0, "kind %d", k);
        tok_free(t);
    }
}

/* ---- GGUF vocabulary ---- */

Test(tokenizer, smollm2_gguf_golden)
{
    const char *path = getenv("MEGAC_SMOLLM2_GGUF");
    if (!path || !*path)
        cr_skip_test("MEGAC_SMOLLM2_GGUF is not set");
    ModelDesc m = model_with_tok(TOKFMT_GGUF, path, 49152);
    Diag d;
    diag_init(&d);
    Tokenizer *t = tok_import(&m, &d);
    cr_assert(t, "import failed");
    cr_assert_eq(tok_kind(t), TOK_BPE);
    cr_assert_eq(tok_pretok(t), PRETOK_GPT2_DIGITS);
    cr_assert_eq(tok_bos(t), 1);
    cr_assert_eq(tok_eos(t), 2);
    check_bpe_golden(t);
    tok_free(t);
}

/* tok512 as a GGUF "llama" vocabulary (fixtures/tokenizer/make_gguf.py)
 * encodes as llama2.c's file does; control tokens are matched verbatim. */
Test(tokenizer, gguf_spm_matches_llama2c)
{
    Tokenizer *ref = tok512();
    ModelDesc m = model_with_tok(TOKFMT_GGUF, FIXTURES "/tok512_spm.gguf", 512);
    Diag d;
    diag_init(&d);
    Tokenizer *t = tok_import(&m, &d);
    cr_assert(t, "import failed");
    cr_assert_eq(tok_kind(t), TOK_SPM);
    cr_assert_eq(tok_bos(t), 1);
    cr_assert_eq(tok_eos(t), 2);
    static const char *const texts[] = {
        "Once upon a time", "Lily's mom said, \"Hi\" \xC3\xA9 \xE6\xBC\xA2", "x  y", "", "The cat sat.\nThe end.",
    };
    int a[MAX_IDS], b[MAX_IDS];
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int na = tok_encode(ref, texts[i], true, a, MAX_IDS);
        cr_assert(na > 0);
        expect_ids(t, texts[i], true, a, na);
        char *s1 = decode_all(ref, a[0], a + 1, na - 1), *s2 = decode_all(t, a[0], a + 1, na - 1);
        cr_assert_str_eq(s1, s2);
        free(s1);
        free(s2);
    }
    int na = tok_encode(ref, "Hi", false, a, MAX_IDS);
    int nb = tok_encode(t, "<s>Hi</s>", false, b, MAX_IDS);
    cr_assert(na > 0 && nb == na + 2 && b[0] == 1 && b[nb - 1] == 2 && memcmp(a, b + 1, (size_t)na * sizeof *a) == 0,
              "<s> and </s> are control tokens, and the text between gets the dummy prefix");
    tok_free(t);
    tok_free(ref);
}

/* ---- bad files and importer errors ---- */

Test(tokenizer, native_bad_files)
{
    Tokenizer *t = tok512();
    char path[] = "/tmp/megac_tokbad_XXXXXX", err[512];
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert(tok_save(t, path, err, sizeof err), "%s", err);
    size_t n;
    char *good = read_file(path, &n);
    cr_assert(good && n > 1000);
    Tokenizer *u = tok_load(path, err, sizeof err);
    cr_assert(u, "%s", err);
    expect_ids(u, "Once upon a time", true, (const int[]){1, 403, 407, 261, 378}, 5);
    tok_free(u);
    for (size_t cut = 0; cut < n; cut += 1 + cut / 8) {   /* every truncation fails cleanly */
        write_bytes(path, good, cut);
        err[0] = '\0';
        cr_assert_null(tok_load(path, err, sizeof err), "a file cut at %zu bytes loads", cut);
        cr_assert(strstr(err, path), "the error names the file: %s", err);
    }
    for (size_t i = 0; i < n; i += 1 + i / 16) {     /* flipped bytes: loads or fails, never crashes */
        char saved = good[i];
        good[i] = (char)(saved ^ 0xA5);
        write_bytes(path, good, n);
        u = tok_load(path, err, sizeof err);
        cr_assert(u || strstr(err, path), "%s", err);
        tok_free(u);
        good[i] = saved;
    }
    good[39] = (char)0x7f;  /* the first piece's length (bytes 36-39, after the header) becomes huge */
    write_bytes(path, good, n);
    cr_assert_null(tok_load(path, err, sizeof err));
    good[0] = 'X';
    write_bytes(path, good, n);
    cr_assert_null(tok_load(path, err, sizeof err));
    cr_assert(strstr(err, "bad magic"), "%s", err);
    unlink(path);
    cr_assert_null(tok_load(path, err, sizeof err));
    cr_assert(strstr(err, path), "%s", err);
    free(good);
    tok_free(t);
}

/* Runs tok_import on n bytes at p written to a temporary file (its name
 * left in path, 32 bytes) as a tokenizer of format f: the tokenizer, what
 * it printed (*out, malloc'd) and its error count. */
static Tokenizer *import_capture(TokFormat f, const void *p, size_t n, int vocab, char *path, char **out, int *nerr)
{
    strcpy(path, "/tmp/megac_tokimp_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    write_bytes(path, p, n);
    ModelDesc m = model_with_tok(f, path, vocab);
    Diag d;
    diag_init(&d);
    size_t len = 0;
    *out = NULL;
    d.out = open_memstream(out, &len);
    cr_assert(d.out);
    Tokenizer *t = tok_import(&m, &d);
    fclose(d.out);
    unlink(path);
    *nerr = d.nerrors;
    return t;
}

/* The same where the import must fail, with exactly `nerrors` errors (any
 * number when 0); returns what it printed. */
static char *import_errors(TokFormat f, const void *p, size_t n, int vocab, char *path, int nerrors)
{
    char *out;
    int nerr;
    cr_assert_null(import_capture(f, p, n, vocab, path, &out, &nerr), "a bad tokenizer was accepted");
    cr_assert(nerrors ? nerr == nerrors : nerr > 0, "%s", out);
    return out;
}

/* Runs tok_import on a JSON text; returns what it printed. */
static char *import_json_errors(const char *json)
{
    char path[32];
    return import_errors(TOKFMT_HF, json, strlen(json), 0, path, 0);
}

Test(tokenizer, hf_import_errors)
{
    char *e = import_json_errors("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}\n");
    cr_assert(strstr(e, ":1:11: error: only BPE tokenizer models are supported yet"), "%s", e);
    free(e);
    e = import_json_errors("{\"normalizer\": {\"type\": \"NFC\"},\n"
                           " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},\n"
                           " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}\n");
    cr_assert(strstr(e, ":1:16: error: normalizers are not supported yet"), "%s", e);
    free(e);
    e = import_json_errors("{\"pre_tokenizer\": {\"type\": \"Whitespace\"},\n"
                           " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}\n");
    cr_assert(strstr(e, ":1:19: error: pre-tokenizer not supported yet"), "%s", e);
    free(e);
    e = import_json_errors("{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},\n"
                           " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}\n");
    cr_assert(strstr(e, ":2:65: error: bad merge"), "%s", e);
    free(e);
    /* not a tokenizer.json; duplicate and missing ids are said as such */
    e = import_json_errors("[1]\n");
    cr_assert(strstr(e, ":1:1: error: not a tokenizer.json (no 'model')"), "%s", e);
    free(e);
    e = import_json_errors("{\"version\": \"1.0\"}\n");
    cr_assert(strstr(e, ":1:1: error: not a tokenizer.json (no 'model')"), "%s", e);
    free(e);
    e = import_json_errors("{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},\n"
                           " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": [\"a b\"]}}\n");
    cr_assert(strstr(e, ":2:50: error: vocab id 0 is given to two pieces"), "%s", e);
    free(e);
    e = import_json_errors("{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},\n"
                           " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2}, \"merges\": [\"a b\"]}}\n");
    cr_assert(strstr(e, "error: no vocab piece or added token has id 1 (the ids run to 2)"), "%s", e);
    free(e);
    /* ids are decimal, as JSON writes them: 010 was read as 8 (octal), 0x1 as 1 */
    static const char *const ids[] = {"010", "0x1", "-0x1"};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
        char json[512], want[64];
        snprintf(json, sizeof json, "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},\n"
                 " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": %s}, \"merges\": []}}\n", ids[i]);
        snprintf(want, sizeof want, ":2:50: error: expected a decimal integer, found '%s'", ids[i]);
        e = import_json_errors(json);
        cr_assert(strstr(e, want), "%s", e);
        free(e);
    }
}

/* The weights' GGUF fixture has tokens and scores but no token types
 * (optional, as in llama.cpp); a GGUF without a vocabulary is one error. */
Test(tokenizer, gguf_minimal_and_without_vocab)
{
    const char *path = MEGAC_SRC "/tests/fixtures/weights/tiny.gguf";
    need_file(path);
    ModelDesc m = model_with_tok(TOKFMT_GGUF, path, 0);
    Diag d;
    diag_init(&d);
    Tokenizer *t = tok_import(&m, &d);
    cr_assert(t);
    cr_assert_eq(tok_kind(t), TOK_SPM);
    cr_assert_eq(tok_vocab(t), 32);
    cr_assert_eq(tok_bos(t), 1);
    tok_free(t);

    static const unsigned char empty[24] = {'G', 'G', 'U', 'F', 3};  /* v3, no tensors, no keys */
    char tmp[] = "/tmp/megac_tokgguf_XXXXXX";
    int fd = mkstemp(tmp);
    cr_assert(fd >= 0);
    close(fd);
    write_bytes(tmp, empty, sizeof empty);
    m = model_with_tok(TOKFMT_GGUF, tmp, 0);
    char *out = NULL;
    size_t len = 0;
    d.out = open_memstream(&out, &len);
    cr_assert(d.out);
    cr_assert_null(tok_import(&m, &d));
    fclose(d.out);
    unlink(tmp);
    cr_assert_eq(d.nerrors, 1);
    cr_assert(strstr(out, ": error: no tokenizer.ggml.model"), "%s", out);
    free(out);
}

Test(tokenizer, import_llama2c_and_bytes)
{
    need_file(TOK512);
    Diag d;
    diag_init(&d);
    ModelDesc m = model_with_tok(TOKFMT_LLAMA2C, TOK512, 512);
    Tokenizer *t = tok_import(&m, &d);
    cr_assert(t);
    cr_assert_eq(tok_kind(t), TOK_SPM);
    cr_assert_eq(tok_bos(t), 1);
    tok_free(t);
    m = model_with_tok(TOKFMT_LLAMA2C, TOK512, 100000);   /* more tokens than the file holds */
    char *out = NULL;
    size_t len = 0;
    d.out = open_memstream(&out, &len);
    cr_assert_null(tok_import(&m, &d));
    fclose(d.out);
    cr_assert(strstr(out, "tok512.bin") && strstr(out, "error"), "%s", out);
    free(out);
    m = model_with_tok(TOKFMT_LLAMA2C, TOK512, 300);      /* fewer: imported, with a warning */
    d.out = open_memstream(&out, &len);
    t = tok_import(&m, &d);
    fclose(d.out);
    cr_assert(t && tok_vocab(t) == 300);
    tok_free(t);
    cr_assert(strstr(out, "tok512.bin: warning: the file holds 512 tokens; the model's vocab_size is 300, so only the "
                          "first 300 are used"), "%s", out);
    free(out);
    m = model_with_tok(TOKFMT_BYTES, NULL, 259);
    d.out = stderr;
    t = tok_import(&m, &d);
    cr_assert(t && tok_kind(t) == TOK_BYTES);
    tok_free(t);
}

/* Writes `n` bytes of `p` to a fresh temporary file (its name left in
 * path[32]), imports it as a tokenizer of format `f`, expects failure and
 * returns what was printed. */
static char *import_bytes_errors(TokFormat f, const void *p, size_t n, int vocab, char *path)
{
    return import_errors(f, p, n, vocab, path, 1);
}

/* A NaN score in a llama2.c tokenizer is refused at import (run would refuse
 * the bundle later), and the file is named once. */
Test(tokenizer, llama2c_nan_score)
{
    need_file(TOK512);
    size_t n;
    char *b = read_file(TOK512, &n);
    cr_assert(b && n > 8);
    float nan = NAN, score;
    memcpy(&score, b + 4, 4);
    memcpy(b + 4, &nan, 4);     /* token 0's score */
    char path[32], want[128];
    char *e = import_bytes_errors(TOKFMT_LLAMA2C, b, n, 512, path);
    snprintf(want, sizeof want, "%s: error: token 0 has a non-finite score\n", path);
    cr_assert_str_eq(e, want);
    free(e);
    memcpy(b + 4, &score, 4);   /* a truncated file: the other errors name the file once too */
    e = import_bytes_errors(TOKFMT_LLAMA2C, b, 100, 512, path);
    snprintf(want, sizeof want, "%s: error: not a llama2.c", path);
    cr_assert(strstr(e, want) == e && !strstr(e + strlen(path), path), "%s", e);
    free(e);
    free(b);
}

/* tok512_spm.gguf with one u32 key's value replaced. */
static char *gguf_with_u32(const char *key, uint32_t v, size_t *n)
{
    need_file(FIXTURES "/tok512_spm.gguf");
    char *b = read_file(FIXTURES "/tok512_spm.gguf", n);
    cr_assert(b);
    char *k = memmem(b, *n, key, strlen(key));
    cr_assert(k, "%s is not in the fixture", key);
    uint32_t type;
    memcpy(&type, k + strlen(key), 4);
    cr_assert_eq(type, 4, "%s is not a u32", key);
    memcpy(k + strlen(key) + 4, &v, 4);
    return b;
}

/* tok_import of a file that must fail; what it printed into buf. */
static void import_path_fails(TokFormat f, const char *path, int vocab, char *buf, size_t cap)
{
    ModelDesc m = model_with_tok(f, path, vocab);
    memset(buf, 0, cap);
    FILE *out = fmemopen(buf, cap - 1, "w");
    Diag d;
    diag_init(&d);
    d.out = out;
    cr_assert_null(tok_import(&m, &d), "%s was accepted", path);
    fclose(out);
}

/* A device named as tokenizer.json is refused as one, not read without
 * end (it said "No such device"). */
Test(tokenizer, hf_tokenizer_path_a_device)
{
    char buf[1024];
    import_path_fails(TOKFMT_HF, "/dev/zero", 0, buf, sizeof buf);
    cr_assert(strstr(buf, "/dev/zero: error: cannot read file: not a regular file (a device)"), "%s", buf);
}

/* A GGUF tokenizer array of another element type says which it is and
 * which it must be (it read "missing, not an array of the expected type,
 * or of the wrong length"). */
Test(tokenizer, gguf_array_of_another_type)
{
    size_t n;
    need_file(FIXTURES "/tok512_spm.gguf");
    char *b = read_file(FIXTURES "/tok512_spm.gguf", &n), path[32], want[200];
    cr_assert(b);
    size_t at = test_gguf_kv_at((const unsigned char *)b, n, "tokenizer.ggml.token_type");
    uint32_t t, u32 = 4;
    memcpy(&t, b + at + 4, 4);
    cr_assert_eq(t, 5, "token_type is an array of int32");
    memcpy(b + at + 4, &u32, 4);    /* the same bytes, as uint32 */
    char *e = import_bytes_errors(TOKFMT_GGUF, b, n, 512, path);
    snprintf(want, sizeof want, "%s: error: key 'tokenizer.ggml.token_type' must be an array of int32, not an array "
             "of uint32\n", path);
    cr_assert_str_eq(e, want);
    free(e);
    free(b);
}

/* GGUF bos/eos ids outside the vocabulary are refused, naming the key, as
 * YAML bos: and HF bos_token_id are. */
Test(tokenizer, gguf_ids_out_of_range)
{
    size_t n;
    char path[32], want[160];
    char *b = gguf_with_u32("tokenizer.ggml.bos_token_id", 99999999, &n);
    char *e = import_bytes_errors(TOKFMT_GGUF, b, n, 512, path);
    snprintf(want, sizeof want, "%s: error: tokenizer.ggml.bos_token_id 99999999 is outside the vocabulary (512)\n",
             path);
    cr_assert_str_eq(e, want);
    free(e);
    free(b);
    b = gguf_with_u32("tokenizer.ggml.eos_token_id", 512, &n);
    e = import_bytes_errors(TOKFMT_GGUF, b, n, 512, path);
    snprintf(want, sizeof want, "%s: error: tokenizer.ggml.eos_token_id 512 is outside the vocabulary (512)\n", path);
    cr_assert_str_eq(e, want);
    free(e);
    free(b);
}

/* A BPE GGUF without tokenizer.ggml.pre says so (llama.cpp would split
 * with its 'default' pre-tokenizer), where it named a 'default' value the
 * file does not hold; a piece too long or out of range says which limit. */
Test(tokenizer, gguf_bpe_without_pre_and_piece_limits)
{
    const char *src = MEGAC_SRC "/tests/fixtures/weights/qwen2.gguf";
    need_file(src);
    size_t n;
    char *b = read_file(src, &n);
    cr_assert(b);
    char *k = memmem(b, n, "tokenizer.ggml.pre", 18);
    cr_assert(k);
    k[17] = 'x'; /* the key becomes tokenizer.ggml.prx */
    char path[32], want[320];
    char *e = import_bytes_errors(TOKFMT_GGUF, b, n, 0, path);
    snprintf(want, sizeof want, "%s: error: a BPE vocabulary without tokenizer.ggml.pre (llama.cpp then splits text "
             "with its 'default' pre-tokenizer, which megac does not have yet", path);
    cr_assert(strstr(e, want) == e, "%s", e);
    free(e);
    free(b);

    Tokenizer *t = tok_new(TOK_BPE, 4);
    cr_assert(t);
    static char big[(1 << 16) + 1];
    tok_set_piece(t, 2, big, sizeof big, 0);
    cr_assert_str_eq(tok_error(t), "piece 2 is 65537 bytes long, more than the 65536 bytes a piece may have");
    tok_free(t);
    t = tok_new(TOK_BPE, 4);
    tok_set_piece(t, 4, "a", 1, 0);
    cr_assert_str_eq(tok_error(t), "piece 4 is out of range [0, 4)");
    tok_free(t);
}

/* A FIFO in place of a bundle's tokenizer.bin is refused at once (opening
 * it waited for a writer). */
Test(tokenizer, native_fifo_refused, .timeout = 30)
{
    char dir[] = "/tmp/megac_tokfifo_XXXXXX", path[64], err[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    cr_assert_null(tok_load(path, err, sizeof err));
    cr_assert(strstr(err, "not a regular file"), "%s", err);
    unlink(path);
    rmdir(dir);
}

/* The native file keeps stop marks and always-BOS (version 2) and the
 * chat format (version 3), and version 1 and 2 files (no flags word, no
 * chat format; written by megac before them) still load. */
Test(tokenizer, native_flags_and_version_1)
{
    Tokenizer *t = tok512();
    tok_set_stop(t, 5);
    tok_set_always_bos(t, true);
    tok_set_chat(t, CHAT_CHATML, "Be kind.");
    char path[] = "/tmp/megac_tokv_XXXXXX", err[512];
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert(tok_save(t, path, err, sizeof err), "%s", err);
    Tokenizer *u = tok_load(path, err, sizeof err);
    cr_assert(u, "%s", err);
    cr_assert(tok_is_stop(u, 5) && tok_is_stop(u, tok_eos(u)) && !tok_is_stop(u, 6) && !tok_is_stop(u, -1));
    cr_assert(tok_always_bos(u));
    const char *sys;
    cr_assert_eq(tok_chat(u, &sys), CHAT_CHATML);
    cr_assert_str_eq(sys, "Be kind.");
    tok_free(u);
    /* the last kind, with its text (Llama 3.1's preamble) */
    tok_set_chat(t, CHAT_LLAMA31_TODAY, "Cutting Knowledge Date: December 2023\n");
    cr_assert(tok_save(t, path, err, sizeof err), "%s", err);
    u = tok_load(path, err, sizeof err);
    cr_assert(u, "%s", err);
    cr_assert_eq(tok_chat(u, &sys), CHAT_LLAMA31_TODAY);
    cr_assert_str_eq(sys, "Cutting Knowledge Date: December 2023\n");
    tok_free(u);
    tok_free(t);

    t = tok512();
    cr_assert(tok_save(t, path, err, sizeof err), "%s", err);
    size_t n;
    char *v2 = read_file(path, &n);
    cr_assert(v2 && n > 28 && v2[4] == 3 && v2[16] == 0, "version 3, flags 0");
    /* version 3's chat format: a kind megac does not know, or a system
     * turn that is not text, is refused */
    static const struct {
        uint32_t kind, len;     /* as the file says */
        const char *sys;
        size_t have;            /* bytes of it the file holds */
        const char *why;
    } bad[] = {{9, 0, "", 0, "chat format 9 is unknown"},
               {CHAT_KINDS, 0, "", 0, "is unknown"},
               {1, 2, "a\0", 2, "the chat system turn is not UTF-8 text"},
               {1, 1, "\xff", 1, "the chat system turn is not UTF-8 text"},
               {1, 4, "ab", 2, "the file ends inside the chat system turn"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *b = malloc(n + 4);
        memcpy(b, v2, n - 8);
        memcpy(b + n - 8, &bad[i].kind, 4);
        memcpy(b + n - 4, &bad[i].len, 4);
        memcpy(b + n, bad[i].sys, bad[i].have);
        write_bytes(path, b, n + bad[i].have);
        cr_assert_null(tok_load(path, err, sizeof err), "case %zu", i);
        cr_assert(strstr(err, "corrupt tokenizer file") && strstr(err, bad[i].why), "%s", err);
        free(b);
    }
    /* the reason, not only where: bytes past the end, a header field */
    char *b = malloc(n + 3);
    memcpy(b, v2, n);
    memcpy(b + n, "xyz", 3);
    write_bytes(path, b, n + 3);
    cr_assert_null(tok_load(path, err, sizeof err));
    cr_assert(strstr(err, "corrupt tokenizer file (at byte ") && strstr(err, "): 3 bytes after its end"), "%s", err);
    memcpy(b, v2, n);
    b[12] = 9;      /* the pre-tokenizer */
    write_bytes(path, b, n);
    cr_assert_null(tok_load(path, err, sizeof err));
    cr_assert(strstr(err, "bad tokenizer header: the pre-tokenizer is unknown (version 3, flags 0x0, kind 1, "
                          "pre-tokenizer 9,"), "%s", err);
    free(b);
    n -= 8;         /* version 2: no chat format */
    v2[4] = 2;
    write_bytes(path, v2, n);
    u = tok_load(path, err, sizeof err);
    cr_assert(u, "a version 2 file: %s", err);
    cr_assert_eq(tok_chat(u, &sys), CHAT_UNKNOWN);
    cr_assert_null(sys);
    tok_free(u);
    char *v1 = malloc(n);
    memcpy(v1, v2, 16);
    memcpy(v1 + 16, v2 + 20, n - 20);
    v1[4] = 1;
    write_bytes(path, v1, n - 4);
    u = tok_load(path, err, sizeof err);
    cr_assert(u, "a version 1 file: %s", err);
    expect_ids(u, "Once upon a time", true, (const int[]){1, 403, 407, 261, 378}, 5);
    cr_assert(!tok_always_bos(u) && !tok_is_stop(u, 5));
    tok_free(u);
    v1[40] = 2;     /* the first piece's flags (after the 32-byte header, len, score): a stop mark */
    write_bytes(path, v1, n - 4);
    cr_assert_null(tok_load(path, err, sizeof err), "version 1 has no stop marks");
    unlink(path);
    free(v1);
    free(v2);
    tok_free(t);
}

/* An SPM vocabulary whose source adds no dummy prefix would be encoded
 * wrong (megac's SPM always adds it): refused, naming the key. */
Test(tokenizer, gguf_spm_without_dummy_prefix_refused)
{
    const char *path = MEGAC_SRC "/tests/fixtures/weights/bad-spm-prefix.gguf";
    need_file(path);
    char buf[1024];
    import_path_fails(TOKFMT_GGUF, path, 4, buf, sizeof buf);
    cr_assert(strstr(buf, "bad-spm-prefix.gguf: error: an SPM vocabulary without its dummy prefix "
                          "(tokenizer.ggml.add_space_prefix false) is not supported yet"), "%s", buf);
}

/* ---- piece checks: bad texts, types and lengths name the file and the token ---- */

Test(tokenizer, piece_check_rules)
{
    static const struct { const char *s; bool ok; } utf8[] = {
        {"", true}, {"a b", true}, {"\xE2\x96\x81the", true}, {"\xF0\x9F\x98\x8A", true}, {"\xF4\x8F\xBF\xBF", true},
        {"\xFF", false}, {"\xC0\xAF", false}, {"\xE0\x80\xAF", false}, {"\xED\xA0\x80", false},
        {"\xF4\x90\x80\x80", false}, {"\xE2\x96", false}, {"a\x80", false},
    };
    for (size_t i = 0; i < sizeof utf8 / sizeof *utf8; i++)
        cr_assert_eq(tok_utf8_valid(utf8[i].s, strlen(utf8[i].s)), utf8[i].ok, "case %zu", i);
    cr_assert(tok_byte_piece("<0x0A>", 6) && tok_byte_piece("<0xFF>", 6));
    cr_assert(!tok_byte_piece("<0x0a>", 6) && !tok_byte_piece("<0x0G>", 6) && !tok_byte_piece("<0x0A", 5) &&
              !tok_byte_piece("<0x0A>>", 7));
    char buf[16];
    cr_assert_eq(tok_escape("a'\\\xff\n", 5, buf, sizeof buf), 13);
    cr_assert_str_eq(buf, "a\\'\\\\\\xff\\x0a");
    tok_escape("0123456789abcdef", 16, buf, sizeof buf);
    cr_assert_str_eq(buf, "0123456789ab...");
}

/* b[0..*n) (freed) with `cut` bytes at `at` replaced by p[0..np). */
static char *splice(char *b, size_t *n, size_t at, size_t cut, const void *p, size_t np)
{
    char *out = malloc(*n - cut + np);
    cr_assert(out);
    memcpy(out, b, at);
    memcpy(out + at, p, np);
    memcpy(out + at + np, b + at + cut, *n - at - cut);
    *n = *n - cut + np;
    free(b);
    return out;
}

/* Offset of token i's record (f32 score, i32 len, bytes) in a llama2.c
 * tokenizer file. */
static size_t llama2c_token_at(const char *b, int i)
{
    size_t at = 4;
    for (int k = 0; k < i; k++) {
        int32_t len;
        memcpy(&len, b + at + 4, 4);
        at += 8 + (size_t)len;
    }
    return at;
}

/* A llama2.c piece that is not UTF-8 (byte pieces are the text <0xNN>)
 * and a max_token_length llama2.c could not size its buffer from are
 * errors naming the file (and the token). */
Test(tokenizer, llama2c_bad_piece_and_max_length)
{
    need_file(TOK512);
    size_t n;
    char *b = read_file(TOK512, &n);
    cr_assert(b && n > 8);
    size_t at = llama2c_token_at(b, 300);
    int32_t len;
    memcpy(&len, b + at + 4, 4);
    char rec[10];
    memcpy(rec, b + at, 4);     /* its score */
    memcpy(rec + 4, &(int32_t){2}, 4);
    memcpy(rec + 8, "a\xff", 2);
    size_t nbad = n;
    char *bad = malloc(n);
    memcpy(bad, b, n);
    bad = splice(bad, &nbad, at, 8 + (size_t)len, rec, sizeof rec);
    char path[32], want[256];
    char *e = import_bytes_errors(TOKFMT_LLAMA2C, bad, nbad, 512, path);
    snprintf(want, sizeof want, "%s: error: token 300 'a\\xff' is not valid UTF-8 (a byte is the piece <0xNN>)\n", path);
    cr_assert_str_eq(e, want);
    free(e);
    free(bad);
    static const int32_t maxlens[] = {0, -1, INT32_MAX, (1 << 16) + 1};
    for (size_t i = 0; i < sizeof maxlens / sizeof *maxlens; i++) {
        memcpy(b, &maxlens[i], 4);
        e = import_bytes_errors(TOKFMT_LLAMA2C, b, n, 512, path);
        snprintf(want, sizeof want, "%s: error: max_token_length %d is outside [1, 65536]\n", path, maxlens[i]);
        cr_assert_str_eq(e, want);
        free(e);
    }
    free(b);
}

/* A native SPM piece that is not UTF-8 is refused on load, naming the
 * file and the piece, as the importers refuse one (BPE pieces are raw
 * bytes and may split a character). */
Test(tokenizer, native_spm_piece_not_utf8)
{
    char path[] = "/tmp/megac_tokutf_XXXXXX", err[512], want[512];
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    Tokenizer *t = tok_new(TOK_SPM, 8);
    for (int id = 0; id < 8; id++)
        tok_set_piece(t, id, id == 5 ? "a\xff" : "abcdefgh" + id, id == 5 ? 2 : 1, 0.0f);
    cr_assert(tok_save(t, path, err, sizeof err), "%s", err);
    cr_assert_null(tok_load(path, err, sizeof err));
    snprintf(want, sizeof want, "%s: corrupt tokenizer file (at byte ", path);
    cr_assert(strstr(err, want) == err && strstr(err, "): piece 5 'a\\xff' is not valid UTF-8"), "%s", err);
    tok_free(t);
    t = tok_new(TOK_BPE, 2);
    tok_set_piece(t, 0, "\xe2", 1, 0.0f);
    tok_set_piece(t, 1, "\x96", 1, 0.0f);
    cr_assert(tok_save(t, path, err, sizeof err), "%s", err);
    Tokenizer *u = tok_load(path, err, sizeof err);
    cr_assert(u, "%s", err);
    tok_free(u);
    tok_free(t);
    unlink(path);
}

/* Offset of token i's record (u64 len, bytes) in tokenizer.ggml.tokens. */
static size_t gguf_token_at(const char *b, size_t n, uint64_t i)
{
    size_t at = test_gguf_kv_at((const unsigned char *)b, n, "tokenizer.ggml.tokens") + 16;
    for (uint64_t k = 0; k < i; k++) {
        uint64_t len;
        memcpy(&len, b + at, 8);
        at += 8 + len;
    }
    return at;
}

/* tok512_spm.gguf with token i's text replaced by s (length len). */
static char *gguf_with_token(char *b, size_t *n, uint64_t i, const char *s, uint64_t len)
{
    size_t at = gguf_token_at(b, *n, i);
    uint64_t old;
    memcpy(&old, b + at, 8);
    char rec[64];
    cr_assert(len <= sizeof rec - 8);
    memcpy(rec, &len, 8);
    memcpy(rec + 8, s, len);
    return splice(b, n, at, 8 + old, rec, 8 + len);
}

static char *tok512_gguf(size_t *n)
{
    need_file(FIXTURES "/tok512_spm.gguf");
    char *b = read_file(FIXTURES "/tok512_spm.gguf", n);
    cr_assert(b);
    return b;
}

/* Imports a GGUF vocabulary that must fail; the one error must be
 * "<tmpfile>: error: <want>\n". */
static void expect_gguf_error(const char *b, size_t n, const char *want)
{
    char path[32], full[512];
    char *e = import_bytes_errors(TOKFMT_GGUF, b, n, 512, path);
    snprintf(full, sizeof full, "%s: error: %s\n", path, want);
    cr_assert_str_eq(e, full);
    free(e);
}

/* An SPM GGUF token that is not UTF-8, a byte token that is not <0xNN>,
 * and a token type outside llama.cpp's enum are errors naming the file,
 * the key and the index (they had loaded and decoded garbage). */
Test(tokenizer, gguf_spm_bad_tokens)
{
    size_t n;
    char *b = gguf_with_token(tok512_gguf(&n), &n, 300, "a\xff", 2);
    expect_gguf_error(b, n, "tokenizer.ggml.tokens[300] 'a\\xff' is not valid UTF-8");
    free(b);
    b = gguf_with_token(tok512_gguf(&n), &n, 1, "<s\xc0\xbe", 4);  /* a control token too */
    expect_gguf_error(b, n, "tokenizer.ggml.tokens[1] '<s\\xc0\\xbe' is not valid UTF-8");
    free(b);
    b = gguf_with_token(tok512_gguf(&n), &n, 13, "<0x0a>", 6);     /* <0x0A>, in lower case: never looked up */
    expect_gguf_error(b, n, "tokenizer.ggml.tokens[13] '<0x0a>' is a byte token (tokenizer.ggml.token_type 6) but "
                      "not <0xNN>");
    free(b);
    b = gguf_with_token(tok512_gguf(&n), &n, 3, "", 0);
    expect_gguf_error(b, n, "tokenizer.ggml.tokens[3] '' is a byte token (tokenizer.ggml.token_type 6) but not <0xNN>");
    free(b);
    b = tok512_gguf(&n);
    size_t types = test_gguf_kv_at((const unsigned char *)b, n, "tokenizer.ggml.token_type") + 16;
    int32_t v = 99;
    memcpy(b + types + 4 * 7, &v, 4);
    expect_gguf_error(b, n, "tokenizer.ggml.token_type[7] is 99, not a token type (0 undefined, 1 normal, 2 unknown, "
                      "3 control, 4 user-defined, 5 unused, 6 byte); the token is '<0x04>'");
    v = -1;
    memcpy(b + types + 4 * 7, &v, 4);
    expect_gguf_error(b, n, "tokenizer.ggml.token_type[7] is -1, not a token type (0 undefined, 1 normal, 2 unknown, "
                      "3 control, 4 user-defined, 5 unused, 6 byte); the token is '<0x04>'");
    free(b);
}

/* Imports a GGUF vocabulary that must load; returns what it printed. */
static char *gguf_import_output(const char *b, size_t n, char *path)
{
    char *out;
    int nerr;
    Tokenizer *t = import_capture(TOKFMT_GGUF, b, n, 512, path, &out, &nerr);
    cr_assert(t && nerr == 0, "%s", out);
    tok_free(t);
    return out;
}

/* Repeated and empty normal tokens load with one warning each, naming
 * the first and counting all: converted vocabularies hold them (llama.cpp
 * warns of empty tokens; official Gemma GGUFs repeat texts). Token type 0
 * (llama.cpp's UNDEFINED) is tolerated. */
Test(tokenizer, gguf_spm_repeated_and_empty_tokens_warn)
{
    size_t n;
    char *b = tok512_gguf(&n);
    size_t at = gguf_token_at(b, n, 300);
    uint64_t len;
    memcpy(&len, b + at, 8);
    char text[64], esc[96], path[32], want[512];
    cr_assert(len < sizeof text);
    memcpy(text, b + at + 8, len);
    tok_escape(text, len, esc, sizeof esc);
    b = gguf_with_token(b, &n, 480, text, len);
    b = gguf_with_token(b, &n, 400, text, len);
    b = gguf_with_token(b, &n, 450, "", 0);
    b = gguf_with_token(b, &n, 460, "", 0);
    char *out = gguf_import_output(b, n, path);
    snprintf(want, sizeof want, "%s: warning: tokenizer.ggml.tokens[450] is an empty normal token (2 in all); encoding "
             "never produces one\n%s: warning: tokenizer.ggml.tokens[300] and [400] are the same normal token '%s' (2 "
             "repeat an earlier one's text); encoding produces only the first\n", path, path, esc);
    cr_assert_str_eq(out, want);
    free(out);
    free(b);
    b = tok512_gguf(&n);
    size_t types = test_gguf_kv_at((const unsigned char *)b, n, "tokenizer.ggml.token_type") + 16;
    memset(b + types + 4 * 300, 0, 4);
    out = gguf_import_output(b, n, path);
    cr_assert_str_eq(out, "");
    free(out);
    free(b);
}

/* A later turn of a conversation is encoded as a continuation: where the
 * text before it ends and it starts with a space or a special token, the
 * two encode as their concatenation does; SPM puts no dummy prefix before
 * it (tok_encode would: '  time' and a second space piece). */
Test(tokenizer, encode_more_continues_a_text)
{
    ModelDesc m = model_with_tok(TOKFMT_GGUF, FIXTURES "/tok512_spm.gguf", 512);
    Diag d;
    diag_init(&d);
    Tokenizer *t = tok_import(&m, &d);
    cr_assert(t, "import failed");
    static const char *const pairs[][2] = {
        {"Once upon a", " time"}, {"Once upon a time", "</s> The end."}, {"Hi?", " </s><s>[INST] And? [/INST]"},
        {"Hi", "<s> ok"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        int whole[MAX_IDS], a[MAX_IDS], b[MAX_IDS], c[MAX_IDS];
        char *ab = xasprintf("%s%s", pairs[i][0], pairs[i][1]);
        int nw = tok_encode(t, ab, false, whole, MAX_IDS), na = tok_encode(t, pairs[i][0], false, a, MAX_IDS);
        int nb = tok_encode_more(t, pairs[i][1], b, MAX_IDS, NULL), nc = tok_encode(t, pairs[i][1], false, c, MAX_IDS);
        cr_assert(nw > 0 && na > 0 && nb > 0, "%s", ab);
        cr_assert_eq(na + nb, nw, "%s: %d + %d tokens, %d as one", ab, na, nb, nw);
        cr_assert(memcmp(a, whole, sizeof(int) * (size_t)na) == 0 && memcmp(b, whole + na, sizeof(int) * (size_t)nb) == 0,
                  "%s", ab);
        if (pairs[i][1][0] == ' ')
            cr_assert(nc != nb || memcmp(b, c, sizeof(int) * (size_t)nb) != 0, "tok_encode puts the prefix: %s", ab);
        free(ab);
    }
    tok_free(t);
}
