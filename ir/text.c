/*
 * text.c - the .sched text format: printer and parser.
 *
 *   schedule NAME target TARGET workers N
 *   shape dim=D hidden=H layers=L heads=NH kv_heads=NKV head_dim=HD vocab=V max_seq=S eps=E pairing=adjacent|half
 *   buffer NAME DTYPE [D0, D1, ...] CLASS          (CLASS: weight state kv scratch io)
 *   counter NAME
 *   worker 0
 *     op NAME(p=V, ...) operand: MODE BUF[LO:HI], ..., optional: -
 *     signal COUNTER +K
 *     wait COUNTER >= N
 *   worker 1
 *   ...
 *
 * `#` starts a comment that runs to the end of the line; indentation and
 * blank lines are cosmetic. Header lines come in that order, buffers and
 * counters before the first worker, workers in order 0..N-1. An op lists
 * every param and every operand of ops.h in order; gemv's flags are written
 * `0` or `accum|norm|bias`. LO and HI are affine in `pos`, printed as `C`,
 * `pos`, `K*pos`, `K*pos+C` or `K*pos-C`; the parser also takes `C+K*pos`.
 *
 * The printer writes buffers, then counters, then workers, so that
 * print(parse(x)) == x for every canonical file. Parse errors are collected
 * as path:line:col with the source line and a caret.
 */
#include "ir/ir.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- printer ---- */

static void print_affine(FILE *out, Affine a)
{
    if (a.k == 0) {
        fprintf(out, "%" PRId64, a.c);
        return;
    }
    if (a.k == 1)
        fputs("pos", out);
    else if (a.k == -1)
        fputs("-pos", out);
    else
        fprintf(out, "%" PRId64 "*pos", a.k);
    if (a.c > 0)
        fprintf(out, "+%" PRId64, a.c);
    else if (a.c < 0)
        fprintf(out, "%" PRId64, a.c);
}

/* The shortest %g form that reads back as the same double. */
static void print_double(FILE *out, double v)
{
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    fputs(buf, out);
}

static const char *const flag_names[] = {"accum", "norm", "bias"};

static void print_flags(FILE *out, int32_t fl)
{
    if (fl == 0) {
        fputc('0', out);
        return;
    }
    const char *sep = "";
    for (int i = 0; i < 3; i++)
        if (fl & (1 << i)) {
            fprintf(out, "%s%s", sep, flag_names[i]);
            sep = "|";
        }
}

static void print_op(const Schedule *s, const Inst *in, FILE *out)
{
    const OpInfo *oi = op_info(in->op);
    fprintf(out, "  op %s(", oi->name);
    for (int i = 0; i < oi->nparams; i++) {
        fprintf(out, "%s%s=", i ? ", " : "", oi->param[i]);
        if (in->op == OP_GEMV && strcmp(oi->param[i], "flags") == 0)
            print_flags(out, in->p[i]);
        else
            fprintf(out, "%" PRId32, in->p[i]);
    }
    fputc(')', out);
    static const char *const modes[] = {"?", "r", "w", "rw"};
    for (int i = 0; i < oi->noperands; i++) {
        const Access *a = &s->accs[in->acc + (uint32_t)i];
        fprintf(out, "%s %s: ", i ? "," : "", oi->operand[i]);
        if (a->buf == BUF_NONE) {
            fputc('-', out);
            continue;
        }
        ASSERT(a->buf < s->nbufs && a->mode >= ACC_R && a->mode <= ACC_RW);
        fprintf(out, "%s %s[", modes[a->mode], s->bufs[a->buf].name);
        print_affine(out, a->lo);
        fputc(':', out);
        print_affine(out, a->hi);
        fputc(']', out);
    }
    fputc('\n', out);
}

static void print_header(const Schedule *s, FILE *out)
{
    const ModelShape *m = &s->shape;
    fprintf(out, "schedule %s target %s workers %u\n", s->name, s->target, s->nworkers);
    fprintf(out, "shape dim=%d hidden=%d layers=%d heads=%d kv_heads=%d head_dim=%d vocab=%d max_seq=%d eps=",
            m->dim, m->hidden_dim, m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim, m->vocab_size, m->max_seq);
    print_double(out, m->norm_eps);
    fprintf(out, " pairing=%s\n", m->rope_pairing ? "half" : "adjacent");
    for (uint32_t i = 0; i < s->nbufs; i++) {
        const Buffer *b = &s->bufs[i];
        fprintf(out, "buffer %s %s [", b->name, dtype_name(b->dtype));
        for (int d = 0; d < b->rank; d++)
            fprintf(out, "%s%" PRId64, d ? ", " : "", b->shape[d]);
        fprintf(out, "] %s\n", bufclass_name(b->cls));
    }
    for (uint32_t i = 0; i < s->nctrs; i++)
        fprintf(out, "counter %s\n", s->ctrs[i].name);
}

void sched_print(const Schedule *s, FILE *out)
{
    print_header(s, out);
    for (uint32_t w = 0; w < s->nworkers; w++) {
        fprintf(out, "worker %u\n", w);
        const Worker *wk = &s->workers[w];
        for (uint32_t i = 0; i < wk->ninst; i++) {
            const Inst *in = &wk->insts[i];
            if (in->kind == INST_OP)
                print_op(s, in, out);
            else if (in->kind == INST_SIGNAL)
                fprintf(out, "  signal %s +%u\n", s->ctrs[in->counter].name, in->amount);
            else
                fprintf(out, "  wait %s >= %u\n", s->ctrs[in->counter].name, in->amount);
        }
    }
}

char *sched_to_string(const Schedule *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        die("open_memstream: %s", strerror(errno));
    sched_print(s, f);
    if (fclose(f) != 0)
        die("open_memstream: %s", strerror(errno));
    return buf;
}

/* ---- parser ---- */

/* Name -> index, open addressing (parsing an 8B schedule resolves ~10^5
 * names). */
typedef struct NameMap {
    const char **key;
    uint32_t *val;
    uint32_t cap, n;
} NameMap;

static uint32_t namemap_slot(const NameMap *m, const char *k, size_t len)
{
    uint32_t h = (uint32_t)hash_fnv1a(k, len, HASH_FNV_INIT) & (m->cap - 1);
    while (m->key[h] && (strncmp(m->key[h], k, len) != 0 || m->key[h][len] != 0))
        h = (h + 1) & (m->cap - 1);
    return h;
}

static void namemap_put(NameMap *m, const char *k, uint32_t v)
{
    if (2 * (m->n + 1) > m->cap) {
        NameMap big = {xcalloc(m->cap ? 2 * m->cap : 64, sizeof *big.key), NULL, m->cap ? 2 * m->cap : 64, 0};
        big.val = xcalloc(big.cap, sizeof *big.val);
        for (uint32_t i = 0; i < m->cap; i++)
            if (m->key[i])
                namemap_put(&big, m->key[i], m->val[i]);
        free(m->key);
        free(m->val);
        *m = big;
    }
    uint32_t h = namemap_slot(m, k, strlen(k));
    if (!m->key[h])
        m->n++;
    m->key[h] = k;
    m->val[h] = v;
}

/* -1 if absent. */
static int64_t namemap_get(const NameMap *m, const char *k, size_t len)
{
    if (!m->cap)
        return -1;
    uint32_t h = namemap_slot(m, k, len);
    return m->key[h] ? (int64_t)m->val[h] : -1;
}

static void namemap_free(NameMap *m)
{
    free(m->key);
    free(m->val);
}

typedef struct Parser {
    SrcFile src;
    Diag *d;
    Schedule *s;
    const char *line;       /* start of the current line */
    const char *end;        /* end of the current line (comment stripped) */
    const char *p;          /* cursor */
    int lineno;
    int state;              /* 0: expect schedule, 1: shape, 2: decls, 3: workers */
    int cur_worker;
    bool failed_line;       /* an error was reported on this line */
    NameMap bufs, ctrs;
} Parser;

static int parser_col(const Parser *ps, const char *at)
{
    return diag_col(ps->line, at);
}

/* Reports at `at` and marks the line failed; returns false. */
static bool parser_error(Parser *ps, const char *at, const char *fmt, ...) MEGAC_PRINTF(3, 4);
static bool parser_error(Parser *ps, const char *at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(ps->d, "error", &ps->src, ps->lineno, parser_col(ps, at), fmt, ap);
    va_end(ap);
    ps->failed_line = true;
    return false;
}

static void parser_skip_space(Parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t'))
        ps->p++;
}

/* Consumes `c` (after spaces) or reports "expected 'c'". */
static bool parser_expect_char(Parser *ps, char c)
{
    parser_skip_space(ps);
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return true;
    }
    return parser_error(ps, ps->p, "expected '%c'", c);
}

static bool parser_accept_char(Parser *ps, char c)
{
    parser_skip_space(ps);
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return true;
    }
    return false;
}

/* name := [A-Za-z_][A-Za-z0-9_.]* ; sets *start and returns its length, or
 * 0 (with an error mentioning `what`). */
static size_t parser_name(Parser *ps, const char **start, const char *what)
{
    parser_skip_space(ps);
    const char *p = ps->p;
    if (p >= ps->end || !(isalpha((unsigned char)*p) || *p == '_')) {
        parser_error(ps, p, "expected %s", what);
        return 0;
    }
    while (p < ps->end && (isalnum((unsigned char)*p) || *p == '_' || *p == '.'))
        p++;
    *start = ps->p;
    size_t n = (size_t)(p - ps->p);
    ps->p = p;
    return n;
}

/* Consumes the keyword `kw` (a whole word). */
static bool parser_keyword(Parser *ps, const char *kw)
{
    parser_skip_space(ps);
    const char *at = ps->p, *w;
    size_t n = parser_name(ps, &w, kw);
    if (!n)
        return false;
    if (n != strlen(kw) || strncmp(w, kw, n) != 0)
        return parser_error(ps, at, "expected '%s'", kw);
    return true;
}

/* The end of the number-like token at p: digits, letters, '.', '_', and a
 * sign after an exponent's e ("1e999", "1.5", "12abc"). */
static const char *number_token_end(const char *p, const char *end)
{
    for (; p < end; p++) {
        bool sign = (*p == '+' || *p == '-') && (p[-1] == 'e' || p[-1] == 'E');
        if (!isalnum((unsigned char)*p) && *p != '.' && *p != '_' && !sign)
            break;
    }
    return p;
}

/* int := [-]digits, in [lo, hi]; digits run into by letters or a '.' (1e999,
 * 1.5) are not an integer. */
static bool parser_int(Parser *ps, int64_t lo, int64_t hi, int64_t *out, const char *what)
{
    parser_skip_space(ps);
    const char *at = ps->p, *p = ps->p;
    if (p < ps->end && *p == '-')
        p++;
    if (p >= ps->end || !isdigit((unsigned char)*p))
        return parser_error(ps, at, "expected %s", what);
    errno = 0;
    char *e;
    long long v = strtoll(at, &e, 10);
    const char *tok = number_token_end(e, ps->end);
    if (tok > e) {
        int n = (int)(tok - at);
        ps->p = tok;
        return parser_error(ps, at, "%s must be an integer in [%" PRId64 ", %" PRId64 "], not '%.*s%s'", what, lo,
                            hi, n > 40 ? 40 : n, at, n > 40 ? "..." : "");
    }
    ps->p = e;
    if (errno == ERANGE || v < lo || v > hi)
        return parser_error(ps, at, "%s out of range [%" PRId64 ", %" PRId64 "]", what, lo, hi);
    *out = v;
    return true;
}

static void parser_skip_line_end(Parser *ps)
{
    parser_skip_space(ps);
    if (ps->p < ps->end)
        parser_error(ps, ps->p, "unexpected text at end of line");
}

/* A word of non-blank characters (schedule and target names may hold '-'). */
static size_t parser_word(Parser *ps, const char **start, const char *what)
{
    parser_skip_space(ps);
    *start = ps->p;
    while (ps->p < ps->end && *ps->p != ' ' && *ps->p != '\t')
        ps->p++;
    size_t n = (size_t)(ps->p - *start);
    if (!n)
        parser_error(ps, *start, "expected %s", what);
    return n;
}

/* schedule NAME target TARGET workers N */
static bool parse_schedule_line(Parser *ps)
{
    const char *name, *tgt;
    size_t nn, nt;
    int64_t w;
    if (!parser_keyword(ps, "schedule") || !(nn = parser_word(ps, &name, "schedule name")) ||
        !parser_keyword(ps, "target") || !(nt = parser_word(ps, &tgt, "target name")))
        return false;
    char *t = xstrndup(tgt, nt);
    bool known = false;
    for (const char *const *k = target_names; *k; k++)
        known |= strcmp(*k, t) == 0;
    if (!known) {
        const char *near = str_closest(t, target_names);
        parser_error(ps, tgt, "unknown target '%.*s'%s%s%s; valid targets: cpu, host-cuda, sm_80, sm_90, sm_120",
                     nt > 64 ? 64 : (int)nt, t, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
        free(t);
        return false;
    }
    if (!parser_keyword(ps, "workers") || !parser_int(ps, 1, 65535, &w, "worker count")) {
        free(t);
        return false;
    }
    char *n = xstrndup(name, nn);
    ps->s = sched_new(n, t, (int)w);
    free(n);
    free(t);
    return true;
}

static const char *const shape_keys[] = {"dim", "hidden", "layers", "heads", "kv_heads",
                                         "head_dim", "vocab", "max_seq", "eps", "pairing"};

/* One `key=value` of the shape line; keys come in shape_keys order. */
static bool parse_shape_item(Parser *ps, int i)
{
    const char *k;
    const char *at = (parser_skip_space(ps), ps->p);
    size_t n = parser_name(ps, &k, shape_keys[i]);
    if (!n)
        return false;
    if (n != strlen(shape_keys[i]) || strncmp(k, shape_keys[i], n) != 0)
        return parser_error(ps, at, "expected shape key '%s'", shape_keys[i]);
    if (!parser_expect_char(ps, '='))
        return false;
    ModelShape *m = &ps->s->shape;
    if (i == 8) {
        parser_skip_space(ps);
        const char *v = ps->p, *tok = v;
        while (tok < ps->end && *tok != ' ' && *tok != '\t')
            tok++;
        char buf[64], *e;
        int vn = (int)(tok - v);
        snprintf(buf, sizeof buf, "%.*s", vn, v);  /* strtod must not read past the line */
        m->norm_eps = strtod(buf, &e);
        if (vn == 0 || vn >= (int)sizeof buf || *e || !isfinite(m->norm_eps) || !(m->norm_eps > 0))
            return parser_error(ps, v, "eps must be a positive finite number, not '%.*s%s'", vn > 40 ? 40 : vn, v,
                                vn > 40 ? "..." : "");
        ps->p = tok;
        return true;
    }
    if (i == 9) {
        const char *v = (parser_skip_space(ps), ps->p);
        size_t vn = parser_name(ps, &v, "pairing");
        if (vn == 8 && strncmp(v, "adjacent", 8) == 0)
            m->rope_pairing = 0;
        else if (vn == 4 && strncmp(v, "half", 4) == 0)
            m->rope_pairing = 1;
        else
            return vn ? parser_error(ps, v, "pairing must be 'adjacent' or 'half'") : false;
        return true;
    }
    int *dst[] = {&m->dim, &m->hidden_dim, &m->n_layers, &m->n_heads, &m->n_kv_heads,
                  &m->head_dim, &m->vocab_size, &m->max_seq};
    int64_t v;
    if (!parser_int(ps, 1, INT32_MAX, &v, shape_keys[i]))
        return false;
    *dst[i] = (int)v;
    return true;
}

static bool parse_shape_line(Parser *ps)
{
    if (!parser_keyword(ps, "shape"))
        return false;
    for (int i = 0; i < 10; i++)
        if (!parse_shape_item(ps, i))
            return false;
    return true;
}

/* buffer NAME DTYPE [D0, D1, ...] CLASS */
static bool parse_buffer_line(Parser *ps)
{
    const char *name, *dt, *cl;
    size_t nn = parser_name(ps, &name, "buffer name");
    if (!nn)
        return false;
    if (namemap_get(&ps->bufs, name, nn) >= 0)
        return parser_error(ps, name, "buffer '%.*s' is declared twice", (int)nn, name);
    size_t nd = parser_name(ps, &dt, "dtype");
    if (!nd)
        return false;
    char *dts = xstrndup(dt, nd);
    int t = dtype_from_name(dts);
    free(dts);
    if (t < 0)
        return parser_error(ps, dt, "unknown dtype '%.*s'", (int)nd, dt);
    int64_t shape[4];
    int rank = 0;
    if (!parser_expect_char(ps, '['))
        return false;
    do {
        if (rank == 4)
            return parser_error(ps, ps->p, "a buffer has at most 4 dimensions");
        if (!parser_int(ps, 1, INT64_C(1) << 40, &shape[rank++], "dimension"))
            return false;
    } while (parser_accept_char(ps, ','));
    if (!parser_expect_char(ps, ']'))
        return false;
    /* Each dimension is at most 2^40, and so is their product: byte sizes
     * and offsets then stay far from int64's range. A buffer that is too
     * large is still declared (as [1]) so that its uses are not errors too. */
    int64_t nelem = 1;
    for (int i = 0; i < rank && nelem; i++)
        nelem = shape[i] > (INT64_C(1) << 40) / nelem ? 0 : nelem * shape[i];
    if (!nelem) {
        parser_error(ps, name, "buffer '%.*s' has too many elements", (int)nn, name);
        rank = 1;
        shape[0] = 1;
    }
    size_t nc = parser_name(ps, &cl, "buffer class");
    if (!nc)
        return false;
    int c = -1;
    for (int i = 0; i < BUF_CLASS_COUNT; i++)
        if (strlen(bufclass_name((BufClass)i)) == nc && strncmp(bufclass_name((BufClass)i), cl, nc) == 0)
            c = i;
    if (c < 0)
        return parser_error(ps, cl, "unknown buffer class '%.*s' (weight, state, kv, scratch, io)", (int)nc, cl);
    char *n = xstrndup(name, nn);
    uint32_t id = sched_add_buffer(ps->s, n, (DType)t, (BufClass)c, rank, shape);
    free(n);
    ps->s->bufs[id].line = ps->lineno;
    namemap_put(&ps->bufs, ps->s->bufs[id].name, id);
    return true;
}

static bool parse_counter_line(Parser *ps)
{
    const char *name;
    size_t nn = parser_name(ps, &name, "counter name");
    if (!nn)
        return false;
    if (namemap_get(&ps->ctrs, name, nn) >= 0)
        return parser_error(ps, name, "counter '%.*s' is declared twice", (int)nn, name);
    char *n = xstrndup(name, nn);
    uint32_t id = sched_add_counter(ps->s, n);
    free(n);
    ps->s->ctrs[id].line = ps->lineno;
    namemap_put(&ps->ctrs, ps->s->ctrs[id].name, id);
    return true;
}

static bool parse_worker_line(Parser *ps)
{
    const char *at = (parser_skip_space(ps), ps->p);
    int64_t w;
    if (!parser_int(ps, 0, INT32_MAX, &w, "worker number"))
        return false;
    if (w != ps->cur_worker + 1 || w >= ps->s->nworkers)
        return parser_error(ps, at, "expected 'worker %d' (workers are numbered 0..%u in order)",
                            ps->cur_worker + 1, ps->s->nworkers - 1);
    ps->cur_worker = (int)w;
    return true;
}

/* counter reference, resolved */
static bool parse_counter_ref(Parser *ps, uint32_t *out)
{
    const char *name;
    size_t n = parser_name(ps, &name, "counter name");
    if (!n)
        return false;
    int64_t id = namemap_get(&ps->ctrs, name, n);
    if (id < 0)
        return parser_error(ps, name, "unknown counter '%.*s'", (int)n, name);
    *out = (uint32_t)id;
    return true;
}

/* signal COUNTER +K  |  wait COUNTER >= N */
static bool parse_sync_line(Parser *ps, bool is_wait)
{
    uint32_t c = 0;
    int64_t v;
    if (!parse_counter_ref(ps, &c))
        return false;
    if (is_wait) {
        if (!parser_expect_char(ps, '>') || !(ps->p < ps->end && *ps->p == '=' ? (ps->p++, true)
                                                                               : parser_error(ps, ps->p, "expected '>='")))
            return false;
    } else if (!parser_expect_char(ps, '+')) {
        return false;
    }
    if (!parser_int(ps, is_wait ? 0 : 1, UINT32_MAX, &v, is_wait ? "threshold" : "increment"))
        return false;
    Inst in = {.kind = (uint8_t)(is_wait ? INST_WAIT : INST_SIGNAL), .counter = c, .amount = (uint32_t)v,
               .line = ps->lineno};
    Worker *wk = &ps->s->workers[ps->cur_worker];
    VEC_PUSH(wk->insts, wk->ninst, wk->cap, in);
    return true;
}

/* affine := term (('+'|'-') term)* ; term := INT | INT '*' 'pos' | 'pos',
 * the first term optionally preceded by '-'. */
/* *acc += v, false when the sum leaves +-2^60 (each term is at most 2^50;
 * the bounds are then far past any buffer, and no sum overflows). */
static bool affine_add(int64_t *acc, int64_t v)
{
    *acc += v;
    return *acc <= (INT64_C(1) << 60) && *acc >= -(INT64_C(1) << 60);
}

static bool parse_affine(Parser *ps, Affine *out)
{
    Affine a = {0, 0};
    int sign = 1;
    parser_skip_space(ps);
    if (ps->p < ps->end && *ps->p == '-') {
        sign = -1;
        ps->p++;
    }
    for (;;) {
        parser_skip_space(ps);
        if (ps->end - ps->p >= 3 && strncmp(ps->p, "pos", 3) == 0 &&
            !(ps->p + 3 < ps->end && (isalnum((unsigned char)ps->p[3]) || ps->p[3] == '_'))) {
            const char *at = ps->p;
            ps->p += 3;
            if (!affine_add(&a.k, sign))
                return parser_error(ps, at, "the range bound's sum of pos terms is too large");
        } else {
            int64_t v;
            if (!parser_int(ps, 0, INT64_C(1) << 50, &v, "a range bound (INT, pos or K*pos)"))
                return false;
            if (parser_accept_char(ps, '*')) {
                parser_skip_space(ps);
                if (!(ps->end - ps->p >= 3 && strncmp(ps->p, "pos", 3) == 0))
                    return parser_error(ps, ps->p, "expected 'pos' after '*'");
                ps->p += 3;
                if (!affine_add(&a.k, sign * v))
                    return parser_error(ps, ps->p - 3, "the range bound's sum of pos terms is too large");
            } else if (!affine_add(&a.c, sign * v)) {
                return parser_error(ps, ps->p, "the range bound's sum of constants is too large");
            }
        }
        if (parser_accept_char(ps, '+'))
            sign = 1;
        else if (parser_accept_char(ps, '-'))
            sign = -1;
        else
            break;
    }
    *out = a;
    return true;
}

/* flags := '0' | NAME ('|' NAME)* with NAME in accum, norm, bias */
static bool parse_flags(Parser *ps, int64_t *out)
{
    parser_skip_space(ps);
    if (ps->p < ps->end && isdigit((unsigned char)*ps->p))
        return parser_int(ps, 0, GEMV_ACCUM | GEMV_NORM | GEMV_BIAS, out, "flags");
    int64_t fl = 0;
    do {
        const char *w;
        size_t n = parser_name(ps, &w, "a flag (accum, norm, bias)");
        if (!n)
            return false;
        int bit = -1;
        for (int i = 0; i < 3; i++)
            if (strlen(flag_names[i]) == n && strncmp(flag_names[i], w, n) == 0)
                bit = 1 << i;
        if (bit < 0 || (fl & bit))
            return parser_error(ps, w, bit < 0 ? "unknown flag '%.*s' (accum, norm, bias)" : "flag '%.*s' given twice",
                                (int)n, w);
        fl |= bit;
    } while (parser_accept_char(ps, '|'));
    *out = fl;
    return true;
}

/* Consumes `expect` as a word followed by `sep`, or reports what was
 * expected there. */
static bool parse_label(Parser *ps, const char *expect, char sep, const char *what)
{
    const char *w;
    const char *at = (parser_skip_space(ps), ps->p);
    size_t n = parser_name(ps, &w, what);
    if (!n)
        return false;
    if (n != strlen(expect) || strncmp(w, expect, n) != 0)
        return parser_error(ps, at, "expected %s '%s', found '%.*s'", what, expect, (int)n, w);
    return parser_expect_char(ps, sep);
}

/* MODE BUF[LO:HI] | '-' */
static bool parse_access(Parser *ps, const OpInfo *oi, int i, Access *a)
{
    parser_skip_space(ps);
    if (ps->p < ps->end && *ps->p == '-') {
        if (!oi->optional[i])
            return parser_error(ps, ps->p, "operand '%s' of %s is not optional", oi->operand[i], oi->name);
        ps->p++;
        *a = (Access){.buf = BUF_NONE};
        return true;
    }
    const char *m, *b;
    size_t nm = parser_name(ps, &m, "access mode (r, w, rw) or '-'");
    if (!nm)
        return false;
    if (nm == 1 && *m == 'r')
        a->mode = ACC_R;
    else if (nm == 1 && *m == 'w')
        a->mode = ACC_W;
    else if (nm == 2 && strncmp(m, "rw", 2) == 0)
        a->mode = ACC_RW;
    else
        return parser_error(ps, m, "access mode must be r, w or rw");
    size_t nb = parser_name(ps, &b, "buffer name");
    if (!nb)
        return false;
    int64_t id = namemap_get(&ps->bufs, b, nb);
    if (id < 0)
        return parser_error(ps, b, "unknown buffer '%.*s'", (int)nb, b);
    a->buf = (uint32_t)id;
    return parser_expect_char(ps, '[') && parse_affine(ps, &a->lo) && parser_expect_char(ps, ':') &&
           parse_affine(ps, &a->hi) && parser_expect_char(ps, ']');
}

/* op NAME(p=V, ...) operand: ACCESS, ... */
static bool parse_op_line(Parser *ps)
{
    const char *name;
    size_t nn = parser_name(ps, &name, "op name");
    if (!nn)
        return false;
    char *ns = xstrndup(name, nn);
    int op = op_from_name(ns);
    free(ns);
    if (op < 0)
        return parser_error(ps, name, "unknown op '%.*s'", (int)nn, name);
    const OpInfo *oi = op_info(op);
    int32_t params[OP_MAX_PARAMS] = {0};
    Access acc[OP_MAX_OPERANDS];
    if (!parser_expect_char(ps, '('))
        return false;
    char names[8 * OP_MAX_PARAMS * 2] = "";
    for (int i = 0; i < oi->nparams; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", oi->param[i]);
    for (int i = 0; i < oi->nparams; i++) {
        int64_t v;
        parser_skip_space(ps);
        if (ps->p < ps->end && *ps->p == ')') /* e.g. a schedule written before a param was added */
            return parser_error(ps, ps->p, "%s takes %d param%s (%s): '%s' is missing", oi->name, oi->nparams,
                                oi->nparams == 1 ? "" : "s", names, oi->param[i]);
        if ((i && !parser_expect_char(ps, ',')) || !parse_label(ps, oi->param[i], '=', "param"))
            return false;
        bool ok = op == OP_GEMV && strcmp(oi->param[i], "flags") == 0 ? parse_flags(ps, &v)
                                                                       : parser_int(ps, INT32_MIN, INT32_MAX, &v, "param value");
        if (!ok)
            return false;
        params[i] = (int32_t)v;
    }
    parser_skip_space(ps);
    if (ps->p < ps->end && *ps->p == ',')
        return parser_error(ps, ps->p, "%s takes %d param%s (%s); this has more", oi->name, oi->nparams,
                            oi->nparams == 1 ? "" : "s", names);
    if (!parser_expect_char(ps, ')'))
        return false;
    for (int i = 0; i < oi->noperands; i++)
        if ((i && !parser_expect_char(ps, ',')) || !parse_label(ps, oi->operand[i], ':', "operand") ||
            !parse_access(ps, oi, i, &acc[i]))
            return false;
    sched_op(ps->s, ps->cur_worker, op, params, acc);
    Worker *wk = &ps->s->workers[ps->cur_worker];
    wk->insts[wk->ninst - 1].line = ps->lineno;
    return true;
}

/* Dispatches one non-blank line by its first word and the parser state. */
static void parse_line(Parser *ps)
{
    if (ps->state == 0) {
        if (parse_schedule_line(ps))
            ps->state = 1;
        return;
    }
    if (ps->state == 1) {
        parse_shape_line(ps);
        ps->state = 2;
        return;
    }
    const char *at = (parser_skip_space(ps), ps->p), *w;
    size_t n = parser_name(ps, &w, "'buffer', 'counter', 'worker', 'op', 'signal' or 'wait'");
    if (!n)
        return;
#define IS(kw) (n == strlen(kw) && strncmp(w, kw, n) == 0)
    if ((IS("buffer") || IS("counter")) && ps->state == 2) {
        IS("buffer") ? parse_buffer_line(ps) : parse_counter_line(ps);
    } else if (IS("worker")) {
        ps->state = 3;
        parse_worker_line(ps);
    } else if ((IS("op") || IS("signal") || IS("wait")) && ps->state == 3 && ps->cur_worker >= 0) {
        IS("op") ? parse_op_line(ps) : parse_sync_line(ps, IS("wait"));
    } else if (IS("buffer") || IS("counter")) {
        parser_error(ps, at, "declarations must come before the first worker");
    } else if (IS("op") || IS("signal") || IS("wait")) {
        parser_error(ps, at, "instruction outside a worker section");
    } else {
        parser_error(ps, at, "expected 'buffer', 'counter', 'worker', 'op', 'signal' or 'wait'");
    }
#undef IS
}

/* Sets ps->line/end to the line at `p` (comment stripped); returns the start
 * of the next line. */
static const char *parser_next_line(Parser *ps, const char *p, const char *eof)
{
    ps->line = ps->p = p;
    const char *e = p;
    while (e < eof && *e != '\n')
        e++;
    const char *c = memchr(p, '#', (size_t)(e - p));
    ps->end = c ? c : e;
    while (ps->end > p && (ps->end[-1] == '\r' || ps->end[-1] == ' ' || ps->end[-1] == '\t'))
        ps->end--;
    return e < eof ? e + 1 : e;
}

Schedule *sched_parse(const char *path, const char *text, size_t len, Diag *d)
{
    Parser ps = {.src = {path, text, len}, .d = d, .cur_worker = -1};
    int errors0 = d->nerrors;
    const char *eof = text + len;
    for (const char *p = text; p < eof;) {
        ps.lineno++;
        p = parser_next_line(&ps, p, eof);
        ps.failed_line = false;
        parser_skip_space(&ps);
        if (ps.p == ps.end)
            continue;
        parse_line(&ps);
        if (!ps.failed_line && ps.state > 0)
            parser_skip_line_end(&ps);
        if (ps.state == 0)  /* no schedule line: nothing else can be read */
            break;
    }
    if (!ps.s && d->nerrors == errors0)
        diag_error(d, &ps.src, ps.lineno > 0 ? ps.lineno : 1, 1, "expected 'schedule NAME target TARGET workers N'");
    else if (ps.s && ps.state < 2 && d->nerrors == errors0)
        diag_error(d, &ps.src, ps.lineno, 1, "expected a 'shape' line");
    else if (ps.s && ps.cur_worker + 1 < (int)ps.s->nworkers && d->nerrors == errors0)
        diag_error(d, &ps.src, ps.lineno, 1, "missing 'worker %d' (the header says workers %u)", ps.cur_worker + 1,
                   ps.s->nworkers);
    namemap_free(&ps.bufs);
    namemap_free(&ps.ctrs);
    if (d->nerrors != errors0) {
        sched_free(ps.s);
        return NULL;
    }
    ps.s->path = arena_strdup(&ps.s->arena, path);
    return ps.s;
}

Schedule *sched_load(const char *path, Diag *d)
{
    SrcFile f;
    if (!srcfile_load(&f, path)) {      /* ENODEV: read_file refused a device such as /dev/zero */
        diag_file_error(d, path, "cannot read: %s", errno == ENODEV ? "not a regular file (a device)" : strerror(errno));
        return NULL;
    }
    Schedule *s = sched_parse(path, f.text, f.len, d);
    srcfile_free(&f);
    return s;
}
