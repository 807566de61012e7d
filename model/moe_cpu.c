/* The mixture-of-experts FFN on the CPU (moe.h): routing, capacity,
 * dispatch / expert FFNs / combine over the ep comm, and the backward of all
 * of it. Buffers are sized at creation for the worst case (every choice
 * kept, every source filling every local expert's capacity), so a step
 * allocates nothing.
 *
 * Three row layouts (C floats a row):
 *   send layout    this rank's kept choices, by expert (global order, so by
 *                  owner rank), then by slot: the all-to-all-v's send side;
 *   source-major   what arrived: by source rank, then local expert, then slot;
 *   expert-major   by local expert, then source rank, then slot: each
 *                  expert's rows contiguous for its matmuls. */
#include "moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_cpu_ops.h"
#include "gpt_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

struct gpt_moe {
    gpt_moe_config cfg;
    int N, E, K, C, H, P, rank, El, cap, capr, nthreads;
    zero_comm *ep;
    float *probs;                 /* N x E softmax of the router */
    int32_t *sel_e, *sel_slot;    /* N x K */
    float *sel_w;                 /* N x K */
    float *first_frac;            /* E: f_e, the fraction of 1st choices (aux loss) */
    long dropped;
    int32_t *count;               /* E: rows this rank sends to each expert */
    size_t *row0;                 /* E: expert e's first row in the send layout */
    int32_t *rcount;              /* P x El: rows from source s for local expert el */
    size_t *erows, *efirst;       /* El: rows of local expert el, its first expert-major row */
    size_t *src_first;            /* P x El: first source-major row of (s, el) */
    size_t *sc, *sd, *rc, *rd;    /* P each: the all-to-all-v (elements) */
    size_t S, R;                  /* rows sent, rows received */
    size_t Smax, Rmax;
    float *sendbuf;               /* Smax x C: x rows; in backward d(expert output), then d(expert input) */
    float *ybuf;                  /* Smax x C: expert outputs back in the send layout (kept for backward) */
    float *recvbuf;               /* Rmax x C: source-major */
    float *xin;                   /* Rmax x C: expert-major inputs (kept) */
    float *fch, *fch_gelu;        /* Rmax x H (kept) */
    float *eout;                  /* Rmax x C: expert-major outputs, or their gradients */
    float *dfch;                  /* Rmax x H */
    float *dprobs;                /* N x E */
    float *dw;                    /* N x K: d(weight) of each choice */
    float *partials;              /* nthreads x max(H, C) */
    int have_forward;
    gpt_gemm_math math;           /* of the router's and experts' matmuls */
};

/* ------------------------------------------------------------ lifetime */

static int moe_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

zero_status gpt_moe_create(gpt_moe **out, const gpt_moe_config *cfg, int tokens, zero_comm *ep)
{
    if (!out || !cfg) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_moe_create: out or cfg is NULL");
    *out = NULL;
    int P = ep ? zero_comm_get_size(ep) : 1;
    if (P < 1) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_moe_create: the ep comm is not a live comm");
    if (cfg->d_model < 1 || cfg->d_ff < 1 || tokens < 1)
        return gpt_fail(ZERO_CONFIG, "gpt_moe_create: d_model %d, d_ff %d and tokens %d must be >= 1", cfg->d_model,
                        cfg->d_ff, tokens);
    if (cfg->experts < 1 || cfg->experts % P)
        return gpt_fail(ZERO_CONFIG, "gpt_moe_create: experts %d must be >= 1 and a multiple of the ep size %d",
                        cfg->experts, P);
    if (cfg->top_k < 1 || cfg->top_k > cfg->experts)
        return gpt_fail(ZERO_CONFIG, "gpt_moe_create: top_k %d must be in 1..experts (%d)", cfg->top_k,
                        cfg->experts);
    if (!(cfg->capacity_factor == cfg->capacity_factor) || !(cfg->aux_loss_coef >= 0))
        return gpt_fail(ZERO_CONFIG, "gpt_moe_create: capacity_factor %g / aux_loss_coef %g is invalid",
                        (double)cfg->capacity_factor, (double)cfg->aux_loss_coef);
    gpt_moe *m = calloc(1, sizeof *m);
    if (!m) return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_moe_create: out of memory");
    m->cfg = *cfg;
    m->N = tokens, m->E = cfg->experts, m->K = cfg->top_k, m->C = cfg->d_model, m->H = cfg->d_ff;
    m->P = P, m->rank = ep ? zero_comm_get_rank(ep) : 0, m->El = m->E / P, m->ep = ep;
    m->nthreads = moe_threads();
    /* ceil(cf k N / E) in double: exact for any size this layer can hold */
    double want = cfg->capacity_factor > 0 ? ceil((double)cfg->capacity_factor * m->K * m->N / m->E) : m->N;
    m->cap = want < 1 ? 1 : want > (double)INT32_MAX ? INT32_MAX : (int)want;
    m->capr = m->cap < m->N ? m->cap : m->N; /* a token picks an expert at most once */
    m->Smax = (size_t)m->N * m->K;
    m->Rmax = (size_t)m->El * P * m->capr;
    size_t N = m->N, E = m->E, K = m->K, C = m->C, H = m->H, El = m->El, Pz = P;
    size_t wide = H > C ? H : C;
    /* one block for everything: floats first, then the index arrays */
    size_t floats = N * E * 2 + N * K * 2 + E + m->Smax * C * 2 + m->Rmax * (3 * C + 3 * H) +
                    (size_t)m->nthreads * (wide > E ? wide : E);
    size_t idx32 = N * K * 2 + E + Pz * El;
    size_t idxz = E + El * 2 + Pz * El + Pz * 4;
    char *mem = calloc(1, floats * 4 + idx32 * 4 + idxz * sizeof(size_t) + 64);
    if (!mem) {
        free(m);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_moe_create: no memory for %zu floats of buffers", floats);
    }
    float *f = (float *)mem;
    m->probs = f, f += N * E;
    m->dprobs = f, f += N * E;
    m->sel_w = f, f += N * K;
    m->dw = f, f += N * K;
    m->first_frac = f, f += E;
    m->sendbuf = f, f += m->Smax * C;
    m->ybuf = f, f += m->Smax * C;
    m->recvbuf = f, f += m->Rmax * C;
    m->xin = f, f += m->Rmax * C;
    m->eout = f, f += m->Rmax * C;
    m->fch = f, f += m->Rmax * H;
    m->fch_gelu = f, f += m->Rmax * H;
    m->dfch = f, f += m->Rmax * H;
    m->partials = f, f += (size_t)m->nthreads * (wide > E ? wide : E);
    int32_t *i = (int32_t *)f;
    m->sel_e = i, i += N * K;
    m->sel_slot = i, i += N * K;
    m->count = i, i += E;
    m->rcount = i, i += Pz * El;
    size_t *z = (size_t *)(((uintptr_t)i + 15) & ~(uintptr_t)15);
    m->row0 = z, z += E;
    m->erows = z, z += El;
    m->efirst = z, z += El;
    m->src_first = z, z += Pz * El;
    m->sc = z, z += Pz;
    m->sd = z, z += Pz;
    m->rc = z, z += Pz;
    m->rd = z, z += Pz;
    zero_status st = gpt_gemm_init(); /* also makes OpenBLAS single-threaded */
    if (st != ZERO_OK) {
        gpt_moe_destroy(m);
        return st;
    }
    *out = m;
    return ZERO_OK;
}

void gpt_moe_destroy(gpt_moe *m)
{
    if (!m) return;
    free(m->probs);
    free(m);
}

int gpt_moe_capacity(const gpt_moe *m) { return m ? m->cap : 0; }

void gpt_moe_set_matmul_bf16(gpt_moe *m, int bf16)
{
    if (m) m->math = bf16 ? GPT_GEMM_BF16 : GPT_GEMM_F32;
}

void gpt_moe_local_experts(const gpt_moe *m, int *first, int *count)
{
    if (first) *first = m ? m->rank * m->El : 0;
    if (count) *count = m ? m->El : 0;
}

void gpt_moe_get_routing(const gpt_moe *m, gpt_moe_routing *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!m) return;
    out->expert = m->sel_e;
    out->weight = m->sel_w;
    out->slot = m->sel_slot;
    out->dropped = m->dropped;
}

/* ------------------------------------------------------------ exchanges */

/* One all-to-all-v of rows (C floats each) over ep; a plain copy at P = 1. */
static zero_status exchange(gpt_moe *m, const float *send, const size_t *sc, const size_t *sd, float *recv,
                            const size_t *rc, const size_t *rd, const char *what)
{
    if (m->P == 1) {
        if (sc[0]) memcpy(recv + rd[0], send + sd[0], sc[0] * sizeof(float));
        return ZERO_OK;
    }
    zero_status st = zero_alltoallv(m->ep, send, sc, sd, recv, rc, rd, ZERO_F32);
    if (st != ZERO_OK) return gpt_fail(st, "MoE %s over the ep group: %s", what, zero_comm_last_error(m->ep));
    return ZERO_OK;
}

/* source-major <-> expert-major (to_expert: recvbuf -> dst, else src -> recvbuf) */
static void permute(gpt_moe *m, float *expert_major, int to_expert)
{
    size_t C = (size_t)m->C;
    for (int s = 0; s < m->P; s++)
        for (int el = 0; el < m->El; el++) {
            size_t n = (size_t)m->rcount[s * m->El + el];
            if (!n) continue;
            float *src_major = m->recvbuf + m->src_first[s * m->El + el] * C;
            size_t at = m->efirst[el];
            for (int q = 0; q < s; q++) at += (size_t)m->rcount[q * m->El + el];
            float *em = expert_major + at * C;
            if (to_expert)
                memcpy(em, src_major, n * C * sizeof(float));
            else
                memcpy(src_major, em, n * C * sizeof(float));
        }
}

/* ------------------------------------------------------------ routing */

static void softmax_rows(float *p, int N, int E)
{
    for (int n = 0; n < N; n++) {
        float *row = p + (size_t)n * E, mx = row[0], sum = 0;
        for (int e = 1; e < E; e++) mx = row[e] > mx ? row[e] : mx;
        for (int e = 0; e < E; e++) sum += row[e] = expf(row[e] - mx);
        float inv = 1.0f / sum;
        for (int e = 0; e < E; e++) row[e] *= inv;
    }
}

/* top-k, weights, slots by priority (choice rank, then token), the send
 * layout and the aux loss's statistics. */
static float route(gpt_moe *m)
{
    const int N = m->N, E = m->E, K = m->K;
    for (int n = 0; n < N; n++) {
        const float *p = m->probs + (size_t)n * E;
        float total = 0;
        for (int i = 0; i < K; i++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < i; j++) taken |= m->sel_e[n * K + j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e; /* ties: the lower expert */
            }
            m->sel_e[n * K + i] = best;
            total += p[best];
        }
        for (int i = 0; i < K; i++) {
            float pe = p[m->sel_e[n * K + i]];
            m->sel_w[n * K + i] = K > 1 ? pe / total : pe;
        }
    }
    memset(m->count, 0, sizeof(int32_t) * E);
    m->dropped = 0;
    for (int i = 0; i < K; i++)
        for (int n = 0; n < N; n++) {
            int e = m->sel_e[n * K + i];
            if (m->count[e] < m->cap)
                m->sel_slot[n * K + i] = m->count[e]++;
            else
                m->sel_slot[n * K + i] = -1, m->dropped++;
        }
    /* aux = E sum_e f_e P_e, f_e from 1st choices before dropping */
    memset(m->first_frac, 0, sizeof(float) * E);
    for (int n = 0; n < N; n++) m->first_frac[m->sel_e[n * K]] += 1.0f / (float)N;
    double aux = 0;
    for (int e = 0; e < E; e++) {
        double pe = 0;
        for (int n = 0; n < N; n++) pe += m->probs[(size_t)n * E + e];
        aux += (double)m->first_frac[e] * (pe / N);
    }
    return (float)(aux * E);
}

/* Counts of the dispatch (send layout, by owner) and, after the count
 * exchange, of the receive side. */
static zero_status plan_exchange(gpt_moe *m)
{
    const int E = m->E, El = m->El, P = m->P;
    const size_t C = (size_t)m->C;
    size_t row = 0;
    for (int e = 0; e < E; e++) m->row0[e] = row, row += (size_t)m->count[e];
    m->S = row;
    for (int j = 0; j < P; j++) {
        size_t rows = 0;
        for (int el = 0; el < El; el++) rows += (size_t)m->count[j * El + el];
        m->sc[j] = rows * C;
        m->sd[j] = m->row0[j * El] * C;
    }
    if (P == 1) {
        memcpy(m->rcount, m->count, sizeof(int32_t) * El);
    } else {
        zero_status st = zero_alltoall(m->ep, m->count, m->rcount, (size_t)El, ZERO_I32);
        if (st != ZERO_OK)
            return gpt_fail(st, "MoE dispatch (row counts) over the ep group: %s", zero_comm_last_error(m->ep));
    }
    size_t r = 0;
    for (int s = 0; s < P; s++) {
        m->rd[s] = r * C;
        for (int el = 0; el < El; el++) {
            int32_t n = m->rcount[s * El + el];
            if (n < 0 || n > m->capr)
                return gpt_fail(ZERO_MISMATCH,
                                "MoE dispatch: ep rank %d sends %d rows for expert %d, more than the capacity %d: "
                                "the ranks run different MoE configurations or token counts",
                                s, (int)n, m->rank * El + el, m->capr);
            m->src_first[s * El + el] = r;
            r += (size_t)n;
        }
        m->rc[s] = r * C - m->rd[s];
    }
    m->R = r;
    size_t first = 0;
    for (int el = 0; el < El; el++) {
        m->erows[el] = 0;
        for (int s = 0; s < P; s++) m->erows[el] += (size_t)m->rcount[s * El + el];
        m->efirst[el] = first;
        first += m->erows[el];
    }
    return ZERO_OK;
}

/* ------------------------------------------------------------ forward */

zero_status gpt_moe_forward(gpt_moe *m, const float *x, const float *init, float *out, const gpt_moe_params *p,
                            float *aux)
{
    if (!m || !x || !out || !p || !p->gate_w || !p->fc_w || !p->fc_b || !p->proj_w || !p->proj_b)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_moe_forward: a NULL layer, buffer or parameter");
    const int N = m->N, E = m->E, K = m->K, C = m->C, H = m->H;
    m->have_forward = 0;
    gpt_matmul_forward(m->math, m->probs, NULL, x, p->gate_w, NULL, N, C, E);
    softmax_rows(m->probs, N, E);
    float a = route(m);
    if (aux) *aux = a;
    GPT_TRY(plan_exchange(m));
    for (int n = 0; n < N; n++)
        for (int i = 0; i < K; i++) {
            int e = m->sel_e[n * K + i], slot = m->sel_slot[n * K + i];
            if (slot >= 0)
                memcpy(m->sendbuf + (m->row0[e] + (size_t)slot) * C, x + (size_t)n * C, sizeof(float) * C);
        }
    GPT_TRY(exchange(m, m->sendbuf, m->sc, m->sd, m->recvbuf, m->rc, m->rd, "dispatch"));
    permute(m, m->xin, 1);
    for (int el = 0; el < m->El; el++) {
        int r = (int)m->erows[el];
        if (!r) continue;
        size_t f = m->efirst[el];
        gpt_matmul_forward(m->math, m->fch + f * H, NULL, m->xin + f * C, p->fc_w + (size_t)el * H * C,
                           p->fc_b + (size_t)el * H, r, C, H);
        gpt_gelu_forward(m->fch_gelu + f * H, m->fch + f * H, (size_t)r * H);
        gpt_matmul_forward(m->math, m->eout + f * C, NULL, m->fch_gelu + f * H, p->proj_w + (size_t)el * C * H,
                           p->proj_b + (size_t)el * C, r, H, C);
    }
    permute(m, m->eout, 0);
    GPT_TRY(exchange(m, m->recvbuf, m->rc, m->rd, m->ybuf, m->sc, m->sd, "combine"));
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        if (init && init != out)
            memcpy(o, init + (size_t)n * C, sizeof(float) * C);
        else if (!init)
            memset(o, 0, sizeof(float) * C);
        for (int i = 0; i < K; i++) {
            int e = m->sel_e[n * K + i], slot = m->sel_slot[n * K + i];
            if (slot < 0) continue;
            const float *y = m->ybuf + (m->row0[e] + (size_t)slot) * C;
            float w = m->sel_w[n * K + i];
            for (int c = 0; c < C; c++) o[c] += w * y[c];
        }
    }
    m->have_forward = 1;
    return ZERO_OK;
}

/* ------------------------------------------------------------ backward */

zero_status gpt_moe_backward(gpt_moe *m, float dloss, const float *x, const float *dout, float *dx,
                             const gpt_moe_params *p, gpt_moe_params *g)
{
    if (!m || !x || !dout || !dx || !p || !g || !g->gate_w || !g->fc_w || !g->fc_b || !g->proj_w || !g->proj_b)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_moe_backward: a NULL layer, buffer or gradient");
    if (!m->have_forward)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_moe_backward: no completed forward to differentiate");
    m->have_forward = 0;
    const int N = m->N, E = m->E, K = m->K, C = m->C, H = m->H, nt = m->nthreads;

    /* out[n] += w y: dY = w dout[n] (send layout), dw = <dout[n], y> */
    for (int n = 0; n < N; n++)
        for (int i = 0; i < K; i++) {
            int e = m->sel_e[n * K + i], slot = m->sel_slot[n * K + i];
            m->dw[n * K + i] = 0;
            if (slot < 0) continue;
            size_t row = m->row0[e] + (size_t)slot;
            const float *d = dout + (size_t)n * C, *y = m->ybuf + row * C;
            float *dy = m->sendbuf + row * C, w = m->sel_w[n * K + i], s = 0;
            for (int c = 0; c < C; c++) dy[c] = w * d[c], s += d[c] * y[c];
            m->dw[n * K + i] = s;
        }
    GPT_TRY(exchange(m, m->sendbuf, m->sc, m->sd, m->recvbuf, m->rc, m->rd, "dispatch (backward)"));
    permute(m, m->eout, 1);
    for (int el = 0; el < m->El; el++) {
        int r = (int)m->erows[el];
        if (!r) continue;
        size_t f = m->efirst[el];
        gpt_matmul_backward(m->math, m->dfch + f * H, g->proj_w + (size_t)el * C * H, g->proj_b + (size_t)el * C,
                            m->eout + f * C, m->fch_gelu + f * H, p->proj_w + (size_t)el * C * H, r, H, C, 0,
                            m->partials, nt);
        gpt_gelu_backward(m->dfch + f * H, m->fch + f * H, m->dfch + f * H, (size_t)r * H);
        /* d(expert input) overwrites d(expert output), read by now */
        gpt_matmul_backward(m->math, m->eout + f * C, g->fc_w + (size_t)el * H * C, g->fc_b + (size_t)el * H,
                            m->dfch + f * H, m->xin + f * C, p->fc_w + (size_t)el * H * C, r, C, H, 0, m->partials, nt);
    }
    permute(m, m->eout, 0);
    GPT_TRY(exchange(m, m->recvbuf, m->rc, m->rd, m->sendbuf, m->sc, m->sd, "combine (backward)"));
    for (int n = 0; n < N; n++) {
        float *d = dx + (size_t)n * C;
        memset(d, 0, sizeof(float) * C);
        for (int i = 0; i < K; i++) {
            int e = m->sel_e[n * K + i], slot = m->sel_slot[n * K + i];
            if (slot < 0) continue;
            const float *r = m->sendbuf + (m->row0[e] + (size_t)slot) * C;
            for (int c = 0; c < C; c++) d[c] += r[c];
        }
    }

    /* the router: d(probs) from the weights and the aux loss, then softmax and the gate matmul */
    float aux_scale = dloss * m->cfg.aux_loss_coef * (float)E / (float)N;
    for (int n = 0; n < N; n++) {
        float *dp = m->dprobs + (size_t)n * E;
        const float *pr = m->probs + (size_t)n * E;
        for (int e = 0; e < E; e++) dp[e] = aux_scale * m->first_frac[e];
        if (K == 1) {
            dp[m->sel_e[n]] += m->dw[n];
        } else {
            /* w_i = p_i / S over the chosen: dp_j = (dw_j - sum_i dw_i w_i) / S */
            float S = 0, dot = 0;
            for (int i = 0; i < K; i++) S += pr[m->sel_e[n * K + i]];
            for (int i = 0; i < K; i++) dot += m->dw[n * K + i] * m->sel_w[n * K + i];
            for (int i = 0; i < K; i++) dp[m->sel_e[n * K + i]] += (m->dw[n * K + i] - dot) / S;
        }
        float s = 0;
        for (int e = 0; e < E; e++) s += pr[e] * dp[e];
        for (int e = 0; e < E; e++) dp[e] = pr[e] * (dp[e] - s);
    }
    gpt_matmul_backward(m->math, dx, g->gate_w, NULL, m->dprobs, x, p->gate_w, N, C, E, 1, m->partials, nt);
    return ZERO_OK;
}
