/* The CPU model: the workspace and the module-by-module forward and
 * backward, in fp32. Each function reads top to bottom as the math does; the
 * kernels live in gpt_cpu_ops.c. */
#include <stdlib.h>
#include <string.h>

#include "gpt_cpu_ops.h"
#include "gpt_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Activations one block keeps for its backward. N = B*T rows. */
typedef struct gpt_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd;  /* N x C, N, N */
    float *qkv;                        /* N x 3C */
    float *att;                        /* B x NH x T x T softmax probabilities */
    float *atty;                       /* N x C attention output before the projection */
    float *res2;                       /* N x C residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;             /* N x 4C before and after GELU */
    float *res3;                       /* N x C block output */
} gpt_layer_acts;

typedef enum gpt_phase {
    GPT_PHASE_IDLE = 0,     /* nothing in flight: forward_begin next */
    GPT_PHASE_FORWARD,      /* blocks running forward */
    GPT_PHASE_FORWARD_DONE, /* loss computed: backward_end next */
    GPT_PHASE_BACKWARD,     /* blocks running backward */
} gpt_phase;

struct gpt_workspace {
    gpt_config cfg;
    int B, T, nthreads;
    size_t bytes;
    void *mem;

    int32_t *tokens, *targets;
    int has_targets;
    float *encoded;          /* N x C: input of block 0 */
    gpt_layer_acts *layers;  /* n_layer */
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *lse;

    /* backward scratch, reused by every block */
    float *dres;             /* N x C: gradient of the residual stream */
    float *dln;              /* N x C */
    float *dqkv;             /* N x 3C */
    float *dfch;             /* N x 4C */
    float *dlogits;          /* N x V */
    float *partials;         /* nthreads x 4C: per-thread sums of bias / LayerNorm gradients */
    float *att_scratch;      /* nthreads x T x T */

    gpt_phase phase;
    int next_layer;          /* forward: next block to run; backward: next block, descending */
    long valid;              /* tokens with a target in this micro-batch */
};

/* ------------------------------------------------------------ layout */
/* Walk every buffer of the workspace, either counting (base == NULL) or
 * assigning pointers, so the size and the carving cannot disagree. */
static void *carve(size_t *offset, void *base, size_t bytes)
{
    size_t at = (*offset + 63) & ~(size_t)63;  /* cache-line aligned */
    *offset = at + bytes;
    return base ? (char *)base + at : NULL;
}

static size_t layout(gpt_workspace *ws, const gpt_config *cfg, int B, int T, int nthreads, void *base)
{
    size_t N = (size_t)B * T, C = (size_t)cfg->d_model, V = (size_t)cfg->vocab;
    size_t off = 0;
#define CARVE(field, count, type) (field) = (type *)carve(&off, base, sizeof(type) * (count))
    gpt_workspace scratch_ws;
    gpt_layer_acts scratch_layer;
    if (!base) ws = &scratch_ws;
    CARVE(ws->tokens, N, int32_t);
    CARVE(ws->targets, N, int32_t);
    CARVE(ws->encoded, N * C, float);
    for (int l = 0; l < cfg->n_layer; l++) {
        gpt_layer_acts *a = base ? &ws->layers[l] : &scratch_layer;
        CARVE(a->ln1, N * C, float);
        CARVE(a->ln1_mean, N, float);
        CARVE(a->ln1_rstd, N, float);
        CARVE(a->qkv, N * 3 * C, float);
        CARVE(a->att, (size_t)B * cfg->n_head * T * T, float);
        CARVE(a->atty, N * C, float);
        CARVE(a->res2, N * C, float);
        CARVE(a->ln2, N * C, float);
        CARVE(a->ln2_mean, N, float);
        CARVE(a->ln2_rstd, N, float);
        CARVE(a->fch, N * 4 * C, float);
        CARVE(a->fch_gelu, N * 4 * C, float);
        CARVE(a->res3, N * C, float);
    }
    CARVE(ws->lnf, N * C, float);
    CARVE(ws->lnf_mean, N, float);
    CARVE(ws->lnf_rstd, N, float);
    CARVE(ws->logits, N * V, float);
    CARVE(ws->lse, N, float);
    CARVE(ws->dres, N * C, float);
    CARVE(ws->dln, N * C, float);
    CARVE(ws->dqkv, N * 3 * C, float);
    CARVE(ws->dfch, N * 4 * C, float);
    CARVE(ws->dlogits, N * V, float);
    CARVE(ws->partials, (size_t)nthreads * 4 * C, float);
    CARVE(ws->att_scratch, (size_t)nthreads * T * T, float);
#undef CARVE
    return (off + 63) & ~(size_t)63;
}

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

size_t gpt_workspace_bytes_for(const gpt_config *cfg, int batch, int seq)
{
    return layout(NULL, cfg, batch, seq, max_threads(), NULL) + sizeof(gpt_workspace) +
           sizeof(gpt_layer_acts) * (size_t)cfg->n_layer;
}

zero_status gpt_workspace_create(gpt_workspace **out, const gpt_config *cfg, int batch, int seq)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_workspace_create: out is NULL");
    *out = NULL;
    GPT_TRY(gpt_config_validate(cfg));
    if (batch < 1 || seq < 1 || seq > cfg->seq_len)
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "gpt_workspace_create: batch %d x seq %d is invalid (need batch >= 1, 1 <= seq <= seq_len %d)",
                        batch, seq, cfg->seq_len);
    gpt_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_workspace_create: no memory for the workspace header");
    ws->cfg = *cfg;
    ws->B = batch;
    ws->T = seq;
    ws->nthreads = max_threads();
    gpt_blas_single_threaded();
    ws->layers = calloc((size_t)cfg->n_layer, sizeof *ws->layers);
    size_t bytes = layout(NULL, cfg, batch, seq, ws->nthreads, NULL);
    ws->mem = ws->layers ? aligned_alloc(64, bytes) : NULL;
    if (!ws->mem) {
        free(ws->layers);
        free(ws);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_workspace_create: cannot allocate %zu bytes of activations for batch %d x seq %d",
                        bytes, batch, seq);
    }
    layout(ws, cfg, batch, seq, ws->nthreads, ws->mem);
    ws->bytes = bytes + sizeof *ws + sizeof(gpt_layer_acts) * (size_t)cfg->n_layer;
    *out = ws;
    return ZERO_OK;
}

void gpt_workspace_destroy(gpt_workspace *ws)
{
    if (!ws) return;
    free(ws->mem);
    free(ws->layers);
    free(ws);
}

size_t gpt_workspace_bytes(const gpt_workspace *ws) { return ws ? ws->bytes : 0; }
const float *gpt_workspace_logits(const gpt_workspace *ws) { return ws ? ws->logits : NULL; }

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

static const float *block_input(const gpt_workspace *ws, int layer)
{
    return layer == 0 ? ws->encoded : ws->layers[layer - 1].res3;
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
    memcpy(ws->tokens, tokens, sizeof(int32_t) * B * T);
    ws->has_targets = targets != NULL;
    if (targets) memcpy(ws->targets, targets, sizeof(int32_t) * B * T);

    gpt_encoder_forward(ws->encoded, ws->tokens, embed->t[GPT_WTE], embed->t[GPT_WPE], B, T, C);
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
    const int B = ws->B, T = ws->T, C = ws->cfg.d_model, NH = ws->cfg.n_head, N = B * T;
    gpt_layer_acts *a = &ws->layers[layer];
    const float *x = block_input(ws, layer);

    /* attention half: res2 = x + proj(attention(ln_1(x))) */
    gpt_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->t[GPT_LN1_W], p->t[GPT_LN1_B], N, C);
    gpt_matmul_forward(a->qkv, NULL, a->ln1, p->t[GPT_QKV_W], p->t[GPT_QKV_B], N, C, 3 * C);
    gpt_attention_forward(a->atty, a->att, a->qkv, B, T, C, NH, ws->nthreads);
    gpt_matmul_forward(a->res2, x, a->atty, p->t[GPT_ATTPROJ_W], p->t[GPT_ATTPROJ_B], N, C, C);

    /* MLP half: res3 = res2 + proj(gelu(fc(ln_2(res2)))) */
    gpt_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->t[GPT_LN2_W], p->t[GPT_LN2_B], N, C);
    gpt_matmul_forward(a->fch, NULL, a->ln2, p->t[GPT_FC_W], p->t[GPT_FC_B], N, C, 4 * C);
    gpt_gelu_forward(a->fch_gelu, a->fch, (size_t)N * 4 * C);
    gpt_matmul_forward(a->res3, a->res2, a->fch_gelu, p->t[GPT_FCPROJ_W], p->t[GPT_FCPROJ_B], N, 4 * C, C);

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

    gpt_layernorm_forward(ws->lnf, ws->lnf_mean, ws->lnf_rstd, ws->layers[ws->cfg.n_layer - 1].res3,
                          final_params->t[GPT_LNF_W], final_params->t[GPT_LNF_B], N, C);
    /* the tied head: logits = ln_f(x) wte^T */
    gpt_matmul_forward(ws->logits, NULL, ws->lnf, embed->t[GPT_WTE], NULL, N, C, V);
    double total = gpt_crossentropy_forward(ws->lse, ws->logits, ws->has_targets ? ws->targets : NULL, N, V,
                                            &ws->valid);
    if (loss) *loss = ws->valid ? (float)(total / ws->valid) : 0.0f;
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
    const float *last = ws->layers[ws->cfg.n_layer - 1].res3;

    /* loss = mean over valid tokens, so each row's gradient carries dloss / valid */
    float scale = ws->valid ? dloss / (float)ws->valid : 0.0f;
    gpt_crossentropy_backward(ws->dlogits, ws->logits, ws->lse, ws->targets, N, V, scale);
    /* tied head: dwte += dlogits^T lnf, dlnf = dlogits wte */
    gpt_matmul_backward(ws->dln, embed_grads->t[GPT_WTE], NULL, ws->dlogits, ws->lnf, embed->t[GPT_WTE], N, C, V,
                        0, ws->partials, ws->nthreads);
    memset(ws->dres, 0, sizeof(float) * (size_t)N * C);
    gpt_layernorm_backward(ws->dres, final_grads->t[GPT_LNF_W], final_grads->t[GPT_LNF_B], ws->dln, last,
                           final_params->t[GPT_LNF_W], ws->lnf_mean, ws->lnf_rstd, N, C, ws->partials,
                           ws->nthreads);
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
    const int B = ws->B, T = ws->T, C = ws->cfg.d_model, NH = ws->cfg.n_head, N = B * T;
    gpt_layer_acts *a = &ws->layers[layer];
    const float *x = block_input(ws, layer);
    float *dres = ws->dres;  /* in: d res3; out: d x */

    /* MLP half, in reverse */
    gpt_matmul_backward(ws->dfch, g->t[GPT_FCPROJ_W], g->t[GPT_FCPROJ_B], dres, a->fch_gelu, p->t[GPT_FCPROJ_W],
                        N, 4 * C, C, 0, ws->partials, ws->nthreads);
    gpt_gelu_backward(ws->dfch, a->fch, ws->dfch, (size_t)N * 4 * C);
    gpt_matmul_backward(ws->dln, g->t[GPT_FC_W], g->t[GPT_FC_B], ws->dfch, a->ln2, p->t[GPT_FC_W], N, C, 4 * C, 0,
                        ws->partials, ws->nthreads);
    /* the residual path keeps dres; ln_2 adds its share: dres = d res2 */
    gpt_layernorm_backward(dres, g->t[GPT_LN2_W], g->t[GPT_LN2_B], ws->dln, a->res2, p->t[GPT_LN2_W],
                           a->ln2_mean, a->ln2_rstd, N, C, ws->partials, ws->nthreads);

    /* attention half, in reverse */
    gpt_matmul_backward(ws->dln, g->t[GPT_ATTPROJ_W], g->t[GPT_ATTPROJ_B], dres, a->atty, p->t[GPT_ATTPROJ_W], N,
                        C, C, 0, ws->partials, ws->nthreads);
    gpt_attention_backward(ws->dqkv, ws->dln, a->att, a->qkv, B, T, C, NH, ws->att_scratch, ws->nthreads);
    gpt_matmul_backward(ws->dln, g->t[GPT_QKV_W], g->t[GPT_QKV_B], ws->dqkv, a->ln1, p->t[GPT_QKV_W], N, C, 3 * C,
                        0, ws->partials, ws->nthreads);
    gpt_layernorm_backward(dres, g->t[GPT_LN1_W], g->t[GPT_LN1_B], ws->dln, x, p->t[GPT_LN1_W], a->ln1_mean,
                           a->ln1_rstd, N, C, ws->partials, ws->nthreads);

    ws->next_layer--;
    return ZERO_OK;
}

zero_status gpt_backward_begin(gpt_workspace *ws, gpt_tensors *embed_grads)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_backward_begin: workspace is NULL");
    if (ws->phase != GPT_PHASE_BACKWARD || ws->next_layer != -1)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_backward_begin: called before every block ran backward");
    GPT_TRY(check_set(ws, "gpt_backward_begin", embed_grads, GPT_MODULE_EMBED, "gradient"));
    gpt_encoder_backward(embed_grads->t[GPT_WTE], embed_grads->t[GPT_WPE], ws->dres, ws->tokens, ws->B, ws->T,
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
