/* Internal: the NVMe store's state, shared by nvme_store.c (files, tensors,
 * open/close), nvme_io.c (requests, io_uring and synchronous engines) and
 * nvme_swapper.c.
 *
 * Locking: `mu` guards everything the completion thread touches (requests,
 * the pending queue, in-flight slots, tensors' written flags, counters,
 * queue_depth); the tensor table only grows, under `mu`. */
#ifndef ZERO_OFFLOAD_NVME_INTERNAL_H
#define ZERO_OFFLOAD_NVME_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <zero/offload.h>

#include "common/error.h"
#include "zero_build_config.h"

#if ZERO_HAVE_URING
#include <liburing.h>
#endif

typedef struct nvme_file {
    char *path;
    int fd;
    uint64_t capacity, used;
} nvme_file;

typedef struct nvme_tensor {
    char *name;
    int file;
    uint64_t offset, bytes, padded;
    int written;
} nvme_tensor;

/* One segment in flight: a contiguous, aligned piece of one request. */
typedef struct nvme_slot {
    zero_nvme_request *req;
    uint64_t file_off;  /* where the segment starts in the file */
    char *buf;
    size_t len, done;   /* done < len: a short transfer being resubmitted */
    int resubmit;       /* 1: the remainder waits to be submitted again */
} nvme_slot;

struct zero_nvme_request {
    zero_nvme_store *store;
    zero_nvme_tensor tensor;
    int write;
    char *user;         /* the caller's buffer */
    char *bounce;       /* aligned: the tail block, or the whole tensor */
    int bounce_whole;   /* 1: the caller's buffer is unaligned */
    uint64_t body;      /* bytes moved in place from/to user (multiple of 4096) */
    uint32_t nseg, next_seg, inflight;
    int done;
    zero_status status;
    char msg[ZERO_ERRMSG_MAX];
    zero_nvme_request *next_pending;     /* FIFO of requests with segments to submit */
    zero_nvme_request *prev_all, *next_all; /* every request not yet waited for */
};

struct zero_nvme_store {
    zero_nvme_options opt;
    char *dir, *name;
    nvme_file *files;
    int num_files;
    nvme_tensor *tensors;
    int num_tensors, cap_tensors;
    int direct;
    int uring; /* 1: the completion thread and ring below are live */
    int queue_depth;
    uint64_t bytes_written, bytes_read;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* a request completed */
    zero_nvme_request *pending_head, *pending_tail;
    zero_nvme_request *all;
    uint64_t inflight_segs;
    nvme_slot slots[ZERO_NVME_MAX_QUEUE_DEPTH];
    int free_slots[ZERO_NVME_MAX_QUEUE_DEPTH], num_free_slots;
    int resubmits; /* slots with resubmit set */

#if ZERO_HAVE_URING
    struct io_uring ring;
    int wake_fd;     /* eventfd: a new request is pending, or stop */
    int wake_armed;  /* its poll is in the ring */
    int stop;
    pthread_t thread;
#endif
    zero_errbuf err;
};

/* nvme_io.c */
zero_status zero_nvme_io_start_(zero_nvme_store *s);          /* ring + thread; 0 on success */
zero_status zero_nvme_io_drain_(zero_nvme_store *s, double timeout_s); /* wait for all I/O, stop thread */
void zero_nvme_request_free_(zero_nvme_request *r);
/* Absolute CLOCK_MONOTONIC deadline `timeout_s` from now. */
struct timespec zero_nvme_deadline_(double timeout_s);

#endif
