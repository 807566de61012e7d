/* Minimal assertions for libzero's C tests.
 *
 * A test program returns check_exit(): 0 when every CHECK held, 1 otherwise;
 * CHECK_SKIP returns 77, which meson counts as skipped. Failures print the
 * expression, file, line and (under MPI) the rank, then the test continues,
 * so one run reports every broken property. */
#ifndef ZERO_TESTS_CHECK_H
#define ZERO_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures_;
static int check_rank_ = -1;

static inline void check_set_rank(int rank) { check_rank_ = rank; }

#define CHECK_PREFIX_() \
    (check_rank_ >= 0 ? fprintf(stderr, "[rank %d] ", check_rank_) : 0)

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            CHECK_PREFIX_();                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            check_failures_++;                                                     \
        }                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                       \
    do {                                                                           \
        if (!(cond)) {                                                             \
            CHECK_PREFIX_();                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                          \
            fputc('\n', stderr);                                                   \
            check_failures_++;                                                     \
        }                                                                          \
    } while (0)

/* A libzero call that must succeed; prints the library's message otherwise. */
#define CHECK_OK(call)                                                             \
    do {                                                                           \
        zero_status check_st_ = (call);                                            \
        if (check_st_ != ZERO_OK) {                                                \
            CHECK_PREFIX_();                                                       \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, \
                    zero_status_name(check_st_), zero_last_error());               \
            check_failures_++;                                                     \
        }                                                                          \
    } while (0)

/* |a - b| <= tol * max(1, |b|) */
#define CHECK_CLOSE(a, b, tol)                                                     \
    do {                                                                           \
        double check_a_ = (a), check_b_ = (b);                                     \
        double check_s_ = fabs(check_b_) > 1.0 ? fabs(check_b_) : 1.0;             \
        if (!(fabs(check_a_ - check_b_) <= (tol) * check_s_)) {                    \
            CHECK_PREFIX_();                                                       \
            fprintf(stderr, "%s:%d: CHECK_CLOSE failed: %s = %.9g, %s = %.9g, tol %g\n", \
                    __FILE__, __LINE__, #a, check_a_, #b, check_b_, (double)(tol)); \
            check_failures_++;                                                     \
        }                                                                          \
    } while (0)

#define CHECK_SKIP(...)                                                            \
    do {                                                                           \
        fprintf(stderr, "SKIP: " __VA_ARGS__);                                     \
        fputc('\n', stderr);                                                       \
        return 77;                                                                 \
    } while (0)

static inline int check_exit(void) { return check_failures_ ? 1 : 0; }

#endif
