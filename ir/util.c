/*
 * util.c - fatal errors, checked allocation, arena, hashing, f16/bf16.
 */
#include "ir/util.h"
#include "runtime/half.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void die_at(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "megac: internal error at %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        die("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        die("out of memory reallocating %zu bytes", n);
    return p;
}

char *xstrdup(const char *s)
{
    return xstrndup(s, strlen(s));
}

char *xstrndup(const char *s, size_t n)
{
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *xasprintf(const char *fmt, ...)
{
    va_list ap, aq;
    va_start(ap, fmt);
    va_copy(aq, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)      /* 2 GiB or more of text: callers bound what they format */
        die("xasprintf: cannot format \"%s\" (%s)", fmt, strerror(errno));
    char *p = xmalloc((size_t)n + 1);
    vsnprintf(p, (size_t)n + 1, fmt, aq);
    va_end(aq);
    return p;
}

/* ---- arena ---- */

struct ArenaBlock {
    ArenaBlock *next;
    size_t cap, off;
    _Alignas(16) unsigned char data[];
};

void *arena_alloc(Arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    ArenaBlock *b = a->head;
    if (!b || b->off + n > b->cap) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        b = xmalloc(sizeof *b + cap);
        b->cap = cap;
        b->off = 0;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->off;
    b->off += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *arena_strdup(Arena *a, const char *s)
{
    return arena_strndup(a, s, strlen(s));
}

char *arena_printf(Arena *a, const char *fmt, ...)
{
    va_list ap, aq;
    va_start(ap, fmt);
    va_copy(aq, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = arena_alloc(a, (size_t)n + 1);
    vsnprintf(p, (size_t)n + 1, fmt, aq);
    va_end(aq);
    return p;
}

void arena_free(Arena *a)
{
    ArenaBlock *b = a->head;
    while (b) {
        ArenaBlock *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- hashing ---- */

uint64_t hash_fnv1a(const void *p, size_t n, uint64_t h)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t hash_bulk(const void *p, size_t n)
{
    enum { LANES = 4 };
    const uint64_t k = 0x9e3779b97f4a7c15ull; /* odd: multiplying by it is a bijection */
    const unsigned char *b = p;
    uint64_t h[LANES] = {1, 2, 3, 4};
    size_t i = 0;
    for (; i + 8 * LANES <= n; i += 8 * LANES)
        for (int l = 0; l < LANES; l++) {
            uint64_t w;
            memcpy(&w, b + i + 8 * l, 8);
            h[l] = (h[l] ^ w) * k;
            h[l] ^= h[l] >> 31;
        }
    uint64_t r = hash_fnv1a(b + i, n - i, HASH_FNV_INIT ^ (uint64_t)n);
    for (int l = 0; l < LANES; l++) {
        r = (r ^ h[l]) * k;
        r ^= r >> 31;
    }
    return r;
}

/* ---- f16 / bf16 (runtime/half.h: the kernels' and the runtime's too) ---- */

float f16_to_f32(uint16_t h) { return half_f16_to_f32(h); }
uint16_t f32_to_f16(float f) { return half_f32_to_f16(f); }
float bf16_to_f32(uint16_t h) { return half_bf16_to_f32(h); }
uint16_t f32_to_bf16(float f) { return half_f32_to_bf16(f); }
