/* The minimal GPT: a GPT-2-style decoder whose parameters live elsewhere.
 *
 * Shape: token + position embeddings, n_layer pre-LayerNorm blocks (causal
 * multi-head self-attention with one fused qkv projection and an output
 * projection; an MLP of width 4*d_model with GELU in its tanh approximation,
 * as GPT-2), a final LayerNorm, an LM head TIED to the token embedding, and
 * softmax cross-entropy averaged over the tokens that have a target.
 * Every linear layer and LayerNorm has a bias, as GPT-2. LayerNorm eps 1e-5.
 *
 * Ownership. The model owns no parameter: it DESCRIBES its parameter list
 * (gpt_param_info: name, shape, module, initialisation) so a trainer can
 * register each tensor with the libzero engine, and every forward/backward
 * call takes the pointers of one module's tensors (gpt_tensors). Modules are
 *     0            "embed"    wte (vocab x d_model), wpe (seq_len x d_model)
 *     1 + i        "block.i"  the 12 tensors of transformer block i
 *     n_layer + 1  "final"    ln_f weight and bias
 * Forward runs module by module and backward in reverse, so a ZeRO stage-3
 * trainer gathers one module at a time:
 *
 *     gpt_forward_begin(ws, tokens, targets, &embed)           module 0
 *     for i in 0..n_layer-1: gpt_forward_block(ws, i, &block[i])  module 1+i
 *     gpt_forward_end(ws, &final, &embed, &loss)               final + embed (tied head)
 *     gpt_backward_end(ws, 1.0f, &final, &dfinal, &embed, &dembed)
 *     for i in n_layer-1..0: gpt_backward_block(ws, i, &block[i], &dblock[i])
 *     gpt_backward_begin(ws, &dembed)                          embeddings
 *
 * The TIED weight: wte is read by the embedding (first) and by the LM head
 * (last). The embed module's parameters must therefore be available at both
 * ends of the forward and the backward, and its gradient buffer receives the
 * head's contribution in gpt_backward_end and the embedding's in
 * gpt_backward_begin: its gradients are complete (ready to reduce) only after
 * gpt_backward_begin. A stage-3 trainer should keep the embed module
 * persistent or gather it twice.
 *
 * Layouts (all row-major fp32): a linear layer's weight is (out, in) like
 * torch.nn.Linear, so y = x W^T + b. The fused qkv output is [q | k | v],
 * each d_model wide, head h taking columns h*hs .. h*hs+hs-1 of each.
 * Gradients are ACCUMULATED (+=) into the grad buffers; the caller zeroes
 * them (the engine does) before the first micro-batch.
 *
 * Errors: every call returns a zero_status; the message is in
 * gpt_last_error() (per thread). Nothing here prints or exits.
 *
 * Threads: everything runs on OpenMP threads (OMP_NUM_THREADS); each
 * matmul is split over them into single-threaded GEMMs (model/gpt_gemm.h:
 * packed AVX-512 kernels where the CPU has them, else OpenBLAS), and
 * gpt_workspace_create calls openblas_set_num_threads(1), process-wide, so
 * OpenBLAS threads do not compete with the OpenMP ones. The kernel is chosen
 * once per process (ZERO_CPU_GEMM, see gpt_gemm.h); an invalid
 * ZERO_CPU_GEMM makes workspace creation fail with ZERO_CONFIG. */
#ifndef ZERO_MODEL_GPT_H
#define ZERO_MODEL_GPT_H

#include <stddef.h>
#include <stdint.h>
#include <zero/comm.h>
#include <zero/engine.h>
#include <zero/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ config */
typedef struct gpt_config {
    int n_layer;
    int n_head;
    int d_model;  /* a multiple of n_head */
    int seq_len;  /* the longest sequence (rows of wpe) */
    int vocab;    /* 256 for the byte-level tokenizer */
    /* Mixture of experts (moe.h; 0 experts: the dense MLP). Every block's
     * MLP becomes moe_experts experts of width 4 d_model behind a top-k
     * softmax router, capacity moe_capacity_factor, the auxiliary
     * load-balancing loss weighted by moe_aux_loss_coef and added to the
     * loss; a rank holds moe_experts / moe_ep of them (expert parallelism
     * over an ep comm given to the workspace; 0 or 1: all). CPU
     * (gpt_workspace_create_moe) and CUDA (gpt_cuda_workspace_create_moe). */
    int moe_experts;
    int moe_top_k;
    float moe_capacity_factor;
    float moe_aux_loss_coef;
    int moe_ep;
} gpt_config;

#define GPT_CONFIG_INIT {4, 4, 256, 128, 256}

/* ZERO_CONFIG with a message naming the field when a size is out of range
 * or d_model is not a multiple of n_head. */
zero_status gpt_config_validate(const gpt_config *cfg);

/* The detailed message of the last failing gpt_* call on this thread, "" if none. */
const char *gpt_last_error(void);

/* Empties this thread's message: a caller that reports gpt_last_error() after a
 * call that may fail in either layer clears it first, so an older message is
 * never shown as this call's. */
void gpt_clear_error(void);

/* ------------------------------------------------------------ modules and parameters */
#define GPT_MODULE_EMBED 0
static inline int gpt_module_block(int layer) { return 1 + layer; }
static inline int gpt_module_final(const gpt_config *cfg) { return cfg->n_layer + 1; }
static inline int gpt_num_modules(const gpt_config *cfg) { return cfg->n_layer + 2; }

/* Tensor indices inside each module (the order of gpt_tensors.t[]). */
enum { GPT_WTE = 0, GPT_WPE = 1, GPT_EMBED_NT = 2 };
enum {
    GPT_LN1_W = 0, GPT_LN1_B, GPT_QKV_W, GPT_QKV_B, GPT_ATTPROJ_W, GPT_ATTPROJ_B,
    GPT_LN2_W, GPT_LN2_B, GPT_FC_W, GPT_FC_B, GPT_FCPROJ_W, GPT_FCPROJ_B, GPT_BLOCK_NT
};
enum { GPT_LNF_W = 0, GPT_LNF_B = 1, GPT_FINAL_NT = 2 };
/* An MoE block (cfg->moe_experts > 0): GPT_FC_W .. GPT_FCPROJ_B hold this
 * rank's experts stacked (El = moe_experts / moe_ep of them: El*4C x C,
 * El*4C, El*C x 4C, El*C, the layouts of moe.h), and a 13th tensor is the
 * router (moe_experts x C, replicated on every rank). */
enum { GPT_MOE_GATE_W = GPT_BLOCK_NT, GPT_MOE_BLOCK_NT };
#define GPT_MAX_MODULE_TENSORS 13

/* The pointers of one module's tensors (parameters, or their gradients),
 * indexed by the enums above. Const-ness is by call: forward never writes
 * parameters; backward only accumulates into gradient sets. The elements are
 * fp32 on the CPU path; the CUDA path also takes bf16 (gpt_cuda.h). `void *`
 * so an engine's zero_engine_param_data() pointer goes in as it comes. */
typedef struct gpt_tensors {
    void *t[GPT_MAX_MODULE_TENSORS];
} gpt_tensors;

typedef enum gpt_init_kind {
    GPT_INIT_ZEROS = 0,   /* biases */
    GPT_INIT_ONES = 1,    /* LayerNorm weights */
    GPT_INIT_NORMAL = 2,  /* N(0, init_std^2) */
} gpt_init_kind;

typedef struct gpt_param_info {
    char name[48];       /* "h.0.attn.c_attn.weight": GPT-2 names, nn.Linear layout */
    int module;          /* 0 embed, 1+i block i, n_layer+1 final */
    int index;           /* index in that module's gpt_tensors */
    int ndim;            /* 1 or 2 */
    size_t shape[2];     /* shape[1] is 1 for vectors */
    size_t numel;
    gpt_init_kind init;
    float init_std;      /* GPT-2: 0.02, and 0.02/sqrt(2*n_layer) for the two residual projections */
    int expert_stack;    /* 1: this rank's slice of a stack of moe_experts experts (elements
                            [ep_rank * numel, (ep_rank + 1) * numel) of the named tensor) */
} gpt_param_info;

/* Number of parameter tensors: 2 + 12*n_layer + 2 (13 per block with MoE), listed module by module. */
size_t gpt_num_params(const gpt_config *cfg);
/* Total number of parameter elements (the tied head counted once). */
size_t gpt_param_elements(const gpt_config *cfg);
/* Number of tensors in module m (2, 12 or 2). */
int gpt_module_num_tensors(const gpt_config *cfg, int module);
/* Number of parameter elements in module m (this rank's expert slice for MoE stacks). */
size_t gpt_module_elements(const gpt_config *cfg, int module);
/* "embed", "block.3", "final" into buf; returns buf. */
const char *gpt_module_name(const gpt_config *cfg, int module, char *buf, size_t size);
/* Information on parameter i (0 <= i < gpt_num_params). */
zero_status gpt_param_info_get(const gpt_config *cfg, size_t i, gpt_param_info *out);
/* The position of (module, index) in the parameter list. */
size_t gpt_param_position(const gpt_config *cfg, int module, int index);
/* The parameter's GPT-2 initialisation as a libzero init spec (engine.h):
 * normal(0, init_std) with `seed`, ones (LayerNorm weights) or zeros (biases,
 * LayerNorm biases). Values depend only on (seed, parameter name, element),
 * so every rank, stage, dp size and tensor-parallel layout get the same
 * model; register it with zero_engine_add_param_init. */
zero_init_spec gpt_param_init_spec(const gpt_param_info *info, uint64_t seed);
/* Fill `out` (info->numel floats) with those values, the whole tensor
 * (zero_init_generate of the spec): for references and tests. */
void gpt_param_init(const gpt_config *cfg, const gpt_param_info *info, uint64_t seed, float *out);
/* The same for expert-parallel rank `ep_rank`: an expert stack's slice of
 * the whole stack's values (every ep size gets the same experts). */
void gpt_param_init_ep(const gpt_param_info *info, uint64_t seed, int ep_rank, float *out);

/* Training FLOPs per token of one forward+backward at sequence length T:
 * 6 * (matmul parameters incl. the head) + 12 * n_layer * T * d_model for
 * attention scores and values (the PaLM convention: no causal discount). */
double gpt_train_flops_per_token(const gpt_config *cfg, int seq);

/* ------------------------------------------------------------ activation checkpointing
 * Per-block recomputation: a recomputed block keeps only its input (the
 * residual stream, which every block keeps anyway) during forward; its
 * backward first recomputes its forward from that input into ONE block
 * workspace that all recomputed blocks share. The same kernels run on the
 * same inputs in the same order, so on the CPU the gradients are BITWISE
 * those without checkpointing; the cost is one more forward of each
 * recomputed block (less its last matmul, whose output is already kept).
 * Blocks 0 .. blocks-1 are recomputed: the first ones, so on a pipeline
 * the first stage, which holds the most micro-batches in flight, saves most. */
typedef struct gpt_checkpointing {
    int blocks;      /* recompute blocks 0 .. blocks-1 (more than n_layer: all); 0: none */
    int cpu_offload; /* CUDA: keep the recomputed blocks' inputs in pinned host memory (DeepSpeed's
                      * cpu_checkpointing). The CPU path's activations are host memory already: no effect. */
    int partition;   /* tensor parallelism (tp_gpt.h): keep each recomputed block's input as this rank's
                      * 1/tp slice, all-gathered before its recomputation (DeepSpeed's
                      * partition_activations). Without a tp group: no effect. */
} gpt_checkpointing;

#define GPT_CHECKPOINT_ALL (1 << 30) /* gpt_checkpointing.blocks: every block */

/* The bytes of an activation workspace by kind (every buffer rounded up to
 * 64 bytes on the CPU, 256 on CUDA; docs/model.md has the formula). */
typedef struct gpt_activation_bytes {
    size_t inputs;    /* the residual stream: each block's input and the last block's output */
    size_t blocks;    /* the full activations of the blocks NOT recomputed */
    size_t recompute; /* the one block workspace the recomputed blocks share (0 without checkpointing) */
    size_t head;      /* token ids, targets, ln_f, logits, log-sum-exp */
    size_t scratch;   /* backward scratch (and the CUDA path's attention buffers) */
    size_t host;      /* CUDA cpu_offload: the recomputed blocks' inputs in pinned host memory */
    size_t total;     /* everything but `host`: the workspace's one allocation, plus `moe` */
    size_t moe;       /* MoE models: the blocks' MoE layers' own buffers (n_layer x gpt_moe_bytes_for,
                       * allocated by the layers; docs/moe.md), device memory on CUDA; else 0 */
} gpt_activation_bytes;

/* ------------------------------------------------------------ CPU workspace
 * The activations kept for backward and the backward scratch, for one
 * micro-batch shape (batch x seq, seq <= cfg->seq_len). Not thread-safe:
 * one workspace per concurrent model instance. */
typedef struct gpt_workspace gpt_workspace;

zero_status gpt_workspace_create(gpt_workspace **out, const gpt_config *cfg, int batch, int seq);
/* The same with activation checkpointing (`ck` NULL: none). */
zero_status gpt_workspace_create_ckpt(gpt_workspace **out, const gpt_config *cfg, int batch, int seq,
                                      const gpt_checkpointing *ck);
/* The same for an MoE model with expert parallelism over `ep` (a comm of
 * cfg->moe_ep ranks, borrowed; NULL when moe_ep <= 1). Each MoE block keeps
 * its routing and expert activations in its layer (moe.h), counted in the
 * activation report's `moe` (and total); a recomputed block does not redo its MoE (or its
 * exchanges): only the attention half and ln_2 are recomputed. */
zero_status gpt_workspace_create_moe(gpt_workspace **out, const gpt_config *cfg, int batch, int seq,
                                     const gpt_checkpointing *ck, zero_comm *ep);
/* The auxiliary losses of the last forward, summed over the blocks
 * (unweighted; the loss gpt_forward_end returns adds moe_aux_loss_coef x this). */
float gpt_workspace_moe_aux(const gpt_workspace *ws);
/* The MoE layer of block `layer` (moe.h; owned by ws), for tests and
 * reports (gpt_moe_get_routing: the last forward's routing); NULL for a
 * dense model or a layer out of range. */
struct gpt_moe;
struct gpt_moe *gpt_workspace_moe_layer(const gpt_workspace *ws, int layer);
void gpt_workspace_destroy(gpt_workspace *ws); /* NULL accepted */
/* Bytes of the workspace's activation allocation (activations + scratch). */
size_t gpt_workspace_bytes(const gpt_workspace *ws);
/* The same by kind. */
void gpt_workspace_activation_bytes(const gpt_workspace *ws, gpt_activation_bytes *out);
/* Bytes a workspace for this shape would hold, without allocating. */
size_t gpt_workspace_bytes_for(const gpt_config *cfg, int batch, int seq);
/* By kind, with checkpointing `ck` (NULL: none), without allocating; the
 * thread count is this thread's OpenMP maximum, as at creation. */
zero_status gpt_activation_bytes_for(const gpt_config *cfg, int batch, int seq, const gpt_checkpointing *ck,
                                     gpt_activation_bytes *out);
/* The logits (batch, seq, vocab) of the last gpt_forward_end; owned by ws. */
const float *gpt_workspace_logits(const gpt_workspace *ws);
/* The precision of the matmuls' products: ZERO_F32 (the default) or
 * ZERO_BF16 (operands rounded to bf16, sums in fp32, where the CPU has a
 * bf16 dot product: avx512_bf16; elsewhere the same as ZERO_F32). Everything
 * else stays fp32. ZERO_INVALID_ARGUMENT for any other dtype. */
zero_status gpt_workspace_set_matmul_dtype(gpt_workspace *ws, zero_dtype dtype);

/* ------------------------------------------------------------ CPU forward
 * tokens: batch*seq ids in [0, vocab). targets: the same shape, or NULL for
 * no loss; a negative target is ignored (no loss, no gradient). Both are
 * copied. The loss is the mean over tokens with a target (0 if none). */
zero_status gpt_forward_begin(gpt_workspace *ws, const int32_t *tokens, const int32_t *targets,
                              const gpt_tensors *embed);
zero_status gpt_forward_block(gpt_workspace *ws, int layer, const gpt_tensors *block);
/* Final LayerNorm, the tied head (embed->t[GPT_WTE]) and the loss; `loss`
 * may be NULL. Needs targets for a later backward. With MoE the loss is the
 * cross-entropy plus moe_aux_loss_coef x the blocks' auxiliary losses. */
zero_status gpt_forward_end(gpt_workspace *ws, const gpt_tensors *final_params,
                            const gpt_tensors *embed, float *loss);

/* ------------------------------------------------------------ CPU backward
 * Gradients of dloss * loss (dloss = 1 for the plain mean; 1/accum_steps for
 * gradient accumulation; a loss scale for fp16), accumulated into the grads. */
zero_status gpt_backward_end(gpt_workspace *ws, float dloss, const gpt_tensors *final_params,
                             gpt_tensors *final_grads, const gpt_tensors *embed, gpt_tensors *embed_grads);
zero_status gpt_backward_block(gpt_workspace *ws, int layer, const gpt_tensors *block,
                               gpt_tensors *block_grads);
zero_status gpt_backward_begin(gpt_workspace *ws, gpt_tensors *embed_grads);

/* Whole passes for callers holding every module (stages 0-2, tests):
 * `params` and `grads` are arrays of gpt_num_modules(cfg) sets. */
zero_status gpt_forward(gpt_workspace *ws, const int32_t *tokens, const int32_t *targets,
                        const gpt_tensors *params, float *loss);
zero_status gpt_backward(gpt_workspace *ws, float dloss, const gpt_tensors *params, gpt_tensors *grads);

#ifdef __cplusplus
}
#endif

#endif
