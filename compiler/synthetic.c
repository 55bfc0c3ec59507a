/*
 * synthetic.c - seeded weights at the description's shapes, bit-identical
 * on every machine (only integer arithmetic, exact float operations and
 * one correctly rounded multiply per element).
 *
 * The generator, exactly:
 *  - Each tensor has a 64-bit key: FNV-1a 64 (offset basis
 *    0xcbf29ce484222325, prime 0x100000001b3) over the 8 bytes of
 *    `weights_seed`, little-endian, followed by the bytes of the tensor's
 *    canonical name ("embed", "L0.wq", "L3.w_down", "final_norm",
 *    "lm_head"; no NUL).
 *  - Element i (row-major [out][in]) draws the splitmix64 output number i
 *    from that key: z = key + (i + 1) * 0x9e3779b97f4a7c15;
 *    z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9; z = (z ^ z >> 27) *
 *    0x94d049bb133111eb; z ^= z >> 31.
 *  - u = (float)(z >> 40) * 2^-23 - 1, a multiple of 2^-23 in [-1, 1)
 *    (exact in f32).
 *  - The stored value, by tensor:
 *      embed                      u
 *      wq wk wv w_gate w_up       u * s(dim)
 *      lm_head (untied)           u * s(dim)
 *      wo                         u * s(n_heads*head_dim * 2*n_layers)
 *      w_down                     u * s(hidden_dim * 2*n_layers)
 *      attn_norm ffn_norm final   1 + (0.1f * u)    (two f32 roundings)
 *      bq bk bv                   0.1f * u
 *    where s(n) = (float)(1.0 / sqrt((double)n)) and every product is one
 *    f32 multiply. The extra 1/sqrt(2*n_layers) on the two matrices that
 *    write the residual stream keeps its magnitude near that of the
 *    embedding however deep the model is.
 * The products are written as separate statements so that no compiler
 * contracts them into a fused multiply-add.
 */
#include "compiler/weights_impl.h"

#include <math.h>
#include <string.h>

static uint64_t synthetic_key(uint64_t seed, const char *canon)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(seed >> (8 * i));
    uint64_t h = hash_fnv1a(b, sizeof b, HASH_FNV_INIT);
    return hash_fnv1a(canon, strlen(canon), h);
}

static float splitmix_uniform(uint64_t key, int64_t i)
{
    uint64_t z = key + ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float x = (float)(z >> 40) * 0x1p-23f;
    return x - 1.0f;
}

float synthetic_uniform(uint64_t seed, const char *canon, int64_t i)
{
    return splitmix_uniform(synthetic_key(seed, canon), i);
}

static float synthetic_scale(const ModelDesc *m, WKind k)
{
    double depth = 2.0 * m->n_layers;
    switch (k) {
    case WK_WO: return (float)(1.0 / sqrt((double)m->n_heads * m->head_dim * depth));
    case WK_W_DOWN: return (float)(1.0 / sqrt((double)m->hidden_dim * depth));
    case WK_EMBED: return 1.0f;
    default: return (float)(1.0 / sqrt((double)m->dim));
    }
}

static void synthetic_tensor(const ModelDesc *m, const WSlot *s, uint64_t key)
{
    int64_t n = wslot_nelem(s);
    float *out = s->dst;
    if (s->kind == WK_ATTN_NORM || s->kind == WK_FFN_NORM || s->kind == WK_FINAL_NORM) {
        for (int64_t i = 0; i < n; i++) {
            float t = 0.1f * splitmix_uniform(key, i);
            out[i] = 1.0f + t;
        }
    } else if (s->kind == WK_BQ || s->kind == WK_BK || s->kind == WK_BV) {
        for (int64_t i = 0; i < n; i++)
            out[i] = 0.1f * splitmix_uniform(key, i);
    } else {
        float scale = synthetic_scale(m, s->kind);
        for (int64_t i = 0; i < n; i++)
            out[i] = splitmix_uniform(key, i) * scale;
    }
}

bool synthetic_fill(Weights *w, Diag *d)
{
    Arena scratch = {0};
    int n;
    const WSlot *slots = weights_slots(w, &scratch, &n);
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        char *canon = wslot_canon_name(&scratch, &slots[i]);
        synthetic_tensor(w->m, &slots[i], synthetic_key(w->m->weights_seed, canon));
        ok = weights_slot_done(w, slots[i].kind, slots[i].layer, NULL, d);
    }
    arena_free(&scratch);
    return ok;
}
