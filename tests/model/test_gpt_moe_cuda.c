/* The CUDA GPT with MoE blocks (gpt_cuda_workspace_create_moe) against the
 * CPU GPT with MoE blocks (gpt_workspace_create_moe, the reference), on a GPU.
 *
 *   test_gpt_moe_cuda          ep 1: the whole model on the GPU
 *   test_gpt_moe_cuda staged   under mpirun with P ranks sharing GPU 0 through
 *                              a STAGED world comm: the CUDA model with
 *                              moe_ep = P (E/P experts a rank) on this rank's
 *                              tokens, vs the CPU model holding every expert
 *                              run on every rank's tokens
 *
 * Config: 2 layers, 4 heads, d_model 32, seq 16, batch 3 (48 tokens a rank),
 * vocab 64, one ignored target; weights uniform +-0.1 (routers +-0.5, so the
 * router probabilities are far from ties), LayerNorm weights 1 +- 0.1.
 * Cases: top-1 with capacity factor 1 (tokens dropped: asserted > 0), top-2
 * with 0.75 and every block recomputed (activation checkpointing), top-2
 * unlimited with flash attention. fp32 math (no TF32), fp32 activations.
 *
 * Asserted, per case:
 *  - routing identical to the CPU model's in every block: each choice's
 *    expert and slot (-1: dropped) and the dropped count;
 *  - the aux losses' sum within 1e-5 relative, the loss (cross-entropy +
 *    aux_loss_coef x aux) within 1e-5 relative;
 *  - logits and every gradient within |gpu - cpu| <= 1e-4 max|cpu| +
 *    1e-3 |cpu| elementwise (as tests/model/test_gpt_cuda.c: both fp32, only
 *    the summation order and expf differ, ~1e-6 relative). Expected
 *    gradients: the dense tensors' (embeddings, attention, LayerNorms,
 *    routers) are this rank's tokens' (the model does not sum them over ep:
 *    zero-train does); an expert stack's is its rows of the CPU's stack
 *    gradient summed over every rank's tokens (each expert's weight gradient
 *    sums the rows of all ranks);
 *  - bf16 activations (GPT_CUDA_OPTIONS_BF16: the layer's input widened,
 *    its input gradient rounded): the loss within 2e-2 of the CPU's and at
 *    least 90% of the routing choices to the CPU's expert (bf16 storage and
 *    products move the router logits by ~2^-9 relative: a choice near a tie
 *    may flip, no more; slots are not compared, one flip shifts the slots of
 *    every later choice of its two experts);
 *  - the split backward offered (its W stash counting the MoE layers'; its
 *    bits are pp_stage_cuda's check), an ep comm of the wrong size refused
 *    (ZERO_CONFIG).
 * Skips (77) without a GPU in a CUDA build; without CUDA it asserts that
 * gpt_cuda_workspace_create_moe is ZERO_UNSUPPORTED naming the missing path. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/comm.h>

#include "check.h"
#include "gpt.h"
#include "gpt_cuda.h"
#include "gpt_test_params.h"
#include "moe.h"
#include "zero_build_config.h"

#define L_ 2
#define B_ 3
#define T_ 16
#define V_ 64
#define N_ (B_ * T_)

#if ZERO_HAVE_CUDA
#include <cuda_runtime_api.h>

static int rank, size = 1;
static zero_comm *world;

static uint64_t rng;
static float uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void compare(const char *what, const float *gpu, const float *cpu, size_t n)
{
    gpt_test_compare(what, gpu, cpu, n, rank == 0);
}

/* The routing of the N_ x top_k choices of every block (expert, slot). */
typedef struct routing {
    int32_t expert[L_][N_ * 4], slot[L_][N_ * 4];
    long dropped[L_];
} routing;

static void get_routing(struct gpt_moe *const *layers, int K, routing *r)
{
    for (int l = 0; l < L_; l++) {
        gpt_moe_routing rt;
        gpt_moe_get_routing(layers[l], &rt);
        memcpy(r->expert[l], rt.expert, sizeof(int32_t) * N_ * K);
        memcpy(r->slot[l], rt.slot, sizeof(int32_t) * N_ * K);
        r->dropped[l] = rt.dropped;
    }
}

static void tokens_of(int r, int32_t *tok, int32_t *tgt)
{
    uint64_t s = 1234567ull + 7919ull * (uint64_t)r;
    for (int i = 0; i < N_; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % V_);
        tgt[i] = (int32_t)((s >> 17) % V_);
    }
    tgt[5] = -1; /* one ignored target */
}

typedef struct moe_case {
    const char *name;
    int experts_per_rank, top_k;
    float capacity_factor;
    int recompute;  /* every block recomputed in backward */
    gpt_cuda_options opts;
    int bf16_acts;  /* the loose check */
    int must_drop;  /* the CPU routing drops tokens (asserted, so the case means something) */
} moe_case;

static void run_case(const moe_case *mc)
{
    const int E = mc->experts_per_rank * size, K = mc->top_k;
    gpt_config whole = {.n_layer = L_, .n_head = 4, .d_model = 32, .seq_len = T_, .vocab = V_, .moe_experts = E,
                        .moe_top_k = K, .moe_capacity_factor = mc->capacity_factor, .moe_aux_loss_coef = 0.01f,
                        .moe_ep = 1};
    gpt_config mine = whole;
    mine.moe_ep = size;
    if (rank == 0)
        printf("%s: E %d top-%d capacity factor %g, ep %d%s\n", mc->name, E, K, (double)mc->capacity_factor, size,
               mc->recompute ? ", every block recomputed" : "");
    const size_t tw = gpt_param_elements(&whole), tm = gpt_param_elements(&mine), np = gpt_num_params(&whole);
    /* the whole model, the same on every rank */
    float *pw = malloc(tw * 4);
    rng = 88172645463325252ull;
    size_t off = 0;
    for (size_t i = 0; i < np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&whole, i, &info);
        int ln_w = strstr(info.name, "ln_") && strstr(info.name, ".weight");
        float amp = info.index == GPT_MOE_GATE_W && info.module > 0 && info.module <= L_ ? 0.5f : 0.1f;
        for (size_t k = 0; k < info.numel; k++) pw[off + k] = ln_w ? 1.0f + 0.1f * uniform() : amp * uniform();
        off += info.numel;
    }

    /* CPU reference: every expert, every rank's tokens */
    float *gw_all = calloc(tw, 4), *gw_own = calloc(tw, 4), *gw_tmp = calloc(tw, 4);
    float *logits_ref = malloc(sizeof(float) * N_ * V_);
    float loss_ref = 0, aux_ref = 0;
    routing *rt_ref = calloc(1, sizeof *rt_ref), *rt_gpu = calloc(1, sizeof *rt_gpu);
    int32_t tok[N_], tgt[N_];
    gpt_tensors p[L_ + 2], g[L_ + 2];
    memset(p, 0, sizeof p);
    gpt_test_layout(&whole, pw, 4, p);
    for (int r = 0; r < size; r++) {
        gpt_workspace *ws = NULL;
        CHECK_OK(gpt_workspace_create_moe(&ws, &whole, B_, T_, NULL, NULL));
        if (!ws) return;
        memset(gw_tmp, 0, tw * 4);
        memset(g, 0, sizeof g);
        gpt_test_layout(&whole, gw_tmp, 4, g);
        tokens_of(r, tok, tgt);
        float loss = 0;
        CHECK_OK(gpt_forward(ws, tok, tgt, p, &loss));
        CHECK_OK(gpt_backward(ws, 1.0f, p, g));
        for (size_t k = 0; k < tw; k++) gw_all[k] += gw_tmp[k];
        if (r == rank) {
            memcpy(gw_own, gw_tmp, tw * 4);
            memcpy(logits_ref, gpt_workspace_logits(ws), sizeof(float) * N_ * V_);
            loss_ref = loss, aux_ref = gpt_workspace_moe_aux(ws);
            struct gpt_moe *layers[L_];
            for (int l = 0; l < L_; l++) layers[l] = gpt_workspace_moe_layer(ws, l);
            get_routing(layers, K, rt_ref);
        }
        gpt_workspace_destroy(ws);
    }
    long dropped_ref = 0;
    for (int l = 0; l < L_; l++) dropped_ref += rt_ref->dropped[l];
    if (mc->must_drop) CHECK_MSG(dropped_ref > 0, "%s: the CPU model dropped no choice", mc->name);

    /* this rank's model: the dense tensors whole, its rows of each expert stack;
     * the expected gradients likewise (an expert's summed over every rank's tokens) */
    float *pm = malloc(tm * 4), *gm_ref = malloc(tm * 4), *gm = malloc(tm * 4);
    size_t ow = 0, om = 0;
    for (size_t i = 0; i < np; i++) {
        gpt_param_info iw, im;
        gpt_param_info_get(&whole, i, &iw);
        gpt_param_info_get(&mine, i, &im);
        size_t first = im.expert_stack ? (size_t)rank * im.numel : 0;
        memcpy(pm + om, pw + ow + first, im.numel * 4);
        memcpy(gm_ref + om, (im.expert_stack ? gw_all : gw_own) + ow + first, im.numel * 4);
        ow += iw.numel, om += im.numel;
    }

    /* the CUDA model */
    gpt_test_dev dev;
    CHECK(gpt_test_dev_init(&dev, &mine, pm, tm, ZERO_F32, p, g) == 0);
    gpt_checkpointing ck = {mc->recompute ? GPT_CHECKPOINT_ALL : 0, 0, 0};
    gpt_cuda_workspace *cw = NULL;
    CHECK_OK(gpt_cuda_workspace_create_moe(&cw, &mine, B_, T_, ZERO_F32, &mc->opts, NULL, &ck,
                                           size > 1 ? world : NULL));
    if (cw) { /* the activation report: the count without a workspace, the MoE part what the layers hold */
        gpt_activation_bytes got, want;
        gpt_cuda_workspace_activation_bytes(cw, &got);
        CHECK_OK(gpt_cuda_activation_bytes_for_opts(&mine, B_, T_, ZERO_F32, &mc->opts, &ck, &want));
        size_t held = 0;
        for (int l = 0; l < L_; l++) held += gpt_moe_bytes(gpt_cuda_workspace_moe_layer(cw, l));
        CHECK_MSG(memcmp(&got, &want, sizeof got) == 0 && got.moe == held && held > 0 &&
                      got.total == gpt_cuda_workspace_bytes(cw),
                  "%s: activation bytes reported %zu (moe %zu), counted %zu (moe %zu), layers hold %zu", mc->name,
                  got.total, got.moe, want.total, want.moe, held);
    }
    if (cw) {
        tokens_of(rank, tok, tgt);
        float loss = -1, *logits = malloc(sizeof(float) * N_ * V_);
        CHECK_OK(gpt_cuda_forward(cw, tok, tgt, p, &loss));
        CHECK_OK(gpt_cuda_backward(cw, 1.0f, p, g));
        CHECK_OK(gpt_cuda_workspace_logits(cw, logits));
        struct gpt_moe *layers[L_];
        for (int l = 0; l < L_; l++) layers[l] = gpt_cuda_workspace_moe_layer(cw, l);
        CHECK(layers[0] && layers[L_ - 1] && !gpt_cuda_workspace_moe_layer(cw, L_));
        get_routing(layers, K, rt_gpu);
        float aux = gpt_cuda_workspace_moe_aux(cw);
        long same = 0, same_expert = 0, dropped = 0;
        for (int l = 0; l < L_; l++) {
            dropped += rt_gpu->dropped[l];
            for (int q = 0; q < N_ * K; q++) {
                same_expert += rt_gpu->expert[l][q] == rt_ref->expert[l][q];
                same += rt_gpu->expert[l][q] == rt_ref->expert[l][q] && rt_gpu->slot[l][q] == rt_ref->slot[l][q];
            }
        }
        if (mc->bf16_acts) {
            CHECK_MSG(fabs(loss - loss_ref) <= 2e-2, "%s: loss %.6f vs the CPU's %.6f", mc->name, (double)loss,
                      (double)loss_ref);
            CHECK_MSG(same_expert >= 0.9 * L_ * N_ * K, "%s: %ld of %d routing choices to the CPU's expert",
                      mc->name, same_expert, L_ * N_ * K);
            if (rank == 0)
                printf("  loss %.6f vs %.6f, %ld of %d choices to the CPU's expert\n", (double)loss,
                       (double)loss_ref, same_expert, L_ * N_ * K);
        } else {
            CHECK_MSG(same == (long)L_ * N_ * K && dropped == dropped_ref,
                      "%s: routing differs from the CPU's (%ld of %d choices the same; dropped %ld vs %ld)",
                      mc->name, same, L_ * N_ * K, dropped, dropped_ref);
            CHECK_MSG(fabs(aux - aux_ref) <= 1e-5 * fabs(aux_ref), "%s: aux %.8g vs the CPU's %.8g", mc->name,
                      (double)aux, (double)aux_ref);
            CHECK_MSG(fabs(loss - loss_ref) <= 1e-5 * fabs(loss_ref), "%s: loss %.8g vs the CPU's %.8g", mc->name,
                      (double)loss, (double)loss_ref);
            if (rank == 0)
                printf("  routing identical (%ld dropped), aux %.7g vs %.7g, loss %.7g vs %.7g\n", dropped,
                       (double)aux, (double)aux_ref, (double)loss, (double)loss_ref);
            compare("logits", logits, logits_ref, (size_t)N_ * V_);
            gpt_test_dev_grads(&dev, gm);
            om = 0;
            for (size_t i = 0; i < np; i++) {
                gpt_param_info im;
                gpt_param_info_get(&mine, i, &im);
                char what[80];
                snprintf(what, sizeof what, "grad %s", im.name);
                compare(what, gm + om, gm_ref + om, im.numel);
                om += im.numel;
            }
        }
        free(logits);
    }
    gpt_cuda_workspace_destroy(cw);
    gpt_test_dev_free(&dev);
    free(pw), free(gw_all), free(gw_own), free(gw_tmp), free(logits_ref), free(rt_ref), free(rt_gpu);
    free(pm), free(gm_ref), free(gm);
}

/* The split backward is offered (its stash counts the MoE layers'); an ep comm of another size is refused. */
static void check_refusals(void)
{
    gpt_config cfg = {.n_layer = L_, .n_head = 4, .d_model = 32, .seq_len = T_, .vocab = V_, .moe_experts = 4,
                      .moe_top_k = 1, .moe_capacity_factor = 1.0f, .moe_aux_loss_coef = 0.01f, .moe_ep = 1};
    gpt_cuda_options o = {GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_UNFUSED};
    gpt_cuda_workspace *cw = NULL;
    CHECK_OK(gpt_cuda_workspace_create_moe(&cw, &cfg, B_, T_, ZERO_F32, &o, NULL, NULL, NULL));
    if (cw) {
        zero_status st = gpt_cuda_workspace_split_backward(cw);
        CHECK_MSG(st == ZERO_OK && gpt_cuda_workspace_wstash_bytes(cw) > 0, "split backward with MoE: %s: %s",
                  zero_status_name(st), gpt_last_error());
        gpt_cuda_workspace_destroy(cw);
    }
    cfg.moe_ep = 2; /* and no comm */
    cw = (gpt_cuda_workspace *)&cfg;
    zero_status st = gpt_cuda_workspace_create_moe(&cw, &cfg, B_, T_, ZERO_F32, &o, NULL, NULL, NULL);
    CHECK_MSG(st == ZERO_CONFIG && cw == NULL && strstr(gpt_last_error(), "moe ep = 2"),
              "moe ep 2 without an ep comm: %s: %s", zero_status_name(st), gpt_last_error());
}

int main(int argc, char **argv)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) CHECK_SKIP("no CUDA device");
    if (argc > 1 && !strcmp(argv[1], "staged")) {
        int rc = gpt_test_staged_world(&world, &rank, &size);
        if (rc) return rc;
    }
    const gpt_cuda_options fp32 = {GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_UNFUSED};
    const gpt_cuda_options flash = {GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_FLASH};
    const gpt_cuda_options bf16 = GPT_CUDA_OPTIONS_BF16;
    const moe_case cases[] = {
        {"top-1, dropping", 4, 1, 1.0f, 0, fp32, 0, 1},
        {"top-2, dropping, recomputed", 4, 2, 0.75f, 1, fp32, 0, 1},
        {"top-2, unlimited, flash", 2, 2, 0.0f, 0, flash, 0, 0},
        {"top-2, bf16 activations", 4, 2, 1.0f, 0, bf16, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    if (size == 1) check_refusals();
    zero_comm_destroy(world);
    return check_exit();
}
#else
int main(void)
{
    gpt_config cfg = {.n_layer = L_, .n_head = 4, .d_model = 32, .seq_len = T_, .vocab = V_, .moe_experts = 4,
                      .moe_top_k = 1, .moe_capacity_factor = 1.0f, .moe_aux_loss_coef = 0.01f, .moe_ep = 1};
    gpt_cuda_workspace *cw = (gpt_cuda_workspace *)&cfg;
    zero_status st = gpt_cuda_workspace_create_moe(&cw, &cfg, B_, T_, ZERO_F32, NULL, NULL, NULL, NULL);
    CHECK_MSG(st == ZERO_UNSUPPORTED && cw == NULL && strstr(gpt_last_error(), "no CUDA path"),
              "gpt_cuda_workspace_create_moe without CUDA: %s: %s", zero_status_name(st), gpt_last_error());
    return check_exit();
}
#endif
