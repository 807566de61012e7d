/* Test driver for the MoE FFN (model/moe.h) against PyTorch
 * (tests/python/test_moe_vs_torch.py), one rank, every expert local.
 *
 *   moe_driver IN OUT
 *
 * IN (little-endian): "MOE1", i32 d_model d_ff experts top_k tokens, f32
 * capacity_factor aux_loss_coef dloss, then fp32 gate_w (E x C), fc_w
 * (E x H x C), fc_b (E x H), proj_w (E x C x H), proj_b (E x C), x, init and
 * dout (N x C each).
 * OUT: f32 aux, out (N x C), i32 expert and slot (N x K each), f32 weight
 * (N x K), dx (N x C), then the gradients of gate_w, fc_w, fc_b, proj_w,
 * proj_b. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_io.h"
#include "gpt.h"
#include "moe.h"

int main(int argc, char **argv)
{
    const char *me = "moe_driver", *out_path;
    int rc;
    FILE *in = driver_open_input(argc, argv, me, &out_path, &rc);
    if (!in) return rc;
    char magic[4];
    int32_t h[5];
    float fl[3];
    if (driver_read(in, magic, 4, me, "magic") || memcmp(magic, "MOE1", 4) ||
        driver_read(in, h, sizeof h, me, "header") || driver_read(in, fl, sizeof fl, me, "header")) {
        fprintf(stderr, "moe_driver: %s is not a MOE1 file\n", argv[1]);
        return 1;
    }
    gpt_moe_config c = {h[0], h[1], h[2], h[3], fl[0], fl[1]};
    size_t C = h[0], H = h[1], E = h[2], K = h[3], N = h[4];
    float dloss = fl[2];
    float *gate = driver_read_floats(in, E * C, me, "gate_w"), *fc_w = driver_read_floats(in, E * H * C, me, "fc_w");
    float *fc_b = driver_read_floats(in, E * H, me, "fc_b"), *proj_w = driver_read_floats(in, E * C * H, me, "proj_w");
    float *proj_b = driver_read_floats(in, E * C, me, "proj_b"), *x = driver_read_floats(in, N * C, me, "x");
    float *init = driver_read_floats(in, N * C, me, "init"), *dout = driver_read_floats(in, N * C, me, "dout");
    fclose(in);
    if (!gate || !fc_w || !fc_b || !proj_w || !proj_b || !x || !init || !dout) return 1;
    gpt_moe *m = NULL;
    if (gpt_moe_create(&m, &c, (int)N, NULL) != ZERO_OK) {
        fprintf(stderr, "moe_driver: %s\n", gpt_last_error());
        return 1;
    }
    gpt_moe_params p = {gate, fc_w, fc_b, proj_w, proj_b};
    gpt_moe_params g = {calloc(E * C, 4), calloc(E * H * C, 4), calloc(E * H, 4), calloc(E * C * H, 4),
                        calloc(E * C, 4)};
    float *out = malloc(N * C * 4), *dx = malloc(N * C * 4), aux = 0;
    if (gpt_moe_forward(m, x, init, out, &p, &aux) != ZERO_OK ||
        gpt_moe_backward(m, dloss, x, dout, dx, &p, &g) != ZERO_OK) {
        fprintf(stderr, "moe_driver: %s\n", gpt_last_error());
        return 1;
    }
    gpt_moe_routing r;
    gpt_moe_get_routing(m, &r);
    FILE *o = fopen(out_path, "wb");
    if (!o) {
        perror(out_path);
        return 1;
    }
    fwrite(&aux, 4, 1, o);
    fwrite(out, 4, N * C, o);
    fwrite(r.expert, 4, N * K, o);
    fwrite(r.slot, 4, N * K, o);
    fwrite(r.weight, 4, N * K, o);
    fwrite(dx, 4, N * C, o);
    fwrite(g.gate_w, 4, E * C, o);
    fwrite(g.fc_w, 4, E * H * C, o);
    fwrite(g.fc_b, 4, E * H, o);
    fwrite(g.proj_w, 4, E * C * H, o);
    fwrite(g.proj_b, 4, E * C, o);
    if (fclose(o)) return 1;
    gpt_moe_destroy(m);
    return 0;
}
