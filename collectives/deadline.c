/* Deadlines: poll an op until it completes or its time is up.
 *
 * Every transport we use can be asked "done yet?" without blocking
 * (MPI_Test, cudaEventQuery), so a deadline is a polling loop. For the first
 * 100 ms it polls back to back, exactly as MPI_Wait would (Open MPI's progress
 * engine yields the core by itself under mpi_yield_when_idle, so a peer rank
 * sharing the core still runs; a second sched_yield of ours measured +15 us
 * per small op), so every op of normal length runs at the blocking call's
 * speed, also on a loaded machine where sleeping would cost a time slice per
 * protocol step. Then it sleeps for 1/64 of the time waited so far, at most
 * 1 ms: a long op finishes at most ~1.5% late, and a
 * rank waiting 30 s for a straggler costs almost no CPU. Measurements and the
 * alternative (a helper thread in the blocking MPI call) are in
 * docs/collectives.md. */
#include "comm_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define SPIN_PHASE_S 100e-3
#define MAX_SLEEP_S 1e-3

double coll_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void backoff(double waited)
{
    if (waited < SPIN_PHASE_S) return;
    double s = waited / 64.0;
    if (s > MAX_SLEEP_S) s = MAX_SLEEP_S;
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
}

zero_status coll_poll(coll_test_fn fn, void *ctx, double timeout_s)
{
    double start = coll_now();
    for (;;) {
        int done = 0;
        zero_status st = fn(ctx, &done);
        if (st != ZERO_OK) return st;
        if (done) return ZERO_OK;
        double waited = coll_now() - start;
        if (waited >= timeout_s) {
            /* One last look: the op may have finished while we slept. */
            st = fn(ctx, &done);
            if (st != ZERO_OK) return st;
            return done ? ZERO_OK : ZERO_TIMEOUT;
        }
        backoff(waited);
    }
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
    zero_status st = coll_poll(request_test, req, c->timeout_s);
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
