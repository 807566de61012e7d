/* Internal: the CUDA optimizer step kernels (zero/optim_cuda.cu), in the CUDA
 * module (device/cuda_module.h): libzero calls them through its table. They
 * take the same hyper block as the CPU kernels and round the same way (no
 * contraction into FMA) and are enqueued on `stream` (a cudaStream_t: the
 * engine's stream), without waiting. Return 0 or a cudaError_t value of the
 * launch; zero_cuda_optim_error_string names it. zero_cuda_fused_step is the
 * fused multi-tensor step (cpu_optim.h): f->hyper and f->chunks are device
 * copies of the tables, every array device memory; one launch, one block
 * per chunk. */
#ifndef ZERO_OPTIM_CUDA_H
#define ZERO_OPTIM_CUDA_H

#include <stddef.h>

#include "optim/cpu_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(return type, name, parameters): declared here, and the members of the module's table. */
#define ZERO_CUDA_OPTIM_FUNCS(X)                                                                          \
    X(int, zero_cuda_adamw, (const zero_optim_hyper *h, float *p, const float *g, float *m, float *v,     \
                             size_t n, void *stream))                                                     \
    X(int, zero_cuda_sgd, (const zero_optim_hyper *h, float *p, const float *g, float *buf, size_t n,     \
                           void *stream))                                                                 \
    X(int, zero_cuda_fused_step, (const zero_optim_fused *f, void *stream))                              \
    X(const char *, zero_cuda_optim_error_string, (int err))

#define ZERO_CUDA_OPTIM_DECLARE_(ret, name, params) ret name params;
ZERO_CUDA_OPTIM_FUNCS(ZERO_CUDA_OPTIM_DECLARE_)

#ifdef __cplusplus
}
#endif

#endif
