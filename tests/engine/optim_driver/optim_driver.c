/* The engine side of tests/python/test_optim_vs_torch.py.
 *
 *   optim_driver IN OUT [--opt adamw|sgd] [--lr X] [--beta1 X] [--beta2 X]
 *                [--eps X] [--wd X] [--momentum X] [--dampening X]
 *                [--nesterov 0|1] [--clip X] [--stage S] [--bucket N]
 *                [--persistence N] [--dtype f32|bf16] [--fast 0|1]
 *                [--group LRSCALE:WD:B1:B2:EPS[:MOM:DAMP:NEST]]... [--assign G0,G1,...]
 *                [--set STEP:G:LRSCALE:WD:B1:B2:EPS[:MOM:DAMP:NEST]]...
 * --group adds parameter groups 1, 2, ... in order (negative fields: the
 * config's); --assign puts tensor i in group Gi; --set changes group G's
 * hyperparameters (zero_engine_set_group_hparams) before step STEP (1-based). 
 *
 * Reads parameters and per-step gradients, runs every step through the
 * engine, and writes the fp32 master parameters after each step, for the
 * test to compare with torch.optim on the same inputs. With --dtype bf16 the
 * gradients must be bf16 values already (the test rounds them); the engine
 * gets them in its bf16 gradient buffers, and its fp32 master weights must
 * follow fp32 torch.optim fed the same rounded gradients.
 *
 * IN (little-endian):  "ZOPTIN01", u32 nparams, u32 nsteps, u64 numel[nparams],
 *                      f32 init (all params concatenated),
 *                      f32 grad[nsteps] (all params concatenated, per step)
 * OUT (rank 0 writes): "ZOPTOUT1", u32 nparams, u32 nsteps, then per step
 *                      f64 grad_norm, f64 clip_coef, f32 params (concatenated)
 *
 * At world size 2 (tests/mpirun.sh 2) the gradient g of each element is
 * split between the ranks so the engine's average is exactly g:
 * rank 0 gets b = fl(1.375 g), rank 1 gets a = 2g - b. Since g <= b <= 4g
 * (same sign), 2g - b is exact (Sterbenz), so a + b = 2g exactly and the
 * fp32 sum of two ranks followed by the engine's * 1/2 gives back g bit for
 * bit. The driver checks a + b == 2g for every element before using it.
 * In bf16 the same holds: g and b = bf16(1.375 g) are bf16 values, so
 * Sterbenz's lemma in bf16 makes 2g - b a bf16 value too, and the engine's
 * fp32 sum of the two is 2g exactly.
 *
 * Exit status: 0 ok, 1 failure (message on stderr), 2 usage. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zero/zero.h>

#define MAX_PARAMS 64
#define PARAMS_PER_MODULE 2

typedef struct input {
    uint32_t nparams, nsteps;
    uint64_t numel[MAX_PARAMS];
    uint64_t offset[MAX_PARAMS];
    uint64_t total;
    float *init;  /* total */
    float *grads; /* nsteps * total */
} input;

static int fail(const char *what, zero_status st, const char *msg)
{
    fprintf(stderr, "optim_driver: %s: %s: %s\n", what, zero_status_name(st), msg);
    return 1;
}

static int read_input(const char *path, input *in)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "optim_driver: cannot open %s\n", path);
        return 1;
    }
    char magic[8];
    int ok = fread(magic, 1, 8, f) == 8 && !memcmp(magic, "ZOPTIN01", 8) &&
             fread(&in->nparams, 4, 1, f) == 1 && fread(&in->nsteps, 4, 1, f) == 1 &&
             in->nparams >= 1 && in->nparams <= MAX_PARAMS && in->nsteps >= 1 && in->nsteps <= 10000 &&
             fread(in->numel, 8, in->nparams, f) == in->nparams;
    in->total = 0;
    for (uint32_t i = 0; ok && i < in->nparams; i++) {
        ok = in->numel[i] >= 1 && in->numel[i] <= (1u << 26);
        in->offset[i] = in->total;
        in->total += in->numel[i];
    }
    if (ok) {
        in->init = malloc(in->total * sizeof(float));
        in->grads = malloc((size_t)in->nsteps * in->total * sizeof(float));
        ok = in->init && in->grads && fread(in->init, sizeof(float), in->total, f) == in->total &&
             fread(in->grads, sizeof(float), (size_t)in->nsteps * in->total, f) ==
                 (size_t)in->nsteps * in->total;
    }
    fclose(f);
    if (!ok) fprintf(stderr, "optim_driver: %s is not a valid ZOPTIN01 file\n", path);
    return ok ? 0 : 1;
}

static float round_bf16(float x) { return zero_bf16_to_f32(zero_f32_to_bf16(x)); }

/* This rank's share of the reference gradient (see the top comment). */
static int split_gradient(const float *g, float *mine, uint64_t n, int rank, int world, int bf16)
{
    for (uint64_t i = 0; i < n; i++) {
        if (bf16 && round_bf16(g[i]) != g[i]) {
            fprintf(stderr, "optim_driver: --dtype bf16 but gradient element %llu (%.9g) is not a bf16 value\n",
                    (unsigned long long)i, (double)g[i]);
            return 1;
        }
        if (world == 1) {
            mine[i] = g[i];
            continue;
        }
        volatile float twice = 2.0f * g[i]; /* volatile: no excess precision, no fusing */
        volatile float b = 1.375f * g[i];
        if (bf16) b = round_bf16(b);
        volatile float a = twice - b;
        volatile float sum = a + b;
        if (sum != twice || (bf16 && round_bf16(a) != a)) {
            fprintf(stderr, "optim_driver: gradient split not exact at element %llu (g=%.9g)\n",
                    (unsigned long long)i, (double)g[i]);
            return 1;
        }
        mine[i] = rank == 0 ? b : a;
    }
    return 0;
}

#define MAX_GROUPS 8
#define MAX_SETS 16

/* "A:B:C:D:E[:F:G:H]" into h (lr_scale, wd, beta1, beta2, eps[, momentum, dampening, nesterov]). */
static int parse_hparams(const char *text, zero_group_hparams *h)
{
    int n = sscanf(text, "%lf:%lf:%lf:%lf:%lf:%lf:%lf:%d", &h->lr_scale, &h->weight_decay, &h->beta1, &h->beta2,
                   &h->eps, &h->momentum, &h->dampening, &h->nesterov);
    return n == 5 || n == 8 ? 0 : -1;
}

int main(int argc, char **argv)
{
    zero_group_hparams groups[MAX_GROUPS];
    int ngroups = 0, nsets = 0, assign[64] = {0}, nassign = 0;
    struct {
        int step, group;
        zero_group_hparams h;
    } sets[MAX_SETS];
    if (argc < 3) {
        fprintf(stderr, "usage: optim_driver IN OUT [options] (see the source)\n");
        return 2;
    }
    zero_config cfg = ZERO_CONFIG_INIT;
    cfg.compute_dtype = ZERO_F32;
    cfg.weight_decay = 0.0;
    for (int i = 3; i + 1 < argc; i += 2) {
        const char *k = argv[i];
        double v = strtod(argv[i + 1], NULL);
        if (!strcmp(k, "--opt")) cfg.optimizer = !strcmp(argv[i + 1], "sgd") ? ZERO_OPTIM_SGD : ZERO_OPTIM_ADAMW;
        else if (!strcmp(k, "--lr")) cfg.lr = v;
        else if (!strcmp(k, "--beta1")) cfg.beta1 = v;
        else if (!strcmp(k, "--beta2")) cfg.beta2 = v;
        else if (!strcmp(k, "--eps")) cfg.eps = v;
        else if (!strcmp(k, "--wd")) cfg.weight_decay = v;
        else if (!strcmp(k, "--momentum")) cfg.momentum = v;
        else if (!strcmp(k, "--dampening")) cfg.dampening = v;
        else if (!strcmp(k, "--nesterov")) cfg.nesterov = (int)v;
        else if (!strcmp(k, "--clip")) cfg.gradient_clipping = v;
        else if (!strcmp(k, "--stage")) cfg.stage = (int)v;
        else if (!strcmp(k, "--bucket")) cfg.reduce_bucket_size = (uint64_t)v;
        else if (!strcmp(k, "--persistence")) cfg.stage3_param_persistence_threshold = (uint64_t)v;
        else if (!strcmp(k, "--fast")) cfg.optimizer_fast = (int)v;
        else if (!strcmp(k, "--group") && ngroups < MAX_GROUPS) {
            groups[ngroups] = (zero_group_hparams)ZERO_GROUP_HPARAMS_INIT;
            if (parse_hparams(argv[i + 1], &groups[ngroups++])) {
                fprintf(stderr, "optim_driver: --group LRSCALE:WD:B1:B2:EPS\n");
                return 2;
            }
        } else if (!strcmp(k, "--assign")) {
            for (char *t = argv[i + 1]; *t && nassign < 64;) {
                assign[nassign++] = (int)strtol(t, &t, 10);
                if (*t == ',') t++;
            }
        } else if (!strcmp(k, "--set") && nsets < MAX_SETS) {
            char *t = argv[i + 1];
            sets[nsets].step = (int)strtol(t, &t, 10);
            sets[nsets].group = (int)strtol(t + 1, &t, 10);
            sets[nsets].h = (zero_group_hparams)ZERO_GROUP_HPARAMS_INIT;
            if (*t != ':' || parse_hparams(t + 1, &sets[nsets++].h)) {
                fprintf(stderr, "optim_driver: --set STEP:G:LRSCALE:WD:B1:B2:EPS\n");
                return 2;
            }
        } else if (!strcmp(k, "--dtype")) {
            if (!strcmp(argv[i + 1], "bf16")) cfg.compute_dtype = ZERO_BF16;
            else if (!strcmp(argv[i + 1], "f32")) cfg.compute_dtype = ZERO_F32;
            else {
                fprintf(stderr, "optim_driver: --dtype f32 or bf16\n");
                return 2;
            }
        }
        else {
            fprintf(stderr, "optim_driver: unknown option %s\n", k);
            return 2;
        }
    }
    if ((argc - 3) % 2) {
        fprintf(stderr, "optim_driver: option %s needs a value\n", argv[argc - 1]);
        return 2;
    }

    const int bf16 = cfg.compute_dtype == ZERO_BF16;
    input in = {0};
    if (read_input(argv[1], &in)) return 1;

    zero_comm *world = NULL;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    float *mine = NULL, *params = NULL;
    FILE *out = NULL;
    int rc = 1;
    zero_status st;
    if ((st = zero_comm_create_world(&world, NULL)) != ZERO_OK) {
        rc = fail("comm init", st, zero_last_error());
        goto done;
    }
    const int rank = zero_comm_get_rank(world), size = zero_comm_get_size(world);
    if (size > 2) {
        fprintf(stderr, "optim_driver: world size 1 or 2 only (got %d)\n", size);
        goto done;
    }
    if ((st = zero_device_create(&dev, ZERO_DEVICE_CPU, 0)) != ZERO_OK) {
        rc = fail("device open", st, zero_last_error());
        goto done;
    }
    if ((st = zero_engine_create(&e, &cfg, world, dev)) != ZERO_OK) {
        rc = fail("engine create", st, zero_last_error());
        goto done;
    }

    /* A few parameters per module, so grads_ready and the buckets see more
     * than one parameter at a time. */
    const int nmodules = (int)((in.nparams + PARAMS_PER_MODULE - 1) / PARAMS_PER_MODULE);
    for (int m = 0; m < nmodules; m++) {
        char name[32];
        int id = -1;
        snprintf(name, sizeof name, "m%d", m);
        if ((st = zero_engine_add_module(e, name, &id)) != ZERO_OK) {
            rc = fail("add_module", st, zero_engine_last_error(e));
            goto done;
        }
    }
    for (uint32_t p = 0; p < in.nparams; p++) {
        char name[32];
        snprintf(name, sizeof name, "p%u", p);
        int64_t shape[1] = {(int64_t)in.numel[p]};
        if ((st = zero_engine_add_param(e, (int)(p / PARAMS_PER_MODULE), name, 1, shape, in.init + in.offset[p],
                                        NULL)) != ZERO_OK) {
            rc = fail("add_param", st, zero_engine_last_error(e));
            goto done;
        }
    }
    for (int g = 0; g < ngroups; g++) {
        char name[16];
        snprintf(name, sizeof name, "g%d", g + 1);
        if ((st = zero_engine_add_group(e, name, &groups[g], NULL)) != ZERO_OK) {
            rc = fail("add_group", st, zero_engine_last_error(e));
            goto done;
        }
    }
    for (int p = 0; p < nassign && p < (int)in.nparams; p++)
        if ((st = zero_engine_set_param_group(e, p, assign[p])) != ZERO_OK) {
            rc = fail("set_param_group", st, zero_engine_last_error(e));
            goto done;
        }
    if ((st = zero_engine_finalize(e)) != ZERO_OK) {
        rc = fail("finalize", st, zero_engine_last_error(e));
        goto done;
    }

    mine = malloc(in.total * sizeof *mine);
    params = malloc(in.total * sizeof *params);
    if (!mine || !params) {
        fprintf(stderr, "optim_driver: out of memory\n");
        goto done;
    }
    if (rank == 0) {
        out = fopen(argv[2], "wb");
        if (!out) {
            fprintf(stderr, "optim_driver: cannot write %s\n", argv[2]);
            goto done;
        }
        fwrite("ZOPTOUT1", 1, 8, out);
        fwrite(&in.nparams, 4, 1, out);
        fwrite(&in.nsteps, 4, 1, out);
    }

    for (uint32_t s = 0; s < in.nsteps; s++) {
        for (int k = 0; k < nsets; k++)
            if (sets[k].step == (int)s + 1 && (st = zero_engine_set_group_hparams(e, sets[k].group, &sets[k].h)) != ZERO_OK) {
                rc = fail("set_group_hparams", st, zero_engine_last_error(e));
                goto done;
            }
        if (split_gradient(in.grads + (size_t)s * in.total, mine, in.total, rank, size, bf16)) goto done;
        /* backward in reverse module order, as a trainer would */
        for (int m = nmodules - 1; m >= 0; m--) {
            if ((st = zero_engine_gather(e, m)) != ZERO_OK) {
                rc = fail("gather", st, zero_engine_last_error(e));
                goto done;
            }
            for (uint32_t p = (uint32_t)m * PARAMS_PER_MODULE;
                 p < in.nparams && p < (uint32_t)(m + 1) * PARAMS_PER_MODULE; p++) {
                void *grad = NULL;
                if ((st = zero_engine_param_grad(e, (int)p, &grad)) != ZERO_OK) {
                    rc = fail("param_grad", st, zero_engine_last_error(e));
                    goto done;
                }
                const float *src = mine + in.offset[p];
                if (bf16) { /* += in the compute dtype; exact: the buffer is zero, src is bf16 */
                    uint16_t *g = grad;
                    for (uint64_t k = 0; k < in.numel[p]; k++)
                        g[k] = zero_f32_to_bf16(zero_bf16_to_f32(g[k]) + src[k]);
                } else {
                    float *g = grad;
                    for (uint64_t k = 0; k < in.numel[p]; k++) g[k] += src[k];
                }
            }
            if ((st = zero_engine_grads_ready(e, m)) != ZERO_OK) {
                rc = fail("grads_ready", st, zero_engine_last_error(e));
                goto done;
            }
            if ((st = zero_engine_release(e, m)) != ZERO_OK) {
                rc = fail("release", st, zero_engine_last_error(e));
                goto done;
            }
        }
        zero_step_result res;
        if ((st = zero_engine_step(e, &res)) != ZERO_OK) {
            rc = fail("step", st, zero_engine_last_error(e));
            goto done;
        }
        for (uint32_t p = 0; p < in.nparams; p++)
            if ((st = zero_engine_read_param(e, (int)p, params + in.offset[p])) != ZERO_OK) {
                rc = fail("read_param", st, zero_engine_last_error(e));
                goto done;
            }
        if (out) {
            fwrite(&res.grad_norm, 8, 1, out);
            fwrite(&res.clip_coef, 8, 1, out);
            fwrite(params, sizeof *params, in.total, out);
        }
    }
    rc = 0;
    if (out && fclose(out)) {
        fprintf(stderr, "optim_driver: error writing %s\n", argv[2]);
        rc = 1;
    }
    out = NULL;
done:
    if (out) fclose(out);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    zero_comm_destroy(world);
    free(mine);
    free(params);
    free(in.init);
    free(in.grads);
    return rc;
}
