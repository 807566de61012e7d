/* The fused multi-tensor optimizer kernel on a GPU (zero/optim_cuda.cu):
 *   1. bitwise equal to its CPU twin (zero_cpu_fused_step) on the same
 *      inputs: AdamW and SGD (momentum, nesterov, none), bf16 and f16
 *      params written in the same pass, three groups, chunks with odd
 *      offsets (the kernel's scalar path) and aligned ones (float4 path),
 *      NaN / infinity / subnormal inputs among random ones;
 *   2. its bandwidth against a device-to-device cudaMemcpy of the same
 *      traffic in the same run, alternated (goal: >= 85%): AdamW with bf16
 *      params moves 30 bytes an element (reads p, g, m, v; writes p, m, v
 *      and the bf16 copy).
 * Built from the kernels' sources (they are internal). Exit 77 without a
 * GPU. The figures go out as one "FIGURES {json}" line (run_gpu_tests.sh
 * puts them in its summary). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/cpu_optim.h"
#include "zero/optim_cuda.h"

static int failures;
#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_),              \
                    cudaGetErrorString(e_));                                                                   \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void hypers(zero_optim_hyper h[3], int step)
{
    const double lrs[3] = {1e-3, 5e-4, 2e-3}, wds[3] = {0.01, 0.0, 0.1}, b2s[3] = {0.999, 0.95, 0.99};
    for (int k = 0; k < 3; k++) {
        double lr = lrs[k], b1 = 0.9, b2 = b2s[k];
        memset(&h[k], 0, sizeof h[k]);
        h[k].grad_scale = 0.125f;
        h[k].decay = (float)(1.0 - lr * wds[k]);
        h[k].beta1 = (float)b1;
        h[k].one_minus_beta1 = (float)(1.0 - b1);
        h[k].beta2 = (float)b2;
        h[k].one_minus_beta2 = (float)(1.0 - b2);
        h[k].neg_step_size = (float)(-(lr / (1.0 - pow(b1, step))));
        h[k].bc2_sqrt = (float)sqrt(1.0 - pow(b2, step));
        h[k].eps = 1e-8f;
        h[k].neg_lr = (float)-lr;
        h[k].weight_decay = (float)wds[k];
        h[k].momentum = 0.9f;
        h[k].one_minus_dampening = 0.9f;
        h[k].nesterov = k == 2;
        h[k].first = step == 1;
    }
}

/* Tensors of the given sizes laid out one after another (each starting at
 * `skew` elements past a multiple of 4), cut into chunks of at most
 * ZERO_OPTIM_CHUNK, groups in turn. */
static zero_optim_chunk *table(const uint64_t *sizes, int nt, int skew, size_t *rows, uint64_t *total)
{
    size_t cap = 16;
    zero_optim_chunk *t = malloc(cap * sizeof *t);
    uint64_t off = 0;
    *rows = 0;
    for (int i = 0; i < nt; i++) {
        off = (off + 3) / 4 * 4 + (uint64_t)skew;
        for (uint64_t k = 0; k < sizes[i]; k += ZERO_OPTIM_CHUNK) {
            if (*rows == cap) t = realloc(t, (cap *= 2) * sizeof *t);
            zero_optim_chunk *c = &t[(*rows)++];
            c->p_off = c->g_off = c->m_off = c->out_off = off + k;
            c->len = (uint32_t)(sizes[i] - k < ZERO_OPTIM_CHUNK ? sizes[i] - k : ZERO_OPTIM_CHUNK);
            c->group = (uint32_t)(i % 3);
        }
        off += sizes[i];
    }
    *total = off + 4;
    return t;
}

typedef struct arrays {
    float *p, *g, *m, *v;
    uint16_t *out;
} arrays;

static void dev_alloc(arrays *d, uint64_t n)
{
    CK(cudaMalloc((void **)&d->p, n * 4));
    CK(cudaMalloc((void **)&d->g, n * 4));
    CK(cudaMalloc((void **)&d->m, n * 4));
    CK(cudaMalloc((void **)&d->v, n * 4));
    CK(cudaMalloc((void **)&d->out, n * 2));
}

static void dev_free(arrays *d)
{
    cudaFree(d->p);
    cudaFree(d->g);
    cudaFree(d->m);
    cudaFree(d->v);
    cudaFree(d->out);
}

static int launch(int adamw, int momentum, zero_dtype dt, const arrays *d, const zero_optim_hyper *dh,
                  const zero_optim_chunk *dc, size_t rows, cudaStream_t s)
{
    zero_optim_fused f = {adamw, dh, dc, rows, d->p, d->g, momentum ? d->m : NULL, adamw ? d->v : NULL, d->out, dt};
    return zero_cuda_fused_step(&f, s);
}

/* ---------------------------------------------------------------- 1. bitwise */

static void check_bitwise(int adamw, int momentum, zero_dtype dt, int skew)
{
    const uint64_t sizes[] = {1, 3, 4097, 16384, 16385, 50000, 7, 100003, 2, 65536};
    size_t rows;
    uint64_t n;
    zero_optim_chunk *t = table(sizes, 10, skew, &rows, &n);
    float *h[4];
    for (int k = 0; k < 4; k++) {
        h[k] = malloc(n * 4);
        for (uint64_t i = 0; i < n; i++) h[k][i] = frand() * (k == 3 ? 0.01f : 1.0f);
    }
    for (uint64_t i = 0; i < n; i++) h[3][i] = fabsf(h[3][i]); /* v >= 0 */
    h[1][5] = NAN;
    h[1][10] = INFINITY;
    h[0][20] = 1e-40f;
    h[1][30] = -1e-41f;
    uint16_t *hout = calloc(n, 2), *gout = calloc(n, 2);
    arrays d;
    dev_alloc(&d, n);
    CK(cudaMemcpy(d.p, h[0], n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.g, h[1], n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.m, h[2], n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.v, h[3], n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(d.out, 0, n * 2));
    zero_optim_hyper hy[3];
    zero_optim_chunk *dc;
    zero_optim_hyper *dh;
    CK(cudaMalloc((void **)&dc, rows * sizeof *dc));
    CK(cudaMalloc((void **)&dh, sizeof hy));
    CK(cudaMemcpy(dc, t, rows * sizeof *dc, cudaMemcpyHostToDevice));
    for (int step = 1; step <= 2; step++) {
        hypers(hy, step);
        CK(cudaMemcpy(dh, hy, sizeof hy, cudaMemcpyHostToDevice));
        CK((cudaError_t)launch(adamw, momentum, dt, &d, dh, dc, rows, 0));
        zero_optim_fused f = {adamw, hy, t, rows, h[0], h[1], momentum ? h[2] : NULL, adamw ? h[3] : NULL, hout, dt};
        zero_cpu_fused_step(&f);
    }
    CK(cudaDeviceSynchronize());
    float *back = malloc(n * 4);
    const char *names[4] = {"p", "g", "m", "v"};
    float *dsrc[4] = {d.p, d.g, d.m, d.v};
    for (int k = 0; k < 4; k++) {
        CK(cudaMemcpy(back, dsrc[k], n * 4, cudaMemcpyDeviceToHost));
        if (memcmp(back, h[k], n * 4)) {
            uint64_t i = 0;
            while (!memcmp(back + i, h[k] + i, 4)) i++;
            fprintf(stderr, "FAIL %s momentum %d %s skew %d: %s differs at %llu: gpu %.9g cpu %.9g\n",
                    adamw ? "adamw" : "sgd", momentum, dt == ZERO_BF16 ? "bf16" : "f16", skew, names[k],
                    (unsigned long long)i, back[i], h[k][i]);
            failures++;
        }
    }
    CK(cudaMemcpy(gout, d.out, n * 2, cudaMemcpyDeviceToHost));
    if (memcmp(gout, hout, n * 2)) {
        fprintf(stderr, "FAIL %s %s skew %d: 16-bit params differ\n", adamw ? "adamw" : "sgd",
                dt == ZERO_BF16 ? "bf16" : "f16", skew);
        failures++;
    }
    printf("bitwise %s momentum %d %s skew %d: %zu chunks, %llu elements: %s\n", adamw ? "adamw" : "sgd", momentum,
           dt == ZERO_BF16 ? "bf16" : "f16", skew, rows, (unsigned long long)n, failures ? "FAIL" : "ok");
    dev_free(&d);
    cudaFree(dc);
    cudaFree(dh);
    for (int k = 0; k < 4; k++) free(h[k]);
    free(back);
    free(hout);
    free(gout);
    free(t);
}

/* ---------------------------------------------------------------- 2. bandwidth */

static int bandwidth(void)
{
    /* GPT-2-124M-like tensors, repeated to 2^27 elements (~3.9 GB of traffic per step). */
    const uint64_t shapes[] = {768 * 2304, 2304, 768 * 768, 768, 768 * 3072, 3072, 3072 * 768, 768, 768, 768};
    uint64_t sizes[1024];
    int nt = 0;
    uint64_t total = 0;
    while (total < (1ull << 27) && nt < 1024) {
        sizes[nt] = shapes[nt % 10];
        total += sizes[nt++];
    }
    size_t rows;
    uint64_t n;
    zero_optim_chunk *t = table(sizes, nt, 0, &rows, &n);
    arrays d;
    dev_alloc(&d, n);
    CK(cudaMemset(d.p, 0, n * 4));
    CK(cudaMemset(d.g, 0, n * 4));
    CK(cudaMemset(d.m, 0, n * 4));
    CK(cudaMemset(d.v, 0, n * 4));
    zero_optim_chunk *dc;
    zero_optim_hyper *dh, hy[3];
    hypers(hy, 3);
    CK(cudaMalloc((void **)&dc, rows * sizeof *dc));
    CK(cudaMalloc((void **)&dh, sizeof hy));
    CK(cudaMemcpy(dc, t, rows * sizeof *dc, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dh, hy, sizeof hy, cudaMemcpyHostToDevice));
    const double traffic = (double)total * 30.0; /* bytes read + written by one fused AdamW step */
    const size_t copy_bytes = (size_t)(traffic / 2.0); /* a copy reads and writes each byte */
    void *src, *dst;
    CK(cudaMalloc(&src, copy_bytes));
    CK(cudaMalloc(&dst, copy_bytes));
    CK(cudaMemset(src, 0, copy_bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t_fused = 0, t_copy = 0;
    const int rounds = 5, iters = 10;
    for (int r = -1; r < rounds; r++) { /* round -1 warms both up */
        float ms;
        CK(cudaEventRecord(e0, 0));
        for (int i = 0; i < iters; i++) CK((cudaError_t)launch(1, 1, ZERO_BF16, &d, dh, dc, rows, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t_fused += ms;
        CK(cudaEventRecord(e0, 0));
        for (int i = 0; i < iters; i++) CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t_copy += ms;
    }
    const double fused_gbs = traffic * rounds * iters / (t_fused * 1e-3) / 1e9;
    const double copy_gbs = 2.0 * (double)copy_bytes * rounds * iters / (t_copy * 1e-3) / 1e9;
    const double ratio = fused_gbs / copy_gbs;
    printf("fused AdamW (bf16 params) over %llu elements in %zu chunks: %.1f GB/s; device-to-device copy of the same "
           "traffic: %.1f GB/s; ratio %.3f (goal >= 0.85)\n",
           (unsigned long long)total, rows, fused_gbs, copy_gbs, ratio);
    /* One line for run_gpu_tests.sh's JSON summary (its "figures"). */
    printf("FIGURES {\"fused_adamw_GBps\": %.1f, \"d2d_copy_GBps\": %.1f, \"ratio\": %.4f, \"elements\": %llu, "
           "\"bytes_per_step\": %.0f, \"bitwise_failures\": %d}\n",
           fused_gbs, copy_gbs, ratio, (unsigned long long)total, traffic, failures);
    dev_free(&d);
    cudaFree(dc);
    cudaFree(dh);
    cudaFree(src);
    cudaFree(dst);
    free(t);
    return ratio >= 0.85;
}

int main(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    for (int skew = 0; skew < 2; skew++) {
        check_bitwise(1, 1, ZERO_BF16, skew);
        check_bitwise(1, 1, ZERO_F16, skew);
        check_bitwise(0, 1, ZERO_BF16, skew);
        check_bitwise(0, 0, ZERO_F16, skew);
    }
    int fast = bandwidth();
    if (!fast) fprintf(stderr, "FAIL: fused AdamW below 85%% of the device-to-device copy's bandwidth\n");
    return failures || !fast ? 1 : 0;
}
