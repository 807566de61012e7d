/* GPT step time and MFU on a GPU (a figure for tests/gpu/run_gpu_tests.sh,
 * not a CI test): forward + backward of a GPT-2-124M-shaped model (12
 * layers, d_model 768, 12 heads, seq 1024, vocab 50304: GPT-2's 50257 padded
 * to a multiple of 128 as llm.c does, so the head's bf16 rows stay aligned
 * for the tensor cores) in the bf16
 * activation mode (GPT_CUDA_OPTIONS_BF16), bf16 parameters and gradients as
 * zero-train's bf16 hands them out, no optimizer step.
 *
 *   gpt_cuda_bench [batch] [iters] [fp32]   (defaults 8, 10; "fp32": the fp32-activation,
 *                                            unfused-attention mode instead)
 *
 * MFU = flops/token x tokens/s / 989e12: flops/token from
 * gpt_train_flops_per_token (6 x matmul params incl. the tied head + 12 L T
 * d_model for attention, the PaLM convention: no causal discount), 989
 * TFLOP/s the H100/H200 SXM dense bf16 tensor-core peak (NVIDIA H200
 * product brief / H100 datasheet: 1979 TFLOP/s "with sparsity", half of it
 * dense). Prints a line "FIGURES {json}" for the GPU script's summary.
 * Exit 77 without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt.h"
#include "gpt_cuda.h"

#include <cuda_runtime_api.h>

#define PEAK_BF16 989e12

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int B = argc > 1 ? atoi(argv[1]) : 8, iters = argc > 2 ? atoi(argv[2]) : 10;
    int fp32 = argc > 3 && strcmp(argv[3], "fp32") == 0;
    if (!gpt_cuda_available()) {
        printf("SKIP: no CUDA GPU visible\n");
        return 77;
    }
    gpt_config cfg = {.n_layer = 12, .n_head = 12, .d_model = 768, .seq_len = 1024, .vocab = 50304};
    const int T = cfg.seq_len, L = cfg.n_layer, nm = gpt_num_modules(&cfg);
    size_t total = gpt_param_elements(&cfg);
    uint16_t *host = malloc(total * 2);
    uint64_t r = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < total; i++) { /* small uniform weights as bf16 (the values do not matter for timing) */
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        float v = ((float)(r >> 40) / 16777216.0f - 0.5f) * 0.04f;
        uint32_t u;
        memcpy(&u, &v, 4);
        host[i] = (uint16_t)(u >> 16);
    }
    void *dp = NULL, *dg = NULL;
    if (cudaMalloc(&dp, total * 2) != cudaSuccess || cudaMalloc(&dg, total * 2) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc of %zu parameters failed\n", total);
        return 1;
    }
    cudaMemcpy(dp, host, total * 2, cudaMemcpyHostToDevice);
    cudaMemset(dg, 0, total * 2);
    gpt_tensors *p = calloc((size_t)nm, sizeof *p), *g = calloc((size_t)nm, sizeof *g);
    size_t off = 0;
    for (size_t i = 0; i < gpt_num_params(&cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(&cfg, i, &info);
        p[info.module].t[info.index] = (char *)dp + off * 2;
        g[info.module].t[info.index] = (char *)dg + off * 2;
        off += info.numel;
    }
    gpt_cuda_options o = GPT_CUDA_OPTIONS_BF16;
    if (fp32) o.act_dtype = ZERO_F32, o.attention = GPT_CUDA_ATTN_UNFUSED;
    gpt_cuda_workspace *ws = NULL;
    if (gpt_cuda_workspace_create_opts(&ws, &cfg, B, T, ZERO_BF16, &o, NULL, NULL) != ZERO_OK) {
        fprintf(stderr, "workspace: %s\n", gpt_last_error());
        return 1;
    }
    int32_t *tok = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 7919u) % (unsigned)cfg.vocab), tgt[i] = (int32_t)((i * 104729u + 1) % (unsigned)cfg.vocab);
    float loss = 0, first = 0;
    double t0 = 0;
    for (int it = 0; it < iters + 3; it++) { /* 3 warm-up steps (cuBLASLt heuristics, first launches) */
        if (it == 3) {
            cudaDeviceSynchronize();
            t0 = now_s();
        }
        if (gpt_cuda_forward(ws, tok, tgt, p, &loss) != ZERO_OK || gpt_cuda_backward(ws, 1.0f, p, g) != ZERO_OK) {
            fprintf(stderr, "step %d: %s\n", it, gpt_last_error());
            return 1;
        }
        if (it == 0) first = loss;
    }
    cudaError_t e = cudaDeviceSynchronize();
    double dt = (now_s() - t0) / iters;
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
        return 1;
    }
    double tps = (double)B * T / dt, fpt = gpt_train_flops_per_token(&cfg, T), mfu = fpt * tps / PEAK_BF16;
    gpt_activation_bytes ab;
    gpt_cuda_workspace_activation_bytes(ws, &ab);
    printf("GPT-2 124M shape (L %d, d 768, 12 heads, T %d, V %d), batch %d, %s: %.2f ms/step, %.0f tokens/s, "
           "%.3g GFLOP/token, MFU %.1f%% of 989 TFLOP/s; loss %.4f (first %.4f); activations %.2f GB\n",
           L, T, cfg.vocab, B, fp32 ? "fp32 activations, unfused attention" : "bf16 activations, flash attention",
           dt * 1e3, tps, fpt / 1e9, 100 * mfu, loss, first, ab.total / 1e9);
    printf("FIGURES {\"mode\": \"%s\", \"batch\": %d, \"seq\": %d, \"step_ms\": %.3f, \"tokens_per_s\": %.1f, "
           "\"flops_per_token\": %.6g, \"flops_convention\": \"6N + 12 L T d (PaLM, attention without causal discount)\", "
           "\"peak_flops\": 989e12, \"mfu\": %.4f, \"activation_bytes\": %zu}\n",
           fp32 ? "fp32_acts_unfused" : "bf16_acts_flash", B, T, dt * 1e3, tps, fpt, mfu, ab.total);
    gpt_cuda_workspace_destroy(ws);
    cudaFree(dp), cudaFree(dg);
    free(host), free(p), free(g), free(tok), free(tgt);
    return 0;
}
