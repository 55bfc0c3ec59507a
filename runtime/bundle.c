/*
 * bundle.c - reads a bundle folder and refuses any set of files that do not
 * belong together.
 *
 * manifest.yaml is flat `key: value` lines (valid YAML, parsed here by hand
 * so the runtime needs no YAML library); `#` starts a comment line. Every
 * key below is required, unknown keys are errors, and numbers are decimal
 * except the hashes (16 hex digits, FNV-1a 64 of the file's bytes;
 * schedule_hash is what the compiler's sched_hash() computes; weights_hash
 * is ir/util's hash_bulk, which `megac validate` checks and opening does
 * not: it would read every byte of a large file on each open):
 *
 *   format: 3                 name: stories260K        target: cpu
 *   kernel: kernel.so         kernel_bytes: N          kernel_hash: 3f0c...
 *   kernel_abi: 2             schedule_hash: 9ae1...   weights_hash: 51d2...
 *   weights_bytes: N          weights_read_bytes: N    arena_bytes: N
 *   counters: N               workers: N               vocab: N
 *   max_seq: N                bos: N                   eos: N
 *   io_tok: OFF               io_logits: OFF           io_next: OFF
 *
 * Checks at open, before any kernel code is loaded: the format version and
 * kernel ABI, and each value's range (workers 1..4096), at the value's
 * manifest.yaml:line:col; the target (runtime.c picks its backend, which finds its
 * device, before any other file is read); bos and eos (-1 or a token id); the io offsets inside the
 * arena; schedule.sched's hash, then the facts its text states (workers,
 * counters, vocab, max_seq) against the manifest; the kernel file's size
 * and hash (a truncated kernel.so crashes dlopen with SIGBUS);
 * weights.bin's size; a tokenizer no larger than the vocabulary. The
 * backend then checks the facts the kernel itself exports
 * (megac_kernel_facts, kernel_abi.h) with rt_facts_check: one table, so
 * each manifest key the kernel depends on is checked the same way.
 */
#include "runtime/backend.h"
#include "runtime/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum { MK_INT, MK_U64, MK_U32, MK_HEX, MK_STR } ManKind;

/* The most workers a bundle may have: MODEL_MAX_WORKERS of the compiler
 * (compiler/model.h), whose --workers and compile.workers stop there. */
#define RT_MAX_WORKERS 4096

typedef struct {
    const char *key;
    ManKind kind;
    size_t off;                 /* offsetof(RtManifest, field) */
    size_t size;                /* MK_STR: buffer size */
    int64_t lo, hi;             /* MK_INT, MK_U32: the values allowed (both 0: any the field holds) */
} ManKey;

#define MK(k, kind, field) {k, kind, offsetof(RtManifest, field), sizeof(((RtManifest *)0)->field), 0, 0}
#define MKR(k, kind, field, lo, hi) {k, kind, offsetof(RtManifest, field), sizeof(((RtManifest *)0)->field), lo, hi}
static const ManKey man_keys[] = {
    MK("format", MK_INT, format),
    MK("name", MK_STR, name),
    MK("target", MK_STR, target),
    MK("kernel", MK_STR, kernel),
    MK("kernel_bytes", MK_U64, kernel_bytes),
    MK("kernel_hash", MK_HEX, kernel_hash),
    MK("kernel_abi", MK_U64, kernel_abi),
    MK("schedule_hash", MK_HEX, schedule_hash),
    MK("weights_bytes", MK_U64, weights_bytes),
    MK("weights_hash", MK_HEX, weights_hash),
    MK("weights_read_bytes", MK_U64, weights_read_bytes),
    MK("arena_bytes", MK_U64, arena_bytes),
    MK("counters", MK_U32, counters),
    MKR("workers", MK_U32, workers, 1, RT_MAX_WORKERS),
    MKR("vocab", MK_INT, vocab, 1, INT32_MAX),
    MKR("max_seq", MK_INT, max_seq, 1, INT32_MAX),
    MK("bos", MK_INT, bos),
    MK("eos", MK_INT, eos),
    MK("io_tok", MK_U64, off_tok),
    MK("io_logits", MK_U64, off_logits),
    MK("io_next", MK_U64, off_next),
};
#undef MK
#undef MKR
enum { NKEYS = sizeof man_keys / sizeof man_keys[0] };

/* The manifest key each of megac_kernel_facts states. */
static const char *const fact_keys[MEGAC_NFACTS] = {
    [MEGAC_FACT_WORKERS] = "workers",
    [MEGAC_FACT_COUNTERS] = "counters",
    [MEGAC_FACT_ARENA_BYTES] = "arena_bytes",
    [MEGAC_FACT_WEIGHTS_BYTES] = "weights_bytes",
    [MEGAC_FACT_VOCAB] = "vocab",
    [MEGAC_FACT_MAX_SEQ] = "max_seq",
    [MEGAC_FACT_IO_TOK] = "io_tok",
    [MEGAC_FACT_IO_LOGITS] = "io_logits",
    [MEGAC_FACT_IO_NEXT] = "io_next",
};
_Static_assert(MEGAC_NFACTS == 9, "fact_keys names a manifest key for every MegacFact");

uint64_t rt_fnv1a(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t rt_watchdog_ns(void)
{
    const char *t = getenv("MEGAC_WATCHDOG_MS");
    if (!t || !*t || strspn(t, "0123456789") != strlen(t))
        return 0;
    uint64_t ms = 0;
    for (; *t && ms <= RT_WATCHDOG_MAX_MS; t++)
        ms = 10 * ms + (uint64_t)(*t - '0');
    return (ms < RT_WATCHDOG_MAX_MS ? ms : RT_WATCHDOG_MAX_MS) * 1000000ull;
}

bool rt_path(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    return n > 0 && (size_t)n < cap;
}

/* Stores value text `v` into the field of `k`; false if it does not parse. */
static bool man_value_set(RtManifest *man, const ManKey *k, const char *v)
{
    char *field = (char *)man + k->off;
    char *end = NULL;
    if (k->kind == MK_STR) {
        size_t n = strlen(v);
        if (n == 0 || n >= k->size)
            return false;
        memcpy(field, v, n + 1);
        return true;
    }
    errno = 0;
    if (k->kind == MK_INT) {    /* bos/eos may be -1 */
        long x = strtol(v, &end, 10);
        if (errno || *end || end == v || x < INT32_MIN || x > INT32_MAX)
            return false;
        *(int *)field = (int)x;
        return true;
    }
    if (*v == '-' || *v == '+')
        return false;
    unsigned long long x = strtoull(v, &end, k->kind == MK_HEX ? 16 : 10);
    if (errno || *end || end == v)
        return false;
    switch (k->kind) {
    case MK_U32:
        if (x > UINT32_MAX)
            return false;
        *(uint32_t *)field = (uint32_t)x;
        return true;
    default:
        *(uint64_t *)field = (uint64_t)x;
        return true;
    }
}

/* Splits one line into key and value (both trimmed, in place); *vcol is
 * the value's column (its opening quote's, for a quoted one). */
static bool man_line_split(char *line, char **key, char **val, int *vcol)
{
    char *colon = strchr(line, ':');
    if (!colon)
        return false;
    *colon = 0;
    char *k = line, *v = colon + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    *vcol = (int)(v - line) + 1;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\r'))
        v[--n] = 0;
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') {
        v[n - 1] = 0;
        v++;
    }
    *key = k;
    *val = v;
    return *k && strspn(k, "abcdefghijklmnopqrstuvwxyz_") == strlen(k);
}

static const ManKey *man_key_find(const char *key)
{
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(man_keys[i].key, key) == 0)
            return &man_keys[i];
    return NULL;
}

/* The value of numeric key k, as a fact (a 64-bit number). */
static uint64_t man_value_get(const RtManifest *man, const ManKey *k)
{
    const char *field = (const char *)man + k->off;
    switch (k->kind) {
    case MK_INT:
        return (uint64_t)(int64_t)*(const int *)field;
    case MK_U32:
        return *(const uint32_t *)field;
    default:
        return *(const uint64_t *)field;
    }
}

megac_status rt_facts_check(megac_model *m, const uint64_t *facts, const char *file, const char *who)
{
    for (int i = 0; i < MEGAC_NFACTS; i++) {
        const ManKey *k = man_key_find(fact_keys[i]);
        uint64_t said = man_value_get(&m->man, k);
        if (facts[i] == MEGAC_FACT_NONE || facts[i] == said)
            continue;
        char said_s[24];
        if (k->kind == MK_INT)
            snprintf(said_s, sizeof said_s, "%" PRId64, (int64_t)said);
        else
            snprintf(said_s, sizeof said_s, "%" PRIu64, said);
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s: error: %s %s %" PRIu64 ", but %s/manifest.yaml says %s: %s"
                       ": the bundle's files do not belong together; recompile it",
                       file, who, k->key, facts[i], m->dir, k->key, said_s);
    }
    return MEGAC_OK;
}

/* What a value of kind k must look like, for "bad value" messages. */
static const char *man_kind_hint(const ManKey *k)
{
    switch (k->kind) {
    case MK_INT:
        return "a decimal integer";
    case MK_U32:
        return "a decimal integer in 0..4294967295";
    case MK_U64:
        return "a decimal integer in 0..18446744073709551615";
    case MK_HEX:
        return "a hexadecimal number of at most 16 digits";
    default:
        return "a non-empty string";
    }
}

/* Where a key's value is in manifest.yaml (line 0: not seen). */
typedef struct {
    int line, col;
} ManPos;

/* Applies line `lineno`, neither blank nor a comment; returns an error
 * message (written into msg) or NULL, with *col the column it is about. */
static const char *man_line_apply(RtManifest *man, ManPos *pos, int lineno, char *line, char *msg, size_t cap,
                                  int *col)
{
    char *key, *val;
    int vcol = 1;
    *col = 1;       /* keys start their line */
    if (!man_line_split(line, &key, &val, &vcol))
        return "expected `key: value` (a lowercase key, a colon, its value)";
    char key_s[80], val_s[160];   /* as messages quote them: control bytes and non-ASCII escaped */
    tok_escape(key, strlen(key), key_s, sizeof key_s);
    tok_escape(val, strlen(val), val_s, sizeof val_s);
    const ManKey *k = man_key_find(key);
    if (!k) {
        snprintf(msg, cap, "unknown key '%s'", key_s);
        return msg;
    }
    ManPos *at = &pos[k - man_keys];
    if (at->line) {
        snprintf(msg, cap, "duplicate key '%s' (first on line %d)", key, at->line);
        return msg;
    }
    *col = vcol;
    int64_t v = 0;
    if (!man_value_set(man, k, val)) {
        if (k->kind == MK_STR && *val)
            snprintf(msg, cap, "bad value '%s' for '%s' (expected a string of at most %zu bytes)", val_s, key,
                     k->size - 1);
        else
            snprintf(msg, cap, "bad value '%s' for '%s' (expected %s)", val_s, key, man_kind_hint(k));
    } else if ((k->lo || k->hi) && ((v = (int64_t)man_value_get(man, k)) < k->lo || v > k->hi)) {
        snprintf(msg, cap, "%s: %" PRId64 " is outside the allowed range %" PRId64 "..%" PRId64, key, v, k->lo,
                 k->hi);
    } else if (k->off == offsetof(RtManifest, format) && man->format != RT_FORMAT_VERSION) {
        snprintf(msg, cap, "bundle format %d, but this runtime reads format %d: recompile the bundle", man->format,
                 RT_FORMAT_VERSION);
    } else {
        *at = (ManPos){lineno, vcol};
        if (k->off == offsetof(RtManifest, target))
            man->target_line = lineno, man->target_col = 1;
        return NULL;
    }
    return msg;
}

/* The position of key's value. */
static ManPos man_pos(const ManPos *pos, const char *key)
{
    return pos[man_key_find(key) - man_keys];
}

/* Writes "path:line:col: error: " and the message into err; returns
 * MEGAC_ERR_FORMAT. */
static megac_status __attribute__((format(printf, 5, 6)))
man_fail(char *err, size_t errlen, const char *path, ManPos at, const char *fmt, ...)
{
    int n = at.line > 0 ? snprintf(err, errlen, "%s:%d:%d: error: ", path, at.line, at.col)
                        : snprintf(err, errlen, "%s: error: ", path);
    if (n >= 0 && (size_t)n < errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return MEGAC_ERR_FORMAT;
}

/* The checks between keys, once all are read: the numbers must describe a
 * model this runtime can drive. Each error points at the value at fault. */
static megac_status man_values_check(const RtManifest *x, const ManPos *pos, const char *path, char *err,
                                     size_t errlen)
{
    if (x->kernel_abi != MEGAC_KERNEL_ABI)
        return man_fail(err, errlen, path, man_pos(pos, "kernel_abi"),
                        "kernel_abi %" PRIu64 ", but this runtime speaks ABI %u: recompile the bundle",
                        x->kernel_abi, MEGAC_KERNEL_ABI);
    for (int i = 0; i < 2; i++) {
        int id = i ? x->eos : x->bos;
        if (id < -1 || id >= x->vocab)
            return man_fail(err, errlen, path, man_pos(pos, i ? "eos" : "bos"),
                            "%s: %d is not -1 or a token id below vocab: %d", i ? "eos" : "bos", id, x->vocab);
    }
    char name[160];
    tok_escape(x->kernel, strlen(x->kernel), name, sizeof name);
    if (strchr(x->kernel, '/') || strcmp(name, x->kernel) != 0)    /* escaped: not printable ASCII, or ' or \\ */
        return man_fail(err, errlen, path, man_pos(pos, "kernel"),
                        "kernel '%s' must name a file in the bundle (printable ASCII, no '/')", name);
    static const char *const io_keys[] = {"io_tok", "io_logits", "io_next"};
    uint64_t off[3] = {x->off_tok, x->off_logits, x->off_next}, len[3] = {4, 4ull * (uint64_t)x->vocab, 4};
    for (int i = 0; i < 3; i++) {
        if (off[i] % 4)
            return man_fail(err, errlen, path, man_pos(pos, io_keys[i]), "%s: %" PRIu64 " is not a multiple of 4",
                            io_keys[i], off[i]);
        if (off[i] > x->arena_bytes || len[i] > x->arena_bytes - off[i])
            return man_fail(err, errlen, path, man_pos(pos, io_keys[i]),
                            "%s: %" PRIu64 ": its %" PRIu64 "-byte io buffer does not fit the arena of %" PRIu64
                            " bytes (arena_bytes)",
                            io_keys[i], off[i], len[i], x->arena_bytes);
    }
    return MEGAC_OK;
}

megac_status rt_manifest_parse(RtManifest *man, const char *path, const char *text, size_t len,
                               char *err, size_t errlen)
{
    memset(man, 0, sizeof *man);
    ManPos pos[NKEYS] = {{0, 0}};
    int lineno = 0;
    for (size_t i = 0, e; i < len; i = e + 1) {
        for (e = i; e < len && text[e] != '\n'; e++)
            ;
        char line[512], msg[640];
        size_t n = e - i;
        lineno++;
        if (n >= sizeof line)
            return man_fail(err, errlen, path, (ManPos){lineno, 1}, "line too long (%zu bytes; at most %zu)", n,
                            sizeof line - 1);
        memcpy(line, text + i, n);
        line[n] = 0;
        if (memchr(line, 0, n))     /* the rest of the line would be lost unseen */
            return man_fail(err, errlen, path, (ManPos){lineno, (int)strlen(line) + 1},
                            "a NUL byte in the line (a manifest is text)");
        if (strspn(line, " \t\r") == n || line[0] == '#')
            continue;
        int col;
        const char *why = man_line_apply(man, pos, lineno, line, msg, sizeof msg, &col);
        if (why)
            return man_fail(err, errlen, path, (ManPos){lineno, col}, "%s", why);
    }
    for (int k = 0; k < NKEYS; k++)
        if (!pos[k].line)
            return man_fail(err, errlen, path, (ManPos){0, 0},
                            "missing key '%s' (a bundle's manifest.yaml has every key; recompile the bundle)",
                            man_keys[k].key);
    return man_values_check(man, pos, path, err, errlen);
}

/* Why a file the bundle names cannot be used as one: NULL for a regular
 * file. A folder, a FIFO or a device (/dev/zero) is not one: its stat size
 * says nothing of its bytes, and reading it would not end. */
static const char *file_kind_error(const struct stat *sb)
{
    if (S_ISREG(sb->st_mode))
        return NULL;
    if (S_ISDIR(sb->st_mode))
        return "not a regular file (a folder)";
    if (S_ISFIFO(sb->st_mode))
        return "not a regular file (a FIFO)";
    return S_ISCHR(sb->st_mode) || S_ISBLK(sb->st_mode) ? "not a regular file (a device)" : "not a regular file";
}


/* ENXIO: what open(O_NONBLOCK) says of a socket. */
static const char *slurp_error(int e)
{
    return e == EINVAL ? "not a regular file" : e == ENXIO ? "not a regular file (a socket)" : strerror(e);
}

static megac_status bundle_manifest_read(megac_model *m)
{
    char path[4096];
    if (!rt_path(path, sizeof path, m->dir, "manifest.yaml"))
        return rt_fail(m, MEGAC_ERR_ARG, "%s: bundle path too long", m->dir);
    size_t len;
    char *text = rt_slurp(path, &len);
    if (!text)
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot read: %s (is %s a megac bundle?)", path,
                       slurp_error(errno), m->dir);
    megac_status st = rt_manifest_parse(&m->man, path, text, len, m->err, sizeof m->err);
    free(text);
    return st;
}

/* The decimal number after `tag` in line l (n bytes), or MEGAC_FACT_NONE. */
static uint64_t sched_line_number(const char *l, size_t n, const char *tag)
{
    char line[512];
    if (n >= sizeof line)
        return MEGAC_FACT_NONE;
    memcpy(line, l, n);
    line[n] = 0;
    const char *at = strstr(line, tag);
    if (!at || at[strlen(tag)] < '0' || at[strlen(tag)] > '9')
        return MEGAC_FACT_NONE;
    return strtoull(at + strlen(tag), NULL, 10);
}

/* The word after " target " in the header line l (n bytes) into out (at
 * most cap - 1 bytes; "" where there is none). */
static void sched_target_word(const char *l, size_t n, char *out, size_t cap)
{
    out[0] = 0;
    for (size_t i = 0; i + 8 < n; i++)
        if (memcmp(l + i, " target ", 8) == 0) {
            size_t s = i + 8, e = s;
            while (e < n && l[e] != ' ')
                e++;
            if (e - s < cap) {
                memcpy(out, l + s, e - s);
                out[e - s] = 0;
            }
            return;
        }
}

/* The name a `counter NAME` line of schedule.sched declares (up to the
 * line's end), or NULL for another line. */
static const char *sched_counter_name(const char *l, size_t n)
{
    return n > 8 && memcmp(l, "counter ", 8) == 0 ? l + 8 : NULL;
}

/* A `buffer NAME DTYPE [DIMS] kv` line's DTYPE into out (at most cap - 1
 * bytes; other lines leave out as it is). */
static void sched_kv_line(const char *l, size_t n, char *out, size_t cap)
{
    const char *end = l + n;
    if (n < 10 || memcmp(l, "buffer ", 7) != 0 || memcmp(end - 3, " kv", 3) != 0)
        return;
    const char *t = memchr(l + 7, ' ', (size_t)(end - l - 7));
    const char *te = t ? memchr(t + 1, ' ', (size_t)(end - t - 1)) : NULL;
    if (te && (size_t)(te - t - 1) < cap) {
        memcpy(out, t + 1, (size_t)(te - t - 1));
        out[te - t - 1] = 0;
    }
}

/* The facts schedule.sched's text states (ir/text.c writes it): the header
 * `schedule NAME target T workers N`, one `counter NAME` line per counter,
 * and `vocab=` and `max_seq=` of the shape line. The arena and io offsets
 * come from the compiler's layout, not the text: only the kernel's own
 * facts state those (for a cubin, once it is loaded on the device). And
 * the KV cache's element type, from its first `kv` buffer (every layer's
 * cache has compile.kv_dtype's), into kv_dtype ("" where there is none),
 * and the header's target into target (the same). */
static void sched_text_facts(const char *text, size_t len, uint64_t *facts, char *kv_dtype, size_t kv_cap,
                             char *target, size_t target_cap)
{
    target[0] = 0;
    uint64_t nctrs = 0;
    bool header = false;
    for (int i = 0; i < MEGAC_NFACTS; i++)
        facts[i] = MEGAC_FACT_NONE;
    kv_dtype[0] = 0;
    for (size_t i = 0, e; i < len; i = e + 1) {
        for (e = i; e < len && text[e] != '\n'; e++)
            ;
        const char *l = text + i;
        size_t n = e - i;
        if (sched_counter_name(l, n))
            nctrs++;
        else if (n > 9 && memcmp(l, "schedule ", 9) == 0) {
            facts[MEGAC_FACT_WORKERS] = sched_line_number(l, n, " workers ");
            sched_target_word(l, n, target, target_cap);
            header = true;
        } else if (n > 6 && memcmp(l, "shape ", 6) == 0) {
            facts[MEGAC_FACT_VOCAB] = sched_line_number(l, n, " vocab=");
            facts[MEGAC_FACT_MAX_SEQ] = sched_line_number(l, n, " max_seq=");
        } else if (!kv_dtype[0]) {
            sched_kv_line(l, n, kv_dtype, kv_cap);
        }
    }
    if (header)
        facts[MEGAC_FACT_COUNTERS] = nctrs;
}

int rt_stage_sums(const char *dir, const uint64_t *v, uint32_t nctrs, RtStageSum *out, int max)
{
    char path[4096];
    size_t len;
    char *text = rt_path(path, sizeof path, dir, "schedule.sched") ? rt_slurp(path, &len) : NULL;
    if (!text)
        return -1;
    uint32_t c = 0;
    int n = 0;
    for (size_t i = 0, e; i < len; i = e + 1) {
        for (e = i; e < len && text[e] != '\n'; e++)
            ;
        const char *name = sched_counter_name(text + i, e - i);
        if (!name)
            continue;
        size_t k = 0;
        while (name + k < text + e && name[k] != '.' && k < sizeof out->name - 1)
            k++;
        int g = 0;
        while (g < n && (strlen(out[g].name) != k || memcmp(out[g].name, name, k) != 0))
            g++;
        if (g == n && n < max) {
            memcpy(out[n].name, name, k);
            out[n].name[k] = 0;
            out[n].sum = 0;
            out[n].nctrs = 0;
            n++;
        }
        if (g < n && c < nctrs) {
            out[g].sum += v[c];
            out[g].nctrs++;
        }
        c++;
    }
    free(text);
    return c == nctrs ? n : -1;
}

/* schedule.sched must be the schedule the manifest was written for, and
 * say what the manifest says. */
static megac_status bundle_schedule_check(megac_model *m)
{
    char path[4096];
    if (!rt_path(path, sizeof path, m->dir, "schedule.sched"))
        return rt_fail(m, MEGAC_ERR_ARG, "%s: bundle path too long", m->dir);
    size_t len;
    char *text = rt_slurp(path, &len);
    if (!text)
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot read: %s", path, slurp_error(errno));
    uint64_t h = rt_fnv1a(text, len), facts[MEGAC_NFACTS];
    char target[sizeof m->man.target];
    sched_text_facts(text, len, facts, m->kv_dtype, sizeof m->kv_dtype, target, sizeof target);
    free(text);
    if (h != m->man.schedule_hash)
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s: error: schedule hash %016" PRIx64 " does not match the manifest's %016" PRIx64
                       " (the schedule was changed after compilation)",
                       path, h, m->man.schedule_hash);
    if (target[0] && strcmp(target, m->man.target) != 0) /* the schedule (and the kernel) made for another target */
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s/manifest.yaml:%d:%d: error: target '%s', but the schedule (and its kernel) was built for "
                       "'%s' (the manifest was edited: recompile the bundle for the target wanted)",
                       m->dir, m->man.target_line, m->man.target_col, m->man.target, target);
    return rt_facts_check(m, facts, path, "the schedule has");
}

/* Whether an ELF image (a kernel.so or a cubin) has its program headers
 * and every PT_LOAD segment's file bytes inside its len bytes: dlopen maps
 * segments as the headers say, and one past the end of the file dies of
 * SIGBUS. */
static bool elf_loads_fit(const unsigned char *b, size_t len)
{
    if (len < 4 || memcmp(b, "\177ELF", 4) != 0)
        return true;
    if (len < 64 || b[4] != 2 || b[5] != 1) /* ELF64, little-endian: what megac writes */
        return false;
    uint64_t phoff;
    uint16_t phentsize, phnum;
    memcpy(&phoff, b + 32, 8);
    memcpy(&phentsize, b + 54, 2);
    memcpy(&phnum, b + 56, 2);
    if (phnum == 0)
        return true;
    if (phentsize < 56 || phoff > len || (uint64_t)phnum * phentsize > len - phoff)
        return false;
    for (uint16_t i = 0; i < phnum; i++) {
        const unsigned char *ph = b + phoff + (uint64_t)i * phentsize;
        uint32_t type;
        uint64_t off, filesz;
        memcpy(&type, ph, 4);
        memcpy(&off, ph + 8, 8);
        memcpy(&filesz, ph + 32, 8);
        if (type == 1 && (off > len || filesz > len - off)) /* PT_LOAD */
            return false;
    }
    return true;
}

/* The kernel file must be the one the manifest was written with, checked
 * before dlopen or cuModuleLoadData see it: dlopen of a truncated .so maps
 * pages past the end of the file and dies of SIGBUS. */
static megac_status bundle_kernel_check(megac_model *m)
{
    char path[4096];
    struct stat sb;
    if (!rt_path(path, sizeof path, m->dir, m->man.kernel))
        return rt_fail(m, MEGAC_ERR_ARG, "%s: bundle path too long", m->dir);
    if (stat(path, &sb) != 0)
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot read the kernel: %s (the manifest's kernel: %s)", path,
                       strerror(errno), m->man.kernel);
    if (file_kind_error(&sb))
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot read the kernel: %s; the manifest's kernel: %s must name the "
                       "kernel file in the bundle", path, file_kind_error(&sb), m->man.kernel);
    if ((uint64_t)sb.st_size != m->man.kernel_bytes)
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s: error: %" PRIu64 " bytes, but the manifest says kernel_bytes: %" PRIu64
                       ": the bundle is damaged; recompile it",
                       path, (uint64_t)sb.st_size, m->man.kernel_bytes);
    size_t len;
    char *bytes = rt_slurp(path, &len);
    if (!bytes)
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot read the kernel: %s", path, slurp_error(errno));
    uint64_t h = rt_fnv1a(bytes, len);
    m->kernel_image = bytes;
    m->kernel_len = len;
    if (h != m->man.kernel_hash)
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s: error: its hash is %016" PRIx64 ", but the manifest says kernel_hash: %016" PRIx64
                       ": the bundle is damaged; recompile it",
                       path, h, m->man.kernel_hash);
    if (len < 4 || memcmp(bytes, "\177ELF", 4) != 0)   /* a kernel.so and a cubin are ELF files */
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s: error: not an ELF file (a kernel.so or a cubin is one: %zu bytes that are not): the "
                       "bundle is damaged; recompile it",
                       path, len);
    if (!elf_loads_fit((const unsigned char *)bytes, len))
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s: error: not a whole ELF file (its headers or a loadable segment end past its %zu "
                       "bytes): the bundle is damaged; recompile it",
                       path, len);
    return MEGAC_OK;
}

/* Weights for a kernel that runs on the host are read into anonymous
 * memory with transparent huge pages asked for, rather than mapped from the
 * file, when they take at most half the free memory (MEGAC_WEIGHTS_MMAP=1
 * maps them always). In a 2-vCPU KVM guest (Intel, 2026-12-05) a mapped
 * file's decode rate depended on where its page-cache pages lay: the same
 * Llama-3.2-1B-shaped Q8_0 bundle decoded at 14.5 tok/s from one copy of
 * weights.bin and 19.6-20.2 from another or after the page cache was
 * dropped, and at 20.0-20.5 read into huge pages; elsewhere the two were
 * alike (SmolLM2 0.97-1.04x, 1B Q4_0 1.02-1.05x, Q8_0 0.98-1.04x). A CUDA
 * bundle's weights are copied to the device once, from the mapping. */
static bool weights_copy_wanted(const megac_model *m)
{
    if (m->check_only || (strcmp(m->man.target, "cpu") != 0 && strcmp(m->man.target, "host-cuda") != 0))
        return false;
    const char *e = getenv("MEGAC_WEIGHTS_MMAP");
    if (e && *e && strcmp(e, "0") != 0)
        return false;
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 && m->weights_len <= (uint64_t)pages * (uint64_t)psz / 2;
}

/* Reads `len` bytes of fd into a new read-only anonymous mapping (*out);
 * *out stays MAP_FAILED where no memory could be mapped (the caller maps
 * the file instead). NULL, or what went wrong reading. */
static const char *weights_copy(int fd, size_t len, void **out)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);     /* advisory: where THP is off, 4 KB pages */
#endif
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)p + got, len - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            const char *err = r < 0 ? strerror(errno) : "the file ended early";
            munmap(p, len);
            return err;
        }
        got += (size_t)r;
    }
    mprotect(p, len, PROT_READ);
    *out = p;
    return NULL;
}

static megac_status bundle_weights_map(megac_model *m)
{
    char path[4096];
    if (!rt_path(path, sizeof path, m->dir, "weights.bin"))
        return rt_fail(m, MEGAC_ERR_ARG, "%s: bundle path too long", m->dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);    /* a FIFO: refused below, not waited on */
    if (fd < 0)
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot open: %s", path, slurp_error(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (file_kind_error(&sb)) {
        close(fd);
        return rt_fail(m, MEGAC_ERR_IO, "%s: cannot read: %s", path, file_kind_error(&sb));
    }
    if ((uint64_t)sb.st_size != m->man.weights_bytes) {
        close(fd);
        return rt_fail(m, MEGAC_ERR_FORMAT,
                       "%s: error: %" PRIu64 " bytes, but the manifest says weights_bytes: %" PRIu64
                       ": the bundle is damaged; recompile it",
                       path, (uint64_t)sb.st_size, m->man.weights_bytes);
    }
    m->weights_len = (size_t)sb.st_size;
    if (m->weights_len == 0) {
        close(fd);
        return MEGAC_OK;
    }
    void *p = MAP_FAILED;
    if (weights_copy_wanted(m)) {
        const char *err = weights_copy(fd, m->weights_len, &p);
        if (err) {
            close(fd);
            return rt_fail(m, MEGAC_ERR_IO, "%s: cannot read: %s", path, err);
        }
        m->weights_copied = p != MAP_FAILED;
    }
    if (p == MAP_FAILED)
        p = mmap(NULL, m->weights_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return rt_fail(m, MEGAC_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    m->weights = p;
    return MEGAC_OK;
}

static megac_status bundle_tokenizer_load(megac_model *m)
{
    char path[4096], err[512];
    if (!rt_path(path, sizeof path, m->dir, "tokenizer.bin"))
        return rt_fail(m, MEGAC_ERR_ARG, "%s: bundle path too long", m->dir);
    struct stat sb;
    if (stat(path, &sb) == 0 && file_kind_error(&sb))  /* a missing file: tok_load says so */
        return rt_fail(m, MEGAC_ERR_FORMAT, "%s: cannot read: %s", path, file_kind_error(&sb));
    m->tok = tok_load(path, err, sizeof err);
    if (!m->tok)
        return rt_fail(m, MEGAC_ERR_FORMAT, "%s", err);
    if (tok_vocab(m->tok) > m->man.vocab)   /* fewer is fine: unused ids (Qwen2.5, byte tokenizers) */
        return rt_fail(m, MEGAC_ERR_FORMAT, "%s: error: %d tokens, more than the model's vocabulary of %d", path,
                       tok_vocab(m->tok), m->man.vocab);
    return MEGAC_OK;
}

megac_status rt_manifest_load(megac_model *m)
{
    return bundle_manifest_read(m);
}

megac_status rt_bundle_load(megac_model *m)
{
    megac_status st;
    if ((st = bundle_schedule_check(m)) || (st = bundle_kernel_check(m)) || (st = bundle_weights_map(m)) ||
        (st = bundle_tokenizer_load(m)))
        return st;
    return MEGAC_OK;
}

megac_status megac_bundle_target(const char *bundle_dir, char *target, size_t cap, int *line, int *col)
{
    rt_loose_clear();
    if (!bundle_dir || !target || cap == 0)
        return rt_loose_fail(MEGAC_ERR_ARG, "megac_bundle_target: %s",
                             !bundle_dir ? "no bundle folder given" : "no room for the target given");
    megac_model *m = calloc(1, sizeof *m);
    if (!m)
        return rt_loose_fail(MEGAC_ERR_NOMEM, "megac_bundle_target: out of memory");
    m->dir = (char *)bundle_dir;
    megac_status st = bundle_manifest_read(m);
    if (st)
        rt_loose_fail(st, "%s", m->err);
    else if (strlen(m->man.target) >= cap)
        st = rt_loose_fail(MEGAC_ERR_ARG, "megac_bundle_target: target '%s' does not fit in %zu bytes",
                           m->man.target, cap);
    else
        memcpy(target, m->man.target, strlen(m->man.target) + 1);
    if (!st && line)
        *line = m->man.target_line;
    if (!st && col)
        *col = m->man.target_col;
    free(m);
    return st;
}

void rt_bundle_unload(megac_model *m)
{
    free(m->kernel_image);
    m->kernel_image = NULL;
    if (m->weights)
        munmap((void *)m->weights, m->weights_len);
    m->weights = NULL;
    if (m->tok)
        tok_free(m->tok);
    m->tok = NULL;
}
