/* Process groups and collectives.
 *
 * A zero_comm is an opaque group of ranks with one backend:
 *   - MPI     host buffers, any number of ranks, any number of nodes;
 *   - NCCL    device buffers, one rank per GPU (communicator bootstrapped over MPI);
 *   - STAGED  device buffers carried through host memory over MPI, so several
 *             ranks may share one GPU (testing sharding on a single device);
 *   - LOCAL   world size 1 without MPI: every op is a local copy.
 *
 * Buffers: host memory for MPI/LOCAL, device memory of the comm's device for
 * NCCL/STAGED. Device buffers must be ready (their producers synchronized)
 * before an op is issued; a completed op's results are visible everywhere.
 *
 * In-place rules (NCCL's): all-reduce and broadcast are in place when
 * recv == send; reduce-scatter is in place when recv == send + rank*count
 * (elements); all-gather is in place when send == recv + rank*count.
 * Any other overlap of send and recv is ZERO_INVALID_ARGUMENT. An in-place
 * reduce-scatter leaves the other chunks of send untouched (MPI, STAGED,
 * LOCAL). For broadcast, send is only read on the root (others may pass NULL).
 * count == 0 is valid everywhere and moves nothing.
 *
 * Reductions: f16 and bf16 sums accumulate in fp32 and round once (to nearest
 * even) on the MPI, STAGED and LOCAL backends; NCCL uses its native 16-bit
 * reductions, which round between steps once the group has more than 2 ranks.
 * Integer sums wrap (two's complement; u8 modulo 256). On the MPI backend
 * every rank's all-reduce result is bitwise identical.
 *
 * Deadlines: every op that blocks (including zero_wait, whose deadline runs
 * from the call) gives up after the comm's timeout and returns ZERO_TIMEOUT
 * with a message naming the op, the group and the ranks involved; a peer that
 * has left returns ZERO_PEER_FAILURE. After such an error the comm refuses
 * every op with ZERO_INVALID_STATE and may only be destroyed, which never
 * waits for peers. Once the failed call returns, its receive buffers are no
 * longer written (receives are cancelled, or went to an internal temporary),
 * so they may be freed; a late peer's data is dropped. Its send buffers may
 * still be read by a late peer: what that peer receives is then undefined.
 *
 * Ranks that disagree: a collective whose peers passed a different count
 * (or dtype or op kind) fails with ZERO_MISMATCH naming the peer and both
 * sizes wherever the transport can see it (the MPI backend's point-to-point
 * schedules: reduce-scatter, all-gather, all-reduce at 2 ranks or from
 * 32 KiB), never OK with wrong data. With fingerprints on (config
 * .fingerprint or ZERO_COLL_FINGERPRINT=1; MPI and STAGED backends), every
 * collective also exchanges a small record - op, count, dtype, reduction op
 * or root, group, sequence number on the comm, label - beside its data, so
 * any disagreement (a skipped or extra op, another count or dtype, modules
 * gathered in another order) fails with ZERO_MISMATCH naming both calls:
 * "rank 1 (world 1): allgather of 64 x f32 as op #17 ('b'); rank 0
 * (world 0): allgather of 32 x f32 as op #17 ('a')"; the op's data moves
 * only once the records agree. A rank whose comm failed also tells its
 * peers: a late peer's op in flight (or its next one) fails at once with
 * ZERO_PEER_FAILURE naming it. Without fingerprints a late rank may return
 * OK from an op its peers gave up, and times out on its next one. NCCL comms
 * do not check fingerprints.
 *
 * Streams: by default every blocking call completes before it returns (the
 * host waits). With zero_comm_set_stream (below) the blocking calls are
 * stream-ordered instead, like NCCL's: enqueued on a device stream, waiting
 * for the work before them on it, observed by the work after them.
 *
 * Thread safety: a comm may be used by one thread at a time; different comms
 * from different threads when MPI provides MPI_THREAD_MULTIPLE (libzero asks
 * for it when it initialises MPI). A stream-ordered op may run on its
 * stream's worker thread (the asynchronous CPU device), so stream-ordered
 * MPI comms need MPI_THREAD_MULTIPLE too. */
#ifndef ZERO_COMM_H
#define ZERO_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <zero/device.h> /* zero_stream: stream-ordered collectives */
#include <zero/dtype.h>
#include <zero/export.h>
#include <zero/status.h>

ZERO_EXTERN_C_BEGIN

typedef struct zero_comm zero_comm;
typedef struct zero_request zero_request;

typedef enum zero_backend {
    ZERO_BACKEND_AUTO = 0,   /* MPI if built with it and more than one rank, else LOCAL */
    ZERO_BACKEND_MPI = 1,
    ZERO_BACKEND_NCCL = 2,
    ZERO_BACKEND_STAGED = 3,
    ZERO_BACKEND_LOCAL = 4,
} zero_backend;

typedef enum zero_redop {
    ZERO_SUM = 0,
    ZERO_MAX = 1,
} zero_redop;

/* Op kinds, for the byte counters. */
typedef enum zero_op_kind {
    ZERO_OP_ALLREDUCE = 0,
    ZERO_OP_REDUCE_SCATTER = 1,
    ZERO_OP_ALLGATHER = 2,
    ZERO_OP_BROADCAST = 3,
    ZERO_OP_SEND = 4,
    ZERO_OP_RECV = 5,
    ZERO_OP_BARRIER = 6,
    ZERO_OP_ALLTOALL = 7,
    ZERO_OP_ALLTOALLV = 8,
    ZERO_OP_KIND_COUNT = 9,
} zero_op_kind;

/* Versioned config: initialise with ZERO_COMM_CONFIG_INIT, then set fields.
 * New fields are only ever appended, each batch a new version; a program
 * built against an older header passes its older version and the fields it
 * lacks take their defaults (docs/abi.md). Versions:
 *   1  backend, device, timeout_s
 *   2  + fingerprint */
typedef struct zero_comm_config {
    size_t size;            /* sizeof(zero_comm_config), set by the INIT macro */
    uint32_t version;       /* ZERO_COMM_CONFIG_VERSION */
    zero_backend backend;
    int device;             /* CUDA device ordinal for NCCL/STAGED; -1 = pick by local rank */
    double timeout_s;       /* deadline of every blocking op and wait; > 0 */
    /* Check every collective's fingerprint across the group (see "Ranks that
     * disagree" above): 1 on, 0 off, -1 (the default) on when the environment
     * variable ZERO_COLL_FINGERPRINT is set and not "0". Every rank must
     * choose the same; splits inherit it. MPI and STAGED backends. */
    int fingerprint;
} zero_comm_config;

#define ZERO_COMM_CONFIG_VERSION 2u
#define ZERO_COMM_CONFIG_INIT \
    { sizeof(zero_comm_config), ZERO_COMM_CONFIG_VERSION, ZERO_BACKEND_AUTO, -1, 60.0, -1 }

/* The world group. Calls MPI_Init_thread only if MPI is not yet initialized
 * (MPI_Init has no deadline: it waits for the launcher to start every rank;
 * libzero then sets MPI_ERRORS_RETURN on MPI_COMM_WORLD, where Open MPI
 * raises errors of its non-blocking collectives),
 * and in that case MPI_Finalize runs when the last comm descending from such
 * a world (the worlds and their splits) is destroyed; MPI cannot be
 * initialised twice, so init_world after that is ZERO_INVALID_STATE. With
 * ZERO_BACKEND_AUTO and a single rank the comm is LOCAL (MPI still
 * initialised, so mpirun sees a proper MPI process). Creating the world is
 * collective and has the config's deadline. `config` may be NULL for the
 * defaults. */
ZERO_API zero_status zero_comm_create_world(zero_comm **out, const zero_comm_config *config);

/* Like MPI_Comm_split: ranks with the same color (>= 0) form a group, ordered
 * by key (ties by parent rank). Collective over `parent`, with its deadline
 * on each of two polled rounds before MPI_Comm_split is entered (see
 * docs/collectives.md for the one narrow case that can still block);
 * no request may be outstanding on `parent`. The child inherits the parent's
 * backend, device and timeout, is named "<parent>/split(<color>)", and may
 * outlive the parent. */
ZERO_API zero_status zero_comm_split(zero_comm *parent, int color, int key, zero_comm **out);

/* NULL is accepted. Pending requests must be waited on before (a comm
 * destroyed with requests outstanding is treated like a failed one: each
 * request is given up, and zero_wait on it later returns ZERO_INVALID_STATE
 * and frees it). Local: never waits for other ranks.
 * A destroyed comm's handle is recognised afterwards (best effort: the last
 * 1024 destroyed comms and engines): a second destroy is ignored (a warning
 * through the log handler), ops and setters return ZERO_INVALID_STATE
 * ("... was destroyed"), accessors answer as for NULL, and an engine still
 * using it fails its next call with ZERO_INVALID_STATE naming its dp comm.
 * Destroy engines before their comms. */
ZERO_API void zero_comm_destroy(zero_comm *comm);

ZERO_API int zero_comm_get_rank(const zero_comm *comm);
ZERO_API int zero_comm_get_size(const zero_comm *comm);
ZERO_API zero_backend zero_comm_get_backend(const zero_comm *comm);
/* The rank of this process in the world group the comm descends from. */
ZERO_API int zero_comm_get_world_rank(const zero_comm *comm);
/* Change the deadline (seconds, > 0) for later ops on this comm. */
ZERO_API zero_status zero_comm_set_timeout(zero_comm *comm, double timeout_s);
/* The message of the last failed call on this comm; never NULL. */
ZERO_API const char *zero_comm_last_error(const zero_comm *comm);
/* The deadline in seconds currently applied to this comm's ops. */
ZERO_API double zero_comm_get_timeout(const zero_comm *comm);
/* The world rank of group member `rank`; -1 when out of range. */
ZERO_API int zero_comm_get_world_rank_of(const zero_comm *comm, int rank);
/* The group's name as error messages show it: "world", "world/split(1)",
 * "tp", "dp", "pp", or what zero_comm_set_name gave it (1..63 characters). */
ZERO_API const char *zero_comm_get_name(const zero_comm *comm);
ZERO_API zero_status zero_comm_set_name(zero_comm *comm, const char *name);
/* Label the collectives issued on this comm from now on (until changed;
 * NULL or "" clears it; up to 31 characters are kept). With fingerprints on,
 * ranks whose labels differ for the same op get ZERO_MISMATCH, and mismatch
 * messages show the labels: the engine labels each stage-3 gather with its
 * module's name, so modules gathered in different orders are caught. */
ZERO_API zero_status zero_comm_set_label(zero_comm *comm, const char *label);

/* -------------------------------------------------------------- grid */

/* Megatron's rank order: tp varies fastest, then dp, then pp:
 *   world_rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank.
 * world size must equal dp * tp * pp. Destroy with zero_grid_destroy. */
typedef struct zero_grid {
    int tp_size, dp_size, pp_size;
    int tp_rank, dp_rank, pp_rank;
    zero_comm *tp; /* ranks that differ only in tp_rank */
    zero_comm *dp; /* ranks that differ only in dp_rank */
    zero_comm *pp; /* ranks that differ only in pp_rank */
} zero_grid;

ZERO_API zero_status zero_grid_create(zero_comm *world, int tp_size, int pp_size, zero_grid *out);
/* Destroys the three comms; NULL and a zeroed grid are accepted. */
ZERO_API void zero_grid_destroy(zero_grid *grid);

/* -------------------------------------------------------------- ops
 * count is in elements of dtype. For reduce-scatter `count` is the size of
 * each rank's chunk (recv holds count, send holds count*size); for
 * all-gather `count` is each rank's contribution. */

ZERO_API zero_status zero_allreduce(zero_comm *comm, const void *send, void *recv, size_t count,
                                    zero_dtype dtype, zero_redop op);
ZERO_API zero_status zero_reduce_scatter(zero_comm *comm, const void *send, void *recv, size_t count,
                                         zero_dtype dtype, zero_redop op);
ZERO_API zero_status zero_allgather(zero_comm *comm, const void *send, void *recv, size_t count,
                                    zero_dtype dtype);
ZERO_API zero_status zero_broadcast(zero_comm *comm, const void *send, void *recv, size_t count,
                                    zero_dtype dtype, int root);
ZERO_API zero_status zero_send(zero_comm *comm, const void *buf, size_t count, zero_dtype dtype, int peer);
ZERO_API zero_status zero_recv(zero_comm *comm, void *buf, size_t count, zero_dtype dtype, int peer);
ZERO_API zero_status zero_barrier(zero_comm *comm);

/* All-to-all: send holds `size` chunks of `count` elements, chunk j going to
 * group rank j; recv receives `size` chunks, chunk i from rank i (as
 * MPI_Alltoall). Never in place: any overlap of send and recv is
 * ZERO_INVALID_ARGUMENT. */
ZERO_API zero_status zero_alltoall(zero_comm *comm, const void *send, void *recv, size_t count, zero_dtype dtype);

/* All-to-all with uneven chunks (as MPI_Alltoallv; counts and displacements
 * in elements, arrays of the group's size): send_counts[j] elements at
 * send + send_displs[j] go to rank j, recv_counts[i] elements from rank i
 * land at recv + recv_displs[i]. A NULL displacement array means the chunks
 * are packed in rank order (displs[j] = counts[0] + ... + counts[j-1]). The
 * arrays are copied when the op is issued: the caller may reuse them at once,
 * also for the async form. Rank i's send_counts[j] must equal rank j's
 * recv_counts[i] (send_counts[rank] == recv_counts[rank] is checked at the
 * call); ranks that disagree get ZERO_MISMATCH naming the peer and both
 * counts (from the fingerprints, or from the arriving message size without
 * them). Zero counts are valid; every rank takes part even when all its
 * counts are zero. Never in place; parts of recv outside the chunks are left
 * untouched. */
ZERO_API zero_status zero_alltoallv(zero_comm *comm, const void *send, const size_t *send_counts,
                                    const size_t *send_displs, void *recv, const size_t *recv_counts,
                                    const size_t *recv_displs, zero_dtype dtype);

/* Asynchronous forms: the op is issued and *req receives a request that must
 * be completed with zero_wait (or observed done by zero_test, then freed by
 * zero_wait). Buffers must stay untouched until then. */
ZERO_API zero_status zero_allreduce_async(zero_comm *comm, const void *send, void *recv, size_t count,
                                          zero_dtype dtype, zero_redop op, zero_request **req);
ZERO_API zero_status zero_reduce_scatter_async(zero_comm *comm, const void *send, void *recv, size_t count,
                                               zero_dtype dtype, zero_redop op, zero_request **req);
ZERO_API zero_status zero_allgather_async(zero_comm *comm, const void *send, void *recv, size_t count,
                                          zero_dtype dtype, zero_request **req);
ZERO_API zero_status zero_broadcast_async(zero_comm *comm, const void *send, void *recv, size_t count,
                                          zero_dtype dtype, int root, zero_request **req);

ZERO_API zero_status zero_alltoall_async(zero_comm *comm, const void *send, void *recv, size_t count,
                                         zero_dtype dtype, zero_request **req);
ZERO_API zero_status zero_alltoallv_async(zero_comm *comm, const void *send, const size_t *send_counts,
                                          const size_t *send_displs, void *recv, const size_t *recv_counts,
                                          const size_t *recv_displs, zero_dtype dtype, zero_request **req);

/* Point-to-point, asynchronous: complete with zero_wait like the others.
 * Messages between two ranks of a comm arrive in the order they were sent. */
ZERO_API zero_status zero_send_async(zero_comm *comm, const void *buf, size_t count, zero_dtype dtype, int peer,
                                     zero_request **req);
ZERO_API zero_status zero_recv_async(zero_comm *comm, void *buf, size_t count, zero_dtype dtype, int peer,
                                     zero_request **req);

/* Wait until done or the comm's deadline passes; frees the request in every
 * case (NULL is a no-op returning ZERO_OK). */
ZERO_API zero_status zero_wait(zero_request *req);
/* Non-blocking check: *done = 1 when complete. Does not free. */
ZERO_API zero_status zero_test(zero_request *req, int *done);

/* -------------------------------------------------------------- groups
 * Ops issued between zero_comm_group_begin(comm) and zero_comm_group_end(comm)
 * are issued together and completed together, like NCCL's
 * ncclGroupStart/End: a rank may post its sends before its receives (a ring
 * exchange, a pipeline's activation forward and gradient back) without the
 * deadlock that blocking calls reach once a message is too large for the
 * transport to buffer.
 *   - Inside a group a BLOCKING call (zero_send, zero_recv, zero_allreduce,
 *     ...) only issues its op and returns ZERO_OK (or the error of issuing
 *     it: bad arguments, a failed comm); its buffers must stay untouched
 *     until zero_comm_group_end returns, which completes it. An
 *     ASYNCHRONOUS call returns its request as usual; it may not be waited or
 *     tested before the group ends (ZERO_INVALID_STATE, the request stays
 *     valid) and is completed by zero_wait after.
 *   - zero_comm_group_end waits for the group's blocking-form ops with the
 *     comm's deadline, counted from the call, for all of them together. On
 *     timeout: ZERO_TIMEOUT naming the ops not complete and their peers
 *     ("group of 2 op(s) on group pp(size 2) rank 0 (world 0): timed out
 *     after 1.0 s; not complete: send of 262144 x f32 to peer rank 1
 *     (world 1)"); the comm has failed (see Deadlines above). A group with no
 *     op is valid and does nothing.
 *   - Groups nest (begin/end counted); only the outermost end completes.
 *     zero_comm_group_end without an open group is ZERO_INVALID_STATE.
 *     A comm destroyed with a group open abandons its ops.
 *   - A group belongs to one comm. On NCCL it maps to ncclGroupStart/End,
 *     which NCCL applies per thread: ops on other NCCL comms issued by this
 *     thread inside the group are fused into the same NCCL group.
 *   - MPI and STAGED: every op of the group is a non-blocking request;
 *     LOCAL: every op completes when issued. Fingerprints (if on) are checked
 *     for collectives in a group as anywhere else. */
ZERO_API zero_status zero_comm_group_begin(zero_comm *comm);
ZERO_API zero_status zero_comm_group_end(zero_comm *comm);

/* -------------------------------------------------------------- stream-ordered collectives
 * As nccl.h's collectives on a cudaStream_t. After zero_comm_set_stream(comm,
 * s), every BLOCKING call on comm (zero_allreduce, zero_reduce_scatter,
 * zero_allgather, zero_broadcast, zero_alltoall(v), zero_send, zero_recv,
 * zero_barrier) is an op enqueued on stream s:
 *   - Order: it starts after the work queued on s before the call (a
 *     producer kernel, a copy, a zero_stream_wait_event) and before the work
 *     queued on s after it; a consumer on s, or another stream waiting for an
 *     event recorded on s after the call, sees its results.
 *   - Return: once enqueued. Arguments are checked in the call as always (the
 *     in-place rules above, counts, dtypes, root, peer: the error is returned
 *     and its message is in zero_last_error()). Buffers must stay valid, and be
 *     touched only by work ordered after the op on s, until it completes; an
 *     all-to-all-v's count arrays are copied in the call.
 *   - Where it runs. NCCL: on s's cudaStream_t (s must be a stream of a
 *     CUDA device). MPI and LOCAL (host buffers): as a host function on s - on
 *     the asynchronous CPU device (ZERO_CPU_ASYNC=1) s's worker thread runs it
 *     when it gets there; on the synchronous CPU device it runs in the call
 *     (all work before it has run already). STAGED with a CUDA stream: the
 *     call waits for s (under the comm's deadline) and runs the op before
 *     returning: stream order holds, nothing overlaps.
 *   - Groups: the ops between zero_comm_group_begin and zero_comm_group_end
 *     are enqueued at the end as one unit, issued together and completed
 *     together under one deadline (NCCL: ncclGroupStart/End on s);
 *     zero_comm_group_end then returns once the unit is enqueued.
 *   - Deadlines hold: an op that fails or misses the comm's deadline on the
 *     stream fails the comm exactly as a blocking call would (ZERO_TIMEOUT
 *     naming the op, the group, this rank and the ranks whose part did not
 *     arrive). The ops queued after it on this comm are skipped; the failure
 *     is returned by the next host wait, zero_comm_sync, and every later call
 *     on the comm is refused with ZERO_INVALID_STATE repeating it. Other work
 *     on s still runs, on buffers the failed op may not have written.
 *   - The asynchronous forms (*_async) and zero_comm_split are refused
 *     (ZERO_INVALID_STATE) while a stream is set.
 *   - Threads: one thread at a time calls the comm, as always; the comm's
 *     counters and zero_comm_last_error are current after zero_comm_sync.
 * zero_comm_set_stream(comm, NULL) waits like zero_comm_sync and makes the
 * calls host-blocking again; no asynchronous request may be outstanding and
 * no group open when the stream is set or changed. The stream must outlive
 * its use: until the comm's stream is changed, or zero_comm_destroy, which
 * drops queued ops and waits for a running one (at most its deadline). */
ZERO_API zero_status zero_comm_set_stream(zero_comm *comm, zero_stream *stream);
/* The stream set by zero_comm_set_stream; NULL when none (or comm NULL). */
ZERO_API zero_stream *zero_comm_get_stream(const zero_comm *comm);
/* The host waits until every stream-ordered op issued on comm so far is
 * complete, and returns the first failure among them (ZERO_TIMEOUT naming op
 * and rank, ZERO_PEER_FAILURE, ...). Its deadline is the comm's timeout from
 * the call, extended to the running op's own deadline (plus 1 s); an op its
 * stream never reaches in that time is ZERO_TIMEOUT "... was never reached
 * by its stream", never a hang. ZERO_OK at once without a stream. */
ZERO_API zero_status zero_comm_sync(zero_comm *comm);

/* -------------------------------------------------------------- counters
 * Calls, and bytes this rank sent and received, per op kind, since creation
 * or the last reset; an op counts when it is issued. Bytes are the
 * bandwidth-optimal (ring) volume of each op, which is what ZeRO's
 * communication analysis uses, independent of the algorithm MPI or NCCL
 * picks, in the op's dtype (f16/bf16: 2 bytes an element): for S = bytes of
 * the whole array and n ranks,
 *   all-reduce      sent = recv = floor(2 S (n-1) / n)
 *   reduce-scatter  sent = recv = S (n-1)/n      (S = count*n elements)
 *   all-gather      sent = recv = S (n-1)/n      (S = count*n elements)
 *   broadcast       the root sent S; every other rank received S
 *   send / recv     the message size;
 *   all-to-all      sent = recv = S (n-1)/n      (S = count*n elements sent)
 *   all-to-all-v    sent: the chunks to other ranks; recv: the chunks from them
 *                   (this rank's own chunk is a local copy and not counted).
 * n = 1 counts calls but no bytes; barrier counts calls only. */
/* Room for op kinds added later without changing the struct's size (ABI). */
#define ZERO_OP_KIND_CAPACITY 16

typedef struct zero_comm_counters {
    uint64_t bytes_sent[ZERO_OP_KIND_CAPACITY]; /* [ZERO_OP_KIND_COUNT..] are 0 */
    uint64_t bytes_recv[ZERO_OP_KIND_CAPACITY];
    uint64_t calls[ZERO_OP_KIND_CAPACITY];
} zero_comm_counters;

ZERO_API zero_status zero_comm_get_counters(const zero_comm *comm, zero_comm_counters *out);
ZERO_API void zero_comm_reset_counters(zero_comm *comm);

ZERO_EXTERN_C_END

#endif
