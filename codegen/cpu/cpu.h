/*
 * cpu.h - internals of the CPU backend (codegen/cpu), sectioned by the file
 * that defines each prototype. The pipeline, in the order cpu_emit.c runs
 * it: cpu_schedule_check -> parse the embedded kernel body bitcode ->
 * cpu_glue_build (tables as constants) -> link -> retarget, internalize ->
 * O3 -> verify -> object file -> `cc -shared` -> kernel.so.
 */
#ifndef MEGAC_CODEGEN_CPU_H
#define MEGAC_CODEGEN_CPU_H

#include "codegen/codegen.h"

#include <llvm-c/Core.h>
#include <stddef.h>

/* Largest k a GEMV with GEMV_NORM may have: the normalized input lives in
 * a stack array of k floats. */
#define CPU_NORM_K_MAX 16384

/* ---- kernel_body_bc.c (generated at build time from kernel_body.c) ---- */
extern const unsigned char cpu_body_bc[];
extern const size_t cpu_body_bc_len;

/* ---- cpu_check.c ---- */
/* Whether the backend can run every instruction of s (dtypes, layout,
 * limits); errors cite the .sched line of the instruction. */
bool cpu_schedule_check(const Schedule *s, Diag *d);

/* ---- cpu_glue.c ---- */
/* The module that defines the instruction table, the per-worker starts,
 * the shape constants and the exported ABI constants (kernel_table.h). */
LLVMModuleRef cpu_glue_build(LLVMContextRef ctx, const Schedule *s);
/* One instruction as the KT_STRIDE words of the table; out is
 * sched_output_bufs(s). */
void cpu_inst_encode(const Schedule *s, const Inst *in, const bool *out, uint64_t *words);

/* ---- cpu_emit.c ---- */
/* bool cg_cpu_compile(...) of codegen.h */

#endif
