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

/* The init callback of a split tensor: its shard's elements of the full
 * tensor's spec (tp_param_init_range), so no rank builds the full tensor. */
typedef struct tp_init_ctx {
    tp_param_info info;
    int tp_size, tp_rank;
    uint64_t seed;
    int ep_rank;          /* an expert stack at moe_ep > 1: this ep rank's slice of the whole stack */
} tp_init_ctx;

/* An expert stack's init: elements [ep_rank numel, (ep_rank + 1) numel) of
 * the whole stack's spec, so every ep size starts from the same experts
 * (gpt_param_init_ep). */
static zero_status ep_init_fill(void *user, int param, const char *name, uint64_t begin, uint64_t end, float *out)
{
    (void)param;
    const tp_init_ctx *c = user;
    zero_init_spec whole = gpt_param_init_spec(&c->info.full, c->seed);
    uint64_t first = (uint64_t)c->ep_rank * c->info.full.numel;
    return zero_init_generate(&whole, name, first + begin, first + end, out);
}

static zero_status tp_init_fill(void *user, int param, const char *name, uint64_t begin, uint64_t end, float *out)
{
    (void)param;
    (void)name;
    const tp_init_ctx *c = user;
    return tp_param_init_range(&c->info, c->tp_size, c->tp_rank, c->seed, begin, end, out);
}

/* Register parameter i's shard: sliced from full_init, or described (a
 * replicated tensor by its own spec, a split one by the callback over ctx). */
static zero_status register_param(zero_engine *e, const tp_param_info *info, int module, const float *full_init,
                                  tp_init_ctx *ctx, int *param_id)
{
    int64_t shape[2] = {(int64_t)info->shape[0], (int64_t)info->shape[1]};
    zero_status st;
    if (full_init) {
        float *shard = malloc(sizeof(float) * info->numel);
        if (!shard) return gpt_fail(ZERO_OUT_OF_MEMORY, "tp_engine_build: %s: no memory for the shard", info->full.name);
        tp_param_slice(info, ctx->tp_size, ctx->tp_rank, full_init, shard);
        st = zero_engine_add_param(e, module, info->full.name, info->full.ndim, shape, shard, param_id);
        free(shard);
    } else {
        zero_init_spec spec = gpt_param_init_spec(&info->full, ctx->seed);
        if (info->full.expert_stack && ctx->ep_rank > 0) {
            ctx->info = *info;
            spec.kind = ZERO_INIT_CALLBACK;
            spec.fill = ep_init_fill;
            spec.user = ctx;
            spec.seed = ctx->seed ^ (uint64_t)ctx->ep_rank; /* the tag the engine's cross-rank check compares */
        } else if (info->split != TP_REPLICATED) {
            ctx->info = *info;
            spec.kind = ZERO_INIT_CALLBACK;
            spec.fill = tp_init_fill;
            spec.user = ctx;
        }
        st = zero_engine_add_param_init(e, module, info->full.name, info->full.ndim, shape, &spec, param_id);
    }
    return st == ZERO_OK ? ZERO_OK : engine_fail(e, st, "tp_engine_build: add_param", info->full.name);
}

zero_status tp_engine_build(zero_engine *e, const gpt_config *cfg, int tp_size, int tp_rank, int pp_size, int pp_rank,
                            uint64_t seed, const float *const *full_init, int *param_ids, int *module_ids)
{
    return tp_engine_build_chunks(e, cfg, tp_size, tp_rank, pp_size, 1, pp_rank, seed, full_init, param_ids,
                                  module_ids);
}

zero_status tp_engine_build_chunks(zero_engine *e, const gpt_config *cfg, int tp_size, int tp_rank, int pp_size,
                                   int chunks, int pp_rank, uint64_t seed, const float *const *full_init,
                                   int *param_ids, int *module_ids)
{
    return tp_engine_build_ep(e, cfg, tp_size, tp_rank, pp_size, chunks, pp_rank, 0, seed, full_init, param_ids,
                              module_ids);
}

zero_status tp_engine_build_ep(zero_engine *e, const gpt_config *cfg, int tp_size, int tp_rank, int pp_size,
                               int chunks, int pp_rank, int ep_rank, uint64_t seed, const float *const *full_init,
                               int *param_ids, int *module_ids)
{
    const int ep_size = cfg && cfg->moe_experts > 0 && cfg->moe_ep > 1 ? cfg->moe_ep : 1;
    if (ep_rank < 0 || ep_rank >= ep_size)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_engine_build: ep rank %d outside [0, moe ep %d)", ep_rank, ep_size);
    if (!e || !param_ids || !module_ids)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_engine_build: engine, param_ids or module_ids is NULL");
    int b, end;
    GPT_TRY(tp_config_validate(cfg, tp_size));
    if (chunks < 1) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_engine_build: %d chunks per stage", chunks);
    for (int c = 0; c < chunks; c++) GPT_TRY(pp_chunk_layers(cfg, pp_size, chunks, pp_rank, c, &b, &end));
    const size_t np = gpt_num_params(cfg);
    const int nm = gpt_num_modules(cfg);
    for (int m = 0; m < nm; m++) module_ids[m] = -1;
    for (size_t i = 0; i < np; i++) param_ids[i] = -1;
    /* modules first (engine module ids in model order), then the parameters */
    for (int m = 0; m < nm; m++) {
        int any = 0;
        for (int k = 0; k < gpt_module_num_tensors(cfg, m); k++) any |= pp_stage_holds_chunks(cfg, pp_size, chunks, pp_rank, m, k);
        if (!any) continue;
        char name[32];
        gpt_module_name(cfg, m, name, sizeof name);
        zero_status st = zero_engine_add_module(e, name, &module_ids[m]);
        if (st != ZERO_OK) return engine_fail(e, st, "tp_engine_build: add_module", name);
    }
    /* the callbacks' contexts: read by finalize, below */
    tp_init_ctx *ctx = calloc(np, sizeof *ctx);
    if (!ctx) return gpt_fail(ZERO_OUT_OF_MEMORY, "tp_engine_build: out of memory");
    zero_status st = ZERO_OK;
    for (size_t i = 0; i < np && st == ZERO_OK; i++) {
        tp_param_info info;
        st = tp_param_info_get(cfg, tp_size, tp_rank, i, &info);
        if (st != ZERO_OK) break;
        if (!pp_stage_holds_chunks(cfg, pp_size, chunks, pp_rank, info.full.module, info.full.index)) continue;
        ctx[i].tp_size = tp_size;
        ctx[i].tp_rank = tp_rank;
        ctx[i].seed = seed;
        ctx[i].ep_rank = ep_rank;
        st = register_param(e, &info, module_ids[info.full.module], full_init ? full_init[i] : NULL, &ctx[i],
                            &param_ids[i]);
        if (st != ZERO_OK) break;
        /* Count each tensor once in the model-parallel norm: tp-replicated
         * ones on tp rank 0, the tied wte on the first stage (the last
         * stage's copy is its replica). */
        int dup = (tp_rank > 0 && info.split == TP_REPLICATED) ||
                  (pp_size > 1 && pp_rank == pp_size - 1 && info.full.module == GPT_MODULE_EMBED &&
                   info.full.index == GPT_WTE) ||
                  (ep_rank > 0 && !info.full.expert_stack); /* the dense tensors: ep rank 0's count */
        if (dup && (st = zero_engine_set_param_duplicate(e, param_ids[i], 1)) != ZERO_OK)
            st = engine_fail(e, st, "tp_engine_build: set_param_duplicate", info.full.name);
    }
    if (st == ZERO_OK && (st = zero_engine_finalize(e)) != ZERO_OK)
        st = engine_fail(e, st, "tp_engine_build: finalize", "engine");
    free(ctx);
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
    zero_status st = zero_comm_split(world, grid->dp_rank, zero_comm_get_rank(world), out);
    if (st != ZERO_OK)
        return gpt_fail(st, "tp_engine_mp_create: split of %s by dp rank %d: %s", zero_comm_get_name(world),
                        grid->dp_rank, zero_comm_last_error(world));
    char name[32];
    snprintf(name, sizeof name, "mp(dp%d)", grid->dp_rank);
    (void)zero_comm_set_name(*out, name);
    return ZERO_OK;
}

zero_status tp_cp_groups_create(const zero_grid *grid, int cp, zero_comm **cp_out, zero_comm **dp_out)
{
    if (!grid || !grid->dp || !cp_out)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_cp_groups_create: grid, its dp group or cp_out is NULL");
    *cp_out = NULL;
    if (dp_out) *dp_out = NULL;
    if (cp < 1 || grid->dp_size % cp)
        return gpt_fail(ZERO_CONFIG, "tp_cp_groups_create: cp %d does not divide the grid's dp x cp size %d", cp,
                        grid->dp_size);
    const int r = grid->dp_rank, dp_rank = r / cp, cp_rank = r % cp;
    char name[48];
    zero_status st = zero_comm_split(grid->dp, dp_rank, cp_rank, cp_out);
    if (st == ZERO_OK && dp_out) st = zero_comm_split(grid->dp, cp_rank, dp_rank, dp_out);
    if (st != ZERO_OK) {
        zero_comm_destroy(*cp_out);
        *cp_out = NULL;
        return gpt_fail(st, "tp_cp_groups_create: split of %s: %s", zero_comm_get_name(grid->dp),
                        zero_comm_last_error(grid->dp));
    }
    snprintf(name, sizeof name, "cp(pp%d,tp%d,dp%d)", grid->pp_rank, grid->tp_rank, dp_rank);
    (void)zero_comm_set_name(*cp_out, name);
    if (dp_out) {
        snprintf(name, sizeof name, "dp(pp%d,tp%d,cp%d)", grid->pp_rank, grid->tp_rank, cp_rank);
        (void)zero_comm_set_name(*dp_out, name);
    }
    return ZERO_OK;
}
