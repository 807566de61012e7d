/* Internal: the CPU kernels of the GPT, one function per operation, each
 * with its backward. Shapes: B batch, T sequence, C channels, N = B*T rows.
 * Every backward ACCUMULATES into parameter gradients; what it does to the
 * input gradient is stated per function. */
#ifndef ZERO_MODEL_GPT_CPU_OPS_H
#define ZERO_MODEL_GPT_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "gpt_gemm.h"

/* The matmuls (linear layers and attention) run on gpt_gemm with the
 * workspace's `math`: GPT_GEMM_BF16 for the bf16 compute path. */

/* out[b,t,:] = wte[tok[b,t],:] + wpe[t,:] */
void gpt_encoder_forward(float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T,
                         int C);
/* dwte[tok[b,t],:] += dout[b,t,:];  dwpe[t,:] += sum_b dout[b,t,:] */
void gpt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C);

/* out = (inp - mean) * rstd * w + b per row; saves mean and rstd (eps 1e-5). */
void gpt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                           const float *b, int N, int C);
/* dinp += ..., dw += ..., db += ...; `partials` holds nthreads * 2C floats. */
void gpt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C,
                            float *partials, int nthreads);

/* out[N,OC] = init + bias + inp[N,C] w[OC,C]^T; init (N x OC, may equal out's
 * residual input) and bias may be NULL. */
void gpt_matmul_forward(gpt_gemm_math math, float *out, const float *init, const float *inp, const float *w,
                        const float *bias, int N, int C, int OC);
/* dinp = (or +=, when accumulate_dinp) dout w;  dw += dout^T inp;  db += column sums of dout
 * (db may be NULL). `partials` holds nthreads * OC floats. */
void gpt_matmul_backward(gpt_gemm_math math, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC, int accumulate_dinp,
                         float *partials, int nthreads);
/* Its two halves (zero-bubble pipelines run them apart: B, then W later):
 * the input gradient, and the weight and bias gradients. The whole is
 * exactly the input half followed by the weight half. */
void gpt_matmul_backward_input(gpt_gemm_math math, float *dinp, const float *dout, const float *w, int N, int C,
                               int OC, int accumulate_dinp);
void gpt_matmul_backward_weight(gpt_gemm_math math, float *dw, float *db, const float *dout, const float *inp, int N,
                                int C, int OC, float *partials, int nthreads);

/* Causal multi-head attention from the fused qkv (N x 3C): out (N x C) and
 * the softmax probabilities att (B, NH, T, T; zero above the diagonal). */
void gpt_attention_forward(gpt_gemm_math math, float *out, float *att, const float *qkv, int B, int T, int C, int NH, int nthreads);
/* dqkv = (overwritten) gradient of the fused qkv; `scratch` holds nthreads * T * T floats. */
void gpt_attention_backward(gpt_gemm_math math, float *dqkv, const float *dout, const float *att, const float *qkv, int B, int T,
                            int C, int NH, float *scratch, int nthreads);

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void gpt_gelu_forward(float *out, const float *inp, size_t n);
/* dinp = dout * gelu'(inp); dinp may alias dout. */
void gpt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* Per row: lse = log sum exp(logits); returns the sum over rows with a target
 * (>= 0) of lse - logits[target], and the number of such rows in *count. */
double gpt_crossentropy_forward(float *lse, const float *logits, const int32_t *targets, int N, int V,
                                long *count);
/* dlogits = scale * (softmax(logits) - onehot(target)); zero rows without a target. */
void gpt_crossentropy_backward(float *dlogits, const float *logits, const float *lse, const int32_t *targets,
                               int N, int V, float scale);

#endif
