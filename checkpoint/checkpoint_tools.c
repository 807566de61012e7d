/* Offline checkpoint operations, no engine needed: inspect, verify,
 * consolidate into safetensors, reshard into another number of files. */
#include "checkpoint_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

zero_status zero_checkpoint_inspect(const char *path, char **meta_json)
{
    if (!path || !meta_json) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint inspect: NULL argument");
    *meta_json = NULL;
    ckpt_meta m;
    ZERO_TRY(ckpt_meta_load(path, &m));
    json_object_set_new(m.root, "path", json_string(m.dir));
    *meta_json = json_dumps(m.root, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_object_del(m.root, "path");
    ckpt_meta_free(&m);
    return *meta_json ? ZERO_OK : zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint inspect");
}

/* Read every (kind, param) whole through ckpt_read_range, which checks each
 * segment's CRC; `sink` (may be NULL) receives master weights. */
typedef zero_status (*param_sink)(void *ctx, int kind, int param, const float *data, uint64_t n);

static zero_status read_all(const ckpt_meta *m, unsigned kinds, param_sink sink, void *ctx)
{
    int *fds = malloc(((size_t)m->n_files + 1) * sizeof *fds);
    if (!fds) return zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint");
    for (int i = 0; i < m->n_files; i++) fds[i] = -1;
    zero_status s = ZERO_OK;
    float *buf = NULL;
    uint64_t cap = 0;
    for (int p = 0; p < m->n_params && s == ZERO_OK; p++) {
        uint64_t n = m->params[p].numel;
        if (n > cap) {
            free(buf);
            cap = n;
            if (!(buf = malloc(cap * sizeof *buf))) {
                s = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint: buffer for %s", m->params[p].name);
                break;
            }
        }
        for (int k = 0; k < CKPT_NUM_KINDS && s == ZERO_OK; k++) {
            if (!(kinds & m->kinds & (1u << k))) continue;
            s = ckpt_read_range(m, fds, k, p, 0, n, buf);
            if (s == ZERO_OK && sink) s = sink(ctx, k, p, buf, n);
        }
    }
    free(buf);
    ckpt_close_fds(m, fds);
    free(fds);
    return s;
}

zero_status zero_checkpoint_verify(const char *path)
{
    if (!path) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint verify: NULL path");
    ckpt_meta m;
    ZERO_TRY(ckpt_meta_load(path, &m));
    /* what load checks beyond the data: the scalars it will set */
    zero_engine_scalars sc;
    zero_status s = ckpt_meta_scalars(&m, &sc);
    if (s == ZERO_OK) s = ckpt_meta_check_coverage(&m);
    /* every file: header, size, index (also those holding no segment) */
    for (int f = 0; f < m.n_files && s == ZERO_OK; f++) {
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", m.dir, m.files[f].name);
        int fd;
        ckpt_header h;
        json_t *index;
        s = ckpt_shard_open(p, &fd, &h, &index);
        if (s == ZERO_OK) {
            close(fd);
            json_decref(index);
            if (h.file_bytes != m.files[f].bytes)
                s = zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s is %llu bytes, meta.json says %llu", p,
                              (unsigned long long)h.file_bytes, (unsigned long long)m.files[f].bytes);
        }
    }
    if (s == ZERO_OK) s = read_all(&m, ~0u, NULL, NULL);
    ckpt_meta_free(&m);
    return s;
}

zero_status zero_checkpoint_read_tensor(const char *path, const char *name, const char *kind, float *out,
                                        uint64_t numel)
{
    if (!path || !name || !kind || (!out && numel))
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint read_tensor: NULL argument");
    int k = -1;
    for (int i = 0; i < CKPT_NUM_KINDS; i++)
        if (strcmp(kind, ckpt_kind_names[i]) == 0) k = i;
    if (k < 0)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT,
                         "checkpoint read_tensor: kind \"%s\" is not master, exp_avg or exp_avg_sq", kind);
    ckpt_meta m;
    ZERO_TRY(ckpt_meta_load(path, &m));
    int p = -1;
    for (int i = 0; i < m.n_params && p < 0; i++)
        if (strcmp(m.params[i].name, name) == 0) p = i;
    zero_status s = ZERO_OK;
    if (p < 0)
        s = zero_fail(NULL, ZERO_NOT_FOUND, "checkpoint read_tensor: %s has no parameter %s", m.dir, name);
    else if (!(m.kinds & (1u << k)))
        s = zero_fail(NULL, ZERO_NOT_FOUND, "checkpoint read_tensor: %s holds no %s state", m.dir, kind);
    else if (numel != m.params[p].numel)
        s = zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint read_tensor: %s has %llu elements, not %llu", name,
                      (unsigned long long)m.params[p].numel, (unsigned long long)numel);
    if (s == ZERO_OK) {
        int *fds = malloc(((size_t)m.n_files + 1) * sizeof *fds);
        if (!fds) s = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint read_tensor");
        for (int i = 0; fds && i < m.n_files; i++) fds[i] = -1;
        if (s == ZERO_OK) s = ckpt_read_range(&m, fds, k, p, 0, numel, out);
        if (fds) ckpt_close_fds(&m, fds);
        free(fds);
    }
    ckpt_meta_free(&m);
    return s;
}

/* ---------------------------------------------------------------- consolidate */

typedef struct st_ctx {
    int fd;
    const char *path;
    uint64_t data_start;
    uint64_t *offsets;
} st_ctx;

static zero_status st_sink(void *ctx, int kind, int p, const float *data, uint64_t n)
{
    st_ctx *c = ctx;
    if (kind != ZERO_STATE_MASTER) return ZERO_OK;
    /* little-endian hosts only (x86-64, aarch64): floats are written as they lie */
    return ckpt_pwrite_all(c->fd, data, n * sizeof(float), c->data_start + c->offsets[p], c->path);
}

zero_status zero_checkpoint_consolidate(const char *path, const char *out_file)
{
    if (!path || !out_file) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint consolidate: NULL argument");
    ckpt_meta m;
    ZERO_TRY(ckpt_meta_load(path, &m));
    zero_status s = ckpt_meta_check_coverage(&m);
    /* safetensors keeps its own entry under this key (names are unique: meta load checks) */
    for (int p = 0; p < m.n_params && s == ZERO_OK; p++)
        if (strcmp(m.params[p].name, "__metadata__") == 0)
            s = zero_fail(NULL, ZERO_UNSUPPORTED,
                          "checkpoint consolidate: parameter %d is named __metadata__, a name safetensors reserves; "
                          "rename it in the model",
                          p);
    uint64_t *offsets = calloc((size_t)m.n_params + 1, sizeof *offsets);
    json_t *hdr = json_object();
    uint64_t off = 0;
    for (int p = 0; offsets && p < m.n_params; p++) {
        json_t *shape = json_array();
        for (int d = 0; d < m.params[p].ndim; d++) json_array_append_new(shape, json_integer(m.params[p].shape[d]));
        offsets[p] = off;
        uint64_t bytes = m.params[p].numel * 4;
        json_object_set_new(hdr, m.params[p].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + bytes)));
        off += bytes;
    }
    /* __metadata__ values must be strings in safetensors */
    json_t *md = json_object();
    json_object_set_new(md, "format", json_string("pt"));
    json_object_set_new(md, "source", json_string("libzero checkpoint"));
    json_object_set_new(md, "step", json_sprintf("%lld", (long long)m.step));
    json_t *user = json_object_get(m.root, "user");
    if (user) {
        char *u = json_dumps(user, JSON_COMPACT | JSON_SORT_KEYS);
        json_object_set_new(md, "user", json_string(u ? u : "{}"));
        free(u);
    }
    json_object_set_new(hdr, "__metadata__", md);
    /* keep insertion order so tensors appear in parameter order */
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(hdr);
    size_t tl = text ? strlen(text) : 0;
    size_t padded = (tl + 7) / 8 * 8; /* the format allows trailing spaces; keeps data 8-aligned */
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", out_file);
    int fd = -1;
    if (s == ZERO_OK && (!text || !offsets)) s = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint consolidate");
    if (s == ZERO_OK && (fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
        s = zero_fail(NULL, ZERO_IO, "checkpoint consolidate: creating %s: %s", tmp, strerror(errno));
    if (s == ZERO_OK) {
        unsigned char head[8];
        for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)padded >> (8 * i));
        char *h = malloc(padded);
        if (!h) s = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint consolidate: header of %zu bytes", padded);
        if (h) {
            memcpy(h, text, tl);
            memset(h + tl, ' ', padded - tl);
            s = ckpt_pwrite_all(fd, head, 8, 0, tmp);
        }
        if (s == ZERO_OK) s = ckpt_pwrite_all(fd, h, padded, 8, tmp);
        free(h);
    }
    if (s == ZERO_OK) {
        st_ctx c = {fd, tmp, 8 + padded, offsets};
        s = read_all(&m, 1u, st_sink, &c);
    }
    if (s == ZERO_OK && fsync(fd) != 0)
        s = zero_fail(NULL, ZERO_IO, "checkpoint consolidate: fsync %s: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd);
    if (s == ZERO_OK && rename(tmp, out_file) != 0)
        s = zero_fail(NULL, ZERO_IO, "checkpoint consolidate: renaming %s: %s", tmp, strerror(errno));
    if (s != ZERO_OK && fd >= 0) unlink(tmp);
    free(text);
    free(offsets);
    ckpt_meta_free(&m);
    return s;
}

/* ---------------------------------------------------------------- reshard */

zero_status zero_checkpoint_reshard(const char *path, const char *out_dir, int world)
{
    if (!path || !out_dir || world < 1)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint reshard: NULL path or world_size < 1");
    struct stat st;
    if (stat(out_dir, &st) == 0)
        return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint reshard: %s already exists", out_dir);
    ckpt_meta m;
    ZERO_TRY(ckpt_meta_load(path, &m));
    /* the scalars are copied as they are: what load would refuse is not rewritten */
    zero_engine_scalars sc;
    zero_status s = ckpt_meta_scalars(&m, &sc);
    if (s == ZERO_OK) s = ckpt_meta_check_coverage(&m);
    char tmp_dir[1200];
    snprintf(tmp_dir, sizeof tmp_dir, "%s.tmp", out_dir);
    ckpt_remove_tree(tmp_dir);
    if (s == ZERO_OK) s = ckpt_mkdir_p(tmp_dir);
    int *fds = malloc(((size_t)m.n_files + 1) * sizeof *fds);
    if (!fds && s == ZERO_OK) s = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint reshard");
    for (int i = 0; fds && i < m.n_files; i++) fds[i] = -1;
    float *buf = NULL;
    uint64_t cap = 0;
    for (int r = 0; r < world && s == ZERO_OK; r++) {
        char p[1400];
        snprintf(p, sizeof p, "%s/rank-%05d.bin", tmp_dir, r);
        ckpt_writer w;
        if ((s = ckpt_writer_open(&w, p, (uint32_t)r, (uint32_t)world, 1)) != ZERO_OK) break;
        for (int q = 0; q < m.n_params && s == ZERO_OK; q++) {
            uint64_t n = m.params[q].numel;
            uint64_t b = n * (uint64_t)r / (uint64_t)world, e = n * (uint64_t)(r + 1) / (uint64_t)world;
            if (e == b) continue;
            if (e - b > cap) {
                free(buf);
                cap = e - b;
                buf = malloc(cap * sizeof *buf);
                if (!buf) s = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint reshard");
            }
            for (int k = 0; k < CKPT_NUM_KINDS && s == ZERO_OK; k++) {
                if (!(m.kinds & (1u << k))) continue;
                s = ckpt_read_range(&m, fds, k, q, b, e, buf);
                if (s == ZERO_OK) s = ckpt_writer_segment(&w, q, k, b, buf, e - b);
            }
        }
        if (s == ZERO_OK) s = ckpt_writer_close(&w, NULL);
        else ckpt_writer_abort(&w);
    }
    free(buf);
    if (fds) ckpt_close_fds(&m, fds);
    free(fds);
    if (s == ZERO_OK) {
        json_t *meta = json_deep_copy(m.root);
        json_object_set_new(meta, "world_size", json_integer(world));
        json_object_set_new(meta, "resharded_from", json_integer(m.world));
        s = ckpt_meta_collect_files(meta, tmp_dir, world);
        char *text = s == ZERO_OK ? ckpt_meta_dump(meta) : NULL;
        json_decref(meta);
        if (s == ZERO_OK) {
            char p[1400];
            snprintf(p, sizeof p, "%s/meta.json", tmp_dir);
            s = text ? ckpt_write_file_atomic(p, text, strlen(text), 1)
                     : zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint reshard");
        }
        free(text);
    }
    if (s == ZERO_OK && rename(tmp_dir, out_dir) != 0)
        s = zero_fail(NULL, ZERO_IO, "checkpoint reshard: renaming %s to %s: %s", tmp_dir, out_dir, strerror(errno));
    if (s != ZERO_OK) ckpt_remove_tree(tmp_dir);
    ckpt_meta_free(&m);
    return s;
}
