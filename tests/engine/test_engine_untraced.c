/* Untraced forwards (zero_engine_set_untraced): eval and generation
 * forwards at stage 3 with overlap_comm, between steps (an eval pass in
 * reverse module order; a generation pattern gathering every module at
 * once) and mid-step (right after the first traced gather, while the
 * prefetcher has all-gathers in flight), against the same training without
 * them:
 *   - the untraced gathers see the current parameters (= read_param);
 *   - the engine stats (gathers, prefetches, hits, drops, order changes,
 *     peaks) are EQUAL: the recorded order and the prefetcher are untouched;
 *   - no warning is logged;
 *   - the trained parameters are bitwise equal;
 *   - misuse is named: release of a module not gathered untraced, leaving
 *     the mode with a module still gathered, step() in the mode. */
#include "eng_util.h"

#define STEPS 4

static int warnings;
static void on_log(zero_log_level level, const char *msg, void *user)
{
    (void)msg;
    (void)user;
    if (level <= ZERO_LOG_WARN) warnings++;
}

static zero_config make(void)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = 3;
    c.overlap_comm = 1;
    c.reduce_bucket_size = ENG_BUCKET;
    c.stage3_param_persistence_threshold = ENG_PERSIST;
    c.stage3_prefetch_bucket_size = 1500;
    c.stage3_max_live_parameters = 3000;
    c.lr = 0.01;
    return c;
}

/* Every parameter of module m, as the untraced gather shows it, equals
 * read_param (collective: every rank runs the same sequence). */
static zero_status check_module(zero_engine *e, int m)
{
    for (int p = 0; p < zero_engine_num_params(e); p++) {
        zero_param_info pi;
        zero_engine_param_info(e, p, &pi);
        if (pi.module != m) continue;
        void *x = NULL;
        zero_status st = zero_engine_param_data(e, p, &x);
        if (st != ZERO_OK) return st;
        float *want = malloc(pi.numel * sizeof *want);
        st = zero_engine_read_param(e, p, want);
        if (st == ZERO_OK)
            CHECK_MSG(!memcmp(x, want, pi.numel * sizeof *want), "untraced view of '%s' differs from read_param",
                      pi.name);
        free(want);
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

/* An eval forward: modules last to first, one at a time. */
static zero_status eval_pass(zero_engine *e)
{
    zero_status st = zero_engine_set_untraced(e, 1);
    for (int m = ENG_NMODULES - 1; m >= 0 && st == ZERO_OK; m--) {
        st = zero_engine_gather(e, m);
        if (st == ZERO_OK) st = check_module(e, m);
        if (st == ZERO_OK) st = zero_engine_release(e, m);
    }
    if (st == ZERO_OK) st = zero_engine_set_untraced(e, 0);
    return st;
}

/* Generation: every module gathered at once (nested), twice over. */
static zero_status generate(zero_engine *e)
{
    zero_status st = zero_engine_set_untraced(e, 1);
    for (int rep = 0; rep < 2 && st == ZERO_OK; rep++) {
        for (int m = 0; m < ENG_NMODULES && st == ZERO_OK; m++) st = zero_engine_gather(e, m);
        for (int m = 0; m < ENG_NMODULES && st == ZERO_OK; m++) st = check_module(e, m);
        for (int m = ENG_NMODULES - 1; m >= 0 && st == ZERO_OK; m--) st = zero_engine_release(e, m);
    }
    if (st == ZERO_OK) st = zero_engine_set_untraced(e, 0);
    return st;
}

typedef struct outcome {
    zero_engine_stats stats;
    float *master;
    uint64_t n;
} outcome;

static outcome train(zero_comm *comm, zero_device *dev, int untraced)
{
    outcome o = {0};
    zero_config c = make();
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return o;
    CHECK_OK(eng_register(e, 1));
    CHECK_OK(zero_engine_finalize(e));
    eng_run run = {{zero_comm_rank(comm)}, 1, 0, 0, 0};
    eng_forward_hook = untraced ? eval_pass : NULL;
    for (int s = 1; s <= STEPS; s++) {
        if (untraced) {
            CHECK_OK(eval_pass(e)); /* between steps: llm.c's val loss */
            CHECK_OK(generate(e));        /* and its sampling */
        }
        zero_step_result res;
        CHECK_OK(eng_train_step(e, dev, &c, &run, s, &res));
    }
    eng_forward_hook = NULL;
    CHECK_OK(zero_engine_get_stats(e, &o.stats));
    o.master = eng_collect_master(e, &o.n);
    zero_engine_destroy(e);
    return o;
}

static void check_misuse(zero_comm *comm, zero_device *dev)
{
    zero_config c = make();
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return;
    CHECK_OK(eng_register(e, 1));
    CHECK(zero_engine_set_untraced(e, 1) == ZERO_INVALID_STATE); /* before finalize */
    CHECK_OK(zero_engine_finalize(e));
    CHECK(zero_engine_get_untraced(e) == 0);
    CHECK_OK(zero_engine_set_untraced(e, 1));
    CHECK(zero_engine_get_untraced(e) == 1);
    CHECK(zero_engine_release(e, 2) == ZERO_INVALID_STATE);
    CHECK_MSG(strstr(zero_engine_last_error(e), "module 'block1' is not gathered untraced"), "%s", zero_engine_last_error(e));
    CHECK_OK(zero_engine_gather(e, 2));
    CHECK(zero_engine_set_untraced(e, 0) == ZERO_INVALID_STATE);
    CHECK_MSG(strstr(zero_engine_last_error(e), "module 'block1' is still gathered untraced"), "%s", zero_engine_last_error(e));
    CHECK(zero_engine_step(e, NULL) == ZERO_INVALID_STATE);
    CHECK_MSG(strstr(zero_engine_last_error(e), "untraced"), "%s", zero_engine_last_error(e));
    CHECK_OK(zero_engine_release(e, 2));
    CHECK_OK(zero_engine_set_untraced(e, 0));
    zero_engine_destroy(e);
}

int main(void)
{
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(0, 0, &world, &dev);
    if (rc) return rc;
    zero_set_log_handler(on_log, ZERO_LOG_WARN, NULL);
    outcome ref = train(world, dev, 0);
    warnings = 0;
    outcome got = train(world, dev, 1);
    CHECK_MSG(warnings == 0, "%d warnings logged with untraced forwards", warnings);
    const zero_engine_stats *a = &got.stats, *b = &ref.stats;
    CHECK_MSG(!memcmp(a, b, sizeof *a),
              "stats differ: gathers %llu/%llu prefetches %llu/%llu hits %llu/%llu dropped %llu/%llu order_changes "
              "%llu/%llu peak_inflight %llu/%llu peak_live %llu/%llu",
              (unsigned long long)a->gathers, (unsigned long long)b->gathers, (unsigned long long)a->prefetches,
              (unsigned long long)b->prefetches, (unsigned long long)a->prefetch_hits,
              (unsigned long long)b->prefetch_hits, (unsigned long long)a->prefetch_dropped,
              (unsigned long long)b->prefetch_dropped, (unsigned long long)a->order_changes,
              (unsigned long long)b->order_changes, (unsigned long long)a->peak_inflight_numel,
              (unsigned long long)b->peak_inflight_numel, (unsigned long long)a->peak_live_numel,
              (unsigned long long)b->peak_live_numel);
    CHECK(ref.stats.prefetches > 0 && ref.stats.prefetch_hits > 0); /* the prefetcher was really working */
    CHECK(got.n == ref.n && got.master && ref.master && eng_first_diff(got.master, ref.master, ref.n) == -1);
    free(ref.master);
    free(got.master);
    check_misuse(world, dev);
    zero_set_log_handler(NULL, ZERO_LOG_WARN, NULL);
    zero_device_close(dev);
    zero_comm_destroy(world);
    return check_exit();
}
