/* All-to-all and all-to-all-v against a reference computed on this rank
 * (every rank knows every rank's input from (rank, index)), compared
 * bitwise; byte counters checked exactly after each op.
 *
 *   test_coll_alltoall [local|mpi] (np 1-4)
 *       every dtype x counts 0, 1, 7, 1009 (+ one ~1M-element f32 op);
 *       all-to-all-v with uneven counts (zeros included, an all-zero row,
 *       an all-zero op), packed and with gapped displacements (the gaps of
 *       recv untouched); async ops outstanding together, waited in reverse
 *   test_coll_alltoall missing / missing_nofp (np 3; fingerprints on / off)
 *       rank 2 skips an all-to-all: ranks 0 and 1 time out naming rank 2
 *   test_coll_alltoall counts (np 2; fingerprints on) / counts_nofp (off)
 *       rank 0 sends 5 elements to rank 1, which expects 7: refused with
 *       ZERO_MISMATCH naming the peer and both counts
 *   test_coll_alltoall misuse (any np)
 *       overlap, NULL counts, own send/recv counts that differ: refused with
 *       ZERO_INVALID_ARGUMENT, nothing counted, the comm still works */
#include <time.h>
#include <zero/comm.h>

#include "check.h"
#include "coll_util.h"

static zero_comm *comm;
static int rank, size;

/* ------------------------------------------------------------ all-to-all */

/* Rank r's send buffer is its values at indices 0..count*n; chunk j (for
 * rank j) is indices [j*count, (j+1)*count). So recv chunk i here must be
 * rank i's values at [rank*count, ...). */
static void test_alltoall(zero_dtype d, size_t count, int async)
{
    size_t es = zero_dtype_size(d), total = count * (size_t)size;
    char what[128];
    snprintf(what, sizeof what, "alltoall %s count %zu%s", zero_dtype_name(d), count, async ? " async" : "");
    char *send = malloc(total * es + 1), *recv = malloc(total * es + 1), *want = malloc(total * es + 1),
         *orig = malloc(total * es + 1);
    coll_fill(d, send, total, rank, 0);
    memcpy(orig, send, total * es);
    for (int i = 0; i < size; i++) coll_fill(d, want + (size_t)i * count * es, count, i, (size_t)rank * count);
    memset(recv, 0x5a, total * es);
    zero_comm_counters before;
    zero_comm_get_counters(comm, &before);
    if (async) {
        zero_request *req = NULL;
        CHECK_OK(zero_alltoall_async(comm, send, recv, count, d, &req));
        CHECK_OK(zero_wait(req));
    } else {
        CHECK_OK(zero_alltoall(comm, send, recv, count, d));
    }
    coll_expect_equal(recv, want, total, d, what);
    coll_expect_equal(send, orig, total, d, "alltoall left send unchanged");
    uint64_t v = (uint64_t)count * es * (uint64_t)(size - 1);
    coll_check_counters(comm, &before, ZERO_OP_ALLTOALL, v, v, what);
    free(send), free(recv), free(want), free(orig);
}

/* ------------------------------------------------------------ all-to-all-v */

/* Elements rank `from` sends to rank `to` in pattern `salt`: uneven, with
 * zeros; salt 3 leaves every chunk from rank 1 empty, salt 4 the whole op. */
static size_t vcount(int from, int to, int salt)
{
    if (salt == 4) return 0;
    if (salt == 3 && from == 1) return 0;
    return (size_t)((from * 7 + to * 3 + salt * 5) % 6) * (size_t)(salt == 2 ? 97 : 1);
}

/* Rank `from`'s value at position k of its chunk for `to`: index to*100000+k. */
static void test_alltoallv(zero_dtype d, int salt, int gapped, int async)
{
    size_t es = zero_dtype_size(d), n = (size_t)size;
    char what[128];
    snprintf(what, sizeof what, "alltoallv %s pattern %d%s%s", zero_dtype_name(d), salt, gapped ? " gapped" : "",
             async ? " async" : "");
    size_t *sc = calloc(n, sizeof *sc), *sd = calloc(n, sizeof *sd), *rc = calloc(n, sizeof *rc),
           *rd = calloc(n, sizeof *rd);
    size_t gap = gapped ? 3 : 0, stot = 0, rtot = 0;
    uint64_t sent = 0, got = 0;
    /* the last chunk first when gapped: displacements need not increase */
    for (size_t j = 0; j < n; j++) {
        size_t jj = gapped ? n - 1 - j : j;
        sc[jj] = vcount(rank, (int)jj, salt);
        rc[jj] = vcount((int)jj, rank, salt);
        sd[jj] = stot + gap;
        rd[jj] = rtot + gap;
        stot += sc[jj] + gap;
        rtot += rc[jj] + gap;
        if ((int)jj != rank) sent += sc[jj] * es, got += rc[jj] * es;
    }
    char *send = malloc(stot * es + 1), *recv = malloc(rtot * es + 1), *want = malloc(rtot * es + 1);
    memset(send, 0x33, stot * es);
    memset(recv, 0x5a, rtot * es);
    memset(want, 0x5a, rtot * es); /* the gaps stay as they were */
    for (size_t j = 0; j < n; j++) {
        coll_fill(d, send + sd[j] * es, sc[j], rank, j * 100000);
        coll_fill(d, want + rd[j] * es, rc[j], (int)j, (size_t)rank * 100000);
    }
    zero_comm_counters before;
    zero_comm_get_counters(comm, &before);
    const size_t *sdp = gapped ? sd : NULL, *rdp = gapped ? rd : NULL;
    if (async) {
        zero_request *req = NULL;
        CHECK_OK(zero_alltoallv_async(comm, send, sc, sdp, recv, rc, rdp, d, &req));
        /* the arrays were copied: scribbling on them now changes nothing */
        for (size_t j = 0; j < n; j++) sc[j] = rc[j] = 12345678;
        CHECK_OK(zero_wait(req));
    } else {
        CHECK_OK(zero_alltoallv(comm, send, sc, sdp, recv, rc, rdp, d));
    }
    coll_expect_equal(recv, want, rtot, d, what);
    coll_check_counters(comm, &before, ZERO_OP_ALLTOALLV, sent, got, what);
    free(send), free(recv), free(want), free(sc), free(sd), free(rc), free(rd);
}

/* Several ops outstanding at once, of both kinds, waited in reverse order. */
static void test_async_mix(void)
{
    enum { K = 4, COUNT = 513 };
    size_t n = (size_t)size;
    float *send[K], *recv[K], *want = malloc(COUNT * n * sizeof(float));
    zero_request *req[K];
    size_t *cnt = malloc(n * sizeof *cnt);
    for (size_t j = 0; j < n; j++) cnt[j] = COUNT;
    for (int k = 0; k < K; k++) {
        send[k] = malloc(COUNT * n * sizeof(float));
        recv[k] = malloc(COUNT * n * sizeof(float));
        coll_fill(ZERO_F32, send[k], COUNT * n, rank + 10 * k, 0);
        if (k % 2)
            CHECK_OK(zero_alltoall_async(comm, send[k], recv[k], COUNT, ZERO_F32, &req[k]));
        else /* the same exchange through the v form, packed */
            CHECK_OK(zero_alltoallv_async(comm, send[k], cnt, NULL, recv[k], cnt, NULL, ZERO_F32, &req[k]));
    }
    for (int k = K - 1; k >= 0; k--) {
        CHECK_OK(zero_wait(req[k]));
        for (int i = 0; i < size; i++)
            coll_fill(ZERO_F32, want + (size_t)i * COUNT, COUNT, i + 10 * k, (size_t)rank * COUNT);
        coll_expect_equal(recv[k], want, COUNT * n, ZERO_F32, k % 2 ? "async alltoall" : "async alltoallv");
        free(send[k]), free(recv[k]);
    }
    free(want), free(cnt);
}

static void run_ops(void)
{
    static const size_t counts[] = {0, 1, 7, 1009};
    for (int di = 0; di < COLL_NDTYPES; di++) {
        zero_dtype d = coll_all_dtypes[di];
        for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) test_alltoall(d, counts[ci], (int)ci == 2);
        for (int salt = 0; salt <= 4; salt++) test_alltoallv(d, salt, salt % 2, salt == 2);
    }
    test_alltoall(ZERO_F32, (1u << 20) / (unsigned)size + 3, 0); /* rendezvous-sized messages */
    test_async_mix();
}

/* ------------------------------------------------------------ failures */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void expect_in(const char *m, const char *needle)
{
    CHECK_MSG(strstr(m, needle) != NULL, "message lacks \"%s\": %s", needle, m);
}

static zero_comm *fresh(double timeout_s)
{
    zero_comm *c = NULL;
    CHECK_OK(zero_comm_split(comm, 0, rank, &c));
    if (c) CHECK_OK(zero_comm_set_timeout(c, timeout_s));
    return c;
}

static void test_missing(void)
{
    float a[3 * 16] = {0}, b[3 * 16] = {0};
    zero_comm *c = fresh(0.5);
    if (rank != 2) {
        double t0 = now_s();
        zero_status st = zero_alltoall(c, a, b, 16, ZERO_F32);
        double dt = now_s() - t0;
        const char *m = zero_comm_last_error(c);
        CHECK_MSG(st == ZERO_TIMEOUT, "alltoall returned %s: %s", zero_status_name(st), m);
        CHECK_MSG(dt > 0.45 && dt < 3.0, "timed out after %.2f s for a 0.5 s deadline", dt);
        expect_in(m, "alltoall of 16 x f32");
        expect_in(m, "waiting for ranks 2 (world ranks whose messages did not arrive)");
        fprintf(stderr, "[rank %d] expected failure: %s\n", rank, m);
    }
    CHECK_OK(zero_barrier(comm));
    zero_comm_destroy(c);
}

/* Rank 0 sends 5 elements to rank 1, which expects 7; every other chunk
 * agrees. With fingerprints rank 1 refuses before any data moves and rank 0
 * learns it from rank 1's notice; without them rank 1 sees 5 arrive. */
static void test_counts(int fp)
{
    zero_comm *c = fresh(2.0);
    float send[16] = {0}, recv[16] = {0};
    size_t sc[2] = {3, 3}, rc[2] = {3, 3};
    if (rank == 0) sc[1] = 5;
    if (rank == 1) rc[0] = 7;
    double t0 = now_s();
    zero_status st = zero_alltoallv(c, send, sc, NULL, recv, rc, NULL, ZERO_F32);
    double dt = now_s() - t0;
    const char *m = zero_comm_last_error(c);
    if (rank == 1) {
        CHECK_MSG(st == ZERO_MISMATCH, "alltoallv with 7 expected, 5 sent returned %s: %s", zero_status_name(st), m);
        CHECK_MSG(dt < 1.5, "the mismatch took %.2f s", dt);
        expect_in(m, "rank 0 (world 0)");
        expect_in(m, fp ? "sends 5 x f32 to this rank, which expects 7" : "sent 5 elements where this rank expected 7");
        fprintf(stderr, "[rank %d] expected failure: %s\n", rank, m);
    } else if (fp) {
        /* its check agreed (rank 1 sends it 3 as expected): it hears rank 1 gave up */
        CHECK_MSG(st == ZERO_PEER_FAILURE, "rank 0 returned %s: %s", zero_status_name(st), m);
        expect_in(m, "rank 1 (world 1) gave up");
        fprintf(stderr, "[rank %d] expected failure: %s\n", rank, m);
    }
    CHECK_OK(zero_barrier(comm));
    zero_comm_destroy(c);
}

static void test_misuse(void)
{
    zero_comm_counters before, after;
    zero_comm_get_counters(comm, &before);
    size_t n = (size_t)size;
    float *buf = calloc(8 * n + 8, sizeof *buf);
    size_t *cnt = calloc(n, sizeof *cnt), *cnt2 = calloc(n, sizeof *cnt2);
    for (size_t j = 0; j < n; j++) cnt[j] = cnt2[j] = 2;
    zero_status st = zero_alltoall(comm, buf, buf + 1, 4, ZERO_F32);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT, "overlapping alltoall returned %s", zero_status_name(st));
    expect_in(zero_comm_last_error(comm), "no in-place form");
    st = zero_alltoall(comm, buf, buf, 4, ZERO_F32);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT, "alltoall with send == recv returned %s", zero_status_name(st));
    st = zero_alltoallv(comm, buf, cnt, NULL, buf + 1, cnt, NULL, ZERO_F32);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT, "overlapping alltoallv returned %s", zero_status_name(st));
    st = zero_alltoallv(comm, buf, NULL, NULL, buf + 4 * n, cnt, NULL, ZERO_F32);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT, "alltoallv with NULL send_counts returned %s", zero_status_name(st));
    expect_in(zero_comm_last_error(comm), "send_counts is NULL");
    st = zero_alltoallv(comm, buf, cnt, NULL, buf + 4 * n, NULL, NULL, ZERO_F32);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT, "alltoallv with NULL recv_counts returned %s", zero_status_name(st));
    expect_in(zero_comm_last_error(comm), "recv_counts is NULL");
    cnt2[rank] = 3;
    st = zero_alltoallv(comm, buf, cnt, NULL, buf + 4 * n, cnt2, NULL, ZERO_F32);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT, "alltoallv with own counts 2 vs 3 returned %s", zero_status_name(st));
    expect_in(zero_comm_last_error(comm), "this rank's chunk to itself must be the same size");
    size_t huge[64];
    for (size_t j = 0; j < n; j++) huge[j] = (size_t)1 << 62;
    st = zero_alltoallv(comm, buf, huge, NULL, buf + 4 * n, huge, NULL, ZERO_F32);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT, "alltoallv with 2^62 counts returned %s", zero_status_name(st));
    expect_in(zero_comm_last_error(comm), "overflows");
    st = zero_alltoall(comm, NULL, buf, 1, ZERO_F32);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT, "alltoall with NULL send returned %s", zero_status_name(st));
    st = zero_alltoall_async(comm, buf, buf + 4 * n, 1, ZERO_F32, NULL);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT, "alltoall_async with NULL req returned %s", zero_status_name(st));
    zero_comm_get_counters(comm, &after);
    CHECK_MSG(!memcmp(&before, &after, sizeof before), "a refused call was counted");
    /* the comm still works */
    CHECK_OK(zero_alltoall(comm, buf, buf + 4 * n, 2, ZERO_F32));
    free(buf), free(cnt), free(cnt2);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 30;
    if (!strcmp(mode, "local")) cfg.backend = ZERO_BACKEND_LOCAL;
    if (!strcmp(mode, "mpi")) cfg.backend = ZERO_BACKEND_MPI;
    if (!strcmp(mode, "counts") || !strcmp(mode, "missing")) cfg.fingerprint = 1;
    if (!strcmp(mode, "counts_nofp") || !strcmp(mode, "missing_nofp")) cfg.fingerprint = 0;
    if (zero_comm_create_world(&comm, &cfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    rank = zero_comm_get_rank(comm);
    size = zero_comm_get_size(comm);
    check_set_rank(rank);
    int want = !strncmp(mode, "missing", 7) ? 3 : !strncmp(mode, "counts", 6) ? 2 : 0;
    if (want && size != want) {
        zero_comm_destroy(comm);
        CHECK_SKIP("%s needs %d ranks", mode, want);
    }
    if (!strncmp(mode, "missing", 7))
        test_missing();
    else if (!strncmp(mode, "counts", 6))
        test_counts(!strcmp(mode, "counts"));
    else if (!strcmp(mode, "misuse"))
        test_misuse();
    else
        run_ops();
    zero_comm_destroy(comm);
    return check_exit();
}
