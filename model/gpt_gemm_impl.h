/* Internal to gpt_gemm.c and its kernel files: what a packed GEMM kernel
 * provides. Both operands are packed into panels of 4-byte units: an fp32
 * value, or a pair of bf16 values adjacent in K (what vdpbf16ps multiplies).
 * A panel of W lanes (rows of op(A), or columns of op(B)) and depth kc is
 * ceil(kc / kpack) units deep, W units per step, lanes past the valid ones
 * and K past kc zero. */
#ifndef ZERO_MODEL_GPT_GEMM_IMPL_H
#define ZERO_MODEL_GPT_GEMM_IMPL_H

#include <stddef.h>

#define GPT_GEMM_MR_MAX 32 /* rows of C per micro-tile, at most (the A panel on the stack) */
#define GPT_GEMM_NR 32     /* columns of C per micro-tile of the AVX-512 and AMX kernels: two 16-float vectors, or two AMX tiles */
#define GPT_GEMM_KC 256    /* K per packed block: an A panel (12-16 KiB) stays in L1 */
#define GPT_GEMM_NC 768    /* columns per packed B block: up to 768 KiB, in L2 */

typedef struct gpt_gemm_impl {
    const char *name;
    int mr;     /* rows of C per micro-tile */
    int nr;     /* columns of C per micro-tile (the width of a B panel) */
    int kpack;  /* K values per 4-byte unit: 1 (fp32) or 2 (bf16 pair) */
    int kalign; /* panel depth rounded up to this many units (zero-filled): 1, or 16 for AMX tiles */
    /* B panel [depth][W] from X, where lane l (column of op(B)), depth k is x[l*ls + k*ks] */
    void (*pack_b)(void *panel, const float *x, ptrdiff_t ls, ptrdiff_t ks, int lanes, int kc, int W);
    /* A panel, the same, lane = row of op(A): [depth][W] for the vector kernels, [W][depth] for AMX */
    void (*pack_a)(void *panel, const float *x, ptrdiff_t ls, ptrdiff_t ks, int lanes, int kc, int W);
    /* C[mr,nr] = alpha * (A panel . B panel) + beta * C (beta 0: C is not read) */
    void (*kernel)(int kc, const void *a_panel, const void *b_panel, float *C, ptrdiff_t ldc, int mr, int nr,
                   float alpha, float beta);
    /* around a run of kernel calls on one thread (AMX: tile configuration); may be NULL */
    void (*begin)(void);
    void (*end)(void);
} gpt_gemm_impl;

/* units of depth of a panel of kc values of K */
static inline int gpt_gemm_depth(const gpt_gemm_impl *im, int kc)
{
    int d = (kc + im->kpack - 1) / im->kpack;
    return (d + im->kalign - 1) / im->kalign * im->kalign;
}

/* NULL where the compiler cannot build them (not x86-64, or no intrinsics) */
const gpt_gemm_impl *gpt_gemm_avx2_f32(void);
const gpt_gemm_impl *gpt_gemm_avx512_f32(void);
const gpt_gemm_impl *gpt_gemm_avx512_bf16(void);
/* NULL also where the OS refuses AMX state to this process (asked once) */
const gpt_gemm_impl *gpt_gemm_amx_bf16(void);

#endif
