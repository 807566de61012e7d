/* The gradient norm's sums of squares taken as each bucket's last reduction
 * lands (zero/grad_norm.c, the CPU default) against the separate pass at
 * the step (ZERO_NORM_AT_STEP=1, the reference): at stages 0-3, fp32, bf16
 * and fp16 compute, with gradient clipping active (the norm scales the
 * update), 3 steps give bitwise the same gradient norms and fp32 master
 * weights, for: one micro-step; two micro-steps reduced at every
 * grads_ready (the last reduction is an accumulating add) with overlap_comm
 * (the last reduction completes later, at the next bucket or the step);
 * local_accumulation (stages 0-1: only the last grads_ready reduces); small
 * buckets with a parameter marked duplicate; and an fp16 overflow (a skipped
 * step, whose stored sums must not leak into the next one). Then: a
 * parameter marked or unmarked duplicate between its grads_ready and the
 * step is counted as the step finds it (norms sqrt(410) and sqrt(2050),
 * within 1e-12). Variants, run and comparison: eng_util.h's (which also
 * compares the clip coefficients). Run on the synchronous and the asynchronous CPU device
 * (meson test engine_norm_*). */
#include "eng_util.h"

#define STEPS 3

typedef struct variant {
    eng_variant v;  /* clipping 0.05 in all: the norm scales the update */
    int local_acc;
    int duplicate;  /* param 3 marked duplicate */
    int inf_step;   /* step whose grads get an inf on rank 0 (0: none) */
    int max_stage;
} variant;

static const variant variants[] = {
    {{"f32, one micro-step", ZERO_F32, 1, 0.05, 0, ZERO_OPTIM_ADAMW, ENG_BUCKET}, 0, 0, 0, 3},
    {{"f32, two micro-steps, overlap_comm", ZERO_F32, 2, 0.05, 1, ZERO_OPTIM_ADAMW, ENG_BUCKET}, 0, 0, 0, 3},
    {{"bf16, two micro-steps, local_accumulation", ZERO_BF16, 2, 0.05, 0, ZERO_OPTIM_ADAMW, ENG_BUCKET}, 1, 0, 0, 1},
    {{"bf16, 64-element buckets, a duplicate", ZERO_BF16, 1, 0.05, 0, ZERO_OPTIM_ADAMW, 64}, 0, 1, 0, 3},
    {{"fp16, two micro-steps, an overflow at step 2", ZERO_F16, 2, 0.05, 0, ZERO_OPTIM_ADAMW, ENG_BUCKET}, 0, 0, 2, 3},
};

static eng_outcome run(const variant *v, int stage, int at_step, zero_comm *comm, zero_device *dev, int rank)
{
    eng_outcome o = {0};
    zero_config c = eng_variant_config(&v->v, stage);
    c.allgather_bucket_size = c.reduce_bucket_size;
    c.local_accumulation = v->local_acc;
    if (at_step) setenv("ZERO_NORM_AT_STEP", "1", 1);
    else unsetenv("ZERO_NORM_AT_STEP");
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    unsetenv("ZERO_NORM_AT_STEP");
    if (!e) return o;
    zero_status st = eng_register(e, 1);
    if (st == ZERO_OK) st = zero_engine_finalize(e);
    if (st == ZERO_OK && v->duplicate) st = zero_engine_set_param_duplicate(e, 3, 1);
    eng_run r = {{rank}, 1, v->inf_step, 0, 0};
    if (st == ZERO_OK) st = eng_run_steps(e, dev, &c, &r, STEPS, &o, NULL);
    if (st != ZERO_OK) {
        char what[160];
        snprintf(what, sizeof what, "%s stage %d %s", v->v.name, stage, at_step ? "at step" : "at landing");
        eng_run_failed(what, st, e);
        return o;
    }
    eng_outcome_collect(e, dev, c.compute_dtype, 0, &o);
    zero_engine_destroy(e);
    return o;
}

static void compare(const variant *v, int stage, const eng_outcome *got, const eng_outcome *ref)
{
    char what[160];
    snprintf(what, sizeof what, "%s stage %d, norm at landing vs the step-time pass", v->v.name, stage);
    eng_expect_same(what, got, ref);
    /* Not vacuous: the norms are real and clipping applies (0.05 is below them). */
    int finite = 0;
    for (int s = 0; s < STEPS; s++) finite += isfinite(ref->norms[s]) && ref->norms[s] > 0.05;
    CHECK_MSG(finite == STEPS - (v->inf_step ? 1 : 0), "%s: %d finite norms above the clip", what, finite);
    if (v->inf_step) CHECK_MSG(ref->skipped[v->inf_step - 1], "%s: the overflow did not skip", what);
}

/* A duplicate mark changed after the bucket's gradients landed counts as
 * the step finds it: a = 1 and b = 2 on 410 elements each, so the norm is
 * sqrt(410) with b left out and sqrt(2050) with it counted. */
static void test_duplicate_after_landing(zero_comm *comm, zero_device *dev)
{
    for (int stage = 0; stage < 4; stage++) {
        zero_config c = ZERO_CONFIG_INIT;
        c.stage = stage;
        c.reduce_bucket_size = c.allgather_bucket_size = 300; /* b spans buckets */
        c.stage3_param_persistence_threshold = 0;
        zero_engine *e = NULL;
        int mod = -1, pa = -1, pb = -1;
        int64_t shape[1] = {410};
        CHECK_OK(zero_engine_create(&e, &c, comm, dev));
        if (!e) return;
        CHECK_OK(zero_engine_add_module(e, "m", &mod));
        CHECK_OK(zero_engine_add_param(e, mod, "a", 1, shape, NULL, &pa));
        CHECK_OK(zero_engine_add_param(e, mod, "b", 1, shape, NULL, &pb));
        CHECK_OK(zero_engine_finalize(e));
        for (int dup = 1; dup >= 0; dup--) {
            CHECK_OK(zero_engine_set_param_duplicate(e, pb, !dup)); /* the opposite while the grads land */
            CHECK_OK(zero_engine_gather(e, mod));
            float *ga = NULL, *gb = NULL;
            CHECK_OK(zero_engine_param_grad(e, pa, (void **)&ga));
            CHECK_OK(zero_engine_param_grad(e, pb, (void **)&gb));
            CHECK_OK(zero_device_sync(dev)); /* host writes: the engine's zeroing may be queued (async) */
            for (int i = 0; ga && gb && i < 410; i++) ga[i] = 1.0f, gb[i] = 2.0f;
            CHECK_OK(zero_engine_grads_ready(e, mod));
            CHECK_OK(zero_engine_release(e, mod));
            CHECK_OK(zero_engine_set_param_duplicate(e, pb, dup));
            zero_step_result res = {0};
            CHECK_OK(zero_engine_step(e, &res));
            /* every rank adds the same gradients: their average is the same
             * (up to the rounding of sqrt(world^2 * s) / world) */
            const double want = dup ? sqrt(410.0) : sqrt(2050.0);
            CHECK_MSG(fabs(res.grad_norm - want) <= 1e-12 * want, "stage %d, duplicate %d set after grads_ready: norm %.17g, want %.17g",
                      stage, dup, res.grad_norm, want);
        }
        zero_engine_destroy(e);
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
        for (int stage = 0; stage <= v->max_stage; stage++) {
            eng_outcome got = run(v, stage, 0, world, dev, rank), ref = run(v, stage, 1, world, dev, rank);
            if (got.ok && ref.ok) compare(v, stage, &got, &ref);
            eng_outcome_free(&got);
            eng_outcome_free(&ref);
        }
    }
    if (dev) test_duplicate_after_landing(world, dev);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
