/* Element types understood by every libzero layer. */
#ifndef ZERO_DTYPE_H
#define ZERO_DTYPE_H

#include <stddef.h>
#include <zero/export.h>

ZERO_EXTERN_C_BEGIN

typedef enum zero_dtype {
    ZERO_F32 = 0,
    ZERO_F16 = 1,  /* IEEE binary16 */
    ZERO_BF16 = 2, /* bfloat16: the top 16 bits of an f32 */
    ZERO_I32 = 3,
    ZERO_I64 = 4,
    ZERO_U8 = 5,
    ZERO_F64 = 6,
} zero_dtype;

/* Bytes per element; 0 for a value that is not a zero_dtype. */
ZERO_API size_t zero_dtype_size(zero_dtype dtype);
/* "f32", "bf16", ...; "unknown" for a value that is not a zero_dtype. */
ZERO_API const char *zero_dtype_name(zero_dtype dtype);

ZERO_EXTERN_C_END

#endif
