/* Pipeline stages and the GPipe / 1F1B micro-batch schedules over a
 * tp_workspace (see pp_gpt.h). */
#include <string.h>

#include "gpt_internal.h"
#include "pp_gpt.h"
#include "pp_plan.h"

/* ------------------------------------------------------------ stages */
zero_status pp_stage_layers(const gpt_config *cfg, int pp_size, int pp_rank, int *begin, int *end)
{
    GPT_TRY(gpt_config_validate(cfg));
    if (!begin || !end) return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_stage_layers: begin or end is NULL");
    if (pp_size < 1 || pp_size > cfg->n_layer)
        return gpt_fail(ZERO_CONFIG, "pp config: %d stages for %d blocks (each stage needs at least one block)",
                        pp_size, cfg->n_layer);
    if (pp_rank < 0 || pp_rank >= pp_size)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_stage_layers: stage %d outside [0, %d)", pp_rank, pp_size);
    int base = cfg->n_layer / pp_size, extra = cfg->n_layer % pp_size;
    *begin = pp_rank * base + (pp_rank < extra ? pp_rank : extra);
    *end = *begin + base + (pp_rank < extra ? 1 : 0);
    return ZERO_OK;
}

int pp_stage_holds(const gpt_config *cfg, int pp_size, int pp_rank, int module, int index)
{
    int b, e;
    if (pp_stage_layers(cfg, pp_size, pp_rank, &b, &e) != ZERO_OK) return 0;
    int first = pp_rank == 0, last = pp_rank == pp_size - 1;
    if (module == GPT_MODULE_EMBED) return index == GPT_WTE ? first || last : first;
    if (module == gpt_module_final(cfg)) return last;
    return module - 1 >= b && module - 1 < e;
}

zero_status pp_embed_group_create(zero_comm *pp, zero_comm **out)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_embed_group_create: out is NULL");
    *out = NULL;
    if (!pp || zero_comm_get_size(pp) == 1) return ZERO_OK;
    int r = zero_comm_get_rank(pp), n = zero_comm_get_size(pp);
    /* split needs a color on every rank: middle stages get groups of their own, dropped */
    int member = r == 0 || r == n - 1;
    zero_comm *g = NULL;
    zero_status st = zero_comm_split(pp, member ? 0 : 1 + r, r, &g);
    if (st != ZERO_OK)
        return gpt_fail(st, "pp_embed_group_create: split of %s at stage %d: %s", zero_comm_get_name(pp), r,
                        zero_comm_last_error(pp));
    if (!member) {
        zero_comm_destroy(g);
        return ZERO_OK;
    }
    zero_comm_set_name(g, "pp_embed");
    *out = g;
    return ZERO_OK;
}

zero_status pp_tied_grad_allreduce(zero_comm *group, const gpt_config *cfg, gpt_tensors *embed_grads)
{
    return pp_tied_grad_allreduce_dtype(group, cfg, embed_grads, ZERO_F32);
}

zero_status pp_tied_grad_allreduce_dtype(zero_comm *group, const gpt_config *cfg, gpt_tensors *embed_grads,
                                         zero_dtype dtype)
{
    if (!group) return ZERO_OK;
    if (!cfg || !embed_grads || !embed_grads->t[GPT_WTE])
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_tied_grad_allreduce: cfg or the wte gradient is NULL");
    size_t n = (size_t)cfg->vocab * cfg->d_model;
    zero_status st = zero_allreduce(group, embed_grads->t[GPT_WTE], embed_grads->t[GPT_WTE], n, dtype, ZERO_SUM);
    if (st != ZERO_OK)
        return gpt_fail(st, "pp_tied_grad_allreduce: wte.weight gradient (%zu x %s) over %s, rank %d: %s", n,
                        zero_dtype_name(dtype), zero_comm_get_name(group), zero_comm_get_rank(group),
                        zero_comm_last_error(group));
    return ZERO_OK;
}

int pp_slots_needed(pp_schedule kind, int micro_batches, int pp_size, int pp_rank)
{
    if (kind == PP_GPIPE) return micro_batches;
    int live = pp_size - pp_rank;
    return live < micro_batches ? live : micro_batches;
}

zero_status pp_chunk_layers(const gpt_config *cfg, int pp_size, int chunks, int stage, int chunk, int *begin,
                            int *end)
{
    GPT_TRY(gpt_config_validate(cfg));
    if (!begin || !end) return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_chunk_layers: begin or end is NULL");
    if (chunks < 1 || pp_size < 1 || stage < 0 || stage >= pp_size || chunk < 0 || chunk >= chunks)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_chunk_layers: chunk %d of stage %d with %d stages x %d chunks", chunk,
                        stage, pp_size, chunks);
    if (chunks == 1) return pp_stage_layers(cfg, pp_size, stage, begin, end);
    int nv = pp_size * chunks;
    if (nv > cfg->n_layer)
        return gpt_fail(ZERO_CONFIG, "pp config: %d stages x %d chunks = %d virtual stages for %d blocks (each needs a block)",
                        pp_size, chunks, nv, cfg->n_layer);
    int q = chunk * pp_size + stage, base = cfg->n_layer / nv, extra = cfg->n_layer % nv;
    *begin = q * base + (q < extra ? q : extra);
    *end = *begin + base + (q < extra ? 1 : 0);
    return ZERO_OK;
}

int pp_stage_holds_chunks(const gpt_config *cfg, int pp_size, int chunks, int pp_rank, int module, int index)
{
    if (chunks <= 1) return pp_stage_holds(cfg, pp_size, pp_rank, module, index);
    if (module == GPT_MODULE_EMBED || module == gpt_module_final(cfg))
        return pp_stage_holds(cfg, pp_size, pp_rank, module, index);
    for (int c = 0; c < chunks; c++) {
        int b, e;
        if (pp_chunk_layers(cfg, pp_size, chunks, pp_rank, c, &b, &e) != ZERO_OK) return 0;
        if (module - 1 >= b && module - 1 < e) return 1;
    }
    return 0;
}

/* ------------------------------------------------------------ the schedule
 * GPipe and 1F1B are plans (pp_plan.h) run by pp_run_plan (pp_exec.c). */
zero_status pp_train_step(tp_workspace *ws, zero_comm *pp, pp_schedule kind, const pp_step_args *a, float *loss)
{
    if (!ws || !a || !a->params || !a->grads)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_train_step: workspace, args, params or grads is NULL");
    if (kind != PP_GPIPE && kind != PP_1F1B)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_train_step: unknown schedule %d", (int)kind);
    int nstages = pp && zero_comm_get_size(pp) > 1 ? zero_comm_get_size(pp) : 1;
    int stage = nstages > 1 ? zero_comm_get_rank(pp) : 0;
    int has_embed = tp_workspace_has_embed(ws), has_head = tp_workspace_has_head(ws);
    if (has_embed != (stage == 0) || has_head != (stage == nstages - 1))
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "pp_train_step: stage %d of %d, but the workspace %s the embedding and %s the head", stage,
                        nstages, has_embed ? "has" : "lacks", has_head ? "has" : "lacks");
    int need = pp_slots_needed(kind, a->micro_batches, nstages, stage);
    if (a->micro_batches < 1 || tp_workspace_slots(ws) < need)
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "pp_train_step: %d micro-batches need %d activation slots at stage %d, the workspace has %d",
                        a->micro_batches, need, stage, tp_workspace_slots(ws));
    pp_plan plan;
    GPT_TRY(pp_plan_generate(&plan, kind == PP_GPIPE ? PP_SCHED_GPIPE : PP_SCHED_1F1B, nstages, a->micro_batches, 1));
    tp_workspace *one[1] = {ws};
    zero_status st = pp_run_plan(one, pp, &plan, a, NULL, loss);
    pp_plan_free(&plan);
    return st;
}
