/* Internal (CUDA only): the kernels and the cuBLAS wrapper that the CUDA GPT
 * (gpt_cuda.cu) and the CUDA MoE layer (moe_cuda.cu) share, so that both
 * compute GELU, bias rows and row-major matmuls with the same code (an MoE
 * block on CUDA must match the dense MLP's numerics where they overlap).
 * Defined in gpt_cuda_common.cu; the launchers enqueue on `stream` and
 * return the launch's cudaGetLastError(). */
#ifndef ZERO_MODEL_GPT_CUDA_COMMON_CUH
#define ZERO_MODEL_GPT_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

#include <zero/status.h>

/* Blocks of `threads` covering n elements. */
static inline unsigned gpt_cuda_blocks(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* fp32 <-> an activation type (float, or bf16 rounded to nearest even). */
__device__ __forceinline__ float ld_f32(float x) { return x; }
__device__ __forceinline__ float ld_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T st_as(float x);
template <> __device__ __forceinline__ float st_as<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 st_as<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* Row-major C[M,N] = op(A) op(B) + beta C (alpha 1), as gpt_sgemm on the
 * CPU: cuBLAS is column-major, so C^T = op(B)^T op(A)^T with the operands
 * swapped and the transpose flags unchanged. bf16_math: cuBLAS's
 * CUBLAS_COMPUTE_32F_FAST_16BF (bf16 tensor-core products, fp32 sums), else
 * plain fp32 (no TF32). batch > 1: strided batched (strides sa, sb, sc).
 * A failure is ZERO_BACKEND with the cuBLAS status, the message starting
 * with `who` (e.g. "gpt cuda"). */
zero_status gpt_cuda_gemm(cublasHandle_t blas, int bf16_math, const char *who, int ta, int tb, int M, int N, int K,
                          const float *A, int lda, long long sa, const float *B, int ldb, long long sb, float beta,
                          float *C, int ldc, long long sc, int batch);

/* out[r, c] = (init ? init[r, c] : 0) + (bias ? bias[c] : 0), R x OC. */
cudaError_t gpt_cuda_init_rows(float *out, const float *init, const float *bias, int R, int OC, cudaStream_t stream);

/* GPT-2's tanh GELU (the CPU's gpt_gelu_forward / _backward): out = gelu(inp);
 * dinp = dout * gelu'(inp), dinp may alias dout. */
cudaError_t gpt_cuda_gelu_forward(float *out, const float *inp, size_t n, cudaStream_t stream);
cudaError_t gpt_cuda_gelu_forward(__nv_bfloat16 *out, const __nv_bfloat16 *inp, size_t n, cudaStream_t stream);
cudaError_t gpt_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n, cudaStream_t stream);
cudaError_t gpt_cuda_gelu_backward(__nv_bfloat16 *dinp, const __nv_bfloat16 *inp, const __nv_bfloat16 *dout, size_t n,
                                   cudaStream_t stream);

#endif
