#include "bench_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench_util.h"

const char bench_run_usage[] =
    "  --params N          target parameter count (the model lands just under it)\n"
    "  --layers N          MLP blocks, one module each (default 8)\n"
    "  --world W           check the world size is W (run under tests/mpirun.sh W)\n"
    "  --dtype D           compute dtype: fp32, bf16, fp16\n"
    "  --optimizer O       adamw (default) or sgd; --momentum M for sgd\n"
    "  --bucket N          reduce_bucket_size, elements (default 5e8, DeepSpeed's)\n"
    "  --persistence N     stage3_param_persistence_threshold (default 1e5)\n"
    "  --prefetch N        stage3_prefetch_bucket_size (default 5e7)\n"
    "  --overlap 0|1       overlap_comm\n"
    "  --stages LIST       e.g. 0,1,2,3 (default all)\n"
    "  --steps N           measured steps\n"
    "  --threads N         OpenMP threads per rank for the engine's CPU kernels\n"
    "                      (default: online cores / ranks on this node, at least 1)\n"
    "  --clock wall|cpu    stepcost: time by the wall clock (default) or by the process's CPU\n"
    "                      time (a shared machine's other load then does not count)\n"
    "  --json FILE, --csv FILE   machine-readable results (rank 0 writes)\n";

int bench_run_parse(bench_run_opts *o, int argc, char **argv, const char *cmd)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x = 0;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!v) {
            bad = 1;
        } else if (!strcmp(a, "--params")) {
            bad = bench_parse_count(v, &o->params) || o->params < 1000;
        } else if (!strcmp(a, "--layers")) {
            bad = bench_parse_count(v, &x) || x < 1 || x > 64;
            o->layers = (int)x;
        } else if (!strcmp(a, "--world")) {
            bad = bench_parse_count(v, &x) || x < 1;
            o->world = (int)x;
        } else if (!strcmp(a, "--dtype")) {
            bad = bench_parse_dtype(v, &o->dtype);
        } else if (!strcmp(a, "--optimizer")) {
            if (!strcmp(v, "adamw")) o->optimizer = ZERO_OPTIM_ADAMW;
            else if (!strcmp(v, "sgd")) o->optimizer = ZERO_OPTIM_SGD;
            else bad = 1;
        } else if (!strcmp(a, "--momentum")) {
            bad = bench_parse_count(v, &o->momentum);
        } else if (!strcmp(a, "--bucket")) {
            bad = bench_parse_count(v, &o->bucket) || o->bucket < 1;
        } else if (!strcmp(a, "--persistence")) {
            bad = bench_parse_count(v, &o->persistence);
        } else if (!strcmp(a, "--prefetch")) {
            bad = bench_parse_count(v, &o->prefetch);
        } else if (!strcmp(a, "--overlap")) {
            o->overlap = atoi(v) != 0;
        } else if (!strcmp(a, "--stages")) {
            bad = bench_parse_stages(v, &o->stage_mask);
        } else if (!strcmp(a, "--steps")) {
            bad = bench_parse_count(v, &x) || x < 1;
            o->steps = (int)x;
        } else if (!strcmp(a, "--warmup")) {
            bad = bench_parse_count(v, &x);
            o->warmup = (int)x;
        } else if (!strcmp(a, "--gemm")) {
            bad = bench_parse_count(v, &x) || x > 4096;
            o->gemm_n = (int)x;
        } else if (!strcmp(a, "--gemm-reps")) {
            bad = bench_parse_count(v, &x) || x < 1;
            o->gemm_reps = (int)x;
        } else if (!strcmp(a, "--dp-sizes")) {
            o->ndp = 0;
            for (const char *q = v; *q && !bad;) {
                char *end = NULL;
                long d = strtol(q, &end, 10);
                bad = end == q || d < 1 || d > 1 << 20 || o->ndp == BENCH_MAX_DP_SIZES || (*end && *end != ',');
                if (!bad) o->dp_sizes[o->ndp++] = (int)d;
                q = *end ? end + 1 : end;
            }
            bad = bad || o->ndp == 0;
        } else if (!strcmp(a, "--threads")) {
            bad = bench_parse_count(v, &x) || x < 1 || x > 4096;
            o->threads = (int)x;
        } else if (!strcmp(a, "--clock")) {
            bad = !v || (strcmp(v, "wall") && strcmp(v, "cpu"));
            o->cpu_clock = v && !strcmp(v, "cpu");
        } else if (!strcmp(a, "--json")) {
            o->json_path = v;
        } else if (!strcmp(a, "--csv")) {
            o->csv_path = v;
        } else {
            bad = 1;
        }
        if (bad) {
            fprintf(stderr, "zero-bench %s: bad or incomplete option '%s'%s%s\n", cmd, a, v ? " " : "",
                    v ? v : "");
            return 2;
        }
        i++;
    }
    return 0;
}

static int threads_used = 1;

int bench_run_threads(void) { return threads_used; }

/* Each rank's engine runs its CPU optimizer with OpenMP. With several ranks
 * on a node and OpenMP's default of one thread per core in every rank, the
 * threads oversubscribe the cores and spin against each other and against
 * MPI's polling: we measured steps 20x slower on 2 cores with 2 ranks. A
 * trainer divides the cores among its ranks; so does the benchmark. */
static void set_threads(const bench_run_opts *o)
{
    int n = o->threads;
    if (n <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        long ranks = local ? strtol(local, NULL, 10) : 1;
        if (ranks < 1) ranks = 1;
        n = cores > ranks ? (int)(cores / ranks) : 1;
    }
#ifdef _OPENMP
    omp_set_num_threads(n);
    threads_used = n;
#else
    threads_used = 1;
#endif
}

int bench_run_setup(const bench_run_opts *o, zero_comm **world, zero_device **dev, const char *cmd)
{
    set_threads(o);
    *world = NULL;
    *dev = NULL;
    if (bench_failed(zero_comm_create_world(world, NULL), cmd)) return 1;
    int size = zero_comm_get_size(*world);
    if (o->world && o->world != size) {
        if (zero_comm_get_rank(*world) == 0)
            fprintf(stderr, "zero-bench %s: --world %d but %d ranks are running (use tests/mpirun.sh %d)\n",
                    cmd, o->world, size, o->world);
        zero_comm_destroy(*world);
        *world = NULL;
        return 1;
    }
    if (bench_failed(zero_device_create(dev, ZERO_DEVICE_CPU, 0), cmd)) {
        zero_comm_destroy(*world);
        *world = NULL;
        return 1;
    }
    return 0;
}

zero_config bench_run_config(const bench_run_opts *o, int stage)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.compute_dtype = o->dtype;
    c.optimizer = o->optimizer;
    c.momentum = o->momentum;
    c.reduce_bucket_size = (uint64_t)o->bucket;
    c.allgather_bucket_size = (uint64_t)o->bucket;
    c.stage3_param_persistence_threshold = (uint64_t)o->persistence;
    c.stage3_prefetch_bucket_size = (uint64_t)o->prefetch;
    c.overlap_comm = o->overlap;
    /* A static scale keeps fp16 runs from skipping their first steps while the
     * dynamic scale settles; the benchmark is about bytes and time. */
    if (o->dtype == ZERO_F16) c.loss_scale = 1.0;
    return c;
}
