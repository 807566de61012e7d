/* local_accumulation (engine.h config): at stages 0-1 the micro-steps'
 * gradients are summed in the compute-dtype buffer by the trainer's += and
 * reduced once, at each module's last grads_ready before step().
 *   - traffic: one step of gradient_accumulation_steps = 3 issues one
 *     reduce-scatter per bucket (the comm counters: calls = buckets, bytes =
 *     one reduction of the padded total), against 3 per bucket without it;
 *   - stages 0 and 1 stay bitwise identical to each other (f32, bf16;
 *     clipping; overlap_comm at stage 1);
 *   - with gradient_accumulation_steps = 1 it is bitwise the default mode;
 *   - with 3 micro-steps (f32) it is the same training as the default mode
 *     up to summation order: within 1e-6 relative (||a-b|| / ||b||);
 *   - stages 2-3 refuse it with ZERO_CONFIG naming the key; the JSON key
 *     zero_optimization.local_accumulation sets it. */
#include "eng_util.h"

#define STEPS 3

static zero_config make(int stage, zero_dtype dt, int gas, int local)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.compute_dtype = dt;
    c.reduce_bucket_size = ENG_BUCKET;
    c.stage3_param_persistence_threshold = ENG_PERSIST;
    c.gradient_accumulation_steps = gas;
    c.local_accumulation = local;
    c.gradient_clipping = 0.05;
    c.overlap_comm = stage == 1;
    c.lr = 0.01;
    return c;
}

/* STEPS steps of the synthetic model (eng_util.h): master weights, params, each step's gradient norm. */
static eng_outcome train(const zero_config *c, zero_comm *comm, zero_device *dev)
{
    eng_outcome o = {0};
    zero_engine *e = NULL;
    zero_status st = eng_create_model(&e, c, comm, dev);
    if (!e) return o;
    CHECK_OK(st);
    eng_run run = {{zero_comm_get_rank(comm)}, 1, 0, 0, 0};
    CHECK_OK(eng_run_steps(e, dev, c, &run, STEPS, &o, NULL));
    eng_outcome_collect(e, dev, c->compute_dtype, 1, &o);
    zero_engine_destroy(e);
    return o;
}

static void check_same(const eng_outcome *a, const eng_outcome *b, const char *what)
{
    if (!a->master || !b->master) return;
    long d = eng_first_diff(a->master, b->master, a->n);
    CHECK_MSG(d < 0, "%s: master differs at element %ld", what, d);
    d = eng_first_diff(a->params, b->params, a->n);
    CHECK_MSG(d < 0, "%s: params differ at element %ld", what, d);
    CHECK_MSG(!memcmp(a->norms, b->norms, sizeof a->norms), "%s: grad norms differ", what);
}

/* One step with 3 micro-steps: reduce-scatters per bucket, from the counters. */
static void check_traffic(zero_comm *comm, zero_device *dev)
{
    const int n = zero_comm_get_size(comm), rank = zero_comm_get_rank(comm);
    for (int local = 0; local < 2; local++) {
        zero_config c = make(1, ZERO_F32, 3, local);
        zero_engine *e = NULL;
        CHECK_OK(zero_engine_create(&e, &c, comm, dev));
        if (!e) return;
        CHECK_OK(eng_register(e, 1));
        CHECK_OK(zero_engine_finalize(e));
        zero_plan_info plan;
        CHECK_OK(zero_engine_get_plan_info(e, &plan));
        eng_run run = {{rank}, 1, 0, 0, 0};
        zero_comm_counters k;
        eng_step_counted(e, dev, &c, &run, 1, comm, &k);
        zero_engine_stats st;
        CHECK_OK(zero_engine_get_stats(e, &st));
        const uint64_t reductions = local ? 1 : 3, B = (uint64_t)plan.num_buckets;
        const uint64_t bytes = reductions * (plan.padded_numel * (uint64_t)(n - 1) / (uint64_t)n * 4);
        /* over one rank a reduction is a local pass, not a collective (grads.c) */
        CHECK_MSG(k.calls[ZERO_OP_REDUCE_SCATTER] == (n > 1 ? reductions * B : 0) && st.reduce_scatters == reductions * B,
                  "local %d: %llu reduce-scatters for %llu buckets", local,
                  (unsigned long long)k.calls[ZERO_OP_REDUCE_SCATTER], (unsigned long long)B);
        CHECK_MSG(k.bytes_sent[ZERO_OP_REDUCE_SCATTER] == bytes && k.bytes_recv[ZERO_OP_REDUCE_SCATTER] == bytes,
                  "local %d: reduce-scatter sent %llu bytes, want %llu", local,
                  (unsigned long long)k.bytes_sent[ZERO_OP_REDUCE_SCATTER], (unsigned long long)bytes);
        zero_engine_destroy(e);
    }
}

static void check_config(zero_comm *comm, zero_device *dev)
{
    for (int stage = 2; stage < 4; stage++) {
        zero_config c = make(stage, ZERO_F32, 2, 1);
        zero_engine *e = NULL;
        zero_status st = zero_engine_create(&e, &c, comm, dev);
        CHECK_MSG(st == ZERO_CONFIG && !e && strstr(zero_last_error(), "local_accumulation"),
                  "stage %d: %s: %s", stage, zero_status_name(st), zero_last_error());
        zero_engine_destroy(e);
    }
    zero_config c = ZERO_CONFIG_INIT;
    CHECK_OK(zero_config_from_json(&c, "{\"zero_optimization\": {\"stage\": 1, \"local_accumulation\": true}}"));
    CHECK(c.local_accumulation == 1 && c.stage == 1);
    CHECK(zero_config_from_json(&c, "{\"zero_optimization\": {\"local_accumulation\": 2}}") == ZERO_CONFIG);
}

int main(void)
{
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(0, 0, &world, &dev); /* the world (60 s deadline), this rank for CHECKs, the CPU device */
    if (rc) return rc;
    check_traffic(world, dev);
    check_config(world, dev);

    const zero_dtype dts[] = {ZERO_F32, ZERO_BF16};
    for (int di = 0; di < 2; di++) {
        char what[96];
        /* stages 0 and 1 identical in the local mode */
        zero_config c0 = make(0, dts[di], 3, 1), c1 = make(1, dts[di], 3, 1);
        eng_outcome o0 = train(&c0, world, dev), o1 = train(&c1, world, dev);
        snprintf(what, sizeof what, "%s gas 3 local: stage 1 vs stage 0", zero_dtype_name(dts[di]));
        check_same(&o1, &o0, what);
        /* against the default mode */
        zero_config d0 = make(0, dts[di], 3, 0);
        eng_outcome r = train(&d0, world, dev);
        if (dts[di] == ZERO_F32 && r.master && o0.master) {
            double diff2 = 0, ref2 = 0;
            for (uint64_t i = 0; i < r.n; i++) {
                double a = o0.master[i], b = r.master[i];
                diff2 += (a - b) * (a - b);
                ref2 += b * b;
            }
            double rel = sqrt(diff2 / ref2);
            CHECK_MSG(rel <= 1e-6, "f32 gas 3: local accumulation differs from per-micro-step reduction by %.3g", rel);
            if (zero_comm_get_rank(world) == 0)
                fprintf(stderr, "f32 gas 3, world %d: local vs per-micro-step reduction: relative difference %.3g\n",
                        zero_comm_get_size(world), rel);
            for (int s = 0; s < STEPS; s++) CHECK_CLOSE(o0.norms[s], r.norms[s], 1e-6);
        }
        eng_outcome_free(&r);
        eng_outcome_free(&o0);
        eng_outcome_free(&o1);
        /* one micro-step: nothing to accumulate, the same bits as the default */
        for (int stage = 0; stage < 2; stage++) {
            zero_config l = make(stage, dts[di], 1, 1), d = make(stage, dts[di], 1, 0);
            eng_outcome a = train(&l, world, dev), b = train(&d, world, dev);
            snprintf(what, sizeof what, "%s gas 1 stage %d: local vs default", zero_dtype_name(dts[di]), stage);
            check_same(&a, &b, what);
            eng_outcome_free(&a);
            eng_outcome_free(&b);
        }
    }
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
