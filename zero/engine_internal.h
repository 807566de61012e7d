/* Internal: the engine's data structures, shared by the files of zero/.
 *
 * Layout vocabulary (see engine.h "the plan"):
 *   flat layout   every bucket, padded, one after another (P elements)
 *   chunk         1/N of a bucket; rank r owns chunk r of every bucket
 *   shard         this rank's chunks, one after another (P/N elements)
 * Stage 0 keeps master and moments in the flat layout (everything on every
 * rank); stages 1-3 keep them in the shard layout. The fp32 reduced-gradient
 * accumulator is always shard-sized. */
#ifndef ZERO_ENGINE_INTERNAL_H
#define ZERO_ENGINE_INTERNAL_H

#include <stdint.h>
#include <zero/engine.h>
#include <zero/experimental.h>

#include "common/error.h"

typedef struct zero_param {
    char *name;
    int module;
    int ndim;
    int64_t shape[ZERO_MAX_DIMS];
    uint64_t numel;
    float *init;      /* add_param: host copy of the initial values until finalize */
    zero_init_spec spec; /* add_param_init (and add_param with NULL: zeros): used when init is NULL */
    int persistent;   /* numel < stage3_param_persistence_threshold */
    int duplicate;    /* another mp rank counts this tensor in the norm */
    int group;        /* parameter group (groups.c); 0 = "default" */
    /* plan (plan.c). A param lies in buckets first_bucket ..
     * first_bucket + num_buckets - 1; more than one only when it is larger
     * than the bucket capacity. It is then split exactly at bucket
     * boundaries and every bucket but its last is full (a multiple of the dp
     * size, no padding), so its elements are contiguous in every layout
     * (flat, module gradient, gathered, persistent): element j of the param
     * is element in_bucket + j of the layout's run starting at first_bucket.
     * plan_piece / plan_owned_piece give its part of one bucket. */
    int first_bucket, num_buckets;
    uint64_t flat_off;   /* element 0 in the flat layout */
    uint64_t in_bucket;  /* element 0's offset inside first_bucket */
    /* This rank's owned elements: its part of chunk `rank` of each of its
     * buckets. Several ranges of the param's elements when it is split
     * (own_ranges of them, adjacent ones merged; plan_owned_range), but
     * always one run [shard_off, shard_off + own_numel) of the shard. */
    uint64_t own_begin, own_end; /* the first owned element and one past the last (own_numel = 0: both 0) */
    uint64_t own_numel;          /* owned elements (own_end - own_begin when own_ranges <= 1) */
    uint64_t shard_off;          /* of the first owned element in the shard */
    int own_ranges;
} zero_param;

typedef struct zero_bucket {
    int module;
    int persistent;
    int first_param, num_params; /* the params with a piece in it (the first and the last may be
                                    split params that also lie in neighbouring buckets) */
    uint64_t numel;       /* padded: a multiple of the dp size */
    uint64_t chunk;       /* numel / dp */
    uint64_t flat_off;    /* in the flat layout */
    uint64_t shard_off;   /* of this rank's chunk in the shard */
    uint64_t module_off;  /* in the module's gradient buffer (all its buckets) */
    uint64_t gather_off;  /* stage 3: in the module's gathered buffer (non-persistent buckets) */
    uint64_t persist_off; /* stage 3: in the persistent buffer */
} zero_bucket;

enum { MODULE_RELEASED = 0, MODULE_INFLIGHT = 1, MODULE_GATHERED = 2 };

typedef struct zero_module {
    char *name;
    int *bucket_ids, num_buckets;  /* its buckets, in plan order */
    int num_params;
    uint64_t grad_numel;   /* sum of its buckets' padded numel */
    uint64_t gather_numel; /* sum of its non-persistent buckets' padded numel */
    /* stage-3 gather state */
    int gather_count;
    int state;             /* MODULE_* */
    void *gathered;        /* compute dtype, gather_numel elements */
    zero_request **reqs;   /* in-flight prefetch all-gathers, one per bucket */
    /* untraced gathers (zero_engine_set_untraced): their own count, and
     * their own buffer when the module was not gathered by the trace */
    int ugather_count;
    void *ugathered;
    /* gradient state */
    void *grad;            /* stages 2-3: live gradient buffer (grad_numel elements) */
    int ready_count;       /* grads_ready calls since the last step */
} zero_module;

/* A parameter group (groups.c): hyperparameters resolved (no "keep" values). */
typedef struct zero_group {
    char *name;
    double lr_scale, weight_decay, beta1, beta2, eps;
    double momentum, dampening; /* SGD */
    int nesterov;
    /* The step of the group's first update with momentum > 0, which starts
     * its buffers as the gradient (torch: momentum_buffer None); 0: none yet. */
    int64_t momentum_from;
} zero_group;

/* One staging slot for a bucket reduce-scatter. */
typedef struct zero_slot {
    float *send;          /* fp32, max bucket */
    float *recv;          /* fp32, max chunk */
    zero_request *req;    /* non-NULL while a reduce-scatter is in flight */
    int bucket;
    int direct;           /* the reduce-scatter writes the gradient shard itself (grads.c) */
    int last;             /* the bucket's last reduction of the step: its norm can be taken (grad_norm.c) */
} zero_slot;

/* One bucket's sum of squares of its reduced gradient chunk (grad_norm.c). */
typedef struct zero_bucket_norm {
    double sumsq;
    int nonfinite;
    int ready; /* taken when the step's last reduction landed; 0: the step takes it */
} zero_bucket_norm;

/* aio.block_size's upper bound: the NVMe store's largest I/O segment (1 GiB). */
#define ZERO_AIO_BLOCK_SIZE_MAX (1ull << 30)

typedef struct zero_cached {
    void *ptr;
    size_t bytes;
    int cls;              /* its size class (zero_transient_cache.classes) */
} zero_cached;

/* A size class of module buffers (alloc.c). */
typedef struct zero_buffer_class {
    size_t size;          /* bytes of each of its buffers */
    int live, cached;     /* buffers in use, in the cache */
    int step_peak;        /* the most in use at once since the last step */
    int last_peak;        /* ... in the step before */
} zero_buffer_class;

/* Released module-sized buffers (stage-3 gathers, stage-2/3 module
 * gradients) kept for reuse across steps, with the bounds that keep the
 * cache from holding more than the engine's recent steps used (alloc.c).
 * Its bytes are the books' ZERO_MEM_CACHE. */
typedef struct zero_transient_cache {
    zero_cached *items;   /* least recently released first */
    int count, cap;
    size_t *sizes;        /* the engine's module-buffer request sizes, ascending */
    int *size_class;      /* ... and the class of each */
    int num_sizes;
    zero_buffer_class *classes;
    int num_classes;
    uint64_t cached;      /* bytes of the items */
    uint64_t live;        /* bytes of the buffers in use */
    uint64_t step_peak;   /* the most `live` since the last step */
    uint64_t last_peak;   /* ... in the step before */
} zero_transient_cache;

/* The accounting allocator's books. */
typedef struct zero_books {
    uint64_t bytes[ZERO_MEM_CATEGORY_COUNT];
    uint64_t peak[ZERO_MEM_CATEGORY_COUNT];
    uint64_t total, peak_total;
} zero_books;

struct zero_engine {
    uint32_t magic;       /* ZERO_HANDLE_ENGINE; ZERO_HANDLE_DEAD once destroyed (common/handle.h) */
    zero_errbuf err;
    zero_config cfg;
    zero_comm *dp;
    zero_device *dev;
    int is_cuda;
    /* streams.c: the engine's stream (every device op of the engine), the
     * trainer's compute stream (NULL: the default stream) and the events
     * that hand over between them. */
    zero_stream *stream;
    zero_stream *compute;
    zero_event *ev_compute, *ev_engine;
    int rank, world;
    int finalized;
    int broken;           /* a collective failed: only destroy is accepted */
    char fatal[ZERO_ERRMSG_MAX]; /* the failure that broke it */

    zero_param *params;
    int num_params, cap_params;
    zero_module *modules;
    int num_modules, cap_modules;
    zero_bucket *buckets;
    int num_buckets;
    zero_group *groups;   /* groups[0] = "default": the config's hyperparameters */
    int num_groups, cap_groups;
    /* The flat layout cut into runs of one group (groups.c, at finalize;
     * none while every parameter is in group 0): run i covers flat elements
     * [grun_begin[i], grun_begin[i + 1]) (the last run to the end). */
    uint64_t *grun_begin;
    int *grun_group, num_gruns;

    uint64_t numel, padded, shard, max_bucket, persist_numel;
    uint64_t plan_hash;
    size_t dsize;         /* compute dtype size */
    int own_master;       /* fp32 compute: params are their own master */

    zero_books books;
    zero_transient_cache tcache;

    /* device buffers */
    void *params_full;    /* stages 0-2: flat layout, compute dtype */
    void *params_shard;   /* stage 3: shard layout, compute dtype */
    void *persist;        /* stage 3: persistent buckets, whole, compute dtype */
    void *grads_full;     /* stages 0-1: flat layout, compute dtype */
    float *gacc;          /* fp32 reduced-gradient shard */
    unsigned char *gacc_live; /* per bucket: its part of gacc holds this step's sum; 0: stale,
                                 the next reduction overwrites it (no zeroing pass, grads.c) */
    zero_bucket_norm *bucket_norms; /* per bucket (grad_norm.c) */
    int norm_at_landing;  /* 0: ZERO_NORM_AT_STEP=1, the norm's sums taken at the step */
    int grad_fold;        /* the device's one-pass take (grads.c); 0: ZERO_GRAD_FOLD=0 or CUDA */
    int progress_on;      /* overlap_comm's progress calls (progress.c); 0: ZERO_PROGRESS=0 */
    float *master;        /* fp32; NULL when own_master */
    float *m1, *m2;       /* fp32 moments (NULL when absent) */
    zero_slot slots[2];
    int num_slots, next_slot;

    /* stage-3 prefetch */
    int *trace, trace_len, trace_cap;
    int *cur, cur_len, cur_cap;
    int have_trace, replay_ok;
    int untraced;         /* zero_engine_set_untraced: gathers bypass the trace and the prefetcher */
    uint64_t inflight_numel, live_numel;

    zero_engine_stats stats;
    double norm_buf;      /* the step's scalar all-reduce: not on the stack, since a
                             timed-out op may still be written by the transport */
    zero_comm *mp;        /* model-parallel group for the norm (borrowed); NULL: none */
    double *mp_buf;       /* host: mp size + 1 doubles for its all-gather (model_parallel.c) */
    int num_duplicates;   /* params marked duplicate */

    /* optimizer offload (offload_opt.c). `off_walk`: the step walks the
     * shard chunk by chunk with host-resident state (nvme, or cpu on CUDA);
     * otherwise cpu offload just places master/m1/m2 in the pool. */
    struct zero_host_pool *off_pool;
    struct zero_nvme_store *off_store;
    struct zero_nvme_swapper *off_swapper;
    int32_t *off_chunks;      /* nvme tensors, one per chunk */
    uint64_t off_chunk_numel, off_num_chunks;
    int off_walk;
    int off_states;           /* fp32 arrays per chunk: master (+ m1 (+ m2)) */
    float *off_host[3];       /* cpu on CUDA: host master, m1, m2 (shard_numel each) */
    float *off_bounce;        /* nvme: one chunk, for init and state access */
    float *off_grad;          /* CUDA: host staging for a chunk of the gradient */

    /* parameter offload (offload_param.c). `poff_walk`: the stage-3 shard is
     * not device-addressable (nvme, or cpu on CUDA), so it is reached only
     * through poff_fetch / poff_open; otherwise params_shard points into the
     * host pool (cpu on the CPU device) or device memory (no offload). */
    struct param_offload *poff;
    int poff_walk;

    /* the fused optimizer step (optim_fused.c): the chunk table (host), the
     * first row of each bucket (num_buckets + 1), the per-step
     * hyperparameters (one row per group, room for fused_hyper_cap); on
     * CUDA their device copies (books: buffers). fused_on: not disabled by
     * ZERO_OPTIM_FUSED=0; fused_stale: the groups changed, rebuild. */
    struct zero_optim_chunk *fused_chunks;
    size_t fused_num_chunks, *fused_bucket_first;
    struct zero_optim_hyper *fused_hyper;
    int fused_hyper_cap, fused_on, fused_stale;
    unsigned char *fused_group_used; /* groups with a row: only theirs are made per step (as the per-bucket path) */
    void *fused_dev_chunks, *fused_dev_hyper;
    size_t fused_dev_chunks_bytes, fused_dev_hyper_bytes;

    /* scalars */
    int64_t step;
    int64_t skipped;
    double loss_scale;
    int hysteresis_left;
    int64_t good_steps;
};

/* ---------------------------------------------------------------- alloc.c */
zero_status engine_alloc(zero_engine *e, zero_mem_category cat, size_t bytes, void **out);
/* zeroed = 0: for a buffer the caller overwrites whole before any read. */
zero_status engine_alloc_ex(zero_engine *e, zero_mem_category cat, size_t bytes, int zeroed, void **out);
void engine_free(zero_engine *e, zero_mem_category cat, size_t bytes, void *ptr);
/* Zero `bytes` of device memory. */
zero_status zero_memset_zero(zero_engine *e, void *ptr, size_t bytes);
/* Transient buffers (gathered modules, module gradients): reuse a released
 * buffer of the same size if one is cached; put caches it (category
 * buffers) or frees the oldest; trim frees the cache. */
zero_status engine_transient_get(zero_engine *e, zero_mem_category cat, size_t bytes, int zeroed, void **out);
void engine_transient_put(zero_engine *e, zero_mem_category cat, size_t bytes, void *ptr);
zero_status engine_transient_classes(zero_engine *e);
void engine_transient_step_end(zero_engine *e);
void engine_transient_trim(zero_engine *e);
/* Host memory, counted (init values before finalize). */
zero_status engine_host_alloc(zero_engine *e, zero_mem_category cat, size_t bytes, void **out);
void engine_host_free(zero_engine *e, zero_mem_category cat, size_t bytes, void *ptr);

/* ---------------------------------------------------------------- hashing (FNV-1a 64) */
#define FNV_OFFSET 14695981039346656037ull
#define FNV_PRIME 1099511628211ull

static inline uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

static inline uint64_t fnv_u64(uint64_t h, uint64_t v) { return fnv(h, &v, sizeof v); }

/* ---------------------------------------------------------------- plan.c */
zero_status plan_build(zero_engine *e);
zero_status plan_check_ranks(zero_engine *e);
/* Elements per bucket at most: min(reduce_bucket_size, allgather_bucket_size)
 * rounded down to a multiple of the dp size, at least the dp size. */
uint64_t plan_capacity(const zero_config *c, int world);
/* Param p's piece of bucket b: param elements [*lo, *hi), starting at
 * element *at of the bucket. 0 (outputs untouched) when p is not in b. */
int plan_piece(const zero_engine *e, const zero_param *p, const zero_bucket *b, uint64_t *lo, uint64_t *hi,
               uint64_t *at);
/* Param p's piece of this rank's chunk of bucket b: param elements
 * [*lo, *hi), starting at element *in_chunk of the chunk (so at shard
 * offset b->shard_off + *in_chunk). 0 when this rank owns none of p in b. */
int plan_owned_piece(const zero_engine *e, const zero_param *p, const zero_bucket *b, uint64_t *lo, uint64_t *hi,
                     uint64_t *in_chunk);
/* Owned range `index` (0 .. own_ranges - 1) of p: [*begin, *end). 0 if none. */
int plan_owned_range(const zero_engine *e, const zero_param *p, int index, uint64_t *begin, uint64_t *end);

/* ---------------------------------------------------------------- init.c */
/* ZERO_INVALID_ARGUMENT naming the field unless `spec` is usable; *out = the
 * spec made whole (an older version's missing fields at their defaults). */
zero_status init_spec_check(zero_engine *e, const zero_init_spec *spec, const char *what, const char *name,
                            zero_init_spec *out);
/* finalize, after the plan: every rank was given the same init (collective). */
zero_status init_check_ranks(zero_engine *e);
/* finalize, after the buffers: compute or copy this rank's elements into
 * them, then drop the add_param copies. */
zero_status init_load(zero_engine *e);

/* ---------------------------------------------------------------- config.c */
/* `c` is the latest struct (config_read makes one from the caller's version). */
zero_status config_validate(const zero_config *c, zero_errbuf *err);
/* The caller's config, of any version this library knows, as the latest
 * struct: fields newer than the caller's version take ZERO_CONFIG_INIT's
 * values. A bad size or version fails with `status` (message from `what`). */
zero_status config_read(const zero_config *in, zero_config *out, zero_status status, const char *what,
                        zero_errbuf *err);
/* Copy `full` back into the caller's config, the fields of its version only
 * (refused if `full` sets a newer field away from its default). */
zero_status config_write_back(const zero_config *full, zero_config *caller, zero_status status, const char *what,
                              zero_errbuf *err);

/* ---------------------------------------------------------------- helpers (engine.c) */
/* Fail as "<what>: <comm message>" and mark the engine broken. */
zero_status engine_comm_failed(zero_engine *e, zero_status st, const char *what);
/* From now on only destroy is accepted; keeps the current message. */
void engine_mark_broken(zero_engine *e);
zero_status engine_check_usable(zero_engine *e, const char *what, int need_finalized);
/* ---------------------------------------------------------------- streams (streams.c) */
zero_status engine_streams_create(zero_engine *e);
void engine_streams_destroy(zero_engine *e);
/* The host waits for the engine stream's queued work, at most the dp comm's
 * timeout (then ZERO_TIMEOUT naming `what`, engine broken). */
zero_status engine_sync_stream(zero_engine *e, const char *what);
/* The engine stream waits for the work queued on the compute stream so far. */
zero_status engine_wait_compute(zero_engine *e, const char *what);
/* The compute stream waits for the work queued on the engine stream so far. */
zero_status engine_hand_to_compute(zero_engine *e, const char *what);
/* A copy on the engine stream, finished on return. */
zero_status engine_memcpy(zero_engine *e, void *dst, const void *src, size_t bytes);
/* In-place all-reduce of `count` host values over the dp group, whatever
 * memory the backend carries. Marks the engine broken on comm failure. */
zero_status engine_allreduce_host(zero_engine *e, void *values, size_t count, zero_dtype dtype, zero_redop op,
                                  const char *what);
/* Pointer to element `off` of a compute-dtype buffer. */
static inline void *elem_ptr(const zero_engine *e, void *base, uint64_t off)
{
    return (char *)base + off * e->dsize;
}
/* The compute-dtype gradient of bucket b of module m (stages 0-1: the flat
 * buffer; 2-3: the module's live buffer). */
void *engine_bucket_grad(zero_engine *e, const zero_bucket *b);
/* fp32 region the optimizer updates for bucket b: the whole bucket at stage
 * 0, this rank's chunk otherwise (layout_region_numel elements). */
float *layout_master(zero_engine *e, const zero_bucket *b);
float *layout_moment(zero_engine *e, float *mom, const zero_bucket *b);
uint64_t layout_region_numel(const zero_engine *e, const zero_bucket *b);
/* The flat-layout element where that region starts. */
uint64_t layout_region_flat(const zero_engine *e, const zero_bucket *b);
/* Where element `in_chunk` of this rank's chunk of bucket b lives in a
 * state (NULL: the optimizer has no such state). Pair with plan_owned_piece. */
float *layout_chunk_state(zero_engine *e, zero_state_kind kind, const zero_bucket *b, uint64_t in_chunk);
/* Store fp32 values of a whole bucket (device memory) into master, params
 * and persistent copy, as this rank keeps them. */
zero_status layout_load_bucket(zero_engine *e, const zero_bucket *b, const float *full);

/* ---------------------------------------------------------------- progress.c */
/* With overlap_comm: let the dp comm's in-flight collectives advance (one
 * zero_test); called at the entry points where the caller's compute pauses. */
void engine_progress(zero_engine *e);

/* ---------------------------------------------------------------- grads.c */
zero_status grads_flush(zero_engine *e, const char *what);
/* Start a new accumulation: the shard goes stale (overwritten by the next
 * reductions), module buffers are released; the full gradients of stages
 * 0-1 are cleared unless after_step (a step leaves them zero already). */
zero_status grads_zero_all(zero_engine *e, int after_step);

/* ---------------------------------------------------------------- grad_norm.c */
/* Whether bucket sums of squares are taken when the last reduction lands. */
int grad_norm_at_landing(const zero_engine *e);
/* Bucket b's gradient chunk is final for this step: take its sum of squares. */
zero_status grad_norm_landed(zero_engine *e, const zero_bucket *b);
/* The stored sums are stale (a new accumulation starts). */
void grad_norm_forget(zero_engine *e);
/* This rank's sum of squares over its shard in plan order, duplicates left
 * out; INFINITY when any element (duplicates included) is not finite. */
zero_status grad_norm_local(zero_engine *e, double *local);

/* ---------------------------------------------------------------- gather.c */
zero_status gather_drop_prefetches(zero_engine *e, const char *what);
void gather_end_step(zero_engine *e);
void gather_free_all(zero_engine *e);
/* Stage 3: module m's gathered parameters (its untraced buffer first), or
 * NULL when it is not gathered. */
void *gather_module_params(const zero_module *m);

/* ---------------------------------------------------------------- step.c */
/* Cast bucket b's updated fp32 region to the compute dtype and make the
 * params whole where the stage keeps them whole (collective at 1-3). */
zero_status step_propagate_bucket(zero_engine *e, const zero_bucket *b, const char *what);
/* The same without the cast, for the fused step (which wrote the params). */
zero_status step_gather_bucket(zero_engine *e, const zero_bucket *b, const char *what);

/* ---------------------------------------------------------------- model_parallel.c */
/* Replace *total (this dp group's sum of squares) by the sum over the mp
 * group, added in mp rank order. No-op without an mp group. */
zero_status mp_norm_reduce(zero_engine *e, double *total, const char *what);

/* ---------------------------------------------------------------- groups.c */
/* Group 0 from the config (create). */
zero_status groups_init(zero_engine *e);
void groups_free(zero_engine *e);
/* The group runs of the flat layout (finalize, after the plan). */
zero_status groups_build_runs(zero_engine *e);
/* The run holding flat element `flat` (0 when there are no runs). */
int groups_run_at(const zero_engine *e, uint64_t flat);
/* The pieces of flat elements [off, end) that lie in one group each, in
 * order: the one walk of the runs that the per-bucket update (optim.c) and
 * the fused step's chunk table (optim_fused.c, and so the CUDA kernel's
 * groups) both follow. Without runs the range is one piece of group 0.
 *   groups_pieces it; groups_pieces_begin(e, off, end, &it);
 *   while (groups_pieces_next(e, &it, &lo, &hi, &group)) ... */
typedef struct groups_pieces {
    uint64_t lo, end;
    int run;
} groups_pieces;
void groups_pieces_begin(const zero_engine *e, uint64_t off, uint64_t end, groups_pieces *it);
int groups_pieces_next(const zero_engine *e, groups_pieces *it, uint64_t *lo, uint64_t *hi, int *group);

/* ---------------------------------------------------------------- optim.c */
/* Update n elements of a region that is contiguous in the flat layout from
 * flat element `flat_begin` on (layout_region_flat for a bucket's region),
 * each run of one parameter group with that group's hyperparameters. */
zero_status optim_update(zero_engine *e, float *p, const float *g, float *m1, float *m2, size_t n,
                         float grad_scale, uint64_t flat_begin);
/* The CPU kernel whatever the device (offloaded state lives in host memory). */
zero_status optim_update_host(zero_engine *e, float *p, const float *g, float *m1, float *m2, size_t n,
                              float grad_scale, uint64_t flat_begin);
struct zero_optim_hyper;
/* Group gr's hyperparameters for this step (e->step) and gradient scale. */
void optim_make_hyper(const zero_engine *e, zero_group *gr, float grad_scale, struct zero_optim_hyper *h);

/* ---------------------------------------------------------------- optim_fused.c */
/* The step takes the fused path (no offload walk, not ZERO_OPTIM_FUSED=0). */
int optim_fused_usable(const zero_engine *e);
/* (Re)build the chunk table (finalize; a group change marks it stale). */
zero_status optim_fused_build(zero_engine *e);
void optim_fused_free(zero_engine *e);
/* Update the whole shard and write the compute-dtype params: one launch
 * (one per bucket at stage 0, world > 1, after each bucket's all-gather). */
zero_status optim_fused_step(zero_engine *e, float grad_scale, const char *what);

/* ---------------------------------------------------------------- offload_opt.c */
/* After the plan, instead of device master/moments: the pool, the store
 * and the chunk tensors (every chunk written once, zeros). */
zero_status offload_setup(zero_engine *e);
void offload_teardown(zero_engine *e);
/* n floats of state index k (0 master, 1 moment1, 2 moment2) at shard
 * offset off, to (write = 0) or from `buf` (host or device memory). */
zero_status offload_state_io(zero_engine *e, int k, uint64_t off, uint64_t n, float *buf, int write,
                             const char *what);
/* Cast bucket b's master (from the offloaded state) into the params. */
zero_status offload_cast_bucket(zero_engine *e, const zero_bucket *b, const char *what);
/* The optimizer update and propagation of every bucket, chunk by chunk. */
zero_status offload_step(zero_engine *e, float grad_scale, const char *what);

/* ---------------------------------------------------------------- offload_param.c */
/* After the plan, instead of the device shard: the pool, the store, staging. */
zero_status poff_setup(zero_engine *e);
void poff_teardown(zero_engine *e);
enum { POFF_READ = 1, POFF_WRITE = 2 };
/* Make bucket b's chunk of the shard resident for the step or an accessor
 * (layout_param_chunk then returns it): POFF_READ loads its values, POFF_WRITE
 * says the caller will change it (stored by the next open or poff_flush; with
 * POFF_WRITE alone the caller must overwrite the whole chunk). No-op without
 * the walk. */
zero_status poff_open(zero_engine *e, const zero_bucket *b, int flags, const char *what);
/* poff_open where fp32 params are their own master (no master array, no
 * optimizer walk): the master of bucket b is its param chunk. */
zero_status poff_open_master(zero_engine *e, const zero_bucket *b, int flags, const char *what);
/* Store the open chunk now (it was written through layout_param_chunk). */
zero_status poff_store_open(zero_engine *e, const char *what);
/* Write back the open chunk if it changed. No-op without the walk. */
zero_status poff_flush(zero_engine *e, const char *what);
/* Bucket b's chunk into `dst` (device memory): the gather's own slot. */
zero_status poff_fetch(zero_engine *e, const zero_bucket *b, void *dst, const char *what);
/* Issue NVMe reads of the chunks of the modules recorded next. */
zero_status poff_read_ahead(zero_engine *e, const char *what);
/* Bucket b's compute-dtype chunk of the shard where it is resident now
 * (NULL: in the walk and not open). */
void *layout_param_chunk(zero_engine *e, const zero_bucket *b);

#endif
