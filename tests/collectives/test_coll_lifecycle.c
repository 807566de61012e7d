/* MPI's lifetime: libzero initialises MPI only when nobody did, and then
 * finalizes it when the last comm descending from its worlds is destroyed;
 * an application that initialised MPI keeps it.
 *   test_coll_lifecycle ours | user */
#include <mpi.h>
#include <zero/comm.h>

#include "check.h"

static int finalized(void)
{
    int f = 0;
    MPI_Finalized(&f);
    return f;
}

static void expect_sum(zero_comm *c)
{
    int one = 1, n = 0;
    CHECK_OK(zero_allreduce(c, &one, &n, 1, ZERO_I32, ZERO_SUM));
    CHECK(n == zero_comm_get_size(c));
}

int main(int argc, char **argv)
{
    int user = argc > 1 && !strcmp(argv[1], "user");
    if (user) {
        int provided;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    }
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.backend = ZERO_BACKEND_MPI;
    cfg.timeout_s = 30;
    zero_comm *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(zero_comm_create_world(&a, &cfg));
    CHECK_OK(zero_comm_create_world(&b, &cfg));
    if (!a || !b) return check_exit();
    check_set_rank(zero_comm_get_rank(a));
    CHECK_OK(zero_comm_split(b, 0, 0, &c));
    zero_comm_destroy(a);
    CHECK(!finalized());
    expect_sum(b);
    zero_comm_destroy(b);
    CHECK(!finalized()); /* the split still needs MPI */
    expect_sum(c);
    zero_comm_destroy(c);
    if (user) {
        CHECK(!finalized());
        MPI_Finalize();
    } else {
        CHECK(finalized());
        zero_comm *d = NULL;
        CHECK(zero_comm_create_world(&d, &cfg) == ZERO_INVALID_STATE && d == NULL);
        CHECK(strstr(zero_last_error(), "already finalized") != NULL);
    }
    return check_exit();
}
