/*
 * cmd_run.c - `megac run` (not implemented yet).
 */
#include "compiler/cli.h"

#include <stdio.h>

int cmd_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megac run: not implemented yet\n");
    return 2;
}
