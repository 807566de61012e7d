/* The CUDA pipeline stage (pp_stage_cuda.h). Plain C over gpt_cuda.h and
 * the device API, so it compiles in every build (without CUDA the
 * workspaces cannot be made and creation fails by name). */
#include "pp_stage_cuda.h"

#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "pp_gpt.h"

struct pp_cuda_stage {
    gpt_config cfg;
    zero_device *dev;
    int chunks;
    int batch;
    gpt_cuda_workspace **ws; /* [chunk] */
    void *wpe, *dwpe;        /* the head's lent wpe and its gradient (stage with the head, not the embedding) */
};

static gpt_cuda_workspace *W(void *self, int c) { return ((pp_cuda_stage *)self)->ws[c]; }

static void range(void *self, int c, int *b, int *e) { gpt_cuda_workspace_range(W(self, c), b, e); }
static int slots(void *self, int c) { return gpt_cuda_workspace_slots(W(self, c)); }
static zero_status split_backward(void *self, int c) { return gpt_cuda_workspace_split_backward(W(self, c)); }
static const float *output(void *self, int c, int slot) { return gpt_cuda_workspace_output(W(self, c), slot); }

/* The embedding set the CUDA head checks whole: the held one, with the lent wpe where it has none. */
static gpt_tensors embed_set(const gpt_tensors *held, void *lent)
{
    gpt_tensors e = *held;
    if (!e.t[GPT_WPE]) e.t[GPT_WPE] = lent;
    return e;
}

static zero_status forward(void *self, int c, int slot, const float *in, const int32_t *tokens,
                           const int32_t *targets, const gpt_tensors *params, float *loss)
{
    pp_cuda_stage *s = self;
    gpt_cuda_workspace *ws = W(self, c);
    int b, e;
    GPT_TRY(gpt_cuda_workspace_select_slot(ws, slot));
    if (in) GPT_TRY(gpt_cuda_forward_begin_input(ws, in, targets));
    else GPT_TRY(gpt_cuda_forward_begin(ws, tokens, targets, &params[GPT_MODULE_EMBED]));
    gpt_cuda_workspace_range(ws, &b, &e);
    for (int l = b; l < e; l++) GPT_TRY(gpt_cuda_forward_block(ws, l, &params[gpt_module_block(l)]));
    if (targets) {
        gpt_tensors emb = embed_set(&params[GPT_MODULE_EMBED], s->wpe);
        GPT_TRY(gpt_cuda_forward_end(ws, &params[gpt_module_final(&s->cfg)], &emb, loss));
    }
    return gpt_cuda_workspace_sync(ws); /* the output is sent next */
}

static zero_status backward(void *self, int c, int slot, int whole, const float *dout, float *din, float dloss,
                            const gpt_tensors *params, gpt_tensors *grads)
{
    pp_cuda_stage *s = self;
    gpt_cuda_workspace *ws = W(self, c);
    int b, e;
    GPT_TRY(gpt_cuda_workspace_select_slot(ws, slot));
    if (dout) {
        GPT_TRY(gpt_cuda_backward_end_output(ws, dout));
    } else {
        int fm = gpt_module_final(&s->cfg);
        gpt_tensors emb = embed_set(&params[GPT_MODULE_EMBED], s->wpe);
        gpt_tensors demb = embed_set(&grads[GPT_MODULE_EMBED], s->dwpe);
        GPT_TRY(gpt_cuda_backward_end(ws, dloss, &params[fm], &grads[fm], &emb, &demb));
    }
    gpt_cuda_workspace_range(ws, &b, &e);
    for (int l = e - 1; l >= b; l--) {
        int mod = gpt_module_block(l);
        if (whole) GPT_TRY(gpt_cuda_backward_block(ws, l, &params[mod], &grads[mod]));
        else GPT_TRY(gpt_cuda_backward_block_input(ws, l, &params[mod], &grads[mod]));
    }
    if (din) GPT_TRY(gpt_cuda_backward_begin_input(ws, din));
    else GPT_TRY(gpt_cuda_backward_begin(ws, &grads[GPT_MODULE_EMBED]));
    return gpt_cuda_workspace_sync(ws); /* din is sent next */
}

static zero_status weight(void *self, int c, int slot, gpt_tensors *grads)
{
    gpt_cuda_workspace *ws = W(self, c);
    int b, e;
    GPT_TRY(gpt_cuda_workspace_select_slot(ws, slot));
    gpt_cuda_workspace_range(ws, &b, &e);
    for (int l = e - 1; l >= b; l--) GPT_TRY(gpt_cuda_backward_block_weight(ws, l, &grads[gpt_module_block(l)]));
    return gpt_cuda_workspace_sync(ws); /* the engine reads the gradients after the last W */
}

static void *alloc(void *self, size_t bytes)
{
    void *p = NULL;
    if (zero_device_alloc(((pp_cuda_stage *)self)->dev, bytes ? bytes : 1, &p) != ZERO_OK) return NULL;
    return p;
}

static void release(void *self, void *p) { zero_device_free(((pp_cuda_stage *)self)->dev, p); }

static zero_status copy(void *self, void *dst, const void *src, size_t bytes, pp_copy_kind kind)
{
    (void)kind; /* direction inferred; the stage's stream is idle between ops (each syncs) */
    pp_cuda_stage *s = self;
    if (zero_memcpy(s->dev, dst, src, bytes) != ZERO_OK)
        return gpt_fail(ZERO_BACKEND, "pipeline (cuda stage): copy of %zu bytes: %s", bytes, zero_last_error());
    return ZERO_OK;
}

void pp_cuda_stage_destroy(pp_cuda_stage *s)
{
    if (!s) return;
    for (int c = 0; s->ws && c < s->chunks; c++) gpt_cuda_workspace_destroy(s->ws[c]);
    free(s->ws);
    zero_device_free(s->dev, s->wpe);
    zero_device_free(s->dev, s->dwpe);
    free(s);
}

zero_status pp_cuda_stage_create(pp_cuda_stage **out, const gpt_config *cfg, zero_device *dev, int batch,
                                 zero_dtype param_dtype, const gpt_cuda_options *opts, int pp_size, int pp_rank,
                                 int chunks, const int *slots_of, zero_comm *tp)
{
    if (!out || !cfg || !dev || !slots_of || chunks < 1)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_cuda_stage_create: out, config, device or slots is NULL");
    *out = NULL;
    if (zero_device_get_kind(dev) != ZERO_DEVICE_CUDA)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_cuda_stage_create: the device is not a CUDA device");
    pp_cuda_stage *s = calloc(1, sizeof *s);
    if (!s || !(s->ws = calloc((size_t)chunks, sizeof *s->ws))) {
        free(s);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "pp_cuda_stage_create: out of memory");
    }
    s->cfg = *cfg, s->dev = dev, s->chunks = chunks, s->batch = batch;
    zero_status st = ZERO_OK;
    int has_embed = 0, has_head = 0;
    for (int c = 0; c < chunks && st == ZERO_OK; c++) {
        int b, e;
        st = pp_chunk_layers(cfg, pp_size, chunks, pp_rank, c, &b, &e);
        if (st == ZERO_OK)
            st = gpt_cuda_workspace_create_tp(&s->ws[c], cfg, batch, cfg->seq_len, param_dtype, opts, NULL, NULL, b, e,
                                              slots_of[c], tp);
        has_embed |= b == 0, has_head |= e == cfg->n_layer;
    }
    if (st == ZERO_OK && has_head && !has_embed) {
        size_t bytes = (size_t)cfg->seq_len * (size_t)cfg->d_model * zero_dtype_size(param_dtype);
        if (zero_device_alloc(dev, bytes, &s->wpe) != ZERO_OK || zero_device_alloc(dev, bytes, &s->dwpe) != ZERO_OK)
            st = gpt_fail(ZERO_OUT_OF_MEMORY, "pp_cuda_stage_create: the head's wpe (%zu bytes): %s", bytes,
                          zero_last_error());
    }
    if (st != ZERO_OK) {
        pp_cuda_stage_destroy(s);
        return st;
    }
    *out = s;
    return ZERO_OK;
}

void pp_cuda_stage_view(pp_cuda_stage *s, pp_stage *st)
{
    memset(st, 0, sizeof *st);
    st->self = s;
    st->chunks = s->chunks;
    st->cfg = &s->cfg;
    st->rows = (size_t)s->batch * (size_t)s->cfg.seq_len;
    st->width = (size_t)s->cfg.d_model;
    st->tokens = st->rows;
    st->name = "cuda";
    st->range = range, st->slots = slots, st->split_backward = split_backward, st->output = output;
    st->forward = forward, st->backward = backward, st->weight = weight;
    st->alloc = alloc, st->release = release, st->copy = copy;
}

void pp_cuda_stage_activation_bytes(const pp_cuda_stage *s, gpt_activation_bytes *out)
{
    memset(out, 0, sizeof *out);
    for (int c = 0; s && c < s->chunks; c++) {
        gpt_activation_bytes b;
        gpt_cuda_workspace_activation_bytes(s->ws[c], &b);
        out->inputs += b.inputs, out->blocks += b.blocks, out->recompute += b.recompute, out->head += b.head;
        out->scratch += b.scratch, out->host += b.host, out->total += b.total;
    }
}
