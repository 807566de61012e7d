/* Optimizer state offload (offload_optimizer.device cpu / nvme) on the CPU
 * device, at this world size:
 *
 *  - bitwise: K steps with the state on NVMe (chunks of an odd
 *    sub_group_size that cut buckets and parameters, buffer_count 3 and 4)
 *    or in the host pool give the same fp32 master weights, compute-dtype
 *    params, gradient norms and optimizer state (state_get of every param
 *    and kind) as the engine without offload; stages 1-3, f32 and bf16,
 *    AdamW and SGD with momentum;
 *  - accounting: the memory report's master and moment bytes are 0, every
 *    other category equals the non-offloaded engine's; the offload report's
 *    host bytes are exactly the declared buffers and its NVMe bytes the
 *    formula of engine.h;
 *  - checkpoints: the state of a non-offloaded engine copied with
 *    state_get / state_set (+ scalars, params_changed) into an NVMe-offloaded
 *    one continues bitwise like the original; a checkpoint saved by an
 *    NVMe engine and loaded into a plain and an NVMe engine too (stages 2, 3);
 *  - config: stage 0 with offload, nvme without a path, buffer_count < 3
 *    are refused; a missing directory fails finalize naming it.
 *
 *   test_engine_offload [cpu | cuda nccl | cuda staged]   (under tests/mpirun.sh N;
 *   cuda: skipped without a GPU; there the reference is the CUDA kernel's step
 *   and the offloaded state is updated by the CPU kernel) */
#include <unistd.h>

#include "eng_util.h"

#define STEPS 3
#define SUBGROUP 173 /* elements per stored chunk: cuts buckets and params */

static const eng_variant variants[] = {
    {"f32 adamw", ZERO_F32, 1, 0.0, 0, ZERO_OPTIM_ADAMW, 0},
    {"bf16 adamw gas2 clip overlap", ZERO_BF16, 2, 0.05, 1, ZERO_OPTIM_ADAMW, 0},
    {"f32 sgd-momentum clip", ZERO_F32, 1, 0.05, 0, ZERO_OPTIM_SGD, 0},
    {"bf16 sgd-momentum gas2", ZERO_BF16, 2, 0.0, 1, ZERO_OPTIM_SGD, 0},
};

static char g_dir[200]; /* room for a suffix in offload_nvme_path[256] */
static int g_cuda;     /* CUDA device: host master always, plus a gradient staging chunk */

static zero_config make_config(const eng_variant *v, int stage, zero_offload_device off, int buffer_count)
{
    zero_config c = eng_variant_config(v, stage);
    c.offload_optimizer_device = off;
    if (off == ZERO_OFFLOAD_NVME) {
        snprintf(c.offload_nvme_path, sizeof c.offload_nvme_path, "%s", g_dir);
        c.offload_buffer_count = buffer_count;
        c.sub_group_size = SUBGROUP;
        c.aio_queue_depth = 4;
        c.aio_block_size = 8192;
    }
    return c;
}

typedef struct outcome {
    eng_outcome b;
    float *state; /* every param's owned part of master, m1, m2 (absent: skipped) */
    uint64_t nstate;
    zero_memory_report mem;
    zero_offload_report off;
    zero_plan_info plan;
} outcome;

static int num_moments(const zero_config *c)
{
    return c->optimizer == ZERO_OPTIM_ADAMW ? 2 : (c->momentum > 0 ? 1 : 0);
}

static outcome run(const zero_config *cfg, zero_comm *comm, zero_device *dev, const eng_run *r)
{
    outcome o = {0};
    zero_engine *e = NULL;
    zero_status st = eng_create_model(&e, cfg, comm, dev);
    if (!e) return o;
    if (st == ZERO_OK) st = eng_run_steps(e, dev, cfg, r, STEPS, &o.b, NULL);
    if (st != ZERO_OK) {
        char what[64];
        snprintf(what, sizeof what, "stage %d offload %d", cfg->stage, (int)cfg->offload_optimizer_device);
        eng_run_failed(what, st, e);
        return o;
    }
    CHECK_OK(zero_engine_get_memory_report(e, &o.mem));
    CHECK_OK(zero_engine_get_offload_report(e, &o.off));
    CHECK_OK(zero_engine_get_plan_info(e, &o.plan));
    eng_outcome_collect(e, dev, cfg->compute_dtype, 1, &o.b);
    o.state = eng_collect_owned_state(e, 1 + num_moments(cfg), &o.nstate);
    zero_engine_destroy(e);
    return o;
}

static void outcome_free(outcome *o)
{
    eng_outcome_free(&o->b);
    free(o->state);
}

/* The offload report against engine.h's formulas. */
static void check_accounting(const char *name, const zero_config *c, const outcome *ref, const outcome *o)
{
    CHECK_MSG(o->mem.bytes[ZERO_MEM_MASTER] == 0 && o->mem.bytes[ZERO_MEM_MOMENTS] == 0,
              "%s: offloaded master/moments still in the memory report (%llu, %llu)", name,
              (unsigned long long)o->mem.bytes[ZERO_MEM_MASTER], (unsigned long long)o->mem.bytes[ZERO_MEM_MOMENTS]);
    CHECK_MSG(o->mem.peak[ZERO_MEM_MASTER] == 0 && o->mem.peak[ZERO_MEM_MOMENTS] == 0, "%s: master/moment peak", name);
    for (int k = 0; k < ZERO_MEM_CATEGORY_COUNT; k++) {
        if (k == ZERO_MEM_MASTER || k == ZERO_MEM_MOMENTS) continue;
        CHECK_MSG(o->mem.bytes[k] == ref->mem.bytes[k], "%s: category %d: %llu bytes, %llu without offload", name, k,
                  (unsigned long long)o->mem.bytes[k], (unsigned long long)ref->mem.bytes[k]);
    }
    CHECK_MSG(ref->mem.total - o->mem.total ==
                  ref->mem.bytes[ZERO_MEM_MASTER] + ref->mem.bytes[ZERO_MEM_MOMENTS],
              "%s: total moved by more than master + moments", name);
    const uint64_t S = o->plan.shard_numel;
    const int moments = num_moments(c);
    CHECK(o->off.device == c->offload_optimizer_device);
    if (c->offload_optimizer_device == ZERO_OFFLOAD_CPU) {
        const int arrays = g_cuda ? 2 + moments : (c->compute_dtype == ZERO_F32 ? 0 : 1) + moments;
        CHECK_MSG(o->off.host_bytes == (uint64_t)arrays * eng_round4k(S * 4),
                  "%s: cpu host bytes %llu, expected %d arrays of %llu elements", name,
                  (unsigned long long)o->off.host_bytes, arrays, (unsigned long long)S);
        /* the pool holds exactly what was moved out of the report */
        CHECK(o->off.host_bytes >= ref->mem.bytes[ZERO_MEM_MASTER] + ref->mem.bytes[ZERO_MEM_MOMENTS]);
        CHECK(o->off.nvme_bytes == 0);
        return;
    }
    const int states = 1 + moments;
    const uint64_t cn = S < SUBGROUP ? S : SUBGROUP;
    uint64_t nvme = 0, chunks = 0;
    for (uint64_t lo = 0; lo < S; lo += cn, chunks++) nvme += eng_round4k((uint64_t)states * (S - lo < cn ? S - lo : cn) * 4);
    CHECK_MSG(o->off.nvme_bytes == nvme, "%s: nvme bytes %llu, formula %llu", name,
              (unsigned long long)o->off.nvme_bytes, (unsigned long long)nvme);
    CHECK(o->off.num_chunks == chunks && o->off.chunk_numel == cn && o->off.states == states);
    const uint64_t host = (uint64_t)(c->offload_buffer_count + 1) * eng_round4k((uint64_t)states * cn * 4) +
                          (g_cuda ? eng_round4k(cn * 4) : 0);
    CHECK_MSG(o->off.host_bytes == host && o->off.host_peak == host && o->off.host_capacity == host,
              "%s: nvme host bytes %llu (peak %llu, capacity %llu), declared %llu", name,
              (unsigned long long)o->off.host_bytes, (unsigned long long)o->off.host_peak,
              (unsigned long long)o->off.host_capacity, (unsigned long long)host);
    /* every step read and wrote every chunk once (plus init writes and state reads) */
    CHECK(o->off.nvme_read >= STEPS * nvme && o->off.nvme_written >= (STEPS + 1) * nvme);
}

static void compare(const char *name, const outcome *ref, const outcome *o)
{
    eng_expect_same(name, &o->b, &ref->b);
    CHECK_MSG(o->nstate == ref->nstate, "%s: state sizes differ", name);
    if (o->nstate == ref->nstate) {
        long d = eng_first_diff(o->state, ref->state, ref->nstate);
        CHECK_MSG(d < 0, "%s: optimizer state (state_get) differs at %ld", name, d);
    }
}

/* A non-offloaded engine's state moved into an NVMe-offloaded one through
 * state_get / state_set; one more step on both: the same bits. */
static void check_restore(zero_comm *comm, zero_device *dev, int stage)
{
    const eng_variant *v = &variants[1];
    const int rank = zero_comm_get_rank(comm);
    eng_run r = {{rank}, 1, 0, 0, 0};
    zero_config ca = make_config(v, stage, ZERO_OFFLOAD_NONE, 4);
    zero_config cb = make_config(v, stage, ZERO_OFFLOAD_NVME, 4);
    zero_engine *a = NULL, *b = NULL;
    CHECK_OK(zero_engine_create(&a, &ca, comm, dev));
    CHECK_OK(zero_engine_create(&b, &cb, comm, dev));
    if (!a || !b) goto out;
    CHECK_OK(eng_register(a, 1));
    CHECK_OK(zero_engine_finalize(a));
    CHECK_OK(eng_register(b, 1));
    CHECK_OK(zero_engine_finalize(b));
    zero_step_result res;
    for (int s = 1; s <= 2; s++) CHECK_OK(eng_train_step(a, dev, &ca, &r, s, &res));
    for (int p = 0; p < zero_engine_get_num_params(a); p++) {
        zero_param_info pi;
        zero_engine_get_param_info(a, p, &pi);
        float *buf = malloc((pi.owned_numel + 1) * sizeof *buf);
        for (int k = 0; k < 3; k++) {
            CHECK_OK(zero_engine_state_get(a, (zero_state_kind)k, p, buf));
            CHECK_OK(zero_engine_state_set(b, (zero_state_kind)k, p, buf));
        }
        free(buf);
    }
    zero_engine_scalars sc;
    CHECK_OK(zero_engine_get_scalars(a, &sc));
    CHECK_OK(zero_engine_set_scalars(b, &sc));
    CHECK_OK(zero_engine_params_changed(b));
    CHECK_OK(eng_train_step(a, dev, &ca, &r, 3, &res));
    CHECK_OK(eng_train_step(b, dev, &cb, &r, 3, &res));
    uint64_t n = 0;
    float *ma = eng_collect_master(a, &n), *mb = eng_collect_master(b, &n);
    float *pa = eng_collect_params(a, dev, v->dtype), *pb = eng_collect_params(b, dev, v->dtype);
    long d = eng_first_diff(mb, ma, n);
    CHECK_MSG(d < 0, "stage %d restore into nvme: master differs at %ld", stage, d);
    d = eng_first_diff(pb, pa, n);
    CHECK_MSG(d < 0, "stage %d restore into nvme: params differ at %ld", stage, d);
    free(ma);
    free(mb);
    free(pa);
    free(pb);
out:
    zero_engine_destroy(a);
    zero_engine_destroy(b);
}

/* DeepSpeed's keys through zero_config_from_json. */
static void check_json(void)
{
    zero_config c = ZERO_CONFIG_INIT;
    CHECK(c.offload_optimizer_device == ZERO_OFFLOAD_NONE && c.offload_buffer_count == 4 &&
          c.sub_group_size == 1000000000u && c.aio_block_size == 1048576u && c.aio_queue_depth == 8);
    CHECK_OK(zero_config_from_json(&c, "{\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 1e6,"
                                       " \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nv\","
                                       " \"pin_memory\": true, \"buffer_count\": 5}},"
                                       " \"aio\": {\"block_size\": 262144, \"queue_depth\": 16,"
                                       " \"single_submit\": false, \"overlap_events\": true}}"));
    CHECK(c.offload_optimizer_device == ZERO_OFFLOAD_NVME && !strcmp(c.offload_nvme_path, "/nv") &&
          c.offload_pin_memory == 1 && c.offload_buffer_count == 5 && c.sub_group_size == 1000000 &&
          c.aio_block_size == 262144 && c.aio_queue_depth == 16);
    CHECK_OK(zero_config_from_json(&c, "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\"}}}"));
    CHECK(c.offload_optimizer_device == ZERO_OFFLOAD_CPU);
    static const struct {
        const char *doc, *needle;
    } bad[] = {
        {"{\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"disk\"}}}",
         "zero_optimization.offload_optimizer.device"},
        {"{\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"devise\": \"cpu\"}}}",
         "offload_optimizer.devise: unknown key"},
        {"{\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"nvme\"}}}", "nvme_path"},
        {"{\"zero_optimization\": {\"stage\": 0, \"offload_optimizer\": {\"device\": \"cpu\"}}}", "stage 1..3"},
        {"{\"aio\": {\"block_size\": 1000}}", "aio.block_size"},
        {"{\"aio\": {\"queue_depth\": 0}}", "aio.queue_depth"},
        {"{\"aio\": {\"blocksize\": 4096}}", "aio.blocksize: unknown key"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zero_config d = ZERO_CONFIG_INIT;
        zero_status st = zero_config_from_json(&d, bad[i].doc);
        CHECK_MSG(st == ZERO_CONFIG && strstr(zero_last_error(), bad[i].needle), "%s: %s: %s", bad[i].doc,
                  zero_status_name(st), zero_last_error());
        CHECK(d.offload_optimizer_device == ZERO_OFFLOAD_NONE); /* unchanged on failure */
    }
}

/* A checkpoint saved by an NVMe-offloaded engine (state read from the
 * store), loaded into a non-offloaded and into an NVMe-offloaded engine
 * (state written to the store): one more step on all three, the same bits. */
static void check_checkpoint(zero_comm *comm, zero_device *dev, int stage)
{
    if (g_cuda) return; /* checkpoints want a host-memory dp comm; the CPU run covers the store path */
    const eng_variant *v = &variants[1];
    const int rank = zero_comm_get_rank(comm);
    eng_run r = {{rank}, 1, 0, 0, 0};
    zero_config cn = make_config(v, stage, ZERO_OFFLOAD_NVME, 3), c0 = make_config(v, stage, ZERO_OFFLOAD_NONE, 4);
    const zero_config *cfg[3] = {&cn, &c0, &cn};
    zero_engine *e[3] = {NULL, NULL, NULL};
    char dir[256] = {0};
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/ckpt-XXXXXX", g_dir);
        CHECK(mkdtemp(dir) != NULL);
    }
    CHECK_OK(zero_broadcast(comm, dir, dir, sizeof dir, ZERO_U8, 0));
    for (int k = 0; k < 3; k++) {
        CHECK_OK(zero_engine_create(&e[k], cfg[k], comm, dev));
        if (!e[k]) goto out;
        CHECK_OK(eng_register(e[k], 1));
        CHECK_OK(zero_engine_finalize(e[k]));
    }
    zero_step_result res;
    for (int s = 1; s <= 2; s++) CHECK_OK(eng_train_step(e[0], dev, &cn, &r, s, &res));
    zero_checkpoint_options o = ZERO_CHECKPOINT_OPTIONS_INIT;
    o.durable = 0;
    CHECK_OK(zero_checkpoint_save(e[0], comm, dir, 2, NULL, &o));
    for (int k = 1; k < 3; k++) CHECK_OK(zero_checkpoint_load(e[k], comm, dir, NULL));
    for (int k = 0; k < 3; k++) CHECK_OK(eng_train_step(e[k], dev, cfg[k], &r, 3, &res));
    uint64_t n = 0;
    float *m[3], *p[3];
    for (int k = 0; k < 3; k++) {
        m[k] = eng_collect_master(e[k], &n);
        p[k] = eng_collect_params(e[k], dev, v->dtype);
    }
    for (int k = 1; k < 3; k++) {
        long d = eng_first_diff(m[k], m[0], n);
        CHECK_MSG(d < 0, "stage %d checkpoint of an nvme engine loaded into %s: master differs at %ld", stage,
                  k == 1 ? "none" : "nvme", d);
        d = eng_first_diff(p[k], p[0], n);
        CHECK_MSG(d < 0, "stage %d checkpoint into %s: params differ at %ld", stage, k == 1 ? "none" : "nvme", d);
    }
    for (int k = 0; k < 3; k++) {
        free(m[k]);
        free(p[k]);
    }
out:
    for (int k = 0; k < 3; k++) zero_engine_destroy(e[k]);
    CHECK_OK(zero_barrier(comm));
    if (rank == 0 && dir[0]) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(system(cmd) == 0);
    }
}

static void check_config_errors(zero_comm *comm, zero_device *dev)
{
    zero_config c = make_config(&variants[0], 0, ZERO_OFFLOAD_CPU, 4);
    zero_engine *e = NULL;
    CHECK(zero_engine_create(&e, &c, comm, dev) == ZERO_CONFIG);
    CHECK_MSG(strstr(zero_last_error(), "stage 1..3") != NULL, "stage 0: %s", zero_last_error());
    c = make_config(&variants[0], 1, ZERO_OFFLOAD_NVME, 4);
    c.offload_nvme_path[0] = '\0';
    CHECK(zero_engine_create(&e, &c, comm, dev) == ZERO_CONFIG);
    CHECK_MSG(strstr(zero_last_error(), "nvme_path") != NULL, "no path: %s", zero_last_error());
    c = make_config(&variants[0], 1, ZERO_OFFLOAD_NVME, 2);
    CHECK(zero_engine_create(&e, &c, comm, dev) == ZERO_CONFIG);
    CHECK_MSG(strstr(zero_last_error(), "buffer_count") != NULL, "buffer_count: %s", zero_last_error());
    /* a directory that does not exist: finalize fails naming it */
    c = make_config(&variants[0], 2, ZERO_OFFLOAD_NVME, 4);
    snprintf(c.offload_nvme_path, sizeof c.offload_nvme_path, "%s/does-not-exist", g_dir);
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return;
    CHECK_OK(eng_register(e, 1));
    zero_status st = zero_engine_finalize(e);
    CHECK_MSG(st == ZERO_IO && strstr(zero_engine_last_error(e), "does-not-exist") &&
                  strstr(zero_engine_last_error(e), "optimizer offload"),
              "missing dir: %s: %s", zero_status_name(st), zero_engine_last_error(e));
    zero_engine_destroy(e);
}

int main(int argc, char **argv)
{
    g_cuda = argc > 1 && !strcmp(argv[1], "cuda");
    if (g_cuda && !zero_cuda_available()) CHECK_SKIP("no CUDA device");
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(g_cuda, argc > 2 && !strcmp(argv[2], "nccl"), &world, &dev);
    if (rc) return rc;
    const int rank = zero_comm_get_rank(world);
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/zero-offload-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }

    eng_run r = {{rank}, 1, 0, 0, 0};
    for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
        const eng_variant *v = &variants[vi];
        for (int stage = 1; stage <= 3; stage++) {
            zero_config cref = make_config(v, stage, ZERO_OFFLOAD_NONE, 4);
            outcome ref = run(&cref, world, dev, &r);
            if (!ref.b.ok) continue;
            const int bc = 3 + (int)((vi + (size_t)stage) % 2); /* buffer_count 3 and 4 */
            zero_config cn = make_config(v, stage, ZERO_OFFLOAD_NVME, bc);
            zero_config cc = make_config(v, stage, ZERO_OFFLOAD_CPU, 4);
            const zero_config *cfgs[2] = {&cn, &cc};
            for (int k = 0; k < 2; k++) {
                char name[160];
                snprintf(name, sizeof name, "%s stage %d %s%s", v->name, stage, k ? "cpu" : "nvme",
                         k ? "" : (bc == 3 ? " (buffer_count 3)" : " (buffer_count 4)"));
                outcome o = run(cfgs[k], world, dev, &r);
                if (o.b.ok) {
                    compare(name, &ref, &o);
                    check_accounting(name, cfgs[k], &ref, &o);
                }
                outcome_free(&o);
            }
            CHECK_MSG(ref.b.master[0] != eng_init_value(0, 0), "%s: parameters did not change", v->name);
            outcome_free(&ref);
        }
    }
    for (int stage = 1; stage <= 3; stage++) check_restore(world, dev, stage);
    for (int stage = 2; stage <= 3; stage++) check_checkpoint(world, dev, stage);
    check_config_errors(world, dev);
    check_json();

    rmdir(g_dir); /* the stores removed their files */
    CHECK_MSG(access(g_dir, F_OK) != 0, "swap files left in %s", g_dir);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
