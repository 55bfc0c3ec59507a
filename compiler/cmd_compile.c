/*
 * cmd_compile.c - `megac compile` (not implemented yet).
 */
#include "compiler/cli.h"

#include <stdio.h>

int cmd_compile(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megac compile: not implemented yet\n");
    return 2;
}
