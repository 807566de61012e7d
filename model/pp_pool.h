/* Transfer buffers kept across pipeline steps (internal): the runtime
 * (pp_exec.c) allocates its landing / gradient buffers per step through the
 * stage's alloc and releases them at the end; a stage whose allocations are
 * expensive (the CUDA stage: cudaMalloc synchronizes the device) serves them
 * from a pool instead. A request is met by a free buffer of the same size
 * (the runtime asks the same sizes every step of a plan), else by a new one
 * that stays in the pool: after a plan's first step nothing is allocated.
 * The memory itself comes from the caller's raw_alloc / raw_free (device or
 * host), so the pool runs and is tested on the CPU
 * (tests/model_parallel/test_pp_schedules.c). */
#ifndef ZERO_MODEL_PP_POOL_H
#define ZERO_MODEL_PP_POOL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_pool_buf {
    void *p;
    size_t bytes;
    int used;
} pp_pool_buf;

typedef struct pp_pool {
    void *ctx;                                /* raw_alloc / raw_free's first argument */
    void *(*raw_alloc)(void *ctx, size_t bytes); /* NULL when out of memory */
    void (*raw_free)(void *ctx, void *p);
    pp_pool_buf *buf;
    int n, cap;
    int allocs; /* raw allocations made so far (the pool's size) */
} pp_pool;

/* A buffer of `bytes` (0 counts as 1): a free one of that size, else a new
 * one; NULL when out of memory. */
void *pp_pool_get(pp_pool *pool, size_t bytes);
/* Back to the pool (NULL accepted). 0, or -1 when p is not the pool's. */
int pp_pool_put(pp_pool *pool, void *p);
/* Buffers handed out and not put back. */
int pp_pool_in_use(const pp_pool *pool);
/* Every buffer freed (in use or not); the pool is then empty and reusable. */
void pp_pool_free(pp_pool *pool);

#ifdef __cplusplus
}
#endif

#endif
