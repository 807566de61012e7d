/* One transformer block on the CPU (gpt_block.h): the math of gpt.h, with
 * Megatron's split when k->sum is set (widths Cl, Hl, NHl are then this
 * rank's share; see tp_gpt.h). */
#include "gpt_block.h"

#include "gpt_cpu_ops.h"
#include "gpt_internal.h"

#include <string.h>

static zero_status block_sum(const gpt_block_ctx *k, float *buf, size_t n, const char *what, int layer)
{
    return k->sum ? k->sum(k->sum_ctx, buf, n, what, layer) : ZERO_OK;
}

/* An MoE block's expert and router tensors as moe.h takes them. */
static gpt_moe_params moe_tensors(const gpt_tensors *p)
{
    return (gpt_moe_params){p->t[GPT_MOE_GATE_W], p->t[GPT_FC_W], p->t[GPT_FC_B], p->t[GPT_FCPROJ_W],
                            p->t[GPT_FCPROJ_B]};
}

zero_status gpt_block_forward(const gpt_block_ctx *k, int layer, gpt_block_acts *a, const float *x, float *out,
                              const gpt_tensors *p)
{
    const int B = k->B, T = k->T, C = k->C, N = B * T, Cl = k->Cl, Hl = k->Hl, lead = k->lead;

    /* attention half: res2 = x + proj(attention(ln_1(x))), the heads split over tp */
    gpt_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->t[GPT_LN1_W], p->t[GPT_LN1_B], N, C);
    gpt_matmul_forward(k->math, a->qkv, NULL, a->ln1, p->t[GPT_QKV_W], p->t[GPT_QKV_B], N, C, 3 * Cl);
    gpt_attention_forward(k->math, a->atty, a->att, a->qkv, B, T, Cl, k->NHl, k->nthreads);
    /* row-parallel: the partial products sum over tp; the lead rank brings x + bias */
    gpt_matmul_forward(k->math, a->res2, lead ? x : NULL, a->atty, p->t[GPT_ATTPROJ_W], lead ? p->t[GPT_ATTPROJ_B] : NULL, N,
                       Cl, C);
    GPT_TRY(block_sum(k, a->res2, (size_t)N * C, "the attention output", layer));

    /* MLP half: out = res2 + proj(gelu(fc(ln_2(res2)))), the hidden units split over tp */
    gpt_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->t[GPT_LN2_W], p->t[GPT_LN2_B], N, C);
    if (k->moe) {
        /* out = res2 + MoE(ln_2(res2)); recomputation stops here: the MoE
         * layer kept its own state (and must not exchange again) */
        if (!out) return ZERO_OK;
        gpt_moe_params mp = moe_tensors(p);
        return gpt_moe_forward(k->moe[layer], a->ln2, a->res2, out, &mp, &k->moe_aux[layer]);
    }
    gpt_matmul_forward(k->math, a->fch, NULL, a->ln2, p->t[GPT_FC_W], p->t[GPT_FC_B], N, C, Hl);
    gpt_gelu_forward(a->fch_gelu, a->fch, (size_t)N * Hl);
    if (!out) return ZERO_OK; /* recomputation: the output is kept already */
    gpt_matmul_forward(k->math, out, lead ? a->res2 : NULL, a->fch_gelu, p->t[GPT_FCPROJ_W], lead ? p->t[GPT_FCPROJ_B] : NULL,
                       N, Hl, C);
    return block_sum(k, out, (size_t)N * C, "the MLP output", layer);
}

/* The backward with the weight gradients of the four linear layers either
 * computed in place (st == NULL) or deferred: the upstream gradient each
 * one needs is kept in `st`, the layers' inputs are the block's activations.
 * Either way the same kernels run on the same inputs, so a deferred W gives
 * the same bits as the inline one. */
static zero_status block_backward(const gpt_block_ctx *k, int layer, const gpt_block_acts *a, const float *x,
                                  float *dres, const gpt_tensors *p, gpt_tensors *g, const gpt_block_wstash *st)
{
    const int B = k->B, T = k->T, C = k->C, N = B * T, Cl = k->Cl, Hl = k->Hl, nt = k->nthreads;
    const size_t NC = (size_t)N * C;

    /* MLP half, in reverse. Row-parallel c_proj: g's backward is the identity,
     * its bias gradient is computed (redundantly under tp) from the replicated dres. */
    if (k->moe) {
        /* the MoE layer computes its weight gradients with its input's (no deferred W: the
         * pipeline runtime that defers it has no MoE blocks) */
        if (st)
            return gpt_fail(ZERO_UNSUPPORTED, "block %d: an MoE block's weight gradients cannot be deferred", layer);
        gpt_moe_params mp = moe_tensors(p), mg = moe_tensors(g);
        GPT_TRY(gpt_moe_backward(k->moe[layer], k->moe_dloss, a->ln2, dres, k->dln, &mp, &mg));
    } else {
        gpt_matmul_backward_input(k->math, k->dfch, dres, p->t[GPT_FCPROJ_W], N, Hl, C, 0);
        if (st) memcpy(st->dout_fcproj, dres, sizeof(float) * NC);
        else
            gpt_matmul_backward_weight(k->math, g->t[GPT_FCPROJ_W], g->t[GPT_FCPROJ_B], dres, a->fch_gelu, N, Hl, C,
                                       k->partials, nt);
        float *dfch = st ? st->dfch : k->dfch; /* GELU's backward writes where W will read it */
        gpt_gelu_backward(dfch, a->fch, k->dfch, (size_t)N * Hl);
        gpt_matmul_backward_input(k->math, k->dln, dfch, p->t[GPT_FC_W], N, C, Hl, 0);
        if (!st)
            gpt_matmul_backward_weight(k->math, g->t[GPT_FC_W], g->t[GPT_FC_B], dfch, a->ln2, N, C, Hl, k->partials, nt);
        GPT_TRY(block_sum(k, k->dln, NC, "d ln_2 (backward)", layer)); /* f's backward */
    }
    /* the residual path keeps dres; ln_2 adds its share: dres = d res2 */
    gpt_layernorm_backward(dres, g->t[GPT_LN2_W], g->t[GPT_LN2_B], k->dln, a->res2, p->t[GPT_LN2_W], a->ln2_mean,
                           a->ln2_rstd, N, C, k->partials, nt);

    /* attention half, in reverse */
    gpt_matmul_backward_input(k->math, k->dln, dres, p->t[GPT_ATTPROJ_W], N, Cl, C, 0);
    if (st) memcpy(st->dout_attproj, dres, sizeof(float) * NC);
    else
        gpt_matmul_backward_weight(k->math, g->t[GPT_ATTPROJ_W], g->t[GPT_ATTPROJ_B], dres, a->atty, N, Cl, C,
                                   k->partials, nt);
    float *dqkv = st ? st->dqkv : k->dqkv;
    gpt_attention_backward(k->math, dqkv, k->dln, a->att, a->qkv, B, T, Cl, k->NHl, k->att_scratch, nt);
    gpt_matmul_backward_input(k->math, k->dln, dqkv, p->t[GPT_QKV_W], N, C, 3 * Cl, 0);
    if (!st)
        gpt_matmul_backward_weight(k->math, g->t[GPT_QKV_W], g->t[GPT_QKV_B], dqkv, a->ln1, N, C, 3 * Cl, k->partials,
                                   nt);
    GPT_TRY(block_sum(k, k->dln, NC, "d ln_1 (backward)", layer));
    gpt_layernorm_backward(dres, g->t[GPT_LN1_W], g->t[GPT_LN1_B], k->dln, x, p->t[GPT_LN1_W], a->ln1_mean,
                           a->ln1_rstd, N, C, k->partials, nt);
    return ZERO_OK;
}

zero_status gpt_block_backward(const gpt_block_ctx *k, int layer, const gpt_block_acts *a, const float *x,
                               float *dres, const gpt_tensors *p, gpt_tensors *g)
{
    return block_backward(k, layer, a, x, dres, p, g, NULL);
}

zero_status gpt_block_backward_input(const gpt_block_ctx *k, int layer, const gpt_block_acts *a, const float *x,
                                     float *dres, const gpt_tensors *p, gpt_tensors *g, const gpt_block_wstash *st)
{
    return block_backward(k, layer, a, x, dres, p, g, st);
}

void gpt_block_backward_weight(const gpt_block_ctx *k, const gpt_block_acts *a, const gpt_block_wstash *st,
                               gpt_tensors *g)
{
    const int N = k->B * k->T, C = k->C, Cl = k->Cl, Hl = k->Hl, nt = k->nthreads;
    /* the order of the inline backward (it does not matter for the bits:
     * each tensor gets one += per call) */
    gpt_matmul_backward_weight(k->math, g->t[GPT_FCPROJ_W], g->t[GPT_FCPROJ_B], st->dout_fcproj, a->fch_gelu, N, Hl,
                               C, k->partials, nt);
    gpt_matmul_backward_weight(k->math, g->t[GPT_FC_W], g->t[GPT_FC_B], st->dfch, a->ln2, N, C, Hl, k->partials, nt);
    gpt_matmul_backward_weight(k->math, g->t[GPT_ATTPROJ_W], g->t[GPT_ATTPROJ_B], st->dout_attproj, a->atty, N, Cl,
                               C, k->partials, nt);
    gpt_matmul_backward_weight(k->math, g->t[GPT_QKV_W], g->t[GPT_QKV_B], st->dqkv, a->ln1, N, C, 3 * Cl,
                               k->partials, nt);
}
