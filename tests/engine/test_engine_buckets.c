/* Bounded communication buckets (engine.h "the plan"), on real ranks:
 *   - a parameter more than 10x the bucket capacity is split across
 *     consecutive buckets (param_info.num_buckets, several owned ranges) and
 *     no bucket exceeds the capacity min(reduce_bucket_size,
 *     allgather_bucket_size) rounded down to a multiple of the dp size;
 *   - the staging buffers (memory report 'buffers') are exactly
 *     slots * (C*4 + C/N*4) bytes, C the capacity: bounded by the bucket
 *     size, not by the large parameter;
 *   - every reduce-scatter and every parameter all-gather is one bucket
 *     (comm call counts = buckets, bytes = the padded total);
 *   - stages 0-3 stay bitwise identical with split parameters;
 *   - contiguous_gradients = 0 (no effect) logs a warning naming it;
 *   - a duplicate parameter (model parallelism) leaves the norm exactly with
 *     split params sharing a bucket;
 *   - a checkpoint saved with one bucket size (and stage) loads with another:
 *     every state of every parameter comes back bitwise, and training goes
 *     on bitwise like the uninterrupted run. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <unistd.h>
#include <zero/checkpoint.h>

#include "eng_util.h"

/* Modules are eng_util's (its driver walks all of them); the params are
 * ours: wte alone in "embed" is 11x a 100-element bucket; block1's big
 * matrix follows 50 small elements, so it first fills a shared bucket. */
static const eng_pspec bk_model[] = {
    {0, 2, {101, 11}},                       /* 1111 */
    {1, 1, {7}}, {1, 2, {13, 3}},            /* small */
    {2, 1, {50}}, {2, 2, {37, 29}}, {2, 1, {3}}, /* 50, 1073, 3 */
    {5, 1, {1}}, {5, 1, {2}},                /* persistent at stage 3 */
    {6, 2, {9, 9}},
};
#define BK_NPARAMS ((int)(sizeof bk_model / sizeof bk_model[0]))
#define BK_BUCKET 100
#define BK_PERSIST 4

static zero_status bk_register(zero_engine *e, int with_init)
{
    zero_status st;
    for (int m = 0; m < ENG_NMODULES; m++)
        if ((st = zero_engine_add_module(e, eng_module_names[m], NULL)) != ZERO_OK) return st;
    for (int p = 0; p < BK_NPARAMS; p++) {
        const eng_pspec *s = &bk_model[p];
        uint64_t n = eng_numel(s);
        float *init = NULL;
        if (with_init) {
            init = malloc(n * sizeof *init);
            for (uint64_t i = 0; i < n; i++) init[i] = eng_init_value(p, i);
        }
        char name[64];
        snprintf(name, sizeof name, "%s.q%d", eng_module_names[s->module], p);
        st = zero_engine_add_param(e, s->module, name, s->ndim, s->shape, init, NULL);
        free(init);
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

static zero_config bk_config(int stage, zero_dtype dt, uint64_t bucket)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.compute_dtype = dt;
    c.reduce_bucket_size = bucket;
    c.stage3_param_persistence_threshold = BK_PERSIST;
    c.stage3_prefetch_bucket_size = 400;
    c.stage3_max_live_parameters = 3000;
    c.lr = 0.01;
    c.gradient_accumulation_steps = 2;
    c.gradient_clipping = 0.05;
    c.overlap_comm = stage == 0 ? 0 : 1;
    return c;
}

static zero_engine *bk_engine(const zero_config *c, zero_comm *comm, zero_device *dev, int with_init)
{
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, c, comm, dev));
    if (!e) return NULL;
    CHECK_OK(bk_register(e, with_init));
    CHECK_OK(zero_engine_finalize(e));
    return e;
}

/* ---------------------------------------------------------------- plan and staging */

static void check_plan(zero_comm *comm, zero_device *dev)
{
    const int n = zero_comm_get_size(comm);
    const uint64_t N = (uint64_t)n;
    for (int ov = 0; ov < 2; ov++) {
        zero_config c = bk_config(2, ZERO_F32, BK_BUCKET);
        c.overlap_comm = ov;
        zero_engine *e = bk_engine(&c, comm, dev, 1);
        if (!e) return;
        zero_plan_info plan;
        CHECK_OK(zero_engine_get_plan_info(e, &plan));
        const uint64_t C = BK_BUCKET / N * N;
        CHECK_MSG(plan.bucket_capacity == C && plan.max_bucket_numel == C, "capacity %llu, largest bucket %llu, want %llu",
                  (unsigned long long)plan.bucket_capacity, (unsigned long long)plan.max_bucket_numel,
                  (unsigned long long)C);
        zero_param_info wte, big;
        CHECK_OK(zero_engine_get_param_info(e, 0, &wte));
        CHECK_OK(zero_engine_get_param_info(e, 4, &big));
        CHECK(wte.numel >= 10 * BK_BUCKET);
        /* wte starts a bucket; the big matrix first fills the 50-element one */
        CHECK_MSG(wte.num_buckets == (int)((wte.numel + C - 1) / C), "wte in %d buckets", wte.num_buckets);
        CHECK_MSG(big.num_buckets == 1 + (int)((big.numel - (C - 50) + C - 1) / C), "big in %d buckets",
                  big.num_buckets);
        CHECK(wte.bucket == wte.first_bucket && big.first_bucket == big.bucket);
        if (n > 1) CHECK_MSG(wte.num_owned_ranges == wte.num_buckets, "wte: %d owned ranges", wte.num_owned_ranges);
        else CHECK(wte.num_owned_ranges == 1 && wte.owned_numel == wte.numel);
        /* staging: exactly slots * (C*4 + C/N*4) bytes, whatever the params */
        zero_memory_report r;
        CHECK_OK(zero_engine_get_memory_report(e, &r));
        const uint64_t want = (uint64_t)(ov ? 2 : 1) * (C * 4 + C / N * 4);
        CHECK_MSG(r.bytes[ZERO_MEM_BUFFERS] == want && r.peak[ZERO_MEM_BUFFERS] == want,
                  "overlap %d: buffers %llu (peak %llu) bytes, want %llu", ov,
                  (unsigned long long)r.bytes[ZERO_MEM_BUFFERS], (unsigned long long)r.peak[ZERO_MEM_BUFFERS],
                  (unsigned long long)want);
        zero_engine_destroy(e);
    }
    /* allgather_bucket_size below reduce_bucket_size: it is the bound */
    zero_config c = bk_config(1, ZERO_F32, 5000);
    c.allgather_bucket_size = 64;
    zero_engine *e = bk_engine(&c, comm, dev, 1);
    if (!e) return;
    zero_plan_info plan;
    CHECK_OK(zero_engine_get_plan_info(e, &plan));
    CHECK(plan.bucket_capacity == (64 >= N ? 64 / N * N : N) && plan.max_bucket_numel <= 64);
    zero_engine_destroy(e);
}

/* One step's traffic at stage 2: every reduce-scatter and all-gather is a
 * bucket; bytes are the padded total's, at the ring volume. */
static void check_traffic(zero_comm *comm, zero_device *dev)
{
    const int rank = zero_comm_get_rank(comm), n = zero_comm_get_size(comm);
    zero_config c = bk_config(2, ZERO_F32, BK_BUCKET);
    c.gradient_accumulation_steps = 1;
    zero_engine *e = bk_engine(&c, comm, dev, 1);
    if (!e) return;
    zero_plan_info plan;
    CHECK_OK(zero_engine_get_plan_info(e, &plan));
    eng_run run = {{rank}, 1, 0, 0, 0};
    zero_comm_counters k;
    eng_step_counted(e, dev, &c, &run, 1, comm, &k);
    const uint64_t B = (uint64_t)plan.num_buckets, moved = plan.padded_numel * (uint64_t)(n - 1) / (uint64_t)n * 4;
    /* over one rank a reduction is a local pass, not a collective (grads.c) */
    CHECK_MSG(k.calls[ZERO_OP_REDUCE_SCATTER] == (n > 1 ? B : 0) && k.calls[ZERO_OP_ALLGATHER] == B,
              "%llu reduce-scatters, %llu all-gathers, %llu buckets", (unsigned long long)k.calls[ZERO_OP_REDUCE_SCATTER],
              (unsigned long long)k.calls[ZERO_OP_ALLGATHER], (unsigned long long)B);
    CHECK(k.bytes_sent[ZERO_OP_REDUCE_SCATTER] == moved && k.bytes_sent[ZERO_OP_ALLGATHER] == moved);
    zero_engine_destroy(e);
}

/* ---------------------------------------------------------------- stages bitwise */

/* `steps` steps: master weights, params, each step's gradient norm (eng_util.h). */
static eng_outcome train(const zero_config *c, zero_comm *comm, zero_device *dev, int steps)
{
    eng_outcome o = {0};
    const int rank = zero_comm_get_rank(comm);
    zero_engine *e = bk_engine(c, comm, dev, 1);
    if (!e) return o;
    eng_run run = {{rank}, 1, 0, 0, 0};
    CHECK_OK(eng_run_steps(e, dev, c, &run, steps, &o, NULL));
    eng_outcome_collect(e, dev, c->compute_dtype, 1, &o);
    zero_engine_destroy(e);
    return o;
}

static void check_stages(zero_comm *comm, zero_device *dev)
{
    const zero_dtype dts[] = {ZERO_F32, ZERO_BF16};
    for (int di = 0; di < 2; di++) {
        eng_outcome o[4];
        for (int stage = 0; stage < 4; stage++) {
            zero_config c = bk_config(stage, dts[di], BK_BUCKET);
            o[stage] = train(&c, comm, dev, 3);
        }
        for (int stage = 1; stage < 4; stage++) {
            if (!o[0].master || !o[stage].master) continue;
            long d = eng_first_diff(o[stage].master, o[0].master, o[0].n);
            CHECK_MSG(d < 0, "%s: stage %d master differs from stage 0 at element %ld", zero_dtype_name(dts[di]), stage,
                      d);
            d = eng_first_diff(o[stage].params, o[0].params, o[0].n);
            CHECK_MSG(d < 0, "%s: stage %d params differ from stage 0 at element %ld", zero_dtype_name(dts[di]), stage,
                      d);
            CHECK(!memcmp(o[stage].norms, o[0].norms, sizeof o[0].norms));
        }
        for (int stage = 0; stage < 4; stage++) eng_outcome_free(&o[stage]);
    }
}

/* ---------------------------------------------------------------- checkpoints across bucket sizes */

/* Every state kind of every param, whole (each rank contributes its owned
 * ranges; bit patterns summed as integers, exact since one rank owns each
 * element). */
static int32_t *all_states(zero_engine *e, zero_comm *comm, uint64_t *total)
{
    uint64_t n = 0;
    for (int p = 0; p < BK_NPARAMS; p++) n += 3 * eng_numel(&bk_model[p]);
    int32_t *mine = calloc(n, sizeof *mine), *all = calloc(n, sizeof *all);
    uint64_t off = 0;
    for (int p = 0; p < BK_NPARAMS; p++) {
        zero_param_info pi;
        CHECK_OK(zero_engine_get_param_info(e, p, &pi));
        float *buf = malloc((pi.owned_numel + 1) * sizeof *buf);
        for (int k = 0; k < 3; k++, off += pi.numel) {
            CHECK_OK(zero_engine_state_get(e, (zero_state_kind)k, p, buf));
            uint64_t done = 0;
            for (int r = 0; r < pi.num_owned_ranges; r++) {
                uint64_t b = 0, z = 0;
                CHECK_OK(zero_engine_get_param_owned_range(e, p, r, &b, &z));
                memcpy(mine + off + b, buf + done, (z - b) * sizeof *buf);
                done += z - b;
            }
        }
        free(buf);
    }
    CHECK_OK(zero_allreduce(comm, mine, all, n, ZERO_I32, ZERO_SUM));
    free(mine);
    *total = n;
    return all;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void check_checkpoint(zero_comm *comm, zero_device *dev)
{
    const int rank = zero_comm_get_rank(comm);
    char dir[256] = "";
    if (rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/zero-buckets-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        CHECK(mkdtemp(dir) != NULL);
    }
    CHECK_OK(zero_broadcast(comm, dir, dir, sizeof dir, ZERO_U8, 0));
    zero_checkpoint_options opt = ZERO_CHECKPOINT_OPTIONS_INIT;
    opt.durable = 0;
    eng_run run = {{rank}, 1, 0, 0, 0};
    zero_step_result res;

    /* saved at stage 1 with 100-element buckets after 2 steps; 2 more steps as the reference */
    /* No clipping here: the norm sums squares bucket by bucket, so its last
     * bits depend on the bucket size (the updates themselves do not). */
    zero_config c = bk_config(1, ZERO_F32, BK_BUCKET);
    c.gradient_clipping = 0;
    zero_engine *a = bk_engine(&c, comm, dev, 1);
    if (!a) return;
    for (int s = 1; s <= 2; s++) CHECK_OK(eng_train_step(a, dev, &c, &run, s, &res));
    CHECK_OK(zero_checkpoint_save(a, comm, dir, 2, NULL, &opt));
    uint64_t n = 0;
    int32_t *saved = all_states(a, comm, &n);
    for (int s = 3; s <= 4; s++) CHECK_OK(eng_train_step(a, dev, &c, &run, s, &res));
    uint64_t total = 0;
    float *want = eng_collect_master(a, &total);
    zero_engine_destroy(a);

    /* loaded with other bucket sizes (37: most params split; 5000: none) and stages */
    const uint64_t sizes[] = {37, 5000, BK_BUCKET};
    const int stages[] = {3, 2, 0};
    for (int i = 0; i < 3; i++) {
        zero_config cb = bk_config(stages[i], ZERO_F32, sizes[i]);
        cb.gradient_clipping = 0;
        zero_engine *b = bk_engine(&cb, comm, dev, 0);
        if (!b) continue;
        CHECK_OK(zero_checkpoint_load(b, comm, dir, NULL));
        uint64_t nb = 0;
        int32_t *got = all_states(b, comm, &nb);
        uint64_t bad = 0;
        for (uint64_t j = 0; j < n && nb == n; j++) bad += got[j] != saved[j];
        CHECK_MSG(nb == n && bad == 0, "bucket %llu stage %d: %llu state elements differ after load",
                  (unsigned long long)sizes[i], stages[i], (unsigned long long)bad);
        free(got);
        for (int s = 3; s <= 4; s++) CHECK_OK(eng_train_step(b, dev, &cb, &run, s, &res));
        uint64_t tb = 0;
        float *master = eng_collect_master(b, &tb);
        long d = tb == total ? eng_first_diff(master, want, total) : 0;
        CHECK_MSG(d < 0, "bucket %llu stage %d: training on after the load differs at element %ld",
                  (unsigned long long)sizes[i], stages[i], d);
        free(master);
        zero_engine_destroy(b);
    }
    free(saved);
    free(want);
    CHECK_OK(zero_barrier(comm));
    if (rank == 0) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A duplicate parameter (model parallelism) leaves the norm exactly when
 * params are split: a (410 elements, gradient 1) and b (gradient 2) span
 * several 100-element buckets and share one; with b a duplicate the norm is
 * sqrt(410), without sqrt(410 + 4 * 410). */
static void check_duplicates(zero_comm *comm, zero_device *dev)
{
    for (int stage = 1; stage < 4; stage += 2) {
        zero_config c = bk_config(stage, ZERO_F32, BK_BUCKET);
        c.gradient_accumulation_steps = 1;
        c.gradient_clipping = 0;
        c.overlap_comm = 0;
        zero_engine *e = NULL;
        int mod, pa, pb;
        int64_t shape[1] = {410};
        CHECK_OK(zero_engine_create(&e, &c, comm, dev));
        if (!e) return;
        CHECK_OK(zero_engine_add_module(e, "m", &mod));
        CHECK_OK(zero_engine_add_param(e, mod, "a", 1, shape, NULL, &pa));
        CHECK_OK(zero_engine_add_param(e, mod, "b", 1, shape, NULL, &pb));
        CHECK_OK(zero_engine_finalize(e));
        zero_param_info ia, ib;
        CHECK_OK(zero_engine_get_param_info(e, pa, &ia));
        CHECK_OK(zero_engine_get_param_info(e, pb, &ib));
        CHECK(ia.num_buckets > 1 && ib.num_buckets > 1 && ib.first_bucket == ia.first_bucket + ia.num_buckets - 1);
        for (int dup = 1; dup >= 0; dup--) {
            CHECK_OK(zero_engine_set_param_duplicate(e, pb, dup));
            CHECK_OK(zero_engine_gather(e, mod));
            float *ga = NULL, *gb = NULL;
            CHECK_OK(zero_engine_param_grad(e, pa, (void **)&ga));
            CHECK_OK(zero_engine_param_grad(e, pb, (void **)&gb));
            CHECK_OK(zero_device_sync(dev)); /* host writes: the engine's zeroing may be queued (async) */
            for (int i = 0; i < 410; i++) ga[i] = 1.0f, gb[i] = 2.0f;
            CHECK_OK(zero_engine_grads_ready(e, mod));
            CHECK_OK(zero_engine_release(e, mod));
            zero_step_result res;
            CHECK_OK(zero_engine_step(e, &res));
            CHECK_CLOSE(res.grad_norm, dup ? sqrt(410.0) : sqrt(2050.0), 1e-12);
        }
        zero_engine_destroy(e);
    }
}

/* contiguous_gradients = 0 has no effect and says so through the log handler. */
static int g_warned;
static void on_log(zero_log_level level, const char *message, void *user)
{
    (void)user;
    if (level == ZERO_LOG_WARN && strstr(message, "contiguous_gradients")) g_warned++;
}

static void check_contiguous_warning(zero_comm *comm, zero_device *dev)
{
    zero_set_log_handler(on_log, ZERO_LOG_WARN, NULL);
    zero_config c = bk_config(2, ZERO_F32, BK_BUCKET);
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    zero_engine_destroy(e);
    CHECK(g_warned == 0);
    c.contiguous_gradients = 0;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    zero_engine_destroy(e);
    CHECK_MSG(g_warned == 1, "contiguous_gradients = 0: %d warnings", g_warned);
    zero_set_log_handler(NULL, ZERO_LOG_WARN, NULL);
}

int main(void)
{
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(0, 0, &world, &dev); /* the world (60 s deadline), this rank for CHECKs, the CPU device */
    if (rc) return rc;
    check_plan(world, dev);
    check_traffic(world, dev);
    check_stages(world, dev);
    check_checkpoint(world, dev);
    check_contiguous_warning(world, dev);
    check_duplicates(world, dev);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
