/* zero-bench subcommands: each takes the arguments after its name and
 * returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef ZERO_BENCH_CMDS_H
#define ZERO_BENCH_CMDS_H

int bench_cmd_estimate(int argc, char **argv);
int bench_cmd_memory(int argc, char **argv);
int bench_cmd_steptime(int argc, char **argv);
int bench_cmd_stepcost(int argc, char **argv);
int bench_cmd_overlap(int argc, char **argv);
int bench_cmd_offload(int argc, char **argv);

/* estimate --offload (bench_estimate_offload.c): where each stage's state
 * lives with DeepSpeed's offload settings; the formula is in that file and in
 * docs/memory.md. */
#include <jansson.h>
#include <stdint.h>
#include <zero/zero.h>

enum { BENCH_OFFLOAD_SETTINGS = 5 }; /* none, opt cpu, opt nvme, opt+param cpu, opt+param nvme */

typedef struct bench_offload_in {
    uint64_t numel;
    int dp;
    zero_dtype dtype;
    zero_optimizer_kind opt;
    int momentum;
    uint64_t sub_group;       /* sub_group_size (elements) */
    uint64_t bucket;          /* reduce_bucket_size (elements) */
    int opt_buffers;          /* offload_optimizer.buffer_count */
    int param_buffers;        /* offload_param.buffer_count */
    int ranks_per_node;
    double device_cap, host_cap, nvme_cap; /* bytes; <= 0: not limited */
} bench_offload_in;

typedef struct bench_offload_row {
    int stage, setting, valid; /* valid 0: the engine refuses this setting at this stage */
    const char *name;
    uint64_t device, host, nvme; /* bytes per rank */
    int fits_device, fits_host, fits_nvme;
} bench_offload_row;

/* One (stage, setting) cell; -1 if the library's estimate fails. */
int bench_offload_place(const bench_offload_in *in, int stage, int setting, bench_offload_row *out);
/* Print the table of every stage x setting and, when root is not NULL, add
 * it to the JSON as "offload". -1 on failure. */
int bench_offload_table(const bench_offload_in *in, json_t *root);

#endif
