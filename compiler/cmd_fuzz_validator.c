/*
 * cmd_fuzz_validator.c - `megac fuzz-validator` (not implemented yet).
 */
#include "compiler/cli.h"

#include <stdio.h>

int cmd_fuzz_validator(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megac fuzz-validator: not implemented yet\n");
    return 2;
}
