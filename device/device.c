/* The device layer's public entry points: argument checks, error messages
 * that name the op and the parameter, and dispatch to the backend. */
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"
#include "topo_internal.h"

/* ---------------------------------------------------------------- open/close */

zero_status zero_device_create(zero_device **out, zero_device_kind kind, int ordinal)
{
    if (!out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_device_create: out is NULL");
    *out = NULL;
    const zero_device_ops *ops = NULL;
    switch (kind) {
    case ZERO_DEVICE_CPU:
        if (ordinal != 0 && ordinal != -1)
            return zero_fail(NULL, ZERO_INVALID_ARGUMENT,
                             "zero_device_create: the CPU device has ordinal 0 (or -1), got %d", ordinal);
        ops = &zero_cpu_device_ops;
        break;
    case ZERO_DEVICE_CUDA:
#if ZERO_HAVE_CUDA
        ops = &zero_cuda_device_ops;
        break;
#else
        return zero_fail(NULL, ZERO_UNSUPPORTED,
                         "zero_device_create: libzero was built without CUDA (meson -Dcuda=enabled "
                         "needs nvcc); use ZERO_DEVICE_CPU");
#endif
    default:
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_device_create: unknown device kind %d",
                         (int)kind);
    }
    zero_device *dev = calloc(1, sizeof *dev);
    if (!dev) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_device_create: out of host memory");
    dev->ops = ops;
    dev->kind = kind;
    dev->ordinal = kind == ZERO_DEVICE_CPU ? 0 : ordinal;
    zero_status st = ops->open(dev, ordinal);
    if (st != ZERO_OK) {
        free(dev); /* the backend left its message on this thread */
        return st;
    }
    pthread_mutex_init(&dev->topo_mu, NULL);
    *out = dev;
    return ZERO_OK;
}

void zero_device_destroy(zero_device *dev)
{
    if (!dev) return;
    dev->ops->close(dev);
#if ZERO_HAVE_HWLOC
    if (dev->hwtopo) zero_topo_shared_release();
#endif
    pthread_mutex_destroy(&dev->topo_mu);
    free(dev);
}

zero_device_kind zero_device_get_kind(const zero_device *dev)
{
    return dev ? dev->kind : ZERO_DEVICE_CPU;
}

int zero_device_get_ordinal(const zero_device *dev)
{
    return dev ? dev->ordinal : -1;
}

int zero_cuda_available(void)
{
#if ZERO_HAVE_CUDA
    return zero_cuda_device_count_() > 0;
#else
    return 0;
#endif
}

const char *zero_device_last_error(const zero_device *dev)
{
    return dev ? dev->err.msg : "zero_device_last_error: device is NULL";
}

/* ---------------------------------------------------------------- checks */

#define CHECK_DEV(op)                                                                  \
    do {                                                                               \
        if (!dev) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, op ": device is NULL"); \
    } while (0)

/* A stream argument may be NULL (the default stream) but must belong to dev. */
static zero_status check_stream(zero_device *dev, const zero_stream *s, const char *op)
{
    if (s && s->dev != dev)
        return zero_fail(&dev->err, ZERO_INVALID_ARGUMENT,
                         "%s: the stream belongs to another device (%s %d, not %s %d)", op,
                         s->dev->ops->name, s->dev->ordinal, dev->ops->name, dev->ordinal);
    return ZERO_OK;
}

static int is_dtype(zero_dtype dt) { return zero_dtype_size(dt) != 0; }
static int is_float_dtype(zero_dtype dt) { return dt == ZERO_F32 || dt == ZERO_F16 || dt == ZERO_BF16; }

static zero_status check_float_dtype(zero_device *dev, zero_dtype dt, const char *op, const char *param)
{
    if (!is_dtype(dt))
        return zero_fail(&dev->err, ZERO_INVALID_ARGUMENT, "%s: %s %d is not a zero_dtype", op, param,
                         (int)dt);
    if (!is_float_dtype(dt))
        return zero_fail(&dev->err, ZERO_UNSUPPORTED,
                         "%s: %s %s is not supported (f32, f16 and bf16 are)", op, param,
                         zero_dtype_name(dt));
    return ZERO_OK;
}

/* n elements of dt must fit in size_t bytes. */
static zero_status check_count(zero_device *dev, zero_dtype dt, size_t n, const char *op)
{
    if (n > SIZE_MAX / zero_dtype_size(dt))
        return zero_fail(&dev->err, ZERO_INVALID_ARGUMENT, "%s: n = %zu elements of %s overflows size_t",
                         op, n, zero_dtype_name(dt));
    return ZERO_OK;
}

#define CHECK_PTR(p, op, name)                                                          \
    do {                                                                                \
        if (!(p))                                                                       \
            return zero_fail(&dev->err, ZERO_INVALID_ARGUMENT, op ": " name " is NULL"); \
    } while (0)

/* ---------------------------------------------------------------- memory */

static zero_status check_alloc(zero_device *dev, size_t bytes, void **out, const char *op)
{
    if (!out) return zero_fail(&dev->err, ZERO_INVALID_ARGUMENT, "%s: out is NULL", op);
    *out = NULL;
    if (bytes == 0)
        return zero_fail(&dev->err, ZERO_INVALID_ARGUMENT,
                         "%s: bytes is 0 (a zero-byte allocation has no pointer to own)", op);
    return ZERO_OK;
}

zero_status zero_device_alloc(zero_device *dev, size_t bytes, void **out)
{
    CHECK_DEV("zero_device_alloc");
    ZERO_TRY(check_alloc(dev, bytes, out, "zero_device_alloc"));
    return dev->ops->alloc(dev, bytes, out);
}

void zero_device_free(zero_device *dev, void *ptr)
{
    if (dev && ptr) dev->ops->free(dev, ptr);
}

zero_status zero_host_alloc_pinned(zero_device *dev, size_t bytes, void **out)
{
    CHECK_DEV("zero_host_alloc_pinned");
    ZERO_TRY(check_alloc(dev, bytes, out, "zero_host_alloc_pinned"));
    return dev->ops->alloc_pinned(dev, bytes, out);
}

void zero_host_free_pinned(zero_device *dev, void *ptr)
{
    if (dev && ptr) dev->ops->free_pinned(dev, ptr);
}

zero_status zero_host_alloc_numa(zero_device *dev, size_t bytes, void **out)
{
    CHECK_DEV("zero_host_alloc_numa");
    ZERO_TRY(check_alloc(dev, bytes, out, "zero_host_alloc_numa"));
    return zero_numa_alloc_(dev, bytes, out);
}

void zero_host_free_numa(zero_device *dev, void *ptr, size_t bytes)
{
    if (dev && ptr) zero_numa_free_(dev, ptr, bytes);
}

/* ---------------------------------------------------------------- streams, events */

zero_status zero_stream_create(zero_device *dev, zero_stream **out)
{
    CHECK_DEV("zero_stream_create");
    CHECK_PTR(out, "zero_stream_create", "out");
    *out = NULL;
    zero_stream *s = calloc(1, sizeof *s);
    if (!s) return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "zero_stream_create: out of host memory");
    s->dev = dev;
    s->owned = 1;
    zero_status st = dev->ops->stream_create(dev, s);
    if (st != ZERO_OK) {
        free(s);
        return st;
    }
    *out = s;
    return ZERO_OK;
}

void zero_stream_destroy(zero_stream *s)
{
    if (!s) return;
    if (s->owned) s->dev->ops->stream_destroy(s);
    free(s);
}

zero_status zero_stream_sync(zero_stream *s)
{
    if (!s)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT,
                         "zero_stream_sync: stream is NULL (use zero_device_sync for the default stream)");
    return s->dev->ops->stream_sync(s->dev, s);
}

zero_status zero_device_sync(zero_device *dev)
{
    CHECK_DEV("zero_device_sync");
    return dev->ops->device_sync(dev);
}

zero_status zero_event_create(zero_device *dev, zero_event **out)
{
    CHECK_DEV("zero_event_create");
    CHECK_PTR(out, "zero_event_create", "out");
    *out = NULL;
    zero_event *e = calloc(1, sizeof *e);
    if (!e) return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "zero_event_create: out of host memory");
    e->dev = dev;
    zero_status st = dev->ops->event_create(dev, e);
    if (st != ZERO_OK) {
        free(e);
        return st;
    }
    *out = e;
    return ZERO_OK;
}

void zero_event_destroy(zero_event *e)
{
    if (!e) return;
    e->dev->ops->event_destroy(e);
    free(e);
}

zero_status zero_event_record(zero_event *e, zero_stream *s)
{
    if (!e) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_event_record: event is NULL");
    ZERO_TRY(check_stream(e->dev, s, "zero_event_record"));
    return e->dev->ops->event_record(e->dev, e, s);
}

zero_status zero_stream_wait_event(zero_stream *s, zero_event *e)
{
    if (!e) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_stream_wait_event: event is NULL");
    ZERO_TRY(check_stream(e->dev, s, "zero_stream_wait_event"));
    return e->dev->ops->stream_wait_event(e->dev, s, e);
}

zero_status zero_event_sync(zero_event *e)
{
    if (!e) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_event_sync: event is NULL");
    return e->dev->ops->event_sync(e->dev, e);
}

zero_status zero_event_query(zero_event *e, int *done)
{
    if (!e) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_event_query: event is NULL");
    if (!done) return zero_fail(&e->dev->err, ZERO_INVALID_ARGUMENT, "zero_event_query: done is NULL");
    return e->dev->ops->event_query(e->dev, e, done);
}

/* ---------------------------------------------------------------- copies */

zero_status zero_memcpy(zero_device *dev, void *dst, const void *src, size_t bytes)
{
    CHECK_DEV("zero_memcpy");
    if (bytes == 0) return ZERO_OK;
    CHECK_PTR(dst, "zero_memcpy", "dst");
    CHECK_PTR(src, "zero_memcpy", "src");
    return dev->ops->memcpy_sync(dev, dst, src, bytes);
}

zero_status zero_memcpy_async(zero_device *dev, void *dst, const void *src, size_t bytes,
                              zero_stream *stream)
{
    CHECK_DEV("zero_memcpy_async");
    ZERO_TRY(check_stream(dev, stream, "zero_memcpy_async"));
    if (bytes == 0) return ZERO_OK;
    CHECK_PTR(dst, "zero_memcpy_async", "dst");
    CHECK_PTR(src, "zero_memcpy_async", "src");
    return dev->ops->memcpy_async(dev, dst, src, bytes, stream);
}

/* ---------------------------------------------------------------- kernels */

zero_status zero_fill_value(zero_device *dev, void *x, zero_dtype dtype, size_t n, float value,
                      zero_stream *stream)
{
    CHECK_DEV("zero_fill_value");
    ZERO_TRY(check_stream(dev, stream, "zero_fill_value"));
    ZERO_TRY(check_float_dtype(dev, dtype, "zero_fill_value", "dtype"));
    if (n == 0) return ZERO_OK;
    ZERO_TRY(check_count(dev, dtype, n, "zero_fill_value"));
    CHECK_PTR(x, "zero_fill_value", "x");
    return dev->ops->fill(dev, x, dtype, n, value, stream);
}

zero_status zero_scale(zero_device *dev, void *x, zero_dtype dtype, size_t n, float alpha,
                       zero_stream *stream)
{
    CHECK_DEV("zero_scale");
    ZERO_TRY(check_stream(dev, stream, "zero_scale"));
    ZERO_TRY(check_float_dtype(dev, dtype, "zero_scale", "dtype"));
    if (n == 0) return ZERO_OK;
    ZERO_TRY(check_count(dev, dtype, n, "zero_scale"));
    CHECK_PTR(x, "zero_scale", "x");
    return dev->ops->scale(dev, x, dtype, n, alpha, stream);
}

zero_status zero_axpy(zero_device *dev, float alpha, const void *x, void *y, zero_dtype dtype, size_t n,
                      zero_stream *stream)
{
    CHECK_DEV("zero_axpy");
    ZERO_TRY(check_stream(dev, stream, "zero_axpy"));
    ZERO_TRY(check_float_dtype(dev, dtype, "zero_axpy", "dtype"));
    if (n == 0) return ZERO_OK;
    ZERO_TRY(check_count(dev, dtype, n, "zero_axpy"));
    CHECK_PTR(x, "zero_axpy", "x");
    CHECK_PTR(y, "zero_axpy", "y");
    return dev->ops->axpy(dev, alpha, x, y, dtype, n, stream);
}

zero_status zero_cast(zero_device *dev, const void *src, zero_dtype src_dtype, void *dst,
                      zero_dtype dst_dtype, size_t n, zero_stream *stream)
{
    CHECK_DEV("zero_cast");
    ZERO_TRY(check_stream(dev, stream, "zero_cast"));
    ZERO_TRY(check_float_dtype(dev, src_dtype, "zero_cast", "src_dtype"));
    ZERO_TRY(check_float_dtype(dev, dst_dtype, "zero_cast", "dst_dtype"));
    if (n == 0) return ZERO_OK;
    ZERO_TRY(check_count(dev, src_dtype, n, "zero_cast"));
    ZERO_TRY(check_count(dev, dst_dtype, n, "zero_cast"));
    CHECK_PTR(src, "zero_cast", "src");
    CHECK_PTR(dst, "zero_cast", "dst");
    if (src == dst && src_dtype != dst_dtype)
        return zero_fail(&dev->err, ZERO_INVALID_ARGUMENT,
                         "zero_cast: src == dst with different dtypes (%s -> %s) cannot be done in place",
                         zero_dtype_name(src_dtype), zero_dtype_name(dst_dtype));
    if (src == dst) return ZERO_OK;
    return dev->ops->cast(dev, src, src_dtype, dst, dst_dtype, n, stream);
}

int zero_take_supported_(zero_device *dev) { return dev && dev->ops && dev->ops->take; }

zero_status zero_take_grad_(zero_device *dev, void *src, zero_dtype sdt, int clear, float *dst, int accumulate,
                            size_t n, zero_stream *stream)
{
    CHECK_DEV("zero_take_grad_");
    ZERO_TRY(check_stream(dev, stream, "zero_take_grad_"));
    ZERO_TRY(check_float_dtype(dev, sdt, "zero_take_grad_", "src_dtype"));
    if (n == 0) return ZERO_OK;
    ZERO_TRY(check_count(dev, sdt, n, "zero_take_grad_"));
    CHECK_PTR(src, "zero_take_grad_", "src");
    CHECK_PTR(dst, "zero_take_grad_", "dst");
    if (!dev->ops->take)
        return zero_fail(&dev->err, ZERO_UNSUPPORTED, "zero_take_grad_: not implemented on the %s device",
                         dev->ops->name);
    if ((const void *)src == (const void *)dst)
        return zero_fail(&dev->err, ZERO_INVALID_ARGUMENT, "zero_take_grad_: src == dst");
    return dev->ops->take(dev, src, sdt, clear, dst, accumulate, n, stream);
}

zero_status zero_sumsq(zero_device *dev, const void *x, zero_dtype dtype, size_t n, double *out,
                       int *nonfinite, zero_stream *stream)
{
    CHECK_DEV("zero_sumsq");
    ZERO_TRY(check_stream(dev, stream, "zero_sumsq"));
    ZERO_TRY(check_float_dtype(dev, dtype, "zero_sumsq", "dtype"));
    CHECK_PTR(out, "zero_sumsq", "out");
    *out = 0.0;
    if (nonfinite) *nonfinite = 0;
    if (n == 0) return ZERO_OK;
    ZERO_TRY(check_count(dev, dtype, n, "zero_sumsq"));
    CHECK_PTR(x, "zero_sumsq", "x");
    int nf = 0;
    zero_status st = dev->ops->sumsq(dev, x, dtype, n, out, &nf, stream);
    if (nonfinite) *nonfinite = nf;
    return st;
}
