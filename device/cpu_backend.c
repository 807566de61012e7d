/* The CPU device: host memory, streams, and the element-wise kernels the
 * engine's CPU path trains with.
 *
 * By default every op completes before it returns, so streams and events are
 * ordering tokens only. With ZERO_CPU_ASYNC=1 each stream is a worker thread
 * and ops are queued (cpu_async.c): the same kernels, run later, in stream
 * order. Kernels are plain loops the compiler vectorizes; large ones
 * are split over OpenMP threads. Elementwise results do not depend on the
 * thread count; the sum of squares is made independent of it too (fixed
 * chunks, summed in order). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "convert_impl.h"
#include "convert_x86.h"
#include "cpu_async.h"
#include "device_internal.h"

/* The kernels run in blocks: an OpenMP loop over blocks (when there are
 * enough of them to pay for the threads) calls a serial, vectorized range
 * function. The range functions are compiled twice, for AVX2 and for the
 * baseline, and picked at load time (GCC target_clones): the f16
 * conversions need AVX2's per-lane shifts to vectorize. Cloning the range
 * functions rather than the OpenMP loop matters: GCC outlines a parallel
 * region before it clones, so the region body would stay baseline. */
#define BLOCK 16384
/* Not under ThreadSanitizer: an ifunc resolver runs while the dynamic
 * loader relocates libzero, before the TSan runtime is up, and crashes. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif
#if ZERO_HAVE_OPENMP
#define PAR_FOR_BLOCKS _Pragma("omp parallel for schedule(static) if(nblocks >= 4)")
#define SIMD _Pragma("omp simd")
#define SIMD_SUM_ACC _Pragma("omp simd reduction(+ : acc)")
#else
#define PAR_FOR_BLOCKS
#define SIMD
#define SIMD_SUM_ACC
#endif

typedef struct kargs {
    const void *x;
    void *y;
    zero_dtype dt, dt2;
    float alpha;
    double *partial; /* sumsq: one per block */
    void *clear;     /* take: the source, zeroed after it is read (NULL: kept) */
    int acc;         /* take: add into y instead of writing it */
    size_t span;     /* elements per call of the range function; 0: BLOCK */
} kargs;

typedef void (*range_fn)(const kargs *a, size_t begin, size_t end);

static void run_blocks(size_t n, range_fn fn, const kargs *a)
{
    const size_t span = a->span ? a->span : BLOCK;
    size_t nblocks = (n + span - 1) / span;
    PAR_FOR_BLOCKS
    for (size_t b = 0; b < nblocks; b++) {
        size_t end = (b + 1) * span;
        fn(a, b * span, end < n ? end : n);
    }
}

/* A kernel or copy as a queued op (async mode). */
typedef struct kernel_op {
    kargs a;
    size_t n;
    range_fn fn;
} kernel_op;

static void run_kernel_op(const void *arg)
{
    const kernel_op *k = arg;
    run_blocks(k->n, k->fn, &k->a);
}

typedef struct copy_op {
    void *dst;
    const void *src;
    size_t bytes;
} copy_op;

static void run_copy_op(const void *arg)
{
    const copy_op *c = arg;
    memmove(c->dst, c->src, c->bytes);
}

/* Run now (synchronous mode) or queue on s in stream order (async mode). */
static zero_status launch(zero_device *dev, zero_stream *s, size_t n, range_fn fn, const kargs *a)
{
    if (!cpu_async_on(dev)) {
        run_blocks(n, fn, a);
        return ZERO_OK;
    }
    kernel_op k = {.a = *a, .n = n, .fn = fn};
    return cpu_async_submit(dev, s, run_kernel_op, &k, sizeof k);
}

/* ---------------------------------------------------------------- memory */

static zero_status cpu_open(zero_device *dev, int ordinal)
{
    (void)ordinal;
    return cpu_async_open(dev); /* ZERO_CPU_ASYNC: worker streams */
}

static void cpu_close(zero_device *dev) { cpu_async_close(dev); }

/* Host memory for buffers. Large ones are their own anonymous mappings,
 * returned to the kernel when freed: what the process holds is then what
 * the engine's books say (glibc would keep freed heap resident, and its
 * dynamic mmap threshold moves module-sized blocks onto the heap after the
 * first free, so a process that frees and reallocates them held up to a
 * few hundred MiB more than it used). Small ones come from malloc. Each
 * allocation starts with a header (one alignment unit before the pointer)
 * that records how it was made and its mapped length, so free needs no
 * lookup. Under ASan everything comes from malloc, so overflows are caught. */
#if defined(__SANITIZE_ADDRESS__)
#define CPU_MMAP_MIN SIZE_MAX /* under ASan everything stays in its checked heap */
#else
#define CPU_MMAP_MIN ((size_t)64 << 10)
#endif
#define CPU_MAPPED 0x6d6d6170u /* "mmap" */
#define CPU_HEAPED 0x68656170u /* "heap" */

typedef struct cpu_header {
    uint32_t kind;
    size_t length; /* mmap: the whole mapping; heap: unused */
    void *base;    /* what malloc/mmap returned */
} cpu_header;

void *zero_hostmem_alloc(size_t bytes, size_t align)
{
    /* Round up so the tail of the last vector is readable as a whole; one
     * alignment unit in front holds the header. */
    size_t rounded = (bytes + align - 1) / align * align;
    size_t total = rounded + align;
    if (rounded < bytes || total < rounded) return NULL;
    if (rounded >= CPU_MMAP_MIN) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t length = (total + align - 1 + page - 1) / page * page; /* room to align inside */
        void *base = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return NULL;
        uintptr_t user = ((uintptr_t)base + sizeof(cpu_header) + align - 1) / align * align;
        cpu_header *h = (cpu_header *)(user - sizeof(cpu_header));
        h->kind = CPU_MAPPED, h->length = length, h->base = base;
        return (void *)user;
    }
    void *base = NULL;
    if (posix_memalign(&base, align, total) != 0) return NULL;
    cpu_header *h = (cpu_header *)((char *)base + align - sizeof(cpu_header));
    h->kind = CPU_HEAPED, h->length = 0, h->base = base;
    return (char *)base + align;
}

void zero_hostmem_free(void *ptr)
{
    if (!ptr) return;
    cpu_header *h = (cpu_header *)((char *)ptr - sizeof(cpu_header));
    if (h->kind == CPU_MAPPED) munmap(h->base, h->length);
    else free(h->base);
}

static zero_status aligned(zero_device *dev, size_t bytes, size_t align, void **out, const char *op)
{
    *out = zero_hostmem_alloc(bytes, align);
    if (!*out)
        return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of host memory", op, bytes);
    return ZERO_OK;
}

static zero_status cpu_alloc(zero_device *dev, size_t bytes, void **out)
{
    return aligned(dev, bytes, ZERO_DEVICE_ALIGN, out, "zero_device_alloc(cpu)");
}

static zero_status cpu_alloc_pinned(zero_device *dev, size_t bytes, void **out)
{
    return aligned(dev, bytes, ZERO_HOST_ALIGN, out, "zero_host_alloc_pinned(cpu)");
}

static void cpu_free(zero_device *dev, void *ptr)
{
    (void)dev;
    zero_hostmem_free(ptr);
}

/* ---------------------------------------------------------------- streams, events */

static zero_status cpu_stream_create(zero_device *dev, zero_stream *s)
{
    return cpu_async_on(dev) ? cpu_async_stream_create(dev, s) : ZERO_OK;
}

static void cpu_stream_destroy(zero_stream *s)
{
    if (cpu_async_on(s->dev)) cpu_async_stream_destroy(s);
}

static zero_status cpu_stream_sync(zero_device *dev, zero_stream *s)
{
    return cpu_async_on(dev) ? cpu_async_stream_sync(dev, s, "zero_stream_sync") : ZERO_OK;
}

static zero_status cpu_device_sync(zero_device *dev)
{
    return cpu_async_on(dev) ? cpu_async_device_sync(dev) : ZERO_OK;
}

static zero_status cpu_event_create(zero_device *dev, zero_event *e)
{
    return cpu_async_on(dev) ? cpu_async_event_create(dev, e) : ZERO_OK;
}

static void cpu_event_destroy(zero_event *e)
{
    if (cpu_async_on(e->dev)) cpu_async_event_destroy(e);
}

static zero_status cpu_event_record(zero_device *dev, zero_event *e, zero_stream *s)
{
    return cpu_async_on(dev) ? cpu_async_event_record(dev, e, s) : ZERO_OK;
}

static zero_status cpu_stream_wait_event(zero_device *dev, zero_stream *s, zero_event *e)
{
    return cpu_async_on(dev) ? cpu_async_stream_wait_event(dev, s, e) : ZERO_OK;
}

static zero_status cpu_event_sync(zero_device *dev, zero_event *e)
{
    return cpu_async_on(dev) ? cpu_async_event_sync(dev, e) : ZERO_OK;
}

/* Synchronous mode: work before a record has always finished (like CUDA, an
 * event never recorded also counts as done). */
static zero_status cpu_event_query(zero_device *dev, zero_event *e, int *done)
{
    *done = cpu_async_on(dev) ? cpu_async_event_done(e) : 1;
    return ZERO_OK;
}

/* ---------------------------------------------------------------- copies */

static zero_status cpu_memcpy_async(zero_device *dev, void *dst, const void *src, size_t bytes,
                                    zero_stream *s)
{
    copy_op c = {dst, src, bytes};
    if (!cpu_async_on(dev)) {
        run_copy_op(&c); /* memmove: overlap is harmless here, so allow it */
        return ZERO_OK;
    }
    return cpu_async_submit(dev, s, run_copy_op, &c, sizeof c);
}

/* Finished on return. Async mode: in order on the default stream, like
 * CUDA's copy on the legacy stream, then wait for that stream. */
static zero_status cpu_memcpy(zero_device *dev, void *dst, const void *src, size_t bytes)
{
    ZERO_TRY(cpu_memcpy_async(dev, dst, src, bytes, NULL));
    return cpu_async_on(dev) ? cpu_async_stream_sync(dev, NULL, "zero_memcpy") : ZERO_OK;
}

/* ---------------------------------------------------------------- kernels */

/* f16 <-> f32 through F16C (vcvtps2ph / vcvtph2ps, 8 lanes) where the CPU
 * has it, chosen at run time. Bitwise the integer reference of
 * convert_impl.h: f32 -> f16 rounds to nearest even in hardware exactly as
 * the reference does for all 2^32 inputs (NaN quieted, top payload kept);
 * f16 -> f32 is exact, except that the hardware quiets a signalling NaN,
 * which the reference keeps signalling, so those lanes get the quiet bit
 * cleared again (tests/device/test_kernels.c checks all 65536 patterns).
 * ZERO_CPU_ISA=sse2|scalar turns it off, as it caps the optimizer kernels. */
#if ZERO_CONVERT_X86
#define F16C_TARGET __attribute__((target("avx2,f16c")))

static int f16c_usable(void)
{
    static int usable = -1;
    int u = __atomic_load_n(&usable, __ATOMIC_RELAXED);
    if (u < 0) {
        const char *cap = getenv("ZERO_CPU_ISA");
        int capped = cap && (!strcmp(cap, "sse2") || !strcmp(cap, "scalar"));
        u = !capped && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
        __atomic_store_n(&usable, u, __ATOMIC_RELAXED);
    }
    return u;
}

static void f32_to_f16_f16c(const float *s, uint16_t *d, size_t n) { zero_x86_f32_to_f16(s, d, n); }

F16C_TARGET static void f16_to_f32_f16c(const uint16_t *s, float *d, size_t n)
{
    const __m256i exp = _mm256_set1_epi32(0x7C00), man = _mm256_set1_epi32(0x3FF), quiet = _mm256_set1_epi32(0x200);
    const __m256i zero = _mm256_setzero_si256(), f32_quiet = _mm256_set1_epi32(0x00400000);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
        __m256 f = _mm256_cvtph_ps(h);
        __m256i h32 = _mm256_cvtepu16_epi32(h);
        /* signalling NaN: exponent all ones, mantissa non-zero, quiet bit clear */
        __m256i is_nan = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(h32, man), zero),
                                             _mm256_cmpeq_epi32(_mm256_and_si256(h32, exp), exp));
        __m256i snan = _mm256_and_si256(is_nan, _mm256_cmpeq_epi32(_mm256_and_si256(h32, quiet), zero));
        __m256i bits = _mm256_andnot_si256(_mm256_and_si256(snan, f32_quiet), _mm256_castps_si256(f));
        _mm256_storeu_ps(d + i, _mm256_castsi256_ps(bits));
    }
    for (; i < n; i++) d[i] = zero_cvt_f16_to_f32(s[i]);
}
#else
static int f16c_usable(void) { return 0; }
static void f32_to_f16_f16c(const float *s, uint16_t *d, size_t n) { (void)s, (void)d, (void)n; }
static void f16_to_f32_f16c(const uint16_t *s, float *d, size_t n) { (void)s, (void)d, (void)n; }
#endif

/* f16 element-wise ops through F16C: widen a piece to f32, the same float
 * operations as the reference loops below, narrow back. */
#define F16_PIECE 512
static void axpy_f16_f16c(float alpha, const uint16_t *x, uint16_t *y, size_t begin, size_t end)
{
    float xf[F16_PIECE], yf[F16_PIECE];
    for (size_t i = begin; i < end; i += F16_PIECE) {
        size_t k = end - i < F16_PIECE ? end - i : F16_PIECE;
        f16_to_f32_f16c(x + i, xf, k);
        f16_to_f32_f16c(y + i, yf, k);
        SIMD
        for (size_t j = 0; j < k; j++) {
            float t = alpha * xf[j];
            yf[j] = yf[j] + t;
        }
        f32_to_f16_f16c(yf, y + i, k);
    }
}

static void scale_f16_f16c(float alpha, uint16_t *y, size_t begin, size_t end)
{
    float yf[F16_PIECE];
    for (size_t i = begin; i < end; i += F16_PIECE) {
        size_t k = end - i < F16_PIECE ? end - i : F16_PIECE;
        f16_to_f32_f16c(y + i, yf, k);
        SIMD
        for (size_t j = 0; j < k; j++) yf[j] = yf[j] * alpha;
        f32_to_f16_f16c(yf, y + i, k);
    }
}

CLONES static void fill_range(const kargs *a, size_t begin, size_t end)
{
    if (a->dt == ZERO_F32) {
        float *p = a->y, v = a->alpha;
        SIMD
        for (size_t i = begin; i < end; i++) p[i] = v;
    } else {
        uint16_t *p = a->y;
        uint16_t bits = a->dt == ZERO_F16 ? zero_cvt_f32_to_f16(a->alpha) : zero_cvt_f32_to_bf16(a->alpha);
        SIMD
        for (size_t i = begin; i < end; i++) p[i] = bits;
    }
}

CLONES static void scale_range(const kargs *a, size_t begin, size_t end)
{
    const float alpha = a->alpha;
    if (a->dt == ZERO_F32) {
        float *p = a->y;
        SIMD
        for (size_t i = begin; i < end; i++) p[i] *= alpha;
    } else if (a->dt == ZERO_F16) {
        uint16_t *p = a->y;
        if (f16c_usable()) {
            scale_f16_f16c(alpha, p, begin, end);
            return;
        }
        SIMD
        for (size_t i = begin; i < end; i++) p[i] = zero_cvt_f32_to_f16(zero_cvt_f16_to_f32(p[i]) * alpha);
    } else {
        uint16_t *p = a->y;
        SIMD
        for (size_t i = begin; i < end; i++) p[i] = zero_cvt_f32_to_bf16(zero_cvt_bf16_to_f32(p[i]) * alpha);
    }
}

/* y + alpha * x with two roundings (no fused multiply-add: ISO C mode keeps
 * GCC from contracting, and the AVX2 clone has no FMA enabled), so every
 * backend and every CPU gives the same bits. */
CLONES static void axpy_range(const kargs *a, size_t begin, size_t end)
{
    const float alpha = a->alpha;
    if (a->dt == ZERO_F32) {
        const float *xp = a->x;
        float *yp = a->y;
        SIMD
        for (size_t i = begin; i < end; i++) {
            float t = alpha * xp[i];
            yp[i] = yp[i] + t;
        }
    } else if (a->dt == ZERO_F16) {
        const uint16_t *xp = a->x;
        uint16_t *yp = a->y;
        if (f16c_usable()) {
            axpy_f16_f16c(alpha, xp, yp, begin, end);
            return;
        }
        SIMD
        for (size_t i = begin; i < end; i++) {
            float t = alpha * zero_cvt_f16_to_f32(xp[i]);
            yp[i] = zero_cvt_f32_to_f16(zero_cvt_f16_to_f32(yp[i]) + t);
        }
    } else {
        const uint16_t *xp = a->x;
        uint16_t *yp = a->y;
        SIMD
        for (size_t i = begin; i < end; i++) {
            float t = alpha * zero_cvt_bf16_to_f32(xp[i]);
            yp[i] = zero_cvt_f32_to_bf16(zero_cvt_bf16_to_f32(yp[i]) + t);
        }
    }
}

CLONES static void cast_range(const kargs *a, size_t begin, size_t end)
{
    zero_dtype sdt = a->dt, ddt = a->dt2;
    if (sdt == ZERO_F32) {
        const float *s = a->x;
        uint16_t *d = a->y;
        if (ddt == ZERO_F16) {
            if (f16c_usable()) {
                f32_to_f16_f16c(s + begin, d + begin, end - begin);
                return;
            }
            SIMD
            for (size_t i = begin; i < end; i++) d[i] = zero_cvt_f32_to_f16(s[i]);
        } else {
            SIMD
            for (size_t i = begin; i < end; i++) d[i] = zero_cvt_f32_to_bf16(s[i]);
        }
    } else if (ddt == ZERO_F32) {
        const uint16_t *s = a->x;
        float *d = a->y;
        if (sdt == ZERO_F16) {
            if (f16c_usable()) {
                f16_to_f32_f16c(s + begin, d + begin, end - begin);
                return;
            }
            SIMD
            for (size_t i = begin; i < end; i++) d[i] = zero_cvt_f16_to_f32(s[i]);
        } else {
            SIMD
            for (size_t i = begin; i < end; i++) d[i] = zero_cvt_bf16_to_f32(s[i]);
        }
    } else {
        /* f16 <-> bf16 through f32: the widening is exact, so one rounding. */
        const uint16_t *s = a->x;
        uint16_t *d = a->y;
        if (sdt == ZERO_F16) {
            SIMD
            for (size_t i = begin; i < end; i++) d[i] = zero_cvt_f32_to_bf16(zero_cvt_f16_to_f32(s[i]));
        } else {
            SIMD
            for (size_t i = begin; i < end; i++) d[i] = zero_cvt_f32_to_f16(zero_cvt_bf16_to_f32(s[i]));
        }
    }
}

/* One block's sum of squares, in double (an f32 squared is exact in double).
 * Blocks are fixed, summed in order afterwards: the result does not depend
 * on the number of threads. Within a block, SUMSQ_LANES independent partial
 * sums (element i goes to lane i % SUMSQ_LANES, lanes added in order at the
 * end) keep the result independent of the ISA too, and give the vector
 * units enough independent additions to run at memory speed: one vector
 * accumulator made the norm a chain of dependent adds, 40 % of the
 * optimizer kernel's time on 1/7 of its traffic (issue 15, stepcost). */
#define SUMSQ_LANES 32
#define SUMSQ_BODY(load)                                                                      \
    do {                                                                                       \
        double lane[SUMSQ_LANES] = {0};                                                        \
        size_t i = begin;                                                                      \
        for (; i + SUMSQ_LANES <= end; i += SUMSQ_LANES)                                       \
            _Pragma("GCC unroll 32") for (int l = 0; l < SUMSQ_LANES; l++) {                   \
                double v = load(p[i + (size_t)l]);                                             \
                lane[l] += v * v;                                                              \
            }                                                                                  \
        for (int l = 0; i < end; i++, l++) {                                                   \
            double v = load(p[i]);                                                             \
            lane[l] += v * v;                                                                  \
        }                                                                                      \
        for (int l = 0; l < SUMSQ_LANES; l++) acc += lane[l];                                  \
    } while (0)
#define SUMSQ_LOAD_F32(x) ((double)(x))
#define SUMSQ_LOAD_F16(x) ((double)zero_cvt_f16_to_f32(x))
#define SUMSQ_LOAD_BF16(x) ((double)zero_cvt_bf16_to_f32(x))

CLONES static void sumsq_block(const kargs *a, size_t begin, size_t end)
{
    double acc = 0.0;
    if (a->dt == ZERO_F32) {
        const float *p = a->x;
        SUMSQ_BODY(SUMSQ_LOAD_F32);
    } else if (a->dt == ZERO_F16) {
        const uint16_t *p = a->x;
        SUMSQ_BODY(SUMSQ_LOAD_F16);
    } else {
        const uint16_t *p = a->x;
        SUMSQ_BODY(SUMSQ_LOAD_BF16);
    }
    a->partial[begin / BLOCK] = acc;
}

/* f32 on AVX-512, chosen at run time: the same 32 lanes as four 8-double
 * registers (lanes 8j..8j+7 in register j), the same tail, the same lane
 * order at the end, so the same bits. The square is exact in double, so
 * fma(v, v, lane) rounds once exactly where v * v + lane did: one
 * instruction per 8 elements instead of three for the AVX2 clone, whose
 * widening shuffles bound it in cache. Four blocks are read side by side:
 * four streams keep more cache misses in flight than one, which is what a
 * single core's read bandwidth out of L3 and memory depends on. Together:
 * the norm's cycles fell from 0.40 to 0.18 of the AdamW kernel's on the
 * same elements (perf, zero-bench stepcost at 2e7; BENCHMARKS.md).
 * ZERO_CPU_ISA=avx2|sse2|scalar turns it off (the tests run both). */
#define SUMSQ_GROUP 4 /* blocks read side by side */
#if defined(__GNUC__) && defined(__x86_64__)
static int sumsq_avx512_usable(void)
{
    static int usable = -1;
    int u = __atomic_load_n(&usable, __ATOMIC_RELAXED);
    if (u < 0) {
        const char *cap = getenv("ZERO_CPU_ISA");
        int capped = cap && (!strcmp(cap, "avx2") || !strcmp(cap, "sse2") || !strcmp(cap, "scalar"));
        u = !capped && __builtin_cpu_supports("avx512f");
        __atomic_store_n(&usable, u, __ATOMIC_RELAXED);
    }
    return u;
}

/* The 32 lanes of one block, from its four registers, plus its tail; the
 * block's sum. */
__attribute__((target("avx512f"))) static double sumsq_lanes_close(const __m512d acc[4], const float *p, size_t i,
                                                                   size_t end)
{
    double lane[SUMSQ_LANES];
    for (int j = 0; j < 4; j++) _mm512_storeu_pd(lane + 8 * j, acc[j]);
    for (int l = 0; i < end; i++, l++) {
        double v = (double)p[i];
        lane[l] += v * v;
    }
    double s = 0.0;
    for (int l = 0; l < SUMSQ_LANES; l++) s += lane[l];
    return s;
}

__attribute__((target("avx512f"))) static void sumsq_f32_avx512(const float *p, size_t begin, size_t end,
                                                                double *partial)
{
    size_t b0 = begin;
    /* SUMSQ_GROUP whole blocks side by side */
    for (; b0 + SUMSQ_GROUP * BLOCK <= end; b0 += SUMSQ_GROUP * BLOCK) {
        __m512d acc[SUMSQ_GROUP][4];
        for (int k = 0; k < SUMSQ_GROUP; k++)
            for (int j = 0; j < 4; j++) acc[k][j] = _mm512_setzero_pd();
        for (size_t i = 0; i < BLOCK; i += SUMSQ_LANES)
            for (int k = 0; k < SUMSQ_GROUP; k++)
                for (int j = 0; j < 4; j++) {
                    __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(p + b0 + (size_t)k * BLOCK + i + 8 * (size_t)j));
                    acc[k][j] = _mm512_fmadd_pd(v, v, acc[k][j]);
                }
        for (int k = 0; k < SUMSQ_GROUP; k++)
            partial[(b0 + (size_t)k * BLOCK) / BLOCK] = sumsq_lanes_close(acc[k], p, b0 + (size_t)k * BLOCK + BLOCK,
                                                                          b0 + (size_t)k * BLOCK + BLOCK);
    }
    /* the rest block by block, the last one possibly short */
    for (; b0 < end; b0 += BLOCK) {
        size_t b1 = end - b0 < BLOCK ? end : b0 + BLOCK, i = b0;
        __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
        for (; i + SUMSQ_LANES <= b1; i += SUMSQ_LANES)
            for (int j = 0; j < 4; j++) {
                __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(p + i + 8 * (size_t)j));
                acc[j] = _mm512_fmadd_pd(v, v, acc[j]);
            }
        partial[b0 / BLOCK] = sumsq_lanes_close(acc, p, i, b1);
    }
}
#else
static int sumsq_avx512_usable(void) { return 0; }
static void sumsq_f32_avx512(const float *p, size_t begin, size_t end, double *partial)
{
    (void)p, (void)begin, (void)end, (void)partial;
}
#endif

/* [begin, end): SUMSQ_GROUP blocks (run_blocks' span), each block's sum in
 * its partial. */
static void sumsq_range(const kargs *a, size_t begin, size_t end)
{
    if (a->dt == ZERO_F32 && sumsq_avx512_usable()) {
        sumsq_f32_avx512(a->x, begin, end, a->partial);
        return;
    }
    for (size_t b0 = begin; b0 < end; b0 += BLOCK) sumsq_block(a, b0, end - b0 < BLOCK ? end : b0 + BLOCK);
}

static zero_status cpu_fill(zero_device *dev, void *x, zero_dtype dt, size_t n, float value, zero_stream *s)
{
    kargs a = {.y = x, .dt = dt, .alpha = value};
    return launch(dev, s, n, fill_range, &a);
}

static zero_status cpu_scale(zero_device *dev, void *x, zero_dtype dt, size_t n, float alpha, zero_stream *s)
{
    kargs a = {.y = x, .dt = dt, .alpha = alpha};
    return launch(dev, s, n, scale_range, &a);
}

static zero_status cpu_axpy(zero_device *dev, float alpha, const void *x, void *y, zero_dtype dt, size_t n,
                            zero_stream *s)
{
    kargs a = {.x = x, .y = y, .dt = dt, .alpha = alpha};
    return launch(dev, s, n, axpy_range, &a);
}

static zero_status cpu_cast(zero_device *dev, const void *src, zero_dtype sdt, void *dst, zero_dtype ddt, size_t n,
                            zero_stream *s)
{
    if (sdt == ddt) return cpu_memcpy_async(dev, dst, src, n * zero_dtype_size(sdt), s);
    kargs a = {.x = src, .y = dst, .dt = sdt, .dt2 = ddt};
    return launch(dev, s, n, cast_range, &a);
}

/* The gradient reduction's pass (device_internal.h, zero_take_grad_): per
 * block, y = fp32(x) or y += fp32(x), then x = 0 while the block is still in
 * cache - one pass over the trainer's gradients instead of a copy (or a
 * cast) followed by a separate zeroing pass. The values are those of the
 * cast / copy and axpy with alpha 1 it replaces (1 * x is x; the same
 * widenings), so every stage taking this path or the old one agrees. */
CLONES static void take_range(const kargs *a, size_t begin, size_t end)
{
    float *y = a->y;
    const size_t es = zero_dtype_size(a->dt);
    if (!a->acc) {
        if (a->dt == ZERO_F32) memcpy(y + begin, (const float *)a->x + begin, (end - begin) * 4);
        else cast_range(&(kargs){.x = a->x, .y = y, .dt = a->dt, .dt2 = ZERO_F32}, begin, end);
    } else if (a->dt == ZERO_F32) {
        const float *x = a->x;
        SIMD
        for (size_t i = begin; i < end; i++) y[i] = y[i] + x[i];
    } else if (a->dt == ZERO_BF16) {
        const uint16_t *x = a->x;
        SIMD
        for (size_t i = begin; i < end; i++) y[i] = y[i] + zero_cvt_bf16_to_f32(x[i]);
    } else {
        const uint16_t *x = a->x;
        SIMD
        for (size_t i = begin; i < end; i++) y[i] = y[i] + zero_cvt_f16_to_f32(x[i]);
    }
    if (a->clear) memset((char *)a->clear + begin * es, 0, (end - begin) * es);
}

static zero_status cpu_take(zero_device *dev, void *src, zero_dtype sdt, int clear, float *dst, int accumulate,
                            size_t n, zero_stream *s)
{
    kargs a = {.x = src, .y = dst, .dt = sdt, .clear = clear ? src : NULL, .acc = accumulate};
    return launch(dev, s, n, take_range, &a);
}

static zero_status cpu_sumsq(zero_device *dev, const void *x, zero_dtype dt, size_t n, double *out, int *nonfinite,
                             zero_stream *s)
{
    size_t nblocks = (n + BLOCK - 1) / BLOCK;
    double stack_part[64];
    /* Async mode: heap memory, since a worker that outlives a timed-out wait
     * may still write it (then it is leaked on purpose). */
    double *part = nblocks <= 64 && !cpu_async_on(dev) ? stack_part : malloc(nblocks * sizeof *part);
    if (!part)
        return zero_fail(&dev->err, ZERO_OUT_OF_MEMORY, "zero_sumsq(cpu): cannot allocate %zu partial sums",
                         nblocks);
    kargs a = {.x = x, .dt = dt, .partial = part, .span = SUMSQ_GROUP * BLOCK};
    zero_status st = launch(dev, s, n, sumsq_range, &a); /* the value is needed: wait for it */
    if (st == ZERO_OK && cpu_async_on(dev)) st = cpu_async_stream_sync(dev, s, "zero_sumsq");
    if (st != ZERO_OK) return st; /* part may still be written: see above */
    double total = 0.0;
    for (size_t b = 0; b < nblocks; b++) total += part[b];
    if (part != stack_part) free(part);
    /* Any inf or NaN element makes the sum inf or NaN (squares are never
     * negative, so infinities cannot cancel), and a finite sum of at most
     * SIZE_MAX squares of values below FLT_MAX cannot overflow a double:
     * the flag is exactly "the sum is not finite". */
    *out = total;
    *nonfinite = !(total - total == 0.0);
    return ZERO_OK;
}

/* ---------------------------------------------------------------- table */

const zero_device_ops zero_cpu_device_ops = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .alloc_pinned = cpu_alloc_pinned,
    .free_pinned = cpu_free,
    .host_register = NULL,
    .host_unregister = NULL,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .device_sync = cpu_device_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_sync = cpu_event_sync,
    .event_query = cpu_event_query,
    .memcpy_sync = cpu_memcpy,
    .memcpy_async = cpu_memcpy_async,
    .fill = cpu_fill,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .cast = cpu_cast,
    .sumsq = cpu_sumsq,
    .take = cpu_take,
};

/* ---------------------------------------------------------------- host functions in stream order */

typedef struct host_fn_call {
    void (*fn)(void *);
    void *arg;
} host_fn_call;

static void run_host_fn(const void *arg)
{
    const host_fn_call *c = arg;
    c->fn(c->arg);
}

zero_status zero_stream_enqueue_host_(zero_stream *s, void (*fn)(void *), void *arg)
{
    if (!s || s->dev->kind != ZERO_DEVICE_CPU)
        return zero_fail(NULL, ZERO_UNSUPPORTED, "host functions in stream order: only on the CPU device");
    if (!cpu_async_on(s->dev)) {
        fn(arg); /* synchronous device: everything before it has run */
        return ZERO_OK;
    }
    host_fn_call c = {fn, arg};
    return cpu_async_submit(s->dev, s, run_host_fn, &c, sizeof c);
}
