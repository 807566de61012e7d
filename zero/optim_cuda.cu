/* CUDA optimizer step kernels: the device twins of optim/cpu_optim.c.
 * Explicit _rn intrinsics keep nvcc from contracting multiply-adds into FMA,
 * so the rounding sequence is the CPU kernels' one. The per-element update
 * is written once (adamw_elem, sgd_elem) and used by the per-region kernels
 * and by the fused multi-tensor kernel; the fused kernel's casts are
 * device/convert_impl.h's, the CPU device's bits. */
#include <cuda_runtime.h>

#include "device/convert_impl.h"
#include "zero/optim_cuda.h"

namespace {

__device__ __forceinline__ void adamw_elem(const zero_optim_hyper &h, float &p, float g, float &m, float &v)
{
    float gi = __fmul_rn(g, h.grad_scale);
    float pi = __fmul_rn(p, h.decay);
    float mi = __fadd_rn(__fmul_rn(m, h.beta1), __fmul_rn(h.one_minus_beta1, gi));
    float vi = __fadd_rn(__fmul_rn(v, h.beta2), __fmul_rn(__fmul_rn(h.one_minus_beta2, gi), gi));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), h.bc2_sqrt), h.eps);
    p = __fadd_rn(pi, __fdiv_rn(__fmul_rn(h.neg_step_size, mi), denom));
    m = mi;
    v = vi;
}

/* has_buf: a momentum buffer exists (b is read and written). */
__device__ __forceinline__ void sgd_elem(const zero_optim_hyper &h, float &p, float g, float &b, bool has_buf)
{
    float d = __fadd_rn(__fmul_rn(g, h.grad_scale), __fmul_rn(h.weight_decay, p));
    if (has_buf) {
        float nb = h.first ? d : __fadd_rn(__fmul_rn(b, h.momentum), __fmul_rn(h.one_minus_dampening, d));
        b = nb;
        d = h.nesterov ? __fadd_rn(d, __fmul_rn(h.momentum, nb)) : nb;
    }
    p = __fadd_rn(p, __fmul_rn(h.neg_lr, d));
}

__global__ void adamw_kernel(zero_optim_hyper h, float *__restrict__ p, const float *__restrict__ g,
                             float *__restrict__ m, float *__restrict__ v, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float pi = p[i], mi = m[i], vi = v[i];
        adamw_elem(h, pi, g[i], mi, vi);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
}

__global__ void sgd_kernel(zero_optim_hyper h, float *__restrict__ p, const float *__restrict__ g,
                           float *__restrict__ buf, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float pi = p[i], bi = buf ? buf[i] : 0.0f;
        sgd_elem(h, pi, g[i], bi, buf != nullptr);
        p[i] = pi;
        if (buf) buf[i] = bi;
    }
}

unsigned grid_for(size_t n)
{
    size_t blocks = (n + 255) / 256;
    return (unsigned)(blocks > 65535 ? 65535 : (blocks ? blocks : 1));
}

/* ---------------------------------------------------------------- fused multi-tensor kernel
 * One block per chunk of the table. Where every offset of the chunk and its
 * length are multiples of 4 (the usual case: bucket chunks are padded to
 * the dp size, and the arrays are 256-byte aligned) each thread moves
 * float4s (and 4 x 16-bit params as one 8-byte store); otherwise floats.
 * The arithmetic per element is the same either way. */

constexpr int FUSED_THREADS = 512;

struct fused_args {
    int adamw;
    const zero_optim_hyper *hyper;
    const zero_optim_chunk *chunks;
    float *p;
    const float *g;
    float *m1, *m2;
    void *out;
    int out_dtype; /* 0: none; else ZERO_BF16 / ZERO_F16 */
};

__device__ __forceinline__ uint16_t to16(float x, int dt)
{
    return dt == ZERO_BF16 ? zero_cvt_f32_to_bf16(x) : zero_cvt_f32_to_f16(x);
}

__device__ __forceinline__ void update1(const fused_args &a, const zero_optim_hyper &h, float &p, float g, float *m1,
                                        float *m2, size_t i)
{
    if (a.adamw) {
        float m = m1[i], v = m2[i];
        adamw_elem(h, p, g, m, v);
        m1[i] = m;
        m2[i] = v;
    } else {
        float b = m1 ? m1[i] : 0.0f;
        sgd_elem(h, p, g, b, m1 != nullptr);
        if (m1) m1[i] = b;
    }
}

__global__ void __launch_bounds__(FUSED_THREADS) fused_kernel(fused_args a)
{
    const zero_optim_chunk c = a.chunks[blockIdx.x];
    const zero_optim_hyper h = a.hyper[c.group];
    float *p = a.p + c.p_off;
    const float *g = a.g + c.g_off;
    /* SGD in a group without momentum: its buffer untouched (as the CPU twin) */
    float *m1 = a.m1 && (a.adamw || h.momentum > 0) ? a.m1 + c.m_off : nullptr;
    float *m2 = a.m2 ? a.m2 + c.m_off : nullptr;
    uint16_t *o = a.out ? static_cast<uint16_t *>(a.out) + c.out_off : nullptr;
    const bool vec = ((c.p_off | c.g_off | c.m_off | c.len | (o ? c.out_off : 0)) & 3) == 0;
    if (vec) {
        const uint32_t n4 = c.len / 4;
        for (uint32_t j = threadIdx.x; j < n4; j += blockDim.x) {
            float4 pv = reinterpret_cast<float4 *>(p)[j];
            const float4 gv = reinterpret_cast<const float4 *>(g)[j];
            float4 mv = make_float4(0, 0, 0, 0), vv = make_float4(0, 0, 0, 0);
            if (m1) mv = reinterpret_cast<float4 *>(m1)[j];
            if (m2) vv = reinterpret_cast<float4 *>(m2)[j];
            if (a.adamw) {
                adamw_elem(h, pv.x, gv.x, mv.x, vv.x);
                adamw_elem(h, pv.y, gv.y, mv.y, vv.y);
                adamw_elem(h, pv.z, gv.z, mv.z, vv.z);
                adamw_elem(h, pv.w, gv.w, mv.w, vv.w);
            } else {
                const bool hb = m1 != nullptr;
                sgd_elem(h, pv.x, gv.x, mv.x, hb);
                sgd_elem(h, pv.y, gv.y, mv.y, hb);
                sgd_elem(h, pv.z, gv.z, mv.z, hb);
                sgd_elem(h, pv.w, gv.w, mv.w, hb);
            }
            reinterpret_cast<float4 *>(p)[j] = pv;
            if (m1) reinterpret_cast<float4 *>(m1)[j] = mv;
            if (m2) reinterpret_cast<float4 *>(m2)[j] = vv;
            if (o) {
                ushort4 ov = make_ushort4(to16(pv.x, a.out_dtype), to16(pv.y, a.out_dtype), to16(pv.z, a.out_dtype),
                                          to16(pv.w, a.out_dtype));
                reinterpret_cast<ushort4 *>(o)[j] = ov;
            }
        }
        return;
    }
    for (uint32_t i = threadIdx.x; i < c.len; i += blockDim.x) {
        float pi = p[i];
        update1(a, h, pi, g[i], m1, m2, i);
        p[i] = pi;
        if (o) o[i] = to16(pi, a.out_dtype);
    }
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

extern "C" int zero_cuda_fused_step(const zero_optim_fused *f, void *stream)
{
    if (f->num_chunks == 0) return 0;
    if (f->num_chunks > 0x7fffffffu) return (int)cudaErrorInvalidValue;
    fused_args a;
    a.adamw = f->adamw;
    a.hyper = f->hyper;
    a.chunks = f->chunks;
    a.p = f->p;
    a.g = f->g;
    a.m1 = f->m1;
    a.m2 = f->m2;
    a.out = f->out;
    a.out_dtype = f->out ? (int)f->out_dtype : 0;
    fused_kernel<<<(unsigned)f->num_chunks, FUSED_THREADS, 0, (cudaStream_t)stream>>>(a);
    return (int)cudaGetLastError();
}

extern "C" const char *zero_cuda_optim_error_string(int err)
{
    return cudaGetErrorString((cudaError_t)err);
}
