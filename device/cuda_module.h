/* Internal: libzero-cuda, the one object that links CUDA, and the table
 * through which libzero calls it.
 *
 * libzero.so itself has no DT_NEEDED on libcudart or libnccl, so a CPU-only
 * consumer of a CUDA build never loads them. Everything that needs CUDA's
 * libraries at link time lives in the module libzero-cuda.so.<major>
 * (device/cuda_module.c, the kernels of device/cuda_kernels.cu and
 * zero/optim_cuda.cu): the kernels, the hwloc-CUDA glue, and the CUDA runtime
 * and NCCL entry points libzero calls, as one table of function pointers.
 * libzero keeps all the logic (the CUDA device backend, the NCCL and staged
 * collectives): the module needs nothing from libzero, so its messages and
 * errors are libzero's own (zero_fail's per-thread buffer is libzero's).
 *
 * libzero dlopen()s the module on the first use of CUDA (a CUDA device, a
 * NCCL or staged comm, zero_cuda_available) and never unloads it (its kernels
 * stay registered with the CUDA runtime until exit). Where it looks:
 * $ZERO_CUDA_MODULE if set (that file only), else libzero-cuda.so.<major>
 * beside the libzero.so that is running (dladdr), then in the install libdir.
 * It must be the same libzero version: the table is internal and may change
 * in any release (docs/device.md, "The CUDA module"). */
#ifndef ZERO_DEVICE_CUDA_MODULE_H
#define ZERO_DEVICE_CUDA_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include <zero/status.h>

#include "zero_build_config.h"

#if ZERO_HAVE_CUDA

#include <cuda_runtime_api.h>
#if ZERO_HAVE_NCCL
#include <nccl.h>
#endif

#include "device/cuda_kernels.h"
#include "zero/optim_cuda.h"

/* The table's members are named after the functions they point to; the
 * per-thread-default-stream variants would rename those by macro. */
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "libzero's CUDA module table assumes the legacy default stream"
#endif

/* The CUDA runtime entry points libzero calls: X(return type, name, parameters). */
#define ZERO_CUDA_RUNTIME_FUNCS(X)                                                                           \
    X(cudaError_t, cudaGetDeviceCount, (int *count))                                                         \
    X(cudaError_t, cudaSetDevice, (int device))                                                              \
    X(cudaError_t, cudaGetLastError, (void))                                                                 \
    X(const char *, cudaGetErrorName, (cudaError_t error))                                                   \
    X(const char *, cudaGetErrorString, (cudaError_t error))                                                 \
    X(cudaError_t, cudaMalloc, (void **ptr, size_t size))                                                    \
    X(cudaError_t, cudaFree, (void *ptr))                                                                    \
    X(cudaError_t, cudaMallocHost, (void **ptr, size_t size))                                                \
    X(cudaError_t, cudaHostAlloc, (void **ptr, size_t size, unsigned int flags))                             \
    X(cudaError_t, cudaFreeHost, (void *ptr))                                                                \
    X(cudaError_t, cudaHostRegister, (void *ptr, size_t size, unsigned int flags))                           \
    X(cudaError_t, cudaHostUnregister, (void *ptr))                                                          \
    X(cudaError_t, cudaMemGetInfo, (size_t *free, size_t *total))                                            \
    X(cudaError_t, cudaPointerGetAttributes, (struct cudaPointerAttributes *attributes, const void *ptr))    \
    X(cudaError_t, cudaMemcpy, (void *dst, const void *src, size_t count, enum cudaMemcpyKind kind))         \
    X(cudaError_t, cudaMemcpyAsync,                                                                          \
      (void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream))             \
    X(cudaError_t, cudaDeviceSynchronize, (void))                                                            \
    X(cudaError_t, cudaStreamCreateWithFlags, (cudaStream_t *stream, unsigned int flags))                    \
    X(cudaError_t, cudaStreamDestroy, (cudaStream_t stream))                                                 \
    X(cudaError_t, cudaStreamSynchronize, (cudaStream_t stream))                                             \
    X(cudaError_t, cudaStreamWaitEvent, (cudaStream_t stream, cudaEvent_t event, unsigned int flags))        \
    X(cudaError_t, cudaEventCreateWithFlags, (cudaEvent_t *event, unsigned int flags))                       \
    X(cudaError_t, cudaEventDestroy, (cudaEvent_t event))                                                    \
    X(cudaError_t, cudaEventRecord, (cudaEvent_t event, cudaStream_t stream))                                \
    X(cudaError_t, cudaEventQuery, (cudaEvent_t event))                                                      \
    X(cudaError_t, cudaEventSynchronize, (cudaEvent_t event))

/* The NCCL entry points of collectives/backend_nccl.c. */
#if ZERO_HAVE_NCCL
#define ZERO_CUDA_NCCL_FUNCS(X)                                                                              \
    X(const char *, ncclGetErrorString, (ncclResult_t result))                                               \
    X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * id))                                                    \
    X(ncclResult_t, ncclCommInitRankConfig,                                                                  \
      (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config))                      \
    X(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * state))                          \
    X(ncclResult_t, ncclCommAbort, (ncclComm_t comm))                                                        \
    X(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))                                                      \
    X(ncclResult_t, ncclGroupStart, (void))                                                                  \
    X(ncclResult_t, ncclGroupEnd, (void))                                                                    \
    X(ncclResult_t, ncclAllReduce,                                                                           \
      (const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,      \
       cudaStream_t stream))                                                                                 \
    X(ncclResult_t, ncclReduceScatter,                                                                       \
      (const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,      \
       cudaStream_t stream))                                                                                 \
    X(ncclResult_t, ncclAllGather,                                                                           \
      (const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm, cudaStream_t stream)) \
    X(ncclResult_t, ncclBroadcast,                                                                           \
      (const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,            \
       cudaStream_t stream))                                                                                 \
    X(ncclResult_t, ncclSend,                                                                                \
      (const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream))  \
    X(ncclResult_t, ncclRecv,                                                                                \
      (void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream))
#else
#define ZERO_CUDA_NCCL_FUNCS(X)
#endif

/* The module's own functions: the kernels' launchers (cuda_kernels.h,
 * optim_cuda.h) and the hwloc-CUDA glue below. */
#define ZERO_CUDA_OWN_FUNCS(X)                                                                               \
    ZERO_CUDA_KERNEL_FUNCS(X)                                                                                \
    ZERO_CUDA_OPTIM_FUNCS(X)                                                                                 \
    X(int, zero_cuda_topo_cpuset, (void *topology, int ordinal, void *cpuset))

/* The cpuset (an hwloc_bitmap_t) of the cores near GPU `ordinal` in
 * `topology` (an hwloc_topology_t of this system): hwloc_cudart_get_device_cpuset.
 * 0, or -1 when unknown (or the module was built without hwloc). */
int zero_cuda_topo_cpuset(void *topology, int ordinal, void *cpuset);

#define ZERO_CUDA_MODULE_MEMBER_(ret, name, params) ret(*name) params;

typedef struct zero_cuda_module {
    size_t size;         /* sizeof(zero_cuda_module) where the module was built */
    int version;         /* ZERO_VERSION of the libzero it was built with: must be ours */
    ZERO_CUDA_RUNTIME_FUNCS(ZERO_CUDA_MODULE_MEMBER_)
    ZERO_CUDA_NCCL_FUNCS(ZERO_CUDA_MODULE_MEMBER_)
    ZERO_CUDA_OWN_FUNCS(ZERO_CUDA_MODULE_MEMBER_)
} zero_cuda_module;

/* The module's one exported symbol: the table above. */
#define ZERO_CUDA_MODULE_SYMBOL "zero_cuda_module_table"

/* The loaded table, set once zero_cuda_load succeeded (NULL before). Code
 * that runs on a CUDA device or a NCCL/staged comm may use it directly: one
 * could not exist without a successful load. */
extern const zero_cuda_module *zero_cu;

/* Load the module on first call (once per process; the outcome, failure
 * included, is kept). ZERO_OK, or ZERO_UNSUPPORTED recorded on this thread
 * as "<op>: <why>" naming each file tried and its dlopen error. */
zero_status zero_cuda_load(const char *op);

#endif /* ZERO_HAVE_CUDA */
#endif
