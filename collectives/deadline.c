/* Deadlines: poll an op until it completes or its time is up.
 *
 * Every transport we use can be asked "done yet?" without blocking
 * (MPI_Test, cudaEventQuery), so a deadline is a polling loop; the polls are
 * also what moves Open MPI's progress engine (vader copies a rendezvous
 * message inside the receiver's MPI_Test), and nothing blocks but a sleep
 * between polls.
 *
 * How long to poll back to back before sleeping (issue 12). A rank that
 * arrives first at a collective waits for its peer's compute, often for
 * milliseconds. It used to poll back to back for 100 ms: that burned a core
 * the peer (and the peer's threads) may need on a small machine, and CPU
 * time the waiting process paid for nothing (7-10 ms per step of zero.torch
 * at 2 ranks). Now it spins only as long as the op would take between ranks
 * that are both there:
 *   spin = SPIN_S (50 us: a small op between ready ranks takes a few) +
 *          the op's bytes at SPIN_BPS (2 GB/s, below what a 2-rank
 *          reduce-scatter moves here, docs/BENCHMARKS.md), at most 1 ms;
 * then it sleeps for 1/64 of the time waited so far, at most 1 ms, between
 * polls: an op that completes during a sleep is noticed at most 1/64 of its
 * time (plus the kernel's timer slack, ~50 us) late, and a rank waiting for
 * a straggler wakes ~20 times per ms early on, once per ms later, a few
 * microseconds of CPU each. ZERO_COLL_SPIN_US and ZERO_COLL_SPIN_GBPS
 * override the two constants (measuring the trade-off). The deadline is
 * checked after every poll, and no sleep is longer than 1 ms. Measurements
 * and the rejected alternative (a helper thread in the blocking MPI call)
 * are in docs/collectives.md. */
#include "comm_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define SPIN_S_DEFAULT 50e-6
#define SPIN_BPS_DEFAULT 2e9
#define SPIN_MAX_S 1e-3
#define MAX_SLEEP_S 1e-3
#define SLEEP_FRACTION 64.0

double coll_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double spin_base_s = SPIN_S_DEFAULT, spin_bps = SPIN_BPS_DEFAULT;
static pthread_once_t spin_once = PTHREAD_ONCE_INIT;

/* A non-negative number from the environment, else -1. */
static double env_number(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    char *end = NULL;
    double x = strtod(v, &end);
    return (end && *end == '\0' && x >= 0 && x <= 1e7) ? x : -1;
}

/* ZERO_COLL_SPIN_US=N: the spin's base in microseconds (0: sleep from the
 * first miss); ZERO_COLL_SPIN_GBPS=G: its per-byte part (0: none). Values
 * that are not numbers in [0, 1e7] keep the defaults. */
static void spin_read(void)
{
    double us = env_number("ZERO_COLL_SPIN_US"), gbps = env_number("ZERO_COLL_SPIN_GBPS");
    if (us >= 0) spin_base_s = us * 1e-6;
    if (gbps >= 0) spin_bps = gbps * 1e9;
}

double coll_spin_s(size_t bytes)
{
    pthread_once(&spin_once, spin_read);
    double s = spin_bps > 0 ? (double)bytes / spin_bps : 0;
    if (s > SPIN_MAX_S) s = SPIN_MAX_S;
    return spin_base_s + s;
}

static void nap(double waited)
{
    double s = waited / SLEEP_FRACTION;
    if (s > MAX_SLEEP_S) s = MAX_SLEEP_S;
    if (s < 1e-6) s = 1e-6;
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
}

zero_status coll_poll_spin(coll_test_fn fn, void *ctx, double timeout_s, double spin_s)
{
    const double start = coll_now();
    for (;;) {
        int done = 0;
        zero_status st = fn(ctx, &done);
        if (st != ZERO_OK) return st;
        if (done) return ZERO_OK;
        const double waited = coll_now() - start;
        if (waited >= timeout_s) {
            /* One last look: the op may have finished while we slept. */
            st = fn(ctx, &done);
            if (st != ZERO_OK) return st;
            return done ? ZERO_OK : ZERO_TIMEOUT;
        }
        if (waited >= spin_s) nap(waited);
    }
}

zero_status coll_poll(coll_test_fn fn, void *ctx, double timeout_s)
{
    return coll_poll_spin(fn, ctx, timeout_s, coll_spin_s(0));
}

/* What this rank moves in the op, roughly: the spin is sized by it. */
static size_t op_bytes(const zero_comm *c, const coll_args *a)
{
    size_t b = a->count * zero_dtype_size(a->dtype);
    if (a->kind == ZERO_OP_REDUCE_SCATTER || a->kind == ZERO_OP_ALLGATHER) b *= (size_t)c->size;
    return b;
}

/* The comm's other outstanding requests are moved along too (fingerprinted
 * ops start their data once the records agree), so asynchronous ops keep
 * overlapping while the caller waits for an earlier one. */
void coll_advance_others(zero_comm *c, const zero_request *except)
{
    if (!c->be->advance || !c->pending) return;
    /* oldest first (the list is newest first): they start in issue order */
    zero_request *o = c->pending;
    while (o->next) o = o->next;
    for (; o; o = o->prev)
        if (o != except && !o->done) c->be->advance(c, o);
}

static zero_status request_test(void *ctx, int *done)
{
    zero_request *req = ctx;
    zero_comm *c = req->comm;
    coll_advance_others(c, req);
    return c->be->test(c, req, done);
}

zero_status coll_wait_request(zero_request *req)
{
    zero_comm *c = req->comm;
    if (req->done) return req->status;
    zero_status st = coll_poll_spin(request_test, req, c->timeout_s, coll_spin_s(op_bytes(c, &req->args)));
    if (st == ZERO_OK) {
        req->done = 1;
        req->status = ZERO_OK;
        return ZERO_OK;
    }
    if (st == ZERO_TIMEOUT) {
        char what[96], ranks[224];
        coll_describe(&req->args, what, sizeof what);
        int p2p = req->args.kind == ZERO_OP_SEND || req->args.kind == ZERO_OP_RECV;
        if (p2p)
            snprintf(ranks, sizeof ranks, "peer rank %d (world %d)", req->args.peer,
                     c->world_ranks[req->args.peer]);
        else {
            /* Name the ranks whose part did not arrive when the backend can
             * tell (schedules, fingerprints); else the whole group. */
            char list[128];
            unsigned char *missing = calloc((size_t)c->size, 1);
            if (missing && c->be->missing && c->be->missing(c, req, missing)) {
                coll_format_subset(c, missing, list, sizeof list);
                snprintf(ranks, sizeof ranks, "ranks %s (world ranks whose messages did not arrive)", list);
            } else {
                coll_format_ranks(c, -1, list, sizeof list);
                snprintf(ranks, sizeof ranks, "ranks %s (the whole group: this op cannot tell which is late)",
                         list);
            }
            free(missing);
        }
        coll_comm_fail(c, ZERO_TIMEOUT,
                       "%s on group %s(size %d) rank %d (world %d): timed out after %.1f s waiting for %s",
                       what, c->name, c->size, c->rank, c->world_ranks[c->rank], c->timeout_s, ranks);
    } else {
        /* The backend recorded its message; make the failure stick. */
        coll_comm_mark_failed(c, st);
    }
    c->be->abandon(c, req);
    req->done = 1;
    req->status = st;
    return st;
}

/* ---------------------------------------------------------------- graveyard */

typedef struct grave {
    struct grave *next;
    void *ptr;
    void (*release)(void *);
} grave;

static pthread_mutex_t grave_lock = PTHREAD_MUTEX_INITIALIZER;
static grave *graves;

void coll_graveyard_add(void *ptr, void (*release)(void *))
{
    if (!ptr) return;
    grave *g = malloc(sizeof *g);
    if (!g) return; /* then it simply leaks: still nothing frees memory in use */
    g->ptr = ptr;
    g->release = release;
    pthread_mutex_lock(&grave_lock);
    g->next = graves;
    graves = g;
    pthread_mutex_unlock(&grave_lock);
}

void coll_graveyard_flush(void)
{
    pthread_mutex_lock(&grave_lock);
    grave *g = graves;
    graves = NULL;
    pthread_mutex_unlock(&grave_lock);
    while (g) {
        grave *next = g->next;
        if (g->release) g->release(g->ptr);
        free(g);
        g = next;
    }
}
