/* Communication volume per step, from the comm's byte counters, against
 * ZeRO's analysis (paper section 7): with P = padded element count and N
 * ranks, per rank and per step (one micro-step),
 *   stages 0-2: 2 P (N-1)/N elements  (reduce-scatter of fp32 gradients +
 *               all-gather of fp32 gradients (stage 0) or of compute-dtype
 *               parameters (stages 1-2))
 *   stage 3:    3 P (N-1)/N elements  (reduce-scatter + an all-gather of the
 *               parameters in forward and again in backward)
 * Elements are counted at the size each op moves: reduce-scatters carry fp32
 * (gradients are reduced in fp32), parameter all-gathers the compute dtype.
 * Each step adds one all-reduce of one double (the gradient norm, which also
 * carries the overflow flag). The stage-3 step is the second one, so the
 * prefetcher replays the recorded order (overlap_comm on) and must not add
 * traffic. Persistence is off (threshold 0) so every param is sharded. */
#include "eng_util.h"

/* A bound on the largest module's padded element count (persistence off:
 * every bucket is gathered): its elements plus n - 1 padding per bucket that
 * is not full, and only a bucket a param ends in can be partly full. */
static uint64_t largest_module(int n)
{
    uint64_t per[ENG_NMODULES] = {0}, best = 0;
    for (int p = 0; p < ENG_NPARAMS; p++) per[eng_model[p].module] += eng_numel(&eng_model[p]) + (uint64_t)n - 1;
    for (int m = 0; m < ENG_NMODULES; m++) best = per[m] > best ? per[m] : best;
    return best;
}

static void check_stage(zero_comm *comm, zero_device *dev, int stage, zero_dtype dt, int gas, int overlap)
{
    const int n = zero_comm_get_size(comm), rank = zero_comm_get_rank(comm);
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.compute_dtype = dt;
    c.gradient_accumulation_steps = gas;
    c.overlap_comm = overlap;
    c.reduce_bucket_size = ENG_BUCKET;
    c.stage3_param_persistence_threshold = 0;
    c.stage3_prefetch_bucket_size = 1500;
    c.stage3_max_live_parameters = 3000;
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return;
    CHECK_OK(eng_register(e, 1));
    CHECK_OK(zero_engine_finalize(e));
    zero_plan_info pi;
    CHECK_OK(zero_engine_get_plan_info(e, &pi));
    eng_run run = {{rank}, 1, 0, 0, 0};
    zero_step_result res;
    CHECK_OK(eng_train_step(e, dev, &c, &run, 1, &res)); /* records the stage-3 order */
    zero_comm_counters k;
    eng_step_counted(e, dev, &c, &run, 2, comm, &k);

    const uint64_t P = pi.padded_numel, N = (uint64_t)n, d = zero_dtype_size(dt);
    const uint64_t moved = P * (N - 1) / N; /* elements of one reduce-scatter or all-gather per rank */
    uint64_t want_rs = (uint64_t)gas * moved * 4;
    uint64_t want_ag = stage == 0 ? moved * 4 : stage < 3 ? moved * d : 2 * (uint64_t)gas * moved * d;
    uint64_t rs = k.bytes_sent[ZERO_OP_REDUCE_SCATTER], ag = k.bytes_sent[ZERO_OP_ALLGATHER];
    CHECK_MSG(rs == want_rs && k.bytes_recv[ZERO_OP_REDUCE_SCATTER] == want_rs,
              "stage %d %s gas %d: reduce-scatter sent %llu bytes, theory %llu", stage, zero_dtype_name(dt), gas,
              (unsigned long long)rs, (unsigned long long)want_rs);
    CHECK_MSG(ag == want_ag && k.bytes_recv[ZERO_OP_ALLGATHER] == want_ag,
              "stage %d %s gas %d overlap %d: all-gather sent %llu bytes, theory %llu", stage, zero_dtype_name(dt),
              gas, overlap, (unsigned long long)ag, (unsigned long long)want_ag);
    /* in elements: 2 P (N-1)/N or 3 P (N-1)/N for one micro-step */
    if (gas == 1) {
        uint64_t elems = rs / 4 + ag / (stage == 0 ? 4 : d);
        CHECK(elems == (stage == 3 ? 3 : 2) * moved);
    }
    CHECK(k.calls[ZERO_OP_ALLREDUCE] == 1);
    /* the prefetcher served gathers from the recorded order and wasted none */
    zero_engine_stats es;
    CHECK_OK(zero_engine_get_stats(e, &es));
    CHECK(es.steps == 2 && es.order_changes == 0 && es.prefetch_dropped == 0);
    /* over one rank the reduction is one local pass, nothing to overlap (grads.c) */
    CHECK(es.async_reduce_scatters == (overlap && n > 1 ? es.reduce_scatters : 0));
    if (stage == 3 && overlap) {
        /* the budgets hold: in flight <= stage3_prefetch_bucket_size; gathered
         * + in flight <= stage3_max_live_parameters, plus the one module the
         * trainer gathers itself (explicit gathers always proceed) */
        CHECK_MSG(es.peak_inflight_numel <= c.stage3_prefetch_bucket_size, "in flight %llu > %llu",
                  (unsigned long long)es.peak_inflight_numel, (unsigned long long)c.stage3_prefetch_bucket_size);
        CHECK_MSG(es.peak_live_numel <= c.stage3_max_live_parameters + largest_module(pi.dp_size),
                  "live %llu > %llu + one module", (unsigned long long)es.peak_live_numel,
                  (unsigned long long)c.stage3_max_live_parameters);
        CHECK(es.peak_inflight_numel > 0);
    }
    if (stage == 3 && overlap)
        CHECK_MSG(es.prefetch_hits > 0 && es.prefetch_hits == es.prefetches,
                  "stage 3: %llu prefetches, %llu hits", (unsigned long long)es.prefetches,
                  (unsigned long long)es.prefetch_hits);
    else
        CHECK(es.prefetches == 0);
    CHECK(k.bytes_sent[ZERO_OP_BROADCAST] == 0 && k.bytes_sent[ZERO_OP_SEND] == 0);
    if (rank == 0 && gas == 1 && dt == ZERO_BF16)
        fprintf(stderr, "stage %d, N=%d, P=%llu: %llu elements per rank per step (%.2f P(N-1)/N)\n", stage, n,
                (unsigned long long)P, (unsigned long long)(rs / 4 + ag / (stage == 0 ? 4 : d)),
                moved ? (double)(rs / 4 + ag / (stage == 0 ? 4 : d)) / (double)moved : 0.0);
    zero_engine_destroy(e);
}

static int warnings;
static void count_warnings(zero_log_level level, const char *msg, void *user)
{
    (void)user;
    if (level == ZERO_LOG_WARN && strstr(msg, "gather order changed")) warnings++;
}

/* A changed module order: one warning, prefetching stops for the step, the
 * new order is recorded and replayed from the next step; results stay right. */
static void check_order_change(zero_comm *comm, zero_device *dev)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = 3;
    c.overlap_comm = 1;
    c.reduce_bucket_size = ENG_BUCKET;
    c.stage3_param_persistence_threshold = ENG_PERSIST;
    c.stage3_prefetch_bucket_size = 2500;
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return;
    CHECK_OK(eng_register(e, 1));
    CHECK_OK(zero_engine_finalize(e));
    zero_set_log_handler(count_warnings, ZERO_LOG_WARN, NULL);
    eng_run run = {{zero_comm_get_rank(comm)}, 1, 0, 0, 0};
    zero_step_result res;
    CHECK_OK(eng_train_step(e, dev, &c, &run, 1, &res));
    CHECK_OK(eng_train_step(e, dev, &c, &run, 2, &res));
    zero_engine_stats a;
    CHECK_OK(zero_engine_get_stats(e, &a));
    CHECK(warnings == 0 && a.order_changes == 0);
    run.forward_reversed = 1;
    CHECK_OK(eng_train_step(e, dev, &c, &run, 3, &res));
    zero_engine_stats b;
    CHECK_OK(zero_engine_get_stats(e, &b));
    CHECK_MSG(warnings == 1 && b.order_changes == 1, "%d warnings, %llu order changes", warnings,
              (unsigned long long)b.order_changes);
    CHECK_OK(eng_train_step(e, dev, &c, &run, 4, &res)); /* replays the new order */
    zero_engine_stats d;
    CHECK_OK(zero_engine_get_stats(e, &d));
    CHECK(warnings == 1 && d.order_changes == 1 && d.prefetch_hits > b.prefetch_hits);
    zero_set_log_handler(NULL, ZERO_LOG_WARN, NULL);
    zero_engine_destroy(e);
}

int main(void)
{
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(0, 0, &world, &dev); /* the world (60 s deadline), this rank for CHECKs, the CPU device */
    if (rc) return rc;
    for (int stage = 0; stage < 4; stage++)
        for (int gas = 1; gas <= 2; gas++) {
            check_stage(world, dev, stage, ZERO_F32, gas, 0);
            check_stage(world, dev, stage, ZERO_BF16, gas, 1);
        }
    check_order_change(world, dev);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
