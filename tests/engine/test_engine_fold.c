/* The gradient fold (zero/grads.c): over one rank the reduction is one pass
 * that writes (or adds) the trainer's bucket into the shard and zeroes it;
 * where a bucket is staged (bf16, overlap_comm) the staging pass zeroes it.
 * A fold that skipped a needed zeroing would double-count a micro-step, so
 * this test checks what must hold whatever the fold does:
 *
 * - the trainer's gradient buffer holds exactly zeros at the start of every
 *   micro-step (with local_accumulation: exactly the previous micro-steps'
 *   sum, as written, and zeros at the start of every step);
 * - the step's gradient norm equals the exact norm of the averaged gradient
 *   computed here (gradients are small integers, so every sum is exact in
 *   fp32 and bf16 in any order: a skipped zeroing changes it by far more
 *   than the 1e-12 relative tolerance);
 * - the parameters are bitwise those of the unfolded reduction
 *   (ZERO_GRAD_FOLD=0: the separate copy / cast and zeroing passes), and
 *   stages 0-3 bitwise identical to each other (stages 0-1 to each other with
 *   local_accumulation).
 *
 * Three micro-steps per step, a tied parameter (two += per micro-step, as
 * GPT's wte from the embedding and the head), a parameter split across
 * 64-element buckets, persistent and sharded stage-3 buckets; fp32 and bf16,
 * overlap_comm off and on; at 1 rank (the one-pass fold), 2 and 3 (staging). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/zero.h>

#include "check.h"

#define GAS 3
#define STEPS 3
#define NP 6
/* module, numel, contributions per micro-step (2: tied) */
static const struct {
    int module;
    int64_t numel;
    int uses;
} P[NP] = {{0, 40, 2}, {0, 3, 1}, {1, 150, 1}, {1, 5, 1}, {1, 1, 1}, {2, 7, 1}};
static const char *const MODS[] = {"embed", "block", "final"};

/* Contribution j of rank r at step t, micro-step k, to element i of param p:
 * an integer in [-4, 4]. */
static float gval(int p, int64_t i, int r, int t, int k, int j)
{
    return (float)((p * 7 + i * 3 + r * 5 + k * 11 + t * 13 + j * 17) % 9) - 4.0f;
}

static float load(zero_dtype dt, const void *g, int64_t i)
{
    return dt == ZERO_F32 ? ((const float *)g)[i] : zero_bf16_to_f32(((const uint16_t *)g)[i]);
}

static void store(zero_dtype dt, void *g, int64_t i, float v)
{
    if (dt == ZERO_F32) ((float *)g)[i] = v;
    else ((uint16_t *)g)[i] = zero_f32_to_bf16(v);
}

typedef struct result {
    float *params; /* fp32 master values of every param, concatenated */
    double norms[STEPS];
} result;

static int64_t total_numel(void)
{
    int64_t n = 0;
    for (int p = 0; p < NP; p++) n += P[p].numel;
    return n;
}

static void run(zero_comm *comm, zero_device *dev, int stage, zero_dtype dt, int overlap, int local, int fold,
                result *out)
{
    const int r = zero_comm_get_rank(comm), n = zero_comm_get_size(comm);
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.compute_dtype = dt;
    c.overlap_comm = overlap;
    c.local_accumulation = local;
    c.gradient_accumulation_steps = GAS;
    c.reduce_bucket_size = c.allgather_bucket_size = 64;
    c.stage3_param_persistence_threshold = 6; /* params of 5 elements or fewer stay whole */
    c.gradient_clipping = 0;
    c.lr = 1e-2;
    if (!fold) setenv("ZERO_GRAD_FOLD", "0", 1);
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    unsetenv("ZERO_GRAD_FOLD");
    if (!e) return;
    for (int m = 0; m < 3; m++) CHECK_OK(zero_engine_add_module(e, MODS[m], NULL));
    for (int p = 0; p < NP; p++) {
        float init[150];
        for (int64_t i = 0; i < P[p].numel; i++) init[i] = 0.25f * (float)((i + p) % 5) - 0.5f;
        char name[32];
        snprintf(name, sizeof name, "p%d", p);
        CHECK_OK(zero_engine_add_param(e, P[p].module, name, 1, (int64_t[]){P[p].numel}, init, NULL));
    }
    CHECK_OK(zero_engine_finalize(e));
    const size_t es = zero_dtype_size(dt);
    for (int t = 1; t <= STEPS; t++) {
        for (int k = 0; k < GAS; k++) {
            for (int m = 2; m >= 0; m--) {
                CHECK_OK(zero_engine_gather(e, m));
                for (int p = 0; p < NP; p++) {
                    if (P[p].module != m) continue;
                    void *g = NULL;
                    CHECK_OK(zero_engine_param_grad(e, p, &g));
                    if (!g) continue;
                    CHECK_OK(zero_device_sync(dev)); /* the engine's zeroing may be queued (async device) */
                    /* What the buffer must hold now: zeros, or with local
                     * accumulation the micro-steps so far (exact integers). */
                    long bad = -1;
                    for (int64_t i = 0; i < P[p].numel && bad < 0; i++) {
                        float want = 0.0f;
                        for (int kk = 0; local && kk < k; kk++)
                            for (int j = 0; j < P[p].uses; j++) want += gval(p, i, r, t, kk, j);
                        if (load(dt, g, i) != want) bad = (long)i;
                    }
                    CHECK_MSG(bad < 0, "stage %d %s overlap %d local %d fold %d: step %d micro %d: p%d[%ld] is %g at "
                              "the start of the micro-step", stage, zero_dtype_name(dt), overlap, local, fold, t, k, p,
                              bad, bad < 0 ? 0.0 : (double)load(dt, g, bad));
                    for (int j = 0; j < P[p].uses; j++)
                        for (int64_t i = 0; i < P[p].numel; i++) store(dt, g, i, load(dt, g, i) + gval(p, i, r, t, k, j));
                    (void)es;
                }
                CHECK_OK(zero_engine_grads_ready(e, m));
                CHECK_OK(zero_engine_release(e, m));
            }
        }
        zero_step_result res;
        CHECK_OK(zero_engine_step(e, &res));
        out->norms[t - 1] = res.grad_norm;
        /* The exact norm of the averaged gradient: integer sums in double. */
        double ss = 0.0;
        for (int p = 0; p < NP; p++)
            for (int64_t i = 0; i < P[p].numel; i++) {
                double s = 0.0;
                for (int rr = 0; rr < n; rr++)
                    for (int k = 0; k < GAS; k++)
                        for (int j = 0; j < P[p].uses; j++) s += gval(p, i, rr, t, k, j);
                ss += s * s;
            }
        const double want = sqrt(ss) / ((double)n * GAS);
        CHECK_MSG(fabs(res.grad_norm - want) <= 1e-12 * want,
                  "stage %d %s overlap %d local %d fold %d: step %d: grad norm %.17g, exact %.17g", stage,
                  zero_dtype_name(dt), overlap, local, fold, t, res.grad_norm, want);
    }
    out->params = calloc((size_t)total_numel(), sizeof(float));
    int64_t off = 0;
    for (int p = 0; p < NP; p++) {
        CHECK_OK(zero_engine_read_param(e, p, out->params + off));
        off += P[p].numel;
    }
    zero_engine_destroy(e);
}

static int same(const result *a, const result *b)
{
    return a->params && b->params && !memcmp(a->params, b->params, (size_t)total_numel() * sizeof(float)) &&
           !memcmp(a->norms, b->norms, sizeof a->norms);
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT;
    cc.timeout_s = 60;
    zero_comm *world = NULL;
    zero_device *dev = NULL;
    if (zero_comm_create_world(&world, &cc) != ZERO_OK || zero_device_create(&dev, ZERO_DEVICE_CPU, 0) != ZERO_OK) {
        fprintf(stderr, "set-up: %s\n", zero_last_error());
        return 1;
    }
    check_set_rank(zero_comm_get_rank(world));
    const zero_dtype dts[] = {ZERO_F32, ZERO_BF16};
    for (int d = 0; d < 2; d++)
        for (int overlap = 0; overlap < 2; overlap++)
            for (int local = 0; local < 2; local++) {
                result ref = {0};
                for (int stage = 0; stage < (local ? 2 : 4); stage++) {
                    result on = {0}, off = {0};
                    run(world, dev, stage, dts[d], overlap, local, 1, &on);
                    run(world, dev, stage, dts[d], overlap, local, 0, &off);
                    CHECK_MSG(same(&on, &off), "stage %d %s overlap %d local %d: the fold changed the result", stage,
                              zero_dtype_name(dts[d]), overlap, local);
                    if (stage == 0) {
                        ref = on;
                        on.params = NULL;
                    } else {
                        CHECK_MSG(same(&on, &ref), "stage %d %s overlap %d local %d: differs from stage 0", stage,
                                  zero_dtype_name(dts[d]), overlap, local);
                    }
                    free(on.params);
                    free(off.params);
                }
                free(ref.params);
            }
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
