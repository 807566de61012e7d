/* zero-train's config: every rejection names the key; DeepSpeed's batch-size
 * rule; scheduler values; defaults in the effective config. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "train_config.h"

/* Parse `text` for dp ranks; returns 0/-1 and leaves the message in err. */
static int parse(const char *text, int dp, train_config *c, char *err, size_t n)
{
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) {
        snprintf(err, n, "bad json in test: %s", je.text);
        return -2;
    }
    int rc = train_config_parse(c, root, dp, err, n);
    json_decref(root);
    return rc;
}

static void expect_reject(const char *text, int dp, const char *needle)
{
    train_config c;
    char err[512] = "";
    int rc = parse(text, dp, &c, err, sizeof err);
    CHECK_MSG(rc == -1 && strstr(err, needle), "config %s: rc %d, message \"%s\", wanted \"%s\"", text, rc, err,
              needle);
    train_config_free(&c);
}

int main(void)
{
    /* unknown keys, anywhere */
    expect_reject("{\"train_batch_sise\": 8}", 1, "train_batch_sise: unknown key");
    expect_reject("{\"model\": {\"n_layers\": 2}}", 1, "model.n_layers: unknown key");
    expect_reject("{\"data\": {\"paht\": \"x\"}}", 1, "data.paht: unknown key");
    /* --device cuda runs model.pp (MoE blocks included) and model.tp (the CUDA stage, the CUDA GPT's tp
     * blocks); cp and sequence parallelism are the CPU stage's only, refused by name */
    expect_reject("{\"train\": {\"device\": \"cuda\"}, \"model\": {\"cp\": 2, \"n_head\": 4}}", 2,
                  "model.cp > 1 runs on the CPU only");
    expect_reject("{\"train\": {\"device\": \"cuda\"}, \"model\": {\"tp\": 2, \"n_head\": 4, "
                  "\"sequence_parallel\": true}}", 2, "model.sequence_parallel runs on the CPU only");
    {
        static const char *const ok[] = {
            "{\"train\": {\"device\": \"cuda\"}, \"model\": {\"pp\": 2, \"n_layer\": 4}}",
            "{\"train\": {\"device\": \"cuda\"}, \"model\": {\"tp\": 2, \"n_head\": 4}}",
            "{\"train\": {\"device\": \"cuda\"}, \"model\": {\"tp\": 2, \"pp\": 2, \"n_head\": 4, \"n_layer\": 4}}",
            "{\"train\": {\"device\": \"cuda\"}, \"model\": {\"pp\": 2, \"n_layer\": 4, \"moe\": {\"experts\": 4}}}",
        };
        for (int i = 0; i < 4; i++) {
            train_config c;
            char err[512];
            int dp = i == 2 ? 4 : 2;
            CHECK_MSG(parse(ok[i], dp, &c, err, sizeof err) == 0, "--device cuda: %s refused: %s", ok[i], err);
            train_config_free(&c);
        }
    }
    expect_reject("{\"train\": {\"checkpoint\": {\"dri\": \"x\"}}}", 1, "train.checkpoint.dri: unknown key");
    expect_reject("{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_max_lr\": 1}}}", 1,
                  "scheduler.params.warmup_max_lr: unknown key");
    /* wrong types and ranges */
    expect_reject("{\"model\": {\"n_head\": \"4\"}}", 1, "model.n_head: expected an integer, got string");
    expect_reject("{\"model\": 3}", 1, "model: expected an object");
    expect_reject("{\"train\": {\"steps\": 1.5}}", 1, "train.steps: expected an integer, got number");
    expect_reject("{\"model\": {\"n_layer\": 0}}", 1, "model.n_layer: 0 is out of range");
    expect_reject("{\"model\": {\"vocab\": 100}}", 1, "model.vocab: 100 is out of range");
    expect_reject("{\"model\": {\"d_model\": 130, \"n_head\": 4}}", 1, "model.d_model: 130 is not divisible");
    expect_reject("{\"train\": {\"device\": \"tpu\"}}", 1, "train.device");
    expect_reject("{\"data\": {\"suffixes\": [1]}}", 1, "data.suffixes[0]: expected a string");
    expect_reject("{\"scheduler\": {\"type\": \"OneCycles\"}}", 1, "scheduler.type: unknown scheduler");
    expect_reject("{\"scheduler\": {\"type\": \"OneCycle\"}}", 1, "OneCycle needs cycle_min_lr and cycle_max_lr");
    expect_reject("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"big\"}}}", 1,
                  "optimizer.params.lr: expected a number");
    expect_reject("{\"steps_per_print\": 5, \"train\": {\"log_every\": 5}}", 1, "steps_per_print: give either");
    expect_reject("[1, 2]", 1, "top level must be a JSON object");
    /* DeepSpeed's rule: train_batch_size = micro * gas * dp */
    expect_reject("{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 4, "
                  "\"gradient_accumulation_steps\": 1}", 2,
                  "train_batch_size: 16 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 1 * "
                  "data-parallel ranks 2");
    expect_reject("{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 4}", 1,
                  "train_batch_size: 10 is not divisible");
    expect_reject("{\"train_batch_size\": 0}", 1, "train_batch_size: 0 is out of range");

    train_config c;
    char err[512];
    CHECK(parse("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4}", 2, &c, err, sizeof err) == 0);
    CHECK(c.grad_accum == 4 && c.micro_batch == 4 && c.train_batch_size == 32);
    train_config_free(&c);
    CHECK(parse("{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 2}", 2, &c, err, sizeof err) == 0);
    CHECK(c.micro_batch == 8);
    train_config_free(&c);
    CHECK(parse("{}", 3, &c, err, sizeof err) == 0);
    CHECK(c.micro_batch == 8 && c.grad_accum == 1 && c.train_batch_size == 24);
    CHECK(c.n_layer == 4 && c.seq_len == 64 && c.vocab == 256 && strcmp(c.data_path, "auto") == 0);
    /* the effective config has every default filled in */
    json_t *m = json_object_get(c.effective, "model");
    CHECK(m && json_integer_value(json_object_get(m, "d_model")) == 128);
    CHECK(json_integer_value(json_object_get(c.effective, "train_batch_size")) == 24);
    train_config_free(&c);

    /* the schedules' values: test_train_sched.c, step for step against DeepSpeed's */

    /* issue 10 B8/B9: batch sizes are 64-bit and checked (888888881 * 8 overflowed int) */
    CHECK(parse("{\"gradient_accumulation_steps\": 888888881}", 3, &c, err, sizeof err) == 0);
    CHECK(c.train_batch_size == 8LL * 888888881 * 3 && c.grad_accum == 888888881);
    CHECK(json_integer_value(json_object_get(c.effective, "train_batch_size")) == 8LL * 888888881 * 3);
    train_config_free(&c);
    expect_reject("{\"train_micro_batch_size_per_gpu\": 2147483647, \"gradient_accumulation_steps\": 2147483647}",
                  1 << 20, "overflows 64 bits");
    expect_reject("{\"train_batch_size\": 9223372036854775807, \"train_micro_batch_size_per_gpu\": 1}", 1,
                  "accumulation steps, more than 2147483647");
    expect_reject("{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 2147483647, "
                  "\"gradient_accumulation_steps\": 2147483647}", 3, "train_batch_size: 8 != ");
    expect_reject("{\"gradient_accumulation_steps\": 2147483647, \"train\": {\"steps\": 2305843009213693951}}", 1,
                  "train.steps: 2305843009213693951 steps * train_batch_size");
    /* issue 10 B6: a scheduler is checked with its defaults filled in (WarmupDecayLR
     * without params: warmup 1000 > total = train.steps 300), so what is accepted
     * prints a form that loads; "scheduler": null (no scheduler) loads */
    expect_reject("{\"scheduler\": {\"type\": \"WarmupDecayLR\"}}", 1,
                  "scheduler.params.warmup_num_steps: 1000 (the default) exceeds scheduler.params.total_num_steps 300 "
                  "(the default: train.steps)");
    expect_reject("{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 5}}}", 1,
                  "warmup_num_steps: 1000 (the default) exceeds scheduler.params.total_num_steps 5");
    expect_reject("{\"scheduler\": 3}", 1, "scheduler: expected an object or null, got integer");
    CHECK(parse("{\"scheduler\": null}", 1, &c, err, sizeof err) == 0);
    CHECK(c.sched.kind == TRAIN_SCHED_CONSTANT && json_is_null(json_object_get(c.effective, "scheduler")));
    train_config_free(&c);
    CHECK(parse("{\"scheduler\": {\"type\": \"WarmupDecayLR\"}, \"train\": {\"steps\": 2000}}", 1, &c, err,
                sizeof err) == 0);
    {
        json_t *sp = json_object_get(json_object_get(c.effective, "scheduler"), "params");
        CHECK(json_integer_value(json_object_get(sp, "warmup_num_steps")) == 1000 &&
              json_integer_value(json_object_get(sp, "total_num_steps")) == 2000);
    }
    train_config_free(&c);
    /* train.comm_timeout_s: default, range, in the effective config */
    CHECK(parse("{}", 1, &c, err, sizeof err) == 0);
    CHECK(c.comm_timeout_s == TRAIN_DEFAULT_COMM_TIMEOUT_S);
    CHECK(json_real_value(json_object_get(json_object_get(c.effective, "train"), "comm_timeout_s")) ==
          TRAIN_DEFAULT_COMM_TIMEOUT_S);
    train_config_free(&c);
    expect_reject("{\"train\": {\"comm_timeout_s\": 0}}", 1, "train.comm_timeout_s: 0 is out of range");
    expect_reject("{\"train\": {\"comm_timeout_s\": \"1m\"}}", 1, "train.comm_timeout_s: expected a number");
    /* numbers print with the fewest digits that load back exactly */
    {
        json_t *v = json_pack("{s:f,s:f}", "a", 0.1 + 0.2, "b", 0.003);
        char *t = train_config_dumps(v);
        json_t *back = json_loads(t, 0, NULL);
        CHECK(back && json_equal(back, v));
        free(t);
        json_decref(back);
        json_decref(v);
        v = json_pack("{s:f}", "b", 0.003);
        t = train_config_dumps(v);
        CHECK_MSG(strstr(t, "0.003\n"), "%s", t);
        free(t);
        json_decref(v);
    }

    /* activation_checkpointing (DeepSpeed's section): keys named in every rejection; on when present */
    expect_reject("{\"activation_checkpointing\": {\"number_checkpoint\": 2}}", 1,
                  "activation_checkpointing.number_checkpoint: unknown key");
    expect_reject("{\"activation_checkpointing\": {\"cpu_checkpointing\": 1}}", 1,
                  "activation_checkpointing.cpu_checkpointing: expected a boolean, got integer");
    expect_reject("{\"activation_checkpointing\": {\"number_checkpoints\": -1}}", 1,
                  "activation_checkpointing.number_checkpoints: -1 is out of range");
    expect_reject("{\"activation_checkpointing\": true}", 1, "activation_checkpointing: expected an object or null");
    CHECK(parse("{\"model\": {\"tp\": 2}, \"activation_checkpointing\": {\"partition_activations\": true}}", 2, &c,
                err, sizeof err) == 0);
    CHECK(c.actckpt.partition_activations && !c.actckpt.notes[0]); /* applied under tp: no note */
    train_config_free(&c);
    CHECK(parse("{}", 1, &c, err, sizeof err) == 0);
    CHECK(!c.actckpt.enabled && json_is_null(json_object_get(c.effective, "activation_checkpointing")));
    train_config_free(&c);
    CHECK(parse("{\"activation_checkpointing\": {}}", 1, &c, err, sizeof err) == 0);
    CHECK(c.actckpt.enabled && c.actckpt.blocks == 4 && !c.actckpt.notes[0]); /* every block */
    CHECK(json_is_null(json_object_get(json_object_get(c.effective, "activation_checkpointing"), "number_checkpoints")));
    train_config_free(&c);
    CHECK(parse("{\"activation_checkpointing\": {\"number_checkpoints\": 9, \"profile\": true, "
                "\"cpu_checkpointing\": true, \"partition_activations\": true}}", 1, &c, err, sizeof err) == 0);
    CHECK(c.actckpt.blocks == 4 && c.actckpt.cpu_checkpointing); /* clamped to model.n_layer */
    CHECK_MSG(strstr(c.actckpt.notes, "activation_checkpointing.profile: not implemented") &&
                  strstr(c.actckpt.notes, "activation_checkpointing.cpu_checkpointing: no effect on train.device \"cpu\"") &&
                  strstr(c.actckpt.notes, "activation_checkpointing.partition_activations: no effect with model.tp 1"),
              "notes: %s", c.actckpt.notes);
    {
        json_t *a = json_object_get(c.effective, "activation_checkpointing");
        CHECK(json_integer_value(json_object_get(a, "number_checkpoints")) == 4 &&
              json_is_true(json_object_get(a, "profile")) && json_is_false(json_object_get(a, "synchronize_checkpoint_boundary")));
    }
    train_config_free(&c);

    /* the built-in config parses */
    json_error_t je;
    json_t *root = json_loads(train_default_config_json, 0, &je);
    CHECK(root != NULL);
    CHECK(train_config_parse(&c, root, 2, err, sizeof err) == 0);
    json_decref(root);
    train_config_free(&c);
    char dir[256], note[512];
    CHECK(train_default_corpus(dir, sizeof dir, note, sizeof note) == 0);
    return check_exit();
}
