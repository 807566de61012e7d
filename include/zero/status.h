/* One status type for every libzero call.
 *
 * The codes come from one X-macro table, which also generates
 * zero_status_name() and zero_strerror(). A code's value never changes once
 * released; new codes are appended. Every failing call also leaves a detailed
 * message: per handle (zero_comm_last_error, zero_engine_last_error, ...) and
 * per thread (zero_last_error), so a failed create can be explained too. */
#ifndef ZERO_STATUS_H
#define ZERO_STATUS_H

#include <zero/export.h>

ZERO_EXTERN_C_BEGIN

/*        name              value  description */
#define ZERO_STATUS_MAP(X)                                                     \
    X(OK,               0, "success")                                          \
    X(INVALID_ARGUMENT, 1, "invalid argument")                                 \
    X(OUT_OF_MEMORY,    2, "out of memory")                                    \
    X(TIMEOUT,          3, "operation did not complete before its deadline")   \
    X(PEER_FAILURE,     4, "a peer rank failed or left")                       \
    X(MISMATCH,         5, "ranks disagree")                                   \
    X(INVALID_STATE,    6, "call not valid in the current state")              \
    X(UNSUPPORTED,      7, "not supported by this build or device")            \
    X(BACKEND,          8, "error reported by a backend library")              \
    X(IO,               9, "input/output error")                               \
    X(CORRUPT,         10, "corrupt, truncated or foreign data")               \
    X(NOT_FOUND,       11, "no such object")                                   \
    X(CONFIG,          12, "invalid configuration")                            \
    X(INTERNAL,        13, "internal error (a libzero bug)")

typedef enum zero_status {
#define ZERO_STATUS_ENUM_(name, value, text) ZERO_##name = value,
    ZERO_STATUS_MAP(ZERO_STATUS_ENUM_)
#undef ZERO_STATUS_ENUM_
} zero_status;

/* "ZERO_TIMEOUT" for ZERO_TIMEOUT; "ZERO_UNKNOWN_STATUS" for a value outside the table. */
ZERO_API const char *zero_status_name(zero_status status);

/* A one-line description of the code itself (not of the last failure). */
ZERO_API const char *zero_strerror(zero_status status);

/* The detailed message of the last call on this thread that failed, or "" if
 * none has. The pointer is valid until the next libzero call on this thread. */
ZERO_API const char *zero_last_error(void);

ZERO_EXTERN_C_END

#endif
