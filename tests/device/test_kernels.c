/* Every element-wise kernel, for f32, f16 and bf16, against scalar references.
 *
 *   test_kernels cpu   - the CPU device against the scalar reference below
 *   test_kernels cuda  - the CUDA device against the same reference and
 *                        against the CPU device's output (skipped without a GPU)
 *
 * Properties: fill, scale, axpy and every cast are bitwise equal to the
 * reference (which computes in f32 with one rounding per operation, no fused
 * multiply-add, and rounds with zero_f32_to_* - itself tested exhaustively in
 * test_convert). sumsq is within n * 2^-52 (relative) of a long double sum,
 * is bitwise repeatable, and flags inf / NaN exactly when one is present.
 * Sizes cover 1 element, odd tails and the OpenMP-parallel path. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <zero/device.h>
#include <zero/experimental.h>

#include "check.h"

static const zero_dtype dtypes[] = {ZERO_F32, ZERO_F16, ZERO_BF16};
static const size_t sizes[] = {1, 7, 1000, 65536 + 17, 300001};

/* ---------------------------------------------------------------- scalar reference */

static float ref_load(const void *p, zero_dtype dt, size_t i)
{
    if (dt == ZERO_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == ZERO_F16 ? zero_f16_to_f32(h) : zero_bf16_to_f32(h);
}

static void ref_store(void *p, zero_dtype dt, size_t i, float v)
{
    if (dt == ZERO_F32) ((float *)p)[i] = v;
    else if (dt == ZERO_F16) ((uint16_t *)p)[i] = zero_f32_to_f16(v);
    else ((uint16_t *)p)[i] = zero_f32_to_bf16(v);
}

/* xorshift: reproducible data without libc's rand state */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float next_float(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    /* values in [-8, 8) with varied exponents, plus exact small integers */
    double u = (double)(rng >> 11) / 9007199254740992.0;
    if ((rng & 15) == 0) return (float)((int)(u * 64) - 32);
    return (float)((u * 2 - 1) * ldexp(1.0, (int)(rng >> 60) - 10));
}

static void fill_random(void *p, zero_dtype dt, size_t n)
{
    for (size_t i = 0; i < n; i++) ref_store(p, dt, i, next_float());
}

/* ---------------------------------------------------------------- device plumbing */

typedef struct ctx {
    zero_device *dev;  /* device under test */
    zero_stream *stream;
    int is_cuda;
} ctx;

/* A device buffer holding `bytes`, initialised from host memory. */
static void *to_dev(ctx *c, const void *host, size_t bytes)
{
    void *d = NULL;
    CHECK_OK(zero_device_alloc(c->dev, bytes, &d));
    if (d) CHECK_OK(zero_memcpy(c->dev, d, host, bytes));
    return d;
}

static void from_dev(ctx *c, void *host, const void *d, size_t bytes)
{
    CHECK_OK(zero_stream_sync(c->stream));
    CHECK_OK(zero_memcpy(c->dev, host, d, bytes));
}

static long count_diff(const void *a, const void *b, zero_dtype dt, size_t n, const char *what)
{
    size_t es = zero_dtype_size(dt);
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)a + i * es, (const char *)b + i * es, es) != 0) {
            if (bad++ < 3)
                fprintf(stderr, "%s %s n=%zu: element %zu = %.9g, reference %.9g\n", what, zero_dtype_name(dt), n, i,
                        ref_load(a, dt, i), ref_load(b, dt, i));
        }
    }
    return bad;
}

/* ---------------------------------------------------------------- tests */

static void test_elementwise(ctx *c, zero_dtype dt, size_t n)
{
    size_t es = zero_dtype_size(dt), bytes = n * es;
    char *x = malloc(bytes), *y = malloc(bytes), *ref = malloc(bytes), *got = malloc(bytes);
    fill_random(x, dt, n);
    fill_random(y, dt, n);
    void *dx = to_dev(c, x, bytes), *dy = to_dev(c, y, bytes);

    /* fill: the value rounded once */
    const float value = 0.1f;
    for (size_t i = 0; i < n; i++) ref_store(ref, dt, i, value);
    CHECK_OK(zero_fill_value(c->dev, dy, dt, n, value, c->stream));
    from_dev(c, got, dy, bytes);
    CHECK_MSG(count_diff(got, ref, dt, n, "fill") == 0, "fill %s n=%zu", zero_dtype_name(dt), n);

    /* scale: x * alpha in f32, one rounding into dt */
    const float alpha = -1.7f;
    for (size_t i = 0; i < n; i++) ref_store(ref, dt, i, ref_load(x, dt, i) * alpha);
    CHECK_OK(zero_scale(c->dev, dx, dt, n, alpha, c->stream));
    from_dev(c, got, dx, bytes);
    CHECK_MSG(count_diff(got, ref, dt, n, "scale") == 0, "scale %s n=%zu", zero_dtype_name(dt), n);

    /* axpy: y + (alpha * x), two f32 roundings, then one into dt */
    CHECK_OK(zero_memcpy(c->dev, dx, x, bytes));
    CHECK_OK(zero_memcpy(c->dev, dy, y, bytes));
    const float a2 = 0.37f;
    for (size_t i = 0; i < n; i++) {
        volatile float t = a2 * ref_load(x, dt, i); /* volatile: no contraction into an FMA */
        ref_store(ref, dt, i, ref_load(y, dt, i) + t);
    }
    CHECK_OK(zero_axpy(c->dev, a2, dx, dy, dt, n, c->stream));
    from_dev(c, got, dy, bytes);
    CHECK_MSG(count_diff(got, ref, dt, n, "axpy") == 0, "axpy %s n=%zu", zero_dtype_name(dt), n);

    /* axpy with x == y (aliasing is element-wise safe): y = y + a*y */
    for (size_t i = 0; i < n; i++) {
        volatile float t = a2 * ref_load(ref, dt, i);
        ref_store(ref, dt, i, ref_load(ref, dt, i) + t);
    }
    CHECK_OK(zero_axpy(c->dev, a2, dy, dy, dt, n, c->stream));
    from_dev(c, got, dy, bytes);
    CHECK_MSG(count_diff(got, ref, dt, n, "axpy(x==y)") == 0, "axpy aliased %s n=%zu", zero_dtype_name(dt), n);

    CHECK_OK(zero_stream_sync(c->stream));
    zero_device_free(c->dev, dx);
    zero_device_free(c->dev, dy);
    free(x), free(y), free(ref), free(got);
}

static void test_cast(ctx *c, zero_dtype sdt, zero_dtype ddt, size_t n)
{
    size_t sb = n * zero_dtype_size(sdt), db = n * zero_dtype_size(ddt);
    char *src = malloc(sb), *ref = malloc(db), *got = malloc(db);
    fill_random(src, sdt, n);
    /* sprinkle specials: inf, NaN, overflow for the narrow types, subnormals */
    if (sdt == ZERO_F32 && n >= 8) {
        float *f = (float *)src;
        f[0] = INFINITY, f[1] = -INFINITY, f[2] = NAN, f[3] = 1e6f, f[4] = -3e38f, f[5] = 1e-6f, f[6] = 3e-8f,
        f[7] = -0.0f;
    }
    for (size_t i = 0; i < n; i++) ref_store(ref, ddt, i, ref_load(src, sdt, i));
    void *ds = to_dev(c, src, sb), *dd = NULL;
    CHECK_OK(zero_device_alloc(c->dev, db, &dd));
    CHECK_OK(zero_cast(c->dev, ds, sdt, dd, ddt, n, c->stream));
    from_dev(c, got, dd, db);
    char what[64];
    snprintf(what, sizeof what, "cast %s->", zero_dtype_name(sdt));
    /* NaN is NaN in both; every other pattern is compared bitwise */
    long bad = 0;
    size_t es = zero_dtype_size(ddt);
    for (size_t i = 0; i < n; i++) {
        float g = ref_load(got, ddt, i), r = ref_load(ref, ddt, i);
        if (isnan(r) ? !isnan(g) : memcmp(got + i * es, ref + i * es, es) != 0) {
            if (bad++ < 3) fprintf(stderr, "%s%s n=%zu: element %zu = %.9g, reference %.9g\n", what,
                                   zero_dtype_name(ddt), n, i, g, r);
        }
    }
    CHECK_MSG(bad == 0, "%s%s n=%zu: %ld wrong", what, zero_dtype_name(ddt), n, bad);
    zero_device_free(c->dev, ds);
    zero_device_free(c->dev, dd);
    free(src), free(ref), free(got);
}

/* Every f16 pattern through the device's f16 -> f32 cast, and a stride
 * through all f32 patterns (plus every f16 value's neighbourhood) through
 * f32 -> f16, bit for bit against the scalar reference, NaN payloads and
 * signalling NaNs included: the CPU's F16C path (hardware quiets a
 * signalling NaN; the device must not) and its integer fallback
 * (ZERO_CPU_ISA=sse2, meson test device_kernels_cpu_no_f16c) both. */
static void test_cast_f16_exhaustive(ctx *c)
{
    const size_t n16 = 65536;
    uint16_t *h = malloc(n16 * 2);
    float *f = malloc(n16 * 4);
    for (size_t i = 0; i < n16; i++) h[i] = (uint16_t)i;
    void *dh = to_dev(c, h, n16 * 2), *df = NULL;
    CHECK_OK(zero_device_alloc(c->dev, n16 * 4, &df));
    CHECK_OK(zero_cast(c->dev, dh, ZERO_F16, df, ZERO_F32, n16, c->stream));
    from_dev(c, f, df, n16 * 4);
    long bad = 0;
    for (size_t i = 0; i < n16; i++) {
        float r = zero_f16_to_f32((uint16_t)i);
        if (memcmp(&r, f + i, 4) != 0 && bad++ < 3) fprintf(stderr, "f16 %04zx -> f32 differs\n", i);
    }
    CHECK_MSG(bad == 0, "f16 -> f32 cast: %ld of 65536 patterns differ from the reference", bad);
    zero_device_free(c->dev, dh), zero_device_free(c->dev, df);
    /* f32 -> f16: 2^20 patterns, stride 4093 (odd, so every low-bit residue
     * comes by), and every f16 value's f32 image +-1 ulp (the rounding edges) */
    const size_t n32 = (1u << 20) + 3 * n16;
    uint32_t *u = malloc(n32 * 4);
    uint16_t *got = malloc(n32 * 2);
    for (size_t i = 0; i < (1u << 20); i++) u[i] = (uint32_t)(i * 4093u) ^ (uint32_t)(i << 22);
    for (size_t i = 0; i < n16; i++) {
        float v = zero_f16_to_f32((uint16_t)i);
        uint32_t b;
        memcpy(&b, &v, 4);
        u[(1u << 20) + 3 * i] = b, u[(1u << 20) + 3 * i + 1] = b + 1, u[(1u << 20) + 3 * i + 2] = b - 1;
    }
    void *du = to_dev(c, u, n32 * 4), *dg = NULL;
    CHECK_OK(zero_device_alloc(c->dev, n32 * 2, &dg));
    CHECK_OK(zero_cast(c->dev, du, ZERO_F32, dg, ZERO_F16, n32, c->stream));
    from_dev(c, got, dg, n32 * 2);
    bad = 0;
    for (size_t i = 0; i < n32; i++) {
        float v;
        memcpy(&v, u + i, 4);
        if (zero_f32_to_f16(v) != got[i] && bad++ < 3) fprintf(stderr, "f32 %08x -> f16 differs\n", u[i]);
    }
    CHECK_MSG(bad == 0, "f32 -> f16 cast: %ld of %zu patterns differ from the reference", bad, n32);
    zero_device_free(c->dev, du), zero_device_free(c->dev, dg);
    free(h), free(f), free(u), free(got);
}

static void test_sumsq(ctx *c, zero_dtype dt, size_t n)
{
    size_t bytes = n * zero_dtype_size(dt);
    char *x = malloc(bytes);
    fill_random(x, dt, n);
    long double ref = 0;
    for (size_t i = 0; i < n; i++) {
        long double v = ref_load(x, dt, i);
        ref += v * v;
    }
    void *dx = to_dev(c, x, bytes);
    double got = -1, again = -2;
    int nf = -1;
    CHECK_OK(zero_sumsq(c->dev, dx, dt, n, &got, &nf, c->stream));
    CHECK_OK(zero_sumsq(c->dev, dx, dt, n, &again, NULL, c->stream));
    double tol = (double)n * 0x1p-52 * (double)ref;
    CHECK_MSG(fabsl((long double)got - ref) <= tol, "sumsq %s n=%zu: %.17g, reference %.17Lg, tol %.3g",
              zero_dtype_name(dt), n, got, ref, tol);
    CHECK_MSG(memcmp(&got, &again, sizeof got) == 0, "sumsq %s n=%zu not repeatable", zero_dtype_name(dt), n);
    CHECK(nf == 0);
    if (!c->is_cuda) {
        /* The CPU device's documented order (device/cpu_backend.c): blocks of
         * 16384 elements summed in order, each block over 32 lanes (element
         * i in lane i % 32) added in lane order. This plain loop is compiled
         * for the baseline ISA, so equality also says the library's AVX-512
         * kernel (fma on four blocks side by side) and, under ZERO_CPU_ISA=sse2
         * (device_kernels_cpu_no_f16c), its AVX2 clone sum in this order. */
        double exact = 0.0;
        for (size_t b0 = 0; b0 < n; b0 += 16384) {
            size_t b1 = b0 + 16384 < n ? b0 + 16384 : n;
            double lane[32] = {0}, blk = 0.0;
            for (size_t i = b0; i < b1; i++) {
                double v = (double)ref_load(x, dt, i);
                lane[(i - b0) % 32] += v * v;
            }
            for (int l = 0; l < 32; l++) blk += lane[l];
            exact += blk;
        }
        CHECK_MSG(memcmp(&got, &exact, sizeof got) == 0, "sumsq %s n=%zu: %.17g, the documented order gives %.17g",
                  zero_dtype_name(dt), n, got, exact);
    }

    /* one inf, then one NaN, anywhere: flagged */
    size_t pos = n / 2;
    float specials[2] = {INFINITY, NAN};
    for (int k = 0; k < 2; k++) {
        char *y = malloc(bytes);
        memcpy(y, x, bytes);
        ref_store(y, dt, pos, specials[k]);
        CHECK_OK(zero_memcpy(c->dev, dx, y, bytes));
        nf = 0;
        CHECK_OK(zero_sumsq(c->dev, dx, dt, n, &got, &nf, c->stream));
        CHECK_MSG(nf == 1, "sumsq %s n=%zu: %s at %zu not flagged", zero_dtype_name(dt), n, k ? "NaN" : "inf", pos);
        CHECK(k ? isnan(got) : isinf(got));
        free(y);
    }
    /* large finite values: squares overflow f32 but not the double sum */
    if (dt == ZERO_F32) {
        float *f = (float *)x;
        for (size_t i = 0; i < n; i++) f[i] = 3e38f;
        CHECK_OK(zero_memcpy(c->dev, dx, x, bytes));
        CHECK_OK(zero_sumsq(c->dev, dx, dt, n, &got, &nf, c->stream));
        double want = (double)n * (double)3e38f * (double)3e38f;
        CHECK_MSG(nf == 0 && fabs(got - want) <= n * 0x1p-52 * want, "sumsq of 3e38: %g, want %g, nonfinite %d",
                  got, want, nf);
    }
    zero_device_free(c->dev, dx);
    free(x);
}

/* The CUDA device must agree bitwise with the CPU device, op by op. */
static void test_cuda_matches_cpu(ctx *c, zero_device *cpu)
{
    const size_t n = 100003;
    for (size_t d = 0; d < 3; d++) {
        zero_dtype dt = dtypes[d];
        size_t bytes = n * zero_dtype_size(dt);
        char *x = malloc(bytes), *y = malloc(bytes), *yc = malloc(bytes), *got = malloc(bytes);
        fill_random(x, dt, n);
        fill_random(y, dt, n);
        memcpy(yc, y, bytes);
        void *dx = to_dev(c, x, bytes), *dy = to_dev(c, y, bytes);
        CHECK_OK(zero_axpy(c->dev, 1.25f, dx, dy, dt, n, c->stream));
        CHECK_OK(zero_scale(c->dev, dy, dt, n, 0.75f, c->stream));
        CHECK_OK(zero_axpy(cpu, 1.25f, x, yc, dt, n, NULL));
        CHECK_OK(zero_scale(cpu, yc, dt, n, 0.75f, NULL));
        from_dev(c, got, dy, bytes);
        CHECK_MSG(count_diff(got, yc, dt, n, "cuda vs cpu") == 0, "cuda vs cpu axpy+scale %s", zero_dtype_name(dt));
        double sg = 0, sc = 0;
        CHECK_OK(zero_sumsq(c->dev, dy, dt, n, &sg, NULL, c->stream));
        CHECK_OK(zero_sumsq(cpu, yc, dt, n, &sc, NULL, NULL));
        CHECK_MSG(fabs(sg - sc) <= n * 0x1p-52 * sc, "sumsq cuda %.17g vs cpu %.17g", sg, sc);
        zero_device_free(c->dev, dx);
        zero_device_free(c->dev, dy);
        free(x), free(y), free(yc), free(got);
    }
}

int main(int argc, char **argv)
{
    ctx c = {0};
    c.is_cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (c.is_cuda) {
        zero_status st = zero_device_create(&c.dev, ZERO_DEVICE_CUDA, 0);
        if (st == ZERO_UNSUPPORTED) CHECK_SKIP("no CUDA device: %s", zero_last_error());
        CHECK_OK(st);
    } else {
        CHECK_OK(zero_device_create(&c.dev, ZERO_DEVICE_CPU, 0));
    }
    if (!c.dev) return check_exit();
    CHECK_OK(zero_stream_create(c.dev, &c.stream));

    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            test_elementwise(&c, dtypes[d], sizes[s]);
            test_sumsq(&c, dtypes[d], sizes[s]);
        }
    test_cast_f16_exhaustive(&c);
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 3; b++) {
            test_cast(&c, dtypes[a], dtypes[b], 1000);
            test_cast(&c, dtypes[a], dtypes[b], 65536 + 5);
        }
    if (c.is_cuda) {
        zero_device *cpu = NULL;
        CHECK_OK(zero_device_create(&cpu, ZERO_DEVICE_CPU, 0));
        if (cpu) test_cuda_matches_cpu(&c, cpu);
        zero_device_destroy(cpu);
    }
    zero_stream_destroy(c.stream);
    zero_device_destroy(c.dev);
    return check_exit();
}
