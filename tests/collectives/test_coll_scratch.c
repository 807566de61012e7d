/* White box: a comm's reusable op buffers (collectives/scratch.c), which the
 * MPI schedules (host memory) and the STAGED backend (pinned memory) share.
 * The STAGED backend's old one-buffer cache recorded the request size instead
 * of the allocation size, so a small op shrank the recorded size and the next
 * large op reallocated: pinned memory was allocated every step. Here a
 * counting allocator stands in for cudaMallocHost, so CI checks the property
 * without a GPU: once warm, repeated steps allocate nothing. */
#include "collectives/scratch.h"
#include "check.h"

static long live, allocs;
static void *count_alloc(size_t bytes)
{
    live++;
    allocs++;
    return malloc(bytes);
}
static void count_free(void *p)
{
    live--;
    free(p);
}

static void *grave_ptr;
static void (*grave_release)(void *);
void coll_graveyard_add(void *ptr, void (*release)(void *))
{
    grave_ptr = ptr;
    grave_release = release;
}

/* One "step" of ops of these sizes, one at a time. */
static void serial_step(coll_scratch *sc, const size_t *sizes, int n)
{
    for (int i = 0; i < n; i++) {
        int cached = -1;
        char *p = coll_scratch_get(sc, sizes[i], &cached);
        CHECK(p != NULL);
        CHECK(cached > 0);
        if (p) p[sizes[i] - 1] = 1; /* the whole request is usable */
        coll_scratch_put(sc, p, cached);
    }
}

int main(void)
{
    coll_scratch sc = {.alloc = count_alloc, .release = count_free};

    /* Large, then small, then large again, step after step (bucket sizes
     * differ: the last bucket of a module is short, the scalar all-reduce is
     * 8 bytes). */
    const size_t sizes[] = {1 << 20, 8, 4000, 1 << 20, 123456};
    serial_step(&sc, sizes, 5);
    unsigned long long warm = sc.allocations;
    CHECK_MSG(warm == 1, "warm-up allocated %llu buffers, want 1 (one op at a time)", warm);
    for (int step = 0; step < 10; step++) serial_step(&sc, sizes, 5);
    CHECK_MSG(sc.allocations == warm, "10 warm steps allocated %llu more buffers, want 0",
              sc.allocations - warm);
    CHECK(sc.allocations == (unsigned long long)allocs);

    /* overlap_comm: two reduce-scatters in flight plus a prefetch, issued and
     * completed in turns. Warm after the first round, then nothing new. */
    for (int round = 0; round < 6; round++) {
        int c[3];
        void *p[3];
        size_t sz[3] = {1 << 20, 1 << 19, 3000};
        for (int i = 0; i < 3; i++) {
            p[i] = coll_scratch_get(&sc, sz[(i + round) % 3], &c[i]);
            CHECK(p[i] && c[i] > 0);
        }
        CHECK(p[0] != p[1] && p[1] != p[2] && p[0] != p[2]);
        for (int i = 0; i < 3; i++) coll_scratch_put(&sc, p[i], c[i]);
        if (round == 0) warm = sc.allocations;
    }
    CHECK_MSG(sc.allocations == warm, "3 ops in flight: %llu allocations after warm-up", sc.allocations - warm);
    CHECK_MSG(live <= COLL_SCRATCH_SLOTS, "%ld buffers alive, at most %d slots", live, COLL_SCRATCH_SLOTS);

    /* More ops in flight than slots: the extra one is its own buffer, freed
     * on put (never cached, never leaked). */
    int c[COLL_SCRATCH_SLOTS + 1];
    void *p[COLL_SCRATCH_SLOTS + 1];
    for (int i = 0; i <= COLL_SCRATCH_SLOTS; i++) p[i] = coll_scratch_get(&sc, 64, &c[i]);
    CHECK(c[COLL_SCRATCH_SLOTS] == 0);
    long before = live;
    coll_scratch_put(&sc, p[COLL_SCRATCH_SLOTS], 0);
    CHECK(live == before - 1);
    for (int i = 0; i < COLL_SCRATCH_SLOTS; i++) coll_scratch_put(&sc, p[i], c[i]);

    /* A request larger than every slot grows one (no extra buffer alive). */
    before = live;
    int cg;
    void *g = coll_scratch_get(&sc, 4 << 20, &cg);
    CHECK(g && cg > 0 && sc.slot[cg - 1].bytes == (size_t)4 << 20);
    CHECK(live == before || live == before + 1); /* +1 only if an empty slot was filled */
    coll_scratch_put(&sc, g, cg);

    /* Abandoned while the transport may still write: the buffer goes to the
     * graveyard with the pinned release, the slot is forgotten. */
    int ca;
    void *a = coll_scratch_get(&sc, 100, &ca);
    coll_scratch_abandon(&sc, a, ca);
    CHECK(grave_ptr == a && grave_release == count_free);
    CHECK(sc.slot[ca - 1].ptr == NULL && sc.slot[ca - 1].bytes == 0 && !sc.slot[ca - 1].busy);
    grave_release(grave_ptr);

    coll_scratch_release(&sc);
    CHECK_MSG(live == 0, "%ld buffers leaked", live);

    /* The host-memory default (no allocator given): malloc/free. */
    coll_scratch plain = {0};
    int cp;
    void *q = coll_scratch_get(&plain, 0, &cp); /* 0 bytes is a 1-byte buffer */
    CHECK(q && cp > 0 && plain.allocations == 1);
    coll_scratch_put(&plain, q, cp);
    coll_scratch_release(&plain);
    return check_exit();
}
