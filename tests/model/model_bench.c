/* Times forward+backward of the CPU GPT (not a test; a helper for tuning):
 *   model_bench [n_layer n_head d_model seq batch vocab iters]
 * Prints ms per forward+backward and tokens/s; the PyTorch peer is
 * tests/python/model_bench_torch.py with the same arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpt.h"

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

int main(int argc, char **argv)
{
    int a[7] = {4, 4, 256, 128, 8, 256, 10};
    for (int i = 1; i < argc && i <= 7; i++) a[i - 1] = atoi(argv[i]);
    gpt_config cfg = {.n_layer = a[0], .n_head = a[1], .d_model = a[2], .seq_len = a[3], .vocab = a[5]};
    int B = a[4], T = a[3], iters = a[6];
    if (gpt_config_validate(&cfg) != ZERO_OK) {
        fprintf(stderr, "%s\n", gpt_last_error());
        return 1;
    }
    size_t total = gpt_param_elements(&cfg), np = gpt_num_params(&cfg);
    float *params = malloc(sizeof(float) * total), *grads = calloc(total, sizeof(float));
    int nm = gpt_num_modules(&cfg);
    gpt_tensors *ps = calloc(nm, sizeof *ps), *gs = calloc(nm, sizeof *gs);
    size_t off = 0;
    for (size_t i = 0; i < np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&cfg, i, &info);
        gpt_param_init(&cfg, &info, 42, params + off);
        ps[info.module].t[info.index] = params + off;
        gs[info.module].t[info.index] = grads + off;
        off += info.numel;
    }
    int32_t *tok = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) tok[i] = (i * 7919) % cfg.vocab, tgt[i] = (i * 104729 + 1) % cfg.vocab;
    gpt_workspace *ws;
    if (gpt_workspace_create(&ws, &cfg, B, T) != ZERO_OK) {
        fprintf(stderr, "%s\n", gpt_last_error());
        return 1;
    }
    float loss = 0;
    double best = 1e30, sum = 0, tf = 0, tb = 0, cpu0 = 0;
    for (int it = 0; it < iters + 2; it++) {
        if (it == 2) cpu0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        double t0 = now_s();
        gpt_forward(ws, tok, tgt, ps, &loss);
        double t1 = now_s();
        gpt_backward(ws, 1.0f, ps, gs);
        double t2 = now_s();
        if (it >= 2) {  /* two warm-up iterations */
            sum += t2 - t0, tf += t1 - t0, tb += t2 - t1;
            if (t2 - t0 < best) best = t2 - t0;
        }
    }
    double cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    printf("C   model L%d H%d C%d T%d B%d V%d: fwd %.2f ms, bwd %.2f ms, fwd+bwd mean %.2f ms (best %.2f), %.0f tokens/s, cpu %.2f ms/iter, loss %.4f\n",
           cfg.n_layer, cfg.n_head, cfg.d_model, T, B, cfg.vocab, 1e3 * tf / iters, 1e3 * tb / iters,
           1e3 * sum / iters, 1e3 * best, B * T * iters / sum, 1e3 * cpu / iters, loss);
    gpt_workspace_destroy(ws);
    free(params), free(grads), free(ps), free(gs), free(tok), free(tgt);
    return 0;
}
