/* Initial values: the counter-based generator behind zero_init_spec (the
 * exact definition is in engine.h), the cross-rank check that every rank was
 * given the same init, and finalize's fill of this rank's elements straight
 * into the engine's buffers.
 *
 * Why it is shaped this way: a rank must never hold anything proportional
 * to the whole model unless its stage keeps it whole (DESIGN.md invariant
 * 7). So each bucket is filled only over the region this rank keeps - its
 * chunk at stage 3 (non-persistent buckets), the whole bucket otherwise -
 * through the bucket staging buffer the engine owns anyway, and a spec is
 * evaluated element by element from (seed, name, index) alone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/versioned.h"
#include "engine_internal.h"
#include "philox.h"
#include "zero_build_config.h"

/* ---------------------------------------------------------------- the generator */

#define TWO_PI 6.283185307179586
#define TWO_POW_M32 (1.0 / 4294967296.0)

static uint64_t name_stream(const char *name) { return fnv(FNV_OFFSET, name, strlen(name)); }

/* The value of a constant kind (ZEROS, ONES, CONSTANT). */
static float spec_constant(const zero_init_spec *s)
{
    return s->kind == ZERO_INIT_ONES ? 1.0f : s->kind == ZERO_INIT_CONSTANT ? (float)s->value : 0.0f;
}

/* The four values of block j (elements 4j .. 4j+3) of a NORMAL or UNIFORM
 * spec: one Philox call, and for NORMAL one Box-Muller per word pair. The
 * operations are engine.h's definition, one double operation at a time. */
static void spec_block(const zero_init_spec *s, const uint32_t key[2], uint64_t stream, uint64_t j, float v[4])
{
    const uint32_t ctr[4] = {(uint32_t)j, (uint32_t)(j >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
    uint32_t x[4];
    zero_philox4x32_10(ctr, key, x);
    double u[4];
    for (int k = 0; k < 4; k++) u[k] = ((double)x[k] + 0.5) * TWO_POW_M32;
    if (s->kind == ZERO_INIT_UNIFORM) {
        const double span = s->hi - s->lo;
        for (int k = 0; k < 4; k++) {
            const double scaled = span * u[k];
            v[k] = (float)(s->lo + scaled);
        }
        return;
    }
    for (int q = 0; q < 2; q++) {
        const double r = sqrt(-2.0 * log(u[2 * q]));
        const double t = TWO_PI * u[2 * q + 1];
        const double z0 = r * cos(t), z1 = r * sin(t);
        const double s0 = s->std * z0, s1 = s->std * z1;
        v[2 * q] = (float)(s->mean + s0);
        v[2 * q + 1] = (float)(s->mean + s1);
    }
}

/* Below this many blocks a parallel region costs more than it saves. */
#define INIT_PAR_MIN_BLOCKS 8192

/* Elements [begin, end) of spec `s` for the stream of a parameter name.
 * Every element depends on its index alone, so the blocks may be computed
 * by any number of threads in any order. */
static void spec_generate(const zero_init_spec *s, uint64_t stream, uint64_t begin, uint64_t end, float *out)
{
    if (begin >= end) return;
    if (s->kind != ZERO_INIT_NORMAL && s->kind != ZERO_INIT_UNIFORM) {
        const float c = spec_constant(s);
        for (uint64_t i = begin; i < end; i++) out[i - begin] = c;
        return;
    }
    const uint32_t key[2] = {(uint32_t)s->seed, (uint32_t)(s->seed >> 32)};
    const long long first = (long long)(begin >> 2), last = (long long)((end - 1) >> 2);
#if ZERO_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (last - first >= INIT_PAR_MIN_BLOCKS)
#endif
    for (long long j = first; j <= last; j++) {
        float v[4];
        spec_block(s, key, stream, (uint64_t)j, v);
        const uint64_t b0 = (uint64_t)j << 2;
        const uint64_t lo = b0 > begin ? b0 : begin, hi = b0 + 4 < end ? b0 + 4 : end;
        for (uint64_t i = lo; i < hi; i++) out[i - begin] = v[i - b0];
    }
}

/* One row per ZERO_INIT_SPEC_VERSION (engine.h lists each version's fields). */
static const zero_struct_version init_spec_versions[] = {
    {ZERO_FIELD_END(zero_init_spec, user), "kind"},
};
_Static_assert(sizeof init_spec_versions / sizeof *init_spec_versions == ZERO_INIT_SPEC_VERSION,
               "a new zero_init_spec version needs its row above");
ZERO_ASSERT_LAST_FIELD(zero_init_spec, user);
static const zero_versioned_type init_spec_type = {"zero_init_spec", "ZERO_INIT_SPEC_INIT", init_spec_versions,
                                                   ZERO_INIT_SPEC_VERSION, sizeof(zero_init_spec)};

/* *out = the caller's spec made whole (an older version's missing fields at
 * their defaults), checked. */
static zero_status spec_check(zero_errbuf *err, const zero_init_spec *in, const char *what, const char *name,
                              zero_init_spec *out)
{
    if (!in) return zero_fail(err, ZERO_INVALID_ARGUMENT, "%s '%s': init spec is NULL", what, name);
    const zero_init_spec defaults = ZERO_INIT_SPEC_INIT;
    memcpy(out, &defaults, sizeof *out);
    char prefix[160];
    snprintf(prefix, sizeof prefix, "%s '%s'", what, name);
    ZERO_TRY(zero_versioned_read(err, ZERO_INVALID_ARGUMENT, prefix, &init_spec_type, in, out));
    const zero_init_spec *s = out;
    switch (s->kind) {
    case ZERO_INIT_ZEROS:
    case ZERO_INIT_ONES: return ZERO_OK;
    case ZERO_INIT_CONSTANT:
        if (!isfinite(s->value))
            return zero_fail(err, ZERO_INVALID_ARGUMENT, "%s '%s': init value %g is not finite", what, name,
                             s->value);
        return ZERO_OK;
    case ZERO_INIT_NORMAL:
        if (!isfinite(s->mean) || !isfinite(s->std) || s->std < 0)
            return zero_fail(err, ZERO_INVALID_ARGUMENT,
                             "%s '%s': normal init needs a finite mean and a finite std >= 0 (mean %g, std %g)",
                             what, name, s->mean, s->std);
        return ZERO_OK;
    case ZERO_INIT_UNIFORM:
        if (!isfinite(s->lo) || !isfinite(s->hi) || s->lo > s->hi)
            return zero_fail(err, ZERO_INVALID_ARGUMENT,
                             "%s '%s': uniform init needs finite lo <= hi (lo %g, hi %g)", what, name, s->lo, s->hi);
        return ZERO_OK;
    case ZERO_INIT_CALLBACK:
        if (!s->fill)
            return zero_fail(err, ZERO_INVALID_ARGUMENT, "%s '%s': callback init with fill NULL", what, name);
        return ZERO_OK;
    }
    return zero_fail(err, ZERO_INVALID_ARGUMENT, "%s '%s': unknown init kind %d", what, name, (int)s->kind);
}

zero_status zero_init_generate(const zero_init_spec *spec, const char *name, uint64_t begin, uint64_t end,
                               float *out)
{
    const char *what = "zero_init_generate";
    if (!name) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "%s: name is NULL", what);
    zero_init_spec whole;
    ZERO_TRY(spec_check(NULL, spec, what, name, &whole));
    spec = &whole;
    if (spec->kind == ZERO_INIT_CALLBACK)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "%s '%s': a CALLBACK spec has no values of its own", what, name);
    if (begin > end) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "%s '%s': begin %llu > end %llu", what, name,
                                      (unsigned long long)begin, (unsigned long long)end);
    if (begin < end && !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "%s '%s': out is NULL", what, name);
    spec_generate(spec, name_stream(name), begin, end, out);
    return ZERO_OK;
}

zero_status init_spec_check(zero_engine *e, const zero_init_spec *spec, const char *what, const char *name,
                            zero_init_spec *out)
{
    return spec_check(&e->err, spec, what, name, out);
}

/* ---------------------------------------------------------------- one parameter's values */

/* Elements [begin, end) of parameter q as registered: the add_param copy,
 * the callback, or the spec. */
static zero_status param_values(zero_engine *e, int q, uint64_t begin, uint64_t end, float *out)
{
    const zero_param *p = &e->params[q];
    if (p->init) {
        memcpy(out, p->init + begin, (size_t)(end - begin) * sizeof(float));
        return ZERO_OK;
    }
    if (p->spec.kind != ZERO_INIT_CALLBACK) {
        spec_generate(&p->spec, name_stream(p->name), begin, end, out);
        return ZERO_OK;
    }
    zero_status st = p->spec.fill(p->spec.user, q, p->name, begin, end, out);
    if (st != ZERO_OK)
        return zero_fail(&e->err, st, "engine finalize: the init callback of parameter '%s' failed on elements "
                         "[%llu, %llu) with %s", p->name, (unsigned long long)begin, (unsigned long long)end,
                         zero_status_name(st));
    return ZERO_OK;
}

/* ---------------------------------------------------------------- the cross-rank check */

#define INIT_SAMPLES 5

static uint64_t sample_index(uint64_t numel, int k) { return (numel - 1) * (uint64_t)k / (INIT_SAMPLES - 1); }

enum { TAG_VALUES = 1, TAG_CALLBACK = 2, TAG_CONSTANT = 3, TAG_NORMAL = 4, TAG_UNIFORM = 5 };

static uint64_t fnv_f64(uint64_t h, double v) { return fnv(h, &v, sizeof v); }

static zero_status init_hash(zero_engine *e, int q, uint64_t *out)
{
    const zero_param *p = &e->params[q];
    const zero_init_spec *s = &p->spec;
    uint64_t h = FNV_OFFSET;
    if (p->init || s->kind == ZERO_INIT_CALLBACK) {
        h = fnv_u64(h, p->init ? TAG_VALUES : TAG_CALLBACK);
        if (!p->init) h = fnv_u64(h, s->seed);
        for (int k = 0; k < INIT_SAMPLES; k++) {
            const uint64_t i = sample_index(p->numel, k);
            float v;
            ZERO_TRY(param_values(e, q, i, i + 1, &v));
            h = fnv(h, &v, sizeof v);
        }
    } else if (s->kind == ZERO_INIT_NORMAL) {
        h = fnv_f64(fnv_f64(fnv_u64(fnv_u64(h, TAG_NORMAL), s->seed), s->mean), s->std);
    } else if (s->kind == ZERO_INIT_UNIFORM) {
        h = fnv_f64(fnv_f64(fnv_u64(fnv_u64(h, TAG_UNIFORM), s->seed), s->lo), s->hi);
    } else { /* zeros, ones and constants: the value they give */
        const float v = spec_constant(s);
        h = fnv(fnv_u64(h, TAG_CONSTANT), &v, sizeof v);
    }
    *out = h;
    return ZERO_OK;
}

static void describe(const zero_param *p, char *buf, size_t n)
{
    const zero_init_spec *s = &p->spec;
    if (p->init) {
        snprintf(buf, n, "values given to add_param");
        return;
    }
    switch (s->kind) {
    case ZERO_INIT_ZEROS: snprintf(buf, n, "zeros"); break;
    case ZERO_INIT_ONES: snprintf(buf, n, "ones"); break;
    case ZERO_INIT_CONSTANT: snprintf(buf, n, "constant(%.9g)", s->value); break;
    case ZERO_INIT_NORMAL:
        snprintf(buf, n, "normal(mean %.9g, std %.9g, seed %llu)", s->mean, s->std, (unsigned long long)s->seed);
        break;
    case ZERO_INIT_UNIFORM:
        snprintf(buf, n, "uniform(lo %.9g, hi %.9g, seed %llu)", s->lo, s->hi, (unsigned long long)s->seed);
        break;
    case ZERO_INIT_CALLBACK: snprintf(buf, n, "callback(seed tag %llu)", (unsigned long long)s->seed); break;
    }
}

/* Hashes travel as int64 in [0, 2^62) so that MAX of -x is the MIN of x. */
static int64_t h62(uint64_t h) { return (int64_t)(h >> 2); }

zero_status init_check_ranks(zero_engine *e)
{
    const char *what = "engine finalize: init check";
    if (e->world == 1) return ZERO_OK;
    const size_t k = (size_t)e->num_params; /* the same on every rank: plan_check_ranks passed */
    int64_t *v = malloc((2 * k > (size_t)e->world ? 2 * k : (size_t)e->world) * sizeof *v);
    if (!v) return zero_fail(&e->err, ZERO_OUT_OF_MEMORY, "%s: allocation", what);
    zero_status own = ZERO_OK; /* a callback that failed here */
    for (size_t i = 0; i < k && own == ZERO_OK; i++) {
        uint64_t h = 0;
        own = init_hash(e, (int)i, &h);
        v[i] = h62(h);
        v[k + i] = -v[i];
    }
    /* A rank whose callback failed still takes part in both rounds (the
     * others would wait for it), with values no hash has, so that every rank
     * sees a difference; it then reports its own failure. */
    if (own != ZERO_OK)
        for (size_t i = 0; i < k; i++) v[i] = v[k + i] = INT64_MAX / 2;
    zero_status st = engine_allreduce_host(e, v, 2 * k, ZERO_I64, ZERO_MAX, what);
    if (st != ZERO_OK) {
        free(v);
        return st;
    }
    size_t first = k;
    for (size_t i = 0; i < k && first == k; i++)
        if (v[i] != -v[k + i]) first = i;
    if (first == k) {
        free(v);
        return own;
    }
    /* Which ranks differ from rank 0 on that parameter: one dp-size vector,
     * each rank's hash in its own slot (MAX over zeros). */
    const zero_param *p = &e->params[first];
    uint64_t mine = 0;
    if (own == ZERO_OK) own = init_hash(e, (int)first, &mine);
    for (int r = 0; r < e->world; r++) v[r] = 0;
    v[e->rank] = own == ZERO_OK ? h62(mine) : INT64_MAX / 2;
    st = engine_allreduce_host(e, v, (size_t)e->world, ZERO_I64, ZERO_MAX, what);
    if (own != ZERO_OK || st != ZERO_OK) {
        free(v);
        return own != ZERO_OK ? own : st;
    }
    char ranks[160] = "", desc[160];
    size_t len = 0;
    for (int r = 1; r < e->world && len < sizeof ranks - 16; r++)
        if (v[r] != v[0]) len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%d", len ? ", " : "", r);
    free(v);
    describe(p, desc, sizeof desc);
    return zero_fail(&e->err, ZERO_MISMATCH,
                     "engine finalize: ranks were given different initial values: first difference at param #%zu "
                     "'%s' (module '%s'): rank(s) %s differ from rank 0 (here on rank %d: %s)",
                     first, p->name, e->modules[p->module].name, ranks, e->rank, desc);
}

/* ---------------------------------------------------------------- the fill at finalize */

/* The pieces of bucket b, as (param, first element of the piece in the
 * param, offset in the bucket, length): the params [first_param,
 * first_param + num_params), the first and last of which may be split
 * params that continue in the neighbouring buckets (plan_piece). */
typedef struct bucket_piece {
    int param;
    uint64_t param_off, bucket_off, len;
} bucket_piece;

static int bucket_piece_at(const zero_engine *e, const zero_bucket *b, int k, bucket_piece *out)
{
    if (k >= b->num_params) return 0;
    const zero_param *p = &e->params[b->first_param + k];
    uint64_t lo = 0, hi = 0, at = 0;
    if (!plan_piece(e, p, b, &lo, &hi, &at)) return 0; /* cannot happen: p has a piece in b */
    out->param = b->first_param + k;
    out->param_off = lo;
    out->bucket_off = at;
    out->len = hi - lo;
    return 1;
}

/* Bucket elements [a, z) (bucket coordinates) into dst: each piece's part of
 * the range from its parameter's init, the padding zeros. */
static zero_status fill_bucket_range(zero_engine *e, const zero_bucket *b, uint64_t a, uint64_t z, float *dst)
{
    memset(dst, 0, (size_t)(z - a) * sizeof(float));
    bucket_piece pc;
    for (int k = 0; bucket_piece_at(e, b, k, &pc); k++) {
        const uint64_t lo = pc.bucket_off > a ? pc.bucket_off : a;
        const uint64_t hi = pc.bucket_off + pc.len < z ? pc.bucket_off + pc.len : z;
        if (lo >= hi) continue;
        const uint64_t first = pc.param_off + (lo - pc.bucket_off);
        ZERO_TRY(param_values(e, pc.param, first, first + (hi - lo), dst + (lo - a)));
    }
    return ZERO_OK;
}

/* Elements per host staging chunk on a device whose memory the host cannot
 * write (CUDA): 1 MiB of fp32. On the CPU device the values go straight into
 * the bucket staging buffer, with no temporary at all. */
#define INIT_HOST_CHUNK (UINT64_C(1) << 18)

static void drop_values(zero_engine *e)
{
    for (int i = 0; i < e->num_params; i++) {
        zero_param *p = &e->params[i];
        engine_host_free(e, ZERO_MEM_OTHER, p->numel * sizeof(float), p->init);
        p->init = NULL;
    }
}

zero_status init_load(zero_engine *e)
{
    const char *what = "engine finalize";
    const uint64_t r = (uint64_t)e->rank;
    float *stage = e->slots[0].send; /* fp32, max bucket: free until the first grads_ready */
    float *host = NULL;
    size_t host_bytes = 0;
    if (e->is_cuda) {
        host_bytes = (size_t)(e->max_bucket < INIT_HOST_CHUNK ? e->max_bucket : INIT_HOST_CHUNK) * sizeof(float);
        zero_status st = engine_host_alloc(e, ZERO_MEM_OTHER, host_bytes, (void **)&host);
        if (st != ZERO_OK) {
            drop_values(e);
            return st;
        }
    }
    zero_status st = ZERO_OK;
    for (int bi = 0; bi < e->num_buckets && st == ZERO_OK; bi++) {
        const zero_bucket *b = &e->buckets[bi];
        /* What this rank keeps of the bucket: its chunk of a sharded stage-3
         * bucket, the whole of every other (layout_load_bucket reads no more). */
        uint64_t lo = 0, hi = b->numel;
        if (e->cfg.stage == 3 && !b->persistent) {
            lo = b->chunk * r;
            hi = lo + b->chunk;
        }
        const uint64_t step = host ? INIT_HOST_CHUNK : (hi > lo ? hi - lo : 1);
        for (uint64_t a = lo; a < hi && st == ZERO_OK; a += step) {
            const uint64_t z = hi - a < step ? hi : a + step;
            if (!host) {
                st = fill_bucket_range(e, b, a, z, stage + a);
                continue;
            }
            st = fill_bucket_range(e, b, a, z, host);
            if (st == ZERO_OK && (st = engine_memcpy(e, stage + a, host, (size_t)(z - a) * sizeof(float))) != ZERO_OK)
                st = zero_fail_forward(&e->err, st, "engine finalize: copying initial values: ");
            /* the next chunk reuses the host buffer: wait for this copy */
            if (st == ZERO_OK) st = engine_sync_stream(e, what);
        }
        if (st == ZERO_OK) st = layout_load_bucket(e, b, stage);
        /* the next bucket rewrites the staging buffer */
        if (st == ZERO_OK) st = engine_sync_stream(e, what);
    }
    engine_host_free(e, ZERO_MEM_OTHER, host_bytes, host);
    drop_values(e);
    return st;
}
