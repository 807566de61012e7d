/* libFuzzer target: meta.json. The input is the meta object's text; when it
 * parses as an object it is written under a valid checksum, so the checks
 * behind the checksum are what stands. The shard files beside it are a
 * small valid 2-rank checkpoint. ZERO_FUZZ_WRITE_SEED=FILE writes the
 * matching meta object (the seed corpus's). */
#include "fuzz_ckpt_common.h"

static char dir[600];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_path(dir, sizeof dir, "ck");
    json_t *meta = fb_write_checkpoint(dir, 2);
    const char *seed = getenv("ZERO_FUZZ_WRITE_SEED");
    if (seed) fb_write_seed_meta(seed, meta);
    json_decref(meta);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    fz_write_meta(dir, data, n);
    fb_exercise(dir);
    return 0;
}
