/* Test helpers for the engine: a synthetic "model" of awkwardly sized
 * parameters, a deterministic per-rank gradient that is a function of the
 * current parameter values (so a wrong parameter changes later gradients),
 * and a driver that runs forward/backward/step the way a trainer would. */
#ifndef ZERO_TESTS_ENG_UTIL_H
#define ZERO_TESTS_ENG_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <zero/zero.h>

#include "check.h"

/* ---------------------------------------------------------------- set-up */

/* A call that must fail: it returns `status` and the thread's last error
 * (zero_last_error) contains `text`; otherwise a failed check naming both. */
#define ENG_EXPECT(call, status, text)                                                                      \
    do {                                                                                                    \
        zero_status st_ = (call);                                                                           \
        CHECK_MSG(st_ == (status), "%s returned %s (%s), expected %s", #call, zero_status_name(st_),         \
                  zero_last_error(), zero_status_name(status));                                             \
        CHECK_MSG(strstr(zero_last_error(), (text)) != NULL, "%s: message \"%s\" lacks \"%s\"", #call,      \
                  zero_last_error(), (text));                                                               \
    } while (0)

/* A multi-rank engine test's world and device: the world comm (a 60 s
 * deadline; a CUDA run over NCCL when `nccl`, else STAGED - several ranks
 * sharing one GPU), this rank recorded for CHECK messages, and a CPU or
 * CUDA device (the local rank's GPU). Returns 0, or what main returns when
 * set-up fails (nothing is left open then): 77, a skip, for a CUDA run, 1
 * otherwise. */
static inline int eng_open(int cuda, int nccl, zero_comm **world, zero_device **dev)
{
    zero_comm_config ccfg = ZERO_COMM_CONFIG_INIT;
    ccfg.timeout_s = 60;
    if (cuda) ccfg.backend = nccl ? ZERO_BACKEND_NCCL : ZERO_BACKEND_STAGED;
    *world = NULL, *dev = NULL;
    if (zero_comm_create_world(world, &ccfg) != ZERO_OK) {
        fprintf(stderr, "init_world: %s\n", zero_last_error());
        return cuda ? 77 : 1;
    }
    check_set_rank(zero_comm_get_rank(*world));
    if (zero_device_create(dev, cuda ? ZERO_DEVICE_CUDA : ZERO_DEVICE_CPU, -1) != ZERO_OK) {
        fprintf(stderr, "device_open: %s\n", zero_last_error());
        zero_comm_destroy(*world);
        *world = NULL;
        return cuda ? 77 : 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the model */

typedef struct eng_pspec {
    int module;
    int ndim;
    int64_t shape[3];
} eng_pspec;

static const char *const eng_module_names[] = {"embed", "block0", "block1", "block2", "block3", "norm", "head", "empty"};
#define ENG_NMODULES 8

/* Sizes: primes, ones, a 3-d tensor, two larger than the 1000-element test
 * bucket; module block0 gets one more param at the end (not contiguous). */
static const eng_pspec eng_model[] = {
    {0, 2, {97, 13}}, {0, 1, {1}},
    {1, 2, {31, 7}}, {1, 1, {31}}, {1, 1, {1}}, {1, 2, {5, 3}}, {1, 1, {101}}, {1, 1, {257}},
    {2, 1, {2053}}, {2, 1, {3}}, {2, 2, {11, 2}}, {2, 1, {509}},
    {3, 1, {7}}, {3, 1, {13}}, {3, 1, {1021}}, {3, 1, {2}}, {3, 1, {1}},
    {4, 2, {127, 3}}, {4, 1, {127}}, {4, 3, {3, 3, 3}},
    {5, 1, {61}}, {5, 1, {61}}, {5, 1, {1}},
    {6, 2, {97, 5}}, {6, 1, {17}}, {6, 1, {1}}, {6, 2, {41, 11}}, {6, 1, {3}},
    {1, 1, {19}},
};
#define ENG_NPARAMS ((int)(sizeof eng_model / sizeof eng_model[0]))
#define ENG_BUCKET 1000
#define ENG_PERSIST 10

static inline uint64_t eng_numel(const eng_pspec *p)
{
    uint64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (uint64_t)p->shape[d];
    return n;
}

static inline float eng_init_value(int param, uint64_t i)
{
    return (float)(0.5 * sin(0.37 * (double)i + 1.3 * param));
}

/* Register the model (optionally scaled up by repeating `scale` copies of
 * every param's leading dimension) and finalize. */
static inline zero_status eng_register(zero_engine *e, int scale)
{
    zero_status st;
    for (int m = 0; m < ENG_NMODULES; m++)
        if ((st = zero_engine_add_module(e, eng_module_names[m], NULL)) != ZERO_OK) return st;
    for (int p = 0; p < ENG_NPARAMS; p++) {
        eng_pspec s = eng_model[p];
        s.shape[0] *= scale;
        uint64_t n = eng_numel(&s);
        /* Its own mapping, returned when unmapped: a freed heap block would
         * stay resident and blur the RSS test (test_engine_memory rss). */
        size_t len = (size_t)n * sizeof(float);
        float *init = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (init == MAP_FAILED) return ZERO_OUT_OF_MEMORY;
        for (uint64_t i = 0; i < n; i++) init[i] = eng_init_value(p, i);
        char name[64];
        snprintf(name, sizeof name, "%s.p%d", eng_module_names[s.module], p);
        st = zero_engine_add_param(e, s.module, name, s.ndim, s.shape, init, NULL);
        munmap(init, len ? len : 1);
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

static inline float eng_load(zero_dtype d, const void *buf, uint64_t i)
{
    switch (d) {
    case ZERO_BF16: return zero_bf16_to_f32(((const uint16_t *)buf)[i]);
    case ZERO_F16: return zero_f16_to_f32(((const uint16_t *)buf)[i]);
    default: return ((const float *)buf)[i];
    }
}

static inline void eng_store(zero_dtype d, void *buf, uint64_t i, float v)
{
    switch (d) {
    case ZERO_BF16: ((uint16_t *)buf)[i] = zero_f32_to_bf16(v); break;
    case ZERO_F16: ((uint16_t *)buf)[i] = zero_f32_to_f16(v); break;
    default: ((float *)buf)[i] = v; break;
    }
}

/* The gradient rank `r` computes at micro-step (step, micro) for element i
 * of param p whose current value is x. */
static inline float eng_grad(float x, int r, int step, int micro, int p, uint64_t i)
{
    return (float)(0.2 * sin(3.0 * x + 0.7 * r + 0.3 * step + 0.13 * micro + 0.01 * (double)(i % 97) + 0.1 * p) +
                   0.05 * (r + 1));
}

/* ---------------------------------------------------------------- the driver */

typedef struct eng_run {
    int ranks[8];  /* micro-step u uses rank ranks[u % nranks] ... */
    int nranks;    /* ... and micro index u / nranks */
    int inject_inf_step; /* 1-based step whose grads get an inf (0 = never) ... */
    int inject_inf_rank; /* ... on this rank's grads only */
    int forward_reversed; /* forward visits the modules last to first (changes the stage-3 order) */
} eng_run;

/* Called in every micro-step's forward of eng_train_step right after the
 * first module's gather (NULL: none), e.g. an untraced eval pass mid-step. */
static zero_status (*eng_forward_hook)(zero_engine *e);

/* One training step: gas * nranks micro-steps of forward + backward with
 * gathers/releases, then step(). */
static inline zero_status eng_train_step(zero_engine *e, zero_device *dev, const zero_config *cfg,
                                         const eng_run *run, int step, zero_step_result *res)
{
    zero_status st;
    const zero_dtype dt = cfg->compute_dtype;
    const size_t es = zero_dtype_size(dt);
    const int micro_total = cfg->gradient_accumulation_steps;
    const int nparams = zero_engine_get_num_params(e);
    float scale = (float)zero_engine_get_loss_scale(e);
    for (int u = 0; u < micro_total; u++) {
        int r = run->ranks[u % run->nranks];
        int micro = u / run->nranks;
        /* forward: touch every param through its pointer */
        volatile float sink = 0;
        for (int mi = 0; mi < ENG_NMODULES; mi++) {
            int m = run->forward_reversed ? ENG_NMODULES - 1 - mi : mi;
            if ((st = zero_engine_gather(e, m)) != ZERO_OK) return st;
            if (mi == 0 && eng_forward_hook && (st = eng_forward_hook(e)) != ZERO_OK) return st;
            for (int p = 0; p < nparams; p++) {
                zero_param_info pi;
                zero_engine_get_param_info(e, p, &pi);
                if (pi.module != m) continue;
                void *x;
                if ((st = zero_engine_param_data(e, p, &x)) != ZERO_OK) return st;
                float last[1];
                unsigned char raw[4];
                if ((st = zero_memcpy(dev, raw, (char *)x + (pi.numel - 1) * es, es)) != ZERO_OK) return st;
                last[0] = eng_load(dt, raw, 0);
                sink += last[0];
            }
            if ((st = zero_engine_release(e, m)) != ZERO_OK) return st;
        }
        (void)sink;
        /* backward, modules in reverse */
        for (int m = ENG_NMODULES - 1; m >= 0; m--) {
            if ((st = zero_engine_gather(e, m)) != ZERO_OK) return st;
            for (int p = 0; p < nparams; p++) {
                zero_param_info pi;
                zero_engine_get_param_info(e, p, &pi);
                if (pi.module != m) continue;
                void *x, *g;
                if ((st = zero_engine_param_data(e, p, &x)) != ZERO_OK) return st;
                if ((st = zero_engine_param_grad(e, p, &g)) != ZERO_OK) return st;
                /* Through host copies, so device memory works too. Host
                 * memory from the device layer: large blocks go back to the
                 * kernel when freed, so the RSS test (test_engine_memory
                 * rss) sees the engine, not this harness's freed heap. */
                void *hx = NULL, *hg = NULL;
                if ((st = zero_host_alloc_pinned(dev, pi.numel * es, &hx)) != ZERO_OK) return st;
                if ((st = zero_host_alloc_pinned(dev, pi.numel * es, &hg)) != ZERO_OK) {
                    zero_host_free_pinned(dev, hx);
                    return st;
                }
                st = zero_memcpy(dev, hx, x, pi.numel * es);
                if (st == ZERO_OK) st = zero_memcpy(dev, hg, g, pi.numel * es);
                for (uint64_t i = 0; st == ZERO_OK && i < pi.numel; i++) {
                    float v = eng_load(dt, hg, i) + scale * eng_grad(eng_load(dt, hx, i), r, step, micro, p, i);
                    eng_store(dt, hg, i, v);
                }
                if (step == run->inject_inf_step && r == run->inject_inf_rank && p == 3)
                    eng_store(dt, hg, 0, INFINITY);
                if (st == ZERO_OK) st = zero_memcpy(dev, g, hg, pi.numel * es);
                zero_host_free_pinned(dev, hx);
                zero_host_free_pinned(dev, hg);
                if (st != ZERO_OK) return st;
            }
            if ((st = zero_engine_grads_ready(e, m)) != ZERO_OK) return st;
            if ((st = zero_engine_release(e, m)) != ZERO_OK) return st;
        }
    }
    return zero_engine_step(e, res);
}

/* Step `step` of a finalized engine (eng_train_step) with comm's traffic
 * counters reset just before it: k gets what that one step moved. */
static inline void eng_step_counted(zero_engine *e, zero_device *dev, const zero_config *cfg, const eng_run *r, int step,
                                    zero_comm *comm, zero_comm_counters *k)
{
    zero_step_result res;
    zero_comm_reset_counters(comm);
    CHECK_OK(eng_train_step(e, dev, cfg, r, step, &res));
    CHECK_OK(zero_comm_get_counters(comm, k));
}

/* How many elements all of e's params hold together. */
static inline uint64_t eng_param_total(zero_engine *e)
{
    uint64_t n = 0;
    for (int p = 0; p < zero_engine_get_num_params(e); p++) {
        zero_param_info pi;
        zero_engine_get_param_info(e, p, &pi);
        n += pi.numel;
    }
    return n;
}

/* Full fp32 values of every param (collective), concatenated. */
static inline float *eng_collect_master(zero_engine *e, uint64_t *total)
{
    const int np = zero_engine_get_num_params(e);
    const uint64_t n = eng_param_total(e);
    float *all = calloc(n ? n : 1, sizeof *all);
    uint64_t off = 0;
    for (int p = 0; p < np; p++) {
        zero_param_info pi;
        zero_engine_get_param_info(e, p, &pi);
        CHECK_OK(zero_engine_read_param(e, p, all + off));
        off += pi.numel;
    }
    *total = n;
    return all;
}

/* Compute-dtype values of every param as the trainer sees them (gathering
 * at stage 3), widened to fp32, concatenated. */
static inline float *eng_collect_params(zero_engine *e, zero_device *dev, zero_dtype dt)
{
    const int np = zero_engine_get_num_params(e);
    const uint64_t n = eng_param_total(e);
    float *all = calloc(n ? n : 1, sizeof *all);
    uint64_t off = 0;
    for (int m = 0; m < zero_engine_get_num_modules(e); m++) {
        CHECK_OK(zero_engine_gather(e, m));
        off = 0;
        for (int p = 0; p < np; p++) {
            zero_param_info pi;
            zero_engine_get_param_info(e, p, &pi);
            if (pi.module == m) {
                void *x = NULL;
                CHECK_OK(zero_engine_param_data(e, p, &x));
                void *h = malloc(pi.numel * zero_dtype_size(dt));
                if (x) CHECK_OK(zero_memcpy(dev, h, x, pi.numel * zero_dtype_size(dt)));
                for (uint64_t i = 0; x && i < pi.numel; i++) all[off + i] = eng_load(dt, h, i);
                free(h);
            }
            off += pi.numel;
        }
        CHECK_OK(zero_engine_release(e, m));
    }
    return all;
}

static inline long eng_first_diff(const float *a, const float *b, uint64_t n)
{
    if (!memcmp(a, b, n * sizeof *a)) return -1;
    for (uint64_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof *a)) return (long)i;
    return -1;
}

/* ---------------------------------------------------------------- runs compared bitwise */
/* The tests that run the same K steps two ways and compare the bits
 * (test_engine_equiv, _offload, _param_offload, _fused, _norm) share their
 * variant, config, step loop, outcome and comparison from here. */

/* A variant: compute dtype, micro-steps per step, clipping, overlap_comm,
 * optimizer, reduce bucket size (0: ENG_BUCKET). */
typedef struct eng_variant {
    const char *name;
    zero_dtype dtype;
    int gas;
    double clip;
    int overlap;
    zero_optimizer_kind opt;
    uint64_t bucket;
} eng_variant;

/* The variant's config at `stage`, for the synthetic model: its buckets,
 * persistence threshold ENG_PERSIST, stage-3 prefetch 1500 and 6000 live
 * elements; lr 0.01, momentum 0.9 (SGD), weight decay 0.01. */
static inline zero_config eng_variant_config(const eng_variant *v, int stage)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.reduce_bucket_size = v->bucket ? v->bucket : ENG_BUCKET;
    c.stage3_param_persistence_threshold = ENG_PERSIST;
    c.stage3_prefetch_bucket_size = 1500;
    c.stage3_max_live_parameters = 6000;
    c.overlap_comm = v->overlap;
    c.compute_dtype = v->dtype;
    c.gradient_accumulation_steps = v->gas;
    c.gradient_clipping = v->clip;
    c.optimizer = v->opt;
    c.lr = 0.01;
    c.momentum = 0.9;
    c.weight_decay = 0.01;
    return c;
}

#define ENG_MAX_STEPS 8

/* What K steps leave: the full fp32 master weights and the compute-dtype
 * params widened (eng_collect_master / _params; params NULL when not
 * collected), and each step's result. */
typedef struct eng_outcome {
    float *master, *params;
    uint64_t n;
    int steps;
    double norms[ENG_MAX_STEPS], clips[ENG_MAX_STEPS];
    int skipped[ENG_MAX_STEPS];
    uint64_t step_index[ENG_MAX_STEPS];
    int ok;
} eng_outcome;

/* An engine on cfg with the synthetic model registered (eng_register(e, 1))
 * and finalized. A failed create is a CHECK failure and leaves *e NULL; a
 * failed registration or finalize is returned with the engine. */
static inline zero_status eng_create_model(zero_engine **e, const zero_config *cfg, zero_comm *comm, zero_device *dev)
{
    *e = NULL;
    CHECK_OK(zero_engine_create(e, cfg, comm, dev));
    if (!*e) return ZERO_INVALID_STATE;
    zero_status st = eng_register(*e, 1);
    return st == ZERO_OK ? zero_engine_finalize(*e) : st;
}

/* `steps` (<= ENG_MAX_STEPS) eng_train_step calls on a finalized engine,
 * each result recorded in o; after_step (NULL: none) runs after each one
 * that succeeded (a test's change between steps). The first failure. */
static inline zero_status eng_run_steps(zero_engine *e, zero_device *dev, const zero_config *cfg, const eng_run *r,
                                        int steps, eng_outcome *o, zero_status (*after_step)(zero_engine *, int))
{
    zero_status st = ZERO_OK;
    o->steps = steps;
    for (int s = 1; st == ZERO_OK && s <= steps; s++) {
        zero_step_result res = {0};
        st = eng_train_step(e, dev, cfg, r, s, &res);
        o->norms[s - 1] = res.grad_norm;
        o->clips[s - 1] = res.clip_coef;
        o->skipped[s - 1] = res.skipped;
        o->step_index[s - 1] = res.step;
        if (st == ZERO_OK && after_step) st = after_step(e, s);
    }
    return st;
}

/* A run that failed with st: one CHECK failure naming it and the engine's
 * message; the engine destroyed. */
static inline void eng_run_failed(const char *what, zero_status st, zero_engine *e)
{
    CHECK_MSG(0, "%s: run failed: %s: %s", what, zero_status_name(st), zero_engine_last_error(e));
    zero_engine_destroy(e);
}

/* The master weights and (with_params) the compute-dtype params into o, which is then ok. */
static inline void eng_outcome_collect(zero_engine *e, zero_device *dev, zero_dtype dt, int with_params,
                                       eng_outcome *o)
{
    o->master = eng_collect_master(e, &o->n);
    o->params = with_params ? eng_collect_params(e, dev, dt) : NULL;
    o->ok = 1;
}

static inline void eng_outcome_free(eng_outcome *o)
{
    free(o->master);
    free(o->params);
    o->master = o->params = NULL;
}

/* got against ref, bitwise: master weights, params (where ref has them),
 * and every step's gradient norm, clip coefficient and skip. */
static inline void eng_expect_same(const char *what, const eng_outcome *got, const eng_outcome *ref)
{
    long d = eng_first_diff(got->master, ref->master, ref->n);
    CHECK_MSG(d < 0, "%s: master differs at element %ld: %.9g vs %.9g", what, d, d < 0 ? 0.0 : got->master[d],
              d < 0 ? 0.0 : ref->master[d]);
    if (ref->params) {
        d = eng_first_diff(got->params, ref->params, ref->n);
        CHECK_MSG(d < 0, "%s: params differ at element %ld", what, d);
    }
    CHECK(got->steps == ref->steps);
    for (int s = 0; s < ref->steps; s++) {
        CHECK_MSG(!memcmp(&got->norms[s], &ref->norms[s], sizeof(double)),
                  "%s: step %d: grad norm %.17g, the reference's %.17g", what, s + 1, got->norms[s], ref->norms[s]);
        CHECK_MSG(!memcmp(&got->clips[s], &ref->clips[s], sizeof(double)),
                  "%s: step %d: clip coefficient %.17g, the reference's %.17g", what, s + 1, got->clips[s],
                  ref->clips[s]);
        CHECK_MSG(got->skipped[s] == ref->skipped[s], "%s: step %d: skipped %d, the reference %d", what, s + 1,
                  got->skipped[s], ref->skipped[s]);
    }
}

/* Every param's owned part of the state kinds 0 .. kinds-1 (master, then
 * moment 1, moment 2), concatenated; with fewer than 3 kinds, moment 2 must
 * be ZERO_NOT_FOUND (or the rank owns nothing of the param). */
static inline float *eng_collect_owned_state(zero_engine *e, int kinds, uint64_t *count)
{
    uint64_t n = 0;
    for (int p = 0; p < zero_engine_get_num_params(e); p++) {
        zero_param_info pi;
        zero_engine_get_param_info(e, p, &pi);
        n += (pi.owned_numel) * (uint64_t)kinds;
    }
    float *all = calloc(n ? n : 1, sizeof *all);
    uint64_t off = 0;
    for (int p = 0; p < zero_engine_get_num_params(e); p++) {
        zero_param_info pi;
        zero_engine_get_param_info(e, p, &pi);
        for (int k = 0; k < kinds; k++) {
            CHECK_OK(zero_engine_state_get(e, (zero_state_kind)k, p, all + off));
            off += pi.owned_numel;
        }
        if (kinds < 3) {
            float dummy[1];
            zero_status st = zero_engine_state_get(e, ZERO_STATE_MOMENT2, p, dummy);
            CHECK_MSG(st == ZERO_NOT_FOUND || pi.owned_numel == 0, "state_get of an absent moment2: %s",
                      zero_status_name(st));
        }
    }
    *count = n;
    return all;
}

/* x rounded up to whole 4 KiB pages (host pool and swap-file granularity) */
static inline uint64_t eng_round4k(uint64_t x) { return (x + 4095) / 4096 * 4096; }

#endif
