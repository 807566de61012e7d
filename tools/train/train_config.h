/* zero-train's configuration: a DeepSpeed-style JSON file.
 *
 * Top-level keys with DeepSpeed's names and meanings: train_batch_size,
 * train_micro_batch_size_per_gpu, gradient_accumulation_steps, optimizer,
 * scheduler, gradient_clipping, bf16, fp16, zero_optimization,
 * steps_per_print. The engine's sections (optimizer, gradient_clipping, bf16,
 * fp16, zero_optimization) are handed to zero_config_from_json, which checks
 * them; this file checks everything else: the top level, the batch-size
 * arithmetic, the scheduler, and zero-train's own sections model, data and
 * train. Every rejection names the key ("model.n_head: expected an integer,
 * got string"). */
#ifndef TRAIN_CONFIG_H
#define TRAIN_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

typedef enum train_sched_kind {
    TRAIN_SCHED_CONSTANT = 0,     /* no scheduler section: lr stays at optimizer.params.lr */
    TRAIN_SCHED_WARMUP_LR,        /* DeepSpeed WarmupLR: warm up, then constant */
    TRAIN_SCHED_WARMUP_DECAY_LR,  /* DeepSpeed WarmupDecayLR: warm up, then linear decay to 0 */
    TRAIN_SCHED_WARMUP_COSINE_LR, /* DeepSpeed WarmupCosineLR: warm up, then cosine decay */
    TRAIN_SCHED_ONE_CYCLE,        /* DeepSpeed OneCycle: triangular lr (and AdamW beta1) cycle, then decay */
} train_sched_kind;

typedef struct train_sched {
    train_sched_kind kind;
    /* WarmupLR / WarmupDecayLR */
    double warmup_min_lr, warmup_max_lr;
    /* WarmupCosineLR: ratios of optimizer lr */
    double warmup_min_ratio, cos_min_ratio;
    int64_t warmup_num_steps, total_num_steps;
    int warmup_log; /* warmup_type "log" (DeepSpeed's default) or "linear" */
    /* OneCycle (DeepSpeed's names and defaults; the stair counts are
     * accepted and, as in DeepSpeed, unused) */
    double cycle_min_lr, cycle_max_lr, decay_lr_rate, cycle_first_step_size, cycle_second_step_size;
    double cycle_min_mom, cycle_max_mom, decay_mom_rate;
    int64_t cycle_first_stair_count, cycle_second_stair_count, decay_step_size;
    int cycle_momentum;
} train_sched;

/* DeepSpeed's activation_checkpointing section, as the model applies it
 * (docs/zero-train.md): the section present (and not null) turns per-block
 * recomputation on. */
typedef struct train_actckpt {
    int enabled;
    int blocks;            /* blocks recomputed, the first ones: number_checkpoints (clamped to
                            * model.n_layer), every block when it is absent or null */
    int number_given;      /* number_checkpoints was an integer */
    int cpu_checkpointing; /* CUDA: the recomputed blocks' inputs in pinned host memory */
    int partition_activations, contiguous_memory_optimization, synchronize_checkpoint_boundary, profile;
    char notes[1024];      /* keys accepted that change nothing on this run, one line each (printed by zero-train) */
} train_actckpt;

/* One entry of "param_groups" (a zero-train/libzero extension: DeepSpeed's
 * config has no parameter groups): the parameters whose names match one of
 * `patterns` (fnmatch globs; the first group that matches wins) train with
 * these hyperparameters; the others stay in the engine's "default" group
 * (optimizer.params). Negative: the optimizer's value. */
#define TRAIN_MAX_GROUPS 16
typedef struct train_group {
    char name[64];
    char **patterns; /* NULL-terminated */
    double lr_scale, weight_decay, beta1, beta2, eps;
} train_group;

typedef struct train_config {
    /* batch: micro * accum * dp, checked in 64 bits (each factor is at most INT32_MAX) */
    int64_t train_batch_size;
    int micro_batch, grad_accum;
    /* model */
    int n_layer, n_head, d_model, seq_len, vocab;
    /* model parallelism (model.tp, model.pp, model.cp; Megatron-core's grid order tp, cp, dp, pp);
     * dp = world / (tp * cp * pp); model.sequence_parallel: Megatron SP over tp (docs/sequence-parallel.md) */
    int tp, pp, dp, cp, sequence_parallel;
    char *pp_schedule;  /* model.pp_schedule: "1f1b" (default), "gpipe", "interleaved", "zb-h1", "zb-h2" (docs/pipeline.md) */
    int pp_virtual;     /* model.pp_virtual: chunks per stage; >= 2 for "interleaved", else 1 */
    /* model.moe: mixture-of-experts blocks (experts 0: dense), expert parallelism over ep
     * consecutive ranks (docs/moe.md) */
    int moe_experts, moe_top_k, moe_ep;
    double moe_capacity_factor, moe_aux_loss_coef;
    /* data */
    char *data_path;          /* "auto" = the default corpus */
    char **data_suffixes;     /* NULL-terminated; NULL with data_suffixes_auto */
    int data_suffixes_auto;   /* suffixes not given: ".py" for the default corpus, all files otherwise */
    uint64_t data_max_bytes;
    /* train */
    int64_t steps;
    uint64_t seed;
    int log_every;
    char *ckpt_dir;           /* NULL = no checkpoints */
    int64_t ckpt_every;       /* 0 = only at the end */
    int ckpt_keep;            /* how many step directories to keep; 0 = all */
    char *resume;             /* NULL, "auto" (latest in ckpt_dir if any) or a checkpoint path */
    char *metrics_file;
    char *device;             /* "cpu" or "cuda" */
    char *comm_backend;       /* CUDA only: "auto" (NCCL if built, else staged), "nccl" or "staged" */
    double comm_timeout_s;    /* deadline of every collective and wait (zero_comm_set_timeout) */
    int check_collectives;    /* debug mode: every collective's fingerprint is checked across the
                                 group, so a diverged rank fails with ZERO_MISMATCH naming both calls */
    /* optimizer lr (read from optimizer.params.lr for the scheduler) */
    double lr;
    train_sched sched;
    train_actckpt actckpt;
    train_group groups[TRAIN_MAX_GROUPS];
    int n_groups;
    /* The document as given (owned), for zero_config_from_json: its sections, and DeepSpeed's keys to judge. */
    json_t *engine_json;
    /* zero_optimization.stage3_prefetch_bucket_size was "auto": zero-train sizes the window to two
     * blocks' parameters (train_prefetch_window) instead of leaving libzero's default. */
    int prefetch_auto;
    /* The whole effective config: defaults filled in (owned). */
    json_t *effective;
} train_config;

/* The built-in config used when no --config is given. */
extern const char train_default_config_json[];

/* train.comm_timeout_s when the config does not set it: long enough for a
 * checkpoint save or a slow first step, short enough that a stopped or lost
 * rank ends the job in minutes, not hours. */
#define TRAIN_DEFAULT_COMM_TIMEOUT_S 120.0

/* Load a config file, refusing duplicate keys (the engine's loader refuses
 * them too: one meaning per document). NULL with a message naming the file,
 * line and column in err. */
json_t *train_config_load_file(const char *path, char *err, size_t err_size);

/* The config as text: 2-space indent, sorted keys, each number with the
 * fewest digits (15, else 17) that load back to the same double, so
 * print -> load -> print is the identity. malloc'd; NULL on failure. */
char *train_config_dumps(const json_t *cfg);

/* Parse and validate `root` (not consumed) for a run on `world` ranks:
 * dp = world / (model.tp * model.pp) data-parallel ranks. Returns 0, or -1 with a message naming the key in err. */
int train_config_parse(train_config *cfg, json_t *root, int dp, char *err, size_t err_size);
void train_config_free(train_config *cfg);

/* The scheduler as a config section, every parameter filled in (null: none). New reference. */
json_t *train_sched_json(const train_sched *s);

/* The learning rate of the next optimizer update when `applied` updates have
 * been applied (zero_engine_scalars.step: fp16-skipped steps do not count),
 * step for step DeepSpeed's (see train_config.c). */
double train_sched_lr(const train_sched *s, double base_lr, int64_t applied);

/* OneCycle with cycle_momentum: the AdamW betas DeepSpeed's scheduler sets
 * for the next update after `applied` updates (beta2 is DeepSpeed's fixed
 * 0.99); returns 0 (betas untouched) for every other schedule. */
int train_sched_betas(const train_sched *s, int64_t applied, double *beta1, double *beta2);

/* Register cfg->groups with the engine (after the model registered its
 * parameters; before or after finalize) and put each parameter whose name
 * matches a group's pattern in it. Writes one summary line per group to
 * `note` ("param group no_decay: 34 tensors, 6.5 k elements, weight_decay
 * 0"). Returns 0, or -1 with the engine's message in err. */
struct zero_engine;
int train_param_groups_apply(const train_config *cfg, struct zero_engine *e, char *note, size_t note_size, char *err,
                             size_t err_size);

/* Resolve data.path "auto": the Python standard library of this machine
 * (/usr/lib/python3.N), else /usr/share/common-licenses. Writes the chosen
 * directory and a note for the user; returns -1 if neither exists. */
int train_default_corpus(char *out, size_t n, char *note, size_t note_size);

#endif
