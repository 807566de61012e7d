/* The CUDA device: plain C over the CUDA runtime, which it reaches through
 * the CUDA module's table (cuda_module.h: libzero itself does not link CUDA).
 * Memory, copies, streams and events map one to one onto the runtime; the
 * kernels are in cuda_kernels.cu, in the module.
 * Every op first makes the device's GPU current, so one thread may drive
 * several devices. */
#include <pthread.h>
#include <stdlib.h>

#include <zero/zero_cuda.h>

#include "cuda_module.h"
#include "device_internal.h"

typedef struct cuda_impl {
    /* Scratch for zero_sumsq: partial sums, the result and its host copy.
     * zero_sumsq synchronizes, so one set guarded by a mutex is enough. */
    pthread_mutex_t sumsq_mu;
    double *partials;
    void *result;      /* device: 1 double + 1 int */
    void *result_host; /* pinned twin */
} cuda_impl;

static cudaStream_t stream_of(const zero_stream *s)
{
    return s ? (cudaStream_t)s->impl : (cudaStream_t)0;
}

/* Map a CUDA error to a status and a message naming the op and the GPU.
 * cudaGetLastError clears a non-sticky error so it cannot leak into the
 * next call's report. */
static zero_status cuda_fail(zero_device *dev, cudaError_t e, const char *op, const char *call)
{
    (void)zero_cu->cudaGetLastError();
    zero_status st = e == cudaErrorMemoryAllocation ? ZERO_OUT_OF_MEMORY : ZERO_BACKEND;
    return zero_fail(&dev->err, st, "%s(cuda %d): %s: %s (%s)", op, dev->ordinal, call, zero_cu->cudaGetErrorString(e),
                     zero_cu->cudaGetErrorName(e));
}

/* CU(op, cudaFoo, (args)): call cudaFoo through the module's table; on an
 * error return the status, naming the call as written. */
#define CU(op, fn, args)                                                           \
    do {                                                                           \
        cudaError_t cu_e_ = zero_cu->fn args;                                      \
        if (cu_e_ != cudaSuccess) return cuda_fail(dev, cu_e_, op, #fn #args);     \
    } while (0)

#define SET_DEVICE(op) CU(op, cudaSetDevice, (dev->ordinal))

int zero_cuda_device_count_(void)
{
    /* Without the module no CUDA device is usable (the reason is left on this thread). */
    if (zero_cuda_load("zero_cuda_available") != ZERO_OK) return 0;
    int n = 0;
    cudaError_t e = zero_cu->cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)zero_cu->cudaGetLastError();
        return 0;
    }
    return n;
}

/* ---------------------------------------------------------------- open/close */

static zero_status cuda_open(zero_device *dev, int ordinal)
{
    ZERO_TRY(zero_cuda_load("zero_device_create"));
    int count = 0;
    cudaError_t e = zero_cu->cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        (void)zero_cu->cudaGetLastError();
        return zero_fail(NULL, ZERO_UNSUPPORTED, "zero_device_create: no usable CUDA device (cudaGetDeviceCount: %s)",
                         e != cudaSuccess ? zero_cu->cudaGetErrorString(e) : "0 devices");
    }
    if (ordinal == -1) {
        int local_rank;
        zero_local_rank_from_env(&local_rank, NULL);
        ordinal = local_rank % count;
    }
    if (ordinal < 0 || ordinal >= count)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_device_create: CUDA ordinal %d, but %d device%s present",
                         ordinal, count, count == 1 ? " is" : "s are");
    dev->ordinal = ordinal;
    cuda_impl *impl = calloc(1, sizeof *impl);
    if (!impl) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_device_create: out of host memory");
    pthread_mutex_init(&impl->sumsq_mu, NULL);
    zero_status st = ZERO_OK;
    if ((e = zero_cu->cudaSetDevice(ordinal)) != cudaSuccess ||
        (e = zero_cu->cudaMalloc((void **)&impl->partials, ZERO_CUDA_SUMSQ_BLOCKS * sizeof(double))) != cudaSuccess ||
        (e = zero_cu->cudaMalloc(&impl->result, 2 * sizeof(double))) != cudaSuccess ||
        (e = zero_cu->cudaMallocHost(&impl->result_host, 2 * sizeof(double))) != cudaSuccess) {
        (void)zero_cu->cudaGetLastError();
        st = zero_fail(NULL, ZERO_BACKEND, "zero_device_create(cuda %d): %s", ordinal, zero_cu->cudaGetErrorString(e));
        zero_cu->cudaFree(impl->partials);
        zero_cu->cudaFree(impl->result);
        pthread_mutex_destroy(&impl->sumsq_mu);
        free(impl);
        return st;
    }
    dev->impl = impl;
    return ZERO_OK;
}

static void cuda_close(zero_device *dev)
{
    cuda_impl *impl = dev->impl;
    if (!impl) return;
    zero_cu->cudaSetDevice(dev->ordinal);
    zero_cu->cudaFree(impl->partials);
    zero_cu->cudaFree(impl->result);
    zero_cu->cudaFreeHost(impl->result_host);
    pthread_mutex_destroy(&impl->sumsq_mu);
    free(impl);
    (void)zero_cu->cudaGetLastError();
}

/* ---------------------------------------------------------------- memory */

static zero_status cuda_alloc(zero_device *dev, size_t bytes, void **out)
{
    SET_DEVICE("zero_device_alloc");
    cudaError_t e = zero_cu->cudaMalloc(out, bytes); /* cudaMalloc aligns to >= 256 bytes */
    if (e == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        (void)zero_cu->cudaGetLastError();
        zero_cu->cudaMemGetInfo(&free_b, &total_b);
        *out = NULL;
        return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY,
                         "zero_device_alloc(cuda %d): %zu bytes requested, %zu of %zu free", dev->ordinal, bytes,
                         free_b, total_b);
    }
    if (e != cudaSuccess) {
        *out = NULL;
        return cuda_fail(dev, e, "zero_device_alloc", "cudaMalloc");
    }
    return ZERO_OK;
}

static void cuda_free(zero_device *dev, void *ptr)
{
    zero_cu->cudaSetDevice(dev->ordinal);
    zero_cu->cudaFree(ptr);
    (void)zero_cu->cudaGetLastError();
}

static zero_status cuda_alloc_pinned(zero_device *dev, size_t bytes, void **out)
{
    SET_DEVICE("zero_host_alloc_pinned");
    cudaError_t e = zero_cu->cudaHostAlloc(out, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        *out = NULL;
        return cuda_fail(dev, e, "zero_host_alloc_pinned", "cudaHostAlloc");
    }
    return ZERO_OK;
}

static void cuda_free_pinned(zero_device *dev, void *ptr)
{
    (void)dev;
    zero_cu->cudaFreeHost(ptr);
    (void)zero_cu->cudaGetLastError();
}

static zero_status cuda_host_register(zero_device *dev, void *ptr, size_t bytes)
{
    SET_DEVICE("zero_host_alloc_numa");
    CU("zero_host_alloc_numa", cudaHostRegister, (ptr, bytes, cudaHostRegisterPortable));
    return ZERO_OK;
}

static void cuda_host_unregister(zero_device *dev, void *ptr)
{
    (void)dev;
    zero_cu->cudaHostUnregister(ptr); /* fails harmlessly if registration had failed */
    (void)zero_cu->cudaGetLastError();
}

/* ---------------------------------------------------------------- streams, events */

static zero_status cuda_stream_create(zero_device *dev, zero_stream *s)
{
    SET_DEVICE("zero_stream_create");
    cudaStream_t cs;
    CU("zero_stream_create", cudaStreamCreateWithFlags, (&cs, cudaStreamNonBlocking));
    s->impl = cs;
    return ZERO_OK;
}

static void cuda_stream_destroy(zero_stream *s)
{
    zero_cu->cudaSetDevice(s->dev->ordinal);
    zero_cu->cudaStreamDestroy(stream_of(s));
    (void)zero_cu->cudaGetLastError();
}

static zero_status cuda_stream_sync(zero_device *dev, zero_stream *s)
{
    SET_DEVICE("zero_stream_sync");
    CU("zero_stream_sync", cudaStreamSynchronize, (stream_of(s)));
    return ZERO_OK;
}

static zero_status cuda_device_sync(zero_device *dev)
{
    SET_DEVICE("zero_device_sync");
    CU("zero_device_sync", cudaDeviceSynchronize, ());
    return ZERO_OK;
}

static zero_status cuda_event_create(zero_device *dev, zero_event *ev)
{
    SET_DEVICE("zero_event_create");
    cudaEvent_t ce;
    CU("zero_event_create", cudaEventCreateWithFlags, (&ce, cudaEventDisableTiming));
    ev->impl = ce;
    return ZERO_OK;
}

static void cuda_event_destroy(zero_event *ev)
{
    zero_cu->cudaEventDestroy((cudaEvent_t)ev->impl);
    (void)zero_cu->cudaGetLastError();
}

static zero_status cuda_event_record(zero_device *dev, zero_event *ev, zero_stream *s)
{
    SET_DEVICE("zero_event_record");
    CU("zero_event_record", cudaEventRecord, ((cudaEvent_t)ev->impl, stream_of(s)));
    return ZERO_OK;
}

static zero_status cuda_stream_wait_event(zero_device *dev, zero_stream *s, zero_event *ev)
{
    SET_DEVICE("zero_stream_wait_event");
    CU("zero_stream_wait_event", cudaStreamWaitEvent, (stream_of(s), (cudaEvent_t)ev->impl, 0));
    return ZERO_OK;
}

static zero_status cuda_event_sync(zero_device *dev, zero_event *ev)
{
    CU("zero_event_sync", cudaEventSynchronize, ((cudaEvent_t)ev->impl));
    return ZERO_OK;
}

static zero_status cuda_event_query(zero_device *dev, zero_event *ev, int *done)
{
    cudaError_t e = zero_cu->cudaEventQuery((cudaEvent_t)ev->impl);
    if (e == cudaErrorNotReady) {
        (void)zero_cu->cudaGetLastError();
        *done = 0;
        return ZERO_OK;
    }
    if (e != cudaSuccess) return cuda_fail(dev, e, "zero_event_query", "cudaEventQuery");
    *done = 1;
    return ZERO_OK;
}

/* ---------------------------------------------------------------- copies */

/* cudaMemcpy from pageable host memory may return before the DMA has landed
 * (it only waits for the staging copy), and kernels on our non-blocking
 * streams do not wait for the legacy stream: enqueue on the legacy stream and
 * synchronize it, so the bytes are at dst when this returns. */
static zero_status cuda_memcpy(zero_device *dev, void *dst, const void *src, size_t bytes)
{
    SET_DEVICE("zero_memcpy");
    CU("zero_memcpy", cudaMemcpyAsync, (dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)0));
    CU("zero_memcpy", cudaStreamSynchronize, ((cudaStream_t)0));
    return ZERO_OK;
}

static zero_status cuda_memcpy_async(zero_device *dev, void *dst, const void *src, size_t bytes, zero_stream *s)
{
    SET_DEVICE("zero_memcpy_async");
    CU("zero_memcpy_async", cudaMemcpyAsync, (dst, src, bytes, cudaMemcpyDefault, stream_of(s)));
    return ZERO_OK;
}

/* ---------------------------------------------------------------- kernels */

/* LAUNCH(op, zero_cuda_foo, (args)): a launcher of the module's kernels. */
#define LAUNCH(op, fn, args)                                                              \
    do {                                                                                  \
        SET_DEVICE(op);                                                                   \
        int launch_e_ = zero_cu->fn args;                                                 \
        if (launch_e_) return cuda_fail(dev, (cudaError_t)launch_e_, op, #fn #args);      \
        return ZERO_OK;                                                                   \
    } while (0)

static zero_status cuda_fill(zero_device *dev, void *x, zero_dtype dt, size_t n, float value, zero_stream *s)
{
    LAUNCH("zero_fill_value", zero_cuda_fill, (x, (int)dt, n, value, stream_of(s)));
}

static zero_status cuda_scale(zero_device *dev, void *x, zero_dtype dt, size_t n, float alpha, zero_stream *s)
{
    LAUNCH("zero_scale", zero_cuda_scale, (x, (int)dt, n, alpha, stream_of(s)));
}

static zero_status cuda_axpy(zero_device *dev, float alpha, const void *x, void *y, zero_dtype dt, size_t n,
                             zero_stream *s)
{
    LAUNCH("zero_axpy", zero_cuda_axpy, (alpha, x, y, (int)dt, n, stream_of(s)));
}

static zero_status cuda_cast(zero_device *dev, const void *src, zero_dtype sdt, void *dst, zero_dtype ddt, size_t n,
                             zero_stream *s)
{
    if (sdt == ddt) return cuda_memcpy_async(dev, dst, src, n * zero_dtype_size(sdt), s);
    LAUNCH("zero_cast", zero_cuda_cast, (src, (int)sdt, dst, (int)ddt, n, stream_of(s)));
}

static zero_status cuda_sumsq(zero_device *dev, const void *x, zero_dtype dt, size_t n, double *out, int *nonfinite,
                              zero_stream *s)
{
    cuda_impl *impl = dev->impl;
    SET_DEVICE("zero_sumsq");
    pthread_mutex_lock(&impl->sumsq_mu);
    cudaStream_t cs = stream_of(s);
    cudaError_t e = (cudaError_t)zero_cu->zero_cuda_sumsq(x, (int)dt, n, impl->partials, impl->result, cs);
    const char *call = "sumsq kernels";
    if (e == cudaSuccess) {
        call = "cudaMemcpyAsync";
        e = zero_cu->cudaMemcpyAsync(impl->result_host, impl->result, 2 * sizeof(double), cudaMemcpyDeviceToHost, cs);
    }
    if (e == cudaSuccess) {
        call = "cudaStreamSynchronize";
        e = zero_cu->cudaStreamSynchronize(cs);
    }
    if (e == cudaSuccess) {
        *out = ((const double *)impl->result_host)[0];
        *nonfinite = *(const int *)((const double *)impl->result_host + 1);
    }
    pthread_mutex_unlock(&impl->sumsq_mu);
    if (e != cudaSuccess) return cuda_fail(dev, e, "zero_sumsq", call);
    return ZERO_OK;
}

/* ---------------------------------------------------------------- zero_cuda.h */

cudaStream_t zero_stream_get_cuda(const zero_stream *stream)
{
    if (!stream || stream->dev->kind != ZERO_DEVICE_CUDA) return (cudaStream_t)0;
    return stream_of(stream);
}

zero_status zero_stream_wrap_cuda(zero_device *dev, cudaStream_t stream, zero_stream **out)
{
    if (!out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_stream_wrap_cuda: out is NULL");
    *out = NULL;
    if (!dev) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_stream_wrap_cuda: device is NULL");
    if (dev->kind != ZERO_DEVICE_CUDA)
        return zero_fail(&dev->err, ZERO_INVALID_ARGUMENT, "zero_stream_wrap_cuda: device is not a CUDA device");
    zero_stream *s = calloc(1, sizeof *s);
    if (!s) return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "zero_stream_wrap_cuda: out of host memory");
    s->dev = dev;
    s->impl = stream;
    s->owned = 0;
    *out = s;
    return ZERO_OK;
}

cudaEvent_t zero_event_get_cuda(const zero_event *event)
{
    if (!event || event->dev->kind != ZERO_DEVICE_CUDA) return (cudaEvent_t)0;
    return (cudaEvent_t)event->impl;
}

/* ---------------------------------------------------------------- table */

const zero_device_ops zero_cuda_device_ops = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .alloc_pinned = cuda_alloc_pinned,
    .free_pinned = cuda_free_pinned,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .device_sync = cuda_device_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_sync = cuda_event_sync,
    .event_query = cuda_event_query,
    .memcpy_sync = cuda_memcpy,
    .memcpy_async = cuda_memcpy_async,
    .fill = cuda_fill,
    .scale = cuda_scale,
    .axpy = cuda_axpy,
    .cast = cuda_cast,
    .sumsq = cuda_sumsq,
};
