/*
 * mc_int.h - the model checker's internal header.
 */
#ifndef MEGAC_MC_INT_H
#define MEGAC_MC_INT_H

#include "tools/mc/mc.h"

typedef struct Mc {
    const Schedule *s;
    const McOptions *o;
    McResult *r;
    uint32_t nw;
    uint32_t base[MC_MAX_WORKERS + 1];
    uint32_t ntotal;
    uint32_t *sigpre;       /* ((ntotal + nw) * nctrs) increments by worker w before pc */
    int64_t pos[MC_ALL_POS];
    int npos;
    uint8_t *conf;          /* (ntotal^2) memo: 0 unknown, 1 no conflict, 2 conflict */
    uint8_t *mark;          /* coverage bitmap, largest scratch or output buffer */
    uint8_t *output;        /* per buffer: 1 for an io buffer some op writes */
    uint64_t *set;          /* visited states: open addressing, key + 1 */
    uint64_t setcap, nset;
} Mc;

/* ---- mc_struct.c ---- */
bool mc_fail(Mc *m, bool *flag, const char *fmt, ...) MEGAC_PRINTF(3, 4);
bool mc_structure_check(Mc *m);
bool mc_residency_check(Mc *m);

#endif
