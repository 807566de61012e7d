/* Pipeline parallelism for the GPT: stages, the tied embedding across
 * the first and last stage, and micro-batch schedules (GPipe and 1F1B; any
 * checked plan through pp_run_plan / pp_run_stage). The runtime drives a
 * stage through pp_stage.h: the CPU stage (tp_workspace, below) or the CUDA
 * stage (pp_stage_cuda.h).
 *
 * Stages. The n_layer blocks split into pp contiguous ranges, balanced (the
 * first n_layer % pp stages take one block more). Stage 0 also holds the
 * embedding (wte, wpe); the last stage holds ln_f and a COPY of wte for the
 * tied head. The two copies start equal (same init) and stay equal because
 * their gradients are summed before the optimizer step by one all-reduce
 * over the 2-rank "embedding group" {first, last} (Megatron's), and both
 * engines then apply the same update. With pp 1 there is one copy and no group.
 *
 * Schedules, over M micro-batches, on each stage's tp_workspace (whose
 * `slots` must be at least pp_slots_needed): activations go forward and
 * their gradients backward with zero_send/zero_recv over the pp group;
 * sends are asynchronous (waited before their buffer is reused), receives
 * block, so neither schedule deadlocks on rendezvous-size messages.
 *   GPipe  all M forwards, then all M backwards (M activation sets per stage)
 *   1F1B   stage s runs pp-s-1 warm-up forwards, then alternates one forward
 *          and one backward, then drains the backwards (PipeDream-flush, as
 *          Megatron's non-interleaved schedule): at most pp-s sets live.
 * Both compute the same gradients (each micro-batch's backward is the same
 * sequence of kernels; the accumulation order over micro-batches is 0..M-1
 * in both), so they are bitwise equal to each other.
 *
 * Errors: zero_status, message in gpt_last_error(). */
#ifndef ZERO_MODEL_PP_GPT_H
#define ZERO_MODEL_PP_GPT_H

#include <zero/comm.h>

#include "gpt.h"
#include "pp_plan.h"
#include "pp_stage.h"
#include "tp_gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks [*begin, *end) of stage pp_rank. ZERO_CONFIG when pp_size > n_layer. */
zero_status pp_stage_layers(const gpt_config *cfg, int pp_size, int pp_rank, int *begin, int *end);

/* 1 when stage pp_rank holds parameter (module, index) of gpt.h's list:
 * wte on the first and the last stage, wpe on the first, block i's tensors
 * on the stage whose range has i, ln_f on the last. */
int pp_stage_holds(const gpt_config *cfg, int pp_size, int pp_rank, int module, int index);

/* COLLECTIVE over `pp`: the group of its first and last rank (named
 * "pp_embed"); *out is NULL on the other ranks and when the group has one
 * rank. Destroy with zero_comm_destroy. */
zero_status pp_embed_group_create(zero_comm *pp, zero_comm **out);

/* COLLECTIVE over the embedding group (NULL: nothing to do): sum the two
 * stages' wte gradients in place (vocab x d_model floats at embed_grads->t[GPT_WTE]).
 * Call after the schedule, before grads_ready of the embed module. */
zero_status pp_tied_grad_allreduce(zero_comm *embed_group, const gpt_config *cfg, gpt_tensors *embed_grads);
/* The same for a gradient of `dtype` (the CUDA stage's: the engine's bf16
 * buffers under bf16 compute); pp_tied_grad_allreduce is ZERO_F32. */
zero_status pp_tied_grad_allreduce_dtype(zero_comm *embed_group, const gpt_config *cfg, gpt_tensors *embed_grads,
                                         zero_dtype dtype);

typedef enum pp_schedule {
    PP_GPIPE = 0,
    PP_1F1B = 1,
} pp_schedule;

/* Activation sets a stage needs for M micro-batches. */
int pp_slots_needed(pp_schedule kind, int micro_batches, int pp_size, int pp_rank);

typedef struct pp_step_args {
    int micro_batches;       /* M >= 1 */
    const int32_t *tokens;   /* M x batch x seq, micro-batch-major; read on the first stage */
    const int32_t *targets;  /* same shape; read on the last stage */
    float dloss;             /* each micro-batch's gradient is of dloss * its mean loss (1/M: the mean over M) */
    const gpt_tensors *params; /* gpt_num_modules(cfg) sets indexed by module; only this stage's are read */
    gpt_tensors *grads;      /* same; ACCUMULATED into */
} pp_step_args;

/* COLLECTIVE over `pp` (NULL or one rank: the whole model on this rank) and
 * the workspace's tp group: forward and backward of M micro-batches with
 * schedule `kind` (the plan pp_plan_generate makes, run by pp_run_plan). `loss` (may be NULL) receives the mean over the
 * micro-batches of their mean losses on EVERY stage (broadcast from the last).
 * Does not sum the tied gradient: call pp_tied_grad_allreduce after. */
zero_status pp_train_step(tp_workspace *ws, zero_comm *pp, pp_schedule kind, const pp_step_args *args, float *loss);

/* ------------------------------------------------------------ schedules as data
 * (pp_plan.h: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-H2, or any checked plan) */

/* Blocks [*begin, *end) of chunk `chunk` of stage `stage` when the model is
 * cut into pp_size * chunks virtual stages (chunk c of stage s is virtual
 * stage c * pp_size + s; balanced, the first ones one block longer).
 * chunks 1 is pp_stage_layers. ZERO_CONFIG when there are fewer blocks than
 * virtual stages. */
zero_status pp_chunk_layers(const gpt_config *cfg, int pp_size, int chunks, int stage, int chunk, int *begin,
                            int *end);
/* pp_stage_holds for a stage with `chunks` chunks: block i's tensors on the
 * stage one of whose chunks has i (embedding and head as pp_stage_holds). */
int pp_stage_holds_chunks(const gpt_config *cfg, int pp_size, int chunks, int pp_rank, int module, int index);

typedef struct pp_trace pp_trace;

typedef struct pp_run_opts {
    pp_trace *trace;        /* NULL, or spans of every op and communication wait are appended (pp_trace.h) */
    double simulate_op_s;   /* > 0: F, B and W each sleep this long instead of computing (B+W unsplit: twice);
                             * the messages still move. For measuring a schedule's bubble on clean timings. */
} pp_run_opts;

/* COLLECTIVE over `pp` (NULL or one rank: one stage) and the workspaces' tp
 * group: run this stage's list of `plan` (checked; plan->stages = the pp
 * size, plan->micro_batches = args->micro_batches). ws[c] is chunk c's
 * workspace: blocks pp_chunk_layers(c), at least plan->slots[stage * chunks
 * + c] slots; a plan that splits B and W allocates each workspace's W stash
 * on first use (tp_workspace_split_backward). Gradients accumulate in
 * micro-batch order per tensor in every schedule the generators make, so
 * their gradients are bitwise those of GPipe. `opts` may be NULL. `loss` as
 * pp_train_step. Errors name the transfer, micro-batch and stage. */
zero_status pp_run_plan(tp_workspace *const *ws, zero_comm *pp, const pp_plan *plan, const pp_step_args *args,
                        const pp_run_opts *opts, float *loss);

/* The same over any stage (pp_stage.h): pp_run_plan is this with the CPU
 * stage of its workspaces. The stage's buffers must be what `pp` moves
 * (host memory on MPI, device memory on NCCL / STAGED); args' tokens and
 * targets are host arrays; params / grads are the stage's (device pointers
 * on CUDA). */
zero_status pp_run_stage(const pp_stage *stage, zero_comm *pp, const pp_plan *plan, const pp_step_args *args,
                         const pp_run_opts *opts, float *loss);

/* The CPU stage of `chunks` tp workspaces (ws[c]: chunk c, borrowed: they
 * must outlive *st). Its compute is tp_gpt.h's, bit for bit as pp_run_plan
 * always ran it. */
zero_status pp_stage_tp(pp_stage *st, tp_workspace *const *ws, int chunks);

#ifdef __cplusplus
}
#endif

#endif
