/* zero-ckpt merge-ep: the per-ep-rank checkpoints of an expert-parallel
 * zero-train run (<dir>/ep0 .. ep<E-1>, docs/moe.md) into one checkpoint of
 * the whole model, as an ep-1 run holds it. Which tensors are expert stacks,
 * and in which order their slices go, is the model's rule (model/gpt.h:
 * gpt_param_info.expert_stack, ep rank r holding elements [r numel,
 * (r+1) numel) of the whole stack, as gpt_param_init_ep generates them); the
 * library's zero_checkpoint_merge does the checked, streaming copy. */
#include "ckpt_merge_ep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>
#include <zero/checkpoint.h>

#include "gpt.h"

#define MAX_EP 4096

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The user object of the checkpoint `path` (new reference), or NULL with a message. */
static json_t *user_of(const char *path)
{
    char *text = NULL;
    if (zero_checkpoint_inspect(path, &text) != ZERO_OK) {
        fprintf(stderr, "zero-ckpt merge-ep: %s\n", zero_last_error());
        return NULL;
    }
    json_t *m = json_loads(text, 0, NULL);
    zero_checkpoint_free(text);
    json_t *u = json_incref(json_object_get(m, "user"));
    json_decref(m);
    if (!json_is_object(u)) {
        fprintf(stderr, "zero-ckpt merge-ep: %s holds no user object (not a zero-train checkpoint)\n", path);
        json_decref(u);
        return NULL;
    }
    return u;
}

static int get_int(json_t *o, const char *k, int *out)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 30) return 0;
    *out = (int)json_integer_value(v);
    return 1;
}

/* The GPT of zero-train's user.model (the shape its checkpoints record). */
static int model_config(json_t *model, gpt_config *c)
{
    json_t *moe = json_object_get(model, "moe");
    memset(c, 0, sizeof *c);
    if (!get_int(model, "n_layer", &c->n_layer) || !get_int(model, "n_head", &c->n_head) ||
        !get_int(model, "d_model", &c->d_model) || !get_int(model, "seq_len", &c->seq_len) ||
        !get_int(model, "vocab", &c->vocab) || !get_int(moe, "experts", &c->moe_experts) ||
        !get_int(moe, "top_k", &c->moe_top_k) || !get_int(moe, "ep", &c->moe_ep))
        return 0;
    c->moe_capacity_factor = (float)json_number_value(json_object_get(moe, "capacity_factor"));
    c->moe_aux_loss_coef = (float)json_number_value(json_object_get(moe, "aux_loss_coef"));
    return gpt_config_validate(c) == ZERO_OK;
}

/* ep rank r's directory must say it is ep rank r of ep (zero-train's user.parallel). */
static int check_part(const char *path, json_t *u, int ep, int r)
{
    json_t *par = json_object_get(u, "parallel");
    int e = -1, er = -1;
    if (!get_int(par, "ep", &e) || !get_int(par, "ep_rank", &er)) {
        fprintf(stderr, "zero-ckpt merge-ep: %s is not an expert-parallel checkpoint (its user object names no "
                        "parallel.ep / ep_rank)\n", path);
        return 0;
    }
    if (e != ep || er != r) {
        fprintf(stderr, "zero-ckpt merge-ep: %s was saved by ep rank %d of model.moe.ep %d, not ep rank %d of %d\n",
                path, er, e, r, ep);
        return 0;
    }
    return 1;
}

/* The merged checkpoint's user object: an ep-1 run's (model.moe.ep 1 in the
 * model shape and the config, no parallel position), so zero-train resumes
 * from it at model.moe.ep 1. */
static char *merged_user(json_t *u0, const char *dir, int ep)
{
    json_t *u = json_deep_copy(u0);
    json_object_set_new(json_object_get(json_object_get(u, "model"), "moe"), "ep", json_integer(1));
    json_t *cm = json_object_get(json_object_get(json_object_get(u, "config"), "model"), "moe");
    if (cm) json_object_set_new(cm, "ep", json_integer(1));
    json_object_del(u, "parallel");
    json_object_set_new(u, "merged", json_pack("{s:s,s:i}", "from", dir, "ep", ep));
    char *s = json_dumps(u, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(u);
    return s;
}

int zero_ckpt_merge_ep(const char *dir, const char *out)
{
    char p0[1100];
    snprintf(p0, sizeof p0, "%s/ep0", dir);
    if (!is_dir(p0)) {
        fprintf(stderr, "zero-ckpt merge-ep: %s: no such directory: %s is not the checkpoint directory of a run "
                        "with model.moe.ep > 1\n", p0, dir);
        return 1;
    }
    json_t *u0 = user_of(p0);
    if (!u0) return 1;
    gpt_config cfg;
    int ep = 0, rc = 1;
    char **paths = NULL, **stacked = NULL;
    int n_stacked = 0;
    size_t np = 0;
    if (!get_int(json_object_get(u0, "parallel"), "ep", &ep) || ep < 2 || ep > MAX_EP) {
        fprintf(stderr, "zero-ckpt merge-ep: %s names no model.moe.ep in [2, %d] (user.parallel.ep)\n", p0, MAX_EP);
        goto out;
    }
    if (!model_config(json_object_get(u0, "model"), &cfg) || cfg.moe_experts < 1 || cfg.moe_ep != ep) {
        fprintf(stderr, "zero-ckpt merge-ep: %s: user.model is not an MoE GPT with model.moe.ep %d\n", p0, ep);
        goto out;
    }
    paths = calloc((size_t)ep, sizeof *paths);
    np = gpt_num_params(&cfg);
    stacked = calloc(np + 1, sizeof *stacked);
    if (!paths || !stacked) goto out;
    for (int r = 0; r < ep; r++) {
        char p[1100];
        snprintf(p, sizeof p, "%s/ep%d", dir, r);
        if (!is_dir(p)) {
            fprintf(stderr, "zero-ckpt merge-ep: %s is missing: %s says model.moe.ep %d\n", p, p0, ep);
            goto out;
        }
        json_t *u = r == 0 ? json_incref(u0) : user_of(p);
        int ok = u && check_part(p, u, ep, r);
        json_decref(u);
        if (!ok || !(paths[r] = strdup(p))) goto out;
    }
    char extra[1100];
    snprintf(extra, sizeof extra, "%s/ep%d", dir, ep);
    if (is_dir(extra)) {
        fprintf(stderr, "zero-ckpt merge-ep: %s exists but %s says model.moe.ep %d: a directory of two runs; "
                        "move one aside\n", extra, p0, ep);
        goto out;
    }
    for (size_t i = 0; i < np; i++) {
        gpt_param_info pi;
        if (gpt_param_info_get(&cfg, i, &pi) != ZERO_OK) goto out;
        if (pi.expert_stack && !(stacked[n_stacked++] = strdup(pi.name))) goto out;
    }
    char *user = merged_user(u0, dir, ep);
    zero_status s = zero_checkpoint_merge((const char *const *)paths, ep, (const char *const *)stacked, n_stacked,
                                          user, out);
    free(user);
    if (s != ZERO_OK) {
        fprintf(stderr, "zero-ckpt merge-ep: %s\n", zero_last_error());
        goto out;
    }
    printf("wrote %s: the %d ep ranks' checkpoints of %s as one (%d expert stacks of %d experts), for model.moe.ep 1\n",
           out, ep, dir, n_stacked, cfg.moe_experts);
    rc = 0;
out:
    for (int r = 0; paths && r < ep; r++) free(paths[r]);
    for (int i = 0; stacked && i < n_stacked; i++) free(stacked[i]);
    free(paths);
    free(stacked);
    json_decref(u0);
    return rc;
}
