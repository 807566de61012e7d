/* Stage 3: per-module gather / release of sharded parameters and the
 * prefetcher that replays the gather order recorded in the previous step.
 *
 * The prefetcher's decisions depend only on the recorded order and sizes,
 * which are the same on every rank, so every rank issues the same
 * collectives in the same order. */
#include <stdio.h>
#include <stdlib.h>

#include "engine_internal.h"

#define TRACE_MAX (1 << 20)

static zero_status trace_push(zero_engine *e, int **arr, int *len, int *cap, int v)
{
    if (*len == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        int *a = realloc(*arr, (size_t)nc * sizeof *a);
        if (!a) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine gather: out of memory");
        *arr = a;
        *cap = nc;
    }
    (*arr)[(*len)++] = v;
    return ZERO_OK;
}

/* Issue the all-gathers of module m's sharded buckets into a new buffer. */
static zero_status issue_gather(zero_engine *e, zero_module *m, int async, const char *what)
{
    /* every element, padding included, arrives by the all-gather */
    ZERO_TRY(engine_transient_get(e, ZERO_MEM_PARAMS, m->gather_numel * e->dsize, 0, &m->gathered));
    if (!m->reqs) {
        m->reqs = calloc((size_t)m->num_buckets, sizeof *m->reqs);
        if (!m->reqs) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", what);
    }
    ZERO_TRY(engine_sync_stream(e, what));
    e->live_numel += m->gather_numel;
    if (async) e->inflight_numel += m->gather_numel;
    e->stats.gathers++;
    if (async) e->stats.prefetches++;
    if (e->inflight_numel > e->stats.peak_inflight_numel) e->stats.peak_inflight_numel = e->inflight_numel;
    if (e->live_numel > e->stats.peak_live_numel) e->stats.peak_live_numel = e->live_numel;
    m->state = async ? MODULE_INFLIGHT : MODULE_GATHERED;
    for (int i = 0; i < m->num_buckets; i++) {
        const zero_bucket *b = &e->buckets[m->bucket_ids[i]];
        if (b->persistent) continue;
        const void *send = elem_ptr(e, e->params_shard, b->shard_off);
        void *recv = elem_ptr(e, m->gathered, b->gather_off);
        if (e->poff_walk) { /* offloaded: the chunk lands in its own slot, gathered in place */
            send = elem_ptr(e, recv, b->chunk * (uint64_t)e->rank);
            ZERO_TRY(poff_fetch(e, b, (void *)send, what));
        }
        /* The label goes into the collective's fingerprint: ranks gathering
         * same-sized modules in different orders then fail by name. */
        zero_comm_set_label(e->dp, m->name);
        zero_status st = async ? zero_allgather_async(e->dp, send, recv, b->chunk, e->cfg.compute_dtype, &m->reqs[i])
                               : zero_allgather(e->dp, send, recv, b->chunk, e->cfg.compute_dtype);
        zero_comm_set_label(e->dp, NULL);
        if (st != ZERO_OK) {
            if (async) m->reqs[i] = NULL;
            return engine_comm_failed(e, st, what);
        }
    }
    return ZERO_OK;
}

static zero_status wait_gather(zero_engine *e, zero_module *m, const char *what)
{
    zero_status first = ZERO_OK;
    for (int i = 0; i < m->num_buckets; i++) {
        if (!m->reqs[i]) continue;
        zero_status st = zero_wait(m->reqs[i]);
        m->reqs[i] = NULL;
        if (st != ZERO_OK && first == ZERO_OK) first = engine_comm_failed(e, st, what);
    }
    e->inflight_numel -= m->gather_numel;
    m->state = MODULE_GATHERED;
    return first;
}

static void free_gathered(zero_engine *e, zero_module *m)
{
    if (m->gathered) {
        engine_transient_put(e, ZERO_MEM_PARAMS, m->gather_numel * e->dsize, m->gathered);
        e->live_numel -= m->gather_numel;
    }
    m->gathered = NULL;
    m->state = MODULE_RELEASED;
}

/* Issue prefetches for the modules recorded after the current position, in
 * order, while they fit the in-flight and live budgets. */
static zero_status prefetch_ahead(zero_engine *e, const char *what)
{
    for (int j = e->cur_len; j < e->trace_len; j++) {
        zero_module *t = &e->modules[e->trace[j]];
        if (t->gather_numel == 0 || t->state != MODULE_RELEASED) continue;
        if (e->inflight_numel + t->gather_numel > e->cfg.stage3_prefetch_bucket_size) break;
        if (e->live_numel + t->gather_numel > e->cfg.stage3_max_live_parameters) break;
        ZERO_TRY(issue_gather(e, t, 1, what));
    }
    return ZERO_OK;
}

/* ---------------------------------------------------------------- untraced gathers
 * Outside the trace: no record, no order check, no prefetch, no stats. A
 * module the trace holds gathered is used as it is; otherwise the gather
 * is a synchronous all-gather into a buffer of its own, so a prefetch in
 * flight for the module stays in flight, to be used (and counted) by the
 * traced gather it was issued for. */
static zero_status untraced_gather(zero_engine *e, zero_module *m, const char *what)
{
    if (m->ugather_count++ > 0 || m->gather_numel == 0 || m->state == MODULE_GATHERED) return ZERO_OK;
    ZERO_TRY(engine_transient_get(e, ZERO_MEM_PARAMS, m->gather_numel * e->dsize, 0, &m->ugathered));
    ZERO_TRY(engine_sync_stream(e, what));
    for (int i = 0; i < m->num_buckets; i++) {
        const zero_bucket *b = &e->buckets[m->bucket_ids[i]];
        if (b->persistent) continue;
        const void *send = elem_ptr(e, e->params_shard, b->shard_off);
        void *recv = elem_ptr(e, m->ugathered, b->gather_off);
        if (e->poff_walk) {
            send = elem_ptr(e, recv, b->chunk * (uint64_t)e->rank);
            ZERO_TRY(poff_fetch(e, b, (void *)send, what));
        }
        zero_comm_set_label(e->dp, m->name);
        zero_status st = zero_allgather(e->dp, send, recv, b->chunk, e->cfg.compute_dtype);
        zero_comm_set_label(e->dp, NULL);
        if (st != ZERO_OK) return engine_comm_failed(e, st, what);
    }
    /* complete for the compute stream, as a traced gather */
    return engine_hand_to_compute(e, what);
}

static void untraced_free(zero_engine *e, zero_module *m)
{
    if (m->ugathered) engine_transient_put(e, ZERO_MEM_PARAMS, m->gather_numel * e->dsize, m->ugathered);
    m->ugathered = NULL;
}

zero_status zero_engine_set_untraced(zero_engine *e, int untraced)
{
    ZERO_TRY(engine_check_usable(e, "engine set_untraced", 1));
    if (!untraced && e->untraced)
        for (int i = 0; i < e->num_modules; i++)
            if (e->modules[i].ugather_count > 0)
                return zero_fail(&e->err, ZERO_INVALID_STATE,
                                 "engine set_untraced: module '%s' is still gathered untraced; release it first",
                                 e->modules[i].name);
    e->untraced = untraced != 0;
    return ZERO_OK;
}

int zero_engine_get_untraced(const zero_engine *e) { return e ? e->untraced : 0; }

void *gather_module_params(const zero_module *m)
{
    if (m->ugathered) return m->ugathered;
    return m->state == MODULE_GATHERED ? m->gathered : NULL;
}

zero_status zero_engine_gather(zero_engine *e, int module)
{
    ZERO_TRY(engine_check_usable(e, "engine gather", 1));
    engine_progress(e); /* the caller's compute pauses here: advance overlapped collectives */
    if (module < 0 || module >= e->num_modules)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "engine gather: unknown module %d (%d modules)", module,
                         e->num_modules);
    zero_module *m = &e->modules[module];
    if (e->cfg.stage < 3) {
        m->gather_count++;
        return ZERO_OK;
    }
    char what[160];
    snprintf(what, sizeof what, "engine gather of module '%s'", m->name);
    if (e->untraced) return untraced_gather(e, m, what);

    /* Gathers without a step in between (an evaluation loop) would grow the
     * record without bound: past TRACE_MAX the step is simply not recorded. */
    if (e->cur_len < TRACE_MAX) ZERO_TRY(trace_push(e, &e->cur, &e->cur_len, &e->cur_cap, module));
    else e->replay_ok = 0;
    if (e->replay_ok && (e->cur_len > e->trace_len || e->trace[e->cur_len - 1] != module)) {
        zero_log(ZERO_LOG_WARN,
                 "engine: stage-3 gather order changed at gather #%d (recorded: module '%s', now: '%s');"
                 " prefetching stops for this step and the order is recorded again",
                 e->cur_len - 1, e->cur_len <= e->trace_len ? e->modules[e->trace[e->cur_len - 1]].name : "(end)",
                 m->name);
        e->replay_ok = 0;
        e->stats.order_changes++;
    }

    if (m->gather_count == 0 && m->gather_numel > 0) {
        if (m->state == MODULE_INFLIGHT) {
            e->stats.prefetch_hits++;
            ZERO_TRY(wait_gather(e, m, what));
        } else {
            ZERO_TRY(issue_gather(e, m, 0, what));
        }
    }
    m->gather_count++;
    if (e->cfg.overlap_comm && e->replay_ok) ZERO_TRY(prefetch_ahead(e, what));
    if (e->poff_walk) ZERO_TRY(poff_read_ahead(e, what)); /* NVMe reads for the modules after those */
    /* The gathered parameters are complete for the compute stream. */
    return engine_hand_to_compute(e, what);
}

zero_status zero_engine_release(zero_engine *e, int module)
{
    ZERO_TRY(engine_check_usable(e, "engine release", 1));
    engine_progress(e); /* the caller's compute pauses here: advance overlapped collectives */
    if (module < 0 || module >= e->num_modules)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "engine release: unknown module %d (%d modules)", module,
                         e->num_modules);
    zero_module *m = &e->modules[module];
    if (e->untraced && e->cfg.stage == 3) {
        if (m->ugather_count == 0)
            return zero_fail(&e->err, ZERO_INVALID_STATE, "engine release: module '%s' is not gathered untraced",
                             m->name);
        if (--m->ugather_count == 0 && m->ugathered) {
            ZERO_TRY(engine_wait_compute(e, "engine release")); /* after the compute stream's reads */
            untraced_free(e, m);
        }
        return ZERO_OK;
    }
    if (m->gather_count == 0)
        return zero_fail(&e->err, ZERO_INVALID_STATE, "engine release: module '%s' is not gathered", m->name);
    m->gather_count--;
    if (e->cfg.stage == 3 && m->gather_count == 0) {
        /* The buffer is reused by later engine work only after the compute
         * stream's reads of it. */
        ZERO_TRY(engine_wait_compute(e, "engine release"));
        free_gathered(e, m);
    }
    return ZERO_OK;
}

zero_status gather_drop_prefetches(zero_engine *e, const char *what)
{
    zero_status first = ZERO_OK;
    for (int i = 0; i < e->num_modules; i++) {
        zero_module *m = &e->modules[i];
        if (m->state != MODULE_INFLIGHT) continue;
        zero_status st = wait_gather(e, m, what);
        if (st != ZERO_OK && first == ZERO_OK) first = st;
        free_gathered(e, m);
        e->stats.prefetch_dropped++;
    }
    return first;
}

void gather_end_step(zero_engine *e)
{
    if (e->cfg.stage < 3) return;
    if (e->cur_len >= TRACE_MAX) { /* not a usable record: keep the old one */
        e->cur_len = 0;
        e->replay_ok = e->have_trace;
        return;
    }
    int same = e->have_trace && e->cur_len == e->trace_len;
    for (int i = 0; same && i < e->cur_len; i++) same = e->cur[i] == e->trace[i];
    if (!same) {
        if (e->have_trace && e->replay_ok) {
            zero_log(ZERO_LOG_WARN, "engine: stage-3 gather order changed (%d gathers, %d recorded); recorded again",
                     e->cur_len, e->trace_len);
            e->stats.order_changes++;
        }
        int *t = e->trace;
        int cap = e->trace_cap;
        e->trace = e->cur;
        e->trace_cap = e->cur_cap;
        e->trace_len = e->cur_len;
        e->cur = t;
        e->cur_cap = cap;
        e->have_trace = 1;
    }
    e->cur_len = 0;
    e->replay_ok = e->have_trace;
}

void gather_free_all(zero_engine *e)
{
    for (int i = 0; i < e->num_modules; i++) {
        zero_module *m = &e->modules[i];
        if (m->gathered) free_gathered(e, m);
        untraced_free(e, m);
        m->gather_count = m->ugather_count = 0;
    }
}
