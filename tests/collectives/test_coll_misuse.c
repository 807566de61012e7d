/* Misuse is refused with ZERO_INVALID_ARGUMENT and a message saying what was
 * wrong, without communicating and without breaking the comm. */
#include <stdint.h>
#include <zero/comm.h>

#include "check.h"
#include "coll_util.h"

#define EXPECT(call, code, needle)                                                                \
    do {                                                                                          \
        zero_status st_ = (call);                                                                 \
        CHECK_MSG(st_ == (code), "%s returned %s: %s", #call, zero_status_name(st_), zero_last_error()); \
        CHECK_MSG(strstr(zero_last_error(), (needle)) != NULL, "%s: message lacks \"%s\": %s", #call, (needle), \
                  zero_last_error());                                                             \
    } while (0)

int main(int argc, char **argv)
{
    zero_comm *c = NULL;
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 30;
    if (argc > 1 && !strcmp(argv[1], "local")) cfg.backend = ZERO_BACKEND_LOCAL;

    /* bad configs */
    zero_comm_config bad = cfg;
    bad.timeout_s = 0;
    EXPECT(zero_comm_create_world(&c, &bad), ZERO_INVALID_ARGUMENT, "timeout_s");
    bad = cfg;
    bad.version = 99;
    EXPECT(zero_comm_create_world(&c, &bad), ZERO_INVALID_ARGUMENT, "ZERO_COMM_CONFIG_INIT");
    bad = cfg;
    bad.backend = (zero_backend)42;
    EXPECT(zero_comm_create_world(&c, &bad), ZERO_INVALID_ARGUMENT, "backend");
    EXPECT(zero_comm_create_world(NULL, &cfg), ZERO_INVALID_ARGUMENT, "out is NULL");
    CHECK(c == NULL);

    if (zero_comm_create_world(&c, &cfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    int r = zero_comm_get_rank(c), n = zero_comm_get_size(c);
    check_set_rank(r);
    float buf[64] = {0}, big[256] = {0};
    zero_request *req = NULL;

    /* NULL comm, for every entry point */
    EXPECT(zero_allreduce(NULL, buf, buf, 4, ZERO_F32, ZERO_SUM), ZERO_INVALID_ARGUMENT, "comm is NULL");
    EXPECT(zero_reduce_scatter(NULL, buf, buf, 4, ZERO_F32, ZERO_SUM), ZERO_INVALID_ARGUMENT, "comm is NULL");
    EXPECT(zero_allgather(NULL, buf, buf, 4, ZERO_F32), ZERO_INVALID_ARGUMENT, "comm is NULL");
    EXPECT(zero_broadcast(NULL, buf, buf, 4, ZERO_F32, 0), ZERO_INVALID_ARGUMENT, "comm is NULL");
    EXPECT(zero_send(NULL, buf, 4, ZERO_F32, 0), ZERO_INVALID_ARGUMENT, "comm is NULL");
    EXPECT(zero_recv(NULL, buf, 4, ZERO_F32, 0), ZERO_INVALID_ARGUMENT, "comm is NULL");
    EXPECT(zero_barrier(NULL), ZERO_INVALID_ARGUMENT, "comm is NULL");
    EXPECT(zero_allreduce_async(NULL, buf, buf, 4, ZERO_F32, ZERO_SUM, &req), ZERO_INVALID_ARGUMENT, "comm is NULL");
    CHECK(req == NULL);
    EXPECT(zero_allreduce_async(c, buf, buf, 4, ZERO_F32, ZERO_SUM, NULL), ZERO_INVALID_ARGUMENT, "req is NULL");
    EXPECT(zero_comm_split(NULL, 0, 0, &(zero_comm *){NULL}), ZERO_INVALID_ARGUMENT, "parent comm is NULL");
    EXPECT(zero_test(NULL, &(int){0}), ZERO_INVALID_ARGUMENT, "req is NULL");
    EXPECT(zero_comm_get_counters(NULL, &(zero_comm_counters){0}), ZERO_INVALID_ARGUMENT, "comm is NULL");
    CHECK(zero_comm_get_rank(NULL) == -1 && zero_comm_get_size(NULL) == 0);
    zero_comm_destroy(NULL);

    zero_comm_reset_counters(c);
    /* bad root / peer */
    EXPECT(zero_broadcast(c, buf, buf, 4, ZERO_F32, n), ZERO_INVALID_ARGUMENT, "root");
    EXPECT(zero_broadcast(c, buf, buf, 4, ZERO_F32, -1), ZERO_INVALID_ARGUMENT, "root -1");
    EXPECT(zero_send(c, buf, 4, ZERO_F32, n), ZERO_INVALID_ARGUMENT, "peer");
    EXPECT(zero_recv(c, buf, 4, ZERO_F32, r), ZERO_INVALID_ARGUMENT, "this rank itself");
    /* bad dtype / op / buffers */
    EXPECT(zero_allreduce(c, buf, buf, 4, (zero_dtype)99, ZERO_SUM), ZERO_INVALID_ARGUMENT, "dtype 99");
    EXPECT(zero_allreduce(c, buf, buf, 4, ZERO_F32, (zero_redop)7), ZERO_INVALID_ARGUMENT, "reduction op 7");
    EXPECT(zero_allreduce(c, NULL, buf, 4, ZERO_F32, ZERO_SUM), ZERO_INVALID_ARGUMENT, "send buffer is NULL");
    EXPECT(zero_allgather(c, buf, NULL, 4, ZERO_F32), ZERO_INVALID_ARGUMENT, "recv buffer is NULL");
    /* overlap that is not the in-place layout */
    EXPECT(zero_allreduce(c, buf, buf + 1, 8, ZERO_F32, ZERO_SUM), ZERO_INVALID_ARGUMENT, "overlap");
    EXPECT(zero_reduce_scatter(c, big, big + (size_t)r * 4 + 1, 4, ZERO_F32, ZERO_SUM), ZERO_INVALID_ARGUMENT,
           "recv == send + rank*count");
    EXPECT(zero_allgather(c, big + (size_t)r * 4 + 2, big, 4, ZERO_F32), ZERO_INVALID_ARGUMENT,
           "send == recv + rank*count");
    EXPECT(zero_broadcast(c, buf, buf + 2, 4, ZERO_F32, r), ZERO_INVALID_ARGUMENT, "overlap");
    /* count overflow */
    EXPECT(zero_allreduce(c, buf, big, SIZE_MAX / 2, ZERO_F32, ZERO_SUM), ZERO_INVALID_ARGUMENT, "count overflows");
    EXPECT(zero_allgather(c, buf, big, SIZE_MAX / 4 / (size_t)n + 1, ZERO_F32), ZERO_INVALID_ARGUMENT,
           "count overflows");
    EXPECT(zero_reduce_scatter(c, big, buf, (size_t)PTRDIFF_MAX / 8 / (size_t)n + 1, ZERO_F64, ZERO_SUM),
           ZERO_INVALID_ARGUMENT, "count overflows");
    /* other entry points */
    EXPECT(zero_comm_set_timeout(c, -1), ZERO_INVALID_ARGUMENT, "timeout_s must be > 0");
    EXPECT(zero_comm_split(c, -3, 0, &(zero_comm *){NULL}), ZERO_INVALID_ARGUMENT, "color");
    zero_grid g;
    EXPECT(zero_grid_create(c, n + 1, 1, &g), ZERO_INVALID_ARGUMENT, "does not divide");
    CHECK(g.tp == NULL);
    EXPECT(zero_comm_set_name(c, ""), ZERO_INVALID_ARGUMENT, "name");

    /* Rejected calls count nothing and leave the comm usable. */
    zero_comm_counters k;
    CHECK_OK(zero_comm_get_counters(c, &k));
    for (int i = 0; i < ZERO_OP_KIND_COUNT; i++) CHECK(k.calls[i] == 0 && k.bytes_sent[i] == 0);
    float one = 1, sum = 0;
    CHECK_OK(zero_allreduce(c, &one, &sum, 1, ZERO_F32, ZERO_SUM));
    CHECK(sum == (float)n);
    CHECK_OK(zero_comm_set_name(c, "trainer-world"));
    CHECK(!strcmp(zero_comm_get_name(c), "trainer-world"));
    CHECK(strlen(zero_comm_last_error(c)) > 0);
    zero_comm_destroy(c);
    return check_exit();
}
