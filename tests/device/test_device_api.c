/* The device layer's contract apart from the kernels' arithmetic:
 *   - every allocation is aligned (device: 256 B, pinned/NUMA host: 4096 B)
 *     and its whole extent is usable (ASan checks the bytes);
 *   - copies (sync, async, host<->device, overlapping on the CPU) move
 *     exactly the bytes asked;
 *   - streams and events order work: after a record, query says done once
 *     the stream is synchronized (on the CPU, at once);
 *   - misuse gives a clear status and a message that names the op and the
 *     parameter: NULL handles and pointers, zero-byte allocations, dtypes
 *     that are not zero_dtypes (INVALID_ARGUMENT) or not floating
 *     (UNSUPPORTED), a stream of another device, in-place narrowing casts;
 *   - n == 0 is a no-op that succeeds, even with NULL pointers;
 *   - zero_device_create(CUDA) without a GPU is ZERO_UNSUPPORTED, never a crash;
 *   - NUMA-local allocation warns once (per problem) when placement or
 *     pinning is impossible, not on every allocation.
 *
 *   test_device_api cpu | cuda   (cuda: skipped without a GPU) */
#include <stdint.h>
#include <string.h>
#include <zero/device.h>
#include <zero/log.h>
#include <zero/experimental.h>

#include "check.h"

static int warnings;
static void count_warnings(zero_log_level level, const char *message, void *user)
{
    (void)user;
    if (level == ZERO_LOG_WARN) {
        warnings++;
        fprintf(stderr, "(logged) %s\n", message);
    }
}

static int contains(const char *s, const char *needle) { return s && strstr(s, needle) != NULL; }

#define CHECK_STATUS(call, want, needle)                                                          \
    do {                                                                                          \
        zero_status st_ = (call);                                                                 \
        CHECK_MSG(st_ == (want), "%s returned %s, want %s (%s)", #call, zero_status_name(st_),     \
                  zero_status_name(want), zero_last_error());                                    \
        CHECK_MSG(contains(zero_last_error(), needle), "%s: message \"%s\" lacks \"%s\"", #call,    \
                  zero_last_error(), needle);                                                     \
    } while (0)

static void test_alloc(zero_device *dev)
{
    int warnings_after_first = 0;
    const size_t sizes[] = {1, 255, 4096, 1000003};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        void *d = NULL, *p = NULL, *q = NULL;
        CHECK_OK(zero_device_alloc(dev, n, &d));
        CHECK_OK(zero_host_alloc_pinned(dev, n, &p));
        CHECK_OK(zero_host_alloc_numa(dev, n, &q));
        CHECK_MSG(d && (uintptr_t)d % 256 == 0, "device alloc of %zu at %p", n, d);
        CHECK_MSG(p && (uintptr_t)p % 4096 == 0, "pinned alloc of %zu at %p", n, p);
        CHECK_MSG(q && (uintptr_t)q % 4096 == 0, "numa alloc of %zu at %p", n, q);
        if (d && p && q) {
            /* every byte usable: pattern through host -> device -> host */
            for (size_t k = 0; k < n; k++) ((unsigned char *)p)[k] = (unsigned char)(k * 7 + 1);
            CHECK_OK(zero_memcpy(dev, d, p, n));
            memset(q, 0, n);
            CHECK_OK(zero_memcpy(dev, q, d, n));
            CHECK_MSG(memcmp(p, q, n) == 0, "round trip of %zu bytes through the device", n);
        }
        zero_device_free(dev, d);
        zero_host_free_pinned(dev, p);
        zero_host_free_numa(dev, q, n);
        /* placement / pinning problems warn on the first allocation only */
        if (i == 0) warnings_after_first = warnings;
    }
    CHECK_MSG(warnings == warnings_after_first, "%d warnings after the first allocation; each problem must warn once",
              warnings - warnings_after_first);
    /* free functions accept NULL */
    zero_device_free(dev, NULL);
    zero_host_free_pinned(dev, NULL);
    zero_host_free_numa(dev, NULL, 10);
    zero_device_free(NULL, NULL);
}

static void test_copies_and_streams(zero_device *dev)
{
    const size_t n = 1 << 20;
    unsigned char *host = NULL, *back = NULL;
    void *d1 = NULL, *d2 = NULL;
    CHECK_OK(zero_host_alloc_pinned(dev, n, (void **)&host));
    CHECK_OK(zero_host_alloc_pinned(dev, n, (void **)&back));
    CHECK_OK(zero_device_alloc(dev, n, &d1));
    CHECK_OK(zero_device_alloc(dev, n, &d2));
    if (!host || !back || !d1 || !d2) return;
    for (size_t i = 0; i < n; i++) host[i] = (unsigned char)(i ^ (i >> 8));

    zero_stream *s1 = NULL, *s2 = NULL;
    zero_event *ev = NULL;
    CHECK_OK(zero_stream_create(dev, &s1));
    CHECK_OK(zero_stream_create(dev, &s2));
    CHECK_OK(zero_event_create(dev, &ev));
    int done = -1;
    CHECK_OK(zero_event_query(ev, &done)); /* never recorded: done, as in CUDA */
    CHECK(done == 1);

    /* H2D on s1, event, s2 waits, D2D on s2, D2H on s2: ordered by the event */
    CHECK_OK(zero_memcpy_async(dev, d1, host, n, s1));
    CHECK_OK(zero_event_record(ev, s1));
    CHECK_OK(zero_stream_wait_event(s2, ev));
    CHECK_OK(zero_memcpy_async(dev, d2, d1, n, s2));
    memset(back, 0, n);
    CHECK_OK(zero_memcpy_async(dev, back, d2, n, s2));
    CHECK_OK(zero_stream_sync(s2));
    CHECK_MSG(memcmp(back, host, n) == 0, "async copy chain");
    CHECK_OK(zero_event_sync(ev));
    done = -1;
    CHECK_OK(zero_event_query(ev, &done));
    CHECK(done == 1);

    /* a partial copy moves exactly the bytes asked */
    memset(back, 0xAB, n);
    CHECK_OK(zero_memcpy(dev, back + 3, d1, 1000));
    CHECK(back[2] == 0xAB && back[1003] == 0xAB && memcmp(back + 3, host, 1000) == 0);

    /* NULL stream: the default stream; a record on it then device sync */
    CHECK_OK(zero_memcpy_async(dev, d2, host, n, NULL));
    CHECK_OK(zero_event_record(ev, NULL));
    CHECK_OK(zero_device_sync(dev));
    CHECK_OK(zero_event_query(ev, &done));
    CHECK(done == 1);

    if (zero_device_get_kind(dev) == ZERO_DEVICE_CPU && !getenv("ZERO_CPU_ASYNC")) {
        /* on the (synchronous) CPU, work is complete when the call returns */
        CHECK_OK(zero_fill_value(dev, d1, ZERO_F32, 4, 2.0f, s1));
        CHECK(((float *)d1)[3] == 2.0f);
        /* overlapping host copies are allowed (memmove) */
        memcpy(back, host, n);
        CHECK_OK(zero_memcpy(dev, back + 1, back, 100));
        CHECK(memcmp(back + 1, host, 100) == 0);
    }
    zero_event_destroy(ev);
    zero_stream_destroy(s1);
    zero_stream_destroy(s2);
    zero_event_destroy(NULL);
    zero_stream_destroy(NULL);
    zero_device_free(dev, d1);
    zero_device_free(dev, d2);
    zero_host_free_pinned(dev, host);
    zero_host_free_pinned(dev, back);
}

static void test_misuse(zero_device *dev)
{
    void *p = NULL;
    float buf[4] = {1, 2, 3, 4};
    double out = 0;
    CHECK_STATUS(zero_device_alloc(NULL, 16, &p), ZERO_INVALID_ARGUMENT, "device is NULL");
    CHECK_STATUS(zero_device_alloc(dev, 16, NULL), ZERO_INVALID_ARGUMENT, "out is NULL");
    CHECK_STATUS(zero_device_alloc(dev, 0, &p), ZERO_INVALID_ARGUMENT, "bytes is 0");
    CHECK(p == NULL);
    CHECK_STATUS(zero_host_alloc_pinned(dev, 0, &p), ZERO_INVALID_ARGUMENT, "zero_host_alloc_pinned");
    CHECK_STATUS(zero_host_alloc_numa(dev, 0, &p), ZERO_INVALID_ARGUMENT, "zero_host_alloc_numa");
    CHECK(strstr(zero_device_last_error(dev), "zero_host_alloc_numa") != NULL); /* per-handle copy */

    CHECK_STATUS(zero_fill_value(dev, buf, (zero_dtype)42, 4, 0.0f, NULL), ZERO_INVALID_ARGUMENT, "dtype 42 is not a zero_dtype");
    CHECK_STATUS(zero_fill_value(dev, buf, ZERO_I32, 4, 0.0f, NULL), ZERO_UNSUPPORTED, "i32");
    CHECK_STATUS(zero_cast(dev, buf, ZERO_F32, buf, (zero_dtype)-1, 4, NULL), ZERO_INVALID_ARGUMENT, "dst_dtype");
    CHECK_STATUS(zero_fill_value(dev, NULL, ZERO_F32, 4, 0.0f, NULL), ZERO_INVALID_ARGUMENT, "zero_fill_value: x is NULL");
    CHECK_STATUS(zero_axpy(dev, 1.0f, NULL, buf, ZERO_F32, 4, NULL), ZERO_INVALID_ARGUMENT, "zero_axpy: x is NULL");
    CHECK_STATUS(zero_sumsq(dev, buf, ZERO_F32, 4, NULL, NULL, NULL), ZERO_INVALID_ARGUMENT, "out is NULL");
    CHECK_STATUS(zero_memcpy(dev, NULL, buf, 4), ZERO_INVALID_ARGUMENT, "dst is NULL");
    CHECK_STATUS(zero_cast(dev, buf, ZERO_F32, buf, ZERO_BF16, 4, NULL), ZERO_INVALID_ARGUMENT, "in place");
    CHECK_STATUS(zero_stream_sync(NULL), ZERO_INVALID_ARGUMENT, "stream is NULL");
    CHECK_STATUS(zero_event_record(NULL, NULL), ZERO_INVALID_ARGUMENT, "event is NULL");
    CHECK_STATUS(zero_device_create(NULL, ZERO_DEVICE_CPU, 0), ZERO_INVALID_ARGUMENT, "out is NULL");
    zero_device *other = NULL;
    CHECK_STATUS(zero_device_create(&other, ZERO_DEVICE_CPU, 3), ZERO_INVALID_ARGUMENT, "ordinal");
    CHECK_STATUS(zero_device_create(&other, (zero_device_kind)9, 0), ZERO_INVALID_ARGUMENT, "unknown device kind 9");
    CHECK(other == NULL);

    /* a stream of another device */
    CHECK_OK(zero_device_create(&other, ZERO_DEVICE_CPU, -1));
    zero_stream *foreign = NULL;
    if (other) CHECK_OK(zero_stream_create(other, &foreign));
    if (foreign) {
        CHECK_STATUS(zero_fill_value(dev, buf, ZERO_F32, 4, 0.0f, foreign), ZERO_INVALID_ARGUMENT, "another device");
        zero_event *ev = NULL;
        CHECK_OK(zero_event_create(dev, &ev));
        CHECK_STATUS(zero_event_record(ev, foreign), ZERO_INVALID_ARGUMENT, "another device");
        zero_event_destroy(ev);
    }
    zero_stream_destroy(foreign);
    zero_device_destroy(other);

    /* n == 0: nothing to do, nothing dereferenced */
    CHECK_OK(zero_fill_value(dev, NULL, ZERO_F16, 0, 1.0f, NULL));
    CHECK_OK(zero_scale(dev, NULL, ZERO_BF16, 0, 1.0f, NULL));
    CHECK_OK(zero_axpy(dev, 1.0f, NULL, NULL, ZERO_F32, 0, NULL));
    CHECK_OK(zero_cast(dev, NULL, ZERO_F32, NULL, ZERO_F16, 0, NULL));
    CHECK_OK(zero_memcpy(dev, NULL, NULL, 0));
    int nf = -1;
    out = -1;
    CHECK_OK(zero_sumsq(dev, NULL, ZERO_F32, 0, &out, &nf, NULL));
    CHECK(out == 0.0 && nf == 0);
    /* n too large for size_t bytes */
    CHECK_STATUS(zero_fill_value(dev, buf, ZERO_F32, SIZE_MAX / 2, 0.0f, NULL), ZERO_INVALID_ARGUMENT, "overflows");
}

int main(int argc, char **argv)
{
    zero_set_log_handler(count_warnings, ZERO_LOG_WARN, NULL);
    int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    zero_device *dev = NULL;
    if (cuda) {
        zero_status st = zero_device_create(&dev, ZERO_DEVICE_CUDA, -1);
        if (st == ZERO_UNSUPPORTED) {
            /* the no-GPU path itself is part of the contract */
            if (zero_cuda_available()) return 1;
            CHECK_MSG(dev == NULL && contains(zero_last_error(), "CUDA"), "message: %s", zero_last_error());
            if (check_exit()) return check_exit();
            CHECK_SKIP("no CUDA device: %s", zero_last_error());
        }
        CHECK_OK(st);
        CHECK(zero_device_get_kind(dev) == ZERO_DEVICE_CUDA);
    } else {
        CHECK_OK(zero_device_create(&dev, ZERO_DEVICE_CPU, -1));
        CHECK(zero_device_get_kind(dev) == ZERO_DEVICE_CPU && zero_device_get_ordinal(dev) == 0);
        /* CUDA absent here or present: either it opens or it says why */
        zero_device *g = NULL;
        zero_status st = zero_device_create(&g, ZERO_DEVICE_CUDA, 0);
        CHECK(st == ZERO_OK || (st == ZERO_UNSUPPORTED && g == NULL && contains(zero_last_error(), "CUDA")));
        CHECK((st == ZERO_OK) == (zero_cuda_available() != 0));
        zero_device_destroy(g);
    }
    if (!dev) return check_exit();
    test_alloc(dev);
    test_copies_and_streams(dev);
    test_misuse(dev);
    CHECK_MSG(warnings <= 2, "%d warnings; NUMA placement and pinning may each warn once", warnings);
    zero_device_destroy(dev);
    zero_device_destroy(NULL);
    return check_exit();
}
