/* Fused causal attention on CUDA: the kernels of gpt_flash.h, whose plain C
 * twin (gpt_flash.c) is tested against the model's CPU attention on every
 * CI run. The structure is the twin's, line for line: a block takes a tile
 * of GPT_FLASH_BR query rows (forward, dq) or GPT_FLASH_BC key rows (dk,
 * dv), one thread per row; the other side's rows stream through shared
 * memory a tile at a time; each thread runs the twin's per-row statements -
 * the same source, gpt_flash_row.h - so the sums are taken in the twin's
 * order (the compiler may fuse a multiply and an add, the twin's C may not:
 * ~1e-7 relative).
 *
 * The products are fp32 FMAs on the CUDA cores, not tensor-core mma: the
 * first version is the one whose every operation has a CPU twin. It needs
 * no B x H x T x T buffer (the point for memory), and reads each K/V tile
 * from shared memory as a broadcast (every thread of the block reads the
 * same element at once: no bank conflicts). A tensor-core (wmma/mma) inner
 * product on the same tiles is the next step for speed.
 *
 * Shared memory: the streamed tiles are fp32 (converted once on load),
 * GPT_FLASH_BC x HS floats each; a thread's own row sits in shared memory
 * (stride HS + 1: consecutive rows fall in different banks) where keeping
 * it in registers would spill. Dynamic shared memory, above 48 KiB for
 * HS = 128 (sm_90 allows 227 KiB per block). */
#include <cuda_bf16.h>
#include <math.h>

#include "gpt_cuda_flash.cuh"
#include "gpt_flash.h"
#include "gpt_flash_row.h"

#define BR GPT_FLASH_BR
#define BC GPT_FLASH_BC

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* rows [r0, r0 + rows) of one head's q, k or v (column offset `col` in the
 * 3C-wide qkv row) into tile[rows][HS] as fp32; rows past T are zeros. */
template <typename AT, int HS>
__device__ void load_tile(float *tile, const AT *base, int r0, int T, int ld, int hs)
{
    for (int i = threadIdx.x; i < BC * HS; i += blockDim.x) {
        int r = i / HS, d = i % HS;
        tile[i] = (r0 + r < T && d < hs) ? to_f32(base[(size_t)(r0 + r) * ld + d]) : 0.0f;
    }
}

/* ------------------------------------------------------------ forward */
/* grid (ceil(T / BR), B * NH), BR threads. smem: K and V tiles, and this
 * block's scores s[BC][BR] (column tid is this thread's). */
template <typename AT, int HS>
__global__ void __launch_bounds__(BR) flash_forward_kernel(AT *out, float *lse, const AT *qkv, int T, int C,
                                                           int NH, float scale)
{
    extern __shared__ float smem[];
    float *ks = smem, *vs = ks + BC * HS, *ss = vs + BC * HS;
    const int hs = C / NH, C3 = 3 * C, b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int r0 = blockIdx.x * BR, t = r0 + threadIdx.x, rlast = min(r0 + BR, T) - 1;
    const AT *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
    float qt[HS], o[HS], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int d = 0; d < HS; d++) {
        qt[d] = (t < T && d < hs) ? to_f32(q[(size_t)t * C3 + d]) : 0.0f;
        o[d] = 0.0f;
    }
    for (int c0 = 0; c0 <= rlast; c0 += BC) { /* the key tiles that meet the block's last row */
        __syncthreads();                      /* the previous tile is consumed */
        load_tile<AT, HS>(ks, k, c0, T, C3, hs);
        load_tile<AT, HS>(vs, v, c0, T, C3, hs);
        __syncthreads();
        if (t >= T || c0 > t) continue; /* a tile past the row changes nothing (twin: not visited) */
        const int n = min(c0 + BC, t + 1) - c0;
        gpt_flash_fwd_tile(qt, ks, vs, HS, n, HS, scale, ss + threadIdx.x, BR, &m, &l, o);
    }
    if (t >= T) return;
    float inv = 1.0f / l;
    AT *y = out + ((size_t)b * T + t) * C + h * hs;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs) y[d] = from_f32<AT>(o[d] * inv);
    lse[(size_t)blockIdx.y * T + t] = m + logf(l);
}

/* ------------------------------------------------------------ backward */
/* D[bh, t] = sum_d dout[t, d] out[t, d], d ascending: one thread per row. */
template <typename AT>
__global__ void flash_backward_d_kernel(float *D, const AT *dout, const AT *out, int B, int T, int C, int NH)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * NH * T) return;
    const int hs = C / NH, t = (int)(i % T), h = (int)((i / T) % NH), b = (int)(i / ((size_t)T * NH));
    const AT *dy = dout + ((size_t)b * T + t) * C + h * hs, *y = out + ((size_t)b * T + t) * C + h * hs;
    float acc = 0.0f;
    for (int d = 0; d < hs; d++) acc += to_f32(dy[d]) * to_f32(y[d]);
    D[i] = acc;
}

/* dq: grid (ceil(T / BR), B * NH), BR threads, a thread per query row;
 * smem: K and V tiles, and the block's own q and dout rows (stride HS + 1). */
template <typename AT, int HS>
__global__ void __launch_bounds__(BR) flash_backward_dq_kernel(AT *dqkv, const float *D, const AT *dout,
                                                               const float *lse, const AT *qkv, int T, int C,
                                                               int NH, float scale)
{
    extern __shared__ float smem[];
    float *ks = smem, *vs = ks + BC * HS, *qs = vs + BC * HS, *dys = qs + BR * (HS + 1);
    const int hs = C / NH, C3 = 3 * C, b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int r0 = blockIdx.x * BR, t = r0 + threadIdx.x, rlast = min(r0 + BR, T) - 1;
    const AT *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
    const AT *dy = dout + (size_t)b * T * C + h * hs;
    float *qt = qs + threadIdx.x * (HS + 1), *dyt = dys + threadIdx.x * (HS + 1), dq[HS];
    const float Lt = t < T ? lse[(size_t)blockIdx.y * T + t] : 0.0f, Dt = t < T ? D[(size_t)blockIdx.y * T + t] : 0.0f;
#pragma unroll
    for (int d = 0; d < HS; d++) {
        qt[d] = (t < T && d < hs) ? to_f32(q[(size_t)t * C3 + d]) : 0.0f;
        dyt[d] = (t < T && d < hs) ? to_f32(dy[(size_t)t * C + d]) : 0.0f;
        dq[d] = 0.0f;
    }
    for (int c0 = 0; c0 <= rlast; c0 += BC) {
        __syncthreads();
        load_tile<AT, HS>(ks, k, c0, T, C3, hs);
        load_tile<AT, HS>(vs, v, c0, T, C3, hs);
        __syncthreads();
        if (t >= T || c0 > t) continue;
        const int n = min(c0 + BC, t + 1) - c0;
        for (int j = 0; j < n; j++) gpt_flash_dq_key(qt, dyt, ks + j * HS, vs + j * HS, HS, scale, Lt, Dt, dq);
    }
    if (t >= T) return;
    AT *dqt = dqkv + ((size_t)b * T + t) * C3 + h * hs;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs) dqt[d] = from_f32<AT>(dq[d] * scale);
}

/* dk, dv: grid (ceil(T / BC), B * NH), BC threads, a thread per key row j;
 * the query rows t >= j stream through smem a tile of BR at a time (q,
 * dout, lse, D); the thread's own k and v rows sit in smem (stride HS + 1). */
template <typename AT, int HS>
__global__ void __launch_bounds__(BC) flash_backward_dkv_kernel(AT *dqkv, const float *D, const AT *dout,
                                                                const float *lse, const AT *qkv, int T, int C,
                                                                int NH, float scale)
{
    extern __shared__ float smem[];
    float *qs = smem, *dys = qs + BR * HS, *kown = dys + BR * HS, *vown = kown + BC * (HS + 1);
    float *Ls = vown + BC * (HS + 1), *Ds = Ls + BR;
    const int hs = C / NH, C3 = 3 * C, b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int c0 = blockIdx.x * BC, j = c0 + threadIdx.x;
    const AT *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
    const AT *dy = dout + (size_t)b * T * C + h * hs;
    float *kj = kown + threadIdx.x * (HS + 1), *vj = vown + threadIdx.x * (HS + 1), dk[HS], dv[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        kj[d] = (j < T && d < hs) ? to_f32(k[(size_t)j * C3 + d]) : 0.0f;
        vj[d] = (j < T && d < hs) ? to_f32(v[(size_t)j * C3 + d]) : 0.0f;
        dk[d] = dv[d] = 0.0f;
    }
    for (int r0 = c0 / BR * BR; r0 < T; r0 += BR) { /* query tiles from the one holding row c0 */
        __syncthreads();
        for (int i = threadIdx.x; i < BR * HS; i += blockDim.x) {
            int r = i / HS, d = i % HS, ok = r0 + r < T && d < hs;
            qs[i] = ok ? to_f32(q[(size_t)(r0 + r) * C3 + d]) : 0.0f;
            dys[i] = ok ? to_f32(dy[(size_t)(r0 + r) * C + d]) : 0.0f;
        }
        for (int r = threadIdx.x; r < BR; r += blockDim.x) {
            Ls[r] = r0 + r < T ? lse[(size_t)blockIdx.y * T + r0 + r] : 0.0f;
            Ds[r] = r0 + r < T ? D[(size_t)blockIdx.y * T + r0 + r] : 0.0f;
        }
        __syncthreads();
        if (j >= T) continue;
        for (int t = max(r0, j); t < min(r0 + BR, T); t++)
            gpt_flash_dkv_query(qs + (t - r0) * HS, dys + (t - r0) * HS, kj, vj, HS, scale, Ls[t - r0], Ds[t - r0], dk,
                                dv);
    }
    if (j >= T) return;
    AT *dkj = dqkv + ((size_t)b * T + j) * C3 + C + h * hs, *dvj = dkj + C;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs) {
            dkj[d] = from_f32<AT>(dk[d] * scale);
            dvj[d] = from_f32<AT>(dv[d]);
        }
}

/* ------------------------------------------------------------ launchers */
template <typename AT, int HS>
static cudaError_t forward_hs(AT *out, float *lse, const AT *qkv, int B, int T, int C, int NH, cudaStream_t st)
{
    size_t smem = sizeof(float) * (2 * BC * HS + BC * BR);
    cudaError_t e = cudaFuncSetAttribute(flash_forward_kernel<AT, HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return e;
    dim3 grid((T + BR - 1) / BR, B * NH);
    flash_forward_kernel<AT, HS><<<grid, BR, smem, st>>>(out, lse, qkv, T, C, NH, 1.0f / sqrtf((float)(C / NH)));
    return cudaGetLastError();
}

template <typename AT, int HS>
static cudaError_t backward_hs(AT *dqkv, float *D, const AT *dout, const AT *out, const float *lse, const AT *qkv,
                               int B, int T, int C, int NH, cudaStream_t st)
{
    const float scale = 1.0f / sqrtf((float)(C / NH));
    size_t rows = (size_t)B * NH * T;
    flash_backward_d_kernel<AT><<<(unsigned)((rows + 255) / 256), 256, 0, st>>>(D, dout, out, B, T, C, NH);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    size_t smem_q = sizeof(float) * (2 * BC * HS + 2 * BR * (HS + 1));
    size_t smem_kv = sizeof(float) * (2 * BR * HS + 2 * BC * (HS + 1) + 2 * BR);
    if ((e = cudaFuncSetAttribute(flash_backward_dq_kernel<AT, HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem_q)) != cudaSuccess)
        return e;
    if ((e = cudaFuncSetAttribute(flash_backward_dkv_kernel<AT, HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem_kv)) != cudaSuccess)
        return e;
    dim3 gq((T + BR - 1) / BR, B * NH), gkv((T + BC - 1) / BC, B * NH);
    flash_backward_dq_kernel<AT, HS><<<gq, BR, smem_q, st>>>(dqkv, D, dout, lse, qkv, T, C, NH, scale);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    flash_backward_dkv_kernel<AT, HS><<<gkv, BC, smem_kv, st>>>(dqkv, D, dout, lse, qkv, T, C, NH, scale);
    return cudaGetLastError();
}

/* HS: the head size rounded up to 32, 64 or 128 (the loops skip d >= hs) */
template <typename AT>
cudaError_t gpt_cuda_flash_forward(AT *out, float *lse, const AT *qkv, int B, int T, int C, int NH,
                                   cudaStream_t stream)
{
    int hs = C / NH;
    if (hs <= 32) return forward_hs<AT, 32>(out, lse, qkv, B, T, C, NH, stream);
    if (hs <= 64) return forward_hs<AT, 64>(out, lse, qkv, B, T, C, NH, stream);
    if (hs <= GPT_FLASH_MAX_HS) return forward_hs<AT, GPT_FLASH_MAX_HS>(out, lse, qkv, B, T, C, NH, stream);
    return cudaErrorInvalidValue;
}

template <typename AT>
cudaError_t gpt_cuda_flash_backward(AT *dqkv, float *D, const AT *dout, const AT *out, const float *lse,
                                    const AT *qkv, int B, int T, int C, int NH, cudaStream_t stream)
{
    int hs = C / NH;
    if (hs <= 32) return backward_hs<AT, 32>(dqkv, D, dout, out, lse, qkv, B, T, C, NH, stream);
    if (hs <= 64) return backward_hs<AT, 64>(dqkv, D, dout, out, lse, qkv, B, T, C, NH, stream);
    if (hs <= GPT_FLASH_MAX_HS)
        return backward_hs<AT, GPT_FLASH_MAX_HS>(dqkv, D, dout, out, lse, qkv, B, T, C, NH, stream);
    return cudaErrorInvalidValue;
}

template cudaError_t gpt_cuda_flash_forward<float>(float *, float *, const float *, int, int, int, int, cudaStream_t);
template cudaError_t gpt_cuda_flash_forward<__nv_bfloat16>(__nv_bfloat16 *, float *, const __nv_bfloat16 *, int, int,
                                                           int, int, cudaStream_t);
template cudaError_t gpt_cuda_flash_backward<float>(float *, float *, const float *, const float *, const float *,
                                                    const float *, int, int, int, int, cudaStream_t);
template cudaError_t gpt_cuda_flash_backward<__nv_bfloat16>(__nv_bfloat16 *, float *, const __nv_bfloat16 *,
                                                            const __nv_bfloat16 *, const float *,
                                                            const __nv_bfloat16 *, int, int, int, int, cudaStream_t);
