/* libFuzzer target: a checkpoint directory, as resolve / inspect / verify /
 * consolidate / reshard find it. The input is a list of records
 * [op u8][length u16 LE][bytes]:
 *   op 0  write ck/latest
 *   op 1  create ck/<name> (bytes mapped to [A-Za-z0-9._-]) and enter it
 *   op 2  write meta.json there (under a valid checksum when it is a JSON object)
 *   op 3  write the next rank-NNNNN.bin there, raw
 *   op 4  copy the fixture's two valid shard files there
 * ZERO_FUZZ_WRITE_SEED=FILE writes a valid checkpoint as such a list. */
#include "fuzz_ckpt_common.h"

static char base[600], ck[600];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

static void put_record(FILE *f, int op, const void *bytes, size_t n)
{
    uint8_t h[3] = {(uint8_t)op, (uint8_t)n, (uint8_t)(n >> 8)};
    fwrite(h, 1, 3, f);
    fwrite(bytes, 1, n, f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_path(base, sizeof base, "base");
    fz_path(ck, sizeof ck, "ck");
    json_t *meta = fb_write_checkpoint(base, 2);
    const char *seed = getenv("ZERO_FUZZ_WRITE_SEED");
    if (seed) {
        FILE *f = fopen(seed, "wb");
        if (!f) abort();
        const char *step = "step-00000001";
        char *text = json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS);
        put_record(f, 1, step, strlen(step));
        put_record(f, 4, "", 0);
        put_record(f, 2, text, strlen(text));
        put_record(f, 0, "step-00000001\n", 14);
        free(text);
        fclose(f);
    }
    json_decref(meta);
    return 0;
}

static void copy_file(const char *from, const char *to)
{
    char *text = NULL;
    size_t n = 0;
    if (ckpt_read_file(from, &text, &n) != ZERO_OK) abort();
    fz_write(to, text, n);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    ckpt_remove_tree(ck);
    if (ckpt_mkdir_p(ck) != ZERO_OK) abort();
    char cur[700], p[1400];
    snprintf(cur, sizeof cur, "%s", ck);
    int next_rank = 0, dirs = 0;
    size_t i = 0;
    while (i + 3 <= n) {
        int op = data[i] % 5;
        size_t len = (size_t)data[i + 1] | (size_t)data[i + 2] << 8;
        i += 3;
        if (len > n - i) len = n - i;
        const uint8_t *b = data + i;
        i += len;
        if (op == 0) {
            snprintf(p, sizeof p, "%s/latest", ck);
            fz_write(p, b, len);
        } else if (op == 1 && len >= 1 && len <= 40 && dirs < 8) {
            char name[41];
            for (size_t k = 0; k < len; k++) {
                uint8_t c = b[k];
                int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                         c == '_' || c == '.';
                name[k] = ok ? (char)c : '_';
            }
            name[len] = 0;
            if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) continue;
            snprintf(cur, sizeof cur, "%s/%s", ck, name);
            mkdir(cur, 0755);
            next_rank = 0;
            dirs++;
        } else if (op == 2) {
            fz_write_meta(cur, b, len);
        } else if (op == 3 && next_rank < 4) {
            snprintf(p, sizeof p, "%s/rank-%05d.bin", cur, next_rank++);
            fz_write(p, b, len);
        } else if (op == 4) {
            for (int r = 0; r < 2; r++) {
                char from[700];
                snprintf(from, sizeof from, "%s/rank-%05d.bin", base, r);
                snprintf(p, sizeof p, "%s/rank-%05d.bin", cur, r);
                copy_file(from, p);
            }
        }
    }
    char resolved[1024];
    if (zero_checkpoint_resolve(ck, resolved, sizeof resolved) == ZERO_OK)
        FB_ASSERT(strncmp(resolved, ck, strlen(ck)) == 0 && !strstr(resolved + strlen(ck), ".."),
                  "resolve left the checkpoint directory: %s", resolved);
    fb_exercise(ck);
    return 0;
}
