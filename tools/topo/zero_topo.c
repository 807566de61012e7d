/* zero-topo: what libzero sees of this machine, and where each local rank
 * would be bound.
 *
 *   zero-topo [--local-size N] [--no-gpu] [--synthetic DESC] [--gpu-cpusets 'LIST;LIST;...']
 *
 * --local-size   ranks per node to plan for (default: the launcher's local
 *                size from the environment, else 1)
 * --no-gpu       plan near NUMA nodes even when GPUs are present
 * --synthetic    plan for an invented machine, in hwloc's synthetic syntax
 *                ("pack:2 numa:2 core:16 pu:2")
 * --gpu-cpusets  GPU i is near the i-th CPU list (overrides hwloc's answer) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/log.h>
#include <zero/topo.h>
#include <zero/version.h>
#include <zero/experimental.h>

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--local-size N] [--no-gpu] [--synthetic DESC] [--gpu-cpusets 'LIST;LIST;...']\n",
            argv0);
    return 2;
}

static int fail(const char *what)
{
    fprintf(stderr, "zero-topo: %s: %s\n", what, zero_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    int local_rank, local_size;
    zero_topo_local_rank(&local_rank, &local_size);
    const char *synthetic = NULL, *gpu_lists = NULL;
    int use_gpu = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--local-size") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 65536) return usage(argv[0]);
            local_size = (int)v;
        } else if (!strcmp(argv[i], "--synthetic") && i + 1 < argc) {
            synthetic = argv[++i];
        } else if (!strcmp(argv[i], "--gpu-cpusets") && i + 1 < argc) {
            gpu_lists = argv[++i];
        } else if (!strcmp(argv[i], "--no-gpu")) {
            use_gpu = 0;
        } else {
            return usage(argv[0]);
        }
    }
    zero_set_log_handler(zero_log_to_stderr, ZERO_LOG_WARN, NULL);

    zero_topo *topo = NULL;
    if ((synthetic ? zero_topo_create_synthetic(&topo, synthetic) : zero_topo_create(&topo)) != ZERO_OK)
        return fail("loading the topology");
    if (gpu_lists) {
        char *copy = strdup(gpu_lists), *save = NULL;
        const char *lists[256];
        int n = 0;
        for (char *tok = strtok_r(copy, ";", &save); tok && n < 256; tok = strtok_r(NULL, ";", &save))
            lists[n++] = tok;
        zero_status st = zero_topo_set_gpu_cpusets(topo, n, lists);
        free(copy);
        if (st != ZERO_OK) {
            zero_topo_destroy(topo);
            return fail("--gpu-cpusets");
        }
    }

    zero_topo_summary s;
    if (zero_topo_get_summary(topo, &s) != ZERO_OK) return fail("summary");
    printf("libzero %s topology (%s)\n", zero_version_string(), synthetic ? synthetic : "this machine");
    printf("  packages %d, NUMA nodes %d, cores %d, PUs %d, GPUs %d\n", s.packages, s.numa_nodes, s.cores, s.pus,
           s.gpus);
    char buf[ZERO_TOPO_CPUSET_MAX];
    for (int i = 0; i < s.numa_nodes; i++)
        if (zero_topo_numa_cpuset(topo, i, buf, sizeof buf) == ZERO_OK) printf("  NUMA node %d: PUs %s\n", i, buf);
    for (int g = 0; g < s.gpus; g++) {
        if (zero_topo_gpu_cpuset(topo, g, buf, sizeof buf) == ZERO_OK) printf("  GPU %d: near PUs %s\n", g, buf);
        else printf("  GPU %d: locality unknown (%s)\n", g, zero_last_error());
    }

    int gpus = use_gpu ? s.gpus : 0;
    printf("binding plan for %d local rank%s (near %s)\n", local_size, local_size == 1 ? "" : "s",
           gpus ? "each rank's GPU, rank r -> GPU r % gpus" : "NUMA nodes");
    int rc = 0;
    for (int r = 0; r < local_size; r++) {
        zero_topo_binding b;
        if (zero_topo_plan_binding(topo, r, local_size, gpus ? r % gpus : -1, &b) != ZERO_OK) {
            rc = fail("plan");
            break;
        }
        char where[64];
        if (b.domain < 0) snprintf(where, sizeof where, "whole machine");
        else snprintf(where, sizeof where, "near %s %d", b.near_gpu ? "GPU" : "NUMA node", b.domain);
        printf("  local rank %d: PUs %s (%d core%s, %s, %s)\n", r, b.cpuset, b.cores, b.cores == 1 ? "" : "s",
               where, b.exclusive ? "exclusive" : "shared");
    }
    zero_topo_destroy(topo);
    return rc;
}
