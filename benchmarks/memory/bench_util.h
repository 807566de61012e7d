/* zero-bench: small helpers shared by the subcommands (argument parsing,
 * process memory, medians, error reporting). Not part of libzero. */
#ifndef ZERO_BENCH_UTIL_H
#define ZERO_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <zero/zero.h>

/* Print "zero-bench <what>: <status>: <message>" to stderr and return 1 when
 * `st` is not OK; 0 otherwise. Used as `if (bench_failed(st, "...")) goto out;` */
int bench_failed(zero_status st, const char *what);

/* "7.5e9", "1e6", "123" -> value; 0 on success, -1 on a malformed or negative number. */
int bench_parse_count(const char *text, double *out);
/* "f32"/"fp32", "bf16", "f16"/"fp16" -> dtype; -1 if unknown. */
int bench_parse_dtype(const char *text, zero_dtype *out);
/* "0,1,2,3" -> mask of stages (bit s); -1 on a malformed list. */
int bench_parse_stages(const char *text, unsigned *mask);

double bench_now_s(void);
/* This process's CPU time so far, all threads (seconds): on a shared
 * machine, what a phase cost without the time it waited for a core. */
double bench_cpu_s(void);
/* Median of n values (sorts a copy). */
double bench_median(const double *v, int n);

#define BENCH_GB 1e9
#define BENCH_GIB 1073741824.0

#endif
