/* The tensor-parallel stage runtime: forward and backward of a block range
 * on one tp rank's shards, built from the single-rank kernels
 * (gpt_cpu_ops.h) plus Megatron's f/g all-reduces. Reads like gpt_cpu.c with
 * local widths: Cl = C/P attention channels (H/P heads of the same head
 * size), Hl = 4C/P MLP units. */
#include <stdlib.h>
#include <string.h>

#include "gpt_cpu_ops.h"
#include "gpt_internal.h"
#include "tp_gpt.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct tp_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* N x C, N, N (replicated) */
    float *qkv;                       /* N x 3Cl: [q | k | v] of the local heads */
    float *att;                       /* B x H/P x T x T */
    float *atty;                      /* N x Cl */
    float *res2;                      /* N x C (replicated, after the g all-reduce) */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;            /* N x Hl */
    float *res3;                      /* N x C */
} tp_layer_acts;

typedef struct tp_slot {
    int32_t *tokens, *targets;
    float *input;                     /* N x C: block layer_begin's input */
    tp_layer_acts *layers;            /* layer_end - layer_begin */
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *lse; /* head stage only */
    long valid;
    int next_fwd;                     /* the next block this slot's forward expects */
    int head_done;
} tp_slot;

struct tp_workspace {
    gpt_config cfg;
    zero_comm *tp;
    int tp_size, tp_rank;
    int B, T, nthreads, begin, end, nslots;
    size_t bytes;
    void *mem;
    tp_slot *slots;
    tp_layer_acts *acts;              /* nslots x (end - begin) */
    float *dres, *dln, *dqkv, *dfch, *dlogits, *partials, *att_scratch;
    int bwd_slot, bwd_next;           /* backward in progress: its slot and next block (-2: none) */
};

/* ------------------------------------------------------------ layout */
static void *carve(size_t *offset, void *base, size_t bytes)
{
    size_t at = (*offset + 63) & ~(size_t)63;
    *offset = at + bytes;
    return base ? (char *)base + at : NULL;
}

/* Count (base NULL) or assign every buffer, so size and carving agree. */
static size_t layout(tp_workspace *ws, void *base)
{
    const size_t N = (size_t)ws->B * ws->T, C = (size_t)ws->cfg.d_model, V = (size_t)ws->cfg.vocab;
    const size_t Cl = C / (size_t)ws->tp_size, Hl = 4 * C / (size_t)ws->tp_size;
    const size_t NHl = (size_t)(ws->cfg.n_head / ws->tp_size), TT = (size_t)ws->T * ws->T;
    const int head = ws->end == ws->cfg.n_layer, nl = ws->end - ws->begin;
    size_t off = 0;
    tp_slot scratch_slot;
    tp_layer_acts scratch_acts;
#define CARVE(field, count, type) (field) = (type *)carve(&off, base, sizeof(type) * (count))
    for (int s = 0; s < ws->nslots; s++) {
        tp_slot *sl = base ? &ws->slots[s] : &scratch_slot;
        CARVE(sl->tokens, N, int32_t);
        CARVE(sl->targets, N, int32_t);
        CARVE(sl->input, N * C, float);
        for (int l = 0; l < nl; l++) {
            tp_layer_acts *a = base ? &ws->acts[(size_t)s * nl + l] : &scratch_acts;
            CARVE(a->ln1, N * C, float);
            CARVE(a->ln1_mean, N, float);
            CARVE(a->ln1_rstd, N, float);
            CARVE(a->qkv, N * 3 * Cl, float);
            CARVE(a->att, (size_t)ws->B * NHl * TT, float);
            CARVE(a->atty, N * Cl, float);
            CARVE(a->res2, N * C, float);
            CARVE(a->ln2, N * C, float);
            CARVE(a->ln2_mean, N, float);
            CARVE(a->ln2_rstd, N, float);
            CARVE(a->fch, N * Hl, float);
            CARVE(a->fch_gelu, N * Hl, float);
            CARVE(a->res3, N * C, float);
        }
        if (head) {
            CARVE(sl->lnf, N * C, float);
            CARVE(sl->lnf_mean, N, float);
            CARVE(sl->lnf_rstd, N, float);
            CARVE(sl->logits, N * V, float);
            CARVE(sl->lse, N, float);
        }
    }
    CARVE(ws->dres, N * C, float);
    CARVE(ws->dln, N * C, float);
    CARVE(ws->dqkv, N * 3 * Cl, float);
    CARVE(ws->dfch, N * Hl, float);
    if (head) CARVE(ws->dlogits, N * V, float);
    CARVE(ws->partials, (size_t)ws->nthreads * 4 * C, float);
    CARVE(ws->att_scratch, (size_t)ws->nthreads * TT, float);
#undef CARVE
    return (off + 63) & ~(size_t)63;
}

zero_status tp_workspace_create(tp_workspace **out, const gpt_config *cfg, zero_comm *tp, int batch, int seq,
                                int layer_begin, int layer_end, int slots)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_workspace_create: out is NULL");
    *out = NULL;
    int tp_size = tp ? zero_comm_size(tp) : 1;
    GPT_TRY(tp_config_validate(cfg, tp_size));
    if (batch < 1 || seq < 1 || seq > cfg->seq_len || slots < 1 || layer_begin < 0 || layer_end > cfg->n_layer ||
        layer_begin >= layer_end)
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "tp_workspace_create: batch %d x seq %d, blocks [%d, %d), %d slots is invalid (need batch >= 1, "
                        "1 <= seq <= %d, 0 <= begin < end <= n_layer %d, slots >= 1)",
                        batch, seq, layer_begin, layer_end, slots, cfg->seq_len, cfg->n_layer);
    tp_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) return gpt_fail(ZERO_OUT_OF_MEMORY, "tp_workspace_create: no memory for the header");
    ws->cfg = *cfg;
    ws->tp = tp;
    ws->tp_size = tp_size;
    ws->tp_rank = tp ? zero_comm_rank(tp) : 0;
    ws->B = batch;
    ws->T = seq;
#ifdef _OPENMP
    ws->nthreads = omp_get_max_threads();
#else
    ws->nthreads = 1;
#endif
    ws->begin = layer_begin;
    ws->end = layer_end;
    ws->nslots = slots;
    ws->bwd_next = -2;
    gpt_blas_single_threaded();
    size_t nl = (size_t)(layer_end - layer_begin);
    ws->slots = calloc((size_t)slots, sizeof *ws->slots);
    ws->acts = calloc((size_t)slots * nl, sizeof *ws->acts);
    size_t bytes = layout(ws, NULL);
    ws->mem = ws->slots && ws->acts ? aligned_alloc(64, bytes) : NULL;
    if (!ws->mem) {
        tp_workspace_destroy(ws);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "tp_workspace_create: cannot allocate %zu bytes of activations", bytes);
    }
    layout(ws, ws->mem);
    for (int s = 0; s < slots; s++) {
        ws->slots[s].layers = ws->acts + (size_t)s * nl;
        ws->slots[s].next_fwd = -1;
    }
    ws->bytes = bytes + sizeof *ws + sizeof(tp_slot) * (size_t)slots + sizeof(tp_layer_acts) * (size_t)slots * nl;
    *out = ws;
    return ZERO_OK;
}

void tp_workspace_destroy(tp_workspace *ws)
{
    if (!ws) return;
    free(ws->mem);
    free(ws->acts);
    free(ws->slots);
    free(ws);
}

size_t tp_workspace_bytes(const tp_workspace *ws) { return ws ? ws->bytes : 0; }
const gpt_config *tp_workspace_config(const tp_workspace *ws) { return ws ? &ws->cfg : NULL; }
int tp_workspace_slots(const tp_workspace *ws) { return ws ? ws->nslots : 0; }
size_t tp_workspace_rows(const tp_workspace *ws) { return ws ? (size_t)ws->B * ws->T : 0; }

void tp_workspace_range(const tp_workspace *ws, int *layer_begin, int *layer_end)
{
    *layer_begin = ws ? ws->begin : 0;
    *layer_end = ws ? ws->end : 0;
}

int tp_workspace_has_embed(const tp_workspace *ws) { return ws && ws->begin == 0; }
int tp_workspace_has_head(const tp_workspace *ws) { return ws && ws->end == ws->cfg.n_layer; }

static int slot_ok(const tp_workspace *ws, int slot) { return ws && slot >= 0 && slot < ws->nslots; }

float *tp_workspace_input(tp_workspace *ws, int slot)
{
    return slot_ok(ws, slot) ? ws->slots[slot].input : NULL;
}

const float *tp_workspace_output(const tp_workspace *ws, int slot)
{
    return slot_ok(ws, slot) ? ws->slots[slot].layers[ws->end - 1 - ws->begin].res3 : NULL;
}

float *tp_workspace_dresid(tp_workspace *ws) { return ws ? ws->dres : NULL; }

/* ------------------------------------------------------------ checks and the all-reduce */
static zero_status check_tensors(const char *op, const gpt_tensors *set, const int *idx, int n, const char *what)
{
    if (!set) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: the %s set is NULL", op, what);
    for (int k = 0; k < n; k++)
        if (!set->t[idx[k]]) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: %s tensor %d is NULL", op, what, idx[k]);
    return ZERO_OK;
}

static const int all_block[GPT_BLOCK_NT] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
static const int wte_only[1] = {GPT_WTE};
static const int embed_both[2] = {GPT_WTE, GPT_WPE};
static const int final_both[2] = {GPT_LNF_W, GPT_LNF_B};

static zero_status check_slot(const tp_workspace *ws, int slot, const char *op)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: workspace is NULL", op);
    if (!slot_ok(ws, slot))
        return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: slot %d outside [0, %d)", op, slot, ws->nslots);
    return ZERO_OK;
}

/* Megatron's g forward / f backward: sum the tp ranks' partial results. */
static zero_status tp_sum(tp_workspace *ws, float *buf, size_t n, const char *what, int layer)
{
    if (ws->tp_size == 1) return ZERO_OK;
    zero_status st = zero_allreduce(ws->tp, buf, buf, n, ZERO_F32, ZERO_SUM);
    if (st != ZERO_OK)
        return gpt_fail(st, "tp all-reduce of %s in block %d (tp rank %d of %d, group %s): %s", what, layer,
                        ws->tp_rank, ws->tp_size, zero_comm_name(ws->tp), zero_comm_last_error(ws->tp));
    return ZERO_OK;
}

/* ------------------------------------------------------------ forward */
zero_status tp_forward_embed(tp_workspace *ws, int slot, const int32_t *tokens, const gpt_tensors *embed)
{
    GPT_TRY(check_slot(ws, slot, "tp_forward_embed"));
    if (ws->begin != 0)
        return gpt_fail(ZERO_INVALID_STATE, "tp_forward_embed: this stage starts at block %d, it has no embedding",
                        ws->begin);
    if (!tokens) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_forward_embed: tokens is NULL");
    GPT_TRY(check_tensors("tp_forward_embed", embed, embed_both, 2, "embed parameter"));
    const int N = ws->B * ws->T, V = ws->cfg.vocab;
    for (int i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_forward_embed: token %d at batch %d position %d is outside [0, %d)",
                            tokens[i], i / ws->T, i % ws->T, V);
    tp_slot *s = &ws->slots[slot];
    memcpy(s->tokens, tokens, sizeof(int32_t) * (size_t)N);
    gpt_encoder_forward(s->input, s->tokens, embed->t[GPT_WTE], embed->t[GPT_WPE], ws->B, ws->T, ws->cfg.d_model);
    s->next_fwd = ws->begin;
    return ZERO_OK;
}

zero_status tp_forward_block(tp_workspace *ws, int slot, int layer, const gpt_tensors *p)
{
    GPT_TRY(check_slot(ws, slot, "tp_forward_block"));
    tp_slot *s = &ws->slots[slot];
    /* a later stage starts a micro-batch at its first block (input received) */
    if (layer == ws->begin && ws->begin > 0) s->next_fwd = layer;
    if (layer < ws->begin || layer >= ws->end || layer != s->next_fwd)
        return gpt_fail(ZERO_INVALID_STATE, "tp_forward_block: block %d of slot %d out of order (stage blocks [%d, %d), expected %d)",
                        layer, slot, ws->begin, ws->end, s->next_fwd);
    GPT_TRY(check_tensors("tp_forward_block", p, all_block, GPT_BLOCK_NT, "block parameter"));
    const int B = ws->B, T = ws->T, C = ws->cfg.d_model, N = B * T, P = ws->tp_size;
    const int Cl = C / P, Hl = 4 * C / P, NHl = ws->cfg.n_head / P, lead = ws->tp_rank == 0;
    tp_layer_acts *a = &s->layers[layer - ws->begin];
    const float *x = layer == ws->begin ? s->input : s->layers[layer - 1 - ws->begin].res3;

    /* attention: res2 = x + c_proj(attention(c_attn(ln_1(x)))), the heads split over tp */
    gpt_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->t[GPT_LN1_W], p->t[GPT_LN1_B], N, C);
    gpt_matmul_forward(a->qkv, NULL, a->ln1, p->t[GPT_QKV_W], p->t[GPT_QKV_B], N, C, 3 * Cl);
    gpt_attention_forward(a->atty, a->att, a->qkv, B, T, Cl, NHl, ws->nthreads);
    /* row-parallel: the partial products sum over tp; rank 0 brings x + bias */
    gpt_matmul_forward(a->res2, lead ? x : NULL, a->atty, p->t[GPT_ATTPROJ_W], lead ? p->t[GPT_ATTPROJ_B] : NULL, N,
                       Cl, C);
    GPT_TRY(tp_sum(ws, a->res2, (size_t)N * C, "the attention output", layer));

    /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))), the hidden units split over tp */
    gpt_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->t[GPT_LN2_W], p->t[GPT_LN2_B], N, C);
    gpt_matmul_forward(a->fch, NULL, a->ln2, p->t[GPT_FC_W], p->t[GPT_FC_B], N, C, Hl);
    gpt_gelu_forward(a->fch_gelu, a->fch, (size_t)N * Hl);
    gpt_matmul_forward(a->res3, lead ? a->res2 : NULL, a->fch_gelu, p->t[GPT_FCPROJ_W],
                       lead ? p->t[GPT_FCPROJ_B] : NULL, N, Hl, C);
    GPT_TRY(tp_sum(ws, a->res3, (size_t)N * C, "the MLP output", layer));
    s->next_fwd = layer + 1;
    s->head_done = 0;
    return ZERO_OK;
}

zero_status tp_forward_head(tp_workspace *ws, int slot, const int32_t *targets, const gpt_tensors *final_params,
                            const gpt_tensors *embed, float *loss)
{
    GPT_TRY(check_slot(ws, slot, "tp_forward_head"));
    tp_slot *s = &ws->slots[slot];
    if (ws->end != ws->cfg.n_layer)
        return gpt_fail(ZERO_INVALID_STATE, "tp_forward_head: this stage ends at block %d, it has no head", ws->end);
    if (s->next_fwd != ws->end)
        return gpt_fail(ZERO_INVALID_STATE, "tp_forward_head: slot %d has not run blocks up to %d forward", slot,
                        ws->end - 1);
    if (!targets) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_forward_head: targets is NULL");
    GPT_TRY(check_tensors("tp_forward_head", final_params, final_both, 2, "final parameter"));
    GPT_TRY(check_tensors("tp_forward_head", embed, wte_only, 1, "embed parameter"));
    const int N = ws->B * ws->T, C = ws->cfg.d_model, V = ws->cfg.vocab;
    for (int i = 0; i < N; i++)
        if (targets[i] >= V)
            return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_forward_head: target %d at position %d is >= vocab %d",
                            targets[i], i, V);
    memcpy(s->targets, targets, sizeof(int32_t) * (size_t)N);
    gpt_layernorm_forward(s->lnf, s->lnf_mean, s->lnf_rstd, tp_workspace_output(ws, slot), final_params->t[GPT_LNF_W],
                          final_params->t[GPT_LNF_B], N, C);
    /* the tied head, replicated over tp: logits = ln_f(x) wte^T */
    gpt_matmul_forward(s->logits, NULL, s->lnf, embed->t[GPT_WTE], NULL, N, C, V);
    double total = gpt_crossentropy_forward(s->lse, s->logits, s->targets, N, V, &s->valid);
    if (loss) *loss = s->valid ? (float)(total / s->valid) : 0.0f;
    s->head_done = 1;
    return ZERO_OK;
}

/* ------------------------------------------------------------ backward */
zero_status tp_backward_head(tp_workspace *ws, int slot, float dloss, const gpt_tensors *final_params,
                             gpt_tensors *final_grads, const gpt_tensors *embed, gpt_tensors *embed_grads)
{
    GPT_TRY(check_slot(ws, slot, "tp_backward_head"));
    tp_slot *s = &ws->slots[slot];
    if (!s->head_done)
        return gpt_fail(ZERO_INVALID_STATE, "tp_backward_head: slot %d needs tp_forward_head first", slot);
    GPT_TRY(check_tensors("tp_backward_head", final_params, final_both, 2, "final parameter"));
    GPT_TRY(check_tensors("tp_backward_head", final_grads, final_both, 2, "final gradient"));
    GPT_TRY(check_tensors("tp_backward_head", embed, wte_only, 1, "embed parameter"));
    GPT_TRY(check_tensors("tp_backward_head", embed_grads, wte_only, 1, "embed gradient"));
    const int N = ws->B * ws->T, C = ws->cfg.d_model, V = ws->cfg.vocab;
    float scale = s->valid ? dloss / (float)s->valid : 0.0f;
    gpt_crossentropy_backward(ws->dlogits, s->logits, s->lse, s->targets, N, V, scale);
    gpt_matmul_backward(ws->dln, embed_grads->t[GPT_WTE], NULL, ws->dlogits, s->lnf, embed->t[GPT_WTE], N, C, V, 0,
                        ws->partials, ws->nthreads);
    memset(ws->dres, 0, sizeof(float) * (size_t)N * C);
    gpt_layernorm_backward(ws->dres, final_grads->t[GPT_LNF_W], final_grads->t[GPT_LNF_B], ws->dln,
                           tp_workspace_output(ws, slot), final_params->t[GPT_LNF_W], s->lnf_mean, s->lnf_rstd, N, C,
                           ws->partials, ws->nthreads);
    s->head_done = 0;
    ws->bwd_slot = slot;
    ws->bwd_next = ws->end - 1;
    return ZERO_OK;
}

zero_status tp_backward_block(tp_workspace *ws, int slot, int layer, const gpt_tensors *p, gpt_tensors *g)
{
    GPT_TRY(check_slot(ws, slot, "tp_backward_block"));
    tp_slot *s = &ws->slots[slot];
    /* a stage without the head starts a backward at its last block (d output received) */
    if (layer == ws->end - 1 && ws->end != ws->cfg.n_layer) {
        ws->bwd_slot = slot;
        ws->bwd_next = layer;
    }
    if (layer != ws->bwd_next || slot != ws->bwd_slot || s->next_fwd != ws->end)
        return gpt_fail(ZERO_INVALID_STATE,
                        "tp_backward_block: block %d of slot %d out of order (expected block %d of slot %d, after a forward)",
                        layer, slot, ws->bwd_next, ws->bwd_slot);
    GPT_TRY(check_tensors("tp_backward_block", p, all_block, GPT_BLOCK_NT, "block parameter"));
    GPT_TRY(check_tensors("tp_backward_block", g, all_block, GPT_BLOCK_NT, "block gradient"));
    const int B = ws->B, T = ws->T, C = ws->cfg.d_model, N = B * T, P = ws->tp_size;
    const int Cl = C / P, Hl = 4 * C / P, NHl = ws->cfg.n_head / P;
    tp_layer_acts *a = &s->layers[layer - ws->begin];
    const float *x = layer == ws->begin ? s->input : s->layers[layer - 1 - ws->begin].res3;
    float *dres = ws->dres; /* in: d res3 (replicated); out: d x */

    /* MLP, in reverse. Row-parallel c_proj: g's backward is the identity,
     * its bias gradient is computed redundantly from the replicated dres. */
    gpt_matmul_backward(ws->dfch, g->t[GPT_FCPROJ_W], g->t[GPT_FCPROJ_B], dres, a->fch_gelu, p->t[GPT_FCPROJ_W], N,
                        Hl, C, 0, ws->partials, ws->nthreads);
    gpt_gelu_backward(ws->dfch, a->fch, ws->dfch, (size_t)N * Hl);
    gpt_matmul_backward(ws->dln, g->t[GPT_FC_W], g->t[GPT_FC_B], ws->dfch, a->ln2, p->t[GPT_FC_W], N, C, Hl, 0,
                        ws->partials, ws->nthreads);
    GPT_TRY(tp_sum(ws, ws->dln, (size_t)N * C, "d ln_2 (backward)", layer)); /* f's backward */
    gpt_layernorm_backward(dres, g->t[GPT_LN2_W], g->t[GPT_LN2_B], ws->dln, a->res2, p->t[GPT_LN2_W], a->ln2_mean,
                           a->ln2_rstd, N, C, ws->partials, ws->nthreads);

    /* attention, in reverse */
    gpt_matmul_backward(ws->dln, g->t[GPT_ATTPROJ_W], g->t[GPT_ATTPROJ_B], dres, a->atty, p->t[GPT_ATTPROJ_W], N, Cl,
                        C, 0, ws->partials, ws->nthreads);
    gpt_attention_backward(ws->dqkv, ws->dln, a->att, a->qkv, B, T, Cl, NHl, ws->att_scratch, ws->nthreads);
    gpt_matmul_backward(ws->dln, g->t[GPT_QKV_W], g->t[GPT_QKV_B], ws->dqkv, a->ln1, p->t[GPT_QKV_W], N, C, 3 * Cl, 0,
                        ws->partials, ws->nthreads);
    GPT_TRY(tp_sum(ws, ws->dln, (size_t)N * C, "d ln_1 (backward)", layer));
    gpt_layernorm_backward(dres, g->t[GPT_LN1_W], g->t[GPT_LN1_B], ws->dln, x, p->t[GPT_LN1_W], a->ln1_mean,
                           a->ln1_rstd, N, C, ws->partials, ws->nthreads);
    ws->bwd_next = layer - 1;
    if (layer == ws->begin) s->next_fwd = -1; /* the slot is free again */
    return ZERO_OK;
}

zero_status tp_backward_embed(tp_workspace *ws, int slot, gpt_tensors *embed_grads)
{
    GPT_TRY(check_slot(ws, slot, "tp_backward_embed"));
    if (ws->begin != 0 || ws->bwd_next != -1 || ws->bwd_slot != slot)
        return gpt_fail(ZERO_INVALID_STATE, "tp_backward_embed: slot %d has not run every block backward on the first stage",
                        slot);
    GPT_TRY(check_tensors("tp_backward_embed", embed_grads, embed_both, 2, "embed gradient"));
    gpt_encoder_backward(embed_grads->t[GPT_WTE], embed_grads->t[GPT_WPE], ws->dres, ws->slots[slot].tokens, ws->B,
                         ws->T, ws->cfg.d_model);
    ws->bwd_next = -2;
    return ZERO_OK;
}
