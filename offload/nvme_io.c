/* The NVMe store's I/O: requests cut into aligned segments, moved either by
 * io_uring with one completion thread, or synchronously with pread/pwrite.
 *
 * Why a completion thread: a request larger than queue_depth * block_bytes
 * needs new segments submitted as old ones finish. If only the caller's own
 * calls did that, the device would idle whenever the caller computes (which
 * is the whole point of prefetching). The thread is the ring's only user, so
 * the ring needs no lock; the caller hands it work through the pending queue
 * (under `mu`) and an eventfd whose poll sits in the ring. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "nvme_internal.h"

#define ALIGN ((uint64_t)ZERO_OFFLOAD_ALIGN)
#define RING_ENTRIES 256u /* > ZERO_NVME_MAX_QUEUE_DEPTH + the wake poll */
#define WAKE_TAG UINT64_MAX

struct timespec zero_nvme_deadline_(double timeout_s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (timeout_s > 1e9) timeout_s = 1e9;
    long long ns = (long long)(timeout_s * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec += (long)(ns % 1000000000LL);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static const char *errno_name(int e)
{
    const char *n = strerrorname_np(e);
    return n ? n : "errno";
}

static const char *op_name(const zero_nvme_request *r) { return r->write ? "write" : "read"; }

/* Record the request's first failure with its full context. Called with mu held
 * (or from the only thread that knows the request). */
static void request_fail(zero_nvme_store *s, zero_nvme_request *r, zero_status st, const char *fmt, ...)
    ZERO_PRINTF(4, 5);
static void request_fail(zero_nvme_store *s, zero_nvme_request *r, zero_status st, const char *fmt, ...)
{
    if (r->status != ZERO_OK) return;
    char detail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    const nvme_tensor *t = &s->tensors[r->tensor];
    r->status = st;
    snprintf(r->msg, sizeof r->msg, "zero_nvme_%s of tensor '%s' (file %s, offset %llu, %llu bytes): %s",
             op_name(r), t->name, s->files[t->file].path, (unsigned long long)t->offset,
             (unsigned long long)t->bytes, detail);
}

/* Segment i of r: its place in the file and in memory. Body segments move
 * the caller's aligned bytes in place; the tail block and unaligned callers
 * go through the bounce buffer. */
static void seg_range(const zero_nvme_store *s, const zero_nvme_request *r, uint32_t i, uint64_t *file_off,
                      char **buf, size_t *len)
{
    const nvme_tensor *t = &s->tensors[r->tensor];
    uint64_t block = s->opt.block_bytes, start, n;
    if (r->bounce_whole) {
        start = (uint64_t)i * block;
        n = t->padded - start < block ? t->padded - start : block;
        *buf = r->bounce + start;
    } else if ((uint64_t)i * block < r->body) {
        start = (uint64_t)i * block;
        n = r->body - start < block ? r->body - start : block;
        *buf = r->user + start;
    } else {
        start = r->body;
        n = ALIGN;
        *buf = r->bounce;
    }
    *file_off = t->offset + start;
    *len = (size_t)n;
}

/* A transfer of `got` bytes where `want` were asked for: is it resumable?
 * Not at end of file (got == 0), and not at an unaligned offset under
 * O_DIRECT (the kernel would refuse it, and it only happens at EOF). */
static int short_is_fatal(const zero_nvme_store *s, size_t done_before, size_t got)
{
    return got == 0 || (s->direct && (done_before + got) % ALIGN != 0);
}

static void short_fail(zero_nvme_store *s, zero_nvme_request *r, uint64_t off, size_t want, size_t got)
{
    if (r->write)
        request_fail(s, r, ZERO_IO, "short write at file offset %llu: %zu of %zu bytes written (disk full?)",
                     (unsigned long long)off, got, want);
    else
        request_fail(s, r, ZERO_CORRUPT,
                     "short read at file offset %llu: %zu of %zu bytes read (file truncated behind the store?)",
                     (unsigned long long)off, got, want);
}

static void errno_fail(zero_nvme_store *s, zero_nvme_request *r, uint64_t off, size_t len, int e)
{
    request_fail(s, r, ZERO_IO, "%s of %zu bytes at file offset %llu failed: %s (%s)", op_name(r), len,
                 (unsigned long long)off, strerror(e), errno_name(e));
}

/* All segments are done: finish the request. Called with mu held. */
static void complete_locked(zero_nvme_store *s, zero_nvme_request *r)
{
    nvme_tensor *t = &s->tensors[r->tensor];
    if (r->status == ZERO_OK) {
        if (r->write) {
            t->written = 1;
            s->bytes_written += t->padded;
        } else {
            if (r->bounce_whole) memcpy(r->user, r->bounce, t->bytes);
            else if (t->bytes > r->body) memcpy(r->user + r->body, r->bounce, t->bytes - r->body);
            s->bytes_read += t->padded;
        }
    }
    free(r->bounce);
    r->bounce = NULL;
    r->done = 1;
    pthread_cond_broadcast(&s->cv);
}

void zero_nvme_request_free_(zero_nvme_request *r)
{
    if (!r) return;
    free(r->bounce);
    free(r);
}

/* ---------------------------------------------------------------- synchronous engine */

static void run_sync(zero_nvme_store *s, zero_nvme_request *r)
{
    int fd = s->files[s->tensors[r->tensor].file].fd;
    for (uint32_t i = 0; i < r->nseg && r->status == ZERO_OK; i++) {
        uint64_t off;
        char *buf;
        size_t len, done = 0;
        seg_range(s, r, i, &off, &buf, &len);
        while (done < len) {
            ssize_t n = r->write ? pwrite(fd, buf + done, len - done, (off_t)(off + done))
                                 : pread(fd, buf + done, len - done, (off_t)(off + done));
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                errno_fail(s, r, off + done, len - done, errno);
                break;
            }
            if ((size_t)n < len - done && short_is_fatal(s, done, (size_t)n)) {
                short_fail(s, r, off + done, len - done, (size_t)n);
                break;
            }
            done += (size_t)n;
        }
    }
    r->next_seg = r->nseg;
    pthread_mutex_lock(&s->mu);
    complete_locked(s, r);
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- io_uring engine */
#if ZERO_HAVE_URING

static int prep_slot(zero_nvme_store *s, int idx)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (!sqe) return -1;
    nvme_slot *sl = &s->slots[idx];
    int fd = s->files[s->tensors[sl->req->tensor].file].fd;
    if (sl->req->write)
        io_uring_prep_write(sqe, fd, sl->buf + sl->done, (unsigned)(sl->len - sl->done), sl->file_off + sl->done);
    else
        io_uring_prep_read(sqe, fd, sl->buf + sl->done, (unsigned)(sl->len - sl->done), sl->file_off + sl->done);
    io_uring_sqe_set_data64(sqe, (uint64_t)idx);
    return 0;
}

static void pending_remove(zero_nvme_store *s, zero_nvme_request *r)
{
    zero_nvme_request **pp = &s->pending_head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->next_pending;
    }
    if (!*pp) return;
    *pp = r->next_pending;
    if (s->pending_tail == r) s->pending_tail = prev;
    r->next_pending = NULL;
}

/* Fill the ring up to queue_depth segments and keep the wake poll armed. */
static void submit_locked(zero_nvme_store *s)
{
    unsigned queued = 0;
    for (int i = 0; s->resubmits > 0 && i < ZERO_NVME_MAX_QUEUE_DEPTH; i++) {
        if (!s->slots[i].req || !s->slots[i].resubmit) continue;
        if (prep_slot(s, i) != 0) break;
        s->slots[i].resubmit = 0;
        s->resubmits--;
        queued++;
    }
    while (s->pending_head && s->inflight_segs < (uint64_t)s->queue_depth && s->num_free_slots > 0) {
        zero_nvme_request *r = s->pending_head;
        int idx = s->free_slots[s->num_free_slots - 1];
        nvme_slot *sl = &s->slots[idx];
        *sl = (nvme_slot){.req = r};
        seg_range(s, r, r->next_seg, &sl->file_off, &sl->buf, &sl->len);
        if (prep_slot(s, idx) != 0) {
            sl->req = NULL;
            break;
        }
        s->num_free_slots--;
        r->next_seg++;
        r->inflight++;
        s->inflight_segs++;
        if (r->next_seg == r->nseg) pending_remove(s, r);
        queued++;
    }
    if (!s->wake_armed) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
        if (sqe) {
            io_uring_prep_poll_add(sqe, s->wake_fd, POLLIN);
            io_uring_sqe_set_data64(sqe, WAKE_TAG);
            s->wake_armed = 1;
            queued++;
        }
    }
    if (queued) {
        int r = io_uring_submit(&s->ring);
        if (r < 0) zero_log(ZERO_LOG_WARN, "nvme store %s/%s: io_uring_submit: %s (will retry)", s->dir, s->name,
                            strerror(-r));
    }
}

static void handle_cqe(zero_nvme_store *s, const struct io_uring_cqe *cqe)
{
    uint64_t tag = io_uring_cqe_get_data64(cqe);
    if (tag == WAKE_TAG) {
        uint64_t v;
        if (read(s->wake_fd, &v, sizeof v) < 0) { /* EAGAIN: already drained */ }
        s->wake_armed = 0;
        return;
    }
    nvme_slot *sl = &s->slots[tag];
    zero_nvme_request *r = sl->req;
    int res = cqe->res;
    size_t want = sl->len - sl->done;
    if (res < 0) {
        errno_fail(s, r, sl->file_off + sl->done, want, -res);
    } else if ((size_t)res < want) {
        if (short_is_fatal(s, sl->done, (size_t)res)) {
            short_fail(s, r, sl->file_off + sl->done, want, (size_t)res);
        } else {
            sl->done += (size_t)res;
            sl->resubmit = 1;
            s->resubmits++;
            return;
        }
    }
    sl->req = NULL;
    s->free_slots[s->num_free_slots++] = (int)tag;
    r->inflight--;
    s->inflight_segs--;
    if (r->status != ZERO_OK && r->next_seg < r->nseg) {
        /* no point moving the rest of a failed request */
        r->next_seg = r->nseg;
        pending_remove(s, r);
    }
    if (r->inflight == 0 && r->next_seg == r->nseg) complete_locked(s, r);
}

static void *completion_main(void *arg)
{
    zero_nvme_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        submit_locked(s);
        if (s->stop && s->inflight_segs == 0 && !s->pending_head) break;
        pthread_mutex_unlock(&s->mu);
        struct io_uring_cqe *cqe;
        int r = io_uring_wait_cqe(&s->ring, &cqe);
        pthread_mutex_lock(&s->mu);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -ETIME) {
            zero_log(ZERO_LOG_ERROR, "nvme store %s/%s: io_uring_wait_cqe: %s", s->dir, s->name, strerror(-r));
        }
        unsigned head, n = 0;
        io_uring_for_each_cqe(&s->ring, head, cqe)
        {
            handle_cqe(s, cqe);
            n++;
        }
        io_uring_cq_advance(&s->ring, n);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void wake(zero_nvme_store *s)
{
    uint64_t one = 1;
    if (write(s->wake_fd, &one, sizeof one) < 0) { /* counter saturated: a wake is already due */ }
}

#endif /* ZERO_HAVE_URING */

zero_status zero_nvme_io_start_(zero_nvme_store *s)
{
    if (s->opt.io == ZERO_NVME_IO_SYNC) return ZERO_OK;
#if ZERO_HAVE_URING
#ifdef ZERO_NVME_TEST_REFUSE_URING /* white-box test build: a kernel or seccomp profile without io_uring */
    int r = -EPERM;
#else
    int r = io_uring_queue_init(RING_ENTRIES, &s->ring, 0);
#endif
    if (r < 0) {
        if (s->opt.io == ZERO_NVME_IO_URING)
            return zero_fail(NULL, ZERO_UNSUPPORTED, "zero_nvme_store_create: io_uring_queue_init: %s",
                             strerror(-r));
        zero_log(ZERO_LOG_WARN, "zero_nvme_store_create: io_uring unavailable (%s); %s/%s uses pread/pwrite",
                 strerror(-r), s->dir, s->name);
        return ZERO_OK;
    }
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->wake_fd < 0) {
        int e = errno;
        io_uring_queue_exit(&s->ring);
        return zero_fail(NULL, ZERO_BACKEND, "zero_nvme_store_create: eventfd: %s", strerror(e));
    }
    r = pthread_create(&s->thread, NULL, completion_main, s);
    if (r != 0) {
        close(s->wake_fd);
        io_uring_queue_exit(&s->ring);
        return zero_fail(NULL, ZERO_BACKEND, "zero_nvme_store_create: cannot start the completion thread: %s",
                         strerror(r));
    }
    s->uring = 1;
    return ZERO_OK;
#else
    if (s->opt.io == ZERO_NVME_IO_URING)
        return zero_fail(NULL, ZERO_UNSUPPORTED,
                         "zero_nvme_store_create: io_uring requested, but this libzero was built without liburing");
    return ZERO_OK;
#endif
}

zero_status zero_nvme_io_drain_(zero_nvme_store *s, double timeout_s)
{
#if ZERO_HAVE_URING
    if (!s->uring) return ZERO_OK;
    struct timespec dl = zero_nvme_deadline_(timeout_s > 0 ? timeout_s : 60.0);
    pthread_mutex_lock(&s->mu);
    int timed_out = 0;
    while ((s->inflight_segs || s->pending_head) && !timed_out)
        timed_out = pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT;
    timed_out = s->inflight_segs || s->pending_head;
    uint64_t left = s->inflight_segs;
    s->stop = 1;
    pthread_mutex_unlock(&s->mu);
    wake(s);
    if (timed_out) {
        /* The kernel may still write into request buffers: leave the store,
         * its thread and its requests alive rather than free them. */
        pthread_detach(s->thread);
        return zero_fail(&s->err, ZERO_TIMEOUT,
                         "zero_nvme_store_destroy(%s/%s): %llu segments still in flight after %g s; the store's "
                         "memory is leaked so the kernel cannot write into freed buffers",
                         s->dir, s->name, (unsigned long long)left, timeout_s);
    }
    pthread_join(s->thread, NULL);
    io_uring_queue_exit(&s->ring);
    close(s->wake_fd);
    s->uring = 0;
#else
    (void)s;
    (void)timeout_s;
#endif
    return ZERO_OK;
}

/* ---------------------------------------------------------------- requests */

static zero_status request_start(zero_nvme_store *s, zero_nvme_tensor t, void *buf, int write,
                                 zero_nvme_request **out)
{
    const char *fn = write ? "zero_nvme_write_async" : "zero_nvme_read_async";
    if (!s || !buf || !out)
        return zero_fail(s ? &s->err : NULL, ZERO_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         !s ? "store" : !buf ? (write ? "src" : "dst") : "req");
    *out = NULL;
    pthread_mutex_lock(&s->mu);
    if (t < 0 || t >= s->num_tensors) {
        int n = s->num_tensors;
        pthread_mutex_unlock(&s->mu);
        return zero_fail(&s->err, ZERO_NOT_FOUND, "%s: tensor handle %d is not defined in store %s/%s (%d tensors)",
                         fn, (int)t, s->dir, s->name, n);
    }
    nvme_tensor tv = s->tensors[t];
    pthread_mutex_unlock(&s->mu);
    if (!write && !tv.written)
        return zero_fail(&s->err, ZERO_INVALID_STATE,
                         "%s: tensor '%s' (file %s, offset %llu, %llu bytes) has never been written", fn, tv.name,
                         s->files[tv.file].path, (unsigned long long)tv.offset, (unsigned long long)tv.bytes);

    zero_nvme_request *r = calloc(1, sizeof *r);
    if (!r) return zero_fail(&s->err, ZERO_OUT_OF_MEMORY, "%s: no memory for a request", fn);
    r->store = s;
    r->tensor = t;
    r->write = write;
    r->user = buf;
    uint64_t block = s->opt.block_bytes;
    if ((uintptr_t)buf % ALIGN == 0) {
        r->body = tv.bytes / ALIGN * ALIGN;
        r->nseg = (uint32_t)((r->body + block - 1) / block);
        if (tv.bytes > r->body) {
            r->bounce = aligned_alloc(ALIGN, ALIGN);
            r->nseg++;
            if (r->bounce && write) {
                memcpy(r->bounce, r->user + r->body, tv.bytes - r->body);
                memset(r->bounce + (tv.bytes - r->body), 0, ALIGN - (tv.bytes - r->body));
            }
        }
    } else {
        r->bounce_whole = 1;
        r->bounce = aligned_alloc(ALIGN, tv.padded);
        r->nseg = (uint32_t)((tv.padded + block - 1) / block);
        if (r->bounce && write) {
            memcpy(r->bounce, buf, tv.bytes);
            memset(r->bounce + tv.bytes, 0, tv.padded - tv.bytes);
        }
    }
    if ((r->bounce_whole || tv.bytes > r->body) && !r->bounce) {
        free(r);
        return zero_fail(&s->err, ZERO_OUT_OF_MEMORY, "%s(%s): no memory for an aligned bounce buffer", fn,
                         tv.name);
    }
    pthread_mutex_lock(&s->mu);
    r->next_all = s->all;
    if (s->all) s->all->prev_all = r;
    s->all = r;
#if ZERO_HAVE_URING
    if (s->uring) {
        if (s->pending_tail) s->pending_tail->next_pending = r;
        else s->pending_head = r;
        s->pending_tail = r;
        pthread_mutex_unlock(&s->mu);
        wake(s);
        *out = r;
        return ZERO_OK;
    }
#endif
    pthread_mutex_unlock(&s->mu);
    run_sync(s, r);
    *out = r;
    return ZERO_OK;
}

zero_status zero_nvme_write_async(zero_nvme_store *s, zero_nvme_tensor t, const void *src, zero_nvme_request **req)
{
    return request_start(s, t, (void *)src, 1, req);
}

zero_status zero_nvme_read_async(zero_nvme_store *s, zero_nvme_tensor t, void *dst, zero_nvme_request **req)
{
    return request_start(s, t, dst, 0, req);
}

zero_status zero_nvme_wait(zero_nvme_store *s, zero_nvme_request *r, double timeout_s)
{
    if (!r) return ZERO_OK;
    if (!s || r->store != s)
        return zero_fail(s ? &s->err : NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_wait: %s",
                         !s ? "store is NULL" : "the request belongs to another store");
    if (timeout_s <= 0) timeout_s = s->opt.timeout_s > 0 ? s->opt.timeout_s : 60.0;
    struct timespec dl = zero_nvme_deadline_(timeout_s);
    pthread_mutex_lock(&s->mu);
    while (!r->done)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT) break;
    if (!r->done) {
        const nvme_tensor *t = &s->tensors[r->tensor];
        zero_status st = zero_fail(&s->err, ZERO_TIMEOUT,
                                   "zero_nvme_wait: %s of tensor '%s' (file %s, offset %llu, %llu bytes) not "
                                   "complete after %g s (%u of %u segments submitted, %u in flight)",
                                   op_name(r), t->name, s->files[t->file].path, (unsigned long long)t->offset,
                                   (unsigned long long)t->bytes, timeout_s, r->next_seg, r->nseg, r->inflight);
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    if (r->prev_all) r->prev_all->next_all = r->next_all;
    else s->all = r->next_all;
    if (r->next_all) r->next_all->prev_all = r->prev_all;
    pthread_mutex_unlock(&s->mu);
    zero_status st = r->status;
    if (st != ZERO_OK) zero_fail(&s->err, st, "%s", r->msg);
    zero_nvme_request_free_(r);
    return st;
}

zero_status zero_nvme_test(zero_nvme_store *s, zero_nvme_request *r, int *done)
{
    if (!s || !r || !done)
        return zero_fail(s ? &s->err : NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_test: %s is NULL",
                         !s ? "store" : !r ? "req" : "done");
    pthread_mutex_lock(&s->mu);
    *done = r->done;
    pthread_mutex_unlock(&s->mu);
    return ZERO_OK;
}

zero_status zero_nvme_write(zero_nvme_store *s, zero_nvme_tensor t, const void *src)
{
    zero_nvme_request *r;
    ZERO_TRY(zero_nvme_write_async(s, t, src, &r));
    return zero_nvme_wait(s, r, 0);
}

zero_status zero_nvme_read(zero_nvme_store *s, zero_nvme_tensor t, void *dst)
{
    zero_nvme_request *r;
    ZERO_TRY(zero_nvme_read_async(s, t, dst, &r));
    return zero_nvme_wait(s, r, 0);
}
