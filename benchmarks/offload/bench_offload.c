/* zero-bench-offload: the NVMe store's throughput against the file system's
 * own limit, and the swapper's overlap of I/O with compute, in one run.
 *
 *   zero-bench-offload [--dir DIR] [--mib TOTAL] [--tensor-mib N] [--qd 1,2,4,8,16,32]
 *                      [--block-kib 128,512,2048,8192] [--chunks N] [--chunk-mib N]
 *                      [--depth K] [--io uring|sync] [--reps 3] [--json FILE]
 *
 * Peer ("raw"): a dd oflag=direct loop written here - sequential, one
 * synchronous O_DIRECT pwrite (then pread) of block_kib at a time over the
 * same total bytes, on a freshly preallocated file in the same directory.
 * Writes are measured twice on both sides: the first write into the
 * preallocated file (ext4 converts unwritten extents, which io_uring cannot
 * do without blocking, so it hands such writes to a worker thread) and an
 * overwrite - the steady state of an optimizer step, which rewrites the
 * same tensors every step.
 * The store moves the same bytes as tensors of --tensor-mib, all requests
 * issued at once, queue_depth segments of block_kib in flight, on a fresh
 * store. ratio = store / best raw (the best block size's sequential rate:
 * what the file system gives one stream); vs_same_block = store / raw at the
 * same block size. Reads are O_DIRECT on both sides, so no page cache.
 * Every throughput is the best of --reps runs (shared machines are noisy;
 * the best run is the one least disturbed).
 *
 * Swapper: --chunks chunks of --chunk-mib, each updated in place by a
 * synthetic compute whose cost is calibrated to the chunk's measured I/O
 * time (the balanced case, where overlap matters most). serialized = for
 * each chunk: read, wait, compute, write, wait. pipelined = the swapper with
 * depth K. Best of --reps each. ideal = max(total I/O, total compute). overlap = (serialized -
 * pipelined) / (serialized - ideal): 1 is perfect overlap, 0 none. The files
 * are checked afterwards (#wrong chunks). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zero/zero.h>
#include <zero/offload.h>
#include <zero/experimental.h>

#define MIB (1024.0 * 1024.0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define TRY(call)                                                                              \
    do {                                                                                       \
        zero_status st_ = (call);                                                              \
        if (st_ != ZERO_OK) {                                                                  \
            fprintf(stderr, "%s: %s: %s\n", #call, zero_status_name(st_), zero_last_error());  \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

/* ---------------------------------------------------------------- raw peer */

typedef struct raw_result {
    double first_gbs, write_gbs, read_gbs; /* first write into the preallocated file, overwrite, read */
} raw_result;

static raw_result raw_dd(const char *dir, size_t total, size_t block, void *buf)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/zero-bench-raw-%ld.bin", dir, (long)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    int direct = 1;
    if (fd < 0 && errno == EINVAL) {
        fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        direct = 0;
    }
    if (fd < 0) {
        fprintf(stderr, "raw: cannot create %s: %s\n", path, strerror(errno));
        exit(1);
    }
    if (!direct) fprintf(stderr, "raw: %s refuses O_DIRECT; buffered\n", dir);
    if (fallocate(fd, 0, 0, (off_t)total) != 0 && ftruncate(fd, (off_t)total) != 0) {
        fprintf(stderr, "raw: cannot size %s\n", path);
        exit(1);
    }
    raw_result r;
    double t0;
    for (int pass = 0; pass < 2; pass++) {
        t0 = now();
        for (size_t off = 0; off < total; off += block)
            if (pwrite(fd, buf, block, (off_t)off) != (ssize_t)block) {
                fprintf(stderr, "raw: pwrite %s: %s\n", path, strerror(errno));
                exit(1);
            }
        *(pass ? &r.write_gbs : &r.first_gbs) = (double)total / (now() - t0) / 1e9;
    }
    t0 = now();
    for (size_t off = 0; off < total; off += block)
        if (pread(fd, buf, block, (off_t)off) != (ssize_t)block) {
            fprintf(stderr, "raw: pread %s: %s\n", path, strerror(errno));
            exit(1);
        }
    r.read_gbs = (double)total / (now() - t0) / 1e9;
    close(fd);
    unlink(path);
    return r;
}

/* ---------------------------------------------------------------- store */

typedef struct store_result {
    int qd, block_kib;
    double first_gbs, write_gbs, read_gbs;
    long wrong;
} store_result;

static store_result store_run(const char *dir, zero_nvme_io_engine io, size_t total, size_t tensor, int qd,
                              size_t block, unsigned char *src, unsigned char *dst)
{
    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    o.dir = dir;
    o.capacity = total;
    o.queue_depth = qd;
    o.block_bytes = block;
    o.io = io;
    o.timeout_s = 600;
    zero_nvme_store *s;
    TRY(zero_nvme_store_create(&s, &o));
    int n = (int)(total / tensor);
    zero_nvme_tensor *t = malloc((size_t)n * sizeof *t);
    zero_nvme_request **r = malloc((size_t)n * sizeof *r);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        TRY(zero_nvme_define(s, name, tensor, &t[i]));
    }
    store_result res = {qd, (int)(block >> 10), 0, 0, 0, 0};
    double t0;
    for (int pass = 0; pass < 2; pass++) {
        t0 = now();
        for (int i = 0; i < n; i++) TRY(zero_nvme_write_async(s, t[i], src + (size_t)i * tensor, &r[i]));
        for (int i = 0; i < n; i++) TRY(zero_nvme_wait(s, r[i], 0));
        *(pass ? &res.write_gbs : &res.first_gbs) = (double)total / (now() - t0) / 1e9;
    }
    t0 = now();
    for (int i = 0; i < n; i++) TRY(zero_nvme_read_async(s, t[i], dst + (size_t)i * tensor, &r[i]));
    for (int i = 0; i < n; i++) TRY(zero_nvme_wait(s, r[i], 0));
    res.read_gbs = (double)total / (now() - t0) / 1e9;
    res.wrong = memcmp(src, dst, total) != 0;
    memset(dst, 0, total);
    TRY(zero_nvme_store_destroy(s));
    free(t);
    free(r);
    return res;
}

/* ---------------------------------------------------------------- swapper */

/* A stand-in for the optimizer's update: `reps` streaming passes of a
 * multiply-add over the chunk, in place - memory bound like AdamW, and
 * linear in reps (noinline: a constant reps must not change the code). */
__attribute__((noinline)) static void compute(float *x, size_t n, int reps)
{
    for (int k = 0; k < reps; k++)
        for (size_t j = 0; j < n; j++) x[j] = x[j] * 0.999f + 0.001f;
}

typedef struct swap_result {
    double io_s, compute_s, serialized_s, pipelined_s, ideal_s, speedup, overlap;
    double wait_s, hidden; /* pipelined: time blocked in next/finish; 1 - wait_s / io_s */
    int reps;
    long wrong;
} swap_result;

static swap_result swap_run(const char *dir, zero_nvme_io_engine io, int chunks, size_t chunk, int depth, int qd,
                            size_t block, int REPS)
{
    zero_nvme_options o = ZERO_NVME_OPTIONS_INIT;
    o.dir = dir;
    o.capacity = (uint64_t)chunks * chunk;
    o.queue_depth = qd;
    o.block_bytes = block;
    o.io = io;
    o.timeout_s = 600;
    zero_nvme_store *s;
    TRY(zero_nvme_store_create(&s, &o));
    zero_device *dev;
    TRY(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));
    zero_host_pool *pool;
    TRY(zero_host_pool_create(&pool, dev, (size_t)(depth + 3) * chunk));
    zero_nvme_tensor *t = malloc((size_t)chunks * sizeof *t);
    float *buf;
    TRY(zero_host_pool_alloc(pool, chunk, (void **)&buf));
    size_t nf = chunk / sizeof(float);
    for (size_t j = 0; j < nf; j++) buf[j] = (float)(j % 1000);
    for (int i = 0; i < chunks; i++) {
        char name[32];
        snprintf(name, sizeof name, "c%d", i);
        TRY(zero_nvme_define(s, name, chunk, &t[i]));
        TRY(zero_nvme_write(s, t[i], buf));
    }
    swap_result r = {0};
    /* calibrate with one serialized pass at 8 reps (it also warms the files
     * up: every later write is an overwrite), then reps so that compute
     * matches I/O: the balanced case */
    double tio = 0, tc = 0, t0;
    for (int i = 0; i < chunks; i++) {
        t0 = now();
        TRY(zero_nvme_read(s, t[i], buf));
        double t1 = now();
        compute(buf, nf, 8);
        double t2 = now();
        TRY(zero_nvme_write(s, t[i], buf));
        tio += (t1 - t0) + (now() - t2);
        tc += t2 - t1;
    }
    r.reps = (int)fmax(1.0, 8.0 * tio / tc);
    if (getenv("ZERO_BENCH_DEBUG")) fprintf(stderr, "calibration: io %.4f s, compute(8) %.4f s\n", tio, tc);
    zero_nvme_swapper *sw;
    TRY(zero_nvme_swapper_create(&sw, s, pool, t, (size_t)chunks, depth, 1));
    r.serialized_s = r.pipelined_s = 1e30;
    for (int rep = 0; rep < REPS; rep++) {
        /* serialized: each phase waited for before the next */
        double start = now();
        tio = tc = 0;
        for (int i = 0; i < chunks; i++) {
            t0 = now();
            TRY(zero_nvme_read(s, t[i], buf));
            double t1 = now();
            compute(buf, nf, r.reps);
            double t2 = now();
            TRY(zero_nvme_write(s, t[i], buf));
            tio += (t1 - t0) + (now() - t2);
            tc += t2 - t1;
        }
        double total = now() - start;
        if (total < r.serialized_s) {
            r.serialized_s = total;
            r.io_s = tio;
            r.compute_s = tc;
        }
        /* pipelined: the caller only waits inside next() and finish() */
        if (rep) TRY(zero_nvme_swapper_rewind(sw));
        double wait = 0;
        start = now();
        void *b;
        size_t bytes, idx;
        while (1) {
            t0 = now();
            TRY(zero_nvme_swapper_next(sw, &b, &bytes, &idx));
            wait += now() - t0;
            if (!b) break;
            compute(b, bytes / sizeof(float), r.reps);
        }
        t0 = now();
        TRY(zero_nvme_swapper_finish(sw));
        wait += now() - t0;
        total = now() - start;
        if (total < r.pipelined_s) {
            r.pipelined_s = total;
            r.wait_s = wait;
        }
    }
    zero_nvme_swapper_destroy(sw);
    r.ideal_s = fmax(r.io_s, r.compute_s);
    r.speedup = r.serialized_s / r.pipelined_s;
    r.overlap = (r.serialized_s - r.pipelined_s) / (r.serialized_s - r.ideal_s);
    r.hidden = 1.0 - r.wait_s / r.io_s;
    /* check: every chunk went through the calibration and then compute
     * twice per repetition */
    float *want = malloc(chunk), *got = malloc(chunk);
    for (size_t j = 0; j < nf; j++) want[j] = (float)(j % 1000);
    compute(want, nf, 8);
    for (int k = 0; k < 2 * REPS; k++) compute(want, nf, r.reps);
    for (int i = 0; i < chunks; i++) {
        TRY(zero_nvme_read(s, t[i], got));
        r.wrong += memcmp(want, got, chunk) != 0;
    }
    free(want);
    free(got);
    free(t);
    zero_host_pool_destroy(pool);
    zero_device_destroy(dev);
    TRY(zero_nvme_store_destroy(s));
    return r;
}

int main(int argc, char **argv)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    const char *json = "zero-bench-offload.json", *io_name = "uring";
    size_t total_mib = 256, tensor_mib = 8, chunk_mib = 8;
    int qds[16] = {1, 2, 4, 8, 16, 32}, nqd = 6;
    int blocks[16] = {128, 512, 2048, 8192}, nblock = 4;
    int chunks = 32, depth = 2, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) total_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--tensor-mib") && i + 1 < argc) tensor_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--qd") && i + 1 < argc) nqd = parse_list(argv[++i], qds, 16);
        else if (!strcmp(argv[i], "--block-kib") && i + 1 < argc) nblock = parse_list(argv[++i], blocks, 16);
        else if (!strcmp(argv[i], "--chunks") && i + 1 < argc) chunks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk-mib") && i + 1 < argc) chunk_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc) depth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--io") && i + 1 < argc) io_name = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--dir DIR] [--mib TOTAL] [--tensor-mib N] [--qd 1,2,..] [--block-kib 128,..]\n"
                    "          [--chunks N] [--chunk-mib N] [--depth K] [--io uring|sync] [--reps N] [--json FILE]\n",
                    argv[0]);
            return 2;
        }
    }
    zero_nvme_io_engine io = !strcmp(io_name, "sync") ? ZERO_NVME_IO_SYNC : ZERO_NVME_IO_URING;
    size_t total = total_mib << 20, tensor = tensor_mib << 20;
    if (reps < 1) reps = 1;
    if (tensor == 0 || total < tensor || total % tensor) {
        fprintf(stderr, "--mib must be a positive multiple of --tensor-mib\n");
        return 2;
    }
    for (int b = 0; b < nblock; b++)
        if (blocks[b] <= 0 || blocks[b] % 4) {
            fprintf(stderr, "block sizes must be positive multiples of 4 KiB\n");
            return 2;
        }
    zero_set_log_handler(zero_log_to_stderr, ZERO_LOG_WARN, NULL);

    unsigned char *src = aligned_alloc(4096, total), *dst = aligned_alloc(4096, total);
    if (!src || !dst) {
        fprintf(stderr, "cannot allocate 2 x %zu MiB\n", total_mib);
        return 1;
    }
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < total; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(src + i, &x, 8);
    }
    memset(dst, 0, total);

    printf("zero-bench-offload: dir %s, %zu MiB per measurement, tensors of %zu MiB, io %s, best of %d\n\n", dir,
           total_mib, tensor_mib, io_name, reps);
    raw_result raw[16];
    double best_f = 0, best_w = 0, best_r = 0;
    printf("raw O_DIRECT dd loop (QD 1, sequential), GB/s\n%10s %12s %12s %12s\n", "block_KiB", "first_write",
           "overwrite", "read");
    for (int b = 0; b < nblock; b++) {
        raw[b] = (raw_result){0, 0, 0};
        for (int k = 0; k < reps; k++) {
            raw_result x = raw_dd(dir, total, (size_t)blocks[b] << 10, dst);
            raw[b].first_gbs = fmax(raw[b].first_gbs, x.first_gbs);
            raw[b].write_gbs = fmax(raw[b].write_gbs, x.write_gbs);
            raw[b].read_gbs = fmax(raw[b].read_gbs, x.read_gbs);
        }
        best_f = fmax(best_f, raw[b].first_gbs);
        best_w = fmax(best_w, raw[b].write_gbs);
        best_r = fmax(best_r, raw[b].read_gbs);
        printf("%10d %12.3f %12.3f %12.3f\n", blocks[b], raw[b].first_gbs, raw[b].write_gbs, raw[b].read_gbs);
    }
    printf("\nstore, GB/s (ratio = store / best raw of the same kind; same = store / raw at that block)\n");
    printf("%4s %9s | %11s %5s | %9s %5s %5s | %6s %5s %5s | %6s\n", "qd", "block_KiB", "first_write", "ratio",
           "overwrite", "ratio", "same", "read", "ratio", "same", "#wrong");
    store_result *res = calloc((size_t)(nqd * nblock), sizeof *res);
    int nres = 0;
    for (int b = 0; b < nblock; b++)
        for (int q = 0; q < nqd; q++) {
            store_result r = {0};
            for (int k = 0; k < reps; k++) {
                store_result x = store_run(dir, io, total, tensor, qds[q], (size_t)blocks[b] << 10, src, dst);
                r.qd = x.qd;
                r.block_kib = x.block_kib;
                r.first_gbs = fmax(r.first_gbs, x.first_gbs);
                r.write_gbs = fmax(r.write_gbs, x.write_gbs);
                r.read_gbs = fmax(r.read_gbs, x.read_gbs);
                r.wrong += x.wrong;
            }
            res[nres++] = r;
            printf("%4d %9d | %11.3f %5.2f | %9.3f %5.2f %5.2f | %6.3f %5.2f %5.2f | %6ld\n", r.qd, r.block_kib,
                   r.first_gbs, r.first_gbs / best_f, r.write_gbs, r.write_gbs / best_w,
                   r.write_gbs / raw[b].write_gbs, r.read_gbs, r.read_gbs / best_r, r.read_gbs / raw[b].read_gbs,
                   r.wrong);
            fflush(stdout);
        }
    int swap_qd = qds[nqd - 1] < 8 ? qds[nqd - 1] : 8;
    size_t swap_block = 1u << 20;
    swap_result sw = swap_run(dir, io, chunks, chunk_mib << 20, depth, swap_qd, swap_block, reps);
    printf("\nswapper: %d chunks x %zu MiB, depth %d, qd %d, block 1 MiB, compute reps %d\n", chunks, chunk_mib,
           depth, swap_qd, sw.reps);
    printf("  I/O %.3f s + compute %.3f s: serialized %.3f s, pipelined %.3f s, ideal %.3f s\n", sw.io_s,
           sw.compute_s, sw.serialized_s, sw.pipelined_s, sw.ideal_s);
    printf("  speedup %.2fx, overlap %.2f (1 = perfect); pipelined caller blocked %.3f s: %.0f%% of the I/O "
           "hidden; #wrong %ld\n", sw.speedup, sw.overlap, sw.wait_s, 100 * sw.hidden, sw.wrong);

    FILE *f = fopen(json, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", json);
        return 1;
    }
    fprintf(f, "{\n  \"benchmark\": \"zero-bench-offload\",\n  \"dir\": \"%s\",\n  \"io\": \"%s\",\n", dir, io_name);
    fprintf(f, "  \"total_bytes\": %zu,\n  \"tensor_bytes\": %zu,\n  \"reps\": %d,\n  \"raw\": [\n", total, tensor,
            reps);
    for (int b = 0; b < nblock; b++)
        fprintf(f, "    {\"block_kib\": %d, \"first_write_gbs\": %.4f, \"write_gbs\": %.4f, \"read_gbs\": %.4f}%s\n",
                blocks[b], raw[b].first_gbs, raw[b].write_gbs,
                raw[b].read_gbs, b + 1 < nblock ? "," : "");
    fprintf(f, "  ],\n  \"raw_best_first_write_gbs\": %.4f,\n  \"raw_best_write_gbs\": %.4f,\n"
               "  \"raw_best_read_gbs\": %.4f,\n  \"store\": [\n", best_f, best_w, best_r);
    for (int i = 0; i < nres; i++) {
        int b = i / nqd;
        fprintf(f,
                "    {\"qd\": %d, \"block_kib\": %d, \"first_write_gbs\": %.4f, \"first_write_ratio\": %.3f, "
                "\"write_gbs\": %.4f, \"read_gbs\": %.4f, \"write_ratio\": %.3f, "
                "\"read_ratio\": %.3f, \"write_vs_same_block\": %.3f, \"read_vs_same_block\": %.3f, "
                "\"wrong\": %ld}%s\n",
                res[i].qd, res[i].block_kib, res[i].first_gbs, res[i].first_gbs / best_f, res[i].write_gbs,
                res[i].read_gbs, res[i].write_gbs / best_w,
                res[i].read_gbs / best_r, res[i].write_gbs / raw[b].write_gbs, res[i].read_gbs / raw[b].read_gbs,
                res[i].wrong, i + 1 < nres ? "," : "");
    }
    fprintf(f,
            "  ],\n  \"swapper\": {\"chunks\": %d, \"chunk_bytes\": %zu, \"depth\": %d, \"qd\": %d, "
            "\"block_kib\": 1024, "
            "\"compute_reps\": %d, \"io_s\": %.4f, \"compute_s\": %.4f, \"serialized_s\": %.4f, \"pipelined_s\": %.4f, "
            "\"ideal_s\": %.4f, \"speedup\": %.3f, \"overlap\": %.3f, \"wait_s\": %.4f, \"io_hidden\": %.3f, "
            "\"wrong\": %ld}\n}\n",
            chunks, chunk_mib << 20, depth, swap_qd, sw.reps, sw.io_s, sw.compute_s, sw.serialized_s, sw.pipelined_s,
            sw.ideal_s, sw.speedup, sw.overlap, sw.wait_s, sw.hidden, sw.wrong);
    fclose(f);
    printf("\nwrote %s\n", json);
    long wrong = sw.wrong;
    for (int i = 0; i < nres; i++) wrong += res[i].wrong;
    free(res);
    free(src);
    free(dst);
    return wrong ? 1 : 0;
}
