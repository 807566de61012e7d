/* The optimizer update of one fp32 region, dispatched by device kind. */
#include <math.h>

#include "engine_internal.h"
#include "optim/cpu_optim.h"
#include "zero_build_config.h"
#if ZERO_HAVE_CUDA
#include <zero/zero_cuda.h>

#include "zero/optim_cuda.h"
#endif

static void make_hyper(const zero_engine *e, float grad_scale, zero_optim_hyper *h)
{
    const zero_config *c = &e->cfg;
    const double t = (double)e->step; /* this update's number, 1-based */
    h->grad_scale = grad_scale;
    h->decay = (float)(1.0 - c->lr * c->weight_decay);
    h->beta1 = (float)c->beta1;
    h->one_minus_beta1 = (float)(1.0 - c->beta1);
    h->beta2 = (float)c->beta2;
    h->one_minus_beta2 = (float)(1.0 - c->beta2);
    h->neg_step_size = (float)(-(c->lr / (1.0 - pow(c->beta1, t))));
    h->bc2_sqrt = (float)sqrt(1.0 - pow(c->beta2, t));
    h->eps = (float)c->eps;
    h->neg_lr = (float)(-c->lr);
    h->weight_decay = (float)c->weight_decay;
    h->momentum = (float)c->momentum;
    h->one_minus_dampening = (float)(1.0 - c->dampening);
    h->nesterov = c->nesterov;
    h->first = e->step == 1;
}

zero_status optim_update(zero_engine *e, float *p, const float *g, float *m1, float *m2, size_t n,
                         float grad_scale)
{
    if (n == 0) return ZERO_OK;
    zero_optim_hyper h;
    make_hyper(e, grad_scale, &h);
    const int adamw = e->cfg.optimizer == ZERO_OPTIM_ADAMW;
    if (e->is_cuda) {
#if ZERO_HAVE_CUDA
        /* In stream order after the gradient work: no host wait. */
        void *cs = zero_stream_get_cuda(e->stream);
        int err = adamw ? zero_cuda_adamw(&h, p, g, m1, m2, n, cs) : zero_cuda_sgd(&h, p, g, m1, n, cs);
        if (err)
            return zero_fail(&e->err, ZERO_BACKEND, "engine step: optimizer kernel on rank %d: %s", e->rank,
                             zero_cuda_optim_error_string(err));
        return ZERO_OK;
#else
        return zero_fail(&e->err, ZERO_UNSUPPORTED, "engine step: CUDA device but libzero was built without CUDA");
#endif
    }
    /* The CPU device's "kernel" is this host code: it reads what the engine
     * stream wrote (nothing to wait for unless ZERO_CPU_ASYNC). */
    ZERO_TRY(engine_sync_stream(e, "engine step"));
    if (adamw) zero_cpu_adamw(&h, p, g, m1, m2, n);
    else zero_cpu_sgd(&h, p, g, m1, n);
    return ZERO_OK;
}

zero_status optim_update_host(zero_engine *e, float *p, const float *g, float *m1, float *m2, size_t n,
                              float grad_scale)
{
    if (n == 0) return ZERO_OK;
    zero_optim_hyper h;
    make_hyper(e, grad_scale, &h);
    if (e->cfg.optimizer == ZERO_OPTIM_ADAMW) zero_cpu_adamw(&h, p, g, m1, m2, n);
    else zero_cpu_sgd(&h, p, g, m1, n);
    return ZERO_OK;
}
