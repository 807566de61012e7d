/* zero-train's output on rank 0: a live progress bar on a terminal, plain
 * lines when piped, an optional JSONL metrics file, and the final summary. */
#ifndef TRAIN_PROGRESS_H
#define TRAIN_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct train_step_stats {
    int64_t step;        /* 1-based: steps done */
    int64_t total_steps;
    double loss;         /* mean over ranks and micro-batches */
    double lr;
    double grad_norm;
    double loss_scale;
    int skipped;
    double step_s;       /* wall time of this step */
    double tokens_per_s; /* this step, all ranks */
    uint64_t tokens;     /* processed so far, all ranks */
    double mem_min_mib, mem_max_mib; /* engine memory over ranks */
    double cpu_s;        /* CPU time of this step, all ranks' processes (all threads) */
} train_step_stats;

typedef struct train_progress {
    int tty;          /* stdout is a terminal: redraw one line */
    int log_every;
    FILE *metrics;    /* NULL: none */
    int bar_drawn;
    double window_loss; /* sum since the last printed line */
    int window_n;
} train_progress;

/* `metrics_path` may be NULL. Returns -1 (errno set) if it cannot be opened. */
int train_progress_open(train_progress *p, int log_every, const char *metrics_path, int force_plain);
void train_progress_step(train_progress *p, const train_step_stats *s);
/* A message line that does not break the bar. */
void train_progress_note(train_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void train_progress_close(train_progress *p);

#endif
