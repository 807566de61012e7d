/* libFuzzer target: zero-train's config parser (tools/train/train_config.c,
 * train_config_parse, used read-only), then the engine's loader on the
 * engine sections it keeps, as zero-train does. The first byte picks the
 * world size (1..8); the rest is the JSON config. Properties: nothing
 * crashes or leaks, a refused config comes with a message, and an accepted
 * one's effective config can be printed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <zero/engine.h>

#include "train_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1) return 0;
    int world = 1 + data[0] % 8;
    json_t *root = json_loadb((const char *)data + 1, n - 1, JSON_REJECT_DUPLICATES, NULL);
    if (!root) return 0;
    train_config cfg;
    char err[512];
    if (train_config_parse(&cfg, root, world, err, sizeof err) == 0) {
        char *engine_text = json_dumps(cfg.engine_json, JSON_COMPACT);
        zero_config zc = ZERO_CONFIG_INIT;
        if (engine_text) (void)zero_config_from_json(&zc, engine_text);
        free(engine_text);
        char *effective = cfg.effective ? json_dumps(cfg.effective, JSON_COMPACT) : NULL;
        if (!effective && cfg.effective) abort();
        free(effective);
    } else if (!memchr(err, 0, sizeof err) || !err[0]) {
        fprintf(stderr, "fuzz property failed: a refused config has no message\n");
        abort();
    }
    train_config_free(&cfg);
    json_decref(root);
    return 0;
}
