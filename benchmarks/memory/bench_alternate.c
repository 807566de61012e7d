/* zero-bench: engines side by side, steps alternated (bench_alternate.h). */
#include "bench_alternate.h"

#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

int bench_alt_engine(const bench_model *m, zero_comm *world, zero_device *dev, const zero_config *c,
                     zero_comm **comm, zero_engine **eng, const char *cmd)
{
    char what[3][64];
    snprintf(what[0], sizeof what[0], "%s: comm split", cmd);
    snprintf(what[1], sizeof what[1], "%s: engine create", cmd);
    snprintf(what[2], sizeof what[2], "%s: register + finalize", cmd);
    return bench_failed(zero_comm_split(world, 0, zero_comm_get_rank(world), comm), what[0]) ||
           bench_failed(zero_engine_create(eng, c, *comm, dev), what[1]) ||
           bench_failed(bench_model_register(m, *eng), what[2]);
}

double bench_alt_compute_alone(bench_model *m)
{
    double t[5];
    for (int k = 0; k < 5; k++) {
        double t0 = bench_now_s();
        bench_model_compute_step(m);
        t[k] = bench_now_s() - t0;
    }
    return bench_median(t, 5);
}

int bench_alt_step(bench_model *m, zero_engine *e, zero_comm *world, zero_device *dev, const char *cmd,
                   const char *label, double *dt)
{
    char what[64];
    snprintf(what, sizeof what, "%s: barrier", cmd);
    if (bench_failed(zero_barrier(world), what)) return 1;
    const int rank = zero_comm_get_rank(world);
    double t0 = bench_now_s();
    zero_status st = bench_model_step(m, e, dev, rank, NULL);
    *dt = bench_now_s() - t0;
    if (st == ZERO_OK) return 0;
    fprintf(stderr, "zero-bench %s %s (rank %d): %s: %s\n", cmd, label, rank, zero_status_name(st),
            zero_engine_last_error(e));
    return 1;
}

int bench_alt_slowest(zero_comm *world, double *times, size_t n, const char *cmd)
{
    char what[64];
    snprintf(what, sizeof what, "%s: allreduce of times", cmd);
    return bench_failed(zero_allreduce(world, times, times, n, ZERO_F64, ZERO_MAX), what);
}

void bench_alt_stats(const double *times, int steps, int k, double *median, double *min, double *paired)
{
    const double *t = &times[(size_t)k * steps];
    *median = bench_median(t, steps);
    *min = t[0];
    for (int i = 1; i < steps; i++)
        if (t[i] < *min) *min = t[i];
    *paired = 0;
    double *ratios = malloc((size_t)steps * sizeof *ratios);
    if (!ratios) return;
    for (int i = 0; i < steps; i++) ratios[i] = t[i] / times[i];
    *paired = bench_median(ratios, steps);
    free(ratios);
}
