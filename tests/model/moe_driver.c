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

#include "gpt.h"
#include "moe.h"

static float *read_floats(FILE *f, size_t n)
{
    float *p = malloc(n * sizeof *p + 4);
    if (p && fread(p, sizeof *p, n, f) != n) {
        free(p);
        return NULL;
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: moe_driver IN OUT\n");
        return 2;
    }
    FILE *in = fopen(argv[1], "rb");
    if (!in) {
        perror(argv[1]);
        return 1;
    }
    char magic[4];
    int32_t h[5];
    float fl[3];
    if (fread(magic, 1, 4, in) != 4 || memcmp(magic, "MOE1", 4) || fread(h, 4, 5, in) != 5 || fread(fl, 4, 3, in) != 3) {
        fprintf(stderr, "moe_driver: %s is not a MOE1 file\n", argv[1]);
        return 1;
    }
    gpt_moe_config c = {h[0], h[1], h[2], h[3], fl[0], fl[1]};
    size_t C = h[0], H = h[1], E = h[2], K = h[3], N = h[4];
    float dloss = fl[2];
    float *gate = read_floats(in, E * C), *fc_w = read_floats(in, E * H * C), *fc_b = read_floats(in, E * H);
    float *proj_w = read_floats(in, E * C * H), *proj_b = read_floats(in, E * C);
    float *x = read_floats(in, N * C), *init = read_floats(in, N * C), *dout = read_floats(in, N * C);
    fclose(in);
    if (!gate || !fc_w || !fc_b || !proj_w || !proj_b || !x || !init || !dout) {
        fprintf(stderr, "moe_driver: short input\n");
        return 1;
    }
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
    FILE *o = fopen(argv[2], "wb");
    if (!o) {
        perror(argv[2]);
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
