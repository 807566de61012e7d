/* The pipeline runtime's view of one stage (internal): what pp_exec.c calls
 * to compute and to move activations, so one runtime drives the CPU stage
 * (tp_gpt.h's tp_workspace: pp_stage_tp) and the CUDA stage (gpt_cuda.h's
 * stage workspace: pp_stage_cuda) alike.
 *
 * A stage has `chunks` chunks (virtual stages c * pp + stage), each a range
 * of blocks with `slots(c)` activation sets (micro-batches in flight). The
 * runtime owns the order (the checked plan), the communication and the
 * transfer buffers; the stage owns the arithmetic and the memory the
 * transfers live in (`alloc`: host memory on the CPU, device memory on CUDA,
 * which the pp comm must then take: NCCL or STAGED). Every message is
 * rows x width floats.
 *
 * Ordering contract. A stage without a stream (`stream` NULL: the CPU
 * stage) computes on the host: when forward / backward returns, what it
 * wrote for the runtime (output(c, slot), `din`) is complete, and what it
 * read (`in`, `dout`) may be overwritten. A stage WITH a stream (the CUDA
 * stage) only enqueues its work there: what it writes is complete, and what
 * it reads free, once that stream has run the work. The runtime (pp_exec.c)
 * then orders the communication by events on `dev`, never by waiting for
 * the whole stream after each op:
 *   - stream-ordered comm (the pp comm has a stream set, zero_comm_set_stream:
 *     NCCL's own mode): before each group of sends / receives the comm's
 *     stream waits for an event recorded on the stage's stream; after it an
 *     event is recorded on the comm's stream, which the stage's stream waits
 *     for before the compute op that reads a received buffer or rewrites a
 *     sent one. The host waits for nothing until the end of the step;
 *   - host-driven comm (no stream set: MPI, STAGED, NCCL's requests): before
 *     each group the host waits for an event recorded on the stage's stream
 *     (the transport reads the buffers as soon as the op is issued); a
 *     receive is complete when its request is waited.
 * At the end of the step the runtime calls `finish` (if set), which waits
 * for the stage's stream and adds the losses forward deferred. The events
 * live in the stage's `cache` across steps (none made after a plan's first
 * step).
 *
 * Errors: zero_status, message in gpt_last_error(). */
#ifndef ZERO_MODEL_PP_STAGE_H
#define ZERO_MODEL_PP_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include <zero/device.h>

#include "gpt.h"
#include "pp_run_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pp_copy_kind {
    PP_COPY_BUFFERS = 0, /* stage memory to stage memory */
    PP_COPY_TO_HOST = 1, /* stage memory to a host array (complete on return) */
    PP_COPY_FROM_HOST = 2,
} pp_copy_kind;

typedef struct pp_stage {
    void *self;
    int chunks;
    const gpt_config *cfg;
    size_t rows;   /* rows of the residual stream a message carries (x width floats) */
    size_t width;  /* d_model */
    size_t tokens; /* tokens of a micro-batch (batch x seq): the stride of args' tokens / targets */
    const char *name; /* "cpu" / "cuda", for messages */

    void (*range)(void *self, int chunk, int *layer_begin, int *layer_end);
    int (*slots)(void *self, int chunk);
    /* Prepare chunk c for plans that split B and W (allocate the W stash). */
    zero_status (*split_backward)(void *self, int chunk);
    /* Chunk c's output for micro-batch slot `slot` (what SEND_ACT sends). */
    const float *(*output)(void *self, int chunk, int slot);
    /* F: `in` (NULL on virtual stage 0, which embeds `tokens`) is the input
     * activation; on the last virtual stage `targets` is non-NULL and *loss
     * receives the micro-batch's mean loss. An MoE model's stage (cfg
     * moe_experts > 0) also ADDS aux_loss_coef x its blocks' auxiliary losses
     * to *loss (the runtime passes 0 and sums the stages' shares over pp).
     * params: module-indexed sets. */
    zero_status (*forward)(void *self, int chunk, int slot, const float *in, const int32_t *tokens,
                           const int32_t *targets, const gpt_tensors *params, float *loss);
    /* B (whole = 1: B and its W as one unsplit backward). `dout` (NULL on the
     * last virtual stage, which starts from the loss scaled by dloss) is the
     * gradient of the output; `din` (NULL on virtual stage 0, which ends in
     * the embedding's gradients) receives the input's gradient. Gradients
     * ACCUMULATE into grads. */
    zero_status (*backward)(void *self, int chunk, int slot, int whole, const float *dout, float *din, float dloss,
                            const gpt_tensors *params, gpt_tensors *grads);
    /* W of a B that ran with whole = 0. */
    zero_status (*weight)(void *self, int chunk, int slot, gpt_tensors *grads);
    /* Transfer buffers: NULL when out of memory. */
    void *(*alloc)(void *self, size_t bytes);
    void (*release)(void *self, void *p); /* NULL accepted */
    zero_status (*copy)(void *self, void *dst, const void *src, size_t bytes, pp_copy_kind kind);
    /* Stream-ordered stages (above); NULL, NULL, NULL on the CPU stage. */
    zero_device *dev;    /* the device the stream and the runtime's events belong to */
    zero_stream *stream; /* where forward / backward / weight enqueue their work */
    /* End of step: the host waits for the stage's stream; the losses that
     * forward left out of *loss (written 0 there: reading them would wait
     * for the stream) are added to *loss_sum in forward order. */
    zero_status (*finish)(void *self, double *loss_sum);
    /* What the runtime keeps across this stage's steps (pp_run_cache.h: the
     * events ordering the transfers, the step's bookkeeping), owned by the
     * stage, which frees it (pp_run_cache_free) before its device goes.
     * NULL: the runtime makes them for the step and frees them after it (the
     * CPU stage, which has no events: only its arrays are remade). */
    pp_run_cache *cache;
} pp_stage;

#ifdef __cplusplus
}
#endif

#endif
