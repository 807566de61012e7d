/* Engine lifetime, registration, finalize and the accessors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/handle.h"
#include "device/device_internal.h"
#include "engine_internal.h"

/* ---------------------------------------------------------------- helpers */

zero_status engine_comm_failed(zero_engine *e, zero_status st, const char *what)
{
    char prefix[160];
    snprintf(prefix, sizeof prefix, "%s: ", what);
    zero_status r = zero_fail_forward(&e->err, st, prefix);
    engine_mark_broken(e);
    return r;
}

void engine_mark_broken(zero_engine *e)
{
    if (!e->broken) memcpy(e->fatal, e->err.msg, sizeof e->fatal);
    e->broken = 1;
}

zero_status engine_check_usable(zero_engine *e, const char *what, int need_finalized)
{
    if (!e) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "%s: engine is NULL", what);
    if (e->magic != ZERO_HANDLE_ENGINE)
        return zero_fail(NULL, ZERO_INVALID_STATE, "%s: engine %p %s", what, (void *)e,
                         e->magic == ZERO_HANDLE_DEAD ? "was destroyed by zero_engine_destroy; the handle is stale"
                                                      : "is not a zero_engine");
    if (zero_comm_get_size(e->dp) < 1) /* the comm answers 0 once destroyed */
        return zero_fail(&e->err, ZERO_INVALID_STATE,
                         "%s: the engine's dp comm was destroyed while the engine still uses it (destroy the "
                         "engine first)", what);
    if (e->broken)
        return zero_fail(&e->err, ZERO_INVALID_STATE,
                         "%s: the engine is unusable after an earlier failure of a collective or of "
                         "finalize (destroy it); that failure: %.300s", what, e->fatal);
    if (need_finalized && !e->finalized)
        return zero_fail(&e->err, ZERO_INVALID_STATE, "%s: call zero_engine_finalize first", what);
    if (!need_finalized && e->finalized)
        return zero_fail(&e->err, ZERO_INVALID_STATE, "%s: not allowed after zero_engine_finalize", what);
    return ZERO_OK;
}

void *engine_bucket_grad(zero_engine *e, const zero_bucket *b)
{
    if (e->cfg.stage < 2) return elem_ptr(e, e->grads_full, b->flat_off);
    zero_module *m = &e->modules[b->module];
    return m->grad ? elem_ptr(e, m->grad, b->module_off) : NULL;
}

float *layout_master(zero_engine *e, const zero_bucket *b)
{
    if (e->cfg.stage == 0) return (e->master ? e->master : (float *)e->params_full) + b->flat_off;
    if (e->master) return e->master + b->shard_off;
    if (e->cfg.stage < 3) return (float *)e->params_full + b->flat_off + b->chunk * (uint64_t)e->rank;
    return layout_param_chunk(e, b);
}

float *layout_moment(zero_engine *e, float *mom, const zero_bucket *b)
{
    if (!mom) return NULL;
    return mom + (e->cfg.stage == 0 ? b->flat_off : b->shard_off);
}

uint64_t layout_region_numel(const zero_engine *e, const zero_bucket *b)
{
    return e->cfg.stage == 0 ? b->numel : b->chunk;
}

uint64_t layout_region_flat(const zero_engine *e, const zero_bucket *b)
{
    return e->cfg.stage == 0 ? b->flat_off : b->flat_off + b->chunk * (uint64_t)e->rank;
}

float *layout_chunk_state(zero_engine *e, zero_state_kind kind, const zero_bucket *b, uint64_t in_chunk)
{
    /* The region is the whole bucket at stage 0, this rank's chunk otherwise. */
    uint64_t region_off = e->cfg.stage == 0 ? b->chunk * (uint64_t)e->rank + in_chunk : in_chunk;
    float *base;
    switch (kind) {
    case ZERO_STATE_MASTER: base = layout_master(e, b); break;
    case ZERO_STATE_MOMENT1: base = layout_moment(e, e->m1, b); break;
    case ZERO_STATE_MOMENT2: base = layout_moment(e, e->m2, b); break;
    default: return NULL;
    }
    return base ? base + region_off : NULL;
}

/* ---------------------------------------------------------------- lifetime */

zero_status zero_engine_create(zero_engine **out, const zero_config *config, zero_comm *dp, zero_device *dev)
{
    if (!out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine create: out is NULL");
    *out = NULL;
    if (!dp) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine create: dp comm is NULL");
    if (!dev) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine create: device is NULL");
    if (!config) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine create: config is NULL");
    zero_config cfg; /* the caller's version made whole: later fields at their defaults */
    ZERO_TRY(config_read(config, &cfg, ZERO_CONFIG, "engine create", NULL));
    config = &cfg;
    ZERO_TRY(config_validate(config, NULL));
    if (!config->contiguous_gradients)
        zero_log(ZERO_LOG_WARN, "engine create: contiguous_gradients = 0 has no effect: gradients are always "
                                "written into contiguous buffers (flat at stages 0-1, one per module at 2-3)");

    int is_cuda = zero_device_get_kind(dev) == ZERO_DEVICE_CUDA;
    zero_backend be = zero_comm_get_backend(dp);
    int comm_on_device = be == ZERO_BACKEND_NCCL || be == ZERO_BACKEND_STAGED;
    int comm_on_host = be == ZERO_BACKEND_MPI || be == ZERO_BACKEND_LOCAL;
    if (is_cuda && !comm_on_device)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT,
                         "engine create: a CUDA device needs an NCCL or STAGED dp comm (got backend %d)", (int)be);
    if (is_cuda && config->optimizer_fast)
        return zero_fail(NULL, ZERO_UNSUPPORTED,
                         "engine create: optimizer_fast (optimizer.params.fast) is implemented by the CPU kernels "
                         "only; the CUDA step kernel is exact");
    if (!is_cuda && !comm_on_host)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT,
                         "engine create: the CPU device needs an MPI or LOCAL dp comm (got backend %d)", (int)be);

    zero_engine *e = calloc(1, sizeof *e);
    if (!e) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "engine create: out of memory");
    e->magic = ZERO_HANDLE_ENGINE;
    e->cfg = *config;
    e->cfg.size = sizeof(zero_config);
    e->dp = dp;
    e->dev = dev;
    e->is_cuda = is_cuda;
    e->rank = zero_comm_get_rank(dp);
    e->world = zero_comm_get_size(dp);
    e->dsize = zero_dtype_size(config->compute_dtype);
    e->own_master = config->compute_dtype == ZERO_F32;
    /* ZERO_OPTIM_FUSED=0: the per-bucket optimizer step (the reference the
     * fused one is tested against; docs/engine.md). */
    const char *fused = getenv("ZERO_OPTIM_FUSED");
    e->fused_on = !(fused && !strcmp(fused, "0"));
    /* ZERO_NORM_AT_STEP=1: the norm's sums of squares taken at the step, not
     * as the gradients land (the reference of test_engine_norm; grad_norm.c). */
    const char *norm_at_step = getenv("ZERO_NORM_AT_STEP");
    e->norm_at_landing = !(norm_at_step && !strcmp(norm_at_step, "1"));
    /* ZERO_GRAD_FOLD=0: the reduction's separate copy / cast and zeroing
     * passes (grads.c), for the tests' and benchmarks' A/B. */
    const char *grad_fold = getenv("ZERO_GRAD_FOLD");
    e->grad_fold = zero_take_supported_(dev) && !(grad_fold && !strcmp(grad_fold, "0"));
    /* ZERO_PROGRESS=0: overlap_comm without the progress calls at the entry
     * points (progress.c), the behaviour before them, for the benchmarks'
     * A/B of what they hide. */
    const char *progress = getenv("ZERO_PROGRESS");
    e->progress_on = !(progress && !strcmp(progress, "0"));
    if (config->compute_dtype == ZERO_F16)
        e->loss_scale = config->loss_scale > 0 ? config->loss_scale : ldexp(1.0, config->initial_scale_power);
    else
        e->loss_scale = 1.0;
    e->hysteresis_left = config->hysteresis;
    zero_status st = engine_streams_create(e);
    if (st == ZERO_OK && groups_init(e) != ZERO_OK)
        st = zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine create: out of memory");
    if (st != ZERO_OK) {
        char msg[ZERO_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", e->err.msg);
        groups_free(e);
        engine_streams_destroy(e);
        free(e);
        return zero_fail(NULL, st, "%s", msg);
    }
    *out = e;
    return ZERO_OK;
}

void zero_engine_destroy(zero_engine *e)
{
    if (!e) return;
    if (e->magic != ZERO_HANDLE_ENGINE) { /* destroyed before: the struct is retired, not freed */
        zero_log(ZERO_LOG_WARN, "zero_engine_destroy: engine %p %s; ignored", (void *)e,
                 e->magic == ZERO_HANDLE_DEAD ? "was already destroyed" : "is not a zero_engine");
        return;
    }
    if (!e->broken && zero_comm_get_size(e->dp) >= 1) { /* a destroyed comm answers 0: nothing to flush on it */
        (void)grads_flush(e, "engine destroy");
        (void)gather_drop_prefetches(e, "engine destroy");
    }
    /* Queued device work may still use the buffers freed below. */
    if (!e->broken) (void)engine_sync_stream(e, "engine destroy");
    gather_free_all(e);
    for (int i = 0; i < e->num_modules; i++) {
        zero_module *m = &e->modules[i];
        if (m->grad) engine_transient_put(e, ZERO_MEM_GRADS, m->grad_numel * e->dsize, m->grad);
        m->grad = NULL;
    }
    engine_transient_trim(e);
    free(e->tcache.items);
    free(e->tcache.sizes);
    free(e->tcache.size_class);
    free(e->tcache.classes);
    for (int i = 0; i < e->num_modules; i++) {
        zero_module *m = &e->modules[i];
        free(m->name);
        free(m->bucket_ids);
        free(m->reqs);
    }
    for (int i = 0; i < e->num_params; i++) {
        zero_param *p = &e->params[i];
        engine_host_free(e, ZERO_MEM_OTHER, p->numel * sizeof(float), p->init);
        free(p->name);
    }
    free(e->mp_buf);
    uint64_t S = e->shard, P = e->padded;
    size_t d = e->dsize;
    int st = e->cfg.stage;
    engine_free(e, ZERO_MEM_PARAMS, P * d, e->params_full);
    poff_teardown(e); /* a pool-placed shard is returned with the pool */
    engine_free(e, ZERO_MEM_PARAMS, S * d, e->params_shard);
    engine_free(e, ZERO_MEM_PARAMS, e->persist_numel * d, e->persist);
    engine_free(e, ZERO_MEM_GRADS, P * d, e->grads_full);
    engine_free(e, ZERO_MEM_GRADS, S * 4, e->gacc);
    free(e->gacc_live);
    e->gacc_live = NULL;
    free(e->bucket_norms);
    e->bucket_norms = NULL;
    offload_teardown(e); /* pool-placed master/moments are returned with the pool */
    uint64_t state_numel = st == 0 ? P : S;
    engine_free(e, ZERO_MEM_MASTER, state_numel * 4, e->master);
    engine_free(e, ZERO_MEM_MOMENTS, state_numel * 4, e->m1);
    engine_free(e, ZERO_MEM_MOMENTS, state_numel * 4, e->m2);
    for (int s = 0; s < e->num_slots; s++) {
        engine_free(e, ZERO_MEM_BUFFERS, e->max_bucket * 4, e->slots[s].send);
        engine_free(e, ZERO_MEM_BUFFERS, e->max_bucket / (uint64_t)e->world * 4, e->slots[s].recv);
    }
    optim_fused_free(e);
    groups_free(e);
    free(e->params);
    free(e->modules);
    free(e->buckets);
    free(e->trace);
    free(e->cur);
    engine_streams_destroy(e);
    e->magic = ZERO_HANDLE_DEAD;
    zero_handle_retire(e); /* a second destroy or a stale call is then recognised */
}

const char *zero_engine_last_error(const zero_engine *e)
{
    return e ? e->err.msg : "engine is NULL";
}

/* ---------------------------------------------------------------- registration */

zero_status zero_engine_add_module(zero_engine *e, const char *name, int *module_id)
{
    ZERO_TRY(engine_check_usable(e, "engine add_module", 0));
    if (!name || !*name)
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "engine add_module: name is NULL or empty");
    for (int i = 0; i < e->num_modules; i++)
        if (strcmp(e->modules[i].name, name) == 0)
            return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "engine add_module: module '%s' already exists (id %d)",
                             name, i);
    if (e->num_modules == e->cap_modules) {
        int cap = e->cap_modules ? 2 * e->cap_modules : 16;
        zero_module *m = realloc(e->modules, (size_t)cap * sizeof *m);
        if (!m) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine add_module: out of memory");
        e->modules = m;
        e->cap_modules = cap;
    }
    zero_module *m = &e->modules[e->num_modules];
    memset(m, 0, sizeof *m);
    m->name = strdup(name);
    if (!m->name) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine add_module: out of memory");
    if (module_id) *module_id = e->num_modules;
    e->num_modules++;
    return ZERO_OK;
}

/* The registration both add_param forms share: exactly one of `values`
 * (copied and held until finalize) and `spec` (NULL: zeros) is used. */
static zero_status add_param(zero_engine *e, int module, const char *name, int ndim, const int64_t *shape,
                             const float *values, const zero_init_spec *spec, int *param_id, const char *what)
{
    ZERO_TRY(engine_check_usable(e, what, 0));
    if (module < 0 || module >= e->num_modules)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "%s '%s': unknown module %d (%d modules)", what,
                         name ? name : "(null)", module, e->num_modules);
    if (!name || !*name)
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: name is NULL or empty", what);
    if (ndim < 1 || ndim > ZERO_MAX_DIMS || !shape)
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s '%s': ndim %d not in 1..%d (or shape NULL)", what,
                         name, ndim, ZERO_MAX_DIMS);
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1 || (uint64_t)shape[d] > (UINT64_C(1) << 40) / numel)
            return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s '%s': shape[%d] = %lld is invalid", what, name, d,
                             (long long)shape[d]);
        numel *= (uint64_t)shape[d];
    }
    for (int i = 0; i < e->num_params; i++)
        if (strcmp(e->params[i].name, name) == 0)
            return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: parameter '%s' already exists (id %d)", what, name,
                             i);
    zero_init_spec whole = ZERO_INIT_SPEC_INIT; /* the caller's spec of any version, made whole */
    if (spec) ZERO_TRY(init_spec_check(e, spec, what, name, &whole));
    if (e->num_params == e->cap_params) {
        int cap = e->cap_params ? 2 * e->cap_params : 64;
        zero_param *p = realloc(e->params, (size_t)cap * sizeof *p);
        if (!p) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", what);
        e->params = p;
        e->cap_params = cap;
    }
    zero_param *p = &e->params[e->num_params];
    memset(p, 0, sizeof *p);
    p->name = strdup(name);
    if (!p->name) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", what);
    p->module = module;
    p->ndim = ndim;
    memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
    p->numel = numel;
    p->spec = whole;
    if (values) {
        zero_status st = engine_host_alloc(e, ZERO_MEM_OTHER, numel * sizeof(float), (void **)&p->init);
        if (st != ZERO_OK) {
            free(p->name);
            return st;
        }
        memcpy(p->init, values, numel * sizeof(float));
    }
    e->modules[module].num_params++;
    e->numel += numel;
    if (param_id) *param_id = e->num_params;
    e->num_params++;
    return ZERO_OK;
}

zero_status zero_engine_add_param(zero_engine *e, int module, const char *name, int ndim,
                                  const int64_t *shape, const float *init, int *param_id)
{
    return add_param(e, module, name, ndim, shape, init, NULL, param_id, "engine add_param");
}

zero_status zero_engine_add_param_init(zero_engine *e, int module, const char *name, int ndim,
                                       const int64_t *shape, const zero_init_spec *init, int *param_id)
{
    zero_init_spec zeros = ZERO_INIT_SPEC_INIT;
    return add_param(e, module, name, ndim, shape, NULL, init ? init : &zeros, param_id,
                     "engine add_param_init");
}

/* ---------------------------------------------------------------- finalize */

static zero_status alloc_buffers(zero_engine *e)
{
    const uint64_t P = e->padded, S = e->shard;
    const size_t d = e->dsize;
    const int stage = e->cfg.stage;
    const uint64_t state_numel = stage == 0 ? P : S;
    if (stage < 3) {
        ZERO_TRY(engine_alloc(e, ZERO_MEM_PARAMS, P * d, &e->params_full));
    } else {
        /* An offloaded shard is not device memory: offload_param.c places it. */
        if (e->cfg.offload_param_device != ZERO_OFFLOAD_NONE) ZERO_TRY(poff_setup(e));
        else ZERO_TRY(engine_alloc(e, ZERO_MEM_PARAMS, S * d, &e->params_shard));
        ZERO_TRY(engine_alloc(e, ZERO_MEM_PARAMS, e->persist_numel * d, &e->persist));
    }
    ZERO_TRY(engine_alloc(e, ZERO_MEM_GRADS, S * 4, (void **)&e->gacc));
    e->gacc_live = calloc((size_t)e->num_buckets + 1, 1); /* host bookkeeping, like the plan */
    e->bucket_norms = calloc((size_t)e->num_buckets + 1, sizeof *e->bucket_norms);
    if (!e->gacc_live || !e->bucket_norms) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine finalize: out of memory");
    /* Offloaded master and moments are not device memory: offload_opt.c
     * places them (host pool or NVMe store) and reports them apart. */
    const int offloaded = e->cfg.offload_optimizer_device != ZERO_OFFLOAD_NONE;
    if (!e->own_master && !offloaded)
        ZERO_TRY(engine_alloc(e, ZERO_MEM_MASTER, state_numel * 4, (void **)&e->master));
    int moments = e->cfg.optimizer == ZERO_OPTIM_ADAMW ? 2 : (e->cfg.momentum > 0 ? 1 : 0);
    if (moments >= 1 && !offloaded) ZERO_TRY(engine_alloc(e, ZERO_MEM_MOMENTS, state_numel * 4, (void **)&e->m1));
    if (moments >= 2 && !offloaded) ZERO_TRY(engine_alloc(e, ZERO_MEM_MOMENTS, state_numel * 4, (void **)&e->m2));
    /* Stages 0-1's full gradients after the arrays the optimizer streams
     * through together (params or master, the fp32 gradient, the moments),
     * so those stay next to each other as at stages 2-3: allocated between
     * them, this buffer made the same kernel run 1.1-1.2x slower in the step
     * (zero-bench stepcost, AMD EPYC Zen 3, docs/BENCHMARKS.md). */
    if (stage < 2) ZERO_TRY(engine_alloc(e, ZERO_MEM_GRADS, P * d, &e->grads_full));
    e->num_slots = e->cfg.overlap_comm ? 2 : 1;
    for (int s = 0; s < e->num_slots; s++) {
        ZERO_TRY(engine_alloc(e, ZERO_MEM_BUFFERS, e->max_bucket * 4, (void **)&e->slots[s].send));
        ZERO_TRY(engine_alloc(e, ZERO_MEM_BUFFERS, e->max_bucket / (uint64_t)e->world * 4,
                              (void **)&e->slots[s].recv));
        e->slots[s].bucket = -1;
    }
    return offload_setup(e);
}

/* Write fp32 values of a whole bucket (staged in device memory) into every
 * place this rank keeps them: master, compute-dtype params, persistent copy. */
zero_status layout_load_bucket(zero_engine *e, const zero_bucket *b, const float *full)
{
    const zero_dtype dt = e->cfg.compute_dtype;
    const uint64_t r = (uint64_t)e->rank;
    const float *own = full + b->chunk * r;
    zero_status st = ZERO_OK;
    if (e->master) {
        if (e->cfg.stage == 0) st = engine_memcpy(e, e->master + b->flat_off, full, b->numel * 4);
        else st = engine_memcpy(e, e->master + b->shard_off, own, b->chunk * 4);
    }
    if (e->off_walk) ZERO_TRY(offload_state_io(e, 0, b->shard_off, b->chunk, (float *)own, 1, "engine finalize"));
    if (st == ZERO_OK && e->cfg.stage < 3)
        st = zero_cast(e->dev, full, ZERO_F32, elem_ptr(e, e->params_full, b->flat_off), dt, b->numel, e->stream);
    if (st == ZERO_OK && e->cfg.stage == 3) {
        ZERO_TRY(poff_open(e, b, POFF_WRITE, "engine finalize"));
        st = zero_cast(e->dev, own, ZERO_F32, layout_param_chunk(e, b), dt, b->chunk, e->stream);
        if (st == ZERO_OK && b->persistent)
            st = zero_cast(e->dev, full, ZERO_F32, elem_ptr(e, e->persist, b->persist_off), dt, b->numel, e->stream);
    }
    if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine: loading parameter values: ");
    return ZERO_OK;
}

zero_status zero_engine_finalize(zero_engine *e)
{
    ZERO_TRY(engine_check_usable(e, "engine finalize", 0));
    if (e->num_params == 0)
        return zero_fail(&e->err, ZERO_INVALID_STATE, "engine finalize: no parameters were added");
    ZERO_TRY(plan_build(e));
    ZERO_TRY(plan_check_ranks(e));
    ZERO_TRY(groups_build_runs(e));
    ZERO_TRY(init_check_ranks(e));
    ZERO_TRY(engine_transient_classes(e));
    zero_status st = alloc_buffers(e);
    if (st == ZERO_OK) st = init_load(e);
    if (st == ZERO_OK) st = poff_flush(e, "engine finalize"); /* the last chunk of an offloaded shard */
    if (st == ZERO_OK) st = optim_fused_build(e);
    if (st != ZERO_OK) {
        engine_mark_broken(e); /* partly allocated: only destroy makes sense now */
        return st;
    }
    e->finalized = 1;
    return ZERO_OK;
}

/* ---------------------------------------------------------------- accessors */

static zero_status check_param(zero_engine *e, int param, const char *what)
{
    if (param < 0 || param >= e->num_params)
        return zero_fail(&e->err, ZERO_NOT_FOUND, "%s: unknown parameter %d (%d parameters)", what, param,
                         e->num_params);
    return ZERO_OK;
}

zero_status zero_engine_param_data(zero_engine *e, int param, void **out)
{
    ZERO_TRY(engine_check_usable(e, "engine param_data", 1));
    ZERO_TRY(check_param(e, param, "engine param_data"));
    if (!out) return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "engine param_data: out is NULL");
    *out = NULL;
    const zero_param *p = &e->params[param];
    const zero_bucket *b = &e->buckets[p->first_bucket]; /* a split param continues contiguously */
    if (e->cfg.stage < 3) {
        *out = elem_ptr(e, e->params_full, p->flat_off);
    } else if (b->persistent) {
        *out = elem_ptr(e, e->persist, b->persist_off + p->in_bucket);
    } else {
        zero_module *m = &e->modules[p->module];
        void *base = gather_module_params(m);
        if (!base)
            return zero_fail(&e->err, ZERO_INVALID_STATE,
                             "engine param_data: parameter '%s' of module '%s' is not gathered (stage 3: call "
                             "zero_engine_gather first)", p->name, m->name);
        *out = elem_ptr(e, base, b->gather_off + p->in_bucket);
    }
    return ZERO_OK;
}

zero_status zero_engine_param_grad(zero_engine *e, int param, void **out)
{
    ZERO_TRY(engine_check_usable(e, "engine param_grad", 1));
    engine_progress(e); /* the caller's compute pauses here: advance overlapped collectives */
    ZERO_TRY(check_param(e, param, "engine param_grad"));
    if (!out) return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "engine param_grad: out is NULL");
    *out = NULL;
    const zero_param *p = &e->params[param];
    const zero_bucket *b = &e->buckets[p->first_bucket]; /* a split param continues contiguously */
    if (e->cfg.stage < 2) {
        *out = elem_ptr(e, e->grads_full, p->flat_off);
        return ZERO_OK;
    }
    zero_module *m = &e->modules[p->module];
    if (!m->grad) {
        ZERO_TRY(engine_transient_get(e, ZERO_MEM_GRADS, m->grad_numel * e->dsize, 1, &m->grad));
        ZERO_TRY(engine_hand_to_compute(e, "engine param_grad")); /* zeroed on the engine stream */
    }
    *out = elem_ptr(e, m->grad, b->module_off + p->in_bucket);
    return ZERO_OK;
}

zero_status zero_engine_set_lr(zero_engine *e, double lr)
{
    if (!e) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine set_lr: engine is NULL");
    if (!(lr >= 0) || !isfinite(lr))
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "engine set_lr: lr must be finite and >= 0, got %g", lr);
    e->cfg.lr = lr;
    return ZERO_OK;
}

double zero_engine_get_lr(const zero_engine *e) { return e ? e->cfg.lr : 0.0; }

double zero_engine_get_loss_scale(const zero_engine *e) { return e ? e->loss_scale : 1.0; }

zero_status zero_engine_get_plan_info(const zero_engine *e, zero_plan_info *out)
{
    if (!e || !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine plan_info: NULL argument");
    if (!e->finalized)
        return zero_fail((zero_errbuf *)&e->err, ZERO_INVALID_STATE, "engine plan_info: call zero_engine_finalize first");
    memset(out, 0, sizeof *out);
    out->numel = e->numel;
    out->padded_numel = e->padded;
    out->shard_numel = e->shard;
    out->max_bucket_numel = e->max_bucket;
    out->bucket_capacity = plan_capacity(&e->cfg, e->world);
    out->persistent_numel = e->persist_numel;
    out->hash = e->plan_hash;
    out->num_params = e->num_params;
    out->num_modules = e->num_modules;
    out->num_buckets = e->num_buckets;
    out->dp_size = e->world;
    out->dp_rank = e->rank;
    out->stage = e->cfg.stage;
    out->compute_dtype = e->cfg.compute_dtype;
    return ZERO_OK;
}

int zero_engine_get_num_params(const zero_engine *e) { return e ? e->num_params : 0; }
int zero_engine_get_num_modules(const zero_engine *e) { return e ? e->num_modules : 0; }

const char *zero_engine_get_module_name(const zero_engine *e, int module)
{
    if (!e || module < 0 || module >= e->num_modules) return NULL;
    return e->modules[module].name;
}

zero_status zero_engine_get_param_info(const zero_engine *e, int param, zero_param_info *out)
{
    if (!e || !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine param_info: NULL argument");
    if (param < 0 || param >= e->num_params)
        return zero_fail((zero_errbuf *)&e->err, ZERO_NOT_FOUND, "engine param_info: unknown parameter %d (%d parameters)",
                         param, e->num_params);
    const zero_param *p = &e->params[param];
    memset(out, 0, sizeof *out);
    out->name = p->name;
    out->module = p->module;
    out->ndim = p->ndim;
    memcpy(out->shape, p->shape, sizeof out->shape);
    out->numel = p->numel;
    out->dtype = e->cfg.compute_dtype;
    if (e->finalized) {
        out->bucket = p->first_bucket;
        out->persistent = p->persistent;
        out->owned_begin = p->own_begin;
        out->owned_end = p->own_end;
        out->shard_offset = p->shard_off;
        out->first_bucket = p->first_bucket;
        out->num_buckets = p->num_buckets;
        out->owned_numel = p->own_numel;
        out->num_owned_ranges = p->own_ranges;
    } else {
        out->bucket = out->first_bucket = -1;
    }
    return ZERO_OK;
}

zero_status zero_engine_get_bucket_info(const zero_engine *e, int bucket, zero_bucket_info *out)
{
    if (!e || !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine bucket_info: NULL argument");
    memset(out, 0, sizeof *out);
    if (!e->finalized)
        return zero_fail((zero_errbuf *)&e->err, ZERO_INVALID_STATE, "engine bucket_info: call zero_engine_finalize first");
    if (bucket < 0 || bucket >= e->num_buckets)
        return zero_fail((zero_errbuf *)&e->err, ZERO_NOT_FOUND, "engine bucket_info: unknown bucket %d (%d buckets)",
                         bucket, e->num_buckets);
    const zero_bucket *b = &e->buckets[bucket];
    out->module = b->module;
    out->persistent = b->persistent;
    out->numel = b->numel;
    out->chunk_numel = b->chunk;
    out->shard_offset = b->shard_off;
    return ZERO_OK;
}

zero_status zero_engine_get_param_owned_range(const zero_engine *e, int param, int index, uint64_t *begin,
                                         uint64_t *end)
{
    if (!e || !begin || !end) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine param_owned_range: NULL argument");
    *begin = *end = 0;
    zero_errbuf *err = (zero_errbuf *)&e->err;
    if (!e->finalized)
        return zero_fail(err, ZERO_INVALID_STATE, "engine param_owned_range: call zero_engine_finalize first");
    if (param < 0 || param >= e->num_params)
        return zero_fail(err, ZERO_NOT_FOUND, "engine param_owned_range: unknown parameter %d (%d parameters)", param,
                         e->num_params);
    const zero_param *p = &e->params[param];
    if (index < 0 || index >= p->own_ranges || !plan_owned_range(e, p, index, begin, end))
        return zero_fail(err, ZERO_NOT_FOUND, "engine param_owned_range: parameter '%s' has %d owned range(s) on rank %d, "
                         "no range %d", p->name, p->own_ranges, e->rank, index);
    return ZERO_OK;
}

zero_status zero_engine_find_param(const zero_engine *e, const char *name, int *param)
{
    if (param) *param = -1;
    if (!e || !name || !param) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine find_param: NULL argument");
    for (int i = 0; i < e->num_params; i++)
        if (strcmp(e->params[i].name, name) == 0) {
            *param = i;
            return ZERO_OK;
        }
    return zero_fail((zero_errbuf *)&e->err, ZERO_NOT_FOUND, "engine find_param: no parameter named '%s'", name);
}

/* An all-reduce of a few host values. Host-memory backends take them as
 * they are; device backends (NCCL, STAGED) need device memory, so the values
 * travel through a short-lived device buffer (counted under "other"). */
zero_status engine_allreduce_host(zero_engine *e, void *values, size_t count, zero_dtype dtype, zero_redop op,
                                  const char *what)
{
    zero_status st;
    if (!e->is_cuda) {
        st = zero_allreduce(e->dp, values, values, count, dtype, op);
        return st == ZERO_OK ? ZERO_OK : engine_comm_failed(e, st, what);
    }
    size_t bytes = count * zero_dtype_size(dtype);
    void *dbuf = NULL;
    ZERO_TRY(engine_alloc(e, ZERO_MEM_OTHER, bytes, &dbuf));
    st = engine_memcpy(e, dbuf, values, bytes);
    if (st == ZERO_OK) st = engine_sync_stream(e, what);
    if (st == ZERO_OK) {
        st = zero_allreduce(e->dp, dbuf, dbuf, count, dtype, op);
        if (st != ZERO_OK) st = engine_comm_failed(e, st, what);
        else if ((st = engine_memcpy(e, values, dbuf, bytes)) != ZERO_OK)
            st = zero_fail_forward(&e->err, st, "engine: copying a reduced scalar back: ");
    }
    engine_free(e, ZERO_MEM_OTHER, bytes, dbuf);
    return st;
}
