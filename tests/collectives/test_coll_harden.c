/* Hardening: what happens when ranks disagree, arrive late, or a handle is
 * used after its destroy.
 *   test_coll_harden counts    (np 2) ranks pass different counts to
 *                              all-reduce (small and large), all-gather and
 *                              reduce-scatter: every rank gets ZERO_MISMATCH
 *                              naming the peer and both counts, never OK
 *   test_coll_harden counts_nbc (np 3) the same through MPI's own all-reduce:
 *                              a status on every rank, not a job abort
 *   test_coll_harden late      (np 2) rank 0 gives up on an all-gather and a
 *                              recv and frees their buffers; rank 1 then
 *                              sends: the memory (now reused) is not written
 *   test_coll_harden destroy   (np 1-2) double destroy of a comm and of an
 *                              engine is a no-op; a destroyed comm's ops,
 *                              accessors and outstanding requests, and an
 *                              engine whose comm was destroyed, fail by name
 *   test_coll_harden fingerprint (np 2) with fingerprints on, ranks calling
 *                              different collectives (count, dtype, kind,
 *                              root, label, a skipped op) get ZERO_MISMATCH
 *                              naming both calls; a late rank that completed
 *                              an op its peer gave up fails its next one at
 *                              once with ZERO_PEER_FAILURE naming the peer
 *   test_coll_harden engine_order (np 2) stage 3, same-sized modules gathered
 *                              in swapped order: ZERO_MISMATCH naming both
 *   test_coll_harden split_late (np 2) rank 1 reaches a split after rank 0
 *                              timed out on it: it fails within its deadline
 *                              (it used to block for ever in MPI_Comm_split)
 *   test_coll_harden missing   (np 3) rank 2 skips an all-gather (schedule,
 *                              fingerprints off) and a broadcast (libnbc,
 *                              fingerprints on): the timeout names rank 2
 *                              only
 * The counts, late and missing modes set fingerprints off explicitly, so they
 * test the transport's own checks (late_fp: the same with them on, where the
 * data of an op is never posted before the peers' records arrive); the rest of the test suite runs with them on
 * (ZERO_COLL_FINGERPRINT=1 in tests/meson.build). */
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
    CHECK_OK(zero_comm_split(world, 0, zero_comm_get_rank(world), &c));
    if (c) CHECK_OK(zero_comm_set_timeout(c, timeout_s));
    return c;
}

/* ---------------------------------------------------------------- fingerprint */

static void expect_in(const char *m, const char *needle)
{
    CHECK_MSG(strstr(m, needle) != NULL, "message lacks \"%s\": %s", needle, m);
}

/* One diverging call per case, each on its own comm (a mismatch fails it). */
static void test_fingerprint(zero_comm *world)
{
    int r = zero_comm_get_rank(world);
    float a[256] = {0}, b[512] = {0};
    int32_t ia[64] = {0};
    float *big = calloc(200016, sizeof *big);
    for (int i = 0; i < 8; i++) {
        zero_comm *c = fresh(world, 5.0);
        CHECK_OK(zero_allreduce(c, a, b, 4, ZERO_F32, ZERO_SUM)); /* op #0 agrees */
        double t0 = now();
        zero_status st = ZERO_OK;
        const char *mine = "", *theirs = "";
        switch (i) {
        case 0: /* the example: 64 vs 32 elements */
            st = zero_allgather(c, a, b, r ? 64 : 32, ZERO_F32);
            mine = r ? "rank 1 (world 1): allgather of 64 x f32 as op #1" : "rank 0 (world 0): allgather of 32 x f32 as op #1";
            theirs = r ? "rank 0 (world 0): allgather of 32 x f32 as op #1" : "rank 1 (world 1): allgather of 64 x f32 as op #1";
            break;
        case 1: /* two same-size modules gathered in swapped order */
            CHECK_OK(zero_comm_set_label(c, r ? "module b" : "module a"));
            st = zero_allgather(c, a, b, 16, ZERO_F32);
            mine = r ? "as op #1 ('module b')" : "as op #1 ('module a')";
            theirs = r ? "as op #1 ('module a')" : "as op #1 ('module b')";
            break;
        case 2: /* same bytes, another dtype: the data alone would look fine */
            st = r ? zero_allreduce(c, ia, ia, 16, ZERO_I32, ZERO_SUM) : zero_allreduce(c, a, b, 16, ZERO_F32, ZERO_SUM);
            mine = r ? "allreduce of 16 x i32" : "allreduce of 16 x f32";
            theirs = r ? "allreduce of 16 x f32" : "allreduce of 16 x i32";
            break;
        case 3: /* another op kind */
            st = r ? zero_reduce_scatter(c, a, b, 8, ZERO_F32, ZERO_SUM) : zero_allgather(c, a, b, 8, ZERO_F32);
            mine = r ? "reduce_scatter of 8 x f32" : "allgather of 8 x f32";
            theirs = r ? "allgather of 8 x f32" : "reduce_scatter of 8 x f32";
            break;
        case 4: /* another root */
            st = zero_broadcast(c, a, a, 8, ZERO_F32, r);
            mine = r ? "from root 1" : "from root 0";
            theirs = r ? "from root 0" : "from root 1";
            break;
        case 5: /* rank 0 runs a barrier rank 1 skips */
            if (r == 0) st = zero_barrier(c);
            else st = zero_allreduce(c, a, b, 4, ZERO_F32, ZERO_SUM);
            mine = r ? "allreduce of 4 x f32 (sum) as op #1" : "barrier as op #1";
            theirs = r ? "barrier as op #1" : "allreduce of 4 x f32 (sum) as op #1";
            break;
        case 6: /* another reduction */
            st = zero_allreduce(c, a, b, 4, ZERO_F32, r ? ZERO_MAX : ZERO_SUM);
            mine = r ? "(max)" : "(sum)";
            theirs = r ? "(sum)" : "(max)";
            break;
        case 7: /* large: caught before any data moves (see test_counts) */
            st = zero_allreduce(c, big, big + 100008, r ? 100008 : 100000, ZERO_F32, ZERO_SUM);
            mine = r ? "allreduce of 100008 x f32" : "allreduce of 100000 x f32";
            theirs = r ? "allreduce of 100000 x f32" : "allreduce of 100008 x f32";
            break;
        }
        const char *m = zero_comm_last_error(c);
        CHECK_MSG(st == ZERO_MISMATCH, "case %d returned %s: %s", i, zero_status_name(st), m);
        expect_in(m, "called different collectives");
        expect_in(m, mine);
        expect_in(m, theirs);
        expect_in(m, zero_comm_get_name(c));
        CHECK_MSG(now() - t0 < 2.0, "case %d: noticed after %.2f s", i, now() - t0);
        if (r == 0) fprintf(stderr, "[rank 0] expected failure: %s\n", m);
        zero_comm_destroy(c);
    }
    free(big);

    /* A late rank: rank 0 gives up an all-reduce that rank 1 joins after
     * the deadline, and completes; rank 1's next collective must fail at
     * once, naming rank 0, instead of waiting its own deadline. */
    zero_comm *c = fresh(world, SHORT_S);
    if (r == 0) {
        CHECK(zero_allreduce(c, a, b, 4, ZERO_F32, ZERO_SUM) == ZERO_TIMEOUT);
        CHECK(zero_barrier(c) == ZERO_INVALID_STATE);
    } else {
        usleep((useconds_t)(SHORT_S * 1.6e6));
        double t0 = now();
        /* the notice is here before the data that will never come: this op
         * fails already (OK would be possible if rank 0's data had left) */
        zero_status st = zero_allreduce(c, a, b, 4, ZERO_F32, ZERO_SUM);
        CHECK_MSG(st == ZERO_OK || st == ZERO_PEER_FAILURE, "late allreduce: %s", zero_status_name(st));
        st = st == ZERO_OK ? zero_barrier(c) : st;
        const char *m = zero_comm_last_error(c);
        CHECK_MSG(st == ZERO_PEER_FAILURE, "the late rank's next op returned %s: %s", zero_status_name(st), m);
        expect_in(m, "rank 0 (world 0) gave up this group earlier");
        expect_in(m, "timed out");
        CHECK_MSG(now() - t0 < SHORT_S * 0.8, "the late rank failed after %.2f s, not at once", now() - t0);
        fprintf(stderr, "[rank 1] expected failure: %s\n", m);
    }
    CHECK_OK(zero_barrier(world));
    zero_comm_destroy(c);
}

/* Stage 3, two modules of the same size gathered in swapped order on the
 * two ranks: every all-gather matches in size, only the engine's label
 * (the module's name) tells them apart. */
static void test_engine_order(zero_comm *world)
{
    int r = zero_comm_get_rank(world);
    zero_comm *dp = fresh(world, 5.0);
    zero_device *dev = NULL;
    CHECK_OK(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));
    zero_config cfg = ZERO_CONFIG_INIT;
    cfg.stage = 3;
    cfg.stage3_param_persistence_threshold = 16; /* both params are sharded */
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &cfg, dp, dev));
    int ma = -1, mb = -1;
    int64_t shape[1] = {256};
    CHECK_OK(zero_engine_add_module(e, "encoder.a", &ma));
    CHECK_OK(zero_engine_add_module(e, "encoder.b", &mb));
    CHECK_OK(zero_engine_add_param(e, ma, "a.w", 1, shape, NULL, NULL));
    CHECK_OK(zero_engine_add_param(e, mb, "b.w", 1, shape, NULL, NULL));
    CHECK_OK(zero_engine_finalize(e));
    zero_status st = zero_engine_gather(e, r == 0 ? ma : mb);
    const char *m = zero_engine_last_error(e);
    CHECK_MSG(st == ZERO_MISMATCH, "swapped gathers returned %s: %s", zero_status_name(st), m);
    expect_in(m, "('encoder.a')");
    expect_in(m, "('encoder.b')");
    fprintf(stderr, "[rank %d] expected failure: %s\n", r, m);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    zero_comm_destroy(dp);
}

/* Issue 10, B12: rank 1 reaches a split after rank 0 gave up on it. It used
 * to complete the exchange (rank 0's part was posted) and then block for
 * ever in MPI_Comm_split; now it fails within its deadline. */
static void test_split_late(zero_comm *world)
{
    int r = zero_comm_get_rank(world);
    zero_comm *c = fresh(world, SHORT_S), *child = NULL;
    if (r == 1) usleep((useconds_t)(SHORT_S * 1.6e6));
    double t0 = now();
    zero_status st = zero_comm_split(c, 0, r, &child);
    double dt = now() - t0;
    CHECK_MSG(st == ZERO_TIMEOUT || st == ZERO_PEER_FAILURE, "rank %d: split returned %s: %s", r,
              zero_status_name(st), zero_comm_last_error(c));
    CHECK(child == NULL);
    CHECK_MSG(dt < SHORT_S * 2 + 1.0, "rank %d: the split failed after %.2f s", r, dt);
    expect_in(zero_comm_last_error(c), "split");
    fprintf(stderr, "[rank %d] expected failure after %.2f s: %s\n", r, dt, zero_comm_last_error(c));
    CHECK_OK(zero_barrier(world));
    zero_comm_destroy(c);
}

/* ---------------------------------------------------------------- missing */

/* fp 0: an all-gather (a schedule: its pending receives tell); fp 1: a
 * broadcast (libnbc cannot tell; the fingerprints that did not come can). */
static void test_missing(zero_comm *world, int fp)
{
    int r = zero_comm_get_rank(world);
    float a[64] = {0}, b[256] = {0};
    zero_comm *c = fresh(world, SHORT_S);
    if (r != 2) {
        zero_status st = fp ? zero_broadcast(c, a, a, 16, ZERO_F32, 0) : zero_allgather(c, a, b, 16, ZERO_F32);
        const char *m = zero_comm_last_error(c);
        CHECK_MSG(st == ZERO_TIMEOUT, "%s returned %s", fp ? "broadcast" : "allgather", zero_status_name(st));
        expect_in(m, "waiting for ranks 2 (world ranks whose messages did not arrive)");
        fprintf(stderr, "[rank %d] expected failure: %s\n", r, m);
    }
    CHECK_OK(zero_barrier(world));
    zero_comm_destroy(c);
}

/* ---------------------------------------------------------------- counts */

static void expect_mismatch(zero_status st, zero_comm *c, const char *op, size_t mine, size_t theirs)
{
    const char *m = zero_comm_last_error(c);
    CHECK_MSG(st == ZERO_MISMATCH, "%s with %zu here, %zu there returned %s: %s", op, mine, theirs,
              zero_status_name(st), m);
    CHECK_MSG(strstr(m, op) != NULL, "message does not name %s: %s", op, m);
    int peer = 1 - zero_comm_get_rank(c);
    char who[64];
    snprintf(who, sizeof who, "rank %d (world %d)", peer, peer);
    CHECK_MSG(strstr(m, who) != NULL, "message does not name %s: %s", who, m);
    CHECK_MSG(strstr(m, "different counts") != NULL || strstr(m, "different collectives") != NULL,
              "message does not say why: %s", m);
    fprintf(stderr, "[rank %d] expected failure: %s\n", zero_comm_get_rank(c), m);
}

static void test_counts(zero_comm *world)
{
    int r = zero_comm_get_rank(world);
    float *a = calloc(1 << 20, sizeof *a), *b = calloc(1 << 21, sizeof *b);
    /* issue #10 B14: count 8 on one rank and 16 on the other returned OK.
     * Only eager-sized messages here: with larger ones Open MPI 4.1's
     * single-copy (CMA) path writes the longer message past the receive
     * buffer before it reports the truncation (seen under ASan: 16 bytes
     * past a 200000-byte receive); with fingerprints on no data moves
     * between disagreeing ranks (test_fingerprint, case 7). */
    size_t small = r == 0 ? 8 : 16;
    struct {
        const char *op;
        size_t mine, theirs;
    } cases[] = {
        {"allreduce", small, small ^ 8 ^ 16},
        {"allreduce", small * 8, (small ^ 8 ^ 16) * 8},
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

/* At 3 ranks a small all-reduce runs as MPI's own (libnbc) collective; a
 * count mismatch there made Open MPI abort the whole job from MPI_Test (the
 * error went to MPI_COMM_WORLD's fatal handler). Now: a status, no abort. */
static void test_counts_nbc(zero_comm *world)
{
    int r = zero_comm_get_rank(world);
    float a[16], b[16];
    for (int i = 0; i < 16; i++) a[i] = 1;
    zero_comm *c = fresh(world, SHORT_S);
    zero_status st = zero_allreduce(c, a, b, r == 0 ? 8 : 16, ZERO_F32, ZERO_SUM);
    const char *m = zero_comm_last_error(c);
    if (r == 0)
        CHECK_MSG(st == ZERO_MISMATCH, "rank 0 (fewer elements) got %s: %s", zero_status_name(st), m);
    else
        CHECK_MSG(st == ZERO_MISMATCH || st == ZERO_TIMEOUT || st == ZERO_PEER_FAILURE, "rank %d got %s: %s", r,
                  zero_status_name(st), m);
    fprintf(stderr, "[rank %d] expected failure: %s\n", r, m);
    CHECK_OK(zero_barrier(world));
    zero_comm_destroy(c);
}

/* ---------------------------------------------------------------- late */

/* Rank 0 gives up on an op receiving `bytes` into a heap buffer, frees it
 * and takes the same-sized block again (the allocator hands the freed one
 * back), filled with a pattern; rank 1 then runs the op late. The pattern
 * must survive: nothing may be written into memory the caller freed. */
static void late_case(zero_comm *world, int kind, size_t count)
{
    int r = zero_comm_get_rank(world);
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
    int n = zero_comm_get_size(c);
    /* A request left outstanding is finished by the destroy, not leaked or
     * left pointing at freed memory. Rank 0 only: at np 2 rank 1 never
     * joins, so the request cannot complete by itself. */
    if (zero_comm_get_rank(c) == 0) CHECK_OK(zero_allreduce_async(c, x, y, 4, ZERO_F32, ZERO_SUM, &req));
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
    CHECK(zero_comm_get_rank(c) == -1 && zero_comm_get_size(c) == 0 && zero_comm_get_world_rank(c) == -1);
    CHECK(strstr(zero_comm_last_error(c), "destroyed") != NULL);

    /* A comm destroyed under its engine: the engine's next call fails by
     * name; destroying the engine twice is ignored. */
    zero_comm *dp = fresh(world, 5.0);
    zero_device *dev = NULL;
    CHECK_OK(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));
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
    zero_device_destroy(dev);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "destroy";
    zero_comm *world = NULL;
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 30;
    /* counts and missing test the transport's own checks */
    if (!strncmp(mode, "counts", 6) || !strcmp(mode, "missing") || !strcmp(mode, "late")) cfg.fingerprint = 0;
    if (!strcmp(mode, "fingerprint") || !strcmp(mode, "missing_fp") || !strcmp(mode, "engine_order") ||
        !strcmp(mode, "late_fp"))
        cfg.fingerprint = 1;
    if (zero_comm_create_world(&world, &cfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    check_set_rank(zero_comm_get_rank(world));
    int n = zero_comm_get_size(world);
    int want = !strncmp(mode, "missing", 7) || !strcmp(mode, "counts_nbc") ? 3 : 2;
    if (strcmp(mode, "destroy") && n != want) {
        zero_comm_destroy(world);
        CHECK_SKIP("%s needs %d ranks", mode, want);
    }
    if (!strcmp(mode, "counts"))
        test_counts(world);
    else if (!strcmp(mode, "counts_nbc"))
        test_counts_nbc(world);
    else if (!strncmp(mode, "late", 4))
        test_late(world);
    else if (!strcmp(mode, "fingerprint"))
        test_fingerprint(world);
    else if (!strcmp(mode, "engine_order"))
        test_engine_order(world);
    else if (!strcmp(mode, "split_late"))
        test_split_late(world);
    else if (!strncmp(mode, "missing", 7))
        test_missing(world, !strcmp(mode, "missing_fp"));
    else
        test_destroy(world);
    zero_comm_destroy(world);
    return check_exit();
}
