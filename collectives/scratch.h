/* Reusable temporary buffers of a comm's ops (collectives-internal).
 *
 * Large ops need tens of MB of scratch (host memory for the MPI schedules,
 * pinned host memory for the STAGED backend's copies). Allocating it per op
 * costs mmap + a page fault per 4 KiB (glibc maps blocks over 32 MB afresh),
 * or a cudaMallocHost (milliseconds) every time. A comm therefore keeps a few
 * buffers, one per op in flight (overlap_comm keeps two reduce-scatters and a
 * prefetch going): an op takes the smallest idle one that is large enough,
 * else grows an idle one, else (all busy) allocates its own. Each slot
 * remembers its ALLOCATION size, never the request's: a small op served by a
 * large buffer leaves it large, so alternating sizes allocate nothing once
 * warm (`allocations` counts every allocation, for the tests). */
#ifndef ZERO_COLL_SCRATCH_H
#define ZERO_COLL_SCRATCH_H

#include <stddef.h>

#define COLL_SCRATCH_SLOTS 4

typedef struct coll_scratch {
    void *(*alloc)(size_t bytes);   /* NULL: malloc */
    void (*release)(void *ptr);     /* NULL: free */
    struct {
        void *ptr;
        size_t bytes;               /* what was allocated */
        int busy;
    } slot[COLL_SCRATCH_SLOTS];
    unsigned long long allocations; /* every alloc call, cached or not */
} coll_scratch;

/* Memory of at least `bytes` (NULL when out of memory); *cached says which
 * slot it is (1-based; 0: the op's own buffer), for coll_scratch_put. */
void *coll_scratch_get(coll_scratch *sc, size_t bytes, int *cached);
void coll_scratch_put(coll_scratch *sc, void *ptr, int cached);
/* The op was abandoned while the transport may still use `ptr`: it goes to
 * the graveyard, and the comm forgets it if it was one of its slots. */
void coll_scratch_abandon(coll_scratch *sc, void *ptr, int cached);
/* Frees the idle slots (a busy one belongs to an op still in flight). */
void coll_scratch_release(coll_scratch *sc);

/* deadline.c: memory the transport may still touch, freed at MPI finalize. */
void coll_graveyard_add(void *ptr, void (*release)(void *));

#endif
