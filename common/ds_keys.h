/* Internal: what libzero knows of DeepSpeed's config keys that it does not
 * implement, so that a DeepSpeed config runs unchanged (docs/engine.md,
 * "DeepSpeed configs"). One copy serves the engine's JSON loader and
 * zero-train's config (compiled into both). */
#ifndef ZERO_COMMON_DS_KEYS_H
#define ZERO_COMMON_DS_KEYS_H

#include <jansson.h>

typedef enum zero_ds_verdict {
    ZERO_DS_UNKNOWN = 0, /* not a DeepSpeed key of that section (as far as libzero knows) */
    ZERO_DS_ACCEPT = 1,  /* DeepSpeed's, and as given it changes nothing libzero computes:
                            accepted, named in the one warning */
    ZERO_DS_REFUSE = 2,  /* DeepSpeed's, and as given it would change the training math, which
                            libzero does not implement: refused by name (*why says what to do) */
} zero_ds_verdict;

/* The verdict on `key` = `value` in `section` ("" for the top level,
 * "zero_optimization", "zero_optimization.offload_optimizer", "fp16",
 * "bf16", "optimizer.params"). *why (may be NULL) gets a static sentence
 * for ZERO_DS_REFUSE. */
zero_ds_verdict zero_ds_key(const char *section, const char *key, const json_t *value, const char **why);

/* DeepSpeed's keys of `section` that libzero does not implement, into
 * out[0 .. cap - 1], NULL-terminated if room; returns how many. For "did
 * you mean" lists. */
int zero_ds_section_keys(const char *section, const char **out, int cap);

/* HF Trainer's "auto": a string "auto" stands for a value the trainer
 * fills in. Remove every such member from `root` (recursively, in place),
 * appending each one's dotted path to `paths` (", "-separated, truncated
 * with "..." past `size`). Returns how many were removed. */
int zero_ds_strip_auto(json_t *root, char *paths, size_t size);

#endif
