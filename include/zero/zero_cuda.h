/* CUDA-only additions to the device layer: the CUDA handles behind zero
 * streams and events, and wrapping a stream the caller already has. Kept out
 * of device.h so CPU-only users never see CUDA types; include it only with a
 * libzero built with CUDA (ZERO_HAVE_CUDA), where these symbols exist. */
#ifndef ZERO_ZERO_CUDA_H
#define ZERO_ZERO_CUDA_H

#include <cuda_runtime_api.h>
#include <zero/device.h>

ZERO_EXTERN_C_BEGIN

/* The cudaStream_t a zero_stream enqueues on. NULL (the device's default,
 * legacy stream) for a NULL stream or one of a CPU device. */
ZERO_API cudaStream_t zero_stream_get_cuda(const zero_stream *stream);

/* A zero_stream that enqueues on `stream`, which the caller keeps owning:
 * zero_stream_destroy frees only the wrapper. `dev` must be a CUDA device and
 * `stream` a stream of its GPU. */
ZERO_API zero_status zero_stream_wrap_cuda(zero_device *dev, cudaStream_t stream, zero_stream **out);

/* The cudaEvent_t behind a zero_event of a CUDA device (NULL otherwise). */
ZERO_API cudaEvent_t zero_event_get_cuda(const zero_event *event);

ZERO_EXTERN_C_END

#endif
