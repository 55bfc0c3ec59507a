/*
 * cli.c - checks the subcommands share (cli.h): an output path must not be
 * one of the command's inputs, or writing it would destroy the input.
 */
#include "compiler/cli.h"

#include <stdio.h>
#include <sys/stat.h>

bool cli_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool cli_out_is_input(const char *cmd, const char *out, const ModelDesc *m)
{
    const char *inputs[3] = {m->path, m->weights_path, m->tok_path};
    for (int i = 0; i < 3; i++) {
        if (cli_same_file(out, inputs[i])) {
            fprintf(stderr, "megac %s: the output '%s' is the input file '%s'; not overwriting it\n", cmd, out,
                    inputs[i]);
            return true;
        }
    }
    return false;
}
