/* Every pipeline schedule (model/pp_plan.h) run by the runtime (pp_run_plan)
 * on real ranks (np = stages, tp 1), against the single-rank model:
 *   - GPipe's loss within 1e-5 relative of the single-rank model's and every
 *     gradient (summed over the stages: the tied wte's two halves) within
 *     2e-5 * max|ref| + 1e-4 * |ref| - the tolerance of the tp/pp tests;
 *   - 1F1B, interleaved 1F1B (2 chunks per stage), ZB-H1 and ZB-H2: loss and
 *     every gradient BITWISE those of GPipe (each tensor accumulates its
 *     micro-batches in the same order in every schedule);
 *   - on one rank, a plan that runs every W long after its B (the W-split
 *     backward, with its stash) gives bitwise the unsplit backward's
 *     gradients;
 *   - the trace: one forward, backward and (split) weight-gradient span per
 *     op, and a Chrome trace JSON naming every rank's track;
 *   - a plan the runtime was not given checked, or for another group size,
 *     is refused by name;
 *   - the runtime reaches a stage only through pp_stage.h (what the CUDA
 *     stage relies on): ZB-H1 through a stage that wraps the CPU one and
 *     owns its transfer memory gives bitwise GPipe's loss and gradients,
 *     every activation / gradient it is handed lies in memory it allocated,
 *     every allocation is released, and the loss broadcast goes through its
 *     copy (one copy in, one out, per step at np > 1);
 *   - `test_pp_schedules stream` (run with ZERO_CPU_ASYNC=1 and random
 *     per-op delays): the runtime's event ordering of a stage with a stream
 *     (what the CUDA stage is, pp_stage.h) - the CPU stage behind a stream
 *     of the asynchronous CPU device, whose outputs and input gradients
 *     reach the runtime's buffers by copies queued on that stream, whose
 *     compute starts only after the stream ran what was queued before it
 *     (the event waits included), and whose losses are read at the end of
 *     the step (finish). Over a stream-ordered pp comm (zero_comm_set_stream,
 *     NCCL's mode: sends and receives on a stream of their own) every
 *     schedule's loss and gradients are BITWISE GPipe's through the plain
 *     CPU stage; over the host-driven comm (STAGED's mode) 1F1B and ZB-H1
 *     are. A missing event (a send before its producer's copy, a compute
 *     before its receive, a slot rewritten under its send) reads stale or
 *     torn bits. Three steps through one stage: its transfer-buffer pool
 *     (pp_pool.h, the CUDA stage's) allocates in the first step only and
 *     gets every buffer back; finish runs once per step; and the runtime
 *     creates and destroys no device event after a plan's first step (on a
 *     GPU an event made and destroyed per group of transfers per step is
 *     driver work in the hot loop). Events are counted at the link: this
 *     program is linked with --wrap=zero_event_create / zero_event_destroy,
 *     so every such call from the runtime (libzero_model.a, linked in) goes
 *     through the counters below, whatever code makes it. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zero/zero.h>

#include "check.h"
#include "gpt.h"
#include "pp_gpt.h"
#include "pp_plan.h"
#include "pp_pool.h"
#include "pp_trace.h"
#include "tp_gpt.h"

/* 8 blocks: 4 stages x 2 chunks. A stage message is 3*8*64 floats = 6 KiB,
 * above Open MPI's shared-memory eager limit (4 KiB): sends really wait. */
static const gpt_config g_cfg = {.n_layer = 8, .n_head = 4, .d_model = 64, .seq_len = 12, .vocab = 64};
enum { BATCH = 3, SEQ = 8, MICRO = 8 }; /* M >= 2p - 1 at p = 4: ZB-H2 runs its whole structure */
static int g_rank;

#define TRY(call)                                                                                              \
    do {                                                                                                       \
        zero_status st_ = (call);                                                                              \
        if (st_ != ZERO_OK) {                                                                                  \
            fprintf(stderr, "[rank %d] %s:%d: %s: %s: %s\n", g_rank, __FILE__, __LINE__, #call, zero_status_name(st_), \
                    gpt_last_error());                                                                         \
            return 1;                                                                                          \
        }                                                                                                      \
    } while (0)

/* ------------------------------------------------------------ event counters (see the header) */
zero_status __real_zero_event_create(zero_device *dev, zero_event **out);
void __real_zero_event_destroy(zero_event *event);
zero_status __wrap_zero_event_create(zero_device *dev, zero_event **out);
void __wrap_zero_event_destroy(zero_event *event);
static int g_events_created, g_events_destroyed;
zero_status __wrap_zero_event_create(zero_device *dev, zero_event **out)
{
    zero_status st = __real_zero_event_create(dev, out);
    g_events_created += st == ZERO_OK;
    return st;
}
void __wrap_zero_event_destroy(zero_event *event)
{
    g_events_destroyed += event != NULL;
    __real_zero_event_destroy(event);
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

typedef struct model {
    size_t np;
    float **p, **g;
    gpt_tensors *ps, *gs;
} model;

static void model_make(model *m, uint64_t seed)
{
    m->np = gpt_num_params(&g_cfg);
    m->p = calloc(m->np, sizeof *m->p);
    m->g = calloc(m->np, sizeof *m->g);
    int nm = gpt_num_modules(&g_cfg);
    m->ps = calloc((size_t)nm, sizeof *m->ps);
    m->gs = calloc((size_t)nm, sizeof *m->gs);
    uint64_t s = seed;
    for (size_t i = 0; i < m->np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&g_cfg, i, &info);
        m->p[i] = malloc(sizeof(float) * info.numel);
        m->g[i] = calloc(info.numel, sizeof(float));
        float base = info.init == GPT_INIT_ONES ? 1.0f : 0.0f, amp = info.init == GPT_INIT_NORMAL ? 0.15f : 0.1f;
        for (size_t k = 0; k < info.numel; k++)
            m->p[i][k] = base + amp * ((float)rng_next(&s) / 2147483648.0f * 2.0f - 1.0f);
        m->ps[info.module].t[info.index] = m->p[i];
        m->gs[info.module].t[info.index] = m->g[i];
    }
}

static void model_free(model *m)
{
    for (size_t i = 0; i < m->np; i++) free(m->p[i]), free(m->g[i]);
    free(m->p), free(m->g), free(m->ps), free(m->gs);
}

static void zero_grads(model *m)
{
    for (size_t i = 0; i < m->np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&g_cfg, i, &info);
        memset(m->g[i], 0, sizeof(float) * info.numel);
    }
}

/* ------------------------------------------------------------ a stage that owns its memory
 * The CPU stage wrapped: its transfer memory is tracked, and what the
 * runtime hands forward / backward must lie in it - as a device stage needs
 * (the comm moves its buffers, the host never touches them). */
typedef struct own_stage {
    pp_stage in;
    struct { char *p; size_t n; } blk[64];
    int nblk, allocs, live, foreign, copies[3];
} own_stage;

static int owned(const own_stage *o, const void *p, size_t n)
{
    for (int i = 0; i < o->nblk; i++)
        if ((const char *)p >= o->blk[i].p && (const char *)p + n <= o->blk[i].p + o->blk[i].n) return 1;
    return 0;
}
static size_t msg_bytes(const own_stage *o) { return sizeof(float) * o->in.rows * o->in.width; }
static void o_range(void *self, int c, int *b, int *e) { own_stage *o = self; o->in.range(o->in.self, c, b, e); }
static int o_slots(void *self, int c) { own_stage *o = self; return o->in.slots(o->in.self, c); }
static zero_status o_split(void *self, int c) { own_stage *o = self; return o->in.split_backward(o->in.self, c); }
static const float *o_output(void *self, int c, int slot) { own_stage *o = self; return o->in.output(o->in.self, c, slot); }
static zero_status o_forward(void *self, int c, int slot, const float *in, const int32_t *tok, const int32_t *tgt,
                             const gpt_tensors *params, float *loss)
{
    own_stage *o = self;
    if (in && !owned(o, in, msg_bytes(o))) o->foreign++;
    return o->in.forward(o->in.self, c, slot, in, tok, tgt, params, loss);
}
static zero_status o_backward(void *self, int c, int slot, int whole, const float *dout, float *din, float dloss,
                              const gpt_tensors *params, gpt_tensors *grads)
{
    own_stage *o = self;
    if ((dout && !owned(o, dout, msg_bytes(o))) || (din && !owned(o, din, msg_bytes(o)))) o->foreign++;
    return o->in.backward(o->in.self, c, slot, whole, dout, din, dloss, params, grads);
}
static zero_status o_weight(void *self, int c, int slot, gpt_tensors *grads)
{
    own_stage *o = self;
    return o->in.weight(o->in.self, c, slot, grads);
}
static void *o_alloc(void *self, size_t bytes)
{
    own_stage *o = self;
    void *p = o->nblk < 64 ? o->in.alloc(o->in.self, bytes) : NULL;
    if (p) o->blk[o->nblk].p = p, o->blk[o->nblk++].n = bytes, o->allocs++, o->live++;
    return p;
}
static void o_release(void *self, void *p)
{
    own_stage *o = self;
    if (!p) return;
    int i = 0;
    while (i < o->nblk && o->blk[i].p != p) i++;
    if (i == o->nblk) o->foreign++;
    else o->blk[i] = o->blk[--o->nblk], o->live--;
    o->in.release(o->in.self, p);
}
static zero_status o_copy(void *self, void *dst, const void *src, size_t bytes, pp_copy_kind kind)
{
    own_stage *o = self;
    o->copies[kind]++;
    return o->in.copy(o->in.self, dst, src, bytes, kind);
}

static void own_stage_wrap(own_stage *o, pp_stage *view)
{
    *view = o->in;
    view->self = o;
    view->range = o_range, view->slots = o_slots, view->split_backward = o_split, view->output = o_output;
    view->forward = o_forward, view->backward = o_backward, view->weight = o_weight;
    view->alloc = o_alloc, view->release = o_release, view->copy = o_copy;
}

/* ------------------------------------------------------------ a stage with a stream
 * The CPU stage as the CUDA stage looks to the runtime (pp_stage.h): its
 * work is ordered by its stream S. Compute runs on the host only after S
 * has run everything queued before (zero_stream_sync: the event waits the
 * runtime queued included); what the runtime reads (the output a send
 * takes, the input gradient) reaches its buffers by copies queued on S,
 * which the asynchronous device runs later, after a random delay; the
 * losses are kept until finish. Transfer buffers come from a pp_pool. */
typedef struct stream_stage {
    pp_stage in;
    zero_device *dev;
    zero_stream *S;
    pp_pool pool;
    pp_run_cache cache; /* the runtime's events and bookkeeping across steps (pp_stage.cache) */
    float *out[8][8]; /* [chunk][slot]: what output() hands to SEND_ACT, written on S */
    float *din;       /* B's input gradient before its copy on S into the runtime's buffer */
    float loss[64];
    int nloss, finishes, failed;
} stream_stage;

static size_t s_bytes(const stream_stage *x) { return sizeof(float) * x->in.rows * x->in.width; }
static zero_status s_drain(stream_stage *x)
{
    zero_status st = zero_stream_sync(x->S);
    if (st != ZERO_OK) x->failed++;
    return st;
}
static void s_range(void *self, int c, int *b, int *e) { stream_stage *x = self; x->in.range(x->in.self, c, b, e); }
static int s_slots(void *self, int c) { stream_stage *x = self; return x->in.slots(x->in.self, c); }
static zero_status s_split(void *self, int c) { stream_stage *x = self; return x->in.split_backward(x->in.self, c); }
static const float *s_output(void *self, int c, int slot) { return ((stream_stage *)self)->out[c][slot]; }
static zero_status s_forward(void *self, int c, int slot, const float *in, const int32_t *tok, const int32_t *tgt,
                             const gpt_tensors *params, float *loss)
{
    stream_stage *x = self;
    float l = 0.0f;
    (void)loss; /* left 0: finish adds it, as the CUDA stage does */
    if (s_drain(x) != ZERO_OK) return ZERO_BACKEND;
    zero_status st = x->in.forward(x->in.self, c, slot, in, tok, tgt, params, &l);
    if (st != ZERO_OK) return st;
    if (x->nloss < 64) x->loss[x->nloss++] = l;
    return zero_memcpy_async(x->dev, x->out[c][slot], x->in.output(x->in.self, c, slot), s_bytes(x), x->S);
}
static zero_status s_backward(void *self, int c, int slot, int whole, const float *dout, float *din, float dloss,
                              const gpt_tensors *params, gpt_tensors *grads)
{
    stream_stage *x = self;
    if (s_drain(x) != ZERO_OK) return ZERO_BACKEND;
    zero_status st = x->in.backward(x->in.self, c, slot, whole, dout, din ? x->din : NULL, dloss, params, grads);
    if (st != ZERO_OK || !din) return st;
    return zero_memcpy_async(x->dev, din, x->din, s_bytes(x), x->S);
}
static zero_status s_weight(void *self, int c, int slot, gpt_tensors *grads)
{
    stream_stage *x = self;
    if (s_drain(x) != ZERO_OK) return ZERO_BACKEND;
    return x->in.weight(x->in.self, c, slot, grads);
}
static zero_status s_finish(void *self, double *loss_sum)
{
    stream_stage *x = self;
    zero_status st = s_drain(x);
    for (int k = 0; k < x->nloss; k++) *loss_sum += x->loss[k];
    x->nloss = 0, x->finishes++;
    return st;
}
static void *s_raw_alloc(void *ctx, size_t bytes) { (void)ctx; return malloc(bytes); }
static void s_raw_free(void *ctx, void *p) { (void)ctx; free(p); }
static void *s_alloc(void *self, size_t bytes) { return pp_pool_get(&((stream_stage *)self)->pool, bytes); }
static void s_release(void *self, void *p)
{
    stream_stage *x = self;
    if (pp_pool_put(&x->pool, p) != 0) x->failed++;
}
static zero_status s_copy(void *self, void *dst, const void *src, size_t bytes, pp_copy_kind kind)
{
    (void)self, (void)kind;
    memcpy(dst, src, bytes);
    return ZERO_OK;
}

static void stream_stage_wrap(stream_stage *x, pp_stage *view)
{
    *view = x->in;
    view->self = x;
    view->range = s_range, view->slots = s_slots, view->split_backward = s_split, view->output = s_output;
    view->forward = s_forward, view->backward = s_backward, view->weight = s_weight;
    view->alloc = s_alloc, view->release = s_release, view->copy = s_copy;
    view->dev = x->dev, view->stream = x->S, view->finish = s_finish;
    view->cache = &x->cache;
}

/* Run `plan` over `pp` with fresh workspaces; gradients summed over pp into m->g.
 * own (may be NULL): through that wrapper of the CPU stage (pp_run_stage);
 * x (may be NULL): through the stream-ordered one, with `K` (may be NULL:
 * host-driven) set as the pp comm's stream for the step. */
static int run_via2(zero_comm *pp, const pp_plan *plan, model *m, const int32_t *tok, const int32_t *tgt, float *loss,
                    pp_trace *trace, own_stage *own, stream_stage *x, zero_stream *K)
{
    int P = pp ? zero_comm_get_size(pp) : 1, s = pp ? zero_comm_get_rank(pp) : 0;
    tp_workspace *ws[8] = {0};
    for (int c = 0; c < plan->chunks; c++) {
        int b, e;
        TRY(pp_chunk_layers(&g_cfg, P, plan->chunks, s, c, &b, &e));
        TRY(tp_workspace_create(&ws[c], &g_cfg, NULL, BATCH, SEQ, b, e, plan->slots[s * plan->chunks + c]));
    }
    zero_grads(m);
    pp_step_args a = {MICRO, tok, tgt, 1.0f / MICRO, m->ps, m->gs};
    pp_run_opts o = {trace, 0.0};
    if (own) {
        pp_stage view;
        TRY(pp_stage_tp(&own->in, ws, plan->chunks));
        own_stage_wrap(own, &view);
        TRY(pp_run_stage(&view, pp, plan, &a, &o, loss));
    } else if (x) {
        pp_stage view;
        TRY(pp_stage_tp(&x->in, ws, plan->chunks));
        stream_stage_wrap(x, &view);
        if (K) TRY(zero_comm_set_stream(pp, K));
        zero_status st = pp_run_stage(&view, pp, plan, &a, &o, loss);
        if (K) TRY(zero_comm_set_stream(pp, NULL));
        TRY(st);
    } else {
        TRY(pp_run_plan(ws, pp, plan, &a, &o, loss));
    }
    for (int c = 0; c < plan->chunks; c++) tp_workspace_destroy(ws[c]);
    if (pp)
        for (size_t i = 0; i < m->np; i++) {
            gpt_param_info info;
            gpt_param_info_get(&g_cfg, i, &info);
            TRY(zero_allreduce(pp, m->g[i], m->g[i], info.numel, ZERO_F32, ZERO_SUM));
        }
    return 0;
}

static int run_via(zero_comm *pp, const pp_plan *plan, model *m, const int32_t *tok, const int32_t *tgt, float *loss,
                   pp_trace *trace, own_stage *own)
{
    return run_via2(pp, plan, m, tok, tgt, loss, trace, own, NULL, NULL);
}

static int run(zero_comm *pp, const pp_plan *plan, model *m, const int32_t *tok, const int32_t *tgt, float *loss,
               pp_trace *trace)
{
    return run_via(pp, plan, m, tok, tgt, loss, trace, NULL);
}

static int same_grads(const model *a, const model *b)
{
    for (size_t i = 0; i < a->np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&g_cfg, i, &info);
        if (memcmp(a->g[i], b->g[i], sizeof(float) * info.numel) != 0) return 0;
    }
    return 1;
}

static void close_grads(const model *got, const model *ref, double *worst)
{
    for (size_t i = 0; i < got->np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&g_cfg, i, &info);
        float maxref = 0;
        for (size_t k = 0; k < info.numel; k++) maxref = fmaxf(maxref, fabsf(ref->g[i][k]));
        for (size_t k = 0; k < info.numel; k++) {
            float err = fabsf(got->g[i][k] - ref->g[i][k]);
            if (maxref > 0 && err / maxref > *worst) *worst = err / maxref;
            if (!(err <= 2e-5f * maxref + 1e-4f * fabsf(ref->g[i][k]))) {
                CHECK_MSG(0, "%s[%zu]: %g vs single-rank %g", info.name, k, got->g[i][k], ref->g[i][k]);
                return;
            }
        }
    }
}

/* One rank: every W deferred to the end of the step (a split backward). */
static int split_vs_unsplit(model *m, const int32_t *tok, const int32_t *tgt)
{
    pp_plan split, whole;
    TRY(pp_plan_generate(&whole, PP_SCHED_GPIPE, 1, MICRO, 1));
    TRY(pp_plan_init(&split, 1, 1, MICRO, "w-deferred"));
    for (int k = 0; k < MICRO; k++) TRY(pp_plan_add(&split, 0, PP_OP_F, k, 0, 0));
    for (int k = 0; k < MICRO; k++) TRY(pp_plan_add(&split, 0, PP_OP_B, k, 0, 0));
    for (int k = 0; k < MICRO; k++) TRY(pp_plan_add(&split, 0, PP_OP_W, k, 0, 0));
    TRY(pp_plan_check(&split));
    CHECK(split.split && !whole.split);
    model ref;
    model_make(&ref, 11);
    float l1, l2;
    pp_trace tr = {0};
    if (run(NULL, &whole, &ref, tok, tgt, &l1, NULL) || run(NULL, &split, m, tok, tgt, &l2, &tr)) return 1;
    CHECK_MSG(l1 == l2 && same_grads(m, &ref), "W-split backward differs from the unsplit one (loss %.9g vs %.9g)", l2,
              l1);
    int nf = 0, nb = 0, nw = 0;
    for (int i = 0; i < tr.n; i++) {
        nf += tr.spans[i].kind == PP_SPAN_FORWARD;
        nb += tr.spans[i].kind == PP_SPAN_BACKWARD;
        nw += tr.spans[i].kind == PP_SPAN_WEIGHT_GRAD;
    }
    CHECK_MSG(nf == MICRO && nb == MICRO && nw == MICRO, "trace: %d forward, %d backward, %d weight-grad spans", nf,
              nb, nw);
    /* an unchecked plan is refused */
    pp_plan raw;
    TRY(pp_plan_init(&raw, 1, 1, MICRO, "raw"));
    pp_step_args a = {MICRO, tok, tgt, 1.0f / MICRO, m->ps, m->gs};
    tp_workspace *ws = NULL;
    TRY(tp_workspace_create(&ws, &g_cfg, NULL, BATCH, SEQ, 0, g_cfg.n_layer, MICRO));
    CHECK(pp_run_plan(&ws, NULL, &raw, &a, NULL, NULL) == ZERO_INVALID_STATE &&
          strstr(gpt_last_error(), "was not checked"));
    /* a plan for 2 stages on one */
    pp_plan two;
    TRY(pp_plan_generate(&two, PP_SCHED_1F1B, 2, MICRO, 1));
    CHECK(pp_run_plan(&ws, NULL, &two, &a, NULL, NULL) == ZERO_INVALID_ARGUMENT &&
          strstr(gpt_last_error(), "is for 2 stages"));
    tp_workspace_destroy(ws);
    pp_plan_free(&raw), pp_plan_free(&two), pp_plan_free(&split), pp_plan_free(&whole);
    pp_trace_free(&tr);
    model_free(&ref);
    return 0;
}

/* `stream` mode (the header): every schedule through the stream-ordered stage. */
static int stream_tests(zero_comm *pp, const int32_t *tok, const int32_t *tgt)
{
    const int P = zero_comm_get_size(pp);
    model gp, other;
    model_make(&gp, 11), model_make(&other, 11);
    float l_gp, l;
    pp_plan plan;
    if (pp_plan_generate(&plan, PP_SCHED_GPIPE, P, MICRO, 1) != ZERO_OK || run(pp, &plan, &gp, tok, tgt, &l_gp, NULL))
        return 1;
    pp_plan_free(&plan);
    stream_stage x;
    memset(&x, 0, sizeof x);
    TRY(zero_device_create(&x.dev, ZERO_DEVICE_CPU, 0));
    zero_stream *K = NULL;
    TRY(zero_stream_create(x.dev, &x.S));
    TRY(zero_stream_create(x.dev, &K));
    x.pool.raw_alloc = s_raw_alloc, x.pool.raw_free = s_raw_free;
    const size_t nc = (size_t)BATCH * SEQ * g_cfg.d_model;
    x.din = malloc(sizeof(float) * nc);
    for (int c = 0; c < 8; c++)
        for (int k = 0; k < 8; k++) x.out[c][k] = malloc(sizeof(float) * nc);
    int rc = 0;
    for (int mode = 0; mode < 2 && !rc; mode++) /* 0: stream-ordered comm; 1: host-driven */
        for (int k = PP_SCHED_GPIPE; k < PP_SCHED_COUNT && !rc; k++) {
            if (mode == 1 && k != PP_SCHED_1F1B && k != PP_SCHED_ZB_H1) continue;
            int v = k == PP_SCHED_INTERLEAVED ? 2 : 1;
            TRY(pp_plan_generate(&plan, (pp_schedule_kind)k, P, MICRO, v));
            int allocs = -1, finishes = x.finishes, made = -1, gone = -1;
            for (int step = 0; step < 3 && !rc; step++) { /* the pool: allocations in the first step only */
                if (run_via2(pp, &plan, &other, tok, tgt, &l, NULL, NULL, &x, mode == 0 ? K : NULL)) rc = 1;
                if (rc) break;
                CHECK_MSG(l == l_gp && same_grads(&other, &gp), "%s through the stream-ordered stage (%s comm, step "
                          "%d): loss %.9g vs GPipe %.9g, gradients %s", plan.name, mode ? "host-driven" : "stream-ordered",
                          step, l, l_gp, same_grads(&other, &gp) ? "equal" : "differ");
                if (step == 0) allocs = x.pool.allocs;
                CHECK_MSG(x.pool.allocs == allocs && pp_pool_in_use(&x.pool) == 0 && x.failed == 0,
                          "%s step %d: %d transfer allocations (first step %d), %d buffers not returned, %d foreign "
                          "releases or stream failures", plan.name, step, x.pool.allocs, allocs,
                          pp_pool_in_use(&x.pool), x.failed);
                /* the events: made in the first step (or kept from an earlier plan), then only reused */
                if (step == 0) made = g_events_created, gone = g_events_destroyed;
                CHECK_MSG(g_events_created == made && g_events_destroyed == gone,
                          "%s (%s comm) step %d: %d device events created and %d destroyed after the first step",
                          plan.name, mode ? "host-driven" : "stream-ordered", step, g_events_created - made,
                          g_events_destroyed - gone);
            }
            CHECK_MSG(x.finishes == finishes + 3, "%s: finish ran %d times in 3 steps", plan.name, x.finishes - finishes);
            pp_plan_free(&plan);
            pp_pool_free(&x.pool); /* the next plan asks other sizes */
            x.pool.allocs = 0;
            if (!rc && g_rank == 0)
                printf("pp %d %s through a stream-ordered stage (%s comm): bitwise GPipe, 3 steps, transfer buffers "
                       "allocated once, no event created after the first step\n", P, pp_schedule_name((pp_schedule_kind)k),
                       mode ? "host-driven" : "stream-ordered");
        }
    for (int c = 0; c < 8; c++)
        for (int k = 0; k < 8; k++) free(x.out[c][k]);
    free(x.din);
    pp_run_cache_free(&x.cache);
    CHECK_MSG(g_events_created == g_events_destroyed, "%d device events created, %d destroyed", g_events_created,
              g_events_destroyed);
    zero_stream_destroy(K);
    zero_stream_destroy(x.S);
    zero_device_destroy(x.dev);
    model_free(&gp), model_free(&other);
    return rc;
}

int main(int argc, char **argv)
{
    const char *trace_path = argc > 1 ? argv[1] : NULL;
    const int stream_mode = trace_path && strcmp(trace_path, "stream") == 0;
    zero_comm *world = NULL;
    if (zero_comm_create_world(&world, NULL) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    g_rank = zero_comm_get_rank(world);
    check_set_rank(g_rank);
    int P = zero_comm_get_size(world);
    zero_comm *pp = P > 1 ? world : NULL;
    size_t N = (size_t)MICRO * BATCH * SEQ;
    int32_t *tok = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    uint64_t s = 5;
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int32_t)(rng_next(&s) % (uint64_t)g_cfg.vocab);
        tgt[i] = (int32_t)(rng_next(&s) % (uint64_t)g_cfg.vocab);
    }
    tgt[3] = -1; /* an ignored target */
    int rc = 0;
    if (stream_mode) {
        rc = P > 1 ? stream_tests(pp, tok, tgt) : 0;
        free(tok), free(tgt);
        zero_comm_destroy(world);
        return rc ? 1 : check_exit();
    }
    model single, gp, other;
    model_make(&single, 11), model_make(&gp, 11), model_make(&other, 11);
    float l_single, l_gp;
    pp_plan plan;
    if (pp_plan_generate(&plan, PP_SCHED_GPIPE, 1, MICRO, 1) != ZERO_OK || run(NULL, &plan, &single, tok, tgt, &l_single, NULL))
        rc = 1;
    pp_plan_free(&plan);
    if (!rc && (pp_plan_generate(&plan, PP_SCHED_GPIPE, P, MICRO, 1) != ZERO_OK || run(pp, &plan, &gp, tok, tgt, &l_gp, NULL)))
        rc = 1;
    pp_plan_free(&plan);
    if (!rc) {
        CHECK_MSG(fabs(l_gp - l_single) <= 1e-5 * fabs(l_single), "GPipe loss %.9g vs single rank %.9g", l_gp,
                  l_single);
        double worst = 0;
        close_grads(&gp, &single, &worst);
        if (g_rank == 0) printf("pp %d gpipe: loss %.7f (single rank %.7f), largest gradient error / max|ref| %.2e\n", P,
                                l_gp, l_single, worst);
    }
    for (int k = PP_SCHED_1F1B; k < PP_SCHED_COUNT && !rc && P > 1; k++) {
        int v = k == PP_SCHED_INTERLEAVED ? 2 : 1;
        float l;
        pp_trace tr = {0};
        if (pp_plan_generate(&plan, (pp_schedule_kind)k, P, MICRO, v) != ZERO_OK ||
            run(pp, &plan, &other, tok, tgt, &l, &tr)) {
            fprintf(stderr, "[rank %d] %s: %s\n", g_rank, pp_schedule_name((pp_schedule_kind)k), gpt_last_error());
            rc = 1;
            break;
        }
        CHECK_MSG(l == l_gp && same_grads(&other, &gp), "%s: loss %.9g vs GPipe %.9g, gradients %s", plan.name, l, l_gp,
                  same_grads(&other, &gp) ? "equal" : "differ");
        int nf = 0;
        for (int i = 0; i < tr.n; i++) nf += tr.spans[i].kind == PP_SPAN_FORWARD;
        CHECK_MSG(nf == MICRO * v, "%s: %d forward spans on stage %d (expected %d)", plan.name, nf, g_rank, MICRO * v);
        if (k == PP_SCHED_ZB_H1 && trace_path) {
            CHECK_OK(pp_trace_write(world, &tr, g_rank, trace_path, "zb-h1"));
            if (g_rank == 0) {
                FILE *f = fopen(trace_path, "r");
                char buf[1 << 16];
                size_t got = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
                buf[got] = 0;
                if (f) fclose(f);
                char want[64];
                snprintf(want, sizeof want, "\"rank %d (pp stage %d)\"", P - 1, P - 1);
                CHECK_MSG(strstr(buf, "\"traceEvents\"") && strstr(buf, want) && strstr(buf, "\"weight-grad\""),
                          "trace file %s lacks the tracks or spans", trace_path);
            }
        }
        pp_trace_free(&tr);
        pp_plan_free(&plan);
        if (g_rank == 0) printf("pp %d %s: bitwise GPipe\n", P, pp_schedule_name((pp_schedule_kind)k));
    }
    if (!rc && P > 1) { /* the runtime through a stage that owns its memory */
        own_stage own;
        memset(&own, 0, sizeof own);
        float l;
        if (pp_plan_generate(&plan, PP_SCHED_ZB_H1, P, MICRO, 1) != ZERO_OK ||
            run_via(pp, &plan, &other, tok, tgt, &l, NULL, &own))
            rc = 1;
        pp_plan_free(&plan);
        if (!rc) {
            CHECK_MSG(l == l_gp && same_grads(&other, &gp), "zb-h1 through the wrapped stage: loss %.9g vs GPipe %.9g",
                      l, l_gp);
            CHECK_MSG(own.foreign == 0 && own.live == 0 && own.allocs > 0,
                      "stage memory: %d buffers handed over or released that the stage did not allocate, %d of %d "
                      "allocations not released", own.foreign, own.live, own.allocs);
            CHECK_MSG(own.copies[PP_COPY_FROM_HOST] == 1 && own.copies[PP_COPY_TO_HOST] == 1 &&
                          own.copies[PP_COPY_BUFFERS] == 0,
                      "the loss broadcast: %d copies in, %d out, %d between buffers (want 1, 1, 0)",
                      own.copies[PP_COPY_FROM_HOST], own.copies[PP_COPY_TO_HOST], own.copies[PP_COPY_BUFFERS]);
            if (g_rank == 0) printf("pp %d zb-h1 through a stage owning its memory: bitwise GPipe\n", P);
        }
    }
    if (!rc && g_rank == 0) rc = split_vs_unsplit(&other, tok, tgt);
    model_free(&single), model_free(&gp), model_free(&other);
    free(tok), free(tgt);
    zero_comm_destroy(world);
    return rc ? 1 : check_exit();
}
