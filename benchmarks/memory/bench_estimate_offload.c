/* zero-bench estimate --offload: where the training state of each ZeRO stage
 * lives with DeepSpeed's offload settings (device / host / NVMe bytes per
 * rank and per node), and whether it fits given capacities.
 *
 * The in-device terms are the library's zero_memory_estimate (one formula);
 * this file only moves terms between places and adds the offload staging the
 * engine declares (include/zero/engine.h, docs/engine.md). The formula, as
 * docs/memory.md writes it, with S = the per-rank shard terms of the library:
 *
 *   optimizer offload (stages 1-3): master + moments leave the device;
 *     offloaded O = 4 B x shard (a master is always kept, fp32 compute too)
 *                 + the moments of the shard;
 *     cpu  -> host += O
 *     nvme -> nvme += O, host += (buffer_count + 1) x roundup(O_chunk, 4096),
 *             O_chunk = O's bytes per element x min(sub_group_size, shard elements)
 *   parameter offload (stage 3): the d-byte parameter shard leaves the device;
 *     cpu  -> host += it
 *     nvme -> nvme += it, host += param_buffer_count x roundup(d x C, 4096),
 *             C = ceil(min(reduce_bucket_size, params) / dp) (bounded buckets)
 *
 * Per node = per rank x ranks per node. GB are 1e9 bytes. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "bench_cmds.h"
#include "bench_util.h"

static uint64_t roundup4k(uint64_t x) { return (x + 4095) / 4096 * 4096; }

static const char *const setting_names[BENCH_OFFLOAD_SETTINGS] = {
    "none", "opt cpu", "opt nvme", "opt+param cpu", "opt+param nvme"};

/* 1 if the setting applies to the stage (the engine refuses the others). */
static int applies(int setting, int stage)
{
    if (setting == 0) return 1;
    if (setting <= 2) return stage >= 1;
    return stage == 3;
}

int bench_offload_place(const bench_offload_in *in, int stage, int setting, bench_offload_row *out)
{
    memset(out, 0, sizeof *out);
    out->stage = stage;
    out->setting = setting;
    out->name = setting_names[setting];
    if (!applies(setting, stage)) return 0;
    zero_memory_report r, bf;
    if (zero_memory_estimate(in->numel, in->dp, stage, in->dtype, in->opt, in->momentum, &r) != ZERO_OK) return -1;
    /* the fp32 master of the optimizer's shard: the 16-bit formula's master term */
    if (zero_memory_estimate(in->numel, in->dp, stage, ZERO_BF16, in->opt, in->momentum, &bf) != ZERO_OK) return -1;
    uint64_t dev[4] = {r.bytes[ZERO_MEM_PARAMS], r.bytes[ZERO_MEM_GRADS], r.bytes[ZERO_MEM_MASTER],
                       r.bytes[ZERO_MEM_MOMENTS]};
    uint64_t host = 0, nvme = 0;
    uint64_t shard = (in->numel + (uint64_t)in->dp - 1) / (uint64_t)in->dp;
    if (setting >= 1) {
        uint64_t o = bf.bytes[ZERO_MEM_MASTER] + r.bytes[ZERO_MEM_MOMENTS];
        dev[2] = dev[3] = 0;
        int nv = setting == 2 || setting == 4;
        if (nv) {
            uint64_t per_elem = 4 + (shard ? (r.bytes[ZERO_MEM_MOMENTS] + shard - 1) / shard : 0);
            uint64_t chunk = in->sub_group < shard ? in->sub_group : shard;
            nvme += o;
            host += (uint64_t)(in->opt_buffers + 1) * roundup4k(per_elem * chunk);
        } else {
            host += o;
        }
    }
    if (setting >= 3) {
        uint64_t p = dev[0];
        dev[0] = 0;
        if (setting == 4) {
            uint64_t bucket = in->bucket < in->numel ? in->bucket : in->numel;
            uint64_t c = (bucket + (uint64_t)in->dp - 1) / (uint64_t)in->dp;
            nvme += p;
            host += (uint64_t)in->param_buffers * roundup4k((uint64_t)zero_dtype_size(in->dtype) * c);
        } else {
            host += p;
        }
    }
    out->valid = 1;
    out->device = dev[0] + dev[1] + dev[2] + dev[3];
    out->host = host;
    out->nvme = nvme;
    out->fits_device = in->device_cap <= 0 || (double)out->device <= in->device_cap;
    out->fits_host = in->host_cap <= 0 || (double)host * in->ranks_per_node <= in->host_cap;
    out->fits_nvme = in->nvme_cap <= 0 || (double)nvme * in->ranks_per_node <= in->nvme_cap;
    return 0;
}

int bench_offload_table(const bench_offload_in *in, json_t *root)
{
    char cap[3][32];
    const double caps[3] = {in->device_cap, in->host_cap, in->nvme_cap};
    for (int i = 0; i < 3; i++)
        if (caps[i] > 0) snprintf(cap[i], sizeof cap[i], "%.3f GB", caps[i] / BENCH_GB);
        else snprintf(cap[i], sizeof cap[i], "not limited");
    printf("\nWhere it lives, per rank (host and NVMe also per node, %d ranks per node); capacities: device %s per "
           "rank, host %s and NVMe %s per node\n", in->ranks_per_node, cap[0], cap[1], cap[2]);
    printf("%-6s %-15s %12s %12s %12s %12s %12s  %s\n", "stage", "offload", "device GB", "host GB", "NVMe GB",
           "host/node", "NVMe/node", "fits");
    json_t *rows = json_array();
    for (int s = 0; s < 4; s++)
        for (int k = 0; k < BENCH_OFFLOAD_SETTINGS; k++) {
            bench_offload_row r;
            if (bench_offload_place(in, s, k, &r) != 0) {
                json_decref(rows);
                return -1;
            }
            if (!r.valid) continue;
            int fits = r.fits_device && r.fits_host && r.fits_nvme;
            printf("%-6d %-15s %12.3f %12.3f %12.3f %12.3f %12.3f  %s%s%s%s\n", s, r.name, r.device / BENCH_GB,
                   r.host / BENCH_GB, r.nvme / BENCH_GB, r.host * (double)in->ranks_per_node / BENCH_GB,
                   r.nvme * (double)in->ranks_per_node / BENCH_GB, fits ? "yes" : "no:",
                   r.fits_device ? "" : " device", r.fits_host ? "" : " host", r.fits_nvme ? "" : " nvme");
            json_t *o = json_object();
            json_object_set_new(o, "stage", json_integer(s));
            json_object_set_new(o, "offload", json_string(r.name));
            json_object_set_new(o, "device_bytes", json_integer((json_int_t)r.device));
            json_object_set_new(o, "host_bytes", json_integer((json_int_t)r.host));
            json_object_set_new(o, "nvme_bytes", json_integer((json_int_t)r.nvme));
            json_object_set_new(o, "fits_device", json_boolean(r.fits_device));
            json_object_set_new(o, "fits_host", json_boolean(r.fits_host));
            json_object_set_new(o, "fits_nvme", json_boolean(r.fits_nvme));
            json_object_set_new(o, "fits", json_boolean(fits));
            json_array_append_new(rows, o);
        }
    if (root) {
        json_t *p = json_object();
        json_object_set_new(p, "ranks_per_node", json_integer(in->ranks_per_node));
        json_object_set_new(p, "device_capacity", json_real(in->device_cap));
        json_object_set_new(p, "host_capacity", json_real(in->host_cap));
        json_object_set_new(p, "nvme_capacity", json_real(in->nvme_cap));
        json_object_set_new(p, "sub_group_size", json_integer((json_int_t)in->sub_group));
        json_object_set_new(p, "reduce_bucket_size", json_integer((json_int_t)in->bucket));
        json_object_set_new(p, "opt_buffer_count", json_integer(in->opt_buffers));
        json_object_set_new(p, "param_buffer_count", json_integer(in->param_buffers));
        json_object_set_new(p, "rows", rows);
        json_object_set_new(root, "offload", p);
    } else {
        json_decref(rows);
    }
    return 0;
}
