/* zero-bench steptime: step time of stages 1, 2 and 3 against stage 0 on
 * the same model, in one run (CPU backend; meant for world size 2).
 *
 * All four engines live side by side, each on its own duplicate of the world
 * comm (so its byte counters are its own), and every repetition runs one
 * step of each stage, starting with a different stage each time: machine
 * noise and drift hit every stage alike. A step's time is the slowest
 * rank's; we report the median over repetitions after a warm-up, the ratio
 * of medians ("ratio", the figure held to the targets) and, as a check on
 * load noise, the median of the per-repetition ratios ("paired"). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_alternate.h"
#include "bench_cmds.h"
#include "bench_model.h"
#include "bench_run.h"
#include "bench_util.h"

static const double stage_target[4] = {1.0, 1.05, 1.05, 1.15};

static void usage(void)
{
    fprintf(stderr,
            "usage: tests/mpirun.sh 2 zero-bench steptime --params N [options]\n"
            "  Median step time of stages 0-3 on one model in one run; prints each stage's\n"
            "  ratio to stage 0 (targets: <= 1.05 for stages 1-2, <= 1.15 for stage 3).\n"
            "  Defaults: --params 2e6 --dtype fp32 --overlap 1 --steps 21 --warmup 3\n"
            "  --gemm 96 --gemm-reps 2 (sgemm of n x n per module: forward reps, backward 2x).\n%s"
            "  --warmup N          unmeasured repetitions first\n"
            "  --gemm N, --gemm-reps N   synthetic compute per module (0 = none)\n",
            bench_run_usage);
}

int bench_cmd_steptime(int argc, char **argv)
{
    bench_run_opts o = {
        .params = 2e6, .layers = 8, .dtype = ZERO_F32, .optimizer = ZERO_OPTIM_ADAMW, .bucket = 5e8,
        .persistence = 1e5, .prefetch = 5e7, .overlap = 1, .stage_mask = 0xF, .steps = 21, .warmup = 3,
        .gemm_n = 96, .gemm_reps = 2,
    };
    int prc = bench_run_parse(&o, argc, argv, "steptime");
    if (prc) {
        usage();
        return prc == 1 ? 0 : 2;
    }
    o.stage_mask |= 1u; /* stage 0 is the reference */
    bench_model m;
    if (bench_model_init(&m, o.params, o.layers)) {
        fprintf(stderr, "zero-bench steptime: --params must be at least 1000\n");
        return 2;
    }
    if (bench_model_set_compute(&m, o.gemm_n, o.gemm_reps)) {
        fprintf(stderr, "zero-bench steptime: out of memory for the gemm scratch\n");
        return 1;
    }
    zero_comm *world = NULL;
    zero_device *dev = NULL;
    if (bench_run_setup(&o, &world, &dev, "steptime")) return 1;
    const int rank = zero_comm_get_rank(world), size = zero_comm_get_size(world);

    zero_comm *comm[4] = {NULL};
    zero_engine *eng[4] = {NULL};
    zero_config cfg[4];
    double *times = calloc((size_t)4 * o.steps, sizeof *times);
    uint64_t sent[4] = {0};
    int rc = times ? 0 : 1;
    for (int s = 0; s < 4 && !rc; s++) {
        if (!(o.stage_mask & (1u << s))) continue;
        cfg[s] = bench_run_config(&o, s);
        rc = bench_alt_engine(&m, world, dev, &cfg[s], &comm[s], &eng[s], "steptime");
    }
    const double compute_s = rc ? 0 : bench_alt_compute_alone(&m); /* for scale */

    for (int rep = -o.warmup; rep < o.steps && !rc; rep++) {
        if (rep == 0)
            for (int s = 0; s < 4; s++)
                if (comm[s]) zero_comm_reset_counters(comm[s]);
        for (int k = 0; k < 4 && !rc; k++) {
            int s = (k + (rep < 0 ? 0 : rep)) % 4; /* rotate which stage goes first */
            if (!eng[s]) continue;
            char label[16];
            double dt = 0;
            snprintf(label, sizeof label, "stage %d", s);
            rc = bench_alt_step(&m, eng[s], world, dev, "steptime", label, &dt);
            if (rep >= 0) times[(size_t)s * o.steps + rep] = dt;
        }
    }
    for (int s = 0; s < 4 && !rc; s++) {
        if (!comm[s]) continue;
        zero_comm_counters cnt;
        rc = bench_failed(zero_comm_get_counters(comm[s], &cnt), "steptime: counters");
        for (int k = 0; k < ZERO_OP_KIND_COUNT && !rc; k++) sent[s] += cnt.bytes_sent[k];
    }
    if (!rc) rc = bench_alt_slowest(world, times, (size_t)4 * o.steps, "steptime");

    if (!rc && rank == 0) {
        double med[4] = {0}, mn[4] = {0}, paired[4] = {0};
        for (int s = 0; s < 4; s++)
            if (eng[s]) bench_alt_stats(times, o.steps, s, &med[s], &mn[s], &paired[s]);
        printf("zero-bench steptime: %llu params (%d tensors, %d modules, h=%d), world %d, %s, overlap_comm %d,\n"
               "  %d OpenMP thread%s per rank, sgemm %dx%d x%d per module forward (x2 backward): compute alone %.2f ms per step;\n"
               "  %d measured steps per stage after %d warm-up, interleaved; time = slowest rank\n",
               (unsigned long long)m.numel, m.num_params, m.num_modules, m.hidden, size,
               zero_dtype_name(o.dtype), o.overlap, bench_run_threads(), bench_run_threads() == 1 ? "" : "s", o.gemm_n, o.gemm_n, o.gemm_reps, compute_s * 1e3, o.steps,
               o.warmup);
        printf("%-6s %12s %10s %10s %10s %8s %8s %14s\n", "stage", "median ms", "min ms", "ratio", "paired",
               "target", "met", "sent B/step");
        json_t *root = json_object(), *jst = json_array();
        for (int s = 0; s < 4; s++) {
            if (!eng[s]) continue;
            double ratio = med[s] / med[0];
            int met = ratio <= stage_target[s];
            printf("%-6d %12.3f %10.3f %10.3f %10.3f %8.2f %8s %14llu\n", s, med[s] * 1e3, mn[s] * 1e3, ratio,
                   paired[s], stage_target[s], s == 0 ? "-" : (met ? "yes" : "NO"),
                   (unsigned long long)(sent[s] / (uint64_t)o.steps));
            json_t *js = json_object(), *jt = json_array();
            for (int k = 0; k < o.steps; k++) json_array_append_new(jt, json_real(times[(size_t)s * o.steps + k]));
            json_object_set_new(js, "stage", json_integer(s));
            json_object_set_new(js, "median_s", json_real(med[s]));
            json_object_set_new(js, "min_s", json_real(mn[s]));
            json_object_set_new(js, "ratio_to_stage0", json_real(ratio));
            json_object_set_new(js, "paired_ratio_median", json_real(paired[s]));
            json_object_set_new(js, "target", json_real(stage_target[s]));
            json_object_set_new(js, "bytes_sent_per_step", json_integer((json_int_t)(sent[s] / (uint64_t)o.steps)));
            json_object_set_new(js, "times_s", jt);
            json_array_append_new(jst, js);
        }
        if (o.json_path) {
            json_object_set_new(root, "benchmark", json_string("steptime"));
            json_object_set_new(root, "numel", json_integer((json_int_t)m.numel));
            json_object_set_new(root, "world", json_integer(size));
            json_object_set_new(root, "dtype", json_string(zero_dtype_name(o.dtype)));
            json_object_set_new(root, "overlap_comm", json_integer(o.overlap));
            json_object_set_new(root, "threads_per_rank", json_integer(bench_run_threads()));
            json_object_set_new(root, "gemm_n", json_integer(o.gemm_n));
            json_object_set_new(root, "gemm_reps", json_integer(o.gemm_reps));
            json_object_set_new(root, "compute_only_s", json_real(compute_s));
            json_object_set_new(root, "steps", json_integer(o.steps));
            json_object_set_new(root, "warmup", json_integer(o.warmup));
            json_object_set_new(root, "stages", jst);
            if (json_dump_file(root, o.json_path, JSON_INDENT(2))) {
                fprintf(stderr, "zero-bench steptime: cannot write %s\n", o.json_path);
                rc = 1;
            }
        } else {
            json_decref(jst);
            jst = NULL;
        }
        json_decref(root);
    }
    for (int s = 0; s < 4; s++) {
        zero_engine_destroy(eng[s]);
        zero_comm_destroy(comm[s]);
    }
    free(times);
    bench_model_free(&m);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return rc;
}
