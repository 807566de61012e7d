/* Hardening: what happens when ranks disagree, arrive late, or a handle is
 * used after its destroy.
 *   test_coll_harden counts    (np 2) ranks pass different counts to
 *                              all-reduce (small and large), all-gather and
 *                              reduce-scatter: every rank gets ZERO_MISMATCH
 *                              naming the peer and both counts, never OK
 *   test_coll_harden late      (np 2) rank 0 gives up on an all-gather and a
 *                              recv and frees their buffers; rank 1 then
 *                              sends: the memory (now reused) is not written
 *   test_coll_harden destroy   (np 1-2) double destroy of a comm and of an
 *                              engine is a no-op; a destroyed comm's ops,
 *                              accessors and outstanding requests, and an
 *                              engine whose comm was destroyed, fail by name */
#include <zero/comm.h>
#include <zero/engine.h>

#include <time.h>
#include <unistd.h>

#include "check.h"
#include "coll_util.h"

#define SHORT_S 0.5

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static zero_comm *fresh(zero_comm *world, double timeout_s)
{
    zero_comm *c = NULL;
    CHECK_OK(zero_comm_split(world, 0, zero_comm_rank(world), &c));
    if (c) CHECK_OK(zero_comm_set_timeout(c, timeout_s));
    return c;
}

/* ---------------------------------------------------------------- counts */

static void expect_mismatch(zero_status st, zero_comm *c, const char *op, size_t mine, size_t theirs)
{
    const char *m = zero_comm_last_error(c);
    CHECK_MSG(st == ZERO_MISMATCH, "%s with %zu here, %zu there returned %s: %s", op, mine, theirs,
              zero_status_name(st), m);
    CHECK_MSG(strstr(m, op) != NULL, "message does not name %s: %s", op, m);
    int peer = 1 - zero_comm_rank(c);
    char who[64];
    snprintf(who, sizeof who, "rank %d (world %d)", peer, peer);
    CHECK_MSG(strstr(m, who) != NULL, "message does not name %s: %s", who, m);
    CHECK_MSG(strstr(m, "different counts") != NULL, "message does not say why: %s", m);
    fprintf(stderr, "[rank %d] expected failure: %s\n", zero_comm_rank(c), m);
}

static void test_counts(zero_comm *world)
{
    int r = zero_comm_rank(world);
    float *a = calloc(1 << 20, sizeof *a), *b = calloc(1 << 21, sizeof *b);
    /* issue #10 B14: count 8 on one rank and 16 on the other returned OK */
    size_t small = r == 0 ? 8 : 16, large = r == 0 ? 100000 : 100008;
    struct {
        const char *op;
        size_t mine, theirs;
    } cases[] = {
        {"allreduce", small, small ^ 8 ^ 16},
        {"allreduce", large, large ^ 100000 ^ 100008},
        {"allgather", small, small ^ 8 ^ 16},
        {"reduce_scatter", small, small ^ 8 ^ 16},
    };
    for (int i = 0; i < 4; i++) {
        zero_comm *c = fresh(world, 5.0);
        double t0 = now();
        zero_status st;
        if (i < 2)
            st = zero_allreduce(c, a, b, cases[i].mine, ZERO_F32, ZERO_SUM);
        else if (i == 2)
            st = zero_allgather(c, a, b, cases[i].mine, ZERO_F32);
        else
            st = zero_reduce_scatter(c, b, a, cases[i].mine, ZERO_F32, ZERO_SUM);
        expect_mismatch(st, c, cases[i].op, cases[i].mine, cases[i].theirs);
        CHECK_MSG(now() - t0 < 2.0, "%s: the mismatch took %.2f s to notice", cases[i].op, now() - t0);
        /* and the comm is failed for good */
        CHECK(zero_barrier(c) == ZERO_INVALID_STATE);
        zero_comm_destroy(c);
    }
    free(a);
    free(b);
}

/* ---------------------------------------------------------------- late */

/* Rank 0 gives up on an op receiving `bytes` into a heap buffer, frees it
 * and takes the same-sized block again (the allocator hands the freed one
 * back), filled with a pattern; rank 1 then runs the op late. The pattern
 * must survive: nothing may be written into memory the caller freed. */
static void late_case(zero_comm *world, int kind, size_t count)
{
    int r = zero_comm_rank(world);
    zero_comm *c = fresh(world, SHORT_S);
    size_t bytes = count * 2 * sizeof(float);
    float *send = malloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) send[i] = (float)(r + 1);
    if (r == 0) {
        float *recv = malloc(bytes);
        zero_status st = kind == 0 ? zero_allgather(c, send, recv, count, ZERO_F32)
                                   : zero_recv(c, recv, count, ZERO_F32, 1);
        CHECK_MSG(st == ZERO_TIMEOUT, "rank 0 expected a timeout, got %s", zero_status_name(st));
        free(recv);
        unsigned char *again = malloc(bytes);
        memset(again, 0xab, bytes);
        CHECK_OK(zero_barrier(world)); /* rank 1: go */
        CHECK_OK(zero_barrier(world)); /* rank 1 issued its op */
        /* let MPI progress whatever might still arrive */
        for (int i = 0; i < 20; i++) {
            CHECK_OK(zero_barrier(world));
            usleep(5000);
        }
        size_t bad = 0;
        for (size_t i = 0; i < bytes; i++) bad += again[i] != 0xab;
        CHECK_MSG(bad == 0, "%s of %zu floats: %zu bytes of freed memory were written after the timeout",
                  kind == 0 ? "allgather" : "recv", count, bad);
        free(again);
    } else {
        float *recv = malloc(bytes);
        CHECK_OK(zero_barrier(world));
        zero_status st = kind == 0 ? zero_allgather(c, send, recv, count, ZERO_F32)
                                   : zero_send(c, send, count, ZERO_F32, 0);
        /* the late rank may complete (its peer's data was already posted) or time out */
        CHECK_MSG(st == ZERO_OK || st == ZERO_TIMEOUT || st == ZERO_PEER_FAILURE, "late rank got %s: %s",
                  zero_status_name(st), zero_comm_last_error(c));
        CHECK_OK(zero_barrier(world));
        for (int i = 0; i < 20; i++) CHECK_OK(zero_barrier(world));
        free(recv);
    }
    free(send);
    zero_comm_destroy(c);
}

static void test_late(zero_comm *world)
{
    late_case(world, 0, 200);     /* eager: copied in by rank 0's own progress */
    late_case(world, 0, 1 << 18); /* rendezvous, 1 MiB */
    late_case(world, 1, 200);
    late_case(world, 1, 1 << 18);
}

/* ---------------------------------------------------------------- destroy */

static void test_destroy(zero_comm *world)
{
    zero_comm *c = fresh(world, 5.0);
    float x[4] = {1, 2, 3, 4}, y[4];
    zero_request *req = NULL;
    CHECK_OK(zero_allreduce(c, x, y, 4, ZERO_F32, ZERO_SUM));
    int n = zero_comm_size(c);
    /* A request left outstanding is finished by the destroy, not leaked or
     * left pointing at freed memory. Rank 0 only: at np 2 rank 1 never
     * joins, so the request cannot complete by itself. */
    if (zero_comm_rank(c) == 0) CHECK_OK(zero_allreduce_async(c, x, y, 4, ZERO_F32, ZERO_SUM, &req));
    zero_comm_destroy(c);
    zero_comm_destroy(c); /* double destroy: ignored */
    CHECK(strstr(zero_last_error(), "already destroyed") != NULL);
    if (req) {
        zero_status st = zero_wait(req);
        CHECK_MSG(st == ZERO_INVALID_STATE || (n == 1 && st == ZERO_OK), "wait after destroy: %s",
                  zero_status_name(st));
        if (st != ZERO_OK) CHECK(strstr(zero_last_error(), "comm was destroyed") != NULL);
    }
    CHECK(zero_allreduce(c, x, y, 4, ZERO_F32, ZERO_SUM) == ZERO_INVALID_STATE);
    CHECK(strstr(zero_last_error(), "was destroyed") != NULL);
    CHECK(zero_allgather_async(c, x, y, 1, ZERO_F32, &req) == ZERO_INVALID_STATE && req == NULL);
    zero_comm *child = NULL;
    CHECK(zero_comm_split(c, 0, 0, &child) == ZERO_INVALID_STATE && child == NULL);
    CHECK(zero_comm_set_timeout(c, 1.0) == ZERO_INVALID_STATE);
    CHECK(zero_comm_rank(c) == -1 && zero_comm_size(c) == 0 && zero_comm_world_rank(c) == -1);
    CHECK(strstr(zero_comm_last_error(c), "destroyed") != NULL);

    /* A comm destroyed under its engine: the engine's next call fails by
     * name; destroying the engine twice is ignored. */
    zero_comm *dp = fresh(world, 5.0);
    zero_device *dev = NULL;
    CHECK_OK(zero_device_open(&dev, ZERO_DEVICE_CPU, 0));
    zero_config cfg = ZERO_CONFIG_INIT;
    cfg.stage = 2;
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &cfg, dp, dev));
    int m = -1;
    int64_t shape[1] = {64};
    CHECK_OK(zero_engine_add_module(e, "m", &m));
    CHECK_OK(zero_engine_add_param(e, m, "w", 1, shape, NULL, NULL));
    CHECK_OK(zero_engine_finalize(e));
    CHECK_OK(zero_engine_grads_ready(e, m));
    CHECK_OK(zero_engine_step(e, NULL));
    zero_comm_destroy(dp);
    zero_status st = zero_engine_step(e, NULL);
    CHECK_MSG(st == ZERO_INVALID_STATE, "step after the comm's destroy: %s", zero_status_name(st));
    CHECK_MSG(strstr(zero_engine_last_error(e), "dp comm was destroyed") != NULL, "message: %s",
              zero_engine_last_error(e));
    zero_engine_destroy(e);
    zero_engine_destroy(e);
    CHECK(zero_engine_step(e, NULL) == ZERO_INVALID_STATE);
    CHECK(strstr(zero_last_error(), "engine") && strstr(zero_last_error(), "was destroyed"));
    zero_device_close(dev);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "destroy";
    zero_comm *world = NULL;
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 30;
    if (zero_comm_init_world(&world, &cfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    check_set_rank(zero_comm_rank(world));
    int n = zero_comm_size(world);
    if (strcmp(mode, "destroy") && n != 2) {
        zero_comm_destroy(world);
        CHECK_SKIP("%s needs 2 ranks", mode);
    }
    if (!strcmp(mode, "counts"))
        test_counts(world);
    else if (!strcmp(mode, "late"))
        test_late(world);
    else
        test_destroy(world);
    zero_comm_destroy(world);
    return check_exit();
}
