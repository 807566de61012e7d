/* The AVX-512 GEMM kernels (gpt_gemm_impl.h): a 12 x 32 micro-tile of C held
 * in 24 zmm registers, one broadcast of A per row and two vector loads of B
 * per K step. The fp32 kernel multiplies with FMA; the bf16 kernel with
 * vdpbf16ps, which sums two bf16 products per lane into fp32 (twice the
 * multiplies per instruction). Compiled for those instructions function by
 * function (target attributes) and called only after CPUID said yes, so the
 * rest of the build stays baseline x86-64. */
#include "gpt_gemm_impl.h"

#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define TARGET_F32 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16")))

#define MR GPT_GEMM_MR
#define NR GPT_GEMM_NR

/* lanes [0, n) of a 16-lane vector, n clamped to [0, 16] */
static inline __mmask16 first_lanes(int n)
{
    return n <= 0 ? 0 : n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* ------------------------------------------------------------ stores */
/* C rows [0, mr) and columns [0, nr) of the tile = alpha * acc + beta * C */
#define STORE_TILE(c0, c1)                                                                                       \
    do {                                                                                                         \
        __mmask16 m0 = first_lanes(nr), m1 = first_lanes(nr - 16);                                               \
        __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);                                            \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++)                                                    \
        {                                                                                                        \
            if (r >= mr) break;                                                                                  \
            float *c = C + r * ldc;                                                                              \
            __m512 v0 = _mm512_mul_ps(va, c0[r]), v1 = _mm512_mul_ps(va, c1[r]);                                 \
            if (beta != 0.0f) {                                                                                  \
                v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), v0);                                      \
                v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), v1);                                 \
            }                                                                                                    \
            _mm512_mask_storeu_ps(c, m0, v0);                                                                    \
            _mm512_mask_storeu_ps(c + 16, m1, v1);                                                               \
        }                                                                                                        \
    } while (0)

/* ------------------------------------------------------------ fp32 */
TARGET_F32 static void pack_f32(void *panel, const float *x, ptrdiff_t ls, ptrdiff_t ks, int lanes, int kc, int W)
{
    float *d = panel;
    if (ls == 1) { /* lanes contiguous: a (masked) vector copy per K step */
        for (int k = 0; k < kc; k++, d += W)
            for (int l = 0; l < W; l += 16) {
                __mmask16 wm = first_lanes(W - l);
                __m512 v = _mm512_maskz_loadu_ps(wm & first_lanes(lanes - l), x + k * ks + l);
                _mm512_mask_storeu_ps(d + l, wm, v);
            }
        return;
    }
    /* K contiguous per lane: a transpose, lane by lane */
    for (int l = 0; l < W; l++) {
        const float *s = x + l * ls;
        if (l < lanes)
            for (int k = 0; k < kc; k++) d[(size_t)k * W + l] = s[k * ks];
        else
            for (int k = 0; k < kc; k++) d[(size_t)k * W + l] = 0.0f;
    }
}

TARGET_F32 static void kernel_f32(int kc, const void *a_panel, const void *b_panel, float *C, ptrdiff_t ldc,
                                  int mr, int nr, float alpha, float beta)
{
    const float *a = a_panel, *b = b_panel;
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) c0[r] = c1[r] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++, a += MR, b += NR) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            __m512 av = _mm512_set1_ps(a[r]);
            c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
        }
    }
    STORE_TILE(c0, c1);
}

/* ------------------------------------------------------------ bf16 */
/* Two rows of 16 floats -> 16 pairs (x[l], y[l]) of bf16, each pair one
 * 32-bit lane: vcvtne2ps2bf16 rounds to nearest even, then the halves are
 * interleaved. */
TARGET_BF16 static inline __m512i pair_rows(__m512 x, __m512 y)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    /* cvtne2ps_pbh(hi, lo): lanes 0-15 are lo, 16-31 hi; idx takes lo[l] to 2l and hi[l] to 2l+1 */
    __m512i both = (__m512i)_mm512_cvtne2ps_pbh(y, x);
    return _mm512_permutexvar_epi16(idx, both);
}

TARGET_BF16 static void pack_bf16(void *panel, const float *x, ptrdiff_t ls, ptrdiff_t ks, int lanes, int kc,
                                  int W)
{
    uint32_t *d = panel;
    int kp_n = (kc + 1) / 2;
    if (ls == 1) { /* lanes contiguous: rows k and k+1 interleaved */
        for (int kp = 0; kp < kp_n; kp++, d += W) {
            const float *s0 = x + 2 * kp * ks, *s1 = s0 + ks;
            int has1 = 2 * kp + 1 < kc;
            for (int l = 0; l < W; l += 16) {
                __mmask16 wm = first_lanes(W - l), lm = wm & first_lanes(lanes - l);
                __m512 v0 = _mm512_maskz_loadu_ps(lm, s0 + l);
                __m512 v1 = has1 ? _mm512_maskz_loadu_ps(lm, s1 + l) : _mm512_setzero_ps();
                _mm512_mask_storeu_epi32(d + l, wm, pair_rows(v0, v1));
            }
        }
        return;
    }
    /* K contiguous per lane (ks == 1 in every caller): 32 K values become
     * 16 pairs in K order, written down the lane's column of the panel */
    for (int l = 0; l < W; l++) {
        const float *s = x + l * ls;
        for (int kp0 = 0; kp0 < kp_n; kp0 += 16) {
            uint32_t pairs[16];
            int k0 = 2 * kp0, n = l < lanes ? kc - k0 : 0;
            if (ks == 1) {
                __m512 lo = _mm512_maskz_loadu_ps(first_lanes(n), s + k0);
                __m512 hi = _mm512_maskz_loadu_ps(first_lanes(n - 16), s + k0 + 16);
                _mm512_storeu_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            } else {
                float tmp[32];
                for (int q = 0; q < 32; q++) tmp[q] = q < n ? s[(k0 + q) * ks] : 0.0f;
                _mm512_storeu_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(tmp + 16),
                                                                        _mm512_loadu_ps(tmp)));
            }
            int q1 = kp_n - kp0 < 16 ? kp_n - kp0 : 16;
            for (int q = 0; q < q1; q++) d[(size_t)(kp0 + q) * W + l] = pairs[q];
        }
    }
}

TARGET_BF16 static void kernel_bf16(int kc, const void *a_panel, const void *b_panel, float *C, ptrdiff_t ldc,
                                    int mr, int nr, float alpha, float beta)
{
    const uint32_t *a = a_panel, *b = b_panel;
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) c0[r] = c1[r] = _mm512_setzero_ps();
    for (int kp = (kc + 1) / 2; kp > 0; kp--, a += MR, b += NR) {
        __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 16);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r]);
            c0[r] = _mm512_dpbf16_ps(c0[r], av, b0);
            c1[r] = _mm512_dpbf16_ps(c1[r], av, b1);
        }
    }
    STORE_TILE(c0, c1);
}

static const gpt_gemm_impl avx512_f32 = {"avx512", 1, pack_f32, kernel_f32};
static const gpt_gemm_impl avx512_bf16 = {"avx512_bf16", 2, pack_bf16, kernel_bf16};

const gpt_gemm_impl *gpt_gemm_avx512_f32(void) { return &avx512_f32; }
const gpt_gemm_impl *gpt_gemm_avx512_bf16(void) { return &avx512_bf16; }

#else
const gpt_gemm_impl *gpt_gemm_avx512_f32(void) { return NULL; }
const gpt_gemm_impl *gpt_gemm_avx512_bf16(void) { return NULL; }
#endif
