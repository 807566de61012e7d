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
            "  Bytes per rank of params, grads and optimizer state for ZeRO stages 0-3\n"
            "  (default fp16 AdamW, the paper's mixed-precision Adam).\n");
}

int bench_cmd_estimate(int argc, char **argv)
{
    double params = 7.5e9, dp = 64;
    zero_dtype dtype = ZERO_F16;
    zero_optimizer_kind opt = ZERO_OPTIM_ADAMW;
    int momentum = 1;
    const char *json_path = NULL, *csv_path = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
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

    if (json_path) {
        json_t *root = json_object(), *stages = json_array();
        json_object_set_new(root, "benchmark", json_string("estimate"));
        json_object_set_new(root, "params", json_integer((json_int_t)numel));
        json_object_set_new(root, "dp", json_integer((json_int_t)dp));
        json_object_set_new(root, "dtype", json_string(zero_dtype_name(dtype)));
        json_object_set_new(root, "optimizer", json_string(opt == ZERO_OPTIM_ADAMW ? "adamw" : "sgd"));
        for (int s = 0; s < 4; s++) {
            json_t *st = json_object(), *bytes = json_object();
            for (int c = 0; c < ZERO_MEM_CATEGORY_COUNT; c++)
                json_object_set_new(bytes, bench_category_names[c], json_integer((json_int_t)r[s].bytes[c]));
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
                fprintf(f, "%d,%s,%llu\n", s, bench_category_names[c], (unsigned long long)r[s].bytes[c]);
        fclose(f);
    }
    return 0;
}
