/* Collective fingerprints: ranks that call different collectives find out.
 *
 * With fingerprints on (zero_comm_config.fingerprint, or ZERO_COLL_FINGERPRINT=1),
 * every collective on an MPI-based comm first sends a 288-byte record of
 * itself - op kind, count, dtype, reduction op or root, the group, its
 * sequence number on the comm and the caller's label - to every peer, and
 * starts its data only once the peers' records arrived and agree (so no byte
 * moves between ranks that called different ops: one extra message latency
 * per op). Records travel on their own tag and match in order per peer, so
 * record k from a peer is its k-th
 * collective on the comm: a rank that skipped or added a collective, passed
 * another count, or gathered modules in another order (the label) gets
 * ZERO_MISMATCH naming both calls. An all-to-all-v sends each peer its own
 * record, whose count is what goes to that peer; the receiver compares it
 * with its recv count for the sender (the chunks, not the totals, must agree).
 *
 * When a comm fails on a rank (timeout, mismatch, destroy with requests
 * outstanding), that rank sends a "broken" record instead of the next
 * fingerprint: a late peer that still completed the failed op fails its next
 * collective at once with ZERO_PEER_FAILURE naming the rank and its reason,
 * instead of waiting a deadline for records that will never come. */
#include "comm_internal.h"

#if ZERO_HAVE_MPI

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP_TAG 32002        /* above the schedules' tags (1..32000) and user messages (0) */
#define FP_BROKEN 0xffffu   /* kind of a record announcing that its sender gave up the comm */
#define FP_LABEL 32
#define FP_TEXT 200

typedef struct coll_fp {
    uint32_t kind, dtype, op, seq;
    uint64_t count;
    int32_t root;
    uint32_t group;         /* hash of the members' world ranks */
    uint32_t label_hash;
    uint32_t world_rank;    /* the sender's */
    char label[FP_LABEL];
    char text[FP_TEXT];     /* FP_BROKEN only: why the sender gave up */
} coll_fp;

/* An op's record stops before the text; a broken notice is the whole struct,
 * so the two are told apart by size before receiving (mpi_fp_check_broken).
 * Receives take the whole struct: either fits. */
#define FP_RECORD ((int)offsetof(coll_fp, text))
#define FP_NOTICE ((int)sizeof(coll_fp))

struct mpi_fp {
    int n, nrecv, arrived;
    MPI_Request *reqs; /* nrecv receives (from peer[i]), then the sends */
    int *peer;
    coll_fp *theirs;   /* by receive index */
    uint64_t *expect;  /* by receive index: the count that peer's record must carry */
    coll_fp *mine_to;  /* all-to-all-v: one record per peer (by receive index), count = what goes there */
    coll_fp mine;
};

static uint32_t group_hash(const zero_comm *c)
{
    return coll_hash(c->world_ranks, (size_t)c->size * sizeof(int), 2166136261u);
}

static void fill(const zero_comm *c, const coll_args *a, coll_fp *f)
{
    memset(f, 0, sizeof *f);
    f->kind = (uint32_t)a->kind;
    f->dtype = a->kind == ZERO_OP_BARRIER ? 0 : (uint32_t)a->dtype;
    f->op = (a->kind == ZERO_OP_ALLREDUCE || a->kind == ZERO_OP_REDUCE_SCATTER) ? (uint32_t)a->op : 0;
    f->root = a->kind == ZERO_OP_BROADCAST ? a->root : -1;
    f->count = a->kind == ZERO_OP_BARRIER ? 0 : (uint64_t)a->count;
    f->seq = a->seq;
    f->group = group_hash(c);
    f->world_rank = (uint32_t)c->world_ranks[c->rank];
    snprintf(f->label, sizeof f->label, "%s", c->label);
    f->label_hash = c->label_hash;
}

/* "allgather of 64 x f32 as op #17 ('decoder.3')" */
static void describe(const coll_fp *f, char *buf, size_t len)
{
    coll_args a = {.kind = (zero_op_kind)f->kind, .count = (size_t)f->count, .dtype = (zero_dtype)f->dtype};
    char what[96], extra[80] = "";
    coll_describe(&a, what, sizeof what);
    if (f->root >= 0) snprintf(extra, sizeof extra, " from root %d", f->root);
    else if (f->kind == ZERO_OP_ALLREDUCE || f->kind == ZERO_OP_REDUCE_SCATTER)
        snprintf(extra, sizeof extra, " (%s)", f->op == ZERO_MAX ? "max" : "sum");
    snprintf(buf, len, "%s%s as op #%u%s%s%s", what, extra, f->seq, f->label[0] ? " ('" : "", f->label,
             f->label[0] ? "')" : "");
}

/* Everything but the count, which each receive checks against its own
 * expectation (all-to-all-v: what that peer is to send here). */
static int same_op(const coll_fp *a, const coll_fp *b)
{
    return a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->root == b->root &&
           a->seq == b->seq && a->group == b->group && a->label_hash == b->label_hash;
}

static int agrees_with(const mpi_fp *f, int i)
{
    return f->theirs[i].kind != FP_BROKEN && same_op(&f->mine, &f->theirs[i]) && f->theirs[i].count == f->expect[i];
}

zero_status mpi_fp_start(zero_comm *c, MPI_Comm mc, const coll_args *a, mpi_fp **out)
{
    *out = NULL;
    int n = c->size, peers = n - 1, v = a->kind == ZERO_OP_ALLTOALLV;
    /* records first (largest alignment), then expectations, requests, peers */
    mpi_fp *f = calloc(1, sizeof *f + (size_t)peers * ((1 + v) * sizeof(coll_fp) + sizeof(uint64_t) +
                                                       2 * sizeof(MPI_Request) + sizeof(int)));
    if (!f) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", coll_op_name(a->kind));
    f->theirs = (coll_fp *)(f + 1);
    f->mine_to = v ? f->theirs + peers : NULL;
    f->expect = (uint64_t *)(f->theirs + (size_t)(1 + v) * peers);
    f->reqs = (MPI_Request *)(f->expect + peers);
    f->peer = (int *)(f->reqs + 2 * peers);
    f->n = n;
    fill(c, a, &f->mine);
    int rc = MPI_SUCCESS, k = 0;
    for (int p = 0; p < n && rc == MPI_SUCCESS; p++) {
        if (p == c->rank) continue;
        f->peer[k] = p;
        /* All-to-all-v: rank p's record to us carries what it sends here,
         * which must be what we expect from it. */
        f->expect[k] = v ? (uint64_t)coll_a2a_peer(a, n, p).recv_count : f->mine.count;
        if (v) {
            f->mine_to[k] = f->mine;
            f->mine_to[k].count = (uint64_t)coll_a2a_peer(a, n, p).send_count;
        }
        rc = MPI_Irecv(&f->theirs[k], FP_NOTICE, MPI_BYTE, p, FP_TAG, mc, &f->reqs[k]);
        k++;
    }
    f->nrecv = k;
    for (int i = 1; i < n && rc == MPI_SUCCESS; i++) {
        int p = (c->rank + i) % n;
        const coll_fp *rec = v ? &f->mine_to[p < c->rank ? p : p - 1] : &f->mine;
        rc = MPI_Isend(rec, FP_RECORD, MPI_BYTE, p, FP_TAG, mc, &f->reqs[k++]);
    }
    if (rc != MPI_SUCCESS) {
        for (int i = k; i < 2 * peers; i++) f->reqs[i] = MPI_REQUEST_NULL;
        mpi_fp_abandon(f);
        return mpi_status_from(c, rc, "fingerprint");
    }
    *out = f;
    return ZERO_OK;
}

static zero_status peer_gave_up(zero_comm *c, const char *what, int p, const coll_fp *t)
{
    return coll_comm_fail(c, ZERO_PEER_FAILURE,
                          "%s on group %s(size %d) rank %d (world %d): rank %d (world %d) gave up this group earlier "
                          "(%.*s); it takes no part in later ops",
                          what, c->name, c->size, c->rank, c->world_ranks[c->rank], p, c->world_ranks[p], FP_TEXT,
                          t->text);
}

/* A peer's record says it gave up the comm, or differs from ours. */
static zero_status compare(zero_comm *c, mpi_fp *f)
{
    char mine[200], theirs[200];
    for (int i = 0; i < f->nrecv; i++) {
        const coll_fp *t = &f->theirs[i];
        int p = f->peer[i];
        if (t->kind == FP_BROKEN) {
            describe(&f->mine, mine, sizeof mine);
            return peer_gave_up(c, mine, p, t);
        }
        if (agrees_with(f, i)) continue;
        if (f->mine.kind == ZERO_OP_ALLTOALLV && same_op(&f->mine, t)) {
            /* the same op, but the two ranks disagree on the chunk between them */
            describe(&f->mine, mine, sizeof mine);
            return coll_comm_fail(c, ZERO_MISMATCH,
                                  "%s on group %s(size %d) rank %d (world %d): rank %d (world %d) sends %llu x %s to "
                                  "this rank, which expects %llu from it (its recv_counts[%d]): the ranks disagree "
                                  "on the counts",
                                  mine, c->name, c->size, c->rank, c->world_ranks[c->rank], p, c->world_ranks[p],
                                  (unsigned long long)t->count, zero_dtype_name((zero_dtype)t->dtype),
                                  (unsigned long long)f->expect[i], p);
        }
        describe(&f->mine, mine, sizeof mine);
        describe(t, theirs, sizeof theirs);
        const char *why = t->group != f->mine.group ? " (the ranks disagree on the group's members)" : "";
        return coll_comm_fail(c, ZERO_MISMATCH,
                              "collective on group %s(size %d): the ranks called different collectives: rank %d "
                              "(world %d): %s; rank %d (world %d): %s%s",
                              c->name, c->size, c->rank, c->world_ranks[c->rank], mine, p, c->world_ranks[p], theirs,
                              why);
    }
    return ZERO_OK;
}

zero_status mpi_fp_test(zero_comm *c, mpi_fp *f, int *arrived)
{
    *arrived = 0;
    if (!f->arrived) {
        int flag = 0;
        int rc = MPI_Testall(f->nrecv, f->reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_status_from(c, rc, "fingerprint");
        if (!flag) return ZERO_OK;
        f->arrived = 1;
    }
    *arrived = 1;
    return compare(c, f);
}

zero_status mpi_fp_peek(mpi_fp *f, int *arrived)
{
    if (!f->arrived) {
        int flag = 0;
        if (MPI_Testall(f->nrecv, f->reqs, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return ZERO_BACKEND;
        f->arrived = flag;
    }
    *arrived = f->arrived;
    return ZERO_OK;
}

int mpi_fp_agrees(const mpi_fp *f)
{
    for (int i = 0; i < f->nrecv; i++)
        if (!agrees_with(f, i)) return 0;
    return 1;
}

void mpi_fp_missing(const zero_comm *c, const mpi_fp *f, unsigned char *missing)
{
    (void)c;
    if (f->arrived) return;
    for (int i = 0; i < f->nrecv; i++) {
        int flag = 1;
        if (f->reqs[i] != MPI_REQUEST_NULL) MPI_Request_get_status(f->reqs[i], &flag, MPI_STATUS_IGNORE);
        if (!flag) missing[f->peer[i]] = 1;
    }
}

void mpi_fp_free(mpi_fp *f) { free(f); }

void mpi_fp_abandon(mpi_fp *f)
{
    if (!f) return;
    int left = mpi_cancel_receives(f->reqs, f->nrecv);
    int sending = 0;
    for (int i = f->nrecv; i < 2 * (f->n - 1); i++) sending |= f->reqs[i] != MPI_REQUEST_NULL;
    if (left || sending)
        coll_graveyard_add(f, free); /* MPI may still read mine or write theirs */
    else
        free(f);
}

zero_status mpi_notice_check(zero_comm *c, MPI_Comm mc, const char *what)
{
    /* The next record from each peer, if one is already here: a notice
     * (told by its size) means that peer will not do its part of this op.
     * A normal record belongs to the peer's next op and stays queued. */
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        int flag = 0, bytes = 0;
        MPI_Message msg = MPI_MESSAGE_NULL;
        MPI_Status st;
        if (MPI_Iprobe(p, FP_TAG, mc, &flag, &st) != MPI_SUCCESS || !flag) continue;
        MPI_Get_count(&st, MPI_BYTE, &bytes);
        if (bytes != FP_NOTICE) continue;
        coll_fp t;
        memset(&t, 0, sizeof t);
        /* matched probe: receives exactly the notice just seen (it is here) */
        if (MPI_Improbe(p, FP_TAG, mc, &flag, &msg, &st) == MPI_SUCCESS && flag)
            MPI_Mrecv(&t, FP_NOTICE, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
        return peer_gave_up(c, what, p, &t);
    }
    return ZERO_OK;
}

zero_status mpi_fp_check_broken(zero_comm *c, MPI_Comm mc, const coll_args *a)
{
    char what[96];
    coll_describe(a, what, sizeof what);
    return mpi_notice_check(c, mc, what);
}

void mpi_fp_poison(zero_comm *c, MPI_Comm mc)
{
    /* Sent with fingerprints off too: a split checks for notices before
     * its one blocking call (mpi_split_common). */
    if (c->size < 2 || mc == MPI_COMM_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    coll_fp *f = calloc(1, sizeof *f);
    if (!f) return;
    f->kind = FP_BROKEN;
    f->world_rank = (uint32_t)c->world_ranks[c->rank];
    snprintf(f->text, sizeof f->text, "%.*s", FP_TEXT - 1, c->err.msg[0] ? c->err.msg : zero_status_name(c->failed));
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        MPI_Request req = MPI_REQUEST_NULL;
        /* Small, so it leaves at once; nobody waits for it. */
        if (MPI_Isend(f, FP_NOTICE, MPI_BYTE, p, FP_TAG, mc, &req) == MPI_SUCCESS) MPI_Request_free(&req);
    }
    coll_graveyard_add(f, free);
}

#endif /* ZERO_HAVE_MPI */
