/* Checkpoints that lie, and checkpoint calls made at the wrong moment
 * (issue 10's B1-B5 and their siblings), on real ranks (tests/mpirun.sh N).
 *
 * Each hostile meta.json below carries a valid checksum (the test recomputes
 * it), so only the library's own checks stand between it and the data:
 *   - a shape dimension < 1, a shape whose product wraps, a parameter larger
 *     than the files, a segment whose start + count or offset + 4 count wraps
 *     modulo 2^64 (the [2^62 + 1] in segments of 2^62 and 1 case), segments
 *     sharing bytes, a file whose size is not what meta.json says, a file
 *     listed twice, a world size that is not the number of files, a
 *     parameter named twice: each ZERO_CORRUPT with its
 *     message, from verify, inspect, read_tensor and consolidate (which
 *     leaves no output file);
 *   - a shard header whose index_offset + index_bytes wraps: ZERO_CORRUPT
 *     "header sizes are inconsistent", not ZERO_OUT_OF_MEMORY;
 *   - a parameter named __metadata__: verify passes, consolidate refuses it
 *     with ZERO_UNSUPPORTED naming it;
 *   - engine scalars that load would refuse (loss_scale 0, hysteresis_left
 *     beyond int, lr missing): verify and reshard refuse them too (ZERO_CORRUPT), and a
 *     load refuses them on every rank before it writes any state;
 *   - save and load while a module is gathered or a step is half done:
 *     ZERO_INVALID_STATE naming the module on every rank, nothing written;
 *   - read_param is collective at every stage: different parameters on two
 *     ranks give ZERO_MISMATCH (engine still usable), an unknown one on one
 *     rank fails on all, and a call on rank 0 alone ends in ZERO_TIMEOUT
 *     whose message names the rule, at stages 0-3 alike. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <zero/checkpoint.h>
#include <zero/zero.h>
#include <zero/experimental.h>

#include "check.h"
#include "ckpt_test_util.h"

static const char *const NAMES[] = {"a.weight", "a.bias", "b.weight"};
static const int64_t SHAPES[][2] = {{24, 10}, {24, 1}, {16, 24}};
#define NP 3

static zero_engine *make_engine(zero_comm *comm, zero_device *dev, int stage, int accumulation)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.reduce_bucket_size = 300;
    c.stage3_param_persistence_threshold = 30;
    c.gradient_accumulation_steps = accumulation;
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return NULL;
    int m;
    CHECK_OK(zero_engine_add_module(e, "a", &m));
    CHECK_OK(zero_engine_add_module(e, "b", &m));
    for (int p = 0; p < NP; p++) {
        int nd = SHAPES[p][1] == 1 ? 1 : 2;
        float *init = malloc((size_t)(SHAPES[p][0] * SHAPES[p][1]) * sizeof *init);
        for (int64_t i = 0; i < SHAPES[p][0] * SHAPES[p][1]; i++) init[i] = 0.5f * (float)p + 0.001f * (float)i;
        CHECK_OK(zero_engine_add_param(e, p < 2 ? 0 : 1, NAMES[p], nd, SHAPES[p], init, NULL));
        free(init);
    }
    CHECK_OK(zero_engine_finalize(e));
    return e;
}

static int run(const char *cmd)
{
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "%s", cmd);
    return rc;
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* ---------------------------------------------------------------- meta.json edits */

/* Rewrite dir/meta.json after `edit` changed the meta object, with the
 * checksum recomputed the way the library computes it (CRC32C of the compact,
 * key-sorted text). */
static void rewrite_meta(const char *dir, void (*edit)(json_t *meta))
{
    char p[600];
    snprintf(p, sizeof p, "%s/meta.json", dir);
    json_t *w = json_load_file(p, 0, NULL);
    json_t *meta = json_object_get(w, "meta");
    CHECK(meta != NULL);
    if (!meta) return;
    edit(meta);
    char *canon = json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS);
    json_object_set_new(w, "crc32c", json_integer(zero_crc32c(0, canon, strlen(canon))));
    free(canon);
    CHECK(json_dump_file(w, p, JSON_INDENT(1) | JSON_SORT_KEYS) == 0);
    json_decref(w);
}

static json_t *param_obj(json_t *meta, int p) { return json_array_get(json_object_get(meta, "params"), (size_t)p); }

static void set_shape1(json_t *meta, int p, json_int_t n)
{
    json_object_set_new(param_obj(meta, p), "shape", json_pack("[I]", n));
}

/* The segments of (param, kind 0) first in meta's list: meta keeps file order,
 * and param 0's master is the first segment of rank 0's file. */
static json_t *seg(json_t *meta, int i) { return json_array_get(json_object_get(meta, "segments"), (size_t)i); }

static void e_dim_zero(json_t *m) { json_object_set_new(param_obj(m, 1), "shape", json_pack("[i]", 0)); }
static void e_shape_wraps(json_t *m)
{
    /* 2^32 x 2^32 = 2^64: the product wraps to 0 */
    json_object_set_new(param_obj(m, 0), "shape", json_pack("[I,I]", (json_int_t)1 << 32, (json_int_t)1 << 32));
}
static void e_param_too_big(json_t *m) { set_shape1(m, 0, (json_int_t)1 << 40); }
/* the case: shape [2^62 + 1] stored as segments of 2^62 and 1
 * elements: 4 * 2^62 wraps to 0 bytes, so offset + count * 4 "fits" */
static void e_count_wraps(json_t *m)
{
    const json_int_t big = (json_int_t)1 << 62;
    set_shape1(m, 0, big + 1);
    json_t *s = seg(m, 0);
    json_array_set_new(s, 3, json_integer(0));
    json_array_set_new(s, 4, json_integer(big));
    json_t *t = json_deep_copy(s);
    json_array_set_new(t, 3, json_integer(big));
    json_array_set_new(t, 4, json_integer(1));
    json_array_append_new(json_object_get(m, "segments"), t);
}
/* start = 2^64 - 1 (written -1): start + count wraps below numel */
static void e_start_wraps(json_t *m) { json_array_set_new(seg(m, 0), 3, json_integer(-1)); }
/* offset = 2^64 - 64: offset + count * 4 wraps below the file size */
static void e_offset_wraps(json_t *m) { json_array_set_new(seg(m, 0), 5, json_integer(-64)); }
static void e_overlap(json_t *m)
{
    /* segment 1 (same file) pointed at segment 0's bytes */
    json_array_set(seg(m, 1), 5, json_array_get(seg(m, 0), 5));
}
static void e_file_size(json_t *m)
{
    json_t *f = json_array_get(json_object_get(m, "files"), 0);
    json_object_set_new(f, "bytes", json_integer(json_integer_value(json_object_get(f, "bytes")) + 64));
}
static void e_file_twice(json_t *m)
{
    json_t *files = json_object_get(m, "files");
    json_array_append(files, json_array_get(files, 0));
    json_object_set_new(m, "world_size", json_integer((json_int_t)json_array_size(files)));
}
/* found by fuzz_ckpt_meta (UBSan): the error path walked a NULL file array */
static void e_world_files(json_t *m)
{
    json_object_set_new(m, "world_size", json_integer((json_int_t)json_array_size(json_object_get(m, "files")) + 1));
}
static void e_name_twice(json_t *m) { json_object_set_new(param_obj(m, 1), "name", json_string(NAMES[0])); }
static void e_metadata_name(json_t *m) { json_object_set_new(param_obj(m, 1), "name", json_string("__metadata__")); }
static void e_loss_scale(json_t *m) { json_object_set_new(json_object_get(m, "engine"), "loss_scale", json_real(0)); }
static void e_hysteresis(json_t *m)
{
    json_object_set_new(json_object_get(m, "engine"), "hysteresis_left", json_integer((json_int_t)1 << 40));
}
static void e_no_lr(json_t *m) { json_object_del(json_object_get(m, "engine"), "lr"); }

/* ---------------------------------------------------------------- offline checks (rank 0) */

static void fresh_copy(const char *step, const char *bad)
{
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s.safetensors && cp -r %s %s", bad, bad, step, bad);
    run(cmd);
}

/* Every offline reader refuses `bad` with `want` and a message holding `needle`. */
static void expect_refused(const char *bad, zero_status want, const char *needle, const char *what)
{
    zero_status st = zero_checkpoint_verify(bad);
    CHECK_MSG(st == want && strstr(zero_last_error(), needle), "%s: verify: %s: %s", what, zero_status_name(st),
              zero_last_error());
    char *text = NULL;
    st = zero_checkpoint_inspect(bad, &text);
    CHECK_MSG(st == want && strstr(zero_last_error(), needle), "%s: inspect: %s: %s", what, zero_status_name(st),
              zero_last_error());
    zero_checkpoint_free(text);
    float one[4];
    st = zero_checkpoint_read_tensor(bad, NAMES[1], "master", one, 1);
    CHECK_MSG(st == want && strstr(zero_last_error(), needle), "%s: read_tensor: %s: %s", what,
              zero_status_name(st), zero_last_error());
    char out[700];
    snprintf(out, sizeof out, "%s.safetensors", bad);
    st = zero_checkpoint_consolidate(bad, out);
    CHECK_MSG(st == want && strstr(zero_last_error(), needle), "%s: consolidate: %s: %s", what,
              zero_status_name(st), zero_last_error());
    CHECK_MSG(!exists(out), "%s: consolidate left %s", what, out);
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void offline_checks(const char *step, const char *bad)
{
    static const struct {
        void (*edit)(json_t *);
        const char *needle, *what;
    } cases[] = {
        {e_dim_zero, "params[1] (a.bias) has a bad shape", "shape dimension 0"},
        {e_shape_wraps, "params[0] (a.weight) has a bad shape", "shape product wraps"},
        {e_param_too_big, "more elements than", "parameter larger than the files"},
        {e_count_wraps, "more elements than", "[2^62 + 1] in 2^62 and 1"},
        {e_start_wraps, "is malformed", "start + count wraps"},
        {e_offset_wraps, "is malformed", "offset + count * 4 wraps"},
        {e_overlap, "two segments overlap", "overlapping segments"},
        {e_file_size, "meta.json says", "file size"},
        {e_file_twice, "listed twice", "file listed twice"},
        {e_world_files, "shard files for world_size", "world_size != number of files"},
        {e_name_twice, "parameter name 'a.weight' occurs twice", "duplicate parameter name"},
        {e_loss_scale, "engine state: out of range", "loss_scale 0"},
        {e_hysteresis, "engine state lacks", "hysteresis_left > INT_MAX"},
        {e_no_lr, "engine state lacks", "no lr"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fresh_copy(step, bad);
        rewrite_meta(bad, cases[c].edit);
        if (cases[c].edit == e_loss_scale || cases[c].edit == e_hysteresis || cases[c].edit == e_no_lr) {
            /* the data is whole: verify (what load checks) refuses, the rest reads */
            zero_status st = zero_checkpoint_verify(bad);
            CHECK_MSG(st == ZERO_CORRUPT && strstr(zero_last_error(), cases[c].needle), "%s: verify: %s: %s",
                      cases[c].what, zero_status_name(st), zero_last_error());
            /* found by fuzz_ckpt_meta: reshard copied such scalars into a checkpoint verify refuses */
            char rd[700];
            snprintf(rd, sizeof rd, "%s.resharded", bad);
            st = zero_checkpoint_reshard(bad, rd, 2);
            CHECK_MSG(st == ZERO_CORRUPT && !exists(rd), "%s: reshard: %s: %s", cases[c].what, zero_status_name(st),
                      zero_last_error());
            continue;
        }
        expect_refused(bad, ZERO_CORRUPT, cases[c].needle, cases[c].what);
    }

    /* __metadata__ is a legal parameter name but not a legal safetensors tensor name */
    fresh_copy(step, bad);
    rewrite_meta(bad, e_metadata_name);
    CHECK_OK(zero_checkpoint_verify(bad));
    char out[700];
    snprintf(out, sizeof out, "%s.safetensors", bad);
    zero_status st = zero_checkpoint_consolidate(bad, out);
    CHECK_MSG(st == ZERO_UNSUPPORTED && strstr(zero_last_error(), "__metadata__"), "consolidate: %s: %s",
              zero_status_name(st), zero_last_error());
    CHECK(!exists(out));

    /* a step directory named without the zero padding, no `latest`: resolve
     * names the directory that exists (it used to print "step-00000001") */
    char ck2[700], cmd[4000], resolved[1024];
    snprintf(ck2, sizeof ck2, "%s2", bad);
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp -r %s %s/step-1", ck2, ck2, step, ck2);
    run(cmd);
    CHECK_OK(zero_checkpoint_resolve(ck2, resolved, sizeof resolved));
    CHECK_MSG(strstr(resolved, "/step-1") && !strstr(resolved, "step-00000001"), "resolved %s", resolved);
    CHECK_OK(zero_checkpoint_verify(ck2));

    /* a shard header whose index_offset + index_bytes wraps, header CRC valid */
    fresh_copy(step, bad);
    char p[700];
    snprintf(p, sizeof p, "%s/rank-00000.bin", bad);
    int fd = open(p, O_RDWR);
    unsigned char h[64];
    CHECK(fd >= 0 && pread(fd, h, 64, 0) == 64);
    put64(h + 24, UINT64_MAX - 7); /* index_offset; + index_bytes wraps to a small number */
    uint32_t crc = zero_crc32c(0, h, 60);
    for (int i = 0; i < 4; i++) h[60 + i] = (unsigned char)(crc >> (8 * i));
    CHECK(pwrite(fd, h, 64, 0) == 64);
    close(fd);
    st = zero_checkpoint_verify(bad);
    CHECK_MSG(st == ZERO_CORRUPT && strstr(zero_last_error(), "header sizes are inconsistent"), "wrap: %s: %s",
              zero_status_name(st), zero_last_error());
    float buf[240];
    st = zero_checkpoint_read_tensor(bad, NAMES[0], "master", buf, 240);
    CHECK_MSG(st == ZERO_CORRUPT && strstr(zero_last_error(), "header sizes are inconsistent"), "wrap: %s: %s",
              zero_status_name(st), zero_last_error());
}

/* ---------------------------------------------------------------- collective checks */

static void check_wrong_moment(zero_comm *comm, zero_device *dev, const char *ck, int stage)
{
    int rank = zero_comm_get_rank(comm);
    zero_checkpoint_options o = ZERO_CHECKPOINT_OPTIONS_INIT;
    o.durable = 0;
    zero_engine *e = make_engine(comm, dev, stage, 2);
    if (!e) return;
    char p[600];
    /* gathered: refused on every rank, nothing written */
    CHECK_OK(zero_engine_gather(e, 1));
    zero_status st = zero_checkpoint_save(e, comm, ck, 500 + stage, NULL, &o);
    CHECK_MSG(st == ZERO_INVALID_STATE && strstr(zero_last_error(), "module 'b' is gathered"),
              "save while gathered, stage %d: %s: %s", stage, zero_status_name(st), zero_last_error());
    snprintf(p, sizeof p, "%s/step-%08d", ck, 500 + stage);
    CHECK(!exists(p));
    st = zero_checkpoint_load(e, comm, ck, NULL);
    CHECK_MSG(st == ZERO_INVALID_STATE && strstr(zero_last_error(), "module 'b' is gathered"),
              "load while gathered, stage %d: %s: %s", stage, zero_status_name(st), zero_last_error());
    CHECK_OK(zero_engine_release(e, 1));
    /* half an accumulation: refused likewise (the gradients are not saved) */
    CHECK_OK(zero_engine_grads_ready(e, 0));
    st = zero_checkpoint_save(e, comm, ck, 500 + stage, NULL, &o);
    CHECK_MSG(st == ZERO_INVALID_STATE && strstr(zero_last_error(), "step is in progress"),
              "save mid-accumulation, stage %d: %s: %s", stage, zero_status_name(st), zero_last_error());
    CHECK(!exists(p));
    CHECK_OK(zero_engine_zero_grad(e));
    CHECK_OK(zero_checkpoint_save(e, comm, ck, 500 + stage, NULL, &o));
    CHECK(exists(p));
    (void)rank;
    zero_engine_destroy(e);
}

static void check_read_param(zero_comm *world, zero_device *dev, int stage)
{
    int rank = zero_comm_get_rank(world), n = zero_comm_get_size(world);
    zero_comm *c = NULL;
    CHECK_OK(zero_comm_split(world, 0, rank, &c));
    if (!c) return;
    zero_engine *e = make_engine(c, dev, stage, 1);
    if (!e) {
        zero_comm_destroy(c);
        return;
    }
    float *buf = malloc(400 * sizeof *buf);
    /* every rank, the same parameter: the initial values, bitwise */
    CHECK_OK(zero_engine_read_param(e, 2, buf));
    int bad = 0;
    for (int i = 0; i < 16 * 24; i++) bad += buf[i] != 0.5f * 2 + 0.001f * (float)i;
    CHECK_MSG(bad == 0, "stage %d: %d elements differ", stage, bad);
    if (n >= 2) {
        /* different parameters: a named mismatch on every rank, engine still usable */
        zero_status st = zero_engine_read_param(e, rank == 0 ? 0 : 1, buf);
        CHECK_MSG(st == ZERO_MISMATCH && strstr(zero_engine_last_error(e), "different parameters"),
                  "stage %d: %s: %s", stage, zero_status_name(st), zero_engine_last_error(e));
        /* an unknown parameter on the last rank only: every rank fails */
        st = zero_engine_read_param(e, rank == n - 1 ? 99 : 0, buf);
        CHECK_MSG(st == (rank == n - 1 ? ZERO_INVALID_ARGUMENT : ZERO_PEER_FAILURE), "stage %d unknown: %s: %s",
                  stage, zero_status_name(st), zero_engine_last_error(e));
        CHECK_OK(zero_engine_read_param(e, 0, buf));
        /* rank 0 alone (the usual "save on rank 0" mistake): the same at every stage */
        CHECK_OK(zero_comm_set_timeout(c, 0.5));
        if (rank == 0) {
            st = zero_engine_read_param(e, 0, buf);
            CHECK_MSG(st == ZERO_TIMEOUT && strstr(zero_engine_last_error(e), "COLLECTIVE at every stage"),
                      "stage %d rank 0 alone: %s: %s", stage, zero_status_name(st), zero_engine_last_error(e));
            CHECK(zero_engine_read_param(e, 0, buf) == ZERO_INVALID_STATE);
        }
    }
    free(buf);
    zero_engine_destroy(e);
    zero_comm_destroy(c);
    CHECK_OK(zero_barrier(world));
}

int main(void)
{
    zero_comm *comm;
    zero_device *dev;
    int rank = 0;
    char dir[256];
    ckpt_test_open(&comm, &dev, &rank, "zero-ckpt-hostile", dir);
    if (!comm) return check_exit();
    char ck[320], step[400], bad[400];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(step, sizeof step, "%s/step-00000001", ck);
    snprintf(bad, sizeof bad, "%s/bad", dir);
    zero_checkpoint_options o = ZERO_CHECKPOINT_OPTIONS_INIT;
    o.durable = 0;

    zero_engine *e = make_engine(comm, dev, 3, 1);
    if (!e) return check_exit();
    CHECK_OK(zero_checkpoint_save(e, comm, ck, 1, NULL, &o));
    if (rank == 0) offline_checks(step, bad);
    CHECK_OK(zero_barrier(comm));

    /* a load of scalars that set_scalars refuses fails on every rank before
     * any state is written: the engine's master (changed since the save)
     * stays as it is */
    if (rank == 0) {
        fresh_copy(step, bad);
        rewrite_meta(bad, e_loss_scale);
    }
    CHECK_OK(zero_barrier(comm));
    zero_param_info pi;
    CHECK_OK(zero_engine_get_param_info(e, 0, &pi));
    float seven[240], before[240], after[240];
    for (int i = 0; i < 240; i++) seven[i] = 7.0f;
    CHECK_OK(zero_engine_state_set(e, ZERO_STATE_MASTER, 0, seven));
    CHECK_OK(zero_engine_params_changed(e));
    CHECK_OK(zero_engine_read_param(e, 0, before));
    zero_status st = zero_checkpoint_load(e, comm, bad, NULL);
    CHECK_MSG(st == ZERO_CORRUPT, "load with loss_scale 0: %s: %s", zero_status_name(st), zero_last_error());
    if (rank == 0) CHECK_MSG(strstr(zero_last_error(), "loss_scale 0") != NULL, "%s", zero_last_error());
    CHECK_OK(zero_engine_read_param(e, 0, after));
    CHECK(memcmp(before, after, sizeof before) == 0 && before[pi.owned_begin] == 7.0f);
    zero_engine_destroy(e);

    for (int stage = 0; stage <= 3; stage++) check_wrong_moment(comm, dev, ck, stage);
    for (int stage = 0; stage <= 3; stage++) check_read_param(comm, dev, stage);

    CHECK_OK(zero_barrier(comm));
    if (rank == 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        run(cmd);
    }
    zero_device_destroy(dev);
    zero_comm_destroy(comm);
    return check_exit();
}
