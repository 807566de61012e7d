/* The AVX2 fp32 GEMM kernel (gpt_gemm_impl.h): a 6 x 16 micro-tile of C
 * held in 12 ymm registers, one broadcast of A per row and two vector loads
 * of B per K step: 12 FMAs against 8 loads, 15 of the 16 registers (the
 * shape that fits AVX2's register file; the AVX-512 kernel's 12 x 32 would
 * need 24). For CPUs without AVX-512 (Intel Haswell .. Alder Lake, AMD Zen
 * 1-3), where the build's OpenBLAS is the alternative; its kernel then
 * depends on OPENBLAS_CORETYPE, ours on CPUID alone. Compiled for
 * AVX2 + FMA function by function (target attributes) and called only
 * after CPUID said yes. */
#include "gpt_gemm_impl.h"

#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define TARGET_AVX2 __attribute__((target("avx2,fma")))

#define MR 6  /* rows of C per micro-tile */
#define NR 16 /* columns: two 8-float vectors */

/* lanes [0, n) of an 8-lane vector as a maskload/maskstore mask, n clamped to [0, 8] */
TARGET_AVX2 static inline __m256i first_lanes8(int n)
{
    n = n < 0 ? 0 : n > 8 ? 8 : n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* r[i][j] becomes r[j][i] for 8 x 8 floats */
TARGET_AVX2 static inline void transpose8(__m256 r[8])
{
    __m256 t[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        __m256 a = t[4 * i], b = t[4 * i + 1], c = t[4 * i + 2], d = t[4 * i + 3];
        r[4 * i] = _mm256_shuffle_ps(a, c, 0x44);
        r[4 * i + 1] = _mm256_shuffle_ps(a, c, 0xEE);
        r[4 * i + 2] = _mm256_shuffle_ps(b, d, 0x44);
        r[4 * i + 3] = _mm256_shuffle_ps(b, d, 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[4 + i], 0x20);
        t[4 + i] = _mm256_permute2f128_ps(r[i], r[4 + i], 0x31);
    }
    for (int i = 0; i < 8; i++) r[i] = t[i];
}

/* Loads lanes [0, n) of x, zero past them: a plain load when all 8 are there. */
TARGET_AVX2 static inline __m256 load8(const float *x, int n)
{
    return n >= 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, first_lanes8(n));
}

/* A panel of W lanes and depth kc, [kc][W], lanes past `lanes` zero
 * (gpt_gemm_impl.h). W is MR (6) or NR (16). Rows are stored 8 floats at a
 * time with plain stores, in increasing K: a 6-wide row's store runs 2
 * floats into the next row, which that row's own store then overwrites, and
 * the last row's 2 land past the panel, in the caller's A buffer
 * ((GPT_GEMM_KC + 16) x GPT_GEMM_MR_MAX units, far more than 6 KC + 2).
 * AMD's masked stores (vmaskmovps) are microcoded: masked, this packing
 * took 30 % of the GEMM's time on a Zen 3. */
TARGET_AVX2 static void pack_f32(void *panel, const float *x, ptrdiff_t ls, ptrdiff_t ks, int lanes, int kc, int W)
{
    float *d = panel;
    if (ls == 1) { /* lanes contiguous: a vector copy per K step */
        for (int k = 0; k < kc; k++, d += W) {
            /* one row of X per K step, rows far apart: fetch 8 steps ahead
             * (a prefetch past the operand is harmless: it never faults) */
            _mm_prefetch((const char *)(x + (k + 8) * ks), _MM_HINT_T0);
            for (int l = 0; l < W; l += 8) _mm256_storeu_ps(d + l, load8(x + k * ks + l, lanes - l));
        }
        return;
    }
    /* K contiguous per lane (ks == 1 in every caller): 8 lanes x 8 K at a time, transposed */
    for (int l0 = 0; l0 < W; l0 += 8) {
        int nl = lanes - l0;
        for (int k0 = 0; k0 < kc; k0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) {
                if (i < nl) _mm_prefetch((const char *)(x + (l0 + i) * ls + k0 + 32), _MM_HINT_T0);
                if (i >= nl) r[i] = _mm256_setzero_ps();
                else if (ks == 1) r[i] = load8(x + (l0 + i) * ls + k0, kc - k0);
                else {
                    float tmp[8];
                    for (int q = 0; q < 8; q++) tmp[q] = k0 + q < kc ? x[(l0 + i) * ls + (k0 + q) * ks] : 0.0f;
                    r[i] = _mm256_loadu_ps(tmp);
                }
            }
            transpose8(r);
            int nk = kc - k0 < 8 ? kc - k0 : 8;
            for (int i = 0; i < nk; i++) _mm256_storeu_ps(d + (size_t)(k0 + i) * W + l0, r[i]);
        }
    }
}

TARGET_AVX2 static void kernel_f32(int kc, const void *a_panel, const void *b_panel, float *C, ptrdiff_t ldc,
                                   int mr, int nr, float alpha, float beta)
{
    const float *a = a_panel, *b = b_panel;
    __m256 c0[MR], c1[MR];
    /* C's tile is far from here: ask for it now, use it after the K loop */
    for (int r = 0; r < mr; r++) {
        _mm_prefetch((const char *)(C + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + r * ldc + 15), _MM_HINT_T0);
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) c0[r] = c1[r] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++, a += MR, b += NR) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            __m256 av = _mm256_broadcast_ss(a + r);
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
    }
    /* C rows [0, mr), columns [0, nr) = alpha * acc + beta * C; beta 0 never
     * reads C; masked loads and stores only on a tile cut by N's edge */
    __m256i m0 = first_lanes8(nr), m1 = first_lanes8(nr - 8);
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
        if (r >= mr) break;
        float *c = C + r * ldc;
        __m256 v0 = _mm256_mul_ps(va, c0[r]), v1 = _mm256_mul_ps(va, c1[r]);
        if (nr == NR) {
            if (beta != 0.0f) {
                v0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c), v0);
                v1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c + 8), v1);
            }
            _mm256_storeu_ps(c, v0);
            _mm256_storeu_ps(c + 8, v1);
            continue;
        }
        if (beta != 0.0f) {
            v0 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(c, m0), v0);
            v1 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(c + 8, m1), v1);
        }
        _mm256_maskstore_ps(c, m0, v0);
        _mm256_maskstore_ps(c + 8, m1, v1);
    }
}

static const gpt_gemm_impl avx2_f32 = {"avx2", MR, NR, 1, 1, pack_f32, pack_f32, kernel_f32, NULL, NULL};

const gpt_gemm_impl *gpt_gemm_avx2_f32(void) { return &avx2_f32; }

#else
const gpt_gemm_impl *gpt_gemm_avx2_f32(void) { return NULL; }
#endif
