/* Machine topology and CPU binding, through hwloc.
 *
 * The topology is loaded once per process and shared by every zero_topo
 * handle (and by the device layer's NUMA-local allocator) while any of them
 * is open. Binding gives each local rank (the ranks of one job on one node)
 * its own cores near its GPU, or near its NUMA node without one, so ranks do
 * not fight over cores and host buffers stay on the near memory.
 *
 * Nothing here is fatal: a binding that cannot be made is reported with one
 * warning (zero_log) and the rank runs unbound. Built without hwloc, every
 * call returns ZERO_UNSUPPORTED; callers treat that as "run unbound".
 *
 * CPU sets are strings in the list syntax of taskset(1) and hwloc
 * ("0-3,8-11"), naming operating-system PU (hardware thread) numbers. */
#ifndef ZERO_TOPO_H
#define ZERO_TOPO_H

#ifndef ZERO_EXPERIMENTAL
#error "zero/topo.h is part of libzero's experimental surface: include zero/experimental.h with ZERO_EXPERIMENTAL defined (docs/abi.md)"
#endif

#include <stddef.h>
#include <zero/export.h>
#include <zero/status.h>

ZERO_EXTERN_C_BEGIN

typedef struct zero_topo zero_topo;

typedef struct zero_topo_summary {
    int packages;       /* sockets */
    int numa_nodes;
    int cores;          /* physical cores this process may use */
    int pus;            /* hardware threads this process may use */
    int gpus;           /* CUDA devices (or the count set by zero_topo_set_gpu_cpusets) */
    int is_this_system; /* 0 for a synthetic topology: binding is then refused */
} zero_topo_summary;

#define ZERO_TOPO_CPUSET_MAX 1024

typedef struct zero_topo_binding {
    char cpuset[ZERO_TOPO_CPUSET_MAX]; /* the PUs of the chosen cores */
    int cores;     /* how many cores */
    int domain;    /* the GPU ordinal or NUMA node they are near; -1: the whole machine */
    int near_gpu;  /* 1 when `domain` is a GPU ordinal */
    int exclusive; /* 1 when no other local rank's plan shares a core */
    int bound;     /* zero_topo_bind only: 1 when the binding took effect */
} zero_topo_binding;

typedef enum zero_topo_bind_scope {
    ZERO_TOPO_BIND_THREAD = 0,  /* the calling thread (and threads it creates later) */
    ZERO_TOPO_BIND_PROCESS = 1, /* every thread of the process */
} zero_topo_bind_scope;

/* Open a handle on this machine's topology (loaded on first use, then shared). */
ZERO_API zero_status zero_topo_create(zero_topo **out);
/* A handle on an invented topology in hwloc's synthetic syntax, e.g.
 * "pack:2 numa:2 core:8 pu:2", for tests and for planning other machines.
 * It owns its own hwloc topology; binding with it is refused (warned). */
ZERO_API zero_status zero_topo_create_synthetic(zero_topo **out, const char *description);
ZERO_API void zero_topo_destroy(zero_topo *topo); /* NULL accepted */
ZERO_API const char *zero_topo_last_error(const zero_topo *topo);

ZERO_API zero_status zero_topo_get_summary(zero_topo *topo, zero_topo_summary *out);
/* The PUs of NUMA node `node` (0 .. numa_nodes-1, hwloc logical order). */
ZERO_API zero_status zero_topo_numa_cpuset(zero_topo *topo, int node, char *buf, size_t len);
/* The PUs near GPU `gpu` (hwloc_cudart_get_device_cpuset, limited to the PUs
 * this process may use). ZERO_NOT_FOUND for a GPU that does not exist. */
ZERO_API zero_status zero_topo_gpu_cpuset(zero_topo *topo, int gpu, char *buf, size_t len);
/* Replace the GPU locality hwloc found with `count` CPU sets (GPU i is near
 * cpusets[i]): for machines whose firmware reports none (some VMs), and for
 * testing GPU-aware plans without a GPU. count 0 restores what hwloc found. */
ZERO_API zero_status zero_topo_set_gpu_cpusets(zero_topo *topo, int count, const char *const *cpusets);

/* The cores local rank `local_rank` of `local_size` should use. A pure
 * function of the topology and its arguments, so every local rank computes
 * the same plan for all of them without talking to each other.
 *
 * gpu >= 0: the rank drives that GPU; the other ranks are assumed to drive
 * GPU (r % gpus), as zero_device_create(ZERO_DEVICE_CUDA, -1) picks. Ranks near
 * the same GPU/NUMA domain split its cores evenly. gpu = -1: rank r is placed
 * on NUMA node r * numa_nodes / local_size. When some domain has fewer cores
 * than ranks (or domains partly overlap), every rank instead gets an even
 * slice of all cores; with fewer cores than ranks, cores are shared and
 * `exclusive` is 0. */
ZERO_API zero_status zero_topo_plan_binding(zero_topo *topo, int local_rank, int local_size, int gpu,
                                            zero_topo_binding *out);
/* Plan as above and bind. Never fails for want of a binding: if it cannot
 * be made, it warns once, leaves the rank unbound, returns ZERO_OK with
 * out->bound = 0. Errors are for bad arguments only. `out` may be NULL. */
ZERO_API zero_status zero_topo_bind(zero_topo *topo, int local_rank, int local_size, int gpu,
                                    zero_topo_bind_scope scope, zero_topo_binding *out);

/* This process's rank among the ranks of its job on this node, and their
 * number, from the launcher's environment: Open MPI (OMPI_COMM_WORLD_LOCAL_*),
 * Slurm (SLURM_LOCALID, SLURM_TASKS_PER_NODE), MPICH/Hydra (MPI_LOCALRANKID,
 * MPI_LOCALNRANKS), MVAPICH2, PMI, torchrun (LOCAL_RANK, LOCAL_WORLD_SIZE).
 * 0 and 1 when none is set. Either pointer may be NULL. */
ZERO_API void zero_topo_local_rank(int *local_rank, int *local_size);

ZERO_EXTERN_C_END

#endif
