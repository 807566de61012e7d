/* The CUDA pipeline stage (pp_stage.h) over gpt_cuda.h's stage workspaces:
 * chunk c of stage pp_rank is one gpt_cuda_workspace over its blocks
 * (pp_chunk_layers) with the plan's slots for it, so the pipeline runtime
 * (pp_run_stage) runs every schedule on a GPU as it does on the CPU.
 *
 * The transfer buffers and everything the runtime hands the pp comm are
 * device memory (zero_device_alloc on `dev`): the comm must be a device
 * comm (NCCL, or STAGED at several ranks on one GPU). The runtime's buffers
 * come from a pool: allocated at their first request and reused by every
 * later step (pp_cuda_stage_transfer_allocs counts the allocations); the
 * runtime's events live in the stage's pp_run_cache the same way
 * (pp_cuda_stage_events_created counts them).
 *
 * Stream-ordered (pp_stage.h's contract): every chunk's workspace enqueues
 * on one stream - the caller's (`stream`: zero-train passes the engine's
 * compute stream, so the engine's gathers and step order themselves before
 * the stage's work by events, engine.h) or, NULL, one the stage creates
 * (non-blocking); forward, backward and W return once enqueued. The runtime orders the sends and
 * receives after their producers and before their consumers by events
 * (on the comm's stream when the pp comm has one set - NCCL - else by the
 * host waiting for one event before issuing a group). The loss is not read
 * per forward: each micro-batch's per-token losses are copied on the
 * stream into a pinned array of their own, and `finish` (the end of the
 * step: one host wait for the stream) computes the losses as
 * gpt_cuda_forward_end does, in forward order.
 *
 * Parameters and gradients are the engine's device buffers (fp32 or bf16,
 * as gpt_cuda.h takes them). The last stage's embedding set has only the
 * tied wte (pp_gpt.h); the CUDA head checks the whole embedding set, so the
 * stage lends it a wpe of its own (seq_len x d_model, never read; the
 * gradient written into it is thrown away).
 *
 * Split (B/W) plans run in both activation modes (the bf16 W stash holds
 * bf16 upstream gradients) and at tp > 1 (the stash at the tp rank's widths). `ck` (NULL: none) recomputes blocks as
 * gpt_cuda_workspace_create_ckpt does, per slot; a split plan then fails in
 * the runtime's split_backward (W needs the activations kept).
 *
 * Tensor parallelism: with a tp comm of P > 1 ranks (a device comm, as pp's)
 * each chunk's workspace is gpt_cuda_workspace_create_tp's - this rank's
 * shards, Megatron's all-reduces over tp inside the blocks, stream-ordered:
 * the stage sets the tp comm's stream to its own (zero_comm_set_stream) and
 * sets it back to none when destroyed (unless a newer stage took the comm
 * over): while the stage lives, other calls on the tp comm are
 * stream-ordered too (its asynchronous forms refused); the step's end
 * (finish) waits for the comm and returns a failed all-reduce. Each tp rank of
 * a stage runs the same schedule and sends its (replicated) activations to
 * the same tp rank of the next stage, as the CPU stage does.
 *
 * Builds without CUDA: creation is ZERO_UNSUPPORTED (gpt_cuda_stub.c). */
#ifndef ZERO_MODEL_PP_STAGE_CUDA_H
#define ZERO_MODEL_PP_STAGE_CUDA_H

#include <zero/device.h>

#include "gpt_cuda.h"
#include "pp_stage.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_cuda_stage pp_cuda_stage;

/* slots[c]: activation sets of chunk c (the plan's plan.slots[pp_rank * chunks + c]).
 * `dev` is borrowed (a CUDA device; the current device is the one the
 * workspaces are made on) and must outlive the stage; so must `stream`
 * (borrowed, a stream of dev; NULL: the stage makes its own), `tp` (the
 * stage's tp group; NULL or size 1: none) and `ep` (MoE blocks' expert-
 * parallel group, as gpt_cuda_workspace_create_moe; NULL when moe_ep <= 1).
 * MoE blocks: one CUDA MoE layer per slot and block
 * (gpt_cuda_workspace_create_stage_moe); forward adds moe_aux_loss_coef x
 * the chunk's aux losses to *loss (pp_stage.h: the runtime sums the stages'
 * shares), backward passes dloss to the layers' aux-loss gradient. */
zero_status pp_cuda_stage_create(pp_cuda_stage **out, const gpt_config *cfg, zero_device *dev, zero_stream *stream,
                                 int batch, zero_dtype param_dtype, const gpt_cuda_options *opts,
                                 const gpt_checkpointing *ck, int pp_size, int pp_rank, int chunks, const int *slots,
                                 zero_comm *tp, zero_comm *ep);
void pp_cuda_stage_destroy(pp_cuda_stage *s); /* NULL accepted */
/* The runtime's view (valid while *s lives). */
void pp_cuda_stage_view(pp_cuda_stage *s, pp_stage *out);
/* Device allocations made for the runtime's transfer buffers so far (the
 * pool: constant after the first step of a plan). */
int pp_cuda_stage_transfer_allocs(const pp_cuda_stage *s);
/* Device events the runtime made for this stage so far (pp_run_cache.h:
 * constant after the first step of a plan). */
int pp_cuda_stage_events_created(const pp_cuda_stage *s);
/* What the chunks' workspaces would allocate without activation checkpointing. */
void pp_cuda_stage_activation_bytes_without_ckpt(const pp_cuda_stage *s, gpt_activation_bytes *out);
/* Activation bytes summed over the chunks' workspaces (the W stash not included). */
void pp_cuda_stage_activation_bytes(const pp_cuda_stage *s, gpt_activation_bytes *out);

#ifdef __cplusplus
}
#endif

#endif
