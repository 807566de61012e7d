/* The MoE layer's CUDA backend in a build without CUDA: creation says so. */
#include "gpt_internal.h"
#include "moe_cuda.h"

zero_status moe_cuda_create(moe_cuda **out, const gpt_moe_config *cfg, const moe_plan *pl, zero_comm *ep,
                            void *cuda_stream)
{
    (void)cfg, (void)pl, (void)ep, (void)cuda_stream;
    if (out) *out = NULL;
    return gpt_fail(ZERO_UNSUPPORTED, "gpt_moe_create_cuda: this build of the model has no CUDA path");
}

zero_status moe_cuda_bytes(const moe_plan *pl, int H, size_t *bytes)
{
    (void)pl, (void)H;
    if (bytes) *bytes = 0;
    return gpt_fail(ZERO_UNSUPPORTED, "gpt_moe_bytes_for: this build of the model has no CUDA path");
}

void moe_cuda_destroy(moe_cuda *d) { (void)d; }
void moe_cuda_set_bf16(moe_cuda *d, int bf16) { (void)d, (void)bf16; }

/* Unreachable: no moe_cuda is ever created in this build. */
zero_status moe_cuda_forward(moe_cuda *d, moe_plan *pl, int32_t *sel_e, int32_t *sel_slot, float *sel_w,
                             const float *x, const float *init, float *out, const gpt_moe_params *p, float *aux)
{
    (void)d, (void)pl, (void)sel_e, (void)sel_slot, (void)sel_w, (void)x, (void)init, (void)out, (void)p, (void)aux;
    return gpt_fail(ZERO_UNSUPPORTED, "gpt_moe_forward: this build of the model has no CUDA path");
}

zero_status moe_cuda_backward(moe_cuda *d, moe_plan *pl, float dloss, const float *x, const float *dout, float *dx,
                              const gpt_moe_params *p, gpt_moe_params *g, int split)
{
    (void)d, (void)pl, (void)dloss, (void)x, (void)dout, (void)dx, (void)p, (void)g, (void)split;
    return gpt_fail(ZERO_UNSUPPORTED, "gpt_moe_backward: this build of the model has no CUDA path");
}

zero_status moe_cuda_split(moe_cuda *d, const moe_plan *pl, size_t *bytes)
{
    (void)d, (void)pl;
    if (bytes) *bytes = 0;
    return gpt_fail(ZERO_UNSUPPORTED, "gpt_moe_split_backward: this build of the model has no CUDA path");
}

zero_status moe_cuda_backward_weight(moe_cuda *d, const moe_plan *pl, gpt_moe_params *g)
{
    (void)d, (void)pl, (void)g;
    return gpt_fail(ZERO_UNSUPPORTED, "gpt_moe_backward_weight: this build of the model has no CUDA path");
}
