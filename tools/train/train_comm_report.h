/* zero-train's communication report: the bytes this rank sent in each of
 * its process groups (dp / the engine's, tp, cp, pp, ep), by op kind, per
 * step of the run, from the collectives' byte counters (comm.h: the
 * ring-optimal volume of each op). The summary line "rank 0 bytes sent per
 * step" is what docs/sequence-parallel.md's traffic table measures. */
#ifndef TRAIN_COMM_REPORT_H
#define TRAIN_COMM_REPORT_H

#include <stdint.h>
#include <zero/zero.h>

#include "train_run.h"

#define TRAIN_COMM_GROUPS 6

typedef struct train_comm_report {
    int n;
    const char *name[TRAIN_COMM_GROUPS];
    zero_comm *comm[TRAIN_COMM_GROUPS];
    zero_comm_counters base[TRAIN_COMM_GROUPS];
} train_comm_report;

/* The run's groups and their counters now (before the first step). */
void train_comm_report_start(train_comm_report *t, const run *r);
/* Rank 0: one summary line, the bytes sent since the start divided by `steps`. */
void train_comm_report_print(const train_comm_report *t, int64_t steps);

#endif
