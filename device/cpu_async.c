/* The CPU device's asynchronous mode: a worker thread per stream, real
 * events, optional seeded delays (see cpu_async.h for the contract).
 *
 * One mutex per device guards every queue and event; one condition variable
 * per stream wakes its worker, and one device-wide "progress" condition is
 * broadcast whenever an op finishes or an event completes, which is what
 * every waiter (host syncs, a worker blocked in stream_wait_event) waits on.
 * Coarse, but these queues carry at most thousands of ops per step and the
 * point of the mode is ordering, not speed. */
#include "cpu_async.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct cpu_event_impl cpu_event_impl;

typedef enum { OP_WORK, OP_RECORD, OP_WAIT } op_kind;

typedef struct cpu_op {
    struct cpu_op *next;
    op_kind kind;
    cpu_work_fn fn;
    cpu_event_impl *ev; /* RECORD / WAIT: referenced until the op is done */
    uint64_t gen;       /* the event generation recorded / waited for */
    _Alignas(16) unsigned char arg[CPU_WORK_ARG_MAX];
} cpu_op;

typedef struct cpu_stream_impl {
    struct cpu_async *a;
    struct cpu_stream_impl *prev, *next; /* the device's streams */
    int index;                           /* creation order; 0 = default stream */
    pthread_t thread;
    pthread_cond_t wake;
    cpu_op *head, *tail;
    uint64_t submitted, done;
    const char *blocked_on; /* what the worker waits for now (messages) */
    int stop;
    uint64_t rng;
} cpu_stream_impl;

struct cpu_event_impl {
    uint64_t recorded;  /* generation of the latest record call */
    uint64_t completed; /* highest generation whose record has run */
    int refs;           /* the handle + ops in flight */
};

typedef struct cpu_async {
    pthread_mutex_t mu;
    pthread_cond_t progress;
    cpu_stream_impl *streams; /* every live stream, default first */
    cpu_stream_impl *dflt;
    int next_index;
    unsigned delay_us;
    uint64_t seed;
    double timeout_s;
} cpu_async;

/* ---------------------------------------------------------------- helpers */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void sleep_us(unsigned us)
{
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static struct timespec deadline_after(double s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double whole = (double)(long long)s;
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((s - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static void event_unref_locked(cpu_event_impl *ev)
{
    if (--ev->refs == 0) free(ev);
}

static cpu_stream_impl *stream_of(cpu_async *a, zero_stream *s)
{
    return s ? (cpu_stream_impl *)s->impl : a->dflt;
}

/* ---------------------------------------------------------------- worker */

static void *worker(void *p)
{
    cpu_stream_impl *st = p;
    cpu_async *a = st->a;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!st->head && !st->stop) pthread_cond_wait(&st->wake, &a->mu);
        if (!st->head) break; /* stopped and drained */
        cpu_op *op = st->head;
        unsigned delay = a->delay_us ? (unsigned)(splitmix64(&st->rng) % ((uint64_t)a->delay_us + 1)) : 0;
        pthread_mutex_unlock(&a->mu);
        if (delay) sleep_us(delay);
        if (op->kind == OP_WORK) op->fn(op->arg);
        pthread_mutex_lock(&a->mu);
        if (op->kind == OP_WAIT) {
            st->blocked_on = "an event record on another stream";
            while (op->ev->completed < op->gen) pthread_cond_wait(&a->progress, &a->mu);
            st->blocked_on = NULL;
        } else if (op->kind == OP_RECORD) {
            if (op->ev->completed < op->gen) op->ev->completed = op->gen;
        }
        if (op->ev) event_unref_locked(op->ev);
        st->head = op->next;
        if (!st->head) st->tail = NULL;
        st->done++;
        pthread_cond_broadcast(&a->progress);
        free(op);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static zero_status enqueue(zero_device *dev, cpu_stream_impl *st, cpu_op *op)
{
    cpu_async *a = dev->impl;
    (void)a;
    op->next = NULL;
    if (st->tail)
        st->tail->next = op;
    else
        st->head = op;
    st->tail = op;
    st->submitted++;
    pthread_cond_signal(&st->wake);
    return ZERO_OK;
}

static zero_status stream_start(zero_device *dev, cpu_stream_impl *st)
{
    cpu_async *a = dev->impl;
    st->a = a;
    pthread_cond_init(&st->wake, NULL);
    pthread_mutex_lock(&a->mu);
    st->index = a->next_index++;
    uint64_t x = a->seed ^ (0x632be59bd9b4e019ULL * (uint64_t)(st->index + 1));
    st->rng = splitmix64(&x);
    pthread_mutex_unlock(&a->mu);
    if (pthread_create(&st->thread, NULL, worker, st) != 0) {
        pthread_cond_destroy(&st->wake);
        return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "zero_stream_create(cpu async): cannot start a worker thread");
    }
    pthread_mutex_lock(&a->mu);
    st->next = a->streams;
    if (a->streams) a->streams->prev = st;
    a->streams = st;
    pthread_mutex_unlock(&a->mu);
    return ZERO_OK;
}

/* Waits until st has run everything queued before the call (mu held). */
static zero_status drain_locked(zero_device *dev, cpu_stream_impl *st, const char *op)
{
    cpu_async *a = dev->impl;
    uint64_t target = st->submitted;
    struct timespec dl = deadline_after(a->timeout_s);
    while (st->done < target) {
        if (pthread_cond_timedwait(&a->progress, &a->mu, &dl) == ETIMEDOUT && st->done < target)
            return zero_fail(&dev->err, ZERO_TIMEOUT,
                             "%s(cpu async): stream %d did not finish within %g s (%llu of %llu ops done%s%s; "
                             "ZERO_CPU_ASYNC_TIMEOUT_S)",
                             op, st->index, a->timeout_s, (unsigned long long)st->done, (unsigned long long)target,
                             st->blocked_on ? ", waiting for " : "", st->blocked_on ? st->blocked_on : "");
    }
    return ZERO_OK;
}

static void stream_stop(cpu_async *a, cpu_stream_impl *st)
{
    pthread_mutex_lock(&a->mu);
    st->stop = 1;
    pthread_cond_signal(&st->wake);
    if (st->prev) st->prev->next = st->next;
    else a->streams = st->next;
    if (st->next) st->next->prev = st->prev;
    pthread_mutex_unlock(&a->mu);
    pthread_join(st->thread, NULL); /* runs what is queued, then exits */
    pthread_cond_destroy(&st->wake);
    free(st);
}

/* ---------------------------------------------------------------- open/close */

static int env_uint(const char *name, unsigned long long max, unsigned long long *out)
{
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || v[0] == '-' || x > max) return -1;
    *out = x;
    return 1;
}

zero_status cpu_async_open(zero_device *dev)
{
    dev->impl = NULL;
    const char *on = getenv("ZERO_CPU_ASYNC");
    if (!on || !*on || !strcmp(on, "0")) return ZERO_OK;
    if (strcmp(on, "1") != 0)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_device_create(cpu): ZERO_CPU_ASYNC='%s': expected 0 or 1", on);
    unsigned long long delay = 0, seed = 1, timeout = 60;
    if (env_uint("ZERO_CPU_ASYNC_DELAY_US", 10000000ULL, &delay) < 0)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT,
                         "zero_device_create(cpu): ZERO_CPU_ASYNC_DELAY_US='%s': expected microseconds 0..10000000",
                         getenv("ZERO_CPU_ASYNC_DELAY_US"));
    if (env_uint("ZERO_CPU_ASYNC_SEED", UINT64_MAX, &seed) < 0)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_device_create(cpu): ZERO_CPU_ASYNC_SEED='%s': expected an integer",
                         getenv("ZERO_CPU_ASYNC_SEED"));
    if (env_uint("ZERO_CPU_ASYNC_TIMEOUT_S", 86400, &timeout) < 0 || timeout == 0)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT,
                         "zero_device_create(cpu): ZERO_CPU_ASYNC_TIMEOUT_S='%s': expected seconds 1..86400",
                         getenv("ZERO_CPU_ASYNC_TIMEOUT_S"));
    cpu_async *a = calloc(1, sizeof *a);
    cpu_stream_impl *d = calloc(1, sizeof *d);
    if (!a || !d) {
        free(a);
        free(d);
        return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_device_create(cpu): out of host memory");
    }
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->progress, NULL);
    a->delay_us = (unsigned)delay;
    a->seed = seed;
    a->timeout_s = (double)timeout;
    dev->impl = a;
    zero_status st = stream_start(dev, d);
    if (st != ZERO_OK) {
        free(d);
        pthread_cond_destroy(&a->progress);
        pthread_mutex_destroy(&a->mu);
        free(a);
        dev->impl = NULL;
        return zero_fail(NULL, st, "%s", dev->err.msg);
    }
    a->dflt = d;
    return ZERO_OK;
}

void cpu_async_close(zero_device *dev)
{
    cpu_async *a = dev->impl;
    if (!a) return;
    /* Streams the caller did not destroy stop here too (their handles are
     * dead with the device); each runs what it has queued first. */
    for (;;) {
        pthread_mutex_lock(&a->mu);
        cpu_stream_impl *st = a->streams;
        pthread_mutex_unlock(&a->mu);
        if (!st) break;
        stream_stop(a, st);
    }
    pthread_cond_destroy(&a->progress);
    pthread_mutex_destroy(&a->mu);
    free(a);
    dev->impl = NULL;
}

/* ---------------------------------------------------------------- ops */

zero_status cpu_async_submit(zero_device *dev, zero_stream *s, cpu_work_fn fn, const void *arg, size_t arg_bytes)
{
    cpu_async *a = dev->impl;
    cpu_op *op = calloc(1, sizeof *op);
    if (!op) return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "cpu async: cannot queue an op (out of host memory)");
    op->kind = OP_WORK;
    op->fn = fn;
    memcpy(op->arg, arg, arg_bytes);
    pthread_mutex_lock(&a->mu);
    zero_status st = enqueue(dev, stream_of(a, s), op);
    pthread_mutex_unlock(&a->mu);
    return st;
}

zero_status cpu_async_stream_create(zero_device *dev, zero_stream *s)
{
    cpu_stream_impl *st = calloc(1, sizeof *st);
    if (!st) return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "zero_stream_create(cpu async): out of host memory");
    zero_status r = stream_start(dev, st);
    if (r != ZERO_OK) {
        free(st);
        return r;
    }
    s->impl = st;
    return ZERO_OK;
}

void cpu_async_stream_destroy(zero_stream *s)
{
    if (!s->impl) return;
    stream_stop(s->dev->impl, s->impl); /* like CUDA: queued work still runs */
    s->impl = NULL;
}

zero_status cpu_async_stream_sync(zero_device *dev, zero_stream *s, const char *op)
{
    cpu_async *a = dev->impl;
    pthread_mutex_lock(&a->mu);
    zero_status st = drain_locked(dev, stream_of(a, s), op);
    pthread_mutex_unlock(&a->mu);
    return st;
}

zero_status cpu_async_device_sync(zero_device *dev)
{
    cpu_async *a = dev->impl;
    pthread_mutex_lock(&a->mu);
    zero_status st = ZERO_OK;
    for (cpu_stream_impl *it = a->streams; it && st == ZERO_OK; it = it->next)
        st = drain_locked(dev, it, "zero_device_sync");
    pthread_mutex_unlock(&a->mu);
    return st;
}

zero_status cpu_async_event_create(zero_device *dev, zero_event *e)
{
    cpu_event_impl *ev = calloc(1, sizeof *ev);
    if (!ev) return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "zero_event_create(cpu async): out of host memory");
    ev->refs = 1;
    e->impl = ev;
    return ZERO_OK;
}

void cpu_async_event_destroy(zero_event *e)
{
    cpu_async *a = e->dev->impl;
    pthread_mutex_lock(&a->mu);
    event_unref_locked(e->impl); /* ops still queued keep it alive */
    pthread_mutex_unlock(&a->mu);
    e->impl = NULL;
}

static zero_status queue_event_op(zero_device *dev, zero_stream *s, zero_event *e, op_kind kind)
{
    cpu_async *a = dev->impl;
    cpu_op *op = calloc(1, sizeof *op);
    if (!op) return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "cpu async: cannot queue an event op (out of host memory)");
    cpu_event_impl *ev = e->impl;
    op->kind = kind;
    op->ev = ev;
    pthread_mutex_lock(&a->mu);
    if (kind == OP_RECORD) {
        op->gen = ++ev->recorded;
    } else {
        op->gen = ev->recorded; /* the latest record at the time of the call */
        if (ev->completed >= op->gen) {
            pthread_mutex_unlock(&a->mu);
            free(op);
            return ZERO_OK; /* nothing to wait for */
        }
    }
    ev->refs++;
    zero_status st = enqueue(dev, stream_of(a, s), op);
    pthread_mutex_unlock(&a->mu);
    return st;
}

zero_status cpu_async_event_record(zero_device *dev, zero_event *e, zero_stream *s)
{
    return queue_event_op(dev, s, e, OP_RECORD);
}

zero_status cpu_async_stream_wait_event(zero_device *dev, zero_stream *s, zero_event *e)
{
    return queue_event_op(dev, s, e, OP_WAIT);
}

zero_status cpu_async_event_sync(zero_device *dev, zero_event *e)
{
    cpu_async *a = dev->impl;
    cpu_event_impl *ev = e->impl;
    pthread_mutex_lock(&a->mu);
    uint64_t target = ev->recorded;
    struct timespec dl = deadline_after(a->timeout_s);
    zero_status st = ZERO_OK;
    while (ev->completed < target) {
        if (pthread_cond_timedwait(&a->progress, &a->mu, &dl) == ETIMEDOUT && ev->completed < target) {
            st = zero_fail(&dev->err, ZERO_TIMEOUT,
                           "zero_event_sync(cpu async): the event's record did not run within %g s "
                           "(ZERO_CPU_ASYNC_TIMEOUT_S)", a->timeout_s);
            break;
        }
    }
    pthread_mutex_unlock(&a->mu);
    return st;
}

int cpu_async_event_done(zero_event *e)
{
    cpu_async *a = e->dev->impl;
    cpu_event_impl *ev = e->impl;
    pthread_mutex_lock(&a->mu);
    int done = ev->completed >= ev->recorded;
    pthread_mutex_unlock(&a->mu);
    return done;
}
