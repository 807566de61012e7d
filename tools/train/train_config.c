/* zero-train configuration: validation of the top level and of zero-train's
 * own sections, defaults, and the effective config (see train_config.h). */
#include "train_config.h"

#include "common/ds_keys.h"
#include "common/suggest.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Small enough to train in a few minutes on two CPU cores. */
const char train_default_config_json[] =
    "{\n"
    "  \"train_micro_batch_size_per_gpu\": 8,\n"
    "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003, \"betas\": [0.9, 0.95],\n"
    "                \"eps\": 1e-8, \"weight_decay\": 0.1}},\n"
    "  \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 20,\n"
    "                \"total_num_steps\": 1000, \"warmup_min_ratio\": 0.0, \"cos_min_ratio\": 0.1,\n"
    "                \"warmup_type\": \"linear\"}},\n"
    "  \"gradient_clipping\": 1.0,\n"
    /* DeepSpeed's persistence threshold (1e5) would keep every tensor of this
     * small model whole; 4096 shards the weight matrices and keeps only the
     * LayerNorm and bias vectors whole, so stage 3 really gathers per block. */
    "  \"zero_optimization\": {\"stage\": 3, \"overlap_comm\": true,\n"
    "                        \"stage3_param_persistence_threshold\": 4096,\n"
    "                        \"stage3_prefetch_bucket_size\": \"auto\"},\n"
    /* the GPT recipe: no weight decay on biases, LayerNorms and embeddings */
    "  \"param_groups\": [{\"name\": \"no_decay\", \"params\": [\"*.bias\", \"*ln_*\", \"wte.*\", \"wpe.*\"],\n"
    "                    \"weight_decay\": 0.0}],\n"
    "  \"model\": {\"n_layer\": 4, \"n_head\": 4, \"d_model\": 128, \"seq_len\": 64, \"vocab\": 256},\n"
    "  \"data\": {\"path\": \"auto\"},\n"
    "  \"train\": {\"steps\": 1000, \"seed\": 1234, \"log_every\": 50}\n"
    "}\n";

static int cfail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int cfail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

static int in_list(const char *key, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(key, *list) == 0) return 1;
    return 0;
}

/* Reject keys of `obj` not in `allowed`, naming `prefix.key`. */
static int check_keys(const json_t *obj, const char *prefix, const char *const *allowed, char *err, size_t n)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        (void)v;
        if (!in_list(key, allowed)) {
            char list[512] = "";
            for (const char *const *a = allowed; *a; a++) {
                strncat(list, *a, sizeof list - strlen(list) - 1);
                if (a[1]) strncat(list, ", ", sizeof list - strlen(list) - 1);
            }
            const char *close = zero_suggest_key(key, (const char *const *)allowed);
            return cfail(err, n, "%s%s%s: unknown key%s%s%s (known: %s)", prefix, *prefix ? "." : "", key,
                         close ? "; did you mean '" : "", close ? close : "", close ? "'?" : "", list);
        }
    }
    return 0;
}

/* A section that must be an object if present; returns it or NULL (absent). */
static int get_section(json_t *root, const char *name, json_t **out, char *err, size_t n)
{
    json_t *v = json_object_get(root, name);
    *out = v;
    if (v && !json_is_object(v)) return cfail(err, n, "%s: expected an object, got %s", name, type_name(v));
    return 0;
}

static int get_int(json_t *obj, const char *prefix, const char *key, int64_t *dst, int64_t lo, int64_t hi,
                   char *err, size_t n)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v) return 0;
    if (!json_is_integer(v))
        return cfail(err, n, "%s%s%s: expected an integer, got %s", prefix, *prefix ? "." : "", key, type_name(v));
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi)
        return cfail(err, n, "%s%s%s: %lld is out of range [%lld, %lld]", prefix, *prefix ? "." : "", key, (long long)x, (long long)lo,
                     (long long)hi);
    *dst = x;
    return 0;
}

static int get_int32(json_t *obj, const char *prefix, const char *key, int *dst, int lo, int hi, char *err,
                     size_t n)
{
    int64_t x = *dst;
    if (get_int(obj, prefix, key, &x, lo, hi, err, n)) return -1;
    *dst = (int)x;
    return 0;
}

static int get_num(json_t *obj, const char *prefix, const char *key, double *dst, double lo, double hi,
                   char *err, size_t n)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v) return 0;
    if (!json_is_number(v)) return cfail(err, n, "%s%s%s: expected a number, got %s", prefix, *prefix ? "." : "", key, type_name(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return cfail(err, n, "%s%s%s: %g is out of range [%g, %g]", prefix, *prefix ? "." : "", key, x, lo, hi);
    *dst = x;
    return 0;
}

/* A string or null (null leaves *dst NULL). */
static int get_str(json_t *obj, const char *prefix, const char *key, char **dst, char *err, size_t n)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v) return 0;
    free(*dst);
    *dst = NULL;
    if (json_is_null(v)) return 0;
    if (!json_is_string(v)) return cfail(err, n, "%s%s%s: expected a string, got %s", prefix, *prefix ? "." : "", key, type_name(v));
    *dst = strdup(json_string_value(v));
    return 0;
}

/* ---------------------------------------------------------------- scheduler */

static int get_bool(json_t *obj, const char *prefix, const char *key, int *dst, char *err, size_t n);

static int parse_scheduler(train_config *c, json_t *s, char *err, size_t n)
{
    train_sched *sc = &c->sched;
    memset(sc, 0, sizeof *sc);
    sc->warmup_log = 1;
    sc->warmup_num_steps = 1000;
    sc->total_num_steps = c->steps;
    sc->warmup_max_lr = 0.001;
    sc->cos_min_ratio = 1e-4;   /* DeepSpeed's WarmupCosineLR defaults */
    if (!s || json_is_null(s)) return 0; /* null: no scheduler, as --print-config writes it */
    if (!json_is_object(s)) return cfail(err, n, "scheduler: expected an object or null, got %s", type_name(s));
    static const char *const keys[] = {"type", "params", NULL};
    if (check_keys(s, "scheduler", keys, err, n)) return -1;
    json_t *t = json_object_get(s, "type");
    if (!t) return cfail(err, n, "scheduler.type: missing (WarmupLR, WarmupDecayLR or WarmupCosineLR)");
    if (!json_is_string(t)) return cfail(err, n, "scheduler.type: expected a string, got %s", type_name(t));
    const char *type = json_string_value(t);
    json_t *p = json_object_get(s, "params");
    if (p && !json_is_object(p)) return cfail(err, n, "scheduler.params: expected an object, got %s", type_name(p));
    static const char *const warm_keys[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                            NULL};
    static const char *const decay_keys[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                             "total_num_steps", NULL};
    static const char *const cos_keys[] = {"warmup_min_ratio", "warmup_num_steps", "warmup_type",
                                           "total_num_steps", "cos_min_ratio", NULL};
    static const char *const cycle_keys[] = {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate",
                                             "cycle_first_step_size", "cycle_second_step_size",
                                             "cycle_first_stair_count", "cycle_second_stair_count",
                                             "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom",
                                             "decay_mom_rate", NULL};
    const char *const *allowed;
    if (strcmp(type, "WarmupLR") == 0) {
        sc->kind = TRAIN_SCHED_WARMUP_LR;
        allowed = warm_keys;
    } else if (strcmp(type, "WarmupDecayLR") == 0) {
        sc->kind = TRAIN_SCHED_WARMUP_DECAY_LR;
        allowed = decay_keys;
    } else if (strcmp(type, "WarmupCosineLR") == 0) {
        sc->kind = TRAIN_SCHED_WARMUP_COSINE_LR;
        allowed = cos_keys;
    } else if (strcmp(type, "OneCycle") == 0) {
        sc->kind = TRAIN_SCHED_ONE_CYCLE;
        allowed = cycle_keys;
    } else {
        return cfail(err, n, "scheduler.type: unknown scheduler \"%s\" (WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                     "OneCycle)", type);
    }
    if (p && check_keys(p, "scheduler.params", allowed, err, n)) return -1;
    const char *pf = "scheduler.params";
    if (get_num(p, pf, "warmup_min_lr", &sc->warmup_min_lr, 0, 1e3, err, n) ||
        get_num(p, pf, "warmup_max_lr", &sc->warmup_max_lr, 0, 1e3, err, n) ||
        get_num(p, pf, "warmup_min_ratio", &sc->warmup_min_ratio, 0, 1, err, n) ||
        get_num(p, pf, "cos_min_ratio", &sc->cos_min_ratio, 0, 1, err, n) ||
        get_int(p, pf, "warmup_num_steps", &sc->warmup_num_steps, 0, INT64_MAX / 2, err, n) ||
        get_int(p, pf, "total_num_steps", &sc->total_num_steps, 1, INT64_MAX / 2, err, n))
        return -1;
    if (sc->kind == TRAIN_SCHED_ONE_CYCLE) {
        /* DeepSpeed's OneCycle defaults; cycle_min_lr and cycle_max_lr have none there */
        sc->cycle_first_step_size = 2000;
        sc->cycle_second_step_size = -1; /* = cycle_first_step_size */
        sc->cycle_second_stair_count = -1;
        sc->cycle_momentum = 1;
        sc->cycle_min_mom = 0.8;
        sc->cycle_max_mom = 0.9;
        if (!json_object_get(p, "cycle_min_lr") || !json_object_get(p, "cycle_max_lr"))
            return cfail(err, n, "scheduler.params: OneCycle needs cycle_min_lr and cycle_max_lr");
        int mom = sc->cycle_momentum;
        if (get_num(p, pf, "cycle_min_lr", &sc->cycle_min_lr, 0, 1e3, err, n) ||
            get_num(p, pf, "cycle_max_lr", &sc->cycle_max_lr, 0, 1e3, err, n) ||
            get_num(p, pf, "decay_lr_rate", &sc->decay_lr_rate, 0, 1e6, err, n) ||
            get_num(p, pf, "cycle_first_step_size", &sc->cycle_first_step_size, 1, 1e15, err, n) ||
            get_num(p, pf, "cycle_second_step_size", &sc->cycle_second_step_size, 1, 1e15, err, n) ||
            get_int(p, pf, "cycle_first_stair_count", &sc->cycle_first_stair_count, 0, INT64_MAX / 2, err, n) ||
            get_int(p, pf, "cycle_second_stair_count", &sc->cycle_second_stair_count, 0, INT64_MAX / 2, err, n) ||
            get_int(p, pf, "decay_step_size", &sc->decay_step_size, 0, INT64_MAX / 2, err, n) ||
            get_bool(p, pf, "cycle_momentum", &mom, err, n) ||
            get_num(p, pf, "cycle_min_mom", &sc->cycle_min_mom, 0, 0.999999, err, n) ||
            get_num(p, pf, "cycle_max_mom", &sc->cycle_max_mom, 0, 0.999999, err, n) ||
            get_num(p, pf, "decay_mom_rate", &sc->decay_mom_rate, 0, 1e6, err, n))
            return -1;
        sc->cycle_momentum = mom;
        json_t *second = json_object_get(p, "cycle_second_step_size");
        if (!second || json_is_null(second)) sc->cycle_second_step_size = sc->cycle_first_step_size;
        json_t *stair2 = json_object_get(p, "cycle_second_stair_count");
        if (!stair2 || json_is_null(stair2)) sc->cycle_second_stair_count = sc->cycle_first_stair_count;
        return 0;
    }
    json_t *wt = json_object_get(p, "warmup_type");
    if (wt) {
        if (!json_is_string(wt))
            return cfail(err, n, "scheduler.params.warmup_type: expected a string, got %s", type_name(wt));
        if (strcmp(json_string_value(wt), "log") == 0)
            sc->warmup_log = 1;
        else if (strcmp(json_string_value(wt), "linear") == 0)
            sc->warmup_log = 0;
        else
            return cfail(err, n, "scheduler.params.warmup_type: \"%s\" is neither \"log\" nor \"linear\"",
                         json_string_value(wt));
    }
    /* checked with the defaults filled in, so a config is refused exactly
     * when its --print-config form would be */
    if (sc->kind != TRAIN_SCHED_WARMUP_LR && sc->warmup_num_steps > sc->total_num_steps)
        return cfail(err, n, "scheduler.params.warmup_num_steps: %lld%s exceeds scheduler.params.total_num_steps %lld%s",
                     (long long)sc->warmup_num_steps, json_object_get(p, "warmup_num_steps") ? "" : " (the default)",
                     (long long)sc->total_num_steps,
                     json_object_get(p, "total_num_steps") ? "" : " (the default: train.steps)");
    return 0;
}

/* DeepSpeed's warmup length: it clamps warmup_num_steps to at least 2 (for
 * the log's denominator) and uses the clamped value everywhere, the linear
 * warm-up and the decay's span included. */
static int64_t warmup_steps(const train_sched *s) { return s->warmup_num_steps > 2 ? s->warmup_num_steps : 2; }

/* DeepSpeed's warmup fraction at last_batch_iteration `it` (0 <= it < the
 * clamped warmup): log(it+1)/log(w) ("log", its default) or it/w ("linear"). */
static double warmup_gamma(const train_sched *s, int64_t it)
{
    double w = (double)warmup_steps(s);
    if (s->warmup_log) return log((double)it + 1.0) / log(w);
    return (double)it / w;
}

/* OneCycle's triangle at last_batch_iteration `it`: DeepSpeed evaluates it
 * at it + 1, rising over the first step size, falling over the second. */
static double one_cycle_scale(const train_sched *s, int64_t it)
{
    const double total = s->cycle_first_step_size + s->cycle_second_step_size;
    const double ratio = s->cycle_first_step_size / total;
    const double bi = (double)it + 1.0;
    const double cycle = floor(1.0 + bi / total);
    const double x = 1.0 + bi / total - cycle;
    return x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
}

int train_sched_betas(const train_sched *s, int64_t applied, double *beta1, double *beta2)
{
    if (s->kind != TRAIN_SCHED_ONE_CYCLE || !s->cycle_momentum) return 0;
    const int64_t it = applied - 1;
    const double total = s->cycle_first_step_size + s->cycle_second_step_size;
    *beta2 = 0.99; /* DeepSpeed's OneCycle pairs every beta1 with 0.99 */
    if (it < 0) *beta1 = s->cycle_min_mom;
    else if ((double)it < total)
        *beta1 = s->cycle_max_mom - (s->cycle_max_mom - s->cycle_min_mom) * one_cycle_scale(s, it);
    else if (s->decay_step_size == 0 || s->decay_mom_rate == 0)
        *beta1 = s->cycle_max_mom;
    else
        *beta1 = s->cycle_max_mom * (1.0 + s->decay_mom_rate * (((double)it - total + 1.0) / (double)s->decay_step_size));
    return 1;
}

/* The lr of the next optimizer update after `applied` updates (DeepSpeed
 * semantics, deepspeed/runtime/lr_schedules.py and engine.py):
 *   - its scheduler does NOT step at construction: it only sets the lr it has
 *     at last_batch_iteration -1 (WarmupLR / WarmupDecayLR: warmup_min_lr;
 *     WarmupCosineLR: 0), which the first update uses;
 *   - the engine steps the scheduler after each APPLIED update (an fp16
 *     overflow skips the update and the scheduler step alike),
 * so update k (1-based) uses the lr at last_batch_iteration k - 2, i.e.
 * `applied` - 1 here. With warmup_min_lr 0, warmup_max_lr 6e-4 and a linear
 * 4-step warm-up, updates 1-5 use 0, 0, 1.5e-4, 3e-4, 4.5e-4. */
double train_sched_lr(const train_sched *s, double base_lr, int64_t applied)
{
    const int64_t it = applied - 1; /* DeepSpeed's last_batch_iteration */
    const int64_t w = warmup_steps(s);
    const int in_warmup = it < w;
    if (s->kind == TRAIN_SCHED_CONSTANT) return base_lr;
    if (s->kind == TRAIN_SCHED_ONE_CYCLE) {
        if (it < 0) return s->cycle_min_lr; /* set at construction */
        const double total = s->cycle_first_step_size + s->cycle_second_step_size;
        if ((double)it < total)
            return s->cycle_min_lr + (s->cycle_max_lr - s->cycle_min_lr) * one_cycle_scale(s, it);
        if (s->decay_step_size == 0 || s->decay_lr_rate == 0) return s->cycle_min_lr;
        const double interval = ((double)it - total + 1.0) / (double)s->decay_step_size;
        return s->cycle_min_lr / (1.0 + s->decay_lr_rate * interval);
    }
    if (it < 0) return s->kind == TRAIN_SCHED_WARMUP_COSINE_LR ? 0.0 : s->warmup_min_lr;
    switch (s->kind) {
    case TRAIN_SCHED_CONSTANT:
    case TRAIN_SCHED_ONE_CYCLE:
        return base_lr; /* handled above */
    case TRAIN_SCHED_WARMUP_LR:
        return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * (in_warmup ? warmup_gamma(s, it) : 1.0);
    case TRAIN_SCHED_WARMUP_DECAY_LR: {
        double gamma;
        if (in_warmup) {
            gamma = warmup_gamma(s, it);
        } else {
            double span = (double)(s->total_num_steps - w);
            gamma = (double)(s->total_num_steps - it) / (span > 1.0 ? span : 1.0);
            if (gamma < 0) gamma = 0;
        }
        return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * gamma;
    }
    case TRAIN_SCHED_WARMUP_COSINE_LR: {
        double ratio;
        if (in_warmup) {
            ratio = s->warmup_min_ratio + (1.0 - s->warmup_min_ratio) * warmup_gamma(s, it);
        } else {
            /* DeepSpeed divides by total - warmup unguarded (a ZeroDivisionError
             * when they are equal); here that span counts as 1 */
            double real_last = (double)(it - w + 1);
            double real_total = (double)(s->total_num_steps - w);
            double c = (1.0 + cos(M_PI * real_last / (real_total > 0 ? real_total : 1.0))) / 2.0;
            ratio = s->cos_min_ratio + (1.0 - s->cos_min_ratio) * c;
            if (ratio < 0) ratio = 0;
        }
        return base_lr * ratio;
    }
    }
    return base_lr;
}

/* The scheduler as a config section: every parameter, defaults filled in;
 * null for none (the constant lr). */
json_t *train_sched_json(const train_sched *s)
{
    const char *wt = s->warmup_log ? "log" : "linear";
    switch (s->kind) {
    case TRAIN_SCHED_CONSTANT: return json_null();
    case TRAIN_SCHED_WARMUP_LR:
        return json_pack("{s:s,s:{s:f,s:f,s:I,s:s}}", "type", "WarmupLR", "params", "warmup_min_lr", s->warmup_min_lr,
                         "warmup_max_lr", s->warmup_max_lr, "warmup_num_steps", (json_int_t)s->warmup_num_steps,
                         "warmup_type", wt);
    case TRAIN_SCHED_WARMUP_DECAY_LR:
        return json_pack("{s:s,s:{s:f,s:f,s:I,s:I,s:s}}", "type", "WarmupDecayLR", "params", "warmup_min_lr",
                         s->warmup_min_lr, "warmup_max_lr", s->warmup_max_lr, "warmup_num_steps",
                         (json_int_t)s->warmup_num_steps, "total_num_steps", (json_int_t)s->total_num_steps,
                         "warmup_type", wt);
    case TRAIN_SCHED_ONE_CYCLE: {
        json_t *p = json_pack("{s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:b,s:f,s:f,s:f}", "cycle_min_lr", s->cycle_min_lr,
                              "cycle_max_lr", s->cycle_max_lr, "decay_lr_rate", s->decay_lr_rate,
                              "cycle_first_step_size", s->cycle_first_step_size, "cycle_second_step_size",
                              s->cycle_second_step_size, "cycle_first_stair_count",
                              (json_int_t)s->cycle_first_stair_count, "cycle_second_stair_count",
                              (json_int_t)s->cycle_second_stair_count, "decay_step_size",
                              (json_int_t)s->decay_step_size, "cycle_momentum", s->cycle_momentum, "cycle_min_mom",
                              s->cycle_min_mom, "cycle_max_mom", s->cycle_max_mom, "decay_mom_rate",
                              s->decay_mom_rate);
        return json_pack("{s:s,s:o}", "type", "OneCycle", "params", p);
    }
    case TRAIN_SCHED_WARMUP_COSINE_LR:
        return json_pack("{s:s,s:{s:f,s:I,s:I,s:f,s:s}}", "type", "WarmupCosineLR", "params", "warmup_min_ratio",
                         s->warmup_min_ratio, "warmup_num_steps", (json_int_t)s->warmup_num_steps, "total_num_steps",
                         (json_int_t)s->total_num_steps, "cos_min_ratio", s->cos_min_ratio, "warmup_type", wt);
    }
    return json_null();
}

/* ---------------------------------------------------------------- loading and printing */

json_t *train_config_load_file(const char *path, char *err, size_t n)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (je.line < 0) cfail(err, n, "%s: %s", path, je.text); /* cannot be read */
        else cfail(err, n, "%s: invalid JSON at line %d column %d: %s", path, je.line, je.column, je.text);
    }
    return root;
}

char *train_config_dumps(const json_t *cfg)
{
    const size_t base = JSON_INDENT(2) | JSON_SORT_KEYS;
    char *t = json_dumps(cfg, base | JSON_REAL_PRECISION(15));
    json_t *back = t ? json_loads(t, 0, NULL) : NULL;
    int exact = back && json_equal(back, (json_t *)cfg);
    json_decref(back);
    if (exact) return t;
    free(t); /* a number needs 16 or 17 digits: print every one with 17 */
    return json_dumps(cfg, base | JSON_REAL_PRECISION(17));
}

/* ---------------------------------------------------------------- default corpus */

int train_default_corpus(char *out, size_t n, char *note, size_t note_size)
{
    /* The newest /usr/lib/python3.N that holds os.py: the standard library
     * of the system interpreter, present on every Debian with python3. */
    int best = -1;
    DIR *d = opendir("/usr/lib");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            int minor;
            char tail;
            if (sscanf(e->d_name, "python3.%d%c", &minor, &tail) != 1) continue;
            char probe[300];
            struct stat st;
            snprintf(probe, sizeof probe, "/usr/lib/%s/os.py", e->d_name);
            if (stat(probe, &st) == 0 && minor > best) best = minor;
        }
        closedir(d);
    }
    if (best >= 0) {
        snprintf(out, n, "/usr/lib/python3.%d", best);
        snprintf(note, note_size, "default corpus: the Python standard library sources in %s (*.py)", out);
        return 0;
    }
    struct stat st;
    if (stat("/usr/share/common-licenses", &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(out, n, "/usr/share/common-licenses");
        snprintf(note, note_size,
                 "default corpus: no /usr/lib/python3.N with os.py here; falling back to the license texts "
                 "in /usr/share/common-licenses (set data.path to use your own text)");
        return 0;
    }
    snprintf(note, note_size,
             "data.path \"auto\": neither /usr/lib/python3.N nor /usr/share/common-licenses exists; set data.path");
    return -1;
}

/* ---------------------------------------------------------------- activation_checkpointing */

static int get_bool(json_t *obj, const char *prefix, const char *key, int *dst, char *err, size_t n)
{
    json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return cfail(err, n, "%s.%s: expected a boolean, got %s", prefix, key, type_name(v));
    *dst = json_is_true(v);
    return 0;
}

static void note(train_actckpt *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(train_actckpt *a, const char *fmt, ...)
{
    size_t used = strlen(a->notes);
    used += (size_t)snprintf(a->notes + used, sizeof a->notes - used, "warning: ");
    if (used >= sizeof a->notes) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->notes + used, sizeof a->notes - used, fmt, ap);
    va_end(ap);
}

/* DeepSpeed's keys: number_checkpoints, cpu_checkpointing (CUDA) and
 * partition_activations (model.tp > 1) are applied; the rest are accepted
 * with a note naming them when set, since they change nothing here. Needs
 * model.n_layer, model.tp and train.device parsed. */
static int parse_actckpt(train_config *c, json_t *root, char *err, size_t n)
{
    train_actckpt *a = &c->actckpt;
    const char *pf = "activation_checkpointing";
    json_t *s = json_object_get(root, pf);
    memset(a, 0, sizeof *a);
    if (!s || json_is_null(s)) return 0;
    if (!json_is_object(s)) return cfail(err, n, "%s: expected an object or null, got %s", pf, type_name(s));
    static const char *const keys[] = {"partition_activations", "cpu_checkpointing", "number_checkpoints",
                                       "contiguous_memory_optimization", "synchronize_checkpoint_boundary",
                                       "profile", NULL};
    if (check_keys(s, pf, keys, err, n) || get_bool(s, pf, "partition_activations", &a->partition_activations, err, n) ||
        get_bool(s, pf, "cpu_checkpointing", &a->cpu_checkpointing, err, n) ||
        get_bool(s, pf, "contiguous_memory_optimization", &a->contiguous_memory_optimization, err, n) ||
        get_bool(s, pf, "synchronize_checkpoint_boundary", &a->synchronize_checkpoint_boundary, err, n) ||
        get_bool(s, pf, "profile", &a->profile, err, n))
        return -1;
    a->enabled = 1;
    a->blocks = c->n_layer;
    json_t *num = json_object_get(s, "number_checkpoints");
    if (num && !json_is_null(num)) {
        if (get_int32(s, pf, "number_checkpoints", &a->blocks, 0, 1 << 20, err, n)) return -1;
        if (a->blocks > c->n_layer) a->blocks = c->n_layer;
        a->number_given = 1;
    }
    if (a->partition_activations && c->tp == 1)
        note(a, "%s.partition_activations: no effect with model.tp 1 (nothing to partition over)\n", pf);
    if (a->cpu_checkpointing && strcmp(c->device, "cuda") != 0)
        note(a, "%s.cpu_checkpointing: no effect on train.device \"%s\" (the activations are host memory already)\n",
             pf, c->device);
    if (a->contiguous_memory_optimization)
        note(a, "%s.contiguous_memory_optimization: no effect (the activation workspace is one allocation already)\n",
             pf);
    if (a->synchronize_checkpoint_boundary)
        note(a, "%s.synchronize_checkpoint_boundary: ignored (the model's calls are ordered already)\n", pf);
    if (a->profile) note(a, "%s.profile: not implemented, ignored\n", pf);
    return 0;
}

/* The section as the effective config prints it (null: off). New reference. */
static json_t *actckpt_json(const train_actckpt *a)
{
    if (!a->enabled) return json_null();
    return json_pack("{s:b,s:b,s:o,s:b,s:b,s:b}", "partition_activations", a->partition_activations,
                     "cpu_checkpointing", a->cpu_checkpointing, "number_checkpoints",
                     a->number_given ? json_integer(a->blocks) : json_null(), "contiguous_memory_optimization",
                     a->contiguous_memory_optimization, "synchronize_checkpoint_boundary",
                     a->synchronize_checkpoint_boundary, "profile", a->profile);
}

/* ---------------------------------------------------------------- param_groups */

static int parse_param_groups(train_config *c, json_t *v, char *err, size_t n)
{
    static const char pf[] = "param_groups";
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return cfail(err, n, "%s: expected an array of groups, got %s", pf, type_name(v));
    if (json_array_size(v) > TRAIN_MAX_GROUPS)
        return cfail(err, n, "%s: %zu groups, at most %d", pf, json_array_size(v), TRAIN_MAX_GROUPS);
    static const char *const keys[] = {"name", "params", "lr_scale", "weight_decay", "betas", "eps", NULL};
    size_t i;
    json_t *g;
    json_array_foreach(v, i, g) {
        char at[48];
        snprintf(at, sizeof at, "%s[%zu]", pf, i);
        if (!json_is_object(g)) return cfail(err, n, "%s: expected an object, got %s", at, type_name(g));
        if (check_keys(g, at, keys, err, n)) return -1;
        train_group *tg = &c->groups[c->n_groups++];
        tg->lr_scale = 1.0;
        tg->weight_decay = tg->beta1 = tg->beta2 = tg->eps = -1.0;
        json_t *name = json_object_get(g, "name");
        if (!json_is_string(name) || !json_string_length(name) || json_string_length(name) >= sizeof tg->name)
            return cfail(err, n, "%s.name: expected a string of 1..%zu bytes", at, sizeof tg->name - 1);
        snprintf(tg->name, sizeof tg->name, "%s", json_string_value(name));
        if (!strcmp(tg->name, "default"))
            return cfail(err, n, "%s.name: \"default\" is the engine's group of every other parameter "
                         "(optimizer.params); pick another name", at);
        for (int k = 0; k < c->n_groups - 1; k++)
            if (!strcmp(c->groups[k].name, tg->name)) return cfail(err, n, "%s.name: \"%s\" is used twice", at, tg->name);
        json_t *pats = json_object_get(g, "params");
        if (!json_is_array(pats) || !json_array_size(pats))
            return cfail(err, n, "%s.params: expected a non-empty array of name patterns (fnmatch globs)", at);
        tg->patterns = calloc(json_array_size(pats) + 1, sizeof *tg->patterns);
        if (!tg->patterns) return cfail(err, n, "%s: out of memory", at);
        for (size_t k = 0; k < json_array_size(pats); k++) {
            json_t *p = json_array_get(pats, k);
            if (!json_is_string(p)) return cfail(err, n, "%s.params[%zu]: expected a string, got %s", at, k, type_name(p));
            tg->patterns[k] = strdup(json_string_value(p));
        }
        if (get_num(g, at, "lr_scale", &tg->lr_scale, 0, 1e6, err, n) ||
            get_num(g, at, "weight_decay", &tg->weight_decay, 0, 1e6, err, n) ||
            get_num(g, at, "eps", &tg->eps, 0, 1, err, n))
            return -1;
        json_t *b = json_object_get(g, "betas");
        if (b) {
            if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_number(json_array_get(b, 0)) ||
                !json_is_number(json_array_get(b, 1)))
                return cfail(err, n, "%s.betas: expected two numbers in [0, 1)", at);
            tg->beta1 = json_number_value(json_array_get(b, 0));
            tg->beta2 = json_number_value(json_array_get(b, 1));
            if (!(tg->beta1 >= 0 && tg->beta1 < 1 && tg->beta2 >= 0 && tg->beta2 < 1))
                return cfail(err, n, "%s.betas: expected two numbers in [0, 1)", at);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- parse */

/* The top level: zero-train's and the engine's keys; DeepSpeed's other keys
 * as the engine judges them (common/ds_keys.c: accepted when they leave the
 * math alone - the engine's loader names them in its one warning - refused
 * by name when they would change it); anything else is unknown, with the
 * closest known key suggested. */
static int check_top_keys(const json_t *root, char *err, size_t n)
{
    static const char *const top_keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                           "gradient_accumulation_steps", "optimizer", "scheduler",
                                           "gradient_clipping", "bf16", "bfloat16", "fp16", "zero_optimization",
                                           "steps_per_print", "aio", "model", "data", "train",
                                           "activation_checkpointing", "param_groups", NULL};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        if (in_list(key, top_keys)) continue;
        const char *why = "";
        zero_ds_verdict d = zero_ds_key("", key, v, &why);
        if (d == ZERO_DS_ACCEPT) continue;
        if (d == ZERO_DS_REFUSE)
            return cfail(err, n, "%s: not implemented: %s (DeepSpeed's key, refused because it would change the "
                         "training math)", key, why);
        const char *names[128];
        int k = 0;
        for (const char *const *t = top_keys; *t; t++) names[k++] = *t;
        int ds = zero_ds_section_keys("", names + k, 127 - k);
        k += ds < 127 - k ? ds : 127 - k;
        names[k] = NULL;
        const char *close = zero_suggest_key(key, names);
        return cfail(err, n, "%s: unknown key%s%s%s (zero-train's and the engine's: train_batch_size, "
                     "train_micro_batch_size_per_gpu, gradient_accumulation_steps, optimizer, scheduler, "
                     "gradient_clipping, bf16, fp16, zero_optimization, steps_per_print, aio, model, data, train, "
                     "activation_checkpointing, param_groups; DeepSpeed's others: docs/zero-train.md)",
                     key, close ? "; did you mean '" : "", close ? close : "", close ? "'?" : "");
    }
    return 0;
}

static int parse_clean(train_config *c, json_t *root, int world, char *err, size_t n);

int train_config_parse(train_config *c, json_t *root, int world, char *err, size_t n)
{
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) return cfail(err, n, "config: the top level must be a JSON object");
    /* HF Trainer's "auto" values count as absent here (the engine's loader,
     * which sees the document as given, names them in its warning) */
    static const char *const own[] = {"model", "data", "train", "param_groups", NULL}; /* "auto" means more there */
    json_t *clean = json_deep_copy(root);
    if (!clean) return cfail(err, n, "config: out of memory");
    const char *key;
    json_t *v;
    void *tmp;
    char autos[8];
    json_object_foreach_safe(clean, tmp, key, v) {
        if (json_is_string(v) && !strcmp(json_string_value(v), "auto")) json_object_del(clean, key);
        else if (!in_list(key, own)) zero_ds_strip_auto(v, autos, sizeof autos);
    }
    int rc = parse_clean(c, clean, world, err, n);
    json_decref(clean);
    const json_t *window = json_object_get(json_object_get(root, "zero_optimization"), "stage3_prefetch_bucket_size");
    c->prefetch_auto = json_is_string(window) && !strcmp(json_string_value(window), "auto");
    if (rc == 0) {
        /* the engine gets the document as given but for zero-train's own
         * sections: its sections, and DeepSpeed's other keys to judge */
        c->engine_json = json_deep_copy(root);
        for (const char *const *k = own; *k; k++) json_object_del(c->engine_json, *k);
    }
    return rc;
}

static int parse_clean(train_config *c, json_t *root, int world, char *err, size_t n)
{
    if (check_top_keys(root, err, n)) return -1;

    /* defaults */
    c->n_layer = 4;
    c->n_head = 4;
    c->d_model = 128;
    c->seq_len = 64;
    c->vocab = 256;
    c->steps = 300;
    c->seed = 1234;
    c->log_every = 50;
    c->lr = 1e-3;
    c->device = strdup("cpu");
    c->comm_backend = strdup("auto");
    c->comm_timeout_s = TRAIN_DEFAULT_COMM_TIMEOUT_S;
    c->data_path = strdup("auto");
    c->data_suffixes_auto = 1;
    c->tp = c->pp = c->cp = 1;
    c->pp_schedule = strdup("1f1b");
    c->pp_virtual = 1;
    c->moe_top_k = 1;
    c->moe_ep = 1;
    c->moe_capacity_factor = 1.0;
    c->moe_aux_loss_coef = 0.01;

    /* ------------------------------------------------ model parallelism: the dp size comes first */
    {
        json_t *m0 = json_object_get(root, "model");
        if (json_is_object(m0) && (get_int32(m0, "model", "tp", &c->tp, 1, 1024, err, n) ||
                                   get_int32(m0, "model", "pp", &c->pp, 1, 1024, err, n) ||
                                   get_int32(m0, "model", "cp", &c->cp, 1, 1024, err, n) ||
                                   get_bool(m0, "model", "sequence_parallel", &c->sequence_parallel, err, n)))
            return -1;
        if (world % (c->tp * c->pp * c->cp))
            return cfail(err, n, "model.tp %d * model.cp %d * model.pp %d: the world size %d must equal dp * tp * cp * pp",
                         c->tp, c->cp, c->pp, world);
    }
    const int dp = world / (c->tp * c->pp * c->cp);
    c->dp = dp;

    /* ------------------------------------------------ batch sizes (DeepSpeed's rule)
     * Each given value is at most INT32_MAX and dp at most INT32_MAX, so
     * every product of two fits in 64 bits; the product of three is checked. */
    int64_t tbs = 0, mbs = 0, gas = 0;
    if (get_int(root, "", "train_batch_size", &tbs, 1, INT64_MAX, err, n) ||
        get_int(root, "", "train_micro_batch_size_per_gpu", &mbs, 1, INT32_MAX, err, n) ||
        get_int(root, "", "gradient_accumulation_steps", &gas, 1, INT32_MAX, err, n))
        return -1;
    if (tbs && mbs && gas) {
        int64_t prod;
        if (__builtin_mul_overflow(mbs * gas, (int64_t)dp, &prod) || tbs != prod)
            return cfail(err, n,
                         "train_batch_size: %lld != train_micro_batch_size_per_gpu %lld * "
                         "gradient_accumulation_steps %lld * data-parallel ranks %d",
                         (long long)tbs, (long long)mbs, (long long)gas, dp);
    } else if (tbs && mbs) {
        if (tbs % (mbs * dp))
            return cfail(err, n,
                         "train_batch_size: %lld is not divisible by train_micro_batch_size_per_gpu %lld * "
                         "data-parallel ranks %d",
                         (long long)tbs, (long long)mbs, dp);
        gas = tbs / (mbs * dp);
        if (gas > INT32_MAX)
            return cfail(err, n, "train_batch_size: %lld / (train_micro_batch_size_per_gpu %lld * %d ranks) = %lld "
                         "accumulation steps, more than %d", (long long)tbs, (long long)mbs, dp, (long long)gas,
                         INT32_MAX);
    } else if (tbs && gas) {
        if (tbs % (gas * dp))
            return cfail(err, n,
                         "train_batch_size: %lld is not divisible by gradient_accumulation_steps %lld * "
                         "data-parallel ranks %d",
                         (long long)tbs, (long long)gas, dp);
        mbs = tbs / (gas * dp);
        if (mbs > INT32_MAX)
            return cfail(err, n, "train_batch_size: %lld / (gradient_accumulation_steps %lld * %d ranks) = %lld "
                         "sequences per micro-batch, more than %d", (long long)tbs, (long long)gas, dp,
                         (long long)mbs, INT32_MAX);
    } else if (tbs) {
        if (tbs % dp)
            return cfail(err, n, "train_batch_size: %lld is not divisible by the %d data-parallel ranks",
                         (long long)tbs, dp);
        gas = 1;
        mbs = tbs / dp;
        if (mbs > INT32_MAX)
            return cfail(err, n, "train_batch_size: %lld / %d ranks = %lld sequences per micro-batch, more than %d",
                         (long long)tbs, dp, (long long)mbs, INT32_MAX);
    } else {
        if (!mbs) mbs = 8;
        if (!gas) gas = 1;
        if (__builtin_mul_overflow(mbs * gas, (int64_t)dp, &tbs))
            return cfail(err, n,
                         "train_batch_size: train_micro_batch_size_per_gpu %lld * gradient_accumulation_steps %lld "
                         "* %d data-parallel ranks overflows 64 bits",
                         (long long)mbs, (long long)gas, dp);
    }
    c->train_batch_size = tbs;
    c->micro_batch = (int)mbs;
    c->grad_accum = (int)gas;

    /* ------------------------------------------------ model */
    json_t *model, *data, *train, *opt, *sched = json_object_get(root, "scheduler"); /* an object or null */
    if (get_section(root, "model", &model, err, n) || get_section(root, "data", &data, err, n) ||
        get_section(root, "train", &train, err, n) ||
        get_section(root, "optimizer", &opt, err, n))
        return -1;
    if (model) {
        static const char *const keys[] = {"n_layer",     "n_head", "d_model", "seq_len", "vocab", "tp", "pp",
                                           "pp_schedule", "pp_virtual", "moe", "cp", "sequence_parallel", NULL};
        if (check_keys(model, "model", keys, err, n) ||
            get_int32(model, "model", "n_layer", &c->n_layer, 1, 1024, err, n) ||
            get_int32(model, "model", "n_head", &c->n_head, 1, 1024, err, n) ||
            get_int32(model, "model", "d_model", &c->d_model, 1, 1 << 16, err, n) ||
            get_int32(model, "model", "seq_len", &c->seq_len, 1, 1 << 20, err, n) ||
            get_int32(model, "model", "vocab", &c->vocab, 256, 1 << 20, err, n) ||
            get_str(model, "model", "pp_schedule", &c->pp_schedule, err, n) ||
            get_int32(model, "model", "pp_virtual", &c->pp_virtual, 1, 64, err, n))
            return -1;
        /* the name itself is checked where the schedule is built (train_parallel.c) */
        if (!c->pp_schedule) return cfail(err, n, "model.pp_schedule: expected a schedule name, got null");
        json_t *moe = json_object_get(model, "moe");
        if (moe && !json_is_object(moe))
            return cfail(err, n, "model.moe: expected an object, got %s", type_name(moe));
        static const char *const mkeys[] = {"experts", "top_k", "capacity_factor", "aux_loss_coef", "ep", NULL};
        if (moe && (check_keys(moe, "model.moe", mkeys, err, n) ||
                    get_int32(moe, "model.moe", "experts", &c->moe_experts, 0, 4096, err, n) ||
                    get_int32(moe, "model.moe", "top_k", &c->moe_top_k, 1, 4096, err, n) ||
                    get_num(moe, "model.moe", "capacity_factor", &c->moe_capacity_factor, 0, 1e6, err, n) ||
                    get_num(moe, "model.moe", "aux_loss_coef", &c->moe_aux_loss_coef, 0, 1e6, err, n) ||
                    get_int32(moe, "model.moe", "ep", &c->moe_ep, 1, 4096, err, n)))
            return -1;
    }
    if (c->moe_experts && c->moe_top_k > c->moe_experts)
        return cfail(err, n, "model.moe.top_k: %d is more than model.moe.experts %d", c->moe_top_k, c->moe_experts);
    if (c->moe_ep > 1 && (!c->moe_experts || c->moe_experts % c->moe_ep))
        return cfail(err, n, "model.moe.ep: %d must divide model.moe.experts %d (> 0)", c->moe_ep, c->moe_experts);
    if (c->moe_ep > 1 && dp % c->moe_ep)
        return cfail(err, n, "model.moe.ep: %d does not divide the %d data-parallel ranks", c->moe_ep, dp);
    if (c->moe_experts && (c->tp > 1 || c->cp > 1))
        return cfail(err, n, "model.moe: the MoE model does not run with model.tp / model.cp > 1 (its experts are not "
                             "split over tp, its router takes whole token rows): use model.moe.ep and model.pp");
    if (c->sequence_parallel && c->tp < 2)
        return cfail(err, n, "model.sequence_parallel: needs model.tp >= 2 (it splits the tp group's replicated "
                             "LayerNorm / residual regions along the sequence)");
    if (c->sequence_parallel && (c->micro_batch * (c->seq_len / c->cp)) % c->tp)
        return cfail(err, n, "model.sequence_parallel: model.tp %d does not divide the %d x %d rows of a micro-batch "
                             "(per cp rank)", c->tp, c->micro_batch, c->seq_len / c->cp);
    if (c->cp > 1 && (c->seq_len % c->cp || c->n_head % (c->tp * c->cp)))
        return cfail(err, n, "model.cp: %d must divide model.seq_len %d, and model.tp %d x model.cp must divide "
                             "model.n_head %d", c->cp, c->seq_len, c->tp, c->n_head);
    if (c->d_model % c->n_head)
        return cfail(err, n, "model.d_model: %d is not divisible by model.n_head %d", c->d_model, c->n_head);
    if (c->n_head % c->tp)
        return cfail(err, n, "model.tp: %d does not divide model.n_head %d", c->tp, c->n_head);
    if (c->n_layer < c->pp)
        return cfail(err, n, "model.pp: %d stages need model.n_layer >= %d (got %d)", c->pp, c->pp, c->n_layer);

    /* ------------------------------------------------ data */
    if (data) {
        static const char *const keys[] = {"path", "suffixes", "max_bytes", NULL};
        if (check_keys(data, "data", keys, err, n) || get_str(data, "data", "path", &c->data_path, err, n))
            return -1;
        if (!c->data_path) return cfail(err, n, "data.path: must be a string (\"auto\" for the default corpus)");
        int64_t mb = 0;
        if (get_int(data, "data", "max_bytes", &mb, 0, INT64_MAX, err, n)) return -1;
        c->data_max_bytes = (uint64_t)mb;
        json_t *sfx = json_object_get(data, "suffixes");
        if (sfx && json_is_string(sfx) && strcmp(json_string_value(sfx), "auto") == 0) {
            /* as --print-config writes the default: *.py for the default corpus, every file otherwise */
        } else if (sfx) {
            if (!json_is_array(sfx))
                return cfail(err, n, "data.suffixes: expected \"auto\" or an array of strings, got %s", type_name(sfx));
            size_t cnt = json_array_size(sfx);
            c->data_suffixes = calloc(cnt + 1, sizeof *c->data_suffixes);
            for (size_t i = 0; i < cnt; i++) {
                json_t *s = json_array_get(sfx, i);
                if (!json_is_string(s))
                    return cfail(err, n, "data.suffixes[%zu]: expected a string, got %s", i, type_name(s));
                c->data_suffixes[i] = strdup(json_string_value(s));
            }
            c->data_suffixes_auto = 0;
        }
    }

    /* ------------------------------------------------ train */
    if (train) {
        static const char *const keys[] = {"steps", "seed", "log_every", "checkpoint", "resume",
                                           "metrics_file", "device", "comm_backend", "comm_timeout_s",
                                           "check_collectives", NULL};
        int64_t seed = (int64_t)c->seed;
        if (check_keys(train, "train", keys, err, n) ||
            get_int(train, "train", "steps", &c->steps, 0, INT64_MAX / 4, err, n) ||
            get_int(train, "train", "seed", &seed, 0, INT64_MAX, err, n) ||
            get_int32(train, "train", "log_every", &c->log_every, 1, INT32_MAX, err, n) ||
            get_str(train, "train", "resume", &c->resume, err, n) ||
            get_str(train, "train", "metrics_file", &c->metrics_file, err, n) ||
            get_str(train, "train", "device", &c->device, err, n) ||
            get_str(train, "train", "comm_backend", &c->comm_backend, err, n) ||
            get_num(train, "train", "comm_timeout_s", &c->comm_timeout_s, 1e-3, 1e6, err, n) ||
            get_bool(train, "train", "check_collectives", &c->check_collectives, err, n))
            return -1;
        if (!c->comm_backend) c->comm_backend = strdup("auto");
        if (strcmp(c->comm_backend, "auto") != 0 && strcmp(c->comm_backend, "nccl") != 0 &&
            strcmp(c->comm_backend, "staged") != 0)
            return cfail(err, n, "train.comm_backend: \"%s\" is not \"auto\", \"nccl\" or \"staged\"",
                         c->comm_backend);
        c->seed = (uint64_t)seed;
        if (!c->device) c->device = strdup("cpu");
        if (strcmp(c->device, "cpu") != 0 && strcmp(c->device, "cuda") != 0)
            return cfail(err, n, "train.device: \"%s\" is neither \"cpu\" nor \"cuda\"", c->device);
        json_t *ck = json_object_get(train, "checkpoint");
        if (ck && !json_is_null(ck)) {
            if (!json_is_object(ck))
                return cfail(err, n, "train.checkpoint: expected an object, got %s", type_name(ck));
            static const char *const ckeys[] = {"dir", "every", "keep_last", NULL};
            if (check_keys(ck, "train.checkpoint", ckeys, err, n) ||
                get_str(ck, "train.checkpoint", "dir", &c->ckpt_dir, err, n) ||
                get_int(ck, "train.checkpoint", "every", &c->ckpt_every, 0, INT64_MAX / 4, err, n) ||
                get_int32(ck, "train.checkpoint", "keep_last", &c->ckpt_keep, 0, 1 << 20, err, n))
                return -1;
        }
    }
    {
        /* the loader counts samples and tokens in 64 bits */
        int64_t samples, toks;
        if (__builtin_mul_overflow(c->steps, c->train_batch_size, &samples) ||
            __builtin_mul_overflow(samples, (int64_t)c->seq_len, &toks))
            return cfail(err, n, "train.steps: %lld steps * train_batch_size %lld * model.seq_len %d tokens overflow "
                         "64 bits", (long long)c->steps, (long long)c->train_batch_size, c->seq_len);
    }
    /* --device cuda runs pipelines (MoE blocks included) and tensor parallelism (the CUDA stage,
     * docs/pipeline.md; the CUDA GPT's tp blocks, gpt_cuda_workspace_create_tp); context and sequence
     * parallelism are the CPU stage's only */
    if (strcmp(c->device, "cpu") != 0 && c->cp > 1)
        return cfail(err, n, "train.device: \"%s\": model.cp > 1 runs on the CPU only (the CUDA GPT has no "
                     "context-parallel attention; model.tp and model.pp > 1 run on CUDA)", c->device);
    if (strcmp(c->device, "cpu") != 0 && c->sequence_parallel)
        return cfail(err, n, "train.device: \"%s\": model.sequence_parallel runs on the CPU only (the CUDA tp "
                     "blocks keep the residual stream whole; model.tp > 1 without it runs on CUDA)", c->device);
    if (parse_actckpt(c, root, err, n)) return -1;
    json_t *spp = json_object_get(root, "steps_per_print");
    if (spp) {
        if (train && json_object_get(train, "log_every"))
            return cfail(err, n, "steps_per_print: give either steps_per_print or train.log_every, not both");
        if (get_int32(root, "", "steps_per_print", &c->log_every, 1, INT32_MAX, err, n)) return -1;
    }

    /* ------------------------------------------------ optimizer lr (the engine checks the rest) */
    if (opt) {
        json_t *p = json_object_get(opt, "params");
        if (p && json_is_object(p) && json_object_get(p, "lr") &&
            get_num(p, "optimizer.params", "lr", &c->lr, 0, 1e3, err, n))
            return -1;
    }
    if (parse_scheduler(c, sched, err, n)) return -1;
    if (parse_param_groups(c, json_object_get(root, "param_groups"), err, n)) return -1;

    /* ------------------------------------------------ effective config */
    json_t *e = json_deep_copy(root);
    json_object_del(e, "steps_per_print");
    json_object_del(e, "bfloat16"); /* the engine's effective section is written as bf16 */
    json_object_set_new(e, "train_micro_batch_size_per_gpu", json_integer(c->micro_batch));
    json_object_set_new(e, "gradient_accumulation_steps", json_integer(c->grad_accum));
    json_t *moe = json_pack("{s:i,s:i,s:f,s:f,s:i}", "experts", c->moe_experts, "top_k", c->moe_top_k,
                            "capacity_factor", c->moe_capacity_factor, "aux_loss_coef", c->moe_aux_loss_coef, "ep",
                            c->moe_ep);
    json_object_set_new(e, "model", json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:i,s:o,s:i,s:b}", "n_layer", c->n_layer, "n_head",
                                              c->n_head, "d_model", c->d_model, "seq_len", c->seq_len, "vocab",
                                              c->vocab, "tp", c->tp, "pp", c->pp, "pp_schedule", c->pp_schedule, "pp_virtual", c->pp_virtual, "moe", moe,
                                              "cp", c->cp, "sequence_parallel", c->sequence_parallel));
    json_t *sfx = json_array();
    if (c->data_suffixes)
        for (char **s = c->data_suffixes; *s; s++) json_array_append_new(sfx, json_string(*s));
    json_object_set_new(e, "data", json_pack("{s:s,s:o,s:I}", "path", c->data_path, "suffixes",
                                             c->data_suffixes_auto ? json_string("auto") : sfx, "max_bytes",
                                             (json_int_t)c->data_max_bytes));
    if (c->data_suffixes_auto) json_decref(sfx);
    json_t *ck = json_pack("{s:o,s:I,s:i}", "dir", c->ckpt_dir ? json_string(c->ckpt_dir) : json_null(), "every",
                           (json_int_t)c->ckpt_every, "keep_last", c->ckpt_keep);
    json_object_set_new(e, "train",
                        json_pack("{s:I,s:I,s:i,s:o,s:o,s:o,s:s,s:s,s:f,s:b}", "steps", (json_int_t)c->steps, "seed",
                                  (json_int_t)c->seed, "log_every", c->log_every, "checkpoint", ck, "resume",
                                  c->resume ? json_string(c->resume) : json_null(), "metrics_file",
                                  c->metrics_file ? json_string(c->metrics_file) : json_null(), "device",
                                  c->device, "comm_backend", c->comm_backend, "comm_timeout_s", c->comm_timeout_s,
                                  "check_collectives", c->check_collectives));
    json_object_set_new(e, "train_batch_size", json_integer((json_int_t)c->train_batch_size));
    json_object_set_new(e, "scheduler", train_sched_json(&c->sched));
    json_object_set_new(e, "activation_checkpointing", actckpt_json(&c->actckpt));
    if (!json_object_get(e, "param_groups") || json_is_null(json_object_get(e, "param_groups")))
        json_object_set_new(e, "param_groups", json_array()); /* none: every parameter in "default" */
    c->effective = e;
    return 0;
}

void train_config_free(train_config *c)
{
    free(c->data_path);
    free(c->pp_schedule);
    if (c->data_suffixes)
        for (char **s = c->data_suffixes; *s; s++) free(*s);
    free(c->data_suffixes);
    free(c->ckpt_dir);
    free(c->resume);
    free(c->metrics_file);
    free(c->device);
    free(c->comm_backend);
    for (int g = 0; g < c->n_groups; g++) {
        if (c->groups[g].patterns)
            for (char **p = c->groups[g].patterns; *p; p++) free(*p);
        free(c->groups[g].patterns);
    }
    json_decref(c->engine_json);
    json_decref(c->effective);
    memset(c, 0, sizeof *c);
}
