/* Vectorized CPU optimizer kernels: the "CPU Adam" that ZeRO-Offload runs on
 * the host. AdamW uses SSE intrinsics (see adamw_range), SGD a plain loop the
 * compiler vectorizes (omp simd); both split across threads with OpenMP for
 * large arrays. Memory-bound: AdamW moves 28 bytes per element.
 *
 * Every element's result depends only on that element, and the library is
 * built with -std=c11 (no floating-point contraction, no fast-math), so the
 * vector body, the scalar remainder and any thread split round identically:
 * updating a chunk or a whole bucket gives the same bits, which the stage
 * equivalence relies on. */
#include "cpu_optim.h"

#include <math.h>

#include "zero_build_config.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif
#if ZERO_HAVE_OPENMP
#include <omp.h>
#endif

/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN 32768

/* One thread's part of the AdamW update. The loop is written with SSE
 * intrinsics because GCC will not vectorize sqrtf without -fno-math-errno
 * (it keeps a libm call for negative inputs); the vector and scalar paths
 * perform the same IEEE single-precision operations in the same order, so
 * they give the same bits. */
static void adamw_range(const zero_optim_hyper *h, float *restrict p, const float *restrict g, float *restrict m,
                        float *restrict v, size_t lo, size_t hi)
{
    const float gs = h->grad_scale, decay = h->decay, b1 = h->beta1, omb1 = h->one_minus_beta1;
    const float b2 = h->beta2, omb2 = h->one_minus_beta2, nss = h->neg_step_size, bc2 = h->bc2_sqrt;
    const float eps = h->eps;
    size_t i = lo;
#if defined(__SSE2__)
    const __m128 vgs = _mm_set1_ps(gs), vdecay = _mm_set1_ps(decay), vb1 = _mm_set1_ps(b1);
    const __m128 vomb1 = _mm_set1_ps(omb1), vb2 = _mm_set1_ps(b2), vomb2 = _mm_set1_ps(omb2);
    const __m128 vnss = _mm_set1_ps(nss), vbc2 = _mm_set1_ps(bc2), veps = _mm_set1_ps(eps);
    for (; i + 4 <= hi; i += 4) {
        __m128 gi = _mm_mul_ps(_mm_loadu_ps(g + i), vgs);
        __m128 pi = _mm_mul_ps(_mm_loadu_ps(p + i), vdecay);
        __m128 mi = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(m + i), vb1), _mm_mul_ps(vomb1, gi));
        __m128 vi = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(v + i), vb2), _mm_mul_ps(_mm_mul_ps(vomb2, gi), gi));
        __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), vbc2), veps);
        _mm_storeu_ps(p + i, _mm_add_ps(pi, _mm_div_ps(_mm_mul_ps(vnss, mi), denom)));
        _mm_storeu_ps(m + i, mi);
        _mm_storeu_ps(v + i, vi);
    }
#endif
    for (; i < hi; i++) {
        float gi = g[i] * gs;
        float pi = p[i] * decay;               /* param.mul_(1 - lr * wd) */
        float mi = m[i] * b1 + omb1 * gi;      /* exp_avg.mul_(b1).add_(g, alpha=1-b1) */
        float vi = v[i] * b2 + omb2 * gi * gi; /* exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2) */
        float denom = sqrtf(vi) / bc2 + eps;   /* (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps) */
        p[i] = pi + nss * mi / denom;          /* param.addcdiv_(exp_avg, denom, value=-step_size) */
        m[i] = mi;
        v[i] = vi;
    }
}

void zero_cpu_adamw(const zero_optim_hyper *h, float *restrict p, const float *restrict g, float *restrict m,
                    float *restrict v, size_t n)
{
#if ZERO_HAVE_OPENMP
    if (n > PAR_MIN) {
#pragma omp parallel
        {
            /* contiguous per-thread ranges, multiples of 16 elements */
            size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
            size_t per = (n / nt + 15) / 16 * 16;
            size_t lo = t * per < n ? t * per : n, hi = lo + per < n ? lo + per : n;
            adamw_range(h, p, g, m, v, lo, hi);
        }
        return;
    }
#endif
    adamw_range(h, p, g, m, v, 0, n);
}

void zero_cpu_sgd(const zero_optim_hyper *h, float *restrict p, const float *restrict g, float *restrict buf,
                  size_t n)
{
    const float gs = h->grad_scale, wd = h->weight_decay, mom = h->momentum, omd = h->one_minus_dampening;
    const float nlr = h->neg_lr;
    const int nesterov = h->nesterov, first = h->first;
    const long long nn = (long long)n;
    if (!buf) {
#if ZERO_HAVE_OPENMP
#pragma omp parallel for simd schedule(static) if (nn > PAR_MIN)
#endif
        for (long long i = 0; i < nn; i++) {
            float d = g[i] * gs + wd * p[i]; /* grad.add(param, alpha=wd) */
            p[i] = p[i] + nlr * d;           /* param.add_(d, alpha=-lr) */
        }
        return;
    }
#if ZERO_HAVE_OPENMP
#pragma omp parallel for simd schedule(static) if (nn > PAR_MIN)
#endif
    for (long long i = 0; i < nn; i++) {
        float d = g[i] * gs + wd * p[i];
        float b = first ? d : buf[i] * mom + omd * d; /* buf.mul_(mom).add_(d, alpha=1-dampening) */
        buf[i] = b;
        d = nesterov ? d + mom * b : b;
        p[i] = p[i] + nlr * d;
    }
}
