/* The CPU GEMM (gpt_gemm.h): the kernel choice, the split over threads, and
 * the blocked loops around the packed kernels of gpt_gemm_x86.c. */
#include "gpt_gemm.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_gemm_impl.h"
#include "gpt_internal.h"
#include "zero_build_config.h"

#if ZERO_HAVE_OPENBLAS
#include <cblas.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------ the choice */
typedef enum kernel_kind { K_REFERENCE, K_BLAS, K_AVX512, K_AVX512_BF16, K_AMX_BF16, K_AVX2, K_KINDS } kernel_kind;
static const char *const kind_names[] = {"reference", "blas", "avx512", "avx512_bf16", "amx_bf16", "avx2"};

static pthread_once_t choice_once = PTHREAD_ONCE_INIT;
static kernel_kind choice[2];        /* per gpt_gemm_math */
static zero_status choice_status;    /* ZERO_CONFIG when ZERO_CPU_GEMM was refused */
static char choice_error[160];

static int cpu_has_avx512(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return gpt_gemm_avx512_f32() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

static int cpu_has_avx2(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return gpt_gemm_avx2_f32() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static int cpu_has_avx512_bf16(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return cpu_has_avx512() && gpt_gemm_avx512_bf16() && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

/* Intel's AMX CPUs (Sapphire Rapids on) have avx512_bf16 too, but there
 * vdpbf16ps runs at a quarter of the FMA's instruction rate: measured on an
 * Emerald Rapids core, the avx512_bf16 kernel does 0.5x the fp32 kernel's
 * FLOP/s (docs/model.md, "CPU GEMM"); their bf16 engine is the tile unit.
 * On AMD Zen 4/5 avx512_bf16 is the fast path. */
static int cpu_has_amx(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1u) && ((d >> 24) & 1u); /* AMX-BF16, -TILE */
#else
    return 0;
#endif
}

/* the CPU has AMX, avx512_bf16 (the packing converts with it), and Linux lets this process use the tiles */
static int cpu_runs_amx(void) { return cpu_has_avx512_bf16() && cpu_has_amx() && gpt_gemm_amx_bf16(); }

static void choose(void)
{
    /* Without AVX-512: OpenBLAS where the build has it (its AVX2 kernels are
     * as fast as ours on the AVX2 CPUs measured, docs/model.md), else ours. */
    kernel_kind best_f32 = cpu_has_avx512()     ? K_AVX512
                           : ZERO_HAVE_OPENBLAS ? K_BLAS
                           : cpu_has_avx2()     ? K_AVX2
                                                : K_REFERENCE;
    kernel_kind best_bf16 = cpu_runs_amx()                            ? K_AMX_BF16
                            : cpu_has_avx512_bf16() && !cpu_has_amx() ? K_AVX512_BF16
                                                                       : best_f32;
    choice[GPT_GEMM_F32] = best_f32;
    choice[GPT_GEMM_BF16] = best_bf16;
    const char *want = getenv("ZERO_CPU_GEMM");
    if (!want || !*want || !strcmp(want, "auto")) return;
    int k = -1;
    for (int i = 0; i < K_KINDS; i++)
        if (!strcmp(want, kind_names[i])) k = i;
    const char *why = NULL;
    if (k < 0) why = "expected auto, amx_bf16, avx512_bf16, avx512, avx2, blas or reference";
    else if (k == K_BLAS && !ZERO_HAVE_OPENBLAS) why = "this build has no OpenBLAS (meson -Dopenblas)";
    else if (k == K_AVX512 && !cpu_has_avx512()) why = "this CPU has no AVX-512 (F, BW, DQ, VL)";
    else if (k == K_AVX2 && !cpu_has_avx2()) why = "this CPU has no AVX2 and FMA";
    else if (k == K_AVX512_BF16 && !cpu_has_avx512_bf16()) why = "this CPU has no avx512_bf16";
    else if (k == K_AMX_BF16 && !cpu_runs_amx()) why = "this CPU or OS offers no AMX-BF16 tiles (with avx512_bf16)";
    if (why) {
        choice_status = ZERO_CONFIG;
        snprintf(choice_error, sizeof choice_error, "ZERO_CPU_GEMM=%.40s: %s", want, why);
        return; /* keep the automatic choice */
    }
    /* a named kernel serves both maths; the bf16 ones are bf16-only, fp32 then runs avx512 */
    choice[GPT_GEMM_F32] = k == K_AVX512_BF16 || k == K_AMX_BF16 ? K_AVX512 : (kernel_kind)k;
    choice[GPT_GEMM_BF16] = (kernel_kind)k;
}

zero_status gpt_gemm_init(void)
{
    pthread_once(&choice_once, choose);
#if ZERO_HAVE_OPENBLAS
    openblas_set_num_threads(1); /* the OpenMP threads split the work; OpenBLAS's own would fight them */
#endif
    if (choice_status != ZERO_OK) return gpt_fail(choice_status, "%s", choice_error);
    return ZERO_OK;
}

const char *gpt_gemm_kernel_name(gpt_gemm_math math)
{
    pthread_once(&choice_once, choose);
    return kind_names[choice[math == GPT_GEMM_BF16]];
}

int gpt_gemm_bf16_is_native(void)
{
    pthread_once(&choice_once, choose);
    return choice[GPT_GEMM_BF16] == K_AMX_BF16 || choice[GPT_GEMM_BF16] == K_AVX512_BF16;
}

const char *gpt_gemm_blas_core(void)
{
#if ZERO_HAVE_OPENBLAS
    const char *n = openblas_get_corename();
    return n ? n : "unknown";
#else
    return "none";
#endif
}

/* ------------------------------------------------------------ reference and BLAS */
static void gemm_reference(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc)
{
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        for (int j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        for (int k = 0; k < K; k++) {
            float a = alpha * (ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);
            if (!tb) {
                const float *b = B + (size_t)k * ldb;
                for (int j = 0; j < N; j++) c[j] += a * b[j];
            } else {
                for (int j = 0; j < N; j++) c[j] += a * B[(size_t)j * ldb + k];
            }
        }
    }
}

static void gemm_blas(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc)
{
#if ZERO_HAVE_OPENBLAS
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
#else
    gemm_reference(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

/* ------------------------------------------------------------ packed B blocks */
/* Each thread keeps its packed-B buffer (up to KC x NC units, 768 KiB) for
 * the life of the thread: the GEMM runs hundreds of times a step, and
 * allocating that much each time would churn the heap. Freed when the
 * thread exits. */
static pthread_key_t bbuf_key;
static pthread_once_t bbuf_once = PTHREAD_ONCE_INIT;
static int bbuf_key_ok;

typedef struct bbuf { size_t bytes; void *p; } bbuf;

static void bbuf_free(void *v)
{
    bbuf *b = v;
    free(b->p);
    free(b);
}

static void bbuf_key_create(void) { bbuf_key_ok = pthread_key_create(&bbuf_key, bbuf_free) == 0; }

static void *thread_bbuf(size_t bytes)
{
    pthread_once(&bbuf_once, bbuf_key_create);
    if (!bbuf_key_ok) return NULL;
    bbuf *b = pthread_getspecific(bbuf_key);
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return NULL;
        if (pthread_setspecific(bbuf_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (b->bytes < bytes) {
        free(b->p);
        b->bytes = 0;
        if (!(b->p = aligned_alloc(64, (bytes + 63) / 64 * 64))) return NULL;
        b->bytes = bytes;
    }
    return b->p;
}

/* ------------------------------------------------------------ the blocked loops */
/* Goto's order: a KC x NC block of op(B) packed into NR-wide panels (stays
 * in L2), then for each MR-row panel of op(A) (packed, stays in L1) the
 * kernel runs across the block's panels. Returns 0 when no buffer could be
 * had (the caller then falls back). */
static int gemm_packed(const gpt_gemm_impl *im, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    enum { KC = GPT_GEMM_KC, NC = GPT_GEMM_NC };
    const int NR = im->nr; /* a divisor of NC */
    const ptrdiff_t a_ls = ta ? 1 : lda, a_ks = ta ? lda : 1; /* op(A)[i][k] = A[i*a_ls + k*a_ks] */
    const ptrdiff_t b_ls = tb ? ldb : 1, b_ks = tb ? 1 : ldb; /* op(B)[k][j] = B[j*b_ls + k*b_ks] */
    const int MR = im->mr;
    const int NCk = NC * im->kpack; /* bf16 panels are half the bytes: twice the columns in L2 */
    const int nc_max = N < NCk ? (N + NR - 1) / NR * NR : NCk;
    uint32_t *bp = thread_bbuf((size_t)gpt_gemm_depth(im, KC) * nc_max * 4);
    if (!bp) return 0;
    _Alignas(64) uint32_t ap[(KC + 16) * GPT_GEMM_MR_MAX];

    if (im->begin) im->begin();
    for (int jc = 0; jc < N; jc += NCk) {
        int nc = N - jc < NCk ? N - jc : NCk;
        for (int pc = 0; pc < K; pc += KC) {
            int kc = K - pc < KC ? K - pc : KC;
            size_t panel = (size_t)gpt_gemm_depth(im, kc) * NR; /* units per B panel */
            float bt = pc == 0 ? beta : 1.0f;
            for (int js = 0; js < nc; js += NR)
                im->pack_b(bp + (js / NR) * panel, B + (jc + js) * b_ls + pc * b_ks, b_ls, b_ks,
                           nc - js < NR ? nc - js : NR, kc, NR);
            for (int ic = 0; ic < M; ic += MR) {
                int mr = M - ic < MR ? M - ic : MR;
                im->pack_a(ap, A + ic * a_ls + pc * a_ks, a_ls, a_ks, mr, kc, MR);
                for (int js = 0; js < nc; js += NR)
                    im->kernel(kc, ap, bp + (js / NR) * panel, C + (size_t)ic * ldc + jc + js, ldc, mr,
                               nc - js < NR ? nc - js : NR, alpha, bt);
            }
        }
    }
    if (im->end) im->end();
    return 1;
}

static const gpt_gemm_impl *impl_of(kernel_kind k)
{
    return k == K_AVX2          ? gpt_gemm_avx2_f32()
           : k == K_AVX512      ? gpt_gemm_avx512_f32()
           : k == K_AVX512_BF16 ? gpt_gemm_avx512_bf16()
           : k == K_AMX_BF16    ? gpt_gemm_amx_bf16()
                                : NULL;
}

void gpt_gemm_serial(gpt_gemm_math math, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    pthread_once(&choice_once, choose);
    kernel_kind k = choice[math == GPT_GEMM_BF16];
    const gpt_gemm_impl *im = impl_of(k);
    if (K > 0 && alpha != 0.0f && im &&
        gemm_packed(im, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return;
    if (k == K_BLAS) gemm_blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else gemm_reference(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* OpenBLAS sums an element in an order that depends on the shape of the call
 * (its edge and small-matrix kernels differ from the main one), so splitting
 * C by the thread count would make the bits depend on the thread count. Its
 * calls are cut instead into panels that depend on the shape alone (at most 8
 * along the longer side, at least 64 wide) and the threads share out whole
 * panels: 1 or 16 threads make the same calls. */
static void gemm_blas_panels(gpt_gemm_math math, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                             int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    int cols = N >= M, len = cols ? N : M;
    int width = (len + 7) / 8;
    width = width < 64 ? 64 : (width + 15) / 16 * 16;
    int panels = (len + width - 1) / width;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < panels; p++) {
        int s0 = p * width, n = len - s0 < width ? len - s0 : width;
        if (cols)
            gpt_gemm_serial(math, ta, tb, M, n, K, alpha, A, lda, B + (size_t)s0 * (tb ? ldb : 1), ldb, beta, C + s0,
                            ldc);
        else
            gpt_gemm_serial(math, ta, tb, n, N, K, alpha, A + (size_t)s0 * (ta ? 1 : lda), lda, B, ldb, beta,
                            C + (size_t)s0 * ldc, ldc);
    }
}

void gpt_gemm(gpt_gemm_math math, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc)
{
    pthread_once(&choice_once, choose);
    if (choice[math == GPT_GEMM_BF16] == K_BLAS) {
        if (M > 0 && N > 0) gemm_blas_panels(math, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* Split the longer side of C over the threads, in whole micro-tiles: each
     * thread packs only its own share of that side's operand. */
#pragma omp parallel
    {
        int nt = 1, tid = 0;
#ifdef _OPENMP
        nt = omp_get_num_threads();
        tid = omp_get_thread_num();
#endif
        const gpt_gemm_impl *im = impl_of(choice[math == GPT_GEMM_BF16]);
        int cols = N >= M, unit = cols ? (im ? im->nr : GPT_GEMM_NR) : im ? im->mr : 16, len = cols ? N : M;
        int tiles = (len + unit - 1) / unit;
        int s0 = (int)((long)tiles * tid / nt) * unit, s1 = (int)((long)tiles * (tid + 1) / nt) * unit;
        if (s1 > len) s1 = len;
        if (s1 > s0) {
            if (cols)
                gpt_gemm_serial(math, ta, tb, M, s1 - s0, K, alpha, A, lda, B + (size_t)s0 * (tb ? ldb : 1), ldb,
                                beta, C + s0, ldc);
            else
                gpt_gemm_serial(math, ta, tb, s1 - s0, N, K, alpha, A + (size_t)s0 * (ta ? 1 : lda), lda, B, ldb,
                                beta, C + (size_t)s0 * ldc, ldc);
        }
    }
}
