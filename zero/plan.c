/* The partition plan: a pure function of (parameters in registration order,
 * dp size, bucket capacity, persistence threshold), computed identically on
 * every rank, then compared across ranks. The bucket capacity is
 * min(reduce_bucket_size, allgather_bucket_size) rounded down to a multiple
 * of the dp size (at least the dp size): every reduce-scatter and every
 * all-gather the engine issues is one bucket, so both limits hold. */
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

uint64_t plan_capacity(const zero_config *c, int world)
{
    const uint64_t n = (uint64_t)world;
    uint64_t cap = c->reduce_bucket_size < c->allgather_bucket_size ? c->reduce_bucket_size : c->allgather_bucket_size;
    cap = cap / n * n;
    return cap ? cap : n;
}

/* Append a new, empty bucket of `module` / `persistent` starting at param i. */
static zero_bucket *open_bucket(zero_engine *e, int *cap_buckets, int module, int persistent, int first_param)
{
    if (e->num_buckets == *cap_buckets) {
        int nc = *cap_buckets ? 2 * *cap_buckets : 64;
        zero_bucket *b = realloc(e->buckets, (size_t)nc * sizeof *b);
        if (!b) return NULL;
        e->buckets = b;
        *cap_buckets = nc;
    }
    zero_bucket *k = &e->buckets[e->num_buckets++];
    memset(k, 0, sizeof *k);
    k->module = module;
    k->persistent = persistent;
    k->first_param = first_param;
    return k;
}

int plan_piece(const zero_engine *e, const zero_param *p, const zero_bucket *b, uint64_t *lo, uint64_t *hi,
               uint64_t *at)
{
    (void)e;
    const uint64_t pa = p->flat_off, pz = p->flat_off + p->numel;
    const uint64_t ba = b->flat_off, bz = b->flat_off + b->numel;
    const uint64_t a = pa > ba ? pa : ba, z = pz < bz ? pz : bz;
    if (a >= z) return 0;
    *lo = a - pa;
    *hi = z - pa;
    *at = a - ba;
    return 1;
}

int plan_owned_piece(const zero_engine *e, const zero_param *p, const zero_bucket *b, uint64_t *lo, uint64_t *hi,
                     uint64_t *in_chunk)
{
    const uint64_t pa = p->flat_off, pz = p->flat_off + p->numel;
    const uint64_t ca = b->flat_off + b->chunk * (uint64_t)e->rank, cz = ca + b->chunk;
    const uint64_t a = pa > ca ? pa : ca, z = pz < cz ? pz : cz;
    if (a >= z) return 0;
    *lo = a - pa;
    *hi = z - pa;
    *in_chunk = a - ca;
    return 1;
}

int plan_owned_range(const zero_engine *e, const zero_param *p, int index, uint64_t *begin, uint64_t *end)
{
    int found = -1;
    for (int k = p->first_bucket; k < p->first_bucket + p->num_buckets; k++) {
        uint64_t lo, hi, in_chunk;
        if (!plan_owned_piece(e, p, &e->buckets[k], &lo, &hi, &in_chunk)) continue;
        if (found >= 0 && lo == *end) { /* adjacent (world size 1): one range */
            *end = hi;
            continue;
        }
        if (found == index) return 1;
        found++;
        *begin = lo;
        *end = hi;
    }
    return found == index;
}

zero_status plan_build(zero_engine *e)
{
    const uint64_t n = (uint64_t)e->world;
    const uint64_t cap = plan_capacity(&e->cfg, e->world);
    const uint64_t thr = e->cfg.stage3_param_persistence_threshold;

    /* A finalize that failed its cross-rank check may be retried after the
     * caller fixed nothing or more registrations: start from scratch. */
    free(e->buckets);
    e->buckets = NULL;
    e->num_buckets = 0;
    for (int i = 0; i < e->num_modules; i++) {
        zero_module *m = &e->modules[i];
        free(m->bucket_ids);
        m->bucket_ids = NULL;
        m->num_buckets = 0;
        m->grad_numel = m->gather_numel = 0;
    }

    /* Group consecutive params into buckets of at most `cap` elements. A
     * bucket never spans modules nor mixes persistent and sharded params. A
     * param that fits starts a new bucket when it does not fit the current
     * one (so it is never split); a param larger than `cap` fills the
     * current bucket and then as many new ones as it needs: every bucket it
     * leaves is exactly `cap` elements (a multiple of the dp size, no
     * padding), so its elements stay contiguous in every layout. */
    int cap_buckets = 0;
    uint64_t raw = 0; /* elements in the current (last) bucket */
    for (int i = 0; i < e->num_params; i++) {
        zero_param *p = &e->params[i];
        p->persistent = p->numel < thr;
        zero_bucket *cur = e->num_buckets ? &e->buckets[e->num_buckets - 1] : NULL;
        if (!cur || cur->module != p->module || cur->persistent != p->persistent || raw == cap ||
            (p->numel <= cap && raw + p->numel > cap)) {
            if (!(cur = open_bucket(e, &cap_buckets, p->module, p->persistent, i))) goto oom;
            raw = 0;
        }
        p->first_bucket = e->num_buckets - 1;
        p->num_buckets = 1;
        p->in_bucket = raw;
        cur->num_params++;
        uint64_t left = p->numel;
        for (;;) {
            uint64_t take = left < cap - raw ? left : cap - raw;
            raw += take;
            left -= take;
            cur->numel = raw;
            if (!left) break;
            if (!(cur = open_bucket(e, &cap_buckets, p->module, p->persistent, i))) goto oom;
            cur->num_params = 1;
            raw = 0;
            p->num_buckets++;
        }
    }
    const int nb = e->num_buckets;

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
        if (!m->bucket_ids) goto oom;
        m->num_buckets = 0;
    }
    for (int b = 0; b < nb; b++) {
        zero_module *m = &e->modules[e->buckets[b].module];
        m->bucket_ids[m->num_buckets++] = b;
    }

    /* Each param's owned part: its intersection with chunk `rank` of each of
     * its buckets. Those pieces follow one another in the shard (chunk
     * `rank` of consecutive buckets is consecutive there, and a split param
     * covers every bucket it leaves to the end). */
    for (int i = 0; i < e->num_params; i++) {
        zero_param *p = &e->params[i];
        p->flat_off = e->buckets[p->first_bucket].flat_off + p->in_bucket;
        p->own_begin = p->own_end = p->own_numel = 0;
        p->own_ranges = 0;
        p->shard_off = e->buckets[p->first_bucket].shard_off;
        int first = 1;
        for (int k = p->first_bucket; k < p->first_bucket + p->num_buckets; k++) {
            const zero_bucket *b = &e->buckets[k];
            uint64_t lo, hi, in_chunk;
            if (!plan_owned_piece(e, p, b, &lo, &hi, &in_chunk)) continue;
            if (first) {
                p->own_begin = lo;
                p->shard_off = b->shard_off + in_chunk;
                p->own_ranges = 1;
            } else if (lo != p->own_end) {
                p->own_ranges++;
            }
            first = 0;
            p->own_end = hi;
            p->own_numel += hi - lo;
        }
    }

    uint64_t h = FNV_OFFSET;
    for (int i = 0; i < e->num_params; i++) h = fnv_u64(h, param_hash(e, &e->params[i]));
    h = fnv_u64(h, n);
    h = fnv_u64(h, cap);
    h = fnv_u64(h, thr);
    e->plan_hash = h;
    return ZERO_OK;
oom:
    return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine finalize: plan allocation failed");
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
    h = fnv_u64(h, c->allgather_bucket_size);
    h = fnv_u64(h, c->stage3_param_persistence_threshold);
    h = fnv_u64(h, (uint64_t)c->compute_dtype);
    h = fnv_u64(h, (uint64_t)c->optimizer);
    h = fnv_u64(h, (uint64_t)c->gradient_accumulation_steps);
    h = fnv_u64(h, (uint64_t)c->overlap_comm);
    h = fnv_u64(h, (uint64_t)c->local_accumulation);
    if (c->optimizer_fast) h = fnv_u64(h, 0x66617374u); /* so a plan hash without it stays as it was */
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
                         "allgather_bucket_size, persistence threshold, compute dtype, optimizer, accumulation, "
                         "local_accumulation or overlap_comm differ; rank %d has stage %d, dtype %s)",
                         e->rank, e->cfg.stage, zero_dtype_name(e->cfg.compute_dtype));
    /* Round 2: per-parameter hashes over the common prefix. */
    size_t k = (size_t)pmin;
    int64_t *v = malloc((2 * k + 1) * sizeof *v);
    if (!v) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine finalize: plan check allocation");
    for (size_t i = 0; i < k; i++) {
        /* the group is part of the registration (a parameter in another
         * group on another rank would be updated differently); group 0
         * leaves the hash as it was before groups existed */
        uint64_t h = param_hash(e, &e->params[i]);
        if (e->params[i].group) h = fnv_u64(h, (uint64_t)e->params[i].group);
        v[i] = h62(h);
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
                             "param #%zu (here on rank %d: '%s' of module '%s', shape %s, group %d)",
                             i, e->rank, p->name, e->modules[p->module].name, shape, p->group);
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
