/*
 * cli.h - the `megac` subcommands. Each lives in its own cmd_*.c file,
 * parses its own options (each has --help) and returns the process exit
 * status: 0 success, 1 a finding (validation failed, test mismatch), 2 bad
 * input or usage.
 */
#ifndef MEGAC_CLI_H
#define MEGAC_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/model.h"

int cmd_doctor(int argc, char **argv);
int cmd_lower(int argc, char **argv);
int cmd_describe(int argc, char **argv);
int cmd_validate(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_fuzz_validator(int argc, char **argv);
int cmd_eval_quant(int argc, char **argv);
int cmd_eval_kv(int argc, char **argv);

/* ---- main.c ---- */
/* True if argv has -h/--help; commands print their usage then. */
bool cli_wants_help(int argc, char **argv);

/* ---- cli.c ---- */
/* Reports a bad argument in the wording every command uses: "option 'X'
 * needs a value" (needs_value: a known option given last), "unknown option
 * 'X'", or "unexpected argument 'X'" for an extra operand. Returns false. */
bool cli_bad_arg(const char *cmd, const char *arg, bool needs_value);
/* How every megac option reads a number, so that all commands take the
 * same spellings: decimal digits with an optional leading '-' (no space,
 * '+', 0x or octal), and for cli_parse_double a fraction and an exponent
 * (no hex floats, inf or nan). Each is false, saying nothing, when s is
 * not such a number or lies outside [lo, hi]. */
bool cli_parse_long(const char *s, long lo, long hi, long *out);
bool cli_parse_u64(const char *s, uint64_t *out);
bool cli_parse_double(const char *s, double lo, double hi, double *out);
/* Parses --workers' value into *out (1..MODEL_MAX_WORKERS, as
 * compile.workers); false after saying so, with the range. */
bool cli_workers_parse(const char *cmd, const char *s, int *out);
/* Adds `--set KEY=VALUE` (kv) to set[*n] (the key xstrndup'd: free it with
 * cli_sets_free); false, after saying so in one wording for every command,
 * when kv has no key or '=' or there are already max. */
bool cli_set_add(const char *cmd, const char *kv, DescOverride *set, int *n, int max);
void cli_sets_free(DescOverride *set, int n);
/* True when both paths exist and are the same file (st_dev and st_ino). */
bool cli_same_file(const char *a, const char *b);
/* True, after saying so on stderr, when the output path `out` is the
 * description m came from or a weight or tokenizer file it names. */
bool cli_out_is_input(const char *cmd, const char *out, const ModelDesc *m);
/* Progress of a long pass that loads or writes tensors (weights_load_ex,
 * bundle_write): the callback prints a line on stderr every 5 s of it,
 * "megac CMD: PASS  T s   DONE/TOTAL tensors, G GB WHAT"; c holds the
 * names and the clock, started now. */
typedef struct CliProgress {
    const char *cmd, *pass, *what;
    double t0, t_last;
} CliProgress;
WeightsProgress cli_progress(CliProgress *c, const char *cmd, const char *pass, const char *what);

#endif
