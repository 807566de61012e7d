/* zero_config_from_json: DeepSpeed's engine sections fill the config with
 * DeepSpeed's meanings; unknown keys inside them and wrong types fail with a
 * message naming the key path; other top-level keys are ignored; a failed
 * parse leaves the config untouched. */
#include "eng_util.h"

static void expect_error(const char *json, const char *text)
{
    zero_config c = ZERO_CONFIG_INIT, before = c;
    zero_status st = zero_config_from_json(&c, json);
    CHECK_MSG(st == ZERO_CONFIG, "%s: returned %s", json, zero_status_name(st));
    CHECK_MSG(strstr(zero_last_error(), text) != NULL, "message \"%s\" lacks \"%s\"", zero_last_error(), text);
    CHECK_MSG(!memcmp(&c, &before, sizeof c), "%s: a failed parse changed the config", json);
}

int main(void)
{
    zero_config c = ZERO_CONFIG_INIT;
    /* defaults: DeepSpeed's and torch's */
    CHECK(c.stage == 0 && c.reduce_bucket_size == 500000000u && c.stage3_prefetch_bucket_size == 50000000u);
    CHECK(c.stage3_param_persistence_threshold == 100000u && c.stage3_max_live_parameters == 1000000000u);
    CHECK(c.lr == 1e-3 && c.beta1 == 0.9 && c.beta2 == 0.999 && c.eps == 1e-8 && c.weight_decay == 0.01);
    CHECK(c.initial_scale_power == 16 && c.loss_scale_window == 1000 && c.hysteresis == 2 && c.min_loss_scale == 1);

    const char *full =
        "{\"train_batch_size\": 32, \"wandb\": {\"anything\": [1, 2]},"
        " \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 5e7, \"allgather_bucket_size\": 2e8,"
        "   \"overlap_comm\": true, \"contiguous_gradients\": false, \"stage3_prefetch_bucket_size\": 1000,"
        "   \"stage3_max_live_parameters\": 3000, \"stage3_param_persistence_threshold\": 64,"
        "   \"allgather_partitions\": true, \"reduce_scatter\": true},"
        " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, \"betas\": [0.8, 0.95], \"eps\": 1e-6,"
        "   \"weight_decay\": 0.1}},"
        " \"gradient_clipping\": 1.0, \"gradient_accumulation_steps\": 4,"
        " \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 12, \"loss_scale_window\": 500,"
        "   \"hysteresis\": 3, \"min_loss_scale\": 0.5}}";
    CHECK_OK(zero_config_from_json(&c, full));
    CHECK(c.stage == 3 && c.reduce_bucket_size == 50000000u && c.allgather_bucket_size == 200000000u);
    CHECK(c.overlap_comm == 1 && c.contiguous_gradients == 0 && c.stage3_prefetch_bucket_size == 1000);
    CHECK(c.stage3_max_live_parameters == 3000 && c.stage3_param_persistence_threshold == 64);
    CHECK(c.optimizer == ZERO_OPTIM_ADAMW && c.lr == 3e-4 && c.beta1 == 0.8 && c.beta2 == 0.95 && c.eps == 1e-6);
    CHECK(c.weight_decay == 0.1 && c.gradient_clipping == 1.0 && c.gradient_accumulation_steps == 4);
    CHECK(c.compute_dtype == ZERO_F16 && c.loss_scale == 0 && c.initial_scale_power == 12);
    CHECK(c.loss_scale_window == 500 && c.hysteresis == 3 && c.min_loss_scale == 0.5);

    zero_config s = ZERO_CONFIG_INIT;
    CHECK_OK(zero_config_from_json(&s, "{\"optimizer\": {\"type\": \"sgd\", \"params\": {\"lr\": 0.1, "
                                       "\"momentum\": 0.9, \"nesterov\": true, \"weight_decay\": 0}},"
                                       " \"bf16\": {\"enabled\": true}}"));
    CHECK(s.optimizer == ZERO_OPTIM_SGD && s.lr == 0.1 && s.momentum == 0.9 && s.nesterov == 1);
    CHECK(s.weight_decay == 0 && s.compute_dtype == ZERO_BF16);
    zero_config a = ZERO_CONFIG_INIT;
    CHECK_OK(zero_config_from_json(&a, "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": true}}}"));
    CHECK(a.optimizer == ZERO_OPTIM_ADAMW && a.optimizer_fast == 0);
    /* AdamW's fast mode: a libzero key under optimizer.params, AdamW only */
    CHECK_OK(zero_config_from_json(&a, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"fast\": true}}}"));
    CHECK(a.optimizer_fast == 1);
    expect_error("{\"optimizer\": {\"type\": \"sgd\", \"params\": {\"fast\": true}}}",
                 "optimizer.params.fast: unknown key");
    zero_config empty = ZERO_CONFIG_INIT, def = ZERO_CONFIG_INIT;
    CHECK_OK(zero_config_from_json(&empty, "{}"));
    CHECK(!memcmp(&empty, &def, sizeof def));

    expect_error("{\"zero_optimization\": {\"stage\": \"three\"}}",
                 "zero_optimization.stage: expected an integer 0..3, got \"three\"");
    expect_error("{\"zero_optimization\": {\"stage\": 4}}", "zero_optimization.stage: expected an integer 0..3, got 4");
    expect_error("{\"zero_optimization\": {\"stage\": 1.5}}", "zero_optimization.stage: expected an integer 0..3, got 1.5");
    expect_error("{\"zero_optimization\": {\"stages\": 2}}", "zero_optimization.stages: unknown key");
    /* The two offload sections: their shared keys parse alike (one helper), each named by its section. */
    {
        zero_config o = ZERO_CONFIG_INIT;
        CHECK_OK(zero_config_from_json(&o, "{\"zero_optimization\": {\"stage\": 3, "
                                           "\"offload_optimizer\": {\"device\": \"NVMe\", \"nvme_path\": \"/tmp/a\", \"pin_memory\": true}, "
                                           "\"offload_param\": {\"device\": \"cpu\", \"nvme_path\": \"/tmp/b\", \"pin_memory\": true}}}"));
        CHECK(o.offload_optimizer_device == ZERO_OFFLOAD_NVME && !strcmp(o.offload_nvme_path, "/tmp/a"));
        CHECK(o.offload_pin_memory == 1 && o.offload_param_pin_memory == 1);
        CHECK(o.offload_param_device == ZERO_OFFLOAD_CPU && !strcmp(o.offload_param_nvme_path, "/tmp/b"));
        CHECK_OK(zero_config_from_json(&o, "{\"zero_optimization\": {\"offload_param\": {\"nvme_path\": null}}}"));
        CHECK(o.offload_param_nvme_path[0] == '\0' && !strcmp(o.offload_nvme_path, "/tmp/a"));
        char long_path[400];
        snprintf(long_path, sizeof long_path, "{\"zero_optimization\": {\"offload_param\": {\"nvme_path\": \"%0300d\"}}}", 0);
        expect_error(long_path, "zero_optimization.offload_param.nvme_path: expected a directory path");
        expect_error("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"disk\"}}}",
                     "zero_optimization.offload_optimizer.device: expected \"none\", \"cpu\" or \"nvme\"");
        expect_error("{\"zero_optimization\": {\"offload_param\": {\"device\": 1}}}",
                     "zero_optimization.offload_param.device: expected \"none\", \"cpu\" or \"nvme\"");
        expect_error("{\"zero_optimization\": {\"offload_param\": {\"pin_memory\": \"yes\"}}}",
                     "zero_optimization.offload_param.pin_memory");
    }
    /* HF Trainer's "auto" is a value the trainer fills in: here the default applies (issue 11) */
    {
        zero_config a = ZERO_CONFIG_INIT;
        CHECK_OK(zero_config_from_json(&a, "{\"zero_optimization\": {\"reduce_bucket_size\": \"auto\"}}"));
        CHECK(a.reduce_bucket_size == 500000000u);
    }
    expect_error("{\"zero_optimization\": {\"reduce_bucket_size\": \"big\"}}",
                 "zero_optimization.reduce_bucket_size: expected an integer 1..9223372036854775807");
    /* issue 10 B10: sizes beyond 2^63 or the NVMe store's range are refused here, naming the key */
    expect_error("{\"zero_optimization\": {\"reduce_bucket_size\": 1.7e19}}",
                 "zero_optimization.reduce_bucket_size: expected an integer 1..9223372036854775807");
    expect_error("{\"aio\": {\"block_size\": 1.8e19}}", "aio.block_size: expected an integer 4096..1073741824 (bytes)");
    expect_error("{\"aio\": {\"block_size\": 2147483648}}", "aio.block_size: expected an integer 4096..1073741824");
    expect_error("{\"aio\": {\"block_size\": 4611686018427387904}}", "aio.block_size: expected an integer 4096..");
    {
        zero_config big = ZERO_CONFIG_INIT;
        CHECK_OK(zero_config_from_json(&big, "{\"aio\": {\"block_size\": 1073741824}, "
                                             "\"zero_optimization\": {\"sub_group_size\": 9223372036854775807}}"));
        CHECK(big.aio_block_size == 1073741824u && big.sub_group_size == 9223372036854775807u);
    }
    expect_error("{\"zero_optimization\": {\"overlap_comm\": 1}}", "zero_optimization.overlap_comm: expected true or false");
    expect_error("{\"zero_optimization\": {\"reduce_scatter\": false}}", "zero_optimization.reduce_scatter: false is not supported");
    expect_error("{\"zero_optimization\": 3}", "zero_optimization: expected an object, got 3");
    expect_error("{\"optimizer\": {\"type\": \"Lamb\"}}", "optimizer.type: expected AdamW, Adam or SGD, got \"Lamb\"");
    expect_error("{\"optimizer\": {\"params\": {}}}", "optimizer.type: missing");
    expect_error("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9]}}}",
                 "optimizer.params.betas: expected an array of two numbers in [0, 1)");
    expect_error("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"momentum\": 0.9}}}",
                 "optimizer.params.momentum: unknown key");
    expect_error("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"eps\": 1e-8}}}", "optimizer.params.eps: unknown key");
    expect_error("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": -1}}}", "optimizer.params.lr: expected a number");
    expect_error("{\"optimizer\": {\"type\": \"AdamW\", \"extra\": 1}}", "optimizer.extra: unknown key");
    expect_error("{\"gradient_clipping\": \"1.0\"}", "gradient_clipping: expected a number");
    expect_error("{\"gradient_accumulation_steps\": 0}", "gradient_accumulation_steps: expected an integer 1..");
    expect_error("{\"fp16\": {\"enabled\": true, \"auto_casts\": true}}",
                 "fp16.auto_casts: unknown key; did you mean 'auto_cast'?"); /* DeepSpeed's auto_cast is accepted */
    expect_error("{\"bf16\": {\"enabled\": \"yes\"}}", "bf16.enabled: expected true or false, got \"yes\"");
    expect_error("{\"bf16\": {\"enabled\": true}, \"fp16\": {\"enabled\": true}}", "both true");
    expect_error("{\"fp16\": {\"hysteresis\": 0}}", "fp16.hysteresis: expected an integer 1..");
    expect_error("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"nesterov\": true}}}", "nesterov needs momentum");
    expect_error("{\"zero_optimization\": {\"stage\": 1,}}", "config JSON: line 1");
    expect_error("[1, 2]", "expected a JSON object");
    expect_error("{\"zero_optimization\": {\"stage\": 1, \"stage\": 2}}", "config JSON");
    return check_exit();
}
