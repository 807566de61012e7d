/* libzero's experimental surface: the plumbing behind the engine, for tools,
 * benchmarks and the adventurous. Unlike the rest of include/zero (the stable
 * surface, docs/abi.md), anything here may change or go in any minor release
 * without a major version bump, and it is not in the committed ABI dump
 * (abi/). Define ZERO_EXPERIMENTAL before including it to say you accept that.
 *
 *   zero/offload.h   host pool, NVMe store and swapper
 *   zero/topo.h      hwloc topology and the binding plan
 *   below            element-wise device kernels, NUMA-local host memory, CRC32C
 *
 * zero.h does not include this header. */
#ifndef ZERO_EXPERIMENTAL_H
#define ZERO_EXPERIMENTAL_H

#ifndef ZERO_EXPERIMENTAL
#error "zero/experimental.h is libzero's experimental surface (it may change in any minor release): define ZERO_EXPERIMENTAL to use it (docs/abi.md)"
#endif

#include <stddef.h>
#include <stdint.h>
#include <zero/device.h>
#include <zero/dtype.h>
#include <zero/export.h>
#include <zero/offload.h>
#include <zero/status.h>
#include <zero/topo.h>

ZERO_EXTERN_C_BEGIN

/* ------------------------------------------------------------ host memory
 * (device.h's allocation rules: 4096-aligned, 0 bytes refused, free accepts NULL) */
/* Host memory bound to the NUMA node nearest the device (or to the calling
 * thread's node on the CPU device), pinned for CUDA. Falls back to unbound
 * memory, with one warning, where binding is not possible. */
ZERO_API zero_status zero_host_alloc_numa(zero_device *dev, size_t bytes, void **out);
ZERO_API void zero_host_free_numa(zero_device *dev, void *ptr, size_t bytes);

/* ------------------------------------------------------------ kernels
 * Element-wise over n elements of device memory, enqueued on `stream`.
 * Floating dtypes: f32, f16, bf16 (computed in fp32, each f32 operation
 * rounded once, no fused multiply-add, then rounded to the dtype to nearest
 * even), so the CPU and CUDA devices give the same bits. A dtype that is not
 * a zero_dtype is ZERO_INVALID_ARGUMENT, a non-floating one ZERO_UNSUPPORTED.
 * n == 0 succeeds and touches nothing (pointers may then be NULL). */

/* x[i] = value */
ZERO_API zero_status zero_fill_value(zero_device *dev, void *x, zero_dtype dtype, size_t n, float value,
                               zero_stream *stream);
/* x[i] *= alpha */
ZERO_API zero_status zero_scale(zero_device *dev, void *x, zero_dtype dtype, size_t n, float alpha,
                                zero_stream *stream);
/* y[i] += alpha * x[i]  (x and y of the same dtype) */
ZERO_API zero_status zero_axpy(zero_device *dev, float alpha, const void *x, void *y, zero_dtype dtype,
                               size_t n, zero_stream *stream);
/* *out = sum of x[i]^2 accumulated in double; synchronizes `stream`.
 * Also reports whether any element is inf or NaN (may be NULL). The result
 * is deterministic for a given device kind and n (fixed summation order, not
 * dependent on the thread count); CPU and CUDA agree to within n * 2^-52
 * relative, not bitwise. */
ZERO_API zero_status zero_sumsq(zero_device *dev, const void *x, zero_dtype dtype, size_t n, double *out,
                                int *nonfinite, zero_stream *stream);

/* ------------------------------------------------------------ checksums */
/* CRC32C (Castagnoli) of n bytes, continuing from `crc` (0 to start). */
ZERO_API uint32_t zero_crc32c(uint32_t crc, const void *data, size_t n);

ZERO_EXTERN_C_END

#endif
