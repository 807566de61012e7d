/* Pipeline schedules as data: building plans, the generators, and the
 * checker (validation + a simulation of the runtime's rules; pp_plan.h). */
#include "pp_plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"

/* ------------------------------------------------------------ names */
static const char *const sched_names[PP_SCHED_COUNT] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"};

const char *pp_schedule_name(pp_schedule_kind kind)
{
    return (int)kind >= 0 && kind < PP_SCHED_COUNT ? sched_names[kind] : NULL;
}

zero_status pp_schedule_parse(const char *name, pp_schedule_kind *out)
{
    for (int k = 0; k < PP_SCHED_COUNT && name; k++)
        if (strcmp(name, sched_names[k]) == 0) {
            *out = (pp_schedule_kind)k;
            return ZERO_OK;
        }
    return gpt_fail(ZERO_INVALID_ARGUMENT,
                    "pipeline schedule '%s' is not one of gpipe, 1f1b, interleaved, zb-h1, zb-h2", name ? name : "(null)");
}

static const char *const op_names[] = {"F", "B", "W", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD"};

void pp_op_describe(const pp_op *op, char *buf, size_t len)
{
    const char *n = op->kind <= PP_OP_RECV_GRAD ? op_names[op->kind] : "?";
    snprintf(buf, len, "%s(micro-batch %d, chunk %d)", n, (int)op->micro, (int)op->chunk);
}

/* ------------------------------------------------------------ building */
zero_status pp_plan_init(pp_plan *plan, int stages, int chunks, int micro_batches, const char *name)
{
    if (!plan) return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_plan_init: plan is NULL");
    memset(plan, 0, sizeof *plan);
    if (stages < 1 || chunks < 1 || micro_batches < 1 || stages > 4096 || chunks > 256 || micro_batches > 1 << 20)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_plan_init: %d stages x %d chunks x %d micro-batches is invalid",
                        stages, chunks, micro_batches);
    plan->stages = stages;
    plan->chunks = chunks;
    plan->micro_batches = micro_batches;
    snprintf(plan->name, sizeof plan->name, "%s", name ? name : "custom");
    plan->count = calloc((size_t)stages, sizeof *plan->count);
    plan->ops = calloc((size_t)stages, sizeof *plan->ops);
    if (!plan->count || !plan->ops) {
        pp_plan_free(plan);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_init: out of memory");
    }
    return ZERO_OK;
}

void pp_plan_free(pp_plan *plan)
{
    if (!plan) return;
    if (plan->ops)
        for (int s = 0; s < plan->stages; s++) free(plan->ops[s]);
    free(plan->ops);
    free(plan->count);
    free(plan->peak_live);
    free(plan->peak_stage);
    free(plan->slots);
    free(plan->slot_of);
    free(plan->landing);
    free(plan->landing_of);
    memset(plan, 0, sizeof *plan);
}

zero_status pp_plan_add(pp_plan *plan, int stage, pp_op_kind kind, int micro, int chunk, int group)
{
    if (!plan || !plan->ops || stage < 0 || stage >= plan->stages)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_plan_add: no plan or stage %d out of range", stage);
    int n = plan->count[stage];
    if (n == 0 || (n >= 8 && (n & (n - 1)) == 0)) { /* capacity: 8, then doubling */
        pp_op *o = realloc(plan->ops[stage], sizeof *o * (size_t)(n ? 2 * n : 8));
        if (!o) return gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_add: out of memory");
        plan->ops[stage] = o;
    }
    pp_op *op = &plan->ops[stage][n];
    op->kind = (uint8_t)kind;
    op->group = (uint8_t)(group ? 1 : 0);
    op->chunk = (uint16_t)chunk;
    op->micro = micro;
    plan->count[stage] = n + 1;
    plan->checked = 0;
    return ZERO_OK;
}

/* ------------------------------------------------------------ generators
 * A generator gives each stage's COMPUTE order (F, B, W); add_comms then
 * inserts the sends and receives the same way for every schedule: each send
 * right after the op that produced it, in one group with the receive of the
 * next op that needs one unless another send comes first (so two neighbours
 * exchanging in both directions pair up, as Megatron's
 * send_forward_recv_backward; the receive is issued early, its op waits for
 * it); a receive not paired that way goes alone right before its op. A B immediately followed by its W is one
 * unsplit backward at run time. */
typedef struct compute_list {
    pp_op *ops;
    int n, cap;
} compute_list;

static int cl_push(compute_list *l, int kind, int m, int c)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        pp_op *o = realloc(l->ops, sizeof *o * (size_t)cap);
        if (!o) return -1;
        l->ops = o;
        l->cap = cap;
    }
    l->ops[l->n++] = (pp_op){(uint8_t)kind, 0, (uint16_t)c, m};
    return 0;
}

/* The receive compute op `op` needs on stage s (-1: none). */
static int recv_needed(const pp_plan *p, int s, const pp_op *op)
{
    int q = pp_virtual_stage(p->stages, s, op->chunk), last = p->stages * p->chunks - 1;
    if (op->kind == PP_OP_F && q > 0) return PP_OP_RECV_ACT;
    if (op->kind == PP_OP_B && q < last) return PP_OP_RECV_GRAD;
    return -1;
}

static int send_made(const pp_plan *p, int s, const pp_op *op)
{
    int q = pp_virtual_stage(p->stages, s, op->chunk), last = p->stages * p->chunks - 1;
    if (op->kind == PP_OP_F && q < last) return PP_OP_SEND_ACT;
    if (op->kind == PP_OP_B && q > 0) return PP_OP_SEND_GRAD;
    return -1;
}

static zero_status add_comms(pp_plan *p, int s, const compute_list *l)
{
    int next_recv = 0; /* compute ops before this index have their receive issued */
    for (int i = 0; i < l->n; i++) {
        const pp_op *op = &l->ops[i];
        if (i >= next_recv) {
            int r = recv_needed(p, s, op);
            if (r >= 0) GPT_TRY(pp_plan_add(p, s, (pp_op_kind)r, op->micro, op->chunk, 0));
            next_recv = i + 1;
        }
        GPT_TRY(pp_plan_add(p, s, (pp_op_kind)op->kind, op->micro, op->chunk, 0));
        /* an unsplit backward (W right after its B) sends after the W */
        if (op->kind == PP_OP_B && i + 1 < l->n && l->ops[i + 1].kind == PP_OP_W && l->ops[i + 1].micro == op->micro &&
            l->ops[i + 1].chunk == op->chunk) {
            i++;
            GPT_TRY(pp_plan_add(p, s, PP_OP_W, op->micro, op->chunk, 0));
        }
        int snd = send_made(p, s, op);
        if (snd < 0) continue;
        GPT_TRY(pp_plan_add(p, s, (pp_op_kind)snd, op->micro, op->chunk, 0));
        /* pair the send with the receive of the next op that needs one,
         * unless another send comes first */
        for (int j = next_recv > i + 1 ? next_recv : i + 1; j < l->n; j++) {
            int r = recv_needed(p, s, &l->ops[j]);
            if (r < 0) {
                if (send_made(p, s, &l->ops[j]) >= 0) break;
                continue;
            }
            GPT_TRY(pp_plan_add(p, s, (pp_op_kind)r, l->ops[j].micro, l->ops[j].chunk, 1));
            next_recv = j + 1;
            break;
        }
    }
    return ZERO_OK;
}

static void gen_gpipe(const pp_plan *p, int s, compute_list *l, int *bad)
{
    (void)s;
    for (int m = 0; m < p->micro_batches; m++) *bad |= cl_push(l, PP_OP_F, m, 0);
    for (int m = 0; m < p->micro_batches; m++) {
        *bad |= cl_push(l, PP_OP_B, m, 0);
        *bad |= cl_push(l, PP_OP_W, m, 0);
    }
}

static void gen_1f1b(const pp_plan *p, int s, compute_list *l, int *bad)
{
    int M = p->micro_batches, warm = p->stages - s - 1;
    if (warm > M) warm = M;
    for (int m = 0; m < warm; m++) *bad |= cl_push(l, PP_OP_F, m, 0);
    for (int j = 0; j < M - warm; j++) {
        *bad |= cl_push(l, PP_OP_F, warm + j, 0);
        *bad |= cl_push(l, PP_OP_B, j, 0);
        *bad |= cl_push(l, PP_OP_W, j, 0);
    }
    for (int j = M - warm; j < M; j++) {
        *bad |= cl_push(l, PP_OP_B, j, 0);
        *bad |= cl_push(l, PP_OP_W, j, 0);
    }
}

/* Megatron's interleaved 1F1B, compute and communication together (its
 * lockstep grouping: after each forward-backward step ONE group sends both
 * outputs and receives both next inputs; the generic add_comms pairing would
 * deadlock here, the neighbours' phases being two steps apart). The k-th
 * forward of a stage is chunk (k / p) % v of micro-batch (k / (p v)) p + k % p;
 * backwards run the chunks in reverse; (p - s - 1) * 2 + (v - 1) * p warm-up
 * forwards. */
typedef struct ilv {
    pp_plan *p;
    int s, P, V, K, last;
    unsigned char *ra_done, *rg_done; /* [k]: the receive for forward / backward k was issued */
} ilv;

static int ilv_fc(const ilv *g, int k) { return (k / g->P) % g->V; }
static int ilv_bc(const ilv *g, int k) { return g->V - 1 - (k / g->P) % g->V; }
static int ilv_m(const ilv *g, int k) { return (k / (g->P * g->V)) * g->P + k % g->P; }

/* One group after a step: the sends of forward kf and backward kb (-1: none)
 * and the receives of forward kf + 1 and backward kb + 1. */
static zero_status ilv_group(ilv *g, int kf, int kb, int recv_f, int recv_b)
{
    int n = 0;
    if (kf >= 0 && ilv_fc(g, kf) * g->P + g->s < g->last)
        GPT_TRY(pp_plan_add(g->p, g->s, PP_OP_SEND_ACT, ilv_m(g, kf), ilv_fc(g, kf), n++ > 0));
    if (kb >= 0 && ilv_bc(g, kb) * g->P + g->s > 0)
        GPT_TRY(pp_plan_add(g->p, g->s, PP_OP_SEND_GRAD, ilv_m(g, kb), ilv_bc(g, kb), n++ > 0));
    int f = recv_f, b = recv_b;
    if (f >= 0 && f < g->K && ilv_fc(g, f) * g->P + g->s > 0 && !g->ra_done[f]) {
        GPT_TRY(pp_plan_add(g->p, g->s, PP_OP_RECV_ACT, ilv_m(g, f), ilv_fc(g, f), n++ > 0));
        g->ra_done[f] = 1;
    }
    if (b >= 0 && b < g->K && ilv_bc(g, b) * g->P + g->s < g->last && !g->rg_done[b]) {
        GPT_TRY(pp_plan_add(g->p, g->s, PP_OP_RECV_GRAD, ilv_m(g, b), ilv_bc(g, b), n++ > 0));
        g->rg_done[b] = 1;
    }
    return ZERO_OK;
}

static zero_status ilv_forward(ilv *g, int k)
{
    GPT_TRY(ilv_group(g, -1, -1, k, -1)); /* its receive, if no group brought it */
    return pp_plan_add(g->p, g->s, PP_OP_F, ilv_m(g, k), ilv_fc(g, k), 0);
}

static zero_status ilv_backward(ilv *g, int k)
{
    GPT_TRY(ilv_group(g, -1, -1, -1, k));
    GPT_TRY(pp_plan_add(g->p, g->s, PP_OP_B, ilv_m(g, k), ilv_bc(g, k), 0));
    return pp_plan_add(g->p, g->s, PP_OP_W, ilv_m(g, k), ilv_bc(g, k), 0);
}

static zero_status gen_interleaved(pp_plan *p, int s)
{
    ilv g = {p, s, p->stages, p->chunks, p->micro_batches * p->chunks, p->stages * p->chunks - 1, NULL, NULL};
    g.ra_done = calloc((size_t)g.K, 1);
    g.rg_done = calloc((size_t)g.K, 1);
    zero_status st = ZERO_OK;
    if (!g.ra_done || !g.rg_done) st = gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_generate: out of memory");
    int warm = (g.P - s - 1) * 2 + (g.V - 1) * g.P;
    if (warm > g.K) warm = g.K;
    for (int k = 0; k < warm && st == ZERO_OK; k++) {
        st = ilv_forward(&g, k);
        /* the last warm-up step also receives the first backward's gradient */
        if (st == ZERO_OK) st = ilv_group(&g, k, -1, k + 1, k == warm - 1 && warm < g.K ? 0 : -1);
    }
    for (int j = 0; j < g.K - warm && st == ZERO_OK; j++) {
        st = ilv_forward(&g, warm + j);
        if (st == ZERO_OK) st = ilv_backward(&g, j);
        if (st == ZERO_OK) st = ilv_group(&g, warm + j, j, warm + j + 1, j + 1);
    }
    for (int j = g.K - warm; j < g.K && st == ZERO_OK; j++) {
        st = ilv_backward(&g, j);
        if (st == ZERO_OK) st = ilv_group(&g, -1, j, -1, j + 1);
    }
    free(g.ra_done), free(g.rg_done);
    return st;
}

/* ZB-H1 as Qi et al. hand it (ICLR 2024, figure 3): 1F1B whose stage s
 * defers s of its W's. Per stage: p - s - 1 warm-up forwards; s steps of F
 * then B without its W; then F, B, W (the W of the oldest B whose W is
 * pending, so W's run in micro-batch order) while forwards remain; then B,
 * W; then the s deferred W's, which run where 1F1B's stage s waits for
 * the later stages' backwards in the cool-down. Every stage holds at most p
 * micro-batches between F and W (1F1B's first stage's peak), and with F = B
 * = W the step is (p - 1) x (F + B - W) longer than the work: 27 units for
 * 24 of work at p = 4, M = 8 (1F1B: 33). */
static void gen_zb_h1(const pp_plan *p, int s, compute_list *l, int *bad)
{
    const int M = p->micro_batches;
    int nf = 0, nb = 0, nw = 0, warm = p->stages - s - 1;
    for (; nf < warm && nf < M; nf++) *bad |= cl_push(l, PP_OP_F, nf, 0);
    for (int k = 0; k < s && nf < M; k++) {
        *bad |= cl_push(l, PP_OP_F, nf++, 0);
        *bad |= cl_push(l, PP_OP_B, nb++, 0);
    }
    while (nf < M) {
        *bad |= cl_push(l, PP_OP_F, nf++, 0);
        *bad |= cl_push(l, PP_OP_B, nb++, 0);
        *bad |= cl_push(l, PP_OP_W, nw++, 0);
    }
    while (nb < M) {
        *bad |= cl_push(l, PP_OP_B, nb++, 0);
        *bad |= cl_push(l, PP_OP_W, nw++, 0);
    }
    while (nw < M) *bad |= cl_push(l, PP_OP_W, nw++, 0);
}

/* ZB-H2 as Qi et al. hand it (ICLR 2024, figure 4): ZB-H1 with p - s - 1
 * more warm-up forwards on stage s (they fill the wait for the first B that
 * 1F1B and ZB-H1 have there: 2(p - s - 1) + 1 in all) and W's that lag 2s
 * behind the B's instead of s. Per stage: the warm-up forwards; then B, the
 * W of the oldest B whose W is pending when more than 2s are (so the first
 * 2s W's wait), F, while forwards remain; then B and that W; then the 2s
 * deferred W's. With F = B = W every stage then runs without a gap from its
 * first op to its last (3M units), stage s from s on: the "parallelogram"
 * the paper gets by reordering the tail's W's, whose p - 1 idle units per
 * stage at the start and the end vanish when steps overlap (this runtime
 * flushes, so one step still has ZB-H1's p - 1). Every stage holds at most
 * min(2p - 1, M) micro-batches between F and W (the paper's (2p - 1) M_B; the
 * first stage reaches it at the end of its warm-up, stage s after 2s
 * deferred W's). */
static void gen_zb_h2(const pp_plan *p, int s, compute_list *l, int *bad)
{
    const int M = p->micro_batches, few = M - (p->stages - s); /* with few micro-batches the cool-down is */
    const int defer = few < 2 * s ? (few > 0 ? few : 0) : 2 * s; /* shorter: fewer gaps for deferred W's */
    int nf = 0, nb = 0, nw = 0, warm = 2 * (p->stages - s - 1) + 1;
    for (; nf < warm && nf < M; nf++) *bad |= cl_push(l, PP_OP_F, nf, 0);
    while (nb < M) {
        *bad |= cl_push(l, PP_OP_B, nb++, 0);
        if (nb - nw > defer) *bad |= cl_push(l, PP_OP_W, nw++, 0);
        if (nf < M) *bad |= cl_push(l, PP_OP_F, nf++, 0);
    }
    while (nw < M) *bad |= cl_push(l, PP_OP_W, nw++, 0);
}

/* ZB-H2's communication. add_comms issues a receive right before the send
 * that precedes its op, which suits 1F1B's lockstep; ZB-H2's extra
 * warm-up forwards reach the next stage several steps before it asks for
 * them, and a send blocks its stage's in-order comm stream until the peer
 * posts the receive, which delays that stage's own receives (28 units at
 * p = 4, M = 8 instead of 27). So each transfer is placed where the
 * schedule in unit time (F = B = W = 1, communication free) puts it: the
 * send right after the op that makes it, the receive in the group its
 * stage issues at that same moment, all transfers a stage issues at one
 * moment in one group. Both ends then post together and no stream waits. */
typedef struct timed_op {
    int t, compute, seq; /* a transfer at moment t comes before an op that starts at t */
    pp_op op;
} timed_op;

static int timed_cmp(const void *a, const void *b)
{
    const timed_op *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if (x->compute != y->compute) return x->compute - y->compute;
    return x->seq - y->seq;
}

static zero_status add_timed_comms(pp_plan *p, const compute_list *lists)
{
    const int P = p->stages, M = p->micro_batches;
    int *f_end = malloc(sizeof(int) * (size_t)P * (size_t)M), *b_end = malloc(sizeof(int) * (size_t)P * (size_t)M);
    int *start = NULL, *first = calloc((size_t)P + 1, sizeof(int)), *now = calloc(2 * (size_t)P, sizeof(int));
    int *at = now + P; /* per stage: the unit-time clock, the next op of its list */
    timed_op *ev = NULL;
    zero_status st = ZERO_OK;
    if (!f_end || !b_end || !first || !now) goto oom;
    for (int s = 0; s < P; s++) first[s + 1] = first[s] + lists[s].n;
    start = malloc(sizeof(int) * (size_t)(first[P] ? first[P] : 1));
    ev = malloc(sizeof(timed_op) * (size_t)(3 * (first[P] ? first[P] : 1)));
    if (!start || !ev) goto oom;
    for (int i = 0; i < P * M; i++) f_end[i] = b_end[i] = -1;
    /* the unit-time schedule: each stage runs its list in order, an op as
     * soon as its input is made (here or on the neighbour) */
    int done = 0;
    for (int progress = 1; progress && done < first[P];) {
        progress = 0;
        for (int s = 0; s < P; s++)
            for (; at[s] < lists[s].n; at[s]++, done++, progress = 1) {
                const pp_op *o = &lists[s].ops[at[s]];
                int t = now[s], dep = 0;
                if (o->kind == PP_OP_F && s > 0) dep = f_end[(s - 1) * M + o->micro];
                if (o->kind == PP_OP_B && s < P - 1) dep = b_end[(s + 1) * M + o->micro];
                if (dep < 0) break;
                t = t > dep ? t : dep;
                start[first[s] + at[s]] = t;
                now[s] = t + 1;
                if (o->kind == PP_OP_F) f_end[s * M + o->micro] = t + 1;
                if (o->kind == PP_OP_B) b_end[s * M + o->micro] = t + 1;
            }
    }
    if (done < first[P]) {
        st = gpt_fail(ZERO_INTERNAL, "pp_plan_generate: %s's compute order waits on itself", p->name);
        goto out;
    }
    for (int s = 0; s < P && st == ZERO_OK; s++) {
        int n = 0;
        for (int i = 0; i < lists[s].n; i++) {
            const pp_op *o = &lists[s].ops[i];
            const int m = o->micro, t = start[first[s] + i];
            ev[n] = (timed_op){t, 1, n, *o};
            n++;
            if (o->kind == PP_OP_F && s > 0) /* its input arrives when the previous stage sends it */
                ev[n] = (timed_op){f_end[(s - 1) * M + m], 0, n, {PP_OP_RECV_ACT, 0, 0, m}}, n++;
            if (o->kind == PP_OP_F && s < P - 1) ev[n] = (timed_op){t + 1, 0, n, {PP_OP_SEND_ACT, 0, 0, m}}, n++;
            if (o->kind == PP_OP_B && s < P - 1)
                ev[n] = (timed_op){b_end[(s + 1) * M + m], 0, n, {PP_OP_RECV_GRAD, 0, 0, m}}, n++;
            if (o->kind == PP_OP_B && s > 0) ev[n] = (timed_op){t + 1, 0, n, {PP_OP_SEND_GRAD, 0, 0, m}}, n++;
        }
        qsort(ev, (size_t)n, sizeof *ev, timed_cmp);
        for (int i = 0; i < n && st == ZERO_OK; i++) {
            int group = !ev[i].compute && i > 0 && !ev[i - 1].compute && ev[i - 1].t == ev[i].t;
            st = pp_plan_add(p, s, (pp_op_kind)ev[i].op.kind, ev[i].op.micro, 0, group);
        }
    }
    goto out;
oom:
    st = gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_generate: out of memory");
out:
    free(f_end), free(b_end), free(start), free(first), free(now), free(ev);
    return st;
}

/* The end of the group starting at op `first` of stage s (one past its last op). */
static int group_end_of(const pp_plan *p, int s, int first)
{
    int e = first + 1;
    while (e < p->count[s] && p->ops[s][e].group) e++;
    return e;
}

/* Move the group at [first, end) of stage s into the next group of the
 * stage: its sends go out later (always allowed), its receives are posted
 * later (allowed when no op before that group consumes them). 1 = done. */
static int merge_into_next(pp_plan *p, int s, int first)
{
    pp_op *ops = p->ops[s];
    int end = group_end_of(p, s, first), next = end;
    while (next < p->count[s] && ops[next].kind < PP_OP_SEND_ACT) next++;
    if (next >= p->count[s]) return 0;
    for (int i = first; i < end; i++) {
        int consumer = ops[i].kind == PP_OP_RECV_ACT ? PP_OP_F : ops[i].kind == PP_OP_RECV_GRAD ? PP_OP_B : -1;
        for (int j = end; consumer >= 0 && j < next; j++)
            if (ops[j].kind == consumer && ops[j].micro == ops[i].micro && ops[j].chunk == ops[i].chunk) return 0;
    }
    int n = end - first;
    pp_op tmp[64];
    if (n > 64) return 0;
    memcpy(tmp, ops + first, sizeof(pp_op) * (size_t)n);
    memmove(ops + first, ops + end, sizeof(pp_op) * (size_t)(next - end));
    int at = next - n; /* the moved group now ends right before the old next group */
    memcpy(ops + at, tmp, sizeof(pp_op) * (size_t)n);
    ops[at].group = 0;
    for (int i = at + 1; i < at + n; i++) ops[i].group = 1;
    ops[next].group = 1; /* the old next group joins */
    return 1;
}

/* add_comms' pairing is not enough when a stage talks both ways with a
 * neighbour in more than two phases (interleaved schedules): the checker's
 * simulation then finds a stage stuck in a group whose send the neighbour
 * only receives after a send of its own that waits for us. Merging that
 * group into the stage's next one (what Megatron does by hand, one group of
 * all four transfers per step) breaks the cycle; repeat until none is left. */
static zero_status repair_deadlocks(pp_plan *p)
{
    int *stuck = malloc(sizeof(int) * (size_t)p->stages);
    if (!stuck) return gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_generate: out of memory");
    zero_status st = ZERO_OK;
    for (int round = 0; round < 100000; round++) {
        st = pp_plan_check_stuck(p, stuck);
        if (st != ZERO_CONFIG) break;
        int fixed = 0;
        for (int s = 0; s < p->stages && !fixed; s++)
            if (stuck[s] >= 0) fixed = merge_into_next(p, s, stuck[s]);
        if (!fixed) break; /* keep the checker's message */
    }
    free(stuck);
    return st;
}

zero_status pp_plan_generate(pp_plan *plan, pp_schedule_kind kind, int stages, int micro_batches, int chunks)
{
    GPT_TRY(pp_plan_build(plan, kind, stages, micro_batches, chunks));
    zero_status st = pp_plan_check(plan);
    if (st != ZERO_OK) pp_plan_free(plan); /* keeps the checker's message */
    return st;
}

zero_status pp_plan_build(pp_plan *plan, pp_schedule_kind kind, int stages, int micro_batches, int chunks)
{
    if (!plan) return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_plan_generate: plan is NULL");
    memset(plan, 0, sizeof *plan);
    const char *name = pp_schedule_name(kind);
    if (!name) return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_plan_generate: unknown schedule %d", (int)kind);
    if (kind == PP_SCHED_INTERLEAVED) {
        if (chunks < 2 || stages < 2 || micro_batches % stages != 0)
            return gpt_fail(ZERO_CONFIG,
                            "pipeline schedule interleaved: needs at least 2 stages, 2 chunks per stage (virtual "
                            "stages) and micro-batches a multiple of the stages; got %d stages, %d chunks, %d "
                            "micro-batches",
                            stages, chunks, micro_batches);
    } else if (chunks != 1) {
        return gpt_fail(ZERO_CONFIG, "pipeline schedule %s: runs one chunk per stage, got %d (only interleaved has virtual stages)",
                        name, chunks);
    }
    GPT_TRY(pp_plan_init(plan, stages, chunks, micro_batches, name));
    compute_list *lists = calloc((size_t)stages, sizeof *lists);
    if (!lists) {
        pp_plan_free(plan);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_generate: out of memory");
    }
    zero_status st = ZERO_OK;
    int bad = 0;
    for (int s = 0; s < stages; s++) {
        if (kind == PP_SCHED_GPIPE) gen_gpipe(plan, s, &lists[s], &bad);
        else if (kind == PP_SCHED_1F1B) gen_1f1b(plan, s, &lists[s], &bad);
        else if (kind == PP_SCHED_ZB_H1) gen_zb_h1(plan, s, &lists[s], &bad);
        else if (kind == PP_SCHED_ZB_H2) gen_zb_h2(plan, s, &lists[s], &bad);
    }
    if (bad) st = gpt_fail(ZERO_OUT_OF_MEMORY, "pp_plan_generate: out of memory");
    if (kind == PP_SCHED_ZB_H2 && st == ZERO_OK) st = add_timed_comms(plan, lists);
    for (int s = 0; s < stages && st == ZERO_OK && kind != PP_SCHED_ZB_H2; s++)
        st = kind == PP_SCHED_INTERLEAVED ? gen_interleaved(plan, s) : add_comms(plan, s, &lists[s]);
    for (int s = 0; s < stages; s++) free(lists[s].ops);
    free(lists);
    if (st == ZERO_OK) st = repair_deadlocks(plan);
    if (st != ZERO_OK) pp_plan_free(plan);
    return st;
}

void pp_plan_print(const pp_plan *p, void *file)
{
    static const char *const shortn[] = {"F", "B", "W", "sa", "ra", "sg", "rg"};
    FILE *f = file;
    for (int s = 0; s < p->stages; s++) {
        fprintf(f, "stage %d:", s);
        for (int i = 0; i < p->count[s]; i++) {
            const pp_op *o = &p->ops[s][i];
            int open = o->kind >= PP_OP_SEND_ACT && !o->group && i + 1 < p->count[s] && p->ops[s][i + 1].group;
            int close = o->group && !(i + 1 < p->count[s] && p->ops[s][i + 1].group);
            fprintf(f, " %s%s%d.%d%s", open ? "[" : "", o->kind <= PP_OP_RECV_GRAD ? shortn[o->kind] : "?", (int)o->micro,
                    (int)o->chunk, close ? "]" : "");
        }
        fputc('\n', f);
    }
}
