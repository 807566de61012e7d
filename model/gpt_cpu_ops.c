/* The CPU kernels of the GPT: plain C, fp32. Matmuls go to gpt_gemm (our
 * packed AVX-512 kernels, OpenBLAS, or plain C: gpt_gemm.h); every other loop is OpenMP-parallel over
 * rows (or heads) with a vectorizable inner loop. exp and tanh use a short polynomial (gpt_expf) that the compiler can
 * vectorize, because libm's scalar calls dominated the non-matmul time. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gpt_cpu_ops.h"
#include "gpt_gemm.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static inline int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The row loops (LayerNorm, softmax, cross-entropy, GELU) get AVX-512 and
 * AVX2 clones picked at load time (GCC function multiversioning; the build
 * targets baseline x86-64). Element-wise results are the same in every
 * clone (no FMA contraction under -std=c11); sums reduced with `omp simd`
 * may differ in the last bit between CPU generations, never between ranks
 * of one machine. Sanitizer builds use the baseline only. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define GPT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GPT_CLONES
#endif

/* ------------------------------------------------------------ exp, tanh */
/* exp(x) to about 2 ulp for x in [-87.3, 88.3] (clamped outside, so a very
 * negative x gives ~1e-38 rather than 0). Range reduction x = n ln2 + r with
 * ln2 split in two, then a degree-6 polynomial for e^r on |r| <= ln2/2 (the
 * classic minimax coefficients), then 2^n built in the exponent bits. Written
 * without calls or branches so that loops over it vectorize. */
static inline float gpt_expf(float x)
{
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    /* round(x / ln2) by the 1.5 * 2^23 trick: no floorf call, vectorizes on SSE2. */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * z + r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    return p * scale.f;
}

/* tanh(u) = 1 - 2 / (e^{2u} + 1): exact limits +-1, absolute error ~1e-7. */
static inline float gpt_tanhf(float u) { return 1.0f - 2.0f / (gpt_expf(2.0f * u) + 1.0f); }

/* ------------------------------------------------------------ embeddings */
void gpt_encoder_forward(float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C)
{
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tok[b * T + t] * C, *p = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
        }
}

void gpt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C)
{
    /* dwpe: rows t are independent. dwte: one token may repeat anywhere, so
     * split the channels across threads instead of the rows. */
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *dp = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) dp[c] += d[c];
        }
    }
    const int chunk = 64;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += chunk) {
        int c1 = c0 + chunk < C ? c0 + chunk : C;
        for (size_t i = 0; i < (size_t)B * T; i++) {
            float *de = dwte + (size_t)tok[i] * C;
            const float *d = dout + i * C;
            for (int c = c0; c < c1; c++) de[c] += d[c];
        }
    }
}

/* ------------------------------------------------------------ layernorm */
GPT_CLONES static void layernorm_row(float *restrict o, float *mean, float *rstd, const float *restrict x,
                                     const float *restrict w, const float *restrict b, int C)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c];
    float m = s / C, v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    float r = 1.0f / sqrtf(v / C + 1e-5f);
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
    *mean = m;
    *rstd = r;
}

void gpt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                           const float *b, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        layernorm_row(out + (size_t)i * C, &mean[i], &rstd[i], inp + (size_t)i * C, w, b, C);
}

/* dx += ...; pdw += dout * xhat; pdb += dout (one row) */
GPT_CLONES static void layernorm_backward_row(float *restrict dx, float *restrict pdw, float *restrict pdb,
                                              const float *restrict d, const float *restrict x,
                                              const float *restrict w, float m, float r, int C)
{
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int c = 0; c < C; c++) {
        float g = d[c] * w[c], xhat = (x[c] - m) * r;
        sum_g += g;
        sum_gx += g * xhat;
    }
    sum_g /= C;
    sum_gx /= C;
    for (int c = 0; c < C; c++) {
        float xhat = (x[c] - m) * r;
        dx[c] += (d[c] * w[c] - sum_g - xhat * sum_gx) * r;
        pdw[c] += d[c] * xhat;
        pdb[c] += d[c];
    }
}

void gpt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C,
                            float *partials, int nthreads)
{
    /* Each thread sums its rows' dw/db into its own slice of `partials`, then
     * the slices are added: no atomics, and a fixed order for a fixed thread count. */
#pragma omp parallel num_threads(nthreads)
    {
        float *pdw = partials + (size_t)thread_id() * 2 * C, *pdb = pdw + C;
        memset(pdw, 0, sizeof(float) * 2 * C);
#pragma omp for schedule(static)
        for (int i = 0; i < N; i++)
            layernorm_backward_row(dinp + (size_t)i * C, pdw, pdb, dout + (size_t)i * C, inp + (size_t)i * C, w,
                                   mean[i], rstd[i], C);
    }
    for (int t = 0; t < nthreads; t++) {
        const float *pdw = partials + (size_t)t * 2 * C, *pdb = pdw + C;
        for (int c = 0; c < C; c++) {
            dw[c] += pdw[c];
            db[c] += pdb[c];
        }
    }
}

/* ------------------------------------------------------------ linear layers */
void gpt_matmul_forward(gpt_gemm_math math, float *out, const float *init, const float *inp, const float *w,
                        const float *bias, int N, int C, int OC)
{
    /* Write init + bias first so the one sgemm (beta = 1) also does the
     * bias add and the residual add: one pass over `out` instead of three. */
    if (init || bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) {
            float *o = out + (size_t)i * OC;
            const float *r = init ? init + (size_t)i * OC : NULL;
            for (int j = 0; j < OC; j++) o[j] = (r ? r[j] : 0.0f) + (bias ? bias[j] : 0.0f);
        }
    }
    gpt_gemm(math, 0, 1, N, OC, C, 1.0f, inp, C, w, C, (init || bias) ? 1.0f : 0.0f, out, OC);
}

/* db += column sums of dout (N x OC), per-thread partial sums added in a fixed
 * order: parallel (a BLAS gemv against ones ran on one thread here). */
GPT_CLONES static void add_row(float *restrict acc, const float *restrict row, int n)
{
    for (int j = 0; j < n; j++) acc[j] += row[j];
}

static void column_sums(float *db, const float *dout, int N, int OC, float *partials, int nthreads)
{
#pragma omp parallel num_threads(nthreads)
    {
        float *acc = partials + (size_t)thread_id() * OC;
        memset(acc, 0, sizeof(float) * OC);
#pragma omp for schedule(static)
        for (int i = 0; i < N; i++) add_row(acc, dout + (size_t)i * OC, OC);
    }
    for (int t = 0; t < nthreads; t++) add_row(db, partials + (size_t)t * OC, OC);
}

void gpt_matmul_backward_input(gpt_gemm_math math, float *dinp, const float *dout, const float *w, int N, int C,
                               int OC, int accumulate_dinp)
{
    gpt_gemm(math, 0, 0, N, C, OC, 1.0f, dout, OC, w, C, accumulate_dinp ? 1.0f : 0.0f, dinp, C);
}

void gpt_matmul_backward_weight(gpt_gemm_math math, float *dw, float *db, const float *dout, const float *inp, int N,
                                int C, int OC, float *partials, int nthreads)
{
    gpt_gemm(math, 1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    if (db) column_sums(db, dout, N, OC, partials, nthreads);
}

/* The two halves in this order: a split backward (B now, W later) computes
 * the same bits. */
void gpt_matmul_backward(gpt_gemm_math math, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC, int accumulate_dinp,
                         float *partials, int nthreads)
{
    gpt_matmul_backward_input(math, dinp, dout, w, N, C, OC, accumulate_dinp);
    gpt_matmul_backward_weight(math, dw, db, dout, inp, N, C, OC, partials, nthreads);
}

/* ------------------------------------------------------------ attention */
/* row[0..t] = softmax(row[0..t]); row[t+1..T-1] = 0 (the causal mask) */
GPT_CLONES static void softmax_causal_row(float *row, int t, int T)
{
    float maxv = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : maxv)
    for (int j = 0; j <= t; j++) maxv = row[j] > maxv ? row[j] : maxv;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j <= t; j++) {
        row[j] = gpt_expf(row[j] - maxv);
        sum += row[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j <= t; j++) row[j] *= inv;
    for (int j = t + 1; j < T; j++) row[j] = 0.0f;
}

/* d holds dP; becomes dS = scale * P * (dP - sum(P * dP)), zero above the diagonal */
GPT_CLONES static void softmax_causal_backward_row(float *restrict d, const float *restrict p, int t, int T,
                                                   float scale)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j <= t; j++) s += p[j] * d[j];
    for (int j = 0; j <= t; j++) d[j] = scale * p[j] * (d[j] - s);
    for (int j = t + 1; j < T; j++) d[j] = 0.0f;
}

/* One thread per (batch, head); inside it the products are single-threaded
 * GEMM calls on strided views of qkv, at BLAS speed (~4x faster here than
 * hand-written causal loops). Causality is exploited by query blocks of
 * ATT_BLOCK rows: block [r0, r1) only meets keys [0, r1), so about half of
 * the T x T products are skipped at long T; the masked corner inside each
 * diagonal block is computed and then zeroed by the softmax. */
#define ATT_BLOCK 32

void gpt_attention_forward(gpt_gemm_math math, float *out, float *att, const float *qkv, int B, int T, int C, int NH, int nthreads)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(nthreads)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *y = out + (size_t)b * T * C + h * hs;
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, nr = r1 - r0;
                float *ab = a + (size_t)r0 * T;
                /* S[r0:r1, 0:r1] = scale Q[r0:r1] K[0:r1]^T */
                gpt_gemm_serial(math, 0, 1, nr, r1, hs, scale, q + (size_t)r0 * C3, C3, k, C3, 0.0f, ab, T);
                for (int t = r0; t < r1; t++) softmax_causal_row(a + (size_t)t * T, t, T);
                /* Y[r0:r1] = P[r0:r1, 0:r1] V[0:r1] */
                gpt_gemm_serial(math, 0, 0, nr, hs, r1, 1.0f, ab, T, v, C3, 0.0f, y + (size_t)r0 * C, C);
            }
        }
}

void gpt_attention_backward(gpt_gemm_math math, float *dqkv, const float *dout, const float *att, const float *qkv, int B, int T,
                            int C, int NH, float *scratch, int nthreads)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(nthreads)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            float *ds = scratch + (size_t)thread_id() * T * T;
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            const float *dy = dout + (size_t)b * T * C + h * hs;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            /* Last block first: it reaches every key, so it writes all of dK and
             * dV (beta 0); the earlier blocks add to their prefix (beta 1). */
            int last = (T - 1) / ATT_BLOCK * ATT_BLOCK;
            for (int r0 = last; r0 >= 0; r0 -= ATT_BLOCK) {
                int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, nr = r1 - r0;
                float beta = r0 == last ? 0.0f : 1.0f;
                const float *ab = a + (size_t)r0 * T, *dyb = dy + (size_t)r0 * C;
                float *db = ds + (size_t)r0 * T;
                gpt_gemm_serial(math, 0, 1, nr, r1, hs, 1.0f, dyb, C, v, C3, 0.0f, db, T);    /* dP = dY V^T */
                gpt_gemm_serial(math, 1, 0, r1, hs, nr, 1.0f, ab, T, dyb, C, beta, dv, C3);   /* dV += P^T dY */
                /* through the softmax: dS = scale * P * (dP - rowsum(P * dP)) */
                for (int t = r0; t < r1; t++)
                    softmax_causal_backward_row(ds + (size_t)t * T, a + (size_t)t * T, t, T, scale);
                gpt_gemm_serial(math, 0, 0, nr, hs, r1, 1.0f, db, T, k, C3, 0.0f, dq + (size_t)r0 * C3, C3);      /* dQ = dS K */
                gpt_gemm_serial(math, 1, 0, r1, hs, nr, 1.0f, db, T, q + (size_t)r0 * C3, C3, beta, dk, C3);      /* dK += dS^T Q */
            }
        }
}

/* ------------------------------------------------------------ gelu */
/* Touches 4C values per token in both passes: the largest element-wise cost. */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

GPT_CLONES static void gelu_forward_range(float *restrict out, const float *restrict inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + gpt_tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

/* dinp may alias dout (element i is read before it is written) */
GPT_CLONES static void gelu_backward_range(float *dinp, const float *restrict inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = gpt_tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float dth = (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * dth);
    }
}

/* [begin, end) of this thread's share of n, in multiples of 64 elements */
static void thread_range(size_t n, size_t *begin, size_t *end)
{
    int nt = 1, tid = 0;
#ifdef _OPENMP
    nt = omp_get_num_threads();
    tid = omp_get_thread_num();
#endif
    size_t blocks = (n + 63) / 64;
    *begin = blocks * tid / nt * 64;
    *end = blocks * (tid + 1) / nt * 64;
    if (*end > n) *end = n;
    if (*begin > n) *begin = n;
}

void gpt_gelu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel
    {
        size_t b, e;
        thread_range(n, &b, &e);
        gelu_forward_range(out + b, inp + b, e - b);
    }
}

void gpt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
#pragma omp parallel
    {
        size_t b, e;
        thread_range(n, &b, &e);
        gelu_backward_range(dinp + b, inp + b, dout + b, e - b);
    }
}

/* ------------------------------------------------------------ cross-entropy */
/* log sum exp of one row */
GPT_CLONES static float logsumexp_row(const float *l, int V)
{
    float maxv = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : maxv)
    for (int v = 0; v < V; v++) maxv = l[v] > maxv ? l[v] : maxv;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) sum += gpt_expf(l[v] - maxv);
    return maxv + logf(sum);
}

double gpt_crossentropy_forward(float *lse, const float *logits, const int32_t *targets, int N, int V,
                                long *count)
{
    double total = 0.0;
    long valid = 0;
#pragma omp parallel for schedule(static) reduction(+ : total, valid)
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * V;
        lse[i] = logsumexp_row(l, V);
        if (targets && targets[i] >= 0) {
            total += (double)lse[i] - l[targets[i]];
            valid++;
        }
    }
    *count = valid;
    return total;
}

/* d = scale * exp(l - lse): the softmax, scaled */
GPT_CLONES static void softmax_scaled_row(float *restrict d, const float *restrict l, float lse, int V, float scale)
{
    for (int v = 0; v < V; v++) d[v] = scale * gpt_expf(l[v] - lse);
}

void gpt_crossentropy_backward(float *dlogits, const float *logits, const float *lse, const int32_t *targets,
                               int N, int V, float scale)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *d = dlogits + (size_t)i * V;
        if (targets[i] < 0) {
            memset(d, 0, sizeof(float) * V);
            continue;
        }
        softmax_scaled_row(d, logits + (size_t)i * V, lse[i], V, scale);
        d[targets[i]] -= scale;
    }
}
