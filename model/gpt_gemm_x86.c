/* The AVX-512 GEMM kernels (gpt_gemm_impl.h): a 12 x 32 micro-tile of C held
 * in 24 zmm registers, one broadcast of A per row and two vector loads of B
 * per K step. The fp32 kernel multiplies with FMA; the bf16 kernel with
 * vdpbf16ps, which sums two bf16 products per lane into fp32 (twice the
 * multiplies per instruction). Compiled for those instructions function by
 * function (target attributes) and called only after CPUID said yes, so the
 * rest of the build stays baseline x86-64. */
#include "gpt_gemm_impl.h"

#include <pthread.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define TARGET_F32 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16")))

#define MR 12 /* the vector kernels: 12 x 32 tiles in 24 zmm */
#define NR GPT_GEMM_NR

/* lanes [0, n) of a 16-lane vector, n clamped to [0, 16] */
static inline __mmask16 first_lanes(int n)
{
    return n <= 0 ? 0 : n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* r[i][j] becomes r[j][i]: 16 x 16 32-bit values in 64 shuffles, the packing's
 * transposes (one value at a time they cost a fifth of the GEMM's time). */
TARGET_F32 static inline void transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
        t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
        t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
        r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
        r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xdd);
    }
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
    /* K contiguous per lane (ks == 1 in every caller): 16 lanes x 16 K at a time, transposed */
    for (int l0 = 0; l0 < W; l0 += 16) {
        __mmask16 wm = first_lanes(W - l0);
        int nl = lanes - l0;
        for (int k0 = 0; k0 < kc; k0 += 16) {
            __mmask16 km = first_lanes(kc - k0);
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                if (i >= nl) r[i] = _mm512_setzero_ps();
                else if (ks == 1) r[i] = _mm512_maskz_loadu_ps(km, x + (l0 + i) * ls + k0);
                else {
                    float tmp[16];
                    for (int q = 0; q < 16; q++) tmp[q] = k0 + q < kc ? x[(l0 + i) * ls + (k0 + q) * ks] : 0.0f;
                    r[i] = _mm512_loadu_ps(tmp);
                }
            }
            transpose16(r);
            int nk = kc - k0 < 16 ? kc - k0 : 16;
            for (int i = 0; i < nk; i++) _mm512_mask_storeu_ps(d + (size_t)(k0 + i) * W + l0, wm, r[i]);
        }
    }
}

TARGET_F32 static void kernel_f32(int kc, const void *a_panel, const void *b_panel, float *C, ptrdiff_t ldc,
                                  int mr, int nr, float alpha, float beta)
{
    const float *a = a_panel, *b = b_panel;
    __m512 c0[MR], c1[MR];
    /* C's tile is in memory far from here (C is MBs): ask for it now, use it after the K loop */
    for (int r = 0; r < mr; r++) {
        _mm_prefetch((const char *)(C + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + r * ldc + 16), _MM_HINT_T0);
    }
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

/* The vector kernels' bf16 panel, [depth][W] pairs, and the AMX B panel
 * (the same, depth rounded up to whole tiles): rows kp >= ceil(kc/2) zero. */
TARGET_BF16 static void pack_bf16_depth(uint32_t *d, const float *x, ptrdiff_t ls, ptrdiff_t ks, int lanes, int kc,
                                        int W, int depth)
{
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
    } else {
        /* K contiguous per lane (ks == 1 in every caller): 32 K values of a lane
         * become 16 pairs, 16 lanes at a time, transposed into the panel's rows */
        for (int l0 = 0; l0 < W; l0 += 16) {
            __mmask16 wm = first_lanes(W - l0);
            int nl = lanes - l0;
            for (int kp0 = 0; kp0 < kp_n; kp0 += 16) {
                int k0 = 2 * kp0;
                __m512 r[16];
                for (int i = 0; i < 16; i++) {
                    const float *s = x + (l0 + i) * ls;
                    __m512 lo, hi;
                    if (i >= nl) lo = hi = _mm512_setzero_ps();
                    else if (ks == 1) {
                        lo = _mm512_maskz_loadu_ps(first_lanes(kc - k0), s + k0);
                        hi = _mm512_maskz_loadu_ps(first_lanes(kc - k0 - 16), s + k0 + 16);
                    } else {
                        float tmp[32];
                        for (int q = 0; q < 32; q++) tmp[q] = k0 + q < kc ? s[(k0 + q) * ks] : 0.0f;
                        lo = _mm512_loadu_ps(tmp), hi = _mm512_loadu_ps(tmp + 16);
                    }
                    r[i] = _mm512_castsi512_ps((__m512i)_mm512_cvtne2ps_pbh(hi, lo));
                }
                transpose16(r);
                int nq = kp_n - kp0 < 16 ? kp_n - kp0 : 16;
                for (int q = 0; q < nq; q++) _mm512_mask_storeu_ps((float *)(d + (size_t)(kp0 + q) * W + l0), wm, r[q]);
            }
        }
        d += (size_t)kp_n * W;
    }
    for (int kp = kp_n; kp < depth; kp++, d += W)
        for (int l = 0; l < W; l++) d[l] = 0;
}

TARGET_BF16 static void pack_bf16(void *panel, const float *x, ptrdiff_t ls, ptrdiff_t ks, int lanes, int kc,
                                  int W)
{
    pack_bf16_depth(panel, x, ls, ks, lanes, kc, W, (kc + 1) / 2);
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

/* ------------------------------------------------------------ AMX bf16 */
/* Intel's tile unit (Sapphire Rapids on): C tiles of 16 x 16 fp32 += A tile
 * (16 rows x 16 bf16 pairs) x B tile (16 pairs x 16 columns, the VNNI layout
 * of the B panel above). A 32 x 32 micro-tile: 4 C tiles, 2 A, 2 B, all
 * eight tile registers. The A panel is row-major here ([row][depth]), each
 * row one tile row; depths are whole tiles (16 pairs), zero-filled. Linux
 * hands out the tile state only on request (arch_prctl, once per process). */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__linux__)
#define HAVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

#define TARGET_AMX __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16,amx-tile,amx-bf16")))
#define AMX_MR 32

/* [W][depth] pairs from X: row l of the panel is lane l's K run */
TARGET_BF16 static void pack_amx_a(void *panel, const float *x, ptrdiff_t ls, ptrdiff_t ks, int lanes, int kc,
                                   int W)
{
    uint32_t *d = panel;
    int depth = ((kc + 1) / 2 + 15) / 16 * 16;
    if (ks == 1) { /* rows contiguous in K: convert in place order */
        for (int l = 0; l < W; l++) {
            const float *s = x + l * ls;
            uint32_t *row = d + (size_t)l * depth;
            for (int kp0 = 0; kp0 < depth; kp0 += 16) {
                int k0 = 2 * kp0, n = l < lanes ? kc - k0 : 0;
                __m512 lo = _mm512_maskz_loadu_ps(first_lanes(n), s + k0);
                __m512 hi = _mm512_maskz_loadu_ps(first_lanes(n - 16), s + k0 + 16);
                _mm512_storeu_si512(row + kp0, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            }
        }
        return;
    }
    /* lanes contiguous (ls == 1 in every caller): rows k, k+1 paired per lane,
     * 16 pairs x 16 lanes transposed into the lanes' rows */
    for (int l0 = 0; l0 < W; l0 += 16) {
        __mmask16 lm = first_lanes(lanes - l0) & first_lanes(W - l0);
        int nw = W - l0 < 16 ? W - l0 : 16;
        for (int kp0 = 0; kp0 < depth; kp0 += 16) {
            __m512 r[16];
            for (int q = 0; q < 16; q++) {
                int k = 2 * (kp0 + q);
                __m512 v0 = k < kc ? _mm512_maskz_loadu_ps(lm, x + k * ks + l0 * ls) : _mm512_setzero_ps();
                __m512 v1 = k + 1 < kc ? _mm512_maskz_loadu_ps(lm, x + (k + 1) * ks + l0 * ls) : _mm512_setzero_ps();
                r[q] = _mm512_castsi512_ps(pair_rows(v0, v1));
            }
            transpose16(r);
            for (int i = 0; i < nw; i++) _mm512_storeu_ps((float *)(d + (size_t)(l0 + i) * depth + kp0), r[i]);
        }
    }
}

TARGET_BF16 static void pack_amx_b(void *panel, const float *x, ptrdiff_t ls, ptrdiff_t ks, int lanes, int kc,
                                   int W)
{
    pack_bf16_depth(panel, x, ls, ks, lanes, kc, W, ((kc + 1) / 2 + 15) / 16 * 16);
}

typedef struct amx_tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;

/* Every tile 16 rows x 64 bytes. In static memory: the intrinsic's asm
 * names only the first word of it, so a stack copy's other stores could be
 * dropped by the compiler as dead. */
static const amx_tilecfg amx_cfg = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

TARGET_AMX static void amx_begin(void) { _tile_loadconfig(&amx_cfg); }

TARGET_AMX static void amx_end(void) { _tile_release(); }

TARGET_AMX static void kernel_amx(int kc, const void *a_panel, const void *b_panel, float *C, ptrdiff_t ldc, int mr,
                                  int nr, float alpha, float beta)
{
    const int depth = ((kc + 1) / 2 + 15) / 16 * 16;
    const size_t astride = (size_t)depth * 4, bstride = NR * 4;
    const char *a = a_panel, *b = b_panel;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int kp = 0; kp < depth; kp += 16) {
        _tile_loadd(4, a + (size_t)kp * 4, astride);                /* rows 0-15 */
        _tile_loadd(5, a + 16 * astride + (size_t)kp * 4, astride); /* rows 16-31 */
        _tile_loadd(6, b + (size_t)kp * bstride, bstride);          /* columns 0-15 */
        _tile_loadd(7, b + (size_t)kp * bstride + 64, bstride);     /* columns 16-31 */
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _Alignas(64) float acc[AMX_MR * NR];
    _tile_stored(0, acc, NR * 4);
    _tile_stored(1, acc + 16, NR * 4);
    _tile_stored(2, acc + 16 * NR, NR * 4);
    _tile_stored(3, acc + 16 * NR + 16, NR * 4);
    __mmask16 m0 = first_lanes(nr), m1 = first_lanes(nr - 16);
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int r = 0; r < mr; r++) {
        float *c = C + r * ldc;
        __m512 v0 = _mm512_mul_ps(va, _mm512_load_ps(acc + r * NR));
        __m512 v1 = _mm512_mul_ps(va, _mm512_load_ps(acc + r * NR + 16));
        if (beta != 0.0f) {
            v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), v0);
            v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), v1);
        }
        _mm512_mask_storeu_ps(c, m0, v0);
        _mm512_mask_storeu_ps(c + 16, m1, v1);
    }
}

static const gpt_gemm_impl amx_bf16 = {"amx_bf16", AMX_MR, NR, 2, 16, pack_amx_b, pack_amx_a, kernel_amx, amx_begin,
                                       amx_end};

static int amx_permitted;
static void amx_ask(void)
{
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): Linux 5.16 on */
    amx_permitted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#endif

static const gpt_gemm_impl avx512_f32 = {"avx512", MR, NR, 1, 1, pack_f32, pack_f32, kernel_f32, NULL, NULL};
static const gpt_gemm_impl avx512_bf16 = {"avx512_bf16", MR, NR, 2, 1, pack_bf16, pack_bf16, kernel_bf16, NULL, NULL};

const gpt_gemm_impl *gpt_gemm_avx512_f32(void) { return &avx512_f32; }
const gpt_gemm_impl *gpt_gemm_avx512_bf16(void) { return &avx512_bf16; }

const gpt_gemm_impl *gpt_gemm_amx_bf16(void)
{
#ifdef HAVE_AMX
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_ask);
    return amx_permitted ? &amx_bf16 : NULL;
#else
    return NULL;
#endif
}

#else
const gpt_gemm_impl *gpt_gemm_avx512_f32(void) { return NULL; }
const gpt_gemm_impl *gpt_gemm_avx512_bf16(void) { return NULL; }
const gpt_gemm_impl *gpt_gemm_amx_bf16(void) { return NULL; }
#endif
