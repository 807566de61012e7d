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
    /* With a metrics file: TRAIN_RANK_FIELDS numbers per rank (rank-major,
     * see train_rank_fields), NULL otherwise. */
    const double *rank_fields;
    int num_ranks;
} train_step_stats;

/* Per-rank numbers a metrics line carries (bytes unless noted), in this
 * order: the engine's memory report by category and total/peak, the two
 * offload reports' NVMe bytes read/written since finalize and host pool
 * bytes, and the process's resident set now and at its peak. */
enum {
    TRF_PARAMS, TRF_GRADS, TRF_MASTER, TRF_MOMENTS, TRF_BUFFERS, TRF_OTHER, TRF_CACHE, TRF_TOTAL, TRF_PEAK_TOTAL,
    TRF_OPT_NVME_READ, TRF_OPT_NVME_WRITTEN, TRF_OPT_HOST, TRF_OPT_NVME_BYTES,
    TRF_PARAM_NVME_READ, TRF_PARAM_NVME_WRITTEN, TRF_PARAM_HOST, TRF_PARAM_NVME_BYTES,
    TRF_RSS, TRF_RSS_PEAK,
    TRAIN_RANK_FIELDS
};

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
