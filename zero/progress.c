/* Progress for the engine's non-blocking collectives (overlap_comm).
 *
 * Open MPI moves a non-blocking operation along only inside MPI calls, and
 * our reduce-scatters and all-gathers are multi-round point-to-point
 * schedules (collectives/mpi_sched.c) whose next round starts only when the
 * previous one is seen complete. Left alone while both cores compute, an
 * async bucket reduction or prefetch sits after its first round until the
 * engine waits for it, so overlap_comm hid nothing and only added its
 * bookkeeping. The engine's entry points are the moments the caller's
 * compute pauses (gather, release, param_grad, grads_ready): each tests one
 * in-flight request there, which advances every pending operation on the
 * dp comm (zero_test advances the others too). Failures are not reported
 * here: the wait that completes the request reports them, by name.
 * ZERO_PROGRESS=0 (read at engine create) leaves them out: the A/B of
 * docs/BENCHMARKS.md ("overlap_comm"). */
#include "engine_internal.h"

void engine_progress(zero_engine *e)
{
    if (!e->cfg.overlap_comm || !e->progress_on || !e->finalized) return;
    zero_request *req = NULL;
    for (int i = 0; i < e->num_slots && !req; i++) req = e->slots[i].req;
    for (int m = 0; m < e->num_modules && !req; m++) {
        const zero_module *mod = &e->modules[m];
        if (mod->state != MODULE_INFLIGHT || !mod->reqs) continue;
        for (int i = 0; i < mod->num_buckets && !req; i++) req = mod->reqs[i];
    }
    int done = 0;
    if (req) (void)zero_test(req, &done);
}
