/* Checkpoint accessors: the owned part of each parameter's fp32 state, the
 * scalars, and re-deriving the parameters after the state was replaced. */
#include <stdio.h>
#include <string.h>

#include "engine_internal.h"

static const char *kind_name(zero_state_kind k)
{
    switch (k) {
    case ZERO_STATE_MASTER: return "master";
    case ZERO_STATE_MOMENT1: return "moment1";
    case ZERO_STATE_MOMENT2: return "moment2";
    }
    return "unknown";
}

static zero_status state_locate(zero_engine *e, zero_state_kind kind, int param, const void *buf, const char *what,
                                float **where, size_t *count)
{
    ZERO_TRY(engine_check_usable(e, what, 1));
    if (param < 0 || param >= e->num_params)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "%s: unknown parameter %d (%d parameters)", what, param,
                         e->num_params);
    if (kind != ZERO_STATE_MASTER && kind != ZERO_STATE_MOMENT1 && kind != ZERO_STATE_MOMENT2)
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: unknown state kind %d", what, (int)kind);
    const zero_param *p = &e->params[param];
    *count = (size_t)(p->own_end - p->own_begin);
    if (*count && !buf) return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: buffer is NULL", what);
    if (e->off_walk) { /* offloaded: the caller goes through the store (offload_state_io) */
        *where = NULL;
        if ((int)kind < e->off_states) return ZERO_OK;
        return zero_fail(&e->err, ZERO_NOT_FOUND, "%s: the optimizer keeps no %s state (parameter '%s')", what,
                         kind_name(kind), p->name);
    }
    if (kind == ZERO_STATE_MASTER) /* fp32 offloaded params are their own master */
        ZERO_TRY(poff_open_master(e, &e->buckets[p->bucket], POFF_READ, what));
    *where = layout_param_state(e, kind, p);
    if (!*where)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "%s: the optimizer keeps no %s state (parameter '%s')", what,
                         kind_name(kind), p->name);
    return ZERO_OK;
}

zero_status zero_engine_state_get(zero_engine *e, zero_state_kind kind, int param, float *out)
{
    float *src;
    size_t n;
    ZERO_TRY(state_locate(e, kind, param, out, "engine state_get", &src, &n));
    if (!n) return ZERO_OK;
    if (e->off_walk)
        return offload_state_io(e, (int)kind, e->params[param].shard_off, n, out, 0, "engine state_get");
    ZERO_TRY(engine_sync_device(e, "engine state_get"));
    zero_status st = zero_memcpy(e->dev, out, src, n * sizeof(float));
    if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine state_get: ");
    return ZERO_OK;
}

zero_status zero_engine_state_set(zero_engine *e, zero_state_kind kind, int param, const float *in)
{
    float *dst;
    size_t n;
    ZERO_TRY(state_locate(e, kind, param, in, "engine state_set", &dst, &n));
    if (!n) return ZERO_OK;
    if (e->off_walk)
        return offload_state_io(e, (int)kind, e->params[param].shard_off, n, (float *)in, 1, "engine state_set");
    ZERO_TRY(engine_sync_device(e, "engine state_set"));
    zero_status st = zero_memcpy(e->dev, dst, in, n * sizeof(float));
    if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine state_set: ");
    if (kind == ZERO_STATE_MASTER) return poff_store_open(e, "engine state_set"); /* the offloaded shard */
    return ZERO_OK;
}

zero_status zero_engine_params_changed(zero_engine *e)
{
    const char *what = "engine params_changed";
    ZERO_TRY(engine_check_usable(e, what, 1));
    for (int i = 0; i < e->num_modules; i++)
        if (e->cfg.stage == 3 && e->modules[i].gather_count > 0)
            return zero_fail(&e->err, ZERO_INVALID_STATE, "%s: module '%s' is gathered; release it first", what,
                             e->modules[i].name);
    ZERO_TRY(gather_drop_prefetches(e, what));
    const uint64_t r = (uint64_t)e->rank;
    for (int bi = 0; bi < e->num_buckets; bi++) {
        const zero_bucket *b = &e->buckets[bi];
        if (e->cfg.stage == 0) {
            /* Only the owned part was written: spread every rank's part. */
            float *regions[3] = {layout_master(e, b), layout_moment(e, e->m1, b), layout_moment(e, e->m2, b)};
            ZERO_TRY(engine_sync_device(e, what));
            for (int k = 0; k < 3; k++) {
                if (!regions[k]) continue;
                zero_status st = zero_allgather(e->dp, regions[k] + b->chunk * r, regions[k], b->chunk, ZERO_F32);
                if (st != ZERO_OK) return engine_comm_failed(e, st, what);
            }
        }
        if (e->off_walk) ZERO_TRY(offload_cast_bucket(e, b, what)); /* the master is in the store */
        ZERO_TRY(step_propagate_bucket(e, b, what));
    }
    ZERO_TRY(poff_flush(e, what));
    return engine_sync_device(e, what);
}

zero_status zero_engine_read_param(zero_engine *e, int param, float *out)
{
    const char *what = "engine read_param";
    ZERO_TRY(engine_check_usable(e, what, 1));
    if (param < 0 || param >= e->num_params)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "%s: unknown parameter %d (%d parameters)", what, param,
                         e->num_params);
    if (!out) return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: out is NULL", what);
    const zero_param *p = &e->params[param];
    const zero_bucket *b = &e->buckets[p->bucket];
    ZERO_TRY(grads_flush(e, what)); /* the staging slot is ours for a moment */
    const float *whole;
    if (e->cfg.stage == 0) {
        whole = layout_master(e, b);
    } else {
        ZERO_TRY(poff_open_master(e, b, POFF_READ, what));
        const float *own = layout_master(e, b);
        if (e->off_walk) { /* this rank's part comes from the store */
            ZERO_TRY(offload_state_io(e, 0, b->shard_off, b->chunk, e->slots[0].recv, 0, what));
            own = e->slots[0].recv;
        }
        ZERO_TRY(engine_sync_device(e, what));
        zero_status st = zero_allgather(e->dp, own, e->slots[0].send, b->chunk, ZERO_F32);
        if (st != ZERO_OK) return engine_comm_failed(e, st, what);
        whole = e->slots[0].send;
    }
    ZERO_TRY(engine_sync_device(e, what));
    zero_status st = zero_memcpy(e->dev, out, whole + p->in_bucket, p->numel * sizeof(float));
    if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine read_param: ");
    return ZERO_OK;
}

zero_status zero_engine_get_scalars(const zero_engine *e, zero_engine_scalars *out)
{
    if (!e || !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine get_scalars: NULL argument");
    memset(out, 0, sizeof *out);
    out->step = e->step;
    out->skipped_steps = e->skipped;
    out->loss_scale = e->loss_scale;
    out->hysteresis_left = e->hysteresis_left;
    out->good_steps = e->good_steps;
    out->lr = e->cfg.lr;
    return ZERO_OK;
}

zero_status zero_engine_set_scalars(zero_engine *e, const zero_engine_scalars *in)
{
    if (!e || !in) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine set_scalars: NULL argument");
    if (in->step < 0 || in->skipped_steps < 0 || in->good_steps < 0 || !(in->loss_scale > 0) ||
        in->hysteresis_left < 0 || !(in->lr >= 0))
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT,
                         "engine set_scalars: out of range (step %lld, loss_scale %g, hysteresis_left %d, lr %g)",
                         (long long)in->step, in->loss_scale, in->hysteresis_left, in->lr);
    e->step = in->step;
    e->skipped = in->skipped_steps;
    e->loss_scale = in->loss_scale;
    e->hysteresis_left = in->hysteresis_left;
    e->good_steps = in->good_steps;
    e->cfg.lr = in->lr;
    return ZERO_OK;
}
