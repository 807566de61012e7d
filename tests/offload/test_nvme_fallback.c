/* White box: the store built with ZERO_NVME_TEST_REFUSE_DIRECT, where
 * open(O_DIRECT) fails with EINVAL as on a file system without direct I/O
 * (tmpfs before Linux 6.6), and ZERO_NVME_TEST_REFUSE_URING, where
 * io_uring_queue_init fails with EPERM as under a seccomp profile. AUTO falls
 * back to buffered pread/pwrite with exactly one O_DIRECT warning and round
 * trips bitwise; DIRECT_REQUIRED and IO_URING fail with ZERO_UNSUPPORTED and
 * leave no file. Also /dev/shm itself (the real thing): a round trip, and
 * one warning exactly when the kernel refused O_DIRECT there. */
#include "nvme_common.h"
#include "tmpdir.h"

static void run(const char *parent, int injected)
{
    char dir[1024];
    if (tmpdir_make(parent, dir, sizeof dir) != 0) {
        fprintf(stderr, "no temp dir under %s: skipped\n", parent ? parent : "$TMPDIR");
        return;
    }
    for (int io = ZERO_NVME_IO_AUTO; io <= ZERO_NVME_IO_SYNC; io += 2) {
        zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
        o.dir = dir;
        o.capacity = 8u << 20;
        o.num_files = 2;
        o.block_bytes = 64 << 10;
        o.io = (zero_nvme_io_engine)io;
        int w0 = atomic_load(&warnings_seen);
        zero_nvme_store *s = NULL;
        CHECK_OK(zero_nvme_store_create(&s, &o));
        if (!s) continue;
        zero_nvme_store_info info;
        CHECK_OK(zero_nvme_store_get_info(s, &info));
        int warned = atomic_load(&warnings_seen) - w0;
        if (injected) CHECK(info.uses_direct == 0 && info.uses_uring == 0);
        CHECK_MSG(warned == (info.uses_direct ? 0 : 1), "%d warnings, direct %d", warned, info.uses_direct);
        fprintf(stderr, "%s: io %d, direct %d, uring %d\n", dir, io, info.uses_direct, info.uses_uring);
        roundtrip(s, "a", 1, 0, 1);
        roundtrip(s, "b", 100000, 0, 2);
        roundtrip(s, "c", (1u << 20) + 1, 3, 3);
        CHECK(atomic_load(&warnings_seen) - w0 == warned); /* one warning per store, not per I/O */
        CHECK_OK(zero_nvme_store_destroy(s));
    }
    if (injected) {
        zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
        o.dir = dir;
        o.capacity = 1 << 20;
        o.direct = ZERO_NVME_DIRECT_REQUIRED;
        zero_nvme_store *s = NULL;
        CHECK(zero_nvme_store_create(&s, &o) == ZERO_UNSUPPORTED && s == NULL);
        CHECK(strstr(zero_last_error(), "O_DIRECT") != NULL);
        o.direct = ZERO_NVME_DIRECT_AUTO;
        o.io = ZERO_NVME_IO_URING;
        CHECK(zero_nvme_store_create(&s, &o) == ZERO_UNSUPPORTED && s == NULL);
        CHECK_MSG(strstr(zero_last_error(), "io_uring") != NULL, "%s", zero_last_error());
    }
    CHECK(tmpdir_count(dir) == 0);
    tmpdir_remove(dir);
}

int main(void)
{
    zero_set_log_handler(count_warnings, ZERO_LOG_WARN, NULL);
#ifdef ZERO_NVME_TEST_REFUSE_DIRECT
    run(NULL, 1);
#else
    run("/dev/shm", 0);
#endif
    return check_exit();
}
