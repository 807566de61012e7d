/* What the point-to-point collectives (mpi_sched.c: reduce-scatter,
 * all-gather, large all-reduce; mpi_alltoall.c: all-to-all(-v)) share about
 * their requests (comm_internal.h, mpi_p2p): failures and short or long
 * messages named the same way, the peers still missing on
 * a timeout, and taking the receives back when an op is given up. */
#include "comm_internal.h"

#if ZERO_HAVE_MPI

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

zero_status mpi_p2p_fail_rc(zero_comm *c, const mpi_p2p *r, int rc)
{
    char what[64];
    snprintf(what, sizeof what, "%s (point-to-point %s)", coll_op_name(r->kind), r->how);
    return mpi_status_from(c, rc, what);
}

/* Request k received `got` elements (-1: more than it expects). */
static zero_status mismatch(zero_comm *c, const mpi_p2p *r, int k, int got)
{
    char sent[48];
    if (got < 0)
        snprintf(sent, sizeof sent, "more than %d elements", r->expect[k]);
    else
        snprintf(sent, sizeof sent, "%d elements", got);
    int p = r->peer[k];
    return coll_comm_fail(c, ZERO_MISMATCH,
                          "%s of %zu x %s on group %s(size %d) rank %d (world %d): rank %d (world %d) sent %s where "
                          "this rank expected %d: the ranks called the op with different counts, dtypes or op kinds",
                          coll_op_name(r->kind), r->count, zero_dtype_name(r->dtype), c->name, c->size, c->rank,
                          c->world_ranks[c->rank], p, c->world_ranks[p], sent, r->expect[k]);
}

zero_status mpi_p2p_failed(zero_comm *c, const mpi_p2p *r)
{
    for (int k = 0; k < r->nreq; k++) {
        int err = r->stats[k].MPI_ERROR;
        if (err == MPI_SUCCESS || err == MPI_ERR_PENDING) continue;
        int cls = MPI_ERR_OTHER;
        MPI_Error_class(err, &cls);
        if (cls == MPI_ERR_TRUNCATE && r->expect[k] >= 0) return mismatch(c, r, k, -1);
        return mpi_p2p_fail_rc(c, r, err);
    }
    return mpi_p2p_fail_rc(c, r, MPI_ERR_IN_STATUS);
}

zero_status mpi_p2p_check_counts(zero_comm *c, const mpi_p2p *r)
{
    MPI_Datatype t = mpi_wire_type(r->dtype);
    for (int k = 0; k < r->nreq; k++) {
        if (r->expect[k] < 0) continue;
        int got = -1;
        MPI_Get_count(&r->stats[k], t, &got);
        if (got != r->expect[k]) return mismatch(c, r, k, got < 0 ? 0 : got);
    }
    return ZERO_OK;
}

int mpi_p2p_missing(const mpi_p2p *r, unsigned char *missing)
{
    int any = 0;
    for (int k = 0; k < r->nreq; k++) {
        if (r->expect[k] < 0 || r->reqs[k] == MPI_REQUEST_NULL) continue;
        int flag = 0;
        /* Testall leaves every request as it was until all are done: ask
         * each without freeing it. */
        MPI_Request_get_status(r->reqs[k], &flag, MPI_STATUS_IGNORE);
        if (!flag) missing[r->peer[k]] = any = 1;
    }
    return any;
}

int mpi_p2p_abandon(const mpi_p2p *r)
{
    /* Sends cannot be cancelled in Open MPI; they only read. */
    int recvs = 0;
    for (int k = 0; k < r->nreq; k++)
        if (r->expect[k] >= 0 && r->reqs[k] != MPI_REQUEST_NULL) r->reqs[recvs++] = r->reqs[k];
    int left = mpi_cancel_receives(r->reqs, recvs);
    if (left) {
        zero_log(ZERO_LOG_WARN,
                 "%s on group %s rank %d: %d receives could not be cancelled; their buffers may still be written",
                 coll_op_name(r->kind), r->comm->name, r->comm->rank, left);
        /* The request handles must outlive the op for MPI to finish them. */
        MPI_Request *keep = malloc((size_t)left * sizeof *keep);
        if (keep) {
            memcpy(keep, r->reqs, (size_t)left * sizeof *keep);
            coll_graveyard_add(keep, free);
        }
    }
    return left;
}

#endif /* ZERO_HAVE_MPI */
