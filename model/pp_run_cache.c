/* The pipeline runtime's state kept across steps (pp_run_cache.h). */
#include "pp_run_cache.h"

#include <stdlib.h>

#include "gpt_internal.h"

static void destroy_events(pp_run_cache *c)
{
    for (int i = 0; i < c->nev; i++) zero_event_destroy(c->ev[i]);
    c->nev = 0;
}

zero_status pp_run_cache_events(pp_run_cache *c, zero_device *dev, int n, zero_event ***out)
{
    if (c->dev != dev) destroy_events(c); /* made for another device */
    c->dev = dev;
    if (n > c->nev) {
        zero_event **ev = realloc(c->ev, sizeof *ev * (size_t)n);
        if (!ev) return gpt_fail(ZERO_OUT_OF_MEMORY, "pipeline runtime: out of memory for %d events", n);
        c->ev = ev;
        while (c->nev < n) {
            zero_status st = zero_event_create(dev, &c->ev[c->nev]);
            if (st != ZERO_OK)
                return gpt_fail(st, "pipeline runtime: creating event %d of %d: %s", c->nev + 1, n, zero_last_error());
            c->nev++, c->created++;
        }
    }
    *out = c->ev;
    return ZERO_OK;
}

void *pp_run_cache_scratch(pp_run_cache *c, size_t bytes)
{
    if (bytes > c->scratch_bytes) {
        free(c->scratch); /* contents are not kept: no realloc copy */
        c->scratch = malloc(bytes);
        c->scratch_bytes = c->scratch ? bytes : 0;
    }
    return c->scratch;
}

void pp_run_cache_free(pp_run_cache *c)
{
    if (!c) return;
    destroy_events(c);
    free(c->ev);
    free(c->scratch);
    c->ev = NULL, c->scratch = NULL, c->scratch_bytes = 0, c->dev = NULL;
}
