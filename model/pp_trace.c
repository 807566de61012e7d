/* Step timelines and their Chrome trace-event JSON (pp_trace.h). */
#include "pp_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt_internal.h"

double pp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void pp_trace_add(pp_trace *t, pp_span_kind kind, int micro, int chunk, double t0, double t1)
{
    if (!t) return;
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 256;
        pp_span *s = realloc(t->spans, sizeof *s * (size_t)cap);
        if (!s) return;
        t->spans = s, t->cap = cap;
    }
    t->spans[t->n++] = (pp_span){(int)kind, micro, chunk, t->step, t0, t1};
}

void pp_trace_free(pp_trace *t)
{
    if (!t) return;
    free(t->spans);
    memset(t, 0, sizeof *t);
}

const char *pp_span_name(pp_span_kind kind)
{
    static const char *const n[PP_SPAN_KIND_COUNT] = {"forward", "backward", "weight-grad", "comm", "optimizer"};
    return (int)kind >= 0 && kind < PP_SPAN_KIND_COUNT ? n[kind] : "?";
}

void pp_trace_busy(const pp_trace *t, int step, double *busy, double *t_first, double *t_last)
{
    double b = 0, f = 0, l = 0;
    int any = 0;
    for (int i = 0; t && i < t->n; i++) {
        const pp_span *s = &t->spans[i];
        if (s->step != step || s->kind == PP_SPAN_OPTIMIZER) continue;
        if (s->kind != PP_SPAN_COMM) b += s->t1 - s->t0;
        if (!any || s->t0 < f) f = s->t0;
        if (!any || s->t1 > l) l = s->t1;
        any = 1;
    }
    *busy = b, *t_first = f, *t_last = l;
}

/* Each span as 6 doubles (kind, micro, chunk, step, t0, t1) plus the stage. */
#define PP_SPAN_DOUBLES 6

zero_status pp_trace_write(zero_comm *world, const pp_trace *t, int stage, const char *path, const char *label)
{
    int n = world ? zero_comm_get_size(world) : 1, r = world ? zero_comm_get_rank(world) : 0;
    int64_t mine[2] = {t ? t->n : 0, stage}, *all = calloc((size_t)n * 2, sizeof(int64_t));
    if (!all) return gpt_fail(ZERO_OUT_OF_MEMORY, "pp_trace_write: out of memory");
    zero_status st = world ? zero_allgather(world, mine, all, 2, ZERO_I64) : ZERO_OK;
    if (!world) all[0] = mine[0], all[1] = mine[1];
    if (st != ZERO_OK) {
        free(all);
        return gpt_fail(st, "pp_trace_write: gathering span counts over %s: %s", zero_comm_get_name(world),
                        zero_comm_last_error(world));
    }
    int64_t most = 0;
    for (int i = 0; i < n; i++) most = all[2 * i] > most ? all[2 * i] : most;
    size_t per = (size_t)most * PP_SPAN_DOUBLES;
    double *buf = calloc(per ? per : 1, sizeof(double)), *every = calloc(per * (size_t)n + 1, sizeof(double));
    if (!buf || !every) {
        free(all), free(buf), free(every);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "pp_trace_write: out of memory for %lld spans", (long long)most * n);
    }
    for (int i = 0; t && i < t->n; i++) {
        const pp_span *s = &t->spans[i];
        double *d = buf + (size_t)i * PP_SPAN_DOUBLES;
        d[0] = s->kind, d[1] = s->micro, d[2] = s->chunk, d[3] = s->step, d[4] = s->t0, d[5] = s->t1;
    }
    if (world && per) st = zero_allgather(world, buf, every, per, ZERO_F64);
    else memcpy(every, buf, sizeof(double) * per);
    if (st != ZERO_OK) st = gpt_fail(st, "pp_trace_write: gathering spans over %s: %s", zero_comm_get_name(world),
                                     zero_comm_last_error(world));
    if (st == ZERO_OK && r == 0) {
        FILE *f = fopen(path, "w");
        if (!f) {
            st = gpt_fail(ZERO_IO, "pp_trace_write: cannot create %s", path);
        } else {
            double t0 = 0;
            int any = 0;
            for (int q = 0; q < n; q++)
                for (int64_t i = 0; i < all[2 * q]; i++) {
                    double s0 = every[(size_t)q * per + (size_t)i * PP_SPAN_DOUBLES + 4];
                    if (!any || s0 < t0) t0 = s0;
                    any = 1;
                }
            fprintf(f, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"label\": \"%s\"}, \"traceEvents\": [\n",
                    label ? label : "");
            int first = 1;
            for (int q = 0; q < n; q++) {
                fprintf(f, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d",
                        first ? "" : ",\n", q, q);
                if (all[2 * q + 1] >= 0) fprintf(f, " (pp stage %lld)", (long long)all[2 * q + 1]);
                fprintf(f, "\"}}");
                fprintf(f, ",\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"sort_index\": %d}}", q, q);
                first = 0;
                for (int64_t i = 0; i < all[2 * q]; i++) {
                    const double *d = every + (size_t)q * per + (size_t)i * PP_SPAN_DOUBLES;
                    int kind = (int)d[0];
                    const char *cat = pp_span_name((pp_span_kind)kind);
                    fprintf(f,
                            ",\n{\"name\": \"%s m%d c%d\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": 0, "
                            "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"micro\": %d, \"chunk\": %d, \"step\": %d}}",
                            kind == PP_SPAN_OPTIMIZER ? "optimizer" : cat, (int)d[1], (int)d[2], cat, q,
                            (d[4] - t0) * 1e6, (d[5] - d[4]) * 1e6, (int)d[1], (int)d[2], (int)d[3]);
                }
            }
            fprintf(f, "\n]}\n");
            if (fclose(f) != 0) st = gpt_fail(ZERO_IO, "pp_trace_write: writing %s failed", path);
        }
    }
    free(all), free(buf), free(every);
    /* every rank learns whether rank 0 wrote the file */
    if (world) {
        int32_t ok = st == ZERO_OK, all_ok = 0;
        zero_status s2 = zero_allreduce(world, &ok, &all_ok, 1, ZERO_I32, ZERO_SUM);
        if (st == ZERO_OK && s2 != ZERO_OK) st = gpt_fail(s2, "pp_trace_write: %s", zero_comm_last_error(world));
        if (st == ZERO_OK && all_ok != n) st = gpt_fail(ZERO_IO, "pp_trace_write: rank 0 could not write %s", path);
    }
    return st;
}
