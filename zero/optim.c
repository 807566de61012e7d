/* The optimizer update of one fp32 region, dispatched by device kind and
 * cut into the runs of one parameter group (each run gets its group's
 * hyperparameters; with no groups the region is one kernel call, as before
 * groups existed). */
#include <math.h>

#include "engine_internal.h"
#include "optim/cpu_optim.h"
#include "zero_build_config.h"
#if ZERO_HAVE_CUDA
#include <zero/zero_cuda.h>

#include "device/cuda_module.h"
#endif

/* The group's hyperparameters for this step. SGD: a group's first step with
 * momentum > 0 starts its buffers (h->first), however many regions of the
 * step it covers, so that step is recorded here. */
void optim_make_hyper(const zero_engine *e, zero_group *gr, float grad_scale, zero_optim_hyper *h)
{
    const zero_config *c = &e->cfg;
    const double t = (double)e->step; /* this update's number, 1-based */
    const double lr = c->lr * gr->lr_scale;
    h->grad_scale = grad_scale;
    h->decay = (float)(1.0 - lr * gr->weight_decay);
    h->beta1 = (float)gr->beta1;
    h->one_minus_beta1 = (float)(1.0 - gr->beta1);
    h->beta2 = (float)gr->beta2;
    h->one_minus_beta2 = (float)(1.0 - gr->beta2);
    h->neg_step_size = (float)(-(lr / (1.0 - pow(gr->beta1, t))));
    h->bc2_sqrt = (float)sqrt(1.0 - pow(gr->beta2, t));
    h->fast = c->optimizer_fast;
    const double bc2 = sqrt(1.0 - pow(gr->beta2, t));
    h->fast_num = (float)(-(lr / (1.0 - pow(gr->beta1, t))) * bc2);
    h->fast_eps = (float)(gr->eps * bc2);
    h->eps = (float)gr->eps;
    h->neg_lr = (float)(-lr);
    h->weight_decay = (float)gr->weight_decay;
    h->momentum = (float)gr->momentum;
    h->one_minus_dampening = (float)(1.0 - gr->dampening);
    h->nesterov = gr->nesterov;
    if (gr->momentum > 0 && gr->momentum_from == 0) gr->momentum_from = e->step;
    h->first = gr->momentum_from == e->step;
}

static zero_status run_kernel(zero_engine *e, const zero_optim_hyper *h, int host, float *p, const float *g,
                              float *m1, float *m2, size_t n)
{
    const int adamw = e->cfg.optimizer == ZERO_OPTIM_ADAMW;
    /* SGD in a group with momentum 0: plain SGD, its buffer untouched (torch keeps none) */
    if (!adamw && !(h->momentum > 0)) m1 = NULL;
    if (e->is_cuda && !host) {
#if ZERO_HAVE_CUDA
        /* In stream order after the gradient work: no host wait. */
        void *cs = zero_stream_get_cuda(e->stream);
        /* The engine's device is a CUDA one: the module is loaded (cuda_module.h). */
        int err = adamw ? zero_cu->zero_cuda_adamw(h, p, g, m1, m2, n, cs) : zero_cu->zero_cuda_sgd(h, p, g, m1, n, cs);
        if (err)
            return zero_fail(&e->err, ZERO_BACKEND, "engine step: optimizer kernel on rank %d: %s", e->rank,
                             zero_cu->zero_cuda_optim_error_string(err));
        return ZERO_OK;
#else
        return zero_fail(&e->err, ZERO_UNSUPPORTED, "engine step: CUDA device but libzero was built without CUDA");
#endif
    }
    /* The CPU device's "kernel" is this host code: it reads what the engine
     * stream wrote (nothing to wait for unless ZERO_CPU_ASYNC); offloaded
     * state in host memory (host = 1) is the offload walk's, synchronised there. */
    if (!host) ZERO_TRY(engine_sync_stream(e, "engine step"));
    if (adamw) zero_cpu_adamw(h, p, g, m1, m2, n);
    else zero_cpu_sgd(h, p, g, m1, n);
    return ZERO_OK;
}

/* Elements [off, off + n) of the flat layout, run by run. */
static zero_status update_runs(zero_engine *e, int host, float *p, const float *g, float *m1, float *m2, size_t n,
                               float grad_scale, uint64_t off)
{
    if (n == 0) return ZERO_OK;
    zero_optim_hyper h;
    groups_pieces it;
    groups_pieces_begin(e, off, off + n, &it);
    uint64_t lo, hi;
    int group;
    while (groups_pieces_next(e, &it, &lo, &hi, &group)) {
        const size_t k = (size_t)(lo - off);
        optim_make_hyper(e, &e->groups[group], grad_scale, &h);
        ZERO_TRY(run_kernel(e, &h, host, p + k, g + k, m1 ? m1 + k : NULL, m2 ? m2 + k : NULL, (size_t)(hi - lo)));
    }
    return ZERO_OK;
}

zero_status optim_update(zero_engine *e, float *p, const float *g, float *m1, float *m2, size_t n,
                         float grad_scale, uint64_t flat_begin)
{
    return update_runs(e, 0, p, g, m1, m2, n, grad_scale, flat_begin);
}

zero_status optim_update_host(zero_engine *e, float *p, const float *g, float *m1, float *m2, size_t n,
                              float grad_scale, uint64_t flat_begin)
{
    return update_runs(e, 1, p, g, m1, m2, n, grad_scale, flat_begin);
}
