/* Tensor- and pipeline-parallel GPT against the single-rank model.
 *
 *   test_model_parallel TP PP [engine STAGE STEPS | dead]
 *
 * Run under tests/mpirun.sh with world = TP * PP * DP. On the grid
 * (zero_grid_create: tp fastest, then dp, then pp):
 *
 * default mode, per dp replica (each replica runs the same batch):
 *   - slicing a full tensor into TP shards and back is the identity (bitwise);
 *   - the loss of M = 3 micro-batches through the GPipe schedule equals the
 *     single-rank model's mean loss within 1e-5 relative, and every gradient,
 *     gathered to full shape over tp (wte summed over the embedding group),
 *     is within 2e-5 * max|ref| + 1e-4 * |ref| elementwise of the single-rank
 *     gradient (summation order differs: the row-parallel partial products
 *     are summed by the all-reduce);
 *   - replicated gradients (LayerNorms, row-parallel biases, wte, wpe, ln_f)
 *     are bitwise equal on every tp rank;
 *   - 1F1B gives bitwise the same gradients and loss as GPipe;
 *   - at TP = PP = 1 everything is bitwise equal to gpt_forward/gpt_backward;
 *   - misuse fails with the stated status (tp not dividing n_head, more
 *     stages than blocks, a block out of order).
 *
 * dead mode (TP 1, PP = world): the last stage leaves after the set-up;
 * the first stage's pipeline step fails with TIMEOUT or PEER_FAILURE within
 * its 1 s deadline + 3 s, naming the transfer and the stage, and tears down.
 *
 * engine mode: STEPS AdamW steps with the tp shards of each stage registered
 * (tp_engine_build) with a ZeRO engine of stage STAGE over the grid's dp group (every dp rank
 * its own micro-batches; the same batch every step, so the loss falls),
 * against a world-1 engine on the full model that accumulates all dp x M
 * micro-batches (gradient_accumulation_steps = dp*M): the loss curve within 2e-5
 * relative; after the steps, replicated parameters bitwise equal over tp and
 * the two wte copies bitwise equal between the first and last stage. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zero/zero.h>

#include "check.h"
#include "gpt.h"
#include "pp_gpt.h"
#include "tp_engine.h"
#include "tp_gpt.h"

#define MP_TRY(call)                                                                                 \
    do {                                                                                             \
        zero_status st_ = (call);                                                                    \
        if (st_ != ZERO_OK) {                                                                        \
            fprintf(stderr, "[rank %d] %s:%d: %s: %s: %s\n", g_rank, __FILE__, __LINE__, #call,       \
                    zero_status_name(st_), gpt_last_error()[0] ? gpt_last_error() : zero_last_error()); \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)

static int g_rank;

/* The tiny model: 3 blocks (pp 2 splits them 2 + 1), 4 heads, seq 8 of 12.
 * A stage boundary message is 3*8*64 floats = 6 KiB, above Open MPI's
 * shared-memory eager limit (4 KiB), so sends really wait for their receive. */
static const gpt_config g_cfg = {.n_layer = 3, .n_head = 4, .d_model = 64, .seq_len = 12, .vocab = 64};
enum { BATCH = 3, SEQ = 8, MICRO = 3 };

/* ------------------------------------------------------------ data */
static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}
static float rng_uniform(uint64_t *s) { return (float)rng_next(s) / 2147483648.0f * 2.0f - 1.0f; }

/* Every parameter of the full model, random enough that biases and
 * LayerNorm weights are not at their trivial init (so a bias added twice or
 * never shows). */
static float **full_params_make(uint64_t seed)
{
    size_t np = gpt_num_params(&g_cfg);
    float **p = calloc(np, sizeof *p);
    uint64_t s = seed;
    for (size_t i = 0; i < np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&g_cfg, i, &info);
        p[i] = malloc(sizeof(float) * info.numel);
        float base = info.init == GPT_INIT_ONES ? 1.0f : 0.0f;
        float amp = info.init == GPT_INIT_NORMAL ? 0.15f : 0.1f;
        for (size_t k = 0; k < info.numel; k++) p[i][k] = base + amp * rng_uniform(&s);
    }
    return p;
}

static void full_free(float **p)
{
    if (!p) return;
    for (size_t i = 0; i < gpt_num_params(&g_cfg); i++) free(p[i]);
    free(p);
}

/* tokens/targets for n micro-batches; target -1 at one position of micro-batch 0 */
static void make_batch(int32_t *tok, int32_t *tgt, int n, uint64_t seed)
{
    uint64_t s = seed;
    size_t N = (size_t)n * BATCH * SEQ;
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int32_t)(rng_next(&s) % (uint64_t)g_cfg.vocab);
        tgt[i] = (int32_t)(rng_next(&s) % (uint64_t)g_cfg.vocab);
    }
}

/* module-indexed sets from a per-parameter pointer table (NULL = not held) */
static void sets_from(float **ptr, gpt_tensors *sets)
{
    memset(sets, 0, sizeof(gpt_tensors) * (size_t)gpt_num_modules(&g_cfg));
    for (size_t i = 0; i < gpt_num_params(&g_cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(&g_cfg, i, &info);
        sets[info.module].t[info.index] = ptr[i];
    }
}

/* ------------------------------------------------------------ the parallel rank */
typedef struct mp_rank {
    zero_grid grid;
    zero_comm *embed_group;
    int tp, pp, tp_rank, pp_rank;
    int begin, end;
    tp_param_info *info; /* per full parameter */
    int *held;           /* on this stage */
    tp_workspace *ws;
    zero_comm *cp; /* context parallelism (seq mode), else NULL */
    int cp_size, sp;
} mp_rank;

/* sequence parallelism (sp) and a cp group of cp ranks: seq mode only */
static int mp_setup_seq(mp_rank *r, zero_comm *world, int tp, int pp, pp_schedule kind, int micro, int cp, int sp)
{
    memset(r, 0, sizeof *r);
    MP_TRY(zero_grid_create(world, tp, pp, &r->grid));
    r->cp_size = cp, r->sp = sp;
    if (cp > 1) MP_TRY(tp_cp_groups_create(&r->grid, cp, &r->cp, NULL));
    r->tp = tp, r->pp = pp, r->tp_rank = r->grid.tp_rank, r->pp_rank = r->grid.pp_rank;
    MP_TRY(pp_stage_layers(&g_cfg, pp, r->pp_rank, &r->begin, &r->end));
    MP_TRY(pp_embed_group_create(r->grid.pp, &r->embed_group));
    size_t np = gpt_num_params(&g_cfg);
    r->info = calloc(np, sizeof *r->info);
    r->held = calloc(np, sizeof *r->held);
    for (size_t i = 0; i < np; i++) {
        MP_TRY(tp_param_info_get(&g_cfg, tp, r->tp_rank, i, &r->info[i]));
        r->held[i] = pp_stage_holds(&g_cfg, pp, r->pp_rank, r->info[i].full.module, r->info[i].full.index);
    }
    int slots = pp_slots_needed(kind, micro, pp, r->pp_rank);
    if (kind == PP_1F1B && pp_slots_needed(PP_GPIPE, micro, pp, r->pp_rank) > slots)
        slots = pp_slots_needed(PP_GPIPE, micro, pp, r->pp_rank); /* the same workspace runs both */
    const tp_options o = {NULL, sp, r->cp, NULL};
    MP_TRY(tp_workspace_create_opts(&r->ws, &g_cfg, r->grid.tp, BATCH, SEQ, r->begin, r->end, slots, &o));
    return 0;
}

static int mp_setup(mp_rank *r, zero_comm *world, int tp, int pp, pp_schedule kind, int micro)
{
    return mp_setup_seq(r, world, tp, pp, kind, micro, 1, 0);
}

static void mp_teardown(mp_rank *r)
{
    tp_workspace_destroy(r->ws);
    zero_comm_destroy(r->cp);
    zero_comm_destroy(r->embed_group);
    zero_grid_destroy(&r->grid);
    free(r->info);
    free(r->held);
}

/* shard buffers for the held parameters (sliced from `full`), NULL elsewhere */
static float **shards_make(const mp_rank *r, float **full)
{
    size_t np = gpt_num_params(&g_cfg);
    float **s = calloc(np, sizeof *s);
    for (size_t i = 0; i < np; i++) {
        if (!r->held[i]) continue;
        s[i] = calloc(r->info[i].numel, sizeof(float));
        if (full) tp_param_slice(&r->info[i], r->tp, r->tp_rank, full[i], s[i]);
    }
    return s;
}

/* ------------------------------------------------------------ reference */
static int reference(float **full, const int32_t *tok, const int32_t *tgt, int micro, float **grads, float *loss)
{
    int nm = gpt_num_modules(&g_cfg);
    gpt_tensors *p = malloc(sizeof *p * nm), *g = malloc(sizeof *g * nm);
    sets_from(full, p);
    sets_from(grads, g);
    gpt_workspace *ws = NULL;
    MP_TRY(gpt_workspace_create(&ws, &g_cfg, BATCH, SEQ));
    double sum = 0;
    for (int m = 0; m < micro; m++) {
        float l;
        size_t off = (size_t)m * BATCH * SEQ;
        MP_TRY(gpt_forward(ws, tok + off, tgt + off, p, &l));
        MP_TRY(gpt_backward(ws, 1.0f / micro, p, g));
        sum += l;
    }
    *loss = (float)(sum / micro);
    gpt_workspace_destroy(ws);
    free(p);
    free(g);
    return 0;
}

/* ------------------------------------------------------------ checks */
static void check_slicing(const mp_rank *r, float **full)
{
    for (size_t i = 0; i < gpt_num_params(&g_cfg); i++) {
        const tp_param_info *in = &r->info[i];
        float *back = calloc(in->full.numel, sizeof(float));
        for (int t = 0; t < r->tp; t++) {
            tp_param_info ti;
            CHECK_OK(tp_param_info_get(&g_cfg, r->tp, t, i, &ti));
            CHECK(ti.numel * (ti.split == TP_REPLICATED ? 1 : (size_t)r->tp) == ti.full.numel);
            float *sh = malloc(sizeof(float) * ti.numel);
            tp_param_slice(&ti, r->tp, t, full[i], sh);
            tp_param_unslice(&ti, r->tp, t, sh, back);
            /* the init callback's values: any range of the shard equals that range of the
             * slice of gpt_param_init, without building the full tensor */
            float *init = malloc(sizeof(float) * ti.full.numel), *want = malloc(sizeof(float) * ti.numel);
            float *got = malloc(sizeof(float) * ti.numel);
            gpt_param_init(&g_cfg, &ti.full, 42, init);
            tp_param_slice(&ti, r->tp, t, init, want);
            const size_t w = ti.shape[1], n = ti.numel;
            const size_t ranges[3][2] = {{0, n}, {n > 2 ? 1 : 0, n > 2 ? n - 1 : n}, {w / 2, w / 2 + w + 3 < n ? w / 2 + w + 3 : n}};
            for (int k = 0; k < 3; k++) {
                size_t b = ranges[k][0], e = ranges[k][1];
                CHECK_OK(tp_param_init_range(&ti, r->tp, t, 42, b, e, got));
                CHECK_MSG(memcmp(got, want + b, sizeof(float) * (e - b)) == 0,
                          "%s: tp rank %d: tp_param_init_range [%zu, %zu) is not the slice of gpt_param_init",
                          ti.full.name, t, b, e);
            }
            free(init), free(want), free(got);
            free(sh);
        }
        CHECK_MSG(memcmp(back, full[i], sizeof(float) * in->full.numel) == 0, "%s: slices do not reassemble",
                  in->full.name);
        free(back);
    }
}

/* gradients of the held parameters, gathered to full shape; compare to ref */
static int check_grads(const mp_rank *r, float **shard_grads, float **ref, int bitwise, double *worst)
{
    for (size_t i = 0; i < gpt_num_params(&g_cfg); i++) {
        if (!r->held[i]) continue;
        const tp_param_info *in = &r->info[i];
        float *full = malloc(sizeof(float) * in->full.numel);
        MP_TRY(tp_param_gather(r->grid.tp, in, shard_grads[i], full));
        float maxref = 0;
        for (size_t k = 0; k < in->full.numel; k++) maxref = fabsf(ref[i][k]) > maxref ? fabsf(ref[i][k]) : maxref;
        size_t bad = 0, first = 0;
        for (size_t k = 0; k < in->full.numel; k++) {
            double err = fabs((double)full[k] - ref[i][k]);
            if (maxref > 0 && err / maxref > *worst) *worst = err / maxref;
            int ok = bitwise ? full[k] == ref[i][k] : err <= 2e-5 * maxref + 1e-4 * fabsf(ref[i][k]);
            if (!ok && bad++ == 0) first = k;
        }
        CHECK_MSG(bad == 0, "%s gradient: %zu of %zu elements off, first [%zu] = %.9g vs reference %.9g (max|ref| %g)",
                  in->full.name, bad, in->full.numel, first, full[first], ref[i][first], maxref);
        /* replicated gradients: the same bits on every tp rank */
        if (in->split == TP_REPLICATED && r->tp > 1) {
            float *all = malloc(sizeof(float) * in->numel * (size_t)r->tp);
            MP_TRY(zero_allgather(r->grid.tp, shard_grads[i], all, in->numel, ZERO_F32));
            for (int t = 0; t < r->tp; t++)
                CHECK_MSG(memcmp(all + (size_t)t * in->numel, shard_grads[i], sizeof(float) * in->numel) == 0,
                          "%s: replicated gradient differs between tp rank %d and %d", in->full.name, t, r->tp_rank);
            free(all);
        }
        free(full);
    }
    return 0;
}

static int run_step(mp_rank *r, pp_schedule kind, float **shards, float **grads, const int32_t *tok,
                    const int32_t *tgt, int micro, float *loss)
{
    int nm = gpt_num_modules(&g_cfg);
    gpt_tensors *p = malloc(sizeof *p * nm), *g = malloc(sizeof *g * nm);
    sets_from(shards, p);
    sets_from(grads, g);
    pp_step_args a = {micro, tok, tgt, 1.0f / micro, p, g};
    MP_TRY(pp_train_step(r->ws, r->grid.pp, kind, &a, loss));
    MP_TRY(tp_seq_grad_allreduce(r->ws, g)); /* nothing without sequence parallelism */
    if (r->cp) /* every gradient is this rank's rows' share: the sum over cp is the gradient */
        for (size_t i = 0; i < gpt_num_params(&g_cfg); i++)
            if (r->held[i]) MP_TRY(zero_allreduce(r->cp, grads[i], grads[i], r->info[i].numel, ZERO_F32, ZERO_SUM));
    MP_TRY(pp_tied_grad_allreduce(r->embed_group, &g_cfg, &g[GPT_MODULE_EMBED]));
    free(p);
    free(g);
    return 0;
}

/* Activation checkpointing: the first 2 of the 3 blocks recomputed (so a
 * pipeline has a stage that recomputes and one that does not; under tp the
 * recomputation repeats the forward all-reduce), then the same with their
 * inputs partitioned over tp (each rank keeps 1/tp, all-gathered before the
 * recomputation). The 1F1B gradients and loss are BITWISE those of the same
 * grid without checkpointing (`want`); the workspace holds exactly one block
 * set less per slot and recomputed block, plus the one shared set, and with
 * partitioning 1/tp of each recomputed block's input plus two full staging
 * buffers. */
static size_t r64(size_t x) { return (x + 63) / 64 * 64; }

static int check_checkpointing(mp_rank *r, float **shards, float **want, const int32_t *tok, const int32_t *tgt)
{
    tp_workspace *plain = r->ws;
    int slots = tp_workspace_slots(plain);
    for (int v = 0; v < 2; v++) {
        const gpt_checkpointing ck = {2, 0, v};
        MP_TRY(tp_workspace_create_ckpt(&r->ws, &g_cfg, r->grid.tp, BATCH, SEQ, r->begin, r->end, slots, &ck));
        float **g = shards_make(r, NULL);
        float loss, want_loss;
        if (run_step(r, PP_1F1B, shards, g, tok, tgt, MICRO, &loss)) return 1;
        tp_workspace *ckws = r->ws;
        r->ws = plain;
        float **g0 = shards_make(r, NULL);
        if (run_step(r, PP_1F1B, shards, g0, tok, tgt, MICRO, &want_loss)) return 1;
        CHECK_MSG(loss == want_loss, "checkpointing: loss %.9g vs %.9g without", loss, want_loss);
        for (size_t i = 0; i < gpt_num_params(&g_cfg); i++)
            if (r->held[i]) {
                CHECK_MSG(memcmp(g[i], want[i], sizeof(float) * r->info[i].numel) == 0 &&
                              memcmp(g0[i], want[i], sizeof(float) * r->info[i].numel) == 0,
                          "%s: gradient with checkpointing (partition %d) differs from without (tp %d, pp %d)",
                          r->info[i].full.name, v, r->tp, r->pp);
                free(g[i]), free(g0[i]);
            }
        free(g), free(g0);

        gpt_activation_bytes a0, a1, f1;
        tp_workspace_activation_bytes(plain, &a0);
        tp_workspace_activation_bytes(ckws, &a1);
        MP_TRY(tp_activation_bytes_for(&g_cfg, r->tp, BATCH, SEQ, r->begin, r->end, slots, &ck, &f1));
        const size_t N = BATCH * SEQ, Cf = (size_t)g_cfg.d_model, P = (size_t)r->tp;
        const size_t C = Cf / P, H = 4 * Cf / P, NH = (size_t)g_cfg.n_head / P, L = (size_t)(r->end - r->begin);
        const size_t set = 3 * r64(4 * N * Cf) /* ln1, res2, ln2 */ + r64(4 * N * C) /* atty */ + 4 * r64(4 * N) +
                           r64(12 * N * C) + r64(4 * BATCH * NH * SEQ * SEQ) + 2 * r64(4 * N * H);
        size_t rec = 0;
        for (int l = r->begin; l < r->end; l++) rec += l < ck.blocks;
        const size_t part = (N * Cf + P - 1) / P;
        size_t inputs = a0.inputs;
        if (v && P > 1 && rec)
            inputs = (size_t)slots * ((L + 1 - rec) * r64(4 * N * Cf) + rec * r64(4 * part)) + 2 * r64(4 * P * part);
        CHECK(memcmp(&a1, &f1, sizeof a1) == 0);
        CHECK_MSG(a0.blocks == (size_t)slots * L * set && a0.recompute == 0 &&
                      a0.inputs == (size_t)slots * (L + 1) * r64(4 * N * Cf),
                  "stored block sets: %zu bytes, expected %d slots x %zu blocks x %zu", a0.blocks, slots, L, set);
        CHECK(a1.blocks == a0.blocks - (size_t)slots * rec * set && a1.recompute == (rec ? set : 0));
        CHECK_MSG(a1.inputs == inputs, "kept inputs: %zu bytes, expected %zu (partition %d, tp %zu)", a1.inputs,
                  inputs, v, P);
        CHECK(a1.total == a0.total - a0.blocks - a0.inputs + a1.blocks + a1.recompute + a1.inputs);
        tp_workspace_destroy(ckws);
    }
    return 0;
}

static void check_misuse(mp_rank *r, float **shards)
{
    int b, e;
    CHECK(tp_config_validate(&g_cfg, 3) == ZERO_CONFIG);
    CHECK(strstr(gpt_last_error(), "n_head") != NULL);
    CHECK(pp_stage_layers(&g_cfg, 4, 0, &b, &e) == ZERO_CONFIG);
    gpt_tensors p[5];
    sets_from(shards, p);
    /* the stage's last block before its first one */
    if (r->end - r->begin > 1) {
        CHECK(tp_forward_block(r->ws, 0, r->end - 1, &p[gpt_module_block(r->end - 1)]) == ZERO_INVALID_STATE);
        CHECK(strstr(gpt_last_error(), "out of order") != NULL);
    }
    CHECK(tp_forward_block(r->ws, 99, r->begin, &p[gpt_module_block(r->begin)]) == ZERO_INVALID_ARGUMENT);
}

static int grads_mode(zero_comm *world, int tp, int pp)
{
    mp_rank r;
    if (mp_setup(&r, world, tp, pp, PP_1F1B, MICRO)) return 1;
    size_t np = gpt_num_params(&g_cfg), N = (size_t)MICRO * BATCH * SEQ;
    float **full = full_params_make(11);
    int32_t *tok = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    make_batch(tok, tgt, MICRO, 5);
    tgt[3] = -1; /* an ignored target */

    float **ref = calloc(np, sizeof *ref);
    for (size_t i = 0; i < np; i++) ref[i] = calloc(r.info[i].full.numel, sizeof(float));
    float ref_loss;
    if (reference(full, tok, tgt, MICRO, ref, &ref_loss)) return 1;

    check_slicing(&r, full);
    float **shards = shards_make(&r, full);
    float **g1 = shards_make(&r, NULL), **g2 = shards_make(&r, NULL);
    float l1, l2;
    if (run_step(&r, PP_GPIPE, shards, g1, tok, tgt, MICRO, &l1)) return 1;
    if (run_step(&r, PP_1F1B, shards, g2, tok, tgt, MICRO, &l2)) return 1;

    int exact = tp == 1 && pp == 1;
    double worst = 0;
    if (exact) CHECK_MSG(l1 == ref_loss, "loss %.9g vs reference %.9g (expected bitwise)", l1, ref_loss);
    else CHECK_MSG(fabs(l1 - ref_loss) <= 1e-5 * fabs(ref_loss), "loss %.9g vs reference %.9g", l1, ref_loss);
    if (check_grads(&r, g1, ref, exact, &worst)) return 1;
    CHECK_MSG(l2 == l1, "1F1B loss %.9g vs GPipe %.9g", l2, l1);
    for (size_t i = 0; i < np; i++)
        if (r.held[i])
            CHECK_MSG(memcmp(g1[i], g2[i], sizeof(float) * r.info[i].numel) == 0, "%s: 1F1B gradient differs from GPipe",
                      r.info[i].full.name);
    if (check_checkpointing(&r, shards, g2, tok, tgt)) return 1;
    check_misuse(&r, shards);
    double all_worst = worst;
    MP_TRY(zero_allreduce(world, &worst, &all_worst, 1, ZERO_F64, ZERO_MAX));
    if (g_rank == 0)
        printf("tp %d pp %d: loss %.7f (reference %.7f, rel %.1e), largest gradient error / max|ref| %.2e\n", tp,
               pp, l1, ref_loss, fabs(l1 - ref_loss) / fabs(ref_loss), all_worst);

    for (size_t i = 0; i < np; i++) {
        free(ref[i]);
        free(shards[i]);
        free(g1[i]);
        free(g2[i]);
    }
    free(ref), free(shards), free(g1), free(g2), free(tok), free(tgt);
    full_free(full);
    mp_teardown(&r);
    return 0;
}

/* ------------------------------------------------------------ sequence / context parallelism
 * seq mode (TP PP seq CP SP): Megatron sequence parallelism over tp (SP 1)
 * and/or Ulysses context parallelism over cp ranks (tp_gpt.h), world =
 * TP * CP * PP. Every rank gets the whole micro-batches and takes its rows.
 *   - loss within 1e-5 relative of the single-rank model and every gradient
 *     (after tp_seq_grad_allreduce and the sum over cp) within the tp tests'
 *     tolerance; replicated gradients bitwise equal over tp; 1F1B bitwise GPipe;
 *   - the activation report equals the formula below exactly;
 *   - the comm counters of one step equal the theory exactly: under SP per
 *     block and micro-batch 6 all-gathers and 4 reduce-scatters of Nr x C
 *     floats per rank (S (tp-1)/tp bytes each, S = 4 Nc C), which minus the
 *     2 backward re-gathers is exactly the all-reduce bytes of the same step
 *     without SP (measured); under cp 4 all-to-alls per block and micro-batch
 *     of 3, 1, 1, 3 x 4 B (T/cp) Ca (cp-1) bytes (Ca = C/(tp cp)); plus one
 *     all-reduce of the loss's (sum, count) (2 doubles) per micro-batch on
 *     the last stage, and under SP the partial gradients' all-reduce. */
static void counters_of(zero_comm *c, zero_comm_counters *out)
{
    memset(out, 0, sizeof *out);
    if (c) zero_comm_get_counters(c, out);
}

static uint64_t ar_bytes(size_t count, size_t elem, int n) { return (uint64_t)(2 * count * elem * (size_t)(n - 1) / (size_t)n); }

static int seq_mode(zero_comm *world, int tp, int pp, int cp, int sp)
{
    mp_rank r, plain;
    if (mp_setup_seq(&r, world, tp, pp, PP_1F1B, MICRO, cp, sp)) return 1;
    size_t np = gpt_num_params(&g_cfg), NT = (size_t)MICRO * BATCH * SEQ;
    float **full = full_params_make(11);
    int32_t *tok = malloc(sizeof(int32_t) * NT), *tgt = malloc(sizeof(int32_t) * NT);
    make_batch(tok, tgt, MICRO, 5);
    tgt[3] = -1; /* an ignored target */
    float **ref = calloc(np, sizeof *ref);
    for (size_t i = 0; i < np; i++) ref[i] = calloc(r.info[i].full.numel, sizeof(float));
    float ref_loss, l1, l2;
    if (reference(full, tok, tgt, MICRO, ref, &ref_loss)) return 1;
    float **shards = shards_make(&r, full), **g1 = shards_make(&r, NULL), **g2 = shards_make(&r, NULL);
    if (run_step(&r, PP_GPIPE, shards, g1, tok, tgt, MICRO, &l1)) return 1;
    if (run_step(&r, PP_1F1B, shards, g2, tok, tgt, MICRO, &l2)) return 1;
    double worst = 0;
    CHECK_MSG(fabs(l1 - ref_loss) <= 1e-5 * fabs(ref_loss), "loss %.9g vs reference %.9g", l1, ref_loss);
    if (check_grads(&r, g1, ref, 0, &worst)) return 1;
    CHECK_MSG(l2 == l1, "1F1B loss %.9g vs GPipe %.9g", l2, l1);
    for (size_t i = 0; i < np; i++)
        if (r.held[i])
            CHECK_MSG(memcmp(g1[i], g2[i], sizeof(float) * r.info[i].numel) == 0, "%s: 1F1B gradient differs from GPipe",
                      r.info[i].full.name);

    /* activation checkpointing (blocks 0-1 recomputed; the recomputation repeats SP's gathers and
     * cp's all-to-alls): bitwise the 1F1B gradients without it */
    {
        tp_workspace *plain_ws = r.ws;
        const gpt_checkpointing ck = {2, 0, 0};
        const tp_options co = {&ck, sp, r.cp, NULL};
        MP_TRY(tp_workspace_create_opts(&r.ws, &g_cfg, r.grid.tp, BATCH, SEQ, r.begin, r.end,
                                        tp_workspace_slots(plain_ws), &co));
        float **gc = shards_make(&r, NULL);
        float lc;
        if (run_step(&r, PP_1F1B, shards, gc, tok, tgt, MICRO, &lc)) return 1;
        CHECK_MSG(lc == l2, "checkpointing: loss %.9g vs %.9g without", lc, l2);
        for (size_t i = 0; i < np; i++)
            if (r.held[i]) {
                CHECK_MSG(memcmp(gc[i], g2[i], sizeof(float) * r.info[i].numel) == 0,
                          "%s: gradient with checkpointing differs from without (tp %d cp %d sp %d)",
                          r.info[i].full.name, tp, cp, sp);
                free(gc[i]);
            }
        free(gc);
        tp_workspace_destroy(r.ws);
        r.ws = plain_ws;
    }

    /* activation memory: the formula, exactly */
    const size_t B = BATCH, T = SEQ, C = (size_t)g_cfg.d_model, V = (size_t)g_cfg.vocab, P = (size_t)tp,
                 Q = (size_t)cp, L = (size_t)(r.end - r.begin), S = (size_t)tp_workspace_slots(r.ws);
    const size_t N = B * T, Nc = N / Q, Nr = sp ? Nc / P : Nc, Cl = C / P, Hl = 4 * C / P, Ca = Cl / Q;
    const size_t NHa = (size_t)g_cfg.n_head / (P * Q), head = r.end == g_cfg.n_layer;
    const size_t set = 3 * r64(4 * Nr * C) + 4 * r64(4 * Nr) + r64(12 * Nc * Cl) + r64(4 * B * NHa * T * T) +
                       r64(4 * Nc * Cl) + 2 * r64(4 * Nc * Hl);
    gpt_activation_bytes a, base;
    tp_workspace_activation_bytes(r.ws, &a);
    const tp_options none = {NULL, 0, NULL, NULL};
    MP_TRY(tp_activation_bytes_opts(&g_cfg, tp, 1, BATCH, SEQ, r.begin, r.end, (int)S, &none, &base));
    CHECK_MSG(a.blocks == S * L * set, "blocks: %zu bytes, formula %zu", a.blocks, S * L * set);
    CHECK_MSG(a.inputs == S * (L + 1) * r64(4 * Nr * C), "inputs: %zu bytes, formula %zu", a.inputs,
              S * (L + 1) * r64(4 * Nr * C));
    const size_t want_head = S * (2 * r64(4 * Nr) + (head ? r64(4 * Nr * C) + 3 * r64(4 * Nr) + r64(4 * Nr * V) : 0));
    CHECK_MSG(a.head == want_head, "head: %zu bytes, formula %zu", a.head, want_head);
    /* scratch: the tp workspace's with its row counts changed, plus SP's gather buffer and cp's three */
    const size_t sc_rows = r64(4 * Nr * C) + r64(4 * Nc * C) + r64(12 * Nc * Cl) + r64(4 * Nc * Hl) + (head ? r64(4 * Nr * V) : 0);
    const size_t sc_base = r64(4 * N * C) * 2 + r64(12 * N * Cl) + r64(4 * N * Hl) + (head ? r64(4 * N * V) : 0);
    const size_t want_sc = base.scratch - sc_base + sc_rows + (sp ? r64(4 * Nc * C) : 0) +
                           (Q > 1 ? 2 * r64(12 * Nc * Cl) + r64(4 * Nc * Cl) : 0);
    CHECK_MSG(a.scratch == want_sc, "scratch: %zu bytes, formula %zu", a.scratch, want_sc);
    CHECK(a.total == a.inputs + a.blocks + a.head + a.scratch);

    /* communication of one 1F1B step, from the counters */
    int nm = gpt_num_modules(&g_cfg);
    gpt_tensors *ps = malloc(sizeof *ps * nm), *gs = malloc(sizeof *gs * nm);
    float **g3 = shards_make(&r, NULL);
    sets_from(shards, ps);
    sets_from(g3, gs);
    pp_step_args sa = {MICRO, tok, tgt, 1.0f / MICRO, ps, gs};
    zero_comm_counters t0, c0, t1, t2;
    float l3;
    zero_comm_reset_counters(r.grid.tp);
    if (r.cp) zero_comm_reset_counters(r.cp);
    MP_TRY(pp_train_step(r.ws, r.grid.pp, PP_1F1B, &sa, &l3));
    counters_of(r.grid.tp, &t0);
    counters_of(r.cp, &c0);
    MP_TRY(tp_seq_grad_allreduce(r.ws, gs));
    counters_of(r.grid.tp, &t1);
    const uint64_t M = MICRO, unit = 4 * Nr * C * (P - 1); /* one SP all-gather or reduce-scatter */
    const uint64_t loss_tp = sp && head ? M * ar_bytes(2, 8, tp) : 0;
    if (sp) {
        CHECK_MSG(t0.bytes_sent[ZERO_OP_ALLGATHER] == M * L * 6 * unit, "SP all-gather bytes %llu, theory %llu",
                  (unsigned long long)t0.bytes_sent[ZERO_OP_ALLGATHER], (unsigned long long)(M * L * 6 * unit));
        CHECK_MSG(t0.bytes_sent[ZERO_OP_REDUCE_SCATTER] == M * L * 4 * unit, "SP reduce-scatter bytes %llu, theory %llu",
                  (unsigned long long)t0.bytes_sent[ZERO_OP_REDUCE_SCATTER], (unsigned long long)(M * L * 4 * unit));
        CHECK_MSG(t0.bytes_sent[ZERO_OP_ALLREDUCE] == loss_tp, "SP all-reduce bytes in the step %llu, theory %llu",
                  (unsigned long long)t0.bytes_sent[ZERO_OP_ALLREDUCE], (unsigned long long)loss_tp);
        uint64_t grad_ar = 0; /* the LayerNorms, and wte / wpe / ln_f where held */
        for (size_t i = 0; i < np; i++) {
            const gpt_param_info *f = &r.info[i].full;
            int partial = f->module == GPT_MODULE_EMBED || f->module == gpt_module_final(&g_cfg) ||
                          f->index == GPT_LN1_W || f->index == GPT_LN1_B || f->index == GPT_LN2_W || f->index == GPT_LN2_B;
            if (r.held[i] && partial) grad_ar += ar_bytes(f->numel, 4, tp);
        }
        uint64_t got = t1.bytes_sent[ZERO_OP_ALLREDUCE] - t0.bytes_sent[ZERO_OP_ALLREDUCE];
        CHECK_MSG(got == grad_ar, "tp_seq_grad_allreduce bytes %llu, theory %llu", (unsigned long long)got,
                  (unsigned long long)grad_ar);
    }
    if (cp > 1) {
        const uint64_t a2a = M * L * 8 * 4 * B * (T / Q) * Ca * (Q - 1);
        CHECK_MSG(c0.bytes_sent[ZERO_OP_ALLTOALL] == a2a && c0.calls[ZERO_OP_ALLTOALL] == M * L * 4,
                  "cp all-to-all bytes %llu in %llu calls, theory %llu in %llu",
                  (unsigned long long)c0.bytes_sent[ZERO_OP_ALLTOALL], (unsigned long long)c0.calls[ZERO_OP_ALLTOALL],
                  (unsigned long long)a2a, (unsigned long long)(M * L * 4));
        const uint64_t loss_cp = head ? M * ar_bytes(2, 8, cp) : 0;
        CHECK_MSG(c0.bytes_sent[ZERO_OP_ALLREDUCE] == loss_cp, "cp all-reduce bytes %llu, theory %llu",
                  (unsigned long long)c0.bytes_sent[ZERO_OP_ALLREDUCE], (unsigned long long)loss_cp);
        CHECK(c0.bytes_sent[ZERO_OP_ALLGATHER] + c0.bytes_sent[ZERO_OP_REDUCE_SCATTER] == 0);
    }
    /* the same step without SP / cp (tp only, the same tp group) on the same rows: its all-reduce bytes */
    uint64_t tp_ar = 0;
    if (sp) {
        if (mp_setup_seq(&plain, world, tp, pp, PP_1F1B, MICRO, cp, 0)) return 1;
        float **g4 = shards_make(&plain, NULL);
        sets_from(g4, gs);
        zero_comm_reset_counters(plain.grid.tp);
        MP_TRY(pp_train_step(plain.ws, plain.grid.pp, PP_1F1B, &sa, &l3));
        counters_of(plain.grid.tp, &t2);
        tp_ar = t2.bytes_sent[ZERO_OP_ALLREDUCE];
        CHECK_MSG(tp_ar == M * L * 4 * ar_bytes(Nc * C, 4, tp), "tp all-reduce bytes %llu, theory %llu",
                  (unsigned long long)tp_ar, (unsigned long long)(M * L * 4 * ar_bytes(Nc * C, 4, tp)));
        uint64_t sp_bytes = t0.bytes_sent[ZERO_OP_ALLGATHER] + t0.bytes_sent[ZERO_OP_REDUCE_SCATTER] - M * L * 2 * unit;
        CHECK_MSG(sp_bytes == tp_ar, "SP all-gather + reduce-scatter bytes less the re-gathers %llu != tp's all-reduce "
                  "bytes %llu", (unsigned long long)sp_bytes, (unsigned long long)tp_ar);
        for (size_t i = 0; i < np; i++) free(g4[i]);
        free(g4);
        mp_teardown(&plain);
    }
    double all_worst = worst;
    MP_TRY(zero_allreduce(world, &worst, &all_worst, 1, ZERO_F64, ZERO_MAX));
    if (g_rank == 0)
        printf("tp %d pp %d cp %d sp %d: loss %.7f (reference %.7f, rel %.1e), largest gradient error / max|ref| %.2e; "
               "rank 0 activations %zu bytes (stored %zu; tp-only %zu, stored %zu); step bytes sent: tp all-gather "
               "%llu, reduce-scatter %llu, all-reduce %llu (+%llu gradients; tp-only all-reduce %llu), cp "
               "all-to-all %llu\n",
               tp, pp, cp, sp, l1, ref_loss, fabs(l1 - ref_loss) / fabs(ref_loss), all_worst, a.total,
               a.inputs + a.blocks + a.head, base.total, base.inputs + base.blocks + base.head,
               (unsigned long long)t0.bytes_sent[ZERO_OP_ALLGATHER],
               (unsigned long long)t0.bytes_sent[ZERO_OP_REDUCE_SCATTER],
               (unsigned long long)t0.bytes_sent[ZERO_OP_ALLREDUCE],
               (unsigned long long)(t1.bytes_sent[ZERO_OP_ALLREDUCE] - t0.bytes_sent[ZERO_OP_ALLREDUCE]),
               (unsigned long long)tp_ar, (unsigned long long)c0.bytes_sent[ZERO_OP_ALLTOALL]);

    /* refusals by name */
    tp_workspace *bad = NULL;
    const tp_options sp1 = {NULL, 1, NULL, NULL};
    if (tp == 1) {
        CHECK(tp_workspace_create_opts(&bad, &g_cfg, r.grid.tp, BATCH, SEQ, r.begin, r.end, 1, &sp1) == ZERO_CONFIG);
        CHECK(strstr(gpt_last_error(), "sequence parallelism needs a tp group") != NULL);
    } else {
        CHECK(tp_workspace_split_backward(r.ws) == (sp || cp > 1 ? ZERO_UNSUPPORTED : ZERO_OK));
    }
    if (r.cp) {
        const tp_options o = {NULL, 0, r.cp, NULL};
        CHECK(tp_workspace_create_opts(&bad, &g_cfg, r.grid.tp, BATCH, 6, r.begin, r.end, 1, &o) ==
              (6 % cp ? ZERO_CONFIG : ZERO_OK));
        tp_workspace_destroy(bad);
    }
    for (size_t i = 0; i < np; i++) free(ref[i]), free(shards[i]), free(g1[i]), free(g2[i]), free(g3[i]);
    free(ref), free(shards), free(g1), free(g2), free(g3), free(tok), free(tgt), free(ps), free(gs);
    full_free(full);
    mp_teardown(&r);
    return 0;
}

/* ------------------------------------------------------------ a stage leaves */
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* The last stage leaves after the set-up; the first stage's pipeline step
 * fails within the deadline with a message naming the transfer and stage. */
static int dead_mode(zero_comm *world)
{
    const int n = zero_comm_get_size(world);
    mp_rank r;
    if (mp_setup(&r, world, 1, n, PP_GPIPE, MICRO)) return 1;
    if (r.pp_rank == n - 1) {
        mp_teardown(&r);
        return 0;
    }
    const double deadline = 1.0;
    MP_TRY(zero_comm_set_timeout(r.grid.pp, deadline)); /* only now: a loaded machine cannot trip the set-up */
    float **full = full_params_make(3);
    float **shards = shards_make(&r, full), **grads = shards_make(&r, NULL);
    size_t N = (size_t)MICRO * BATCH * SEQ;
    int32_t *tok = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    make_batch(tok, tgt, MICRO, 9);
    gpt_tensors p[5], g[5];
    sets_from(shards, p);
    sets_from(grads, g);
    pp_step_args a = {MICRO, tok, tgt, 1.0f / MICRO, p, g};
    double t0 = now_s();
    zero_status st = pp_train_step(r.ws, r.grid.pp, PP_GPIPE, &a, NULL);
    double dt = now_s() - t0;
    CHECK_MSG(st == ZERO_TIMEOUT || st == ZERO_PEER_FAILURE, "pp_train_step returned %s: %s", zero_status_name(st),
              gpt_last_error());
    CHECK_MSG(strstr(gpt_last_error(), "pipeline") && strstr(gpt_last_error(), "at stage"),
              "the message names neither the transfer nor the stage: %s", gpt_last_error());
    CHECK_MSG(dt < deadline + 3.0, "failed after %.2f s for a %.1f s deadline", dt, deadline);
    fprintf(stderr, "[rank %d] expected failure after %.2f s: %s\n", g_rank, dt, gpt_last_error());
    t0 = now_s();
    for (size_t i = 0; i < gpt_num_params(&g_cfg); i++) free(shards[i]), free(grads[i]);
    free(shards), free(grads), free(tok), free(tgt);
    full_free(full);
    mp_teardown(&r);
    CHECK_MSG(now_s() - t0 < 10.0, "teardown took %.2f s", now_s() - t0);
    return 0;
}

/* ------------------------------------------------------------ engine mode */
static int engine_mode(zero_comm *world, int tp, int pp, int stage, int steps, double clip)
{
    mp_rank r;
    if (mp_setup(&r, world, tp, pp, PP_1F1B, MICRO)) return 1;
    const int dp = r.grid.dp_size, dp_rank = r.grid.dp_rank, nm = gpt_num_modules(&g_cfg);
    const size_t np = gpt_num_params(&g_cfg), per = (size_t)MICRO * BATCH * SEQ;
    float **full = full_params_make(23);
    zero_device *dev = NULL;
    MP_TRY(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));

    /* the parallel engine: this stage's tp shards, over the dp group */
    zero_config zc = ZERO_CONFIG_INIT;
    zc.stage = stage;
    zc.lr = 1e-2;
    zc.weight_decay = 0.1;
    zc.stage3_param_persistence_threshold = 1u << 30; /* stage 3: every module stays gathered (tp_engine.h) */
    zc.gradient_clipping = clip;

    /* tp_engine_build without init tables: the shards of gpt_param_init(seed), computed by each rank */
    {
        zero_engine *e0 = NULL;
        int *pid0 = calloc(np, sizeof *pid0), *mod0 = calloc((size_t)nm, sizeof *mod0);
        MP_TRY(zero_engine_create(&e0, &zc, r.grid.dp, dev));
        MP_TRY(tp_engine_build(e0, &g_cfg, tp, r.tp_rank, pp, r.pp_rank, 42, NULL, pid0, mod0));
        for (size_t i = 0; i < np; i++) {
            CHECK(r.held[i] == (pid0[i] >= 0));
            if (!r.held[i]) continue;
            float *want = malloc(sizeof(float) * r.info[i].full.numel), *got = NULL;
            float *sh = malloc(sizeof(float) * r.info[i].numel);
            gpt_param_init(&g_cfg, &r.info[i].full, 42, want);
            tp_param_slice(&r.info[i], tp, r.tp_rank, want, sh);
            MP_TRY(zero_engine_param_data(e0, pid0[i], (void **)&got));
            CHECK_MSG(memcmp(got, sh, sizeof(float) * r.info[i].numel) == 0, "%s: registered shard is not the slice",
                      r.info[i].full.name);
            free(want), free(sh);
        }
        for (int m = 0; m < nm; m++) CHECK((mod0[m] >= 0) == (m == GPT_MODULE_EMBED ? r.held[0] || r.held[1] : r.held[gpt_param_position(&g_cfg, m, 0)]));
        zero_engine_destroy(e0);
        free(pid0), free(mod0);
    }
    zero_engine *e = NULL;
    MP_TRY(zero_engine_create(&e, &zc, r.grid.dp, dev));
    int *pid = calloc(np, sizeof *pid), *mod = calloc((size_t)nm, sizeof *mod);
    char name[32];
    MP_TRY(tp_engine_build(e, &g_cfg, tp, r.tp_rank, pp, r.pp_rank, 0, (const float *const *)full, pid, mod));
    /* the global norm over dp x (tp x pp); replicated copies counted once */
    zero_comm *mpg = NULL;
    MP_TRY(tp_engine_mp_create(world, &r.grid, &mpg));
    CHECK(zero_comm_get_size(mpg) == tp * pp);
    MP_TRY(zero_engine_set_model_parallel(e, mpg));
    int clipped = 0;

    /* the reference: a world-1 engine over the full model on every rank */
    zero_comm *self = NULL;
    MP_TRY(zero_comm_split(world, zero_comm_get_rank(world), 0, &self));
    zero_config rc = zc;
    rc.stage = 0;
    rc.gradient_accumulation_steps = dp * MICRO;
    zero_engine *re = NULL;
    MP_TRY(zero_engine_create(&re, &rc, self, dev));
    int *rpid = calloc(np, sizeof *rpid), rmod;
    for (int m = 0; m < nm; m++) MP_TRY(zero_engine_add_module(re, gpt_module_name(&g_cfg, m, name, sizeof name), &rmod));
    for (size_t i = 0; i < np; i++) {
        gpt_param_info in = r.info[i].full;
        int64_t shape[2] = {(int64_t)in.shape[0], (int64_t)in.shape[1]};
        MP_TRY(zero_engine_add_param(re, in.module, in.name, in.ndim, shape, full[i], &rpid[i]));
    }
    MP_TRY(zero_engine_finalize(re));
    gpt_workspace *rws = NULL;
    MP_TRY(gpt_workspace_create(&rws, &g_cfg, BATCH, SEQ));

    int32_t *tok = malloc(sizeof(int32_t) * per * dp), *tgt = malloc(sizeof(int32_t) * per * dp);
    float **pp_ptr = calloc(np, sizeof *pp_ptr);
    gpt_tensors *ps = malloc(sizeof *ps * nm), *gs = malloc(sizeof *gs * nm);
    float **rp = calloc(np, sizeof *rp), **rg = calloc(np, sizeof *rg);
    gpt_tensors *rps = malloc(sizeof *rps * nm), *rgs = malloc(sizeof *rgs * nm);
    double worst = 0;
    for (int s = 0; s < steps; s++) {
        /* the same batch every step, so the loss falls; dp rank d takes micro-batches d*M .. d*M+M-1 */
        make_batch(tok, tgt, MICRO * dp, 100);
        /* parallel: pointers are fetched every step (stages 2-3 reallocate gradients) */
        MP_TRY(tp_engine_sets(e, &g_cfg, pid, ps, gs));
        pp_step_args a = {MICRO, tok + dp_rank * per, tgt + dp_rank * per, 1.0f / MICRO, ps, gs};
        float loss;
        MP_TRY(pp_train_step(r.ws, r.grid.pp, PP_1F1B, &a, &loss));
        MP_TRY(pp_tied_grad_allreduce(r.embed_group, &g_cfg, &gs[GPT_MODULE_EMBED]));
        MP_TRY(tp_engine_grads_ready(e, &g_cfg, mod));
        zero_step_result res;
        MP_TRY(zero_engine_step(e, &res));
        float mean = 0;
        MP_TRY(zero_allreduce(r.grid.dp, &loss, &mean, 1, ZERO_F32, ZERO_SUM));
        mean /= (float)dp;

        /* reference: dp x M micro-steps of the full model */
        double rsum = 0;
        for (int k = 0; k < dp * MICRO; k++) {
            for (size_t i = 0; i < np; i++) {
                MP_TRY(zero_engine_param_data(re, rpid[i], (void **)&rp[i]));
                MP_TRY(zero_engine_param_grad(re, rpid[i], (void **)&rg[i]));
            }
            sets_from(rp, rps);
            sets_from(rg, rgs);
            float l;
            MP_TRY(gpt_forward(rws, tok + (size_t)k * BATCH * SEQ, tgt + (size_t)k * BATCH * SEQ, rps, &l));
            MP_TRY(gpt_backward(rws, 1.0f, rps, rgs));
            for (int m = 0; m < nm; m++) MP_TRY(zero_engine_grads_ready(re, m));
            rsum += l;
        }
        zero_step_result rres;
        MP_TRY(zero_engine_step(re, &rres));
        /* the same norm as the full model, and bitwise the same on every rank of the world */
        double nrel = fabs(res.grad_norm - rres.grad_norm) / rres.grad_norm;
        CHECK_MSG(nrel <= 1e-5, "step %d: grad norm %.9g vs single-rank %.9g", s, res.grad_norm, rres.grad_norm);
        CHECK_MSG(fabs(res.clip_coef - rres.clip_coef) <= 1e-5 * rres.clip_coef, "step %d: clip coef %.9g vs %.9g",
                  s, res.clip_coef, rres.clip_coef);
        {
            int W = zero_comm_get_size(world);
            double *norms = malloc(sizeof(double) * (size_t)W);
            MP_TRY(zero_allgather(world, &res.grad_norm, norms, 1, ZERO_F64));
            for (int w = 0; w < W; w++)
                CHECK_MSG(memcmp(&norms[w], &res.grad_norm, sizeof(double)) == 0,
                          "step %d: grad norm on world rank %d (%.17g) differs from rank %d's (%.17g)", s, w, norms[w],
                          g_rank, res.grad_norm);
            free(norms);
        }
        clipped += rres.clip_coef < 1.0;
        if (g_rank == 0)
            printf("step %d: grad norm %.9g single-rank %.9g (rel %.1e) clip %.4f\n", s, res.grad_norm, rres.grad_norm,
                   nrel, res.clip_coef);
        float rloss = (float)(rsum / (dp * MICRO));
        double rel = fabs(mean - rloss) / fabs(rloss);
        worst = rel > worst ? rel : worst;
        CHECK_MSG(rel <= 2e-5, "step %d: loss %.9g vs single-rank %.9g", s, mean, rloss);
        if (g_rank == 0) printf("step %d: loss %.7f  single-rank %.7f  rel %.1e\n", s, mean, rloss, rel);
    }
    /* the copies that must stay in sync did */
    for (size_t i = 0; i < np; i++) {
        if (!r.held[i]) continue;
        MP_TRY(zero_engine_param_data(e, pid[i], (void **)&pp_ptr[i]));
        size_t n = r.info[i].numel;
        if (r.info[i].split == TP_REPLICATED && tp > 1) {
            float *all = malloc(sizeof(float) * n * tp);
            MP_TRY(zero_allgather(r.grid.tp, pp_ptr[i], all, n, ZERO_F32));
            for (int t = 0; t < tp; t++)
                CHECK_MSG(memcmp(all + (size_t)t * n, pp_ptr[i], sizeof(float) * n) == 0,
                          "%s: tp ranks %d and %d diverged", r.info[i].full.name, t, r.tp_rank);
            free(all);
        }
        if (r.embed_group && r.info[i].full.module == GPT_MODULE_EMBED && r.info[i].full.index == GPT_WTE) {
            float *both = malloc(sizeof(float) * n * 2);
            MP_TRY(zero_allgather(r.embed_group, pp_ptr[i], both, n, ZERO_F32));
            CHECK_MSG(memcmp(both, both + n, sizeof(float) * n) == 0, "wte copies of the first and last stage diverged");
            free(both);
        }
    }
    if (clip > 0) CHECK_MSG(clipped == steps, "clipping engaged in %d of %d steps (clip %g too large)", clipped, steps, clip);
    if (g_rank == 0)
        printf("tp %d pp %d dp %d stage %d clip %g: %d steps, worst loss rel %.1e\n", tp, pp, dp, stage, clip, steps,
               worst);

    gpt_workspace_destroy(rws);
    zero_engine_destroy(re);
    zero_engine_destroy(e);
    zero_comm_destroy(mpg);
    zero_comm_destroy(self);
    zero_device_destroy(dev);
    free(pid), free(rpid), free(mod), free(tok), free(tgt), free(pp_ptr), free(rp), free(rg);
    free(rps), free(rgs), free(ps), free(gs);
    full_free(full);
    mp_teardown(&r);
    return 0;
}

/* ------------------------------------------------------------ overflow mode */
/* fp16 engines over the grid's dp group, one small tensor per rank: world
 * rank 1 (tp rank 1 of dp rank 0 when TP > 1) writes an inf into its
 * gradient. With the mp group every rank of the world skips the step and
 * lowers its scale; without it (the control) only that rank's dp group does.
 * First, on one rank: a duplicate parameter is left out of the norm exactly. */
static int overflow_mode(zero_comm *world, int tp, int pp)
{
    zero_grid grid;
    MP_TRY(zero_grid_create(world, tp, pp, &grid));
    zero_comm *mpg = NULL;
    MP_TRY(tp_engine_mp_create(world, &grid, &mpg));
    zero_device *dev = NULL;
    MP_TRY(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));
    const int W = zero_comm_get_size(world);
    {
        /* duplicates leave the norm exactly: a (grads 1) and b (grads 2) share a bucket; with b
         * a duplicate the norm is sqrt(4) = 2, without sqrt(4 + 16); a bad id names itself */
        zero_comm *self = NULL;
        MP_TRY(zero_comm_split(world, g_rank, 0, &self));
        zero_config zc = ZERO_CONFIG_INIT;
        zc.stage = 1;
        zero_engine *e = NULL;
        int mod, pa, pb;
        int64_t shape[1] = {4};
        MP_TRY(zero_engine_create(&e, &zc, self, dev));
        MP_TRY(zero_engine_add_module(e, "m", &mod));
        MP_TRY(zero_engine_add_param(e, mod, "a", 1, shape, NULL, &pa));
        MP_TRY(zero_engine_add_param(e, mod, "b", 1, shape, NULL, &pb));
        MP_TRY(zero_engine_set_param_duplicate(e, pb, 1));
        MP_TRY(zero_engine_finalize(e));
        CHECK(zero_engine_set_param_duplicate(e, 7, 1) == ZERO_INVALID_ARGUMENT &&
              strstr(zero_engine_last_error(e), "parameter 7") != NULL);
        for (int dup = 1; dup >= 0; dup--) {
            MP_TRY(zero_engine_set_param_duplicate(e, pb, dup));
            float *ga = NULL, *gb = NULL;
            MP_TRY(zero_engine_param_grad(e, pa, (void **)&ga));
            MP_TRY(zero_engine_param_grad(e, pb, (void **)&gb));
            for (int i = 0; i < 4; i++) ga[i] = 1.0f, gb[i] = 2.0f;
            MP_TRY(zero_engine_grads_ready(e, mod));
            zero_step_result res;
            MP_TRY(zero_engine_step(e, &res));
            CHECK_MSG(res.grad_norm == (dup ? 2.0 : sqrt(20.0)), "duplicate=%d: grad norm %.17g", dup, res.grad_norm);
        }
        zero_engine_destroy(e);
        zero_comm_destroy(self);
    }
    for (int with_mp = 1; with_mp >= 0; with_mp--) {
        zero_config zc = ZERO_CONFIG_INIT;
        zc.stage = 2;
        zc.compute_dtype = ZERO_F16;
        zc.hysteresis = 1;
        zero_engine *e = NULL;
        int mod, pid;
        int64_t shape[1] = {16};
        float init[16];
        for (int i = 0; i < 16; i++) init[i] = 0.01f * (float)i;
        MP_TRY(zero_engine_create(&e, &zc, grid.dp, dev));
        MP_TRY(zero_engine_add_module(e, "m", &mod));
        MP_TRY(zero_engine_add_param(e, mod, "w", 1, shape, init, &pid));
        MP_TRY(zero_engine_finalize(e));
        if (with_mp) MP_TRY(zero_engine_set_model_parallel(e, mpg));
        uint16_t *g = NULL;
        MP_TRY(zero_engine_param_grad(e, pid, (void **)&g));
        for (int i = 0; i < 16; i++) g[i] = 0x3c00; /* 1.0 */
        if (g_rank == 1) g[5] = 0x7c00;             /* +inf */
        MP_TRY(zero_engine_grads_ready(e, mod));
        zero_step_result res;
        MP_TRY(zero_engine_step(e, &res));
        int *skipped = malloc(sizeof(int) * (size_t)W);
        MP_TRY(zero_allgather(world, &res.skipped, skipped, 1, ZERO_I32));
        for (int w = 0; w < W; w++) {
            /* world rank w shares rank 1's dp group when its pp and tp ranks match rank 1's */
            int same_dp_group = (w % tp == 1 % tp) && (w / (W / pp) == 1 / (W / pp));
            int want = with_mp || same_dp_group;
            CHECK_MSG(skipped[w] == want, "%s mp group: world rank %d skipped=%d, expected %d",
                      with_mp ? "with" : "without", w, skipped[w], want);
        }
        if (res.skipped) CHECK(res.next_loss_scale == res.loss_scale / 2);
        if (g_rank == 0)
            printf("overflow on world rank 1, %s mp group: skipped on ranks", with_mp ? "with" : "without");
        for (int w = 0; w < W && g_rank == 0; w++)
            if (skipped[w]) printf(" %d", w);
        if (g_rank == 0) printf("\n");
        free(skipped);
        zero_engine_destroy(e);
    }
    zero_device_destroy(dev);
    zero_comm_destroy(mpg);
    zero_grid_destroy(&grid);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_model_parallel TP PP [engine STAGE STEPS]\n");
        return 2;
    }
    int tp = atoi(argv[1]), pp = atoi(argv[2]);
    zero_comm *world = NULL;
    if (zero_comm_create_world(&world, NULL) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    g_rank = zero_comm_get_rank(world);
    check_set_rank(g_rank);
    int rc;
    if (argc > 3 && strcmp(argv[3], "dead") == 0)
        rc = dead_mode(world);
    else if (argc > 3 && strcmp(argv[3], "engine") == 0)
        rc = engine_mode(world, tp, pp, argc > 4 ? atoi(argv[4]) : 1, argc > 5 ? atoi(argv[5]) : 4,
                         argc > 6 ? atof(argv[6]) : 0.0);
    else if (argc > 3 && strcmp(argv[3], "seq") == 0)
        rc = seq_mode(world, tp, pp, argc > 4 ? atoi(argv[4]) : 1, argc > 5 ? atoi(argv[5]) : 0);
    else if (argc > 3 && strcmp(argv[3], "overflow") == 0)
        rc = overflow_mode(world, tp, pp);
    else
        rc = grads_mode(world, tp, pp);
    zero_comm_destroy(world);
    return rc ? 1 : check_exit();
}
