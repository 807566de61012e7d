/* zero-ckpt: inspect, verify, consolidate and reshard libzero checkpoints
 * (docs/checkpoints.md). Needs no MPI and no engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <zero/checkpoint.h>

#include "ckpt_merge_ep.h"

static void usage(FILE *f)
{
    fputs("usage: zero-ckpt COMMAND ...\n"
          "  inspect PATH [--json]          summary (or the whole meta.json) of a checkpoint\n"
          "  verify PATH                    check every header, size and CRC32C; exit 1 on damage\n"
          "  consolidate PATH OUT.safetensors   full fp32 master weights in one safetensors file\n"
          "  reshard PATH OUT_DIR N         rewrite for N ranks (any engine loads either)\n"
          "  merge-ep DIR OUT_DIR           the per-ep-rank checkpoints of an expert-parallel run\n"
          "                                 (DIR/ep0, ep1, ...) as one checkpoint of every expert\n"
          "  diff PATH_A PATH_B             compare every parameter's master weights and moments;\n"
          "                                 exit 0 when bitwise equal, 1 otherwise\n"
          "PATH is a step directory or a checkpoint directory (its `latest` is used).\n",
          f);
}

static int fail(const char *what)
{
    fprintf(stderr, "zero-ckpt %s: %s\n", what, zero_last_error());
    return 1;
}

/* Elements of a parameter from its meta.json shape: 0 when the shape is not a
 * list of positive integers or its product does not fit in 2^62 elements. The
 * library refuses such a meta.json when it opens the checkpoint; this keeps the
 * tool from trusting it on its own (a wrapped product would size a buffer). */
static uint64_t shape_numel(json_t *shape)
{
    if (!json_is_array(shape) || json_array_size(shape) == 0) return 0;
    uint64_t n = 1;
    size_t d;
    json_t *x;
    json_array_foreach(shape, d, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 1) return 0;
        if (__builtin_mul_overflow(n, (uint64_t)json_integer_value(x), &n) || n > (UINT64_C(1) << 62)) return 0;
    }
    return n;
}

static int inspect(const char *path, int as_json)
{
    char *text = NULL;
    if (zero_checkpoint_inspect(path, &text) != ZERO_OK) return fail("inspect");
    if (as_json) {
        printf("%s\n", text);
        zero_checkpoint_free(text);
        return 0;
    }
    json_error_t je;
    json_t *m = json_loads(text, 0, &je);
    zero_checkpoint_free(text);
    if (!m) {
        fprintf(stderr, "zero-ckpt inspect: %s\n", je.text);
        return 1;
    }
    json_t *params = json_object_get(m, "params"), *files = json_object_get(m, "files");
    json_t *eng = json_object_get(m, "engine"), *user = json_object_get(m, "user");
    uint64_t total = 0;
    size_t i;
    json_t *p;
    json_array_foreach(params, i, p) {
        uint64_t n = shape_numel(json_object_get(p, "shape"));
        if (n == 0) {
            fprintf(stderr, "zero-ckpt inspect: parameter %zu has an invalid shape\n", i);
            json_decref(m);
            return 1;
        }
        total += n;
    }
    uint64_t bytes = 0;
    json_array_foreach(files, i, p) bytes += (uint64_t)json_integer_value(json_object_get(p, "bytes"));
    printf("checkpoint  %s\n", json_string_value(json_object_get(m, "path")));
    printf("format      libzero checkpoint v%lld (library %s)\n",
           (long long)json_integer_value(json_object_get(m, "format_version")),
           json_string_value(json_object_get(m, "library_version")));
    printf("step        %lld\n", (long long)json_integer_value(json_object_get(m, "step")));
    printf("saved by    %lld ranks, ZeRO stage %lld, %s compute\n",
           (long long)json_integer_value(json_object_get(m, "world_size")),
           (long long)json_integer_value(json_object_get(m, "stage")),
           json_string_value(json_object_get(m, "compute_dtype")));
    printf("parameters  %zu tensors, %llu elements\n", json_array_size(params), (unsigned long long)total);
    char *k = json_dumps(json_object_get(m, "kinds"), JSON_COMPACT);
    printf("state       %s (fp32)\n", k ? k : "?");
    free(k);
    printf("files       %zu, %.2f MiB\n", json_array_size(files), bytes / 1048576.0);
    if (eng)
        printf("engine      optimizer step %lld, lr %.6g, loss scale %g, skipped %lld\n",
               (long long)json_integer_value(json_object_get(eng, "step")),
               json_number_value(json_object_get(eng, "lr")), json_number_value(json_object_get(eng, "loss_scale")),
               (long long)json_integer_value(json_object_get(eng, "skipped_steps")));
    json_t *model = json_object_get(user, "model");
    if (model) {
        char *ms = json_dumps(model, JSON_COMPACT | JSON_SORT_KEYS);
        printf("model       %s\n", ms);
        free(ms);
    }
    json_t *data = json_object_get(user, "data");
    if (data)
        printf("data        %s, %lld samples consumed\n", json_string_value(json_object_get(data, "path")),
               (long long)json_integer_value(json_object_get(data, "consumed")));
    json_decref(m);
    return 0;
}

/* Compare two checkpoints of the same model tensor by tensor. */
static int diff(const char *a, const char *b)
{
    char *ta = NULL, *tb = NULL;
    if (zero_checkpoint_inspect(a, &ta) != ZERO_OK) return fail("diff");
    if (zero_checkpoint_inspect(b, &tb) != ZERO_OK) {
        zero_checkpoint_free(ta);
        return fail("diff");
    }
    json_t *ma = json_loads(ta, 0, NULL), *mb = json_loads(tb, 0, NULL);
    zero_checkpoint_free(ta);
    zero_checkpoint_free(tb);
    json_t *pa = json_object_get(ma, "params"), *pb = json_object_get(mb, "params");
    int rc = 0;
    if (!json_equal(pa, pb)) {
        fprintf(stderr, "zero-ckpt diff: the two checkpoints hold different parameter lists\n");
        rc = 2;
    }
    size_t i, k;
    json_t *p, *kind;
    uint64_t differing = 0, total = 0;
    json_array_foreach(rc ? NULL : pa, i, p) {
        const char *name = json_string_value(json_object_get(p, "name"));
        uint64_t n = shape_numel(json_object_get(p, "shape"));
        if (n == 0) {
            fprintf(stderr, "zero-ckpt diff: parameter %s has an invalid shape\n", name ? name : "?");
            rc = 2;
            break;
        }
        float *va = malloc(n * sizeof *va), *vb = malloc(n * sizeof *vb);
        if (!va || !vb) {
            fprintf(stderr, "zero-ckpt diff: out of memory for the %llu elements of %s\n", (unsigned long long)n,
                    name ? name : "?");
            free(va);
            free(vb);
            rc = 2;
            break;
        }
        json_array_foreach(json_object_get(ma, "kinds"), k, kind) {
            const char *kn = json_string_value(kind);
            if (zero_checkpoint_read_tensor(a, name, kn, va, n) != ZERO_OK ||
                zero_checkpoint_read_tensor(b, name, kn, vb, n) != ZERO_OK) {
                fprintf(stderr, "zero-ckpt diff: %s\n", zero_last_error());
                rc = 2;
                break;
            }
            uint64_t nd = 0;
            double mx = 0;
            for (uint64_t e = 0; e < n; e++)
                if (memcmp(&va[e], &vb[e], 4) != 0) {
                    nd++;
                    double dd = va[e] > vb[e] ? va[e] - vb[e] : vb[e] - va[e];
                    if (dd > mx) mx = dd;
                }
            if (nd) printf("%-32s %-10s %llu of %llu elements differ, max |a-b| %.3g\n", name, kn,
                           (unsigned long long)nd, (unsigned long long)n, mx);
            differing += nd;
            total += n;
        }
        free(va);
        free(vb);
        if (rc) break;
    }
    json_decref(ma);
    json_decref(mb);
    if (rc) return rc == 2 ? 1 : rc;
    if (differing) {
        printf("differ: %llu of %llu state elements\n", (unsigned long long)differing, (unsigned long long)total);
        return 1;
    }
    printf("identical: %llu state elements bitwise equal\n", (unsigned long long)total);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "inspect") == 0 && (argc == 3 || (argc == 4 && strcmp(argv[3], "--json") == 0)))
        return inspect(argv[2], argc == 4);
    if (strcmp(cmd, "verify") == 0 && argc == 3) {
        if (zero_checkpoint_verify(argv[2]) != ZERO_OK) return fail("verify");
        char dir[1024];
        zero_checkpoint_resolve(argv[2], dir, sizeof dir);
        printf("ok: %s: every header, size and checksum matches, every parameter is complete\n", dir);
        return 0;
    }
    if (strcmp(cmd, "consolidate") == 0 && argc == 4) {
        if (zero_checkpoint_consolidate(argv[2], argv[3]) != ZERO_OK) return fail("consolidate");
        printf("wrote %s\n", argv[3]);
        return 0;
    }
    if (strcmp(cmd, "reshard") == 0 && argc == 5) {
        char *end;
        long n = strtol(argv[4], &end, 10);
        if (*end || n < 1 || n > 1 << 20) {
            fprintf(stderr, "zero-ckpt reshard: N must be a positive integer, got %s\n", argv[4]);
            return 2;
        }
        if (zero_checkpoint_reshard(argv[2], argv[3], (int)n) != ZERO_OK) return fail("reshard");
        printf("wrote %s for %ld ranks\n", argv[3], n);
        return 0;
    }
    if (strcmp(cmd, "diff") == 0 && argc == 4) return diff(argv[2], argv[3]);
    if (strcmp(cmd, "merge-ep") == 0 && argc == 4) return zero_ckpt_merge_ep(argv[2], argv[3]);
    usage(stderr);
    return 2;
}
