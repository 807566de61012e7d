/* The CPU twin of the CUDA flash attention (gpt_flash.h has the algorithm
 * and the order of every sum): the same tiles and row loops as the kernels,
 * the per-row statements shared with them (gpt_flash_row.h). A reference,
 * not a fast path: the CPU model keeps its GEMM-based attention
 * (gpt_cpu_ops.c). */
#include "gpt_flash.h"
#include "gpt_flash_row.h"

#include <math.h>
#include <stddef.h>

void gpt_flash_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float s[GPT_FLASH_BC], o[GPT_FLASH_MAX_HS];
            for (int r0 = 0; r0 < T; r0 += GPT_FLASH_BR) {        /* a query tile: one CUDA block */
                int r1 = r0 + GPT_FLASH_BR < T ? r0 + GPT_FLASH_BR : T;
                for (int t = r0; t < r1; t++) {                     /* a row: one CUDA thread */
                    float m = -INFINITY, l = 0.0f;
                    for (int d = 0; d < hs; d++) o[d] = 0.0f;
                    for (int c0 = 0; c0 <= t; c0 += GPT_FLASH_BC) { /* key tiles that meet row t */
                        int n = (c0 + GPT_FLASH_BC < t + 1 ? c0 + GPT_FLASH_BC : t + 1) - c0;
                        gpt_flash_fwd_tile(q + (size_t)t * C3, k + (size_t)c0 * C3, v + (size_t)c0 * C3, C3, n, hs,
                                           scale, s, 1, &m, &l, o);
                    }
                    float inv = 1.0f / l, *y = out + ((size_t)b * T + t) * C + h * hs;
                    for (int d = 0; d < hs; d++) y[d] = o[d] * inv;
                    lse[((size_t)b * NH + h) * T + t] = m + logf(l);
                }
            }
        }
}

void gpt_flash_backward(float *dqkv, float *D, const float *dout, const float *out, const float *lse,
                        const float *qkv, int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            const float *dy = dout + (size_t)b * T * C + h * hs, *y = out + (size_t)b * T * C + h * hs;
            const float *L = lse + ((size_t)b * NH + h) * T;
            float *Dh = D + ((size_t)b * NH + h) * T;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            for (int t = 0; t < T; t++) /* flash_backward_d_kernel */
                Dh[t] = gpt_flash_dot(dy + (size_t)t * C, y + (size_t)t * C, hs);
            for (int t = 0; t < T; t++) { /* flash_backward_dq_kernel: a thread per query row */
                float *dqt = dq + (size_t)t * C3;
                for (int d = 0; d < hs; d++) dqt[d] = 0.0f;
                for (int j = 0; j <= t; j++)
                    gpt_flash_dq_key(q + (size_t)t * C3, dy + (size_t)t * C, k + (size_t)j * C3, v + (size_t)j * C3,
                                     hs, scale, L[t], Dh[t], dqt);
                for (int d = 0; d < hs; d++) dqt[d] *= scale;
            }
            for (int j = 0; j < T; j++) { /* flash_backward_dkv_kernel: a thread per key row */
                float *dkj = dk + (size_t)j * C3, *dvj = dv + (size_t)j * C3;
                for (int d = 0; d < hs; d++) dkj[d] = dvj[d] = 0.0f;
                for (int t = j; t < T; t++)
                    gpt_flash_dkv_query(q + (size_t)t * C3, dy + (size_t)t * C, k + (size_t)j * C3,
                                        v + (size_t)j * C3, hs, scale, L[t], Dh[t], dkj, dvj);
                for (int d = 0; d < hs; d++) dkj[d] *= scale;
            }
        }
}
