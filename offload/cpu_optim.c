/* Vectorized CPU optimizer kernels: the "CPU Adam" that ZeRO-Offload runs on
 * the host. Plain loops the compiler vectorizes (omp simd), split across
 * threads with OpenMP for large arrays.
 *
 * Every element's result depends only on that element, and the library is
 * built with -std=c11 (no floating-point contraction, no fast-math), so the
 * vector body, the scalar remainder and any thread split round identically:
 * updating a chunk or a whole bucket gives the same bits, which the stage
 * equivalence relies on. */
#include "cpu_optim.h"

#include <math.h>

#include "zero_build_config.h"

/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN 32768

void zero_cpu_adamw(const zero_optim_hyper *h, float *restrict p, const float *restrict g, float *restrict m,
                    float *restrict v, size_t n)
{
    const float gs = h->grad_scale, decay = h->decay, b1 = h->beta1, omb1 = h->one_minus_beta1;
    const float b2 = h->beta2, omb2 = h->one_minus_beta2, nss = h->neg_step_size, bc2 = h->bc2_sqrt;
    const float eps = h->eps;
    const long long nn = (long long)n;
#if ZERO_HAVE_OPENMP
#pragma omp parallel for simd schedule(static) if (nn > PAR_MIN)
#endif
    for (long long i = 0; i < nn; i++) {
        float gi = g[i] * gs;
        float pi = p[i] * decay;                 /* param.mul_(1 - lr * wd) */
        float mi = m[i] * b1 + omb1 * gi;        /* exp_avg.mul_(b1).add_(g, alpha=1-b1) */
        float vi = v[i] * b2 + omb2 * gi * gi;   /* exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2) */
        float denom = sqrtf(vi) / bc2 + eps;     /* (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps) */
        p[i] = pi + nss * mi / denom;            /* param.addcdiv_(exp_avg, denom, value=-step_size) */
        m[i] = mi;
        v[i] = vi;
    }
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
