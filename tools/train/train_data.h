/* Byte-level training data for zero-train.
 *
 * The corpus is one file, or every regular file under a directory (walked
 * recursively, hidden entries and __pycache__ skipped, optionally filtered by
 * file-name suffix), ordered by their path relative to the root compared
 * byte by byte (strcmp), and concatenated. Every byte is a token (vocab 256).
 *
 * Samples are the corpus cut into non-overlapping windows of seq_len + 1
 * tokens (inputs and the targets shifted by one). Each epoch visits the
 * windows in a permutation drawn from (seed, epoch). Global sample j is window
 * perm_{j / n}[j % n]; an optimizer step consumes train_batch_size global
 * samples, and rank r's micro-batch m, row b takes global sample
 *   consumed + (m * dp + r) * micro + b,
 * so ranks read disjoint windows, and the position is one counter that does
 * not depend on the world size (a checkpoint resumes it on any world size). */
#ifndef TRAIN_DATA_H
#define TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct train_data train_data;

typedef struct train_data_config {
    const char *path;            /* file or directory */
    const char *const *suffixes; /* NULL or an array of n_suffixes file-name endings (".py") */
    int n_suffixes;
    uint64_t max_bytes;          /* 0 = no limit: stop reading files once this many bytes are in */
    int seq_len;                 /* tokens per sample (targets are the next tokens) */
    uint64_t seed;
} train_data_config;

/* Returns 0 or -1 with a message in err (err_size bytes). */
int train_data_open(train_data **out, const train_data_config *cfg, char *err, size_t err_size);
void train_data_close(train_data *d);

uint64_t train_data_bytes(const train_data *d);    /* corpus size in tokens */
uint64_t train_data_windows(const train_data *d);  /* samples per epoch */
int train_data_files(const train_data *d);         /* number of files read */
/* The i-th file of the corpus order (0 <= i < train_data_files). */
const char *train_data_file(const train_data *d, int i);

/* The window index (into the corpus, times seq_len+1) of global sample j. */
uint64_t train_data_window_of(train_data *d, uint64_t j);

/* Fill tokens[rows * seq_len] and targets[rows * seq_len] (int32) with the
 * rows global samples first, first+1, ... */
void train_data_fill(train_data *d, uint64_t first, int rows, int32_t *tokens, int32_t *targets);

/* Rank dp_rank's micro-batch m of the step that starts at global sample
 * `consumed` (see above). */
void train_data_micro_batch(train_data *d, uint64_t consumed, int micro, int dp, int dp_rank, int m,
                            int32_t *tokens, int32_t *targets);

/* A 64-bit fingerprint of the corpus (FNV-1a over its bytes), so a resumed
 * run can warn when the data changed under it. */
uint64_t train_data_fingerprint(const train_data *d);

#endif
