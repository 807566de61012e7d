/* Internal: optimizer step kernels over fp32 arrays (the own shard of the
 * master weights, its gradient and moments). The CPU versions live in
 * optim/cpu_optim.c; the CUDA versions in zero/optim_cuda.cu take the same
 * hyper-parameter block and compute the same rounding sequence. */
#ifndef ZERO_OFFLOAD_CPU_OPTIM_H
#define ZERO_OFFLOAD_CPU_OPTIM_H

#include <stddef.h>
#include <stdint.h>
#include <zero/dtype.h>

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
    /* AdamW's fast mode (zero_config.optimizer_fast; CPU kernels only):
     * p += fast_num * m / (sqrt(v) + fast_eps), one division instead of two
     * (cpu_optim.c: within 8 ulps of the exact update; every variant the
     * same bits). Both in double from the step's scalars, rounded once. */
    int fast;
    float fast_num; /* -step_size * sqrt(1 - beta2^t) */
    float fast_eps; /* eps * sqrt(1 - beta2^t) */
} zero_optim_hyper;

/* p, g, m, v: n floats each. In place on p, m, v. Run by the widest
 * supported variant below (chosen once; ZERO_CPU_ISA caps it), split over
 * OpenMP threads for large n; every variant and split gives the same bits. */
void zero_cpu_adamw(const zero_optim_hyper *h, float *p, const float *g, float *m, float *v, size_t n);
/* buf may be NULL (momentum 0). */
void zero_cpu_sgd(const zero_optim_hyper *h, float *p, const float *g, float *buf, size_t n);

/* ---------------------------------------------------------------- fused multi-tensor step
 * One call updates a whole shard, however many buckets, tensors and
 * parameter groups it spans: a table of chunks, each `len` elements of one
 * group at element offsets into the step's arrays, and a table of
 * hyperparameters, one row per group (the idea of apex's / torch's
 * multi_tensor_apply: one launch instead of one per tensor). Each chunk's
 * compute-dtype copy of the updated parameters is written in the same pass.
 * The CPU twin below and the CUDA kernel (zero/optim_cuda.cu) execute the
 * same table with the same per-element arithmetic as the per-region kernels
 * above, so every path gives the same bits. */

/* Elements per chunk at most: a CUDA block's work (and an OpenMP task). */
#define ZERO_OPTIM_CHUNK 16384u

typedef struct zero_optim_chunk {
    uint64_t p_off;   /* into p: fp32 master (or the fp32 params themselves) */
    uint64_t g_off;   /* into g: fp32 gradient */
    uint64_t m_off;   /* into m1 and m2 (both moments share a layout) */
    uint64_t out_off; /* into out: the compute-dtype params (unused without out) */
    uint32_t len;     /* 1 .. ZERO_OPTIM_CHUNK */
    uint32_t group;   /* row of the hyperparameter table */
} zero_optim_chunk;

typedef struct zero_optim_fused {
    int adamw;                     /* 1: AdamW (m1, m2); 0: SGD (m1 = momentum buffer or NULL) */
    const zero_optim_hyper *hyper; /* one row per group */
    const zero_optim_chunk *chunks;
    size_t num_chunks;
    float *p;
    const float *g;
    float *m1, *m2;
    void *out;                     /* NULL: no compute-dtype copy (fp32 params are the master) */
    zero_dtype out_dtype;          /* ZERO_BF16 or ZERO_F16 when out is set */
} zero_optim_fused;

/* The CPU twin: every chunk through the active variant's kernel, then its
 * cast (device/convert_impl.h, the CPU device's cast bits); chunks are split
 * over OpenMP threads when the table holds many elements. */
void zero_cpu_fused_step(const zero_optim_fused *f);

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

/* Internal, for the bitwise test: q[i] = fl(a[i] / bc2) for i < n (n a
 * multiple of 8) through the AVX2 variant's division by bc2 without the
 * divider (cpu_optim.c, bc2_div8), for a = sqrt(v) values (>= 0, inf, NaN).
 * Returns 0 and writes nothing where that path does not run: not x86, no
 * AVX2 + FMA, or bc2 outside [2^-20, 1) (the kernel divides there). */
int zero_cpu_optim_bc2_div(const float *a, float *q, size_t n, float bc2);

#endif
