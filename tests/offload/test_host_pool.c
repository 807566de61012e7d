/* The host pool: exact byte accounting (in use, requested, peak), 4096
 * alignment, no overlap, best-fit reuse and coalescing, clear errors on
 * double free and exhaustion, and everything released at destroy (ASan). */
#include <stdint.h>
#include <zero/zero.h>
#include <zero/offload.h>

#include "check.h"

#define A 4096u
static size_t up(size_t x) { return (x + A - 1) / A * A; }

typedef struct live { char *p; size_t bytes; unsigned char tag; } live;

static void fill(live *l) { memset(l->p, l->tag, l->bytes); }
static int intact(const live *l)
{
    for (size_t i = 0; i < l->bytes; i++)
        if ((unsigned char)l->p[i] != l->tag) return 0;
    return 1;
}

int main(void)
{
    zero_device *dev = NULL;
    CHECK_OK(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));
    if (!dev) return check_exit();

    zero_host_pool *pool = NULL;
    const size_t cap_asked = 4 * 1024 * 1024 + 1; /* rounds up to one more page */
    CHECK_OK(zero_host_pool_create(&pool, dev, cap_asked));
    if (!pool) return check_exit();
    zero_host_pool_stats st;
    CHECK_OK(zero_host_pool_get_stats(pool, &st));
    CHECK(st.capacity == up(cap_asked));
    CHECK(st.in_use == 0 && st.requested == 0 && st.peak_in_use == 0 && st.live_chunks == 0);
    CHECK(st.largest_free == st.capacity);

    /* a few odd sizes: exact accounting after each */
    static const size_t sizes[] = {1, 4096, 4097, 10000, 65536, 123457, 3};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    live l[NS];
    uint64_t in_use = 0, requested = 0;
    for (int i = 0; i < NS; i++) {
        void *p = NULL;
        CHECK_OK(zero_host_pool_alloc(pool, sizes[i], &p));
        l[i] = (live){p, sizes[i], (unsigned char)(i + 1)};
        CHECK(p && (uintptr_t)p % A == 0);
        fill(&l[i]);
        in_use += up(sizes[i]);
        requested += sizes[i];
        CHECK_OK(zero_host_pool_get_stats(pool, &st));
        CHECK(st.in_use == in_use && st.requested == requested && st.peak_in_use == in_use);
        CHECK(st.live_chunks == (uint64_t)i + 1);
    }
    for (int i = 0; i < NS; i++) CHECK_MSG(intact(&l[i]), "chunk %d was overwritten", i);
    uint64_t peak = in_use;

    /* free the 10000-byte chunk: in use drops by exactly 12288; the hole is
     * reused by best fit for a request of the same rounded size */
    CHECK_OK(zero_host_pool_free(pool, l[3].p));
    in_use -= up(10000);
    requested -= 10000;
    CHECK_OK(zero_host_pool_get_stats(pool, &st));
    CHECK(st.in_use == in_use && st.requested == requested && st.peak_in_use == peak && st.live_chunks == NS - 1);
    void *again = NULL;
    CHECK_OK(zero_host_pool_alloc(pool, 9000, &again));
    CHECK(again == (void *)l[3].p);
    l[3].bytes = 9000;
    fill(&l[3]);
    in_use += up(9000);
    requested += 9000;

    /* double free and an interior pointer: refused, nothing changes */
    CHECK_OK(zero_host_pool_free(pool, l[0].p));
    in_use -= A;
    requested -= 1;
    zero_host_pool_stats before;
    CHECK_OK(zero_host_pool_get_stats(pool, &before));
    CHECK(zero_host_pool_free(pool, l[0].p) == ZERO_INVALID_ARGUMENT);
    CHECK(strstr(zero_host_pool_last_error(pool), "not a live chunk") != NULL);
    CHECK(zero_host_pool_free(pool, l[2].p + 4096) == ZERO_INVALID_ARGUMENT);
    int outside = 0;
    CHECK(zero_host_pool_free(pool, &outside) == ZERO_INVALID_ARGUMENT);
    CHECK_OK(zero_host_pool_free(pool, NULL));
    CHECK_OK(zero_host_pool_get_stats(pool, &st));
    CHECK(memcmp(&st, &before, sizeof st) == 0);
    CHECK(st.in_use == in_use && st.requested == requested);

    /* exhaustion: refused with the figures in the message */
    void *big = NULL;
    CHECK(zero_host_pool_alloc(pool, st.capacity, &big) == ZERO_OUT_OF_MEMORY && big == NULL);
    CHECK(strstr(zero_host_pool_last_error(pool), "largest free extent") != NULL);
    CHECK(zero_host_pool_alloc(pool, st.capacity + 1, &big) == ZERO_OUT_OF_MEMORY);
    CHECK(zero_host_pool_alloc(pool, 0, &big) == ZERO_INVALID_ARGUMENT);
    for (int i = 1; i < NS; i++) CHECK_MSG(intact(&l[i]), "chunk %d was overwritten", i);

    /* free everything: the free extents coalesce back into one */
    for (int i = 1; i < NS; i++) CHECK_OK(zero_host_pool_free(pool, l[i].p));
    CHECK_OK(zero_host_pool_get_stats(pool, &st));
    CHECK(st.in_use == 0 && st.requested == 0 && st.live_chunks == 0);
    CHECK(st.largest_free == st.capacity);
    CHECK(st.peak_in_use == peak); /* 9000 refilled exactly the 10000-byte hole */
    CHECK(st.total_allocs == NS + 1);

    /* a deterministic random walk against a model: exact in_use after each
     * step, no overlap (every live chunk keeps its tag) */
    enum { SLOTS = 40 };
    live m[SLOTS];
    memset(m, 0, sizeof m);
    uint64_t model_in_use = 0, model_peak = 0, lcg = 12345;
    for (int step = 0; step < 2000; step++) {
        lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((lcg >> 33) % SLOTS);
        if (m[k].p) {
            CHECK_MSG(intact(&m[k]), "step %d: slot %d overwritten", step, k);
            CHECK_OK(zero_host_pool_free(pool, m[k].p));
            model_in_use -= up(m[k].bytes);
            m[k].p = NULL;
        } else {
            size_t bytes = 1 + (size_t)((lcg >> 17) % 200000);
            void *p = NULL;
            zero_status s = zero_host_pool_alloc(pool, bytes, &p);
            if (s == ZERO_OK) {
                m[k] = (live){p, bytes, (unsigned char)(step % 251 + 1)};
                fill(&m[k]);
                model_in_use += up(bytes);
                if (model_in_use > model_peak) model_peak = model_in_use;
            } else {
                CHECK_MSG(s == ZERO_OUT_OF_MEMORY, "step %d: %s", step, zero_last_error());
            }
        }
        CHECK_OK(zero_host_pool_get_stats(pool, &st));
        if (st.in_use != model_in_use) {
            CHECK_MSG(st.in_use == model_in_use, "step %d: in_use %llu, model %llu", step,
                      (unsigned long long)st.in_use, (unsigned long long)model_in_use);
            break;
        }
    }
    CHECK(st.peak_in_use == (model_peak > peak ? model_peak : peak));
    /* destroy with chunks still live: the reservation goes back (ASan checks) */
    zero_host_pool_destroy(pool);
    zero_host_pool_destroy(NULL);
    zero_device_destroy(dev);
    return check_exit();
}
