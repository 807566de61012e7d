/* Internal to gpt_gemm.c and its kernel files: what a packed GEMM kernel
 * provides. Both operands are packed into panels of 4-byte units: an fp32
 * value, or a pair of bf16 values adjacent in K (what vdpbf16ps multiplies).
 * A panel of W lanes (rows of op(A), or columns of op(B)) and depth kc is
 * ceil(kc / kpack) units deep, W units per step, lanes past the valid ones
 * and K past kc zero. */
#ifndef ZERO_MODEL_GPT_GEMM_IMPL_H
#define ZERO_MODEL_GPT_GEMM_IMPL_H

#include <stddef.h>

#define GPT_GEMM_MR 12  /* rows of C per micro-tile: broadcast from the A panel */
#define GPT_GEMM_NR 32  /* columns of C per micro-tile: two 16-float vectors */
#define GPT_GEMM_KC 256 /* K per packed block: an A panel (12 KiB) stays in L1 */
#define GPT_GEMM_NC 768 /* columns per packed B block: 768 KiB, in L2 */

typedef struct gpt_gemm_impl {
    const char *name;
    int kpack; /* K values per 4-byte unit: 1 (fp32) or 2 (bf16 pair) */
    /* panel[ceil(kc/kpack)][W] from X, where lane l, depth k is x[l*ls + k*ks] */
    void (*pack)(void *panel, const float *x, ptrdiff_t ls, ptrdiff_t ks, int lanes, int kc, int W);
    /* C[mr,nr] = alpha * (A panel . B panel) + beta * C (beta 0: C is not read) */
    void (*kernel)(int kc, const void *a_panel, const void *b_panel, float *C, ptrdiff_t ldc, int mr, int nr,
                   float alpha, float beta);
} gpt_gemm_impl;

/* NULL where the compiler cannot build them (not x86-64, or no intrinsics) */
const gpt_gemm_impl *gpt_gemm_avx512_f32(void);
const gpt_gemm_impl *gpt_gemm_avx512_bf16(void);

#endif
