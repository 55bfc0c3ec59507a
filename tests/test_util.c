/*
 * test_util.c - diagnostics, arena, half-precision conversions.
 */
#include "compiler/doc.h"
#include "ir/util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

/* A Diag writing into buf (cap bytes); fclose(d->out) ends it. */
static void diag_into(Diag *d, char *buf, size_t cap)
{
    memset(buf, 0, cap);
    diag_init(d);
    d->out = fmemopen(buf, cap, "w");
    cr_assert_not_null(d->out);
}

Test(util, caret_diagnostic)
{
    char buf[512];
    Diag d;
    diag_into(&d, buf, sizeof buf);
    SrcFile src = {.path = "m.yaml", .text = "a: 1\nhiden: 2\n", .len = 14};
    diag_error(&d, &src, 2, 1, "unknown key 'hiden'");
    fclose(d.out);
    cr_assert_eq(d.nerrors, 1);
    cr_assert_str_eq(buf, "m.yaml:2:1: error: unknown key 'hiden'\n    2 | hiden: 2\n      | ^\n");
}

/* Columns count characters (as libyaml's marks do), and the caret's
 * padding their terminal cells: a CJK character takes two, an accented
 * letter one, a combining mark none; on a long line of such text the
 * window is around the character the column names (it was cut around that
 * byte offset: the caret fell inside a string 90 characters earlier). */
Test(util, caret_counts_characters_and_cells)
{
    char buf[2048];
    Diag d;
    diag_into(&d, buf, sizeof buf);
    const char *t = "k: \"e\xcc\x81\xc3\xa9\xe6\x97\xa5\" x\n";   /* e + U+0301, é, 日 */
    SrcFile src = {.path = "m.yaml", .text = t, .len = strlen(t)};
    cr_assert_eq(diag_col(t, strchr(t, 'x')), 11);
    diag_error(&d, &src, 1, 11, "here");
    fclose(d.out);
    cr_assert_str_eq(buf, "m.yaml:1:11: error: here\n    1 | k: \"e\xcc\x81\xc3\xa9\xe6\x97\xa5\" x\n"
                          "      |           ^\n");
    /* a 400-character line of 3-byte characters, the column at its 'x' */
    char *line = xmalloc(1300);
    size_t n = 0;
    for (int i = 0; i < 300; i++, n += 3)
        memcpy(line + n, "\xe6\x97\xa5", 3);
    memcpy(line + n, "\" x\n", 5);
    n += 4;
    src = (SrcFile){.path = "m.yaml", .text = line, .len = n};
    cr_assert_eq(diag_col(line, line + n - 2), 303);
    diag_into(&d, buf, sizeof buf);
    diag_error(&d, &src, 1, 303, "here");
    fclose(d.out);
    /* the window: the line's last 100 bytes but the first, not a whole
     * character: 32 characters and '" x', the caret under the x, 2 * 32 +
     * 2 cells after the "..." */
    char *want = xasprintf("m.yaml:1:303: error: here\n    1 | ...%.*s\n      |    %*s^\n", 99, line + 900 - 96,
                           2 * 32 + 2, "");
    cr_assert_str_eq(buf, want, "%s", buf);
    free(want);
    free(line);
}

/* Names and strings quoted from a file's bytes reach the terminal with
 * their control characters escaped (\xNN in messages and paths, '?' in a
 * quoted source line, where the caret keeps its column): a newline too (a
 * GGUF key holding one forged a line 'fake: error'), and bytes that are
 * not UTF-8; UTF-8 and tabs stay. A tool's log (diag_log) keeps its lines,
 * each indented. */
Test(util, diagnostics_escape_control_characters)
{
    char buf[512];
    Diag d;
    diag_into(&d, buf, sizeof buf);
    SrcFile src = {.path = "m\x1b.yaml", .text = "k: \x1b[2Jx\n", .len = 10};
    diag_error(&d, &src, 1, 8, "key '%s\r' at\tthe log:\n%s \xc3\xa9 \xc3 \xed\xa0\x80", "\x1b[31m", "\x7f");
    diag_log(&d, "line 1\n\x1b line 2");
    fclose(d.out);
    cr_assert_str_eq(buf, "m\\x1b.yaml:1:8: error: key '\\x1b[31m\\x0d' at\tthe log:\\x0a\\x7f \xc3\xa9 \\xc3 "
                          "\\xed\\xa0\\x80\n"
                          "    1 | k: ?[2Jx\n"
                          "      |        ^\n"
                          "    line 1\n"
                          "    \\x1b line 2\n");
}

Test(util, closest)
{
    const char *c[] = {"hidden", "heads", "layers", NULL};
    cr_assert_str_eq(str_closest("hiden", c), "hidden");
    cr_assert_null(str_closest("zzzzzzzz", c));
}

/* hash_bulk (weights.bin's integrity): every single-bit change of inputs
 * of 0..100 bytes (words, the tail, both) changes the hash, and so does
 * the length alone. */
Test(util, hash_bulk_sees_every_bit)
{
    unsigned char b[100];
    for (int i = 0; i < 100; i++)
        b[i] = (unsigned char)(i * 37 + 11);
    for (size_t n = 0; n <= 100; n++) {
        uint64_t h = hash_bulk(b, n);
        if (n < 100)
            cr_assert_neq(h, hash_bulk(b, n + 1), "length %zu", n);
        for (size_t i = 0; i < n; i++)
            for (int bit = 0; bit < 8; bit++) {
                b[i] ^= (unsigned char)(1u << bit);
                cr_assert_neq(hash_bulk(b, n), h, "length %zu byte %zu bit %d", n, i, bit);
                b[i] ^= (unsigned char)(1u << bit);
            }
    }
}

Test(util, half_roundtrip)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        cr_assert_eq(f32_to_f16(f), h, "f16 %04x", h);
    }
    cr_assert_eq(f32_to_bf16(1.0f), 0x3f80);
    cr_assert_float_eq(bf16_to_f32(0x4049), 3.140625f, 0);
}

/* A document that starts with '{' or '[' is told its syntax errors in
 * JSON's words (libyaml's are YAML's: "flow mapping", "quoted scalar"),
 * with a note where the unclosed object, array or string starts. */
Test(doc, json_syntax_errors_in_json_words)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"{\"a\" 1}", "t.json:1:6: error: expected ',' or '}' in this object\n"
                      "t.json:1:1: note: the object starts here\n"},
        /* at the end of the input: just past its last character (line 3, which
         * the text does not have, had no source line) */
        {"\n [1, 2", "t.json:2:7: error: expected ',' or ']' in this array\nt.json:2:2: note: the array starts here\n"},
        {"{\"a\": [1, }", "t.json:1:11: error: expected a value\n"},
        {"{\"a\": \"b", "t.json:1:9: error: the file ends inside this string\nt.json:1:7: note: the string starts here\n"},
        {"{\"a\": \"\\u12\"}", "t.json:1:10: error: a \\u escape needs four hex digits\n"
                              "t.json:1:7: note: the string starts here\n"},
        {"{\"a\": 1}}", "t.json:1:9: error: text after the end of the JSON value\n"},
        {"{\"a\": @}", "t.json:1:7: error: this character cannot start a JSON value\n"},
        /* YAML stays in YAML's words */
        {"a: [1, 2", "t.json:1:9: error: did not find expected ',' or ']' while parsing a flow sequence\n"
                     "t.json:1:4: note: it starts here (while parsing a flow sequence)\n"},
        /* with characters of several bytes before (libyaml's marks count
         * characters: the end was missed, and line 3 named again) */
        {"n: \"\xc3\xa9\xc3\xa9\"\na: [1, 2\n", "t.json:2:9: error: did not find expected ',' or ']' while parsing a flow "
                                                 "sequence\nt.json:2:4: note: it starts here (while parsing a flow "
                                                 "sequence)\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&buf, &len);
        Diag d = {.out = out};
        Doc doc;
        cr_assert_not(doc_parse(&doc, "t.json", xstrdup(cases[i].text), strlen(cases[i].text), &d), "%s", cases[i].text);
        doc_free(&doc);
        fclose(out);
        /* the messages, without the quoted source lines */
        char *got = xstrdup(""), *line = buf;
        for (char *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            if (*line == ' ')
                continue;
            char *more = xasprintf("%s%.*s\n", got, (int)(nl ? nl - line : (ptrdiff_t)strlen(line)), line);
            free(got);
            got = more;
        }
        cr_assert_str_eq(got, cases[i].want, "%s", cases[i].text);
        free(got);
        free(buf);
    }
}

Test(doc, positions_and_json)
{
    Doc doc;
    Diag d;
    diag_init(&d);
    char *t = xstrdup("{\"a\": [1, 2.5], \"b\": {\"c\": \"x\"}}");
    cr_assert(doc_parse(&doc, "t.json", t, strlen(t), &d));
    DocNode *a = doc_get(doc.root, "a");
    cr_assert_eq(a->kind, DOC_SEQ);
    cr_assert_eq(a->n, 2);
    double v;
    cr_assert(doc_double(&doc, &d, a->items[1], &v));
    cr_assert_float_eq(v, 2.5, 0);
    cr_assert_str_eq(doc_get(doc_get(doc.root, "b"), "c")->str, "x");
    cr_assert_eq(doc_get(doc.root, "b")->col, 22);
    doc_free(&doc);
}
