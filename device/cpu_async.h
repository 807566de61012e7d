/* The CPU device's asynchronous mode (device-internal).
 *
 * With ZERO_CPU_ASYNC=1 in the environment when a CPU device is opened, each
 * stream (the default one included) is a worker thread that runs its queue
 * of ops in order, the host returns as soon as an op is queued, and events
 * are real cross-thread events, with CUDA's semantics: a record marks the
 * point in its stream's queue, stream_wait_event makes a stream wait for the
 * most recent record at the time of the call, an event never recorded counts
 * as done. ZERO_CPU_ASYNC_DELAY_US=N sleeps a random 0..N us before each op
 * (seeded by ZERO_CPU_ASYNC_SEED, default 1, per stream in creation order),
 * so a missing wait shows up as wrong numbers in CI rather than on a GPU.
 * Host waits (stream/device/event sync, the synchronous copy and sumsq) give
 * up after ZERO_CPU_ASYNC_TIMEOUT_S (default 60) with ZERO_TIMEOUT naming the
 * stream and what it is stuck on, never a silent hang. docs/device.md. */
#ifndef ZERO_DEVICE_CPU_ASYNC_H
#define ZERO_DEVICE_CPU_ASYNC_H

#include "device_internal.h"

/* An op's body; `arg` is the copy made at submit time. */
typedef void (*cpu_work_fn)(const void *arg);
#define CPU_WORK_ARG_MAX 96

/* Reads the environment; in async mode fills dev->impl, else leaves it NULL. */
zero_status cpu_async_open(zero_device *dev);
void cpu_async_close(zero_device *dev);
static inline int cpu_async_on(const zero_device *dev) { return dev->impl != NULL; }

/* Queue fn(arg) on s (NULL: the default stream); arg_bytes <= CPU_WORK_ARG_MAX. */
zero_status cpu_async_submit(zero_device *dev, zero_stream *s, cpu_work_fn fn, const void *arg,
                             size_t arg_bytes);

zero_status cpu_async_stream_create(zero_device *dev, zero_stream *s);
void cpu_async_stream_destroy(zero_stream *s);
zero_status cpu_async_stream_sync(zero_device *dev, zero_stream *s, const char *op);
zero_status cpu_async_device_sync(zero_device *dev);
zero_status cpu_async_event_create(zero_device *dev, zero_event *e);
void cpu_async_event_destroy(zero_event *e);
zero_status cpu_async_event_record(zero_device *dev, zero_event *e, zero_stream *s);
zero_status cpu_async_stream_wait_event(zero_device *dev, zero_stream *s, zero_event *e);
zero_status cpu_async_event_sync(zero_device *dev, zero_event *e);
int cpu_async_event_done(zero_event *e);

#endif
