/* Internal: one transformer block's forward, recomputation and backward on
 * the CPU, shared by the single-rank model (gpt_cpu.c) and the tensor /
 * pipeline stage runtime (tp_gpt.c), so both run the same kernels in the same
 * order (which is what makes tp 1 bitwise equal to gpt_cpu.c, and a
 * recomputed block bitwise equal to a stored one). */
#ifndef ZERO_MODEL_GPT_BLOCK_H
#define ZERO_MODEL_GPT_BLOCK_H

#include "gpt_acts.h"
#include "gpt_gemm.h"
#include "moe.h"

/* Megatron's all-reduce over the tp group (g forward, f backward); NULL
 * outside tensor parallelism. `what` names the tensor for messages. */
typedef zero_status (*gpt_block_sum_fn)(void *ctx, float *buf, size_t n, const char *what, int layer);

/* Sequence and context parallelism's exchanges (tp_gpt.c), NULL outside them.
 * seq: Megatron SP over the tp group: all-gather `n` floats of every rank
 * into `full` (gather 1) or reduce-scatter `full` into this rank's `n`
 * (gather 0). heads: Ulysses over the cp group: the all-to-all of `count`
 * floats per peer from `send` (packed by destination) into `recv`. */
typedef zero_status (*gpt_block_seq_fn)(void *ctx, int gather, float *local, float *full, size_t n, const char *what,
                                        int layer);
typedef zero_status (*gpt_block_a2a_fn)(void *ctx, const float *send, float *recv, size_t count, const char *what,
                                        int layer);

typedef struct gpt_block_ctx {
    int B, T, C;          /* full widths */
    int Cl, Hl, NHl;      /* this rank's matmul channels (C/tp), MLP units, attention heads (n_head/(tp*cp)) */
    int Ca;               /* this rank's attention channels: Cl / cp */
    int Nc, Nr;           /* rows through the matmuls and of the residual stream (gpt_acts_rows) */
    int cp;               /* context-parallel ranks (1: none) */
    int lead;             /* adds the residual and the row-parallel biases (tp rank 0; 1 without tp) */
    int nthreads;
    gpt_gemm_math math;   /* the matmuls' precision (GPT_GEMM_BF16: bf16 products, fp32 sums) */
    gpt_block_sum_fn sum;
    void *sum_ctx;        /* also the context of seq and heads */
    gpt_block_seq_fn seq; /* set: sequence parallelism (instead of sum) */
    gpt_block_a2a_fn heads; /* set: context parallelism (cp > 1) */
    float *sp_full, *cp_send, *cp_recv, *cp_heads; /* their buffers (gpt_acts) */
    /* backward scratch (gpt_acts' common part, and the CPU kernels' own) */
    float *dln, *dqkv, *dfch, *partials, *att_scratch;
    /* Mixture of experts: one layer per block (NULL: dense MLPs); each
     * forward stores its block's auxiliary loss in moe_aux[layer]; backward
     * scales the aux gradient by moe_dloss (the loss's dloss). */
    gpt_moe **moe;
    float *moe_aux;
    float moe_dloss;
} gpt_block_ctx;

/* Forward of block `layer` from x into the activations `a`; the output goes
 * to `out`. out == NULL recomputes: everything but the last matmul (and its
 * all-reduce), whose result the caller kept. */
zero_status gpt_block_forward(const gpt_block_ctx *k, int layer, gpt_block_acts *a, const float *x, float *out,
                              const gpt_tensors *p);
/* Backward: dres holds d(output) and becomes d(x); gradients accumulate into g. */
zero_status gpt_block_backward(const gpt_block_ctx *k, int layer, const gpt_block_acts *a, const float *x,
                               float *dres, const gpt_tensors *p, gpt_tensors *g);

/* The backward split for zero-bubble pipelines into B (input gradient) and
 * W (weight gradients), run apart: B is everything of the backward but the
 * weight and bias gradients of the four linear layers (the LayerNorms'
 * parameter gradients come out of their row kernel with the input gradient,
 * so they stay in B); it keeps the upstream gradient of each of those layers
 * in a stash. W computes those gradients from the stash and the block's
 * activations (which must stay until then). B followed by W computes the
 * same bits as gpt_block_backward. An MoE block (k->moe) defers its
 * experts' weight and bias gradients the same way, in its MoE layer (moe.h:
 * gpt_moe_backward_input / _weight; the layer keeps their upstream
 * gradients, so the stash's MLP parts go unused; the router's gradient
 * stays in B); the layer must have its split stash (gpt_moe_split_backward)
 * and see no forward before the W. */
typedef struct gpt_block_wstash {
    float *dout_fcproj;  /* N x C: d(block output), the MLP projection's upstream gradient */
    float *dfch;         /* N x Hl: d(fc output) after GELU's backward */
    float *dout_attproj; /* N x C: d res2, the attention projection's upstream gradient */
    float *dqkv;         /* N x 3Cl */
} gpt_block_wstash;

/* Floats of one block's stash. */
static inline size_t gpt_block_wstash_floats(int N, int C, int Cl, int Hl)
{
    return (size_t)N * (2 * (size_t)C + (size_t)Hl + 3 * (size_t)Cl);
}
zero_status gpt_block_backward_input(const gpt_block_ctx *k, int layer, const gpt_block_acts *a, const float *x,
                                     float *dres, const gpt_tensors *p, gpt_tensors *g, const gpt_block_wstash *st);
zero_status gpt_block_backward_weight(const gpt_block_ctx *k, int layer, const gpt_block_acts *a,
                                      const gpt_block_wstash *st, gpt_tensors *g);

#endif
