/*
 * cmd_validate.c - `megac validate` (not implemented yet).
 */
#include "compiler/cli.h"

#include <stdio.h>

int cmd_validate(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megac validate: not implemented yet\n");
    return 2;
}
