/*
 * cpu_pack.c - the CPU kernel's byte order for 4-bit weights (packed rows,
 * kernel_table.h): Q4_0, Q4_1 and W4G32 rows regrouped into superblocks of
 * four blocks, headers field by field, nibbles reordered so that a 64-byte
 * load and one AND per nibble give the weights of four blocks without
 * shuffles. Packing is a permutation of a row's bytes and nibbles: no value
 * is converted, rows keep their size and offset (so schedules, access
 * ranges and bundle sizes are those of ir/dtype.h), and unpacking restores
 * the input exactly. The bundle writer packs a CPU bundle's weights; tests
 * that fill a kernel's weights by hand pack them the same way.
 */
#include "codegen/codegen.h"
#include "codegen/cpu/kernel_table.h"

#include <string.h>

bool cg_cpu_weight_packed(DType t, int64_t k)
{
    return kt_row_packed((int)t, k) != 0;
}

/* Nibble e (< 32) of a block in ir/dtype.h's order: byte e % 16, low
 * nibble for e < 16. */
static unsigned nib_get_gguf(const unsigned char *q, int e)
{
    return e < 16 ? q[e] & 15u : (unsigned)q[e - 16] >> 4;
}

/* The byte and shift of element e in the packed order: word e % 4,
 * nibble e / 4. */
static int nib_byte_packed(int e, int *shift)
{
    int n = e / 4;
    *shift = 4 * (n % 2);
    return 4 * (e % 4) + n / 2;
}

static void nib_pack(const unsigned char *in, unsigned char *out)
{
    memset(out, 0, 16);
    for (int e = 0; e < 32; e++) {
        int sh, b = nib_byte_packed(e, &sh);
        out[b] |= (unsigned char)(nib_get_gguf(in, e) << sh);
    }
}

static void nib_unpack(const unsigned char *in, unsigned char *out)
{
    memset(out, 0, 16);
    for (int e = 0; e < 32; e++) {
        int sh, b = nib_byte_packed(e, &sh);
        unsigned v = ((unsigned)in[b] >> sh) & 15u;
        out[e % 16] |= (unsigned char)(e < 16 ? v : v << 4);
    }
}

/* Where the header fields of block i of a superblock of nblk blocks go:
 * field f (d or s: 2 bytes; Q4_1's m: 2; W4G32's z and pad: 1 each) at
 * off[f]. Returns the field count. */
static int block_fields(DType t, int i, int nblk, int off[3], int len[3])
{
    off[0] = 2 * i, len[0] = 2;
    if (t == DT_W4G32) {
        off[1] = 2 * nblk + i, len[1] = 1;
        off[2] = 3 * nblk + i, len[2] = 1;
        return 3;
    }
    off[1] = 2 * nblk + 2 * i, len[1] = 2;
    return t == DT_Q4_1 ? 2 : 1;
}

/* Block record rec (ir/dtype.h) into slot i of superblock sb. */
static void block_pack(DType t, const unsigned char *rec, unsigned char *sb, int i, int nblk)
{
    int off[3], len[3], nf = block_fields(t, i, nblk, off, len), at = 0;
    for (int f = 0; f < nf; at += len[f], f++)
        memcpy(sb + off[f], rec + at, (size_t)len[f]);
    nib_pack(rec + at, sb + at * nblk + 16 * i);
}

static void block_unpack(DType t, const unsigned char *sb, unsigned char *rec, int i, int nblk)
{
    int off[3], len[3], nf = block_fields(t, i, nblk, off, len), at = 0;
    for (int f = 0; f < nf; at += len[f], f++)
        memcpy(rec + at, sb + off[f], (size_t)len[f]);
    nib_unpack(sb + at * nblk + 16 * i, rec + at);
}

/* One row of k elements, packed (pack) or back. */
static void row_convert(DType t, int64_t k, const unsigned char *in, unsigned char *out, bool pack)
{
    int64_t nb = k / 32, bb = dtype_block_bytes(t);
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        int nblk = nb - b0 < 4 ? (int)(nb - b0) : 4;
        for (int i = 0; i < nblk; i++) {
            if (pack)
                block_pack(t, in + (b0 + i) * bb, out + b0 * bb, i, nblk);
            else
                block_unpack(t, in + b0 * bb, out + (b0 + i) * bb, i, nblk);
        }
    }
}

void cg_cpu_weight_pack(DType t, int64_t rows, int64_t k, const unsigned char *in, unsigned char *out)
{
    ASSERT(cg_cpu_weight_packed(t, k));
    size_t rb = dtype_row_bytes(t, k);
    for (int64_t r = 0; r < rows; r++)
        row_convert(t, k, in + (size_t)r * rb, out + (size_t)r * rb, true);
}

void cg_cpu_weight_unpack(DType t, int64_t rows, int64_t k, const unsigned char *in, unsigned char *out)
{
    ASSERT(cg_cpu_weight_packed(t, k));
    size_t rb = dtype_row_bytes(t, k);
    for (int64_t r = 0; r < rows; r++)
        row_convert(t, k, in + (size_t)r * rb, out + (size_t)r * rb, false);
}
