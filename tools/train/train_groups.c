/* zero-train's "param_groups" onto the engine: each group registered with
 * its hyperparameters, each parameter whose name matches one of a group's
 * patterns put in it (the first group that matches wins). */
#include <fnmatch.h>
#include <stdio.h>
#include <string.h>
#include <zero/engine.h>

#include "train_config.h"

int train_param_groups_apply(const train_config *cfg, zero_engine *e, char *note, size_t note_size, char *err,
                             size_t err_size)
{
    size_t used = 0;
    if (note_size) note[0] = '\0';
    for (int g = 0; g < cfg->n_groups; g++) {
        const train_group *tg = &cfg->groups[g];
        zero_group_hparams h = ZERO_GROUP_HPARAMS_INIT;
        h.lr_scale = tg->lr_scale;
        h.weight_decay = tg->weight_decay;
        h.beta1 = tg->beta1;
        h.beta2 = tg->beta2;
        h.eps = tg->eps;
        int id = -1;
        if (zero_engine_add_group(e, tg->name, &h, &id) != ZERO_OK) {
            snprintf(err, err_size, "param_groups[%d] (%s): %s", g, tg->name, zero_engine_last_error(e));
            return -1;
        }
    }
    int tensors[TRAIN_MAX_GROUPS + 1] = {0};
    unsigned long long elems[TRAIN_MAX_GROUPS + 1] = {0};
    for (int p = 0; p < zero_engine_num_params(e); p++) {
        zero_param_info pi;
        if (zero_engine_param_info(e, p, &pi) != ZERO_OK) {
            snprintf(err, err_size, "param_groups: %s", zero_engine_last_error(e));
            return -1;
        }
        int group = 0;
        for (int g = 0; g < cfg->n_groups && !group; g++)
            for (char **pat = cfg->groups[g].patterns; *pat && !group; pat++)
                if (fnmatch(*pat, pi.name, 0) == 0) group = g + 1; /* groups 1.. in config order */
        tensors[group]++;
        elems[group] += pi.numel;
        if (group && zero_engine_set_param_group(e, p, group) != ZERO_OK) {
            snprintf(err, err_size, "param_groups: %s: %s", pi.name, zero_engine_last_error(e));
            return -1;
        }
    }
    for (int g = 0; g <= cfg->n_groups && cfg->n_groups > 0 && used < note_size; g++) {
        zero_group_hparams h = ZERO_GROUP_HPARAMS_INIT;
        zero_engine_get_group_hparams(e, g, &h);
        used += (size_t)snprintf(note + used, note_size - used,
                                 "param group %s: %d tensors, %llu elements, lr x %g, weight_decay %g, betas (%g, %g), "
                                 "eps %g\n",
                                 zero_engine_get_group_name(e, g), tensors[g], elems[g], h.lr_scale, h.weight_decay,
                                 h.beta1, h.beta2, h.eps);
    }
    return 0;
}
