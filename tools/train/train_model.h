/* The GPT on the libzero engine: registration and one micro-step.
 *
 * Every parameter lives in the engine, one engine module per GPT module
 * (embed, block.i, final), registered in the model's parameter order with
 * the model's deterministic initialisation. A micro-step walks the modules
 * the way ZeRO stage 3 needs: gather, compute, release; backward in reverse
 * with grads_ready per module. The tied embedding (read by the first and the
 * last layer) stays gathered from the start of forward to the end of
 * backward, and its gradient is reported ready last.
 *
 * Compute: the CPU model is fp32. With bf16/fp16 compute on the CPU, each
 * module's parameters are widened into an fp32 scratch before use and its
 * fp32 gradient rounded once into the engine's 16-bit gradient buffer, so
 * the engine's mixed-precision path (16-bit params and grads, fp32 master)
 * runs for real while the arithmetic stays fp32. On CUDA the model takes
 * f32/bf16 device pointers directly.
 *
 * Mixture of experts with expert parallelism (cfg->moe_ep > 1, as
 * DeepSpeed-MoE): `ep` is this rank's group of moe_ep consecutive ranks,
 * the engine runs over the expert-data-parallel group (the ranks holding
 * the same experts) and holds this rank's experts and the dense tensors;
 * ep is the engine's model-parallel group (the dense tensors counted once
 * in the norm: duplicates on ep ranks > 0). Every gradient is taken of
 * loss / ep, and the dense ones (embeddings, attention, LayerNorms, router)
 * are summed over ep before the engine reduces them over its group: so
 * both are the average over all dp ranks' micro-batches, as one data-parallel
 * model would have them. */
#ifndef TRAIN_MODEL_H
#define TRAIN_MODEL_H

#include <stdint.h>
#include <zero/zero.h>

#include "gpt.h"

typedef struct train_model train_model;

/* Register the model's parameters with `engine` (not finalized) and finalize
 * (collective). `cuda` selects the CUDA workspace; `ck` activation
 * checkpointing (NULL: none). */
zero_status train_model_create(train_model **out, const gpt_config *cfg, int micro_batch, uint64_t seed,
                               zero_engine *engine, zero_device *dev, int cuda, const gpt_checkpointing *ck,
                               zero_comm *ep, char *err, size_t err_size);
void train_model_destroy(train_model *m);

/* One micro-step: forward with loss, backward of dloss * loss, grads_ready
 * on every module. Collective (stage-3 gathers, reductions). */
zero_status train_model_micro_step(train_model *m, const int32_t *tokens, const int32_t *targets, float dloss,
                                   float *loss, char *err, size_t err_size);

/* Forward only (no targets needed); logits (micro*seq*vocab floats) into
 * host memory. Collective at stage 3. */
zero_status train_model_logits(train_model *m, const int32_t *tokens, float *logits, char *err, size_t err_size);

/* Bytes of the activation workspace (not counted by the engine), by kind:
 * as allocated, and what the same workspace would take without checkpointing. */
void train_model_activation_bytes(const train_model *m, gpt_activation_bytes *now, gpt_activation_bytes *without);

#endif
