/*
 * kernel_table.h - the layout of the tables the CPU glue module defines and
 * the kernel body (kernel_body.c) reads. Shared by both so they agree.
 *
 * Every instruction of the schedule is KT_STRIDE 64-bit words in
 * KT_INSTS, workers' lists one after another; worker w owns entries
 * [KT_WSTART[w], KT_WSTART[w+1]). An operand word holds the buffer's byte
 * offset, with KT_ARENA set when it lives in the runtime arena rather than
 * the weights blob; an absent optional operand is KT_NONE. The dtypes word
 * packs each operand's DType in 8 bits (operand i at bits 8*i), and has
 * KT_OUTPUT_ONLY set for an op that a step without outputs skips
 * (sched_output_bufs of ir/ir.h; MegacArgs.flags).
 * The model shape is an array of int64 indexed by KS_*, plus eps as a float.
 */
#ifndef MEGAC_KERNEL_TABLE_H
#define MEGAC_KERNEL_TABLE_H

#include "ir/dtype.h"

#include <stdint.h>

enum {
    KT_KIND,            /* InstKind */
    KT_OP,              /* OpCode */
    KT_COUNTER,
    KT_AMOUNT,
    KT_PARAM,           /* 6 params, sign-extended */
    KT_OPND = KT_PARAM + 6, /* 5 operand words */
    KT_DTYPES = KT_OPND + 5,
    KT_STRIDE = 16
};

#define KT_ARENA (1ull << 63)
#define KT_NONE (~0ull)
#define KT_OUTPUT_ONLY (1ull << 63)

enum {
    KS_DIM,
    KS_HIDDEN_DIM,
    KS_N_LAYERS,
    KS_N_HEADS,
    KS_N_KV_HEADS,
    KS_HEAD_DIM,
    KS_VOCAB,
    KS_MAX_SEQ,
    KS_ROPE_PAIRING,
    KS_COUNT
};

/* Symbols of the glue module (internal after linking). */
#define KT_SYM_INSTS "megac_k_insts"
#define KT_SYM_WSTART "megac_k_wstart"
#define KT_SYM_SHAPE "megac_k_shape"
#define KT_SYM_EPS "megac_k_eps"
#define KT_SYM_NWORKERS "megac_k_nworkers"
/* u32 masks of what the schedule uses: bit o for opcode o, bit t for an
 * operand of dtype t (tests of them fold at O3: unused bodies are dropped) */
#define KT_SYM_OPS "megac_k_ops"
#define KT_SYM_DTS "megac_k_dts"

/* The instruction sets the target has, as KT_ISA_* bits: defined by
 * cpu_emit.c (not the glue module: it knows the target) once the target
 * CPU is picked. Kernel bodies that use an instruction set's intrinsics
 * are functions named isa_* with a target attribute, called only under a
 * test of these bits, which folds: the other versions become dead and are
 * deleted before code generation (cpu_emit.c checks). */
#define KT_SYM_ISA "megac_k_isa"
enum {
    KT_ISA_AVX2 = 1,       /* avx2, fma, f16c (x86-64-v3) */
    KT_ISA_AVX512 = 2,     /* avx512f, bw, vl, dq (x86-64-v4) */
    KT_ISA_VNNI512 = 4,    /* avx512vnni, with KT_ISA_AVX512 */
    KT_ISA_AVXVNNI = 8,    /* avx-vnni (VEX vpdpbusd on 256 bits), with KT_ISA_AVX2 */
    KT_ISA_GFNI512 = 16    /* gfni (vgf2p8affineqb on 512 bits), with KT_ISA_VNNI512 */
};
#define KT_ISA_PREFIX "isa_"

/* How the target's memory system wants to be read, as KT_TUNE_* bits:
 * defined by cpu_emit.c beside megac_k_isa (cg_cpu_tune) and folded the
 * same way. */
#define KT_SYM_TUNE "megac_k_tune"
enum {
    /* The GEMV kernels spread their software prefetches over their reads
     * (ws_trickle) for rows of every length and segments of every size.
     * Without it, rows shorter than WS_TRICKLE_K and long segments of
     * short rows leave the stream to the hardware prefetchers, which kept
     * it ahead on AMD Zen 4 and did not on an Intel Xeon (the only Intel
     * CPU measured; kernel_body.c, before ws_trickle). */
    KT_TUNE_TRICKLE_ALL = 1,
    /* The AVX-512 VNNI four-row kernels read a segment of 512 KB or more
     * as far quads, four streams a quarter of it apart (kernel_body.c:
     * seg_far_quads), where the hardware prefetchers followed four
     * adjacent rows poorly (an Intel Xeon). */
    KT_TUNE_FAR_QUADS = 2,
    /* The 256-bit kernels that read a quad's rows one after another (one
     * sequential stream: the int8-input rows of 8-bit and packed 4-bit
     * weights, and the exact-input W8 and Q8_0 rows) read a segment of
     * 512 KB or more as far quads too, where two cores read four streams
     * each faster than one (AMD Zen 3). MEGAC_CPU_TUNE=N at compile time
     * (developers) builds with the bits N instead of the CPU's. */
    KT_TUNE_FAR_SEQ = 4
};

/* Packed 4-bit rows. The CPU kernel reads Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL
 * and W4G32 (and W4A8G32: the same bytes) weights
 * with k % 32 == 0 (k <= KT_PACK_K_MAX) in its own byte order: every row
 * keeps its size and place, and its blocks of 32 are regrouped into
 * superblocks of 4 blocks (the last one has the nb % 4 left over, if any).
 * A superblock of t blocks holds first the blocks' headers, field by
 * field, then their 16 bytes of nibbles, block after block:
 *   Q4_0   f16 d[t];            u8 q[t][16]    (18 t bytes)
 *   Q4_1   f16 d[t]; f16 m[t];  u8 q[t][16]    (20 t bytes)
 *   W4G32  f16 s[t]; u8 z[t]; u8 pad[t] (the record's zero byte); u8 q[t][16]
 *   Q5_0   f16 d[t]; u32 qh[t];             u8 q[t][16]    (22 t bytes)
 *   Q5_1   f16 d[t]; f16 m[t]; u32 qh[t];   u8 q[t][16]    (24 t bytes)
 * and inside a block's 16 bytes, read as four little-endian u32 words,
 * element e = 4 n + i of the block is nibble n (bits 4n..4n+3) of word i.
 * So one 64-byte load puts blocks in groups of four lanes and nibble n of
 * every lane is element 4n + lane % 4: an AND with 15 << 4n and one
 * int-to-float conversion give 16 weights (times 16^n) with no shuffles.
 * Q5's qh keep their order (bit e: element e's fifth bit).
 * IQ4_NL (and IQ4_NLA8) rows are regrouped the same way,
 *   IQ4_NL f16 d[t];            u8 q[t][16]    (18 t bytes)
 * but keep each block's 16 bytes as stored (byte j: elements j and j +
 * 16): their nibbles are looked up in a table, not converted, and their
 * kernels meet them with x reordered once per op (kernel_body.c:
 * iq4_x_prepare), so the regrouping alone, one 64-byte load of nibbles
 * and one 8-byte load of scales per four blocks, is what they gain.
 * Q8_0 and Q8_0A8 rows (k % 32 == 0, k <= KT_PACK_K_MAX) are packed otherwise:
 * the whole row's block scales first, then its blocks' integers,
 *   Q8_0   f16 d[nb];           i8 q[nb][32]    (34 nb bytes)
 * so that a kernel converts a row's scales 16 at a time into floats and
 * broadcasts each from memory, where the stored order has it splat and
 * convert one per block (on Zen 4 the A16 GEMV from L2 ran ~1.2x faster
 * so; docs/performance.md).
 * Values are untouched: packing only moves bytes and nibbles
 * (compiler/quant.c: quant_cpu_pack). */
#define KT_PACK_K_MAX 16384
static inline int kt_row_packed(int t, int64_t k)
{
    return (t == DT_Q4_0 || t == DT_Q4_1 || t == DT_W4G32 || t == DT_W4A8G32 || t == DT_Q4_1A8 || t == DT_Q5_0 ||
            t == DT_Q5_1 || t == DT_Q5_0A8 || t == DT_Q5_1A8 || t == DT_Q4_0A8 || t == DT_Q8_0 || t == DT_Q8_0A8 ||
            t == DT_IQ4_NL || t == DT_IQ4_NLA8) &&
           k > 0 && k % 32 == 0 && k <= KT_PACK_K_MAX;
}

/* MegacAbort.flag values */
#define KT_ABORT_TIMEOUT 1u     /* a wait passed its deadline */
#define KT_ABORT_BAD_POS 2u     /* pos outside [0, max_seq): nothing ran */

#endif
