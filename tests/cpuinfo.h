/*
 * cpuinfo.h - what /proc/cpuinfo says of the host, for tests that expect
 * something of it.
 */
#ifndef MEGAC_TEST_CPUINFO_H
#define MEGAC_TEST_CPUINFO_H

#include <stdio.h>
#include <string.h>

/* Whether the first line of /proc/cpuinfo that starts with key holds
 * text: 1 or 0, or -1 when there is no such line (or no file). */
static inline int test_cpuinfo_has(const char *key, const char *text)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int has = -1;
    while (f && has < 0 && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key)))
            has = strstr(line, text) != NULL;
    if (f)
        fclose(f);
    return has;
}

#endif
