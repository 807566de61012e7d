/* zero-bench-coll: nccl-tests-style bandwidth of all-reduce, reduce-scatter,
 * all-gather, all-to-all and all-to-all-v through libzero, side by side with the raw blocking MPI call
 * on the same ranks, buffers and sizes, in the same run.
 *
 *   tests/mpirun.sh 2 build/benchmarks/collectives/zero-bench-coll --max-bytes 64M
 *
 * For every op and size S (bytes of the whole array, as nccl-tests counts it:
 * the all-reduce buffer, the reduce-scatter input, the all-gather output,
 * the all-to-all send buffer):
 * warm up, time many iterations in 5 alternating rounds (ours, raw, raw,
 * ours, ...) so drift hits both sides alike, average each round's time per op
 * across ranks, take the median round of each side, and report
 *   algbw = S / time,  busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n (others)
 * All-to-all-v sends uneven chunks: to rank j, count + count/2 when
 * (rank + j) % n == 0, count - count/2 when it is 1, else count (every rank
 * still sends and receives S in total); its peer is MPI_Alltoallv.
 * plus #wrong: elements that differ from the exact reference in a checked run
 * of each side, and ratio = our time / raw time.
 *
 * --dtype bf16: ours moves bf16 (summed in fp32, rounded once); MPI has no
 * bf16, so the raw peer is what a program would write without us: all-gather
 * as 16-bit words, reductions widened to fp32, reduced by MPI, rounded back
 * (conversions included in its time). */
#include <mpi.h>
#include <zero/comm.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct options {
    size_t min_bytes, max_bytes;
    int factor;
    double target_s; /* time per side per size, roughly */
    int warmup;
    const char *json, *csv;
    int ops[5];
    int bf16;
} options;

typedef struct result {
    const char *op;
    size_t bytes, count;
    double t_ours, t_raw; /* seconds per op, averaged over ranks */
    long wrong_ours, wrong_raw;
    int iters;
} result;

static int rank, nranks;

static size_t parse_size(const char *s)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return 0;
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

static void usage(void)
{
    if (rank == 0)
        fprintf(stderr,
                "usage: zero-bench-coll [--min-bytes 1K] [--max-bytes 256M] [--factor 2] [--time 0.05]\n"
                "                       [--warmup 3] [--ops allreduce,reduce_scatter,allgather,alltoall,alltoallv]\n"
                "                       [--dtype f32|bf16] [--json FILE] [--csv FILE]\n"
                "Run under mpirun with 2 or more ranks; sizes take K/M/G suffixes (powers of 1024).\n");
}

static int parse(int argc, char **argv, options *o)
{
    *o = (options){.min_bytes = 1024, .max_bytes = 256u << 20, .factor = 2, .target_s = 0.05, .warmup = 3,
                   .ops = {1, 1, 1, 1, 1}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!v) return -1;
        if (!strcmp(a, "--min-bytes")) o->min_bytes = parse_size(v);
        else if (!strcmp(a, "--max-bytes")) o->max_bytes = parse_size(v);
        else if (!strcmp(a, "--factor")) o->factor = atoi(v);
        else if (!strcmp(a, "--time")) o->target_s = atof(v);
        else if (!strcmp(a, "--warmup")) o->warmup = atoi(v);
        else if (!strcmp(a, "--json")) o->json = v;
        else if (!strcmp(a, "--csv")) o->csv = v;
        else if (!strcmp(a, "--dtype")) {
            if (strcmp(v, "f32") && strcmp(v, "bf16")) return -1;
            o->bf16 = !strcmp(v, "bf16");
        }
        else if (!strcmp(a, "--ops")) {
            /* comma-separated names ("alltoall" must not select "alltoallv") */
            static const char *names[5] = {"allreduce", "reduce_scatter", "allgather", "alltoall", "alltoallv"};
            for (int k = 0; k < 5; k++) {
                size_t len = strlen(names[k]);
                o->ops[k] = 0;
                for (const char *p = v; (p = strstr(p, names[k])) != NULL; p += len)
                    if ((p == v || p[-1] == ',') && (p[len] == ',' || p[len] == '\0')) o->ops[k] = 1;
            }
        } else return -1;
        i++;
    }
    if (!o->min_bytes || o->max_bytes < o->min_bytes || o->factor < 2 || o->target_s <= 0 || o->warmup < 0)
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- one op */

enum { OP_AR = 0, OP_RS = 1, OP_AG = 2, OP_A2A = 3, OP_A2AV = 4 };
static const char *op_names[] = {"allreduce", "reduce_scatter", "allgather", "alltoall", "alltoallv"};

typedef struct bufs {
    void *send, *recv;
    float *wide_send, *wide_recv; /* bf16: the raw peer's fp32 copies */
    zero_comm *zc;
    MPI_Comm mc;
    int bf16;
    size_t es;
    size_t *vc, *vd;   /* all-to-all-v: counts and displacements, send then recv (2n each) */
    int *ivc, *ivd;    /* the same as MPI's ints */
} bufs;

/* All-to-all-v: elements rank `from` sends to rank `to` (see the header). */
static size_t vchunk(size_t count, int from, int to)
{
    int k = (from + to) % nranks;
    return k == 0 ? count + count / 2 : k == 1 ? count - count / 2 : count;
}

static void set_vcounts(bufs *b, size_t count)
{
    size_t n = (size_t)nranks, so = 0, ro = 0;
    for (int j = 0; j < nranks; j++) {
        b->vc[j] = vchunk(count, rank, j);
        b->vc[n + j] = vchunk(count, j, rank);
        b->vd[j] = so;
        b->vd[n + j] = ro;
        so += b->vc[j];
        ro += b->vc[n + j];
    }
    for (size_t j = 0; j < 2 * n; j++) b->ivc[j] = (int)b->vc[j], b->ivd[j] = (int)b->vd[j];
}

/* Where rank `from`'s chunk for `to` starts in its send buffer. */
static size_t vsend_displ(size_t count, int from, int to)
{
    size_t d = 0;
    for (int j = 0; j < to; j++) d += vchunk(count, from, j);
    return d;
}

/* The raw peer's conversions, inline as a program would write them. */
static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* count: all-reduce elements; per-rank chunk for reduce-scatter/all-gather. */
static int run_ours(bufs *b, int op, size_t count)
{
    zero_status st = ZERO_OK;
    zero_dtype dt = b->bf16 ? ZERO_BF16 : ZERO_F32;
    switch (op) {
    case OP_AR: st = zero_allreduce(b->zc, b->send, b->recv, count, dt, ZERO_SUM); break;
    case OP_RS: st = zero_reduce_scatter(b->zc, b->send, b->recv, count, dt, ZERO_SUM); break;
    case OP_AG: st = zero_allgather(b->zc, b->send, b->recv, count, dt); break;
    case OP_A2A: st = zero_alltoall(b->zc, b->send, b->recv, count, dt); break;
    case OP_A2AV:
        st = zero_alltoallv(b->zc, b->send, b->vc, b->vd, b->recv, b->vc + nranks, b->vd + nranks, dt);
        break;
    }
    if (st != ZERO_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, zero_comm_last_error(b->zc));
        return -1;
    }
    return 0;
}

static int run_raw(bufs *b, int op, size_t count)
{
    int c = (int)count, rc = MPI_SUCCESS;
    if (op == OP_A2A || op == OP_A2AV) { /* no arithmetic: bf16 travels as 16-bit words */
        MPI_Datatype t = b->bf16 ? MPI_UINT16_T : MPI_FLOAT;
        rc = op == OP_A2A ? MPI_Alltoall(b->send, c, t, b->recv, c, t, b->mc)
                          : MPI_Alltoallv(b->send, b->ivc, b->ivd, t, b->recv, b->ivc + nranks, b->ivd + nranks, t,
                                          b->mc);
        return rc == MPI_SUCCESS ? 0 : -1;
    }
    if (b->bf16) {
        if (op == OP_AG)
            return MPI_Allgather(b->send, c, MPI_UINT16_T, b->recv, c, MPI_UINT16_T, b->mc) == MPI_SUCCESS ? 0 : -1;
        size_t in = op == OP_RS ? count * (size_t)nranks : count;
        const uint16_t *s16 = b->send;
        uint16_t *r16 = b->recv;
        for (size_t i = 0; i < in; i++) b->wide_send[i] = bf16_to_f32(s16[i]);
        rc = op == OP_AR ? MPI_Allreduce(b->wide_send, b->wide_recv, c, MPI_FLOAT, MPI_SUM, b->mc)
                         : MPI_Reduce_scatter_block(b->wide_send, b->wide_recv, c, MPI_FLOAT, MPI_SUM, b->mc);
        for (size_t i = 0; i < count; i++) r16[i] = f32_to_bf16(b->wide_recv[i]);
        return rc == MPI_SUCCESS ? 0 : -1;
    }
    switch (op) {
    case OP_AR: rc = MPI_Allreduce(b->send, b->recv, c, MPI_FLOAT, MPI_SUM, b->mc); break;
    case OP_RS: rc = MPI_Reduce_scatter_block(b->send, b->recv, c, MPI_FLOAT, MPI_SUM, b->mc); break;
    case OP_AG: rc = MPI_Allgather(b->send, c, MPI_FLOAT, b->recv, c, MPI_FLOAT, b->mc); break;
    }
    return rc == MPI_SUCCESS ? 0 : -1;
}

/* Exact small integers: every partial sum is exact, so the check is bitwise. */
static float value(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 13) % 61) - 30); }

/* (Sums of up to 8 ranks stay below 256: exact in bf16 too.) */
static void fill(bufs *b, int op, size_t count)
{
    size_t in = op == OP_AR || op == OP_AG ? count : count * (size_t)nranks;
    for (size_t i = 0; i < in; i++) {
        if (b->bf16)
            ((uint16_t *)b->send)[i] = f32_to_bf16(value(rank, i));
        else
            ((float *)b->send)[i] = value(rank, i);
    }
    size_t out = op == OP_AR || op == OP_RS ? count : count * (size_t)nranks;
    memset(b->recv, 0xFF, out * b->es); /* NaN: a missed element shows */
}

static float got(const bufs *b, size_t i)
{
    return b->bf16 ? bf16_to_f32(((const uint16_t *)b->recv)[i]) : ((const float *)b->recv)[i];
}

static long check(bufs *b, int op, size_t count)
{
    long wrong = 0;
    if (op == OP_A2A || op == OP_A2AV) {
        /* chunk q here is rank q's chunk for this rank */
        for (int q = 0; q < nranks; q++) {
            size_t len = op == OP_A2A ? count : vchunk(count, q, rank);
            size_t at = op == OP_A2A ? (size_t)q * count : b->vd[nranks + q];
            size_t from = op == OP_A2A ? (size_t)rank * count : vsend_displ(count, q, rank);
            for (size_t i = 0; i < len; i++) wrong += got(b, at + i) != value(q, from + i);
        }
    } else if (op == OP_AG) {
        for (int q = 0; q < nranks; q++)
            for (size_t i = 0; i < count; i++) wrong += got(b, (size_t)q * count + i) != value(q, i);
    } else {
        size_t base = op == OP_RS ? (size_t)rank * count : 0;
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int q = 0; q < nranks; q++) want += value(q, base + i);
            wrong += got(b, i) != want;
        }
    }
    return wrong;
}

static double max_over_ranks(double v)
{
    double m = 0;
    MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

static int measure(bufs *b, const options *o, int op, size_t bytes, result *res)
{
    size_t total = bytes / b->es;
    size_t count = op == OP_AR ? total : total / (size_t)nranks;
    if (!count) return 1;
    res->op = op_names[op];
    res->bytes = (op == OP_AR ? count : count * (size_t)nranks) * b->es;
    res->count = count;
    if (op == OP_A2AV) set_vcounts(b, count);

    /* correctness, both sides, before timing */
    fill(b, op, count);
    if (run_ours(b, op, count)) return -1;
    long w_ours = check(b, op, count);
    fill(b, op, count);
    if (run_raw(b, op, count)) return -1;
    long w_raw = check(b, op, count);
    MPI_Allreduce(&w_ours, &res->wrong_ours, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&w_raw, &res->wrong_raw, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);

    /* Large sizes need little warm-up (the checked run above touched every
     * page); this keeps the README's 64 MiB run well under a minute. */
    int warmup = bytes >= ((size_t)8 << 20) && o->warmup > 1 ? 1 : o->warmup;
    for (int i = 0; i < warmup; i++)
        if (run_ours(b, op, count) || run_raw(b, op, count)) return -1;

    /* Size the blocks from one timed op of each side (slowest rank). */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (run_ours(b, op, count) || run_raw(b, op, count)) return -1;
    double one = max_over_ranks((MPI_Wtime() - t0) / 2);
    int iters = (int)(o->target_s / (one > 1e-7 ? one : 1e-7));
    if (iters < 5) iters = 5;
    if (iters > 3000) iters = 3000;
    enum { ROUNDS = 5 };
    int per = (iters + ROUNDS - 1) / ROUNDS;
    iters = per * ROUNDS;

    /* Per-round times (ours, raw), averaged over ranks; the reported time is
     * the median round, which a burst of load from another process on a
     * shared machine moves much less than the mean. */
    double t[2][ROUNDS], avg[2][ROUNDS];
    for (int rd = 0; rd < ROUNDS; rd++) {
        for (int side = 0; side < 2; side++) {
            /* Alternate which side goes first so neither always follows a
             * barrier with cold caches. */
            int ours = (side == 0) == (rd % 2 == 0);
            MPI_Barrier(MPI_COMM_WORLD);
            double s = MPI_Wtime();
            for (int i = 0; i < per; i++)
                if (ours ? run_ours(b, op, count) : run_raw(b, op, count)) return -1;
            t[ours ? 0 : 1][rd] = (MPI_Wtime() - s) / per;
        }
    }
    MPI_Allreduce(t, avg, 2 * ROUNDS, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int side = 0; side < 2; side++) {
        double *v = avg[side];
        for (int i = 0; i < ROUNDS; i++) v[i] /= nranks;
        for (int i = 1; i < ROUNDS; i++) /* insertion sort: 5 values */
            for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
                double x = v[j];
                v[j] = v[j - 1];
                v[j - 1] = x;
            }
    }
    res->t_ours = avg[0][ROUNDS / 2];
    res->t_raw = avg[1][ROUNDS / 2];
    res->iters = iters;
    return 0;
}

/* ---------------------------------------------------------------- output */

static double busbw_factor(const char *op)
{
    double n = nranks;
    return !strcmp(op, "allreduce") ? 2 * (n - 1) / n : (n - 1) / n;
}

static void print_row(const result *r)
{
    double algo = r->bytes / r->t_ours / 1e9, algr = r->bytes / r->t_raw / 1e9, f = busbw_factor(r->op);
    printf("%-15s %11zu %10zu  %10.2f %7.2f %7.2f %6ld   %10.2f %7.2f %7.2f %6ld   %6.3f\n", r->op, r->bytes,
           r->count, r->t_ours * 1e6, algo, algo * f, r->wrong_ours, r->t_raw * 1e6, algr, algr * f, r->wrong_raw,
           r->t_ours / r->t_raw);
    fflush(stdout);
}

static void write_files(const options *o, const result *rs, int n)
{
    if (o->json) {
        FILE *f = fopen(o->json, "w");
        if (!f) {
            fprintf(stderr, "zero-bench-coll: cannot write %s: %s\n", o->json, strerror(errno));
        } else {
            fprintf(f, "{\n  \"benchmark\": \"zero-bench-coll\",\n  \"ranks\": %d,\n  \"dtype\": \"%s\",\n"
                       "  \"peer\": \"raw blocking MPI call%s\",\n  \"results\": [\n",
                    nranks, o->bf16 ? "bf16" : "f32", o->bf16 ? " (bf16 reductions widened to fp32)" : "");
            for (int i = 0; i < n; i++) {
                const result *r = &rs[i];
                double f2 = busbw_factor(r->op);
                fprintf(f,
                        "    {\"op\": \"%s\", \"bytes\": %zu, \"count\": %zu, \"iters\": %d, "
                        "\"time_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f, \"wrong\": %ld, "
                        "\"raw_time_us\": %.3f, \"raw_algbw_gbs\": %.4f, \"raw_busbw_gbs\": %.4f, \"raw_wrong\": %ld, "
                        "\"time_ratio\": %.4f}%s\n",
                        r->op, r->bytes, r->count, r->iters, r->t_ours * 1e6, r->bytes / r->t_ours / 1e9,
                        r->bytes / r->t_ours / 1e9 * f2, r->wrong_ours, r->t_raw * 1e6, r->bytes / r->t_raw / 1e9,
                        r->bytes / r->t_raw / 1e9 * f2, r->wrong_raw, r->t_ours / r->t_raw, i + 1 < n ? "," : "");
            }
            fprintf(f, "  ]\n}\n");
            fclose(f);
        }
    }
    if (o->csv) {
        FILE *f = fopen(o->csv, "w");
        if (!f) {
            fprintf(stderr, "zero-bench-coll: cannot write %s: %s\n", o->csv, strerror(errno));
            return;
        }
        fprintf(f, "op,dtype,ranks,bytes,count,iters,time_us,algbw_gbs,busbw_gbs,wrong,raw_time_us,raw_algbw_gbs,"
                   "raw_busbw_gbs,raw_wrong,time_ratio\n");
        for (int i = 0; i < n; i++) {
            const result *r = &rs[i];
            double f2 = busbw_factor(r->op);
            fprintf(f, "%s,%s,%d,%zu,%zu,%d,%.3f,%.4f,%.4f,%ld,%.3f,%.4f,%.4f,%ld,%.4f\n", r->op,
                    o->bf16 ? "bf16" : "f32", nranks, r->bytes,
                    r->count, r->iters, r->t_ours * 1e6, r->bytes / r->t_ours / 1e9, r->bytes / r->t_ours / 1e9 * f2,
                    r->wrong_ours, r->t_raw * 1e6, r->bytes / r->t_raw / 1e9, r->bytes / r->t_raw / 1e9 * f2,
                    r->wrong_raw, r->t_ours / r->t_raw);
        }
        fclose(f);
    }
}

int main(int argc, char **argv)
{
    /* MPI is ours here, so the library leaves init/finalize to us and both
     * sides run under the same thread level. */
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    options o;
    int pr = parse(argc, argv, &o);
    if (pr != 0) {
        usage();
        MPI_Finalize();
        return pr > 0 ? 0 : 2;
    }

    zero_comm_config cfg = ZERO_COMM_CONFIG_INIT;
    cfg.backend = nranks > 1 ? ZERO_BACKEND_MPI : ZERO_BACKEND_LOCAL;
    cfg.timeout_s = 120;
    bufs b = {0};
    if (zero_comm_create_world(&b.zc, &cfg) != ZERO_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, zero_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &b.mc);
    /* The largest buffers any op needs: the whole array on each side. */
    b.bf16 = o.bf16;
    b.es = o.bf16 ? 2 : 4;
    size_t maxe = o.max_bytes / b.es + (size_t)nranks;
    b.vc = calloc(4 * (size_t)nranks, sizeof *b.vc);
    b.vd = b.vc + 2 * nranks;
    b.ivc = calloc(4 * (size_t)nranks, sizeof *b.ivc);
    b.ivd = b.ivc + 2 * nranks;
    b.send = calloc(maxe, b.es);
    b.recv = calloc(maxe, b.es);
    if (b.bf16) {
        b.wide_send = calloc(maxe, sizeof(float));
        b.wide_recv = calloc(maxe, sizeof(float));
    }
    if (!b.send || !b.recv || (b.bf16 && (!b.wide_send || !b.wide_recv))) {
        fprintf(stderr, "rank %d: cannot allocate buffers for %zu elements\n", rank, maxe);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    if (rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = '\0';
        printf("# zero-bench-coll: %d ranks, dtype %s, out of place, sizes %zu..%zu bytes, backend %s\n", nranks,
               o.bf16 ? "bf16" : "f32", o.min_bytes, o.max_bytes, cfg.backend == ZERO_BACKEND_MPI ? "mpi" : "local");
        printf("# peer: the raw blocking MPI call on a dup of MPI_COMM_WORLD (%.60s)%s\n", lib,
               o.bf16 ? "; bf16 reductions widened to fp32 and rounded back around it" : "");
        printf("# time = median of 5 rounds, each averaged over ranks; algbw = bytes/time; busbw = algbw x 2(n-1)/n (allreduce), "
               "x (n-1)/n (others); ratio = zero time / raw time\n");
        printf("%-15s %11s %10s  %10s %7s %7s %6s   %10s %7s %7s %6s   %6s\n", "#", "", "", "---- zero", "", "",
               "", "---- raw MPI", "", "", "", "");
        printf("%-15s %11s %10s  %10s %7s %7s %6s   %10s %7s %7s %6s   %6s\n", "# op", "bytes", "count",
               "time(us)", "algbw", "busbw", "#wrong", "time(us)", "algbw", "busbw", "#wrong", "ratio");
    }

    int cap = 256, n = 0, failed = 0;
    result *rs = calloc((size_t)cap, sizeof *rs);
    for (int op = 0; op < 5 && !failed; op++) {
        if (!o.ops[op]) continue;
        for (size_t bytes = o.min_bytes; bytes <= o.max_bytes && n < cap; bytes *= (size_t)o.factor) {
            int st = measure(&b, &o, op, bytes, &rs[n]);
            if (st < 0) {
                failed = 1;
                break;
            }
            if (st > 0) continue;
            if (rank == 0) print_row(&rs[n]);
            n++;
        }
    }
    long wrong = 0;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        wrong += rs[i].wrong_ours + rs[i].wrong_raw;
        if (rs[i].bytes >= (1u << 20) && rs[i].t_ours / rs[i].t_raw > worst) worst = rs[i].t_ours / rs[i].t_raw;
    }
    if (rank == 0) {
        if (worst > 0)
            printf("# wrong elements: %ld; worst time ratio from 1 MiB up: %.3f (target <= 1.02)\n", wrong, worst);
        else
            printf("# wrong elements: %ld\n", wrong);
        write_files(&o, rs, n);
    }
    free(rs);
    free(b.send);
    free(b.recv);
    free(b.wide_send);
    free(b.wide_recv);
    free(b.vc);
    free(b.ivc);
    zero_comm_destroy(b.zc);
    MPI_Comm_free(&b.mc);
    MPI_Finalize();
    return failed || wrong ? 1 : 0;
}
