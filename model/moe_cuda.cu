/* The MoE layer (moe.h) on a CUDA GPU: the CPU path's math with cuBLAS
 * matmuls and small kernels, behind gpt_moe_create_cuda.
 *
 * Routing splits between the device and the host: the router's matmul,
 * softmax and top-k (with the weights) run on the device; the N x top_k
 * chosen experts (N K int32 per layer, and E column sums of the
 * probabilities for the aux loss) are then copied to the host, where
 * moe_route.c gives the slots exactly as the CPU path does and builds the
 * all-to-all-v plan. The per-expert counts are needed on the host for the
 * all-to-all-v anyway, so the copy costs one small transfer and a stream
 * synchronization per forward, not a second copy of the slot logic.
 *
 * Exchanges: on an ep comm (NCCL or STAGED backend) zero_alltoall(v) on
 * device buffers, issued after a stream synchronization (the comm wants
 * ready buffers); at ep 1 a device-to-device copy. Row layouts are the CPU's
 * (moe_cpu.c): send layout, source-major, expert-major.
 *
 * Experts: one gemm per local expert on its expert-major rows, or, when
 * every local expert got the same number of rows, strided-batched gemms
 * over all of them at once (moe_uniform_rows).
 *
 * Reductions over rows use cuBLAS (gemm for weights, gemv with a ones vector
 * for biases), so results are deterministic for a given cuBLAS and GPU but
 * differ from the CPU's in the last bits; routing can differ only where two
 * probabilities tie to within the exp's rounding. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_acts.h"
#include "gpt_cuda_common.cuh"
#include "gpt_internal.h"
#include "moe_cuda.h"

/* ------------------------------------------------------------ errors */
#define MOE_CUDA_TRY(call)                                                                          \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess)                                                                      \
            return gpt_fail(ZERO_BACKEND, "MoE cuda: %s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), \
                            __FILE__, __LINE__);                                                   \
    } while (0)

#define MOE_CUBLAS_TRY(call)                                                                        \
    do {                                                                                            \
        cublasStatus_t s_ = (call);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                            \
            return gpt_fail(ZERO_BACKEND, "MoE cuda: %s failed: cuBLAS status %d (%s:%d)", #call, (int)s_, \
                            __FILE__, __LINE__);                                                   \
    } while (0)

#define MOE_LAUNCH_CHECK() MOE_CUDA_TRY(cudaGetLastError())

static inline unsigned blocks_for(size_t n, unsigned threads) { return gpt_cuda_blocks(n, threads); }

/* ------------------------------------------------------------ state */
struct moe_cuda {
    int N, E, K, C, H, P, El;
    float aux_loss_coef;
    int bf16;
    zero_comm *ep;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *mem;                    /* the one device allocation */
    float *probs, *dprobs;        /* N x E */
    float *sel_w, *dw;            /* N x K */
    float *first_frac;            /* E */
    double *probsum;              /* E: column sums of probs (aux loss) */
    int32_t *sel_e, *dest;        /* N x K: expert, send-layout row (-1: dropped) */
    int32_t *count, *rcount;      /* E, P x El: the count exchange's device buffers */
    float *sendbuf, *ybuf;        /* Smax x C */
    float *recvbuf, *xin, *eout;  /* Rmax x C */
    float *fch, *fch_gelu, *dfch; /* Rmax x H */
    float *ones;                  /* max(Rmax, 1): the bias gradients' gemv */
    float *dyout;                 /* split backward: Rmax x C, d(expert output) kept from B to W (own cudaMalloc) */
    int32_t *h_dest;              /* host N x K */
    double *h_probsum;            /* host E */
    float *h_first_frac;          /* host E */
};

/* ------------------------------------------------------------ kernels */

/* One thread per token: softmax of the router's logits in place (the CPU's
 * order: max, exp and sum, scale), then the top_k (ties: the lower expert)
 * and their weights (renormalised over the k chosen when k > 1). */
static __global__ void moe_router_kernel(float *probs, int32_t *sel_e, float *sel_w, int N, int E, int K)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float *row = probs + (size_t)n * E, mx = row[0], sum = 0.0f;
    for (int e = 1; e < E; e++) mx = row[e] > mx ? row[e] : mx;
    for (int e = 0; e < E; e++) sum += row[e] = expf(row[e] - mx);
    float inv = 1.0f / sum;
    for (int e = 0; e < E; e++) row[e] *= inv;
    int32_t *se = sel_e + (size_t)n * K;
    float total = 0.0f;
    for (int i = 0; i < K; i++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < i; j++) taken |= se[j] == e;
            if (!taken && (best < 0 || row[e] > row[best])) best = e;
        }
        se[i] = best;
        total += row[best];
    }
    for (int i = 0; i < K; i++) {
        float pe = row[se[i]];
        sel_w[(size_t)n * K + i] = K > 1 ? pe / total : pe;
    }
}

/* One thread per expert: sum over tokens of probs[:, e], in double as the CPU. */
static __global__ void moe_probsum_kernel(double *dst, const float *probs, int N, int E)
{
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    double s = 0;
    for (int n = 0; n < N; n++) s += probs[(size_t)n * E + e];
    dst[e] = s;
}

/* send[dest[n, i]] = x[n] for every kept choice: one block per choice. */
static __global__ void moe_gather_kernel(float *send, const float *x, const int32_t *dest, int K, int C)
{
    int ch = blockIdx.x, row = dest[ch];
    if (row < 0) return;
    const float *src = x + (size_t)(ch / K) * C;
    float *dst = send + (size_t)row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

/* out[n] = (init[n] or out[n] when in place, or 0) + sum_i w_i y[dest_i]; in the CPU's order. */
static __global__ void moe_combine_kernel(float *out, const float *init, int init_mode, const float *y,
                                          const int32_t *dest, const float *w, int N, int K, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    int n = (int)(i / C), c = (int)(i % C);
    float o = init_mode == 1 ? init[i] : init_mode == 2 ? out[i] : 0.0f;
    for (int k = 0; k < K; k++) {
        int row = dest[n * K + k];
        if (row >= 0) o += w[n * K + k] * y[(size_t)row * C + c];
    }
    out[i] = o;
}

/* Backward of the combine, one block (MOE_RED threads) per choice:
 * dy[dest] = w dout[n], dw = <dout[n], y[dest]> (0 when dropped). */
#define MOE_RED 128
static __global__ void moe_combine_backward_kernel(float *dy, float *dw, const float *dout, const float *y,
                                                   const int32_t *dest, const float *w, int K, int C)
{
    __shared__ float part[MOE_RED];
    int ch = blockIdx.x, row = dest[ch];
    float s = 0.0f;
    if (row >= 0) {
        const float *d = dout + (size_t)(ch / K) * C, *yr = y + (size_t)row * C;
        float *dyr = dy + (size_t)row * C, wc = w[ch];
        for (int c = threadIdx.x; c < C; c += MOE_RED) dyr[c] = wc * d[c], s += d[c] * yr[c];
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int h = MOE_RED / 2; h > 0; h /= 2) {
        if (threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) dw[ch] = part[0];
}

/* dx[n] = sum over kept choices of the returned d(expert input) rows. */
static __global__ void moe_scatter_kernel(float *dx, const float *rows, const int32_t *dest, int N, int K, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    int n = (int)(i / C), c = (int)(i % C);
    float d = 0.0f;
    for (int k = 0; k < K; k++) {
        int row = dest[n * K + k];
        if (row >= 0) d += rows[(size_t)row * C + c];
    }
    dx[i] = d;
}

/* One thread per token: d(probs) from the weights' gradient (through the
 * renormalisation) and the aux loss's, then back through the softmax; the
 * CPU's formulas (moe_cpu.c). */
static __global__ void moe_router_backward_kernel(float *dprobs, const float *probs, const int32_t *sel_e,
                                                  const float *sel_w, const float *dw, const float *first_frac,
                                                  float aux_scale, int N, int E, int K)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float *dp = dprobs + (size_t)n * E;
    const float *pr = probs + (size_t)n * E;
    const int32_t *se = sel_e + (size_t)n * K;
    const float *dwn = dw + (size_t)n * K, *wn = sel_w + (size_t)n * K;
    for (int e = 0; e < E; e++) dp[e] = aux_scale * first_frac[e];
    if (K == 1) {
        dp[se[0]] += dwn[0];
    } else {
        float S = 0.0f, dot = 0.0f;
        for (int i = 0; i < K; i++) S += pr[se[i]];
        for (int i = 0; i < K; i++) dot += dwn[i] * wn[i];
        for (int i = 0; i < K; i++) dp[se[i]] += (dwn[i] - dot) / S;
    }
    float s = 0.0f;
    for (int e = 0; e < E; e++) s += pr[e] * dp[e];
    for (int e = 0; e < E; e++) dp[e] = pr[e] * (dp[e] - s);
}

/* bias rows and GELU: the CUDA GPT's own kernels (gpt_cuda_common.cu) */

static __global__ void moe_fill_kernel(float *p, float v, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

/* ------------------------------------------------------------ matmuls (row-major on cuBLAS) */

/* Row-major (gpt_cuda_common.cuh): the GPT's wrapper with the layer's precision. */
static zero_status moe_gemm(moe_cuda *d, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
                            int ldb, float beta, float *C, int ldc)
{
    return gpt_cuda_gemm(d->blas, d->bf16, "MoE cuda", ta, tb, M, N, K, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

/* The same over `batch` experts at once (strided batched): operand i of
 * expert e at base + e * stride. */
static zero_status moe_gemm_batched(moe_cuda *d, int ta, int tb, int M, int N, int K, const float *A, int lda,
                                    long long sa, const float *B, int ldb, long long sb, float beta, float *C, int ldc,
                                    long long sc, int batch)
{
    return gpt_cuda_gemm(d->blas, d->bf16, "MoE cuda", ta, tb, M, N, K, A, lda, sa, B, ldb, sb, beta, C, ldc, sc,
                         batch);
}

/* out (El x r x OC, expert-major) = expert e's bias row in each of its r rows. */
static __global__ void moe_bias_rows_kernel(float *out, const float *bias, size_t r, int OC, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bias[(i / (r * OC)) * OC + i % OC];
}

/* out (R x OC) = inp (R x IC) w^T + bias; w is OC x IC (nn.Linear). */
static zero_status moe_linear_forward(moe_cuda *d, float *out, const float *inp, const float *w, const float *bias,
                                      int R, int IC, int OC)
{
    MOE_CUDA_TRY(gpt_cuda_init_rows(out, NULL, bias, R, OC, d->stream));
    return moe_gemm(d, 0, 1, R, OC, IC, inp, IC, w, IC, 1.0f, out, OC);
}

/* dinp = dout w (overwritten); dw += dout^T inp; db += column sums of dout. */
/* The weight half: dw += dout^T inp, db += column sums of dout. */
static zero_status moe_linear_backward_weight(moe_cuda *d, float *dw, float *db, const float *dout, const float *inp,
                                              int R, int IC, int OC)
{
    GPT_TRY(moe_gemm(d, 1, 0, OC, IC, R, dout, OC, inp, IC, 1.0f, dw, IC));
    const float one = 1.0f;
    /* dout row-major R x OC is column-major OC x R: db += dout^T-as-stored times ones */
    MOE_CUBLAS_TRY(cublasSgemv(d->blas, CUBLAS_OP_N, OC, R, &one, dout, OC, d->ones, 1, &one, db, 1));
    return ZERO_OK;
}

/* The input half then (dw NULL: not now - a split backward's W runs it) the weight half. */
static zero_status moe_linear_backward(moe_cuda *d, float *dinp, float *dw, float *db, const float *dout,
                                       const float *inp, const float *w, int R, int IC, int OC)
{
    GPT_TRY(moe_gemm(d, 0, 0, R, IC, OC, dout, OC, w, IC, 0.0f, dinp, IC));
    return dw ? moe_linear_backward_weight(d, dw, db, dout, inp, R, IC, OC) : ZERO_OK;
}

/* ------------------------------------------------------------ lifetime */

#define MOE_CUDA_ALIGN 256 /* as the CUDA GPT's activation layout */

/* THE device layout of a layer, one walk for counting (d NULL) and carving,
 * so moe_cuda_bytes (the activation report) and moe_cuda_create's
 * cudaMalloc cannot disagree. Every buffer rounded up to 256 bytes. */
static void cuda_layout(moe_cuda *d, const moe_plan *pl, size_t H, gpt_carver *c)
{
    const size_t N = (size_t)pl->N, E = (size_t)pl->E, K = (size_t)pl->K, C = pl->C, f = sizeof(float);
    const size_t Rones = pl->Rmax > 0 ? pl->Rmax : 1, i32 = sizeof(int32_t);
    const int cat = GPT_ACT_SCRATCH; /* one region: only the carver's offset is read */
    double *probsum = (double *)gpt_carve(c, cat, E, sizeof(double));
    float *fl[] = {
        (float *)gpt_carve(c, cat, N * E, f), (float *)gpt_carve(c, cat, N * E, f),       /* probs, dprobs */
        (float *)gpt_carve(c, cat, N * K, f), (float *)gpt_carve(c, cat, N * K, f),       /* sel_w, dw */
        (float *)gpt_carve(c, cat, E, f),                                                 /* first_frac */
        (float *)gpt_carve(c, cat, pl->Smax * C, f), (float *)gpt_carve(c, cat, pl->Smax * C, f), /* send, y */
        (float *)gpt_carve(c, cat, pl->Rmax * C, f), (float *)gpt_carve(c, cat, pl->Rmax * C, f), /* recv, xin */
        (float *)gpt_carve(c, cat, pl->Rmax * C, f),                                      /* eout */
        (float *)gpt_carve(c, cat, pl->Rmax * H, f), (float *)gpt_carve(c, cat, pl->Rmax * H, f), /* fch, gelu */
        (float *)gpt_carve(c, cat, pl->Rmax * H, f),                                      /* dfch */
        (float *)gpt_carve(c, cat, Rones, f),                                             /* ones */
    };
    int32_t *ip[] = {
        (int32_t *)gpt_carve(c, cat, N * K, i32), (int32_t *)gpt_carve(c, cat, N * K, i32), /* sel_e, dest */
        (int32_t *)gpt_carve(c, cat, E, i32),                                             /* count */
        (int32_t *)gpt_carve(c, cat, (size_t)pl->P * pl->El, i32),                        /* rcount */
    };
    if (!d) return;
    d->probsum = probsum;
    d->probs = fl[0], d->dprobs = fl[1], d->sel_w = fl[2], d->dw = fl[3], d->first_frac = fl[4];
    d->sendbuf = fl[5], d->ybuf = fl[6], d->recvbuf = fl[7], d->xin = fl[8], d->eout = fl[9];
    d->fch = fl[10], d->fch_gelu = fl[11], d->dfch = fl[12], d->ones = fl[13];
    d->sel_e = ip[0], d->dest = ip[1], d->count = ip[2], d->rcount = ip[3];
}

zero_status moe_cuda_bytes(const moe_plan *pl, int H, size_t *bytes)
{
    gpt_carver c;
    gpt_carver_init(&c, MOE_CUDA_ALIGN, NULL, NULL);
    cuda_layout(NULL, pl, (size_t)H, &c);
    *bytes = c.off[0];
    return ZERO_OK;
}

zero_status moe_cuda_create(moe_cuda **out, const gpt_moe_config *cfg, const moe_plan *pl, zero_comm *ep,
                            void *cuda_stream)
{
    *out = NULL;
    if (pl->P > 1) {
        zero_backend b = zero_comm_get_backend(ep);
        if (b != ZERO_BACKEND_NCCL && b != ZERO_BACKEND_STAGED)
            return gpt_fail(ZERO_INVALID_ARGUMENT,
                            "gpt_moe_create_cuda: the ep comm's backend (%d) takes host buffers; the CUDA layer "
                            "exchanges device buffers and needs an NCCL or STAGED comm",
                            (int)b);
    }
    moe_cuda *d = (moe_cuda *)calloc(1, sizeof *d);
    if (!d) return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_moe_create_cuda: out of memory");
    d->N = pl->N, d->E = pl->E, d->K = pl->K, d->C = (int)pl->C, d->H = cfg->d_ff, d->P = pl->P, d->El = pl->El;
    d->aux_loss_coef = cfg->aux_loss_coef;
    d->ep = ep;
    d->stream = (cudaStream_t)cuda_stream;
    size_t Rones = pl->Rmax > 0 ? pl->Rmax : 1, bytes;
    gpt_carver c;
    gpt_carver_init(&c, MOE_CUDA_ALIGN, NULL, NULL);
    cuda_layout(NULL, pl, (size_t)d->H, &c);
    bytes = c.off[0];
    size_t N = d->N, E = d->E, K = d->K;
    d->h_dest = (int32_t *)calloc(N * K, sizeof(int32_t));
    d->h_probsum = (double *)calloc(E, sizeof(double));
    d->h_first_frac = (float *)calloc(E, sizeof(float));
    if (!d->h_dest || !d->h_probsum || !d->h_first_frac) {
        moe_cuda_destroy(d);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_moe_create_cuda: out of host memory");
    }
    cudaError_t ce = cudaMalloc(&d->mem, bytes);
    if (ce != cudaSuccess) {
        d->mem = NULL;
        moe_cuda_destroy(d);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_moe_create_cuda: cudaMalloc of %zu bytes failed: %s", bytes,
                        cudaGetErrorString(ce));
    }
    gpt_carver_init(&c, MOE_CUDA_ALIGN, d->mem, NULL);
    cuda_layout(d, pl, (size_t)d->H, &c);
    if (cublasCreate(&d->blas) != CUBLAS_STATUS_SUCCESS) {
        d->blas = NULL;
        moe_cuda_destroy(d);
        return gpt_fail(ZERO_BACKEND, "gpt_moe_create_cuda: cublasCreate failed");
    }
    if (cublasSetStream(d->blas, d->stream) != CUBLAS_STATUS_SUCCESS) {
        moe_cuda_destroy(d);
        return gpt_fail(ZERO_BACKEND, "gpt_moe_create_cuda: cublasSetStream failed");
    }
    moe_fill_kernel<<<blocks_for(Rones, 256), 256, 0, d->stream>>>(d->ones, 1.0f, Rones);
    ce = cudaGetLastError();
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(d->stream);
    if (ce != cudaSuccess) {
        moe_cuda_destroy(d);
        return gpt_fail(ZERO_BACKEND, "gpt_moe_create_cuda: filling the ones vector failed: %s",
                        cudaGetErrorString(ce));
    }
    *out = d;
    return ZERO_OK;
}

void moe_cuda_destroy(moe_cuda *d)
{
    if (!d) return;
    if (d->blas) cublasDestroy(d->blas);
    if (d->mem) cudaFree(d->mem);
    if (d->dyout) cudaFree(d->dyout);
    free(d->h_dest);
    free(d->h_probsum);
    free(d->h_first_frac);
    free(d);
}

void moe_cuda_set_bf16(moe_cuda *d, int bf16)
{
    if (d) d->bf16 = bf16 != 0;
}

/* ------------------------------------------------------------ exchanges */

/* One all-to-all-v of rows over ep after the stream's work is done (the
 * comm wants ready buffers); at ep 1 a copy on the stream. */
static zero_status moe_exchange(moe_cuda *d, const float *send, const size_t *sc, const size_t *sd, float *recv,
                                const size_t *rc, const size_t *rd, const char *what)
{
    if (d->P == 1) {
        if (sc[0])
            MOE_CUDA_TRY(cudaMemcpyAsync(recv + rd[0], send + sd[0], sc[0] * sizeof(float), cudaMemcpyDeviceToDevice,
                                         d->stream));
        return ZERO_OK;
    }
    MOE_CUDA_TRY(cudaStreamSynchronize(d->stream));
    zero_status st = zero_alltoallv(d->ep, send, sc, sd, recv, rc, rd, ZERO_F32);
    if (st != ZERO_OK) return gpt_fail(st, "MoE %s over the ep group: %s", what, zero_comm_last_error(d->ep));
    return ZERO_OK;
}

/* source-major <-> expert-major, one device copy per (source, local expert). */
static zero_status moe_permute(moe_cuda *d, const moe_plan *pl, float *expert_major, int to_expert)
{
    size_t C = (size_t)d->C;
    for (int se = 0; se < d->P * d->El; se++) {
        size_t n = (size_t)pl->rcount[se];
        if (!n) continue;
        float *src_major = d->recvbuf + pl->src_first[se] * C;
        float *em = expert_major + pl->em_first[se] * C;
        MOE_CUDA_TRY(cudaMemcpyAsync(to_expert ? em : src_major, to_expert ? src_major : em, n * C * sizeof(float),
                                     cudaMemcpyDeviceToDevice, d->stream));
    }
    return ZERO_OK;
}

/* The count exchange: rcount from every rank's count (device buffers on the ep comm). */
static zero_status moe_exchange_counts(moe_cuda *d, moe_plan *pl)
{
    if (d->P == 1) {
        memcpy(pl->rcount, pl->count, sizeof(int32_t) * d->El);
        return ZERO_OK;
    }
    MOE_CUDA_TRY(cudaMemcpyAsync(d->count, pl->count, sizeof(int32_t) * d->E, cudaMemcpyHostToDevice, d->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(d->stream));
    zero_status st = zero_alltoall(d->ep, d->count, d->rcount, (size_t)d->El, ZERO_I32);
    if (st != ZERO_OK)
        return gpt_fail(st, "MoE dispatch (row counts) over the ep group: %s", zero_comm_last_error(d->ep));
    MOE_CUDA_TRY(cudaMemcpyAsync(pl->rcount, d->rcount, sizeof(int32_t) * d->P * d->El, cudaMemcpyDeviceToHost,
                                 d->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(d->stream));
    return ZERO_OK;
}

/* ------------------------------------------------------------ forward */

/* The rows every local expert got when they all got the same number (> 0)
 * and there are several: then their expert-major blocks lie at a fixed
 * stride and each matmul runs once for all of them (cublasGemmStridedBatchedEx)
 * instead of once per expert; 0 otherwise (the per-expert loop). Uniform
 * counts are what a binding capacity gives once every expert is full. */
static int moe_uniform_rows(const moe_cuda *d, const moe_plan *pl)
{
    if (d->El < 2 || pl->erows[0] == 0 || pl->erows[0] > (size_t)INT32_MAX) return 0;
    for (int el = 1; el < d->El; el++)
        if (pl->erows[el] != pl->erows[0]) return 0;
    return (int)pl->erows[0];
}

/* The experts' forward on uniform blocks of r rows: fc, GELU, proj, each once for all El. */
static zero_status moe_experts_forward_batched(moe_cuda *d, int r, const gpt_moe_params *p)
{
    const int C = d->C, H = d->H, El = d->El;
    const long long rC = (long long)r * C, rH = (long long)r * H, HC = (long long)H * C;
    size_t nh = (size_t)El * rH, nc = (size_t)El * rC;
    moe_bias_rows_kernel<<<blocks_for(nh, 256), 256, 0, d->stream>>>(d->fch, p->fc_b, (size_t)r, H, nh);
    MOE_LAUNCH_CHECK();
    GPT_TRY(moe_gemm_batched(d, 0, 1, r, H, C, d->xin, C, rC, p->fc_w, C, HC, 1.0f, d->fch, H, rH, El));
    MOE_CUDA_TRY(gpt_cuda_gelu_forward(d->fch_gelu, d->fch, nh, d->stream));
    moe_bias_rows_kernel<<<blocks_for(nc, 256), 256, 0, d->stream>>>(d->eout, p->proj_b, (size_t)r, C, nc);
    MOE_LAUNCH_CHECK();
    return moe_gemm_batched(d, 0, 1, r, C, H, d->fch_gelu, H, rH, p->proj_w, H, HC, 1.0f, d->eout, C, rC, El);
}

/* The experts' proj weight half on uniform blocks: dproj_w += dY^T gelu(fc); dproj_b += column sums of dY. */
static zero_status moe_batched_weight_proj(moe_cuda *d, int r, const float *dy, gpt_moe_params *g)
{
    const int C = d->C, H = d->H, El = d->El;
    const long long rC = (long long)r * C, rH = (long long)r * H, HC = (long long)H * C;
    const float one = 1.0f;
    GPT_TRY(moe_gemm_batched(d, 1, 0, C, H, r, dy, C, rC, d->fch_gelu, H, rH, 1.0f, g->proj_w, H, HC, El));
    for (int el = 0; el < El; el++)
        MOE_CUBLAS_TRY(cublasSgemv(d->blas, CUBLAS_OP_N, C, r, &one, dy + el * rC, C, d->ones, 1, &one,
                                   g->proj_b + (size_t)el * C, 1));
    return ZERO_OK;
}

/* The fc weight half likewise: dfc_w += dfch^T x; dfc_b += column sums of dfch. */
static zero_status moe_batched_weight_fc(moe_cuda *d, int r, gpt_moe_params *g)
{
    const int C = d->C, H = d->H, El = d->El;
    const long long rC = (long long)r * C, rH = (long long)r * H, HC = (long long)H * C;
    const float one = 1.0f;
    GPT_TRY(moe_gemm_batched(d, 1, 0, H, C, r, d->dfch, H, rH, d->xin, C, rC, 1.0f, g->fc_w, C, HC, El));
    for (int el = 0; el < El; el++)
        MOE_CUBLAS_TRY(cublasSgemv(d->blas, CUBLAS_OP_N, H, r, &one, d->dfch + el * rH, H, d->ones, 1, &one,
                                   g->fc_b + (size_t)el * H, 1));
    return ZERO_OK;
}

/* Their backward likewise: d(expert output) in dy (eout, or the split stash), d(expert input)
 * into eout; split: the weight halves left to moe_cuda_backward_weight. */
static zero_status moe_experts_backward_batched(moe_cuda *d, int r, const gpt_moe_params *p, gpt_moe_params *g,
                                                const float *dy, int split)
{
    const int C = d->C, H = d->H, El = d->El;
    const long long rC = (long long)r * C, rH = (long long)r * H, HC = (long long)H * C;
    /* proj: dfch = dY proj_w */
    GPT_TRY(moe_gemm_batched(d, 0, 0, r, H, C, dy, C, rC, p->proj_w, H, HC, 0.0f, d->dfch, H, rH, El));
    if (!split) GPT_TRY(moe_batched_weight_proj(d, r, dy, g));
    MOE_CUDA_TRY(gpt_cuda_gelu_backward(d->dfch, d->fch, d->dfch, (size_t)El * rH, d->stream));
    /* fc: dX = dfch fc_w (over dY when dy is eout: read by now) */
    GPT_TRY(moe_gemm_batched(d, 0, 0, r, C, H, d->dfch, H, rH, p->fc_w, C, HC, 0.0f, d->eout, C, rC, El));
    if (!split) GPT_TRY(moe_batched_weight_fc(d, r, g));
    return ZERO_OK;
}

zero_status moe_cuda_forward(moe_cuda *d, moe_plan *pl, int32_t *sel_e, int32_t *sel_slot, float *sel_w,
                             const float *x, const float *init, float *out, const gpt_moe_params *p, float *aux)
{
    const int N = d->N, E = d->E, K = d->K, C = d->C, H = d->H;
    /* router: logits, softmax + top-k on the device */
    GPT_TRY(moe_gemm(d, 0, 1, N, E, C, x, C, p->gate_w, C, 0.0f, d->probs, E));
    moe_router_kernel<<<blocks_for((size_t)N, 128), 128, 0, d->stream>>>(d->probs, d->sel_e, d->sel_w, N, E, K);
    MOE_LAUNCH_CHECK();
    moe_probsum_kernel<<<blocks_for((size_t)E, 64), 64, 0, d->stream>>>(d->probsum, d->probs, N, E);
    MOE_LAUNCH_CHECK();
    /* the choices to the host (N K ints + weights + E sums) for the slots and the plan */
    MOE_CUDA_TRY(cudaMemcpyAsync(sel_e, d->sel_e, sizeof(int32_t) * N * K, cudaMemcpyDeviceToHost, d->stream));
    MOE_CUDA_TRY(cudaMemcpyAsync(sel_w, d->sel_w, sizeof(float) * N * K, cudaMemcpyDeviceToHost, d->stream));
    MOE_CUDA_TRY(cudaMemcpyAsync(d->h_probsum, d->probsum, sizeof(double) * E, cudaMemcpyDeviceToHost, d->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(d->stream));
    moe_assign_slots(pl, sel_e, sel_slot);
    moe_first_fractions(pl, sel_e, d->h_first_frac);
    double a = 0;
    for (int e = 0; e < E; e++) a += (double)d->h_first_frac[e] * (d->h_probsum[e] / N);
    if (aux) *aux = (float)(a * E);
    moe_plan_sends(pl);
    for (int c = 0; c < N * K; c++)
        d->h_dest[c] = sel_slot[c] >= 0 ? (int32_t)(pl->row0[sel_e[c]] + (size_t)sel_slot[c]) : -1;
    MOE_CUDA_TRY(cudaMemcpyAsync(d->dest, d->h_dest, sizeof(int32_t) * N * K, cudaMemcpyHostToDevice, d->stream));
    MOE_CUDA_TRY(
        cudaMemcpyAsync(d->first_frac, d->h_first_frac, sizeof(float) * E, cudaMemcpyHostToDevice, d->stream));
    GPT_TRY(moe_exchange_counts(d, pl));
    GPT_TRY(moe_plan_receives(pl));

    /* dispatch, experts, combine */
    moe_gather_kernel<<<N * K, 128, 0, d->stream>>>(d->sendbuf, x, d->dest, K, C);
    MOE_LAUNCH_CHECK();
    GPT_TRY(moe_exchange(d, d->sendbuf, pl->sc, pl->sd, d->recvbuf, pl->rc, pl->rd, "dispatch"));
    GPT_TRY(moe_permute(d, pl, d->xin, 1));
    const int uniform = moe_uniform_rows(d, pl);
    if (uniform) GPT_TRY(moe_experts_forward_batched(d, uniform, p));
    for (int el = 0; el < d->El && !uniform; el++) {
        int r = (int)pl->erows[el];
        if (!r) continue;
        size_t f = pl->efirst[el];
        GPT_TRY(moe_linear_forward(d, d->fch + f * H, d->xin + f * C, p->fc_w + (size_t)el * H * C,
                                   p->fc_b + (size_t)el * H, r, C, H));
        MOE_CUDA_TRY(gpt_cuda_gelu_forward(d->fch_gelu + f * H, d->fch + f * H, (size_t)r * H, d->stream));
        GPT_TRY(moe_linear_forward(d, d->eout + f * C, d->fch_gelu + f * H, p->proj_w + (size_t)el * C * H,
                                   p->proj_b + (size_t)el * C, r, H, C));
    }
    GPT_TRY(moe_permute(d, pl, d->eout, 0));
    GPT_TRY(moe_exchange(d, d->recvbuf, pl->rc, pl->rd, d->ybuf, pl->sc, pl->sd, "combine"));
    int init_mode = !init ? 0 : init == out ? 2 : 1;
    moe_combine_kernel<<<blocks_for((size_t)N * C, 256), 256, 0, d->stream>>>(out, init, init_mode, d->ybuf, d->dest,
                                                                               d->sel_w, N, K, C);
    MOE_LAUNCH_CHECK();
    MOE_CUDA_TRY(cudaStreamSynchronize(d->stream));
    return ZERO_OK;
}

/* ------------------------------------------------------------ backward */

zero_status moe_cuda_backward(moe_cuda *d, moe_plan *pl, float dloss, const float *x, const float *dout, float *dx,
                              const gpt_moe_params *p, gpt_moe_params *g, int split)
{
    const int N = d->N, E = d->E, K = d->K, C = d->C, H = d->H;
    /* out[n] += w y: dY = w dout[n] (send layout), dw = <dout[n], y> */
    moe_combine_backward_kernel<<<N * K, MOE_RED, 0, d->stream>>>(d->sendbuf, d->dw, dout, d->ybuf, d->dest,
                                                                   d->sel_w, K, C);
    MOE_LAUNCH_CHECK();
    GPT_TRY(moe_exchange(d, d->sendbuf, pl->sc, pl->sd, d->recvbuf, pl->rc, pl->rd, "dispatch (backward)"));
    /* d(expert output): split, in the stash W reads; else in eout, which d(expert input) overwrites */
    float *dy = split ? d->dyout : d->eout;
    GPT_TRY(moe_permute(d, pl, dy, 1));
    const int uniform = moe_uniform_rows(d, pl);
    if (uniform) GPT_TRY(moe_experts_backward_batched(d, uniform, p, g, dy, split));
    for (int el = 0; el < d->El && !uniform; el++) {
        int r = (int)pl->erows[el];
        if (!r) continue;
        size_t f = pl->efirst[el];
        GPT_TRY(moe_linear_backward(d, d->dfch + f * H, split ? NULL : g->proj_w + (size_t)el * C * H,
                                    split ? NULL : g->proj_b + (size_t)el * C, dy + f * C, d->fch_gelu + f * H,
                                    p->proj_w + (size_t)el * C * H, r, H, C));
        MOE_CUDA_TRY(
            gpt_cuda_gelu_backward(d->dfch + f * H, d->fch + f * H, d->dfch + f * H, (size_t)r * H, d->stream));
        /* d(expert input) overwrites d(expert output) when dy is eout: read by now */
        GPT_TRY(moe_linear_backward(d, d->eout + f * C, split ? NULL : g->fc_w + (size_t)el * H * C,
                                    split ? NULL : g->fc_b + (size_t)el * H, d->dfch + f * H, d->xin + f * C,
                                    p->fc_w + (size_t)el * H * C, r, C, H));
    }
    GPT_TRY(moe_permute(d, pl, d->eout, 0));
    GPT_TRY(moe_exchange(d, d->recvbuf, pl->rc, pl->rd, d->sendbuf, pl->sc, pl->sd, "combine (backward)"));
    moe_scatter_kernel<<<blocks_for((size_t)N * C, 256), 256, 0, d->stream>>>(dx, d->sendbuf, d->dest, N, K, C);
    MOE_LAUNCH_CHECK();

    /* the router: d(probs), through the softmax, then the gate matmul */
    float aux_scale = dloss * d->aux_loss_coef * (float)E / (float)N;
    moe_router_backward_kernel<<<blocks_for((size_t)N, 128), 128, 0, d->stream>>>(
        d->dprobs, d->probs, d->sel_e, d->sel_w, d->dw, d->first_frac, aux_scale, N, E, K);
    MOE_LAUNCH_CHECK();
    GPT_TRY(moe_gemm(d, 0, 0, N, C, E, d->dprobs, E, p->gate_w, C, 1.0f, dx, C));        /* dx += dprobs gate_w */
    GPT_TRY(moe_gemm(d, 1, 0, E, C, N, d->dprobs, E, x, C, 1.0f, g->gate_w, C));          /* dgate += dprobs^T x */
    MOE_CUDA_TRY(cudaStreamSynchronize(d->stream));
    return ZERO_OK;
}

/* ------------------------------------------------------------ split backward (B / W) */

zero_status moe_cuda_split(moe_cuda *d, const moe_plan *pl, size_t *bytes)
{
    *bytes = sizeof(float) * (pl->Rmax > 0 ? pl->Rmax : 1) * (size_t)d->C;
    if (d->dyout) return ZERO_OK;
    cudaError_t e = cudaMalloc((void **)&d->dyout, *bytes);
    if (e != cudaSuccess) {
        d->dyout = NULL;
        return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_moe_split_backward: cudaMalloc of %zu bytes of stash: %s", *bytes,
                        cudaGetErrorString(e));
    }
    return ZERO_OK;
}

/* The unsplit backward's weight halves on the operands B left (d(expert output) in the stash,
 * d(fc output) in dfch), batched or per expert as B chose; enqueued on the layer's stream. */
zero_status moe_cuda_backward_weight(moe_cuda *d, const moe_plan *pl, gpt_moe_params *g)
{
    const int C = d->C, H = d->H;
    const int uniform = moe_uniform_rows(d, pl);
    if (uniform) {
        GPT_TRY(moe_batched_weight_proj(d, uniform, d->dyout, g));
        return moe_batched_weight_fc(d, uniform, g);
    }
    for (int el = 0; el < d->El; el++) {
        int r = (int)pl->erows[el];
        if (!r) continue;
        size_t f = pl->efirst[el];
        GPT_TRY(moe_linear_backward_weight(d, g->proj_w + (size_t)el * C * H, g->proj_b + (size_t)el * C,
                                           d->dyout + f * C, d->fch_gelu + f * H, r, H, C));
        GPT_TRY(moe_linear_backward_weight(d, g->fc_w + (size_t)el * H * C, g->fc_b + (size_t)el * H, d->dfch + f * H,
                                           d->xin + f * C, r, C, H));
    }
    return ZERO_OK;
}
