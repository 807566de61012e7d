/* Internal: f32 -> 16-bit casts of whole arrays with x86 vector units, for
 * the host code that runs them on large arrays (the CPU device's kernels,
 * device/cpu_backend.c; the fused optimizer step's parameter cast,
 * optim/cpu_optim.c). Each gives the bits of convert_impl.h's integer
 * reference for every input; callers check the CPU (and any ZERO_CPU_ISA
 * cap) before calling. x86-64 GCC/clang only: ZERO_CONVERT_X86 is 0
 * elsewhere and nothing is declared. */
#ifndef ZERO_DEVICE_CONVERT_X86_H
#define ZERO_DEVICE_CONVERT_X86_H

#include "convert_impl.h"

#if defined(__GNUC__) && defined(__x86_64__)
#define ZERO_CONVERT_X86 1
#include <immintrin.h>
#include <stddef.h>

/* f32 -> f16 through F16C (vcvtps2ph, 8 lanes): the hardware rounds to
 * nearest even exactly as the reference does for all 2^32 inputs (NaN
 * quieted, top payload kept). Needs avx2 and f16c. */
__attribute__((target("avx2,f16c"))) static inline void zero_x86_f32_to_f16(const float *s, uint16_t *d, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = zero_cvt_f32_to_f16(s[i]);
}

/* f32 -> bf16, 16 lanes a round: the reference's integer rounding
 * ((u + 0x7FFF + lowest kept bit) >> 16, NaN -> its top half with the quiet
 * bit set) in 32-bit lanes, then packed to 16 bits. Needs avx2. */
__attribute__((target("avx2"))) static inline __m256i zero_x86_bf16_bits8(__m256i u)
{
    const __m256i bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    const __m256i quiet = _mm256_set1_epi32(0x0040);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(hi, one)), 16);
    /* |u| > inf as signed 32-bit integers: both are non-negative there */
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), is_nan);
}

__attribute__((target("avx2"))) static inline void zero_x86_f32_to_bf16(const float *s, uint16_t *d, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = zero_x86_bf16_bits8(_mm256_loadu_si256((const __m256i *)(s + i)));
        __m256i b = zero_x86_bf16_bits8(_mm256_loadu_si256((const __m256i *)(s + i + 8)));
        /* every lane is <= 0xFFFF, so the unsigned-saturating pack is exact;
         * it interleaves 128-bit halves (a0 b0 a1 b1), put back in order */
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
        _mm256_storeu_si256((__m256i *)(d + i), packed);
    }
    for (; i < n; i++) d[i] = zero_cvt_f32_to_bf16(s[i]);
}
#else
#define ZERO_CONVERT_X86 0
#endif

#endif
