/* The offload path as the engine will use it on a GPU: host pool chunks on a
 * CUDA device (NUMA-local, page-locked) as the staging buffers between
 * device memory and the NVMe store. Device -> pool (async copy on a stream)
 * -> store -> pool -> device, bitwise. Exits 77 without a GPU. */
#include <zero/zero.h>
#include <zero/experimental.h>

#include "check.h"
#include "tmpdir.h"

int main(void)
{
    zero_device *dev = NULL;
    zero_status st = zero_device_create(&dev, ZERO_DEVICE_CUDA, -1);
    if (st != ZERO_OK) CHECK_SKIP("no CUDA device: %s", zero_last_error());
    const size_t n = (3u << 20) + 5; /* floats: an unaligned byte count */
    const size_t bytes = n * sizeof(float);
    zero_host_pool *pool = NULL;
    CHECK_OK(zero_host_pool_create(&pool, dev, 2 * bytes + 8192));
    float *stage_out = NULL, *stage_in = NULL;
    CHECK_OK(zero_host_pool_alloc(pool, bytes, (void **)&stage_out));
    CHECK_OK(zero_host_pool_alloc(pool, bytes, (void **)&stage_in));
    void *d_src = NULL, *d_dst = NULL;
    CHECK_OK(zero_device_alloc(dev, bytes, &d_src));
    CHECK_OK(zero_device_alloc(dev, bytes, &d_dst));
    float *host = malloc(bytes), *back = malloc(bytes);
    for (size_t i = 0; i < n; i++) host[i] = (float)i * 0.5f - 7.0f;
    CHECK_OK(zero_memcpy(dev, d_src, host, bytes));
    zero_stream *stream = NULL;
    CHECK_OK(zero_stream_create(dev, &stream));
    CHECK_OK(zero_memcpy_async(dev, stage_out, d_src, bytes, stream));
    CHECK_OK(zero_stream_sync(stream));

    char dir[1024];
    CHECK(tmpdir_make(NULL, dir, sizeof dir) == 0);
    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    o.dir = dir;
    o.capacity = bytes + 4096;
    zero_nvme_store *s = NULL;
    CHECK_OK(zero_nvme_store_create(&s, &o));
    zero_nvme_tensor t;
    CHECK_OK(zero_nvme_define(s, "master.0", bytes, &t));
    CHECK_OK(zero_nvme_write(s, t, stage_out));
    CHECK_OK(zero_nvme_read(s, t, stage_in));
    CHECK_OK(zero_memcpy_async(dev, d_dst, stage_in, bytes, stream));
    CHECK_OK(zero_stream_sync(stream));
    CHECK_OK(zero_memcpy(dev, back, d_dst, bytes));
    CHECK(memcmp(host, back, bytes) == 0);
    CHECK_OK(zero_nvme_store_destroy(s));
    tmpdir_remove(dir);

    zero_host_pool_stats ps;
    CHECK_OK(zero_host_pool_get_stats(pool, &ps));
    CHECK(ps.in_use == 2 * ((bytes + 4095) / 4096 * 4096));
    zero_stream_destroy(stream);
    zero_device_free(dev, d_src);
    zero_device_free(dev, d_dst);
    zero_host_pool_destroy(pool);
    zero_device_destroy(dev);
    free(host);
    free(back);
    return check_exit();
}
