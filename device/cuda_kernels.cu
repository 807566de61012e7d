// The CUDA element-wise kernels. The conversions come from convert_impl.h,
// the same code the CPU backend runs, so casts agree bit for bit; products
// and sums use explicit round-to-nearest intrinsics (__fmul_rn, __fadd_rn)
// so nvcc cannot contract them into FMAs that the CPU path does not do.
#include <cuda_runtime.h>
#include <stdint.h>

#include "convert_impl.h"
#include "cuda_kernels.h"

// zero_dtype values (zero/dtype.h is C; repeating three constants here keeps
// this file free of the public headers' C-only assumptions).
enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2 };

static const int kThreads = 256;

static unsigned grid_for(size_t n)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)(blocks < 65535 * 4 ? blocks : 65535 * 4); // grid-stride beyond
}

__device__ __forceinline__ float load_as_f32(const void *p, int dt, size_t i)
{
    if (dt == DT_F32) return static_cast<const float *>(p)[i];
    uint16_t h = static_cast<const uint16_t *>(p)[i];
    return dt == DT_F16 ? zero_cvt_f16_to_f32(h) : zero_cvt_bf16_to_f32(h);
}

__device__ __forceinline__ void store_from_f32(void *p, int dt, size_t i, float v)
{
    if (dt == DT_F32) static_cast<float *>(p)[i] = v;
    else if (dt == DT_F16) static_cast<uint16_t *>(p)[i] = zero_cvt_f32_to_f16(v);
    else static_cast<uint16_t *>(p)[i] = zero_cvt_f32_to_bf16(v);
}

#define GRID_STRIDE(i, n)                                                        \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);    \
         i += (size_t)gridDim.x * blockDim.x)

__global__ void fill_kernel(void *x, int dt, size_t n, float value)
{
    GRID_STRIDE(i, n) store_from_f32(x, dt, i, value);
}

__global__ void scale_kernel(void *x, int dt, size_t n, float alpha)
{
    GRID_STRIDE(i, n) store_from_f32(x, dt, i, __fmul_rn(load_as_f32(x, dt, i), alpha));
}

__global__ void axpy_kernel(float alpha, const void *x, void *y, int dt, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float t = __fmul_rn(alpha, load_as_f32(x, dt, i));
        store_from_f32(y, dt, i, __fadd_rn(load_as_f32(y, dt, i), t));
    }
}

__global__ void cast_kernel(const void *src, int sdt, void *dst, int ddt, size_t n)
{
    // Widening to f32 is exact, so every pair rounds once, as on the CPU.
    GRID_STRIDE(i, n) store_from_f32(dst, ddt, i, load_as_f32(src, sdt, i));
}

__global__ void sumsq_partial_kernel(const void *x, int dt, size_t n, double *partials)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    GRID_STRIDE(i, n)
    {
        double v = load_as_f32(x, dt, i);
        acc = __fma_rn(v, v, acc); // v*v is exact in double, so the FMA changes nothing
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

__global__ void sumsq_final_kernel(const double *partials, unsigned nparts, void *result)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (unsigned i = threadIdx.x; i < nparts; i += kThreads) acc = __dadd_rn(acc, partials[i]);
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        double total = sh[0];
        static_cast<double *>(result)[0] = total;
        // Squares are never negative and cannot overflow a double, so the
        // total is finite exactly when every element is.
        *reinterpret_cast<int *>(static_cast<double *>(result) + 1) = !isfinite(total);
    }
}

extern "C" int zero_cuda_fill(void *x, int dtype, size_t n, float value, void *stream)
{
    fill_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(x, dtype, n, value);
    return (int)cudaGetLastError();
}

extern "C" int zero_cuda_scale(void *x, int dtype, size_t n, float alpha, void *stream)
{
    scale_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(x, dtype, n, alpha);
    return (int)cudaGetLastError();
}

extern "C" int zero_cuda_axpy(float alpha, const void *x, void *y, int dtype, size_t n, void *stream)
{
    axpy_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(alpha, x, y, dtype, n);
    return (int)cudaGetLastError();
}

extern "C" int zero_cuda_cast(const void *src, int src_dtype, void *dst, int dst_dtype, size_t n, void *stream)
{
    cast_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(src, src_dtype, dst, dst_dtype, n);
    return (int)cudaGetLastError();
}

extern "C" int zero_cuda_sumsq(const void *x, int dtype, size_t n, double *partials, void *result, void *stream)
{
    // The grid depends on n only, so the summation order (and the result)
    // is the same on every run and every GPU.
    unsigned blocks = grid_for(n);
    if (blocks > ZERO_CUDA_SUMSQ_BLOCKS) blocks = ZERO_CUDA_SUMSQ_BLOCKS;
    sumsq_partial_kernel<<<blocks, kThreads, 0, (cudaStream_t)stream>>>(x, dtype, n, partials);
    int err = (int)cudaGetLastError();
    if (err) return err;
    sumsq_final_kernel<<<1, kThreads, 0, (cudaStream_t)stream>>>(partials, blocks, result);
    return (int)cudaGetLastError();
}
