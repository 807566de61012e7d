/* DeepSpeed configs run unchanged (issue 11): real-world config shapes
 * (HF Trainer's ds_config_zero2.json / zero3.json with their "auto" values,
 * DeepSpeedExamples-style GPT configs; tests/train/ds_configs/) pass
 * zero-train's parser and the engine's loader, with exactly ONE warning
 * that names every key accepted without effect and every "auto" left to the
 * default; keys that would change the math are refused by name; unknown
 * keys are refused with the closest known key suggested.
 *   test_ds_configs DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/zero.h>

#include "check.h"
#include "train_config.h"

static int n_warnings;
static char last_warning[4096];

static void on_log(zero_log_level level, const char *msg, void *user)
{
    (void)user;
    if (level > ZERO_LOG_WARN) return;
    n_warnings++;
    snprintf(last_warning, sizeof last_warning, "%s", msg);
}

/* zero-train's parse (2 dp ranks), then the engine's loader on what
 * zero-train hands it, as train_main.c does. Returns 0, or -1 with err. */
static int load_both(json_t *root, zero_config *zc, char *err, size_t n)
{
    train_config c;
    n_warnings = 0;
    last_warning[0] = '\0';
    if (train_config_parse(&c, root, 2, err, n) != 0) {
        train_config_free(&c);
        return -1;
    }
    *zc = (zero_config)ZERO_CONFIG_INIT;
    char *text = json_dumps(c.engine_json, JSON_COMPACT);
    zero_status s = zero_config_from_json(zc, text);
    free(text);
    train_config_free(&c);
    if (s != ZERO_OK) {
        snprintf(err, n, "%s", zero_last_error());
        return -1;
    }
    return 0;
}

static json_t *load_file(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    CHECK_MSG(root != NULL, "%s: %s", path, je.text);
    return root;
}

static void expect_one_warning(const char *what, const char *const *names)
{
    CHECK_MSG(n_warnings == 1, "%s: %d warnings, expected exactly 1 (last: %s)", what, n_warnings, last_warning);
    for (; *names; names++)
        CHECK_MSG(strstr(last_warning, *names), "%s: the warning does not name %s: %s", what, *names, last_warning);
}

static void expect_refused(const char *text, const char *needle)
{
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    CHECK_MSG(root != NULL, "bad test json %s", text);
    zero_config zc;
    char err[1024] = "";
    int rc = load_both(root, &zc, err, sizeof err);
    CHECK_MSG(rc == -1 && strstr(err, needle), "%s: rc %d, message \"%s\", wanted \"%s\"", text, rc, err, needle);
    json_decref(root);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_ds_configs DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    zero_set_log_handler(on_log, ZERO_LOG_WARN, NULL);
    char err[1024] = "";
    zero_config zc;

    /* HF Trainer, ZeRO-2 with CPU optimizer offload and "auto" everywhere */
    json_t *root = load_file(dir, "hf_ds_config_zero2.json");
    CHECK_MSG(load_both(root, &zc, err, sizeof err) == 0, "hf zero2: %s", err);
    CHECK(zc.stage == 2 && zc.offload_optimizer_device == ZERO_OFFLOAD_CPU && zc.reduce_bucket_size == 200000000u);
    CHECK(zc.compute_dtype == ZERO_F32 && zc.lr == 1e-3); /* "auto": libzero's defaults */
    {
        const char *const names[] = {"wall_clock_breakdown", "\"auto\"", "optimizer.params.lr", "fp16.enabled",
                                     "train_batch_size", "scheduler.params.warmup_max_lr", "gradient_clipping", NULL};
        expect_one_warning("hf zero2", names);
    }
    json_decref(root);

    /* HF Trainer, ZeRO-3 with optimizer and parameter offload */
    root = load_file(dir, "hf_ds_config_zero3.json");
    CHECK_MSG(load_both(root, &zc, err, sizeof err) == 0, "hf zero3: %s", err);
    CHECK(zc.stage == 3 && zc.offload_param_device == ZERO_OFFLOAD_CPU && zc.stage3_max_live_parameters == 1000000000u);
    CHECK(zc.stage3_prefetch_bucket_size == 50000000u); /* "auto" -> the default */
    {
        const char *const names[] = {"wall_clock_breakdown", "bf16.enabled", "zero_optimization.reduce_bucket_size",
                                     "zero_optimization.stage3_param_persistence_threshold", NULL};
        expect_one_warning("hf zero3", names);
    }
    json_decref(root);

    /* DeepSpeedExamples-style GPT, ZeRO-2, fp16, monitors and profilers on */
    root = load_file(dir, "dsexamples_gpt_zero2.json");
    CHECK_MSG(load_both(root, &zc, err, sizeof err) == 0, "gpt zero2: %s", err);
    CHECK(zc.stage == 2 && zc.compute_dtype == ZERO_F16 && zc.initial_scale_power == 12 && zc.lr == 0.00015);
    {
        const char *const names[] = {"wall_clock_breakdown", "flops_profiler", "tensorboard", "csv_monitor", "wandb",
                                     "comms_logger", "zero_allow_untested_optimizer", "prescale_gradients", NULL};
        expect_one_warning("gpt zero2", names);
        CHECK_MSG(!strstr(last_warning, "steps_per_print") && !strstr(last_warning, "activation_checkpointing"),
                  "zero-train applies steps_per_print and activation_checkpointing: %s", last_warning);
    }
    json_decref(root);

    /* DeepSpeedExamples-style GPT, ZeRO-3, bf16, neutral math keys */
    root = load_file(dir, "dsexamples_gpt_zero3_bf16.json");
    CHECK_MSG(load_both(root, &zc, err, sizeof err) == 0, "gpt zero3: %s", err);
    CHECK(zc.stage == 3 && zc.compute_dtype == ZERO_BF16 && zc.reduce_bucket_size == 50000000u);
    {
        const char *const names[] = {"communication_data_type", "checkpoint", "zero_optimization.ignore_unused_parameters",
                                     "zero_optimization.memory_efficient_linear", NULL};
        expect_one_warning("gpt zero3", names);
    }
    json_decref(root);

    /* a config of libzero's own keys only: no warning at all */
    root = json_loads("{\"zero_optimization\": {\"stage\": 1}}", 0, NULL);
    CHECK(load_both(root, &zc, err, sizeof err) == 0 && n_warnings == 0);
    json_decref(root);
    /* DeepSpeed's older "bfloat16" section */
    root = json_loads("{\"bfloat16\": {\"enabled\": true}}", 0, NULL);
    CHECK_MSG(load_both(root, &zc, err, sizeof err) == 0 && zc.compute_dtype == ZERO_BF16, "bfloat16: %s", err);
    json_decref(root);

    /* keys that would change the math: refused by name */
    expect_refused("{\"amp\": {\"enabled\": true}}", "amp: not implemented: NVIDIA Apex AMP");
    expect_refused("{\"communication_data_type\": \"fp16\"}", "communication_data_type: not implemented");
    expect_refused("{\"prescale_gradients\": true}", "prescale_gradients: not implemented");
    expect_refused("{\"gradient_predivide_factor\": 2.0}", "gradient_predivide_factor: not implemented");
    expect_refused("{\"zero_optimization\": {\"stage\": 3, \"zero_quantized_gradients\": true}}",
                   "zero_optimization.zero_quantized_gradients: not implemented");
    expect_refused("{\"zero_optimization\": {\"cpu_offload\": true}}",
                   "zero_optimization.cpu_offload: not implemented: DeepSpeed's old key");
    expect_refused("{\"fp16\": {\"enabled\": true, \"fp16_master_weights_and_grads\": true}}",
                   "fp16.fp16_master_weights_and_grads: not implemented");
    expect_refused("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"amsgrad\": true}}}",
                   "optimizer.params.amsgrad: not implemented");
    /* unknown keys: the closest known one suggested (DeepSpeed's, libzero's, zero-train's) */
    expect_refused("{\"wall_clock_breakdwon\": true}",
                   "wall_clock_breakdwon: unknown key; did you mean 'wall_clock_breakdown'?");
    expect_refused("{\"gradient_acumulation_steps\": 2}", "did you mean 'gradient_accumulation_steps'?");
    expect_refused("{\"zero_optimization\": {\"stage3_prefetch_bucket_sise\": 5}}",
                   "zero_optimization.stage3_prefetch_bucket_sise: unknown key; did you mean "
                   "'stage3_prefetch_bucket_size'?");
    expect_refused("{\"zero_optimization\": {\"ignore_unused_parameter\": true}}",
                   "did you mean 'ignore_unused_parameters'?");
    expect_refused("{\"model\": {\"n_layers\": 2}}", "model.n_layers: unknown key; did you mean 'n_layer'?");
    expect_refused("{\"completely_unrelated\": 1}", "completely_unrelated: unknown key (");
    zero_set_log_handler(NULL, ZERO_LOG_WARN, NULL);
    return check_exit();
}
