/* The GPT on a CUDA GPU: the same math as gpt_cpu.c, with cuBLAS matmuls and
 * one small kernel per other operation. Two activation modes (gpt_cuda.h):
 *  - fp32 activations: cuBLAS gemms with bf16 tensor-core products and fp32
 *    accumulation (or plain fp32 for tests); bias/residual by an init kernel
 *    and beta = 1, GELU and bias gradients by their own kernels;
 *  - bf16 activations: the matmul-facing buffers are bf16 (the layout's
 *    act_elem = 2), the residual stream, logits and LayerNorm statistics
 *    fp32; matmuls through cuBLASLt (gpt_cuda_lt.cu) with bf16 inputs, fp32
 *    compute and fused epilogues: bias, GELU + bias (the pre-activation kept
 *    as the epilogue's aux output), the GELU backward, the bias gradient.
 *    Each epilogue falls back once (per workspace) to the plain matmul and
 *    this file's kernel if cuBLASLt offers no algorithm for it.
 * Attention: the simple kind (scores materialized per (batch, head) by a
 * strided-batched gemm, a causal softmax kernel, a second gemm for the
 * values; fp32 activations only) or the fused flash kernels of
 * gpt_cuda_flash.cu (gpt_flash.h; no T x T buffer).
 *
 * Reductions over rows (bias and LayerNorm weight gradients, embedding
 * gradients) use fp32 atomics, so the CUDA path is not bitwise reproducible
 * run to run; the CPU path is the reference.
 *
 * Tensor parallelism (gpt_cuda_workspace_create_tp): the blocks of one tp
 * rank hold the shards tp_params.c lays out (the CPU tp GPT's: whole heads
 * of c_attn, rows of c_fc, columns of the two projections), so the
 * column-parallel matmuls produce Cl = C/P channels of NHl = n_head/P heads
 * and Hl = 4C/P MLP units, and Megatron's all-reduces of N x C fp32 sums go
 * over the tp comm on device buffers: after each row-parallel projection
 * (forward; tp rank 0 alone adds the residual and the bias) and on the input
 * gradient of each column-parallel one (backward). */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_acts.h"
#include "gpt_cuda.h"
#include "gpt_cuda_common.cuh"
#include "gpt_cuda_flash.cuh"
#include "gpt_cuda_lt.cuh"
#include "gpt_flash.h"
#include "gpt_internal.h"
#include "moe.h"
#include "tp_gpt.h"
#include <zero/zero_cuda.h>

typedef __nv_bfloat16 bf16;

/* ------------------------------------------------------------ errors */
#define CUDA_TRY(call)                                                                              \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess)                                                                      \
            return gpt_fail(ZERO_BACKEND, "gpt cuda: %s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), \
                            __FILE__, __LINE__);                                                   \
    } while (0)

/* After a kernel launch: a bad configuration shows up here, not at the launch. */
#define LAUNCH_CHECK(name) CUDA_TRY(cudaGetLastError())

static inline unsigned blocks_for(size_t n, unsigned threads) { return gpt_cuda_blocks(n, threads); }

/* ------------------------------------------------------------ workspace */
/* A slot's place in the forward/backward sequence while another is selected. */
struct gpt_cuda_slot_state {
    int phase, next_layer, has_targets;
    long valid;
};

struct gpt_cuda_workspace {
    gpt_config cfg;
    int B, T;
    zero_dtype param_dtype;
    gpt_cuda_math math;
    gpt_cuda_options opts;
    int act_bf16;                   /* bf16 activations (opts.act_dtype) */
    int flash;                      /* flash attention */
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;            /* bf16 activations: the epilogue matmuls */
    void *lt_ws;                    /* its workspace, LT_WS_BYTES (outside the activation bytes) */
    int no_gelu_epi, no_dgelu_epi, no_bgrad_epi; /* fallbacks taken (cuBLASLt had no algorithm) */
    gpt_activation_bytes bytes;
    void *mem;       /* one device allocation, carved */
    void *host_mem;  /* pinned: the offloaded inputs of recomputed blocks (cpu_offload), else NULL */

    gpt_acts acts;                  /* the layout (gpt_acts.h); device pointers */
    gpt_acts_slot *io;              /* = &acts.slots[slot] */
    /* A pipeline stage's workspace (gpt_cuda_workspace_create_stage) holds
     * blocks [lb, le) and `slots` activation sets in ONE workspace: the
     * slots share the scratch (attention buffers, bf16 staging, the cuBLAS
     * handles, cuBLASLt's 32 MiB), and only the activations multiply. The
     * selected slot's state is in the fields below (phase .. valid); the
     * others' wait in `saved` (gpt_cuda_workspace_select_slot). Whole-model
     * workspaces: [0, n_layer), one slot. */
    int lb, le, slots, slot;
    struct gpt_cuda_slot_state *saved;
    /* tensor parallelism (1 / rank 0 / NULL without): the comm, its size and
     * this rank, the local widths; tp_on_stream: the comm's ops are ordered
     * on this workspace's stream (zero_comm_set_stream), else the host waits
     * for the stream before each all-reduce. tp_dx: bf16 activations at P > 1,
     * the column-parallel layers' input gradient in fp32 (N x C), summed in fp32 */
    zero_comm *tp;
    int P, tp_rank, Cl, NHl, Hl, tp_on_stream;
    float *tp_dx;
    int32_t *host_targets;          /* host copy, for the valid count */
    float *host_losses;             /* host, N */
    int has_targets;
    long valid;

    /* this path's own scratch */
    float *losses;                  /* N per-token losses */
    float *q, *k, *v, *y;           /* N x C each, per-head layout (B, NH, T, hs) */
    float *dq, *dk, *dv, *dy, *datt;
    float *D;                       /* flash: B x NH x T row dots of the backward */
    bf16 *dres16;                   /* bf16 activations: dres as a matmul input (N x C) */
    float *bgrad;                   /* bf16 activations: the bias-gradient epilogue's output (4C) */
    /* fp32 staging of bf16 modules: the embed module and one other module */
    float *embed_p, *embed_g, *module_p, *module_g;
    /* bf16 activations with fp32 parameters: bf16 copies for the matmuls */
    bf16 *embed_p16, *module_p16;

    int phase;       /* as gpt_cpu.c: 0 idle, 1 forward, 2 forward done, 3 backward */
    int next_layer;

    /* split backward (gpt_cuda_workspace_split_backward): per slot and block
     * of the range, the four linear layers' upstream gradients B kept for W,
     * in the activation type (fp32, or bf16: what the weight gemm reads);
     * its own cudaMalloc */
    char *wstash;
    unsigned char *w_due;  /* host, slots x n_layer: B ran, W not yet */

    /* MoE blocks (cfg.moe_experts > 0): each block's MLP is a CUDA MoE layer
     * (moe.h, gpt_moe_create_cuda) on this stream, over the ep comm */
    gpt_moe **moe;         /* n_layer layers, NULL: dense (the selected slot's row of moe_all) */
    float *moe_aux;        /* host, n_layer: each block's aux loss of the last forward (moe_aux_all's row) */
    /* a stage's slots: one MoE layer per slot and block of the range (each
     * layer keeps one micro-batch's routing and expert activations for its
     * backward), slots x n_layer; select_slot points moe / moe_aux at a row */
    gpt_moe **moe_all;
    float *moe_aux_all;
    float moe_dloss;       /* the backward's dloss: the aux losses' gradient scale */
};

/* Index of (selected slot, block `layer`) in w_due, and its stash. */
static size_t w_index(const gpt_cuda_workspace *ws, int layer) { return (size_t)ws->slot * ws->cfg.n_layer + layer; }
static size_t wstash_floats(const gpt_cuda_workspace *ws);
static size_t act_size(const gpt_cuda_workspace *ws) { return ws->act_bf16 ? sizeof(bf16) : sizeof(float); }
/* The parts of a block's stash, in its order (wstash_floats). */
enum { WST_FCPROJ, WST_FC, WST_ATTPROJ, WST_QKV };
/* Part `part` of block `layer`'s stash, selected slot: the parts before it
 * at this tp rank's widths (N x C, N x Hl, N x C, then N x 3Cl). */
static void *wstash_of(const gpt_cuda_workspace *ws, int layer, int part)
{
    const size_t N = (size_t)ws->B * ws->T, C = (size_t)ws->cfg.d_model, Hl = (size_t)ws->Hl;
    const size_t off[] = {0, N * C, N * (C + Hl), N * (2 * C + Hl)};
    size_t block = (size_t)ws->slot * (ws->le - ws->lb) + (size_t)(layer - ws->lb);
    return ws->wstash + (block * wstash_floats(ws) + off[part]) * act_size(ws);
}
static zero_status no_w_due(const gpt_cuda_workspace *ws, const char *op);

/* One block's W stash, in elements of the activation type, at this tp
 * rank's widths (P = 1: Cl = C, Hl = 4C): d(fc_proj out) N x C (the
 * row-parallel output, whole on every rank), d(fc out) after GELU N x Hl,
 * d(attn proj out) N x C, d(qkv) N x 3Cl - N(2C + Hl + 3Cl), the CPU tp
 * GPT's gpt_block_wstash_floats. */
static size_t wstash_floats(const gpt_cuda_workspace *ws)
{
    return (size_t)ws->B * ws->T * (2 * (size_t)ws->cfg.d_model + (size_t)ws->Hl + 3 * (size_t)ws->Cl);
}

/* Elements of tensor k of `module` on a rank of a tp group of P: the
 * shard's (tp_params.c, the layout the CPU tp GPT uses; P = 1: the tensor). */
static size_t tensor_numel(const gpt_config *cfg, int P, int module, int k)
{
    const size_t i = gpt_param_position(cfg, module, k);
    if (P <= 1) { /* gpt_param_info's own count (an MoE expert stack: this ep rank's experts) */
        gpt_param_info info;
        return gpt_param_info_get(cfg, i, &info) == ZERO_OK ? info.numel : 0;
    }
    tp_param_info ti;
    return tp_param_info_get(cfg, P, 0, i, &ti) == ZERO_OK ? ti.numel : 0;
}

static size_t module_numel(const gpt_config *cfg, int P, int module)
{
    size_t n = 0;
    for (int k = 0; k < gpt_module_num_tensors(cfg, module); k++) n += tensor_numel(cfg, P, module, k);
    return n;
}

#define LT_WS_BYTES ((size_t)32 << 20) /* cuBLASLt's recommended workspace on Hopper */

static gpt_acts_shape cuda_shape(const gpt_config *cfg, int P, int B, int T, const gpt_checkpointing *ck,
                                 const gpt_cuda_options *o, int lb, int le, int slots)
{
    gpt_acts_shape s = {B, T, cfg->d_model, cfg->n_head, cfg->vocab, P, lb, le, slots, le == cfg->n_layer,
                        gpt_checkpointing_below(cfg, ck), ck && ck->cpu_offload, 1, 256, 0, 1,
                        o->attention == GPT_CUDA_ATTN_FLASH, o->act_dtype == ZERO_BF16 ? 2 : 4,
                        cfg->moe_experts > 0};
    return s;
}

/* The common layout (gpt_acts.h), then the attention buffers of the
 * gemm-based attention and the bf16 staging; ws NULL counts only. */
static void cuda_layout(gpt_cuda_workspace *ws, const gpt_config *cfg, const gpt_acts_shape *s, zero_dtype dt,
                        gpt_carver *c)
{
    const int bf16_acts = s->act_elem == 2;
    const size_t N = (size_t)s->B * s->T, C = (size_t)s->C, f = sizeof(float), P = (size_t)s->tp_size;
    const size_t Cl = C / P, NHl = (size_t)s->n_head / P; /* this tp rank's channels and heads */
    const size_t att = (size_t)s->B * NHl * s->T * s->T;
    gpt_cuda_workspace scratch;
    gpt_acts_layout(ws ? &ws->acts : NULL, s, c);
    if (!ws) ws = &scratch;
    const int S = GPT_ACT_SCRATCH;
    ws->losses = (float *)gpt_carve(c, S, N, f);
    float **nc[] = {&ws->q, &ws->k, &ws->v, &ws->y, &ws->dq, &ws->dk, &ws->dv, &ws->dy};
    for (size_t i = 0; i < sizeof nc / sizeof nc[0]; i++) *nc[i] = s->flash ? NULL : (float *)gpt_carve(c, S, N * Cl, f);
    ws->datt = s->flash ? NULL : (float *)gpt_carve(c, S, att, f);
    ws->D = s->flash ? (float *)gpt_carve(c, S, (size_t)s->B * NHl * s->T, f) : NULL;
    ws->dres16 = bf16_acts ? (bf16 *)gpt_carve(c, S, N * C, sizeof(bf16)) : NULL;
    ws->bgrad = bf16_acts ? (float *)gpt_carve(c, S, 4 * C, f) : NULL;
    ws->tp_dx = bf16_acts && P > 1 ? (float *)gpt_carve(c, S, N * C, f) : NULL;
    ws->embed_p = ws->embed_g = ws->module_p = ws->module_g = NULL;
    ws->embed_p16 = ws->module_p16 = NULL;
    if (bf16_acts && dt == ZERO_F32) {
        size_t m = module_numel(cfg, s->tp_size, gpt_module_block(0));
        ws->embed_p16 = (bf16 *)gpt_carve(c, S, module_numel(cfg, 1, GPT_MODULE_EMBED), sizeof(bf16));
        ws->module_p16 = (bf16 *)gpt_carve(c, S, m, sizeof(bf16)); /* the final module has no matmul */
    }
    if (dt == ZERO_BF16) {
        size_t e = module_numel(cfg, 1, GPT_MODULE_EMBED);
        size_t m = module_numel(cfg, s->tp_size, gpt_module_block(0));
        size_t fm = module_numel(cfg, 1, gpt_module_final(cfg));
        m = m > fm ? m : fm;
        ws->embed_p = (float *)gpt_carve(c, S, e, f);
        ws->embed_g = (float *)gpt_carve(c, S, e, f);
        ws->module_p = (float *)gpt_carve(c, S, m, f);
        ws->module_g = (float *)gpt_carve(c, S, m, f);
    }
}

/* ------------------------------------------------------------ small device helpers */
__device__ inline float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ld_f32 / st_as (fp32 <-> the activation type): gpt_cuda_common.cuh */

/* ------------------------------------------------------------ kernels */
__global__ void encoder_forward_kernel(float *out, const int32_t *tok, const float *wte, const float *wpe, int N,
                                       int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    int n = (int)(i / C), c = (int)(i % C);
    out[i] = wte[(size_t)tok[n] * C + c] + wpe[(size_t)(n % T) * C + c];
}

__global__ void encoder_backward_kernel(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int N,
                                        int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    int n = (int)(i / C), c = (int)(i % C);
    atomicAdd(&dwte[(size_t)tok[n] * C + c], dout[i]);
    atomicAdd(&dwpe[(size_t)(n % T) * C + c], dout[i]);
}

/* one warp per row; out in the activation type OT */
template <typename OT>
__global__ void layernorm_forward_kernel(OT *out, float *mean, float *rstd, const float *inp, const float *w,
                                         const float *b, int N, int C)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = warp_sum(s) / C, v = 0.0f;
    for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
    float r = rsqrtf(warp_sum(v) / C + 1e-5f);
    OT *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = st_as<OT>((x[c] - m) * r * w[c] + b[c]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

/* dinp += ... (one warp per row); dw, db come from column_sums_kernel */
template <typename DT>
__global__ void layernorm_backward_dinp_kernel(float *dinp, const DT *dout, const float *inp, const float *w,
                                               const float *mean, const float *rstd, int N, int C)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    const DT *d = dout + (size_t)row * C;
    float *dx = dinp + (size_t)row * C;
    float m = mean[row], r = rstd[row], sg = 0.0f, sgx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float g = ld_f32(d[c]) * w[c];
        sg += g;
        sgx += g * (x[c] - m) * r;
    }
    sg = warp_sum(sg) / C;
    sgx = warp_sum(sgx) / C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (x[c] - m) * r;
        dx[c] += (ld_f32(d[c]) * w[c] - sg - xhat * sgx) * r;
    }
}

/* dst[c] += sum over rows of dout[r,c] (inp == NULL) or of dout[r,c] * xhat[r,c].
 * Block: 32 columns x 8 row-lanes over a slice of rows; one atomic per column per block. */
#define COLSUM_ROWS 256
template <typename DT>
__global__ void column_sums_kernel(float *dst, const DT *dout, const float *inp, const float *mean,
                                   const float *rstd, int N, int C)
{
    __shared__ float part[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * COLSUM_ROWS, r1 = min(N, r0 + COLSUM_ROWS);
    float s = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float d = ld_f32(dout[(size_t)r * C + c]);
            s += inp ? d * (inp[(size_t)r * C + c] - mean[r]) * rstd[r] : d;
        }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int j = 1; j < 8; j++) s += part[j][threadIdx.x];
        atomicAdd(&dst[c], s);
    }
}

/* bias rows, GELU and the row-major gemm are shared with the MoE layer: gpt_cuda_common.cu */

/* qkv (B, T, 3, NH, hs) <-> q, k, v (B, NH, T, hs); to_heads = 1 splits, 0 merges (for the gradient). */
__global__ void qkv_permute_kernel(float *q, float *k, float *v, float *qkv, int B, int T, int NH, int hs,
                                   int to_heads)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)B * NH * T * hs;
    if (i >= total) return;
    int d = (int)(i % hs);
    int t = (int)((i / hs) % T);
    int h = (int)((i / ((size_t)hs * T)) % NH);
    int b = (int)(i / ((size_t)hs * T * NH));
    size_t C = (size_t)NH * hs;
    size_t src = ((size_t)b * T + t) * 3 * C + (size_t)h * hs + d;
    if (to_heads) {
        q[i] = qkv[src];
        k[i] = qkv[src + C];
        v[i] = qkv[src + 2 * C];
    } else {
        qkv[src] = q[i];
        qkv[src + C] = k[i];
        qkv[src + 2 * C] = v[i];
    }
}

/* y (B, NH, T, hs) <-> out (B, T, NH*hs); to_rows = 1 merges heads into rows. */
__global__ void heads_permute_kernel(float *heads, float *rows, int B, int T, int NH, int hs, int to_rows)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)B * NH * T * hs;
    if (i >= total) return;
    int d = (int)(i % hs);
    int t = (int)((i / hs) % T);
    int h = (int)((i / ((size_t)hs * T)) % NH);
    int b = (int)(i / ((size_t)hs * T * NH));
    size_t r = ((size_t)b * T + t) * NH * hs + (size_t)h * hs + d;
    if (to_rows) rows[r] = heads[i];
    else heads[i] = rows[r];
}

/* In place: att rows (B*NH*T of length T) hold raw q.k; becomes causal softmax(scale * s). */
__global__ void softmax_forward_kernel(float *att, int rows, int T, float scale)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    float *a = att + (size_t)row * T;
    float m = -INFINITY;
    for (int j = lane; j <= t; j += 32) m = fmaxf(m, a[j] * scale);
    m = warp_max(m);
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32) {
        float e = expf(a[j] * scale - m);
        a[j] = e;
        s += e;
    }
    float inv = 1.0f / warp_sum(s);
    for (int j = lane; j < T; j += 32) a[j] = j <= t ? a[j] * inv : 0.0f;
}

/* In place: datt holds dP; becomes dS = scale * P * (dP - sum_j P_j dP_j), zero above the diagonal. */
__global__ void softmax_backward_kernel(float *datt, const float *att, int rows, int T, float scale)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    const float *p = att + (size_t)row * T;
    float *d = datt + (size_t)row * T;
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32) s += p[j] * d[j];
    s = warp_sum(s);
    for (int j = lane; j < T; j += 32) d[j] = j <= t ? scale * p[j] * (d[j] - s) : 0.0f;
}

/* per row: lse = log sum exp(logits), loss = lse - logit[target] (0 without a
 * target); the backward recomputes the softmax from the logits and lse. */
__global__ void crossentropy_forward_kernel(float *losses, float *lse_out, const float *logits,
                                            const int32_t *targets, int N, int V)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *l = logits + (size_t)row * V;
    float m = -INFINITY;
    for (int j = lane; j < V; j += 32) m = fmaxf(m, l[j]);
    m = warp_max(m);
    float s = 0.0f;
    for (int j = lane; j < V; j += 32) s += expf(l[j] - m);
    s = warp_sum(s);
    if (lane == 0) {
        float lse = m + logf(s);
        lse_out[row] = lse;
        losses[row] = (targets && targets[row] >= 0) ? lse - l[targets[row]] : 0.0f;
    }
}

template <typename OT>
__global__ void crossentropy_backward_kernel(OT *dlogits, const float *logits, const float *lse,
                                             const int32_t *targets, int N, int V, float scale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * V) return;
    int n = (int)(i / V), j = (int)(i % V);
    int tg = targets[n];
    dlogits[i] = st_as<OT>(tg < 0 ? 0.0f : scale * (expf(logits[i] - lse[n]) - (j == tg ? 1.0f : 0.0f)));
}

__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void add_f32_kernel(float *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

__global__ void bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __bfloat162float(src[i]);
}

/* dst (bf16) += src (fp32), rounded once to nearest even */
__global__ void bf16_accumulate_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2bfloat16_rn(__bfloat162float(dst[i]) + src[i]);
}

/* ------------------------------------------------------------ matmul (row-major on cuBLAS) */
/* Row-major, as gpt_sgemm (gpt_cuda_common.cuh); the workspace's math. */
static zero_status gemm(gpt_cuda_workspace *ws, int ta, int tb, int M, int N, int K, const float *A, int lda,
                        long long sa, const float *B, int ldb, long long sb, float beta, float *C, int ldc,
                        long long sc, int batch)
{
    return gpt_cuda_gemm(ws->blas, ws->math == GPT_CUDA_MATH_BF16, "gpt cuda", ta, tb, M, N, K, A, lda, sa, B, ldb, sb,
                         beta, C, ldc, sc, batch);
}

static zero_status matmul_forward(gpt_cuda_workspace *ws, float *out, const float *init, const float *inp,
                                  const float *w, const float *bias, int N, int C, int OC)
{
    if (init || bias) {
        CUDA_TRY(gpt_cuda_init_rows(out, init, bias, N, OC, ws->stream));
    }
    return gemm(ws, 0, 1, N, OC, C, inp, C, 0, w, C, 0, (init || bias) ? 1.0f : 0.0f, out, OC, 0, 1);
}

/* dst += column sums of dout (inp NULL) or of dout * xhat; dout in the
 * activation type when act, else fp32 */
static zero_status column_sums(gpt_cuda_workspace *ws, float *dst, const void *dout, int act, const float *inp,
                               const float *mean, const float *rstd, int N, int C)
{
    dim3 grid((C + 31) / 32, (N + COLSUM_ROWS - 1) / COLSUM_ROWS), block(32, 8);
    if (act && ws->act_bf16)
        column_sums_kernel<bf16><<<grid, block, 0, ws->stream>>>(dst, (const bf16 *)dout, inp, mean, rstd, N, C);
    else
        column_sums_kernel<float><<<grid, block, 0, ws->stream>>>(dst, (const float *)dout, inp, mean, rstd, N, C);
    LAUNCH_CHECK("column_sums");
    return ZERO_OK;
}

static zero_status matmul_backward(gpt_cuda_workspace *ws, float *dinp, float *dw, float *db, const float *dout,
                                   const float *inp, const float *w, int N, int C, int OC)
{
    GPT_TRY(gemm(ws, 0, 0, N, C, OC, dout, OC, 0, w, C, 0, 0.0f, dinp, C, 0, 1));
    GPT_TRY(gemm(ws, 1, 0, OC, C, N, dout, OC, 0, inp, C, 0, 1.0f, dw, C, 0, 1));
    if (db) GPT_TRY(column_sums(ws, db, dout, 0, NULL, NULL, NULL, N, OC));
    return ZERO_OK;
}

/* out: the activation type */
static zero_status layernorm_forward(gpt_cuda_workspace *ws, void *out, float *mean, float *rstd,
                                     const float *inp, const float *w, const float *b, int N, int C)
{
    unsigned g = blocks_for((size_t)N * 32, 256);
    if (ws->act_bf16) layernorm_forward_kernel<bf16><<<g, 256, 0, ws->stream>>>((bf16 *)out, mean, rstd, inp, w, b, N, C);
    else layernorm_forward_kernel<float><<<g, 256, 0, ws->stream>>>((float *)out, mean, rstd, inp, w, b, N, C);
    LAUNCH_CHECK("layernorm_forward");
    return ZERO_OK;
}

/* dinp (fp32, the residual gradient) += ...; dout: the activation type
 * (dout_act), else fp32 (a tp all-reduced gradient in the bf16 mode) */
static zero_status layernorm_backward(gpt_cuda_workspace *ws, float *dinp, float *dw, float *db, int dout_act,
                                      const void *dout, const float *inp, const float *w, const float *mean,
                                      const float *rstd, int N, int C)
{
    unsigned g = blocks_for((size_t)N * 32, 256);
    if (ws->act_bf16 && dout_act)
        layernorm_backward_dinp_kernel<bf16><<<g, 256, 0, ws->stream>>>(dinp, (const bf16 *)dout, inp, w, mean, rstd, N, C);
    else
        layernorm_backward_dinp_kernel<float><<<g, 256, 0, ws->stream>>>(dinp, (const float *)dout, inp, w, mean, rstd,
                                                                        N, C);
    LAUNCH_CHECK("layernorm_backward");
    GPT_TRY(column_sums(ws, dw, dout, dout_act, inp, mean, rstd, N, C));
    return column_sums(ws, db, dout, dout_act, NULL, NULL, NULL, N, C);
}

/* ------------------------------------------------------------ linear layers, both modes */
/* A module's parameters as the kernels want them: f[k] fp32 (the caller's
 * pointer or a widened copy), h[k] bf16 (bf16 activations only: the
 * caller's pointer or a narrowed copy). */
typedef struct module_view {
    float *f[GPT_MAX_MODULE_TENSORS];
    bf16 *h[GPT_MAX_MODULE_TENSORS];
} module_view;

/* out[N,OC] = init + bias + inp[N,C] W[OC,C]^T, W = tensor wk of `pv`, bias
 * = tensor bk (-1: none). out_act: out is an activation (the activation
 * type; else fp32, as init - the residual stream and the logits). gelu_aux
 * (an activation buffer, or NULL): out = gelu(that sum), the sum itself kept
 * in gelu_aux for the backward. */
static zero_status linear_forward(gpt_cuda_workspace *ws, void *out, int out_act, const float *init, const void *inp,
                                  const module_view *pv, int wk, int bk, int N, int C, int OC, void *gelu_aux)
{
    if (!ws->act_bf16) {
        float *dst = gelu_aux ? (float *)gelu_aux : (float *)out;
        const float *bias = bk >= 0 ? pv->f[bk] : NULL;
        GPT_TRY(matmul_forward(ws, dst, init, (const float *)inp, pv->f[wk], bias, N, C, OC));
        if (gelu_aux) {
            CUDA_TRY(gpt_cuda_gelu_forward((float *)out, (const float *)gelu_aux, (size_t)N * OC, ws->stream));
        }
        return ZERO_OK;
    }
    gpt_lt_matmul m;
    memset(&m, 0, sizeof m);
    m.ta = 0, m.tb = 1, m.M = N, m.N = OC, m.K = C;
    m.A = inp, m.lda = C, m.B = pv->h[wk], m.ldb = C, m.ab_type = CUDA_R_16BF;
    m.D = out_act && gelu_aux && ws->no_gelu_epi ? gelu_aux : out, m.ldd = OC;
    m.d_type = out_act ? CUDA_R_16BF : CUDA_R_32F;
    m.C = init, m.beta = init ? 1.0f : 0.0f;
    if (bk >= 0) m.bias = out_act ? (const void *)pv->h[bk] : (const void *)pv->f[bk];
    if (gelu_aux && !ws->no_gelu_epi) {
        m.epilogue = GPT_LT_GELU, m.aux = gelu_aux, m.ldaux = OC;
        if (gpt_lt_run(ws->lt, &m, ws->lt_ws, LT_WS_BYTES, ws->stream) == ZERO_OK) return ZERO_OK;
        ws->no_gelu_epi = 1; /* no GELU epilogue here: the bias epilogue, then the kernel */
        m.epilogue = GPT_LT_NONE, m.aux = NULL, m.D = gelu_aux;
    }
    GPT_TRY(gpt_lt_run(ws->lt, &m, ws->lt_ws, LT_WS_BYTES, ws->stream));
    if (gelu_aux) {
        CUDA_TRY(gpt_cuda_gelu_forward((bf16 *)out, (const bf16 *)gelu_aux, (size_t)N * OC, ws->stream));
    }
    return ZERO_OK;
}

/* The weight half of a linear layer's backward: dW += dout^T inp, db +=
 * column sums of dout (db NULL: none); dout and inp are activations. fp32:
 * matmul_backward's second gemm and column sums; bf16: the cuBLASLt gemm
 * with the bias-gradient epilogue. The unsplit backward (linear_backward)
 * and W (gpt_cuda_backward_block_weight) both run it, on the same operands. */
static zero_status linear_backward_weight(gpt_cuda_workspace *ws, float *dw, float *db, const void *dout,
                                          const void *inp, int N, int C, int OC)
{
    if (!ws->act_bf16) {
        GPT_TRY(gemm(ws, 1, 0, OC, C, N, (const float *)dout, OC, 0, (const float *)inp, C, 0, 1.0f, dw, C, 0, 1));
        if (db) GPT_TRY(column_sums(ws, db, dout, 0, NULL, NULL, NULL, N, OC));
        return ZERO_OK;
    }
    gpt_lt_matmul m;
    memset(&m, 0, sizeof m); /* dW += dout^T inp, fp32 */
    m.ta = 1, m.tb = 0, m.M = OC, m.N = C, m.K = N;
    m.A = dout, m.lda = OC, m.B = inp, m.ldb = C, m.ab_type = CUDA_R_16BF;
    m.D = dw, m.ldd = C, m.d_type = CUDA_R_32F, m.C = dw, m.beta = 1.0f;
    if (db && !ws->no_bgrad_epi) {
        m.epilogue = GPT_LT_BGRAD, m.bgrad = ws->bgrad; /* written, not added: then db += it */
        if (gpt_lt_run(ws->lt, &m, ws->lt_ws, LT_WS_BYTES, ws->stream) == ZERO_OK) {
            add_f32_kernel<<<blocks_for((size_t)OC, 256), 256, 0, ws->stream>>>(db, ws->bgrad, (size_t)OC);
            LAUNCH_CHECK("add_f32");
            return ZERO_OK;
        }
        ws->no_bgrad_epi = 1;
        m.epilogue = GPT_LT_NONE, m.bgrad = NULL;
    }
    GPT_TRY(gpt_lt_run(ws->lt, &m, ws->lt_ws, LT_WS_BYTES, ws->stream));
    if (db) GPT_TRY(column_sums(ws, db, dout, 1, NULL, NULL, NULL, N, OC));
    return ZERO_OK;
}

/* dinp[N,C] = dout W (an activation; gelu_aux: times gelu'(gelu_aux), the
 * backward through the GELU that produced inp), dW += dout^T inp, db +=
 * column sums of dout (bk -1: none). dout and inp are activations.
 * stash (the split backward's B, both activation modes): dinp only, dout
 * copied into the stash (its own type) for W (gpt_cuda_backward_block_weight),
 * which then runs linear_backward_weight - the gemm (and bias reduction) of
 * the unsplit backward on the same operands.
 * dinp_f32 (bf16 activations, no gelu_aux): dinp is written fp32, not bf16 -
 * a tp rank's partial input gradient, summed over tp in fp32. */
static zero_status linear_backward(gpt_cuda_workspace *ws, void *stash, void *dinp, int dinp_f32,
                                   const module_view *pv, int wk, float *const *g, int bk, const void *dout,
                                   const void *inp, int N, int C, int OC, const void *gelu_aux)
{
    if (stash) {
        CUDA_TRY(cudaMemcpyAsync(stash, dout, act_size(ws) * (size_t)N * OC, cudaMemcpyDeviceToDevice, ws->stream));
        if (!ws->act_bf16)
            GPT_TRY(gemm(ws, 0, 0, N, C, OC, (const float *)dout, OC, 0, pv->f[wk], C, 0, 0.0f, (float *)dinp, C, 0,
                         1));
    } else if (!ws->act_bf16) {
        GPT_TRY(matmul_backward(ws, (float *)dinp, g[wk], bk >= 0 ? g[bk] : NULL, (const float *)dout,
                                (const float *)inp, pv->f[wk], N, C, OC));
    }
    if (!ws->act_bf16) {
        if (gelu_aux) {
            CUDA_TRY(gpt_cuda_gelu_backward((float *)dinp, (const float *)gelu_aux, (const float *)dinp, (size_t)N * C,
                                            ws->stream));
        }
        return ZERO_OK;
    }
    gpt_lt_matmul m;
    memset(&m, 0, sizeof m); /* dinp = dout W */
    m.ta = 0, m.tb = 0, m.M = N, m.N = C, m.K = OC;
    m.A = dout, m.lda = OC, m.B = pv->h[wk], m.ldb = C, m.ab_type = CUDA_R_16BF;
    m.D = dinp, m.ldd = C, m.d_type = dinp_f32 ? CUDA_R_32F : CUDA_R_16BF;
    int dgelu_done = 0;
    if (gelu_aux && !ws->no_dgelu_epi) {
        m.epilogue = GPT_LT_DGELU, m.aux = (void *)gelu_aux, m.ldaux = C;
        if (gpt_lt_run(ws->lt, &m, ws->lt_ws, LT_WS_BYTES, ws->stream) == ZERO_OK) dgelu_done = 1;
        else ws->no_dgelu_epi = 1;
        m.epilogue = GPT_LT_NONE, m.aux = NULL;
    }
    if (!dgelu_done) {
        GPT_TRY(gpt_lt_run(ws->lt, &m, ws->lt_ws, LT_WS_BYTES, ws->stream));
        if (gelu_aux) {
            CUDA_TRY(gpt_cuda_gelu_backward((bf16 *)dinp, (const bf16 *)gelu_aux, (const bf16 *)dinp, (size_t)N * C,
                                            ws->stream));
        }
    }
    if (stash) return ZERO_OK; /* the weight half is W's */
    return linear_backward_weight(ws, g[wk], bk >= 0 ? g[bk] : NULL, dout, inp, N, C, OC);
}

/* ------------------------------------------------------------ bf16 staging */
/* The views of a module (module_view): fp32 - the caller's pointers or a
 * copy widened into `scratch`; bf16 (bf16 activations only) - the caller's
 * pointers or a copy narrowed into `scratch16`. */
static zero_status stage_params(gpt_cuda_workspace *ws, int module, const gpt_tensors *in, float *scratch,
                                bf16 *scratch16, module_view *out)
{
    memset(out, 0, sizeof *out);
    const int P = ws->P; /* tp shards; the embed and final modules are whole on every tp rank */
    for (int k = 0; k < gpt_module_num_tensors(&ws->cfg, module); k++) {
        const size_t numel = tensor_numel(&ws->cfg, P, module, k); /* this tp rank's shard */
        if (ws->param_dtype == ZERO_F32) {
            out->f[k] = (float *)in->t[k];
            if (ws->act_bf16) {
                f32_to_bf16_kernel<<<blocks_for(numel, 256), 256, 0, ws->stream>>>(
                    scratch16, (const float *)in->t[k], numel);
                LAUNCH_CHECK("f32_to_bf16");
                out->h[k] = scratch16;
                scratch16 += numel;
            }
            continue;
        }
        bf16_to_f32_kernel<<<blocks_for(numel, 256), 256, 0, ws->stream>>>(
            scratch, (const __nv_bfloat16 *)in->t[k], numel);
        LAUNCH_CHECK("bf16_to_f32");
        out->f[k] = scratch;
        out->h[k] = (bf16 *)in->t[k];
        scratch += numel;
    }
    return ZERO_OK;
}

/* fp32 gradient targets: the caller's buffers (fp32) or zeroed scratch. */
static zero_status stage_grads(gpt_cuda_workspace *ws, int module, const gpt_tensors *in, float *scratch,
                               float *out[GPT_MAX_MODULE_TENSORS])
{
    const int P = ws->P; /* tp shards; the embed and final modules are whole on every tp rank */
    if (ws->param_dtype == ZERO_BF16)
        CUDA_TRY(cudaMemsetAsync(scratch, 0, sizeof(float) * module_numel(&ws->cfg, P, module), ws->stream));
    for (int k = 0; k < gpt_module_num_tensors(&ws->cfg, module); k++) {
        if (ws->param_dtype == ZERO_F32) {
            out[k] = (float *)in->t[k];
            continue;
        }
        out[k] = scratch;
        scratch += tensor_numel(&ws->cfg, P, module, k);
    }
    return ZERO_OK;
}

/* bf16 only: add the fp32 scratch gradients into the caller's bf16 buffers. */
static zero_status unstage_grads(gpt_cuda_workspace *ws, int module, gpt_tensors *g, float *scratch)
{
    if (ws->param_dtype == ZERO_F32) return ZERO_OK;
    const int P = ws->P; /* tp shards; the embed and final modules are whole on every tp rank */
    for (int k = 0; k < gpt_module_num_tensors(&ws->cfg, module); k++) {
        const size_t numel = tensor_numel(&ws->cfg, P, module, k);
        bf16_accumulate_kernel<<<blocks_for(numel, 256), 256, 0, ws->stream>>>((__nv_bfloat16 *)g->t[k], scratch,
                                                                               numel);
        LAUNCH_CHECK("bf16_accumulate");
        scratch += numel;
    }
    return ZERO_OK;
}

static zero_status check_set(const gpt_cuda_workspace *ws, const char *op, const gpt_tensors *set, int module,
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

/* ------------------------------------------------------------ API: lifetime */
extern "C" int gpt_cuda_available(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static const gpt_cuda_options *default_options(gpt_cuda_options *o, gpt_cuda_math math)
{
    o->math = math, o->act_dtype = ZERO_F32, o->attention = GPT_CUDA_ATTN_UNFUSED;
    return o;
}

static zero_status check_args(const gpt_config *cfg, int P, int batch, int seq, zero_dtype param_dtype,
                              const gpt_checkpointing *ck, const gpt_cuda_options *o, const char *op)
{
    GPT_TRY(gpt_config_validate(cfg));
    GPT_TRY(tp_config_validate(cfg, P)); /* P divides n_head; no MoE at P > 1 */
    GPT_TRY(gpt_checkpointing_validate(ck, op));
    if (P > 1 && ck && ck->partition)
        return gpt_fail(ZERO_UNSUPPORTED, "%s: partitioned activation checkpoints (partition_activations) over tp are "
                                          "the CPU stage's only; the CUDA GPT keeps recomputed inputs whole", op);
    if (batch < 1 || seq < 1 || seq > cfg->seq_len)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: batch %d x seq %d is invalid (seq_len %d)", op, batch, seq,
                        cfg->seq_len);
    if (param_dtype != ZERO_F32 && param_dtype != ZERO_BF16)
        return gpt_fail(ZERO_UNSUPPORTED, "%s: parameter dtype %s (only f32 and bf16)", op,
                        zero_dtype_name(param_dtype));
    if (o->math != GPT_CUDA_MATH_BF16 && o->math != GPT_CUDA_MATH_FP32)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: math %d is not a gpt_cuda_math", op, (int)o->math);
    if (o->attention != GPT_CUDA_ATTN_UNFUSED && o->attention != GPT_CUDA_ATTN_FLASH)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: attention %d is not a gpt_cuda_attention", op, (int)o->attention);
    if (o->act_dtype != ZERO_F32 && o->act_dtype != ZERO_BF16)
        return gpt_fail(ZERO_UNSUPPORTED, "%s: activation dtype %s (only f32 and bf16)", op,
                        zero_dtype_name(o->act_dtype));
    if (o->act_dtype == ZERO_BF16 && o->attention != GPT_CUDA_ATTN_FLASH)
        return gpt_fail(ZERO_UNSUPPORTED, "%s: bf16 activations need flash attention (the unfused one is fp32 only)", op);
    if (o->act_dtype == ZERO_BF16 && o->math != GPT_CUDA_MATH_BF16)
        return gpt_fail(ZERO_UNSUPPORTED, "%s: bf16 activations need math BF16 (their matmul inputs are bf16)", op);
    if (o->attention == GPT_CUDA_ATTN_FLASH && cfg->d_model / cfg->n_head > GPT_FLASH_MAX_HS)
        return gpt_fail(ZERO_UNSUPPORTED, "%s: flash attention takes heads of at most %d, this model's are %d", op,
                        GPT_FLASH_MAX_HS, cfg->d_model / cfg->n_head);
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_activation_bytes_for(const gpt_config *cfg, int batch, int seq, zero_dtype param_dtype,
                                                     const gpt_checkpointing *ck, gpt_activation_bytes *out)
{
    return gpt_cuda_activation_bytes_for_opts(cfg, batch, seq, param_dtype, NULL, ck, out);
}

extern "C" zero_status gpt_cuda_activation_bytes_for_opts(const gpt_config *cfg, int batch, int seq,
                                                          zero_dtype param_dtype, const gpt_cuda_options *opts,
                                                          const gpt_checkpointing *ck, gpt_activation_bytes *out)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_activation_bytes_for: out is NULL");
    if (!cfg) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_activation_bytes_for: config is NULL");
    return gpt_cuda_activation_bytes_stage(cfg, 1, batch, seq, param_dtype, opts, ck, 0, cfg->n_layer, 1, out);
}

extern "C" zero_status gpt_cuda_activation_bytes_stage(const gpt_config *cfg, int tp_size, int batch, int seq,
                                                       zero_dtype param_dtype, const gpt_cuda_options *opts,
                                                       const gpt_checkpointing *ck, int layer_begin, int layer_end,
                                                       int slots, gpt_activation_bytes *out)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_activation_bytes_for: out is NULL");
    memset(out, 0, sizeof *out);
    gpt_cuda_options dflt;
    if (!opts) opts = default_options(&dflt, GPT_CUDA_MATH_BF16);
    GPT_TRY(check_args(cfg, tp_size, batch, seq, param_dtype, ck, opts, "gpt_cuda_activation_bytes_for"));
    if (layer_begin < 0 || layer_end > cfg->n_layer || layer_begin >= layer_end || slots < 1)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_activation_bytes_stage: blocks [%d, %d) with %d slots (the "
                        "model has %d blocks)", layer_begin, layer_end, slots, cfg->n_layer);
    gpt_acts_shape s = cuda_shape(cfg, tp_size, batch, seq, ck, opts, layer_begin, layer_end, slots);
    gpt_carver c;
    gpt_carver_init(&c, s.align, NULL, NULL);
    cuda_layout(NULL, cfg, &s, param_dtype, &c);
    gpt_carver_report(&c, out);
    if (cfg->moe_experts > 0) { /* the layers' device buffers, the sizes gpt_moe_create_cuda allocates */
        gpt_moe_config mc = gpt_moe_config_of(cfg);
        size_t one;
        GPT_TRY(gpt_moe_bytes_for(&mc, batch * seq, cfg->moe_ep > 1 ? cfg->moe_ep : 1, 1, &one));
        out->moe = (size_t)(layer_end - layer_begin) * (size_t)slots * one; /* one layer per slot and block */
        out->total += out->moe;
    }
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_workspace_create(gpt_cuda_workspace **out, const gpt_config *cfg, int batch,
                                                 int seq, zero_dtype param_dtype, gpt_cuda_math math,
                                                 void *cuda_stream)
{
    return gpt_cuda_workspace_create_ckpt(out, cfg, batch, seq, param_dtype, math, cuda_stream, NULL);
}

extern "C" zero_status gpt_cuda_workspace_create_ckpt(gpt_cuda_workspace **out, const gpt_config *cfg, int batch,
                                                      int seq, zero_dtype param_dtype, gpt_cuda_math math,
                                                      void *cuda_stream, const gpt_checkpointing *ck)
{
    gpt_cuda_options o;
    return gpt_cuda_workspace_create_opts(out, cfg, batch, seq, param_dtype, default_options(&o, math), cuda_stream,
                                          ck);
}

extern "C" zero_status gpt_cuda_workspace_create_opts(gpt_cuda_workspace **out, const gpt_config *cfg, int batch,
                                                      int seq, zero_dtype param_dtype, const gpt_cuda_options *opts,
                                                      void *cuda_stream, const gpt_checkpointing *ck)
{
    return gpt_cuda_workspace_create_moe(out, cfg, batch, seq, param_dtype, opts, cuda_stream, ck, NULL);
}

static zero_status create_workspace(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                    zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                    const gpt_checkpointing *ck, int layer_begin, int layer_end, int slots,
                                    zero_comm *ep, zero_comm *tp);

/* One CUDA MoE layer per block, over `ep`, as the CPU workspace's create_moe. */
static zero_status create_moe(gpt_cuda_workspace *ws, zero_comm *ep)
{
    const gpt_config *cfg = &ws->cfg;
    int want = cfg->moe_ep > 1 ? cfg->moe_ep : 1, have = ep ? zero_comm_get_size(ep) : 1;
    if (want != have)
        return gpt_fail(ZERO_CONFIG, "gpt_cuda_workspace_create: moe ep = %d but the ep comm has %d rank%s",
                        cfg->moe_ep, have, have == 1 ? "" : "s");
    const size_t rows = (size_t)ws->slots * (size_t)cfg->n_layer;
    ws->moe_all = (gpt_moe **)calloc(rows, sizeof *ws->moe_all);
    ws->moe_aux_all = (float *)calloc(rows, sizeof *ws->moe_aux_all);
    ws->moe = ws->moe_all, ws->moe_aux = ws->moe_aux_all; /* slot 0 */
    if (!ws->moe_all || !ws->moe_aux_all)
        return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_cuda_workspace_create: out of host memory (MoE)");
    gpt_moe_config mc = gpt_moe_config_of(cfg);
    for (int k = 0; k < ws->slots; k++)
        for (int l = ws->lb; l < ws->le; l++) {
            gpt_moe **m = &ws->moe_all[(size_t)k * cfg->n_layer + l];
            GPT_TRY(gpt_moe_create_cuda(m, &mc, ws->B * ws->T, have > 1 ? ep : NULL, ws->stream));
            gpt_moe_set_matmul_bf16(*m, ws->math == GPT_CUDA_MATH_BF16);
            ws->bytes.moe += gpt_moe_bytes(*m); /* what each layer allocated on the device */
        }
    ws->bytes.total += ws->bytes.moe;
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_workspace_create_moe(gpt_cuda_workspace **out, const gpt_config *cfg, int batch,
                                                     int seq, zero_dtype param_dtype, const gpt_cuda_options *opts,
                                                     void *cuda_stream, const gpt_checkpointing *ck, zero_comm *ep)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_workspace_create: out is NULL");
    *out = NULL;
    GPT_TRY(gpt_config_validate(cfg));
    return create_workspace(out, cfg, batch, seq, param_dtype, opts, cuda_stream, ck, 0, cfg->n_layer, 1, ep, NULL);
}

extern "C" zero_status gpt_cuda_workspace_create_stage(gpt_cuda_workspace **out, const gpt_config *cfg, int batch,
                                                       int seq, zero_dtype param_dtype, const gpt_cuda_options *opts,
                                                       void *cuda_stream, const gpt_checkpointing *ck, int layer_begin,
                                                       int layer_end, int slots)
{
    return gpt_cuda_workspace_create_tp(out, cfg, batch, seq, param_dtype, opts, cuda_stream, ck, layer_begin,
                                        layer_end, slots, NULL);
}

extern "C" zero_status gpt_cuda_workspace_create_tp(gpt_cuda_workspace **out, const gpt_config *cfg, int batch,
                                                    int seq, zero_dtype param_dtype, const gpt_cuda_options *opts,
                                                    void *cuda_stream, const gpt_checkpointing *ck, int layer_begin,
                                                    int layer_end, int slots, zero_comm *tp)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_workspace_create_stage: out is NULL");
    *out = NULL;
    GPT_TRY(gpt_config_validate(cfg));
    return create_workspace(out, cfg, batch, seq, param_dtype, opts, cuda_stream, ck, layer_begin, layer_end, slots,
                            NULL, tp);
}

extern "C" zero_status gpt_cuda_workspace_create_stage_moe(gpt_cuda_workspace **out, const gpt_config *cfg, int batch,
                                                           int seq, zero_dtype param_dtype,
                                                           const gpt_cuda_options *opts, void *cuda_stream,
                                                           const gpt_checkpointing *ck, int layer_begin, int layer_end,
                                                           int slots, zero_comm *tp, zero_comm *ep)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_workspace_create_stage: out is NULL");
    *out = NULL;
    GPT_TRY(gpt_config_validate(cfg));
    return create_workspace(out, cfg, batch, seq, param_dtype, opts, cuda_stream, ck, layer_begin, layer_end, slots,
                            ep, tp);
}

extern "C" void gpt_cuda_workspace_set_moe_dloss(gpt_cuda_workspace *ws, float dloss)
{
    if (ws) ws->moe_dloss = dloss;
}

/* The tp comm of a workspace: its size and rank, a device comm at P > 1,
 * and whether its ops are ordered on the workspace's stream. */
static zero_status bind_tp(gpt_cuda_workspace *ws, zero_comm *tp)
{
    const char *op = "gpt_cuda_workspace_create_tp";
    ws->tp = tp;
    ws->P = tp ? zero_comm_get_size(tp) : 1;
    ws->tp_rank = tp ? zero_comm_get_rank(tp) : 0;
    if (ws->P < 1 || ws->tp_rank < 0)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: the tp comm is not a live comm (size %d, rank %d)", op, ws->P,
                        ws->tp_rank);
    ws->Cl = ws->cfg.d_model / ws->P, ws->NHl = ws->cfg.n_head / ws->P, ws->Hl = 4 * ws->cfg.d_model / ws->P;
    if (ws->P == 1) return ZERO_OK;
    zero_backend b = zero_comm_get_backend(tp);
    if (b != ZERO_BACKEND_NCCL && b != ZERO_BACKEND_STAGED)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: the tp comm '%s' takes host buffers (backend %d); the CUDA GPT "
                        "all-reduces device buffers and needs an NCCL or STAGED comm", op, zero_comm_get_name(tp), (int)b);
    zero_stream *s = zero_comm_get_stream(tp);
    if (s && zero_stream_get_cuda(s) != ws->stream)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: the tp comm '%s' is ordered on another stream than the "
                        "workspace's (zero_comm_set_stream with a stream wrapping the workspace's, or none)", op,
                        zero_comm_get_name(tp));
    ws->tp_on_stream = s != NULL;
    return ZERO_OK;
}

/* Megatron's all-reduce over tp of an N x C fp32 device buffer, in place:
 * stream-ordered when the comm is on the workspace's stream (NCCL runs it
 * there; STAGED waits for the stream and runs it in the call), else after
 * the host waited for the work queued before it (the MoE layer's rule). */
static zero_status tp_allreduce(gpt_cuda_workspace *ws, float *buf, const char *what, int layer)
{
    if (ws->P == 1) return ZERO_OK;
    if (!ws->tp_on_stream) CUDA_TRY(cudaStreamSynchronize(ws->stream));
    zero_status st = zero_allreduce(ws->tp, buf, buf, (size_t)ws->B * ws->T * ws->cfg.d_model, ZERO_F32, ZERO_SUM);
    if (st != ZERO_OK)
        return gpt_fail(st, "gpt cuda: tp all-reduce of %s of block %d: %s", what, layer, zero_comm_last_error(ws->tp));
    return ZERO_OK;
}

/* The host waits for the stream and, when the tp comm is on it, for its ops
 * (a failed stream-ordered all-reduce is reported here). */
static zero_status ws_sync(gpt_cuda_workspace *ws)
{
    CUDA_TRY(cudaStreamSynchronize(ws->stream));
    if (ws->tp_on_stream && zero_comm_sync(ws->tp) != ZERO_OK)
        return gpt_fail(ZERO_BACKEND, "gpt cuda: tp all-reduce: %s", zero_comm_last_error(ws->tp));
    return ZERO_OK;
}

/* The workspace of blocks [layer_begin, layer_end) with `slots` activation
 * sets (whole-model workspaces: [0, n_layer), 1), MoE layers over `ep`. */
static zero_status create_workspace(gpt_cuda_workspace **out, const gpt_config *cfg, int batch, int seq,
                                    zero_dtype param_dtype, const gpt_cuda_options *opts, void *cuda_stream,
                                    const gpt_checkpointing *ck, int layer_begin, int layer_end, int slots,
                                    zero_comm *ep, zero_comm *tp)
{
    gpt_cuda_options dflt;
    if (!opts) opts = default_options(&dflt, GPT_CUDA_MATH_BF16);
    const int P = tp ? zero_comm_get_size(tp) : 1;
    GPT_TRY(check_args(cfg, P < 1 ? 1 : P, batch, seq, param_dtype, ck, opts, "gpt_cuda_workspace_create"));
    if (layer_begin < 0 || layer_end > cfg->n_layer || layer_begin >= layer_end || slots < 1)
        return gpt_fail(ZERO_INVALID_ARGUMENT,
                        "gpt_cuda_workspace_create_stage: blocks [%d, %d) with %d slots (the model has %d blocks; "
                        "a stage holds at least one block and one slot)", layer_begin, layer_end, slots, cfg->n_layer);
    const gpt_cuda_math math = opts->math;
    if (!gpt_cuda_available())
        return gpt_fail(ZERO_UNSUPPORTED, "gpt_cuda_workspace_create: no CUDA device is visible");
    gpt_cuda_workspace *ws = (gpt_cuda_workspace *)calloc(1, sizeof *ws);
    if (!ws) return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_cuda_workspace_create: no host memory");
    ws->cfg = *cfg;
    ws->B = batch;
    ws->T = seq;
    ws->param_dtype = param_dtype;
    ws->math = math;
    ws->opts = *opts;
    ws->act_bf16 = opts->act_dtype == ZERO_BF16;
    ws->flash = opts->attention == GPT_CUDA_ATTN_FLASH;
    ws->stream = (cudaStream_t)cuda_stream;
    ws->lb = layer_begin, ws->le = layer_end, ws->slots = slots, ws->slot = 0;
    size_t N = (size_t)batch * seq;
    gpt_acts_shape shape = cuda_shape(cfg, P < 1 ? 1 : P, batch, seq, ck, opts, layer_begin, layer_end, slots);
    ws->host_targets = (int32_t *)malloc(sizeof(int32_t) * N);
    ws->host_losses = (float *)malloc(sizeof(float) * N);
    ws->saved = (struct gpt_cuda_slot_state *)calloc((size_t)slots, sizeof *ws->saved);
    zero_status st = bind_tp(ws, tp);
    if (st == ZERO_OK && (!ws->host_targets || !ws->host_losses || !ws->saved)) {
        st = gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_cuda_workspace_create: no host memory");
    } else if (st == ZERO_OK && (st = gpt_acts_init(&ws->acts, &shape)) == ZERO_OK) {
        gpt_carver c;
        gpt_carver_init(&c, shape.align, NULL, NULL);
        cuda_layout(NULL, cfg, &shape, param_dtype, &c);
        size_t bytes = c.off[0], host = c.off[1];
        cudaError_t e = cudaMalloc(&ws->mem, bytes);
        if (e != cudaSuccess) {
            ws->mem = NULL;
            st = gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_cuda_workspace_create: cudaMalloc of %zu bytes for batch %d x seq %d: %s",
                          bytes, batch, seq, cudaGetErrorString(e));
        } else if (host && (e = cudaHostAlloc(&ws->host_mem, host, cudaHostAllocDefault)) != cudaSuccess) {
            ws->host_mem = NULL;
            st = gpt_fail(ZERO_OUT_OF_MEMORY,
                          "gpt_cuda_workspace_create: cudaHostAlloc of %zu pinned bytes for the offloaded block inputs: %s",
                          host, cudaGetErrorString(e));
        } else {
            gpt_carver_init(&c, shape.align, ws->mem, ws->host_mem);
            cuda_layout(ws, cfg, &shape, param_dtype, &c);
            gpt_carver_report(&c, &ws->bytes);
            ws->io = &ws->acts.slots[0];
            if (cublasCreate(&ws->blas) != CUBLAS_STATUS_SUCCESS) {
                ws->blas = NULL;
                st = gpt_fail(ZERO_BACKEND, "gpt_cuda_workspace_create: cublasCreate failed");
            } else if (cublasSetStream(ws->blas, ws->stream) != CUBLAS_STATUS_SUCCESS) {
                st = gpt_fail(ZERO_BACKEND, "gpt_cuda_workspace_create: cublasSetStream failed");
            } else if (ws->act_bf16 && cublasLtCreate(&ws->lt) != CUBLAS_STATUS_SUCCESS) {
                ws->lt = NULL;
                st = gpt_fail(ZERO_BACKEND, "gpt_cuda_workspace_create: cublasLtCreate failed");
            } else if (ws->act_bf16 && (e = cudaMalloc(&ws->lt_ws, LT_WS_BYTES)) != cudaSuccess) {
                ws->lt_ws = NULL;
                st = gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_cuda_workspace_create: cudaMalloc of the %zu-byte cuBLASLt workspace: %s",
                              LT_WS_BYTES, cudaGetErrorString(e));
            }
        }
    }
    if (st == ZERO_OK && cfg->moe_experts > 0) st = create_moe(ws, ep);
    if (st != ZERO_OK) {
        gpt_cuda_workspace_destroy(ws);
        return st;
    }
    *out = ws;
    return ZERO_OK;
}

extern "C" void gpt_cuda_workspace_destroy(gpt_cuda_workspace *ws)
{
    if (!ws) return;
    if (ws->blas) cublasDestroy(ws->blas);
    if (ws->lt) cublasLtDestroy(ws->lt);
    if (ws->lt_ws) cudaFree(ws->lt_ws);
    if (ws->host_mem) cudaStreamSynchronize(ws->stream); /* copies to the pinned buffer in flight */
    if (ws->mem) cudaFree(ws->mem);
    if (ws->wstash) cudaFree(ws->wstash);
    free(ws->w_due);
    if (ws->host_mem) cudaFreeHost(ws->host_mem);
    for (size_t k = 0; ws->moe_all && k < (size_t)ws->slots * (size_t)ws->cfg.n_layer; k++)
        gpt_moe_destroy(ws->moe_all[k]);
    free(ws->moe_all);
    free(ws->moe_aux_all);
    gpt_acts_free(&ws->acts);
    free(ws->host_targets);
    free(ws->host_losses);
    free(ws->saved);
    free(ws);
}

extern "C" size_t gpt_cuda_workspace_bytes(const gpt_cuda_workspace *ws) { return ws ? ws->bytes.total : 0; }

extern "C" struct gpt_moe *gpt_cuda_workspace_moe_layer(const gpt_cuda_workspace *ws, int layer)
{
    return ws && ws->moe && layer >= 0 && layer < ws->cfg.n_layer ? ws->moe[layer] : NULL;
}

extern "C" float gpt_cuda_workspace_moe_aux(const gpt_cuda_workspace *ws)
{
    float s = 0.0f; /* in the CPU workspace's order: block by block, in float */
    if (ws && ws->moe_aux)
        for (int l = 0; l < ws->cfg.n_layer; l++) s += ws->moe_aux[l];
    return s;
}

extern "C" void gpt_cuda_workspace_activation_bytes(const gpt_cuda_workspace *ws, gpt_activation_bytes *out)
{
    if (!out) return;
    if (ws) *out = ws->bytes;
    else memset(out, 0, sizeof *out);
}

extern "C" zero_status gpt_cuda_workspace_logits(gpt_cuda_workspace *ws, float *host_out)
{
    if (!ws || !host_out) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_workspace_logits: NULL argument");
    size_t n = (size_t)ws->B * ws->T * ws->cfg.vocab;
    CUDA_TRY(cudaMemcpyAsync(host_out, ws->io->logits, sizeof(float) * n, cudaMemcpyDeviceToHost, ws->stream));
    CUDA_TRY(cudaStreamSynchronize(ws->stream));
    return ZERO_OK;
}

/* The offloaded copy of resid[i] (cpu_offload, recomputed blocks only): to
 * the pinned buffer once produced, back before the block's recomputation.
 * Stream-ordered: the staging buffer is overwritten two blocks later, after
 * the copy in the stream's order. */
static zero_status offload_input(gpt_cuda_workspace *ws, int i)
{
    if (!ws->io->kept[i]) return ZERO_OK;
    size_t n = sizeof(float) * ws->acts.kept_count; /* N * C: no partition on one GPU */
    CUDA_TRY(cudaMemcpyAsync(ws->io->kept[i], ws->io->resid[i], n, cudaMemcpyDeviceToHost, ws->stream));
    return ZERO_OK;
}

static zero_status reload_input(gpt_cuda_workspace *ws, int i)
{
    if (!ws->io->kept[i]) return ZERO_OK;
    size_t n = sizeof(float) * ws->acts.kept_count;
    CUDA_TRY(cudaMemcpyAsync(ws->io->resid[i], ws->io->kept[i], n, cudaMemcpyHostToDevice, ws->stream));
    return ZERO_OK;
}

/* ------------------------------------------------------------ API: forward */
extern "C" zero_status gpt_cuda_forward_begin(gpt_cuda_workspace *ws, const int32_t *tokens,
                                              const int32_t *targets, const gpt_tensors *embed)
{
    if (!ws || !tokens) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_forward_begin: workspace or tokens is NULL");
    if (ws->lb != 0)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_cuda_forward_begin: the workspace holds blocks [%d, %d), not the "
                                            "embedding: its forward starts from an input (gpt_cuda_forward_begin_input)",
                        ws->lb, ws->le);
    GPT_TRY(check_set(ws, "gpt_cuda_forward_begin", embed, GPT_MODULE_EMBED, "parameter"));
    GPT_TRY(no_w_due(ws, "gpt_cuda_forward_begin"));
    const int N = ws->B * ws->T, C = ws->cfg.d_model, V = ws->cfg.vocab;
    ws->valid = 0;
    for (int i = 0; i < N; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_forward_begin: token %d at batch %d position %d is outside [0, %d)",
                            tokens[i], i / ws->T, i % ws->T, V);
        if (targets && targets[i] >= V)
            return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_forward_begin: target %d at batch %d position %d is >= vocab %d",
                            targets[i], i / ws->T, i % ws->T, V);
        if (targets && targets[i] >= 0) ws->valid++;
    }
    ws->has_targets = targets != NULL;
    CUDA_TRY(cudaMemcpyAsync(ws->io->tokens, tokens, sizeof(int32_t) * N, cudaMemcpyHostToDevice, ws->stream));
    if (targets) {
        memcpy(ws->host_targets, targets, sizeof(int32_t) * N);
        CUDA_TRY(cudaMemcpyAsync(ws->io->targets, ws->host_targets, sizeof(int32_t) * N, cudaMemcpyHostToDevice,
                                 ws->stream));
    }
    module_view pv;
    GPT_TRY(stage_params(ws, GPT_MODULE_EMBED, embed, ws->embed_p, ws->embed_p16, &pv));
    encoder_forward_kernel<<<blocks_for((size_t)N * C, 256), 256, 0, ws->stream>>>(ws->io->resid[0], ws->io->tokens,
                                                                                  pv.f[GPT_WTE], pv.f[GPT_WPE], N, ws->T, C);
    LAUNCH_CHECK("encoder_forward");
    GPT_TRY(offload_input(ws, 0));
    ws->phase = 1;
    ws->next_layer = 0;
    return ZERO_OK;
}

/* ------------------------------------------------------------ API: pipeline stages */
extern "C" zero_status gpt_cuda_workspace_select_slot(gpt_cuda_workspace *ws, int slot)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_workspace_select_slot: workspace is NULL");
    if (slot < 0 || slot >= ws->slots)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_workspace_select_slot: slot %d of %d", slot, ws->slots);
    if (slot == ws->slot) return ZERO_OK;
    struct gpt_cuda_slot_state *cur = &ws->saved[ws->slot], *next = &ws->saved[slot];
    cur->phase = ws->phase, cur->next_layer = ws->next_layer, cur->has_targets = ws->has_targets, cur->valid = ws->valid;
    ws->phase = next->phase, ws->next_layer = next->next_layer, ws->has_targets = next->has_targets;
    ws->valid = next->valid;
    ws->slot = slot;
    ws->io = &ws->acts.slots[slot];
    if (ws->moe_all) /* the slot's MoE layers (each keeps its micro-batch's state) */
        ws->moe = ws->moe_all + (size_t)slot * ws->cfg.n_layer, ws->moe_aux = ws->moe_aux_all + (size_t)slot * ws->cfg.n_layer;
    return ZERO_OK;
}

extern "C" int gpt_cuda_workspace_slots(const gpt_cuda_workspace *ws) { return ws ? ws->slots : 0; }

extern "C" void gpt_cuda_workspace_range(const gpt_cuda_workspace *ws, int *layer_begin, int *layer_end)
{
    if (layer_begin) *layer_begin = ws ? ws->lb : 0;
    if (layer_end) *layer_end = ws ? ws->le : 0;
}

extern "C" const float *gpt_cuda_workspace_output(const gpt_cuda_workspace *ws, int slot)
{
    if (!ws || slot < 0 || slot >= ws->slots) return NULL;
    return ws->acts.slots[slot].resid[ws->le - ws->lb];
}

/* the W's of the selected slot still due (a forward would overwrite what they read) */
static zero_status no_w_due(const gpt_cuda_workspace *ws, const char *op)
{
    for (int l = ws->lb; ws->w_due && l < ws->le; l++)
        if (ws->w_due[w_index(ws, l)])
            return gpt_fail(ZERO_INVALID_STATE,
                            "%s: block %d's weight gradients (W) are still due (slot %d): the forward would "
                            "overwrite the activations they need", op, l, ws->slot);
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_forward_begin_input(gpt_cuda_workspace *ws, const float *in, const int32_t *targets)
{
    const char *op = "gpt_cuda_forward_begin_input";
    if (!ws || !in) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: workspace or input is NULL", op);
    if (ws->lb == 0)
        return gpt_fail(ZERO_INVALID_STATE, "%s: the workspace starts at block 0: its forward starts from the tokens "
                                            "(gpt_cuda_forward_begin)", op);
    if (targets && ws->le != ws->cfg.n_layer)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: targets given to blocks [%d, %d), which do not end with the head",
                        op, ws->lb, ws->le);
    GPT_TRY(no_w_due(ws, op));
    const int N = ws->B * ws->T, V = ws->cfg.vocab;
    ws->valid = 0;
    for (int i = 0; targets && i < N; i++) {
        if (targets[i] >= V)
            return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: target %d at batch %d position %d is >= vocab %d", op,
                            targets[i], i / ws->T, i % ws->T, V);
        if (targets[i] >= 0) ws->valid++;
    }
    ws->has_targets = targets != NULL;
    if (targets) {
        memcpy(ws->host_targets, targets, sizeof(int32_t) * N);
        CUDA_TRY(cudaMemcpyAsync(ws->io->targets, ws->host_targets, sizeof(int32_t) * N, cudaMemcpyHostToDevice,
                                 ws->stream));
    }
    CUDA_TRY(cudaMemcpyAsync(ws->io->resid[0], in, sizeof(float) * N * ws->cfg.d_model, cudaMemcpyDeviceToDevice,
                             ws->stream));
    GPT_TRY(offload_input(ws, 0));
    ws->phase = 1;
    ws->next_layer = ws->lb;
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_backward_end_output(gpt_cuda_workspace *ws, const float *dout)
{
    const char *op = "gpt_cuda_backward_end_output";
    if (!ws || !dout) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: workspace or output gradient is NULL", op);
    if (ws->le == ws->cfg.n_layer)
        return gpt_fail(ZERO_INVALID_STATE, "%s: the workspace ends with the head: its backward starts from the loss "
                                            "(gpt_cuda_backward_end)", op);
    if (ws->phase != 1 || ws->next_layer != ws->le)
        return gpt_fail(ZERO_INVALID_STATE, "%s: slot %d has not run blocks [%d, %d) forward", op, ws->slot, ws->lb,
                        ws->le);
    CUDA_TRY(cudaMemcpyAsync(ws->acts.dres, dout, sizeof(float) * (size_t)ws->B * ws->T * ws->cfg.d_model,
                             cudaMemcpyDeviceToDevice, ws->stream));
    ws->phase = 3;
    ws->next_layer = ws->le - 1;
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_backward_begin_input(gpt_cuda_workspace *ws, float *din)
{
    const char *op = "gpt_cuda_backward_begin_input";
    if (!ws || !din) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: workspace or input gradient is NULL", op);
    if (ws->lb == 0)
        return gpt_fail(ZERO_INVALID_STATE, "%s: the workspace starts at block 0: its backward ends in the embedding "
                                            "(gpt_cuda_backward_begin)", op);
    if (ws->phase != 3 || ws->next_layer != ws->lb - 1)
        return gpt_fail(ZERO_INVALID_STATE, "%s: called before blocks [%d, %d) of slot %d ran backward", op, ws->lb,
                        ws->le, ws->slot);
    CUDA_TRY(cudaMemcpyAsync(din, ws->acts.dres, sizeof(float) * (size_t)ws->B * ws->T * ws->cfg.d_model,
                             cudaMemcpyDeviceToDevice, ws->stream));
    ws->phase = 0;
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_workspace_sync(gpt_cuda_workspace *ws)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_workspace_sync: workspace is NULL");
    return ws_sync(ws);
}

extern "C" zero_status gpt_cuda_workspace_losses(const gpt_cuda_workspace *ws, const float **losses, long *valid)
{
    if (!ws || !losses || !valid)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_workspace_losses: workspace or output is NULL");
    if (ws->le != ws->cfg.n_layer || ws->phase < 2)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_cuda_workspace_losses: slot %d has no loss (blocks [%d, %d): %s)",
                        ws->slot, ws->lb, ws->le, ws->le != ws->cfg.n_layer ? "no head" : "gpt_cuda_forward_end first");
    *losses = ws->losses, *valid = ws->valid;
    return ZERO_OK;
}

extern "C" void *gpt_cuda_stream_handle(const zero_stream *stream) { return (void *)zero_stream_get_cuda(stream); }

/* The attention of one block: a->atty from a->qkv (flash: a->att_lse kept;
 * unfused: a->att, the probabilities); over this tp rank's NHl heads, Cl
 * channels (all of them at tp 1). */
static zero_status attention_forward(gpt_cuda_workspace *ws, gpt_block_acts *a)
{
    const int B = ws->B, T = ws->T, C = ws->Cl, NH = ws->NHl, hs = C / NH, N = B * T;
    size_t nh = (size_t)N * C;
    if (ws->flash) {
        cudaError_t e = ws->act_bf16 ? gpt_cuda_flash_forward<bf16>((bf16 *)a->atty, a->att_lse, (const bf16 *)a->qkv, B, T,
                                                                C, NH, ws->stream)
                                 : gpt_cuda_flash_forward<float>(a->atty, a->att_lse, a->qkv, B, T, C, NH, ws->stream);
        if (e != cudaSuccess)
            return gpt_fail(ZERO_BACKEND, "gpt cuda: flash attention forward (B %d, T %d, %d heads of %d): %s", B, T, NH,
                            hs, cudaGetErrorString(e));
        return ZERO_OK;
    }
    /* S = q k^T per (b, h), softmax in place, y = P v */
    qkv_permute_kernel<<<blocks_for(nh, 256), 256, 0, ws->stream>>>(ws->q, ws->k, ws->v, a->qkv, B, T, NH, hs, 1);
    LAUNCH_CHECK("qkv_permute");
    long long sh = (long long)T * hs, sa = (long long)T * T;
    GPT_TRY(gemm(ws, 0, 1, T, T, hs, ws->q, hs, sh, ws->k, hs, sh, 0.0f, a->att, T, sa, B * NH));
    int rows = B * NH * T;
    softmax_forward_kernel<<<blocks_for((size_t)rows * 32, 256), 256, 0, ws->stream>>>(a->att, rows, T,
                                                                                      1.0f / sqrtf((float)hs));
    LAUNCH_CHECK("softmax_forward");
    GPT_TRY(gemm(ws, 0, 0, T, hs, T, a->att, T, sa, ws->v, hs, sh, 0.0f, ws->y, hs, sh, B * NH));
    heads_permute_kernel<<<blocks_for(nh, 256), 256, 0, ws->stream>>>(ws->y, a->atty, B, T, NH, hs, 1);
    LAUNCH_CHECK("heads_permute");
    return ZERO_OK;
}

/* dqkv from dout (the gradient of atty) through the attention of block `a`. */
static zero_status attention_backward(gpt_cuda_workspace *ws, gpt_block_acts *a, void *dqkv, const void *dout)
{
    const int B = ws->B, T = ws->T, C = ws->Cl, NH = ws->NHl, hs = C / NH, N = B * T;
    size_t nh = (size_t)N * C;
    if (ws->flash) {
        cudaError_t e =
            ws->act_bf16 ? gpt_cuda_flash_backward<bf16>((bf16 *)dqkv, ws->D, (const bf16 *)dout, (const bf16 *)a->atty,
                                                     a->att_lse, (const bf16 *)a->qkv, B, T, C, NH, ws->stream)
                     : gpt_cuda_flash_backward<float>((float *)dqkv, ws->D, (const float *)dout, a->atty, a->att_lse,
                                                      a->qkv, B, T, C, NH, ws->stream);
        if (e != cudaSuccess)
            return gpt_fail(ZERO_BACKEND, "gpt cuda: flash attention backward (B %d, T %d, %d heads of %d): %s", B, T,
                            NH, hs, cudaGetErrorString(e));
        return ZERO_OK;
    }
    heads_permute_kernel<<<blocks_for(nh, 256), 256, 0, ws->stream>>>(ws->dy, (float *)dout, B, T, NH, hs, 0);
    LAUNCH_CHECK("heads_permute");
    qkv_permute_kernel<<<blocks_for(nh, 256), 256, 0, ws->stream>>>(ws->q, ws->k, ws->v, a->qkv, B, T, NH, hs, 1);
    LAUNCH_CHECK("qkv_permute");
    long long sh = (long long)T * hs, sa = (long long)T * T;
    int bh = B * NH, rows = B * NH * T;
    GPT_TRY(gemm(ws, 0, 1, T, T, hs, ws->dy, hs, sh, ws->v, hs, sh, 0.0f, ws->datt, T, sa, bh));   /* dP = dY V^T */
    GPT_TRY(gemm(ws, 1, 0, T, hs, T, a->att, T, sa, ws->dy, hs, sh, 0.0f, ws->dv, hs, sh, bh));    /* dV = P^T dY */
    softmax_backward_kernel<<<blocks_for((size_t)rows * 32, 256), 256, 0, ws->stream>>>(ws->datt, a->att, rows, T,
                                                                                       1.0f / sqrtf((float)hs));
    LAUNCH_CHECK("softmax_backward");
    GPT_TRY(gemm(ws, 0, 0, T, hs, T, ws->datt, T, sa, ws->k, hs, sh, 0.0f, ws->dq, hs, sh, bh));   /* dQ = dS K */
    GPT_TRY(gemm(ws, 1, 0, T, hs, T, ws->datt, T, sa, ws->q, hs, sh, 0.0f, ws->dk, hs, sh, bh));   /* dK = dS^T Q */
    qkv_permute_kernel<<<blocks_for(nh, 256), 256, 0, ws->stream>>>(ws->dq, ws->dk, ws->dv, (float *)dqkv, B, T, NH,
                                                                   hs, 0);
    LAUNCH_CHECK("qkv_permute");
    return ZERO_OK;
}

/* An MoE block's router and expert tensors as moe.h takes them (fp32). */
static gpt_moe_params moe_tensors(float *const *t)
{
    gpt_moe_params m = {t[GPT_MOE_GATE_W], t[GPT_FC_W], t[GPT_FC_B], t[GPT_FCPROJ_W], t[GPT_FCPROJ_B]};
    return m;
}

/* The MoE layer's input, ln_2's output in fp32: a->ln2 itself with fp32
 * activations; with bf16 ones a widened copy kept in the block's (otherwise
 * unused) fch buffer - N x 4C bf16 holds N x C floats - for the backward's
 * router gradient. */
static zero_status moe_input(gpt_cuda_workspace *ws, gpt_block_acts *a, const float **x)
{
    *x = a->ln2;
    if (!ws->act_bf16) return ZERO_OK;
    size_t n = (size_t)ws->B * ws->T * ws->cfg.d_model;
    bf16_to_f32_kernel<<<blocks_for(n, 256), 256, 0, ws->stream>>>(a->fch, (const bf16 *)a->ln2, n);
    LAUNCH_CHECK("bf16_to_f32");
    *x = a->fch;
    return ZERO_OK;
}

/* One block's forward from x into the activations `a`, output to `out`;
 * out == NULL recomputes (everything but the last matmul, whose output is
 * kept), as gpt_block.c does on the CPU. An MoE block's recomputation stops
 * after ln_2 (and its fp32 copy): the layer kept its own state and must not
 * route or exchange again. Under tp the two projections are row-parallel:
 * tp rank 0 starts from residual + bias, the others from zero, and the sum
 * over tp is the block's (a recomputation repeats the first all-reduce). */
static zero_status block_forward(gpt_cuda_workspace *ws, int layer, gpt_block_acts *a, const float *x, float *out,
                                 const module_view *pv)
{
    const int C = ws->cfg.d_model, N = ws->B * ws->T, Cl = ws->Cl, Hl = ws->Hl, r0 = ws->tp_rank == 0;
    GPT_TRY(layernorm_forward(ws, a->ln1, a->ln1_mean, a->ln1_rstd, x, pv->f[GPT_LN1_W], pv->f[GPT_LN1_B], N, C));
    GPT_TRY(linear_forward(ws, a->qkv, 1, NULL, a->ln1, pv, GPT_QKV_W, GPT_QKV_B, N, C, 3 * Cl, NULL));
    GPT_TRY(attention_forward(ws, a));
    GPT_TRY(linear_forward(ws, a->res2, 0, r0 ? x : NULL, a->atty, pv, GPT_ATTPROJ_W, r0 ? GPT_ATTPROJ_B : -1, N, Cl,
                           C, NULL));
    GPT_TRY(tp_allreduce(ws, a->res2, "the attention output", layer));
    GPT_TRY(layernorm_forward(ws, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, pv->f[GPT_LN2_W], pv->f[GPT_LN2_B], N,
                              C));
    if (ws->moe) { /* out = res2 + MoE(ln_2(res2)) */
        const float *mx;
        GPT_TRY(moe_input(ws, a, &mx));
        if (!out) return ZERO_OK;
        gpt_moe_params mp = moe_tensors(pv->f);
        return gpt_moe_forward(ws->moe[layer], mx, a->res2, out, &mp, &ws->moe_aux[layer]);
    }
    GPT_TRY(linear_forward(ws, a->fch_gelu, 1, NULL, a->ln2, pv, GPT_FC_W, GPT_FC_B, N, C, Hl, a->fch));
    if (!out) return ZERO_OK;
    GPT_TRY(linear_forward(ws, out, 0, r0 ? a->res2 : NULL, a->fch_gelu, pv, GPT_FCPROJ_W, r0 ? GPT_FCPROJ_B : -1, N,
                           Hl, C, NULL));
    return tp_allreduce(ws, out, "the MLP output", layer);
}

extern "C" zero_status gpt_cuda_forward_block(gpt_cuda_workspace *ws, int layer, const gpt_tensors *block)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_forward_block: workspace is NULL");
    if (ws->phase != 1 || layer != ws->next_layer)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_cuda_forward_block: block %d called out of order (expected %d)", layer,
                        ws->phase == 1 ? ws->next_layer : -1);
    int m = gpt_module_block(layer);
    GPT_TRY(check_set(ws, "gpt_cuda_forward_block", block, m, "parameter"));
    module_view pv;
    GPT_TRY(stage_params(ws, m, block, ws->module_p, ws->module_p16, &pv));
    /* a recomputed block's activations go to the shared set, overwritten by the next one */
    const int i = layer - ws->lb; /* the range's block i */
    GPT_TRY(block_forward(ws, layer, ws->io->block[i], ws->io->resid[i], ws->io->resid[i + 1], &pv));
    GPT_TRY(offload_input(ws, i + 1));
    ws->next_layer++;
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_forward_end(gpt_cuda_workspace *ws, const gpt_tensors *final_params,
                                            const gpt_tensors *embed, float *loss)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_forward_end: workspace is NULL");
    if (ws->le != ws->cfg.n_layer)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_cuda_forward_end: the workspace holds blocks [%d, %d), not the head",
                        ws->lb, ws->le);
    if (ws->phase != 1 || ws->next_layer != ws->cfg.n_layer)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_cuda_forward_end: called before all %d blocks ran forward",
                        ws->cfg.n_layer);
    int fm = gpt_module_final(&ws->cfg);
    GPT_TRY(check_set(ws, "gpt_cuda_forward_end", final_params, fm, "parameter"));
    GPT_TRY(check_set(ws, "gpt_cuda_forward_end", embed, GPT_MODULE_EMBED, "parameter"));
    const int N = ws->B * ws->T, C = ws->cfg.d_model, V = ws->cfg.vocab;
    module_view pf, pe;
    GPT_TRY(stage_params(ws, fm, final_params, ws->module_p, ws->module_p16, &pf));
    GPT_TRY(stage_params(ws, GPT_MODULE_EMBED, embed, ws->embed_p, ws->embed_p16, &pe));

    gpt_acts_slot *io = ws->io;
    GPT_TRY(layernorm_forward(ws, io->lnf, io->lnf_mean, io->lnf_rstd, io->resid[ws->le - ws->lb], pf.f[GPT_LNF_W],
                              pf.f[GPT_LNF_B], N, C));
    GPT_TRY(linear_forward(ws, io->logits, 0, NULL, io->lnf, &pe, GPT_WTE, -1, N, C, V, NULL));
    crossentropy_forward_kernel<<<blocks_for((size_t)N * 32, 256), 256, 0, ws->stream>>>(
        ws->losses, io->lse, io->logits, ws->has_targets ? io->targets : NULL, N, V);
    LAUNCH_CHECK("crossentropy_forward");
    if (loss) {
        CUDA_TRY(cudaMemcpyAsync(ws->host_losses, ws->losses, sizeof(float) * N, cudaMemcpyDeviceToHost, ws->stream));
        GPT_TRY(ws_sync(ws));
        double total = 0.0;
        for (int i = 0; i < N; i++) total += ws->host_losses[i];
        /* with MoE blocks the loss adds their weighted aux losses, as the CPU model's */
        *loss = (ws->valid ? (float)(total / ws->valid) : 0.0f) +
                ws->cfg.moe_aux_loss_coef * gpt_cuda_workspace_moe_aux(ws);
    }
    ws->phase = 2;
    return ZERO_OK;
}

/* ------------------------------------------------------------ API: backward */
/* bf16 activations: the residual gradient (fp32) rounded into dres16 for the
 * matmuls that take it; fp32 activations: dres itself. */
static zero_status residual_grad_as_act(gpt_cuda_workspace *ws, const void **act)
{
    if (!ws->act_bf16) return ZERO_OK;
    size_t n = (size_t)ws->B * ws->T * ws->cfg.d_model;
    f32_to_bf16_kernel<<<blocks_for(n, 256), 256, 0, ws->stream>>>(ws->dres16, ws->acts.dres, n);
    LAUNCH_CHECK("f32_to_bf16");
    *act = ws->dres16;
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_backward_end(gpt_cuda_workspace *ws, float dloss, const gpt_tensors *final_params,
                                             gpt_tensors *final_grads, const gpt_tensors *embed,
                                             gpt_tensors *embed_grads)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_backward_end: workspace is NULL");
    if (ws->phase != 2) return gpt_fail(ZERO_INVALID_STATE, "gpt_cuda_backward_end: needs gpt_cuda_forward_end first");
    if (!ws->has_targets)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_cuda_backward_end: the forward ran without targets, there is no loss");
    int fm = gpt_module_final(&ws->cfg);
    GPT_TRY(check_set(ws, "gpt_cuda_backward_end", final_params, fm, "parameter"));
    GPT_TRY(check_set(ws, "gpt_cuda_backward_end", final_grads, fm, "gradient"));
    GPT_TRY(check_set(ws, "gpt_cuda_backward_end", embed, GPT_MODULE_EMBED, "parameter"));
    GPT_TRY(check_set(ws, "gpt_cuda_backward_end", embed_grads, GPT_MODULE_EMBED, "gradient"));
    const int N = ws->B * ws->T, C = ws->cfg.d_model, V = ws->cfg.vocab;
    module_view pf, pe;
    float *gf[GPT_MAX_MODULE_TENSORS], *ge[GPT_MAX_MODULE_TENSORS];
    GPT_TRY(stage_params(ws, fm, final_params, ws->module_p, ws->module_p16, &pf));
    GPT_TRY(stage_params(ws, GPT_MODULE_EMBED, embed, ws->embed_p, ws->embed_p16, &pe));
    GPT_TRY(stage_grads(ws, fm, final_grads, ws->module_g, gf));
    GPT_TRY(stage_grads(ws, GPT_MODULE_EMBED, embed_grads, ws->embed_g, ge));

    const gpt_acts_slot *io = ws->io;
    float scale = ws->valid ? dloss / (float)ws->valid : 0.0f;
    ws->moe_dloss = dloss; /* the aux losses' share */
    unsigned g = blocks_for((size_t)N * V, 256);
    if (ws->act_bf16)
        crossentropy_backward_kernel<bf16><<<g, 256, 0, ws->stream>>>((bf16 *)ws->acts.dlogits, io->logits, io->lse,
                                                                      io->targets, N, V, scale);
    else
        crossentropy_backward_kernel<float><<<g, 256, 0, ws->stream>>>(ws->acts.dlogits, io->logits, io->lse,
                                                                       io->targets, N, V, scale);
    LAUNCH_CHECK("crossentropy_backward");
    GPT_TRY(linear_backward(ws, NULL, ws->acts.dln, 0, &pe, GPT_WTE, ge, -1, ws->acts.dlogits, io->lnf, N, C, V,
                            NULL));
    CUDA_TRY(cudaMemsetAsync(ws->acts.dres, 0, sizeof(float) * (size_t)N * C, ws->stream));
    GPT_TRY(layernorm_backward(ws, ws->acts.dres, gf[GPT_LNF_W], gf[GPT_LNF_B], 1, ws->acts.dln,
                               io->resid[ws->le - ws->lb], pf.f[GPT_LNF_W], io->lnf_mean, io->lnf_rstd, N, C));
    GPT_TRY(unstage_grads(ws, fm, final_grads, ws->module_g));
    GPT_TRY(unstage_grads(ws, GPT_MODULE_EMBED, embed_grads, ws->embed_g));
    ws->phase = 3;
    ws->next_layer = ws->cfg.n_layer - 1;
    return ZERO_OK;
}

/* The whole block backward, or (input_only) its B half. */
static zero_status block_backward(gpt_cuda_workspace *ws, const char *op, int layer, const gpt_tensors *block,
                                  gpt_tensors *block_grads, int input_only)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: workspace is NULL", op);
    if (ws->phase != 3 || layer != ws->next_layer)
        return gpt_fail(ZERO_INVALID_STATE, "%s: block %d called out of order (expected %d)", op,
                        layer, ws->phase == 3 ? ws->next_layer : ws->cfg.n_layer - 1);
    if (input_only && !ws->wstash)
        return gpt_fail(ZERO_INVALID_STATE, "%s: the workspace has no W stash (gpt_cuda_workspace_split_backward)", op);
    int m = gpt_module_block(layer);
    GPT_TRY(check_set(ws, op, block, m, "parameter"));
    GPT_TRY(check_set(ws, op, block_grads, m, "gradient"));
    const int C = ws->cfg.d_model, N = ws->B * ws->T, Cl = ws->Cl, Hl = ws->Hl;
    const size_t nh = (size_t)N * C;
    gpt_block_acts *a = ws->io->block[layer - ws->lb];
    const float *x = ws->io->resid[layer - ws->lb];
    module_view pv;
    float *g[GPT_MAX_MODULE_TENSORS];
    GPT_TRY(stage_params(ws, m, block, ws->module_p, ws->module_p16, &pv));
    /* checkpointing: the kept input back from the host if offloaded, then the forward again */
    if (gpt_acts_recomputed(&ws->acts.shape, layer)) {
        GPT_TRY(reload_input(ws, layer - ws->lb));
        GPT_TRY(block_forward(ws, layer, a, x, NULL, &pv));
    }
    GPT_TRY(stage_grads(ws, m, block_grads, ws->module_g, g));
    float *dres = ws->acts.dres, *dln = ws->acts.dln, *dqkv = ws->acts.dqkv, *dfch = ws->acts.dfch;
    /* the column-parallel layers' input gradient (d ln_2, d ln_1): partial on
     * each tp rank, summed over tp before the LayerNorm backward - in place
     * in dln with fp32 activations; with bf16 ones written fp32 into tp_dx
     * and summed in fp32 (as the CPU tp GPT; no bf16 rounding of the
     * partials before the sum, at twice the bytes of a bf16 all-reduce) */
    const int dx_f32 = ws->tp_dx != NULL;
    float *dx = dx_f32 ? ws->tp_dx : dln;
    /* the stash of this block (input_only): fc_proj, fc, attn proj, qkv upstream gradients */
    void *st_fcproj = input_only ? wstash_of(ws, layer, WST_FCPROJ) : NULL,
         *st_fc = input_only ? wstash_of(ws, layer, WST_FC) : NULL,
         *st_proj = input_only ? wstash_of(ws, layer, WST_ATTPROJ) : NULL,
         *st_qkv = input_only ? wstash_of(ws, layer, WST_QKV) : NULL;

    /* MLP half (dres is fp32; the matmuls take it as an activation) */
    const void *dres_act = dres;
    if (ws->moe) {
        /* d ln_2 from d out through the MoE layer (router and expert gradients
         * accumulate into g; B of a split: the experts' wait in the layer for
         * W); with bf16 activations it comes back in fp32 (into dfch, unused
         * here) and is rounded into dln */
        const float *mx = ws->act_bf16 ? a->fch : a->ln2;
        float *mdx = ws->act_bf16 ? dfch : dln;
        gpt_moe_params mp = moe_tensors(pv.f), mg = moe_tensors(g);
        if (input_only) GPT_TRY(gpt_moe_backward_input(ws->moe[layer], ws->moe_dloss, mx, dres, mdx, &mp, &mg));
        else GPT_TRY(gpt_moe_backward(ws->moe[layer], ws->moe_dloss, mx, dres, mdx, &mp, &mg));
        if (ws->act_bf16) {
            f32_to_bf16_kernel<<<blocks_for(nh, 256), 256, 0, ws->stream>>>((bf16 *)dln, mdx, nh);
            LAUNCH_CHECK("f32_to_bf16");
        }
    } else {
        GPT_TRY(residual_grad_as_act(ws, &dres_act));
        GPT_TRY(linear_backward(ws, st_fcproj, dfch, 0, &pv, GPT_FCPROJ_W, g, GPT_FCPROJ_B, dres_act, a->fch_gelu, N,
                                Hl, C, a->fch));
        GPT_TRY(linear_backward(ws, st_fc, dx, dx_f32, &pv, GPT_FC_W, g, GPT_FC_B, dfch, a->ln2, N, C, Hl, NULL));
        GPT_TRY(tp_allreduce(ws, dx, "d ln_2", layer));
    }
    GPT_TRY(layernorm_backward(ws, dres, g[GPT_LN2_W], g[GPT_LN2_B], !dx_f32, dx, a->res2,
                               pv.f[GPT_LN2_W], a->ln2_mean, a->ln2_rstd, N, C));

    /* attention half */
    GPT_TRY(residual_grad_as_act(ws, &dres_act));
    GPT_TRY(linear_backward(ws, st_proj, dln, 0, &pv, GPT_ATTPROJ_W, g, GPT_ATTPROJ_B, dres_act, a->atty, N, Cl, C,
                            NULL));
    GPT_TRY(attention_backward(ws, a, dqkv, dln));
    GPT_TRY(linear_backward(ws, st_qkv, dx, dx_f32, &pv, GPT_QKV_W, g, GPT_QKV_B, dqkv, a->ln1, N, C, 3 * Cl, NULL));
    GPT_TRY(tp_allreduce(ws, dx, "d ln_1", layer));
    GPT_TRY(layernorm_backward(ws, dres, g[GPT_LN1_W], g[GPT_LN1_B], !dx_f32, dx, x, pv.f[GPT_LN1_W], a->ln1_mean,
                               a->ln1_rstd, N, C));
    GPT_TRY(unstage_grads(ws, m, block_grads, ws->module_g));
    if (input_only) ws->w_due[w_index(ws, layer)] = 1;
    ws->next_layer--;
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_backward_block(gpt_cuda_workspace *ws, int layer, const gpt_tensors *block,
                                               gpt_tensors *block_grads)
{
    return block_backward(ws, "gpt_cuda_backward_block", layer, block, block_grads, 0);
}

/* ------------------------------------------------------------ API: split backward */
extern "C" zero_status gpt_cuda_workspace_split_backward(gpt_cuda_workspace *ws)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_workspace_split_backward: workspace is NULL");
    if (ws->wstash) return ZERO_OK;
    for (int l = ws->lb; l < ws->le; l++)
        if (gpt_acts_recomputed(&ws->acts.shape, l))
            return gpt_fail(ZERO_UNSUPPORTED,
                            "gpt_cuda_workspace_split_backward: block %d is recomputed (activation checkpointing): "
                            "W needs its activations kept until it runs", l);
    /* MoE blocks: each slot's layers keep their experts' deferred W (moe.h) */
    for (int k = 0; ws->moe_all && k < ws->slots; k++)
        for (int l = ws->lb; l < ws->le; l++) GPT_TRY(gpt_moe_split_backward(ws->moe_all[(size_t)k * ws->cfg.n_layer + l]));
    size_t bytes = act_size(ws) * wstash_floats(ws) * (size_t)(ws->le - ws->lb) * (size_t)ws->slots;
    ws->w_due = (unsigned char *)calloc((size_t)ws->cfg.n_layer * (size_t)ws->slots, 1);
    if (!ws->w_due) return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_cuda_workspace_split_backward: no host memory");
    cudaError_t e = cudaMalloc(&ws->wstash, bytes);
    if (e != cudaSuccess) {
        ws->wstash = NULL;
        free(ws->w_due);
        ws->w_due = NULL;
        return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_cuda_workspace_split_backward: cudaMalloc of %zu bytes: %s", bytes,
                        cudaGetErrorString(e));
    }
    return ZERO_OK;
}

extern "C" size_t gpt_cuda_workspace_wstash_bytes(const gpt_cuda_workspace *ws)
{
    if (!ws || !ws->wstash) return 0;
    size_t bytes = act_size(ws) * wstash_floats(ws) * (size_t)(ws->le - ws->lb) * (size_t)ws->slots;
    for (int k = 0; ws->moe_all && k < ws->slots; k++) /* the MoE layers' stashes */
        for (int l = ws->lb; l < ws->le; l++) bytes += gpt_moe_split_bytes(ws->moe_all[(size_t)k * ws->cfg.n_layer + l]);
    return bytes;
}

extern "C" zero_status gpt_cuda_backward_block_input(gpt_cuda_workspace *ws, int layer, const gpt_tensors *block,
                                                     gpt_tensors *block_grads)
{
    return block_backward(ws, "gpt_cuda_backward_block_input", layer, block, block_grads, 1);
}

extern "C" zero_status gpt_cuda_backward_block_weight(gpt_cuda_workspace *ws, int layer, gpt_tensors *block_grads)
{
    const char *op = "gpt_cuda_backward_block_weight";
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: workspace is NULL", op);
    if (layer < ws->lb || layer >= ws->le || !ws->w_due || !ws->w_due[w_index(ws, layer)])
        return gpt_fail(ZERO_INVALID_STATE, "%s: block %d has no B waiting for its W (gpt_cuda_backward_block_input "
                                            "first)", op, layer);
    int m = gpt_module_block(layer);
    GPT_TRY(check_set(ws, op, block_grads, m, "gradient"));
    const int C = ws->cfg.d_model, N = ws->B * ws->T, Cl = ws->Cl, Hl = ws->Hl;
    const gpt_block_acts *a = ws->io->block[layer - ws->lb];
    float *g[GPT_MAX_MODULE_TENSORS];
    GPT_TRY(stage_grads(ws, m, block_grads, ws->module_g, g));
    /* the unsplit backward's weight halves, in its order and at its (local)
     * widths, fp32 or bf16 activations alike. No tp all-reduce: the sharded
     * weights' gradients are this rank's, and the row-parallel layers'
     * replicated biases are summed from the whole upstream gradient on every
     * rank, as the unsplit backward does (the all-reduces are B's) */
    if (ws->moe) { /* the slot's MoE layer holds its experts' deferred W (on this stream) */
        gpt_moe_params mg = moe_tensors(g);
        GPT_TRY(gpt_moe_backward_weight(ws->moe[layer], &mg));
    } else {
        GPT_TRY(linear_backward_weight(ws, g[GPT_FCPROJ_W], g[GPT_FCPROJ_B], wstash_of(ws, layer, WST_FCPROJ),
                                       a->fch_gelu, N, Hl, C));
        GPT_TRY(linear_backward_weight(ws, g[GPT_FC_W], g[GPT_FC_B], wstash_of(ws, layer, WST_FC), a->ln2, N, C, Hl));
    }
    GPT_TRY(linear_backward_weight(ws, g[GPT_ATTPROJ_W], g[GPT_ATTPROJ_B], wstash_of(ws, layer, WST_ATTPROJ), a->atty,
                                   N, Cl, C));
    GPT_TRY(linear_backward_weight(ws, g[GPT_QKV_W], g[GPT_QKV_B], wstash_of(ws, layer, WST_QKV), a->ln1, N, C,
                                   3 * Cl));
    GPT_TRY(unstage_grads(ws, m, block_grads, ws->module_g));
    ws->w_due[w_index(ws, layer)] = 0;
    return ZERO_OK;
}

extern "C" zero_status gpt_cuda_backward_begin(gpt_cuda_workspace *ws, gpt_tensors *embed_grads)
{
    if (!ws) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_backward_begin: workspace is NULL");
    if (ws->lb != 0)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_cuda_backward_begin: the workspace holds blocks [%d, %d), not the "
                                            "embedding (gpt_cuda_backward_begin_input)", ws->lb, ws->le);
    if (ws->phase != 3 || ws->next_layer != -1)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_cuda_backward_begin: called before every block ran backward");
    GPT_TRY(check_set(ws, "gpt_cuda_backward_begin", embed_grads, GPT_MODULE_EMBED, "gradient"));
    const int N = ws->B * ws->T, C = ws->cfg.d_model;
    float *ge[GPT_MAX_MODULE_TENSORS];
    GPT_TRY(stage_grads(ws, GPT_MODULE_EMBED, embed_grads, ws->embed_g, ge));
    encoder_backward_kernel<<<blocks_for((size_t)N * C, 256), 256, 0, ws->stream>>>(ge[GPT_WTE], ge[GPT_WPE],
                                                                                   ws->acts.dres, ws->io->tokens, N,
                                                                                   ws->T, C);
    LAUNCH_CHECK("encoder_backward");
    GPT_TRY(unstage_grads(ws, GPT_MODULE_EMBED, embed_grads, ws->embed_g));
    ws->phase = 0;
    return ZERO_OK;
}

/* ------------------------------------------------------------ API: whole passes */
extern "C" zero_status gpt_cuda_forward(gpt_cuda_workspace *ws, const int32_t *tokens, const int32_t *targets,
                                        const gpt_tensors *params, float *loss)
{
    if (!ws || !params) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_forward: workspace or params is NULL");
    GPT_TRY(gpt_cuda_forward_begin(ws, tokens, targets, &params[GPT_MODULE_EMBED]));
    for (int l = 0; l < ws->cfg.n_layer; l++) GPT_TRY(gpt_cuda_forward_block(ws, l, &params[gpt_module_block(l)]));
    return gpt_cuda_forward_end(ws, &params[gpt_module_final(&ws->cfg)], &params[GPT_MODULE_EMBED], loss);
}

extern "C" zero_status gpt_cuda_backward(gpt_cuda_workspace *ws, float dloss, const gpt_tensors *params,
                                         gpt_tensors *grads)
{
    if (!ws || !params || !grads)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_cuda_backward: workspace, params or grads is NULL");
    int fm = gpt_module_final(&ws->cfg);
    GPT_TRY(gpt_cuda_backward_end(ws, dloss, &params[fm], &grads[fm], &params[GPT_MODULE_EMBED],
                                  &grads[GPT_MODULE_EMBED]));
    for (int l = ws->cfg.n_layer - 1; l >= 0; l--)
        GPT_TRY(gpt_cuda_backward_block(ws, l, &params[gpt_module_block(l)], &grads[gpt_module_block(l)]));
    return gpt_cuda_backward_begin(ws, &grads[GPT_MODULE_EMBED]);
}
