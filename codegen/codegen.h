/*
 * codegen.h - the backends: a validated Schedule in, a kernel artifact out.
 */
#ifndef MEGAC_CODEGEN_H
#define MEGAC_CODEGEN_H

#include "ir/ir.h"

#endif
