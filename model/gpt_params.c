/* The model's description of itself: config checks, the parameter list,
 * deterministic initialisation, FLOP count, and error recording. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gpt_internal.h"

/* ------------------------------------------------------------ errors */
static _Thread_local char gpt_errmsg[512];

zero_status gpt_fail(zero_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(gpt_errmsg, sizeof gpt_errmsg, fmt, ap);
    va_end(ap);
    return status;
}

const char *gpt_last_error(void) { return gpt_errmsg; }

void gpt_clear_error(void) { gpt_errmsg[0] = '\0'; }

/* ------------------------------------------------------------ config */
zero_status gpt_config_validate(const gpt_config *cfg)
{
    if (!cfg) return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt config: NULL");
    /* Upper bounds keep every index product inside size_t/int comfortably. */
    struct { const char *name; int v, lo, hi; } f[] = {
        {"n_layer", cfg->n_layer, 1, 1024},   {"n_head", cfg->n_head, 1, 1024},
        {"d_model", cfg->d_model, 1, 65536},  {"seq_len", cfg->seq_len, 1, 1 << 20},
        {"vocab", cfg->vocab, 1, 1 << 24},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < f[i].lo || f[i].v > f[i].hi)
            return gpt_fail(ZERO_CONFIG, "gpt config: %s = %d is outside [%d, %d]", f[i].name, f[i].v,
                            f[i].lo, f[i].hi);
    if (cfg->d_model % cfg->n_head != 0)
        return gpt_fail(ZERO_CONFIG, "gpt config: d_model = %d is not a multiple of n_head = %d",
                        cfg->d_model, cfg->n_head);
    if (cfg->moe_experts == 0) return ZERO_OK;
    int ep = cfg->moe_ep > 1 ? cfg->moe_ep : 1;
    if (cfg->moe_experts < 0 || cfg->moe_experts > 4096 || cfg->moe_ep < 0 || cfg->moe_experts % ep)
        return gpt_fail(ZERO_CONFIG, "gpt config: moe experts = %d must be in [0, 4096] and a multiple of moe ep = %d",
                        cfg->moe_experts, cfg->moe_ep);
    if (cfg->moe_top_k < 1 || cfg->moe_top_k > cfg->moe_experts)
        return gpt_fail(ZERO_CONFIG, "gpt config: moe top_k = %d is outside [1, experts = %d]", cfg->moe_top_k,
                        cfg->moe_experts);
    if (!(cfg->moe_capacity_factor == cfg->moe_capacity_factor) || cfg->moe_capacity_factor > 1e6f)
        return gpt_fail(ZERO_CONFIG, "gpt config: moe capacity_factor = %g is not a number <= 1e6 (<= 0: unlimited)",
                        (double)cfg->moe_capacity_factor);
    if (!(cfg->moe_aux_loss_coef >= 0) || cfg->moe_aux_loss_coef > 1e6f)
        return gpt_fail(ZERO_CONFIG, "gpt config: moe aux_loss_coef = %g is outside [0, 1e6]",
                        (double)cfg->moe_aux_loss_coef);
    return ZERO_OK;
}

static int block_nt(const gpt_config *cfg) { return cfg->moe_experts > 0 ? GPT_MOE_BLOCK_NT : GPT_BLOCK_NT; }

/* ------------------------------------------------------------ parameter list */
size_t gpt_num_params(const gpt_config *cfg)
{
    return GPT_EMBED_NT + (size_t)block_nt(cfg) * cfg->n_layer + GPT_FINAL_NT;
}

int gpt_module_num_tensors(const gpt_config *cfg, int module)
{
    if (module == GPT_MODULE_EMBED) return GPT_EMBED_NT;
    if (module == gpt_module_final(cfg)) return GPT_FINAL_NT;
    if (module > 0 && module <= cfg->n_layer) return block_nt(cfg);
    return 0;
}

const char *gpt_module_name(const gpt_config *cfg, int module, char *buf, size_t size)
{
    if (module == GPT_MODULE_EMBED) snprintf(buf, size, "embed");
    else if (module == gpt_module_final(cfg)) snprintf(buf, size, "final");
    else snprintf(buf, size, "block.%d", module - 1);
    return buf;
}

size_t gpt_param_position(const gpt_config *cfg, int module, int index)
{
    if (module == GPT_MODULE_EMBED) return (size_t)index;
    if (module == gpt_module_final(cfg)) return GPT_EMBED_NT + (size_t)block_nt(cfg) * cfg->n_layer + index;
    return GPT_EMBED_NT + (size_t)block_nt(cfg) * (module - 1) + index;
}

/* One block's tensors: GPT-2 names and nn.Linear (out, in) shapes in units of C. */
static const struct {
    const char *suffix;
    int rows_c, cols_c;   /* rows = rows_c*C, cols = cols_c*C; cols_c 0 = vector */
    gpt_init_kind init;
    int residual_proj;    /* scaled init: 0.02/sqrt(2 n_layer) */
} block_tensors[GPT_BLOCK_NT] = {
    [GPT_LN1_W] = {"ln_1.weight", 1, 0, GPT_INIT_ONES, 0},
    [GPT_LN1_B] = {"ln_1.bias", 1, 0, GPT_INIT_ZEROS, 0},
    [GPT_QKV_W] = {"attn.c_attn.weight", 3, 1, GPT_INIT_NORMAL, 0},
    [GPT_QKV_B] = {"attn.c_attn.bias", 3, 0, GPT_INIT_ZEROS, 0},
    [GPT_ATTPROJ_W] = {"attn.c_proj.weight", 1, 1, GPT_INIT_NORMAL, 1},
    [GPT_ATTPROJ_B] = {"attn.c_proj.bias", 1, 0, GPT_INIT_ZEROS, 0},
    [GPT_LN2_W] = {"ln_2.weight", 1, 0, GPT_INIT_ONES, 0},
    [GPT_LN2_B] = {"ln_2.bias", 1, 0, GPT_INIT_ZEROS, 0},
    [GPT_FC_W] = {"mlp.c_fc.weight", 4, 1, GPT_INIT_NORMAL, 0},
    [GPT_FC_B] = {"mlp.c_fc.bias", 4, 0, GPT_INIT_ZEROS, 0},
    [GPT_FCPROJ_W] = {"mlp.c_proj.weight", 1, 4, GPT_INIT_NORMAL, 1},
    [GPT_FCPROJ_B] = {"mlp.c_proj.bias", 1, 0, GPT_INIT_ZEROS, 0},
};

zero_status gpt_param_info_get(const gpt_config *cfg, size_t i, gpt_param_info *out)
{
    if (i >= gpt_num_params(cfg))
        return gpt_fail(ZERO_INVALID_ARGUMENT, "gpt_param_info_get: index %zu >= %zu parameters", i,
                        gpt_num_params(cfg));
    memset(out, 0, sizeof *out);
    size_t C = (size_t)cfg->d_model;
    out->init_std = 0.02f;
    if (i < GPT_EMBED_NT) {
        out->module = GPT_MODULE_EMBED;
        out->index = (int)i;
        out->ndim = 2;
        out->shape[0] = i == GPT_WTE ? (size_t)cfg->vocab : (size_t)cfg->seq_len;
        out->shape[1] = C;
        out->init = GPT_INIT_NORMAL;
        snprintf(out->name, sizeof out->name, "%s", i == GPT_WTE ? "wte.weight" : "wpe.weight");
    } else if (i < GPT_EMBED_NT + (size_t)block_nt(cfg) * cfg->n_layer) {
        size_t j = i - GPT_EMBED_NT;
        int layer = (int)(j / block_nt(cfg)), k = (int)(j % block_nt(cfg));
        out->module = gpt_module_block(layer);
        out->index = k;
        if (k == GPT_MOE_GATE_W) { /* the router */
            out->ndim = 2;
            out->shape[0] = (size_t)cfg->moe_experts;
            out->shape[1] = C;
            out->init = GPT_INIT_NORMAL;
            snprintf(out->name, sizeof out->name, "h.%d.mlp.gate.weight", layer);
        } else {
            out->ndim = block_tensors[k].cols_c ? 2 : 1;
            out->shape[0] = block_tensors[k].rows_c * C;
            out->shape[1] = block_tensors[k].cols_c ? block_tensors[k].cols_c * C : 1;
            out->init = block_tensors[k].init;
            if (block_tensors[k].residual_proj) out->init_std = 0.02f / sqrtf(2.0f * cfg->n_layer);
            snprintf(out->name, sizeof out->name, "h.%d.%s", layer, block_tensors[k].suffix);
            if (cfg->moe_experts > 0 && k >= GPT_FC_W && k <= GPT_FCPROJ_B) {
                /* this rank's experts, stacked: rows times the local expert count */
                int ep = cfg->moe_ep > 1 ? cfg->moe_ep : 1;
                out->shape[0] *= (size_t)(cfg->moe_experts / ep);
                out->expert_stack = 1;
                snprintf(out->name, sizeof out->name, "h.%d.mlp.experts.%s", layer, block_tensors[k].suffix + 4);
            }
        }
    } else {
        int k = (int)(i - GPT_EMBED_NT - (size_t)block_nt(cfg) * cfg->n_layer);
        out->module = gpt_module_final(cfg);
        out->index = k;
        out->ndim = 1;
        out->shape[0] = C;
        out->shape[1] = 1;
        out->init = k == GPT_LNF_W ? GPT_INIT_ONES : GPT_INIT_ZEROS;
        snprintf(out->name, sizeof out->name, "%s", k == GPT_LNF_W ? "ln_f.weight" : "ln_f.bias");
    }
    if (out->init != GPT_INIT_NORMAL) out->init_std = 0.0f;
    out->numel = out->shape[0] * out->shape[1];
    return ZERO_OK;
}

size_t gpt_param_elements(const gpt_config *cfg)
{
    size_t total = 0;
    gpt_param_info info;
    for (size_t i = 0; i < gpt_num_params(cfg); i++) {
        gpt_param_info_get(cfg, i, &info);
        total += info.numel;
    }
    return total;
}

size_t gpt_module_elements(const gpt_config *cfg, int module)
{
    size_t n = 0;
    gpt_param_info info;
    for (int i = 0; i < gpt_module_num_tensors(cfg, module); i++) {
        gpt_param_info_get(cfg, gpt_param_position(cfg, module, i), &info);
        n += info.numel;
    }
    return n;
}

/* ------------------------------------------------------------ initialisation */
/* GPT-2's init as a libzero spec: the engine evaluates it on each rank for
 * just the elements the rank keeps, from (seed, name, index) alone, so every
 * world size, stage and tensor-parallel layout gets the same model. */
zero_init_spec gpt_param_init_spec(const gpt_param_info *info, uint64_t seed)
{
    zero_init_spec s = ZERO_INIT_SPEC_INIT;
    switch (info->init) {
    case GPT_INIT_ONES: s.kind = ZERO_INIT_ONES; break;
    case GPT_INIT_NORMAL:
        s.kind = ZERO_INIT_NORMAL;
        s.mean = 0.0;
        s.std = info->init_std;
        s.seed = seed;
        break;
    default: s.kind = ZERO_INIT_ZEROS; break;
    }
    return s;
}

void gpt_param_init(const gpt_config *cfg, const gpt_param_info *info, uint64_t seed, float *out)
{
    (void)cfg;
    zero_init_spec s = gpt_param_init_spec(info, seed);
    /* valid by construction (a finite std >= 0, a name) */
    (void)zero_init_generate(&s, info->name, 0, info->numel, out);
}

void gpt_param_init_ep(const gpt_param_info *info, uint64_t seed, int ep_rank, float *out)
{
    zero_init_spec s = gpt_param_init_spec(info, seed);
    uint64_t first = info->expert_stack ? (uint64_t)ep_rank * info->numel : 0;
    (void)zero_init_generate(&s, info->name, first, first + info->numel, out);
}

/* ------------------------------------------------------------ FLOPs */
double gpt_train_flops_per_token(const gpt_config *cfg, int seq)
{
    double C = cfg->d_model, L = cfg->n_layer;
    /* MoE: each token runs top_k experts of 8 C^2 and the E x C router */
    double mlp = cfg->moe_experts > 0 ? cfg->moe_top_k * 8.0 * C * C + (double)cfg->moe_experts * C : 8.0 * C * C;
    double matmul_params = L * (4.0 * C * C + mlp) + C * cfg->vocab;
    return 6.0 * matmul_params + 12.0 * L * seq * C;
}
