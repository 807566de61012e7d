/* The MoE layer tests' model and tokens (test_moe.c: expert parallel vs one
 * rank; test_moe_cuda.c: the CUDA layer vs the CPU layer): every expert's
 * weights and every rank's tokens from fixed seeds, so both tests build the
 * same layer and the same inputs from one copy. */
#ifndef ZERO_TESTS_MOE_LAYER_TEST_H
#define ZERO_TESTS_MOE_LAYER_TEST_H

#include <stdint.h>
#include <stdlib.h>

#include "moe.h"

static inline float moe_test_urand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

/* n values uniform in [-scale/2, scale/2) from seed. */
static inline void moe_test_fill(float *p, size_t n, uint64_t seed, float scale)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) p[i] = scale * moe_test_urand(&s);
}

/* All E experts of a layer on the host, and their gradients (zeroed). */
typedef struct moe_test_model {
    float *gate, *fc_w, *fc_b, *proj_w, *proj_b;
    float *g_gate, *g_fc_w, *g_fc_b, *g_proj_w, *g_proj_b;
} moe_test_model;

/* fill_values: the weights from seeds 11..15 (the router's wider, so its
 * probabilities are far from ties); otherwise zero. */
static inline void moe_test_model_alloc(moe_test_model *f, const gpt_moe_config *c, int fill_values)
{
    size_t E = c->experts, C = c->d_model, H = c->d_ff;
    f->gate = calloc(E * C, 4), f->fc_w = calloc(E * H * C, 4), f->fc_b = calloc(E * H, 4);
    f->proj_w = calloc(E * C * H, 4), f->proj_b = calloc(E * C, 4);
    f->g_gate = calloc(E * C, 4), f->g_fc_w = calloc(E * H * C, 4), f->g_fc_b = calloc(E * H, 4);
    f->g_proj_w = calloc(E * C * H, 4), f->g_proj_b = calloc(E * C, 4);
    if (!fill_values) return;
    moe_test_fill(f->gate, E * C, 11, 2.0f);
    moe_test_fill(f->fc_w, E * H * C, 12, 0.5f);
    moe_test_fill(f->fc_b, E * H, 13, 0.1f);
    moe_test_fill(f->proj_w, E * C * H, 14, 0.5f);
    moe_test_fill(f->proj_b, E * C, 15, 0.1f);
}

static inline void moe_test_model_free(moe_test_model *f)
{
    free(f->gate), free(f->fc_w), free(f->fc_b), free(f->proj_w), free(f->proj_b);
    free(f->g_gate), free(f->g_fc_w), free(f->g_fc_b), free(f->g_proj_w), free(f->g_proj_b);
}

/* Views of experts [first, ...) of f (the router whole). */
static inline void moe_test_view(const moe_test_model *f, const gpt_moe_config *c, int first, gpt_moe_params *p,
                                 gpt_moe_params *g)
{
    size_t C = c->d_model, H = c->d_ff, e = (size_t)first;
    *p = (gpt_moe_params){f->gate, f->fc_w + e * H * C, f->fc_b + e * H, f->proj_w + e * C * H, f->proj_b + e * C};
    *g = (gpt_moe_params){f->g_gate, f->g_fc_w + e * H * C, f->g_fc_b + e * H, f->g_proj_w + e * C * H,
                          f->g_proj_b + e * C};
}

/* Every rank's N x d_model tokens, rank r's at r * N * d_model: the layer's
 * input x, the residual init and the output gradient dout (seeds 100 + r,
 * 200 + r, 300 + r). Freed by the caller. */
static inline void moe_test_tokens(const gpt_moe_config *c, int N, int ranks, float **x, float **init, float **dout)
{
    size_t NC = (size_t)N * c->d_model;
    *x = malloc(NC * 4 * (size_t)ranks), *init = malloc(NC * 4 * (size_t)ranks), *dout = malloc(NC * 4 * (size_t)ranks);
    for (int r = 0; r < ranks; r++) {
        moe_test_fill(*x + r * NC, NC, 100 + r, 2.0f);
        moe_test_fill(*init + r * NC, NC, 200 + r, 1.0f);
        moe_test_fill(*dout + r * NC, NC, 300 + r, 1.0f);
    }
}

#endif
