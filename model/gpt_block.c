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

/* ------------------------------------------------------------ sequence / context parallelism */
/* Megatron SP: all-gather (gather 1) or reduce-scatter (gather 0) over tp. */
static zero_status seq_op(const gpt_block_ctx *k, int gather, float *local, float *full, const char *what, int layer)
{
    return k->seq(k->sum_ctx, gather, local, full, (size_t)k->Nr * k->C, what, layer);
}

/* out[n, :] += x[n, :] + bias (the residual and the row-parallel bias under
 * SP: each rank adds them to its own rows after the reduce-scatter). */
static void add_residual(float *out, const float *x, const float *bias, int N, int C)
{
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] += x[(size_t)n * C + c] + bias[c];
}

/* Ulysses' re-layout around the all-to-all. The sequence side is this
 * rank's B x Tl rows (Tl = T/cp) of G groups (q|k|v: 3; attention output:
 * 1) of cp*Ca channels; the head side is B x T rows of G groups of Ca
 * channels (this rank's heads). Chunk j of the exchange holds
 * B x Tl x G x Ca floats: towards the heads, rank j's channels of this
 * rank's rows; back, this rank's channels of rank j's rows. into_chunks
 * packs `side` into the chunks, else unpacks them into `side`. */
static void cp_move(const gpt_block_ctx *k, int G, int head_side, float *side, float *chunks, int into_chunks)
{
    const size_t B = (size_t)k->B, T = (size_t)k->T, Q = (size_t)k->cp, Tl = T / Q, Ca = (size_t)k->Ca;
    for (size_t j = 0; j < Q; j++)
        for (size_t b = 0; b < B; b++)
            for (size_t t = 0; t < Tl; t++)
                for (size_t g = 0; g < (size_t)G; g++) {
                    size_t co = (((j * B + b) * Tl + t) * G + g) * Ca;
                    size_t so = head_side ? ((b * T + j * Tl + t) * G + g) * Ca : ((b * Tl + t) * G + g) * Q * Ca + j * Ca;
                    if (into_chunks) memcpy(chunks + co, side + so, sizeof(float) * Ca);
                    else memcpy(side + so, chunks + co, sizeof(float) * Ca);
                }
}

/* sequence-sharded -> head-sharded (to_heads) or back, through one all-to-all */
static zero_status cp_exchange(const gpt_block_ctx *k, int G, int to_heads, float *src, float *dst, const char *what,
                               int layer)
{
    cp_move(k, G, !to_heads, src, k->cp_send, 1);
    size_t count = (size_t)k->B * (size_t)(k->T / k->cp) * (size_t)G * (size_t)k->Ca;
    GPT_TRY(k->heads(k->sum_ctx, k->cp_send, k->cp_recv, count, what, layer));
    cp_move(k, G, to_heads, dst, k->cp_recv, 0);
    return ZERO_OK;
}

/* A row-parallel linear's output: out = x + bias + sum over tp of inp w^T.
 * Without SP the lead rank starts its partial product from x + bias and the
 * all-reduce sums (Megatron's g); with SP the partial products are
 * reduce-scattered to each rank's rows and every rank adds its rows' x and
 * the bias. */
static zero_status row_parallel(const gpt_block_ctx *k, float *out, const float *x, const float *inp, const float *w,
                                const float *bias, int IC, const char *what, int layer)
{
    if (!k->seq) {
        gpt_matmul_forward(k->math, out, k->lead ? x : NULL, inp, w, k->lead ? bias : NULL, k->Nc, IC, k->C);
        return block_sum(k, out, (size_t)k->Nc * k->C, what, layer);
    }
    gpt_matmul_forward(k->math, k->sp_full, NULL, inp, w, NULL, k->Nc, IC, k->C);
    GPT_TRY(seq_op(k, 0, out, k->sp_full, what, layer));
    add_residual(out, x, bias, k->Nr, k->C);
    return ZERO_OK;
}

/* The input of a column-parallel linear: the LayerNorm output, all-gathered
 * over the sequence under SP (Megatron's g-bar). */
static zero_status column_input(const gpt_block_ctx *k, float *ln, const float **full, const char *what, int layer)
{
    *full = ln;
    if (!k->seq) return ZERO_OK;
    GPT_TRY(seq_op(k, 1, ln, k->sp_full, what, layer));
    *full = k->sp_full;
    return ZERO_OK;
}

/* The gradient of a LayerNorm output, partial over tp: all-reduced (f's
 * backward), or reduce-scattered to this rank's rows under SP (into
 * sp_full's first Nr rows). Returns where it is. */
static zero_status ln_grad(const gpt_block_ctx *k, float *dln, float **out, const char *what, int layer)
{
    *out = dln;
    if (!k->seq) return block_sum(k, dln, (size_t)k->Nc * k->C, what, layer);
    GPT_TRY(seq_op(k, 0, k->sp_full, dln, what, layer));
    *out = k->sp_full;
    return ZERO_OK;
}

/* ------------------------------------------------------------ forward */
zero_status gpt_block_forward(const gpt_block_ctx *k, int layer, gpt_block_acts *a, const float *x, float *out,
                              const gpt_tensors *p)
{
    const int B = k->B, T = k->T, C = k->C, Nc = k->Nc, Nr = k->Nr, Cl = k->Cl, Hl = k->Hl, cp = k->cp > 1;
    const float *in;

    /* attention half: res2 = x + proj(attention(ln_1(x))), the heads split over tp (and cp) */
    gpt_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->t[GPT_LN1_W], p->t[GPT_LN1_B], Nr, C);
    GPT_TRY(column_input(k, a->ln1, &in, "ln_1's output", layer));
    gpt_matmul_forward(k->math, cp ? k->cp_recv : a->qkv, NULL, in, p->t[GPT_QKV_W], p->t[GPT_QKV_B], Nc, C, 3 * Cl);
    if (cp) GPT_TRY(cp_exchange(k, 3, 1, k->cp_recv, a->qkv, "qkv to heads", layer));
    gpt_attention_forward(k->math, cp ? k->cp_heads : a->atty, a->att, a->qkv, B, T, k->Ca, k->NHl, k->nthreads);
    if (cp) GPT_TRY(cp_exchange(k, 1, 0, k->cp_heads, a->atty, "the attention output to sequence", layer));
    GPT_TRY(row_parallel(k, a->res2, x, a->atty, p->t[GPT_ATTPROJ_W], p->t[GPT_ATTPROJ_B], Cl, "the attention output",
                         layer));

    /* MLP half: out = res2 + proj(gelu(fc(ln_2(res2)))), the hidden units split over tp */
    gpt_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->t[GPT_LN2_W], p->t[GPT_LN2_B], Nr, C);
    if (k->moe) {
        /* out = res2 + MoE(ln_2(res2)); recomputation stops here: the MoE
         * layer kept its own state (and must not exchange again) */
        if (!out) return ZERO_OK;
        gpt_moe_params mp = moe_tensors(p);
        return gpt_moe_forward(k->moe[layer], a->ln2, a->res2, out, &mp, &k->moe_aux[layer]);
    }
    GPT_TRY(column_input(k, a->ln2, &in, "ln_2's output", layer));
    gpt_matmul_forward(k->math, a->fch, NULL, in, p->t[GPT_FC_W], p->t[GPT_FC_B], Nc, C, Hl);
    gpt_gelu_forward(a->fch_gelu, a->fch, (size_t)Nc * Hl);
    if (!out) return ZERO_OK; /* recomputation: the output is kept already */
    return row_parallel(k, out, a->res2, a->fch_gelu, p->t[GPT_FCPROJ_W], p->t[GPT_FCPROJ_B], Hl, "the MLP output",
                        layer);
}

/* The backward with the weight gradients of the four linear layers either
 * computed in place (st == NULL) or deferred: the upstream gradient each
 * one needs is kept in `st`, the layers' inputs are the block's activations.
 * Either way the same kernels run on the same inputs, so a deferred W gives
 * the same bits as the inline one. (Deferral is refused under sequence and
 * context parallelism: tp_workspace_split_backward.)
 * Under SP the gradient of a row-parallel output arrives as this rank's rows
 * and is all-gathered first (g-bar's backward: every rank needs all rows for
 * its columns), and the column-parallel weight gradients re-gather their
 * LayerNorm input (kept as 1/tp: Megatron's choice, memory over one more
 * all-gather per linear). */
static zero_status block_backward(const gpt_block_ctx *k, int layer, const gpt_block_acts *a, const float *x,
                                  float *dres, const gpt_tensors *p, gpt_tensors *g, const gpt_block_wstash *st)
{
    const int B = k->B, T = k->T, C = k->C, Nc = k->Nc, Nr = k->Nr, Cl = k->Cl, Hl = k->Hl, nt = k->nthreads;
    const int cp = k->cp > 1;
    const size_t NC = (size_t)Nc * C;
    const float *dout = dres, *in;
    float *dln;

    /* MLP half, in reverse. Row-parallel c_proj: g's backward is the identity,
     * its bias gradient is computed (redundantly under tp) from the replicated dres. */
    if (k->moe) {
        /* deferred: the experts' weight gradients wait in the MoE layer (its own stash and
         * activations, moe.h); the router's gradient stays in B, as the LayerNorms' do */
        gpt_moe_params mp = moe_tensors(p), mg = moe_tensors(g);
        if (st) GPT_TRY(gpt_moe_backward_input(k->moe[layer], k->moe_dloss, a->ln2, dres, k->dln, &mp, &mg));
        else GPT_TRY(gpt_moe_backward(k->moe[layer], k->moe_dloss, a->ln2, dres, k->dln, &mp, &mg));
        dln = k->dln;
    } else {
        if (k->seq) GPT_TRY(seq_op(k, 1, dres, k->sp_full, "d of the MLP output (backward)", layer));
        dout = k->seq ? k->sp_full : dres;
        gpt_matmul_backward_input(k->math, k->dfch, dout, p->t[GPT_FCPROJ_W], Nc, Hl, C, 0);
        if (st) memcpy(st->dout_fcproj, dout, sizeof(float) * NC);
        else
            gpt_matmul_backward_weight(k->math, g->t[GPT_FCPROJ_W], g->t[GPT_FCPROJ_B], dout, a->fch_gelu, Nc, Hl, C,
                                       k->partials, nt);
        float *dfch = st ? st->dfch : k->dfch; /* GELU's backward writes where W will read it */
        gpt_gelu_backward(dfch, a->fch, k->dfch, (size_t)Nc * Hl);
        gpt_matmul_backward_input(k->math, k->dln, dfch, p->t[GPT_FC_W], Nc, C, Hl, 0);
        if (!st) {
            GPT_TRY(column_input(k, a->ln2, &in, "ln_2's output (backward)", layer));
            gpt_matmul_backward_weight(k->math, g->t[GPT_FC_W], g->t[GPT_FC_B], dfch, in, Nc, C, Hl, k->partials, nt);
        }
        GPT_TRY(ln_grad(k, k->dln, &dln, "d ln_2 (backward)", layer)); /* f's backward */
    }
    /* the residual path keeps dres; ln_2 adds its share: dres = d res2 */
    gpt_layernorm_backward(dres, g->t[GPT_LN2_W], g->t[GPT_LN2_B], dln, a->res2, p->t[GPT_LN2_W], a->ln2_mean,
                           a->ln2_rstd, Nr, C, k->partials, nt);

    /* attention half, in reverse */
    if (k->seq) GPT_TRY(seq_op(k, 1, dres, k->sp_full, "d of the attention output (backward)", layer));
    dout = k->seq ? k->sp_full : dres;
    gpt_matmul_backward_input(k->math, k->dln, dout, p->t[GPT_ATTPROJ_W], Nc, Cl, C, 0);
    if (st) memcpy(st->dout_attproj, dout, sizeof(float) * NC);
    else
        gpt_matmul_backward_weight(k->math, g->t[GPT_ATTPROJ_W], g->t[GPT_ATTPROJ_B], dout, a->atty, Nc, Cl, C,
                                   k->partials, nt);
    float *dqkv = st ? st->dqkv : k->dqkv;
    if (cp) {
        GPT_TRY(cp_exchange(k, 1, 1, k->dln, k->cp_heads, "d of the attention output to heads (backward)", layer));
        gpt_attention_backward(k->math, k->cp_recv, k->cp_heads, a->att, a->qkv, B, T, k->Ca, k->NHl, k->att_scratch,
                               nt);
        GPT_TRY(cp_exchange(k, 3, 0, k->cp_recv, dqkv, "d qkv to sequence (backward)", layer));
    } else {
        gpt_attention_backward(k->math, dqkv, k->dln, a->att, a->qkv, B, T, Cl, k->NHl, k->att_scratch, nt);
    }
    gpt_matmul_backward_input(k->math, k->dln, dqkv, p->t[GPT_QKV_W], Nc, C, 3 * Cl, 0);
    if (!st) {
        GPT_TRY(column_input(k, a->ln1, &in, "ln_1's output (backward)", layer));
        gpt_matmul_backward_weight(k->math, g->t[GPT_QKV_W], g->t[GPT_QKV_B], dqkv, in, Nc, C, 3 * Cl, k->partials,
                                   nt);
    }
    GPT_TRY(ln_grad(k, k->dln, &dln, "d ln_1 (backward)", layer));
    gpt_layernorm_backward(dres, g->t[GPT_LN1_W], g->t[GPT_LN1_B], dln, x, p->t[GPT_LN1_W], a->ln1_mean,
                           a->ln1_rstd, Nr, C, k->partials, nt);
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

zero_status gpt_block_backward_weight(const gpt_block_ctx *k, int layer, const gpt_block_acts *a,
                                      const gpt_block_wstash *st, gpt_tensors *g)
{
    const int N = k->Nc, C = k->C, Cl = k->Cl, Hl = k->Hl, nt = k->nthreads;
    /* the order of the inline backward (it does not matter for the bits:
     * each tensor gets one += per call) */
    if (k->moe) {
        gpt_moe_params mg = moe_tensors(g);
        GPT_TRY(gpt_moe_backward_weight(k->moe[layer], &mg));
    } else {
        gpt_matmul_backward_weight(k->math, g->t[GPT_FCPROJ_W], g->t[GPT_FCPROJ_B], st->dout_fcproj, a->fch_gelu, N,
                                   Hl, C, k->partials, nt);
        gpt_matmul_backward_weight(k->math, g->t[GPT_FC_W], g->t[GPT_FC_B], st->dfch, a->ln2, N, C, Hl, k->partials,
                                   nt);
    }
    gpt_matmul_backward_weight(k->math, g->t[GPT_ATTPROJ_W], g->t[GPT_ATTPROJ_B], st->dout_attproj, a->atty, N, Cl,
                               C, k->partials, nt);
    gpt_matmul_backward_weight(k->math, g->t[GPT_QKV_W], g->t[GPT_QKV_B], st->dqkv, a->ln1, N, C, 3 * Cl,
                               k->partials, nt);
    return ZERO_OK;
}
