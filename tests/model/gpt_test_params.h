/* Test helpers shared by the CUDA GPT tests (test_gpt_cuda.c,
 * test_gpt_cuda_split.c, test_gpt_moe_cuda.c): every module's tensors in one
 * flat buffer, and that buffer with its gradients on the device. One copy of
 * the set-up each test used to write out for itself. */
#ifndef ZERO_TESTS_MODEL_GPT_TEST_PARAMS_H
#define ZERO_TESTS_MODEL_GPT_TEST_PARAMS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

#if ZERO_HAVE_CUDA
#include <cuda_runtime_api.h>

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
