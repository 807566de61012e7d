/* The CPU twin of the CUDA flash attention (gpt_flash.h has the algorithm
 * and the order of every sum). Plain loops: a reference, not a fast path;
 * the CPU model keeps its GEMM-based attention (gpt_cpu_ops.c). */
#include "gpt_flash.h"

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
                    const float *qt = q + (size_t)t * C3;
                    float m = -INFINITY, l = 0.0f;
                    for (int d = 0; d < hs; d++) o[d] = 0.0f;
                    for (int c0 = 0; c0 <= t; c0 += GPT_FLASH_BC) { /* key tiles that meet row t */
                        int c1 = c0 + GPT_FLASH_BC < t + 1 ? c0 + GPT_FLASH_BC : t + 1;
                        float mt = -INFINITY;
                        for (int j = c0; j < c1; j++) {
                            const float *kj = k + (size_t)j * C3;
                            float acc = 0.0f;
                            for (int d = 0; d < hs; d++) acc += qt[d] * kj[d];
                            s[j - c0] = scale * acc;
                            mt = fmaxf(mt, s[j - c0]);
                        }
                        float mn = fmaxf(m, mt), a = expf(m - mn);
                        l *= a;
                        for (int d = 0; d < hs; d++) o[d] *= a;
                        for (int j = c0; j < c1; j++) {
                            const float *vj = v + (size_t)j * C3;
                            float p = expf(s[j - c0] - mn);
                            l += p;
                            for (int d = 0; d < hs; d++) o[d] += p * vj[d];
                        }
                        m = mn;
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
            for (int t = 0; t < T; t++) { /* flash_backward_d_kernel */
                float acc = 0.0f;
                for (int d = 0; d < hs; d++) acc += dy[(size_t)t * C + d] * y[(size_t)t * C + d];
                Dh[t] = acc;
            }
            for (int t = 0; t < T; t++) { /* flash_backward_dq_kernel: a thread per query row */
                const float *qt = q + (size_t)t * C3, *dyt = dy + (size_t)t * C;
                float *dqt = dq + (size_t)t * C3;
                for (int d = 0; d < hs; d++) dqt[d] = 0.0f;
                for (int j = 0; j <= t; j++) {
                    const float *kj = k + (size_t)j * C3, *vj = v + (size_t)j * C3;
                    float sq = 0.0f, dp = 0.0f;
                    for (int d = 0; d < hs; d++) sq += qt[d] * kj[d];
                    for (int d = 0; d < hs; d++) dp += dyt[d] * vj[d];
                    float ds = expf(scale * sq - L[t]) * (dp - Dh[t]);
                    for (int d = 0; d < hs; d++) dqt[d] += ds * kj[d];
                }
                for (int d = 0; d < hs; d++) dqt[d] *= scale;
            }
            for (int j = 0; j < T; j++) { /* flash_backward_dkv_kernel: a thread per key row */
                const float *kj = k + (size_t)j * C3, *vj = v + (size_t)j * C3;
                float *dkj = dk + (size_t)j * C3, *dvj = dv + (size_t)j * C3;
                for (int d = 0; d < hs; d++) dkj[d] = dvj[d] = 0.0f;
                for (int t = j; t < T; t++) {
                    const float *qt = q + (size_t)t * C3, *dyt = dy + (size_t)t * C;
                    float sq = 0.0f, dp = 0.0f;
                    for (int d = 0; d < hs; d++) sq += qt[d] * kj[d];
                    for (int d = 0; d < hs; d++) dp += dyt[d] * vj[d];
                    float p = expf(scale * sq - L[t]), ds = p * (dp - Dh[t]);
                    for (int d = 0; d < hs; d++) dvj[d] += p * dyt[d];
                    for (int d = 0; d < hs; d++) dkj[d] += ds * qt[d];
                }
                for (int d = 0; d < hs; d++) dkj[d] *= scale;
            }
        }
}
