/* Offline merge of the checkpoints of a model's parts into one checkpoint of
 * the whole model (zero_checkpoint_merge): expert-parallel runs save one
 * checkpoint per ep rank, each holding the dense tensors and that rank's
 * slice of every expert stack. Streams one tensor slice at a time. */
#include "checkpoint_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"

static int is_stacked(const char *name, const char *const *stacked, int n_stacked)
{
    for (int i = 0; i < n_stacked; i++)
        if (strcmp(name, stacked[i]) == 0) return 1;
    return 0;
}

static int shape_equal(const ckpt_param *a, const ckpt_param *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

/* Input i agrees with input 0 on everything but its stacked tensors' values. */
static zero_status check_input(const ckpt_meta *m0, const ckpt_meta *mi, const char *path0, const char *pathi)
{
    if (mi->step != m0->step)
        return zero_fail(NULL, ZERO_MISMATCH, "checkpoint merge: %s is step %lld but %s is step %lld", pathi,
                         (long long)mi->step, path0, (long long)m0->step);
    if (mi->kinds != m0->kinds)
        return zero_fail(NULL, ZERO_MISMATCH, "checkpoint merge: %s holds other optimizer state kinds than %s", pathi,
                         path0);
    if (mi->n_params != m0->n_params)
        return zero_fail(NULL, ZERO_MISMATCH, "checkpoint merge: %s has %d parameters, %s has %d", pathi,
                         mi->n_params, path0, m0->n_params);
    for (int p = 0; p < m0->n_params; p++)
        if (strcmp(mi->params[p].name, m0->params[p].name) != 0 || !shape_equal(&mi->params[p], &m0->params[p]))
            return zero_fail(NULL, ZERO_MISMATCH,
                             "checkpoint merge: parameter %d is %s in %s but %s in %s (or another shape)", p,
                             mi->params[p].name, pathi, m0->params[p].name, path0);
    if (!json_equal(json_object_get(mi->root, "engine"), json_object_get(m0->root, "engine")))
        return zero_fail(NULL, ZERO_MISMATCH,
                         "checkpoint merge: %s and %s hold different engine state (optimizer step, loss scale, lr): "
                         "not the parts of one run",
                         pathi, path0);
    return ZERO_OK;
}

/* Write every parameter into w: stacked ones as the inputs' tensors one after
 * another, the others from input 0 after checking every input holds them
 * bitwise (a part of another run, or of another step, is refused by name). */
static zero_status merge_data(ckpt_meta *ms, int n, int **fds, const char *const *paths, const char *const *stacked,
                              int n_stacked, ckpt_writer *w)
{
    const ckpt_meta *m0 = &ms[0];
    float *buf = NULL, *other = NULL;
    uint64_t cap = 0, cap2 = 0;
    zero_status s = ZERO_OK;
    for (int p = 0; p < m0->n_params && s == ZERO_OK; p++) {
        const ckpt_param *pa = &m0->params[p];
        uint64_t numel = pa->numel;
        int stack = is_stacked(pa->name, stacked, n_stacked);
        if ((s = ckpt_grow_buffer(&buf, &cap, numel, "checkpoint merge", pa->name)) != ZERO_OK) break;
        if (!stack && n > 1 && (s = ckpt_grow_buffer(&other, &cap2, numel, "checkpoint merge", pa->name)) != ZERO_OK)
            break;
        for (int k = 0; k < CKPT_NUM_KINDS && s == ZERO_OK; k++) {
            if (!(m0->kinds & (1u << k))) continue;
            if (stack) {
                for (int i = 0; i < n && s == ZERO_OK; i++) {
                    s = ckpt_read_range(&ms[i], fds[i], k, p, 0, numel, buf);
                    if (s == ZERO_OK) s = ckpt_writer_segment(w, p, k, (uint64_t)i * numel, buf, numel);
                }
                continue;
            }
            s = ckpt_read_range(&ms[0], fds[0], k, p, 0, numel, buf);
            for (int i = 1; i < n && s == ZERO_OK; i++) {
                s = ckpt_read_range(&ms[i], fds[i], k, p, 0, numel, other);
                if (s == ZERO_OK && memcmp(buf, other, numel * sizeof *buf) != 0)
                    s = zero_fail(NULL, ZERO_MISMATCH,
                                  "checkpoint merge: %s (%s), a tensor every part holds whole, differs between %s "
                                  "and %s: not the parts of one run and step",
                                  pa->name, ckpt_kind_names[k], paths[i], paths[0]);
            }
            if (s == ZERO_OK) s = ckpt_writer_segment(w, p, k, 0, buf, numel);
        }
    }
    free(buf);
    free(other);
    return s;
}

/* The output's meta object: input 0's with the stacked shapes grown n times,
 * one file, the user object replaced. */
static zero_status merged_meta(const ckpt_meta *m0, int n, const char *const *stacked, int n_stacked,
                               const char *user_json, const char *tmp_dir, json_t **out)
{
    json_t *meta = json_deep_copy(m0->root);
    if (!meta) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint merge");
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(meta, "params"), i, v) {
        if (!is_stacked(json_string_value(json_object_get(v, "name")), stacked, n_stacked)) continue;
        json_t *shape = json_object_get(v, "shape");
        json_array_set_new(shape, 0, json_integer(json_integer_value(json_array_get(shape, 0)) * n));
    }
    json_object_set_new(meta, "world_size", json_integer(1));
    json_object_set_new(meta, "merged_from", json_integer(n));
    json_object_del(meta, "plan_hash"); /* the saving engine's plan, not this layout's */
    if (user_json) {
        json_error_t je;
        json_t *u = json_loads(user_json, 0, &je);
        if (!json_is_object(u)) {
            json_decref(u);
            json_decref(meta);
            return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint merge: user_json is not a JSON object (%s)",
                             je.text);
        }
        json_object_set_new(meta, "user", u);
    }
    zero_status s = ckpt_meta_collect_files(meta, tmp_dir, 1);
    if (s != ZERO_OK) {
        json_decref(meta);
        return s;
    }
    *out = meta;
    return ZERO_OK;
}

zero_status zero_checkpoint_merge(const char *const *paths, int n, const char *const *stacked, int n_stacked,
                                  const char *user_json, const char *out_dir)
{
    if (!paths || n < 1 || n_stacked < 0 || (n_stacked && !stacked) || !out_dir)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT,
                         "checkpoint merge: NULL path list or out_dir, or n < 1 or n_stacked < 0");
    for (int i = 0; i < n; i++)
        if (!paths[i]) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint merge: paths[%d] is NULL", i);
    struct stat st;
    if (stat(out_dir, &st) == 0)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint merge: %s already exists", out_dir);
    ckpt_meta *ms = calloc((size_t)n, sizeof *ms);
    int **fds = calloc((size_t)n, sizeof *fds);
    zero_status s = ms && fds ? ZERO_OK : zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint merge");
    int loaded = 0;
    for (int i = 0; i < n && s == ZERO_OK; i++) {
        if ((s = ckpt_meta_load(paths[i], &ms[i])) != ZERO_OK) break;
        loaded = i + 1;
        zero_engine_scalars sc;
        s = ckpt_meta_scalars(&ms[i], &sc);
        if (s == ZERO_OK) s = ckpt_meta_check_coverage(&ms[i]);
        if (s == ZERO_OK && i > 0) s = check_input(&ms[0], &ms[i], paths[0], paths[i]);
        if (s == ZERO_OK && !(fds[i] = malloc(((size_t)ms[i].n_files + 1) * sizeof **fds)))
            s = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint merge");
        for (int f = 0; s == ZERO_OK && f < ms[i].n_files; f++) fds[i][f] = -1;
    }
    for (int j = 0; j < n_stacked && s == ZERO_OK; j++) {
        int found = 0;
        for (int p = 0; p < ms[0].n_params && !found; p++) found = strcmp(ms[0].params[p].name, stacked[j]) == 0;
        if (!found)
            s = zero_fail(NULL, ZERO_NOT_FOUND, "checkpoint merge: %s has no parameter %s to stack", paths[0],
                          stacked[j]);
    }
    char tmp_dir[1200];
    snprintf(tmp_dir, sizeof tmp_dir, "%s.tmp", out_dir);
    if (s == ZERO_OK) {
        ckpt_remove_tree(tmp_dir);
        s = ckpt_mkdir_p(tmp_dir);
    }
    if (s == ZERO_OK) {
        char p[1400];
        snprintf(p, sizeof p, "%s/rank-00000.bin", tmp_dir);
        ckpt_writer w;
        if ((s = ckpt_writer_open(&w, p, 0, 1, 1)) == ZERO_OK) {
            s = merge_data(ms, n, fds, paths, stacked, n_stacked, &w);
            if (s == ZERO_OK) s = ckpt_writer_close(&w, NULL);
            else ckpt_writer_abort(&w);
        }
    }
    json_t *meta = NULL;
    if (s == ZERO_OK) s = merged_meta(&ms[0], n, stacked, n_stacked, user_json, tmp_dir, &meta);
    if (s == ZERO_OK) {
        char *text = ckpt_meta_dump(meta);
        char p[1400];
        snprintf(p, sizeof p, "%s/meta.json", tmp_dir);
        s = text ? ckpt_write_file_atomic(p, text, strlen(text), 1)
                 : zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint merge");
        free(text);
    }
    json_decref(meta);
    if (s == ZERO_OK && rename(tmp_dir, out_dir) != 0)
        s = zero_fail(NULL, ZERO_IO, "checkpoint merge: renaming %s to %s: %s", tmp_dir, out_dir, strerror(errno));
    if (s != ZERO_OK) ckpt_remove_tree(tmp_dir);
    for (int i = 0; fds && i < loaded; i++) {
        if (fds[i]) ckpt_close_fds(&ms[i], fds[i]);
        free(fds[i]);
    }
    for (int i = 0; ms && i < loaded; i++) ckpt_meta_free(&ms[i]);
    free(fds);
    free(ms);
    return s;
}
