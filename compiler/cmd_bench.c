/*
 * cmd_bench.c - `megac bench` (not implemented yet).
 */
#include "compiler/cli.h"

#include <stdio.h>

int cmd_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megac bench: not implemented yet\n");
    return 2;
}
