/* DeepSpeed's config keys that libzero does not implement, and whether a
 * given value would change the training math (see ds_keys.h). The lists
 * follow DeepSpeed's config documentation (deepspeed.ai/docs/config-json)
 * and its config classes; a key missing here is refused as unknown, with
 * the closest known key suggested. */
#include "common/ds_keys.h"

#include <stdio.h>
#include <string.h>

/* When a value leaves libzero's math unchanged. */
typedef enum neutral {
    ANY,           /* monitoring, logging, profiling, I/O tuning: never changes the math */
    IF_FALSE,      /* a boolean: false (or null) */
    IF_TRUE,       /* a boolean: true (or null) */
    IF_DISABLED,   /* an object whose "enabled" is false (or null, or {}) */
    IF_ONE,        /* a number: 1 (or null) */
    IF_MINUS_ONE,  /* a number: -1 (or null) */
    IF_FP32,       /* a dtype name: "fp32" / "float32" / "float" (or null) */
    IF_NULL,       /* only null */
} neutral;

typedef struct ds_key {
    const char *section, *key;
    neutral when;
    const char *why; /* refused otherwise: what to do instead */
} ds_key;

static const ds_key table[] = {
    /* top level: reporting and tooling */
    {"", "wall_clock_breakdown", ANY, NULL},
    {"", "memory_breakdown", ANY, NULL},
    {"", "dump_state", ANY, NULL},
    {"", "flops_profiler", ANY, NULL},
    {"", "tensorboard", ANY, NULL},
    {"", "wandb", ANY, NULL},
    {"", "csv_monitor", ANY, NULL},
    {"", "comet", ANY, NULL},
    {"", "comms_logger", ANY, NULL},
    {"", "timers", ANY, NULL},
    {"", "zero_allow_untested_optimizer", ANY, NULL},
    {"", "zero_force_ds_cpu_optimizer", ANY, NULL},
    {"", "checkpoint", ANY, NULL},
    {"", "nebula", ANY, NULL},
    {"", "autotuning", ANY, NULL},
    {"", "disable_allgather", ANY, NULL},
    {"", "compile", ANY, NULL},
    {"", "pipeline", ANY, NULL},
    {"", "graph_harvesting", ANY, NULL},
    {"", "use_data_before_expert_parallelism", ANY, NULL},
    {"", "seq_parallel_communication_data_type", ANY, NULL},
    /* top level: would change the math */
    {"", "amp", IF_DISABLED, "NVIDIA Apex AMP is not implemented; use bf16 or fp16"},
    {"", "prescale_gradients", IF_FALSE, "gradients are averaged after the fp32 reduction; prescaling is not implemented"},
    {"", "gradient_predivide_factor", IF_ONE, "gradient predivision is not implemented (the average is taken after the fp32 reduction)"},
    {"", "sparse_gradients", IF_FALSE, "sparse gradients are not implemented"},
    {"", "communication_data_type", IF_FP32, "gradients are always reduced in fp32"},
    {"", "elasticity", IF_DISABLED, "elastic training (batch sizes chosen by DeepSpeed) is not implemented"},
    {"", "curriculum_learning", IF_DISABLED, "curriculum learning is not implemented"},
    {"", "data_efficiency", IF_DISABLED, "data efficiency (sampling, routing) is not implemented"},
    {"", "compression_training", IF_NULL, "compression training is not implemented"},
    {"", "progressive_layer_drop", IF_DISABLED, "progressive layer drop is not implemented"},
    {"", "eigenvalue", IF_DISABLED, "eigenvalue computation is not implemented"},
    {"", "quantize_training", IF_DISABLED, "quantized training is not implemented"},
    {"", "sparse_attention", IF_NULL, "sparse attention is not implemented"},
    {"", "hybrid_engine", IF_DISABLED, "the hybrid (RLHF) engine is not implemented"},
    {"", "weight_quantization", IF_NULL, "weight quantization is not implemented"},
    /* zero_optimization */
    {"zero_optimization", "load_from_fp32_weights", ANY, NULL},
    {"zero_optimization", "elastic_checkpoint", ANY, NULL},
    {"zero_optimization", "ignore_unused_parameters", ANY, NULL},
    {"zero_optimization", "legacy_stage1", ANY, NULL},
    {"zero_optimization", "memory_efficient_linear", ANY, NULL},
    {"zero_optimization", "stage3_gather_fp16_weights_on_model_save", ANY, NULL},
    {"zero_optimization", "model_persistence_threshold", ANY, NULL},
    {"zero_optimization", "use_multi_rank_bucket_allreduce", ANY, NULL},
    {"zero_optimization", "log_trace_cache_warnings", ANY, NULL},
    {"zero_optimization", "pipeline_loading_checkpoint", ANY, NULL},
    {"zero_optimization", "override_module_apply", ANY, NULL},
    {"zero_optimization", "stage3_module_granularity_threshold", ANY, NULL},
    {"zero_optimization", "use_all_reduce_for_fetch_params", ANY, NULL},
    {"zero_optimization", "zero_hpz_partition_size", IF_ONE, "hierarchical partitioning (ZeRO++ hpZ) is not implemented"},
    {"zero_optimization", "mics_shard_size", IF_MINUS_ONE, "MiCS sharding is not implemented"},
    {"zero_optimization", "mics_hierarchical_params_gather", IF_FALSE, "MiCS sharding is not implemented"},
    {"zero_optimization", "zero_quantized_weights", IF_FALSE, "quantized weights (ZeRO++ qwZ) are not implemented"},
    {"zero_optimization", "zero_quantized_nontrainable_weights", IF_FALSE, "quantized weights are not implemented"},
    {"zero_optimization", "zero_quantized_gradients", IF_FALSE, "quantized gradients (ZeRO++ qgZ) are not implemented"},
    {"zero_optimization", "cpu_offload", IF_FALSE, "DeepSpeed's old key: write offload_optimizer: {\"device\": \"cpu\"}"},
    {"zero_optimization", "cpu_offload_params", IF_FALSE, "DeepSpeed's old key: write offload_param: {\"device\": \"cpu\"}"},
    {"zero_optimization", "cpu_offload_use_pin_memory", ANY, NULL},
    {"zero_optimization.offload_optimizer", "ratio", IF_ONE, "partial optimizer offload (ratio < 1) is not implemented"},
    /* fp16 / bf16 */
    {"fp16", "auto_cast", ANY, NULL},
    {"fp16", "consecutive_hysteresis", IF_FALSE, "consecutive hysteresis is not implemented"},
    {"fp16", "fp16_master_weights_and_grads", IF_FALSE, "fp16 master weights are not implemented (masters are fp32)"},
    {"bf16", "immediate_grad_update", ANY, NULL},
    /* optimizer.params (Adam / AdamW) */
    {"optimizer.params", "torch_adam", ANY, NULL},
    {"optimizer.params", "fused", ANY, NULL},
    {"optimizer.params", "amsgrad", IF_FALSE, "AMSGrad is not implemented"},
    {"optimizer.params", "bias_correction", IF_TRUE, "Adam without bias correction is not implemented"},
};

static int is_neutral(neutral when, const json_t *v)
{
    if (when == ANY || !v || json_is_null(v)) return 1;
    switch (when) {
    case IF_FALSE: return json_is_false(v);
    case IF_TRUE: return json_is_true(v);
    case IF_DISABLED: {
        if (!json_is_object(v)) return 0;
        json_t *en = json_object_get(v, "enabled");
        return json_object_size(v) == 0 || json_is_false(en);
    }
    case IF_ONE: return json_is_number(v) && json_number_value(v) == 1.0;
    case IF_MINUS_ONE: return json_is_number(v) && json_number_value(v) == -1.0;
    case IF_FP32: {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        return !strcmp(s, "fp32") || !strcmp(s, "float32") || !strcmp(s, "float");
    }
    default: return 0;
    }
}

zero_ds_verdict zero_ds_key(const char *section, const char *key, const json_t *value, const char **why)
{
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        if (strcmp(table[i].section, section) || strcmp(table[i].key, key)) continue;
        if (is_neutral(table[i].when, value)) return ZERO_DS_ACCEPT;
        if (why) *why = table[i].why;
        return ZERO_DS_REFUSE;
    }
    return ZERO_DS_UNKNOWN;
}

int zero_ds_section_keys(const char *section, const char **out, int cap)
{
    int n = 0;
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (!strcmp(table[i].section, section)) {
            if (n < cap) out[n] = table[i].key;
            n++;
        }
    if (n < cap) out[n] = NULL;
    return n;
}

static int strip(json_t *obj, char *prefix, size_t plen, char *paths, size_t size)
{
    int count = 0;
    if (json_is_object(obj)) {
        const char *key;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(obj, tmp, key, v) {
            size_t len = strlen(prefix);
            snprintf(prefix + len, plen - len, "%s%s", len ? "." : "", key);
            if (json_is_string(v) && !strcmp(json_string_value(v), "auto")) {
                size_t used = strlen(paths);
                if (used + strlen(prefix) + 6 < size)
                    snprintf(paths + used, size - used, "%s%s", used ? ", " : "", prefix);
                else if (used + 4 < size && strcmp(paths + (used >= 3 ? used - 3 : 0), "..."))
                    snprintf(paths + used, size - used, "...");
                json_object_del(obj, key);
                count++;
            } else {
                count += strip(v, prefix, plen, paths, size);
            }
            prefix[len] = '\0';
        }
    }
    return count;
}

int zero_ds_strip_auto(json_t *root, char *paths, size_t size)
{
    char prefix[512] = "";
    if (size) paths[0] = '\0';
    return strip(root, prefix, sizeof prefix, paths, size);
}
