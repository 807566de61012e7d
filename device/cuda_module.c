/* libzero-cuda: the table libzero calls CUDA through (cuda_module.h). This
 * file and the kernels are the whole module; it links the CUDA runtime, NCCL
 * and hwloc, and needs nothing from libzero (linked with -z defs). */
#include "device/cuda_module.h"

#include <zero/version.h>

#if ZERO_HAVE_HWLOC
#include <hwloc.h>
#include <hwloc/cudart.h>
#endif

int zero_cuda_topo_cpuset(void *topology, int ordinal, void *cpuset)
{
#if ZERO_HAVE_HWLOC
    hwloc_topology_t t = topology;
    hwloc_bitmap_t out = cpuset;
    if (hwloc_cudart_get_device_cpuset(t, ordinal, out) != 0) return -1;
    return 0;
#else
    (void)topology;
    (void)ordinal;
    (void)cpuset;
    return -1;
#endif
}

#define ZERO_CUDA_MODULE_INIT_(ret, name, params) .name = name,

/* The one exported symbol (ZERO_CUDA_MODULE_SYMBOL): everything else is hidden. */
__attribute__((visibility("default"))) const zero_cuda_module zero_cuda_module_table = {
    .size = sizeof(zero_cuda_module),
    .version = ZERO_VERSION,
    ZERO_CUDA_RUNTIME_FUNCS(ZERO_CUDA_MODULE_INIT_)
    ZERO_CUDA_NCCL_FUNCS(ZERO_CUDA_MODULE_INIT_)
    ZERO_CUDA_OWN_FUNCS(ZERO_CUDA_MODULE_INIT_)
};
