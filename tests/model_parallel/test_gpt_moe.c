/* The GPT with MoE blocks (gpt_config.moe_*) under expert parallelism
 * against the single-rank MoE GPT, on real ranks: the world is the ep group
 * (np 1, 2, 4; moe_ep = world size).
 *
 * Every rank builds the full model (all experts, moe_ep 1) and its own
 * slice (moe_ep P) from the same seed; asserted:
 *   - each expert stack's slice from gpt_param_init_ep is bitwise the full
 *     stack's rows of this rank's experts (the same model at every ep size);
 *   - this rank's loss (cross-entropy + coef x aux) equals the single-rank
 *     model's on the same micro-batch within 1e-6 relative;
 *   - the gradients: dense tensors and the router summed over the ranks,
 *     and this rank's expert slices, equal the single-rank model's summed
 *     over every rank's micro-batch within 1e-5 x max|ref|;
 *   - activation checkpointing of every block gives bitwise the same loss
 *     and gradients (a recomputed MoE block does not redo its exchanges). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zero/comm.h>

#include "check.h"
#include "gpt.h"
#include "moe_test_model.h"

enum { B = 2, T = 8 };
static int rank, size;
static zero_comm *world;

static void model_init(model *m, gpt_config cfg, int ep_rank)
{
    model_init_stage(m, cfg, 7, ep_rank, 1, 0);
}

static void batch(int r, int32_t *tok, int32_t *tgt, int vocab)
{
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)((i * 7 + r * 13 + 3) % vocab);
        tgt[i] = (int32_t)((i * 5 + r * 11 + 1) % vocab);
    }
}

static void expect_close(const float *got, const float *want, size_t n, const char *what)
{
    float scale = 0, worst = 0;
    for (size_t i = 0; i < n; i++) scale = fmaxf(scale, fabsf(want[i]));
    for (size_t i = 0; i < n; i++) worst = fmaxf(worst, fabsf(got[i] - want[i]));
    CHECK_MSG(worst <= 1e-5f * fmaxf(scale, 1e-30f), "%s: |diff| %.3g (max|ref| %.3g)", what, (double)worst,
              (double)scale);
}

static float run(model *m, gpt_workspace *ws, int r)
{
    int32_t tok[B * T], tgt[B * T];
    batch(r, tok, tgt, m->cfg.vocab);
    float loss = 0;
    CHECK_OK(gpt_forward(ws, tok, tgt, m->p, &loss));
    CHECK_OK(gpt_backward(ws, 1.0f, m->p, m->g));
    return loss;
}

int main(void)
{
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT;
    cc.timeout_s = 30;
    if (zero_comm_create_world(&world, &cc) != ZERO_OK) return 1;
    rank = zero_comm_get_rank(world), size = zero_comm_get_size(world);
    check_set_rank(rank);
    gpt_config full = {.n_layer = 2, .n_head = 2, .d_model = 16, .seq_len = T, .vocab = 32, .moe_experts = 4,
                       .moe_top_k = 2, .moe_capacity_factor = 1.0f, .moe_aux_loss_coef = 0.01f, .moe_ep = 1};
    gpt_config sl = full;
    sl.moe_ep = size;
    CHECK_OK(gpt_config_validate(&sl));
    CHECK(gpt_num_params(&full) == 2 + 13 * 2 + 2);
    model ref, ep, ck;
    model_init(&ref, full, 0);
    model_init(&ep, sl, rank);
    model_init(&ck, sl, rank);

    /* the slices are the full stacks' rows */
    for (size_t i = 0; i < gpt_num_params(&sl); i++) {
        gpt_param_info a, b;
        gpt_param_info_get(&sl, i, &a);
        gpt_param_info_get(&full, i, &b);
        CHECK(!strcmp(a.name, b.name) && a.expert_stack == b.expert_stack);
        size_t off = a.expert_stack ? (size_t)rank * a.numel : 0;
        CHECK_MSG(a.numel * (a.expert_stack ? (size_t)size : 1) == b.numel, "%s: %zu elements here", a.name, a.numel);
        CHECK_MSG(!memcmp(ep.p[a.module].t[a.index], (float *)ref.p[b.module].t[b.index] + off, a.numel * 4),
                  "%s: this rank's slice differs from the full tensor", a.name);
    }

    gpt_workspace *wr = NULL, *we = NULL, *wc = NULL;
    CHECK_OK(gpt_workspace_create(&wr, &full, B, T));
    CHECK_OK(gpt_workspace_create_moe(&we, &sl, B, T, NULL, world));
    gpt_checkpointing all = {GPT_CHECKPOINT_ALL, 0, 0};
    CHECK_OK(gpt_workspace_create_moe(&wc, &sl, B, T, &all, world));
    float want = 0;
    for (int r = 0; r < size; r++) {
        float l = run(&ref, wr, r);
        if (r == rank) want = l;
    }
    float got = run(&ep, we, rank), got_ck = run(&ck, wc, rank);
    CHECK_MSG(fabsf(got - want) <= 1e-6f * fabsf(want), "loss %.9g, single-rank model %.9g", (double)got, (double)want);
    CHECK_MSG(got_ck == got, "loss with checkpointing %.9g, without %.9g", (double)got_ck, (double)got);
    CHECK_MSG(gpt_workspace_moe_aux(we) > 0, "aux loss %g", (double)gpt_workspace_moe_aux(we));

    for (size_t i = 0; i < gpt_num_params(&sl); i++) {
        gpt_param_info a;
        gpt_param_info_get(&sl, i, &a);
        float *g = ep.g[a.module].t[a.index], *gc = ck.g[a.module].t[a.index];
        CHECK_MSG(!memcmp(g, gc, a.numel * 4), "%s: gradient with checkpointing differs", a.name);
        size_t off = a.expert_stack ? (size_t)rank * a.numel : 0;
        if (!a.expert_stack) CHECK_OK(zero_allreduce(world, g, g, a.numel, ZERO_F32, ZERO_SUM));
        char what[96];
        snprintf(what, sizeof what, "ep %d: d %s", size, a.name);
        expect_close(g, (float *)ref.g[a.module].t[a.index] + off, a.numel, what);
    }
    if (rank == 0)
        fprintf(stderr, "ep %d: loss %.6f (aux %.4f) equals the single-rank MoE GPT's %.6f\n", size, (double)got,
                (double)gpt_workspace_moe_aux(we), (double)want);
    gpt_workspace_destroy(wr), gpt_workspace_destroy(we), gpt_workspace_destroy(wc);
    model_free(&ref), model_free(&ep), model_free(&ck);
    zero_comm_destroy(world);
    return check_exit();
}
