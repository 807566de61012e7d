/* Parameter offload (DeepSpeed's offload_param, ZeRO-Infinity), stage 3:
 * where this rank's compute-dtype parameter shard lives when it is not in
 * device memory, and the few doors through which the engine reaches it.
 *
 *   cpu on the CPU device   params_shard is a chunk of the pinned NUMA-local
 *                           host pool instead of a device allocation. Host
 *                           memory either way: only the accounting moves
 *                           (PARAMS -> this report's host bytes). No walk.
 *   cpu on CUDA             the shard is a host array in the pool; the walk
 *                           below copies a bucket's chunk to the device for a
 *                           gather or a step and back after the step.
 *   nvme                    every bucket's chunk of the shard (region
 *                           [shard_off, shard_off + chunk)) is one tensor of
 *                           an NVMe store; nothing of the shard is resident
 *                           except the chunks being moved.
 *
 * The walk (cpu on CUDA, nvme) has two doors:
 *   gather   poff_fetch copies bucket b's chunk into this rank's own slot of
 *            the gather's receive buffer; the all-gather then runs in place
 *            (send == recv + rank * chunk), so no extra device staging. NVMe
 *            reads go through buffer_count host buffers: one for the open
 *            chunk (below), the others hold reads issued ahead
 *            (read_ahead_from: the rest of the module being gathered, then
 *            the modules not yet gathered along the recorded stage-3 order),
 *            refilled whenever a buffer is freed, after each gather and at
 *            the end of a step, so the reads of the next chunks overlap
 *            compute and each other.
 *   step and accessors   poff_open makes one bucket's chunk resident (the
 *            "open" chunk: host buffer 0 or 1 on the CPU device, a device
 *            buffer on CUDA), loading it only when its values are needed
 *            (fp32 params that are their own master, a persistent bucket's
 *            all-gather); the updated chunk is written back when another
 *            opens (NVMe: asynchronously, from the buffer just used, while
 *            the next chunk is updated in the other one) and poff_flush
 *            waits for the writes. Release writes nothing: parameters only
 *            change at step, checkpoint load and state_set.
 *
 * Consistency: a read ahead holds values of the store as it was; every write
 * to the store first waits for and drops the reads ahead, so a gather never
 * sees a stale chunk. Outside a step / params_changed / finalize / state_set
 * the open chunk is clean (equal to the store).
 *
 * Bitwise identity: the bytes stored are exactly the bytes the device shard
 * would hold (same casts, same order); storing and loading them moves bits
 * unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/offload.h>

#include "engine_internal.h"

#define ALIGN ((uint64_t)ZERO_OFFLOAD_ALIGN)

static uint64_t round_up(uint64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

typedef struct poff_slot {
    void *buf;                /* host pool: max_chunk * d bytes */
    int bucket;               /* whose chunk it holds or is reading; -1: free */
    zero_nvme_request *req;   /* the read in flight; NULL once waited for */
} poff_slot;

struct param_offload {
    int nvme;
    zero_host_pool *pool;
    zero_nvme_store *store;
    zero_nvme_tensor *tensors;  /* nvme: one per bucket */
    uint64_t max_chunk;         /* C: the largest bucket chunk (elements) */
    poff_slot *slots;           /* nvme: buffer_count host buffers; [open_slot] is the open chunk's */
    int num_slots;
    void *open_dev;             /* CUDA: the open chunk in device memory */
    int open_bucket;            /* -1: none */
    int open_dirty;
    int open_slot;              /* nvme: host buffer 0 or 1 holds (CPU) or stages (CUDA) the open chunk */
    zero_nvme_request *wreq[2]; /* nvme: writes behind from host buffers 0 and 1 */
    uint64_t reads_ahead, reads_sync;
};

static zero_status fail_obj(zero_engine *e, zero_status st, const char *what, const char *obj, const char *msg)
{
    char copy[ZERO_ERRMSG_MAX]; /* msg may be the buffer zero_fail writes (zero_last_error) */
    snprintf(copy, sizeof copy, "%s", msg);
    return zero_fail(&e->err, st, "%s: parameter offload (%s) on rank %d: %s", what, obj, e->rank, copy);
}

static zero_status store_failed(zero_engine *e, zero_status st, const char *what)
{
    return fail_obj(e, st, what, "offload_param nvme store", zero_nvme_store_last_error(e->poff->store));
}

static size_t chunk_bytes(const zero_engine *e, const zero_bucket *b) { return (size_t)(b->chunk * e->dsize); }

/* ---------------------------------------------------------------- setup */

static zero_status setup_store(zero_engine *e, const char *what)
{
    struct param_offload *p = e->poff;
    const zero_config *c = &e->cfg;
    uint64_t capacity = 0;
    for (int i = 0; i < e->num_buckets; i++) capacity += round_up(chunk_bytes(e, &e->buckets[i]));
    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    o.dir = c->offload_param_nvme_path;
    o.capacity = capacity;
    o.queue_depth = c->aio_queue_depth;
    o.block_bytes = c->aio_block_size;
    zero_status st = zero_nvme_store_create(&p->store, &o);
    if (st != ZERO_OK) {
        p->store = NULL;
        return fail_obj(e, st, what, "offload_param.nvme_path", zero_last_error());
    }
    p->tensors = calloc((size_t)e->num_buckets, sizeof *p->tensors);
    if (!p->tensors) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", what);
    for (int i = 0; i < e->num_buckets; i++) {
        char name[64];
        snprintf(name, sizeof name, "param.bucket%d", i);
        st = zero_nvme_define(p->store, name, chunk_bytes(e, &e->buckets[i]), &p->tensors[i]);
        if (st != ZERO_OK) return store_failed(e, st, what);
    }
    return ZERO_OK;
}

zero_status poff_setup(zero_engine *e)
{
    const char *what = "engine finalize";
    const zero_config *c = &e->cfg;
    struct param_offload *p = calloc(1, sizeof *p);
    if (!p) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", what);
    e->poff = p;
    p->open_bucket = -1;
    p->nvme = c->offload_param_device == ZERO_OFFLOAD_NVME;
    int widest = 0;
    for (int i = 0; i < e->num_buckets; i++)
        if (e->buckets[i].chunk > e->buckets[widest].chunk) widest = i;
    p->max_chunk = e->buckets[widest].chunk;
    if (p->nvme && p->max_chunk > c->offload_param_buffer_size) {
        const zero_bucket *b = &e->buckets[widest];
        return zero_fail(&e->err, ZERO_CONFIG,
                         "%s: offload_param.buffer_size = %llu elements is smaller than the largest bucket chunk "
                         "(%llu elements: bucket %d of module '%s', %llu elements over %d ranks); raise "
                         "offload_param.buffer_size or lower reduce_bucket_size",
                         what, (unsigned long long)c->offload_param_buffer_size, (unsigned long long)p->max_chunk,
                         widest, e->modules[b->module].name, (unsigned long long)b->numel, e->world);
    }
    const uint64_t cb = round_up(p->max_chunk * e->dsize);
    const uint64_t capacity = p->nvme ? (uint64_t)c->offload_param_buffer_count * cb : round_up(e->shard * e->dsize);
    zero_status st = zero_host_pool_create(&p->pool, e->dev, (size_t)capacity);
    if (st != ZERO_OK) {
        p->pool = NULL;
        return fail_obj(e, st, what, "host pool", zero_last_error());
    }
    e->poff_walk = p->nvme || e->is_cuda;
    if (!p->nvme) {
        st = zero_host_pool_alloc(p->pool, (size_t)(e->shard * e->dsize), &e->params_shard);
        if (st != ZERO_OK) return fail_obj(e, st, what, "host pool", zero_host_pool_last_error(p->pool));
    } else {
        p->num_slots = c->offload_param_buffer_count;
        p->slots = calloc((size_t)p->num_slots, sizeof *p->slots);
        if (!p->slots) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: out of memory", what);
        for (int k = 0; k < p->num_slots; k++) {
            p->slots[k].bucket = -1;
            st = zero_host_pool_alloc(p->pool, (size_t)cb, &p->slots[k].buf);
            if (st != ZERO_OK) return fail_obj(e, st, what, "host pool", zero_host_pool_last_error(p->pool));
        }
        ZERO_TRY(setup_store(e, what));
    }
    if (e->is_cuda) ZERO_TRY(engine_alloc_ex(e, ZERO_MEM_BUFFERS, (size_t)(p->max_chunk * e->dsize), 0, &p->open_dev));
    return ZERO_OK;
}

/* Wait for every read ahead and forget it; the first error wins. */
static zero_status drop_reads(zero_engine *e, const char *what)
{
    struct param_offload *p = e->poff;
    zero_status first = ZERO_OK;
    for (int k = 0; k < p->num_slots; k++) {
        poff_slot *s = &p->slots[k];
        if (s->req) {
            zero_status st = zero_nvme_wait(p->store, s->req, 0);
            if (st == ZERO_TIMEOUT) continue; /* still in flight: the slot stays busy */
            s->req = NULL;
            if (st != ZERO_OK && first == ZERO_OK) first = store_failed(e, st, what);
        }
        s->bucket = -1;
    }
    return first;
}

static zero_status wait_write(zero_engine *e, int k, const char *what);

void poff_teardown(zero_engine *e)
{
    struct param_offload *p = e->poff;
    if (!p) return;
    if (p->slots) (void)drop_reads(e, "engine destroy");
    for (int k = 0; k < 2; k++) (void)wait_write(e, k, "engine destroy");
    if (p->store) {
        zero_status st = zero_nvme_store_destroy(p->store); /* removes the swap files */
        if (st != ZERO_OK)
            zero_log(ZERO_LOG_WARN, "engine destroy: closing the parameter offload store on rank %d: %s", e->rank,
                     zero_last_error());
    }
    if (p->open_dev) engine_free(e, ZERO_MEM_BUFFERS, (size_t)(p->max_chunk * e->dsize), p->open_dev);
    if (p->pool && !p->nvme) e->params_shard = NULL; /* a pool chunk: returned with the pool */
    zero_host_pool_destroy(p->pool);
    free(p->slots);
    free(p->tensors);
    free(p);
    e->poff = NULL;
    e->poff_walk = 0;
}

/* ---------------------------------------------------------------- chunk I/O */

/* Where the open chunk is computed on: device memory on CUDA, host buffer
 * open_slot (0 or 1) on the CPU device (nvme). */
static void *open_buf(const zero_engine *e)
{
    return e->is_cuda ? e->poff->open_dev : e->poff->slots[e->poff->open_slot].buf;
}

static zero_status copy(zero_engine *e, void *dst, const void *src, size_t bytes, const char *what)
{
    zero_status st = engine_memcpy(e, dst, src, bytes);
    if (st != ZERO_OK) return fail_obj(e, st, what, "copy", zero_last_error());
    return ZERO_OK;
}

/* Wait for the write behind from host buffer k (0 or 1), if any. */
static zero_status wait_write(zero_engine *e, int k, const char *what)
{
    struct param_offload *p = e->poff;
    if (!p->wreq[k]) return ZERO_OK;
    zero_status st = zero_nvme_wait(p->store, p->wreq[k], 0);
    if (st == ZERO_TIMEOUT) return store_failed(e, st, what); /* still in flight: the buffer stays busy */
    p->wreq[k] = NULL;
    return st == ZERO_OK ? ZERO_OK : store_failed(e, st, what);
}

/* Bucket b's stored chunk into the open buffer. */
static zero_status load_open(zero_engine *e, const zero_bucket *b, int bi, const char *what)
{
    struct param_offload *p = e->poff;
    if (!p->nvme) return copy(e, open_buf(e), elem_ptr(e, e->params_shard, b->shard_off), chunk_bytes(e, b), what);
    void *host = p->slots[p->open_slot].buf;
    zero_status st = zero_nvme_read(p->store, p->tensors[bi], host);
    if (st != ZERO_OK) return store_failed(e, st, what);
    if (e->is_cuda) ZERO_TRY(copy(e, p->open_dev, host, chunk_bytes(e, b), what));
    return ZERO_OK;
}

/* Store the open chunk if it changed. NVMe: the write is issued from the
 * open host buffer and left in flight (write-behind), and the next chunk
 * opens in the other of buffers 0 and 1, so the step's next update overlaps
 * this write; `wait` = 1 also waits for every write. Failure marks the engine
 * broken: the parameters on this rank are neither the old nor the new ones. */
static zero_status store_open(zero_engine *e, int wait, const char *what)
{
    struct param_offload *p = e->poff;
    zero_status st = ZERO_OK;
    if (p->open_bucket >= 0 && p->open_dirty) {
        const int bi = p->open_bucket;
        const zero_bucket *b = &e->buckets[bi];
        const int k = p->open_slot;
        st = engine_sync_stream(e, what); /* the cast into the open chunk is done */
        if (st == ZERO_OK && !p->nvme)
            st = copy(e, elem_ptr(e, e->params_shard, b->shard_off), p->open_dev, chunk_bytes(e, b), what);
        if (st == ZERO_OK && p->nvme) {
            st = drop_reads(e, what); /* no read of the old values may be in flight or kept */
            if (st == ZERO_OK && e->is_cuda) st = copy(e, p->slots[k].buf, p->open_dev, chunk_bytes(e, b), what);
            if (st == ZERO_OK && (st = zero_nvme_write_async(p->store, p->tensors[bi], p->slots[k].buf,
                                                             &p->wreq[k])) != ZERO_OK) {
                p->wreq[k] = NULL;
                st = store_failed(e, st, what);
            }
            p->open_slot ^= 1;
            p->open_bucket = -1; /* its bytes are the write's now */
        }
        p->open_dirty = 0;
    }
    for (int k = 0; p->nvme && wait && k < 2; k++) {
        zero_status w = wait_write(e, k, what);
        if (st == ZERO_OK) st = w;
    }
    if (st != ZERO_OK) {
        p->open_bucket = -1;
        engine_mark_broken(e);
    }
    return st;
}

zero_status poff_flush(zero_engine *e, const char *what)
{
    if (!e->poff_walk) return ZERO_OK;
    return store_open(e, 1, what);
}

zero_status poff_open(zero_engine *e, const zero_bucket *b, int flags, const char *what)
{
    if (!e->poff_walk) return ZERO_OK;
    struct param_offload *p = e->poff;
    const int bi = (int)(b - e->buckets);
    if (p->open_bucket != bi) {
        ZERO_TRY(store_open(e, 0, what));
        p->open_bucket = -1;
        zero_status st = p->nvme ? wait_write(e, p->open_slot, what) : ZERO_OK; /* the buffer is free again */
        if (st == ZERO_OK && (flags & POFF_READ)) st = load_open(e, b, bi, what);
        if (st != ZERO_OK) {
            engine_mark_broken(e);
            return st;
        }
        p->open_bucket = bi;
        p->open_dirty = 0;
    }
    if (flags & POFF_WRITE) p->open_dirty = 1;
    return ZERO_OK;
}

zero_status poff_open_master(zero_engine *e, const zero_bucket *b, int flags, const char *what)
{
    if (!e->poff_walk || e->master || e->off_walk) return ZERO_OK; /* the master is elsewhere */
    return poff_open(e, b, flags, what);
}

zero_status poff_store_open(zero_engine *e, const char *what)
{
    if (!e->poff_walk || e->master || e->off_walk || e->poff->open_bucket < 0) return ZERO_OK;
    e->poff->open_dirty = 1;
    return poff_flush(e, what);
}

void *layout_param_chunk(zero_engine *e, const zero_bucket *b)
{
    if (!e->poff_walk) return elem_ptr(e, e->params_shard, b->shard_off);
    return e->poff->open_bucket == (int)(b - e->buckets) ? open_buf(e) : NULL;
}

/* ---------------------------------------------------------------- gather */

/* Reads ahead use every host buffer but the open one (open_slot). */
static poff_slot *slot_of(struct param_offload *p, int bi)
{
    for (int k = 0; k < p->num_slots; k++)
        if (k != p->open_slot && p->slots[k].bucket == bi) return &p->slots[k];
    return NULL;
}

static poff_slot *free_slot(struct param_offload *p)
{
    for (int k = 0; k < p->num_slots; k++)
        if (k != p->open_slot && p->slots[k].bucket < 0 && !p->slots[k].req && !(k < 2 && p->wreq[k]))
            return &p->slots[k];
    return NULL;
}

/* Wait for the read in slot s; on failure the slot is forgotten. */
static zero_status wait_slot(zero_engine *e, poff_slot *s, const char *what)
{
    if (!s->req) return ZERO_OK;
    zero_status st = zero_nvme_wait(e->poff->store, s->req, 0);
    if (st == ZERO_TIMEOUT) return store_failed(e, st, what);
    s->req = NULL;
    if (st != ZERO_OK) {
        s->bucket = -1;
        return store_failed(e, st, what);
    }
    return ZERO_OK;
}

static zero_status read_ahead_from(zero_engine *e, int after, const char *what);

static zero_status fetch_chunk(zero_engine *e, const zero_bucket *b, void *dst, const char *what)
{
    struct param_offload *p = e->poff;
    const int bi = (int)(b - e->buckets);
    const size_t bytes = chunk_bytes(e, b);
    if (p->open_bucket == bi) { /* clean outside a step: equal to the store */
        ZERO_TRY(engine_sync_stream(e, what));
        return copy(e, dst, open_buf(e), bytes, what);
    }
    if (!p->nvme) return copy(e, dst, elem_ptr(e, e->params_shard, b->shard_off), bytes, what);
    poff_slot *s = slot_of(p, bi);
    if (s) {
        p->reads_ahead++;
    } else {
        s = free_slot(p);
        if (!s) { /* every buffer holds a read ahead: take the oldest-issued one's place */
            const int k = p->open_slot == 0 ? 1 : 0;
            s = &p->slots[k];
            zero_status st = wait_slot(e, s, what);
            if (st == ZERO_OK && k < 2) st = wait_write(e, k, what); /* none outside a step; never overwrite one */
            if (st != ZERO_OK) return st;
        }
        zero_status st = zero_nvme_read_async(p->store, p->tensors[bi], s->buf, &s->req);
        if (st != ZERO_OK) {
            s->req = NULL;
            s->bucket = -1;
            return store_failed(e, st, what);
        }
        s->bucket = bi;
        p->reads_sync++;
    }
    zero_status st = wait_slot(e, s, what);
    if (st == ZERO_OK) st = copy(e, dst, s->buf, bytes, what);
    s->bucket = -1;
    /* keep the freed buffer busy: when the prefetcher gathers many modules
     * at once, the reads of the next chunks are then in flight together
     * (queue depth) instead of one synchronous read after another */
    if (st == ZERO_OK) st = read_ahead_from(e, bi, what);
    return st;
}

zero_status poff_fetch(zero_engine *e, const zero_bucket *b, void *dst, const char *what)
{
    zero_status st = fetch_chunk(e, b, dst, what);
    /* This rank's parameters cannot be read (a file truncated or gone, an
     * I/O error): its gathers cannot go on, and the module is half issued. */
    if (st != ZERO_OK) engine_mark_broken(e);
    return st;
}

/* Issue the read of bucket bi's chunk into a free buffer unless it is
 * persistent, open or already read; *full = 1 when no buffer is free. */
static zero_status read_one(zero_engine *e, int bi, int *full, const char *what)
{
    struct param_offload *p = e->poff;
    if (e->buckets[bi].persistent || bi == p->open_bucket || slot_of(p, bi)) return ZERO_OK;
    poff_slot *s = free_slot(p);
    if (!s) {
        *full = 1;
        return ZERO_OK;
    }
    zero_status st = zero_nvme_read_async(p->store, p->tensors[bi], s->buf, &s->req);
    if (st != ZERO_OK) {
        s->req = NULL;
        return store_failed(e, st, what);
    }
    s->bucket = bi;
    return ZERO_OK;
}

/* The chunks a gather fetches next: the rest of the module being issued
 * (its buckets after `after`, in the order issue_gather walks them; none when
 * after < 0), then along the recorded order the modules not yet gathered. */
static zero_status read_ahead_from(zero_engine *e, int after, const char *what)
{
    struct param_offload *p = e->poff;
    if (!p || !p->nvme) return ZERO_OK;
    int full = 0;
    if (after >= 0) {
        const zero_module *m = &e->modules[e->buckets[after].module];
        int past = 0;
        for (int i = 0; i < m->num_buckets && !full; i++) {
            if (past) ZERO_TRY(read_one(e, m->bucket_ids[i], &full, what));
            past |= m->bucket_ids[i] == after;
        }
    }
    for (int j = e->cur_len; e->replay_ok && j < e->trace_len && !full; j++) {
        const zero_module *t = &e->modules[e->trace[j]];
        if (t->gather_numel == 0 || t->state != MODULE_RELEASED) continue;
        for (int i = 0; i < t->num_buckets && !full; i++) ZERO_TRY(read_one(e, t->bucket_ids[i], &full, what));
    }
    return ZERO_OK;
}

zero_status poff_read_ahead(zero_engine *e, const char *what) { return read_ahead_from(e, -1, what); }

/* ---------------------------------------------------------------- report */

zero_status zero_engine_get_param_offload_report(const zero_engine *e, zero_param_offload_report *out)
{
    if (!e || !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine param_offload_report: NULL argument");
    memset(out, 0, sizeof *out);
    out->device = e->cfg.offload_param_device;
    const struct param_offload *p = e->poff;
    if (!e->finalized || !p) return ZERO_OK;
    zero_engine *me = (zero_engine *)e; /* the pool and store calls take non-const handles; they only read */
    zero_host_pool_stats ps;
    if (zero_host_pool_get_stats(p->pool, &ps) != ZERO_OK)
        return zero_fail(&me->err, ZERO_INTERNAL, "engine param_offload_report: %s", zero_host_pool_last_error(p->pool));
    out->host_bytes = ps.in_use;
    out->host_peak = ps.peak_in_use;
    out->host_capacity = ps.capacity;
    if (p->store) {
        zero_nvme_store_info si;
        if (zero_nvme_store_get_info(p->store, &si) != ZERO_OK)
            return zero_fail(&me->err, ZERO_INTERNAL, "engine param_offload_report: %s",
                             zero_nvme_store_last_error(p->store));
        out->nvme_bytes = si.used;
        out->nvme_written = si.bytes_written;
        out->nvme_read = si.bytes_read;
        out->num_chunks = (uint64_t)e->num_buckets;
        out->buffer_count = p->num_slots;
    }
    out->chunk_numel = p->max_chunk;
    out->reads_ahead = p->reads_ahead;
    out->reads_sync = p->reads_sync;
    return ZERO_OK;
}
