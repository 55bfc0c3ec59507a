/*
 * codegen.c - shared helpers of the CPU and CUDA backends.
 */
#include "codegen/codegen.h"
