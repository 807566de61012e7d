/* zero_checkpoint_save: every rank writes its shard, rank 0 publishes the
 * step directory atomically (see include/zero/checkpoint.h). */
#include "checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/versioned.h"
#include <zero/version.h>

/* All ranks learn whether any rank failed; if one did, its message is
 * broadcast so that every rank (rank 0 above all, which usually prints)
 * reports the real cause: "<op>: rank 1: <its message>". Returns the common
 * status. Always the same collectives on every rank. */
zero_status ckpt_agree(zero_comm *dp, zero_status local, const char *op)
{
    int32_t v[2] = {(int32_t)local, local != ZERO_OK ? zero_comm_get_rank(dp) : -1};
    char msg[ZERO_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", local != ZERO_OK ? zero_last_error() : "");
    int32_t r[2];
    zero_status s = zero_allreduce(dp, v, r, 2, ZERO_I32, ZERO_MAX);
    if (s != ZERO_OK)
        return zero_fail(NULL, s, "%s: agreeing on the outcome across ranks: %s", op, zero_comm_last_error(dp));
    if (r[0] == ZERO_OK) return ZERO_OK;
    /* r[1] is the highest failing rank; v[0] MAX picks the largest status code */
    s = zero_broadcast(dp, msg, msg, sizeof msg, ZERO_U8, r[1]);
    msg[sizeof msg - 1] = 0;
    if (s != ZERO_OK) snprintf(msg, sizeof msg, "(its message was lost: %s)", zero_comm_last_error(dp));
    if (local != ZERO_OK) return zero_fail(NULL, local, "%s", msg); /* keep this rank's own message */
    if (zero_comm_get_size(dp) == 1) return zero_fail(NULL, (zero_status)r[0], "%s", msg);
    return zero_fail(NULL, (zero_status)r[0], "%s: rank %d: %s", op, r[1], msg);
}

/* Which optimizer state kinds this engine has: a kind whose state_get says
 * ZERO_NOT_FOUND on an owned range is absent. Agreed across ranks (a rank
 * that owns nothing cannot tell). Always makes its one all-reduce, so ranks
 * stay in step even when one fails locally. */
zero_status ckpt_engine_kinds(zero_engine *e, zero_comm *dp, unsigned *kinds)
{
    int32_t have[CKPT_NUM_KINDS + 1] = {1, 0, 0, 0}, all[CKPT_NUM_KINDS + 1];
    zero_status local = ZERO_OK;
    int np = zero_engine_get_num_params(e);
    for (int p = 0; p < np && local == ZERO_OK; p++) {
        zero_param_info pi;
        if ((local = zero_engine_get_param_info(e, p, &pi)) != ZERO_OK) break;
        uint64_t n = pi.owned_numel;
        if (n == 0) continue;
        float *buf = malloc(n * sizeof *buf);
        if (!buf) {
            local = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint: probing the optimizer state");
            break;
        }
        for (int k = 1; k < CKPT_NUM_KINDS; k++) {
            zero_status s = zero_engine_state_get(e, (zero_state_kind)k, p, buf);
            if (s == ZERO_OK) have[k] = 1;
            else if (s != ZERO_NOT_FOUND) local = s;
        }
        free(buf);
        break;
    }
    have[CKPT_NUM_KINDS] = local != ZERO_OK;
    zero_status s = zero_allreduce(dp, have, all, CKPT_NUM_KINDS + 1, ZERO_I32, ZERO_MAX);
    if (s != ZERO_OK) return zero_fail(NULL, s, "checkpoint: %s", zero_comm_last_error(dp));
    if (local != ZERO_OK) return local;
    if (all[CKPT_NUM_KINDS])
        return zero_fail(NULL, ZERO_PEER_FAILURE, "checkpoint: another rank failed to read its optimizer state");
    *kinds = 0;
    for (int k = 0; k < CKPT_NUM_KINDS; k++)
        if (all[k]) *kinds |= 1u << k;
    return ZERO_OK;
}

static zero_status write_shard(zero_engine *e, const char *tmp_dir, int rank, int world, unsigned kinds, int durable)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/rank-%05d.bin", tmp_dir, rank);
    ckpt_writer w;
    ZERO_TRY(ckpt_writer_open(&w, path, (uint32_t)rank, (uint32_t)world, durable));
    int np = zero_engine_get_num_params(e);
    float *buf = NULL;
    uint64_t cap = 0;
    zero_status s = ZERO_OK;
    for (int p = 0; p < np && s == ZERO_OK; p++) {
        zero_param_info pi;
        if ((s = zero_engine_get_param_info(e, p, &pi)) != ZERO_OK) break;
        uint64_t n = pi.owned_numel; /* all owned ranges, one after another */
        if (n == 0) continue;
        if ((s = ckpt_grow_buffer(&buf, &cap, n, "checkpoint save", pi.name)) != ZERO_OK) break;
        for (int k = 0; k < CKPT_NUM_KINDS && s == ZERO_OK; k++) {
            if (!(kinds & (1u << k))) continue;
            s = zero_engine_state_get(e, (zero_state_kind)k, p, buf);
            if (s != ZERO_OK) {
                s = zero_fail(NULL, s, "checkpoint save: rank %d: reading %s of %s: %s", rank, ckpt_kind_names[k],
                              pi.name, zero_engine_last_error(e));
                break;
            }
            /* one segment per owned range (a split parameter has several) */
            uint64_t done = 0;
            for (int i = 0; i < pi.num_owned_ranges && s == ZERO_OK; i++) {
                uint64_t b, end;
                if ((s = zero_engine_get_param_owned_range(e, p, i, &b, &end)) != ZERO_OK) {
                    s = zero_fail(NULL, s, "checkpoint save: %s", zero_engine_last_error(e));
                    break;
                }
                s = ckpt_writer_segment(&w, p, k, b, buf + done, end - b);
                done += end - b;
            }
        }
    }
    free(buf);
    if (s != ZERO_OK) {
        ckpt_writer_abort(&w);
        return s;
    }
    return ckpt_writer_close(&w, NULL);
}

static json_t *scalars_json(const zero_engine_scalars *sc)
{
    return json_pack("{s:I,s:I,s:f,s:i,s:I,s:f}", "step", (json_int_t)sc->step, "skipped_steps",
                     (json_int_t)sc->skipped_steps, "loss_scale", sc->loss_scale, "hysteresis_left",
                     sc->hysteresis_left, "good_steps", (json_int_t)sc->good_steps, "lr", sc->lr);
}

static zero_status build_meta(zero_engine *e, const zero_plan_info *plan, int64_t step, int64_t save_seq,
                              unsigned kinds, json_t *user, json_t **out)
{
    zero_engine_scalars sc;
    ZERO_TRY(zero_engine_get_scalars(e, &sc));
    json_t *m = json_object();
    json_object_set_new(m, "magic", json_string(CKPT_META_MAGIC));
    json_object_set_new(m, "format_version", json_integer(ZERO_CHECKPOINT_FORMAT_VERSION));
    json_object_set_new(m, "library_version", json_string(zero_version_string()));
    json_object_set_new(m, "step", json_integer(step));
    json_object_set_new(m, "world_size", json_integer(plan->dp_size));
    json_object_set_new(m, "stage", json_integer(plan->stage));
    json_object_set_new(m, "compute_dtype", json_string(zero_dtype_name(plan->compute_dtype)));
    json_object_set_new(m, "plan_hash", json_sprintf("%016llx", (unsigned long long)plan->hash));
    json_t *k = json_array();
    for (int i = 0; i < CKPT_NUM_KINDS; i++)
        if (kinds & (1u << i)) json_array_append_new(k, json_string(ckpt_kind_names[i]));
    json_object_set_new(m, "kinds", k);
    json_t *params = json_array();
    for (int p = 0; p < plan->num_params; p++) {
        zero_param_info pi;
        zero_status s = zero_engine_get_param_info(e, p, &pi);
        if (s != ZERO_OK) {
            json_decref(params);
            json_decref(m);
            return s;
        }
        json_t *shape = json_array();
        for (int d = 0; d < pi.ndim; d++) json_array_append_new(shape, json_integer(pi.shape[d]));
        const char *mod = zero_engine_get_module_name(e, pi.module);
        int group = 0;
        (void)zero_engine_get_param_group(e, p, &group);
        const char *gname = zero_engine_get_group_name(e, group);
        json_array_append_new(params, json_pack("{s:s,s:o,s:s,s:s}", "name", pi.name, "shape", shape, "module",
                                                mod ? mod : "", "group", gname ? gname : "default"));
    }
    json_object_set_new(m, "params", params);
    /* the groups' hyperparameters, restored by load (torch's optimizer
     * state_dict keeps its param_groups' too) */
    json_t *groups = json_array();
    for (int g = 0; g < zero_engine_get_num_groups(e); g++) {
        zero_group_hparams h = ZERO_GROUP_HPARAMS_INIT;
        zero_status s = zero_engine_get_group_hparams(e, g, &h);
        if (s != ZERO_OK) {
            json_decref(groups);
            json_decref(m);
            return s;
        }
        json_array_append_new(groups, json_pack("{s:s,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:b}", "name",
                                                zero_engine_get_group_name(e, g), "lr_scale", h.lr_scale,
                                                "weight_decay", h.weight_decay, "beta1", h.beta1, "beta2", h.beta2,
                                                "eps", h.eps, "momentum", h.momentum, "dampening", h.dampening,
                                                "nesterov", h.nesterov));
    }
    json_object_set_new(m, "groups", groups);
    json_object_set_new(m, "engine", scalars_json(&sc));
    json_object_set(m, "user", user);
    json_object_set_new(m, "save_seq", json_integer(save_seq));
    *out = m;
    return ZERO_OK;
}

/* Rank 0: meta.json, then the renames that publish the checkpoint. */
static zero_status publish(zero_engine *e, const zero_plan_info *plan, const char *dir, const char *tmp_dir,
                           const char *name, int64_t step, unsigned kinds, json_t *user,
                           const zero_checkpoint_options *o)
{
    json_t *meta;
    ZERO_TRY(build_meta(e, plan, step, ckpt_newest_save_seq(dir, o->keep_last) + 1, kinds, user, &meta));
    zero_status s = ckpt_meta_collect_files(meta, tmp_dir, plan->dp_size);
    char *text = s == ZERO_OK ? ckpt_meta_dump(meta) : NULL;
    json_decref(meta);
    if (s != ZERO_OK) return s;
    if (!text) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint save: meta.json");
    char p[1400], final_dir[1400], old_dir[1400];
    snprintf(p, sizeof p, "%s/meta.json", tmp_dir);
    s = ckpt_write_file_atomic(p, text, strlen(text), o->durable);
    free(text);
    ZERO_TRY(s);
    ZERO_TRY(ckpt_fsync_dir(tmp_dir, o->durable));
    snprintf(final_dir, sizeof final_dir, "%s/%s", dir, name);
    snprintf(old_dir, sizeof old_dir, "%s/.old-%s", dir, name);
    struct stat st;
    int replacing = stat(final_dir, &st) == 0;
    if (replacing) {
        ckpt_remove_tree(old_dir);
        if (rename(final_dir, old_dir) != 0)
            return zero_fail(NULL, ZERO_IO, "checkpoint save: moving the old %s aside: %s", final_dir,
                             strerror(errno));
    }
    if (rename(tmp_dir, final_dir) != 0) {
        zero_status st = zero_fail(NULL, ZERO_IO, "checkpoint save: renaming %s to %s: %s", tmp_dir, final_dir,
                                   strerror(errno));
        if (replacing) rename(old_dir, final_dir); /* put the previous one back */
        return st;
    }
    ZERO_TRY(ckpt_fsync_dir(dir, o->durable));
    if (replacing) ckpt_remove_tree(old_dir);
    char latest[1400], line[128];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(line, sizeof line, "%s\n", name);
    ZERO_TRY(ckpt_write_file_atomic(latest, line, strlen(line), o->durable));
    ckpt_prune(dir, o->keep_last);
    return ZERO_OK;
}

/* One row per ZERO_CHECKPOINT_OPTIONS_VERSION (checkpoint.h lists each version's fields). */
static const zero_struct_version checkpoint_options_versions[] = {
    {ZERO_FIELD_END(zero_checkpoint_options, durable), "keep_last"},
};
_Static_assert(sizeof checkpoint_options_versions / sizeof *checkpoint_options_versions ==
                   ZERO_CHECKPOINT_OPTIONS_VERSION,
               "a new zero_checkpoint_options version needs its row above");
ZERO_ASSERT_LAST_FIELD(zero_checkpoint_options, durable);
static const zero_versioned_type checkpoint_options_type = {
    "zero_checkpoint_options", "ZERO_CHECKPOINT_OPTIONS_INIT", checkpoint_options_versions,
    ZERO_CHECKPOINT_OPTIONS_VERSION, sizeof(zero_checkpoint_options)};

zero_status zero_checkpoint_save(zero_engine *e, zero_comm *dp, const char *dir, int64_t step, const char *user_json,
                                 const zero_checkpoint_options *options)
{
    if (!e || !dp || !dir || !*dir || step < 0)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint save: NULL engine, comm or dir, or negative step");
    zero_checkpoint_options o;
    const zero_checkpoint_options defaults = ZERO_CHECKPOINT_OPTIONS_INIT;
    memcpy(&o, &defaults, sizeof o);
    if (options) /* an older version's missing fields keep their defaults */
        ZERO_TRY(zero_versioned_read(NULL, ZERO_INVALID_ARGUMENT, "checkpoint save", &checkpoint_options_type,
                                     options, &o));
    zero_plan_info plan;
    ZERO_TRY(zero_engine_get_plan_info(e, &plan));
    int rank = zero_comm_get_rank(dp), world = zero_comm_get_size(dp);
    if (rank != plan.dp_rank || world != plan.dp_size)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT,
                         "checkpoint save: comm is rank %d of %d but the engine's dp group is rank %d of %d", rank,
                         world, plan.dp_rank, plan.dp_size);
    json_t *user = NULL;
    /* local, like every check here: the outcome is agreed below */
    zero_status s = engine_between_steps(e, "checkpoint save");
    if (s == ZERO_OK && user_json && *user_json) {
        json_error_t je;
        user = json_loads(user_json, 0, &je);
        if (!json_is_object(user)) {
            s = zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint save: user_json is not a JSON object (%s)",
                          user ? "another JSON value" : je.text);
            json_decref(user);
            user = NULL;
        }
    } else {
        user = json_object();
    }
    unsigned kinds = 0;
    zero_status ks = ckpt_engine_kinds(e, dp, &kinds); /* collective: always */
    if (s == ZERO_OK) s = ks;
    char name[64], tmp_dir[1200];
    snprintf(name, sizeof name, "step-%08lld", (long long)step);
    snprintf(tmp_dir, sizeof tmp_dir, "%s/.tmp-%s", dir, name);
    /* 1. rank 0 prepares an empty temporary directory */
    if (s == ZERO_OK && rank == 0) {
        s = ckpt_mkdir_p(dir);
        if (s == ZERO_OK) {
            ckpt_remove_tree(tmp_dir); /* left by a save that was killed */
            s = ckpt_mkdir_p(tmp_dir);
        }
    }
    s = ckpt_agree(dp, s, "checkpoint save");
    /* 2. every rank writes its shard */
    if (s == ZERO_OK) {
        s = write_shard(e, tmp_dir, rank, world, kinds, o.durable);
        s = ckpt_agree(dp, s, "checkpoint save");
    }
    /* 3. rank 0 writes meta.json and publishes */
    if (s == ZERO_OK) {
        if (rank == 0) s = publish(e, &plan, dir, tmp_dir, name, step, kinds, user, &o);
        s = ckpt_agree(dp, s, "checkpoint save");
    } else if (rank == 0) {
        ckpt_remove_tree(tmp_dir);
    }
    json_decref(user);
    return s;
}
