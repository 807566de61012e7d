/* A process's local rank and local size, read from whatever launched it.
 * Read from the environment (not from the collectives layer) so the device
 * and topology code below it can use it before any communicator exists. */
#include <stdlib.h>
#include <string.h>
#include <zero/topo.h>

#include "device_internal.h"

/* A non-negative decimal integer, or -1. */
static int env_int(const char *name)
{
    const char *s = getenv(name);
    if (!s || !*s) return -1;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v < 0 || v > 1 << 24) return -1;
    return (int)v;
}

/* SLURM_TASKS_PER_NODE reads like "4(x2),3": 4 tasks on each of the first two
 * nodes, then 3. Returns the count for node `node`, or -1. */
static int slurm_tasks_on_node(int node)
{
    const char *s = getenv("SLURM_TASKS_PER_NODE");
    if (!s || node < 0) return -1;
    while (*s) {
        char *end;
        long tasks = strtol(s, &end, 10);
        if (end == s || tasks <= 0) return -1;
        long repeat = 1;
        if (strncmp(end, "(x", 2) == 0) {
            char *rend;
            repeat = strtol(end + 2, &rend, 10);
            if (rend == end + 2 || *rend != ')' || repeat <= 0) return -1;
            end = rend + 1;
        }
        if (node < repeat) return (int)tasks;
        node -= (int)repeat;
        if (*end == ',') end++;
        else if (*end != '\0') return -1;
        s = end;
    }
    return -1;
}

void zero_local_rank_from_env(int *rank, int *size)
{
    static const char *const pairs[][2] = {
        {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"},
        {"MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
        {"PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"},
        {"LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    };
    int r = -1, n = -1;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0] && r < 0; i++) {
        r = env_int(pairs[i][0]);
        n = env_int(pairs[i][1]);
        if (r < 0 || n <= r) r = -1;
    }
    if (r < 0) {
        r = env_int("SLURM_LOCALID");
        n = env_int("SLURM_NTASKS_PER_NODE");
        if (n < 0) n = slurm_tasks_on_node(env_int("SLURM_NODEID"));
        if (r < 0 || n <= r) r = -1;
    }
    if (r < 0) {
        r = 0;
        n = 1;
    }
    if (rank) *rank = r;
    if (size) *size = n;
}

void zero_topo_local_rank(int *local_rank, int *local_size)
{
    zero_local_rank_from_env(local_rank, local_size);
}
