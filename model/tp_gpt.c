/* The tensor-parallel stage runtime: forward and backward of a block range
 * on one tp rank's shards, built from the single-rank kernels
 * (gpt_cpu_ops.h) plus Megatron's f/g all-reduces. Reads like gpt_cpu.c with
 * local widths: Cl = C/P attention channels (H/P heads of the same head
 * size), Hl = 4C/P MLP units. */
#include <stdlib.h>
#include <string.h>

#include "gpt_acts.h"
#include "gpt_block.h"
#include "gpt_cpu_ops.h"
#include "gpt_internal.h"
#include "tp_gpt.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Per-slot state beyond the activation layout (gpt_acts.h holds the buffers). */
typedef struct tp_slot {
    long valid;
    int next_fwd;                     /* the next block this slot's forward expects */
    int head_done;
    int w_pending;                    /* blocks whose B ran and whose W has not (split backward) */
} tp_slot;

struct tp_workspace {
    gpt_config cfg;
    zero_comm *tp;
    int tp_size, tp_rank;
    zero_comm *cp;                    /* context parallelism (NULL: none) */
    int cp_size, cp_rank, sp;         /* sp: sequence parallelism over tp */
    size_t Nr, row0;                  /* residual rows held; the first one among the Nc cp-local rows */
    int B, T, nthreads, begin, end, nslots;
    void *mem;
    gpt_activation_bytes bytes;
    gpt_acts acts;                    /* the layout: nslots slots over blocks [begin, end) */
    gpt_block_ctx blk;                /* local widths, the tp all-reduce, backward scratch */
    tp_slot *slots;
    int bwd_slot, bwd_next;           /* backward in progress: its slot and next block (-2: none) */
    float *wstash;                    /* split backward: slots x blocks stashes (tp_workspace_split_backward) */
    size_t wstash_floats;             /* of one block */
    unsigned char *w_due;             /* slots x blocks: B ran, W not yet */
    gpt_moe **moe;                    /* MoE: slots x n_layer layers (NULL outside [begin, end)); NULL: dense */
    float *moe_aux;                   /* slots x n_layer: each block's aux loss of the slot's last forward */
};

/* Megatron's g forward / f backward: sum the tp ranks' partial results. */
static zero_status tp_sum(void *ctx, float *buf, size_t n, const char *what, int layer)
{
    tp_workspace *ws = ctx;
    if (ws->tp_size == 1) return ZERO_OK;
    zero_status st = zero_allreduce(ws->tp, buf, buf, n, ZERO_F32, ZERO_SUM);
    if (st != ZERO_OK)
        return gpt_fail(st, "tp all-reduce of %s in block %d (tp rank %d of %d, group %s): %s", what, layer,
                        ws->tp_rank, ws->tp_size, zero_comm_get_name(ws->tp), zero_comm_last_error(ws->tp));
    return ZERO_OK;
}

/* Sequence parallelism: all-gather of every tp rank's rows, or
 * reduce-scatter of the partial products to them. */
static zero_status tp_seq(void *ctx, int gather, float *local, float *full, size_t n, const char *what, int layer)
{
    tp_workspace *ws = ctx;
    zero_status st = gather ? zero_allgather(ws->tp, local, full, n, ZERO_F32)
                            : zero_reduce_scatter(ws->tp, full, local, n, ZERO_F32, ZERO_SUM);
    if (st != ZERO_OK)
        return gpt_fail(st, "sequence-parallel %s of %s in block %d (tp rank %d of %d, group %s): %s",
                        gather ? "all-gather" : "reduce-scatter", what, layer, ws->tp_rank, ws->tp_size,
                        zero_comm_get_name(ws->tp), zero_comm_last_error(ws->tp));
    return ZERO_OK;
}

/* Context parallelism: Ulysses' all-to-all over cp. */
static zero_status cp_a2a(void *ctx, const float *send, float *recv, size_t count, const char *what, int layer)
{
    tp_workspace *ws = ctx;
    zero_status st = zero_alltoall(ws->cp, send, recv, count, ZERO_F32);
    if (st != ZERO_OK)
        return gpt_fail(st, "context-parallel all-to-all of %s in block %d (cp rank %d of %d, group %s): %s", what,
                        layer, ws->cp_rank, ws->cp_size, zero_comm_get_name(ws->cp), zero_comm_last_error(ws->cp));
    return ZERO_OK;
}

/* ------------------------------------------------------------ layout */
static gpt_acts_shape shape_of(const gpt_config *cfg, int tp_size, int cp_size, int B, int T, int begin, int end,
                               int slots, const tp_options *o)
{
    const gpt_checkpointing *ck = o ? o->ck : NULL;
    gpt_acts_shape s = {B, T, cfg->d_model, cfg->n_head, cfg->vocab, tp_size, begin, end, slots,
                        end == cfg->n_layer, gpt_checkpointing_below(cfg, ck), 0, ck && ck->partition ? tp_size : 1,
                        64, o && o->sequence_parallel, cp_size, 0, 4,
                        cfg->moe_experts > 0 /* MoE blocks: no dense MLP buffers; the layers hold their own */};
    return s; /* cpu_offload: host memory already */
}

/* The common layout, then the CPU kernels' scratch (as gpt_cpu.c). */
static void layout(tp_workspace *ws, const gpt_acts_shape *s, int nthreads, gpt_carver *c)
{
    gpt_acts_layout(ws ? &ws->acts : NULL, s, c);
    float *partials = gpt_carve(c, GPT_ACT_SCRATCH, (size_t)nthreads * 4 * s->C, sizeof(float));
    float *att_scratch = gpt_carve(c, GPT_ACT_SCRATCH, (size_t)nthreads * s->T * s->T, sizeof(float));
    if (ws) {
        ws->blk.partials = partials;
        ws->blk.att_scratch = att_scratch;
    }
}

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static zero_status check_shape(const gpt_config *cfg, int tp_size, int cp_size, int batch, int seq,
                               int layer_begin, int layer_end, int slots, const tp_options *o, const char *op)
{
    const gpt_checkpointing *ck = o ? o->ck : NULL;
    GPT_TRY(tp_config_validate(cfg, tp_size));
    GPT_TRY(gpt_checkpointing_validate(ck, op));
    if (cfg->moe_experts > 0) {
        int ep_have = o && o->ep ? zero_comm_get_size(o->ep) : 1, ep_want = cfg->moe_ep > 1 ? cfg->moe_ep : 1;
        if (cp_size > 1 || (o && o->sequence_parallel))
            return gpt_fail(ZERO_UNSUPPORTED,
                            "%s: MoE blocks (moe experts = %d) with %s: not supported (the MoE layer routes whole "
                            "token rows of the micro-batch)",
                            op, cfg->moe_experts, cp_size > 1 ? "context parallelism" : "sequence parallelism");
        if (ep_have != ep_want)
            return gpt_fail(ZERO_CONFIG, "%s: moe ep = %d but the ep comm has %d rank%s", op, cfg->moe_ep, ep_have,
                            ep_have == 1 ? "" : "s");
    }
    if (cp_size > 1 && (seq % cp_size || cfg->n_head % (tp_size * cp_size)))
        return gpt_fail(ZERO_CONFIG,
                        "%s: context parallelism over %d ranks needs cp to divide seq %d and tp %d x cp to divide "
                        "n_head %d",
                        op, cp_size, seq, tp_size, cfg->n_head);
    if (o && o->sequence_parallel) {
        if (tp_size < 2)
            return gpt_fail(ZERO_CONFIG, "%s: sequence parallelism needs a tp group of 2 or more ranks (tp %d)", op,
                            tp_size);
        if ((size_t)batch * (size_t)(seq / cp_size) % (size_t)tp_size)
            return gpt_fail(ZERO_CONFIG,
                            "%s: sequence parallelism: tp %d does not divide the %d x %d rows of a micro-batch "
                            "(per cp rank)",
                            op, tp_size, batch, seq / cp_size);
        if (ck && ck->partition)
            return gpt_fail(ZERO_CONFIG,
                            "%s: checkpointing partition with sequence parallelism: a block's input is split over "
                            "tp already",
                            op);
    }
    if (batch < 1 || seq < 1 || seq > cfg->seq_len || slots < 1 || layer_begin < 0 || layer_end > cfg->n_layer ||
        layer_begin >= layer_end)
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "%s: batch %d x seq %d, blocks [%d, %d), %d slots is invalid (need batch >= 1, "
                        "1 <= seq <= %d, 0 <= begin < end <= n_layer %d, slots >= 1)",
                        op, batch, seq, layer_begin, layer_end, slots, cfg->seq_len, cfg->n_layer);
    return ZERO_OK;
}

zero_status tp_activation_bytes_for(const gpt_config *cfg, int tp_size, int batch, int seq, int layer_begin,
                                    int layer_end, int slots, const gpt_checkpointing *ck, gpt_activation_bytes *out)
{
    const tp_options o = {ck, 0, NULL, NULL};
    return tp_activation_bytes_opts(cfg, tp_size, 1, batch, seq, layer_begin, layer_end, slots, &o, out);
}

zero_status tp_activation_bytes_opts(const gpt_config *cfg, int tp_size, int cp_size, int batch, int seq,
                                     int layer_begin, int layer_end, int slots, const tp_options *o,
                                     gpt_activation_bytes *out)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_activation_bytes_for: out is NULL");
    memset(out, 0, sizeof *out);
    if (cp_size < 1) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_activation_bytes_for: cp size %d", cp_size);
    GPT_TRY(check_shape(cfg, tp_size, cp_size, batch, seq, layer_begin, layer_end, slots, o,
                        "tp_activation_bytes_for"));
    gpt_acts_shape s = shape_of(cfg, tp_size, cp_size, batch, seq, layer_begin, layer_end, slots, o);
    gpt_carver c;
    gpt_carver_init(&c, s.align, NULL, NULL);
    layout(NULL, &s, max_threads(), &c);
    gpt_carver_report(&c, out);
    if (cfg->moe_experts > 0) { /* one layer per (slot, block of the range): the sizes create_moe allocates */
        gpt_moe_config mc = gpt_moe_config_of(cfg);
        size_t one;
        GPT_TRY(gpt_moe_bytes_for(&mc, batch * seq, cfg->moe_ep > 1 ? cfg->moe_ep : 1, 0, &one));
        out->moe = (size_t)slots * (size_t)(layer_end - layer_begin) * one;
        out->total += out->moe;
    }
    return ZERO_OK;
}

/* One MoE layer per (slot, block of the stage): a layer holds one
 * micro-batch's routing and expert activations from its forward to its
 * backward, and a pipeline has several micro-batches in flight. */
static zero_status create_moe(tp_workspace *ws, zero_comm *ep)
{
    const gpt_config *cfg = &ws->cfg;
    const size_t n = (size_t)ws->nslots * (size_t)cfg->n_layer;
    ws->moe = calloc(n, sizeof *ws->moe);
    ws->moe_aux = calloc(n, sizeof *ws->moe_aux);
    if (!ws->moe || !ws->moe_aux) return gpt_fail(ZERO_OUT_OF_MEMORY, "tp_workspace_create: out of memory (MoE)");
    gpt_moe_config mc = gpt_moe_config_of(cfg);
    for (int sl = 0; sl < ws->nslots; sl++)
        for (int l = ws->begin; l < ws->end; l++) {
            gpt_moe **layer = &ws->moe[(size_t)sl * cfg->n_layer + l];
            GPT_TRY(gpt_moe_create(layer, &mc, ws->B * ws->T, ep));
            ws->bytes.moe += gpt_moe_bytes(*layer); /* what each layer allocated */
        }
    ws->bytes.total += ws->bytes.moe;
    return ZERO_OK;
}

/* The block context's MoE layers and aux slots are the slot's (indexed by layer). */
static void moe_select(tp_workspace *ws, int slot)
{
    if (!ws->moe) return;
    ws->blk.moe = ws->moe + (size_t)slot * ws->cfg.n_layer;
    ws->blk.moe_aux = ws->moe_aux + (size_t)slot * ws->cfg.n_layer;
}

void tp_workspace_set_moe_dloss(tp_workspace *ws, float dloss)
{
    if (ws) ws->blk.moe_dloss = dloss;
}

float tp_workspace_moe_aux(const tp_workspace *ws, int slot)
{
    float s = 0.0f;
    if (!ws || !ws->moe || slot < 0 || slot >= ws->nslots) return s;
    for (int l = ws->begin; l < ws->end; l++) s += ws->moe_aux[(size_t)slot * ws->cfg.n_layer + l];
    return s;
}

zero_status tp_workspace_create(tp_workspace **out, const gpt_config *cfg, zero_comm *tp, int batch, int seq,
                                int layer_begin, int layer_end, int slots)
{
    return tp_workspace_create_ckpt(out, cfg, tp, batch, seq, layer_begin, layer_end, slots, NULL);
}

zero_status tp_workspace_create_ckpt(tp_workspace **out, const gpt_config *cfg, zero_comm *tp, int batch, int seq,
                                     int layer_begin, int layer_end, int slots, const gpt_checkpointing *ck)
{
    const tp_options o = {ck, 0, NULL, NULL};
    return tp_workspace_create_opts(out, cfg, tp, batch, seq, layer_begin, layer_end, slots, &o);
}

zero_status tp_workspace_create_opts(tp_workspace **out, const gpt_config *cfg, zero_comm *tp, int batch, int seq,
                                     int layer_begin, int layer_end, int slots, const tp_options *o)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_workspace_create: out is NULL");
    *out = NULL;
    int tp_size = tp ? zero_comm_get_size(tp) : 1;
    zero_comm *cpc = o ? o->cp : NULL;
    int cp_size = cpc ? zero_comm_get_size(cpc) : 1;
    GPT_TRY(check_shape(cfg, tp_size, cp_size, batch, seq, layer_begin, layer_end, slots, o, "tp_workspace_create"));
    GPT_TRY(gpt_gemm_init()); /* also makes OpenBLAS single-threaded */
    tp_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) return gpt_fail(ZERO_OUT_OF_MEMORY, "tp_workspace_create: no memory for the header");
    ws->cfg = *cfg;
    ws->tp = tp;
    ws->tp_size = tp_size;
    ws->tp_rank = tp ? zero_comm_get_rank(tp) : 0;
    ws->cp = cp_size > 1 ? cpc : NULL;
    ws->cp_size = cp_size;
    ws->cp_rank = cpc ? zero_comm_get_rank(cpc) : 0;
    ws->sp = o && o->sequence_parallel;
    ws->B = batch;
    ws->T = seq;
    ws->nthreads = max_threads();
    ws->begin = layer_begin;
    ws->end = layer_end;
    ws->nslots = slots;
    ws->bwd_next = -2;
    gpt_acts_shape s = shape_of(cfg, tp_size, cp_size, batch, seq, layer_begin, layer_end, slots, o);
    size_t Nc;
    gpt_acts_rows(&s, &Nc, &ws->Nr);
    ws->row0 = ws->sp ? (size_t)ws->tp_rank * ws->Nr : 0;
    ws->slots = calloc((size_t)slots, sizeof *ws->slots);
    zero_status st = ws->slots ? gpt_acts_init(&ws->acts, &s)
                               : gpt_fail(ZERO_OUT_OF_MEMORY, "tp_workspace_create: no memory for %d slots", slots);
    if (st != ZERO_OK) {
        tp_workspace_destroy(ws);
        return st;
    }
    gpt_carver c;
    gpt_carver_init(&c, s.align, NULL, NULL);
    layout(NULL, &s, ws->nthreads, &c);
    size_t bytes = c.off[0];
    ws->mem = aligned_alloc(64, bytes);
    if (!ws->mem) {
        tp_workspace_destroy(ws);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "tp_workspace_create: cannot allocate %zu bytes of activations", bytes);
    }
    gpt_carver_init(&c, s.align, ws->mem, NULL);
    layout(ws, &s, ws->nthreads, &c);
    gpt_carver_report(&c, &ws->bytes);
    gpt_block_ctx *k = &ws->blk; /* layout() set the CPU scratch */
    k->B = batch, k->T = seq, k->C = cfg->d_model;
    k->Cl = cfg->d_model / tp_size, k->Hl = 4 * cfg->d_model / tp_size, k->NHl = cfg->n_head / (tp_size * cp_size);
    k->Ca = k->Cl / cp_size, k->Nc = (int)Nc, k->Nr = (int)ws->Nr, k->cp = cp_size;
    k->lead = ws->tp_rank == 0, k->nthreads = ws->nthreads, k->sum = tp_sum, k->sum_ctx = ws;
    k->seq = ws->sp ? tp_seq : NULL, k->heads = cp_size > 1 ? cp_a2a : NULL;
    k->dln = ws->acts.dln, k->dqkv = ws->acts.dqkv, k->dfch = ws->acts.dfch;
    k->sp_full = ws->acts.sp_full, k->cp_send = ws->acts.cp_send, k->cp_recv = ws->acts.cp_recv;
    k->cp_heads = ws->acts.cp_heads;
    for (int i = 0; i < slots; i++) ws->slots[i].next_fwd = -1;
    if (cfg->moe_experts > 0 && (st = create_moe(ws, o ? o->ep : NULL)) != ZERO_OK) {
        tp_workspace_destroy(ws);
        return st;
    }
    *out = ws;
    return ZERO_OK;
}

void tp_workspace_destroy(tp_workspace *ws)
{
    if (!ws) return;
    free(ws->mem);
    free(ws->wstash);
    free(ws->w_due);
    if (ws->moe)
        for (size_t i = 0; i < (size_t)ws->nslots * (size_t)ws->cfg.n_layer; i++) gpt_moe_destroy(ws->moe[i]);
    free(ws->moe);
    free(ws->moe_aux);
    gpt_acts_free(&ws->acts);
    free(ws->slots);
    free(ws);
}

size_t tp_workspace_bytes(const tp_workspace *ws) { return ws ? ws->bytes.total : 0; }

struct gpt_moe *tp_workspace_moe_layer(const tp_workspace *ws, int slot, int layer)
{
    if (!ws || !ws->moe || slot < 0 || slot >= ws->nslots || layer < ws->begin || layer >= ws->end) return NULL;
    return ws->moe[(size_t)slot * ws->cfg.n_layer + layer];
}

void tp_workspace_activation_bytes(const tp_workspace *ws, gpt_activation_bytes *out)
{
    if (!out) return;
    if (ws) *out = ws->bytes;
    else memset(out, 0, sizeof *out);
}

const gpt_config *tp_workspace_config(const tp_workspace *ws) { return ws ? &ws->cfg : NULL; }
int tp_workspace_slots(const tp_workspace *ws) { return ws ? ws->nslots : 0; }
size_t tp_workspace_rows(const tp_workspace *ws) { return ws ? ws->Nr : 0; }
size_t tp_workspace_tokens(const tp_workspace *ws) { return ws ? (size_t)ws->B * ws->T : 0; }

zero_status tp_workspace_set_matmul_dtype(tp_workspace *ws, zero_dtype dtype)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_workspace_set_matmul_dtype: workspace is NULL");
    if (dtype != ZERO_F32 && dtype != ZERO_BF16)
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "tp_workspace_set_matmul_dtype: %s matmuls are not offered on the CPU (f32 or bf16)",
                        zero_dtype_name(dtype));
    ws->blk.math = dtype == ZERO_BF16 ? GPT_GEMM_BF16 : GPT_GEMM_F32;
    if (ws->moe)
        for (size_t i = 0; i < (size_t)ws->nslots * (size_t)ws->cfg.n_layer; i++)
            if (ws->moe[i]) gpt_moe_set_matmul_bf16(ws->moe[i], dtype == ZERO_BF16);
    return ZERO_OK;
}

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
    return slot_ok(ws, slot) ? ws->acts.slots[slot].resid[0] : NULL;
}

const float *tp_workspace_output(const tp_workspace *ws, int slot)
{
    return slot_ok(ws, slot) ? ws->acts.slots[slot].resid[ws->end - ws->begin] : NULL;
}

float *tp_workspace_dresid(tp_workspace *ws) { return ws ? ws->acts.dres : NULL; }

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
static const int moe_gate[1] = {GPT_MOE_GATE_W};
static const int embed_both[2] = {GPT_WTE, GPT_WPE};
static const int final_both[2] = {GPT_LNF_W, GPT_LNF_B};

static zero_status check_slot(const tp_workspace *ws, int slot, const char *op)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: workspace is NULL", op);
    if (!slot_ok(ws, slot))
        return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: slot %d outside [0, %d)", op, slot, ws->nslots);
    return ZERO_OK;
}

/* partition_activations: a recomputed block's input is kept as this tp
 * rank's contiguous 1/P of its N x C floats (padded to equal slices), stored
 * when the block starts forward (its input is complete then, received or
 * computed) and all-gathered into the staging buffer before the block's
 * recomputation: a copy, so the recomputation sees the same bits. */
static void keep_slice(tp_workspace *ws, const gpt_acts_slot *io, int i)
{
    if (!io->kept[i]) return;
    const size_t nc = ws->Nr * (size_t)ws->cfg.d_model, part = ws->acts.kept_count;
    const size_t from = (size_t)ws->tp_rank * part, n = from < nc ? (nc - from < part ? nc - from : part) : 0;
    if (n) memcpy(io->kept[i], io->resid[i] + from, sizeof(float) * n);
    if (n < part) memset(io->kept[i] + n, 0, sizeof(float) * (part - n));
}

static zero_status gather_slices(tp_workspace *ws, const gpt_acts_slot *io, int i, int layer)
{
    if (!io->kept[i]) return ZERO_OK;
    zero_status st = zero_allgather(ws->tp, io->kept[i], io->resid[i], ws->acts.kept_count, ZERO_F32);
    if (st != ZERO_OK)
        return gpt_fail(st, "tp all-gather of the partitioned input of block %d (tp rank %d of %d, group %s): %s",
                        layer, ws->tp_rank, ws->tp_size, zero_comm_get_name(ws->tp), zero_comm_last_error(ws->tp));
    return ZERO_OK;
}

/* A slot whose weight gradients are still due keeps its activations: a new
 * micro-batch may not overwrite them. */
static zero_status check_no_w_due(const tp_workspace *ws, int slot, const char *op)
{
    if (ws->slots[slot].w_pending)
        return gpt_fail(ZERO_INVALID_STATE, "%s: slot %d still has the weight gradients (W) of %d block(s) due", op,
                        slot, ws->slots[slot].w_pending);
    return ZERO_OK;
}

/* ------------------------------------------------------------ this rank's rows
 * Under sequence / context parallelism a rank holds some rows of the
 * micro-batch (tp_gpt.h): they are runs of consecutive positions within one
 * sequence. Run: local rows [i, i + len) are the micro-batch's tokens
 * [g, g + len), positions [pos, pos + len). */
typedef struct row_run {
    size_t i, len, g, pos;
} row_run;

static int rows_split(const tp_workspace *ws) { return ws->Nr != (size_t)ws->B * ws->T; }

/* The run starting at local row i (0 past the last row). */
static int run_at(const tp_workspace *ws, size_t i, row_run *r)
{
    if (i >= ws->Nr) return 0;
    const size_t T = (size_t)ws->T, Tl = T / (size_t)ws->cp_size, n = ws->row0 + i, tl = n % Tl;
    r->i = i;
    r->len = Tl - tl < ws->Nr - i ? Tl - tl : ws->Nr - i;
    r->pos = (size_t)ws->cp_rank * Tl + tl;
    r->g = n / Tl * T + r->pos;
    return 1;
}

/* this rank's rows of a micro-batch's token ids (or targets) */
static void take_rows(const tp_workspace *ws, const int32_t *all, int32_t *mine)
{
    row_run r = {0, 0, 0, 0};
    while (run_at(ws, r.i + r.len, &r)) memcpy(mine + r.i, all + r.g, sizeof(int32_t) * r.len);
}

/* The loss's (sum, count) over the ranks sharing the micro-batch: the tp
 * group under SP, the cp group. Every rank gets the same values. */
static zero_status loss_allreduce(tp_workspace *ws, double *sum, long *count)
{
    double v[2] = {*sum, (double)*count};
    zero_comm *g[2] = {ws->sp ? ws->tp : NULL, ws->cp};
    for (int k = 0; k < 2; k++) {
        if (!g[k]) continue;
        zero_status st = zero_allreduce(g[k], v, v, 2, ZERO_F64, ZERO_SUM);
        if (st != ZERO_OK)
            return gpt_fail(st, "all-reduce of the loss over the %s group %s: %s", k ? "context-parallel" : "tp",
                            zero_comm_get_name(g[k]), zero_comm_last_error(g[k]));
    }
    *sum = v[0];
    *count = (long)v[1];
    return ZERO_OK;
}

static zero_status sum_over_tp(tp_workspace *ws, float *g, size_t n, const char *what)
{
    if (!g) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_seq_grad_allreduce: the gradient of %s is NULL", what);
    zero_status st = zero_allreduce(ws->tp, g, g, n, ZERO_F32, ZERO_SUM);
    if (st != ZERO_OK)
        return gpt_fail(st, "tp_seq_grad_allreduce: all-reduce of the gradient of %s (group %s): %s", what,
                        zero_comm_get_name(ws->tp), zero_comm_last_error(ws->tp));
    return ZERO_OK;
}

zero_status tp_seq_grad_allreduce(tp_workspace *ws, gpt_tensors *grads)
{
    if (!ws || !grads) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_seq_grad_allreduce: workspace or grads is NULL");
    if (!ws->sp) return ZERO_OK;
    const size_t C = (size_t)ws->cfg.d_model, V = (size_t)ws->cfg.vocab, T = (size_t)ws->cfg.seq_len;
    gpt_tensors *e = &grads[GPT_MODULE_EMBED], *f = &grads[gpt_module_final(&ws->cfg)];
    if (ws->begin == 0) {
        GPT_TRY(sum_over_tp(ws, e->t[GPT_WTE], V * C, "wte"));
        GPT_TRY(sum_over_tp(ws, e->t[GPT_WPE], T * C, "wpe"));
    }
    static const int ln[4] = {GPT_LN1_W, GPT_LN1_B, GPT_LN2_W, GPT_LN2_B};
    static const char *const names[4] = {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias"};
    for (int l = ws->begin; l < ws->end; l++)
        for (int j = 0; j < 4; j++) GPT_TRY(sum_over_tp(ws, grads[gpt_module_block(l)].t[ln[j]], C, names[j]));
    if (ws->end == ws->cfg.n_layer) {
        GPT_TRY(sum_over_tp(ws, f->t[GPT_LNF_W], C, "ln_f.weight"));
        GPT_TRY(sum_over_tp(ws, f->t[GPT_LNF_B], C, "ln_f.bias"));
        if (ws->begin != 0) GPT_TRY(sum_over_tp(ws, e->t[GPT_WTE], V * C, "wte (the head's copy)"));
    }
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
    GPT_TRY(check_no_w_due(ws, slot, "tp_forward_embed"));
    gpt_acts_slot *io = &ws->acts.slots[slot];
    if (rows_split(ws)) { /* this rank's rows, each run at its positions */
        const size_t C = (size_t)ws->cfg.d_model;
        take_rows(ws, tokens, io->tokens);
        row_run r = {0, 0, 0, 0};
        while (run_at(ws, r.i + r.len, &r))
            gpt_encoder_forward(io->resid[0] + r.i * C, io->tokens + r.i, embed->t[GPT_WTE],
                                (const float *)embed->t[GPT_WPE] + r.pos * C, 1, (int)r.len, (int)C);
    } else {
        memcpy(io->tokens, tokens, sizeof(int32_t) * (size_t)N);
        gpt_encoder_forward(io->resid[0], io->tokens, embed->t[GPT_WTE], embed->t[GPT_WPE], ws->B, ws->T,
                            ws->cfg.d_model);
    }
    s->next_fwd = ws->begin;
    return ZERO_OK;
}

zero_status tp_forward_block(tp_workspace *ws, int slot, int layer, const gpt_tensors *p)
{
    GPT_TRY(check_slot(ws, slot, "tp_forward_block"));
    tp_slot *s = &ws->slots[slot];
    /* a later stage starts a micro-batch at its first block (input received) */
    if (layer == ws->begin) GPT_TRY(check_no_w_due(ws, slot, "tp_forward_block"));
    if (layer == ws->begin && ws->begin > 0) s->next_fwd = layer;
    if (layer < ws->begin || layer >= ws->end || layer != s->next_fwd)
        return gpt_fail(ZERO_INVALID_STATE, "tp_forward_block: block %d of slot %d out of order (stage blocks [%d, %d), expected %d)",
                        layer, slot, ws->begin, ws->end, s->next_fwd);
    GPT_TRY(check_tensors("tp_forward_block", p, all_block, GPT_BLOCK_NT, "block parameter"));
    if (ws->moe) GPT_TRY(check_tensors("tp_forward_block", p, moe_gate, 1, "block parameter"));
    gpt_acts_slot *io = &ws->acts.slots[slot];
    int i = layer - ws->begin;
    keep_slice(ws, io, i);
    moe_select(ws, slot);
    /* a recomputed block's activations go to the shared set, overwritten by the next one */
    GPT_TRY(gpt_block_forward(&ws->blk, layer, io->block[i], io->resid[i], io->resid[i + 1], p));
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
    const int N = (int)ws->Nr, C = ws->cfg.d_model, V = ws->cfg.vocab;
    for (int i = 0; i < ws->B * ws->T; i++)
        if (targets[i] >= V)
            return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_forward_head: target %d at position %d is >= vocab %d",
                            targets[i], i, V);
    gpt_acts_slot *io = &ws->acts.slots[slot];
    if (rows_split(ws)) take_rows(ws, targets, io->targets);
    else memcpy(io->targets, targets, sizeof(int32_t) * (size_t)N);
    gpt_layernorm_forward(io->lnf, io->lnf_mean, io->lnf_rstd, tp_workspace_output(ws, slot), final_params->t[GPT_LNF_W],
                          final_params->t[GPT_LNF_B], N, C);
    /* the tied head, replicated over tp: logits = ln_f(x) wte^T */
    gpt_matmul_forward(ws->blk.math, io->logits, NULL, io->lnf, embed->t[GPT_WTE], NULL, N, C, V);
    double total = gpt_crossentropy_forward(io->lse, io->logits, io->targets, N, V, &s->valid);
    if (rows_split(ws)) GPT_TRY(loss_allreduce(ws, &total, &s->valid)); /* the mean over the whole micro-batch */
    if (loss) *loss = s->valid ? (float)(total / s->valid) : 0.0f;
    s->head_done = 1;
    return ZERO_OK;
}

/* ------------------------------------------------------------ backward */
static void stash_of(const tp_workspace *ws, int slot, int i, gpt_block_wstash *st)
{
    const size_t N = (size_t)ws->B * ws->T, C = (size_t)ws->blk.C, Hl = (size_t)ws->blk.Hl;
    float *p = ws->wstash + ws->wstash_floats * ((size_t)slot * (size_t)(ws->end - ws->begin) + (size_t)i);
    st->dout_fcproj = p;
    st->dfch = p + N * C;
    st->dout_attproj = st->dfch + N * Hl;
    st->dqkv = st->dout_attproj + N * C; /* N x 3Cl: the rest of gpt_block_wstash_floats */
}

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
    const int N = (int)ws->Nr, C = ws->cfg.d_model, V = ws->cfg.vocab;
    float scale = s->valid ? dloss / (float)s->valid : 0.0f;
    ws->blk.moe_dloss = dloss; /* the MoE blocks' aux losses are part of the loss */
    const gpt_acts_slot *io = &ws->acts.slots[slot];
    gpt_acts *a = &ws->acts;
    gpt_crossentropy_backward(a->dlogits, io->logits, io->lse, io->targets, N, V, scale);
    gpt_matmul_backward(ws->blk.math, a->dln, embed_grads->t[GPT_WTE], NULL, a->dlogits, io->lnf, embed->t[GPT_WTE], N, C, V, 0,
                        ws->blk.partials, ws->nthreads);
    memset(a->dres, 0, sizeof(float) * (size_t)N * C);
    gpt_layernorm_backward(a->dres, final_grads->t[GPT_LNF_W], final_grads->t[GPT_LNF_B], a->dln,
                           tp_workspace_output(ws, slot), final_params->t[GPT_LNF_W], io->lnf_mean, io->lnf_rstd, N, C,
                           ws->blk.partials, ws->nthreads);
    s->head_done = 0;
    ws->bwd_slot = slot;
    ws->bwd_next = ws->end - 1;
    return ZERO_OK;
}

static zero_status backward_block(tp_workspace *ws, int slot, int layer, const gpt_tensors *p, gpt_tensors *g,
                                  int split)
{
    const char *op = split ? "tp_backward_block_input" : "tp_backward_block";
    GPT_TRY(check_slot(ws, slot, op));
    tp_slot *s = &ws->slots[slot];
    /* a stage without the head starts a backward at its last block (d output received) */
    if (layer == ws->end - 1 && ws->end != ws->cfg.n_layer) {
        ws->bwd_slot = slot;
        ws->bwd_next = layer;
    }
    if (layer != ws->bwd_next || slot != ws->bwd_slot || s->next_fwd != ws->end)
        return gpt_fail(ZERO_INVALID_STATE,
                        "%s: block %d of slot %d out of order (expected block %d of slot %d, after a forward)", op,
                        layer, slot, ws->bwd_next, ws->bwd_slot);
    if (split && !ws->wstash)
        return gpt_fail(ZERO_INVALID_STATE, "%s: the workspace has no W stash (call tp_workspace_split_backward)", op);
    GPT_TRY(check_tensors(op, p, all_block, GPT_BLOCK_NT, "block parameter"));
    GPT_TRY(check_tensors(op, g, all_block, GPT_BLOCK_NT, "block gradient"));
    if (ws->moe) {
        GPT_TRY(check_tensors(op, p, moe_gate, 1, "block parameter"));
        GPT_TRY(check_tensors(op, g, moe_gate, 1, "block gradient"));
    }
    moe_select(ws, slot);
    const gpt_acts_slot *io = &ws->acts.slots[slot];
    int i = layer - ws->begin;
    gpt_block_acts *a = io->block[i];
    if (split) {
        gpt_block_wstash st;
        stash_of(ws, slot, i, &st);
        GPT_TRY(gpt_block_backward_input(&ws->blk, layer, a, io->resid[i], ws->acts.dres, p, g, &st));
        ws->w_due[(size_t)slot * (size_t)(ws->end - ws->begin) + (size_t)i] = 1;
        s->w_pending++;
        ws->bwd_next = layer - 1;
        if (layer == ws->begin) s->next_fwd = -1; /* free again once its W ran */
        return ZERO_OK;
    }
    /* checkpointing: recompute the forward from the kept input (its all-reduce
     * included: every tp rank recomputes the same blocks), then the backward */
    if (gpt_acts_recomputed(&ws->acts.shape, layer)) {
        GPT_TRY(gather_slices(ws, io, i, layer));
        GPT_TRY(gpt_block_forward(&ws->blk, layer, a, io->resid[i], NULL, p));
    }
    GPT_TRY(gpt_block_backward(&ws->blk, layer, a, io->resid[i], ws->acts.dres, p, g));
    ws->bwd_next = layer - 1;
    if (layer == ws->begin) s->next_fwd = -1; /* the slot is free again */
    return ZERO_OK;
}

zero_status tp_backward_block(tp_workspace *ws, int slot, int layer, const gpt_tensors *p, gpt_tensors *g)
{
    return backward_block(ws, slot, layer, p, g, 0);
}

zero_status tp_backward_block_input(tp_workspace *ws, int slot, int layer, const gpt_tensors *p, gpt_tensors *g)
{
    return backward_block(ws, slot, layer, p, g, 1);
}

zero_status tp_backward_block_weight(tp_workspace *ws, int slot, int layer, gpt_tensors *g)
{
    GPT_TRY(check_slot(ws, slot, "tp_backward_block_weight"));
    int nb = ws->end - ws->begin, i = layer - ws->begin;
    if (layer < ws->begin || layer >= ws->end || !ws->w_due || !ws->w_due[(size_t)slot * (size_t)nb + (size_t)i])
        return gpt_fail(ZERO_INVALID_STATE,
                        "tp_backward_block_weight: block %d of slot %d has no input gradient (B) awaiting its W", layer,
                        slot);
    GPT_TRY(check_tensors("tp_backward_block_weight", g, all_block, GPT_BLOCK_NT, "block gradient"));
    gpt_block_wstash st;
    stash_of(ws, slot, i, &st);
    moe_select(ws, slot); /* the slot's MoE layers hold their deferred W */
    GPT_TRY(gpt_block_backward_weight(&ws->blk, layer, ws->acts.slots[slot].block[i], &st, g));
    ws->w_due[(size_t)slot * (size_t)nb + (size_t)i] = 0;
    ws->slots[slot].w_pending--;
    return ZERO_OK;
}

zero_status tp_workspace_split_backward(tp_workspace *ws)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_workspace_split_backward: workspace is NULL");
    if (ws->wstash) return ZERO_OK;
    if (ws->sp || ws->cp)
        return gpt_fail(ZERO_UNSUPPORTED,
                        "tp_workspace_split_backward: not with sequence or context parallelism (the deferred W "
                        "would need the LayerNorm outputs all-gathered again)");
    if (ws->acts.shape.recompute_below > ws->begin)
        return gpt_fail(ZERO_UNSUPPORTED,
                        "tp_workspace_split_backward: blocks below %d are recomputed (activation checkpointing); a "
                        "deferred W needs the block's activations kept until it runs",
                        ws->acts.shape.recompute_below);
    int nb = ws->end - ws->begin;
    const gpt_block_ctx *k = &ws->blk;
    ws->wstash_floats = gpt_block_wstash_floats(ws->B * ws->T, k->C, k->Cl, k->Hl);
    size_t n = ws->wstash_floats * (size_t)nb * (size_t)ws->nslots;
    /* MoE blocks: each slot's layers keep their experts' deferred W (moe.h) */
    for (int sl = 0; ws->moe && sl < ws->nslots; sl++)
        for (int l = ws->begin; l < ws->end; l++)
            GPT_TRY(gpt_moe_split_backward(ws->moe[(size_t)sl * ws->cfg.n_layer + l]));
    ws->wstash = malloc(sizeof(float) * n);
    ws->w_due = calloc((size_t)nb * (size_t)ws->nslots, 1);
    if (!ws->wstash || !ws->w_due) {
        free(ws->wstash), free(ws->w_due);
        ws->wstash = NULL, ws->w_due = NULL;
        return gpt_fail(ZERO_OUT_OF_MEMORY, "tp_workspace_split_backward: cannot allocate %zu bytes of W stash",
                        sizeof(float) * n);
    }
    return ZERO_OK;
}

size_t tp_workspace_wstash_bytes(const tp_workspace *ws)
{
    if (!ws || !ws->wstash) return 0;
    size_t bytes = sizeof(float) * ws->wstash_floats * (size_t)(ws->end - ws->begin) * (size_t)ws->nslots;
    for (int sl = 0; ws->moe && sl < ws->nslots; sl++) /* the MoE layers' stashes */
        for (int l = ws->begin; l < ws->end; l++) bytes += gpt_moe_split_bytes(ws->moe[(size_t)sl * ws->cfg.n_layer + l]);
    return bytes;
}

zero_status tp_backward_embed(tp_workspace *ws, int slot, gpt_tensors *embed_grads)
{
    GPT_TRY(check_slot(ws, slot, "tp_backward_embed"));
    if (ws->begin != 0 || ws->bwd_next != -1 || ws->bwd_slot != slot)
        return gpt_fail(ZERO_INVALID_STATE, "tp_backward_embed: slot %d has not run every block backward on the first stage",
                        slot);
    GPT_TRY(check_tensors("tp_backward_embed", embed_grads, embed_both, 2, "embed gradient"));
    const int32_t *tok = ws->acts.slots[slot].tokens;
    if (rows_split(ws)) {
        const size_t C = (size_t)ws->cfg.d_model;
        row_run r = {0, 0, 0, 0};
        while (run_at(ws, r.i + r.len, &r))
            gpt_encoder_backward(embed_grads->t[GPT_WTE], (float *)embed_grads->t[GPT_WPE] + r.pos * C,
                                 ws->acts.dres + r.i * C, tok + r.i, 1, (int)r.len, (int)C);
    } else {
        gpt_encoder_backward(embed_grads->t[GPT_WTE], embed_grads->t[GPT_WPE], ws->acts.dres, tok, ws->B, ws->T,
                             ws->cfg.d_model);
    }
    ws->bwd_next = -2;
    return ZERO_OK;
}
