/*
 * cli.c - what the subcommands share (cli.h): one wording for a bad
 * argument, the check that an output path is not one of the command's
 * inputs, which writing it would destroy, and progress lines while tensors
 * load or are written.
 */
#include "compiler/cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

bool cli_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool cli_bad_arg(const char *cmd, const char *arg, bool needs_value)
{
    if (arg[0] == '-' && arg[1] && needs_value)
        fprintf(stderr, "megac %s: option '%s' needs a value\n", cmd, arg);
    else if (arg[0] == '-' && arg[1])
        fprintf(stderr, "megac %s: unknown option '%s'\n", cmd, arg);
    else
        fprintf(stderr, "megac %s: unexpected argument '%s'\n", cmd, arg);
    return false;
}

bool cli_set_add(const char *cmd, const char *kv, DescOverride *set, int *n, int max)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) {
        fprintf(stderr, "megac %s: --set needs KEY=VALUE (at most %d of them), not '%s'\n", cmd, max, kv);
        return false;
    }
    if (*n >= max) {
        fprintf(stderr, "megac %s: at most %d --set options; '%s' is one too many\n", cmd, max, kv);
        return false;
    }
    set[(*n)++] = (DescOverride){xstrndup(kv, (size_t)(eq - kv)), eq + 1};
    return true;
}

void cli_sets_free(DescOverride *set, int n)
{
    for (int i = 0; i < n; i++)
        free((char *)set[i].key);
}

/* The length of the decimal number at s: [-]digits, then (frac) .digits
 * and (frac) [eE][-+]digits; 0 when s does not start with one. */
static size_t number_span(const char *s, bool frac)
{
    size_t i = s[0] == '-', d = strspn(s + i, "0123456789");
    i += d;
    if (frac && s[i] == '.') {
        size_t f = strspn(s + i + 1, "0123456789");
        if (!d && !f)
            return 0;
        i += 1 + f, d += f;
    }
    if (!d)
        return 0;
    if (frac && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1 + (s[i + 1] == '-' || s[i + 1] == '+'), e = strspn(s + j, "0123456789");
        if (!e)
            return 0;
        i = j + e;
    }
    return i;
}

bool cli_parse_long(const char *s, long lo, long hi, long *out)
{
    size_t n = number_span(s, false);
    if (!n || s[n])
        return false;
    errno = 0;
    long v = strtol(s, NULL, 10);
    if (errno || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool cli_parse_u64(const char *s, uint64_t *out)
{
    size_t n = number_span(s, false);
    if (!n || s[n] || s[0] == '-')
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno)
        return false;
    *out = v;
    return true;
}

bool cli_parse_double(const char *s, double lo, double hi, double *out)
{
    size_t n = number_span(s, true);
    if (!n || s[n])
        return false;
    double v = strtod(s, NULL);
    if (!(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

bool cli_workers_parse(const char *cmd, const char *s, int *out)
{
    long v;
    if (!cli_parse_long(s, 1, MODEL_MAX_WORKERS, &v)) {
        fprintf(stderr, "megac %s: --workers needs a number in 1..%d, not '%s'\n", cmd, MODEL_MAX_WORKERS, s);
        return false;
    }
    *out = (int)v;
    return true;
}

bool cli_out_is_input(const char *cmd, const char *out, const ModelDesc *m)
{
    const char *inputs[5] = {m->path, m->weights_path, m->tok_path, m->arch_path, m->gen_config_path};
    for (int i = 0; i < 5; i++) {
        if (cli_same_file(out, inputs[i])) {
            fprintf(stderr, "megac %s: the output '%s' is the input file '%s'; not overwriting it\n", cmd, out,
                    inputs[i]);
            return true;
        }
    }
    return false;
}

static double cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void cli_progress_line(void *ctx, int done, int total, size_t bytes)
{
    CliProgress *c = ctx;
    double t = cli_now_s();
    if (t - c->t_last < 5.0)
        return;
    c->t_last = t;
    fprintf(stderr, "megac %s: %-20s %8.1f s   %d/%d tensors, %.1f GB %s\n", c->cmd, c->pass, t - c->t0, done, total,
            (double)bytes / 1e9, c->what);
}

WeightsProgress cli_progress(CliProgress *c, const char *cmd, const char *pass, const char *what)
{
    *c = (CliProgress){cmd, pass, what, cli_now_s(), 0};
    c->t_last = c->t0;
    return (WeightsProgress){cli_progress_line, c};
}
