/* CUDA optimizer step kernels: the device twins of offload/cpu_optim.c.
 * Explicit _rn intrinsics keep nvcc from contracting multiply-adds into FMA,
 * so the rounding sequence is the CPU kernels' one. */
#include <cuda_runtime.h>

#include "zero/optim_cuda.h"

namespace {

__global__ void adamw_kernel(zero_optim_hyper h, float *__restrict__ p, const float *__restrict__ g,
                             float *__restrict__ m, float *__restrict__ v, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = __fmul_rn(g[i], h.grad_scale);
        float pi = __fmul_rn(p[i], h.decay);
        float mi = __fadd_rn(__fmul_rn(m[i], h.beta1), __fmul_rn(h.one_minus_beta1, gi));
        float vi = __fadd_rn(__fmul_rn(v[i], h.beta2), __fmul_rn(__fmul_rn(h.one_minus_beta2, gi), gi));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), h.bc2_sqrt), h.eps);
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(h.neg_step_size, mi), denom));
        m[i] = mi;
        v[i] = vi;
    }
}

__global__ void sgd_kernel(zero_optim_hyper h, float *__restrict__ p, const float *__restrict__ g,
                           float *__restrict__ buf, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float d = __fadd_rn(__fmul_rn(g[i], h.grad_scale), __fmul_rn(h.weight_decay, p[i]));
        if (buf) {
            float b = h.first ? d : __fadd_rn(__fmul_rn(buf[i], h.momentum), __fmul_rn(h.one_minus_dampening, d));
            buf[i] = b;
            d = h.nesterov ? __fadd_rn(d, __fmul_rn(h.momentum, b)) : b;
        }
        p[i] = __fadd_rn(p[i], __fmul_rn(h.neg_lr, d));
    }
}

unsigned grid_for(size_t n)
{
    size_t blocks = (n + 255) / 256;
    return (unsigned)(blocks > 65535 ? 65535 : (blocks ? blocks : 1));
}

} // namespace

extern "C" int zero_cuda_adamw(const zero_optim_hyper *h, float *p, const float *g, float *m, float *v, size_t n,
                               void *stream)
{
    if (n == 0) return 0;
    adamw_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(*h, p, g, m, v, n);
    return (int)cudaGetLastError();
}

extern "C" int zero_cuda_sgd(const zero_optim_hyper *h, float *p, const float *g, float *buf, size_t n, void *stream)
{
    if (n == 0) return 0;
    sgd_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(*h, p, g, buf, n);
    return (int)cudaGetLastError();
}

extern "C" const char *zero_cuda_optim_error_string(int err)
{
    return cudaGetErrorString((cudaError_t)err);
}
