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
 * part of a micro-step, and the same sizes are asked for again every step.
 * Returning them to the system each time costs a fresh mapping and a page
 * fault per page on every gather (measured: stage-3 overlap 10-24 % slower
 * from that alone), and on CUDA a cudaFree, which synchronizes the device.
 * So released ones wait in a cache for a request of their size, in this
 * step or a later one.
 *
 * Size classes: a module's gather and its gradient differ by its persistent
 * parameters (a transformer block's norms), so exact sizes would never meet.
 * At finalize the engine's request sizes (every module's gather and
 * gradient bytes) are grouped from the largest down: a class takes every
 * size down to 8/9 of its largest, and a request gets a buffer of its
 * class's size (at most 1/8 more than it asked for). The request's category
 * counts the bytes asked for; the rest of the buffer, and every cached
 * buffer, count under ZERO_MEM_CACHE.
 *
 * Bounds, over the current step and the one before:
 *  - per class, no more buffers (in use + cached) than were in use at once:
 *    a step that repeats the last one is served from the cache entirely;
 *  - in all, no more bytes than twice the most in use at once, so a model
 *    of many different module sizes, one in use at a time, does not end up
 *    holding all of them (it reuses what fits and allocates the rest).
 * After each step the cache is trimmed to them (the least recently released
 * first), so it follows the trainer when a step needs less. An allocation
 * that fails empties the cache and tries once more.
 * zero_engine_empty_cache() frees it all. */

static int size_cmp(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

zero_status engine_transient_classes(zero_engine *e)
{
    zero_transient_cache *c = &e->tcache;
    const size_t most = (size_t)2 * (size_t)e->num_modules + 1;
    size_t *sizes = malloc(most * sizeof *sizes);
    int *size_class = malloc(most * sizeof *size_class);
    zero_buffer_class *classes = calloc(most, sizeof *classes);
    if (!sizes || !size_class || !classes) {
        free(sizes);
        free(size_class);
        free(classes);
        return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "engine finalize: out of memory");
    }
    int n = 0;
    for (int i = 0; i < e->num_modules; i++) {
        const zero_module *m = &e->modules[i];
        if (e->cfg.stage >= 3 && m->gather_numel) sizes[n++] = m->gather_numel * e->dsize;
        if (e->cfg.stage >= 2 && m->grad_numel) sizes[n++] = m->grad_numel * e->dsize;
    }
    qsort(sizes, (size_t)n, sizeof *sizes, size_cmp);
    int distinct = 0;
    for (int i = 0; i < n; i++)
        if (distinct == 0 || sizes[i] != sizes[distinct - 1]) sizes[distinct++] = sizes[i];
    int num_classes = 0;
    for (int i = distinct - 1; i >= 0; i--) {
        /* below 8/9 of the current class's largest: a new class */
        if (num_classes == 0 || (uint64_t)sizes[i] * 9 < (uint64_t)classes[num_classes - 1].size * 8)
            classes[num_classes++].size = sizes[i];
        size_class[i] = num_classes - 1;
    }
    free(c->sizes);
    free(c->size_class);
    free(c->classes);
    c->sizes = sizes;
    c->size_class = size_class;
    c->classes = classes;
    c->num_sizes = distinct;
    c->num_classes = num_classes;
    return ZERO_OK;
}

/* The class of a request of `bytes`; -1 if it is not one of the engine's
 * module-buffer sizes (then it is neither rounded nor cached). */
static int class_of(const zero_transient_cache *c, size_t bytes)
{
    if (c->num_sizes == 0) return -1;
    const size_t *hit = bsearch(&bytes, c->sizes, (size_t)c->num_sizes, sizeof bytes, size_cmp);
    return hit ? c->size_class[hit - c->sizes] : -1;
}

static void cache_evict(zero_engine *e, int i)
{
    zero_transient_cache *c = &e->tcache;
    engine_free(e, ZERO_MEM_CACHE, c->items[i].bytes, c->items[i].ptr);
    c->cached -= c->items[i].bytes;
    c->classes[c->items[i].cls].cached--;
    memmove(&c->items[i], &c->items[i + 1], (size_t)(c->count - 1 - i) * sizeof c->items[0]);
    c->count--;
}

/* Evict the least recently released buffers while the cache, the buffers
 * in use and `extra` more bytes exceed twice the most in use at once. */
static void cache_fit_bytes(zero_engine *e, uint64_t extra)
{
    zero_transient_cache *c = &e->tcache;
    const uint64_t most = c->step_peak > c->last_peak ? c->step_peak : c->last_peak;
    while (c->count > 0 && c->cached + c->live + extra > 2 * most) cache_evict(e, 0);
}

/* A buffer of class k, counted under the cache, into *out. */
static zero_status cache_take(zero_engine *e, int k, int zeroed, void **out)
{
    zero_transient_cache *c = &e->tcache;
    const size_t size = c->classes[k].size;
    for (int i = c->count - 1; i >= 0; i--) { /* the most recently released first: warmest in cache */
        if (c->items[i].cls != k) continue;
        void *ptr = c->items[i].ptr;
        memmove(&c->items[i], &c->items[i + 1], (size_t)(c->count - 1 - i) * sizeof c->items[0]);
        c->count--;
        c->cached -= size;
        c->classes[k].cached--;
        if (zeroed) {
            zero_status st = zero_memset_zero(e, ptr, size);
            if (st != ZERO_OK) {
                engine_free(e, ZERO_MEM_CACHE, size, ptr);
                return st;
            }
        }
        *out = ptr;
        return ZERO_OK;
    }
    /* A miss: make room within the bound in bytes (the new buffer counted
     * as in use), then allocate. */
    if (c->live + size > c->step_peak) c->step_peak = c->live + size;
    cache_fit_bytes(e, size);
    zero_status st = engine_alloc_ex(e, ZERO_MEM_CACHE, size, zeroed, out);
    if (st == ZERO_OUT_OF_MEMORY && c->count > 0) {
        engine_transient_trim(e);
        st = engine_alloc_ex(e, ZERO_MEM_CACHE, size, zeroed, out);
    }
    return st;
}

zero_status engine_transient_get(zero_engine *e, zero_mem_category cat, size_t bytes, int zeroed, void **out)
{
    zero_transient_cache *c = &e->tcache;
    *out = NULL;
    if (bytes == 0) return ZERO_OK;
    const int k = class_of(c, bytes);
    if (k < 0) return engine_alloc_ex(e, cat, bytes, zeroed, out);
    ZERO_TRY(cache_take(e, k, zeroed, out));
    zero_buffer_class *b = &c->classes[k];
    c->live += b->size;
    if (c->live > c->step_peak) c->step_peak = c->live;
    if (++b->live > b->step_peak) b->step_peak = b->live;
    books_sub(&e->books, ZERO_MEM_CACHE, bytes); /* the part in use: the request's category */
    books_add(&e->books, cat, bytes);
    return ZERO_OK;
}

void engine_transient_put(zero_engine *e, zero_mem_category cat, size_t bytes, void *ptr)
{
    zero_transient_cache *c = &e->tcache;
    if (!ptr) return;
    const int k = class_of(c, bytes);
    if (k < 0) {
        engine_free(e, cat, bytes, ptr);
        return;
    }
    zero_buffer_class *b = &c->classes[k];
    c->live -= b->size;
    b->live--;
    books_sub(&e->books, cat, bytes);
    books_add(&e->books, ZERO_MEM_CACHE, bytes);
    if (c->count == c->cap) {
        int ncap = c->cap ? 2 * c->cap : 16;
        zero_cached *items = realloc(c->items, (size_t)ncap * sizeof *items);
        if (!items) { /* no room to remember it: return it to the system */
            engine_free(e, ZERO_MEM_CACHE, b->size, ptr);
            return;
        }
        c->items = items;
        c->cap = ncap;
    }
    c->items[c->count++] = (zero_cached){ptr, b->size, k};
    c->cached += b->size;
    b->cached++;
}

void engine_transient_step_end(zero_engine *e)
{
    zero_transient_cache *c = &e->tcache;
    for (int k = 0; k < c->num_classes; k++) {
        zero_buffer_class *b = &c->classes[k];
        b->last_peak = b->step_peak;
        b->step_peak = b->live;
        const int most = b->last_peak > b->step_peak ? b->last_peak : b->step_peak;
        for (int i = 0; i < c->count && b->cached + b->live > most;) {
            if (c->items[i].cls == k) cache_evict(e, i);
            else i++;
        }
    }
    c->last_peak = c->step_peak;
    c->step_peak = c->live;
    cache_fit_bytes(e, 0);
}

void engine_transient_trim(zero_engine *e)
{
    while (e->tcache.count > 0) cache_evict(e, 0);
}

zero_status zero_engine_empty_cache(zero_engine *e)
{
    ZERO_TRY(engine_check_usable(e, "engine empty_cache", 1));
    /* Queued engine work may still read a released buffer (an asynchronous
     * CPU device; CUDA's free synchronizes by itself). */
    ZERO_TRY(engine_sync_stream(e, "engine empty_cache"));
    zero_transient_cache *c = &e->tcache;
    engine_transient_trim(e);
    for (int k = 0; k < c->num_classes; k++) {
        c->classes[k].last_peak = 0;
        c->classes[k].step_peak = c->classes[k].live;
    }
    c->last_peak = 0;
    c->step_peak = c->live;
    return ZERO_OK;
}
