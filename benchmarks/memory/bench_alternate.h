/* zero-bench: engines side by side in one run, their steps alternated so
 * that machine noise and drift hit them alike (steptime: the stages;
 * overlap: overlap_comm off and on; offload: none, cpu, nvme). */
#ifndef ZERO_BENCH_ALTERNATE_H
#define ZERO_BENCH_ALTERNATE_H

#include <stddef.h>
#include <zero/zero.h>

#include "bench_model.h"

/* An engine of config `c` on its own duplicate of `world` (so its byte
 * counters are its own), the model registered and finalized. COLLECTIVE.
 * 0, or 1 after printing "zero-bench <cmd>: ..." naming the failed call. */
int bench_alt_engine(const bench_model *m, zero_comm *world, zero_device *dev, const zero_config *c,
                     zero_comm **comm, zero_engine **eng, const char *cmd);

/* The model's synthetic compute of one step alone, for scale: the median
 * of 5, in seconds. */
double bench_alt_compute_alone(bench_model *m);

/* One step of engine `e` after a barrier (every rank starts it together):
 * this rank's seconds into *dt. 0, or 1 after printing
 * "zero-bench <cmd> <label> (rank r): status: message". */
int bench_alt_step(bench_model *m, zero_engine *e, zero_comm *world, zero_device *dev, const char *cmd,
                   const char *label, double *dt);

/* times[0..n) made the slowest rank's (a step takes as long as its slowest
 * rank). COLLECTIVE. 0, or 1 after printing what failed. */
int bench_alt_slowest(zero_comm *world, double *times, size_t n, const char *cmd);

/* Of series k of times[k * steps + rep]: the median, the minimum, and the
 * median of its per-repetition ratios to series 0 (the step of series 0 ran
 * beside it, under the same load: steadier than the ratio of medians when
 * the load drifts; 0 when out of memory). */
void bench_alt_stats(const double *times, int steps, int k, double *median, double *min, double *paired);

#endif
