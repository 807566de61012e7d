#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char thread_last_error[ZERO_ERRMSG_MAX];

/* Callers often pass the previous message as an argument ("nvme %s: %s",
 * path, zero_last_error()), so the arguments may point into the buffers
 * written here: format into a temporary first, then copy. */
zero_status zero_failv(zero_errbuf *where, zero_status status, const char *fmt, va_list ap)
{
    char tmp[ZERO_ERRMSG_MAX];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(thread_last_error, tmp, sizeof tmp);
    if (where) memcpy(where->msg, tmp, sizeof where->msg);
    return status;
}

zero_status zero_fail(zero_errbuf *where, zero_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zero_failv(where, status, fmt, ap);
    va_end(ap);
    return status;
}

zero_status zero_fail_forward(zero_errbuf *where, zero_status status, const char *prefix)
{
    if (prefix && *prefix) {
        char tmp[ZERO_ERRMSG_MAX];
        snprintf(tmp, sizeof tmp, "%s%s", prefix, thread_last_error);
        memcpy(thread_last_error, tmp, sizeof tmp);
    }
    if (where) memcpy(where->msg, thread_last_error, sizeof where->msg);
    return status;
}

const char *zero_last_error(void)
{
    return thread_last_error;
}

/* ---------------------------------------------------------------- logging */

static zero_log_fn log_handler;
static zero_log_level log_max_level = ZERO_LOG_WARN;
static void *log_user;

void zero_set_log_handler(zero_log_fn fn, zero_log_level max_level, void *user)
{
    log_handler = fn;
    log_max_level = max_level;
    log_user = user;
}

void zero_log_to_stderr(zero_log_level level, const char *message, void *user)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    (void)user;
    fprintf(stderr, "libzero[%s]: %s\n", (unsigned)level < 4 ? names[level] : "?", message);
}

void zero_log(zero_log_level level, const char *fmt, ...)
{
    zero_log_fn fn = log_handler;
    if (!fn || level > log_max_level) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fn(level, line, log_user);
}
