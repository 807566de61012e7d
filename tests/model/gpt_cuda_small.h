/* The model and data that the CUDA GPT's split-backward, pipeline-stage
 * workspace and pipeline-stage tests share (test_gpt_cuda_split.c,
 * test_gpt_cuda_stage.c, test_pp_stage_cuda.c): one copy of the set-up each
 * of them wrote out.
 *
 * 2 blocks, 4 heads, d_model 64, seq 40, batch 3, vocab 256; GPT-2's init
 * from seed 7 (gpt_test_init_params); `micro_batches` micro-batches of
 * batch x seq tokens (i x 37 + 11) mod 256 with targets (i x 53 + 3) mod 256,
 * i counting through all of them; two gradient buffers for the two runs each
 * test compares. Host memory only: the tests put it on the device
 * themselves (gpt_test_dev_init). */
#ifndef ZERO_TESTS_MODEL_GPT_CUDA_SMALL_H
#define ZERO_TESTS_MODEL_GPT_CUDA_SMALL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt.h"
#include "gpt_test_params.h"

#define GPT_SMALL_L 2  /* blocks */
#define GPT_SMALL_B 3  /* batch (sequences per micro-batch) */
#define GPT_SMALL_T 40 /* sequence length */

typedef struct gpt_small {
    gpt_config cfg;
    size_t total;        /* gpt_param_elements(&cfg) */
    float *params;       /* total: the initial parameters, fp32 */
    float *gref, *gtest; /* total each: the reference run's gradients, the tested run's */
    int32_t *tok, *tgt;  /* micro-batches x batch x seq */
} gpt_small;

static inline void gpt_small_free(gpt_small *s)
{
    free(s->params), free(s->gref), free(s->gtest), free(s->tok), free(s->tgt);
    memset(s, 0, sizeof *s);
}

/* 0; -1 (a failed check recorded, s freed) when the host memory is not there. */
static inline int gpt_small_init(gpt_small *s, int micro_batches)
{
    const gpt_config cfg = {.n_layer = GPT_SMALL_L, .n_head = 4, .d_model = 64, .seq_len = GPT_SMALL_T, .vocab = 256};
    const int n = micro_batches * GPT_SMALL_B * GPT_SMALL_T;
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->total = gpt_param_elements(&s->cfg);
    s->params = gpt_test_init_params(&s->cfg, 7);
    s->gref = malloc(s->total * sizeof(float)), s->gtest = malloc(s->total * sizeof(float));
    s->tok = malloc(n * sizeof(int32_t)), s->tgt = malloc(n * sizeof(int32_t));
    if (!s->params || !s->gref || !s->gtest || !s->tok || !s->tgt) {
        CHECK_MSG(0, "gpt_small_init: no host memory for %zu parameters and %d tokens", s->total, n);
        gpt_small_free(s);
        return -1;
    }
    for (int i = 0; i < n; i++) s->tok[i] = (i * 37 + 11) % 256, s->tgt[i] = (i * 53 + 3) % 256;
    return 0;
}

#endif
