/* Checkpoint files: durable writes (temporary name, fsync, rename, fsync of
 * the directory), the shard header, and the shard writer. */
#include "checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

const char *const ckpt_kind_names[CKPT_NUM_KINDS] = {"master", "exp_avg", "exp_avg_sq"};

/* ---------------------------------------------------------------- plain io */

zero_status ckpt_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path)
{
    const char *p = buf;
    while (n) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return zero_fail(NULL, ZERO_IO, "checkpoint: writing %s at offset %llu: %s", path,
                             (unsigned long long)off, strerror(errno));
        }
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return ZERO_OK;
}

zero_status ckpt_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path)
{
    char *p = buf;
    while (n) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return zero_fail(NULL, ZERO_IO, "checkpoint: reading %s at offset %llu: %s", path,
                             (unsigned long long)off, strerror(errno));
        }
        if (k == 0)
            return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s is truncated: no data at offset %llu", path,
                             (unsigned long long)off);
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return ZERO_OK;
}

zero_status ckpt_fsync_dir(const char *dir, int durable)
{
    if (!durable) return ZERO_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return zero_fail(NULL, ZERO_IO, "checkpoint: opening directory %s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    /* Some filesystems refuse fsync on directories (EINVAL); their renames are then as durable as they get. */
    if (rc != 0 && e != EINVAL)
        return zero_fail(NULL, ZERO_IO, "checkpoint: fsync of directory %s: %s", dir, strerror(e));
    return ZERO_OK;
}

static void parent_dir(const char *path, char *out, size_t n)
{
    snprintf(out, n, "%s", path);
    char *s = strrchr(out, '/');
    if (!s) snprintf(out, n, ".");
    else if (s == out) out[1] = 0;
    else *s = 0;
}

zero_status ckpt_write_file_atomic(const char *path, const void *data, size_t n, int durable)
{
    char tmp[1200], parent[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return zero_fail(NULL, ZERO_IO, "checkpoint: creating %s: %s", tmp, strerror(errno));
    zero_status st = ckpt_pwrite_all(fd, data, n, 0, tmp);
    if (st == ZERO_OK && durable && fsync(fd) != 0)
        st = zero_fail(NULL, ZERO_IO, "checkpoint: fsync of %s: %s", tmp, strerror(errno));
    close(fd);
    if (st == ZERO_OK && rename(tmp, path) != 0)
        st = zero_fail(NULL, ZERO_IO, "checkpoint: renaming %s to %s: %s", tmp, path, strerror(errno));
    if (st != ZERO_OK) {
        unlink(tmp);
        return st;
    }
    parent_dir(path, parent, sizeof parent);
    return ckpt_fsync_dir(parent, durable);
}

zero_status ckpt_read_file(const char *path, char **data, size_t *n)
{
    *data = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zero_fail(NULL, errno == ENOENT ? ZERO_NOT_FOUND : ZERO_IO, "checkpoint: opening %s: %s", path,
                         strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size > (1ll << 31)) {
        close(fd);
        return zero_fail(NULL, ZERO_IO, "checkpoint: %s: cannot stat or too large", path);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        close(fd);
        return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint: reading %s", path);
    }
    zero_status s = ckpt_pread_all(fd, buf, (size_t)st.st_size, 0, path);
    close(fd);
    if (s != ZERO_OK) {
        free(buf);
        return s;
    }
    buf[st.st_size] = 0;
    *data = buf;
    if (n) *n = (size_t)st.st_size;
    return ZERO_OK;
}

void ckpt_remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    char p[1400];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) ckpt_remove_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(path);
}

zero_status ckpt_mkdir_p(const char *path)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return zero_fail(NULL, ZERO_IO, "checkpoint: creating directory %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return zero_fail(NULL, ZERO_IO, "checkpoint: creating directory %s: %s", tmp, strerror(errno));
    return ZERO_OK;
}

/* ---------------------------------------------------------------- header */

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void ckpt_header_encode(const ckpt_header *h, unsigned char out[CKPT_HEADER_BYTES])
{
    memset(out, 0, CKPT_HEADER_BYTES);
    memcpy(out, CKPT_SHARD_MAGIC, 8);
    put32(out + 8, h->version);
    put32(out + 12, h->rank);
    put32(out + 16, h->world);
    put64(out + 24, h->index_offset);
    put64(out + 32, h->index_bytes);
    put64(out + 40, h->file_bytes);
    put32(out + 48, h->index_crc);
    put32(out + 60, zero_crc32c(0, out, 60));
}

zero_status ckpt_header_decode(const unsigned char in[CKPT_HEADER_BYTES], ckpt_header *h, const char *what)
{
    if (memcmp(in, CKPT_SHARD_MAGIC, 8) != 0)
        return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s is not a libzero checkpoint shard (no %s magic)", what,
                         CKPT_SHARD_MAGIC);
    uint32_t crc = zero_crc32c(0, in, 60);
    if (crc != get32(in + 60))
        return zero_fail(NULL, ZERO_CORRUPT,
                         "checkpoint: %s: header checksum mismatch (stored %08x, computed %08x): corrupted", what,
                         get32(in + 60), crc);
    h->version = get32(in + 8);
    h->rank = get32(in + 12);
    h->world = get32(in + 16);
    h->index_offset = get64(in + 24);
    h->index_bytes = get64(in + 32);
    h->file_bytes = get64(in + 40);
    h->index_crc = get32(in + 48);
    if (h->version != ZERO_CHECKPOINT_FORMAT_VERSION)
        return zero_fail(NULL, ZERO_UNSUPPORTED, "checkpoint: %s has format version %u; this libzero reads %d", what,
                         h->version, ZERO_CHECKPOINT_FORMAT_VERSION);
    /* written so that nothing wraps: the sizes come from the file */
    if (h->index_offset < CKPT_HEADER_BYTES || h->index_offset > h->file_bytes ||
        h->index_bytes > h->file_bytes - h->index_offset || h->index_bytes > CKPT_MAX_INDEX_BYTES)
        return zero_fail(NULL, ZERO_CORRUPT,
                         "checkpoint: %s: header sizes are inconsistent (index at %llu, %llu bytes, file %llu bytes)",
                         what, (unsigned long long)h->index_offset, (unsigned long long)h->index_bytes,
                         (unsigned long long)h->file_bytes);
    return ZERO_OK;
}

zero_status ckpt_shard_open(const char *path, int *fd_out, ckpt_header *h, json_t **index)
{
    *fd_out = -1;
    *index = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zero_fail(NULL, errno == ENOENT ? ZERO_NOT_FOUND : ZERO_IO, "checkpoint: opening %s: %s", path,
                         strerror(errno));
    struct stat st;
    unsigned char hb[CKPT_HEADER_BYTES];
    zero_status s = ZERO_OK;
    if (fstat(fd, &st) != 0) s = zero_fail(NULL, ZERO_IO, "checkpoint: stat %s: %s", path, strerror(errno));
    if (s == ZERO_OK && (uint64_t)st.st_size < CKPT_HEADER_BYTES)
        s = zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s is truncated: %lld bytes, shorter than the %d-byte header",
                      path, (long long)st.st_size, CKPT_HEADER_BYTES);
    if (s == ZERO_OK) s = ckpt_pread_all(fd, hb, sizeof hb, 0, path);
    if (s == ZERO_OK) s = ckpt_header_decode(hb, h, path);
    if (s == ZERO_OK && (uint64_t)st.st_size != h->file_bytes)
        s = zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s is %lld bytes, its header says %llu: %s", path,
                      (long long)st.st_size, (unsigned long long)h->file_bytes,
                      (uint64_t)st.st_size < h->file_bytes ? "truncated" : "trailing garbage");
    char *ib = NULL;
    if (s == ZERO_OK && !(ib = malloc(h->index_bytes + 1)))
        s = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint: index of %s", path);
    if (s == ZERO_OK) s = ckpt_pread_all(fd, ib, h->index_bytes, h->index_offset, path);
    if (s == ZERO_OK && zero_crc32c(0, ib, h->index_bytes) != h->index_crc)
        s = zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s: index checksum mismatch: corrupted", path);
    if (s == ZERO_OK) {
        json_error_t je;
        *index = json_loadb(ib, h->index_bytes, 0, &je);
        if (!*index || !json_is_object(*index))
            s = zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s: index is not a JSON object: %s", path, je.text);
    }
    free(ib);
    if (s != ZERO_OK) {
        json_decref(*index);
        *index = NULL;
        close(fd);
        return s;
    }
    *fd_out = fd;
    return ZERO_OK;
}

/* ---------------------------------------------------------------- writer */

zero_status ckpt_writer_open(ckpt_writer *w, const char *path, uint32_t rank, uint32_t world, int durable)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp_path, sizeof w->tmp_path, "%s.tmp", path);
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) return zero_fail(NULL, ZERO_IO, "checkpoint: creating %s: %s", w->tmp_path, strerror(errno));
    w->pos = CKPT_HEADER_BYTES;
    w->segs = json_array();
    w->rank = rank;
    w->world = world;
    w->durable = durable;
    return ZERO_OK;
}

zero_status ckpt_writer_segment(ckpt_writer *w, int param, int kind, uint64_t start, const float *data,
                                uint64_t count)
{
    size_t bytes = (size_t)count * sizeof(float);
    ZERO_TRY(ckpt_pwrite_all(w->fd, data, bytes, w->pos, w->tmp_path));
    uint32_t crc = zero_crc32c(0, data, bytes);
    json_array_append_new(w->segs, json_pack("[i,i,I,I,I,I]", param, kind, (json_int_t)start, (json_int_t)count,
                                             (json_int_t)w->pos, (json_int_t)crc));
    w->pos += (bytes + CKPT_ALIGN - 1) / CKPT_ALIGN * CKPT_ALIGN;
    return ZERO_OK;
}

zero_status ckpt_writer_close(ckpt_writer *w, uint64_t *file_bytes)
{
    json_t *index = json_pack("{s:i,s:i,s:O}", "rank", (int)w->rank, "world", (int)w->world, "segments", w->segs);
    char *text = json_dumps(index, JSON_COMPACT);
    json_decref(index);
    if (!text) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint: index of %s", w->path);
    ckpt_header h = {ZERO_CHECKPOINT_FORMAT_VERSION, w->rank, w->world, w->pos, strlen(text), 0, 0};
    h.file_bytes = h.index_offset + h.index_bytes;
    h.index_crc = zero_crc32c(0, text, h.index_bytes);
    unsigned char hb[CKPT_HEADER_BYTES];
    ckpt_header_encode(&h, hb);
    zero_status s = ckpt_pwrite_all(w->fd, text, h.index_bytes, h.index_offset, w->tmp_path);
    free(text);
    if (s == ZERO_OK) s = ckpt_pwrite_all(w->fd, hb, sizeof hb, 0, w->tmp_path);
    if (s == ZERO_OK && ftruncate(w->fd, (off_t)h.file_bytes) != 0)
        s = zero_fail(NULL, ZERO_IO, "checkpoint: truncating %s: %s", w->tmp_path, strerror(errno));
    if (s == ZERO_OK && w->durable && fsync(w->fd) != 0)
        s = zero_fail(NULL, ZERO_IO, "checkpoint: fsync of %s: %s", w->tmp_path, strerror(errno));
    close(w->fd);
    w->fd = -1;
    if (s == ZERO_OK && rename(w->tmp_path, w->path) != 0)
        s = zero_fail(NULL, ZERO_IO, "checkpoint: renaming %s: %s", w->tmp_path, strerror(errno));
    json_decref(w->segs);
    w->segs = NULL;
    if (s != ZERO_OK) {
        unlink(w->tmp_path);
        return s;
    }
    if (file_bytes) *file_bytes = h.file_bytes;
    return ZERO_OK;
}

void ckpt_writer_abort(ckpt_writer *w)
{
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    if (w->tmp_path[0]) unlink(w->tmp_path);
    json_decref(w->segs);
    w->segs = NULL;
}

zero_status ckpt_grow_buffer(float **buf, uint64_t *cap, uint64_t n, const char *what, const char *name)
{
    if (n <= *cap) return ZERO_OK;
    free(*buf);
    *buf = NULL;
    *cap = 0;
    if (n > SIZE_MAX / sizeof **buf || !(*buf = malloc(n * sizeof **buf)))
        return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "%s: buffer of %llu floats for %s", what, (unsigned long long)n,
                         name);
    *cap = n;
    return ZERO_OK;
}
