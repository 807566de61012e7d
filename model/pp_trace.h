/* A step timeline: spans of what each pipeline rank did (forward, backward,
 * weight gradients, waiting for communication, the optimizer), written as
 * Chrome trace-event JSON (one track per rank; chrome://tracing, Perfetto).
 *
 * Times are CLOCK_MONOTONIC seconds, the same clock on every process of one
 * host, so ranks on one machine line up; across hosts each rank's track is
 * shifted so that its first span starts at its own step start (no clock
 * sync is attempted). */
#ifndef ZERO_MODEL_PP_TRACE_H
#define ZERO_MODEL_PP_TRACE_H

#include <zero/comm.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pp_span_kind {
    PP_SPAN_FORWARD = 0,
    PP_SPAN_BACKWARD = 1,      /* B: input gradients (or the whole backward, unsplit) */
    PP_SPAN_WEIGHT_GRAD = 2,   /* W */
    PP_SPAN_COMM = 3,          /* waiting for a receive or a send to complete */
    PP_SPAN_OPTIMIZER = 4,     /* the step after the flush (tied-gradient sum, grads-ready, optimizer) */
    PP_SPAN_KIND_COUNT = 5,
} pp_span_kind;

typedef struct pp_span {
    int kind, micro, chunk, step;
    double t0, t1;
} pp_span;

typedef struct pp_trace {
    pp_span *spans;
    int n, cap;
    int step; /* stamped on the spans added */
} pp_trace;

double pp_now(void);
/* Append a span (silently dropped when out of memory; NULL trace: nothing). */
void pp_trace_add(pp_trace *t, pp_span_kind kind, int micro, int chunk, double t0, double t1);
void pp_trace_free(pp_trace *t);
const char *pp_span_name(pp_span_kind kind);

/* COLLECTIVE over `world`: rank 0 gathers every rank's spans and writes
 * them to `path` as Chrome trace-event JSON ({"traceEvents": [...]}), one
 * process track per rank named "rank R (pp stage S)" (`stage` is this rank's
 * pipeline stage, -1 when none), times in microseconds from the earliest
 * span. `label` names the run in the metadata. */
zero_status pp_trace_write(zero_comm *world, const pp_trace *t, int stage, const char *path, const char *label);

/* Busy (forward, backward, weight-gradient spans) and total time of step
 * `step` on this rank: total = the step's last span end minus the earliest
 * start over ALL ranks (so idle time at the start counts), which needs the
 * world's minimum start: pass it as `t_start` (pp_trace_step_start). */
void pp_trace_busy(const pp_trace *t, int step, double *busy, double *t_first, double *t_last);

#ifdef __cplusplus
}
#endif

#endif
