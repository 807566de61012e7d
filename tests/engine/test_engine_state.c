/* Checkpoint accessors: the owned ranges are the same at every stage, so the
 * fp32 state (master, moments) and scalars exported from a stage-0 run after
 * two steps, loaded into a fresh engine of ANY stage (state_set,
 * set_scalars, params_changed), continue training bitwise like the
 * uninterrupted run. Also: the owned ranges of all ranks tile every param
 * exactly once, and read_param assembles them. */
#include "eng_util.h"

#define K1 2
#define K2 2

typedef struct saved {
    float *state[3][ENG_NPARAMS];
    zero_engine_scalars sc;
} saved;

static zero_config cfg_for(int stage, zero_dtype dt)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.compute_dtype = dt;
    c.reduce_bucket_size = ENG_BUCKET;
    c.stage3_param_persistence_threshold = ENG_PERSIST;
    c.lr = 0.01;
    c.gradient_accumulation_steps = 2;
    c.overlap_comm = stage == 2;
    return c;
}

static void save(zero_engine *e, saved *s)
{
    for (int k = 0; k < 3; k++)
        for (int p = 0; p < ENG_NPARAMS; p++) {
            zero_param_info pi;
            CHECK_OK(zero_engine_get_param_info(e, p, &pi));
            s->state[k][p] = calloc(pi.owned_numel + 1, sizeof(float));
            CHECK_OK(zero_engine_state_get(e, (zero_state_kind)k, p, s->state[k][p]));
        }
    CHECK_OK(zero_engine_get_scalars(e, &s->sc));
}

static void load(zero_engine *e, const saved *s)
{
    for (int k = 0; k < 3; k++)
        for (int p = 0; p < ENG_NPARAMS; p++) CHECK_OK(zero_engine_state_set(e, (zero_state_kind)k, p, s->state[k][p]));
    CHECK_OK(zero_engine_set_scalars(e, &s->sc));
    CHECK_OK(zero_engine_params_changed(e));
}

static void run_dtype(zero_comm *comm, zero_device *dev, zero_dtype dt)
{
    const int rank = zero_comm_get_rank(comm), n = zero_comm_get_size(comm);
    eng_run run = {{rank}, 1, 0, 0, 0};
    zero_step_result res;

    /* uninterrupted reference, stage 0, saving after K1 steps */
    zero_config c0 = cfg_for(0, dt);
    zero_engine *a = NULL;
    CHECK_OK(zero_engine_create(&a, &c0, comm, dev));
    if (!a) return;
    CHECK_OK(eng_register(a, 1));
    CHECK_OK(zero_engine_finalize(a));
    for (int s = 1; s <= K1; s++) CHECK_OK(eng_train_step(a, dev, &c0, &run, s, &res));
    saved sv;
    save(a, &sv);
    CHECK(sv.sc.step == K1);

    /* owned ranges tile each param exactly once across ranks (split params,
     * larger than a bucket, have several ranges per rank) */
    for (int p = 0; p < ENG_NPARAMS; p++) {
        zero_param_info pi;
        CHECK_OK(zero_engine_get_param_info(a, p, &pi));
        int32_t *cover = calloc(pi.numel, sizeof *cover), *all = calloc(pi.numel, sizeof *all);
        /* read_param assembles the owners' master parts */
        float *whole = malloc(pi.numel * sizeof *whole);
        CHECK_OK(zero_engine_read_param(a, p, whole));
        uint64_t done = 0, prev_end = 0;
        for (int i = 0; i < pi.num_owned_ranges; i++) {
            uint64_t b, z;
            CHECK_OK(zero_engine_get_param_owned_range(a, p, i, &b, &z));
            CHECK_MSG(b < z && z <= pi.numel && (i == 0 || b > prev_end), "param %d range %d [%llu, %llu)", p, i,
                      (unsigned long long)b, (unsigned long long)z);
            if (!(b < z && z <= pi.numel)) break;
            for (uint64_t j = b; j < z; j++) cover[j]++;
            CHECK(!memcmp(whole + b, sv.state[0][p] + done, (z - b) * sizeof(float)));
            if (i == 0) CHECK(b == pi.owned_begin);
            if (i == pi.num_owned_ranges - 1) CHECK(z == pi.owned_end);
            done += z - b;
            prev_end = z;
        }
        CHECK_MSG(done == pi.owned_numel, "param %d: ranges hold %llu elements, owned_numel %llu", p,
                  (unsigned long long)done, (unsigned long long)pi.owned_numel);
        uint64_t b, z;
        CHECK(zero_engine_get_param_owned_range(a, p, pi.num_owned_ranges, &b, &z) == ZERO_NOT_FOUND);
        CHECK_OK(zero_allreduce(comm, cover, all, pi.numel, ZERO_I32, ZERO_SUM));
        uint64_t bad = 0;
        for (uint64_t j = 0; j < pi.numel; j++) bad += all[j] != 1;
        CHECK_MSG(bad == 0, "param %d: %llu elements are not owned by exactly one rank", p, (unsigned long long)bad);
        free(cover);
        free(all);
        free(whole);
    }

    for (int s = K1 + 1; s <= K1 + K2; s++) CHECK_OK(eng_train_step(a, dev, &c0, &run, s, &res));
    uint64_t total = 0;
    float *want = eng_collect_master(a, &total);
    zero_engine_destroy(a);

    for (int stage = 0; stage < 4; stage++) {
        zero_config c = cfg_for(stage, dt);
        zero_engine *b = NULL;
        CHECK_OK(zero_engine_create(&b, &c, comm, dev));
        if (!b) continue;
        /* registered without init values: everything comes from the checkpoint */
        for (int m = 0; m < ENG_NMODULES; m++) CHECK_OK(zero_engine_add_module(b, eng_module_names[m], NULL));
        for (int p = 0; p < ENG_NPARAMS; p++) {
            char name[64];
            snprintf(name, sizeof name, "%s.p%d", eng_module_names[eng_model[p].module], p);
            CHECK_OK(zero_engine_add_param(b, eng_model[p].module, name, eng_model[p].ndim, eng_model[p].shape, NULL,
                                           NULL));
        }
        CHECK_OK(zero_engine_finalize(b));
        load(b, &sv);
        for (int s = K1 + 1; s <= K1 + K2; s++) CHECK_OK(eng_train_step(b, dev, &c, &run, s, &res));
        CHECK(res.step == K1 + K2);
        uint64_t tb = 0;
        float *got = eng_collect_master(b, &tb);
        long d = tb == total ? eng_first_diff(got, want, total) : 0;
        CHECK_MSG(d < 0, "%s: resumed at stage %d (world %d) differs from the uninterrupted run at element %ld",
                  zero_dtype_name(dt), stage, n, d);
        free(got);
        zero_engine_destroy(b);
    }
    free(want);
    for (int k = 0; k < 3; k++)
        for (int p = 0; p < ENG_NPARAMS; p++) free(sv.state[k][p]);
}

int main(void)
{
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(0, 0, &world, &dev); /* the world (60 s deadline), this rank for CHECKs, the CPU device */
    if (rc) return rc;
    run_dtype(world, dev, ZERO_F32);
    run_dtype(world, dev, ZERO_BF16);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
