/* The device layer: memory, copies, streams and events on the CPU or a CUDA
 * GPU behind one interface, and the dtype cast a trainer needs. (The other
 * element-wise kernels and NUMA-local host memory are in the experimental
 * surface, zero/experimental.h.)
 *
 * On the CPU, streams are ordering tokens and every op completes before it
 * returns, unless ZERO_CPU_ASYNC=1 was set when the device was opened: then,
 * as on CUDA, kernels and *_async ops are enqueued on the given stream (NULL =
 * the device's default stream) and complete in stream order; only events,
 * syncs and the calls documented as finished on return order them across
 * streams and with the host (docs/device.md).
 *
 * Pointers: "device memory" is memory of the zero_device (plain host memory
 * for the CPU device). Pinned and NUMA-local host memory is host memory that a
 * CUDA device can copy asynchronously from. */
#ifndef ZERO_DEVICE_H
#define ZERO_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include <zero/dtype.h>
#include <zero/export.h>
#include <zero/status.h>

ZERO_EXTERN_C_BEGIN

typedef struct zero_device zero_device;
typedef struct zero_stream zero_stream;
typedef struct zero_event zero_event;

typedef enum zero_device_kind {
    ZERO_DEVICE_CPU = 0,
    ZERO_DEVICE_CUDA = 1,
} zero_device_kind;

/* Open a device. For CUDA, `ordinal` selects the GPU (-1: local rank modulo
 * the device count). ZERO_UNSUPPORTED when built without CUDA or no GPU is
 * present, with a message saying which. */
ZERO_API zero_status zero_device_create(zero_device **out, zero_device_kind kind, int ordinal);
ZERO_API void zero_device_destroy(zero_device *dev); /* NULL accepted */
ZERO_API zero_device_kind zero_device_get_kind(const zero_device *dev);
ZERO_API int zero_device_get_ordinal(const zero_device *dev);
/* 1 when this build can open CUDA devices and at least one is present. */
ZERO_API int zero_cuda_available(void);
ZERO_API const char *zero_device_last_error(const zero_device *dev);

/* ------------------------------------------------------------ memory
 * Device allocations are aligned to at least 256 bytes, pinned and NUMA host
 * allocations to 4096 (a page: usable for O_DIRECT I/O too). A request for 0
 * bytes is ZERO_INVALID_ARGUMENT (there would be no pointer to own). Free
 * functions accept NULL. */
ZERO_API zero_status zero_device_alloc(zero_device *dev, size_t bytes, void **out);
ZERO_API void zero_device_free(zero_device *dev, void *ptr);
/* Page-locked host memory (plain aligned memory on the CPU device). */
ZERO_API zero_status zero_host_alloc_pinned(zero_device *dev, size_t bytes, void **out);
ZERO_API void zero_host_free_pinned(zero_device *dev, void *ptr);

/* ------------------------------------------------------------ streams, events
 * A stream argument may be NULL (the device's default stream) wherever a
 * stream is optional; it must belong to the device it is used with
 * (ZERO_INVALID_ARGUMENT otherwise). An event never recorded counts as done.
 * zero_stream_sync needs a real stream: use zero_device_sync for the default. */
ZERO_API zero_status zero_stream_create(zero_device *dev, zero_stream **out);
ZERO_API void zero_stream_destroy(zero_stream *stream);
ZERO_API zero_status zero_stream_sync(zero_stream *stream);
ZERO_API zero_status zero_device_sync(zero_device *dev);
ZERO_API zero_status zero_event_create(zero_device *dev, zero_event **out);
ZERO_API void zero_event_destroy(zero_event *event);
ZERO_API zero_status zero_event_record(zero_event *event, zero_stream *stream);
/* Make `stream` wait for `event` without blocking the host. */
ZERO_API zero_status zero_stream_wait_event(zero_stream *stream, zero_event *event);
ZERO_API zero_status zero_event_sync(zero_event *event);
/* *done = 1 when the work before the record has finished. */
ZERO_API zero_status zero_event_query(zero_event *event, int *done);

/* ------------------------------------------------------------ copies
 * Direction is inferred (CUDA unified addressing); host<->host works too.
 * zero_memcpy has finished when it returns (the bytes are at dst); it does
 * not wait for work queued on other streams, so synchronize those first.
 * Copies of 0 bytes succeed and touch nothing. */
ZERO_API zero_status zero_memcpy(zero_device *dev, void *dst, const void *src, size_t bytes);
ZERO_API zero_status zero_memcpy_async(zero_device *dev, void *dst, const void *src, size_t bytes,
                                       zero_stream *stream);

/* ------------------------------------------------------------ casts
 * Element-wise over n elements of device memory, enqueued on `stream`: the
 * one kernel a trainer needs (its compute-dtype tensors to and from fp32).
 * f32, f16, bf16 (each value rounded once to nearest even), so the CPU and
 * CUDA devices give the same bits. A dtype that is not a zero_dtype is
 * ZERO_INVALID_ARGUMENT, a non-floating one ZERO_UNSUPPORTED. n == 0
 * succeeds and touches nothing (pointers may then be NULL). The other
 * element-wise kernels are experimental (zero/experimental.h). */
/* dst[i] = (dst_dtype) src[i]; narrowing float casts round to nearest even,
 * NaN stays NaN (quiet), overflow goes to infinity, f16 subnormals are exact.
 * src and dst must not overlap, except src == dst with equal dtypes (a no-op). */
ZERO_API zero_status zero_cast(zero_device *dev, const void *src, zero_dtype src_dtype, void *dst,
                               zero_dtype dst_dtype, size_t n, zero_stream *stream);
/* ------------------------------------------------------------ scalar conversions
 * The host reference of the device casts, usable anywhere. */
ZERO_API uint16_t zero_f32_to_bf16(float x);
ZERO_API float zero_bf16_to_f32(uint16_t x);
ZERO_API uint16_t zero_f32_to_f16(float x);
ZERO_API float zero_f16_to_f32(uint16_t x);

ZERO_EXTERN_C_END

#endif
