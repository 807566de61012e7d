/* The CUDA GPT's tensor-parallel blocks (gpt_cuda_workspace_create_tp)
 * against the single-rank CUDA GPT, on a GPU:
 *
 *   tests/mpirun.sh 2 test_gpt_cuda_tp   2 ranks sharing GPU 0 over a STAGED
 *                                        world comm (device buffers,
 *                                        host-staged MPI): tp 2
 *
 * (any world size P dividing n_head works; at 1 it is the tp-1 path). Every
 * rank runs the reference too: the whole-model workspace
 * (gpt_cuda_workspace_create_opts) on the full parameters; the tp run holds
 * this rank's shards, sliced from the same full tensors by tp_param_slice
 * (tp_params.c: the layout the CPU tp GPT and the engine's tp_engine_build
 * use). Two micro-batches, gradients accumulated. Model: 2 blocks, 4 heads,
 * d_model 64, seq 24, batch 2, vocab 96, one ignored target; GPT-2's init
 * plus a deterministic perturbation of every tensor (so biases and
 * LayerNorm weights are away from 0 / 1: a row-parallel bias added on every
 * tp rank, or a missing all-reduce, moves the results by O(1)).
 *
 * Gradients are gathered from the shards: each rank unslices its split
 * tensors' gradients into a zeroed full-size buffer and the world sums them
 * (a device all-reduce over the STAGED comm: every element comes from one
 * rank, so the sum is the gather, exactly); replicated tensors (LayerNorms,
 * the projections' biases, wte, wpe, ln_f) are each rank's own.
 *
 * Modes and tolerances (the reference runs the same mode):
 *  1. fp32 params, fp32 math (no TF32), fp32 activations, unfused attention;
 *     the tp comm without a stream (the host waits for the workspace's
 *     stream before each all-reduce);
 *  2. the same with flash attention, every block recomputed (activation
 *     checkpointing repeats the attention all-reduce), and the tp comm
 *     stream-ordered on the workspace's own stream (zero_comm_set_stream
 *     with a wrapper of it).
 *     Both: each micro-batch's loss within 1e-5 relative; every gradient
 *     elementwise within 2e-5 x max|ref| + 1e-4 x |ref| - the CPU tp tests'
 *     bound (tests/model_parallel, measured 8.1e-7 of max there): both sides
 *     are fp32 and differ in summation order only (a row-parallel product
 *     summed as two K/2 halves plus the all-reduce, against one gemm over
 *     K; the atomics of the bias / LayerNorm / embedding reductions).
 *  3. bf16 params and grads, bf16 math, fp32 activations;
 *  4. bf16 activations (GPT_CUDA_OPTIONS_BF16: flash, bf16 math; the
 *     column-parallel input gradients computed and all-reduced in fp32,
 *     where the single-rank mode rounds them to bf16 once), fp32 params.
 *     Both: loss within 5e-3 relative, every gradient within 2e-2 relative
 *     L2 of the reference's: the two runs round to bf16 at different points
 *     (partial sums, the fp32 d ln of mode 4), each rounding ~2^-9
 *     relative; the bound is the bf16 mode's own against fp32 (3e-2 in
 *     test_gpt_cuda.c) tightened, and a missing or doubled term is O(1).
 *     Not measured: written without a GPU.
 * The split backward at P > 1 (modes 1, 3, 4: the ones that keep their
 * activations): the tp run again with B (gpt_cuda_backward_block_input) in
 * the backward and every block's W (gpt_cuda_backward_block_weight) after the
 * embedding's backward, each micro-batch; against the unsplit tp run of the
 * same mode on the same rank (its shards, before the gather): every linear
 * layer's weight gradient BITWISE equal (W issues the unsplit backward's
 * weight gemm on the same operands: the upstream gradients B stashed at this
 * rank's widths, N x C / N x 4C/P / N x C / N x 3C/P, after the same
 * all-reduces), every other gradient within 1e-5 x max |tensor| plus one bf16
 * rounding step with bf16 gradients (the atomics of the bias / LayerNorm /
 * embedding reductions: tests/model/test_gpt_cuda_split.c's bound); the
 * stash's bytes exactly slots x blocks x N(2C + 4C/P + 3C/P) elements of the
 * activation type. Mode 2 recomputes blocks: the split is refused naming
 * block 0 (ZERO_UNSUPPORTED).
 * Refusals (P > 1): a host-memory (MPI) tp comm (ZERO_INVALID_ARGUMENT: "takes
 * host buffers"), a tp comm ordered on another stream (ZERO_INVALID_ARGUMENT).
 * Skips (77) without a GPU or in a build without CUDA. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/comm.h>
#include <zero/device.h>

#include "check.h"
#include "gpt.h"
#include "gpt_cuda.h"
#include "gpt_test_params.h"
#include "tp_gpt.h"
#include "zero_build_config.h"

#if ZERO_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <zero/zero_cuda.h>

#define L_ 2
#define B_ 2
#define T_ 24
#define V_ 96
#define N_ (B_ * T_)

static zero_comm *world;
static int rank, size;

/* ------------------------------------------------------------ device memory */
static void *dalloc(size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) return NULL;
    cudaMemset(p, 0, n ? n : 1);
    return p;
}
static void dput(void *d, const void *h, size_t n) { cudaMemcpy(d, h, n, cudaMemcpyHostToDevice); }
static void dget(void *h, const void *d, size_t n)
{
    cudaDeviceSynchronize();
    cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
}
static void dfree(void *p) { cudaFree(p); }

/* ------------------------------------------------------------ the model */
typedef struct mode {
    const char *name;
    zero_dtype dt;          /* params and grads */
    gpt_cuda_options o;
    int recompute, on_stream;
    int loose;              /* bf16: relative L2 instead of elementwise */
} mode;

/* tensor i's elements on this run: the full tensor (P = 1) or this rank's shard */
static size_t numel_of(const gpt_config *cfg, int P, size_t i)
{
    tp_param_info ti;
    tp_param_info_get(cfg, P, P > 1 ? rank : 0, i, &ti);
    return ti.numel;
}

/* One backward of the split kind: B of every block, the embedding's
 * backward, then every block's W (the deferred order of a zero-bubble
 * stage's cool-down). */
static zero_status split_backward(gpt_cuda_workspace *ws, const gpt_config *cfg, gpt_tensors *p, gpt_tensors *g)
{
    const int fm = gpt_module_final(cfg);
    zero_status st = gpt_cuda_backward_end(ws, 1.0f, &p[fm], &g[fm], &p[GPT_MODULE_EMBED], &g[GPT_MODULE_EMBED]);
    for (int l = L_ - 1; l >= 0 && st == ZERO_OK; l--)
        st = gpt_cuda_backward_block_input(ws, l, &p[gpt_module_block(l)], &g[gpt_module_block(l)]);
    if (st == ZERO_OK) st = gpt_cuda_backward_begin(ws, &g[GPT_MODULE_EMBED]);
    for (int l = L_ - 1; l >= 0 && st == ZERO_OK; l--)
        st = gpt_cuda_backward_block_weight(ws, l, &g[gpt_module_block(l)]);
    return st;
}

/* One run: P = 1 the whole-model workspace, P > 1 the tp workspace over the
 * world (split: with the split backward). Parameters from the full fp32
 * `full`; gradients back in the full layout: for P > 1 a split tensor's shard
 * unsliced into zeros, a replicated one whole. */
static int run(const gpt_config *cfg, const float *full, const mode *m, int P, int split, const int32_t *tok,
               const int32_t *tgt, float *gfull, float loss[2])
{
    const size_t np = gpt_num_params(cfg), es = m->dt == ZERO_BF16 ? 2 : 4;
    size_t total = 0, off = 0;
    for (size_t i = 0; i < np; i++) total += numel_of(cfg, P, i);
    char *hp = malloc(total * es), *hg = malloc(total * es);
    float *shard = malloc(sizeof(float) * total);
    void *dp = dalloc(total * es), *dg = dalloc(total * es);
    gpt_tensors p[L_ + 2], g[L_ + 2];
    memset(p, 0, sizeof p), memset(g, 0, sizeof g);
    if (!hp || !hg || !shard || !dp || !dg) return -1;
    for (size_t i = 0; i < np; i++) { /* this run's tensors, sliced from the full ones */
        tp_param_info ti;
        size_t foff = 0;
        tp_param_info_get(cfg, P, P > 1 ? rank : 0, i, &ti);
        for (size_t j = 0; j < i; j++) foff += numel_of(cfg, 1, j);
        tp_param_slice(&ti, P, P > 1 ? rank : 0, full + foff, shard + off);
        for (size_t j = 0; j < ti.numel; j++) {
            if (m->dt == ZERO_BF16) ((uint16_t *)hp)[off + j] = zero_f32_to_bf16(shard[off + j]);
            else ((float *)hp)[off + j] = shard[off + j];
        }
        p[ti.full.module].t[ti.full.index] = (char *)dp + off * es;
        g[ti.full.module].t[ti.full.index] = (char *)dg + off * es;
        off += ti.numel;
    }
    dput(dp, hp, total * es);

    cudaStream_t cs = NULL;
    zero_device *zd = NULL;
    zero_stream *zs = NULL;
    zero_status st = ZERO_OK;
    if (P > 1 && m->on_stream) {
        if (cudaStreamCreate(&cs) != cudaSuccess) return -1;
        CHECK_OK(st = zero_device_create(&zd, ZERO_DEVICE_CUDA, 0));
        if (st == ZERO_OK) CHECK_OK(st = zero_stream_wrap_cuda(zd, cs, &zs));
        if (st == ZERO_OK) CHECK_OK(st = zero_comm_set_stream(world, zs));
    }
    const gpt_checkpointing ck = {GPT_CHECKPOINT_ALL, 0, 0};
    gpt_cuda_workspace *ws = NULL;
    if (st == ZERO_OK)
        st = P > 1 ? gpt_cuda_workspace_create_tp(&ws, cfg, B_, T_, m->dt, &m->o, cs, m->recompute ? &ck : NULL, 0,
                                                  L_, 1, world)
                   : gpt_cuda_workspace_create_opts(&ws, cfg, B_, T_, m->dt, &m->o, NULL, m->recompute ? &ck : NULL);
    if (st == ZERO_OK && split) {
        st = gpt_cuda_workspace_split_backward(ws);
        /* N(2C + 4C/P + 3C/P) elements of the activation type per block (one slot) */
        const size_t act = m->o.act_dtype == ZERO_BF16 ? 2 : sizeof(float), C = (size_t)cfg->d_model;
        const size_t want = act * L_ * N_ * (2 * C + 4 * C / (size_t)P + 3 * C / (size_t)P);
        CHECK_MSG(st != ZERO_OK || gpt_cuda_workspace_wstash_bytes(ws) == want, "%s: W stash %zu bytes, %zu expected",
                  m->name, gpt_cuda_workspace_wstash_bytes(ws), want);
    }
    for (int mb = 0; mb < 2 && st == ZERO_OK; mb++) {
        st = gpt_cuda_forward(ws, tok + mb * N_, tgt + mb * N_, p, &loss[mb]);
        if (st == ZERO_OK) st = split ? split_backward(ws, cfg, p, g) : gpt_cuda_backward(ws, 1.0f, p, g);
    }
    if (st == ZERO_OK) st = gpt_cuda_workspace_sync(ws);
    CHECK_MSG(st == ZERO_OK, "%s (%s%s): %s", m->name, P > 1 ? "tp" : "reference", split ? ", split backward" : "",
              gpt_last_error());
    if (st == ZERO_OK && P > 1 && m->recompute) { /* W reads the activations: a recomputed block has none kept */
        st = gpt_cuda_workspace_split_backward(ws);
        CHECK_MSG(st == ZERO_UNSUPPORTED && strstr(gpt_last_error(), "block 0 is recomputed"),
                  "split backward at tp %d with recomputed blocks: %s: %s", P, zero_status_name(st), gpt_last_error());
        st = ZERO_OK;
    }
    gpt_cuda_workspace_destroy(ws);
    if (zs) CHECK_OK(zero_comm_set_stream(world, NULL));
    zero_stream_destroy(zs);
    zero_device_destroy(zd);
    if (cs) cudaStreamDestroy(cs);

    dget(hg, dg, total * es);
    off = 0;
    size_t foff = 0;
    memset(gfull, 0, sizeof(float) * gpt_param_elements(cfg));
    for (size_t i = 0; i < np; i++) {
        tp_param_info ti;
        tp_param_info_get(cfg, P, P > 1 ? rank : 0, i, &ti);
        for (size_t j = 0; j < ti.numel; j++)
            shard[off + j] = m->dt == ZERO_BF16 ? zero_bf16_to_f32(((uint16_t *)hg)[off + j]) : ((float *)hg)[off + j];
        tp_param_unslice(&ti, P, P > 1 ? rank : 0, shard + off, gfull + foff);
        off += ti.numel, foff += ti.full.numel;
    }
    dfree(dp), dfree(dg), free(hp), free(hg), free(shard);
    return st == ZERO_OK ? 0 : -1;
}

/* The split tensors' gradients summed over the world (the gather; every
 * element comes from one rank); the replicated ones kept as they are. */
static int gather(const gpt_config *cfg, int P, float *gfull)
{
    const size_t total = gpt_param_elements(cfg);
    float *split = calloc(total, sizeof(float));
    void *d = dalloc(total * sizeof(float));
    if (!split || !d) return -1;
    size_t foff = 0;
    for (size_t i = 0; i < gpt_num_params(cfg); i++) {
        tp_param_info ti;
        tp_param_info_get(cfg, P, rank, i, &ti);
        if (ti.split != TP_REPLICATED) memcpy(split + foff, gfull + foff, sizeof(float) * ti.full.numel);
        foff += ti.full.numel;
    }
    dput(d, split, total * sizeof(float));
    zero_status st = zero_allreduce(world, d, d, total, ZERO_F32, ZERO_SUM);
    CHECK_MSG(st == ZERO_OK, "gathering the shards: %s", zero_last_error());
    dget(split, d, total * sizeof(float));
    foff = 0;
    for (size_t i = 0; i < gpt_num_params(cfg); i++) {
        tp_param_info ti;
        tp_param_info_get(cfg, P, rank, i, &ti);
        if (ti.split != TP_REPLICATED) memcpy(gfull + foff, split + foff, sizeof(float) * ti.full.numel);
        foff += ti.full.numel;
    }
    dfree(d), free(split);
    return st == ZERO_OK ? 0 : -1;
}

static void compare(const gpt_config *cfg, const mode *m, const float *got, const float *ref)
{
    size_t foff = 0;
    double worst_rel = 0;
    for (size_t i = 0; i < gpt_num_params(cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(cfg, i, &info);
        const gpt_test_diff r = gpt_test_diff_of(got + foff, ref + foff, info.numel, 2e-5, 1e-4);
        CHECK_MSG(r.scale > 0, "%s: %s: the reference gradient is zero", m->name, info.name);
        if (m->loose) {
            worst_rel = fmax(worst_rel, r.l2);
            CHECK_MSG(r.l2 <= 2e-2, "%s: %s: relative L2 error %.3g > 2e-2", m->name, info.name, r.l2);
        } else {
            worst_rel = fmax(worst_rel, r.scale > 0 ? r.worst / r.scale : 0);
            CHECK_MSG(r.outside == 0, "%s: %s: %zu elements outside 2e-5 x %.3g + 1e-4 |ref| (max abs diff %.3g)",
                      m->name, info.name, r.outside, r.scale, r.worst);
        }
        foff += info.numel;
    }
    if (rank == 0)
        printf("%s: every gradient within bounds; worst %s %.3g\n", m->name,
               m->loose ? "relative L2" : "abs diff / max|ref|", worst_rel);
}

static void refusals(const gpt_config *cfg)
{
    const gpt_cuda_options o = {GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_UNFUSED};
    gpt_cuda_workspace *ws = NULL;
    zero_comm *host = NULL;
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT; /* MPI: host buffers */
    cc.timeout_s = 60;
    if (zero_comm_create_world(&host, &cc) == ZERO_OK) {
        zero_status st = gpt_cuda_workspace_create_tp(&ws, cfg, B_, T_, ZERO_F32, &o, NULL, NULL, 0, L_, 1, host);
        CHECK_MSG(st == ZERO_INVALID_ARGUMENT && !ws && strstr(gpt_last_error(), "takes host buffers"),
                  "an MPI tp comm: %s: %s", zero_status_name(st), gpt_last_error());
        zero_comm_destroy(host);
    }
    cudaStream_t other;
    zero_device *zd = NULL;
    zero_stream *zs = NULL;
    if (cudaStreamCreate(&other) != cudaSuccess) return;
    CHECK_OK(zero_device_create(&zd, ZERO_DEVICE_CUDA, 0));
    CHECK_OK(zero_stream_wrap_cuda(zd, other, &zs));
    CHECK_OK(zero_comm_set_stream(world, zs));
    zero_status st = gpt_cuda_workspace_create_tp(&ws, cfg, B_, T_, ZERO_F32, &o, NULL, NULL, 0, L_, 1, world);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT && !ws && strstr(gpt_last_error(), "another stream"),
              "a tp comm on another stream: %s: %s", zero_status_name(st), gpt_last_error());
    CHECK_OK(zero_comm_set_stream(world, NULL));
    zero_stream_destroy(zs);
    zero_device_destroy(zd);
    cudaStreamDestroy(other);
}
#endif

int main(void)
{
    if (!gpt_cuda_available()) CHECK_SKIP("no CUDA GPU visible (or this build has no CUDA path)");
#if ZERO_HAVE_CUDA
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT;
    cc.timeout_s = 60;
    cc.backend = ZERO_BACKEND_STAGED;
    cc.device = 0; /* every rank on GPU 0 */
    zero_status st = zero_comm_create_world(&world, &cc);
    if (st == ZERO_UNSUPPORTED) CHECK_SKIP("STAGED backend: %s", zero_last_error());
    if (st != ZERO_OK) {
        fprintf(stderr, "STAGED world: %s\n", zero_last_error());
        return 1;
    }
    rank = zero_comm_get_rank(world), size = zero_comm_get_size(world);
    check_set_rank(rank);
    const gpt_config cfg = {.n_layer = L_, .n_head = 4, .d_model = 64, .seq_len = T_, .vocab = V_};
    const size_t total = gpt_param_elements(&cfg);
    float *full = malloc(sizeof(float) * total), *gref = malloc(sizeof(float) * total),
          *gtp = malloc(sizeof(float) * total), *gsplit = malloc(sizeof(float) * total);
    int32_t tok[2 * N_], tgt[2 * N_];
    size_t off = 0;
    for (size_t i = 0; i < gpt_num_params(&cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(&cfg, i, &info);
        gpt_param_init(&cfg, &info, 7, full + off);
        for (size_t j = 0; j < info.numel; j++) full[off + j] += 0.05f * sinf(0.7f * (float)(off + j) + (float)i);
        off += info.numel;
    }
    for (int i = 0; i < 2 * N_; i++) tok[i] = (i * 37 + 11) % V_, tgt[i] = (i * 53 + 3) % V_;
    tgt[5] = -1; /* an ignored target */
    const mode modes[] = {
        {"fp32, unfused, host-ordered all-reduces", ZERO_F32, {GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_UNFUSED},
         0, 0, 0},
        {"fp32, flash, every block recomputed, stream-ordered all-reduces", ZERO_F32,
         {GPT_CUDA_MATH_FP32, ZERO_F32, GPT_CUDA_ATTN_FLASH}, 1, 1, 0},
        {"bf16 params, bf16 math, fp32 activations", ZERO_BF16, {GPT_CUDA_MATH_BF16, ZERO_F32, GPT_CUDA_ATTN_UNFUSED},
         0, 0, 1},
        {"bf16 activations (flash, bf16 math), fp32 params", ZERO_F32, GPT_CUDA_OPTIONS_BF16, 0, 0, 1},
    };
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        const mode *m = &modes[k];
        float lref[2] = {0, 0}, ltp[2] = {0, 0};
        if (run(&cfg, full, m, 1, 0, tok, tgt, gref, lref) != 0 || run(&cfg, full, m, size, 0, tok, tgt, gtp, ltp) != 0)
            continue;
        if (size > 1 && !m->recompute) { /* B then W at tp P against the unsplit tp run, this rank's shards */
            float lsp[2] = {0, 0};
            if (run(&cfg, full, m, size, 1, tok, tgt, gsplit, lsp) == 0) {
                CHECK_MSG(lsp[0] == ltp[0] && lsp[1] == ltp[1], "%s: split run's losses %.9g %.9g, unsplit %.9g %.9g",
                          m->name, lsp[0], lsp[1], ltp[0], ltp[1]);
                int bw = gpt_test_compare_grads(&cfg, m->name, "B then W at tp is not bitwise the unsplit tp backward",
                                                gsplit, gtp, m->dt == ZERO_BF16 ? 1.0 / 128 : 0.0);
                if (rank == 0) printf("%s: split backward at tp %d: %d weight gradients bitwise\n", m->name, size, bw);
            }
        }
        if (size > 1 && gather(&cfg, size, gtp) != 0) continue;
        const double ltol = m->loose ? 5e-3 : 1e-5;
        for (int mb = 0; mb < 2; mb++)
            CHECK_MSG(fabs(ltp[mb] - lref[mb]) <= ltol * fabs(lref[mb]),
                      "%s: micro-batch %d loss %.9g at tp %d vs %.9g (tolerance %g relative)", m->name, mb, ltp[mb],
                      size, lref[mb], ltol);
        if (rank == 0)
            printf("%s: tp %d losses %.7f %.7f, reference %.7f %.7f\n", m->name, size, ltp[0], ltp[1], lref[0],
                   lref[1]);
        compare(&cfg, m, gtp, gref);
    }
    if (size > 1) refusals(&cfg);
    free(full), free(gref), free(gtp), free(gsplit);
    zero_comm_destroy(world);
#endif
    return check_exit();
}
