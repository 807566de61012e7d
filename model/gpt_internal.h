/* Internal to the model library: error recording shared by the CPU and CUDA paths. */
#ifndef ZERO_MODEL_GPT_INTERNAL_H
#define ZERO_MODEL_GPT_INTERNAL_H

#include "gpt.h"
#include "moe.h"

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

/* The MoE layer of every block of an MoE GPT (cfg->moe_experts > 0): experts
 * of width 4 d_model; the one config the CPU and CUDA workspaces and their
 * activation reports build their layers from. */
static inline gpt_moe_config gpt_moe_config_of(const gpt_config *cfg)
{
    gpt_moe_config mc = {cfg->d_model, 4 * cfg->d_model, cfg->moe_experts, cfg->moe_top_k, cfg->moe_capacity_factor,
                         cfg->moe_aux_loss_coef};
    return mc;
}

#ifdef __cplusplus
}
#endif

#endif
