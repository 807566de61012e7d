/* Internal: the f32 <-> bf16/f16 conversions, written once for every backend.
 *
 * The same inline functions compile as host C (convert.c, cpu_backend.c) and
 * as CUDA device code (cuda_kernels.cu), so the GPU casts are bitwise the CPU
 * reference by construction. They work on bit patterns with integer
 * arithmetic only: no dependence on the FPU rounding mode, on flush-to-zero,
 * or on compiler support for _Float16.
 *
 * Rounding is to nearest, ties to even. NaN stays NaN (made quiet, sign and
 * the top payload bits kept); values past the largest finite 16-bit value
 * (after rounding) become infinity; f16 subnormals are produced exactly. */
#ifndef ZERO_DEVICE_CONVERT_IMPL_H
#define ZERO_DEVICE_CONVERT_IMPL_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define ZERO_HD static __host__ __device__ __forceinline__
#else
#define ZERO_HD static inline
#endif

ZERO_HD uint32_t zero_cvt_f32_bits(float x)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

ZERO_HD float zero_cvt_bits_f32(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* ---------------------------------------------------------------- bf16 */

ZERO_HD uint16_t zero_cvt_f32_to_bf16(float x)
{
    uint32_t u = zero_cvt_f32_bits(x);
    /* Adding 0x7FFF plus the lowest kept bit rounds to nearest even; a carry
     * out of the mantissa bumps the exponent, and out of the largest finite
     * value lands exactly on infinity (0x7F80). */
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (u >> 16) | 0x0040u;
    int is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    return (uint16_t)(is_nan ? quiet_nan : rounded);
}

ZERO_HD float zero_cvt_bf16_to_f32(uint16_t h)
{
    return zero_cvt_bits_f32((uint32_t)h << 16);
}

/* ---------------------------------------------------------------- f16 */

ZERO_HD uint16_t zero_cvt_f32_to_f16(float x)
{
    /* Written as selects rather than early returns so the CPU loops that call
     * it can be if-converted and vectorized; every path is computed, one kept. */
    uint32_t u = zero_cvt_f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;

    /* NaN: quiet it, keep the top payload bits. */
    uint32_t h_nan = 0x7E00u | ((a >> 13) & 0x3FFu);

    /* Normal f16 (a >= 2^-14): rebias the exponent (127 -> 15) in place, then
     * drop 13 bits rounding to nearest even; a mantissa carry bumps the
     * exponent. */
    uint32_t v = a - 0x38000000u;
    uint32_t h_norm = v >> 13;
    uint32_t rem = v & 0x1FFFu;
    h_norm += (uint32_t)(rem > 0x1000u) | ((uint32_t)(rem == 0x1000u) & h_norm);

    /* Subnormal f16 (2^-25 < a < 2^-14): value = m * 2^-24 and a = m32 *
     * 2^(e-150) with the implicit bit, so m = m32 >> (126 - e), rounded;
     * e is in [102, 112] there (clamped so other lanes shift sanely). A
     * result of 0x400 is the smallest normal, which is right. */
    uint32_t e = a >> 23;
    uint32_t shift = e >= 112u ? 14u : (e <= 102u ? 24u : 126u - e);
    uint32_t m32 = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t h_sub = m32 >> shift;
    uint32_t srem = m32 & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    h_sub += (uint32_t)(srem > half) | ((uint32_t)(srem == half) & h_sub);

    uint32_t h = a > 0x7F800000u   ? h_nan
                 : a >= 0x477FF000u ? 0x7C00u /* >= 65520 = 65504 + half an ulp: inf */
                 : a >= 0x38800000u ? h_norm
                 : a > 0x33000000u  ? h_sub
                                    : 0u; /* <= 2^-25: half the smallest subnormal, ties to 0 */
    return (uint16_t)(sign | h);
}

ZERO_HD float zero_cvt_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = ((uint32_t)h >> 10) & 0x1Fu;
    uint32_t m = (uint32_t)h & 0x3FFu;
    uint32_t b_norm = sign | ((e + 112u) << 23) | (m << 13);
    uint32_t b_special = sign | 0x7F800000u | (m << 13); /* inf / NaN, payload kept */
    /* Subnormal: m * 2^-24 with m in [1, 1023] is 2^(p-24) * (m / 2^p) for
     * p = floor(log2 m): exponent field p + 103, mantissa m shifted so its
     * leading 1 becomes the implicit bit. p is counted with comparisons, not
     * a loop or a float conversion, so the CPU loops if-convert and
     * vectorize. Zero (m == 0) is just the sign. */
    uint32_t p = (uint32_t)(m >= 2u) + (m >= 4u) + (m >= 8u) + (m >= 16u) + (m >= 32u) + (m >= 64u) +
                 (m >= 128u) + (m >= 256u) + (m >= 512u);
    uint32_t b_sub = sign | (m ? ((p + 103u) << 23) | ((m << (23u - p)) & 0x7FFFFFu) : 0u);
    uint32_t b = e == 0x1Fu ? b_special : (e == 0u ? b_sub : b_norm);
    return zero_cvt_bits_f32(b);
}

#endif
