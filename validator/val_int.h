/*
 * val_int.h - the validator's internal header, sectioned by the file that
 * defines each prototype: the shared state of one val_schedule_check run,
 * and the passes structure -> deadlock (+ happens-before clocks) -> races.
 */
#ifndef MEGAC_VAL_INT_H
#define MEGAC_VAL_INT_H

#include "validator/validator.h"

/* One run of the validator over one schedule. Instructions are numbered
 * globally: worker w's instruction t is base[w] + t. */
typedef struct Val {
    const Schedule *s;
    const ValOptions *o;
    Diag *d;
    ValResult *r;
    uint32_t nw;            /* workers */
    uint32_t *base;         /* (nw + 1) global index of each worker's first inst */
    uint32_t ntotal;        /* instructions */
    int64_t nseq;           /* positions checked: pos in [0, nseq) */
    uint64_t *ctotal;       /* (nctrs) total increments of each counter */
    /* happens-before: vector clocks, one per wait (shared by the ops that
     * follow it up to the next wait) and one per signal */
    uint32_t *seg;          /* (ntotal) clock of the segment an inst runs in; UINT32_MAX = none */
    uint32_t *pool;         /* clocks, nw entries each: clock[i] = how many of worker i's
                               instructions happen before */
    size_t npool, cappool;  /* in clocks */
} Val;

/* ---- validator.c: reporting ---- */
const Inst *val_inst(const Val *v, uint32_t w, uint32_t t);
int val_col(const Val *v, int line);
void val_error(Val *v, int *counter, int line, const char *fmt, ...) MEGAC_PRINTF(4, 5);
/* val_error at a given column (1-based). */
void val_error_at(Val *v, int *counter, int line, int col, const char *fmt, ...) MEGAC_PRINTF(5, 6);
/* The line of the first `keyword ...` line of the source and, in *col, the
 * column of its `key=` (of the keyword when key is absent); 0 without source. */
int val_key_line(const Val *v, const char *keyword, const char *key, int *col);
void val_note(Val *v, int line, const char *fmt, ...) MEGAC_PRINTF(3, 4);
const char *val_inst_name(const Val *v, uint32_t w, uint32_t t);

/* ---- structure.c ---- */
/* False when references do not resolve (later passes cannot run). */
bool val_structure_check(Val *v);

/* ---- deadlock.c ---- */
/* Runs the abstract execution, reports deadlocks and fills the happens-before
 * clocks. False when the schedule can deadlock. */
bool val_deadlock_check(Val *v);
void val_residency_check(Val *v);
static inline const uint32_t *val_clock(const Val *v, uint32_t id) { return v->pool + (size_t)id * v->nw; }
/* Does instruction (wa, ta) happen before (wb, tb)? */
static inline bool val_hb(const Val *v, uint32_t wa, uint32_t ta, uint32_t wb, uint32_t tb)
{
    if (wa == wb)
        return ta < tb;
    uint32_t id = v->seg[v->base[wb] + tb];
    return id != UINT32_MAX && v->pool[(size_t)id * v->nw + wa] > ta;
}

/* ---- race.c ---- */
void val_race_check(Val *v);

/* ---- affine.c: affine ranges over pos in [0, n) ---- */
/* Smallest pos in [0, n) with a.lo<a.hi, b.lo<b.hi and the two ranges
 * overlapping, or -1 if none. */
int64_t affine_overlap_pos(Affine alo, Affine ahi, Affine blo, Affine bhi, int64_t n);
/* Min of lo and max of hi over pos in [0, n). */
int64_t affine_min(Affine a, int64_t n);
int64_t affine_max(Affine a, int64_t n);
/* Prints `C`, `pos`, `K*pos+C`... into buf. */
const char *affine_str(Affine a, char *buf, size_t n);

#endif
