/* Offload storage: where optimizer state and parameters live when they are
 * not on the accelerator.
 *
 *   zero_host_pool      one reservation of pinned, NUMA-local host memory
 *                       handing out 4096-aligned chunks with exact byte
 *                       accounting (optimizer state offloaded to the CPU,
 *                       staging buffers for NVMe I/O);
 *   zero_nvme_store     named fixed-size tensors (byte ranges) in files
 *                       under a directory, read and written asynchronously
 *                       with io_uring and O_DIRECT;
 *   zero_nvme_swapper   the double-buffered pattern of an NVMe-offloaded
 *                       optimizer step: read tensor i+1..i+K while the
 *                       caller updates tensor i, write tensor i-1 back.
 *
 * Every call returns a zero_status; on failure the handle's last_error and
 * zero_last_error() hold a message naming the call, the tensor, the file,
 * the offset and the byte count. Nothing here prints or aborts.
 *
 * Thread safety: a host pool may be used from any number of threads; a
 * store or a swapper by one thread at a time (the store runs one internal
 * completion thread of its own). */
#ifndef ZERO_OFFLOAD_H
#define ZERO_OFFLOAD_H

#ifndef ZERO_EXPERIMENTAL
#error "zero/offload.h is part of libzero's experimental surface: include zero/experimental.h with ZERO_EXPERIMENTAL defined (docs/abi.md)"
#endif

#include <stddef.h>
#include <stdint.h>
#include <zero/device.h>
#include <zero/export.h>
#include <zero/status.h>

ZERO_EXTERN_C_BEGIN

/* Alignment of every pool chunk, store offset and direct-I/O block. */
#define ZERO_OFFLOAD_ALIGN 4096u

/* ================================================================ host pool
 * The pool reserves `capacity` bytes once, at create, with
 * zero_host_alloc_numa (NUMA-local; page-locked on a CUDA device, so copies
 * from it overlap compute). Pinning is expensive, so the reservation never
 * grows: an allocation that does not fit is ZERO_OUT_OF_MEMORY with a message
 * giving the request, the bytes in use and the largest free extent.
 *
 * Chunks are aligned to ZERO_OFFLOAD_ALIGN and occupy their size rounded up
 * to it; best fit, free extents coalesce. Destroy releases the reservation,
 * including chunks still handed out. */
typedef struct zero_host_pool zero_host_pool;

typedef struct zero_host_pool_stats {
    uint64_t capacity;        /* bytes reserved at create (rounded up to the alignment) */
    uint64_t in_use;          /* sum over live chunks of their size rounded up to the alignment */
    uint64_t requested;       /* sum over live chunks of the sizes asked for */
    uint64_t peak_in_use;     /* maximum of in_use since create */
    uint64_t live_chunks;     /* chunks handed out and not yet freed */
    uint64_t largest_free;    /* largest single chunk that would fit now */
    uint64_t total_allocs;    /* successful allocations since create */
} zero_host_pool_stats;

/* `dev` must outlive the pool. capacity > 0. */
ZERO_API zero_status zero_host_pool_create(zero_host_pool **out, zero_device *dev, size_t capacity);
ZERO_API void zero_host_pool_destroy(zero_host_pool *pool); /* NULL accepted */
/* bytes > 0; *out is aligned to ZERO_OFFLOAD_ALIGN; contents undefined. */
ZERO_API zero_status zero_host_pool_alloc(zero_host_pool *pool, size_t bytes, void **out);
/* NULL is a no-op; a pointer that is not a live chunk start of this pool
 * (a double free) is ZERO_INVALID_ARGUMENT and changes nothing. */
ZERO_API zero_status zero_host_pool_free(zero_host_pool *pool, void *ptr);
ZERO_API zero_status zero_host_pool_get_stats(zero_host_pool *pool, zero_host_pool_stats *out);
ZERO_API const char *zero_host_pool_last_error(const zero_host_pool *pool);

/* ================================================================ NVMe store
 * Layout: the store's files are "<dir>/<name>.<k>.swap", k = 0..num_files-1,
 * each of capacity/num_files bytes (rounded up to the alignment). A tensor
 * occupies one contiguous, 4096-aligned range of one file, its size rounded
 * up to 4096 (the padding is written as zeros); tensors go to the files
 * round robin, so a prefetch of consecutive tensors touches every file.
 *
 * I/O: each request is cut into segments of at most block_bytes, and at most
 * queue_depth segments are in flight at once (across all requests); an
 * internal thread reaps completions and submits the next segments, so I/O
 * progresses while the caller computes. Files are opened O_DIRECT; where the
 * file system refuses it (EINVAL) the store uses buffered I/O and logs one
 * warning. Built without liburing, or where io_uring cannot be set up, the
 * *_async calls do their I/O with pread/pwrite before returning.
 *
 * Buffers: any pointer works. A 4096-aligned buffer (every host pool chunk)
 * is read/written in place, except the last partial 4096-byte block of a size
 * that is not a multiple of 4096, which goes through a small internal block;
 * an unaligned buffer goes through an internal copy of the whole tensor.
 * A buffer must stay valid, and untouched by the caller, until the request
 * is waited for. */
typedef struct zero_nvme_store zero_nvme_store;
typedef struct zero_nvme_request zero_nvme_request;
typedef int32_t zero_nvme_tensor; /* a handle: >= 0, in definition order */

#define ZERO_NVME_MAX_QUEUE_DEPTH 128

typedef enum zero_nvme_io_engine {
    ZERO_NVME_IO_AUTO = 0,  /* io_uring when built and permitted, else synchronous */
    ZERO_NVME_IO_URING = 1, /* io_uring or fail with ZERO_UNSUPPORTED */
    ZERO_NVME_IO_SYNC = 2,  /* pread/pwrite in the calling thread */
} zero_nvme_io_engine;

typedef enum zero_nvme_direct_mode {
    ZERO_NVME_DIRECT_AUTO = 0,     /* O_DIRECT; buffered with one warning where refused */
    ZERO_NVME_DIRECT_REQUIRED = 1, /* O_DIRECT or fail at open with ZERO_UNSUPPORTED */
    ZERO_NVME_DIRECT_OFF = 2,      /* buffered I/O through the page cache */
} zero_nvme_direct_mode;

/* Versioned options: initialise with ZERO_NVME_OPTIONS_INIT; fields are only
 * appended, each batch a new version (an older version's missing fields
 * take their defaults). Versions:
 *   1  dir .. timeout_s */
typedef struct zero_nvme_options {
    size_t size;                  /* sizeof(zero_nvme_options) */
    uint32_t version;             /* ZERO_NVME_OPTIONS_VERSION */
    const char *dir;              /* existing, writable directory (required) */
    const char *name;             /* file name prefix; NULL: "zero-<pid>-<n>" (unique in the process) */
    uint64_t capacity;            /* total bytes of all files (required, > 0) */
    int num_files;                /* 1 */
    int queue_depth;              /* segments in flight, 1..ZERO_NVME_MAX_QUEUE_DEPTH; 8 */
    uint64_t block_bytes;         /* segment size, a multiple of 4096; 1 MiB */
    zero_nvme_io_engine io;       /* AUTO */
    zero_nvme_direct_mode direct; /* AUTO */
    int preallocate;              /* fallocate the files at open (ENOSPC then, not mid-step); 1 */
    int keep_files;               /* 0: close removes the files */
    double timeout_s;             /* deadline of a wait given timeout_s <= 0; 60 */
} zero_nvme_options;

#define ZERO_NVME_OPTIONS_VERSION 1u
#define ZERO_NVME_OPTIONS_INIT                                                                    \
    {                                                                                             \
        sizeof(zero_nvme_options), ZERO_NVME_OPTIONS_VERSION, NULL, NULL, 0, 1, 8, 1u << 20,      \
            ZERO_NVME_IO_AUTO, ZERO_NVME_DIRECT_AUTO, 1, 0, 60.0                                  \
    }

/* Create (truncate) the files. Errors: a missing or unwritable directory
 * (ZERO_IO naming the path and errno), no space for the preallocation
 * (ZERO_IO, "ENOSPC"), bad options (ZERO_INVALID_ARGUMENT). */
ZERO_API zero_status zero_nvme_store_create(zero_nvme_store **out, const zero_nvme_options *options);
/* Waits (up to timeout_s) for requests still in flight, frees requests never
 * waited for, closes and (unless keep_files) removes the files. NULL accepted.
 * Destroy the store's swappers first (they hold requests of this store).
 * A request still in flight after the deadline leaks its memory rather than
 * letting the kernel write into freed buffers; the status says so. */
ZERO_API zero_status zero_nvme_store_destroy(zero_nvme_store *store);
ZERO_API const char *zero_nvme_store_last_error(const zero_nvme_store *store);

/* Change the number of segments in flight (1..ZERO_NVME_MAX_QUEUE_DEPTH);
 * takes effect for segments submitted from now on. */
ZERO_API zero_status zero_nvme_store_set_queue_depth(zero_nvme_store *store, int queue_depth);

typedef struct zero_nvme_store_info {
    int uses_uring;      /* 1: io_uring; 0: synchronous pread/pwrite */
    int uses_direct;     /* 1: files are open O_DIRECT */
    int queue_depth;
    uint64_t block_bytes;
    uint64_t capacity;   /* bytes over all files */
    uint64_t used;       /* bytes taken by defined tensors (padded sizes) */
    int num_tensors;
    uint64_t bytes_written, bytes_read; /* completed, padded bytes, since open */
} zero_nvme_store_info;
ZERO_API zero_status zero_nvme_store_get_info(zero_nvme_store *store, zero_nvme_store_info *out);

/* Define a tensor of `bytes` (> 0) under a unique `name` (copied). Fails with
 * ZERO_OUT_OF_MEMORY when no file has room, ZERO_INVALID_ARGUMENT on a
 * duplicate name. */
ZERO_API zero_status zero_nvme_define(zero_nvme_store *store, const char *name, uint64_t bytes,
                                      zero_nvme_tensor *out);
/* ZERO_NOT_FOUND naming the name when no tensor has it. */
ZERO_API zero_status zero_nvme_find(zero_nvme_store *store, const char *name, zero_nvme_tensor *out);

typedef struct zero_nvme_tensor_info {
    const char *name;   /* valid until the store is closed */
    const char *path;   /* the file holding it; same lifetime */
    uint64_t offset;    /* 4096-aligned */
    uint64_t bytes;     /* as defined */
    uint64_t padded;    /* bytes rounded up to 4096: what it occupies */
    int written;        /* 1 once a write of it has completed */
} zero_nvme_tensor_info;
ZERO_API zero_status zero_nvme_tensor_get_info(zero_nvme_store *store, zero_nvme_tensor t,
                                               zero_nvme_tensor_info *out);

/* Start writing the tensor's bytes from `src` / reading them into `dst`;
 * *req receives a request that must be passed to zero_nvme_wait.
 * Reading a tensor that was never written is ZERO_INVALID_STATE; an
 * undefined handle is ZERO_NOT_FOUND. Requests on the same tensor are not
 * ordered against each other: wait for a write before reading it back. */
ZERO_API zero_status zero_nvme_write_async(zero_nvme_store *store, zero_nvme_tensor t, const void *src,
                                           zero_nvme_request **req);
ZERO_API zero_status zero_nvme_read_async(zero_nvme_store *store, zero_nvme_tensor t, void *dst,
                                          zero_nvme_request **req);

/* Wait until the request completes or `timeout_s` passes (<= 0: the store's
 * timeout_s). On completion the request is freed and its status returned:
 * ZERO_OK, or ZERO_IO (EIO, ENOSPC, EFBIG, ... named with errno), or
 * ZERO_CORRUPT (a short read: the file is shorter than the tensor), each
 * with the file, offset and bytes in the message. ZERO_TIMEOUT leaves the
 * request in flight (wait again, or close the store). NULL is a no-op. */
ZERO_API zero_status zero_nvme_wait(zero_nvme_store *store, zero_nvme_request *req, double timeout_s);
/* *done = 1 when zero_nvme_wait would return at once. */
ZERO_API zero_status zero_nvme_test(zero_nvme_store *store, zero_nvme_request *req, int *done);

/* Blocking conveniences: write/read then wait with the store's timeout. */
ZERO_API zero_status zero_nvme_write(zero_nvme_store *store, zero_nvme_tensor t, const void *src);
ZERO_API zero_status zero_nvme_read(zero_nvme_store *store, zero_nvme_tensor t, void *dst);

/* ================================================================ swapper
 * Walks an ordered list of tensors with `depth` reads in flight ahead of the
 * caller:
 *
 *   zero_nvme_swapper_create(&sw, store, pool, tensors, n, depth, writeback);
 *   void *buf; size_t bytes; int idx;
 *   while (zero_nvme_swapper_next(sw, &buf, &bytes, &idx) == ZERO_OK && buf)
 *       update(buf, bytes);                    // tensor tensors[idx], in place
 *   zero_nvme_swapper_finish(sw);              // last write-backs done
 *
 * next() hands the previous buffer back (writing it to its tensor when
 * writeback is set), keeps reads i+1..i+depth in flight, and returns tensor
 * i's bytes once read. Buffers: depth + 2 of the largest padded tensor size,
 * from `pool` (pinned: the engine can copy them to the GPU) or, when pool is
 * NULL, from aligned heap memory. finish() may be followed by rewind() to
 * walk the list again (the next optimizer step). After an error the swapper
 * only accepts finish (which drains its I/O) and destroy. */
typedef struct zero_nvme_swapper zero_nvme_swapper;

ZERO_API zero_status zero_nvme_swapper_create(zero_nvme_swapper **out, zero_nvme_store *store,
                                              zero_host_pool *pool, const zero_nvme_tensor *tensors,
                                              size_t count, int depth, int writeback);
/* *buf = NULL (and *index = count) once every tensor has been handed out. */
ZERO_API zero_status zero_nvme_swapper_next(zero_nvme_swapper *sw, void **buf, size_t *bytes, size_t *index);
/* Write back the last buffer and wait for every write. */
ZERO_API zero_status zero_nvme_swapper_finish(zero_nvme_swapper *sw);
ZERO_API zero_status zero_nvme_swapper_rewind(zero_nvme_swapper *sw);
/* Drains in-flight I/O, then frees the buffers. NULL accepted. */
ZERO_API void zero_nvme_swapper_destroy(zero_nvme_swapper *sw);
ZERO_API const char *zero_nvme_swapper_last_error(const zero_nvme_swapper *sw);

ZERO_EXTERN_C_END

#endif
