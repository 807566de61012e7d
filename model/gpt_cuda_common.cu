/* The kernels and the cuBLAS wrapper shared by the CUDA GPT and the CUDA MoE
 * layer (gpt_cuda_common.cuh). */
#include <math.h>

#include "gpt_cuda_common.cuh"
#include "gpt_internal.h"

zero_status gpt_cuda_gemm(cublasHandle_t blas, int bf16_math, const char *who, int ta, int tb, int M, int N, int K,
                          const float *A, int lda, long long sa, const float *B, int ldb, long long sb, float beta,
                          float *C, int ldc, long long sc, int batch)
{
    const float alpha = 1.0f;
    cublasComputeType_t ct = bf16_math ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (batch == 1)
        s = cublasGemmEx(blas, ob, oa, N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F,
                         ldc, ct, CUBLAS_GEMM_DEFAULT);
    else
        s = cublasGemmStridedBatchedEx(blas, ob, oa, N, M, K, &alpha, B, CUDA_R_32F, ldb, sb, A, CUDA_R_32F, lda, sa,
                                       &beta, C, CUDA_R_32F, ldc, sc, batch, ct, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return gpt_fail(ZERO_BACKEND, "%s: cuBLAS gemm (%c%c, M %d N %d K %d, batch %d) failed: cuBLAS status %d", who,
                        ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, batch, (int)s);
    return ZERO_OK;
}

static __global__ void init_rows_kernel(float *out, const float *init, const float *bias, int R, int OC)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * OC) return;
    out[i] = (init ? init[i] : 0.0f) + (bias ? bias[i % OC] : 0.0f);
}

cudaError_t gpt_cuda_init_rows(float *out, const float *init, const float *bias, int R, int OC, cudaStream_t stream)
{
    init_rows_kernel<<<gpt_cuda_blocks((size_t)R * OC, 256), 256, 0, stream>>>(out, init, bias, R, OC);
    return cudaGetLastError();
}

#define GELU_K 0.7978845608028654f
template <typename AT>
static __global__ void gelu_forward_kernel(AT *out, const AT *inp, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = ld_f32(inp[i]);
    out[i] = st_as<AT>(0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))));
}

template <typename AT>
static __global__ void gelu_backward_kernel(AT *dinp, const AT *inp, const AT *dout, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = ld_f32(inp[i]);
    float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
    float dth = (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = st_as<AT>(ld_f32(dout[i]) * (0.5f * (1.0f + th) + 0.5f * x * dth));
}

cudaError_t gpt_cuda_gelu_forward(float *out, const float *inp, size_t n, cudaStream_t stream)
{
    gelu_forward_kernel<float><<<gpt_cuda_blocks(n, 256), 256, 0, stream>>>(out, inp, n);
    return cudaGetLastError();
}

cudaError_t gpt_cuda_gelu_forward(__nv_bfloat16 *out, const __nv_bfloat16 *inp, size_t n, cudaStream_t stream)
{
    gelu_forward_kernel<__nv_bfloat16><<<gpt_cuda_blocks(n, 256), 256, 0, stream>>>(out, inp, n);
    return cudaGetLastError();
}

cudaError_t gpt_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n, cudaStream_t stream)
{
    gelu_backward_kernel<float><<<gpt_cuda_blocks(n, 256), 256, 0, stream>>>(dinp, inp, dout, n);
    return cudaGetLastError();
}

cudaError_t gpt_cuda_gelu_backward(__nv_bfloat16 *dinp, const __nv_bfloat16 *inp, const __nv_bfloat16 *dout, size_t n,
                                   cudaStream_t stream)
{
    gelu_backward_kernel<__nv_bfloat16><<<gpt_cuda_blocks(n, 256), 256, 0, stream>>>(dinp, inp, dout, n);
    return cudaGetLastError();
}
