/*
 * driver.h - the compile pipeline as a function (cmd_compile.c), shared by
 * `megac compile` and `megac run MODEL.yaml`, which compiles into a cache.
 */
#ifndef MEGAC_DRIVER_H
#define MEGAC_DRIVER_H

#include <stdbool.h>

#include "compiler/model.h"

#define DRIVER_MAX_SETS 64

typedef struct CompileOptions {
    const char *model;          /* MODEL.yaml; "default" = the embedded model */
    const char *target;         /* cpu, host-cuda, sm_80, sm_90, sm_120 */
    int workers;                /* 0: the description's, else the target's */
    DescOverride sets[DRIVER_MAX_SETS];
    int nsets;
    const char *cpu;            /* --cpu: an x86-64 level; NULL = this host */
    const char *out;            /* the bundle folder to write */
    bool quiet;                 /* no progress lines */
} CompileOptions;

/* Runs desc_load -> weights_load -> tok_import -> lower_model ->
 * val_schedule_check -> codegen -> bundle_write, printing each pass and its
 * time on stderr. Returns the exit status: 0 written, 1 the validator
 * refused the schedule, 2 bad input or a failed pass. */
int driver_compile(const CompileOptions *o);

/* True for a model argument that names the embedded default model. */
bool driver_is_default_model(const char *model);

#endif
