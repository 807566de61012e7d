/* The MoE layer's host-side routing bookkeeping, shared by both backends (moe_route.h). */
#include "moe_route.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"

zero_status moe_check_config(const gpt_moe_config *cfg, int tokens, int P, const char *who)
{
    if (P < 1) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: the ep comm is not a live comm", who);
    if (cfg->d_model < 1 || cfg->d_ff < 1 || tokens < 1)
        return gpt_fail(ZERO_CONFIG, "%s: d_model %d, d_ff %d and tokens %d must be >= 1", who, cfg->d_model,
                        cfg->d_ff, tokens);
    if (cfg->experts < 1 || cfg->experts % P)
        return gpt_fail(ZERO_CONFIG, "%s: experts %d must be >= 1 and a multiple of the ep size %d", who,
                        cfg->experts, P);
    if (cfg->top_k < 1 || cfg->top_k > cfg->experts)
        return gpt_fail(ZERO_CONFIG, "%s: top_k %d must be in 1..experts (%d)", who, cfg->top_k, cfg->experts);
    if (!(cfg->capacity_factor == cfg->capacity_factor) || !(cfg->aux_loss_coef >= 0))
        return gpt_fail(ZERO_CONFIG, "%s: capacity_factor %g / aux_loss_coef %g is invalid", who,
                        (double)cfg->capacity_factor, (double)cfg->aux_loss_coef);
    return ZERO_OK;
}

void moe_plan_size(moe_plan *pl, const gpt_moe_config *cfg, int tokens, int P, int rank)
{
    memset(pl, 0, sizeof *pl);
    pl->N = tokens, pl->E = cfg->experts, pl->K = cfg->top_k, pl->P = P, pl->rank = rank;
    pl->El = pl->E / P, pl->C = (size_t)cfg->d_model;
    /* ceil(cf k N / E) in double: exact for any size this layer can hold */
    double want = cfg->capacity_factor > 0 ? ceil((double)cfg->capacity_factor * pl->K * pl->N / pl->E) : pl->N;
    pl->cap = want < 1 ? 1 : want > (double)INT32_MAX ? INT32_MAX : (int)want;
    pl->capr = pl->cap < pl->N ? pl->cap : pl->N; /* a token picks an expert at most once */
    pl->Smax = (size_t)pl->N * pl->K;
    pl->Rmax = (size_t)pl->El * P * pl->capr;
}

zero_status moe_plan_init(moe_plan *pl, const gpt_moe_config *cfg, int tokens, int P, int rank)
{
    moe_plan_size(pl, cfg, tokens, P, rank);
    size_t E = pl->E, El = pl->El, Pz = P;
    pl->count = calloc(E + Pz * El, sizeof(int32_t));
    size_t *z = calloc(E + El * 2 + Pz * El * 2 + Pz * 4, sizeof(size_t));
    if (!pl->count || !z) {
        free(z);
        moe_plan_free(pl);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "MoE: no memory for the routing plan (%d experts, ep %d)", pl->E, P);
    }
    pl->rcount = pl->count + E;
    pl->row0 = z, z += E;
    pl->erows = z, z += El;
    pl->efirst = z, z += El;
    pl->src_first = z, z += Pz * El;
    pl->em_first = z, z += Pz * El;
    pl->sc = z, z += Pz;
    pl->sd = z, z += Pz;
    pl->rc = z, z += Pz;
    pl->rd = z;
    return ZERO_OK;
}

void moe_plan_free(moe_plan *pl)
{
    if (!pl) return;
    free(pl->count);
    free(pl->row0);
    pl->count = pl->rcount = NULL;
    pl->row0 = NULL;
}

void moe_assign_slots(moe_plan *pl, const int32_t *sel_e, int32_t *sel_slot)
{
    const int N = pl->N, K = pl->K;
    memset(pl->count, 0, sizeof(int32_t) * pl->E);
    pl->dropped = 0;
    for (int i = 0; i < K; i++)
        for (int n = 0; n < N; n++) {
            int e = sel_e[n * K + i];
            if (pl->count[e] < pl->cap)
                sel_slot[n * K + i] = pl->count[e]++;
            else
                sel_slot[n * K + i] = -1, pl->dropped++;
        }
}

void moe_first_fractions(const moe_plan *pl, const int32_t *sel_e, float *first_frac)
{
    memset(first_frac, 0, sizeof(float) * pl->E);
    for (int n = 0; n < pl->N; n++) first_frac[sel_e[n * pl->K]] += 1.0f / (float)pl->N;
}

void moe_plan_sends(moe_plan *pl)
{
    size_t row = 0;
    for (int e = 0; e < pl->E; e++) pl->row0[e] = row, row += (size_t)pl->count[e];
    pl->S = row;
    for (int j = 0; j < pl->P; j++) {
        size_t rows = 0;
        for (int el = 0; el < pl->El; el++) rows += (size_t)pl->count[j * pl->El + el];
        pl->sc[j] = rows * pl->C;
        pl->sd[j] = pl->row0[j * pl->El] * pl->C;
    }
}

zero_status moe_plan_receives(moe_plan *pl)
{
    const int El = pl->El, P = pl->P;
    size_t r = 0;
    for (int s = 0; s < P; s++) {
        pl->rd[s] = r * pl->C;
        for (int el = 0; el < El; el++) {
            int32_t n = pl->rcount[s * El + el];
            if (n < 0 || n > pl->capr)
                return gpt_fail(ZERO_MISMATCH,
                                "MoE dispatch: ep rank %d sends %d rows for expert %d, more than the capacity %d: "
                                "the ranks run different MoE configurations or token counts",
                                s, (int)n, pl->rank * El + el, pl->capr);
            pl->src_first[s * El + el] = r;
            r += (size_t)n;
        }
        pl->rc[s] = r * pl->C - pl->rd[s];
    }
    pl->R = r;
    size_t first = 0;
    for (int el = 0; el < El; el++) {
        pl->efirst[el] = first;
        pl->erows[el] = 0;
        for (int s = 0; s < P; s++) {
            pl->em_first[s * El + el] = first + pl->erows[el];
            pl->erows[el] += (size_t)pl->rcount[s * El + el];
        }
        first += pl->erows[el];
    }
    return ZERO_OK;
}
