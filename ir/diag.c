/*
 * diag.c - user-facing diagnostics in the form compilers use:
 *
 *   models/x.yaml:12:5: error: unknown key 'hiden'; did you mean 'hidden'?
 *      12 |     hiden: 64
 *         |     ^
 *
 * Errors are counted, not fatal; the caller decides when to stop.
 */
#include "ir/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

void diag_init(Diag *d)
{
    memset(d, 0, sizeof *d);
    d->out = stderr;
}

/* Lines longer than this print as a window of SNIPPET_WIDTH bytes around
 * the caret, with "..." where text was left out (a minified JSON file is one
 * line of megabytes). */
enum { SNIPPET_WIDTH = 100 };

static bool utf8_continuation(char c)
{
    return ((unsigned char)c & 0xC0) == 0x80;
}

/* The length of the well-formed UTF-8 character at s (0: not one): the
 * rule of runtime/tokenizer.c's tok_utf8_len (the runtime links nothing of
 * ir/, nor ir/ of the runtime). */
static int utf8_char_len(const unsigned char *s)
{
    int n = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
          : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    if ((n == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))) ||
        (n == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))))
        return 0;   /* overlong, a surrogate, past U+10FFFF */
    return n;
}

size_t utf8_next(const char *s, size_t n, unsigned *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = u[0] < 0x80 ? 1 : u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : 2;
    if (k == 1 || k > n || utf8_char_len(u) != (int)k) {
        if (cp)
            *cp = u[0];
        return 1;
    }
    if (cp)
        *cp = k == 2 ? (u[0] & 0x1fu) << 6 | (u[1] & 0x3fu)
            : k == 3 ? (u[0] & 0x0fu) << 12 | (u[1] & 0x3fu) << 6 | (u[2] & 0x3fu)
                     : (u[0] & 0x07u) << 18 | (u[1] & 0x3fu) << 12 | (u[2] & 0x3fu) << 6 | (u[3] & 0x3fu);
    return k;
}

static size_t char_bytes(const char *s, size_t n)
{
    return utf8_next(s, n, NULL);
}

int diag_col(const char *line, const char *at)
{
    int col = 1;
    for (const char *p = line; p < at; col++)
        p += char_bytes(p, (size_t)(at - p));
    return col;
}

/* Terminal cells of the character at s[0..n): 2 for East Asian wide and
 * full-width ones (CJK, Hangul, kana, emoji), 0 for combining marks and
 * zero-width ones, else 1 (a rough wcwidth; the caret's padding). */
static int char_cells(const char *s, size_t n)
{
    unsigned cp;
    if (utf8_next(s, n, &cp) == 1)
        return 1;
    static const unsigned zero[][2] = {{0x300, 0x36f}, {0x483, 0x489}, {0x591, 0x5bd}, {0x610, 0x61a},
                                       {0x64b, 0x65f}, {0x200b, 0x200f}, {0x20d0, 0x20ff}, {0xfe00, 0xfe0f},
                                       {0xfe20, 0xfe2f}};
    static const unsigned wide[][2] = {{0x1100, 0x115f}, {0x2e80, 0x303e}, {0x3041, 0x33ff}, {0x3400, 0x4dbf},
                                       {0x4e00, 0x9fff}, {0xa000, 0xa4cf}, {0xac00, 0xd7a3}, {0xf900, 0xfaff},
                                       {0xfe30, 0xfe4f}, {0xff00, 0xff60}, {0xffe0, 0xffe6}, {0x1f300, 0x1f64f},
                                       {0x1f900, 0x1f9ff}, {0x20000, 0x2fffd}, {0x30000, 0x3fffd}};
    for (size_t i = 0; i < sizeof zero / sizeof *zero; i++)
        if (cp >= zero[i][0] && cp <= zero[i][1])
            return 0;
    for (size_t i = 0; i < sizeof wide / sizeof *wide; i++)
        if (cp >= wide[i][0] && cp <= wide[i][1])
            return 2;
    return 1;
}

static void print_source_line(FILE *out, const SrcFile *src, int line, int col)
{
    if (!src || !src->text || line <= 0)
        return;
    const char *p = src->text, *end = src->text + src->len;
    for (int l = 1; l < line && p < end; p++)
        if (*p == '\n')
            l++;
    if (p >= end && line > 1)
        return;
    const char *e = p;
    while (e < end && *e != '\n' && *e != '\r')
        e++;
    /* at: the byte where the col-th character starts (or the line's end) */
    size_t n = (size_t)(e - p), at = 0;
    for (int c = 1; c < col && at < n; c++)
        at += char_bytes(p + at, n - at);
    size_t from = 0, to = n;
    if (n > SNIPPET_WIDTH + SNIPPET_WIDTH / 5) {
        from = at > SNIPPET_WIDTH / 2 ? at - SNIPPET_WIDTH / 2 : 0;
        from = from + SNIPPET_WIDTH > n ? n - SNIPPET_WIDTH : from;
        to = from + SNIPPET_WIDTH;
        while (from > 0 && from < at && utf8_continuation(p[from]))
            from++;
        while (to < n && to > at && utf8_continuation(p[to]))
            to--;
    }
    const char *pre = from > 0 ? "..." : "", *post = to < n ? "..." : "";
    fprintf(out, "%5d | %s", line, pre);
    for (size_t i = from; i < to; i++) /* a control character as '?': one column, as under the caret */
        fputc(((unsigned char)p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7f ? '?' : p[i], out);
    fprintf(out, "%s\n", post);
    if (col <= 0)
        return;
    fprintf(out, "      | %s", *pre ? "   " : "");
    for (size_t i = from; i < at && i < to; i += char_bytes(p + i, to - i))
        if (p[i] == '\t')
            fputc('\t', out);
        else
            for (int k = char_cells(p + i, to - i); k > 0; k--)
                fputc(' ', out);
    fputs("^\n", out);
}

/* A message is one line of text: control bytes (a newline too: a name
 * read from a file could forge a line of its own) and bytes that are not
 * UTF-8 are written as \xNN (messages quote names and strings from the
 * files they read, and a damaged file's escape sequences must not reach
 * the terminal). */
static void put_escaped(FILE *out, const char *s)
{
    while (*s) {
        const unsigned char *u = (const unsigned char *)s;
        int n = u[0] < 0x20 && u[0] != '\t' ? 0 : u[0] == 0x7f ? 0 : utf8_char_len(u);
        if (n == 0) {
            fprintf(out, "\\x%02x", u[0]);
            s++;
        } else {
            fwrite(s, 1, (size_t)n, out);
            s += n;
        }
    }
}

void diag_log(Diag *d, const char *text)
{
    FILE *out = d && d->out ? d->out : stderr;
    if (d && (d->silent || d->nerrors > (d->max_errors ? d->max_errors : 50)))
        return;
    for (const char *s = text ? text : ""; *s;) {
        const char *e = strchr(s, '\n');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        char *line = xmalloc(n + 1);
        memcpy(line, s, n);
        line[n] = 0;
        fputs("    ", out);
        put_escaped(out, line);
        fputc('\n', out);
        free(line);
        s += n + (e != NULL);
    }
}

void diag_vreport(Diag *d, const char *kind, const SrcFile *src, int line, int col, const char *fmt, va_list ap)
{
    FILE *out = d && d->out ? d->out : stderr;
    int limit = d && d->max_errors ? d->max_errors : 50;
    bool is_error = strcmp(kind, "error") == 0;
    if (d && is_error) {
        d->nerrors++;
        if (d->nerrors == limit + 1)
            fprintf(out, "megac: too many errors; stopping the report here\n");
        if (d->nerrors > limit)
            return;
    } else if (d && d->nerrors > limit) {
        return;
    }
    if (d && strcmp(kind, "warning") == 0)
        d->nwarnings++;
    if (d && d->silent)
        return;
    put_escaped(out, src && src->path ? src->path : d && d->prog ? d->prog : "megac");
    if (line > 0 && col > 0)
        fprintf(out, ":%d:%d: %s: ", line, col, kind);
    else if (line > 0)
        fprintf(out, ":%d: %s: ", line, kind);
    else
        fprintf(out, ": %s: ", kind);
    va_list aq;
    va_copy(aq, ap);
    int n = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    char *msg = xmalloc(n > 0 ? (size_t)n + 1 : 1);
    vsnprintf(msg, n > 0 ? (size_t)n + 1 : 1, fmt, ap);
    put_escaped(out, msg);
    free(msg);
    fputc('\n', out);
    print_source_line(out, src, line, col);
}

void diag_error(Diag *d, const SrcFile *src, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(d, "error", src, line, col, fmt, ap);
    va_end(ap);
}

void diag_warning(Diag *d, const SrcFile *src, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(d, "warning", src, line, col, fmt, ap);
    va_end(ap);
}

void diag_note(Diag *d, const SrcFile *src, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(d, "note", src, line, col, fmt, ap);
    va_end(ap);
}

void diag_file_error(Diag *d, const char *path, const char *fmt, ...)
{
    SrcFile f = {.path = path};
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(d, "error", &f, 0, 0, fmt, ap);
    va_end(ap);
}

FILE *fopen_read(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    int fl = fcntl(fd, F_GETFL);
    FILE *f = fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

char *read_file(const char *path, size_t *len)
{
    return read_file_max(path, len, SIZE_MAX - 1);
}

char *read_file_max(const char *path, size_t *len, size_t max)
{
    FILE *f = fopen_read(path);
    if (!f)
        return NULL;
    struct stat st = {0};     /* a failed fstat: read as a stream */
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        errno = EISDIR;
        return NULL;
    }
    /* a file, or a pipe or terminal (validate -), or /dev/null (1:3); not
     * /dev/zero or another device, which would be read until memory ran
     * out. ENODEV says so: callers word it "not a regular file (a device)",
     * not strerror's "No such device". */
    if (fstat(fileno(f), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !isatty(fileno(f)) &&
        !(S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3)) {
        fclose(f);
        errno = ENODEV;
        return NULL;
    }
    if (S_ISREG(st.st_mode) && st.st_size > 0 && (uint64_t)st.st_size > max) {
        fclose(f);
        errno = EFBIG;
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap)
            buf = xrealloc(buf, cap *= 2);
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
        if (n > max) {
            free(buf);
            fclose(f);
            errno = EFBIG;
            return NULL;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

bool file_hash_bulk(const char *path, uint64_t *bytes, uint64_t *hash)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO is refused below, not waited on */
    struct stat st;
    if (fd < 0)
        return false;
    int bad = fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : !S_ISREG(st.st_mode) ? ENODEV : 0;
    if (bad) {
        close(fd);
        errno = bad;
        return false;
    }
    size_t n = (size_t)st.st_size;
    void *p = n ? mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    int e = errno;
    close(fd);
    if (n && p == MAP_FAILED) {
        errno = e;
        return false;
    }
    *bytes = n;
    *hash = hash_bulk(p ? p : "", n);
    if (p)
        munmap(p, n);
    return true;
}

bool srcfile_load(SrcFile *f, const char *path)
{
    size_t n;
    char *t = read_file(path, &n);
    if (!t)
        return false;
    f->path = xstrdup(path);
    f->text = t;
    f->len = n;
    return true;
}

void srcfile_free(SrcFile *f)
{
    free((void *)f->path);
    free((void *)f->text);
    memset(f, 0, sizeof *f);
}

int str_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int *row = xmalloc((lb + 1) * sizeof *row);
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int prev = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cur = row[j];
            int sub = prev + (a[i - 1] != b[j - 1]);
            int del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            prev = cur;
        }
    }
    int r = row[lb];
    free(row);
    return r;
}

const char *str_closest(const char *s, const char *const *cands)
{
    const char *best = NULL;
    int bestd = 1 << 30;
    for (const char *const *c = cands; *c; c++) {
        int dd = str_distance(s, *c);
        if (dd < bestd) {
            bestd = dd;
            best = *c;
        }
    }
    int len = (int)strlen(s);
    int limit = len / 3 > 2 ? len / 3 : 2;
    return best && bestd <= limit ? best : NULL;
}
