/* The schedule checker (pp_plan.h): structure, dependencies within a stage,
 * message matching between stages, slots, and a simulation of the runtime's
 * rules that finds deadlocks and the theoretical bubble. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "pp_plan.h"

#define NKINDS 7

typedef struct chk {
    pp_plan *p;
    int *stuck_first; /* optional, per stage: first op of the group its comm is stuck at after a deadlock (-1) */
    int P, V, M;
    int *idx[NKINDS]; /* [key] = index of that op in its stage's list, -1 none; key = (s*V + c)*M + m */
    int **gid;        /* [s][i]: comm group of op i (-1 for compute ops) */
    int **partner_s, **partner_i; /* comm op's match on the peer stage */
    int *prev_in_slot; /* [key]: the key that held the slot before (-1) */
    const double *cost; /* NULL: every compute op takes 1/V; else F, B, W take cost[0..2] */
} chk;

static int key_of(const chk *k, int s, int c, int m) { return (s * k->V + c) * k->M + m; }

static const char *kind_name(int kind)
{
    static const char *const n[NKINDS] = {"F", "B", "W", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD"};
    return kind >= 0 && kind < NKINDS ? n[kind] : "?";
}

static zero_status refuse(const pp_plan *p, int s, const pp_op *op, int i, const char *fmt, const char *detail)
{
    char d[64];
    pp_op_describe(op, d, sizeof d);
    return gpt_fail(ZERO_INVALID_ARGUMENT, "pipeline schedule '%s' (%d stages, %d chunks, %d micro-batches): stage %d op %d %s: %s%s",
                    p->name, p->stages, p->chunks, p->micro_batches, s, i, d, fmt, detail ? detail : "");
}

/* The stage a comm op talks to, and the virtual stage whose output the message is. */
static void peer_of(const chk *k, int s, const pp_op *op, int *peer, int *vs_src)
{
    int q = pp_virtual_stage(k->P, s, op->chunk), other;
    switch (op->kind) {
    case PP_OP_SEND_ACT: other = q + 1, *vs_src = q; break;
    case PP_OP_RECV_ACT: other = q - 1, *vs_src = q - 1; break;
    case PP_OP_SEND_GRAD: other = q - 1, *vs_src = q; break;
    default: other = q + 1, *vs_src = q + 1; break; /* RECV_GRAD */
    }
    *peer = other % k->P;
}

static int is_send(int kind) { return kind == PP_OP_SEND_ACT || kind == PP_OP_SEND_GRAD; }
static int is_comm_kind(int kind) { return kind >= PP_OP_SEND_ACT && kind <= PP_OP_RECV_GRAD; }
static int carries_act(int kind) { return kind == PP_OP_SEND_ACT || kind == PP_OP_RECV_ACT; }

/* ------------------------------------------------------------ structure */
static zero_status check_ops(chk *k)
{
    pp_plan *p = k->p;
    const int last = k->P * k->V - 1;
    for (int s = 0; s < k->P; s++) {
        for (int i = 0; i < p->count[s]; i++) {
            const pp_op *op = &p->ops[s][i];
            if (op->kind >= NKINDS) return refuse(p, s, op, i, "unknown op kind", NULL);
            if (op->chunk >= k->V || op->micro < 0 || op->micro >= k->M)
                return refuse(p, s, op, i, "micro-batch or chunk out of range", NULL);
            if (op->group && (!is_comm_kind(op->kind) || i == 0 || !is_comm_kind(p->ops[s][i - 1].kind)))
                return refuse(p, s, op, i, "is marked grouped with the op before, which is not a send or receive",
                              NULL);
            int q = pp_virtual_stage(k->P, s, op->chunk);
            if ((op->kind == PP_OP_RECV_ACT || op->kind == PP_OP_SEND_GRAD) && q == 0)
                return refuse(p, s, op, i, "has no peer: virtual stage 0 (the embedding) has no previous stage", NULL);
            if ((op->kind == PP_OP_SEND_ACT || op->kind == PP_OP_RECV_GRAD) && q == last)
                return refuse(p, s, op, i, "has no peer: the last virtual stage (the head) has no next stage", NULL);
            if (is_comm_kind(op->kind)) {
                int peer, vs;
                peer_of(k, s, op, &peer, &vs);
                if (peer == s) return refuse(p, s, op, i, "would talk to its own stage (one stage cannot have chunks)", NULL);
            }
            int key = key_of(k, s, op->chunk, op->micro);
            if (k->idx[op->kind][key] >= 0) {
                char prev[24];
                snprintf(prev, sizeof prev, "%d", k->idx[op->kind][key]);
                return refuse(p, s, op, i, "is repeated (first at op ", prev);
            }
            k->idx[op->kind][key] = i;
        }
    }
    return ZERO_OK;
}

static zero_status missing(const chk *k, int s, int c, int m, int kind, const char *why)
{
    const pp_plan *p = k->p;
    return gpt_fail(ZERO_INVALID_ARGUMENT,
                    "pipeline schedule '%s' (%d stages, %d chunks, %d micro-batches): stage %d has no %s(micro-batch %d, "
                    "chunk %d): %s",
                    p->name, p->stages, p->chunks, p->micro_batches, s, kind_name(kind), m, c, why);
}

static zero_status order_error(const chk *k, int s, int c, int m, int before, int after)
{
    const pp_plan *p = k->p;
    int key = key_of(k, s, c, m);
    return gpt_fail(ZERO_INVALID_ARGUMENT,
                    "pipeline schedule '%s' (%d stages, %d chunks, %d micro-batches): stage %d runs %s(micro-batch %d, "
                    "chunk %d) at op %d before its %s at op %d",
                    p->name, p->stages, p->chunks, p->micro_batches, s, kind_name(after), m, c, k->idx[after][key],
                    kind_name(before), k->idx[before][key]);
}

static zero_status check_complete(chk *k)
{
    const int last = k->P * k->V - 1;
    for (int s = 0; s < k->P; s++)
        for (int c = 0; c < k->V; c++)
            for (int m = 0; m < k->M; m++) {
                int key = key_of(k, s, c, m), q = pp_virtual_stage(k->P, s, c);
                if (k->idx[PP_OP_F][key] < 0) return missing(k, s, c, m, PP_OP_F, "every micro-batch runs forward");
                if (k->idx[PP_OP_B][key] < 0) return missing(k, s, c, m, PP_OP_B, "every micro-batch runs backward");
                if (k->idx[PP_OP_W][key] < 0)
                    return missing(k, s, c, m, PP_OP_W, "every backward needs its weight gradients");
                if (q > 0 && k->idx[PP_OP_RECV_ACT][key] < 0)
                    return missing(k, s, c, m, PP_OP_RECV_ACT, "its forward's input comes from the previous stage");
                if (q > 0 && k->idx[PP_OP_SEND_GRAD][key] < 0)
                    return missing(k, s, c, m, PP_OP_SEND_GRAD, "the previous stage waits for its input gradient");
                if (q < last && k->idx[PP_OP_SEND_ACT][key] < 0)
                    return missing(k, s, c, m, PP_OP_SEND_ACT, "the next stage waits for its output");
                if (q < last && k->idx[PP_OP_RECV_GRAD][key] < 0)
                    return missing(k, s, c, m, PP_OP_RECV_GRAD, "its backward's output gradient comes from the next stage");
                /* order within the stage: (before, after) */
                static const int rules[][2] = {{PP_OP_RECV_ACT, PP_OP_F}, {PP_OP_F, PP_OP_SEND_ACT},
                                               {PP_OP_F, PP_OP_RECV_GRAD}, {PP_OP_RECV_GRAD, PP_OP_B},
                                               {PP_OP_F, PP_OP_B},        {PP_OP_B, PP_OP_W},
                                               {PP_OP_B, PP_OP_SEND_GRAD}};
                for (size_t r = 0; r < sizeof rules / sizeof rules[0]; r++) {
                    int a = k->idx[rules[r][0]][key], b = k->idx[rules[r][1]][key];
                    if (a >= 0 && b >= 0 && b < a) return order_error(k, s, c, m, rules[r][0], rules[r][1]);
                }
            }
    return ZERO_OK;
}

/* ------------------------------------------------------------ messages */
typedef struct chan {
    int *ops; /* op indices on the sending (or receiving) stage, in order */
    int n, cap;
} chan;

static int chan_push(chan *ch, int i)
{
    if (ch->n == ch->cap) {
        int cap = ch->cap ? 2 * ch->cap : 16;
        int *o = realloc(ch->ops, sizeof *o * (size_t)cap);
        if (!o) return -1;
        ch->ops = o, ch->cap = cap;
    }
    ch->ops[ch->n++] = i;
    return 0;
}

static zero_status check_messages(chk *k)
{
    pp_plan *p = k->p;
    const int P = k->P;
    chan *snd = calloc((size_t)P * P, sizeof *snd), *rcv = calloc((size_t)P * P, sizeof *rcv);
    zero_status st = ZERO_OK;
    int bad = !snd || !rcv;
    for (int s = 0; s < P && !bad; s++)
        for (int i = 0; i < p->count[s] && !bad; i++) {
            const pp_op *op = &p->ops[s][i];
            if (!is_comm_kind(op->kind)) continue;
            int peer, vs;
            peer_of(k, s, op, &peer, &vs);
            if (is_send(op->kind)) bad |= chan_push(&snd[s * P + peer], i);
            else bad |= chan_push(&rcv[peer * P + s], i);
        }
    if (bad) {
        st = gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_check: out of memory");
        goto out;
    }
    for (int a = 0; a < P && st == ZERO_OK; a++)
        for (int b = 0; b < P && st == ZERO_OK; b++) {
            chan *cs = &snd[a * P + b], *cr = &rcv[a * P + b];
            int n = cs->n > cr->n ? cs->n : cr->n;
            for (int j = 0; j < n; j++) {
                const pp_op *so = j < cs->n ? &p->ops[a][cs->ops[j]] : NULL;
                const pp_op *ro = j < cr->n ? &p->ops[b][cr->ops[j]] : NULL;
                int sp, svs = -1, rp, rvs = -1;
                if (so) peer_of(k, a, so, &sp, &svs);
                if (ro) peer_of(k, b, ro, &rp, &rvs);
                int same = so && ro && carries_act(so->kind) == carries_act(ro->kind) && so->micro == ro->micro &&
                           svs == rvs;
                if (same) {
                    k->partner_s[a][cs->ops[j]] = b, k->partner_i[a][cs->ops[j]] = cr->ops[j];
                    k->partner_s[b][cr->ops[j]] = a, k->partner_i[b][cr->ops[j]] = cs->ops[j];
                    continue;
                }
                char sd[64] = "nothing", rd[64] = "nothing";
                if (so) pp_op_describe(so, sd, sizeof sd);
                if (ro) pp_op_describe(ro, rd, sizeof rd);
                st = gpt_fail(ZERO_INVALID_ARGUMENT,
                              "pipeline schedule '%s' (%d stages, %d chunks, %d micro-batches): message %d from stage %d "
                              "to stage %d does not match: stage %d sends %s (op %d), stage %d expects %s (op %d)%s",
                              p->name, p->stages, p->chunks, p->micro_batches, j, a, b, a, sd, so ? cs->ops[j] : -1, b,
                              rd, ro ? cr->ops[j] : -1,
                              !ro ? ": a missing receive" : !so ? ": a missing send" : ": messages between two stages "
                                                                                      "match in the order issued");
                break;
            }
        }
out:
    for (int i = 0; snd && rcv && i < P * P; i++) free(snd[i].ops), free(rcv[i].ops);
    free(snd), free(rcv);
    return st;
}

/* ------------------------------------------------------------ slots */
static zero_status assign_slots(chk *k)
{
    pp_plan *p = k->p;
    const int P = k->P, V = k->V, M = k->M;
    size_t nsc = (size_t)P * V, nkey = nsc * M;
    p->peak_live = calloc((size_t)P, sizeof(int));
    p->peak_stage = calloc((size_t)P, sizeof(double));
    p->slots = calloc(nsc, sizeof(int));
    p->landing = calloc(nsc, sizeof(int));
    p->slot_of = malloc(sizeof(int) * nkey);
    p->landing_of = malloc(sizeof(int) * nkey);
    k->prev_in_slot = malloc(sizeof(int) * nkey);
    /* which key holds slot j of (s, c), and which landing buffer; M is an upper bound on either */
    int *holder = malloc(sizeof(int) * nsc * M), *land = malloc(sizeof(int) * nsc * M), *last = malloc(sizeof(int) * nsc * M);
    zero_status st = ZERO_OK;
    if (!p->peak_live || !p->peak_stage || !p->slots || !p->landing || !p->slot_of || !p->landing_of ||
        !k->prev_in_slot || !holder || !land || !last) {
        st = gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_check: out of memory");
        goto out;
    }
    for (size_t i = 0; i < nkey; i++) p->slot_of[i] = p->landing_of[i] = k->prev_in_slot[i] = -1;
    for (size_t i = 0; i < nsc * M; i++) holder[i] = land[i] = last[i] = -1;
    p->split = 0;
    for (int s = 0; s < P; s++) {
        int live = 0;
        for (int i = 0; i < p->count[s]; i++) {
            const pp_op *op = &p->ops[s][i];
            size_t sc = (size_t)s * V + op->chunk;
            int key = key_of(k, s, op->chunk, op->micro);
            int *h = holder + sc * M, *l = land + sc * M, *prev = last + sc * M;
            if (op->kind == PP_OP_RECV_ACT) {
                int j = 0;
                while (l[j] >= 0) j++;
                l[j] = key;
                p->landing_of[key] = j;
                if (j + 1 > p->landing[sc]) p->landing[sc] = j + 1;
            } else if (op->kind == PP_OP_F) {
                int j = 0;
                while (h[j] >= 0) j++;
                h[j] = key;
                p->slot_of[key] = j;
                k->prev_in_slot[key] = prev[j];
                prev[j] = key;
                if (j + 1 > p->slots[sc]) p->slots[sc] = j + 1;
                if (p->landing_of[key] >= 0) l[p->landing_of[key]] = -1;
                if (++live > p->peak_live[s]) p->peak_live[s] = live;
            } else if (op->kind == PP_OP_W) {
                h[p->slot_of[key]] = -1;
                live--;
                if (k->idx[PP_OP_B][key] != i - 1) p->split = 1;
            }
        }
        p->peak_stage[s] = (double)p->peak_live[s] / V;
    }
out:
    free(holder), free(land), free(last);
    return st;
}

/* ------------------------------------------------------------ simulation */
typedef struct grp {
    int first, n;
    int issued, posted, done;
    double t_issue, t_post, t_done;
} grp;

typedef struct sim {
    grp **g;
    int *ng, *gnext, *pc;
    double *t, *busy, *start; /* start: when the stage's first compute op began (-1 before) */
    unsigned char **posted, **done;
    double **tp, **td;
} sim;

static void sim_free(sim *m, int P)
{
    for (int s = 0; s < P; s++) {
        if (m->g) free(m->g[s]);
        if (m->posted) free(m->posted[s]);
        if (m->done) free(m->done[s]);
        if (m->tp) free(m->tp[s]);
        if (m->td) free(m->td[s]);
    }
    free(m->g), free(m->ng), free(m->gnext), free(m->pc), free(m->t), free(m->busy), free(m->start);
    free(m->posted), free(m->done), free(m->tp), free(m->td);
}

static double dmax(double a, double b) { return a > b ? a : b; }

/* The comm op a compute op waits for (-1: none): its receive, and the
 * previous holder's send out of the slot it reuses. */
static int waits_for(const chk *k, int s, const pp_op *op, int *second)
{
    int key = key_of(k, s, op->chunk, op->micro), prev = k->prev_in_slot[key];
    *second = -1;
    if (op->kind == PP_OP_F) {
        if (prev >= 0) *second = k->idx[PP_OP_SEND_ACT][prev];
        return k->idx[PP_OP_RECV_ACT][key];
    }
    if (op->kind == PP_OP_B) {
        if (prev >= 0) *second = k->idx[PP_OP_SEND_GRAD][prev];
        return k->idx[PP_OP_RECV_GRAD][key];
    }
    return -1;
}

static void describe_stuck(const chk *k, const sim *m, int s, char *buf, size_t len)
{
    const pp_plan *p = k->p;
    size_t used = 0;
    char d[64], e[64];
    buf[0] = '\0';
    if (m->pc[s] < p->count[s]) {
        const pp_op *op = &p->ops[s][m->pc[s]];
        int second, w = waits_for(k, s, op, &second);
        if (w < 0 || m->done[s][w]) w = second;
        pp_op_describe(op, d, sizeof d);
        if (w >= 0) pp_op_describe(&p->ops[s][w], e, sizeof e);
        else snprintf(e, sizeof e, "nothing");
        int n = snprintf(buf, len, "stage %d waits in %s for %s", s, d, e);
        used = n > 0 ? (size_t)n : 0;
    }
    int g = m->gnext[s] - 1;
    if (g < 0 || m->g[s][g].done) g = m->gnext[s];
    if (g < m->ng[s] && used < len) {
        const grp *gr = &m->g[s][g];
        for (int i = gr->first; i < gr->first + gr->n; i++) {
            if (m->done[s][i]) continue;
            int peer, vs;
            peer_of(k, s, &p->ops[s][i], &peer, &vs);
            pp_op_describe(&p->ops[s][i], d, sizeof d);
            snprintf(buf + used, len - used, "%sits communication is stuck at %s %s stage %d (%s)",
                     used ? "; " : "", d, is_send(p->ops[s][i].kind) ? "to" : "from", peer,
                     gr->posted ? "posted, the peer's match is not" : "queued behind earlier groups or not reached");
            break;
        }
    }
}

static zero_status simulate(chk *k)
{
    pp_plan *p = k->p;
    const int P = k->P;
    const double unit = 1.0 / k->V;
    sim m;
    memset(&m, 0, sizeof m);
    m.g = calloc((size_t)P, sizeof *m.g);
    m.ng = calloc((size_t)P, sizeof(int)), m.gnext = calloc((size_t)P, sizeof(int)), m.pc = calloc((size_t)P, sizeof(int));
    m.t = calloc((size_t)P, sizeof(double)), m.busy = calloc((size_t)P, sizeof(double));
    m.start = malloc(sizeof(double) * (size_t)P);
    m.posted = calloc((size_t)P, sizeof *m.posted), m.done = calloc((size_t)P, sizeof *m.done);
    m.tp = calloc((size_t)P, sizeof *m.tp), m.td = calloc((size_t)P, sizeof *m.td);
    zero_status st = ZERO_OK;
    int bad = !m.g || !m.ng || !m.gnext || !m.pc || !m.t || !m.busy || !m.start || !m.posted || !m.done || !m.tp || !m.td;
    for (int s = 0; s < P && !bad; s++) {
        int n = p->count[s];
        m.start[s] = -1;
        m.g[s] = calloc((size_t)n + 1, sizeof(grp));
        m.posted[s] = calloc((size_t)n + 1, 1), m.done[s] = calloc((size_t)n + 1, 1);
        m.tp[s] = calloc((size_t)n + 1, sizeof(double)), m.td[s] = calloc((size_t)n + 1, sizeof(double));
        bad |= !m.g[s] || !m.posted[s] || !m.done[s] || !m.tp[s] || !m.td[s];
        for (int i = 0; i < n && !bad; i++) {
            if (!is_comm_kind(p->ops[s][i].kind)) {
                k->gid[s][i] = -1;
                continue;
            }
            if (!p->ops[s][i].group) m.g[s][m.ng[s]++] = (grp){i, 0, 0, 0, 0, 0, 0, 0};
            m.g[s][m.ng[s] - 1].n++;
            k->gid[s][i] = m.ng[s] - 1;
        }
    }
    if (bad) {
        st = gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_check: out of memory");
        goto out;
    }
    for (int progress = 1; progress;) {
        progress = 0;
        for (int s = 0; s < P; s++) {
            /* the host: issue comm groups without waiting, compute when inputs are there */
            while (m.pc[s] < p->count[s]) {
                int i = m.pc[s];
                const pp_op *op = &p->ops[s][i];
                if (is_comm_kind(op->kind)) {
                    grp *g = &m.g[s][k->gid[s][i]];
                    if (!g->issued) g->issued = 1, g->t_issue = m.t[s];
                    m.pc[s]++;
                    progress = 1;
                    continue;
                }
                int second, w = waits_for(k, s, op, &second);
                if ((w >= 0 && !m.done[s][w]) || (second >= 0 && !m.done[s][second])) break;
                double start = m.t[s];
                if (w >= 0) start = dmax(start, m.td[s][w]);
                if (second >= 0) start = dmax(start, m.td[s][second]);
                const double d = k->cost ? k->cost[op->kind] : unit;
                if (m.start[s] < 0) m.start[s] = start;
                m.t[s] = start + d;
                m.busy[s] += d;
                m.pc[s]++;
                progress = 1;
            }
            /* the stage's comm stream: a group starts when issued and the one before it is done */
            while (m.gnext[s] < m.ng[s]) {
                grp *g = &m.g[s][m.gnext[s]];
                const grp *prev = m.gnext[s] ? &m.g[s][m.gnext[s] - 1] : NULL;
                if (!g->issued || (prev && !prev->done)) break;
                g->posted = 1;
                g->t_post = prev ? dmax(g->t_issue, prev->t_done) : g->t_issue;
                for (int i = g->first; i < g->first + g->n; i++) m.posted[s][i] = 1, m.tp[s][i] = g->t_post;
                m.gnext[s]++;
                progress = 1;
                break; /* the next one waits for this one */
            }
        }
        /* rendezvous: an op completes once its match is posted too */
        for (int s = 0; s < P; s++) {
            if (!m.gnext[s]) continue;
            grp *g = &m.g[s][m.gnext[s] - 1];
            if (g->done) continue;
            int all = 1;
            double td = g->t_post;
            for (int i = g->first; i < g->first + g->n; i++) {
                if (!m.done[s][i]) {
                    int ps = k->partner_s[s][i], pi = k->partner_i[s][i];
                    if (m.posted[ps][pi]) {
                        double t = dmax(m.tp[s][i], m.tp[ps][pi]);
                        m.done[s][i] = m.done[ps][pi] = 1;
                        m.td[s][i] = m.td[ps][pi] = t;
                        progress = 1;
                    }
                }
                if (!m.done[s][i]) all = 0;
                else td = dmax(td, m.td[s][i]);
            }
            if (all) g->done = 1, g->t_done = td, progress = 1;
        }
    }
    double makespan = 0;
    int stuck = 0;
    for (int s = 0; s < P; s++) {
        if (m.pc[s] < p->count[s] || (m.ng[s] && !m.g[s][m.ng[s] - 1].done)) stuck = 1;
        makespan = dmax(makespan, m.t[s]);
    }
    if (stuck && k->stuck_first)
        for (int s = 0; s < P; s++) {
            k->stuck_first[s] = -1;
            int g = m.gnext[s] - 1;
            if (g >= 0 && !m.g[s][g].done) k->stuck_first[s] = m.g[s][g].first;
        }
    if (stuck) {
        char msg[900];
        size_t used = 0;
        for (int s = 0; s < P && used + 8 < sizeof msg; s++) {
            if (m.pc[s] >= p->count[s] && (!m.ng[s] || m.g[s][m.ng[s] - 1].done)) continue;
            char line[300];
            describe_stuck(k, &m, s, line, sizeof line);
            int w = snprintf(msg + used, sizeof msg - used, "%s%s", used ? "; " : "", line);
            if (w < 0) break;
            used += (size_t)w;
        }
        st = gpt_fail(ZERO_CONFIG,
                      "pipeline schedule '%s' (%d stages, %d chunks, %d micro-batches) would deadlock (sends and "
                      "receives block until both sides are posted, in each stage's order): %s",
                      p->name, p->stages, p->chunks, p->micro_batches, msg);
        goto out;
    }
    p->makespan = makespan;
    double idle = 0;
    for (int s = 0; s < P; s++) idle += makespan > 0 ? 1.0 - m.busy[s] / makespan : 0;
    p->bubble = idle / P;
    /* steps overlapping: a stage idles only inside its span (first op's start
     * to last op's end), the period being the longest span */
    double period = 0;
    for (int s = 0; s < P; s++) period = dmax(period, m.start[s] >= 0 ? m.t[s] - m.start[s] : 0);
    idle = 0;
    for (int s = 0; s < P; s++) idle += period > 0 ? 1.0 - m.busy[s] / period : 0;
    p->overlap_bubble = idle / P;
out:
    sim_free(&m, P);
    return st;
}

/* ------------------------------------------------------------ entry */
zero_status pp_plan_check(pp_plan *p) { return pp_plan_check_stuck(p, NULL); }

static zero_status check_costed(pp_plan *p, int *stuck_first, const double *cost);

zero_status pp_plan_check_stuck(pp_plan *p, int *stuck_first) { return check_costed(p, stuck_first, NULL); }

zero_status pp_plan_bubble_for(pp_plan *p, double f, double b, double w, double *bubble, double *makespan)
{
    if (!p || !p->checked || !bubble)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_plan_bubble_for: no checked plan or bubble is NULL");
    if (!(f >= 0) || !(b >= 0) || !(w >= 0) || f + b + w <= 0)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_plan_bubble_for: op times F %g, B %g, W %g", f, b, w);
    const double cost[3] = {f, b, w}, unit_bubble = p->bubble, unit_makespan = p->makespan,
                 unit_overlap = p->overlap_bubble;
    zero_status st = check_costed(p, NULL, cost);
    *bubble = p->bubble;
    if (makespan) *makespan = p->makespan;
    p->bubble = unit_bubble, p->makespan = unit_makespan; /* the plan keeps its unit-time figures */
    p->overlap_bubble = unit_overlap;
    return st;
}

static zero_status check_costed(pp_plan *p, int *stuck_first, const double *cost)
{
    if (!p || !p->ops || !p->count) return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_plan_check: no plan");
    free(p->peak_live), free(p->peak_stage), free(p->slots), free(p->slot_of), free(p->landing), free(p->landing_of);
    p->peak_live = NULL, p->peak_stage = NULL, p->slots = p->slot_of = p->landing = p->landing_of = NULL;
    p->checked = 0;
    chk k;
    memset(&k, 0, sizeof k);
    k.p = p, k.P = p->stages, k.V = p->chunks, k.M = p->micro_batches;
    k.stuck_first = stuck_first;
    k.cost = cost;
    size_t nkey = (size_t)k.P * k.V * k.M;
    zero_status st = ZERO_OK;
    int bad = 0;
    for (int t = 0; t < NKINDS; t++) {
        k.idx[t] = malloc(sizeof(int) * nkey);
        bad |= !k.idx[t];
        for (size_t i = 0; k.idx[t] && i < nkey; i++) k.idx[t][i] = -1;
    }
    k.gid = calloc((size_t)k.P, sizeof *k.gid);
    k.partner_s = calloc((size_t)k.P, sizeof *k.partner_s);
    k.partner_i = calloc((size_t)k.P, sizeof *k.partner_i);
    bad |= !k.gid || !k.partner_s || !k.partner_i;
    for (int s = 0; s < k.P && !bad; s++) {
        size_t n = (size_t)p->count[s] + 1;
        k.gid[s] = malloc(sizeof(int) * n), k.partner_s[s] = malloc(sizeof(int) * n), k.partner_i[s] = malloc(sizeof(int) * n);
        bad |= !k.gid[s] || !k.partner_s[s] || !k.partner_i[s];
    }
    if (bad) st = gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_check: out of memory");
    if (st == ZERO_OK) st = check_ops(&k);
    if (st == ZERO_OK) st = check_complete(&k);
    if (st == ZERO_OK) st = check_messages(&k);
    if (st == ZERO_OK) st = assign_slots(&k);
    if (st == ZERO_OK) st = simulate(&k);
    for (int t = 0; t < NKINDS; t++) free(k.idx[t]);
    for (int s = 0; s < k.P; s++) {
        if (k.gid) free(k.gid[s]);
        if (k.partner_s) free(k.partner_s[s]);
        if (k.partner_i) free(k.partner_i[s]);
    }
    free(k.gid), free(k.partner_s), free(k.partner_i), free(k.prev_in_slot);
    if (st == ZERO_OK) p->checked = 1;
    return st;
}
