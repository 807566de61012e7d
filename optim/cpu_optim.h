/* Internal: optimizer step kernels over fp32 arrays (the own shard of the
 * master weights, its gradient and moments). The CPU versions live in
 * optim/cpu_optim.c; the CUDA versions in zero/optim_cuda.cu take the same
 * hyper-parameter block and compute the same rounding sequence. */
#ifndef ZERO_OFFLOAD_CPU_OPTIM_H
#define ZERO_OFFLOAD_CPU_OPTIM_H

#include <stddef.h>

/* Scalars precomputed once per step (in double, then rounded to float once,
 * as torch does with Python scalars on float tensors). */
typedef struct zero_optim_hyper {
    float grad_scale; /* g = raw * grad_scale: unscale, average, clip */
    /* AdamW (torch.optim.AdamW, single-tensor form) */
    float decay;      /* 1 - lr * weight_decay */
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float neg_step_size; /* -lr / (1 - beta1^t) */
    float bc2_sqrt;      /* sqrt(1 - beta2^t) */
    float eps;
    /* SGD (torch.optim.SGD) */
    float neg_lr;
    float weight_decay;
    float momentum;
    float one_minus_dampening;
    int nesterov;
    int first; /* first update: the momentum buffer starts as the gradient */
} zero_optim_hyper;

/* p, g, m, v: n floats each. In place on p, m, v. Run by the widest
 * supported variant below (chosen once; ZERO_CPU_ISA caps it), split over
 * OpenMP threads for large n; every variant and split gives the same bits. */
void zero_cpu_adamw(const zero_optim_hyper *h, float *p, const float *g, float *m, float *v, size_t n);
/* buf may be NULL (momentum 0). */
void zero_cpu_sgd(const zero_optim_hyper *h, float *p, const float *g, float *buf, size_t n);


/* One instruction-set variant of the kernels, over [lo, hi) on one thread.
 * Internal, for the dispatcher, the bitwise tests and the benchmark. */
typedef struct zero_cpu_optim_variant {
    const char *name; /* "avx512", "avx2", "sse2", "scalar" (the reference) */
    void (*adamw)(const zero_optim_hyper *h, float *p, const float *g, float *m, float *v, size_t lo, size_t hi);
    void (*sgd)(const zero_optim_hyper *h, float *p, const float *g, float *buf, size_t lo, size_t hi);
} zero_cpu_optim_variant;

/* The i-th variant, widest first, the scalar reference last; NULL past the end. */
const zero_cpu_optim_variant *zero_cpu_optim_variant_at(int i);
/* Whether this CPU (and OS) can run variant v. */
int zero_cpu_optim_supported(const zero_cpu_optim_variant *v);
/* The variant zero_cpu_adamw / zero_cpu_sgd use. */
const zero_cpu_optim_variant *zero_cpu_optim_active(void);

#endif
