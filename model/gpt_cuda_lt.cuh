/* Internal (CUDA only): one row-major matmul through cuBLASLt with the
 * epilogues the GPT fuses into its matmuls, for the bf16 activation mode.
 *
 *   D[M,N] = op(A)[M,K] op(B)[K,N] + beta C (+ bias[N] per row) -> epilogue
 *
 * row-major like gemm() in gpt_cuda.cu (cuBLASLt is column-major: the
 * operands are swapped, D^T = op(B)^T op(A)^T, so a row-major column is a
 * cuBLASLt row - which is where its bias and bias-gradient vectors live).
 * A and B share ab_type; C (ld ldd, may differ from D) and D share d_type;
 * compute and scale types are fp32. */
#ifndef ZERO_MODEL_GPT_CUDA_LT_CUH
#define ZERO_MODEL_GPT_CUDA_LT_CUH

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <zero/status.h>

typedef enum gpt_lt_epilogue {
    GPT_LT_NONE = 0,
    GPT_LT_GELU = 1,  /* D = gelu(...) (tanh form), aux = its input (the pre-activation), ld ldaux */
    GPT_LT_DGELU = 2, /* D = gelu'(aux) * (...): the backward through the GELU, aux read */
    GPT_LT_BGRAD = 3, /* bgrad[M] = sum over K of op(A) (fp32, OVERWRITTEN): a bias gradient
                       * when A is the output gradient of a linear layer (ta = 1) */
} gpt_lt_epilogue;

typedef struct gpt_lt_matmul {
    int ta, tb, M, N, K;
    const void *A, *B;
    int lda, ldb;
    cudaDataType_t ab_type;
    void *D;
    int ldd;
    cudaDataType_t d_type;
    const void *C; /* NULL: beta must be 0 */
    float beta;
    const void *bias; /* N values of d_type, or NULL */
    gpt_lt_epilogue epilogue;
    void *aux; /* GELU / DGELU: M x N of d_type, ld ldaux (a multiple of 8) */
    int ldaux;
    float *bgrad; /* GPT_LT_BGRAD: M floats */
} gpt_lt_matmul;

/* Enqueue on `stream`; `workspace` (ws_bytes) is cuBLASLt's scratch. On
 * failure a status with the message in gpt_last_error() (the cuBLAS status
 * and the shape). */
zero_status gpt_lt_run(cublasLtHandle_t lt, const gpt_lt_matmul *m, void *workspace, size_t ws_bytes,
                       cudaStream_t stream);

#endif
