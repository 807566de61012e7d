/* The partition plan: a pure function of (parameters in registration order,
 * dp size, reduce_bucket_size, persistence threshold), computed identically
 * on every rank, then compared across ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

/* ---------------------------------------------------------------- hashing (fnv: engine_internal.h) */

static uint64_t param_hash(const zero_engine *e, const zero_param *p)
{
    uint64_t h = fnv(FNV_OFFSET, p->name, strlen(p->name) + 1);
    const char *mname = e->modules[p->module].name;
    h = fnv(h, mname, strlen(mname) + 1);
    h = fnv_u64(h, (uint64_t)p->ndim);
    for (int d = 0; d < p->ndim; d++) h = fnv_u64(h, (uint64_t)p->shape[d]);
    return h;
}

/* ---------------------------------------------------------------- building */

zero_status plan_build(zero_engine *e)
{
    const uint64_t n = (uint64_t)e->world;
    const uint64_t cap = e->cfg.reduce_bucket_size;
    const uint64_t thr = e->cfg.stage3_param_persistence_threshold;

    /* A finalize that failed its cross-rank check may be retried after the
     * caller fixed nothing or more registrations: start from scratch. */
    free(e->buckets);
    for (int i = 0; i < e->num_modules; i++) {
        zero_module *m = &e->modules[i];
        free(m->bucket_ids);
        m->bucket_ids = NULL;
        m->num_buckets = 0;
        m->grad_numel = m->gather_numel = 0;
    }
    e->buckets = calloc((size_t)e->num_params, sizeof *e->buckets);
    if (!e->buckets) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine finalize: plan allocation failed");

    /* Group consecutive params: a bucket never spans modules, never mixes
     * persistent and sharded params, and holds at most `cap` elements unless
     * one param alone is larger (params are never split, so each param's owned
     * part is one range). */
    int nb = 0;
    uint64_t raw = 0;
    for (int i = 0; i < e->num_params; i++) {
        zero_param *p = &e->params[i];
        p->persistent = p->numel < thr;
        zero_bucket *cur = nb ? &e->buckets[nb - 1] : NULL;
        if (!cur || cur->module != p->module || cur->persistent != p->persistent || raw + p->numel > cap) {
            cur = &e->buckets[nb++];
            cur->module = p->module;
            cur->persistent = p->persistent;
            cur->first_param = i;
            raw = 0;
        }
        p->bucket = nb - 1;
        p->in_bucket = raw;
        raw += p->numel;
        cur->num_params++;
        cur->numel = raw;
    }
    e->num_buckets = nb;

    uint64_t flat = 0, shard = 0, persist = 0, maxb = 0;
    for (int b = 0; b < nb; b++) {
        zero_bucket *k = &e->buckets[b];
        k->numel = (k->numel + n - 1) / n * n;
        k->chunk = k->numel / n;
        k->flat_off = flat;
        k->shard_off = shard;
        flat += k->numel;
        shard += k->chunk;
        if (k->numel > maxb) maxb = k->numel;
        if (k->persistent) {
            k->persist_off = persist;
            persist += k->numel;
        }
        zero_module *m = &e->modules[k->module];
        k->module_off = m->grad_numel;
        m->grad_numel += k->numel;
        if (!k->persistent) {
            k->gather_off = m->gather_numel;
            m->gather_numel += k->numel;
        }
        m->num_buckets++;
    }
    e->padded = flat;
    e->shard = shard;
    e->max_bucket = maxb;
    e->persist_numel = persist;

    for (int i = 0; i < e->num_modules; i++) {
        zero_module *m = &e->modules[i];
        m->bucket_ids = calloc((size_t)(m->num_buckets ? m->num_buckets : 1), sizeof(int));
        if (!m->bucket_ids) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine finalize: plan allocation failed");
        m->num_buckets = 0;
    }
    for (int b = 0; b < nb; b++) {
        zero_module *m = &e->modules[e->buckets[b].module];
        m->bucket_ids[m->num_buckets++] = b;
    }

    /* Each param's owned part: its intersection with chunk `rank` of its bucket. */
    const uint64_t r = (uint64_t)e->rank;
    for (int i = 0; i < e->num_params; i++) {
        zero_param *p = &e->params[i];
        const zero_bucket *k = &e->buckets[p->bucket];
        p->flat_off = k->flat_off + p->in_bucket;
        uint64_t lo = k->chunk * r, hi = k->chunk * (r + 1);
        uint64_t a = p->in_bucket > lo ? p->in_bucket : lo;
        uint64_t z = p->in_bucket + p->numel < hi ? p->in_bucket + p->numel : hi;
        if (a < z) {
            p->own_begin = a - p->in_bucket;
            p->own_end = z - p->in_bucket;
            p->shard_off = k->shard_off + (a - lo);
        } else {
            p->own_begin = p->own_end = 0;
            p->shard_off = k->shard_off;
        }
    }

    uint64_t h = FNV_OFFSET;
    for (int i = 0; i < e->num_params; i++) h = fnv_u64(h, param_hash(e, &e->params[i]));
    h = fnv_u64(h, n);
    h = fnv_u64(h, cap);
    h = fnv_u64(h, thr);
    e->plan_hash = h;
    return ZERO_OK;
}

/* ---------------------------------------------------------------- cross-rank check */

/* Hashes travel as int64 in [0, 2^62) so that negation (MIN as MAX of -x)
 * cannot overflow. */
static int64_t h62(uint64_t h) { return (int64_t)(h >> 2); }

static uint64_t config_hash(const zero_engine *e)
{
    const zero_config *c = &e->cfg;
    uint64_t h = FNV_OFFSET;
    h = fnv_u64(h, (uint64_t)c->stage);
    h = fnv_u64(h, c->reduce_bucket_size);
    h = fnv_u64(h, c->stage3_param_persistence_threshold);
    h = fnv_u64(h, (uint64_t)c->compute_dtype);
    h = fnv_u64(h, (uint64_t)c->optimizer);
    h = fnv_u64(h, (uint64_t)c->gradient_accumulation_steps);
    h = fnv_u64(h, (uint64_t)c->overlap_comm);
    return h;
}

zero_status plan_check_ranks(zero_engine *e)
{
    if (e->world == 1) return ZERO_OK;
    /* Round 1: parameter count and config, as MAX of x and of -x. */
    int64_t head[4] = {e->num_params, -(int64_t)e->num_params, h62(config_hash(e)), -h62(config_hash(e))};
    ZERO_TRY(engine_allreduce_host(e, head, 4, ZERO_I64, ZERO_MAX, "engine finalize: plan check"));
    int64_t pmax = head[0], pmin = -head[1];
    if (head[2] != -head[3])
        return zero_fail(&e->err, ZERO_MISMATCH,
                         "engine finalize: ranks use different engine configs (stage, reduce_bucket_size, "
                         "persistence threshold, compute dtype, optimizer, accumulation or overlap_comm "
                         "differ; rank %d has stage %d, dtype %s)",
                         e->rank, e->cfg.stage, zero_dtype_name(e->cfg.compute_dtype));
    /* Round 2: per-parameter hashes over the common prefix. */
    size_t k = (size_t)pmin;
    int64_t *v = malloc((2 * k + 1) * sizeof *v);
    if (!v) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine finalize: plan check allocation");
    for (size_t i = 0; i < k; i++) {
        v[i] = h62(param_hash(e, &e->params[i]));
        v[k + i] = -v[i];
    }
    zero_status st = k ? engine_allreduce_host(e, v, 2 * k, ZERO_I64, ZERO_MAX, "engine finalize: plan check")
                       : ZERO_OK;
    if (st != ZERO_OK) {
        free(v);
        return st;
    }
    for (size_t i = 0; i < k; i++) {
        if (v[i] != -v[k + i]) {
            const zero_param *p = &e->params[i];
            char shape[128] = "";
            size_t len = 0;
            for (int d = 0; d < p->ndim && len < sizeof shape - 24; d++)
                len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%lld", d ? "x" : "",
                                        (long long)p->shape[d]);
            free(v);
            return zero_fail(&e->err, ZERO_MISMATCH,
                             "engine finalize: ranks registered different parameters: first difference at "
                             "param #%zu (here on rank %d: '%s' of module '%s', shape %s)",
                             i, e->rank, p->name, e->modules[p->module].name, shape);
        }
    }
    free(v);
    if (pmax != pmin) {
        if ((int64_t)e->num_params > pmin)
            return zero_fail(&e->err, ZERO_MISMATCH,
                             "engine finalize: ranks registered different numbers of parameters (%lld to %lld);"
                             " first difference at param #%lld ('%s' exists on rank %d, not on every rank)",
                             (long long)pmin, (long long)pmax, (long long)pmin, e->params[pmin].name, e->rank);
        return zero_fail(&e->err, ZERO_MISMATCH,
                         "engine finalize: ranks registered different numbers of parameters (%lld to %lld);"
                         " first difference at param #%lld (rank %d has only %lld)",
                         (long long)pmin, (long long)pmax, (long long)pmin, e->rank, (long long)pmin);
    }
    return ZERO_OK;
}
