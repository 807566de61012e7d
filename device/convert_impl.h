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
    uint32_t u = zero_cvt_f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;

    if (a > 0x7F800000u) /* NaN: quiet it, keep the top payload bits */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* >= 65520 = 65504 + half an ulp: rounds to inf */
        return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x38800000u) { /* normal f16 (>= 2^-14) */
        /* Rebias the exponent (127 -> 15) in place, then drop 13 bits with
         * round-to-nearest-even; a mantissa carry bumps the exponent. */
        uint32_t v = a - 0x38000000u;
        uint32_t h = v >> 13;
        uint32_t rem = v & 0x1FFFu;
        h += (rem > 0x1000u) | ((rem == 0x1000u) & h);
        return (uint16_t)(sign | h);
    }
    if (a <= 0x33000000u) /* <= 2^-25: half the smallest subnormal, ties to 0 */
        return (uint16_t)sign;
    /* Subnormal f16: value = m * 2^-24. With the implicit bit, a = m32 *
     * 2^(e-150), so m = m32 >> (126 - e) rounded; e in [102, 112]. */
    {
        uint32_t e = a >> 23;
        uint32_t m32 = (a & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t h = m32 >> shift;
        uint32_t rem = m32 & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        h += (rem > half) | ((rem == half) & h);
        return (uint16_t)(sign | h); /* h == 0x400 is the smallest normal: right */
    }
}

ZERO_HD float zero_cvt_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = ((uint32_t)h >> 10) & 0x1Fu;
    uint32_t m = (uint32_t)h & 0x3FFu;
    if (e == 0x1Fu) /* inf / NaN: payload kept as is */
        return zero_cvt_bits_f32(sign | 0x7F800000u | (m << 13));
    if (e != 0)
        return zero_cvt_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    if (m == 0)
        return zero_cvt_bits_f32(sign);
    /* Subnormal: normalise so the leading 1 becomes the implicit bit. m < 2^10,
     * so shifting until bit 10 is set takes 1..10 steps. */
    {
        uint32_t exp = 113u; /* biased f32 exponent of 2^-14 */
        while (!(m & 0x400u)) {
            m <<= 1;
            exp--;
        }
        return zero_cvt_bits_f32(sign | (exp << 23) | ((m & 0x3FFu) << 13));
    }
}

#endif
