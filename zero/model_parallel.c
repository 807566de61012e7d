/* The global gradient norm across a model-parallel group (tensor / pipeline
 * parallelism): the mp comm, the duplicate flags, and the one extra scalar
 * collective of step(). See engine.h "model parallelism". */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

static zero_status check_engine(zero_engine *e, const char *what)
{
    if (!e) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "%s: engine is NULL", what);
    if (e->broken)
        return zero_fail(&e->err, ZERO_INVALID_STATE,
                         "%s: the engine is unusable after an earlier failure (destroy it); that failure: %.300s",
                         what, e->fatal);
    return ZERO_OK;
}

zero_status zero_engine_set_model_parallel(zero_engine *e, zero_comm *mp)
{
    const char *what = "engine set_model_parallel";
    ZERO_TRY(check_engine(e, what));
    if (mp) {
        zero_backend be = zero_comm_get_backend(mp);
        int on_device = be == ZERO_BACKEND_NCCL || be == ZERO_BACKEND_STAGED;
        int on_host = be == ZERO_BACKEND_MPI || be == ZERO_BACKEND_LOCAL;
        if (e->is_cuda ? !on_device : !on_host)
            return zero_fail(&e->err, ZERO_INVALID_ARGUMENT,
                             "%s: mp comm '%s' (backend %d) does not carry the memory of the engine's %s device "
                             "(rank %d of dp)",
                             what, zero_comm_get_name(mp), (int)be, e->is_cuda ? "CUDA" : "CPU", e->rank);
        int n = zero_comm_get_size(mp);
        double *buf = calloc((size_t)n + 1, sizeof *buf);
        if (!buf) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: out of memory for %d ranks", what, n);
        free(e->mp_buf);
        e->mp_buf = buf;
    } else {
        free(e->mp_buf);
        e->mp_buf = NULL;
    }
    e->mp = mp;
    return ZERO_OK;
}

zero_status zero_engine_set_param_duplicate(zero_engine *e, int param, int duplicate)
{
    const char *what = "engine set_param_duplicate";
    ZERO_TRY(check_engine(e, what));
    if (param < 0 || param >= e->num_params)
        return zero_fail(&e->err, ZERO_INVALID_ARGUMENT, "%s: parameter %d out of range (engine has %d, rank %d)",
                         what, param, e->num_params, e->rank);
    zero_param *p = &e->params[param];
    int d = duplicate != 0;
    e->num_duplicates += d - p->duplicate;
    p->duplicate = d;
    return ZERO_OK;
}

/* All-gather, not all-reduce: the sum is then taken in the same (rank)
 * order on every rank, so the bits agree whatever algorithm MPI picks. */
zero_status mp_norm_reduce(zero_engine *e, double *total, const char *what)
{
    if (!e->mp) return ZERO_OK;
    const int n = zero_comm_get_size(e->mp);
    if (n == 1) return ZERO_OK;
    double *buf = e->mp_buf;
    buf[n] = *total;
    zero_status st;
    if (!e->is_cuda) {
        st = zero_allgather(e->mp, &buf[n], buf, 1, ZERO_F64);
        if (st != ZERO_OK) return engine_comm_failed(e, st, what);
    } else {
        size_t bytes = ((size_t)n + 1) * sizeof(double);
        void *dbuf = NULL;
        ZERO_TRY(engine_alloc(e, ZERO_MEM_OTHER, bytes, &dbuf));
        st = engine_memcpy(e, dbuf, buf, bytes);
        if (st == ZERO_OK) st = engine_sync_stream(e, what);
        if (st == ZERO_OK) {
            st = zero_allgather(e->mp, (double *)dbuf + n, dbuf, 1, ZERO_F64);
            if (st != ZERO_OK) st = engine_comm_failed(e, st, what);
            else if ((st = engine_memcpy(e, buf, dbuf, bytes)) != ZERO_OK)
                st = zero_fail_forward(&e->err, st, "engine: copying the mp norm back: ");
        }
        engine_free(e, ZERO_MEM_OTHER, bytes, dbuf);
        if (st != ZERO_OK) return st;
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += buf[i];
    *total = sum;
    return ZERO_OK;
}
