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

#include "gpt_acts.h"
#include "gpt_cpu_ops.h"
#include "gpt_internal.h"
#include "moe_cuda.h"
#include "moe_route.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define MOE_CPU_ALIGN 64 /* cache lines, as the GPT's activation layout */

struct gpt_moe {
    gpt_moe_config cfg;
    int N, E, K, C, H, P, rank, El, nthreads;
    zero_comm *ep;
    moe_plan pl;                  /* capacity, slots' counts, the exchanges' layouts (moe_route.h) */
    moe_cuda *dev;                /* non-NULL: a CUDA layer (gpt_moe_create_cuda); the buffers below but
                                     sel_* are then unused */
    void *block;                  /* the one host allocation the arrays below live in */
    float *probs;                 /* N x E softmax of the router */
    int32_t *sel_e, *sel_slot;    /* N x K (host memory on both backends) */
    float *sel_w;                 /* N x K */
    float *first_frac;            /* E: f_e, the fraction of 1st choices (aux loss) */
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
    size_t bytes;                 /* of the buffers: the host block (CPU) or the device allocation (CUDA) */
    float *dyout;                 /* split backward (CPU): Rmax x C, d(expert output) expert-major, kept from B to W */
    size_t stash_bytes;           /* the split backward's stash (CPU: dyout; CUDA: the backend's), 0 before */
    int have_forward;
    int w_due;                    /* a backward_input ran and its backward_weight has not */
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

/* The fields both backends have: the shape, the plan and the host routing arrays. */
static zero_status moe_alloc_common(gpt_moe **out, const gpt_moe_config *cfg, int tokens, zero_comm *ep,
                                    const char *who)
{
    if (!out || !cfg) return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: out or cfg is NULL", who);
    *out = NULL;
    int P = ep ? zero_comm_get_size(ep) : 1;
    GPT_TRY(moe_check_config(cfg, tokens, P, who));
    gpt_moe *m = calloc(1, sizeof *m);
    if (!m) return gpt_fail(ZERO_OUT_OF_MEMORY, "%s: out of memory", who);
    m->cfg = *cfg;
    m->N = tokens, m->E = cfg->experts, m->K = cfg->top_k, m->C = cfg->d_model, m->H = cfg->d_ff;
    m->P = P, m->rank = ep ? zero_comm_get_rank(ep) : 0, m->El = m->E / P, m->ep = ep;
    zero_status st = moe_plan_init(&m->pl, cfg, tokens, P, m->rank);
    if (st != ZERO_OK) {
        free(m);
        return st;
    }
    *out = m;
    return ZERO_OK;
}

/* THE buffer layout of a CPU layer, one walk for counting (m NULL) and
 * carving (c's base set), so the bytes gpt_moe_bytes_for reports and the
 * bytes gpt_moe_create allocates cannot disagree. Every buffer rounded up
 * to 64 bytes (docs/moe.md writes the sum out). */
static void cpu_layout(gpt_moe *m, const moe_plan *pl, size_t H, int nthreads, gpt_carver *c)
{
    const size_t N = (size_t)pl->N, E = (size_t)pl->E, K = (size_t)pl->K, C = pl->C, f = sizeof(float);
    const size_t wide = H > C ? H : C, part = (size_t)nthreads * (wide > E ? wide : E);
    const int cat = GPT_ACT_SCRATCH; /* one region: only the carver's offset is read */
    float *fl[] = {
        gpt_carve(c, cat, N * E, f), gpt_carve(c, cat, N * E, f),             /* probs, dprobs */
        gpt_carve(c, cat, N * K, f), gpt_carve(c, cat, N * K, f),             /* sel_w, dw */
        gpt_carve(c, cat, E, f),                                              /* first_frac */
        gpt_carve(c, cat, pl->Smax * C, f), gpt_carve(c, cat, pl->Smax * C, f), /* sendbuf, ybuf */
        gpt_carve(c, cat, pl->Rmax * C, f), gpt_carve(c, cat, pl->Rmax * C, f), /* recvbuf, xin */
        gpt_carve(c, cat, pl->Rmax * C, f),                                   /* eout */
        gpt_carve(c, cat, pl->Rmax * H, f), gpt_carve(c, cat, pl->Rmax * H, f), /* fch, fch_gelu */
        gpt_carve(c, cat, pl->Rmax * H, f),                                   /* dfch */
        gpt_carve(c, cat, part, f),                                           /* partials */
    };
    int32_t *sel_e = gpt_carve(c, cat, N * K, sizeof(int32_t)), *sel_slot = gpt_carve(c, cat, N * K, sizeof(int32_t));
    if (!m) return;
    m->probs = fl[0], m->dprobs = fl[1], m->sel_w = fl[2], m->dw = fl[3], m->first_frac = fl[4];
    m->sendbuf = fl[5], m->ybuf = fl[6], m->recvbuf = fl[7], m->xin = fl[8], m->eout = fl[9];
    m->fch = fl[10], m->fch_gelu = fl[11], m->dfch = fl[12], m->partials = fl[13];
    m->sel_e = sel_e, m->sel_slot = sel_slot;
}

static size_t cpu_bytes(const moe_plan *pl, size_t H, int nthreads)
{
    gpt_carver c;
    gpt_carver_init(&c, MOE_CPU_ALIGN, NULL, NULL);
    cpu_layout(NULL, pl, H, nthreads, &c);
    return c.off[0];
}

zero_status gpt_moe_bytes_for(const gpt_moe_config *cfg, int tokens, int ep_size, int cuda, size_t *bytes)
{
    if (!bytes) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_moe_bytes_for: bytes is NULL");
    *bytes = 0;
    if (!cfg) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_moe_bytes_for: cfg is NULL");
    GPT_TRY(moe_check_config(cfg, tokens, ep_size, "gpt_moe_bytes_for"));
    moe_plan pl;
    moe_plan_size(&pl, cfg, tokens, ep_size, 0); /* every rank holds the same sizes */
    if (cuda) return moe_cuda_bytes(&pl, cfg->d_ff, bytes);
    *bytes = cpu_bytes(&pl, (size_t)cfg->d_ff, moe_threads());
    return ZERO_OK;
}

size_t gpt_moe_bytes(const gpt_moe *m) { return m ? m->bytes : 0; }

zero_status gpt_moe_create(gpt_moe **out, const gpt_moe_config *cfg, int tokens, zero_comm *ep)
{
    GPT_TRY(moe_alloc_common(out, cfg, tokens, ep, "gpt_moe_create"));
    gpt_moe *m = *out;
    *out = NULL;
    m->nthreads = moe_threads();
    size_t bytes = cpu_bytes(&m->pl, (size_t)m->H, m->nthreads); /* a multiple of the alignment */
    char *mem = aligned_alloc(MOE_CPU_ALIGN, bytes);
    if (!mem) {
        gpt_moe_destroy(m);
        return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_moe_create: no memory for %zu bytes of buffers", bytes);
    }
    memset(mem, 0, bytes);
    m->block = mem;
    m->bytes = bytes;
    gpt_carver c;
    gpt_carver_init(&c, MOE_CPU_ALIGN, mem, NULL);
    cpu_layout(m, &m->pl, (size_t)m->H, m->nthreads, &c);
    zero_status st = gpt_gemm_init(); /* also makes OpenBLAS single-threaded */
    if (st != ZERO_OK) {
        gpt_moe_destroy(m);
        return st;
    }
    *out = m;
    return ZERO_OK;
}

zero_status gpt_moe_create_cuda(gpt_moe **out, const gpt_moe_config *cfg, int tokens, zero_comm *ep,
                                void *cuda_stream)
{
    GPT_TRY(moe_alloc_common(out, cfg, tokens, ep, "gpt_moe_create_cuda"));
    gpt_moe *m = *out;
    *out = NULL;
    size_t NK = (size_t)m->N * m->K;
    /* host: sel_w, sel_e, sel_slot (the routing the CUDA forward copies back) */
    char *mem = calloc(NK * 3 + 1, 4);
    zero_status st = mem ? ZERO_OK : gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_moe_create_cuda: out of memory");
    if (st == ZERO_OK) {
        m->block = mem;
        m->sel_w = (float *)mem;
        m->sel_e = (int32_t *)mem + NK;
        m->sel_slot = (int32_t *)mem + 2 * NK;
        st = moe_cuda_create(&m->dev, &m->cfg, &m->pl, ep, cuda_stream);
    }
    if (st == ZERO_OK) st = moe_cuda_bytes(&m->pl, m->H, &m->bytes); /* the size moe_cuda_create allocated */
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
    moe_cuda_destroy(m->dev);
    moe_plan_free(&m->pl);
    free(m->block);
    free(m->dyout);
    free(m);
}

int gpt_moe_capacity(const gpt_moe *m) { return m ? m->pl.cap : 0; }

void gpt_moe_set_matmul_bf16(gpt_moe *m, int bf16)
{
    if (!m) return;
    m->math = bf16 ? GPT_GEMM_BF16 : GPT_GEMM_F32;
    if (m->dev) moe_cuda_set_bf16(m->dev, bf16);
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
    out->dropped = m->pl.dropped;
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
    for (int se = 0; se < m->P * m->El; se++) {
        size_t n = (size_t)m->pl.rcount[se];
        if (!n) continue;
        float *src_major = m->recvbuf + m->pl.src_first[se] * C;
        float *em = expert_major + m->pl.em_first[se] * C;
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
    moe_assign_slots(&m->pl, m->sel_e, m->sel_slot);
    /* aux = E sum_e f_e P_e, f_e from 1st choices before dropping */
    moe_first_fractions(&m->pl, m->sel_e, m->first_frac);
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
    moe_plan *pl = &m->pl;
    moe_plan_sends(pl);
    if (m->P == 1) {
        memcpy(pl->rcount, pl->count, sizeof(int32_t) * m->El);
    } else {
        zero_status st = zero_alltoall(m->ep, pl->count, pl->rcount, (size_t)m->El, ZERO_I32);
        if (st != ZERO_OK)
            return gpt_fail(st, "MoE dispatch (row counts) over the ep group: %s", zero_comm_last_error(m->ep));
    }
    return moe_plan_receives(pl);
}

/* ------------------------------------------------------------ forward */

zero_status gpt_moe_forward(gpt_moe *m, const float *x, const float *init, float *out, const gpt_moe_params *p,
                            float *aux)
{
    if (!m || !x || !out || !p || !p->gate_w || !p->fc_w || !p->fc_b || !p->proj_w || !p->proj_b)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_moe_forward: a NULL layer, buffer or parameter");
    if (m->w_due)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_moe_forward: the weight gradients (gpt_moe_backward_weight) of the "
                                            "last split backward have not run; the forward would overwrite their inputs");
    m->have_forward = 0;
    if (m->dev) {
        GPT_TRY(moe_cuda_forward(m->dev, &m->pl, m->sel_e, m->sel_slot, m->sel_w, x, init, out, p, aux));
        m->have_forward = 1;
        return ZERO_OK;
    }
    const int N = m->N, E = m->E, K = m->K, C = m->C, H = m->H;
    gpt_matmul_forward(m->math, m->probs, NULL, x, p->gate_w, NULL, N, C, E);
    softmax_rows(m->probs, N, E);
    float a = route(m);
    if (aux) *aux = a;
    GPT_TRY(plan_exchange(m));
    for (int n = 0; n < N; n++)
        for (int i = 0; i < K; i++) {
            int e = m->sel_e[n * K + i], slot = m->sel_slot[n * K + i];
            if (slot >= 0)
                memcpy(m->sendbuf + (m->pl.row0[e] + (size_t)slot) * C, x + (size_t)n * C, sizeof(float) * C);
        }
    GPT_TRY(exchange(m, m->sendbuf, m->pl.sc, m->pl.sd, m->recvbuf, m->pl.rc, m->pl.rd, "dispatch"));
    permute(m, m->xin, 1);
    for (int el = 0; el < m->El; el++) {
        int r = (int)m->pl.erows[el];
        if (!r) continue;
        size_t f = m->pl.efirst[el];
        gpt_matmul_forward(m->math, m->fch + f * H, NULL, m->xin + f * C, p->fc_w + (size_t)el * H * C,
                           p->fc_b + (size_t)el * H, r, C, H);
        gpt_gelu_forward(m->fch_gelu + f * H, m->fch + f * H, (size_t)r * H);
        gpt_matmul_forward(m->math, m->eout + f * C, NULL, m->fch_gelu + f * H, p->proj_w + (size_t)el * C * H,
                           p->proj_b + (size_t)el * C, r, H, C);
    }
    permute(m, m->eout, 0);
    GPT_TRY(exchange(m, m->recvbuf, m->pl.rc, m->pl.rd, m->ybuf, m->pl.sc, m->pl.sd, "combine"));
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        if (init && init != out)
            memcpy(o, init + (size_t)n * C, sizeof(float) * C);
        else if (!init)
            memset(o, 0, sizeof(float) * C);
        for (int i = 0; i < K; i++) {
            int e = m->sel_e[n * K + i], slot = m->sel_slot[n * K + i];
            if (slot < 0) continue;
            const float *y = m->ybuf + (m->pl.row0[e] + (size_t)slot) * C;
            float w = m->sel_w[n * K + i];
            for (int c = 0; c < C; c++) o[c] += w * y[c];
        }
    }
    m->have_forward = 1;
    return ZERO_OK;
}

/* ------------------------------------------------------------ backward */

/* split: B only (the experts' weight gradients left to backward_weight, their upstream gradients kept) */
static zero_status backward(gpt_moe *m, float dloss, const float *x, const float *dout, float *dx,
                            const gpt_moe_params *p, gpt_moe_params *g, int split)
{
    const char *op = split ? "gpt_moe_backward_input" : "gpt_moe_backward";
    if (!m || !x || !dout || !dx || !p || !g || !g->gate_w ||
        (!split && (!g->fc_w || !g->fc_b || !g->proj_w || !g->proj_b)))
        return gpt_fail(ZERO_INVALID_ARGUMENT, "%s: a NULL layer, buffer or gradient", op);
    if (!m->have_forward) return gpt_fail(ZERO_INVALID_STATE, "%s: no completed forward to differentiate", op);
    if (split && !m->stash_bytes)
        return gpt_fail(ZERO_INVALID_STATE, "%s: the layer has no stash (call gpt_moe_split_backward)", op);
    m->have_forward = 0;
    if (m->dev) {
        GPT_TRY(moe_cuda_backward(m->dev, &m->pl, dloss, x, dout, dx, p, g, split));
        m->w_due = split;
        return ZERO_OK;
    }
    const int N = m->N, E = m->E, K = m->K, C = m->C, H = m->H, nt = m->nthreads;

    /* out[n] += w y: dY = w dout[n] (send layout), dw = <dout[n], y> */
    for (int n = 0; n < N; n++)
        for (int i = 0; i < K; i++) {
            int e = m->sel_e[n * K + i], slot = m->sel_slot[n * K + i];
            m->dw[n * K + i] = 0;
            if (slot < 0) continue;
            size_t row = m->pl.row0[e] + (size_t)slot;
            const float *d = dout + (size_t)n * C, *y = m->ybuf + row * C;
            float *dy = m->sendbuf + row * C, w = m->sel_w[n * K + i], s = 0;
            for (int c = 0; c < C; c++) dy[c] = w * d[c], s += d[c] * y[c];
            m->dw[n * K + i] = s;
        }
    GPT_TRY(exchange(m, m->sendbuf, m->pl.sc, m->pl.sd, m->recvbuf, m->pl.rc, m->pl.rd, "dispatch (backward)"));
    /* d(expert output), expert-major: split, in the stash (W reads it); else in eout, which
     * d(expert input) overwrites once read */
    float *dy = split ? m->dyout : m->eout;
    permute(m, dy, 1);
    for (int el = 0; el < m->El; el++) {
        int r = (int)m->pl.erows[el];
        if (!r) continue;
        size_t f = m->pl.efirst[el];
        if (split)
            gpt_matmul_backward_input(m->math, m->dfch + f * H, dy + f * C, p->proj_w + (size_t)el * C * H, r, H, C, 0);
        else
            gpt_matmul_backward(m->math, m->dfch + f * H, g->proj_w + (size_t)el * C * H, g->proj_b + (size_t)el * C,
                                dy + f * C, m->fch_gelu + f * H, p->proj_w + (size_t)el * C * H, r, H, C, 0,
                                m->partials, nt);
        gpt_gelu_backward(m->dfch + f * H, m->fch + f * H, m->dfch + f * H, (size_t)r * H); /* W reads it (split) */
        if (split)
            gpt_matmul_backward_input(m->math, m->eout + f * C, m->dfch + f * H, p->fc_w + (size_t)el * H * C, r, C, H,
                                      0);
        else
            gpt_matmul_backward(m->math, m->eout + f * C, g->fc_w + (size_t)el * H * C, g->fc_b + (size_t)el * H,
                                m->dfch + f * H, m->xin + f * C, p->fc_w + (size_t)el * H * C, r, C, H, 0,
                                m->partials, nt);
    }
    m->w_due = split;
    permute(m, m->eout, 0);
    GPT_TRY(exchange(m, m->recvbuf, m->pl.rc, m->pl.rd, m->sendbuf, m->pl.sc, m->pl.sd, "combine (backward)"));
    for (int n = 0; n < N; n++) {
        float *d = dx + (size_t)n * C;
        memset(d, 0, sizeof(float) * C);
        for (int i = 0; i < K; i++) {
            int e = m->sel_e[n * K + i], slot = m->sel_slot[n * K + i];
            if (slot < 0) continue;
            const float *r = m->sendbuf + (m->pl.row0[e] + (size_t)slot) * C;
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

zero_status gpt_moe_backward(gpt_moe *m, float dloss, const float *x, const float *dout, float *dx,
                             const gpt_moe_params *p, gpt_moe_params *g)
{
    if (m && m->w_due)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_moe_backward: the last split backward's weight gradients have not run");
    return backward(m, dloss, x, dout, dx, p, g, 0);
}

/* ------------------------------------------------------------ split backward (B / W) */

zero_status gpt_moe_split_backward(gpt_moe *m)
{
    if (!m) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_moe_split_backward: layer is NULL");
    if (m->stash_bytes) return ZERO_OK;
    if (m->dev) return moe_cuda_split(m->dev, &m->pl, &m->stash_bytes);
    size_t bytes = sizeof(float) * (m->pl.Rmax ? m->pl.Rmax : 1) * (size_t)m->C; /* every row the layer may receive */
    m->dyout = malloc(bytes);
    if (!m->dyout)
        return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt_moe_split_backward: no memory for %zu bytes of stash", bytes);
    m->stash_bytes = bytes;
    return ZERO_OK;
}

size_t gpt_moe_split_bytes(const gpt_moe *m) { return m ? m->stash_bytes : 0; }

zero_status gpt_moe_backward_input(gpt_moe *m, float dloss, const float *x, const float *dout, float *dx,
                                   const gpt_moe_params *p, gpt_moe_params *g)
{
    if (m && m->w_due)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_moe_backward_input: the last split backward's weight gradients "
                                            "have not run");
    return backward(m, dloss, x, dout, dx, p, g, 1);
}

zero_status gpt_moe_backward_weight(gpt_moe *m, gpt_moe_params *g)
{
    if (!m || !g || !g->fc_w || !g->fc_b || !g->proj_w || !g->proj_b)
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_moe_backward_weight: a NULL layer or expert gradient");
    if (!m->w_due)
        return gpt_fail(ZERO_INVALID_STATE, "gpt_moe_backward_weight: no split backward (gpt_moe_backward_input) "
                                            "awaits its weight gradients");
    if (m->dev) {
        GPT_TRY(moe_cuda_backward_weight(m->dev, &m->pl, g));
        m->w_due = 0;
        return ZERO_OK;
    }
    const int C = m->C, H = m->H, nt = m->nthreads;
    for (int el = 0; el < m->El; el++) { /* the unsplit backward's weight halves, on the same operands */
        int r = (int)m->pl.erows[el];
        if (!r) continue;
        size_t f = m->pl.efirst[el];
        gpt_matmul_backward_weight(m->math, g->proj_w + (size_t)el * C * H, g->proj_b + (size_t)el * C,
                                   m->dyout + f * C, m->fch_gelu + f * H, r, H, C, m->partials, nt);
        gpt_matmul_backward_weight(m->math, g->fc_w + (size_t)el * H * C, g->fc_b + (size_t)el * H, m->dfch + f * H,
                                   m->xin + f * C, r, C, H, m->partials, nt);
    }
    m->w_due = 0;
    return ZERO_OK;
}
