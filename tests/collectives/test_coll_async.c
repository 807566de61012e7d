/* Asynchronous ops: several outstanding requests on one comm and on two
 * comms, progressed with zero_test, completed with zero_wait; counters equal
 * the sum of the documented volumes exactly. */
#include <zero/comm.h>

#include "check.h"
#include "coll_util.h"

#define NA 4099
#define NR 1031
#define NG 517

int main(void)
{
    zero_comm *world = NULL, *other = NULL;
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 30;
    if (zero_comm_create_world(&world, &cfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    int r = zero_comm_get_rank(world), n = zero_comm_get_size(world);
    check_set_rank(r);
    CHECK_OK(zero_comm_split(world, 0, r, &other));
    int ranks[64];
    for (int i = 0; i < n; i++) ranks[i] = i;

    float *a = malloc(NA * 4), *wa = malloc(NA * 4);
    uint16_t *rs_in = malloc((size_t)NR * n * 2), *rs_out = malloc(NR * 2), *wrs = malloc(NR * 2);
    int32_t *ag_in = malloc(NG * 4), *ag_out = malloc((size_t)NG * n * 4), *wag = malloc((size_t)NG * n * 4);
    double *b = malloc(NA * 8), *wb = malloc(NA * 8);
    int64_t *o = malloc(NA * 8), *wo = malloc(NA * 8);
    coll_fill(ZERO_F32, a, NA, r, 0);
    coll_fill(ZERO_BF16, rs_in, (size_t)NR * n, r, 0);
    coll_fill(ZERO_I32, ag_in, NG, r, 0);
    coll_fill(ZERO_F64, b, NA, r, 0);
    coll_fill(ZERO_I64, o, NA, r, 0);
    for (size_t i = 0; i < NA; i++) coll_ref_reduce(ZERO_F32, ZERO_SUM, ranks, n, i, wa, i);
    for (size_t i = 0; i < NR; i++) coll_ref_reduce(ZERO_BF16, ZERO_SUM, ranks, n, (size_t)r * NR + i, wrs, i);
    for (int q = 0; q < n; q++) coll_fill(ZERO_I32, wag + (size_t)q * NG, NG, q, 0);
    coll_fill(ZERO_F64, wb, NA, n - 1, 0);
    for (size_t i = 0; i < NA; i++) coll_ref_reduce(ZERO_I64, ZERO_MAX, ranks, n, i, wo, i);

    zero_comm_reset_counters(world);
    zero_request *req[5] = {0};
    CHECK_OK(zero_allreduce_async(world, a, a, NA, ZERO_F32, ZERO_SUM, &req[0]));
    CHECK_OK(zero_reduce_scatter_async(world, rs_in, rs_out, NR, ZERO_BF16, ZERO_SUM, &req[1]));
    CHECK_OK(zero_allreduce_async(other, o, o, NA, ZERO_I64, ZERO_MAX, &req[2]));
    CHECK_OK(zero_allgather_async(world, ag_in, ag_out, NG, ZERO_I32, &req[3]));
    CHECK_OK(zero_broadcast_async(world, b, b, NA, ZERO_F64, n - 1, &req[4]));

    /* Progress them all with zero_test until every one reports done. */
    int pending = 5, polls = 0;
    int done[5] = {0};
    while (pending && polls < 10000000) {
        for (int i = 0; i < 5; i++) {
            if (done[i]) continue;
            CHECK_OK(zero_test(req[i], &done[i]));
            if (done[i]) pending--;
        }
        polls++;
    }
    CHECK_MSG(pending == 0, "%d requests still pending after %d polls", pending, polls);
    int again = 0;
    CHECK_OK(zero_test(req[0], &again)); /* a done request stays done */
    CHECK(again == 1);
    for (int i = 0; i < 5; i++) CHECK_OK(zero_wait(req[i]));
    CHECK_OK(zero_wait(NULL));

    CHECK(coll_first_diff(a, wa, NA, 4) < 0);
    CHECK(coll_first_diff(rs_out, wrs, NR, 2) < 0);
    CHECK(coll_first_diff(ag_out, wag, (size_t)NG * n, 4) < 0);
    CHECK(coll_first_diff(b, wb, NA, 8) < 0);
    CHECK(coll_first_diff(o, wo, NA, 8) < 0);

    /* Counters: exactly the documented volumes, per comm. */
    zero_comm_counters k;
    CHECK_OK(zero_comm_get_counters(world, &k));
    uint64_t un = (uint64_t)n;
    uint64_t ar = n > 1 ? 2ull * NA * 4 * (un - 1) / un : 0;
    CHECK(k.calls[ZERO_OP_ALLREDUCE] == 1 && k.bytes_sent[ZERO_OP_ALLREDUCE] == ar &&
          k.bytes_recv[ZERO_OP_ALLREDUCE] == ar);
    CHECK(k.calls[ZERO_OP_REDUCE_SCATTER] == 1 && k.bytes_sent[ZERO_OP_REDUCE_SCATTER] == (uint64_t)NR * 2 * (un - 1));
    CHECK(k.bytes_recv[ZERO_OP_ALLGATHER] == (uint64_t)NG * 4 * (un - 1));
    CHECK(k.bytes_sent[ZERO_OP_BROADCAST] == (n > 1 && r == n - 1 ? NA * 8u : 0u));
    CHECK(k.bytes_recv[ZERO_OP_BROADCAST] == (n > 1 && r != n - 1 ? NA * 8u : 0u));
    CHECK_OK(zero_comm_get_counters(other, &k));
    CHECK(k.calls[ZERO_OP_ALLREDUCE] == 1 && k.bytes_sent[ZERO_OP_ALLREDUCE] == (n > 1 ? 2ull * NA * 8 * (un - 1) / un : 0));

    /* Many outstanding ops of one kind, waited in reverse order. */
    enum { K = 16 };
    float *bufs = malloc(K * 257 * 4);
    zero_request *many[K];
    for (int i = 0; i < K; i++) {
        for (int j = 0; j < 257; j++) bufs[i * 257 + j] = (float)(r + i * j);
        CHECK_OK(zero_allreduce_async(world, bufs + i * 257, bufs + i * 257, 257, ZERO_F32, ZERO_SUM, &many[i]));
    }
    for (int i = K - 1; i >= 0; i--) CHECK_OK(zero_wait(many[i]));
    for (int i = 0; i < K; i++)
        for (int j = 0; j < 257; j++)
            CHECK_MSG(bufs[i * 257 + j] == (float)(n * (n - 1) / 2 + n * i * j), "op %d element %d", i, j);

    free(bufs);
    free(a), free(wa), free(rs_in), free(rs_out), free(wrs), free(ag_in), free(ag_out), free(wag);
    free(b), free(wb), free(o), free(wo);
    zero_comm_destroy(other);
    zero_comm_destroy(world);
    return check_exit();
}
