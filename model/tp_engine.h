/* One rank's share of the model in a libzero engine: the parameters of its
 * pipeline stage (pp_stage_holds), as its tensor-parallel shards
 * (tp_param_info), registered with an engine whose dp group is the grid's
 * dp group. A trainer with tp/pp calls these where a single-rank trainer
 * walks gpt_param_info_get itself:
 *
 *     zero_engine_create(&e, &zc, grid.dp, dev);
 *     tp_engine_build(e, &cfg, grid.tp_size, grid.tp_rank, grid.pp_size, grid.pp_rank,
 *                     seed, NULL, param_ids, module_ids);   (registers and finalizes)
 *     per step: tp_engine_sets(e, &cfg, param_ids, params, grads);
 *               pp_train_step(ws, grid.pp, PP_1F1B, &args, &loss);
 *               pp_tied_grad_allreduce(embed_group, &cfg, &grads[GPT_MODULE_EMBED]);
 *               tp_engine_grads_ready(e, &cfg, module_ids);
 *               zero_engine_step(e, &result);
 *
 * Stages 0-2 (parameters stay whole). Stage 3 needs every module gathered
 * for the whole pipeline step (a schedule touches each module once per
 * micro-batch, forward and backward): gather them all before tp_engine_sets
 * and release them after, or set stage3_param_persistence_threshold above
 * the largest shard. Gradient clipping and the fp16 overflow skip span the
 * whole model: tp_engine_build marks every replicated copy but one as a
 * duplicate (zero_engine_set_param_duplicate), and the trainer gives the
 * engine the model-parallel group before the first step:
 *     tp_engine_mp_create(world, &grid, &mp); zero_engine_set_model_parallel(e, mp);
 * Without it the norm covers this rank's dp group only (each tp/pp rank
 * would clip by a different factor). Errors: zero_status, message in
 * gpt_last_error(). */
#ifndef ZERO_MODEL_TP_ENGINE_H
#define ZERO_MODEL_TP_ENGINE_H

#include <zero/engine.h>

#include "gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* COLLECTIVE over the engine's dp group (it finalizes). Adds one engine
 * module per model module this stage holds (named "embed", "block.3",
 * "final"; the last stage's "embed" holds only the tied wte copy), in model
 * order, and each held parameter's tp shard under its GPT-2 name, then
 * finalizes the engine. Initial values: the slice of full_init[i] (the full
 * tensor of parameter i, gpt_param_info order; copied, so the engine holds
 * the shard until finalize) or, when full_init is NULL, the slice of
 * gpt_param_init(seed) computed without building the full tensor: a
 * replicated tensor through its init spec, a split one through an init
 * callback (tp_param_init_range) that computes only the elements this rank
 * keeps. Fills param_ids (gpt_num_params entries) and module_ids
 * (gpt_num_modules entries) with engine ids, -1 where not held. */
zero_status tp_engine_build(zero_engine *e, const gpt_config *cfg, int tp_size, int tp_rank, int pp_size, int pp_rank,
                            uint64_t seed, const float *const *full_init, int *param_ids, int *module_ids);
/* The same for a stage of `chunks` chunks (interleaved schedules, pp_plan.h):
 * the blocks of all its chunks (pp_stage_holds_chunks), still one engine
 * module per model module in model order - so stage 0 of 2 with 2 chunks of
 * 8 blocks registers embed, block.0, block.1, block.4, block.5. chunks 1 is
 * tp_engine_build. ZERO_CONFIG when there are fewer blocks than pp_size x chunks. */
zero_status tp_engine_build_chunks(zero_engine *e, const gpt_config *cfg, int tp_size, int tp_rank, int pp_size,
                                   int chunks, int pp_rank, uint64_t seed, const float *const *full_init,
                                   int *param_ids, int *module_ids);

/* The same for an MoE model with expert parallelism (cfg->moe_ep > 1, tp 1):
 * this rank is ep rank `ep_rank`, its expert stacks initialised as that
 * rank's slice of the whole stacks (gpt_param_init_ep: every ep size starts
 * from the same experts), its dense tensors marked duplicate when ep_rank > 0
 * (they are equal on every ep rank once their gradients are summed over ep:
 * the norm counts ep rank 0's). The model-parallel group then spans every
 * rank holding a part of one replica (pp x ep). chunks 1, ep_rank 0 is
 * tp_engine_build. */
zero_status tp_engine_build_ep(zero_engine *e, const gpt_config *cfg, int tp_size, int tp_rank, int pp_size,
                               int chunks, int pp_rank, int ep_rank, uint64_t seed, const float *const *full_init,
                               int *param_ids, int *module_ids);

/* The module-indexed pointer sets (gpt_num_modules entries each) of the
 * held parameters and their gradient buffers (grads may be NULL); other
 * entries NULL. Call every step: stages 2-3 reallocate gradient buffers. */
zero_status tp_engine_sets(zero_engine *e, const gpt_config *cfg, const int *param_ids, gpt_tensors *params,
                           gpt_tensors *grads);

/* COLLECTIVE over `world`: the model-parallel group of this rank, the ranks
 * sharing its dp rank (tp x pp of them, in world order), named "mp(dpN)";
 * destroy with zero_comm_destroy after the engine. */
zero_status tp_engine_mp_create(zero_comm *world, const zero_grid *grid, zero_comm **out);

/* Context parallelism nested in the grid (docs/sequence-parallel.md). The
 * grid is made with zero_grid_create(world, tp, pp): its "dp" group then
 * spans dp x cp ranks, ordered dp-major (tp fastest, then cp, then dp, then
 * pp: Megatron-core's tp-cp-dp-pp order), and is the engine's group (the
 * replicated parameters' gradients are summed over cp there, as
 * DeepSpeed-Ulysses folds sp into its data-parallel group). COLLECTIVE over
 * grid->dp: splits it into the cp group of this rank (cp consecutive ranks,
 * named "cp(pp,tp,dp)") and, when dp_out is not NULL, the true data-parallel
 * group (the ranks with the same cp rank: they read different data).
 * ZERO_CONFIG when cp does not divide grid->dp_size. */
zero_status tp_cp_groups_create(const zero_grid *grid, int cp, zero_comm **cp_out, zero_comm **dp_out);

/* COLLECTIVE over the dp group: grads_ready of every held module, in model order. */
zero_status tp_engine_grads_ready(zero_engine *e, const gpt_config *cfg, const int *module_ids);

#ifdef __cplusplus
}
#endif

#endif
