/* ZERO_API marks every exported symbol; the library is built with
 * -fvisibility=hidden, so the ABI is exactly what the headers mark. */
#ifndef ZERO_EXPORT_H
#define ZERO_EXPORT_H

#if defined(ZERO_BUILDING_LIBRARY) && defined(__GNUC__)
#define ZERO_API __attribute__((visibility("default")))
#else
#define ZERO_API
#endif

#ifdef __cplusplus
#define ZERO_EXTERN_C_BEGIN extern "C" {
#define ZERO_EXTERN_C_END }
#else
#define ZERO_EXTERN_C_BEGIN
#define ZERO_EXTERN_C_END
#endif

/* The old names of functions renamed at 1.0, for one minor version. */
#include <zero/deprecated.h>

#endif
