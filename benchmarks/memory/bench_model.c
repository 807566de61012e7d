#include "bench_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/experimental.h>


#define EMBED_ROWS 251 /* prime: no bucket divides evenly by a dp size */

/* ------------------------------------------------------------------ layout */

static void add_param(bench_model *m, int module, const char *name, int64_t d0, int64_t d1)
{
    bench_param *p = &m->params[m->num_params++];
    char full[sizeof p->name];
    snprintf(full, sizeof full, "%s.%s", m->module_names[module], name);
    memcpy(p->name, full, sizeof full);
    p->module = module;
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->numel = (uint64_t)d0 * (uint64_t)(d1 > 0 ? d1 : 1);
    m->numel += p->numel;
}

static int add_module(bench_model *m, const char *name)
{
    snprintf(m->module_names[m->num_modules], sizeof m->module_names[0], "%s", name);
    return m->num_modules++;
}

int bench_model_init(bench_model *m, double target, int layers)
{
    memset(m, 0, sizeof *m);
    if (target < 1000 || layers < 1 || layers > 64) return -1;
    /* total(h) = 251 h + layers (8 h^2 + 7 h) + 2 h + 1: the largest h with total <= target. */
    double a = 8.0 * layers, b = EMBED_ROWS + 7.0 * layers + 2.0, c = 1.0 - target;
    int64_t h = (int64_t)floor((-b + sqrt(b * b - 4 * a * c)) / (2 * a));
    if (h < 1) h = 1;
    m->hidden = (int)h;

    int mod = add_module(m, "embed");
    add_param(m, mod, "weight", EMBED_ROWS, h);
    for (int l = 0; l < layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d", l);
        mod = add_module(m, name);
        add_param(m, mod, "ln.weight", h, 0);
        add_param(m, mod, "ln.bias", h, 0);
        add_param(m, mod, "fc1.weight", 4 * h, h);
        add_param(m, mod, "fc1.bias", 4 * h, 0);
        add_param(m, mod, "fc2.weight", h, 4 * h);
        add_param(m, mod, "fc2.bias", h, 0);
    }
    mod = add_module(m, "head");
    add_param(m, mod, "ln_f.weight", h, 0);
    add_param(m, mod, "ln_f.bias", h, 0);
    add_param(m, mod, "logit_scale", 1, 0);
    return 0;
}

int bench_model_set_compute(bench_model *m, int gemm_n, int gemm_reps)
{
    free(m->scratch);
    m->scratch = NULL;
    m->gemm_n = gemm_n > 0 ? gemm_n : 0;
    m->gemm_reps = gemm_reps > 0 ? gemm_reps : 1;
    if (!m->gemm_n) return 0;
    size_t n2 = (size_t)gemm_n * (size_t)gemm_n;
    m->scratch = malloc(3 * n2 * sizeof(float));
    if (!m->scratch) return -1;
    for (size_t i = 0; i < 3 * n2; i++) m->scratch[i] = (float)((i * 7919u) % 1000u) * 1e-3f - 0.5f;
    return 0;
}

void bench_model_free(bench_model *m)
{
    free(m->scratch);
    m->scratch = NULL;
}

/* ------------------------------------------------------------------ registration */

zero_status bench_model_register(const bench_model *m, zero_engine *e)
{
    zero_status st = ZERO_OK;
    for (int mod = 0; mod < m->num_modules && st == ZERO_OK; mod++) {
        int id = -1;
        st = zero_engine_add_module(e, m->module_names[mod], &id);
    }
    /* A spec, not values: each rank computes only what it keeps, so the peak
     * measured is the stage's own, not the stage's plus a whole fp32 model. */
    zero_init_spec init = ZERO_INIT_SPEC_INIT;
    init.kind = ZERO_INIT_UNIFORM;
    init.lo = -0.05;
    init.hi = 0.05;
    init.seed = 12345u;
    for (int i = 0; i < m->num_params && st == ZERO_OK; i++) {
        const bench_param *p = &m->params[i];
        st = zero_engine_add_param_init(e, p->module, p->name, p->ndim, p->shape, &init, NULL);
    }
    if (st == ZERO_OK) st = zero_engine_finalize(e);
    return st;
}

/* ------------------------------------------------------------------ one step */

/* C = A B on n x n matrices, i-k-j order so the inner loop streams rows and
 * vectorizes. Our own loop rather than a BLAS: the work is synthetic, must be
 * single-threaded (the ranks fill the cores) and the same on every build. */
static void sgemm_nn(int n, const float *restrict a, const float *restrict b, float *restrict c)
{
    for (int i = 0; i < n; i++) {
        float *ci = c + (size_t)i * n;
        for (int j = 0; j < n; j++) ci[j] = 0.0f;
        for (int k = 0; k < n; k++) {
            const float aik = a[(size_t)i * n + k];
            const float *bk = b + (size_t)k * n;
            for (int j = 0; j < n; j++) ci[j] += aik * bk[j];
        }
    }
}

static void module_compute(bench_model *m, int reps)
{
    if (!m->gemm_n) return;
    int n = m->gemm_n;
    float *a = m->scratch, *b = a + (size_t)n * n, *c = b + (size_t)n * n;
    for (int r = 0; r < reps; r++) sgemm_nn(n, a, b, c);
}

void bench_model_compute_step(bench_model *m)
{
    for (int mod = 0; mod < m->num_modules; mod++) module_compute(m, 3 * m->gemm_reps);
}

zero_status bench_model_step(bench_model *m, zero_engine *e, zero_device *dev, int rank,
                             zero_step_result *result)
{
    zero_status st = bench_model_micro(m, e, dev, rank);
    return st != ZERO_OK ? st : zero_engine_step(e, result);
}

zero_status bench_model_micro(bench_model *m, zero_engine *e, zero_device *dev, int rank)
{
    zero_plan_info plan;
    zero_status pst = zero_engine_get_plan_info(e, &plan);
    if (pst != ZERO_OK) return pst;
    zero_dtype dtype = plan.compute_dtype;
    /* forward */
    for (int mod = 0; mod < m->num_modules; mod++) {
        zero_status st = zero_engine_gather(e, mod);
        if (st != ZERO_OK) return st;
        for (int i = 0; i < m->num_params; i++) {
            if (m->params[i].module != mod) continue;
            void *data = NULL;
            st = zero_engine_param_data(e, i, &data);
            if (st != ZERO_OK) return st;
        }
        module_compute(m, m->gemm_reps);
        st = zero_engine_release(e, mod);
        if (st != ZERO_OK) return st;
    }
    /* backward, in reverse module order */
    for (int mod = m->num_modules - 1; mod >= 0; mod--) {
        zero_status st = zero_engine_gather(e, mod);
        if (st != ZERO_OK) return st;
        module_compute(m, 2 * m->gemm_reps);
        for (int i = 0; i < m->num_params; i++) {
            if (m->params[i].module != mod) continue;
            void *grad = NULL;
            st = zero_engine_param_grad(e, i, &grad);
            if (st != ZERO_OK) return st;
            /* The buffer is zero at the start of a micro-step, so a fill is
             * the "+=" the engine asks for. Values differ per rank and param. */
            float g = 1e-3f * (float)(1 + (i % 7)) * (float)(1 + rank);
            st = zero_fill_value(dev, grad, dtype, m->params[i].numel, g, NULL);
            if (st != ZERO_OK) return st;
        }
        st = zero_engine_grads_ready(e, mod);
        if (st != ZERO_OK) return st;
        st = zero_engine_release(e, mod);
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

/* ------------------------------------------------------------------ expected memory */

zero_status bench_expected_memory(zero_engine *e, const zero_config *cfg, zero_memory_report *formula,
                                  zero_memory_report *expected)
{
    zero_plan_info plan;
    zero_status st = zero_engine_get_plan_info(e, &plan);
    if (st != ZERO_OK) return st;
    st = zero_memory_estimate(plan.padded_numel, plan.dp_size, plan.stage, plan.compute_dtype,
                              cfg->optimizer, cfg->momentum != 0.0, formula);
    if (st != ZERO_OK) return st;
    *expected = *formula;

    const uint64_t n = (uint64_t)plan.dp_size, d = zero_dtype_size(plan.compute_dtype);
    const uint64_t P = plan.padded_numel, B = plan.max_bucket_numel;
    /* The fp32 reduced-gradient shard: stages 0-1 on top of the full grads,
     * stages 2-3 instead of the formula's d-byte shard. */
    expected->bytes[ZERO_MEM_GRADS] += plan.stage <= 1 ? P * 4 / n : P * (4 - d) / n;
    /* Stage 3 keeps persistent buckets whole (their padded numel). */
    if (plan.stage == 3) expected->bytes[ZERO_MEM_PARAMS] += plan.persistent_numel * d;
    /* Communication staging: fp32 bucket + fp32 chunk receive, per slot. */
    const uint64_t slots = cfg->overlap_comm ? 2 : 1;
    expected->bytes[ZERO_MEM_BUFFERS] += slots * (B * 4 + B * 4 / n);

    expected->total = 0;
    for (int c = 0; c < ZERO_MEM_CATEGORY_COUNT; c++) {
        expected->peak[c] = expected->bytes[c];
        expected->total += expected->bytes[c];
    }
    expected->peak_total = expected->total;
    return ZERO_OK;
}
