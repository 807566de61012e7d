/* zero-bench stepcost: what zero_engine_step costs beyond the optimizer
 * kernel it runs, per stage, in one run (CPU backend; meant for world 1,
 * where the step has nothing to communicate but a scalar).
 *
 * For each stage an engine is built on the model; every repetition runs one
 * micro-step untimed, then times zero_engine_step alone and the optimizer
 * kernel alone (optim/cpu_optim.c, compiled into this program: it is
 * internal) on arrays of the size the step updates (this rank's shard of
 * master, gradient and moments, fp32), so step and kernel alternate and
 * share the machine's state. The two take turns at going first after the
 * micro-step (the step first on even repetitions), since that place costs
 * more (the micro-step's writes are still dirty in the cache); before
 * 2026-12-03 the step always went first. Medians over the repetitions; "ratio" is
 * step / kernel, the overhead the engine adds (norm, clipping, casts,
 * gathers, bookkeeping). "paired" is the median of the repetitions' own
 * step / kernel quotients: each pair ran back to back, so a load that drifts
 * over the run (a shared machine's other jobs) cancels in it, where the
 * ratio of the two medians may take them from different phases of the
 * load. "micro" is the median micro-step (the model's
 * forward/backward and grads_ready, where the gradient reductions and, on
 * the CPU, the norm's sums of squares happen): what moved out of the step
 * must not reappear there at full price. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cmds.h"
#include "bench_model.h"
#include "bench_run.h"
#include "bench_util.h"
#include "optim/cpu_optim.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: zero-bench stepcost --params N [options]\n"
            "  Median time of zero_engine_step against the optimizer kernel alone on the same\n"
            "  number of elements, per stage, alternated in one run (target: step <= 1.1 x kernel\n"
            "  at world 1). Defaults: --params 2e7 --dtype fp32 --steps 15 --warmup 2 --overlap 0.\n%s",
            bench_run_usage);
}

static void run_kernel(const bench_run_opts *o, const zero_optim_hyper *h, float *p, float *g, float *m1, float *m2,
                       size_t n)
{
    if (o->optimizer == ZERO_OPTIM_ADAMW) zero_cpu_adamw(h, p, g, m1, m2, n);
    else zero_cpu_sgd(h, p, g, o->momentum > 0 ? m1 : NULL, n);
}

int bench_cmd_stepcost(int argc, char **argv)
{
    bench_run_opts o = {
        .params = 2e7, .layers = 8, .dtype = ZERO_F32, .optimizer = ZERO_OPTIM_ADAMW, .bucket = 5e8,
        .persistence = 1e5, .prefetch = 5e7, .overlap = 0, .stage_mask = 0xF, .steps = 15, .warmup = 2,
    };
    int prc = bench_run_parse(&o, argc, argv, "stepcost");
    if (prc) {
        usage();
        return prc == 1 ? 0 : 2;
    }
    bench_model m;
    if (bench_model_init(&m, o.params, o.layers)) {
        fprintf(stderr, "zero-bench stepcost: --params must be at least 1000\n");
        return 2;
    }
    zero_comm *world = NULL;
    zero_device *dev = NULL;
    if (bench_run_setup(&o, &world, &dev, "stepcost")) return 1;
    const int rank = zero_comm_rank(world);
    if (rank == 0)
        printf("zero-bench stepcost: %llu params, world %d, %s, %s, kernel variant %s, %d thread(s), median of %d, %s\n",
               (unsigned long long)m.numel, zero_comm_size(world), zero_dtype_name(o.dtype),
               o.optimizer == ZERO_OPTIM_ADAMW ? "AdamW" : "SGD", zero_cpu_optim_active()->name, bench_run_threads(),
               o.steps, o.cpu_clock ? "process CPU time" : "wall clock");
    if (rank == 0)
        printf("%-6s %12s %12s %8s %8s %12s\n", "stage", "step(ms)", "kernel(ms)", "ratio", "paired", "micro(ms)");
    double (*now)(void) = o.cpu_clock ? bench_cpu_s : bench_now_s;
    double *ts = calloc((size_t)o.steps, sizeof *ts), *tk = calloc((size_t)o.steps, sizeof *tk);
    double *tm = calloc((size_t)o.steps, sizeof *tm), *tq = calloc((size_t)o.steps, sizeof *tq);
    int rc = ts && tk && tm && tq ? 0 : 1;
    json_t *rows = json_array();
    for (int stage = 0; stage < 4 && !rc; stage++) {
        if (!(o.stage_mask & (1u << stage))) continue;
        zero_config c = bench_run_config(&o, stage);
        zero_engine *e = NULL;
        if (bench_failed(zero_engine_create(&e, &c, world, dev), "stepcost: engine create") ||
            bench_failed(bench_model_register(&m, e), "stepcost: register")) {
            rc = 1;
            zero_engine_destroy(e);
            break;
        }
        zero_plan_info plan;
        zero_engine_plan_info(e, &plan);
        /* the elements the step updates: everything at stage 0, the shard otherwise */
        size_t n = (size_t)(stage == 0 ? plan.padded_numel : plan.shard_numel);
        float *p = malloc(n * 4), *g = malloc(n * 4), *m1 = malloc(n * 4), *m2 = malloc(n * 4);
        /* Real pages with ordinary values: calloc'd arrays that the kernel
         * only reads (the gradient) would all map the one shared zero page
         * and sit in cache, flattering the kernel. */
        for (size_t i = 0; p && g && m1 && m2 && i < n; i++)
            p[i] = 0.01f * (float)(i % 97), g[i] = 1e-3f * (float)(i % 89), m1[i] = 1e-4f, m2[i] = 1e-6f;
        zero_optim_hyper h = {.grad_scale = 1.0f, .decay = 0.99999f, .beta1 = 0.9f, .one_minus_beta1 = 0.1f,
                              .beta2 = 0.999f, .one_minus_beta2 = 0.001f, .neg_step_size = -1e-3f,
                              .bc2_sqrt = 0.5f, .eps = 1e-8f, .neg_lr = -1e-3f, .momentum = 0.9f,
                              .one_minus_dampening = 1.0f};
        for (int r = 0; r < o.warmup + o.steps && !rc && p && g && m1 && m2; r++) {
            zero_step_result res;
            double tm0 = now();
            rc = bench_failed(bench_model_micro(&m, e, dev, rank), "stepcost: micro-step");
            double tm1 = now();
            if (rc) break;
            zero_barrier(world);
            /* Whichever runs first after the micro-step finds the memory system
             * as the micro-step left it (its gradient writes dirty in the cache):
             * the two take turns in that place, so neither gets it every time. */
            const int kernel_first = r % 2;
            double tk0 = 0, tk1 = 0;
            if (kernel_first) {
                tk0 = now();
                run_kernel(&o, &h, p, g, m1, m2, n);
                tk1 = now();
            }
            double t0 = now();
            rc = bench_failed(zero_engine_step(e, &res), "stepcost: step");
            double t1 = now();
            if (!kernel_first) {
                tk0 = now();
                run_kernel(&o, &h, p, g, m1, m2, n);
                tk1 = now();
            }
            if (r >= o.warmup) {
                const int k = r - o.warmup;
                ts[k] = t1 - t0, tk[k] = tk1 - tk0, tm[k] = tm1 - tm0;
                tq[k] = tk[k] > 0 ? ts[k] / tk[k] : 0.0;
            }
        }
        if (!p || !g || !m1 || !m2) rc = 1;
        free(p), free(g), free(m1), free(m2);
        zero_engine_destroy(e);
        if (rc) break;
        double ms = bench_median(ts, o.steps) * 1e3, mk = bench_median(tk, o.steps) * 1e3;
        double mm = bench_median(tm, o.steps) * 1e3, mq = bench_median(tq, o.steps);
        if (rank == 0) printf("%-6d %12.2f %12.2f %8.3f %8.3f %12.2f\n", stage, ms, mk, ms / mk, mq, mm);
        json_array_append_new(rows, json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:I}", "stage", stage, "step_ms", ms,
                                              "kernel_ms", mk, "ratio", ms / mk, "paired_ratio", mq, "micro_ms", mm,
                                              "elements", (json_int_t)n));
    }
    if (!rc && rank == 0 && o.json_path) {
        json_t *root = json_pack("{s:I, s:i, s:s, s:s, s:i, s:o}", "params", (json_int_t)m.numel, "world",
                                 zero_comm_size(world), "dtype", zero_dtype_name(o.dtype), "variant",
                                 zero_cpu_optim_active()->name, "threads", bench_run_threads(), "stages", rows);
        rows = NULL;
        if (json_dump_file(root, o.json_path, JSON_INDENT(2))) fprintf(stderr, "stepcost: cannot write %s\n", o.json_path);
        else printf("wrote %s\n", o.json_path);
        json_decref(root);
    }
    json_decref(rows);
    free(ts), free(tk), free(tm), free(tq);
    bench_model_free(&m);
    zero_device_close(dev);
    zero_comm_destroy(world);
    return rc;
}
