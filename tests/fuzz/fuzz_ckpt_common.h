/* The checkpoint fuzz targets' fixture: a small valid checkpoint written by
 * the library's own shard writer, and what every target runs on whatever
 * directory the input became, with the properties it asserts. */
#ifndef ZERO_FUZZ_CKPT_COMMON_H
#define ZERO_FUZZ_CKPT_COMMON_H

#include "fuzz_util.h"

static const char *const FB_NAMES[] = {"a.weight", "a.bias", "b.weight"};
static const int64_t FB_SHAPES[][2] = {{6, 5}, {6, 1}, {4, 6}};
#define FB_NP 3

static uint64_t fb_numel(int p) { return (uint64_t)(FB_SHAPES[p][0] * FB_SHAPES[p][1]); }

/* meta.json's object without "files" and "segments" (collect_files adds them). */
static json_t *fb_meta_skeleton(int world)
{
    json_t *m = json_object();
    json_object_set_new(m, "magic", json_string(CKPT_META_MAGIC));
    json_object_set_new(m, "format_version", json_integer(ZERO_CHECKPOINT_FORMAT_VERSION));
    json_object_set_new(m, "library_version", json_string("fuzz"));
    json_object_set_new(m, "step", json_integer(1));
    json_object_set_new(m, "world_size", json_integer(world));
    json_object_set_new(m, "stage", json_integer(3));
    json_object_set_new(m, "compute_dtype", json_string("f32"));
    json_object_set_new(m, "kinds", json_pack("[s,s,s]", "master", "exp_avg", "exp_avg_sq"));
    json_t *params = json_array();
    for (int p = 0; p < FB_NP; p++) {
        json_t *shape = FB_SHAPES[p][1] == 1 ? json_pack("[I]", (json_int_t)FB_SHAPES[p][0])
                                             : json_pack("[I,I]", (json_int_t)FB_SHAPES[p][0],
                                                         (json_int_t)FB_SHAPES[p][1]);
        json_array_append_new(params, json_pack("{s:s,s:o,s:s}", "name", FB_NAMES[p], "shape", shape, "module",
                                                p < 2 ? "a" : "b"));
    }
    json_object_set_new(m, "params", params);
    json_object_set_new(m, "engine", json_pack("{s:i,s:i,s:f,s:i,s:i,s:f}", "step", 1, "skipped_steps", 0,
                                               "loss_scale", 1.0, "hysteresis_left", 2, "good_steps", 1, "lr", 1e-3));
    json_object_set_new(m, "user", json_object());
    return m;
}

/* Write dir/rank-*.bin for `world` ranks (rank r holding [numel r / world,
 * numel (r + 1) / world) of every parameter, all three kinds) and return
 * the matching meta object (caller json_decref's it). */
static json_t *fb_write_checkpoint(const char *dir, int world)
{
    if (ckpt_mkdir_p(dir) != ZERO_OK) abort();
    float data[64];
    for (int r = 0; r < world; r++) {
        char p[700];
        snprintf(p, sizeof p, "%s/rank-%05d.bin", dir, r);
        ckpt_writer w;
        if (ckpt_writer_open(&w, p, (uint32_t)r, (uint32_t)world, 0) != ZERO_OK) abort();
        for (int q = 0; q < FB_NP; q++) {
            uint64_t b = fb_numel(q) * (uint64_t)r / (uint64_t)world, e = fb_numel(q) * (uint64_t)(r + 1) / (uint64_t)world;
            for (int k = 0; k < CKPT_NUM_KINDS && e > b; k++) {
                for (uint64_t i = b; i < e; i++) data[i - b] = 0.25f * (float)k + 0.01f * (float)q + (float)i;
                if (ckpt_writer_segment(&w, q, k, b, data, e - b) != ZERO_OK) abort();
            }
        }
        if (ckpt_writer_close(&w, NULL) != ZERO_OK) abort();
    }
    json_t *meta = fb_meta_skeleton(world);
    if (ckpt_meta_collect_files(meta, dir, world) != ZERO_OK) abort();
    return meta;
}

static void fb_write_seed_meta(const char *path, json_t *meta)
{
    char *t = json_dumps(meta, JSON_INDENT(1) | JSON_SORT_KEYS);
    fz_write(path, t, strlen(t));
    free(t);
}

/* A failed property: report it like a sanitizer would, so libFuzzer saves the input. */
#define FB_ASSERT(cond, ...)                                                            \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "fuzz property failed: %s: ", #cond);                       \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                      \
            abort();                                                                    \
        }                                                                               \
    } while (0)

static const char *const FB_KINDS[] = {"master", "exp_avg", "exp_avg_sq"};

/* Every offline reader on `path`. Properties: whatever verify accepts,
 * read_tensor reads whole (every parameter, every kind it lists),
 * consolidate writes, and reshard rewrites into a checkpoint that verifies. */
static void fb_exercise(const char *path)
{
    zero_status vs = zero_checkpoint_verify(path);
    char *text = NULL;
    zero_status is = zero_checkpoint_inspect(path, &text);
    FB_ASSERT(vs != ZERO_OK || is == ZERO_OK, "inspect refused what verify accepted: %s", zero_last_error());
    json_t *m = is == ZERO_OK ? json_loads(text, 0, NULL) : NULL;
    free(text); /* zero_checkpoint_free is free(), in checkpoint_load.c (linked to the engine) */
    size_t i, d, k;
    json_t *p, *x, *kind;
    json_array_foreach(json_object_get(m, "params"), i, p) {
        uint64_t n = 1;
        json_array_foreach(json_object_get(p, "shape"), d, x) {
            if (__builtin_mul_overflow(n, (uint64_t)json_integer_value(x), &n)) n = UINT64_MAX;
        }
        if (i >= 8 || n > (1u << 20)) break; /* inspect accepted it: the files hold it, but keep runs fast */
        float *buf = malloc((n + 1) * sizeof *buf);
        json_array_foreach(json_object_get(m, "kinds"), k, kind) {
            zero_status rs = zero_checkpoint_read_tensor(path, json_string_value(json_object_get(p, "name")),
                                                         json_string_value(kind), buf, n);
            FB_ASSERT(vs != ZERO_OK || rs == ZERO_OK, "read_tensor failed on a verified checkpoint: %s",
                      zero_last_error());
        }
        /* a wrong element count is refused, never read */
        FB_ASSERT(zero_checkpoint_read_tensor(path, json_string_value(json_object_get(p, "name")), "master", buf,
                                              n + 1) != ZERO_OK,
                  "read_tensor accepted numel + 1");
        free(buf);
    }
    json_decref(m);
    char out[700], rd[700];
    fz_path(out, sizeof out, "out.safetensors");
    zero_status cs = zero_checkpoint_consolidate(path, out);
    FB_ASSERT(vs != ZERO_OK || cs == ZERO_OK, "consolidate failed on a verified checkpoint: %s", zero_last_error());
    unlink(out);
    fz_path(rd, sizeof rd, "resharded");
    zero_status rs = zero_checkpoint_reshard(path, rd, 3);
    FB_ASSERT(vs != ZERO_OK || rs == ZERO_OK, "reshard failed on a verified checkpoint: %s", zero_last_error());
    if (rs == ZERO_OK) FB_ASSERT(zero_checkpoint_verify(rd) == ZERO_OK, "a resharded checkpoint fails verify: %s",
                                 zero_last_error());
    ckpt_remove_tree(rd);
}

#endif
