/* zero-bench-device: throughput of the device layer's element-wise kernels
 * beside a plain device-to-device copy of the same size, measured in the
 * same run (the copy is the peer: an element-wise kernel is memory bound,
 * so the ratio says how close it gets to what the memory system gives).
 *
 *   zero-bench-device [--device cpu|cuda] [--n ELEMENTS] [--iters N] [--json FILE]
 *                     [--optim-only] [--clock wall|cpu]
 *
 * GB/s counts bytes read plus bytes written. Each op's output is checked
 * against the scalar reference on a sample of 4096 elements (#wrong).
 *
 * On the CPU device a second table puts the optimizer kernels (optim/, built
 * into this program from their sources: they are internal) beside a loop
 * with the same memory traffic and no arithmetic to speak of (AdamW: read
 * p, g, m, v, write p, m, v; SGD with momentum: read p, g, b, write p, b),
 * the widest vector ISA the CPU has (AVX-512, else AVX2, else the build's
 * baseline), split over the same threads the same way: in cache (arrays of
 * 64 Ki elements, 1 MiB for AdamW: a Xeon core's 2 MiB L2, a Zen 3's L3)
 * and out of cache (32 Mi elements, 512 MiB), at 1 and 2
 * threads, kernel and peer alternated, the best of many rounds each (in
 * cache 100 rounds of 20 passes: on a shared machine a short round is
 * often undisturbed, a long one seldom; out of cache 5 of 6), and the
 * median of the rounds' own quotients ("paired"). Then, in
 * cache at one thread: the AdamW kernel with bc2 = 1 (where it skips that
 * division), and the divider bound: a loop of only AdamW's square root and
 * two divisions per element, at 256 and 512 bits, in the same GB/s (28
 * bytes an element), the ceiling of the in-cache exact AdamW row of the
 * variants that divide by bc2; and with one division (256-bit), the
 * ceiling of the AVX2 kernel, which divides by bc2 without the divider, and
 * of the fast mode. --clock cpu
 * times by process CPU time (one-thread rows) on a shared machine. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zero/device.h>
#include <zero/experimental.h>

#include "optim/cpu_optim.h"
#include "zero_build_config.h"
#if ZERO_HAVE_OPENMP
#include <omp.h>
#endif

/* --clock cpu: the process's CPU time (all threads) instead of the wall
 * clock, so that on a shared machine the time spent waiting for a core does
 * not count; meaningful for one-thread rows (two threads sum their time). */
static int g_cpu_clock;

static double now(void)
{
    struct timespec t;
    clock_gettime(g_cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct result {
    const char *name;
    double bytes, seconds;
    long wrong;
} result;

typedef struct bench {
    zero_device *dev;
    zero_stream *stream;
    size_t n;
    int iters;
    void *a, *b;        /* device buffers of n * 4 bytes */
    float *host_f32;    /* input copy for checking */
    uint16_t *host_16;
} bench;

#define TRY(call)                                                                      \
    do {                                                                               \
        zero_status st_ = (call);                                                      \
        if (st_ != ZERO_OK) {                                                          \
            fprintf(stderr, "%s: %s: %s\n", #call, zero_status_name(st_), zero_last_error()); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

enum op { OP_COPY, OP_FILL, OP_SCALE, OP_AXPY, OP_CAST, OP_SUMSQ };

typedef struct spec {
    const char *name;
    enum op op;
    zero_dtype dt, dt2;
    double bytes_per_elem; /* read + written */
} spec;

static void run_once(bench *B, const spec *s, double *sink)
{
    switch (s->op) {
    case OP_COPY: TRY(zero_memcpy_async(B->dev, B->b, B->a, B->n * 4, B->stream)); break;
    case OP_FILL: TRY(zero_fill_value(B->dev, B->b, s->dt, B->n, 0.5f, B->stream)); break;
    case OP_SCALE: TRY(zero_scale(B->dev, B->b, s->dt, B->n, 1.0f, B->stream)); break;
    case OP_AXPY: TRY(zero_axpy(B->dev, 0.0f, B->a, B->b, s->dt, B->n, B->stream)); break;
    case OP_CAST: TRY(zero_cast(B->dev, B->a, s->dt, B->b, s->dt2, B->n, B->stream)); break;
    case OP_SUMSQ: TRY(zero_sumsq(B->dev, B->a, s->dt, B->n, sink, NULL, B->stream)); break;
    }
}

/* Reset the inputs, run the op once, and compare a sample with the scalar
 * reference. Ops run with identities (scale 1, axpy 0) so repeated timing
 * runs leave the data unchanged. */
static long check(bench *B, const spec *s)
{
    size_t es = zero_dtype_size(s->dt);
    TRY(zero_memcpy(B->dev, B->a, s->dt == ZERO_F32 ? (void *)B->host_f32 : (void *)B->host_16, B->n * es));
    TRY(zero_memcpy(B->dev, B->b, s->dt == ZERO_F32 ? (void *)B->host_f32 : (void *)B->host_16, B->n * es));
    double sum = 0;
    run_once(B, s, &sum);
    TRY(zero_device_sync(B->dev));
    long wrong = 0;
    size_t step = B->n / 4096 ? B->n / 4096 : 1;
    for (size_t i = 0; i < B->n; i += step) {
        float in = s->dt == ZERO_F32 ? B->host_f32[i]
                   : s->dt == ZERO_F16 ? zero_f16_to_f32(B->host_16[i]) : zero_bf16_to_f32(B->host_16[i]);
        zero_dtype out_dt = s->op == OP_CAST ? s->dt2 : s->dt;
        float want = s->op == OP_FILL ? 0.5f : in;
        float got;
        size_t oes = zero_dtype_size(out_dt);
        unsigned char raw[4];
        if (s->op == OP_SUMSQ) break;
        TRY(zero_memcpy(B->dev, raw, (char *)B->b + i * oes, oes));
        if (out_dt == ZERO_F32) memcpy(&got, raw, 4);
        else {
            uint16_t h;
            memcpy(&h, raw, 2);
            got = out_dt == ZERO_F16 ? zero_f16_to_f32(h) : zero_bf16_to_f32(h);
            want = out_dt == ZERO_F16 ? zero_f16_to_f32(zero_f32_to_f16(want)) : zero_bf16_to_f32(zero_f32_to_bf16(want));
        }
        if (memcmp(&got, &want, 4) != 0) wrong++;
    }
    if (s->op == OP_SUMSQ) {
        double ref = 0;
        for (size_t i = 0; i < B->n; i++) {
            double v = s->dt == ZERO_F32 ? B->host_f32[i]
                       : s->dt == ZERO_F16 ? zero_f16_to_f32(B->host_16[i]) : zero_bf16_to_f32(B->host_16[i]);
            ref += v * v;
        }
        wrong = fabs(sum - ref) > 1e-9 * ref;
    }
    return wrong;
}

/* ---------------------------------------------------------------- optimizer vs same-traffic loop */

#if defined(__GNUC__) && defined(__x86_64__)
#define PEER_AVX512 __attribute__((target("avx512f")))
#define PEER_AVX2 __attribute__((target("avx2")))
#else
#define PEER_AVX512
#define PEER_AVX2
#endif

/* The peer: one add per stream, vectorized, the same bytes in and out. */
#define PEER_BODY                                                                                  \
    if (m2) {                                                                                      \
        _Pragma("omp simd") for (size_t i = lo; i < hi; i++) {                                     \
            float x = g[i];                                                                        \
            p[i] += x, m1[i] += x, m2[i] += x;                                                     \
        }                                                                                          \
    } else {                                                                                       \
        _Pragma("omp simd") for (size_t i = lo; i < hi; i++) {                                     \
            float x = g[i];                                                                        \
            p[i] += x, m1[i] += x;                                                                 \
        }                                                                                          \
    }
PEER_AVX512 static void peer_wide(float *restrict p, const float *restrict g, float *restrict m1,
                                  float *restrict m2, size_t lo, size_t hi)
{
    PEER_BODY
}
static void peer_base(float *restrict p, const float *restrict g, float *restrict m1, float *restrict m2, size_t lo,
                      size_t hi)
{
    PEER_BODY
}
/* On a CPU without AVX-512 the peer is the AVX2 loop, as the kernel's widest
 * variant there is (until 2026-12-02 it fell back to the SSE2 baseline,
 * which runs below the AVX2 kernel out of cache and flattered its ratio). */
PEER_AVX2 static void peer_avx2(float *restrict p, const float *restrict g, float *restrict m1, float *restrict m2,
                                size_t lo, size_t hi)
{
    PEER_BODY
}

/* The divider bound: AdamW's correctly rounded square root and two
 * divisions per element (denom = sqrt(v) / bc2 + eps, p = m / denom: what
 * torch's bits need), and nothing else, on in-cache arrays: how fast the
 * kernel could be if memory and every other instruction were free. bc2 comes
 * in at run time: with the constant 0.5 written here, GCC turned x / 0.5
 * into x + x (exact for a power of two), so this row measured one division
 * fewer than its label until 2026-12-02 (docs/BENCHMARKS.md, issue 15).
 * divs 1: the square root and the one division left where the bc2 division
 * is skipped (bc2 = 1) or done without the divider (the AVX2 kernel). */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
PEER_AVX512 static void divider_512(float *restrict p, const float *restrict m, const float *restrict v, size_t n,
                                    float bc2f)
{
    const __m512 bc2 = _mm512_set1_ps(bc2f), eps = _mm512_set1_ps(1e-8f);
    for (size_t i = 0; i + 16 <= n; i += 16) {
        __m512 d = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(_mm512_loadu_ps(v + i)), bc2), eps);
        _mm512_storeu_ps(p + i, _mm512_div_ps(_mm512_loadu_ps(m + i), d));
    }
}
__attribute__((target("avx"))) static void divider_256(float *restrict p, const float *restrict m,
                                                        const float *restrict v, size_t n, float bc2f, int divs)
{
    const __m256 bc2 = _mm256_set1_ps(bc2f), eps = _mm256_set1_ps(1e-8f);
    if (divs == 1) {
        for (size_t i = 0; i + 8 <= n; i += 8) {
            __m256 d = _mm256_add_ps(_mm256_sqrt_ps(_mm256_loadu_ps(v + i)), eps);
            _mm256_storeu_ps(p + i, _mm256_div_ps(_mm256_loadu_ps(m + i), d));
        }
        return;
    }
    for (size_t i = 0; i + 8 <= n; i += 8) {
        __m256 d = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(_mm256_loadu_ps(v + i)), bc2), eps);
        _mm256_storeu_ps(p + i, _mm256_div_ps(_mm256_loadu_ps(m + i), d));
    }
}
#define HAVE_DIVIDER_LOOPS 1
#else
#define HAVE_DIVIDER_LOOPS 0
#endif

/* In cache: the best of 100 rounds of 20 passes (1.8 ms of AdamW each). */
#define IN_CACHE_ROUNDS 100
#define IN_CACHE_REPS 20

typedef struct optim_arrays {
    float *p, *g, *m1, *m2;
    size_t n;
} optim_arrays;

/* One pass of the kernel (kind 0 AdamW, 1 SGD+momentum) or of its peer,
 * split over the threads like zero_cpu_adamw splits (16-element multiples). */
static void optim_pass(optim_arrays *A, int kind, int peer, const zero_optim_hyper *h, int wide)
{
    const size_t n = A->n;
    float *m2 = kind != 1 ? A->m2 : NULL;
    if (!peer) {
        if (kind != 1) zero_cpu_adamw(h, A->p, A->g, A->m1, A->m2, n); /* kind 2: h is the fast mode's */
        else zero_cpu_sgd(h, A->p, A->g, A->m1, n);
        return;
    }
#if ZERO_HAVE_OPENMP
#pragma omp parallel if (n > 32768)
#endif
    {
        size_t nt = 1, t = 0;
#if ZERO_HAVE_OPENMP
        nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
#endif
        size_t per = (n / nt + 15) / 16 * 16;
        size_t lo = t * per < n ? t * per : n, hi = lo + per < n ? lo + per : n;
        if (wide == 2) peer_wide(A->p, A->g, A->m1, m2, lo, hi);
        else if (wide == 1) peer_avx2(A->p, A->g, A->m1, m2, lo, hi);
        else peer_base(A->p, A->g, A->m1, m2, lo, hi);
    }
}

static double optim_time(optim_arrays *A, int kind, int peer, const zero_optim_hyper *h, int wide, int reps)
{
    double t0 = now();
    for (int r = 0; r < reps; r++) optim_pass(A, kind, peer, h, wide);
    return (now() - t0) / reps;
}

/* The divider loops (256- and 512-bit) at the in-cache size, one thread,
 * printed as AdamW-equivalent GB/s (28 bytes an element): the ceiling of
 * the in-cache AdamW row above. */
static int bench_divider(FILE *f, int first_row, optim_arrays *A, const zero_optim_hyper *h)
{
    int rows = 0;
    /* Fresh values: the SGD rows left momentum in m1 that AdamW's m * beta1
     * would decay into subnormals (slow microcode assists on every op). */
    for (size_t i = 0; i < A->n; i++)
        A->p[i] = 1.0f, A->g[i] = 1e-3f * (float)(i % 7), A->m1[i] = 0.0f, A->m2[i] = 0.0f;
    /* First the AdamW kernel once bc2 = sqrt(1 - beta2^t) has rounded to 1
     * (past ~17,400 steps at beta2 0.999), where it skips that division. */
    {
#if ZERO_HAVE_OPENMP
        omp_set_num_threads(1);
#endif
        zero_optim_hyper h1 = *h;
        h1.bc2_sqrt = 1.0f;
        double best = 1e30;
        for (int round = 0; round < IN_CACHE_ROUNDS; round++) {
            double t = optim_time(A, 0, 0, &h1, 1, IN_CACHE_REPS);
            best = t < best ? t : best;
        }
        double g = 28.0 * (double)A->n / best / 1e9;
        printf("%-6s %-13s %7d %10.2f %10s %10.1f %7s   (bc2 = 1: one division per element fewer)\n", "adamw",
               "in cache", 1, g, "-", best * 1e6, "-");
        if (f)
            fprintf(f, "%s  {\"kernel\": \"adamw_bc2_one\", \"n\": %zu, \"threads\": 1, \"kernel_gbps\": %.4f}",
                    first_row + rows ? ",\n" : "", A->n, g);
        rows++;
    }
#if HAVE_DIVIDER_LOOPS
#if ZERO_HAVE_OPENMP
    omp_set_num_threads(1);
#endif
    /* through a volatile: a constant would let the compiler fold the division */
    volatile float bc2_at_run_time = h->bc2_sqrt;
    const float bc2 = bc2_at_run_time;
    /* w 0: 256-bit, two divisions; 1: 512-bit, two; 2: 256-bit, one */
    for (int w = 0; w < 3; w++) {
        if (w == 1 && !__builtin_cpu_supports("avx512f")) continue;
        if (w != 1 && !__builtin_cpu_supports("avx")) continue;
        const int reps = IN_CACHE_REPS;
        double best = 1e30;
        for (int round = 0; round < IN_CACHE_ROUNDS; round++) {
            double t0 = now();
            for (int r = 0; r < reps; r++) {
                if (w == 1) divider_512(A->p, A->m1, A->m2, A->n, bc2);
                else divider_256(A->p, A->m1, A->m2, A->n, bc2, w == 2 ? 1 : 2);
            }
            double t = (now() - t0) / reps;
            best = t < best ? t : best;
        }
        double g = 28.0 * (double)A->n / best / 1e9;
        const int bits = w == 1 ? 512 : 256, divs = w == 2 ? 1 : 2;
        printf("%-6s %-13s %7d %10.2f %10s %10.1f %7s   (sqrt + %d div per element, %d-bit)\n", "divide", "in cache", 1,
               g, "-", best * 1e6, "-", divs, bits);
        if (f)
            fprintf(f, "%s  {\"kernel\": \"divider\", \"bits\": %d, \"divisions\": %d, \"n\": %zu, \"threads\": 1, "
                       "\"kernel_gbps\": %.4f}",
                    first_row + rows ? ",\n" : "", bits, divs, A->n, g);
        rows++;
    }
#else
    (void)f, (void)first_row, (void)A;
#endif
    return rows;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v). */
static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Prints the table and appends JSON rows to f; returns the number of rows.
 * "ratio" is kernel / peer from each one's best round; "paired" the median
 * of the rounds' own peer-time / kernel-time quotients. This machine's vCPU
 * switches between a fast and a slow state every few tenths of a second,
 * the kernel and the peer alike (docs/BENCHMARKS.md, issue 15): the two
 * bests may come from different states, a round's pair (back to back) from
 * one. */
static int bench_optim(FILE *f, int first_row)
{
    int wide = 0; /* the peer's ISA: 2 AVX-512, 1 AVX2, 0 the build's baseline */
#if defined(__GNUC__) && defined(__x86_64__)
    wide = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
    zero_optim_hyper h = {.grad_scale = 1.0f, .decay = 0.99999f, .beta1 = 0.9f, .one_minus_beta1 = 0.1f,
                          .beta2 = 0.999f, .one_minus_beta2 = 0.001f, .neg_step_size = -1e-3f, .bc2_sqrt = 0.5f,
                          .fast_num = -5e-4f, .fast_eps = 5e-9f, .eps = 1e-8f, .neg_lr = -1e-3f, .weight_decay = 1e-5f, .momentum = 0.9f,
                          .one_minus_dampening = 1.0f};
    const size_t sizes[2] = {(size_t)1 << 16, (size_t)1 << 25};
    const char *where[2] = {"in cache", "out of cache"};
    int rows = 0;
    printf("\noptimizer kernels (variant %s) vs a same-traffic loop (%s), best of %d rounds in cache, alternated\n",
           zero_cpu_optim_active()->name, wide == 2 ? "avx512f" : wide == 1 ? "avx2" : "baseline", IN_CACHE_ROUNDS);
    printf("%-10s %-13s %7s %10s %10s %10s %7s %7s\n", "kernel", "arrays", "threads", "kern GB/s", "peer GB/s",
           "time(us)", "ratio", "paired");
    for (int si = 0; si < 2; si++) {
        size_t n = sizes[si];
        optim_arrays A = {.n = n};
        /* 64-byte aligned, as the engine allocates its shards: malloc's
         * arrays sit 16 bytes off, so half of the peer's 256-bit stores
         * straddled cache lines while the kernel (which starts its vector
         * loop at p's alignment) avoided that - until 2026-12-02 the peer
         * ran at 72-86 GB/s in cache here instead of 110-124 and flattered
         * the ratio (docs/BENCHMARKS.md, issue 15). n * 4 is a multiple of 64. */
        A.p = aligned_alloc(64, n * 4), A.g = aligned_alloc(64, n * 4), A.m1 = aligned_alloc(64, n * 4);
        A.m2 = aligned_alloc(64, n * 4);
        if (!A.p || !A.g || !A.m1 || !A.m2) {
            fprintf(stderr, "zero-bench-device: out of memory for the optimizer table\n");
            exit(1);
        }
        for (size_t i = 0; i < n; i++) A.p[i] = 1.0f, A.g[i] = 1e-3f * (float)(i % 7), A.m1[i] = 0.0f, A.m2[i] = 0.0f;
        const int reps = si == 0 ? IN_CACHE_REPS : 6, rounds = si == 0 ? IN_CACHE_ROUNDS : 5;
        /* kind 0 AdamW (exact), 1 SGD + momentum, 2 AdamW's opt-in fast mode */
        for (int kind = 0; kind < 3; kind++) {
            double bytes = (kind != 1 ? 28.0 : 20.0) * (double)n;
            zero_optim_hyper hk = h;
            hk.fast = kind == 2;
            /* every kernel from the same state (SGD leaves its momentum in m1) */
            for (size_t i = 0; i < n; i++) A.p[i] = 1.0f, A.g[i] = 1e-3f * (float)(i % 7), A.m1[i] = 0.0f, A.m2[i] = 0.0f;
            for (int threads = 1; threads <= 2; threads++) {
#if ZERO_HAVE_OPENMP
                omp_set_num_threads(threads);
#else
                if (threads > 1) break;
#endif
                double bk = 1e30, bp = 1e30, paired[IN_CACHE_ROUNDS];
                optim_pass(&A, kind, 0, &hk, wide), optim_pass(&A, kind, 1, &hk, wide); /* warm up */
                for (int round = 0; round < rounds; round++) {
                    double tk = optim_time(&A, kind, 0, &hk, wide, reps);
                    double tp = optim_time(&A, kind, 1, &hk, wide, reps);
                    bk = tk < bk ? tk : bk;
                    bp = tp < bp ? tp : bp;
                    paired[round] = tk > 0 ? tp / tk : 0.0;
                }
                double gk = bytes / bk / 1e9, gp = bytes / bp / 1e9, pr = median_of(paired, rounds);
                static const char *const kname[3] = {"adamw", "sgd", "adamw-fast"};
                printf("%-10s %-13s %7d %10.2f %10.2f %10.1f %7.2f %7.2f\n", kname[kind], where[si], threads,
                       gk, gp, bk * 1e6, gk / gp, pr);
                if (f)
                    fprintf(f, "%s  {\"kernel\": \"%s\", \"variant\": \"%s\", \"n\": %zu, \"threads\": %d, "
                               "\"kernel_gbps\": %.4f, \"peer_gbps\": %.4f, \"ratio\": %.4f, \"paired_ratio\": %.4f}",
                            first_row + rows ? ",\n" : "", kname[kind], zero_cpu_optim_active()->name,
                            n, threads, gk, gp, gk / gp, pr);
                rows++;
            }
        }
        if (si == 0) rows += bench_divider(f, first_row + rows, &A, &h);
        free(A.p), free(A.g), free(A.m1), free(A.m2);
    }
    return rows;
}

int main(int argc, char **argv)
{
    const char *device = "cpu", *json = "bench_device.json";
    size_t n = (size_t)1 << 24;
    int iters = 20, optim_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--n") && i + 1 < argc) n = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--optim-only")) optim_only = 1;
        else if (!strcmp(argv[i], "--clock") && i + 1 < argc && !strcmp(argv[i + 1], "cpu")) g_cpu_clock = 1, i++;
        else if (!strcmp(argv[i], "--clock") && i + 1 < argc && !strcmp(argv[i + 1], "wall")) g_cpu_clock = 0, i++;
        else {
            fprintf(stderr, "usage: %s [--device cpu|cuda] [--n ELEMENTS] [--iters N] [--json FILE] [--optim-only]"
                            " [--clock wall|cpu]\n",
                    argv[0]);
            return 2;
        }
    }
    if (n == 0 || iters < 1) return 2;
    if (optim_only) {
        if (strcmp(device, "cpu")) return 2;
        FILE *f = fopen(json, "w");
        if (f) fprintf(f, "{\"device\": \"cpu\", \"optim\": [\n");
        bench_optim(f, 0);
        if (f) fprintf(f, "\n]}\n"), fclose(f), printf("wrote %s\n", json);
        return 0;
    }
    bench B = {.n = n, .iters = iters};
    zero_status st = zero_device_create(&B.dev, strcmp(device, "cuda") ? ZERO_DEVICE_CPU : ZERO_DEVICE_CUDA, -1);
    if (st != ZERO_OK) {
        fprintf(stderr, "zero-bench-device: %s\n", zero_last_error());
        return st == ZERO_UNSUPPORTED ? 77 : 1;
    }
    TRY(zero_stream_create(B.dev, &B.stream));
    TRY(zero_device_alloc(B.dev, n * 4, &B.a));
    TRY(zero_device_alloc(B.dev, n * 4, &B.b));
    B.host_f32 = malloc(n * 4);
    B.host_16 = malloc(n * 2);
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        B.host_f32[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        B.host_16[i] = zero_f32_to_bf16(B.host_f32[i]);
    }

    const spec specs[] = {
        {"copy (peer)", OP_COPY, ZERO_F32, ZERO_F32, 8},
        {"fill f32", OP_FILL, ZERO_F32, ZERO_F32, 4},
        {"scale f32", OP_SCALE, ZERO_F32, ZERO_F32, 8},
        {"axpy f32", OP_AXPY, ZERO_F32, ZERO_F32, 12},
        {"scale bf16", OP_SCALE, ZERO_BF16, ZERO_BF16, 4},
        {"axpy bf16", OP_AXPY, ZERO_BF16, ZERO_BF16, 6},
        {"axpy f16", OP_AXPY, ZERO_F16, ZERO_F16, 6},
        {"cast f32->bf16", OP_CAST, ZERO_F32, ZERO_BF16, 6},
        {"cast f32->f16", OP_CAST, ZERO_F32, ZERO_F16, 6},
        {"cast bf16->f32", OP_CAST, ZERO_BF16, ZERO_F32, 6},
        {"cast f16->f32", OP_CAST, ZERO_F16, ZERO_F32, 6},
        {"sumsq f32", OP_SUMSQ, ZERO_F32, ZERO_F32, 4},
        {"sumsq bf16", OP_SUMSQ, ZERO_BF16, ZERO_BF16, 2},
    };
    size_t nspec = sizeof specs / sizeof specs[0];
    result *res = calloc(nspec, sizeof *res);
    for (size_t k = 0; k < nspec; k++) {
        const spec *s = &specs[k];
        if (s->dt == ZERO_F16) { /* f16 inputs for f16 ops */
            for (size_t i = 0; i < n; i++) B.host_16[i] = zero_f32_to_f16(B.host_f32[i]);
        } else if (s->dt == ZERO_BF16) {
            for (size_t i = 0; i < n; i++) B.host_16[i] = zero_f32_to_bf16(B.host_f32[i]);
        }
        res[k].name = s->name;
        res[k].wrong = s->op == OP_COPY ? 0 : check(&B, s);
        double sink;
        run_once(&B, s, &sink); /* warm up */
        TRY(zero_device_sync(B.dev));
        TRY(zero_stream_sync(B.stream));
        double t0 = now();
        for (int it = 0; it < iters; it++) run_once(&B, s, &sink);
        TRY(zero_stream_sync(B.stream));
        res[k].seconds = (now() - t0) / iters;
        res[k].bytes = s->bytes_per_elem * (double)n;
    }

    double peer = res[0].bytes / res[0].seconds / 1e9;
    printf("zero-bench-device: %s device, n = %zu elements, %d iterations\n", device, n, iters);
    printf("%-16s %10s %10s %8s %7s\n", "op", "time(us)", "GB/s", "vs copy", "#wrong");
    for (size_t k = 0; k < nspec; k++) {
        double gbs = res[k].bytes / res[k].seconds / 1e9;
        printf("%-16s %10.1f %10.2f %8.2f %7ld\n", res[k].name, res[k].seconds * 1e6, gbs, gbs / peer, res[k].wrong);
    }
    FILE *f = fopen(json, "w");
    if (f) {
        fprintf(f, "{\"device\": \"%s\", \"n\": %zu, \"iters\": %d, \"results\": [\n", device, n, iters);
        for (size_t k = 0; k < nspec; k++) {
            double gbs = res[k].bytes / res[k].seconds / 1e9;
            fprintf(f, "  {\"op\": \"%s\", \"seconds\": %.9g, \"gbps\": %.4f, \"vs_copy\": %.4f, \"wrong\": %ld}%s\n",
                    res[k].name, res[k].seconds, gbs, gbs / peer, res[k].wrong, k + 1 < nspec ? "," : "");
        }
        fprintf(f, "]");
    }
    if (!strcmp(device, "cpu")) {
        if (f) fprintf(f, ",\n\"optim\": [\n");
        bench_optim(f, 0);
        if (f) fprintf(f, "\n]");
    }
    if (f) {
        fprintf(f, "}\n");
        fclose(f);
        printf("wrote %s\n", json);
    }
    long wrong = 0;
    for (size_t k = 0; k < nspec; k++) wrong += res[k].wrong;
    zero_device_free(B.dev, B.a);
    zero_device_free(B.dev, B.b);
    zero_stream_destroy(B.stream);
    zero_device_destroy(B.dev);
    free(B.host_f32), free(B.host_16), free(res);
    return wrong ? 1 : 0;
}
