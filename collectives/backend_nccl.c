/* NCCL: device buffers, one rank per GPU.
 *
 * One ncclComm per group, bootstrapped over the group's MPI communicator
 * (rank 0's ncclUniqueId is broadcast with a deadline, then the
 * communicator is created non-blocking and polled under the same deadline,
 * so a missing rank times out in either place instead of hanging in NCCL). Ops run on the comm's own stream; each request records a CUDA event
 * and completes when cudaEventQuery says so, polled under the deadline while
 * ncclCommGetAsyncError is watched for peer failures. A failed comm is torn
 * down with ncclCommAbort, which does not wait for peers.
 *
 * f16/bf16 reductions are NCCL's native ones: NCCL adds in fp32 but rounds to
 * 16 bits between ring steps, so unlike the MPI/STAGED/LOCAL backends they
 * are not round-once at world size > 2 (docs/collectives.md). */
#include "comm_internal.h"
#include "device/cuda_module.h"

#if ZERO_HAVE_NCCL

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct nccl_impl {
    MPI_Comm comm;
    ncclComm_t nccl;
    cudaStream_t stream;
    int *scratch; /* one int on the device, for barrier */
} nccl_impl;

typedef struct nccl_req {
    cudaEvent_t ev;
    int recorded; /* inside a group the event is recorded at the group's end (be_group_end) */
} nccl_req;

static zero_status nccl_fail(zero_comm *c, ncclResult_t r, const char *what)
{
    zero_status st = (r == ncclRemoteError || r == ncclSystemError) ? ZERO_PEER_FAILURE : ZERO_BACKEND;
    return coll_comm_fail(c, st, "%s on group %s(size %d) rank %d (device %d): NCCL error %d: %s", what, c->name,
                          c->size, c->rank, c->device, (int)r, zero_cu->ncclGetErrorString(r));
}

static zero_status cuda_fail(zero_comm *c, cudaError_t e, const char *what)
{
    return coll_comm_fail(c, ZERO_BACKEND, "%s on group %s(size %d) rank %d (device %d): CUDA error %s: %s", what,
                          c->name, c->size, c->rank, c->device, zero_cu->cudaGetErrorName(e), zero_cu->cudaGetErrorString(e));
}

static void impl_free(zero_comm *c, nccl_impl *m, int abort_nccl)
{
    if (m->nccl) {
        if (abort_nccl)
            zero_cu->ncclCommAbort(m->nccl);
        else
            zero_cu->ncclCommDestroy(m->nccl);
    }
    if (m->stream) zero_cu->cudaStreamDestroy(m->stream);
    if (m->scratch) zero_cu->cudaFree(m->scratch);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !abort_nccl && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    (void)c;
    free(m);
}

typedef struct nccl_init_poll {
    ncclComm_t comm;
    ncclResult_t state;
} nccl_init_poll;

/* coll_poll callback: done once a non-blocking NCCL call left ncclInProgress. */
static zero_status nccl_init_test(void *ctx, int *done)
{
    nccl_init_poll *p = ctx;
    ncclResult_t r = zero_cu->ncclCommGetAsyncError(p->comm, &p->state);
    if (r != ncclSuccess) p->state = r;
    *done = p->state != ncclInProgress;
    return ZERO_OK;
}

/* NCCL communicator for c over m->comm (c's rank and size are set). */
static zero_status bootstrap(zero_comm *c, zero_comm *msg_comm, nccl_impl *m)
{
    /* On the heap: after a timeout MPI may still write it. */
    ncclUniqueId *id = calloc(1, sizeof *id);
    if (!id) return zero_fail(&msg_comm->err, ZERO_OUT_OF_MEMORY, "nccl bootstrap: out of memory");
    if (c->rank == 0) {
        ncclResult_t r = zero_cu->ncclGetUniqueId(id);
        if (r != ncclSuccess) {
            free(id);
            return nccl_fail(msg_comm, r, "ncclGetUniqueId");
        }
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Ibcast(id, (int)sizeof *id, MPI_BYTE, 0, m->comm, &req);
    if (rc != MPI_SUCCESS) {
        free(id);
        return mpi_status_from(msg_comm, rc, "nccl bootstrap");
    }
    zero_status st = mpi_wait_raw(msg_comm, msg_comm, &req, "nccl bootstrap (broadcast of the unique id)");
    if (st != ZERO_OK) {
        coll_graveyard_add(id, free);
        return st;
    }
    cudaError_t ce = zero_cu->cudaSetDevice(c->device);
    if (ce != cudaSuccess) {
        free(id);
        return cuda_fail(msg_comm, ce, "nccl bootstrap: cudaSetDevice");
    }
    /* Non-blocking init, polled against the comm's deadline: a peer that dies
     * between the id broadcast and the init must not hang the others inside
     * NCCL. On expiry the half-built communicator is aborted. */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = zero_cu->ncclCommInitRankConfig(&m->nccl, c->size, *id, c->rank, &config);
    free(id);
    if (r == ncclInProgress) {
        nccl_init_poll poll = {m->nccl, ncclInProgress};
        zero_status pst = coll_poll(nccl_init_test, &poll, c->timeout_s);
        r = poll.state;
        if (pst == ZERO_TIMEOUT) {
            zero_cu->ncclCommAbort(m->nccl);
            m->nccl = NULL;
            return coll_comm_fail(msg_comm, ZERO_TIMEOUT,
                                  "ncclCommInitRank on group %s(size %d) rank %d (device %d): timed out after "
                                  "%.1f s waiting for ranks 0-%d",
                                  c->name, c->size, c->rank, c->device, c->timeout_s, c->size - 1);
        }
    }
    if (r != ncclSuccess) {
        if (m->nccl) zero_cu->ncclCommAbort(m->nccl);
        m->nccl = NULL;
        return nccl_fail(msg_comm, r, "ncclCommInitRank");
    }
    cudaError_t e = zero_cu->cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = zero_cu->cudaMalloc((void **)&m->scratch, sizeof(int));
    if (e != cudaSuccess) return cuda_fail(msg_comm, e, "nccl comm setup");
    return ZERO_OK;
}

static zero_status be_init_world(zero_comm *c, const zero_comm_config *cfg)
{
    nccl_impl *m = calloc(1, sizeof *m);
    if (!m) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "zero_comm_create_world: out of memory");
    m->comm = MPI_COMM_NULL;
    zero_status st = mpi_world_common(c, &m->comm);
    if (st == ZERO_OK) st = coll_cuda_pick_device(c, m->comm, cfg->device);
    if (st == ZERO_OK) st = bootstrap(c, c, m);
    if (st != ZERO_OK) {
        impl_free(c, m, 1);
        return st;
    }
    c->impl = m;
    return ZERO_OK;
}

static ncclDataType_t nccl_type(zero_dtype d)
{
    switch (d) {
    case ZERO_F32: return ncclFloat32;
    case ZERO_F16: return ncclFloat16;
    case ZERO_BF16: return ncclBfloat16;
    case ZERO_I32: return ncclInt32;
    case ZERO_I64: return ncclInt64;
    case ZERO_U8: return ncclUint8;
    case ZERO_F64: return ncclFloat64;
    }
    return ncclFloat32;
}

/* The comm's own stream, or the caller's in stream-ordered mode (stream.c). */
static cudaStream_t op_stream(const zero_comm *c, const nccl_impl *m)
{
    void *s = coll_stream_cuda(c);
    return s ? (cudaStream_t)s : m->stream;
}

/* All-to-all(-v) as NCCL's grouped point-to-point (what ncclAllToAll would
 * be): a send and a receive per peer in one group, the own chunk copied on
 * the comm's stream. Empty chunks are skipped on both sides (the counts
 * agree; NCCL comms check no fingerprints, so ranks that disagree hang until
 * the deadline here, where MPI/STAGED report ZERO_MISMATCH). */
static ncclResult_t nccl_alltoall(zero_comm *c, nccl_impl *m, const coll_args *a, ncclDataType_t t)
{
    size_t es = zero_dtype_size(a->dtype);
    coll_a2a_chunk own = coll_a2a_peer(a, c->size, c->rank);
    if (own.send_count &&
        zero_cu->cudaMemcpyAsync((char *)a->recv + own.recv_displ * es, (const char *)a->send + own.send_displ * es,
                        own.send_count * es, cudaMemcpyDeviceToDevice, op_stream(c, m)) != cudaSuccess)
        return ncclUnhandledCudaError;
    ncclResult_t r = zero_cu->ncclGroupStart();
    for (int i = 1; i < c->size && r == ncclSuccess; i++) {
        /* rotated, as the MPI exchange: not every rank starts with rank 0 */
        int to = (c->rank + i) % c->size, from = (c->rank - i + c->size) % c->size;
        coll_a2a_chunk kt = coll_a2a_peer(a, c->size, to), kf = coll_a2a_peer(a, c->size, from);
        if (kt.send_count)
            r = zero_cu->ncclSend((const char *)a->send + kt.send_displ * es, kt.send_count, t, to, m->nccl, op_stream(c, m));
        if (r == ncclSuccess && kf.recv_count)
            r = zero_cu->ncclRecv((char *)a->recv + kf.recv_displ * es, kf.recv_count, t, from, m->nccl, op_stream(c, m));
    }
    ncclResult_t end = zero_cu->ncclGroupEnd();
    return r != ncclSuccess ? r : end;
}

static zero_status be_start(zero_comm *c, zero_request *req)
{
    nccl_impl *m = c->impl;
    const coll_args *a = &req->args;
    ncclDataType_t t = nccl_type(a->dtype);
    ncclRedOp_t op = a->op == ZERO_MAX ? ncclMax : ncclSum;
    ZERO_TRY(coll_cuda_check_buffers(c, a));
    ncclResult_t r = ncclSuccess;
    cudaError_t ce = zero_cu->cudaSetDevice(c->device);
    if (ce != cudaSuccess) return cuda_fail(c, ce, coll_op_name(a->kind));
    switch (a->kind) {
    case ZERO_OP_ALLREDUCE: r = zero_cu->ncclAllReduce(a->send, a->recv, a->count, t, op, m->nccl, op_stream(c, m)); break;
    case ZERO_OP_REDUCE_SCATTER: r = zero_cu->ncclReduceScatter(a->send, a->recv, a->count, t, op, m->nccl, op_stream(c, m)); break;
    case ZERO_OP_ALLGATHER: r = zero_cu->ncclAllGather(a->send, a->recv, a->count, t, m->nccl, op_stream(c, m)); break;
    case ZERO_OP_BROADCAST: r = zero_cu->ncclBroadcast(a->send, a->recv, a->count, t, a->root, m->nccl, op_stream(c, m)); break;
    case ZERO_OP_SEND:
    case ZERO_OP_RECV:
        /* A group lets NCCL pair the send with its recv without deadlock. */
        r = zero_cu->ncclGroupStart();
        if (r == ncclSuccess)
            r = a->kind == ZERO_OP_SEND ? zero_cu->ncclSend(a->send, a->count, t, a->peer, m->nccl, op_stream(c, m))
                                        : zero_cu->ncclRecv(a->recv, a->count, t, a->peer, m->nccl, op_stream(c, m));
        if (r == ncclSuccess) r = zero_cu->ncclGroupEnd();
        break;
    case ZERO_OP_BARRIER:
        r = zero_cu->ncclAllReduce(m->scratch, m->scratch, 1, ncclInt32, ncclSum, m->nccl, op_stream(c, m));
        break;
    case ZERO_OP_ALLTOALL:
    case ZERO_OP_ALLTOALLV:
        r = nccl_alltoall(c, m, a, t);
        break;
    default: return zero_fail(&c->err, ZERO_INTERNAL, "nccl backend: op kind %d", (int)a->kind);
    }
    if (r == ncclInProgress) {
        /* The communicator is non-blocking (see bootstrap): the enqueue may
         * still be in progress; it must settle before the next NCCL call. */
        nccl_init_poll poll = {m->nccl, ncclInProgress};
        if (coll_poll(nccl_init_test, &poll, c->timeout_s) == ZERO_TIMEOUT)
            return coll_comm_fail(c, ZERO_TIMEOUT, "%s on group %s(size %d) rank %d: NCCL enqueue timed out after %.1f s",
                                  coll_op_name(a->kind), c->name, c->size, c->rank, c->timeout_s);
        r = poll.state;
    }
    if (r != ncclSuccess) return nccl_fail(c, r, coll_op_name(a->kind));
    nccl_req *q = calloc(1, sizeof *q);
    if (!q) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", coll_op_name(a->kind));
    cudaError_t e = zero_cu->cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming);
    /* Inside a group NCCL enqueues nothing before ncclGroupEnd: an event
     * recorded now would complete before the op. */
    if (e == cudaSuccess && c->group_depth == 0) {
        e = zero_cu->cudaEventRecord(q->ev, op_stream(c, m));
        q->recorded = 1;
    }
    if (e != cudaSuccess) {
        if (q->ev) zero_cu->cudaEventDestroy(q->ev);
        free(q);
        return cuda_fail(c, e, coll_op_name(a->kind));
    }
    req->impl = q;
    return ZERO_OK;
}

static zero_status be_test(zero_comm *c, zero_request *req, int *done)
{
    nccl_impl *m = c->impl;
    nccl_req *q = req->impl;
    if (!q->recorded) { /* its group has not ended (ops.c refuses waits until then) */
        *done = 0;
        return ZERO_OK;
    }
    cudaError_t e = zero_cu->cudaEventQuery(q->ev);
    if (e == cudaErrorNotReady) {
        *done = 0;
        ncclResult_t async = ncclSuccess;
        zero_cu->ncclCommGetAsyncError(m->nccl, &async);
        if (async != ncclSuccess && async != ncclInProgress) return nccl_fail(c, async, coll_op_name(req->args.kind));
        return ZERO_OK;
    }
    if (e != cudaSuccess) return cuda_fail(c, e, coll_op_name(req->args.kind));
    *done = 1;
    zero_cu->cudaEventDestroy(q->ev);
    free(q);
    req->impl = NULL;
    return ZERO_OK;
}

static void be_abandon(zero_comm *c, zero_request *req)
{
    (void)c;
    nccl_req *q = req->impl;
    if (!q) return;
    zero_cu->cudaEventDestroy(q->ev); /* released by CUDA once the stream passes it */
    free(q);
    req->impl = NULL;
}

/* zero_comm_group_begin: NCCL's own group (ncclGroupStart nests, so the
 * per-op group around a send or receive in be_start stays harmless). */
static zero_status be_group_begin(zero_comm *c)
{
    ncclResult_t r = zero_cu->ncclGroupStart();
    return r == ncclSuccess ? ZERO_OK : nccl_fail(c, r, "ncclGroupStart");
}

/* The end of a group: ncclGroupEnd enqueues the ops (settled under the
 * deadline on our non-blocking communicator), then each request's event is
 * recorded behind them. head is NULL for an inner (nested) end. */
static zero_status be_group_end(zero_comm *c, zero_request *head)
{
    nccl_impl *m = c->impl;
    cudaError_t ce = zero_cu->cudaSetDevice(c->device);
    if (ce != cudaSuccess) return cuda_fail(c, ce, "ncclGroupEnd");
    ncclResult_t r = zero_cu->ncclGroupEnd();
    if (r == ncclInProgress) {
        nccl_init_poll poll = {m->nccl, ncclInProgress};
        if (coll_poll(nccl_init_test, &poll, c->timeout_s) == ZERO_TIMEOUT)
            return coll_comm_fail(c, ZERO_TIMEOUT, "ncclGroupEnd on group %s(size %d) rank %d: timed out after %.1f s",
                                  c->name, c->size, c->rank, c->timeout_s);
        r = poll.state;
    }
    if (r != ncclSuccess) return nccl_fail(c, r, "ncclGroupEnd");
    for (zero_request *req = head; req; req = req->group_next) {
        nccl_req *q = req->impl;
        if (!q || q->recorded) continue;
        cudaError_t e = zero_cu->cudaEventRecord(q->ev, op_stream(c, m));
        if (e != cudaSuccess) return cuda_fail(c, e, "cudaEventRecord after ncclGroupEnd");
        q->recorded = 1;
    }
    return ZERO_OK;
}

static zero_status be_split(zero_comm *parent, int color, int key, zero_comm *child)
{
    nccl_impl *pm = parent->impl;
    nccl_impl *m = calloc(1, sizeof *m);
    if (!m) return zero_fail(&parent->err, ZERO_OUT_OF_MEMORY, "split of group %s: out of memory", parent->name);
    zero_status st = mpi_split_common(parent, pm->comm, color, key, child, &m->comm);
    if (st != ZERO_OK) {
        free(m);
        return st;
    }
    st = bootstrap(child, parent, m);
    if (st != ZERO_OK) {
        impl_free(child, m, 1);
        return st;
    }
    child->impl = m;
    return ZERO_OK;
}

static void be_destroy(zero_comm *c)
{
    nccl_impl *m = c->impl;
    if (!m) return;
    zero_cu->cudaSetDevice(c->device);
    impl_free(c, m, c->failed != ZERO_OK);
    c->impl = NULL;
}

const coll_backend coll_backend_nccl = {
    .name = "nccl",
    .init_world = be_init_world,
    .start = be_start,
    .test = be_test,
    .abandon = be_abandon,
    .split = be_split,
    .destroy = be_destroy,
    .group_begin = be_group_begin,
    .group_end = be_group_end,
};

#endif /* ZERO_HAVE_NCCL */
