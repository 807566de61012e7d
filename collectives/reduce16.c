/* fp32 accumulation for f16/bf16 reductions.
 *
 * MPI has no bf16 type, and a user-defined op on 2-byte elements would round
 * to 16 bits after every partial sum (n-1 roundings, order-dependent). So the
 * MPI path widens each 16-bit input to fp32, reduces fp32 with MPI's own
 * MPI_FLOAT ops, and rounds the result once (to nearest even) at the end.
 * The conversions are the device layer's integer-exact ones, inlined so a
 * 256 MiB buffer converts at memory speed. */
#include "comm_internal.h"

#include "device/convert_impl.h"

void coll_r16_to_f32(const uint16_t *src, float *dst, size_t n, zero_dtype dtype)
{
    if (dtype == ZERO_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = zero_cvt_bf16_to_f32(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = zero_cvt_f16_to_f32(src[i]);
}

void coll_f32_to_r16(const float *src, uint16_t *dst, size_t n, zero_dtype dtype)
{
    if (dtype == ZERO_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = zero_cvt_f32_to_bf16(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = zero_cvt_f32_to_f16(src[i]);
}
