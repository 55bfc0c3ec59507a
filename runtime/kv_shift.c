/*
 * kv_shift.c - a context shift: positions [keep, keep + n) leave the KV
 * cache, the rows after them move down by n, and their keys, rotated by
 * RoPE at their old positions, are turned back by n positions (R(p - n) =
 * R(-n) R(p): the angles are linear in the position), so that the cache
 * holds what decoding the kept tokens at their new positions would have
 * written, up to rounding: a turn in f32 of the stored elements, rounded
 * again to the cache's type. llama.cpp's context shift does the same.
 *
 * The kernel says where its cache is (megac_kv_layout, kernel_abi.h); the
 * backend copies rows between the arena and the host (a device's arena
 * too), so one piece of code serves every backend.
 */
#include "runtime/backend.h"
#include "runtime/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of one cache element of type t (MEGAC_KV_*). */
static size_t kv_elem_bytes(uint64_t t)
{
    return t == MEGAC_KV_F32 ? 4 : 2;
}

megac_status rt_kv_layout_set(megac_model *m, const uint64_t *v, size_t nwords, const char *file)
{
    free(m->kv_layout);
    m->kv_layout = NULL;
    if (!v || nwords < 1 || v[MEGAC_KVL_LAYERS] == 0)
        return MEGAC_OK;                /* no shift: megac_shift says so */
    uint64_t L = v[MEGAC_KVL_LAYERS], heads = 0, rows = 0, hd = 0, bytes = 0, rope = 0;
    const char *bad = NULL;
    if (L > (1u << 20) || nwords < MEGAC_KVL_CACHES + 2 * L)
        bad = "its layer count and its size disagree";
    else if ((heads = v[MEGAC_KVL_HEADS]) < 1 || heads > (1u << 20) || (rows = v[MEGAC_KVL_ROWS]) !=
             (uint64_t)m->man.max_seq || (hd = v[MEGAC_KVL_HEAD_DIM]) < 2 || hd % 2 || hd > (1u << 20))
        bad = "its cache shape is not max_seq rows of an even head_dim";
    else if (v[MEGAC_KVL_ELEM] > MEGAC_KV_BF16 || v[MEGAC_KVL_ROPE_HALF] > 1)
        bad = "an unknown element type or RoPE pairing";
    else if ((rope = v[MEGAC_KVL_ROPE]) > m->weights_len || (m->weights_len - rope) / 4 / hd < rows)
        bad = "its RoPE table lies past weights.bin";
    if (!bad) {
        bytes = heads * hd * kv_elem_bytes(v[MEGAC_KVL_ELEM]);  /* < 2^43: no overflow below */
        for (uint64_t i = 0; i < 2 * L && !bad; i++) {
            uint64_t off = v[MEGAC_KVL_CACHES + i];
            if (off > m->man.arena_bytes || (m->man.arena_bytes - off) / bytes < rows)
                bad = "a layer's cache lies past the arena";
        }
    }
    if (bad)
        return rt_fail(m, MEGAC_ERR_FORMAT, "%s: error: the kernel's KV layout (megac_kv_layout) is malformed: %s",
                       file, bad);
    size_t n = MEGAC_KVL_CACHES + 2 * (size_t)L;
    if (!(m->kv_layout = malloc(n * sizeof *v)))
        return rt_fail(m, MEGAC_ERR_NOMEM, "cannot allocate the KV layout");
    memcpy(m->kv_layout, v, n * sizeof *v);
    return MEGAC_OK;
}

/* ---- the cache's elements, as the kernel's kv_put and kv_at (kernel_body.c) ---- */

static float kv_get(uint64_t t, const unsigned char *p, size_t i)
{
    uint16_t h;
    if (t == MEGAC_KV_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    memcpy(&h, p + 2 * i, 2);
    return t == MEGAC_KV_F16 ? half_f16_to_f32(h) : half_bf16_to_f32(h);
}

static void kv_set(uint64_t t, unsigned char *p, size_t i, float f)
{
    if (t == MEGAC_KV_F32) {
        memcpy(p + 4 * i, &f, 4);
        return;
    }
    uint16_t h = t == MEGAC_KV_F16 ? half_f32_to_f16(f) : half_f32_to_bf16(f);
    memcpy(p + 2 * i, &h, 2);
}

/* Turns the nrows key rows at p (hd elements each) back by the angles of
 * cs (a RoPE table row: hd/2 pairs of cos, sin): R(-n) = R(n)^T. A row
 * scaled by LongRoPE's attention factor is made a unit first: the keys
 * carry that factor once already. */
static void keys_turn(const uint64_t *lay, unsigned char *p, size_t nrows, const float *cs)
{
    uint64_t t = lay[MEGAC_KVL_ELEM];
    size_t hd = (size_t)lay[MEGAC_KVL_HEAD_DIM], half = hd / 2;
    bool halfpair = lay[MEGAC_KVL_ROPE_HALF] != 0;
    for (size_t r = 0; r < nrows; r++, p += hd * kv_elem_bytes(t))
        for (size_t i = 0; i < half; i++) {
            size_t i0 = halfpair ? i : 2 * i, i1 = halfpair ? i + half : 2 * i + 1;
            double g = hypot(cs[2 * i], cs[2 * i + 1]);
            float c = (float)(cs[2 * i] / g), s = (float)(cs[2 * i + 1] / g), x0 = kv_get(t, p, i0),
                  x1 = kv_get(t, p, i1);
            kv_set(t, p, i0, x0 * c + x1 * s);
            kv_set(t, p, i1, x1 * c - x0 * s);
        }
}

megac_status rt_kv_shift(megac_model *m, int keep, int n)
{
    const uint64_t *lay = m->kv_layout;
    size_t hd = (size_t)lay[MEGAC_KVL_HEAD_DIM], rows = (size_t)lay[MEGAC_KVL_ROWS];
    size_t rb = hd * kv_elem_bytes(lay[MEGAC_KVL_ELEM]), moved = (size_t)(m->pos - keep - n);
    if (moved == 0 && n == 0)
        return MEGAC_OK;
    /* the table's row n (n < rows where a row moves): cos, sin of n times
     * each pair's frequency */
    const float *cs = moved ? (const float *)((const char *)m->weights + lay[MEGAC_KVL_ROPE]) + (size_t)n * hd : NULL;
    size_t bytes = (moved > (size_t)n ? moved : (size_t)n) * rb + 1;
    unsigned char *buf = malloc(bytes);
    if (!buf)
        return rt_fail(m, MEGAC_ERR_NOMEM, "megac_shift: cannot allocate %zu bytes", bytes);
    megac_status st = MEGAC_OK;
    for (uint64_t c = 0; c < 2 * lay[MEGAC_KVL_LAYERS] && !st; c++) /* each layer's k cache, then its v cache */
        for (uint64_t h = 0; h < lay[MEGAC_KVL_HEADS] && !st; h++) {
            uint64_t base = lay[MEGAC_KVL_CACHES + c] + h * rows * rb;
            /* rows [keep + n, pos) to [keep, pos - n); the n rows past them are
             * zeroed as a reset leaves them (a step writes its row before any
             * read of it) */
            st = m->be->arena_copy(m, base + (size_t)(keep + n) * rb, buf, moved * rb, false);
            if (!st && c % 2 == 0)
                keys_turn(lay, buf, moved, cs);
            if (!st)
                st = m->be->arena_copy(m, base + (size_t)keep * rb, buf, moved * rb, true);
            memset(buf, 0, (size_t)n * rb);
            if (!st)
                st = m->be->arena_copy(m, base + (size_t)(keep + moved) * rb, buf, (size_t)n * rb, true);
        }
    free(buf);
    return st;
}
