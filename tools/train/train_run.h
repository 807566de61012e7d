/* zero-train internals shared by its files: the state of one run and the
 * helpers every part uses (see docs/zero-train.md). */
#ifndef TRAIN_RUN_H
#define TRAIN_RUN_H

#include <stdint.h>
#include <stdio.h>

#include <zero/zero.h>

#include "train_config.h"
#include "train_data.h"
#include "train_model.h"
#include "train_parallel.h"
#include "train_progress.h"

#define ERRMAX 1024

typedef struct run {
    int rank, world;
    zero_comm *comm;      /* the engine's dp comm */
    zero_comm *host_comm; /* carries host scalars (== comm on the CPU) */
    zero_comm *ep;        /* model.moe.ep > 1: this rank's expert-parallel group (then comm is the
                             expert-data-parallel group: the ranks holding the same experts) */
    zero_comm *dev_world; /* CUDA with model.moe.ep > 1: the device world comm ep and comm were split from */
    zero_comm *edp_host;  /* CUDA with model.moe.ep > 1: the expert-data-parallel group over host_comm
                             (the checkpoint's; comm is then a device comm) */
    zero_device *dev;
    zero_engine *engine;
    train_model *model;   /* tp = pp = 1 */
    train_parallel *par;  /* model.tp or model.pp > 1 (then model is NULL) */
    int dp, dp_rank;      /* the data-parallel size and rank: the data loader's slice */
    train_data *data;
    train_config cfg;
    zero_config zcfg;
    train_progress progress;
    char corpus[1024];
    uint64_t fingerprint;
    int64_t step;       /* optimizer steps done */
    uint64_t consumed;  /* global samples consumed */
    uint64_t tokens;    /* tokens processed, all ranks */
    int stopped_by;     /* the signal that stopped the run early, or 0 */
} run;

double train_now_s(void);
/* printf on rank 0 only. */
int r0printf(const run *r, FILE *f, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A failure on this rank: every rank may print (rank 0 without a prefix). */
void rank_error(const run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 when every rank passed ok = 1 (one all-reduce). */
int all_ok(run *r, int ok);

/* train_ckpt.c: save the run (collective), resume from `path` (collective).
 * same_run (train.resume "auto"): refuse a checkpoint of another run (another
 * train.seed or corpus) instead of warning. */
int train_save_checkpoint(run *r);
int train_resume(run *r, const char *path, int same_run);
/* This rank's checkpoint directory under `dir` (tp/pp: <dir>/tp<T>-pp<P>; model.moe.ep > 1:
 * <dir>/ep<E>; else dir itself) into sub, and the comm its engine saves and loads over. */
zero_comm *train_ckpt_position(const run *r, const char *dir, char *sub, size_t n);

/* train_loop.c: train up to cfg.steps (or until a stop signal, see there);
 * write the logits of a fixed batch. */
void train_install_stop_signals(void);
int train_loop(run *r);
int train_write_logits(run *r, const char *path);

#endif
