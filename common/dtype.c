#include <zero/dtype.h>

size_t zero_dtype_size(zero_dtype dtype)
{
    switch (dtype) {
    case ZERO_F32: return 4;
    case ZERO_F16: return 2;
    case ZERO_BF16: return 2;
    case ZERO_I32: return 4;
    case ZERO_I64: return 8;
    case ZERO_U8: return 1;
    case ZERO_F64: return 8;
    }
    return 0;
}

const char *zero_dtype_name(zero_dtype dtype)
{
    switch (dtype) {
    case ZERO_F32: return "f32";
    case ZERO_F16: return "f16";
    case ZERO_BF16: return "bf16";
    case ZERO_I32: return "i32";
    case ZERO_I64: return "i64";
    case ZERO_U8: return "u8";
    case ZERO_F64: return "f64";
    }
    return "unknown";
}
