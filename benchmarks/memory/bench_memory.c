/* zero-bench memory: real steps per stage on the CPU backend; per-rank
 * bytes by category from the engine's memory report, against the ZeRO
 * formula plus the buffers the engine declares, and the process peak RSS.
 *
 * Stages run one after another in one process. Before each, the kernel's
 * peak-RSS mark is reset (/proc/self/clear_refs), so "peak RSS" is what this
 * stage made resident. The allocator is left as a user's process has it (no
 * mallopt here): the CPU device maps its large buffers itself and returns
 * them when freed (device/cpu_backend.c), which is what keeps an earlier
 * stage's memory from hiding or inflating a later one's. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/proc_mem.h"
#include "bench_cmds.h"
#include "bench_model.h"
#include "bench_run.h"
#include "bench_util.h"

enum { C = ZERO_MEM_CATEGORY_COUNT };

/* One rank's result for one stage, exchanged as int64 (all counts < 2^63). */
typedef struct mem_record {
    uint64_t measured[C];
    uint64_t expected[C];
    uint64_t formula[C];
    uint64_t engine_peak_total;
    uint64_t cache;  /* the cache of released module buffers after the steps (emptied before `measured`) */
    uint64_t rss_peak_delta;
    uint64_t padded_numel;
    uint64_t numel;
    uint64_t rss_ok; /* 1 if the peak mark could be reset */
} mem_record;

#define REC_WORDS (sizeof(mem_record) / sizeof(uint64_t))

static void usage(void)
{
    fprintf(stderr,
            "usage: tests/mpirun.sh W zero-bench memory --params N [--world W] [options]\n"
            "  Runs --steps real steps per stage and reports, per rank, the engine's bytes\n"
            "  per category against the ZeRO formula + declared buffers (exit 3 if any\n"
            "  differs) and the process peak RSS. Defaults: --params 1e7 --dtype bf16\n"
            "  --steps 2.\n%s"
            "  --dp-sizes LIST     e.g. 1,2,4: measure each dp size in one run (the world is\n"
            "                      cut into groups of that size; group 0 is reported);\n"
            "                      default: the whole world\n",
            bench_run_usage);
}

static uint64_t sum(const uint64_t *v)
{
    uint64_t s = 0;
    for (int c = 0; c < C; c++) s += v[c];
    return s;
}

/* Run one stage; fills *rec. Returns 0 or 1 (message printed). */
static int run_stage(const bench_run_opts *o, bench_model *m, zero_comm *world, zero_device *dev, int stage,
                     mem_record *rec)
{
    memset(rec, 0, sizeof *rec);
    const int rank = zero_comm_get_rank(world);
    zero_config cfg = bench_run_config(o, stage);
    zero_engine *e = NULL;
    int rc = 1;
    char what[32];
    snprintf(what, sizeof what, "memory stage %d", stage);

    if (bench_failed(zero_barrier(world), what)) return 1;
    rec->rss_ok = proc_reset_peak();
    const long base = proc_rss_bytes();

    if (bench_failed(zero_engine_create(&e, &cfg, world, dev), what)) return 1;
    zero_status st = bench_model_register(m, e);
    for (int s = 0; s < o->steps && st == ZERO_OK; s++) st = bench_model_step(m, e, dev, rank, NULL);
    if (st != ZERO_OK) {
        fprintf(stderr, "zero-bench %s (rank %d): %s: %s\n", what, rank, zero_status_name(st),
                zero_engine_last_error(e));
        goto out;
    }

    zero_memory_report got, formula, expected;
    zero_plan_info plan;
    /* The cache of released module buffers is a reading, not a formula:
     * note it, empty it, and the rest must equal the formula exactly. */
    if (bench_failed(zero_engine_get_memory_report(e, &got), what)) goto out;
    rec->cache = got.bytes[ZERO_MEM_CACHE];
    if (bench_failed(zero_engine_empty_cache(e), what)) goto out;
    if (bench_failed(zero_engine_get_memory_report(e, &got), what)) goto out;
    if (bench_failed(bench_expected_memory(e, &cfg, &formula, &expected), what)) goto out;
    if (bench_failed(zero_engine_get_plan_info(e, &plan), what)) goto out;
    const long peak = proc_hwm_bytes();
    if (base < 0 || peak < 0) rec->rss_ok = 0;
    for (int c = 0; c < C; c++) {
        rec->measured[c] = got.bytes[c];
        rec->expected[c] = expected.bytes[c];
        rec->formula[c] = formula.bytes[c];
    }
    rec->engine_peak_total = got.peak_total;
    rec->rss_peak_delta = peak > base ? (uint64_t)(peak - base) : 0;
    rec->padded_numel = plan.padded_numel;
    rec->numel = plan.numel;
    rc = 0;
out:
    zero_engine_destroy(e);
    return rc;
}

static json_t *category_object(const uint64_t *v)
{
    json_t *o = json_object();
    for (int c = 0; c < C; c++)
        json_object_set_new(o, zero_mem_category_name((zero_mem_category)c), json_integer((json_int_t)v[c]));
    return o;
}

/* One dp size's results: nstages x dp records, stage-major. */
typedef struct mem_run {
    int dp;
    mem_record *rec;
} mem_run;

static json_t *stages_json(const mem_run *run, const int *stages, int nstages)
{
    json_t *jst = json_array();
    for (int i = 0; i < nstages; i++) {
        json_t *s = json_object(), *ranks = json_array();
        json_object_set_new(s, "stage", json_integer(stages[i]));
        json_object_set_new(s, "padded_numel", json_integer((json_int_t)run->rec[(size_t)i * run->dp].padded_numel));
        for (int r = 0; r < run->dp; r++) {
            const mem_record *rec = &run->rec[(size_t)i * run->dp + r];
            json_t *jr = json_object();
            json_object_set_new(jr, "rank", json_integer(r));
            json_object_set_new(jr, "measured", category_object(rec->measured));
            json_object_set_new(jr, "expected", category_object(rec->expected));
            json_object_set_new(jr, "formula", category_object(rec->formula));
            json_object_set_new(jr, "measured_total", json_integer((json_int_t)sum(rec->measured)));
            json_object_set_new(jr, "expected_total", json_integer((json_int_t)sum(rec->expected)));
            json_object_set_new(jr, "formula_total", json_integer((json_int_t)sum(rec->formula)));
            json_object_set_new(jr, "exact", json_boolean(!memcmp(rec->measured, rec->expected, sizeof rec->measured)));
            json_object_set_new(jr, "engine_peak_total", json_integer((json_int_t)rec->engine_peak_total));
            json_object_set_new(jr, "cache_before_empty", json_integer((json_int_t)rec->cache));
            if (rec->rss_ok)
                json_object_set_new(jr, "rss_peak_delta", json_integer((json_int_t)rec->rss_peak_delta));
            else
                json_object_set_new(jr, "rss_peak_delta", json_null());
            json_array_append_new(ranks, jr);
        }
        json_object_set_new(s, "ranks", ranks);
        json_array_append_new(jst, s);
    }
    return jst;
}

/* Top-level "world" and "stages" hold the last (largest) dp size; "runs"
 * holds every dp size measured, in order. */
static int write_json(const bench_run_opts *o, const bench_model *m, const mem_run *runs, int nruns,
                      const int *stages, int nstages)
{
    json_t *root = json_object(), *cats = json_array(), *jruns = json_array();
    for (int c = 0; c < C; c++)
        json_array_append_new(cats, json_string(zero_mem_category_name((zero_mem_category)c)));
    json_object_set_new(root, "benchmark", json_string("memory"));
    json_object_set_new(root, "params_target", json_real(o->params));
    json_object_set_new(root, "numel", json_integer((json_int_t)m->numel));
    json_object_set_new(root, "num_params", json_integer(m->num_params));
    json_object_set_new(root, "num_modules", json_integer(m->num_modules));
    json_object_set_new(root, "hidden", json_integer(m->hidden));
    json_object_set_new(root, "dtype", json_string(zero_dtype_name(o->dtype)));
    json_object_set_new(root, "optimizer", json_string(o->optimizer == ZERO_OPTIM_ADAMW ? "adamw" : "sgd"));
    json_object_set_new(root, "overlap_comm", json_integer(o->overlap));
    json_object_set_new(root, "reduce_bucket_size", json_integer((json_int_t)o->bucket));
    json_object_set_new(root, "steps", json_integer(o->steps));
    json_object_set_new(root, "threads_per_rank", json_integer(bench_run_threads()));
    json_object_set_new(root, "categories", cats);
    for (int k = 0; k < nruns; k++) {
        json_t *jr = json_object();
        json_object_set_new(jr, "world", json_integer(runs[k].dp));
        json_object_set_new(jr, "stages", stages_json(&runs[k], stages, nstages));
        json_array_append_new(jruns, jr);
    }
    json_object_set_new(root, "world", json_integer(runs[nruns - 1].dp));
    json_object_set_new(root, "stages", stages_json(&runs[nruns - 1], stages, nstages));
    json_object_set_new(root, "runs", jruns);
    int rc = json_dump_file(root, o->json_path, JSON_INDENT(2));
    json_decref(root);
    if (rc) fprintf(stderr, "zero-bench memory: cannot write %s\n", o->json_path);
    return rc ? 1 : 0;
}

static int write_csv(const char *path, const mem_run *runs, int nruns, const int *stages, int nstages)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "zero-bench memory: cannot write %s\n", path);
        return 1;
    }
    fprintf(f, "world,stage,rank,category,measured_bytes,expected_bytes,formula_bytes\n");
    for (int k = 0; k < nruns; k++)
        for (int i = 0; i < nstages; i++)
            for (int r = 0; r < runs[k].dp; r++) {
                const mem_record *rec = &runs[k].rec[(size_t)i * runs[k].dp + r];
                for (int c = 0; c < C; c++)
                    fprintf(f, "%d,%d,%d,%s,%llu,%llu,%llu\n", runs[k].dp, stages[i], r,
                            zero_mem_category_name((zero_mem_category)c), (unsigned long long)rec->measured[c],
                            (unsigned long long)rec->expected[c],
                            (unsigned long long)rec->formula[c]);
            }
    return fclose(f) ? 1 : 0;
}

static void print_table(const bench_run_opts *o, const bench_model *m, const mem_run *run, const int *stages,
                        int nstages)
{
    const int world = run->dp;
    printf("zero-bench memory: %llu params (%d tensors, %d modules, h=%d), dp %d, %s, %s, %d step%s\n",
           (unsigned long long)m->numel, m->num_params, m->num_modules, m->hidden, world,
           zero_dtype_name(o->dtype), o->optimizer == ZERO_OPTIM_ADAMW ? "AdamW" : "SGD", o->steps,
           o->steps == 1 ? "" : "s");
    printf("MB = 1e6 bytes. expected = ZeRO formula (padded count) + declared buffers, against the report\n"
           "after zero_engine_empty_cache; cache = what it freed (released module buffers kept between steps);\n"
           "rss = peak RSS growth during the stage\n");
    printf("%-5s %-4s %9s %9s %9s %9s %9s %7s %10s %10s %10s %6s %8s %10s %10s %6s\n", "stage", "rank", "params",
           "grads", "master", "moments", "buffers", "other", "total", "expected", "formula", "exact", "cache",
           "eng.peak", "rss", "rss/pk");
    for (int i = 0; i < nstages; i++)
        for (int r = 0; r < world; r++) {
            const mem_record *rec = &run->rec[(size_t)i * world + r];
            const uint64_t *v = rec->measured;
            int exact = !memcmp(rec->measured, rec->expected, sizeof rec->measured);
            printf("%-5d %-4d %9.3f %9.3f %9.3f %9.3f %9.3f %7.3f %10.3f %10.3f %10.3f %6s %8.3f %10.3f ", stages[i],
                   r, v[0] / 1e6, v[1] / 1e6, v[2] / 1e6, v[3] / 1e6, v[4] / 1e6, v[5] / 1e6, sum(v) / 1e6,
                   sum(rec->expected) / 1e6, sum(rec->formula) / 1e6, exact ? "yes" : "NO", rec->cache / 1e6,
                   rec->engine_peak_total / 1e6);
            if (rec->rss_ok && rec->engine_peak_total)
                printf("%10.3f %6.3f\n", rec->rss_peak_delta / 1e6,
                       (double)rec->rss_peak_delta / (double)rec->engine_peak_total);
            else
                printf("%10s %6s\n", "n/a", "n/a");
            if (!exact)
                for (int c = 0; c < C; c++)
                    if (rec->measured[c] != rec->expected[c])
                        printf("      MISMATCH %s: measured %llu, expected %llu (diff %lld bytes)\n",
                               zero_mem_category_name((zero_mem_category)c), (unsigned long long)rec->measured[c],
                               (unsigned long long)rec->expected[c],
                               (long long)(rec->measured[c] - rec->expected[c]));
        }
}

/* All stages at dp size `dp`: the world is cut into groups of dp ranks
 * (world ranks [g*dp, (g+1)*dp)); every group runs, group 0 is reported.
 * Collective over the world. */
static int run_dp(const bench_run_opts *o, bench_model *m, zero_comm *world, zero_device *dev, int dp,
                  const int *stages, int nstages, mem_run *out)
{
    const int rank = zero_comm_get_rank(world), size = zero_comm_get_size(world);
    out->dp = dp;
    out->rec = calloc((size_t)nstages * (size_t)dp, sizeof *out->rec);
    mem_record *all = calloc((size_t)size, sizeof *all);
    zero_comm *group = world;
    int rc = out->rec && all ? 0 : 1;
    if (!rc && dp != size) rc = bench_failed(zero_comm_split(world, rank / dp, rank, &group), "memory: comm split");
    for (int i = 0; i < nstages && !rc; i++) {
        mem_record mine;
        rc = run_stage(o, m, group, dev, stages[i], &mine);
        if (!rc)
            rc = bench_failed(zero_allgather(world, &mine, all, REC_WORDS, ZERO_I64), "memory: allgather of results");
        if (!rc) memcpy(&out->rec[(size_t)i * dp], all, (size_t)dp * sizeof *all); /* group 0 */
    }
    if (group != world) zero_comm_destroy(group);
    free(all);
    return rc;
}

int bench_cmd_memory(int argc, char **argv)
{
    bench_run_opts o = {
        .params = 1e7, .layers = 8, .dtype = ZERO_BF16, .optimizer = ZERO_OPTIM_ADAMW, .bucket = 5e8,
        .persistence = 1e5, .prefetch = 5e7, .overlap = 0, .stage_mask = 0xF, .steps = 2,
    };
    int prc = bench_run_parse(&o, argc, argv, "memory");
    if (prc) {
        usage();
        return prc == 1 ? 0 : 2;
    }
    bench_model m;
    if (bench_model_init(&m, o.params, o.layers)) {
        fprintf(stderr, "zero-bench memory: --params must be at least 1000\n");
        return 2;
    }
    zero_comm *world = NULL;
    zero_device *dev = NULL;
    if (bench_run_setup(&o, &world, &dev, "memory")) return 1;
    const int rank = zero_comm_get_rank(world), size = zero_comm_get_size(world);

    int stages[4], nstages = 0;
    for (int s = 0; s < 4; s++)
        if (o.stage_mask & (1u << s)) stages[nstages++] = s;
    int dps[BENCH_MAX_DP_SIZES], ndps = o.ndp;
    if (ndps == 0) dps[ndps++] = size;
    else memcpy(dps, o.dp_sizes, (size_t)ndps * sizeof *dps);
    for (int k = 0; k < ndps; k++)
        if (dps[k] > size || size % dps[k]) {
            if (rank == 0)
                fprintf(stderr, "zero-bench memory: --dp-sizes %d does not divide the %d running ranks\n", dps[k],
                        size);
            zero_device_destroy(dev);
            zero_comm_destroy(world);
            return 2;
        }

    mem_run runs[BENCH_MAX_DP_SIZES] = {{0}};
    int rc = 0;
    for (int k = 0; k < ndps && !rc; k++) rc = run_dp(&o, &m, world, dev, dps[k], stages, nstages, &runs[k]);
    int mismatch = 0;
    if (!rc && rank == 0) {
        for (int k = 0; k < ndps; k++) {
            for (size_t j = 0; j < (size_t)nstages * runs[k].dp; j++)
                mismatch |= memcmp(runs[k].rec[j].measured, runs[k].rec[j].expected, sizeof runs[k].rec[j].measured);
            if (k) printf("\n");
            print_table(&o, &m, &runs[k], stages, nstages);
        }
        if (o.json_path) rc |= write_json(&o, &m, runs, ndps, stages, nstages);
        if (o.csv_path) rc |= write_csv(o.csv_path, runs, ndps, stages, nstages);
    }
    for (int k = 0; k < ndps; k++) free(runs[k].rec);
    bench_model_free(&m);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    if (rc) return 1;
    return mismatch ? 3 : 0;
}
