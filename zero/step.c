/* The optimizer step: norm, overflow, clipping, update, re-assembly of the
 * parameters, and fp16 dynamic loss scaling. */
#include <math.h>
#include <stdio.h>

#include "engine_internal.h"

#define WHAT "engine step"

static zero_status comm_sync(zero_engine *e) { return engine_sync_stream(e, WHAT); }

/* DeepSpeed's DynamicLossScaler with delayed shift (hysteresis). */
static void loss_scaler_update(zero_engine *e, int overflow)
{
    const zero_config *c = &e->cfg;
    if (c->compute_dtype != ZERO_F16) return;
    const int dynamic = !(c->loss_scale > 0);
    if (overflow) {
        e->good_steps = 0;
        if (!dynamic) return;
        if (e->hysteresis_left <= 1) {
            double s = e->loss_scale / 2.0;
            e->loss_scale = s < c->min_loss_scale ? c->min_loss_scale : s;
        } else {
            e->hysteresis_left--;
        }
        return;
    }
    e->good_steps++;
    if (dynamic && e->good_steps % c->loss_scale_window == 0) {
        e->loss_scale *= 2.0;
        e->hysteresis_left = c->hysteresis;
    }
}

static zero_status propagate(zero_engine *e, const zero_bucket *b, int cast, const char *what);

/* Cast the updated fp32 region of bucket b into the compute-dtype params
 * and make them whole where the stage keeps them whole. */
zero_status step_propagate_bucket(zero_engine *e, const zero_bucket *b, const char *what)
{
    return propagate(e, b, 1, what);
}

zero_status step_gather_bucket(zero_engine *e, const zero_bucket *b, const char *what)
{
    return propagate(e, b, 0, what);
}

static zero_status propagate(zero_engine *e, const zero_bucket *b, int cast, const char *what)
{
    const zero_dtype dt = e->cfg.compute_dtype;
    const uint64_t r = (uint64_t)e->rank;
    zero_status st = ZERO_OK;
    switch (e->cfg.stage) {
    case 0:
        if (e->master && cast)
            st = zero_cast(e->dev, e->master + b->flat_off, ZERO_F32, elem_ptr(e, e->params_full, b->flat_off), dt,
                           b->numel, e->stream);
        if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine: casting master to params: ");
        return ZERO_OK;
    case 1:
    case 2: {
        void *full = elem_ptr(e, e->params_full, b->flat_off);
        void *own = elem_ptr(e, full, b->chunk * r);
        if (e->master && cast)
            st = zero_cast(e->dev, e->master + b->shard_off, ZERO_F32, own, dt, b->chunk, e->stream);
        if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine: casting master to params: ");
        if (cast) ZERO_TRY(engine_sync_stream(e, what)); /* the fused step's caller waited once for all */
        st = zero_allgather(e->dp, own, full, b->chunk, dt); /* in place: send = recv + rank*count */
        if (st != ZERO_OK) return engine_comm_failed(e, st, what);
        return ZERO_OK;
    }
    default: {
        if (e->master || b->persistent) ZERO_TRY(poff_open(e, b, e->master ? POFF_WRITE : POFF_READ, what));
        void *own = layout_param_chunk(e, b);
        if (e->master && cast)
            st = zero_cast(e->dev, e->master + b->shard_off, ZERO_F32, own, dt, b->chunk, e->stream);
        if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine: casting master to params: ");
        if (b->persistent) {
            if (cast) ZERO_TRY(engine_sync_stream(e, what));
            st = zero_allgather(e->dp, own, elem_ptr(e, e->persist, b->persist_off), b->chunk, dt);
            if (st != ZERO_OK) return engine_comm_failed(e, st, what);
        }
        return ZERO_OK;
    }
    }
}

zero_status zero_engine_step(zero_engine *e, zero_step_result *out)
{
    ZERO_TRY(engine_check_usable(e, WHAT, 1));
    if (e->untraced)
        return zero_fail(&e->err, ZERO_INVALID_STATE,
                         WHAT ": untraced mode is on (forwards outside training); zero_engine_set_untraced(e, 0) first");
    const zero_config *c = &e->cfg;
    for (int i = 0; i < e->num_modules; i++) {
        const zero_module *m = &e->modules[i];
        if (m->num_buckets > 0 && m->ready_count != c->gradient_accumulation_steps)
            return zero_fail(&e->err, ZERO_INVALID_STATE,
                             WHAT ": module '%s' reported grads-ready %d time(s), expected %d"
                             " (gradient_accumulation_steps) since the last step",
                             m->name, m->ready_count, c->gradient_accumulation_steps);
        if (c->stage == 3 && m->gather_count > 0)
            return zero_fail(&e->err, ZERO_INVALID_STATE, WHAT ": module '%s' is still gathered; release it first",
                             m->name);
    }
    ZERO_TRY(engine_wait_compute(e, WHAT)); /* the trainer's work on the parameters is done */
    ZERO_TRY(grads_flush(e, WHAT));
    ZERO_TRY(gather_drop_prefetches(e, WHAT));

    /* Global norm: the sum of squares of every rank's shard, bucket by bucket
     * in plan order (grad_norm.c: on the CPU taken as the gradients landed),
     * then one scalar all-reduce. A non-finite value anywhere makes the sum
     * non-finite, so the same all-reduce carries the overflow. */
    double local = 0.0;
    ZERO_TRY(grad_norm_local(e, &local));
    e->norm_buf = local;
    ZERO_TRY(engine_allreduce_host(e, &e->norm_buf, 1, ZERO_F64, ZERO_SUM, WHAT));
    double total = e->norm_buf;
    ZERO_TRY(mp_norm_reduce(e, &total, WHAT)); /* tp/pp: over dp x mp, overflow included */
    zero_status st;

    const double scale_used = e->loss_scale;
    const double inv = 1.0 / ((double)e->world * (double)c->gradient_accumulation_steps * scale_used);
    const double norm = sqrt(total) * inv;
    const int overflow = !isfinite(total);
    zero_step_result res = {0};
    res.grad_norm = norm;
    res.loss_scale = scale_used;
    res.clip_coef = 1.0;

    if (overflow && c->compute_dtype == ZERO_F16) {
        /* Skip everywhere: nothing but the scaler changes. */
        e->skipped++;
        loss_scaler_update(e, 1);
        ZERO_TRY(grads_zero_all(e, 1));
        gather_end_step(e);
        res.skipped = 1;
        ZERO_TRY(engine_hand_to_compute(e, WHAT));
        res.step = e->step;
        res.next_loss_scale = e->loss_scale;
        e->stats.steps++;
        if (out) *out = res;
        return ZERO_OK;
    }

    if (c->gradient_clipping > 0 && isfinite(norm)) {
        double coef = c->gradient_clipping / (norm + 1e-6); /* torch.nn.utils.clip_grad_norm_ */
        if (coef < 1.0) res.clip_coef = coef;
    }
    const float grad_scale = (float)(inv * res.clip_coef);

    e->step++;
    /* Offloaded state in host memory or on NVMe: chunk by chunk (offload_opt.c). */
    const int fused = optim_fused_usable(e);
    if (e->off_walk) ZERO_TRY(offload_step(e, grad_scale, WHAT));
    if (fused) {
        /* One launch over the whole shard, params written in the same pass
         * (optim_fused.c); then, after one wait, the all-gathers of what the
         * stage keeps whole. */
        ZERO_TRY(optim_fused_step(e, grad_scale, WHAT));
        if (c->stage > 0) ZERO_TRY(comm_sync(e));
        for (int bi = 0; bi < e->num_buckets; bi++) ZERO_TRY(step_gather_bucket(e, &e->buckets[bi], WHAT));
    }
    for (int bi = 0; !e->off_walk && !fused && bi < e->num_buckets; bi++) {
        const zero_bucket *b = &e->buckets[bi];
        const float *g = e->gacc + b->shard_off;
        if (c->stage == 0 && e->world > 1) {
            /* Everything on every rank: assemble the whole reduced bucket
             * (one rank holds it whole already: no self-copy). */
            ZERO_TRY(comm_sync(e));
            st = zero_allgather(e->dp, e->gacc + b->shard_off, e->slots[0].send, b->chunk, ZERO_F32);
            if (st != ZERO_OK) return engine_comm_failed(e, st, WHAT);
            g = e->slots[0].send;
        }
        ZERO_TRY(poff_open_master(e, b, POFF_READ | POFF_WRITE, WHAT));
        ZERO_TRY(optim_update(e, layout_master(e, b), g, layout_moment(e, e->m1, b), layout_moment(e, e->m2, b),
                              layout_region_numel(e, b), grad_scale, layout_region_flat(e, b)));
        ZERO_TRY(step_propagate_bucket(e, b, WHAT));
    }
    ZERO_TRY(poff_flush(e, WHAT)); /* the last updated chunk of an offloaded shard */
    ZERO_TRY(comm_sync(e));
    loss_scaler_update(e, 0);
    ZERO_TRY(grads_zero_all(e, 1));
    gather_end_step(e);
    ZERO_TRY(poff_read_ahead(e, WHAT)); /* the next step's first chunks, read while the caller prepares it */
    ZERO_TRY(engine_hand_to_compute(e, WHAT)); /* updated parameters, zeroed gradients */
    res.step = e->step;
    res.next_loss_scale = e->loss_scale;
    e->stats.steps++;
    if (out) *out = res;
    return ZERO_OK;
}
