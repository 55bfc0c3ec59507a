/*
 * cmd_lower.c - `megac lower` (not implemented yet).
 */
#include "compiler/cli.h"

#include <stdio.h>

int cmd_lower(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megac lower: not implemented yet\n");
    return 2;
}
