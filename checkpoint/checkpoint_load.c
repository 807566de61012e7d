/* zero_checkpoint_load: read any checkpoint of the same model into an engine
 * of any world size and stage, each rank reading only its owned ranges. */
#include "checkpoint_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* The engine's parameters must be the checkpoint's: same count, names and
 * shapes in the same order. The message names the first difference. */
static zero_status check_model(zero_engine *e, const ckpt_meta *m)
{
    int np = zero_engine_get_num_params(e);
    for (int p = 0; p < np && p < m->n_params; p++) {
        zero_param_info pi;
        ZERO_TRY(zero_engine_get_param_info(e, p, &pi));
        const ckpt_param *c = &m->params[p];
        int same = strcmp(pi.name, c->name) == 0 && pi.ndim == c->ndim;
        for (int d = 0; same && d < pi.ndim; d++) same = pi.shape[d] == c->shape[d];
        if (!same) {
            char a[128] = "", b[128] = "";
            for (int d = 0; d < pi.ndim; d++)
                snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", d ? ", " : "", (long long)pi.shape[d]);
            for (int d = 0; d < c->ndim; d++)
                snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", d ? ", " : "", (long long)c->shape[d]);
            return zero_fail(NULL, ZERO_MISMATCH,
                             "checkpoint load: %s holds another model: parameter %d is %s [%s] there but %s [%s] in "
                             "this engine",
                             m->dir, p, c->name, b, pi.name, a);
        }
    }
    if (np != m->n_params)
        return zero_fail(NULL, ZERO_MISMATCH,
                         "checkpoint load: %s holds another model: %d parameters there, %d in this engine", m->dir,
                         m->n_params, np);
    return ZERO_OK;
}

static zero_status load_local(zero_engine *e, const ckpt_meta *m, unsigned kinds, int rank)
{
    ZERO_TRY(check_model(e, m));
    for (int k = 0; k < CKPT_NUM_KINDS; k++)
        if ((kinds & (1u << k)) && !(m->kinds & (1u << k)))
            return zero_fail(NULL, ZERO_MISMATCH,
                             "checkpoint load: %s has no %s state: it was saved with another optimizer", m->dir,
                             ckpt_kind_names[k]);
    int *fds = malloc(((size_t)m->n_files + 1) * sizeof *fds);
    if (!fds) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint load");
    for (int i = 0; i < m->n_files; i++) fds[i] = -1;
    float *buf = NULL;
    uint64_t cap = 0;
    zero_status s = ZERO_OK;
    for (int p = 0; p < m->n_params && s == ZERO_OK; p++) {
        zero_param_info pi;
        if ((s = zero_engine_get_param_info(e, p, &pi)) != ZERO_OK) break;
        uint64_t n = pi.owned_numel; /* all owned ranges, one after another */
        if (n == 0) continue;
        if ((s = ckpt_grow_buffer(&buf, &cap, n, "checkpoint load", pi.name)) != ZERO_OK) break;
        for (int k = 0; k < CKPT_NUM_KINDS && s == ZERO_OK; k++) {
            if (!(kinds & (1u << k))) continue;
            uint64_t done = 0;
            for (int i = 0; i < pi.num_owned_ranges && s == ZERO_OK; i++) {
                uint64_t b, end;
                if ((s = zero_engine_get_param_owned_range(e, p, i, &b, &end)) != ZERO_OK)
                    s = zero_fail(NULL, s, "checkpoint load: %s", zero_engine_last_error(e));
                else s = ckpt_read_range(m, fds, k, p, b, end, buf + done);
                done += end - b;
            }
            if (s == ZERO_OK && (s = zero_engine_state_set(e, (zero_state_kind)k, p, buf)) != ZERO_OK)
                s = zero_fail(NULL, s, "checkpoint load: rank %d: setting %s of %s: %s", rank, ckpt_kind_names[k],
                              pi.name, zero_engine_last_error(e));
        }
    }
    free(buf);
    ckpt_close_fds(m, fds);
    free(fds);
    return s;
}

/* ---------------------------------------------------------------- parameter groups */

static zero_status meta_groups(const ckpt_meta *m, zero_engine *e, int apply)
{
    json_t *groups = json_object_get(m->root, "groups");
    if (!groups) return ZERO_OK; /* written before groups existed: every parameter in "default" */
    if (!json_is_array(groups))
        return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s/meta.json: groups is not an array", m->dir);
    size_t i;
    json_t *v;
    json_array_foreach(groups, i, v) {
        /* momentum, dampening (SGD) came later: absent in older checkpoints, they stay as they are */
        static const char *const keys[] = {"lr_scale", "weight_decay", "beta1",   "beta2",
                                           "eps",      "momentum",     "dampening"};
        enum { REQUIRED = 5, NKEYS = 7 };
        double x[NKEYS] = {0, 0, 0, 0, 0, -1, -1};
        json_t *name = json_object_get(v, "name");
        if (!json_is_string(name))
            return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s/meta.json: groups[%zu] has no name", m->dir, i);
        for (int k = 0; k < NKEYS; k++) {
            json_t *n = json_object_get(v, keys[k]);
            if (!n && k >= REQUIRED) continue;
            if (!json_is_number(n) || !isfinite(json_number_value(n)) || json_number_value(n) < 0)
                return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s/meta.json: groups[%zu] ('%s'): %s is missing, "
                                 "negative or not a number", m->dir, i, json_string_value(name), keys[k]);
            x[k] = json_number_value(n);
        }
        json_t *nesterov = json_object_get(v, "nesterov");
        if (nesterov && !json_is_boolean(nesterov))
            return zero_fail(NULL, ZERO_CORRUPT,
                             "checkpoint: %s/meta.json: groups[%zu] ('%s'): nesterov is not a boolean", m->dir, i,
                             json_string_value(name));
        if (!(x[2] < 1) || !(x[3] < 1))
            return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s/meta.json: groups[%zu] ('%s'): a beta is >= 1",
                             m->dir, i, json_string_value(name));
        if (!apply) continue;
        /* by name: a group the engine does not have (it was registered
         * without it) keeps nothing to restore */
        for (int g = 0; g < zero_engine_get_num_groups(e); g++) {
            const char *gn = zero_engine_get_group_name(e, g);
            if (!gn || strcmp(gn, json_string_value(name))) continue;
            zero_group_hparams h = ZERO_GROUP_HPARAMS_INIT;
            h.lr_scale = x[0];
            h.weight_decay = x[1];
            h.beta1 = x[2];
            h.beta2 = x[3];
            h.eps = x[4];
            h.momentum = x[5];
            h.dampening = x[6];
            h.nesterov = nesterov ? json_is_true(nesterov) : -1;
            zero_status st = zero_engine_set_group_hparams(e, g, &h);
            if (st != ZERO_OK) return zero_fail(NULL, st, "checkpoint load: %s", zero_engine_last_error(e));
        }
    }
    return ZERO_OK;
}

zero_status zero_checkpoint_load(zero_engine *e, zero_comm *dp, const char *path, zero_checkpoint_loaded *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!e || !dp || !path)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint load: NULL engine, comm or path");
    int rank = zero_comm_get_rank(dp);
    unsigned kinds = 0;
    ckpt_meta m;
    zero_status s = engine_between_steps(e, "checkpoint load");
    if (s == ZERO_OK) s = ckpt_meta_load(path, &m);
    else memset(&m, 0, sizeof m);
    zero_status ks = ckpt_engine_kinds(e, dp, &kinds); /* collective: always */
    if (s == ZERO_OK) s = ks;
    zero_engine_scalars sc;
    if (s == ZERO_OK) s = ckpt_meta_scalars(&m, &sc); /* checked before any state is written */
    if (s == ZERO_OK) s = meta_groups(&m, e, 0);
    if (s == ZERO_OK) s = load_local(e, &m, kinds, rank);
    if (s == ZERO_OK && (s = zero_engine_set_scalars(e, &sc)) != ZERO_OK)
        s = zero_fail(NULL, s, "checkpoint load: %s", zero_engine_last_error(e));
    if (s == ZERO_OK) s = meta_groups(&m, e, 1);
    s = ckpt_agree(dp, s, "checkpoint load");
    if (s == ZERO_OK && (s = zero_engine_params_changed(e)) != ZERO_OK)
        s = zero_fail(NULL, s, "checkpoint load: params_changed: %s", zero_engine_last_error(e));
    if (s == ZERO_OK && out) {
        out->step = m.step;
        out->world_size = m.world;
        out->stage = m.stage;
        json_t *u = json_object_get(m.root, "user");
        out->user_json = json_is_object(u) ? json_dumps(u, JSON_COMPACT | JSON_SORT_KEYS) : strdup("{}");
        snprintf(out->path, sizeof out->path, "%s", m.dir);
    }
    ckpt_meta_free(&m);
    return s;
}

void zero_checkpoint_loaded_free(zero_checkpoint_loaded *l)
{
    if (!l) return;
    free(l->user_json);
    l->user_json = NULL;
}

void zero_checkpoint_free(void *p) { free(p); }
