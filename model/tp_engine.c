/* Registering a rank's stage and tp shards with the engine (tp_engine.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "pp_gpt.h"
#include "tp_engine.h"
#include "tp_gpt.h"

static zero_status engine_fail(zero_engine *e, zero_status st, const char *op, const char *name)
{
    return gpt_fail(st, "%s: %s: %s", op, name, zero_engine_last_error(e));
}

zero_status tp_engine_register(zero_engine *e, const gpt_config *cfg, int tp_size, int tp_rank, int pp_size,
                               int pp_rank, uint64_t seed, const float *const *full_init, int *param_ids,
                               int *module_ids)
{
    if (!e || !param_ids || !module_ids)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_engine_register: engine, param_ids or module_ids is NULL");
    int b, end;
    GPT_TRY(tp_config_validate(cfg, tp_size));
    GPT_TRY(pp_stage_layers(cfg, pp_size, pp_rank, &b, &end));
    const size_t np = gpt_num_params(cfg);
    const int nm = gpt_num_modules(cfg);
    for (int m = 0; m < nm; m++) module_ids[m] = -1;
    for (size_t i = 0; i < np; i++) param_ids[i] = -1;
    /* modules first (engine module ids in model order), then the parameters */
    for (int m = 0; m < nm; m++) {
        int any = 0;
        for (int k = 0; k < gpt_module_num_tensors(cfg, m); k++) any |= pp_stage_holds(cfg, pp_size, pp_rank, m, k);
        if (!any) continue;
        char name[32];
        gpt_module_name(cfg, m, name, sizeof name);
        zero_status st = zero_engine_add_module(e, name, &module_ids[m]);
        if (st != ZERO_OK) return engine_fail(e, st, "tp_engine_register: add_module", name);
    }
    float *full = NULL, *shard = NULL;
    zero_status st = ZERO_OK;
    for (size_t i = 0; i < np && st == ZERO_OK; i++) {
        tp_param_info info;
        st = tp_param_info_get(cfg, tp_size, tp_rank, i, &info);
        if (st != ZERO_OK) break;
        if (!pp_stage_holds(cfg, pp_size, pp_rank, info.full.module, info.full.index)) continue;
        const float *src = full_init ? full_init[i] : NULL;
        if (!src) {
            free(full);
            full = malloc(sizeof(float) * info.full.numel);
            if (!full) {
                st = gpt_fail(ZERO_OUT_OF_MEMORY, "tp_engine_register: %s: no memory for the full tensor", info.full.name);
                break;
            }
            gpt_param_init(cfg, &info.full, seed, full);
            src = full;
        }
        free(shard);
        shard = malloc(sizeof(float) * info.numel);
        if (!shard) {
            st = gpt_fail(ZERO_OUT_OF_MEMORY, "tp_engine_register: %s: no memory for the shard", info.full.name);
            break;
        }
        tp_param_slice(&info, tp_size, tp_rank, src, shard);
        int64_t shape[2] = {(int64_t)info.shape[0], (int64_t)info.shape[1]};
        st = zero_engine_add_param(e, module_ids[info.full.module], info.full.name, info.full.ndim, shape, shard,
                                   &param_ids[i]);
        if (st != ZERO_OK) {
            st = engine_fail(e, st, "tp_engine_register: add_param", info.full.name);
            break;
        }
        /* Count each tensor once in the model-parallel norm: tp-replicated
         * ones on tp rank 0, the tied wte on the first stage (the last
         * stage's copy is its replica). */
        int dup = (tp_rank > 0 && info.split == TP_REPLICATED) ||
                  (pp_size > 1 && pp_rank == pp_size - 1 && info.full.module == GPT_MODULE_EMBED &&
                   info.full.index == GPT_WTE);
        if (dup && (st = zero_engine_set_param_duplicate(e, param_ids[i], 1)) != ZERO_OK)
            st = engine_fail(e, st, "tp_engine_register: set_param_duplicate", info.full.name);
    }
    free(full);
    free(shard);
    return st;
}

zero_status tp_engine_sets(zero_engine *e, const gpt_config *cfg, const int *param_ids, gpt_tensors *params,
                           gpt_tensors *grads)
{
    if (!e || !cfg || !param_ids || !params)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_engine_sets: engine, cfg, param_ids or params is NULL");
    const int nm = gpt_num_modules(cfg);
    memset(params, 0, sizeof(gpt_tensors) * (size_t)nm);
    if (grads) memset(grads, 0, sizeof(gpt_tensors) * (size_t)nm);
    for (size_t i = 0; i < gpt_num_params(cfg); i++) {
        if (param_ids[i] < 0) continue;
        gpt_param_info info;
        GPT_TRY(gpt_param_info_get(cfg, i, &info));
        zero_status st = zero_engine_param_data(e, param_ids[i], &params[info.module].t[info.index]);
        if (st == ZERO_OK && grads) st = zero_engine_param_grad(e, param_ids[i], &grads[info.module].t[info.index]);
        if (st != ZERO_OK) return engine_fail(e, st, "tp_engine_sets", info.name);
    }
    return ZERO_OK;
}

zero_status tp_engine_grads_ready(zero_engine *e, const gpt_config *cfg, const int *module_ids)
{
    if (!e || !cfg || !module_ids)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_engine_grads_ready: engine, cfg or module_ids is NULL");
    for (int m = 0; m < gpt_num_modules(cfg); m++) {
        if (module_ids[m] < 0) continue;
        zero_status st = zero_engine_grads_ready(e, module_ids[m]);
        if (st != ZERO_OK) {
            char name[32];
            return engine_fail(e, st, "tp_engine_grads_ready", gpt_module_name(cfg, m, name, sizeof name));
        }
    }
    return ZERO_OK;
}

zero_status tp_engine_mp_create(zero_comm *world, const zero_grid *grid, zero_comm **out)
{
    if (!world || !grid || !out)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_engine_mp_create: world, grid or out is NULL");
    *out = NULL;
    zero_status st = zero_comm_split(world, grid->dp_rank, zero_comm_rank(world), out);
    if (st != ZERO_OK)
        return gpt_fail(st, "tp_engine_mp_create: split of %s by dp rank %d: %s", zero_comm_name(world),
                        grid->dp_rank, zero_comm_last_error(world));
    char name[32];
    snprintf(name, sizeof name, "mp(dp%d)", grid->dp_rank);
    (void)zero_comm_set_name(*out, name);
    return ZERO_OK;
}
