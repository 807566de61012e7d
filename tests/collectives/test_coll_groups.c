/* Split groups and the Megatron grid: rank formulas, membership, and ops on
 * a sub-group involving exactly its members. */
#include <zero/comm.h>

#include "check.h"
#include "coll_util.h"

static int64_t sum_world_ranks(zero_comm *g)
{
    int64_t mine = zero_comm_get_world_rank(g), out = -1;
    CHECK_OK(zero_allreduce(g, &mine, &out, 1, ZERO_I64, ZERO_SUM));
    return out;
}

static void test_split(zero_comm *world)
{
    int r = zero_comm_get_rank(world), n = zero_comm_get_size(world);
    /* even/odd, ordered by descending parent rank (key = -rank) */
    zero_comm *g = NULL;
    CHECK_OK(zero_comm_split(world, r % 2, -r, &g));
    if (!g) return;
    int members = 0, pos = 0;
    int64_t want = 0;
    for (int q = n - 1; q >= 0; q--)
        if (q % 2 == r % 2) {
            if (q == r) pos = members;
            CHECK(zero_comm_get_world_rank_of(g, members) == q);
            members++;
            want += q;
        }
    CHECK_MSG(zero_comm_get_size(g) == members, "size %d, expected %d", zero_comm_get_size(g), members);
    CHECK_MSG(zero_comm_get_rank(g) == pos, "rank %d, expected %d", zero_comm_get_rank(g), pos);
    CHECK(zero_comm_get_world_rank(g) == r);
    CHECK(strncmp(zero_comm_get_name(g), "world/split(", 12) == 0);
    CHECK(zero_comm_get_timeout(g) == zero_comm_get_timeout(world));
    CHECK(sum_world_ranks(g) == want);

    /* An op on the sub-group moves nothing on the parent's counters. */
    zero_comm_counters wc;
    zero_comm_reset_counters(world);
    float x[64];
    coll_fill(ZERO_F32, x, 64, r, 0);
    CHECK_OK(zero_allreduce(g, x, x, 64, ZERO_F32, ZERO_SUM));
    zero_comm_get_counters(world, &wc);
    CHECK(wc.calls[ZERO_OP_ALLREDUCE] == 0 && wc.bytes_sent[ZERO_OP_ALLREDUCE] == 0);

    /* A split of the split; ties in key order by parent rank. */
    zero_comm *h = NULL;
    CHECK_OK(zero_comm_split(g, 0, 0, &h));
    CHECK(h && zero_comm_get_size(h) == members && zero_comm_get_rank(h) == pos);
    zero_comm_destroy(h);
    /* The parent goes first: the child must keep working. */
    zero_comm_destroy(g);
}

static void test_grid(zero_comm *world, int tp, int pp)
{
    int r = zero_comm_get_rank(world), n = zero_comm_get_size(world), dp = n / (tp * pp);
    zero_grid grid;
    CHECK_OK(zero_grid_create(world, tp, pp, &grid));
    if (!grid.tp) return;
    CHECK(grid.tp_size == tp && grid.pp_size == pp && grid.dp_size == dp);
    CHECK(grid.pp_rank * dp * tp + grid.dp_rank * tp + grid.tp_rank == r);
    CHECK(grid.tp_rank == r % tp && grid.dp_rank == (r / tp) % dp && grid.pp_rank == r / (tp * dp));
    CHECK(zero_comm_get_size(grid.tp) == tp && zero_comm_get_rank(grid.tp) == grid.tp_rank);
    CHECK(zero_comm_get_size(grid.dp) == dp && zero_comm_get_rank(grid.dp) == grid.dp_rank);
    CHECK(zero_comm_get_size(grid.pp) == pp && zero_comm_get_rank(grid.pp) == grid.pp_rank);
    int64_t wtp = 0, wdp = 0, wpp = 0;
    for (int t = 0; t < tp; t++) {
        int w = grid.pp_rank * dp * tp + grid.dp_rank * tp + t;
        CHECK(zero_comm_get_world_rank_of(grid.tp, t) == w);
        wtp += w;
    }
    for (int d = 0; d < dp; d++) {
        int w = grid.pp_rank * dp * tp + d * tp + grid.tp_rank;
        CHECK(zero_comm_get_world_rank_of(grid.dp, d) == w);
        wdp += w;
    }
    for (int p = 0; p < pp; p++) {
        int w = p * dp * tp + grid.dp_rank * tp + grid.tp_rank;
        CHECK(zero_comm_get_world_rank_of(grid.pp, p) == w);
        wpp += w;
    }
    CHECK_MSG(sum_world_ranks(grid.tp) == wtp, "tp=%d pp=%d: tp group members", tp, pp);
    CHECK_MSG(sum_world_ranks(grid.dp) == wdp, "tp=%d pp=%d: dp group members", tp, pp);
    CHECK_MSG(sum_world_ranks(grid.pp) == wpp, "tp=%d pp=%d: pp group members", tp, pp);
    CHECK(!strncmp(zero_comm_get_name(grid.tp), "tp(", 3) && !strncmp(zero_comm_get_name(grid.dp), "dp(", 3));
    zero_grid_destroy(&grid);
    CHECK(grid.tp == NULL && grid.dp == NULL && grid.pp == NULL);
    zero_grid_destroy(&grid); /* a zeroed grid is accepted */
}

int main(void)
{
    zero_comm *world = NULL;
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 30;
    if (zero_comm_create_world(&world, &cfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    check_set_rank(zero_comm_get_rank(world));
    int n = zero_comm_get_size(world);
    test_split(world);
    for (int tp = 1; tp <= n; tp++)
        for (int pp = 1; tp * pp <= n; pp++)
            if (n % (tp * pp) == 0) test_grid(world, tp, pp);
    zero_comm_destroy(world);
    return check_exit();
}
