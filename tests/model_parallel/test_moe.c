/* The MoE FFN (model/moe.h) under expert parallelism against the
 * single-rank layer, on real ranks: the world is the ep group (np 1, 2, 4).
 *
 * Every rank builds the same full model (all E experts) and every rank's
 * tokens from seeds, then
 *   - runs the EP layer on its own tokens with its E/P experts;
 *   - runs the single-rank layer (ep NULL, all experts) on each rank's
 *     tokens in turn, accumulating the reference gradients.
 * Asserted: the routing (expert, slot, dropped) is identical; outputs, d x,
 * this rank's expert gradients and the router's gradient summed over ranks
 * equal the reference within 2e-6 * max|ref| (the same kernels; only the
 * expert weight gradients' sums over rows are split differently).
 * Also, on each rank: the capacity rule recomputed here from the layer's
 * probabilities (slots by choice rank, then token; over capacity = dropped),
 * the aux loss by its formula, and a token whose every choice was dropped
 * comes out exactly as its residual input. Configurations: top-1 with
 * dropping, top-2 with dropping, top-2 unlimited. And the ep comm's byte
 * counters over a forward and a backward equal the volumes the routing
 * implies (rows to and from other ranks x C x 4 bytes per exchange). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zero/comm.h>

#include "check.h"
#include "moe.h"
#include "moe_layer_test.h"

static int rank, size;
static zero_comm *world;

static void expect_close(const float *got, const float *want, size_t n, const char *what)
{
    float scale = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) scale = fabsf(want[i]) > scale ? fabsf(want[i]) : scale;
    for (size_t i = 0; i < n; i++)
        if (fabsf(got[i] - want[i]) > worst) worst = fabsf(got[i] - want[i]), at = i;
    CHECK_MSG(worst <= 2e-6f * (scale > 1e-30f ? scale : 1e-30f), "%s: |diff| %.3g at %zu (max|ref| %.3g)", what,
              (double)worst, at, (double)scale);
}

/* The capacity rule and the aux loss, recomputed from the layer's own
 * probabilities (recomputed here from x and the gate in double: the
 * top-k of well-separated random logits is the same). */
static void check_rule(gpt_moe *m, const gpt_moe_config *c, const float *x, const float *gate, int N,
                       const float *init, const float *out, float aux)
{
    int E = c->experts, K = c->top_k, C = c->d_model, cap = gpt_moe_capacity(m);
    double want_cap = c->capacity_factor > 0 ? ceil((double)c->capacity_factor * K * N / E) : N;
    CHECK_MSG(cap == (int)want_cap, "capacity %d, formula %g", cap, want_cap);
    gpt_moe_routing r;
    gpt_moe_get_routing(m, &r);
    double *p = malloc(sizeof(double) * (size_t)N * E);
    int *sel = malloc(sizeof(int) * (size_t)N * K), *count = calloc((size_t)E, sizeof(int));
    for (int n = 0; n < N; n++) {
        double mx = -1e300, s = 0;
        for (int e = 0; e < E; e++) {
            double v = 0;
            for (int k = 0; k < C; k++) v += (double)x[n * C + k] * gate[e * C + k];
            p[n * E + e] = v;
            mx = v > mx ? v : mx;
        }
        for (int e = 0; e < E; e++) s += p[n * E + e] = exp(p[n * E + e] - mx);
        for (int e = 0; e < E; e++) p[n * E + e] /= s;
        for (int i = 0; i < K; i++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < i; j++) taken |= sel[n * K + j] == e;
                if (!taken && (best < 0 || p[n * E + e] > p[n * E + best])) best = e;
            }
            sel[n * K + i] = best;
        }
    }
    long dropped = 0;
    for (int i = 0; i < K; i++)
        for (int n = 0; n < N; n++) {
            int e = sel[n * K + i], want_slot = count[e] < cap ? count[e]++ : -1;
            dropped += want_slot < 0;
            CHECK_MSG(r.expert[n * K + i] == e && r.slot[n * K + i] == want_slot,
                      "token %d choice %d: layer says expert %d slot %d, the rule expert %d slot %d", n, i,
                      r.expert[n * K + i], r.slot[n * K + i], e, want_slot);
        }
    CHECK_MSG(r.dropped == dropped, "dropped %ld, the rule %ld", r.dropped, dropped);
    double want_aux = 0;
    for (int e = 0; e < E; e++) {
        double f = 0, pe = 0;
        for (int n = 0; n < N; n++) f += sel[n * K] == e, pe += p[n * E + e];
        want_aux += (f / N) * (pe / N);
    }
    want_aux *= E;
    CHECK_MSG(fabs(aux - want_aux) <= 1e-5 * want_aux, "aux loss %.8g, formula %.8g", (double)aux, want_aux);
    /* a token with every choice dropped passes through unchanged */
    for (int n = 0; n < N; n++) {
        int kept = 0;
        for (int i = 0; i < K; i++) kept += r.slot[n * K + i] >= 0;
        if (!kept) CHECK_MSG(!memcmp(out + n * C, init + n * C, sizeof(float) * C), "dropped token %d changed", n);
    }
    free(p), free(sel), free(count);
}

static void run_case(int E, int K, float cf, int N)
{
    gpt_moe_config c = {.d_model = 24, .d_ff = 40, .experts = E, .top_k = K, .capacity_factor = cf,
                        .aux_loss_coef = 0.01f};
    int C = c.d_model;
    moe_test_model ref, ep;
    moe_test_model_alloc(&ref, &c, 1);
    moe_test_model_alloc(&ep, &c, 1);
    size_t NC = (size_t)N * C;
    float *x, *init, *dout;
    moe_test_tokens(&c, N, size, &x, &init, &dout);
    float *out_ref = malloc(NC * 4), *dx_ref = malloc(NC * 4), *out = malloc(NC * 4), *dx = malloc(NC * 4);
    int32_t *rexp = malloc(sizeof(int32_t) * N * K), *rslot = malloc(sizeof(int32_t) * N * K);
    long rdrop = 0;
    /* rows[s][d]: kept choices rank s sends to rank d (every rank's routing is known here) */
    long *rows = calloc((size_t)size * size, sizeof *rows);

    /* reference: the single-rank layer over every rank's tokens */
    gpt_moe *one = NULL;
    CHECK_OK(gpt_moe_create(&one, &c, N, NULL));
    gpt_moe_params p, g;
    moe_test_view(&ref, &c, 0, &p, &g);
    for (int r = 0; r < size; r++) {
        float aux = 0, *o = malloc(NC * 4), *d = malloc(NC * 4);
        CHECK_OK(gpt_moe_forward(one, x + r * NC, init + r * NC, o, &p, &aux));
        gpt_moe_routing all;
        gpt_moe_get_routing(one, &all);
        for (int q = 0; q < N * K; q++)
            if (all.slot[q] >= 0) rows[r * size + all.expert[q] / (E / size)]++;
        if (r == rank) {
            check_rule(one, &c, x + r * NC, ref.gate, N, init + r * NC, o, aux);
            gpt_moe_routing rt;
            gpt_moe_get_routing(one, &rt);
            memcpy(rexp, rt.expert, sizeof(int32_t) * N * K);
            memcpy(rslot, rt.slot, sizeof(int32_t) * N * K);
            rdrop = rt.dropped;
            memcpy(out_ref, o, NC * 4);
        }
        CHECK_OK(gpt_moe_backward(one, 1.0f, x + r * NC, dout + r * NC, d, &p, &g));
        if (r == rank) memcpy(dx_ref, d, NC * 4);
        free(o), free(d);
    }
    gpt_moe_destroy(one);

    /* expert parallel */
    gpt_moe *m = NULL;
    CHECK_OK(gpt_moe_create(&m, &c, N, world));
    int first = 0, El = 0;
    gpt_moe_local_experts(m, &first, &El);
    CHECK(first == rank * (E / size) && El == E / size);
    moe_test_view(&ep, &c, first, &p, &g);
    float aux = 0;
    zero_comm_counters c0, c1, c2;
    CHECK_OK(zero_comm_get_counters(world, &c0));
    CHECK_OK(gpt_moe_forward(m, x + rank * NC, init + rank * NC, out, &p, &aux));
    CHECK_OK(zero_comm_get_counters(world, &c1));
    gpt_moe_routing rt;
    gpt_moe_get_routing(m, &rt);
    CHECK_MSG(!memcmp(rt.expert, rexp, sizeof(int32_t) * N * K) && !memcmp(rt.slot, rslot, sizeof(int32_t) * N * K) &&
                  rt.dropped == rdrop,
              "EP routing differs from the single-rank layer's");
    CHECK_OK(gpt_moe_backward(m, 1.0f, x + rank * NC, dout + rank * NC, dx, &p, &g));
    CHECK_OK(zero_comm_get_counters(world, &c2));
    /* comm volume = theory: forward = counts (El int32 to each peer) + dispatch (rows to other ranks) +
     * combine (rows from other ranks, sent back); backward = the same two exchanges of gradients */
    uint64_t out_rows = 0, in_rows = 0;
    for (int d = 0; d < size; d++)
        if (d != rank) out_rows += (uint64_t)rows[rank * size + d], in_rows += (uint64_t)rows[d * size + rank];
    uint64_t v = 4ull * (uint64_t)C * (out_rows + in_rows), cnt = size > 1 ? 4ull * (E / size) * (size - 1) : 0;
    CHECK_MSG(c1.bytes_sent[ZERO_OP_ALLTOALLV] - c0.bytes_sent[ZERO_OP_ALLTOALLV] == v &&
                  c1.bytes_recv[ZERO_OP_ALLTOALLV] - c0.bytes_recv[ZERO_OP_ALLTOALLV] == v,
              "forward all-to-all-v bytes %llu sent / %llu received, theory %llu",
              (unsigned long long)(c1.bytes_sent[ZERO_OP_ALLTOALLV] - c0.bytes_sent[ZERO_OP_ALLTOALLV]),
              (unsigned long long)(c1.bytes_recv[ZERO_OP_ALLTOALLV] - c0.bytes_recv[ZERO_OP_ALLTOALLV]),
              (unsigned long long)v);
    CHECK_MSG(c1.bytes_sent[ZERO_OP_ALLTOALL] - c0.bytes_sent[ZERO_OP_ALLTOALL] == cnt,
              "row-count all-to-all: %llu bytes, theory %llu",
              (unsigned long long)(c1.bytes_sent[ZERO_OP_ALLTOALL] - c0.bytes_sent[ZERO_OP_ALLTOALL]),
              (unsigned long long)cnt);
    CHECK_MSG(c2.bytes_sent[ZERO_OP_ALLTOALLV] - c1.bytes_sent[ZERO_OP_ALLTOALLV] == v &&
                  c2.calls[ZERO_OP_ALLTOALL] == c1.calls[ZERO_OP_ALLTOALL],
              "backward: all-to-all-v bytes %llu, theory %llu (and no count exchange)",
              (unsigned long long)(c2.bytes_sent[ZERO_OP_ALLTOALLV] - c1.bytes_sent[ZERO_OP_ALLTOALLV]),
              (unsigned long long)v);
    char what[96];
    snprintf(what, sizeof what, "E %d top-%d cf %g ep %d: ", E, K, (double)cf, size);
    char w2[160];
    snprintf(w2, sizeof w2, "%soutput", what);
    expect_close(out, out_ref, NC, w2);
    snprintf(w2, sizeof w2, "%sd x", what);
    expect_close(dx, dx_ref, NC, w2);
    size_t H = c.d_ff, e0 = (size_t)first;
    snprintf(w2, sizeof w2, "%sd fc_w", what);
    expect_close(g.fc_w, ref.g_fc_w + e0 * H * C, (size_t)El * H * C, w2);
    snprintf(w2, sizeof w2, "%sd fc_b", what);
    expect_close(g.fc_b, ref.g_fc_b + e0 * H, (size_t)El * H, w2);
    snprintf(w2, sizeof w2, "%sd proj_w", what);
    expect_close(g.proj_w, ref.g_proj_w + e0 * C * H, (size_t)El * C * H, w2);
    snprintf(w2, sizeof w2, "%sd proj_b", what);
    expect_close(g.proj_b, ref.g_proj_b + e0 * C, (size_t)El * C, w2);
    /* the router is dense: its gradient is the sum over the ranks' tokens */
    CHECK_OK(zero_allreduce(world, ep.g_gate, ep.g_gate, (size_t)E * C, ZERO_F32, ZERO_SUM));
    snprintf(w2, sizeof w2, "%sd gate (summed over ranks)", what);
    expect_close(ep.g_gate, ref.g_gate, (size_t)E * C, w2);
    if (rank == 0)
        fprintf(stderr, "%scapacity %d, %ld of %d choices dropped on rank 0\n", what, gpt_moe_capacity(m), rt.dropped,
                N * K);
    gpt_moe_destroy(m);
    moe_test_model_free(&ref), moe_test_model_free(&ep);
    free(x), free(init), free(dout), free(out_ref), free(dx_ref), free(out), free(dx), free(rexp), free(rslot);
    free(rows);
}

int main(void)
{
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 30;
    if (zero_comm_create_world(&world, &cfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    rank = zero_comm_get_rank(world), size = zero_comm_get_size(world);
    check_set_rank(rank);
    run_case(4, 1, 1.0f, 32);  /* Switch: top-1, drops */
    run_case(8, 2, 1.0f, 48);  /* top-2, drops */
    run_case(4, 2, 0.0f, 20);  /* top-2, unlimited */
    zero_comm_destroy(world);
    return check_exit();
}
