/* LOCAL: a group of one rank without any transport. Every op is a copy of
 * this rank's own data (a sum or max over one value is that value), done at
 * issue time, so nothing ever waits. */
#include "comm_internal.h"

#include <string.h>

static zero_status local_init_world(zero_comm *c, const zero_comm_config *cfg)
{
    (void)cfg;
    ZERO_TRY(coll_comm_set_members(c, 0, 1));
    c->world_ranks[0] = 0;
    return ZERO_OK;
}

static zero_status local_start(zero_comm *c, zero_request *req)
{
    (void)c;
    const coll_args *a = &req->args;
    size_t es = zero_dtype_size(a->dtype), bytes = a->count * es;
    /* size 1: every op's result is this rank's input; in-place is a no-op.
     * An all-to-all(-v) copies the one chunk to itself (ops.c checked that
     * its send and recv counts agree). */
    if (coll_is_a2a(a->kind)) {
        coll_a2a_chunk k = coll_a2a_peer(a, 1, 0);
        if (k.send_count)
            memcpy((char *)a->recv + k.recv_displ * es, (const char *)a->send + k.send_displ * es,
                   k.send_count * es);
    } else if (a->kind != ZERO_OP_BARRIER && a->send != a->recv && a->send && a->recv) {
        memmove(a->recv, a->send, bytes);
    }
    req->done = 1;
    return ZERO_OK;
}

static zero_status local_test(zero_comm *c, zero_request *req, int *done)
{
    (void)c;
    (void)req;
    *done = 1;
    return ZERO_OK;
}

static void local_abandon(zero_comm *c, zero_request *req)
{
    (void)c;
    (void)req;
}

static zero_status local_split(zero_comm *parent, int color, int key, zero_comm *child)
{
    (void)color;
    (void)key;
    ZERO_TRY(coll_comm_set_members(child, 0, 1));
    child->world_ranks[0] = parent->world_ranks[0];
    return ZERO_OK;
}

static void local_destroy(zero_comm *c) { (void)c; }

const coll_backend coll_backend_local = {
    .name = "local",
    .init_world = local_init_world,
    .start = local_start,
    .test = local_test,
    .abandon = local_abandon,
    .split = local_split,
    .destroy = local_destroy,
};
