/* The CPU device's asynchronous mode (ZERO_CPU_ASYNC=1, device/cpu_async.c):
 * streams are worker threads, events are real, seeded delays per op.
 * Properties: (1) calls return before the work is done (asynchrony is real);
 * (2) work ordered by events and syncs gives the right bytes under random
 * delays, across three streams, hundreds of times; (3) the synchronous calls
 * (zero_memcpy, zero_sumsq) wait for their stream; (4) a host wait that runs
 * past ZERO_CPU_ASYNC_TIMEOUT_S is ZERO_TIMEOUT naming the stream; (5) bad
 * settings are refused naming the variable. Run by meson with
 * ZERO_CPU_ASYNC_DELAY_US set (and under ThreadSanitizer in CI). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zero/experimental.h>
#include <zero/zero.h>

#include "check.h"

static int contains(const char *s, const char *needle) { return s && strstr(s, needle) != NULL; }

static zero_device *open_cpu(void)
{
    zero_device *dev = NULL;
    CHECK_OK(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));
    return dev;
}

/* A pipeline: s1 produces round r into one of K buffers, s2 copies it out
 * after an event, s1 reuses the buffer only after s2's event. Any missing
 * wait shows as a wrong value under the random delays. */
static void test_pipeline(zero_device *dev)
{
    enum { K = 3, N = 4096, ROUNDS = 120 };
    float *buf[K], *out = NULL;
    zero_stream *s1 = NULL, *s2 = NULL;
    zero_event *produced[K], *consumed[K];
    CHECK_OK(zero_stream_create(dev, &s1));
    CHECK_OK(zero_stream_create(dev, &s2));
    CHECK_OK(zero_device_alloc(dev, (size_t)ROUNDS * N * sizeof(float), (void **)&out));
    for (int k = 0; k < K; k++) {
        CHECK_OK(zero_device_alloc(dev, N * sizeof(float), (void **)&buf[k]));
        CHECK_OK(zero_event_create(dev, &produced[k]));
        CHECK_OK(zero_event_create(dev, &consumed[k]));
    }
    if (!s1 || !s2 || !out) return;
    for (int r = 0; r < ROUNDS; r++) {
        int k = r % K;
        CHECK_OK(zero_stream_wait_event(s1, consumed[k])); /* s2 is done with the previous round in buf[k] */
        CHECK_OK(zero_fill_value(dev, buf[k], ZERO_F32, N, (float)r, s1));
        CHECK_OK(zero_scale(dev, buf[k], ZERO_F32, N, 2.0f, s1));
        CHECK_OK(zero_event_record(produced[k], s1));
        CHECK_OK(zero_stream_wait_event(s2, produced[k]));
        CHECK_OK(zero_memcpy_async(dev, out + (size_t)r * N, buf[k], N * sizeof(float), s2));
        CHECK_OK(zero_event_record(consumed[k], s2));
    }
    CHECK_OK(zero_stream_sync(s2));
    int wrong = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < N; i++) wrong += out[(size_t)r * N + i] != 2.0f * (float)r;
    CHECK_MSG(wrong == 0, "%d of %d values wrong in the event-ordered pipeline", wrong, ROUNDS * N);
    for (int k = 0; k < K; k++) {
        zero_event_destroy(produced[k]);
        zero_event_destroy(consumed[k]);
        zero_device_free(dev, buf[k]);
    }
    zero_device_free(dev, out);
    zero_stream_destroy(s1);
    zero_stream_destroy(s2);
}

/* Calls return before the work ran: some query right after a record says
 * "not done" (each op sleeps 0..delay us first). */
static void test_really_async(zero_device *dev)
{
    zero_stream *s = NULL;
    zero_event *e = NULL;
    CHECK_OK(zero_stream_create(dev, &s));
    CHECK_OK(zero_event_create(dev, &e));
    float *x = NULL;
    CHECK_OK(zero_device_alloc(dev, 1024 * sizeof(float), (void **)&x));
    if (!s || !e || !x) return;
    int pending = 0;
    for (int i = 0; i < 20; i++) {
        CHECK_OK(zero_fill_value(dev, x, ZERO_F32, 1024, 1.0f, s));
        CHECK_OK(zero_event_record(e, s));
        int done = 1;
        CHECK_OK(zero_event_query(e, &done));
        pending += !done;
        CHECK_OK(zero_event_sync(e));
        CHECK_OK(zero_event_query(e, &done));
        CHECK(done == 1);
    }
    CHECK_MSG(pending > 0, "every event was already done when queried: the device is not asynchronous");
    /* zero_sumsq waits for its stream: the fill queued before it is counted */
    CHECK_OK(zero_fill_value(dev, x, ZERO_F32, 1024, 3.0f, s));
    double ss = 0;
    CHECK_OK(zero_sumsq(dev, x, ZERO_F32, 1024, &ss, NULL, s));
    CHECK_MSG(ss == 9.0 * 1024, "sumsq %g, want %g", ss, 9.0 * 1024);
    /* zero_memcpy runs after the default stream's queued work */
    float host[4];
    CHECK_OK(zero_fill_value(dev, x, ZERO_F32, 4, 5.0f, NULL));
    CHECK_OK(zero_memcpy(dev, host, x, sizeof host));
    CHECK(host[0] == 5.0f && host[3] == 5.0f);
    /* device sync waits for every stream */
    CHECK_OK(zero_fill_value(dev, x, ZERO_F32, 1024, 7.0f, s));
    CHECK_OK(zero_device_sync(dev));
    CHECK(x[1023] == 7.0f);
    /* an event destroyed with its record still queued, and a stream
     * destroyed with work queued: that work still runs */
    CHECK_OK(zero_fill_value(dev, x, ZERO_F32, 1024, 8.0f, s));
    CHECK_OK(zero_event_record(e, s));
    zero_event_destroy(e);
    zero_stream_destroy(s);
    CHECK(x[0] == 8.0f);
    zero_device_free(dev, x);
}

static void test_timeout_and_settings(void)
{
    /* Ops that sleep up to 1.5 s each against a 1 s limit (seed 7: the
     * first three delays add up to more than 1 s). */
    setenv("ZERO_CPU_ASYNC_DELAY_US", "1500000", 1);
    setenv("ZERO_CPU_ASYNC_SEED", "7", 1);
    setenv("ZERO_CPU_ASYNC_TIMEOUT_S", "1", 1);
    zero_device *dev = open_cpu();
    zero_stream *s = NULL;
    float *x = NULL;
    if (dev) {
        CHECK_OK(zero_stream_create(dev, &s));
        CHECK_OK(zero_device_alloc(dev, 64, (void **)&x));
        for (int i = 0; i < 3; i++) CHECK_OK(zero_fill_value(dev, x, ZERO_F32, 16, 1.0f, s));
        zero_status st = zero_stream_sync(s);
        CHECK_MSG(st == ZERO_TIMEOUT && contains(zero_last_error(), "zero_stream_sync(cpu async): stream 1") &&
                      contains(zero_last_error(), "ZERO_CPU_ASYNC_TIMEOUT_S"),
                  "%s: %s", zero_status_name(st), zero_last_error());
        zero_stream_destroy(s); /* runs what is queued, then returns */
        zero_device_free(dev, x);
        zero_device_destroy(dev);
    }
    unsetenv("ZERO_CPU_ASYNC_SEED");
    unsetenv("ZERO_CPU_ASYNC_TIMEOUT_S");

    static const char *bad[][2] = {{"ZERO_CPU_ASYNC_DELAY_US", "-5"},
                                   {"ZERO_CPU_ASYNC_DELAY_US", "lots"},
                                   {"ZERO_CPU_ASYNC_TIMEOUT_S", "0"},
                                   {"ZERO_CPU_ASYNC", "yes"}};
    for (int i = 0; i < 4; i++) {
        setenv(bad[i][0], bad[i][1], 1);
        zero_device *d = NULL;
        zero_status st = zero_device_create(&d, ZERO_DEVICE_CPU, 0);
        CHECK_MSG(st == ZERO_INVALID_ARGUMENT && d == NULL && contains(zero_last_error(), bad[i][0]),
                  "%s=%s: %s %s", bad[i][0], bad[i][1], zero_status_name(st), zero_last_error());
        zero_device_destroy(d);
        if (i < 3) unsetenv(bad[i][0]);
        else setenv("ZERO_CPU_ASYNC", "1", 1);
    }
}

int main(void)
{
    /* meson sets ZERO_CPU_ASYNC=1 and a delay; standalone, set them here */
    setenv("ZERO_CPU_ASYNC", "1", 1);
    setenv("ZERO_CPU_ASYNC_DELAY_US", getenv("ZERO_CPU_ASYNC_DELAY_US") ? getenv("ZERO_CPU_ASYNC_DELAY_US") : "200", 1);
    zero_device *dev = open_cpu();
    if (!dev) return check_exit();
    test_pipeline(dev);
    test_really_async(dev);
    zero_device_destroy(dev);
    test_timeout_and_settings();
    return check_exit();
}
