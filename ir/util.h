/*
 * util.h - small pieces every compiler folder shares: fatal errors for
 * compiler bugs (die/ASSERT), an arena allocator (one per compilation, a
 * scratch one per pass; nothing is freed node by node), growable arrays,
 * and user-facing diagnostics printed as `file:line:col: error: ...` with
 * the source line and a caret, collected rather than stopping at the first.
 *
 * The runtime does not use this header: it returns a status and a message
 * instead of dying.
 */
#ifndef MEGAC_UTIL_H
#define MEGAC_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- util.c: fatal errors (compiler bugs, out of memory) ---- */
#if defined(__GNUC__)
#define MEGAC_NORETURN __attribute__((noreturn))
#define MEGAC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MEGAC_NORETURN
#define MEGAC_PRINTF(a, b)
#endif

MEGAC_NORETURN void die_at(const char *file, int line, const char *fmt, ...) MEGAC_PRINTF(3, 4);
#define die(...) die_at(__FILE__, __LINE__, __VA_ARGS__)
#define ASSERT(c) ((c) ? (void)0 : die_at(__FILE__, __LINE__, "assertion failed: %s", #c))

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
char *xasprintf(const char *fmt, ...) MEGAC_PRINTF(1, 2);

/* Growable array of T: `T *v; size_t n, cap;` then VEC_PUSH(v, n, cap, x). */
#define VEC_GROW(v, n, cap)                                                   \
    do {                                                                      \
        if ((n) >= (cap)) {                                                   \
            (cap) = (cap) ? (cap) * 2 : 16;                                   \
            (v) = xrealloc((v), (cap) * sizeof *(v));                         \
        }                                                                     \
    } while (0)
#define VEC_PUSH(v, n, cap, x)                                                \
    do {                                                                      \
        VEC_GROW(v, n, cap);                                                  \
        (v)[(n)++] = (x);                                                     \
    } while (0)

/* ---- arena.c: bump allocator ---- */
typedef struct ArenaBlock ArenaBlock;
typedef struct Arena {
    ArenaBlock *head;
    size_t used;            /* bytes handed out, for statistics */
} Arena;

void *arena_alloc(Arena *a, size_t n);          /* zeroed, 16-byte aligned */
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) MEGAC_PRINTF(2, 3);
void arena_free(Arena *a);
#define ARENA_NEW(a, T) ((T *)arena_alloc((a), sizeof(T)))
#define ARENA_ARRAY(a, T, n) ((T *)arena_alloc((a), sizeof(T) * (size_t)(n)))

/* ---- diag.c: user-facing diagnostics ---- */

/* A source text that diagnostics can quote. `text` may be NULL (a binary
 * file), in which case no source line is printed. */
typedef struct SrcFile {
    const char *path;
    const char *text;
    size_t len;
} SrcFile;

typedef struct Diag {
    FILE *out;              /* stderr unless redirected */
    const char *prog;       /* what an error without a file names ("megac lower"); NULL = "megac" */
    int nerrors;
    int nwarnings;
    int max_errors;         /* stop printing after this many; 0 = 50 */
    bool color;
    bool silent;            /* count, print nothing (a probe whose failure the caller words) */
} Diag;

void diag_init(Diag *d);
/* Prints "path:line:col: error: msg", then the source line and a caret
 * under column col (1-based, in characters: UTF-8 code points, as libyaml
 * counts them, a byte that is not UTF-8 one; line 0 means no location). */
void diag_error(Diag *d, const SrcFile *src, int line, int col, const char *fmt, ...) MEGAC_PRINTF(5, 6);
void diag_warning(Diag *d, const SrcFile *src, int line, int col, const char *fmt, ...) MEGAC_PRINTF(5, 6);
void diag_note(Diag *d, const SrcFile *src, int line, int col, const char *fmt, ...) MEGAC_PRINTF(5, 6);
/* An error about a file as a whole (binary inputs: "path: error: ..."). */
void diag_file_error(Diag *d, const char *path, const char *fmt, ...) MEGAC_PRINTF(3, 4);
void diag_vreport(Diag *d, const char *kind, const SrcFile *src, int line, int col, const char *fmt, va_list ap);
/* The column (as above) of `at` in the line that starts at `line`. */
int diag_col(const char *line, const char *at);
/* The character at s[0..n), n > 0: its bytes, and in *cp (may be NULL)
 * its code point; a byte that does not start a well-formed UTF-8
 * character is one character, its code point the byte's value. */
size_t utf8_next(const char *s, size_t n, unsigned *cp);
/* A tool's log after the message that cites it (NVRTC's): each line
 * indented, escaped as messages are. A message itself is one line: its
 * newlines are escaped too, so that a name read from a file cannot forge
 * a line of its own. */
void diag_log(Diag *d, const char *text);

/* fopen(path, "rb") that does not wait for a writer: a FIFO nothing
 * writes to reads as empty at once (fopen would wait forever), a pipe with
 * a writer (validate -, <(...)) is read to its end. */
FILE *fopen_read(const char *path);
/* Reads a whole file into a NUL-terminated buffer (xmalloc'd). Returns NULL
 * and sets errno when the file cannot be read: EISDIR, ENODEV for a device
 * (but /dev/null, which reads as empty), EIO. */
char *read_file(const char *path, size_t *len);
/* The same, refusing (EFBIG) a file of more than max bytes before it reads
 * them all. */
char *read_file_max(const char *path, size_t *len, size_t max);
/* The size and hash_bulk of a regular file, read through a mapping;
 * false with errno set (ENODEV: not a regular file) when it cannot be. */
bool file_hash_bulk(const char *path, uint64_t *bytes, uint64_t *hash);
bool srcfile_load(SrcFile *f, const char *path);  /* false: errno set */
void srcfile_free(SrcFile *f);

/* Edit distance, for "did you mean 'x'?" on unknown keys and names. */
int str_distance(const char *a, const char *b);
/* The candidate closest to `s`, or NULL if none is near (distance <= 1/3 of
 * the length, at least 2). `cands` is NULL-terminated. */
const char *str_closest(const char *s, const char *const *cands);

/* ---- hash.c ---- */
uint64_t hash_fnv1a(const void *p, size_t n, uint64_t h);
#define HASH_FNV_INIT 0xcbf29ce484222325ull
/* A 64-bit hash of n bytes for a large file's integrity (weights.bin):
 * four chains over 8-byte words, each step a bijection of its state, so
 * that any change of one word changes its chain: 5.4 GB/s on one Xeon
 * core where hash_fnv1a, a byte at a time, reads 0.44. Detects damage,
 * not forgery. */
uint64_t hash_bulk(const void *p, size_t n);

/* ---- half.c: f16/bf16 conversions (bit exact, round to nearest even) ---- */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

#endif
