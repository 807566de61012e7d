/* Internal: the CUDA optimizer step kernels (zero/optim_cuda.cu). They take
 * the same hyper block as the CPU kernels and round the same way (no
 * contraction into FMA) and are enqueued on `stream` (a cudaStream_t: the
 * engine's stream), without waiting. Return 0 or a cudaError_t value of the
 * launch. */
#ifndef ZERO_OPTIM_CUDA_H
#define ZERO_OPTIM_CUDA_H

#include <stddef.h>

#include "optim/cpu_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

int zero_cuda_adamw(const zero_optim_hyper *h, float *p, const float *g, float *m, float *v, size_t n,
                    void *stream);
int zero_cuda_sgd(const zero_optim_hyper *h, float *p, const float *g, float *buf, size_t n, void *stream);
const char *zero_cuda_optim_error_string(int err);

#ifdef __cplusplus
}
#endif

#endif
