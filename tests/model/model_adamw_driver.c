/* Test driver: the CPU GPT trained for a few AdamW steps THROUGH THE ENGINE
 * (world 1, any stage), for tests/python/test_model_vs_torch.py.
 *
 *   model_adamw_driver IN OUT [STAGE]
 *
 * IN (little-endian): "GPTA", u32 version 1, i32 n_layer n_head d_model
 * seq_len vocab batch seq steps, f64 lr beta1 beta2 eps weight_decay, every
 * parameter in gpt_param_info order (fp32), then per step tokens and targets
 * (i32, batch*seq each).
 * OUT: f32 loss of every step (before its update), then every parameter's
 * final fp32 value in the same order.
 *
 * The loop is the stage-3 shape: one module gathered at a time in forward
 * and in backward, grads_ready per module, the embed module (tied wte)
 * gathered across the whole step. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zero/zero.h>

#include "gpt.h"

#define TRY(call)                                                                                   \
    do {                                                                                            \
        zero_status st_ = (call);                                                                   \
        if (st_ != ZERO_OK) {                                                                       \
            fprintf(stderr, "model_adamw_driver: %s: %s: %s\n", #call, zero_status_name(st_),        \
                    gpt_last_error()[0] ? gpt_last_error() : zero_last_error());                    \
            return 1;                                                                               \
        }                                                                                           \
    } while (0)

static int read_exact(FILE *f, void *p, size_t bytes)
{
    return fread(p, 1, bytes, f) == bytes ? 0 : -1;
}

/* Fill the pointer sets of module m from the engine (data, and grads if g). */
static zero_status module_ptrs(zero_engine *e, const gpt_config *cfg, const int *pid, int m, gpt_tensors *p,
                               gpt_tensors *g)
{
    for (int k = 0; k < gpt_module_num_tensors(cfg, m); k++) {
        int id = pid[gpt_param_position(cfg, m, k)];
        zero_status st = zero_engine_param_data(e, id, &p->t[k]);
        if (st == ZERO_OK && g) st = zero_engine_param_grad(e, id, &g->t[k]);
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: model_adamw_driver IN OUT [STAGE]\n");
        return 2;
    }
    int stage = argc > 3 ? atoi(argv[3]) : 0;
    FILE *in = fopen(argv[1], "rb");
    if (!in) {
        perror(argv[1]);
        return 1;
    }
    char magic[4];
    uint32_t version;
    int32_t h[8];
    double hp[5];
    if (read_exact(in, magic, 4) || memcmp(magic, "GPTA", 4) || read_exact(in, &version, 4) || version != 1 ||
        read_exact(in, h, sizeof h) || read_exact(in, hp, sizeof hp)) {
        fprintf(stderr, "model_adamw_driver: %s is not a version-1 GPTA file\n", argv[1]);
        return 1;
    }
    gpt_config cfg = {.n_layer = h[0], .n_head = h[1], .d_model = h[2], .seq_len = h[3], .vocab = h[4]};
    int B = h[5], T = h[6], steps = h[7];
    TRY(gpt_config_validate(&cfg));
    size_t np = gpt_num_params(&cfg), total = gpt_param_elements(&cfg);
    float *init = malloc(sizeof(float) * total);
    int32_t *tok = malloc(sizeof(int32_t) * B * T * steps), *tgt = malloc(sizeof(int32_t) * B * T * steps);
    if (!init || !tok || !tgt || read_exact(in, init, sizeof(float) * total)) return 1;
    for (int s = 0; s < steps; s++)
        if (read_exact(in, tok + (size_t)s * B * T, sizeof(int32_t) * B * T) ||
            read_exact(in, tgt + (size_t)s * B * T, sizeof(int32_t) * B * T))
            return 1;
    fclose(in);

    /* ---- the engine at world 1 */
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT;
    cc.backend = ZERO_BACKEND_LOCAL;
    zero_comm *world = NULL;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    TRY(zero_comm_create_world(&world, &cc));
    TRY(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));
    zero_config zc = ZERO_CONFIG_INIT;
    zc.stage = stage;
    zc.optimizer = ZERO_OPTIM_ADAMW;
    zc.lr = hp[0], zc.beta1 = hp[1], zc.beta2 = hp[2], zc.eps = hp[3], zc.weight_decay = hp[4];
    zc.stage3_param_persistence_threshold = 0;  /* stage 3: really gather every module */
    TRY(zero_engine_create(&e, &zc, world, dev));
    int *pid = malloc(sizeof(int) * np);
    char name[32];
    for (int m = 0; m < gpt_num_modules(&cfg); m++) {
        int id;
        TRY(zero_engine_add_module(e, gpt_module_name(&cfg, m, name, sizeof name), &id));
        if (id != m) return 1;  /* engine module ids = model module indices */
    }
    size_t off = 0;
    for (size_t i = 0; i < np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&cfg, i, &info);
        int64_t shape[2] = {(int64_t)info.shape[0], (int64_t)info.shape[1]};
        TRY(zero_engine_add_param(e, info.module, info.name, info.ndim, shape, init + off, &pid[i]));
        off += info.numel;
    }
    TRY(zero_engine_finalize(e));

    gpt_workspace *ws = NULL;
    TRY(gpt_workspace_create(&ws, &cfg, B, T));
    float *losses = malloc(sizeof(float) * steps);
    const int L = cfg.n_layer, fm = gpt_module_final(&cfg);
    for (int s = 0; s < steps; s++) {
        const int32_t *x = tok + (size_t)s * B * T, *y = tgt + (size_t)s * B * T;
        gpt_tensors ep = {{0}}, eg = {{0}}, p = {{0}}, g = {{0}};
        /* forward, module by module */
        TRY(zero_engine_gather(e, GPT_MODULE_EMBED));
        TRY(module_ptrs(e, &cfg, pid, GPT_MODULE_EMBED, &ep, NULL));
        TRY(gpt_forward_begin(ws, x, y, &ep));
        for (int l = 0; l < L; l++) {
            TRY(zero_engine_gather(e, gpt_module_block(l)));
            TRY(module_ptrs(e, &cfg, pid, gpt_module_block(l), &p, NULL));
            TRY(gpt_forward_block(ws, l, &p));
            TRY(zero_engine_release(e, gpt_module_block(l)));
        }
        TRY(zero_engine_gather(e, fm));
        TRY(module_ptrs(e, &cfg, pid, fm, &p, NULL));
        TRY(gpt_forward_end(ws, &p, &ep, &losses[s]));
        /* backward, in reverse; the embed module's gradient completes last */
        TRY(module_ptrs(e, &cfg, pid, fm, &p, &g));
        TRY(module_ptrs(e, &cfg, pid, GPT_MODULE_EMBED, &ep, &eg));
        TRY(gpt_backward_end(ws, 1.0f, &p, &g, &ep, &eg));
        TRY(zero_engine_grads_ready(e, fm));
        TRY(zero_engine_release(e, fm));
        for (int l = L - 1; l >= 0; l--) {
            int m = gpt_module_block(l);
            TRY(zero_engine_gather(e, m));
            TRY(module_ptrs(e, &cfg, pid, m, &p, &g));
            TRY(gpt_backward_block(ws, l, &p, &g));
            TRY(zero_engine_grads_ready(e, m));
            TRY(zero_engine_release(e, m));
        }
        TRY(gpt_backward_begin(ws, &eg));
        TRY(zero_engine_grads_ready(e, GPT_MODULE_EMBED));
        TRY(zero_engine_release(e, GPT_MODULE_EMBED));
        TRY(zero_engine_step(e, NULL));
    }

    FILE *out = fopen(argv[2], "wb");
    if (!out || fwrite(losses, sizeof(float), steps, out) != (size_t)steps) return 1;
    off = 0;
    float *buf = malloc(sizeof(float) * total);
    for (size_t i = 0; i < np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&cfg, i, &info);
        TRY(zero_engine_read_param(e, pid[i], buf + off));
        off += info.numel;
    }
    if (fwrite(buf, sizeof(float), total, out) != total || fclose(out) != 0) return 1;
    gpt_workspace_destroy(ws);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    free(init), free(tok), free(tgt), free(pid), free(losses), free(buf);
    return 0;
}
