/* Planning which cores each local rank gets, and binding to them.
 *
 * The plan is a pure function of (topology, GPU locality, local rank, local
 * size, gpu), so every local rank computes the whole node's plan on its own
 * and the slices come out disjoint without any communication. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"
#include "topo_internal.h"

#if ZERO_HAVE_HWLOC

typedef struct plan_state {
    hwloc_obj_type_t unit; /* cores, or PUs where hwloc found no cores */
    int nunits;
    hwloc_bitmap_t *dom;   /* per local rank: the domain's PUs (NULL: unknown) */
    int *dom_id;           /* GPU ordinal or NUMA node */
    int near_gpu;
} plan_state;

static void free_state(plan_state *ps, int local_size)
{
    if (ps->dom)
        for (int r = 0; r < local_size; r++) hwloc_bitmap_free(ps->dom[r]);
    free(ps->dom);
    free(ps->dom_id);
}

/* Units (cores) whose PUs all lie in `set`, in hwloc logical order. */
static int units_in(hwloc_topology_t t, const plan_state *ps, hwloc_const_bitmap_t set, int *idx, int max)
{
    int n = 0;
    for (int i = 0; i < ps->nunits; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(t, ps->unit, (unsigned)i);
        if (o && o->cpuset && !hwloc_bitmap_iszero(o->cpuset) && hwloc_bitmap_isincluded(o->cpuset, set)) {
            if (idx && n < max) idx[n] = i;
            n++;
        }
    }
    return n;
}

/* 1 when every rank's domain is known, any two domains are equal or
 * disjoint, and every domain has at least as many cores as ranks on it. */
static int domains_usable(hwloc_topology_t t, const plan_state *ps, int local_size)
{
    for (int r = 0; r < local_size; r++) {
        if (!ps->dom[r]) return 0;
        int ranks = 0;
        for (int s = 0; s < local_size; s++) {
            if (!ps->dom[s]) return 0;
            if (hwloc_bitmap_isequal(ps->dom[r], ps->dom[s])) ranks++;
            else if (hwloc_bitmap_intersects(ps->dom[r], ps->dom[s])) return 0;
        }
        if (units_in(t, ps, ps->dom[r], NULL, 0) < ranks) return 0;
    }
    return 1;
}

static zero_status plan(zero_topo *topo, int lr, int ls, int gpu, zero_topo_binding *out,
                        hwloc_bitmap_t result, const char *op)
{
    hwloc_topology_t t = topo->t;
    if (ls < 1 || lr < 0 || lr >= ls)
        return zero_fail(&topo->err, ZERO_INVALID_ARGUMENT, "%s: local rank %d of local size %d", op, lr, ls);
    int ngpu = zero_topo_gpu_count_(topo);
    if (gpu < -1 || (gpu >= 0 && ngpu > 0 && gpu >= ngpu))
        return zero_fail(&topo->err, ZERO_INVALID_ARGUMENT, "%s: local rank %d: gpu %d (%d GPUs known)", op, lr,
                         gpu, ngpu);
    memset(out, 0, sizeof *out);
    out->domain = -1;

    plan_state ps = {.unit = HWLOC_OBJ_CORE};
    ps.nunits = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
    if (ps.nunits <= 0) {
        ps.unit = HWLOC_OBJ_PU;
        ps.nunits = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
    }
    if (ps.nunits <= 0) return zero_fail(&topo->err, ZERO_BACKEND, "%s: hwloc found no cores", op);

    zero_status st = ZERO_OK;
    int *units = NULL;
    ps.dom = calloc((size_t)ls, sizeof *ps.dom);
    ps.dom_id = calloc((size_t)ls, sizeof *ps.dom_id);
    units = calloc((size_t)ps.nunits, sizeof *units);
    if (!ps.dom || !ps.dom_id || !units) {
        st = zero_fail(&topo->err, ZERO_OUT_OF_MEMORY, "%s: out of host memory", op);
        goto done;
    }

    /* Each local rank's domain: its GPU's near PUs, or its NUMA node's. */
    ps.near_gpu = gpu >= 0 && ngpu > 0;
    int nnuma = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
    for (int r = 0; r < ls; r++) {
        hwloc_bitmap_t set = hwloc_bitmap_alloc();
        if (!set) {
            st = zero_fail(&topo->err, ZERO_OUT_OF_MEMORY, "%s: out of host memory", op);
            goto done;
        }
        if (ps.near_gpu) {
            int g = r == lr ? gpu : r % ngpu;
            ps.dom_id[r] = g;
            if (zero_topo_gpu_set_(topo, g, set) != 0) {
                hwloc_bitmap_free(set);
                set = NULL;
            }
        } else if (nnuma > 0) {
            int node = (int)((long long)r * nnuma / ls);
            hwloc_obj_t o = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)node);
            ps.dom_id[r] = node;
            if (o && o->cpuset) hwloc_bitmap_copy(set, o->cpuset);
            else {
                hwloc_bitmap_free(set);
                set = NULL;
            }
        } else {
            ps.dom_id[r] = -1;
            hwloc_bitmap_copy(set, hwloc_topology_get_topology_cpuset(t));
        }
        ps.dom[r] = set;
    }

    int first, count;
    if (domains_usable(t, &ps, ls)) {
        /* Split the domain's cores evenly among the ranks that share it. */
        int k = 0, idx = 0;
        for (int s = 0; s < ls; s++) {
            if (!hwloc_bitmap_isequal(ps.dom[s], ps.dom[lr])) continue;
            if (s < lr) idx++;
            k++;
        }
        int c = units_in(t, &ps, ps.dom[lr], units, ps.nunits);
        first = (int)((long long)idx * c / k);
        count = (int)((long long)(idx + 1) * c / k) - first;
        memmove(units, units + first, (size_t)count * sizeof *units);
        out->domain = ps.dom_id[lr];
        out->near_gpu = ps.near_gpu;
        out->exclusive = 1;
    } else {
        /* No usable locality: an even slice of the whole machine. */
        int c = ps.nunits;
        if (c >= ls) {
            first = (int)((long long)lr * c / ls);
            count = (int)((long long)(lr + 1) * c / ls) - first;
            out->exclusive = 1;
        } else {
            first = lr % c;
            count = 1;
            out->exclusive = 0;
        }
        for (int i = 0; i < count; i++) units[i] = first + i;
    }

    hwloc_bitmap_zero(result);
    for (int i = 0; i < count; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(t, ps.unit, (unsigned)units[i]);
        if (o && o->cpuset) hwloc_bitmap_or(result, result, o->cpuset);
    }
    out->cores = count;
    int need = hwloc_bitmap_list_snprintf(out->cpuset, sizeof out->cpuset, result);
    if (need < 0 || (size_t)need >= sizeof out->cpuset)
        st = zero_fail(&topo->err, ZERO_INTERNAL, "%s: local rank %d: CPU list longer than %d characters", op,
                       lr, ZERO_TOPO_CPUSET_MAX - 1);

done:
    free(units);
    free_state(&ps, ls);
    return st;
}

zero_status zero_topo_plan_binding(zero_topo *topo, int local_rank, int local_size, int gpu,
                                   zero_topo_binding *out)
{
    if (!topo) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_topo_plan_binding: topo is NULL");
    if (!out) return zero_fail(&topo->err, ZERO_INVALID_ARGUMENT, "zero_topo_plan_binding: out is NULL");
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return zero_fail(&topo->err, ZERO_OUT_OF_MEMORY, "zero_topo_plan_binding: out of host memory");
    zero_status st = plan(topo, local_rank, local_size, gpu, out, set, "zero_topo_plan_binding");
    hwloc_bitmap_free(set);
    return st;
}

static atomic_int bind_warned;

/* One warning per process: with many ranks and threads, a broken binding
 * would otherwise repeat the same line thousands of times. */
static void warn_unbound(int lr, int ls, const char *cpuset, const char *why)
{
    if (atomic_exchange(&bind_warned, 1)) return;
    zero_log(ZERO_LOG_WARN, "topology: local rank %d of %d: cannot bind to PUs %s (%s); running unbound", lr, ls,
             cpuset, why);
}

zero_status zero_topo_bind(zero_topo *topo, int local_rank, int local_size, int gpu, zero_topo_bind_scope scope,
                           zero_topo_binding *out)
{
    zero_topo_binding local;
    if (!out) out = &local;
    if (!topo) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_topo_bind: topo is NULL");
    if (scope != ZERO_TOPO_BIND_THREAD && scope != ZERO_TOPO_BIND_PROCESS)
        return zero_fail(&topo->err, ZERO_INVALID_ARGUMENT, "zero_topo_bind: scope %d is not a zero_topo_bind_scope",
                         (int)scope);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return zero_fail(&topo->err, ZERO_OUT_OF_MEMORY, "zero_topo_bind: out of host memory");
    zero_status st = plan(topo, local_rank, local_size, gpu, out, set, "zero_topo_bind");
    out->bound = 0;
    if (st == ZERO_OK) {
        if (!hwloc_topology_is_thissystem(topo->t)) {
            warn_unbound(local_rank, local_size, out->cpuset, "the topology is not this machine's");
        } else {
            int flags = scope == ZERO_TOPO_BIND_PROCESS ? HWLOC_CPUBIND_PROCESS : HWLOC_CPUBIND_THREAD;
            errno = 0;
            if (hwloc_set_cpubind(topo->t, set, flags) != 0) {
                char why[128];
                snprintf(why, sizeof why, "hwloc_set_cpubind: %s", errno ? strerror(errno) : "failed");
                warn_unbound(local_rank, local_size, out->cpuset, why);
            } else {
                out->bound = 1;
                zero_log(ZERO_LOG_INFO, "topology: local rank %d of %d bound to PUs %s (%d cores near %s %d)",
                         local_rank, local_size, out->cpuset, out->cores,
                         out->domain < 0 ? "machine" : out->near_gpu ? "GPU" : "NUMA node", out->domain);
            }
        }
    }
    hwloc_bitmap_free(set);
    return st;
}

#else /* !ZERO_HAVE_HWLOC */

zero_status zero_topo_plan_binding(zero_topo *topo, int local_rank, int local_size, int gpu,
                                   zero_topo_binding *out)
{
    (void)topo, (void)local_rank, (void)local_size, (void)gpu, (void)out;
    return zero_fail(NULL, ZERO_UNSUPPORTED, "zero_topo_plan_binding: libzero was built without hwloc");
}

zero_status zero_topo_bind(zero_topo *topo, int local_rank, int local_size, int gpu, zero_topo_bind_scope scope,
                           zero_topo_binding *out)
{
    (void)topo, (void)local_rank, (void)local_size, (void)gpu, (void)scope;
    if (out) memset(out, 0, sizeof *out);
    return zero_fail(NULL, ZERO_UNSUPPORTED, "zero_topo_bind: libzero was built without hwloc");
}

#endif
