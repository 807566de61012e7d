/* zero-bench: options and setup shared by the commands that run the engine
 * (memory, steptime). */
#ifndef ZERO_BENCH_RUN_H
#define ZERO_BENCH_RUN_H

#include <zero/zero.h>

#define BENCH_MAX_DP_SIZES 8

typedef struct bench_run_opts {
    double params;           /* target parameter count */
    int layers;              /* MLP blocks (modules) */
    int world;               /* expected world size; 0 = whatever mpirun gave */
    zero_dtype dtype;        /* compute dtype */
    zero_optimizer_kind optimizer;
    double momentum;         /* SGD only */
    double bucket;           /* reduce_bucket_size (elements) */
    double persistence;      /* stage3_param_persistence_threshold (elements) */
    double prefetch;         /* stage3_prefetch_bucket_size (elements) */
    int overlap;             /* overlap_comm */
    unsigned stage_mask;     /* bit s: run stage s */
    int steps;               /* measured steps (steptime: repetitions) */
    int warmup;              /* steptime: unmeasured steps first */
    int gemm_n, gemm_reps;   /* steptime: synthetic compute per module */
    int threads;             /* OpenMP threads per rank; 0 = online cores / ranks on this node */
    int dp_sizes[BENCH_MAX_DP_SIZES], ndp; /* memory: dp sizes to measure; none = the world */
    int cpu_clock;           /* stepcost: time by process CPU time, not the wall clock */
    const char *json_path, *csv_path;
} bench_run_opts;

/* Parse argv into *o (defaults already set by the caller). Returns 0, or
 * prints what is wrong and returns 2. "--help" returns 1. */
int bench_run_parse(bench_run_opts *o, int argc, char **argv, const char *cmd);
/* The options every engine command takes, for usage texts. */
extern const char bench_run_usage[];

/* World comm (MPI under mpirun, LOCAL alone) and the CPU device; checks
 * --world against the real size. Returns 0 or prints and returns 1. */
int bench_run_setup(const bench_run_opts *o, zero_comm **world, zero_device **dev, const char *cmd);

/* The OpenMP threads each rank's engine uses (set by bench_run_setup). */
int bench_run_threads(void);

/* An engine config for stage `stage` from the options. */
zero_config bench_run_config(const bench_run_opts *o, int stage);

#endif
