/* Stage equivalence (DESIGN.md invariant 2).
 *
 * For fp32, bf16 and fp16 compute, with and without gradient accumulation,
 * clipping and overlap_comm, AdamW and SGD, with buckets smaller than most
 * parameters (split across buckets): K steps at stages 1, 2 and 3 give
 * bitwise the same fp32 master weights, compute-dtype parameters and
 * gradient norms as stage 0 at this world size. And for fp32, stage 0 at
 * world size N is within 1e-6 relative (||a-b|| / ||b||) of one process that sees every
 * rank's gradients as N times as many micro-steps.
 *
 *   test_engine_equiv [cpu | cuda nccl | cuda staged]   (cuda: skipped without a GPU) */
#include "eng_util.h"

#define STEPS 3

static const eng_variant variants[] = {
    {"f32 adamw", ZERO_F32, 1, 0.0, 0, ZERO_OPTIM_ADAMW, 0},
    {"f32 adamw gas2 clip overlap", ZERO_F32, 2, 0.05, 1, ZERO_OPTIM_ADAMW, 0},
    {"f32 sgd-momentum gas3 overlap", ZERO_F32, 3, 0.0, 1, ZERO_OPTIM_SGD, 0},
    {"bf16 adamw", ZERO_BF16, 1, 0.0, 0, ZERO_OPTIM_ADAMW, 0},
    {"bf16 adamw gas2 clip overlap", ZERO_BF16, 2, 0.05, 1, ZERO_OPTIM_ADAMW, 0},
    {"bf16 sgd clip", ZERO_BF16, 1, 0.02, 0, ZERO_OPTIM_SGD, 0},
    {"f16 adamw gas2 clip overlap (dynamic loss scale)", ZERO_F16, 2, 0.05, 1, ZERO_OPTIM_ADAMW, 0},
    /* tiny buckets: the 2053-element param is split across 30+ buckets,
     * most others across several (bounded buckets, engine.h "the plan") */
    {"f32 adamw gas2 clip overlap, 64-element buckets", ZERO_F32, 2, 0.05, 1, ZERO_OPTIM_ADAMW, 64},
    {"bf16 sgd-momentum clip, 64-element buckets", ZERO_BF16, 1, 0.02, 0, ZERO_OPTIM_SGD, 64},
};

static zero_config make_config(const eng_variant *v, int stage)
{
    zero_config c = eng_variant_config(v, stage);
    c.overlap_comm = stage == 0 ? 0 : v->overlap; /* the reference runs without overlap */
    return c;
}

static eng_outcome run(const zero_config *cfg, zero_comm *comm, zero_device *dev, const eng_run *r)
{
    eng_outcome o = {0};
    zero_engine *e = NULL;
    zero_status st = eng_create_model(&e, cfg, comm, dev);
    if (!e) return o;
    if (st == ZERO_OK) st = eng_run_steps(e, dev, cfg, r, STEPS, &o, NULL);
    if (st != ZERO_OK) {
        char what[64];
        snprintf(what, sizeof what, "stage %d", cfg->stage);
        eng_run_failed(what, st, e);
        return o;
    }
    for (int s = 0; s < STEPS; s++) CHECK(o.step_index[s] == (uint64_t)s + 1 && !o.skipped[s]);
    eng_outcome_collect(e, dev, cfg->compute_dtype, 1, &o);
    zero_engine_destroy(e);
    return o;
}

/* One param large enough that the CPU optimizer splits it across OpenMP
 * threads when stage 0 updates the whole bucket, while a rank's chunk at
 * stage 1 is updated in one piece (world >= 3) or split differently: the
 * same bits either way. */
static void check_thread_split(zero_comm *comm, zero_device *dev)
{
    const int rank = zero_comm_get_rank(comm);
    float *master[2] = {NULL, NULL};
    uint64_t n = 0;
    for (int stage = 0; stage < 2; stage++) {
        zero_config c = make_config(&variants[1], stage);
        zero_engine *e = NULL;
        CHECK_OK(zero_engine_create(&e, &c, comm, dev));
        if (!e) return;
        for (int m = 0; m < ENG_NMODULES; m++) CHECK_OK(zero_engine_add_module(e, eng_module_names[m], NULL));
        int64_t shape[1] = {70001};
        float *init = malloc((size_t)shape[0] * sizeof *init);
        for (int64_t i = 0; i < shape[0]; i++) init[i] = eng_init_value(0, (uint64_t)i);
        CHECK_OK(zero_engine_add_param(e, 0, "big", 1, shape, init, NULL));
        free(init);
        CHECK_OK(zero_engine_finalize(e));
        eng_run r = {{rank}, 1, 0, 0, 0};
        zero_step_result res;
        for (int s = 1; s <= 2; s++) CHECK_OK(eng_train_step(e, dev, &c, &r, s, &res));
        master[stage] = eng_collect_master(e, &n);
        zero_engine_destroy(e);
    }
    long d = eng_first_diff(master[1], master[0], n);
    CHECK_MSG(d < 0, "large param: stage 1 differs from stage 0 at element %ld", d);
    free(master[0]);
    free(master[1]);
}

int main(int argc, char **argv)
{
    const int want_cuda = argc > 1 && !strcmp(argv[1], "cuda");
    if (want_cuda && !zero_cuda_available()) CHECK_SKIP("no CUDA device");
    zero_comm *world;
    zero_device *dev;
    /* one rank: NCCL itself; several ranks on one GPU: STAGED */
    int rc = eng_open(want_cuda, argc > 2 && !strcmp(argv[2], "nccl"), &world, &dev);
    if (rc) return rc;
    const int rank = zero_comm_get_rank(world), n = zero_comm_get_size(world);
    /* A group of one: this rank alone, for the all-data reference. */
    zero_comm *self = NULL;
    if (!want_cuda) CHECK_OK(zero_comm_split(world, rank, 0, &self));

    /* On the asynchronous CPU device (engine_equiv_async_*) the overlap_comm
     * variants are the ones with the most ordering to get wrong; the others
     * would only add seconds. */
    const int async_only_overlap = getenv("ZERO_CPU_ASYNC") && !strcmp(getenv("ZERO_CPU_ASYNC"), "1");
    for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
        const eng_variant *v = &variants[vi];
        if (async_only_overlap && !v->overlap) continue;
        eng_run r = {{rank}, 1, 0, 0, 0};
        eng_outcome o[4];
        for (int stage = 0; stage < 4; stage++) {
            zero_config cfg = make_config(v, stage);
            o[stage] = run(&cfg, world, dev, &r);
        }
        for (int stage = 1; stage < 4 && o[0].ok; stage++) {
            if (!o[stage].ok) continue;
            char what[160];
            snprintf(what, sizeof what, "%s: stage %d vs stage 0", v->name, stage);
            eng_expect_same(what, &o[stage], &o[0]);
        }
        if (o[0].ok) {
            /* the run moved the params, and clipping was active where asked */
            float init0 = eng_init_value(0, 0);
            CHECK_MSG(o[0].master[0] != init0, "%s: parameters did not change", v->name);
            if (v->clip > 0) CHECK_MSG(o[0].clips[0] < 1.0, "%s: clipping never engaged", v->name);
        }
        /* World-size reference: one process sees all ranks' gradients. */
        if (v->dtype == ZERO_F32 && o[0].ok && !want_cuda) {
            zero_config cfg = make_config(v, 0);
            cfg.gradient_accumulation_steps = v->gas * n;
            eng_run all = {{0}, n, 0, 0, 0};
            for (int k = 0; k < n; k++) all.ranks[k] = k;
            eng_outcome ref = run(&cfg, self, dev, &all);
            if (ref.ok) {
                /* Relative as vectors: ||a - b|| / ||b||. (Per element, AdamW
                 * turns a gradient that cancels to ~0 across ranks into an
                 * update of either sign, whatever the summation order.) */
                double diff2 = 0, ref2 = 0, worst = 0;
                for (uint64_t i = 0; i < ref.n; i++) {
                    double a = o[0].master[i], b = ref.master[i];
                    diff2 += (a - b) * (a - b);
                    ref2 += b * b;
                    double el = fabs(a - b) / fmax(fabs(b), 1.0);
                    if (el > worst) worst = el;
                }
                double rel = sqrt(diff2 / ref2);
                CHECK_MSG(rel <= 1e-6, "%s: world %d differs from the all-data reference by %.3g relative", v->name, n,
                          rel);
                for (int s = 0; s < STEPS; s++) CHECK_CLOSE(o[0].norms[s], ref.norms[s], 1e-6);
                if (rank == 0)
                    fprintf(stderr, "%s: world %d vs one process: relative difference %.3g (largest element %.3g)\n",
                            v->name, n, rel, worst);
            }
            eng_outcome_free(&ref);
        }
        for (int stage = 0; stage < 4; stage++) eng_outcome_free(&o[stage]);
    }
    if (!want_cuda) check_thread_split(world, dev);
    zero_comm_destroy(self);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
