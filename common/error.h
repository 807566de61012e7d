/* Internal: how every libzero call records a failure.
 *
 * zero_fail() formats a message once and stores it both in the handle's own
 * buffer (if any) and in the calling thread's buffer (zero_last_error), then
 * returns the status so call sites read `return zero_fail(&h->err, ...)`. */
#ifndef ZERO_COMMON_ERROR_H
#define ZERO_COMMON_ERROR_H

#include <stdarg.h>
#include <zero/status.h>
#include <zero/log.h>

#define ZERO_ERRMSG_MAX 512

typedef struct zero_errbuf {
    char msg[ZERO_ERRMSG_MAX];
} zero_errbuf;

#if defined(__GNUC__)
#define ZERO_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ZERO_PRINTF(a, b)
#endif

/* Record the failure; `where` may be NULL (no handle yet). Returns `status`. */
zero_status zero_fail(zero_errbuf *where, zero_status status, const char *fmt, ...) ZERO_PRINTF(3, 4);
/* The same with a va_list (for helpers that add their own cleanup). The
 * arguments may point into any message buffer, zero_last_error() included. */
zero_status zero_failv(zero_errbuf *where, zero_status status, const char *fmt, va_list ap) ZERO_PRINTF(3, 0);

/* Copy a message already recorded on this thread into a handle's buffer,
 * optionally prefixed ("engine: "), when a lower layer failed. Returns status. */
zero_status zero_fail_forward(zero_errbuf *where, zero_status status, const char *prefix);

/* Emit a diagnostic through the installed handler, if it wants this level. */
void zero_log(zero_log_level level, const char *fmt, ...) ZERO_PRINTF(2, 3);

/* Propagate a non-OK status from an expression. */
#define ZERO_TRY(expr)                                                          \
    do {                                                                        \
        zero_status zero_try_status_ = (expr);                                  \
        if (zero_try_status_ != ZERO_OK) return zero_try_status_;               \
    } while (0)

#endif
