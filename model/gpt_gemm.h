/* Internal: the CPU GEMM of the GPT, C[M,N] = alpha * op(A) op(B) + beta * C,
 * row-major, fp32 in and out. One entry point, several kernels chosen once
 * per process from what the CPU can do (CPUID) and ZERO_CPU_GEMM:
 *
 *   amx_bf16     the same rounding, products summed in fp32 by Intel's tile
 *                unit (AMX-BF16, Sapphire Rapids on). bf16 math only.
 *   avx512_bf16  operands rounded to bf16 (to nearest even) while packing,
 *                products summed in fp32 by vdpbf16ps: twice the multiply
 *                rate of fp32 FMA on AMD Zen 4/5, half of it on Intel's
 *                AMX CPUs, where "auto" does not pick it. Used only for
 *                GPT_GEMM_BF16 math.
 *   avx512       packed AVX-512F FMA kernel, fp32 throughout.
 *   avx2         the same loops around a 6 x 16 AVX2 + FMA kernel, fp32 (CPUs
 *                without AVX-512; "auto" picks it only without OpenBLAS).
 *   blas         OpenBLAS's cblas_sgemm (the build's BLAS; its kernel is
 *                whatever OpenBLAS picks for the CPU or OPENBLAS_CORETYPE).
 *   reference    plain C loops: correct, slow; the last resort.
 *
 * Why our own AVX-512 kernels: the BLAS a Debian machine has (OpenBLAS
 * 0.3.21) picks its kernel from the CPU family it knows, so on CPUs newer
 * than it (Zen 5; Sapphire/Emerald Rapids, which it runs as SSE3 "Prescott")
 * or under a pinned OPENBLAS_CORETYPE it runs far below the cores' rate;
 * these kernels are chosen by CPU features, not by family. docs/model.md,
 * "CPU GEMM", has the figures and how to choose.
 *
 * Results do not depend on OMP_NUM_THREADS. With our kernels every element
 * of C is computed by one thread with the same K order whatever the thread
 * count. OpenBLAS does not promise that (its edge kernels sum in another
 * order than its main one: seen on an AMD Zen 3 with its Zen and Haswell
 * kernels), so its calls are cut into panels by the shape alone and the
 * threads share whole panels (tests/model/test_gemm.c checks both). */
#ifndef ZERO_MODEL_GPT_GEMM_H
#define ZERO_MODEL_GPT_GEMM_H

#include <zero/status.h>

/* The precision of the products: GPT_GEMM_F32 always multiplies fp32;
 * GPT_GEMM_BF16 rounds the operands to bf16 where the chosen kernel is a
 * bf16 one (amx_bf16, avx512_bf16), and otherwise runs exactly as GPT_GEMM_F32. */
typedef enum gpt_gemm_math { GPT_GEMM_F32 = 0, GPT_GEMM_BF16 = 1 } gpt_gemm_math;

/* Reads ZERO_CPU_GEMM (unset or "auto": the fastest kernel this CPU runs;
 * "avx512_bf16", "avx512", "avx2", "blas", "reference": that one, as far as the CPU
 * and the build allow) and fixes the choice for the process on the first
 * call. ZERO_CONFIG naming the value when it is none of these, or names a
 * kernel that this CPU or build cannot run. Safe to call from any thread,
 * any number of times; gpt_gemm works without it (an invalid value then
 * means "auto"). */
zero_status gpt_gemm_init(void);

/* The kernel that `math` runs on ("amx_bf16", "avx512_bf16", "avx512", "avx2", "blas", "reference"). */
const char *gpt_gemm_kernel_name(gpt_gemm_math math);

/* 1 if bf16 math runs on a bf16 kernel (amx_bf16, avx512_bf16); 0 if it
 * runs on the fp32 kernel, where it is fp32 math bit for bit (every CPU
 * without a bf16 kernel, or one named by ZERO_CPU_GEMM): bf16 parameters
 * then save memory, not time. */
int gpt_gemm_bf16_is_native(void);

/* The core whose kernels the build's OpenBLAS runs ("Haswell", "Zen",
 * "SkylakeX", ...: OpenBLAS's own name, after OPENBLAS_CORETYPE and its
 * fallbacks; a CoreType this CPU cannot run may fall back silently, so
 * "openblas:Cooperlake" on an AVX2 CPU runs Haswell), or "none" without
 * OpenBLAS. For benchmark tables that name what they measured. */
const char *gpt_gemm_blas_core(void);

/* op(X) = X or X^T (trans_*); lda/ldb/ldc are row strides of the stored
 * matrices. beta == 0 never reads C (it may hold NaN). gpt_gemm splits the
 * work over the OpenMP threads; gpt_gemm_serial runs on the calling thread
 * (inside a parallel region). */
void gpt_gemm(gpt_gemm_math math, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
              int lda, const float *B, int ldb, float beta, float *C, int ldc);
void gpt_gemm_serial(gpt_gemm_math math, int trans_a, int trans_b, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif
