/* The scalar conversions against references written independently of
 * device/convert_impl.h: values decoded with ldexp, rounding decided by
 * comparing exact double distances to the two neighbouring 16-bit values
 * (found by binary search), ties to the even pattern.
 *
 * Properties:
 *  - every 16-bit pattern decodes exactly (bitwise) to the reference value;
 *  - bf16 -> f32 -> bf16 and f16 -> f32 -> f16 are the identity (bitwise) for
 *    every non-NaN pattern, and NaN stays NaN (quiet, same sign);
 *  - f32 -> bf16/f16 equals the reference rounding bitwise over ~1.1 M f32
 *    inputs: a stride through all 2^32 patterns, every midpoint between
 *    adjacent 16-bit values and its f32 neighbours, and the special cases
 *    (zeros, subnormals, the overflow boundary, inf, NaN payloads). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <zero/device.h>

#include "check.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---------------------------------------------------------------- reference decoders */

/* Magnitude of a non-negative, non-NaN 16-bit pattern; the infinity pattern
 * decodes to the next power of two (2^128, 2^16), which is where rounding
 * with an unbounded exponent would put it: RNE overflow is then automatic. */
static double ref_bf16_mag(uint16_t h)
{
    int e = (h >> 7) & 0xFF, m = h & 0x7F;
    if (e == 0) return ldexp(m, -133);      /* 2^-126 * m/128 */
    return ldexp(128 + m, e - 127 - 7);     /* covers 0x7F80 -> 2^128 */
}

static double ref_f16_mag(uint16_t h)
{
    int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0) return ldexp(m, -24);
    return ldexp(1024 + m, e - 15 - 10);    /* covers 0x7C00 -> 2^16 */
}

/* Round |x| (finite, as double) to the 16-bit pattern, [0, inf_pattern]. */
static uint16_t ref_round(double ax, double (*mag)(uint16_t), uint16_t inf_pattern)
{
    if (ax >= mag(inf_pattern)) return inf_pattern;
    /* largest lo with mag(lo) <= ax */
    uint32_t lo = 0, hi = inf_pattern;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (mag((uint16_t)mid) <= ax) lo = mid;
        else hi = mid;
    }
    double dlo = ax - mag((uint16_t)lo), dhi = mag((uint16_t)(lo + 1)) - ax; /* exact in double */
    if (dlo < dhi) return (uint16_t)lo;
    if (dhi < dlo) return (uint16_t)(lo + 1);
    return (uint16_t)((lo & 1) ? lo + 1 : lo);
}

static uint16_t ref_f32_to_bf16(float x)
{
    uint16_t sign = (bits_of(x) >> 16) & 0x8000;
    return sign | ref_round(fabs((double)x), ref_bf16_mag, 0x7F80);
}

static uint16_t ref_f32_to_f16(float x)
{
    uint16_t sign = (bits_of(x) >> 16) & 0x8000;
    return sign | ref_round(fabs((double)x), ref_f16_mag, 0x7C00);
}

/* ---------------------------------------------------------------- checks */

static int bf16_is_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); }
static int f16_is_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }

static long failures_bf16, failures_f16, inputs;

static void check_one(float x)
{
    inputs++;
    uint16_t b = zero_f32_to_bf16(x), h = zero_f32_to_f16(x);
    if (isnan(x)) {
        uint16_t sign = (bits_of(x) >> 16) & 0x8000;
        /* quiet NaN, sign kept */
        if (!bf16_is_nan(b) || !(b & 0x40) || (b & 0x8000) != sign) {
            if (failures_bf16++ < 5) fprintf(stderr, "bf16(NaN %08x) = %04x\n", bits_of(x), b);
        }
        if (!f16_is_nan(h) || !(h & 0x200) || (h & 0x8000) != sign) {
            if (failures_f16++ < 5) fprintf(stderr, "f16(NaN %08x) = %04x\n", bits_of(x), h);
        }
        return;
    }
    uint16_t rb = ref_f32_to_bf16(x), rh = ref_f32_to_f16(x);
    if (b != rb && failures_bf16++ < 5)
        fprintf(stderr, "bf16(%08x = %.9g) = %04x, reference %04x\n", bits_of(x), x, b, rb);
    if (h != rh && failures_f16++ < 5)
        fprintf(stderr, "f16(%08x = %.9g) = %04x, reference %04x\n", bits_of(x), x, h, rh);
}

/* x and its f32 neighbours, both signs */
static void check_around(double v)
{
    float f = (float)v;
    float near[3] = {nextafterf(f, -INFINITY), f, nextafterf(f, INFINITY)};
    for (int i = 0; i < 3; i++) {
        check_one(near[i]);
        check_one(-near[i]);
    }
}

int main(void)
{
    /* 1. decoding and round trips over all 65,536 patterns */
    long rt_bf16 = 0, rt_f16 = 0, dec_bf16 = 0, dec_f16 = 0;
    for (uint32_t p = 0; p < 65536; p++) {
        uint16_t h = (uint16_t)p;
        float fb = zero_bf16_to_f32(h), fh = zero_f16_to_f32(h);
        if (bf16_is_nan(h)) {
            if (!isnan(fb) || !bf16_is_nan(zero_f32_to_bf16(fb))) rt_bf16++;
        } else {
            double ref = ref_bf16_mag(h & 0x7FFF);
            if ((h & 0x7FFF) == 0x7F80) ref = INFINITY;
            if (h & 0x8000) ref = -ref;
            if (bits_of(fb) != bits_of((float)ref)) dec_bf16++;
            if (zero_f32_to_bf16(fb) != h) rt_bf16++;
        }
        if (f16_is_nan(h)) {
            if (!isnan(fh) || !f16_is_nan(zero_f32_to_f16(fh))) rt_f16++;
        } else {
            double ref = ref_f16_mag(h & 0x7FFF);
            if ((h & 0x7FFF) == 0x7C00) ref = INFINITY;
            if (h & 0x8000) ref = -ref;
            if (bits_of(fh) != bits_of((float)ref)) dec_f16++;
            if (zero_f32_to_f16(fh) != h) rt_f16++;
        }
    }
    CHECK_MSG(dec_bf16 == 0, "%ld bf16 patterns decode wrongly", dec_bf16);
    CHECK_MSG(dec_f16 == 0, "%ld f16 patterns decode wrongly", dec_f16);
    CHECK_MSG(rt_bf16 == 0, "%ld bf16 patterns do not round-trip", rt_bf16);
    CHECK_MSG(rt_f16 == 0, "%ld f16 patterns do not round-trip", rt_f16);

    /* 2. f32 -> 16-bit against the reference */
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) check_one(float_of((uint32_t)u));
    /* every midpoint between adjacent 16-bit magnitudes (exact in f32) */
    for (uint32_t p = 0; p < 0x7F80; p++) check_around((ref_bf16_mag(p) + ref_bf16_mag(p + 1)) / 2);
    for (uint32_t p = 0; p < 0x7C00; p++) {
        check_around(ref_f16_mag(p));
        check_around((ref_f16_mag(p) + ref_f16_mag(p + 1)) / 2);
    }
    /* specials */
    const float specials[] = {0.0f, FLT_MIN, FLT_MAX, FLT_TRUE_MIN, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                              0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1p-26f, 0x1p-14f, 0x1.ffcp-15f,
                              3.0e38f, 0x1.fffffep127f, 0x1.fefffep127f, 0x1.ff0000p127f, 1.0f, 1.0f / 3.0f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) check_around(specials[i]);
    check_one(INFINITY);
    check_one(-INFINITY);
    const uint32_t nans[] = {0x7FC00000, 0x7F800001, 0x7FBFFFFF, 0xFF800001, 0x7FFFFFFF, 0xFFC00000,
                             0x7F802000, 0x7F810000};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) check_one(float_of(nans[i]));
    /* 0x7F800001 keeps no payload in 16 bits: it must still be NaN, not inf */
    CHECK(zero_f32_to_bf16(float_of(0x7F800001)) != 0x7F80);
    CHECK(zero_f32_to_f16(float_of(0x7F800001)) != 0x7C00);
    /* a few hand-checked values, as documentation */
    CHECK(zero_f32_to_f16(65504.0f) == 0x7BFF);
    CHECK(zero_f32_to_f16(65519.99f) == 0x7BFF);
    CHECK(zero_f32_to_f16(65520.0f) == 0x7C00);
    CHECK(zero_f32_to_f16(0x1p-24f) == 0x0001);
    CHECK(zero_f32_to_f16(0x1p-25f) == 0x0000);        /* tie to even: 0 */
    CHECK(zero_f32_to_f16(0x1.000002p-25f) == 0x0001); /* just above the tie */
    CHECK(zero_f32_to_f16(0x1.8p-24f) == 0x0002);      /* 1.5 ulp: tie to even 2 */
    CHECK(zero_f32_to_bf16(FLT_MAX) == 0x7F80);        /* rounds up past bf16 max */
    CHECK(zero_f32_to_bf16(0x1.fep127f) == 0x7F7F);
    CHECK(zero_f32_to_bf16(1.00390625f) == 0x3F80);    /* 1 + 2^-8: tie to even */
    CHECK(zero_f32_to_bf16(1.01171875f) == 0x3F82);    /* 1 + 3*2^-8: tie to even (up) */

    CHECK_MSG(failures_bf16 == 0, "%ld of %ld f32 inputs round to bf16 wrongly", failures_bf16, inputs);
    CHECK_MSG(failures_f16 == 0, "%ld of %ld f32 inputs round to f16 wrongly", failures_f16, inputs);
    printf("checked 65536 patterns each way and %ld f32 inputs\n", inputs);
    return check_exit();
}
