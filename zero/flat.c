/* The flat layout as a trainer may address it (engine.h "contiguous
 * layout"): stacked (L, ...) tensors registered as L per-module slices, and
 * views of the flat parameter and gradient buffers where the stage keeps
 * them whole. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

zero_status zero_engine_add_param_stacked(zero_engine *e, const int *modules, const char *name, int ndim,
                                          const int64_t *shape, const float *init, int *first_param_id)
{
    static const char what[] = "engine add_param_stacked";
    if (first_param_id) *first_param_id = -1;
    ZERO_TRY(engine_check_usable(e, what, 0));
    if (!modules || !name || !shape)
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: modules, name or shape is NULL", what);
    if (ndim < 2 || ndim > ZERO_MAX_DIMS + 1)
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT,
                         "%s '%s': ndim %d; a stacked tensor has 2..%d dimensions (L slices of 1..%d)", what, name,
                         ndim, ZERO_MAX_DIMS + 1, ZERO_MAX_DIMS);
    const int64_t L = shape[0];
    if (L < 1 || L > 1 << 20)
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s '%s': shape[0] = %lld slices (1..%d)", what, name,
                         (long long)L, 1 << 20);
    uint64_t slice = 1;
    for (int d = 1; d < ndim; d++) {
        if (shape[d] < 1)
            return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s '%s': shape[%d] = %lld", what, name, d,
                             (long long)shape[d]);
        slice *= (uint64_t)shape[d];
    }
    for (int64_t l = 0; l < L; l++)
        if (modules[l] < 0 || modules[l] >= e->num_modules)
            return zero_fail(&e->err, ZERO_NOT_FOUND, "%s '%s': slice %lld: unknown module %d (%d modules)", what,
                             name, (long long)l, modules[l], e->num_modules);
    for (int64_t l = 0; l < L; l++) {
        char sname[512];
        if ((size_t)snprintf(sname, sizeof sname, "%s[%lld]", name, (long long)l) >= sizeof sname)
            return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: name '%.64s...' is too long", what, name);
        int id = -1;
        ZERO_TRY(zero_engine_add_param(e, modules[l], sname, ndim - 1, shape + 1, init ? init + (uint64_t)l * slice : NULL,
                                       &id));
        if (l == 0 && first_param_id) *first_param_id = id;
    }
    return ZERO_OK;
}

zero_status zero_engine_flat_params(zero_engine *e, void **data, uint64_t *numel)
{
    static const char what[] = "engine flat_params";
    ZERO_TRY(engine_check_usable(e, what, 1));
    if (!data) return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: data is NULL", what);
    *data = NULL;
    if (numel) *numel = 0;
    if (e->cfg.stage > 2)
        return zero_fail(&e->err, ZERO_UNSUPPORTED,
                         "%s: stage 3 keeps only a shard of the parameters; there is no flat buffer to view "
                         "(address each parameter through gather + param_data)", what);
    *data = e->params_full;
    if (numel) *numel = e->padded;
    return ZERO_OK;
}

zero_status zero_engine_flat_grads(zero_engine *e, void **grad, uint64_t *numel)
{
    static const char what[] = "engine flat_grads";
    ZERO_TRY(engine_check_usable(e, what, 1));
    if (!grad) return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: grad is NULL", what);
    *grad = NULL;
    if (numel) *numel = 0;
    if (e->cfg.stage > 1)
        return zero_fail(&e->err, ZERO_UNSUPPORTED,
                         "%s: stage %d keeps gradients per module for one micro-step only; there is no flat buffer "
                         "(use param_grad after each module's first use in the micro-step)", what, e->cfg.stage);
    *grad = e->grads_full;
    if (numel) *numel = e->padded;
    return ZERO_OK;
}

zero_status zero_engine_get_param_flat_offset(const zero_engine *e, int param, uint64_t *offset)
{
    if (!e || !offset) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "engine param_flat_offset: NULL argument");
    if (!e->finalized)
        return zero_fail((zero_errbuf *)&e->err, ZERO_INVALID_STATE,
                         "engine param_flat_offset: call zero_engine_finalize first");
    if (param < 0 || param >= e->num_params)
        return zero_fail((zero_errbuf *)&e->err, ZERO_NOT_FOUND, "engine param_flat_offset: no parameter %d", param);
    *offset = e->params[param].flat_off;
    return ZERO_OK;
}
