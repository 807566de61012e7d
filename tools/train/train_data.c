/* Byte-level corpus and deterministic per-rank batches (see train_data.h). */
#include "train_data.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct train_data {
    uint8_t *bytes;
    uint64_t n_bytes;
    int seq_len;
    uint64_t seed;
    uint64_t n_windows;
    char **files;
    int n_files;
    /* The permutation of the epoch last asked for, regenerated on demand:
     * a pure function of (seed, epoch), so no state needs saving. */
    uint32_t *perm;
    uint64_t perm_epoch;
    int perm_valid;
};

static int data_fail(char *err, size_t n, const char *fmt, ...)
{
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---------------------------------------------------------------- file list */

typedef struct path_list {
    char **items;
    int n, cap;
} path_list;

static int list_push(path_list *l, const char *s)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        char **p = realloc(l->items, (size_t)cap * sizeof *p);
        if (!p) return -1;
        l->items = p;
        l->cap = cap;
    }
    if (!(l->items[l->n] = strdup(s))) return -1;
    l->n++;
    return 0;
}

static void list_free(path_list *l)
{
    for (int i = 0; i < l->n; i++) free(l->items[i]);
    free(l->items);
    memset(l, 0, sizeof *l);
}

static int has_suffix(const char *name, const train_data_config *cfg)
{
    if (!cfg->suffixes || cfg->n_suffixes == 0) return 1;
    size_t ln = strlen(name);
    for (int i = 0; i < cfg->n_suffixes; i++) {
        size_t ls = strlen(cfg->suffixes[i]);
        if (ln >= ls && strcmp(name + ln - ls, cfg->suffixes[i]) == 0) return 1;
    }
    return 0;
}

/* Depth-first walk collecting regular files; symlinks are followed only for
 * files (stat), never into directories, so a link loop cannot trap us. */
static int walk(const char *dir, const train_data_config *cfg, path_list *out, char *err, size_t en)
{
    DIR *d = opendir(dir);
    if (!d) return data_fail(err, en, "data.path: cannot open directory %s: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    char path[4096];
    while (rc == 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "__pycache__") == 0) continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) continue;
        struct stat ls, st;
        if (lstat(path, &ls) != 0) continue;
        if (S_ISDIR(ls.st_mode)) {
            rc = walk(path, cfg, out, err, en);
        } else if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && has_suffix(e->d_name, cfg)) {
            if (list_push(out, path) != 0) rc = data_fail(err, en, "data: out of memory listing files");
        }
    }
    closedir(d);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int read_append(train_data *d, const char *path, uint64_t *cap, uint64_t max_bytes, char *err, size_t en)
{
    FILE *f = fopen(path, "rb");
    if (!f) return data_fail(err, en, "data: cannot read %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return data_fail(err, en, "data: cannot stat %s: %s", path, strerror(errno));
    }
    uint64_t want = (uint64_t)st.st_size;
    if (max_bytes && d->n_bytes + want > max_bytes) want = max_bytes - d->n_bytes;
    if (d->n_bytes + want > *cap) {
        uint64_t nc = *cap ? *cap : 1 << 20;
        while (nc < d->n_bytes + want) nc *= 2;
        uint8_t *p = realloc(d->bytes, nc);
        if (!p) {
            fclose(f);
            return data_fail(err, en, "data: out of memory reading %s", path);
        }
        d->bytes = p;
        *cap = nc;
    }
    size_t got = want ? fread(d->bytes + d->n_bytes, 1, want, f) : 0;
    fclose(f);
    d->n_bytes += got; /* a file that shrank while read just contributes less */
    return 0;
}

/* ---------------------------------------------------------------- rng */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void make_perm(train_data *d, uint64_t epoch)
{
    uint64_t s = d->seed * 0x2545f4914f6cdd1dull ^ (epoch + 1) * 0x9e3779b97f4a7c15ull;
    uint64_t n = d->n_windows;
    for (uint64_t i = 0; i < n; i++) d->perm[i] = (uint32_t)i;
    for (uint64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
        uint64_t j = (uint64_t)(((unsigned __int128)splitmix64(&s) * (i + 1)) >> 64);
        uint32_t t = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = t;
    }
    d->perm_epoch = epoch;
    d->perm_valid = 1;
}

/* ---------------------------------------------------------------- api */

int train_data_open(train_data **out, const train_data_config *cfg, char *err, size_t en)
{
    *out = NULL;
    if (!cfg->path || !*cfg->path) return data_fail(err, en, "data.path: empty");
    if (cfg->seq_len < 1) return data_fail(err, en, "model.seq_len: must be >= 1, got %d", cfg->seq_len);
    struct stat st;
    if (stat(cfg->path, &st) != 0)
        return data_fail(err, en, "data.path: %s: %s", cfg->path, strerror(errno));
    path_list files = {0};
    if (S_ISDIR(st.st_mode)) {
        if (walk(cfg->path, cfg, &files, err, en) != 0) {
            list_free(&files);
            return -1;
        }
        if (files.n > 1) qsort(files.items, (size_t)files.n, sizeof *files.items, cmp_str);
    } else if (list_push(&files, cfg->path) != 0) {
        return data_fail(err, en, "data: out of memory");
    }
    if (files.n == 0) {
        list_free(&files);
        return data_fail(err, en, "data.path: no files under %s match the data.suffixes filter", cfg->path);
    }
    train_data *d = calloc(1, sizeof *d);
    if (!d) {
        list_free(&files);
        return data_fail(err, en, "data: out of memory");
    }
    d->seq_len = cfg->seq_len;
    d->seed = cfg->seed;
    uint64_t cap = 0;
    int used = 0;
    for (int i = 0; i < files.n; i++) {
        if (cfg->max_bytes && d->n_bytes >= cfg->max_bytes) break;
        if (read_append(d, files.items[i], &cap, cfg->max_bytes, err, en) != 0) {
            list_free(&files);
            train_data_close(d);
            return -1;
        }
        used++;
    }
    for (int i = used; i < files.n; i++) free(files.items[i]);
    d->files = files.items;
    d->n_files = used;
    uint64_t w = (uint64_t)cfg->seq_len + 1;
    d->n_windows = d->n_bytes / w;
    if (d->n_windows < 1) {
        uint64_t n = d->n_bytes;
        train_data_close(d);
        return data_fail(err, en, "data.path: %s holds %llu bytes, fewer than one sample of seq_len+1 = %llu",
                         cfg->path, (unsigned long long)n, (unsigned long long)w);
    }
    if (d->n_windows > UINT32_MAX) d->n_windows = UINT32_MAX;
    d->perm = malloc(d->n_windows * sizeof *d->perm);
    if (!d->perm) {
        train_data_close(d);
        return data_fail(err, en, "data: out of memory for the sample permutation");
    }
    *out = d;
    return 0;
}

void train_data_close(train_data *d)
{
    if (!d) return;
    for (int i = 0; i < d->n_files; i++) free(d->files[i]);
    free(d->files);
    free(d->bytes);
    free(d->perm);
    free(d);
}

uint64_t train_data_bytes(const train_data *d) { return d->n_bytes; }
uint64_t train_data_windows(const train_data *d) { return d->n_windows; }
int train_data_files(const train_data *d) { return d->n_files; }
const char *train_data_file(const train_data *d, int i)
{
    return (i >= 0 && i < d->n_files) ? d->files[i] : NULL;
}

uint64_t train_data_window_of(train_data *d, uint64_t j)
{
    uint64_t epoch = j / d->n_windows;
    if (!d->perm_valid || d->perm_epoch != epoch) make_perm(d, epoch);
    return d->perm[j % d->n_windows];
}

void train_data_fill(train_data *d, uint64_t first, int rows, int32_t *tokens, int32_t *targets)
{
    int T = d->seq_len;
    for (int b = 0; b < rows; b++) {
        const uint8_t *src = d->bytes + train_data_window_of(d, first + (uint64_t)b) * (uint64_t)(T + 1);
        for (int t = 0; t < T; t++) {
            tokens[(size_t)b * T + t] = src[t];
            targets[(size_t)b * T + t] = src[t + 1];
        }
    }
}

void train_data_micro_batch(train_data *d, uint64_t consumed, int micro, int dp, int dp_rank, int m,
                            int32_t *tokens, int32_t *targets)
{
    uint64_t first = consumed + ((uint64_t)m * (uint64_t)dp + (uint64_t)dp_rank) * (uint64_t)micro;
    train_data_fill(d, first, micro, tokens, targets);
}

uint64_t train_data_fingerprint(const train_data *d)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < d->n_bytes; i++) {
        h ^= d->bytes[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
