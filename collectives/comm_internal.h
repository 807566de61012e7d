/* Internal: the zero_comm object, its requests and the backend vtable.
 *
 * comm.c owns lifecycles, split and accessors; grid.c the tp/dp/pp grid;
 * ops.c validates arguments, counts bytes and drives requests; deadline.c
 * polls a request until its deadline (and keeps the graveyard and scratch);
 * each backend_*.c implements one transport behind coll_backend; mpi_sched.c
 * holds the MPI backend's point-to-point schedules; reduce.c their element-wise
 * kernels and the fp32 accumulation of 16-bit floats. */
#ifndef ZERO_COLLECTIVES_COMM_INTERNAL_H
#define ZERO_COLLECTIVES_COMM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <zero/comm.h>

#include "common/error.h"
#include "common/handle.h"
#include "scratch.h"
#include "zero_build_config.h"

#if ZERO_HAVE_MPI
#include <mpi.h>
#endif

#define COLL_NAME_MAX 64

/* One op as the caller described it, after validation. */
typedef struct coll_args {
    zero_op_kind kind;
    const void *send;
    void *recv;
    size_t count; /* elements; see comm.h for what it means per op */
    zero_dtype dtype;
    zero_redop op;
    int root; /* broadcast */
    int peer; /* send / recv */
    uint32_t seq; /* collectives issued on the comm before this one (same on every rank) */
    /* all-to-all-v: the caller's arrays (read only while the op is issued),
     * then `v`: the request's own copy, 4 arrays of the group's size - send
     * counts, send displacements, recv counts, recv displacements - with
     * packed displacements filled in. count is then the elements sent. */
    const size_t *user_v[4];
    const size_t *v;
} coll_args;

/* What an all-to-all(-v) moves between this rank and group rank p (elements). */
typedef struct coll_a2a_chunk {
    size_t send_count, send_displ, recv_count, recv_displ;
} coll_a2a_chunk;

static inline coll_a2a_chunk coll_a2a_peer(const coll_args *a, int n, int p)
{
    coll_a2a_chunk k;
    if (a->v) {
        k.send_count = a->v[p];
        k.send_displ = a->v[n + p];
        k.recv_count = a->v[2 * n + p];
        k.recv_displ = a->v[3 * n + p];
    } else {
        k.send_count = k.recv_count = a->count;
        k.send_displ = k.recv_displ = (size_t)p * a->count;
    }
    return k;
}
static inline int coll_is_a2a(zero_op_kind k) { return k == ZERO_OP_ALLTOALL || k == ZERO_OP_ALLTOALLV; }
/* Elements spanned by the send (which = 0) or recv (1) chunks: max(displ + count). */
size_t coll_a2a_extent(const coll_args *a, int n, int which);

struct zero_request {
    zero_comm *comm;   /* NULL once the comm was destroyed with the request outstanding */
    zero_request *prev, *next; /* the comm's outstanding asynchronous requests */
    coll_args args;
    int done;          /* finished: results are in the caller's buffers */
    zero_status status;
    void *impl;        /* backend state (an MPI request, a CUDA event, ...) */
    size_t *vec;       /* owned: args.v of an all-to-all-v */
    /* Issued while a group was open on its comm (group.c): COLL_GROUPED_ASYNC
     * for the caller's asynchronous request, COLL_GROUPED_OWNED for a blocking
     * call the group completes (and frees) at zero_comm_group_end; 0 once the
     * group ended. */
    int grouped;
    zero_request *group_next; /* the open group's requests, in issue order */
};

#define COLL_GROUPED_ASYNC 1
#define COLL_GROUPED_OWNED 2

/* Reusable temporary buffers (scratch.h). */

typedef struct coll_backend {
    const char *name;
    /* Fill c->impl, rank, size and world_ranks for the world group. */
    zero_status (*init_world)(zero_comm *c, const zero_comm_config *cfg);
    /* Issue the op. On success the backend may already have finished it
     * (req->done = 1), else `test` completes it later. */
    zero_status (*start)(zero_comm *c, zero_request *req);
    /* Progress without blocking; *done = 1 once results are in place. */
    zero_status (*test)(zero_comm *c, zero_request *req, int *done);
    /* The op missed its deadline or failed: release req->impl, keeping alive
     * (see coll_graveyard_add) whatever the transport may still touch. */
    void (*abandon)(zero_comm *c, zero_request *req);
    /* Fill child->impl and the child's rank, size and world_ranks:
     * collective over parent, with parent's deadline. */
    zero_status (*split)(zero_comm *parent, int color, int key, zero_comm *child);
    /* Free c->impl. When c->failed, must not block on peers. */
    void (*destroy)(zero_comm *c);
    /* Optional. The comm just failed on this rank: tell the peers (without
     * blocking) so they stop waiting for it. */
    void (*failed)(zero_comm *c);
    /* Optional. Mark missing[r] = 1 for every group rank r whose part of the
     * op has not arrived; returns 0 when the backend cannot tell. */
    int (*missing)(zero_comm *c, zero_request *req, unsigned char *missing);
    /* Optional. A group opens / its outermost end (group.c): NCCL wraps the
     * ops in ncclGroupStart/End and enqueues their completion events only
     * after the end (`head` lists the group's requests, via group_next). */
    zero_status (*group_begin)(zero_comm *c);
    zero_status (*group_end)(zero_comm *c, zero_request *head);
    /* Optional. Move an outstanding request along without reporting
     * anything (fingerprinted ops start their data here once the records
     * agree): called for the comm's other requests while one is polled. */
    void (*advance)(zero_comm *c, zero_request *req);
} coll_backend;

struct zero_comm {
    uint32_t magic;         /* ZERO_HANDLE_COMM while alive, ZERO_HANDLE_DEAD once destroyed */
    const coll_backend *be;
    zero_backend backend;
    int rank, size;
    int *world_ranks;       /* world rank of every member, by group rank */
    int device;             /* CUDA ordinal for NCCL/STAGED, else -1 */
    double timeout_s;
    char name[COLL_NAME_MAX];
    zero_status failed;     /* ZERO_OK, or the error that left the comm unusable */
    char failed_cause[256]; /* that error's message, repeated by every later refusal: the first
                             * failure may have been met by an async op whose caller never saw it */
    int outstanding;        /* issued requests not yet waited on */
    zero_request *pending;  /* those requests (asynchronous ones), abandoned by destroy */
    uint32_t coll_seq;      /* collectives issued so far: tags point-to-point schedules */
    coll_scratch scratch;   /* reusable temporary memory of the backend's ops */
    int fingerprint;        /* check every collective's fingerprint across the group (fingerprint.c) */
    char label[32];         /* zero_comm_set_label (shortened): shown in mismatch messages */
    uint32_t label_hash;    /* of the whole label (0: none): what the fingerprints compare */
    uint32_t gate_issued;   /* fingerprinted ops issued, and the next of them that may start */
    uint32_t gate_next;     /* its data: MPI's collectives must start in the same order everywhere */
    int owns_mpi;           /* holds a reference on MPI's lifetime (mpi_env_release) */
    int group_depth;        /* zero_comm_group_begin calls not yet ended (group.c) */
    int group_ops;          /* requests issued in the open group */
    zero_request *group_head, *group_tail; /* those requests, in issue order */
    zero_errbuf err;
    zero_comm_counters counters;
    void *impl;
    struct coll_stream *sstream; /* zero_comm_set_stream: stream-ordered mode (stream.c); NULL: off */
};

/* ------------------------------------------------------------ backends */
extern const coll_backend coll_backend_local;
#if ZERO_HAVE_MPI
extern const coll_backend coll_backend_mpi;
#endif
#if ZERO_HAVE_MPI && ZERO_HAVE_CUDA
extern const coll_backend coll_backend_staged;
/* Set c->device: `requested`, or the local rank (learnt over mc) modulo the device count;
 * ZERO_UNSUPPORTED when no GPU is present. Also makes it current. */
zero_status coll_cuda_pick_device(zero_comm *c, MPI_Comm mc, int requested);
/* ZERO_INVALID_ARGUMENT when a buffer of `a` is plain host memory. */
zero_status coll_cuda_check_buffers(zero_comm *c, const coll_args *a);
#endif
#if ZERO_HAVE_NCCL
extern const coll_backend coll_backend_nccl;
#endif

/* ------------------------------------------------------------ comm.c helpers */

/* Set rank and size and allocate world_ranks (filled by the caller). */
zero_status coll_comm_set_members(zero_comm *c, int rank, int size);
/* "allreduce of 1000 x f32" */
void coll_describe(const coll_args *a, char *buf, size_t len);
/* "0-3", "0,2,5-7": the world ranks of the members (all but `skip`, -1 = none). */
void coll_format_ranks(const zero_comm *c, int skip, char *buf, size_t len);
const char *coll_op_name(zero_op_kind kind);

/* ZERO_OK when c is a live comm; else ZERO_INVALID_ARGUMENT (NULL) or
 * ZERO_INVALID_STATE (destroyed), with a message naming `fn`. */
zero_status coll_comm_check(const zero_comm *c, const char *fn);
static inline int coll_comm_live(const zero_comm *c) { return c && c->magic == ZERO_HANDLE_COMM; }

/* Mark the comm unusable (first error wins) and record the message. */
zero_status coll_comm_fail(zero_comm *c, zero_status status, const char *fmt, ...) ZERO_PRINTF(3, 4);
/* Mark the comm unusable with `status` (first error wins; the message is
 * already recorded) and let the backend tell the peers. */
void coll_comm_mark_failed(zero_comm *c, zero_status status);
/* "ZERO_TIMEOUT: <the first failure's message>", for "the group failed earlier (...)" */
const char *coll_failed_cause(const zero_comm *c);
/* FNV-1a, continuing from h (start with 2166136261u). */
uint32_t coll_hash(const void *p, size_t len, uint32_t h);
/* ZERO_COLL_FINGERPRINT set and not "0": fingerprints on by default. */
int coll_fingerprint_default(void);
/* "1,4-5": the world ranks of the members r with in[r] != 0. */
void coll_format_subset(const zero_comm *c, const unsigned char *in, char *buf, size_t len);

/* ------------------------------------------------------------ group.c */

/* Free a heap request and what it owns (ops.c). */
void coll_request_free(zero_request *req);
/* A request issued while a group is open on its comm joins the group. */
void coll_group_add(zero_comm *c, zero_request *req, int how);
/* The comm is being destroyed with a group open: forget the group (its own
 * requests are freed by the caller's pending loop). */
void coll_group_forget(zero_comm *c);

/* ------------------------------------------------------------ ops.c */
/* A blocking op as the caller's call runs it (stream-ordered when the comm has a stream). */
zero_status coll_run_blocking(zero_comm *c, coll_args *a, const char *fn);
zero_status coll_run_async(zero_comm *c, coll_args *a, const char *fn, zero_request **out);
/* Validate `a` without touching the comm's state (its message goes to the
 * thread's zero_last_error only; the comm's failure is not checked). */
zero_status coll_validate_detached(zero_comm *c, coll_args *a, const char *fn, size_t **vec_out);

/* ------------------------------------------------------------ stream.c */
/* The calling thread issues ops stream-ordered: the comm has a stream and
 * this is not the stream's worker running one of them. */
int coll_stream_mode(const zero_comm *c);
/* NCCL: the cudaStream_t of stream-ordered mode, NULL when off. */
void *coll_stream_cuda(const zero_comm *c);
/* Enqueue a blocking call's op on the comm's stream. */
zero_status coll_stream_issue(zero_comm *c, coll_args *a, const char *fn);
/* Host-driven backends in stream mode: a group is collected and enqueued at
 * its end. Return 0 when not in that mode (the caller proceeds as usual). */
int coll_stream_group_begin(zero_comm *c);
int coll_stream_group_end(zero_comm *c, zero_status *st);
/* NCCL in stream mode: the ended group's own requests go to the stream's list. */
void coll_stream_keep_group(zero_comm *c);
/* Destroy: drop queued ops, wait for a running one (its deadline); 0 when
 * one is still running and the comm's memory must be kept. */
int coll_stream_release(zero_comm *c);
/* The first stream-ordered failure's message, NULL when none. */
const char *coll_stream_error_msg(const zero_comm *c);

/* ------------------------------------------------------------ deadline.c */

typedef zero_status (*coll_test_fn)(void *ctx, int *done);
/* Call fn until *done or `timeout_s` has passed (returns ZERO_TIMEOUT without
 * a message; the caller knows what was awaited). Polls back to back for the
 * first `spin_s`, then sleeps between polls for 1/64 of the time waited, at
 * most 1 ms, so a rank waiting for a straggler does not burn a core
 * (deadline.c). coll_poll: the spin of an op of unknown size. */
zero_status coll_poll_spin(coll_test_fn fn, void *ctx, double timeout_s, double spin_s);
zero_status coll_poll(coll_test_fn fn, void *ctx, double timeout_s);
double coll_now(void);
/* The spin of an op moving `bytes` (ZERO_COLL_SPIN_US, ZERO_COLL_SPIN_GBPS). */
double coll_spin_s(size_t bytes);

/* Wait for one request until the comm's deadline; on expiry record the
 * timeout message, fail the comm and abandon the request. Does not free req. */
zero_status coll_wait_request(zero_request *req);
/* backend.advance on the comm's outstanding requests other than `except`. */
void coll_advance_others(zero_comm *c, const zero_request *except);

/* Memory a transport may still write after we gave up on it: kept reachable
 * until MPI is finalized (then freed), so leak checkers stay quiet. */
void coll_graveyard_add(void *ptr, void (*release)(void *));
void coll_graveyard_flush(void);

/* ------------------------------------------------------------ reduce.c
 * Element-wise kernels; f16/bf16 reductions accumulate in fp32 and round once.
 * src and dst never overlap. */
void coll_r16_to_f32(const uint16_t *src, float *dst, size_t n, zero_dtype dtype);
void coll_f32_to_r16(const float *src, uint16_t *dst, size_t n, zero_dtype dtype);
/* acc = first ? widen(x) : acc op widen(x) */
void coll_acc16(float *acc, const uint16_t *x, size_t n, zero_dtype dtype, int max, int first);
/* out = a op b (sum wraps for integers); out == a, or all three disjoint.
 * Not for 16-bit floats. */
void coll_reduce(void *out, const void *a, const void *b, size_t n, zero_dtype dtype, int max);
static inline int coll_is_r16(zero_dtype d) { return d == ZERO_F16 || d == ZERO_BF16; }

/* ------------------------------------------------------------ MPI core
 * Shared by the MPI, STAGED and NCCL backends (all have an MPI communicator
 * underneath: for transport, or to bootstrap and split). */
#if ZERO_HAVE_MPI
/* Reference-counted MPI lifetime: init if needed (then we finalize when the
 * last reference goes). */
zero_status mpi_env_acquire(zero_errbuf *err);
void mpi_env_release(void);
zero_status mpi_status_from(zero_comm *c, int mpi_err, const char *what);

typedef struct mpi_sched mpi_sched; /* mpi_sched.c */
typedef struct mpi_a2a mpi_a2a;     /* mpi_alltoall.c */

/* The requests of a point-to-point collective (mpi_sched.c,
 * mpi_alltoall.c), as mpi_p2p.c reads them. */
typedef struct mpi_p2p {
    zero_comm *comm;
    zero_op_kind kind;
    zero_dtype dtype;
    size_t count;
    const char *how; /* "schedule", "exchange": named in messages */
    int nreq;
    MPI_Request *reqs;
    MPI_Status *stats;
    const int *expect; /* per request: elements a receive expects from its peer, -1 for a send */
    const int *peer;   /* per request: the group rank at the other end */
} mpi_p2p;

/* The MPI type a message of d travels as (16-bit floats as raw 16-bit
 * words; backend_mpi.c). */
MPI_Datatype mpi_wire_type(zero_dtype d);
/* What the point-to-point collectives share (mpi_p2p.c). */
/* An MPI call of r failed with rc: "<op> (point-to-point <how>)". */
zero_status mpi_p2p_fail_rc(zero_comm *c, const mpi_p2p *r, int rc);
/* MPI_Testall said MPI_ERR_IN_STATUS: the first failed request, a receive
 * truncated (its peer sent more) as ZERO_MISMATCH naming the peer. */
zero_status mpi_p2p_failed(zero_comm *c, const mpi_p2p *r);
/* All complete: a receive that got fewer elements than it expects (a
 * success to MPI) is ZERO_MISMATCH naming the peer. */
zero_status mpi_p2p_check_counts(zero_comm *c, const mpi_p2p *r);
/* missing[peer] = 1 for each peer whose receive is incomplete; 1 if any. */
int mpi_p2p_missing(const mpi_p2p *r, unsigned char *missing);
/* The op is given up: take its receives back from MPI before the caller's
 * memory goes (mpi_cancel_receives); the handles of any still pending go to
 * the graveyard, with a warning. Reorders r->reqs; returns how many. */
int mpi_p2p_abandon(const mpi_p2p *r);
typedef struct mpi_fp mpi_fp;       /* fingerprint.c */

/* Fingerprints (fingerprint.c). */
/* Post this op's record to every peer and the receives of theirs. */
zero_status mpi_fp_start(zero_comm *c, MPI_Comm mc, const coll_args *a, mpi_fp **out);
/* *arrived = 1 once every peer's record is in; ZERO_MISMATCH when one
 * differs, ZERO_PEER_FAILURE when a peer announced it gave up the comm. */
zero_status mpi_fp_test(zero_comm *c, mpi_fp *f, int *arrived);
/* Like mpi_fp_test without recording anything: *arrived, and then whether
 * the records agree. */
zero_status mpi_fp_peek(mpi_fp *f, int *arrived);
int mpi_fp_agrees(const mpi_fp *f);
/* missing[r] = 1 for each group rank r whose record has not arrived. */
void mpi_fp_missing(const zero_comm *c, const mpi_fp *f, unsigned char *missing);
void mpi_fp_free(mpi_fp *f);
void mpi_fp_abandon(mpi_fp *f);
/* ZERO_PEER_FAILURE when a peer's next record is a "broken" notice: it gave
 * up the comm and will not do its part of the op `a` in flight. */
zero_status mpi_fp_check_broken(zero_comm *c, MPI_Comm mc, const coll_args *a);
/* The same for any step `what` on c's MPI communicator mc. */
zero_status mpi_notice_check(zero_comm *c, MPI_Comm mc, const char *what);
/* The comm failed here: send the peers a "broken" record instead of the next fingerprint. */
void mpi_fp_poison(zero_comm *c, MPI_Comm mc);

typedef struct mpi_op {
    MPI_Request req;
    mpi_sched *sched;  /* or a point-to-point schedule instead of req */
    mpi_a2a *a2a;      /* or an all-to-all exchange */
    float *tmp_send;   /* fp32 copies for 16-bit reductions */
    float *tmp_recv;
    void *copy_dst;    /* at completion: copy tmp (converted or not) here */
    void *copy_src;
    size_t copy_count; /* elements */
    zero_dtype dtype;
    zero_op_kind kind;
    int convert;       /* copy_src is fp32 to round into copy_dst's 16-bit */
    mpi_fp *fp;        /* the fingerprint exchange, when the comm checks them */
    int gated;         /* the data waits for the fingerprints to agree: */
    coll_args args;    /*   what to start then, */
    MPI_Comm mc;       /*   and where */
    zero_status failed_start; /* starting it in mpi_op_advance failed */
    uint32_t ticket;   /* its place among the comm's gated ops (gate_issued) */
    int watch;         /* fingerprinted: watch for peers' "broken" notices while the data runs */
} mpi_op;

zero_status mpi_op_start(zero_comm *c, MPI_Comm mc, const coll_args *a, mpi_op *op);
zero_status mpi_op_test(zero_comm *c, mpi_op *op, int *done);
void mpi_op_abandon(mpi_op *op);
void mpi_op_advance(zero_comm *c, mpi_op *op);
/* backend.missing for ops run by mpi_op. */
int mpi_op_missing(const zero_comm *c, const mpi_op *op, unsigned char *missing);
int mpi_sched_missing(const mpi_sched *s, unsigned char *missing);

/* Point-to-point schedules (mpi_sched.c) for reduce-scatter, all-gather and
 * large all-reduces; mpi_sched_wanted says whether `a` runs as one
 * (ZERO_COLL_MPI_ALGO=p2p|nbc overrides the choice). */
int mpi_sched_wanted(const zero_comm *c, const coll_args *a);
zero_status mpi_sched_start(zero_comm *c, MPI_Comm mc, const coll_args *a, mpi_sched **out);
zero_status mpi_sched_test(zero_comm *c, mpi_sched *s, int *done);
void mpi_sched_free(mpi_sched *s);
void mpi_sched_abandon(mpi_sched *s);

/* All-to-all(-v) as point-to-point exchanges (mpi_alltoall.c). */
zero_status mpi_a2a_start(zero_comm *c, MPI_Comm mc, const coll_args *a, mpi_a2a **out);
zero_status mpi_a2a_test(zero_comm *c, mpi_a2a *s, int *done);
int mpi_a2a_missing(const mpi_a2a *s, unsigned char *missing);
void mpi_a2a_free(mpi_a2a *s);
void mpi_a2a_abandon(mpi_a2a *s);

/* Take receives back from MPI before their memory goes back to the caller:
 * cancel every request of reqs[0..n) (all receives), then complete them,
 * waiting at most a short grace period for ones already matched (their data
 * is arriving). Returns how many are still pending, moved to reqs[0..). */
int mpi_cancel_receives(MPI_Request *reqs, int n);

/* Dup a communicator with a deadline (MPI_Comm_idup, polled). */
zero_status mpi_comm_dup_deadline(zero_comm *c, MPI_Comm parent, MPI_Comm *out, const char *what);
/* The common part of split for MPI-based comms: exchange (color, key) with a
 * deadline, fill child's rank, size and world_ranks, then MPI_Comm_split. */
zero_status mpi_split_common(zero_comm *parent, MPI_Comm pmc, int color, int key, zero_comm *child,
                             MPI_Comm *out);
/* World setup shared by MPI-based backends: rank, size, world_ranks, a dup. */
zero_status mpi_world_common(zero_comm *c, MPI_Comm *out);
/* Poll a raw MPI request with c's deadline; failures are recorded on msg_comm. */
zero_status mpi_wait_raw(zero_comm *c, zero_comm *msg_comm, MPI_Request *req, const char *what);
/* This process's rank among the ranks on its node; collective over mc (the
 * world's dup), with c's deadline. */
zero_status mpi_local_rank(zero_comm *c, MPI_Comm mc, int *out);
#endif

#endif
