/* zero-train with tensor and/or pipeline parallelism (model.tp, model.pp):
 * the grid (zero_grid_create: tp fastest, then dp, then pp), the engine
 * over the grid's dp group holding this rank's stage and tp shards
 * (model/tp_engine.h), the model-parallel group for the global gradient
 * norm, and one step = the pipeline schedule (1F1B) over the
 * gradient_accumulation_steps micro-batches of this dp rank.
 * See docs/zero-train.md "Tensor and pipeline parallelism". */
#ifndef TRAIN_PARALLEL_H
#define TRAIN_PARALLEL_H

#include <stddef.h>
#include <stdint.h>
#include <zero/zero.h>

#include "gpt.h"

typedef struct train_parallel train_parallel;

/* COLLECTIVE over `world`. Creates the grid, the engine (config `zc`,
 * whose gradient_accumulation_steps is forced to 1: the pipeline
 * accumulates the micro-batches itself) on `dev` (fp32 or bf16 compute),
 * registers and finalizes. A CUDA `dev` runs the CUDA stage (pp_stage_cuda.h;
 * model.tp and model.pp: cp, sequence parallelism, activation checkpointing
 * and, at tp > 1, a schedule that splits B and W are refused by name) and
 * `world` must then be the device world (NCCL or STAGED). `chunks` (model.pp_virtual, >= 1): chunks per
 * stage - the stage holds the blocks of all its chunks (interleaved schedules).
 * cp > 1: Ulysses context parallelism over cp ranks nested between tp and
 * dp (tp_cp_groups_create), the engine over the dp x cp ranks;
 * sequence_parallel: Megatron SP over tp (tp_gpt.h's tp_options).
 * cfg->moe_ep > 1 (MoE, tp 1, no cp): expert parallelism nested in the
 * stage's dp group, ep fastest (DeepSpeed-MoE's order); the engine runs over
 * the ranks holding the same experts (edp), the dense gradients are summed
 * over ep each step, the norm's group is pp x ep (docs/moe.md).
 * *engine is owned by the returned object. */
int train_parallel_create(train_parallel **out, zero_comm *world, const gpt_config *cfg, int tp, int pp, int chunks,
                          int cp, int sequence_parallel, int micro, int micro_batches, uint64_t seed,
                          const zero_config *zc, zero_device *dev,
                          zero_engine **engine, const gpt_checkpointing *ck, char *err, size_t err_size);
/* Before the first step: the pipeline schedule by name (model.pp_schedule; pp_plan.h) with `chunks`
 * chunks per stage (model.pp_virtual; the create's `chunks`). Without this call zero-train runs 1F1B. Builds and checks the
 * plan and the chunks' workspaces; -1 with the checker's or generator's message in err. */
int train_parallel_set_schedule(train_parallel *p, const char *schedule, int chunks, char *err, size_t err_size);
/* A line set_schedule wants printed (a mode it chose, e.g. fp32 activations for a split schedule
 * on CUDA in bf16), or "". */
const char *train_parallel_note(const train_parallel *p);
/* --trace: record every step's spans (pipeline ops, communication waits, the optimizer). */
void train_parallel_enable_trace(train_parallel *p);
/* The optimizer's span of this step (train_loop around zero_engine_step). */
void train_parallel_trace_optimizer(train_parallel *p, double t0, double t1);
/* COLLECTIVE over world: write the recorded spans as Chrome trace JSON to path (rank 0 writes). */
int train_parallel_write_trace(train_parallel *p, zero_comm *world, const char *path, char *err, size_t err_size);
void train_parallel_destroy(train_parallel *p); /* NULL accepted */

/* The groups of this rank for the communication report: tp, cp (if any),
 * pp and the engine's ("dp", or "dp x cp" with cp); returns how many. */
int train_parallel_comms(const train_parallel *p, const char **names, zero_comm **comms);
int train_parallel_dp_size(const train_parallel *p);
int train_parallel_tp_rank(const train_parallel *p);
int train_parallel_pp_rank(const train_parallel *p);
/* The engine's group (MPI, host memory): the grid's dp group, or the
 * expert-data-parallel group with model.moe.ep > 1; the comm of this rank's checkpoints. */
zero_comm *train_parallel_dp_comm(const train_parallel *p);
/* This rank's ep rank (model.moe.ep > 1; else 0). */
int train_parallel_ep_rank(const train_parallel *p);
/* "<dir>/tp<T>-pp<P>" ("-ep<E>" with model.moe.ep > 1): where this rank's position keeps its checkpoints. */
void train_parallel_ckpt_dir(const train_parallel *p, const char *dir, char *out, size_t out_size);
int train_parallel_dp_rank(const train_parallel *p);
/* The stage's activation workspace by kind: as allocated, and without checkpointing. */
void train_parallel_activation_bytes(const train_parallel *p, gpt_activation_bytes *now, gpt_activation_bytes *without);

/* COLLECTIVE. Forward and backward of this dp rank's micro_batches
 * micro-batches (tokens/targets: micro_batches x micro x seq) through the
 * pipeline, gradients into the engine and grads-ready; the caller then
 * calls zero_engine_step. `loss`: the mean loss of the micro-batches, the
 * same on every rank of this dp replica. */
int train_parallel_micro_steps(train_parallel *p, const int32_t *tokens, const int32_t *targets, float *loss,
                               char *err, size_t err_size);

#endif
