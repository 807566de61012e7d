/* The file plumbing of the model's PyTorch drivers (model_driver.c for the
 * GPT, moe_driver.c for the MoE layer): `NAME IN OUT` from argv, exact reads
 * that name what came up short, and the output file. One copy for both;
 * every failure is one line on stderr naming the driver. */
#ifndef ZERO_TESTS_MODEL_DRIVER_IO_H
#define ZERO_TESTS_MODEL_DRIVER_IO_H

#include <stdio.h>
#include <stdlib.h>

/* IN opened for reading, *out_path set to OUT; NULL after the usage line
 * (*rc = 2) or the reason IN cannot be opened (*rc = 1). */
static inline FILE *driver_open_input(int argc, char **argv, const char *name, const char **out_path, int *rc)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s IN OUT\n", name);
        *rc = 2;
        return NULL;
    }
    FILE *in = fopen(argv[1], "rb");
    if (!in) {
        perror(argv[1]);
        *rc = 1;
    }
    *out_path = argv[2];
    return in;
}

/* Exactly `bytes` into p; -1 after "NAME: short read of WHAT". */
static inline int driver_read(FILE *f, void *p, size_t bytes, const char *name, const char *what)
{
    if (fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "%s: short read of %s\n", name, what);
        return -1;
    }
    return 0;
}

/* n floats read into a new buffer (free it); NULL when short or out of memory. */
static inline float *driver_read_floats(FILE *f, size_t n, const char *name, const char *what)
{
    float *p = malloc(n * sizeof *p + 4); /* + 4: n may be 0 */
    if (p && driver_read(f, p, n * sizeof *p, name, what) != 0) {
        free(p);
        return NULL;
    }
    return p;
}
#endif
