/* The NVMe store: its files, the tensor table, open and close. The I/O
 * itself (requests, io_uring, the completion thread) is in nvme_io.c.
 *
 * A tensor gets a fixed, 4096-aligned range of one file when it is defined
 * and keeps it for the store's life: optimizer state has a fixed size, so a
 * bump allocator per file is all the placement needed, and offsets never
 * move under in-flight I/O. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/versioned.h"
#include "nvme_internal.h"

static atomic_uint store_counter;

static uint64_t round_up(uint64_t x) { return (x + ZERO_OFFLOAD_ALIGN - 1) / ZERO_OFFLOAD_ALIGN * ZERO_OFFLOAD_ALIGN; }

/* open(2), with a white-box test build that plays a file system refusing
 * O_DIRECT (tmpfs did before Linux 6.6) so the fallback path is exercised
 * on any kernel. */
static int open_file(const char *path, int flags)
{
#ifdef ZERO_NVME_TEST_REFUSE_DIRECT
    if (flags & O_DIRECT) {
        errno = EINVAL;
        return -1;
    }
#endif
    return open(path, flags, 0600);
}

static char *dup_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static void store_free(zero_nvme_store *s)
{
    for (int i = 0; i < s->num_files; i++) {
        if (s->files[i].fd >= 0) close(s->files[i].fd);
        if (s->files[i].path && !s->opt.keep_files) unlink(s->files[i].path);
        free(s->files[i].path);
    }
    free(s->files);
    for (int i = 0; i < s->num_tensors; i++) free(s->tensors[i].name);
    free(s->tensors);
    free(s->dir);
    free(s->name);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* One row per ZERO_NVME_OPTIONS_VERSION (offload.h lists each version's fields). */
static const zero_struct_version nvme_options_versions[] = {
    {ZERO_FIELD_END(zero_nvme_options, timeout_s), "dir"},
};
_Static_assert(sizeof nvme_options_versions / sizeof *nvme_options_versions == ZERO_NVME_OPTIONS_VERSION,
               "a new zero_nvme_options version needs its row above");
ZERO_ASSERT_LAST_FIELD(zero_nvme_options, timeout_s);
static const zero_versioned_type nvme_options_type = {"zero_nvme_options", "ZERO_NVME_OPTIONS_INIT",
                                                      nvme_options_versions, ZERO_NVME_OPTIONS_VERSION,
                                                      sizeof(zero_nvme_options)};

/* `o` is the caller's options made whole (zero_versioned_read). */
static zero_status check_options(const zero_nvme_options *o)
{
    const char *what = NULL;
    if (!o->dir || !*o->dir) what = "options.dir is empty";
    else if (o->capacity == 0) what = "options.capacity is 0";
    else if (o->num_files < 1 || o->num_files > 1024) what = "options.num_files is not in 1..1024";
    else if (o->queue_depth < 1 || o->queue_depth > ZERO_NVME_MAX_QUEUE_DEPTH)
        what = "options.queue_depth is not in 1..ZERO_NVME_MAX_QUEUE_DEPTH";
    else if (o->block_bytes == 0 || o->block_bytes % ZERO_OFFLOAD_ALIGN || o->block_bytes > (1u << 30))
        what = "options.block_bytes is not a multiple of 4096 in 4096..1 GiB";
    else if ((unsigned)o->io > ZERO_NVME_IO_SYNC) what = "options.io is not a zero_nvme_io_engine";
    else if ((unsigned)o->direct > ZERO_NVME_DIRECT_OFF) what = "options.direct is not a zero_nvme_direct_mode";
    else if (o->name && (!*o->name || strchr(o->name, '/'))) what = "options.name is empty or contains '/'";
    if (!what) return ZERO_OK;
    return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_store_create: %s", what);
}

/* Create one file, O_DIRECT unless refused, sized to its capacity. */
static zero_status open_one_file(zero_nvme_store *s, nvme_file *f)
{
    int base = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
    if (s->direct) {
        f->fd = open_file(f->path, base | O_DIRECT);
        if (f->fd < 0 && errno == EINVAL && s->opt.direct == ZERO_NVME_DIRECT_AUTO) {
            zero_log(ZERO_LOG_WARN,
                     "zero_nvme_store_create: the file system of %s refuses O_DIRECT; using buffered I/O "
                     "(through the page cache) for this store",
                     s->dir);
            s->direct = 0;
        } else if (f->fd < 0 && errno == EINVAL) {
            return zero_fail(NULL, ZERO_UNSUPPORTED,
                             "zero_nvme_store_create: the file system of %s refuses O_DIRECT (creating %s) "
                             "and options.direct is ZERO_NVME_DIRECT_REQUIRED", s->dir, f->path);
        }
    }
    if (!s->direct) f->fd = open_file(f->path, base);
    if (f->fd < 0)
        return zero_fail(NULL, ZERO_IO, "zero_nvme_store_create: cannot create %s: %s", f->path, strerror(errno));
    int r;
    if (s->opt.preallocate) {
        /* fallocate(2), not posix_fallocate: where the file system cannot
         * preallocate, glibc's emulation would write the whole capacity. */
        r = fallocate(f->fd, 0, 0, (off_t)f->capacity) ? errno : 0;
        if (r == EOPNOTSUPP || r == ENOSYS) r = ftruncate(f->fd, (off_t)f->capacity) ? errno : 0;
    } else {
        r = ftruncate(f->fd, (off_t)f->capacity) ? errno : 0;
    }
    if (r != 0)
        return zero_fail(NULL, ZERO_IO, "zero_nvme_store_create: cannot size %s to %llu bytes: %s%s", f->path,
                         (unsigned long long)f->capacity, strerror(r), r == ENOSPC ? " (ENOSPC)" : "");
    return ZERO_OK;
}

zero_status zero_nvme_store_create(zero_nvme_store **out, const zero_nvme_options *o)
{
    if (!out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_store_create: out is NULL");
    *out = NULL;
    zero_nvme_options whole; /* an older version's missing fields at their defaults */
    const zero_nvme_options defaults = ZERO_NVME_OPTIONS_INIT;
    memcpy(&whole, &defaults, sizeof whole);
    if (!o) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_store_create: options is NULL");
    ZERO_TRY(zero_versioned_read(NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_store_create", &nvme_options_type, o, &whole));
    o = &whole;
    ZERO_TRY(check_options(o));
    struct stat sb;
    if (stat(o->dir, &sb) != 0)
        return zero_fail(NULL, ZERO_IO, "zero_nvme_store_create: directory %s: %s", o->dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return zero_fail(NULL, ZERO_IO, "zero_nvme_store_create: %s is not a directory", o->dir);

    zero_nvme_store *s = calloc(1, sizeof *s);
    if (!s) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_nvme_store_create: no memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->opt = *o;
    s->opt.dir = s->opt.name = NULL; /* the copies below own them */
    s->queue_depth = o->queue_depth;
    s->direct = o->direct != ZERO_NVME_DIRECT_OFF;
    for (int i = 0; i < ZERO_NVME_MAX_QUEUE_DEPTH; i++) s->free_slots[i] = ZERO_NVME_MAX_QUEUE_DEPTH - 1 - i;
    s->num_free_slots = ZERO_NVME_MAX_QUEUE_DEPTH;

    char defname[64];
    if (!o->name) {
        snprintf(defname, sizeof defname, "zero-%ld-%u", (long)getpid(), atomic_fetch_add(&store_counter, 1));
    }
    s->dir = dup_string(o->dir);
    s->name = dup_string(o->name ? o->name : defname);
    s->files = calloc((size_t)o->num_files, sizeof *s->files);
    if (!s->dir || !s->name || !s->files) {
        store_free(s);
        return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_nvme_store_create: no memory");
    }
    uint64_t per_file = round_up((o->capacity + (uint64_t)o->num_files - 1) / (uint64_t)o->num_files);
    zero_status st = ZERO_OK;
    for (int i = 0; i < o->num_files && st == ZERO_OK; i++) {
        nvme_file *f = &s->files[i];
        f->fd = -1;
        f->capacity = per_file;
        size_t n = strlen(s->dir) + strlen(s->name) + 32;
        f->path = malloc(n);
        if (!f->path) {
            st = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_nvme_store_create: no memory");
            break;
        }
        snprintf(f->path, n, "%s/%s.%d.swap", s->dir, s->name, i);
        s->num_files = i + 1;
        st = open_one_file(s, f);
    }
    if (st == ZERO_OK) st = zero_nvme_io_start_(s);
    if (st != ZERO_OK) {
        s->opt.keep_files = 0; /* files of a store that never opened are ours to remove */
        store_free(s);
        return st;
    }
    *out = s;
    return ZERO_OK;
}

zero_status zero_nvme_store_destroy(zero_nvme_store *s)
{
    if (!s) return ZERO_OK;
    zero_status st = zero_nvme_io_drain_(s, s->opt.timeout_s);
    if (st == ZERO_TIMEOUT) return st; /* the kernel may still write into our memory: leak it */
    while (s->all) {
        zero_nvme_request *r = s->all;
        s->all = r->next_all;
        zero_nvme_request_free_(r);
    }
    store_free(s);
    return st;
}

const char *zero_nvme_store_last_error(const zero_nvme_store *s)
{
    return s ? s->err.msg : "";
}

zero_status zero_nvme_store_set_queue_depth(zero_nvme_store *s, int qd)
{
    if (!s) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_store_set_queue_depth: store is NULL");
    if (qd < 1 || qd > ZERO_NVME_MAX_QUEUE_DEPTH)
        return zero_fail(&s->err, ZERO_INVALID_ARGUMENT,
                         "zero_nvme_store_set_queue_depth: %d is not in 1..%d", qd, ZERO_NVME_MAX_QUEUE_DEPTH);
    pthread_mutex_lock(&s->mu);
    s->queue_depth = qd;
    pthread_mutex_unlock(&s->mu);
    return ZERO_OK;
}

zero_status zero_nvme_store_get_info(zero_nvme_store *s, zero_nvme_store_info *out)
{
    if (!s || !out)
        return zero_fail(s ? &s->err : NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_store_get_info: %s is NULL",
                         !s ? "store" : "out");
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->mu);
    out->uses_uring = s->uring;
    out->uses_direct = s->direct;
    out->queue_depth = s->queue_depth;
    out->block_bytes = s->opt.block_bytes;
    for (int i = 0; i < s->num_files; i++) {
        out->capacity += s->files[i].capacity;
        out->used += s->files[i].used;
    }
    out->num_tensors = s->num_tensors;
    out->bytes_written = s->bytes_written;
    out->bytes_read = s->bytes_read;
    pthread_mutex_unlock(&s->mu);
    return ZERO_OK;
}

static int find_locked(zero_nvme_store *s, const char *name)
{
    for (int i = 0; i < s->num_tensors; i++)
        if (strcmp(s->tensors[i].name, name) == 0) return i;
    return -1;
}

zero_status zero_nvme_define(zero_nvme_store *s, const char *name, uint64_t bytes, zero_nvme_tensor *out)
{
    if (!s || !name || !*name || !out || bytes == 0)
        return zero_fail(s ? &s->err : NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_define(%s): %s",
                         name ? name : "(null)",
                         !s ? "store is NULL" : !name || !*name ? "name is empty" : !out ? "out is NULL"
                                                                                      : "bytes is 0");
    uint64_t padded = round_up(bytes);
    zero_status st = ZERO_OK;
    pthread_mutex_lock(&s->mu);
    if (find_locked(s, name) >= 0) {
        st = zero_fail(&s->err, ZERO_INVALID_ARGUMENT, "zero_nvme_define(%s): a tensor of that name exists", name);
        goto done;
    }
    /* Round robin, skipping full files: consecutive tensors land on
     * different files, so a prefetch keeps every file busy. */
    int file = -1;
    uint64_t free_max = 0;
    for (int k = 0; k < s->num_files; k++) {
        nvme_file *f = &s->files[(s->num_tensors + k) % s->num_files];
        uint64_t avail = f->capacity - f->used;
        if (avail > free_max) free_max = avail;
        if (file < 0 && avail >= padded) file = (s->num_tensors + k) % s->num_files;
    }
    if (file < 0) {
        st = zero_fail(&s->err, ZERO_OUT_OF_MEMORY,
                       "zero_nvme_define(%s): %llu bytes (%llu padded) do not fit in store %s/%s: the "
                       "largest free range of its %d file(s) is %llu bytes",
                       name, (unsigned long long)bytes, (unsigned long long)padded, s->dir, s->name,
                       s->num_files, (unsigned long long)free_max);
        goto done;
    }
    if (s->num_tensors == s->cap_tensors) {
        int cap = s->cap_tensors ? s->cap_tensors * 2 : 64;
        nvme_tensor *t = realloc(s->tensors, (size_t)cap * sizeof *t);
        if (!t) {
            st = zero_fail(&s->err, ZERO_OUT_OF_MEMORY, "zero_nvme_define(%s): no memory", name);
            goto done;
        }
        s->tensors = t;
        s->cap_tensors = cap;
    }
    char *copy = dup_string(name);
    if (!copy) {
        st = zero_fail(&s->err, ZERO_OUT_OF_MEMORY, "zero_nvme_define(%s): no memory", name);
        goto done;
    }
    nvme_file *f = &s->files[file];
    s->tensors[s->num_tensors] = (nvme_tensor){copy, file, f->used, bytes, padded, 0};
    f->used += padded;
    *out = s->num_tensors++;
done:
    pthread_mutex_unlock(&s->mu);
    return st;
}

zero_status zero_nvme_find(zero_nvme_store *s, const char *name, zero_nvme_tensor *out)
{
    if (!s || !name || !out)
        return zero_fail(s ? &s->err : NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_find: %s is NULL",
                         !s ? "store" : !name ? "name" : "out");
    pthread_mutex_lock(&s->mu);
    int i = find_locked(s, name);
    pthread_mutex_unlock(&s->mu);
    if (i < 0)
        return zero_fail(&s->err, ZERO_NOT_FOUND, "zero_nvme_find: no tensor named '%s' in store %s/%s", name,
                         s->dir, s->name);
    *out = i;
    return ZERO_OK;
}

zero_status zero_nvme_tensor_get_info(zero_nvme_store *s, zero_nvme_tensor t, zero_nvme_tensor_info *out)
{
    if (!s || !out)
        return zero_fail(s ? &s->err : NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_tensor_get_info: %s is NULL",
                         !s ? "store" : "out");
    pthread_mutex_lock(&s->mu);
    zero_status st = ZERO_OK;
    if (t < 0 || t >= s->num_tensors) {
        st = zero_fail(&s->err, ZERO_NOT_FOUND, "zero_nvme_tensor_get_info: tensor handle %d is not defined "
                       "(store %s/%s has %d tensors)", (int)t, s->dir, s->name, s->num_tensors);
    } else {
        const nvme_tensor *x = &s->tensors[t];
        *out = (zero_nvme_tensor_info){x->name, s->files[x->file].path, x->offset, x->bytes, x->padded,
                                       x->written};
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}
