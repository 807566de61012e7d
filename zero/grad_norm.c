/* This rank's part of the global gradient norm: the sum of squares of its
 * reduced fp32 gradient shard, bucket by bucket in plan order (each bucket's
 * sum is zero_sumsq over its chunk: fixed blocks of the device, summed in
 * order), without the owned parts of parameters marked duplicate.
 *
 * Where the bucket sums are taken. On the CPU device, when a bucket's last
 * reduction of the step lands in the shard (grads.c: the reduce-scatter
 * just wrote it, or the accumulating add just read and wrote it), its sum of
 * squares is taken at once, while the chunk is still in cache; the step then
 * only adds the stored sums. A separate pass at the step read the whole
 * shard from memory once more before the optimizer read it again: out of
 * cache it cost 30-40 % of the optimizer kernel (issue 15, zero-bench
 * stepcost). The sum is over the same final values, by the same function,
 * added in the same order, so the norm has the same bits either way. On
 * CUDA the step still takes them (a sum of squares is a host wait, which
 * would stall the backward pass there; the device reads the shard fast).
 * ZERO_NORM_AT_STEP=1 (read at engine create) takes them at the step on
 * the CPU too: the reference tests/engine/test_engine_norm.c compares with.
 *
 * Duplicates (zero_engine_set_param_duplicate, which may change between the
 * landing and the step) are always left out at the step, from the stored
 * whole-chunk sum's bucket: only buckets that hold one are read again. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

int grad_norm_at_landing(const zero_engine *e) { return !e->is_cuda && e->norm_at_landing; }

/* Bucket b's sum of squares over its whole chunk, and whether any element
 * is not finite. */
static zero_status chunk_sumsq(zero_engine *e, const zero_bucket *b, double *s, int *nf)
{
    *s = 0.0;
    *nf = 0;
    zero_status st = zero_sumsq(e->dev, e->gacc + b->shard_off, ZERO_F32, b->chunk, s, nf, e->stream);
    if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine: gradient norm: ");
    return ZERO_OK;
}

zero_status grad_norm_landed(zero_engine *e, const zero_bucket *b)
{
    zero_bucket_norm *bn = &e->bucket_norms[b - e->buckets];
    ZERO_TRY(chunk_sumsq(e, b, &bn->sumsq, &bn->nonfinite));
    bn->ready = 1;
    return ZERO_OK;
}

void grad_norm_forget(zero_engine *e)
{
    if (e->bucket_norms) memset(e->bucket_norms, 0, (size_t)e->num_buckets * sizeof *e->bucket_norms);
}

/* Bucket b's sum of squares without the parameters marked duplicate (the
 * whole-chunk sum `whole` stays when it has none): the counted parameters'
 * owned pieces of this bucket, in order. Non-finite values of duplicates
 * were already flagged by the whole-chunk sum. */
static zero_status without_duplicates(zero_engine *e, const zero_bucket *b, double *s)
{
    int any = 0;
    for (int i = b->first_param; i < b->first_param + b->num_params; i++) any |= e->params[i].duplicate;
    if (!any) return ZERO_OK;
    double sum = 0.0;
    for (int i = b->first_param; i < b->first_param + b->num_params; i++) {
        const zero_param *p = &e->params[i];
        uint64_t lo, hi, in_chunk;
        if (p->duplicate || !plan_owned_piece(e, p, b, &lo, &hi, &in_chunk)) continue;
        double ps = 0.0;
        int nf = 0;
        zero_status st = zero_sumsq(e->dev, e->gacc + b->shard_off + in_chunk, ZERO_F32, hi - lo, &ps, &nf, e->stream);
        if (st != ZERO_OK) return zero_fail_forward(&e->err, st, "engine: gradient norm: ");
        sum += ps;
    }
    *s = sum;
    return ZERO_OK;
}

zero_status grad_norm_local(zero_engine *e, double *local)
{
    double total = 0.0;
    int nonfinite = 0;
    for (int bi = 0; bi < e->num_buckets; bi++) {
        const zero_bucket *b = &e->buckets[bi];
        zero_bucket_norm *bn = &e->bucket_norms[bi];
        double s = bn->sumsq;
        int nf = bn->nonfinite;
        if (!bn->ready) ZERO_TRY(chunk_sumsq(e, b, &s, &nf));
        if (e->num_duplicates > 0) ZERO_TRY(without_duplicates(e, b, &s));
        total += s;
        nonfinite |= nf;
    }
    *local = nonfinite ? INFINITY : total;
    return ZERO_OK;
}
