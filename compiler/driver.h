/*
 * driver.h - the compile pipeline as a function (cmd_compile.c), shared by
 * `megac compile` and `megac run MODEL.yaml`, which compiles into a cache.
 */
#ifndef MEGAC_DRIVER_H
#define MEGAC_DRIVER_H

#include <stdbool.h>

#include "compiler/model.h"
#include "runtime/megac.h"

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
    bool keep_existing;         /* a bundle that appears at out during the
                                   compile is kept, ours dropped (the cache) */
} CompileOptions;

/* Runs desc_load -> weights_load -> tok_import -> lower_model ->
 * val_schedule_check -> codegen -> bundle_write, printing each pass and its
 * time on stderr. Writes into out.tmp<pid>, renamed onto out at the end;
 * out must be absent, an empty folder or a bundle (replaced). Returns the exit status: 0 written, 1 the validator
 * refused the schedule, 2 bad input or a failed pass. */
int driver_compile(const CompileOptions *o);

/* Removes the folders DIR.tmp<pid> and DIR.old<pid> in parent (for
 * base = DIR; any DIR when base is NULL) that a compile left when it was
 * killed: their process is gone and they hold only bundle files. */
void driver_tmp_sweep(const char *parent, const char *base);

/* Removes a folder a compile wrote, if it holds only bundle files (regular
 * files named as a compile names them); false, touching nothing, if not
 * (true when it is absent). */
bool driver_bundle_remove(const char *dir);

/* Refuses (false, with an error naming the sizes) a model whose stored
 * weights, read from its files' headers, exceed the memory available or
 * the free space of dir (NULL: not checked). `what` says who holds them
 * ("a compile holds the stored weights in memory until it writes them");
 * knobs: the description's quant knobs would make them smaller (the error
 * then names the formats). */
bool driver_weights_fit(const ModelDesc *m, const char *what, const char *dir, bool knobs, Diag *d);

/* True for a model argument that names the embedded default model. */
bool driver_is_default_model(const char *model);

/* A CPU bundle compiled into a folder of its own under $TMPDIR (else /tmp)
 * and opened: what eval-quant and eval-kv run a model on with --engine
 * cpu. */
typedef struct DriverTmpBundle {
    megac_model *mm;
    char dir[256], path[288];
} DriverTmpBundle;

/* Compiles `model` with sets[0:nsets] (applied in order) for the cpu,
 * quietly, into $TMPDIR/megac_TAG_XXXXXX/TAG.megac and opens it; false
 * after reporting to d, the folder removed. A SIGINT, SIGTERM or SIGHUP
 * while it is open removes it before the process ends. */
bool driver_tmp_bundle_open(DriverTmpBundle *b, const char *model, const DescOverride *sets, int nsets,
                            const char *tag, Diag *d);
/* Closes the bundle and removes its folder (a zeroed b: nothing). */
void driver_tmp_bundle_close(DriverTmpBundle *b);

#endif
