/* Gradient reduction: every micro-step, each module's gradients are turned
 * into fp32 bucket by bucket, reduce-scattered over the dp group and added
 * into this rank's fp32 gradient shard. The same operations in the same order
 * at every stage is what makes the stages bitwise identical. With
 * local_accumulation (stages 0-1) only the last micro-step before step()
 * reduces, the locally accumulated sum: stages 0 and 1 stay identical.
 *
 * The shard is never zeroed between steps: a bucket's first reduction after
 * a step (or zero_grad) writes its part of the shard directly (gacc_live),
 * later ones land in the slot and are added. So a step costs no zeroing pass
 * and no extra copy of the first reduction. The values are the sums the old
 * "zero, then add" gave, except that a sum of -0 now stays -0 (0 + -0 was
 * +0); every stage and offload mode takes this same path, so they remain
 * bitwise identical to each other.
 *
 * The trainer's buffer is read once (the fold, on the CPU device): at
 * stages 0-1 the full gradient must be zero again for the next micro-step
 * (the trainer accumulates with +=). Where the bucket is staged anyway (a
 * cast from bf16/f16, or a copy for overlap_comm) the staging pass zeroes
 * it block by block behind itself (zero_take_grad_), and over one rank,
 * where a reduce-scatter is the identity, the whole reduction is that one
 * pass straight into (or onto) the shard: no staging copy, no reduce-scatter
 * copy, no slot, no separate zeroing. The values are those of the copy /
 * cast, reduce-scatter and axpy it replaces, so every stage and mode (and
 * ZERO_GRAD_FOLD=0, which turns the fold off) keeps the same bits. Only an
 * fp32 bucket reduced synchronously over several ranks is read by the
 * transport itself and zeroed in a pass of its own afterwards. */
#include <stdio.h>
#include <string.h>

#include "device/device_internal.h"
#include "engine_internal.h"

/* Finish the reduce-scatter held by `slot` (if any) and accumulate it. */
static zero_status slot_complete(zero_engine *e, zero_slot *slot, const char *what)
{
    if (slot->bucket < 0) return ZERO_OK;
    const zero_bucket *b = &e->buckets[slot->bucket];
    if (slot->req) {
        zero_status st = zero_wait(slot->req);
        slot->req = NULL;
        if (st != ZERO_OK) {
            slot->bucket = -1;
            return engine_comm_failed(e, st, what);
        }
    }
    slot->bucket = -1;
    if (!slot->direct) { /* otherwise it landed in the shard */
        zero_status st = zero_axpy(e->dev, 1.0f, slot->recv, e->gacc + b->shard_off, ZERO_F32, b->chunk, e->stream);
        if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine: accumulating a reduced bucket: ");
    }
    /* The chunk is final and in cache: the norm's sum of squares now, not
     * in a pass of its own over the shard at the step (grad_norm.c). */
    if (slot->last && grad_norm_at_landing(e)) ZERO_TRY(grad_norm_landed(e, b));
    return ZERO_OK;
}

zero_status grads_flush(zero_engine *e, const char *what)
{
    /* Slots are used round-robin, so next_slot is the oldest: complete in
     * issue order, which keeps the accumulation order of a bucket reduced
     * twice (accumulation) the same with and without overlap. */
    for (int i = 0; i < e->num_slots; i++) {
        zero_slot *s = &e->slots[(e->next_slot + i) % e->num_slots];
        ZERO_TRY(slot_complete(e, s, what));
    }
    return ZERO_OK;
}

/* last: the bucket's last reduction before the step (its module's
 * gradient_accumulation_steps-th grads_ready). *cleared: src was zeroed on
 * the way (stages 0-1 ask for it: clear). */
static zero_status reduce_bucket(zero_engine *e, const zero_bucket *b, void *src, int last, int clear, int *cleared,
                                 const char *what)
{
    *cleared = 0;
    zero_slot *slot = &e->slots[e->next_slot];
    e->next_slot = (e->next_slot + 1) % e->num_slots;
    ZERO_TRY(slot_complete(e, slot, what));
    const int bi = (int)(b - e->buckets);
    zero_status st = ZERO_OK;

    if (e->grad_fold && e->world == 1 && b->chunk == b->numel) {
        /* One rank: the reduce-scatter is the identity, so the bucket goes
         * into the shard (its first reduction of the step) or onto it in
         * one pass, on the engine stream; nothing is in flight to overlap. */
        const int acc = e->gacc_live[bi];
        e->gacc_live[bi] = 1;
        e->stats.reduce_scatters++;
        st = zero_take_grad_(e->dev, src, e->cfg.compute_dtype, clear, e->gacc + b->shard_off, acc, b->numel,
                             e->stream);
        if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine grads_ready: reducing a bucket: ");
        *cleared = clear;
        if (last && grad_norm_at_landing(e)) {
            /* The sum of squares waits for the stream without a deadline:
             * wait here first, with one (as the staged path does). */
            ZERO_TRY(engine_sync_stream(e, what));
            ZERO_TRY(grad_norm_landed(e, b));
        }
        return ZERO_OK;
    }

    /* fp32 gradients reduced synchronously need no staging copy: the
     * reduce-scatter only reads them, and they are not touched until it
     * returns. Otherwise (a cast, or the caller's buffer reused while the
     * reduction is in flight) they are staged in the slot, and the staging
     * pass zeroes them behind itself when asked. */
    const void *send = src;
    if (e->cfg.compute_dtype != ZERO_F32 || e->cfg.overlap_comm) {
        if (e->grad_fold) {
            st = zero_take_grad_(e->dev, src, e->cfg.compute_dtype, clear, slot->send, 0, b->numel, e->stream);
            *cleared = clear;
        } else if (e->cfg.compute_dtype != ZERO_F32) {
            st = zero_cast(e->dev, src, e->cfg.compute_dtype, slot->send, ZERO_F32, b->numel, e->stream);
        } else {
            st = engine_memcpy(e, slot->send, src, b->numel * 4);
        }
        send = slot->send;
    }
    if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine grads_ready: staging a bucket: ");
    ZERO_TRY(engine_sync_stream(e, what));
    slot->bucket = bi;
    slot->direct = !e->gacc_live[bi];
    slot->last = last;
    e->gacc_live[bi] = 1;
    float *recv = slot->direct ? e->gacc + b->shard_off : slot->recv;
    e->stats.reduce_scatters++;
    if (e->cfg.overlap_comm) {
        e->stats.async_reduce_scatters++;
        st = zero_reduce_scatter_async(e->dp, send, recv, b->chunk, ZERO_F32, ZERO_SUM, &slot->req);
        if (st != ZERO_OK) {
            slot->req = NULL;
            slot->bucket = -1;
            return engine_comm_failed(e, st, what);
        }
        return ZERO_OK;
    }
    st = zero_reduce_scatter(e->dp, send, recv, b->chunk, ZERO_F32, ZERO_SUM);
    if (st != ZERO_OK) {
        slot->bucket = -1;
        return engine_comm_failed(e, st, what);
    }
    return slot_complete(e, slot, what);
}

zero_status zero_engine_grads_ready(zero_engine *e, int module)
{
    ZERO_TRY(engine_check_usable(e, "engine grads_ready", 1));
    engine_progress(e); /* the caller's compute pauses here: advance overlapped collectives */
    if (module < 0 || module >= e->num_modules)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "engine grads_ready: unknown module %d (%d modules)", module,
                         e->num_modules);
    zero_module *m = &e->modules[module];
    char what[160];
    snprintf(what, sizeof what, "engine grads_ready of module '%s'", m->name);
    if (m->ready_count >= e->cfg.gradient_accumulation_steps)
        return zero_fail(&e->err, ZERO_INVALID_STATE,
                         "%s: already reported %d time(s) since the last step (gradient_accumulation_steps = %d);"
                         " call zero_engine_step", what, m->ready_count, e->cfg.gradient_accumulation_steps);
    /* local_accumulation (stages 0-1): the trainer's += has been summing the
     * micro-steps in the full gradient buffer; only the last grads_ready
     * before step() reduces that sum. */
    const int boundary = m->ready_count + 1 == e->cfg.gradient_accumulation_steps;
    if (m->num_buckets == 0 || (e->cfg.local_accumulation && !boundary)) {
        m->ready_count++;
        return ZERO_OK;
    }
    /* The trainer's gradients are complete in compute-stream order. */
    ZERO_TRY(engine_wait_compute(e, what));
    /* Stages 2-3: a module whose gradient was never asked for this
     * micro-step contributes zeros (the reduction is collective anyway). */
    if (e->cfg.stage >= 2 && !m->grad)
        ZERO_TRY(engine_transient_get(e, ZERO_MEM_GRADS, m->grad_numel * e->dsize, 1, &m->grad));
    for (int i = 0; i < m->num_buckets; i++) {
        const zero_bucket *b = &e->buckets[m->bucket_ids[i]];
        void *src = engine_bucket_grad(e, b);
        int cleared = 0;
        ZERO_TRY(reduce_bucket(e, b, src, boundary, e->cfg.stage < 2, &cleared, what));
        if (e->cfg.stage < 2 && !cleared) {
            /* Read by the reduction already: ready for the next micro-step. */
            zero_status st = zero_fill_value(e->dev, src, e->cfg.compute_dtype, b->numel, 0.0f, e->stream);
            if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine grads_ready: zeroing gradients: ");
        }
    }
    if (e->cfg.stage >= 2) {
        /* The one-pass reduction over one rank is still queued on the engine
         * stream of an asynchronous CPU device (the staged and the transport's
         * paths waited for it): a buffer in the cache may be freed. */
        if (e->grad_fold && e->world == 1) ZERO_TRY(engine_sync_stream(e, what));
        engine_transient_put(e, ZERO_MEM_GRADS, m->grad_numel * e->dsize, m->grad);
        m->grad = NULL;
    }
    m->ready_count++;
    /* The next micro-step's gradients go into buffers this call zeroed. */
    return engine_hand_to_compute(e, what);
}

zero_status grads_zero_all(zero_engine *e, int after_step)
{
    /* The shard: stale, overwritten by the next reductions (see the top). */
    memset(e->gacc_live, 0, (size_t)e->num_buckets);
    grad_norm_forget(e);
    /* The full gradients of stages 0-1: after a step every bucket has been
     * reduced at its last grads_ready, which zeroed it right after staging
     * (and nothing lies outside the buckets), so only zero_grad, which may
     * come mid-accumulation, has to clear them. */
    zero_status st = ZERO_OK;
    if (!after_step && e->grads_full)
        st = zero_fill_value(e->dev, e->grads_full, e->cfg.compute_dtype, e->padded, 0.0f, e->stream);
    if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine: zeroing gradients: ");
    /* Gradient buffers never handed to grads_ready (zero_grad mid-step) go
     * to the cache after the compute stream's writes to them. */
    int unreduced = 0;
    for (int i = 0; i < e->num_modules; i++) unreduced |= e->modules[i].grad != NULL;
    if (unreduced) ZERO_TRY(engine_wait_compute(e, "engine: zeroing gradients"));
    for (int i = 0; i < e->num_modules; i++) {
        zero_module *m = &e->modules[i];
        if (m->grad) engine_transient_put(e, ZERO_MEM_GRADS, m->grad_numel * e->dsize, m->grad);
        m->grad = NULL;
        m->ready_count = 0;
    }
    /* The released module buffers stay cached for the next step, trimmed to
     * what this step needed (alloc.c). */
    if (after_step) engine_transient_step_end(e);
    return engine_hand_to_compute(e, "engine: zeroing gradients");
}

zero_status zero_engine_zero_grad(zero_engine *e)
{
    ZERO_TRY(engine_check_usable(e, "engine zero_grad", 1));
    ZERO_TRY(grads_flush(e, "engine zero_grad"));
    return grads_zero_all(e, 0);
}
