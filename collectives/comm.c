/* Process groups: the world, split, accessors, names and byte counters.
 * Backends do the transport; this file only owns the zero_comm object. */
#include "comm_internal.h"
#include "common/versioned.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

const char *coll_op_name(zero_op_kind kind)
{
    switch (kind) {
    case ZERO_OP_ALLREDUCE: return "allreduce";
    case ZERO_OP_REDUCE_SCATTER: return "reduce_scatter";
    case ZERO_OP_ALLGATHER: return "allgather";
    case ZERO_OP_BROADCAST: return "broadcast";
    case ZERO_OP_SEND: return "send";
    case ZERO_OP_RECV: return "recv";
    case ZERO_OP_BARRIER: return "barrier";
    case ZERO_OP_ALLTOALL: return "alltoall";
    case ZERO_OP_ALLTOALLV: return "alltoallv";
    case ZERO_OP_KIND_COUNT: break;
    }
    return "op";
}

void coll_describe(const coll_args *a, char *buf, size_t len)
{
    if (a->kind == ZERO_OP_BARRIER)
        snprintf(buf, len, "barrier");
    else
        snprintf(buf, len, "%s of %zu x %s", coll_op_name(a->kind), a->count, zero_dtype_name(a->dtype));
}

void coll_format_subset(const zero_comm *c, const unsigned char *in, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->size && used + 1 < len;) {
        if (!in[i]) {
            i++;
            continue;
        }
        int j = i;
        while (j + 1 < c->size && in[j + 1] && c->world_ranks[j + 1] == c->world_ranks[j] + 1) j++;
        int w = (j > i)
                    ? snprintf(buf + used, len - used, "%s%d-%d", used ? "," : "", c->world_ranks[i],
                               c->world_ranks[j])
                    : snprintf(buf + used, len - used, "%s%d", used ? "," : "", c->world_ranks[i]);
        if (w < 0) break;
        used += (size_t)w;
        i = j + 1;
    }
    if (used >= len && len > 4) strcpy(buf + len - 4, "...");
}

void coll_format_ranks(const zero_comm *c, int skip, char *buf, size_t len)
{
    /* World ranks of a split group are increasing in most layouts but not
     * always (keys may reorder); ranges are only merged where consecutive. */
    unsigned char *in = malloc((size_t)c->size);
    if (!in) {
        snprintf(buf, len, "(%d ranks)", c->size);
        return;
    }
    memset(in, 1, (size_t)c->size);
    if (skip >= 0 && skip < c->size) in[skip] = 0;
    coll_format_subset(c, in, buf, len);
    free(in);
}

void coll_comm_mark_failed(zero_comm *c, zero_status status)
{
    if (c->failed != ZERO_OK) return;
    c->failed = status;
    snprintf(c->failed_cause, sizeof c->failed_cause, "%s: %.200s", zero_status_name(status), c->err.msg);
    if (c->be && c->be->failed) c->be->failed(c);
}

const char *coll_failed_cause(const zero_comm *c)
{
    return c->failed_cause[0] ? c->failed_cause : zero_status_name(c->failed);
}

zero_status coll_comm_fail(zero_comm *c, zero_status status, const char *fmt, ...)
{
    char msg[ZERO_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    zero_status st = zero_fail(&c->err, status, "%s", msg);
    coll_comm_mark_failed(c, status); /* after the message: the peers are told it */
    return st;
}

zero_status coll_comm_check(const zero_comm *c, const char *fn)
{
    if (!c) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "%s: comm is NULL", fn);
    if (c->magic == ZERO_HANDLE_DEAD)
        return zero_fail(NULL, ZERO_INVALID_STATE,
                         "%s: comm %p (group %s) was destroyed by zero_comm_destroy; the handle is stale", fn,
                         (const void *)c, c->name);
    if (c->magic != ZERO_HANDLE_COMM)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "%s: %p is not a zero_comm", fn, (const void *)c);
    return ZERO_OK;
}

zero_status coll_comm_set_members(zero_comm *c, int rank, int size)
{
    int *wr = calloc((size_t)size, sizeof *wr);
    if (!wr) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "comm %s: no memory for %d ranks", c->name, size);
    free(c->world_ranks);
    c->world_ranks = wr;
    c->rank = rank;
    c->size = size;
    return ZERO_OK;
}

/* ZERO_COLL_TIMEOUT_S=S (a positive number): no comm waits longer than S
 * seconds, whatever its config or zero_comm_set_timeout asked. A harness's way
 * to turn any hang into a named ZERO_TIMEOUT quickly (tests/gpu/run_gpu_tests.sh
 * sets 30); anything else in the variable is ignored. */
static double timeout_capped(double timeout_s)
{
    const char *v = getenv("ZERO_COLL_TIMEOUT_S");
    if (!v || !*v) return timeout_s;
    char *end;
    double cap = strtod(v, &end);
    if (*end || !(cap > 0)) return timeout_s;
    return timeout_s < cap ? timeout_s : cap;
}

static zero_comm *comm_new(const char *name, double timeout_s, int device)
{
    zero_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->magic = ZERO_HANDLE_COMM;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->timeout_s = timeout_capped(timeout_s);
    c->device = device;
    return c;
}

/* Release everything but the struct, which is retired (handle.h) so a stale
 * pointer is recognised later. */
static void comm_free(zero_comm *c)
{
    free(c->world_ranks);
    c->world_ranks = NULL;
    c->magic = ZERO_HANDLE_DEAD;
    zero_handle_retire(c);
}

/* ---------------------------------------------------------------- world */

uint32_t coll_hash(const void *p, size_t len, uint32_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 16777619u;
    return h;
}

int coll_fingerprint_default(void)
{
    const char *v = getenv("ZERO_COLL_FINGERPRINT");
    return v && *v && strcmp(v, "0") != 0;
}

static const coll_backend *backend_for(zero_backend b)
{
    switch (b) {
    case ZERO_BACKEND_LOCAL: return &coll_backend_local;
#if ZERO_HAVE_MPI
    case ZERO_BACKEND_MPI: return &coll_backend_mpi;
#endif
#if ZERO_HAVE_MPI && ZERO_HAVE_CUDA
    case ZERO_BACKEND_STAGED: return &coll_backend_staged;
#endif
#if ZERO_HAVE_NCCL
    case ZERO_BACKEND_NCCL: return &coll_backend_nccl;
#endif
    default: return NULL;
    }
}

static const char *backend_name(zero_backend b)
{
    switch (b) {
    case ZERO_BACKEND_AUTO: return "auto";
    case ZERO_BACKEND_MPI: return "mpi";
    case ZERO_BACKEND_NCCL: return "nccl";
    case ZERO_BACKEND_STAGED: return "staged";
    case ZERO_BACKEND_LOCAL: return "local";
    }
    return "unknown";
}

/* One row per ZERO_COMM_CONFIG_VERSION (comm.h lists each version's fields). */
static const zero_struct_version comm_config_versions[] = {
    {ZERO_FIELD_END(zero_comm_config, timeout_s), "backend"},
    {ZERO_FIELD_END(zero_comm_config, fingerprint), "fingerprint"},
};
_Static_assert(sizeof comm_config_versions / sizeof *comm_config_versions == ZERO_COMM_CONFIG_VERSION,
               "a new zero_comm_config version needs its row above");
ZERO_ASSERT_LAST_FIELD(zero_comm_config, fingerprint);
static const zero_versioned_type comm_config_type = {"zero_comm_config", "ZERO_COMM_CONFIG_INIT",
                                                     comm_config_versions, ZERO_COMM_CONFIG_VERSION,
                                                     sizeof(zero_comm_config)};

zero_status zero_comm_create_world(zero_comm **out, const zero_comm_config *config)
{
    zero_comm_config cfg;
    const zero_comm_config defaults = ZERO_COMM_CONFIG_INIT;
    memcpy(&cfg, &defaults, sizeof cfg);
    if (!out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_comm_create_world: out is NULL");
    *out = NULL;
    /* A config of an older version: the fields it lacks keep their defaults. */
    if (config)
        ZERO_TRY(zero_versioned_read(NULL, ZERO_INVALID_ARGUMENT, "zero_comm_create_world", &comm_config_type, config,
                                     &cfg));
    if (!(cfg.timeout_s > 0))
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_comm_create_world: timeout_s must be > 0, got %g",
                         cfg.timeout_s);
    if ((unsigned)cfg.backend > ZERO_BACKEND_LOCAL)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_comm_create_world: unknown backend %d",
                         (int)cfg.backend);

    zero_comm *c = comm_new("world", cfg.timeout_s, -1);
    if (!c) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_comm_create_world: out of memory");

    zero_backend b = cfg.backend;
#if ZERO_HAVE_MPI
    if (b != ZERO_BACKEND_LOCAL) {
        /* AUTO needs MPI up to learn the world size; the reference is kept
         * even when the answer is LOCAL so we finalize what we initialised. */
        zero_status st = mpi_env_acquire(&c->err);
        if (st != ZERO_OK) {
            comm_free(c);
            return st;
        }
        c->owns_mpi = 1;
        if (b == ZERO_BACKEND_AUTO) {
            int n = 1;
            MPI_Comm_size(MPI_COMM_WORLD, &n);
            b = n > 1 ? ZERO_BACKEND_MPI : ZERO_BACKEND_LOCAL;
        }
    }
#else
    if (b == ZERO_BACKEND_AUTO) b = ZERO_BACKEND_LOCAL;
#endif
    c->backend = b;
    c->be = backend_for(b);
    c->fingerprint = cfg.fingerprint < 0 ? coll_fingerprint_default() : cfg.fingerprint != 0;
    zero_status st = ZERO_OK;
    if (!c->be) {
        st = zero_fail(&c->err, ZERO_UNSUPPORTED,
                       "zero_comm_create_world: backend %s is not in this build (mpi %d, cuda %d, nccl %d)",
                       backend_name(b), ZERO_HAVE_MPI, ZERO_HAVE_CUDA, ZERO_HAVE_NCCL);
    } else {
        if (b == ZERO_BACKEND_NCCL || b == ZERO_BACKEND_STAGED) c->device = cfg.device;
        st = c->be->init_world(c, &cfg);
    }
    if (st != ZERO_OK) {
        zero_fail_forward(NULL, st, "");
#if ZERO_HAVE_MPI
        if (c->owns_mpi) mpi_env_release();
#endif
        comm_free(c);
        return st;
    }
    *out = c;
    return ZERO_OK;
}

/* ---------------------------------------------------------------- split */

zero_status zero_comm_split(zero_comm *parent, int color, int key, zero_comm **out)
{
    if (!out)
        return zero_fail(coll_comm_live(parent) ? &parent->err : NULL, ZERO_INVALID_ARGUMENT,
                         "zero_comm_split: out is NULL");
    *out = NULL;
    if (!parent) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_comm_split: parent comm is NULL");
    ZERO_TRY(coll_comm_check(parent, "zero_comm_split"));
    if (parent->sstream)
        return zero_fail(NULL, ZERO_INVALID_STATE,
                         "split of group %s(size %d) rank %d: the comm has a stream; zero_comm_set_stream(comm, NULL) "
                         "first (it waits for the stream-ordered ops)",
                         parent->name, parent->size, parent->rank);
    if (parent->failed != ZERO_OK)
        return zero_fail(&parent->err, ZERO_INVALID_STATE,
                         "split of group %s(size %d) rank %d: the group failed earlier (%s); only "
                         "zero_comm_destroy is allowed",
                         parent->name, parent->size, parent->rank, coll_failed_cause(parent));
    if (color < 0)
        return zero_fail(&parent->err, ZERO_INVALID_ARGUMENT,
                         "split of group %s(size %d) rank %d: color must be >= 0, got %d", parent->name,
                         parent->size, parent->rank, color);
    if (parent->outstanding > 0)
        return zero_fail(&parent->err, ZERO_INVALID_STATE,
                         "split of group %s(size %d) rank %d: %d requests are still outstanding; wait first",
                         parent->name, parent->size, parent->rank, parent->outstanding);

    char name[COLL_NAME_MAX];
    snprintf(name, sizeof name, "%.40s/split(%d)", parent->name, color);
    zero_comm *c = comm_new(name, parent->timeout_s, parent->device);
    if (!c) return zero_fail(&parent->err, ZERO_OUT_OF_MEMORY, "split of group %s: out of memory", parent->name);
    c->backend = parent->backend;
    c->be = parent->be;
    c->fingerprint = parent->fingerprint;
    zero_status st = parent->be->split(parent, color, key, c);
    if (st != ZERO_OK) {
        zero_fail_forward(&parent->err, st, "");
        comm_free(c);
        return st;
    }
#if ZERO_HAVE_MPI
    if (parent->owns_mpi) {
        /* A child keeps MPI alive even if the world goes first. */
        mpi_env_acquire(NULL);
        c->owns_mpi = 1;
    }
#endif
    *out = c;
    return ZERO_OK;
}

/* The request outlives its comm: finish it with a failure now (the backend
 * gives up on its transfers) and detach it, so zero_wait/zero_test later
 * only read the request itself. */
static void detach_request(zero_comm *c, zero_request *req)
{
    if (!req->done) {
        c->be->abandon(c, req);
        req->done = 1;
        req->status = ZERO_INVALID_STATE;
    }
    req->comm = NULL;
    req->grouped = 0;
    req->prev = req->next = NULL;
}

void zero_comm_destroy(zero_comm *comm)
{
    if (!comm) return;
    if (comm->magic != ZERO_HANDLE_COMM) {
        /* A second destroy, or not a comm at all: refuse to touch it. */
        zero_fail(NULL, ZERO_INVALID_STATE, "zero_comm_destroy: comm %p %s; ignored", (void *)comm,
                  comm->magic == ZERO_HANDLE_DEAD ? "was already destroyed" : "is not a zero_comm");
        zero_log(ZERO_LOG_WARN, "%s", zero_last_error());
        return;
    }
    if (!coll_stream_release(comm)) {
        /* An op on its stream's worker still runs past every deadline: the
         * memory stays (retired), the handle is dead. */
        zero_log(ZERO_LOG_WARN, "zero_comm_destroy: group %s rank %d: a stream-ordered op is still running; its "
                 "memory is kept", comm->name, comm->rank);
        comm->magic = ZERO_HANDLE_DEAD;
        return;
    }
    if (comm->outstanding > 0) {
        /* Requests still point at the comm and at transport state: treat it
         * like a failure so the backend leaves shared state alone. */
        zero_log(ZERO_LOG_WARN, "zero_comm_destroy: group %s rank %d destroyed with %d outstanding requests",
                 comm->name, comm->rank, comm->outstanding);
        if (comm->failed == ZERO_OK) {
            snprintf(comm->err.msg, sizeof comm->err.msg, "group %s rank %d was destroyed with %d requests outstanding",
                     comm->name, comm->rank, comm->outstanding);
            coll_comm_mark_failed(comm, ZERO_INVALID_STATE);
        }
        coll_group_forget(comm);
        while (comm->pending) {
            zero_request *req = comm->pending;
            comm->pending = req->next;
            int owned = req->grouped == COLL_GROUPED_OWNED; /* a group's own: nobody else frees it */
            detach_request(comm, req);
            if (owned) coll_request_free(req);
        }
    }
    if (comm->be && comm->be->destroy) comm->be->destroy(comm);
    coll_scratch_release(&comm->scratch);
#if ZERO_HAVE_MPI
    if (comm->owns_mpi) mpi_env_release();
#endif
    /* What zero_comm_last_error says through a stale pointer. */
    snprintf(comm->err.msg, sizeof comm->err.msg, "group %s was destroyed by zero_comm_destroy", comm->name);
    comm_free(comm);
}

/* ---------------------------------------------------------------- accessors */

/* Accessors answer "no comm" for NULL and for a destroyed comm alike. */
int zero_comm_get_rank(const zero_comm *comm) { return coll_comm_live(comm) ? comm->rank : -1; }
int zero_comm_get_size(const zero_comm *comm) { return coll_comm_live(comm) ? comm->size : 0; }
zero_backend zero_comm_get_backend(const zero_comm *comm)
{
    return coll_comm_live(comm) ? comm->backend : ZERO_BACKEND_AUTO;
}
int zero_comm_get_world_rank(const zero_comm *comm) { return coll_comm_live(comm) ? comm->world_ranks[comm->rank] : -1; }
const char *zero_comm_get_name(const zero_comm *comm) { return coll_comm_live(comm) ? comm->name : "(null)"; }

int zero_comm_get_world_rank_of(const zero_comm *comm, int rank)
{
    if (!coll_comm_live(comm) || rank < 0 || rank >= comm->size) return -1;
    return comm->world_ranks[rank];
}

zero_status zero_comm_set_name(zero_comm *comm, const char *name)
{
    ZERO_TRY(coll_comm_check(comm, "zero_comm_set_name"));
    if (!name || !*name || strlen(name) >= COLL_NAME_MAX)
        return zero_fail(&comm->err, ZERO_INVALID_ARGUMENT,
                         "zero_comm_set_name: name must be 1..%d characters", COLL_NAME_MAX - 1);
    snprintf(comm->name, sizeof comm->name, "%s", name);
    return ZERO_OK;
}

zero_status zero_comm_set_label(zero_comm *comm, const char *label)
{
    ZERO_TRY(coll_comm_check(comm, "zero_comm_set_label"));
    snprintf(comm->label, sizeof comm->label, "%s", label ? label : "");
    comm->label_hash = label && *label ? coll_hash(label, strlen(label), 2166136261u) : 0;
    return ZERO_OK;
}

zero_status zero_comm_set_timeout(zero_comm *comm, double timeout_s)
{
    ZERO_TRY(coll_comm_check(comm, "zero_comm_set_timeout"));
    if (!(timeout_s > 0))
        return zero_fail(&comm->err, ZERO_INVALID_ARGUMENT,
                         "zero_comm_set_timeout on group %s: timeout_s must be > 0, got %g", comm->name, timeout_s);
    comm->timeout_s = timeout_capped(timeout_s);
    return ZERO_OK;
}

double zero_comm_get_timeout(const zero_comm *comm) { return coll_comm_live(comm) ? comm->timeout_s : 0.0; }

const char *zero_comm_last_error(const zero_comm *comm)
{
    if (!comm) return "zero_comm_last_error: comm is NULL";
    /* A destroyed comm's struct is retired, not freed: its last message says so. */
    if (comm->magic == ZERO_HANDLE_COMM && comm->sstream) {
        const char *m = coll_stream_error_msg(comm); /* the first failure on its stream */
        if (m) return m;
    }
    return comm->err.msg;
}

/* ---------------------------------------------------------------- counters */

zero_status zero_comm_get_counters(const zero_comm *comm, zero_comm_counters *out)
{
    ZERO_TRY(coll_comm_check(comm, "zero_comm_get_counters"));
    if (!out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_comm_get_counters: out is NULL");
    *out = comm->counters;
    return ZERO_OK;
}

void zero_comm_reset_counters(zero_comm *comm)
{
    if (coll_comm_live(comm)) memset(&comm->counters, 0, sizeof comm->counters);
}
