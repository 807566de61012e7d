/* The order of saves in a checkpoint directory (see include/zero/checkpoint.h):
 * keep_last pruning and the fallback of resolve. No engine, no comm: the
 * offline readers (and their fuzz targets) link it alone. */
#include "checkpoint_internal.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- save order
 * Step numbers do not order saves: a fresh run that saves step 3 into a
 * directory holding another run's step 6 made the newer save. So each
 * meta.json records "save_seq", one more than the largest in the directory
 * when it was saved, and keep_last and the fallback of resolve (no usable
 * `latest`) order by (save_seq, step): checkpoints written before save_seq
 * existed count as 0 and fall back to step order among themselves. */

int64_t ckpt_save_seq(const char *step_dir)
{
    char p[1400];
    snprintf(p, sizeof p, "%s/meta.json", step_dir);
    char *text = NULL;
    size_t len = 0;
    if (ckpt_read_file(p, &text, &len) != ZERO_OK) return -1;
    json_t *w = json_loadb(text, len, 0, NULL);
    free(text);
    json_t *seq = json_object_get(json_object_get(w, "meta"), "save_seq");
    int64_t v = json_is_integer(seq) && json_integer_value(seq) > 0 ? (int64_t)json_integer_value(seq) : 0;
    json_decref(w);
    return v;
}

typedef struct ckpt_save_entry {
    long long step;
    char name[256]; /* as found: "step-5" is a step directory too, not only "step-00000005" */
    int64_t seq; /* -1: no readable meta.json (an incomplete directory) */
} ckpt_save_entry;

static int cmp_save(const void *a, const void *b)
{
    const ckpt_save_entry *x = a, *y = b;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return x->step < y->step ? -1 : x->step > y->step;
}

/* Every step-* directory of `dir` in save order, oldest first. malloc'd; *n = 0 on failure. */
static ckpt_save_entry *list_saves(const char *dir, int *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    ckpt_save_entry *v = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        char tail;
        if (sscanf(e->d_name, "step-%lld%c", &s, &tail) != 1) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            ckpt_save_entry *g = realloc(v, (size_t)cap * sizeof *v);
            if (!g) break;
            v = g;
        }
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        v[*n].step = s;
        snprintf(v[*n].name, sizeof v[*n].name, "%s", e->d_name);
        v[*n].seq = ckpt_save_seq(p);
        (*n)++;
    }
    closedir(d);
    if (v) qsort(v, (size_t)*n, sizeof *v, cmp_save);
    return v;
}

/* The save_seq of the newest save in `dir` (0 if none). With keep_last the
 * directory holds a few checkpoints and prune reads them all anyway; without,
 * it may hold thousands, so only the one `latest` names is read. */
int64_t ckpt_newest_save_seq(const char *dir, int keep)
{
    int64_t best = 0;
    if (keep > 0) {
        int n;
        ckpt_save_entry *v = list_saves(dir, &n);
        if (n) best = v[n - 1].seq;
        free(v);
    } else {
        char newest[1400];
        if (zero_checkpoint_resolve(dir, newest, sizeof newest) == ZERO_OK) best = ckpt_save_seq(newest);
    }
    return best > 0 ? best : 0;
}

int ckpt_newest_step(const char *dir, char *name, size_t n)
{
    int count;
    ckpt_save_entry *v = list_saves(dir, &count);
    int i = count - 1;
    while (i >= 0 && v[i].seq < 0) i--; /* incomplete */
    if (i >= 0) snprintf(name, n, "%s", v[i].name);
    free(v);
    return i >= 0;
}

/* Delete the step-* directories beyond the newest `keep` saves. The one just
 * published has the largest save_seq, so it is never among them. */
void ckpt_prune(const char *dir, int keep)
{
    if (keep <= 0) return;
    int n;
    ckpt_save_entry *v = list_saves(dir, &n);
    for (int i = 0; i + keep < n; i++) {
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", dir, v[i].name);
        ckpt_remove_tree(p);
    }
    free(v);
}
