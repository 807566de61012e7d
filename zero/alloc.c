/* The engine's one accounting allocator: every buffer the engine holds is
 * allocated here under a category, so the memory report is a reading of
 * these books, not an estimate. Freed memory is returned with its size and
 * category (the engine always knows both), which keeps the books exact
 * without a lookup table. */
#include <stdlib.h>
#include <string.h>

#include "device/device_internal.h"
#include "engine_internal.h"

static void books_add(zero_books *b, zero_mem_category cat, size_t bytes)
{
    b->bytes[cat] += bytes;
    b->total += bytes;
    if (b->bytes[cat] > b->peak[cat]) b->peak[cat] = b->bytes[cat];
    if (b->total > b->peak_total) b->peak_total = b->total;
}

static void books_sub(zero_books *b, zero_mem_category cat, size_t bytes)
{
    b->bytes[cat] -= bytes;
    b->total -= bytes;
}

zero_status zero_memset_zero(zero_engine *e, void *ptr, size_t bytes)
{
    zero_status st = zero_fill_value(e->dev, ptr, ZERO_F32, bytes / 4, 0.0f, e->stream);
    if (st == ZERO_OK && bytes % 4) st = engine_memcpy(e, (char *)ptr + bytes - bytes % 4, "\0\0\0", bytes % 4);
    return st;
}

zero_status engine_alloc(zero_engine *e, zero_mem_category cat, size_t bytes, void **out)
{
    return engine_alloc_ex(e, cat, bytes, 1, out);
}

zero_status engine_alloc_ex(zero_engine *e, zero_mem_category cat, size_t bytes, int zeroed, void **out)
{
    *out = NULL;
    if (bytes == 0) return ZERO_OK;
    zero_status st = zero_device_alloc(e->dev, bytes, out);
    if (st != ZERO_OK) {
        *out = NULL;
        return zero_fail(&e->err, st, "engine: allocating %zu bytes on rank %d: %s", bytes, e->rank,
                         zero_device_last_error(e->dev));
    }
    /* Zeroed memory: padding must read as zeros, and touching every page now
     * makes resident memory agree with the books. Buffers that are about to
     * be overwritten whole (stage-3 gathers) skip it. */
    if (!zeroed) {
        books_add(&e->books, cat, bytes);
        return ZERO_OK;
    }
    st = zero_memset_zero(e, *out, bytes);
    /* New buffers are written by host code too (init values, CPU offload):
     * they must be zero before this returns, not just in stream order. */
    if (st == ZERO_OK) st = engine_sync_stream(e, "engine: zeroing a new buffer");
    if (st != ZERO_OK) {
        zero_device_free(e->dev, *out);
        *out = NULL;
        return zero_fail_forward(&e->err, st, "engine: zeroing a new buffer: ");
    }
    books_add(&e->books, cat, bytes);
    return ZERO_OK;
}

void engine_free(zero_engine *e, zero_mem_category cat, size_t bytes, void *ptr)
{
    if (!ptr) return;
    zero_device_free(e->dev, ptr);
    books_sub(&e->books, cat, bytes);
}

zero_status engine_host_alloc(zero_engine *e, zero_mem_category cat, size_t bytes, void **out)
{
    *out = bytes ? zero_hostmem_alloc(bytes, 64) : NULL; /* large ones returned to the kernel when freed */
    if (bytes && !*out)
        return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine: host allocation of %zu bytes failed", bytes);
    books_add(&e->books, cat, bytes);
    return ZERO_OK;
}

void engine_host_free(zero_engine *e, zero_mem_category cat, size_t bytes, void *ptr)
{
    if (!ptr) return;
    zero_hostmem_free(ptr);
    books_sub(&e->books, cat, bytes);
}

/* ---------------------------------------------------------------- transient buffers
 * Stage-3 gathered modules and stage-2/3 module gradient buffers live for a
 * part of a micro-step. Instead of returning them to the system at once
 * (and paying page faults on every gather), released ones wait in a small
 * cache, counted under "buffers", for a request of the same size within the
 * step; step() and zero_grad() empty it, so the steady state holds none. */

zero_status engine_transient_get(zero_engine *e, zero_mem_category cat, size_t bytes, int zeroed, void **out)
{
    for (int i = 0; i < e->num_cached; i++) {
        if (e->cache[i].bytes != bytes) continue;
        *out = e->cache[i].ptr;
        e->cache[i] = e->cache[--e->num_cached];
        books_sub(&e->books, ZERO_MEM_BUFFERS, bytes);
        books_add(&e->books, cat, bytes);
        if (zeroed) {
            zero_status st = zero_memset_zero(e, *out, bytes);
            if (st != ZERO_OK) {
                engine_free(e, cat, bytes, *out);
                *out = NULL;
                return st;
            }
        }
        return ZERO_OK;
    }
    return engine_alloc_ex(e, cat, bytes, zeroed, out);
}

void engine_transient_put(zero_engine *e, zero_mem_category cat, size_t bytes, void *ptr)
{
    if (!ptr) return;
    if (e->num_cached == ENGINE_CACHE_SLOTS) {
        /* full: drop the oldest */
        engine_free(e, ZERO_MEM_BUFFERS, e->cache[0].bytes, e->cache[0].ptr);
        e->cache[0] = e->cache[--e->num_cached];
    }
    books_sub(&e->books, cat, bytes);
    books_add(&e->books, ZERO_MEM_BUFFERS, bytes);
    e->cache[e->num_cached].ptr = ptr;
    e->cache[e->num_cached].bytes = bytes;
    e->num_cached++;
}

void engine_transient_trim(zero_engine *e)
{
    while (e->num_cached > 0) {
        e->num_cached--;
        engine_free(e, ZERO_MEM_BUFFERS, e->cache[e->num_cached].bytes, e->cache[e->num_cached].ptr);
    }
}
