/*
 * kernel_table.h - the layout of the tables the CPU glue module defines and
 * the kernel body (kernel_body.c) reads. Shared by both so they agree.
 *
 * Every instruction of the schedule is KT_STRIDE 64-bit words in
 * KT_INSTS, workers' lists one after another; worker w owns entries
 * [KT_WSTART[w], KT_WSTART[w+1]). An operand word holds the buffer's byte
 * offset, with KT_ARENA set when it lives in the runtime arena rather than
 * the weights blob; an absent optional operand is KT_NONE. The dtypes word
 * packs each operand's DType in 8 bits (operand i at bits 8*i).
 * The model shape is an array of int64 indexed by KS_*, plus eps as a float.
 */
#ifndef MEGAC_KERNEL_TABLE_H
#define MEGAC_KERNEL_TABLE_H

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
    KT_ISA_AVXVNNI = 8     /* avx-vnni (VEX vpdpbusd on 256 bits), with KT_ISA_AVX2 */
};
#define KT_ISA_PREFIX "isa_"

/* MegacAbort.flag values */
#define KT_ABORT_TIMEOUT 1u     /* a wait passed its deadline */
#define KT_ABORT_BAD_POS 2u     /* pos outside [0, max_seq): nothing ran */

#endif
