/* MPI: host buffers over Open MPI (or any MPI-3 library).
 *
 * Every op is a non-blocking MPI call (MPI_Iallreduce, ...) completed by
 * polling MPI_Test under the comm's deadline (deadline.c). A request that
 * misses its deadline is abandoned: MPI may still own it, so its temporary
 * buffers go to the graveyard until MPI_Finalize, and the communicator is
 * never freed (MPI_Finalize releases it without talking to the peers).
 *
 * Each zero_comm owns a duplicate of its MPI communicator, with
 * MPI_ERRORS_RETURN, so our traffic never matches the application's and MPI
 * errors come back as codes instead of aborting the job. */
#include "comm_internal.h"

#if ZERO_HAVE_MPI

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P2P_TAG 0 /* user messages; point-to-point schedules use tags 1..32000 */

/* ---------------------------------------------------------------- lifetime */

static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;
static int env_refs;
static int env_we_initialized;

/* u8 sums wrap modulo 256 (C's unsigned arithmetic). Open MPI 4.1's built-in
 * MPI_SUM on MPI_UINT8_T saturates at 255 on AVX machines (its vectorized op
 * uses saturating adds), so we bring our own. */
static MPI_Op u8_sum_op = MPI_OP_NULL;

static void u8_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint8_t *a = in;
    uint8_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = (uint8_t)(b[i] + a[i]);
}

zero_status mpi_env_acquire(zero_errbuf *err)
{
    zero_status st = ZERO_OK;
    pthread_mutex_lock(&env_lock);
    int initialized = 0, finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
        st = zero_fail(err, ZERO_INVALID_STATE,
                       "zero_comm_create_world: MPI was already finalized (a process can initialise MPI only once)");
    } else {
        MPI_Initialized(&initialized);
        if (!initialized) {
            /* MULTIPLE so that different comms may be driven from different
             * threads (one thread per comm at a time, as comm.h says). */
            int provided = MPI_THREAD_SINGLE;
            int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
            if (rc != MPI_SUCCESS)
                st = zero_fail(err, ZERO_BACKEND, "zero_comm_create_world: MPI_Init_thread failed (code %d)", rc);
            else {
                env_we_initialized = 1;
                /* Open MPI raises the errors of its non-blocking collectives
                 * (a truncated message inside libnbc) in MPI_Test on
                 * MPI_COMM_WORLD, whose default handler aborts the job: the
                 * MPI we initialised returns them instead. */
                MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
                if (provided < MPI_THREAD_MULTIPLE)
                    zero_log(ZERO_LOG_WARN, "MPI provides thread level %d < MPI_THREAD_MULTIPLE: use comms "
                             "from one thread at a time", provided);
            }
        }
    }
    if (st == ZERO_OK && u8_sum_op == MPI_OP_NULL) MPI_Op_create(u8_sum, 1, &u8_sum_op);
    if (st == ZERO_OK) env_refs++;
    pthread_mutex_unlock(&env_lock);
    return st;
}

void mpi_env_release(void)
{
    pthread_mutex_lock(&env_lock);
    if (env_refs > 0 && --env_refs == 0 && env_we_initialized) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) {
            if (u8_sum_op != MPI_OP_NULL) MPI_Op_free(&u8_sum_op);
            MPI_Finalize();
        }
        env_we_initialized = 0;
        /* Nothing can touch abandoned buffers any more. */
        coll_graveyard_flush();
    }
    pthread_mutex_unlock(&env_lock);
}

zero_status mpi_status_from(zero_comm *c, int mpi_err, const char *what)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0, cls = MPI_ERR_OTHER;
    MPI_Error_string(mpi_err, text, &len);
    MPI_Error_class(mpi_err, &cls);
    zero_status st = ZERO_BACKEND;
#if defined(MPIX_ERR_PROC_FAILED)
    if (cls == MPIX_ERR_PROC_FAILED) st = ZERO_PEER_FAILURE;
#endif
#if defined(MPIX_ERR_REVOKED)
    if (cls == MPIX_ERR_REVOKED) st = ZERO_PEER_FAILURE;
#endif
    if (cls == MPI_ERR_TRUNCATE) st = ZERO_MISMATCH;
    return coll_comm_fail(c, st, "%s on group %s(size %d) rank %d (world %d): MPI error %d: %s", what, c->name,
                          c->size, c->rank, c->world_ranks ? c->world_ranks[c->rank] : -1, mpi_err, text);
}

static void free_ptr(void *p) { free(p); }

/* A receive matched before we gave up is being copied in (vader copies a
 * whole message in one progress call; other transports pipeline it): a
 * moment is enough for it to finish. */
#define CANCEL_GRACE_S 1.0

typedef struct cancel_ctx {
    MPI_Request *reqs;
    int n;
} cancel_ctx;

static zero_status poll_cancelled(void *ctx, int *done)
{
    cancel_ctx *t = ctx;
    int left = 0;
    for (int i = 0; i < t->n; i++) {
        if (t->reqs[i] == MPI_REQUEST_NULL) continue;
        int flag = 0;
        /* A request that fails is complete too: MPI no longer touches its buffer. */
        if (MPI_Test(&t->reqs[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) t->reqs[i] = MPI_REQUEST_NULL;
        left += t->reqs[i] != MPI_REQUEST_NULL;
    }
    *done = left == 0;
    return ZERO_OK;
}

int mpi_cancel_receives(MPI_Request *reqs, int n)
{
    if (n <= 0) return 0;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return 0;
    for (int i = 0; i < n; i++)
        if (reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs[i]);
    cancel_ctx t = {reqs, n};
    (void)coll_poll(poll_cancelled, &t, CANCEL_GRACE_S);
    int left = 0;
    for (int i = 0; i < n; i++)
        if (reqs[i] != MPI_REQUEST_NULL) reqs[left++] = reqs[i];
    return left;
}

/* ---------------------------------------------------------------- ops */

MPI_Datatype mpi_wire_type(zero_dtype d)
{
    switch (d) {
    case ZERO_F32: return MPI_FLOAT;
    case ZERO_F64: return MPI_DOUBLE;
    case ZERO_I32: return MPI_INT32_T;
    case ZERO_I64: return MPI_INT64_T;
    case ZERO_U8: return MPI_UINT8_T;
    case ZERO_F16:
    case ZERO_BF16: return MPI_UINT16_T;
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Datatype mpi_type(zero_dtype d, int reducing)
{
    if (reducing && coll_is_r16(d)) return MPI_FLOAT; /* reductions go through fp32 */
    return mpi_wire_type(d);
}

static zero_status oom(zero_comm *c, const coll_args *a, size_t bytes)
{
    char what[96];
    coll_describe(a, what, sizeof what);
    return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s on group %s rank %d: no memory for %zu bytes of fp32 staging",
                     what, c->name, c->rank, bytes);
}

/* Receive into a temporary of `count` elements, copied to dst at completion. */
static zero_status bounce_recv(zero_comm *c, const coll_args *a, mpi_op *op, void *dst, size_t count)
{
    size_t bytes = count * zero_dtype_size(a->dtype);
    op->tmp_recv = malloc(bytes ? bytes : 1);
    if (!op->tmp_recv) return oom(c, a, bytes);
    op->copy_src = op->tmp_recv;
    op->copy_dst = dst;
    op->copy_count = count;
    return ZERO_OK;
}

static zero_status data_start(zero_comm *c, MPI_Comm mc, const coll_args *a, mpi_op *op)
{
    memset(op, 0, sizeof *op);
    op->req = MPI_REQUEST_NULL;
    op->dtype = a->dtype;
    op->kind = a->kind;
    int n = c->size;
    size_t es = zero_dtype_size(a->dtype);
    size_t chunk = a->count * es;
    size_t total = (a->kind == ZERO_OP_REDUCE_SCATTER || a->kind == ZERO_OP_ALLGATHER) ? a->count * (size_t)n
                                                                                       : a->count;
    if (mpi_sched_wanted(c, a)) return mpi_sched_start(c, mc, a, &op->sched);
    if (coll_is_a2a(a->kind)) return mpi_a2a_start(c, mc, a, &op->a2a);
    if (total > INT_MAX) {
        char what[96];
        coll_describe(a, what, sizeof what);
        return zero_fail(&c->err, ZERO_UNSUPPORTED,
                         "%s on group %s rank %d: %zu elements exceed MPI's int count (%d); split the op",
                         what, c->name, c->rank, total, INT_MAX);
    }
    int cnt = (int)a->count;
    int r16 = coll_is_r16(a->dtype);
    MPI_Op mop = a->op == ZERO_MAX ? MPI_MAX : (a->dtype == ZERO_U8 ? u8_sum_op : MPI_SUM);
    const char *s = a->send;
    char *r = a->recv;
    int rc = MPI_SUCCESS;

    /* MPI's own collectives (libnbc) cannot be cancelled: when one is given
     * up, its receives would land in the caller's buffer whenever a late peer
     * shows up, maybe after the caller freed it. So they receive into a
     * temporary (kept by the graveyard if abandoned) copied out at completion:
     * only small all-reduces, broadcasts and the forced nbc path go here. */
    int bounce = n > 1;
    switch (a->kind) {
    case ZERO_OP_ALLREDUCE:
        if (r16) {
            /* Widen, reduce fp32, round once at completion. */
            op->tmp_send = malloc(a->count * 4);
            op->tmp_recv = malloc(a->count * 4);
            if (!op->tmp_send || !op->tmp_recv) {
                mpi_op_abandon(op);
                return oom(c, a, a->count * 8);
            }
            coll_r16_to_f32((const uint16_t *)s, op->tmp_send, a->count, a->dtype);
            op->copy_src = op->tmp_recv;
            op->copy_dst = r;
            op->copy_count = a->count;
            op->convert = 1;
            rc = MPI_Iallreduce(op->tmp_send, op->tmp_recv, cnt, MPI_FLOAT, mop, mc, &op->req);
        } else if (bounce) {
            ZERO_TRY(bounce_recv(c, a, op, r, a->count));
            rc = MPI_Iallreduce(s, op->tmp_recv, cnt, mpi_type(a->dtype, 1), mop, mc, &op->req);
        } else {
            rc = MPI_Iallreduce(s == r ? MPI_IN_PLACE : s, r, cnt, mpi_type(a->dtype, 1), mop, mc, &op->req);
        }
        break;
    case ZERO_OP_REDUCE_SCATTER: {
        int in_place = r == s + (size_t)c->rank * chunk;
        if (r16) {
            op->tmp_send = malloc(total * 4);
            op->tmp_recv = malloc(a->count * 4);
            if (!op->tmp_send || !op->tmp_recv) {
                mpi_op_abandon(op);
                return oom(c, a, (total + a->count) * 4);
            }
            coll_r16_to_f32((const uint16_t *)s, op->tmp_send, total, a->dtype);
            op->convert = 1;
        } else if (in_place || bounce) {
            /* MPI's in-place reduce-scatter takes its input from recv and
             * leaves the result at recv[0], not at our chunk: reduce into a
             * temporary and copy our chunk over at the end, which also keeps
             * the other chunks of send untouched. */
            op->tmp_recv = malloc(chunk);
            if (!op->tmp_recv) return oom(c, a, chunk);
        }
        if (op->tmp_recv) {
            op->copy_src = op->tmp_recv;
            op->copy_dst = r;
            op->copy_count = a->count;
        }
        rc = MPI_Ireduce_scatter_block(r16 ? (const void *)op->tmp_send : s, op->tmp_recv ? (void *)op->tmp_recv : r,
                                       cnt, mpi_type(a->dtype, 1), mop, mc, &op->req);
        break;
    }
    case ZERO_OP_ALLGATHER: {
        int in_place = s == r + (size_t)c->rank * chunk;
        if (bounce) {
            ZERO_TRY(bounce_recv(c, a, op, r, total));
            rc = MPI_Iallgather(s, cnt, mpi_type(a->dtype, 0), op->tmp_recv, cnt, mpi_type(a->dtype, 0), mc,
                                &op->req);
        } else {
            rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : s, cnt, mpi_type(a->dtype, 0), r, cnt,
                                mpi_type(a->dtype, 0), mc, &op->req);
        }
        break;
    }
    case ZERO_OP_BROADCAST:
        if (c->rank == a->root) {
            if (s != r) memcpy(r, s, chunk);
            rc = MPI_Ibcast(r, cnt, mpi_type(a->dtype, 0), a->root, mc, &op->req); /* only read here */
        } else if (bounce) {
            ZERO_TRY(bounce_recv(c, a, op, r, a->count));
            rc = MPI_Ibcast(op->tmp_recv, cnt, mpi_type(a->dtype, 0), a->root, mc, &op->req);
        } else {
            rc = MPI_Ibcast(r, cnt, mpi_type(a->dtype, 0), a->root, mc, &op->req);
        }
        break;
    case ZERO_OP_SEND:
        rc = MPI_Isend(s, cnt, mpi_type(a->dtype, 0), a->peer, P2P_TAG, mc, &op->req);
        break;
    case ZERO_OP_RECV:
        op->copy_count = a->count; /* checked against the arriving message */
        rc = MPI_Irecv(r, cnt, mpi_type(a->dtype, 0), a->peer, P2P_TAG, mc, &op->req);
        break;
    case ZERO_OP_BARRIER:
        rc = MPI_Ibarrier(mc, &op->req);
        break;
    default:
        return zero_fail(&c->err, ZERO_INTERNAL, "mpi backend: op kind %d", (int)a->kind);
    }
    if (rc != MPI_SUCCESS) {
        char what[96];
        coll_describe(a, what, sizeof what);
        mpi_op_abandon(op);
        return mpi_status_from(c, rc, what);
    }
    return ZERO_OK;
}

static int wants_fingerprint(const zero_comm *c, const coll_args *a)
{
    return c->fingerprint && c->size > 1 && a->kind != ZERO_OP_SEND && a->kind != ZERO_OP_RECV;
}

zero_status mpi_op_start(zero_comm *c, MPI_Comm mc, const coll_args *a, mpi_op *op)
{
    if (!wants_fingerprint(c, a)) return data_start(c, mc, a, op);
    /* Fingerprints first, data once they agree: no byte moves between ranks
     * that called different ops. (Open MPI 4.1's shared-memory single-copy
     * path writes a longer message past the end of the receive buffer before
     * reporting the truncation, so even a detected count mismatch would
     * corrupt memory if the data went out at once.) */
    memset(op, 0, sizeof *op);
    op->req = MPI_REQUEST_NULL;
    op->kind = a->kind;
    op->dtype = a->dtype;
    ZERO_TRY(mpi_fp_start(c, mc, a, &op->fp));
    op->gated = 1;
    op->ticket = c->gate_issued++;
    op->args = *a;
    op->mc = mc;
    return ZERO_OK;
}

/* Start the data of a gated op: data_start fills the whole op, so the
 * fingerprint's state is carried over. */
static zero_status start_gated(zero_comm *c, mpi_op *op)
{
    MPI_Comm mc = op->mc;
    mpi_fp *fp = op->fp;
    coll_args a = op->args;
    uint32_t ticket = op->ticket;
    zero_status st = data_start(c, mc, &a, op);
    op->mc = mc;
    op->fp = fp;
    op->args = a;
    op->ticket = ticket;
    op->gated = 0;
    op->watch = 1;
    c->gate_next++;
    return st;
}

/* Gated ops start their data in the order they were issued, the same on
 * every rank (MPI's own collectives match by order). */
static int my_turn(const zero_comm *c, const mpi_op *op) { return op->ticket == c->gate_next; }

/* Start a gated op's data if the peers' records arrived and agree (errors
 * are left for the op's own test to report). */
void mpi_op_advance(zero_comm *c, mpi_op *op)
{
    if (!op->gated || op->failed_start || !my_turn(c, op)) return;
    if (op->fp) { /* NULL: its test already saw them agree */
        int arrived = 0;
        if (mpi_fp_peek(op->fp, &arrived) != ZERO_OK || !arrived) return;
        /* compare without recording: a mismatch is reported by the op's test */
        if (!mpi_fp_agrees(op->fp)) return;
    }
    zero_status st = start_gated(c, op);
    if (st != ZERO_OK) op->failed_start = st;
}

static zero_status mpi_finish(zero_comm *c, mpi_op *op, const MPI_Status *stat)
{
    if (op->kind == ZERO_OP_RECV) {
        int got = 0;
        MPI_Get_count(stat, mpi_type(op->dtype, 0), &got);
        if ((size_t)got != op->copy_count)
            return coll_comm_fail(c, ZERO_MISMATCH,
                                  "recv of %zu x %s on group %s rank %d: the peer sent %d elements",
                                  op->copy_count, zero_dtype_name(op->dtype), c->name, c->rank, got);
        return ZERO_OK;
    }
    if (op->copy_src) {
        if (op->convert)
            coll_f32_to_r16(op->copy_src, op->copy_dst, op->copy_count, op->dtype);
        else
            memcpy(op->copy_dst, op->copy_src, op->copy_count * zero_dtype_size(op->dtype));
    }
    free(op->tmp_send);
    free(op->tmp_recv);
    op->tmp_send = op->tmp_recv = NULL;
    return ZERO_OK;
}

static zero_status data_test(zero_comm *c, mpi_op *op, int *done)
{
    if (op->a2a) {
        zero_status st = mpi_a2a_test(c, op->a2a, done);
        if (st == ZERO_OK && *done) {
            mpi_a2a_free(op->a2a);
            op->a2a = NULL;
        }
        return st;
    }
    if (op->sched) {
        zero_status st = mpi_sched_test(c, op->sched, done);
        if (st == ZERO_OK && *done) {
            mpi_sched_free(op->sched);
            op->sched = NULL;
        }
        return st;
    }
    int flag = 0;
    MPI_Status stat;
    int rc = MPI_Test(&op->req, &flag, &stat);
    if (rc != MPI_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "%s (completing)", coll_op_name(op->kind));
        return mpi_status_from(c, rc, what);
    }
    *done = flag;
    return flag ? mpi_finish(c, op, &stat) : ZERO_OK;
}

zero_status mpi_op_test(zero_comm *c, mpi_op *op, int *done)
{
    *done = 0;
    if (op->failed_start) return op->failed_start;
    if (op->fp) {
        int arrived = 0;
        ZERO_TRY(mpi_fp_test(c, op->fp, &arrived));
        if (!arrived) return ZERO_OK;
        mpi_fp_free(op->fp); /* they agree */
        op->fp = NULL;
    }
    if (op->gated) {
        if (!my_turn(c, op)) return ZERO_OK; /* an earlier op's records are still out */
        ZERO_TRY(start_gated(c, op));
    }
    if (op->watch) ZERO_TRY(mpi_fp_check_broken(c, op->mc, &op->args));
    zero_status st = data_test(c, op, done);
    return st;
}

int mpi_op_missing(const zero_comm *c, const mpi_op *op, unsigned char *missing)
{
    if (op->fp) mpi_fp_missing(c, op->fp, missing);
    if (op->sched) mpi_sched_missing(op->sched, missing);
    if (op->a2a) mpi_a2a_missing(op->a2a, missing);
    if (op->kind == ZERO_OP_RECV) return 0; /* its message names the peer already */
    for (int r = 0; r < c->size; r++)
        if (missing[r]) return 1;
    return 0;
}

void mpi_op_abandon(mpi_op *op)
{
    mpi_fp_abandon(op->fp);
    op->fp = NULL;
    if (op->gated) return; /* no data was posted */
    if (op->sched) {
        mpi_sched_abandon(op->sched);
        op->sched = NULL;
    }
    if (op->a2a) {
        mpi_a2a_abandon(op->a2a);
        op->a2a = NULL;
    }
    if (op->kind == ZERO_OP_RECV && op->req != MPI_REQUEST_NULL) {
        /* Received straight into the caller's buffer: take it back. */
        if (mpi_cancel_receives(&op->req, 1))
            zero_log(ZERO_LOG_WARN, "recv: a receive could not be cancelled; its buffer may still be written");
        else
            op->req = MPI_REQUEST_NULL;
    }
    if (op->req != MPI_REQUEST_NULL) {
        /* MPI may still read or write these; keep them until finalize. */
        coll_graveyard_add(op->tmp_send, free_ptr);
        coll_graveyard_add(op->tmp_recv, free_ptr);
    } else {
        free(op->tmp_send);
        free(op->tmp_recv);
    }
    op->tmp_send = op->tmp_recv = NULL;
}

/* ---------------------------------------------------------------- comms */

typedef struct mpi_test_ctx {
    MPI_Request *req;
    int rc;
} mpi_test_ctx;

static zero_status poll_mpi_request(void *ctx, int *done)
{
    mpi_test_ctx *t = ctx;
    t->rc = MPI_Test(t->req, done, MPI_STATUS_IGNORE);
    return t->rc == MPI_SUCCESS ? ZERO_OK : ZERO_BACKEND;
}

/* Poll one raw MPI request under c's deadline; `what` names it in messages. */
zero_status mpi_wait_raw(zero_comm *c, zero_comm *msg_comm, MPI_Request *req, const char *what)
{
    mpi_test_ctx t = {req, MPI_SUCCESS};
    zero_status st = coll_poll(poll_mpi_request, &t, c->timeout_s);
    if (st == ZERO_TIMEOUT) {
        char ranks[128];
        coll_format_ranks(msg_comm, -1, ranks, sizeof ranks);
        return coll_comm_fail(msg_comm, ZERO_TIMEOUT,
                              "%s on group %s(size %d) rank %d: timed out after %.1f s waiting for ranks %s", what,
                              msg_comm->name, msg_comm->size, msg_comm->rank, c->timeout_s, ranks);
    }
    if (st != ZERO_OK) return mpi_status_from(msg_comm, t.rc, what);
    return ZERO_OK;
}

zero_status mpi_comm_dup_deadline(zero_comm *c, MPI_Comm parent, MPI_Comm *out, const char *what)
{
    /* MPI writes the new handle when the dup completes, which after a
     * timeout may be never or later: into memory that outlives us. */
    MPI_Comm *handle = malloc(sizeof *handle);
    if (!handle) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", what);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Comm_idup(parent, handle, &req);
    if (rc != MPI_SUCCESS) {
        free(handle);
        return mpi_status_from(c, rc, what);
    }
    zero_status st = mpi_wait_raw(c, c, &req, what);
    if (st != ZERO_OK) {
        coll_graveyard_add(handle, free_ptr);
        return st;
    }
    *out = *handle;
    free(handle);
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return ZERO_OK;
}

zero_status mpi_world_common(zero_comm *c, MPI_Comm *out)
{
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ZERO_TRY(coll_comm_set_members(c, rank, size));
    for (int i = 0; i < size; i++) c->world_ranks[i] = i;
    return mpi_comm_dup_deadline(c, MPI_COMM_WORLD, out, "init_world");
}

zero_status mpi_split_common(zero_comm *parent, MPI_Comm pmc, int color, int key, zero_comm *child,
                             MPI_Comm *out)
{
    /* MPI_Comm_split blocks without a deadline, so first learn every
     * member's (color, key) with a polled all-gather: once it completes every
     * rank is known to be in this split, and we also get the members' world
     * ranks for error messages without asking MPI. */
    int n = parent->size;
    /* mine[0..1] is what we send, all = mine + 2 what we receive: heap memory
     * the graveyard keeps if the exchange times out. */
    int *mine = malloc(sizeof(int) * 2 * ((size_t)n + 1));
    if (!mine) return zero_fail(&parent->err, ZERO_OUT_OF_MEMORY, "split of group %s: out of memory", parent->name);
    int *all = mine + 2;
    mine[0] = color;
    mine[1] = key;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, pmc, &req);
    if (rc != MPI_SUCCESS) {
        free(mine);
        return mpi_status_from(parent, rc, "split");
    }
    zero_status st = mpi_wait_raw(parent, parent, &req, "split (exchange of color and key)");
    if (st != ZERO_OK) {
        coll_graveyard_add(mine, free_ptr);
        return st;
    }
    int size = 0, rank = 0;
    for (int j = 0; j < n; j++) {
        if (all[2 * j] != color) continue;
        /* Order by (key, parent rank), as MPI_Comm_split does. */
        if (all[2 * j + 1] < key || (all[2 * j + 1] == key && j < parent->rank)) rank++;
        size++;
    }
    st = coll_comm_set_members(child, rank, size);
    if (st != ZERO_OK) {
        free(mine);
        return st;
    }
    for (int j = 0; j < n; j++) {
        if (all[2 * j] != color) continue;
        int pos = 0;
        for (int i = 0; i < n; i++)
            if (all[2 * i] == color &&
                (all[2 * i + 1] < all[2 * j + 1] || (all[2 * i + 1] == all[2 * j + 1] && i < j)))
                pos++;
        child->world_ranks[pos] = parent->world_ranks[j];
    }
    free(mine);

    /* Issue 10, B12: a rank arriving after its peers gave up on the exchange
     * can still complete it (their contributions were posted), and then
     * blocked for ever in MPI_Comm_split. So a second polled round confirms
     * that every rank completed the exchange (a rank that gave up never
     * posts it), and a rank that gave up on that round has sent its peers a
     * notice (coll_comm_fail -> mpi_fp_poison), checked just before the
     * blocking call. What remains is a rank giving up on the second round in
     * the microseconds between its peer completing that round and reading
     * notices (docs/collectives.md). */
    rc = MPI_Ibarrier(pmc, &req);
    if (rc != MPI_SUCCESS) return mpi_status_from(parent, rc, "split");
    ZERO_TRY(mpi_wait_raw(parent, parent, &req, "split (confirming every rank completed the exchange)"));
    ZERO_TRY(mpi_notice_check(parent, pmc, "split"));

    rc = MPI_Comm_split(pmc, color, key, out);
    if (rc != MPI_SUCCESS) return mpi_status_from(parent, rc, "split");
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    int mrank = -1;
    MPI_Comm_rank(*out, &mrank);
    if (mrank != rank) {
        MPI_Comm_free(out);
        return zero_fail(&parent->err, ZERO_INTERNAL, "split of group %s: MPI gave rank %d, expected %d",
                         parent->name, mrank, rank);
    }
    return ZERO_OK;
}

zero_status mpi_local_rank(zero_comm *c, MPI_Comm mc, int *out)
{
    /* Ranks sharing this node, from every rank's processor name, exchanged
     * with a deadline: MPI_Comm_split_type would block without one (a rank
     * whose peers gave up on the world dup could complete it and then wait
     * for ever). mc is the world's own dup, so this is its first op on every
     * rank. */
    int n = 1, me = 0, len = 0;
    MPI_Comm_size(mc, &n);
    MPI_Comm_rank(mc, &me);
    /* mine first, then everyone's: heap memory the graveyard keeps on a timeout */
    char *mine = calloc((size_t)n + 1, MPI_MAX_PROCESSOR_NAME);
    if (!mine) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "init_world (local rank): out of memory");
    char *all = mine + MPI_MAX_PROCESSOR_NAME;
    MPI_Get_processor_name(mine, &len);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, mc, &req);
    if (rc != MPI_SUCCESS) {
        free(mine);
        return mpi_status_from(c, rc, "init_world (local rank)");
    }
    zero_status st = mpi_wait_raw(c, c, &req, "init_world (local rank: exchange of host names)");
    if (st != ZERO_OK) {
        coll_graveyard_add(mine, free_ptr);
        return st;
    }
    int local = 0;
    for (int r = 0; r < me; r++)
        if (strncmp(all + (size_t)r * MPI_MAX_PROCESSOR_NAME, mine, MPI_MAX_PROCESSOR_NAME) == 0) local++;
    free(mine);
    *out = local;
    return ZERO_OK;
}

/* ---------------------------------------------------------------- backend */

typedef struct mpi_impl {
    MPI_Comm comm;
} mpi_impl;

typedef struct mpi_req {
    mpi_op op;
} mpi_req;

static zero_status be_init_world(zero_comm *c, const zero_comm_config *cfg)
{
    (void)cfg;
    mpi_impl *m = calloc(1, sizeof *m);
    if (!m) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "zero_comm_create_world: out of memory");
    m->comm = MPI_COMM_NULL;
    zero_status st = mpi_world_common(c, &m->comm);
    if (st != ZERO_OK) {
        free(m);
        return st;
    }
    c->impl = m;
    return ZERO_OK;
}

static zero_status be_start(zero_comm *c, zero_request *req)
{
    mpi_impl *m = c->impl;
    mpi_req *r = malloc(sizeof *r);
    if (!r) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", coll_op_name(req->args.kind));
    zero_status st = mpi_op_start(c, m->comm, &req->args, &r->op);
    if (st != ZERO_OK) {
        free(r);
        return st;
    }
    req->impl = r;
    return ZERO_OK;
}

static zero_status be_test(zero_comm *c, zero_request *req, int *done)
{
    mpi_req *r = req->impl;
    zero_status st = mpi_op_test(c, &r->op, done);
    if (st == ZERO_OK && *done) {
        free(r);
        req->impl = NULL;
    }
    return st;
}

static void be_abandon(zero_comm *c, zero_request *req)
{
    (void)c;
    mpi_req *r = req->impl;
    if (!r) return;
    mpi_op_abandon(&r->op);
    free(r);
    req->impl = NULL;
}

static void be_failed(zero_comm *c)
{
    mpi_impl *m = c->impl;
    if (m) mpi_fp_poison(c, m->comm);
}

static int be_missing(zero_comm *c, zero_request *req, unsigned char *missing)
{
    mpi_req *r = req->impl;
    return r ? mpi_op_missing(c, &r->op, missing) : 0;
}

static void be_advance(zero_comm *c, zero_request *req)
{
    mpi_req *r = req->impl;
    if (r) mpi_op_advance(c, &r->op);
}

static zero_status be_split(zero_comm *parent, int color, int key, zero_comm *child)
{
    mpi_impl *pm = parent->impl;
    mpi_impl *m = calloc(1, sizeof *m);
    if (!m) return zero_fail(&parent->err, ZERO_OUT_OF_MEMORY, "split of group %s: out of memory", parent->name);
    zero_status st = mpi_split_common(parent, pm->comm, color, key, child, &m->comm);
    if (st != ZERO_OK) {
        free(m);
        return st;
    }
    child->impl = m;
    return ZERO_OK;
}

static void be_destroy(zero_comm *c)
{
    mpi_impl *m = c->impl;
    if (!m) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    /* A failed comm may have operations MPI still runs: leave the
     * communicator to MPI_Finalize rather than free it under them. */
    if (!finalized && c->failed == ZERO_OK && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    free(m);
    c->impl = NULL;
}

const coll_backend coll_backend_mpi = {
    .name = "mpi",
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

#endif /* ZERO_HAVE_MPI */
