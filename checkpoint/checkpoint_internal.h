/* Internal: the checkpoint file format shared by save, load, verify,
 * consolidate and reshard (see include/zero/checkpoint.h). */
#ifndef ZERO_CHECKPOINT_INTERNAL_H
#define ZERO_CHECKPOINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <jansson.h>
#include <zero/checkpoint.h>
#include <zero/experimental.h>

#include "common/error.h"

#define CKPT_META_MAGIC "libzero-checkpoint"
#define CKPT_SHARD_MAGIC "ZEROSHRD"
#define CKPT_HEADER_BYTES 64
#define CKPT_ALIGN 64
#define CKPT_NUM_KINDS 3
/* An index lists ~60 bytes per segment: 1 GiB is millions of segments, and
 * a larger claim is damage, not a reason to allocate it. */
#define CKPT_MAX_INDEX_BYTES (UINT64_C(1) << 30)

/* The fixed header at offset 0 of a shard file, little-endian on disk:
 *   0  magic[8]       "ZEROSHRD"
 *   8  u32 version    ZERO_CHECKPOINT_FORMAT_VERSION
 *  12  u32 rank       the saving rank
 *  16  u32 world      the saving world size
 *  20  u32 reserved   0
 *  24  u64 index_offset  the JSON index (after the data)
 *  32  u64 index_bytes
 *  40  u64 file_bytes    the whole file: a shorter file is truncated
 *  48  u32 index_crc     CRC32C of the index
 *  52  u32 reserved2     0
 *  56  u32 reserved3     0
 *  60  u32 header_crc    CRC32C of bytes 0..59 */
typedef struct ckpt_header {
    uint32_t version, rank, world;
    uint64_t index_offset, index_bytes, file_bytes;
    uint32_t index_crc;
} ckpt_header;

/* One contiguous piece of one parameter's state in one shard file. */
typedef struct ckpt_seg {
    int file;        /* index into ckpt_meta.files */
    int param;
    int kind;        /* zero_state_kind */
    uint64_t start;  /* first element of the parameter (flattened) */
    uint64_t count;  /* elements (fp32) */
    uint64_t offset; /* byte offset in the file */
    uint32_t crc;    /* CRC32C of the count*4 bytes */
} ckpt_seg;

typedef struct ckpt_param {
    char *name;
    int ndim;
    int64_t shape[ZERO_MAX_DIMS];
    uint64_t numel;
} ckpt_param;

typedef struct ckpt_file {
    char *name;      /* "rank-00000.bin" */
    uint64_t bytes;
} ckpt_file;

/* A parsed, checked meta.json. */
typedef struct ckpt_meta {
    json_t *root; /* the "meta" object */
    char dir[1024];
    int64_t step;
    int world, stage;
    char dtype[16];
    unsigned kinds; /* bit k: kind k present */
    int n_params;
    ckpt_param *params;
    int n_files;
    ckpt_file *files;
    int n_segs;
    ckpt_seg *segs; /* sorted by (kind, param, start) */
} ckpt_meta;

extern const char *const ckpt_kind_names[CKPT_NUM_KINDS]; /* "master", "exp_avg", "exp_avg_sq" */

/* ---- io (checkpoint_io.c) */
/* Write all of buf at offset; ZERO_IO with the path named on failure. */
zero_status ckpt_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path);
zero_status ckpt_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path);
/* fsync a directory (its entries), when durable. */
zero_status ckpt_fsync_dir(const char *dir, int durable);
/* Write `data` to path via path.tmp, fsync, rename, fsync the parent. */
zero_status ckpt_write_file_atomic(const char *path, const void *data, size_t n, int durable);
/* Read a whole (small) file: malloc'd, NUL-terminated. */
zero_status ckpt_read_file(const char *path, char **data, size_t *n);
/* Grows *buf (a per-parameter staging buffer reused across parameters) to at least n floats;
 * its old contents are not kept. On failure *buf is freed and NULL, and the message names `what`. */
zero_status ckpt_grow_buffer(float **buf, uint64_t *cap, uint64_t n, const char *what, const char *name);
/* rm -rf of a directory we created (only files and one level of dirs). */
void ckpt_remove_tree(const char *path);

/* Save order (checkpoint_order.c): the "save_seq" of step directory
 * `step_dir`'s meta.json (0 when it has none, -1 when it has no readable
 * meta.json); and the directory name of the newest complete save in `dir`
 * by (save_seq, step). ckpt_newest_step returns 0 if there is none. */
int64_t ckpt_save_seq(const char *step_dir);
int ckpt_newest_step(const char *dir, char *name, size_t n);
/* The save_seq of the newest save in `dir` (0 if none); keep_last > 0 reads
 * every step directory, else only the one `latest` names. */
int64_t ckpt_newest_save_seq(const char *dir, int keep_last);
/* Delete the step-* directories beyond the newest `keep` saves. */
void ckpt_prune(const char *dir, int keep);
zero_status ckpt_mkdir_p(const char *path);

void ckpt_header_encode(const ckpt_header *h, unsigned char out[CKPT_HEADER_BYTES]);
/* Checks magic, header CRC and version; `what` names the file in messages. */
zero_status ckpt_header_decode(const unsigned char in[CKPT_HEADER_BYTES], ckpt_header *h, const char *what);

/* Open and check a shard file: header, actual size vs header, index CRC.
 * Returns the fd and the parsed index (caller json_decref's it). */
zero_status ckpt_shard_open(const char *path, int *fd, ckpt_header *h, json_t **index);

/* ---- shard writer (checkpoint_io.c) */
typedef struct ckpt_writer {
    int fd;
    char tmp_path[1200], path[1200];
    uint64_t pos;
    json_t *segs; /* [[param, kind, start, count, offset, crc], ...] */
    uint32_t rank, world;
    int durable;
} ckpt_writer;

zero_status ckpt_writer_open(ckpt_writer *w, const char *path, uint32_t rank, uint32_t world, int durable);
zero_status ckpt_writer_segment(ckpt_writer *w, int param, int kind, uint64_t start, const float *data,
                                uint64_t count);
/* Writes the index and header, fsyncs, renames to the final name. */
zero_status ckpt_writer_close(ckpt_writer *w, uint64_t *file_bytes);
void ckpt_writer_abort(ckpt_writer *w);

/* ---- meta (checkpoint_meta.c) */
/* Text of meta.json for `meta_obj` (adds the CRC wrapper); malloc'd. */
char *ckpt_meta_dump(json_t *meta_obj);
/* Resolve `path`, read and check meta.json into m. */
zero_status ckpt_meta_load(const char *path, ckpt_meta *m);
void ckpt_meta_free(ckpt_meta *m);
/* Build the "files" and "segments" parts of a meta object from the shard
 * files in dir (reads each file's index); fills bytes per file. */
zero_status ckpt_meta_collect_files(json_t *meta_obj, const char *dir, int world);
/* Segments of (kind, param) overlapping [begin, end), in start order:
 * returns the index of the first in m->segs and the number through *n. */
int ckpt_meta_find(const ckpt_meta *m, int kind, int param, uint64_t begin, uint64_t end, int *n);
/* Read [begin, end) of (kind, param) into out, verifying each segment's CRC;
 * fds[] caches open files (initialise to -1, close with ckpt_close_fds). */
zero_status ckpt_read_range(const ckpt_meta *m, int *fds, int kind, int param, uint64_t begin, uint64_t end,
                            float *out);
void ckpt_close_fds(const ckpt_meta *m, int *fds);
/* Every (kind present, param) is covered exactly once by the segments. */
zero_status ckpt_meta_check_coverage(const ckpt_meta *m);

/* ---- collective helpers (checkpoint_save.c) */
/* Every rank learns the worst status; ranks that did not fail get a message
 * naming one that did. Always one all-reduce. */
zero_status ckpt_agree(zero_comm *dp, zero_status local, const char *op);
/* The state kinds (bits) the engine's optimizer has, agreed across ranks. */
zero_status ckpt_engine_kinds(zero_engine *e, zero_comm *dp, unsigned *kinds);

/* ---- engine hooks */
/* ZERO_INVALID_STATE naming the module unless the engine is between steps:
 * no module gathered, no micro-step reported since the last step. Local.
 * (zero/state.c, beside the accessors) */
zero_status engine_between_steps(zero_engine *e, const char *what);
/* The range checks of zero_engine_set_scalars, without an engine (verify
 * applies exactly what load will); the message goes to err (may be NULL).
 * (zero/scalars.c) */
zero_status engine_scalars_check(const zero_engine_scalars *in, zero_errbuf *err, const char *what);

/* ---- scalars (checkpoint_meta.c) */
/* The engine's scalars stored in m, checked as load applies them. */
zero_status ckpt_meta_scalars(const ckpt_meta *m, zero_engine_scalars *sc);

#endif
