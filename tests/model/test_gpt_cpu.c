/* Unit tests of the CPU GPT that need no PyTorch: the parameter list, the
 * initialisation, the API's order and argument checks, gradient
 * accumulation and scaling, and a finite-difference check of every
 * parameter's gradient (the torch comparison is tests/python/test_model_vs_torch.py). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpt.h"
#include "moe.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct model {
    gpt_config cfg;
    size_t total;
    float *params, *grads;
    gpt_tensors *p, *g;
} model;

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static float uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void model_init(model *m, gpt_config cfg)
{
    m->cfg = cfg;
    m->total = gpt_param_elements(&cfg);
    m->params = malloc(sizeof(float) * m->total);
    m->grads = calloc(m->total, sizeof(float));
    m->p = calloc(gpt_num_modules(&cfg), sizeof *m->p);
    m->g = calloc(gpt_num_modules(&cfg), sizeof *m->g);
    size_t off = 0;
    for (size_t i = 0; i < gpt_num_params(&cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(&cfg, i, &info);
        for (size_t j = 0; j < info.numel; j++)
            m->params[off + j] = info.init == GPT_INIT_ONES ? 1.0f + 0.1f * uniform() : 0.1f * uniform();
        m->p[info.module].t[info.index] = m->params + off;
        m->g[info.module].t[info.index] = m->grads + off;
        off += info.numel;
    }
}

static void model_free(model *m)
{
    free(m->params), free(m->grads), free(m->p), free(m->g);
}

/* ------------------------------------------------------------ parameter list */
static void test_param_list(void)
{
    gpt_config cfg = {.n_layer = 3, .n_head = 4, .d_model = 48, .seq_len = 20, .vocab = 256};
    size_t C = 48, expected = 256 * C + 20 * C + 3 * (12 * C * C + 13 * C) + 2 * C;
    CHECK(gpt_num_params(&cfg) == 2 + 12 * 3 + 2);
    CHECK(gpt_param_elements(&cfg) == expected);
    CHECK(gpt_num_modules(&cfg) == 5);
    gpt_param_info info;
    CHECK_OK(gpt_param_info_get(&cfg, 0, &info));
    CHECK(strcmp(info.name, "wte.weight") == 0 && info.shape[0] == 256 && info.shape[1] == C && info.module == 0);
    CHECK_OK(gpt_param_info_get(&cfg, gpt_param_position(&cfg, gpt_module_block(1), GPT_QKV_W), &info));
    CHECK(strcmp(info.name, "h.1.attn.c_attn.weight") == 0 && info.shape[0] == 3 * C && info.shape[1] == C);
    CHECK(info.module == 2 && info.index == GPT_QKV_W && info.init == GPT_INIT_NORMAL);
    CHECK_OK(gpt_param_info_get(&cfg, gpt_param_position(&cfg, gpt_module_block(2), GPT_FCPROJ_W), &info));
    CHECK(strcmp(info.name, "h.2.mlp.c_proj.weight") == 0 && info.shape[0] == C && info.shape[1] == 4 * C);
    CHECK_CLOSE(info.init_std, 0.02 / sqrt(6.0), 1e-6);  /* residual projection scaling */
    CHECK_OK(gpt_param_info_get(&cfg, gpt_num_params(&cfg) - 2, &info));
    CHECK(strcmp(info.name, "ln_f.weight") == 0 && info.init == GPT_INIT_ONES && info.module == 4);
    CHECK(gpt_param_info_get(&cfg, gpt_num_params(&cfg), &info) == ZERO_INVALID_ARGUMENT);
    char name[32];
    CHECK(strcmp(gpt_module_name(&cfg, 0, name, sizeof name), "embed") == 0);
    CHECK(strcmp(gpt_module_name(&cfg, 3, name, sizeof name), "block.2") == 0);
    CHECK(strcmp(gpt_module_name(&cfg, 4, name, sizeof name), "final") == 0);
    /* every parameter position round-trips */
    for (size_t i = 0; i < gpt_num_params(&cfg); i++) {
        gpt_param_info_get(&cfg, i, &info);
        CHECK(gpt_param_position(&cfg, info.module, info.index) == i);
    }
    /* FLOPs: 6 * (12 L C^2 + C V) + 12 L T C */
    CHECK_CLOSE(gpt_train_flops_per_token(&cfg, 20), 6.0 * (36.0 * C * C + C * 256.0) + 12.0 * 3 * 20 * C, 1e-12);

    gpt_config bad = {.n_layer = 2, .n_head = 5, .d_model = 32, .seq_len = 16, .vocab = 256};
    CHECK(gpt_config_validate(&bad) == ZERO_CONFIG);
    CHECK(strstr(gpt_last_error(), "n_head") != NULL);
    bad = (gpt_config){.n_layer = 0, .n_head = 2, .d_model = 32, .seq_len = 16, .vocab = 256};
    CHECK(gpt_config_validate(&bad) == ZERO_CONFIG);
    CHECK(strstr(gpt_last_error(), "n_layer") != NULL);
}

static void test_init(void)
{
    gpt_config cfg = {.n_layer = 2, .n_head = 2, .d_model = 64, .seq_len = 32, .vocab = 256};
    gpt_param_info info;
    gpt_param_info_get(&cfg, gpt_param_position(&cfg, gpt_module_block(0), GPT_FC_W), &info);
    float *a = malloc(sizeof(float) * info.numel), *b = malloc(sizeof(float) * info.numel);
    gpt_param_init(&cfg, &info, 7, a);
    gpt_param_init(&cfg, &info, 7, b);
    CHECK(memcmp(a, b, sizeof(float) * info.numel) == 0);  /* a pure function of (seed, position) */
    double s = 0, s2 = 0;
    for (size_t i = 0; i < info.numel; i++) s += a[i], s2 += (double)a[i] * a[i];
    double mean = s / info.numel, sd = sqrt(s2 / info.numel - mean * mean);
    /* 16384 samples: the sample sd is within 2% of 0.02 with overwhelming probability */
    CHECK_MSG(fabs(sd - 0.02) < 0.02 * 0.02 && fabs(mean) < 0.001, "mean %g sd %g", mean, sd);
    gpt_param_init(&cfg, &info, 8, b);
    CHECK(memcmp(a, b, sizeof(float) * info.numel) != 0);
    gpt_param_info_get(&cfg, gpt_param_position(&cfg, gpt_module_block(1), GPT_FC_W), &info);
    gpt_param_init(&cfg, &info, 7, b);
    CHECK(memcmp(a, b, sizeof(float) * info.numel) != 0);  /* another parameter, another stream */
    gpt_param_info_get(&cfg, gpt_param_position(&cfg, gpt_module_block(1), GPT_LN2_W), &info);
    gpt_param_init(&cfg, &info, 7, b);
    CHECK(b[0] == 1.0f && b[info.numel - 1] == 1.0f);
    free(a), free(b);
}

/* ------------------------------------------------------------ API contract */
static void test_api_order(void)
{
    model m;
    model_init(&m, (gpt_config){.n_layer = 2, .n_head = 2, .d_model = 32, .seq_len = 16, .vocab = 256});
    int fm = gpt_module_final(&m.cfg);
    int32_t tok[2 * 8], tgt[2 * 8];
    for (int i = 0; i < 16; i++) tok[i] = i * 13 % 256, tgt[i] = i * 29 % 256;
    gpt_workspace *ws = NULL;
    CHECK(gpt_workspace_create(&ws, &m.cfg, 2, 17) == ZERO_INVALID_ARGUMENT);  /* seq > seq_len */
    CHECK(ws == NULL);
    CHECK_OK(gpt_workspace_create(&ws, &m.cfg, 2, 8));
    CHECK(gpt_workspace_bytes(ws) > 0 && gpt_workspace_bytes(ws) == gpt_workspace_bytes_for(&m.cfg, 2, 8));

    CHECK(gpt_forward_block(ws, 0, &m.p[1]) == ZERO_INVALID_STATE);
    CHECK(gpt_backward_end(ws, 1.0f, &m.p[fm], &m.g[fm], &m.p[0], &m.g[0]) == ZERO_INVALID_STATE);
    tok[5] = 256;
    CHECK(gpt_forward_begin(ws, tok, tgt, &m.p[0]) == ZERO_INVALID_ARGUMENT);
    CHECK(strstr(gpt_last_error(), "position 5") != NULL);
    tok[5] = 3;
    gpt_tensors broken = m.p[1];
    broken.t[GPT_FC_B] = NULL;
    CHECK_OK(gpt_forward_begin(ws, tok, tgt, &m.p[0]));
    CHECK(gpt_forward_block(ws, 1, &m.p[2]) == ZERO_INVALID_STATE);  /* skips block 0 */
    CHECK(gpt_forward_block(ws, 0, &broken) == ZERO_INVALID_ARGUMENT);
    CHECK(strstr(gpt_last_error(), "h.0.mlp.c_fc.bias") != NULL);
    CHECK_OK(gpt_forward_block(ws, 0, &m.p[1]));
    CHECK(gpt_forward_end(ws, &m.p[fm], &m.p[0], NULL) == ZERO_INVALID_STATE);  /* block 1 missing */
    CHECK_OK(gpt_forward_block(ws, 1, &m.p[2]));
    float loss = 0;
    CHECK_OK(gpt_forward_end(ws, &m.p[fm], &m.p[0], &loss));
    CHECK(loss > 4.0f && loss < 8.0f);  /* near log(256) = 5.55 for small random weights */
    CHECK_OK(gpt_backward_end(ws, 1.0f, &m.p[fm], &m.g[fm], &m.p[0], &m.g[0]));
    CHECK(gpt_backward_block(ws, 0, &m.p[1], &m.g[1]) == ZERO_INVALID_STATE);  /* block 1 first */
    CHECK(gpt_backward_begin(ws, &m.g[0]) == ZERO_INVALID_STATE);
    CHECK_OK(gpt_backward_block(ws, 1, &m.p[2], &m.g[2]));
    CHECK_OK(gpt_backward_block(ws, 0, &m.p[1], &m.g[1]));
    CHECK_OK(gpt_backward_begin(ws, &m.g[0]));
    CHECK(gpt_backward_begin(ws, &m.g[0]) == ZERO_INVALID_STATE);  /* backward is once per forward */

    /* without targets: logits but no loss and no backward */
    CHECK_OK(gpt_forward(ws, tok, NULL, m.p, &loss));
    CHECK(loss == 0.0f);
    CHECK(gpt_backward(ws, 1.0f, m.p, m.g) == ZERO_INVALID_STATE);
    gpt_workspace_destroy(ws);
    gpt_workspace_destroy(NULL);
    model_free(&m);
}

/* ------------------------------------------------------------ gradients */
static double rel_diff(const float *a, const float *b, size_t n, double factor)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = a[i] - factor * b[i];
        num += d * d, den += factor * factor * (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void test_accumulate_and_scale(void)
{
    model m;
    model_init(&m, (gpt_config){.n_layer = 2, .n_head = 2, .d_model = 32, .seq_len = 16, .vocab = 256});
    int32_t tok[3 * 16], tgt[3 * 16];
    for (int i = 0; i < 48; i++) tok[i] = i * 37 % 256, tgt[i] = (i * 11 + 5) % 256;
    gpt_workspace *ws;
    CHECK_OK(gpt_workspace_create(&ws, &m.cfg, 3, 16));
    float loss1, loss2;
    CHECK_OK(gpt_forward(ws, tok, tgt, m.p, &loss1));
    CHECK_OK(gpt_backward(ws, 1.0f, m.p, m.g));
    float *once = malloc(sizeof(float) * m.total);
    memcpy(once, m.grads, sizeof(float) * m.total);
    /* a second micro-batch ADDS: twice the same batch = 2x */
    CHECK_OK(gpt_forward(ws, tok, tgt, m.p, &loss2));
    CHECK(loss1 == loss2);  /* deterministic at a fixed thread count */
    CHECK_OK(gpt_backward(ws, 1.0f, m.p, m.g));
    CHECK_MSG(rel_diff(m.grads, once, m.total, 2.0) < 1e-6, "accumulated grads are not 2x: %g",
              rel_diff(m.grads, once, m.total, 2.0));
    /* dloss scales every gradient */
    memset(m.grads, 0, sizeof(float) * m.total);
    CHECK_OK(gpt_forward(ws, tok, tgt, m.p, &loss2));
    CHECK_OK(gpt_backward(ws, 0.25f, m.p, m.g));
    CHECK_MSG(rel_diff(m.grads, once, m.total, 0.25) < 1e-6, "dloss 0.25: %g", rel_diff(m.grads, once, m.total, 0.25));
    /* ignored targets: all ignored -> loss 0 and zero gradient */
    for (int i = 0; i < 48; i++) tgt[i] = -1;
    memset(m.grads, 0, sizeof(float) * m.total);
    CHECK_OK(gpt_forward(ws, tok, tgt, m.p, &loss2));
    CHECK(loss2 == 0.0f);
    CHECK_OK(gpt_backward(ws, 1.0f, m.p, m.g));
    size_t nonzero = 0;
    for (size_t i = 0; i < m.total; i++) nonzero += m.grads[i] != 0.0f;
    CHECK(nonzero == 0);
    gpt_workspace_destroy(ws);
    free(once);
    model_free(&m);
}

/* Central differences along a random unit direction inside each parameter
 * tensor: (L(p + e u) - L(p - e u)) / 2e against g . u. The model is fp32, so
 * the loss (~5) carries ~3e-7 of rounding; with e = 1e-2 that is ~3e-5 of noise
 * in the difference quotient and the O(e^2) truncation is smaller still:
 * |fd - g.u| <= 1e-3 * |g.u| + 1.5e-4 (measured noise: up to 6e-5, against g.u of
 * 2e-4 .. 0.16, so a missing or wrong term still fails). */
static void test_finite_differences(void)
{
    model m;
    model_init(&m, (gpt_config){.n_layer = 2, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab = 32});
    const int B = 2, T = 8;
    int32_t tok[16], tgt[16];
    for (int i = 0; i < 16; i++) tok[i] = i * 7 % 32, tgt[i] = (i * 5 + 3) % 32;
    tgt[3] = -1;
    gpt_workspace *ws;
    CHECK_OK(gpt_workspace_create(&ws, &m.cfg, B, T));
    float loss;
    CHECK_OK(gpt_forward(ws, tok, tgt, m.p, &loss));
    CHECK_OK(gpt_backward(ws, 1.0f, m.p, m.g));
    const float eps = 1e-2f;
    size_t off = 0;
    double worst = 0;
    for (size_t i = 0; i < gpt_num_params(&m.cfg); i++) {
        gpt_param_info info;
        gpt_param_info_get(&m.cfg, i, &info);
        float *u = malloc(sizeof(float) * info.numel), *p = m.params + off, *saved = malloc(sizeof(float) * info.numel);
        double norm = 0, gu = 0;
        for (size_t j = 0; j < info.numel; j++) u[j] = uniform(), norm += (double)u[j] * u[j];
        for (size_t j = 0; j < info.numel; j++) u[j] /= (float)sqrt(norm), gu += (double)m.grads[off + j] * u[j];
        memcpy(saved, p, sizeof(float) * info.numel);
        float lp, lm;
        for (size_t j = 0; j < info.numel; j++) p[j] = saved[j] + eps * u[j];
        CHECK_OK(gpt_forward(ws, tok, tgt, m.p, &lp));
        for (size_t j = 0; j < info.numel; j++) p[j] = saved[j] - eps * u[j];
        CHECK_OK(gpt_forward(ws, tok, tgt, m.p, &lm));
        memcpy(p, saved, sizeof(float) * info.numel);
        double fd = ((double)lp - lm) / (2.0 * eps), err = fabs(fd - gu);
        CHECK_MSG(err <= 1e-3 * fabs(gu) + 1.5e-4, "%s: finite difference %.7g vs gradient %.7g", info.name, fd, gu);
        if (err > worst) worst = err;
        if (getenv("GPT_TEST_VERBOSE")) printf("  %-24s fd %.7g  g.u %.7g\n", info.name, fd, gu);
        free(u), free(saved);
        off += info.numel;
    }
    printf("finite differences: worst |fd - g.u| = %.3g over %zu tensors\n", worst, gpt_num_params(&m.cfg));
    gpt_workspace_destroy(ws);
    model_free(&m);
}

/* ------------------------------------------------------------ activation checkpointing */
/* Gradients, loss and logits with recomputation are BITWISE those without:
 * the recomputed forward runs the same kernels on the same inputs. Two
 * micro-batches (accumulation), recomputing none, the first, all but the
 * last, and every block. */
static void test_checkpointing_bitwise(void)
{
    const gpt_config cfg = {.n_layer = 3, .n_head = 2, .d_model = 32, .seq_len = 16, .vocab = 97};
    const int B = 2, T = 13, N = B * T;
    int32_t tok[2][26], tgt[2][26];
    for (int i = 0; i < N; i++)
        tok[0][i] = i * 37 % 97, tgt[0][i] = (i * 11 + 5) % 97, tok[1][i] = (i * 7 + 3) % 97, tgt[1][i] = i % 97;
    tgt[1][4] = -1;
    model m;
    model_init(&m, cfg);
    float *ref = malloc(sizeof(float) * m.total), *ref_logits = malloc(sizeof(float) * N * 97);
    float ref_loss[2] = {0, 0};
    const int blocks[] = {0, 1, 2, GPT_CHECKPOINT_ALL};
    for (int v = 0; v < 4; v++) {
        gpt_checkpointing ck = {blocks[v], v == 3, v == 3}; /* offload, partition: no effect on the CPU */
        gpt_workspace *ws;
        CHECK_OK(gpt_workspace_create_ckpt(&ws, &cfg, B, T, &ck));
        memset(m.grads, 0, sizeof(float) * m.total);
        float loss[2];
        for (int mb = 0; mb < 2; mb++) {
            CHECK_OK(gpt_forward(ws, tok[mb], tgt[mb], m.p, &loss[mb]));
            CHECK_OK(gpt_backward(ws, 0.5f, m.p, m.g));
        }
        if (v == 0) {
            memcpy(ref, m.grads, sizeof(float) * m.total);
            memcpy(ref_logits, gpt_workspace_logits(ws), sizeof(float) * N * 97);
            memcpy(ref_loss, loss, sizeof loss);
        } else {
            CHECK_MSG(memcmp(ref, m.grads, sizeof(float) * m.total) == 0,
                      "checkpointing %d blocks: gradients differ from no checkpointing", blocks[v]);
            CHECK(memcmp(ref_logits, gpt_workspace_logits(ws), sizeof(float) * N * 97) == 0);
            CHECK(memcmp(ref_loss, loss, sizeof loss) == 0);
        }
        gpt_workspace_destroy(ws);
    }
    size_t nonzero = 0;
    for (size_t i = 0; i < m.total; i++) nonzero += ref[i] != 0.0f;
    CHECK(nonzero > m.total / 2); /* the comparison compared something */
    gpt_checkpointing bad = {-1, 0, 0};
    gpt_workspace *ws = NULL;
    CHECK(gpt_workspace_create_ckpt(&ws, &cfg, B, T, &bad) == ZERO_CONFIG && ws == NULL);
    CHECK(strstr(gpt_last_error(), "blocks -1") != NULL);
    free(ref), free(ref_logits);
    model_free(&m);
}

/* docs/model.md's formula, written out independently of the model's carving:
 * r(x) = x rounded up to 64 bytes; f = 4-byte floats and ints. */
static size_t r64(size_t x) { return (x + 63) / 64 * 64; }

static size_t block_set_bytes(size_t B, size_t T, size_t C, size_t NH)
{
    size_t N = B * T;
    return 4 * r64(4 * N * C)          /* ln1, atty, res2, ln2 */
           + 4 * r64(4 * N)            /* the LayerNorms' means and rstds */
           + r64(12 * N * C)           /* qkv */
           + r64(4 * B * NH * T * T)   /* att */
           + 2 * r64(16 * N * C);      /* fch, fch_gelu */
}

static void test_activation_bytes(void)
{
#ifdef _OPENMP
    const size_t nt = (size_t)omp_get_max_threads();
#else
    const size_t nt = 1;
#endif
    const gpt_config shapes[] = {{.n_layer = 3, .n_head = 2, .d_model = 32, .seq_len = 16, .vocab = 97},
                                 {.n_layer = 4, .n_head = 4, .d_model = 48, .seq_len = 24, .vocab = 256},
                                 {.n_layer = 2, .n_head = 3, .d_model = 33, .seq_len = 11, .vocab = 101}};
    const int BT[][2] = {{2, 13}, {3, 24}, {1, 11}};
    for (int k = 0; k < 3; k++) {
        const gpt_config *c = &shapes[k];
        const size_t B = (size_t)BT[k][0], T = (size_t)BT[k][1], N = B * T, C = (size_t)c->d_model;
        const size_t L = (size_t)c->n_layer, V = (size_t)c->vocab;
        const size_t set = block_set_bytes(B, T, C, (size_t)c->n_head);
        for (int R = 0; R <= c->n_layer + 1; R++) {
            size_t rec = (size_t)(R < c->n_layer ? R : c->n_layer);
            size_t inputs = (L + 1) * r64(4 * N * C);
            size_t blocks = (L - rec) * set, recompute = rec ? set : 0;
            size_t head = 2 * r64(4 * N) + r64(4 * N * C) + 3 * r64(4 * N) + r64(4 * N * V);
            size_t scratch = 2 * r64(4 * N * C) + r64(12 * N * C) + r64(16 * N * C) + r64(4 * N * V) +
                             r64(4 * nt * 4 * C) + r64(4 * nt * T * T);
            size_t total = inputs + blocks + recompute + head + scratch;
            gpt_checkpointing ck = {R == c->n_layer + 1 ? GPT_CHECKPOINT_ALL : R, 0, 0};
            gpt_activation_bytes want, got;
            CHECK_OK(gpt_activation_bytes_for(c, (int)B, (int)T, &ck, &want));
            gpt_workspace *ws;
            CHECK_OK(gpt_workspace_create_ckpt(&ws, c, (int)B, (int)T, &ck));
            gpt_workspace_activation_bytes(ws, &got);
            CHECK_MSG(gpt_workspace_bytes(ws) == total && got.total == total && want.total == total,
                      "shape %d, %d recomputed: allocated %zu, reported %zu, formula %zu", k, R,
                      gpt_workspace_bytes(ws), want.total, total);
            CHECK(got.inputs == inputs && got.blocks == blocks && got.recompute == recompute && got.head == head &&
                  got.scratch == scratch && got.host == 0);
            CHECK(memcmp(&got, &want, sizeof got) == 0);
            if (R == 0) CHECK(total == gpt_workspace_bytes_for(c, (int)B, (int)T));
            gpt_workspace_destroy(ws);
        }
    }
    /* GPT-2 124M at micro-batch 8 x 1024 (the figure), counted, not allocated */
    gpt_config gpt2 = {.n_layer = 12, .n_head = 12, .d_model = 768, .seq_len = 1024, .vocab = 50257};
    gpt_checkpointing all = {GPT_CHECKPOINT_ALL, 0, 0};
    gpt_activation_bytes none_b, all_b;
    CHECK_OK(gpt_activation_bytes_for(&gpt2, 8, 1024, NULL, &none_b));
    CHECK_OK(gpt_activation_bytes_for(&gpt2, 8, 1024, &all, &all_b));
    CHECK(none_b.total - all_b.total == 11 * block_set_bytes(8, 1024, 768, 12));
    printf("activations, GPT-2 124M, 8 x 1024: %.2f GB without checkpointing, %.2f GB with every block recomputed\n",
           none_b.total / 1e9, all_b.total / 1e9);
}

/* An MoE GPT's report (docs/moe.md): the blocks' sets lose fch and
 * fch_gelu and the scratch loses dfch (the layer holds its own), and `moe`
 * is n_layer x one layer's buffers, each rounded up to 64 bytes:
 *   2 r(4NE) + 4 r(4NK) + r(4E) + 2 r(4 S C) + 3 r(4 R C) + 3 r(4 R H) + r(4 nt max(H, C, E))
 * with H = 4C, S = N K rows sent, R = E min(cap, N) rows received, cap =
 * ceil(cf K N / E) (N when cf <= 0). The workspace's report must equal this
 * formula, gpt_activation_bytes_for's count, and the sum of what each layer
 * allocated (gpt_moe_bytes). */
static void test_activation_bytes_moe(void)
{
#ifdef _OPENMP
    const size_t nt = (size_t)omp_get_max_threads();
#else
    const size_t nt = 1;
#endif
    const struct { int E, K; float cf; } moe[] = {{4, 1, 1.25f}, {4, 2, 0.0f}, {6, 2, 0.5f}};
    for (int k = 0; k < 3; k++) {
        gpt_config c = {.n_layer = 3, .n_head = 2, .d_model = 32, .seq_len = 16, .vocab = 97,
                        .moe_experts = moe[k].E, .moe_top_k = moe[k].K, .moe_capacity_factor = moe[k].cf,
                        .moe_aux_loss_coef = 0.01f};
        const size_t B = 2, T = 13, N = B * T, C = 32, H = 4 * C, L = 3, V = 97, NH = 2;
        const size_t E = (size_t)moe[k].E, K = (size_t)moe[k].K;
        size_t cap = moe[k].cf > 0 ? (size_t)ceil((double)moe[k].cf * K * N / E) : N;
        size_t S = N * K, R = E * (cap < N ? cap : N), wide = H > E ? H : E;
        size_t layer = 2 * r64(4 * N * E) + 4 * r64(4 * N * K) + r64(4 * E) + 2 * r64(4 * S * C) + 3 * r64(4 * R * C) +
                       3 * r64(4 * R * H) + r64(4 * nt * wide);
        size_t set = block_set_bytes(B, T, C, NH) - 2 * r64(16 * N * C);
        for (int R_ = 0; R_ <= 2; R_++) {
            size_t rec = (size_t)R_;
            size_t inputs = (L + 1) * r64(4 * N * C), head = 2 * r64(4 * N) + r64(4 * N * C) + 3 * r64(4 * N) +
                                                             r64(4 * N * V);
            size_t scratch = 2 * r64(4 * N * C) + r64(12 * N * C) + r64(4 * N * V) + r64(4 * nt * 4 * C) +
                             r64(4 * nt * T * T);
            size_t total = inputs + (L - rec) * set + (rec ? set : 0) + head + scratch + L * layer;
            gpt_checkpointing ck = {R_, 0, 0};
            gpt_activation_bytes want, got;
            CHECK_OK(gpt_activation_bytes_for(&c, (int)B, (int)T, &ck, &want));
            gpt_workspace *ws = NULL;
            CHECK_OK(gpt_workspace_create_moe(&ws, &c, (int)B, (int)T, &ck, NULL));
            if (!ws) continue;
            gpt_workspace_activation_bytes(ws, &got);
            size_t held = 0;
            for (int l = 0; l < (int)L; l++) held += gpt_moe_bytes(gpt_workspace_moe_layer(ws, l));
            CHECK_MSG(got.total == total && want.total == total && got.moe == L * layer && held == L * layer,
                      "MoE shape %d, %zu recomputed: reported %zu (moe %zu), counted %zu, layers hold %zu, formula "
                      "%zu (moe %zu)", k, rec, got.total, got.moe, want.total, held, total, L * layer);
            CHECK(got.inputs == inputs && got.blocks == (L - rec) * set && got.recompute == (rec ? set : 0) &&
                  got.head == head && got.scratch == scratch && got.host == 0);
            CHECK(memcmp(&got, &want, sizeof got) == 0 && gpt_workspace_bytes(ws) == total);
            gpt_workspace_destroy(ws);
        }
    }
}

int main(void)
{
    test_param_list();
    test_init();
    test_api_order();
    test_accumulate_and_scale();
    test_finite_differences();
    test_checkpointing_bitwise();
    test_activation_bytes();
    test_activation_bytes_moe();
    return check_exit();
}
