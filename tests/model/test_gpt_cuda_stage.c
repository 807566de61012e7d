/* The CUDA GPT's pipeline-stage workspaces (gpt_cuda.h,
 * gpt_cuda_workspace_create_stage: a block range with activation slots)
 * against the whole-model workspace, on a GPU; skips (77) without one or in
 * a build without CUDA (tests/gpu/run_gpu_tests.sh runs the suite 'gpu').
 *
 * 2 blocks, 4 heads, d_model 64, seq 40, batch 3, vocab 256; GPT-2's init;
 * two micro-batches A and B. Reference: one whole-model workspace, forward
 * and backward of A, then of B, gradients accumulated. Stages: blocks [0, 1)
 * and [1, 2), two slots each, in a pipeline's order with both micro-batches
 * in flight: F(A) F(B) on the first, F(A) F(B) on the second (the head),
 * B+W(A) and B(B) there (slot 1's W left due), B+W(A), B+W(B) on the first,
 * then slot 1's W on the second; activations and gradients move through
 * device buffers. Asserted for fp32 params / fp32 math and bf16 / bf16:
 *  - both losses BITWISE the reference's (the same kernels on the same inputs);
 *  - every linear layer's weight gradient BITWISE (the same gemms, the
 *    micro-batches accumulated in the same order);
 *  - every other gradient within 1e-5 x max |tensor| (+ one bf16 rounding
 *    step with bf16 gradients): bias / LayerNorm / embedding reductions use
 *    atomics, and wte's head and embedding parts accumulate in another order;
 *  - misuse named: the embedding's forward on a stage that does not start at
 *    block 0, an output-gradient backward on the head stage, a forward into a
 *    slot whose W is due (naming the slot), a slot out of range. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt.h"
#include "gpt_cuda.h"
#include "gpt_cuda_small.h"
#include "gpt_test_params.h"
#include "zero_build_config.h"
#include <zero/device.h>

#if ZERO_HAVE_CUDA
#include <cuda_runtime_api.h>

enum { L_ = GPT_SMALL_L, B_ = GPT_SMALL_B, T_ = GPT_SMALL_T }; /* gpt_cuda_small.h's model */
#define N_ (B_ * T_)

#define STEP(call)                                                                                                \
    do {                                                                                                          \
        if (st == ZERO_OK && (st = (call)) != ZERO_OK) fprintf(stderr, "%s: %s\n", #call, gpt_last_error());      \
    } while (0)

/* staged = 0: the whole-model reference; 1: the two stages. Gradients to
 * the host as fp32, the two losses to loss[2]. */
static int run(const gpt_config *cfg, const float *params, size_t total, zero_dtype dt, gpt_cuda_math math, int staged,
               const int32_t *tok, const int32_t *tgt, float *grads, float *loss)
{
    float *out = NULL, *din = NULL; /* [2] x N x C: what the stages send each other */
    gpt_tensors p[L_ + 2], g[L_ + 2];
    gpt_test_dev dev;
    const size_t msg = (size_t)N_ * cfg->d_model;
    if (gpt_test_dev_init(&dev, cfg, params, total, dt, p, g) != 0) return -1;
    if (cudaMalloc((void **)&out, 2 * msg * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&din, 2 * msg * sizeof(float)) != cudaSuccess) {
        cudaFree(out), gpt_test_dev_free(&dev);
        return -1;
    }
    const int fm = gpt_module_final(cfg), E = GPT_MODULE_EMBED;
    zero_status st = ZERO_OK;
    if (!staged) {
        gpt_cuda_workspace *ws = NULL;
        STEP(gpt_cuda_workspace_create(&ws, cfg, B_, T_, dt, math, NULL));
        for (int m = 0; m < 2; m++) {
            STEP(gpt_cuda_forward(ws, tok + m * N_, tgt + m * N_, p, &loss[m]));
            STEP(gpt_cuda_backward(ws, 1.0f, p, g));
        }
        gpt_cuda_workspace_destroy(ws);
    } else {
        const gpt_cuda_options o = {math, ZERO_F32, GPT_CUDA_ATTN_UNFUSED};
        gpt_cuda_workspace *s0 = NULL, *s1 = NULL;
        STEP(gpt_cuda_workspace_create_stage(&s0, cfg, B_, T_, dt, &o, NULL, NULL, 0, 1, 2));
        STEP(gpt_cuda_workspace_create_stage(&s1, cfg, B_, T_, dt, &o, NULL, NULL, 1, 2, 2));
        STEP(gpt_cuda_workspace_split_backward(s1));
        if (st == ZERO_OK) {
            int b, e;
            gpt_cuda_workspace_range(s1, &b, &e);
            CHECK(b == 1 && e == 2 && gpt_cuda_workspace_slots(s1) == 2 && !gpt_cuda_workspace_output(s1, 2));
            CHECK(gpt_cuda_workspace_select_slot(s1, 2) == ZERO_INVALID_ARGUMENT);
            CHECK(gpt_cuda_forward_begin(s1, tok, tgt, &p[E]) == ZERO_INVALID_STATE &&
                  strstr(gpt_last_error(), "not the embedding"));
        }
        /* first stage: F(A) into slot 0, F(B) into slot 1 */
        for (int m = 0; m < 2; m++) {
            STEP(gpt_cuda_workspace_select_slot(s0, m));
            STEP(gpt_cuda_forward_begin(s0, tok + m * N_, NULL, &p[E]));
            STEP(gpt_cuda_forward_block(s0, 0, &p[gpt_module_block(0)]));
            if (st == ZERO_OK)
                cudaMemcpy(out + m * msg, gpt_cuda_workspace_output(s0, m), msg * sizeof(float),
                           cudaMemcpyDeviceToDevice);
        }
        /* head stage: F(A), F(B) */
        for (int m = 0; m < 2; m++) {
            STEP(gpt_cuda_workspace_select_slot(s1, m));
            STEP(gpt_cuda_forward_begin_input(s1, out + m * msg, tgt + m * N_));
            STEP(gpt_cuda_forward_block(s1, 1, &p[gpt_module_block(1)]));
            STEP(gpt_cuda_forward_end(s1, &p[fm], &p[E], &loss[m]));
        }
        if (st == ZERO_OK)
            CHECK(gpt_cuda_backward_end_output(s1, din) == ZERO_INVALID_STATE &&
                  strstr(gpt_last_error(), "ends with the head"));
        /* head stage: B+W(A), B(B) with its W left due */
        for (int m = 0; m < 2; m++) {
            STEP(gpt_cuda_workspace_select_slot(s1, m));
            STEP(gpt_cuda_backward_end(s1, 1.0f, &p[fm], &g[fm], &p[E], &g[E]));
            if (m == 0) STEP(gpt_cuda_backward_block(s1, 1, &p[gpt_module_block(1)], &g[gpt_module_block(1)]));
            else STEP(gpt_cuda_backward_block_input(s1, 1, &p[gpt_module_block(1)], &g[gpt_module_block(1)]));
            STEP(gpt_cuda_backward_begin_input(s1, din + m * msg));
        }
        if (st == ZERO_OK)
            CHECK(gpt_cuda_forward_begin_input(s1, out, tgt) == ZERO_INVALID_STATE &&
                  strstr(gpt_last_error(), "still due (slot 1)"));
        /* first stage: B+W(A), B+W(B) from the received gradients */
        for (int m = 0; m < 2; m++) {
            STEP(gpt_cuda_workspace_select_slot(s0, m));
            STEP(gpt_cuda_backward_end_output(s0, din + m * msg));
            STEP(gpt_cuda_backward_block(s0, 0, &p[gpt_module_block(0)], &g[gpt_module_block(0)]));
            STEP(gpt_cuda_backward_begin(s0, &g[E]));
        }
        /* the head stage's due W of slot 1 */
        STEP(gpt_cuda_workspace_select_slot(s1, 1));
        STEP(gpt_cuda_backward_block_weight(s1, 1, &g[gpt_module_block(1)]));
        gpt_cuda_workspace_destroy(s0);
        gpt_cuda_workspace_destroy(s1);
    }
    CHECK_MSG(st == ZERO_OK, "%s: %s", staged ? "stages" : "whole model", gpt_last_error());
    gpt_test_dev_grads(&dev, grads);
    cudaFree(out), cudaFree(din), gpt_test_dev_free(&dev);
    return st == ZERO_OK ? 0 : -1;
}

static void compare(const gpt_config *cfg, const char *mode, const float *staged, const float *whole, double rel)
{
    int bitwise = gpt_test_compare_grads(cfg, mode, "the stages' gradient is not bitwise the whole model's", staged,
                                         whole, rel);
    printf("%s: losses bitwise, %d weight gradients bitwise, the rest within 1e-5 x max\n", mode, bitwise);
}
#endif

int main(void)
{
    if (!gpt_cuda_available()) CHECK_SKIP("no CUDA GPU visible (or this build has no CUDA path)");
#if ZERO_HAVE_CUDA
    gpt_small s; /* micro-batches A and B */
    if (gpt_small_init(&s, 2) != 0) return check_exit();
    const struct { zero_dtype dt; gpt_cuda_math math; const char *name; } modes[] = {
        {ZERO_F32, GPT_CUDA_MATH_FP32, "fp32 params, fp32 math"},
        {ZERO_BF16, GPT_CUDA_MATH_BF16, "bf16 params, bf16 math"},
    };
    for (int k = 0; k < 2; k++) {
        float lw[2] = {0, 0}, ls[2] = {0, 0};
        if (run(&s.cfg, s.params, s.total, modes[k].dt, modes[k].math, 0, s.tok, s.tgt, s.gref, lw) == 0 &&
            run(&s.cfg, s.params, s.total, modes[k].dt, modes[k].math, 1, s.tok, s.tgt, s.gtest, ls) == 0) {
            CHECK_MSG(memcmp(lw, ls, sizeof lw) == 0, "%s: losses %.9g %.9g (stages) vs %.9g %.9g (whole model)",
                      modes[k].name, ls[0], ls[1], lw[0], lw[1]);
            compare(&s.cfg, modes[k].name, s.gtest, s.gref, modes[k].dt == ZERO_BF16 ? 1.0 / 128 : 0.0);
        }
    }
    gpt_small_free(&s);
#endif
    return check_exit();
}
