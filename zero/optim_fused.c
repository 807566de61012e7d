/* The fused optimizer step (DESIGN invariant 8's "kernels a GPU user would
 * not be embarrassed by"): one multi-tensor launch updates this rank's whole
 * shard - every bucket, tensor and parameter group - and writes the
 * compute-dtype parameters in the same pass, instead of one kernel (and one
 * cast, and on the CPU one host wait) per bucket and group run.
 *
 * The chunk table (optim/cpu_optim.h) is a pure function of the plan, the
 * stage and the parameter groups: built at finalize and again after a
 * parameter changes group. Each row is at most ZERO_OPTIM_CHUNK elements of
 * one bucket's region and one group, with its offsets into master, gradient,
 * moments and compute-dtype params. The hyperparameter table (one row per
 * group: the step number and the gradient scale change every step) is
 * filled per step. On CUDA both live in device memory (books: buffers) and
 * the launch is on the engine stream; on the CPU the twin runs the same
 * table on the host (zero_cpu_fused_step).
 *
 * Where the step reads a gradient that is not one array (stage 0 at world
 * > 1 all-gathers each bucket's reduced gradient into a staging buffer
 * first), the table is launched bucket by bucket, each launch over its
 * bucket's rows. The per-bucket path (optim.c) remains for the offload walks
 * (state or params reached chunk by chunk) and for ZERO_OPTIM_FUSED=0, which
 * the equivalence test compares against: the same bits. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "optim/cpu_optim.h"
#include "zero_build_config.h"
#if ZERO_HAVE_CUDA
#include <zero/zero_cuda.h>

#include "device/cuda_module.h"
#endif

int optim_fused_usable(const zero_engine *e)
{
    return e->fused_on && !e->off_walk && !e->poff_walk;
}

/* Stage 0 at world > 1: the gradient of bucket b is staged whole in a buffer
 * of its own, so its rows address it from the bucket's start. */
static int per_bucket_grad(const zero_engine *e) { return e->cfg.stage == 0 && e->world > 1; }

/* The arrays the kernel addresses; a row's offsets count from them. */
typedef struct fused_bases {
    float *p;  /* fp32 params: the master, else the params themselves */
    void *out; /* compute-dtype params written in the same pass (a master only) */
} fused_bases;

static fused_bases bases_of(zero_engine *e)
{
    void *params = e->cfg.stage < 3 ? e->params_full : e->params_shard;
    return (fused_bases){e->master ? e->master : (float *)params, e->master ? params : NULL};
}

/* The offsets of element 0 of bucket b's region, from the layout functions
 * the per-bucket step uses (one place says where a region lives): the
 * master's (layout_master), the moments' (layout_moment), the params the
 * cast writes (this rank's region of the full params at stages 0-2,
 * layout_param_chunk at 3) and the gradient's (step.c: the accumulated
 * gradient at the bucket's shard offset, or a staged bucket from 0). */
static zero_optim_chunk region_base(zero_engine *e, const zero_bucket *b)
{
    const fused_bases base = bases_of(e);
    float *mom = e->m1 ? e->m1 : e->m2; /* one offset serves both moments */
    zero_optim_chunk c = {0};
    c.p_off = (uint64_t)(layout_master(e, b) - base.p);
    c.m_off = mom ? (uint64_t)(layout_moment(e, mom, b) - mom) : 0;
    c.g_off = per_bucket_grad(e) ? 0 : b->shard_off;
    c.out_off = e->cfg.stage < 3
                    ? layout_region_flat(e, b)
                    : (uint64_t)((char *)layout_param_chunk(e, b) - (char *)e->params_shard) / e->dsize;
    return c;
}

static void free_device_tables(zero_engine *e)
{
    engine_free(e, ZERO_MEM_BUFFERS, e->fused_dev_chunks_bytes, e->fused_dev_chunks);
    engine_free(e, ZERO_MEM_BUFFERS, e->fused_dev_hyper_bytes, e->fused_dev_hyper);
    e->fused_dev_chunks = e->fused_dev_hyper = NULL;
    e->fused_dev_chunks_bytes = e->fused_dev_hyper_bytes = 0;
}

void optim_fused_free(zero_engine *e)
{
    if (e->is_cuda) free_device_tables(e);
    free(e->fused_chunks);
    free(e->fused_bucket_first);
    free(e->fused_hyper);
    free(e->fused_group_used);
    e->fused_group_used = NULL;
    e->fused_chunks = NULL;
    e->fused_bucket_first = NULL;
    e->fused_hyper = NULL;
    e->fused_num_chunks = 0;
}

zero_status optim_fused_build(zero_engine *e)
{
    const char *what = "engine: the fused optimizer step's chunk table";
    optim_fused_free(e);
    e->fused_stale = 0;
    if (!optim_fused_usable(e)) return ZERO_OK;
    /* Rows: each region cut at group runs and at ZERO_OPTIM_CHUNK. Count first. */
    size_t rows = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t at = 0;
        for (int bi = 0; bi < e->num_buckets; bi++) {
            const zero_bucket *b = &e->buckets[bi];
            if (pass) e->fused_bucket_first[bi] = at;
            const zero_optim_chunk base = region_base(e, b);
            const uint64_t off = layout_region_flat(e, b), n = layout_region_numel(e, b), end = off + n;
            groups_pieces it;
            groups_pieces_begin(e, off, end, &it);
            uint64_t lo, run_end;
            int group;
            while (groups_pieces_next(e, &it, &lo, &run_end, &group)) {
                for (; lo < run_end; at++) {
                    uint64_t len = run_end - lo < ZERO_OPTIM_CHUNK ? run_end - lo : ZERO_OPTIM_CHUNK;
                    if (pass) {
                        zero_optim_chunk *c = &e->fused_chunks[at];
                        const uint64_t k = lo - off;
                        c->p_off = base.p_off + k;
                        c->g_off = base.g_off + k;
                        c->m_off = base.m_off + k;
                        c->out_off = base.out_off + k;
                        c->len = (uint32_t)len;
                        c->group = (uint32_t)group;
                    }
                    lo += len;
                }
            }
        }
        if (pass) {
            e->fused_bucket_first[e->num_buckets] = at;
            break;
        }
        rows = at;
        e->fused_chunks = malloc((rows ? rows : 1) * sizeof *e->fused_chunks);
        e->fused_bucket_first = malloc(((size_t)e->num_buckets + 1) * sizeof *e->fused_bucket_first);
        if (!e->fused_chunks || !e->fused_bucket_first) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s", what);
    }
    e->fused_num_chunks = rows;
    e->fused_hyper_cap = e->num_groups;
    e->fused_hyper = calloc((size_t)e->fused_hyper_cap, sizeof *e->fused_hyper);
    e->fused_group_used = calloc((size_t)e->fused_hyper_cap, 1);
    if (!e->fused_hyper || !e->fused_group_used) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s", what);
    for (size_t i = 0; i < rows; i++) e->fused_group_used[e->fused_chunks[i].group] = 1;
    if (e->is_cuda) {
        e->fused_dev_chunks_bytes = rows * sizeof(zero_optim_chunk);
        e->fused_dev_hyper_bytes = (size_t)e->fused_hyper_cap * sizeof(zero_optim_hyper);
        ZERO_TRY(engine_alloc_ex(e, ZERO_MEM_BUFFERS, e->fused_dev_chunks_bytes, 0, &e->fused_dev_chunks));
        ZERO_TRY(engine_alloc_ex(e, ZERO_MEM_BUFFERS, e->fused_dev_hyper_bytes, 0, &e->fused_dev_hyper));
        ZERO_TRY(engine_memcpy(e, e->fused_dev_chunks, e->fused_chunks, e->fused_dev_chunks_bytes));
    }
    return ZERO_OK;
}

/* One launch over rows [first, last) with gradient base g. */
static zero_status launch(zero_engine *e, size_t first, size_t last, const float *g)
{
    zero_optim_fused f;
    f.adamw = e->cfg.optimizer == ZERO_OPTIM_ADAMW;
    f.num_chunks = last - first;
    const fused_bases base = bases_of(e);
    f.p = base.p;
    f.g = g;
    f.m1 = e->m1;
    f.m2 = e->m2;
    f.out = base.out;
    f.out_dtype = e->cfg.compute_dtype;
    if (f.num_chunks == 0) return ZERO_OK;
    if (e->is_cuda) {
#if ZERO_HAVE_CUDA
        f.hyper = e->fused_dev_hyper;
        f.chunks = (const zero_optim_chunk *)e->fused_dev_chunks + first;
        /* The engine's device is a CUDA one: the module is loaded (cuda_module.h). */
        int err = zero_cu->zero_cuda_fused_step(&f, zero_stream_get_cuda(e->stream)); /* in stream order: no host wait */
        if (err)
            return zero_fail(&e->err, ZERO_BACKEND, "engine step: fused optimizer kernel on rank %d: %s", e->rank,
                             zero_cu->zero_cuda_optim_error_string(err));
        return ZERO_OK;
#else
        return zero_fail(&e->err, ZERO_UNSUPPORTED, "engine step: CUDA device but libzero was built without CUDA");
#endif
    }
    /* The CPU device's kernel is host code: the stream's writes first
     * (nothing to wait for unless ZERO_CPU_ASYNC). */
    ZERO_TRY(engine_sync_stream(e, "engine step"));
    f.hyper = e->fused_hyper;
    f.chunks = e->fused_chunks + first;
    zero_cpu_fused_step(&f);
    return ZERO_OK;
}

zero_status optim_fused_step(zero_engine *e, float grad_scale, const char *what)
{
    if (e->fused_stale || e->num_groups > e->fused_hyper_cap) ZERO_TRY(optim_fused_build(e));
    /* Only the groups this rank updates: making a group's hyperparameters
     * records its first momentum step (optim.c), as the per-bucket path does. */
    for (int i = 0; i < e->num_groups; i++)
        if (e->fused_group_used[i]) optim_make_hyper(e, &e->groups[i], grad_scale, &e->fused_hyper[i]);
    if (e->is_cuda) {
        /* The host table is rewritten only by the next step, after this
         * step's closing wait for the engine stream. */
        zero_status st = zero_memcpy_async(e->dev, e->fused_dev_hyper, e->fused_hyper,
                                           (size_t)e->num_groups * sizeof(zero_optim_hyper), e->stream);
        if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine step: the optimizer's hyperparameters: ");
    }
    if (!per_bucket_grad(e)) return launch(e, 0, e->fused_num_chunks, e->gacc);
    for (int bi = 0; bi < e->num_buckets; bi++) {
        const zero_bucket *b = &e->buckets[bi];
        /* Everything on every rank: assemble the whole reduced bucket. */
        ZERO_TRY(engine_sync_stream(e, what));
        zero_status st = zero_allgather(e->dp, e->gacc + b->shard_off, e->slots[0].send, b->chunk, ZERO_F32);
        if (st != ZERO_OK) return engine_comm_failed(e, st, what);
        ZERO_TRY(launch(e, e->fused_bucket_first[bi], e->fused_bucket_first[bi + 1], e->slots[0].send));
    }
    return ZERO_OK;
}
