/* zero-train's training loop: scheduler, micro-steps, optimizer step,
 * progress, periodic checkpoints, the end-of-run summary. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/proc_mem.h"
#include "pp_trace.h"
#include "train_comm_report.h"
#include "train_run.h"

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- stopping on a signal
 * SIGTERM (what mpirun forwards, and what batch systems send before
 * preemption), SIGINT and SIGUSR1 (SLURM's --signal) ask the run to stop at
 * the end of the current step: the ranks agree (the flag rides on the
 * per-step all-reduce), save a checkpoint if a directory is set, print the
 * summary and exit with 128 + the signal. A second signal is left to its
 * default action. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
    signal(sig, SIG_DFL);
}

void train_install_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* keep MPI's and our own system calls going */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

/* Sum three scalars over the ranks: the loss, the CPU time of the step, and
 * the stop signal (the largest wins, so every rank sees one if any got one);
 * then the engine memory's range over the ranks. A failure (a rank stopped or
 * cut off: the deadline) is the run's failure, reported with the comm's
 * message: swallowing it left only "the group failed earlier" for the next op. */
static int allreduce_step(run *r, double *loss, double *cpu, int *sig, double *mem_min, double *mem_max)
{
    double v[3] = {*loss, *cpu, (double)*sig}, out[3] = {*loss, *cpu, (double)*sig};
    double mem[2] = {*mem_max, -*mem_min}, mem_out[2] = {*mem_max, -*mem_min};
    if (r->world > 1 && (zero_allreduce(r->host_comm, v, out, 2, ZERO_F64, ZERO_SUM) != ZERO_OK ||
                         zero_allreduce(r->host_comm, v + 2, out + 2, 1, ZERO_F64, ZERO_MAX) != ZERO_OK ||
                         zero_allreduce(r->host_comm, mem, mem_out, 2, ZERO_F64, ZERO_MAX) != ZERO_OK)) {
        fprintf(stderr, "zero-train: rank %d, step %lld: %s\n", r->rank, (long long)r->step,
                zero_comm_last_error(r->host_comm));
        return -1;
    }
    *loss = out[0];
    *cpu = out[1];
    *sig = (int)out[2];
    *mem_max = mem_out[0];
    *mem_min = -mem_out[1];
    return 0;
}

/* This process's resident set now and at its peak, bytes (0 if unknown). */
static void process_rss(double *now, double *peak)
{
    const long rss = proc_rss_bytes(), hwm = proc_hwm_bytes();
    *now = rss > 0 ? (double)rss : 0.0;
    *peak = hwm > 0 ? (double)hwm : 0.0;
}

/* This rank's TRAIN_RANK_FIELDS numbers now (NVMe counters since finalize). */
static void local_rank_fields(run *r, double *mine)
{
    memset(mine, 0, TRAIN_RANK_FIELDS * sizeof *mine);
    zero_memory_report mem;
    if (zero_engine_get_memory_report(r->engine, &mem) == ZERO_OK) {
        _Static_assert(TRF_PARAMS + ZERO_MEM_CATEGORY_COUNT == TRF_TOTAL, "one metrics field per category");
        for (int k = 0; k < ZERO_MEM_CATEGORY_COUNT; k++) mine[TRF_PARAMS + k] = (double)mem.bytes[k];
        mine[TRF_TOTAL] = (double)mem.total;
        mine[TRF_PEAK_TOTAL] = (double)mem.peak_total;
    }
    zero_offload_report o;
    if (zero_engine_get_offload_report(r->engine, &o) == ZERO_OK) {
        mine[TRF_OPT_NVME_READ] = (double)o.nvme_read;
        mine[TRF_OPT_NVME_WRITTEN] = (double)o.nvme_written;
        mine[TRF_OPT_HOST] = (double)o.host_bytes;
        mine[TRF_OPT_NVME_BYTES] = (double)o.nvme_bytes;
    }
    zero_param_offload_report po;
    if (zero_engine_get_param_offload_report(r->engine, &po) == ZERO_OK) {
        mine[TRF_PARAM_NVME_READ] = (double)po.nvme_read;
        mine[TRF_PARAM_NVME_WRITTEN] = (double)po.nvme_written;
        mine[TRF_PARAM_HOST] = (double)po.host_bytes;
        mine[TRF_PARAM_NVME_BYTES] = (double)po.nvme_bytes;
    }
    process_rss(&mine[TRF_RSS], &mine[TRF_RSS_PEAK]);
}

/* Every rank's TRAIN_RANK_FIELDS numbers, gathered for rank 0's metrics line
 * (collective; only when a metrics file is configured, on every rank alike),
 * NVMe counters counted from `base` (taken when the loop started, so they
 * exclude finalize's initial writes and a resume's reads). Returns NULL (and
 * the line has no "ranks") if the gather fails. */
static double *gather_rank_fields(run *r, const double *base)
{
    double mine[TRAIN_RANK_FIELDS];
    local_rank_fields(r, mine);
    static const int counters[] = {TRF_OPT_NVME_READ, TRF_OPT_NVME_WRITTEN, TRF_PARAM_NVME_READ, TRF_PARAM_NVME_WRITTEN};
    for (size_t k = 0; k < sizeof counters / sizeof *counters; k++) mine[counters[k]] -= base[counters[k]];
    double *all = malloc((size_t)r->world * sizeof mine);
    if (!all) return NULL;
    if (r->world == 1) {
        memcpy(all, mine, sizeof mine);
    } else if (zero_allgather(r->host_comm, mine, all, TRAIN_RANK_FIELDS, ZERO_F64) != ZERO_OK) {
        free(all);
        return NULL;
    }
    return all;
}

int train_loop(run *r)
{
    const train_config *c = &r->cfg;
    size_t per = (size_t)c->micro_batch * (size_t)c->seq_len;
    /* with tp/pp the pipeline takes all of a step's micro-batches at once */
    size_t nbuf = r->par ? per * (size_t)c->grad_accum : per;
    int32_t *tokens = malloc(nbuf * sizeof *tokens), *targets = malloc(nbuf * sizeof *targets);
    char err[ERRMAX];
    double t_start = train_now_s(), first_loss = NAN, last_loss = NAN;
    int64_t start_step = r->step;
    uint64_t start_tokens = r->tokens;
    int rc = 0;
    double nvme_base[TRAIN_RANK_FIELDS];
    if (c->metrics_file) local_rank_fields(r, nvme_base);
    train_comm_report comms;
    train_comm_report_start(&comms, r);
    while (r->step < c->steps) {
        double t0 = train_now_s(), c0 = cpu_s();
        /* the scheduler counts applied updates, as DeepSpeed's engine steps
         * it only after an update that was not skipped for an fp16 overflow */
        zero_engine_scalars sc;
        if (zero_engine_get_scalars(r->engine, &sc) != ZERO_OK) sc.step = r->step;
        double lr = train_sched_lr(&c->sched, c->lr, sc.step);
        zero_engine_set_lr(r->engine, lr);
        double b1, b2; /* OneCycle's cyclic momentum: AdamW's betas of every group, as DeepSpeed sets them */
        if (r->zcfg.optimizer == ZERO_OPTIM_ADAMW && train_sched_betas(&c->sched, sc.step, &b1, &b2))
            for (int g = 0; g < zero_engine_get_num_groups(r->engine); g++) {
                zero_group_hparams h = ZERO_GROUP_HPARAMS_INIT;
                zero_engine_get_group_hparams(r->engine, g, &h);
                h.beta1 = b1;
                h.beta2 = b2;
                zero_engine_set_group_hparams(r->engine, g, &h);
            }
        float dloss = (float)zero_engine_get_loss_scale(r->engine);
        double loss_sum = 0;
        if (r->par) {
            /* this dp rank's micro-batches; the tp and pp ranks of one dp rank read the same ones */
            for (int m = 0; m < c->grad_accum; m++)
                train_data_micro_batch(r->data, r->consumed, c->micro_batch, r->dp, r->dp_rank, m, tokens + m * per,
                                       targets + m * per);
            float loss = 0;
            if (train_parallel_micro_steps(r->par, tokens, targets, &loss, err, sizeof err) != 0) {
                fprintf(stderr, "zero-train: rank %d, step %lld: %s\n", r->rank, (long long)r->step + 1, err);
                rc = -1;
                goto out;
            }
            loss_sum = (double)loss * c->grad_accum;
        }
        for (int m = 0; m < c->grad_accum && !r->par; m++) {
            train_data_micro_batch(r->data, r->consumed, c->micro_batch, r->dp, r->dp_rank, m, tokens, targets);
            float loss = 0;
            if (train_model_micro_step(r->model, tokens, targets, dloss, &loss, err, sizeof err) != ZERO_OK) {
                fprintf(stderr, "zero-train: rank %d, step %lld: %s\n", r->rank, (long long)r->step + 1, err);
                rc = -1;
                goto out;
            }
            loss_sum += loss;
        }
        zero_step_result res;
        double t_opt = pp_now();
        zero_status step_st = zero_engine_step(r->engine, &res);
        if (r->par) train_parallel_trace_optimizer(r->par, t_opt, pp_now());
        if (step_st != ZERO_OK) {
            fprintf(stderr, "zero-train: rank %d, step %lld: %s\n", r->rank, (long long)r->step + 1,
                    zero_engine_last_error(r->engine));
            rc = -1;
            goto out;
        }
        r->step++;
        r->consumed += (uint64_t)c->train_batch_size;
        r->tokens += (uint64_t)c->train_batch_size * (uint64_t)c->seq_len;
        double loss = loss_sum / c->grad_accum, cpu = cpu_s() - c0;
        int sig = (int)stop_signal;
        zero_memory_report mem;
        zero_engine_get_memory_report(r->engine, &mem);
        double mn = (double)mem.total / (1024.0 * 1024.0), mx = mn;
        if (allreduce_step(r, &loss, &cpu, &sig, &mn, &mx) != 0) {
            rc = -1;
            goto out;
        }
        loss /= r->world; /* every tp/pp rank of a dp replica holds the same loss: the mean over dp */
        double dt = train_now_s() - t0;
        double *fields = c->metrics_file ? gather_rank_fields(r, nvme_base) : NULL;
        if (isnan(first_loss)) first_loss = loss;
        last_loss = loss;
        if (r->rank == 0) {
            train_step_stats s = {r->step, c->steps, loss, lr, res.grad_norm, res.loss_scale, res.skipped, dt,
                                  (double)c->train_batch_size * c->seq_len / dt, r->tokens, mn, mx, cpu,
                                  fields, r->world};
            train_progress_step(&r->progress, &s);
        }
        free(fields);
        if (sig) {
            r->stopped_by = sig;
            if (r->rank == 0)
                train_progress_note(&r->progress, "stopping after step %lld on signal %d (%s)%s", (long long)r->step,
                                    sig, strsignal(sig), c->ckpt_dir ? ": saving a checkpoint" : "");
            break;
        }
        if (c->ckpt_dir && c->ckpt_every > 0 && r->step % c->ckpt_every == 0 && r->step < c->steps &&
            train_save_checkpoint(r) != 0) {
            rc = -1;
            goto out;
        }
    }
    if (c->ckpt_dir && r->step > start_step && train_save_checkpoint(r) != 0) rc = -1;
    /* every rank's engine memory (now, peak) and process peak RSS for the summary */
    double *mem_all = calloc(3 * (size_t)r->world, sizeof *mem_all);
    {
        zero_memory_report me;
        zero_engine_get_memory_report(r->engine, &me);
        double rss_now, rss_peak;
        process_rss(&rss_now, &rss_peak);
        double mine[3] = {me.total / 1048576.0, me.peak_total / 1048576.0, rss_peak / 1048576.0};
        if (mem_all && r->world > 1) {
            if (zero_allgather(r->host_comm, mine, mem_all, 3, ZERO_F64) != ZERO_OK) {
                free(mem_all);
                mem_all = NULL;
            }
        } else if (mem_all) {
            memcpy(mem_all, mine, sizeof mine);
        }
    }
    if (r->rank == 0) {
        double wall = train_now_s() - t_start;
        zero_memory_report mem;
        zero_engine_get_memory_report(r->engine, &mem);
        train_progress_close(&r->progress);
        printf("\nsummary: %lld steps (%lld this run) in %.1f s, %.0f tokens/s over %d rank%s\n", (long long)r->step,
               (long long)(r->step - start_step), wall, (double)(r->tokens - start_tokens) / (wall > 0 ? wall : 1),
               r->world, r->world > 1 ? "s" : "");
        if (r->step > start_step)
            printf("summary: loss %.4f (first step of this run) -> %.4f (last step)\n", first_loss, last_loss);
        else
            printf("summary: nothing to train: already at step %lld of train.steps %lld\n", (long long)r->step,
                   (long long)c->steps);
        gpt_activation_bytes act, act_without;
        if (r->par) train_parallel_activation_bytes(r->par, &act, &act_without);
        else train_model_activation_bytes(r->model, &act, &act_without);
        printf("summary: rank 0 engine memory: params %.2f, grads %.2f, master %.2f, moments %.2f, buffers %.2f, "
               "cache %.2f MiB (peak total %.2f MiB); activations %.2f MiB\n",
               mem.bytes[ZERO_MEM_PARAMS] / 1048576.0, mem.bytes[ZERO_MEM_GRADS] / 1048576.0,
               mem.bytes[ZERO_MEM_MASTER] / 1048576.0, mem.bytes[ZERO_MEM_MOMENTS] / 1048576.0,
               mem.bytes[ZERO_MEM_BUFFERS] / 1048576.0, mem.bytes[ZERO_MEM_CACHE] / 1048576.0,
               mem.peak_total / 1048576.0,
               act.total / 1048576.0);
        /* exact bytes, by kind (docs/model.md), and what checkpointing saves */
        printf("summary: rank 0 activations: %zu bytes = residual stream %zu + block sets %zu + recompute %zu + "
               "head %zu + scratch %zu", act.total, act.inputs, act.blocks, act.recompute, act.head, act.scratch);
        if (c->actckpt.enabled)
            printf("; checkpointing %d of %d blocks: %zu bytes without (saves %.2f MiB)%s", c->actckpt.blocks,
                   c->n_layer, act_without.total,
                   ((double)act_without.total - (double)act.total) / 1048576.0, act.host ? "; host" : "");
        if (act.host) printf(" %zu bytes", act.host);
        printf("\n");
        zero_param_offload_report po;
        if (zero_engine_get_param_offload_report(r->engine, &po) == ZERO_OK && po.device != ZERO_OFFLOAD_NONE)
            printf("summary: rank 0 parameter offload (%s): host %.2f MiB, nvme %.2f MiB (read %.2f, written %.2f "
                   "MiB; %llu chunks read ahead, %llu on demand)\n",
                   po.device == ZERO_OFFLOAD_NVME ? "nvme" : "cpu", po.host_bytes / 1048576.0,
                   po.nvme_bytes / 1048576.0, po.nvme_read / 1048576.0, po.nvme_written / 1048576.0,
                   (unsigned long long)po.reads_ahead, (unsigned long long)po.reads_sync);
        if (mem_all) {
            printf("summary: engine memory per rank (MiB, now/peak):");
            for (int q = 0; q < r->world && q < 16; q++) printf(" %d: %.2f/%.2f", q, mem_all[3 * q], mem_all[3 * q + 1]);
            printf("%s\n", r->world > 16 ? " ..." : "");
            /* What the whole process held at its peak (VmHWM: model, activations,
             * MPI, libraries and the engine), beside the engine's own peak. */
            printf("summary: process peak RSS per rank (MiB; engine peak in brackets):");
            for (int q = 0; q < r->world && q < 16; q++) printf(" %d: %.2f (%.2f)", q, mem_all[3 * q + 2], mem_all[3 * q + 1]);
            printf("%s\n", r->world > 16 ? " ..." : "");
        }
        train_comm_report_print(&comms, r->step - start_step);
        if (c->ckpt_dir) printf("summary: checkpoints in %s\n", c->ckpt_dir);
        fflush(stdout);
    }
    free(mem_all);
out:
    free(tokens);
    free(targets);
    return rc;
}

/* The logits of the current parameters on a fixed batch (global samples
 * 0..micro-1 of the corpus order), for checking a consolidated checkpoint
 * against PyTorch. Every rank runs the forward (stage 3 gathers). */
int train_write_logits(run *r, const char *path)
{
    const train_config *c = &r->cfg;
    size_t bt = (size_t)c->micro_batch * (size_t)c->seq_len, n = bt * (size_t)c->vocab;
    int32_t *tok = malloc(bt * sizeof *tok), *tgt = malloc(bt * sizeof *tgt);
    float *logits = malloc(n * sizeof *logits);
    char err[ERRMAX];
    int rc = 0;
    train_data_fill(r->data, 0, c->micro_batch, tok, tgt);
    if (train_model_logits(r->model, tok, logits, err, sizeof err) != ZERO_OK) {
        fprintf(stderr, "zero-train: rank %d: --dump-logits: %s\n", r->rank, err);
        rc = -1;
    } else if (r->rank == 0) {
        FILE *f = fopen(path, "wb");
        int32_t h[3] = {c->micro_batch, c->seq_len, c->vocab};
        if (!f || fwrite(h, sizeof h, 1, f) != 1 || fwrite(tok, sizeof *tok, bt, f) != bt ||
            fwrite(logits, sizeof *logits, n, f) != n) {
            fprintf(stderr, "zero-train: --dump-logits %s: %s\n", path, strerror(errno));
            rc = -1;
        }
        if (f && fclose(f) != 0) rc = -1;
    }
    free(tok);
    free(tgt);
    free(logits);
    return rc;
}
