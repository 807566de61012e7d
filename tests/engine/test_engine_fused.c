/* The fused multi-tensor optimizer step (zero/optim_fused.c) against the
 * per-bucket step it replaced (ZERO_OPTIM_FUSED=0): at stages 0-3, fp32 and
 * bf16 compute, AdamW and SGD with momentum, with three parameter groups
 * (one parameter moved to another group after the first step, so the chunk
 * table is rebuilt), small buckets (tensors split across buckets) and a
 * tensor larger than one chunk of the table (ZERO_OPTIM_CHUNK), K steps give
 * bitwise the same fp32 master weights, moments, compute-dtype parameters
 * and gradient norms. Run on the synchronous and the asynchronous CPU device
 * (ZERO_CPU_ASYNC=1, meson test engine_fused_async_*). */
#include "eng_util.h"

#define STEPS 3

typedef struct variant {
    const char *name;
    zero_dtype dtype;
    zero_optimizer_kind opt;
    uint64_t bucket;
    int big; /* add a 40001-element tensor (more than two chunks of the table) */
} variant;

static const variant variants[] = {
    {"f32 adamw", ZERO_F32, ZERO_OPTIM_ADAMW, ENG_BUCKET, 0},
    {"bf16 adamw", ZERO_BF16, ZERO_OPTIM_ADAMW, ENG_BUCKET, 0},
    {"f32 sgd-momentum, 64-element buckets", ZERO_F32, ZERO_OPTIM_SGD, 64, 0},
    {"bf16 sgd-momentum, 64-element buckets", ZERO_BF16, ZERO_OPTIM_SGD, 64, 0},
    {"bf16 adamw, a tensor of 40001 in 60000-element buckets", ZERO_BF16, ZERO_OPTIM_ADAMW, 60000, 1},
};

typedef struct outcome {
    float *master, *params, *mom1, *mom2;
    uint64_t n;
    double norms[STEPS];
    int ok;
} outcome;

static void outcome_free(outcome *o)
{
    free(o->master);
    free(o->params);
    free(o->mom1);
    free(o->mom2);
}

static zero_status setup_groups(zero_engine *e)
{
    zero_group_hparams slow = ZERO_GROUP_HPARAMS_INIT, fast = ZERO_GROUP_HPARAMS_INIT;
    slow.lr_scale = 0.5;
    slow.weight_decay = 0.0;
    fast.lr_scale = 2.0;
    fast.beta2 = 0.99;
    fast.eps = 1e-6;
    int g1 = -1, g2 = -1;
    zero_status st = zero_engine_add_group(e, "slow", &slow, &g1);
    if (st == ZERO_OK) st = zero_engine_add_group(e, "fast", &fast, &g2);
    /* runs of one group: params 0-4 default, then alternating slow/fast/default */
    for (int p = 5; st == ZERO_OK && p < zero_engine_get_num_params(e); p++)
        st = zero_engine_set_param_group(e, p, p % 3 == 0 ? 0 : p % 3 == 1 ? g1 : g2);
    return st;
}

static float *collect_state(zero_engine *e, zero_state_kind kind, uint64_t n)
{
    float *all = calloc(n ? n : 1, sizeof *all);
    uint64_t off = 0;
    for (int p = 0; p < zero_engine_get_num_params(e); p++) {
        zero_param_info pi;
        zero_engine_get_param_info(e, p, &pi);
        CHECK_OK(zero_engine_state_get(e, kind, p, all + off));
        off += pi.numel;
    }
    return all;
}

static outcome run(const variant *v, int stage, int fused, zero_comm *comm, zero_device *dev, int rank)
{
    outcome o = {0};
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.reduce_bucket_size = v->bucket;
    c.allgather_bucket_size = v->bucket;
    c.stage3_param_persistence_threshold = ENG_PERSIST;
    c.compute_dtype = v->dtype;
    c.optimizer = v->opt;
    c.lr = 0.01;
    c.momentum = 0.9;
    c.weight_decay = 0.01;
    c.gradient_clipping = 0.05;
    if (fused) unsetenv("ZERO_OPTIM_FUSED");
    else setenv("ZERO_OPTIM_FUSED", "0", 1);
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    unsetenv("ZERO_OPTIM_FUSED");
    if (!e) return o;
    zero_status st = eng_register(e, 1);
    if (st == ZERO_OK && v->big) {
        int64_t shape[1] = {40001};
        float *init = malloc((size_t)shape[0] * sizeof *init);
        for (int64_t i = 0; i < shape[0]; i++) init[i] = eng_init_value(99, (uint64_t)i);
        st = zero_engine_add_param(e, 3, "big", 1, shape, init, NULL);
        free(init);
    }
    if (st == ZERO_OK) st = zero_engine_finalize(e);
    if (st == ZERO_OK) st = setup_groups(e);
    eng_run r = {{rank}, 1, 0, 0, 0};
    for (int s = 1; st == ZERO_OK && s <= STEPS; s++) {
        zero_step_result res;
        st = eng_train_step(e, dev, &c, &r, s, &res);
        o.norms[s - 1] = res.grad_norm;
        if (st == ZERO_OK && s == 1) st = zero_engine_set_param_group(e, 6, 2); /* a rebuilt table */
    }
    if (st != ZERO_OK) {
        CHECK_MSG(0, "%s stage %d %s: %s: %s", v->name, stage, fused ? "fused" : "per-bucket", zero_status_name(st),
                  zero_engine_last_error(e));
        zero_engine_destroy(e);
        return o;
    }
    o.master = eng_collect_master(e, &o.n);
    o.params = eng_collect_params(e, dev, v->dtype);
    o.mom1 = collect_state(e, ZERO_STATE_MOMENT1, o.n);
    if (v->opt == ZERO_OPTIM_ADAMW) o.mom2 = collect_state(e, ZERO_STATE_MOMENT2, o.n);
    o.ok = 1;
    zero_engine_destroy(e);
    return o;
}

static void compare(const variant *v, int stage, const outcome *f, const outcome *ref)
{
    long d = eng_first_diff(f->master, ref->master, ref->n);
    CHECK_MSG(d < 0, "%s stage %d: fused master differs at element %ld: %.9g vs %.9g", v->name, stage, d,
              d < 0 ? 0.0 : f->master[d], d < 0 ? 0.0 : ref->master[d]);
    d = eng_first_diff(f->params, ref->params, ref->n);
    CHECK_MSG(d < 0, "%s stage %d: fused params differ at element %ld", v->name, stage, d);
    d = eng_first_diff(f->mom1, ref->mom1, ref->n);
    CHECK_MSG(d < 0, "%s stage %d: fused moment 1 differs at element %ld", v->name, stage, d);
    if (ref->mom2) {
        d = eng_first_diff(f->mom2, ref->mom2, ref->n);
        CHECK_MSG(d < 0, "%s stage %d: fused moment 2 differs at element %ld", v->name, stage, d);
    }
    CHECK_MSG(!memcmp(f->norms, ref->norms, sizeof f->norms), "%s stage %d: grad norms differ", v->name, stage);
}

int main(void)
{
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(0, 0, &world, &dev);
    if (rc) return rc;
    const int rank = zero_comm_get_rank(world);
    for (size_t vi = 0; dev && vi < sizeof variants / sizeof variants[0]; vi++) {
        const variant *v = &variants[vi];
        for (int stage = 0; stage < 4; stage++) {
            outcome f = run(v, stage, 1, world, dev, rank), ref = run(v, stage, 0, world, dev, rank);
            if (f.ok && ref.ok) {
                compare(v, stage, &f, &ref);
                CHECK_MSG(f.master[0] != eng_init_value(0, 0), "%s stage %d: parameters did not change", v->name,
                          stage);
            }
            outcome_free(&f);
            outcome_free(&ref);
        }
    }
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
