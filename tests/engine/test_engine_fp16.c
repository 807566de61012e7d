/* fp16 dynamic loss scaling: an inf injected into one rank's gradients skips
 * the step on every rank, changes no parameter, master weight or moment
 * (bitwise), and halves the scale (hysteresis 1); with hysteresis 2 the
 * first overflow only spends the hysteresis; loss_scale_window good steps
 * double the scale. At every stage. */
#include "eng_util.h"

typedef struct snapshot {
    float *state[3];
    float *params;
} snapshot;

static void take(zero_engine *e, zero_device *dev, snapshot *s)
{
    uint64_t own = 0;
    for (int p = 0; p < ENG_NPARAMS; p++) {
        zero_param_info pi;
        zero_engine_get_param_info(e, p, &pi);
        own += pi.owned_numel;
    }
    for (int k = 0; k < 3; k++) {
        s->state[k] = calloc(own + 1, sizeof(float));
        uint64_t off = 0;
        for (int p = 0; p < ENG_NPARAMS; p++) {
            zero_param_info pi;
            zero_engine_get_param_info(e, p, &pi);
            CHECK_OK(zero_engine_state_get(e, (zero_state_kind)k, p, s->state[k] + off));
            off += pi.owned_numel;
        }
    }
    s->params = eng_collect_params(e, dev, ZERO_F16);
}

static int same(const snapshot *a, const snapshot *b, uint64_t own, uint64_t total)
{
    int ok = !memcmp(a->params, b->params, total * sizeof(float));
    for (int k = 0; k < 3; k++) ok = ok && !memcmp(a->state[k], b->state[k], own * sizeof(float));
    return ok;
}

static void drop(snapshot *s)
{
    for (int k = 0; k < 3; k++) free(s->state[k]);
    free(s->params);
}

static void check_stage(zero_comm *comm, zero_device *dev, int stage)
{
    const int n = zero_comm_get_size(comm), rank = zero_comm_get_rank(comm);
    for (int hyst = 1; hyst <= 2; hyst++) {
        zero_config c = ZERO_CONFIG_INIT;
        c.stage = stage;
        c.compute_dtype = ZERO_F16;
        c.reduce_bucket_size = ENG_BUCKET;
        c.stage3_param_persistence_threshold = ENG_PERSIST;
        c.initial_scale_power = 8;
        c.hysteresis = hyst;
        c.loss_scale_window = 3;
        c.lr = 0.01;
        zero_engine *e = NULL;
        CHECK_OK(zero_engine_create(&e, &c, comm, dev));
        if (!e) return;
        CHECK_OK(eng_register(e, 1));
        CHECK_OK(zero_engine_finalize(e));
        CHECK(zero_engine_get_loss_scale(e) == 256.0);
        uint64_t own = 0, total = 0;
        for (int p = 0; p < ENG_NPARAMS; p++) {
            zero_param_info pi;
            zero_engine_get_param_info(e, p, &pi);
            own += pi.owned_numel;
            total += pi.numel;
        }
        zero_step_result res;
        eng_run run = {{rank}, 1, 0, n - 1, 0};
        CHECK_OK(eng_train_step(e, dev, &c, &run, 1, &res));
        CHECK(!res.skipped && res.step == 1 && res.loss_scale == 256.0);

        /* overflows on the last rank only */
        double scale = 256.0;
        for (int k = 0; k < hyst; k++) {
            snapshot before, after;
            take(e, dev, &before);
            run.inject_inf_step = 2 + k;
            CHECK_OK(eng_train_step(e, dev, &c, &run, 2 + k, &res));
            CHECK_MSG(res.skipped == 1, "stage %d: overflow on rank %d did not skip the step here", stage, n - 1);
            CHECK(!isfinite(res.grad_norm) && res.step == 1 && res.loss_scale == scale);
            take(e, dev, &after);
            CHECK_MSG(same(&before, &after, own, total), "stage %d: a skipped step changed the state", stage);
            drop(&before);
            drop(&after);
            double want = k == hyst - 1 ? scale / 2 : scale;
            CHECK_MSG(res.next_loss_scale == want && zero_engine_get_loss_scale(e) == want,
                      "stage %d hysteresis %d overflow %d: scale %g, expected %g", stage, hyst, k + 1,
                      zero_engine_get_loss_scale(e), want);
            scale = want;
        }
        zero_engine_scalars sc;
        CHECK_OK(zero_engine_get_scalars(e, &sc));
        CHECK(sc.skipped_steps == hyst && sc.step == 1 && sc.good_steps == 0);

        /* good steps update again; the window doubles the scale */
        run.inject_inf_step = 0;
        for (int k = 0; k < 3; k++) {
            CHECK_OK(eng_train_step(e, dev, &c, &run, 10 + k, &res));
            CHECK(!res.skipped && res.step == 2 + k && isfinite(res.grad_norm));
        }
        CHECK_MSG(zero_engine_get_loss_scale(e) == scale * 2, "stage %d: scale %g after a window of good steps, want %g",
                  stage, zero_engine_get_loss_scale(e), scale * 2);
        zero_engine_destroy(e);
    }
}

int main(void)
{
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(0, 0, &world, &dev); /* the world (60 s deadline), this rank for CHECKs, the CPU device */
    if (rc) return rc;
    for (int stage = 0; stage < 4; stage++) check_stage(world, dev, stage);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
