/* Checkpoints at the library level, on real ranks (tests/mpirun.sh N):
 *   - save at one stage, load at another: every rank's owned master weights
 *     and moments come back bitwise, the full parameters too (read_param),
 *     the scalar state and the user object round-trip;
 *   - another model (a shape differs) is refused with ZERO_MISMATCH naming it;
 *   - a flipped byte, a truncated shard, a foreign meta.json are refused with
 *     ZERO_CORRUPT on every rank, and nothing already saved is touched;
 *   - keep_last prunes, a stale .tmp-* left by a killed save is ignored and
 *     cleaned, `latest` naming a missing directory falls back to the newest;
 *   - consolidate writes a safetensors file holding exactly the master weights. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <zero/checkpoint.h>
#include <zero/zero.h>

#include "check.h"
#include "ckpt_test_util.h"

typedef struct pdef {
    const char *name;
    int module, ndim;
    int64_t shape[2];
} pdef;

static const pdef P[] = {
    {"a.weight", 0, 2, {40, 25}},
    {"a.bias", 0, 1, {37, 1}},
    {"b.weight", 1, 2, {64, 80}},
    {"b.bias", 1, 1, {3, 1}},
};
#define NP 4

static uint64_t numel(const pdef *p) { return (uint64_t)p->shape[0] * (uint64_t)(p->ndim == 2 ? p->shape[1] : 1); }

/* The value saved for (kind, param, element): distinct per kind and param. */
static float value(int kind, int p, uint64_t i) { return 0.25f * (float)kind + 0.01f * (float)p + sinf(0.37f * (float)i); }

static zero_engine *make_engine(zero_comm *comm, zero_device *dev, int stage, int wider)
{
    zero_config c = ZERO_CONFIG_INIT;
    c.stage = stage;
    c.reduce_bucket_size = 3000; /* several buckets; b.weight (5120) split across two */
    c.stage3_param_persistence_threshold = 50;
    zero_engine *e = NULL;
    CHECK_OK(zero_engine_create(&e, &c, comm, dev));
    if (!e) return NULL;
    int m;
    CHECK_OK(zero_engine_add_module(e, "a", &m));
    CHECK_OK(zero_engine_add_module(e, "b", &m));
    for (int p = 0; p < NP; p++) {
        int64_t shape[2] = {P[p].shape[0], P[p].shape[1]};
        if (wider && p == 2) shape[1] += 1;
        CHECK_OK(zero_engine_add_param(e, P[p].module, P[p].name, P[p].ndim, shape, NULL, NULL));
    }
    CHECK_OK(zero_engine_finalize(e));
    return e;
}

/* The flattened index of owned element i of param p (its owned ranges one
 * after another: a param larger than a bucket is split and has several). */
static uint64_t owned_index(zero_engine *e, int p, uint64_t i)
{
    zero_param_info pi;
    CHECK_OK(zero_engine_get_param_info(e, p, &pi));
    for (int r = 0; r < pi.num_owned_ranges; r++) {
        uint64_t b = 0, z = 0;
        CHECK_OK(zero_engine_get_param_owned_range(e, p, r, &b, &z));
        if (i < z - b) return b + i;
        i -= z - b;
    }
    CHECK_MSG(0, "param %d: owned element %llu out of range", p, (unsigned long long)i);
    return 0;
}

static void fill_state(zero_engine *e)
{
    for (int p = 0; p < NP; p++) {
        zero_param_info pi;
        CHECK_OK(zero_engine_get_param_info(e, p, &pi));
        uint64_t n = pi.owned_numel;
        float *buf = malloc((n + 1) * sizeof *buf);
        for (int k = 0; k < 3; k++) {
            for (uint64_t i = 0; i < n; i++) buf[i] = value(k, p, owned_index(e, p, i));
            CHECK_OK(zero_engine_state_set(e, (zero_state_kind)k, p, buf));
        }
        free(buf);
    }
    CHECK_OK(zero_engine_params_changed(e));
    zero_engine_scalars sc = {7, 1, 1.0, 2, 5, 0.0123};
    CHECK_OK(zero_engine_set_scalars(e, &sc));
}

static int check_state(zero_engine *e, const char *what)
{
    int bad = 0;
    for (int p = 0; p < NP; p++) {
        zero_param_info pi;
        CHECK_OK(zero_engine_get_param_info(e, p, &pi));
        uint64_t n = pi.owned_numel, N = numel(&P[p]);
        float *buf = malloc((N + 1) * sizeof *buf);
        for (int k = 0; k < 3; k++) {
            CHECK_OK(zero_engine_state_get(e, (zero_state_kind)k, p, buf));
            for (uint64_t i = 0; i < n; i++)
                if (memcmp(&buf[i], &(float){value(k, p, owned_index(e, p, i))}, 4) != 0) bad++;
        }
        CHECK_OK(zero_engine_read_param(e, p, buf));
        for (uint64_t i = 0; i < N; i++)
            if (memcmp(&buf[i], &(float){value(0, p, i)}, 4) != 0) bad++;
        free(buf);
    }
    CHECK_MSG(bad == 0, "%s: %d elements differ from what was saved", what, bad);
    zero_engine_scalars sc;
    CHECK_OK(zero_engine_get_scalars(e, &sc));
    CHECK(sc.step == 7 && sc.skipped_steps == 1 && sc.good_steps == 5 && sc.lr == 0.0123);
    return bad;
}

static void flip_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    unsigned char b;
    CHECK(pread(fd, &b, 1, off) == 1);
    b ^= 0x10;
    CHECK(pwrite(fd, &b, 1, off) == 1);
    close(fd);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

int main(void)
{
    zero_comm *comm;
    zero_device *dev;
    int rank = 0;
    char dir[256]; /* a fresh directory, named by rank 0 */
    ckpt_test_open(&comm, &dev, &rank, "zero-ckpt-test", dir);
    if (!comm) return check_exit();
    int world = zero_comm_get_size(comm);
    char ck[320], step[400], p[512];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    zero_checkpoint_options o = ZERO_CHECKPOINT_OPTIONS_INIT;
    o.durable = 0; /* /tmp: skip fsync to keep the test fast; the same code paths otherwise */

    /* ---- save at stage s, load at every other stage */
    static const int pairs[][2] = {{3, 0}, {0, 3}, {1, 2}, {2, 1}};
    for (size_t t = 0; t < sizeof pairs / sizeof pairs[0]; t++) {
        zero_engine *a = make_engine(comm, dev, pairs[t][0], 0);
        if (!a) break;
        fill_state(a);
        char user[64];
        snprintf(user, sizeof user, "{\"pair\": %zu, \"name\": \"x\"}", t);
        CHECK_OK(zero_checkpoint_save(a, comm, ck, (int64_t)(10 + t), user, &o));
        zero_engine_destroy(a);
        zero_engine *b = make_engine(comm, dev, pairs[t][1], 0);
        zero_checkpoint_loaded l;
        CHECK_OK(zero_checkpoint_load(b, comm, ck, &l));
        char what[64];
        snprintf(what, sizeof what, "stage %d -> %d", pairs[t][0], pairs[t][1]);
        check_state(b, what);
        CHECK(l.step == (int64_t)(10 + t) && l.world_size == world && l.stage == pairs[t][0]);
        json_t *u = json_loads(l.user_json ? l.user_json : "", 0, NULL);
        CHECK(u && json_integer_value(json_object_get(u, "pair")) == (json_int_t)t);
        json_decref(u);
        zero_checkpoint_loaded_free(&l);
        zero_engine_destroy(b);
    }
    snprintf(step, sizeof step, "%s/step-00000013", ck);
    char resolved[1024];
    CHECK_OK(zero_checkpoint_resolve(ck, resolved, sizeof resolved));
    CHECK(strcmp(resolved, step) == 0);
    CHECK_OK(zero_checkpoint_verify(ck));

    /* ---- another model: refused, naming the parameter */
    zero_engine *w = make_engine(comm, dev, 1, 1);
    zero_status st = zero_checkpoint_load(w, comm, ck, NULL);
    CHECK(st == ZERO_MISMATCH);
    if (rank == 0) CHECK_MSG(strstr(zero_last_error(), "b.weight") != NULL, "message: %s", zero_last_error());
    zero_engine_destroy(w);

    /* ---- damage, each on a copy made by rank 0, each refused on every rank */
    zero_engine *e = make_engine(comm, dev, 3, 0);
    char bad[400];
    snprintf(bad, sizeof bad, "%s/bad", dir);
    struct {
        const char *what, *needle;
    } cases[] = {{"flip", "checksum mismatch"}, {"truncate", "truncated"}, {"foreign", "not a libzero checkpoint"},
                 {"meta", "checksum mismatch"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (rank == 0) {
            char cmd[1400];
            snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", bad, step, bad);
            CHECK(system(cmd) == 0);
            snprintf(p, sizeof p, "%s/rank-00000.bin", bad);
            if (c == 0) flip_byte(p, 64 + 5);
            if (c == 1) CHECK(truncate(p, 1000) == 0);
            if (c == 2) {
                snprintf(p, sizeof p, "%s/meta.json", bad);
                FILE *f = fopen(p, "w");
                fputs("{\"hello\": \"world\"}", f);
                fclose(f);
            }
            if (c == 3) { /* an edit that keeps the JSON valid */
                snprintf(cmd, sizeof cmd, "sed -i 's/\"step\": 13/\"step\": 14/' %s/meta.json", bad);
                CHECK(system(cmd) == 0);
            }
            zero_status vs = zero_checkpoint_verify(bad);
            CHECK_MSG(vs == ZERO_CORRUPT && strstr(zero_last_error(), cases[c].needle),
                      "verify after %s: %s: %s", cases[c].what, zero_status_name(vs), zero_last_error());
        }
        CHECK_OK(zero_barrier(comm));
        st = zero_checkpoint_load(e, comm, bad, NULL);
        /* truncating rank 0's file only hurts ranks that read it: rank 0 always does */
        CHECK_MSG(st == ZERO_CORRUPT, "load after %s: %s: %s", cases[c].what, zero_status_name(st),
                  zero_last_error());
        if (rank == 0)
            CHECK_MSG(strstr(zero_last_error(), cases[c].needle) != NULL, "load after %s: %s", cases[c].what,
                      zero_last_error());
    }
    CHECK_OK(zero_checkpoint_verify(ck)); /* the original is untouched */
    CHECK_OK(zero_checkpoint_load(e, comm, ck, NULL));
    check_state(e, "reload after failed loads");

    /* ---- keep_last, a stale temporary directory, a dangling `latest` */
    if (rank == 0) {
        snprintf(p, sizeof p, "%s/.tmp-step-00000099", ck);
        CHECK(mkdir(p, 0755) == 0);
        snprintf(p, sizeof p, "%s/.tmp-step-00000099/rank-00000.bin.tmp", ck);
        FILE *f = fopen(p, "w");
        fputs("partial", f);
        fclose(f);
    }
    CHECK_OK(zero_barrier(comm));
    CHECK_OK(zero_checkpoint_resolve(ck, resolved, sizeof resolved));
    CHECK(strcmp(resolved, step) == 0);
    fill_state(e);
    zero_checkpoint_options keep = o;
    keep.keep_last = 2;
    CHECK_OK(zero_checkpoint_save(e, comm, ck, 99, NULL, &keep));
    snprintf(p, sizeof p, "%s/.tmp-step-00000099", ck);
    CHECK(!exists(p));
    snprintf(p, sizeof p, "%s/step-00000099", ck);
    CHECK(exists(p));
    snprintf(p, sizeof p, "%s/step-00000013", ck);
    CHECK(exists(p));
    snprintf(p, sizeof p, "%s/step-00000012", ck);
    CHECK(!exists(p)); /* pruned */
    if (rank == 0) {
        snprintf(p, sizeof p, "%s/latest", ck);
        FILE *f = fopen(p, "w");
        fputs("step-00000500\n", f); /* names nothing */
        fclose(f);
    }
    CHECK_OK(zero_barrier(comm));
    CHECK_OK(zero_checkpoint_resolve(ck, resolved, sizeof resolved));
    CHECK(strstr(resolved, "step-00000099") != NULL);
    /* issue 10: keep_last keeps the newest SAVES, not the highest step numbers:
     * a fresh run saving step 3 beside another run's steps 5 and 6 keeps its
     * own step 3 (it used to be pruned at once) and step 6, and resolve falls
     * back to step 3 when `latest` is gone */
    char ord[320];
    snprintf(ord, sizeof ord, "%s/order", dir);
    CHECK_OK(zero_checkpoint_save(e, comm, ord, 5, NULL, &keep));
    CHECK_OK(zero_checkpoint_save(e, comm, ord, 6, NULL, &keep));
    CHECK_OK(zero_checkpoint_save(e, comm, ord, 3, NULL, &keep));
    snprintf(p, sizeof p, "%s/step-00000003", ord);
    CHECK(exists(p));
    snprintf(p, sizeof p, "%s/step-00000006", ord);
    CHECK(exists(p));
    snprintf(p, sizeof p, "%s/step-00000005", ord);
    CHECK(!exists(p)); /* the oldest save */
    CHECK_OK(zero_checkpoint_resolve(ord, resolved, sizeof resolved));
    CHECK(strstr(resolved, "step-00000003") != NULL);
    {
        char *m3 = NULL, *m6 = NULL;
        snprintf(p, sizeof p, "%s/step-00000003", ord);
        CHECK_OK(zero_checkpoint_inspect(p, &m3));
        snprintf(p, sizeof p, "%s/step-00000006", ord);
        CHECK_OK(zero_checkpoint_inspect(p, &m6));
        json_t *j3 = json_loads(m3, 0, NULL), *j6 = json_loads(m6, 0, NULL);
        json_int_t s3 = json_integer_value(json_object_get(j3, "save_seq"));
        json_int_t s6 = json_integer_value(json_object_get(j6, "save_seq"));
        CHECK_MSG(s6 == 2 && s3 == 3, "save_seq: step 3 has %lld, step 6 has %lld", (long long)s3, (long long)s6);
        json_decref(j3);
        json_decref(j6);
        zero_checkpoint_free(m3);
        zero_checkpoint_free(m6);
    }
    CHECK_OK(zero_barrier(comm));
    if (rank == 0) {
        snprintf(p, sizeof p, "%s/latest", ord);
        CHECK(unlink(p) == 0);
    }
    CHECK_OK(zero_barrier(comm));
    CHECK_OK(zero_checkpoint_resolve(ord, resolved, sizeof resolved));
    CHECK_MSG(strstr(resolved, "step-00000003") != NULL, "without latest: %s", resolved);
    zero_engine_destroy(e);

    /* ---- consolidate: a safetensors file with exactly the master weights */
    if (rank == 0) {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        CHECK_OK(zero_checkpoint_consolidate(step, p));
        FILE *f = fopen(p, "rb");
        uint64_t hl = 0;
        unsigned char b8[8];
        CHECK(f && fread(b8, 1, 8, f) == 8);
        for (int i = 0; i < 8; i++) hl |= (uint64_t)b8[i] << (8 * i);
        char *h = calloc(hl + 1, 1);
        CHECK(fread(h, 1, hl, f) == hl);
        json_t *hdr = json_loads(h, 0, NULL);
        CHECK(hdr != NULL);
        int bad_vals = 0;
        for (int q = 0; q < NP && hdr; q++) {
            json_t *t = json_object_get(hdr, P[q].name);
            CHECK(t && strcmp(json_string_value(json_object_get(t, "dtype")), "F32") == 0);
            json_t *off = json_object_get(t, "data_offsets");
            uint64_t b = (uint64_t)json_integer_value(json_array_get(off, 0));
            uint64_t en = (uint64_t)json_integer_value(json_array_get(off, 1));
            CHECK(en - b == numel(&P[q]) * 4);
            CHECK(json_integer_value(json_array_get(json_object_get(t, "shape"), 0)) == P[q].shape[0]);
            float *v = malloc(en - b);
            CHECK(fseek(f, (long)(8 + hl + b), SEEK_SET) == 0 && fread(v, 1, en - b, f) == en - b);
            for (uint64_t i = 0; i < numel(&P[q]); i++)
                if (memcmp(&v[i], &(float){value(0, q, i)}, 4) != 0) bad_vals++;
            free(v);
        }
        CHECK(bad_vals == 0);
        json_decref(hdr);
        free(h);
        fclose(f);
        /* one tensor without an engine: every kind, bitwise; errors named */
        float *t = malloc(numel(&P[2]) * sizeof *t);
        int bad_t = 0;
        for (int k = 0; k < 3; k++) {
            static const char *kinds[] = {"master", "exp_avg", "exp_avg_sq"};
            CHECK_OK(zero_checkpoint_read_tensor(step, "b.weight", kinds[k], t, numel(&P[2])));
            for (uint64_t i = 0; i < numel(&P[2]); i++)
                if (memcmp(&t[i], &(float){value(k, 2, i)}, 4) != 0) bad_t++;
        }
        CHECK(bad_t == 0);
        CHECK(zero_checkpoint_read_tensor(step, "nope", "master", t, 1) == ZERO_NOT_FOUND);
        CHECK(zero_checkpoint_read_tensor(step, "b.weight", "master", t, 5) == ZERO_INVALID_ARGUMENT);
        CHECK(zero_checkpoint_read_tensor(step, "b.weight", "velocity", t, numel(&P[2])) == ZERO_INVALID_ARGUMENT);
        free(t);
        /* offline reshard to 3 files consolidates to the same bytes */
        snprintf(p, sizeof p, "%s/r3", dir);
        CHECK_OK(zero_checkpoint_reshard(step, p, 3));
        CHECK_OK(zero_checkpoint_verify(p));
        char s2[600], cmd[1400];
        snprintf(s2, sizeof s2, "%s/r3.safetensors", dir);
        CHECK_OK(zero_checkpoint_consolidate(p, s2));
        snprintf(cmd, sizeof cmd, "cmp -s %s/model.safetensors %s", dir, s2);
        CHECK(system(cmd) == 0);
    }
    CHECK_OK(zero_barrier(comm));
    if (rank == 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0);
    }
    zero_device_destroy(dev);
    zero_comm_destroy(comm);
    return check_exit();
}
