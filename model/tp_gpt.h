/* Tensor parallelism (Megatron-LM style) for the CPU GPT, and the runtime of
 * one pipeline stage: a contiguous range of blocks, the embedding when the
 * range starts at block 0, the final LayerNorm and tied head when it ends at
 * the last block. With tp_size 1 and the whole range it computes what
 * gpt_forward/gpt_backward compute (bitwise: same kernels, same order).
 *
 * ------------------------------------------------------------ the split
 * Within a block, on a tp group of size P (n_head and 4*d_model multiples of
 * P), rank r holds:
 *   attn.c_attn   column-parallel: heads r*H/P .. (r+1)*H/P-1, i.e. rows
 *                 [r*C/P, (r+1)*C/P) of EACH of the q, k and v thirds of
 *                 the (3C, C) weight and of the bias (TP_SPLIT_QKV)
 *   attn.c_proj   row-parallel: columns [r*C/P, (r+1)*C/P) of the (C, C)
 *                 weight (TP_SPLIT_IN); the bias whole
 *   mlp.c_fc      column-parallel: rows [r*4C/P, (r+1)*4C/P) of the weight
 *                 and bias (TP_SPLIT_OUT)
 *   mlp.c_proj    row-parallel: those columns of the (C, 4C) weight; bias whole
 * Everything else (LayerNorms, row-parallel biases, wte, wpe, ln_f) is
 * REPLICATED: every tp rank holds it whole and computes its gradient
 * redundantly from the same (replicated) inputs - no tp all-reduce of
 * gradients. The MPI backend's all-reduce gives every rank the same bits, so
 * replicated gradients are bitwise equal across the tp group as long as the
 * ranks run the same OpenMP thread count (the per-thread partial sums
 * depend on it); the tests assert that equality.
 *
 * Megatron's conjugate operators: f (identity forward, all-reduce backward)
 * sits before each column-parallel linear, g (all-reduce forward, identity
 * backward) after each row-parallel linear. So per block: 2 all-reduces of
 * N x C floats forward and 2 backward. tp rank 0 adds the residual and the
 * row-parallel bias before its partial product enters the all-reduce (the
 * others add nothing), so the sum counts them once.
 *
 * Names: a shard keeps the GPT-2 name of its full tensor ("h.0.mlp.c_fc.weight");
 * the engine of each tp rank registers that rank's shard under that name,
 * and tp_param_info says which slice of the full tensor it is.
 *
 * Errors: zero_status; message in gpt_last_error(). Nothing prints or exits. */
#ifndef ZERO_MODEL_TP_GPT_H
#define ZERO_MODEL_TP_GPT_H

#include <zero/comm.h>

#include "gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ parameter shards */
typedef enum tp_split {
    TP_REPLICATED = 0, /* whole on every tp rank */
    TP_SPLIT_OUT = 1,  /* rows (outputs) of an (out, in) weight, or of its bias */
    TP_SPLIT_IN = 2,   /* columns (inputs) of an (out, in) weight */
    TP_SPLIT_QKV = 3,  /* rows of each third [q | k | v] of c_attn's weight or bias */
} tp_split;

typedef struct tp_param_info {
    gpt_param_info full; /* the tp=1 tensor: name, module, index, full shape, init */
    tp_split split;
    size_t shape[2];     /* this rank's shard (shape[1] = 1 for vectors) */
    size_t numel;
} tp_param_info;

/* ZERO_CONFIG unless tp_size >= 1 divides n_head (and so d_model and 4*d_model);
 * ZERO_UNSUPPORTED for an MoE model (cfg->moe_experts > 0) at tp_size > 1: its
 * blocks run in the stage runtime at tp 1 (an expert stack is then one
 * TP_REPLICATED tensor, this ep rank's experts: gpt_param_info). */
zero_status tp_config_validate(const gpt_config *cfg, int tp_size);
/* The shard of parameter i (gpt_param_info order) on tp rank `tp_rank`. */
zero_status tp_param_info_get(const gpt_config *cfg, int tp_size, int tp_rank, size_t i, tp_param_info *out);
/* Where row `row` of this rank's shard lies in the full tensor: the full
 * row and its first column (the shard row's shape[1] elements are
 * contiguous there). Vectors are shape[1] = 1 tensors. */
void tp_shard_row(const tp_param_info *info, int tp_size, int tp_rank, size_t row, size_t *full_row, size_t *col0);
/* Elements [begin, end) of this rank's shard of gpt_param_init(seed) of the
 * full tensor, computed from the full tensor's init spec without
 * materialising it (the engine's init callback for split tensors). */
zero_status tp_param_init_range(const tp_param_info *info, int tp_size, int tp_rank, uint64_t seed, uint64_t begin,
                                uint64_t end, float *out);
/* Copy this rank's slice of the full tensor `full` into `shard` (info->numel floats). */
void tp_param_slice(const tp_param_info *info, int tp_size, int tp_rank, const float *full, float *shard);
/* Write `shard` into its place in `full` (the rest of `full` untouched). */
void tp_param_unslice(const tp_param_info *info, int tp_size, int tp_rank, const float *shard, float *full);
/* COLLECTIVE over `tp`: every rank gets the full tensor (info->full.numel
 * floats) in `full`; a replicated tensor is copied from the own shard. */
zero_status tp_param_gather(zero_comm *tp, const tp_param_info *info, const float *shard, float *full);

/* ------------------------------------------------------------ stage runtime
 * A workspace for blocks [layer_begin, layer_end) of one tp rank, with
 * `slots` activation sets (micro-batches in flight, for pipeline schedules)
 * and one backward scratch shared by them (one backward runs at a time).
 * `tp` is borrowed (may be NULL for tp_size 1) and must outlive the
 * workspace. Parameter sets are this rank's shards, module-indexed as in
 * gpt.h; on a stage that holds the head but not the embedding, the embed set
 * needs only t[GPT_WTE] (the tied copy). */
typedef struct tp_workspace tp_workspace;

zero_status tp_workspace_create(tp_workspace **out, const gpt_config *cfg, zero_comm *tp, int batch, int seq,
                                int layer_begin, int layer_end, int slots);
/* The same with activation checkpointing (gpt.h's gpt_checkpointing; NULL:
 * none). Block l is recomputed iff l < ck->blocks, counted in the whole
 * model, so a pipeline stage recomputes its share of the first blocks. The
 * recomputation of a block repeats its forward all-reduce: every tp rank of
 * a group must use the same `ck`. With ck->partition each tp rank keeps
 * 1/tp of a recomputed block's input and the backward all-gathers it first
 * (one more collective per recomputed block). The recomputed blocks of all slots share
 * one block workspace (one forward or backward runs at a time). */
zero_status tp_workspace_create_ckpt(tp_workspace **out, const gpt_config *cfg, zero_comm *tp, int batch, int seq,
                                     int layer_begin, int layer_end, int slots, const gpt_checkpointing *ck);
/* Sequence and context parallelism (docs/sequence-parallel.md), with the
 * checkpointing option in one struct; zeroed fields: off.
 *
 * sequence_parallel (Megatron SP, needs tp > 1, tp dividing batch*seq/cp):
 * the LayerNorm / residual regions (and ln_f, the head's logits, the
 * embedding) hold rank r's 1/tp of the rows: rows [r Nc/tp, (r+1) Nc/tp) of
 * the Nc = batch*seq/cp token rows (b-major, so the sequence when batch is
 * 1). An all-gather over tp replaces f before each column-parallel linear
 * and a reduce-scatter replaces g's all-reduce after each row-parallel
 * one; backward mirrors them and re-gathers the two LayerNorm outputs for
 * the weight gradients (kept as 1/tp). The gradients of the LayerNorms',
 * ln_f's, wte's and wpe's replicated tensors are then partial sums over
 * the tp ranks: tp_seq_grad_allreduce sums them (once per step, after the
 * last micro-batch; Megatron's all-reduce of sequence-parallel grads).
 *
 * cp (Ulysses context parallelism; NULL: none; borrowed, outlives the
 * workspace): cp ranks split every sequence, rank c holding positions
 * [c T/cp, (c+1) T/cp) of each of the batch rows (cp divides seq and
 * n_head/tp). Around attention one all-to-all turns the qkv of those rows
 * into full sequences of n_head/(tp*cp) heads and one turns the attention
 * output back (two more in backward); everything else is sequence-local.
 * Every parameter is replicated over cp and its gradient is this rank's
 * rows' share: the sum over the cp group is the gradient (zero-train folds
 * cp into the engine's data-parallel group, as DeepSpeed-Ulysses does).
 *
 * Both: tokens and targets passed to the runtime are the whole micro-batch
 * (batch x seq, the same on every rank of the tp and cp groups); each rank
 * takes its rows. The loss is the mean over the group's targets (one
 * all-reduce of (sum, count) over each group), the same on every rank, and
 * backward scales by that count. Not with split_backward (W would need the
 * re-gathers) nor ck->partition under SP (the inputs are split already). */
typedef struct tp_options {
    const gpt_checkpointing *ck;
    int sequence_parallel;
    zero_comm *cp;
    /* MoE blocks (cfg->moe_experts > 0; docs/moe.md "With pipeline parallelism"):
     * the expert-parallel comm of cfg->moe_ep ranks (NULL when moe_ep <= 1;
     * borrowed, outlives the workspace). Each slot has its own MoE layer per
     * block (a layer keeps its routing and expert activations from forward to
     * backward, outside the activation report, as gpt_workspace_create_moe);
     * the ep ranks of a stage must run the same schedule (their all-to-alls
     * pair up in order). tp 1, no SP or cp, no split backward (refused by name). */
    zero_comm *ep;
} tp_options;

zero_status tp_workspace_create_opts(tp_workspace **out, const gpt_config *cfg, zero_comm *tp, int batch, int seq,
                                     int layer_begin, int layer_end, int slots, const tp_options *opts);
void tp_workspace_destroy(tp_workspace *ws); /* NULL accepted */
/* Bytes of the activation allocation; by kind; and for a shape without allocating. */
size_t tp_workspace_bytes(const tp_workspace *ws);
/* The MoE layer of block `layer` in slot `slot` (NULL: a dense model, or
 * outside the workspace's range): for reports and tests. */
struct gpt_moe *tp_workspace_moe_layer(const tp_workspace *ws, int slot, int layer);
void tp_workspace_activation_bytes(const tp_workspace *ws, gpt_activation_bytes *out);
zero_status tp_activation_bytes_for(const gpt_config *cfg, int tp_size, int batch, int seq, int layer_begin,
                                    int layer_end, int slots, const gpt_checkpointing *ck, gpt_activation_bytes *out);
/* The same for a cp group of cp_size ranks (opts->cp is not read; NULL opts: none). */
zero_status tp_activation_bytes_opts(const gpt_config *cfg, int tp_size, int cp_size, int batch, int seq,
                                     int layer_begin, int layer_end, int slots, const tp_options *opts,
                                     gpt_activation_bytes *out);
const gpt_config *tp_workspace_config(const tp_workspace *ws);
void tp_workspace_range(const tp_workspace *ws, int *layer_begin, int *layer_end);
int tp_workspace_slots(const tp_workspace *ws);
size_t tp_workspace_rows(const tp_workspace *ws);   /* rows of the residual stream held: batch*seq/cp (/tp under SP) */
size_t tp_workspace_tokens(const tp_workspace *ws); /* tokens of a micro-batch: batch * seq */
int tp_workspace_has_embed(const tp_workspace *ws); /* layer_begin == 0 */
int tp_workspace_has_head(const tp_workspace *ws);  /* layer_end == n_layer */
/* The matmuls' precision, as gpt_workspace_set_matmul_dtype (gpt.h): ZERO_F32
 * (the default) or ZERO_BF16 (bf16 products, fp32 sums); the rest stays fp32. */
zero_status tp_workspace_set_matmul_dtype(tp_workspace *ws, zero_dtype dtype);
/* MoE: the dloss of the next backward's auxiliary losses (each MoE block's
 * aux-loss gradient is dloss x aux_loss_coef, as gpt_backward's). The head's
 * backward sets it on the last stage; a pipeline sets it on every stage
 * before each backward (pp_run_plan does). Without MoE: no effect. */
void tp_workspace_set_moe_dloss(tp_workspace *ws, float dloss);
/* MoE: the auxiliary losses of slot `slot`'s last forward summed over this
 * workspace's blocks, unweighted (0 without MoE); the model's loss adds
 * aux_loss_coef x the sum over all stages. */
float tp_workspace_moe_aux(const tp_workspace *ws, int slot);
/* The input of block layer_begin for slot `slot` (rows x d_model): a
 * later pipeline stage receives the previous stage's output into it. */
float *tp_workspace_input(tp_workspace *ws, int slot);
/* The output of block layer_end-1 for slot `slot` (what a stage sends on). */
const float *tp_workspace_output(const tp_workspace *ws, int slot);
/* The residual-stream gradient (rows x d_model), shared by the slots:
 * a stage without the head receives d(output) into it before its backward
 * blocks; after the backward of block layer_begin it holds d(input). */
float *tp_workspace_dresid(tp_workspace *ws);

/* Forward of slot `slot`: embed (first stage only), blocks layer_begin ..
 * layer_end-1 in order, head (last stage only: ln_f, tied logits, loss =
 * mean over targets >= 0; `loss` may be NULL). */
zero_status tp_forward_embed(tp_workspace *ws, int slot, const int32_t *tokens, const gpt_tensors *embed);
zero_status tp_forward_block(tp_workspace *ws, int slot, int layer, const gpt_tensors *block);
zero_status tp_forward_head(tp_workspace *ws, int slot, const int32_t *targets, const gpt_tensors *final_params,
                            const gpt_tensors *embed, float *loss);
/* Backward of slot `slot`, gradients of dloss * loss ACCUMULATED into the
 * grads: head (last stage), blocks in descending order, embed (first stage). */
zero_status tp_backward_head(tp_workspace *ws, int slot, float dloss, const gpt_tensors *final_params,
                             gpt_tensors *final_grads, const gpt_tensors *embed, gpt_tensors *embed_grads);
zero_status tp_backward_block(tp_workspace *ws, int slot, int layer, const gpt_tensors *block,
                              gpt_tensors *block_grads);
zero_status tp_backward_embed(tp_workspace *ws, int slot, gpt_tensors *embed_grads);

/* COLLECTIVE over tp under sequence parallelism (else nothing): sums over
 * the tp group the gradients that are partial there - the LayerNorms of the
 * stage's blocks, and wte/wpe, ln_f where the stage holds them. `grads`:
 * module-indexed sets (gpt_num_modules). Call once per step after the
 * last micro-batch's backward (before a pipeline's tied-embedding sum). */
zero_status tp_seq_grad_allreduce(tp_workspace *ws, gpt_tensors *grads);

/* The block backward split in two for zero-bubble pipeline schedules
 * (gpt_block.h): B = tp_backward_block_input (everything but the linear
 * layers' weight and bias gradients; the same order rules as
 * tp_backward_block), W = tp_backward_block_weight (those gradients, from a
 * stash B filled), any time later. A slot is free for a new micro-batch only
 * once every W of it ran (a forward into it is ZERO_INVALID_STATE before).
 * B then W computes the same bits as tp_backward_block. The head's and the
 * embedding's gradients stay whole (tp_backward_head / _embed: cheap, and
 * their inputs are there anyway).
 * tp_workspace_split_backward allocates the stash (slots x blocks x
 * N(2C + Hl + 3Cl) floats, and with MoE blocks each slot's MoE layers'
 * stashes, gpt_moe_split_backward: see tp_workspace_wstash_bytes);
 * ZERO_UNSUPPORTED when the workspace recomputes blocks (activation
 * checkpointing) or runs sequence / context parallelism. MoE blocks defer
 * their experts' weight gradients to W as the dense MLP does (the router's
 * stays in B; W runs no exchange). */
zero_status tp_workspace_split_backward(tp_workspace *ws);
size_t tp_workspace_wstash_bytes(const tp_workspace *ws);
zero_status tp_backward_block_input(tp_workspace *ws, int slot, int layer, const gpt_tensors *block,
                                    gpt_tensors *block_grads);
zero_status tp_backward_block_weight(tp_workspace *ws, int slot, int layer, gpt_tensors *block_grads);

#ifdef __cplusplus
}
#endif

#endif
