/* MoE blocks in the pipeline stage runtime (tp_gpt.h's tp_options.ep,
 * pp_run_plan), on real ranks: pp stages x ep expert-parallel ranks, the ep
 * group nested inside dp (zero_grid_create with tp 1: world rank =
 * pp_rank * ep + ep_rank, DeepSpeed-MoE's order; docs/sequence-parallel.md).
 * Arguments: PP EP (world = PP x EP).
 *
 * Every rank holds its stage's blocks with its ep rank's experts
 * (gpt_param_init_ep) and runs M micro-batches of its own data through 1F1B;
 * the reference is the single-rank MoE GPT (every expert, moe_ep 1) on the
 * same micro-batches. Asserted:
 *   - the loss (cross-entropy + aux_loss_coef x every stage's blocks' aux
 *     losses, the mean over the micro-batches) on every stage within 1e-5
 *     relative of the single-rank model's on this ep rank's micro-batches;
 *   - every gradient within the tp/pp tests' tolerance, 2e-5 max|ref| +
 *     1e-4 |ref|, of the single-rank model's summed over every ep rank's
 *     micro-batches: dense tensors (the router included) summed over the ep
 *     group, the tied wte after the first/last stage sum, and this ep rank's
 *     expert slices as they are (each expert's gradient has every ep rank's
 *     rows already);
 *   - GPipe gives bitwise 1F1B's loss and gradients;
 *   - refusals by name: MoE at tp 2, an ep comm of the wrong size, sequence
 *     parallelism, a split (zero-bubble) backward. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zero/zero.h>

#include "check.h"
#include "gpt.h"
#include "gpt_internal.h"
#include "moe.h"
#include "moe_test_model.h"
#include "pp_gpt.h"
#include "tp_gpt.h"

enum { B = 2, T = 8, M = 3 };
static const uint64_t SEED = 11;

/* The tensors this rank keeps (pp stage pp_rank of pp; pp 1: all), ep rank `ep_rank`'s experts. */
static void model_init(model *m, gpt_config cfg, int ep_rank, int pp, int pp_rank)
{
    model_init_stage(m, cfg, SEED, ep_rank, pp, pp_rank);
}

/* Micro-batch m of ep rank r: its own tokens, so the experts see different rows from each rank. */
static void batch(int r, int m, int32_t *tok, int32_t *tgt, int vocab)
{
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)((i * 7 + r * 13 + m * 5 + 3) % vocab);
        tgt[i] = (int32_t)((i * 5 + r * 11 + m * 3 + 1) % vocab);
    }
}

static float pipeline(model *m, zero_grid *grid, zero_comm *ep, zero_comm *embed, pp_schedule kind,
                      const int32_t *tok, const int32_t *tgt)
{
    int b, e;
    CHECK_OK(pp_stage_layers(&m->cfg, grid->pp_size, grid->pp_rank, &b, &e));
    tp_workspace *ws = NULL;
    const tp_options o = {NULL, 0, NULL, ep};
    CHECK_OK(tp_workspace_create_opts(&ws, &m->cfg, NULL, B, T, b, e,
                                      pp_slots_needed(kind, M, grid->pp_size, grid->pp_rank), &o));
    pp_step_args a = {M, tok, tgt, 1.0f / M, m->p, m->g};
    float loss = -1;
    CHECK_OK(pp_train_step(ws, grid->pp, kind, &a, &loss));
    CHECK_OK(pp_tied_grad_allreduce(embed, &m->cfg, &m->g[GPT_MODULE_EMBED]));
    /* The activation report is exact with MoE blocks: the workspace's bytes are
     * what tp_activation_bytes_opts counts, the MoE layers' own buffers (one
     * layer per slot and block) included, and an MoE block carves none of the
     * dense MLP's buffers (fp32 activations: the dense block's two N x 4C sets
     * and its N x 4C backward scratch are gone). */
    const int slots = pp_slots_needed(kind, M, grid->pp_size, grid->pp_rank);
    gpt_activation_bytes have, want, dense;
    tp_workspace_activation_bytes(ws, &have);
    CHECK_OK(tp_activation_bytes_opts(&m->cfg, 1, 1, B, T, b, e, slots, &o, &want));
    CHECK(memcmp(&have, &want, sizeof have) == 0);
    const gpt_moe_config mc = gpt_moe_config_of(&m->cfg);
    size_t one = 0, layers = 0;
    CHECK_OK(gpt_moe_bytes_for(&mc, B * T, m->cfg.moe_ep > 1 ? m->cfg.moe_ep : 1, 0, &one));
    for (int sl = 0; sl < slots; sl++)
        for (int l = b; l < e; l++) layers += gpt_moe_bytes(tp_workspace_moe_layer(ws, sl, l));
    CHECK_MSG(have.moe == (size_t)slots * (size_t)(e - b) * one && have.moe == layers && one > 0,
              "moe: %zu bytes, formula %zu, the layers hold %zu", have.moe, (size_t)slots * (size_t)(e - b) * one, layers);
    CHECK(have.total == have.inputs + have.blocks + have.recompute + have.head + have.scratch + have.moe);
    gpt_config dcfg = m->cfg;
    dcfg.moe_experts = 0, dcfg.moe_ep = 0;
    const tp_options dense_o = {NULL, 0, NULL, NULL};
    CHECK_OK(tp_activation_bytes_opts(&dcfg, 1, 1, B, T, b, e, slots, &dense_o, &dense));
    const size_t set = (((size_t)B * T * 4 * m->cfg.d_model * 4) + 63) / 64 * 64; /* one N x 4C fp32 buffer */
    CHECK_MSG(dense.blocks - have.blocks == (size_t)slots * (size_t)(e - b) * 2 * set &&
                  dense.scratch - have.scratch == set && dense.moe == 0,
              "dense minus MoE: blocks %zu (want %zu), scratch %zu (want %zu)", dense.blocks - have.blocks,
              (size_t)slots * (size_t)(e - b) * 2 * set, dense.scratch - have.scratch, set);
    tp_workspace_destroy(ws);
    return loss;
}

static void refusals(const gpt_config *sl, zero_comm *ep)
{
    tp_workspace *ws = NULL;
    CHECK(tp_config_validate(sl, 2) == ZERO_UNSUPPORTED && strstr(gpt_last_error(), "tp size 2"));
    const tp_options wrong = {NULL, 0, NULL, NULL};
    if (sl->moe_ep > 1) {
        CHECK(tp_workspace_create_opts(&ws, sl, NULL, B, T, 0, 1, 1, &wrong) == ZERO_CONFIG);
        CHECK_MSG(strstr(gpt_last_error(), "ep comm has 1 rank") != NULL, "%s", gpt_last_error());
    }
    const tp_options sp = {NULL, 1, NULL, ep};
    CHECK(tp_workspace_create_opts(&ws, sl, NULL, B, T, 0, 1, 1, &sp) != ZERO_OK);
    CHECK_MSG(strstr(gpt_last_error(), "MoE blocks") != NULL, "%s", gpt_last_error());
    const tp_options ok = {NULL, 0, NULL, ep};
    CHECK_OK(tp_workspace_create_opts(&ws, sl, NULL, B, T, 0, 1, 1, &ok));
    CHECK(tp_workspace_split_backward(ws) == ZERO_UNSUPPORTED && strstr(gpt_last_error(), "MoE blocks"));
    tp_workspace_destroy(ws);
}

int main(int argc, char **argv)
{
    int PP = argc > 1 ? atoi(argv[1]) : 1, EP = argc > 2 ? atoi(argv[2]) : 1;
    zero_comm *world = NULL;
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT;
    cc.timeout_s = 30;
    if (zero_comm_create_world(&world, &cc) != ZERO_OK) return 1;
    int rank = zero_comm_get_rank(world);
    check_set_rank(rank);
    CHECK_MSG(zero_comm_get_size(world) == PP * EP, "world %d, want pp %d x ep %d", zero_comm_get_size(world), PP, EP);
    zero_grid grid;
    CHECK_OK(zero_grid_create(world, 1, PP, &grid));
    /* dp = ep here (no expert-data-parallel replicas): the grid's dp group is the ep group */
    zero_comm *ep = EP > 1 ? grid.dp : NULL, *embed = NULL;
    const int ep_rank = grid.dp_rank;
    CHECK_OK(pp_embed_group_create(grid.pp, &embed));
    gpt_config full = {.n_layer = 4, .n_head = 2, .d_model = 16, .seq_len = T, .vocab = 32, .moe_experts = 4,
                       .moe_top_k = 2, .moe_capacity_factor = 1.0f, .moe_aux_loss_coef = 0.01f, .moe_ep = 1};
    gpt_config sl = full;
    sl.moe_ep = EP;

    int32_t tok[M * B * T], tgt[M * B * T];
    for (int m = 0; m < M; m++) batch(ep_rank, m, tok + m * B * T, tgt + m * B * T, full.vocab);
    model one, gp;
    model_init(&one, sl, ep_rank, PP, grid.pp_rank);
    model_init(&gp, sl, ep_rank, PP, grid.pp_rank);
    float loss = pipeline(&one, &grid, ep, embed, PP_1F1B, tok, tgt);
    float loss_g = pipeline(&gp, &grid, ep, embed, PP_GPIPE, tok, tgt);
    CHECK_MSG(loss == loss_g, "1F1B loss %.9g, GPipe %.9g", (double)loss, (double)loss_g);

    /* the single-rank MoE GPT over every ep rank's micro-batches (gradients summed over them) */
    model ref;
    model_init(&ref, full, 0, 1, 0);
    gpt_workspace *wr = NULL;
    CHECK_OK(gpt_workspace_create(&wr, &full, B, T));
    double want = 0;
    for (int r = 0; r < EP; r++)
        for (int m = 0; m < M; m++) {
            int32_t rt[B * T], rg[B * T];
            batch(r, m, rt, rg, full.vocab);
            float l = 0;
            CHECK_OK(gpt_forward(wr, rt, rg, ref.p, &l));
            CHECK_OK(gpt_backward(wr, 1.0f / M, ref.p, ref.g));
            if (r == ep_rank) want += l / M;
        }
    CHECK_MSG(fabs(loss - want) <= 1e-5 * fabs(want), "pp %d x ep %d: loss %.9g, single-rank MoE GPT %.9g", PP, EP,
              (double)loss, want);

    int compared = 0;
    for (size_t i = 0; i < gpt_num_params(&sl); i++) {
        gpt_param_info a;
        gpt_param_info_get(&sl, i, &a);
        float *g = one.g[a.module].t[a.index];
        if (!g) continue;
        CHECK_MSG(!memcmp(g, gp.g[a.module].t[a.index], a.numel * 4), "%s: GPipe's gradient differs from 1F1B's",
                  a.name);
        if (ep && !a.expert_stack) CHECK_OK(zero_allreduce(ep, g, g, a.numel, ZERO_F32, ZERO_SUM));
        const float *want_g = (const float *)ref.g[a.module].t[a.index] + (a.expert_stack ? (size_t)ep_rank * a.numel : 0);
        float scale = 0, worst = 0;
        size_t bad = 0;
        for (size_t k = 0; k < a.numel; k++) scale = fmaxf(scale, fabsf(want_g[k]));
        for (size_t k = 0; k < a.numel; k++) {
            float d = fabsf(g[k] - want_g[k]);
            worst = fmaxf(worst, d);
            bad += d > 2e-5f * scale + 1e-4f * fabsf(want_g[k]);
        }
        CHECK_MSG(bad == 0 && scale > 0, "pp %d x ep %d: d %s: %zu elements off, |diff| %.3g (max|ref| %.3g)", PP, EP,
                  a.name, bad, (double)worst, (double)scale);
        compared++;
    }
    CHECK(compared > 0);
    refusals(&sl, ep);
    if (rank == 0)
        fprintf(stderr, "pp %d x ep %d: loss %.6f equals the single-rank MoE GPT's %.6f; %d gradients compared\n", PP,
                EP, (double)loss, want, compared);
    gpt_workspace_destroy(wr);
    model_free(&ref), model_free(&one), model_free(&gp);
    zero_comm_destroy(embed);
    zero_grid_destroy(&grid);
    zero_comm_destroy(world);
    return check_exit();
}
