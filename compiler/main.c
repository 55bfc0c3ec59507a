/*
 * main.c - the megac driver: dispatches to a subcommand.
 */
#include "compiler/cli.h"
#include "runtime/kernel_abi.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"doctor", cmd_doctor, "report the toolchain, devices and usable features"},
    {"describe", cmd_describe, "print the model description megac reads (of a .yaml, .gguf, HF folder, .bin)"},
    {"lower", cmd_lower, "lower a model description to a schedule (.sched)"},
    {"validate", cmd_validate, "prove a schedule free of deadlocks and races"},
    {"compile", cmd_compile, "compile a model to a bundle (NAME.megac/)"},
    {"run", cmd_run, "decode text from a model or a bundle"},
    {"bench", cmd_bench, "measure decode speed against the bandwidth ceiling"},
    {"fuzz-validator", cmd_fuzz_validator, "adversarial campaign: validator vs model checker"},
    {"eval-quant", cmd_eval_quant, "fidelity of quantized formats against the unquantized model"},
    {"eval-kv", cmd_eval_kv, "fidelity of sparse attention and KV eviction against dense"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: megac <command> [options]\n\n"
                 "megac compiles a Llama-family model into one persistent megakernel per\n"
                 "decode step (CPU via LLVM, CUDA via NVRTC) and runs it.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-16s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n'megac <command> --help' (or 'megac help <command>') describes a command;\n"
                 "'megac --version' prints the version.\n");
}

bool cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return true;
    }
    return false;
}

/* Warns of each MEGAC_* setting in the environment whose value its reader
 * would not take (they fall back to their defaults there, silently). */
static void env_check(void)
{
    static const struct {
        const char *name, *want;
        double lo, hi; /* the range taken; lo itself is not where open */
        bool open, integer;
    } vars[] = {
        {"MEGAC_CACHE_KEEP", "a count of bundles, 1..100000; 8 is used", 1, 100000, false, true},
        {"MEGAC_VALIDATE_MAX_GB", "a number of gigabytes above 0; 8 is used", 0, INFINITY, true, false},
        {"MEGAC_WATCHDOG_MS", "a number of milliseconds (digits only); the kernel's default deadline is used", 0,
         INFINITY, false, true},
    };
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *e = getenv(vars[i].name);
        if (!e || !*e)
            continue;
        char *end;
        double v = strtod(e, &end);
        bool ok = *end == 0 && (vars[i].open ? v > vars[i].lo : v >= vars[i].lo) && v <= vars[i].hi;
        if (vars[i].integer)
            ok = ok && strspn(e, "0123456789") == strlen(e);
        if (!ok)
            fprintf(stderr, "megac: warning: %s='%.32s' is not %s\n", vars[i].name, e, vars[i].want);
    }
}

int main(int argc, char **argv)
{
    env_check();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("megac %s (kernel ABI %u; `megac doctor` reports the toolchain)\n", MEGAC_VERSION, MEGAC_KERNEL_ABI);
        return 0;
    }
    bool help = !strcmp(argv[1], "help");
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || (help && argc == 2)) {
        usage(stdout);
        return 0;
    }
    if (help && argc > 3) {
        fprintf(stderr, "megac help: one command at a time\n");
        usage(stderr);
        return 2;
    }
    const char *name = argv[help ? 2 : 1];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i].name))
            continue;
        if (!help)
            return commands[i].fn(argc - 1, argv + 1);
        char *args[] = {argv[2], "--help", NULL};
        return commands[i].fn(2, args);
    }
    fprintf(stderr, "megac: unknown command '%s'\n", name);
    usage(stderr);
    return 2;
}
