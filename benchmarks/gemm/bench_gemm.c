/* zero-bench-gemm: the GFLOP/s of the CPU GEMM (model/gpt_gemm.h) at the
 * shapes zero-train runs for a GPT of width C, N = batch x seq tokens and a
 * vocabulary V: per block the four linear layers forward (x W^T), the input
 * gradients (dY W) and the weight gradients (dY^T X), and the tied head.
 * One JSON line on stdout: the kernel, the math, and the rate over all of
 * them, weighted as one training step runs them (layers x the block's
 * GEMMs + the head), plus each shape's own rate. "gflops" is wall-clock;
 * "gflops_cpu" divides by the process's CPU seconds / threads instead: what
 * the threads do per core while they run, which time-slicing by other jobs
 * on a shared machine disturbs far less (OpenMP's spin-waits count against it).
 *
 *   zero-bench-gemm [--kernel auto|amx_bf16|avx512_bf16|avx512|avx2|blas|reference] [--math f32|bf16]
 *                   [--d-model 768] [--tokens 512] [--vocab 256] [--layers 12] [--seconds 0.3]
 *
 * --kernel sets ZERO_CPU_GEMM for this process; "blas" is OpenBLAS with the
 * kernel it picks (OPENBLAS_CORETYPE decides: benchmarks/gemm/bench_gemm.py
 * runs it under several). Threads: OMP_NUM_THREADS, split as zero-train splits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt.h"
#include "gpt_gemm.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }

typedef struct shape { const char *name; int ta, tb, M, N, K, count; } shape;

int main(int argc, char **argv)
{
    const char *kernel = "auto", *math_s = "f32";
    int C = 768, N = 512, V = 256, L = 12;
    double seconds = 0.3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--kernel")) kernel = argv[i + 1];
        else if (!strcmp(argv[i], "--math")) math_s = argv[i + 1];
        else if (!strcmp(argv[i], "--d-model")) C = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens")) N = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--vocab")) V = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) L = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else {
            fprintf(stderr, "zero-bench-gemm: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    setenv("ZERO_CPU_GEMM", kernel, 1);
    if (gpt_gemm_init() != ZERO_OK) {
        fprintf(stderr, "zero-bench-gemm: %s\n", gpt_last_error());
        return 2;
    }
    gpt_gemm_math math = !strcmp(math_s, "bf16") ? GPT_GEMM_BF16 : GPT_GEMM_F32;
    /* the linear layers of one block (out x in), then the head (V x C) */
    const int lin[4][2] = {{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}};
    shape sh[15];
    int ns = 0;
    static const char *const names[4] = {"qkv", "attproj", "fc", "fcproj"};
    for (int l = 0; l < 4; l++) {
        int OC = lin[l][0], IC = lin[l][1];
        sh[ns++] = (shape){names[l], 0, 1, N, OC, IC, L};  /* forward: Y = X W^T */
        sh[ns++] = (shape){names[l], 0, 0, N, IC, OC, L};  /* dX = dY W */
        sh[ns++] = (shape){names[l], 1, 0, OC, IC, N, L};  /* dW += dY^T X */
    }
    sh[ns++] = (shape){"head", 0, 1, N, V, C, 1};
    sh[ns++] = (shape){"head", 0, 0, N, C, V, 1};
    sh[ns++] = (shape){"head", 1, 0, V, C, N, 1};

    size_t maxa = 0;
    for (int s = 0; s < ns; s++) {
        size_t a = (size_t)sh[s].M * sh[s].K, b = (size_t)sh[s].K * sh[s].N, c = (size_t)sh[s].M * sh[s].N;
        if (a > maxa) maxa = a;
        if (b > maxa) maxa = b;
        if (c > maxa) maxa = c;
    }
    float *A = malloc(maxa * 4), *B = malloc(maxa * 4), *Cm = malloc(maxa * 4);
    if (!A || !B || !Cm) return 2;
    for (size_t i = 0; i < maxa; i++) A[i] = (float)(i % 13) * 0.01f, B[i] = (float)(i % 7) * 0.01f, Cm[i] = 0.0f;

    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("{\"kernel\": \"%s\", \"blas_core\": \"%s\", \"math\": \"%s\", \"threads\": %d, \"d_model\": %d, "
           "\"tokens\": %d, \"vocab\": %d, \"layers\": %d, \"shapes\": [",
           gpt_gemm_kernel_name(math), gpt_gemm_blas_core(), math_s, threads, C, N, V, L);
    double flops_all = 0.0, time_all = 0.0, cpu_all = 0.0;
    for (int s = 0; s < ns; s++) {
        const shape *x = &sh[s];
        int lda = x->ta ? x->M : x->K, ldb = x->tb ? x->K : x->N;
        gpt_gemm(math, x->ta, x->tb, x->M, x->N, x->K, 1.0f, A, lda, B, ldb, 0.0f, Cm, x->N); /* warm-up */
        int it = 0;
        double t0 = now(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), t;
        do {
            gpt_gemm(math, x->ta, x->tb, x->M, x->N, x->K, 1.0f, A, lda, B, ldb, x->ta ? 1.0f : 0.0f, Cm, x->N);
            it++;
        } while ((t = now() - t0) < seconds / ns);
        double f = 2.0 * x->M * x->N * x->K, per = t / it;
        double per_cpu = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / threads / it;
        flops_all += f * x->count;
        time_all += per * x->count;
        cpu_all += per_cpu * x->count;
        printf("%s{\"op\": \"%s\", \"ta\": %d, \"tb\": %d, \"M\": %d, \"N\": %d, \"K\": %d, \"gflops\": %.2f}",
               s ? ", " : "", x->name, x->ta, x->tb, x->M, x->N, x->K, f / per * 1e-9);
    }
    printf("], \"gflops\": %.2f, \"gflops_cpu\": %.2f, \"step_gemm_s\": %.5f}\n", flops_all / time_all * 1e-9,
           flops_all / cpu_all * 1e-9, time_all);
    free(A), free(B), free(Cm);
    return 0;
}
