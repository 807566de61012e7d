/* Element-wise reduction kernels of the MPI backend's schedules, and the
 * fp32 accumulation of f16/bf16.
 *
 * MPI has no bf16 type, and a user-defined op on 2-byte elements would round
 * to 16 bits after every partial sum (n-1 roundings, order-dependent). So
 * 16-bit sums are widened to fp32, added in fp32 and rounded once (to nearest
 * even) at the end, with the device layer's integer-exact conversions
 * inlined from device/convert_impl.h.
 *
 * Integers wrap (added as unsigned). Every loop has a variant for each
 * aliasing case it meets (result in place over an operand, or disjoint) so
 * that `restrict` is always true, and this file is compiled at -O3
 * (collectives/meson.build): GCC's -O2 vectorizes no loop of unknown trip
 * count, and these loops run at memory speed only vectorized. */
#include "comm_internal.h"

#include "device/convert_impl.h"

void coll_r16_to_f32(const uint16_t *restrict src, float *restrict dst, size_t n, zero_dtype dtype)
{
    if (dtype == ZERO_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = zero_cvt_bf16_to_f32(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = zero_cvt_f16_to_f32(src[i]);
}

void coll_f32_to_r16(const float *restrict src, uint16_t *restrict dst, size_t n, zero_dtype dtype)
{
    if (dtype == ZERO_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = zero_cvt_f32_to_bf16(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = zero_cvt_f32_to_f16(src[i]);
}

void coll_acc16(float *restrict acc, const uint16_t *restrict x, size_t n, zero_dtype d, int max, int first)
{
    if (first) {
        coll_r16_to_f32(x, acc, n, d);
        return;
    }
#define ACC16(CVT)                                                                  \
    do {                                                                            \
        if (max)                                                                    \
            for (size_t i = 0; i < n; i++) {                                        \
                float v = CVT(x[i]);                                                \
                acc[i] = v > acc[i] ? v : acc[i];                                   \
            }                                                                       \
        else                                                                        \
            for (size_t i = 0; i < n; i++) acc[i] += CVT(x[i]);                     \
    } while (0)
    if (d == ZERO_BF16)
        ACC16(zero_cvt_bf16_to_f32);
    else
        ACC16(zero_cvt_f16_to_f32);
#undef ACC16
}

/* o = a op b over n elements of T; o == a or all three disjoint. */
#define DEFINE_REDUCE(NAME, T, U)                                                   \
    static void NAME##_sum2(T *restrict o, const T *restrict b, size_t n)           \
    {                                                                               \
        for (size_t i = 0; i < n; i++) o[i] = (T)((U)o[i] + (U)b[i]);               \
    }                                                                               \
    static void NAME##_sum3(T *restrict o, const T *restrict a, const T *restrict b, size_t n) \
    {                                                                               \
        for (size_t i = 0; i < n; i++) o[i] = (T)((U)a[i] + (U)b[i]);               \
    }                                                                               \
    static void NAME##_max2(T *restrict o, const T *restrict b, size_t n)           \
    {                                                                               \
        for (size_t i = 0; i < n; i++) o[i] = b[i] > o[i] ? b[i] : o[i];            \
    }                                                                               \
    static void NAME##_max3(T *restrict o, const T *restrict a, const T *restrict b, size_t n) \
    {                                                                               \
        for (size_t i = 0; i < n; i++) o[i] = b[i] > a[i] ? b[i] : a[i];            \
    }                                                                               \
    static void NAME##_op(void *o, const void *a, const void *b, size_t n, int max) \
    {                                                                               \
        if (o == a)                                                                 \
            max ? NAME##_max2(o, b, n) : NAME##_sum2(o, b, n);                      \
        else                                                                        \
            max ? NAME##_max3(o, a, b, n) : NAME##_sum3(o, a, b, n);                \
    }

DEFINE_REDUCE(f32, float, float)
DEFINE_REDUCE(f64, double, double)
DEFINE_REDUCE(i32, int32_t, uint32_t)
DEFINE_REDUCE(i64, int64_t, uint64_t)
DEFINE_REDUCE(u8, uint8_t, unsigned)
#undef DEFINE_REDUCE

void coll_reduce(void *out, const void *a, const void *b, size_t n, zero_dtype d, int max)
{
    switch (d) {
    case ZERO_F32: f32_op(out, a, b, n, max); break;
    case ZERO_F64: f64_op(out, a, b, n, max); break;
    case ZERO_I32: i32_op(out, a, b, n, max); break;
    case ZERO_I64: i64_op(out, a, b, n, max); break;
    case ZERO_U8: u8_op(out, a, b, n, max); break;
    default: break; /* 16-bit floats go through coll_acc16 */
    }
}
