/* Stream-ordered collectives (comm.h "Stream-ordered collectives").
 *
 * zero_comm_set_stream(comm, s) turns the comm's blocking calls into ops
 * enqueued on stream s, like NCCL's collectives on a cudaStream_t: each
 * starts after the work queued on s before it, the call returns once it is
 * enqueued, and later work on s (or an event recorded on s) sees its
 * results. How an op gets onto the stream depends on the transport:
 *   - NCCL: the op is issued on s's cudaStream_t itself; its request stays
 *     with the comm until zero_comm_sync polls it under the deadline.
 *   - MPI, LOCAL, STAGED (host-driven transports): the host call validates
 *     the arguments and queues a host function on s
 *     (zero_stream_enqueue_host_): on the asynchronous CPU device the
 *     stream's worker runs the op when it gets there, on the synchronous
 *     one it runs at once (everything before it already ran), and on a CUDA
 *     stream (STAGED) the call waits for the stream, under the deadline, and
 *     runs it (stream order holds; nothing overlaps).
 * A group (zero_comm_group_begin/end) in this mode is collected on the host
 * and enqueued at its end as one unit, run on the worker as an ordinary
 * group (issued together, completed together, one deadline).
 *
 * Errors: an op that fails or passes its deadline on the stream fails the
 * comm as a host call would (ZERO_TIMEOUT naming the op, the group, the
 * rank and the missing peers); the failure is kept here and returned by the
 * next host wait, zero_comm_sync, and refused by every later call. Ops
 * queued after a failure are skipped. zero_comm_sync's own deadline (the
 * comm's timeout, from the call, extended to the running op's own deadline)
 * names an op the stream never reached.
 *
 * Threads: while ops may run on a worker, the comm's state belongs to that
 * worker; the host side touches only this file's queue (under `q`) and
 * takes `run` (held by the worker around each op) where it must read or
 * write the comm itself. */
#include "comm_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/device_internal.h"
#if ZERO_HAVE_CUDA
#include <zero/zero_cuda.h>
#endif

typedef struct coll_sop coll_sop;
struct coll_sop {
    zero_comm *c;
    int nops;
    int grouped;     /* enqueued by a group's end: run as a group */
    coll_args *ops;  /* nops, validated; all-to-all-v arrays point into vecs */
    size_t **vecs;   /* owned all-to-all-v arrays (NULL entries otherwise) */
    const char **fns;
    double started;  /* 0 until the worker starts it */
    coll_sop *next;  /* the comm's queue */
};

typedef struct coll_stream coll_stream;
struct coll_stream {
    zero_stream *stream;
    void *cuda;              /* NCCL: the cudaStream_t its ops are issued on */
    pthread_mutex_t q;       /* guards the queue and the error below */
    pthread_mutex_t run;     /* held while an op of the comm runs on the stream */
    uint64_t issued, done;
    coll_sop *head, *tail;   /* queued or running, oldest first */
    zero_status error;       /* the first failure, ZERO_OK while none */
    char msg[ZERO_ERRMSG_MAX];
    coll_sop *batch;         /* host backends: the open group's ops */
    int host_depth;          /* host backends: group_begin calls not yet ended */
    zero_request *nccl_head; /* NCCL: issued, not yet synced (via group_next) */
    zero_event *ev;          /* waiting for a CUDA stream (STAGED) */
};

static _Thread_local int on_stream_worker;

int coll_stream_mode(const zero_comm *c) { return c->sstream && !on_stream_worker; }

void *coll_stream_cuda(const zero_comm *c) { return c->sstream ? c->sstream->cuda : NULL; }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sop_free(coll_sop *op)
{
    if (!op) return;
    for (int i = 0; i < op->nops; i++) free(op->vecs[i]);
    free(op->vecs);
    free(op->ops);
    free(op->fns);
    free(op);
}

static zero_status sop_append(zero_comm *c, coll_sop **op, const coll_args *a, size_t *vec, const char *fn)
{
    coll_sop *o = *op;
    if (!o) {
        if (!(o = calloc(1, sizeof *o))) return ZERO_OUT_OF_MEMORY;
        o->c = c;
        *op = o;
    }
    coll_args *ops = realloc(o->ops, (size_t)(o->nops + 1) * sizeof *ops);
    if (ops) o->ops = ops;
    size_t **vecs = realloc(o->vecs, (size_t)(o->nops + 1) * sizeof *vecs);
    if (vecs) o->vecs = vecs;
    const char **fns = realloc(o->fns, (size_t)(o->nops + 1) * sizeof *fns);
    if (fns) o->fns = fns;
    if (!ops || !vecs || !fns) return ZERO_OUT_OF_MEMORY;
    coll_args k = *a;
    if (vec) { /* the worker validates again: from our copy, not the caller's arrays */
        size_t n = (size_t)c->size;
        for (int j = 0; j < 4; j++) k.user_v[j] = vec + (size_t)j * n;
        k.v = NULL;
        k.count = 0;
    }
    o->ops[o->nops] = k;
    o->vecs[o->nops] = vec;
    o->fns[o->nops] = fn;
    o->nops++;
    return ZERO_OK;
}

/* The first failure wins; later ones keep it. */
static void record_error(coll_stream *s, zero_status st, const char *msg)
{
    pthread_mutex_lock(&s->q);
    if (s->error == ZERO_OK) {
        s->error = st;
        snprintf(s->msg, sizeof s->msg, "%s", msg);
    }
    pthread_mutex_unlock(&s->q);
}

/* ---------------------------------------------------------------- the worker's side */

static void exec_sop(void *arg)
{
    coll_sop *op = arg;
    zero_comm *c = op->c;
    coll_stream *s = c->sstream;
    on_stream_worker = 1;
    pthread_mutex_lock(&s->run);
    pthread_mutex_lock(&s->q);
    op->started = now_s();
    const int skip = s->error != ZERO_OK;
    pthread_mutex_unlock(&s->q);
    zero_status st = ZERO_OK;
    if (!skip) {
        if (op->grouped) st = zero_comm_group_begin(c);
        for (int i = 0; st == ZERO_OK && i < op->nops; i++) st = coll_run_blocking(c, &op->ops[i], op->fns[i]);
        if (op->grouped && st == ZERO_OK) st = zero_comm_group_end(c);
        else if (op->grouped && c->group_depth > 0) (void)zero_comm_group_end(c); /* abandons the rest */
        if (st != ZERO_OK) record_error(s, st, c->err.msg);
    }
    /* Done while still holding `run`: a host that saw it done and then took
     * `run` knows this thread is out of the comm for good. */
    pthread_mutex_lock(&s->q);
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->done++;
    pthread_mutex_unlock(&s->q);
    pthread_mutex_unlock(&s->run);
    on_stream_worker = 0;
    sop_free(op);
}

/* ---------------------------------------------------------------- the host's side */

/* Poll `ev` (recorded on the stream) until done or `timeout_s`. */
static zero_status wait_event(zero_event *ev, double timeout_s)
{
    const double t0 = now_s();
    for (long polls = 0;; polls++) {
        int done = 0;
        ZERO_TRY(zero_event_query(ev, &done));
        if (done) return ZERO_OK;
        if (now_s() - t0 > timeout_s) return ZERO_TIMEOUT;
        if (polls < 100) {
            sched_yield();
        } else {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
}

static zero_status submit(zero_comm *c, coll_sop *op)
{
    coll_stream *s = c->sstream;
    pthread_mutex_lock(&s->q);
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    s->issued++;
    pthread_mutex_unlock(&s->q);
    zero_status st = zero_stream_enqueue_host_(s->stream, exec_sop, op);
    if (st == ZERO_OK) return ZERO_OK;
    if (st == ZERO_UNSUPPORTED) {
        /* A CUDA stream: wait for the work before the op, then run it here. */
        if (!s->ev) st = zero_event_create(s->stream->dev, &s->ev);
        else st = ZERO_OK;
        if (st == ZERO_OK) st = zero_event_record(s->ev, s->stream);
        if (st == ZERO_OK) st = wait_event(s->ev, c->timeout_s);
        if (st == ZERO_OK) {
            exec_sop(op);
            return ZERO_OK;
        }
        if (st == ZERO_TIMEOUT) {
            char what[96];
            coll_describe(&op->ops[0], what, sizeof what);
            char msg[ZERO_ERRMSG_MAX];
            snprintf(msg, sizeof msg,
                     "%s on group %s(size %d) rank %d (world %d): its stream did not finish the work queued before "
                     "it within %.1f s",
                     what, c->name, c->size, c->rank, c->world_ranks[c->rank], c->timeout_s);
            record_error(s, ZERO_TIMEOUT, msg);
        }
    }
    /* Not queued: take it back. It is the tail (the host queues alone). */
    pthread_mutex_lock(&s->q);
    coll_sop *prev = NULL;
    for (coll_sop *o = s->head; o && o != op; o = o->next) prev = o;
    if (prev) prev->next = NULL;
    else s->head = NULL;
    s->tail = prev;
    s->issued--;
    pthread_mutex_unlock(&s->q);
    sop_free(op);
    return zero_fail(NULL, st, "stream-ordered op on group %s(size %d) rank %d: could not be queued on its stream: %s",
                     c->name, c->size, c->rank, zero_last_error());
}

/* Refuse a call on a comm whose stream-ordered ops failed. */
static zero_status check_failed(zero_comm *c, const char *fn)
{
    coll_stream *s = c->sstream;
    pthread_mutex_lock(&s->q);
    zero_status st = s->error;
    char msg[ZERO_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", s->msg);
    pthread_mutex_unlock(&s->q);
    if (st == ZERO_OK) return ZERO_OK;
    return zero_fail(NULL, ZERO_INVALID_STATE,
                     "%s on group %s(size %d) rank %d: the group failed earlier (%s: %s); only zero_comm_destroy is "
                     "allowed",
                     fn, c->name, c->size, c->rank, zero_status_name(st), msg);
}

zero_status coll_stream_issue(zero_comm *c, coll_args *a, const char *fn)
{
    coll_stream *s = c->sstream;
    ZERO_TRY(check_failed(c, fn));
    if (c->backend == ZERO_BACKEND_NCCL) {
        /* Issued on the stream itself (backend_nccl.c picks coll_stream_cuda). */
        zero_request *req = NULL;
        ZERO_TRY(coll_run_async(c, a, fn, &req));
        if (c->group_depth > 0) { /* completed - handed to the stream list - at the group's end */
            req->grouped = COLL_GROUPED_OWNED;
            return ZERO_OK;
        }
        req->group_next = s->nccl_head;
        s->nccl_head = req;
        return ZERO_OK;
    }
    /* Validate here, so a bad call fails at once; the worker's state is
     * not touched (messages go to this thread's zero_last_error()). */
    size_t *vec = NULL;
    ZERO_TRY(coll_validate_detached(c, a, fn, &vec));
    coll_sop *op = NULL;
    zero_status st = sop_append(c, s->host_depth > 0 ? &s->batch : &op, a, vec, fn);
    if (st != ZERO_OK) {
        if (!op || op->nops == 0 || op->vecs[op->nops - 1] != vec) free(vec);
        sop_free(op);
        return zero_fail(NULL, st, "%s on group %s: out of memory", fn, c->name);
    }
    if (s->host_depth > 0) return ZERO_OK;
    return submit(c, op);
}

int coll_stream_group_begin(zero_comm *c)
{
    if (!coll_stream_mode(c) || c->backend == ZERO_BACKEND_NCCL) return 0;
    c->sstream->host_depth++;
    return 1;
}

int coll_stream_group_end(zero_comm *c, zero_status *st)
{
    if (!coll_stream_mode(c) || c->backend == ZERO_BACKEND_NCCL) return 0;
    coll_stream *s = c->sstream;
    *st = ZERO_OK;
    if (s->host_depth == 0) {
        *st = zero_fail(NULL, ZERO_INVALID_STATE,
                        "zero_comm_group_end on group %s(size %d) rank %d: no group is open", c->name, c->size,
                        c->rank);
        return 1;
    }
    if (--s->host_depth > 0) return 1;
    coll_sop *op = s->batch;
    s->batch = NULL;
    if (!op) return 1; /* an empty group does nothing */
    op->grouped = 1;
    if ((*st = check_failed(c, "zero_comm_group_end")) != ZERO_OK) {
        sop_free(op);
        return 1;
    }
    *st = submit(c, op);
    return 1;
}

/* NCCL: a group's own requests outlive its end (the stream completes them). */
void coll_stream_keep_group(zero_comm *c)
{
    coll_stream *s = c->sstream;
    zero_request *r = c->group_head;
    coll_group_forget(c);
    while (r) {
        zero_request *next = r->group_next;
        const int owned = r->grouped == COLL_GROUPED_OWNED;
        r->grouped = 0;
        r->group_next = NULL;
        if (owned) {
            r->group_next = s->nccl_head;
            s->nccl_head = r;
        }
        r = next;
    }
}

/* ---------------------------------------------------------------- sync, set, destroy */

/* Wait for every op queued so far. *stuck: the deadline passed with an op
 * still queued or running (its description in msg). */
static zero_status drain(zero_comm *c, char *msg, size_t len)
{
    coll_stream *s = c->sstream;
    zero_status st = ZERO_OK;
    for (zero_request *r = s->nccl_head; r;) { /* NCCL: poll each under the deadline */
        zero_request *next = r->group_next;
        r->group_next = NULL;
        zero_status w = zero_wait(r);
        if (st == ZERO_OK && w != ZERO_OK) {
            st = w;
            snprintf(msg, len, "%s", c->err.msg);
        }
        r = next;
    }
    s->nccl_head = NULL;
    if (st != ZERO_OK) record_error(s, st, msg);
    const double t0 = now_s();
    for (long polls = 0;; polls++) {
        pthread_mutex_lock(&s->q);
        const int idle = s->done == s->issued;
        const double started = s->head ? s->head->started : 0;
        char what[96] = "";
        if (s->head) coll_describe(&s->head->ops[0], what, sizeof what);
        pthread_mutex_unlock(&s->q);
        if (idle) break;
        /* A running op has its own deadline: give it that, plus a second. */
        double limit = c->timeout_s;
        if (started > 0 && started + c->timeout_s + 1.0 - t0 > limit) limit = started + c->timeout_s + 1.0 - t0;
        const double waited = now_s() - t0;
        if (waited > limit) {
            snprintf(msg, len,
                     "zero_comm_sync on group %s(size %d) rank %d (world %d): timed out after %.1f s; %s %s",
                     c->name, c->size, c->rank, c->world_ranks[c->rank], waited, what,
                     started > 0 ? "has not completed" : "was never reached by its stream (the work queued before it "
                                                         "did not finish)");
            record_error(s, ZERO_TIMEOUT, msg);
            return ZERO_TIMEOUT;
        }
        if (polls < 100) {
            sched_yield();
        } else {
            struct timespec ts = {0, 500000};
            nanosleep(&ts, NULL);
        }
    }
    pthread_mutex_lock(&s->q);
    st = s->error;
    snprintf(msg, len, "%s", s->msg);
    pthread_mutex_unlock(&s->q);
    return st;
}

zero_status zero_comm_sync(zero_comm *comm)
{
    ZERO_TRY(coll_comm_check(comm, "zero_comm_sync"));
    if (!comm->sstream) return ZERO_OK; /* every op completed in its call */
    char msg[ZERO_ERRMSG_MAX] = "";
    zero_status st = drain(comm, msg, sizeof msg);
    if (st == ZERO_OK) return ZERO_OK;
    pthread_mutex_lock(&comm->sstream->q);
    const int idle = comm->sstream->done == comm->sstream->issued;
    pthread_mutex_unlock(&comm->sstream->q);
    if (idle) {
        /* Nothing runs on the worker now: the comm is the host's again. */
        pthread_mutex_lock(&comm->sstream->run);
        zero_fail(&comm->err, st, "%s", msg);
        if (comm->failed == ZERO_OK) comm->failed = st;
        pthread_mutex_unlock(&comm->sstream->run);
    }
    return zero_fail(NULL, st, "%s", msg);
}

/* Every op done: wait for the worker to leave `run`, then free. */
static void stream_free(coll_stream *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->run);
    pthread_mutex_unlock(&s->run);
    sop_free(s->batch);
    zero_event_destroy(s->ev);
    pthread_mutex_destroy(&s->q);
    pthread_mutex_destroy(&s->run);
    free(s);
}

zero_status zero_comm_set_stream(zero_comm *comm, zero_stream *stream)
{
    static const char fn[] = "zero_comm_set_stream";
    ZERO_TRY(coll_comm_check(comm, fn));
    zero_comm *c = comm;
    if (c->sstream && (c->sstream->host_depth > 0 || c->group_depth > 0))
        return zero_fail(&c->err, ZERO_INVALID_STATE, "%s on group %s: a group is open; end it first", fn, c->name);
    if (c->sstream) { /* the old stream's ops first */
        ZERO_TRY(zero_comm_sync(c));
        if (c->sstream->stream == stream) return ZERO_OK;
        stream_free(c->sstream);
        c->sstream = NULL;
    }
    if (!stream) return ZERO_OK;
    if (c->failed != ZERO_OK)
        return zero_fail(&c->err, ZERO_INVALID_STATE, "%s on group %s(size %d) rank %d: the group failed earlier (%s)",
                         fn, c->name, c->size, c->rank, coll_failed_cause(c));
    if (c->outstanding > 0 || c->group_depth > 0)
        return zero_fail(&c->err, ZERO_INVALID_STATE,
                         "%s on group %s: %d request(s) outstanding or a group open; complete them first", fn, c->name,
                         c->outstanding);
    void *cuda = NULL;
    if (c->backend == ZERO_BACKEND_NCCL) {
#if ZERO_HAVE_CUDA
        if (stream->dev->kind == ZERO_DEVICE_CUDA) cuda = (void *)zero_stream_get_cuda(stream);
#endif
        if (!cuda)
            return zero_fail(&c->err, ZERO_INVALID_ARGUMENT,
                             "%s on group %s: an NCCL comm needs a stream of a CUDA device", fn, c->name);
    }
    coll_stream *s = calloc(1, sizeof *s);
    if (!s) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", fn);
    pthread_mutex_init(&s->q, NULL);
    pthread_mutex_init(&s->run, NULL);
    s->stream = stream;
    s->cuda = cuda;
    c->sstream = s;
    return ZERO_OK;
}

zero_stream *zero_comm_get_stream(const zero_comm *comm)
{
    return coll_comm_live(comm) && comm->sstream ? comm->sstream->stream : NULL;
}

int coll_stream_release(zero_comm *c)
{
    coll_stream *s = c->sstream;
    if (!s) return 1;
    /* Queued ops are skipped from now on; the running one ends by its deadline. */
    record_error(s, ZERO_INVALID_STATE, "the comm was destroyed with stream-ordered ops queued");
    char msg[ZERO_ERRMSG_MAX];
    zero_status st = drain(c, msg, sizeof msg);
    pthread_mutex_lock(&s->q);
    const int running = s->done != s->issued;
    pthread_mutex_unlock(&s->q);
    if (st == ZERO_TIMEOUT && running) return 0; /* still running: keep the comm's memory */
    c->sstream = NULL;
    stream_free(s);
    return 1;
}

const char *coll_stream_error_msg(const zero_comm *c)
{
    coll_stream *s = c->sstream;
    if (!s) return NULL;
    pthread_mutex_lock(&s->q);
    const char *m = s->error != ZERO_OK ? s->msg : NULL;
    pthread_mutex_unlock(&s->q);
    return m;
}
