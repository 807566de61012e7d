/* Parameter groups (engine.h "parameter groups"): registration, the
 * hyperparameters of each group (SGD's momentum, dampening and nesterov
 * too), and the runs of one group along the flat layout that the optimizer
 * update walks (optim.c). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/handle.h"
#include "common/versioned.h"
#include "engine_internal.h"

/* The config's hyperparameters (what group 0 starts with, and add_group's defaults). */
static void config_hparams(const zero_engine *e, zero_group *g)
{
    g->lr_scale = 1.0;
    g->weight_decay = e->cfg.weight_decay;
    g->beta1 = e->cfg.beta1;
    g->beta2 = e->cfg.beta2;
    g->eps = e->cfg.eps;
    g->momentum = e->cfg.momentum;
    g->dampening = e->cfg.dampening;
    g->nesterov = e->cfg.nesterov;
}

zero_status groups_init(zero_engine *e)
{
    e->groups = calloc(4, sizeof *e->groups);
    if (!e->groups) return ZERO_OUT_OF_MEMORY;
    e->cap_groups = 4;
    e->num_groups = 1;
    zero_group *g = &e->groups[0];
    g->name = strdup("default");
    if (!g->name) return ZERO_OUT_OF_MEMORY;
    config_hparams(e, g);
    return ZERO_OK;
}

void groups_free(zero_engine *e)
{
    for (int i = 0; i < e->num_groups; i++) free(e->groups[i].name);
    free(e->groups);
    free(e->grun_begin);
    free(e->grun_group);
    e->groups = NULL;
    e->grun_begin = NULL;
    e->grun_group = NULL;
    e->num_groups = e->num_gruns = 0;
}

/* One row per ZERO_GROUP_HPARAMS_VERSION (engine.h lists each version's fields). */
static const zero_struct_version hparams_versions[] = {
    {ZERO_FIELD_END(zero_group_hparams, eps), "lr_scale"},
    {ZERO_FIELD_END(zero_group_hparams, nesterov), "momentum"},
};
_Static_assert(sizeof hparams_versions / sizeof *hparams_versions == ZERO_GROUP_HPARAMS_VERSION,
               "a new zero_group_hparams version needs its row above");
ZERO_ASSERT_LAST_FIELD(zero_group_hparams, nesterov);
static const zero_versioned_type hparams_type = {"zero_group_hparams", "ZERO_GROUP_HPARAMS_INIT", hparams_versions,
                                                 ZERO_GROUP_HPARAMS_VERSION, sizeof(zero_group_hparams)};

/* The fields of `in`'s version (a newer field an older caller lacks stays
 * "keep"), validated, onto *g. */
static zero_status apply(zero_engine *e, zero_group *g, const zero_group_hparams *in, const char *what)
{
    const zero_group_hparams defaults = ZERO_GROUP_HPARAMS_INIT;
    zero_group_hparams h;
    memcpy(&h, &defaults, sizeof h);
    ZERO_TRY(zero_versioned_read(&e->err, ZERO_INVALID_ARGUMENT, what, &hparams_type, in, &h));
    if (!(h.lr_scale >= 0) || !isfinite(h.lr_scale))
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: lr_scale must be finite and >= 0, got %g", what,
                         h.lr_scale);
    if (!isfinite(h.weight_decay))
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: weight_decay must be finite, got %g", what,
                         h.weight_decay);
    if (!(h.beta1 < 1) || !(h.beta2 < 1))
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: beta1 and beta2 must be < 1 (negative: keep), got %g, %g",
                         what, h.beta1, h.beta2);
    if (!isfinite(h.eps))
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: eps must be finite, got %g", what, h.eps);
    if (!isfinite(h.momentum))
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: momentum must be finite, got %g", what, h.momentum);
    if (!(h.dampening <= 1))
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: dampening must be <= 1 (negative: keep), got %g", what,
                         h.dampening);
    if (h.nesterov < -1 || h.nesterov > 1)
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: nesterov must be 0 or 1 (-1: keep), got %d", what,
                         h.nesterov);
    zero_group n = *g;
    n.lr_scale = h.lr_scale;
    if (h.weight_decay >= 0) n.weight_decay = h.weight_decay;
    if (h.beta1 >= 0) n.beta1 = h.beta1;
    if (h.beta2 >= 0) n.beta2 = h.beta2;
    if (h.eps >= 0) n.eps = h.eps;

    if (h.momentum >= 0) n.momentum = h.momentum;
    if (h.dampening >= 0) n.dampening = h.dampening;
    if (h.nesterov >= 0) n.nesterov = h.nesterov;
    if (e->cfg.optimizer == ZERO_OPTIM_SGD) {
        /* The buffers are allocated from the config's momentum (engine.c, offload_opt.c). */
        if (n.momentum > 0 && !(e->cfg.momentum > 0))
            return zero_fail(&e->err, ZERO_INVALID_ARGUMENT,
                             "%s: momentum %g needs SGD momentum buffers, which this engine does not have (its "
                             "config's momentum is 0): set the config's momentum > 0, and 0 in the groups without",
                             what, n.momentum);
        if (n.nesterov && (n.momentum <= 0 || n.dampening != 0))
            return zero_fail(&e->err, ZERO_INVALID_ARGUMENT,
                             "%s: nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD), got momentum %g, "
                             "dampening %g",
                             what, n.momentum, n.dampening);
    }
    *g = n;
    return ZERO_OK;
}

static zero_status check_group(const zero_engine *e, int group, const char *what)
{
    if (group < 0 || group >= e->num_groups)
        return zero_fail((zero_errbuf *)&e->err, ZERO_NOT_FOUND, "%s: no group %d (the engine has %d)", what, group,
                         e->num_groups);
    return ZERO_OK;
}

zero_status zero_engine_add_group(zero_engine *e, const char *name, const zero_group_hparams *hparams, int *group_id)
{
    static const char what[] = "engine add_group";
    if (group_id) *group_id = -1;
    ZERO_TRY(engine_check_usable(e, what, e && e->magic == ZERO_HANDLE_ENGINE ? e->finalized : 0)); /* before or after */
    if (!name || !name[0]) return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: name is NULL or empty", what);
    for (int i = 0; i < e->num_groups; i++)
        if (!strcmp(e->groups[i].name, name))
            return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: a group named '%s' exists already", what, name);
    zero_group g = e->groups[0];
    config_hparams(e, &g); /* the config's, not group 0's current values */
    /* Added after steps, its parameters bring their momentum buffers along
     * (as Adam's moments stay with a parameter that changes group). */
    g.momentum_from = e->step > 0 ? 1 : 0;
    if (hparams) ZERO_TRY(apply(e, &g, hparams, what));
    if (e->num_groups == e->cap_groups) {
        zero_group *n = realloc(e->groups, (size_t)e->cap_groups * 2 * sizeof *n);
        if (!n) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", what);
        e->groups = n;
        e->cap_groups *= 2;
    }
    g.name = strdup(name);
    if (!g.name) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", what);
    e->groups[e->num_groups] = g;
    if (group_id) *group_id = e->num_groups;
    e->num_groups++;
    return ZERO_OK;
}

zero_status zero_engine_set_param_group(zero_engine *e, int param, int group)
{
    static const char what[] = "engine set_param_group";
    ZERO_TRY(engine_check_usable(e, what, e && e->magic == ZERO_HANDLE_ENGINE ? e->finalized : 0)); /* before or after */
    if (param < 0 || param >= e->num_params)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "%s: no parameter %d (the engine has %d)", what, param,
                         e->num_params);
    ZERO_TRY(check_group(e, group, what));
    const int old = e->params[param].group;
    e->params[param].group = group;
    if (e->finalized && old != group) {
        zero_status st = groups_build_runs(e);
        if (st != ZERO_OK) {
            e->params[param].group = old;
            return st;
        }
    }
    return ZERO_OK;
}

zero_status zero_engine_set_group_hparams(zero_engine *e, int group, const zero_group_hparams *hparams)
{
    static const char what[] = "engine set_group_hparams";
    ZERO_TRY(engine_check_usable(e, what, e && e->magic == ZERO_HANDLE_ENGINE ? e->finalized : 0)); /* before or after */
    ZERO_TRY(check_group(e, group, what));
    if (!hparams) return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: hparams is NULL", what);
    zero_group g = e->groups[group];
    ZERO_TRY(apply(e, &g, hparams, what));
    e->groups[group] = g;
    /* group 0 is the config's: keep the two in step (but for momentum,
     * dampening, nesterov: the config's momentum says whether buffers exist) */
    if (group == 0) {
        e->cfg.weight_decay = g.weight_decay;
        e->cfg.beta1 = g.beta1;
        e->cfg.beta2 = g.beta2;
        e->cfg.eps = g.eps;
    }
    return ZERO_OK;
}

zero_status zero_engine_get_group_hparams(const zero_engine *e, int group, zero_group_hparams *out)
{
    static const char what[] = "engine get_group_hparams";
    if (!e || !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "%s: NULL argument", what);
    ZERO_TRY(check_group(e, group, what));
    const zero_group *g = &e->groups[group];
    const zero_group_hparams defaults = ZERO_GROUP_HPARAMS_INIT;
    zero_group_hparams h;
    memcpy(&h, &defaults, sizeof h);
    /* checks out's size and version, so the write below stays within the caller's fields */
    ZERO_TRY(zero_versioned_read((zero_errbuf *)&e->err, ZERO_INVALID_ARGUMENT, what, &hparams_type, out, &h));
    h.lr_scale = g->lr_scale;
    h.weight_decay = g->weight_decay;
    h.beta1 = g->beta1;
    h.beta2 = g->beta2;
    h.eps = g->eps;
    h.momentum = g->momentum;
    h.dampening = g->dampening;
    h.nesterov = g->nesterov;
    /* a newer field the caller lacks would be refused here if it differed from its default */
    zero_group_hparams keep;
    memcpy(&keep, &h, sizeof keep);
    return zero_versioned_write((zero_errbuf *)&e->err, ZERO_INVALID_ARGUMENT, what, &hparams_type, &h, &keep, out);
}

int zero_engine_get_num_groups(const zero_engine *e) { return e ? e->num_groups : 0; }

const char *zero_engine_get_group_name(const zero_engine *e, int group)
{
    if (!e || group < 0 || group >= e->num_groups) return NULL;
    return e->groups[group].name;
}

zero_status zero_engine_get_param_group(const zero_engine *e, int param, int *group)
{
    if (!e || !group) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine param_group: NULL argument");
    if (param < 0 || param >= e->num_params)
        return zero_fail((zero_errbuf *)&e->err, ZERO_NOT_FOUND, "engine param_group: no parameter %d", param);
    *group = e->params[param].group;
    return ZERO_OK;
}

/* ---------------------------------------------------------------- runs of the flat layout */

zero_status groups_build_runs(zero_engine *e)
{
    free(e->grun_begin);
    free(e->grun_group);
    e->grun_begin = NULL;
    e->grun_group = NULL;
    e->num_gruns = 0;
    e->fused_stale = 1; /* the fused step's chunk table follows the runs */
    int any = 0;
    for (int i = 0; i < e->num_params; i++) any |= e->params[i].group != 0;
    if (!any) return ZERO_OK; /* one kernel call per region, as without groups */
    e->grun_begin = malloc((size_t)e->num_params * sizeof *e->grun_begin);
    e->grun_group = malloc((size_t)e->num_params * sizeof *e->grun_group);
    if (!e->grun_begin || !e->grun_group)
        return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine finalize: parameter group runs");
    /* Parameters lie in the flat layout in registration order, each
     * contiguous (a split one too); padding between them joins the run
     * before it (its gradient and value are zero, so any group leaves it 0). */
    for (int i = 0; i < e->num_params; i++) {
        const zero_param *p = &e->params[i];
        if (e->num_gruns > 0 && e->grun_group[e->num_gruns - 1] == p->group) continue;
        e->grun_begin[e->num_gruns] = e->num_gruns == 0 ? 0 : p->flat_off;
        e->grun_group[e->num_gruns] = p->group;
        e->num_gruns++;
    }
    return ZERO_OK;
}

int groups_run_at(const zero_engine *e, uint64_t flat)
{
    int lo = 0, hi = e->num_gruns - 1; /* the last run beginning at or before `flat` */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (e->grun_begin[mid] <= flat) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

void groups_pieces_begin(const zero_engine *e, uint64_t off, uint64_t end, groups_pieces *it)
{
    it->lo = off;
    it->end = end;
    it->run = e->num_gruns ? groups_run_at(e, off) : 0;
}

int groups_pieces_next(const zero_engine *e, groups_pieces *it, uint64_t *lo, uint64_t *hi, int *group)
{
    if (it->lo >= it->end) return 0;
    uint64_t piece_end = it->end;
    int g = 0;
    if (e->num_gruns) {
        /* the last run beginning at or before lo, cut where the next one begins */
        while (it->run + 1 < e->num_gruns && e->grun_begin[it->run + 1] <= it->lo) it->run++;
        if (it->run + 1 < e->num_gruns && e->grun_begin[it->run + 1] < it->end) piece_end = e->grun_begin[it->run + 1];
        g = e->grun_group[it->run];
    }
    *lo = it->lo, *hi = piece_end, *group = g;
    it->lo = piece_end;
    return 1;
}
