/* zero-bench-pipeline: the bubble of a pipeline schedule, measured.
 *
 *   tests/mpirun.sh P zero-bench-pipeline SCHEDULE M [--chunks V] [--sim-ms T | --real]
 *                   [--steps S] [--trace FILE] [--json FILE] [--assert-below OTHER_SCHEDULE]
 *
 * One rank per stage (world size = P), tp 1, the CPU GPT of model/. Each
 * step runs the schedule's plan (pp_plan.h) with pp_run_plan and records
 * every op's span. Per stage and step: busy = the time in forward, backward
 * and weight-gradient spans; the step = from the earliest span start on any
 * rank to the latest end on any rank (so a stage that starts late is idle
 * until it starts); measured bubble = 1 - busy / step, averaged over stages
 * and steps (the first step is a warm-up and not counted). Beside it: the
 * plan's theoretical bubble (F = B = W) and its peak live activation sets
 * per stage.
 *   --sim-ms T  each F, B, W sleeps T ms instead of computing (B+W unsplit:
 *               2T): clean timings that match the theory's unit ops, even
 *               with 4 ranks on 2 cores (the default, T = 20);
 *   --real      the GPT computes (8 blocks, d_model 128, batch 4 x seq 64).
 *   --assert-below OTHER  also run schedule OTHER in the same process, ops
 *               interleaved step by step, and exit 1 unless SCHEDULE's
 *               measured bubble is below OTHER's.
 * Prints one line per schedule; --json writes them as a JSON list. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zero/zero.h>

#include "gpt.h"
#include "pp_gpt.h"
#include "pp_plan.h"
#include "pp_trace.h"
#include "tp_gpt.h"

static int g_rank;

#define TRY(call)                                                                                               \
    do {                                                                                                        \
        zero_status st_ = (call);                                                                               \
        if (st_ != ZERO_OK) {                                                                                   \
            fprintf(stderr, "[rank %d] %s: %s: %s\n", g_rank, #call, zero_status_name(st_), gpt_last_error()); \
            return 1;                                                                                           \
        }                                                                                                       \
    } while (0)

typedef struct sched_run {
    pp_schedule_kind kind;
    pp_plan plan;
    tp_workspace *ws[8];
    pp_trace trace;
    double bubble_sum; /* measured, summed over counted steps (this stage) */
    double step_sum;   /* step times, summed over counted steps */
    double op_sum[PP_SPAN_KIND_COUNT], op_n[PP_SPAN_KIND_COUNT]; /* span time and count by kind, counted steps */
    int steps;
} sched_run;

typedef struct bench {
    gpt_config cfg;
    int B, T, M, V, P, s, real;
    double op_s;
    float **p, **g;
    gpt_tensors *ps, *gs;
    int32_t *tok, *tgt;
} bench;

static int setup(bench *b, sched_run *r)
{
    int v = r->kind == PP_SCHED_INTERLEAVED ? b->V : 1;
    TRY(pp_plan_generate(&r->plan, r->kind, b->P, b->M, v));
    for (int c = 0; c < v; c++) {
        int lb, le;
        TRY(pp_chunk_layers(&b->cfg, b->P, v, b->s, c, &lb, &le));
        TRY(tp_workspace_create(&r->ws[c], &b->cfg, NULL, b->B, b->T, lb, le, r->plan.slots[b->s * v + c]));
    }
    return 0;
}

/* One step; returns its measured bubble on this stage (-1: failure). */
static double step(bench *b, sched_run *r, zero_comm *pp, int counted)
{
    pp_step_args a = {b->M, b->tok, b->tgt, 1.0f / b->M, b->ps, b->gs};
    pp_run_opts o = {&r->trace, b->real ? 0.0 : b->op_s};
    TRY(zero_barrier(pp)); /* every stage starts the step together */
    int first = r->trace.n;
    if (pp_run_plan(r->ws, pp, &r->plan, &a, &o, NULL) != ZERO_OK) {
        fprintf(stderr, "[rank %d] %s: %s\n", g_rank, r->plan.name, gpt_last_error());
        return -1;
    }
    double busy = 0, t0 = 1e300, t1 = -1e300;
    for (int i = first; i < r->trace.n; i++) {
        const pp_span *sp = &r->trace.spans[i];
        if (sp->kind != PP_SPAN_COMM) busy += sp->t1 - sp->t0;
        t0 = fmin(t0, sp->t0), t1 = fmax(t1, sp->t1);
        if (counted) r->op_sum[sp->kind] += sp->t1 - sp->t0, r->op_n[sp->kind] += 1;
    }
    double w[2] = {-t0, t1}, g[2];
    if (zero_allreduce(pp, w, g, 2, ZERO_F64, ZERO_MAX) != ZERO_OK) return -1;
    double bubble = 1.0 - busy / (g[1] + g[0]);
    if (counted) r->bubble_sum += bubble, r->step_sum += g[1] + g[0], r->steps++;
    r->trace.step++;
    return bubble;
}

static void report(const bench *b, sched_run *r, zero_comm *pp, FILE *json, int first)
{
    double mine = r->steps ? r->bubble_sum / r->steps : 0, all = 0;
    zero_allreduce(pp, &mine, &all, 1, ZERO_F64, ZERO_SUM);
    double *per = calloc((size_t)b->P, sizeof(double));
    zero_allgather(pp, &mine, per, 1, ZERO_F64);
    /* the ops' mean times over all stages, the share of the step spent waiting for
     * transfers, and the bubble the checker's simulation gives at those op times: how far
     * the measured bubble is from the schedule's at this machine's F:B:W (not 1:1:1) */
    double ops[2 * PP_SPAN_KIND_COUNT], ops_all[2 * PP_SPAN_KIND_COUNT];
    for (int k = 0; k < PP_SPAN_KIND_COUNT; k++) ops[k] = r->op_sum[k], ops[PP_SPAN_KIND_COUNT + k] = r->op_n[k];
    zero_allreduce(pp, ops, ops_all, 2 * PP_SPAN_KIND_COUNT, ZERO_F64, ZERO_SUM);
    double mean[PP_SPAN_KIND_COUNT];
    for (int k = 0; k < PP_SPAN_KIND_COUNT; k++)
        mean[k] = ops_all[PP_SPAN_KIND_COUNT + k] > 0 ? ops_all[k] / ops_all[PP_SPAN_KIND_COUNT + k] : 0;
    double comm_frac = r->step_sum > 0 ? ops_all[PP_SPAN_COMM] / (r->step_sum * b->P) : 0, costed = -1;
    if (pp_plan_bubble_for(&r->plan, mean[PP_SPAN_FORWARD], mean[PP_SPAN_BACKWARD], mean[PP_SPAN_WEIGHT_GRAD], &costed,
                           NULL) != ZERO_OK)
        costed = -1;
    if (g_rank != 0) {
        free(per);
        return;
    }
    double measured = all / b->P;
    int peak = 0;
    for (int s = 0; s < b->P; s++) peak = r->plan.peak_live[s] > peak ? r->plan.peak_live[s] : peak;
    printf("%-12s p %d M %2d v %d  measured bubble %.3f  theoretical %.3f  peak live sets/stage:", r->plan.name, b->P,
           b->M, r->plan.chunks, measured, r->plan.bubble);
    for (int s = 0; s < b->P; s++) printf(" %.1f", r->plan.peak_stage[s]);
    printf("  (per stage measured:");
    for (int s = 0; s < b->P; s++) printf(" %.3f", per[s]);
    printf(")\n");
    printf("%-12s mean op ms: F %.3f  B %.3f  W %.3f (%s)  waiting for transfers %.3f of the step;  theoretical at "
           "these op times %.3f\n",
           r->plan.name, mean[PP_SPAN_FORWARD] * 1e3, mean[PP_SPAN_BACKWARD] * 1e3, mean[PP_SPAN_WEIGHT_GRAD] * 1e3,
           r->plan.split ? "B and W apart" : "B = the whole backward", comm_frac, costed);
    if (json) {
        fprintf(json, "%s{\"schedule\": \"%s\", \"p\": %d, \"m\": %d, \"v\": %d, \"compute\": \"%s\", \"op_ms\": %.3f, "
                      "\"steps\": %d, \"measured_bubble\": %.5f, \"theoretical_bubble\": %.5f, \"peak_live_stage_units\": [",
                first ? "" : ",\n", r->plan.name, b->P, b->M, r->plan.chunks, b->real ? "real" : "simulated",
                b->op_s * 1e3, r->steps, measured, r->plan.bubble);
        for (int s = 0; s < b->P; s++) fprintf(json, "%s%.3f", s ? ", " : "", r->plan.peak_stage[s]);
        fprintf(json, "], \"measured_per_stage\": [");
        for (int s = 0; s < b->P; s++) fprintf(json, "%s%.5f", s ? ", " : "", per[s]);
        fprintf(json, "], \"mean_op_ms\": {\"F\": %.4f, \"B\": %.4f, \"W\": %.4f}, \"comm_wait_fraction\": %.5f, "
                      "\"theoretical_at_measured_op_times\": %.5f}",
                mean[PP_SPAN_FORWARD] * 1e3, mean[PP_SPAN_BACKWARD] * 1e3, mean[PP_SPAN_WEIGHT_GRAD] * 1e3, comm_frac,
                costed);
    }
    (void)peak;
    free(per);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: zero-bench-pipeline SCHEDULE M [--chunks V] [--sim-ms T | --real] [--steps S] "
                        "[--trace FILE] [--json FILE] [--assert-below SCHEDULE]\n");
        return 2;
    }
    bench b;
    memset(&b, 0, sizeof b);
    sched_run runs[2];
    memset(runs, 0, sizeof runs);
    int nruns = 1, steps = 4;
    const char *trace_path = NULL, *json_path = NULL;
    b.M = atoi(argv[2]);
    b.V = 2;
    b.op_s = 20e-3;
    if (pp_schedule_parse(argv[1], &runs[0].kind) != ZERO_OK) {
        fprintf(stderr, "%s\n", gpt_last_error());
        return 2;
    }
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--chunks") && i + 1 < argc) b.V = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sim-ms") && i + 1 < argc) b.op_s = atof(argv[++i]) * 1e-3;
        else if (!strcmp(argv[i], "--real")) b.real = 1;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) trace_path = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--assert-below") && i + 1 < argc) {
            if (pp_schedule_parse(argv[++i], &runs[1].kind) != ZERO_OK) {
                fprintf(stderr, "%s\n", gpt_last_error());
                return 2;
            }
            nruns = 2;
        } else {
            fprintf(stderr, "zero-bench-pipeline: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    zero_comm *world = NULL;
    if (zero_comm_create_world(&world, NULL) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return 1;
    }
    g_rank = zero_comm_get_rank(world);
    b.P = zero_comm_get_size(world), b.s = g_rank;
    /* simulated: the model only sizes the messages; real: big enough that compute dominates */
    b.cfg = b.real ? (gpt_config){.n_layer = 8, .n_head = 4, .d_model = 128, .seq_len = 64, .vocab = 256}
                 : (gpt_config){.n_layer = 8, .n_head = 4, .d_model = 64, .seq_len = 8, .vocab = 64};
    b.B = b.real ? 4 : 2, b.T = b.real ? 64 : 8;
    size_t np = gpt_num_params(&b.cfg), N = (size_t)b.M * b.B * b.T;
    int nm = gpt_num_modules(&b.cfg);
    b.p = calloc(np, sizeof *b.p), b.g = calloc(np, sizeof *b.g);
    b.ps = calloc((size_t)nm, sizeof *b.ps), b.gs = calloc((size_t)nm, sizeof *b.gs);
    for (size_t i = 0; i < np; i++) {
        gpt_param_info info;
        gpt_param_info_get(&b.cfg, i, &info);
        b.p[i] = malloc(sizeof(float) * info.numel);
        b.g[i] = calloc(info.numel, sizeof(float));
        gpt_param_init(&b.cfg, &info, 1234, b.p[i]);
        b.ps[info.module].t[info.index] = b.p[i];
        b.gs[info.module].t[info.index] = b.g[i];
    }
    b.tok = malloc(sizeof(int32_t) * N), b.tgt = malloc(sizeof(int32_t) * N);
    for (size_t i = 0; i < N; i++) b.tok[i] = (int32_t)(i * 7 % (size_t)b.cfg.vocab), b.tgt[i] = (int32_t)(i * 13 % (size_t)b.cfg.vocab);
    for (int k = 0; k < nruns; k++)
        if (setup(&b, &runs[k])) return 1;
    /* step 0 warms up; the schedules alternate step by step (same-run comparison) */
    for (int st = 0; st <= steps; st++)
        for (int k = 0; k < nruns; k++)
            if (step(&b, &runs[k], world, st > 0) < 0) return 1;
    FILE *json = g_rank == 0 && json_path ? fopen(json_path, "w") : NULL;
    if (json) fprintf(json, "[\n");
    for (int k = 0; k < nruns; k++) report(&b, &runs[k], world, json, k == 0);
    if (json) fprintf(json, "\n]\n"), fclose(json);
    int rc = 0;
    if (trace_path) {
        char label[64];
        snprintf(label, sizeof label, "%s p%d m%d %s", runs[0].plan.name, b.P, b.M, b.real ? "real" : "simulated");
        if (pp_trace_write(world, &runs[0].trace, g_rank, trace_path, label) != ZERO_OK) {
            fprintf(stderr, "%s\n", gpt_last_error());
            rc = 1;
        }
    }
    if (nruns == 2) {
        double m[2];
        for (int k = 0; k < 2; k++) {
            double mine = runs[k].steps ? runs[k].bubble_sum / runs[k].steps : 0;
            zero_allreduce(world, &mine, &m[k], 1, ZERO_F64, ZERO_SUM);
        }
        if (!(m[0] < m[1])) {
            if (g_rank == 0)
                fprintf(stderr, "ASSERTION: %s's measured bubble %.3f is not below %s's %.3f\n", runs[0].plan.name,
                        m[0] / b.P, runs[1].plan.name, m[1] / b.P);
            rc = 1;
        } else if (g_rank == 0) {
            printf("%s's measured bubble %.3f < %s's %.3f\n", runs[0].plan.name, m[0] / b.P, runs[1].plan.name, m[1] / b.P);
        }
    }
    for (int k = 0; k < nruns; k++) {
        for (int c = 0; c < 8; c++) tp_workspace_destroy(runs[k].ws[c]);
        pp_plan_free(&runs[k].plan);
        pp_trace_free(&runs[k].trace);
    }
    for (size_t i = 0; i < np; i++) free(b.p[i]), free(b.g[i]);
    free(b.p), free(b.g), free(b.ps), free(b.gs), free(b.tok), free(b.tgt);
    zero_comm_destroy(world);
    return rc;
}
