/* Deadlines: a rank that skips a collective, or leaves early, makes every
 * other rank fail within the comm's timeout with a message naming the op and
 * the group; the failed comm then refuses ops, and every rank (the absent one
 * too) shuts down cleanly with exit 0.
 *   test_coll_deadline skip   rank 0 skips an allreduce, a split, two async ops
 *                             and a send
 *   test_coll_deadline leave  rank 0 destroys its world (MPI_Finalize) first
 *   test_coll_deadline cap    under ZERO_COLL_TIMEOUT_S=1 (meson.build): the
 *                             comms ask for 30 s and 600 s but get 1 s, and
 *                             the skip case fails by that deadline */
#include <zero/comm.h>

#include <time.h>

#include "check.h"
#include "coll_util.h"

#define TIMEOUT_S 1.0

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* The call must fail by the deadline (not much later), name the op. */
static void expect_timeout(zero_status st, double t0, zero_comm *c, const char *op)
{
    double dt = now() - t0;
    CHECK_MSG(st == ZERO_TIMEOUT || st == ZERO_PEER_FAILURE, "%s returned %s: %s", op, zero_status_name(st),
              zero_last_error());
    CHECK_MSG(dt >= TIMEOUT_S * 0.95 || st == ZERO_PEER_FAILURE, "%s failed after %.2f s, before its deadline", op, dt);
    CHECK_MSG(dt < TIMEOUT_S + 3.0, "%s took %.2f s for a %.1f s deadline", op, dt, TIMEOUT_S);
    CHECK_MSG(strstr(zero_comm_last_error(c), op) != NULL, "message does not name %s: %s", op,
              zero_comm_last_error(c));
    CHECK_MSG(strstr(zero_last_error(), op) != NULL, "thread message does not name %s: %s", op, zero_last_error());
    CHECK_MSG(strstr(zero_comm_last_error(c), zero_comm_get_name(c)) != NULL, "message does not name the group: %s",
              zero_comm_last_error(c));
    fprintf(stderr, "[rank %d] expected failure: %s\n", zero_comm_get_world_rank(c), zero_comm_last_error(c));
}

static void expect_failed_state(zero_comm *c)
{
    float x = 1;
    double t0 = now();
    CHECK(zero_allreduce(c, &x, &x, 1, ZERO_F32, ZERO_SUM) == ZERO_INVALID_STATE);
    CHECK(strstr(zero_comm_last_error(c), "failed earlier") != NULL);
    zero_request *req = NULL;
    CHECK(zero_allgather_async(c, &x, &x, 1, ZERO_F32, &req) == ZERO_INVALID_STATE && req == NULL);
    CHECK(zero_barrier(c) == ZERO_INVALID_STATE);
    CHECK_MSG(now() - t0 < 0.5, "a failed comm must refuse at once, took %.2f s", now() - t0);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "skip";
    zero_comm *world = NULL, *p2p = NULL, *third = NULL, *fourth = NULL;
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 30;
    if (zero_comm_create_world(&world, &cfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    int r = zero_comm_get_rank(world), n = zero_comm_get_size(world);
    check_set_rank(r);
    if (n < 2) {
        zero_comm_destroy(world);
        CHECK_SKIP("needs at least 2 ranks");
    }
    CHECK_OK(zero_comm_split(world, 0, r, &p2p));
    CHECK_OK(zero_comm_split(world, 0, r, &third));
    CHECK_OK(zero_comm_split(world, 0, r, &fourth));
    CHECK_OK(zero_comm_set_name(p2p, "p2p"));
    CHECK_OK(zero_comm_set_name(third, "third"));
    if (!strcmp(mode, "cap")) {
        /* The world asked for 30 s and its splits inherit that; a later
         * request for more is capped too, one for less is kept. */
        CHECK(zero_comm_get_timeout(world) == TIMEOUT_S);
        CHECK(zero_comm_get_timeout(third) == TIMEOUT_S);
        CHECK_OK(zero_comm_set_timeout(world, 600));
        CHECK(zero_comm_get_timeout(world) == TIMEOUT_S);
        CHECK_OK(zero_comm_set_timeout(p2p, 0.5));
        CHECK(zero_comm_get_timeout(p2p) == 0.5);
        CHECK_OK(zero_comm_set_timeout(p2p, 600));
        CHECK(zero_comm_get_timeout(p2p) == TIMEOUT_S);
        mode = "skip";
    } else {
        CHECK_OK(zero_comm_set_timeout(fourth, TIMEOUT_S));
        CHECK_OK(zero_comm_set_timeout(third, TIMEOUT_S));
        CHECK_OK(zero_comm_set_timeout(world, TIMEOUT_S));
        CHECK_OK(zero_comm_set_timeout(p2p, TIMEOUT_S));
    }
    CHECK(zero_comm_get_timeout(world) == TIMEOUT_S);

    /* Large enough for the rendezvous protocol: the abandoned op holds
     * buffers MPI may still touch. */
    size_t count = (size_t)1 << 20;
    float *buf = calloc(count, sizeof *buf);

    if (!strcmp(mode, "skip")) {
        if (r != 0) {
            double t0 = now();
            zero_status st = zero_allreduce(world, buf, buf, count, ZERO_F32, ZERO_SUM);
            expect_timeout(st, t0, world, "allreduce");
            CHECK(strstr(zero_comm_last_error(world), "timed out after 1.0 s") != NULL);
            expect_failed_state(world);
            /* rank 0 never joins this split either */
            zero_comm *child = NULL;
            t0 = now();
            st = zero_comm_split(third, 1, 0, &child);
            CHECK(child == NULL);
            expect_timeout(st, t0, third, "split");
            expect_failed_state(third);
            /* two async ops rank 0 never joins: the first wait times out, the
             * second is refused at once (no second deadline) */
            zero_request *q1 = NULL, *q2 = NULL;
            float x[64] = {0};
            CHECK_OK(zero_allreduce_async(fourth, x, x, 64, ZERO_F32, ZERO_SUM, &q1));
            CHECK_OK(zero_allgather_async(fourth, x, buf, 16, ZERO_F32, &q2));
            t0 = now();
            expect_timeout(zero_wait(q1), t0, fourth, "allreduce");
            t0 = now();
            CHECK(zero_wait(q2) == ZERO_INVALID_STATE);
            CHECK(strstr(zero_last_error(), "allgather") && strstr(zero_last_error(), "failed earlier"));
            /* and it carries the first failure's own message: its waiter may never have looked */
            CHECK_MSG(strstr(zero_last_error(), "ZERO_TIMEOUT: allreduce") && strstr(zero_last_error(), "timed out"),
                      "the refusal does not carry the first failure: %s", zero_last_error());
            CHECK_MSG(now() - t0 < 0.5, "second wait took %.2f s", now() - t0);
            if (r == 1) {
                /* rank 0 never sends */
                t0 = now();
                zero_request *req = NULL;
                CHECK_OK(zero_recv_async(p2p, buf, 16, ZERO_F32, 0, &req));
                st = zero_wait(req);
                expect_timeout(st, t0, p2p, "recv");
                CHECK(strstr(zero_comm_last_error(p2p), "peer rank 0") != NULL);
                expect_failed_state(p2p);
            }
        }
    } else {
        /* rank 0 leaves: destroys everything (MPI_Finalize) and exits 0
         * while the others wait for it in a barrier. */
        if (r == 0) {
            zero_comm_destroy(fourth);
            zero_comm_destroy(third);
            zero_comm_destroy(p2p);
            zero_comm_destroy(world);
            free(buf);
            return check_exit();
        }
        double t0 = now();
        expect_timeout(zero_barrier(world), t0, world, "barrier");
        expect_failed_state(world);
    }
    /* destroy must not hang on a failed comm, and MPI_Finalize must not
     * either (the test's own timeout catches a hang). */
    double t0 = now();
    zero_comm_destroy(fourth);
    zero_comm_destroy(third);
    zero_comm_destroy(p2p);
    zero_comm_destroy(world);
    CHECK_MSG(now() - t0 < 10.0, "destroy took %.2f s", now() - t0);
    free(buf);
    return check_exit();
}
