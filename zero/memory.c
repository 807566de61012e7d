/* The memory report (a reading of the accounting allocator's books) and the
 * ZeRO paper's formula it is compared with. */
#include <string.h>

#include <zero/offload.h>

#include "engine_internal.h"

zero_status zero_engine_get_memory_report(const zero_engine *e, zero_memory_report *out)
{
    if (!e || !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine memory_report: NULL argument");
    memset(out, 0, sizeof *out);
    for (int c = 0; c < ZERO_MEM_CATEGORY_COUNT; c++) {
        out->bytes[c] = e->books.bytes[c];
        out->peak[c] = e->books.peak[c];
    }
    out->total = e->books.total;
    out->peak_total = e->books.peak_total;
    return ZERO_OK;
}

const char *zero_mem_category_name(zero_mem_category category)
{
    static const char *const names[ZERO_MEM_CATEGORY_COUNT] = {
        [ZERO_MEM_PARAMS] = "params",   [ZERO_MEM_GRADS] = "grads",   [ZERO_MEM_MASTER] = "master",
        [ZERO_MEM_MOMENTS] = "moments", [ZERO_MEM_BUFFERS] = "buffers", [ZERO_MEM_OTHER] = "other",
        [ZERO_MEM_CACHE] = "cache",
    };
    return (unsigned)category < ZERO_MEM_CATEGORY_COUNT ? names[category] : "unknown";
}

zero_status zero_memory_estimate(uint64_t numel, int dp, int stage, zero_dtype dtype, zero_optimizer_kind optimizer,
                                 int sgd_momentum, zero_memory_report *out)
{
    if (!out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_memory_estimate: out is NULL");
    memset(out, 0, sizeof *out);
    if (dp < 1) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_memory_estimate: dp must be >= 1, got %d", dp);
    if (stage < 0 || stage > 3)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_memory_estimate: stage must be 0..3, got %d", stage);
    if (dtype != ZERO_F32 && dtype != ZERO_BF16 && dtype != ZERO_F16)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_memory_estimate: dtype must be f32, bf16 or f16");
    if (optimizer != ZERO_OPTIM_ADAMW && optimizer != ZERO_OPTIM_SGD)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_memory_estimate: unknown optimizer %d", (int)optimizer);
    const double n = (double)dp;
    const double P = (double)numel;
    const double d = (double)zero_dtype_size(dtype);
    const double master = dtype == ZERO_F32 ? 0.0 : 4.0; /* fp32 params are their own master */
    const double moments = optimizer == ZERO_OPTIM_ADAMW ? 8.0 : (sgd_momentum ? 4.0 : 0.0);
    /* Divide after multiplying, so padded counts (multiples of dp) give exact bytes. */
    out->bytes[ZERO_MEM_PARAMS] = (uint64_t)(stage >= 3 ? P * d / n : P * d);
    out->bytes[ZERO_MEM_GRADS] = (uint64_t)(stage >= 2 ? P * d / n : P * d);
    out->bytes[ZERO_MEM_MASTER] = (uint64_t)(stage >= 1 ? P * master / n : P * master);
    out->bytes[ZERO_MEM_MOMENTS] = (uint64_t)(stage >= 1 ? P * moments / n : P * moments);
    for (int c = 0; c < ZERO_MEM_CATEGORY_COUNT; c++) {
        out->peak[c] = out->bytes[c];
        out->total += out->bytes[c];
    }
    out->peak_total = out->total;
    return ZERO_OK;
}

zero_status zero_engine_get_stats(const zero_engine *e, zero_engine_stats *out)
{
    if (!e || !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine get_stats: NULL argument");
    *out = e->stats;
    return ZERO_OK;
}

zero_status zero_engine_get_offload_report(const zero_engine *e, zero_offload_report *out)
{
    if (!e || !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine offload_report: NULL argument");
    memset(out, 0, sizeof *out);
    out->device = e->cfg.offload_optimizer_device;
    if (!e->finalized || out->device == ZERO_OFFLOAD_NONE) return ZERO_OK;
    zero_engine *me = (zero_engine *)e; /* the pool and store calls take non-const handles; they only read */
    if (me->off_pool) {
        zero_host_pool_stats ps;
        if (zero_host_pool_get_stats(me->off_pool, &ps) != ZERO_OK)
            return zero_fail(&me->err, ZERO_INTERNAL, "engine offload_report: %s",
                             zero_host_pool_last_error(me->off_pool));
        out->host_bytes = ps.in_use;
        out->host_peak = ps.peak_in_use;
        out->host_capacity = ps.capacity;
    }
    if (me->off_store) {
        zero_nvme_store_info si;
        if (zero_nvme_store_get_info(me->off_store, &si) != ZERO_OK)
            return zero_fail(&me->err, ZERO_INTERNAL, "engine offload_report: %s",
                             zero_nvme_store_last_error(me->off_store));
        out->nvme_bytes = si.used;
        out->nvme_written = si.bytes_written;
        out->nvme_read = si.bytes_read;
        out->buffer_count = e->cfg.offload_buffer_count;
    }
    out->chunk_numel = e->off_chunk_numel;
    out->num_chunks = e->off_num_chunks;
    out->states = e->off_states;
    return ZERO_OK;
}
