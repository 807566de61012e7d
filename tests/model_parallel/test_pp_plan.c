/* Pipeline schedules as data (model/pp_plan.h), one process:
 *   - every generator passes its own checker for p = 1..4 stages and many M
 *     (interleaved: p >= 2, v = 2, 3, M a multiple of p);
 *   - peak live activations: GPipe M, 1F1B min(p - s, M), ZB-H1 at most
 *     1F1B's, ZB-H2 min(2p - 1, M) on every stage; slots = what the checker assigns;
 *   - theoretical bubbles (F = B = W): 1F1B and GPipe (p-1)/(M+p-1) of the
 *     step exactly; interleaved, ZB-H1 and ZB-H2 strictly below 1F1B at
 *     p = 4, M = 8; ZB-H1 (the paper's) 3M + p - 1 units for M >= p, i.e.
 *     (p-1)(F+B-W) idle, also at F:B:W = 1:2:1 (pp_plan_bubble_for), and
 *     ZB-H2 there the paper's (p-1)(F+B-2W);
 *   - ZB-H2 (the paper's handcrafted one) for p = 1..4, M = 1..16: bubble
 *     at most ZB-H1's, and with M >= 2p - 1 none inside any stage's span
 *     (overlap_bubble 0: the parallelogram) where ZB-H1 has some;
 *   - the checker refuses by name: a missing receive, a W before its B,
 *     a repeated op, receives in another order than the sends, a grouped
 *     compute op, and (ZERO_CONFIG, "deadlock") 1F1B with its send/receive
 *     pairs ungrouped.
 * `print` prints the table of theoretical bubbles for docs/pipeline.md. */
#include <math.h>

#include "check.h"
#include "gpt.h"
#include "pp_plan.h"

static pp_plan copy_without(const pp_plan *src, int stage, int drop, int swap_a, int swap_b, int ungroup)
{
    pp_plan p;
    pp_plan_init(&p, src->stages, src->chunks, src->micro_batches, "mutated");
    for (int s = 0; s < src->stages; s++) {
        int n = src->count[s];
        for (int i = 0; i < n; i++) {
            if (s == stage && i == drop) continue;
            int j = i;
            if (s == stage && i == swap_a) j = swap_b;
            else if (s == stage && i == swap_b) j = swap_a;
            const pp_op *o = &src->ops[s][j];
            int group = ungroup ? 0 : o->group;
            if (s == stage && (i == swap_a || i == swap_b)) group = 0;
            pp_plan_add(&p, s, (pp_op_kind)o->kind, o->micro, o->chunk, group);
        }
    }
    return p;
}

static int find(const pp_plan *p, int s, int kind, int m, int c)
{
    for (int i = 0; i < p->count[s]; i++)
        if (p->ops[s][i].kind == kind && p->ops[s][i].micro == m && p->ops[s][i].chunk == c) return i;
    return -1;
}

/* Qi et al.'s handcrafted ZB-H2 against ZB-H1 (F = B = W): accepted by the
 * checker, never a larger bubble (a flushed step has the same p - 1 idle
 * units), the peak (2p - 1) micro-batches on every stage (M when fewer),
 * and with M >= 2p - 1 the parallelogram: no stage idles between its first
 * and its last op, so overlapping steps would run without a bubble
 * (overlap_bubble 0), where ZB-H1 keeps its p - 1 units inside. */
static void zb_h2(void)
{
    for (int P = 1; P <= 4; P++)
        for (int M = 1; M <= 16; M++) {
            pp_plan h2, h1;
            zero_status st = pp_plan_generate(&h2, PP_SCHED_ZB_H2, P, M, 1);
            CHECK_MSG(st == ZERO_OK, "zb-h2 p %d M %d: %s", P, M, gpt_last_error());
            CHECK_OK(pp_plan_generate(&h1, PP_SCHED_ZB_H1, P, M, 1));
            if (st != ZERO_OK) continue;
            CHECK_MSG(h2.makespan <= h1.makespan && h2.bubble <= h1.bubble + 1e-12,
                      "zb-h2 p %d M %d: makespan %.1f bubble %.4f, zb-h1 %.1f %.4f", P, M, h2.makespan, h2.bubble,
                      h1.makespan, h1.bubble);
            for (int s = 0; s < P; s++) CHECK(h2.peak_live[s] == (2 * P - 1 < M ? 2 * P - 1 : M));
            if (M >= 2 * P - 1) {
                CHECK_MSG(h2.overlap_bubble == 0 && h2.makespan == 3 * M + P - 1, "zb-h2 p %d M %d: overlap %.4f makespan %.1f",
                          P, M, h2.overlap_bubble, h2.makespan);
                if (P > 1) CHECK_MSG(h1.overlap_bubble > 0, "zb-h1 p %d M %d overlap %.4f", P, M, h1.overlap_bubble);
            }
            pp_plan_free(&h2), pp_plan_free(&h1);
        }
    /* the cases issue 13 names, with the figures docs/pipeline.md quotes */
    const int ps[2] = {2, 4}, ms[3] = {4, 8, 16};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            pp_plan h2, h1;
            CHECK_OK(pp_plan_generate(&h2, PP_SCHED_ZB_H2, ps[i], ms[j], 1));
            CHECK_OK(pp_plan_generate(&h1, PP_SCHED_ZB_H1, ps[i], ms[j], 1));
            const double unit = (double)(ps[i] - 1) / (3 * ms[j] + ps[i] - 1); /* p - 1 idle units per stage */
            const int peak = 2 * ps[i] - 1 < ms[j] ? 2 * ps[i] - 1 : ms[j];
            CHECK_MSG(fabs(h2.bubble - unit) < 1e-12 && fabs(h1.bubble - unit) < 1e-12 && h2.peak_live[0] == peak &&
                          h2.peak_live[ps[i] - 1] == peak && h2.split,
                      "zb-h2 p %d M %d bubble %.4f (zb-h1 %.4f) peak %d", ps[i], ms[j], h2.bubble, h1.bubble,
                      h2.peak_live[0]);
            pp_plan_free(&h2), pp_plan_free(&h1);
        }
}

static void generators(void)
{
    for (int P = 1; P <= 4; P++)
        for (int M = 1; M <= 12; M++)
            for (int k = 0; k < PP_SCHED_COUNT; k++) {
                int vs[2] = {1, 1}, nv = 1;
                if (k == PP_SCHED_INTERLEAVED) {
                    if (P < 2 || M % P) continue;
                    vs[0] = 2, vs[1] = 3, nv = 2;
                }
                for (int iv = 0; iv < nv; iv++) {
                    pp_plan p;
                    zero_status st = pp_plan_generate(&p, (pp_schedule_kind)k, P, M, vs[iv]);
                    CHECK_MSG(st == ZERO_OK, "%s p %d M %d v %d: %s", pp_schedule_name((pp_schedule_kind)k), P, M,
                              vs[iv], gpt_last_error());
                    if (st != ZERO_OK) continue;
                    for (int s = 0; s < P; s++) {
                        int f1 = P - s < M ? P - s : M;
                        if (k == PP_SCHED_GPIPE) CHECK(p.peak_live[s] == M);
                        if (k == PP_SCHED_1F1B) CHECK_MSG(p.peak_live[s] == f1, "1f1b p %d M %d stage %d peak %d", P, M, s, p.peak_live[s]);
                        /* ZB-H1: no stage above 1F1B's peak (its first stage's) */
                        if (k == PP_SCHED_ZB_H1) CHECK_MSG(p.peak_live[s] <= (P < M ? P : M), "zb-h1 p %d M %d stage %d peak %d", P, M, s, p.peak_live[s]);
                        /* ZB-H2: Qi et al.'s (2p - 1) M_B on every stage, M when fewer */
                        if (k == PP_SCHED_ZB_H2)
                            CHECK_MSG(p.peak_live[s] == (2 * P - 1 < M ? 2 * P - 1 : M), "zb-h2 p %d M %d stage %d peak %d",
                                      P, M, s, p.peak_live[s]);
                        int sum = 0;
                        for (int c = 0; c < p.chunks; c++) sum += p.slots[s * p.chunks + c];
                        CHECK(sum >= p.peak_live[s]);
                    }
                    /* Qi et al.'s ZB-H1: (p-1)(F+B-W) idle per stage, p-1 units at F = B = W */
                    if (k == PP_SCHED_ZB_H1 && M >= P)
                        CHECK_MSG(p.makespan == 3 * M + P - 1, "zb-h1 p %d M %d makespan %.1f", P, M, p.makespan);
                    if (k == PP_SCHED_1F1B || k == PP_SCHED_GPIPE)
                        CHECK_MSG(fabs(p.bubble - (double)(P - 1) / (M + P - 1)) < 1e-9, "%s p %d M %d bubble %.4f",
                                  p.name, P, M, p.bubble);
                    /* only the zero-bubble schedules run a W apart from its B */
                    if (k != PP_SCHED_ZB_H1 && k != PP_SCHED_ZB_H2) CHECK(!p.split);
                    pp_plan_free(&p);
                }
            }
    zb_h2();
    /* p = 4, M = 8: the bubbles the schedules exist for */
    pp_plan a, b, c, d;
    CHECK_OK(pp_plan_generate(&a, PP_SCHED_1F1B, 4, 8, 1));
    CHECK_OK(pp_plan_generate(&b, PP_SCHED_ZB_H1, 4, 8, 1));
    CHECK_OK(pp_plan_generate(&c, PP_SCHED_ZB_H2, 4, 8, 1));
    CHECK_OK(pp_plan_generate(&d, PP_SCHED_INTERLEAVED, 4, 8, 2));
    CHECK_MSG(b.bubble < a.bubble && c.bubble <= b.bubble && d.bubble < a.bubble,
              "bubbles 1f1b %.3f zb-h1 %.3f zb-h2 %.3f interleaved %.3f", a.bubble, b.bubble, c.bubble, d.bubble);
    /* the numbers docs/pipeline.md quotes: 33, 27, 27 units for 24 of work per stage (ZB-H1: the
     * paper's 27; one flushed step cannot go below p - 1 idle units) */
    CHECK(a.makespan == 33 && b.makespan == 27 && c.makespan == 27);
    CHECK(b.split && c.split && !a.split);
    /* op costs (pp_plan_bubble_for): unit costs give the unit figures back; 1F1B's bubble
     * (p-1)/(M+p-1) holds at any F:B ratio (an unsplit backward: b with w = 0); ZB-H2's
     * advantage rests on W filling the gaps: with W free it is no better than 1F1B's
     * flush-bound 3/11 at M = 8, p = 4 and B = 2F; the plan keeps its unit figures */
    double bub, span;
    CHECK_OK(pp_plan_bubble_for(&c, 1, 1, 1, &bub, &span));
    CHECK(fabs(bub - c.bubble) < 1e-12 && span == 27);
    CHECK_OK(pp_plan_bubble_for(&a, 1, 2, 0, &bub, &span));
    CHECK_MSG(fabs(bub - 3.0 / 11) < 1e-12 && span == 33, "1f1b at F 1, B+W 2: %.4f %.1f", bub, span);
    CHECK_OK(pp_plan_bubble_for(&a, 1, 3, 0, &bub, NULL));
    CHECK(fabs(bub - 3.0 / 11) < 1e-12);
    CHECK_OK(pp_plan_bubble_for(&c, 1, 2, 0, &bub, NULL));
    CHECK_MSG(bub > c.bubble + 0.05, "zb-h2 with W free %.4f, unit %.4f", bub, c.bubble);
    /* ZB-H1 at B = 2F = 2W: the paper's (p-1)(F+B-W) = 6 idle units, 38 in all; ZB-H2, with
     * more memory, the paper's (p-1)(F+B-2W) = 3: 35 */
    double bub2, span2;
    CHECK_OK(pp_plan_bubble_for(&b, 1, 2, 1, &bub, &span));
    CHECK_OK(pp_plan_bubble_for(&c, 1, 2, 1, &bub2, &span2));
    CHECK_MSG(span == 38 && span2 == 35 && bub2 < bub, "zb-h1 at 1:2:1 makespan %.1f bubble %.4f, zb-h2 %.1f %.4f", span,
              bub, span2, bub2);
    CHECK(c.makespan == 27 && pp_plan_bubble_for(&c, -1, 1, 1, &bub, NULL) == ZERO_INVALID_ARGUMENT &&
          strstr(gpt_last_error(), "op times F -1"));
    pp_plan_free(&a), pp_plan_free(&b), pp_plan_free(&c), pp_plan_free(&d);
}

static void refusals(void)
{
    pp_plan base;
    CHECK_OK(pp_plan_generate(&base, PP_SCHED_1F1B, 2, 4, 1));
    zero_status st;
    /* a missing receive */
    pp_plan p = copy_without(&base, 1, find(&base, 1, PP_OP_RECV_ACT, 2, 0), -1, -1, 0);
    st = pp_plan_check(&p);
    CHECK(st == ZERO_INVALID_ARGUMENT && strstr(gpt_last_error(), "stage 1 has no RECV_ACT(micro-batch 2, chunk 0)"));
    pp_plan_free(&p);
    /* W before its B */
    p = copy_without(&base, 0, -1, find(&base, 0, PP_OP_B, 1, 0), find(&base, 0, PP_OP_W, 1, 0), 0);
    st = pp_plan_check(&p);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT && strstr(gpt_last_error(), "runs W(micro-batch 1, chunk 0)") &&
                  strstr(gpt_last_error(), "before its B"),
              "%s", gpt_last_error());
    pp_plan_free(&p);
    /* receives in another order than the sends (stage 1 receives 1 before 0) */
    pp_plan_init(&p, 2, 1, 2, "swapped");
    const int s0[][2] = {{PP_OP_F, 0}, {PP_OP_SEND_ACT, 0}, {PP_OP_F, 1}, {PP_OP_SEND_ACT, 1}, {PP_OP_RECV_GRAD, 0},
                         {PP_OP_B, 0}, {PP_OP_W, 0}, {PP_OP_RECV_GRAD, 1}, {PP_OP_B, 1}, {PP_OP_W, 1}};
    const int s1[][2] = {{PP_OP_RECV_ACT, 1}, {PP_OP_RECV_ACT, 0}, {PP_OP_F, 0}, {PP_OP_F, 1}, {PP_OP_B, 0},
                         {PP_OP_W, 0}, {PP_OP_SEND_GRAD, 0}, {PP_OP_B, 1}, {PP_OP_W, 1}, {PP_OP_SEND_GRAD, 1}};
    for (int i = 0; i < 10; i++) pp_plan_add(&p, 0, (pp_op_kind)s0[i][0], s0[i][1], 0, 0);
    for (int i = 0; i < 10; i++) pp_plan_add(&p, 1, (pp_op_kind)s1[i][0], s1[i][1], 0, 0);
    st = pp_plan_check(&p);
    CHECK_MSG(st == ZERO_INVALID_ARGUMENT && strstr(gpt_last_error(), "does not match"), "%s", gpt_last_error());
    pp_plan_free(&p);
    /* a repeated op and a grouped compute op */
    p = copy_without(&base, 0, -1, -1, -1, 0);
    pp_plan_add(&p, 0, PP_OP_F, 0, 0, 0);
    CHECK(pp_plan_check(&p) == ZERO_INVALID_ARGUMENT && strstr(gpt_last_error(), "is repeated"));
    pp_plan_free(&p);
    p = copy_without(&base, 0, -1, -1, -1, 0);
    p.ops[0][1].group = 1;
    CHECK(pp_plan_check(&p) == ZERO_INVALID_ARGUMENT);
    pp_plan_free(&p);
    /* the same ops without the groups: each stage sends before it receives -> deadlock, refused */
    p = copy_without(&base, -1, -1, -1, -1, 1);
    st = pp_plan_check(&p);
    CHECK_MSG(st == ZERO_CONFIG && strstr(gpt_last_error(), "would deadlock") && strstr(gpt_last_error(), "stage 0") &&
                  strstr(gpt_last_error(), "stage 1"),
              "%s: %s", zero_status_name(st), gpt_last_error());
    pp_plan_free(&p);
    /* generator arguments */
    CHECK(pp_plan_generate(&p, PP_SCHED_INTERLEAVED, 2, 3, 2) == ZERO_CONFIG);
    CHECK(pp_plan_generate(&p, PP_SCHED_1F1B, 2, 4, 2) == ZERO_CONFIG);
    pp_schedule_kind k;
    CHECK(pp_schedule_parse("zb-h1", &k) == ZERO_OK && k == PP_SCHED_ZB_H1);
    CHECK(pp_schedule_parse("zb", &k) == ZERO_INVALID_ARGUMENT);
    pp_plan_free(&base);
}

static void print_table(void)
{
    printf("| schedule | p | M | v | theoretical bubble | peak live (stage 0) | makespan (units) |\n|---|---|---|---|---|---|---|\n");
    for (int P = 2; P <= 4; P += 2)
        for (int M = 4; M <= 8; M += 4)
            for (int k = 0; k < PP_SCHED_COUNT; k++) {
                pp_plan p;
                int v = k == PP_SCHED_INTERLEAVED ? 2 : 1;
                if (pp_plan_generate(&p, (pp_schedule_kind)k, P, M, v) != ZERO_OK) continue;
                printf("| %s | %d | %d | %d | %.3f | %d | %.1f |\n", p.name, P, M, v, p.bubble, p.peak_live[0],
                       p.makespan);
                pp_plan_free(&p);
            }
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "print") == 0) {
        print_table();
        return 0;
    }
    generators();
    refusals();
    return check_exit();
}
