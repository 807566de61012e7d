/* Optimizer state offload (DeepSpeed's offload_optimizer), phase 2 of
 * docs/offload.md: where the fp32 master weights and moments of this rank's
 * shard live when they are not in device memory, and the step that walks
 * them.
 *
 *   cpu on the CPU device   the same arrays as without offload, placed in
 *                           the pinned NUMA-local host pool; the usual step
 *                           runs on them (no walk, no copies).
 *   cpu on CUDA             host master (always: the device params cannot be
 *                           the CPU kernel's master) and moments in the pool;
 *                           the step walks the shard as one chunk: gradient
 *                           device -> host, CPU kernel, master host -> device,
 *                           cast into the params.
 *   nvme                    the shard cut into chunks of sub_group_size
 *                           elements, chunk i one stored tensor
 *                           [master | m1 | m2]; the step walks them with the
 *                           swapper (reads ahead, writes behind).
 *
 * Bitwise identity with the in-memory step: the CPU kernel is element-wise
 * (optim/cpu_optim.c), so updating a bucket's range in pieces that follow
 * chunk boundaries gives the bits of one call over the range; buckets are
 * propagated (cast + all-gather) in plan order, as the in-memory step does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/offload.h>

#include "engine_internal.h"

#define ALIGN ((uint64_t)ZERO_OFFLOAD_ALIGN)

static uint64_t round_up(uint64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static int optimizer_moments(const zero_engine *e)
{
    if (e->cfg.optimizer == ZERO_OPTIM_ADAMW) return 2;
    return e->cfg.momentum > 0 ? 1 : 0;
}

static uint64_t chunk_len(const zero_engine *e, uint64_t i)
{
    uint64_t lo = i * e->off_chunk_numel, left = e->shard - lo;
    return left < e->off_chunk_numel ? left : e->off_chunk_numel;
}

static zero_status fail_obj(zero_engine *e, zero_status st, const char *what, const char *obj, const char *msg)
{
    return zero_fail(&e->err, st, "%s: optimizer offload (%s) on rank %d: %s", what, obj, e->rank, msg);
}

static zero_status pool_take(zero_engine *e, uint64_t bytes, float **out, const char *what)
{
    void *p = NULL;
    zero_status st = zero_host_pool_alloc(e->off_pool, (size_t)bytes, &p);
    if (st != ZERO_OK) return fail_obj(e, st, what, "host pool", zero_host_pool_last_error(e->off_pool));
    memset(p, 0, (size_t)bytes); /* moments start at zero; padding reads as zeros */
    *out = p;
    return ZERO_OK;
}

static zero_status pool_create(zero_engine *e, uint64_t capacity, const char *what)
{
    zero_status st = zero_host_pool_create(&e->off_pool, e->dev, (size_t)capacity);
    if (st != ZERO_OK) {
        e->off_pool = NULL;
        return fail_obj(e, st, what, "host pool", zero_last_error());
    }
    return ZERO_OK;
}

/* cpu offload on the CPU device: the usual arrays, from the pool. */
static zero_status setup_cpu_placement(zero_engine *e, const char *what)
{
    const int moments = optimizer_moments(e);
    const uint64_t arr = round_up(e->shard * 4);
    e->off_states = (e->own_master ? 0 : 1) + moments;
    e->off_chunk_numel = e->shard;
    e->off_num_chunks = 1;
    if (e->off_states == 0) return ZERO_OK;
    ZERO_TRY(pool_create(e, (uint64_t)e->off_states * arr, what));
    if (!e->own_master) ZERO_TRY(pool_take(e, e->shard * 4, &e->master, what));
    if (moments >= 1) ZERO_TRY(pool_take(e, e->shard * 4, &e->m1, what));
    if (moments >= 2) ZERO_TRY(pool_take(e, e->shard * 4, &e->m2, what));
    return ZERO_OK;
}

static zero_status setup_nvme_store(zero_engine *e, const char *what)
{
    const zero_config *c = &e->cfg;
    uint64_t capacity = 0;
    for (uint64_t i = 0; i < e->off_num_chunks; i++)
        capacity += round_up((uint64_t)e->off_states * chunk_len(e, i) * 4);
    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    o.dir = c->offload_nvme_path;
    o.capacity = capacity;
    o.queue_depth = c->aio_queue_depth;
    o.block_bytes = c->aio_block_size;
    zero_status st = zero_nvme_store_create(&e->off_store, &o);
    if (st != ZERO_OK) {
        e->off_store = NULL;
        return fail_obj(e, st, what, "nvme store", zero_last_error());
    }
    e->off_chunks = calloc((size_t)e->off_num_chunks, sizeof *e->off_chunks);
    if (!e->off_chunks) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", what);
    /* Every chunk is written once now (zeros: moments start at zero, the
     * master is filled by the initial values), so later partial updates are
     * read-modify-writes of written tensors. */
    memset(e->off_bounce, 0, (size_t)round_up((uint64_t)e->off_states * e->off_chunk_numel * 4));
    for (uint64_t i = 0; i < e->off_num_chunks; i++) {
        char name[64];
        snprintf(name, sizeof name, "opt.chunk%llu", (unsigned long long)i);
        st = zero_nvme_define(e->off_store, name, (uint64_t)e->off_states * chunk_len(e, i) * 4, &e->off_chunks[i]);
        if (st == ZERO_OK) st = zero_nvme_write(e->off_store, e->off_chunks[i], e->off_bounce);
        if (st != ZERO_OK) return fail_obj(e, st, what, "nvme store", zero_nvme_store_last_error(e->off_store));
    }
    st = zero_nvme_swapper_create(&e->off_swapper, e->off_store, e->off_pool, e->off_chunks,
                                  (size_t)e->off_num_chunks, c->offload_buffer_count - 2, 1);
    if (st != ZERO_OK) {
        e->off_swapper = NULL;
        return fail_obj(e, st, what, "swapper", zero_last_error());
    }
    return ZERO_OK;
}

zero_status offload_setup(zero_engine *e)
{
    const char *what = "engine finalize";
    const zero_config *c = &e->cfg;
    if (c->offload_optimizer_device == ZERO_OFFLOAD_NONE) return ZERO_OK;
    if (c->offload_optimizer_device == ZERO_OFFLOAD_CPU && !e->is_cuda) return setup_cpu_placement(e, what);

    const int nvme = c->offload_optimizer_device == ZERO_OFFLOAD_NVME;
    e->off_walk = 1;
    e->off_states = 1 + optimizer_moments(e); /* a host master always: the CPU kernel needs one */
    uint64_t cn = nvme && c->sub_group_size < e->shard ? c->sub_group_size : e->shard;
    e->off_chunk_numel = cn;
    e->off_num_chunks = (e->shard + cn - 1) / cn;
    const uint64_t chunk_bytes = round_up((uint64_t)e->off_states * cn * 4);
    const uint64_t grad_bytes = e->is_cuda ? round_up(cn * 4) : 0;
    if (!nvme) {
        const uint64_t arr = round_up(e->shard * 4);
        ZERO_TRY(pool_create(e, (uint64_t)e->off_states * arr + grad_bytes, what));
        for (int k = 0; k < e->off_states; k++) ZERO_TRY(pool_take(e, e->shard * 4, &e->off_host[k], what));
    } else {
        ZERO_TRY(pool_create(e, (uint64_t)(c->offload_buffer_count + 1) * chunk_bytes + grad_bytes, what));
        ZERO_TRY(pool_take(e, chunk_bytes, &e->off_bounce, what));
    }
    if (grad_bytes) ZERO_TRY(pool_take(e, cn * 4, &e->off_grad, what));
    if (nvme) ZERO_TRY(setup_nvme_store(e, what));
    return ZERO_OK;
}

void offload_teardown(zero_engine *e)
{
    zero_nvme_swapper_destroy(e->off_swapper);
    e->off_swapper = NULL;
    if (e->off_store) {
        zero_status st = zero_nvme_store_destroy(e->off_store);
        if (st != ZERO_OK)
            zero_log(ZERO_LOG_WARN, "engine destroy: closing the optimizer offload store on rank %d: %s", e->rank,
                     zero_last_error());
    }
    e->off_store = NULL;
    free(e->off_chunks);
    e->off_chunks = NULL;
    if (e->off_pool && !e->off_walk) e->master = e->m1 = e->m2 = NULL; /* they were pool chunks */
    zero_host_pool_destroy(e->off_pool);
    e->off_pool = NULL;
    for (int k = 0; k < 3; k++) e->off_host[k] = NULL;
    e->off_bounce = e->off_grad = NULL;
}

zero_status offload_state_io(zero_engine *e, int k, uint64_t off, uint64_t n, float *buf, int write,
                             const char *what)
{
    zero_status st;
    if (!e->off_store) { /* cpu on CUDA: host arrays */
        float *host = e->off_host[k] + off;
        st = write ? engine_memcpy(e, host, buf, n * 4) : engine_memcpy(e, buf, host, n * 4);
        if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "optimizer offload: ");
        return ZERO_OK;
    }
    const uint64_t cn = e->off_chunk_numel;
    while (n > 0) {
        const uint64_t i = off / cn, c0 = i * cn, len = chunk_len(e, i);
        const uint64_t take = n < c0 + len - off ? n : c0 + len - off;
        float *slot = e->off_bounce + (uint64_t)k * len + (off - c0);
        st = zero_nvme_read(e->off_store, e->off_chunks[i], e->off_bounce);
        if (st != ZERO_OK) return fail_obj(e, st, what, "nvme store", zero_nvme_store_last_error(e->off_store));
        if (write) {
            st = engine_memcpy(e, slot, buf, take * 4);
            if (st == ZERO_OK) {
                st = zero_nvme_write(e->off_store, e->off_chunks[i], e->off_bounce);
                if (st != ZERO_OK)
                    return fail_obj(e, st, what, "nvme store", zero_nvme_store_last_error(e->off_store));
            }
        } else {
            st = engine_memcpy(e, buf, slot, take * 4);
        }
        if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "optimizer offload: ");
        off += take;
        buf += take;
        n -= take;
    }
    return ZERO_OK;
}

/* Cast n fp32 master values (host memory) of bucket b, starting at shard
 * offset lo, into this rank's own compute-dtype params. */
static zero_status cast_to_params(zero_engine *e, const zero_bucket *b, uint64_t lo, uint64_t n,
                                  const float *host_master, const char *what)
{
    void *dst;
    if (e->cfg.stage == 3) { /* the pieces of a bucket cover its whole chunk: write-only open */
        ZERO_TRY(poff_open(e, b, POFF_WRITE, what));
        dst = elem_ptr(e, layout_param_chunk(e, b), lo - b->shard_off);
    } else dst = elem_ptr(e, e->params_full, b->flat_off + b->chunk * (uint64_t)e->rank + (lo - b->shard_off));
    const float *src = host_master;
    zero_status st = ZERO_OK;
    if (e->is_cuda) { /* through device memory: the cast kernel reads device memory */
        st = engine_memcpy(e, e->slots[0].send, host_master, n * 4);
        src = e->slots[0].send;
    }
    if (st == ZERO_OK) st = zero_cast(e->dev, src, ZERO_F32, dst, e->cfg.compute_dtype, n, e->stream);
    if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine: casting offloaded master to params: ");
    return engine_sync_stream(e, what); /* the staging slot is reused by the next piece */
}

zero_status offload_cast_bucket(zero_engine *e, const zero_bucket *b, const char *what)
{
    uint64_t lo = b->shard_off;
    const uint64_t end = b->shard_off + b->chunk;
    if (!e->off_store) return cast_to_params(e, b, lo, b->chunk, e->off_host[0] + lo, what);
    while (lo < end) {
        const uint64_t i = lo / e->off_chunk_numel, c0 = i * e->off_chunk_numel, len = chunk_len(e, i);
        const uint64_t hi = end < c0 + len ? end : c0 + len;
        zero_status st = zero_nvme_read(e->off_store, e->off_chunks[i], e->off_bounce);
        if (st != ZERO_OK) return fail_obj(e, st, what, "nvme store", zero_nvme_store_last_error(e->off_store));
        ZERO_TRY(cast_to_params(e, b, lo, hi - lo, e->off_bounce + (lo - c0), what));
        lo = hi;
    }
    return ZERO_OK;
}

/* The updated chunk [c0, c0 + len) with its state arrays M, M1, M2: update
 * and cast every bucket piece in it; propagate each bucket that ends in it. */
static zero_status step_chunk(zero_engine *e, uint64_t c0, uint64_t len, float *M, float *M1, float *M2,
                              int *next_bucket, float grad_scale, const char *what)
{
    for (int j = *next_bucket; j < e->num_buckets; j++) {
        const zero_bucket *b = &e->buckets[j];
        const uint64_t b0 = b->shard_off, b1 = b0 + b->chunk;
        if (b0 >= c0 + len) break;
        const uint64_t lo = b0 > c0 ? b0 : c0, hi = b1 < c0 + len ? b1 : c0 + len;
        const uint64_t r = lo - c0;
        if (hi > lo) {
            const float *g = e->gacc + lo;
            if (e->is_cuda) {
                zero_status st = engine_memcpy(e, e->off_grad, e->gacc + lo, (hi - lo) * 4);
                if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine step: gradient to host: ");
                g = e->off_grad;
            }
            ZERO_TRY(optim_update_host(e, M + r, g, M1 ? M1 + r : NULL, M2 ? M2 + r : NULL, hi - lo, grad_scale,
                                       layout_region_flat(e, b) + (lo - b0)));
            ZERO_TRY(cast_to_params(e, b, lo, hi - lo, M + r, what));
        }
        if (b1 > c0 + len) break; /* continues in the next chunk */
        ZERO_TRY(step_propagate_bucket(e, b, what));
        *next_bucket = j + 1;
    }
    return ZERO_OK;
}

zero_status offload_step(zero_engine *e, float grad_scale, const char *what)
{
    int next_bucket = 0;
    ZERO_TRY(engine_sync_stream(e, what)); /* the gradient shard is complete */
    if (!e->off_store) {
        float *m1 = e->off_states > 1 ? e->off_host[1] : NULL, *m2 = e->off_states > 2 ? e->off_host[2] : NULL;
        return step_chunk(e, 0, e->shard, e->off_host[0], m1, m2, &next_bucket, grad_scale, what);
    }
    zero_status st = ZERO_OK;
    for (uint64_t i = 0; i < e->off_num_chunks && st == ZERO_OK; i++) {
        void *buf = NULL;
        size_t bytes = 0, idx = 0;
        st = zero_nvme_swapper_next(e->off_swapper, &buf, &bytes, &idx);
        if (st != ZERO_OK) {
            st = fail_obj(e, st, what, "swapper", zero_nvme_swapper_last_error(e->off_swapper));
            break;
        }
        if (!buf || idx != i) {
            st = zero_fail(&e->err, ZERO_INTERNAL, "%s: optimizer offload on rank %d: swapper handed chunk %zu, "
                           "expected %llu", what, e->rank, idx, (unsigned long long)i);
            break;
        }
        const uint64_t len = chunk_len(e, i);
        float *M = buf, *M1 = e->off_states > 1 ? M + len : NULL, *M2 = e->off_states > 2 ? M + 2 * len : NULL;
        st = step_chunk(e, i * e->off_chunk_numel, len, M, M1, M2, &next_bucket, grad_scale, what);
    }
    if (st == ZERO_OK) {
        st = zero_nvme_swapper_finish(e->off_swapper);
        if (st == ZERO_OK) st = zero_nvme_swapper_rewind(e->off_swapper);
        if (st != ZERO_OK) st = fail_obj(e, st, what, "swapper", zero_nvme_swapper_last_error(e->off_swapper));
    }
    if (st != ZERO_OK) {
        /* Part of the shard is updated and part not, and the swapper refuses
         * to go on: nothing consistent is left to continue from. */
        if (e->off_swapper) (void)zero_nvme_swapper_finish(e->off_swapper);
        engine_mark_broken(e);
    }
    return st;
}
