/*
 * cmd_describe.c - `megac describe`: the model description megac reads.
 *
 *   megac describe MODEL [--set key=value]...
 *
 * Loads MODEL as every command does (desc_load: a YAML description, a GGUF
 * file or an HF checkpoint folder), applies the overrides and the
 * consistency checks, and prints the resolved description (desc_print):
 * YAML that megac reads back, with every default spelled out. For a GGUF or
 * an HF folder it shows what megac took from the file.
 */
#include "compiler/cli.h"
#include "runtime/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#define DESCRIBE_MAX_SETS 64

static void describe_usage(FILE *out)
{
    fprintf(out, "usage: megac describe MODEL [--set key=value]...\n\n"
                 "Prints the model description megac reads for MODEL (a description\n"
                 "(.yaml), a GGUF file, an HF checkpoint folder, a llama2.c checkpoint (.bin),\n"
                 "or 'default'), overrides and defaults applied, as YAML megac reads back: for\n"
                 "a GGUF, an HF folder or a checkpoint, what megac took from its metadata,\n"
                 "config.json or header.\n\n"
                 "  --set key=value override a description key (repeatable)\n");
}

int cmd_describe(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        describe_usage(stdout);
        return 0;
    }
    DescOverride set[DESCRIBE_MAX_SETS];
    int nset = 0, rc = 2;
    const char *model = NULL;
    bool ok = true;
    for (int i = 1; ok && i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc)
            ok = cli_set_add("describe", argv[++i], set, &nset, DESCRIBE_MAX_SETS);
        else if (argv[i][0] == '-' || model)
            ok = cli_bad_arg("describe", argv[i], !strcmp(argv[i], "--set"));
        else
            model = argv[i];
    }
    if (ok && !model) {
        fprintf(stderr, "megac describe: no model given\n");
        ok = false;
    }
    if (!ok) {
        describe_usage(stderr);
    } else {
        Arena arena = {0};
        ModelDesc m;
        Diag d;
        diag_init(&d);
        d.prog = "megac describe";
        if (desc_load(&m, &arena, model, set, nset, &d) && desc_check(&m, &d)) {
            desc_print(&m, stdout);
            rc = fflush(stdout) == 0 ? 0 : 2;
            const char *paths[2] = {m.weights_path, m.tok_path};
            for (int i = 0; i < 2; i++)
                if (paths[i] && !tok_utf8_valid(paths[i], strlen(paths[i])) && (i == 0 || !paths[0] || strcmp(paths[0], paths[1])))
                    fprintf(stderr,
                            "megac describe: warning: the path '%s' is not UTF-8, which YAML cannot hold; the "
                            "description will not load back until the file is renamed (megac run and compile "
                            "take the file itself)\n",
                            paths[i]);
        }
        arena_free(&arena);
    }
    cli_sets_free(set, nset);
    return rc;
}
