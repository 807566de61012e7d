/* Pipeline stages and the GPipe / 1F1B micro-batch schedules over a
 * tp_workspace (see pp_gpt.h). */
#include <string.h>

#include "gpt_internal.h"
#include "pp_gpt.h"

/* ------------------------------------------------------------ stages */
zero_status pp_stage_layers(const gpt_config *cfg, int pp_size, int pp_rank, int *begin, int *end)
{
    GPT_TRY(gpt_config_validate(cfg));
    if (!begin || !end) return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_stage_layers: begin or end is NULL");
    if (pp_size < 1 || pp_size > cfg->n_layer)
        return gpt_fail(ZERO_CONFIG, "pp config: %d stages for %d blocks (each stage needs at least one block)",
                        pp_size, cfg->n_layer);
    if (pp_rank < 0 || pp_rank >= pp_size)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_stage_layers: stage %d outside [0, %d)", pp_rank, pp_size);
    int base = cfg->n_layer / pp_size, extra = cfg->n_layer % pp_size;
    *begin = pp_rank * base + (pp_rank < extra ? pp_rank : extra);
    *end = *begin + base + (pp_rank < extra ? 1 : 0);
    return ZERO_OK;
}

int pp_stage_holds(const gpt_config *cfg, int pp_size, int pp_rank, int module, int index)
{
    int b, e;
    if (pp_stage_layers(cfg, pp_size, pp_rank, &b, &e) != ZERO_OK) return 0;
    int first = pp_rank == 0, last = pp_rank == pp_size - 1;
    if (module == GPT_MODULE_EMBED) return index == GPT_WTE ? first || last : first;
    if (module == gpt_module_final(cfg)) return last;
    return module - 1 >= b && module - 1 < e;
}

zero_status pp_embed_group_create(zero_comm *pp, zero_comm **out)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_embed_group_create: out is NULL");
    *out = NULL;
    if (!pp || zero_comm_get_size(pp) == 1) return ZERO_OK;
    int r = zero_comm_get_rank(pp), n = zero_comm_get_size(pp);
    /* split needs a color on every rank: middle stages get groups of their own, dropped */
    int member = r == 0 || r == n - 1;
    zero_comm *g = NULL;
    zero_status st = zero_comm_split(pp, member ? 0 : 1 + r, r, &g);
    if (st != ZERO_OK)
        return gpt_fail(st, "pp_embed_group_create: split of %s at stage %d: %s", zero_comm_get_name(pp), r,
                        zero_comm_last_error(pp));
    if (!member) {
        zero_comm_destroy(g);
        return ZERO_OK;
    }
    zero_comm_set_name(g, "pp_embed");
    *out = g;
    return ZERO_OK;
}

zero_status pp_tied_grad_allreduce(zero_comm *group, const gpt_config *cfg, gpt_tensors *embed_grads)
{
    if (!group) return ZERO_OK;
    if (!cfg || !embed_grads || !embed_grads->t[GPT_WTE])
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_tied_grad_allreduce: cfg or the wte gradient is NULL");
    size_t n = (size_t)cfg->vocab * cfg->d_model;
    zero_status st = zero_allreduce(group, embed_grads->t[GPT_WTE], embed_grads->t[GPT_WTE], n, ZERO_F32, ZERO_SUM);
    if (st != ZERO_OK)
        return gpt_fail(st, "pp_tied_grad_allreduce: wte.weight gradient (%zu floats) over %s, rank %d: %s", n,
                        zero_comm_get_name(group), zero_comm_get_rank(group), zero_comm_last_error(group));
    return ZERO_OK;
}

int pp_slots_needed(pp_schedule kind, int micro_batches, int pp_size, int pp_rank)
{
    if (kind == PP_GPIPE) return micro_batches;
    int live = pp_size - pp_rank;
    return live < micro_batches ? live : micro_batches;
}

/* ------------------------------------------------------------ the schedule */
#define PP_MAX_SLOTS 64

typedef struct pp_run {
    tp_workspace *ws;
    zero_comm *pp;
    int stage, nstages, nslots, first_layer, last_layer, module_final;
    size_t N, C;
    const pp_step_args *a;
    zero_request *act_send[PP_MAX_SLOTS]; /* forward output of a slot, in flight to the next stage */
    zero_request *grad_send;              /* dresid, in flight to the previous stage */
    double loss_sum;
} pp_run;

static zero_status comm_fail(pp_run *r, zero_status st, const char *what, int micro)
{
    return gpt_fail(st, "pipeline %s of micro-batch %d at stage %d of %d (group %s): %s", what, micro, r->stage,
                    r->nstages, zero_comm_get_name(r->pp), zero_comm_last_error(r->pp));
}

static zero_status forward_one(pp_run *r, int m)
{
    const pp_step_args *a = r->a;
    int slot = m % r->nslots;
    if (r->act_send[slot]) { /* the slot's previous output must have left */
        zero_status st = zero_wait(r->act_send[slot]);
        r->act_send[slot] = NULL;
        if (st != ZERO_OK) return comm_fail(r, st, "send of the activations", m - r->nslots);
    }
    if (r->stage == 0) {
        GPT_TRY(tp_forward_embed(r->ws, slot, a->tokens + (size_t)m * r->N, &a->params[GPT_MODULE_EMBED]));
    } else {
        zero_status st = zero_recv(r->pp, tp_workspace_input(r->ws, slot), r->N * r->C, ZERO_F32, r->stage - 1);
        if (st != ZERO_OK) return comm_fail(r, st, "receive of the activations", m);
    }
    for (int l = r->first_layer; l < r->last_layer; l++)
        GPT_TRY(tp_forward_block(r->ws, slot, l, &a->params[gpt_module_block(l)]));
    if (r->stage == r->nstages - 1) {
        float loss = 0.0f;
        GPT_TRY(tp_forward_head(r->ws, slot, a->targets + (size_t)m * r->N, &a->params[r->module_final],
                                &a->params[GPT_MODULE_EMBED], &loss));
        r->loss_sum += loss;
    } else {
        zero_status st = zero_send_async(r->pp, tp_workspace_output(r->ws, slot), r->N * r->C, ZERO_F32,
                                         r->stage + 1, &r->act_send[slot]);
        if (st != ZERO_OK) return comm_fail(r, st, "send of the activations", m);
    }
    return ZERO_OK;
}

static zero_status backward_one(pp_run *r, int m)
{
    const pp_step_args *a = r->a;
    int slot = m % r->nslots;
    float *dres = tp_workspace_dresid(r->ws);
    if (r->grad_send) { /* dresid is about to be overwritten */
        zero_status st = zero_wait(r->grad_send);
        r->grad_send = NULL;
        if (st != ZERO_OK) return comm_fail(r, st, "send of the input gradient", m - 1);
    }
    if (r->stage == r->nstages - 1) {
        GPT_TRY(tp_backward_head(r->ws, slot, a->dloss, &a->params[r->module_final], &a->grads[r->module_final],
                                 &a->params[GPT_MODULE_EMBED], &a->grads[GPT_MODULE_EMBED]));
    } else {
        zero_status st = zero_recv(r->pp, dres, r->N * r->C, ZERO_F32, r->stage + 1);
        if (st != ZERO_OK) return comm_fail(r, st, "receive of the output gradient", m);
    }
    for (int l = r->last_layer - 1; l >= r->first_layer; l--)
        GPT_TRY(tp_backward_block(r->ws, slot, l, &a->params[gpt_module_block(l)], &a->grads[gpt_module_block(l)]));
    if (r->stage == 0) {
        GPT_TRY(tp_backward_embed(r->ws, slot, &a->grads[GPT_MODULE_EMBED]));
    } else {
        zero_status st = zero_send_async(r->pp, dres, r->N * r->C, ZERO_F32, r->stage - 1, &r->grad_send);
        if (st != ZERO_OK) return comm_fail(r, st, "send of the input gradient", m);
    }
    return ZERO_OK;
}

static zero_status run_schedule(pp_run *r, pp_schedule kind)
{
    const int M = r->a->micro_batches;
    if (kind == PP_GPIPE) {
        for (int m = 0; m < M; m++) GPT_TRY(forward_one(r, m));
        for (int m = 0; m < M; m++) GPT_TRY(backward_one(r, m));
        return ZERO_OK;
    }
    int warmup = r->nstages - r->stage - 1;
    if (warmup > M) warmup = M;
    for (int m = 0; m < warmup; m++) GPT_TRY(forward_one(r, m));
    for (int j = 0; j < M - warmup; j++) {
        GPT_TRY(forward_one(r, warmup + j));
        GPT_TRY(backward_one(r, j));
    }
    for (int j = M - warmup; j < M; j++) GPT_TRY(backward_one(r, j));
    return ZERO_OK;
}

zero_status pp_train_step(tp_workspace *ws, zero_comm *pp, pp_schedule kind, const pp_step_args *a, float *loss)
{
    if (!ws || !a || !a->params || !a->grads)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_train_step: workspace, args, params or grads is NULL");
    if (kind != PP_GPIPE && kind != PP_1F1B)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_train_step: unknown schedule %d", (int)kind);
    pp_run r;
    memset(&r, 0, sizeof r);
    r.ws = ws;
    r.pp = pp && zero_comm_get_size(pp) > 1 ? pp : NULL;
    r.stage = r.pp ? zero_comm_get_rank(pp) : 0;
    r.nstages = r.pp ? zero_comm_get_size(pp) : 1;
    r.a = a;
    int has_embed = tp_workspace_has_embed(ws), has_head = tp_workspace_has_head(ws);
    if (has_embed != (r.stage == 0) || has_head != (r.stage == r.nstages - 1))
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "pp_train_step: stage %d of %d, but the workspace %s the embedding and %s the head",
                        r.stage, r.nstages, has_embed ? "has" : "lacks", has_head ? "has" : "lacks");
    const gpt_config *cfg = tp_workspace_config(ws);
    tp_workspace_range(ws, &r.first_layer, &r.last_layer);
    r.nslots = tp_workspace_slots(ws);
    r.module_final = gpt_module_final(cfg);
    r.N = tp_workspace_rows(ws);
    r.C = (size_t)cfg->d_model;
    int need = pp_slots_needed(kind, a->micro_batches, r.nstages, r.stage);
    if (a->micro_batches < 1 || r.nslots < need || need > PP_MAX_SLOTS)
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "pp_train_step: %d micro-batches need %d activation slots at stage %d (at most %d), the workspace has %d",
                        a->micro_batches, need, r.stage, PP_MAX_SLOTS, r.nslots);
    if ((r.stage == 0 && !a->tokens) || (r.stage == r.nstages - 1 && !a->targets))
        return gpt_fail(ZERO_INVALID_ARGUMENT, "pp_train_step: stage %d needs %s", r.stage,
                        r.stage == 0 ? "tokens" : "targets");

    zero_status st = run_schedule(&r, kind);
    /* sends still in flight complete (or fail) before their buffers go */
    for (int s = 0; s < PP_MAX_SLOTS; s++)
        if (r.act_send[s]) {
            zero_status w = zero_wait(r.act_send[s]);
            if (st == ZERO_OK && w != ZERO_OK) st = comm_fail(&r, w, "send of the activations", -1);
        }
    if (r.grad_send) {
        zero_status w = zero_wait(r.grad_send);
        if (st == ZERO_OK && w != ZERO_OK) st = comm_fail(&r, w, "send of the input gradient", -1);
    }
    if (st != ZERO_OK) return st;

    float mean = (float)(r.loss_sum / a->micro_batches);
    if (r.pp) {
        st = zero_broadcast(r.pp, &mean, &mean, 1, ZERO_F32, r.nstages - 1);
        if (st != ZERO_OK) return comm_fail(&r, st, "broadcast of the loss", -1);
    }
    if (loss) *loss = mean;
    return ZERO_OK;
}
