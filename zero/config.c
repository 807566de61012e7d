/* Validation of a zero_config before an engine is built from it. */
#include <math.h>
#include <string.h>

#include "common/versioned.h"
#include "engine_internal.h"

/* ---------------------------------------------------------------- versions
 * One row per ZERO_CONFIG_VERSION (engine.h lists each version's fields):
 * where its fields end and the first field it appended. */
static const zero_struct_version config_versions[] = {
    {ZERO_FIELD_END(zero_config, min_loss_scale), "stage"},
    {ZERO_FIELD_END(zero_config, aio_queue_depth), "offload_optimizer_device"},
    {ZERO_FIELD_END(zero_config, offload_param_max_in_cpu), "offload_param_device"},
    {ZERO_FIELD_END(zero_config, local_accumulation), "local_accumulation"},
    {ZERO_FIELD_END(zero_config, optimizer_fast), "optimizer_fast"},
};
#define CONFIG_VERSIONS (sizeof config_versions / sizeof *config_versions)
_Static_assert(CONFIG_VERSIONS == ZERO_CONFIG_VERSION, "a new zero_config version needs its row above");
ZERO_ASSERT_LAST_FIELD(zero_config, optimizer_fast);

static const zero_versioned_type config_type = {"zero_config", "ZERO_CONFIG_INIT", config_versions,
                                                CONFIG_VERSIONS, sizeof(zero_config)};

static void config_defaults(zero_config *out)
{
    const zero_config d = ZERO_CONFIG_INIT;
    memcpy(out, &d, sizeof d); /* memcpy: the padding too, so write-back can compare bytes */
}

zero_status config_read(const zero_config *in, zero_config *out, zero_status status, const char *what,
                        zero_errbuf *err)
{
    config_defaults(out);
    return zero_versioned_read(err, status, what, &config_type, in, out);
}

zero_status config_write_back(const zero_config *full, zero_config *caller, zero_status status, const char *what,
                              zero_errbuf *err)
{
    zero_config d;
    config_defaults(&d);
    return zero_versioned_write(err, status, what, &config_type, full, &d, caller);
}

/* ---------------------------------------------------------------- validation */

zero_status config_validate(const zero_config *c, zero_errbuf *err)
{
    if (!c) return zero_fail(err, ZERO_INVALID_ARGUMENT, "engine create: config is NULL");
#define BAD(...) return zero_fail(err, ZERO_CONFIG, "engine config: " __VA_ARGS__)
    if (c->stage < 0 || c->stage > 3) BAD("stage must be 0..3, got %d", c->stage);
    if (c->reduce_bucket_size < 1) BAD("reduce_bucket_size must be >= 1 element");
    if (c->allgather_bucket_size < 1) BAD("allgather_bucket_size must be >= 1 element");
    if (c->optimizer != ZERO_OPTIM_ADAMW && c->optimizer != ZERO_OPTIM_SGD)
        BAD("optimizer kind %d unknown", (int)c->optimizer);
    if (!(c->lr >= 0) || !isfinite(c->lr)) BAD("lr must be finite and >= 0, got %g", c->lr);
    if (!(c->beta1 >= 0 && c->beta1 < 1)) BAD("beta1 must be in [0, 1), got %g", c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1)) BAD("beta2 must be in [0, 1), got %g", c->beta2);
    if (!(c->eps >= 0)) BAD("eps must be >= 0, got %g", c->eps);
    if (!(c->weight_decay >= 0)) BAD("weight_decay must be >= 0, got %g", c->weight_decay);
    if (!(c->momentum >= 0)) BAD("momentum must be >= 0, got %g", c->momentum);
    if (!(c->dampening >= 0 && c->dampening <= 1)) BAD("dampening must be in [0, 1], got %g", c->dampening);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
        BAD("nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
    if (!(c->gradient_clipping >= 0)) BAD("gradient_clipping must be >= 0, got %g", c->gradient_clipping);
    if (c->gradient_accumulation_steps < 1)
        BAD("gradient_accumulation_steps must be >= 1, got %d", c->gradient_accumulation_steps);
    if (c->local_accumulation != 0 && c->local_accumulation != 1)
        BAD("local_accumulation must be 0 or 1, got %d", c->local_accumulation);
    if (c->local_accumulation && c->stage > 1)
        BAD("local_accumulation needs stage 0 or 1 (stage %d keeps only a shard of the gradient, so each "
            "micro-step's gradient must be reduced)", c->stage);
    if (c->optimizer_fast != 0 && c->optimizer_fast != 1)
        BAD("optimizer_fast must be 0 or 1, got %d", c->optimizer_fast);
    if (c->optimizer_fast && c->optimizer != ZERO_OPTIM_ADAMW)
        BAD("optimizer_fast applies to AdamW only (SGD has no division to approximate)");
    if (c->compute_dtype != ZERO_F32 && c->compute_dtype != ZERO_BF16 && c->compute_dtype != ZERO_F16)
        BAD("compute_dtype must be f32, bf16 or f16, got %s", zero_dtype_name(c->compute_dtype));
    if (!(c->loss_scale >= 0)) BAD("loss_scale must be >= 0 (0 = dynamic), got %g", c->loss_scale);
    if (c->initial_scale_power < 0 || c->initial_scale_power > 62)
        BAD("initial_scale_power must be 0..62, got %d", c->initial_scale_power);
    if (c->loss_scale_window < 1) BAD("loss_scale_window must be >= 1, got %d", c->loss_scale_window);
    if (c->hysteresis < 1) BAD("hysteresis must be >= 1, got %d", c->hysteresis);
    if (!(c->min_loss_scale > 0)) BAD("min_loss_scale must be > 0, got %g", c->min_loss_scale);
    if (c->offload_optimizer_device != ZERO_OFFLOAD_NONE && c->offload_optimizer_device != ZERO_OFFLOAD_CPU &&
        c->offload_optimizer_device != ZERO_OFFLOAD_NVME)
        BAD("offload_optimizer.device %d unknown (none, cpu, nvme)", (int)c->offload_optimizer_device);
    if (c->offload_optimizer_device != ZERO_OFFLOAD_NONE && c->stage < 1)
        BAD("offload_optimizer needs stage 1..3 (stage 0 keeps the optimizer state whole on every rank)");
    if (c->offload_param_device != ZERO_OFFLOAD_NONE && c->offload_param_device != ZERO_OFFLOAD_CPU &&
        c->offload_param_device != ZERO_OFFLOAD_NVME)
        BAD("offload_param.device %d unknown (none, cpu, nvme)", (int)c->offload_param_device);
    if (c->offload_param_device != ZERO_OFFLOAD_NONE && c->stage != 3)
        BAD("offload_param.device %s needs stage 3 (stages 0-2 keep the parameters whole on every rank), got "
            "stage %d", c->offload_param_device == ZERO_OFFLOAD_CPU ? "cpu" : "nvme", c->stage);
    if (c->offload_param_device == ZERO_OFFLOAD_NVME) {
        if (!memchr(c->offload_param_nvme_path, '\0', sizeof c->offload_param_nvme_path) ||
            !c->offload_param_nvme_path[0])
            BAD("offload_param.nvme_path must be set (an existing directory) for device nvme");
        if (c->offload_param_buffer_count < 2)
            BAD("offload_param.buffer_count must be >= 2 (one for the step, one read ahead), got %d",
                c->offload_param_buffer_count);
        if (c->offload_param_buffer_size < 1) BAD("offload_param.buffer_size must be >= 1 element");
    }
    if (c->offload_optimizer_device == ZERO_OFFLOAD_NVME || c->offload_param_device == ZERO_OFFLOAD_NVME) {
        if (c->aio_block_size < 4096 || c->aio_block_size % 4096 || c->aio_block_size > ZERO_AIO_BLOCK_SIZE_MAX)
            BAD("aio.block_size must be a multiple of 4096 in 4096..1073741824 (1 GiB), got %llu",
                (unsigned long long)c->aio_block_size);
        if (c->aio_queue_depth < 1 || c->aio_queue_depth > 128)
            BAD("aio.queue_depth must be 1..128, got %d", c->aio_queue_depth);
    }
    if (c->offload_optimizer_device == ZERO_OFFLOAD_NVME) {
        if (!memchr(c->offload_nvme_path, '\0', sizeof c->offload_nvme_path) || !c->offload_nvme_path[0])
            BAD("offload_optimizer.nvme_path must be set (an existing directory) for device nvme");
        if (c->offload_buffer_count < 3)
            BAD("offload_optimizer.buffer_count must be >= 3 (one read ahead, the chunk being updated, one "
                "write behind), got %d", c->offload_buffer_count);
        if (c->sub_group_size < 1) BAD("sub_group_size must be >= 1 element");
    }
#undef BAD
    return ZERO_OK;
}
