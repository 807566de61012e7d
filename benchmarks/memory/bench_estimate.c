/* zero-bench estimate: the ZeRO paper's memory formula without a run.
 *
 * Every number comes from the library's zero_memory_estimate (the same
 * function the engine's accounting is checked against), so there is one
 * formula, not a copy here. GB are 1e9 bytes, as in the paper. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cmds.h"
#include "bench_model.h"
#include "bench_util.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: zero-bench estimate --params N --dp N [--dtype fp16|bf16|fp32]\n"
            "                           [--optimizer adamw|sgd] [--momentum 0|1]\n"
            "                           [--json FILE] [--csv FILE]\n"
            "                           [--offload [--device-gb X] [--host-gb X] [--nvme-gb X]\n"
            "                            [--ranks-per-node N] [--sub-group N] [--bucket N]\n"
            "                            [--opt-buffers N] [--param-buffers N]]\n"
            "  Bytes per rank of params, grads and optimizer state for ZeRO stages 0-3\n"
            "  (default fp16 AdamW, the paper's mixed-precision Adam). --offload adds where\n"
            "  they live (device / host / NVMe) with offload_optimizer and offload_param\n"
            "  cpu|nvme, and whether that fits the capacities (device per rank, host and\n"
            "  NVMe per node, GB = 1e9 bytes; not given = not limited). Defaults: DeepSpeed's\n"
            "  sub_group_size 1e9, reduce_bucket_size 5e8, buffer_count 4 and 5,\n"
            "  ranks per node = min(dp, 8).\n");
}

int bench_cmd_estimate(int argc, char **argv)
{
    double params = 7.5e9, dp = 64;
    zero_dtype dtype = ZERO_F16;
    zero_optimizer_kind opt = ZERO_OPTIM_ADAMW;
    int momentum = 1;
    const char *json_path = NULL, *csv_path = NULL;
    int offload = 0;
    double sub_group = 1e9, bucket = 5e8, opt_buffers = 4, param_buffers = 5, rpn = 0, dev_gb = 0, host_gb = 0,
           nvme_gb = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        } else if (!strcmp(a, "--offload")) {
            offload = 1;
            continue;
        } else if (!v) {
            bad = 1;
        } else if (!strcmp(a, "--params")) {
            bad = bench_parse_count(v, &params) || params < 1;
        } else if (!strcmp(a, "--dp")) {
            bad = bench_parse_count(v, &dp) || dp < 1 || dp > 1e7 || dp != (double)(int)dp;
        } else if (!strcmp(a, "--dtype")) {
            bad = bench_parse_dtype(v, &dtype);
        } else if (!strcmp(a, "--optimizer")) {
            if (!strcmp(v, "adamw")) opt = ZERO_OPTIM_ADAMW;
            else if (!strcmp(v, "sgd")) opt = ZERO_OPTIM_SGD;
            else bad = 1;
        } else if (!strcmp(a, "--momentum")) {
            momentum = atoi(v) != 0;
        } else if (!strcmp(a, "--sub-group")) {
            bad = bench_parse_count(v, &sub_group) || sub_group < 1;
        } else if (!strcmp(a, "--bucket")) {
            bad = bench_parse_count(v, &bucket) || bucket < 1;
        } else if (!strcmp(a, "--opt-buffers")) {
            bad = bench_parse_count(v, &opt_buffers) || opt_buffers < 3 || opt_buffers > 1024;
        } else if (!strcmp(a, "--param-buffers")) {
            bad = bench_parse_count(v, &param_buffers) || param_buffers < 2 || param_buffers > 1024;
        } else if (!strcmp(a, "--ranks-per-node")) {
            bad = bench_parse_count(v, &rpn) || rpn < 1 || rpn > 1e6;
        } else if (!strcmp(a, "--device-gb")) {
            bad = bench_parse_count(v, &dev_gb);
        } else if (!strcmp(a, "--host-gb")) {
            bad = bench_parse_count(v, &host_gb);
        } else if (!strcmp(a, "--nvme-gb")) {
            bad = bench_parse_count(v, &nvme_gb);
        } else if (!strcmp(a, "--json")) {
            json_path = v;
        } else if (!strcmp(a, "--csv")) {
            csv_path = v;
        } else {
            bad = 1;
        }
        if (bad) {
            fprintf(stderr, "zero-bench estimate: bad or incomplete option '%s'\n", a);
            usage();
            return 2;
        }
        i++;
    }

    const uint64_t numel = (uint64_t)(params + 0.5);
    zero_memory_report r[4];
    for (int s = 0; s < 4; s++)
        if (bench_failed(zero_memory_estimate(numel, (int)dp, s, dtype, opt, momentum, &r[s]), "estimate"))
            return 1;

    printf("ZeRO memory per rank: %.4g parameters, dp %d, %s compute, %s%s\n", (double)numel, (int)dp,
           zero_dtype_name(dtype), opt == ZERO_OPTIM_ADAMW ? "AdamW" : "SGD",
           opt == ZERO_OPTIM_SGD ? (momentum ? " with momentum" : " without momentum") : "");
    printf("%-6s %12s %12s %12s %12s %12s %12s\n", "stage", "params GB", "grads GB", "master GB",
           "moments GB", "total GB", "total GiB");
    for (int s = 0; s < 4; s++)
        printf("%-6d %12.3f %12.3f %12.3f %12.3f %12.3f %12.3f\n", s,
               r[s].bytes[ZERO_MEM_PARAMS] / BENCH_GB, r[s].bytes[ZERO_MEM_GRADS] / BENCH_GB,
               r[s].bytes[ZERO_MEM_MASTER] / BENCH_GB, r[s].bytes[ZERO_MEM_MOMENTS] / BENCH_GB,
               r[s].total / BENCH_GB, r[s].total / BENCH_GIB);

    bench_offload_in oin = {numel, (int)dp, dtype, opt, momentum, (uint64_t)sub_group, (uint64_t)bucket,
                            (int)opt_buffers, (int)param_buffers, rpn > 0 ? (int)rpn : (dp < 8 ? (int)dp : 8),
                            dev_gb * BENCH_GB, host_gb * BENCH_GB, nvme_gb * BENCH_GB};
    if (offload && !json_path && bench_offload_table(&oin, NULL) != 0) {
        fprintf(stderr, "zero-bench estimate: the offload estimate failed\n");
        return 1;
    }
    if (json_path) {
        json_t *root = json_object(), *stages = json_array();
        if (offload && bench_offload_table(&oin, root) != 0) {
            fprintf(stderr, "zero-bench estimate: the offload estimate failed\n");
            json_decref(root);
            json_decref(stages);
            return 1;
        }
        json_object_set_new(root, "benchmark", json_string("estimate"));
        json_object_set_new(root, "params", json_integer((json_int_t)numel));
        json_object_set_new(root, "dp", json_integer((json_int_t)dp));
        json_object_set_new(root, "dtype", json_string(zero_dtype_name(dtype)));
        json_object_set_new(root, "optimizer", json_string(opt == ZERO_OPTIM_ADAMW ? "adamw" : "sgd"));
        for (int s = 0; s < 4; s++) {
            json_t *st = json_object(), *bytes = json_object();
            for (int c = 0; c < ZERO_MEM_CATEGORY_COUNT; c++)
                json_object_set_new(bytes, zero_mem_category_name((zero_mem_category)c),
                                    json_integer((json_int_t)r[s].bytes[c]));
            json_object_set_new(st, "stage", json_integer(s));
            json_object_set_new(st, "bytes", bytes);
            json_object_set_new(st, "total_bytes", json_integer((json_int_t)r[s].total));
            json_object_set_new(st, "total_gb", json_real(r[s].total / BENCH_GB));
            json_object_set_new(st, "total_gib", json_real(r[s].total / BENCH_GIB));
            json_array_append_new(stages, st);
        }
        json_object_set_new(root, "stages", stages);
        int rc = json_dump_file(root, json_path, JSON_INDENT(2));
        json_decref(root);
        if (rc) {
            fprintf(stderr, "zero-bench estimate: cannot write %s\n", json_path);
            return 1;
        }
    }
    if (csv_path) {
        FILE *f = fopen(csv_path, "w");
        if (!f) {
            fprintf(stderr, "zero-bench estimate: cannot write %s\n", csv_path);
            return 1;
        }
        fprintf(f, "stage,category,bytes\n");
        for (int s = 0; s < 4; s++)
            for (int c = 0; c < ZERO_MEM_CATEGORY_COUNT; c++)
                fprintf(f, "%d,%s,%llu\n", s, zero_mem_category_name((zero_mem_category)c),
                        (unsigned long long)r[s].bytes[c]);
        fclose(f);
    }
    return 0;
}
