/* The contiguous layout (engine.h "contiguous layout"): a trainer in
 * llm.c's style - stacked (L, ...) tensors, one block of parameters and
 * one of gradients addressed by pointer arithmetic - against the same
 * model registered per layer:
 *   - zero_engine_add_param_stacked registers L per-module slices, and
 *     each stacked tensor's slices lie at the uniform stride
 *     roundup(slice numel, dp size) in the flat layout;
 *   - stages 0-1: the trainer reads parameters and accumulates gradients
 *     through flat_params / flat_grads + offsets only; stage 2: parameters
 *     through the flat view, gradients per slice; stage 3: per slice;
 *   - the trained fp32 masters are bitwise those of the per-layer trainer
 *     at every stage, and every stage equals stage 0;
 *   - the views are refused by name where the stage keeps no flat buffer. */
#include "eng_util.h"

#define L 3
#define STEPS 3
#define NT 3 /* stacked tensors */

static const char *const tnames[NT] = {"ln_w", "attn_w", "attn_b"};
static const int64_t tshape[NT][3] = {{L, 7, 0}, {L, 13, 11}, {L, 11, 0}};
static const int tndim[NT] = {2, 3, 2};
#define E_NUMEL 29

static uint64_t slice_numel(int t) { return (uint64_t)tshape[t][1] * (uint64_t)(tndim[t] == 3 ? tshape[t][2] : 1); }

static float init_value(int t, uint64_t i) { return (float)(0.3 * sin(0.7 * (double)i + t)); }

/* Modules: "embed" (E), then block.0 .. block.L-1; E first, then each
 * stacked tensor's slices in layer order (llm.c's tensor-major order). */
static zero_status build(zero_engine *e, int stacked, int *mods)
{
    zero_status st = zero_engine_add_module(e, "embed", &mods[0]);
    for (int l = 0; l < L && st == ZERO_OK; l++) {
        char n[32];
        snprintf(n, sizeof n, "block.%d", l);
        st = zero_engine_add_module(e, n, &mods[1 + l]);
    }
    float einit[E_NUMEL];
    for (int i = 0; i < E_NUMEL; i++) einit[i] = init_value(-1, (uint64_t)i);
    int64_t es[1] = {E_NUMEL};
    if (st == ZERO_OK) st = zero_engine_add_param(e, mods[0], "E", 1, es, einit, NULL);
    for (int t = 0; t < NT && st == ZERO_OK; t++) {
        uint64_t n = slice_numel(t);
        float *init = malloc(L * n * sizeof *init);
        for (uint64_t i = 0; i < L * n; i++) init[i] = init_value(t, i);
        if (stacked) {
            st = zero_engine_add_param_stacked(e, mods + 1, tnames[t], tndim[t], tshape[t], init, NULL);
        } else {
            for (int l = 0; l < L && st == ZERO_OK; l++) {
                char n2[64];
                snprintf(n2, sizeof n2, "%s[%d]", tnames[t], l);
                st = zero_engine_add_param(e, mods[1 + l], n2, tndim[t] - 1, tshape[t] + 1, init + (uint64_t)l * n,
                                           NULL);
            }
        }
        free(init);
    }
    return st;
}

/* Param id of tensor t's slice l (E is 0; the order of registration). */
static int pid(int t, int l) { return 1 + t * L + l; }

/* Module m's parameters: E for 0, slice m-1 of every tensor otherwise. */
static int module_params(int m, int *ids)
{
    if (m == 0) {
        ids[0] = 0;
        return 1;
    }
    for (int t = 0; t < NT; t++) ids[t] = pid(t, m - 1);
    return NT;
}

static uint64_t numel_of(int p) { return p == 0 ? E_NUMEL : slice_numel((p - 1) / L); }

typedef struct flat {
    float *P, *G;        /* the views (NULL where the stage has none) */
    uint64_t off[1 + NT * L];
} flat;

/* Where param p's values / gradient are, as each trainer addresses them. */
static float *param_ptr(zero_engine *e, const flat *f, int stacked, int p)
{
    if (stacked && f->P) return f->P + f->off[p];
    void *x = NULL;
    CHECK_OK(zero_engine_param_data(e, p, &x));
    return x;
}

static float *grad_ptr(zero_engine *e, const flat *f, int stacked, int p)
{
    if (stacked && f->G) return f->G + f->off[p];
    void *g = NULL;
    CHECK_OK(zero_engine_param_grad(e, p, &g));
    return g;
}

static float *train(zero_comm *comm, zero_device *dev, int stage, int stacked, uint64_t *n)
{
    const int rank = zero_comm_rank(comm), N = zero_comm_size(comm);
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.reduce_bucket_size = 100; /* attn_w's 143-element slices are split across buckets */
    c.stage3_param_persistence_threshold = 10;
    c.gradient_clipping = 0.5;
    c.overlap_comm = stage == 3;
    c.lr = 0.02;
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return NULL;
    int mods[1 + L];
    CHECK_OK(build(e, stacked, mods));
    CHECK_OK(zero_engine_finalize(e));
    flat f = {0};
    for (int p = 0; p < 1 + NT * L; p++) CHECK_OK(zero_engine_get_param_flat_offset(e, p, &f.off[p]));
    if (stacked) {
        /* the stride of each stacked tensor's slices: uniform, roundup(slice numel, N) */
        for (int t = 0; t < NT; t++) {
            uint64_t want = (slice_numel(t) + (uint64_t)N - 1) / (uint64_t)N * (uint64_t)N;
            for (int l = 1; l < L; l++)
                CHECK_MSG(f.off[pid(t, l)] - f.off[pid(t, l - 1)] == want,
                          "%s: slice %d at %llu, slice %d at %llu: stride %llu != roundup(%llu, %d)", tnames[t], l,
                          (unsigned long long)f.off[pid(t, l)], l - 1, (unsigned long long)f.off[pid(t, l - 1)],
                          (unsigned long long)(f.off[pid(t, l)] - f.off[pid(t, l - 1)]),
                          (unsigned long long)slice_numel(t), N);
        }
        void *P = NULL, *G = NULL;
        zero_status sp = zero_engine_flat_params(e, &P, NULL), sg = zero_engine_flat_grads(e, &G, NULL);
        CHECK(stage < 3 ? sp == ZERO_OK : sp == ZERO_UNSUPPORTED);
        CHECK(stage < 2 ? sg == ZERO_OK : sg == ZERO_UNSUPPORTED);
        if (sg != ZERO_OK)
            CHECK_MSG(strstr(zero_engine_last_error(e), "flat_grads: stage"), "%s", zero_engine_last_error(e));
        f.P = P;
        f.G = G;
    }
    for (int s = 1; s <= STEPS; s++) {
        volatile float sink = 0;
        for (int m = 0; m < 1 + L; m++) { /* forward */
            int ids[NT];
            CHECK_OK(zero_engine_gather(e, mods[m]));
            for (int k = 0, np = module_params(m, ids); k < np; k++) sink += param_ptr(e, &f, stacked, ids[k])[0];
            CHECK_OK(zero_engine_release(e, mods[m]));
        }
        (void)sink;
        for (int m = L; m >= 0; m--) { /* backward */
            int ids[NT];
            CHECK_OK(zero_engine_gather(e, mods[m]));
            for (int k = 0, np = module_params(m, ids); k < np; k++) {
                const float *x = param_ptr(e, &f, stacked, ids[k]);
                float *g = grad_ptr(e, &f, stacked, ids[k]);
                for (uint64_t i = 0; i < numel_of(ids[k]); i++) g[i] += eng_grad(x[i], rank, s, 0, ids[k], i);
            }
            CHECK_OK(zero_engine_grads_ready(e, mods[m]));
            CHECK_OK(zero_engine_release(e, mods[m]));
        }
        CHECK_OK(zero_engine_step(e, NULL));
    }
    float *master = eng_collect_master(e, n);
    zero_engine_destroy(e);
    return master;
}

static void check_misuse(zero_comm *comm, zero_device *dev)
{
    zero_config c = ZERO_CONFIG_INIT;
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    int m = -1;
    CHECK_OK(zero_engine_add_module(e, "m", &m));
    int mods[2] = {m, 7};
    int64_t sh1[1] = {2}, sh2[2] = {2, 3};
    CHECK(zero_engine_add_param_stacked(e, mods, "x", 1, sh1, NULL, NULL) == ZERO_INVALID_ARGUMENT);
    CHECK(zero_engine_add_param_stacked(e, mods, "x", 2, sh2, NULL, NULL) == ZERO_NOT_FOUND);
    CHECK_MSG(strstr(zero_engine_last_error(e), "slice 1: unknown module 7"), "%s", zero_engine_last_error(e));
    CHECK(zero_engine_num_params(e) == 0); /* checked before any slice is registered */
    void *v = NULL;
    CHECK(zero_engine_flat_params(e, &v, NULL) == ZERO_INVALID_STATE); /* before finalize */
    zero_engine_destroy(e);
}

int main(void)
{
    zero_comm *world;
    zero_device *dev;
    int rc = eng_open(0, 0, &world, &dev);
    if (rc) return rc;
    uint64_t n0 = 0;
    float *stage0 = train(world, dev, 0, 0, &n0);
    for (int stage = 0; stage <= 3; stage++) {
        uint64_t na = 0, nb = 0;
        float *a = train(world, dev, stage, 0, &na), *b = train(world, dev, stage, 1, &nb);
        CHECK(a && b && na == nb && na == n0);
        long d = a && b ? eng_first_diff(b, a, na) : 0;
        CHECK_MSG(d == -1, "stage %d: stacked trainer differs from the per-layer one at element %ld", stage, d);
        d = a && stage0 ? eng_first_diff(a, stage0, na) : 0;
        CHECK_MSG(d == -1, "stage %d differs from stage 0 at element %ld", stage, d);
        free(a);
        free(b);
    }
    free(stage0);
    check_misuse(world, dev);
    zero_device_close(dev);
    zero_comm_destroy(world);
    return check_exit();
}
