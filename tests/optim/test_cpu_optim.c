/* Every instruction-set variant of the CPU AdamW/SGD kernels gives the bits
 * of the scalar reference (optim/cpu_optim.c), on every element: random
 * values over many magnitudes, with zeros of both signs, subnormals,
 * infinities and NaNs mixed in; sizes and start offsets that leave vector
 * remainders and misaligned loads; steps 1-3 and 20000 (where the bias
 * correction sqrt(1 - beta2^t) is 1 in float and the vector loops skip its
 * division); SGD with and without momentum, nesterov and the first step; and the threaded entry points (zero_cpu_adamw/sgd,
 * whatever variant is active) give the same bits as one scalar pass.
 * The AVX2 variant divides by bc2 through its reciprocal and an FMA
 * correction (optim/cpu_optim.c, bc2_div8): that division alone gives the
 * division's bits for every significand of a in three binades and special
 * values, at bc2 values including the ends of its range; and the kernel at
 * those bc2 values, lengths 0..67 at offsets 0..3, matches the reference.
 * Variants the CPU cannot run are reported and skipped; on this project's
 * x86-64 CI every variant but avx512 (where the CPU lacks it) runs. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device/convert_impl.h"
#include "device/convert_x86.h"
#include "optim/cpu_optim.h"
#include "zero_build_config.h"
#if ZERO_HAVE_OPENMP
#include <omp.h>
#endif

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* Mostly ordinary values over a wide range of magnitudes, some special. */
static float random_value(int nonneg)
{
    uint32_t k = next32() % 64;
    float x;
    uint32_t bits;
    switch (k) {
    case 0: x = 0.0f; break;
    case 1: x = -0.0f; break;
    case 2: bits = next32() & 0x007FFFFFu; memcpy(&x, &bits, 4); break; /* subnormal */
    case 3: x = INFINITY; break;
    case 4: x = -INFINITY; break;
    case 5: x = NAN; break;
    default: {
        double mant = (double)(next32() % 1000000) / 1000000.0 + 0.5;
        int e = (int)(next32() % 40) - 30;
        x = (float)ldexp(next32() & 1 ? -mant : mant, e);
    }
    }
    if (nonneg && (signbit(x) || isnan(x))) x = k == 5 ? x : -x; /* v is >= 0 or NaN in real use */
    return x;
}

static void fill(float *a, size_t n, int nonneg)
{
    for (size_t i = 0; i < n; i++) a[i] = random_value(nonneg);
}

/* Bit for bit, except that any NaN equals any NaN: when two NaNs meet in a
 * commutative operation, x86 returns the first operand's, and which operand
 * comes first is the compiler's choice per variant. Every finite, infinite
 * and zero result (sign included) must match exactly. */
static int same_bits(const float *a, const float *b, size_t n, size_t *where)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, 4) != 0 && !(isnan(a[i]) && isnan(b[i]))) {
            *where = i;
            return 0;
        }
    return 1;
}

/* 1: hyper() asks for AdamW's fast mode (the reciprocal estimate). */
static int g_fast;

static zero_optim_hyper hyper(int step, int nesterov, int with_wd)
{
    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, wd = with_wd ? 0.01 : 0.0, t = step;
    zero_optim_hyper h = {0};
    h.grad_scale = 0.37f;
    h.decay = (float)(1.0 - lr * wd);
    h.beta1 = (float)b1, h.one_minus_beta1 = (float)(1.0 - b1);
    h.beta2 = (float)b2, h.one_minus_beta2 = (float)(1.0 - b2);
    h.neg_step_size = (float)(-(lr / (1.0 - pow(b1, t))));
    h.bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
    h.eps = 1e-8f;
    h.fast = g_fast;
    h.fast_num = (float)(-(lr / (1.0 - pow(b1, t))) * sqrt(1.0 - pow(b2, t)));
    h.fast_eps = (float)(1e-8 * sqrt(1.0 - pow(b2, t)));
    h.neg_lr = (float)-lr;
    h.weight_decay = (float)wd;
    h.momentum = 0.9f;
    h.one_minus_dampening = 0.75f;
    h.nesterov = nesterov;
    h.first = step == 1;
    return h;
}

/* A NaN in bf16 (dt 0) or f16 (dt 1) bits: exponent all ones, mantissa not zero. */
static int half_is_nan(uint16_t h, int dt)
{
    return dt ? (h & 0x7c00) == 0x7c00 && (h & 0x03ff) : (h & 0x7f80) == 0x7f80 && (h & 0x007f);
}

#define N 70001 /* not a multiple of any vector width; > the kernels' threading threshold */

/* The spacing of floats at |x|: 2^(exponent - 23), 2^-149 for subnormals. */
static double ulp_of(float x)
{
    if (!(fabsf(x) >= 0x1p-126f)) return 0x1p-149;
    return ldexp(1.0, ilogb(x) - 23);
}

/* AdamW's fast mode against the exact kernel, element by element: m and v
 * bitwise, and the update (the kernel's output for p = 0 and decay 1, where
 * p * decay + u is exactly u) within 8 ulps of the exact update, the bound
 * optim/cpu_optim.c states (where -step_size * m is a normal float);
 * non-finite and zero updates of the same kind and sign. Random
 * values over many magnitudes with zeros, subnormals, infinities and NaNs
 * mixed in (the v >= 0 of real use), eps 1e-8 and 1e-30, steps 1, 10 and
 * 20000, by the scalar reference (every variant has its bits, checked above). */
static void check_fast_bound(const zero_cpu_optim_variant *ref, const float *p0, const float *g, const float *m0,
                             const float *v0, float *pe, float *me, float *ve, float *pf, float *mf, float *vf)
{
    (void)p0;
    double worst = 0.0;
    long skipped = 0;
    const int steps[] = {1, 10, 20000};
    const float epss[] = {1e-8f, 1e-30f};
    for (size_t si = 0; si < 3; si++)
        for (size_t ei = 0; ei < 2; ei++) {
            zero_optim_hyper h = hyper(steps[si], 0, 0);
            h.decay = 1.0f;
            h.eps = epss[ei];
            h.fast_eps = (float)((double)epss[ei] * sqrt(1.0 - pow(0.999, steps[si])));
            memset(pe, 0, N * 4), memcpy(me, m0, N * 4), memcpy(ve, v0, N * 4);
            memset(pf, 0, N * 4), memcpy(mf, m0, N * 4), memcpy(vf, v0, N * 4);
            h.fast = 0;
            ref->adamw(&h, pe, g, me, ve, 0, N);
            h.fast = 1;
            ref->adamw(&h, pf, g, mf, vf, 0, N);
            size_t at = 0;
            CHECK_MSG(same_bits(me, mf, N, &at) && same_bits(ve, vf, N, &at),
                      "fast AdamW step %d eps %g: moment %zu differs from the exact kernel's", steps[si],
                      (double)epss[ei], at);
            size_t bad = N;
            for (size_t i = 0; i < N; i++) {
                const float e = pe[i], f = pf[i];
                /* the bound's domain: both numerators (-step_size * m, and
                 * times bc2) normal floats; below 2^-126 they round in
                 * absolute terms, the exact kernel's too (updates < 1e-30) */
                const float na = h.neg_step_size * me[i], nb = h.fast_num * me[i];
                if (isfinite(na) && (fabsf(na) < 0x1p-126f || fabsf(nb) < 0x1p-126f) && na != 0.0f) {
                    skipped++;
                    continue;
                }
                if (!isfinite(e) || e == 0.0f) {
                    /* same NaN-ness, same infinity, same zero (sign included) */
                    int ok = isnan(e) ? isnan(f) : memcmp(&e, &f, 4) == 0;
                    if (!ok && bad == N) bad = i;
                    continue;
                }
                double u = fabs((double)f - (double)e) / ulp_of(e);
                if (!(u <= 8.0) && bad == N) bad = i;
                if (u > worst) worst = u;
            }
            CHECK_MSG(bad == N, "fast AdamW step %d eps %g: update %zu is %.9g, exact %.9g (g %g m %g v %g)", steps[si],
                      (double)epss[ei], bad, bad < N ? (double)pf[bad] : 0.0, bad < N ? (double)pe[bad] : 0.0,
                      bad < N ? (double)g[bad] : 0.0, bad < N ? (double)m0[bad] : 0.0, bad < N ? (double)v0[bad] : 0.0);
        }
    printf("fast AdamW: largest difference from the exact update %.3f ulps (bound 8); %ld of %d updates had a "
           "subnormal numerator (outside the bound's domain)\n", worst, skipped, 6 * N);
}

/* bc2_div8 (the AVX2 variant's fl(a / bc2) without the divider) against
 * the division, bit for bit: every float a in [1, 2), [2^-75, 2^-74) (the
 * square roots of subnormals start at 2^-74.5) and [2^63, 2^64) (up to
 * sqrt(FLT_MAX)), and zeros, infinities, NaN; at the bias corrections of
 * steps 1-3, the ends of the method's range [2^-20, 1) and significands of
 * all ones. Skipped (reported) where the CPU lacks AVX2 or FMA. */
static void check_bc2_div(void)
{
    const float bc2s[] = {hyper(1, 0, 0).bc2_sqrt, hyper(2, 0, 0).bc2_sqrt, hyper(3, 0, 0).bc2_sqrt, 0x1p-20f,
                          0x1.fffffep-1f, 0x1.fffffep-3f, 0x1.800002p-7f};
    const int binades[] = {0, -75, 63};
    enum { CH = 65536 };
    float *a = malloc(CH * 4), *q = malloc(CH * 4);
    if (!a || !q) {
        CHECK(0);
        return;
    }
    long tested = 0;
    for (size_t bi = 0; bi < sizeof bc2s / sizeof *bc2s; bi++) {
        const float bc2 = bc2s[bi];
        if (!zero_cpu_optim_bc2_div(a, q, 0, bc2)) {
            printf("bc2_div: no AVX2 + FMA on this CPU (or not x86), skipped\n");
            break;
        }
        /* all three binades at two bc2 values, [1, 2) at the others (the
         * test's time); scaling a by a power of two scales the quotient */
        for (size_t e = 0; e < (bi < 2 ? sizeof binades / sizeof *binades : 1); e++)
            for (uint32_t start = 0; start < (1u << 23); start += CH) {
                for (uint32_t i = 0; i < CH; i++) {
                    uint32_t bits = ((uint32_t)(binades[e] + 127) << 23) | (start + i);
                    memcpy(a + i, &bits, 4);
                }
                if (start == 0) a[0] = 0.0f, a[1] = -0.0f, a[2] = INFINITY, a[3] = NAN, a[9] = 0x1.fffffep63f;
                CHECK(zero_cpu_optim_bc2_div(a, q, CH, bc2));
                size_t bad = CH;
                for (uint32_t i = 0; i < CH && bad == CH; i++) {
                    const float want = a[i] / bc2;
                    if (memcmp(&want, q + i, 4) != 0 && !(isnan(want) && isnan(q[i]))) bad = i;
                }
                CHECK_MSG(bad == CH, "bc2_div: %a / %a gave %a, the division %a", bad < CH ? (double)a[bad] : 0.0,
                          (double)bc2, bad < CH ? (double)q[bad] : 0.0, bad < CH ? (double)(a[bad] / bc2) : 0.0);
                tested += CH;
            }
    }
    if (tested) printf("bc2_div: %ld quotients bitwise equal to the division\n", tested);
    free(a), free(q);
}

/* Every variant's kernel at bc2 values at and beyond the ends of the AVX2
 * reciprocal's range (2^-20 and just below it, where it divides; just
 * below 1), lengths 0..67 at offsets 0..3: the vector loop, its remainder
 * and the switch between the paths, bitwise against the reference. */
static void check_bc2_range(const zero_cpu_optim_variant *ref, const float *p0, const float *g, const float *m0,
                            const float *v0, float *pr, float *mr, float *vr, float *pt, float *mt, float *vt)
{
    const float bc2s[] = {0x1p-20f, 0x1.fffffep-21f, 0x1.fffffep-1f, 0x1.800002p-7f};
    for (int vi = 0; zero_cpu_optim_variant_at(vi); vi++) {
        const zero_cpu_optim_variant *k = zero_cpu_optim_variant_at(vi);
        if (!zero_cpu_optim_supported(k)) continue;
        for (size_t bi = 0; bi < sizeof bc2s / sizeof *bc2s; bi++) {
            zero_optim_hyper h = hyper(2, 0, 1);
            h.bc2_sqrt = bc2s[bi];
            for (size_t lo = 0; lo < 4; lo++)
                for (size_t len = 0; len <= 67; len++) {
                    /* a window of W elements: the range and what lies past it, untouched */
                    enum { W = 128 };
                    size_t at = 0;
                    memcpy(pr, p0, W * 4), memcpy(mr, m0, W * 4), memcpy(vr, v0, W * 4);
                    memcpy(pt, p0, W * 4), memcpy(mt, m0, W * 4), memcpy(vt, v0, W * 4);
                    ref->adamw(&h, pr, g, mr, vr, lo, lo + len);
                    k->adamw(&h, pt, g, mt, vt, lo, lo + len);
                    CHECK_MSG(same_bits(pr, pt, W, &at) && same_bits(mr, mt, W, &at) && same_bits(vr, vt, W, &at),
                              "adamw %s bc2 %a [%zu, %zu): element %zu differs", k->name, (double)bc2s[bi], lo,
                              lo + len, at);
                }
        }
    }
}

/* The vector casts of the fused step's parameter write (device/convert_x86.h)
 * against the integer reference, bit for bit: every low half (rounding
 * bits, ties, NaN payloads) under high halves that cover zero, subnormals,
 * normal values, the largest finite (rounding up to infinity), infinity and
 * NaN, both signs; arrays of 65536 + 5 so the scalar tail runs too. */
static void check_x86_casts(void)
{
#if ZERO_CONVERT_X86
    if (!__builtin_cpu_supports("avx2")) {
        printf("vector casts: no AVX2, skipped\n");
        return;
    }
    const int f16c = __builtin_cpu_supports("f16c");
    static const uint16_t highs[] = {0x0000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x3FFF, 0x4049, 0x477F, 0x4780,
                                     0x7F7E, 0x7F7F, 0x7F80, 0x7FC0, 0x7FFF, 0x8000, 0x8001, 0x807F, 0xBF80,
                                     0xC7FF, 0xFF7F, 0xFF80, 0xFFC0, 0xFFFF, 0x3380, 0x3880, 0x387F};
    const size_t n = 65536 + 5;
    float *x = malloc(n * sizeof *x);
    uint16_t *got = malloc(n * 2);
    long bad_bf16 = 0, bad_f16 = 0;
    for (size_t h = 0; x && got && h < sizeof highs / sizeof highs[0]; h++) {
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)highs[h] << 16 | (uint32_t)(i & 0xFFFF);
            memcpy(&x[i], &u, 4);
        }
        zero_x86_f32_to_bf16(x, got, n);
        for (size_t i = 0; i < n; i++) bad_bf16 += got[i] != zero_cvt_f32_to_bf16(x[i]);
        if (!f16c) continue;
        zero_x86_f32_to_f16(x, got, n);
        for (size_t i = 0; i < n; i++) bad_f16 += got[i] != zero_cvt_f32_to_f16(x[i]);
    }
    CHECK_MSG(x && got && bad_bf16 == 0, "vector f32 -> bf16 cast: %ld values differ from the reference", bad_bf16);
    CHECK_MSG(bad_f16 == 0, "vector f32 -> f16 cast (F16C): %ld values differ from the reference", bad_f16);
    free(x);
    free(got);
#endif
}

int main(void)
{
    float *p0 = malloc(N * 4), *g = malloc(N * 4), *m0 = malloc(N * 4), *v0 = malloc(N * 4);
    float *pr = malloc(N * 4), *mr = malloc(N * 4), *vr = malloc(N * 4);
    float *pt = malloc(N * 4), *mt = malloc(N * 4), *vt = malloc(N * 4);
    if (!p0 || !g || !m0 || !v0 || !pr || !mr || !vr || !pt || !mt || !vt) return 1;
    fill(p0, N, 0), fill(g, N, 0), fill(m0, N, 0), fill(v0, N, 1);
    const zero_cpu_optim_variant *ref = NULL;
    for (int i = 0; zero_cpu_optim_variant_at(i); i++) ref = zero_cpu_optim_variant_at(i);
    CHECK(ref && !strcmp(ref->name, "scalar"));
    const size_t offsets[] = {0, 1, 3, 7, 13};
    const size_t sizes[] = {1, 5, 15, 16, 17, 33, 255, 4099};
    int tested = 0;
    for (int vi = 0; zero_cpu_optim_variant_at(vi); vi++) {
        const zero_cpu_optim_variant *k = zero_cpu_optim_variant_at(vi);
        if (!zero_cpu_optim_supported(k)) {
            printf("variant %s: not supported by this CPU, skipped\n", k->name);
            continue;
        }
        tested++;
        for (g_fast = 0; g_fast < 2; g_fast++) {
        /* step 20000: bc2_sqrt rounds to 1, where the vector loops leave
         * its division out (x / 1 == x); the scalar reference divides */
        const int steps[] = {1, 2, 3, 20000};
        CHECK(hyper(20000, 0, 0).bc2_sqrt == 1.0f && hyper(3, 0, 0).bc2_sqrt != 1.0f);
        for (size_t sti = 0; sti < sizeof steps / sizeof *steps; sti++) {
            const int step = steps[sti];
            for (int wd = 0; wd <= 1; wd++) {
                zero_optim_hyper h = hyper(step, 0, wd);
                for (size_t oi = 0; oi < sizeof offsets / sizeof *offsets; oi++) {
                    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
                        size_t lo = offsets[oi], hi = lo + sizes[si], at = 0;
                        memcpy(pr, p0, N * 4), memcpy(mr, m0, N * 4), memcpy(vr, v0, N * 4);
                        memcpy(pt, p0, N * 4), memcpy(mt, m0, N * 4), memcpy(vt, v0, N * 4);
                        ref->adamw(&h, pr, g, mr, vr, lo, hi);
                        k->adamw(&h, pt, g, mt, vt, lo, hi);
                        CHECK_MSG(same_bits(pr, pt, N, &at) && same_bits(mr, mt, N, &at) && same_bits(vr, vt, N, &at),
                                  "adamw%s %s step %d wd %d [%zu, %zu): element %zu differs", g_fast ? " (fast)" : "",
                                  k->name, step, wd, lo, hi, at);
                        for (int mode = 0; mode < 3 && !g_fast; mode++) { /* no momentum, momentum, nesterov */
                            zero_optim_hyper hs = hyper(step, mode == 2, wd);
                            memcpy(pr, p0, N * 4), memcpy(mr, m0, N * 4);
                            memcpy(pt, p0, N * 4), memcpy(mt, m0, N * 4);
                            ref->sgd(&hs, pr, g, mode ? mr : NULL, lo, hi);
                            k->sgd(&hs, pt, g, mode ? mt : NULL, lo, hi);
                            CHECK_MSG(same_bits(pr, pt, N, &at) && same_bits(mr, mt, N, &at),
                                      "sgd %s mode %d step %d [%zu, %zu): element %zu differs", k->name, mode, step,
                                      lo, hi, at);
                        }
                    }
                }
            }
        }
        }
        g_fast = 0;
        printf("variant %s: bitwise equal to the scalar reference (exact and fast AdamW, SGD)\n", k->name);
    }
    CHECK(tested >= 2 || zero_cpu_optim_variant_at(1) == NULL); /* on x86-64 at least sse2 + scalar */

    /* The threaded entry points, through the active variant, over the whole array. */
    zero_optim_hyper h;
    size_t at = 0;
    for (g_fast = 0; g_fast < 2; g_fast++) {
        h = hyper(2, 0, 1);
        memcpy(pr, p0, N * 4), memcpy(mr, m0, N * 4), memcpy(vr, v0, N * 4);
        memcpy(pt, p0, N * 4), memcpy(mt, m0, N * 4), memcpy(vt, v0, N * 4);
        ref->adamw(&h, pr, g, mr, vr, 0, N);
        zero_cpu_adamw(&h, pt, g, mt, vt, N);
        CHECK_MSG(same_bits(pr, pt, N, &at) && same_bits(mr, mt, N, &at) && same_bits(vr, vt, N, &at),
                  "zero_cpu_adamw%s (%s, threaded) element %zu differs", g_fast ? " (fast)" : "",
                  zero_cpu_optim_active()->name, at);
    }
    g_fast = 0;
    h = hyper(2, 1, 1);
    memcpy(pr, p0, N * 4), memcpy(mr, m0, N * 4);
    memcpy(pt, p0, N * 4), memcpy(mt, m0, N * 4);
    ref->sgd(&h, pr, g, mr, 0, N);
    zero_cpu_sgd(&h, pt, g, mt, N);
    CHECK_MSG(same_bits(pr, pt, N, &at) && same_bits(mr, mt, N, &at), "zero_cpu_sgd (%s, threaded) element %zu differs",
              zero_cpu_optim_active()->name, at);
    printf("active variant: %s\n", zero_cpu_optim_active()->name);

#if ZERO_HAVE_OPENMP
    /* Every thread split covers every element: sizes whose share per thread
     * rounds to a multiple of 16 below n / threads (40001 on 2 threads lost
     * its last element before the split rounded up). */
    const size_t split_sizes[] = {40001, 32769, 65551, 100003};
    const int threads[] = {2, 3, 4, 7};
    for (size_t si = 0; si < sizeof split_sizes / sizeof *split_sizes; si++) {
        const size_t n = split_sizes[si];
        if (n > N) continue;
        for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
            omp_set_num_threads(threads[ti]);
            zero_optim_hyper hs = hyper(2, 1, 1);
            for (int fast = 0; fast < 2; fast++) {
                hs.fast = fast;
                memcpy(pr, p0, N * 4), memcpy(mr, m0, N * 4), memcpy(vr, v0, N * 4);
                memcpy(pt, p0, N * 4), memcpy(mt, m0, N * 4), memcpy(vt, v0, N * 4);
                ref->adamw(&hs, pr, g, mr, vr, 0, n);
                zero_cpu_adamw(&hs, pt, g, mt, vt, n);
                CHECK_MSG(same_bits(pr, pt, N, &at) && same_bits(mr, mt, N, &at) && same_bits(vr, vt, N, &at),
                          "zero_cpu_adamw%s over %zu on %d threads: element %zu differs", fast ? " (fast)" : "", n,
                          threads[ti], at);
            }
            hs.fast = 0;
            memcpy(pr, p0, N * 4), memcpy(mr, m0, N * 4);
            memcpy(pt, p0, N * 4), memcpy(mt, m0, N * 4);
            ref->sgd(&hs, pr, g, mr, 0, n);
            zero_cpu_sgd(&hs, pt, g, mt, n);
            CHECK_MSG(same_bits(pr, pt, N, &at) && same_bits(mr, mt, N, &at),
                      "zero_cpu_sgd over %zu on %d threads: element %zu differs", n, threads[ti], at);
        }
    }
    omp_set_num_threads(omp_get_num_procs());
#endif

    /* The fused multi-tensor step: a chunk table over odd offsets and
     * lengths, three groups, 16-bit params written in the same pass, gives
     * the scalar reference's bits per chunk and zero_f32_to_bf16/f16's casts. */
    for (int opt = 0; opt < 2; opt++) {
        for (int dt = 0; dt < 2; dt++) {
            zero_optim_hyper hy[3] = {hyper(2, 0, 1), hyper(2, 1, 0), hyper(3, 0, 1)};
            zero_optim_chunk rows[64];
            size_t nrows = 0, off = 0;
            const size_t lens[] = {1, 17, 4099, ZERO_OPTIM_CHUNK, 255, 16, 3};
            for (size_t i = 0; off < N / 2 && nrows < 64; i++) {
                const size_t len = lens[i % 7];
                if (off + len + 2 > N / 2) break;
                zero_optim_chunk c = {off, off + 1, off + 2, off, (uint32_t)len, (uint32_t)(i % 3)};
                rows[nrows++] = c;
                off += len + (i % 2); /* gaps, left untouched */
            }
            const zero_dtype odt = dt ? ZERO_F16 : ZERO_BF16;
            uint16_t *out_t = calloc(N, 2), *out_r = calloc(N, 2);
            memcpy(pr, p0, N * 4), memcpy(mr, m0, N * 4), memcpy(vr, v0, N * 4);
            memcpy(pt, p0, N * 4), memcpy(mt, m0, N * 4), memcpy(vt, v0, N * 4);
            for (size_t r = 0; r < nrows; r++) {
                const zero_optim_chunk *c = &rows[r];
                if (opt) ref->adamw(&hy[c->group], pr + c->p_off, g + c->g_off, mr + c->m_off, vr + c->m_off, 0, c->len);
                else ref->sgd(&hy[c->group], pr + c->p_off, g + c->g_off, mr + c->m_off, 0, c->len);
                for (size_t i = 0; i < c->len; i++) {
                    float x = pr[c->p_off + i];
                    out_r[c->out_off + i] = dt ? zero_cvt_f32_to_f16(x) : zero_cvt_f32_to_bf16(x);
                }
            }
            zero_optim_fused f = {opt, hy, rows, nrows, pt, g, mt, opt ? vt : NULL, out_t, odt};
            zero_cpu_fused_step(&f);
            CHECK_MSG(same_bits(pr, pt, N, &at) && same_bits(mr, mt, N, &at) && same_bits(vr, vt, N, &at),
                      "fused %s: element %zu differs from the per-chunk reference", opt ? "adamw" : "sgd", at);
            /* like same_bits: a NaN's sign and payload depend on operand order
             * (the fp32 comparison above already accepts any NaN for a NaN) */
            size_t bad = N;
            for (size_t q = 0; q < N && bad == N; q++)
                if (out_t[q] != out_r[q] && !(half_is_nan(out_t[q], dt) && half_is_nan(out_r[q], dt))) bad = q;
            CHECK_MSG(bad == N, "fused %s: the %s params differ at %zu (%04x, reference %04x)", opt ? "adamw" : "sgd",
                      dt ? "f16" : "bf16", bad, bad < N ? out_t[bad] : 0, bad < N ? out_r[bad] : 0);
            free(out_t);
            free(out_r);
        }
    }

    check_x86_casts();
    check_fast_bound(ref, p0, g, m0, v0, pr, mr, vr, pt, mt, vt);
    check_bc2_range(ref, p0, g, m0, v0, pr, mr, vr, pt, mt, vt);

    /* ZERO_CPU_ISA caps the choice (read once, so checked in a fresh process by meson: see meson.build). */
    const char *cap = getenv("ZERO_CPU_ISA");
    const zero_cpu_optim_variant *capped = NULL;
    for (int i = 0; cap && zero_cpu_optim_variant_at(i); i++)
        if (!strcmp(zero_cpu_optim_variant_at(i)->name, cap)) capped = zero_cpu_optim_variant_at(i);
    if (!cap) check_bc2_div(); /* independent of the variant cap: once, in the uncapped run */
    if (capped && zero_cpu_optim_supported(capped)) CHECK_MSG(!strcmp(zero_cpu_optim_active()->name, cap), "ZERO_CPU_ISA=%s but %s is active", cap,
                       zero_cpu_optim_active()->name);
    free(p0), free(g), free(m0), free(v0), free(pr), free(mr), free(vr), free(pt), free(mt), free(vt);
    return check_exit();
}
