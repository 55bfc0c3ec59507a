/*
 * sched_corpus.h - helpers shared by test_validator.c and test_mc.c: list
 * the golden .sched files of a folder and read the `# expect-error:`
 * comments (kinds separated by commas, on the offending line).
 */
#ifndef MEGAC_SCHED_CORPUS_H
#define MEGAC_SCHED_CORPUS_H

#include "ir/ir.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#define CORPUS_MAX 64

typedef struct Expect {
    int line;
    char kind[16];
} Expect;

/* Sorted paths of the .sched files in dir; returns the count. */
static inline int corpus_list(const char *dir, char **out)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d)) && n < CORPUS_MAX;) {
        size_t len = strlen(e->d_name);
        if (len > 6 && strcmp(e->d_name + len - 6, ".sched") == 0)
            out[n++] = xasprintf("%s/%s", dir, e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(out[j], out[i]) < 0) {
                char *t = out[i];
                out[i] = out[j];
                out[j] = t;
            }
    return n;
}

/* The (line, kind) pairs of the expect-error comments of text. */
static inline int corpus_expects(const char *text, Expect *out, int max)
{
    int n = 0, line = 1;
    for (const char *p = text; *p; line++) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        const char *m = memmem(p, len, "# expect-error:", 15);
        for (const char *k = m ? m + 15 : NULL; k && k < p + len && n < max;) {
            while (k < p + len && (*k == ' ' || *k == ','))
                k++;
            const char *e = k;
            while (e < p + len && *e != ' ' && *e != ',')
                e++;
            if (e > k) {
                out[n].line = line;
                snprintf(out[n].kind, sizeof out[n].kind, "%.*s", (int)(e - k), k);
                n++;
            }
            k = e < p + len ? e : NULL;
        }
        p = eol ? eol + 1 : p + len;
    }
    return n;
}

#endif
