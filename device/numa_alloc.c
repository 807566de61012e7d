/* Host memory on the NUMA node nearest the device: the GPU's node for CUDA
 * (then page-locked so DMA can reach it), the calling thread's node for the
 * CPU device. Placement is an optimisation, never a requirement: where it
 * cannot be had we warn once and hand out ordinary page-aligned memory. */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "device_internal.h"
#include "topo_internal.h"

static atomic_int numa_warned, register_warned;

#define WARN_ONCE(flag, ...)                                   \
    do {                                                       \
        if (!atomic_exchange(&(flag), 1)) zero_log(ZERO_LOG_WARN, __VA_ARGS__); \
    } while (0)

#if ZERO_HAVE_HWLOC
/* The PUs whose NUMA node should hold this device's host buffers. */
static int near_cpuset(zero_device *dev, hwloc_topology_t t, hwloc_bitmap_t set)
{
    if (dev->kind == ZERO_DEVICE_CUDA) return zero_topo_cuda_cpuset_(t, dev->ordinal, set);
    if (hwloc_get_last_cpu_location(t, set, HWLOC_CPUBIND_THREAD) != 0) return -1;
    return hwloc_bitmap_iszero(set) ? -1 : 0;
}
#endif

/* The device's topology, taken on first use (NULL, warned once by the
 * loader, when hwloc cannot load it). */
static void *device_topology(zero_device *dev)
{
    pthread_mutex_lock(&dev->topo_mu);
    if (!dev->topo_tried) {
        dev->topo_tried = 1;
#if ZERO_HAVE_HWLOC
        dev->hwtopo = zero_topo_shared_acquire();
#endif
    }
    void *t = dev->hwtopo;
    pthread_mutex_unlock(&dev->topo_mu);
    return t;
}

zero_status zero_numa_alloc_(zero_device *dev, size_t bytes, void **out)
{
    void *p = NULL;
    void *topo = device_topology(dev);
    (void)topo;
#if ZERO_HAVE_HWLOC
    hwloc_topology_t t = topo;
    if (t) {
        hwloc_bitmap_t set = hwloc_bitmap_alloc();
        if (set && near_cpuset(dev, t, set) == 0) {
            /* STRICT so a silent fallback cannot pass for placement. */
            p = hwloc_alloc_membind(t, bytes, set, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_STRICT);
            if (!p)
                WARN_ONCE(numa_warned, "zero_host_alloc_numa: hwloc_alloc_membind(STRICT) failed (%s); "
                          "host buffers are not NUMA-placed", strerror(errno));
        } else {
            WARN_ONCE(numa_warned, "zero_host_alloc_numa: no CPU locality known for the %s device; "
                      "host buffers are not NUMA-placed", dev->ops->name);
        }
        hwloc_bitmap_free(set);
        if (!p) p = hwloc_alloc(t, bytes); /* page aligned; hwloc_free releases it */
    } else
#endif
    {
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) p = NULL;
        else WARN_ONCE(numa_warned, "zero_host_alloc_numa: no hwloc topology; host buffers are not NUMA-placed");
    }
    if (!p)
        return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "zero_host_alloc_numa(%s): cannot allocate %zu bytes",
                         dev->ops->name, bytes);
    if (dev->ops->host_register && dev->ops->host_register(dev, p, bytes) != ZERO_OK)
        WARN_ONCE(register_warned, "zero_host_alloc_numa: %s; copies from it will not overlap compute",
                  zero_last_error());
    *out = p;
    return ZERO_OK;
}

void zero_numa_free_(zero_device *dev, void *ptr, size_t bytes)
{
    if (dev->ops->host_unregister) dev->ops->host_unregister(dev, ptr);
#if ZERO_HAVE_HWLOC
    if (dev->hwtopo) {
        hwloc_free(dev->hwtopo, ptr, bytes);
        return;
    }
#endif
    munmap(ptr, bytes);
}
