/* libFuzzer target: the engine's JSON config loader, zero_config_from_json.
 * Property: a config it accepts passes the engine's own validation when
 * loaded again from the same text (loading is deterministic). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zero/engine.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    char *text = malloc(n + 1);
    memcpy(text, data, n);
    text[n] = 0;
    zero_config a = ZERO_CONFIG_INIT, b = ZERO_CONFIG_INIT;
    zero_status sa = zero_config_from_json(&a, text);
    zero_status sb = zero_config_from_json(&b, text);
    if (sa != sb || (sa == ZERO_OK && memcmp(&a, &b, sizeof a) != 0)) {
        fprintf(stderr, "fuzz property failed: zero_config_from_json is not deterministic\n");
        abort();
    }
    /* NULL arguments are refused, not dereferenced */
    if (zero_config_from_json(NULL, text) == ZERO_OK || zero_config_from_json(&a, NULL) == ZERO_OK) abort();
    free(text);
    return 0;
}
