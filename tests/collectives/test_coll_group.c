/* Groups (zero_comm_group_begin/end): a ring exchange in which every rank
 * sends before it receives.
 *   ring     (np 2-4) ungrouped with 1 MiB messages, the blocking sends wait
 *            for receives nobody posts: every rank gets ZERO_TIMEOUT naming
 *            the send (the deadlock, caught by the deadline); grouped, the
 *            same calls complete and each rank holds exactly its left
 *            neighbour's data (the reference is computed locally); a
 *            collective and an asynchronous receive in a group give the
 *            reference results; counters count the group's ops.
 *   timeout  (np 2) rank 1 posts nothing: rank 0's group end fails with
 *            ZERO_TIMEOUT within its deadline, naming both pending ops and
 *            the peer.
 *   misuse   (any np, LOCAL or MPI) end without begin, waiting a grouped
 *            request early, nesting, an empty group, a bad op inside a
 *            group, destroying a comm with a group open. */
#include <time.h>
#include <zero/comm.h>

#include "check.h"
#include "coll_util.h"

static double coll_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define RING_COUNT (256 * 1024) /* 1 MiB of f32: far past Open MPI's eager limits */

static zero_comm *split_of(zero_comm *world)
{
    zero_comm *c = NULL;
    CHECK_OK(zero_comm_split(world, 0, zero_comm_get_rank(world), &c));
    return c;
}

static void ring(zero_comm *world)
{
    int r = zero_comm_get_rank(world), n = zero_comm_get_size(world);
    if (n < 2) return;
    int right = (r + 1) % n, left = (r + n - 1) % n;
    float *out = malloc(RING_COUNT * 4), *in = malloc(RING_COUNT * 4), *want = malloc(RING_COUNT * 4);
    coll_fill(ZERO_F32, out, RING_COUNT, r, 0);
    coll_fill(ZERO_F32, want, RING_COUNT, left, 0);

    /* Ungrouped: the deadlock, turned into a named timeout by the deadline. */
    zero_comm *dead = split_of(world);
    zero_comm_set_timeout(dead, 1.0);
    zero_status st = zero_send(dead, out, RING_COUNT, ZERO_F32, right);
    CHECK_MSG(st == ZERO_TIMEOUT, "ungrouped send-before-receive ring returned %s (expected the deadlock's TIMEOUT)",
              zero_status_name(st));
    CHECK(strstr(zero_comm_last_error(dead), "send of 262144 x f32") != NULL);
    zero_comm_destroy(dead);
    CHECK_OK(zero_barrier(world));

    /* Grouped: the same calls in the same order complete. */
    zero_comm *c = split_of(world);
    memset(in, 0, RING_COUNT * 4);
    zero_comm_reset_counters(c);
    CHECK_OK(zero_comm_group_begin(c));
    CHECK_OK(zero_send(c, out, RING_COUNT, ZERO_F32, right));
    CHECK_OK(zero_recv(c, in, RING_COUNT, ZERO_F32, left));
    CHECK_OK(zero_comm_group_end(c));
    CHECK_MSG(memcmp(in, want, RING_COUNT * 4) == 0, "ring: data from rank %d differs from the reference", left);
    zero_comm_counters k;
    CHECK_OK(zero_comm_get_counters(c, &k));
    CHECK(k.calls[ZERO_OP_SEND] == 1 && k.calls[ZERO_OP_RECV] == 1);
    CHECK(k.bytes_sent[ZERO_OP_SEND] == RING_COUNT * 4 && k.bytes_recv[ZERO_OP_RECV] == RING_COUNT * 4);

    /* Both directions at once (a pipeline's activation forward, gradient
     * back), bf16, one receive asynchronous, and an all-reduce in the same
     * group; repeated so requests are reused and freed. */
    const size_t nb = 100000, na = 4099;
    uint16_t *bo = malloc(nb * 2), *bl = malloc(nb * 2), *br = malloc(nb * 2), *wl = malloc(nb * 2),
             *wr = malloc(nb * 2);
    float *ar = malloc(na * 4), *war = malloc(na * 4);
    int ranks[64];
    for (int i = 0; i < n; i++) ranks[i] = i;
    coll_fill(ZERO_BF16, bo, nb, r, 7);
    coll_fill(ZERO_BF16, wl, nb, left, 7);
    coll_fill(ZERO_BF16, wr, nb, right, 7);
    for (size_t i = 0; i < na; i++) coll_ref_reduce(ZERO_F32, ZERO_SUM, ranks, n, i, war, i);
    for (int it = 0; it < 3; it++) {
        memset(bl, 0, nb * 2);
        memset(br, 0, nb * 2);
        coll_fill(ZERO_F32, ar, na, r, 0);
        zero_request *req = NULL;
        CHECK_OK(zero_comm_group_begin(c));
        CHECK_OK(zero_send(c, bo, nb, ZERO_BF16, right));
        CHECK_OK(zero_send(c, bo, nb, ZERO_BF16, left));
        CHECK_OK(zero_allreduce(c, ar, ar, na, ZERO_F32, ZERO_SUM));
        CHECK_OK(zero_recv_async(c, bl, nb, ZERO_BF16, left, &req));
        CHECK_OK(zero_recv(c, br, nb, ZERO_BF16, right));
        CHECK_OK(zero_comm_group_end(c));
        CHECK_OK(zero_wait(req));
        if (n == 2) { /* left == right: two messages from one peer, received in the order sent */
            CHECK(memcmp(bl, wl, nb * 2) == 0 && memcmp(br, wl, nb * 2) == 0);
        } else {
            CHECK(memcmp(bl, wl, nb * 2) == 0);
            CHECK(memcmp(br, wr, nb * 2) == 0);
        }
        CHECK(memcmp(ar, war, na * 4) == 0);
    }
    zero_comm_destroy(c);
    free(bo), free(bl), free(br), free(wl), free(wr), free(ar), free(war);
    free(out), free(in), free(want);
}

static void timeout(zero_comm *world)
{
    int r = zero_comm_get_rank(world);
    zero_comm *c = split_of(world);
    zero_comm_set_timeout(c, 1.0);
    float *buf = calloc(RING_COUNT, 4), *in = calloc(RING_COUNT, 4);
    if (r == 0) {
        CHECK_OK(zero_comm_group_begin(c));
        CHECK_OK(zero_send(c, buf, RING_COUNT, ZERO_F32, 1));
        CHECK_OK(zero_recv(c, in, RING_COUNT, ZERO_F32, 1));
        double t0 = coll_now_s();
        zero_status st = zero_comm_group_end(c);
        double dt = coll_now_s() - t0;
        const char *m = zero_comm_last_error(c);
        CHECK_MSG(st == ZERO_TIMEOUT, "group end returned %s", zero_status_name(st));
        CHECK_MSG(dt >= 0.9 && dt < 4.0, "group end took %.2f s with a 1 s deadline", dt);
        CHECK_MSG(strstr(m, "group of 2 op(s) on group") && strstr(m, "send of 262144 x f32 to peer rank 1 (world 1)") &&
                      strstr(m, "recv of 262144 x f32 from peer rank 1 (world 1)"),
                  "message: %s", m);
        /* the comm failed: the next op is refused by name */
        CHECK(zero_barrier(c) == ZERO_INVALID_STATE);
    }
    zero_comm_destroy(c);
    CHECK_OK(zero_barrier(world));
    free(buf), free(in);
}

static void misuse(zero_comm *world)
{
    int r = zero_comm_get_rank(world), n = zero_comm_get_size(world);
    zero_comm *c = split_of(world);
    CHECK(zero_comm_group_end(c) == ZERO_INVALID_STATE);
    CHECK(strstr(zero_comm_last_error(c), "no group is open") != NULL);
    CHECK(zero_comm_group_begin(NULL) == ZERO_INVALID_ARGUMENT);
    CHECK(zero_comm_group_end(NULL) == ZERO_INVALID_ARGUMENT);
    /* empty, and nested */
    CHECK_OK(zero_comm_group_begin(c));
    CHECK_OK(zero_comm_group_end(c));
    float a[64], b[64], w[64];
    int ranks[64];
    for (int i = 0; i < n; i++) ranks[i] = i;
    for (size_t i = 0; i < 64; i++) coll_ref_reduce(ZERO_F32, ZERO_SUM, ranks, n, i, w, i);
    coll_fill(ZERO_F32, a, 64, r, 0);
    zero_request *req = NULL;
    CHECK_OK(zero_comm_group_begin(c));
    CHECK_OK(zero_comm_group_begin(c));
    CHECK_OK(zero_allreduce_async(c, a, b, 64, ZERO_F32, ZERO_SUM, &req));
    /* a grouped request cannot be completed before its group ends; it stays valid */
    int done = 0;
    CHECK(zero_test(req, &done) == ZERO_INVALID_STATE);
    CHECK(zero_wait(req) == ZERO_INVALID_STATE);
    CHECK(strstr(zero_comm_last_error(c), "inside a group that is still open") != NULL);
    /* a bad op is refused at once; the group goes on */
    CHECK(zero_send(c, a, 64, ZERO_F32, n) == ZERO_INVALID_ARGUMENT);
    CHECK_OK(zero_comm_group_end(c)); /* inner: nothing completes yet */
    CHECK(zero_wait(req) == ZERO_INVALID_STATE);
    CHECK_OK(zero_comm_group_end(c));
    CHECK_OK(zero_wait(req));
    CHECK(memcmp(b, w, sizeof w) == 0);
    CHECK(zero_comm_group_end(c) == ZERO_INVALID_STATE);
    /* destroyed with a group open and an op of the group's own outstanding:
     * abandoned, nothing leaks (ASan), the comm is gone */
    zero_comm *d = split_of(world);
    CHECK_OK(zero_comm_group_begin(d));
    CHECK_OK(zero_allreduce(d, a, b, 64, ZERO_F32, ZERO_SUM));
    CHECK_OK(zero_barrier(world)); /* every rank issued it: nothing late crosses into the next test */
    zero_comm_destroy(d);
    zero_comm_destroy(c);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "misuse";
    zero_comm *world = NULL;
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 30;
    if (argc > 2 && strcmp(argv[2], "local") == 0) cfg.backend = ZERO_BACKEND_LOCAL;
    if (zero_comm_create_world(&world, &cfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    check_set_rank(zero_comm_get_rank(world));
    if (strcmp(mode, "ring") == 0) ring(world);
    else if (strcmp(mode, "timeout") == 0) timeout(world);
    else misuse(world);
    zero_comm_destroy(world);
    return check_exit();
}
