/*
 * half.h - f16 and bf16 to and from f32, bit exact (rounding to nearest
 * even), header-only: the one implementation of the compiler (ir/util.c),
 * the CPU kernel's op bodies (codegen/cpu/kernel_body.c, compiled to
 * bitcode) and the runtime (kv_shift.c), which share no object code.
 */
#ifndef MEGAC_HALF_H
#define MEGAC_HALF_H

#include <stdint.h>
#include <string.h>

static inline float half_f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31, m = h & 0x3ffu, u;
    float f;
    if (e == 0) { /* zero or subnormal: m 2^-24 */
        f = (float)m * 0x1p-24f;
        memcpy(&u, &f, 4);
        u |= s;
    } else {
        u = s | (e == 31 ? 0x7f800000u | m << 13 : (e + 112) << 23 | m << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}

/* A NaN becomes 0x7e00 with its sign (a quiet NaN), an overflow infinity. */
static inline uint16_t half_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, man = u & 0x7fffffu;
    if (exp == 0xffu)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0u));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* a subnormal f16, or zero */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        h += rem > half || (rem == half && (h & 1u));
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    h += rem > 0x1000u || (rem == 0x1000u && (h & 1u)); /* may carry into the exponent: correct */
    return (uint16_t)(sign | h);
}

static inline float half_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A NaN stays a NaN (quieted), the rest round to nearest even. */
static inline uint16_t half_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
