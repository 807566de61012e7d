/* The GPT on the libzero engine (see train_model.h). */
#include "train_model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zero/experimental.h> /* zero_fill_value and zero_axpy on the device: expert parallelism on CUDA */

#include "gpt_cuda.h"

/* The CUDA model exists only in builds that compiled it (meson defines
 * TRAIN_HAVE_GPT_CUDA); elsewhere --device cuda is refused before any call. */
#if TRAIN_HAVE_GPT_CUDA
#define CUDA_CALL(fn, ...) fn(__VA_ARGS__)
#else
#define CUDA_CALL(fn, ...) ZERO_UNSUPPORTED
#endif

struct train_model {
    gpt_config cfg;
    int micro;
    zero_engine *engine;
    zero_device *dev;
    /* CPU: the compute stream given to the engine (engine.h "streams"); the
     * model is host code, so it waits for this stream before it touches the
     * engine's buffers. CUDA: NULL, the default stream the CUDA GPT runs on. */
    zero_stream *compute;
    int cuda;
    zero_dtype dtype;
    int n_modules;
    int *module_id;          /* engine module id of GPT module m */
    gpt_workspace *ws;       /* CPU */
    gpt_cuda_workspace *cws; /* CUDA */
    /* 16-bit compute on the CPU: fp32 copies of the parameters and fp32
     * gradients. The embed module has its own (it is live throughout). */
    float *embed_p, *embed_g, *mod_p, *mod_g;
    size_t embed_numel, mod_numel;
    /* expert parallelism (train_model.h): gradients go through the fp32
     * scratch, the dense ones summed over ep before they reach the engine */
    zero_comm *ep;
    int ep_size, ep_rank;
    int grad_scratch;        /* gradients into mod_g / embed_g first (16-bit compute, or ep) */
    /* CUDA with ep > 1: this micro-step's gradients (device memory, the
     * compute dtype) before the dense ones are summed over ep */
    void *dev_embed_g, *dev_mod_g;
    struct expert_init {     /* an expert stack's slice of the whole stack's init */
        zero_init_spec whole;
        uint64_t first;
    } *expert_init;
};

static zero_status expert_fill(void *user, int param, const char *name, uint64_t begin, uint64_t end, float *out)
{
    (void)param;
    const struct expert_init *x = user;
    return zero_init_generate(&x->whole, name, x->first + begin, x->first + end, out);
}

static zero_status mfail(char *err, size_t n, zero_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return s;
}

/* The engine's own messages often already start with the call they failed in
 * ("engine finalize: ..."); name the call only when the message does not. */
static zero_status engine_fail(char *err, size_t n, zero_status s, const char *call, const char *msg)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "engine %s:", call);
    if (strncmp(msg, prefix, strlen(prefix)) == 0) return mfail(err, n, s, "%s", msg);
    return mfail(err, n, s, "%s %s", prefix, msg);
}

/* The CUDA model: bf16 compute runs the bf16 activation mode (bf16
 * storage, flash attention, cuBLASLt epilogues: gpt_cuda.h), as the CPU
 * path's bf16 compute multiplies bf16; fp32 compute keeps fp32 activations
 * and the unfused attention with bf16 tensor-core products. */
static zero_status train_cuda_workspace(train_model *m, const gpt_config *cfg, int micro, const gpt_checkpointing *ck)
{
#if TRAIN_HAVE_GPT_CUDA
    gpt_cuda_options o = GPT_CUDA_OPTIONS_BF16;
    if (m->dtype != ZERO_BF16) o.act_dtype = ZERO_F32, o.attention = GPT_CUDA_ATTN_UNFUSED;
    /* MoE blocks exchange over ep (a device comm: NCCL or STAGED) */
    return gpt_cuda_workspace_create_moe(&m->cws, cfg, micro, cfg->seq_len, m->dtype, &o, NULL, ck,
                                         m->ep_size > 1 ? m->ep : NULL);
#else
    (void)m, (void)cfg, (void)micro, (void)ck;
    return ZERO_UNSUPPORTED;
#endif
}

zero_status train_model_create(train_model **out, const gpt_config *cfg, int micro, uint64_t seed,
                               zero_engine *engine, zero_device *dev, int cuda, const gpt_checkpointing *ck,
                               zero_comm *ep, char *err, size_t en)
{
    *out = NULL;
    if (gpt_config_validate(cfg) != ZERO_OK) return mfail(err, en, ZERO_CONFIG, "model: %s", gpt_last_error());
    train_model *m = calloc(1, sizeof *m);
    if (!m) return mfail(err, en, ZERO_OUT_OF_MEMORY, "model: out of memory");
    m->cfg = *cfg;
    m->micro = micro;
    m->engine = engine;
    m->dev = dev;
    m->cuda = cuda;
    m->n_modules = gpt_num_modules(cfg);
    m->module_id = calloc((size_t)m->n_modules, sizeof *m->module_id);
    m->ep = ep;
    m->ep_size = ep ? zero_comm_get_size(ep) : 1;
    m->ep_rank = ep ? zero_comm_get_rank(ep) : 0;
    m->expert_init = calloc(gpt_num_params(cfg), sizeof *m->expert_init);
    zero_status s = ZERO_OK;
    if (!m->module_id || !m->expert_init) s = mfail(err, en, ZERO_OUT_OF_MEMORY, "model: out of memory");
    if (s == ZERO_OK && m->ep_size > 1 && (s = zero_engine_set_model_parallel(engine, ep)) != ZERO_OK)
        mfail(err, en, s, "engine set_model_parallel (ep): %s", zero_engine_last_error(engine));
    char name[64];
    for (int mod = 0; mod < m->n_modules && s == ZERO_OK; mod++) {
        gpt_module_name(cfg, mod, name, sizeof name);
        if ((s = zero_engine_add_module(engine, name, &m->module_id[mod])) != ZERO_OK)
            mfail(err, en, s, "engine add_module %s: %s", name, zero_engine_last_error(engine));
    }
    size_t np = gpt_num_params(cfg);
    for (size_t i = 0; i < np && s == ZERO_OK; i++) {
        gpt_param_info pi;
        gpt_param_info_get(cfg, i, &pi);
        /* GPT-2's init as a spec: each rank computes only what it keeps, at finalize */
        zero_init_spec init = gpt_param_init_spec(&pi, seed);
        if (pi.expert_stack && m->ep_size > 1) {
            /* this rank's experts: their rows of the whole stack's values */
            m->expert_init[i].whole = init;
            m->expert_init[i].first = (uint64_t)m->ep_rank * pi.numel;
            init.kind = ZERO_INIT_CALLBACK;
            init.fill = expert_fill;
            init.user = &m->expert_init[i];
            init.seed = seed ^ (uint64_t)m->ep_rank; /* the tag the engine's cross-rank check compares */
        }
        int64_t shape[2] = {(int64_t)pi.shape[0], (int64_t)pi.shape[1]};
        int pid = -1;
        s = zero_engine_add_param_init(engine, m->module_id[pi.module], pi.name, pi.ndim, shape, &init, &pid);
        if (s != ZERO_OK) mfail(err, en, s, "engine add_param %s: %s", pi.name, zero_engine_last_error(engine));
        else if (pid != (int)i) s = mfail(err, en, ZERO_INTERNAL, "engine gave %s the id %d, expected %zu", pi.name, pid, i);
        /* the dense tensors are the same on every ep rank: the norm counts ep rank 0's */
        if (s == ZERO_OK && m->ep_size > 1 && !pi.expert_stack && m->ep_rank > 0 &&
            (s = zero_engine_set_param_duplicate(engine, pid, 1)) != ZERO_OK)
            mfail(err, en, s, "engine set_param_duplicate %s: %s", pi.name, zero_engine_last_error(engine));
    }
    if (s == ZERO_OK && (s = zero_engine_finalize(engine)) != ZERO_OK)
        engine_fail(err, en, s, "finalize", zero_engine_last_error(engine));
    zero_plan_info plan;
    if (s == ZERO_OK && (s = zero_engine_get_plan_info(engine, &plan)) != ZERO_OK)
        engine_fail(err, en, s, "plan_info", zero_engine_last_error(engine));
    if (s == ZERO_OK) {
        m->dtype = plan.compute_dtype;
        if (cuda) {
            if (m->dtype == ZERO_F16) {
                s = mfail(err, en, ZERO_UNSUPPORTED,
                          "fp16: the CUDA model takes fp32 or bf16 parameters; use bf16 on --device cuda");
            } else if ((s = train_cuda_workspace(m, cfg, micro, ck)) != ZERO_OK) {
                mfail(err, en, s, "model: %s", gpt_last_error());
            }
            m->grad_scratch = m->ep_size > 1;
            if (s == ZERO_OK && m->grad_scratch) {
                size_t es = zero_dtype_size(m->dtype), mod = 0;
                for (int i = 1; i < m->n_modules; i++)
                    if (gpt_module_elements(cfg, i) > mod) mod = gpt_module_elements(cfg, i);
                if ((s = zero_device_alloc(dev, gpt_module_elements(cfg, GPT_MODULE_EMBED) * es, &m->dev_embed_g)) !=
                        ZERO_OK ||
                    (s = zero_device_alloc(dev, mod * es, &m->dev_mod_g)) != ZERO_OK)
                    mfail(err, en, s, "model: the device gradient scratch of expert parallelism: %s",
                          zero_last_error());
            }
        } else {
            if ((s = zero_stream_create(dev, &m->compute)) != ZERO_OK ||
                (s = zero_engine_set_compute_stream(engine, m->compute)) != ZERO_OK)
                mfail(err, en, s, "compute stream: %s", zero_last_error());
            if (s == ZERO_OK &&
                (s = gpt_workspace_create_moe(&m->ws, cfg, micro, cfg->seq_len, ck, m->ep_size > 1 ? ep : NULL)) !=
                    ZERO_OK)
                mfail(err, en, s, "model: %s", gpt_last_error());
            /* bf16 compute: the matmuls multiply bf16 (where the CPU can), as on a GPU */
            if (s == ZERO_OK && m->dtype == ZERO_BF16 && (s = gpt_workspace_set_matmul_dtype(m->ws, ZERO_BF16)) != ZERO_OK)
                mfail(err, en, s, "model: %s", gpt_last_error());
            m->grad_scratch = m->dtype != ZERO_F32 || m->ep_size > 1;
            if (s == ZERO_OK && m->grad_scratch) {
                m->embed_numel = gpt_module_elements(cfg, GPT_MODULE_EMBED);
                for (int mod = 1; mod < m->n_modules; mod++)
                    if (gpt_module_elements(cfg, mod) > m->mod_numel) m->mod_numel = gpt_module_elements(cfg, mod);
                m->embed_p = malloc(m->embed_numel * sizeof(float));
                m->embed_g = malloc(m->embed_numel * sizeof(float));
                m->mod_p = malloc(m->mod_numel * sizeof(float));
                m->mod_g = malloc(m->mod_numel * sizeof(float));
                if (!m->embed_p || !m->embed_g || !m->mod_p || !m->mod_g)
                    s = mfail(err, en, ZERO_OUT_OF_MEMORY, "model: out of memory for the fp32 copies");
            }
        }
    }
    if (s != ZERO_OK) {
        train_model_destroy(m);
        return s;
    }
    *out = m;
    return ZERO_OK;
}

void train_model_destroy(train_model *m)
{
    if (!m) return;
    if (m->compute) {
        (void)zero_engine_set_compute_stream(m->engine, NULL); /* fails harmlessly if the engine is gone */
        zero_stream_destroy(m->compute);
    }
    gpt_workspace_destroy(m->ws);
    if (m->dev_embed_g) zero_device_free(m->dev, m->dev_embed_g);
    if (m->dev_mod_g) zero_device_free(m->dev, m->dev_mod_g);
#if TRAIN_HAVE_GPT_CUDA
    gpt_cuda_workspace_destroy(m->cws);
#endif
    free(m->module_id);
    free(m->embed_p);
    free(m->embed_g);
    free(m->mod_p);
    free(m->mod_g);
    free(m->expert_init);
    free(m);
}

void train_model_activation_bytes(const train_model *m, gpt_activation_bytes *now, gpt_activation_bytes *without)
{
    memset(now, 0, sizeof *now);
    memset(without, 0, sizeof *without);
#if TRAIN_HAVE_GPT_CUDA
    if (m->cws) {
        gpt_cuda_workspace_activation_bytes(m->cws, now);
        gpt_cuda_activation_bytes_for(&m->cfg, m->micro, m->cfg.seq_len, m->dtype, NULL, without);
        return;
    }
#endif
    if (!m->ws) return;
    gpt_workspace_activation_bytes(m->ws, now);
    gpt_activation_bytes_for(&m->cfg, m->micro, m->cfg.seq_len, NULL, without);
}

/* ---------------------------------------------------------------- tensors */

/* The module's parameter (grads = 0) or gradient (grads = 1) pointers. For
 * 16-bit compute on the CPU, parameters and the gradients accumulated so far
 * are widened into fp32 `scratch` (the device's vectorized cast); the model
 * accumulates into it and flush_grads rounds it back once. With ep > 1 the
 * gradient scratch starts at zero instead: this micro-step's gradients alone
 * are summed over ep before flush_grads adds them to the engine's. On CUDA
 * (ep > 1 only) the scratch is device memory of the compute dtype, zeroed on
 * the default stream the model runs on. */
static zero_status module_tensors(train_model *m, int mod, int grads, void *scratch, gpt_tensors *t,
                                  void **engine_ptrs, char *err, size_t en)
{
    memset(t, 0, sizeof *t);
    size_t off = 0;
    for (int i = 0; i < gpt_module_num_tensors(&m->cfg, mod); i++) {
        int pid = (int)gpt_param_position(&m->cfg, mod, i);
        void *p = NULL;
        zero_status s = grads ? zero_engine_param_grad(m->engine, pid, &p) : zero_engine_param_data(m->engine, pid, &p);
        if (s != ZERO_OK)
            return mfail(err, en, s, "engine %s: %s", grads ? "param_grad" : "param_data",
                         zero_engine_last_error(m->engine));
        if (engine_ptrs) engine_ptrs[i] = p;
        if (!scratch) {
            t->t[i] = p;
            continue;
        }
        gpt_param_info pi;
        gpt_param_info_get(&m->cfg, (size_t)pid, &pi);
        if (m->cuda) {
            void *dz = (char *)scratch + off * zero_dtype_size(m->dtype);
            zero_status fs = zero_fill_value(m->dev, dz, m->dtype, pi.numel, 0.0f, NULL);
            if (fs != ZERO_OK) return mfail(err, en, fs, "zeroing the gradient scratch of %s: %s", pi.name, zero_last_error());
            t->t[i] = dz;
            off += pi.numel;
            continue;
        }
        float *dst = (float *)scratch + off;
        if (grads && m->ep_size > 1) {
            memset(dst, 0, pi.numel * sizeof(float));
        } else {
            zero_status cs = zero_cast(m->dev, p, m->dtype, dst, ZERO_F32, pi.numel, m->compute);
            if (cs != ZERO_OK) return mfail(err, en, cs, "widening %s to fp32: %s", pi.name, zero_last_error());
        }
        t->t[i] = dst;
        off += pi.numel;
    }
    /* the host model reads and writes these next: wait for the hand-off */
    zero_status ss = m->compute ? zero_stream_sync(m->compute) : ZERO_OK;
    if (ss != ZERO_OK) return mfail(err, en, ss, "compute stream: %s", zero_last_error());
    return ZERO_OK;
}

/* CUDA, ep > 1: the dense gradients of this micro-step summed over ep (a
 * device comm) in place, then every one added to the engine's (zero_axpy:
 * in fp32, rounded once to the compute dtype; with bf16 compute the
 * micro-step's gradient was rounded to bf16 already, where the CPU path
 * keeps it fp32 until this add). */
static zero_status flush_grads_cuda(train_model *m, int mod, const gpt_tensors *g, void **engine_ptrs, char *err,
                                    size_t en)
{
    /* the comm reads the buffers directly: the model's work on the default stream must be done */
    zero_status ds = zero_device_sync(m->dev);
    if (ds != ZERO_OK) return mfail(err, en, ds, "device sync before the ep gradient sum: %s", zero_last_error());
    for (int i = 0; i < gpt_module_num_tensors(&m->cfg, mod); i++) {
        gpt_param_info pi;
        gpt_param_info_get(&m->cfg, gpt_param_position(&m->cfg, mod, i), &pi);
        if (!pi.expert_stack) {
            zero_status s = zero_allreduce(m->ep, g->t[i], g->t[i], pi.numel, m->dtype, ZERO_SUM);
            if (s != ZERO_OK)
                return mfail(err, en, s, "summing d %s over the ep group: %s", pi.name, zero_comm_last_error(m->ep));
        }
        zero_status s = zero_axpy(m->dev, 1.0f, g->t[i], engine_ptrs[i], m->dtype, pi.numel, NULL);
        if (s != ZERO_OK) return mfail(err, en, s, "adding the gradient of %s: %s", pi.name, zero_last_error());
    }
    return ZERO_OK;
}

/* Back into the engine's buffers. 16-bit CPU: round the fp32 gradients (the
 * engine's, widened, plus this micro-step's) back. ep > 1: sum this
 * micro-step's dense gradients over ep first, then add them to the engine's
 * (fp32, or widened and rounded once). */
static zero_status flush_grads(train_model *m, int mod, const gpt_tensors *g, void **engine_ptrs, char *err,
                               size_t en)
{
    if (!m->grad_scratch) return ZERO_OK;
    if (m->cuda) return flush_grads_cuda(m, mod, g, engine_ptrs, err, en);
    for (int i = 0; i < gpt_module_num_tensors(&m->cfg, mod); i++) {
        gpt_param_info pi;
        gpt_param_info_get(&m->cfg, gpt_param_position(&m->cfg, mod, i), &pi);
        float *src = g->t[i];
        if (m->ep_size == 1) {
            zero_status s = zero_cast(m->dev, src, ZERO_F32, engine_ptrs[i], m->dtype, pi.numel, m->compute);
            if (s != ZERO_OK) return mfail(err, en, s, "rounding the gradient of %s: %s", pi.name, zero_last_error());
            continue;
        }
        /* host code from here on: what the compute stream still has queued must be done first */
        zero_status ss = zero_stream_sync(m->compute);
        if (ss != ZERO_OK) return mfail(err, en, ss, "compute stream: %s", zero_last_error());
        if (!pi.expert_stack) {
            zero_status s = zero_allreduce(m->ep, src, src, pi.numel, ZERO_F32, ZERO_SUM);
            if (s != ZERO_OK)
                return mfail(err, en, s, "summing d %s over the ep group: %s", pi.name, zero_comm_last_error(m->ep));
        }
        if (m->dtype == ZERO_F32) {
            float *dst = engine_ptrs[i];
            for (size_t k = 0; k < pi.numel; k++) dst[k] += src[k];
            continue;
        }
        uint16_t *dst = engine_ptrs[i];
        for (size_t k = 0; k < pi.numel; k++) {
            float v = (m->dtype == ZERO_BF16 ? zero_bf16_to_f32(dst[k]) : zero_f16_to_f32(dst[k])) + src[k];
            dst[k] = m->dtype == ZERO_BF16 ? zero_f32_to_bf16(v) : zero_f32_to_f16(v);
        }
    }
    return ZERO_OK;
}

#define TRY(call)                                                                                                \
    do {                                                                                                         \
        zero_status t_ = (call);                                                                                 \
        if (t_ != ZERO_OK) return t_;                                                                            \
    } while (0)
#define ENG(call, what)                                                                                          \
    do {                                                                                                         \
        zero_status s_ = (call);                                                                                 \
        if (s_ != ZERO_OK) return mfail(err, en, s_, "%s: %s", what, zero_engine_last_error(m->engine));          \
    } while (0)
#define MODEL(call, what)                                                                                        \
    do {                                                                                                         \
        zero_status s_ = (call);                                                                                 \
        if (s_ != ZERO_OK) return mfail(err, en, s_, "model %s: %s", what, gpt_last_error());                     \
    } while (0)

/* Forward through every module; leaves embed and final gathered. */
static zero_status forward(train_model *m, const int32_t *tokens, const int32_t *targets, gpt_tensors *embed_p,
                           gpt_tensors *final_p, float *loss, char *err, size_t en)
{
    int sixteen = !m->cuda && m->dtype != ZERO_F32;
    int fin = gpt_module_final(&m->cfg);
    ENG(zero_engine_gather(m->engine, m->module_id[GPT_MODULE_EMBED]), "engine gather embed");
    TRY(module_tensors(m, GPT_MODULE_EMBED, 0, sixteen ? m->embed_p : NULL, embed_p, NULL, err, en));
    if (m->cuda) MODEL(CUDA_CALL(gpt_cuda_forward_begin, m->cws, tokens, targets, embed_p), "forward embed");
    else MODEL(gpt_forward_begin(m->ws, tokens, targets, embed_p), "forward embed");
    for (int l = 0; l < m->cfg.n_layer; l++) {
        int mod = gpt_module_block(l);
        gpt_tensors p;
        ENG(zero_engine_gather(m->engine, m->module_id[mod]), "engine gather block");
        TRY(module_tensors(m, mod, 0, sixteen ? m->mod_p : NULL, &p, NULL, err, en));
        if (m->cuda) MODEL(CUDA_CALL(gpt_cuda_forward_block, m->cws, l, &p), "forward block");
        else MODEL(gpt_forward_block(m->ws, l, &p), "forward block");
        ENG(zero_engine_release(m->engine, m->module_id[mod]), "engine release block");
    }
    ENG(zero_engine_gather(m->engine, m->module_id[fin]), "engine gather final");
    TRY(module_tensors(m, fin, 0, sixteen ? m->mod_p : NULL, final_p, NULL, err, en));
    if (m->cuda) MODEL(CUDA_CALL(gpt_cuda_forward_end, m->cws, final_p, embed_p, loss), "forward final");
    else MODEL(gpt_forward_end(m->ws, final_p, embed_p, loss), "forward final");
    return ZERO_OK;
}

zero_status train_model_micro_step(train_model *m, const int32_t *tokens, const int32_t *targets, float dloss,
                                   float *loss, char *err, size_t en)
{
    int sixteen = !m->cuda && m->dtype != ZERO_F32, gs = m->grad_scratch;
    int fin = gpt_module_final(&m->cfg);
    void *mod_g = m->cuda ? m->dev_mod_g : (void *)m->mod_g, *embed_g = m->cuda ? m->dev_embed_g : (void *)m->embed_g;
    gpt_tensors ep, eg, fp, fg;
    void *eptr[GPT_MAX_MODULE_TENSORS], *mptr[GPT_MAX_MODULE_TENSORS];
    TRY(forward(m, tokens, targets, &ep, &fp, loss, err, en));
    /* ep: gradients of loss / ep (train_model.h) */
    dloss /= (float)m->ep_size;
    /* backward: the head and final LayerNorm, then the blocks in reverse,
     * then the embeddings, whose gradient (head + embedding) is complete last */
    TRY(module_tensors(m, fin, 1, gs ? mod_g : NULL, &fg, mptr, err, en));
    TRY(module_tensors(m, GPT_MODULE_EMBED, 1, gs ? embed_g : NULL, &eg, eptr, err, en));
    if (m->cuda) MODEL(CUDA_CALL(gpt_cuda_backward_end, m->cws, dloss, &fp, &fg, &ep, &eg), "backward final");
    else MODEL(gpt_backward_end(m->ws, dloss, &fp, &fg, &ep, &eg), "backward final");
    TRY(flush_grads(m, fin, &fg, mptr, err, en));
    ENG(zero_engine_grads_ready(m->engine, m->module_id[fin]), "engine grads_ready final");
    ENG(zero_engine_release(m->engine, m->module_id[fin]), "engine release final");
    for (int l = m->cfg.n_layer - 1; l >= 0; l--) {
        int mod = gpt_module_block(l);
        gpt_tensors p, g;
        ENG(zero_engine_gather(m->engine, m->module_id[mod]), "engine gather block");
        TRY(module_tensors(m, mod, 0, sixteen ? m->mod_p : NULL, &p, NULL, err, en));
        TRY(module_tensors(m, mod, 1, gs ? mod_g : NULL, &g, mptr, err, en));
        if (m->cuda) MODEL(CUDA_CALL(gpt_cuda_backward_block, m->cws, l, &p, &g), "backward block");
        else MODEL(gpt_backward_block(m->ws, l, &p, &g), "backward block");
        TRY(flush_grads(m, mod, &g, mptr, err, en));
        ENG(zero_engine_grads_ready(m->engine, m->module_id[mod]), "engine grads_ready block");
        ENG(zero_engine_release(m->engine, m->module_id[mod]), "engine release block");
    }
    if (m->cuda) MODEL(CUDA_CALL(gpt_cuda_backward_begin, m->cws, &eg), "backward embed");
    else MODEL(gpt_backward_begin(m->ws, &eg), "backward embed");
    TRY(flush_grads(m, GPT_MODULE_EMBED, &eg, eptr, err, en));
    ENG(zero_engine_grads_ready(m->engine, m->module_id[GPT_MODULE_EMBED]), "engine grads_ready embed");
    ENG(zero_engine_release(m->engine, m->module_id[GPT_MODULE_EMBED]), "engine release embed");
    return ZERO_OK;
}

zero_status train_model_logits(train_model *m, const int32_t *tokens, float *logits, char *err, size_t en)
{
    gpt_tensors ep, fp;
    float loss;
    TRY(forward(m, tokens, NULL, &ep, &fp, &loss, err, en));
    size_t n = (size_t)m->micro * (size_t)m->cfg.seq_len * (size_t)m->cfg.vocab;
    if (m->cuda) MODEL(CUDA_CALL(gpt_cuda_workspace_logits, m->cws, logits), "logits");
    else memcpy(logits, gpt_workspace_logits(m->ws), n * sizeof(float));
    ENG(zero_engine_release(m->engine, m->module_id[gpt_module_final(&m->cfg)]), "engine release final");
    ENG(zero_engine_release(m->engine, m->module_id[GPT_MODULE_EMBED]), "engine release embed");
    return ZERO_OK;
}
