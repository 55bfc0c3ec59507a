/*
 * cmd_doctor.c - `megac doctor` (not implemented yet).
 */
#include "compiler/cli.h"

#include <stdio.h>

int cmd_doctor(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megac doctor: not implemented yet\n");
    return 2;
}
