/* The valid range of the engine's scalar state, in one place: set_scalars
 * applies it to an engine, checkpoint verify to a file without one (so
 * verify passes exactly what load accepts). No engine internals: the
 * checkpoint readers and their fuzz targets link it alone. */
#include "checkpoint/checkpoint_internal.h"

zero_status engine_scalars_check(const zero_engine_scalars *in, zero_errbuf *err, const char *what)
{
    if (in->step < 0 || in->skipped_steps < 0 || in->good_steps < 0 || !(in->loss_scale > 0) ||
        in->hysteresis_left < 0 || !(in->lr >= 0))
        return zero_fail(err, ZERO_INVALID_ARGUMENT,
                         "%s: out of range (step %lld, skipped_steps %lld, good_steps %lld, loss_scale %g, "
                         "hysteresis_left %d, lr %g)",
                         what, (long long)in->step, (long long)in->skipped_steps, (long long)in->good_steps,
                         in->loss_scale, in->hysteresis_left, in->lr);
    return ZERO_OK;
}
