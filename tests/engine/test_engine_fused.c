/* The fused multi-tensor optimizer step (zero/optim_fused.c) against the
 * per-bucket step it replaced (ZERO_OPTIM_FUSED=0): at stages 0-3, fp32 and
 * bf16 compute, AdamW and SGD with momentum, with three parameter groups
 * (one parameter moved to another group after the first step, so the chunk
 * table is rebuilt), small buckets (tensors split across buckets) and a
 * tensor larger than one chunk of the table (ZERO_OPTIM_CHUNK), K steps give
 * bitwise the same fp32 master weights, moments, compute-dtype parameters
 * and gradient norms (and clip coefficients: eng_util.h's comparison); and
 * stages 0-3 give bitwise the same results as each other, in AdamW's opt-in
 * fast mode (zero_config.optimizer_fast) as in exact mode.
 * Run on the synchronous and the asynchronous CPU device
 * (ZERO_CPU_ASYNC=1, meson test engine_fused_async_*). */
#include "eng_util.h"

#define STEPS 3

typedef struct variant {
    eng_variant v; /* one micro-step, clipping 0.05 */
    int big;       /* add a 40001-element tensor (more than two chunks of the table) */
    int fast;      /* AdamW's opt-in fast mode (zero_config.optimizer_fast) */
} variant;

static const variant variants[] = {
    {{"f32 adamw", ZERO_F32, 1, 0.05, 0, ZERO_OPTIM_ADAMW, ENG_BUCKET}, 0, 0},
    {{"bf16 adamw", ZERO_BF16, 1, 0.05, 0, ZERO_OPTIM_ADAMW, ENG_BUCKET}, 0, 0},
    {{"f32 sgd-momentum, 64-element buckets", ZERO_F32, 1, 0.05, 0, ZERO_OPTIM_SGD, 64}, 0, 0},
    {{"bf16 sgd-momentum, 64-element buckets", ZERO_BF16, 1, 0.05, 0, ZERO_OPTIM_SGD, 64}, 0, 0},
    {{"bf16 adamw, a tensor of 40001 in 60000-element buckets", ZERO_BF16, 1, 0.05, 0, ZERO_OPTIM_ADAMW, 60000}, 1, 0},
    {{"f32 adamw fast", ZERO_F32, 1, 0.05, 0, ZERO_OPTIM_ADAMW, ENG_BUCKET}, 0, 1},
    {{"bf16 adamw fast, 64-element buckets", ZERO_BF16, 1, 0.05, 0, ZERO_OPTIM_ADAMW, 64}, 0, 1},
};

typedef struct outcome {
    eng_outcome b;
    float *mom1, *mom2;
} outcome;

static void outcome_free(outcome *o)
{
    eng_outcome_free(&o->b);
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

/* after step 1: a parameter moved to another group (the chunk table rebuilt) */
static zero_status regroup(zero_engine *e, int step) { return step == 1 ? zero_engine_set_param_group(e, 6, 2) : ZERO_OK; }

static outcome run(const variant *v, int stage, int fused, zero_comm *comm, zero_device *dev, int rank)
{
    outcome o = {0};
    zero_config c = eng_variant_config(&v->v, stage);
    c.allgather_bucket_size = c.reduce_bucket_size;
    c.optimizer_fast = v->fast;
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
    if (st == ZERO_OK) st = eng_run_steps(e, dev, &c, &r, STEPS, &o.b, regroup);
    if (st != ZERO_OK) {
        char what[160];
        snprintf(what, sizeof what, "%s stage %d %s", v->v.name, stage, fused ? "fused" : "per-bucket");
        eng_run_failed(what, st, e);
        return o;
    }
    eng_outcome_collect(e, dev, c.compute_dtype, 1, &o.b);
    o.mom1 = collect_state(e, ZERO_STATE_MOMENT1, o.b.n);
    if (c.optimizer == ZERO_OPTIM_ADAMW) o.mom2 = collect_state(e, ZERO_STATE_MOMENT2, o.b.n);
    zero_engine_destroy(e);
    return o;
}

static void compare(const variant *v, int stage, const outcome *f, const outcome *ref)
{
    char what[160];
    snprintf(what, sizeof what, "%s stage %d, fused vs per-bucket", v->v.name, stage);
    eng_expect_same(what, &f->b, &ref->b);
    long d = eng_first_diff(f->mom1, ref->mom1, ref->b.n);
    CHECK_MSG(d < 0, "%s: moment 1 differs at element %ld", what, d);
    if (ref->mom2) {
        d = eng_first_diff(f->mom2, ref->mom2, ref->b.n);
        CHECK_MSG(d < 0, "%s: moment 2 differs at element %ld", what, d);
    }
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
        outcome s0 = {0};
        for (int stage = 0; stage < 4; stage++) {
            outcome f = run(v, stage, 1, world, dev, rank), ref = run(v, stage, 0, world, dev, rank);
            if (f.b.ok && ref.b.ok) {
                compare(v, stage, &f, &ref);
                CHECK_MSG(f.b.master[0] != eng_init_value(0, 0), "%s stage %d: parameters did not change",
                          v->v.name, stage);
            }
            /* stages 0-3 bitwise identical to each other (in fast mode too) */
            if (stage == 0) {
                s0 = f;
                f = (outcome){0};
            } else if (f.b.ok && s0.b.ok) {
                char what[160];
                snprintf(what, sizeof what, "%s stage %d vs stage 0", v->v.name, stage);
                eng_expect_same(what, &f.b, &s0.b);
            }
            outcome_free(&f);
            outcome_free(&ref);
        }
        outcome_free(&s0);
    }
    if (dev) { /* the fast mode is AdamW's: SGD with it is refused by name */
        zero_config c = ZERO_CONFIG_INIT;
        c.optimizer = ZERO_OPTIM_SGD;
        c.optimizer_fast = 1;
        zero_engine *e = NULL;
        zero_status st = zero_engine_create(&e, &c, world, dev);
        CHECK_MSG(st == ZERO_CONFIG && !e && strstr(zero_last_error(), "optimizer_fast applies to AdamW only"),
                  "%s: %s", zero_status_name(st), zero_last_error());
        zero_engine_destroy(e);
    }
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
