/* meta.json: the checkpoint's description, its checksum, and reading state
 * by element range across shard files. */
#include "checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

/* ---------------------------------------------------------------- checksum wrapper */

/* The checksum covers the canonical text (compact, sorted keys) of the meta
 * object, so the file itself may be indented for people to read. */
static uint32_t meta_crc(json_t *meta)
{
    char *canon = json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS);
    uint32_t c = canon ? zero_crc32c(0, canon, strlen(canon)) : 0;
    free(canon);
    return c;
}

char *ckpt_meta_dump(json_t *meta)
{
    json_t *w = json_pack("{s:I,s:O}", "crc32c", (json_int_t)meta_crc(meta), "meta", meta);
    char *text = json_dumps(w, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(w);
    return text;
}

/* ---------------------------------------------------------------- resolve */

static int is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

zero_status zero_checkpoint_resolve(const char *path, char *out, size_t n)
{
    if (!path || !out) return zero_fail(NULL, ZERO_INVALID_ARGUMENT, "checkpoint resolve: NULL argument");
    char p[1400];
    snprintf(p, sizeof p, "%s/meta.json", path);
    if (is_file(p)) {
        snprintf(out, n, "%s", path);
        return ZERO_OK;
    }
    snprintf(p, sizeof p, "%s/latest", path);
    char *text = NULL;
    if (ckpt_read_file(p, &text, NULL) == ZERO_OK) {
        size_t l = strlen(text);
        while (l && (text[l - 1] == '\n' || text[l - 1] == ' ')) text[--l] = 0;
        if (l == 0 || strchr(text, '/') || strcmp(text, "..") == 0) {
            free(text);
            return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s does not name a step directory", p);
        }
        snprintf(out, n, "%s/%s", path, text);
        free(text);
        snprintf(p, sizeof p, "%s/meta.json", out);
        if (is_file(p)) return ZERO_OK;
    }
    /* No usable `latest` (never written, or it names a directory being
     * replaced): take the newest complete step-* directory in save order. */
    DIR *d = opendir(path);
    if (!d)
        return zero_fail(NULL, ZERO_NOT_FOUND, "checkpoint: %s: %s", path, strerror(errno));
    closedir(d);
    char best[256];
    if (!ckpt_newest_step(path, best, sizeof best))
        return zero_fail(NULL, ZERO_NOT_FOUND, "checkpoint: no checkpoint in %s (no meta.json, latest or step-*)",
                         path);
    snprintf(out, n, "%s/%s", path, best);
    return ZERO_OK;
}

/* ---------------------------------------------------------------- parse */

static int seg_cmp(const void *a, const void *b)
{
    const ckpt_seg *x = a, *y = b;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    if (x->param != y->param) return x->param < y->param ? -1 : 1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return 0;
}

void ckpt_meta_free(ckpt_meta *m)
{
    if (!m) return;
    json_decref(m->root);
    for (int i = 0; i < m->n_params; i++) free(m->params[i].name);
    free(m->params);
    for (int i = 0; i < m->n_files; i++) free(m->files[i].name);
    free(m->files);
    free(m->segs);
    memset(m, 0, sizeof *m);
}

/* Refuse a meta.json: record the message first (its arguments may point into
 * m, a parameter's name for one), then free m. */
static zero_status meta_reject(ckpt_meta *m, zero_status st, const char *fmt, ...) ZERO_PRINTF(3, 4);
static zero_status meta_reject(ckpt_meta *m, zero_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zero_failv(NULL, st, fmt, ap);
    va_end(ap);
    ckpt_meta_free(m);
    return st;
}

/* An integer member in [lo, hi]. Every size, count and offset below comes
 * from a file, so none is trusted until it is known to be in range. */
static int int_in(const json_t *v, json_int_t lo, json_int_t hi, json_int_t *out)
{
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name that occurs twice in names[0..n) (sorts the array), or NULL. */
static const char *first_duplicate(const char **names, int n)
{
    qsort(names, (size_t)n, sizeof *names, name_cmp);
    for (int i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) return names[i];
    return NULL;
}

static int seg_file_cmp(const void *a, const void *b)
{
    const ckpt_seg *x = *(const ckpt_seg *const *)a, *y = *(const ckpt_seg *const *)b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return 0;
}

#define META_MAX_WORLD (1 << 24)

static zero_status parse_params(ckpt_meta *m, json_t *params, const char *mp)
{
    size_t n = json_array_size(params);
    if (n > INT32_MAX || !(m->params = calloc(n + 1, sizeof *m->params)))
        return meta_reject(m, ZERO_OUT_OF_MEMORY, "checkpoint: %s: %zu parameters", mp, n);
    m->n_params = (int)n;
    size_t i;
    json_t *v;
    json_array_foreach(params, i, v) {
        ckpt_param *p = &m->params[i];
        json_t *name = json_object_get(v, "name"), *shape = json_object_get(v, "shape");
        if (!json_is_string(name) || !*json_string_value(name) || !json_is_array(shape) ||
            json_array_size(shape) < 1 || json_array_size(shape) > ZERO_MAX_DIMS)
            return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: params[%zu] lacks a name or shape", mp, i);
        if (!(p->name = strdup(json_string_value(name))))
            return meta_reject(m, ZERO_OUT_OF_MEMORY, "checkpoint: %s: params[%zu]", mp, i);
        p->ndim = (int)json_array_size(shape);
        p->numel = 1;
        for (int d = 0; d < p->ndim; d++) {
            json_int_t x;
            /* each dimension >= 1 and the product without wrapping; the
             * product is bounded by the files' size further down */
            if (!int_in(json_array_get(shape, (size_t)d), 1, INT64_MAX, &x) ||
                __builtin_mul_overflow(p->numel, (uint64_t)x, &p->numel))
                return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: params[%zu] (%s) has a bad shape", mp, i,
                                   p->name);
            p->shape[d] = x;
        }
    }
    const char **names = malloc(((size_t)m->n_params + 1) * sizeof *names);
    if (!names) return meta_reject(m, ZERO_OUT_OF_MEMORY, "checkpoint: %s", mp);
    for (int k = 0; k < m->n_params; k++) names[k] = m->params[k].name;
    const char *dup = first_duplicate(names, m->n_params);
    zero_status st = dup ? meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: parameter name '%s' occurs twice", mp, dup)
                         : ZERO_OK;
    free(names);
    return st;
}

/* Every shard file named exists with the size meta.json says: the element
 * counts below are bounded by what is really on disk, so no buffer sized
 * from meta.json can exceed the data. */
static zero_status parse_files(ckpt_meta *m, json_t *files, const char *mp, uint64_t *total_bytes)
{
    /* counts are set only with their arrays: ckpt_meta_free walks them */
    size_t n = json_array_size(files);
    if (n != (size_t)m->world)
        return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s lists %zu shard files for world_size %d", mp, n, m->world);
    if (!(m->files = calloc(n + 1, sizeof *m->files)))
        return meta_reject(m, ZERO_OUT_OF_MEMORY, "checkpoint: %s: %zu files", mp, n);
    m->n_files = (int)n;
    *total_bytes = 0;
    size_t i;
    json_t *v;
    json_array_foreach(files, i, v) {
        const char *fn = json_string_value(json_object_get(v, "name"));
        json_int_t bytes;
        if (!fn || !*fn || strchr(fn, '/') || strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0 ||
            !int_in(json_object_get(v, "bytes"), CKPT_HEADER_BYTES, INT64_MAX, &bytes))
            return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: files[%zu] has no valid name or size", mp, i);
        if (!(m->files[i].name = strdup(fn)))
            return meta_reject(m, ZERO_OUT_OF_MEMORY, "checkpoint: %s: files[%zu]", mp, i);
        m->files[i].bytes = (uint64_t)bytes;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", m->dir, fn);
        struct stat st;
        if (stat(path, &st) != 0)
            return meta_reject(m, errno == ENOENT ? ZERO_NOT_FOUND : ZERO_IO, "checkpoint: opening %s: %s", path,
                               strerror(errno));
        if (!S_ISREG(st.st_mode))
            return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s is not a regular file", path);
        if ((uint64_t)st.st_size != m->files[i].bytes) {
            /* the shard's own checks say best what happened to it (foreign,
             * damaged header, truncated against its header) */
            int fd;
            ckpt_header h;
            json_t *index;
            zero_status s = ckpt_shard_open(path, &fd, &h, &index);
            if (s != ZERO_OK) return meta_reject(m, s, "%s", zero_last_error());
            close(fd);
            json_decref(index);
            return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s is %lld bytes, meta.json says %llu: %s", path,
                               (long long)st.st_size, (unsigned long long)m->files[i].bytes,
                               (uint64_t)st.st_size < m->files[i].bytes ? "truncated" : "trailing garbage");
        }
        *total_bytes += m->files[i].bytes; /* no wrap: each is < 2^63 and a file system holds far less */
    }
    const char **names = malloc(((size_t)m->n_files + 1) * sizeof *names);
    if (!names) return meta_reject(m, ZERO_OUT_OF_MEMORY, "checkpoint: %s", mp);
    for (int k = 0; k < m->n_files; k++) names[k] = m->files[k].name;
    const char *dup = first_duplicate(names, m->n_files);
    zero_status st = dup ? meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: file %s is listed twice", mp, dup)
                         : ZERO_OK;
    free(names);
    return st;
}

static zero_status parse_segments(ckpt_meta *m, json_t *segs, const char *mp)
{
    size_t n = json_array_size(segs);
    if (n > INT32_MAX || !(m->segs = calloc(n + 1, sizeof *m->segs)))
        return meta_reject(m, ZERO_OUT_OF_MEMORY, "checkpoint: %s: %zu segments", mp, n);
    m->n_segs = (int)n;
    size_t i;
    json_t *v;
    json_array_foreach(segs, i, v) {
        ckpt_seg *s = &m->segs[i];
        json_int_t f[7];
        static const json_int_t hi[7] = {INT32_MAX, INT32_MAX, CKPT_NUM_KINDS - 1, INT64_MAX, INT64_MAX, INT64_MAX,
                                         UINT32_MAX};
        int ok = json_is_array(v) && json_array_size(v) == 7;
        for (int k = 0; ok && k < 7; k++) ok = int_in(json_array_get(v, (size_t)k), 0, hi[k], &f[k]);
        if (!ok) return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: segments[%zu] is malformed", mp, i);
        s->file = (int)f[0];
        s->param = (int)f[1];
        s->kind = (int)f[2];
        s->start = (uint64_t)f[3];
        s->count = (uint64_t)f[4];
        s->offset = (uint64_t)f[5];
        s->crc = (uint32_t)f[6];
        /* [start, start + count) inside the parameter and [offset, offset +
         * 4 count) inside the file's data, written so that nothing wraps */
        if (s->file >= m->n_files || s->param >= m->n_params || !(m->kinds & (1u << s->kind)) ||
            s->count > m->params[s->param].numel || s->start > m->params[s->param].numel - s->count ||
            s->offset < CKPT_HEADER_BYTES || s->offset > m->files[s->file].bytes ||
            s->count > (m->files[s->file].bytes - s->offset) / 4)
            return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: segments[%zu] points outside its parameter or file",
                               mp, i);
    }
    /* No two segments share bytes of a file: with that, the data of all
     * segments together is no larger than the files. */
    const ckpt_seg **by_file = malloc(((size_t)m->n_segs + 1) * sizeof *by_file);
    if (!by_file) return meta_reject(m, ZERO_OUT_OF_MEMORY, "checkpoint: %s", mp);
    for (int k = 0; k < m->n_segs; k++) by_file[k] = &m->segs[k];
    qsort(by_file, (size_t)m->n_segs, sizeof *by_file, seg_file_cmp);
    int clash = -1;
    for (int k = 1; k < m->n_segs && clash < 0; k++) {
        const ckpt_seg *a = by_file[k - 1], *b = by_file[k];
        if (a->file == b->file && a->count && b->count && a->offset + a->count * 4 > b->offset) clash = k;
    }
    zero_status st = ZERO_OK;
    if (clash >= 0)
        st = meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: two segments overlap in %s at offset %llu", mp,
                         m->files[by_file[clash]->file].name, (unsigned long long)by_file[clash]->offset);
    free(by_file);
    if (st == ZERO_OK) qsort(m->segs, (size_t)m->n_segs, sizeof *m->segs, seg_cmp);
    return st;
}

zero_status ckpt_meta_load(const char *path, ckpt_meta *m)
{
    memset(m, 0, sizeof *m);
    ZERO_TRY(zero_checkpoint_resolve(path, m->dir, sizeof m->dir));
    char mp[1200];
    snprintf(mp, sizeof mp, "%s/meta.json", m->dir);
    char *text = NULL;
    size_t len = 0;
    ZERO_TRY(ckpt_read_file(mp, &text, &len));
    json_error_t je;
    json_t *w = json_loadb(text, len, 0, &je);
    free(text);
    if (!w)
        return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s is not a libzero checkpoint: not JSON (%s, line %d)", mp,
                         je.text, je.line);
    json_t *meta = json_object_get(w, "meta");
    json_t *crc = json_object_get(w, "crc32c");
    json_t *magic = meta ? json_object_get(meta, "magic") : NULL;
    if (!json_is_object(meta) || !json_is_string(magic) || strcmp(json_string_value(magic), CKPT_META_MAGIC) != 0) {
        json_decref(w);
        return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s is not a libzero checkpoint (no \"%s\" magic)", mp,
                         CKPT_META_MAGIC);
    }
    if (!json_is_integer(crc) || (uint32_t)json_integer_value(crc) != meta_crc(meta)) {
        json_decref(w);
        return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s: checksum mismatch: the file was modified or corrupted",
                         mp);
    }
    m->root = json_incref(meta);
    json_decref(w);

    json_int_t version = json_integer_value(json_object_get(meta, "format_version"));
    if (version != ZERO_CHECKPOINT_FORMAT_VERSION)
        return meta_reject(m, ZERO_UNSUPPORTED, "checkpoint: %s has format version %lld; this libzero reads %d", mp,
                           (long long)version, ZERO_CHECKPOINT_FORMAT_VERSION);
    json_int_t step, world, stage;
    if (!int_in(json_object_get(meta, "step"), 0, INT64_MAX, &step) ||
        !int_in(json_object_get(meta, "world_size"), 1, META_MAX_WORLD, &world) ||
        !int_in(json_object_get(meta, "stage"), 0, 3, &stage))
        return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: step, world_size or stage missing or out of range", mp);
    m->step = step;
    m->world = (int)world;
    m->stage = (int)stage;
    const char *dt = json_string_value(json_object_get(meta, "compute_dtype"));
    snprintf(m->dtype, sizeof m->dtype, "%s", dt ? dt : "?");

    json_t *kinds = json_object_get(meta, "kinds");
    size_t i;
    json_t *v;
    json_array_foreach(kinds, i, v) {
        int known = 0;
        for (int k = 0; k < CKPT_NUM_KINDS; k++)
            if (json_is_string(v) && strcmp(json_string_value(v), ckpt_kind_names[k]) == 0) {
                m->kinds |= 1u << k;
                known = 1;
            }
        if (!known) return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: kinds[%zu] is not a known state kind", mp, i);
    }
    if (!(m->kinds & 1u)) return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: no master weights listed in \"kinds\"", mp);

    json_t *params = json_object_get(meta, "params");
    json_t *files = json_object_get(meta, "files");
    json_t *segs = json_object_get(meta, "segments");
    if (!json_is_array(params) || !json_is_array(files) || !json_is_array(segs))
        return meta_reject(m, ZERO_CORRUPT, "checkpoint: %s: params, files or segments missing", mp);
    uint64_t total_bytes = 0;
    ZERO_TRY(parse_params(m, params, mp));
    ZERO_TRY(parse_files(m, files, mp, &total_bytes));
    /* Every parameter's master weights are in the files: more elements than
     * the files could hold is a lie, whatever the segments say. */
    uint64_t elements = 0;
    for (int p = 0; p < m->n_params; p++)
        if (__builtin_add_overflow(elements, m->params[p].numel, &elements) || elements > total_bytes / 4)
            return meta_reject(m, ZERO_CORRUPT,
                               "checkpoint: %s: the parameters (up to %s) hold more elements than the %llu bytes of "
                               "shard files can store",
                               mp, m->params[p].name, (unsigned long long)total_bytes);
    return parse_segments(m, segs, mp);
}

/* ---------------------------------------------------------------- scalars */

zero_status ckpt_meta_scalars(const ckpt_meta *m, zero_engine_scalars *sc)
{
    json_t *j = json_object_get(m->root, "engine");
    json_int_t step, skipped, hysteresis, good;
    json_t *scale = json_object_get(j, "loss_scale"), *lr = json_object_get(j, "lr");
    if (!json_is_object(j))
        return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s/meta.json has no engine state", m->dir);
    if (!int_in(json_object_get(j, "step"), INT64_MIN, INT64_MAX, &step) ||
        !int_in(json_object_get(j, "skipped_steps"), INT64_MIN, INT64_MAX, &skipped) ||
        !int_in(json_object_get(j, "hysteresis_left"), INT32_MIN, INT32_MAX, &hysteresis) ||
        !int_in(json_object_get(j, "good_steps"), INT64_MIN, INT64_MAX, &good) || !json_is_number(scale) ||
        !json_is_number(lr))
        return zero_fail(NULL, ZERO_CORRUPT,
                         "checkpoint: %s/meta.json: the engine state lacks step, skipped_steps, hysteresis_left, "
                         "good_steps, loss_scale or lr, or one is not a number",
                         m->dir);
    memset(sc, 0, sizeof *sc);
    sc->step = step;
    sc->skipped_steps = skipped;
    sc->loss_scale = json_number_value(scale);
    sc->hysteresis_left = (int)hysteresis;
    sc->good_steps = good;
    sc->lr = json_number_value(lr);
    char what[1200];
    snprintf(what, sizeof what, "checkpoint: %s/meta.json: engine state", m->dir);
    zero_status st = engine_scalars_check(sc, NULL, what);
    return st == ZERO_OK ? ZERO_OK : zero_fail_forward(NULL, ZERO_CORRUPT, NULL);
}

/* ---------------------------------------------------------------- collect */

zero_status ckpt_meta_collect_files(json_t *meta, const char *dir, int world)
{
    json_t *files = json_array(), *segs = json_array();
    json_object_set_new(meta, "files", files);
    json_object_set_new(meta, "segments", segs);
    for (int r = 0; r < world; r++) {
        char name[64], path[1200];
        snprintf(name, sizeof name, "rank-%05d.bin", r);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        int fd;
        ckpt_header h;
        json_t *index;
        ZERO_TRY(ckpt_shard_open(path, &fd, &h, &index));
        close(fd);
        if ((int)h.rank != r || (int)h.world != world) {
            json_decref(index);
            return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s says rank %u of %u, expected rank %d of %d", path,
                             h.rank, h.world, r, world);
        }
        json_array_append_new(files, json_pack("{s:s,s:i,s:I}", "name", name, "rank", r, "bytes",
                                               (json_int_t)h.file_bytes));
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(index, "segments"), i, v) {
            /* index rows are [param, kind, start, count, offset, crc]; meta adds the file */
            json_t *row = json_array();
            json_array_append_new(row, json_integer(r));
            for (size_t k = 0; k < 6; k++) json_array_append(row, json_array_get(v, k));
            json_array_append_new(segs, row);
        }
        json_decref(index);
    }
    return ZERO_OK;
}

/* ---------------------------------------------------------------- ranges */

int ckpt_meta_find(const ckpt_meta *m, int kind, int param, uint64_t begin, uint64_t end, int *n)
{
    /* segments are sorted by (kind, param, start): binary-search the start of
     * the (kind, param) run, then walk it */
    int lo = 0, hi = m->n_segs;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        const ckpt_seg *s = &m->segs[mid];
        if (s->kind < kind || (s->kind == kind && s->param < param)) lo = mid + 1;
        else hi = mid;
    }
    int first = -1, cnt = 0;
    for (int i = lo; i < m->n_segs && m->segs[i].kind == kind && m->segs[i].param == param; i++) {
        const ckpt_seg *s = &m->segs[i];
        if (s->start >= end) break;
        if (s->start + s->count <= begin || s->count == 0) continue;
        if (first < 0) first = i;
        cnt = i - first + 1;
    }
    *n = cnt;
    return first;
}

void ckpt_close_fds(const ckpt_meta *m, int *fds)
{
    for (int i = 0; i < m->n_files; i++)
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
}

static zero_status open_cached(const ckpt_meta *m, int *fds, int f)
{
    if (fds[f] >= 0) return ZERO_OK;
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", m->dir, m->files[f].name);
    int fd;
    ckpt_header h;
    json_t *index;
    ZERO_TRY(ckpt_shard_open(path, &fd, &h, &index));
    json_decref(index);
    if (h.file_bytes != m->files[f].bytes) {
        close(fd);
        return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s is %llu bytes, meta.json says %llu", path,
                         (unsigned long long)h.file_bytes, (unsigned long long)m->files[f].bytes);
    }
    fds[f] = fd;
    return ZERO_OK;
}

zero_status ckpt_read_range(const ckpt_meta *m, int *fds, int kind, int param, uint64_t begin, uint64_t end,
                            float *out)
{
    if (begin >= end) return ZERO_OK;
    int n;
    int first = ckpt_meta_find(m, kind, param, begin, end, &n);
    uint64_t cursor = begin;
    float *buf = NULL;
    size_t cap = 0;
    zero_status st = ZERO_OK;
    for (int i = first; st == ZERO_OK && first >= 0 && i < first + n; i++) {
        const ckpt_seg *s = &m->segs[i];
        if (s->kind != kind || s->param != param) continue;
        if (s->start > cursor) break; /* a gap: reported below */
        if (s->start + s->count <= cursor) continue;
        if ((st = open_cached(m, fds, s->file)) != ZERO_OK) break;
        if (s->count > cap) {
            free(buf);
            cap = s->count;
            if (!(buf = malloc(cap * sizeof *buf))) {
                st = zero_fail(NULL, ZERO_OUT_OF_MEMORY, "checkpoint: reading %s", m->params[param].name);
                break;
            }
        }
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", m->dir, m->files[s->file].name);
        if ((st = ckpt_pread_all(fds[s->file], buf, s->count * 4, s->offset, path)) != ZERO_OK) break;
        uint32_t crc = zero_crc32c(0, buf, s->count * 4);
        if (crc != s->crc) {
            st = zero_fail(NULL, ZERO_CORRUPT,
                           "checkpoint: %s: checksum mismatch in %s of %s, elements [%llu, %llu) (stored %08x, "
                           "computed %08x): corrupted",
                           path, ckpt_kind_names[kind], m->params[param].name, (unsigned long long)s->start,
                           (unsigned long long)(s->start + s->count), s->crc, crc);
            break;
        }
        uint64_t stop = s->start + s->count < end ? s->start + s->count : end;
        memcpy(out + (cursor - begin), buf + (cursor - s->start), (stop - cursor) * sizeof(float));
        cursor = stop;
        if (cursor >= end) break;
    }
    free(buf);
    if (st == ZERO_OK && cursor < end)
        st = zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s: no %s data for %s elements [%llu, %llu)", m->dir,
                       ckpt_kind_names[kind], m->params[param].name, (unsigned long long)cursor,
                       (unsigned long long)end);
    return st;
}

zero_status ckpt_meta_check_coverage(const ckpt_meta *m)
{
    for (int k = 0; k < CKPT_NUM_KINDS; k++) {
        if (!(m->kinds & (1u << k))) continue;
        for (int p = 0; p < m->n_params; p++) {
            int n = 0;
            int first = ckpt_meta_find(m, k, p, 0, m->params[p].numel, &n);
            uint64_t cursor = 0;
            for (int i = first; first >= 0 && i < first + n; i++) {
                const ckpt_seg *s = &m->segs[i];
                if (s->count == 0) continue;
                if (s->start != cursor)
                    return zero_fail(NULL, ZERO_CORRUPT,
                                     "checkpoint: %s: %s of %s: elements [%llu, %llu) are %s", m->dir,
                                     ckpt_kind_names[k], m->params[p].name,
                                     (unsigned long long)(s->start < cursor ? s->start : cursor),
                                     (unsigned long long)(s->start < cursor ? cursor : s->start),
                                     s->start < cursor ? "stored twice" : "missing");
                cursor += s->count;
            }
            if (cursor != m->params[p].numel)
                return zero_fail(NULL, ZERO_CORRUPT, "checkpoint: %s: %s of %s: elements [%llu, %llu) are missing",
                                 m->dir, ckpt_kind_names[k], m->params[p].name, (unsigned long long)cursor,
                                 (unsigned long long)m->params[p].numel);
        }
    }
    return ZERO_OK;
}
