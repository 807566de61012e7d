/* zero-bench: a synthetic transformer-shaped model for the engine.
 *
 * About `target` parameters in a few dozen tensors of mixed sizes: an
 * embedding [251, h] (251 is prime, so buckets never divide evenly), `layers`
 * MLP blocks (layer norm weight/bias [h], fc1 [4h, h] + bias [4h], fc2
 * [h, 4h] + bias [h]) and a head (final norm [h] x2 and a one-element scale),
 * with h the largest width that keeps the total at or below the target.
 * Every layer is one module (the stage-3 gather unit).
 *
 * The "training" is synthetic: each module's forward and backward run a
 * fixed amount of sgemm work on scratch matrices (so overlap_comm has
 * compute to hide communication behind) and the gradient of every parameter
 * is a constant fill; the engine does everything else for real. */
#ifndef ZERO_BENCH_MODEL_H
#define ZERO_BENCH_MODEL_H

#include <stdint.h>
#include <zero/zero.h>

#define BENCH_MAX_PARAMS 512

typedef struct bench_param {
    char name[64];
    int module;
    int ndim;
    int64_t shape[2];
    uint64_t numel;
} bench_param;

typedef struct bench_model {
    int hidden;
    int num_modules;
    int num_params;
    uint64_t numel;
    bench_param params[BENCH_MAX_PARAMS];
    char module_names[BENCH_MAX_PARAMS][32];
    /* synthetic compute: forward runs `gemm_reps` products of gemm_n x gemm_n
     * matrices per module, backward twice as many; 0 = no compute. */
    int gemm_n;
    int gemm_reps;
    float *scratch; /* 3 * gemm_n^2 floats */
} bench_model;

/* Lay out the model; 0 on success, -1 if the target is too small (< 1000). */
int bench_model_init(bench_model *m, double target, int layers);
/* Allocate the gemm scratch; 0 on success. */
int bench_model_set_compute(bench_model *m, int gemm_n, int gemm_reps);
void bench_model_free(bench_model *m);

/* Register the modules and parameters (deterministic init values, the same
 * on every rank) and finalize. COLLECTIVE through finalize. */
zero_status bench_model_register(const bench_model *m, zero_engine *e);

/* One optimizer step: forward and backward over every module (gather,
 * compute, fill grads, grads_ready, release) then zero_engine_step. */
zero_status bench_model_step(bench_model *m, zero_engine *e, zero_device *dev, int rank,
                             zero_step_result *result);

/* The same without the step: forward and backward of one micro-step. */
zero_status bench_model_micro(bench_model *m, zero_engine *e, zero_device *dev, int rank);
/* The synthetic compute of one step alone (no engine calls), for scale. */
void bench_model_compute_step(bench_model *m);

/* What the engine's memory report must say in steady state: the ZeRO
 * formula (zero_memory_estimate on the padded count) plus the buffers the
 * engine declares in engine.h, per category. `formula` gets the paper's
 * terms alone, `expected` formula + declared buffers. */
zero_status bench_expected_memory(zero_engine *e, const zero_config *cfg, zero_memory_report *formula,
                                  zero_memory_report *expected);

#endif
