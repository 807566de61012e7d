/* What the pipeline runtime (pp_exec.c) keeps across the steps of one stage
 * (internal): the device events that order its groups of sends / receives
 * and the step's bookkeeping arrays. Made in a plan's first step and reused
 * by every later one, so a step creates and destroys no event and allocates
 * no bookkeeping: on a GPU an event made and destroyed per group of
 * transfers per step is driver work in the hot loop.
 *
 * The stage owns it (pp_stage.cache: the CUDA stage keeps one for its
 * lifetime) and frees it with pp_run_cache_free before the device goes; a
 * stage without one (pp_run_plan's CPU stage, made per call) gets a cache
 * for the one step. Reusing an event across steps is safe: at the end of a
 * step the runtime has waited for the comm's and the stage's streams, and a
 * stream's wait for an event binds to the record made before the wait was
 * enqueued (cudaStreamWaitEvent; the asynchronous CPU device alike), never
 * to a later one.
 *
 * Grows when a later plan needs more (more groups, a longer list): the new
 * events are made then, the old ones kept. Counted (`created`), so the tests
 * check that a step after the first makes none
 * (tests/model_parallel/test_pp_schedules.c, `stream`). */
#ifndef ZERO_MODEL_PP_RUN_CACHE_H
#define ZERO_MODEL_PP_RUN_CACHE_H

#include <stddef.h>

#include <zero/device.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_run_cache {
    zero_device *dev;  /* the events' device */
    zero_event **ev;   /* nev events on dev */
    int nev;
    int created;       /* events created so far (destroyed only by pp_run_cache_free, or for a new device) */
    void *scratch;     /* the bookkeeping block, scratch_bytes long */
    size_t scratch_bytes;
} pp_run_cache;

/* At least n events on dev in *out (the cache's array: valid until the
 * next call). Events made for another device are destroyed first. Status,
 * message in gpt_last_error(). */
zero_status pp_run_cache_events(pp_run_cache *c, zero_device *dev, int n, zero_event ***out);
/* A block of at least `bytes` (its contents undefined: the runtime writes
 * what it reads); NULL when out of memory. */
void *pp_run_cache_scratch(pp_run_cache *c, size_t bytes);
/* Every event destroyed and the block freed; the cache is empty and
 * reusable (its counter kept). NULL accepted. */
void pp_run_cache_free(pp_run_cache *c);

#ifdef __cplusplus
}
#endif

#endif
