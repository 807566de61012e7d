/* The NVMe store, run once per I/O engine (argv[1]: uring | sync):
 * bitwise round trips of 1 byte .. 5 MiB from aligned and unaligned buffers
 * (the file holds the bytes plus zero padding), hundreds of requests
 * outstanding at once, random churn against a model, exact byte counters, queue depth changes, files
 * removed at close (kept on request), and the error paths: a missing or
 * unwritable directory, ENOSPC at open, an undefined or never-written
 * tensor, a file truncated behind the store (a short read naming the file),
 * a write the kernel refuses (EFBIG under RLIMIT_FSIZE), a wait that times
 * out. Temp dirs live under $TMPDIR or /tmp and are removed. */
#include <signal.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

#include "nvme_common.h"
#include "tmpdir.h"

static zero_nvme_io_engine engine;

static zero_status open_store(zero_nvme_store **s, const char *dir, uint64_t capacity, int qd, uint64_t block)
{
    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    o.dir = dir;
    o.capacity = capacity;
    o.queue_depth = qd;
    o.block_bytes = block;
    o.io = engine;
    o.timeout_s = 20;
    return zero_nvme_store_create(s, &o);
}

static void test_roundtrips(const char *dir)
{
    zero_nvme_store *s = NULL;
    CHECK_OK(open_store(&s, dir, 64u << 20, 4, 256 << 10));
    if (!s) return;
    zero_nvme_store_info info;
    CHECK_OK(zero_nvme_store_get_info(s, &info));
    CHECK(info.uses_uring == (engine == ZERO_NVME_IO_URING));
    fprintf(stderr, "store: uring %d direct %d\n", info.uses_uring, info.uses_direct);
    static const size_t sizes[] = {1, 7, 511, 4095, 4096, 4097, 8191, 12345, 65536, 262144, 262145,
                                   1u << 20, (1u << 20) + 3, (3u << 20) + 17, 5u << 20};
    uint64_t padded_sum = 0;
    int n = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (size_t mis = 0; mis <= 1; mis++) {
            char name[64];
            snprintf(name, sizeof name, "t%zu.%zu", sizes[i], mis);
            roundtrip(s, name, sizes[i], mis ? 1 + i : 0, i * 2 + mis);
            padded_sum += (sizes[i] + 4095) / 4096 * 4096;
            n++;
        }
    }
    CHECK_OK(zero_nvme_store_get_info(s, &info));
    CHECK(info.num_tensors == n);
    CHECK(info.used == padded_sum);
    CHECK(info.bytes_written == padded_sum && info.bytes_read == padded_sum);

    /* offsets: aligned, disjoint, in definition order within the file */
    zero_nvme_tensor_info a, b;
    CHECK_OK(zero_nvme_tensor_get_info(s, 0, &a));
    CHECK(a.offset == 0 && a.bytes == 1 && a.padded == 4096 && a.written == 1);
    CHECK_OK(zero_nvme_tensor_get_info(s, 5, &b));
    CHECK(b.offset % 4096 == 0 && b.offset == 5 * 4096 && strcmp(b.name, "t511.1") == 0);

    /* queue depth 1 still moves a multi-segment tensor correctly */
    CHECK_OK(zero_nvme_store_set_queue_depth(s, 1));
    roundtrip(s, "qd1", (2u << 20) + 5, 0, 99);
    CHECK(zero_nvme_store_set_queue_depth(s, 0) == ZERO_INVALID_ARGUMENT);
    CHECK(zero_nvme_store_set_queue_depth(s, ZERO_NVME_MAX_QUEUE_DEPTH + 1) == ZERO_INVALID_ARGUMENT);
    CHECK_OK(zero_nvme_store_destroy(s));
    CHECK_MSG(tmpdir_count(dir) == 0, "close left %d files in %s", tmpdir_count(dir), dir);
}

/* 256 tensors over 3 files: every write in flight at once, then every read,
 * waited for in reverse order. */
static void test_many_outstanding(const char *dir)
{
    enum { N = 256 };
    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    o.dir = dir;
    o.name = "many";
    o.capacity = 16u << 20;
    o.num_files = 3;
    o.queue_depth = 16;
    o.block_bytes = 8192;
    o.io = engine;
    zero_nvme_store *s = NULL;
    CHECK_OK(zero_nvme_store_create(&s, &o));
    if (!s) return;
    CHECK(tmpdir_count(dir) == 3);
    unsigned char *src[N], *dst[N];
    zero_nvme_tensor t[N];
    zero_nvme_request *rq[N];
    size_t bytes[N];
    for (int i = 0; i < N; i++) {
        bytes[i] = 1000 + (size_t)i * 211; /* up to ~55 KB, mostly unaligned */
        src[i] = aligned_alloc(4096, (bytes[i] + 4095) / 4096 * 4096);
        dst[i] = aligned_alloc(4096, (bytes[i] + 4095) / 4096 * 4096);
        pattern(src[i], bytes[i], 1000 + (uint64_t)i);
        memset(dst[i], 0, bytes[i]);
        char name[32];
        snprintf(name, sizeof name, "m%d", i);
        CHECK_OK(zero_nvme_define(s, name, bytes[i], &t[i]));
    }
    zero_nvme_tensor_info ti;
    CHECK_OK(zero_nvme_tensor_get_info(s, t[1], &ti));
    CHECK(strstr(ti.path, "many.1.swap") != NULL); /* round robin over the files */
    for (int i = 0; i < N; i++) CHECK_OK(zero_nvme_write_async(s, t[i], src[i], &rq[i]));
    for (int i = 0; i < N; i++) CHECK_OK(zero_nvme_wait(s, rq[i], 0));
    for (int i = 0; i < N; i++) CHECK_OK(zero_nvme_read_async(s, t[i], dst[i], &rq[i]));
    int done = 0;
    CHECK_OK(zero_nvme_test(s, rq[0], &done));
    for (int i = N - 1; i >= 0; i--) CHECK_OK(zero_nvme_wait(s, rq[i], 0));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += memcmp(src[i], dst[i], bytes[i]) != 0;
    CHECK_MSG(bad == 0, "%d of %d tensors differ after concurrent round trips", bad, N);
    /* requests left un-waited are freed by close (ASan checks) */
    for (int i = 0; i < 8; i++) CHECK_OK(zero_nvme_read_async(s, t[i], dst[i], &rq[i]));
    CHECK_OK(zero_nvme_store_destroy(s));
    for (int i = 0; i < N; i++) {
        free(src[i]);
        free(dst[i]);
    }
}

/* Churn: 2000 random operations over 48 tensors - writes, reads, waits in
 * random order, queue depth changed while requests are in flight - with a
 * model of each tensor's last written bytes; every completed read must equal
 * it bitwise. At most one request per tensor is in flight (the store's rule). */
static void test_random_churn(const char *dir)
{
    enum { T = 48, MAXB = 70000 };
    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    o.dir = dir;
    o.name = "churn";
    o.capacity = 8u << 20;
    o.num_files = 2;
    o.queue_depth = 3;
    o.block_bytes = 16384;
    o.io = engine;
    zero_nvme_store *s = NULL;
    CHECK_OK(zero_nvme_store_create(&s, &o));
    if (!s) return;
    zero_nvme_tensor t[T];
    size_t bytes[T];
    unsigned char *model[T], *buf[T];
    zero_nvme_request *rq[T];
    int kind[T], written[T]; /* kind: 0 idle, 1 write in flight, 2 read in flight */
    uint64_t x = 42;
    for (int i = 0; i < T; i++) {
        x = x * 6364136223846793005ull + 1;
        bytes[i] = 1 + (size_t)((x >> 33) % MAXB);
        model[i] = calloc(1, bytes[i]);
        buf[i] = malloc(bytes[i] + 1) + (i % 2); /* half of them unaligned */
        rq[i] = NULL;
        kind[i] = written[i] = 0;
        char name[32];
        snprintf(name, sizeof name, "c%d", i);
        CHECK_OK(zero_nvme_define(s, name, bytes[i], &t[i]));
    }
    int bad = 0, reads = 0;
    for (int step = 0; step < 2000; step++) {
        x = x * 6364136223846793005ull + 1;
        int i = (int)((x >> 33) % T), what = (int)((x >> 20) % 8);
        if (what == 7) {
            CHECK_OK(zero_nvme_store_set_queue_depth(s, 1 + (int)((x >> 40) % 16)));
        } else if (kind[i] != 0) {
            CHECK_OK(zero_nvme_wait(s, rq[i], 0));
            if (kind[i] == 2) {
                bad += memcmp(buf[i], model[i], bytes[i]) != 0;
                reads++;
            } else {
                written[i] = 1;
            }
            kind[i] = 0;
        } else if (what < 4 || !written[i]) {
            pattern(buf[i], bytes[i], (uint64_t)step);
            memcpy(model[i], buf[i], bytes[i]);
            CHECK_OK(zero_nvme_write_async(s, t[i], buf[i], &rq[i]));
            kind[i] = 1;
        } else {
            memset(buf[i], 0x5A, bytes[i]);
            CHECK_OK(zero_nvme_read_async(s, t[i], buf[i], &rq[i]));
            kind[i] = 2;
        }
    }
    for (int i = 0; i < T; i++) {
        if (kind[i]) CHECK_OK(zero_nvme_wait(s, rq[i], 0));
        if (kind[i] == 2) bad += memcmp(buf[i], model[i], bytes[i]) != 0;
    }
    CHECK_MSG(bad == 0 && reads > 100, "%d of %d reads differ from the last write", bad, reads);
    for (int i = 0; i < T; i++) {
        unsigned char *check = malloc(bytes[i]);
        if (written[i] || kind[i] == 1) {
            CHECK_OK(zero_nvme_read(s, t[i], check));
            CHECK(memcmp(check, model[i], bytes[i]) == 0);
        }
        free(check);
        free(model[i]);
        free(buf[i] - (i % 2));
    }
    CHECK_OK(zero_nvme_store_destroy(s));
}

static void test_keep_files(const char *dir)
{
    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    o.dir = dir;
    o.name = "kept";
    o.capacity = 1 << 20;
    o.num_files = 2;
    o.keep_files = 1;
    o.io = engine;
    zero_nvme_store *s = NULL;
    CHECK_OK(zero_nvme_store_create(&s, &o));
    CHECK_OK(zero_nvme_store_destroy(s));
    CHECK(tmpdir_count(dir) == 2);
    char p[4200];
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/kept.%d.swap", dir, i);
        CHECK(unlink(p) == 0);
    }
}

static void test_bad_dirs(const char *dir)
{
    char p[4200];
    zero_nvme_store *s = (zero_nvme_store *)1;
    snprintf(p, sizeof p, "%s/does-not-exist", dir);
    CHECK(open_store(&s, p, 1 << 20, 4, 1 << 20) == ZERO_IO && s == NULL);
    CHECK_MSG(strstr(zero_last_error(), p) != NULL, "message does not name the directory: %s", zero_last_error());

    snprintf(p, sizeof p, "%s/a-file", dir);
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
    CHECK(open_store(&s, p, 1 << 20, 4, 1 << 20) == ZERO_IO);
    CHECK(strstr(zero_last_error(), "not a directory") != NULL);
    unlink(p);

    if (geteuid() != 0) { /* root writes anywhere: only a real user can be refused */
        snprintf(p, sizeof p, "%s/ro", dir);
        mkdir(p, 0500);
        CHECK(open_store(&s, p, 1 << 20, 4, 1 << 20) == ZERO_IO);
        CHECK_MSG(strstr(zero_last_error(), "Permission denied") && strstr(zero_last_error(), p),
                  "%s", zero_last_error());
        rmdir(p);
    } else {
        fprintf(stderr, "running as root: the read-only directory case is skipped\n");
    }

    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    CHECK(zero_nvme_store_create(&s, &o) == ZERO_INVALID_ARGUMENT); /* no dir */
    o.dir = dir;
    CHECK(zero_nvme_store_create(&s, &o) == ZERO_INVALID_ARGUMENT); /* no capacity */
    o.capacity = 1 << 20;
    o.block_bytes = 1000;
    CHECK(zero_nvme_store_create(&s, &o) == ZERO_INVALID_ARGUMENT);
    CHECK(strstr(zero_last_error(), "block_bytes") != NULL);
    CHECK(tmpdir_count(dir) == 0);
}

/* ENOSPC at open: a preallocation larger than the tmpfs (fast to refuse, no
 * blocks written). The failed store leaves no file behind. */
static void test_enospc(void)
{
    char shm[4200];
    if (tmpdir_make("/dev/shm", shm, sizeof shm) != 0) {
        fprintf(stderr, "no /dev/shm: ENOSPC case skipped\n");
        return;
    }
    struct statvfs vfs;
    if (statvfs(shm, &vfs) != 0 || vfs.f_blocks == 0) { /* an unlimited tmpfs would try to fill RAM */
        fprintf(stderr, "/dev/shm has no size limit: ENOSPC case skipped\n");
        tmpdir_remove(shm);
        return;
    }
    zero_nvme_store *s = NULL;
    zero_status st = open_store(&s, shm, 1ull << 50, 4, 1 << 20);
    CHECK_MSG(st == ZERO_IO && strstr(zero_last_error(), "ENOSPC") && strstr(zero_last_error(), shm),
              "%s: %s", zero_status_name(st), zero_last_error());
    CHECK(tmpdir_count(shm) == 0);
    zero_nvme_store_destroy(s);
    tmpdir_remove(shm);
}

static void test_lookup_errors(const char *dir)
{
    zero_nvme_store *s = NULL;
    CHECK_OK(open_store(&s, dir, 1 << 20, 4, 1 << 20));
    if (!s) return;
    zero_nvme_tensor t, u;
    unsigned char buf[100] = {0};
    zero_nvme_request *r = (zero_nvme_request *)1;
    CHECK_OK(zero_nvme_define(s, "exists", sizeof buf, &t));
    CHECK(zero_nvme_read_async(s, 999, buf, &r) == ZERO_NOT_FOUND && r == NULL);
    CHECK(strstr(zero_nvme_store_last_error(s), "999") != NULL);
    CHECK(zero_nvme_find(s, "nope", &u) == ZERO_NOT_FOUND);
    CHECK(strstr(zero_last_error(), "'nope'") != NULL);
    CHECK_OK(zero_nvme_find(s, "exists", &u));
    CHECK(u == t);
    CHECK(zero_nvme_read(s, t, buf) == ZERO_INVALID_STATE); /* never written */
    CHECK(strstr(zero_last_error(), "never been written") != NULL);
    CHECK(zero_nvme_define(s, "exists", 10, &u) == ZERO_INVALID_ARGUMENT);
    CHECK(zero_nvme_define(s, "huge", 2 << 20, &u) == ZERO_OUT_OF_MEMORY);
    CHECK(strstr(zero_last_error(), "do not fit") != NULL);
    CHECK_OK(zero_nvme_wait(s, NULL, 0));
    CHECK_OK(zero_nvme_store_destroy(s));
    CHECK_OK(zero_nvme_store_destroy(NULL));
}

/* Shrink the file under the store: reading the tensor past the new end is
 * a short read naming the file; the tensor before it still reads fine. */
static void test_truncated(const char *dir)
{
    zero_nvme_store *s = NULL;
    CHECK_OK(open_store(&s, dir, 4 << 20, 4, 64 << 10));
    if (!s) return;
    size_t n = 300000;
    unsigned char *src = aligned_alloc(4096, 303104), *dst = aligned_alloc(4096, 303104);
    pattern(src, n, 7);
    zero_nvme_tensor a, b;
    CHECK_OK(zero_nvme_define(s, "a", n, &a));
    CHECK_OK(zero_nvme_define(s, "b", n, &b));
    CHECK_OK(zero_nvme_write(s, a, src));
    CHECK_OK(zero_nvme_write(s, b, src));
    zero_nvme_tensor_info ib;
    CHECK_OK(zero_nvme_tensor_get_info(s, b, &ib));
    CHECK(truncate(ib.path, (off_t)(ib.offset + 100000)) == 0);
    zero_status st = zero_nvme_read(s, b, dst);
    const char *msg = zero_nvme_store_last_error(s);
    CHECK_MSG(st == ZERO_CORRUPT, "got %s: %s", zero_status_name(st), msg);
    CHECK_MSG(strstr(msg, "short read") && strstr(msg, ib.path) && strstr(msg, "'b'"), "message: %s", msg);
    memset(dst, 0, n);
    CHECK_OK(zero_nvme_read(s, a, dst));
    CHECK(memcmp(src, dst, n) == 0);
    CHECK_OK(zero_nvme_store_destroy(s));
    free(src);
    free(dst);
}

/* The kernel refuses a write (EFBIG past RLIMIT_FSIZE): ZERO_IO naming
 * errno, the file and the offset; the store stays usable. */
static void test_write_refused(const char *dir)
{
    zero_nvme_store *s = NULL;
    CHECK_OK(open_store(&s, dir, 1 << 20, 4, 1 << 20));
    if (!s) return;
    zero_nvme_tensor a, b;
    CHECK_OK(zero_nvme_define(s, "small", 4096, &a));
    CHECK_OK(zero_nvme_define(s, "far", 65536, &b));
    unsigned char *buf = aligned_alloc(4096, 65536);
    pattern(buf, 65536, 3);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 8192;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    zero_status st = zero_nvme_write(s, b, buf);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    const char *msg = zero_nvme_store_last_error(s);
    CHECK_MSG(st == ZERO_IO && strstr(msg, "EFBIG") && strstr(msg, "'far'") && strstr(msg, "offset 4096"),
              "%s: %s", zero_status_name(st), msg);
    zero_nvme_tensor_info ti;
    CHECK_OK(zero_nvme_tensor_get_info(s, b, &ti));
    CHECK(ti.written == 0);
    CHECK_OK(zero_nvme_write(s, a, buf)); /* within the limit: fine */
    CHECK_OK(zero_nvme_write(s, b, buf)); /* limit lifted: fine */
    CHECK_OK(zero_nvme_store_destroy(s));
    free(buf);
}

/* A deadline far shorter than the I/O: TIMEOUT naming the tensor and file,
 * and the request stays valid for a second wait. */
static void test_timeout(const char *dir)
{
    zero_nvme_store *s = NULL;
    CHECK_OK(open_store(&s, dir, 16 << 20, 1, 4096));
    if (!s) return;
    size_t n = 8u << 20;
    unsigned char *buf = aligned_alloc(4096, n);
    pattern(buf, n, 5);
    zero_nvme_tensor t;
    CHECK_OK(zero_nvme_define(s, "slow", n, &t));
    zero_nvme_request *r = NULL;
    CHECK_OK(zero_nvme_write_async(s, t, buf, &r));
    zero_status st = zero_nvme_wait(s, r, 1e-6);
    if (engine == ZERO_NVME_IO_SYNC) {
        CHECK(st == ZERO_OK); /* synchronous: done before the wait */
    } else {
        CHECK_MSG(st == ZERO_TIMEOUT || st == ZERO_OK, "%s", zero_status_name(st));
        if (st == ZERO_TIMEOUT) {
            const char *msg = zero_nvme_store_last_error(s);
            CHECK_MSG(strstr(msg, "'slow'") && strstr(msg, "not complete") && strstr(msg, ".swap"), "%s", msg);
            CHECK_OK(zero_nvme_wait(s, r, 0));
        } else {
            fprintf(stderr, "note: 8 MiB in 2048 segments finished within 1 us; timeout unchecked\n");
        }
    }
    CHECK_OK(zero_nvme_store_destroy(s));
    free(buf);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "uring";
    engine = strcmp(which, "sync") == 0 ? ZERO_NVME_IO_SYNC : ZERO_NVME_IO_URING;
    zero_set_log_handler(count_warnings, ZERO_LOG_WARN, NULL);
    char dir[1024];
    if (tmpdir_make(NULL, dir, sizeof dir) != 0) {
        fprintf(stderr, "cannot make a temp dir\n");
        return 1;
    }
    if (engine == ZERO_NVME_IO_URING) {
        zero_nvme_store *probe = NULL;
        zero_status st = open_store(&probe, dir, 4096, 1, 4096);
        if (st == ZERO_UNSUPPORTED) {
            tmpdir_remove(dir);
            CHECK_SKIP("io_uring: %s", zero_last_error());
        }
        zero_nvme_store_destroy(probe);
    }
    test_roundtrips(dir);
    test_many_outstanding(dir);
    test_random_churn(dir);
    test_keep_files(dir);
    test_bad_dirs(dir);
    test_enospc();
    test_lookup_errors(dir);
    test_truncated(dir);
    test_write_refused(dir);
    test_timeout(dir);
    CHECK_MSG(tmpdir_count(dir) == 0, "%d files left behind", tmpdir_count(dir));
    tmpdir_remove(dir);
    return check_exit();
}
