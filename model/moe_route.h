/* Internal to the model library: the host-side bookkeeping of the MoE layer
 * (moe.h) that both backends share, so the CPU (moe_cpu.c) and the CUDA
 * path (moe_cuda.cu) give the same choices the same slots and exchange the
 * same rows: the config check, the capacity, slot assignment by priority,
 * the aux loss's first-choice fractions, and the all-to-all-v plan (send
 * layout, receive layout, expert-major layout). Everything here is host
 * memory and plain integers; the count exchange itself is the caller's
 * (host buffers on the CPU, device buffers on NCCL/STAGED comms). */
#ifndef ZERO_MODEL_MOE_ROUTE_H
#define ZERO_MODEL_MOE_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "moe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_plan {
    int N, E, K, P, rank, El;
    int cap;                      /* slots per expert (capacity rule) */
    int capr;                     /* min(cap, N): most rows one source sends one expert */
    size_t C;                     /* floats a row */
    long dropped;                 /* choices dropped by the last moe_assign_slots */
    int32_t *count;               /* E: rows this rank sends to each expert */
    size_t *row0;                 /* E: expert e's first row in the send layout */
    int32_t *rcount;              /* P x El: rows from source s for local expert el (the caller fills it) */
    size_t *erows, *efirst;       /* El: rows of local expert el, its first expert-major row */
    size_t *src_first;            /* P x El: first source-major row of (s, el) */
    size_t *em_first;             /* P x El: first expert-major row of (s, el) */
    size_t *sc, *sd, *rc, *rd;    /* P each: the all-to-all-v (elements) */
    size_t S, R;                  /* rows sent, rows received */
    size_t Smax, Rmax;            /* their bounds: N K, El P capr */
} moe_plan;

/* Checks cfg for `tokens` rows on P ep ranks; `who` names the caller in the message. */
zero_status moe_check_config(const gpt_moe_config *cfg, int tokens, int P, const char *who);
/* Fills the sizes, the capacity and the buffer bounds (Smax, Rmax) only:
 * no allocation, the index arrays stay NULL (what the byte counts need). */
void moe_plan_size(moe_plan *pl, const gpt_moe_config *cfg, int tokens, int P, int rank);
/* Fills the sizes and the capacity and allocates the index arrays (free
 * with moe_plan_free; a zeroed plan may be freed). cfg must have passed
 * moe_check_config. */
zero_status moe_plan_init(moe_plan *pl, const gpt_moe_config *cfg, int tokens, int P, int rank);
void moe_plan_free(moe_plan *pl);

/* Slots by priority: every token's 1st choice in token order, then every
 * 2nd, ...; a choice whose expert is full gets -1 (dropped). sel_e and
 * sel_slot are N x K (choice-major within a token). Fills pl->count and
 * pl->dropped. */
void moe_assign_slots(moe_plan *pl, const int32_t *sel_e, int32_t *sel_slot);
/* f_e: the fraction of tokens whose 1st choice is e (before dropping), E floats. */
void moe_first_fractions(const moe_plan *pl, const int32_t *sel_e, float *first_frac);
/* The send side from pl->count: row0, S, sc, sd. */
void moe_plan_sends(moe_plan *pl);
/* The receive side once pl->rcount holds the exchanged counts: checks them
 * (ZERO_MISMATCH naming the source when over the capacity), then rc, rd,
 * src_first, em_first, erows, efirst, R. */
zero_status moe_plan_receives(moe_plan *pl);

#ifdef __cplusplus
}
#endif

#endif
