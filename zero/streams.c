/* The engine's streams and the hand-offs between them (DESIGN invariant 8).
 *
 * The trainer computes on its compute stream (zero_engine_set_compute_stream;
 * NULL: the device's default stream). Every device op of the engine runs on
 * the engine's own stream, created with the engine. The two hand over by
 * events only:
 *   - compute -> engine: grads_ready, release and step record an event on the
 *     compute stream and the engine stream waits for it (gradients are
 *     complete; a released buffer is no longer read);
 *   - engine -> compute: gather, param_grad (a zeroed buffer), grads_ready
 *     (gradients zeroed for the next micro-step), step and zero_grad record
 *     an event on the engine stream and the compute stream waits for it.
 * The host waits only for the engine stream, and only where a host-side
 * reader needs the bytes: a collective on host memory (MPI/LOCAL; STAGED and
 * NCCL start from the host too), the host optimizer of the CPU device, a value
 * (the norm) or a copy to the caller. That wait polls an event against the dp
 * comm's timeout, so a stream op that never completes is a named
 * ZERO_TIMEOUT, not a hang. No device-wide synchronisation is left. */
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "common/handle.h"
#include "engine_internal.h"

zero_status engine_streams_create(zero_engine *e)
{
    zero_status st = zero_stream_create(e->dev, &e->stream);
    if (st == ZERO_OK) st = zero_event_create(e->dev, &e->ev_compute);
    if (st == ZERO_OK) st = zero_event_create(e->dev, &e->ev_engine);
    if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine create: the engine's stream and events: ");
    return ZERO_OK;
}

void engine_streams_destroy(zero_engine *e)
{
    zero_event_destroy(e->ev_compute);
    zero_event_destroy(e->ev_engine);
    zero_stream_destroy(e->stream); /* queued work still runs first */
    e->ev_compute = e->ev_engine = NULL;
    e->stream = NULL;
}

static zero_status stream_failed(zero_engine *e, zero_status st, const char *what, const char *step)
{
    char prefix[200];
    snprintf(prefix, sizeof prefix, "%s: %s: ", what, step);
    return zero_fail_forward(&e->err, st, prefix);
}

zero_status engine_wait_compute(zero_engine *e, const char *what)
{
    zero_status st = zero_event_record(e->ev_compute, e->compute);
    if (st == ZERO_OK) st = zero_stream_wait_event(e->stream, e->ev_compute);
    return st == ZERO_OK ? ZERO_OK : stream_failed(e, st, what, "waiting for the compute stream");
}

zero_status engine_hand_to_compute(zero_engine *e, const char *what)
{
    zero_status st = zero_event_record(e->ev_engine, e->stream);
    if (st == ZERO_OK) st = zero_stream_wait_event(e->compute, e->ev_engine);
    return st == ZERO_OK ? ZERO_OK : stream_failed(e, st, what, "handing over to the compute stream");
}

/* Poll (yielding the core at first, then with a growing sleep of at most
 * 1 ms, like the comm deadlines) until the event recorded now is done. */
zero_status engine_sync_stream(zero_engine *e, const char *what)
{
    zero_status st = zero_event_record(e->ev_engine, e->stream);
    if (st != ZERO_OK) return stream_failed(e, st, what, "engine stream");
    double timeout = zero_comm_timeout(e->dp);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long polls = 0;; polls++) {
        int done = 0;
        st = zero_event_query(e->ev_engine, &done);
        if (st != ZERO_OK) return stream_failed(e, st, what, "engine stream");
        if (done) return ZERO_OK;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (waited > timeout) {
            engine_mark_broken(e);
            return zero_fail(&e->err, ZERO_TIMEOUT,
                             "%s: the engine's stream on rank %d did not finish its queued work within %g s (the dp "
                             "comm's timeout); the device is stuck or too slow",
                             what, e->rank, timeout);
        }
        if (polls < 100) {
            sched_yield(); /* let the stream's worker (the CPU device's) have the core */
        } else {
            double s = waited / 64.0;
            if (s > 1e-3) s = 1e-3;
            struct timespec ts = {0, (long)(s * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
}

zero_status engine_memcpy(zero_engine *e, void *dst, const void *src, size_t bytes)
{
    zero_status st = zero_memcpy_async(e->dev, dst, src, bytes, e->stream);
    if (st != ZERO_OK) return st;
    return engine_sync_stream(e, "engine copy");
}

zero_status zero_engine_set_compute_stream(zero_engine *e, zero_stream *stream)
{
    if (!e) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine set_compute_stream: engine is NULL");
    ZERO_TRY(engine_check_usable(e, "engine set_compute_stream", e->magic == ZERO_HANDLE_ENGINE && e->finalized));
    /* A stream of another device is refused here, by the record. */
    zero_status st = zero_event_record(e->ev_compute, stream);
    if (st != ZERO_OK) return stream_failed(e, st, "engine set_compute_stream", "the new compute stream");
    /* Nothing the engine queued may still be waited for by the old stream. */
    ZERO_TRY(engine_sync_stream(e, "engine set_compute_stream"));
    e->compute = stream;
    return ZERO_OK;
}

zero_stream *zero_engine_stream(const zero_engine *e) { return e ? e->stream : NULL; }
