/* The CPU device: host memory, synchronous "streams", and the element-wise
 * kernels the engine's CPU path trains with.
 *
 * Every op completes before it returns, so streams and events are ordering
 * tokens only. Kernels are plain loops the compiler vectorizes; large ones
 * are split over OpenMP threads. Elementwise results do not depend on the
 * thread count; the sum of squares is made independent of it too (fixed
 * chunks, summed in order). */
#include <stdlib.h>
#include <string.h>

#include "convert_impl.h"
#include "device_internal.h"

/* Below this many elements a parallel region costs more than it saves. */
#if ZERO_HAVE_OPENMP
#define PAR_FOR_SIMD _Pragma("omp parallel for simd schedule(static) if(n >= 65536)")
#define PAR_FOR _Pragma("omp parallel for schedule(static) if(nchunks >= 16)")
#define SIMD_SUM_ACC _Pragma("omp simd reduction(+ : acc)")
#else
#define PAR_FOR_SIMD
#define PAR_FOR
#define SIMD_SUM_ACC
#endif

/* ---------------------------------------------------------------- memory */

static zero_status cpu_open(zero_device *dev, int ordinal)
{
    (void)dev;
    (void)ordinal;
    return ZERO_OK;
}

static void cpu_close(zero_device *dev) { (void)dev; }

static zero_status aligned(zero_device *dev, size_t bytes, size_t align, void **out, const char *op)
{
    /* Round up so the tail of the last vector is readable as a whole. */
    size_t rounded = (bytes + align - 1) / align * align;
    if (rounded < bytes || posix_memalign(out, align, rounded) != 0) {
        *out = NULL;
        return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of host memory",
                         op, bytes);
    }
    return ZERO_OK;
}

static zero_status cpu_alloc(zero_device *dev, size_t bytes, void **out)
{
    return aligned(dev, bytes, ZERO_DEVICE_ALIGN, out, "zero_device_alloc(cpu)");
}

static zero_status cpu_alloc_pinned(zero_device *dev, size_t bytes, void **out)
{
    return aligned(dev, bytes, ZERO_HOST_ALIGN, out, "zero_host_alloc_pinned(cpu)");
}

static void cpu_free(zero_device *dev, void *ptr)
{
    (void)dev;
    free(ptr);
}

/* ---------------------------------------------------------------- streams, events */

static zero_status cpu_stream_create(zero_device *dev, zero_stream *s)
{
    (void)dev;
    (void)s;
    return ZERO_OK;
}

static void cpu_stream_destroy(zero_stream *s) { (void)s; }

static zero_status cpu_stream_sync(zero_device *dev, zero_stream *s)
{
    (void)dev;
    (void)s;
    return ZERO_OK;
}

static zero_status cpu_device_sync(zero_device *dev)
{
    (void)dev;
    return ZERO_OK;
}

static zero_status cpu_event_create(zero_device *dev, zero_event *e)
{
    (void)dev;
    (void)e;
    return ZERO_OK;
}

static void cpu_event_destroy(zero_event *e) { (void)e; }

static zero_status cpu_event_record(zero_device *dev, zero_event *e, zero_stream *s)
{
    (void)dev;
    (void)e;
    (void)s;
    return ZERO_OK;
}

static zero_status cpu_stream_wait_event(zero_device *dev, zero_stream *s, zero_event *e)
{
    (void)dev;
    (void)s;
    (void)e;
    return ZERO_OK;
}

static zero_status cpu_event_sync(zero_device *dev, zero_event *e)
{
    (void)dev;
    (void)e;
    return ZERO_OK;
}

/* Work before a record has always finished on the CPU (like CUDA, an event
 * never recorded also counts as done). */
static zero_status cpu_event_query(zero_device *dev, zero_event *e, int *done)
{
    (void)dev;
    (void)e;
    *done = 1;
    return ZERO_OK;
}

/* ---------------------------------------------------------------- copies */

static zero_status cpu_memcpy(zero_device *dev, void *dst, const void *src, size_t bytes)
{
    (void)dev;
    memmove(dst, src, bytes); /* overlap is harmless here, so allow it */
    return ZERO_OK;
}

static zero_status cpu_memcpy_async(zero_device *dev, void *dst, const void *src, size_t bytes,
                                    zero_stream *s)
{
    (void)s;
    return cpu_memcpy(dev, dst, src, bytes);
}

/* ---------------------------------------------------------------- kernels */

static zero_status cpu_fill(zero_device *dev, void *x, zero_dtype dt, size_t n, float value,
                            zero_stream *s)
{
    (void)dev;
    (void)s;
    if (dt == ZERO_F32) {
        float *p = x;
        PAR_FOR_SIMD
        for (size_t i = 0; i < n; i++) p[i] = value;
    } else {
        uint16_t bits = dt == ZERO_F16 ? zero_cvt_f32_to_f16(value) : zero_cvt_f32_to_bf16(value);
        uint16_t *p = x;
        PAR_FOR_SIMD
        for (size_t i = 0; i < n; i++) p[i] = bits;
    }
    return ZERO_OK;
}

static zero_status cpu_scale(zero_device *dev, void *x, zero_dtype dt, size_t n, float alpha,
                             zero_stream *s)
{
    (void)dev;
    (void)s;
    if (dt == ZERO_F32) {
        float *p = x;
        PAR_FOR_SIMD
        for (size_t i = 0; i < n; i++) p[i] *= alpha;
    } else if (dt == ZERO_F16) {
        uint16_t *p = x;
        PAR_FOR_SIMD
        for (size_t i = 0; i < n; i++) p[i] = zero_cvt_f32_to_f16(zero_cvt_f16_to_f32(p[i]) * alpha);
    } else {
        uint16_t *p = x;
        PAR_FOR_SIMD
        for (size_t i = 0; i < n; i++) p[i] = zero_cvt_f32_to_bf16(zero_cvt_bf16_to_f32(p[i]) * alpha);
    }
    return ZERO_OK;
}

/* y + alpha * x with two roundings (no fused multiply-add), so every backend
 * and every compiler gives the same bits. */
static zero_status cpu_axpy(zero_device *dev, float alpha, const void *x, void *y, zero_dtype dt,
                            size_t n, zero_stream *s)
{
    (void)dev;
    (void)s;
    if (dt == ZERO_F32) {
        const float *xp = x;
        float *yp = y;
        PAR_FOR_SIMD
        for (size_t i = 0; i < n; i++) {
            float t = alpha * xp[i];
            yp[i] = yp[i] + t;
        }
    } else if (dt == ZERO_F16) {
        const uint16_t *xp = x;
        uint16_t *yp = y;
        PAR_FOR_SIMD
        for (size_t i = 0; i < n; i++) {
            float t = alpha * zero_cvt_f16_to_f32(xp[i]);
            yp[i] = zero_cvt_f32_to_f16(zero_cvt_f16_to_f32(yp[i]) + t);
        }
    } else {
        const uint16_t *xp = x;
        uint16_t *yp = y;
        PAR_FOR_SIMD
        for (size_t i = 0; i < n; i++) {
            float t = alpha * zero_cvt_bf16_to_f32(xp[i]);
            yp[i] = zero_cvt_f32_to_bf16(zero_cvt_bf16_to_f32(yp[i]) + t);
        }
    }
    return ZERO_OK;
}

static zero_status cpu_cast(zero_device *dev, const void *src, zero_dtype sdt, void *dst, zero_dtype ddt,
                            size_t n, zero_stream *s)
{
    (void)s;
    if (sdt == ddt) return cpu_memcpy(dev, dst, src, n * zero_dtype_size(sdt));
    if (sdt == ZERO_F32) {
        const float *a = src;
        uint16_t *b = dst;
        if (ddt == ZERO_F16) {
            PAR_FOR_SIMD
            for (size_t i = 0; i < n; i++) b[i] = zero_cvt_f32_to_f16(a[i]);
        } else {
            PAR_FOR_SIMD
            for (size_t i = 0; i < n; i++) b[i] = zero_cvt_f32_to_bf16(a[i]);
        }
    } else if (ddt == ZERO_F32) {
        const uint16_t *a = src;
        float *b = dst;
        if (sdt == ZERO_F16) {
            PAR_FOR_SIMD
            for (size_t i = 0; i < n; i++) b[i] = zero_cvt_f16_to_f32(a[i]);
        } else {
            PAR_FOR_SIMD
            for (size_t i = 0; i < n; i++) b[i] = zero_cvt_bf16_to_f32(a[i]);
        }
    } else {
        /* f16 <-> bf16 through f32: the widening is exact, so one rounding. */
        const uint16_t *a = src;
        uint16_t *b = dst;
        if (sdt == ZERO_F16) {
            PAR_FOR_SIMD
            for (size_t i = 0; i < n; i++) b[i] = zero_cvt_f32_to_bf16(zero_cvt_f16_to_f32(a[i]));
        } else {
            PAR_FOR_SIMD
            for (size_t i = 0; i < n; i++) b[i] = zero_cvt_f32_to_f16(zero_cvt_bf16_to_f32(a[i]));
        }
    }
    return ZERO_OK;
}

/* Sum of squares of one chunk, in double (an f32 squared is exact in double). */
static double chunk_sumsq(const void *x, zero_dtype dt, size_t begin, size_t end)
{
    double acc = 0.0;
    if (dt == ZERO_F32) {
        const float *p = x;
        SIMD_SUM_ACC
        for (size_t i = begin; i < end; i++) acc += (double)p[i] * (double)p[i];
    } else if (dt == ZERO_F16) {
        const uint16_t *p = x;
        SIMD_SUM_ACC
        for (size_t i = begin; i < end; i++) {
            double v = zero_cvt_f16_to_f32(p[i]);
            acc += v * v;
        }
    } else {
        const uint16_t *p = x;
        SIMD_SUM_ACC
        for (size_t i = begin; i < end; i++) {
            double v = zero_cvt_bf16_to_f32(p[i]);
            acc += v * v;
        }
    }
    return acc;
}

static zero_status cpu_sumsq(zero_device *dev, const void *x, zero_dtype dt, size_t n, double *out,
                             int *nonfinite, zero_stream *s)
{
    (void)s;
    size_t nchunks = (n + ZERO_SUMSQ_CHUNK - 1) / ZERO_SUMSQ_CHUNK;
    double stack_part[64];
    double *part = nchunks <= 64 ? stack_part : malloc(nchunks * sizeof *part);
    if (!part)
        return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "zero_sumsq(cpu): cannot allocate %zu partial sums",
                         nchunks);
    PAR_FOR
    for (size_t c = 0; c < nchunks; c++) {
        size_t end = (c + 1) * ZERO_SUMSQ_CHUNK;
        part[c] = chunk_sumsq(x, dt, c * ZERO_SUMSQ_CHUNK, end < n ? end : n);
    }
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) total += part[c];
    if (part != stack_part) free(part);
    /* Any inf or NaN element makes the sum inf or NaN (squares are never
     * negative, so infinities cannot cancel), and a finite sum of at most
     * SIZE_MAX squares of values below FLT_MAX cannot overflow a double:
     * the flag is exactly "the sum is not finite". */
    *out = total;
    *nonfinite = !(total - total == 0.0);
    return ZERO_OK;
}

/* ---------------------------------------------------------------- table */

const zero_device_ops zero_cpu_device_ops = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .alloc_pinned = cpu_alloc_pinned,
    .free_pinned = cpu_free,
    .host_register = NULL,
    .host_unregister = NULL,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .device_sync = cpu_device_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_sync = cpu_event_sync,
    .event_query = cpu_event_query,
    .memcpy_sync = cpu_memcpy,
    .memcpy_async = cpu_memcpy_async,
    .fill = cpu_fill,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .cast = cpu_cast,
    .sumsq = cpu_sumsq,
};
