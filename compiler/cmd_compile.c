/*
 * cmd_compile.c - `megac compile MODEL.yaml --target T -o NAME.megac/`:
 * parses the options and runs the pass list of driver.c.
 */
#include "codegen/codegen.h"
#include "compiler/cli.h"
#include "compiler/driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void compile_usage(FILE *out)
{
    fprintf(out,
            "usage: megac compile MODEL --target TARGET [options] -o NAME.megac/\n\n"
            "Compiles a model into a bundle: validated schedule, kernel, weights in\n"
            "kernel layout, tokenizer and manifest. MODEL is a description (.yaml), a\n"
            "GGUF file, an HF checkpoint folder (config.json, safetensors,\n"
            "tokenizer.json), a llama2.c checkpoint (.bin, its tok<vocab>.bin or\n"
            "tokenizer.bin beside it), or 'default' for the embedded default model.\n\n"
            "options:\n"
            "  --target T      cpu, host-cuda, sm_80, sm_90 or sm_120 (default cpu)\n"
            "  --workers N     worker count, 1..4096 (default: the description's, else\n"
            "                  the target's)\n"
            "  --set KEY=VAL   override a description key (repeatable), e.g. --set max_seq=256\n"
            "  --cpu NAME      CPU target: host, or an x86-64 level or CPU such as x86-64-v3\n"
            "                  (default: host, this machine's)\n"
            "  -o DIR          the bundle folder (default: NAME.megac from the model's name);\n"
            "                  an existing bundle or empty folder is replaced, any other path refused\n"
            "  -q, --quiet     no progress lines\n\n"
            "A compile holds the stored weights in memory until it writes them, so a\n"
            "model whose stored weights (read from its files' headers first) exceed the\n"
            "memory available, or the free space where the bundle goes, is refused\n"
            "before anything is loaded. Environment: MEGAC_MEMORY_MB sets the memory it\n"
            "may use (default: MemAvailable + SwapFree, within a cgroup's memory.max).\n");
}

/* A --cpu name the CPU code generator knows (cg_cpu_names), checked here
 * so that a misspelt one is a usage error before any work, not a code
 * generation failure after lowering. Without the CPU backend there is
 * nothing to check against (a cpu compile then says why it cannot). */
static bool compile_cpu_check(const char *cpu)
{
    const char *const *names = cg_cpu_names();
    if (!strcmp(cpu, "host") || !strcmp(cpu, "native") || !names[0])
        return true;
    for (int i = 0; names[i]; i++)
        if (!strcmp(cpu, names[i]))
            return true;
    fprintf(stderr, "megac compile: --cpu: unknown CPU '%.64s%s'; use host (this machine's) or one of ", cpu,
            strlen(cpu) > 64 ? "..." : "");
    for (int i = 0; names[i]; i++)
        fprintf(stderr, "%s%s", i ? ", " : "", names[i]);
    fputc('\n', stderr);
    return false;
}

static bool compile_args_parse(int argc, char **argv, CompileOptions *o, Arena *a)
{
    memset(o, 0, sizeof *o);
    o->target = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *x = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(x, "--target") && has)
            o->target = argv[++i];
        else if (!strcmp(x, "--cpu") && has) {
            if (!compile_cpu_check(o->cpu = argv[++i]))
                return false;
        } else if (!strcmp(x, "-o") && has)
            o->out = argv[++i];
        else if (!strcmp(x, "-q") || !strcmp(x, "--quiet"))
            o->quiet = true;
        else if (!strcmp(x, "--workers") && has) {
            if (!cli_workers_parse("compile", argv[++i], &o->workers))
                return false;
        } else if (!strcmp(x, "--set") && has) {
            if (!cli_set_add("compile", argv[++i], o->sets, &o->nsets, DRIVER_MAX_SETS))
                return false;
        } else if (x[0] == '-' || o->model) {
            bool known = !strcmp(x, "--target") || !strcmp(x, "--cpu") || !strcmp(x, "-o") ||
                         !strcmp(x, "--workers") || !strcmp(x, "--set");
            return cli_bad_arg("compile", x, known && !has);
        } else
            o->model = x;
    }
    if (!o->model)
        fprintf(stderr, "megac compile: no model description given\n");
    return o->model != NULL;
}

/* NAME.megac when -o is not given: the model file's base name without its
 * extension (m.yaml, m.gguf), or a checkpoint folder's name. */
static const char *default_out(const char *model, Arena *a)
{
    if (driver_is_default_model(model))
        return "default.megac";
    size_t end = strlen(model);
    while (end > 1 && model[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && model[start - 1] != '/')
        start--;
    struct stat st;
    const char *dot = memrchr(model + start, '.', end - start);
    if (dot && dot != model + start && !(stat(model, &st) == 0 && S_ISDIR(st.st_mode)))
        end = (size_t)(dot - model);
    return arena_printf(a, "%.*s.megac", (int)(end - start), model + start);
}

int cmd_compile(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        compile_usage(stdout);
        return 0;
    }
    Arena a = {0};
    CompileOptions o;
    if (!compile_args_parse(argc, argv, &o, &a)) {
        compile_usage(stderr);
        cli_sets_free(o.sets, o.nsets);
        arena_free(&a);
        return 2;
    }
    if (!o.out)
        o.out = default_out(o.model, &a);
    int rc = driver_compile(&o);
    cli_sets_free(o.sets, o.nsets);
    arena_free(&a);
    return rc;
}
