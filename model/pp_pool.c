/* Transfer buffers kept across pipeline steps (pp_pool.h). */
#include "pp_pool.h"

#include <stdlib.h>

void *pp_pool_get(pp_pool *pool, size_t bytes)
{
    bytes = bytes ? bytes : 1;
    for (int i = 0; i < pool->n; i++)
        if (!pool->buf[i].used && pool->buf[i].bytes == bytes) {
            pool->buf[i].used = 1;
            return pool->buf[i].p;
        }
    if (pool->n == pool->cap) {
        int cap = pool->cap ? 2 * pool->cap : 8;
        pp_pool_buf *b = realloc(pool->buf, sizeof *b * (size_t)cap);
        if (!b) return NULL;
        pool->buf = b, pool->cap = cap;
    }
    void *p = pool->raw_alloc(pool->ctx, bytes);
    if (!p) return NULL;
    pool->buf[pool->n++] = (pp_pool_buf){p, bytes, 1};
    pool->allocs++;
    return p;
}

int pp_pool_put(pp_pool *pool, void *p)
{
    if (!p) return 0;
    for (int i = 0; i < pool->n; i++)
        if (pool->buf[i].p == p) {
            pool->buf[i].used = 0;
            return 0;
        }
    return -1;
}

int pp_pool_in_use(const pp_pool *pool)
{
    int k = 0;
    for (int i = 0; i < pool->n; i++) k += pool->buf[i].used;
    return k;
}

void pp_pool_free(pp_pool *pool)
{
    for (int i = 0; i < pool->n; i++) pool->raw_free(pool->ctx, pool->buf[i].p);
    free(pool->buf);
    pool->buf = NULL;
    pool->n = pool->cap = 0;
}
