/* The minimal GPT on a CUDA GPU: the same module-by-module API as gpt.h,
 * with every parameter and gradient pointer in DEVICE memory.
 *
 * Precision (gpt_cuda_options):
 *  - math: the matmuls run through cuBLAS with CUBLAS_COMPUTE_32F_FAST_16BF
 *    (GPT_CUDA_MATH_BF16, the default: inputs rounded to bf16 on the tensor
 *    cores, products accumulated in fp32) or plain fp32 (GPT_CUDA_MATH_FP32,
 *    no TF32), so the kernels can be checked against the CPU path tightly;
 *  - act_dtype: activations stored fp32 (ZERO_F32, the default) or bf16
 *    (ZERO_BF16: every matmul input and output but the residual stream, the
 *    logits and the LayerNorm statistics is bf16; matmuls are cuBLASLt with
 *    bf16 inputs, fp32 compute, and their bias / GELU / bias-gradient work
 *    fused into epilogues; needs math BF16 and flash attention);
 *  - attention: GPT_CUDA_ATTN_UNFUSED materialises the B x H x T x T
 *    probabilities (cuBLAS batched gemms and a softmax kernel: the simple
 *    reference), GPT_CUDA_ATTN_FLASH is the fused tiled kernel of
 *    gpt_flash.h (online softmax, only a log-sum-exp per row kept).
 * gpt_cuda_workspace_create(_ckpt) keep the original mode (fp32 activations,
 * unfused attention, `math` as given); gpt_cuda_workspace_create_opts
 * chooses. Parameters and gradients may be fp32 or bf16 (param_dtype, both
 * the same dtype, as the engine hands them out): bf16 parameters are widened
 * to an fp32 copy per module call (and an fp32 module is narrowed to a bf16
 * copy for the bf16 activation mode's matmuls), and a bf16 module's gradient
 * is computed in fp32 and then added (rounded once) to the bf16 buffer.
 *
 * Everything is enqueued on the stream given at creation (NULL: the legacy
 * default stream). Calls that return host values (the loss, the logits)
 * synchronize that stream. Only this file's declarations are CUDA-specific;
 * it compiles without CUDA headers (the stream is a void *). In a build
 * without CUDA every function returns ZERO_UNSUPPORTED. */
#ifndef ZERO_MODEL_GPT_CUDA_H
#define ZERO_MODEL_GPT_CUDA_H

#include <zero/comm.h>
#include <zero/device.h>
#include <zero/dtype.h>

#include "gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gpt_cuda_math {
    GPT_CUDA_MATH_BF16 = 0,  /* bf16 tensor-core products, fp32 accumulation */
    GPT_CUDA_MATH_FP32 = 1,  /* fp32 products (no TF32): for checking kernels */
} gpt_cuda_math;

typedef enum gpt_cuda_attention {
    GPT_CUDA_ATTN_UNFUSED = 0, /* scores materialised (B x H x T x T), batched gemms + softmax kernel */
    GPT_CUDA_ATTN_FLASH = 1,   /* fused, tiled, online softmax (gpt_flash.h); head size <= 128 */
} gpt_cuda_attention;

typedef struct gpt_cuda_options {
    gpt_cuda_math math;           /* the matmuls' products */
    zero_dtype act_dtype;         /* ZERO_F32 or ZERO_BF16 (bf16 needs math BF16 and flash attention) */
    gpt_cuda_attention attention;
} gpt_cuda_options;

/* The training mode: bf16 activations, flash attention, bf16 products. */
#define GPT_CUDA_OPTIONS_BF16 {GPT_CUDA_MATH_BF16, ZERO_BF16, GPT_CUDA_ATTN_FLASH}

typedef struct gpt_cuda_workspace gpt_cuda_workspace;

/* 1 when this build has the CUDA path and a GPU is visible. */
int gpt_cuda_available(void);

/* On the current CUDA device. param_dtype: ZERO_F32 or ZERO_BF16. */
zero_status gpt_cuda_workspace_create(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                      zero_dtype param_dtype, gpt_cuda_math math, void *cuda_stream);
/* The same with activation checkpointing (gpt.h's gpt_checkpointing; NULL:
 * none). With ck->cpu_offload the inputs of the recomputed blocks live in
 * pinned host memory (cudaHostAlloc): each is copied there on the stream
 * after the block that produced it, and back before the block's
 * recomputation, so the device holds two of them instead of ck->blocks. */
zero_status gpt_cuda_workspace_create_ckpt(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                           zero_dtype param_dtype, gpt_cuda_math math, void *cuda_stream,
                                           const gpt_checkpointing *ck);
/* The same with the options above (NULL: {math BF16, F32, UNFUSED}, as
 * gpt_cuda_workspace_create). An invalid combination is ZERO_UNSUPPORTED
 * naming it (bf16 activations with unfused attention or fp32 math; flash
 * attention with a head size above 128). */
zero_status gpt_cuda_workspace_create_opts(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                           zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                           const gpt_checkpointing *ck);
/* The same for a model with MoE blocks (cfg->moe_experts > 0: gpt.h, moe.h)
 * with expert parallelism over `ep`, as gpt_workspace_create_moe on the CPU:
 * a comm of cfg->moe_ep ranks (borrowed; NCCL or STAGED, whose all-to-all-v
 * take device buffers), NULL when moe_ep <= 1. Every block's MLP is then a
 * CUDA MoE layer (gpt_moe_create_cuda) on the workspace's stream, fp32
 * inside (bf16 parameters are widened and their gradients rounded as for
 * every module; with bf16 activations its input is widened and its input
 * gradient rounded); its routing and expert activations live in the layer,
 * outside the activation report; a recomputed block redoes ln_2 but not its
 * MoE; an MoE block's forward and backward synchronize the stream (the slots
 * are decided on the host). The loss of gpt_cuda_forward_end adds
 * moe_aux_loss_coef x the blocks' aux losses. No split backward (B/W) with
 * MoE blocks: gpt_cuda_workspace_split_backward is ZERO_UNSUPPORTED. */
zero_status gpt_cuda_workspace_create_moe(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                          zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                          const gpt_checkpointing *ck, zero_comm *ep);
/* The auxiliary losses of the last forward summed over the blocks
 * (unweighted), as gpt_workspace_moe_aux; 0 without MoE. */
float gpt_cuda_workspace_moe_aux(const gpt_cuda_workspace *ws);
/* Block `layer`'s MoE layer (NULL: dense or out of range), as gpt_workspace_moe_layer. */
struct gpt_moe *gpt_cuda_workspace_moe_layer(const gpt_cuda_workspace *ws, int layer);
void gpt_cuda_workspace_destroy(gpt_cuda_workspace *ws); /* NULL accepted */
/* Bytes of the device allocation (activations + scratch); by kind (host:
 * the pinned offload buffer); for a shape without a GPU or an allocation. */
size_t gpt_cuda_workspace_bytes(const gpt_cuda_workspace *ws);
void gpt_cuda_workspace_activation_bytes(const gpt_cuda_workspace *ws, gpt_activation_bytes *out);
zero_status gpt_cuda_activation_bytes_for(const gpt_config *cfg, int batch, int seq, zero_dtype param_dtype,
                                          const gpt_checkpointing *ck, gpt_activation_bytes *out);
zero_status gpt_cuda_activation_bytes_for_opts(const gpt_config *cfg, int batch, int seq, zero_dtype param_dtype,
                                               const gpt_cuda_options *opts, const gpt_checkpointing *ck,
                                               gpt_activation_bytes *out);
/* Copy the logits (batch, seq, vocab) of the last forward to host memory. */
zero_status gpt_cuda_workspace_logits(gpt_cuda_workspace *ws, float *host_out);

/* As gpt_forward_begin ...: tokens and targets are HOST arrays (copied);
 * tensors are device pointers; *loss is computed on the host from the
 * per-token losses (this synchronizes the stream). */
zero_status gpt_cuda_forward_begin(gpt_cuda_workspace *ws, const int32_t *tokens, const int32_t *targets,
                                   const gpt_tensors *embed);
zero_status gpt_cuda_forward_block(gpt_cuda_workspace *ws, int layer, const gpt_tensors *block);
zero_status gpt_cuda_forward_end(gpt_cuda_workspace *ws, const gpt_tensors *final_params,
                                 const gpt_tensors *embed, float *loss);
zero_status gpt_cuda_backward_end(gpt_cuda_workspace *ws, float dloss, const gpt_tensors *final_params,
                                  gpt_tensors *final_grads, const gpt_tensors *embed, gpt_tensors *embed_grads);
zero_status gpt_cuda_backward_block(gpt_cuda_workspace *ws, int layer, const gpt_tensors *block,
                                    gpt_tensors *block_grads);
zero_status gpt_cuda_backward_begin(gpt_cuda_workspace *ws, gpt_tensors *embed_grads);

/* The block backward split in two for zero-bubble pipeline schedules, as on
 * the CPU (gpt_block.h): B = gpt_cuda_backward_block_input (everything but
 * the four linear layers' weight and bias gradients; the same order rules
 * as gpt_cuda_backward_block), which copies each of those layers' upstream
 * gradient into the block's W stash; W = gpt_cuda_backward_block_weight
 * (those gradients, from the stash and the block's activations), any time
 * after its B and before the next forward (gpt_cuda_forward_begin is
 * ZERO_INVALID_STATE while a W is due: the forward would overwrite the
 * activations W reads). Both enqueue on the workspace's stream. B then W
 * runs the gemms of the unsplit backward on the same operands; the bias and
 * LayerNorm reductions use atomics, so only the gemm outputs are
 * reproducible bit for bit (tests/model/test_gpt_cuda_split.c).
 * Both activation modes: the stash holds the upstream gradients in the
 * activation type (bf16 in the bf16 mode, whose W runs the unsplit
 * backward's cuBLASLt weight gemm with its bias-gradient epilogue).
 * gpt_cuda_workspace_split_backward allocates the stash (its own cudaMalloc of
 * blocks x slots x batch x seq x (2 d_model + 7 d_model / P) elements of the
 * activation type, P the tp size - this rank's widths:
 * gpt_cuda_workspace_wstash_bytes); ZERO_UNSUPPORTED when blocks are
 * recomputed (activation checkpointing) or with MoE blocks. */
zero_status gpt_cuda_workspace_split_backward(gpt_cuda_workspace *ws);
size_t gpt_cuda_workspace_wstash_bytes(const gpt_cuda_workspace *ws);
zero_status gpt_cuda_backward_block_input(gpt_cuda_workspace *ws, int layer, const gpt_tensors *block,
                                          gpt_tensors *block_grads);
zero_status gpt_cuda_backward_block_weight(gpt_cuda_workspace *ws, int layer, gpt_tensors *block_grads);

/* ------------------------------------------------------------ pipeline stages
 * A workspace for blocks [layer_begin, layer_end) with `slots` activation
 * sets (micro-batches in flight): the CUDA stage of the pipeline runtime
 * (pp_stage_cuda.h). ONE workspace holds every slot rather than one
 * workspace per slot: the scratch (attention buffers, the bf16 staging of
 * parameters, cuBLAS / cuBLASLt handles and cuBLASLt's 32 MiB workspace)
 * is shared, since one forward or backward runs at a time, and only the
 * activations (and a split backward's W stash) are per slot. The embedding
 * runs only when layer_begin is 0, the head only when layer_end is n_layer;
 * the whole-model workspaces above are [0, n_layer) with one slot.
 * gpt_cuda_workspace_select_slot chooses the slot every call below works
 * on (each slot keeps its own place in the forward/backward sequence, so a
 * pipeline interleaves slots freely; the W stash of a split backward is per
 * slot, so a slot's W may wait while other slots run forward). */
zero_status gpt_cuda_workspace_create_stage(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                            zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                            const gpt_checkpointing *ck, int layer_begin, int layer_end, int slots);
/* Tensor parallelism: the stage workspace of one rank of the tp group `tp`
 * (borrowed, outlives the workspace; NULL or size 1: gpt_cuda_workspace_create_stage).
 * Its block parameter and gradient sets are this rank's SHARDS as
 * tp_param_info_get (tp_gpt.h) lays them out - the CPU tp GPT's layout:
 * c_attn's heads [r NH/P, (r+1) NH/P) of q, k and v, c_fc's rows, the two
 * projections' columns; LayerNorms, the projections' biases, the embedding
 * and ln_f whole, their gradients computed redundantly on every tp rank.
 * Per block, 2 all-reduces of batch x seq x d_model fp32 floats forward
 * (after each row-parallel projection: tp rank 0 adds residual and bias)
 * and 2 backward (d ln_1, d ln_2, the column-parallel layers' input
 * gradients; with bf16 activations those are computed and summed in fp32).
 * `tp` must take device buffers (NCCL, or STAGED: several ranks on one GPU).
 * Ordering: when tp has a stream set (zero_comm_set_stream) it must wrap
 * this workspace's stream, and the all-reduces are stream-ordered on it
 * (gpt_cuda_workspace_sync and the loss also wait for them and report a
 * failed one); without a stream the host waits for the workspace's stream
 * before each all-reduce, which then completes in the call.
 * Every rank of the group must make the same calls (the all-reduces pair
 * up in order). The split backward (gpt_cuda_workspace_split_backward) runs
 * at P > 1: its stash holds the upstream gradients at this rank's widths, B
 * does the all-reduces, W none. Refused: P not dividing n_head, MoE blocks
 * (ZERO_UNSUPPORTED, tp_config_validate), ck->partition. */
zero_status gpt_cuda_workspace_create_tp(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                         zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                         const gpt_checkpointing *ck, int layer_begin, int layer_end, int slots,
                                         zero_comm *tp);
/* The activation bytes of such a workspace (tp_size 1: a stage of
 * gpt_cuda_workspace_create_stage), without a GPU. */
zero_status gpt_cuda_activation_bytes_stage(const gpt_config *cfg, int tp_size, int batch, int seq,
                                            zero_dtype param_dtype, const gpt_cuda_options *opts,
                                            const gpt_checkpointing *ck, int layer_begin, int layer_end, int slots,
                                            gpt_activation_bytes *out);
/* A stage workspace (tp as gpt_cuda_workspace_create_tp) whose model has
 * MoE blocks (cfg->moe_experts > 0) over `ep` (as gpt_cuda_workspace_create_moe;
 * NULL when moe_ep <= 1): one CUDA MoE layer per slot and block of the range,
 * since each layer keeps its micro-batch's routing and expert activations
 * until its backward (select_slot switches them with the activations).
 * MoE at tp > 1 is refused (tp_config_validate). */
zero_status gpt_cuda_workspace_create_stage_moe(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                                zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                                const gpt_checkpointing *ck, int layer_begin, int layer_end, int slots,
                                                zero_comm *tp, zero_comm *ep);
/* The dloss the next block backwards scale their MoE aux-loss gradient by
 * (gpt_cuda_backward_end sets it; a stage without the head calls this). */
void gpt_cuda_workspace_set_moe_dloss(gpt_cuda_workspace *ws, float dloss);
zero_status gpt_cuda_workspace_select_slot(gpt_cuda_workspace *ws, int slot);
int gpt_cuda_workspace_slots(const gpt_cuda_workspace *ws);
void gpt_cuda_workspace_range(const gpt_cuda_workspace *ws, int *layer_begin, int *layer_end);
/* Device pointer: slot `slot`'s output of block layer_end-1 (batch x seq x
 * d_model fp32: the residual stream is fp32 in every mode); NULL when out of range. */
const float *gpt_cuda_workspace_output(const gpt_cuda_workspace *ws, int slot);
/* The forward of a range that starts after block 0: `in` (device, batch x
 * seq x d_model fp32) is copied into the selected slot's input; `targets`
 * (host) as gpt_cuda_forward_begin, non-NULL only when the range ends with
 * the head. Then gpt_cuda_forward_block for each block of the range. */
zero_status gpt_cuda_forward_begin_input(gpt_cuda_workspace *ws, const float *in, const int32_t *targets);
/* The backward of a range that does not end with the head: `dout` (device)
 * is the gradient of its output; then gpt_cuda_backward_block(_input) from
 * layer_end-1 down. */
zero_status gpt_cuda_backward_end_output(gpt_cuda_workspace *ws, const float *dout);
/* After the blocks' backward of a range that starts after block 0: the
 * gradient of its input into `din` (device). */
zero_status gpt_cuda_backward_begin_input(gpt_cuda_workspace *ws, float *din);
/* Wait (host) until everything enqueued on the workspace's stream ran. */
zero_status gpt_cuda_workspace_sync(gpt_cuda_workspace *ws);
/* After gpt_cuda_forward_end(..., loss NULL) of the selected slot: the device
 * array of its N per-token losses (valid until the next forward_end on the
 * workspace, in stream order) and the count of valid targets, from which
 * gpt_cuda_forward_end computes the loss: (float)(sum in double / valid), 0
 * when none. Lets a caller copy them on the stream and read the loss later
 * (pp_stage_cuda.c) instead of synchronizing the stream per forward. */
zero_status gpt_cuda_workspace_losses(const gpt_cuda_workspace *ws, const float **losses, long *valid);
/* The cudaStream_t behind a zero_stream of a CUDA device (NULL otherwise), as
 * a void * so that plain C callers need no CUDA headers. */
void *gpt_cuda_stream_handle(const zero_stream *stream);

zero_status gpt_cuda_forward(gpt_cuda_workspace *ws, const int32_t *tokens, const int32_t *targets,
                             const gpt_tensors *params, float *loss);
zero_status gpt_cuda_backward(gpt_cuda_workspace *ws, float dloss, const gpt_tensors *params,
                              gpt_tensors *grads);

#ifdef __cplusplus
}
#endif

#endif
