#include "bench_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int bench_failed(zero_status st, const char *what)
{
    if (st == ZERO_OK) return 0;
    fprintf(stderr, "zero-bench %s: %s: %s\n", what, zero_status_name(st), zero_last_error());
    return 1;
}

int bench_parse_count(const char *text, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end != '\0' || !(v >= 0)) return -1;
    *out = v;
    return 0;
}

int bench_parse_dtype(const char *text, zero_dtype *out)
{
    if (!strcmp(text, "f32") || !strcmp(text, "fp32")) *out = ZERO_F32;
    else if (!strcmp(text, "bf16")) *out = ZERO_BF16;
    else if (!strcmp(text, "f16") || !strcmp(text, "fp16")) *out = ZERO_F16;
    else return -1;
    return 0;
}

int bench_parse_stages(const char *text, unsigned *mask)
{
    unsigned m = 0;
    for (const char *p = text; *p; p++) {
        if (*p >= '0' && *p <= '3') m |= 1u << (*p - '0');
        else if (*p != ',') return -1;
    }
    if (!m) return -1;
    *mask = m;
    return 0;
}

double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double bench_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(const double *v, int n)
{
    if (n <= 0) return 0.0;
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) return v[0];
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = (n % 2) ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}
