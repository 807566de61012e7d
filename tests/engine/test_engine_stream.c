/* The engine's stream contract (engine.h, zero_engine_set_compute_stream) on
 * the asynchronous CPU device: every op of the trainer and of the engine is
 * queued on worker streams with seeded random delays (device/cpu_async.c).
 *
 * The trainer computes on its own stream S, never waiting on the host: the
 * forward accumulates each gathered module's parameters into an activation
 * buffer, the backward writes gradients from the parameters, a constant and
 * that activation, all on S. Properties:
 *   1. told about S, the engine's event hand-offs (grads_ready waits for S;
 *      gather, param_grad, grads_ready, step hand back to S; release lets
 *      the engine reuse a buffer only after S's reads) give master weights
 *      bitwise equal to the same run on the synchronous CPU device, stages
 *      0-3 with overlap_comm, f32 and bf16;
 *   2. not told about S (the engine waits for the default stream), the
 *      engine reads stale gradients: the result differs. So the test fails
 *      if the grads_ready hand-off is missing (skipped under TSan: that race
 *      is the point of it);
 *   3. a stream op that does not finish within the dp comm's timeout is a
 *      ZERO_TIMEOUT naming the call, not a hang. */
#include <zero/experimental.h>

#include "eng_util.h"

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif

#define STEPS 2
#define MAXN 4096 /* > the largest param */

typedef struct trainer {
    zero_device *dev;
    zero_stream *s;   /* the trainer's compute stream */
    void *ones;       /* MAXN of the compute dtype */
    void *act[ENG_NMODULES];
    int sync_before_release; /* keep the stale run memory-safe */
} trainer;

static zero_status train_step(zero_engine *e, trainer *t, zero_dtype dt, int rank, int step)
{
    zero_status st;
    const int np = zero_engine_num_params(e);
    for (int m = 0; m < ENG_NMODULES; m++) { /* forward */
        if ((st = zero_engine_gather(e, m)) != ZERO_OK) return st;
        for (int p = 0; p < np; p++) {
            zero_param_info pi;
            zero_engine_param_info(e, p, &pi);
            if (pi.module != m) continue;
            void *x;
            if ((st = zero_engine_param_data(e, p, &x)) != ZERO_OK) return st;
            if ((st = zero_axpy(t->dev, 0.5f, x, t->act[m], dt, pi.numel, t->s)) != ZERO_OK) return st;
        }
        if (t->sync_before_release && (st = zero_stream_sync(t->s)) != ZERO_OK) return st;
        if ((st = zero_engine_release(e, m)) != ZERO_OK) return st;
    }
    for (int m = ENG_NMODULES - 1; m >= 0; m--) { /* backward */
        if ((st = zero_engine_gather(e, m)) != ZERO_OK) return st;
        for (int p = 0; p < np; p++) {
            zero_param_info pi;
            zero_engine_param_info(e, p, &pi);
            if (pi.module != m) continue;
            void *x, *g;
            if ((st = zero_engine_param_data(e, p, &x)) != ZERO_OK) return st;
            if ((st = zero_engine_param_grad(e, p, &g)) != ZERO_OK) return st;
            float a = 0.01f * (float)(rank + 1) + 0.003f * (float)step;
            if ((st = zero_axpy(t->dev, a, x, g, dt, pi.numel, t->s)) != ZERO_OK) return st;
            if ((st = zero_axpy(t->dev, 0.02f * (float)(p + 1), t->ones, g, dt, pi.numel, t->s)) != ZERO_OK)
                return st;
            if ((st = zero_axpy(t->dev, 0.001f, t->act[m], g, dt, pi.numel, t->s)) != ZERO_OK) return st;
        }
        if ((st = zero_engine_grads_ready(e, m)) != ZERO_OK) return st;
        if (t->sync_before_release && (st = zero_stream_sync(t->s)) != ZERO_OK) return st;
        if ((st = zero_engine_release(e, m)) != ZERO_OK) return st;
    }
    zero_step_result res;
    return zero_engine_step(e, &res);
}

static zero_device *open_device(int async, const char *delay_us)
{
    if (async) {
        setenv("ZERO_CPU_ASYNC", "1", 1);
        setenv("ZERO_CPU_ASYNC_DELAY_US", delay_us, 1);
    } else {
        unsetenv("ZERO_CPU_ASYNC");
    }
    zero_device *dev = NULL;
    CHECK_OK(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));
    return dev;
}

/* 3 steps; returns every param's master (fp32), or NULL on failure. */
static float *run(zero_comm *comm, zero_device *dev, int stage, zero_dtype dt, int tell, uint64_t *n)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.compute_dtype = dt;
    c.overlap_comm = 1;
    c.reduce_bucket_size = ENG_BUCKET;
    c.stage3_param_persistence_threshold = ENG_PERSIST;
    c.stage3_prefetch_bucket_size = 1500;
    c.stage3_max_live_parameters = 3000;
    c.gradient_clipping = 1.0;
    trainer t = {.dev = dev, .sync_before_release = !tell};
    zero_engine *e = NULL;
    float *out = NULL;
    CHECK_OK(zero_stream_create(dev, &t.s));
    CHECK_OK(zero_device_alloc(dev, MAXN * 4, &t.ones));
    for (int m = 0; m < ENG_NMODULES; m++) {
        CHECK_OK(zero_device_alloc(dev, MAXN * 4, &t.act[m]));
        if (t.act[m]) CHECK_OK(zero_fill_value(dev, t.act[m], dt, MAXN, 0.0f, t.s));
    }
    if (t.ones) CHECK_OK(zero_fill_value(dev, t.ones, dt, MAXN, 1.0f, t.s));
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (e && t.s && t.ones) {
        CHECK_OK(eng_register(e, 1));
        CHECK_OK(zero_engine_finalize(e));
        if (tell) CHECK_OK(zero_engine_set_compute_stream(e, t.s));
        int ok = 1;
        for (int s = 1; ok && s <= STEPS; s++) {
            zero_status st = train_step(e, &t, dt, zero_comm_rank(comm), s);
            CHECK_MSG(st == ZERO_OK, "stage %d %s step %d: %s", stage, zero_dtype_name(dt), s, zero_last_error());
            ok = st == ZERO_OK;
        }
        CHECK_OK(zero_stream_sync(t.s));
        if (ok) out = eng_collect_master(e, n);
    }
    zero_engine_destroy(e);
    zero_stream_sync(t.s);
    for (int m = 0; m < ENG_NMODULES; m++) zero_device_free(dev, t.act[m]);
    zero_device_free(dev, t.ones);
    zero_stream_destroy(t.s);
    return out;
}

static void check_deadline(zero_comm *world)
{
    /* Every op sleeps 0..400 ms (seed 3): a one-parameter engine still
     * finalizes in about a second, and the ten ops queued on the compute
     * stream below take longer than the 1 s deadline. */
    setenv("ZERO_CPU_ASYNC_SEED", "3", 1);
    zero_device *dev = open_device(1, "400000");
    zero_comm *c = NULL;
    CHECK_OK(zero_comm_split(world, zero_comm_rank(world), 0, &c)); /* alone: the deadline is this rank's */
    zero_config cfg = ZERO_CONFIG_INIT;
    cfg.stage = 2;
    cfg.compute_dtype = ZERO_BF16;
    zero_engine *e = NULL;
    zero_stream *s = NULL;
    if (dev && c) CHECK_OK(zero_engine_create(&e, &cfg, c, dev));
    if (e) {
        int m;
        float init[10] = {0};
        CHECK_OK(zero_engine_add_module(e, "embed", &m));
        CHECK_OK(zero_engine_add_param(e, m, "embed.w", 1, (int64_t[]){10}, init, NULL));
        CHECK_OK(zero_engine_finalize(e));
        CHECK_OK(zero_stream_create(dev, &s));
        CHECK_OK(zero_engine_set_compute_stream(e, s));
        CHECK_OK(zero_comm_set_timeout(c, 1.0));
    }
    if (e && s) {
        void *g = NULL;
        CHECK_OK(zero_engine_param_grad(e, 0, &g));
        for (int i = 0; i < 10 && g; i++) CHECK_OK(zero_fill_value(dev, g, ZERO_BF16, 10, 1.0f, s));
        zero_status st = zero_engine_grads_ready(e, 0);
        CHECK_MSG(st == ZERO_TIMEOUT && strstr(zero_last_error(), "grads_ready") &&
                      strstr(zero_last_error(), "did not finish its queued work within 1 s"),
                  "%s: %s", zero_status_name(st), zero_last_error());
        /* the engine is broken; let the queued work end before its buffers go */
        CHECK_OK(zero_device_sync(dev));
        CHECK(zero_engine_grads_ready(e, 0) == ZERO_INVALID_STATE);
    }
    zero_engine_destroy(e);
    zero_stream_destroy(s);
    zero_comm_destroy(c);
    zero_device_destroy(dev);
    unsetenv("ZERO_CPU_ASYNC_SEED");
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    zero_comm *world = NULL;
    if (zero_comm_init_world(&world, NULL) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    check_set_rank(zero_comm_rank(world));
    const char *delay = getenv("ZERO_CPU_ASYNC_DELAY_US") ? getenv("ZERO_CPU_ASYNC_DELAY_US") : "100";
    char delay_buf[32];
    snprintf(delay_buf, sizeof delay_buf, "%s", delay);
    zero_device *sync_dev = open_device(0, "0");
    zero_device *async_dev = open_device(1, delay_buf);
    static const struct { int stage; zero_dtype dt; } cases[] = {{0, ZERO_F32}, {1, ZERO_F32}, {2, ZERO_BF16},
                                                                 {3, ZERO_F32}, {3, ZERO_BF16}};
    int stale_seen = 0, stale_runs = 0;
    for (size_t k = 0; sync_dev && async_dev && k < sizeof cases / sizeof cases[0]; k++) {
        uint64_t n = 0, n2 = 0;
        float *ref = run(world, sync_dev, cases[k].stage, cases[k].dt, 1, &n);
        float *got = run(world, async_dev, cases[k].stage, cases[k].dt, 1, &n2);
        if (ref && got) {
            long d = eng_first_diff(got, ref, n);
            CHECK_MSG(n == n2 && d < 0, "stage %d %s: async device with hand-offs differs from the synchronous run at "
                      "element %ld (%.9g vs %.9g)", cases[k].stage, zero_dtype_name(cases[k].dt), d,
                      d < 0 ? 0.0 : got[d], d < 0 ? 0.0 : ref[d]);
        }
        if (ref && !UNDER_TSAN && (k == 0 || k == 3)) {
            float *stale = run(world, async_dev, cases[k].stage, cases[k].dt, 0, &n2);
            stale_runs++;
            if (stale) stale_seen += eng_first_diff(stale, ref, n) >= 0;
            free(stale);
        }
        free(ref);
        free(got);
    }
    CHECK_MSG(stale_seen == stale_runs, "without the compute stream the engine read stale gradients in only %d of "
              "%d runs: the test cannot tell a missing hand-off", stale_seen, stale_runs);
    zero_device_destroy(async_dev);
    zero_device_destroy(sync_dev);
    check_deadline(world);
    zero_comm_destroy(world);
    return check_exit();
}
