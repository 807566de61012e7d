/* Internal: fused ("flash") causal attention, the algorithm written once.
 *
 * The attention of one (batch, head) without the T x T probability matrix:
 * queries are taken in tiles of GPT_FLASH_BR rows, keys in tiles of
 * GPT_FLASH_BC; each query row keeps a running max m, a running sum l of
 * exp(s - m) and an unnormalised output o, rescaled by exp(m_old - m_new)
 * whenever a key tile raises the max (the online softmax of Milakov &
 * Gimelshein; FlashAttention, Dao et al. 2022). Only the per-row log-sum-exp
 * lse = m + log l is stored for the backward, which recomputes each
 * probability as exp(scale q.k - lse).
 *
 * This file's C functions are the plain twin of the CUDA kernels in
 * gpt_cuda.cu (flash_forward_kernel, flash_backward_*_kernel): the same
 * tiles, the same per-row arithmetic in the same order, so a test on the CPU
 * (tests/model/test_flash.c, against gpt_attention_forward/backward) checks
 * the algorithm the GPU runs. Per row, in this order:
 *
 *   forward, for each key tile [c0, c1) that meets the row (c0 <= t):
 *     s_j   = scale * sum_d q[t,d] k[j,d]             j in [c0, min(c1, t+1)), d ascending
 *     m_new = max(m, max_j s_j);  a = exp(m - m_new)   (m = -inf at first: a = 0)
 *     l = l a;  o = o a;  then for j ascending: p = exp(s_j - m_new); l += p; o += p v[j]
 *     m = m_new
 *   then out[t] = o * (1 / l), lse[t] = m + log l.
 *
 *   backward (no atomics: deterministic; each output is owned by one row):
 *     D[t]  = sum_d dout[t,d] out[t,d]
 *     dq[t] = scale * sum_{j <= t, ascending} p_tj (dout[t].v[j] - D[t]) k[j]
 *     dk[j] = scale * sum_{t >= j, ascending} p_tj (dout[t].v[j] - D[t]) q[t]
 *     dv[j] =         sum_{t >= j, ascending} p_tj dout[t]
 *   with p_tj = exp(scale q[t].k[j] - lse[t]) recomputed in both sums: two
 *   passes (one over query rows, one over key rows) trade one more q.k per
 *   pair for no atomics and no T x T buffer.
 *
 * Layouts as the model's: qkv is (B, T, 3C) = [q | k | v], head h at columns
 * h*hs .. h*hs+hs-1 of each; out and dout are (B, T, C); lse and D are
 * (B, NH, T). */
#ifndef ZERO_MODEL_GPT_FLASH_H
#define ZERO_MODEL_GPT_FLASH_H

#ifdef __cplusplus
extern "C" {
#endif

#define GPT_FLASH_BR 64  /* query rows per tile: one CUDA thread each */
#define GPT_FLASH_BC 64  /* keys per tile staged in shared memory */
#define GPT_FLASH_MAX_HS 128 /* the CUDA kernels keep a row of q and o in registers */

/* out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C); hs = C / NH <= GPT_FLASH_MAX_HS. */
void gpt_flash_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
/* dqkv (B, T, 3C, overwritten) from dout and the forward's out and lse;
 * D: (B, NH, T) floats of scratch. */
void gpt_flash_backward(float *dqkv, float *D, const float *dout, const float *out, const float *lse,
                        const float *qkv, int B, int T, int C, int NH);

#ifdef __cplusplus
}
#endif

#endif
