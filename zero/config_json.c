/* zero_config_from_json: the engine sections of a DeepSpeed-style JSON
 * document. Strict inside those sections (unknown keys and wrong types are
 * errors naming the key path), silent about every other top-level key. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/ds_keys.h"
#include "common/suggest.h"
#include "engine_internal.h"

typedef struct jctx {
    char path[128]; /* "zero_optimization" */
} jctx;

static zero_status bad_value(const char *section, const char *key, const char *expected, const json_t *v)
{
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    zero_status st = zero_fail(NULL, ZERO_CONFIG, "%s%s%s: expected %s, got %s", section, key ? "." : "",
                               key ? key : "", expected, text ? text : "?");
    free(text);
    return st;
}

/* An integer: a JSON integer, or a real with an integral value (DeepSpeed
 * configs often write sizes as 5e8). */
static int as_integer(const json_t *v, double *out)
{
    if (json_is_integer(v)) {
        *out = (double)json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (isfinite(d) && d == floor(d)) {
            *out = d;
            return 1;
        }
    }
    return 0;
}

static zero_status get_int(const char *sec, const char *key, const json_t *v, long long lo, long long hi, int *dst)
{
    double d;
    char expected[96];
    snprintf(expected, sizeof expected, "an integer %lld..%lld", lo, hi);
    if (!as_integer(v, &d) || d < (double)lo || d > (double)hi) return bad_value(sec, key, expected, v);
    *dst = (int)d;
    return ZERO_OK;
}

/* A count in [lo, hi] (hi < 2^63, so it prints back as a JSON integer). */
static zero_status get_u64_in(const char *sec, const char *key, const json_t *v, uint64_t lo, uint64_t hi,
                              const char *unit, uint64_t *dst)
{
    double d;
    char expected[128];
    snprintf(expected, sizeof expected, "an integer %llu..%llu (%s)", (unsigned long long)lo, (unsigned long long)hi,
             unit);
    if (json_is_integer(v)) { /* exact: a double cannot hold every 64-bit integer */
        json_int_t x = json_integer_value(v);
        if (x < 0 || (uint64_t)x < lo || (uint64_t)x > hi) return bad_value(sec, key, expected, v);
        *dst = (uint64_t)x;
        return ZERO_OK;
    }
    if (!as_integer(v, &d) || d < (double)lo || d > (double)hi || d >= 0x1p63) return bad_value(sec, key, expected, v);
    *dst = (uint64_t)d;
    return ZERO_OK;
}

static zero_status get_u64(const char *sec, const char *key, const json_t *v, uint64_t lo, uint64_t *dst)
{
    return get_u64_in(sec, key, v, lo, (uint64_t)INT64_MAX, "elements", dst);
}

static zero_status get_num(const char *sec, const char *key, const json_t *v, double lo, double hi, int hi_open,
                           double *dst)
{
    char expected[96];
    snprintf(expected, sizeof expected, "a number in [%g, %g%s", lo, hi, hi_open ? ")" : "]");
    if (!json_is_number(v)) return bad_value(sec, key, expected, v);
    double d = json_number_value(v);
    if (!(d >= lo) || (hi_open ? !(d < hi) : !(d <= hi))) return bad_value(sec, key, expected, v);
    *dst = d;
    return ZERO_OK;
}

static zero_status get_bool(const char *sec, const char *key, const json_t *v, int *dst)
{
    if (!json_is_boolean(v)) return bad_value(sec, key, "true or false", v);
    *dst = json_is_true(v);
    return ZERO_OK;
}

/* DeepSpeed keys accepted during this parse (they change nothing here),
 * named in the one warning zero_config_from_json logs. */
static _Thread_local char accepted[1024];

static void note_accepted(const char *sec, const char *key)
{
    size_t used = strlen(accepted);
    if (used + strlen(sec) + strlen(key) + 8 < sizeof accepted)
        snprintf(accepted + used, sizeof accepted - used, "%s%s%s%s", used ? ", " : "", sec, *sec ? "." : "", key);
    else if (used + 4 < sizeof accepted && (used < 3 || strcmp(accepted + used - 3, "...")))
        snprintf(accepted + used, sizeof accepted - used, "...");
}

/* A key this parser does not implement in `sec` (`known`: the ones it
 * does, ", "-separated): DeepSpeed's and neutral as given -> accepted and
 * noted; DeepSpeed's and math-changing -> refused by name; anything else
 * -> unknown, with the closest known key suggested. */
static zero_status unknown_key(const char *sec, const char *key, const json_t *v, const char *known)
{
    const char *why = NULL;
    switch (zero_ds_key(sec, key, v, &why)) {
    case ZERO_DS_ACCEPT: note_accepted(sec, key); return ZERO_OK;
    case ZERO_DS_REFUSE:
        return zero_fail(NULL, ZERO_CONFIG, "%s.%s: not implemented: %s (DeepSpeed's key, refused because it "
                         "would change the training math)", sec, key, why);
    default: break;
    }
    char buf[1024];
    const char *names[96];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", known);
    for (char *t = strtok(buf, ", "); t && n < 48; t = strtok(NULL, ", ")) names[n++] = t;
    const int room = 95 - n, k = zero_ds_section_keys(sec, names + n, room);
    n += k < room ? k : room;
    names[n] = NULL;
    const char *close = zero_suggest_key(key, names);
    char hint[160] = "";
    if (close) snprintf(hint, sizeof hint, "; did you mean '%s'?", close);
    return zero_fail(NULL, ZERO_CONFIG, "%s.%s: unknown key%s (known here: %s)", sec, key, hint, known);
}

/* ---------------------------------------------------------------- sections */

/* The keys both offload sections share: device, nvme_path, pin_memory.
 * Returns 1 (with *st set) if key is one of them, 0 otherwise. */
static int offload_common_key(const char *sec, const char *key, const json_t *v, zero_offload_device *device,
                              char *path, size_t path_size, int *pin, zero_status *st)
{
    if (!strcmp(key, "device")) {
        const char *d = json_is_string(v) ? json_string_value(v) : NULL;
        if (d && !strcasecmp(d, "none")) *device = ZERO_OFFLOAD_NONE;
        else if (d && !strcasecmp(d, "cpu")) *device = ZERO_OFFLOAD_CPU;
        else if (d && !strcasecmp(d, "nvme")) *device = ZERO_OFFLOAD_NVME;
        else *st = bad_value(sec, key, "\"none\", \"cpu\" or \"nvme\"", v);
    } else if (!strcmp(key, "nvme_path")) {
        if (json_is_null(v)) path[0] = '\0';
        else if (!json_is_string(v) || json_string_length(v) >= path_size)
            *st = bad_value(sec, key, "a directory path (a string of at most 255 bytes)", v);
        else memcpy(path, json_string_value(v), json_string_length(v) + 1);
    } else if (!strcmp(key, "pin_memory")) {
        *st = get_bool(sec, key, v, pin);
    } else {
        return 0;
    }
    return 1;
}

/* zero_optimization.offload_optimizer {device, nvme_path, pin_memory,
 * buffer_count, fast_init}; DeepSpeed's partial offload `ratio` is not supported. */
static zero_status parse_offload_optimizer(const json_t *obj, zero_config *c)
{
    static const char sec[] = "zero_optimization.offload_optimizer";
    static const char known[] = "device, nvme_path, pin_memory, buffer_count, fast_init";
    if (!json_is_object(obj)) return bad_value(sec, NULL, "an object", obj);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        zero_status st = ZERO_OK;
        int flag = 0;
        if (offload_common_key(sec, key, v, &c->offload_optimizer_device, c->offload_nvme_path,
                               sizeof c->offload_nvme_path, &c->offload_pin_memory, &st)) {
            /* device, nvme_path or pin_memory: parsed */
        } else if (!strcmp(key, "buffer_count")) st = get_int(sec, key, v, 3, 1 << 20, &c->offload_buffer_count);
        else if (!strcmp(key, "fast_init")) st = get_bool(sec, key, v, &flag); /* accepted; no effect */
        else st = unknown_key(sec, key, v, known);
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

/* zero_optimization.offload_param {device, nvme_path, pin_memory,
 * buffer_count, buffer_size, max_in_cpu}: the stage-3 parameter shard. */
static zero_status parse_offload_param(const json_t *obj, zero_config *c)
{
    static const char sec[] = "zero_optimization.offload_param";
    static const char known[] = "device, nvme_path, pin_memory, buffer_count, buffer_size, max_in_cpu";
    if (!json_is_object(obj)) return bad_value(sec, NULL, "an object", obj);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        zero_status st = ZERO_OK;
        if (offload_common_key(sec, key, v, &c->offload_param_device, c->offload_param_nvme_path,
                               sizeof c->offload_param_nvme_path, &c->offload_param_pin_memory, &st)) {
            /* device, nvme_path or pin_memory: parsed */
        } else if (!strcmp(key, "buffer_count")) st = get_int(sec, key, v, 2, 1 << 20, &c->offload_param_buffer_count);
        else if (!strcmp(key, "buffer_size")) st = get_u64(sec, key, v, 1, &c->offload_param_buffer_size);
        else if (!strcmp(key, "max_in_cpu")) st = get_u64(sec, key, v, 0, &c->offload_param_max_in_cpu);
        else st = unknown_key(sec, key, v, known);
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

static zero_status parse_zero_optimization(const json_t *obj, zero_config *c)
{
    static const char sec[] = "zero_optimization";
    static const char known[] =
        "stage, reduce_bucket_size, allgather_bucket_size, overlap_comm, local_accumulation, contiguous_gradients, "
        "stage3_prefetch_bucket_size, stage3_max_live_parameters, stage3_param_persistence_threshold, "
        "allgather_partitions, reduce_scatter, stage3_max_reuse_distance, "
        "stage3_gather_16bit_weights_on_model_save, round_robin_gradients, offload_optimizer, offload_param, sub_group_size";
    if (!json_is_object(obj)) return bad_value(sec, NULL, "an object", obj);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        zero_status st = ZERO_OK;
        int flag = 0;
        uint64_t ignored = 0;
        if (!strcmp(key, "stage")) st = get_int(sec, key, v, 0, 3, &c->stage);
        else if (!strcmp(key, "reduce_bucket_size")) st = get_u64(sec, key, v, 1, &c->reduce_bucket_size);
        else if (!strcmp(key, "allgather_bucket_size")) st = get_u64(sec, key, v, 1, &c->allgather_bucket_size);
        else if (!strcmp(key, "overlap_comm")) st = get_bool(sec, key, v, &c->overlap_comm);
        else if (!strcmp(key, "local_accumulation")) st = get_bool(sec, key, v, &c->local_accumulation);
        else if (!strcmp(key, "contiguous_gradients")) st = get_bool(sec, key, v, &c->contiguous_gradients);
        else if (!strcmp(key, "stage3_prefetch_bucket_size"))
            st = get_u64(sec, key, v, 0, &c->stage3_prefetch_bucket_size);
        else if (!strcmp(key, "stage3_max_live_parameters"))
            st = get_u64(sec, key, v, 0, &c->stage3_max_live_parameters);
        else if (!strcmp(key, "stage3_param_persistence_threshold"))
            st = get_u64(sec, key, v, 0, &c->stage3_param_persistence_threshold);
        else if (!strcmp(key, "allgather_partitions") || !strcmp(key, "reduce_scatter")) {
            /* Accepted for DeepSpeed compatibility; this engine always does both. */
            st = get_bool(sec, key, v, &flag);
            if (st == ZERO_OK && !flag)
                st = zero_fail(NULL, ZERO_CONFIG, "%s.%s: false is not supported (this engine always %s)", sec, key,
                               key[0] == 'a' ? "all-gathers partitions" : "reduce-scatters gradients");
        } else if (!strcmp(key, "stage3_max_reuse_distance")) {
            st = get_u64(sec, key, v, 0, &ignored); /* accepted: release() decides when memory is freed */
        } else if (!strcmp(key, "stage3_gather_16bit_weights_on_model_save") ||
                   !strcmp(key, "round_robin_gradients")) {
            st = get_bool(sec, key, v, &flag); /* accepted; no effect on the engine */
        } else if (!strcmp(key, "offload_optimizer")) {
            st = parse_offload_optimizer(v, c);
        } else if (!strcmp(key, "offload_param")) {
            st = parse_offload_param(v, c);
        } else if (!strcmp(key, "sub_group_size")) {
            st = get_u64(sec, key, v, 1, &c->sub_group_size);
        } else {
            st = unknown_key(sec, key, v, known);
        }
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

static zero_status parse_aio(const json_t *obj, zero_config *c)
{
    static const char sec[] = "aio";
    static const char known[] = "block_size, queue_depth, single_submit, overlap_events, thread_count";
    if (!json_is_object(obj)) return bad_value(sec, NULL, "an object", obj);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        zero_status st = ZERO_OK;
        int flag = 0;
        if (!strcmp(key, "block_size")) {
            /* the NVMe store's range: whole 4 KiB pages, at most 1 GiB per I/O */
            st = get_u64_in(sec, key, v, 4096, ZERO_AIO_BLOCK_SIZE_MAX, "bytes", &c->aio_block_size);
            if (st == ZERO_OK && c->aio_block_size % 4096) st = bad_value(sec, key, "a multiple of 4096 (bytes)", v);
        } else if (!strcmp(key, "queue_depth")) st = get_int(sec, key, v, 1, 128, &c->aio_queue_depth);
        else if (!strcmp(key, "single_submit") || !strcmp(key, "overlap_events"))
            st = get_bool(sec, key, v, &flag); /* accepted: the store's completion thread always overlaps */
        else if (!strcmp(key, "thread_count")) st = get_int(sec, key, v, 1, 1 << 10, &flag); /* accepted */
        else st = unknown_key(sec, key, v, known);
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

static zero_status parse_betas(const json_t *v, zero_config *c)
{
    static const char sec[] = "optimizer.params";
    if (!json_is_array(v) || json_array_size(v) != 2) return bad_value(sec, "betas", "an array of two numbers in [0, 1)", v);
    double b[2];
    for (int i = 0; i < 2; i++) {
        const json_t *x = json_array_get(v, (size_t)i);
        if (!json_is_number(x) || !(json_number_value(x) >= 0) || !(json_number_value(x) < 1))
            return bad_value(sec, "betas", "an array of two numbers in [0, 1)", v);
        b[i] = json_number_value(x);
    }
    c->beta1 = b[0];
    c->beta2 = b[1];
    return ZERO_OK;
}

static zero_status parse_optimizer(const json_t *obj, zero_config *c)
{
    static const char sec[] = "optimizer";
    if (!json_is_object(obj)) return bad_value(sec, NULL, "an object", obj);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        if (strcmp(key, "type") && strcmp(key, "params")) {
            zero_status st = unknown_key(sec, key, v, "type, params");
            if (st != ZERO_OK) return st;
        }
    }
    const json_t *type = json_object_get(obj, "type");
    if (!type) return zero_fail(NULL, ZERO_CONFIG, "optimizer.type: missing (AdamW, Adam or SGD)");
    if (!json_is_string(type)) return bad_value(sec, "type", "a string (AdamW, Adam or SGD)", type);
    const char *t = json_string_value(type);
    int adam = 0;
    if (!strcasecmp(t, "adamw")) adam = 1;
    else if (!strcasecmp(t, "adam")) adam = 2; /* DeepSpeed's Adam: adam_w_mode defaults to true */
    else if (!strcasecmp(t, "sgd")) adam = 0;
    else return bad_value(sec, "type", "AdamW, Adam or SGD", type);
    c->optimizer = adam ? ZERO_OPTIM_ADAMW : ZERO_OPTIM_SGD;

    const json_t *params = json_object_get(obj, "params");
    if (!params) return ZERO_OK;
    static const char psec[] = "optimizer.params";
    if (!json_is_object(params)) return bad_value(psec, NULL, "an object", params);
    json_object_foreach((json_t *)params, key, v) {
        zero_status st = ZERO_OK;
        int flag = 0;
        if (!strcmp(key, "lr")) st = get_num(psec, key, v, 0, INFINITY, 1, &c->lr);
        else if (!strcmp(key, "weight_decay")) st = get_num(psec, key, v, 0, INFINITY, 1, &c->weight_decay);
        else if (adam && !strcmp(key, "betas")) st = parse_betas(v, c);
        else if (adam && !strcmp(key, "eps")) st = get_num(psec, key, v, 0, INFINITY, 1, &c->eps);
        else if (adam && !strcmp(key, "fast")) st = get_bool(psec, key, v, &c->optimizer_fast);
        else if (adam == 2 && !strcmp(key, "adam_w_mode")) {
            st = get_bool(psec, key, v, &flag);
            if (st == ZERO_OK && !flag)
                st = zero_fail(NULL, ZERO_CONFIG,
                               "optimizer.params.adam_w_mode: false (L2-coupled Adam) is not supported; use AdamW");
        } else if (!adam && !strcmp(key, "momentum")) st = get_num(psec, key, v, 0, INFINITY, 1, &c->momentum);
        else if (!adam && !strcmp(key, "dampening")) st = get_num(psec, key, v, 0, 1, 0, &c->dampening);
        else if (!adam && !strcmp(key, "nesterov")) st = get_bool(psec, key, v, &c->nesterov);
        else st = unknown_key(psec, key, v,
                              adam == 2 ? "lr, betas, eps, weight_decay, adam_w_mode, fast"
                                        : adam ? "lr, betas, eps, weight_decay, fast"
                                               : "lr, momentum, dampening, weight_decay, nesterov");
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

static zero_status parse_precision(const json_t *obj, const char *sec, zero_config *c, int *enabled)
{
    const int fp16 = sec[1] == 'p';
    static const char known16[] = "enabled, loss_scale, initial_scale_power, loss_scale_window, hysteresis, "
                                  "min_loss_scale";
    if (!json_is_object(obj)) return bad_value(sec, NULL, "an object", obj);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        zero_status st = ZERO_OK;
        if (!strcmp(key, "enabled")) st = get_bool(sec, key, v, enabled);
        else if (fp16 && !strcmp(key, "loss_scale")) st = get_num(sec, key, v, 0, INFINITY, 1, &c->loss_scale);
        else if (fp16 && !strcmp(key, "initial_scale_power")) st = get_int(sec, key, v, 0, 62, &c->initial_scale_power);
        else if (fp16 && !strcmp(key, "loss_scale_window")) st = get_int(sec, key, v, 1, 1LL << 30, &c->loss_scale_window);
        else if (fp16 && !strcmp(key, "hysteresis")) st = get_int(sec, key, v, 1, 1LL << 30, &c->hysteresis);
        else if (fp16 && !strcmp(key, "min_loss_scale")) {
            st = get_num(sec, key, v, 0, INFINITY, 1, &c->min_loss_scale);
            if (st == ZERO_OK && !(c->min_loss_scale > 0)) st = bad_value(sec, key, "a number > 0", v);
        } else st = unknown_key(sec, key, v, fp16 ? known16 : "enabled");
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

zero_status zero_config_from_json(zero_config *config, const char *json_text)
{
    if (!config || !json_text) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_config_from_json: NULL argument");
    zero_config c; /* the caller's version made whole; written back to its version's fields */
    ZERO_TRY(config_read(config, &c, ZERO_INVALID_ARGUMENT, "zero_config_from_json", NULL));
    json_error_t jerr;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zero_fail(NULL, ZERO_CONFIG, "config JSON: line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
    zero_status st = ZERO_OK;
    if (!json_is_object(root)) st = bad_value("(document)", NULL, "a JSON object", root);
    const json_t *v;
    int bf16 = -1, fp16 = -1;
    /* HF Trainer's "auto" values: the trainer fills them in; here the key
     * counts as absent (libzero's default), and the warning says so */
    char autos[1024] = "";
    if (st == ZERO_OK) zero_ds_strip_auto(root, autos, sizeof autos);
    accepted[0] = '\0';
    /* DeepSpeed's top-level keys libzero does not implement: accepted when
     * they leave the math alone, refused by name otherwise; other top-level
     * keys belong to the caller */
    if (st == ZERO_OK) {
        const char *key;
        json_t *tv;
        json_object_foreach(root, key, tv) {
            const char *why = NULL;
            zero_ds_verdict d = zero_ds_key("", key, tv, &why);
            if (d == ZERO_DS_ACCEPT) note_accepted("", key);
            else if (d == ZERO_DS_REFUSE) {
                st = zero_fail(NULL, ZERO_CONFIG, "%s: not implemented: %s (DeepSpeed's key, refused because it "
                               "would change the training math)", key, why);
                break;
            }
        }
    }
    /* "bfloat16" is DeepSpeed's older name of the bf16 section */
    if (st == ZERO_OK && json_object_get(root, "bfloat16")) {
        if (json_object_get(root, "bf16"))
            st = zero_fail(NULL, ZERO_CONFIG, "bfloat16: given together with bf16 (its newer name); keep one");
        else
            json_object_set(root, "bf16", json_object_get(root, "bfloat16"));
    }
    if (st == ZERO_OK && (v = json_object_get(root, "zero_optimization"))) st = parse_zero_optimization(v, &c);
    if (st == ZERO_OK && (v = json_object_get(root, "optimizer"))) st = parse_optimizer(v, &c);
    if (st == ZERO_OK && (v = json_object_get(root, "aio"))) st = parse_aio(v, &c);
    if (st == ZERO_OK && (v = json_object_get(root, "gradient_clipping")))
        st = get_num("gradient_clipping", NULL, v, 0, INFINITY, 1, &c.gradient_clipping);
    if (st == ZERO_OK && (v = json_object_get(root, "gradient_accumulation_steps")))
        st = get_int("gradient_accumulation_steps", NULL, v, 1, 1 << 30, &c.gradient_accumulation_steps);
    if (st == ZERO_OK && (v = json_object_get(root, "bf16"))) st = parse_precision(v, "bf16", &c, &bf16);
    if (st == ZERO_OK && (v = json_object_get(root, "fp16"))) st = parse_precision(v, "fp16", &c, &fp16);
    if (st == ZERO_OK && bf16 == 1 && fp16 == 1)
        st = zero_fail(NULL, ZERO_CONFIG, "bf16.enabled and fp16.enabled are both true; pick one");
    if (st == ZERO_OK) {
        if (bf16 == 1) c.compute_dtype = ZERO_BF16;
        else if (fp16 == 1) c.compute_dtype = ZERO_F16;
        else if ((bf16 == 0 && c.compute_dtype == ZERO_BF16) || (fp16 == 0 && c.compute_dtype == ZERO_F16))
            c.compute_dtype = ZERO_F32;
    }
    json_decref(root);
    if (st == ZERO_OK) {
        zero_errbuf eb;
        st = config_validate(&c, &eb);
    }
    if (st == ZERO_OK) st = config_write_back(&c, config, ZERO_CONFIG, "zero_config_from_json", NULL);
    if (st == ZERO_OK && (accepted[0] || autos[0]))
        zero_log(ZERO_LOG_WARN, "config: %s%s%s%s%s", accepted[0] ? "accepted DeepSpeed keys that change nothing "
                                                                  "libzero computes: " : "",
                 accepted, accepted[0] && autos[0] ? "; " : "",
                 autos[0] ? "\"auto\" values (a trainer's to fill in) left to libzero's defaults: " : "", autos);
    return st;
}
