/* All-to-all and all-to-all-v on the MPI backend: one point-to-point
 * exchange.
 *
 * Every rank posts a receive from each peer into that peer's chunk of recv
 * and sends each peer its chunk of send (in a rotated order, so not every
 * rank hits rank 0 first), completed by MPI_Testall like the other
 * schedules (mpi_sched.c: Open MPI's libnbc, polled, ran 3-5x slower than
 * the blocking call; plain Isend/Irecv match it). The own chunk is copied
 * locally once the exchange is over. Each rank moves exactly what the
 * counters report: its chunks to and from the other ranks.
 *
 * All-to-all-v exchanges a message with every peer even when the chunk is
 * empty: a peer that expects elements from a rank that sends none then sees
 * a 0-element message and reports the mismatch, instead of waiting a
 * deadline; and a rank whose part never arrives is named on a timeout.
 * Received sizes are compared with the expected ones at completion
 * (ZERO_MISMATCH naming the peer); receives land in the caller's buffer and
 * are cancelled when the op is given up. */
#include "comm_internal.h"

#if ZERO_HAVE_MPI

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAG_SPACE 8000 /* as mpi_sched.c: 4 tags per op from 1; the 4th is ours */

struct mpi_a2a {
    zero_comm *comm;
    zero_op_kind kind;
    zero_dtype dtype;
    size_t es, count;
    const char *own_src; /* the own chunk, copied at completion */
    char *own_dst;
    size_t own_bytes;
    int nreq;
    MPI_Request *reqs;
    MPI_Status *stats;
    int *expect; /* per request: elements a receive expects, -1 for a send */
    int *peer;   /* per request: the group rank at the other end */
};

static mpi_p2p reqs_of(const mpi_a2a *s)
{
    return (mpi_p2p){s->comm, s->kind, s->dtype, s->count, "exchange", s->nreq, s->reqs, s->stats, s->expect, s->peer};
}

void mpi_a2a_free(mpi_a2a *s) { free(s); }

zero_status mpi_a2a_start(zero_comm *c, MPI_Comm mc, const coll_args *a, mpi_a2a **out)
{
    *out = NULL;
    int n = c->size, peers = n - 1;
    size_t arrays = (size_t)2 * peers * (sizeof(MPI_Status) + sizeof(MPI_Request) + 2 * sizeof(int));
    mpi_a2a *s = calloc(1, sizeof *s + arrays);
    if (!s) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", coll_op_name(a->kind));
    s->stats = (MPI_Status *)(s + 1);
    s->reqs = (MPI_Request *)(s->stats + 2 * peers);
    s->expect = (int *)(s->reqs + 2 * peers);
    s->peer = s->expect + 2 * peers;
    s->comm = c;
    s->kind = a->kind;
    s->dtype = a->dtype;
    s->es = zero_dtype_size(a->dtype);
    s->count = a->count;
    for (int p = 0; p < n; p++) {
        coll_a2a_chunk k = coll_a2a_peer(a, n, p);
        if (k.send_count > INT_MAX || k.recv_count > INT_MAX) {
            free(s);
            return zero_fail(&c->err, ZERO_UNSUPPORTED,
                             "%s of %zu x %s on group %s rank %d: a chunk of %zu elements (rank %d) exceeds MPI's "
                             "int count; split the op",
                             coll_op_name(a->kind), a->count, zero_dtype_name(a->dtype), c->name, c->rank,
                             k.send_count > k.recv_count ? k.send_count : k.recv_count, p);
        }
    }
    coll_a2a_chunk own = coll_a2a_peer(a, n, c->rank);
    s->own_src = (const char *)a->send + own.send_displ * s->es;
    s->own_dst = (char *)a->recv + own.recv_displ * s->es;
    s->own_bytes = own.send_count * s->es;

    MPI_Datatype t = mpi_wire_type(a->dtype);
    int tag = 1 + (int)(a->seq % TAG_SPACE) * 4 + 3, k = 0, rc = MPI_SUCCESS;
    for (int p = 0; p < n && rc == MPI_SUCCESS; p++) {
        if (p == c->rank) continue;
        coll_a2a_chunk q = coll_a2a_peer(a, n, p);
        s->peer[k] = p;
        s->expect[k] = (int)q.recv_count;
        rc = MPI_Irecv((char *)a->recv + q.recv_displ * s->es, (int)q.recv_count, t, p, tag, mc, &s->reqs[k++]);
    }
    for (int i = 1; i < n && rc == MPI_SUCCESS; i++) {
        int p = (c->rank + i) % n;
        coll_a2a_chunk q = coll_a2a_peer(a, n, p);
        s->peer[k] = p;
        s->expect[k] = -1;
        rc = MPI_Isend((const char *)a->send + q.send_displ * s->es, (int)q.send_count, t, p, tag, mc,
                       &s->reqs[k++]);
    }
    s->nreq = k;
    if (rc != MPI_SUCCESS) {
        s->nreq = k - 1; /* the failed call left no request */
        const mpi_p2p r = reqs_of(s);
        zero_status st = mpi_p2p_fail_rc(c, &r, rc);
        mpi_a2a_abandon(s);
        return st;
    }
    *out = s;
    return ZERO_OK;
}

zero_status mpi_a2a_test(zero_comm *c, mpi_a2a *s, int *done)
{
    int flag = 0;
    *done = 0;
    int rc = MPI_Testall(s->nreq, s->reqs, &flag, s->stats);
    const mpi_p2p r = reqs_of(s);
    if (rc == MPI_ERR_IN_STATUS) return mpi_p2p_failed(c, &r);
    if (rc != MPI_SUCCESS) return mpi_p2p_fail_rc(c, &r, rc);
    if (!flag) return ZERO_OK;
    ZERO_TRY(mpi_p2p_check_counts(c, &r)); /* a peer that sent fewer elements than we expect is a success to MPI */
    if (s->own_bytes) memcpy(s->own_dst, s->own_src, s->own_bytes);
    *done = 1;
    return ZERO_OK;
}

int mpi_a2a_missing(const mpi_a2a *s, unsigned char *missing)
{
    const mpi_p2p r = reqs_of(s);
    return mpi_p2p_missing(&r, missing);
}

void mpi_a2a_abandon(mpi_a2a *s)
{
    if (!s) return;
    const mpi_p2p r = reqs_of(s);
    (void)mpi_p2p_abandon(&r); /* handles MPI still needs went to the graveyard */
    free(s);
}

#endif /* ZERO_HAVE_MPI */
