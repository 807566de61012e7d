/* The exported scalar conversions: the host reference of the device casts.
 * The arithmetic lives in convert_impl.h so the CUDA kernels share it. */
#include <zero/device.h>

#include "convert_impl.h"

uint16_t zero_f32_to_bf16(float x) { return zero_cvt_f32_to_bf16(x); }
float zero_bf16_to_f32(uint16_t x) { return zero_cvt_bf16_to_f32(x); }
uint16_t zero_f32_to_f16(float x) { return zero_cvt_f32_to_f16(x); }
float zero_f16_to_f32(uint16_t x) { return zero_cvt_f16_to_f32(x); }
