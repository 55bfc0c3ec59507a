/*
 * doc.h - a YAML/JSON document tree built with libyaml, every node carrying
 * its source position so that errors point at `file:line:col`.
 *
 * Used for model descriptions (YAML), HF config.json, safetensors headers
 * and tokenizer.json (JSON is YAML flow syntax). Nodes live in the Doc's
 * arena; anchors/aliases are refused (a model description has no need).
 */
#ifndef MEGAC_DOC_H
#define MEGAC_DOC_H

#include "ir/util.h"

typedef enum { DOC_SCALAR, DOC_SEQ, DOC_MAP } DocKind;

typedef struct DocNode DocNode;
struct DocNode {
    DocKind kind;
    int line, col;          /* 1-based */
    /* DOC_SCALAR */
    const char *str;        /* NUL-terminated; may contain NULs if len says so */
    size_t len;
    bool quoted;            /* written in quotes: never a number/bool/null */
    /* DOC_SEQ: items; DOC_MAP: keys[i] -> items[i] */
    DocNode **items;
    DocNode **keys;
    int n;
};

typedef struct Doc {
    Arena arena;
    SrcFile src;            /* owns the text; diagnostics quote it */
    DocNode *root;          /* NULL for an empty document */
} Doc;

/* Parses `text` (not copied when `take` is true: the Doc frees it). On a
 * syntax error prints `path:line:col: error:` to d and returns false. */
bool doc_parse(Doc *doc, const char *path, char *text, size_t len, Diag *d);
/* doc_parse of text's bytes from skip on, as if those before were blanks
 * (a `key=value` whose value alone is YAML): diagnostics quote the whole
 * text, columns counted in it. */
bool doc_parse_value(Doc *doc, const char *path, char *text, size_t len, size_t skip, Diag *d);
/* Reads and parses a file; reports unreadable files as errors too. */
bool doc_load(Doc *doc, const char *path, Diag *d);
void doc_free(Doc *doc);

/* Map lookup by key; NULL when absent or when `m` is not a map. */
DocNode *doc_get(const DocNode *m, const char *key);
/* Scalar accessors: return false (and report at the node) on a type error. */
bool doc_int(Doc *doc, Diag *d, const DocNode *n, int64_t *out);
bool doc_double(Doc *doc, Diag *d, const DocNode *n, double *out);
bool doc_bool(Doc *doc, Diag *d, const DocNode *n, bool *out);
bool doc_is_null(const DocNode *n);
/* The scalar text, or NULL (and an error) when `n` is not a scalar. */
const char *doc_str(Doc *doc, Diag *d, const DocNode *n);
const char *doc_kind_name(DocKind k);

/* Reports an error located at node `n` of `doc`. */
void doc_error(Doc *doc, Diag *d, const DocNode *n, const char *fmt, ...) MEGAC_PRINTF(4, 5);
void doc_note(Doc *doc, Diag *d, const DocNode *n, const char *fmt, ...) MEGAC_PRINTF(4, 5);

#endif
