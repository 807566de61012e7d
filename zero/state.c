/* Checkpoint accessors: the owned part of each parameter's fp32 state, the
 * scalars, and re-deriving the parameters after the state was replaced. */
#include <stdio.h>
#include <string.h>

#include "checkpoint/checkpoint_internal.h" /* the hooks it declares are defined here */
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

/* Checks the arguments and that the optimizer keeps such a state
 * (ZERO_NOT_FOUND otherwise); *count = the owned elements. */
static zero_status state_check(zero_engine *e, zero_state_kind kind, int param, const void *buf, const char *what,
                               size_t *count)
{
    ZERO_TRY(engine_check_usable(e, what, 1));
    if (param < 0 || param >= e->num_params)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "%s: unknown parameter %d (%d parameters)", what, param,
                         e->num_params);
    if (kind != ZERO_STATE_MASTER && kind != ZERO_STATE_MOMENT1 && kind != ZERO_STATE_MOMENT2)
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: unknown state kind %d", what, (int)kind);
    const zero_param *p = &e->params[param];
    *count = (size_t)p->own_numel;
    if (*count && !buf) return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: buffer is NULL", what);
    /* offloaded: the states the store keeps; otherwise: the arrays that exist
     * (the master always: the params themselves for fp32 compute) */
    int have = e->off_walk ? (int)kind < e->off_states
                           : kind == ZERO_STATE_MASTER || (kind == ZERO_STATE_MOMENT1 ? e->m1 != NULL : e->m2 != NULL);
    if (!have)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "%s: the optimizer keeps no %s state (parameter '%s')", what,
                         kind_name(kind), p->name);
    return ZERO_OK;
}

/* Move the owned part of `param`'s state between host `buf` and where it
 * lives: offloaded, one run of the shard in the store; otherwise one copy
 * per bucket the parameter lies in (a split param's owned pieces are apart
 * in the flat layout of stage 0 and of fp32 params at stages 1-2). */
static zero_status state_move(zero_engine *e, zero_state_kind kind, int param, float *buf, int write,
                              const char *what)
{
    size_t n = 0;
    ZERO_TRY(state_check(e, kind, param, buf, what, &n));
    if (!n) return ZERO_OK;
    const zero_param *p = &e->params[param];
    if (e->off_walk) return offload_state_io(e, (int)kind, p->shard_off, n, buf, write, what);
    ZERO_TRY(engine_sync_stream(e, what));
    uint64_t done = 0;
    for (int k = p->first_bucket; k < p->first_bucket + p->num_buckets; k++) {
        const zero_bucket *b = &e->buckets[k];
        uint64_t lo, hi, in_chunk;
        if (!plan_owned_piece(e, p, b, &lo, &hi, &in_chunk)) continue;
        /* fp32 offloaded params are their own master: make b's chunk resident */
        if (kind == ZERO_STATE_MASTER) ZERO_TRY(poff_open_master(e, b, POFF_READ, what));
        float *at = layout_chunk_state(e, kind, b, in_chunk);
        zero_status st = write ? engine_memcpy(e, at, buf + done, (hi - lo) * sizeof(float))
                               : engine_memcpy(e, buf + done, at, (hi - lo) * sizeof(float));
        if (st != ZERO_OK) {
            char prefix[160];
            snprintf(prefix, sizeof prefix, "%s: ", what);
            return zero_fail_forward(&e->err, st, prefix);
        }
        if (write && kind == ZERO_STATE_MASTER) ZERO_TRY(poff_store_open(e, what)); /* the offloaded shard */
        done += hi - lo;
    }
    return ZERO_OK;
}

zero_status zero_engine_state_get(zero_engine *e, zero_state_kind kind, int param, float *out)
{
    return state_move(e, kind, param, out, 0, "engine state_get");
}

zero_status zero_engine_state_set(zero_engine *e, zero_state_kind kind, int param, const float *in)
{
    return state_move(e, kind, param, (float *)in, 1, "engine state_set");
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
            ZERO_TRY(engine_sync_stream(e, what));
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
    return engine_sync_stream(e, what);
}

/* read_param is collective at every stage (engine.h). Stage 0 holds the
 * whole parameter locally, but it communicates anyway, so a call made on
 * some ranks only fails the same way at every stage (the deadline, naming
 * the rule) instead of succeeding at stage 0 and hanging at 1-3; and ranks
 * that ask for different parameters (or pass a bad one) all learn it and get
 * a named error with the engine still usable. The two values travel in
 * norm_buf, not on the stack: a timed-out op may still be written later. */
static zero_status read_param_agree(zero_engine *e, int param, int bad, const char *what)
{
    int32_t v[2] = {bad ? INT32_MAX : param, bad ? INT32_MAX : -param};
    _Static_assert(sizeof e->norm_buf >= sizeof v, "norm_buf carries the agreement");
    memcpy(&e->norm_buf, v, sizeof v);
    zero_status st = engine_allreduce_host(e, &e->norm_buf, 2, ZERO_I32, ZERO_MAX, what);
    if (st != ZERO_OK)
        return zero_fail(&e->err, st,
                         "%s (read_param is COLLECTIVE at every stage: every rank of the dp group must call it with "
                         "the same parameter; a call on some ranks only ends like this)",
                         e->err.msg);
    memcpy(v, &e->norm_buf, sizeof v);
    if (v[0] == INT32_MAX)
        return zero_fail(&e->err, bad ? ZERO_INVALID_ARGUMENT : ZERO_PEER_FAILURE,
                         "%s: %s (read_param is collective: every rank failed with it)", what,
                         bad ? "an unknown parameter or a NULL buffer on this rank" : "another rank passed an unknown "
                                                                                      "parameter or a NULL buffer");
    if (v[0] != param || -v[1] != param)
        return zero_fail(&e->err, ZERO_MISMATCH,
                         "%s: ranks asked for different parameters (%d here; from %d to %d across the dp group); "
                         "read_param is collective: call it with the same parameter on every rank",
                         what, param, -v[1], v[0]);
    return ZERO_OK;
}

zero_status zero_engine_read_param(zero_engine *e, int param, float *out)
{
    const char *what = "engine read_param";
    ZERO_TRY(engine_check_usable(e, what, 1));
    int bad = param < 0 || param >= e->num_params || !out;
    ZERO_TRY(read_param_agree(e, param, bad, what));
    const zero_param *p = &e->params[param];
    ZERO_TRY(grads_flush(e, what)); /* the staging slot is ours for a moment */
    /* Bucket by bucket: a split param is assembled from each of its buckets. */
    for (int k = p->first_bucket; k < p->first_bucket + p->num_buckets; k++) {
        const zero_bucket *b = &e->buckets[k];
        uint64_t lo, hi, at;
        if (!plan_piece(e, p, b, &lo, &hi, &at)) continue;
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
            ZERO_TRY(engine_sync_stream(e, what));
            zero_status st = zero_allgather(e->dp, own, e->slots[0].send, b->chunk, ZERO_F32);
            if (st != ZERO_OK) return engine_comm_failed(e, st, what);
            whole = e->slots[0].send;
        }
        ZERO_TRY(engine_sync_stream(e, what));
        zero_status st = engine_memcpy(e, out + lo, whole + at, (hi - lo) * sizeof(float));
        if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine read_param: ");
    }
    return ZERO_OK;
}

zero_status engine_between_steps(zero_engine *e, const char *what)
{
    ZERO_TRY(engine_check_usable(e, what, 1));
    for (int i = 0; i < e->num_modules; i++) {
        const zero_module *m = &e->modules[i];
        if (m->gather_count > 0)
            return zero_fail(&e->err, ZERO_INVALID_STATE,
                             "%s: module '%s' is gathered; release it first (only between steps)", what, m->name);
        if (m->ready_count > 0)
            return zero_fail(&e->err, ZERO_INVALID_STATE,
                             "%s: a step is in progress (module '%s' reported grads_ready %d of %d times); call it "
                             "after step() or zero_grad(), the accumulated gradients are not part of a checkpoint",
                             what, m->name, m->ready_count, e->cfg.gradient_accumulation_steps);
    }
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
    ZERO_TRY(engine_scalars_check(in, &e->err, "engine set_scalars"));
    e->step = in->step;
    /* Restored after steps: the momentum buffers come with the state (the
     * groups count as started, as before groups had their own momentum). */
    for (int g = 0; g < e->num_groups; g++) e->groups[g].momentum_from = in->step > 0 ? 1 : 0;
    e->skipped = in->skipped_steps;
    e->loss_scale = in->loss_scale;
    e->hysteresis_left = in->hysteresis_left;
    e->good_steps = in->good_steps;
    e->cfg.lr = in->lr;
    return ZERO_OK;
}
