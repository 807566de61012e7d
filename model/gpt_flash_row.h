/* Internal: the per-row arithmetic of the flash attention (gpt_flash.h),
 * ONE source for the C twin (gpt_flash.c) and the CUDA kernels
 * (gpt_cuda_flash.cu): each function is what one CUDA thread does for its
 * row against one key (or key tile), so the CPU test of the twin runs the
 * very statements the GPU runs; only the tiling, the thread mapping and the
 * loads differ. hs: the head size; the kernels pass their compile-time
 * padded size (rows zero past hs, which adds exact zeros to every sum and
 * leaves the extra outputs zero) so the loops unroll into registers.
 * Row pointers are fp32. */
#ifndef ZERO_MODEL_GPT_FLASH_ROW_H
#define ZERO_MODEL_GPT_FLASH_ROW_H

#include <math.h>

#ifdef __CUDACC__
#define GPT_FLASH_FN __host__ __device__ __forceinline__ static
#ifdef __CUDA_ARCH__ /* the device pass only: the host compiler knows no such pragma */
#define GPT_FLASH_UNROLL _Pragma("unroll")
#else
#define GPT_FLASH_UNROLL
#endif
#else
#define GPT_FLASH_FN static inline
#define GPT_FLASH_UNROLL
#endif

/* sum_d a[d] b[d], d ascending */
GPT_FLASH_FN float gpt_flash_dot(const float *a, const float *b, int hs)
{
    float acc = 0.0f;
    GPT_FLASH_UNROLL
    for (int d = 0; d < hs; d++) acc += a[d] * b[d];
    return acc;
}

/* Forward: row q against keys k[0..n) and values v[0..n) (row j at k + j*ld,
 * v + j*ld), the row's running max *m, sum *l and unnormalised output o;
 * s: n floats of scratch at stride sst (the scores). */
GPT_FLASH_FN void gpt_flash_fwd_tile(const float *q, const float *k, const float *v, int ld, int n, int hs,
                                     float scale, float *s, int sst, float *m, float *l, float *o)
{
    float mt = -INFINITY;
    for (int j = 0; j < n; j++) {
        float sj = scale * gpt_flash_dot(q, k + j * ld, hs);
        s[j * sst] = sj;
        mt = fmaxf(mt, sj);
    }
    float mn = fmaxf(*m, mt), a = expf(*m - mn); /* *m = -inf at first: a = 0 */
    float lsum = *l * a;
    GPT_FLASH_UNROLL
    for (int d = 0; d < hs; d++) o[d] *= a;
    for (int j = 0; j < n; j++) {
        float p = expf(s[j * sst] - mn);
        const float *vj = v + j * ld;
        lsum += p;
        GPT_FLASH_UNROLL
        for (int d = 0; d < hs; d++) o[d] += p * vj[d];
    }
    *l = lsum;
    *m = mn;
}

/* Backward, query side: key j's share of dq (before the final * scale).
 * q, dy: the query row and its output gradient; lse, D: the row's. */
GPT_FLASH_FN void gpt_flash_dq_key(const float *q, const float *dy, const float *kj, const float *vj, int hs,
                                   float scale, float lse, float D, float *dq)
{
    float ds = expf(scale * gpt_flash_dot(q, kj, hs) - lse) * (gpt_flash_dot(dy, vj, hs) - D);
    GPT_FLASH_UNROLL
    for (int d = 0; d < hs; d++) dq[d] += ds * kj[d];
}

/* Backward, key side: query row t's share of dk (before * scale) and dv. */
GPT_FLASH_FN void gpt_flash_dkv_query(const float *qt, const float *dyt, const float *kj, const float *vj, int hs,
                                      float scale, float lse, float D, float *dk, float *dv)
{
    float p = expf(scale * gpt_flash_dot(qt, kj, hs) - lse), ds = p * (gpt_flash_dot(dyt, vj, hs) - D);
    GPT_FLASH_UNROLL
    for (int d = 0; d < hs; d++) dv[d] += p * dyt[d];
    GPT_FLASH_UNROLL
    for (int d = 0; d < hs; d++) dk[d] += ds * qt[d];
}

#endif
