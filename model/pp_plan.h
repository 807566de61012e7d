/* Pipeline schedules as data: what each stage does, in order, as a list of
 * ops the runtime executes (pp_exec.c) and a checker validates before
 * anything runs.
 *
 * The model. p stages (ranks of the pp group), v chunks per stage
 * (interleaved schedules; 1 otherwise): virtual stage q = c*p + s is chunk c
 * of stage s, and the model's blocks are split into p*v contiguous ranges in
 * virtual-stage order (so stage s holds ranges s, p+s, 2p+s, ...). Virtual
 * stage 0 holds the embedding, the last one the head. Per stage, ops:
 *   F(m,c)          forward of micro-batch m through chunk c
 *   B(m,c)          its input gradients (the activation gradient, the
 *                   LayerNorms', head's and embedding's gradients)
 *   W(m,c)          its weight gradients (the linear layers'); a W right
 *                   after its B is one unsplit backward
 *   SEND_ACT(m,c)   F's output to the next virtual stage
 *   RECV_ACT(m,c)   F's input from the previous virtual stage
 *   SEND_GRAD(m,c)  B's input gradient to the previous virtual stage
 *   RECV_GRAD(m,c)  B's output gradient from the next virtual stage
 * A comm op with `group` set is in one group with the op before it (issued
 * together with zero_comm_group_begin/end, so a send and a receive pair up
 * whatever their order).
 *
 * How it runs (pp_exec.c), which is what the checker simulates: a stage
 * issues its comm groups in order without waiting and runs its compute ops
 * in order; a compute op waits for the receive of its input; the groups of a
 * stage complete one after another (NCCL runs them on one stream, in order),
 * and each send and receive BLOCKS until its peer posted the matching one (a
 * rendezvous: what a large message gets from MPI, and every message from
 * NCCL). Messages between two stages match in the order they were issued.
 * A micro-batch's activations occupy a slot of its chunk from its F until
 * its W (an incoming activation lands in a receive buffer from its RECV_ACT
 * until its F copies it in); a new micro-batch in a slot waits for the old
 * one's sends from it (F for SEND_ACT, B for SEND_GRAD).
 *
 * The checker (pp_plan_check) refuses, with ZERO_INVALID_ARGUMENT and a
 * message naming the stage, the op and what is wrong:
 *   - an op out of range (micro-batch, chunk), or a comm op with no peer
 *     (a RECV_ACT on virtual stage 0, a SEND_GRAD there, ...);
 *   - a missing or repeated op: every (m,c) needs exactly one F, B, W on its
 *     stage, and the comm ops its position needs;
 *   - a dependency broken within a stage: F before its RECV_ACT, B before its
 *     F or its RECV_GRAD, W before its B, a send before what it sends;
 *   - a message without its match: a send the peer never receives (or the
 *     reverse), or the k-th message between two stages is not the one the
 *     receiver expects as its k-th;
 * and, with ZERO_CONFIG, a schedule that DEADLOCKS under the rules above,
 * naming every stuck stage and what it waits for ("deadlock: ..."). It reports per stage the peak of live micro-batch activation
 * sets (in chunk units, and in units of a whole stage's set), the slots each
 * chunk needs, and the theoretical bubble fraction for equal F, B, W times.
 *
 * Generators: GPipe, 1F1B (Megatron's non-interleaved, PipeDream-flush),
 * interleaved 1F1B (Megatron's virtual stages; M a multiple of p), ZB-H1 and
 * ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, their
 * handcrafted schedules: B and W apart; H1 at 1F1B's activation memory, H2
 * with min(2p-1, M) live sets on every stage and, with M >= 2p-1, no idle
 * time inside any stage's span - the bubble left in one flushed step is
 * the p-1 units of the first op's start and the last op's end, which
 * overlapping steps would fill: overlap_bubble 0). Every generated plan
 * passes the checker (tested for p 1..4 and many M). */
#ifndef ZERO_MODEL_PP_PLAN_H
#define ZERO_MODEL_PP_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <zero/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pp_op_kind {
    PP_OP_F = 0,
    PP_OP_B = 1,
    PP_OP_W = 2,
    PP_OP_SEND_ACT = 3,
    PP_OP_RECV_ACT = 4,
    PP_OP_SEND_GRAD = 5,
    PP_OP_RECV_GRAD = 6,
} pp_op_kind;

typedef struct pp_op {
    uint8_t kind;  /* pp_op_kind */
    uint8_t group; /* comm op: 1 = in one group with the previous op of the stage */
    uint16_t chunk;
    int32_t micro;
} pp_op;

typedef enum pp_schedule_kind {
    PP_SCHED_GPIPE = 0,
    PP_SCHED_1F1B = 1,
    PP_SCHED_INTERLEAVED = 2, /* interleaved 1F1B, v chunks per stage */
    PP_SCHED_ZB_H1 = 3,
    PP_SCHED_ZB_H2 = 4,
    PP_SCHED_COUNT = 5,
} pp_schedule_kind;

/* "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"; NULL when out of range. */
const char *pp_schedule_name(pp_schedule_kind kind);
/* The kind of a name (as above); ZERO_INVALID_ARGUMENT naming the choices. */
zero_status pp_schedule_parse(const char *name, pp_schedule_kind *out);

typedef struct pp_plan {
    int stages, chunks, micro_batches;
    char name[32];
    int *count;          /* ops of stage s */
    pp_op **ops;         /* ops[s][0..count[s]) */
    /* Filled by pp_plan_check: */
    int checked;
    int *peak_live;      /* per stage: most (m,c) activation sets live at once */
    double *peak_stage;  /* the same in units of one micro-batch through all of the stage's blocks (sum 1/v each) */
    int *slots;          /* [s * chunks + c]: slots chunk c of stage s needs */
    int *slot_of;        /* [(s * chunks + c) * M + m]: the slot of micro-batch m in chunk c of stage s */
    int *landing;        /* [s * chunks + c]: receive buffers for chunk c's incoming activations */
    int *landing_of;     /* [(s * chunks + c) * M + m]: the one micro-batch m's activations land in */
    int split;           /* some W does not follow its B at once (a W stash is needed) */
    double bubble;       /* theoretical idle fraction, F = B = W = 1 unit (unsplit B+W = 2): mean over stages */
    double makespan;     /* in those units */
    double overlap_bubble; /* the same when steps overlap (no flush): each stage's idle inside the
                              longest first-op-start-to-last-op-end span, mean over stages */
} pp_plan;

/* An empty plan of `stages` x (no ops yet); ops are appended with pp_plan_add. */
zero_status pp_plan_init(pp_plan *plan, int stages, int chunks, int micro_batches, const char *name);
zero_status pp_plan_add(pp_plan *plan, int stage, pp_op_kind kind, int micro, int chunk, int group);
void pp_plan_free(pp_plan *plan); /* NULL and a zeroed plan accepted */

/* Generate schedule `kind` for p stages, M micro-batches, v chunks (v must be
 * 1 but for PP_SCHED_INTERLEAVED, which needs v >= 2 and M a multiple of p).
 * The result is checked (pp_plan_check). */
zero_status pp_plan_generate(pp_plan *plan, pp_schedule_kind kind, int stages, int micro_batches, int chunks);
/* The same without the check (to inspect or mutate a generated plan). */
zero_status pp_plan_build(pp_plan *plan, pp_schedule_kind kind, int stages, int micro_batches, int chunks);
/* Print the plan, one stage per line ("F0.0 [SEND_ACT0.0 RECV_ACT1.0] ..."), to a FILE *. */
void pp_plan_print(const pp_plan *plan, void *file);

/* Validate and simulate (see above); fills the checked fields. */
zero_status pp_plan_check(pp_plan *plan);

/* pp_plan_check that also says, after a deadlock (ZERO_CONFIG), where each
 * stage's communication is stuck: stuck_first[s] = the first op of the group
 * it waits in, -1 when none (the generators repair their plans with it). */
zero_status pp_plan_check_stuck(pp_plan *plan, int *stuck_first);

/* The theoretical bubble (and makespan, may be NULL) of a checked plan when
 * every F takes f, every B b and every W w (per chunk op; communication
 * free), by the checker's simulation; the plan's unit-time figures are kept.
 * An unsplit backward is B then W at once, so b + w is its time (a measured
 * unsplit backward can be passed as b with w = 0). For comparing a measured
 * bubble with what the schedule allows at the measured op costs. */
zero_status pp_plan_bubble_for(pp_plan *plan, double f, double b, double w, double *bubble, double *makespan);

/* "F3.1" style text of one op (for messages and dumps). */
void pp_op_describe(const pp_op *op, char *buf, size_t len);

/* The virtual stage of chunk c on stage s, and the reverse. */
static inline int pp_virtual_stage(int stages, int stage, int chunk) { return chunk * stages + stage; }

#ifdef __cplusplus
}
#endif

#endif
