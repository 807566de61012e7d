/* Stream-ordered collectives (comm.h "stream-ordered collectives") on the
 * CPU device, run with ZERO_CPU_ASYNC=1 and random per-op delays (meson
 * test coll_stream_*), so each stream is a worker thread and a missing wait
 * shows up as wrong numbers:
 *
 *   order     a producer on stream S (a copy of this rank's input, then a
 *             kernel doubling it), a stream-ordered all-reduce /
 *             reduce-scatter / all-gather / group of both on S, a consumer
 *             (a copy out) on S: the results are bitwise the one-rank
 *             reference, 2 x the plain sum of every rank's input (exact
 *             fp32 values, so the sum order does not matter), after
 *             zero_comm_sync and zero_stream_sync. Argument errors come
 *             from the call; the asynchronous forms are refused.
 *   stuck     (world >= 2) the last rank never joins a stream-ordered
 *             all-reduce: on the others zero_comm_sync returns ZERO_TIMEOUT
 *             naming the op and the missing rank, within the 1 s deadline
 *             plus 2 s, and the comm then refuses every call.
 *
 *   test_coll_stream order|stuck */
#include <time.h>
#include <zero/experimental.h>

#include "check.h"
#include "coll_util.h"

#define N 4099

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float input(int r, size_t i) { return (float)coll_value(ZERO_F32, r, i); }

/* 2 x the sum over ranks of element i, in rank order (exact). */
static float reference(int size, size_t i)
{
    float s = 0;
    for (int r = 0; r < size; r++) s += input(r, i);
    return 2.0f * s;
}

static void check_order(zero_comm *world, zero_device *dev)
{
    const int rank = zero_comm_get_rank(world), size = zero_comm_get_size(world);
    zero_stream *s = NULL;
    CHECK_OK(zero_stream_create(dev, &s));
    const size_t total = (size_t)N * (size_t)size;
    float *src = malloc(total * sizeof *src), *out = malloc((N + total) * sizeof *out);
    float *buf = NULL, *buf2 = NULL, *chunk = NULL;
    CHECK_OK(zero_device_alloc(dev, total * sizeof *buf, (void **)&buf));
    CHECK_OK(zero_device_alloc(dev, total * sizeof *buf2, (void **)&buf2));
    CHECK_OK(zero_device_alloc(dev, (size_t)N * sizeof *chunk, (void **)&chunk));
    for (size_t i = 0; i < total; i++) src[i] = input(rank, i);
    CHECK_OK(zero_comm_set_stream(world, s));
    CHECK(zero_comm_get_stream(world) == s);

    for (int kind = 0; kind < 4; kind++) {
        static const char *names[] = {"allreduce", "reduce_scatter", "allgather", "group(allreduce, allgather)"};
        /* Poison what the op writes, synchronously, so a result read early shows. */
        for (size_t i = 0; i < N + total; i++) out[i] = NAN;
        CHECK_OK(zero_memcpy(dev, buf, out, total * sizeof *buf));
        CHECK_OK(zero_memcpy(dev, buf2, out, total * sizeof *buf2));
        CHECK_OK(zero_memcpy(dev, chunk, out, (size_t)N * sizeof *chunk));
        /* producer: the input, then a kernel on it */
        const size_t in_n = kind == 2 ? N : (kind == 1 ? total : N);
        float *in_at = kind == 2 ? buf + (size_t)rank * N : buf; /* all-gather in place: send = recv + rank*count */
        CHECK_OK(zero_memcpy_async(dev, in_at, kind == 2 ? src + (size_t)rank * N : src, in_n * sizeof *buf, s));
        CHECK_OK(zero_scale(dev, in_at, ZERO_F32, in_n, 2.0f, s));
        zero_status st = ZERO_OK;
        switch (kind) {
        case 0: st = zero_allreduce(world, buf, buf, N, ZERO_F32, ZERO_SUM); break;
        case 1: st = zero_reduce_scatter(world, buf, chunk, N, ZERO_F32, ZERO_SUM); break;
        case 2: st = zero_allgather(world, in_at, buf, N, ZERO_F32); break;
        default: /* two independent ops as one unit: buf all-reduced, this rank's part gathered into buf2 */
            CHECK_OK(zero_memcpy_async(dev, chunk, src + (size_t)rank * N, N * sizeof *chunk, s));
            CHECK_OK(zero_scale(dev, chunk, ZERO_F32, N, 2.0f, s));
            CHECK_OK(zero_comm_group_begin(world));
            CHECK_OK(zero_allreduce(world, buf, buf, N, ZERO_F32, ZERO_SUM));
            CHECK_OK(zero_allgather(world, chunk, buf2, N, ZERO_F32));
            st = zero_comm_group_end(world);
            break;
        }
        CHECK_MSG(st == ZERO_OK, "%s: %s: %s", names[kind], zero_status_name(st), zero_last_error());
        /* consumer */
        const size_t out_n = kind == 1 ? N : kind == 0 ? N : kind == 2 ? total : N + total;
        CHECK_OK(zero_memcpy_async(dev, out, kind == 1 ? chunk : buf, (kind == 3 ? N : out_n) * sizeof *out, s));
        if (kind == 3) CHECK_OK(zero_memcpy_async(dev, out + N, buf2, total * sizeof *out, s));
        st = zero_comm_sync(world);
        CHECK_MSG(st == ZERO_OK, "%s: zero_comm_sync: %s: %s", names[kind], zero_status_name(st), zero_last_error());
        CHECK_OK(zero_stream_sync(s));
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < out_n; i++) {
            float want;
            if (kind == 0) want = reference(size, i);
            else if (kind == 1) want = reference(size, (size_t)rank * N + i);
            else if (kind == 2) want = 2.0f * input((int)(i / N), i);
            else want = i < N ? reference(size, i) : 2.0f * input((int)((i - N) / N), i - N);
            if (memcmp(&want, &out[i], sizeof want) && !bad++) first = i;
        }
        CHECK_MSG(!bad, "%s at world %d: %zu of %zu elements differ from the reference, the first at %zu", names[kind],
                  size, bad, out_n, first);
    }

    /* Argument errors come from the call itself; nothing is queued. */
    zero_status st = zero_allreduce(world, buf, buf + 1, N, ZERO_F32, ZERO_SUM);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT && strstr(zero_last_error(), "overlap"), "bad in-place: %s: %s",
              zero_status_name(st), zero_last_error());
    zero_request *req = NULL;
    st = zero_allreduce_async(world, buf, buf, N, ZERO_F32, ZERO_SUM, &req);
    CHECK_MSG(st == ZERO_INVALID_STATE && !req && strstr(zero_last_error(), "stream"), "async form: %s: %s",
              zero_status_name(st), zero_last_error());
    CHECK_OK(zero_comm_sync(world)); /* nothing failed */
    CHECK_OK(zero_comm_set_stream(world, NULL));
    CHECK(zero_comm_get_stream(world) == NULL);
    CHECK_OK(zero_allreduce(world, buf, buf, N, ZERO_F32, ZERO_SUM)); /* host-blocking again */
    zero_device_free(dev, buf);
    zero_device_free(dev, buf2);
    zero_device_free(dev, chunk);
    zero_stream_destroy(s);
    free(src);
    free(out);
}

static void check_stuck(zero_comm *world, zero_device *dev)
{
    const int rank = zero_comm_get_rank(world), size = zero_comm_get_size(world);
    zero_comm *sub = NULL;
    CHECK_OK(zero_comm_split(world, 0, rank, &sub));
    if (!sub) return;
    CHECK_OK(zero_comm_set_timeout(sub, 1.0));
    zero_stream *s = NULL;
    CHECK_OK(zero_stream_create(dev, &s));
    float *buf = NULL;
    CHECK_OK(zero_device_alloc(dev, N * sizeof *buf, (void **)&buf));
    CHECK_OK(zero_comm_set_stream(sub, s));
    if (rank != size - 1) { /* the last rank never joins */
        const double t0 = now_s();
        CHECK_OK(zero_fill_value(dev, buf, ZERO_F32, N, 1.0f, s));
        CHECK_OK(zero_allreduce(sub, buf, buf, N, ZERO_F32, ZERO_SUM));
        zero_status st = zero_comm_sync(sub);
        const double took = now_s() - t0;
        char missing[32];
        snprintf(missing, sizeof missing, "%d", zero_comm_get_world_rank_of(sub, size - 1));
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zero_last_error());
        CHECK_MSG(st == ZERO_TIMEOUT && strstr(msg, "allreduce") && strstr(msg, "rank") && strstr(msg, missing),
                  "stuck peer: zero_comm_sync gave %s: %s", zero_status_name(st), msg);
        CHECK_MSG(took < 1.0 + 2.0, "stuck peer: zero_comm_sync took %.2f s (deadline 1 s)", took);
        st = zero_allreduce(sub, buf, buf, N, ZERO_F32, ZERO_SUM);
        CHECK_MSG(st == ZERO_INVALID_STATE && strstr(zero_last_error(), "failed earlier"),
                  "after the failure: %s: %s", zero_status_name(st), zero_last_error());
        CHECK(strstr(zero_comm_last_error(sub), "allreduce") != NULL);
        if (rank == 0) fprintf(stderr, "stuck peer: %s (after %.2f s)\n", msg, took);
    }
    CHECK_OK(zero_stream_sync(s));
    zero_comm_destroy(sub);
    CHECK_OK(zero_barrier(world)); /* the last rank leaves only after the others' checks */
    zero_device_free(dev, buf);
    zero_stream_destroy(s);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "order";
    zero_comm_config ccfg = ZERO_COMM_CONFIG_INIT;
    ccfg.timeout_s = 30;
    zero_comm *world = NULL;
    if (zero_comm_create_world(&world, &ccfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    check_set_rank(zero_comm_get_rank(world));
    zero_device *dev = NULL;
    CHECK_OK(zero_device_create(&dev, ZERO_DEVICE_CPU, -1));
    if (dev && !strcmp(mode, "order")) {
        for (int rep = 0; rep < 3; rep++) check_order(world, dev); /* several seeds of delays in one run */
    } else if (dev && !strcmp(mode, "stuck")) {
        if (zero_comm_get_size(world) < 2) CHECK_SKIP("stuck needs two ranks");
        check_stuck(world, dev);
    }
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
