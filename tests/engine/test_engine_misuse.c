/* Misuse returns clear errors and never aborts or hangs.
 *   test_engine_misuse           API misuse on every rank; different
 *                                registrations across ranks (N >= 2)
 *   test_engine_misuse die       the last rank leaves after grads-ready; the
 *                                others' step fails within the deadline with
 *                                "engine step: ..." (N >= 2) */
#include <time.h>

#include "eng_util.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static zero_config base_config(int stage)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.reduce_bucket_size = ENG_BUCKET;
    c.stage3_param_persistence_threshold = ENG_PERSIST;
    return c;
}

static void api_misuse(zero_comm *comm, zero_device *dev)
{
    zero_engine_destroy(NULL);
    zero_engine *e = NULL;
    zero_config c = base_config(3);
    ENG_EXPECT(zero_engine_create(&e, &c, NULL, dev), ZERO_INVALID_ARGUMENT, "dp comm is NULL");
    CHECK(e == NULL);
    zero_config bad = base_config(5);
    ENG_EXPECT(zero_engine_create(&e, &bad, comm, dev), ZERO_CONFIG, "stage must be 0..3");
    zero_config old = c;
    old.size = 8;
    ENG_EXPECT(zero_engine_create(&e, &old, comm, dev), ZERO_CONFIG, "ZERO_CONFIG_INIT");

    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return;
    int m = -1, p = -1;
    ENG_EXPECT(zero_engine_step(e, NULL), ZERO_INVALID_STATE, "finalize first");
    ENG_EXPECT(zero_engine_gather(e, 0), ZERO_INVALID_STATE, "finalize first");
    ENG_EXPECT(zero_engine_finalize(e), ZERO_INVALID_STATE, "no parameters");
    CHECK_OK(zero_engine_add_module(e, "m", &m));
    ENG_EXPECT(zero_engine_add_module(e, "m", NULL), ZERO_INVALID_ARGUMENT, "already exists");
    int64_t shape[2] = {3, 0};
    ENG_EXPECT(zero_engine_add_param(e, m, "w", 2, shape, NULL, &p), ZERO_INVALID_ARGUMENT, "shape[1]");
    ENG_EXPECT(zero_engine_add_param(e, 7, "w", 1, shape, NULL, &p), ZERO_NOT_FOUND, "unknown module 7");
    ENG_EXPECT(zero_engine_add_param(e, m, "w", 0, shape, NULL, &p), ZERO_INVALID_ARGUMENT, "ndim 0");
    shape[1] = 5;
    CHECK_OK(zero_engine_add_param(e, m, "w", 2, shape, NULL, &p));
    ENG_EXPECT(zero_engine_add_param(e, m, "w", 1, shape, NULL, NULL), ZERO_INVALID_ARGUMENT, "'w' already exists");
    CHECK_OK(zero_engine_finalize(e));

    ENG_EXPECT(zero_engine_finalize(e), ZERO_INVALID_STATE, "after zero_engine_finalize");
    ENG_EXPECT(zero_engine_add_param(e, m, "late", 1, shape, NULL, NULL), ZERO_INVALID_STATE,
               "after zero_engine_finalize");
    ENG_EXPECT(zero_engine_add_module(e, "late", NULL), ZERO_INVALID_STATE, "after zero_engine_finalize");
    ENG_EXPECT(zero_engine_gather(e, 42), ZERO_NOT_FOUND, "unknown module 42");
    ENG_EXPECT(zero_engine_gather(e, -1), ZERO_NOT_FOUND, "unknown module -1");
    CHECK(strstr(zero_engine_last_error(e), "unknown module -1") != NULL);
    ENG_EXPECT(zero_engine_release(e, m), ZERO_INVALID_STATE, "not gathered");
    ENG_EXPECT(zero_engine_grads_ready(e, 9), ZERO_NOT_FOUND, "unknown module 9");
    void *ptr = NULL;
    ENG_EXPECT(zero_engine_param_data(e, 99, &ptr), ZERO_NOT_FOUND, "unknown parameter 99");
    ENG_EXPECT(zero_engine_param_data(e, p, &ptr), ZERO_INVALID_STATE, "not gathered");
    ENG_EXPECT(zero_engine_step(e, NULL), ZERO_INVALID_STATE, "module 'm' reported grads-ready 0 time(s)");
    CHECK_OK(zero_engine_gather(e, m));
    CHECK_OK(zero_engine_param_data(e, p, &ptr));
    CHECK(ptr != NULL);
    CHECK_OK(zero_engine_grads_ready(e, m));
    ENG_EXPECT(zero_engine_step(e, NULL), ZERO_INVALID_STATE, "still gathered");
    ENG_EXPECT(zero_engine_grads_ready(e, m), ZERO_INVALID_STATE, "already reported 1 time(s)");
    CHECK_OK(zero_engine_release(e, m));
    zero_step_result r;
    CHECK_OK(zero_engine_step(e, &r));
    CHECK(r.step == 1);
    ENG_EXPECT(zero_engine_state_get(e, (zero_state_kind)7, p, NULL), ZERO_INVALID_ARGUMENT, "unknown state kind");
    ENG_EXPECT(zero_engine_set_lr(e, -1.0), ZERO_INVALID_ARGUMENT, "lr must be");
    zero_engine_destroy(e);

    /* SGD without momentum keeps no moments */
    c = base_config(1);
    c.optimizer = ZERO_OPTIM_SGD;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    CHECK_OK(zero_engine_add_module(e, "m", &m));
    CHECK_OK(zero_engine_add_param(e, m, "w", 2, shape, NULL, &p));
    CHECK_OK(zero_engine_finalize(e));
    float buf[15];
    zero_param_info pi;
    CHECK_OK(zero_engine_get_param_info(e, p, &pi));
    if (pi.owned_numel > 0) {
        ENG_EXPECT(zero_engine_state_get(e, ZERO_STATE_MOMENT1, p, buf), ZERO_NOT_FOUND, "no moment1");
        CHECK_OK(zero_engine_state_get(e, ZERO_STATE_MASTER, p, buf));
    }
    zero_engine_destroy(e);
}

/* The last rank registers something else: every rank fails at finalize with
 * ZERO_MISMATCH naming the first differing parameter. */
static void registration_mismatch(zero_comm *comm, zero_device *dev, int extra)
{
    const int n = zero_comm_get_size(comm), rank = zero_comm_get_rank(comm);
    zero_config c = base_config(2);
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return;
    int mod;
    CHECK_OK(zero_engine_add_module(e, "m", &mod));
    for (int i = 0; i < 8; i++) {
        int64_t shape[1] = {10 + i};
        if (!extra && i == 5 && rank == n - 1) shape[0] = 99;
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        CHECK_OK(zero_engine_add_param(e, mod, name, 1, shape, NULL, NULL));
    }
    if (extra && rank == n - 1) {
        int64_t shape[1] = {4};
        CHECK_OK(zero_engine_add_param(e, mod, "extra", 1, shape, NULL, NULL));
    }
    zero_status st = zero_engine_finalize(e);
    CHECK_MSG(st == ZERO_MISMATCH, "finalize returned %s: %s", zero_status_name(st), zero_engine_last_error(e));
    const char *want = extra ? "param #8" : "param #5";
    CHECK_MSG(strstr(zero_engine_last_error(e), want) != NULL, "message lacks %s: %s", want, zero_engine_last_error(e));
    if (rank == 0) fprintf(stderr, "expected: %s\n", zero_engine_last_error(e));
    zero_engine_destroy(e);
}

/* The last rank leaves (tears down its comm) after the micro-step; the
 * others' step fails within the deadline and names the step. */
static int rank_dies(zero_comm *world, zero_device *dev)
{
    const int n = zero_comm_get_size(world), rank = zero_comm_get_rank(world);
    const double deadline = 1.0;
    zero_config c = base_config(2);
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, world, dev));
    CHECK_OK(eng_register(e, 1));
    CHECK_OK(zero_engine_finalize(e));
    /* one full micro-step: forward, backward, grads-ready everywhere */
    for (int m = ENG_NMODULES - 1; m >= 0; m--) CHECK_OK(zero_engine_grads_ready(e, m));
    if (rank == n - 1) {
        zero_engine_destroy(e);
        zero_device_destroy(dev);
        zero_comm_destroy(world);
        return check_exit();
    }
    /* the short deadline only now, so a loaded machine cannot trip the setup */
    CHECK_OK(zero_comm_set_timeout(world, deadline));
    double t0 = now();
    zero_status st = zero_engine_step(e, NULL);
    double dt = now() - t0;
    CHECK_MSG(st == ZERO_TIMEOUT || st == ZERO_PEER_FAILURE, "step returned %s: %s", zero_status_name(st),
              zero_engine_last_error(e));
    CHECK_MSG(!strncmp(zero_engine_last_error(e), "engine step: ", 13), "message lacks context: %s",
              zero_engine_last_error(e));
    CHECK_MSG(dt < deadline + 3.0, "step failed after %.2f s for a %.1f s deadline", dt, deadline);
    fprintf(stderr, "[rank %d] expected failure after %.2f s: %s\n", rank, dt, zero_engine_last_error(e));
    /* afterwards the engine refuses everything but destroy, at once */
    t0 = now();
    ENG_EXPECT(zero_engine_step(e, NULL), ZERO_INVALID_STATE, "unusable after an earlier failure");
    ENG_EXPECT(zero_engine_gather(e, 0), ZERO_INVALID_STATE, "engine step: ");
    ENG_EXPECT(zero_engine_gather(e, 0), ZERO_INVALID_STATE, "that failure: engine step: ");
    CHECK_MSG(strstr(strstr(zero_engine_last_error(e), "that failure:") + 1, "that failure:") == NULL,
              "the message nests: %s", zero_engine_last_error(e));
    CHECK(now() - t0 < 0.5);
    t0 = now();
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    CHECK_MSG(now() - t0 < 10.0, "teardown took %.2f s", now() - t0);
    return check_exit();
}

int main(int argc, char **argv)
{
    zero_comm *world = NULL;
    zero_device *dev = NULL;
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT;
    cc.timeout_s = 30;
    if (zero_comm_create_world(&world, &cc) != ZERO_OK || zero_device_create(&dev, ZERO_DEVICE_CPU, 0) != ZERO_OK) {
        fprintf(stderr, "setup: %s\n", zero_last_error());
        return 1;
    }
    const int n = zero_comm_get_size(world);
    check_set_rank(zero_comm_get_rank(world));
    if (argc > 1 && !strcmp(argv[1], "die")) {
        if (n < 2) {
            zero_device_destroy(dev);
            zero_comm_destroy(world);
            CHECK_SKIP("needs at least 2 ranks");
        }
        return rank_dies(world, dev);
    }
    api_misuse(world, dev);
    if (n >= 2) {
        registration_mismatch(world, dev, 0);
        registration_mismatch(world, dev, 1);
    }
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
