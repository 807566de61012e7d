/* zero-train with tensor / pipeline parallelism (train_parallel.h). */
#include "train_parallel.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pp_gpt.h"
#include "pp_stage_cuda.h"
#include "pp_trace.h"
#include "tp_engine.h"
#include "tp_gpt.h"

struct train_parallel {
    gpt_config cfg;
    int micro_batches;
    size_t micro_tokens; /* batch x seq of a micro-batch */
    zero_grid grid;
    zero_comm *embed;   /* the tied-embedding group {first, last stage}; NULL elsewhere */
    zero_comm *mp;      /* tp x pp ranks of this dp rank: the engine's norm group */
    zero_comm *cp;      /* context parallelism: the cp ranks sharing this rank's sequences; NULL without */
    int cp_size, sp;    /* model.cp; model.sequence_parallel */
    zero_comm *ep, *edp; /* MoE expert parallelism (model.moe.ep > 1): the dp ranks sharing the experts out
                          * (consecutive) and those holding the same experts (the engine's group); NULL without */
    int ep_size, ep_rank;
    zero_engine *engine;
    int chunks;          /* model.pp_virtual: chunks per stage (interleaved schedules) */
    tp_workspace **ws;   /* one per chunk: chunk c holds blocks pp_chunk_layers(c) */
    int *param_ids, *module_ids;
    gpt_tensors *params, *grads;   /* what the pipeline computes on: the engine's buffers, or the fp32 copies */
    zero_device *dev;
    zero_dtype dtype;              /* the engine's compute dtype: f32, or bf16 (fp32 copies below) */
    gpt_tensors *eparams, *egrads; /* bf16: the engine's buffers */
    size_t *offset;                /* bf16: parameter i's place in f32_params / f32_grads (held ones) */
    float *f32_params, *f32_grads;
    gpt_checkpointing ck;
    pp_plan plan;        /* model.pp_schedule (has_plan), else pp_train_step's 1F1B */
    int has_plan, tracing;
    pp_trace trace;
    /* --device cuda: the stage is pp_stage_cuda.h's (made by set_schedule, which knows the plan's slots),
     * ws[] stays empty, params / grads are the engine's device buffers in the compute dtype (the CUDA GPT
     * widens bf16 per module call and adds each micro-batch's fp32 gradient into the bf16 buffer, as the
     * single-rank CUDA run does), and every comm is the device world's (NCCL, or STAGED) */
    int cuda;
    pp_cuda_stage *cstage;
    zero_stream *pp_stream; /* NCCL pp comm: its stream while a step runs (stream-ordered sends / receives) */
    zero_stream *compute;   /* the engine's compute stream, the CUDA stage's (engine.h: the engine orders its
                             * gathers, casts and step before the work queued there, by events) */
    char note[256];      /* what set_schedule chose that the user should know, or "" */
};

static int pfail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

#define PTRY(call, what)                                                                                          \
    do {                                                                                                          \
        gpt_clear_error(); /* the message shown must be this call's, not an older one */                         \
        if ((call) != ZERO_OK) {                                                                                  \
            pfail(err, en, "%s: %s", what, gpt_last_error()[0] ? gpt_last_error() : zero_last_error());           \
            goto fail;                                                                                            \
        }                                                                                                         \
    } while (0)

/* ------------------------------------------------------------ bf16 compute
 * The single-rank CPU model's rule (train_model.c): the engine holds bf16
 * parameters and gradients, the model computes in fp32 with bf16 matmul
 * products. Here the pipeline runs on fp32 copies of the stage's parameters
 * (widened once per step) and accumulates the M micro-batches' gradients on
 * fp32 copies of the engine's (widened, so what the engine holds is kept),
 * the tied wte gradient is summed in fp32, and the result is rounded to bf16
 * once. 2 x 4 bytes per held parameter on top of the engine's memory. */
static int f32_copies_create(train_parallel *p, char *err, size_t en)
{
    const size_t np = gpt_num_params(&p->cfg);
    const int nm = gpt_num_modules(&p->cfg);
    size_t total = 0;
    p->offset = calloc(np, sizeof *p->offset);
    p->eparams = calloc((size_t)nm, sizeof *p->eparams);
    p->egrads = calloc((size_t)nm, sizeof *p->egrads);
    if (!p->offset || !p->eparams || !p->egrads) return pfail(err, en, "model parallel: out of memory");
    for (size_t i = 0; i < np; i++) {
        tp_param_info ti;
        if (p->param_ids[i] < 0) continue;
        if (tp_param_info_get(&p->cfg, p->grid.tp_size, p->grid.tp_rank, i, &ti) != ZERO_OK)
            return pfail(err, en, "model parallel: %s", gpt_last_error());
        p->offset[i] = total;
        total += ti.numel;
    }
    p->f32_params = malloc((total ? total : 1) * sizeof(float));
    p->f32_grads = malloc((total ? total : 1) * sizeof(float));
    if (!p->f32_params || !p->f32_grads)
        return pfail(err, en, "model parallel: no memory for the fp32 copies of %zu bf16 parameters", total);
    return 0;
}

/* widen = 1: the engine's bf16 parameters and gradients into the fp32 copies,
 * p->params / p->grads pointed at them; widen = 0: the fp32 gradients rounded
 * back into the engine's. */
static int f32_copies_sync(train_parallel *p, int widen, char *err, size_t en)
{
    for (size_t i = 0; i < gpt_num_params(&p->cfg); i++) {
        if (p->param_ids[i] < 0) continue;
        tp_param_info ti;
        (void)tp_param_info_get(&p->cfg, p->grid.tp_size, p->grid.tp_rank, i, &ti);
        const int mod = ti.full.module, k = ti.full.index;
        float *p32 = p->f32_params + p->offset[i], *g32 = p->f32_grads + p->offset[i];
        zero_status st;
        if (widen) {
            st = zero_cast(p->dev, p->eparams[mod].t[k], ZERO_BF16, p32, ZERO_F32, ti.numel, NULL);
            if (st == ZERO_OK) st = zero_cast(p->dev, p->egrads[mod].t[k], ZERO_BF16, g32, ZERO_F32, ti.numel, NULL);
            p->params[mod].t[k] = p32;
            p->grads[mod].t[k] = g32;
        } else {
            st = zero_cast(p->dev, g32, ZERO_F32, p->egrads[mod].t[k], ZERO_BF16, ti.numel, NULL);
        }
        if (st != ZERO_OK)
            return pfail(err, en, "%s %s: %s", widen ? "widening to fp32" : "rounding the gradient of", ti.full.name,
                         zero_last_error());
    }
    /* the host reads (widen) or the engine's stream reads (round) these next */
    if (zero_device_sync(p->dev) != ZERO_OK) return pfail(err, en, "device sync: %s", zero_last_error());
    return 0;
}

int train_parallel_create(train_parallel **out, zero_comm *world, const gpt_config *cfg, int tp, int pp, int chunks,
                          int cp, int sequence_parallel, int micro, int micro_batches, uint64_t seed,
                          const zero_config *zc, zero_device *dev,
                          zero_engine **engine, const gpt_checkpointing *ck, char *err, size_t en)
{
    *out = NULL;
    *engine = NULL;
    train_parallel *p = calloc(1, sizeof *p);
    if (!p) return pfail(err, en, "model parallel: out of memory");
    p->cfg = *cfg;
    p->micro_batches = micro_batches;
    p->micro_tokens = (size_t)micro * (size_t)cfg->seq_len;
    p->cp_size = cp;
    p->sp = sequence_parallel;
    if (ck) p->ck = *ck;
    const int nm = gpt_num_modules(cfg);
    p->param_ids = calloc(gpt_num_params(cfg), sizeof *p->param_ids);
    p->module_ids = calloc((size_t)nm, sizeof *p->module_ids);
    p->params = calloc((size_t)nm, sizeof *p->params);
    p->grads = calloc((size_t)nm, sizeof *p->grads);
    p->chunks = chunks < 1 ? 1 : chunks;
    p->cuda = zero_device_get_kind(dev) == ZERO_DEVICE_CUDA;
    p->ws = calloc((size_t)p->chunks, sizeof *p->ws);
    if (!p->param_ids || !p->module_ids || !p->params || !p->grads || !p->ws) {
        pfail(err, en, "model parallel: out of memory");
        goto fail;
    }
    if (p->cuda && (cp > 1 || sequence_parallel)) {
        pfail(err, en, "--device cuda with model.tp / model.pp > 1: %s is not offered on the CUDA stage (model.tp, "
                       "model.pp and activation checkpointing are)",
              cp > 1 ? "model.cp > 1" : "model.sequence_parallel");
        goto fail;
    }
    /* the grid's "dp" group spans dp x cp (the engine's group: gradients summed over cp there) */
    PTRY(zero_grid_create(world, tp, pp, &p->grid), "grid");
    if (cp > 1) PTRY(tp_cp_groups_create(&p->grid, cp, &p->cp, NULL), "context-parallel group");
    PTRY(pp_embed_group_create(p->grid.pp, &p->embed), "pipeline embedding group");
    p->ep_size = cfg->moe_experts > 0 && cfg->moe_ep > 1 ? cfg->moe_ep : 1;
    if (p->ep_size > 1) {
        /* DeepSpeed-MoE's order: ep nested in the stage's dp group, ep fastest - the same split as cp's
         * (tp_cp_groups_create: ep consecutive dp ranks, and the ranks of one ep rank) */
        char name[48];
        PTRY(tp_cp_groups_create(&p->grid, p->ep_size, &p->ep, &p->edp), "expert-parallel groups");
        p->ep_rank = p->grid.dp_rank % p->ep_size;
        snprintf(name, sizeof name, "ep(pp%d,edp%d)", p->grid.pp_rank, p->grid.dp_rank / p->ep_size);
        (void)zero_comm_set_name(p->ep, name);
        snprintf(name, sizeof name, "edp(pp%d,ep%d)", p->grid.pp_rank, p->ep_rank);
        (void)zero_comm_set_name(p->edp, name);
        /* the norm's group: every rank holding a part of this replica, pp x ep */
        PTRY(zero_comm_split(world, p->grid.dp_rank / p->ep_size, zero_comm_get_rank(world), &p->mp),
             "model-parallel group");
    } else {
        PTRY(tp_engine_mp_create(world, &p->grid, &p->mp), "model-parallel group");
    }
    /* one slot per chunk for now: train_parallel_set_schedule sizes them for the plan */
    for (int c = 0; c < p->chunks && !p->cuda; c++) {
        int b, e;
        PTRY(pp_chunk_layers(cfg, pp, p->chunks, p->grid.pp_rank, c, &b, &e), "pipeline stages");
        const tp_options o = {ck, sequence_parallel, p->cp, p->ep};
        PTRY(tp_workspace_create_opts(&p->ws[c], cfg, p->grid.tp, micro, cfg->seq_len, b, e,
                                      p->chunks > 1 ? 1 : pp_slots_needed(PP_1F1B, micro_batches, pp, p->grid.pp_rank),
                                      &o),
             "tp workspace");
        PTRY(tp_workspace_set_matmul_dtype(p->ws[c], zc->compute_dtype == ZERO_BF16 ? ZERO_BF16 : ZERO_F32),
             "tp workspace");
    }
    p->dev = dev;
    p->dtype = zc->compute_dtype;
    if (p->dtype != ZERO_F32 && p->dtype != ZERO_BF16) {
        pfail(err, en, "model.tp / model.pp > 1: %s compute is not offered (fp32 or bf16; fp16's loss scaling is "
                       "not in the pipeline runtime)", zero_dtype_name(p->dtype));
        goto fail;
    }
    zero_config c = *zc;
    c.gradient_accumulation_steps = 1; /* the schedule accumulates the micro-batches (dloss 1/M) */
    PTRY(zero_engine_create(&p->engine, &c, p->edp ? p->edp : p->grid.dp, dev), "engine");
    PTRY(tp_engine_build_ep(p->engine, cfg, tp, p->grid.tp_rank, pp, p->chunks, p->grid.pp_rank, p->ep_rank, seed,
                            NULL, p->param_ids, p->module_ids),
         "building the engine of the stage's tp shards");
    if (zero_engine_set_model_parallel(p->engine, p->mp) != ZERO_OK) {
        pfail(err, en, "engine set_model_parallel: %s", zero_engine_last_error(p->engine));
        goto fail;
    }
    if (p->cuda) {
        if (zero_stream_create(dev, &p->compute) != ZERO_OK) {
            pfail(err, en, "the CUDA stage's compute stream: %s", zero_last_error());
            goto fail;
        }
        if (zero_engine_set_compute_stream(p->engine, p->compute) != ZERO_OK) {
            pfail(err, en, "engine set_compute_stream: %s", zero_engine_last_error(p->engine));
            goto fail;
        }
    }
    if (p->dtype == ZERO_BF16 && !p->cuda && f32_copies_create(p, err, en) != 0) goto fail;
    *engine = p->engine;
    *out = p;
    return 0;
fail:
    train_parallel_destroy(p);
    return -1;
}

void train_parallel_destroy(train_parallel *p)
{
    if (!p) return;
    zero_engine_destroy(p->engine);
    pp_cuda_stage_destroy(p->cstage);
    zero_stream_destroy(p->compute); /* after the engine and the stage that used it */
    zero_stream_destroy(p->pp_stream); /* never left set on the pp comm */
    for (int c = 0; p->ws && c < p->chunks; c++) tp_workspace_destroy(p->ws[c]);
    free(p->ws);
    zero_comm_destroy(p->cp);
    zero_comm_destroy(p->ep);
    zero_comm_destroy(p->edp);
    zero_comm_destroy(p->mp);
    zero_comm_destroy(p->embed);
    zero_grid_destroy(&p->grid);
    pp_plan_free(&p->plan);
    pp_trace_free(&p->trace);
    free(p->param_ids);
    free(p->module_ids);
    free(p->params);
    free(p->grads);
    free(p->eparams);
    free(p->egrads);
    free(p->offset);
    free(p->f32_params);
    free(p->f32_grads);
    free(p);
}

int train_parallel_comms(const train_parallel *p, const char **names, zero_comm **comms)
{
    int n = 0;
    names[n] = "tp", comms[n++] = p->grid.tp;
    if (p->cp) names[n] = "cp", comms[n++] = p->cp;
    names[n] = "pp", comms[n++] = p->grid.pp;
    if (p->ep) {
        names[n] = "ep", comms[n++] = p->ep;
        names[n] = "edp (engine)", comms[n++] = p->edp;
        return n;
    }
    names[n] = p->cp ? "dp x cp (engine)" : "dp (engine)", comms[n++] = p->grid.dp;
    return n;
}

/* the data-parallel replicas (the cp ranks of one share its sequences) */
int train_parallel_dp_size(const train_parallel *p) { return p->grid.dp_size / p->cp_size; }
int train_parallel_dp_rank(const train_parallel *p) { return p->grid.dp_rank / p->cp_size; }
int train_parallel_tp_rank(const train_parallel *p) { return p->grid.tp_rank; }
int train_parallel_pp_rank(const train_parallel *p) { return p->grid.pp_rank; }
zero_comm *train_parallel_dp_comm(const train_parallel *p) { return p->edp ? p->edp : p->grid.dp; }
int train_parallel_ep_rank(const train_parallel *p) { return p->ep_rank; }

void train_parallel_ckpt_dir(const train_parallel *p, const char *dir, char *out, size_t n)
{
    if (p->ep) snprintf(out, n, "%s/tp%d-pp%d-ep%d", dir, p->grid.tp_rank, p->grid.pp_rank, p->ep_rank);
    else snprintf(out, n, "%s/tp%d-pp%d", dir, p->grid.tp_rank, p->grid.pp_rank);
}

/* Expert parallelism: the dense tensors' gradients (every held one but the
 * expert stacks) summed over ep, so each ep rank's engine steps on the
 * gradient of all its ep group's micro-batches (each taken of loss / ep). */
static int ep_dense_grad_sum(train_parallel *p, char *err, size_t en)
{
    for (size_t i = 0; p->ep && i < gpt_num_params(&p->cfg); i++) {
        gpt_param_info pi;
        if (p->param_ids[i] < 0 || gpt_param_info_get(&p->cfg, i, &pi) != ZERO_OK || pi.expert_stack) continue;
        void *g = p->grads[pi.module].t[pi.index]; /* CUDA: the engine's buffer, in the compute dtype */
        if (zero_allreduce(p->ep, g, g, pi.numel, p->cuda ? p->dtype : ZERO_F32, ZERO_SUM) != ZERO_OK)
            return pfail(err, en, "summing d %s over the ep group: %s", pi.name, zero_comm_last_error(p->ep));
    }
    return 0;
}
static void add_bytes(gpt_activation_bytes *sum, const gpt_activation_bytes *a)
{
    sum->inputs += a->inputs;
    sum->blocks += a->blocks;
    sum->recompute += a->recompute;
    sum->head += a->head;
    sum->scratch += a->scratch;
    sum->host += a->host;
    sum->moe += a->moe;
    sum->total += a->total;
}

/* Summed over the stage's chunks (each chunk's workspace is its own allocation). */
void train_parallel_activation_bytes(const train_parallel *p, gpt_activation_bytes *now, gpt_activation_bytes *without)
{
    memset(now, 0, sizeof *now);
    memset(without, 0, sizeof *without);
    if (p->cuda) {
        pp_cuda_stage_activation_bytes(p->cstage, now);
        if (p->ck.blocks > 0) pp_cuda_stage_activation_bytes_without_ckpt(p->cstage, without);
        else *without = *now;
        return;
    }
    const tp_options o = {NULL, p->sp, NULL, NULL};
    for (int c = 0; c < p->chunks; c++) {
        int b, e;
        gpt_activation_bytes n, w;
        tp_workspace_activation_bytes(p->ws[c], &n);
        tp_workspace_range(p->ws[c], &b, &e);
        if (tp_activation_bytes_opts(&p->cfg, p->grid.tp_size, p->cp_size,
                                     (int)(tp_workspace_tokens(p->ws[c]) / (size_t)p->cfg.seq_len), p->cfg.seq_len, b,
                                     e, tp_workspace_slots(p->ws[c]), &o, &w) != ZERO_OK)
            w = n;
        add_bytes(now, &n);
        add_bytes(without, &w);
    }
}

/* Stage 3 with a pipeline: the schedule touches every module of the stage
 * in each micro-batch, forward and backward, so all of them stay gathered
 * for the whole step (tp_engine.h's rule) and are released before step().
 * At stages 0-2 gather and release only validate. */
static int gather_all(train_parallel *p, int gather, char *err, size_t en)
{
    const int nm = gpt_num_modules(&p->cfg);
    for (int k = 0; k < nm; k++) {
        int m = gather ? k : nm - 1 - k;
        if (p->module_ids[m] < 0) continue;
        zero_status s = gather ? zero_engine_gather(p->engine, p->module_ids[m])
                               : zero_engine_release(p->engine, p->module_ids[m]);
        if (s != ZERO_OK)
            return pfail(err, en, "engine %s of module %d: %s", gather ? "gather" : "release", m,
                         zero_engine_last_error(p->engine));
    }
    return 0;
}

int train_parallel_micro_steps(train_parallel *p, const int32_t *tokens, const int32_t *targets, float *loss,
                               char *err, size_t en)
{
    if (gather_all(p, 1, err, en)) return -1;
    const int bf16 = p->dtype == ZERO_BF16 && !p->cuda; /* the fp32 copies (CPU only) */
    if (tp_engine_sets(p->engine, &p->cfg, p->param_ids, bf16 ? p->eparams : p->params, bf16 ? p->egrads : p->grads) !=
        ZERO_OK)
        return pfail(err, en, "%s", gpt_last_error());
    if (bf16 && f32_copies_sync(p, 1, err, en) != 0) return -1;
    /* dloss: the mean over micro-batches; with cp, times cp: the engine averages over dp x cp ranks, and the
     * cp ranks' gradients are shares of one replica's gradient (their sum) */
    /* with ep: of loss / ep (the dense gradients are summed over ep below, the experts' have every ep rank's rows) */
    pp_step_args a = {p->micro_batches, tokens, targets,
                      (float)p->cp_size / (float)p->micro_batches / (float)p->ep_size, p->params, p->grads};
    pp_run_opts o = {p->tracing ? &p->trace : NULL, 0.0};
    zero_status st;
    if (p->cuda) {
        if (!p->cstage) return pfail(err, en, "pipeline step: the CUDA stage has no schedule (set_schedule first)");
        pp_stage view;
        pp_cuda_stage_view(p->cstage, &view);
        /* NCCL: the sends and receives stream-ordered on a stream of their own, ordered against the stage's
         * stream by events (pp_exec.c); STAGED and MPI stay host-driven (a stream-ordered STAGED op would
         * block the host in every group) */
        zero_comm *pp = p->grid.pp;
        int streamed = pp && zero_comm_get_size(pp) > 1 && zero_comm_get_backend(pp) == ZERO_BACKEND_NCCL;
        if (streamed && !p->pp_stream && zero_stream_create(p->dev, &p->pp_stream) != ZERO_OK)
            return pfail(err, en, "pipeline step: the pp comm's stream: %s", zero_last_error());
        if (streamed && zero_comm_set_stream(pp, p->pp_stream) != ZERO_OK)
            return pfail(err, en, "pipeline step: zero_comm_set_stream(pp): %s", zero_comm_last_error(pp));
        st = pp_run_stage(&view, pp, &p->plan, &a, &o, loss);
        if (streamed && zero_comm_set_stream(pp, NULL) != ZERO_OK && st == ZERO_OK) /* the runtime synced it */
            return pfail(err, en, "pipeline step: zero_comm_set_stream(pp, NULL): %s", zero_comm_last_error(pp));
    } else {
        st = p->has_plan ? pp_run_plan(p->ws, p->grid.pp, &p->plan, &a, &o, loss)
                         : pp_train_step(p->ws[0], p->grid.pp, PP_1F1B, &a, loss);
    }
    if (st != ZERO_OK) return pfail(err, en, "pipeline step: %s", gpt_last_error());
    for (int c = 0; c < p->chunks && !p->cuda; c++) /* each chunk's blocks (interleaved: >= 2 stages, so wte once per rank) */
        if (tp_seq_grad_allreduce(p->ws[c], p->grads) != ZERO_OK)
            return pfail(err, en, "sequence-parallel gradients: %s", gpt_last_error());
    /* the CUDA stage's gradients are the engine's buffers in the compute dtype; the CPU's are fp32 */
    if (pp_tied_grad_allreduce_dtype(p->embed, &p->cfg, &p->grads[GPT_MODULE_EMBED],
                                     p->cuda ? p->dtype : ZERO_F32) != ZERO_OK)
        return pfail(err, en, "tied embedding gradient: %s", gpt_last_error());
    if (ep_dense_grad_sum(p, err, en) != 0) return -1;
    if (bf16 && f32_copies_sync(p, 0, err, en) != 0) return -1;
    if (tp_engine_grads_ready(p->engine, &p->cfg, p->module_ids) != ZERO_OK)
        return pfail(err, en, "%s", gpt_last_error());
    return gather_all(p, 0, err, en);
}

/* ------------------------------------------------------------ schedules (docs/pipeline.md) */
/* The CUDA stage for `plan` (taken over on success): the chunks' workspaces
 * with the plan's slots, in the single-rank CUDA run's mode (train_model.c:
 * bf16 compute = bf16 activations + flash attention; fp32 = fp32
 * activations, unfused attention; bf16 tensor-core products in both), split
 * (B/W) plans included, and activation_checkpointing as on one rank. */
static int cuda_stage_for(train_parallel *p, pp_plan *plan, const char *schedule, char *err, size_t en)
{
    gpt_cuda_options o = GPT_CUDA_OPTIONS_BF16;
    if (p->dtype != ZERO_BF16) o.act_dtype = ZERO_F32, o.attention = GPT_CUDA_ATTN_UNFUSED;
    p->note[0] = 0;
    int *slots = malloc(sizeof(int) * (size_t)p->chunks);
    if (!slots) {
        pp_plan_free(plan);
        return pfail(err, en, "model.pp_schedule \"%s\": out of memory", schedule);
    }
    for (int c = 0; c < p->chunks; c++) slots[c] = plan->slots[p->grid.pp_rank * p->chunks + c];
    pp_cuda_stage *s = NULL;
    zero_status st = pp_cuda_stage_create(&s, &p->cfg, p->dev, p->compute,
                                          (int)(p->micro_tokens / (size_t)p->cfg.seq_len), p->dtype, &o,
                                          p->ck.blocks > 0 ? &p->ck : NULL, p->grid.pp_size, p->grid.pp_rank,
                                          p->chunks, slots, p->grid.tp, p->ep);
    free(slots);
    if (st != ZERO_OK) {
        pp_plan_free(plan);
        return pfail(err, en, "model.pp_schedule \"%s\": the CUDA stage: %s", schedule, gpt_last_error());
    }
    pp_cuda_stage_destroy(p->cstage);
    p->cstage = s;
    pp_plan_free(&p->plan);
    p->plan = *plan;
    p->has_plan = 1;
    return 0;
}

const char *train_parallel_note(const train_parallel *p) { return p->note; }

int train_parallel_set_schedule(train_parallel *p, const char *schedule, int chunks, char *err, size_t en)
{
    pp_schedule_kind kind;
    if (pp_schedule_parse(schedule, &kind) != ZERO_OK) return pfail(err, en, "model.pp_schedule: %s", gpt_last_error());
    if (kind == PP_SCHED_INTERLEAVED && chunks < 2)
        return pfail(err, en, "model.pp_schedule \"interleaved\" needs model.pp_virtual >= 2 (chunks per stage), got %d",
                     chunks);
    if (kind != PP_SCHED_INTERLEAVED && chunks != 1)
        return pfail(err, en, "model.pp_virtual %d: only model.pp_schedule \"interleaved\" has chunks per stage", chunks);
    if (chunks != p->chunks) /* the engine registered the blocks of p->chunks chunks */
        return pfail(err, en, "model.pp_virtual %d: the stage was built with %d chunks", chunks, p->chunks);
    pp_plan plan;
    if (pp_plan_generate(&plan, kind, p->grid.pp_size, p->micro_batches, chunks) != ZERO_OK)
        return pfail(err, en, "model.pp_schedule \"%s\": %s", schedule, gpt_last_error());
    if (p->cuda) return cuda_stage_for(p, &plan, schedule, err, en);
    for (int c = 0; c < chunks; c++) {
        int need = plan.slots[p->grid.pp_rank * chunks + c];
        if (need <= tp_workspace_slots(p->ws[c])) continue;
        int b, e;
        tp_workspace *ws = NULL;
        tp_workspace_range(p->ws[c], &b, &e);
        const tp_options o = {p->ck.blocks ? &p->ck : NULL, p->sp, p->cp, p->ep};
        if (tp_workspace_create_opts(&ws, &p->cfg, p->grid.tp,
                                     (int)(tp_workspace_tokens(p->ws[c]) / (size_t)p->cfg.seq_len), p->cfg.seq_len, b,
                                     e, need, &o) != ZERO_OK ||
            tp_workspace_set_matmul_dtype(ws, p->dtype == ZERO_BF16 ? ZERO_BF16 : ZERO_F32) != ZERO_OK) {
            tp_workspace_destroy(ws);
            pp_plan_free(&plan);
            return pfail(err, en, "model.pp_schedule \"%s\": workspace of %d slots for chunk %d: %s", schedule, need,
                         c, gpt_last_error());
        }
        tp_workspace_destroy(p->ws[c]);
        p->ws[c] = ws;
    }
    pp_plan_free(&p->plan);
    p->plan = plan;
    p->has_plan = 1;
    return 0;
}

void train_parallel_enable_trace(train_parallel *p) { p->tracing = 1; }

void train_parallel_trace_optimizer(train_parallel *p, double t0, double t1)
{
    if (!p || !p->tracing) return;
    pp_trace_add(&p->trace, PP_SPAN_OPTIMIZER, -1, 0, t0, t1);
    p->trace.step++;
}

int train_parallel_write_trace(train_parallel *p, zero_comm *world, const char *path, char *err, size_t en)
{
    char label[96];
    snprintf(label, sizeof label, "zero-train %s, pp %d, tp %d, dp %d", p->has_plan ? p->plan.name : "1f1b",
             p->grid.pp_size, p->grid.tp_size, p->grid.dp_size);
    if (pp_trace_write(world, &p->trace, p->grid.pp_rank, path, label) != ZERO_OK)
        return pfail(err, en, "--trace %s: %s", path, gpt_last_error());
    return 0;
}
