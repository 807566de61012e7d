/* The CPU model: the workspace and the module-by-module forward and
 * backward, in fp32. Each function reads top to bottom as the math does; the
 * kernels live in gpt_cpu_ops.c. */
#include <stdlib.h>
#include <string.h>

#include "gpt_acts.h"
#include "gpt_block.h"
#include "gpt_cpu_ops.h"
#include "gpt_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef enum gpt_phase {
    GPT_PHASE_IDLE = 0,     /* nothing in flight: forward_begin next */
    GPT_PHASE_FORWARD,      /* blocks running forward */
    GPT_PHASE_FORWARD_DONE, /* loss computed: backward_end next */
    GPT_PHASE_BACKWARD,     /* blocks running backward */
} gpt_phase;

struct gpt_workspace {
    gpt_config cfg;
    int B, T, nthreads;
    void *mem;
    gpt_activation_bytes bytes;

    gpt_acts acts;           /* the layout (gpt_acts.h): one slot, every block */
    gpt_acts_slot *io;       /* = &acts.slots[0] */
    gpt_block_ctx blk;       /* widths and backward scratch for gpt_block.c */
    int has_targets;

    gpt_phase phase;
    int next_layer;          /* forward: next block to run; backward: next block, descending */
    long valid;              /* tokens with a target in this micro-batch */
    gpt_moe **moe;           /* MoE: one layer per block (NULL: dense) */
    float *moe_aux;          /* per block: the aux loss of the last forward */
};

/* ------------------------------------------------------------ layout */
static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static gpt_acts_shape shape_of(const gpt_config *cfg, int B, int T, const gpt_checkpointing *ck)
{
    gpt_acts_shape s = {B, T, cfg->d_model, cfg->n_head, cfg->vocab, 1, 0, cfg->n_layer, 1, 1,
                        gpt_checkpointing_below(cfg, ck), 0, 1, 64, 0, 1, 0, 4, cfg->moe_experts > 0};
    return s; /* cpu_offload: the activations are host memory already; partition: no tp group */
}

/* The common layout, then the CPU kernels' own scratch: per-thread partial
 * sums of bias / LayerNorm gradients and attention backward rows. */
static void layout(gpt_workspace *ws, const gpt_acts_shape *s, int nthreads, gpt_carver *c)
{
    gpt_acts_layout(ws ? &ws->acts : NULL, s, c);
    float *partials = gpt_carve(c, GPT_ACT_SCRATCH, (size_t)nthreads * 4 * s->C, sizeof(float));
    float *att_scratch = gpt_carve(c, GPT_ACT_SCRATCH, (size_t)nthreads * s->T * s->T, sizeof(float));
    if (ws) {
        ws->blk.partials = partials;
        ws->blk.att_scratch = att_scratch;
    }
}

zero_status gpt_activation_bytes_for(const gpt_config *cfg, int batch, int seq, const gpt_checkpointing *ck,
                                     gpt_activation_bytes *out)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_activation_bytes_for: out is NULL");
    memset(out, 0, sizeof *out);
    GPT_TRY(gpt_config_validate(cfg));
    GPT_TRY(gpt_checkpointing_validate(ck, "gpt_activation_bytes_for"));
    if (batch < 1 || seq < 1 || seq > cfg->seq_len)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_activation_bytes_for: batch %d x seq %d is invalid (seq_len %d)",
                        batch, seq, cfg->seq_len);
    gpt_acts_shape s = shape_of(cfg, batch, seq, ck);
    gpt_carver c;
    gpt_carver_init(&c, s.align, NULL, NULL);
    layout(NULL, &s, max_threads(), &c);
    gpt_carver_report(&c, out);
    if (cfg->moe_experts > 0) { /* the layers' own buffers, the sizes gpt_moe_create allocates */
        gpt_moe_config mc = gpt_moe_config_of(cfg);
        size_t one;
        GPT_TRY(gpt_moe_bytes_for(&mc, batch * seq, cfg->moe_ep > 1 ? cfg->moe_ep : 1, 0, &one));
        out->moe = (size_t)cfg->n_layer * one;
        out->total += out->moe;
    }
    return ZERO_OK;
}

size_t gpt_workspace_bytes_for(const gpt_config *cfg, int batch, int seq)
{
    gpt_activation_bytes b;
    return gpt_activation_bytes_for(cfg, batch, seq, NULL, &b) == ZERO_OK ? b.total : 0;
}

zero_status gpt_workspace_create(gpt_workspace **out, const gpt_config *cfg, int batch, int seq)
{
    return gpt_workspace_create_ckpt(out, cfg, batch, seq, NULL);
}

zero_status gpt_workspace_create_ckpt(gpt_workspace **out, const gpt_config *cfg, int batch, int seq,
                                      const gpt_checkpointing *ck)
{
    return gpt_workspace_create_moe(out, cfg, batch, seq, ck, NULL);
}

/* One MoE layer per block, over `ep`. */
static zero_status create_moe(gpt_workspace *ws, zero_comm *ep)
{
    const gpt_config *cfg = &ws->cfg;
    int want = cfg->moe_ep > 1 ? cfg->moe_ep : 1, have = ep ? zero_comm_get_size(ep) : 1;
    if (want != have)
        return gpt_fail(ZERO_CONFIG, "gpt_workspace_create: moe ep = %d but the ep comm has %d rank%s", cfg->moe_ep,
                        have, have == 1 ? "" : "s");
    ws->moe = calloc((size_t)cfg->n_layer, sizeof *ws->moe);
    ws->moe_aux = calloc((size_t)cfg->n_layer, sizeof *ws->moe_aux);
    if (!ws->moe || !ws->moe_aux) return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_workspace_create: out of memory (MoE)");
    gpt_moe_config mc = gpt_moe_config_of(cfg);
    for (int l = 0; l < cfg->n_layer; l++) {
        GPT_TRY(gpt_moe_create(&ws->moe[l], &mc, ws->B * ws->T, ep));
        ws->bytes.moe += gpt_moe_bytes(ws->moe[l]); /* what each layer allocated */
    }
    ws->bytes.total += ws->bytes.moe;
    ws->blk.moe = ws->moe;
    ws->blk.moe_aux = ws->moe_aux;
    return ZERO_OK;
}

zero_status gpt_workspace_create_moe(gpt_workspace **out, const gpt_config *cfg, int batch, int seq,
                                     const gpt_checkpointing *ck, zero_comm *ep)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_workspace_create: out is NULL");
    *out = NULL;
    GPT_TRY(gpt_config_validate(cfg));
    GPT_TRY(gpt_checkpointing_validate(ck, "gpt_workspace_create"));
    if (batch < 1 || seq < 1 || seq > cfg->seq_len)
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "gpt_workspace_create: batch %d x seq %d is invalid (need batch >= 1, 1 <= seq <= seq_len %d)",
                        batch, seq, cfg->seq_len);
    GPT_TRY(gpt_gemm_init()); /* also makes OpenBLAS single-threaded */
    gpt_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_workspace_create: no memory for the workspace header");
    ws->cfg = *cfg;
    ws->B = batch;
    ws->T = seq;
    ws->nthreads = max_threads();
    gpt_acts_shape s = shape_of(cfg, batch, seq, ck);
    zero_status st = gpt_acts_init(&ws->acts, &s);
    if (st != ZERO_OK) {
        free(ws);
        return st;
    }
    gpt_carver c;
    gpt_carver_init(&c, s.align, NULL, NULL);
    layout(NULL, &s, ws->nthreads, &c);
    size_t bytes = c.off[0];
    ws->mem = aligned_alloc(64, bytes);
    if (!ws->mem) {
        gpt_workspace_destroy(ws);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_workspace_create: cannot allocate %zu bytes of activations for batch %d x seq %d",
                        bytes, batch, seq);
    }
    gpt_carver_init(&c, s.align, ws->mem, NULL);
    layout(ws, &s, ws->nthreads, &c);
    gpt_carver_report(&c, &ws->bytes);
    ws->io = &ws->acts.slots[0];
    gpt_block_ctx *k = &ws->blk; /* layout() set the CPU scratch */
    k->B = batch, k->T = seq, k->C = k->Cl = k->Ca = cfg->d_model, k->Hl = 4 * cfg->d_model, k->NHl = cfg->n_head;
    k->Nc = k->Nr = batch * seq, k->cp = 1;
    k->lead = 1, k->nthreads = ws->nthreads, k->sum = NULL, k->sum_ctx = NULL;
    k->dln = ws->acts.dln, k->dqkv = ws->acts.dqkv, k->dfch = ws->acts.dfch;
    if (cfg->moe_experts > 0) {
        st = create_moe(ws, ep);
        if (st != ZERO_OK) {
            gpt_workspace_destroy(ws);
            return st;
        }
    }
    *out = ws;
    return ZERO_OK;
}

struct gpt_moe *gpt_workspace_moe_layer(const gpt_workspace *ws, int layer)
{
    return ws && ws->moe && layer >= 0 && layer < ws->cfg.n_layer ? ws->moe[layer] : NULL;
}

float gpt_workspace_moe_aux(const gpt_workspace *ws)
{
    float s = 0;
    if (ws && ws->moe_aux)
        for (int l = 0; l < ws->cfg.n_layer; l++) s += ws->moe_aux[l];
    return s;
}

void gpt_workspace_destroy(gpt_workspace *ws)
{
    if (!ws) return;
    if (ws->moe)
        for (int l = 0; l < ws->cfg.n_layer; l++) gpt_moe_destroy(ws->moe[l]);
    free(ws->moe);
    free(ws->moe_aux);
    free(ws->mem);
    gpt_acts_free(&ws->acts);
    free(ws);
}

size_t gpt_workspace_bytes(const gpt_workspace *ws) { return ws ? ws->bytes.total : 0; }

void gpt_workspace_activation_bytes(const gpt_workspace *ws, gpt_activation_bytes *out)
{
    if (!out) return;
    if (ws) *out = ws->bytes;
    else memset(out, 0, sizeof *out);
}

const float *gpt_workspace_logits(const gpt_workspace *ws) { return ws ? ws->io->logits : NULL; }

zero_status gpt_workspace_set_matmul_dtype(gpt_workspace *ws, zero_dtype dtype)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_workspace_set_matmul_dtype: workspace is NULL");
    if (dtype != ZERO_F32 && dtype != ZERO_BF16)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_workspace_set_matmul_dtype: %s matmuls are not offered on the CPU (f32 or bf16)",
                        zero_dtype_name(dtype));
    ws->blk.math = dtype == ZERO_BF16 ? GPT_GEMM_BF16 : GPT_GEMM_F32;
    if (ws->moe)
        for (int l = 0; l < ws->cfg.n_layer; l++) gpt_moe_set_matmul_bf16(ws->moe[l], dtype == ZERO_BF16);
    return ZERO_OK;
}

/* ------------------------------------------------------------ argument checks */
static zero_status check_set(const gpt_workspace *ws, const char *op, const gpt_tensors *set, int module,
                             const char *what)
{
    char name[32];
    gpt_module_name(&ws->cfg, module, name, sizeof name);
    if (!set) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: the %s of module %s is NULL", op, what, name);
    for (int k = 0; k < gpt_module_num_tensors(&ws->cfg, module); k++)
        if (!set->t[k]) {
            gpt_param_info info;
            gpt_param_info_get(&ws->cfg, gpt_param_position(&ws->cfg, module, k), &info);
            return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: %s pointer of %s (module %s) is NULL", op, what, info.name,
                            name);
        }
    return ZERO_OK;
}


/* ------------------------------------------------------------ forward */
zero_status gpt_forward_begin(gpt_workspace *ws, const int32_t *tokens, const int32_t *targets,
                              const gpt_tensors *embed)
{
    if (!ws || !tokens) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_forward_begin: workspace or tokens is NULL");
    GPT_TRY(check_set(ws, "gpt_forward_begin", embed, GPT_MODULE_EMBED, "parameter"));
    const int B = ws->B, T = ws->T, C = ws->cfg.d_model, V = ws->cfg.vocab;
    for (int i = 0; i < B * T; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_forward_begin: token %d at batch %d position %d is outside [0, %d)",
                            tokens[i], i / T, i % T, V);
        if (targets && targets[i] >= V)
            return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_forward_begin: target %d at batch %d position %d is >= vocab %d",
                            targets[i], i / T, i % T, V);
    }
    memcpy(ws->io->tokens, tokens, sizeof(int32_t) * B * T);
    ws->has_targets = targets != NULL;
    if (targets) memcpy(ws->io->targets, targets, sizeof(int32_t) * B * T);

    gpt_encoder_forward(ws->io->resid[0], ws->io->tokens, embed->t[GPT_WTE], embed->t[GPT_WPE], B, T, C);
    ws->phase = GPT_PHASE_FORWARD;
    ws->next_layer = 0;
    return ZERO_OK;
}

zero_status gpt_forward_block(gpt_workspace *ws, int layer, const gpt_tensors *p)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_forward_block: workspace is NULL");
    if (ws->phase != GPT_PHASE_FORWARD || layer != ws->next_layer)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_forward_block: block %d called out of order (expected %s%d)", layer,
                        ws->phase == GPT_PHASE_FORWARD ? "block " : "gpt_forward_begin before block ",
                        ws->next_layer);
    GPT_TRY(check_set(ws, "gpt_forward_block", p, gpt_module_block(layer), "parameter"));
    /* a recomputed block's activations go to the shared set, overwritten by the next one */
    GPT_TRY(gpt_block_forward(&ws->blk, layer, ws->io->block[layer], ws->io->resid[layer], ws->io->resid[layer + 1], p));
    ws->next_layer++;
    return ZERO_OK;
}

zero_status gpt_forward_end(gpt_workspace *ws, const gpt_tensors *final_params, const gpt_tensors *embed,
                            float *loss)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_forward_end: workspace is NULL");
    if (ws->phase != GPT_PHASE_FORWARD || ws->next_layer != ws->cfg.n_layer)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_forward_end: called before all %d blocks ran forward (%d did)",
                        ws->cfg.n_layer, ws->phase == GPT_PHASE_FORWARD ? ws->next_layer : 0);
    GPT_TRY(check_set(ws, "gpt_forward_end", final_params, gpt_module_final(&ws->cfg), "parameter"));
    GPT_TRY(check_set(ws, "gpt_forward_end", embed, GPT_MODULE_EMBED, "parameter"));
    const int N = ws->B * ws->T, C = ws->cfg.d_model, V = ws->cfg.vocab;

    gpt_acts_slot *io = ws->io;
    gpt_layernorm_forward(io->lnf, io->lnf_mean, io->lnf_rstd, io->resid[ws->cfg.n_layer],
                          final_params->t[GPT_LNF_W], final_params->t[GPT_LNF_B], N, C);
    /* the tied head: logits = ln_f(x) wte^T */
    gpt_matmul_forward(ws->blk.math, io->logits, NULL, io->lnf, embed->t[GPT_WTE], NULL, N, C, V);
    double total = gpt_crossentropy_forward(io->lse, io->logits, ws->has_targets ? io->targets : NULL, N, V,
                                            &ws->valid);
    if (loss) *loss = (ws->valid ? (float)(total / ws->valid) : 0.0f) + ws->cfg.moe_aux_loss_coef * gpt_workspace_moe_aux(ws);
    ws->phase = GPT_PHASE_FORWARD_DONE;
    return ZERO_OK;
}

/* ------------------------------------------------------------ backward */
zero_status gpt_backward_end(gpt_workspace *ws, float dloss, const gpt_tensors *final_params,
                             gpt_tensors *final_grads, const gpt_tensors *embed, gpt_tensors *embed_grads)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_backward_end: workspace is NULL");
    if (ws->phase != GPT_PHASE_FORWARD_DONE)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_backward_end: needs a completed forward (gpt_forward_end) first");
    if (!ws->has_targets)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_backward_end: the forward ran without targets, there is no loss");
    int fm = gpt_module_final(&ws->cfg);
    GPT_TRY(check_set(ws, "gpt_backward_end", final_params, fm, "parameter"));
    GPT_TRY(check_set(ws, "gpt_backward_end", final_grads, fm, "gradient"));
    GPT_TRY(check_set(ws, "gpt_backward_end", embed, GPT_MODULE_EMBED, "parameter"));
    GPT_TRY(check_set(ws, "gpt_backward_end", embed_grads, GPT_MODULE_EMBED, "gradient"));
    const int N = ws->B * ws->T, C = ws->cfg.d_model, V = ws->cfg.vocab;
    const gpt_acts_slot *io = ws->io;
    gpt_acts *a = &ws->acts;

    /* loss = mean over valid tokens, so each row's gradient carries dloss / valid */
    float scale = ws->valid ? dloss / (float)ws->valid : 0.0f;
    ws->blk.moe_dloss = dloss; /* the aux losses' share */
    gpt_crossentropy_backward(a->dlogits, io->logits, io->lse, io->targets, N, V, scale);
    /* tied head: dwte += dlogits^T lnf, dlnf = dlogits wte */
    gpt_matmul_backward(ws->blk.math, a->dln, embed_grads->t[GPT_WTE], NULL, a->dlogits, io->lnf, embed->t[GPT_WTE], N, C, V,
                        0, ws->blk.partials, ws->nthreads);
    memset(a->dres, 0, sizeof(float) * (size_t)N * C);
    gpt_layernorm_backward(a->dres, final_grads->t[GPT_LNF_W], final_grads->t[GPT_LNF_B], a->dln,
                           io->resid[ws->cfg.n_layer], final_params->t[GPT_LNF_W], io->lnf_mean, io->lnf_rstd, N, C,
                           ws->blk.partials, ws->nthreads);
    ws->phase = GPT_PHASE_BACKWARD;
    ws->next_layer = ws->cfg.n_layer - 1;
    return ZERO_OK;
}

zero_status gpt_backward_block(gpt_workspace *ws, int layer, const gpt_tensors *p, gpt_tensors *g)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_backward_block: workspace is NULL");
    if (ws->phase != GPT_PHASE_BACKWARD || layer != ws->next_layer)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_backward_block: block %d called out of order (expected %s%d)", layer,
                        ws->phase == GPT_PHASE_BACKWARD ? "block " : "gpt_backward_end before block ",
                        ws->phase == GPT_PHASE_BACKWARD ? ws->next_layer : ws->cfg.n_layer - 1);
    int m = gpt_module_block(layer);
    GPT_TRY(check_set(ws, "gpt_backward_block", p, m, "parameter"));
    GPT_TRY(check_set(ws, "gpt_backward_block", g, m, "gradient"));
    const float *x = ws->io->resid[layer];
    gpt_block_acts *a = ws->io->block[layer];
    /* checkpointing: recompute the forward from the kept input, same kernels, same order */
    if (gpt_acts_recomputed(&ws->acts.shape, layer)) GPT_TRY(gpt_block_forward(&ws->blk, layer, a, x, NULL, p));
    GPT_TRY(gpt_block_backward(&ws->blk, layer, a, x, ws->acts.dres, p, g));
    ws->next_layer--;
    return ZERO_OK;
}

zero_status gpt_backward_begin(gpt_workspace *ws, gpt_tensors *embed_grads)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_backward_begin: workspace is NULL");
    if (ws->phase != GPT_PHASE_BACKWARD || ws->next_layer != -1)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_backward_begin: called before every block ran backward");
    GPT_TRY(check_set(ws, "gpt_backward_begin", embed_grads, GPT_MODULE_EMBED, "gradient"));
    gpt_encoder_backward(embed_grads->t[GPT_WTE], embed_grads->t[GPT_WPE], ws->acts.dres, ws->io->tokens, ws->B, ws->T,
                         ws->cfg.d_model);
    ws->phase = GPT_PHASE_IDLE;
    return ZERO_OK;
}

/* ------------------------------------------------------------ whole passes */
zero_status gpt_forward(gpt_workspace *ws, const int32_t *tokens, const int32_t *targets,
                        const gpt_tensors *params, float *loss)
{
    if (!ws || !params) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_forward: workspace or params is NULL");
    GPT_TRY(gpt_forward_begin(ws, tokens, targets, &params[GPT_MODULE_EMBED]));
    for (int l = 0; l < ws->cfg.n_layer; l++) GPT_TRY(gpt_forward_block(ws, l, &params[gpt_module_block(l)]));
    return gpt_forward_end(ws, &params[gpt_module_final(&ws->cfg)], &params[GPT_MODULE_EMBED], loss);
}

zero_status gpt_backward(gpt_workspace *ws, float dloss, const gpt_tensors *params, gpt_tensors *grads)
{
    if (!ws || !params || !grads)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_backward: workspace, params or grads is NULL");
    int fm = gpt_module_final(&ws->cfg);
    GPT_TRY(gpt_backward_end(ws, dloss, &params[fm], &grads[fm], &params[GPT_MODULE_EMBED],
                              &grads[GPT_MODULE_EMBED]));
    for (int l = ws->cfg.n_layer - 1; l >= 0; l--)
        GPT_TRY(gpt_backward_block(ws, l, &params[gpt_module_block(l)], &grads[gpt_module_block(l)]));
    return gpt_backward_begin(ws, &grads[GPT_MODULE_EMBED]);
}
