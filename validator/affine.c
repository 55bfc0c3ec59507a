/*
 * affine.c - exact reasoning about ranges whose ends are affine in pos.
 *
 * Every question the validator asks about two ranges over pos in [0, n) is
 * a conjunction of strict inequalities A(pos) < B(pos) between affine
 * functions, i.e. (B.k - A.k) * pos + (B.c - A.c) >= 1: each bounds pos
 * from one side, so the set of positions where all hold is an interval
 * [plo, phi] computed with exact integer floor/ceil division.
 */
#include "validator/val_int.h"

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
        q--;
    return q;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return -floor_div(-a, b);
}

/* Narrows [*lo, *hi] to the positions where a(pos) < b(pos). */
static void narrow_less(Affine a, Affine b, int64_t *lo, int64_t *hi)
{
    int64_t k = b.k - a.k, c = b.c - a.c;   /* need k*pos + c >= 1 */
    if (k == 0) {
        if (c < 1)
            *hi = *lo - 1;
    } else if (k > 0) {
        int64_t m = ceil_div(1 - c, k);
        if (m > *lo)
            *lo = m;
    } else {
        int64_t m = floor_div(c - 1, -k);
        if (m < *hi)
            *hi = m;
    }
}

int64_t affine_overlap_pos(Affine alo, Affine ahi, Affine blo, Affine bhi, int64_t n)
{
    int64_t lo = 0, hi = n - 1;
    narrow_less(alo, ahi, &lo, &hi);
    narrow_less(blo, bhi, &lo, &hi);
    narrow_less(alo, bhi, &lo, &hi);
    narrow_less(blo, ahi, &lo, &hi);
    return lo <= hi ? lo : -1;
}

int64_t affine_min(Affine a, int64_t n)
{
    int64_t x = affine_at(a, 0), y = affine_at(a, n - 1);
    return x < y ? x : y;
}

int64_t affine_max(Affine a, int64_t n)
{
    int64_t x = affine_at(a, 0), y = affine_at(a, n - 1);
    return x > y ? x : y;
}

const char *affine_str(Affine a, char *buf, size_t n)
{
    if (a.k == 0)
        snprintf(buf, n, "%lld", (long long)a.c);
    else if (a.c == 0)
        snprintf(buf, n, a.k == 1 ? "pos" : a.k == -1 ? "-pos" : "%lld*pos", (long long)a.k);
    else if (a.k == 1 || a.k == -1)
        snprintf(buf, n, a.k == 1 ? "pos%+lld" : "-pos%+lld", (long long)a.c);
    else
        snprintf(buf, n, "%lld*pos%+lld", (long long)a.k, (long long)a.c);
    return buf;
}
