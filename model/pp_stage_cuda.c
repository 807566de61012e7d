/* The CUDA pipeline stage (pp_stage_cuda.h). Plain C over gpt_cuda.h and
 * the device API, so it compiles in every build (without CUDA the
 * workspaces cannot be made and creation fails by name). */
#include "pp_stage_cuda.h"

#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "pp_gpt.h"
#include "pp_pool.h"

struct pp_cuda_stage {
    gpt_config cfg;
    zero_device *dev;
    int chunks;
    int batch;
    zero_dtype param_dtype;
    gpt_cuda_options opts; /* as created (the activation report's "without checkpointing") */
    int tp_size;
    zero_comm *tp;           /* the tp comm while it is ordered on this stage's stream (tp_size > 1), else NULL */
    gpt_cuda_workspace **ws; /* [chunk] */
    void *wpe, *dwpe;        /* the head's lent wpe and its gradient (stage with the head, not the embedding) */
    zero_stream *stream;     /* every chunk's workspace enqueues here */
    int own_stream;          /* made by the stage (else the caller's) */
    zero_event *done;        /* finish: the host's one wait per step */
    pp_pool pool;            /* the runtime's transfer buffers (alloc / release), kept across steps */
    pp_run_cache cache;      /* the runtime's events and bookkeeping (pp_stage.cache), kept across steps */
    /* the losses of the step's forwards with targets, in forward order: each
     * micro-batch's per-token losses copied on the stream into a pinned array
     * of its own (made at first use, kept), read by finish */
    float **losses;
    long *valid;
    int nloss, cap_loss;
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

/* The per-token losses of the forward just enqueued, copied on the stream
 * into the next pinned array (allocated at its first use, then reused). */
static zero_status defer_loss(pp_cuda_stage *s, gpt_cuda_workspace *ws)
{
    const float *dl;
    long valid;
    size_t bytes = sizeof(float) * (size_t)s->batch * (size_t)s->cfg.seq_len;
    GPT_TRY(gpt_cuda_workspace_losses(ws, &dl, &valid));
    if (s->nloss == s->cap_loss) {
        int cap = s->cap_loss ? 2 * s->cap_loss : 8;
        float **l = realloc(s->losses, sizeof *l * (size_t)cap);
        if (l) s->losses = l;
        long *v = l ? realloc(s->valid, sizeof *v * (size_t)cap) : NULL;
        if (v) s->valid = v;
        if (!l || !v) return gpt_fail(ZERO_OUT_OF_MEMORY, "pipeline (cuda stage): out of host memory for the losses");
        for (int k = s->cap_loss; k < cap; k++) s->losses[k] = NULL;
        s->cap_loss = cap;
    }
    float **dst = &s->losses[s->nloss];
    if (!*dst && zero_host_alloc_pinned(s->dev, bytes, (void **)dst) != ZERO_OK)
        return gpt_fail(ZERO_OUT_OF_MEMORY, "pipeline (cuda stage): %zu pinned bytes for a micro-batch's losses: %s",
                        bytes, zero_last_error());
    if (zero_memcpy_async(s->dev, *dst, dl, bytes, s->stream) != ZERO_OK)
        return gpt_fail(ZERO_BACKEND, "pipeline (cuda stage): copying the losses: %s", zero_last_error());
    s->valid[s->nloss++] = valid;
    return ZERO_OK;
}

/* End of step: the host waits for the stream (one event), then each deferred
 * loss as gpt_cuda_forward_end computes it, added in forward order. */
static zero_status finish(void *self, double *loss_sum)
{
    pp_cuda_stage *s = self;
    zero_status st = zero_event_record(s->done, s->stream);
    if (st == ZERO_OK) st = zero_event_sync(s->done);
    if (st != ZERO_OK) {
        s->nloss = 0;
        return gpt_fail(st, "pipeline (cuda stage): waiting for the stage's stream: %s", zero_last_error());
    }
    /* the step's stream-ordered tp all-reduces: a failed one (a timeout, a peer gone) is this
     * step's failure, not a silent skip of the ops after it */
    if (s->tp && (st = zero_comm_sync(s->tp)) != ZERO_OK) {
        s->nloss = 0;
        return gpt_fail(st, "pipeline (cuda stage): a tp all-reduce of this step: %s", zero_comm_last_error(s->tp));
    }
    const size_t N = (size_t)s->batch * (size_t)s->cfg.seq_len;
    for (int k = 0; k < s->nloss; k++) {
        double total = 0.0;
        for (size_t i = 0; i < N; i++) total += s->losses[k][i];
        *loss_sum += s->valid[k] ? (float)(total / s->valid[k]) : 0.0f;
    }
    s->nloss = 0;
    return ZERO_OK;
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
        GPT_TRY(gpt_cuda_forward_end(ws, &params[gpt_module_final(&s->cfg)], &emb, NULL));
        GPT_TRY(defer_loss(s, ws));
    }
    /* the cross-entropy is finish's (reading it now would wait for the stream); MoE blocks' aux losses
     * are host values already (the layers synchronize to route), added here as the CPU stage does */
    if (s->cfg.moe_experts > 0) *loss += s->cfg.moe_aux_loss_coef * gpt_cuda_workspace_moe_aux(ws);
    return ZERO_OK; /* enqueued: the runtime orders the send by an event */
}

static zero_status backward(void *self, int c, int slot, int whole, const float *dout, float *din, float dloss,
                            const gpt_tensors *params, gpt_tensors *grads)
{
    pp_cuda_stage *s = self;
    gpt_cuda_workspace *ws = W(self, c);
    int b, e;
    GPT_TRY(gpt_cuda_workspace_select_slot(ws, slot));
    gpt_cuda_workspace_set_moe_dloss(ws, dloss); /* MoE blocks: their aux losses' gradient scale */
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
    return ZERO_OK; /* enqueued: the runtime orders din's send by an event */
}

static zero_status weight(void *self, int c, int slot, gpt_tensors *grads)
{
    gpt_cuda_workspace *ws = W(self, c);
    int b, e;
    GPT_TRY(gpt_cuda_workspace_select_slot(ws, slot));
    gpt_cuda_workspace_range(ws, &b, &e);
    for (int l = e - 1; l >= b; l--) GPT_TRY(gpt_cuda_backward_block_weight(ws, l, &grads[gpt_module_block(l)]));
    return ZERO_OK; /* the engine reads the gradients after finish */
}

/* The transfer buffers (pp_pool.h): device memory allocated at the first
 * step, reused by the next ones. */
static void *raw_alloc(void *dev, size_t bytes)
{
    void *p = NULL;
    return zero_device_alloc(dev, bytes, &p) == ZERO_OK ? p : NULL;
}
static void raw_free(void *dev, void *p) { zero_device_free(dev, p); }
static void *alloc(void *self, size_t bytes) { return pp_pool_get(&((pp_cuda_stage *)self)->pool, bytes); }
/* the runtime releases after finish: the stream no longer reads them */
static void release(void *self, void *p) { (void)pp_pool_put(&((pp_cuda_stage *)self)->pool, p); }

static zero_status copy(void *self, void *dst, const void *src, size_t bytes, pp_copy_kind kind)
{
    (void)kind; /* direction inferred; used for the loss only, after finish (the stream is idle) */
    pp_cuda_stage *s = self;
    if (zero_memcpy(s->dev, dst, src, bytes) != ZERO_OK)
        return gpt_fail(ZERO_BACKEND, "pipeline (cuda stage): copy of %zu bytes: %s", bytes, zero_last_error());
    return ZERO_OK;
}

void pp_cuda_stage_destroy(pp_cuda_stage *s)
{
    if (!s) return;
    if (s->done && s->stream) { /* nothing of the stage's may be in flight when its memory goes */
        zero_event_record(s->done, s->stream);
        zero_event_sync(s->done);
    }
    for (int c = 0; s->ws && c < s->chunks; c++) gpt_cuda_workspace_destroy(s->ws[c]);
    free(s->ws);
    /* the tp comm back to host-blocking calls (its queued ops waited for) - unless a newer stage
     * already took it over for its own stream (train_parallel makes the new stage first) */
    if (s->tp && zero_comm_get_stream(s->tp) == s->stream) (void)zero_comm_set_stream(s->tp, NULL);
    zero_device_free(s->dev, s->wpe);
    zero_device_free(s->dev, s->dwpe);
    pp_pool_free(&s->pool);
    pp_run_cache_free(&s->cache); /* its events: the stream no longer waits for them (synced above) */
    for (int k = 0; k < s->cap_loss; k++) zero_host_free_pinned(s->dev, s->losses[k]);
    free(s->losses), free(s->valid);
    zero_event_destroy(s->done);
    if (s->own_stream) zero_stream_destroy(s->stream);
    free(s);
}

zero_status pp_cuda_stage_create(pp_cuda_stage **out, const gpt_config *cfg, zero_device *dev, zero_stream *stream,
                                 int batch, zero_dtype param_dtype, const gpt_cuda_options *opts,
                                 const gpt_checkpointing *ck, int pp_size, int pp_rank, int chunks,
                                 const int *slots_of, zero_comm *tp, zero_comm *ep)
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
    s->cfg = *cfg, s->dev = dev, s->chunks = chunks, s->batch = batch, s->param_dtype = param_dtype;
    s->tp_size = tp ? zero_comm_get_size(tp) : 1;
    if (opts) s->opts = *opts;
    else s->opts = (gpt_cuda_options){GPT_CUDA_MATH_BF16, ZERO_F32, GPT_CUDA_ATTN_UNFUSED}; /* gpt_cuda.h's default */
    s->pool.ctx = dev, s->pool.raw_alloc = raw_alloc, s->pool.raw_free = raw_free;
    zero_status st = ZERO_OK;
    s->stream = stream, s->own_stream = !stream;
    if ((!stream && zero_stream_create(dev, &s->stream) != ZERO_OK) || zero_event_create(dev, &s->done) != ZERO_OK)
        st = gpt_fail(ZERO_BACKEND, "pp_cuda_stage_create: the stage's stream or event: %s", zero_last_error());
    /* the tp all-reduces inside the blocks: stream-ordered on the stage's stream (NCCL runs them
     * there, asynchronously; STAGED waits for the stream and runs them in the call), so the host
     * does not wait for the stream before each one (gpt_cuda_workspace_create_tp checks the match) */
    if (st == ZERO_OK && s->tp_size > 1) {
        if (zero_comm_set_stream(tp, s->stream) != ZERO_OK)
            st = gpt_fail(ZERO_BACKEND, "pp_cuda_stage_create: ordering the tp comm on the stage's stream: %s",
                          zero_last_error());
        else s->tp = tp;
    }
    int has_embed = 0, has_head = 0;
    for (int c = 0; c < chunks && st == ZERO_OK; c++) {
        int b, e;
        st = pp_chunk_layers(cfg, pp_size, chunks, pp_rank, c, &b, &e);
        if (st == ZERO_OK)
            st = gpt_cuda_workspace_create_stage_moe(&s->ws[c], cfg, batch, cfg->seq_len, param_dtype, opts,
                                                     gpt_cuda_stream_handle(s->stream), ck, b, e, slots_of[c], tp, ep);
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
    st->dev = s->dev, st->stream = s->stream, st->finish = finish;
    st->cache = &s->cache;
}

int pp_cuda_stage_transfer_allocs(const pp_cuda_stage *s) { return s ? s->pool.allocs : 0; }
int pp_cuda_stage_events_created(const pp_cuda_stage *s) { return s ? s->cache.created : 0; }

void pp_cuda_stage_activation_bytes_without_ckpt(const pp_cuda_stage *s, gpt_activation_bytes *out)
{
    memset(out, 0, sizeof *out);
    for (int c = 0; s && c < s->chunks; c++) {
        gpt_activation_bytes b;
        int lb, le;
        gpt_cuda_workspace_range(s->ws[c], &lb, &le);
        if (gpt_cuda_activation_bytes_stage(&s->cfg, s->tp_size, s->batch, s->cfg.seq_len, s->param_dtype, &s->opts,
                                            NULL, lb, le, gpt_cuda_workspace_slots(s->ws[c]), &b) != ZERO_OK)
            gpt_cuda_workspace_activation_bytes(s->ws[c], &b);
        out->inputs += b.inputs, out->blocks += b.blocks, out->recompute += b.recompute, out->head += b.head;
        out->scratch += b.scratch, out->host += b.host, out->moe += b.moe, out->total += b.total;
    }
}

void pp_cuda_stage_activation_bytes(const pp_cuda_stage *s, gpt_activation_bytes *out)
{
    memset(out, 0, sizeof *out);
    for (int c = 0; s && c < s->chunks; c++) {
        gpt_activation_bytes b;
        gpt_cuda_workspace_activation_bytes(s->ws[c], &b);
        out->inputs += b.inputs, out->blocks += b.blocks, out->recompute += b.recompute, out->head += b.head;
        out->scratch += b.scratch, out->host += b.host, out->moe += b.moe, out->total += b.total;
    }
}
