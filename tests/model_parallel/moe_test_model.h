/* The MoE tests' model: every parameter and gradient of a gpt_config as
 * plain host arrays, initialised as the library does (gpt_param_init_ep:
 * ep rank `ep_rank`'s slice of each expert stack), optionally only the
 * tensors that pipeline stage `pp_rank` of `pp` holds. Shared by
 * test_gpt_moe.c and test_pp_moe.c. */
#ifndef ZERO_TESTS_MOE_TEST_MODEL_H
#define ZERO_TESTS_MOE_TEST_MODEL_H

#include <stdlib.h>

#include "gpt.h"
#include "pp_gpt.h"

typedef struct model {
    gpt_config cfg;
    int nmod;
    gpt_tensors *p, *g;
} model;

/* pp <= 1: every tensor. Gradients start at zero. */
static inline void model_init_stage(model *m, gpt_config cfg, uint64_t seed, int ep_rank, int pp, int pp_rank)
{
    m->cfg = cfg;
    m->nmod = gpt_num_modules(&cfg);
    m->p = calloc((size_t)m->nmod, sizeof *m->p);
    m->g = calloc((size_t)m->nmod, sizeof *m->g);
    for (size_t i = 0; i < gpt_num_params(&cfg); i++) {
        gpt_param_info pi;
        gpt_param_info_get(&cfg, i, &pi);
        if (pp > 1 && !pp_stage_holds(&cfg, pp, pp_rank, pi.module, pi.index)) continue;
        float *v = malloc(pi.numel * 4);
        gpt_param_init_ep(&pi, seed, ep_rank, v);
        m->p[pi.module].t[pi.index] = v;
        m->g[pi.module].t[pi.index] = calloc(pi.numel, 4);
    }
}

static inline void model_free(model *m)
{
    for (int k = 0; k < m->nmod; k++)
        for (int i = 0; i < GPT_MAX_MODULE_TENSORS; i++) free(m->p[k].t[i]), free(m->g[k].t[i]);
    free(m->p), free(m->g);
}

#endif
