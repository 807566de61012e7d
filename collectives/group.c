/* Groups: several ops issued together and completed together
 * (zero_comm_group_begin / zero_comm_group_end, comm.h).
 *
 * Why: a rank that must both send to and receive from its neighbours (a
 * pipeline's activation going forward while a gradient comes back, a ring
 * exchange) deadlocks with blocking calls once messages are too large for
 * the transport to buffer: every rank sits in its send, waiting for a receive
 * nobody posts. Inside a group nothing waits: every op is issued as a
 * non-blocking request at once, and the group's end polls them all under one
 * deadline, so the pairs complete whatever the order of the calls.
 *
 * MPI and STAGED: the requests are the backend's ordinary non-blocking ops;
 * the group is only "wait for all of them together". NCCL: the backend wraps
 * them in ncclGroupStart/End (which is what lets NCCL pair a send with its
 * receive) and records their completion events after ncclGroupEnd, when they
 * are really enqueued. LOCAL: every op completes when issued. */
#include "comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void coll_group_add(zero_comm *c, zero_request *req, int how)
{
    req->grouped = how;
    req->group_next = NULL;
    if (c->group_tail) c->group_tail->group_next = req;
    else c->group_head = req;
    c->group_tail = req;
    c->group_ops++;
}

void coll_group_forget(zero_comm *c)
{
    c->group_depth = 0;
    c->group_ops = 0;
    c->group_head = c->group_tail = NULL;
}

zero_status zero_comm_group_begin(zero_comm *comm)
{
    ZERO_TRY(coll_comm_check(comm, "zero_comm_group_begin"));
    if (coll_stream_group_begin(comm)) return ZERO_OK; /* collected on the host, enqueued at the end (stream.c) */
    if (comm->failed != ZERO_OK)
        return zero_fail(&comm->err, ZERO_INVALID_STATE,
                         "zero_comm_group_begin on group %s(size %d) rank %d: the group failed earlier (%s); only "
                         "zero_comm_destroy is allowed",
                         comm->name, comm->size, comm->rank, coll_failed_cause(comm));
    if (comm->be->group_begin) {
        zero_status st = comm->be->group_begin(comm);
        if (st != ZERO_OK) {
            coll_comm_mark_failed(comm, st);
            return st;
        }
    }
    comm->group_depth++;
    return ZERO_OK;
}

/* ---------------------------------------------------------------- completion */

/* coll_poll callback: test every request the group owns not yet done (the
 * caller's asynchronous ones are left to zero_wait). */
static zero_status group_test(void *ctx, int *done)
{
    zero_comm *c = ctx;
    coll_advance_others(c, NULL);
    int all = 1;
    for (zero_request *r = c->group_head; r; r = r->group_next) {
        if (r->done || r->grouped != COLL_GROUPED_OWNED) continue;
        int d = 0;
        zero_status st = c->be->test(c, r, &d);
        if (st != ZERO_OK) {
            r->done = 1;
            r->status = st;
            c->be->abandon(c, r);
            return st;
        }
        if (d) r->done = 1;
        else all = 0;
    }
    *done = all;
    return ZERO_OK;
}

/* "send of 4096 x f32 to peer 1 (world 1), recv of ..." for the ops not done. */
static void describe_pending(const zero_comm *c, char *buf, size_t len)
{
    size_t used = 0;
    int listed = 0, left = 0;
    buf[0] = '\0';
    for (const zero_request *r = c->group_head; r; r = r->group_next) {
        if (r->done || r->grouped != COLL_GROUPED_OWNED) continue;
        if (listed == 4) {
            left++;
            continue;
        }
        char what[96], peer[48] = "";
        coll_describe(&r->args, what, sizeof what);
        if (r->args.kind == ZERO_OP_SEND || r->args.kind == ZERO_OP_RECV)
            snprintf(peer, sizeof peer, " %s peer rank %d (world %d)", r->args.kind == ZERO_OP_SEND ? "to" : "from",
                     r->args.peer, c->world_ranks[r->args.peer]);
        int w = snprintf(buf + used, len - used, "%s%s%s", listed ? ", " : "", what, peer);
        if (w < 0 || (size_t)w >= len - used) break;
        used += (size_t)w;
        listed++;
    }
    if (left && used < len) snprintf(buf + used, len - used, " and %d more", left);
}

/* The group is over: its own requests are freed (abandoned first when
 * unfinished, after a failure), the caller's become ordinary requests again
 * (after a failure, zero_wait reports it for them). */
static void group_close(zero_comm *c)
{
    zero_request *r = c->group_head;
    coll_group_forget(c);
    while (r) {
        zero_request *next = r->group_next;
        r->group_next = NULL;
        if (r->grouped == COLL_GROUPED_OWNED) {
            if (!r->done) c->be->abandon(c, r);
            if (r->prev) r->prev->next = r->next;
            else if (c->pending == r) c->pending = r->next;
            if (r->next) r->next->prev = r->prev;
            c->outstanding--;
            coll_request_free(r);
        } else {
            r->grouped = 0;
        }
        r = next;
    }
}

zero_status zero_comm_group_end(zero_comm *comm)
{
    ZERO_TRY(coll_comm_check(comm, "zero_comm_group_end"));
    zero_comm *c = comm;
    zero_status sst;
    if (coll_stream_group_end(c, &sst)) return sst; /* the batch enqueued as one unit (stream.c) */
    if (c->group_depth == 0)
        return zero_fail(&c->err, ZERO_INVALID_STATE,
                         "zero_comm_group_end on group %s(size %d) rank %d: no group is open (zero_comm_group_begin "
                         "was not called, or was already ended)",
                         c->name, c->size, c->rank);
    if (c->group_depth > 1) { /* nested: only the outermost end completes */
        c->group_depth--;
        return c->be->group_end && c->failed == ZERO_OK ? c->be->group_end(c, NULL) : ZERO_OK;
    }
    int nops = c->group_ops;
    zero_status st = ZERO_OK;
    if (c->failed != ZERO_OK) {
        st = zero_fail(&c->err, ZERO_INVALID_STATE,
                       "zero_comm_group_end on group %s(size %d) rank %d: the group failed earlier (%s); its %d "
                       "op(s) were abandoned",
                       c->name, c->size, c->rank, coll_failed_cause(c), nops);
        group_close(c);
        return st;
    }
    if (c->be->group_end) {
        st = c->be->group_end(c, c->group_head);
        if (st != ZERO_OK) {
            coll_comm_mark_failed(c, st);
            group_close(c);
            return st;
        }
    }
    if (coll_stream_mode(c)) { /* NCCL on the caller's stream: zero_comm_sync completes them */
        coll_stream_keep_group(c);
        return ZERO_OK;
    }
    /* Only the group's own requests are waited for here; the caller's
     * asynchronous ones are moved along too but completed by zero_wait. */
    int owned = 0;
    for (zero_request *r = c->group_head; r; r = r->group_next) owned += r->grouped == COLL_GROUPED_OWNED;
    if (owned) {
        st = coll_poll(group_test, c, c->timeout_s);
        if (st == ZERO_TIMEOUT) {
            char pending[400];
            describe_pending(c, pending, sizeof pending);
            coll_comm_fail(c, ZERO_TIMEOUT,
                           "group of %d op(s) on group %s(size %d) rank %d (world %d): timed out after %.1f s; not "
                           "complete: %s",
                           nops, c->name, c->size, c->rank, c->world_ranks[c->rank], c->timeout_s, pending);
        } else if (st != ZERO_OK) {
            coll_comm_mark_failed(c, st); /* the backend recorded its message */
        }
    }
    group_close(c);
    return st;
}
