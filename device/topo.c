/* Loading the topology and answering questions about it: counts, the PUs of
 * each NUMA node, the PUs near each GPU. Planning and binding are in
 * topo_bind.c. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"
#include "topo_internal.h"

#if ZERO_HAVE_HWLOC

/* Compile-time check; the run-time twin is in load_shared(). */
#if HWLOC_API_VERSION < 0x00020000
#error "libzero needs hwloc 2.x (HWLOC_API_VERSION >= 0x00020000)"
#endif

#if ZERO_HAVE_CUDA
#include "device/cuda_module.h" /* hwloc's CUDA glue is in the module: it calls the runtime */
#endif

/* ---------------------------------------------------------------- the shared topology */

static pthread_mutex_t shared_mu = PTHREAD_MUTEX_INITIALIZER;
static hwloc_topology_t shared_topo;
static int shared_refs;

static hwloc_topology_t load_shared(void)
{
    /* hwloc keeps its ABI within a major series: a library from another
     * major than the headers we compiled against cannot be trusted. */
    unsigned runtime = hwloc_get_api_version();
    if ((runtime >> 16) != (HWLOC_API_VERSION >> 16)) {
        zero_fail(NULL, ZERO_UNSUPPORTED,
                  "topology: hwloc library API 0x%x does not match the 0x%x libzero was built with",
                  runtime, (unsigned)HWLOC_API_VERSION);
        return NULL;
    }
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0) {
        zero_fail(NULL, ZERO_BACKEND, "topology: hwloc_topology_init failed");
        return NULL;
    }
    if (hwloc_topology_load(t) != 0) {
        hwloc_topology_destroy(t);
        zero_fail(NULL, ZERO_BACKEND, "topology: hwloc_topology_load failed");
        return NULL;
    }
    return t;
}

hwloc_topology_t zero_topo_shared_acquire(void)
{
    static int warned;
    pthread_mutex_lock(&shared_mu);
    if (!shared_topo) {
        shared_topo = load_shared();
        if (!shared_topo && !warned) {
            warned = 1;
            zero_log(ZERO_LOG_WARN, "%s; running without topology (no binding, no NUMA placement)",
                     zero_last_error());
        }
    }
    hwloc_topology_t t = shared_topo;
    if (t) shared_refs++;
    pthread_mutex_unlock(&shared_mu);
    return t;
}

void zero_topo_shared_release(void)
{
    pthread_mutex_lock(&shared_mu);
    if (shared_refs > 0 && --shared_refs == 0) {
        hwloc_topology_destroy(shared_topo);
        shared_topo = NULL;
    }
    pthread_mutex_unlock(&shared_mu);
}

int zero_topo_cuda_cpuset_(hwloc_topology_t t, int ordinal, hwloc_bitmap_t out)
{
#if ZERO_HAVE_CUDA
    if (ordinal < 0 || ordinal >= zero_cuda_device_count_()) return -1;
    if (!hwloc_topology_is_thissystem(t)) return -1;
    if (zero_cu->zero_cuda_topo_cpuset(t, ordinal, out) != 0) return -1; /* loaded: the count was > 0 */
    hwloc_bitmap_and(out, out, hwloc_topology_get_topology_cpuset(t));
    return hwloc_bitmap_iszero(out) ? -1 : 0;
#else
    (void)t;
    (void)ordinal;
    (void)out;
    return -1;
#endif
}

/* ---------------------------------------------------------------- handles */

zero_status zero_topo_create(zero_topo **out)
{
    if (!out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_topo_create: out is NULL");
    *out = NULL;
    zero_topo *topo = calloc(1, sizeof *topo);
    if (!topo) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_topo_create: out of host memory");
    topo->t = zero_topo_shared_acquire();
    if (!topo->t) {
        free(topo);
        return zero_fail_forward(NULL, ZERO_BACKEND, "zero_topo_create: ");
    }
    topo->shared = 1;
    *out = topo;
    return ZERO_OK;
}

zero_status zero_topo_create_synthetic(zero_topo **out, const char *description)
{
    if (!out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_topo_create_synthetic: out is NULL");
    *out = NULL;
    if (!description)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_topo_create_synthetic: description is NULL");
    zero_topo *topo = calloc(1, sizeof *topo);
    if (!topo) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "zero_topo_create_synthetic: out of host memory");
    if (hwloc_topology_init(&topo->t) != 0) {
        free(topo);
        return zero_fail(NULL, ZERO_BACKEND, "zero_topo_create_synthetic: hwloc_topology_init failed");
    }
    if (hwloc_topology_set_synthetic(topo->t, description) != 0) {
        hwloc_topology_destroy(topo->t);
        free(topo);
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT,
                         "zero_topo_create_synthetic: hwloc rejects the description \"%s\"", description);
    }
    if (hwloc_topology_load(topo->t) != 0) {
        hwloc_topology_destroy(topo->t);
        free(topo);
        return zero_fail(NULL, ZERO_BACKEND, "zero_topo_create_synthetic: hwloc_topology_load(\"%s\") failed",
                         description);
    }
    *out = topo;
    return ZERO_OK;
}

static void clear_override(zero_topo *topo)
{
    for (int i = 0; i < topo->gpu_override; i++) hwloc_bitmap_free(topo->gpu_sets[i]);
    free(topo->gpu_sets);
    topo->gpu_sets = NULL;
    topo->gpu_override = 0;
}

void zero_topo_destroy(zero_topo *topo)
{
    if (!topo) return;
    clear_override(topo);
    if (topo->shared) zero_topo_shared_release();
    else hwloc_topology_destroy(topo->t);
    free(topo);
}

/* ---------------------------------------------------------------- questions */

static int count_type(hwloc_topology_t t, hwloc_obj_type_t type)
{
    int n = hwloc_get_nbobjs_by_type(t, type);
    return n < 0 ? 0 : n; /* -1: at several depths, not for these types */
}

int zero_topo_gpu_count_(zero_topo *topo)
{
    if (topo->gpu_override > 0) return topo->gpu_override;
#if ZERO_HAVE_CUDA
    if (!hwloc_topology_is_thissystem(topo->t)) return 0;
    int n = zero_cuda_device_count_();
    return n > 0 ? n : 0;
#else
    return 0;
#endif
}

int zero_topo_gpu_set_(zero_topo *topo, int gpu, hwloc_bitmap_t out)
{
    if (gpu < 0 || gpu >= zero_topo_gpu_count_(topo)) return -1;
    if (topo->gpu_override > 0) {
        hwloc_bitmap_and(out, topo->gpu_sets[gpu], hwloc_topology_get_topology_cpuset(topo->t));
        return hwloc_bitmap_iszero(out) ? -1 : 0;
    }
    return zero_topo_cuda_cpuset_(topo->t, gpu, out);
}

zero_status zero_topo_get_summary(zero_topo *topo, zero_topo_summary *out)
{
    if (!topo) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_topo_get_summary: topo is NULL");
    if (!out) return zero_fail(&topo->err, ZERO_INVALID_ARGUMENT, "zero_topo_get_summary: out is NULL");
    memset(out, 0, sizeof *out);
    out->packages = count_type(topo->t, HWLOC_OBJ_PACKAGE);
    out->numa_nodes = count_type(topo->t, HWLOC_OBJ_NUMANODE);
    out->cores = count_type(topo->t, HWLOC_OBJ_CORE);
    out->pus = count_type(topo->t, HWLOC_OBJ_PU);
    out->gpus = zero_topo_gpu_count_(topo);
    out->is_this_system = hwloc_topology_is_thissystem(topo->t);
    return ZERO_OK;
}

static zero_status print_set(zero_topo *topo, hwloc_const_bitmap_t set, char *buf, size_t len,
                             const char *op)
{
    int need = hwloc_bitmap_list_snprintf(buf, len, set);
    if (need < 0) return zero_fail(&topo->err, ZERO_BACKEND, "%s: hwloc_bitmap_list_snprintf failed", op);
    if ((size_t)need >= len)
        return zero_fail(&topo->err, ZERO_INVALID_ARGUMENT, "%s: buffer of %zu bytes is too small (%d needed)",
                         op, len, need + 1);
    return ZERO_OK;
}

zero_status zero_topo_numa_cpuset(zero_topo *topo, int node, char *buf, size_t len)
{
    if (!topo) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_topo_numa_cpuset: topo is NULL");
    if (!buf || len == 0)
        return zero_fail(&topo->err, ZERO_INVALID_ARGUMENT, "zero_topo_numa_cpuset: buf is NULL or empty");
    hwloc_obj_t obj = node >= 0 ? hwloc_get_obj_by_type(topo->t, HWLOC_OBJ_NUMANODE, (unsigned)node) : NULL;
    if (!obj)
        return zero_fail(&topo->err, ZERO_NOT_FOUND, "zero_topo_numa_cpuset: no NUMA node %d (%d present)",
                         node, count_type(topo->t, HWLOC_OBJ_NUMANODE));
    return print_set(topo, obj->cpuset, buf, len, "zero_topo_numa_cpuset");
}

zero_status zero_topo_gpu_cpuset(zero_topo *topo, int gpu, char *buf, size_t len)
{
    if (!topo) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_topo_gpu_cpuset: topo is NULL");
    if (!buf || len == 0)
        return zero_fail(&topo->err, ZERO_INVALID_ARGUMENT, "zero_topo_gpu_cpuset: buf is NULL or empty");
    int count = zero_topo_gpu_count_(topo);
    if (gpu < 0 || gpu >= count)
        return zero_fail(&topo->err, ZERO_NOT_FOUND, "zero_topo_gpu_cpuset: no GPU %d (%d known)", gpu, count);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return zero_fail(&topo->err, ZERO_OUT_OF_MEMORY, "zero_topo_gpu_cpuset: out of host memory");
    zero_status st;
    if (zero_topo_gpu_set_(topo, gpu, set) != 0)
        st = zero_fail(&topo->err, ZERO_NOT_FOUND, "zero_topo_gpu_cpuset: hwloc knows no CPUs near GPU %d",
                       gpu);
    else
        st = print_set(topo, set, buf, len, "zero_topo_gpu_cpuset");
    hwloc_bitmap_free(set);
    return st;
}

zero_status zero_topo_set_gpu_cpusets(zero_topo *topo, int count, const char *const *cpusets)
{
    if (!topo) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "zero_topo_set_gpu_cpusets: topo is NULL");
    if (count < 0 || (count > 0 && !cpusets))
        return zero_fail(&topo->err, ZERO_INVALID_ARGUMENT,
                         "zero_topo_set_gpu_cpusets: count %d with cpusets %s", count,
                         cpusets ? "given" : "NULL");
    hwloc_bitmap_t *sets = count ? calloc((size_t)count, sizeof *sets) : NULL;
    if (count && !sets)
        return zero_fail(&topo->err, ZERO_OUT_OF_MEMORY, "zero_topo_set_gpu_cpusets: out of host memory");
    for (int i = 0; i < count; i++) {
        sets[i] = hwloc_bitmap_alloc();
        if (!sets[i] || !cpusets[i] || hwloc_bitmap_list_sscanf(sets[i], cpusets[i]) != 0) {
            zero_status st = zero_fail(&topo->err, ZERO_INVALID_ARGUMENT,
                                       "zero_topo_set_gpu_cpusets: GPU %d: \"%s\" is not a CPU list like 0-3,8",
                                       i, cpusets[i] ? cpusets[i] : "(null)");
            for (int j = 0; j <= i; j++) hwloc_bitmap_free(sets[j]);
            free(sets);
            return st;
        }
    }
    clear_override(topo);
    topo->gpu_sets = sets;
    topo->gpu_override = count;
    return ZERO_OK;
}

const char *zero_topo_last_error(const zero_topo *topo)
{
    return topo ? topo->err.msg : "zero_topo_last_error: topo is NULL";
}

#else /* !ZERO_HAVE_HWLOC ---------------------------------------------------- */

#define NO_HWLOC(op) zero_fail(NULL, ZERO_UNSUPPORTED, op ": libzero was built without hwloc")

zero_status zero_topo_create(zero_topo **out)
{
    if (out) *out = NULL;
    return NO_HWLOC("zero_topo_create");
}

zero_status zero_topo_create_synthetic(zero_topo **out, const char *description)
{
    (void)description;
    if (out) *out = NULL;
    return NO_HWLOC("zero_topo_create_synthetic");
}

void zero_topo_destroy(zero_topo *topo) { free(topo); }

const char *zero_topo_last_error(const zero_topo *topo)
{
    return topo ? topo->err.msg : "libzero was built without hwloc";
}

zero_status zero_topo_get_summary(zero_topo *topo, zero_topo_summary *out)
{
    (void)topo;
    (void)out;
    return NO_HWLOC("zero_topo_get_summary");
}

zero_status zero_topo_numa_cpuset(zero_topo *topo, int node, char *buf, size_t len)
{
    (void)topo, (void)node, (void)buf, (void)len;
    return NO_HWLOC("zero_topo_numa_cpuset");
}

zero_status zero_topo_gpu_cpuset(zero_topo *topo, int gpu, char *buf, size_t len)
{
    (void)topo, (void)gpu, (void)buf, (void)len;
    return NO_HWLOC("zero_topo_gpu_cpuset");
}

zero_status zero_topo_set_gpu_cpusets(zero_topo *topo, int count, const char *const *cpusets)
{
    (void)topo, (void)count, (void)cpusets;
    return NO_HWLOC("zero_topo_set_gpu_cpusets");
}

#endif
