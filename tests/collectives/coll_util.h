/* Test helpers for the collectives: deterministic data from (rank, index)
 * and references computed locally, so every rank knows every rank's input.
 *
 * The values are chosen so every fp32 partial sum is exact whatever order MPI
 * adds in (bitwise comparison is then meaningful), while the 16-bit sums need
 * more bits than the type has: round-once and round-per-step differ. */
#ifndef ZERO_TESTS_COLL_UTIL_H
#define ZERO_TESTS_COLL_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/comm.h>
#include <zero/device.h>

#include "check.h"

static const zero_dtype coll_all_dtypes[] = {ZERO_F32, ZERO_F16, ZERO_BF16, ZERO_I32, ZERO_I64, ZERO_U8, ZERO_F64};
#define COLL_NDTYPES 7

/* The value rank `r` contributes at index `i`, as an exact double. */
static inline double coll_value(zero_dtype d, int r, size_t i)
{
    long h = (long)((i * 2654435761u + (size_t)r * 40503u + 12345u) % 1000003u);
    int s = r % 4;
    switch (d) {
    case ZERO_BF16: return ldexp((double)(h % 255 - 127), s - 2);   /* 7 bits */
    case ZERO_F16: return ldexp((double)(h % 2047 - 1023), s - 3);  /* 10 bits */
    case ZERO_F32: return ldexp((double)(h % 131071 - 65535), s - 2);
    case ZERO_F64: return ldexp((double)(h * 1000003 % 1099511627689L - 549755813844L), s - 2);
    case ZERO_I32: return (double)(h % 2000001 - 1000000);
    case ZERO_I64: return (double)(h - 500001) * 8589934592.0 + (double)r; /* > 2^32 */
    case ZERO_U8: return (double)((h + r) & 255);
    }
    return 0;
}

static inline void coll_store(zero_dtype d, void *buf, size_t i, double v)
{
    switch (d) {
    case ZERO_F32: ((float *)buf)[i] = (float)v; break;
    case ZERO_F64: ((double *)buf)[i] = v; break;
    case ZERO_F16: ((uint16_t *)buf)[i] = zero_f32_to_f16((float)v); break;
    case ZERO_BF16: ((uint16_t *)buf)[i] = zero_f32_to_bf16((float)v); break;
    case ZERO_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ZERO_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ZERO_U8: ((uint8_t *)buf)[i] = (uint8_t)((int64_t)v & 255); break;
    }
}

/* Fill n elements of rank r's input, starting at index `first`. */
static inline void coll_fill(zero_dtype d, void *buf, size_t n, int r, size_t first)
{
    for (size_t i = 0; i < n; i++) coll_store(d, buf, i, coll_value(d, r, first + i));
}

/* Reference reduction over ranks[0..nr) at index i: exact in double, then
 * stored with one rounding (16-bit floats: round once to nearest even). */
static inline void coll_ref_reduce(zero_dtype d, zero_redop op, const int *ranks, int nr, size_t i, void *out,
                                   size_t oi)
{
    if (d == ZERO_I64 && op == ZERO_SUM) {
        /* int64 sums may exceed 2^53: add exactly. */
        int64_t acc = 0;
        for (int k = 0; k < nr; k++) acc += (int64_t)coll_value(d, ranks[k], i);
        ((int64_t *)out)[oi] = acc;
        return;
    }
    if (d == ZERO_U8 && op == ZERO_SUM) {
        unsigned acc = 0;
        for (int k = 0; k < nr; k++) acc += (unsigned)coll_value(d, ranks[k], i);
        ((uint8_t *)out)[oi] = (uint8_t)(acc & 255);
        return;
    }
    double acc = coll_value(d, ranks[0], i);
    for (int k = 1; k < nr; k++) {
        double v = coll_value(d, ranks[k], i);
        acc = op == ZERO_MAX ? (v > acc ? v : acc) : acc + v;
    }
    coll_store(d, out, oi, acc);
}

/* The 16-bit sum a wrong implementation would produce: rounded after every
 * addition, in rank order. */
static inline uint16_t coll_round_per_step(zero_dtype d, int nr, size_t i)
{
    uint16_t acc = d == ZERO_BF16 ? zero_f32_to_bf16((float)coll_value(d, 0, i))
                                  : zero_f32_to_f16((float)coll_value(d, 0, i));
    for (int k = 1; k < nr; k++) {
        float a = d == ZERO_BF16 ? zero_bf16_to_f32(acc) : zero_f16_to_f32(acc);
        float s = a + (float)coll_value(d, k, i);
        acc = d == ZERO_BF16 ? zero_f32_to_bf16(s) : zero_f32_to_f16(s);
    }
    return acc;
}

/* Index of the first differing element, or -1 when bitwise equal. */
static inline long coll_first_diff(const void *a, const void *b, size_t n, size_t es)
{
    if (!memcmp(a, b, n * es)) return -1;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * es, (const char *)b + i * es, es)) return (long)i;
    return -1;
}

static inline double coll_load(zero_dtype d, const void *buf, size_t i)
{
    switch (d) {
    case ZERO_F32: return ((const float *)buf)[i];
    case ZERO_F64: return ((const double *)buf)[i];
    case ZERO_F16: return zero_f16_to_f32(((const uint16_t *)buf)[i]);
    case ZERO_BF16: return zero_bf16_to_f32(((const uint16_t *)buf)[i]);
    case ZERO_I32: return ((const int32_t *)buf)[i];
    case ZERO_I64: return (double)((const int64_t *)buf)[i];
    case ZERO_U8: return ((const uint8_t *)buf)[i];
    }
    return 0;
}

/* got bitwise equal to want (n elements of d); else a failed check naming
 * `what` and the first element that differs. */
static inline void coll_expect_equal(const void *got, const void *want, size_t n, zero_dtype d, const char *what)
{
    long i = coll_first_diff(got, want, n, zero_dtype_size(d));
    CHECK_MSG(i < 0, "%s: element %ld of %zu differs: got %.9g, want %.9g", what, i, n,
              i < 0 ? 0 : coll_load(d, got, (size_t)i), i < 0 ? 0 : coll_load(d, want, (size_t)i));
}

/* comm's counters (zero_comm_get_counters) since `before`: exactly one more
 * call of kind k, exactly `sent` bytes sent and `recv` received by it. */
static inline void coll_check_counters(zero_comm *comm, const zero_comm_counters *before, zero_op_kind k, uint64_t sent,
                                       uint64_t recv, const char *what)
{
    zero_comm_counters now;
    CHECK_OK(zero_comm_get_counters(comm, &now));
    CHECK_MSG(now.calls[k] == before->calls[k] + 1, "%s: calls %llu -> %llu", what,
              (unsigned long long)before->calls[k], (unsigned long long)now.calls[k]);
    CHECK_MSG(now.bytes_sent[k] - before->bytes_sent[k] == sent, "%s: sent %llu bytes, expected %llu", what,
              (unsigned long long)(now.bytes_sent[k] - before->bytes_sent[k]), (unsigned long long)sent);
    CHECK_MSG(now.bytes_recv[k] - before->bytes_recv[k] == recv, "%s: received %llu bytes, expected %llu", what,
              (unsigned long long)(now.bytes_recv[k] - before->bytes_recv[k]), (unsigned long long)recv);
}

#endif
