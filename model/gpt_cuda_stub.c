/* The CUDA path's API in a build without CUDA: every call says so. */
#include <string.h>

#include "gpt_cuda.h"
#include "gpt_internal.h"

#define NO_CUDA(op) gpt_fail(ZERO_UNSUPPORTED, "%s: this build of the model has no CUDA path", op)

int gpt_cuda_available(void) { return 0; }

zero_status gpt_cuda_workspace_create(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                      zero_dtype param_dtype, gpt_cuda_math math, void *cuda_stream)
{
    (void)cfg, (void)batch, (void)seq, (void)param_dtype, (void)math, (void)cuda_stream;
    if (out) *out = NULL;
    return NO_CUDA("gpt_cuda_workspace_create");
}

zero_status gpt_cuda_workspace_create_ckpt(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                           zero_dtype param_dtype, gpt_cuda_math math, void *cuda_stream,
                                           const gpt_checkpointing *ck)
{
    (void)cfg, (void)batch, (void)seq, (void)param_dtype, (void)math, (void)cuda_stream, (void)ck;
    if (out) *out = NULL;
    return NO_CUDA("gpt_cuda_workspace_create_ckpt");
}

zero_status gpt_cuda_workspace_create_opts(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                           zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                           const gpt_checkpointing *ck)
{
    (void)cfg, (void)batch, (void)seq, (void)param_dtype, (void)opts, (void)cuda_stream, (void)ck;
    if (out) *out = NULL;
    return NO_CUDA("gpt_cuda_workspace_create_opts");
}

zero_status gpt_cuda_workspace_create_moe(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                          zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                          const gpt_checkpointing *ck, zero_comm *ep)
{
    (void)cfg, (void)batch, (void)seq, (void)param_dtype, (void)opts, (void)cuda_stream, (void)ck, (void)ep;
    if (out) *out = NULL;
    return NO_CUDA("gpt_cuda_workspace_create_moe");
}

float gpt_cuda_workspace_moe_aux(const gpt_cuda_workspace *ws) { (void)ws; return 0.0f; }
struct gpt_moe *gpt_cuda_workspace_moe_layer(const gpt_cuda_workspace *ws, int layer)
{
    (void)ws, (void)layer;
    return NULL;
}

void gpt_cuda_workspace_destroy(gpt_cuda_workspace *ws) { (void)ws; }
size_t gpt_cuda_workspace_bytes(const gpt_cuda_workspace *ws) { (void)ws; return 0; }

void gpt_cuda_workspace_activation_bytes(const gpt_cuda_workspace *ws, gpt_activation_bytes *out)
{
    (void)ws;
    if (out) memset(out, 0, sizeof *out);
}

zero_status gpt_cuda_activation_bytes_for(const gpt_config *cfg, int batch, int seq, zero_dtype param_dtype,
                                          const gpt_checkpointing *ck, gpt_activation_bytes *out)
{
    (void)cfg, (void)batch, (void)seq, (void)param_dtype, (void)ck;
    if (out) memset(out, 0, sizeof *out);
    return NO_CUDA("gpt_cuda_activation_bytes_for");
}

zero_status gpt_cuda_activation_bytes_for_opts(const gpt_config *cfg, int batch, int seq, zero_dtype param_dtype,
                                               const gpt_cuda_options *opts, const gpt_checkpointing *ck,
                                               gpt_activation_bytes *out)
{
    (void)cfg, (void)batch, (void)seq, (void)param_dtype, (void)opts, (void)ck;
    if (out) memset(out, 0, sizeof *out);
    return NO_CUDA("gpt_cuda_activation_bytes_for_opts");
}

zero_status gpt_cuda_workspace_logits(gpt_cuda_workspace *ws, float *host_out)
{
    (void)ws, (void)host_out;
    return NO_CUDA("gpt_cuda_workspace_logits");
}

zero_status gpt_cuda_forward_begin(gpt_cuda_workspace *ws, const int32_t *tokens, const int32_t *targets,
                                   const gpt_tensors *embed)
{
    (void)ws, (void)tokens, (void)targets, (void)embed;
    return NO_CUDA("gpt_cuda_forward_begin");
}

zero_status gpt_cuda_forward_block(gpt_cuda_workspace *ws, int layer, const gpt_tensors *block)
{
    (void)ws, (void)layer, (void)block;
    return NO_CUDA("gpt_cuda_forward_block");
}

zero_status gpt_cuda_forward_end(gpt_cuda_workspace *ws, const gpt_tensors *final_params, const gpt_tensors *embed,
                                 float *loss)
{
    (void)ws, (void)final_params, (void)embed, (void)loss;
    return NO_CUDA("gpt_cuda_forward_end");
}

zero_status gpt_cuda_backward_end(gpt_cuda_workspace *ws, float dloss, const gpt_tensors *final_params,
                                  gpt_tensors *final_grads, const gpt_tensors *embed, gpt_tensors *embed_grads)
{
    (void)ws, (void)dloss, (void)final_params, (void)final_grads, (void)embed, (void)embed_grads;
    return NO_CUDA("gpt_cuda_backward_end");
}

zero_status gpt_cuda_backward_block(gpt_cuda_workspace *ws, int layer, const gpt_tensors *block,
                                    gpt_tensors *block_grads)
{
    (void)ws, (void)layer, (void)block, (void)block_grads;
    return NO_CUDA("gpt_cuda_backward_block");
}

zero_status gpt_cuda_backward_begin(gpt_cuda_workspace *ws, gpt_tensors *embed_grads)
{
    (void)ws, (void)embed_grads;
    return NO_CUDA("gpt_cuda_backward_begin");
}

zero_status gpt_cuda_forward(gpt_cuda_workspace *ws, const int32_t *tokens, const int32_t *targets,
                             const gpt_tensors *params, float *loss)
{
    (void)ws, (void)tokens, (void)targets, (void)params, (void)loss;
    return NO_CUDA("gpt_cuda_forward");
}

zero_status gpt_cuda_backward(gpt_cuda_workspace *ws, float dloss, const gpt_tensors *params, gpt_tensors *grads)
{
    (void)ws, (void)dloss, (void)params, (void)grads;
    return NO_CUDA("gpt_cuda_backward");
}

zero_status gpt_cuda_workspace_split_backward(gpt_cuda_workspace *ws)
{
    (void)ws;
    return NO_CUDA("gpt_cuda_workspace_split_backward");
}

size_t gpt_cuda_workspace_wstash_bytes(const gpt_cuda_workspace *ws) { (void)ws; return 0; }

zero_status gpt_cuda_backward_block_input(gpt_cuda_workspace *ws, int layer, const gpt_tensors *block,
                                          gpt_tensors *block_grads)
{
    (void)ws, (void)layer, (void)block, (void)block_grads;
    return NO_CUDA("gpt_cuda_backward_block_input");
}

zero_status gpt_cuda_backward_block_weight(gpt_cuda_workspace *ws, int layer, gpt_tensors *block_grads)
{
    (void)ws, (void)layer, (void)block_grads;
    return NO_CUDA("gpt_cuda_backward_block_weight");
}

zero_status gpt_cuda_workspace_create_stage(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                            zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                            const gpt_checkpointing *ck, int layer_begin, int layer_end, int slots)
{
    (void)cfg, (void)batch, (void)seq, (void)param_dtype, (void)opts, (void)cuda_stream, (void)ck;
    (void)layer_begin, (void)layer_end, (void)slots;
    if (out) *out = NULL;
    return NO_CUDA("gpt_cuda_workspace_create_stage");
}

zero_status gpt_cuda_workspace_create_tp(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                         zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                         const gpt_checkpointing *ck, int layer_begin, int layer_end, int slots,
                                         zero_comm *tp)
{
    (void)cfg, (void)batch, (void)seq, (void)param_dtype, (void)opts, (void)cuda_stream, (void)ck;
    (void)layer_begin, (void)layer_end, (void)slots, (void)tp;
    if (out) *out = NULL;
    return NO_CUDA("gpt_cuda_workspace_create_tp");
}

zero_status gpt_cuda_activation_bytes_stage(const gpt_config *cfg, int tp_size, int batch, int seq,
                                            zero_dtype param_dtype, const gpt_cuda_options *opts,
                                            const gpt_checkpointing *ck, int layer_begin, int layer_end, int slots,
                                            gpt_activation_bytes *out)
{
    (void)cfg, (void)tp_size, (void)batch, (void)seq, (void)param_dtype, (void)opts, (void)ck;
    (void)layer_begin, (void)layer_end, (void)slots;
    if (out) memset(out, 0, sizeof *out);
    return NO_CUDA("gpt_cuda_activation_bytes_stage");
}

zero_status gpt_cuda_workspace_create_stage_moe(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                                zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                                const gpt_checkpointing *ck, int layer_begin, int layer_end, int slots,
                                                zero_comm *tp, zero_comm *ep)
{
    (void)cfg, (void)batch, (void)seq, (void)param_dtype, (void)opts, (void)cuda_stream, (void)ck;
    (void)layer_begin, (void)layer_end, (void)slots, (void)tp, (void)ep;
    if (out) *out = NULL;
    return NO_CUDA("gpt_cuda_workspace_create_stage_moe");
}

void gpt_cuda_workspace_set_moe_dloss(gpt_cuda_workspace *ws, float dloss) { (void)ws, (void)dloss; }

zero_status gpt_cuda_workspace_select_slot(gpt_cuda_workspace *ws, int slot)
{
    (void)ws, (void)slot;
    return NO_CUDA("gpt_cuda_workspace_select_slot");
}

int gpt_cuda_workspace_slots(const gpt_cuda_workspace *ws) { (void)ws; return 0; }

void gpt_cuda_workspace_range(const gpt_cuda_workspace *ws, int *layer_begin, int *layer_end)
{
    (void)ws;
    if (layer_begin) *layer_begin = 0;
    if (layer_end) *layer_end = 0;
}

const float *gpt_cuda_workspace_output(const gpt_cuda_workspace *ws, int slot)
{
    (void)ws, (void)slot;
    return NULL;
}

zero_status gpt_cuda_forward_begin_input(gpt_cuda_workspace *ws, const float *in, const int32_t *targets)
{
    (void)ws, (void)in, (void)targets;
    return NO_CUDA("gpt_cuda_forward_begin_input");
}

zero_status gpt_cuda_backward_end_output(gpt_cuda_workspace *ws, const float *dout)
{
    (void)ws, (void)dout;
    return NO_CUDA("gpt_cuda_backward_end_output");
}

zero_status gpt_cuda_backward_begin_input(gpt_cuda_workspace *ws, float *din)
{
    (void)ws, (void)din;
    return NO_CUDA("gpt_cuda_backward_begin_input");
}

zero_status gpt_cuda_workspace_sync(gpt_cuda_workspace *ws)
{
    (void)ws;
    return NO_CUDA("gpt_cuda_workspace_sync");
}

zero_status gpt_cuda_workspace_losses(const gpt_cuda_workspace *ws, const float **losses, long *valid)
{
    (void)ws, (void)losses, (void)valid;
    return NO_CUDA("gpt_cuda_workspace_losses");
}

void *gpt_cuda_stream_handle(const zero_stream *stream)
{
    (void)stream;
    return NULL;
}
