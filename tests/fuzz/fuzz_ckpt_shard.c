/* libFuzzer target: a shard file. The input is rank-00000.bin of a 1-rank
 * checkpoint; unless bit 0 of byte 52 (reserved) is set, the header and
 * index checksums are recomputed so the fuzzer reaches the index and the
 * data. The shard is opened, its index gathered into a meta.json the way a
 * save publishes one, and every reader runs on the result.
 * ZERO_FUZZ_WRITE_SEED=FILE writes a valid shard (the seed corpus's). */
#include "fuzz_ckpt_common.h"
#include <zero/experimental.h>

static char dir[600], shard[700];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_path(dir, sizeof dir, "sh");
    json_decref(fb_write_checkpoint(dir, 1));
    snprintf(shard, sizeof shard, "%s/rank-00000.bin", dir);
    const char *seed = getenv("ZERO_FUZZ_WRITE_SEED");
    if (seed) {
        char *text = NULL;
        size_t n = 0;
        if (ckpt_read_file(shard, &text, &n) != ZERO_OK) abort();
        fz_write(seed, text, n);
        free(text);
    }
    return 0;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    uint8_t *buf = malloc(n + 1);
    memcpy(buf, data, n);
    if (n >= CKPT_HEADER_BYTES && !(buf[52] & 1)) {
        uint64_t off = le64(buf + 24), len = le64(buf + 32);
        if (off <= n && len <= n - off) put_le32(buf + 48, zero_crc32c(0, buf + off, (size_t)len));
        put_le32(buf + 60, zero_crc32c(0, buf, 60));
    }
    fz_write(shard, buf, n);
    free(buf);
    int fd;
    ckpt_header h;
    json_t *index = NULL;
    if (ckpt_shard_open(shard, &fd, &h, &index) == ZERO_OK) {
        close(fd);
        json_decref(index);
    }
    json_t *meta = fb_meta_skeleton(1);
    if (ckpt_meta_collect_files(meta, dir, 1) == ZERO_OK) {
        char *text = ckpt_meta_dump(meta);
        char p[700];
        snprintf(p, sizeof p, "%s/meta.json", dir);
        fz_write(p, text, strlen(text));
        free(text);
        fb_exercise(dir);
    }
    json_decref(meta);
    return 0;
}
