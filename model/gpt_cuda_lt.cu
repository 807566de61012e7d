/* cuBLASLt matmuls with fused epilogues (gpt_cuda_lt.cuh). Descriptors are
 * built per call (a few microseconds; the GPT makes ~10 calls per block). */
#include <stdint.h>

#include "gpt_cuda_lt.cuh"
#include "gpt_internal.h"

#define LT_TRY(call)                                                                                           \
    do {                                                                                                       \
        cublasStatus_t s_ = (call);                                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                     \
            st = gpt_fail(ZERO_BACKEND, "gpt cuda: %s failed: cuBLAS status %d (%s) for a %d x %d x %d matmul", \
                          #call, (int)s_, cublasGetStatusString(s_), m->M, m->N, m->K);                         \
            goto done;                                                                                         \
        }                                                                                                      \
    } while (0)

/* The largest power of two (<= 256) dividing the address: the heuristic
 * must not pick a kernel that assumes more alignment than the engine's
 * parameter pointers have. */
static uint32_t alignment_of(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p % a)) a >>= 1;
    return a;
}

zero_status gpt_lt_run(cublasLtHandle_t lt, const gpt_lt_matmul *m, void *workspace, size_t ws_bytes,
                       cudaStream_t stream)
{
    zero_status st = ZERO_OK;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    /* column-major: A' = B (N x K after op), B' = A (K x M after op), D' = D^T (N x M) */
    cublasOperation_t oa = m->tb ? CUBLAS_OP_T : CUBLAS_OP_N, ob = m->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    const float alpha = 1.0f, beta = m->C ? m->beta : 0.0f;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    uint32_t al;

    LT_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
    switch (m->epilogue) {
    case GPT_LT_NONE: epi = m->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT; break;
    case GPT_LT_GELU: epi = m->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX; break;
    case GPT_LT_DGELU: epi = CUBLASLT_EPILOGUE_DGELU; break;
    case GPT_LT_BGRAD: epi = CUBLASLT_EPILOGUE_BGRADB; break; /* B' is A: sums over K of op(A) */
    }
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (m->bias && (m->epilogue == GPT_LT_NONE || m->epilogue == GPT_LT_GELU))
        LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &m->bias, sizeof m->bias));
    if (m->epilogue == GPT_LT_BGRAD) {
        cudaDataType_t bt = CUDA_R_32F;
        LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &m->bgrad, sizeof m->bgrad));
        LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (m->epilogue == GPT_LT_GELU || m->epilogue == GPT_LT_DGELU) {
        int64_t ldaux = m->ldaux;
        LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &m->aux, sizeof m->aux));
        LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof ldaux));
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&la, m->ab_type, m->tb ? m->K : m->N, m->tb ? m->N : m->K, m->ldb));
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, m->ab_type, m->ta ? m->M : m->K, m->ta ? m->K : m->M, m->lda));
    LT_TRY(cublasLtMatrixLayoutCreate(&lc, m->d_type, m->N, m->M, m->ldd));
    LT_TRY(cublasLtMatrixLayoutCreate(&ld, m->d_type, m->N, m->M, m->ldd));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof ws_bytes));
    al = alignment_of(m->B);
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    al = alignment_of(m->A);
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    al = alignment_of(m->C ? m->C : m->D);
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    al = alignment_of(m->D);
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, ld, pref, 1, &res, &found));
    if (!found) {
        st = gpt_fail(ZERO_BACKEND, "gpt cuda: cuBLASLt has no algorithm for a %d x %d x %d matmul (epilogue %d)",
                      m->M, m->N, m->K, (int)m->epilogue);
        goto done;
    }
    LT_TRY(cublasLtMatmul(lt, op, &alpha, m->B, la, m->A, lb, &beta, m->C ? m->C : m->D, lc, m->D, ld, &res.algo,
                          workspace, ws_bytes, stream));
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return st;
}
