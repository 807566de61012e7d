/* Device-buffer backends: NCCL (world 1, one rank per GPU) and STAGED (world
 * 2 on one GPU, through pinned host memory over MPI). Skips (77) without a
 * CUDA build or without a GPU. Same references as the host tests: STAGED is
 * bitwise round-once for bf16; NCCL at world 1 is the input itself.
 *   test_coll_gpu nccl | staged */
#include <zero/comm.h>

#include "check.h"
#include "coll_util.h"
#include "zero_build_config.h"

#if ZERO_HAVE_CUDA && ZERO_HAVE_MPI
#include <cuda_runtime.h>

static int rank, size;
static zero_comm *comm;

static void *dev_from(const void *host, size_t bytes)
{
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) return NULL;
    if (host) cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    return d;
}

static void expect_dev(const void *dev, const void *want, size_t n, zero_dtype d, const char *what)
{
    size_t es = zero_dtype_size(d);
    void *h = malloc(n * es);
    cudaMemcpy(h, dev, n * es, cudaMemcpyDeviceToHost);
    long i = coll_first_diff(h, want, n, es);
    CHECK_MSG(i < 0, "%s: element %ld differs: got %.9g want %.9g", what, i, i < 0 ? 0 : coll_load(d, h, (size_t)i),
              i < 0 ? 0 : coll_load(d, want, (size_t)i));
    free(h);
}

static void run(zero_dtype d, size_t count)
{
    size_t es = zero_dtype_size(d), total = count * (size_t)size;
    int ranks[16];
    for (int q = 0; q < size; q++) ranks[q] = q;
    char *in = malloc(total * es), *want = malloc(total * es);

    /* allreduce sum, out of place and in place */
    coll_fill(d, in, count, rank, 0);
    for (size_t i = 0; i < count; i++) coll_ref_reduce(d, ZERO_SUM, ranks, size, i, want, i);
    void *ds = dev_from(in, count * es), *dr = dev_from(NULL, total * es);
    CHECK_OK(zero_allreduce(comm, ds, dr, count, d, ZERO_SUM));
    expect_dev(dr, want, count, d, "allreduce");
    CHECK_OK(zero_allreduce(comm, ds, ds, count, d, ZERO_SUM));
    expect_dev(ds, want, count, d, "allreduce in place");
    cudaFree(ds);

    /* reduce-scatter */
    coll_fill(d, in, total, rank, 0);
    for (size_t i = 0; i < count; i++) coll_ref_reduce(d, ZERO_SUM, ranks, size, (size_t)rank * count + i, want, i);
    ds = dev_from(in, total * es);
    CHECK_OK(zero_reduce_scatter(comm, ds, dr, count, d, ZERO_SUM));
    expect_dev(dr, want, count, d, "reduce_scatter");
    cudaFree(ds);

    /* all-gather, async */
    coll_fill(d, in, count, rank, 0);
    for (int q = 0; q < size; q++) coll_fill(d, want + (size_t)q * count * es, count, q, 0);
    ds = dev_from(in, count * es);
    zero_request *req = NULL;
    CHECK_OK(zero_allgather_async(comm, ds, dr, count, d, &req));
    CHECK_OK(zero_wait(req));
    expect_dev(dr, want, total, d, "allgather");
    cudaFree(ds);

    /* broadcast from the last rank */
    coll_fill(d, in, count, rank, 0);
    coll_fill(d, want, count, size - 1, 0);
    ds = dev_from(in, count * es);
    CHECK_OK(zero_broadcast(comm, ds, ds, count, d, size - 1));
    expect_dev(ds, want, count, d, "broadcast");

    /* all-to-all: chunk q here is rank q's values at [rank*count, +count) */
    coll_fill(d, in, total, rank, 0);
    for (int q = 0; q < size; q++) coll_fill(d, want + (size_t)q * count * es, count, q, (size_t)rank * count);
    void *ds2 = dev_from(in, total * es);
    CHECK_OK(zero_alltoall(comm, ds2, dr, count, d));
    expect_dev(dr, want, total, d, "alltoall");
    /* all-to-all-v, async: rank q sends (q + j) % 2 * count elements to rank j
     * (empty chunks included), packed */
    {
        size_t sc[16], rc[16], ro = 0, so = 0;
        for (int q = 0; q < size; q++) {
            sc[q] = (size_t)((rank + q) % 2) * count;
            rc[q] = (size_t)((q + rank) % 2) * count;
        }
        for (int q = 0; q < size; q++) {
            coll_fill(d, in + so * es, sc[q], rank, (size_t)q * count);
            coll_fill(d, want + ro * es, rc[q], q, (size_t)rank * count);
            so += sc[q];
            ro += rc[q];
        }
        cudaMemcpy(ds2, in, so * es, cudaMemcpyHostToDevice);
        zero_request *vr = NULL;
        CHECK_OK(zero_alltoallv_async(comm, ds2, sc, NULL, dr, rc, NULL, d, &vr));
        CHECK_OK(zero_wait(vr));
        expect_dev(dr, want, ro, d, "alltoallv");
    }
    cudaFree(ds2);

    if (size > 1) {
        /* ring send/recv */
        int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        coll_fill(d, in, count, rank, 0);
        cudaMemcpy(ds, in, count * es, cudaMemcpyHostToDevice);
        zero_request *rr = NULL, *sr = NULL;
        CHECK_OK(zero_recv_async(comm, dr, count, d, prev, &rr));
        CHECK_OK(zero_send_async(comm, ds, count, d, next, &sr));
        CHECK_OK(zero_wait(sr));
        CHECK_OK(zero_wait(rr));
        coll_fill(d, want, count, prev, 0);
        expect_dev(dr, want, count, d, "send/recv");
    }
    CHECK_OK(zero_barrier(comm));
    cudaFree(ds);
    cudaFree(dr);
    free(in), free(want);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "staged";
    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.timeout_s = 60;
    cfg.backend = !strcmp(which, "nccl") ? ZERO_BACKEND_NCCL : ZERO_BACKEND_STAGED;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) CHECK_SKIP("no CUDA device");
    zero_status st = zero_comm_create_world(&comm, &cfg);
    if (st == ZERO_UNSUPPORTED) CHECK_SKIP("%s backend: %s", which, zero_last_error());
    if (st != ZERO_OK) {
        fprintf(stderr, "init_world(%s): %s\n", which, zero_last_error());
        return 1;
    }
    rank = zero_comm_get_rank(comm);
    size = zero_comm_get_size(comm);
    check_set_rank(rank);
    CHECK(zero_comm_get_backend(comm) == cfg.backend);
    const zero_dtype dts[] = {ZERO_F32, ZERO_BF16, ZERO_F16, ZERO_I32};
    const size_t counts[] = {1, 1009, (1u << 20) + 3};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) run(dts[i], counts[j]);
    /* host memory is refused with a message, and the comm still works */
    float host[4] = {0};
    zero_status hs = zero_allreduce(comm, host, host, 4, ZERO_F32, ZERO_SUM);
    CHECK_MSG(hs == ZERO_INVALID_ARGUMENT && strstr(zero_last_error(), "host memory"), "host buffer: %s: %s",
              zero_status_name(hs), zero_last_error());
    /* a split of a device comm works too */
    zero_comm *half = NULL;
    CHECK_OK(zero_comm_split(comm, rank % 2, rank, &half));
    float one = 1, *d1 = dev_from(&one, 4);
    CHECK_OK(zero_allreduce(half, d1, d1, 1, ZERO_F32, ZERO_SUM));
    float got = 0;
    cudaMemcpy(&got, d1, 4, cudaMemcpyDeviceToHost);
    CHECK(got == (float)zero_comm_get_size(half));
    cudaFree(d1);
    zero_comm_destroy(half);
    zero_comm_destroy(comm);
    return check_exit();
}
#else
int main(void) { CHECK_SKIP("built without CUDA or MPI"); }
#endif
