/* STAGED: device buffers carried over MPI through pinned host memory.
 *
 * NCCL refuses two ranks on one GPU; this backend lets several ranks share a
 * device so sharding can be tested at world size > 1 on a single GPU. Each
 * op copies its device input to a pinned host buffer, runs the MPI backend's
 * op on host memory (same deadline, same fp32 accumulation for f16/bf16),
 * and copies the result back to the device when it completes. */
#include "comm_internal.h"
#include "device/cuda_module.h"

#if ZERO_HAVE_MPI && ZERO_HAVE_CUDA

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct staged_impl {
    MPI_Comm comm;
    coll_scratch pinned; /* reusable pinned buffers (scratch.h): cudaMallocHost is slow */
} staged_impl;

typedef struct staged_req {
    mpi_op op;
    void *host;         /* pinned: host send part, then host recv part */
    size_t host_bytes;
    int host_cached;    /* slot of the comm's pinned scratch (0: the op's own) */
    void *dev_recv;     /* where the result goes back */
    void *host_recv;
    size_t recv_bytes;
    const coll_args *a2a; /* all-to-all(-v): copy back chunk by chunk (gaps of recv stay untouched) */
    int n;
} staged_req;

static zero_status cuda_fail(zero_comm *c, cudaError_t e, const char *what)
{
    return coll_comm_fail(c, ZERO_BACKEND, "%s on group %s(size %d) rank %d (device %d): CUDA error %s: %s", what,
                          c->name, c->size, c->rank, c->device, zero_cu->cudaGetErrorName(e), zero_cu->cudaGetErrorString(e));
}

static zero_status pick_device(zero_comm *c, MPI_Comm mc, int requested)
{
    /* The first use of CUDA may be a comm's: load the module (cuda_module.h). */
    zero_status st = zero_cuda_load(c->backend == ZERO_BACKEND_NCCL ? "init_world (nccl backend)"
                                                                    : "init_world (staged backend)");
    if (st != ZERO_OK) return zero_fail_forward(&c->err, st, "");
    int count = 0;
    cudaError_t e = zero_cu->cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return zero_fail(&c->err, ZERO_UNSUPPORTED, "init_world (%s backend): no CUDA device (%s)",
                         c->backend == ZERO_BACKEND_NCCL ? "nccl" : "staged",
                         e != cudaSuccess ? zero_cu->cudaGetErrorString(e) : "0 devices");
    int dev = requested;
    if (dev < 0) {
        int local = 0;
        ZERO_TRY(mpi_local_rank(c, mc, &local));
        dev = local % count;
    }
    if (dev >= count)
        return zero_fail(&c->err, ZERO_INVALID_ARGUMENT, "init_world: device %d requested but only %d present", dev,
                         count);
    e = zero_cu->cudaSetDevice(dev);
    if (e != cudaSuccess) return cuda_fail(c, e, "init_world (cudaSetDevice)");
    c->device = dev;
    return ZERO_OK;
}

zero_status coll_cuda_check_buffers(zero_comm *c, const coll_args *a)
{
    const void *ptrs[2] = {a->send, a->recv};
    const char *names[2] = {"send", "recv"};
    for (int i = 0; i < 2; i++) {
        if (!ptrs[i] || a->count == 0) continue;
        struct cudaPointerAttributes attr;
        cudaError_t e = zero_cu->cudaPointerGetAttributes(&attr, ptrs[i]);
        if (e != cudaSuccess) {
            zero_cu->cudaGetLastError(); /* clear the sticky-free error state */
            continue;          /* unknown to CUDA: let the copy report it */
        }
        if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
            return zero_fail(&c->err, ZERO_INVALID_ARGUMENT,
                             "%s on group %s(size %d) rank %d: %s buffer %p is host memory; the %s backend "
                             "takes device memory",
                             coll_op_name(a->kind), c->name, c->size, c->rank, names[i], ptrs[i],
                             c->backend == ZERO_BACKEND_NCCL ? "nccl" : "staged");
    }
    return ZERO_OK;
}

static void free_pinned(void *p) { zero_cu->cudaFreeHost(p); }

static void *alloc_pinned(size_t bytes)
{
    void *p = NULL;
    return zero_cu->cudaMallocHost(&p, bytes) == cudaSuccess ? p : NULL;
}

static void pinned_scratch_init(staged_impl *m)
{
    m->pinned.alloc = alloc_pinned;
    m->pinned.release = free_pinned;
}

static zero_status be_init_world(zero_comm *c, const zero_comm_config *cfg)
{
    staged_impl *m = calloc(1, sizeof *m);
    if (!m) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "zero_comm_create_world: out of memory");
    m->comm = MPI_COMM_NULL;
    zero_status st = mpi_world_common(c, &m->comm);
    if (st == ZERO_OK) st = pick_device(c, m->comm, cfg->device);
    if (st != ZERO_OK) {
        /* after a timeout MPI may still run ops on it: leave it to MPI_Finalize */
        if (m->comm != MPI_COMM_NULL && c->failed == ZERO_OK) MPI_Comm_free(&m->comm);
        free(m);
        return st;
    }
    pinned_scratch_init(m);
    c->impl = m;
    return ZERO_OK;
}

static zero_status be_start(zero_comm *c, zero_request *req)
{
    staged_impl *m = c->impl;
    const coll_args *a = &req->args;
    size_t es = zero_dtype_size(a->dtype), chunk = a->count * es, n = (size_t)c->size;
    size_t off = (size_t)c->rank * chunk;
    size_t send_b = 0, recv_b = 0;
    switch (a->kind) {
    case ZERO_OP_ALLREDUCE: case ZERO_OP_BROADCAST: recv_b = chunk; break; /* in place on host */
    case ZERO_OP_REDUCE_SCATTER: send_b = chunk * n; recv_b = chunk; break;
    case ZERO_OP_ALLGATHER: recv_b = chunk * n; break;                     /* in place on host */
    case ZERO_OP_SEND: send_b = chunk; break;
    case ZERO_OP_RECV: recv_b = chunk; break;
    case ZERO_OP_ALLTOALL:
    case ZERO_OP_ALLTOALLV:
        send_b = coll_a2a_extent(a, c->size, 0) * es;
        recv_b = coll_a2a_extent(a, c->size, 1) * es;
        break;
    default: break;
    }
    ZERO_TRY(coll_cuda_check_buffers(c, a));
    staged_req *r = calloc(1, sizeof *r);
    if (!r) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", coll_op_name(a->kind));
    r->host_bytes = send_b + recv_b;
    if (r->host_bytes) {
        r->host = coll_scratch_get(&m->pinned, r->host_bytes, &r->host_cached);
        if (!r->host) {
            size_t bytes = r->host_bytes;
            free(r);
            return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s on group %s rank %d: no pinned memory for %zu bytes",
                             coll_op_name(a->kind), c->name, c->rank, bytes);
        }
    }
    char *hs = r->host, *hr = (char *)r->host + send_b;
    coll_args h = *a;
    cudaError_t e = cudaSuccess;
    zero_cu->cudaSetDevice(c->device);
    switch (a->kind) {
    case ZERO_OP_ALLREDUCE:
        e = zero_cu->cudaMemcpy(hr, a->send, chunk, cudaMemcpyDeviceToHost);
        h.send = hr; h.recv = hr;
        break;
    case ZERO_OP_BROADCAST:
        if (c->rank == a->root) e = zero_cu->cudaMemcpy(hr, a->send, chunk, cudaMemcpyDeviceToHost);
        h.send = hr; h.recv = hr;
        break;
    case ZERO_OP_REDUCE_SCATTER:
        e = zero_cu->cudaMemcpy(hs, a->send, chunk * n, cudaMemcpyDeviceToHost);
        h.send = hs; h.recv = hr;
        break;
    case ZERO_OP_ALLGATHER:
        e = zero_cu->cudaMemcpy(hr + off, a->send, chunk, cudaMemcpyDeviceToHost);
        h.send = hr + off; h.recv = hr;
        break;
    case ZERO_OP_SEND:
        e = zero_cu->cudaMemcpy(hs, a->send, chunk, cudaMemcpyDeviceToHost);
        h.send = hs;
        break;
    case ZERO_OP_RECV: h.recv = hr; break;
    case ZERO_OP_ALLTOALL:
    case ZERO_OP_ALLTOALLV: /* same displacements on the host copies */
        if (send_b) e = zero_cu->cudaMemcpy(hs, a->send, send_b, cudaMemcpyDeviceToHost);
        h.send = hs; h.recv = hr;
        r->a2a = &req->args;
        r->n = c->size;
        break;
    default: break;
    }
    if (e != cudaSuccess) {
        coll_scratch_put(&m->pinned, r->host, r->host_cached);
        free(r);
        return cuda_fail(c, e, "staging copy to host");
    }
    if (recv_b) {
        r->dev_recv = a->recv;
        r->host_recv = hr;
        r->recv_bytes = recv_b;
    }
    zero_status st = mpi_op_start(c, m->comm, &h, &r->op);
    if (st != ZERO_OK) {
        coll_scratch_put(&m->pinned, r->host, r->host_cached);
        free(r);
        return st;
    }
    req->impl = r;
    return ZERO_OK;
}

static zero_status be_test(zero_comm *c, zero_request *req, int *done)
{
    staged_impl *m = c->impl;
    staged_req *r = req->impl;
    ZERO_TRY(mpi_op_test(c, &r->op, done));
    if (!*done) return ZERO_OK;
    zero_status st = ZERO_OK;
    if (r->recv_bytes) {
        zero_cu->cudaSetDevice(c->device);
        cudaError_t e = cudaSuccess;
        if (r->a2a && r->a2a->kind == ZERO_OP_ALLTOALLV) {
            size_t es = zero_dtype_size(r->a2a->dtype);
            for (int p = 0; p < r->n && e == cudaSuccess; p++) {
                coll_a2a_chunk k = coll_a2a_peer(r->a2a, r->n, p);
                if (k.recv_count)
                    e = zero_cu->cudaMemcpy((char *)r->dev_recv + k.recv_displ * es, (char *)r->host_recv + k.recv_displ * es,
                                   k.recv_count * es, cudaMemcpyHostToDevice);
            }
        } else {
            e = zero_cu->cudaMemcpy(r->dev_recv, r->host_recv, r->recv_bytes, cudaMemcpyHostToDevice);
        }
        if (e != cudaSuccess) st = cuda_fail(c, e, "staging copy to device");
    }
    coll_scratch_put(&m->pinned, r->host, r->host_cached);
    free(r);
    req->impl = NULL;
    return st;
}

static void be_abandon(zero_comm *c, zero_request *req)
{
    staged_impl *m = c->impl;
    staged_req *r = req->impl;
    if (!r) return;
    int pending = r->op.req != MPI_REQUEST_NULL || r->op.sched || r->op.a2a; /* MPI may still read the host copy */
    mpi_op_abandon(&r->op);
    if (r->host) {
        if (pending)
            coll_scratch_abandon(&m->pinned, r->host, r->host_cached);
        else
            coll_scratch_put(&m->pinned, r->host, r->host_cached);
    }
    free(r);
    req->impl = NULL;
}

static zero_status be_split(zero_comm *parent, int color, int key, zero_comm *child)
{
    staged_impl *pm = parent->impl;
    staged_impl *m = calloc(1, sizeof *m);
    if (!m) return zero_fail(&parent->err, ZERO_OUT_OF_MEMORY, "split of group %s: out of memory", parent->name);
    zero_status st = mpi_split_common(parent, pm->comm, color, key, child, &m->comm);
    if (st != ZERO_OK) {
        free(m);
        return st;
    }
    pinned_scratch_init(m);
    child->impl = m;
    return ZERO_OK;
}

static void be_failed(zero_comm *c)
{
    staged_impl *m = c->impl;
    if (m) mpi_fp_poison(c, m->comm);
}

static int be_missing(zero_comm *c, zero_request *req, unsigned char *missing)
{
    staged_req *r = req->impl;
    return r ? mpi_op_missing(c, &r->op, missing) : 0;
}

static void be_advance(zero_comm *c, zero_request *req)
{
    staged_req *r = req->impl;
    if (r) mpi_op_advance(c, &r->op);
}

static void be_destroy(zero_comm *c)
{
    staged_impl *m = c->impl;
    if (!m) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && c->failed == ZERO_OK && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    coll_scratch_release(&m->pinned);
    free(m);
    c->impl = NULL;
}

const coll_backend coll_backend_staged = {
    .name = "staged",
    .init_world = be_init_world,
    .start = be_start,
    .test = be_test,
    .abandon = be_abandon,
    .split = be_split,
    .destroy = be_destroy,
    .failed = be_failed,
    .missing = be_missing,
    .advance = be_advance,
};

/* The NCCL backend picks its device the same way. */
zero_status coll_cuda_pick_device(zero_comm *c, MPI_Comm mc, int requested) { return pick_device(c, mc, requested); }

#endif /* ZERO_HAVE_MPI && ZERO_HAVE_CUDA */
