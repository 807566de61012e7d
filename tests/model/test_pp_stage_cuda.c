/* The CUDA pipeline stage (model/pp_stage_cuda.h) driven by the pipeline
 * runtime (pp_run_stage), on one rank, against the whole-model CUDA
 * workspace; skips (77) without a GPU or in a build without CUDA (suite
 * 'gpu': tests/gpu/run_gpu_tests.sh runs it). The multi-rank path (sends
 * and receives over STAGED) is zero-train's train_cuda_pp2_staged_np2.
 *
 * 2 blocks, 4 heads, d_model 64, seq 40, batch 3, vocab 256; GPT-2's init;
 * 4 micro-batches of dloss 1/4. Reference: one whole-model workspace,
 * forward and backward of each micro-batch in order, its losses' mean
 * computed as the runtime does ((float)(double sum / 4)). The stage is
 * stream-ordered (its own stream, no synchronization per op; the losses
 * read at the end of the step) and its transfer buffers come from a pool.
 * Asserted, for fp32 params / fp32 math / fp32 activations and for bf16
 * params in the bf16 activation mode (flash attention, cuBLASLt epilogues),
 * for GPipe (4 slots), 1F1B (1 slot, reused) and a plan that runs every W
 * after all the B's (the split backward, 4 stashes):
 *  - the step's loss BITWISE the reference's (the same kernels on the same
 *    inputs, the per-token losses summed on the host in the same order);
 *  - every linear layer's weight gradient BITWISE (the same gemms, the
 *    micro-batches accumulated in the same order, W's from the stash);
 *  - every other gradient within 1e-5 x max |tensor| (+ one bf16 rounding
 *    step with bf16 gradients): the bias / LayerNorm / embedding reductions
 *    use atomics;
 *  - a second step allocates no transfer buffer (pp_cuda_stage_transfer_allocs
 *    unchanged), creates no device event (pp_cuda_stage_events_created
 *    unchanged) and gives the same loss bitwise;
 * and with activation checkpointing on the stage (every block recomputed;
 * once with the recomputed inputs in pinned host memory), GPipe: the same
 * loss and weight gradients bitwise (the recomputation is the forward's
 * kernels again), the rest within the tolerance above, and the stage's
 * report of what it would hold without checkpointing
 * (pp_cuda_stage_activation_bytes_without_ckpt) exactly what the stage
 * without it holds, above what it holds; the split plan on it is
 * ZERO_UNSUPPORTED naming the recomputed block.
 * MoE blocks on the stage (4 experts, top-2, one CUDA MoE layer per slot and
 * block), fp32, GPipe and 1F1B against the whole-model MoE workspace: the
 * loss (cross-entropy + 0.01 x aux, the aux share added by the stage's
 * forward, the cross-entropy at the end of the step) within 1e-6 relative
 * (the two terms are summed in another order), every gradient within
 * 1e-4 x max + 1e-3 |value| (gpt_test_compare: the layers' own reductions);
 * and the split plan (every W after all the B's: the experts' weight
 * gradients deferred in each slot's MoE layers, moe.h) likewise, with its
 * loss and every expert weight and bias gradient BITWISE the GPipe stage's
 * (B then W issues the unsplit backward's gemms on the same operands). */
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
#include "pp_gpt.h"
#include "pp_plan.h"
#include "pp_stage_cuda.h"
#include "zero_build_config.h"
#include <zero/device.h>

#if ZERO_HAVE_CUDA
enum { L_ = GPT_SMALL_L, B_ = GPT_SMALL_B, T_ = GPT_SMALL_T }; /* gpt_cuda_small.h's model */
#define M_ 4
#define N_ (B_ * T_)

typedef struct mode {
    zero_dtype dt;
    gpt_cuda_options o;
    const char *name;
} mode;

/* The reference: the whole-model workspace, micro-batches in order. */
static int reference(const gpt_config *cfg, const float *params, size_t total, const mode *md, const int32_t *tok,
                     const int32_t *tgt, float *grads, float *loss)
{
    gpt_tensors p[L_ + 2], g[L_ + 2];
    gpt_test_dev d;
    if (gpt_test_dev_init(&d, cfg, params, total, md->dt, p, g) != 0) return -1;
    gpt_cuda_workspace *ws = NULL;
    zero_status st = gpt_cuda_workspace_create_opts(&ws, cfg, B_, T_, md->dt, &md->o, NULL, NULL);
    double sum = 0;
    for (int m = 0; m < M_ && st == ZERO_OK; m++) {
        float l = 0;
        st = gpt_cuda_forward(ws, tok + m * N_, tgt + m * N_, p, &l);
        if (st == ZERO_OK) st = gpt_cuda_backward(ws, 1.0f / M_, p, g);
        sum += l;
    }
    CHECK_MSG(st == ZERO_OK, "%s reference: %s", md->name, gpt_last_error());
    *loss = (float)(sum / M_);
    gpt_test_dev_grads(&d, grads);
    gpt_cuda_workspace_destroy(ws);
    gpt_test_dev_free(&d);
    return st == ZERO_OK ? 0 : -1;
}

/* One rank's stage for `plan`, two steps (gradients of the first kept). */
static int staged(const gpt_config *cfg, const float *params, size_t total, const mode *md, const pp_plan *plan,
                  const gpt_checkpointing *ck, const int32_t *tok, const int32_t *tgt, float *grads, float *loss,
                  gpt_activation_bytes *now, gpt_activation_bytes *without)
{
    gpt_tensors p[L_ + 2], g[L_ + 2];
    gpt_test_dev d;
    zero_device *dev = NULL;
    if (gpt_test_dev_init(&d, cfg, params, total, md->dt, p, g) != 0) return -1;
    pp_cuda_stage *s = NULL;
    zero_status st = zero_device_create(&dev, ZERO_DEVICE_CUDA, 0);
    if (st == ZERO_OK)
        st = pp_cuda_stage_create(&s, cfg, dev, NULL, B_, md->dt, &md->o, ck, 1, 0, 1, &plan->slots[0], NULL, NULL);
    pp_step_args a = {M_, tok, tgt, 1.0f / M_, p, g};
    pp_stage view;
    float second = -1;
    int allocs = -1, events = -1;
    if (st == ZERO_OK) {
        pp_cuda_stage_activation_bytes(s, now);
        pp_cuda_stage_activation_bytes_without_ckpt(s, without);
        pp_cuda_stage_view(s, &view);
        st = pp_run_stage(&view, NULL, plan, &a, NULL, loss);
    }
    if (st == ZERO_OK) {
        gpt_test_dev_grads(&d, grads);
        allocs = pp_cuda_stage_transfer_allocs(s);
        events = pp_cuda_stage_events_created(s);
        st = pp_run_stage(&view, NULL, plan, &a, NULL, &second);
    }
    if (st == ZERO_OK)
        CHECK_MSG(second == *loss && pp_cuda_stage_transfer_allocs(s) == allocs && allocs > 0 &&
                      pp_cuda_stage_events_created(s) == events && events > 0,
                  "%s, %s: second step loss %.9g (first %.9g); %d transfer allocations after it, %d after the first; "
                  "%d events created after it, %d after the first",
                  md->name, plan->name, second, *loss, pp_cuda_stage_transfer_allocs(s), allocs,
                  pp_cuda_stage_events_created(s), events);
    pp_cuda_stage_destroy(s);
    zero_device_destroy(dev);
    gpt_test_dev_free(&d);
    if (st != ZERO_OK) fprintf(stderr, "%s, %s: %s\n", md->name, plan->name, gpt_last_error());
    return st == ZERO_OK ? 0 : -1;
}

#endif

int main(void)
{
    if (!gpt_cuda_available()) CHECK_SKIP("no CUDA GPU visible (or this build has no CUDA path)");
#if ZERO_HAVE_CUDA
    gpt_small s;
    if (gpt_small_init(&s, M_) != 0) return check_exit();
    const gpt_config cfg = s.cfg;
    const size_t total = s.total;
    const float *params = s.params;
    float *gr = s.gref, *gs = s.gtest;
    const int32_t *tok = s.tok, *tgt = s.tgt;
    s.tgt[5] = -1; /* an ignored target: the valid count differs per micro-batch */
    const mode modes[] = {
        {ZERO_F32, {GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_UNFUSED}, "fp32 params, fp32 math"},
        {ZERO_BF16, GPT_CUDA_OPTIONS_BF16, "bf16 params, bf16 activations"},
    };
    pp_plan plans[3];
    CHECK_OK(pp_plan_generate(&plans[0], PP_SCHED_GPIPE, 1, M_, 1));
    CHECK_OK(pp_plan_generate(&plans[1], PP_SCHED_1F1B, 1, M_, 1));
    CHECK_OK(pp_plan_init(&plans[2], 1, 1, M_, "w-deferred"));
    for (int k = 0; k < M_; k++) CHECK_OK(pp_plan_add(&plans[2], 0, PP_OP_F, k, 0, 0));
    for (int k = 0; k < M_; k++) CHECK_OK(pp_plan_add(&plans[2], 0, PP_OP_B, k, 0, 0));
    for (int k = 0; k < M_; k++) CHECK_OK(pp_plan_add(&plans[2], 0, PP_OP_W, k, 0, 0));
    CHECK_OK(pp_plan_check(&plans[2]));
    CHECK(plans[2].split && plans[2].slots[0] == M_ && plans[1].slots[0] == 1);
    for (int k = 0; k < 2; k++) {
        const double rel = modes[k].dt == ZERO_BF16 ? 1.0 / 128 : 0.0;
        float lr = 0, ls = 0;
        gpt_activation_bytes plain = {0}, now, without;
        if (reference(&cfg, params, total, &modes[k], tok, tgt, gr, &lr) != 0) continue;
        for (int j = 0; j < 3; j++) {
            char what[128];
            snprintf(what, sizeof what, "%s, %s", modes[k].name, plans[j].name);
            if (staged(&cfg, params, total, &modes[k], &plans[j], NULL, tok, tgt, gs, &ls, &now, &without) != 0) {
                CHECK_MSG(0, "%s: the stage failed", what);
                continue;
            }
            CHECK_MSG(ls == lr, "%s: loss %.9g vs the whole model's %.9g", what, ls, lr);
            CHECK_MSG(without.total == now.total, "%s: without checkpointing %zu bytes, holds %zu", what,
                      without.total, now.total);
            if (j == 0) plain = now; /* GPipe's 4 slots, the checkpointed runs' shape */
            gpt_test_compare_grads(&cfg, what, "not bitwise the whole model", gs, gr, rel);
            printf("%s: loss and weight gradients bitwise the whole model, the rest within 1e-5 x max\n", what);
        }
        for (int off_ = 0; off_ < 2; off_++) { /* activation checkpointing on the stage */
            gpt_checkpointing ck = {L_, off_, 0};
            char what[128];
            snprintf(what, sizeof what, "%s, gpipe, checkpointing%s", modes[k].name, off_ ? " (cpu_offload)" : "");
            if (staged(&cfg, params, total, &modes[k], &plans[0], &ck, tok, tgt, gs, &ls, &now, &without) != 0) {
                CHECK_MSG(0, "%s: the stage failed", what);
                continue;
            }
            CHECK_MSG(ls == lr, "%s: loss %.9g vs the whole model's %.9g", what, ls, lr);
            CHECK_MSG(memcmp(&without, &plain, sizeof plain) == 0 && now.total < plain.total,
                      "%s: reports %zu bytes without checkpointing (the stage without holds %zu), holds %zu", what,
                      without.total, plain.total, now.total);
            gpt_test_compare_grads(&cfg, what, "not bitwise the whole model", gs, gr, rel);
            printf("%s: loss and weight gradients bitwise the whole model, the rest within 1e-5 x max; %zu activation "
                   "bytes (%zu without)\n", what, now.total, plain.total);
        }
        gpt_checkpointing ck = {1, 0, 0}; /* W needs the activations kept */
        CHECK(staged(&cfg, params, total, &modes[k], &plans[2], &ck, tok, tgt, gs, &ls, &now, &without) != 0 &&
              strstr(gpt_last_error(), "block 0 is recomputed"));
    }
    { /* MoE blocks */
        gpt_config mc = cfg;
        mc.moe_experts = 4, mc.moe_top_k = 2, mc.moe_capacity_factor = 2.0f, mc.moe_aux_loss_coef = 0.01f;
        mc.moe_ep = 1;
        const size_t mt = gpt_param_elements(&mc);
        float *mp = gpt_test_init_params(&mc, 7), *mr = malloc(mt * 4), *ms = malloc(mt * 4);
        float *mg = malloc(mt * 4), lr = 0, ls = 0, lg = 0;
        gpt_activation_bytes now, without;
        if (reference(&mc, mp, mt, &modes[0], tok, tgt, mr, &lr) == 0)
            for (int j = 0; j < 3; j++) {
                char what[128];
                snprintf(what, sizeof what, "MoE, %s, %s", modes[0].name, plans[j].name);
                if (staged(&mc, mp, mt, &modes[0], &plans[j], NULL, tok, tgt, ms, &ls, &now, &without) != 0) {
                    CHECK_MSG(0, "%s: the stage failed", what);
                    continue;
                }
                CHECK_MSG(fabs(ls - lr) <= 1e-6 * fabs(lr), "%s: loss %.9g vs the whole model's %.9g", what, ls, lr);
                CHECK_MSG(now.moe > 0, "%s: no MoE layers in the activation report", what);
                size_t off = 0;
                for (size_t i = 0; i < gpt_num_params(&mc); i++) {
                    gpt_param_info info;
                    gpt_param_info_get(&mc, i, &info);
                    char name[192];
                    snprintf(name, sizeof name, "%s: d %s", what, info.name);
                    gpt_test_compare(name, ms + off, mr + off, info.numel, 0);
                    int expert = strstr(info.name, "experts") != NULL; /* the experts' fc / proj weights and biases */
                    if (j == 2 && expert)
                        CHECK_MSG(memcmp(ms + off, mg + off, info.numel * 4) == 0,
                                  "%s: not bitwise the unsplit (GPipe) stage's", name);
                    off += info.numel;
                }
                if (j == 0) memcpy(mg, ms, mt * 4), lg = ls;
                if (j == 2) CHECK_MSG(ls == lg, "%s: loss %.9g vs GPipe's %.9g", what, ls, lg);
                printf("%s: loss within 1e-6 and gradients within 1e-4 x max of the whole model\n", what);
            }
        free(mp), free(mr), free(ms), free(mg);
    }
    for (int j = 0; j < 3; j++) pp_plan_free(&plans[j]);
    gpt_small_free(&s);
#endif
    return check_exit();
}
