/* The pipeline runtime: one stage executes its list of a checked plan
 * (pp_plan.h) through the stage interface (pp_stage.h: the CPU tp stage,
 * the CUDA stage), pp_gpt.h's pp_run_stage / pp_run_plan.
 *
 * Communication follows the rules the checker simulated: every send and
 * receive is issued asynchronously where the plan puts it, a group of them
 * between zero_comm_group_begin/end (one NCCL group), and nothing waits
 * until a compute op needs the data: F waits for its activation's receive
 * (into a landing buffer, copied into the slot's input), B for its
 * gradient's receive; a slot's previous holder's sends are waited before
 * the slot is overwritten. B followed at once by its W is one unsplit
 * backward (the stage's backward with whole = 1), else its B half now and
 * its W at the W. The transfer buffers are the stage's memory (alloc):
 * host arrays on the CPU, device buffers on CUDA.
 *
 * A stage with a stream (the CUDA stage) is ordered by events, as
 * pp_stage.h says: with a stream-ordered pp comm (zero_comm_set_stream) a
 * "wait" for a send or receive is the stage's stream waiting for the event
 * recorded on the comm's stream after its group, and each group waits on
 * the comm's stream for the compute issued before it; the host waits for
 * nothing until the end of the step (zero_comm_sync, then the stage's
 * finish). With a host-driven comm the host waits for the stage's stream
 * (one event) before issuing a group, and for requests as on the CPU.
 *
 * The events (one per group, and the one recorded on the stage's stream
 * before each group) and the step's bookkeeping arrays come from the
 * stage's pp_run_cache (pp_run_cache.h): made in a plan's first step, reused
 * by every later one. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt_internal.h"
#include "pp_gpt.h"
#include "pp_plan.h"
#include "pp_run_cache.h"
#include "pp_trace.h"

typedef struct run {
    const pp_stage *st;
    zero_comm *pp;
    const pp_plan *plan;
    const pp_step_args *a;
    const pp_run_opts *o;
    int s, P, V, M, last;
    size_t N, C, NT;               /* rows this rank holds of a message (x C floats); tokens of a micro-batch */
    zero_request **req;   /* [op index]: the stage's comm requests */
    zero_stream *S, *K;   /* the stage's stream (NULL: host compute); the comm's (NULL: host-driven comm) */
    zero_event *sev;      /* recorded on S before each group (the cache's) */
    zero_event **gev;     /* K: [op index] the event after the op's group, until a compute op waited for it */
    zero_event **evs;     /* K: the groups' events (the cache's, one per group), nev used of max_ev */
    int nev, max_ev;
    int *op_of[7];        /* [kind][c * M + m]: op index on this stage, -1 */
    int *prev;            /* [c * M + m]: micro-batch that held the slot before, -1 */
    float **landing;      /* [c][j]: incoming activations */
    float **gin, **gout;  /* [c][slot]: incoming / outgoing gradients */
    double loss_sum;
} run;

static zero_status comm_fail(const run *r, zero_status st, const char *what, int micro)
{
    return gpt_fail(st, "pipeline %s of micro-batch %d at stage %d of %d (group %s): %s", what, micro, r->s, r->P,
                    r->pp ? zero_comm_get_name(r->pp) : "none", r->pp ? zero_comm_last_error(r->pp) : "");
}

static const char *what_of(int kind)
{
    switch (kind) {
    case PP_OP_SEND_ACT: return "send of the activations";
    case PP_OP_RECV_ACT: return "receive of the activations";
    case PP_OP_SEND_GRAD: return "send of the input gradient";
    default: return "receive of the output gradient";
    }
}

static int key(const run *r, int c, int m) { return c * r->M + m; }
static int slot_of(const run *r, int c, int m) { return r->plan->slot_of[(r->s * r->V + c) * r->M + m]; }
static int vstage(const run *r, int c) { return c * r->P + r->s; }

static zero_status dev_fail(const run *r, zero_status st, const char *what)
{
    return gpt_fail(st, "pipeline stage %d of %d (%s stage): %s: %s", r->s, r->P, r->st->name, what,
                    zero_last_error());
}

/* Wait for comm op i (if it was issued and not yet waited). Stream-ordered
 * comm: the stage's stream waits for the op's group (the host does not). */
static zero_status wait_op(run *r, int i)
{
    if (i < 0) return ZERO_OK;
    if (r->K) {
        zero_event *ev = r->gev[i];
        if (!ev) return ZERO_OK;
        r->gev[i] = NULL;
        zero_status st = r->S ? zero_stream_wait_event(r->S, ev) : zero_event_sync(ev);
        return st == ZERO_OK ? ZERO_OK : dev_fail(r, st, "waiting for a group of sends / receives");
    }
    if (!r->req[i]) return ZERO_OK;
    double t0 = pp_now();
    zero_status st = zero_wait(r->req[i]);
    r->req[i] = NULL;
    if (r->o && r->o->trace && pp_now() - t0 > 1e-6) {
        const pp_op *op = &r->plan->ops[r->s][i];
        pp_trace_add(r->o->trace, PP_SPAN_COMM, op->micro, op->chunk, t0, pp_now());
    }
    if (st != ZERO_OK) {
        const pp_op *op = &r->plan->ops[r->s][i];
        return comm_fail(r, st, what_of(op->kind), op->micro);
    }
    return ZERO_OK;
}

static float *at(float *buf, size_t i, size_t n) { return buf + i * n; }

static zero_status issue(run *r, int i)
{
    const pp_op *op = &r->plan->ops[r->s][i];
    int c = op->chunk, m = op->micro, q = vstage(r, c);
    size_t n = r->N * r->C;
    zero_status st;
    /* stream-ordered comm: the blocking forms, enqueued on the comm's stream (no request) */
    zero_request **rq = r->K ? NULL : &r->req[i];
    const float *sbuf = NULL;
    float *rbuf = NULL;
    int peer;
    switch (op->kind) {
    case PP_OP_SEND_ACT:
        sbuf = r->st->output(r->st->self, c, slot_of(r, c, m)), peer = (q + 1) % r->P;
        break;
    case PP_OP_RECV_ACT:
        rbuf = r->landing[c] + (size_t)r->plan->landing_of[(r->s * r->V + c) * r->M + m] * n;
        peer = (q - 1 + r->P) % r->P;
        break;
    case PP_OP_SEND_GRAD:
        sbuf = r->gout[c] + (size_t)slot_of(r, c, m) * n, peer = (q - 1 + r->P) % r->P;
        break;
    default:
        rbuf = r->gin[c] + (size_t)slot_of(r, c, m) * n, peer = (q + 1) % r->P;
        break;
    }
    if (sbuf) st = rq ? zero_send_async(r->pp, sbuf, n, ZERO_F32, peer, rq) : zero_send(r->pp, sbuf, n, ZERO_F32, peer);
    else st = rq ? zero_recv_async(r->pp, rbuf, n, ZERO_F32, peer, rq) : zero_recv(r->pp, rbuf, n, ZERO_F32, peer);
    return st == ZERO_OK ? ZERO_OK : comm_fail(r, st, what_of(op->kind), m);
}

/* ------------------------------------------------------------ compute */
static void sim_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static zero_status forward(run *r, int c, int m)
{
    const pp_step_args *a = r->a;
    const pp_stage *st = r->st;
    int slot = slot_of(r, c, m), q = vstage(r, c), pk = r->prev[key(r, c, m)];
    const float *in = NULL;
    if (pk >= 0) GPT_TRY(wait_op(r, r->op_of[PP_OP_SEND_ACT][key(r, c, pk)])); /* the slot's output is rewritten */
    if (q > 0) {
        GPT_TRY(wait_op(r, r->op_of[PP_OP_RECV_ACT][key(r, c, m)]));
        in = at(r->landing[c], (size_t)r->plan->landing_of[(r->s * r->V + c) * r->M + m], r->N * r->C);
    }
    double t0 = pp_now();
    if (r->o && r->o->simulate_op_s > 0) {
        sim_sleep(r->o->simulate_op_s);
    } else {
        float loss = 0.0f;
        GPT_TRY(st->forward(st->self, c, slot, in, q == 0 ? a->tokens + (size_t)m * r->NT : NULL,
                            q == r->last ? a->targets + (size_t)m * r->NT : NULL, a->params, &loss));
        r->loss_sum += loss; /* the last stage's; with MoE every stage adds its blocks' aux losses */
    }
    pp_trace_add(r->o ? r->o->trace : NULL, PP_SPAN_FORWARD, m, c, t0, pp_now());
    return ZERO_OK;
}

/* B (whole = 1: with its W, the unsplit backward). */
static zero_status backward(run *r, int c, int m, int whole)
{
    const pp_step_args *a = r->a;
    const pp_stage *st = r->st;
    int slot = slot_of(r, c, m), q = vstage(r, c), pk = r->prev[key(r, c, m)];
    size_t n = r->N * r->C;
    const float *dout = NULL;
    if (pk >= 0) GPT_TRY(wait_op(r, r->op_of[PP_OP_SEND_GRAD][key(r, c, pk)])); /* gout[slot] is rewritten */
    if (q < r->last) {
        GPT_TRY(wait_op(r, r->op_of[PP_OP_RECV_GRAD][key(r, c, m)]));
        dout = at(r->gin[c], (size_t)slot, n);
    }
    double t0 = pp_now();
    if (r->o && r->o->simulate_op_s > 0) {
        sim_sleep(r->o->simulate_op_s * (whole ? 2 : 1));
        pp_trace_add(r->o->trace, PP_SPAN_BACKWARD, m, c, t0, pp_now());
        return ZERO_OK;
    }
    GPT_TRY(st->backward(st->self, c, slot, whole, dout, q == 0 ? NULL : at(r->gout[c], (size_t)slot, n), a->dloss,
                         a->params, a->grads));
    pp_trace_add(r->o ? r->o->trace : NULL, PP_SPAN_BACKWARD, m, c, t0, pp_now());
    return ZERO_OK;
}

static zero_status weight(run *r, int c, int m)
{
    double t0 = pp_now();
    if (r->o && r->o->simulate_op_s > 0) sim_sleep(r->o->simulate_op_s);
    else GPT_TRY(r->st->weight(r->st->self, c, slot_of(r, c, m), r->a->grads));
    pp_trace_add(r->o ? r->o->trace : NULL, PP_SPAN_WEIGHT_GRAD, m, c, t0, pp_now());
    return ZERO_OK;
}

/* ------------------------------------------------------------ ordering by events */
/* Before a group: what the compute issued so far wrote (a send's buffer) is
 * complete, and what it reads (a receive's buffer's previous contents) is
 * read, before the group touches them - on the comm's stream (stream-ordered
 * comm) or for the host (host-driven comm). Nothing to do for host compute. */
static zero_status before_group(run *r)
{
    if (!r->S) return ZERO_OK;
    zero_status st = zero_event_record(r->sev, r->S);
    if (st == ZERO_OK) st = r->K ? zero_stream_wait_event(r->K, r->sev) : zero_event_sync(r->sev);
    return st == ZERO_OK ? ZERO_OK : dev_fail(r, st, "ordering a group after the compute before it");
}

/* After the group of ops [i, end) (stream-ordered comm): one event on the
 * comm's stream, which each op's consumer waits for - the group's own in
 * this step (count_groups sized them), kept from the earlier steps. */
static zero_status after_group(run *r, int i, int end)
{
    if (!r->K) return ZERO_OK;
    if (r->nev == r->max_ev)
        return gpt_fail(ZERO_INTERNAL, "pipeline stage %d: more groups of sends / receives than the %d counted", r->s,
                        r->max_ev);
    zero_event *ev = r->evs[r->nev++];
    zero_status st = zero_event_record(ev, r->K);
    if (st != ZERO_OK) return dev_fail(r, st, "recording a group's event");
    for (int j = i; j < end; j++) r->gev[j] = ev;
    return ZERO_OK;
}

/* ------------------------------------------------------------ the stage's list */
/* The groups execute() issues: a comm op and the ops flagged `group` after it. */
static int count_groups(const pp_op *ops, int n)
{
    int groups = 0;
    for (int i = 0; i < n; i++)
        if (ops[i].kind >= PP_OP_SEND_ACT) {
            while (i + 1 < n && ops[i + 1].group) i++;
            groups++;
        }
    return groups;
}

static zero_status execute(run *r)
{
    const pp_op *ops = r->plan->ops[r->s];
    const int n = r->plan->count[r->s];
    for (int i = 0; i < n; i++) {
        const pp_op *op = &ops[i];
        if (op->kind >= PP_OP_SEND_ACT) {
            int end = i + 1;
            while (end < n && ops[end].group) end++;
            int grouped = end - i > 1;
            zero_status st = ZERO_OK;
            GPT_TRY(before_group(r));
            if (grouped) {
                st = zero_comm_group_begin(r->pp);
                if (st != ZERO_OK) return comm_fail(r, st, what_of(op->kind), op->micro);
            }
            for (int j = i; j < end && st == ZERO_OK; j++) st = issue(r, j);
            if (grouped) {
                zero_status e = zero_comm_group_end(r->pp); /* only async ops inside: launches, waits for nothing */
                if (st == ZERO_OK && e != ZERO_OK) st = comm_fail(r, e, what_of(op->kind), op->micro);
            }
            if (st != ZERO_OK) return st;
            GPT_TRY(after_group(r, i, end));
            i = end - 1;
        } else if (op->kind == PP_OP_F) {
            GPT_TRY(forward(r, op->chunk, op->micro));
        } else if (op->kind == PP_OP_B) {
            int whole = i + 1 < n && ops[i + 1].kind == PP_OP_W && ops[i + 1].micro == op->micro &&
                        ops[i + 1].chunk == op->chunk;
            GPT_TRY(backward(r, op->chunk, op->micro, whole));
            if (whole) i++;
        } else {
            GPT_TRY(weight(r, op->chunk, op->micro));
        }
    }
    return ZERO_OK;
}

/* The transfer buffers back to the stage (the arrays and events stay in the cache). */
static void release_buffers(run *r)
{
    for (int c = 0; c < r->V && r->landing; c++) {
        r->st->release(r->st->self, r->landing[c]);
        r->st->release(r->st->self, r->gin[c]);
        r->st->release(r->st->self, r->gout[c]);
    }
}

/* The step's bookkeeping in the cache's block: pointer arrays (zeroed), then
 * int arrays (-1). last_in: [c * M + slot], the last micro-batch in that slot. */
static zero_status carve(run *r, pp_run_cache *cache, int n, size_t nk, int **last_in)
{
    const size_t np = 2 * ((size_t)n + 1) + 3 * (size_t)r->V, ni = 9 * nk;
    char *b = pp_run_cache_scratch(cache, sizeof(void *) * np + sizeof(int) * ni);
    if (!b) return gpt_fail(ZERO_OUT_OF_MEMORY, "pp_run_plan: out of memory for the step's bookkeeping");
    memset(b, 0, sizeof(void *) * np);
    r->req = (zero_request **)b;
    r->gev = (zero_event **)(r->req + n + 1);
    r->landing = (float **)(r->gev + n + 1);
    r->gin = r->landing + r->V;
    r->gout = r->gin + r->V;
    int *ints = (int *)(r->gout + r->V);
    for (size_t i = 0; i < ni; i++) ints[i] = -1;
    for (int k = 0; k < 7; k++) r->op_of[k] = ints + (size_t)k * nk;
    r->prev = ints + 7 * nk;
    *last_in = ints + 8 * nk;
    return ZERO_OK;
}

/* The events of the step: sev (a stage with a stream) and one per group
 * (a stream-ordered comm), all from the cache. */
static zero_status take_events(run *r, pp_run_cache *cache, int groups)
{
    const int need = (r->S ? 1 : 0) + (r->K ? groups : 0);
    if (!need) return ZERO_OK;
    zero_event **ev;
    GPT_TRY(pp_run_cache_events(cache, r->st->dev, need, &ev));
    r->sev = r->S ? ev[0] : NULL;
    r->evs = ev + (r->S ? 1 : 0);
    r->max_ev = r->K ? groups : 0;
    return ZERO_OK;
}

zero_status pp_run_plan(tp_workspace *const *ws, zero_comm *pp, const pp_plan *plan, const pp_step_args *a,
                        const pp_run_opts *opts, float *loss)
{
    if (!ws || !plan || !a || !a->params || !a->grads)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_run_plan: workspaces, plan, args, params or grads is NULL");
    if (!ws[0]) return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_run_plan: workspace of chunk 0 is NULL");
    for (int c = 1; c < plan->chunks; c++)
        if (!ws[c] || tp_workspace_rows(ws[c]) != tp_workspace_rows(ws[0]))
            return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_run_plan: workspace of chunk %d is NULL or of another shape", c);
    pp_stage st;
    GPT_TRY(pp_stage_tp(&st, ws, plan->chunks));
    return pp_run_stage(&st, pp, plan, a, opts, loss);
}

zero_status pp_run_stage(const pp_stage *stage, zero_comm *pp, const pp_plan *plan, const pp_step_args *a,
                         const pp_run_opts *opts, float *loss)
{
    if (!stage || !plan || !a || !a->params || !a->grads)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_run_plan: stage, plan, args, params or grads is NULL");
    if (!plan->checked)
        return gpt_fail(ZERO_INVALID_STATE, "pp_run_plan: schedule '%s' was not checked (pp_plan_check)", plan->name);
    run r;
    memset(&r, 0, sizeof r);
    r.st = stage, r.plan = plan, r.a = a, r.o = opts;
    r.pp = pp && zero_comm_get_size(pp) > 1 ? pp : NULL;
    r.P = r.pp ? zero_comm_get_size(pp) : 1;
    r.s = r.pp ? zero_comm_get_rank(pp) : 0;
    r.V = plan->chunks, r.M = plan->micro_batches, r.last = r.P * r.V - 1;
    if (plan->stages != r.P || a->micro_batches != r.M)
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "pp_run_plan: schedule '%s' is for %d stages and %d micro-batches; the group has %d stages and "
                        "the step %d micro-batches",
                        plan->name, plan->stages, plan->micro_batches, r.P, a->micro_batches);
    const gpt_config *cfg = stage->cfg;
    if (stage->chunks != r.V)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_run_plan: schedule '%s' has %d chunks per stage, the %s stage %d",
                        plan->name, r.V, stage->name, stage->chunks);
    r.N = stage->rows;
    r.NT = stage->tokens;
    r.S = stage->stream;
    r.K = r.pp ? zero_comm_get_stream(r.pp) : NULL;
    if ((r.S || r.K) && !stage->dev)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_run_plan: the %s stage %s but names no device for the events",
                        stage->name, r.S ? "has a stream" : "runs over a stream-ordered pp comm");
    r.C = stage->width;
    for (int c = 0; c < r.V; c++) {
        int b, e, wb, we;
        GPT_TRY(pp_chunk_layers(cfg, r.P, r.V, r.s, c, &b, &e));
        stage->range(stage->self, c, &wb, &we);
        int need = plan->slots[r.s * r.V + c], have = stage->slots(stage->self, c);
        if (wb != b || we != e || have < need)
            return gpt_fail(ZERO_INVALID_ARGUMENT,
                            "pp_run_plan: chunk %d of stage %d runs blocks [%d, %d) with %d activation slots (schedule "
                            "'%s'); its workspace has blocks [%d, %d) and %d slots",
                            c, r.s, b, e, need, plan->name, wb, we, have);
        if (plan->split && !(opts && opts->simulate_op_s > 0)) GPT_TRY(stage->split_backward(stage->self, c));
    }
    int q0 = vstage(&r, 0);
    if ((q0 == 0 && !a->tokens) || (r.s == r.P - 1 && !a->targets))
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_run_plan: stage %d needs %s", r.s, q0 == 0 ? "tokens" : "targets");

    const int n = plan->count[r.s];
    size_t nk = (size_t)r.V * r.M, nc = r.N * r.C;
    /* the stage's cache (kept across steps), else one for this step */
    pp_run_cache step_cache = {0}, *cache = stage->cache ? stage->cache : &step_cache;
    int *last_in = NULL;
    zero_status st = carve(&r, cache, n, nk, &last_in);
    if (st == ZERO_OK) st = take_events(&r, cache, count_groups(plan->ops[r.s], n));
    if (st != ZERO_OK) {
        pp_run_cache_free(&step_cache);
        return st;
    }
    int bad = 0;
    for (int c = 0; c < r.V && !bad; c++) {
        int land = plan->landing[r.s * r.V + c], slots = plan->slots[r.s * r.V + c];
        r.landing[c] = stage->alloc(stage->self, sizeof(float) * nc * (size_t)(land ? land : 1));
        r.gin[c] = stage->alloc(stage->self, sizeof(float) * nc * (size_t)slots);
        r.gout[c] = stage->alloc(stage->self, sizeof(float) * nc * (size_t)slots);
        bad |= !r.landing[c] || !r.gin[c] || !r.gout[c];
    }
    if (bad) {
        release_buffers(&r);
        pp_run_cache_free(&step_cache);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "pp_run_plan: out of memory for the stage's transfer buffers");
    }
    for (int i = 0; i < n; i++) {
        const pp_op *op = &plan->ops[r.s][i];
        r.op_of[op->kind][key(&r, op->chunk, op->micro)] = i;
        if (op->kind == PP_OP_F) {
            int sl = op->chunk * r.M + slot_of(&r, op->chunk, op->micro);
            r.prev[key(&r, op->chunk, op->micro)] = last_in[sl];
            last_in[sl] = op->micro;
        }
    }

    st = execute(&r);
    /* what is still in flight completes (or fails) before its buffers go */
    if (r.K) {
        zero_status w = zero_comm_sync(r.pp); /* the host's one wait for the step's communication */
        if (st == ZERO_OK && w != ZERO_OK) st = comm_fail(&r, w, "sends and receives of the step", -1);
    }
    for (int i = 0; i < n && !r.K; i++)
        if (r.req[i]) {
            zero_status w = wait_op(&r, i);
            if (st == ZERO_OK) st = w;
        }
    if (stage->finish) { /* the stage's stream has run everything (also after a failure: buffers go next) */
        zero_status w = stage->finish(stage->self, &r.loss_sum);
        if (st == ZERO_OK) st = w;
    }
    release_buffers(&r);
    pp_run_cache_free(&step_cache); /* a no-op for the stage's own cache */
    if (st != ZERO_OK) return st;
    float mean = (float)(r.loss_sum / a->micro_batches);
    /* MoE: the loss is the cross-entropy (last stage) plus every stage's share of the aux losses: summed */
    const int moe = stage->cfg->moe_experts > 0;
    if (r.pp) { /* through the stage's memory: a device comm takes device buffers only */
        float *one = stage->alloc(stage->self, sizeof(float));
        if (!one) return gpt_fail(ZERO_OUT_OF_MEMORY, "pp_run_plan: out of memory for the loss broadcast");
        st = stage->copy(stage->self, one, &mean, sizeof(float), PP_COPY_FROM_HOST);
        if (st == ZERO_OK && (st = moe ? zero_allreduce(r.pp, one, one, 1, ZERO_F32, ZERO_SUM)
                                       : zero_broadcast(r.pp, one, one, 1, ZERO_F32, r.last % r.P)) != ZERO_OK)
            st = comm_fail(&r, st, moe ? "all-reduce of the loss (MoE aux losses)" : "broadcast of the loss", -1);
        if (st == ZERO_OK && r.K && (st = zero_comm_sync(r.pp)) != ZERO_OK) /* enqueued on the comm's stream */
            st = comm_fail(&r, st, moe ? "all-reduce of the loss (MoE aux losses)" : "broadcast of the loss", -1);
        if (st == ZERO_OK) st = stage->copy(stage->self, &mean, one, sizeof(float), PP_COPY_TO_HOST);
        stage->release(stage->self, one);
        if (st != ZERO_OK) return st;
    }
    if (loss) *loss = mean;
    return ZERO_OK;
}
