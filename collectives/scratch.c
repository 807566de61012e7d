/* Reusable temporary buffers of a comm's ops: see scratch.h. */
#include "scratch.h"

#include <stdlib.h>

static void *sc_alloc(coll_scratch *sc, size_t bytes)
{
    sc->allocations++;
    return sc->alloc ? sc->alloc(bytes) : malloc(bytes);
}

static void sc_release(coll_scratch *sc, void *ptr)
{
    if (!ptr) return;
    if (sc->release)
        sc->release(ptr);
    else
        free(ptr);
}

void *coll_scratch_get(coll_scratch *sc, size_t bytes, int *cached)
{
    if (!bytes) bytes = 1;
    *cached = 0;
    int fit = -1, idle = -1;
    for (int i = 0; i < COLL_SCRATCH_SLOTS; i++) {
        if (sc->slot[i].busy) continue;
        if (sc->slot[i].ptr && sc->slot[i].bytes >= bytes) {
            if (fit < 0 || sc->slot[i].bytes < sc->slot[fit].bytes) fit = i;
        } else if (idle < 0 || sc->slot[i].bytes > sc->slot[idle].bytes) {
            idle = i; /* grow the largest idle one that is too small (or empty) */
        }
    }
    if (fit < 0 && idle >= 0) {
        sc_release(sc, sc->slot[idle].ptr);
        sc->slot[idle].ptr = sc_alloc(sc, bytes);
        sc->slot[idle].bytes = sc->slot[idle].ptr ? bytes : 0;
        if (!sc->slot[idle].ptr) return NULL;
        fit = idle;
    }
    if (fit < 0) return sc_alloc(sc, bytes); /* every slot is in flight */
    sc->slot[fit].busy = 1;
    *cached = fit + 1;
    return sc->slot[fit].ptr;
}

void coll_scratch_put(coll_scratch *sc, void *ptr, int cached)
{
    if (cached > 0)
        sc->slot[cached - 1].busy = 0;
    else
        sc_release(sc, ptr);
}

static void free_plain(void *p) { free(p); }

void coll_scratch_abandon(coll_scratch *sc, void *ptr, int cached)
{
    if (ptr) coll_graveyard_add(ptr, sc->release ? sc->release : free_plain);
    if (cached > 0) {
        sc->slot[cached - 1].ptr = NULL;
        sc->slot[cached - 1].bytes = 0;
        sc->slot[cached - 1].busy = 0;
    }
}

void coll_scratch_release(coll_scratch *sc)
{
    for (int i = 0; i < COLL_SCRATCH_SLOTS; i++) {
        if (!sc->slot[i].busy) sc_release(sc, sc->slot[i].ptr);
        sc->slot[i].ptr = NULL;
        sc->slot[i].bytes = 0;
        sc->slot[i].busy = 0;
    }
}
