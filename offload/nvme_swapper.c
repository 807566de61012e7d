/* The swapper: a walk over an ordered list of stored tensors with `depth`
 * reads in flight ahead of the caller and write-backs behind it.
 *
 * Buffers rotate through depth + 2 slots: while the caller updates tensor i
 * (slot i % n), reads i+1..i+depth occupy the next depth slots and the write
 * of i-1 the remaining one; the read of i+depth+1 reuses the slot of i-1 only
 * after its write is waited for, so no buffer is overwritten in flight. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nvme_internal.h"

#define NONE SIZE_MAX

struct zero_nvme_swapper {
    zero_nvme_store *store;
    zero_host_pool *pool;
    zero_nvme_tensor *tensors;
    uint64_t *bytes;
    size_t count;
    int depth, writeback, nbuf;
    size_t buf_bytes;
    char **bufs;
    zero_nvme_request **reqs; /* per slot: the read or write using it */
    size_t next_read;         /* list index of the next read to issue */
    size_t cur;               /* list index handed out last; NONE before the first */
    int failed;
    zero_errbuf err;
};

static zero_status sw_fail(zero_nvme_swapper *sw, zero_status st)
{
    sw->failed = 1;
    return zero_fail_forward(&sw->err, st, "zero_nvme_swapper: ");
}

/* Wait for the request on `slot`, if any. A timeout leaves it there (the
 * buffer stays busy) so a later drain can retry. */
static zero_status wait_slot(zero_nvme_swapper *sw, int slot)
{
    if (!sw->reqs[slot]) return ZERO_OK;
    zero_status st = zero_nvme_wait(sw->store, sw->reqs[slot], 0);
    if (st != ZERO_TIMEOUT) sw->reqs[slot] = NULL;
    return st;
}

/* Wait for everything in flight; the first error wins. */
static zero_status drain(zero_nvme_swapper *sw)
{
    zero_status first = ZERO_OK;
    for (int k = 0; k < sw->nbuf; k++) {
        zero_status st = wait_slot(sw, k);
        if (st != ZERO_OK && first == ZERO_OK) {
            first = st;
            zero_fail_forward(&sw->err, st, "zero_nvme_swapper: ");
        }
    }
    return first;
}

static void free_buffers(zero_nvme_swapper *sw)
{
    for (int k = 0; sw->bufs && k < sw->nbuf; k++) {
        if (sw->pool) zero_host_pool_free(sw->pool, sw->bufs[k]);
        else free(sw->bufs[k]);
    }
}

void zero_nvme_swapper_destroy(zero_nvme_swapper *sw)
{
    if (!sw) return;
    drain(sw);
    int busy = 0;
    for (int k = 0; sw->reqs && k < sw->nbuf; k++) busy |= sw->reqs[k] != NULL;
    /* A request that would not finish may still write into its buffer:
     * leak the buffers rather than hand them to someone else. */
    if (!busy) free_buffers(sw);
    free(sw->bufs);
    free(sw->reqs);
    free(sw->tensors);
    free(sw->bytes);
    free(sw);
}

zero_status zero_nvme_swapper_create(zero_nvme_swapper **out, zero_nvme_store *store, zero_host_pool *pool,
                                     const zero_nvme_tensor *tensors, size_t count, int depth, int writeback)
{
    if (!out || !store || !tensors || count == 0 || depth < 1 || depth > 64)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_swapper_create: %s",
                         !out ? "out is NULL" : !store ? "store is NULL" : !tensors ? "tensors is NULL"
                         : count == 0 ? "count is 0" : "depth is not in 1..64");
    *out = NULL;
    zero_nvme_swapper *sw = calloc(1, sizeof *sw);
    if (!sw) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_nvme_swapper_create: no memory");
    sw->store = store;
    sw->pool = pool;
    sw->count = count;
    sw->depth = depth;
    sw->writeback = writeback != 0;
    sw->nbuf = depth + 2;
    sw->cur = NONE;
    sw->tensors = malloc(count * sizeof *sw->tensors);
    sw->bytes = malloc(count * sizeof *sw->bytes);
    sw->bufs = calloc((size_t)sw->nbuf, sizeof *sw->bufs);
    sw->reqs = calloc((size_t)sw->nbuf, sizeof *sw->reqs);
    if (!sw->tensors || !sw->bytes || !sw->bufs || !sw->reqs) {
        zero_nvme_swapper_destroy(sw);
        return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_nvme_swapper_create: no memory");
    }
    memcpy(sw->tensors, tensors, count * sizeof *tensors);
    for (size_t i = 0; i < count; i++) {
        zero_nvme_tensor_info ti;
        zero_status st = zero_nvme_tensor_get_info(store, tensors[i], &ti);
        if (st != ZERO_OK) {
            zero_nvme_swapper_destroy(sw);
            return zero_fail_forward(NULL, st, "zero_nvme_swapper_create: ");
        }
        sw->bytes[i] = ti.bytes;
        if (ti.padded > sw->buf_bytes) sw->buf_bytes = (size_t)ti.padded;
    }
    for (int k = 0; k < sw->nbuf; k++) {
        void *p = NULL;
        zero_status st = ZERO_OK;
        if (pool) st = zero_host_pool_alloc(pool, sw->buf_bytes, &p);
        else if (!(p = aligned_alloc(ZERO_OFFLOAD_ALIGN, sw->buf_bytes)))
            st = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "no memory for %zu-byte buffers", sw->buf_bytes);
        if (st != ZERO_OK) {
            zero_nvme_swapper_destroy(sw);
            return zero_fail_forward(NULL, st, "zero_nvme_swapper_create: buffer: ");
        }
        sw->bufs[k] = p;
    }
    *out = sw;
    return ZERO_OK;
}

zero_status zero_nvme_swapper_next(zero_nvme_swapper *sw, void **buf, size_t *bytes, size_t *index)
{
    if (!sw || !buf || !bytes || !index)
        return zero_fail(sw ? &sw->err : NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_swapper_next: %s is NULL",
                         !sw ? "swapper" : !buf ? "buf" : !bytes ? "bytes" : "index");
    *buf = NULL;
    *bytes = 0;
    *index = sw->count;
    if (sw->failed)
        return zero_fail(&sw->err, ZERO_INVALID_STATE, "zero_nvme_swapper_next: the swapper failed earlier (%s)",
                         sw->err.msg);
    if (sw->cur == sw->count) return ZERO_OK;
    size_t i = sw->cur == NONE ? 0 : sw->cur + 1;
    zero_status st;
    if (sw->cur != NONE && sw->writeback) {
        int slot = (int)(sw->cur % (size_t)sw->nbuf);
        st = zero_nvme_write_async(sw->store, sw->tensors[sw->cur], sw->bufs[slot], &sw->reqs[slot]);
        if (st != ZERO_OK) return sw_fail(sw, st);
    }
    sw->cur = i;
    if (i >= sw->count) {
        sw->cur = sw->count;
        return ZERO_OK;
    }
    while (sw->next_read < sw->count && sw->next_read <= i + (size_t)sw->depth) {
        int slot = (int)(sw->next_read % (size_t)sw->nbuf);
        st = wait_slot(sw, slot); /* the write of next_read - nbuf */
        if (st != ZERO_OK) return sw_fail(sw, st);
        st = zero_nvme_read_async(sw->store, sw->tensors[sw->next_read], sw->bufs[slot], &sw->reqs[slot]);
        if (st != ZERO_OK) return sw_fail(sw, st);
        sw->next_read++;
    }
    int slot = (int)(i % (size_t)sw->nbuf);
    st = wait_slot(sw, slot);
    if (st != ZERO_OK) return sw_fail(sw, st);
    *buf = sw->bufs[slot];
    *bytes = (size_t)sw->bytes[i];
    *index = i;
    return ZERO_OK;
}

zero_status zero_nvme_swapper_finish(zero_nvme_swapper *sw)
{
    if (!sw) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_swapper_finish: swapper is NULL");
    zero_status st = ZERO_OK;
    if (!sw->failed && sw->cur != NONE && sw->cur < sw->count && sw->writeback) {
        int slot = (int)(sw->cur % (size_t)sw->nbuf);
        st = zero_nvme_write_async(sw->store, sw->tensors[sw->cur], sw->bufs[slot], &sw->reqs[slot]);
        if (st != ZERO_OK) sw_fail(sw, st);
    }
    sw->cur = sw->count;
    zero_status d = drain(sw);
    if (st == ZERO_OK) st = d;
    if (st != ZERO_OK) sw->failed = 1;
    return st;
}

zero_status zero_nvme_swapper_rewind(zero_nvme_swapper *sw)
{
    if (!sw) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_nvme_swapper_rewind: swapper is NULL");
    for (int k = 0; k < sw->nbuf; k++)
        if (sw->reqs[k])
            return zero_fail(&sw->err, ZERO_INVALID_STATE,
                             "zero_nvme_swapper_rewind: I/O still in flight; call zero_nvme_swapper_finish first");
    if (sw->failed)
        return zero_fail(&sw->err, ZERO_INVALID_STATE, "zero_nvme_swapper_rewind: the swapper failed earlier (%s)",
                         sw->err.msg);
    sw->cur = NONE;
    sw->next_read = 0;
    return ZERO_OK;
}

const char *zero_nvme_swapper_last_error(const zero_nvme_swapper *sw)
{
    return sw ? sw->err.msg : "";
}
