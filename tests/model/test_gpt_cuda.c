/* The CUDA GPT against the CPU GPT (the reference), on a GPU; skips (77)
 * without one or in a build without CUDA.
 *
 * Config: 2 layers, 4 heads, d_model 64, seq 40 (> 32, so every warp loop
 * wraps), batch 3, vocab 256, one ignored target. Weights: uniform +-0.1,
 * LayerNorm weights 1 +- 0.1 (every gradient path carries signal).
 *
 * Tolerances, per tensor (scale = max |CPU value| of that tensor):
 *  1. fp32 matmuls, fp32 params: |gpu - cpu| <= 1e-4 * scale + 1e-3 * |cpu|;
 *     loss within 1e-5 relative. Both sides are fp32; only summation order
 *     (atomics, cuBLAS blocking) and expf differ (~1e-6 relative).
 *  2. bf16 matmuls (the training mode), fp32 params: relative L2 error
 *     ||gpu - cpu|| / ||cpu|| <= 3e-2 for logits and every gradient; loss
 *     within 1e-2 absolute. bf16 keeps 8 significant bits, so each gemm input
 *     is off by up to 2^-9 relative. Measured by emulation on the CPU (this
 *     model with every sgemm input rounded to bf16, 3 seeds, this config):
 *     logits 5e-3, worst gradient 1.0e-2 (ln_1.bias of block 0, at the end of
 *     the longest chain of matmuls), loss 4e-4: the bounds leave 3x.
 *  3. bf16 params and grads, bf16 matmuls: as 2 with 4e-2 (the gradient is
 *     rounded to bf16 once more, 2^-9), against a CPU run on the same
 *     bf16-rounded weights.
 *  4. flash attention, fp32 math and activations: as 1 against the CPU, and
 *     against the GPU's unfused attention elementwise within 1e-4 * scale +
 *     1e-4 * |x| (both fp32; they differ in the order of the softmax sums and
 *     in the atomics of the other kernels' backward: ~1e-6 relative).
 *  5. bf16 activations (GPT_CUDA_OPTIONS_BF16: bf16 storage of every matmul
 *     input/output, cuBLASLt epilogues, flash attention): relative L2 error
 *     <= 3e-2 for logits and every gradient, loss within 1e-2, with fp32 and
 *     with bf16 params (the latter against the CPU on the same bf16 weights,
 *     gradients rounded to bf16 once more). Measured by emulation on the CPU
 *     (benchmarks/gpu/emulate_bf16_acts.py: PyTorch with each stored
 *     activation rounded to bf16 where the mode stores it and each activation
 *     gradient where it is written, sums in fp32; this config, 5 seeds):
 *     worst 1.0e-2 (fp32 params; ln_1.weight of block 1), 7.6e-3 (bf16
 *     params), loss 4e-4: the bounds leave 3x. A wrong epilogue (GELU
 *     missing, a bias not added, a bias gradient dropped) moves a tensor by
 *     O(1). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt.h"
#include "gpt_cuda.h"
#include "gpt_test_params.h"
#include "zero_build_config.h"
#include <zero/device.h>

#if ZERO_HAVE_CUDA
#include <cuda_runtime_api.h>

#define L_ 2
#define NH_ 4
#define C_ 64
#define T_ 40
#define B_ 3
#define V_ 256

static uint64_t rng = 88172645463325252ull;
static float uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* |gpu - cpu| <= 1e-4 max|cpu| + tol |cpu| elementwise; or rel-L2 <= tol when l2 (gpt_test_diff_of) */
static void compare(const char *what, const float *gpu, const float *cpu, size_t n, int l2, double tol)
{
    const gpt_test_diff r = gpt_test_diff_of(gpu, cpu, n, 1e-4, tol);
    if (l2) CHECK_MSG(r.l2 <= tol, "%s: relative L2 error %.3g > %.3g", what, r.l2, tol);
    else CHECK_MSG(r.outside == 0, "%s: %zu of %zu elements outside tolerance (max abs err %.3g, scale %.3g)", what,
                   r.outside, n, r.worst, r.scale);
    printf("  %-28s max abs err %.3g (scale %.3g), rel L2 %.3g\n", what, r.worst, r.scale, r.l2);
}

static float bf16_round(float x) { return zero_bf16_to_f32(zero_f32_to_bf16(x)); }

/* One GPU run; returns its loss, logits and grads (fp32 on the host). */
static gpt_cuda_options opt(gpt_cuda_math math, zero_dtype act, gpt_cuda_attention att)
{
    gpt_cuda_options o = {math, act, att};
    return o;
}

static int gpu_run(const gpt_config *cfg, const float *params, size_t total, zero_dtype dt, gpt_cuda_options o,
                   const gpt_checkpointing *ck, const int32_t *tok, const int32_t *tgt, float *loss, float *logits,
                   float *grads)
{
    gpt_tensors p[L_ + 2], g[L_ + 2];
    gpt_test_dev dev;
    if (gpt_test_dev_init(&dev, cfg, params, total, dt, p, g) != 0) return -1;
    gpt_cuda_workspace *ws = NULL;
    CHECK_OK(gpt_cuda_workspace_create_opts(&ws, cfg, B_, T_, dt, &o, NULL, ck));
    if (!ws) {
        fprintf(stderr, "%s\n", gpt_last_error());
        gpt_test_dev_free(&dev);
        return -1;
    }
    gpt_activation_bytes got, want;
    gpt_cuda_workspace_activation_bytes(ws, &got);
    CHECK_OK(gpt_cuda_activation_bytes_for_opts(cfg, B_, T_, dt, &o, ck, &want));
    CHECK(memcmp(&got, &want, sizeof got) == 0 && got.total == gpt_cuda_workspace_bytes(ws));
    zero_status st = gpt_cuda_forward(ws, tok, tgt, p, loss);
    if (st == ZERO_OK) st = gpt_cuda_backward(ws, 1.0f, p, g);
    if (st == ZERO_OK) st = gpt_cuda_workspace_logits(ws, logits);
    CHECK_MSG(st == ZERO_OK, "cuda pass: %s", gpt_last_error());
    gpt_test_dev_grads(&dev, grads);
    gpt_cuda_workspace_destroy(ws);
    gpt_test_dev_free(&dev);
    return st == ZERO_OK ? 0 : -1;
}

static void cpu_run(const gpt_config *cfg, float *params, size_t total, const int32_t *tok, const int32_t *tgt,
                    float *loss, float *logits, float *grads)
{
    gpt_tensors p[L_ + 2], g[L_ + 2];
    memset(p, 0, sizeof p), memset(g, 0, sizeof g);
    memset(grads, 0, total * sizeof(float));
    gpt_test_layout(cfg, params, 4, p);
    gpt_test_layout(cfg, grads, 4, g);
    gpt_workspace *ws = NULL;
    CHECK_OK(gpt_workspace_create(&ws, cfg, B_, T_));
    CHECK_OK(gpt_forward(ws, tok, tgt, p, loss));
    CHECK_OK(gpt_backward(ws, 1.0f, p, g));
    memcpy(logits, gpt_workspace_logits(ws), sizeof(float) * B_ * T_ * V_);
    gpt_workspace_destroy(ws);
}

static void compare_all(const gpt_config *cfg, const char *mode, const float *lg, const float *lc, const float *gg,
                        const float *gc, int l2, double tol)
{
    printf("%s:\n", mode);
    compare("logits", lg, lc, (size_t)B_ * T_ * V_, l2, tol);
    size_t off = 0;
    for (size_t i = 0; i < gpt_num_params(cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(cfg, i, &info);
        char what[80];
        snprintf(what, sizeof what, "grad %s", info.name);
        compare(what, gg + off, gc + off, info.numel, l2, tol);
        off += info.numel;
    }
}

/* docs/model.md's formula for the CUDA workspace, written out here: every
 * buffer rounded up to 256 bytes. Needs no GPU (gpt_cuda_activation_bytes_for
 * only counts), so it runs in every CUDA build. */
static size_t r256(size_t x) { return (x + 255) / 256 * 256; }

static void check_cuda_bytes(void)
{
    const gpt_config cfg = {.n_layer = 3, .n_head = 4, .d_model = 48, .seq_len = 24, .vocab = 101};
    const size_t B = 2, T = 13, N = B * T, C = 48, V = 101, NH = 4, L = 3;
    const size_t set = 4 * r256(4 * N * C) + 4 * r256(4 * N) + r256(12 * N * C) + r256(4 * B * NH * T * T) +
                       2 * r256(16 * N * C);
    for (int dt = 0; dt < 2; dt++)
        for (int R = 0; R <= 4; R++)
            for (int off = 0; off < 2; off++) {
                zero_dtype d = dt ? ZERO_BF16 : ZERO_F32;
                size_t rec = (size_t)(R < 3 ? R : 3), offl = off && rec;
                size_t inputs = (L + 1 - (offl ? rec : 0)) * r256(4 * N * C) + (offl ? 2 * r256(4 * N * C) : 0);
                size_t head = 2 * r256(4 * N) + r256(4 * N * C) + 3 * r256(4 * N) + r256(4 * N * V);
                size_t scratch = 2 * r256(4 * N * C) + r256(12 * N * C) + r256(16 * N * C) + r256(4 * N * V) +
                                 r256(4 * N) + 8 * r256(4 * N * C) + r256(4 * B * NH * T * T);
                if (d == ZERO_BF16) {
                    size_t e = V * C + 24 * C, m = 12 * C * C + 13 * C; /* embed; a block (> final) */
                    scratch += 2 * r256(4 * e) + 2 * r256(4 * m);
                }
                size_t total = inputs + (L - rec) * set + (rec ? set : 0) + head + scratch;
                gpt_checkpointing ck = {R == 4 ? GPT_CHECKPOINT_ALL : R, off, 0};
                gpt_activation_bytes b;
                CHECK_OK(gpt_cuda_activation_bytes_for(&cfg, (int)B, (int)T, d, &ck, &b));
                CHECK_MSG(b.total == total && b.host == (offl ? rec * r256(4 * N * C) : 0) && b.inputs == inputs &&
                              b.blocks == (L - rec) * set && b.recompute == (rec ? set : 0) && b.head == head &&
                              b.scratch == scratch,
                          "cuda bytes (%s, %d recomputed, offload %d): %zu, formula %zu", zero_dtype_name(d), R, off,
                          b.total, total);
            }
}

/* The same for bf16 activations with flash attention (layout act_elem 2):
 * the matmul-facing buffers at 2 bytes, att_lse (B NH T floats) in place of
 * the T x T probabilities, no unfused-attention scratch; D (B NH T), dres16
 * (2NC) and the bias-gradient vector (4C floats) added; bf16 copies of the
 * embed and a block module for fp32 parameters. */
static void check_cuda_bytes_bf16_acts(void)
{
    const gpt_config cfg = {.n_layer = 3, .n_head = 4, .d_model = 48, .seq_len = 24, .vocab = 101};
    const size_t B = 2, T = 13, N = B * T, C = 48, V = 101, NH = 4, L = 3;
    const size_t set = r256(2 * N * C) + 4 * r256(4 * N) + r256(6 * N * C) + r256(4 * B * NH * T) +
                       r256(2 * N * C) + r256(4 * N * C) + r256(2 * N * C) + 2 * r256(8 * N * C);
    const gpt_cuda_options o = GPT_CUDA_OPTIONS_BF16;
    for (int dt = 0; dt < 2; dt++)
        for (int R = 0; R <= 4; R++) {
            zero_dtype d = dt ? ZERO_BF16 : ZERO_F32;
            size_t rec = (size_t)(R < 3 ? R : 3);
            size_t inputs = (L + 1) * r256(4 * N * C);
            size_t head = 2 * r256(4 * N) + r256(2 * N * C) + 3 * r256(4 * N) + r256(4 * N * V);
            size_t scratch = r256(4 * N * C) + r256(2 * N * C) + r256(6 * N * C) + r256(8 * N * C) + r256(2 * N * V) +
                             r256(4 * N) + r256(4 * B * NH * T) + r256(2 * N * C) + r256(16 * C);
            size_t e = V * C + 24 * C, m = 12 * C * C + 13 * C; /* embed; a block (> final) */
            scratch += d == ZERO_BF16 ? 2 * r256(4 * e) + 2 * r256(4 * m) : r256(2 * e) + r256(2 * m);
            size_t total = inputs + (L - rec) * set + (rec ? set : 0) + head + scratch;
            gpt_checkpointing ck = {R == 4 ? GPT_CHECKPOINT_ALL : R, 0, 0};
            gpt_activation_bytes b;
            CHECK_OK(gpt_cuda_activation_bytes_for_opts(&cfg, (int)B, (int)T, d, &o, &ck, &b));
            CHECK_MSG(b.total == total && b.inputs == inputs && b.blocks == (L - rec) * set &&
                          b.recompute == (rec ? set : 0) && b.head == head && b.scratch == scratch,
                      "cuda bytes, bf16 activations (%s params, %d recomputed): %zu, formula %zu", zero_dtype_name(d), R,
                      b.total, total);
        }
}

/* A tensor-parallel stage's report (gpt_cuda_activation_bytes_stage, the
 * workspaces of gpt_cuda_workspace_create_tp): docs/model.md's formula at tp
 * P = 2 (Cl = C/P channels, NHl = NH/P heads, Hl = 4C/P MLP units in the
 * column-parallel buffers and the attention scratch; the bf16 staging sized
 * by the SHARD of a block module, tp_params.c's layout; with bf16
 * activations r(4NC) more scratch: the fp32 input gradient summed over tp),
 * for stages with and without the embedding and the head, 1 to 3 slots,
 * both activation modes and parameter dtypes. P = 1 is check_cuda_bytes. */
static void check_cuda_bytes_tp(void)
{
    const gpt_config cfg = {.n_layer = 3, .n_head = 4, .d_model = 48, .seq_len = 24, .vocab = 101};
    const size_t B = 2, T = 13, N = B * T, C = 48, V = 101, P = 2, Cl = C / P, Hl = 4 * C / P, NHl = 4 / P;
    const size_t e = V * C + 24 * C, m = 4 * C + 3 * Cl * C + 3 * Cl + C * Cl + C + Hl * C + Hl + C * Hl + C;
    const int ranges[][3] = {{0, 3, 1}, {1, 3, 2}, {0, 2, 3}};
    const gpt_cuda_options fp32 = {GPT_CUDA_MATH_BF16, ZERO_F32, GPT_CUDA_ATTN_UNFUSED}, bf16 = GPT_CUDA_OPTIONS_BF16;
    for (int acts = 0; acts < 2; acts++)
        for (int dt = 0; dt < 2; dt++)
            for (int k = 0; k < 3; k++) {
                const zero_dtype d = dt ? ZERO_BF16 : ZERO_F32;
                const size_t L = (size_t)(ranges[k][1] - ranges[k][0]), S = (size_t)ranges[k][2];
                const int head = ranges[k][1] == 3;
                size_t set, scratch, headb;
                if (!acts) {
                    set = 3 * r256(4 * N * C) + r256(4 * N * Cl) + 4 * r256(4 * N) + r256(12 * N * Cl) +
                          r256(4 * B * NHl * T * T) + 2 * r256(4 * N * Hl);
                    scratch = 2 * r256(4 * N * C) + r256(12 * N * Cl) + r256(4 * N * Hl) + (head ? r256(4 * N * V) : 0) +
                              r256(4 * N) + 8 * r256(4 * N * Cl) + r256(4 * B * NHl * T * T);
                    if (d == ZERO_BF16) scratch += 2 * r256(4 * e) + 2 * r256(4 * m);
                    headb = r256(4 * N * C);
                } else {
                    set = r256(2 * N * C) + 4 * r256(4 * N) + r256(6 * N * Cl) + r256(4 * B * NHl * T) +
                          r256(2 * N * Cl) + r256(4 * N * C) + r256(2 * N * C) + 2 * r256(2 * N * Hl);
                    scratch = r256(4 * N * C) + r256(2 * N * C) + r256(6 * N * Cl) + r256(2 * N * Hl) +
                              (head ? r256(2 * N * V) : 0) + r256(4 * N) + r256(4 * B * NHl * T) + r256(2 * N * C) +
                              r256(16 * C) + r256(4 * N * C);
                    scratch += d == ZERO_BF16 ? 2 * r256(4 * e) + 2 * r256(4 * m) : r256(2 * e) + r256(2 * m);
                    headb = r256(2 * N * C);
                }
                size_t inputs = S * (L + 1) * r256(4 * N * C);
                size_t hd = S * (2 * r256(4 * N) + (head ? headb + 3 * r256(4 * N) + r256(4 * N * V) : 0));
                size_t total = inputs + S * L * set + hd + scratch;
                gpt_activation_bytes b;
                CHECK_OK(gpt_cuda_activation_bytes_stage(&cfg, (int)P, (int)B, (int)T, d, acts ? &bf16 : &fp32, NULL,
                                                         ranges[k][0], ranges[k][1], (int)S, &b));
                CHECK_MSG(b.total == total && b.inputs == inputs && b.blocks == S * L * set && b.head == hd &&
                              b.scratch == scratch && b.recompute == 0,
                          "cuda bytes at tp 2 (%s activations, %s params, blocks [%d, %d), %zu slots): %zu (blocks %zu "
                          "head %zu scratch %zu), formula %zu (%zu, %zu, %zu)",
                          acts ? "bf16" : "fp32", zero_dtype_name(d), ranges[k][0], ranges[k][1], S, b.total, b.blocks,
                          b.head, b.scratch, total, S * L * set, hd, scratch);
            }
    /* the tp layout's rules, named without a GPU: P must divide n_head; no MoE blocks at P > 1 */
    gpt_activation_bytes b;
    CHECK(gpt_cuda_activation_bytes_stage(&cfg, 3, (int)B, (int)T, ZERO_F32, &fp32, NULL, 0, 3, 1, &b) == ZERO_CONFIG &&
          strstr(gpt_last_error(), "does not divide n_head"));
    gpt_config moe = cfg;
    moe.moe_experts = 4, moe.moe_top_k = 1, moe.moe_capacity_factor = 1.0f, moe.moe_ep = 1;
    CHECK(gpt_cuda_activation_bytes_stage(&moe, 2, (int)B, (int)T, ZERO_F32, &fp32, NULL, 0, 3, 1, &b) ==
              ZERO_UNSUPPORTED &&
          strstr(gpt_last_error(), "moe experts"));
    const gpt_checkpointing part = {1, 0, 1};
    CHECK(gpt_cuda_activation_bytes_stage(&cfg, 2, (int)B, (int)T, ZERO_F32, &fp32, &part, 0, 3, 1, &b) ==
              ZERO_UNSUPPORTED &&
          strstr(gpt_last_error(), "partition_activations"));
}

/* An MoE model's CUDA report (docs/moe.md), for fp32 and bf16 activations
 * and parameters, ep 1 and 2, with and without recomputation: the block
 * sets lose fch_gelu and fch (kept only as the bf16 path's fp32 copy of the
 * layer's input, N x C floats), the scratch's dfch goes (or becomes the
 * bf16 path's fp32 input gradient, N x C floats), a block module grows to
 * the router and El = E/ep experts, and `moe` is n_layer x one layer's
 * device buffers, each rounded up to 256 bytes:
 *   r(8E) + 2 r(4NE) + 4 r(4NK) + 3 r(4E) + 2 r(4 S C) + 3 r(4 R C) + 3 r(4 R H) + r(4R)
 * (H = 4C, S = N K, R = E min(cap, N), cap = ceil(cf K N / E)). Counted
 * without a GPU; the workspace's own report equals this count (test_gpt_cuda
 * above and test_gpt_moe_cuda check report == count on a GPU). */
static void check_cuda_bytes_moe(void)
{
    const size_t B = 2, T = 13, N = B * T, C = 48, V = 101, NH = 4, L = 3, H = 4 * C, E = 4, K = 2;
    const size_t cap = (size_t)ceil(1.5 * K * N / E), S = N * K, R = E * (cap < N ? cap : N);
    const size_t layer = r256(8 * E) + 2 * r256(4 * N * E) + 4 * r256(4 * N * K) + 3 * r256(4 * E) +
                         2 * r256(4 * S * C) + 3 * r256(4 * R * C) + 3 * r256(4 * R * H) + r256(4 * R);
    const gpt_cuda_options bf16_acts = GPT_CUDA_OPTIONS_BF16;
    for (int ep = 1; ep <= 2; ep++)
        for (int acts = 0; acts < 2; acts++)
            for (int dt = 0; dt < 2; dt++)
                for (size_t rec = 0; rec < 2; rec++) {
                    gpt_config cfg = {.n_layer = 3, .n_head = 4, .d_model = 48, .seq_len = 24, .vocab = 101,
                                      .moe_experts = (int)E, .moe_top_k = (int)K, .moe_capacity_factor = 1.5f,
                                      .moe_aux_loss_coef = 0.01f, .moe_ep = ep};
                    zero_dtype d = dt ? ZERO_BF16 : ZERO_F32;
                    size_t El = E / (size_t)ep, e = V * C + 24 * C;
                    size_t m = 4 * C * C + 8 * C + El * (8 * C * C + 5 * C) + E * C; /* an MoE block module */
                    size_t inputs = (L + 1) * r256(4 * N * C), set, head, scratch;
                    if (!acts) {
                        set = 4 * r256(4 * N * C) + 4 * r256(4 * N) + r256(12 * N * C) + r256(4 * B * NH * T * T);
                        head = 2 * r256(4 * N) + r256(4 * N * C) + 3 * r256(4 * N) + r256(4 * N * V);
                        scratch = 2 * r256(4 * N * C) + r256(12 * N * C) + r256(4 * N * V) + r256(4 * N) +
                                  8 * r256(4 * N * C) + r256(4 * B * NH * T * T);
                        scratch += d == ZERO_BF16 ? 2 * r256(4 * e) + 2 * r256(4 * m) : 0;
                    } else {
                        set = r256(2 * N * C) + 4 * r256(4 * N) + r256(6 * N * C) + r256(4 * B * NH * T) +
                              r256(2 * N * C) + r256(4 * N * C) + r256(2 * N * C) + r256(4 * N * C);
                        head = 2 * r256(4 * N) + r256(2 * N * C) + 3 * r256(4 * N) + r256(4 * N * V);
                        scratch = r256(4 * N * C) + r256(2 * N * C) + r256(6 * N * C) + r256(4 * N * C) +
                                  r256(2 * N * V) + r256(4 * N) + r256(4 * B * NH * T) + r256(2 * N * C) +
                                  r256(16 * C);
                        scratch += d == ZERO_BF16 ? 2 * r256(4 * e) + 2 * r256(4 * m) : r256(2 * e) + r256(2 * m);
                    }
                    size_t total = inputs + (L - rec) * set + (rec ? set : 0) + head + scratch + L * layer;
                    gpt_checkpointing ck = {(int)rec, 0, 0};
                    gpt_activation_bytes b;
                    CHECK_OK(gpt_cuda_activation_bytes_for_opts(&cfg, (int)B, (int)T, d, acts ? &bf16_acts : NULL,
                                                                &ck, &b));
                    CHECK_MSG(b.total == total && b.moe == L * layer && b.inputs == inputs &&
                                  b.blocks == (L - rec) * set && b.recompute == (rec ? set : 0) && b.head == head &&
                                  b.scratch == scratch && b.host == 0,
                              "cuda MoE bytes (ep %d, %s acts, %s params, %zu recomputed): %zu (moe %zu), formula %zu "
                              "(moe %zu)",
                              ep, acts ? "bf16" : "fp32", zero_dtype_name(d), rec, b.total, b.moe, total, L * layer);
                }
}

/* Activation checkpointing on the GPU (fp32 math), against the same GPU run
 * without it: the forward has no atomics, so the loss and logits are
 * bitwise equal; the backward's column sums and embedding scatter use fp32
 * atomics, so gradients are compared within 1e-4 * scale + 1e-5 * |x| (the
 * run-to-run spread of the atomics' order is ~1e-7 relative; a block
 * backpropagated through stale activations is off by O(1)). Variants: every
 * block, the first only, every block with the inputs offloaded to pinned
 * host memory (cpu_offload). */
static void check_checkpointing(const gpt_config *cfg, const float *params, size_t total, const int32_t *tok,
                                const int32_t *tgt, float loss0, const float *lg0, const float *gg0)
{
    const gpt_checkpointing variants[] = {{GPT_CHECKPOINT_ALL, 0, 0}, {1, 0, 0}, {GPT_CHECKPOINT_ALL, 1, 0}};
    size_t nl = (size_t)B_ * T_ * V_;
    float *lg = malloc(nl * 4), *gg = malloc(total * 4);
    for (int v = 0; v < 3; v++) {
        float loss;
        if (gpu_run(cfg, params, total, ZERO_F32, opt(GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_UNFUSED), &variants[v],
                    tok, tgt, &loss, lg, gg) != 0)
            continue;
        CHECK_MSG(memcmp(&loss, &loss0, sizeof loss) == 0 && memcmp(lg, lg0, nl * 4) == 0,
                  "checkpointing %d blocks (offload %d): forward differs from the run without", variants[v].blocks,
                  variants[v].cpu_offload);
        char mode[80];
        snprintf(mode, sizeof mode, "checkpointing %d blocks, offload %d vs none", variants[v].blocks,
                 variants[v].cpu_offload);
        compare_all(cfg, mode, lg, lg0, gg, gg0, 0, 1e-5);
    }
    free(lg), free(gg);
}

#endif /* ZERO_HAVE_CUDA */

int main(void)
{
#if ZERO_HAVE_CUDA
    check_cuda_bytes();
    check_cuda_bytes_bf16_acts();
    check_cuda_bytes_moe();
    check_cuda_bytes_tp();
    if (!gpt_cuda_available() && check_exit() != 0) return 1; /* a wrong formula fails even without a GPU */
#endif
    if (!gpt_cuda_available()) CHECK_SKIP("no CUDA GPU visible (or this build has no CUDA path)");
#if ZERO_HAVE_CUDA
    gpt_config cfg = {.n_layer = L_, .n_head = NH_, .d_model = C_, .seq_len = T_, .vocab = V_};
    size_t total = gpt_param_elements(&cfg), nl = (size_t)B_ * T_ * V_;
    float *params = malloc(total * 4), *gc = malloc(total * 4), *gg = malloc(total * 4);
    float *lc = malloc(nl * 4), *lg = malloc(nl * 4);
    int32_t tok[B_ * T_], tgt[B_ * T_];
    size_t off = 0;
    for (size_t i = 0; i < gpt_num_params(&cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(&cfg, i, &info);
        for (size_t j = 0; j < info.numel; j++)
            params[off + j] = info.init == GPT_INIT_ONES ? 1.0f + 0.1f * uniform() : 0.1f * uniform();
        off += info.numel;
    }
    for (int i = 0; i < B_ * T_; i++) tok[i] = (int32_t)((uniform() + 1.0f) * 127.9f), tgt[i] = (int32_t)((uniform() + 1.0f) * 127.9f);
    tgt[5] = -1;

    float loss_c, loss_g;
    cpu_run(&cfg, params, total, tok, tgt, &loss_c, lc, gc);
    /* ZERO_GPT_CUDA_PART=flash or bf16_acts runs only check 4 or 5 (the GPU
     * script's separate checks; the flash one still needs the unfused run) */
    const char *part = getenv("ZERO_GPT_CUDA_PART");
    const int all = !part || !*part, only_flash = part && !strcmp(part, "flash"), only_bf16 = part && !strcmp(part, "bf16_acts");

    const gpt_cuda_options fp32 = opt(GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_UNFUSED);
    const gpt_cuda_options fp32_flash = opt(GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_FLASH);
    const gpt_cuda_options bf16_acts = GPT_CUDA_OPTIONS_BF16;
    float *lu = malloc(nl * 4), *gu = malloc(total * 4), loss_u = 0;
    int have_unfused = 0;
    if ((all || only_flash) && gpu_run(&cfg, params, total, ZERO_F32, fp32, NULL, tok, tgt, &loss_g, lg, gg) == 0) {
        CHECK_CLOSE(loss_g, loss_c, 1e-5);
        printf("fp32 math: loss gpu %.7f cpu %.7f\n", loss_g, loss_c);
        compare_all(&cfg, "fp32 math, fp32 params", lg, lc, gg, gc, 0, 1e-3);
        if (all) check_checkpointing(&cfg, params, total, tok, tgt, loss_g, lg, gg);
        memcpy(lu, lg, nl * 4), memcpy(gu, gg, total * 4), loss_u = loss_g, have_unfused = 1;
    }
    if (all || only_flash) { /* 4: flash attention, fp32 */
        if (gpu_run(&cfg, params, total, ZERO_F32, fp32_flash, NULL, tok, tgt, &loss_g, lg, gg) == 0) {
            CHECK_CLOSE(loss_g, loss_c, 1e-5);
            printf("fp32 math, flash attention: loss gpu %.7f cpu %.7f\n", loss_g, loss_c);
            compare_all(&cfg, "flash attention vs CPU (fp32)", lg, lc, gg, gc, 0, 1e-3);
            if (have_unfused) {
                CHECK_CLOSE(loss_g, loss_u, 1e-5);
                compare_all(&cfg, "flash vs unfused attention on the GPU (fp32)", lg, lu, gg, gu, 0, 1e-4);
            }
        }
    }
    if ((all || only_bf16) && gpu_run(&cfg, params, total, ZERO_F32, bf16_acts, NULL, tok, tgt, &loss_g, lg, gg) == 0) { /* 5 */
        CHECK_MSG(fabsf(loss_g - loss_c) <= 1e-2f, "bf16-activation loss %.6f vs cpu %.6f", loss_g, loss_c);
        printf("bf16 activations: loss gpu %.7f cpu %.7f\n", loss_g, loss_c);
        compare_all(&cfg, "bf16 activations, fp32 params", lg, lc, gg, gc, 1, 3e-2);
    }
    free(lu), free(gu);
    if (all && gpu_run(&cfg, params, total, ZERO_F32, opt(GPT_CUDA_MATH_BF16, ZERO_F32, GPT_CUDA_ATTN_UNFUSED), NULL, tok,
                       tgt, &loss_g, lg, gg) == 0) {
        CHECK_MSG(fabsf(loss_g - loss_c) <= 1e-2f, "bf16 loss %.6f vs cpu %.6f", loss_g, loss_c);
        printf("bf16 math: loss gpu %.7f cpu %.7f\n", loss_g, loss_c);
        compare_all(&cfg, "bf16 math, fp32 params", lg, lc, gg, gc, 1, 3e-2);
    }
    for (size_t i = 0; i < total; i++) params[i] = bf16_round(params[i]);
    cpu_run(&cfg, params, total, tok, tgt, &loss_c, lc, gc);
    if (all && gpu_run(&cfg, params, total, ZERO_BF16, opt(GPT_CUDA_MATH_BF16, ZERO_F32, GPT_CUDA_ATTN_UNFUSED), NULL,
                       tok, tgt, &loss_g, lg, gg) == 0) {
        CHECK_MSG(fabsf(loss_g - loss_c) <= 1e-2f, "bf16-params loss %.6f vs cpu %.6f", loss_g, loss_c);
        printf("bf16 params: loss gpu %.7f cpu %.7f\n", loss_g, loss_c);
        compare_all(&cfg, "bf16 math, bf16 params and grads", lg, lc, gg, gc, 1, 4e-2);
    }
    if ((all || only_bf16) && gpu_run(&cfg, params, total, ZERO_BF16, bf16_acts, NULL, tok, tgt, &loss_g, lg, gg) == 0) { /* 5 */
        CHECK_MSG(fabsf(loss_g - loss_c) <= 1e-2f, "bf16-activation, bf16-params loss %.6f vs cpu %.6f", loss_g, loss_c);
        printf("bf16 activations, bf16 params: loss gpu %.7f cpu %.7f\n", loss_g, loss_c);
        compare_all(&cfg, "bf16 activations, bf16 params and grads", lg, lc, gg, gc, 1, 3e-2);
    }

    /* misuse is reported, not crashed on */
    gpt_cuda_workspace *ws = NULL;
    CHECK(gpt_cuda_workspace_create(&ws, &cfg, B_, T_ + 1000, ZERO_F32, GPT_CUDA_MATH_BF16, NULL) ==
          ZERO_INVALID_ARGUMENT);
    CHECK(gpt_cuda_workspace_create(&ws, &cfg, B_, T_, ZERO_F16, GPT_CUDA_MATH_BF16, NULL) == ZERO_UNSUPPORTED);
    gpt_cuda_options bad = opt(GPT_CUDA_MATH_BF16, ZERO_BF16, GPT_CUDA_ATTN_UNFUSED);
    CHECK(gpt_cuda_workspace_create_opts(&ws, &cfg, B_, T_, ZERO_F32, &bad, NULL, NULL) == ZERO_UNSUPPORTED);
    free(params), free(gc), free(gg), free(lc), free(lg);
#endif
    return check_exit();
}
