/* The swapper over 64 chunks (the NVMe optimizer-step pattern): a running,
 * order-dependent transform applied in place chunk by chunk with reads
 * `depth` ahead and write-backs behind, three passes (rewind), checked
 * bitwise against the same transform on an in-memory copy, by reading the
 * store's files directly. Also: buffers from a host pool (exact bytes
 * accounted, all returned), read-only walks leaving the files unchanged, and
 * a read error mid-walk (truncated file) that stops the walk cleanly.
 * argv[1]: uring | sync. */
#include <zero/zero.h>

#include "nvme_common.h"
#include "tmpdir.h"

enum { CHUNKS = 64 };

static size_t chunk_floats(int i) { return 1000 + (size_t)i * 1531 + (i % 3); }

/* Order-dependent: each chunk's update depends on the previous ones. */
static void transform(float *x, size_t n, float *running)
{
    for (size_t j = 0; j < n; j++) {
        x[j] = x[j] * 0.75f + *running;
        *running = *running * 0.5f + x[j] * 0.001f;
    }
}

static void walk(zero_nvme_store *s, zero_nvme_io_engine engine, const char *dir, int depth, zero_host_pool *pool)
{
    (void)dir;
    (void)engine;
    zero_nvme_tensor t[CHUNKS];
    float *ref[CHUNKS];
    for (int i = 0; i < CHUNKS; i++) {
        size_t n = chunk_floats(i);
        ref[i] = malloc(n * sizeof(float));
        for (size_t j = 0; j < n; j++) ref[i][j] = (float)((i * 131 + (int)j) % 1000) * 0.01f - 5.0f;
        char name[32];
        snprintf(name, sizeof name, "d%d.chunk%d", depth, i);
        CHECK_OK(zero_nvme_define(s, name, n * sizeof(float), &t[i]));
        CHECK_OK(zero_nvme_write(s, t[i], ref[i]));
    }
    size_t max_padded = (chunk_floats(CHUNKS - 1) * sizeof(float) + 4095) / 4096 * 4096;
    zero_host_pool_stats before, during, after;
    if (pool) CHECK_OK(zero_host_pool_get_stats(pool, &before));

    zero_nvme_swapper *sw = NULL;
    CHECK_OK(zero_nvme_swapper_create(&sw, s, pool, t, CHUNKS, depth, 1));
    if (!sw) return;
    if (pool) {
        CHECK_OK(zero_host_pool_get_stats(pool, &during));
        CHECK(during.in_use - before.in_use == (uint64_t)(depth + 2) * max_padded);
    }
    for (int pass = 0; pass < 3; pass++) {
        if (pass) CHECK_OK(zero_nvme_swapper_rewind(sw));
        float run_ref = 0, run = 0;
        for (int i = 0; i < CHUNKS; i++) transform(ref[i], chunk_floats(i), &run_ref);
        void *buf;
        size_t bytes, idx, seen = 0;
        zero_status st;
        while ((st = zero_nvme_swapper_next(sw, &buf, &bytes, &idx)) == ZERO_OK && buf) {
            CHECK(idx == seen && bytes == chunk_floats((int)idx) * sizeof(float));
            CHECK((uintptr_t)buf % 4096 == 0);
            transform(buf, bytes / sizeof(float), &run);
            seen++;
        }
        CHECK_OK(st);
        CHECK(seen == CHUNKS && idx == CHUNKS);
        CHECK_OK(zero_nvme_swapper_next(sw, &buf, &bytes, &idx)); /* past the end: stays there */
        CHECK(buf == NULL);
        CHECK_OK(zero_nvme_swapper_finish(sw));
        CHECK(run == run_ref);
    }
    int bad = 0;
    for (int i = 0; i < CHUNKS; i++) bad += !file_holds(s, t[i], (const unsigned char *)ref[i]);
    CHECK_MSG(bad == 0, "depth %d: %d of %d chunks in the files differ from the reference", depth, bad, CHUNKS);
    zero_nvme_swapper_destroy(sw);

    /* read only: the caller sees every chunk, the files do not change */
    CHECK_OK(zero_nvme_swapper_create(&sw, s, pool, t, CHUNKS, depth, 0));
    void *buf;
    size_t bytes, idx;
    int seen_ok = 0;
    while (zero_nvme_swapper_next(sw, &buf, &bytes, &idx) == ZERO_OK && buf) {
        seen_ok += memcmp(buf, ref[idx], bytes) == 0;
        memset(buf, 0, bytes);
    }
    CHECK(seen_ok == CHUNKS);
    CHECK_OK(zero_nvme_swapper_finish(sw));
    zero_nvme_swapper_destroy(sw);
    bad = 0;
    for (int i = 0; i < CHUNKS; i++) bad += !file_holds(s, t[i], (const unsigned char *)ref[i]);
    CHECK(bad == 0);
    if (pool) {
        CHECK_OK(zero_host_pool_get_stats(pool, &after));
        CHECK(after.in_use == before.in_use && after.live_chunks == before.live_chunks);
    }
    for (int i = 0; i < CHUNKS; i++) free(ref[i]);
}

/* Truncate the file under tensor 5: next() on it fails with the short read,
 * later calls say the swapper failed, finish drains, destroy frees. */
static void walk_error(zero_nvme_store *s)
{
    zero_nvme_tensor t[10];
    float *x = calloc(8192, sizeof(float));
    for (int i = 0; i < 10; i++) {
        char name[32];
        snprintf(name, sizeof name, "e%d", i);
        CHECK_OK(zero_nvme_define(s, name, 8192 * sizeof(float), &t[i]));
        CHECK_OK(zero_nvme_write(s, t[i], x));
    }
    zero_nvme_tensor_info ti;
    CHECK_OK(zero_nvme_tensor_get_info(s, t[5], &ti));
    CHECK(truncate(ti.path, (off_t)ti.offset + 1000) == 0);
    zero_nvme_swapper *sw = NULL;
    CHECK_OK(zero_nvme_swapper_create(&sw, s, NULL, t, 10, 2, 1));
    void *buf;
    size_t bytes, idx;
    zero_status st;
    int got = 0;
    while ((st = zero_nvme_swapper_next(sw, &buf, &bytes, &idx)) == ZERO_OK && buf) got++;
    CHECK_MSG(st == ZERO_CORRUPT && got == 5, "%s after %d chunks", zero_status_name(st), got);
    CHECK(strstr(zero_nvme_swapper_last_error(sw), "'e5'") && strstr(zero_nvme_swapper_last_error(sw), ti.path));
    CHECK(zero_nvme_swapper_next(sw, &buf, &bytes, &idx) == ZERO_INVALID_STATE);
    CHECK(zero_nvme_swapper_rewind(sw) == ZERO_INVALID_STATE);
    zero_nvme_swapper_finish(sw); /* drains; may report a write past the new end */
    zero_nvme_swapper_destroy(sw);
    free(x);
}

int main(int argc, char **argv)
{
    zero_nvme_io_engine engine = argc > 1 && strcmp(argv[1], "sync") == 0 ? ZERO_NVME_IO_SYNC : ZERO_NVME_IO_URING;
    zero_set_log_handler(count_warnings, ZERO_LOG_WARN, NULL);
    char dir[1024];
    if (tmpdir_make(NULL, dir, sizeof dir) != 0) return 1;
    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    o.dir = dir;
    o.capacity = 64u << 20;
    o.num_files = 2;
    o.queue_depth = 8;
    o.block_bytes = 64 << 10;
    o.io = engine;
    o.timeout_s = 20;
    zero_nvme_store *s = NULL;
    zero_status st = zero_nvme_store_create(&s, &o);
    if (st == ZERO_UNSUPPORTED) {
        tmpdir_remove(dir);
        CHECK_SKIP("%s", zero_last_error());
    }
    CHECK_OK(st);
    zero_device *dev = NULL;
    CHECK_OK(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));
    zero_host_pool *pool = NULL;
    CHECK_OK(zero_host_pool_create(&pool, dev, 8u << 20));
    if (s && pool) {
        walk(s, engine, dir, 1, NULL);
        walk(s, engine, dir, 3, pool);
        walk_error(s);
    }
    zero_host_pool_destroy(pool);
    zero_device_destroy(dev);
    CHECK_OK(zero_nvme_store_destroy(s));
    CHECK(tmpdir_count(dir) == 0);
    tmpdir_remove(dir);
    return check_exit();
}
