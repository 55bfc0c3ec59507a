/*
 * doc.c - libyaml events folded into a DocNode tree with positions.
 *
 * Grammar accepted: any YAML 1.1 document made of mappings, sequences and
 * scalars (block or flow, so JSON too). Aliases are rejected; duplicate
 * mapping keys are errors (JSON allows them, a model description must not).
 * JSON is read as YAML reads it, so more leniently than a JSON reader (a
 * trailing comma, an unquoted string are accepted); its syntax errors are
 * told in JSON's words (json_words).
 */
#include "compiler/doc.h"
#include "runtime/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

typedef struct {
    Doc *doc;
    Diag *d;
    const char *input; /* what libyaml reads (doc->src.text, or doc_parse_value's copy) */
    size_t input_len;
    size_t input_chars; /* its characters (libyaml's marks count characters, not bytes) */
    yaml_parser_t p;
    yaml_event_t ev;
    bool ok;
} Builder;

static void doc_verror(Doc *doc, Diag *d, const char *kind, const DocNode *n, const char *fmt, va_list ap)
{
    diag_vreport(d, kind, &doc->src, n ? n->line : 0, n ? n->col : 0, fmt, ap);
}

void doc_error(Doc *doc, Diag *d, const DocNode *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    doc_verror(doc, d, "error", n, fmt, ap);
    va_end(ap);
}

void doc_note(Doc *doc, Diag *d, const DocNode *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    doc_verror(doc, d, "note", n, fmt, ap);
    va_end(ap);
}

/* What a JSON reader says where libyaml reports `problem` `context` (NULL
 * context: any), and what its context mark points at (NULL: no note). */
static const struct {
    const char *problem, *context, *json, *starts;
} json_words[] = {
    {"did not find expected ',' or '}'", "while parsing a flow mapping", "expected ',' or '}' in this object",
     "the object starts here"},
    {"did not find expected ',' or ']'", "while parsing a flow sequence", "expected ',' or ']' in this array",
     "the array starts here"},
    {"did not find expected node content", NULL, "expected a value", NULL},
    {"found unexpected end of stream", "while scanning a quoted scalar", "the file ends inside this string",
     "the string starts here"},
    {"found unknown escape character", NULL, "unknown escape in a string", "the string starts here"},
    {"did not find expected hexdecimal number", NULL, "a \\u escape needs four hex digits",
     "the string starts here"},
    {"did not find expected <document start>", NULL, "text after the end of the JSON value", NULL},
    {"found character that cannot start any token", NULL, "this character cannot start a JSON value", NULL},
};

/* A document whose first byte after white space is '{' or '[' reads as
 * JSON (config.json, tokenizer.json, a safetensors header): its syntax
 * errors are told in JSON's words, not YAML's. */
static bool doc_looks_json(const char *t, size_t len)
{
    size_t i = 0;
    while (i < len && (t[i] == ' ' || t[i] == '\t' || t[i] == '\r' || t[i] == '\n'))
        i++;
    return i < len && (t[i] == '{' || t[i] == '[');
}

/* The line and column just past the last character of src (before its
 * final line ending): where a syntax error at the end of the input is
 * shown, on a line the text has. */
static void doc_end_at(const SrcFile *src, int *line, int *col)
{
    size_t n = src->len;
    while (n > 0 && (src->text[n - 1] == '\n' || src->text[n - 1] == '\r'))
        n--;
    size_t bol = n;
    while (bol > 0 && src->text[bol - 1] != '\n')
        bol--;
    int l = 1;
    for (size_t i = 0; i < bol; i++)
        l += src->text[i] == '\n';
    *line = l;
    *col = diag_col(src->text + bol, src->text + n);
}

static bool next_event(Builder *b)
{
    if (!yaml_parser_parse(&b->p, &b->ev)) {
        const yaml_mark_t *m = &b->p.problem_mark, *c = &b->p.context_mark;
        const char *problem = b->p.problem ? b->p.problem : "syntax error", *context = b->p.context;
        char starts[128] = "";
        if (context)
            snprintf(starts, sizeof starts, "it starts here (%s)", context);
        bool json = doc_looks_json(b->input, b->input_len);
        for (size_t i = 0; json && i < sizeof json_words / sizeof *json_words; i++)
            if (!strcmp(problem, json_words[i].problem) &&
                (!json_words[i].context || (context && !strcmp(context, json_words[i].context)))) {
                problem = json_words[i].json;
                context = NULL;
                snprintf(starts, sizeof starts, "%s", json_words[i].starts ? json_words[i].starts : "");
                break;
            }
        int line = (int)m->line + 1, col = (int)m->column + 1;
        if (m->index >= b->input_chars) /* the end of the input: just past its last character, on its line */
            doc_end_at(&b->doc->src, &line, &col);
        diag_error(b->d, &b->doc->src, line, col, "%s%s%s", problem, context ? " " : "", context ? context : "");
        if (*starts && b->p.context && (c->line != m->line || c->column != m->column))
            diag_note(b->d, &b->doc->src, (int)c->line + 1, (int)c->column + 1, "%s", starts);
        b->ok = false;
        return false;
    }
    return true;
}

static DocNode *new_node(Builder *b, DocKind k, const yaml_mark_t *m)
{
    DocNode *n = ARENA_NEW(&b->doc->arena, DocNode);
    n->kind = k;
    n->line = (int)m->line + 1;
    n->col = (int)m->column + 1;
    return n;
}

static DocNode *build_node(Builder *b, int depth);

/* Open-addressing set of a mapping's keys, so duplicate detection stays
 * linear for maps with tens of thousands of keys (tokenizer vocabularies). */
typedef struct {
    DocNode **slot;
    size_t cap;
} KeySet;

/* Inserts key c (the map already holds n keys); returns the earlier node
 * with the same text, or NULL. */
static DocNode *keyset_insert(KeySet *ks, DocNode *c, size_t n)
{
    if (2 * (n + 1) > ks->cap) {
        size_t cap = ks->cap ? ks->cap * 2 : 16;
        DocNode **old = ks->slot;
        size_t oldcap = ks->cap;
        ks->slot = xcalloc(cap, sizeof *ks->slot);
        ks->cap = cap;
        for (size_t i = 0; i < oldcap; i++)
            if (old[i]) {
                size_t h = hash_fnv1a(old[i]->str, old[i]->len, HASH_FNV_INIT) & (cap - 1);
                while (ks->slot[h])
                    h = (h + 1) & (cap - 1);
                ks->slot[h] = old[i];
            }
        free(old);
    }
    size_t h = hash_fnv1a(c->str, c->len, HASH_FNV_INIT) & (ks->cap - 1);
    for (; ks->slot[h]; h = (h + 1) & (ks->cap - 1))
        if (ks->slot[h]->len == c->len && memcmp(ks->slot[h]->str, c->str, c->len) == 0)
            return ks->slot[h];
    ks->slot[h] = c;
    return NULL;
}

/* Reads children until the matching end event. */
static bool build_children(Builder *b, DocNode *n, yaml_event_type_t end, int depth)
{
    size_t cap = 0, kcap = 0, nk = 0, ni = 0;
    DocNode **items = NULL, **keys = NULL;
    KeySet ks = {0};
    for (;;) {
        if (!next_event(b))
            goto fail;
        if (b->ev.type == end) {
            yaml_event_delete(&b->ev);
            break;
        }
        DocNode *c = build_node(b, depth + 1);
        if (!c)
            goto fail;
        if (n->kind == DOC_MAP && nk == ni) {
            if (c->kind != DOC_SCALAR) {
                doc_error(b->doc, b->d, c, "mapping keys must be plain scalars");
                goto fail;
            }
            DocNode *first = keyset_insert(&ks, c, nk);
            if (first) {
                doc_error(b->doc, b->d, c, "duplicate key '%s'", c->str);
                doc_note(b->doc, b->d, first, "first given here");
                b->ok = false;
            }
            VEC_PUSH(keys, nk, kcap, c);
        } else {
            VEC_PUSH(items, ni, cap, c);
        }
    }
    n->n = (int)ni;
    n->items = ARENA_ARRAY(&b->doc->arena, DocNode *, ni);
    if (ni)
        memcpy(n->items, items, ni * sizeof *items);
    if (n->kind == DOC_MAP) {
        n->keys = ARENA_ARRAY(&b->doc->arena, DocNode *, nk);
        if (nk)
            memcpy(n->keys, keys, nk * sizeof *keys);
    }
    free(items);
    free(keys);
    free(ks.slot);
    return true;
fail:
    free(items);
    free(keys);
    free(ks.slot);
    return false;
}

/* Builds the node whose start event is in b->ev (consumed). */
static DocNode *build_node(Builder *b, int depth)
{
    yaml_event_t ev = b->ev;
    DocNode *n = NULL;
    if (depth > 256) {
        diag_error(b->d, &b->doc->src, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
                   "document nested too deeply");
        yaml_event_delete(&ev);
        b->ok = false;
        return NULL;
    }
    const yaml_char_t *tag = ev.type == YAML_SCALAR_EVENT           ? ev.data.scalar.tag
                             : ev.type == YAML_SEQUENCE_START_EVENT ? ev.data.sequence_start.tag
                             : ev.type == YAML_MAPPING_START_EVENT  ? ev.data.mapping_start.tag
                                                                    : NULL;
    if (tag) {      /* !!str 64 would otherwise read as the integer 64 */
        diag_error(b->d, &b->doc->src, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
                   "YAML tags are not supported (found '%s')", (const char *)tag);
        yaml_event_delete(&ev);
        b->ok = false;
        return NULL;
    }
    switch (ev.type) {
    case YAML_SCALAR_EVENT:
        n = new_node(b, DOC_SCALAR, &ev.start_mark);
        n->str = arena_strndup(&b->doc->arena, (const char *)ev.data.scalar.value, ev.data.scalar.length);
        n->len = ev.data.scalar.length;
        n->quoted = ev.data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
                    ev.data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE;
        yaml_event_delete(&ev);
        return n;
    case YAML_SEQUENCE_START_EVENT:
        n = new_node(b, DOC_SEQ, &ev.start_mark);
        yaml_event_delete(&ev);
        return build_children(b, n, YAML_SEQUENCE_END_EVENT, depth) ? n : NULL;
    case YAML_MAPPING_START_EVENT:
        n = new_node(b, DOC_MAP, &ev.start_mark);
        yaml_event_delete(&ev);
        return build_children(b, n, YAML_MAPPING_END_EVENT, depth) ? n : NULL;
    case YAML_ALIAS_EVENT:
        diag_error(b->d, &b->doc->src, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
                   "YAML aliases are not supported");
        break;
    default:
        diag_error(b->d, &b->doc->src, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
                   "unexpected YAML event");
        break;
    }
    yaml_event_delete(&ev);
    b->ok = false;
    return NULL;
}

/* Rejects a NUL, a control byte or malformed UTF-8 at its own line and
 * column; libyaml would report them, but at 1:1 (it decodes the whole input
 * before it tracks positions). UTF-16 input (a BOM) is left to libyaml. */
static bool doc_bytes_check(const Doc *doc, Diag *d)
{
    const unsigned char *t = (const unsigned char *)doc->src.text;
    size_t n = doc->src.len;
    if (n >= 2 && ((t[0] == 0xFF && t[1] == 0xFE) || (t[0] == 0xFE && t[1] == 0xFF)))
        return true;
    int line = 1;
    size_t bol = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = t[i];
        const char *bol_at = (const char *)t + bol, *at = (const char *)t + i;    /* diag_col(bol_at, at) */
        int k;
        if (c == '\n') {
            line++;
            bol = i + 1;
        } else if (c == 0) {
            diag_error(d, &doc->src, line, diag_col(bol_at, at), "a NUL byte is not allowed here (is this a text file?)");
            return false;
        } else if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7F) {
            diag_error(d, &doc->src, line, diag_col(bol_at, at), "control character 0x%02x is not allowed", c);
            return false;
        } else if (c >= 0x80) {
            if (!(k = tok_utf8_len(at, n - i))) {
                diag_error(d, &doc->src, line, diag_col(bol_at, at), "invalid UTF-8 (byte 0x%02x)", c);
                return false;
            }
            i += (size_t)k - 1;
        }
    }
    return true;
}

/* doc_parse of input[0, input_len) where diagnostics quote text (the same
 * lines and character columns). */
static bool doc_parse_input(Doc *doc, const char *path, char *text, size_t len, const char *input, size_t input_len,
                            Diag *d)
{
    memset(doc, 0, sizeof *doc);
    doc->src.path = xstrdup(path);
    doc->src.text = text;
    doc->src.len = len;
    if (!doc_bytes_check(doc, d))
        return false;
    Builder b = {.doc = doc, .d = d, .input = input, .input_len = input_len, .ok = true};
    for (size_t i = 0; i < input_len; i++)
        b.input_chars += ((unsigned char)input[i] & 0xc0) != 0x80;
    yaml_parser_initialize(&b.p);
    yaml_parser_set_input_string(&b.p, (const unsigned char *)input, input_len);
    bool in_doc = false;
    while (b.ok && next_event(&b)) {
        yaml_event_type_t t = b.ev.type;
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&b.ev);
            break;
        }
        if (t == YAML_DOCUMENT_START_EVENT) {
            if (doc->root || in_doc) {
                diag_error(d, &doc->src, (int)b.ev.start_mark.line + 1, (int)b.ev.start_mark.column + 1,
                           "only one YAML document per file is allowed");
                b.ok = false;
            }
            in_doc = true;
            yaml_event_delete(&b.ev);
            continue;
        }
        if (t == YAML_DOCUMENT_END_EVENT || t == YAML_STREAM_START_EVENT) {
            yaml_event_delete(&b.ev);
            continue;
        }
        doc->root = build_node(&b, 0);
        if (!doc->root)
            b.ok = false;
    }
    yaml_parser_delete(&b.p);
    return b.ok;
}

bool doc_parse(Doc *doc, const char *path, char *text, size_t len, Diag *d)
{
    return doc_parse_input(doc, path, text, len, text, len, d);
}

bool doc_parse_value(Doc *doc, const char *path, char *text, size_t len, size_t skip, Diag *d)
{
    size_t nch = 0;
    for (size_t i = 0; i < skip; i++)
        nch += ((unsigned char)text[i] & 0xc0) != 0x80; /* libyaml's columns count characters */
    char *input = xmalloc(nch + (len - skip) + 1);
    memset(input, ' ', nch);
    memcpy(input + nch, text + skip, len - skip);
    input[nch + len - skip] = 0;
    bool ok = doc_parse_input(doc, path, text, len, input, nch + len - skip, d);
    free(input);
    return ok;
}

bool doc_load(Doc *doc, const char *path, Diag *d)
{
    size_t len;
    char *text = read_file(path, &len);
    if (!text) {
        memset(doc, 0, sizeof *doc);
        diag_file_error(d, path, "cannot read file: %s",
                        errno == ENODEV ? "not a regular file (a device)" : strerror(errno));
        return false;
    }
    return doc_parse(doc, path, text, len, d);
}

void doc_free(Doc *doc)
{
    arena_free(&doc->arena);
    srcfile_free(&doc->src);
    doc->root = NULL;
}

DocNode *doc_get(const DocNode *m, const char *key)
{
    if (!m || m->kind != DOC_MAP)
        return NULL;
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->keys[i]->str, key) == 0)
            return m->items[i];
    return NULL;
}

const char *doc_kind_name(DocKind k)
{
    return k == DOC_SCALAR ? "a scalar" : k == DOC_SEQ ? "a list" : "a mapping";
}

const char *doc_str(Doc *doc, Diag *d, const DocNode *n)
{
    if (!n || n->kind != DOC_SCALAR) {
        doc_error(doc, d, n, "expected a string, found %s", n ? doc_kind_name(n->kind) : "nothing");
        return NULL;
    }
    return n->str;
}

bool doc_is_null(const DocNode *n)
{
    return !n || (n->kind == DOC_SCALAR && !n->quoted &&
                  (strcmp(n->str, "null") == 0 || strcmp(n->str, "~") == 0 || n->len == 0));
}

bool doc_int(Doc *doc, Diag *d, const DocNode *n, int64_t *out)
{
    if (!n || n->kind != DOC_SCALAR || n->quoted) {
        doc_error(doc, d, n, "expected an integer, found %s",
                  !n ? "nothing" : n->kind != DOC_SCALAR ? doc_kind_name(n->kind) : "a quoted string");
        return false;
    }
    /* decimal, as JSON writes it: 010 is not 8, nor 0x10 16 */
    const char *digits = n->str + (n->str[0] == '-' || n->str[0] == '+');
    if ((digits[0] == '0' && digits[1] >= '0' && digits[1] <= '9') || strpbrk(n->str, "xX")) {
        doc_error(doc, d, n, "expected a decimal integer, found '%s'", n->str);
        return false;
    }
    char *end;
    errno = 0;
    long long v = strtoll(n->str, &end, 10);
    if (errno || end == n->str || *end) {
        /* accept integral floats written as 1e5 or 32.0 */
        double x = strtod(n->str, &end);
        if (end != n->str && !*end && x == floor(x) && fabs(x) < 9e15) {
            *out = (int64_t)x;
            return true;
        }
        doc_error(doc, d, n, "expected an integer, found '%s'", n->str);
        return false;
    }
    *out = v;
    return true;
}

bool doc_double(Doc *doc, Diag *d, const DocNode *n, double *out)
{
    if (!n || n->kind != DOC_SCALAR || n->quoted) {
        doc_error(doc, d, n, "expected a number, found %s",
                  !n ? "nothing" : n->kind != DOC_SCALAR ? doc_kind_name(n->kind) : "a quoted string");
        return false;
    }
    char *end;
    errno = 0;
    double v = strtod(n->str, &end);
    if (end == n->str || *end || !isfinite(v)) {
        doc_error(doc, d, n, "expected a number, found '%s'", n->str);
        return false;
    }
    *out = v;
    return true;
}

bool doc_bool(Doc *doc, Diag *d, const DocNode *n, bool *out)
{
    if (n && n->kind == DOC_SCALAR && !n->quoted) {
        if (!strcmp(n->str, "true") || !strcmp(n->str, "True") || !strcmp(n->str, "yes")) {
            *out = true;
            return true;
        }
        if (!strcmp(n->str, "false") || !strcmp(n->str, "False") || !strcmp(n->str, "no")) {
            *out = false;
            return true;
        }
    }
    doc_error(doc, d, n, "expected true or false, found %s",
              !n ? "nothing" : n->kind != DOC_SCALAR ? doc_kind_name(n->kind) : n->str);
    return false;
}
