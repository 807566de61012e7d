/* Progress output (see train_progress.h). */
#include "train_progress.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

int train_progress_open(train_progress *p, int log_every, const char *metrics_path, int force_plain)
{
    memset(p, 0, sizeof *p);
    p->tty = !force_plain && isatty(STDOUT_FILENO);
    p->log_every = log_every > 0 ? log_every : 1;
    if (metrics_path && *metrics_path) {
        p->metrics = fopen(metrics_path, "w");
        if (!p->metrics) return -1;
    }
    return 0;
}

static void clear_bar(train_progress *p)
{
    if (p->tty && p->bar_drawn) {
        fputs("\r\033[2K", stdout);
        p->bar_drawn = 0;
    }
}

void train_progress_note(train_progress *p, const char *fmt, ...)
{
    clear_bar(p);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
}

/* `, "key": value` with value printed by `fmt`, or null when not finite. */
static void put_num(FILE *f, const char *key, const char *fmt, double v)
{
    fprintf(f, ", \"%s\": ", key);
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs("null", f);
}

/* `, "ranks": [{...}, ...]`: every rank's memory report, NVMe traffic and
 * resident set (TRAIN_RANK_FIELDS numbers each, integers of bytes). */
static void write_rank_fields(FILE *f, const double *v, int n)
{
    static const char *const names[TRAIN_RANK_FIELDS] = {
        "params", "grads", "master", "moments", "buffers", "other", "cache", "total", "peak_total",
        "opt_nvme_read", "opt_nvme_written", "opt_host", "opt_nvme_bytes",
        "param_nvme_read", "param_nvme_written", "param_host", "param_nvme_bytes",
        "rss", "rss_peak"};
    fputs(", \"ranks\": [", f);
    for (int r = 0; r < n; r++) {
        fputs(r ? ", {" : "{", f);
        for (int k = 0; k < TRAIN_RANK_FIELDS; k++)
            fprintf(f, "%s\"%s\": %.0f", k ? ", " : "", names[k], v[(size_t)r * TRAIN_RANK_FIELDS + k]);
        fputs("}", f);
    }
    fputs("]", f);
}

void train_progress_step(train_progress *p, const train_step_stats *s)
{
    if (p->metrics) {
        /* %.17g: the loss round-trips, so runs can be compared bitwise. JSON
         * has no inf or nan: a non-finite value (grad_norm on an fp16
         * overflow step, a loss that diverged) is written as null. */
        FILE *f = p->metrics;
        fprintf(f, "{\"step\": %lld", (long long)s->step);
        put_num(f, "loss", "%.17g", s->loss);
        put_num(f, "lr", "%.17g", s->lr);
        put_num(f, "grad_norm", "%.17g", s->grad_norm);
        put_num(f, "loss_scale", "%.17g", s->loss_scale);
        fprintf(f, ", \"skipped\": %d", s->skipped);
        put_num(f, "step_s", "%.6f", s->step_s);
        put_num(f, "cpu_s", "%.6f", s->cpu_s);
        put_num(f, "tokens_per_s", "%.1f", s->tokens_per_s);
        fprintf(f, ", \"tokens\": %llu", (unsigned long long)s->tokens);
        put_num(f, "mem_max_mib", "%.3f", s->mem_max_mib);
        if (s->rank_fields) write_rank_fields(f, s->rank_fields, s->num_ranks);
        fputs("}\n", f);
        fflush(f);
    }
    p->window_loss += s->loss;
    p->window_n++;
    int print_line = s->step % p->log_every == 0 || s->step == s->total_steps || s->step == 1;
    if (print_line) {
        clear_bar(p);
        printf("step %6lld/%lld  loss %.4f  lr %.3e  grad_norm %.3f  %8.0f tok/s  %7.1f ms/step  mem/rank "
               "%.2f-%.2f MiB%s\n",
               (long long)s->step, (long long)s->total_steps, p->window_loss / p->window_n, s->lr, s->grad_norm,
               s->tokens_per_s, s->step_s * 1e3, s->mem_min_mib, s->mem_max_mib, s->skipped ? "  (skipped: fp16 overflow)" : "");
        p->window_loss = 0;
        p->window_n = 0;
    }
    if (p->tty && s->step < s->total_steps) {
        int width = 30, done = (int)(width * s->step / (s->total_steps ? s->total_steps : 1));
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
        bar[width] = 0;
        printf("\r\033[2K[%s] %lld/%lld  loss %.4f  %.0f tok/s", bar, (long long)s->step,
               (long long)s->total_steps, s->loss, s->tokens_per_s);
        p->bar_drawn = 1;
    }
    fflush(stdout);
}

void train_progress_close(train_progress *p)
{
    clear_bar(p);
    if (p->metrics) fclose(p->metrics);
    p->metrics = NULL;
}
