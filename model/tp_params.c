/* Tensor-parallel parameter shards: which slice of each full GPT tensor a tp
 * rank holds, and copying between the full tensor and the shard. */
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "tp_gpt.h"

zero_status tp_config_validate(const gpt_config *cfg, int tp_size)
{
    GPT_TRY(gpt_config_validate(cfg));
    if (cfg->moe_experts > 0 && tp_size > 1)
        return gpt_fail(ZERO_UNSUPPORTED, "tp config: moe experts = %d with tp size %d: MoE blocks run in the pipeline "
                        "stage runtime at tp 1 only (the experts are not split over tp; use expert parallelism)",
                        cfg->moe_experts, tp_size);
    if (tp_size < 1 || cfg->n_head % tp_size != 0)
        return gpt_fail(ZERO_CONFIG, "tp config: tp size %d does not divide n_head = %d (each tp rank takes whole heads)",
                        tp_size, cfg->n_head);
    return ZERO_OK;
}

static tp_split block_split(int index)
{
    switch (index) {
    case GPT_QKV_W:
    case GPT_QKV_B: return TP_SPLIT_QKV;
    case GPT_FC_W:
    case GPT_FC_B: return TP_SPLIT_OUT;
    case GPT_ATTPROJ_W:
    case GPT_FCPROJ_W: return TP_SPLIT_IN;
    default: return TP_REPLICATED; /* LayerNorms and the row-parallel biases */
    }
}

zero_status tp_param_info_get(const gpt_config *cfg, int tp_size, int tp_rank, size_t i, tp_param_info *out)
{
    if (!out) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_param_info_get: out is NULL");
    GPT_TRY(tp_config_validate(cfg, tp_size));
    if (tp_rank < 0 || tp_rank >= tp_size)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_param_info_get: tp rank %d outside [0, %d)", tp_rank, tp_size);
    memset(out, 0, sizeof *out);
    GPT_TRY(gpt_param_info_get(cfg, i, &out->full));
    const gpt_param_info *f = &out->full;
    int is_block = f->module > GPT_MODULE_EMBED && f->module < gpt_module_final(cfg);
    /* an expert stack (tp 1 only) is whole on the rank: its ep slicing is gpt_param_info's */
    out->split = is_block && !f->expert_stack ? block_split(f->index) : TP_REPLICATED;
    out->shape[0] = f->shape[0];
    out->shape[1] = f->shape[1];
    if (out->split == TP_SPLIT_IN) out->shape[1] /= (size_t)tp_size;
    else if (out->split != TP_REPLICATED) out->shape[0] /= (size_t)tp_size;
    out->numel = out->shape[0] * out->shape[1];
    return ZERO_OK;
}

void tp_shard_row(const tp_param_info *info, int tp_size, int tp_rank, size_t row, size_t *full_row, size_t *col0)
{
    const size_t rows = info->full.shape[0];
    *full_row = row;
    *col0 = 0;
    switch (info->split) {
    case TP_REPLICATED: break;
    case TP_SPLIT_IN: *col0 = (size_t)tp_rank * info->shape[1]; break;
    case TP_SPLIT_OUT: *full_row = (size_t)tp_rank * info->shape[0] + row; break;
    case TP_SPLIT_QKV: { /* three parts [q | k | v], each cut into tp_size row blocks */
        const size_t part_rows = rows / 3, h = part_rows / (size_t)tp_size;
        *full_row = row / h * part_rows + (size_t)tp_rank * h + row % h;
        break;
    }
    }
}

/* Shard row by shard row (tp_shard_row); to_full chooses the direction. */
static void copy_shard(const tp_param_info *info, int tp_size, int tp_rank, float *full, float *shard, int to_full)
{
    const size_t cols = info->full.shape[1], w = info->shape[1];
    if (info->split == TP_REPLICATED) { /* one block */
        if (to_full) memcpy(full, shard, sizeof(float) * info->numel);
        else memcpy(shard, full, sizeof(float) * info->numel);
        return;
    }
    for (size_t r = 0; r < info->shape[0]; r++) {
        size_t fr, c0;
        tp_shard_row(info, tp_size, tp_rank, r, &fr, &c0);
        float *f = full + fr * cols + c0, *sh = shard + r * w;
        if (to_full) memcpy(f, sh, sizeof(float) * w);
        else memcpy(sh, f, sizeof(float) * w);
    }
}

zero_status tp_param_init_range(const tp_param_info *info, int tp_size, int tp_rank, uint64_t seed, uint64_t begin,
                                uint64_t end, float *out)
{
    const zero_init_spec spec = gpt_param_init_spec(&info->full, seed);
    const size_t w = info->shape[1], cols = info->full.shape[1];
    /* each shard row is contiguous in the full tensor: one generate per row piece */
    for (uint64_t i = begin; i < end;) {
        const size_t r = (size_t)(i / w), c = (size_t)(i % w);
        const uint64_t n = end - i < w - c ? end - i : w - c;
        size_t fr, c0;
        tp_shard_row(info, tp_size, tp_rank, r, &fr, &c0);
        const uint64_t f = (uint64_t)fr * cols + c0 + c;
        zero_status st = zero_init_generate(&spec, info->full.name, f, f + n, out + (i - begin));
        if (st != ZERO_OK) return gpt_fail(st, "tp_param_init_range: %s: %s", info->full.name, zero_last_error());
        i += n;
    }
    return ZERO_OK;
}

void tp_param_slice(const tp_param_info *info, int tp_size, int tp_rank, const float *full, float *shard)
{
    copy_shard(info, tp_size, tp_rank, (float *)full, shard, 0);
}

void tp_param_unslice(const tp_param_info *info, int tp_size, int tp_rank, const float *shard, float *full)
{
    copy_shard(info, tp_size, tp_rank, full, (float *)shard, 1);
}

zero_status tp_param_gather(zero_comm *tp, const tp_param_info *info, const float *shard, float *full)
{
    if (!info || !shard || !full) return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_param_gather: NULL argument");
    int size = tp ? zero_comm_get_size(tp) : 1;
    if (info->split == TP_REPLICATED || size == 1) {
        if (size == 1 && info->numel != info->full.numel)
            return gpt_fail(ZERO_INVALID_ARGUMENT, "tp_param_gather: %s: a shard of %zu elements on a tp group of 1",
                            info->full.name, info->numel);
        memcpy(full, shard, sizeof(float) * info->full.numel);
        return ZERO_OK;
    }
    float *all = malloc(sizeof(float) * info->numel * (size_t)size);
    if (!all) return gpt_fail(ZERO_OUT_OF_MEMORY, "tp_param_gather: %s: no memory for %d shards", info->full.name, size);
    zero_status st = zero_allgather(tp, shard, all, info->numel, ZERO_F32);
    if (st != ZERO_OK) {
        free(all);
        return gpt_fail(st, "tp_param_gather: %s: %s", info->full.name, zero_comm_last_error(tp));
    }
    for (int r = 0; r < size; r++) tp_param_unslice(info, size, r, all + (size_t)r * info->numel, full);
    free(all);
    return ZERO_OK;
}
