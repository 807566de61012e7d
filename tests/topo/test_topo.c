/* Topology and binding.
 *
 *   test_topo plan      binding plans on this machine and on synthetic ones
 *   test_topo bind      binding this thread takes effect (or warns once)
 *   test_topo bindfail  a binding the OS refuses: one warning, run unbound, OK
 *   test_topo env       local rank / size from launcher variables
 *   test_topo launched  under `tests/mpirun.sh 2`: each real rank finds its
 *                       local rank (0 or 1 of 2) in Open MPI's environment,
 *                       and binds to its own slice (or warns once)
 *
 * Plan properties, for every local size tried: the ranks' CPU sets are
 * pairwise disjoint whenever the plan says `exclusive` (and that holds
 * whenever there are at least as many cores as ranks), every set is
 * non-empty and inside the machine's PUs, each set lies in the domain (NUMA
 * node or GPU) the plan names, and ranks sharing a domain get core counts
 * that differ by at most one. */
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zero/log.h>
#include <zero/topo.h>
#include <zero/experimental.h>

#include "check.h"

#define MAX_PUS 4096
typedef struct { unsigned char bit[MAX_PUS]; } puset;

/* Parse "0-3,8,10-11" (the test's own parser, not hwloc's). */
static int parse_list(const char *s, puset *out)
{
    memset(out, 0, sizeof *out);
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s) return -1;
        if (*end == '-') {
            s = end + 1;
            b = strtol(s, &end, 10);
            if (end == s) return -1;
        }
        if (a < 0 || b < a || b >= MAX_PUS) return -1;
        for (long i = a; i <= b; i++) out->bit[i] = 1;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return 0;
}

static int count(const puset *a)
{
    int n = 0;
    for (int i = 0; i < MAX_PUS; i++) n += a->bit[i];
    return n;
}

static int overlaps(const puset *a, const puset *b)
{
    for (int i = 0; i < MAX_PUS; i++)
        if (a->bit[i] && b->bit[i]) return 1;
    return 0;
}

static int subset(const puset *a, const puset *b)
{
    for (int i = 0; i < MAX_PUS; i++)
        if (a->bit[i] && !b->bit[i]) return 0;
    return 1;
}

static int warnings;
static char last_warning[1024];
static void on_log(zero_log_level level, const char *msg, void *user)
{
    (void)user;
    if (level == ZERO_LOG_WARN) {
        warnings++;
        snprintf(last_warning, sizeof last_warning, "%s", msg);
        fprintf(stderr, "(logged) %s\n", msg);
    }
}

/* Check the plan for local sizes 1..max_size. gpus > 0: rank r drives r % gpus. */
static void check_plans(zero_topo *topo, const char *name, int max_size, int gpus)
{
    zero_topo_summary s;
    CHECK_OK(zero_topo_get_summary(topo, &s));
    puset machine = {{0}}, tmp;
    char buf[ZERO_TOPO_CPUSET_MAX];
    for (int i = 0; i < s.numa_nodes; i++) {
        CHECK_OK(zero_topo_numa_cpuset(topo, i, buf, sizeof buf));
        CHECK(parse_list(buf, &tmp) == 0);
        for (int k = 0; k < MAX_PUS; k++) machine.bit[k] |= tmp.bit[k];
    }
    CHECK_MSG(count(&machine) == s.pus, "%s: NUMA nodes hold %d PUs, summary says %d", name, count(&machine), s.pus);

    puset *sets = malloc((size_t)max_size * sizeof *sets);
    zero_topo_binding *b = malloc((size_t)max_size * sizeof *b);
    for (int ls = 1; ls <= max_size; ls++) {
        for (int r = 0; r < ls; r++) {
            CHECK_OK(zero_topo_plan_binding(topo, r, ls, gpus ? r % gpus : -1, &b[r]));
            CHECK_MSG(parse_list(b[r].cpuset, &sets[r]) == 0, "%s: unparsable \"%s\"", name, b[r].cpuset);
            CHECK_MSG(count(&sets[r]) > 0 && b[r].cores > 0, "%s size %d rank %d: empty", name, ls, r);
            CHECK_MSG(subset(&sets[r], &machine), "%s size %d rank %d: %s outside the machine", name, ls, r,
                      b[r].cpuset);
            CHECK_MSG(b[r].exclusive == (ls <= s.cores), "%s size %d rank %d: exclusive %d with %d cores", name, ls,
                      r, b[r].exclusive, s.cores);
            /* inside the named domain */
            if (b[r].domain >= 0) {
                if (b[r].near_gpu) CHECK_OK(zero_topo_gpu_cpuset(topo, b[r].domain, buf, sizeof buf));
                else CHECK_OK(zero_topo_numa_cpuset(topo, b[r].domain, buf, sizeof buf));
                CHECK(parse_list(buf, &tmp) == 0);
                CHECK_MSG(subset(&sets[r], &tmp), "%s size %d rank %d: %s not inside domain %d (%s)", name, ls, r,
                          b[r].cpuset, b[r].domain, buf);
                CHECK(b[r].near_gpu == (gpus > 0));
            }
            /* the same answer every time: a pure function */
            zero_topo_binding again;
            CHECK_OK(zero_topo_plan_binding(topo, r, ls, gpus ? r % gpus : -1, &again));
            CHECK(strcmp(again.cpuset, b[r].cpuset) == 0);
        }
        for (int r = 0; r < ls; r++)
            for (int q = r + 1; q < ls; q++) {
                if (b[r].exclusive)
                    CHECK_MSG(!overlaps(&sets[r], &sets[q]), "%s size %d: ranks %d (%s) and %d (%s) overlap", name,
                              ls, r, b[r].cpuset, q, b[q].cpuset);
                if (b[r].domain == b[q].domain && b[r].near_gpu == b[q].near_gpu && b[r].exclusive) {
                    int d = b[r].cores - b[q].cores;
                    CHECK_MSG(d >= -1 && d <= 1, "%s size %d: ranks %d and %d get %d and %d cores", name, ls, r, q,
                              b[r].cores, b[q].cores);
                }
            }
    }
    free(sets);
    free(b);
}

static int test_plan(void)
{
    zero_topo *topo = NULL;
    zero_status st = zero_topo_create(&topo);
    if (st == ZERO_UNSUPPORTED) CHECK_SKIP("built without hwloc: %s", zero_last_error());
    CHECK_OK(st);
    zero_topo_summary s;
    CHECK_OK(zero_topo_get_summary(topo, &s));
    CHECK(s.cores >= 1 && s.pus >= s.cores && s.numa_nodes >= 1 && s.is_this_system == 1);
    check_plans(topo, "this machine", s.cores + 2, 0);
    /* bad arguments */
    zero_topo_binding b;
    CHECK(zero_topo_plan_binding(topo, 2, 2, -1, &b) == ZERO_INVALID_ARGUMENT);
    CHECK(strstr(zero_topo_last_error(topo), "local rank 2 of local size 2") != NULL);
    CHECK(zero_topo_plan_binding(topo, 0, 0, -1, &b) == ZERO_INVALID_ARGUMENT);
    CHECK(zero_topo_plan_binding(topo, 0, 1, -2, &b) == ZERO_INVALID_ARGUMENT);
    CHECK(zero_topo_plan_binding(topo, 0, 1, -1, NULL) == ZERO_INVALID_ARGUMENT);
    CHECK(zero_topo_numa_cpuset(topo, 99999, (char[8]){0}, 8) == ZERO_NOT_FOUND);
    CHECK(zero_topo_gpu_cpuset(topo, s.gpus, (char[8]){0}, 8) == ZERO_NOT_FOUND);
    zero_topo_destroy(topo);
    zero_topo_destroy(NULL);

    /* two handles share one loaded topology; each can be destroyed in turn */
    zero_topo *a = NULL, *c = NULL;
    CHECK_OK(zero_topo_create(&a));
    CHECK_OK(zero_topo_create(&c));
    zero_topo_destroy(a);
    if (c) CHECK_OK(zero_topo_get_summary(c, &s));
    zero_topo_destroy(c);

    /* a NUMA machine: 2 packages x 2 nodes x 8 cores x 2 PUs */
    CHECK_OK(zero_topo_create_synthetic(&topo, "pack:2 numa:2 core:8 pu:2"));
    if (topo) {
        CHECK_OK(zero_topo_get_summary(topo, &s));
        CHECK(s.packages == 2 && s.numa_nodes == 4 && s.cores == 32 && s.pus == 64 && s.is_this_system == 0);
        check_plans(topo, "4 NUMA nodes", 36, 0);
        /* 8 ranks: two per node, 4 cores (8 PUs) each, near their node */
        zero_topo_binding b5;
        CHECK_OK(zero_topo_plan_binding(topo, 5, 8, -1, &b5));
        CHECK_MSG(b5.domain == 2 && b5.cores == 4 && !strcmp(b5.cpuset, "40-47"), "rank 5 of 8: %s near %d",
                  b5.cpuset, b5.domain);
        zero_topo_destroy(topo);
    }

    /* GPU locality (set by hand): 4 GPUs, two per package; then overlapping
     * and starved GPU domains, which fall back to slicing the machine */
    CHECK_OK(zero_topo_create_synthetic(&topo, "pack:2 core:8 pu:1"));
    if (topo) {
        const char *near[] = {"0-7", "0-7", "8-15", "8-15"};
        CHECK_OK(zero_topo_set_gpu_cpusets(topo, 4, near));
        CHECK_OK(zero_topo_get_summary(topo, &s));
        CHECK(s.gpus == 4);
        check_plans(topo, "4 GPUs", 18, 4);
        zero_topo_binding g;
        CHECK_OK(zero_topo_plan_binding(topo, 3, 4, 3, &g));
        CHECK_MSG(g.near_gpu == 1 && g.domain == 3 && !strcmp(g.cpuset, "12-15"), "rank 3 of 4: %s", g.cpuset);
        CHECK(zero_topo_plan_binding(topo, 0, 4, 4, &g) == ZERO_INVALID_ARGUMENT); /* no GPU 4 */

        const char *overlap[] = {"0-9", "6-15"};
        CHECK_OK(zero_topo_set_gpu_cpusets(topo, 2, overlap));
        check_plans(topo, "overlapping GPUs", 18, 2);
        CHECK_OK(zero_topo_plan_binding(topo, 0, 2, 0, &g));
        CHECK(g.domain == -1 && g.exclusive == 1);

        const char *starved[] = {"0", "1-15"};
        CHECK_OK(zero_topo_set_gpu_cpusets(topo, 2, starved));
        check_plans(topo, "starved GPU", 18, 2);
        CHECK_OK(zero_topo_plan_binding(topo, 0, 4, 0, &g)); /* ranks 0 and 2 on a 1-core GPU domain */
        CHECK(g.domain == -1);

        const char *bad[] = {"0-x"};
        CHECK(zero_topo_set_gpu_cpusets(topo, 1, bad) == ZERO_INVALID_ARGUMENT);
        CHECK(strstr(zero_topo_last_error(topo), "0-x") != NULL);
        CHECK_OK(zero_topo_set_gpu_cpusets(topo, 0, NULL)); /* back to hwloc's answer */
        zero_topo_destroy(topo);
    }
    CHECK(zero_topo_create_synthetic(&topo, "this is not hwloc syntax") == ZERO_INVALID_ARGUMENT);
    CHECK(topo == NULL);
    return check_exit();
}

static int test_bind(void)
{
    zero_topo *topo = NULL;
    zero_status st = zero_topo_create(&topo);
    if (st == ZERO_UNSUPPORTED) CHECK_SKIP("built without hwloc: %s", zero_last_error());
    CHECK_OK(st);
    if (!topo) return check_exit();
    cpu_set_t before;
    CHECK(sched_getaffinity(0, sizeof before, &before) == 0);
    zero_topo_binding b;
    int rank = 0, size = 1;
    CHECK_OK(zero_topo_bind(topo, rank, size, -1, ZERO_TOPO_BIND_THREAD, &b));
    if (b.bound) {
        /* the thread's affinity is exactly the planned set */
        cpu_set_t now;
        puset want;
        CHECK(sched_getaffinity(0, sizeof now, &now) == 0);
        CHECK(parse_list(b.cpuset, &want) == 0);
        for (int i = 0; i < CPU_SETSIZE && i < MAX_PUS; i++)
            CHECK_MSG(!!CPU_ISSET(i, &now) == want.bit[i], "PU %d: affinity %d, plan %d", i, !!CPU_ISSET(i, &now),
                      want.bit[i]);
        CHECK(warnings == 0);
    } else {
        CHECK_MSG(warnings == 1, "unbound without a warning");
    }
    CHECK(zero_topo_bind(topo, 0, 1, -1, (zero_topo_bind_scope)7, NULL) == ZERO_INVALID_ARGUMENT);
    CHECK(zero_topo_bind(NULL, 0, 1, -1, ZERO_TOPO_BIND_THREAD, NULL) == ZERO_INVALID_ARGUMENT);
    sched_setaffinity(0, sizeof before, &before);
    zero_topo_destroy(topo);

    /* a synthetic topology is not this machine: refused, warned, OK */
    int w = warnings;
    CHECK_OK(zero_topo_create_synthetic(&topo, "core:4 pu:1"));
    if (topo) {
        CHECK_OK(zero_topo_bind(topo, 1, 2, -1, ZERO_TOPO_BIND_PROCESS, &b));
        CHECK(b.bound == 0 && strcmp(b.cpuset, "2-3") == 0);
        CHECK(warnings == w + (w == 0)); /* once per process */
        zero_topo_destroy(topo);
    }
    return check_exit();
}

/* hwloc believes a 64-core synthetic machine is this one, so it really calls
 * sched_setaffinity with PUs 32-63, which do not exist here: the binding
 * fails in the OS, is warned once, and the call still succeeds. */
static int test_bindfail(void)
{
    setenv("HWLOC_THISSYSTEM", "1", 1);
    zero_topo *topo = NULL;
    zero_status st = zero_topo_create_synthetic(&topo, "core:64 pu:1");
    if (st == ZERO_UNSUPPORTED) CHECK_SKIP("built without hwloc: %s", zero_last_error());
    CHECK_OK(st);
    if (!topo) return check_exit();
    zero_topo_summary s;
    CHECK_OK(zero_topo_get_summary(topo, &s));
    if (!s.is_this_system) CHECK_SKIP("this hwloc ignores HWLOC_THISSYSTEM");
    cpu_set_t online;
    sched_getaffinity(0, sizeof online, &online);
    if (CPU_COUNT(&online) >= 32) CHECK_SKIP("this machine has PUs 32-63; the failure cannot be provoked");
    zero_topo_binding b;
    for (int i = 0; i < 3; i++) {
        CHECK_OK(zero_topo_bind(topo, 1, 2, -1, ZERO_TOPO_BIND_THREAD, &b));
        CHECK(b.bound == 0);
        CHECK(strcmp(b.cpuset, "32-63") == 0);
    }
    CHECK_MSG(warnings == 1, "%d warnings for 3 failed bindings; want exactly 1", warnings);
    CHECK_MSG(strstr(last_warning, "running unbound") && strstr(last_warning, "32-63"), "warning: %s", last_warning);
    /* still unbound: the affinity did not change */
    cpu_set_t now;
    sched_getaffinity(0, sizeof now, &now);
    CHECK(CPU_EQUAL(&now, &online));
    zero_topo_destroy(topo);
    return check_exit();
}

static int test_env(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
                                 "MV2_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_LOCAL_RANK",
                                 "PMI_LOCAL_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_LOCALID",
                                 "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NODEID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    int r = -1, n = -1;
    zero_topo_local_rank(&r, &n);
    CHECK(r == 0 && n == 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    zero_topo_local_rank(&r, &n);
    CHECK(r == 2 && n == 4);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "4", 1); /* rank >= size: ignored */
    zero_topo_local_rank(&r, &n);
    CHECK(r == 0 && n == 1);
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_TASKS_PER_NODE", "4(x2),3", 1);
    setenv("SLURM_NODEID", "2", 1);
    zero_topo_local_rank(&r, &n);
    CHECK_MSG(r == 1 && n == 3, "slurm: %d of %d", r, n);
    setenv("SLURM_NODEID", "1", 1);
    zero_topo_local_rank(&r, &n);
    CHECK(r == 1 && n == 4);
    setenv("SLURM_NTASKS_PER_NODE", "8", 1);
    zero_topo_local_rank(&r, &n);
    CHECK(r == 1 && n == 8);
    setenv("LOCAL_RANK", "3", 1);
    setenv("LOCAL_WORLD_SIZE", "5", 1);
    zero_topo_local_rank(&r, NULL);
    CHECK(r == 3);
    zero_topo_local_rank(NULL, NULL);
    return check_exit();
}

static int test_launched(void)
{
    int r = -1, n = -1;
    zero_topo_local_rank(&r, &n);
    check_set_rank(r);
    CHECK_MSG(n == 2 && (r == 0 || r == 1), "local rank %d of %d under a 2-rank launch", r, n);
    zero_topo *topo = NULL;
    zero_status st = zero_topo_create(&topo);
    if (st == ZERO_UNSUPPORTED) CHECK_SKIP("built without hwloc: %s", zero_last_error());
    CHECK_OK(st);
    if (!topo || n != 2) return check_exit();
    zero_topo_binding mine, other;
    CHECK_OK(zero_topo_bind(topo, r, n, -1, ZERO_TOPO_BIND_PROCESS, &mine));
    CHECK_OK(zero_topo_plan_binding(topo, 1 - r, n, -1, &other));
    puset a, b;
    CHECK(parse_list(mine.cpuset, &a) == 0 && parse_list(other.cpuset, &b) == 0);
    zero_topo_summary s;
    CHECK_OK(zero_topo_get_summary(topo, &s));
    if (s.cores >= 2) CHECK_MSG(!overlaps(&a, &b), "ranks share PUs: %s and %s", mine.cpuset, other.cpuset);
    CHECK(mine.bound == 1 || warnings == 1);
    zero_topo_destroy(topo);
    return check_exit();
}

int main(int argc, char **argv)
{
    zero_set_log_handler(on_log, ZERO_LOG_WARN, NULL);
    const char *mode = argc > 1 ? argv[1] : "plan";
    if (!strcmp(mode, "plan")) return test_plan();
    if (!strcmp(mode, "bind")) return test_bind();
    if (!strcmp(mode, "bindfail")) return test_bindfail();
    if (!strcmp(mode, "env")) return test_env();
    if (!strcmp(mode, "launched")) return test_launched();
    fprintf(stderr, "unknown mode %s\n", mode);
    return 1;
}
