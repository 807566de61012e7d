/* The op entry points: validate, count bytes, issue through the backend,
 * and (for blocking calls) wait with the comm's deadline. */
#include "comm_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- checks */

/* Where validation writes its message: the comm's own buffer, or (set by
 * coll_validate_detached, for a stream-ordered call while the comm's state
 * belongs to its stream's worker) a buffer of the calling thread. */
static _Thread_local zero_errbuf *detached_err;
#define VERR(c) (detached_err ? detached_err : &(c)->err)

static int overlaps(const void *p, size_t plen, const void *q, size_t qlen)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    if (!plen || !qlen) return 0;
    return a < b + qlen && b < a + plen;
}

static zero_status bad(zero_comm *c, const coll_args *a, const char *fmt_detail, long long v)
{
    char what[96], detail[200];
    coll_describe(a, what, sizeof what);
    snprintf(detail, sizeof detail, fmt_detail, v);
    return zero_fail(VERR(c), ZERO_INVALID_ARGUMENT, "%s on group %s(size %d) rank %d: %s", what, c->name,
                     c->size, c->rank, detail);
}

static int is_reduction(zero_op_kind k) { return k == ZERO_OP_ALLREDUCE || k == ZERO_OP_REDUCE_SCATTER; }

/* Bytes of the send and recv buffers this rank passes. */
static void buffer_bytes(const zero_comm *c, const coll_args *a, size_t es, size_t *send_b, size_t *recv_b)
{
    size_t chunk = a->count * es, n = (size_t)c->size;
    switch (a->kind) {
    case ZERO_OP_REDUCE_SCATTER: *send_b = chunk * n; *recv_b = chunk; break;
    case ZERO_OP_ALLGATHER: *send_b = chunk; *recv_b = chunk * n; break;
    case ZERO_OP_SEND: *send_b = chunk; *recv_b = 0; break;
    case ZERO_OP_RECV: *send_b = 0; *recv_b = chunk; break;
    case ZERO_OP_BROADCAST: *send_b = c->rank == a->root ? chunk : 0; *recv_b = chunk; break;
    default: *send_b = chunk; *recv_b = chunk; break;
    }
}

size_t coll_a2a_extent(const coll_args *a, int n, int which)
{
    size_t ext = 0;
    for (int p = 0; p < n; p++) {
        coll_a2a_chunk k = coll_a2a_peer(a, n, p);
        size_t e = which ? k.recv_displ + k.recv_count : k.send_displ + k.send_count;
        if ((which ? k.recv_count : k.send_count) && e > ext) ext = e;
    }
    return ext;
}

/* All-to-all-v: copy the caller's arrays into one owned block (packed
 * displacements where the caller passed NULL), check that every chunk is
 * addressable, and set a->v and a->count (the elements this rank sends). */
static zero_status prepare_alltoallv(zero_comm *c, coll_args *a, size_t es, size_t **vec_out)
{
    static const char *names[4] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
    size_t n = (size_t)c->size;
    if (!a->user_v[0] || !a->user_v[2])
        return zero_fail(VERR(c), ZERO_INVALID_ARGUMENT, "alltoallv on group %s(size %d) rank %d: %s is NULL "
                         "(an array of %d counts is expected)", c->name, c->size, c->rank,
                         names[a->user_v[0] ? 2 : 0], c->size);
    size_t *v = malloc(4 * n * sizeof *v);
    if (!v) return zero_fail(VERR(c), ZERO_OUT_OF_MEMORY, "alltoallv on group %s: out of memory", c->name);
    size_t limit = (size_t)PTRDIFF_MAX / es, total = 0;
    for (int half = 0; half < 2; half++) {
        const size_t *cnt = a->user_v[2 * half], *dsp = a->user_v[2 * half + 1];
        size_t *vc = v + 2 * half * n, *vd = vc + n, packed = 0;
        for (size_t j = 0; j < n; j++) {
            vc[j] = cnt[j];
            vd[j] = dsp ? dsp[j] : packed;
            if (cnt[j] > limit || vd[j] > limit - cnt[j] || (!dsp && packed > limit - cnt[j])) {
                size_t displ = vd[j]; /* vd points into v: read it before v is freed */
                free(v);
                return zero_fail(VERR(c), ZERO_INVALID_ARGUMENT,
                                 "alltoallv on group %s(size %d) rank %d: %s[%zu] = %zu with %s[%zu] = %zu "
                                 "overflows: the chunk's end exceeds PTRDIFF_MAX bytes",
                                 c->name, c->size, c->rank, names[2 * half], j, cnt[j], names[2 * half + 1], j,
                                 displ);
            }
            packed += cnt[j];
        }
    }
    for (size_t j = 0; j < n; j++) total += v[j];
    a->v = v;
    a->count = total;
    size_t me = (size_t)c->rank;
    if (v[me] != v[2 * n + me]) {
        zero_status st = zero_fail(VERR(c), ZERO_INVALID_ARGUMENT,
                                   "alltoallv of %zu x %s on group %s(size %d) rank %d: send_counts[%d] = %zu but "
                                   "recv_counts[%d] = %zu: this rank's chunk to itself must be the same size",
                                   total, zero_dtype_name(a->dtype), c->name, c->size, c->rank, c->rank, v[me],
                                   c->rank, v[2 * n + me]);
        free(v);
        a->v = NULL;
        return st;
    }
    *vec_out = v;
    return ZERO_OK;
}

/* All-to-all(-v) buffers: non-NULL where a chunk is, and never overlapping
 * (there is no in-place form). */
static zero_status validate_a2a(zero_comm *c, coll_args *a, size_t es, size_t **vec_out)
{
    if (a->kind == ZERO_OP_ALLTOALLV) ZERO_TRY(prepare_alltoallv(c, a, es, vec_out));
    size_t send_b = coll_a2a_extent(a, c->size, 0) * es, recv_b = coll_a2a_extent(a, c->size, 1) * es;
    zero_status st = ZERO_OK;
    if (send_b && !a->send)
        st = bad(c, a, "send buffer is NULL (%lld bytes expected)", (long long)send_b);
    else if (recv_b && !a->recv)
        st = bad(c, a, "recv buffer is NULL (%lld bytes expected)", (long long)recv_b);
    else if (overlaps(a->send, send_b, a->recv, recv_b)) {
        char what[96];
        coll_describe(a, what, sizeof what);
        st = zero_fail(VERR(c), ZERO_INVALID_ARGUMENT,
                       "%s on group %s(size %d) rank %d: send [%p, +%zu) and recv [%p, +%zu) overlap; all-to-all "
                       "has no in-place form",
                       what, c->name, c->size, c->rank, a->send, send_b, a->recv, recv_b);
    }
    if (st != ZERO_OK && *vec_out) {
        free(*vec_out);
        *vec_out = NULL;
        a->v = NULL;
    }
    return st;
}

static zero_status validate(zero_comm *c, coll_args *a, const char *fn, size_t **vec_out)
{
    ZERO_TRY(coll_comm_check(c, fn));
    if (!detached_err && c->failed != ZERO_OK) {
        char what[96];
        coll_describe(a, what, sizeof what);
        return zero_fail(VERR(c), ZERO_INVALID_STATE,
                         "%s on group %s(size %d) rank %d: the group failed earlier (%s); only "
                         "zero_comm_destroy is allowed",
                         what, c->name, c->size, c->rank, coll_failed_cause(c));
    }
    if (a->kind == ZERO_OP_BARRIER) return ZERO_OK;
    size_t es = zero_dtype_size(a->dtype);
    if (!es) return bad(c, a, "dtype %lld is not a zero_dtype", (long long)a->dtype);
    if (is_reduction(a->kind) && a->op != ZERO_SUM && a->op != ZERO_MAX)
        return bad(c, a, "reduction op %lld is neither ZERO_SUM nor ZERO_MAX", (long long)a->op);
    if (a->kind == ZERO_OP_ALLTOALLV) return validate_a2a(c, a, es, vec_out);
    /* The whole array (count * size elements for reduce-scatter, all-gather
     * and all-to-all) must be addressable. */
    size_t n = (a->kind == ZERO_OP_REDUCE_SCATTER || a->kind == ZERO_OP_ALLGATHER || a->kind == ZERO_OP_ALLTOALL)
                   ? (size_t)c->size
                   : 1;
    if (a->count > (size_t)PTRDIFF_MAX / es / n)
        return bad(c, a, "count overflows: count * ranks * element size exceeds PTRDIFF_MAX (%lld ranks)",
                   (long long)n);
    if (a->kind == ZERO_OP_BROADCAST && (a->root < 0 || a->root >= c->size))
        return bad(c, a, "root %lld is not a rank of the group", (long long)a->root);
    if (a->kind == ZERO_OP_SEND || a->kind == ZERO_OP_RECV) {
        if (a->peer < 0 || a->peer >= c->size)
            return bad(c, a, "peer %lld is not a rank of the group", (long long)a->peer);
        if (a->peer == c->rank) return bad(c, a, "peer %lld is this rank itself", (long long)a->peer);
    }
    if (a->count == 0) return ZERO_OK;
    if (a->kind == ZERO_OP_ALLTOALL) return validate_a2a(c, a, es, vec_out);

    size_t send_b, recv_b;
    buffer_bytes(c, a, es, &send_b, &recv_b);
    if (send_b && !a->send) return bad(c, a, "send buffer is NULL (%lld bytes expected)", (long long)send_b);
    if (recv_b && !a->recv) return bad(c, a, "recv buffer is NULL (%lld bytes expected)", (long long)recv_b);
    if (!send_b || !recv_b) return ZERO_OK;

    /* NCCL's in-place rules; any other overlap is an error. */
    size_t chunk = a->count * es, off = (size_t)c->rank * chunk;
    const char *s = a->send;
    char *r = a->recv;
    switch (a->kind) {
    case ZERO_OP_ALLREDUCE:
    case ZERO_OP_BROADCAST:
        if (s == r) return ZERO_OK;
        break;
    case ZERO_OP_REDUCE_SCATTER:
        if (r == s + off) return ZERO_OK;
        break;
    case ZERO_OP_ALLGATHER:
        if (s == r + off) return ZERO_OK;
        break;
    default: break;
    }
    if (overlaps(s, send_b, r, recv_b)) {
        static const char *rule[] = {"recv == send", "recv == send + rank*count", "send == recv + rank*count",
                                     "recv == send"};
        char what[96];
        coll_describe(a, what, sizeof what);
        return zero_fail(VERR(c), ZERO_INVALID_ARGUMENT,
                         "%s on group %s(size %d) rank %d: send [%p, +%zu) and recv [%p, +%zu) overlap "
                         "but are not in place (in place means %s)",
                         what, c->name, c->size, c->rank, (const void *)s, send_b, (void *)r, recv_b,
                         rule[a->kind]);
    }
    return ZERO_OK;
}

/* ---------------------------------------------------------------- counters
 * The bandwidth-optimal (ring) volume, as documented in comm.h. */
static void count_op(zero_comm *c, const coll_args *a)
{
    zero_comm_counters *k = &c->counters;
    k->calls[a->kind]++;
    uint64_t n = (uint64_t)c->size;
    if (n < 2 || a->kind == ZERO_OP_BARRIER) return;
    uint64_t es = zero_dtype_size(a->dtype), chunk = (uint64_t)a->count * es;
    switch (a->kind) {
    case ZERO_OP_ALLREDUCE: {
        /* 2 S (n-1)/n, rounded down; S(n-1)/n per phase is exact only when
         * n divides S, so compute the product first. */
        uint64_t v = 2 * chunk * (n - 1) / n;
        k->bytes_sent[a->kind] += v;
        k->bytes_recv[a->kind] += v;
        break;
    }
    case ZERO_OP_REDUCE_SCATTER:
    case ZERO_OP_ALLGATHER:
        k->bytes_sent[a->kind] += chunk * (n - 1);
        k->bytes_recv[a->kind] += chunk * (n - 1);
        break;
    case ZERO_OP_BROADCAST:
        if (c->rank == a->root)
            k->bytes_sent[a->kind] += chunk;
        else
            k->bytes_recv[a->kind] += chunk;
        break;
    case ZERO_OP_ALLTOALL:
    case ZERO_OP_ALLTOALLV:
        /* what actually crosses to other ranks; the own chunk is a copy */
        for (int p = 0; p < c->size; p++) {
            if (p == c->rank) continue;
            coll_a2a_chunk q = coll_a2a_peer(a, c->size, p);
            k->bytes_sent[a->kind] += (uint64_t)q.send_count * es;
            k->bytes_recv[a->kind] += (uint64_t)q.recv_count * es;
        }
        break;
    case ZERO_OP_SEND: k->bytes_sent[a->kind] += chunk; break;
    case ZERO_OP_RECV: k->bytes_recv[a->kind] += chunk; break;
    default: break;
    }
}

/* ---------------------------------------------------------------- issue */

static zero_status issue(zero_comm *c, coll_args *a, const char *fn, zero_request *req)
{
    size_t *vec = NULL;
    memset(req, 0, sizeof *req);
    ZERO_TRY(validate(c, a, fn, &vec));
    req->vec = vec; /* freed with the request (release_request) */
    req->comm = c;
    if (a->kind != ZERO_OP_SEND && a->kind != ZERO_OP_RECV) a->seq = c->coll_seq++;
    req->args = *a;
    req->status = ZERO_OK;
    count_op(c, a);
    /* An empty collective moves nothing on any rank (count is equal
     * everywhere), so it completes here; an empty send still carries a
     * message and a barrier synchronizes. */
    if (a->count == 0 && a->kind != ZERO_OP_BARRIER && a->kind != ZERO_OP_SEND && a->kind != ZERO_OP_RECV &&
        a->kind != ZERO_OP_ALLTOALLV) { /* all-to-all-v: others may still send to this rank */
        req->done = 1;
        return ZERO_OK;
    }
    coll_advance_others(c, NULL);
    zero_status st = c->be->start(c, req);
    if (st != ZERO_OK) {
        if (st != ZERO_INVALID_ARGUMENT && st != ZERO_UNSUPPORTED && st != ZERO_OUT_OF_MEMORY)
            coll_comm_mark_failed(c, st);
        return st;
    }
    return ZERO_OK;
}

/* What a request owns besides itself. */
static void release_request(zero_request *req)
{
    free(req->vec);
    req->vec = NULL;
}

void coll_request_free(zero_request *req)
{
    release_request(req);
    free(req);
}

zero_status coll_validate_detached(zero_comm *c, coll_args *a, const char *fn, size_t **vec_out)
{
    zero_errbuf local;
    memset(&local, 0, sizeof local);
    detached_err = &local;
    zero_status st = validate(c, a, fn, vec_out);
    detached_err = NULL;
    if (st != ZERO_OK) return zero_fail(NULL, st, "%s", local.msg);
    return ZERO_OK;
}

zero_status coll_run_blocking(zero_comm *c, coll_args *a, const char *fn)
{
    if (coll_comm_live(c) && coll_stream_mode(c)) return coll_stream_issue(c, a, fn); /* stream.c */
    if (coll_comm_live(c) && c->group_depth > 0) {
        /* Inside a group: issued now, completed by zero_comm_group_end (group.c). */
        zero_request *req = NULL;
        ZERO_TRY(coll_run_async(c, a, fn, &req));
        req->grouped = COLL_GROUPED_OWNED;
        return ZERO_OK;
    }
    zero_request req;
    zero_status st = issue(c, a, fn, &req);
    if (st == ZERO_OK) st = coll_wait_request(&req);
    release_request(&req);
    return st;
}

zero_status coll_run_async(zero_comm *c, coll_args *a, const char *fn, zero_request **out)
{
    zero_errbuf *err = coll_comm_live(c) ? &c->err : NULL;
    if (!out) return zero_fail(err, ZERO_INVALID_ARGUMENT, "%s: req is NULL", fn);
    *out = NULL;
    zero_request *req = malloc(sizeof *req);
    if (!req) return zero_fail(err, ZERO_OUT_OF_MEMORY, "%s: out of memory", fn);
    zero_status st = issue(c, a, fn, req);
    if (st != ZERO_OK) {
        release_request(req);
        free(req);
        return st;
    }
    c->outstanding++;
    req->next = c->pending;
    if (c->pending) c->pending->prev = req;
    c->pending = req;
    if (c->group_depth > 0) coll_group_add(c, req, COLL_GROUPED_ASYNC);
    *out = req;
    return ZERO_OK;
}

/* The caller's asynchronous forms: not with a stream (the blocking forms are
 * the stream-ordered ones there). */
static zero_status run_async(zero_comm *c, coll_args *a, const char *fn, zero_request **out)
{
    if (coll_comm_live(c) && coll_stream_mode(c)) {
        if (out) *out = NULL;
        return zero_fail(NULL, ZERO_INVALID_STATE,
                         "%s on group %s: the comm has a stream (zero_comm_set_stream): its blocking forms are the "
                         "stream-ordered ones; asynchronous requests are refused",
                         fn, c->name);
    }
    return coll_run_async(c, a, fn, out);
}

#define ARGS(k, s, r, n, dt, o, rt, pr) \
    (coll_args) { .kind = (k), .send = (s), .recv = (r), .count = (n), .dtype = (dt), .op = (o), .root = (rt), .peer = (pr) }

zero_status zero_allreduce(zero_comm *comm, const void *send, void *recv, size_t count, zero_dtype dtype,
                           zero_redop op)
{
    coll_args a = ARGS(ZERO_OP_ALLREDUCE, send, recv, count, dtype, op, 0, 0);
    return coll_run_blocking(comm, &a, "zero_allreduce");
}

zero_status zero_reduce_scatter(zero_comm *comm, const void *send, void *recv, size_t count, zero_dtype dtype,
                                zero_redop op)
{
    coll_args a = ARGS(ZERO_OP_REDUCE_SCATTER, send, recv, count, dtype, op, 0, 0);
    return coll_run_blocking(comm, &a, "zero_reduce_scatter");
}

zero_status zero_allgather(zero_comm *comm, const void *send, void *recv, size_t count, zero_dtype dtype)
{
    coll_args a = ARGS(ZERO_OP_ALLGATHER, send, recv, count, dtype, ZERO_SUM, 0, 0);
    return coll_run_blocking(comm, &a, "zero_allgather");
}

zero_status zero_broadcast(zero_comm *comm, const void *send, void *recv, size_t count, zero_dtype dtype,
                           int root)
{
    coll_args a = ARGS(ZERO_OP_BROADCAST, send, recv, count, dtype, ZERO_SUM, root, 0);
    return coll_run_blocking(comm, &a, "zero_broadcast");
}

zero_status zero_send(zero_comm *comm, const void *buf, size_t count, zero_dtype dtype, int peer)
{
    coll_args a = ARGS(ZERO_OP_SEND, buf, NULL, count, dtype, ZERO_SUM, 0, peer);
    return coll_run_blocking(comm, &a, "zero_send");
}

zero_status zero_recv(zero_comm *comm, void *buf, size_t count, zero_dtype dtype, int peer)
{
    coll_args a = ARGS(ZERO_OP_RECV, NULL, buf, count, dtype, ZERO_SUM, 0, peer);
    return coll_run_blocking(comm, &a, "zero_recv");
}

zero_status zero_barrier(zero_comm *comm)
{
    coll_args a = ARGS(ZERO_OP_BARRIER, NULL, NULL, 0, ZERO_U8, ZERO_SUM, 0, 0);
    return coll_run_blocking(comm, &a, "zero_barrier");
}

zero_status zero_allreduce_async(zero_comm *comm, const void *send, void *recv, size_t count, zero_dtype dtype,
                                 zero_redop op, zero_request **req)
{
    coll_args a = ARGS(ZERO_OP_ALLREDUCE, send, recv, count, dtype, op, 0, 0);
    return run_async(comm, &a, "zero_allreduce_async", req);
}

zero_status zero_reduce_scatter_async(zero_comm *comm, const void *send, void *recv, size_t count,
                                      zero_dtype dtype, zero_redop op, zero_request **req)
{
    coll_args a = ARGS(ZERO_OP_REDUCE_SCATTER, send, recv, count, dtype, op, 0, 0);
    return run_async(comm, &a, "zero_reduce_scatter_async", req);
}

zero_status zero_allgather_async(zero_comm *comm, const void *send, void *recv, size_t count, zero_dtype dtype,
                                 zero_request **req)
{
    coll_args a = ARGS(ZERO_OP_ALLGATHER, send, recv, count, dtype, ZERO_SUM, 0, 0);
    return run_async(comm, &a, "zero_allgather_async", req);
}

zero_status zero_broadcast_async(zero_comm *comm, const void *send, void *recv, size_t count, zero_dtype dtype,
                                 int root, zero_request **req)
{
    coll_args a = ARGS(ZERO_OP_BROADCAST, send, recv, count, dtype, ZERO_SUM, root, 0);
    return run_async(comm, &a, "zero_broadcast_async", req);
}

zero_status zero_send_async(zero_comm *comm, const void *buf, size_t count, zero_dtype dtype, int peer,
                            zero_request **req)
{
    coll_args a = ARGS(ZERO_OP_SEND, buf, NULL, count, dtype, ZERO_SUM, 0, peer);
    return run_async(comm, &a, "zero_send_async", req);
}

zero_status zero_recv_async(zero_comm *comm, void *buf, size_t count, zero_dtype dtype, int peer,
                            zero_request **req)
{
    coll_args a = ARGS(ZERO_OP_RECV, NULL, buf, count, dtype, ZERO_SUM, 0, peer);
    return run_async(comm, &a, "zero_recv_async", req);
}

zero_status zero_alltoall(zero_comm *comm, const void *send, void *recv, size_t count, zero_dtype dtype)
{
    coll_args a = ARGS(ZERO_OP_ALLTOALL, send, recv, count, dtype, ZERO_SUM, 0, 0);
    return coll_run_blocking(comm, &a, "zero_alltoall");
}

zero_status zero_alltoall_async(zero_comm *comm, const void *send, void *recv, size_t count, zero_dtype dtype,
                                zero_request **req)
{
    coll_args a = ARGS(ZERO_OP_ALLTOALL, send, recv, count, dtype, ZERO_SUM, 0, 0);
    return run_async(comm, &a, "zero_alltoall_async", req);
}

static coll_args alltoallv_args(const void *send, const size_t *send_counts, const size_t *send_displs, void *recv,
                                const size_t *recv_counts, const size_t *recv_displs, zero_dtype dtype)
{
    coll_args a = ARGS(ZERO_OP_ALLTOALLV, send, recv, 0, dtype, ZERO_SUM, 0, 0);
    a.user_v[0] = send_counts;
    a.user_v[1] = send_displs;
    a.user_v[2] = recv_counts;
    a.user_v[3] = recv_displs;
    return a;
}

zero_status zero_alltoallv(zero_comm *comm, const void *send, const size_t *send_counts, const size_t *send_displs,
                           void *recv, const size_t *recv_counts, const size_t *recv_displs, zero_dtype dtype)
{
    coll_args a = alltoallv_args(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype);
    return coll_run_blocking(comm, &a, "zero_alltoallv");
}

zero_status zero_alltoallv_async(zero_comm *comm, const void *send, const size_t *send_counts,
                                 const size_t *send_displs, void *recv, const size_t *recv_counts,
                                 const size_t *recv_displs, zero_dtype dtype, zero_request **req)
{
    coll_args a = alltoallv_args(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype);
    return run_async(comm, &a, "zero_alltoallv_async", req);
}

/* ---------------------------------------------------------------- completion */

/* A request issued inside a group that is still open cannot be completed yet
 * (on NCCL it is not even enqueued): refused, and left valid. */
static zero_status still_grouped(const zero_request *req, const char *fn)
{
    char what[96];
    coll_describe(&req->args, what, sizeof what);
    zero_comm *c = req->comm;
    return zero_fail(&c->err, ZERO_INVALID_STATE,
                     "%s: %s on group %s(size %d) rank %d was issued inside a group that is still open; call "
                     "zero_comm_group_end first (the request stays valid)",
                     fn, what, c->name, c->size, c->rank);
}

/* A request whose comm was destroyed first was finished by the destroy. */
static zero_status detached(const zero_request *req, const char *fn)
{
    char what[96];
    coll_describe(&req->args, what, sizeof what);
    if (req->status == ZERO_OK) return ZERO_OK;
    return zero_fail(NULL, req->status, "%s: %s: its comm was destroyed before the request was waited on (%s)", fn,
                     what, zero_status_name(req->status));
}

static void unlink_request(zero_comm *c, zero_request *req)
{
    if (req->prev) req->prev->next = req->next;
    else if (c->pending == req) c->pending = req->next;
    if (req->next) req->next->prev = req->prev;
    req->prev = req->next = NULL;
}

zero_status zero_test(zero_request *req, int *done)
{
    if (!req || !done)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_test: %s is NULL", req ? "done" : "req");
    zero_comm *c = req->comm;
    if (!c) {
        *done = 1;
        return detached(req, "zero_test");
    }
    if (req->grouped) return still_grouped(req, "zero_test");
    coll_advance_others(c, req);
    if (!req->done) {
        int d = 0;
        zero_status st = c->be->test(c, req, &d);
        if (st != ZERO_OK) {
            coll_comm_mark_failed(c, st);
            c->be->abandon(c, req);
            req->done = 1;
            req->status = st;
        } else if (d) {
            req->done = 1;
        }
    }
    *done = req->done;
    if (req->done && req->status != ZERO_OK) return zero_fail(NULL, req->status, "%s", c->err.msg);
    return ZERO_OK;
}

zero_status zero_wait(zero_request *req)
{
    if (!req) return ZERO_OK;
    zero_comm *c = req->comm;
    zero_status st;
    if (!c) {
        st = detached(req, "zero_wait");
        release_request(req);
        free(req);
        return st;
    }
    if (req->grouped) return still_grouped(req, "zero_wait");
    if (!req->done && c->failed != ZERO_OK) {
        /* The group already failed (another op timed out): its pending ops
         * will not finish either, so do not wait a second deadline. */
        int d = 0;
        st = c->be->test(c, req, &d);
        if (st == ZERO_OK && d) {
            req->done = 1;
        } else {
            char what[96];
            coll_describe(&req->args, what, sizeof what);
            c->be->abandon(c, req);
            req->done = 1;
            req->status = ZERO_INVALID_STATE;
            zero_fail(&c->err, ZERO_INVALID_STATE,
                      "%s on group %s(size %d) rank %d: abandoned because the group failed earlier (%s)", what,
                      c->name, c->size, c->rank, coll_failed_cause(c));
        }
        st = req->status;
    } else if (req->done) {
        st = req->status;
        if (st != ZERO_OK) zero_fail(NULL, st, "%s", c->err.msg);
    } else {
        st = coll_wait_request(req);
    }
    c->outstanding--;
    unlink_request(c, req);
    release_request(req);
    free(req);
    return st;
}
