/* The ZeRO engine: sharded parameters, gradients and optimizer state.
 *
 * A trainer registers its parameters, grouped into modules (the unit of
 * stage-3 gather/release and of grads-ready), then finalizes. From then on
 * the engine owns every parameter, gradient and optimizer buffer, sharded
 * across the data-parallel group by stage:
 *
 *   stage 0  everything on every rank (plain data parallel)
 *   stage 1  fp32 master weights and moments: own shard only
 *   stage 2  + the reduced gradient: own shard only
 *   stage 3  + the parameters: own shard only, gathered per module on demand
 *
 * ------------------------------------------------------------------ the plan
 * The partition plan is a pure function of (parameters in registration
 * order, dp size N, bucket capacity C, stage3_param_persistence_threshold),
 * the same at every stage. C = min(reduce_bucket_size,
 * allgather_bucket_size) rounded down to a multiple of N (at least N):
 * every reduce-scatter and every all-gather the engine issues is one bucket,
 * so no collective and no staging buffer exceeds either size, whatever the
 * parameter sizes. Consecutive parameters are grouped into buckets of at
 * most C elements; a bucket never spans two modules (a module is the unit
 * of grads_ready and of the stage-3 gather, so a bucket is reduced when its
 * module's gradients are ready) nor mixes persistent and non-persistent
 * parameters (persistence = numel < stage3_param_persistence_threshold,
 * decided the same way at every stage). A parameter of at most C elements
 * that does not fit the current bucket starts a new one (it is never
 * split); a larger one fills the current bucket and as many new ones as it
 * needs, split exactly at bucket boundaries: every bucket it leaves holds
 * exactly C elements (no padding), so its elements stay contiguous in every
 * buffer (param_data / param_grad are one pointer). Each bucket is padded
 * with zeros to a multiple of N and cut into N equal chunks; rank r owns
 * chunk r of every bucket. The concatenation of a rank's chunks, in bucket
 * order, is its "shard" (fp32 master, moments and reduced grads all use
 * this layout). So rank r owns the same elements at every stage. A
 * parameter's owned part is one contiguous range [owned_begin, owned_end) of
 * its flattened elements (possibly empty) unless it is split: then it is
 * one range per bucket (zero_param_info.num_owned_ranges,
 * zero_engine_get_param_owned_range), and those ranges lie one after another in
 * the shard. finalize checks the plan is identical on every rank.
 *
 * ------------------------------------------------------------------ one step
 *   for each micro-step (gradient_accumulation_steps of them):
 *     forward:  per module: gather(m) (stage 3; no-op otherwise), read
 *               param_data(p), compute, release(m)
 *     backward: per module, in any order: gather(m), param_grad(p) for each
 *               of its params, ACCUMULATE (+=) the micro-batch gradient into
 *               it (fp16: of the loss multiplied by zero_engine_get_loss_scale()),
 *               grads_ready(m), release(m)
 *   step(&result)
 *
 * Gradient scale: pass each micro-batch's gradient of its MEAN loss,
 * unscaled by the accumulation count. The engine reduces gradients in fp32
 * over the dp group on every micro-step, accumulates them into an fp32 shard
 * in the same order at every stage, and at step() multiplies by
 * 1 / (dp_size * gradient_accumulation_steps * loss_scale): the update sees
 * the mean over ranks and micro-steps - what DeepSpeed gets by scaling the
 * loss by 1/gas and averaging gradients over the dp group.
 *
 * Stages 0-3 produce bitwise-identical parameters at a given dp size.
 *
 * With local_accumulation (stages 0-1, see the config) grads_ready reduces
 * only on a module's last micro-step before step(): the trainer's += sums
 * the micro-steps in the compute-dtype gradient buffer, which is not zeroed
 * in between, and one fp32 reduction of that sum replaces
 * gradient_accumulation_steps of them (the 1/(dp * gas * loss_scale) factor
 * at step() is unchanged). Stages 0 and 1 then stay bitwise identical to each
 * other; with gradient_accumulation_steps > 1 they differ in the last bits
 * from the per-micro-step mode (and so from stages 2-3): the sum is formed
 * in another order and, for 16-bit compute, in the compute dtype.
 *
 * ------------------------------------------------------------------ rules
 * Every call returns a zero_status; on failure zero_engine_last_error(e)
 * (and zero_last_error()) holds a message naming the call, the module or
 * parameter and the rank. Calls marked COLLECTIVE must be made by every rank
 * of the dp group in the same order. After a collective fails (a timeout, a
 * dead peer) the engine only accepts destroy; every other call returns
 * ZERO_INVALID_STATE repeating the original message. (As comm.h warns, the
 * transport may still write into the buffers of an op that timed out until
 * MPI is finalized: destroy the engine and its comms soon after.)
 *
 * Buffers live in the memory of the engine's device (host memory for the CPU
 * device, GPU memory for CUDA) and the dp comm must carry that memory (MPI or
 * LOCAL for the CPU device, NCCL or STAGED for CUDA).
 *
 * Thread safety: one thread at a time per engine. */
#ifndef ZERO_ENGINE_H
#define ZERO_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <zero/comm.h>
#include <zero/device.h>
#include <zero/dtype.h>
#include <zero/export.h>
#include <zero/status.h>

ZERO_EXTERN_C_BEGIN

typedef struct zero_engine zero_engine;

/* ================================================================= config */

/* Where the fp32 master weights and optimizer moments of a rank's shard live
 * (DeepSpeed's offload_optimizer.device). */
typedef enum zero_offload_device {
    ZERO_OFFLOAD_NONE = 0, /* device memory, updated by the device's kernel */
    ZERO_OFFLOAD_CPU = 1,  /* pinned, NUMA-local host pool, updated by the CPU AdamW/SGD */
    ZERO_OFFLOAD_NVME = 2, /* files under offload_nvme_path, swapped through host buffers */
} zero_offload_device;

typedef enum zero_optimizer_kind {
    ZERO_OPTIM_ADAMW = 0, /* torch.optim.AdamW: decoupled weight decay, bias correction */
    ZERO_OPTIM_SGD = 1,   /* torch.optim.SGD: momentum, dampening, nesterov, L2 weight decay */
} zero_optimizer_kind;

/* Versioned config: initialise with ZERO_CONFIG_INIT, then set fields; new
 * fields are only ever appended. Sizes are in ELEMENTS, as in DeepSpeed.
 * Defaults are DeepSpeed's (zero_optimization, fp16) and torch's (optimizer).
 *
 * Versions (each appends fields; ZERO_CONFIG_VERSION is the newest this
 * header has). A program built against an older header keeps working with
 * a newer library: the library reads the fields of the version the program
 * passes and gives every later field its ZERO_CONFIG_INIT default
 * (docs/abi.md). `size` must cover that version's fields.
 *   1  stage .. min_loss_scale
 *   2  + offload_optimizer_device .. aio_queue_depth (optimizer offload)
 *   3  + offload_param_device .. offload_param_max_in_cpu (parameter offload)
 *   4  + local_accumulation
 * Appending a field: put it after the last one, bump ZERO_CONFIG_VERSION,
 * extend ZERO_CONFIG_INIT, add its line here and its row to the table in
 * zero/config.c (a static assertion there insists). */
typedef struct zero_config {
    size_t size;      /* sizeof(zero_config), set by ZERO_CONFIG_INIT */
    uint32_t version; /* ZERO_CONFIG_VERSION */

    /* zero_optimization */
    int stage;                                   /* 0..3; default 0 */
    uint64_t reduce_bucket_size;                 /* elements per reduce-scatter (bucket) at most; 5e8 */
    uint64_t allgather_bucket_size;              /* elements per all-gather at most; 5e8. Buckets hold
                                                    min(the two) elements, see "the plan" */
    int overlap_comm;                            /* async bucket reduce-scatter + stage-3 prefetch; 0 */
    int contiguous_gradients;                    /* no effect: gradients are always contiguous; 0 logs
                                                    a warning at create; 1 */
    uint64_t stage3_prefetch_bucket_size;        /* elements in flight by prefetch; 5e7 */
    uint64_t stage3_max_live_parameters;         /* elements gathered + in flight; 1e9 */
    uint64_t stage3_param_persistence_threshold; /* numel below which a param stays whole; 1e5 */

    /* optimizer */
    zero_optimizer_kind optimizer; /* default AdamW */
    double lr;                     /* 1e-3 */
    double beta1, beta2;           /* AdamW betas; 0.9, 0.999 */
    double eps;                    /* AdamW eps; 1e-8 */
    double weight_decay;           /* AdamW: decoupled, 0.01; SGD: L2, set it (default 0.01 too) */
    double momentum;               /* SGD; 0 */
    double dampening;              /* SGD; 0 */
    int nesterov;                  /* SGD; 0 */

    double gradient_clipping;        /* max global L2 norm; 0 = off */
    int gradient_accumulation_steps; /* micro-steps per step; 1 */

    /* mixed precision: compute dtype of params and grads (ZERO_F32, ZERO_BF16
     * or ZERO_F16); master weights, moments and reductions are always fp32. */
    zero_dtype compute_dtype;

    /* fp16 only. loss_scale > 0: static scale. 0: dynamic, starting at
     * 2^initial_scale_power; an overflow lowers the scale by 2 once
     * `hysteresis` overflows have been seen (DeepSpeed's delayed shift), never
     * below min_loss_scale; loss_scale_window good steps in a row double it. */
    double loss_scale;       /* 0 */
    int initial_scale_power; /* 16 */
    int loss_scale_window;   /* 1000 */
    int hysteresis;          /* 2 */
    double min_loss_scale;   /* 1 */

    /* ---- appended: optimizer state offload (DeepSpeed's
     * zero_optimization.offload_optimizer, zero_optimization.sub_group_size
     * and aio). See "optimizer offload" below and docs/offload.md. */
    zero_offload_device offload_optimizer_device; /* ZERO_OFFLOAD_NONE; CPU and NVME need stage 1..3 */
    char offload_nvme_path[256];      /* nvme: existing directory for the swap files ("" otherwise) */
    int offload_pin_memory;           /* accepted (DeepSpeed's default 0); the pool is pinned on CUDA anyway */
    int offload_buffer_count;         /* nvme: swap buffers in host memory (reads ahead = count - 2); 4 */
    uint64_t sub_group_size;          /* nvme: elements per stored chunk of the shard; 1e9 */
    uint64_t aio_block_size;          /* nvme: bytes per I/O segment, a multiple of 4096, at most 1 GiB; 1 MiB */
    int aio_queue_depth;              /* nvme: segments in flight, 1..128; 8 */

    /* ---- appended: parameter offload (DeepSpeed's
     * zero_optimization.offload_param), stage 3 only: where this rank's
     * compute-dtype parameter shard lives. See "parameter offload" below and
     * docs/offload.md. The aio settings above apply to its store too. */
    zero_offload_device offload_param_device; /* ZERO_OFFLOAD_NONE; CPU and NVME need stage 3 */
    char offload_param_nvme_path[256];       /* nvme: existing directory for the swap files */
    int offload_param_pin_memory;            /* accepted (DeepSpeed's default 0); the pool is pinned on CUDA anyway */
    int offload_param_buffer_count;          /* nvme: staging buffers (one for the step, the rest read ahead); 5 */
    uint64_t offload_param_buffer_size;      /* nvme: elements per staging buffer, >= the largest bucket chunk; 1e8 */
    uint64_t offload_param_max_in_cpu;       /* accepted; not used (every chunk goes to NVMe); 1e9 */

    /* ---- appended: gradient accumulation at stages 0-1 (JSON
     * zero_optimization.local_accumulation, a libzero key). 0: every
     * micro-step's gradients are reduced at grads_ready (stages 0-3 bitwise
     * identical). 1 (stages 0-1 only; 2-3 keep no full gradient to accumulate
     * in): the trainer's += accumulates the micro-steps in the compute-dtype
     * gradient buffer, and only the last grads_ready of each module before
     * step() (its gradient_accumulation_steps-th) reduces it - DeepSpeed's
     * behaviour, 1/gradient_accumulation_steps of the reduce traffic. Stages
     * 0 and 1 stay bitwise identical to each other; they equal the other
     * mode (and stages 2-3) only when gradient_accumulation_steps is 1. See
     * "one step" above. */
    int local_accumulation; /* 0 */

    /* ---- appended (version 5): AdamW's fast mode (JSON
     * optimizer.params.fast, a libzero key; CPU devices only). 0: the exact
     * kernel, torch.optim.AdamW's bits. 1: the update as
     * (-step_size * bc2) * m / (sqrt(v) + eps * bc2), one division per
     * element instead of two - within 8 ulps of the exact update, stages 0-3
     * still bitwise identical to each other and every CPU kernel variant the
     * same bits. docs/engine.md, "Optimizers". */
    int optimizer_fast; /* 0 */
} zero_config;

#define ZERO_CONFIG_VERSION 5u
#define ZERO_CONFIG_INIT                                                                          \
    {                                                                                             \
        sizeof(zero_config), ZERO_CONFIG_VERSION, 0, 500000000u, 500000000u, 0, 1, 50000000u,      \
            1000000000u, 100000u, ZERO_OPTIM_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, 0.0, 0.0, 0,     \
            0.0, 1, ZERO_F32, 0.0, 16, 1000, 2, 1.0, ZERO_OFFLOAD_NONE, "", 0, 4, 1000000000u,     \
            1048576u, 8, ZERO_OFFLOAD_NONE, "", 0, 5, 100000000u, 1000000000u, 0, 0               \
    }

/* Fill `config` (already initialised with ZERO_CONFIG_INIT, whose values stay
 * where the document is silent) from the engine sections of a DeepSpeed-style
 * JSON document: zero_optimization{...}, optimizer{type, params{...}},
 * gradient_clipping, gradient_accumulation_steps, bf16{enabled},
 * fp16{enabled, loss_scale, initial_scale_power, loss_scale_window,
 * hysteresis, min_loss_scale}, zero_optimization.offload_optimizer{device,
 * nvme_path, pin_memory, buffer_count}, zero_optimization.offload_param{device,
 * nvme_path, pin_memory, buffer_count, buffer_size, max_in_cpu},
 * zero_optimization.sub_group_size,
 * aio{block_size, queue_depth}. Other top-level keys are ignored (the caller
 * validates its own). An unknown key inside these sections, a wrong type or
 * an out-of-range value fails with ZERO_CONFIG and a message naming the key
 * path, e.g. `zero_optimization.stage: expected an integer 0..3, got "three"`
 * (read it with zero_last_error()). On failure *config is unchanged. */
ZERO_API zero_status zero_config_from_json(zero_config *config, const char *json_text);

/* ================================================================= lifetime */

/* Create an engine on the dp group `dp` and device `dev`; both are borrowed
 * and must outlive the engine. The config is copied. Not collective. On
 * failure *out is NULL and zero_last_error() says why. */
ZERO_API zero_status zero_engine_create(zero_engine **out, const zero_config *config, zero_comm *dp,
                                        zero_device *dev);

/* Frees everything the engine allocated; waits for (or abandons, after a
 * comm failure) requests in flight. NULL accepted. Not collective. A second
 * destroy of the same handle is ignored, and calls through it return
 * ZERO_INVALID_STATE (best effort, as for comms: see zero_comm_destroy). */
ZERO_API void zero_engine_destroy(zero_engine *e);

/* The message of the last failed call on this engine; "" if none; never NULL.
 * Valid until the next call on the engine. */
ZERO_API const char *zero_engine_last_error(const zero_engine *e);

/* ================================================================= registration */

/* A new module (stage-3 gather unit); *module_id = 0, 1, ... in call order.
 * `name` is copied. Before finalize only. */
ZERO_API zero_status zero_engine_add_module(zero_engine *e, const char *name, int *module_id);

#define ZERO_MAX_DIMS 8

/* A new parameter of `module`: `ndim` (1..ZERO_MAX_DIMS) dimensions of
 * shape[i] >= 1. `init` (numel fp32 values in host memory, row-major) is
 * copied now; NULL means zeros. *param_id = 0, 1, ... in call order; NULL
 * accepted. Names must be unique within the engine. Before finalize only.
 *
 * COST: the copy is held until finalize on EVERY rank, whatever the stage:
 * 4 bytes x numel of host memory per parameter (memory report category
 * "other"), so a model registered this way peaks at steady state + 4 bytes x
 * all parameters on each rank during construction. Fine for small models;
 * for large ones use zero_engine_add_param_init below, which holds nothing. */
ZERO_API zero_status zero_engine_add_param(zero_engine *e, int module, const char *name, int ndim,
                                           const int64_t *shape, const float *init, int *param_id);

/* ----------------------------------------------------- sharded construction
 * An init described instead of given: each rank computes, at finalize, only
 * the elements it keeps (its shard at stage 3, plus the persistent buckets
 * the stage keeps whole; everything at stages 0-2, where the parameters are
 * whole on every rank anyway), written straight into the engine's buffers
 * through bounded staging (no full-size temporary). Element i's value
 * depends only on (spec, parameter name, i): identical at every dp size and
 * stage.
 *
 * The exact definition, for reproducing the values elsewhere (also available
 * as zero_init_generate): for element i (row-major flat index) of the
 * parameter named `name`,
 *   s       = FNV-1a 64 of the bytes of name (no terminator; offset basis
 *             14695981039346656037, prime 1099511628211)
 *   key     = {seed mod 2^32, seed >> 32}
 *   j       = floor(i / 4); counter = {j mod 2^32, j >> 32, s mod 2^32, s >> 32}
 *   x[0..3] = Philox4x32-10(counter, key) (Salmon et al., SC 2011; the
 *             Random123 known answers hold)
 *   u[k]    = (x[k] + 0.5) / 2^32, a double in (0, 1)
 *   UNIFORM  value = lo + (hi - lo) * u[i mod 4]
 *   NORMAL   Box-Muller on the pair q = (i mod 4) / 2:
 *            r = sqrt(-2 ln u[2q]), t = 2 pi u[2q+1] (2 pi = 6.283185307179586),
 *            z = r cos t for even i, r sin t for odd i; value = mean + std * z
 *   CONSTANT value; ONES 1; ZEROS 0
 * computed in IEEE double (C11, no contraction into fused multiply-adds) and
 * rounded once to fp32. sqrt is exact; log, cos and sin come from the C
 * library: a libm whose double result differs by an ulp gives the same fp32
 * value except in the rare case (about 1 in 2^28) where the double lies
 * within that ulp of an fp32 rounding boundary. */
typedef enum zero_init_kind {
    ZERO_INIT_ZEROS = 0,
    ZERO_INIT_ONES = 1,
    ZERO_INIT_CONSTANT = 2, /* `value` */
    ZERO_INIT_NORMAL = 3,   /* `mean`, `std` (>= 0), `seed` */
    ZERO_INIT_UNIFORM = 4,  /* `lo` <= `hi`, `seed`; values in [lo, hi] after rounding */
    ZERO_INIT_CALLBACK = 5, /* `fill`, `user` */
} zero_init_kind;

/* Write elements [begin, end) of the flattened parameter (`param`: its id,
 * `name`: its registered name) to out[0 .. end - begin), fp32, host memory.
 * Return ZERO_OK, or a status that finalize then fails with (naming the
 * parameter and the range). It must be a pure function of (param, index):
 * the engine calls it with ranges this rank keeps, in any order, each
 * element once, plus - when the dp size is > 1 - single-element "probe"
 * ranges [k, k+1) at the check's sample indices (see finalize) on every rank,
 * owned or not. It runs on the thread that called finalize. */
typedef zero_status (*zero_init_fill_fn)(void *user, int param, const char *name, uint64_t begin, uint64_t end,
                                         float *out);

/* Versioned like zero_config: initialise with ZERO_INIT_SPEC_INIT (zeros),
 * then set the fields of the kind; new fields are only ever appended, each
 * batch a new version (an older version's missing fields take defaults).
 *   1  kind .. user */
typedef struct zero_init_spec {
    size_t size;         /* sizeof(zero_init_spec), set by ZERO_INIT_SPEC_INIT */
    uint32_t version;    /* ZERO_INIT_SPEC_VERSION */
    zero_init_kind kind;
    double value;        /* CONSTANT */
    double mean, std;    /* NORMAL; 0, 1 */
    double lo, hi;       /* UNIFORM; 0, 1 */
    uint64_t seed;       /* NORMAL, UNIFORM: the Philox key; CALLBACK: a tag the cross-rank check
                            compares (e.g. the seed the callback uses) */
    zero_init_fill_fn fill; /* CALLBACK: must stay valid until finalize returns */
    void *user;             /* CALLBACK: passed to fill as is */
} zero_init_spec;

#define ZERO_INIT_SPEC_VERSION 1u
#define ZERO_INIT_SPEC_INIT                                                                       \
    {                                                                                             \
        sizeof(zero_init_spec), ZERO_INIT_SPEC_VERSION, ZERO_INIT_ZEROS, 0.0, 0.0, 1.0, 0.0, 1.0, \
            0u, NULL, NULL                                                                        \
    }

/* Like zero_engine_add_param, with the init described by `init` (copied;
 * NULL = zeros) instead of given. Holds no values before finalize; finalize
 * computes this rank's elements. Invalid specs (unknown kind, non-finite or
 * negative std, lo > hi, CALLBACK without fill, size too small) fail with
 * ZERO_INVALID_ARGUMENT naming the field. Before finalize only. */
ZERO_API zero_status zero_engine_add_param_init(zero_engine *e, int module, const char *name, int ndim,
                                                const int64_t *shape, const zero_init_spec *init,
                                                int *param_id);

/* Elements [begin, end) of the values `spec` gives the parameter named
 * `name` (the definition above) into out[0 .. end - begin). Not for
 * CALLBACK (ZERO_INVALID_ARGUMENT). Thread-safe; no engine needed: lets a
 * trainer compute a slice of a larger tensor (a tensor-parallel shard) or a
 * reference framework reproduce the engine's init. */
ZERO_API zero_status zero_init_generate(const zero_init_spec *spec, const char *name, uint64_t begin,
                                        uint64_t end, float *out);

/* ----------------------------------------------------- contiguous layout
 * The FLAT LAYOUT (see "the plan"): every bucket, padded with zeros to a
 * multiple of the dp size N, one after another; parameters in registration
 * order, each one's elements contiguous (a split one too) at its flat
 * offset (zero_engine_get_param_flat_offset). Zero padding lies only at the end
 * of a bucket, and a new bucket starts at a module change, at a change of
 * stage-3 persistence, or when the next parameter does not fit. At N = 1
 * there is no padding: the parameters are one dense block in registration
 * order.
 *
 * Stages 0-1 keep the parameters AND the gradients whole in this layout,
 * stage 2 the parameters only; zero_engine_flat_params / flat_grads return
 * those buffers, so a trainer may keep pointer-arithmetic addressing
 * (llm.c's one block of parameters and one of gradients). The views hold
 * the compute dtype, are owned by the engine and valid until destroy; the
 * same rules as param_data / param_grad apply (parameters read only;
 * gradients accumulated with +=, zeroed by grads_ready / step). Stage 3
 * keeps a shard only: ZERO_UNSUPPORTED, naming the stage.
 *
 * A STACKED (L, ...) tensor - layer l's slice used by layer l's module -
 * registered whole would make its gradient complete only after the last
 * layer's backward, defeating stages 2-3. zero_engine_add_param_stacked
 * registers its L slices as L parameters "name[l]" (consecutive ids), slice
 * l in modules[l], so every stage gathers and reduces it per layer. When a
 * trainer registers its stacked tensors one after another over the same L
 * modules (as llm.c's tensor-major layout does), each slice starts a
 * bucket, so the slices of one tensor lie at the uniform stride
 * roundup(slice numel, N) in the flat layout: slice l of tensor T is at
 * flat_offset(T[0]) + l * stride, and at N = 1 the stacked tensor is dense,
 * exactly llm.c's addressing. (Compute the offsets from the engine rather
 * than assume them; tests/engine/test_engine_stacked.c does so, and trains
 * bitwise as the per-layer registration at stages 0-3.) */

/* L = shape[0] slices of shape[1 .. ndim-1] (ndim - 1 = 1..ZERO_MAX_DIMS
 * dimensions), slice l in module modules[l] (L entries), named "name[l]";
 * `init` (L x slice numel fp32 values in host memory, row-major) is copied
 * as add_param copies it, NULL = zeros. *first_param_id = the id of slice 0
 * (NULL accepted). Before finalize. The slices before a failing one (an
 * already used name) stay registered. */
ZERO_API zero_status zero_engine_add_param_stacked(zero_engine *e, const int *modules, const char *name, int ndim,
                                                   const int64_t *shape, const float *init, int *first_param_id);

/* The whole flat parameter buffer (stages 0-2) / gradient buffer (stages
 * 0-1), compute dtype, *numel = plan.padded_numel elements (NULL
 * accepted). After finalize; not collective. */
ZERO_API zero_status zero_engine_flat_params(zero_engine *e, void **data, uint64_t *numel);
ZERO_API zero_status zero_engine_flat_grads(zero_engine *e, void **grad, uint64_t *numel);
/* Where element 0 of `param` lies in the flat layout (every stage; the
 * views above exist at stages 0-2 / 0-1). After finalize. */
ZERO_API zero_status zero_engine_get_param_flat_offset(const zero_engine *e, int param, uint64_t *offset);

/* COLLECTIVE. Compute the plan, check it is the same on every rank (a
 * different registration fails with ZERO_MISMATCH naming the first differing
 * parameter and its index), check every rank was given the same init (below),
 * allocate every buffer, load the initial values (rank 0's are NOT
 * broadcast: each rank computes or copies its own), zero the gradients.
 * Needs at least one parameter.
 *
 * The init check (dp size > 1; one all-reduce of 2 x num_params integers):
 * each parameter's init is hashed - for a spec its kind, its numbers and the
 * seed; for values given to add_param and for CALLBACK (with its seed tag)
 * the values at the sample indices floor(k * (numel - 1) / 4), k = 0..4,
 * which a CALLBACK is asked for as probes - and ranks whose hashes differ
 * fail with ZERO_MISMATCH naming the first such parameter and the ranks that
 * differ from rank 0 (one more all-reduce of dp-size integers). Two ranks
 * giving the same values one as values and one as a spec also count as
 * different. */
ZERO_API zero_status zero_engine_finalize(zero_engine *e);

/* ================================================================= training */

/* COLLECTIVE at stage 3 (an all-gather of the module's non-persistent
 * parameters, or a wait on a prefetch already in flight); at stages 0-2 it
 * only validates its argument. Gathers nest: each gather needs a release.
 * From its return until the matching release, param_data() of the module's
 * parameters is valid. With overlap_comm at stage 3, the prefetcher replays
 * the gather order recorded in the first step and issues the next modules'
 * all-gathers ahead of time (at most stage3_prefetch_bucket_size elements in
 * flight, stage3_max_live_parameters elements gathered plus in flight); when
 * the order changes it logs a warning and records again. */
ZERO_API zero_status zero_engine_gather(zero_engine *e, int module);

/* Stage 3: when the last gather is released, frees the module's full
 * parameters (persistent ones stay). Stages 0-2: validates only. Not collective. */
ZERO_API zero_status zero_engine_release(zero_engine *e, int module);

/* ----------------------------------------------------- untraced forwards
 * Forwards that are not part of training - evaluation, generation - must
 * not disturb the stage-3 machinery that replays the training order. With
 * untraced on, gather/release still work at every stage (stage 3: a
 * COLLECTIVE synchronous all-gather of the module, or the trace's buffer if
 * the training step holds the module gathered right now), and param_data
 * is valid between them as usual; but nothing is recorded, the order is not
 * checked (no "order changed" warning), the prefetcher issues nothing, and
 * zero_engine_stats does not change. A prefetch in flight for a module
 * stays in flight for the training gather it was issued for, so an untraced
 * pass may run between steps or in the middle of one (after a traced
 * gather, before its release) and training goes on exactly as without it:
 * bitwise the same parameters, the same stats.
 *
 * Pattern (llm.c's val loss and sampling): between two step() calls,
 *   zero_engine_set_untraced(e, 1);
 *   for each module m: gather(m), forward, release(m)   (any order, nested ok)
 *   zero_engine_set_untraced(e, 0);
 * At stage 3 EVERY RANK of the dp group must run the same untraced gathers
 * in the same order (each is an all-gather): generate on every rank, with
 * the same prompt and sampling seed, even if only rank 0 prints. No
 * backward in the mode: step() refuses while it is on. Not collective
 * itself; after finalize. Turning it off while a module is still gathered
 * untraced fails with ZERO_INVALID_STATE naming the module.
 *
 * What a trainer misses without a log handler (zero_set_log_handler): the
 * engine never prints, so the "stage-3 gather order changed" warnings (the
 * prefetcher stopped for that step and records again: slower, never wrong),
 * DeepSpeed keys accepted without effect, and a NUMA binding that failed
 * are silent; zero_engine_stats.order_changes still counts the first. */
ZERO_API zero_status zero_engine_set_untraced(zero_engine *e, int untraced);
/* 1 while untraced mode is on; 0 otherwise or for NULL. */
ZERO_API int zero_engine_get_untraced(const zero_engine *e);

/* Device pointer to the full parameter `param` in the compute dtype (numel
 * elements, row-major). The engine owns it. Valid until destroy at stages
 * 0-2 and for persistent parameters at stage 3; for other stage-3
 * parameters from gather(module) to the matching release. Read only: the
 * values change only in step() and params_changed(). */
ZERO_API zero_status zero_engine_param_data(zero_engine *e, int param, void **out);

/* Device pointer to the gradient buffer of `param` in the compute dtype
 * (numel elements). The trainer ACCUMULATES (+=) this micro-step's gradient
 * into it during backward. It is all zeros whenever a module's micro-step
 * begins: after finalize, after grads_ready(module) (which reduces it and
 * zeroes it again), after step() and zero_grad() - except with
 * local_accumulation, where it keeps the micro-steps' sum until the
 * grads_ready that reduces it (the module's last before step()). Stages 0-1: one persistent
 * buffer per parameter, valid until destroy. Stages 2-3: the module's
 * gradient buffer is taken from the engine's cache of module buffers (or
 * allocated) and zeroed by the first param_grad() call of any of its
 * parameters, and returned to the cache by grads_ready(module): call
 * param_grad() again on every micro-step; the pointer is valid until that
 * grads_ready. The zeroing is ordered before the compute stream's later
 * work; code that writes the buffer from the host thread instead (on an
 * asynchronous device) synchronizes that stream first. */
ZERO_API zero_status zero_engine_param_grad(zero_engine *e, int param, void **out);

/* Tied weights (a tensor read by two modules, as GPT's wte by the embedding
 * and the LM head): register it once, in the module that uses it first in
 * the forward, and accumulate every use's gradient into its param_grad; at
 * stages 2-3 that buffer lives only until the module's grads_ready, so call
 * grads_ready for that module after the LAST use's backward (the embedding's,
 * at the very end of backward), gathering it again for the other use at
 * stage 3. no_sync: local_accumulation (the config) is the stages 0-1
 * form; stages 2-3 always reduce per micro-step. docs/engine.md has both
 * patterns. */

/* COLLECTIVE. The module's gradients for this micro-step are complete:
 * reduce-scatter them (fp32, bucket by bucket; asynchronously with
 * overlap_comm, waited before the next use of the buffers) into this rank's
 * fp32 gradient shard, then zero (stages 0-1) or free (stages 2-3) the
 * module's gradient buffer. Call once per module per micro-step, on every
 * module that has parameters, in the same order on every rank. With
 * local_accumulation only the module's gradient_accumulation_steps-th call
 * since the last step reduces (and zeroes); the earlier ones only count and
 * communicate nothing. */
ZERO_API zero_status zero_engine_grads_ready(zero_engine *e, int module);

typedef struct zero_step_result {
    double grad_norm;       /* global L2 norm of the averaged, unscaled gradient, before
                               clipping; inf or nan when it overflowed */
    double clip_coef;       /* factor applied to the gradient (1 = not clipped) */
    double loss_scale;      /* the scale the gradients of this step carried */
    double next_loss_scale; /* the scale for the next step's loss */
    int skipped;            /* 1: fp16 overflow on some rank; nothing was updated */
    int64_t step;           /* optimizer updates applied so far, this one included */
} zero_step_result;

/* COLLECTIVE. Requires gradient_accumulation_steps micro-steps of
 * grads_ready on every module with parameters, and no stage-3 module
 * gathered. Waits for reductions in flight, unscales and averages, computes
 * the global gradient norm (one scalar all-reduce, which also carries the
 * fp16 overflow flag of every rank; plus one scalar all-gather over the
 * model-parallel group when one is set, see below), clips, runs AdamW or SGD on the own
 * shard, casts to the compute dtype and (stages 0-2) all-gathers the updated
 * parameters; then zeroes the gradient shard. A skipped fp16 step changes no
 * parameter and no moment and lowers the loss scale. `out` may be NULL.
 * A comm failure is reported as "engine step: <the comm's message>". */
ZERO_API zero_status zero_engine_step(zero_engine *e, zero_step_result *out);

/* ----------------------------------------------------------------- streams
 * Work on a device is stream-ordered (see device.h). The trainer computes on
 * its COMPUTE stream (set below; default: the device's default stream, NULL);
 * the engine runs every device op of its own (casts, accumulation, zeroing,
 * the optimizer kernels) on the ENGINE stream it creates, and the two hand
 * over by events only, like nccl.h's collectives on a stream:
 *
 *   gather(m)       returns with the module's parameters all-gathered; work
 *                   the trainer queues on the compute stream afterwards sees
 *                   them (the compute stream waits for an event of the
 *                   engine's). param_data() pointers are read on the compute
 *                   stream.
 *   release(m)      the engine reuses the buffer only after the compute work
 *                   queued before the release (it waits for an event recorded
 *                   on the compute stream).
 *   param_grad(p)   a fresh gradient buffer is zeroed on the engine stream;
 *                   the compute stream waits for it.
 *   grads_ready(m)  reads the gradients after all work queued on the compute
 *                   stream so far (an event recorded there), and the compute
 *                   stream waits for the re-zeroed buffers before its next
 *                   accumulation. So gradients computed on the compute stream
 *                   need no host synchronisation; gradients computed on ANY
 *                   OTHER stream must be made visible to the compute stream
 *                   (zero_stream_wait_event) before grads_ready, or they are
 *                   read stale.
 *   step()          waits for the compute stream, and the compute stream
 *                   waits for the updated parameters and zeroed gradients.
 *   zero_grad()     the compute stream waits for the zeroing.
 *
 * The host blocks only where it needs bytes: before a collective on buffers
 * the engine stream wrote (the MPI, LOCAL and STAGED backends and NCCL's
 * completion are driven from the host), for the global norm / overflow flag
 * in step(), and in copies to and from caller memory (state_get/set,
 * read_param, params_changed). Those waits poll an event against the dp
 * comm's timeout: device work that does not finish is ZERO_TIMEOUT naming the
 * call ("engine grads_ready of module 'embed': the engine's stream on rank 0
 * did not finish its queued work within 30 s ..."), and the engine is then
 * unusable like after a comm failure. Host code that touches device memory
 * (a CPU trainer writing param_grad through a pointer) must first wait for
 * the compute stream (zero_stream_sync, or zero_memcpy on the default one). */

/* Use `stream` (NULL: the device's default stream) as the compute stream from
 * now on; it must belong to the engine's device and outlive its use. Waits
 * for the engine's queued work first. Not collective; any time after create,
 * typically once after finalize. */
ZERO_API zero_status zero_engine_set_compute_stream(zero_engine *e, zero_stream *stream);
/* The engine's own stream (owned by the engine; NULL for NULL), e.g. to
 * profile it. Do not queue work on it. */
ZERO_API zero_stream *zero_engine_stream(const zero_engine *e);

/* ----------------------------------------------------- model parallelism
 * With tensor or pipeline parallelism each dp group holds only part of the
 * model, so the global gradient norm (clipping) and the fp16 overflow
 * decision must also span the model-parallel (mp) group: the ranks that
 * share this rank's dp rank (tp x pp ranks; e.g. zero_comm_split(world,
 * dp_rank, world_rank)). Tensors held whole by several mp ranks (tp-
 * replicated LayerNorms and biases, the last pipeline stage's tied copy of
 * wte) must count once: mark every copy but one as a duplicate.
 *
 * step() then computes this rank's sum of squares over its shard (minus the
 * owned parts of duplicate parameters; their non-finite values still count
 * as an overflow), all-reduces it over dp as before, all-gathers the dp sums
 * over mp (one more scalar collective) and adds them in mp rank order, so
 * every rank of the world gets the bitwise-same norm, clip factor and skip
 * decision: an fp16 overflow on any tp/pp rank skips the step everywhere.
 * The gradient average stays over dp only. */

/* Borrow `mp` (NULL: none, the default) for the norm; it must outlive the
 * engine and carry the engine's memory like the dp comm. Every rank of the
 * world must call step() the same number of times. Not collective; before
 * or after finalize, before the first step that should use it. */
ZERO_API zero_status zero_engine_set_model_parallel(zero_engine *e, zero_comm *mp);

/* duplicate = 1: this rank's copy of `param` duplicates one that another mp
 * rank counts; leave it out of the norm. Default 0. Not collective; set the
 * same on every rank of the dp group (they hold the same tensors). */
ZERO_API zero_status zero_engine_set_param_duplicate(zero_engine *e, int param, int duplicate);

/* Discard accumulated gradients: zero the fp32 shard and every gradient
 * buffer; the micro-step count restarts. Not collective. */
ZERO_API zero_status zero_engine_zero_grad(zero_engine *e);

/* Learning rate for the next steps (schedulers call it before step). */
ZERO_API zero_status zero_engine_set_lr(zero_engine *e, double lr);
ZERO_API double zero_engine_get_lr(const zero_engine *e);

/* ----------------------------------------------------- parameter groups
 * torch.optim's param_groups: every parameter belongs to one group, and
 * each group has its own lr scale, weight decay, (AdamW) betas and eps, and
 * (SGD) momentum, dampening and nesterov.
 * Group 0, "default", always exists and holds every parameter not assigned
 * elsewhere; its hyperparameters start as the config's (lr, weight_decay,
 * beta1, beta2, eps, momentum, dampening, nesterov), so an engine without
 * groups behaves as before.
 * The lr of group g at a step is zero_engine_get_lr() * lr_scale(g): one
 * scheduler (set_lr) drives every group, keeping their ratios, as torch
 * users do with LambdaLR over several groups.
 *
 * Every hyperparameter can change between steps (set_group_hparams), with
 * torch's semantics: the new values apply from the next step() on; Adam's
 * bias correction keeps counting updates from the first (changing beta1
 * does not restart it), like torch.optim.AdamW.
 *
 * THE DEFAULTS ARE NOT NEUTRAL: a trainer that sets nothing trains with
 * lr 1e-3 and weight_decay 0.01 (torch.optim.AdamW's defaults) on every
 * parameter, biases and norms included. Set the config (or the JSON
 * optimizer section), and put the tensors that must not decay (biases,
 * LayerNorm gains, embeddings in the GPT recipe) in a group with
 * weight_decay 0.
 *
 * SGD: lr_scale, weight_decay (L2), momentum, dampening and nesterov apply
 * per group, as torch.optim.SGD's param_groups: a group's momentum buffer
 * starts as the gradient at the group's first step with momentum > 0 (a
 * group that turns momentum on later starts then, like torch's buffer that
 * is None until then); a group with momentum 0 leaves its buffer alone. The
 * buffers exist only when the config's momentum is > 0 (they are allocated at
 * finalize for every parameter): a group's momentum > 0 on an engine whose
 * config has momentum 0 is refused by name. Settings on every rank of the dp
 * group must be the same (they are not exchanged). */
/* Versioned like zero_config (docs/abi.md): size and version set by
 * ZERO_GROUP_HPARAMS_INIT; fields only appended. Versions: 1 = lr_scale ..
 * eps; 2 = momentum .. nesterov. */
typedef struct zero_group_hparams {
    size_t size;         /* sizeof(zero_group_hparams), set by ZERO_GROUP_HPARAMS_INIT */
    uint32_t version;    /* ZERO_GROUP_HPARAMS_VERSION */
    double lr_scale;     /* group lr = zero_engine_get_lr() * lr_scale; finite, >= 0. INIT: 1 */
    /* For the fields below, a negative value means "keep": add_group takes
     * the config's value, set_group_hparams leaves the current one. INIT: -1 */
    double weight_decay; /* AdamW: decoupled (p *= 1 - lr * wd); SGD: L2 */
    double beta1, beta2; /* AdamW, each < 1 */
    double eps;          /* AdamW */
    /* version 2 */
    double momentum;     /* SGD; > 0 needs the config's momentum > 0 (the buffers) */
    double dampening;    /* SGD; <= 1 */
    int nesterov;        /* SGD; 0 or 1 (1 needs momentum > 0 and dampening 0) */
} zero_group_hparams;

#define ZERO_GROUP_HPARAMS_VERSION 2u
#define ZERO_GROUP_HPARAMS_INIT                                                                           \
    {                                                                                                     \
        sizeof(zero_group_hparams), ZERO_GROUP_HPARAMS_VERSION, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1 \
    }

/* A new group named `name` (copied; unique) with `hparams` (NULL: the
 * config's, lr_scale 1); *group_id = 1, 2, ... in call order (NULL
 * accepted). Before or after finalize (it holds no parameter until
 * set_param_group); do the same on every rank. An out-of-range value fails
 * with ZERO_INVALID_ARGUMENT naming the field. */
ZERO_API zero_status zero_engine_add_group(zero_engine *e, const char *name, const zero_group_hparams *hparams,
                                           int *group_id);

/* Put `param` in `group` (default 0). Before finalize, where the group is
 * part of the registration that finalize checks across ranks, or between
 * steps after it (not checked: do the same on every rank; Adam's moments
 * stay with the parameter, as when a torch param moves between groups). */
ZERO_API zero_status zero_engine_set_param_group(zero_engine *e, int param, int group);

/* Change group `group`'s hyperparameters from the next step() on (negative
 * fields: unchanged; a caller of an older version leaves the fields it does
 * not have unchanged). Any time between steps,
 * not collective: call it with the same values on every rank. Setting group
 * 0's weight_decay / betas / eps is how a trainer changes the config's. */
ZERO_API zero_status zero_engine_set_group_hparams(zero_engine *e, int group, const zero_group_hparams *hparams);

/* Group `group`'s current hyperparameters into *out, initialised with
 * ZERO_GROUP_HPARAMS_INIT: the fields of its version are written. */
ZERO_API zero_status zero_engine_get_group_hparams(const zero_engine *e, int group, zero_group_hparams *out);

/* Groups so far (>= 1: "default" always exists). */
ZERO_API int zero_engine_get_num_groups(const zero_engine *e);
/* Owned by the engine, valid until destroy; NULL for an unknown group. */
ZERO_API const char *zero_engine_get_group_name(const zero_engine *e, int group);
/* The group of `param` into *group. */
ZERO_API zero_status zero_engine_get_param_group(const zero_engine *e, int param, int *group);

/* The factor to multiply the loss by before backward (fp16 dynamic or static
 * loss scaling); 1.0 for f32 and bf16. */
ZERO_API double zero_engine_get_loss_scale(const zero_engine *e);

/* ================================================================= memory */

typedef enum zero_mem_category {
    ZERO_MEM_PARAMS = 0,  /* compute-dtype params: full (0-2), shard + persistent + gathered (3) */
    ZERO_MEM_GRADS = 1,   /* compute-dtype grads (full at 0-1; per-module while live at 2-3)
                             and the fp32 reduced-gradient shard */
    ZERO_MEM_MASTER = 2,  /* fp32 master weights (16-bit compute only) */
    ZERO_MEM_MOMENTS = 3, /* fp32 optimizer moments */
    ZERO_MEM_BUFFERS = 4, /* communication staging buffers (+ CUDA: the fused optimizer step's
                             tables, 40 bytes a row of at most 16384 elements and 60 a group) */
    ZERO_MEM_OTHER = 5,   /* add_param init values until finalize (+ CUDA: a 1 MiB host chunk during it) */
    ZERO_MEM_CACHE = 6,   /* released module-sized buffers (stage-3 gathers, stage-2/3 module grads)
                             kept for reuse (zero_engine_empty_cache frees them) */
    ZERO_MEM_CATEGORY_COUNT = 7,
} zero_mem_category;

/* Bytes per category. For the engine: what it holds now (`bytes`) and the
 * most it held (`peak`), counted by its one accounting allocator (host
 * bookkeeping of a few hundred bytes per parameter is not counted).
 *
 * The ZeRO formula (zero_memory_estimate), with P = padded element count
 * (plan.padded_numel), N = dp size, d = compute dtype size, K = 12 (AdamW,
 * 16-bit: master + 2 moments), 8 (AdamW, fp32: params are their own master),
 * 8 (SGD-momentum, 16-bit), 4 (SGD-momentum, fp32), 4 / 0 (SGD without
 * momentum, 16-bit / fp32):
 *   params  P*d       (stage 3: P*d/N)
 *   grads   P*d       (stages 2-3: P*d/N)
 *   master + moments K*P (stages 1-3: K*P/N), split into their categories.
 * The engine holds exactly that plus these declared buffers, in steady state
 * (after finalize or step, nothing gathered, no micro-step in progress):
 *   grads:   + P*4/N, the fp32 reduced-gradient shard, at stages 0-1
 *            + P*(4-d)/N at stages 2-3 (the shard is fp32, the formula counts d)
 *   params:  + stage 3: each persistent bucket in full (padded numel * d)
 *   buffers: slots * (B*4 + B*4/N), B = plan.max_bucket_numel, slots = 2
 *            with overlap_comm else 1 (fp32 bucket staging + fp32 chunk receive);
 *            B <= plan.bucket_capacity (see "the plan"), and B equals it as
 *            soon as a parameter is split, whatever its size
 * While a micro-step is in progress, stages 2-3 add the module gradient
 * buffers in use (grads) and stage 3 the gathered / prefetched modules
 * (params), each the module's padded bucket numel * d.
 *
 * cache: released module buffers wait there for a request of the same size,
 * in this step or a later one (no fresh mapping and page faults per gather,
 * no cudaFree per step). Bound: cache + the module buffers in use never
 * exceed the most module buffers in use at once in the current or the
 * previous step, so the cache never raises the engine's peak; after each
 * step() it is trimmed to that step's most. In steady state the engine thus
 * holds the formula + the declared buffers + cache;
 * zero_engine_empty_cache() brings it to the formula + the declared buffers
 * exactly (torch.cuda.empty_cache()'s role). */
/* The category's lower-case name ("params", ..., "cache"), as the memory
 * benchmark's and zero-train's JSON use it; "unknown" for any other value.
 * Static storage. */
ZERO_API const char *zero_mem_category_name(zero_mem_category category);

/* Room for categories added later without changing the report's size (ABI). */
#define ZERO_MEM_CATEGORY_CAPACITY 16

typedef struct zero_memory_report {
    uint64_t bytes[ZERO_MEM_CATEGORY_CAPACITY]; /* [ZERO_MEM_CATEGORY_COUNT..] are 0 */
    uint64_t peak[ZERO_MEM_CATEGORY_CAPACITY];
    uint64_t total;      /* sum of bytes[] */
    uint64_t peak_total; /* the most the engine held at once */
} zero_memory_report;

ZERO_API zero_status zero_engine_get_memory_report(const zero_engine *e, zero_memory_report *out);

/* Free the cache of released module buffers (ZERO_MEM_CACHE reads 0 after
 * it); buffers in use are untouched. Not collective; after finalize, at any
 * point between engine calls (mid-step too: later requests allocate anew).
 * Waits for the engine's queued work. Use it before memory-hungry work
 * outside training (evaluation with other buffers, a checkpoint
 * consolidation); the next step refills the cache. */
ZERO_API zero_status zero_engine_empty_cache(zero_engine *e);

/* The ZeRO formula above for `numel` elements (pass the padded count to
 * compare with an engine), `dp` ranks, `stage`, compute dtype f32/bf16/f16
 * and optimizer (`sgd_momentum` only matters for SGD: nonzero = a momentum
 * buffer). Fills bytes[] (params, grads, master, moments; the rest 0) and
 * total; peak = bytes. Reproduces the paper's example: 7.5e9, N=64, f16,
 * AdamW -> 120e9, 31.4e9, 16.6e9, 1.9e9 bytes for stages 0-3. */
ZERO_API zero_status zero_memory_estimate(uint64_t numel, int dp, int stage, zero_dtype dtype,
                                          zero_optimizer_kind optimizer, int sgd_momentum,
                                          zero_memory_report *out);

/* ----------------------------------------------------- optimizer offload
 * With offload_optimizer_device != NONE the fp32 master weights and moments
 * of the shard leave the memory report's MASTER and MOMENTS categories
 * (those read 0: they are not in device memory) and are counted here:
 *
 *   CPU:  host_bytes = the pool: each state array of shard_numel floats
 *         rounded up to 4096 (master only for 16-bit compute on the CPU
 *         device, where fp32 params are their own master; on CUDA always a
 *         host master) [+ CUDA: one staging chunk for the gradient].
 *   NVME: the shard is cut into chunks of sub_group_size elements (the last
 *         shorter); chunk i of len_i elements is one stored tensor
 *         [master | moment1 | moment2] (the states the optimizer has; the
 *         master always, fp32 compute included), so
 *           nvme_bytes = sum_i roundup(states * len_i * 4, 4096)
 *         and the host buffers are
 *           host_bytes = (offload_buffer_count + 1) * roundup(states * chunk_numel * 4, 4096)
 *         (the swapper's buffer_count buffers and one for checkpoint access
 *         and initialisation) [+ CUDA: one gradient staging chunk].
 * Stage 1..3 only (stage 0 keeps the state whole on every rank). Results
 * are bitwise those of the non-offloaded engine: same kernel, same order. */
typedef struct zero_offload_report {
    zero_offload_device device;
    uint64_t host_bytes;     /* host pool bytes in use now */
    uint64_t host_peak;      /* most host pool bytes in use at once */
    uint64_t host_capacity;  /* the pool's reservation */
    uint64_t nvme_bytes;     /* bytes the stored chunks occupy (padded) */
    uint64_t nvme_written;   /* bytes written / read by the store since finalize */
    uint64_t nvme_read;
    uint64_t chunk_numel;    /* elements per chunk (nvme; the shard for cpu) */
    uint64_t num_chunks;
    int states;              /* fp32 arrays per element kept offloaded (master + moments) */
    int buffer_count;        /* nvme: swap buffers */
} zero_offload_report;

/* After finalize. device NONE: everything 0. */
ZERO_API zero_status zero_engine_get_offload_report(const zero_engine *e, zero_offload_report *out);

/* ----------------------------------------------------- parameter offload
 * With offload_param_device != NONE (stage 3 only) this rank's compute-dtype
 * parameter shard (S = plan.shard_numel elements of d bytes; bucket b's chunk
 * is chunk_b = padded bucket numel / N elements of it) leaves the memory
 * report's PARAMS category, which then holds the persistent buckets and the
 * gathered modules only, and is counted here:
 *
 *   CPU:  host_bytes = roundup(S * d, 4096): the shard in the pool. On the
 *         CPU device this moves the accounting only (host memory either
 *         way); on CUDA the gathers and the step copy chunks between the pool
 *         and the device.
 *   NVME: chunk_b of every bucket is one stored tensor, so
 *           nvme_bytes = sum_b roundup(chunk_b * d, 4096)
 *         and the host staging is offload_param_buffer_count buffers of the
 *         largest chunk C = max_b chunk_b (chunk_numel below):
 *           host_bytes = offload_param_buffer_count * roundup(C * d, 4096)
 *         (one holds the chunk the step or a checkpoint accessor works on,
 *         buffers 0 and 1 taking turns so that the step's write of one
 *         chunk overlaps the update of the next; the others hold reads
 *         ahead along the recorded gather order). buffer_count >= 2.
 *         C > offload_param_buffer_size fails finalize with ZERO_CONFIG
 *         naming offload_param.buffer_size (DeepSpeed likewise needs
 *         buffer_size >= the largest parameter).
 *   CUDA (both): + C * d bytes of device memory under ZERO_MEM_BUFFERS for
 *         the chunk the step updates.
 * host_capacity = host_bytes. The swap files are created 0600 under
 * offload_param_nvme_path and removed by zero_engine_destroy. Results are
 * bitwise those of the engine without parameter offload. */
typedef struct zero_param_offload_report {
    zero_offload_device device;
    uint64_t host_bytes;    /* host pool bytes in use now */
    uint64_t host_peak;     /* most host pool bytes in use at once */
    uint64_t host_capacity; /* the pool's reservation */
    uint64_t nvme_bytes;    /* bytes the stored chunks occupy (padded) */
    uint64_t nvme_written;  /* bytes written / read by the store since finalize */
    uint64_t nvme_read;
    uint64_t num_chunks;    /* nvme: stored tensors (one per bucket) */
    uint64_t chunk_numel;   /* C: the largest bucket chunk, elements */
    int buffer_count;       /* nvme: host staging buffers */
    uint64_t reads_ahead;   /* nvme: gathered chunks that had been read ahead */
    uint64_t reads_sync;    /* nvme: gathered chunks read on demand */
} zero_param_offload_report;

/* After finalize. device NONE: everything 0. */
ZERO_API zero_status zero_engine_get_param_offload_report(const zero_engine *e, zero_param_offload_report *out);

/* ================================================================= introspection */

typedef struct zero_plan_info {
    uint64_t numel;            /* sum of parameter sizes */
    uint64_t padded_numel;     /* sum of padded bucket sizes (P above) */
    uint64_t shard_numel;      /* padded_numel / dp_size: this rank's fp32 shard */
    uint64_t max_bucket_numel; /* the largest padded bucket */
    uint64_t hash;             /* hash of the plan: params, shapes, dp size, bucket sizes */
    int num_params, num_modules, num_buckets;
    int dp_size, dp_rank, stage;
    zero_dtype compute_dtype;
    /* ---- appended */
    uint64_t bucket_capacity;  /* elements a bucket holds at most: min(reduce_bucket_size,
                                  allgather_bucket_size) rounded down to a multiple of dp_size
                                  (at least dp_size); max_bucket_numel <= bucket_capacity */
    uint64_t persistent_numel; /* stage 3: padded elements of the persistent buckets (kept whole) */
} zero_plan_info;

/* After finalize. */
ZERO_API zero_status zero_engine_get_plan_info(const zero_engine *e, zero_plan_info *out);

typedef struct zero_param_info {
    const char *name; /* owned by the engine, valid until destroy */
    int module;
    int ndim;
    int64_t shape[ZERO_MAX_DIMS];
    uint64_t numel;
    zero_dtype dtype;     /* the compute dtype */
    int bucket;           /* the (first) bucket holding it; = first_bucket */
    int persistent;       /* stays whole at stage 3 */
    /* This rank's part, the same at every stage. Unless the parameter is
     * split (num_owned_ranges > 1) it is the flattened elements
     * [owned_begin, owned_end) (begin == end: nothing owned). A split
     * parameter's part is num_owned_ranges ranges (zero_engine_get_param_owned_range);
     * owned_begin / owned_end are then the first owned element and one past
     * the last, with gaps between (owned_numel < owned_end - owned_begin). */
    uint64_t owned_begin;
    uint64_t owned_end;
    uint64_t shard_offset; /* where element owned_begin sits in this rank's fp32 shard; the
                              owned elements of every range follow it there, in order */
    /* ---- appended */
    int first_bucket;      /* = bucket */
    int num_buckets;       /* buckets holding a piece of it: 1 unless it is larger than
                              plan.bucket_capacity (then split across consecutive buckets) */
    uint64_t owned_numel;  /* owned elements, all ranges: what state_get / state_set move */
    int num_owned_ranges;  /* 0 (nothing owned), 1, or more for a split parameter */
} zero_param_info;

/* Registration data works before finalize; the owned range and shard offset
 * need finalize (zeros before; bucket and first_bucket -1). */
ZERO_API int zero_engine_get_num_params(const zero_engine *e);
ZERO_API int zero_engine_get_num_modules(const zero_engine *e);
ZERO_API zero_status zero_engine_get_param_info(const zero_engine *e, int param, zero_param_info *out);
/* Owned range `index` (0 .. num_owned_ranges - 1, ascending) of `param` on
 * this rank: flattened elements [*begin, *end). After finalize; ZERO_NOT_FOUND
 * for an index out of range. Not collective. */
ZERO_API zero_status zero_engine_get_param_owned_range(const zero_engine *e, int param, int index, uint64_t *begin,
                                                   uint64_t *end);
/* Owned by the engine, valid until destroy; NULL for an unknown module. */
ZERO_API const char *zero_engine_get_module_name(const zero_engine *e, int module);
/* -1 (and ZERO_NOT_FOUND from the status form) for an unknown name. */
ZERO_API zero_status zero_engine_find_param(const zero_engine *e, const char *name, int *param);

/* One bucket of the plan (0 .. plan.num_buckets - 1), after finalize: the
 * unit of reduce-scatter and gather, and of the offload formulas. A
 * parameter larger than plan.bucket_capacity spans several consecutive
 * buckets (zero_param_info.first_bucket, num_buckets). */
typedef struct zero_bucket_info {
    int module;            /* the module it belongs to */
    int persistent;        /* stage 3: kept whole */
    uint64_t numel;        /* padded: a multiple of the dp size */
    uint64_t chunk_numel;  /* numel / dp size: each rank's part */
    uint64_t shard_offset; /* where this rank's chunk starts in its shard */
} zero_bucket_info;
ZERO_API zero_status zero_engine_get_bucket_info(const zero_engine *e, int bucket, zero_bucket_info *out);

/* Counters of what the engine did since finalize (for tests and tuning). */
typedef struct zero_engine_stats {
    uint64_t steps;                 /* step() calls that returned OK (skipped ones included) */
    uint64_t reduce_scatters;       /* bucket reduce-scatters issued */
    uint64_t async_reduce_scatters; /* ... of them asynchronously (overlap_comm) */
    uint64_t gathers;               /* stage 3: module all-gathers (explicit or prefetched) */
    uint64_t prefetches;            /* ... of them issued ahead by the prefetcher */
    uint64_t prefetch_hits;         /* gather() calls served by a prefetch */
    uint64_t prefetch_dropped;      /* prefetches never used (waited for and freed at step) */
    uint64_t order_changes;         /* times the recorded stage-3 gather order changed */
    uint64_t peak_inflight_numel;   /* most elements of prefetches in flight at once */
    uint64_t peak_live_numel;       /* most elements gathered + in flight at once */
} zero_engine_stats;

ZERO_API zero_status zero_engine_get_stats(const zero_engine *e, zero_engine_stats *out);

/* ================================================================= state (checkpoints) */

typedef enum zero_state_kind {
    ZERO_STATE_MASTER = 0,  /* fp32 master weights (the fp32 params themselves for f32 compute) */
    ZERO_STATE_MOMENT1 = 1, /* AdamW exp_avg; SGD momentum buffer */
    ZERO_STATE_MOMENT2 = 2, /* AdamW exp_avg_sq */
} zero_state_kind;

/* Copy this rank's owned part of `param`'s fp32 state out to / in from host
 * memory: owned_numel floats (= owned_end - owned_begin unless the parameter
 * is split), its owned ranges one after another in ascending order. Not
 * collective; after finalize.
 * ZERO_NOT_FOUND for a moment the optimizer does not have (SGD without
 * momentum, MOMENT2 for SGD). After state_set of MASTER, call
 * params_changed() before the next forward. At stage 0 (where every rank
 * holds everything) only the owned part is read or written; params_changed()
 * spreads it. */
ZERO_API zero_status zero_engine_state_get(zero_engine *e, zero_state_kind kind, int param, float *out);
ZERO_API zero_status zero_engine_state_set(zero_engine *e, zero_state_kind kind, int param, const float *in);

/* COLLECTIVE. Re-derive the compute-dtype parameters from the master shard
 * (cast) and make them whole where the stage keeps them whole (all-gather
 * at stages 0-2, persistent params at stage 3); at stage 0 the master and
 * moments are all-gathered too. Call after state_set. */
ZERO_API zero_status zero_engine_params_changed(zero_engine *e);

/* COLLECTIVE at every stage, stage 0 included: every rank of the dp group
 * calls it with the same `param`. Full fp32 master value of `param` (numel
 * floats) into host memory on every rank, assembled from the owners' parts:
 * a 2-integer all-reduce that checks the ranks agree, then (stages 1-3) one
 * all-gather per bucket the parameter spans; all counted by the comm counters.
 * Ranks passing different parameters all get ZERO_MISMATCH, an unknown
 * parameter or NULL `out` on any rank fails on every rank (this one
 * ZERO_INVALID_ARGUMENT, the others ZERO_PEER_FAILURE); the engine stays
 * usable. A call on some ranks only ends in ZERO_TIMEOUT after the comm's
 * deadline, whose message names this rule, and leaves the engine unusable
 * (only destroy is accepted), like any collective that times out. */
ZERO_API zero_status zero_engine_read_param(zero_engine *e, int param, float *out);

/* Scalar training state, for checkpoints. */
typedef struct zero_engine_scalars {
    int64_t step;          /* optimizer updates applied (AdamW bias correction uses it) */
    int64_t skipped_steps; /* fp16 overflow steps skipped */
    double loss_scale;     /* current loss scale (1 unless fp16) */
    int hysteresis_left;   /* overflows still tolerated before the scale drops */
    int64_t good_steps;    /* non-overflow steps since the last overflow; the scale doubles
                              whenever it reaches a multiple of loss_scale_window */
    double lr;
} zero_engine_scalars;

ZERO_API zero_status zero_engine_get_scalars(const zero_engine *e, zero_engine_scalars *out);
/* Not collective: set the same values on every rank. */
ZERO_API zero_status zero_engine_set_scalars(zero_engine *e, const zero_engine_scalars *in);

ZERO_EXTERN_C_END

#endif
