/* Internal (CUDA only): the fused flash attention kernels of gpt_flash.h,
 * for activations stored as fp32 (float) or bf16 (__nv_bfloat16); every sum
 * in fp32. Stream-ordered on `stream`; the return value is the launch's
 * error (cudaGetLastError), execution errors surface at the next sync. */
#ifndef ZERO_MODEL_GPT_CUDA_FLASH_CUH
#define ZERO_MODEL_GPT_CUDA_FLASH_CUH

#include <cuda_runtime.h>

/* out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C); hs = C/NH <= GPT_FLASH_MAX_HS. */
template <typename AT>
cudaError_t gpt_cuda_flash_forward(AT *out, float *lse, const AT *qkv, int B, int T, int C, int NH,
                                   cudaStream_t stream);
/* dqkv (overwritten) from dout, out, lse and qkv; D: B*NH*T floats of scratch. */
template <typename AT>
cudaError_t gpt_cuda_flash_backward(AT *dqkv, float *D, const AT *dout, const AT *out, const float *lse,
                                    const AT *qkv, int B, int T, int C, int NH, cudaStream_t stream);

#endif
