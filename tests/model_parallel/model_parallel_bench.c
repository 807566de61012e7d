/* Timing helper (not a test): one pipeline step (forward + backward of M
 * micro-batches, 1F1B) of the tp x pp GPT, and the bytes each rank moved.
 *
 *   tests/mpirun.sh W model_parallel_bench TP PP L H C T B V M iters
 *
 * Prints the wall ms per step (the slowest rank, best of `iters` after one
 * warm-up), tokens/s, the process CPU ms of all ranks together (best step;
 * the fair figure on a shared machine: it shows what parallelism adds -
 * redundant LayerNorms and head, communication), and for rank 0 the bytes sent over the tp group
 * (all-reduces) and over the pp group (activations and their gradients).
 * Parameters are gpt_param_init(1); data random. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zero/zero.h>

#include "gpt.h"
#include "pp_gpt.h"
#include "tp_gpt.h"

#define B_TRY(call)                                                                                  \
    do {                                                                                             \
        zero_status st_ = (call);                                                                    \
        if (st_ != ZERO_OK) {                                                                        \
            fprintf(stderr, "%s: %s: %s\n", #call, zero_status_name(st_),                            \
                    gpt_last_error()[0] ? gpt_last_error() : zero_last_error());                     \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static uint64_t sent(const zero_comm *c)
{
    zero_comm_counters k;
    if (!c || zero_comm_get_counters(c, &k) != ZERO_OK) return 0;
    uint64_t s = 0;
    for (int i = 0; i < ZERO_OP_KIND_COUNT; i++) s += k.bytes_sent[i];
    return s;
}

int main(int argc, char **argv)
{
    if (argc < 11) {
        fprintf(stderr, "usage: model_parallel_bench TP PP L H C T B V M iters\n");
        return 2;
    }
    int tp = atoi(argv[1]), pp = atoi(argv[2]);
    gpt_config cfg = {.n_layer = atoi(argv[3]), .n_head = atoi(argv[4]), .d_model = atoi(argv[5]),
                      .seq_len = atoi(argv[6]), .vocab = atoi(argv[8])};
    int B = atoi(argv[7]), T = cfg.seq_len, M = atoi(argv[9]), iters = atoi(argv[10]);
    zero_comm *world = NULL;
    B_TRY(zero_comm_create_world(&world, NULL));
    zero_grid grid;
    B_TRY(zero_grid_create(world, tp, pp, &grid));
    int begin, end;
    B_TRY(pp_stage_layers(&cfg, pp, grid.pp_rank, &begin, &end));
    zero_comm *eg = NULL;
    B_TRY(pp_embed_group_create(grid.pp, &eg));
    tp_workspace *ws = NULL;
    B_TRY(tp_workspace_create(&ws, &cfg, grid.tp, B, T, begin, end, pp_slots_needed(PP_1F1B, M, pp, grid.pp_rank)));

    size_t np = gpt_num_params(&cfg);
    int nm = gpt_num_modules(&cfg);
    gpt_tensors *p = calloc((size_t)nm, sizeof *p), *g = calloc((size_t)nm, sizeof *g);
    for (size_t i = 0; i < np; i++) {
        tp_param_info in;
        B_TRY(tp_param_info_get(&cfg, tp, grid.tp_rank, i, &in));
        if (!pp_stage_holds(&cfg, pp, grid.pp_rank, in.full.module, in.full.index)) continue;
        float *full = malloc(sizeof(float) * in.full.numel), *sh = malloc(sizeof(float) * in.numel);
        gpt_param_init(&cfg, &in.full, 1, full);
        tp_param_slice(&in, tp, grid.tp_rank, full, sh);
        free(full);
        p[in.full.module].t[in.full.index] = sh;
        g[in.full.module].t[in.full.index] = calloc(in.numel, sizeof(float));
    }
    size_t N = (size_t)M * B * T;
    int32_t *tok = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int32_t)((i * 7919u) % (unsigned)cfg.vocab);
        tgt[i] = (int32_t)(((i + 1) * 7919u) % (unsigned)cfg.vocab);
    }
    pp_step_args a = {M, tok, tgt, 1.0f / M, p, g};

    double best = 1e30, best_cpu = 1e30;
    float loss = 0;
    uint64_t tp_bytes = 0, pp_bytes = 0;
    for (int it = 0; it <= iters; it++) {
        zero_comm_reset_counters(grid.tp);
        zero_comm_reset_counters(grid.pp);
        B_TRY(zero_barrier(world));
        double t0 = now_s(), c0 = cpu_s();
        B_TRY(pp_train_step(ws, grid.pp, PP_1F1B, &a, &loss));
        B_TRY(pp_tied_grad_allreduce(eg, &cfg, &g[GPT_MODULE_EMBED]));
        double dt = now_s() - t0, slowest = dt, cpu = cpu_s() - c0, cpu_all = cpu;
        B_TRY(zero_allreduce(world, &dt, &slowest, 1, ZERO_F64, ZERO_MAX));
        B_TRY(zero_allreduce(world, &cpu, &cpu_all, 1, ZERO_F64, ZERO_SUM));
        if (it > 0 && slowest < best) best = slowest;
        if (it > 0 && cpu_all < best_cpu) best_cpu = cpu_all;
        tp_bytes = sent(grid.tp);
        pp_bytes = sent(grid.pp);
    }
    if (zero_comm_get_rank(world) == 0)
        printf("tp %d pp %d  L %d H %d C %d T %d B %d V %d M %d: %.2f ms/step, %.0f tokens/s, CPU %.2f ms/step (all ranks), loss %.4f, "
               "rank 0 sent %.2f MB over tp, %.2f MB over pp\n",
               tp, pp, cfg.n_layer, cfg.n_head, cfg.d_model, T, B, cfg.vocab, M, best * 1e3, N / best, best_cpu * 1e3, loss,
               tp_bytes / 1e6, pp_bytes / 1e6);
    for (int m = 0; m < nm; m++)
        for (int k = 0; k < GPT_MAX_MODULE_TENSORS; k++) free(p[m].t[k]), free(g[m].t[k]);
    free(p), free(g), free(tok), free(tgt);
    tp_workspace_destroy(ws);
    zero_comm_destroy(eg);
    zero_grid_destroy(&grid);
    zero_comm_destroy(world);
    return 0;
}
