/* zero-train's checkpoints: what the run stores beside the engine state
 * (model shape, data position, step, config) and how it resumes. */
#include <stdlib.h>
#include <string.h>

#include <zero/checkpoint.h>

#include "train_run.h"

/* The model's shape as checkpoints record it: model.tp / model.pp and
 * model.cp / model.sequence_parallel are the run's layout, not the model,
 * so they stay out (tp / pp are checked apart, "parallel"). New reference. */
static json_t *model_shape(const run *r)
{
    json_t *m = json_deep_copy(json_object_get(r->cfg.effective, "model"));
    json_object_del(m, "tp");
    json_object_del(m, "pp");
    json_object_del(m, "cp");
    json_object_del(m, "sequence_parallel");
    return m;
}

/* Where this rank's engine saves and loads: tp/pp runs under <dir>/tp<T>-pp<P>
 * (the grid's dp group), expert-parallel runs under <dir>/ep<E> (the
 * expert-data-parallel group holding experts E: each ep rank's engine
 * holds other experts), others <dir> itself (the world). Returns the comm. */
zero_comm *train_ckpt_position(const run *r, const char *dir, char *sub, size_t n)
{
    if (r->par) {
        train_parallel_ckpt_dir(r->par, dir, sub, n);
        return train_parallel_dp_comm(r->par);
    }
    if (r->ep) {
        snprintf(sub, n, "%s/ep%d", dir, zero_comm_get_rank(r->ep));
        return r->edp_host ? r->edp_host : r->comm;
    }
    snprintf(sub, n, "%s", dir);
    return r->host_comm;
}

static char *user_state_json(const run *r)
{
    json_t *model = model_shape(r);
    json_t *u = json_pack("{s:o,s:{s:I,s:I,s:s,s:s},s:{s:I,s:I},s:s}", "model", model, "data", "consumed",
                          (json_int_t)r->consumed, "seed", (json_int_t)r->cfg.seed, "path", r->corpus, "fingerprint",
                          "", "train", "step", (json_int_t)r->step, "tokens", (json_int_t)r->tokens, "rng",
                          "none: the loader is a pure function of (seed, consumed) and the model has no dropout");
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)r->fingerprint);
    json_object_set_new(json_object_get(u, "data"), "fingerprint", json_string(fp));
    json_object_set(u, "config", r->cfg.effective);
    if (r->par) { /* which part of the model this tp/pp (ep) position's checkpoint holds */
        json_t *par = json_pack("{s:i,s:i,s:i,s:i}", "tp", r->cfg.tp, "pp", r->cfg.pp, "tp_rank",
                                train_parallel_tp_rank(r->par), "pp_rank", train_parallel_pp_rank(r->par));
        if (r->cfg.moe_ep > 1) {
            json_object_set_new(par, "ep", json_integer(r->cfg.moe_ep));
            json_object_set_new(par, "ep_rank", json_integer(train_parallel_ep_rank(r->par)));
        }
        json_object_set_new(u, "parallel", par);
    }
    if (r->ep) /* which experts this ep rank's checkpoint holds */
        json_object_set_new(u, "parallel", json_pack("{s:i,s:i}", "ep", r->cfg.moe_ep, "ep_rank", zero_comm_get_rank(r->ep)));
    char *s = json_dumps(u, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(u);
    return s;
}

int train_save_checkpoint(run *r)
{
    char *user = user_state_json(r);
    zero_checkpoint_options o = ZERO_CHECKPOINT_OPTIONS_INIT;
    o.keep_last = r->cfg.ckpt_keep;
    double t0 = train_now_s();
    /* tp/pp (ep): every position saves its dp (edp) group's engine in its subdirectory */
    char dir[1100];
    zero_comm *comm = train_ckpt_position(r, r->cfg.ckpt_dir, dir, sizeof dir);
    zero_status s = zero_checkpoint_save(r->engine, comm, dir, r->step, user, &o);
    free(user);
    int ok = s == ZERO_OK;
    if (!ok) fprintf(stderr, "zero-train: rank %d: checkpoint save failed: %s\n", r->rank, zero_last_error());
    if (r->par || r->ep) ok = all_ok(r, ok); /* every dp group agreed within itself; now the whole grid */
    if (!ok) return -1;
    if (r->rank == 0)
        train_progress_note(&r->progress, "checkpoint: %s%s/step-%08lld (%.2f s)", r->cfg.ckpt_dir,
                            r->par ? "/tp*-pp*" : r->ep ? "/ep*" : "", (long long)r->step, train_now_s() - t0);
    return 0;
}

static int resume_one(run *r, const char *path, int same_run);

/* tp/pp (ep): each position loads the latest of its subdirectory of path;
 * the grid then checks that every position resumed, and at the same step. */
int train_resume(run *r, const char *path, int same_run)
{
    if (!r->par && !r->ep) return resume_one(r, path, same_run);
    char sub[1100];
    (void)train_ckpt_position(r, path, sub, sizeof sub);
    int ok = resume_one(r, sub, same_run) == 0;
    if (!all_ok(r, ok)) {
        if (ok) r0printf(r, stderr, "zero-train: resume from %s failed on another %s position\n", path,
                         r->par ? "tp/pp" : "ep");
        return -1;
    }
    double mine[2] = {(double)r->step, -(double)r->step}, ext[2] = {mine[0], mine[1]};
    if (r->world > 1 && zero_allreduce(r->host_comm, mine, ext, 2, ZERO_F64, ZERO_MAX) != ZERO_OK) return -1;
    if (ext[0] != -ext[1]) {
        r0printf(r, stderr,
                 "zero-train: resume from %s: the positions' (tp/pp or ep) latest checkpoints are at different steps "
                 "(%lld to %lld); pass one step directory per position or delete the newer ones\n",
                 path, (long long)-ext[1], (long long)ext[0]);
        return -1;
    }
    return 0;
}

static int resume_one(run *r, const char *path, int same_run)
{
    zero_checkpoint_loaded l;
    char ignored[1100];
    zero_comm *comm = train_ckpt_position(r, path, ignored, sizeof ignored);
    zero_status s = zero_checkpoint_load(r->engine, comm, path, &l);
    if (s != ZERO_OK) {
        r0printf(r, stderr, "zero-train: resume from %s failed: %s\n", path, zero_last_error());
        return -1;
    }
    json_error_t je;
    json_t *u = json_loads(l.user_json, 0, &je);
    json_t *model = json_object_get(u, "model");
    json_t *mine = model_shape(r);
    int rc = 0;
    if (!json_equal(model, mine)) {
        char *a = json_dumps(model, JSON_COMPACT | JSON_SORT_KEYS), *b = json_dumps(mine, JSON_COMPACT | JSON_SORT_KEYS);
        r0printf(r, stderr, "zero-train: %s holds another model: model %s there, %s in the config\n", l.path,
                 a ? a : "(none)", b);
        free(a);
        free(b);
        rc = -1;
    }
    if (rc == 0 && r->par) {
        json_t *par = json_object_get(u, "parallel");
        if (json_integer_value(json_object_get(par, "tp")) != r->cfg.tp ||
            json_integer_value(json_object_get(par, "pp")) != r->cfg.pp) {
            fprintf(stderr, "zero-train: rank %d: %s was saved with model.tp %lld / model.pp %lld, this run has %d / %d\n",
                    r->rank, l.path, (long long)json_integer_value(json_object_get(par, "tp")),
                    (long long)json_integer_value(json_object_get(par, "pp")), r->cfg.tp, r->cfg.pp);
            rc = -1;
        }
    }
    if (rc == 0 && r->ep) {
        json_t *par = json_object_get(u, "parallel");
        long long ep = json_integer_value(json_object_get(par, "ep")), er = json_integer_value(json_object_get(par, "ep_rank"));
        if (ep != r->cfg.moe_ep || er != zero_comm_get_rank(r->ep)) {
            fprintf(stderr, "zero-train: rank %d: %s was saved by ep rank %lld of model.moe.ep %lld, this rank is ep rank %d of %d\n",
                    r->rank, l.path, er, ep, zero_comm_get_rank(r->ep), r->cfg.moe_ep);
            rc = -1;
        }
    }
    json_t *d = json_object_get(u, "data"), *t = json_object_get(u, "train");
    if (rc == 0) {
        r->consumed = (uint64_t)json_integer_value(json_object_get(d, "consumed"));
        r->step = json_integer_value(json_object_get(t, "step"));
        r->tokens = (uint64_t)json_integer_value(json_object_get(t, "tokens"));
        if (r->step != l.step) r->step = l.step;
        uint64_t seed = (uint64_t)json_integer_value(json_object_get(d, "seed"));
        const char *fp = json_string_value(json_object_get(d, "fingerprint"));
        char mine_fp[32];
        snprintf(mine_fp, sizeof mine_fp, "%016llx", (unsigned long long)r->fingerprint);
        /* train.resume "auto" continues THIS run: the newest save in the
         * directory must be one of a run with the same seed and corpus (the
         * model shape is checked above). Another run's checkpoint there (a
         * fresh run started in the same directory, a changed seed) is refused
         * by name rather than silently continued; naming the step directory
         * (train.resume PATH) loads it anyway, with warnings. */
        const char *what = seed != r->cfg.seed ? "train.seed" : fp && strcmp(fp, mine_fp) != 0 ? "data" : NULL;
        if (same_run && what) {
            char there[64], here[64];
            if (what[0] == 't') {
                snprintf(there, sizeof there, "%llu", (unsigned long long)seed);
                snprintf(here, sizeof here, "%llu", (unsigned long long)r->cfg.seed);
            } else {
                snprintf(there, sizeof there, "corpus fingerprint %s", fp);
                snprintf(here, sizeof here, "%s", mine_fp);
            }
            r0printf(r, stderr,
                     "zero-train: train.resume \"auto\": the newest checkpoint in %s, %s, was saved by another run: "
                     "%s %s there, %s in this run's config. Name it (--resume %s) to continue from it anyway, or "
                     "use another train.checkpoint.dir\n",
                     r->cfg.ckpt_dir, l.path, what, there, here, l.path);
            rc = -1;
        } else {
            if (seed != r->cfg.seed)
                r0printf(r, stdout, "warning: the checkpoint was trained with train.seed %llu, this run uses %llu: "
                                    "the data order changes\n", (unsigned long long)seed, (unsigned long long)r->cfg.seed);
            if (fp && strcmp(fp, mine_fp) != 0)
                r0printf(r, stdout, "warning: the corpus differs from the one the checkpoint was trained on\n");
        }
    }
    if (rc == 0) {
        r0printf(r, stdout, "resumed from %s: step %lld (saved by %d ranks at stage %d)\n", l.path,
                 (long long)r->step, l.world_size, l.stage);
    }
    json_decref(u);
    json_decref(mine);
    zero_checkpoint_loaded_free(&l);
    return rc;
}
