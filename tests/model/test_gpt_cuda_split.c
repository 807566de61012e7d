/* The CUDA GPT's backward split into B and W (gpt_cuda.h, for zero-bubble
 * pipeline schedules) against its unsplit backward, on a GPU; skips (77)
 * without one or in a build without CUDA (tests/gpu/run_gpu_tests.sh runs it).
 *
 * 2 blocks, 4 heads, d_model 64, seq 40, batch 3, vocab 256; GPT-2's init.
 * One unsplit pass; one pass whose blocks run B (gpt_cuda_backward_block_input)
 * in the backward and their W (gpt_cuda_backward_block_weight) after the
 * embedding's backward, in ascending block order. Asserted, for fp32
 * parameters with fp32 matmuls and for bf16 parameters with bf16 matmuls
 * (fp32 activations), and in the bf16 activation mode (flash attention,
 * cuBLASLt epilogues) with fp32 and with bf16 parameters, whose W stash
 * holds the bf16 upstream gradients (half the bytes):
 *  - every linear layer's weight gradient BITWISE equal: the same gemm on the
 *    same operands (the upstream gradient chain has no atomics; in the bf16
 *    mode the same cuBLASLt call with the same descriptors, bias-gradient
 *    epilogue included, in B+W as in the unsplit backward);
 *  - every other gradient (biases, LayerNorms, embeddings: fp32 atomics, whose
 *    order varies run to run) within 1e-5 x max |tensor|, plus one bf16 rounding
 *    step (2^-7 |value|) with bf16 gradients, where an atomic-order difference
 *    can round the other way;
 *  - misuse named: a forward while a W is due (ZERO_INVALID_STATE), a W
 *    without its B, the split on a workspace that recomputes blocks
 *    (ZERO_UNSUPPORTED). */
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

/* One pass (split or not); the gradients as fp32 on the host. */
static int run(const gpt_config *cfg, const float *params, size_t total, zero_dtype dt, const gpt_cuda_options *o,
               int split, const int32_t *tok, const int32_t *tgt, float *grads)
{
    gpt_tensors p[L_ + 2], g[L_ + 2];
    gpt_test_dev dev;
    if (gpt_test_dev_init(&dev, cfg, params, total, dt, p, g) != 0) return -1;
    gpt_cuda_workspace *ws = NULL;
    zero_status st = gpt_cuda_workspace_create_opts(&ws, cfg, B_, T_, dt, o, NULL, NULL);
    const size_t act = o->act_dtype == ZERO_BF16 ? 2 : sizeof(float);
    const int fm = gpt_module_final(cfg);
    if (st == ZERO_OK && split) {
        st = gpt_cuda_workspace_split_backward(ws);
        CHECK(st != ZERO_OK || gpt_cuda_workspace_wstash_bytes(ws) == act * L_ * B_ * T_ * 9 * 64);
    }
    if (st == ZERO_OK) st = gpt_cuda_forward(ws, tok, tgt, p, NULL);
    if (st == ZERO_OK && !split) st = gpt_cuda_backward(ws, 1.0f, p, g);
    if (st == ZERO_OK && split) {
        st = gpt_cuda_backward_end(ws, 1.0f, &p[fm], &g[fm], &p[GPT_MODULE_EMBED], &g[GPT_MODULE_EMBED]);
        for (int l = L_ - 1; l >= 0 && st == ZERO_OK; l--)
            st = gpt_cuda_backward_block_input(ws, l, &p[gpt_module_block(l)], &g[gpt_module_block(l)]);
        if (st == ZERO_OK) st = gpt_cuda_backward_begin(ws, &g[GPT_MODULE_EMBED]);
        /* W is due: a forward would overwrite what it reads */
        if (st == ZERO_OK) {
            CHECK(gpt_cuda_forward(ws, tok, tgt, p, NULL) == ZERO_INVALID_STATE &&
                  strstr(gpt_last_error(), "block 0's weight gradients (W) are still due"));
        }
        for (int l = 0; l < L_ && st == ZERO_OK; l++) st = gpt_cuda_backward_block_weight(ws, l, &g[gpt_module_block(l)]);
        if (st == ZERO_OK) {
            CHECK(gpt_cuda_backward_block_weight(ws, 0, &g[gpt_module_block(0)]) == ZERO_INVALID_STATE &&
                  strstr(gpt_last_error(), "block 0 has no B waiting for its W"));
        }
    }
    CHECK_MSG(st == ZERO_OK, "%s pass: %s", split ? "split" : "unsplit", gpt_last_error());
    gpt_test_dev_grads(&dev, grads);
    gpt_cuda_workspace_destroy(ws);
    gpt_test_dev_free(&dev);
    return st == ZERO_OK ? 0 : -1;
}

static void compare(const gpt_config *cfg, const char *mode, const float *split, const float *whole, double rel)
{
    int bitwise = gpt_test_compare_grads(cfg, mode, "B then W is not bitwise the unsplit backward", split, whole, rel);
    printf("%s: %d weight gradients bitwise, the rest within 1e-5 x max\n", mode, bitwise);
}
#endif

int main(void)
{
    if (!gpt_cuda_available()) CHECK_SKIP("no CUDA GPU visible (or this build has no CUDA path)");
#if ZERO_HAVE_CUDA
    gpt_small s; /* one micro-batch */
    if (gpt_small_init(&s, 1) != 0) return check_exit();
    const struct { zero_dtype dt; gpt_cuda_options o; const char *name; } modes[] = {
        {ZERO_F32, {GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_UNFUSED}, "fp32 params, fp32 math"},
        {ZERO_BF16, {GPT_CUDA_MATH_BF16, ZERO_F32, GPT_CUDA_ATTN_UNFUSED}, "bf16 params, bf16 math"},
        {ZERO_F32, GPT_CUDA_OPTIONS_BF16, "fp32 params, bf16 activations"},
        {ZERO_BF16, GPT_CUDA_OPTIONS_BF16, "bf16 params, bf16 activations"},
    };
    for (int k = 0; k < 4; k++)
        if (run(&s.cfg, s.params, s.total, modes[k].dt, &modes[k].o, 0, s.tok, s.tgt, s.gref) == 0 &&
            run(&s.cfg, s.params, s.total, modes[k].dt, &modes[k].o, 1, s.tok, s.tgt, s.gtest) == 0)
            compare(&s.cfg, modes[k].name, s.gtest, s.gref, modes[k].dt == ZERO_BF16 ? 1.0 / 128 : 0.0);
    /* the split needs the activations kept */
    gpt_checkpointing ck = {1, 0, 0};
    gpt_cuda_workspace *ws = NULL;
    CHECK_OK(gpt_cuda_workspace_create_ckpt(&ws, &s.cfg, B_, T_, ZERO_F32, GPT_CUDA_MATH_FP32, NULL, &ck));
    CHECK(gpt_cuda_workspace_split_backward(ws) == ZERO_UNSUPPORTED &&
          strstr(gpt_last_error(), "block 0 is recomputed"));
    gpt_cuda_workspace_destroy(ws);
    gpt_small_free(&s);
#endif
    return check_exit();
}
