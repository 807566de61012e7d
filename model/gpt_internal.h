/* Internal to the model library: error recording shared by the CPU and CUDA paths. */
#ifndef ZERO_MODEL_GPT_INTERNAL_H
#define ZERO_MODEL_GPT_INTERNAL_H

#include "gpt.h"

#if defined(__GNUC__)
#define GPT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define GPT_PRINTF(a, b)
#endif

/* Propagate a non-OK status from an expression. */
#define GPT_TRY(expr)                                                           \
    do {                                                                        \
        zero_status gpt_try_status_ = (expr);                                   \
        if (gpt_try_status_ != ZERO_OK) return gpt_try_status_;                 \
    } while (0)

#ifdef __cplusplus
extern "C" {
#endif

/* Record a message for gpt_last_error() on this thread; returns `status`. */
zero_status gpt_fail(zero_status status, const char *fmt, ...) GPT_PRINTF(2, 3);

#ifdef __cplusplus
}
#endif

#endif
