/* The CPU GEMM (model/gpt_gemm.h) against a double-precision reference, for
 * the kernel that ZERO_CPU_GEMM names (meson runs this once per kernel; a
 * kernel this CPU or build lacks is a skip). Properties:
 *  - every shape, transpose and stride: |C - ref| <= (K + 2) 2^-24 sum_k |a||b|
 *    (+ the beta term), the worst-case bound of fp32 sums in any order;
 *  - bf16 math on a bf16 kernel: the same bound against the product of the
 *    operands rounded to bf16 (to nearest even), i.e. only the operands are
 *    rounded; on a CPU without one, bf16 math gives the fp32 kernel's bits;
 *  - beta == 0 never reads C (NaN there stays out of the result);
 *  - the result is bitwise the same on 1, 3 and the default threads, OpenBLAS's too (its
 *    edge kernels sum in another order than its main one, so gpt_gemm cuts
 *    its calls by the shape alone, never by the thread count);
 *  - `test_gemm --invalid` (ZERO_CPU_GEMM=bogus): ZERO_CONFIG naming the value.
 * Usage: test_gemm KERNEL | --invalid (sets ZERO_CPU_GEMM before the first call). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt.h"
#include "gpt_gemm.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* bf16 to nearest even, back in a float (the values here are finite) */
static float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

static int bf16_kernel(void)
{
    const char *k = gpt_gemm_kernel_name(GPT_GEMM_BF16);
    return !strcmp(k, "avx512_bf16") || !strcmp(k, "amx_bf16");
}

/* Runs one case; returns the worst error / bound ratio seen (must be <= 1). */
static double run_case(gpt_gemm_math math, int ta, int tb, int M, int N, int K, float alpha, float beta, int pad)
{
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4), *C0 = malloc(nc * 4), *C2 = malloc(nc * 4);
    for (size_t i = 0; i < na; i++) A[i] = uniform();
    for (size_t i = 0; i < nb; i++) B[i] = uniform();
    for (size_t i = 0; i < nc; i++) C0[i] = beta == 0.0f ? NAN : uniform();
    memcpy(C, C0, nc * 4);
    gpt_gemm(math, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    int rounded = math == GPT_GEMM_BF16 && bf16_kernel();
    double worst = 0.0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double ref = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                if (rounded) a = round_bf16(a), b = round_bf16(b);
                ref += (double)a * b;
                mag += fabs((double)a * b);
            }
            double c0 = beta == 0.0f ? 0.0 : C0[(size_t)i * ldc + j];
            ref = alpha * ref + beta * c0;
            double bound = (K + 2) * ldexp(1.0, -24) * (fabs(alpha) * mag + fabs(beta * c0)) + 1e-30;
            double err = fabs(C[(size_t)i * ldc + j] - ref) / bound;
            if (!(err <= worst)) worst = err; /* NaN propagates */
        }
    /* the padding between rows is not touched */
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++)
            CHECK_MSG(memcmp(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], 4) == 0,
                      "padding of row %d written (M %d N %d K %d)", i, M, N, K);
#ifdef _OPENMP
    /* bitwise the same on 1 and 3 threads (our kernels: each element summed by one thread in one K order; OpenBLAS:
     * the same panel calls whatever the thread count) */
    int nt = omp_get_max_threads();
    for (int other = 1; other <= 3; other += 2) {
        memcpy(C2, C0, nc * 4);
        omp_set_num_threads(other);
        gpt_gemm(math, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C2, ldc);
        omp_set_num_threads(nt);
        CHECK_MSG(memcmp(C, C2, nc * 4) == 0, "%d threads differ from %d (M %d N %d K %d ta %d tb %d)", other, nt, M,
                  N, K, ta, tb);
    }
#endif
    free(A), free(B), free(C), free(C0), free(C2);
    return worst;
}

static void test_shapes(gpt_gemm_math math)
{
    /* edges of the 12 x 32, 32 x 32 and 6 x 16 (avx2) tiles, of KC = 256 and of NC = 768 (1536 for bf16); odd K
     * for bf16 pairs, K off the AMX tile depth (32) and off the 8 x 8 transposes of the avx2 packing */
    static const int dims[][3] = {{1, 1, 1},     {12, 32, 16},  {13, 33, 17},   {11, 31, 255},  {25, 65, 256},
                                  {40, 70, 257}, {7, 800, 300}, {130, 40, 513}, {64, 96, 64},   {3, 5, 1000},
                                  {33, 64, 33},  {96, 33, 31},   {5, 1600, 40}, {6, 16, 8},     {5, 15, 7},
                                  {7, 17, 9},    {18, 48, 23}};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int t = 0; t < 4; t++) {
            int M = dims[d][0], N = dims[d][1], K = dims[d][2], ta = t & 1, tb = t >> 1;
            float alpha = d % 3 == 2 ? 0.5f : 1.0f, beta = (float)(d % 3) * 0.5f; /* 0, 0.5, 1 */
            double w = run_case(math, ta, tb, M, N, K, alpha, beta, (int)(d % 2) * 5);
            CHECK_MSG(w <= 1.0, "%s math, kernel %s: M %d N %d K %d ta %d tb %d alpha %g beta %g: error %.3g x the bound",
                      math == GPT_GEMM_BF16 ? "bf16" : "f32", gpt_gemm_kernel_name(math), M, N, K, ta, tb, alpha, beta, w);
        }
}

/* Without a bf16 kernel, bf16 math is exactly the fp32 path. */
static void test_bf16_fallback(void)
{
    if (bf16_kernel()) return;
    int M = 37, N = 45, K = 70;
    float *A = malloc(4 * M * K), *B = malloc(4 * K * N), *C1 = malloc(4 * M * N), *C2 = malloc(4 * M * N);
    for (int i = 0; i < M * K; i++) A[i] = uniform();
    for (int i = 0; i < K * N; i++) B[i] = uniform();
    gpt_gemm(GPT_GEMM_F32, 0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C1, N);
    gpt_gemm(GPT_GEMM_BF16, 0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C2, N);
    CHECK(memcmp(C1, C2, 4 * (size_t)M * N) == 0);
    CHECK(!strcmp(gpt_gemm_kernel_name(GPT_GEMM_BF16), gpt_gemm_kernel_name(GPT_GEMM_F32)));
    free(A), free(B), free(C1), free(C2);
}

int main(int argc, char **argv)
{
    int invalid = argc > 1 && !strcmp(argv[1], "--invalid");
    if (argc > 1) setenv("ZERO_CPU_GEMM", invalid ? "bogus" : argv[1], 1);
    const char *want = getenv("ZERO_CPU_GEMM");
    zero_status st = gpt_gemm_init();
    if (invalid) {
        CHECK(st == ZERO_CONFIG);
        CHECK_MSG(want && strstr(gpt_last_error(), want), "message: %s", gpt_last_error());
        /* the automatic choice stays in force */
        CHECK(strcmp(gpt_gemm_kernel_name(GPT_GEMM_F32), "avx512_bf16") != 0);
        CHECK(strcmp(gpt_gemm_kernel_name(GPT_GEMM_F32), "amx_bf16") != 0);
        return check_exit();
    }
    if (st == ZERO_CONFIG) {
        printf("skip: %s\n", gpt_last_error());
        return 77;
    }
    CHECK_OK(st);
    printf("kernels: f32 %s, bf16 %s\n", gpt_gemm_kernel_name(GPT_GEMM_F32), gpt_gemm_kernel_name(GPT_GEMM_BF16));
    if (want && *want && strcmp(want, "auto"))
        CHECK_MSG(!strcmp(gpt_gemm_kernel_name(GPT_GEMM_BF16), want), "asked %s, bf16 math runs %s", want,
                  gpt_gemm_kernel_name(GPT_GEMM_BF16));
    test_shapes(GPT_GEMM_F32);
    test_shapes(GPT_GEMM_BF16);
    test_bf16_fallback();
    return check_exit();
}
