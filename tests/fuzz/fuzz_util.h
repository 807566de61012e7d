/* Shared by the libFuzzer targets in tests/fuzz (docs/fuzzing.md): a private
 * scratch directory per process, removed at exit, and file helpers. The
 * targets compile the library sources they exercise in (clang + libFuzzer +
 * ASan/UBSan), so they also see the internal headers. */
#ifndef ZERO_FUZZ_UTIL_H
#define ZERO_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checkpoint_internal.h"

static char fz_root[256];

static void fz_cleanup(void)
{
    if (fz_root[0]) ckpt_remove_tree(fz_root);
}

/* The process's scratch directory: in /dev/shm when there is one (the
 * targets write files on every input), else $TMPDIR or /tmp. */
static const char *fz_scratch(void)
{
    if (fz_root[0]) return fz_root;
    struct stat st;
    const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : getenv("TMPDIR");
    snprintf(fz_root, sizeof fz_root, "%s/zero-fuzz-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(fz_root)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fz_cleanup);
    return fz_root;
}

static void fz_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", fz_scratch(), name); }

static void fz_write(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n)) {
        perror(path);
        abort();
    }
    fclose(f);
}

/* Write `text` (a meta object's JSON) as dir/meta.json under a valid
 * checksum when it parses as an object, so inputs reach the checks behind
 * the checksum; else the bytes as they are. */
static void fz_write_meta(const char *dir, const uint8_t *data, size_t n)
{
    char p[600];
    snprintf(p, sizeof p, "%s/meta.json", dir);
    json_t *obj = json_loadb((const char *)data, n, 0, NULL);
    char *text = json_is_object(obj) ? ckpt_meta_dump(obj) : NULL;
    json_decref(obj);
    if (text) fz_write(p, text, strlen(text));
    else fz_write(p, data, n);
    free(text);
}

#endif
