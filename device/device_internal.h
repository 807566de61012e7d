/* Internal: the device layer's backend interface.
 *
 * device.c owns every public entry point: it checks arguments, names the op
 * in error messages and dispatches through the backend's ops table. A
 * backend (cpu_backend.c, cuda_backend.c) may therefore assume valid
 * arguments: non-NULL pointers where n > 0, a floating dtype, handles that
 * belong to `dev`. Backends report failures with zero_fail(&dev->err, ...). */
#ifndef ZERO_DEVICE_INTERNAL_H
#define ZERO_DEVICE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <zero/device.h>
#include <zero/experimental.h>

#include "common/error.h"
#include "zero_build_config.h"

/* Every device allocation is aligned to this many bytes (the public promise). */
#define ZERO_DEVICE_ALIGN 256
/* Host (pinned / NUMA) allocations are page aligned, so they can back
 * O_DIRECT file I/O as well as DMA. */
#define ZERO_HOST_ALIGN 4096

/* Host memory that goes back to the kernel when freed (cpu_backend.c):
 * blocks of 64 KiB and more are their own anonymous mappings, smaller ones
 * come from malloc. align: a power of two >= 32. NULL on failure; free
 * accepts NULL. The CPU device's allocations and the engine's host-side
 * buffers use it, so the process holds what the engine's books say. */
void *zero_hostmem_alloc(size_t bytes, size_t align);
void zero_hostmem_free(void *ptr);

typedef struct zero_device_ops zero_device_ops;

struct zero_device {
    const zero_device_ops *ops;
    zero_device_kind kind;
    int ordinal;
    void *impl;    /* backend state */
    /* The shared hwloc topology (hwloc_topology_t), taken on the first NUMA
     * allocation rather than at open, so devices that never place host
     * memory never load it. Fixed once tried: NULL then means "unplaced",
     * and frees follow the same choice. */
    pthread_mutex_t topo_mu;
    int topo_tried;
    void *hwtopo;
    zero_errbuf err;
};

struct zero_stream {
    zero_device *dev;
    void *impl; /* cudaStream_t on CUDA; unused on the CPU */
    int owned;  /* 0 when it wraps a stream the caller owns (zero_cuda.h) */
};

struct zero_event {
    zero_device *dev;
    void *impl; /* cudaEvent_t on CUDA */
};

struct zero_device_ops {
    const char *name;
    zero_status (*open)(zero_device *dev, int ordinal);
    void (*close)(zero_device *dev);

    zero_status (*alloc)(zero_device *dev, size_t bytes, void **out);
    void (*free)(zero_device *dev, void *ptr);
    zero_status (*alloc_pinned)(zero_device *dev, size_t bytes, void **out);
    void (*free_pinned)(zero_device *dev, void *ptr);
    /* Make host memory from elsewhere (the NUMA allocator) DMA-able; the CPU
     * backend leaves these NULL. register failing is not fatal (the caller
     * warns and keeps pageable memory). */
    zero_status (*host_register)(zero_device *dev, void *ptr, size_t bytes);
    void (*host_unregister)(zero_device *dev, void *ptr);

    zero_status (*stream_create)(zero_device *dev, zero_stream *s);
    void (*stream_destroy)(zero_stream *s);
    zero_status (*stream_sync)(zero_device *dev, zero_stream *s); /* s NULL: default */
    zero_status (*device_sync)(zero_device *dev);
    zero_status (*event_create)(zero_device *dev, zero_event *e);
    void (*event_destroy)(zero_event *e);
    zero_status (*event_record)(zero_device *dev, zero_event *e, zero_stream *s);
    zero_status (*stream_wait_event)(zero_device *dev, zero_stream *s, zero_event *e);
    zero_status (*event_sync)(zero_device *dev, zero_event *e);
    zero_status (*event_query)(zero_device *dev, zero_event *e, int *done);

    zero_status (*memcpy_sync)(zero_device *dev, void *dst, const void *src, size_t bytes);
    zero_status (*memcpy_async)(zero_device *dev, void *dst, const void *src, size_t bytes,
                                zero_stream *s);

    zero_status (*fill)(zero_device *dev, void *x, zero_dtype dt, size_t n, float value,
                        zero_stream *s);
    zero_status (*scale)(zero_device *dev, void *x, zero_dtype dt, size_t n, float alpha,
                         zero_stream *s);
    zero_status (*axpy)(zero_device *dev, float alpha, const void *x, void *y, zero_dtype dt,
                        size_t n, zero_stream *s);
    zero_status (*cast)(zero_device *dev, const void *src, zero_dtype sdt, void *dst, zero_dtype ddt,
                        size_t n, zero_stream *s);
    zero_status (*sumsq)(zero_device *dev, const void *x, zero_dtype dt, size_t n, double *out,
                         int *nonfinite, zero_stream *s);
    /* Optional (NULL: the engine composes cast/copy/axpy and fill itself):
     * see zero_take_grad_ below. */
    zero_status (*take)(zero_device *dev, void *src, zero_dtype sdt, int clear, float *dst, int accumulate,
                        size_t n, zero_stream *s);
};

extern const zero_device_ops zero_cpu_device_ops;
#if ZERO_HAVE_CUDA
extern const zero_device_ops zero_cuda_device_ops;
int zero_cuda_device_count_(void); /* <= 0 when none usable */
#endif

/* The gradient reduction's one pass (engine grads.c): dst = fp32(src)
 * (accumulate 0) or dst = dst + fp32(src) (accumulate 1, the sum axpy with
 * alpha 1 gives: 1 * x is x), and with `clear` src = 0 afterwards, block by
 * block while the block is in cache. Stream-ordered on s. Used where a
 * reduce-scatter over one rank (the identity) would copy, and to stage a
 * bucket for a reduce-scatter while zeroing the trainer's buffer for the
 * next micro-step. ZERO_UNSUPPORTED where the backend has no such kernel
 * (zero_take_supported_ says so up front: CUDA today). */
int zero_take_supported_(zero_device *dev);
zero_status zero_take_grad_(zero_device *dev, void *src, zero_dtype sdt, int clear, float *dst, int accumulate,
                            size_t n, zero_stream *s);

/* Run fn(arg) in stream order on s (cudaLaunchHostFunc's idea, for the
 * collectives' stream-ordered mode): on the synchronous CPU device at once,
 * on the asynchronous one by s's worker after the work queued before it.
 * ZERO_UNSUPPORTED on a CUDA device (the caller waits for the stream and
 * runs fn itself: host code may not call CUDA from a stream callback). */
zero_status zero_stream_enqueue_host_(zero_stream *s, void (*fn)(void *), void *arg);

/* Local rank / size from the launcher's environment (Open MPI, Slurm, MPICH,
 * PMI); 0 / 1 when none is set. Shared by device open (-1 ordinal) and topo. */
void zero_local_rank_from_env(int *rank, int *size);

/* NUMA-local host allocation shared by every backend (numa_alloc.c). */
zero_status zero_numa_alloc_(zero_device *dev, size_t bytes, void **out);
void zero_numa_free_(zero_device *dev, void *ptr, size_t bytes);

#endif
