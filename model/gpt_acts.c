/* The activation layout (gpt_acts.h): counting and carving share one walk,
 * so the size a path allocates and the pointers it uses cannot disagree. */
#include "gpt_acts.h"

#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"

/* ------------------------------------------------------------ the carver */
void gpt_carver_init(gpt_carver *c, size_t align, void *main_base, void *host_base)
{
    memset(c, 0, sizeof *c);
    c->align = align;
    c->base[0] = (char *)main_base;
    c->base[1] = (char *)host_base;
}

void *gpt_carve(gpt_carver *c, int cat, size_t count, size_t elem)
{
    /* sizes are rounded up to the alignment, so every buffer starts aligned
     * and a region's size is the plain sum of the rounded sizes */
    size_t bytes = (count * elem + c->align - 1) / c->align * c->align;
    int r = cat == GPT_ACT_HOST;
    size_t at = c->off[r];
    c->off[r] += bytes;
    c->bytes[cat] += bytes;
    return c->base[r] ? c->base[r] + at : NULL;
}

void gpt_carver_report(const gpt_carver *c, gpt_activation_bytes *out)
{
    out->inputs = c->bytes[GPT_ACT_INPUTS];
    out->blocks = c->bytes[GPT_ACT_BLOCKS];
    out->recompute = c->bytes[GPT_ACT_RECOMPUTE];
    out->head = c->bytes[GPT_ACT_HEAD];
    out->scratch = c->bytes[GPT_ACT_SCRATCH];
    out->host = c->bytes[GPT_ACT_HOST];
    out->total = c->off[0];
}

/* ------------------------------------------------------------ checkpointing options */
int gpt_checkpointing_below(const gpt_config *cfg, const gpt_checkpointing *ck)
{
    if (!ck || ck->blocks <= 0) return 0;
    return ck->blocks < cfg->n_layer ? ck->blocks : cfg->n_layer;
}

zero_status gpt_checkpointing_validate(const gpt_checkpointing *ck, const char *op)
{
    if (ck && ck->blocks < 0)
        return gpt_fail(ZERO_CONFIG, "%s: checkpointing blocks %d is negative (0: none, GPT_CHECKPOINT_ALL: every block)",
                        op, ck->blocks);
    return ZERO_OK;
}

/* ------------------------------------------------------------ tables */
static size_t stored_blocks(const gpt_acts_shape *s)
{
    size_t n = 0;
    for (int l = s->layer_begin; l < s->layer_end; l++) n += !gpt_acts_recomputed(s, l);
    return n;
}

static int any_recomputed(const gpt_acts_shape *s) { return gpt_acts_recomputed(s, s->layer_begin); }

zero_status gpt_acts_init(gpt_acts *a, const gpt_acts_shape *shape)
{
    memset(a, 0, sizeof *a);
    a->shape = *shape;
    a->layers = shape->layer_end - shape->layer_begin;
    size_t S = (size_t)shape->slots, L = (size_t)a->layers;
    size_t nsets = S * stored_blocks(shape) + (size_t)any_recomputed(shape);
    size_t bytes = sizeof(gpt_acts_slot) * S + sizeof(gpt_block_acts) * nsets +
                   S * (sizeof(float *) * 2 * (L + 1) + sizeof(gpt_block_acts *) * L);
    char *t = calloc(1, bytes ? bytes : 1);
    if (!t) return gpt_fail(ZERO_OUT_OF_MEMORY, "gpt activations: no memory for %zu bytes of tables", bytes);
    a->tables = t;
    a->slots = (gpt_acts_slot *)t;
    t += sizeof(gpt_acts_slot) * S;
    a->sets = (gpt_block_acts *)t;
    t += sizeof(gpt_block_acts) * nsets;
    a->recompute = any_recomputed(shape) ? &a->sets[nsets - 1] : NULL;
    for (size_t s = 0; s < S; s++) {
        a->slots[s].resid = (float **)t;
        t += sizeof(float *) * (L + 1);
        a->slots[s].kept = (float **)t;
        t += sizeof(float *) * (L + 1);
        a->slots[s].block = (gpt_block_acts **)t;
        t += sizeof(gpt_block_acts *) * L;
    }
    return ZERO_OK;
}

void gpt_acts_free(gpt_acts *a)
{
    if (!a) return;
    free(a->tables);
    memset(a, 0, sizeof *a);
}

/* ------------------------------------------------------------ the layout */
static size_t act_elem(const gpt_acts_shape *s) { return s->act_elem ? (size_t)s->act_elem : sizeof(float); }

static void carve_block(gpt_carver *c, int cat, gpt_block_acts *b, const gpt_acts_shape *s)
{
    const size_t C = (size_t)s->C, P = (size_t)s->tp_size, Q = (size_t)(s->cp_size > 1 ? s->cp_size : 1);
    const size_t Cl = C / P, Hl = 4 * C / P, NHa = (size_t)s->n_head / (P * Q), f = sizeof(float), e = act_elem(s);
    size_t Nc, Nr;
    gpt_acts_rows(s, &Nc, &Nr);
    b->ln1 = gpt_carve(c, cat, Nr * C, e);
    b->ln1_mean = gpt_carve(c, cat, Nr, f);
    b->ln1_rstd = gpt_carve(c, cat, Nr, f);
    b->qkv = gpt_carve(c, cat, Nc * 3 * Cl, e);
    b->att = s->flash ? NULL : gpt_carve(c, cat, (size_t)s->B * NHa * s->T * s->T, f);
    b->att_lse = s->flash ? gpt_carve(c, cat, (size_t)s->B * NHa * s->T, f) : NULL;
    b->atty = gpt_carve(c, cat, Nc * Cl, e);
    b->res2 = gpt_carve(c, cat, Nr * C, f);
    b->ln2 = gpt_carve(c, cat, Nr * C, e);
    b->ln2_mean = gpt_carve(c, cat, Nr, f);
    b->ln2_rstd = gpt_carve(c, cat, Nr, f);
    if (s->moe) { /* the layer keeps its own activations; bf16: its fp32 input */
        b->fch = e == f ? NULL : gpt_carve(c, cat, Nr * C, f);
        b->fch_gelu = NULL;
        return;
    }
    b->fch = gpt_carve(c, cat, Nc * Hl, e);
    b->fch_gelu = gpt_carve(c, cat, Nc * Hl, e);
}

void gpt_acts_layout(gpt_acts *a, const gpt_acts_shape *s, gpt_carver *c)
{
    const size_t C = (size_t)s->C, V = (size_t)s->vocab, f = sizeof(float);
    const size_t Cl = C / (size_t)s->tp_size, Hl = 4 * C / (size_t)s->tp_size;
    size_t Nc, N; /* N: the residual stream's rows */
    gpt_acts_rows(s, &Nc, &N);
    const int L = s->layer_end - s->layer_begin, P = s->partition > 1 ? s->partition : 1;
    const int compact = any_recomputed(s) && (s->offload || P > 1);
    const size_t part = (N * C + (size_t)P - 1) / (size_t)P; /* a kept input's floats */
    gpt_acts_slot scratch_slot;
    gpt_block_acts scratch_set;
    float *scratch_ptr;
    float *stage[2] = {NULL, NULL};
    size_t next_set = 0;
    if (a) a->kept_count = part;
    if (compact) { /* the stand-ins for the kept inputs, shared by the slots; P slices fill one */
        stage[0] = gpt_carve(c, GPT_ACT_INPUTS, part * (size_t)P, f);
        stage[1] = gpt_carve(c, GPT_ACT_INPUTS, part * (size_t)P, f);
    }
    for (int sl = 0; sl < s->slots; sl++) {
        gpt_acts_slot *slot = a ? &a->slots[sl] : &scratch_slot;
        slot->tokens = gpt_carve(c, GPT_ACT_HEAD, N, sizeof(int32_t));
        slot->targets = gpt_carve(c, GPT_ACT_HEAD, N, sizeof(int32_t));
        for (int i = 0; i <= L; i++) {
            int kept_i = compact && i < L && gpt_acts_recomputed(s, s->layer_begin + i);
            float **r = a ? &slot->resid[i] : &scratch_ptr, **h = a ? &slot->kept[i] : &scratch_ptr;
            *h = kept_i ? gpt_carve(c, s->offload ? GPT_ACT_HOST : GPT_ACT_INPUTS, part, f) : NULL;
            *r = kept_i ? stage[i % 2] : gpt_carve(c, GPT_ACT_INPUTS, N * C, f);
        }
        for (int i = 0; i < L; i++) {
            if (gpt_acts_recomputed(s, s->layer_begin + i)) continue; /* pointed at the shared set below */
            gpt_block_acts *b = a ? &a->sets[next_set++] : &scratch_set;
            carve_block(c, GPT_ACT_BLOCKS, b, s);
            if (a) slot->block[i] = b;
        }
        if (s->head) {
            slot->lnf = gpt_carve(c, GPT_ACT_HEAD, N * C, act_elem(s));
            slot->lnf_mean = gpt_carve(c, GPT_ACT_HEAD, N, f);
            slot->lnf_rstd = gpt_carve(c, GPT_ACT_HEAD, N, f);
            slot->logits = gpt_carve(c, GPT_ACT_HEAD, N * V, f);
            slot->lse = gpt_carve(c, GPT_ACT_HEAD, N, f);
        } else {
            slot->lnf = slot->lnf_mean = slot->lnf_rstd = slot->logits = slot->lse = NULL;
        }
    }
    if (any_recomputed(s)) {
        gpt_block_acts *b = a ? a->recompute : &scratch_set;
        carve_block(c, GPT_ACT_RECOMPUTE, b, s);
        if (a)
            for (int sl = 0; sl < s->slots; sl++)
                for (int i = 0; i < L; i++)
                    if (gpt_acts_recomputed(s, s->layer_begin + i)) a->slots[sl].block[i] = b;
    }
    float *dres = gpt_carve(c, GPT_ACT_SCRATCH, N * C, f);
    float *dln = gpt_carve(c, GPT_ACT_SCRATCH, Nc * C, act_elem(s));
    float *dqkv = gpt_carve(c, GPT_ACT_SCRATCH, Nc * 3 * Cl, act_elem(s));
    float *dfch = !s->moe ? gpt_carve(c, GPT_ACT_SCRATCH, Nc * Hl, act_elem(s))
                  : act_elem(s) == f ? NULL : gpt_carve(c, GPT_ACT_SCRATCH, Nc * C, f); /* MoE: bf16's fp32 dx */
    float *dlogits = s->head ? gpt_carve(c, GPT_ACT_SCRATCH, N * V, act_elem(s)) : NULL;
    float *sp_full = s->seq_parallel ? gpt_carve(c, GPT_ACT_SCRATCH, Nc * C, f) : NULL;
    int cp = s->cp_size > 1;
    float *cp_send = cp ? gpt_carve(c, GPT_ACT_SCRATCH, Nc * 3 * Cl, f) : NULL;
    float *cp_recv = cp ? gpt_carve(c, GPT_ACT_SCRATCH, Nc * 3 * Cl, f) : NULL;
    float *cp_heads = cp ? gpt_carve(c, GPT_ACT_SCRATCH, Nc * Cl, f) : NULL;
    if (a) {
        a->dres = dres;
        a->dln = dln;
        a->dqkv = dqkv;
        a->dfch = dfch;
        a->dlogits = dlogits;
        a->sp_full = sp_full;
        a->cp_send = cp_send;
        a->cp_recv = cp_recv;
        a->cp_heads = cp_heads;
    }
}
