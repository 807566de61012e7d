/* The MoE layer's CUDA backend (gpt_moe_create_cuda, model/moe_cuda.cu)
 * against the CPU layer (the reference), on a GPU.
 *
 *   test_moe_cuda          ep 1 (no comm): the CUDA layer vs the CPU layer
 *   test_moe_cuda staged   under mpirun with P ranks sharing GPU 0 through a
 *                          STAGED world comm: the CUDA layer with ep = world
 *                          (E/P experts a rank, device-buffer all-to-all-v)
 *                          vs the single-rank CPU layer on every rank's tokens
 *
 * Asserted, per configuration (top-1 with dropping, top-2 with dropping,
 * top-3 unlimited), fp32 matmuls:
 *   - routing identical: every choice's expert and slot, the dropped count
 *     (the slots come from the same host code, moe_route.c; the experts from
 *     the device's softmax + top-k: random logits are far from ties);
 *   - weights within 1e-5 relative, the aux loss within 1e-5 relative;
 *   - out, d x, this rank's expert gradients (summed over every rank's
 *     tokens on the CPU side) and the router's gradient (this rank's tokens)
 *     within |gpu - cpu| <= 1e-4 max|cpu| + 1e-3 |cpu| elementwise: both
 *     sides are fp32, only the summation order (cuBLAS blocking) and expf
 *     differ (~1e-6 relative), as tests/model/test_gpt_cuda.c.
 * Skips (77) without a GPU in a CUDA build. In a build without CUDA it
 * asserts that gpt_moe_create_cuda is refused with ZERO_UNSUPPORTED and a
 * message naming the missing CUDA path. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/comm.h>

#include "check.h"
#include "gpt.h"
#include "gpt_test_params.h"
#include "moe.h"
#include "moe_layer_test.h"
#include "zero_build_config.h"

#if ZERO_HAVE_CUDA
#include <cuda_runtime_api.h>

static int rank, size;
static zero_comm *world;

static float *to_dev(const float *h, size_t n)
{
    float *d = NULL;
    if (cudaMalloc((void **)&d, n * 4 + 4) != cudaSuccess) return NULL;
    if (h)
        cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice);
    else
        cudaMemset(d, 0, n * 4);
    return d;
}

static void from_dev(float *h, const float *d, size_t n) { cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost); }

/* gpt_test_compare of a device array */
static void compare(const char *what, const float *gpu_dev, const float *cpu, size_t n)
{
    float *gpu = malloc(n * 4 + 4);
    from_dev(gpu, gpu_dev, n);
    gpt_test_compare(what, gpu, cpu, n, rank == 0);
    free(gpu);
}

static void run_case(int E, int K, float cf, int N)
{
    gpt_moe_config c = {.d_model = 24, .d_ff = 40, .experts = E, .top_k = K, .capacity_factor = cf,
                        .aux_loss_coef = 0.01f};
    size_t C = c.d_model, H = c.d_ff, NC = (size_t)N * C, El = (size_t)E / size, e0 = (size_t)rank * El;
    if (rank == 0) printf("E %d top-%d capacity_factor %g, %d tokens a rank, ep %d\n", E, K, (double)cf, N, size);
    /* the whole model and every rank's tokens, from seeds (as tests/model_parallel/test_moe.c) */
    moe_test_model f;
    moe_test_model_alloc(&f, &c, 1);
    float *x, *init, *dout;
    moe_test_tokens(&c, N, size, &x, &init, &dout);

    /* CPU reference: all experts, every rank's tokens; the router's gradient of this rank's tokens apart */
    float *g_gate_own = calloc(E * C, 4);
    float *out_ref = malloc(NC * 4), *dx_ref = malloc(NC * 4), *o = malloc(NC * 4), *d = malloc(NC * 4);
    float aux_ref = 0, *w_ref = malloc(sizeof(float) * N * K);
    int32_t *exp_ref = malloc(sizeof(int32_t) * N * K), *slot_ref = malloc(sizeof(int32_t) * N * K);
    long drop_ref = 0;
    gpt_moe *cpu = NULL;
    CHECK_OK(gpt_moe_create(&cpu, &c, N, NULL));
    gpt_moe_params p, g_all;
    moe_test_view(&f, &c, 0, &p, &g_all);
    for (int r = 0; r < size; r++) {
        gpt_moe_params g = g_all;
        if (r == rank) g.gate_w = g_gate_own;
        float aux = 0;
        CHECK_OK(gpt_moe_forward(cpu, x + r * NC, init + r * NC, o, &p, &aux));
        CHECK_OK(gpt_moe_backward(cpu, 1.0f, x + r * NC, dout + r * NC, d, &p, &g));
        if (r != rank) continue;
        gpt_moe_routing rt;
        gpt_moe_get_routing(cpu, &rt);
        memcpy(exp_ref, rt.expert, sizeof(int32_t) * N * K), memcpy(slot_ref, rt.slot, sizeof(int32_t) * N * K);
        memcpy(w_ref, rt.weight, sizeof(float) * N * K);
        drop_ref = rt.dropped, aux_ref = aux;
        memcpy(out_ref, o, NC * 4), memcpy(dx_ref, d, NC * 4);
    }
    gpt_moe_destroy(cpu);

    /* the CUDA layer: this rank's experts and tokens, device buffers */
    float *dgate = to_dev(f.gate, E * C), *dfc_w = to_dev(f.fc_w + e0 * H * C, El * H * C);
    float *dfc_b = to_dev(f.fc_b + e0 * H, El * H), *dproj_w = to_dev(f.proj_w + e0 * C * H, El * C * H);
    float *dproj_b = to_dev(f.proj_b + e0 * C, El * C);
    float *gg = to_dev(NULL, E * C), *gfc_w = to_dev(NULL, El * H * C), *gfc_b = to_dev(NULL, El * H);
    float *gproj_w = to_dev(NULL, El * C * H), *gproj_b = to_dev(NULL, El * C);
    float *dx_in = to_dev(x + rank * NC, NC), *dinit = to_dev(init + rank * NC, NC);
    float *ddout = to_dev(dout + rank * NC, NC), *dout_buf = to_dev(NULL, NC), *ddx = to_dev(NULL, NC);
    CHECK(dgate && dfc_w && dfc_b && dproj_w && dproj_b && gg && gfc_w && gfc_b && gproj_w && gproj_b && dx_in &&
          dinit && ddout && dout_buf && ddx);
    gpt_moe *m = NULL;
    CHECK_OK(gpt_moe_create_cuda(&m, &c, N, size > 1 ? world : NULL, NULL));
    if (m) {
        int first = -1, count = -1;
        gpt_moe_local_experts(m, &first, &count);
        CHECK(first == (int)e0 && count == (int)El);
        gpt_moe_params dp = {dgate, dfc_w, dfc_b, dproj_w, dproj_b}, dg = {gg, gfc_w, gfc_b, gproj_w, gproj_b};
        float aux = -1;
        CHECK_OK(gpt_moe_forward(m, dx_in, dinit, dout_buf, &dp, &aux));
        gpt_moe_routing rt;
        gpt_moe_get_routing(m, &rt);
        int same = 1;
        double wworst = 0;
        for (int q = 0; q < N * K; q++) {
            same &= rt.expert[q] == exp_ref[q] && rt.slot[q] == slot_ref[q];
            wworst = fmax(wworst, fabs((double)rt.weight[q] - w_ref[q]) / fabs(w_ref[q]));
        }
        CHECK_MSG(same && rt.dropped == drop_ref, "routing differs from the CPU's (dropped %ld vs %ld)", rt.dropped,
                  drop_ref);
        CHECK_MSG(wworst <= 1e-5, "routing weights: relative error %.3g > 1e-5", wworst);
        CHECK_MSG(fabs(aux - aux_ref) <= 1e-5 * fabs(aux_ref), "aux loss %.8g vs the CPU's %.8g", (double)aux,
                  (double)aux_ref);
        if (rank == 0) printf("  routing identical (%ld dropped), aux %.7g vs %.7g\n", drop_ref, (double)aux,
                              (double)aux_ref);
        compare("out", dout_buf, out_ref, NC);
        CHECK_OK(gpt_moe_backward(m, 1.0f, dx_in, ddout, ddx, &dp, &dg));
        compare("d x", ddx, dx_ref, NC);
        compare("d gate", gg, g_gate_own, E * C);
        compare("d fc_w", gfc_w, f.g_fc_w + e0 * H * C, El * H * C);
        compare("d fc_b", gfc_b, f.g_fc_b + e0 * H, El * H);
        compare("d proj_w", gproj_w, f.g_proj_w + e0 * C * H, El * C * H);
        compare("d proj_b", gproj_b, f.g_proj_b + e0 * C, El * C);
        /* in place: out == init gives the same output */
        CHECK_OK(gpt_moe_forward(m, dx_in, dinit, dinit, &dp, NULL));
        compare("out (in place)", dinit, out_ref, NC);
    }
    gpt_moe_destroy(m);
    float *devs[] = {dgate, dfc_w, dfc_b, dproj_w, dproj_b, gg, gfc_w, gfc_b, gproj_w, gproj_b, dx_in, dinit,
                     ddout, dout_buf, ddx};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) cudaFree(devs[i]);
    moe_test_model_free(&f), free(x), free(init), free(dout), free(g_gate_own);
    free(out_ref), free(dx_ref), free(o), free(d), free(w_ref), free(exp_ref), free(slot_ref);
}

int main(int argc, char **argv)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) CHECK_SKIP("no CUDA device");
    int staged = argc > 1 && !strcmp(argv[1], "staged");
    size = 1;
    if (staged) {
        int rc = gpt_test_staged_world(&world, &rank, &size);
        if (rc) return rc;
    }
    run_case(4 * size, 1, 1.0f, 37);  /* top-1, capacity 10 of 37: drops */
    run_case(4 * size, 2, 0.75f, 40); /* top-2 with dropping */
    run_case(2 * size + 2, 3, 0.0f, 29); /* top-3 unlimited */
    zero_comm_destroy(world);
    return check_exit();
}
#else
int main(void)
{
    gpt_moe_config c = {.d_model = 8, .d_ff = 16, .experts = 4, .top_k = 2, .capacity_factor = 1.0f,
                        .aux_loss_coef = 0.01f};
    gpt_moe *m = (gpt_moe *)&c;
    zero_status st = gpt_moe_create_cuda(&m, &c, 16, NULL, NULL);
    CHECK_MSG(st == ZERO_UNSUPPORTED && m == NULL && strstr(gpt_last_error(), "no CUDA path"),
              "gpt_moe_create_cuda without CUDA: %s: %s", zero_status_name(st), gpt_last_error());
    return check_exit();
}
#endif
