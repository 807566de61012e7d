/* Test helpers: a private temporary directory under $TMPDIR (or /tmp, or a
 * given parent such as /dev/shm), removed with everything in it. */
#ifndef ZERO_TESTS_OFFLOAD_TMPDIR_H
#define ZERO_TESTS_OFFLOAD_TMPDIR_H

#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* parent NULL: $TMPDIR or /tmp. Returns 0 and fills out, or -1. */
static inline int tmpdir_make(const char *parent, char *out, size_t n)
{
    if (!parent) parent = getenv("TMPDIR");
    if (!parent || !*parent) parent = "/tmp";
    snprintf(out, n, "%s/zero-offload-test-XXXXXX", parent);
    return mkdtemp(out) ? 0 : -1;
}

static inline int tmpdir_rm_one_(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void tmpdir_remove(const char *dir)
{
    chmod(dir, 0700);
    nftw(dir, tmpdir_rm_one_, 16, FTW_DEPTH | FTW_PHYS);
}

/* Number of entries in dir other than . and .. */
static inline int tmpdir_count(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

#endif
