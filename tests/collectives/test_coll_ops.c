/* Every op x dtype x in-place variant x count against a reference computed
 * on this rank, compared bitwise; byte counters checked exactly after each.
 * Runs at world sizes 1-4 (AUTO: MPI, or LOCAL at size 1); `local` or `mpi`
 * as argument forces that backend, `algo=p2p|nbc` the MPI algorithm and
 * `seg=BYTES` the reduce-scatter segment budget. */
#include <zero/comm.h>

#include "check.h"
#include "coll_util.h"

static zero_comm *comm;
static int rank, size;
static int all_ranks[64];

static void test_allreduce(zero_dtype d, zero_redop op, size_t count, int in_place)
{
    size_t es = zero_dtype_size(d);
    char what[128];
    snprintf(what, sizeof what, "allreduce %s %s count %zu%s", zero_dtype_name(d), op == ZERO_MAX ? "max" : "sum",
             count, in_place ? " in place" : "");
    void *send = malloc(count * es), *recv = malloc(count * es), *want = malloc(count * es);
    coll_fill(d, send, count, rank, 0);
    for (size_t i = 0; i < count; i++) coll_ref_reduce(d, op, all_ranks, size, i, want, i);
    zero_comm_counters before;
    zero_comm_get_counters(comm, &before);
    void *out = in_place ? send : recv;
    CHECK_OK(zero_allreduce(comm, send, out, count, d, op));
    coll_expect_equal(out, want, count, d, what);
    uint64_t S = count * es, v = size > 1 ? 2 * S * (uint64_t)(size - 1) / (uint64_t)size : 0;
    coll_check_counters(comm, &before, ZERO_OP_ALLREDUCE, v, v, what);
    if (!in_place) {
        /* send is input only */
        void *orig = malloc(count * es);
        coll_fill(d, orig, count, rank, 0);
        coll_expect_equal(send, orig, count, d, "allreduce left send unchanged");
        free(orig);
    }
    /* The test's data must be able to tell round-once from round-per-step. */
    if ((d == ZERO_BF16 || d == ZERO_F16) && op == ZERO_SUM && size >= 3 && count >= 1000) {
        size_t differ = 0;
        for (size_t i = 0; i < count; i++) differ += ((uint16_t *)want)[i] != coll_round_per_step(d, size, i);
        CHECK_MSG(differ > count / 100, "%s: data tells round-once from per-step at only %zu elements", what, differ);
    }
    free(send), free(recv), free(want);
}

static void test_reduce_scatter(zero_dtype d, zero_redop op, size_t count, int in_place)
{
    size_t es = zero_dtype_size(d), total = count * (size_t)size;
    char what[128];
    snprintf(what, sizeof what, "reduce_scatter %s %s count %zu%s", zero_dtype_name(d),
             op == ZERO_MAX ? "max" : "sum", count, in_place ? " in place" : "");
    char *send = malloc(total * es), *recv = malloc(count * es), *want = malloc(count * es);
    coll_fill(d, send, total, rank, 0);
    for (size_t i = 0; i < count; i++) coll_ref_reduce(d, op, all_ranks, size, (size_t)rank * count + i, want, i);
    zero_comm_counters before;
    zero_comm_get_counters(comm, &before);
    char *out = in_place ? send + (size_t)rank * count * es : recv;
    CHECK_OK(zero_reduce_scatter(comm, send, out, count, d, op));
    coll_expect_equal(out, want, count, d, what);
    uint64_t v = (uint64_t)count * es * (uint64_t)(size - 1);
    coll_check_counters(comm, &before, ZERO_OP_REDUCE_SCATTER, v, v, what);
    /* Other chunks of send are left as they were (MPI and LOCAL). */
    char *orig = malloc(total * es);
    coll_fill(d, orig, total, rank, 0);
    for (int r = 0; r < size; r++)
        if (!in_place || r != rank)
            coll_expect_equal(send + (size_t)r * count * es, orig + (size_t)r * count * es, count, d,
                              "reduce_scatter left the other chunks of send unchanged");
    free(orig);
    free(send), free(recv), free(want);
}

static void test_allgather(zero_dtype d, size_t count, int in_place)
{
    size_t es = zero_dtype_size(d), total = count * (size_t)size;
    char what[128];
    snprintf(what, sizeof what, "allgather %s count %zu%s", zero_dtype_name(d), count, in_place ? " in place" : "");
    char *send = malloc(count * es), *recv = malloc(total * es), *want = malloc(total * es);
    for (int r = 0; r < size; r++) coll_fill(d, want + (size_t)r * count * es, count, r, 0);
    memset(recv, 0xA5, total * es);
    const char *in = send;
    if (in_place) {
        in = recv + (size_t)rank * count * es;
        coll_fill(d, (char *)in, count, rank, 0);
    } else {
        coll_fill(d, send, count, rank, 0);
    }
    zero_comm_counters before;
    zero_comm_get_counters(comm, &before);
    CHECK_OK(zero_allgather(comm, in, recv, count, d));
    coll_expect_equal(recv, want, total, d, what);
    uint64_t v = (uint64_t)count * es * (uint64_t)(size - 1);
    coll_check_counters(comm, &before, ZERO_OP_ALLGATHER, v, v, what);
    free(send), free(recv), free(want);
}

static void test_broadcast(zero_dtype d, size_t count, int root, int in_place)
{
    size_t es = zero_dtype_size(d);
    char what[128];
    snprintf(what, sizeof what, "broadcast %s count %zu root %d%s", zero_dtype_name(d), count, root,
             in_place ? " in place" : "");
    char *send = malloc(count * es), *recv = malloc(count * es), *want = malloc(count * es);
    coll_fill(d, want, count, root, 0);
    coll_fill(d, send, count, rank, 0);
    memset(recv, 0x5A, count * es);
    zero_comm_counters before;
    zero_comm_get_counters(comm, &before);
    char *out = in_place ? send : recv;
    /* Non-roots pass NULL send: only the root's is read. */
    CHECK_OK(zero_broadcast(comm, rank == root ? send : NULL, out, count, d, root));
    coll_expect_equal(out, want, count, d, what);
    uint64_t S = count * es;
    coll_check_counters(comm, &before, ZERO_OP_BROADCAST, size > 1 && rank == root ? S : 0,
                        size > 1 && rank != root ? S : 0, what);
    free(send), free(recv), free(want);
}

static void test_sendrecv(zero_dtype d, size_t count)
{
    if (size < 2) return;
    size_t es = zero_dtype_size(d);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    char what[128];
    snprintf(what, sizeof what, "send/recv ring %s count %zu", zero_dtype_name(d), count);
    char *send = malloc(count * es), *recv = malloc(count * es), *want = malloc(count * es);
    coll_fill(d, send, count, rank, 0);
    coll_fill(d, want, count, prev, 0);
    zero_comm_counters before;
    zero_comm_get_counters(comm, &before);
    /* A ring with blocking sends could deadlock on large messages: post the
     * receive first, asynchronously. */
    zero_request *rr = NULL, *sr = NULL;
    CHECK_OK(zero_recv_async(comm, recv, count, d, prev, &rr));
    CHECK_OK(zero_send_async(comm, send, count, d, next, &sr));
    CHECK_OK(zero_wait(sr));
    CHECK_OK(zero_wait(rr));
    coll_expect_equal(recv, want, count, d, what);
    coll_check_counters(comm, &before, ZERO_OP_SEND, count * es, 0, what);
    /* Blocking pair between ranks 0 and 1. */
    if (rank == 0) CHECK_OK(zero_send(comm, send, count, d, 1));
    if (rank == 1) {
        CHECK_OK(zero_recv(comm, recv, count, d, 0));
        void *w0 = malloc(count * es);
        coll_fill(d, w0, count, 0, 0);
        coll_expect_equal(recv, w0, count, d, "blocking send/recv 0 -> 1");
        free(w0);
    }
    free(send), free(recv), free(want);
}

int main(int argc, char **argv)
{
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 30;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "local")) cfg.backend = ZERO_BACKEND_LOCAL;
        if (!strcmp(argv[i], "mpi")) cfg.backend = ZERO_BACKEND_MPI; /* even at world size 1 */
        /* algo=p2p|nbc: force the MPI backend's algorithm; seg=BYTES: cut
         * reduce-scatters into small segments (both read at first use) */
        if (!strncmp(argv[i], "algo=", 5)) setenv("ZERO_COLL_MPI_ALGO", argv[i] + 5, 1);
        if (!strncmp(argv[i], "seg=", 4)) setenv("ZERO_COLL_SEG_BYTES", argv[i] + 4, 1);
    }
    zero_status st = zero_comm_create_world(&comm, &cfg);
    if (st != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    rank = zero_comm_get_rank(comm);
    size = zero_comm_get_size(comm);
    check_set_rank(zero_comm_get_world_rank(comm));
    for (int r = 0; r < size; r++) all_ranks[r] = r;
    if (cfg.backend == ZERO_BACKEND_LOCAL) CHECK(zero_comm_get_backend(comm) == ZERO_BACKEND_LOCAL && size == 1);
    if (cfg.backend == ZERO_BACKEND_MPI) CHECK(zero_comm_get_backend(comm) == ZERO_BACKEND_MPI);
    if (cfg.backend == ZERO_BACKEND_AUTO)
        CHECK(zero_comm_get_backend(comm) == (size > 1 ? ZERO_BACKEND_MPI : ZERO_BACKEND_LOCAL));

    const size_t counts[] = {1, 7, 1009, 16411}; /* 16411: several segments at seg=256K */
    for (int di = 0; di < COLL_NDTYPES; di++) {
        zero_dtype d = coll_all_dtypes[di];
        for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
            size_t n = counts[ci];
            for (int ip = 0; ip < 2; ip++) {
                test_allreduce(d, ZERO_SUM, n, ip);
                test_allreduce(d, ZERO_MAX, n, ip);
                test_reduce_scatter(d, ZERO_SUM, n, ip);
                test_reduce_scatter(d, ZERO_MAX, n, ip);
                test_allgather(d, n, ip);
                test_broadcast(d, n, 0, ip);
                test_broadcast(d, n, size - 1, ip);
            }
            test_sendrecv(d, n);
        }
    }
    /* A large op per 16-bit and 32-bit float: several MB, many pipeline steps. */
    test_allreduce(ZERO_BF16, ZERO_SUM, (1u << 20) + 3, 0);
    test_allreduce(ZERO_F32, ZERO_SUM, (1u << 20) + 3, 1);
    test_reduce_scatter(ZERO_F16, ZERO_SUM, (1u << 18) + 1, 1);
    test_allgather(ZERO_F32, (1u << 18) + 1, 1);

    /* Count 0 completes everywhere without traffic; barrier counts calls only. */
    zero_comm_counters before, after;
    zero_comm_get_counters(comm, &before);
    CHECK_OK(zero_allreduce(comm, NULL, NULL, 0, ZERO_F32, ZERO_SUM));
    CHECK_OK(zero_barrier(comm));
    zero_comm_get_counters(comm, &after);
    CHECK(after.calls[ZERO_OP_BARRIER] == before.calls[ZERO_OP_BARRIER] + 1);
    CHECK(after.bytes_sent[ZERO_OP_ALLREDUCE] == before.bytes_sent[ZERO_OP_ALLREDUCE]);
    zero_comm_reset_counters(comm);
    zero_comm_get_counters(comm, &after);
    CHECK(after.calls[ZERO_OP_ALLREDUCE] == 0 && after.bytes_sent[ZERO_OP_ALLGATHER] == 0);

    zero_comm_destroy(comm);
    return check_exit();
}
