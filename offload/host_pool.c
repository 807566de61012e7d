/* The host pool: one NUMA-local (pinned on CUDA) reservation cut into
 * 4096-aligned chunks.
 *
 * Why one reservation: page-locking is a slow system call and pinned memory
 * is a scarce resource the user sizes up front (DeepSpeed's
 * pin_memory/buffer_count), so the pool pins once and then only does book
 * keeping. Both the free extents and the live chunks are kept as arrays
 * sorted by offset: a pool holds tens to thousands of chunks, so a binary
 * search plus memmove is simpler and fast enough. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <zero/offload.h>
#include <zero/experimental.h>

#include "common/error.h"

typedef struct pool_extent {
    size_t off, len;   /* len: rounded up to the alignment */
    size_t requested;  /* live chunks only: the size asked for */
} pool_extent;

typedef struct extent_array {
    pool_extent *v;
    size_t n, cap;
} extent_array;

struct zero_host_pool {
    zero_device *dev;
    char *base;
    size_t capacity;
    extent_array free_list; /* sorted by off, never adjacent (coalesced) */
    extent_array live;      /* sorted by off */
    zero_host_pool_stats st;
    pthread_mutex_t mu;
    zero_errbuf err;
};

static size_t round_up(size_t x) { return (x + ZERO_OFFLOAD_ALIGN - 1) / ZERO_OFFLOAD_ALIGN * ZERO_OFFLOAD_ALIGN; }

static int extents_insert(extent_array *a, size_t at, pool_extent e)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        pool_extent *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    memmove(a->v + at + 1, a->v + at, (a->n - at) * sizeof *a->v);
    a->v[at] = e;
    a->n++;
    return 0;
}

static void extents_remove(extent_array *a, size_t at)
{
    memmove(a->v + at, a->v + at + 1, (a->n - at - 1) * sizeof *a->v);
    a->n--;
}

/* First index whose off >= off. */
static size_t extents_lower_bound(const extent_array *a, size_t off)
{
    size_t lo = 0, hi = a->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->v[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static size_t largest_free(const zero_host_pool *p)
{
    size_t best = 0;
    for (size_t i = 0; i < p->free_list.n; i++)
        if (p->free_list.v[i].len > best) best = p->free_list.v[i].len;
    return best;
}

zero_status zero_host_pool_create(zero_host_pool **out, zero_device *dev, size_t capacity)
{
    if (!out || !dev || capacity == 0)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_host_pool_create: %s",
                         !out ? "out is NULL" : !dev ? "dev is NULL" : "capacity is 0");
    *out = NULL;
    zero_host_pool *p = calloc(1, sizeof *p);
    if (!p) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_host_pool_create: no memory for the pool");
    p->dev = dev;
    p->capacity = round_up(capacity);
    void *base = NULL;
    zero_status st = zero_host_alloc_numa(dev, p->capacity, &base);
    if (st != ZERO_OK) {
        free(p);
        return zero_fail_forward(NULL, st, "zero_host_pool_create: ");
    }
    p->base = base;
    if (extents_insert(&p->free_list, 0, (pool_extent){0, p->capacity, 0}) != 0) {
        zero_host_free_numa(dev, base, p->capacity);
        free(p);
        return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_host_pool_create: no memory for the free list");
    }
    pthread_mutex_init(&p->mu, NULL);
    p->st.capacity = p->capacity;
    *out = p;
    return ZERO_OK;
}

void zero_host_pool_destroy(zero_host_pool *p)
{
    if (!p) return;
    zero_host_free_numa(p->dev, p->base, p->capacity);
    free(p->free_list.v);
    free(p->live.v);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

zero_status zero_host_pool_alloc(zero_host_pool *p, size_t bytes, void **out)
{
    if (!p || !out || bytes == 0)
        return zero_fail(p ? &p->err : NULL, ZERO_INVALID_ARGUMENT, "zero_host_pool_alloc: %s",
                         !p ? "pool is NULL" : !out ? "out is NULL" : "bytes is 0");
    *out = NULL;
    if (bytes > p->capacity)
        return zero_fail(&p->err, ZERO_OUT_OF_MEMORY,
                         "zero_host_pool_alloc: %zu bytes exceed the pool's capacity of %zu bytes", bytes,
                         p->capacity);
    size_t need = round_up(bytes);
    pthread_mutex_lock(&p->mu);
    /* Best fit: the smallest extent that holds the chunk keeps large
     * extents whole for the large optimizer-state chunks. */
    size_t best = p->free_list.n;
    for (size_t i = 0; i < p->free_list.n; i++) {
        size_t len = p->free_list.v[i].len;
        if (len >= need && (best == p->free_list.n || len < p->free_list.v[best].len)) best = i;
    }
    if (best == p->free_list.n) {
        zero_status st = zero_fail(&p->err, ZERO_OUT_OF_MEMORY,
                                   "zero_host_pool_alloc: %zu bytes (%zu aligned) do not fit: %llu of %zu "
                                   "bytes in use in %llu chunks, largest free extent %zu bytes",
                                   bytes, need, (unsigned long long)p->st.in_use, p->capacity,
                                   (unsigned long long)p->st.live_chunks, largest_free(p));
        pthread_mutex_unlock(&p->mu);
        return st;
    }
    pool_extent chunk = {p->free_list.v[best].off, need, bytes};
    size_t at = extents_lower_bound(&p->live, chunk.off);
    if (extents_insert(&p->live, at, chunk) != 0) {
        pthread_mutex_unlock(&p->mu);
        return zero_fail(&p->err, ZERO_OUT_OF_MEMORY, "zero_host_pool_alloc: no memory for book keeping");
    }
    if (p->free_list.v[best].len == need) {
        extents_remove(&p->free_list, best);
    } else {
        p->free_list.v[best].off += need;
        p->free_list.v[best].len -= need;
    }
    p->st.in_use += need;
    p->st.requested += bytes;
    p->st.live_chunks++;
    p->st.total_allocs++;
    if (p->st.in_use > p->st.peak_in_use) p->st.peak_in_use = p->st.in_use;
    pthread_mutex_unlock(&p->mu);
    *out = p->base + chunk.off;
    return ZERO_OK;
}

zero_status zero_host_pool_free(zero_host_pool *p, void *ptr)
{
    if (!ptr) return ZERO_OK;
    if (!p) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_host_pool_free: pool is NULL");
    char *c = ptr;
    if (c < p->base || c >= p->base + p->capacity)
        return zero_fail(&p->err, ZERO_INVALID_ARGUMENT,
                         "zero_host_pool_free: %p is outside the pool [%p, +%zu)", ptr, (void *)p->base,
                         p->capacity);
    size_t off = (size_t)(c - p->base);
    pthread_mutex_lock(&p->mu);
    size_t at = extents_lower_bound(&p->live, off);
    if (at == p->live.n || p->live.v[at].off != off) {
        pthread_mutex_unlock(&p->mu);
        return zero_fail(&p->err, ZERO_INVALID_ARGUMENT,
                         "zero_host_pool_free: %p (offset %zu) is not a live chunk (double free?)", ptr, off);
    }
    pool_extent chunk = p->live.v[at];
    /* Put the extent back, merging with its neighbours; the insert happens
     * before the live entry goes so a failed insert changes nothing. */
    size_t f = extents_lower_bound(&p->free_list, off);
    int merge_prev = f > 0 && p->free_list.v[f - 1].off + p->free_list.v[f - 1].len == off;
    int merge_next = f < p->free_list.n && off + chunk.len == p->free_list.v[f].off;
    if (merge_prev && merge_next) {
        p->free_list.v[f - 1].len += chunk.len + p->free_list.v[f].len;
        extents_remove(&p->free_list, f);
    } else if (merge_prev) {
        p->free_list.v[f - 1].len += chunk.len;
    } else if (merge_next) {
        p->free_list.v[f].off = off;
        p->free_list.v[f].len += chunk.len;
    } else if (extents_insert(&p->free_list, f, (pool_extent){off, chunk.len, 0}) != 0) {
        pthread_mutex_unlock(&p->mu);
        return zero_fail(&p->err, ZERO_OUT_OF_MEMORY, "zero_host_pool_free: no memory for book keeping");
    }
    extents_remove(&p->live, at);
    p->st.in_use -= chunk.len;
    p->st.requested -= chunk.requested;
    p->st.live_chunks--;
    pthread_mutex_unlock(&p->mu);
    return ZERO_OK;
}

zero_status zero_host_pool_get_stats(zero_host_pool *p, zero_host_pool_stats *out)
{
    if (!p || !out)
        return zero_fail(p ? &p->err : NULL, ZERO_INVALID_ARGUMENT, "zero_host_pool_get_stats: %s is NULL",
                         !p ? "pool" : "out");
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    out->largest_free = largest_free(p);
    pthread_mutex_unlock(&p->mu);
    return ZERO_OK;
}

const char *zero_host_pool_last_error(const zero_host_pool *p)
{
    return p ? p->err.msg : "";
}
