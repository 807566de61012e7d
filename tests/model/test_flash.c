/* The flash attention's CPU twin (model/gpt_flash.c: the tiled online-softmax
 * algorithm the CUDA kernels run, in the same order) against the model's
 * GEMM-based CPU attention (gpt_cpu_ops.c, itself within 1e-5 of PyTorch:
 * tests/python/test_model_vs_torch.py), forward and backward.
 *
 * Shapes: T below, at and across the 64-row/64-key tiles (1, 40, 64, 77,
 * 130: a partial last tile and rows that meet three key tiles), head sizes
 * 16, 64 and 128 (GPT_FLASH_MAX_HS), batch 2.
 *
 * Also: the shared row functions (gpt_flash_row.h) called with a padded head
 * size, as the kernels call them, give bitwise the results at the true one.
 *
 * Tolerances (per tensor, scale = max |reference|):
 *   fp32: |twin - ref| <= 2e-6 * scale + 1e-4 * |ref| elementwise for out
 *   and dqkv; lse within 1e-5 absolute of a double-precision log-sum-exp.
 *   Both sides are fp32 and differ in the order of their sums and in exp
 *   (libm's expf here, the polynomial gpt_expf there): ~1e-6 relative.
 *   bf16 inputs (what the GPU's bf16 activation mode stores: qkv and dout
 *   rounded to bf16, every sum in fp32): relative L2 error of out and dqkv
 *   against the fp32 reference <= 1e-2 - the bound the GPU check
 *   (tests/model/test_gpt_cuda.c) states for the attention in bf16; 2^-9
 *   per input; measured 1.6e-3 .. 2.8e-3 here (printed). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt_cpu_ops.h"
#include "gpt_flash.h"
#include "gpt_flash_row.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* round to bf16, nearest even (the CUDA __float2bfloat16_rn; inputs here are finite) */
static float bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* elementwise |a - ref| <= atol * max|ref| + rtol * |ref|; returns the relative L2 error */
static double compare(const char *what, const float *a, const float *ref, size_t n, double atol, double rtol,
                      int elementwise)
{
    double scale = 0, num = 0, den = 0, worst = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        num += d * d, den += (double)ref[i] * ref[i], worst = fmax(worst, d);
        if (elementwise && !(d <= atol * scale + rtol * fabs(ref[i]))) bad++;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECK_MSG(bad == 0, "%s: %zu of %zu elements outside tolerance (max abs err %.3g, scale %.3g)", what, bad, n,
              worst, scale);
    return rel;
}

static void run(int B, int T, int NH, int hs)
{
    const int C = NH * hs;
    const size_t N = (size_t)B * T, nqkv = N * 3 * C, nout = N * C, natt = (size_t)B * NH * T * T;
    float *qkv = malloc(nqkv * 4), *dout = malloc(nout * 4), *att = malloc(natt * 4);
    float *ref_out = malloc(nout * 4), *ref_dqkv = malloc(nqkv * 4), *scr = malloc((size_t)T * T * 4 * 64);
    float *out = malloc(nout * 4), *lse = malloc(N * NH * 4), *dqkv = malloc(nqkv * 4), *D = malloc(N * NH * 4);
    float *qkv16 = malloc(nqkv * 4), *dout16 = malloc(nout * 4);
    /* scores of a few units: the softmax is neither flat nor one-hot */
    for (size_t i = 0; i < nqkv; i++) qkv[i] = 1.5f * uniform();
    for (size_t i = 0; i < nout; i++) dout[i] = uniform();
    gpt_attention_forward(GPT_GEMM_F32, ref_out, att, qkv, B, T, C, NH, 1);
    gpt_attention_backward(GPT_GEMM_F32, ref_dqkv, dout, att, qkv, B, T, C, NH, scr, 1);

    gpt_flash_forward(out, lse, qkv, B, T, C, NH);
    char what[96];
    snprintf(what, sizeof what, "B%d T%d NH%d hs%d out", B, T, NH, hs);
    compare(what, out, ref_out, nout, 2e-6, 1e-4, 1);
    double worst_lse = 0;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double m = -INFINITY, s = 0, sc[1024];
                for (int j = 0; j <= t; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double acc = 0;
                    for (int d = 0; d < hs; d++) acc += (double)q[d] * k[d];
                    sc[j] = acc * scale;
                    m = fmax(m, sc[j]);
                }
                for (int j = 0; j <= t; j++) s += exp(sc[j] - m);
                worst_lse = fmax(worst_lse, fabs(lse[((size_t)b * NH + h) * T + t] - (m + log(s))));
            }
    CHECK_MSG(worst_lse <= 1e-5, "%s: lse off by %.3g", what, worst_lse);

    memset(dqkv, 0xff, nqkv * 4); /* NaN: every element must be written */
    gpt_flash_backward(dqkv, D, dout, out, lse, qkv, B, T, C, NH);
    snprintf(what, sizeof what, "B%d T%d NH%d hs%d dqkv", B, T, NH, hs);
    compare(what, dqkv, ref_dqkv, nqkv, 2e-6, 1e-4, 1);

    /* bf16 storage, fp32 sums: the GPU's bf16 activation mode */
    for (size_t i = 0; i < nqkv; i++) qkv16[i] = bf16(qkv[i]);
    for (size_t i = 0; i < nout; i++) dout16[i] = bf16(dout[i]);
    gpt_flash_forward(out, lse, qkv16, B, T, C, NH);
    double r_out = compare("bf16 out", out, ref_out, nout, 0, 0, 0);
    for (size_t i = 0; i < nout; i++) out[i] = bf16(out[i]); /* stored as bf16 too */
    gpt_flash_backward(dqkv, D, dout16, out, lse, qkv16, B, T, C, NH);
    double r_dqkv = compare("bf16 dqkv", dqkv, ref_dqkv, nqkv, 0, 0, 0);
    CHECK_MSG(r_out <= 1e-2 && r_dqkv <= 1e-2, "bf16 inputs: relative L2 out %.3g, dqkv %.3g > 1e-2", r_out,
              r_dqkv);
    printf("  B%d T%-4d NH%d hs%-3d lse err %.2g; bf16 inputs: rel L2 out %.2g dqkv %.2g\n", B, T, NH, hs, worst_lse,
           r_out, r_dqkv);
    free(qkv), free(dout), free(att), free(ref_out), free(ref_dqkv), free(scr), free(out), free(lse), free(dqkv);
    free(D), free(qkv16), free(dout16);
}

/* The kernels call the row functions with their padded head size (32, 64
 * or 128; rows zero past hs): the results must be bitwise those at hs. */
static void check_padded_rows(void)
{
    enum { HS = 16, PAD = 32, N = 20 };
    float q[PAD] = {0}, k[N * PAD] = {0}, v[N * PAD] = {0}, dy[PAD] = {0};
    for (int d = 0; d < HS; d++) q[d] = uniform(), dy[d] = uniform();
    for (int j = 0; j < N; j++)
        for (int d = 0; d < HS; d++) k[j * PAD + d] = uniform(), v[j * PAD + d] = uniform();
    float o1[PAD] = {0}, o2[PAD] = {0}, s1[N], s2[N], m1 = -INFINITY, m2 = -INFINITY, l1 = 0, l2 = 0;
    for (int c0 = 0; c0 < N; c0 += 8) { /* three tiles: two rescales */
        int n = c0 + 8 < N ? 8 : N - c0;
        gpt_flash_fwd_tile(q, k + c0 * PAD, v + c0 * PAD, PAD, n, HS, 0.25f, s1, 1, &m1, &l1, o1);
        gpt_flash_fwd_tile(q, k + c0 * PAD, v + c0 * PAD, PAD, n, PAD, 0.25f, s2, 1, &m2, &l2, o2);
    }
    float dq1[PAD] = {0}, dq2[PAD] = {0}, dk1[PAD] = {0}, dk2[PAD] = {0}, dv1[PAD] = {0}, dv2[PAD] = {0};
    for (int j = 0; j < N; j++) {
        gpt_flash_dq_key(q, dy, k + j * PAD, v + j * PAD, HS, 0.25f, 1.5f, 0.1f, dq1);
        gpt_flash_dq_key(q, dy, k + j * PAD, v + j * PAD, PAD, 0.25f, 1.5f, 0.1f, dq2);
        gpt_flash_dkv_query(q, dy, k + j * PAD, v + j * PAD, HS, 0.25f, 1.5f, 0.1f, dk1, dv1);
        gpt_flash_dkv_query(q, dy, k + j * PAD, v + j * PAD, PAD, 0.25f, 1.5f, 0.1f, dk2, dv2);
    }
    CHECK(memcmp(&m1, &m2, 4) == 0 && memcmp(&l1, &l2, 4) == 0 && memcmp(o1, o2, sizeof o1) == 0);
    CHECK(memcmp(dq1, dq2, sizeof dq1) == 0 && memcmp(dk1, dk2, sizeof dk1) == 0 && memcmp(dv1, dv2, sizeof dv1) == 0);
}

int main(void)
{
    check_padded_rows();
    const int shapes[][3] = {{1, 4, 16}, {40, 4, 16}, {64, 2, 64}, {77, 3, 16}, {130, 2, 64}, {130, 1, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run(2, shapes[i][0], shapes[i][1], shapes[i][2]);
    return check_exit();
}
