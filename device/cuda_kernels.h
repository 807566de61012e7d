/* Internal: launchers for the CUDA element-wise kernels (cuda_kernels.cu),
 * callable from plain C. They live in the CUDA module (cuda_module.h), so
 * libzero calls them through its table: zero_cu->zero_cuda_fill(...). Each
 * enqueues on `stream` (a cudaStream_t) and returns the cudaError_t of the
 * launch as an int. dtype is a zero_dtype already checked to be f32, f16 or
 * bf16.
 *
 * zero_cuda_sumsq: sum of squares in two deterministic passes: per-block
 * partial sums into `partials` (ZERO_CUDA_SUMSQ_BLOCKS doubles of device
 * memory), then one block adds them in a fixed order into result[0]; result
 * must hold 1 double plus 1 int (the nonfinite flag) right after it, in
 * device memory. */
#ifndef ZERO_DEVICE_CUDA_KERNELS_H
#define ZERO_DEVICE_CUDA_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZERO_CUDA_SUMSQ_BLOCKS 1024

/* X(return type, name, parameters): declared here, and the members of the module's table. */
#define ZERO_CUDA_KERNEL_FUNCS(X)                                                                         \
    X(int, zero_cuda_fill, (void *x, int dtype, size_t n, float value, void *stream))                     \
    X(int, zero_cuda_scale, (void *x, int dtype, size_t n, float alpha, void *stream))                    \
    X(int, zero_cuda_axpy, (float alpha, const void *x, void *y, int dtype, size_t n, void *stream))      \
    X(int, zero_cuda_cast, (const void *src, int src_dtype, void *dst, int dst_dtype, size_t n,           \
                            void *stream))                                                                \
    X(int, zero_cuda_sumsq, (const void *x, int dtype, size_t n, double *partials, void *result,          \
                             void *stream))

#define ZERO_CUDA_DECLARE_(ret, name, params) ret name params;
ZERO_CUDA_KERNEL_FUNCS(ZERO_CUDA_DECLARE_)

#ifdef __cplusplus
}
#endif

#endif
