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
 *   - the split backward (B / W, the experts' weight gradients deferred to
 *     W in their MoE layers, moe.h): ZB-H1 and ZB-H2 through the runtime
 *     (pp_run_plan) give bitwise 1F1B's loss and every gradient (at pp 2
 *     stage 1 runs a W after the next micro-batch's forward and backward);
 *     at pp 1 a plan running every W after every B (the W stash of each
 *     slot's MoE layers held across the other micro-batches' F and B, the
 *     ep exchanges all in B) gives bitwise GPipe's loss and gradients, and
 *     the split was real (the W stash's bytes include the MoE layers');
 *   - refusals by name: MoE at tp 2, an ep comm of the wrong size, sequence
 *     parallelism; a forward into an MoE layer whose deferred W has not
 *     run. */
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
#include "pp_plan.h"
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

/* `plan` through the runtime (pp_run_plan) on a workspace with the plan's
 * slots; *wstash (may be NULL): the W stash's bytes after the step. */
static float pipeline_plan(model *m, zero_grid *grid, zero_comm *ep, zero_comm *embed, const pp_plan *plan,
                           const int32_t *tok, const int32_t *tgt, size_t *wstash)
{
    int b, e;
    CHECK_OK(pp_stage_layers(&m->cfg, grid->pp_size, grid->pp_rank, &b, &e));
    tp_workspace *ws = NULL;
    const tp_options o = {NULL, 0, NULL, ep};
    CHECK_OK(tp_workspace_create_opts(&ws, &m->cfg, NULL, B, T, b, e, plan->slots[grid->pp_rank], &o));
    pp_step_args a = {M, tok, tgt, 1.0f / M, m->p, m->g};
    float loss = -1;
    CHECK_OK(pp_run_plan(&ws, grid->pp_size > 1 ? grid->pp : NULL, plan, &a, NULL, &loss));
    CHECK_OK(pp_tied_grad_allreduce(embed, &m->cfg, &m->g[GPT_MODULE_EMBED]));
    if (wstash) *wstash = tp_workspace_wstash_bytes(ws);
    tp_workspace_destroy(ws);
    return loss;
}

/* Every gradient this rank holds bitwise equal in a and b; else the first that differs named in `first`. */
static char g_first[128];
static int same_grads(const gpt_config *cfg, const model *a, const model *b, const char **first)
{
    for (size_t i = 0; i < gpt_num_params(cfg); i++) {
        gpt_param_info in;
        gpt_param_info_get(cfg, i, &in);
        const float *x = a->g[in.module].t[in.index], *y = b->g[in.module].t[in.index];
        if (x && memcmp(x, y, in.numel * 4) != 0) {
            snprintf(g_first, sizeof g_first, "%s", in.name);
            *first = g_first;
            return 0;
        }
    }
    return 1;
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
    CHECK_OK(tp_workspace_split_backward(ws)); /* MoE blocks split their backward too */
    CHECK(tp_workspace_wstash_bytes(ws) > 0);
    tp_workspace_destroy(ws);
}

/* An MoE layer refuses a forward while its deferred W is due (it would
 * overwrite what W reads), and a W without a B. One layer, one rank. */
static void moe_layer_refusals(void)
{
    const gpt_moe_config mc = {8, 16, 4, 2, 0.0f, 0.01f};
    enum { N = 6 };
    gpt_moe *m = NULL;
    CHECK_OK(gpt_moe_create(&m, &mc, N, NULL));
    float gate[4 * 8], fc_w[4 * 16 * 8], fc_b[4 * 16], proj_w[4 * 8 * 16], proj_b[4 * 8];
    float g_gate[4 * 8] = {0}, g_fc_w[4 * 16 * 8] = {0}, g_fc_b[4 * 16] = {0}, g_proj_w[4 * 8 * 16] = {0},
          g_proj_b[4 * 8] = {0};
    float x[N * 8], out[N * 8], dout[N * 8], dx[N * 8];
    float *all[] = {gate, fc_w, fc_b, proj_w, proj_b, x, dout};
    size_t n[] = {sizeof gate, sizeof fc_w, sizeof fc_b, sizeof proj_w, sizeof proj_b, sizeof x, sizeof dout};
    for (int t = 0; t < 7; t++)
        for (size_t k = 0; k < n[t] / 4; k++) all[t][k] = (float)((k * 37 + (size_t)t * 11) % 17) / 17.0f - 0.5f;
    gpt_moe_params p = {gate, fc_w, fc_b, proj_w, proj_b}, g = {g_gate, g_fc_w, g_fc_b, g_proj_w, g_proj_b};
    CHECK_OK(gpt_moe_forward(m, x, NULL, out, &p, NULL));
    CHECK(gpt_moe_backward_input(m, 1.0f, x, dout, dx, &p, &g) == ZERO_INVALID_STATE &&
          strstr(gpt_last_error(), "gpt_moe_split_backward"));
    CHECK_OK(gpt_moe_split_backward(m));
    CHECK(gpt_moe_split_bytes(m) > 0);
    CHECK_OK(gpt_moe_backward_input(m, 1.0f, x, dout, dx, &p, &g));
    CHECK(gpt_moe_forward(m, x, NULL, out, &p, NULL) == ZERO_INVALID_STATE &&
          strstr(gpt_last_error(), "gpt_moe_backward_weight"));
    CHECK_OK(gpt_moe_backward_weight(m, &g));
    CHECK(gpt_moe_backward_weight(m, &g) == ZERO_INVALID_STATE && strstr(gpt_last_error(), "no split backward"));
    CHECK_OK(gpt_moe_forward(m, x, NULL, out, &p, NULL));
    gpt_moe_destroy(m);
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

    /* the split backward with MoE blocks: zero-bubble schedules bitwise 1F1B; at pp 1 every W deferred */
    model onef, split;
    model_init(&onef, sl, ep_rank, PP, grid.pp_rank); /* 1F1B again: `one`'s gradients were summed over ep above */
    float loss_1 = pipeline(&onef, &grid, ep, embed, PP_1F1B, tok, tgt);
    for (int k = PP_SCHED_ZB_H1; k <= PP_SCHED_ZB_H2; k++) {
        pp_plan plan;
        const char *diff = NULL;
        model_init(&split, sl, ep_rank, PP, grid.pp_rank);
        CHECK_OK(pp_plan_generate(&plan, (pp_schedule_kind)k, PP, M, 1));
        float l = pipeline_plan(&split, &grid, ep, embed, &plan, tok, tgt, NULL);
        CHECK_MSG(l == loss_1 && same_grads(&sl, &split, &onef, &diff), "pp %d x ep %d, MoE %s: loss %.9g vs 1F1B %.9g%s%s",
                  PP, EP, plan.name, (double)l, (double)loss_1, diff ? "; gradient differs: " : "", diff ? diff : "");
        pp_plan_free(&plan);
        model_free(&split);
    }
    if (PP == 1) {
        pp_plan w_late, whole;
        const char *diff = NULL;
        CHECK_OK(pp_plan_generate(&whole, PP_SCHED_GPIPE, 1, M, 1));
        CHECK_OK(pp_plan_init(&w_late, 1, 1, M, "w-deferred"));
        for (int k = 0; k < M; k++) CHECK_OK(pp_plan_add(&w_late, 0, PP_OP_F, k, 0, 0));
        for (int k = 0; k < M; k++) CHECK_OK(pp_plan_add(&w_late, 0, PP_OP_B, k, 0, 0));
        for (int k = 0; k < M; k++) CHECK_OK(pp_plan_add(&w_late, 0, PP_OP_W, k, 0, 0));
        CHECK_OK(pp_plan_check(&w_late));
        CHECK(w_late.split && !whole.split);
        model unsplit;
        model_init(&unsplit, sl, ep_rank, PP, grid.pp_rank), model_init(&split, sl, ep_rank, PP, grid.pp_rank);
        size_t stash = 0, moe_stash = 0;
        float lw = pipeline_plan(&unsplit, &grid, ep, embed, &whole, tok, tgt, NULL);
        float ls = pipeline_plan(&split, &grid, ep, embed, &w_late, tok, tgt, &stash);
        /* the stash holds each slot's MoE layers' d(expert output) beside the blocks' dense parts */
        const int L = sl.n_layer, Cm = sl.d_model, N = B * T;
        const size_t dense = sizeof(float) * (size_t)M * (size_t)L * (size_t)N * (2 * (size_t)Cm + 4 * (size_t)Cm + 3 * (size_t)Cm);
        moe_stash = stash - dense;
        CHECK_MSG(ls == lw && same_grads(&sl, &split, &unsplit, &diff) && stash > dense,
                  "ep %d, MoE, every W after every B: loss %.9g vs GPipe %.9g%s%s; W stash %zu bytes (dense part %zu)",
                  EP, (double)ls, (double)lw, diff ? "; gradient differs: " : "", diff ? diff : "", stash, dense);
        if (rank == 0)
            fprintf(stderr, "ep %d: MoE split backward (every W deferred) bitwise GPipe; the MoE layers' W stash %zu "
                    "bytes\n", EP, moe_stash);
        model_free(&unsplit), model_free(&split);
        pp_plan_free(&w_late), pp_plan_free(&whole);
    }
    model_free(&onef);
    if (rank == 0)
        fprintf(stderr, "pp %d x ep %d: MoE zb-h1, zb-h2 bitwise 1f1b\n", PP, EP);
    refusals(&sl, ep);
    moe_layer_refusals();
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
