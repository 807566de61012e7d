/* Internal: THE activation layout of the GPT, one description serving the
 * CPU path (gpt_cpu.c), the tensor/pipeline stage runtime (tp_gpt.c) and the
 * CUDA path (gpt_cuda.cu). Each path adds only its own kernels' scratch
 * (gpt_carve, after gpt_acts_layout) to the workspace this lays out.
 *
 * What a workspace holds, per micro-batch slot (pipelines keep several):
 *   - the token ids and targets;
 *   - the RESIDUAL STREAM at every block boundary: resid[i] is the input of
 *     block begin+i and resid[layers] the output of the range (ln_f's input,
 *     or what a pipeline stage sends on). Kept for every block, always;
 *   - a full set of block activations (gpt_block_acts) for each block that
 *     is NOT recomputed;
 *   - the head's activations (ln_f, logits, log-sum-exp) on the last stage.
 * Shared by the slots: ONE block set that every recomputed block uses (its
 * forward writes there and throws it away; its backward recomputes it there
 * from resid[i] first), and the backward scratch (one backward at a time).
 *
 * Activation checkpointing: block l is recomputed iff l < recompute_below
 * (the first blocks of the model; on a pipeline, those the first stage holds,
 * where the most micro-batches are in flight). The input of a recomputed
 * block may be KEPT COMPACT, elsewhere than resid[]: in a second, host region
 * (offload: CUDA's cpu_checkpointing), and/or as this rank's 1/partition
 * slice of it (DeepSpeed's partition_activations over the tp group, which
 * all hold the same residual stream). Then two full staging buffers stand
 * in for those resid[] entries (block i reads stage[i % 2] and writes
 * stage[(i + 1) % 2]): the path stores the compact copy when block i starts
 * forward and restores stage[i % 2] from it before block i's recomputation.
 *
 * Every buffer starts at a multiple of `align` bytes and takes its size
 * rounded up to it, so a region's size is the sum of r(size) over its
 * buffers; docs/model.md writes the sum out. */
#ifndef ZERO_MODEL_GPT_ACTS_H
#define ZERO_MODEL_GPT_ACTS_H

#include <stddef.h>
#include <stdint.h>

#include "gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One block's activations kept for its backward. Cl = C/tp channels and
 * Hl = 4C/tp MLP units of the column-parallel matmuls; rows (gpt_acts_rows):
 * Nc = B*T/cp rows through the matmuls (this rank's sequence slice under
 * context parallelism, else all B*T), Nr <= Nc rows of the residual stream
 * (Nc/tp under sequence parallelism: the LayerNorm / residual regions).
 * Attention runs on full sequences of the NHa = n_head/(tp*cp) heads of
 * this rank, Ca = C/(tp*cp) channels (Ulysses: the all-to-all turns Nc rows
 * of all Cl channels into B*T rows of Ca). The block's output is not here:
 * it is the next resid[]. Without sp/cp: Nr = Nc = B*T, Ca = Cl. */
typedef struct gpt_block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* Nr x C, Nr, Nr */
    float *qkv;                       /* B*T x 3Ca: [q | k | v] of the attention heads (Nc x 3Cl floats) */
    float *att;                       /* B x NHa x T x T softmax probabilities (NULL with flash) */
    float *att_lse;                   /* flash attention: B x NHa x T log-sum-exp per query row, else NULL */
    float *atty;                      /* Nc x Cl attention output before the projection (sequence rows) */
    float *res2;                      /* Nr x C residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;            /* Nc x Hl before and after GELU (MoE: see gpt_acts_shape.moe) */
} gpt_block_acts;

typedef struct gpt_acts_shape {
    int B, T, C, n_head, vocab;
    int tp_size;         /* heads and MLP units split over tp (1: none) */
    int layer_begin, layer_end;
    int slots;           /* micro-batches in flight */
    int head;            /* 1: this workspace runs ln_f and the tied head */
    int recompute_below; /* blocks l < recompute_below are recomputed (0: none) */
    int offload;         /* inputs of recomputed blocks kept in the host region */
    int partition;       /* > 1: inputs of recomputed blocks kept as 1/partition slices (tp) */
    size_t align;        /* 64 (CPU cache lines), 256 (CUDA) */
    int seq_parallel;    /* 1: Megatron sequence parallelism, the residual stream split over tp */
    int cp_size;         /* Ulysses context parallelism: T split over cp ranks (0 or 1: none) */
    int flash;           /* 1: fused attention: att_lse (B NHl T floats) in place of att (B NHl T^2) */
    int act_elem;        /* bytes per element of the matmul-facing buffers (ln1, qkv, atty, ln2, fch,
                          * fch_gelu, lnf and the scratch dln, dqkv, dfch, dlogits): 4 (fp32; 0 means 4)
                          * or 2 (CUDA bf16 activations: the float pointers then address bf16) */
    int moe;             /* 1: every block's MLP is an MoE layer (moe.h), which holds its own buffers:
                          * no fch_gelu, and fch and the scratch dfch only where the layer needs an fp32
                          * copy of its input and of its input gradient (act_elem 2: Nr x C floats
                          * each), else NULL */
} gpt_acts_shape;

/* Rows of a shape (see gpt_block_acts): through the matmuls, and of the
 * residual stream this rank holds. */
static inline void gpt_acts_rows(const gpt_acts_shape *s, size_t *Nc, size_t *Nr)
{
    size_t nc = (size_t)s->B * (size_t)s->T / (size_t)(s->cp_size > 1 ? s->cp_size : 1);
    *Nc = nc;
    *Nr = s->seq_parallel ? nc / (size_t)s->tp_size : nc;
}

/* Byte categories of a layout (gpt_activation_bytes' fields). */
enum { GPT_ACT_INPUTS, GPT_ACT_BLOCKS, GPT_ACT_RECOMPUTE, GPT_ACT_HEAD, GPT_ACT_SCRATCH, GPT_ACT_HOST,
       GPT_ACT_NCAT };

/* A cursor over the two regions (0 main: host memory on the CPU, device
 * memory on CUDA; 1 host, for offload). Counting only when base[r] is NULL. */
typedef struct gpt_carver {
    size_t align;
    size_t off[2];
    char *base[2];
    size_t bytes[GPT_ACT_NCAT];
} gpt_carver;

void gpt_carver_init(gpt_carver *c, size_t align, void *main_base, void *host_base);
/* `count` elements of `elem` bytes in category `cat` (GPT_ACT_HOST: the
 * host region); NULL while counting. */
void *gpt_carve(gpt_carver *c, int cat, size_t count, size_t elem);
/* The report of what was carved (total = the main region). */
void gpt_carver_report(const gpt_carver *c, gpt_activation_bytes *out);

typedef struct gpt_acts_slot {
    int32_t *tokens, *targets;
    float **resid;          /* layers + 1 (see above); for an offloaded input, a staging buffer */
    float **kept;           /* layers + 1: the compact copy of a recomputed block's input, else NULL */
    gpt_block_acts **block; /* layers: the set block begin+i uses (its own, or the shared recompute set) */
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *lse; /* head only */
} gpt_acts_slot;

typedef struct gpt_acts {
    gpt_acts_shape shape;
    int layers;               /* layer_end - layer_begin */
    gpt_acts_slot *slots;
    gpt_block_acts *sets;     /* the stored sets (slots x not-recomputed blocks), then the recompute set */
    gpt_block_acts *recompute;/* the shared set, NULL when no block of the range is recomputed */
    size_t kept_count;        /* floats in each kept[] buffer: N*C, or ceil(N*C / partition) */
    void *tables;             /* one allocation behind slots, sets and the pointer arrays */
    /* backward scratch common to every path */
    float *dres;              /* Nr x C: gradient of the residual stream */
    float *dln;               /* Nc x C */
    float *dqkv;              /* Nc x 3Cl */
    float *dfch;              /* Nc x Hl */
    float *dlogits;           /* Nr x V, head only */
    /* sequence parallelism: one Nc x C buffer for what is all-gathered
     * (LayerNorm outputs, residual gradients) or reduce-scattered (the
     * row-parallel partial products, LayerNorm input gradients); NULL without */
    float *sp_full;
    /* context parallelism: the all-to-all's packed send buffer and landing
     * buffer (Nc x 3Cl each), and the head-sharded attention output / its
     * gradient (Nc x Cl floats); NULL without */
    float *cp_send, *cp_recv, *cp_heads;
} gpt_acts;

/* 1 when block `layer` of this shape is recomputed in backward. */
static inline int gpt_acts_recomputed(const gpt_acts_shape *s, int layer) { return layer < s->recompute_below; }

/* Allocate the pointer tables of `a` for `shape` (host memory); ZERO_OUT_OF_MEMORY. */
zero_status gpt_acts_init(gpt_acts *a, const gpt_acts_shape *shape);
void gpt_acts_free(gpt_acts *a); /* the tables only; zeroed struct accepted */
/* Carve the common layout through `c`, filling the pointers of `a` (which
 * may be NULL while counting). Each path carves its own scratch after. */
void gpt_acts_layout(gpt_acts *a, const gpt_acts_shape *shape, gpt_carver *c);

/* blocks [begin, end) of the model recomputed under `ck` (NULL: none) */
int gpt_checkpointing_below(const gpt_config *cfg, const gpt_checkpointing *ck);
/* ZERO_CONFIG naming the field when `ck` is out of range. */
zero_status gpt_checkpointing_validate(const gpt_checkpointing *ck, const char *op);

#ifdef __cplusplus
}
#endif

#endif
