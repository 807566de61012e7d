/* Point-to-point schedules for the bandwidth-bound MPI collectives.
 *
 * Open MPI's non-blocking collectives (libnbc) advance only when MPI_Test
 * reaches their progress hook; measured on this project's 2-core CI machine,
 * MPI_Iallgather polled with MPI_Test took 3-5x the time of MPI_Allgather at
 * 64 KiB-4 MiB per rank, while the same exchange as plain MPI_Isend/MPI_Irecv
 * completed with MPI_Testall matched the blocking call (docs/collectives.md).
 * So reduce-scatter, all-gather and large all-reduces run as these schedules:
 *
 *   reduce-scatter  every rank sends chunk j of its input to rank j and
 *                   receives its own chunk from every peer, then reduces the
 *                   n contributions locally in rank order;
 *   all-gather      every rank sends its chunk to every peer;
 *   all-reduce      reduce-scatter of n near-equal chunks, then all-gather.
 *
 * Each rank sends and receives exactly the bandwidth-optimal volume the
 * counters report (S(n-1)/n per phase). Reductions are ours, in rank order,
 * so every rank's all-reduce result is bitwise identical, and f16/bf16 travel
 * as 16 bits on the wire but are summed in fp32 and rounded once.
 *
 * Tags carry the op's sequence number on the comm, so phases of several
 * outstanding ops never match each other's messages. */
#include "comm_internal.h"

#if ZERO_HAVE_MPI

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/convert_impl.h"

#define TAG_SPACE 8000 /* MPI guarantees tags up to 32767; 4 per op */
/* Temporary memory of a reduce-scatter: at most this much for the n
 * contributions of a segment; larger chunks are reduced segment by segment. */
/* Below this, a 2-rank all-reduce swaps whole buffers (one round); above,
 * reduce-scatter + all-gather halves the reduction work (measured: the
 * exchange took 1.5x as long at 1 MiB, docs/collectives.md). */
#define EXCHANGE_MAX 32768
#define SEG_BUDGET_BYTES ((size_t)64 << 20) /* ZERO_COLL_SEG_BYTES overrides (tests) */

struct mpi_sched {
    zero_op_kind kind;
    zero_dtype dtype;
    zero_redop op;
    int n, rank;
    int seg, nseg;     /* reduce-scatter segment in flight, of nseg */
    int gathering;     /* the all-gather phase is in flight */
    int inplace;       /* the result overwrites our own contribution */
    int exchange;      /* small 2-rank all-reduce: swap whole buffers, both reduce */
    int tag;
    MPI_Comm mc;
    const char *send;
    char *recv;
    size_t es, count;
    size_t *off, *len; /* chunk j: elements [off[j], off[j] + len[j]) */
    size_t maxlen;
    size_t seglen;     /* elements per chunk per segment */
    char *tmp;         /* slots of seglen: n-1 incoming, then our own saved (in place) */
    float *acc;        /* fp32 accumulator for f16/bf16 sums (seglen), after the slots */
    coll_scratch *scratch;
    int tmp_cached;    /* tmp is the comm's scratch buffer */
    int nreq;
    MPI_Request *reqs;
    MPI_Status *stats;
    int *expect;       /* per request: elements a receive expects from its peer, -1 for a send */
    int *peer;         /* per request: the group rank at the other end */
    zero_comm *comm;   /* for messages */
};

/* ---------------------------------------------------------------- policy */

static int algo_forced; /* 0 auto, 1 p2p, 2 nbc */
static size_t seg_budget = SEG_BUDGET_BYTES;
static pthread_once_t algo_once = PTHREAD_ONCE_INIT;

static void algo_read(void)
{
    const char *v = getenv("ZERO_COLL_MPI_ALGO");
    if (v && !strcmp(v, "p2p")) algo_forced = 1;
    if (v && !strcmp(v, "nbc")) algo_forced = 2;
    v = getenv("ZERO_COLL_SEG_BYTES");
    if (v && strtoull(v, NULL, 10) > 0) seg_budget = (size_t)strtoull(v, NULL, 10);
}

int mpi_sched_wanted(const zero_comm *c, const coll_args *a)
{
    pthread_once(&algo_once, algo_read);
    if (c->size < 2) return 0;
    if (a->kind != ZERO_OP_ALLREDUCE && a->kind != ZERO_OP_REDUCE_SCATTER && a->kind != ZERO_OP_ALLGATHER) return 0;
    if (algo_forced) return algo_forced == 1;
    /* Small all-reduces are latency-bound: MPI's tree (log n rounds) beats
     * two rounds of n-1 messages, except at 2 ranks where one exchange of the
     * whole buffer is a single round. */
    if (a->kind == ZERO_OP_ALLREDUCE) return c->size == 2 || a->count * zero_dtype_size(a->dtype) >= EXCHANGE_MAX;
    return 1;
}

/* ---------------------------------------------------------------- reduce */

/* Segment `seg` of chunk j: elements [off[j] + b, off[j] + b + l). */
static void seg_range(const mpi_sched *s, int j, size_t *b, size_t *l)
{
    size_t start = (size_t)s->seg * s->seglen;
    *b = start;
    *l = start >= s->len[j] ? 0 : (s->len[j] - start < s->seglen ? s->len[j] - start : s->seglen);
}

static char *slot_ptr(const mpi_sched *s, int slot) { return s->tmp + (size_t)slot * s->seglen * s->es; }

/* Rank p's contribution to the current segment of my chunk. */
static const char *contribution(const mpi_sched *s, int p)
{
    size_t b, l;
    seg_range(s, s->rank, &b, &l);
    if (p == s->rank) return s->inplace && p != 0 ? slot_ptr(s, s->n - 1) : s->send + (s->off[s->rank] + b) * s->es;
    return slot_ptr(s, p < s->rank ? p : p - 1);
}

/* Reduce the n contributions to the current segment, in rank order, into
 * out (which may be our own contribution: in place). */
static void reduce_segment(mpi_sched *s, char *out)
{
    size_t b, len;
    seg_range(s, s->rank, &b, &len);
    if (!len) return;
    int max = s->op == ZERO_MAX;
    if (coll_is_r16(s->dtype)) {
        for (int p = 0; p < s->n; p++)
            coll_acc16(s->acc, (const uint16_t *)contribution(s, p), len, s->dtype, max, p == 0);
        coll_f32_to_r16(s->acc, (uint16_t *)out, len, s->dtype);
        return;
    }
    /* out = c0 + c1 in one pass, then out += c2, ...: rank order, and out is
     * either disjoint from the contributions or is our own one (in place,
     * where our own was saved first unless we are rank 0, whose c0 is out). */
    coll_reduce(out, contribution(s, 0), contribution(s, 1), len, s->dtype, max);
    for (int p = 2; p < s->n; p++) coll_reduce(out, out, contribution(s, p), len, s->dtype, max);
}

/* ---------------------------------------------------------------- phases */

/* Request k goes to or comes from group rank p; a receive expects `expect`
 * elements (-1: a send). */
static void note(mpi_sched *s, int k, int p, int expect)
{
    s->peer[k] = p;
    s->expect[k] = expect;
    s->reqs[k] = MPI_REQUEST_NULL;
}

static int post_reduce_scatter(mpi_sched *s)
{
    MPI_Datatype t = mpi_wire_type(s->dtype);
    int k = 0, rc = MPI_SUCCESS, tag = s->tag + (s->seg & 1); /* consecutive segments never share a tag */
    size_t b, l;
    seg_range(s, s->rank, &b, &l);
    if (s->inplace && s->rank != 0 && l) /* the result will overwrite it before it is added */
        memcpy(slot_ptr(s, s->n - 1), s->send + (s->off[s->rank] + b) * s->es, l * s->es);
    for (int p = 0; p < s->n && rc == MPI_SUCCESS; p++) {
        if (p == s->rank || !l) continue;
        note(s, k, p, (int)l);
        rc = MPI_Irecv(slot_ptr(s, p < s->rank ? p : p - 1), (int)l, t, p, tag, s->mc, &s->reqs[k++]);
    }
    /* Send in a rotated order so not every rank hits rank 0 first. */
    for (int i = 1; i < s->n && rc == MPI_SUCCESS; i++) {
        int p = (s->rank + i) % s->n;
        size_t pb, pl;
        seg_range(s, p, &pb, &pl);
        if (!pl) continue;
        note(s, k, p, -1);
        rc = MPI_Isend(s->send + (s->off[p] + pb) * s->es, (int)pl, t, p, tag, s->mc, &s->reqs[k++]);
    }
    s->nreq = k;
    return rc;
}

/* Send my chunk (at base + off[rank]) to all, receive every other chunk. */
static int post_allgather(mpi_sched *s, const char *mine, char *base, int tag)
{
    MPI_Datatype t = mpi_wire_type(s->dtype);
    int k = 0, rc = MPI_SUCCESS;
    for (int p = 0; p < s->n && rc == MPI_SUCCESS; p++) {
        if (p == s->rank || !s->len[p]) continue;
        note(s, k, p, (int)s->len[p]);
        rc = MPI_Irecv(base + s->off[p] * s->es, (int)s->len[p], t, p, tag, s->mc, &s->reqs[k++]);
    }
    for (int i = 1; i < s->n && rc == MPI_SUCCESS && s->len[s->rank]; i++) {
        int p = (s->rank + i) % s->n;
        note(s, k, p, -1);
        rc = MPI_Isend(mine, (int)s->len[s->rank], t, p, tag, s->mc, &s->reqs[k++]);
    }
    s->nreq = k;
    return rc;
}

void mpi_sched_free(mpi_sched *s)
{
    if (!s) return;
    /* off, len and reqs live in the same block as s, acc in tmp's */
    if (s->tmp) coll_scratch_put(s->scratch, s->tmp, s->tmp_cached);
    free(s);
}

static mpi_p2p reqs_of(const mpi_sched *s)
{
    return (mpi_p2p){s->comm, s->kind, s->dtype, s->count, "schedule", s->nreq, s->reqs, s->stats, s->expect, s->peer};
}

static zero_status fail_rc(zero_comm *c, const mpi_sched *s, int rc)
{
    const mpi_p2p r = reqs_of(s);
    return mpi_p2p_fail_rc(c, &r, rc);
}

zero_status mpi_sched_start(zero_comm *c, MPI_Comm mc, const coll_args *a, mpi_sched **out)
{
    *out = NULL;
    int n = c->size;
    /* One allocation for the schedule and its per-rank arrays: small ops
     * are latency-bound and every malloc shows. */
    size_t arrays = 2 * (size_t)n * (sizeof(MPI_Status) + sizeof(size_t) + sizeof(MPI_Request) + 2 * sizeof(int));
    mpi_sched *s = calloc(1, sizeof *s + arrays);
    if (!s) return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", coll_op_name(a->kind));
    /* largest alignment first: statuses, sizes, requests, ints */
    s->stats = (MPI_Status *)(s + 1);
    s->off = (size_t *)(s->stats + 2 * n);
    s->len = s->off + n;
    s->reqs = (MPI_Request *)(s->len + n);
    s->expect = (int *)(s->reqs + 2 * n);
    s->peer = s->expect + 2 * n;
    s->comm = c;
    s->kind = a->kind;
    s->dtype = a->dtype;
    s->op = a->op;
    s->n = n;
    s->rank = c->rank;
    s->mc = mc;
    s->send = a->send;
    s->recv = a->recv;
    s->es = zero_dtype_size(a->dtype);
    s->count = a->count;
    s->tag = 1 + (int)(a->seq % TAG_SPACE) * 4;
    s->exchange = a->kind == ZERO_OP_ALLREDUCE && n == 2 && a->count * s->es < EXCHANGE_MAX;
    for (int j = 0; j < n; j++) {
        if (s->exchange) { /* both "chunks" are the whole buffer */
            s->len[j] = a->count;
            s->off[j] = 0;
        } else if (a->kind == ZERO_OP_ALLREDUCE) {
            size_t base = a->count / (size_t)n, extra = a->count % (size_t)n;
            s->len[j] = base + ((size_t)j < extra);
            s->off[j] = (size_t)j * base + ((size_t)j < extra ? (size_t)j : extra);
        } else {
            s->len[j] = a->count;
            s->off[j] = (size_t)j * a->count;
        }
        if (s->len[j] > s->maxlen) s->maxlen = s->len[j];
    }
    if (s->maxlen > INT_MAX) {
        size_t maxlen = s->maxlen;
        mpi_sched_free(s);
        return zero_fail(&c->err, ZERO_UNSUPPORTED,
                         "%s on group %s rank %d: chunks of %zu elements exceed MPI's int count; split the op",
                         coll_op_name(a->kind), c->name, c->rank, maxlen);
    }

    int rc;
    if (a->kind == ZERO_OP_ALLGATHER) {
        /* Send straight from the caller's buffer, then copy our own chunk
         * into place while the exchange is under way, as Open MPI's
         * all-gathers do (local copy first). Copying at the end instead
         * measured about 2 % slower on average at 8-64 MiB on 2 ranks
         * (1.05 against 1.03 of the raw call), and 11-16 % in a plain
         * Isend/Irecv harness (docs/BENCHMARKS.md; why is not established:
         * the peers may find our chunk in the shared cache). */
        char *slot = s->recv + s->off[s->rank] * s->es;
        s->gathering = 1;
        rc = post_allgather(s, a->send, s->recv, s->tag + 2);
        if (rc == MPI_SUCCESS && a->send != slot) memcpy(slot, a->send, s->len[s->rank] * s->es);
    } else {
        const char *own = s->send + s->off[s->rank] * s->es;
        const char *out_at = a->kind == ZERO_OP_REDUCE_SCATTER ? s->recv : s->recv + s->off[s->rank] * s->es;
        s->inplace = own == out_at;
        size_t budget = seg_budget / ((size_t)n * s->es);
        s->seglen = s->maxlen < budget ? s->maxlen : (budget ? budget : 1);
        s->nseg = s->seglen ? (int)((s->maxlen + s->seglen - 1) / s->seglen) : 0;
        size_t slots = (size_t)n - 1 + (s->inplace && s->rank != 0);
        size_t seg = s->seglen ? s->seglen : 1;
        size_t tmp_bytes = (slots * seg * s->es + 15) & ~(size_t)15;
        size_t acc_bytes = coll_is_r16(a->dtype) ? seg * sizeof(float) : 0;
        s->scratch = &c->scratch;
        s->tmp = coll_scratch_get(s->scratch, tmp_bytes + acc_bytes, &s->tmp_cached);
        if (!s->tmp) goto oom;
        if (acc_bytes) s->acc = (float *)(s->tmp + tmp_bytes);
        rc = post_reduce_scatter(s);
    }
    if (rc != MPI_SUCCESS) {
        zero_status st = fail_rc(c, s, rc);
        mpi_sched_abandon(s);
        return st;
    }
    *out = s;
    return ZERO_OK;
oom:
    mpi_sched_free(s);
    return zero_fail(&c->err, ZERO_OUT_OF_MEMORY, "%s of %zu x %s on group %s rank %d: out of memory for staging",
                     coll_op_name(a->kind), a->count, zero_dtype_name(a->dtype), c->name, c->rank);
}

zero_status mpi_sched_test(zero_comm *c, mpi_sched *s, int *done)
{
    int flag = 0;
    *done = 0;
    int rc = MPI_Testall(s->nreq, s->reqs, &flag, s->stats);
    const mpi_p2p r = reqs_of(s);
    if (rc == MPI_ERR_IN_STATUS) return mpi_p2p_failed(c, &r);
    if (rc != MPI_SUCCESS) return fail_rc(c, s, rc);
    if (!flag) return ZERO_OK;
    /* A peer that passed a smaller count sends less than we expect, and MPI
     * calls that a success: compare what arrived with what we asked for. */
    ZERO_TRY(mpi_p2p_check_counts(c, &r));
    if (s->gathering) {
        *done = 1;
        return ZERO_OK;
    }
    /* A reduce-scatter segment is in: reduce it into place. */
    char *mine = s->kind == ZERO_OP_REDUCE_SCATTER ? s->recv : s->recv + s->off[s->rank] * s->es;
    size_t b, l;
    seg_range(s, s->rank, &b, &l);
    reduce_segment(s, mine + b * s->es);
    if (++s->seg < s->nseg) {
        rc = post_reduce_scatter(s);
    } else if (s->kind == ZERO_OP_ALLREDUCE && !s->exchange) {
        s->gathering = 1;
        rc = post_allgather(s, mine, s->recv, s->tag + 2);
    } else {
        *done = 1;
    }
    if (rc != MPI_SUCCESS) return fail_rc(c, s, rc);
    return ZERO_OK;
}

int mpi_sched_missing(const mpi_sched *s, unsigned char *missing)
{
    const mpi_p2p r = reqs_of(s);
    return mpi_p2p_missing(&r, missing);
}

void mpi_sched_abandon(mpi_sched *s)
{
    if (!s) return;
    /* Receives land in the caller's buffer (all-gather) or in tmp. */
    const mpi_p2p r = reqs_of(s);
    if (mpi_p2p_abandon(&r) && s->tmp) {
        /* MPI may still write tmp: it outlives the comm in the graveyard. */
        coll_scratch_abandon(s->scratch, s->tmp, s->tmp_cached);
        s->tmp = NULL;
    }
    mpi_sched_free(s);
}

#endif /* ZERO_HAVE_MPI */
