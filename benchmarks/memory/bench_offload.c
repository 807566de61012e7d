/* zero-bench offload: step time with the optimizer state offloaded to NVMe
 * (and to the host pool) against the same engine without offload, on the
 * same model, in one run (CPU device).
 *
 * Three engines of one stage live side by side, each on its own duplicate
 * of the world comm; every repetition runs one step of each, rotating which
 * goes first, so load noise hits all alike. A step's time is the slowest
 * rank's; we report medians, the ratio of medians to "none" and the median
 * of per-repetition ratios ("paired"), plus the bytes each step moved to
 * and from the store. No target: the figure says what NVMe offload costs on
 * this machine's disk for this model size. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_alternate.h"
#include "bench_cmds.h"
#include "bench_model.h"
#include "bench_run.h"
#include "bench_util.h"

#define NMODES 3
static const char *const mode_name[NMODES] = {"none", "cpu", "nvme"};

static void usage(void)
{
    fprintf(stderr,
            "usage: tests/mpirun.sh W zero-bench offload --dir DIR --params N [options]\n"
            "  Median step time with offload_optimizer none / cpu / nvme (swap files under DIR)\n"
            "  on one model in one run; prints each mode's ratio to none.\n"
            "  Defaults: --params 2e6 --stage 2 --steps 11 --warmup 2 --gemm 96 --gemm-reps 2\n"
            "  --sub-group 1e6 --buffer-count 4 --aio-qd 8 --aio-block 1048576.\n"
            "  --dir DIR           existing directory for the swap files (required)\n"
            "  --stage S           ZeRO stage 1..3\n"
            "  --sub-group N, --buffer-count N, --aio-qd N, --aio-block BYTES   offload settings\n%s"
            "  --warmup N          unmeasured repetitions first\n"
            "  --gemm N, --gemm-reps N   synthetic compute per module (0 = none)\n",
            bench_run_usage);
}

/* Take the offload options out of argv (the rest goes to bench_run_parse). */
static int take_opts(int *argc, char **argv, const char **dir, int *stage, double *sub_group, int *buffer_count,
                     int *qd, double *block)
{
    int out = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        const int has = i + 1 < *argc;
        if (!strcmp(a, "--dir") && has) *dir = argv[++i];
        else if (!strcmp(a, "--stage") && has) *stage = atoi(argv[++i]);
        else if (!strcmp(a, "--sub-group") && has) *sub_group = atof(argv[++i]);
        else if (!strcmp(a, "--buffer-count") && has) *buffer_count = atoi(argv[++i]);
        else if (!strcmp(a, "--aio-qd") && has) *qd = atoi(argv[++i]);
        else if (!strcmp(a, "--aio-block") && has) *block = atof(argv[++i]);
        else argv[out++] = argv[i];
    }
    *argc = out;
    return 0;
}

int bench_cmd_offload(int argc, char **argv)
{
    bench_run_opts o = {
        .params = 2e6, .layers = 8, .dtype = ZERO_F32, .optimizer = ZERO_OPTIM_ADAMW, .bucket = 5e8,
        .persistence = 1e5, .prefetch = 5e7, .overlap = 1, .stage_mask = 0xF, .steps = 11, .warmup = 2,
        .gemm_n = 96, .gemm_reps = 2,
    };
    const char *dir = NULL;
    int stage = 2, buffer_count = 4, qd = 8;
    double sub_group = 1e6, block = 1048576;
    take_opts(&argc, argv, &dir, &stage, &sub_group, &buffer_count, &qd, &block);
    int prc = bench_run_parse(&o, argc, argv, "offload");
    if (prc || !dir || stage < 1 || stage > 3) {
        if (!prc && !dir) fprintf(stderr, "zero-bench offload: --dir is required\n");
        if (!prc && (stage < 1 || stage > 3)) fprintf(stderr, "zero-bench offload: --stage must be 1..3\n");
        usage();
        return prc == 1 ? 0 : 2;
    }
    bench_model m;
    if (bench_model_init(&m, o.params, o.layers)) {
        fprintf(stderr, "zero-bench offload: --params must be at least 1000\n");
        return 2;
    }
    if (bench_model_set_compute(&m, o.gemm_n, o.gemm_reps)) {
        fprintf(stderr, "zero-bench offload: out of memory for the gemm scratch\n");
        return 1;
    }
    zero_comm *world = NULL;
    zero_device *dev = NULL;
    if (bench_run_setup(&o, &world, &dev, "offload")) return 1;
    const int rank = zero_comm_get_rank(world), size = zero_comm_get_size(world);

    zero_comm *comm[NMODES] = {NULL};
    zero_engine *eng[NMODES] = {NULL};
    zero_config cfg[NMODES];
    double *times = calloc((size_t)NMODES * o.steps, sizeof *times);
    int rc = times ? 0 : 1;
    for (int k = 0; k < NMODES && !rc; k++) {
        cfg[k] = bench_run_config(&o, stage);
        cfg[k].offload_optimizer_device = (zero_offload_device)k; /* none, cpu, nvme */
        snprintf(cfg[k].offload_nvme_path, sizeof cfg[k].offload_nvme_path, "%s", dir);
        cfg[k].sub_group_size = (uint64_t)sub_group;
        cfg[k].offload_buffer_count = buffer_count;
        cfg[k].aio_queue_depth = qd;
        cfg[k].aio_block_size = (uint64_t)block;
        rc = bench_alt_engine(&m, world, dev, &cfg[k], &comm[k], &eng[k], "offload");
    }
    zero_offload_report before = {0}, after = {0};
    for (int rep = -o.warmup; rep < o.steps && !rc; rep++) {
        if (rep == 0) rc = bench_failed(zero_engine_get_offload_report(eng[2], &before), "offload: report");
        for (int j = 0; j < NMODES && !rc; j++) {
            int k = (j + (rep < 0 ? 0 : rep)) % NMODES;
            double dt = 0;
            rc = bench_alt_step(&m, eng[k], world, dev, "offload", mode_name[k], &dt);
            if (rep >= 0) times[(size_t)k * o.steps + rep] = dt;
        }
    }
    if (!rc) rc = bench_failed(zero_engine_get_offload_report(eng[2], &after), "offload: report");
    if (!rc) rc = bench_alt_slowest(world, times, (size_t)NMODES * o.steps, "offload");
    if (!rc && rank == 0) {
        double med[NMODES], mn[NMODES], paired[NMODES];
        for (int k = 0; k < NMODES; k++) bench_alt_stats(times, o.steps, k, &med[k], &mn[k], &paired[k]);
        const double io_per_step =
            (double)((after.nvme_read - before.nvme_read) + (after.nvme_written - before.nvme_written)) / o.steps;
        printf("zero-bench offload: %llu params, world %d, stage %d, %s, %d OpenMP thread%s per rank;\n"
               "  nvme: %s, %llu chunks of %llu elements, buffer_count %d, aio qd %d, block %.0f B;\n"
               "  per rank on NVMe %.1f MiB, host buffers %.1f MiB; %.1f MiB moved per step (read + write);\n"
               "  %d measured steps per mode after %d warm-up, interleaved; time = slowest rank\n",
               (unsigned long long)m.numel, size, stage, zero_dtype_name(o.dtype), bench_run_threads(),
               bench_run_threads() == 1 ? "" : "s", dir, (unsigned long long)after.num_chunks,
               (unsigned long long)after.chunk_numel, buffer_count, qd, block, after.nvme_bytes / 1048576.0,
               after.host_bytes / 1048576.0, io_per_step / 1048576.0, o.steps, o.warmup);
        printf("%-6s %12s %10s %10s %10s\n", "mode", "median ms", "min ms", "ratio", "paired");
        json_t *root = json_object(), *jm = json_array();
        for (int k = 0; k < NMODES; k++) {
            printf("%-6s %12.3f %10.3f %10.3f %10.3f\n", mode_name[k], med[k] * 1e3, mn[k] * 1e3, med[k] / med[0],
                   paired[k]);
            json_t *j = json_object(), *jt = json_array();
            for (int i = 0; i < o.steps; i++) json_array_append_new(jt, json_real(times[(size_t)k * o.steps + i]));
            json_object_set_new(j, "mode", json_string(mode_name[k]));
            json_object_set_new(j, "median_s", json_real(med[k]));
            json_object_set_new(j, "min_s", json_real(mn[k]));
            json_object_set_new(j, "ratio_to_none", json_real(med[k] / med[0]));
            json_object_set_new(j, "paired_ratio_median", json_real(paired[k]));
            json_object_set_new(j, "times_s", jt);
            json_array_append_new(jm, j);
        }
        if (o.json_path) {
            json_object_set_new(root, "benchmark", json_string("offload"));
            json_object_set_new(root, "numel", json_integer((json_int_t)m.numel));
            json_object_set_new(root, "world", json_integer(size));
            json_object_set_new(root, "stage", json_integer(stage));
            json_object_set_new(root, "dtype", json_string(zero_dtype_name(o.dtype)));
            json_object_set_new(root, "dir", json_string(dir));
            json_object_set_new(root, "chunk_numel", json_integer((json_int_t)after.chunk_numel));
            json_object_set_new(root, "num_chunks", json_integer((json_int_t)after.num_chunks));
            json_object_set_new(root, "buffer_count", json_integer(buffer_count));
            json_object_set_new(root, "aio_queue_depth", json_integer(qd));
            json_object_set_new(root, "aio_block_size", json_real(block));
            json_object_set_new(root, "nvme_bytes", json_integer((json_int_t)after.nvme_bytes));
            json_object_set_new(root, "host_bytes", json_integer((json_int_t)after.host_bytes));
            json_object_set_new(root, "io_bytes_per_step", json_real(io_per_step));
            json_object_set_new(root, "steps", json_integer(o.steps));
            json_object_set_new(root, "modes", jm);
            if (json_dump_file(root, o.json_path, JSON_INDENT(2))) {
                fprintf(stderr, "zero-bench offload: cannot write %s\n", o.json_path);
                rc = 1;
            }
        } else {
            json_decref(jm);
        }
        json_decref(root);
    }
    for (int k = 0; k < NMODES; k++) {
        zero_engine_destroy(eng[k]);
        zero_comm_destroy(comm[k]);
    }
    free(times);
    bench_model_free(&m);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return rc;
}
