/* Parameter offload (offload_param.device cpu / nvme, stage 3) on the CPU
 * device, at this world size:
 *
 *  - bitwise: K steps with the parameter shard in the host pool or on NVMe,
 *    alone and together with optimizer offload cpu / nvme, give the same
 *    fp32 master weights, compute-dtype params, gradient norms and optimizer
 *    state as stage 3 without any offload; f32 and bf16; NVMe chunks are
 *    read ahead along the recorded gather order (counted), buffer_count 2
 *    and 3 (the write-behind buffers shared with the reads ahead);
 *  - accounting: the memory report's PARAMS bytes drop by exactly S * d,
 *    every other category is the non-offloaded engine's (master/moments 0
 *    with optimizer offload); the parameter offload report equals the
 *    formulas of engine.h to the byte (host pool, NVMe bytes per bucket);
 *  - swap files: mode 0600 while the engine lives, removed by destroy;
 *  - checkpoints: saved with parameter offload (nvme) and loaded without it
 *    and with cpu offload, and saved without it and loaded with nvme
 *    offload (fp32: the master is the offloaded shard): one more step, the
 *    same bits as the saver;
 *  - bad input: offload_param at stage < 3, nvme without a path, a missing,
 *    read-only or full (a file-size limit standing in) nvme_path, buffer_size below the largest chunk, a swap
 *    file truncated underneath (the error names the file; the checkpoint
 *    saved before still loads and continues bitwise), JSON keys.
 *
 *  - rss (a 5M-parameter model): the resident growth of an nvme engine is
 *    the shard's bytes less than without offload, and equals its memory
 *    report plus its host pool: the shard is not resident.
 *
 *   test_engine_param_offload [rss]   (under tests/mpirun.sh N) */
#include <dirent.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eng_util.h"
#include "common/proc_mem.h"

#define STEPS 3

typedef struct variant {
    eng_variant v;
    int buffers; /* offload_param.buffer_count: 2 = the open chunk's buffer and one read ahead */
} variant;

static const variant variants[] = {
    {{"f32", ZERO_F32, 1, 0.0, 0, ZERO_OPTIM_ADAMW, 0}, 3},
    {{"bf16 gas2 clip overlap", ZERO_BF16, 2, 0.05, 1, ZERO_OPTIM_ADAMW, 0}, 2},
};

static char g_dir[160];  /* optimizer swap files */
static char g_pdir[200]; /* parameter swap files */

static zero_config make_config(const variant *v, zero_offload_device poff, zero_offload_device ooff)
{
    zero_config c = eng_variant_config(&v->v, 3);
    c.aio_queue_depth = 4;
    c.aio_block_size = 8192;
    c.offload_optimizer_device = ooff;
    if (ooff == ZERO_OFFLOAD_NVME) {
        snprintf(c.offload_nvme_path, sizeof c.offload_nvme_path, "%s", g_dir);
        c.offload_buffer_count = 3;
        c.sub_group_size = 173; /* cuts buckets: the optimizer walk casts pieces of a chunk */
    }
    c.offload_param_device = poff;
    if (poff == ZERO_OFFLOAD_NVME) {
        snprintf(c.offload_param_nvme_path, sizeof c.offload_param_nvme_path, "%s", g_pdir);
        c.offload_param_buffer_count = v->buffers;
        c.offload_param_buffer_size = ENG_BUCKET; /* buckets are bounded by reduce_bucket_size: no chunk is larger */
    }
    return c;
}

/* Regular files in `dir`; each one's mode must be 0600. */
static int count_files(const char *dir, int check_mode)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        n++;
        if (check_mode) CHECK_MSG((sb.st_mode & 0777) == 0600, "swap file %s has mode %o, not 0600", path,
                                  (unsigned)(sb.st_mode & 0777));
    }
    closedir(d);
    return n;
}

typedef struct outcome {
    eng_outcome b;
    float *state;
    uint64_t nstate;
    zero_memory_report mem;
    zero_param_offload_report poff;
    zero_plan_info plan;
    uint64_t nvme_formula, max_chunk;
} outcome;

static outcome run(const zero_config *cfg, zero_comm *comm, zero_device *dev, const eng_run *r)
{
    outcome o = {0};
    zero_engine *e = NULL;
    zero_status st = eng_create_model(&e, cfg, comm, dev);
    if (!e) return o;
    if (st == ZERO_OK && cfg->offload_param_device == ZERO_OFFLOAD_NVME) {
        CHECK_OK(zero_barrier(comm));
        CHECK_MSG(count_files(g_pdir, 1) >= 1, "no parameter swap file in %s", g_pdir);
    }
    if (st == ZERO_OK) st = eng_run_steps(e, dev, cfg, r, STEPS, &o.b, NULL);
    if (st != ZERO_OK) {
        char what[80];
        snprintf(what, sizeof what, "param offload %d / optimizer offload %d", (int)cfg->offload_param_device,
                 (int)cfg->offload_optimizer_device);
        eng_run_failed(what, st, e);
        return o;
    }
    CHECK_OK(zero_engine_get_memory_report(e, &o.mem));
    CHECK_OK(zero_engine_get_param_offload_report(e, &o.poff));
    CHECK_OK(zero_engine_get_plan_info(e, &o.plan));
    const size_t d = zero_dtype_size(cfg->compute_dtype);
    for (int b = 0; b < o.plan.num_buckets; b++) {
        zero_bucket_info bi;
        CHECK_OK(zero_engine_get_bucket_info(e, b, &bi));
        o.nvme_formula += eng_round4k(bi.chunk_numel * d);
        if (bi.chunk_numel > o.max_chunk) o.max_chunk = bi.chunk_numel;
    }
    eng_outcome_collect(e, dev, cfg->compute_dtype, 1, &o.b);
    o.state = eng_collect_owned_state(e, 3, &o.nstate); /* AdamW: master, m1, m2 */
    zero_engine_destroy(e);
    return o;
}

static void outcome_free(outcome *o)
{
    eng_outcome_free(&o->b);
    free(o->state);
}

static void compare(const char *name, const outcome *ref, const outcome *o)
{
    eng_expect_same(name, &o->b, &ref->b);
    long d = o->nstate == ref->nstate ? eng_first_diff(o->state, ref->state, ref->nstate) : 0;
    CHECK_MSG(d < 0, "%s: optimizer state (state_get) differs at %ld", name, d);
}

/* The reports against engine.h's formulas, to the byte. */
static void check_accounting(const char *name, const zero_config *c, const outcome *ref, const outcome *o)
{
    const uint64_t d = zero_dtype_size(c->compute_dtype), S = o->plan.shard_numel;
    CHECK_MSG(ref->mem.bytes[ZERO_MEM_PARAMS] - o->mem.bytes[ZERO_MEM_PARAMS] == S * d,
              "%s: PARAMS %llu bytes, %llu without offload: not S*d = %llu less", name,
              (unsigned long long)o->mem.bytes[ZERO_MEM_PARAMS], (unsigned long long)ref->mem.bytes[ZERO_MEM_PARAMS],
              (unsigned long long)(S * d));
    for (int k = 0; k < ZERO_MEM_CATEGORY_COUNT; k++) {
        if (k == ZERO_MEM_PARAMS) continue;
        const int moved = c->offload_optimizer_device != ZERO_OFFLOAD_NONE &&
                          (k == ZERO_MEM_MASTER || k == ZERO_MEM_MOMENTS);
        CHECK_MSG(o->mem.bytes[k] == (moved ? 0 : ref->mem.bytes[k]), "%s: category %d: %llu bytes, %llu without",
                  name, k, (unsigned long long)o->mem.bytes[k], (unsigned long long)ref->mem.bytes[k]);
    }
    const zero_param_offload_report *p = &o->poff;
    CHECK(p->device == c->offload_param_device);
    if (c->offload_param_device == ZERO_OFFLOAD_CPU) {
        CHECK_MSG(p->host_bytes == eng_round4k(S * d) && p->host_capacity == eng_round4k(S * d) && p->nvme_bytes == 0,
                  "%s: cpu host bytes %llu (capacity %llu), formula %llu", name, (unsigned long long)p->host_bytes,
                  (unsigned long long)p->host_capacity, (unsigned long long)eng_round4k(S * d));
        return;
    }
    CHECK_MSG(p->nvme_bytes == o->nvme_formula, "%s: nvme bytes %llu, formula %llu", name,
              (unsigned long long)p->nvme_bytes, (unsigned long long)o->nvme_formula);
    const uint64_t host = (uint64_t)c->offload_param_buffer_count * eng_round4k(o->max_chunk * d);
    CHECK_MSG(p->host_bytes == host && p->host_peak == host && p->host_capacity == host,
              "%s: nvme host bytes %llu (peak %llu, capacity %llu), formula %llu", name,
              (unsigned long long)p->host_bytes, (unsigned long long)p->host_peak,
              (unsigned long long)p->host_capacity, (unsigned long long)host);
    CHECK(p->chunk_numel == o->max_chunk && p->num_chunks == (uint64_t)o->plan.num_buckets &&
          p->buffer_count == c->offload_param_buffer_count);
    /* finalize wrote every chunk, each step wrote every chunk back */
    CHECK_MSG(p->nvme_written >= (STEPS + 1) * o->nvme_formula, "%s: %llu bytes written", name,
              (unsigned long long)p->nvme_written);
    /* from the second step on the recorded order is replayed: reads ahead */
    CHECK_MSG(p->reads_ahead > 0, "%s: no chunk was read ahead (%llu on demand)", name,
              (unsigned long long)p->reads_sync);
}

/* Save from engine A after 2 steps; load into each B; one more step on all:
 * the same master and params. */
static void check_checkpoint(zero_comm *comm, zero_device *dev, const variant *v, zero_offload_device save_poff,
                             const zero_offload_device *load_poff, int nload)
{
    const int rank = zero_comm_get_rank(comm);
    eng_run r = {{rank}, 1, 0, 0, 0};
    zero_config cfg[4];
    zero_engine *e[4] = {NULL, NULL, NULL, NULL};
    cfg[0] = make_config(v, save_poff, ZERO_OFFLOAD_NONE);
    for (int k = 0; k < nload; k++) cfg[1 + k] = make_config(v, load_poff[k], ZERO_OFFLOAD_NONE);
    const int n = 1 + nload;
    char dir[256] = {0};
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/ckpt-XXXXXX", g_dir);
        CHECK(mkdtemp(dir) != NULL);
    }
    CHECK_OK(zero_broadcast(comm, dir, dir, sizeof dir, ZERO_U8, 0));
    for (int k = 0; k < n; k++) {
        CHECK_OK(zero_engine_create(&e[k], &cfg[k], comm, dev));
        if (!e[k]) goto out;
        CHECK_OK(eng_register(e[k], 1));
        CHECK_OK(zero_engine_finalize(e[k]));
    }
    zero_step_result res;
    for (int s = 1; s <= 2; s++) CHECK_OK(eng_train_step(e[0], dev, &cfg[0], &r, s, &res));
    zero_checkpoint_options o = ZERO_CHECKPOINT_OPTIONS_INIT;
    o.durable = 0;
    CHECK_OK(zero_checkpoint_save(e[0], comm, dir, 2, NULL, &o));
    for (int k = 1; k < n; k++) CHECK_OK(zero_checkpoint_load(e[k], comm, dir, NULL));
    for (int k = 0; k < n; k++) CHECK_OK(eng_train_step(e[k], dev, &cfg[k], &r, 3, &res));
    uint64_t cnt = 0;
    float *m0 = eng_collect_master(e[0], &cnt), *p0 = eng_collect_params(e[0], dev, v->v.dtype);
    for (int k = 1; k < n; k++) {
        float *m = eng_collect_master(e[k], &cnt), *p = eng_collect_params(e[k], dev, v->v.dtype);
        long d = eng_first_diff(m, m0, cnt);
        CHECK_MSG(d < 0, "%s checkpoint saved with offload_param %d, loaded with %d: master differs at %ld", v->v.name,
                  (int)save_poff, (int)load_poff[k - 1], d);
        d = eng_first_diff(p, p0, cnt);
        CHECK_MSG(d < 0, "%s checkpoint saved with offload_param %d, loaded with %d: params differ at %ld", v->v.name,
                  (int)save_poff, (int)load_poff[k - 1], d);
        free(m);
        free(p);
    }
    free(m0);
    free(p0);
out:
    for (int k = 0; k < n; k++) zero_engine_destroy(e[k]);
    CHECK_OK(zero_barrier(comm));
    if (rank == 0 && dir[0]) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(system(cmd) == 0);
    }
}

/* finalize of an nvme engine whose nvme_path is `path`: fails naming it. */
static void check_bad_path(zero_comm *comm, zero_device *dev, const char *path, const char *label)
{
    zero_config c = make_config(&variants[0], ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE);
    snprintf(c.offload_param_nvme_path, sizeof c.offload_param_nvme_path, "%s", path);
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return;
    CHECK_OK(eng_register(e, 1));
    zero_status st = zero_engine_finalize(e);
    CHECK_MSG(st == ZERO_IO && strstr(zero_engine_last_error(e), path) &&
                  strstr(zero_engine_last_error(e), "offload_param.nvme_path"),
              "%s nvme_path: %s: %s", label, zero_status_name(st), zero_engine_last_error(e));
    zero_engine_destroy(e);
}

static void check_config_errors(zero_comm *comm, zero_device *dev)
{
    zero_engine *e = NULL;
    for (int stage = 0; stage < 3; stage++) {
        zero_config c = make_config(&variants[0], ZERO_OFFLOAD_CPU, ZERO_OFFLOAD_NONE);
        c.stage = stage;
        CHECK(zero_engine_create(&e, &c, comm, dev) == ZERO_CONFIG && !e);
        CHECK_MSG(strstr(zero_last_error(), "offload_param.device") && strstr(zero_last_error(), "stage 3"),
                  "stage %d: %s", stage, zero_last_error());
    }
    zero_config c = make_config(&variants[0], ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE);
    c.offload_param_nvme_path[0] = '\0';
    CHECK(zero_engine_create(&e, &c, comm, dev) == ZERO_CONFIG);
    CHECK_MSG(strstr(zero_last_error(), "offload_param.nvme_path") != NULL, "no path: %s", zero_last_error());
    c = make_config(&variants[0], ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE);
    c.offload_param_buffer_count = 1;
    CHECK(zero_engine_create(&e, &c, comm, dev) == ZERO_CONFIG);
    CHECK_MSG(strstr(zero_last_error(), "offload_param.buffer_count") != NULL, "%s", zero_last_error());

    char path[256];
    snprintf(path, sizeof path, "%s/does-not-exist", g_dir);
    check_bad_path(comm, dev, path, "missing");
    /* read-only: root writes through a mode-0500 directory, so there /proc */
    snprintf(path, sizeof path, "%s/read-only-%d", g_dir, zero_comm_get_rank(comm));
    CHECK(mkdir(path, 0500) == 0);
    check_bad_path(comm, dev, access(path, W_OK) == 0 ? "/proc" : path, "read-only");
    rmdir(path);

    /* a full disk: a file-size limit stands in (fallocate then fails with EFBIG, as with ENOSPC) */
    struct rlimit old_lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old_lim) == 0);
    struct rlimit tiny = old_lim;
    tiny.rlim_cur = 4096;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &tiny) == 0);
    c = make_config(&variants[0], ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE);
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (e) {
        CHECK_OK(eng_register(e, 1));
        zero_status st = zero_engine_finalize(e);
        CHECK_MSG(st == ZERO_IO && strstr(zero_engine_last_error(e), "offload_param.nvme_path") &&
                      strstr(zero_engine_last_error(e), g_pdir),
                  "full nvme_path: %s: %s", zero_status_name(st), zero_engine_last_error(e));
        zero_engine_destroy(e);
    }
    CHECK(setrlimit(RLIMIT_FSIZE, &old_lim) == 0);
    signal(SIGXFSZ, old_handler);

    /* buffer_size below the largest chunk: finalize names the key */
    c = make_config(&variants[1], ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE);
    c.offload_param_buffer_size = 10;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (e) {
        CHECK_OK(eng_register(e, 1));
        zero_status st = zero_engine_finalize(e);
        CHECK_MSG(st == ZERO_CONFIG && strstr(zero_engine_last_error(e), "offload_param.buffer_size"),
                  "buffer_size: %s: %s", zero_status_name(st), zero_engine_last_error(e));
        zero_engine_destroy(e);
    }
    CHECK_MSG(count_files(g_pdir, 0) == 0, "a failed finalize left swap files in %s", g_pdir);
}

/* Every rank's swap files truncated after a checkpoint: the next gather
 * fails naming the file; the checkpoint loads into a fresh engine and
 * continues like the run that never lost its files. */
static void check_truncated(zero_comm *comm, zero_device *dev)
{
    const variant *v = &variants[1];
    const int rank = zero_comm_get_rank(comm);
    eng_run r = {{rank}, 1, 0, 0, 0};
    zero_config cn = make_config(v, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE);
    zero_config c0 = make_config(v, ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NONE);
    char rdir[256], dir[256] = {0};
    snprintf(rdir, sizeof rdir, "%s/rank%d", g_pdir, rank);
    CHECK(mkdir(rdir, 0700) == 0);
    snprintf(cn.offload_param_nvme_path, sizeof cn.offload_param_nvme_path, "%s", rdir);
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/ckpt-XXXXXX", g_dir);
        CHECK(mkdtemp(dir) != NULL);
    }
    CHECK_OK(zero_broadcast(comm, dir, dir, sizeof dir, ZERO_U8, 0));
    zero_engine *a = NULL, *ref = NULL, *b = NULL;
    zero_step_result res;
    CHECK_OK(zero_engine_create(&a, &cn, comm, dev));
    CHECK_OK(zero_engine_create(&ref, &c0, comm, dev));
    CHECK_OK(zero_engine_create(&b, &c0, comm, dev));
    if (!a || !ref || !b) goto out;
    CHECK_OK(eng_register(a, 1));
    CHECK_OK(zero_engine_finalize(a));
    CHECK_OK(eng_register(ref, 1));
    CHECK_OK(zero_engine_finalize(ref));
    CHECK_OK(eng_register(b, 1));
    CHECK_OK(zero_engine_finalize(b));
    for (int s = 1; s <= 2; s++) {
        CHECK_OK(eng_train_step(a, dev, &cn, &r, s, &res));
        CHECK_OK(eng_train_step(ref, dev, &c0, &r, s, &res));
    }
    zero_checkpoint_options o = ZERO_CHECKPOINT_OPTIONS_INIT;
    o.durable = 0;
    CHECK_OK(zero_checkpoint_save(a, comm, dir, 2, NULL, &o));
    /* truncate this rank's swap files underneath the engine */
    DIR *dd = opendir(rdir);
    char victim[512] = {0};
    struct dirent *de;
    while (dd && (de = readdir(dd))) {
        if (de->d_name[0] == '.') continue;
        snprintf(victim, sizeof victim, "%s/%s", rdir, de->d_name);
        CHECK(truncate(victim, 0) == 0);
    }
    if (dd) closedir(dd);
    CHECK_MSG(victim[0], "no swap file in %s", rdir);
    zero_status st = eng_train_step(a, dev, &cn, &r, 3, &res);
    CHECK_MSG((st == ZERO_CORRUPT || st == ZERO_IO) && victim[0] && strstr(zero_engine_last_error(a), victim),
              "truncated swap file: %s: %s (file %s)", zero_status_name(st), zero_engine_last_error(a), victim);
    st = zero_engine_gather(a, 0); /* its parameters are gone: only destroy is accepted */
    CHECK_MSG(st == ZERO_INVALID_STATE && strstr(zero_engine_last_error(a), victim), "after the failure: %s: %s",
              zero_status_name(st), zero_engine_last_error(a));
    zero_engine_destroy(a); /* a broken engine still removes its files */
    a = NULL;
    CHECK_MSG(count_files(rdir, 0) == 0, "swap files left in %s", rdir);
    /* nothing saved was lost: the checkpoint continues like the reference */
    CHECK_OK(zero_checkpoint_load(b, comm, dir, NULL));
    CHECK_OK(eng_train_step(b, dev, &c0, &r, 3, &res));
    CHECK_OK(eng_train_step(ref, dev, &c0, &r, 3, &res));
    uint64_t n = 0;
    float *mb = eng_collect_master(b, &n), *mr = eng_collect_master(ref, &n);
    long d = eng_first_diff(mb, mr, n);
    CHECK_MSG(d < 0, "checkpoint saved before the truncation: master differs at %ld", d);
    free(mb);
    free(mr);
out:
    zero_engine_destroy(a);
    zero_engine_destroy(ref);
    zero_engine_destroy(b);
    rmdir(rdir);
    CHECK_OK(zero_barrier(comm));
    if (rank == 0 && dir[0]) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(system(cmd) == 0);
    }
}

/* DeepSpeed's offload_param keys through zero_config_from_json. */
static void check_json(void)
{
    zero_config c = ZERO_CONFIG_INIT;
    CHECK(c.offload_param_device == ZERO_OFFLOAD_NONE && c.offload_param_buffer_count == 5 &&
          c.offload_param_buffer_size == 100000000u && c.offload_param_max_in_cpu == 1000000000u &&
          c.offload_param_pin_memory == 0 && !c.offload_param_nvme_path[0]);
    CHECK_OK(zero_config_from_json(&c, "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": "
                                       "\"nvme\", \"nvme_path\": \"/nv\", \"pin_memory\": true, \"buffer_count\": 4,"
                                       " \"buffer_size\": 1e6, \"max_in_cpu\": 2e9}}}"));
    CHECK(c.offload_param_device == ZERO_OFFLOAD_NVME && !strcmp(c.offload_param_nvme_path, "/nv") &&
          c.offload_param_pin_memory == 1 && c.offload_param_buffer_count == 4 &&
          c.offload_param_buffer_size == 1000000 && c.offload_param_max_in_cpu == 2000000000u);
    CHECK_OK(zero_config_from_json(&c, "{\"zero_optimization\": {\"offload_param\": {\"device\": \"cpu\"}}}"));
    CHECK(c.offload_param_device == ZERO_OFFLOAD_CPU);
    static const struct {
        const char *doc, *needle;
    } bad[] = {
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"disk\"}}}",
         "zero_optimization.offload_param.device"},
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"buffr_size\": 5}}}",
         "offload_param.buffr_size: unknown key"},
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\"}}}",
         "offload_param.nvme_path"},
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"buffer_count\": 1}}}",
         "zero_optimization.offload_param.buffer_count"},
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"buffer_size\": 0}}}",
         "zero_optimization.offload_param.buffer_size"},
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"max_in_cpu\": -1}}}",
         "zero_optimization.offload_param.max_in_cpu"},
        {"{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}",
         "offload_param.device cpu needs stage 3"},
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": [1]}}", "zero_optimization.offload_param"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zero_config d = ZERO_CONFIG_INIT;
        zero_status st = zero_config_from_json(&d, bad[i].doc);
        CHECK_MSG(st == ZERO_CONFIG && strstr(zero_last_error(), bad[i].needle), "%s: %s: %s", bad[i].doc,
                  zero_status_name(st), zero_last_error());
        CHECK(d.offload_param_device == ZERO_OFFLOAD_NONE); /* unchanged on failure */
    }
}

/* ---------------------------------------------------------------- resident memory */

/* Resident growth of an engine (finalize + one step) with the shard on NVMe
 * and without offload: each grows by its memory report (+ the host pool)
 * within 3%, and the NVMe engine by the shard's S*d bytes less, plus its
 * staging buffers, within 10% of S*d: nothing of the shard is resident. */
static void check_rss(zero_comm *comm, zero_device *dev)
{
    const variant *v = &variants[1];
    const int rank = zero_comm_get_rank(comm);
    eng_run r = {{rank}, 1, 0, 0, 0};
    /* run 0 (no offload) only warms up the process (MPI, allocator, first-touch
     * costs that are not the engine's); runs 1 (nvme) and 2 (none) compare */
    long grew[3] = {0, 0, 0};
    double shard_bytes = 0, report[3] = {0, 0, 0}, staging = 0;
    for (int k = 0; k < 3; k++) {
        zero_config c = make_config(v, k == 1 ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NONE);
        c.reduce_bucket_size = 1u << 16; /* chunks of 32K elements at 2 ranks: staging far below the shard */
        c.offload_param_buffer_size = 1u << 16;
        c.stage3_prefetch_bucket_size = 1u << 22;
        c.stage3_max_live_parameters = 1u << 24;
        c.gradient_accumulation_steps = 1;
        long before = proc_rss_bytes();
        zero_engine *e = NULL;
        CHECK_OK(zero_engine_create(&e, &c, comm, dev));
        if (!e) return;
        CHECK_OK(eng_register(e, 700));
        CHECK_OK(zero_engine_finalize(e));
        zero_step_result res;
        CHECK_OK(eng_train_step(e, dev, &c, &r, 1, &res));
        grew[k] = proc_rss_bytes() - before;
        zero_memory_report m;
        zero_param_offload_report po;
        zero_plan_info plan;
        CHECK_OK(zero_engine_get_memory_report(e, &m));
        CHECK_OK(zero_engine_get_param_offload_report(e, &po));
        CHECK_OK(zero_engine_get_plan_info(e, &plan));
        shard_bytes = (double)plan.shard_numel * 2;
        report[k] = (double)m.total + (double)po.host_capacity;
        if (k == 1) staging = (double)po.host_capacity;
        zero_engine_destroy(e);
    }
    fprintf(stderr, "[rank %d] resident growth: %.1f MB without offload, %.1f MB with nvme (shard %.1f MB; "
            "reported %.1f / %.1f MB)\n", rank, grew[2] / 1e6, grew[1] / 1e6, shard_bytes / 1e6, report[2] / 1e6,
            report[1] / 1e6);
    CHECK_MSG(shard_bytes > 4e6, "model too small for an RSS comparison: shard %.1f MB", shard_bytes / 1e6);
    const double less = (double)(grew[2] - grew[1]);
    CHECK_MSG(fabs(less - (shard_bytes - staging)) <= 0.1 * shard_bytes,
              "nvme engine resident %.1f MB vs %.1f MB without: not the shard's %.1f MB less (plus %.1f MB of staging)",
              grew[1] / 1e6, grew[2] / 1e6, shard_bytes / 1e6, staging / 1e6);
    CHECK_MSG(fabs((double)grew[2] - report[2]) <= 0.03 * report[2],
              "engine without offload: resident growth %.1f MB, report %.1f MB", grew[2] / 1e6, report[2] / 1e6);
    CHECK_MSG(fabs((double)grew[1] - report[1]) <= 0.03 * report[1],
              "nvme engine resident growth %.1f MB, report + host pool %.1f MB", grew[1] / 1e6, report[1] / 1e6);
}

int main(int argc, char **argv)
{
    /* A fixed mmap threshold: freed large blocks go back to the OS, so
     * resident memory tracks live allocations (rss mode). */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    const int rss = argc > 1 && !strcmp(argv[1], "rss");
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(0, 0, &world, &dev);
    if (rc) return rc;
    const int rank = zero_comm_get_rank(world);
    /* one directory for all ranks, made by rank 0 */
    if (rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(g_dir, sizeof g_dir, "%s/zero-poff-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(g_dir)) {
            perror("mkdtemp");
            g_dir[0] = '\0';
        }
        snprintf(g_pdir, sizeof g_pdir, "%s/param", g_dir);
        if (g_dir[0] && mkdir(g_pdir, 0700) != 0) perror("mkdir");
    }
    CHECK_OK(zero_broadcast(world, g_dir, g_dir, sizeof g_dir, ZERO_U8, 0));
    CHECK_OK(zero_broadcast(world, g_pdir, g_pdir, sizeof g_pdir, ZERO_U8, 0));
    if (!g_dir[0]) return 1;

    if (rss) {
        check_rss(world, dev);
        goto done;
    }
    eng_run r = {{rank}, 1, 0, 0, 0};
    static const zero_offload_device devs[3] = {ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_CPU, ZERO_OFFLOAD_NVME};
    static const char *const dev_names[3] = {"none", "cpu", "nvme"};
    for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
        const variant *v = &variants[vi];
        zero_config cref = make_config(v, ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NONE);
        outcome ref = run(&cref, world, dev, &r);
        if (!ref.b.ok) continue;
        for (int pk = 1; pk < 3; pk++) {
            for (int ok = 0; ok < 3; ok++) {
                zero_config c = make_config(v, devs[pk], devs[ok]);
                char name[160];
                snprintf(name, sizeof name, "%s offload_param %s offload_optimizer %s", v->v.name, dev_names[pk],
                         dev_names[ok]);
                outcome o = run(&c, world, dev, &r);
                if (o.b.ok) {
                    compare(name, &ref, &o);
                    check_accounting(name, &c, &ref, &o);
                }
                outcome_free(&o);
            }
        }
        CHECK_MSG(ref.b.master[0] != eng_init_value(0, 0), "%s: parameters did not change", v->v.name);
        outcome_free(&ref);
    }
    CHECK_OK(zero_barrier(world));
    CHECK_MSG(count_files(g_pdir, 0) == 0, "swap files left in %s after destroy", g_pdir);

    const zero_offload_device to_plain_cpu[2] = {ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_CPU};
    const zero_offload_device to_nvme[1] = {ZERO_OFFLOAD_NVME};
    check_checkpoint(world, dev, &variants[1], ZERO_OFFLOAD_NVME, to_plain_cpu, 2);
    check_checkpoint(world, dev, &variants[0], ZERO_OFFLOAD_NONE, to_nvme, 1);
    check_checkpoint(world, dev, &variants[1], ZERO_OFFLOAD_NONE, to_nvme, 1);
    check_truncated(world, dev);
    CHECK_OK(zero_barrier(world));
    check_config_errors(world, dev);
    check_json();

done:
    CHECK_OK(zero_barrier(world));
    if (rank == 0) {
        rmdir(g_pdir);
        rmdir(g_dir); /* the stores removed their files */
        CHECK_MSG(access(g_dir, F_OK) != 0, "files left in %s", g_dir);
    }
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
