/* libzero: the umbrella header. Includes every public header except
 * zero/zero_cuda.h: CUDA-only types live there, so CPU-only users never see
 * them (include it yourself with a CUDA build). */
#ifndef ZERO_ZERO_H
#define ZERO_ZERO_H

#include <zero/export.h>
#include <zero/version.h>
#include <zero/status.h>
#include <zero/log.h>
#include <zero/dtype.h>
#include <zero/device.h>
#include <zero/comm.h>
#include <zero/topo.h>
#include <zero/engine.h>
#include <zero/checkpoint.h>
#include <zero/offload.h>

#endif
