/* zero-bench overlap: overlap_comm on against off, per stage, in one run
 * (CPU backend; meant for world size 2).
 *
 * For each stage two engines live side by side, one with overlap_comm 0 and
 * one with 1, each on its own duplicate of the world comm; every repetition
 * runs one step of each, the order alternating, so machine noise hits both
 * alike. A step's time is the slowest rank's; medians over the repetitions.
 * "on/off" is the ratio of medians (below 1: overlap wins). "hidden" is
 * (off - on) / (off - compute), compute being the synthetic compute of a
 * step measured alone: off - compute is the communication plus the engine's
 * own work, an upper bound on the communication, so "hidden" is a lower
 * bound on the fraction of communication that overlap hid (negative: it
 * cost time). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_alternate.h"
#include "bench_cmds.h"
#include "bench_model.h"
#include "bench_run.h"
#include "bench_util.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: tests/mpirun.sh 2 zero-bench overlap --params N [options]\n"
            "  Median step time with overlap_comm 0 and 1 side by side, per stage, alternated in one\n"
            "  run. Defaults: --params 2e6 --dtype fp32 --stages 1,2,3 --steps 15 --warmup 3 --gemm 96\n"
            "  --gemm-reps 2. --overlap is ignored (both are run).\n%s",
            bench_run_usage);
}

int bench_cmd_overlap(int argc, char **argv)
{
    bench_run_opts o = {
        .params = 2e6, .layers = 8, .dtype = ZERO_F32, .optimizer = ZERO_OPTIM_ADAMW, .bucket = 5e8,
        .persistence = 1e5, .prefetch = 5e7, .overlap = 0, .stage_mask = 0xE, .steps = 15, .warmup = 3,
        .gemm_n = 96, .gemm_reps = 2,
    };
    int prc = bench_run_parse(&o, argc, argv, "overlap");
    if (prc) {
        usage();
        return prc == 1 ? 0 : 2;
    }
    bench_model m;
    if (bench_model_init(&m, o.params, o.layers) || bench_model_set_compute(&m, o.gemm_n, o.gemm_reps)) {
        fprintf(stderr, "zero-bench overlap: --params must be at least 1000 (or out of memory)\n");
        return 2;
    }
    zero_comm *world = NULL;
    zero_device *dev = NULL;
    if (bench_run_setup(&o, &world, &dev, "overlap")) return 1;
    const int rank = zero_comm_rank(world), size = zero_comm_size(world);
    enum { N = 8 }; /* engine k: stage k / 2, overlap k % 2 */
    zero_comm *comm[N] = {NULL};
    zero_engine *eng[N] = {NULL};
    double *times = calloc((size_t)N * o.steps, sizeof *times);
    int rc = times ? 0 : 1;
    for (int k = 0; k < N && !rc; k++) {
        if (!(o.stage_mask & (1u << (k / 2)))) continue;
        bench_run_opts ok = o;
        ok.overlap = k % 2;
        zero_config c = bench_run_config(&ok, k / 2);
        rc = bench_alt_engine(&m, world, dev, &c, &comm[k], &eng[k], "overlap");
    }
    const double compute_s = rc ? 0 : bench_alt_compute_alone(&m);
    for (int rep = -o.warmup; rep < o.steps && !rc; rep++) {
        for (int j = 0; j < N && !rc; j++) {
            int k = (j / 2) * 2 + ((j + (rep < 0 ? 0 : rep)) % 2); /* alternate which goes first */
            if (!eng[k]) continue;
            char label[48];
            double dt = 0;
            snprintf(label, sizeof label, "stage %d overlap %d", k / 2, k % 2);
            rc = bench_alt_step(&m, eng[k], world, dev, "overlap", label, &dt);
            if (rep >= 0) times[(size_t)k * o.steps + rep] = dt;
        }
    }
    if (!rc) rc = bench_alt_slowest(world, times, (size_t)N * o.steps, "overlap");
    if (!rc && rank == 0) {
        printf("zero-bench overlap: %llu params, world %d, %s, %d thread(s) per rank, compute alone %.2f ms per step, "
               "median of %d\n",
               (unsigned long long)m.numel, size, zero_dtype_name(o.dtype), bench_run_threads(), compute_s * 1e3,
               o.steps);
        printf("%-6s %12s %12s %8s %8s\n", "stage", "off ms", "on ms", "on/off", "hidden");
        json_t *rows = json_array();
        for (int s = 0; s < 4; s++) {
            if (!eng[2 * s]) continue;
            double off = bench_median(&times[(size_t)(2 * s) * o.steps], o.steps);
            double on = bench_median(&times[(size_t)(2 * s + 1) * o.steps], o.steps);
            double hidden = off > compute_s ? (off - on) / (off - compute_s) : 0;
            printf("%-6d %12.3f %12.3f %8.3f %8.3f\n", s, off * 1e3, on * 1e3, on / off, hidden);
            json_array_append_new(rows, json_pack("{s:i, s:f, s:f, s:f, s:f}", "stage", s, "off_s", off, "on_s", on,
                                                  "on_over_off", on / off, "hidden_lower_bound", hidden));
        }
        json_t *root = json_pack("{s:s, s:I, s:i, s:s, s:f, s:o}", "benchmark", "overlap", "numel",
                                 (json_int_t)m.numel, "world", size, "dtype", zero_dtype_name(o.dtype),
                                 "compute_only_s", compute_s, "stages", rows);
        if (o.json_path && json_dump_file(root, o.json_path, JSON_INDENT(2))) {
            fprintf(stderr, "zero-bench overlap: cannot write %s\n", o.json_path);
            rc = 1;
        }
        json_decref(root);
    }
    for (int k = 0; k < N; k++) {
        zero_engine_destroy(eng[k]);
        zero_comm_destroy(comm[k]);
    }
    free(times);
    bench_model_free(&m);
    zero_device_close(dev);
    zero_comm_destroy(world);
    return rc;
}
