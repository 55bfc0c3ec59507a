/*
 * validator.c - the driver of the static validator and its reporting.
 *
 * Passes, in order (ARCHITECTURE.md §3):
 *   structure  references, op params and footprints, bounds for every pos,
 *              dtypes, buffer classes, waits/signals that cannot make sense
 *   residency  the worker count fits the target (CUDA: co-resident blocks)
 *   deadlock   satisfiable waits, one greedy abstract execution with
 *              monotone counters (decides termination), wait-for cycles for
 *              the report; it also builds the happens-before vector clocks
 *   races      conflicting overlapping accesses from different workers must
 *              be ordered by happens-before; scratch reads must be covered
 *              by writes that happen before them; KV rows written this step
 *              must be written before attention reads them
 * Races are checked only on deadlock-free schedules (happens-before is
 * built from the complete execution) and after a clean structure pass.
 */
#include "validator/val_int.h"

#include <stdlib.h>
#include <string.h>

const Inst *val_inst(const Val *v, uint32_t w, uint32_t t)
{
    return &v->s->workers[w].insts[t];
}

/* Column of the first non-blank character of a line of the .sched text. */
int val_col(const Val *v, int line)
{
    const SrcFile *f = v->o ? v->o->src : NULL;
    if (!f || !f->text || line <= 0)
        return line > 0 ? 1 : 0;
    const char *p = f->text, *end = f->text + f->len;
    for (int l = 1; l < line && p < end; p++)
        if (*p == '\n')
            l++;
    int col = 1;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++, col++;
    return col;
}

static const SrcFile *val_src(const Val *v, SrcFile *tmp)
{
    if (v->o && v->o->src)
        return v->o->src;
    tmp->path = v->s->path ? v->s->path : v->s->name;
    tmp->text = NULL;
    tmp->len = 0;
    return tmp;
}

void val_error(Val *v, int *counter, int line, const char *fmt, ...)
{
    SrcFile tmp;
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(v->d, "error", val_src(v, &tmp), line, val_col(v, line), fmt, ap);
    va_end(ap);
    (*counter)++;
    v->r->nerrors++;
}

void val_error_at(Val *v, int *counter, int line, int col, const char *fmt, ...)
{
    SrcFile tmp;
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(v->d, "error", val_src(v, &tmp), line, line > 0 ? col : 0, fmt, ap);
    va_end(ap);
    (*counter)++;
    v->r->nerrors++;
}

int val_key_line(const Val *v, const char *keyword, const char *key, int *col)
{
    const SrcFile *f = v->o ? v->o->src : NULL;
    *col = 0;
    if (!f || !f->text)
        return 0;
    size_t kw = strlen(keyword), kl = strlen(key);
    int line = 1;
    for (const char *p = f->text, *end = f->text + f->len; p < end; line++) {
        const char *start = p, *eol = memchr(p, '\n', (size_t)(end - p));
        eol = eol ? eol : end;
        while (p < eol && (*p == ' ' || *p == '\t'))
            p++;
        if ((size_t)(eol - p) > kw && strncmp(p, keyword, kw) == 0 && p[kw] == ' ') {
            for (const char *q = p + kw; q + kl < eol; q++)
                if (q[-1] == ' ' && strncmp(q, key, kl) == 0 && q[kl] == '=') {
                    *col = (int)(q - start) + 1;
                    return line;
                }
            *col = (int)(p - start) + 1;
            return line;
        }
        p = eol + 1;
    }
    return 0;
}

void val_note(Val *v, int line, const char *fmt, ...)
{
    SrcFile tmp;
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(v->d, "note", val_src(v, &tmp), line, val_col(v, line), fmt, ap);
    va_end(ap);
}

/* "op gemv", "signal c", "wait c" for messages. */
const char *val_inst_name(const Val *v, uint32_t w, uint32_t t)
{
    static char buf[4][96];
    static int k;
    char *b = buf[k++ & 3];
    const Inst *in = val_inst(v, w, t);
    if (in->kind == INST_OP)
        snprintf(b, 96, "op %s", in->op < OP_COUNT ? op_info(in->op)->name : "?");
    else
        snprintf(b, 96, "%s %s", in->kind == INST_SIGNAL ? "signal" : "wait",
                 in->counter < v->s->nctrs ? v->s->ctrs[in->counter].name : "?");
    return b;
}

static void val_init(Val *v, const Schedule *s, const ValOptions *o, Diag *d, ValResult *r)
{
    memset(v, 0, sizeof *v);
    v->s = s;
    v->o = o;
    v->d = d;
    v->r = r;
    v->nw = s->nworkers;
    v->base = xcalloc(v->nw + 1, sizeof *v->base);
    for (uint32_t w = 0; w < v->nw; w++)
        v->base[w + 1] = v->base[w] + s->workers[w].ninst;
    v->ntotal = v->base[v->nw];
    v->nseq = s->shape.max_seq > 0 ? s->shape.max_seq : 1;
    v->ctotal = xcalloc(s->nctrs ? s->nctrs : 1, sizeof *v->ctotal);
}

static void val_fini(Val *v)
{
    free(v->base);
    free(v->ctotal);
    free(v->seg);
    free(v->pool);
}

bool val_schedule_check(const Schedule *s, const ValOptions *o, Diag *d, ValResult *r)
{
    static const ValOptions none;
    ValResult local;
    Val v;
    if (!r)
        r = &local;
    memset(r, 0, sizeof *r);
    val_init(&v, s, o ? o : &none, d, r);
    if (val_structure_check(&v)) {
        val_residency_check(&v);
        if (val_deadlock_check(&v) && r->nstructure == 0)
            val_race_check(&v);
    }
    val_fini(&v);
    return r->nerrors == 0;
}
