/* The Megatron grid: world = pp x dp x tp, tp varying fastest.
 *   world_rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank
 * Each of the three groups is a split in which only that coordinate varies. */
#include "comm_internal.h"

#include <stdio.h>
#include <string.h>

void zero_grid_destroy(zero_grid *grid)
{
    if (!grid) return;
    zero_comm_destroy(grid->tp);
    zero_comm_destroy(grid->dp);
    zero_comm_destroy(grid->pp);
    grid->tp = grid->dp = grid->pp = NULL;
}

static zero_status grid_split(zero_comm *world, int color, int key, const char *what, int a, int b,
                              const char *an, const char *bn, zero_comm **out)
{
    ZERO_TRY(zero_comm_split(world, color, key, out));
    char name[COLL_NAME_MAX];
    /* "dp(pp0,tp1)": which slice of the grid this group is. */
    snprintf(name, sizeof name, "%s(%s%d,%s%d)", what, an, a, bn, b);
    return zero_comm_set_name(*out, name);
}

zero_status zero_grid_create(zero_comm *world, int tp_size, int pp_size, zero_grid *out)
{
    if (!out) return zero_fail(world ? &world->err : NULL, ZERO_INVALID_ARGUMENT, "zero_grid_create: out is NULL");
    memset(out, 0, sizeof *out);
    if (!world) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_grid_create: world comm is NULL");
    int n = world->size;
    if (tp_size < 1 || pp_size < 1 || n % tp_size != 0 || (n / tp_size) % pp_size != 0)
        return zero_fail(&world->err, ZERO_INVALID_ARGUMENT,
                         "zero_grid_create on group %s(size %d): tp %d x pp %d does not divide the group size",
                         world->name, n, tp_size, pp_size);
    int tp = tp_size, pp = pp_size, dp = n / (tp * pp), r = world->rank;
    out->tp_size = tp;
    out->dp_size = dp;
    out->pp_size = pp;
    out->tp_rank = r % tp;
    out->dp_rank = (r / tp) % dp;
    out->pp_rank = r / (tp * dp);

    zero_status st;
    st = grid_split(world, out->pp_rank * dp + out->dp_rank, out->tp_rank, "tp", out->pp_rank, out->dp_rank, "pp",
                    "dp", &out->tp);
    if (st == ZERO_OK)
        st = grid_split(world, out->pp_rank * tp + out->tp_rank, out->dp_rank, "dp", out->pp_rank, out->tp_rank,
                        "pp", "tp", &out->dp);
    if (st == ZERO_OK)
        st = grid_split(world, out->dp_rank * tp + out->tp_rank, out->pp_rank, "pp", out->dp_rank, out->tp_rank,
                        "dp", "tp", &out->pp);
    if (st != ZERO_OK) {
        zero_fail_forward(&world->err, st, "zero_grid_create: ");
        zero_grid_destroy(out);
        return st;
    }
    return ZERO_OK;
}
