/*
 * tmpdir.h - a fresh folder under /tmp for a test, and its removal.
 */
#ifndef MEGAC_TEST_TMPDIR_H
#define MEGAC_TEST_TMPDIR_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A new folder /tmp/megac-<tag>-XXXXXX (malloc'd path). */
static inline char *test_tmp_dir(const char *tag)
{
    char *d = malloc(strlen(tag) + 32);
    cr_assert_not_null(d);
    sprintf(d, "/tmp/megac-%s-XXXXXX", tag);
    cr_assert(mkdtemp(d));
    return d;
}

/* Removes the folder and all it holds, and frees its path. */
static inline void test_rm_rf(char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    free(dir);
}

#endif
