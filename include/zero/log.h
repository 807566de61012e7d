/* Diagnostics. libzero never prints on its own: warnings (an unbound rank, a
 * re-recorded prefetch order, ...) go to the handler installed here, if any. */
#ifndef ZERO_LOG_H
#define ZERO_LOG_H

#include <zero/export.h>

ZERO_EXTERN_C_BEGIN

typedef enum zero_log_level {
    ZERO_LOG_ERROR = 0,
    ZERO_LOG_WARN = 1,
    ZERO_LOG_INFO = 2,
    ZERO_LOG_DEBUG = 3,
} zero_log_level;

/* Called with a complete line (no trailing newline); may be called from any
 * libzero thread, so the handler must be thread-safe. */
typedef void (*zero_log_fn)(zero_log_level level, const char *message, void *user);

/* Install a handler receiving messages at `max_level` or more severe.
 * NULL removes it (the default: silence). Process-wide. Call it before
 * starting work that logs from other threads (NVMe completion threads, ...):
 * the handler is read without a lock. */
ZERO_API void zero_set_log_handler(zero_log_fn fn, zero_log_level max_level, void *user);

/* A ready-made handler that writes "libzero[level]: message" to stderr. */
ZERO_API void zero_log_to_stderr(zero_log_level level, const char *message, void *user);

ZERO_EXTERN_C_END

#endif
