/* Internal: the process-wide hwloc topology and the zero_topo handle. */
#ifndef ZERO_DEVICE_TOPO_INTERNAL_H
#define ZERO_DEVICE_TOPO_INTERNAL_H

#include <zero/topo.h>

#include "common/error.h"
#include "zero_build_config.h"

#if ZERO_HAVE_HWLOC
#include <hwloc.h>

/* Reference the shared topology of this machine, loading it on first use.
 * NULL (with the reason recorded on this thread and one warning logged) when
 * hwloc cannot load it; callers then run without topology. */
hwloc_topology_t zero_topo_shared_acquire(void);
void zero_topo_shared_release(void);

/* The PUs near CUDA device `ordinal` (only PUs in the topology); -1 when
 * unknown (no CUDA, no such device, not this system). */
int zero_topo_cuda_cpuset_(hwloc_topology_t t, int ordinal, hwloc_bitmap_t out);

struct zero_topo {
    hwloc_topology_t t;
    int shared;           /* 1: t is the shared topology (release, don't destroy) */
    int gpu_override;     /* number of entries in gpu_sets; 0: ask CUDA */
    hwloc_bitmap_t *gpu_sets;
    zero_errbuf err;
};

/* Number of GPUs the plan knows, and GPU i's near PUs. */
int zero_topo_gpu_count_(zero_topo *topo);
int zero_topo_gpu_set_(zero_topo *topo, int gpu, hwloc_bitmap_t out);
#else
struct zero_topo {
    zero_errbuf err;
};
#endif

#endif
