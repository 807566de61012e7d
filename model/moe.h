/* A mixture-of-experts FFN on the CPU, with expert parallelism.
 *
 * What it computes (GShard / Switch / DeepSpeed-MoE), for the N x C tokens x
 * of this rank:
 *   probs   = softmax(x gate_w^T)                      N x E (router, no bias)
 *   choices = the top_k experts of each token by prob (ties: the lower expert)
 *   weight  = prob of the choice; with top_k > 1 renormalised over the
 *             token's top_k probs (DeepSpeed's top-2 gating)
 *   capacity = ceil(capacity_factor * top_k * N / E) slots per expert
 *             (capacity_factor <= 0: N, no token is ever dropped)
 *   slots are given in priority order: every token's 1st choice in token
 *   order, then every 2nd choice, ...; a choice that finds its expert full is
 *   DROPPED (contributes nothing: the block's residual carries the token on)
 *   expert e(x) = proj_w gelu(fc_w x + fc_b) + proj_b    (C -> d_ff -> C)
 *   out[n]  = init[n] + sum over the kept choices i of weight_i * expert_i(x[n])
 *   aux     = E * sum_e f_e * P_e, f_e = the fraction of tokens whose 1st
 *             choice is e (before dropping), P_e = the mean of probs[:, e]
 * The training loss adds aux_loss_coef * aux (the caller adds it; backward
 * adds its gradient, scaled by dloss).
 *
 * Expert parallelism: `ep` (a comm of P ranks, or NULL for P = 1) splits
 * the E experts, rank r holding experts [r E/P, (r+1) E/P); every rank routes
 * its own tokens (the capacity counts its own N, as DeepSpeed does), sends
 * each kept choice's row to the expert's owner with one all-to-all-v
 * (dispatch), the owner runs each expert on the rows from all ranks (by
 * source rank, in slot order), and a second all-to-all-v brings the outputs
 * back to the slots they came from (combine: the order is restored by
 * construction). Backward runs the same two exchanges on the gradients. The
 * per-expert row counts travel first in a small all-to-all. So an EP run is,
 * per rank, the single-rank model on that rank's tokens, except that each
 * expert's weight gradient sums the rows of every rank in one matmul.
 *
 * Parameters are the caller's (fp32): gate_w is E x C (the router, replicated
 * on every rank: a dense parameter), the experts this rank holds are stacked
 * El = E/P deep: fc_w El x d_ff x C, fc_b El x d_ff, proj_w El x C x d_ff,
 * proj_b El x C (nn.Linear layouts). Gradients ACCUMULATE (+=).
 *
 * Errors: zero_status, message in gpt_last_error(); a failed exchange names
 * the ep comm's message. Nothing prints. */
#ifndef ZERO_MODEL_MOE_H
#define ZERO_MODEL_MOE_H

#include <stddef.h>
#include <stdint.h>
#include <zero/comm.h>
#include <zero/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpt_moe_config {
    int d_model;           /* C */
    int d_ff;              /* hidden units of each expert (4 C in the GPT) */
    int experts;           /* E, over all ranks; a multiple of the ep size */
    int top_k;             /* 1 .. E */
    float capacity_factor; /* <= 0: unlimited */
    float aux_loss_coef;   /* scales the auxiliary loss's gradient in backward */
} gpt_moe_config;

typedef struct gpt_moe_params {
    float *gate_w;               /* E x C */
    float *fc_w, *fc_b;          /* El x d_ff x C, El x d_ff */
    float *proj_w, *proj_b;      /* El x C x d_ff, El x C */
} gpt_moe_params;

typedef struct gpt_moe gpt_moe;

/* A layer for `tokens` rows per call; `ep` NULL or a comm whose size divides
 * experts (borrowed: it must outlive the layer). */
zero_status gpt_moe_create(gpt_moe **out, const gpt_moe_config *cfg, int tokens, zero_comm *ep);
/* The same layer on the current CUDA device (moe_cuda.cu), behind the same
 * calls: for such a layer every tensor pointer of gpt_moe_forward /
 * gpt_moe_backward (x, init, out, dout, dx, p's and g's arrays) is DEVICE
 * memory; the work is enqueued on cuda_stream (NULL: the legacy default
 * stream) and each forward and backward synchronizes it (the slots are
 * decided on the host, and the ep comm wants ready buffers). ep: NULL or an
 * NCCL / STAGED comm of this device. The routing (gpt_moe_get_routing)
 * stays host memory. In a build without CUDA: ZERO_UNSUPPORTED. */
zero_status gpt_moe_create_cuda(gpt_moe **out, const gpt_moe_config *cfg, int tokens, zero_comm *ep,
                                void *cuda_stream);
void gpt_moe_destroy(gpt_moe *m); /* NULL accepted */

/* The bytes of one layer's buffers (routing, the exchanges' rows, the
 * experts' activations and scratch) for `tokens` rows over ep_size ranks:
 * cuda 0, what gpt_moe_create allocates (one host block, 64-byte aligned
 * buffers; the per-thread partial sums for this thread's OpenMP maximum, as
 * at creation); cuda 1, what gpt_moe_create_cuda allocates on the device
 * (one cudaMalloc, 256-byte aligned buffers; ZERO_UNSUPPORTED in a build
 * without CUDA). The layers allocate exactly these sizes (docs/moe.md has
 * the formula). Not counted: the routing plan's index arrays (O(E + P El)
 * host integers) and the CUDA layer's host copies of the routing
 * (O(tokens top_k + E)), bookkeeping as the GPT's pointer tables are. */
zero_status gpt_moe_bytes_for(const gpt_moe_config *cfg, int tokens, int ep_size, int cuda, size_t *bytes);
/* The bytes this layer holds, as gpt_moe_bytes_for counts them; 0 for NULL. */
size_t gpt_moe_bytes(const gpt_moe *m);

/* The matmuls' precision (gpt_gemm.h): 0 fp32 (the default), 1 bf16 products
 * where the CPU's kernel has them (the GPT's bf16 compute path); on CUDA
 * cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF (bf16 tensor-core products). */
void gpt_moe_set_matmul_bf16(gpt_moe *m, int bf16);
/* The slots per expert for this layer's token count. */
int gpt_moe_capacity(const gpt_moe *m);
/* This rank's experts: [*first, *first + *count). */
void gpt_moe_local_experts(const gpt_moe *m, int *first, int *count);

/* out = init + MoE(x) (init may be NULL or equal out); *aux (may be NULL)
 * receives the auxiliary loss of this rank's tokens. x must stay unchanged
 * until the backward. */
zero_status gpt_moe_forward(gpt_moe *m, const float *x, const float *init, float *out, const gpt_moe_params *p,
                            float *aux);
/* dx = d(x) (overwritten) from dout = d(out); gradients accumulate into g;
 * the auxiliary loss's gradient enters as dloss * aux_loss_coef. */
zero_status gpt_moe_backward(gpt_moe *m, float dloss, const float *x, const float *dout, float *dx,
                             const gpt_moe_params *p, gpt_moe_params *g);

/* The backward split in two for zero-bubble pipelines (gpt_block.h's B and
 * W): gpt_moe_backward_input is gpt_moe_backward without
 * the experts' weight and bias gradients (dx, the router's gradient into
 * g->gate_w - the only tensor of g it touches - and both exchanges: W needs
 * no communication); gpt_moe_backward_weight adds those gradients later,
 * from d(expert output) kept in the layer's stash and d(fc output), the
 * experts' inputs and GELU outputs the layer keeps anyway. B then W computes
 * the same bits as gpt_moe_backward (the matmul backward is its input half
 * then its weight half). Until the W ran, a forward into the layer is
 * ZERO_INVALID_STATE. gpt_moe_split_backward allocates the stash (Rmax x C
 * floats, gpt_moe_split_bytes; once; device memory for a CUDA layer, whose
 * backward_input synchronizes its stream as gpt_moe_backward does and whose
 * backward_weight only enqueues its gemms there). */
zero_status gpt_moe_split_backward(gpt_moe *m);
size_t gpt_moe_split_bytes(const gpt_moe *m); /* 0 before gpt_moe_split_backward */
zero_status gpt_moe_backward_input(gpt_moe *m, float dloss, const float *x, const float *dout, float *dx,
                                   const gpt_moe_params *p, gpt_moe_params *g);
zero_status gpt_moe_backward_weight(gpt_moe *m, gpt_moe_params *g);

/* The routing of the last forward, for tests and reports: per token and
 * choice (N x top_k, choice-major within a token): the expert, its weight,
 * and the slot it got (-1: dropped). */
typedef struct gpt_moe_routing {
    const int32_t *expert;
    const float *weight;
    const int32_t *slot;
    long dropped;          /* choices dropped in the last forward */
} gpt_moe_routing;
void gpt_moe_get_routing(const gpt_moe *m, gpt_moe_routing *out);

#ifdef __cplusplus
}
#endif

#endif
