/* The CPU pipeline stage (pp_stage.h) over tp_gpt.h's workspaces: chunk c
 * is ws[c]. The kernels and copies are exactly those the runtime called
 * before it went through pp_stage, so every CPU schedule computes the same
 * bits as before. */
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "pp_gpt.h"

/* self is the caller's array of chunk workspaces */
static tp_workspace *W(void *self, int c) { return ((tp_workspace *const *)self)[c]; }

static void range(void *self, int c, int *b, int *e) { tp_workspace_range(W(self, c), b, e); }
static int slots(void *self, int c) { return tp_workspace_slots(W(self, c)); }
static zero_status split_backward(void *self, int c) { return tp_workspace_split_backward(W(self, c)); }
static const float *output(void *self, int c, int slot) { return tp_workspace_output(W(self, c), slot); }

static size_t message_bytes(tp_workspace *ws)
{
    return sizeof(float) * tp_workspace_rows(ws) * (size_t)tp_workspace_config(ws)->d_model;
}

static zero_status forward(void *self, int c, int slot, const float *in, const int32_t *tokens,
                           const int32_t *targets, const gpt_tensors *params, float *loss)
{
    tp_workspace *ws = W(self, c);
    int b, e;
    if (in) memcpy(tp_workspace_input(ws, slot), in, message_bytes(ws));
    else GPT_TRY(tp_forward_embed(ws, slot, tokens, &params[GPT_MODULE_EMBED]));
    tp_workspace_range(ws, &b, &e);
    for (int l = b; l < e; l++) GPT_TRY(tp_forward_block(ws, slot, l, &params[gpt_module_block(l)]));
    const gpt_config *cfg = tp_workspace_config(ws);
    if (targets) GPT_TRY(tp_forward_head(ws, slot, targets, &params[gpt_module_final(cfg)], &params[GPT_MODULE_EMBED],
                                         loss));
    /* MoE: this stage's share of the loss, as gpt_forward_end adds it (0 on a stage without MoE blocks) */
    if (cfg->moe_experts > 0) *loss += cfg->moe_aux_loss_coef * tp_workspace_moe_aux(ws, slot);
    return ZERO_OK;
}

static zero_status backward(void *self, int c, int slot, int whole, const float *dout, float *din, float dloss,
                            const gpt_tensors *params, gpt_tensors *grads)
{
    tp_workspace *ws = W(self, c);
    float *dres = tp_workspace_dresid(ws);
    int b, e;
    tp_workspace_set_moe_dloss(ws, dloss); /* MoE blocks: their aux losses' gradient is dloss x coef */
    if (dout) {
        memcpy(dres, dout, message_bytes(ws));
    } else {
        int fm = gpt_module_final(tp_workspace_config(ws));
        GPT_TRY(tp_backward_head(ws, slot, dloss, &params[fm], &grads[fm], &params[GPT_MODULE_EMBED],
                                 &grads[GPT_MODULE_EMBED]));
    }
    tp_workspace_range(ws, &b, &e);
    for (int l = e - 1; l >= b; l--) {
        int mod = gpt_module_block(l);
        if (whole) GPT_TRY(tp_backward_block(ws, slot, l, &params[mod], &grads[mod]));
        else GPT_TRY(tp_backward_block_input(ws, slot, l, &params[mod], &grads[mod]));
    }
    if (din) memcpy(din, dres, message_bytes(ws));
    else GPT_TRY(tp_backward_embed(ws, slot, &grads[GPT_MODULE_EMBED]));
    return ZERO_OK;
}

static zero_status weight(void *self, int c, int slot, gpt_tensors *grads)
{
    tp_workspace *ws = W(self, c);
    int b, e;
    tp_workspace_range(ws, &b, &e);
    for (int l = e - 1; l >= b; l--) GPT_TRY(tp_backward_block_weight(ws, slot, l, &grads[gpt_module_block(l)]));
    return ZERO_OK;
}

static void *alloc(void *self, size_t bytes)
{
    (void)self;
    return malloc(bytes ? bytes : 1);
}

static void release(void *self, void *p)
{
    (void)self;
    free(p);
}

static zero_status copy(void *self, void *dst, const void *src, size_t bytes, pp_copy_kind kind)
{
    (void)self, (void)kind; /* host memory all of it */
    memcpy(dst, src, bytes);
    return ZERO_OK;
}

zero_status pp_stage_tp(pp_stage *st, tp_workspace *const *ws, int chunks)
{
    if (!st || !ws || chunks < 1 || !ws[0])
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_stage_tp: stage, workspaces or chunk 0's workspace is NULL");
    memset(st, 0, sizeof *st);
    st->self = (void *)ws; /* borrowed: read only through W() */
    st->chunks = chunks;
    st->cfg = tp_workspace_config(ws[0]);
    st->rows = tp_workspace_rows(ws[0]);
    st->width = (size_t)st->cfg->d_model;
    st->tokens = tp_workspace_tokens(ws[0]);
    st->name = "cpu";
    st->range = range, st->slots = slots, st->split_backward = split_backward, st->output = output;
    st->forward = forward, st->backward = backward, st->weight = weight;
    st->alloc = alloc, st->release = release, st->copy = copy;
    return ZERO_OK;
}
