/* Test driver for the CPU GPT against PyTorch (tests/python/test_model_vs_torch.py).
 *
 *   model_driver IN OUT
 *
 * IN (little-endian): "GPTM", u32 version 1, i32 n_layer n_head d_model
 * seq_len vocab batch seq (version 2, MoE: then i32 experts top_k, f32
 * capacity_factor aux_loss_coef), then every parameter in gpt_param_info order (fp32),
 * then tokens and targets (i32, batch*seq each).
 * OUT: f32 loss, f32 logits (batch*seq*vocab), then every parameter's
 * gradient in the same order (fp32). The model runs module by module
 * through the public stage-3-shaped API (not gpt_forward), so that path is
 * the one tested. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_io.h"
#include "gpt.h"

int main(int argc, char **argv)
{
    const char *me = "model_driver", *out_path;
    int rc;
    FILE *in = driver_open_input(argc, argv, me, &out_path, &rc);
    if (!in) return rc;
    char magic[4];
    uint32_t version;
    int32_t h[7];
    if (driver_read(in, magic, 4, me, "magic") || memcmp(magic, "GPTM", 4) ||
        driver_read(in, &version, 4, me, "version") || (version != 1 && version != 2) ||
        driver_read(in, h, sizeof h, me, "header")) {
        fprintf(stderr, "model_driver: %s is not a version-1 or -2 GPTM file\n", argv[1]);
        return 1;
    }
    gpt_config cfg = {.n_layer = h[0], .n_head = h[1], .d_model = h[2], .seq_len = h[3], .vocab = h[4]};
    if (version == 2) { /* MoE: i32 experts top_k, f32 capacity_factor aux_loss_coef */
        int32_t moe[2];
        float mf[2];
        if (driver_read(in, moe, sizeof moe, me, "moe header") || driver_read(in, mf, sizeof mf, me, "moe header"))
            return 1;
        cfg.moe_experts = moe[0], cfg.moe_top_k = moe[1], cfg.moe_capacity_factor = mf[0];
        cfg.moe_aux_loss_coef = mf[1];
    }
    int B = h[5], T = h[6];
    if (gpt_config_validate(&cfg) != ZERO_OK) {
        fprintf(stderr, "model_driver: %s\n", gpt_last_error());
        return 1;
    }

    size_t np = gpt_num_params(&cfg), total = gpt_param_elements(&cfg);
    float *params = malloc(sizeof(float) * total), *grads = calloc(total, sizeof(float));
    int32_t *tokens = malloc(sizeof(int32_t) * B * T), *targets = malloc(sizeof(int32_t) * B * T);
    int nm = gpt_num_modules(&cfg);
    gpt_tensors *pset = calloc(nm, sizeof *pset), *gset = calloc(nm, sizeof *gset);
    if (!params || !grads || !tokens || !targets || !pset || !gset) return 1;
    size_t off = 0;
    for (size_t i = 0; i < np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&cfg, i, &info);
        pset[info.module].t[info.index] = params + off;
        gset[info.module].t[info.index] = grads + off;
        off += info.numel;
    }
    if (driver_read(in, params, sizeof(float) * total, me, "parameters") ||
        driver_read(in, tokens, sizeof(int32_t) * B * T, me, "tokens") ||
        driver_read(in, targets, sizeof(int32_t) * B * T, me, "targets"))
        return 1;
    fclose(in);

    gpt_workspace *ws = NULL;
    float loss = 0.0f;
    int fm = gpt_module_final(&cfg);
    zero_status st = gpt_workspace_create(&ws, &cfg, B, T);
    if (st == ZERO_OK) st = gpt_forward_begin(ws, tokens, targets, &pset[GPT_MODULE_EMBED]);
    for (int l = 0; st == ZERO_OK && l < cfg.n_layer; l++)
        st = gpt_forward_block(ws, l, &pset[gpt_module_block(l)]);
    if (st == ZERO_OK) st = gpt_forward_end(ws, &pset[fm], &pset[GPT_MODULE_EMBED], &loss);
    if (st == ZERO_OK)
        st = gpt_backward_end(ws, 1.0f, &pset[fm], &gset[fm], &pset[GPT_MODULE_EMBED], &gset[GPT_MODULE_EMBED]);
    for (int l = cfg.n_layer - 1; st == ZERO_OK && l >= 0; l--)
        st = gpt_backward_block(ws, l, &pset[gpt_module_block(l)], &gset[gpt_module_block(l)]);
    if (st == ZERO_OK) st = gpt_backward_begin(ws, &gset[GPT_MODULE_EMBED]);
    if (st != ZERO_OK) {
        fprintf(stderr, "model_driver: %s: %s\n", zero_status_name(st), gpt_last_error());
        return 1;
    }

    FILE *out = fopen(out_path, "wb");
    if (!out) {
        perror(out_path);
        return 1;
    }
    size_t nlogits = (size_t)B * T * cfg.vocab;
    int ok = fwrite(&loss, sizeof loss, 1, out) == 1 &&
             fwrite(gpt_workspace_logits(ws), sizeof(float), nlogits, out) == nlogits &&
             fwrite(grads, sizeof(float), total, out) == total;
    if (fclose(out) != 0 || !ok) {
        fprintf(stderr, "model_driver: cannot write %s\n", out_path);
        return 1;
    }
    gpt_workspace_destroy(ws);
    free(params), free(grads), free(tokens), free(targets), free(pset), free(gset);
    return 0;
}
