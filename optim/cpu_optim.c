/* Vectorized CPU optimizer kernels: the "CPU Adam" that ZeRO-Offload runs on
 * the host. One kernel body per optimizer, written once over GCC vector
 * types and instantiated for AVX-512 (16 lanes), AVX2 (8), SSE2 (4) and
 * plain scalar code; the widest one the CPU supports is chosen once, at the
 * first call (CPUID through __builtin_cpu_supports, which also checks that
 * the OS saves the wide registers). ZERO_CPU_ISA=avx512|avx2|sse2|scalar
 * caps the choice (tests run every variant; a user can rule one out).
 * Large arrays are split across OpenMP threads.
 *
 * Every variant gives the same bits. Each element's result depends only on
 * that element, and every variant performs the same IEEE single-precision
 * operations (multiply, add, divide, square root, each correctly rounded)
 * in the same order: a vector lane rounds exactly as a scalar does. The
 * library is built with -std=c11, so GCC contracts nothing into fused
 * multiply-adds (which round once instead of twice), even in the AVX-512
 * variant whose target includes FMA; and vector types are used through
 * operators, never through reciprocal or rsqrt approximations. So the
 * vector body, the scalar remainder, any thread split and any variant round
 * identically: updating a chunk or a whole bucket gives the same bits,
 * which the stage equivalence relies on (tests/optim/test_cpu_optim.c
 * checks every variant against the scalar reference bit for bit, NaN,
 * infinities and subnormals included).
 *
 * Why not faster in cache: AdamW needs a correctly rounded square root and
 * two correctly rounded divisions per element to give torch's bits
 * (fl(sqrt(v)/bc2) and fl(fl(-lr*m)/denom)). They run on one divider that is
 * not pipelined, and its throughput bounds the kernel when its arrays are in
 * cache: on a Zen 3 core a loop of only those three operations takes 4.0 ns
 * per 8 elements (56 GB/s AdamW-equivalent) against 1.8-2.2 ns for a loop
 * moving the same bytes from 64-byte aligned arrays (docs/BENCHMARKS.md,
 * issue 15). The AVX2 variant
 * therefore divides by the per-step constant bc2 without the divider (the
 * reciprocal and one FMA correction below, correctly rounded, so the same
 * bits): one divider operation fewer per element. Out of cache the kernel
 * moves 28 bytes per element and memory bounds it. */
#include "cpu_optim.h"

/* No fused multiply-adds whatever the build's language mode (see above):
 * GCC contracts only outside ISO mode, clang within expressions by default. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/convert_impl.h"
#include "device/convert_x86.h"
#include "zero_build_config.h"

#if ZERO_HAVE_OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && defined(__x86_64__)
#define ZERO_OPTIM_X86 1
#include <immintrin.h>
#else
#define ZERO_OPTIM_X86 0
#endif

/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN 32768

/* ---------------------------------------------------------------- kernel bodies
 * VT is a vector type (or float for the scalar variant); LOAD/STORE move one
 * VT through memcpy (unaligned vector moves); SQRT is the correctly rounded
 * square root of one VT. Scalars combine with vectors lane by lane (GCC
 * broadcasts them), so the vector loop reads exactly like the scalar one.
 * Each body ends with the scalar loop for the remainder. */

#define ADAMW_STEP(T, SQRTF, BC2, gv, pv, mv, vv, pout, mout, vout)                            \
    do {                                                                                       \
        T gi_ = (gv) * gs;                                                                     \
        T pi_ = (pv) * decay;                /* param.mul_(1 - lr * wd) */                     \
        T mi_ = (mv) * b1 + omb1 * gi_;      /* exp_avg.mul_(b1).add_(g, alpha=1-b1) */        \
        T vi_ = (vv) * b2 + omb2 * gi_ * gi_; /* exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2) */   \
        T denom_ = BC2(SQRTF(vi_)) + eps;    /* (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps) */    \
        pout = pi_ + nss * mi_ / denom_;     /* param.addcdiv_(exp_avg, denom, -step_size) */  \
        mout = mi_;                                                                            \
        vout = vi_;                                                                            \
    } while (0)
#define BC2_DIVIDE(x) ((x) / bc2)
#define BC2_ONE(x) (x)
/* AVX2 only: the division by bc2 through its reciprocal (bc2_div8 below). */
#define BC2_RECIP8(x) bc2_div8((x), bc2_recip, bc2)

/* One vector loop for both modes: STEP is ADAMW_STEP or ADAMW_FAST_STEP, called
 * with its leading arguments (__VA_ARGS__) and then the vectors in and out. */
#define ADAMW_VECTOR_LOOP_OF(VT, STEP, ...)                                                    \
    for (; W > 1 && i + W <= hi; i += W) {                                                     \
        VT gv, pv, mv, vv, po, mo, vo;                                                         \
        memcpy(&gv, g + i, sizeof gv);                                                         \
        memcpy(&pv, p + i, sizeof pv);                                                         \
        memcpy(&mv, m + i, sizeof mv);                                                         \
        memcpy(&vv, v + i, sizeof vv);                                                         \
        STEP(__VA_ARGS__, gv, pv, mv, vv, po, mo, vo);                                         \
        memcpy(p + i, &po, sizeof po);                                                         \
        memcpy(m + i, &mo, sizeof mo);                                                         \
        memcpy(v + i, &vo, sizeof vo);                                                         \
    }
#define ADAMW_VECTOR_LOOP(VT, SQRTV, BC2) ADAMW_VECTOR_LOOP_OF(VT, ADAMW_STEP, VT, SQRTV, BC2)

/* bc2 == 1 (sqrt(1 - beta2^t) rounds to 1 in float once beta2^t < 2^-25:
 * from about step 17,400 at beta2 = 0.999, so most of a long run): x / 1 is
 * x exactly for every x a square root can give (zeros, finite, inf, a quiet
 * NaN), so the vector loops leave that division out - one of the three
 * divider operations per element, which bound the kernel in cache. The
 * scalar reference always divides, so test_cpu_optim's bitwise comparison at
 * such a step checks the shortcut. */
/* ---- AdamW's fast mode (opt-in, h->fast; the default is the exact kernel
 * above). torch's form needs a square root and two divisions per element:
 *   u = fl(fl(-step_size * m) / fl(fl(sqrt(v) / bc2) + eps)).
 * Multiplying numerator and denominator by bc2 leaves one division:
 *   u = fl(fl(A * m) / fl(sqrt(v) + B)),  A = -step_size * bc2, B = eps * bc2
 * with A and B computed once per step in double and rounded once (zero/
 * optim.c). The same real number, rounded differently: each side has at most
 * four roundings of at most 2^-24 relative each (plus the constants'), so the
 * update is within 8 ulps of the exact one wherever the numerators are normal
 * floats (|step_size * m| >= 2^-126; below, both kernels round the numerator
 * in absolute terms and their updates, < 1e-30, differ by more ulps); the
 * test's random and edge inputs measure at most 4 (tests/optim/
 * test_cpu_optim.c asserts 8). Still only
 * correctly rounded IEEE operations - no estimates, no FMA - so every
 * variant, the scalar remainder and any thread split give the same bits, and
 * zeros, infinities and NaNs behave as in exact mode (sqrt(inf) + B = inf,
 * m / inf = 0). One division fewer per element: the divider bounds the exact
 * kernel in cache on some cores (docs/BENCHMARKS.md). m and v are computed
 * exactly as in exact mode (bitwise). */
#define ADAMW_FAST_STEP(T, SQRTF, gv, pv, mv, vv, pout, mout, vout)                             \
    do {                                                                                       \
        T gi_ = (gv) * gs;                                                                     \
        T pi_ = (pv) * decay;                                                                  \
        T mi_ = (mv) * b1 + omb1 * gi_;                                                        \
        T vi_ = (vv) * b2 + omb2 * gi_ * gi_;                                                  \
        pout = pi_ + fa * mi_ / (SQRTF(vi_) + fb);                                             \
        mout = mi_;                                                                            \
        vout = vi_;                                                                            \
    } while (0)

#define ADAMW_FAST_LOOPS(VT, SQRTV)                                                            \
    const float fa = h->fast_num, fb = h->fast_eps;                                            \
    for (; i < head_end; i++) ADAMW_FAST_STEP(float, sqrtf, g[i], p[i], m[i], v[i], p[i], m[i], v[i]); \
    ADAMW_VECTOR_LOOP_OF(VT, ADAMW_FAST_STEP, VT, SQRTV)                                      \
    for (; i < hi; i++) ADAMW_FAST_STEP(float, sqrtf, g[i], p[i], m[i], v[i], p[i], m[i], v[i]);

/* RECIP_LOOP: empty, or (AVX2) one more case between bc2 == 1 and the
 * division: `else if (...) { the vector loop with BC2_RECIP8 }`. */
#define ADAMW_BODY(VT, SQRTV, RECIP_LOOP)                                                      \
    const float gs = h->grad_scale, decay = h->decay, b1 = h->beta1, omb1 = h->one_minus_beta1; \
    const float b2 = h->beta2, omb2 = h->one_minus_beta2, nss = h->neg_step_size, bc2 = h->bc2_sqrt; \
    const float eps = h->eps;                                                                  \
    const size_t W = sizeof(VT) / sizeof(float);                                               \
    size_t i = lo;                                                                             \
    /* Scalar steps (the same bits) until p + i is vector-aligned, so that the \
     * vector stores to p (and to m, v, which the engine lays out alike) do  \
     * not straddle cache lines: malloc'ed arrays are 16 bytes off 32 and    \
     * half of the 256-bit stores would (measured: 1.1x in cache, AVX2). */  \
    size_t head_end = lo + (((size_t)0 - (uintptr_t)(p + lo)) % sizeof(VT)) / sizeof(float); \
    if (W == 1 || head_end > hi) head_end = W == 1 ? lo : hi;                                  \
    if (h->fast) {                                                                             \
        ADAMW_FAST_LOOPS(VT, SQRTV)                                                            \
        return;                                                                                \
    }                                                                                          \
    for (; i < head_end; i++) ADAMW_STEP(float, sqrtf, BC2_DIVIDE, g[i], p[i], m[i], v[i], p[i], m[i], v[i]); \
    if (bc2 == 1.0f) {                                                                         \
        ADAMW_VECTOR_LOOP(VT, SQRTV, BC2_ONE)                                                  \
    } RECIP_LOOP else {                                                                        \
        ADAMW_VECTOR_LOOP(VT, SQRTV, BC2_DIVIDE)                                               \
    }                                                                                          \
    for (; i < hi; i++) ADAMW_STEP(float, sqrtf, BC2_DIVIDE, g[i], p[i], m[i], v[i], p[i], m[i], v[i]);

/* torch.optim.SGD: d = g + wd * p; momentum: b = first ? d : mom * b + (1 - dampening) * d;
 * nesterov: d = d + mom * b, else d = b; p = p - lr * d. */
#define SGD_STEP(T, gv, pv, bv, pout, bout, has_buf, first, nesterov)                          \
    do {                                                                                       \
        T d_ = (gv) * gs + wd * (pv);                                                          \
        if (has_buf) {                                                                         \
            T b_ = d_;                                                                         \
            if (!(first)) b_ = (bv) * mom + omd * d_;                                          \
            bout = b_;                                                                         \
            if (nesterov) d_ = d_ + mom * b_;                                                  \
            else d_ = b_;                                                                      \
        }                                                                                      \
        pout = (pv) + nlr * d_;                                                                \
    } while (0)

/* The vector loop with the three flags as constants: one loop per case, so
 * its body tests none of them (in cache on AVX2, Zen 3: 1.06-1.29x the loop
 * that tested them per vector, paired in one process; docs/BENCHMARKS.md). */
#define SGD_VECTOR_LOOP(VT, HAS_BUF, FIRST, NESTEROV)                                           \
    for (; W > 1 && i + W <= hi; i += W) {                                                     \
        VT gv, pv, bv = {0}, po, bo = {0};                                                     \
        memcpy(&gv, g + i, sizeof gv);                                                         \
        memcpy(&pv, p + i, sizeof pv);                                                         \
        if (HAS_BUF) memcpy(&bv, buf + i, sizeof bv);                                          \
        SGD_STEP(VT, gv, pv, bv, po, bo, HAS_BUF, FIRST, NESTEROV);                            \
        memcpy(p + i, &po, sizeof po);                                                         \
        if (HAS_BUF) memcpy(buf + i, &bo, sizeof bo);                                          \
    }

#define SGD_BODY(VT)                                                                           \
    const float gs = h->grad_scale, wd = h->weight_decay, mom = h->momentum;                   \
    const float omd = h->one_minus_dampening, nlr = h->neg_lr;                                 \
    const int nesterov = h->nesterov, first = h->first;                                        \
    const size_t W = sizeof(VT) / sizeof(float);                                               \
    size_t i = lo;                                                                             \
    if (!buf) SGD_VECTOR_LOOP(VT, 0, 0, 0)                                                     \
    else if (first && nesterov) SGD_VECTOR_LOOP(VT, 1, 1, 1)                                   \
    else if (first) SGD_VECTOR_LOOP(VT, 1, 1, 0)                                               \
    else if (nesterov) SGD_VECTOR_LOOP(VT, 1, 0, 1)                                            \
    else SGD_VECTOR_LOOP(VT, 1, 0, 0)                                                          \
    for (; i < hi; i++) {                                                                      \
        float bnew = 0.0f;                                                                     \
        SGD_STEP(float, g[i], p[i], buf ? buf[i] : 0.0f, p[i], bnew, buf != NULL, first, nesterov); \
        if (buf) buf[i] = bnew;                                                                \
    }

#define ADAMW_ARGS                                                                             \
    const zero_optim_hyper *h, float *restrict p, const float *restrict g, float *restrict m,  \
        float *restrict v, size_t lo, size_t hi
#define SGD_ARGS                                                                               \
    const zero_optim_hyper *h, float *restrict p, const float *restrict g, float *restrict buf, \
        size_t lo, size_t hi

/* The scalar reference: every other variant must give its bits. */
static void adamw_scalar(ADAMW_ARGS) { ADAMW_BODY(float, sqrtf, ) }
static void sgd_scalar(SGD_ARGS) { SGD_BODY(float) }

#if ZERO_OPTIM_X86
/* In the scalar variant a vector "sqrt" is never reached (W == 1 skips the
 * vector loop), so only the x86 variants need one. */
__attribute__((target("avx512f"))) static inline __m512 sqrt16(__m512 x) { return _mm512_sqrt_ps(x); }
__attribute__((target("avx"))) static inline __m256 sqrt8(__m256 x) { return _mm256_sqrt_ps(x); }
static inline __m128 sqrt4(__m128 x) { return _mm_sqrt_ps(x); }

/* ---- fl(a / bc2) without the divider, for a = sqrt(v) (AVX2 variant).
 * y = fl(1 / bc2) once per call (a float division: correctly rounded, as
 * the method needs; not a double rounded twice). Per element:
 *   q0 = fl(a * y)                 within 1 ulp of a / bc2
 *   nr = fl(q0 * bc2 - a)  (FMA)   exact: the remainder of q0 fits a float
 *   q  = fl(q0 - nr * y)   (FMA)   = fl(a / bc2), correctly rounded
 * Markstein's theorem (IBM J. Res. Dev. 34(1), 1990; Muller et al.,
 * Handbook of Floating-Point Arithmetic, "Newton-Raphson-based division
 * with an FMA"): with y the correctly rounded reciprocal and q0 within 1 ulp,
 * the remainder is exact and one correction rounds correctly, barring
 * overflow and underflow. Those cannot occur here: a = sqrt(v) is 0, NaN,
 * +inf or in [2^-75, 2^64), and bc2_recip_ok() keeps bc2 in [2^-20, 1), so q0
 * stays below 2^84 and the remainder's bits are multiples of at least 2^-141
 * (representable even where it is subnormal). Zeros keep their sign (the
 * correction is written as q0 - nr * y: -0 - (+0) = -0, where q0 + r * y
 * would give +0); a vector holding an infinity or a NaN (a < inf false)
 * takes the division instead (inf - NaN * y would be NaN). Checked: every
 * significand of a in [1, 2) (scaling by powers of two is exact here)
 * against the division for thousands of bc2 values (tests/optim/
 * test_cpu_optim.c does all of them for a few bc2 through
 * zero_cpu_optim_bc2_div), and the kernel bitwise against the scalar
 * reference, which divides. Why: the two FMAs and the multiply run on the
 * multiply pipes, which the divider leaves idle, where the division took
 * 3.5 of the divider's ~12 cycles per vector (sqrt 5, two divisions 3.5
 * each, measured on Zen 3; docs/BENCHMARKS.md). */
static inline int bc2_recip_ok(float bc2) { return bc2 >= 0x1p-20f && bc2 < 1.0f; }

__attribute__((target("avx2,fma"))) static inline __m256 bc2_div8(__m256 a, float y, float bc2)
{
    const __m256 yv = _mm256_set1_ps(y), bv = _mm256_set1_ps(bc2);
    const __m256 q0 = _mm256_mul_ps(a, yv);
    const __m256 nr = _mm256_fmsub_ps(q0, bv, a);
    __m256 q = _mm256_fnmadd_ps(nr, yv, q0);
    /* A branch, not a blend: never taken in training, and a blend's extra
     * operations cost more than the predicted branch (measured). */
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(INFINITY), _CMP_LT_OQ)) != 0xff, 0))
        q = _mm256_div_ps(a, bv);
    return q;
}
/* zero_cpu_optim_bc2_div's loop: the kernel's bc2_div8, nothing else. */
__attribute__((target("avx2,fma"))) static void bc2_div_avx2(const float *a, float *q, size_t n, float bc2)
{
    const float bc2_recip = 1.0f / bc2;
    for (size_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(q + i, bc2_div8(_mm256_loadu_ps(a + i), bc2_recip, bc2));
}
#define AVX2_RECIP_LOOP                                                                        \
    else if (bc2_recip_ok(bc2)) {                                                              \
        const float bc2_recip = 1.0f / bc2;                                                    \
        ADAMW_VECTOR_LOOP(__m256, sqrt8, BC2_RECIP8)                                           \
    }

/* The AVX-512 variant keeps the division: no AVX-512 machine was at hand to
 * run a 16-lane bc2_div (the method is the same). */
__attribute__((target("avx512f"))) static void adamw_avx512(ADAMW_ARGS) { ADAMW_BODY(__m512, sqrt16, ) }
__attribute__((target("avx2,fma"))) static void adamw_avx2(ADAMW_ARGS) { ADAMW_BODY(__m256, sqrt8, AVX2_RECIP_LOOP) }
static void adamw_sse2(ADAMW_ARGS) { ADAMW_BODY(__m128, sqrt4, ) }
__attribute__((target("avx512f"))) static void sgd_avx512(SGD_ARGS) { SGD_BODY(__m512) }
__attribute__((target("avx2"))) static void sgd_avx2(SGD_ARGS) { SGD_BODY(__m256) }
static void sgd_sse2(SGD_ARGS) { SGD_BODY(__m128) }
#endif

int zero_cpu_optim_bc2_div(const float *a, float *q, size_t n, float bc2)
{
#if ZERO_OPTIM_X86
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !bc2_recip_ok(bc2)) return 0;
    bc2_div_avx2(a, q, n, bc2);
    return 1;
#else
    (void)a, (void)q, (void)n, (void)bc2;
    return 0;
#endif
}

/* ---------------------------------------------------------------- dispatch */

static const zero_cpu_optim_variant variants[] = {
#if ZERO_OPTIM_X86
    {"avx512", adamw_avx512, sgd_avx512},
    {"avx2", adamw_avx2, sgd_avx2},
    {"sse2", adamw_sse2, sgd_sse2},
#endif
    {"scalar", adamw_scalar, sgd_scalar},
};
#define NUM_VARIANTS ((int)(sizeof variants / sizeof variants[0]))

int zero_cpu_optim_supported(const zero_cpu_optim_variant *v)
{
#if ZERO_OPTIM_X86
    if (!strcmp(v->name, "avx512")) return __builtin_cpu_supports("avx512f");
    /* every AVX2 CPU has FMA too, but a hypervisor may hide one of them */
    if (!strcmp(v->name, "avx2")) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    (void)v;
    return 1;
}

const zero_cpu_optim_variant *zero_cpu_optim_variant_at(int i)
{
    return i >= 0 && i < NUM_VARIANTS ? &variants[i] : NULL;
}

/* The widest supported variant at or below ZERO_CPU_ISA's (an unknown name
 * caps nothing). Idempotent, so a race between first callers is harmless. */
static const zero_cpu_optim_variant *choose(void)
{
    const char *cap = getenv("ZERO_CPU_ISA");
    int start = 0;
    for (int i = 0; cap && i < NUM_VARIANTS; i++)
        if (!strcmp(cap, variants[i].name)) start = i;
    for (int i = start; i < NUM_VARIANTS; i++)
        if (zero_cpu_optim_supported(&variants[i])) return &variants[i];
    return &variants[NUM_VARIANTS - 1];
}

const zero_cpu_optim_variant *zero_cpu_optim_active(void)
{
    static const zero_cpu_optim_variant *active;
    const zero_cpu_optim_variant *a = __atomic_load_n(&active, __ATOMIC_ACQUIRE);
    if (!a) {
        a = choose();
        __atomic_store_n(&active, a, __ATOMIC_RELEASE);
    }
    return a;
}

/* Contiguous per-thread ranges, multiples of 16 elements (whole vectors of
 * every variant, and whole cache lines when the arrays are aligned). */
#if ZERO_HAVE_OPENMP
#define SPLIT(n, call)                                                                         \
    do {                                                                                       \
        if ((n) > PAR_MIN) {                                                                   \
            _Pragma("omp parallel")                                                            \
            {                                                                                  \
                size_t nt_ = (size_t)omp_get_num_threads(), t_ = (size_t)omp_get_thread_num(); \
                size_t per_ = (((n) + nt_ - 1) / nt_ + 15) / 16 * 16; /* covers n: round up */  \
                size_t lo = t_ * per_ < (n) ? t_ * per_ : (n);                                 \
                size_t hi = lo + per_ < (n) ? lo + per_ : (n);                                 \
                call;                                                                          \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
    } while (0)
#else
#define SPLIT(n, call) (void)0
#endif

void zero_cpu_adamw(const zero_optim_hyper *h, float *restrict p, const float *restrict g, float *restrict m,
                    float *restrict v, size_t n)
{
    const zero_cpu_optim_variant *k = zero_cpu_optim_active();
    SPLIT(n, k->adamw(h, p, g, m, v, lo, hi));
    k->adamw(h, p, g, m, v, 0, n);
}

void zero_cpu_sgd(const zero_optim_hyper *h, float *restrict p, const float *restrict g, float *restrict buf,
                  size_t n)
{
    const zero_cpu_optim_variant *k = zero_cpu_optim_active();
    SPLIT(n, k->sgd(h, p, g, buf, lo, hi));
    k->sgd(h, p, g, buf, 0, n);
}

/* ---------------------------------------------------------------- fused multi-tensor step */

/* Whether the fused step casts its chunks with the x86 vector casts: the
 * active variant is a vector one (so a ZERO_CPU_ISA cap of sse2/scalar keeps
 * the scalar loop) and the CPU has what the cast needs. */
static int fused_vector_cast(const zero_cpu_optim_variant *k, zero_dtype out_dtype)
{
#if ZERO_CONVERT_X86
    if (strcmp(k->name, "avx512") != 0 && strcmp(k->name, "avx2") != 0) return 0;
    return out_dtype == ZERO_BF16 || (out_dtype == ZERO_F16 && __builtin_cpu_supports("f16c"));
#else
    (void)k, (void)out_dtype;
    return 0;
#endif
}

static void fused_chunk(const zero_optim_fused *f, const zero_cpu_optim_variant *k, const zero_optim_chunk *c,
                        int vector_cast)
{
    const zero_optim_hyper *h = &f->hyper[c->group];
    float *p = f->p + c->p_off;
    const float *g = f->g + c->g_off;
    float *m1 = f->m1 ? f->m1 + c->m_off : NULL;
    if (!f->adamw && !(h->momentum > 0)) m1 = NULL; /* SGD in a group without momentum: its buffer untouched */
    if (f->adamw) k->adamw(h, p, g, m1, f->m2 + c->m_off, 0, c->len);
    else k->sgd(h, p, g, m1, 0, c->len);
    if (!f->out) return;
    /* The chunk is still in cache: its cast costs little more than the store
     * once vectorized (the scalar loop doubled the step: 2.2-2.4x the fp32
     * kernel at bf16). The vector casts give the scalar reference's bits. */
    uint16_t *o = (uint16_t *)f->out + c->out_off;
#if ZERO_CONVERT_X86
    if (vector_cast) {
        if (f->out_dtype == ZERO_BF16) zero_x86_f32_to_bf16(p, o, c->len);
        else zero_x86_f32_to_f16(p, o, c->len);
        return;
    }
#else
    (void)vector_cast;
#endif
    if (f->out_dtype == ZERO_BF16)
        for (uint32_t i = 0; i < c->len; i++) o[i] = zero_cvt_f32_to_bf16(p[i]);
    else
        for (uint32_t i = 0; i < c->len; i++) o[i] = zero_cvt_f32_to_f16(p[i]);
}

void zero_cpu_fused_step(const zero_optim_fused *f)
{
    const zero_cpu_optim_variant *k = zero_cpu_optim_active();
    const long n = (long)f->num_chunks;
    const int vcast = f->out && fused_vector_cast(k, f->out_dtype);
#if ZERO_HAVE_OPENMP
    uint64_t total = 0;
    for (long i = 0; i < n; i++) total += f->chunks[i].len;
    if (total > PAR_MIN && n > 1) {
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) fused_chunk(f, k, &f->chunks[i], vcast);
        return;
    }
#endif
    for (long i = 0; i < n; i++) fused_chunk(f, k, &f->chunks[i], vcast);
}
