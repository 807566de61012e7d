/* libzero: the umbrella header of the stable surface (docs/abi.md). Includes
 * every public header except zero/zero_cuda.h (CUDA-only types, so CPU-only
 * users never see them: include it yourself with a CUDA build) and the
 * experimental surface (zero/experimental.h with offload.h and topo.h:
 * define ZERO_EXPERIMENTAL and include it yourself). */
#ifndef ZERO_ZERO_H
#define ZERO_ZERO_H

#include <zero/export.h>
#include <zero/version.h>
#include <zero/status.h>
#include <zero/log.h>
#include <zero/dtype.h>
#include <zero/device.h>
#include <zero/comm.h>
#include <zero/engine.h>
#include <zero/checkpoint.h>

#endif
