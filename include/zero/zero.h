/* libzero: the umbrella header. Includes every public header; CUDA-only
 * types, where they exist, live in their own header and are not included. */
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
