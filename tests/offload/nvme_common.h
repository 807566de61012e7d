/* Shared by the NVMe store tests: patterned buffers, a bitwise round trip
 * that also checks the bytes in the file itself, and a warning counter. */
#ifndef ZERO_TESTS_OFFLOAD_NVME_COMMON_H
#define ZERO_TESTS_OFFLOAD_NVME_COMMON_H

#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>
#include <zero/log.h>
#include <zero/offload.h>

#include "check.h"

/* Warnings about O_DIRECT only: where io_uring is refused (a container's
 * seccomp profile) the store also warns about that, which is not counted. */
static atomic_int warnings_seen;
static inline void count_warnings(zero_log_level level, const char *msg, void *user)
{
    (void)user;
    if (level == ZERO_LOG_WARN && strstr(msg, "O_DIRECT")) atomic_fetch_add(&warnings_seen, 1);
    fprintf(stderr, "  (log) %s\n", msg);
}

static inline void pattern(unsigned char *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (unsigned char)x;
    }
}

/* The tensor's bytes as they are in its file (padding included), read with
 * plain buffered I/O behind the store's back. 1 when they equal src and the
 * padding is zero. */
static inline int file_holds(zero_nvme_store *s, zero_nvme_tensor t, const unsigned char *src)
{
    zero_nvme_tensor_info ti;
    if (zero_nvme_tensor_get_info(s, t, &ti) != ZERO_OK) return 0;
    int fd = open(ti.path, O_RDONLY);
    if (fd < 0) return 0;
    unsigned char *f = malloc(ti.padded);
    ssize_t n = f ? pread(fd, f, ti.padded, (off_t)ti.offset) : -1;
    close(fd);
    int ok = n == (ssize_t)ti.padded && memcmp(f, src, ti.bytes) == 0;
    for (size_t i = ti.bytes; ok && i < ti.padded; i++) ok = f[i] == 0;
    free(f);
    return ok;
}

/* Write `bytes` from a buffer at `misalign` bytes past a 4096 boundary, read
 * them back into another such buffer, compare bitwise, check the file and
 * that the bytes after the destination were not touched. */
static inline void roundtrip(zero_nvme_store *s, const char *name, size_t bytes, size_t misalign, uint64_t seed)
{
    const size_t guard = 8192;
    unsigned char *sbase = aligned_alloc(4096, (bytes + misalign + 4095) / 4096 * 4096 + 4096);
    unsigned char *dbase = aligned_alloc(4096, (bytes + misalign + guard + 4095) / 4096 * 4096 + 4096);
    unsigned char *src = sbase + misalign, *dst = dbase + misalign;
    pattern(src, bytes, seed);
    memset(dst, 0xA5, bytes + guard);
    zero_nvme_tensor t = -1;
    CHECK_OK(zero_nvme_define(s, name, bytes, &t));
    zero_nvme_request *w = NULL, *r = NULL;
    CHECK_OK(zero_nvme_write_async(s, t, src, &w));
    CHECK_OK(zero_nvme_wait(s, w, 0));
    CHECK_OK(zero_nvme_read_async(s, t, dst, &r));
    CHECK_OK(zero_nvme_wait(s, r, 0));
    CHECK_MSG(memcmp(src, dst, bytes) == 0, "%s: %zu bytes at misalignment %zu differ after the round trip",
              name, bytes, misalign);
    int guard_ok = 1;
    for (size_t i = 0; i < guard; i++) guard_ok &= dst[bytes + i] == 0xA5;
    CHECK_MSG(guard_ok, "%s: the read wrote past the %zu-byte destination", name, bytes);
    CHECK_MSG(file_holds(s, t, src), "%s: the file does not hold the %zu bytes plus zero padding", name, bytes);
    free(sbase);
    free(dbase);
}

#endif
