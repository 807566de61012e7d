/* Test helpers shared by the CUDA GPT tests (test_gpt_cuda.c,
 * test_gpt_cuda_split.c, test_gpt_cuda_stage.c, test_gpt_cuda_tp.c,
 * test_gpt_moe_cuda.c, test_moe_cuda.c, test_pp_stage_cuda.c): every module's
 * tensors in one flat buffer, that buffer with its gradients on the device,
 * one tensor's distance from a reference (gpt_test_diff_of), the fp32
 * GPU-vs-CPU tolerance, and the comparison of two runs' gradients (linear
 * weights bitwise). One copy of the set-up each test used to write out for
 * itself. */
#ifndef ZERO_TESTS_MODEL_GPT_TEST_PARAMS_H
#define ZERO_TESTS_MODEL_GPT_TEST_PARAMS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt.h"
#include "zero_build_config.h"
#include <zero/device.h> /* zero_f32_to_bf16, zero_bf16_to_f32 */

/* sets[module].t[index] for every parameter of cfg, in parameter order, in
 * one flat buffer of `elem`-byte elements at base. */
static inline void gpt_test_layout(const gpt_config *cfg, void *base, size_t elem, gpt_tensors *sets)
{
    size_t off = 0;
    for (size_t i = 0; i < gpt_num_params(cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(cfg, i, &info);
        sets[info.module].t[info.index] = (char *)base + off * elem;
        off += info.numel;
    }
}

/* How far one tensor of a run is from the same tensor of a reference (host
 * fp32, n elements), the differences taken in double: every comparison of
 * two runs' tensors in these tests is one of these figures against its bound. */
typedef struct gpt_test_diff {
    double scale;   /* max |ref| */
    double worst;   /* max |got - ref| */
    double l2;      /* relative L2 error: sqrt(sum (got - ref)^2 / sum ref^2), the sum of ref^2 taken as 1 at 0 */
    size_t outside; /* elements not within abs_k x scale + rel_k x |ref| (a NaN is outside) */
} gpt_test_diff;

static inline gpt_test_diff gpt_test_diff_of(const float *got, const float *ref, size_t n, double abs_k, double rel_k)
{
    gpt_test_diff r = {0, 0, 0, 0};
    double d2 = 0, r2 = 0;
    for (size_t j = 0; j < n; j++) {
        double d = fabs((double)got[j] - ref[j]);
        r.scale = fmax(r.scale, fabs(ref[j])), r.worst = fmax(r.worst, d), d2 += d * d, r2 += (double)ref[j] * ref[j];
    }
    for (size_t j = 0; j < n; j++)
        r.outside += !(fabs((double)got[j] - ref[j]) <= abs_k * r.scale + rel_k * fabs(ref[j]));
    r.l2 = sqrt(d2 / (r2 > 0 ? r2 : 1));
    return r;
}

/* fp32 on both sides, only the summation order (cuBLAS blocking) and expf
 * differ (~1e-6 relative): |gpu - cpu| <= 1e-4 max|cpu| + 1e-3 |cpu|
 * elementwise, as tests/model/test_gpt_cuda.c. Host arrays; the worst error
 * is printed when `print`. */
static inline void gpt_test_compare(const char *what, const float *gpu, const float *cpu, size_t n, int print)
{
    const gpt_test_diff r = gpt_test_diff_of(gpu, cpu, n, 1e-4, 1e-3);
    CHECK_MSG(r.outside == 0, "%s: %zu of %zu elements outside tolerance (max abs err %.3g, scale %.3g)", what,
              r.outside, n, r.worst, r.scale);
    if (print) printf("  %-32s max abs err %.3g (scale %.3g)\n", what, r.worst, r.scale);
}

/* Every parameter of cfg, GPT-2's init from `seed` (gpt_param_init), in
 * parameter order in one malloc'ed fp32 buffer of gpt_param_elements(cfg). */
static inline float *gpt_test_init_params(const gpt_config *cfg, uint64_t seed)
{
    float *params = malloc(gpt_param_elements(cfg) * sizeof(float));
    size_t off = 0;
    for (size_t i = 0; params && i < gpt_num_params(cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(cfg, i, &info);
        gpt_param_init(cfg, &info, seed, params + off);
        off += info.numel;
    }
    return params;
}

/* A block's linear weight (qkv, attention projection, fc, fc projection):
 * its gradient is one gemm on the upstream gradient chain, no atomics. */
static inline int gpt_test_is_linear_weight(const gpt_config *cfg, const gpt_param_info *info)
{
    return info->module >= 1 && info->module <= cfg->n_layer &&
           (info->index == GPT_QKV_W || info->index == GPT_ATTPROJ_W || info->index == GPT_FC_W ||
            info->index == GPT_FCPROJ_W);
}

/* Gradients of two ways to run the same model (all of cfg's parameters,
 * fp32 on the host): every block linear weight's BITWISE equal (`how` says
 * what is not, e.g. "B then W is not bitwise the unsplit backward"), every
 * other tensor (biases, LayerNorms, embeddings: fp32 atomics, whose order
 * varies) within 1e-5 x max |tensor| + rel x |value|; none zero. Returns the
 * number compared bitwise (4 per block). */
static inline int gpt_test_compare_grads(const gpt_config *cfg, const char *mode, const char *how, const float *got,
                                         const float *ref, double rel)
{
    size_t off = 0;
    int bitwise = 0;
    for (size_t i = 0; i < gpt_num_params(cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(cfg, i, &info);
        const float *a = got + off, *b = ref + off;
        const gpt_test_diff r = gpt_test_diff_of(a, b, info.numel, 1e-5, rel);
        CHECK_MSG(r.scale > 0, "%s: %s: the gradient is zero", mode, info.name);
        if (gpt_test_is_linear_weight(cfg, &info)) {
            CHECK_MSG(memcmp(a, b, info.numel * sizeof(float)) == 0, "%s: %s: %s (max abs diff %.3g)", mode, info.name,
                      how, r.worst);
            bitwise++;
        } else {
            CHECK_MSG(r.outside == 0, "%s: %s: %zu elements outside 1e-5 x %.3g + %g |value| (max abs diff %.3g)",
                      mode, info.name, r.outside, r.scale, rel, r.worst);
        }
        off += info.numel;
    }
    CHECK(bitwise == 4 * cfg->n_layer);
    return bitwise;
}

#if ZERO_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <zero/comm.h>

/* The MoE tests' `staged` mode (under mpirun, ranks sharing GPU 0: NCCL
 * refuses two ranks on one GPU): a STAGED world comm, this rank and the size.
 * 0; 77 (skip) when the build has no STAGED backend; 1 on another failure. */
static inline int gpt_test_staged_world(zero_comm **world, int *rank, int *size)
{
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 60;
    cfg.backend = ZERO_BACKEND_STAGED;
    cfg.device = 0; /* every rank on GPU 0 */
    zero_status st = zero_comm_create_world(world, &cfg);
    if (st == ZERO_UNSUPPORTED) {
        fprintf(stderr, "SKIP: STAGED backend: %s\n", zero_last_error());
        return 77;
    }
    if (st != ZERO_OK) {
        fprintf(stderr, "STAGED world: %s\n", zero_last_error());
        return 1;
    }
    *rank = zero_comm_get_rank(*world), *size = zero_comm_get_size(*world);
    check_set_rank(*rank);
    return 0;
}

/* A model's parameters and gradients on the device, `total` elements each of dt. */
typedef struct gpt_test_dev {
    void *dp, *dg; /* device: parameters, gradients */
    void *host;    /* total elements of dt: the staging of both copies */
    size_t total, es;
    zero_dtype dt;
} gpt_test_dev;

static inline void gpt_test_dev_free(gpt_test_dev *d)
{
    if (d->dp) cudaFree(d->dp);
    if (d->dg) cudaFree(d->dg);
    free(d->host);
    memset(d, 0, sizeof *d);
}

/* params (fp32 on the host, `total` elements) on the device as dt (ZERO_BF16:
 * rounded to bf16), gradients zeroed; p and g (gpt_num_modules(cfg) sets,
 * cleared first) point at them. 0, or -1 when an allocation fails (d freed). */
static inline int gpt_test_dev_init(gpt_test_dev *d, const gpt_config *cfg, const float *params, size_t total,
                                    zero_dtype dt, gpt_tensors *p, gpt_tensors *g)
{
    memset(d, 0, sizeof *d);
    d->total = total, d->dt = dt, d->es = dt == ZERO_BF16 ? 2 : 4;
    d->host = malloc(total * d->es);
    if (!d->host || cudaMalloc(&d->dp, total * d->es) != cudaSuccess ||
        cudaMalloc(&d->dg, total * d->es) != cudaSuccess) {
        gpt_test_dev_free(d);
        return -1;
    }
    for (size_t i = 0; i < total; i++) {
        if (dt == ZERO_BF16) ((uint16_t *)d->host)[i] = zero_f32_to_bf16(params[i]);
        else ((float *)d->host)[i] = params[i];
    }
    cudaMemcpy(d->dp, d->host, total * d->es, cudaMemcpyHostToDevice);
    cudaMemset(d->dg, 0, total * d->es);
    memset(p, 0, sizeof *p * (size_t)gpt_num_modules(cfg)), memset(g, 0, sizeof *g * (size_t)gpt_num_modules(cfg));
    gpt_test_layout(cfg, d->dp, d->es, p);
    gpt_test_layout(cfg, d->dg, d->es, g);
    return 0;
}

/* The device gradients as fp32 on the host, once the device is idle. */
static inline void gpt_test_dev_grads(gpt_test_dev *d, float *grads)
{
    cudaDeviceSynchronize();
    cudaMemcpy(d->host, d->dg, d->total * d->es, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < d->total; i++)
        grads[i] = d->dt == ZERO_BF16 ? zero_bf16_to_f32(((uint16_t *)d->host)[i]) : ((float *)d->host)[i];
}
#endif /* ZERO_HAVE_CUDA */

#endif
