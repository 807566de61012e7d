/* Sharded construction: zero_engine_add_param_init (engine.h).
 *
 *   test_engine_init   at the world size it runs with (1-4):
 *     philox   Philox4x32-10 gives Random123's known answers (tests/kat_vectors,
 *              github.com/DEShawResearch/random123: the three "philox4x32 10" lines)
 *     formula  zero_init_generate equals the definition in engine.h, recomputed
 *              here from the raw Philox words, bitwise (normal, uniform, ranges
 *              that start mid-block); normal/uniform statistics are plausible
 *     values   every stage 0-3 x f32/bf16: each parameter (normal, uniform,
 *              constant, ones, zeros, callback, add_param values, with buckets
 *              of 1000 elements, persistent ones) reads back (read_param,
 *              state_get of the owned part, the compute-dtype params) bitwise
 *              equal to the reference values - the same reference at every
 *              world size, so the init is identical at world 1-4 and stages 0-3
 *     ranges   a callback is asked for exactly the elements this rank keeps,
 *              each once (its owned range at stage 3, the whole parameter
 *              where the stage keeps it whole), plus the documented probes
 *     mismatch (world >= 2) a different seed, value or callback tag on the last
 *              rank fails finalize with ZERO_MISMATCH naming the parameter and
 *              the rank; a failing callback fails finalize naming the range
 *     bad spec invalid specs are refused naming the field
 *     memory   stages 0-3: with specs the engine's peak during finalize IS its
 *              steady state (every category, to the byte; nothing held before);
 *              with add_param values the peak is that plus exactly 4 bytes x
 *              the parameters (category other)
 *   test_engine_init rss   (world 2 in the suite) a 50M-parameter stage-3 model:
 *              the process's peak resident memory while building it with specs
 *              is the engine's steady state (within 3% + 16 MB), and at least
 *              0.9 x 4 bytes x numel below building it with add_param values */
#include <malloc.h>
#include <unistd.h>

#include "eng_util.h"
#include "common/proc_mem.h"

#include "../../zero/philox.h"

static int g_rank, g_world;

/* ---------------------------------------------------------------- philox known answers */

static void test_philox_kat(void)
{
    /* counter[4], key[2] -> out[4]: Random123 tests/kat_vectors, "philox4x32 10" */
    static const uint32_t kat[3][10] = {
        {0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000,
         0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
         0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
         0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        zero_philox4x32_10(kat[t], kat[t] + 4, out);
        for (int k = 0; k < 4; k++)
            CHECK_MSG(out[k] == kat[t][6 + k], "philox KAT %d word %d: %08x, expected %08x", t, k, out[k],
                      kat[t][6 + k]);
    }
}

/* ---------------------------------------------------------------- the definition, recomputed */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

/* engine.h's text, step by step. */
static float definition(const zero_init_spec *sp, const char *name, uint64_t i)
{
    uint64_t s = fnv1a(name), j = i / 4;
    uint32_t key[2] = {(uint32_t)(sp->seed & 0xffffffffu), (uint32_t)(sp->seed >> 32)};
    uint32_t ctr[4] = {(uint32_t)(j & 0xffffffffu), (uint32_t)(j >> 32), (uint32_t)(s & 0xffffffffu),
                       (uint32_t)(s >> 32)};
    uint32_t x[4];
    zero_philox4x32_10(ctr, key, x);
    double u[4];
    for (int k = 0; k < 4; k++) u[k] = ((double)x[k] + 0.5) / 4294967296.0;
    if (sp->kind == ZERO_INIT_UNIFORM) return (float)(sp->lo + (sp->hi - sp->lo) * u[i % 4]);
    unsigned q = (unsigned)(i % 4) / 2;
    double r = sqrt(-2.0 * log(u[2 * q])), t = 6.283185307179586 * u[2 * q + 1];
    double z = i % 2 == 0 ? r * cos(t) : r * sin(t);
    return (float)(sp->mean + sp->std * z);
}

static void test_formula(void)
{
    zero_init_spec n = ZERO_INIT_SPEC_INIT, u = ZERO_INIT_SPEC_INIT;
    n.kind = ZERO_INIT_NORMAL;
    n.mean = 0.5;
    n.std = 2.0;
    n.seed = 0x123456789abcdefull;
    u.kind = ZERO_INIT_UNIFORM;
    u.lo = -1.0;
    u.hi = 3.0;
    u.seed = 42;
    const uint64_t N = 200003, off = 5; /* a range starting mid-block */
    float *v = malloc(N * sizeof *v);
    const zero_init_spec *specs[2] = {&n, &u};
    for (int s = 0; s < 2; s++) {
        CHECK_OK(zero_init_generate(specs[s], "h.3.mlp.c_fc.weight", off, off + N, v));
        long bad = -1;
        for (uint64_t i = 0; i < N && bad < 0; i++) {
            float want = definition(specs[s], "h.3.mlp.c_fc.weight", off + i);
            if (memcmp(&want, v + i, 4)) bad = (long)i;
        }
        CHECK_MSG(bad < 0, "spec %d: element %ld differs from engine.h's definition", s, bad);
        double sum = 0, sq = 0, lo = 1e30, hi = -1e30;
        for (uint64_t i = 0; i < N; i++) {
            sum += v[i];
            sq += (double)v[i] * v[i];
            lo = v[i] < lo ? v[i] : lo;
            hi = v[i] > hi ? v[i] : hi;
        }
        double mean = sum / N, sd = sqrt(sq / N - mean * mean);
        if (s == 0) { /* 200k samples: standard error of the mean 0.0045, of the std ~0.3% */
            CHECK_MSG(fabs(mean - 0.5) < 0.03 && fabs(sd - 2.0) < 0.02, "normal: mean %g std %g", mean, sd);
        } else {
            CHECK_MSG(lo >= -1.0 && hi <= 3.0 && fabs(mean - 1.0) < 0.02, "uniform: [%g, %g] mean %g", lo, hi, mean);
        }
    }
    /* another name or seed is another stream; a sub-range is the same values */
    float a[8], b[8];
    CHECK_OK(zero_init_generate(&n, "a", 0, 8, a));
    CHECK_OK(zero_init_generate(&n, "b", 0, 8, b));
    CHECK(memcmp(a, b, sizeof a) != 0);
    CHECK_OK(zero_init_generate(&n, "a", 3, 8, b));
    CHECK(memcmp(a + 3, b, 5 * sizeof *a) == 0);
    zero_init_spec c = ZERO_INIT_SPEC_INIT;
    c.kind = ZERO_INIT_CALLBACK;
    ENG_EXPECT(zero_init_generate(&c, "a", 0, 8, a), ZERO_INVALID_ARGUMENT, "fill NULL");
    free(v);
}

/* ---------------------------------------------------------------- the model's inits */

enum { K_NORMAL, K_UNIFORM, K_CONSTANT, K_ONES, K_ZEROS, K_CALLBACK, K_VALUES, K_COUNT };

static int kind_of(int p) { return p % K_COUNT; }

static void param_name(int p, char *buf, size_t n) { snprintf(buf, n, "%s.p%d", eng_module_names[eng_model[p].module], p); }

static zero_init_spec spec_of(int p, uint64_t seed)
{
    zero_init_spec s = ZERO_INIT_SPEC_INIT;
    switch (kind_of(p)) {
    case K_NORMAL: s.kind = ZERO_INIT_NORMAL; s.mean = 0.01 * p; s.std = 0.02; s.seed = seed; break;
    case K_UNIFORM: s.kind = ZERO_INIT_UNIFORM; s.lo = -0.5; s.hi = 0.25; s.seed = seed + 1; break;
    case K_CONSTANT: s.kind = ZERO_INIT_CONSTANT; s.value = 0.75 + p; break;
    case K_ONES: s.kind = ZERO_INIT_ONES; break;
    case K_CALLBACK: s.kind = ZERO_INIT_CALLBACK; s.seed = seed; break;
    default: s.kind = ZERO_INIT_ZEROS; break;
    }
    return s;
}

static float cb_value(int p, uint64_t i) { return eng_init_value(p, i) + 0.25f; }

/* What the callback was asked for: per parameter, per element, how often. */
typedef struct cb_log {
    unsigned char *count[64];
    int calls, fail_param;
} cb_log;

static zero_status cb_fill(void *user, int param, const char *name, uint64_t begin, uint64_t end, float *out)
{
    cb_log *log = user;
    char want[64];
    param_name(param, want, sizeof want);
    if (strcmp(name, want) != 0 || begin >= end || end > eng_numel(&eng_model[param])) {
        fprintf(stderr, "[rank %d] callback: param %d '%s' [%llu, %llu): bad arguments\n", g_rank, param, name,
                (unsigned long long)begin, (unsigned long long)end);
        return ZERO_INTERNAL;
    }
    if (param == log->fail_param) return ZERO_IO;
    log->calls++;
    for (uint64_t i = begin; i < end; i++) {
        out[i - begin] = cb_value(param, i);
        if (log->count[param]) log->count[param][i]++;
    }
    return ZERO_OK;
}

/* The full reference values of parameter p. */
static void reference(int p, uint64_t seed, float *out)
{
    uint64_t n = eng_numel(&eng_model[p]);
    char name[64];
    param_name(p, name, sizeof name);
    zero_init_spec s = spec_of(p, seed);
    if (kind_of(p) == K_CALLBACK) {
        for (uint64_t i = 0; i < n; i++) out[i] = cb_value(p, i);
    } else if (kind_of(p) == K_VALUES) {
        for (uint64_t i = 0; i < n; i++) out[i] = eng_init_value(p, i);
    } else {
        CHECK_OK(zero_init_generate(&s, name, 0, n, out));
    }
}

/* Register the model; `tweak(p, &spec, values)` may change one rank's init. */
typedef void (*tweak_fn)(int p, zero_init_spec *s, float *values);

static int g_all_specs; /* register K_VALUES params through a spec too (constant 0.5) */

static zero_status register_model(zero_engine *e, uint64_t seed, cb_log *log, tweak_fn tweak)
{
    zero_status st;
    for (int m = 0; m < ENG_NMODULES; m++)
        if ((st = zero_engine_add_module(e, eng_module_names[m], NULL)) != ZERO_OK) return st;
    for (int p = 0; p < ENG_NPARAMS; p++) {
        char name[64];
        param_name(p, name, sizeof name);
        zero_init_spec s = spec_of(p, seed);
        s.fill = cb_fill;
        s.user = log;
        uint64_t n = eng_numel(&eng_model[p]);
        float *values = NULL;
        if (kind_of(p) == K_VALUES && g_all_specs) {
            s.kind = ZERO_INIT_CONSTANT;
            s.value = 0.5;
        } else if (kind_of(p) == K_VALUES) {
            values = malloc(n * sizeof *values);
            for (uint64_t i = 0; i < n; i++) values[i] = eng_init_value(p, i);
        }
        if (tweak) tweak(p, &s, values);
        if (values) st = zero_engine_add_param(e, eng_model[p].module, name, eng_model[p].ndim, eng_model[p].shape,
                                               values, NULL);
        else st = zero_engine_add_param_init(e, eng_model[p].module, name, eng_model[p].ndim, eng_model[p].shape, &s,
                                             NULL);
        free(values);
        if (st != ZERO_OK) return st;
    }
    return ZERO_OK;
}

static zero_config base_config(int stage, zero_dtype dt)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.compute_dtype = dt;
    c.reduce_bucket_size = ENG_BUCKET;
    c.stage3_param_persistence_threshold = ENG_PERSIST;
    return c;
}

/* ---------------------------------------------------------------- values and ranges */

/* Element i of param p lies in one of this rank's owned ranges. */
static int is_owned(zero_engine *e, int p, uint64_t i)
{
    zero_param_info pi;
    CHECK_OK(zero_engine_get_param_info(e, p, &pi));
    for (int r = 0; r < pi.num_owned_ranges; r++) {
        uint64_t b = 0, z = 0;
        CHECK_OK(zero_engine_get_param_owned_range(e, p, r, &b, &z));
        if (i >= b && i < z) return 1;
    }
    return 0;
}

static void test_values(zero_comm *comm, zero_device *dev, int stage, zero_dtype dt)
{
    const uint64_t seed = 1234;
    zero_config c = base_config(stage, dt);
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return;
    cb_log log = {{0}, 0, -1};
    for (int p = 0; p < ENG_NPARAMS; p++) log.count[p] = calloc(eng_numel(&eng_model[p]), 1);
    CHECK_OK(register_model(e, seed, &log, NULL));
    /* the spec path holds nothing before finalize; only the add_param copies */
    zero_memory_report r0;
    CHECK_OK(zero_engine_get_memory_report(e, &r0));
    uint64_t values_bytes = 0;
    for (int p = 0; p < ENG_NPARAMS; p++)
        if (kind_of(p) == K_VALUES) values_bytes += eng_numel(&eng_model[p]) * 4;
    CHECK_MSG(r0.total == values_bytes && r0.bytes[ZERO_MEM_OTHER] == values_bytes,
              "before finalize: %llu bytes held, expected %llu (the add_param copies only)",
              (unsigned long long)r0.total, (unsigned long long)values_bytes);
    CHECK_OK(zero_engine_finalize(e));

    /* the callback: exactly the kept elements, once each, plus the probes */
    for (int p = 0; p < ENG_NPARAMS; p++) {
        if (kind_of(p) != K_CALLBACK) continue;
        zero_param_info pi;
        CHECK_OK(zero_engine_get_param_info(e, p, &pi));
        uint64_t n = pi.numel;
        long bad = -1;
        for (uint64_t i = 0; i < n && bad < 0; i++) {
            int kept = stage < 3 || pi.persistent || is_owned(e, p, i);
            int probes = 0;
            for (int k = 0; g_world > 1 && k < 5; k++) probes += (n - 1) * (uint64_t)k / 4 == i;
            if (log.count[p][i] != kept + probes) bad = (long)i;
        }
        CHECK_MSG(bad < 0, "stage %d: callback of param %d asked for element %ld %d times (owned [%llu, %llu), "
                  "persistent %d)", stage, p, bad, bad >= 0 ? log.count[p][bad] : 0,
                  (unsigned long long)pi.owned_begin, (unsigned long long)pi.owned_end, pi.persistent);
    }

    /* every parameter reads back bitwise the reference */
    uint64_t total = 0;
    float *master = eng_collect_master(e, &total);
    float *params = eng_collect_params(e, dev, dt);
    uint64_t off = 0;
    for (int p = 0; p < ENG_NPARAMS; p++) {
        zero_param_info pi;
        CHECK_OK(zero_engine_get_param_info(e, p, &pi));
        float *want = malloc(pi.numel * sizeof *want), *own = malloc(pi.numel * sizeof *own);
        reference(p, seed, want);
        CHECK_MSG(memcmp(master + off, want, pi.numel * 4) == 0, "stage %d %s: read_param of param %d (kind %d) "
                  "differs from the reference at element %ld", stage, zero_dtype_name(dt), p, kind_of(p),
                  eng_first_diff(master + off, want, pi.numel));
        CHECK_OK(zero_engine_state_get(e, ZERO_STATE_MASTER, p, own));
        /* the owned ranges, one after another (several for a param split across buckets) */
        uint64_t done = 0;
        for (int r = 0; r < pi.num_owned_ranges; r++) {
            uint64_t b = 0, z = 0;
            CHECK_OK(zero_engine_get_param_owned_range(e, p, r, &b, &z));
            CHECK(memcmp(own + done, want + b, (z - b) * 4) == 0);
            done += z - b;
        }
        CHECK(done == pi.owned_numel);
        long bad = -1;
        for (uint64_t i = 0; i < pi.numel && bad < 0; i++) {
            unsigned char raw[4];
            eng_store(dt, raw, 0, want[i]);
            float w = eng_load(dt, raw, 0);
            if (memcmp(&w, params + off + i, 4)) bad = (long)i;
        }
        CHECK_MSG(bad < 0, "stage %d %s: compute-dtype param %d differs at element %ld", stage, zero_dtype_name(dt),
                  p, bad);
        free(want);
        free(own);
        off += pi.numel;
    }
    CHECK(off == total);
    free(master);
    free(params);
    for (int p = 0; p < ENG_NPARAMS; p++) free(log.count[p]);
    zero_engine_destroy(e);
}

/* ---------------------------------------------------------------- mismatch */

static int g_tweak_param, g_tweak_what;

static void tweak_last_rank(int p, zero_init_spec *s, float *values)
{
    if (g_rank != g_world - 1 || p != g_tweak_param) return;
    if (g_tweak_what == 0) s->seed += 1;           /* another seed */
    else if (g_tweak_what == 1) values[0] += 1.0f; /* another value at sample index 0 */
    else if (g_tweak_what == 2) s->seed += 7;      /* another callback tag */
    else s->std *= 2;                              /* another std */
}

static void test_mismatch(zero_comm *comm, zero_device *dev)
{
    if (g_world < 2) return;
    /* (param, what): normal seed, add_param values, callback tag, normal std */
    const int cases[4][2] = {{7, 0}, {6, 1}, {5, 2}, {14, 3}};
    for (int t = 0; t < 4; t++) {
        g_tweak_param = cases[t][0];
        g_tweak_what = cases[t][1];
        zero_config c = base_config(3, ZERO_F32);
        zero_engine *e = NULL;
        CHECK_OK(zero_engine_create(&e, &c, comm, dev));
        if (!e) return;
        cb_log log = {{0}, 0, -1};
        CHECK_OK(register_model(e, 99, &log, tweak_last_rank));
        char name[64], needle[160];
        param_name(g_tweak_param, name, sizeof name);
        snprintf(needle, sizeof needle, "first difference at param #%d '%s' (module '%s'): rank(s) %d differ from rank 0",
                 g_tweak_param, name, eng_module_names[eng_model[g_tweak_param].module], g_world - 1);
        ENG_EXPECT(zero_engine_finalize(e), ZERO_MISMATCH, needle);
        zero_engine_destroy(e);
    }
    /* a callback that fails on the last rank: that rank names the range, the others the rank */
    zero_config c = base_config(3, ZERO_F32);
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return;
    cb_log log = {{0}, 0, g_rank == g_world - 1 ? 5 : -1};
    CHECK_OK(register_model(e, 99, &log, NULL));
    if (g_rank == g_world - 1)
        ENG_EXPECT(zero_engine_finalize(e), ZERO_IO,
                   "init callback of parameter 'block0.p5' failed on elements [0, 1)");
    else ENG_EXPECT(zero_engine_finalize(e), ZERO_MISMATCH, "param #0");
    zero_engine_destroy(e);
}

static void test_bad_specs(zero_comm *comm, zero_device *dev)
{
    zero_config c = base_config(1, ZERO_F32);
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return;
    int m = -1;
    CHECK_OK(zero_engine_add_module(e, "m", &m));
    int64_t shape[1] = {10};
    zero_init_spec s = ZERO_INIT_SPEC_INIT;
    s.kind = ZERO_INIT_NORMAL;
    s.std = -1;
    ENG_EXPECT(zero_engine_add_param_init(e, m, "w", 1, shape, &s, NULL), ZERO_INVALID_ARGUMENT, "std >= 0");
    s.std = NAN;
    ENG_EXPECT(zero_engine_add_param_init(e, m, "w", 1, shape, &s, NULL), ZERO_INVALID_ARGUMENT, "'w': normal init");
    s = (zero_init_spec)ZERO_INIT_SPEC_INIT;
    s.kind = ZERO_INIT_UNIFORM;
    s.lo = 1;
    s.hi = 0;
    ENG_EXPECT(zero_engine_add_param_init(e, m, "w", 1, shape, &s, NULL), ZERO_INVALID_ARGUMENT, "lo <= hi");
    s = (zero_init_spec)ZERO_INIT_SPEC_INIT;
    s.kind = ZERO_INIT_CALLBACK;
    ENG_EXPECT(zero_engine_add_param_init(e, m, "w", 1, shape, &s, NULL), ZERO_INVALID_ARGUMENT, "fill NULL");
    s = (zero_init_spec)ZERO_INIT_SPEC_INIT;
    s.kind = (zero_init_kind)42;
    ENG_EXPECT(zero_engine_add_param_init(e, m, "w", 1, shape, &s, NULL), ZERO_INVALID_ARGUMENT,
               "unknown init kind 42");
    s = (zero_init_spec)ZERO_INIT_SPEC_INIT;
    s.size = 8;
    ENG_EXPECT(zero_engine_add_param_init(e, m, "w", 1, shape, &s, NULL), ZERO_INVALID_ARGUMENT, "ZERO_INIT_SPEC_INIT");
    CHECK(zero_engine_get_num_params(e) == 0);
    /* NULL spec = zeros */
    CHECK_OK(zero_engine_add_param_init(e, m, "w", 1, shape, NULL, NULL));
    CHECK_OK(zero_engine_finalize(e));
    float v[10];
    CHECK_OK(zero_engine_read_param(e, 0, v));
    for (int i = 0; i < 10; i++) CHECK(v[i] == 0.0f);
    zero_engine_destroy(e);
}

/* ---------------------------------------------------------------- memory: the report */

static void test_memory_peak(zero_comm *comm, zero_device *dev, int stage, zero_dtype dt)
{
    static const char *names[] = {"params", "grads", "master", "moments", "buffers", "other"};
    zero_memory_report spec_rep, values_rep;
    for (int values = 0; values < 2; values++) {
        zero_config c = base_config(stage, dt);
        zero_engine *e = NULL;
        CHECK_OK(zero_engine_create(&e, &c, comm, dev));
        if (!e) return;
        cb_log log = {{0}, 0, -1};
        g_all_specs = 1;
        CHECK_OK(values ? eng_register(e, 1) : register_model(e, 5, &log, NULL));
        g_all_specs = 0;
        CHECK_OK(zero_engine_finalize(e));
        CHECK_OK(zero_engine_get_memory_report(e, values ? &values_rep : &spec_rep));
        zero_engine_destroy(e);
    }
    uint64_t values_bytes = 0;
    for (int p = 0; p < ENG_NPARAMS; p++) values_bytes += eng_numel(&eng_model[p]) * 4;
    /* the same steady state either way */
    for (int k = 0; k < ZERO_MEM_CATEGORY_COUNT; k++)
        CHECK_MSG(spec_rep.bytes[k] == values_rep.bytes[k], "stage %d: %s after finalize: %llu (spec) vs %llu", stage,
                  names[k], (unsigned long long)spec_rep.bytes[k], (unsigned long long)values_rep.bytes[k]);
    CHECK(spec_rep.bytes[ZERO_MEM_OTHER] == 0);
    /* spec: the peak is the steady state, category by category */
    for (int k = 0; k < ZERO_MEM_CATEGORY_COUNT; k++)
        CHECK_MSG(spec_rep.peak[k] == spec_rep.bytes[k], "stage %d %s: spec init peaked at %llu %s bytes, steady %llu",
                  stage, zero_dtype_name(dt), (unsigned long long)spec_rep.peak[k], names[k],
                  (unsigned long long)spec_rep.bytes[k]);
    CHECK_MSG(spec_rep.peak_total == spec_rep.total, "stage %d: spec peak %llu, steady %llu", stage,
              (unsigned long long)spec_rep.peak_total, (unsigned long long)spec_rep.total);
    /* values: + exactly 4 bytes x numel, held until the buffers are filled */
    CHECK(values_rep.peak[ZERO_MEM_OTHER] == values_bytes);
    CHECK_MSG(values_rep.peak_total == values_rep.total + values_bytes,
              "stage %d: add_param values peak %llu, expected steady %llu + %llu", stage,
              (unsigned long long)values_rep.peak_total, (unsigned long long)values_rep.total,
              (unsigned long long)values_bytes);
}

/* ---------------------------------------------------------------- memory: the process */

#define RSS_PARAMS 10
#define RSS_ROWS 5000
#define RSS_COLS 1000 /* 10 x 5M = 50M parameters */

/* Build the model one way and return the growth of peak resident memory;
 * *steady = the engine's total after finalize. */
static long build_rss(zero_comm *comm, zero_device *dev, int values, uint64_t *steady, uint64_t *eng_peak)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = 3;
    c.reduce_bucket_size = RSS_ROWS * RSS_COLS;
    if (!proc_reset_peak()) return -1;
    long before = proc_rss_bytes();
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return -1;
    const int64_t shape[2] = {RSS_ROWS, RSS_COLS};
    /* the caller's side of the values path: one tensor at a time, as a trainer would */
    float *buf = values ? malloc((size_t)RSS_ROWS * RSS_COLS * sizeof *buf) : NULL;
    for (int p = 0; p < RSS_PARAMS; p++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d.weight", p);
        int m = -1;
        CHECK_OK(zero_engine_add_module(e, name, &m));
        zero_init_spec s = ZERO_INIT_SPEC_INIT;
        s.kind = ZERO_INIT_UNIFORM; /* cheaper than normal: this measures memory */
        s.lo = -0.02;
        s.hi = 0.02;
        s.seed = 3;
        if (values) {
            for (size_t i = 0; i < (size_t)RSS_ROWS * RSS_COLS; i++) buf[i] = 0.01f;
            CHECK_OK(zero_engine_add_param(e, m, name, 2, shape, buf, NULL));
        } else {
            CHECK_OK(zero_engine_add_param_init(e, m, name, 2, shape, &s, NULL));
        }
    }
    free(buf);
    CHECK_OK(zero_engine_finalize(e));
    long hwm = proc_hwm_bytes();
    zero_memory_report r;
    CHECK_OK(zero_engine_get_memory_report(e, &r));
    *steady = r.total;
    *eng_peak = r.peak_total;
    zero_engine_destroy(e);
    return hwm < 0 ? -1 : hwm - before;
}

static void test_rss(zero_comm *comm, zero_device *dev)
{
    uint64_t steady_s = 0, steady_v = 0, peak_s = 0, peak_v = 0;
    long spec = build_rss(comm, dev, 0, &steady_s, &peak_s);
    long values = build_rss(comm, dev, 1, &steady_v, &peak_v);
    if (spec < 0 || values < 0) {
        fprintf(stderr, "no VmHWM reset on this kernel: RSS check skipped\n");
        return;
    }
    const double numel4 = 4.0 * RSS_PARAMS * RSS_ROWS * RSS_COLS;
    fprintf(stderr,
            "[rank %d] 50M params, stage 3, world %d: peak resident growth with specs %.1f MB (engine steady %.1f MB, "
            "peak %.1f MB), with add_param values %.1f MB (engine peak %.1f MB); 4 bytes x numel = %.1f MB\n",
            g_rank, g_world, spec / 1e6, steady_s / 1e6, peak_s / 1e6, values / 1e6, peak_v / 1e6, numel4 / 1e6);
    CHECK(steady_s == steady_v && peak_s == steady_s && peak_v == steady_v + (uint64_t)numel4);
    CHECK_MSG(fabs((double)spec - (double)steady_s) <= 0.03 * steady_s + 16e6,
              "specs: peak resident growth %.1f MB, engine steady state %.1f MB", spec / 1e6, steady_s / 1e6);
    CHECK_MSG((double)values - (double)spec >= 0.9 * numel4,
              "add_param values peaked only %.1f MB above specs (4 bytes x numel = %.1f MB)", (values - spec) / 1e6,
              numel4 / 1e6);
}

int main(int argc, char **argv)
{
    /* freed large blocks go back to the OS at once, so resident memory tracks live allocations */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(0, 0, &world, &dev); /* the world (60 s deadline), this rank for CHECKs, the CPU device */
    if (rc) return rc;
    g_rank = zero_comm_get_rank(world);
    g_world = zero_comm_get_size(world);
    check_set_rank(g_rank);
    if (argc > 1 && !strcmp(argv[1], "rss")) {
        test_rss(world, dev);
        zero_device_destroy(dev);
        zero_comm_destroy(world);
        return check_exit();
    }
    test_philox_kat();
    test_formula();
    for (int stage = 0; stage < 4; stage++) {
        test_values(world, dev, stage, ZERO_F32);
        test_values(world, dev, stage, ZERO_BF16);
    }
    for (int stage = 0; stage < 4; stage++) {
        test_memory_peak(world, dev, stage, ZERO_F32);
        test_memory_peak(world, dev, stage, ZERO_BF16);
    }
    test_mismatch(world, dev);
    test_bad_specs(world, dev);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    return check_exit();
}
