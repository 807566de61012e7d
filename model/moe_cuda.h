/* Internal to the model library: the CUDA backend of the MoE layer (moe.h),
 * reached through gpt_moe_create_cuda and the ordinary gpt_moe_* calls
 * (moe_cpu.c dispatches). The plan and the host routing arrays belong to
 * the gpt_moe; the backend fills them. Built from moe_cuda.cu, or from
 * moe_cuda_stub.c (every call ZERO_UNSUPPORTED) without CUDA. */
#ifndef ZERO_MODEL_MOE_CUDA_H
#define ZERO_MODEL_MOE_CUDA_H

#include "moe.h"
#include "moe_route.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_cuda moe_cuda;

zero_status moe_cuda_create(moe_cuda **out, const gpt_moe_config *cfg, const moe_plan *pl, zero_comm *ep,
                            void *cuda_stream);
void moe_cuda_destroy(moe_cuda *d); /* NULL accepted */
/* The bytes moe_cuda_create allocates on the device for this plan's sizes
 * (pl needs only moe_plan_size) and d_ff = H; ZERO_UNSUPPORTED without CUDA. */
zero_status moe_cuda_bytes(const moe_plan *pl, int H, size_t *bytes);
void moe_cuda_set_bf16(moe_cuda *d, int bf16);
/* sel_e, sel_slot, sel_w: host, N x K, filled with the routing. */
zero_status moe_cuda_forward(moe_cuda *d, moe_plan *pl, int32_t *sel_e, int32_t *sel_slot, float *sel_w,
                             const float *x, const float *init, float *out, const gpt_moe_params *p, float *aux);
/* split: the experts' weight gradients left to moe_cuda_backward_weight
 * (d(expert output) kept in the stash moe_cuda_split made). */
zero_status moe_cuda_backward(moe_cuda *d, moe_plan *pl, float dloss, const float *x, const float *dout, float *dx,
                              const gpt_moe_params *p, gpt_moe_params *g, int split);
/* The split backward's stash (once); *bytes: its size. */
zero_status moe_cuda_split(moe_cuda *d, const moe_plan *pl, size_t *bytes);
/* The experts' weight gradients of the last split backward, enqueued on the layer's stream. */
zero_status moe_cuda_backward_weight(moe_cuda *d, const moe_plan *pl, gpt_moe_params *g);

#ifdef __cplusplus
}
#endif

#endif
