/* Checkpoints of a ZeRO engine: save, resume, reshard, consolidate.
 *
 * Layout of a checkpoint directory `dir`:
 *
 *     dir/latest                   "step-00000100": the newest complete checkpoint
 *     dir/step-00000100/meta.json  the description (below), written last
 *     dir/step-00000100/rank-00000.bin ... one shard file per rank of the saving run
 *
 * A shard file holds, for every parameter, the rank's owned range of the fp32
 * master weights and of each optimizer moment (the engine's state_get), each
 * segment with a CRC32C, behind a fixed header (magic "ZEROSHRD", format
 * version, sizes, CRC32C of the header and of the index) and a JSON index.
 * meta.json holds the magic "libzero-checkpoint", the format version, the
 * step, world size, stage, compute dtype, every parameter's name and shape,
 * every rank file's size and segments (param, kind, element range, offset,
 * CRC), the engine's scalar state (optimizer step count, loss scaler, lr) and
 * an opaque user JSON object (the trainer's model shape, data position, RNG),
 * all under a CRC32C of its canonical text.
 *
 * Crash safety: a save writes into dir/.tmp-step-N/, each file under a
 * temporary name that is fsync'd and renamed, then fsyncs the directory,
 * renames it to dir/step-N, fsyncs dir, and finally replaces dir/latest the
 * same way. A process killed at any point leaves the previous checkpoint and
 * `latest` whole; a stale .tmp-* is removed by the next save.
 *
 * Loading is by element range, not by file: any engine whose parameters have
 * the checkpoint's names and shapes (in the same order) loads it, whatever
 * its world size and stage, each rank reading just the segments overlapping
 * its owned ranges. That is resharding; zero_checkpoint_reshard rewrites the
 * files for another number of ranks offline.
 *
 * Every failure returns a status and leaves a message naming the file, the
 * parameter and the check that failed in zero_last_error(): truncated
 * (ZERO_CORRUPT, "... is 1000 bytes, its header says 4096"), a checksum
 * mismatch (ZERO_CORRUPT), a foreign file (ZERO_CORRUPT, "not a libzero
 * checkpoint"), another model (ZERO_MISMATCH, naming the first parameter
 * whose name or shape differs). A failed load may have written part of the
 * engine's state: the caller should not train on after it. */
#ifndef ZERO_CHECKPOINT_H
#define ZERO_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <zero/comm.h>
#include <zero/engine.h>
#include <zero/export.h>
#include <zero/status.h>

ZERO_EXTERN_C_BEGIN

#define ZERO_CHECKPOINT_FORMAT_VERSION 1

/* Versioned like zero_config (docs/abi.md): fields only appended, each batch a
 * new version; an older version's missing fields take their defaults.
 *   1  keep_last, durable */
typedef struct zero_checkpoint_options {
    size_t size;      /* sizeof(zero_checkpoint_options), set by the INIT macro */
    uint32_t version; /* ZERO_CHECKPOINT_OPTIONS_VERSION */
    int keep_last;    /* after a save, keep the newest this many saves (save order, meta.json's save_seq,
                         not step numbers) and delete the other step-* directories; 0 = keep all */
    int durable;      /* 1: fsync files and directories (default); 0: skip (tests, tmpfs) */
} zero_checkpoint_options;

#define ZERO_CHECKPOINT_OPTIONS_VERSION 1u
#define ZERO_CHECKPOINT_OPTIONS_INIT { sizeof(zero_checkpoint_options), ZERO_CHECKPOINT_OPTIONS_VERSION, 0, 1 }

/* `dp` in save and load: a comm over the engine's data-parallel ranks, in the
 * same order, that carries HOST memory (MPI or LOCAL): for a CPU engine its
 * own dp comm; for a CUDA engine (NCCL/STAGED comm) an MPI comm of the same
 * ranks. It carries a few small all-reduces that agree on the outcome.
 *
 * COLLECTIVE over `dp`. Save the engine's
 * state as dir/step-<step> and point dir/latest at it. `user_json` (may be
 * NULL) must be a JSON object; rank 0's is stored. `options` may be NULL.
 * Every rank returns the same status. The engine must be between steps (no
 * module gathered, no grads_ready since the last step or zero_grad):
 * otherwise ZERO_INVALID_STATE naming the module, and nothing is written. */
ZERO_API zero_status zero_checkpoint_save(zero_engine *engine, zero_comm *dp, const char *dir, int64_t step,
                                          const char *user_json, const zero_checkpoint_options *options);

/* What a load found. Free with zero_checkpoint_loaded_free. */
typedef struct zero_checkpoint_loaded {
    int64_t step;      /* the step it was saved at */
    int world_size;    /* of the run that saved it */
    int stage;         /* of the run that saved it */
    char *user_json;   /* the stored user object (malloc'd), "{}" if none */
    char path[1024];   /* the step directory that was loaded */
} zero_checkpoint_loaded;

/* COLLECTIVE over `dp`. Load `path` (a step directory, or a checkpoint
 * directory whose `latest` names one) into a finalized engine: master
 * weights, moments and scalar state, then params_changed(). `out` may be NULL.
 * Every rank returns the same status. Between steps only, like save. */
ZERO_API zero_status zero_checkpoint_load(zero_engine *engine, zero_comm *dp, const char *path,
                                          zero_checkpoint_loaded *out);
ZERO_API void zero_checkpoint_loaded_free(zero_checkpoint_loaded *loaded); /* NULL accepted */

/* The step directory `path` denotes: itself if it holds meta.json, else the
 * one dir/latest names, else (no usable latest) the newest complete save in
 * save order. ZERO_NOT_FOUND when there is none. */
ZERO_API zero_status zero_checkpoint_resolve(const char *path, char *out, size_t out_size);

/* meta.json of `path`, checked (magic, version, checksum), as a malloc'd JSON
 * text; free with zero_checkpoint_free. Does not read the shard files. */
ZERO_API zero_status zero_checkpoint_inspect(const char *path, char **meta_json);

/* Check everything: meta.json, every shard file's header, size, index and
 * every segment's CRC32C, and that each parameter's master weights and
 * moments are covered exactly once. */
ZERO_API zero_status zero_checkpoint_verify(const char *path);

/* Write every parameter's full fp32 master weights into one safetensors file
 * (8-byte little-endian header length, a JSON header {name: {"dtype": "F32",
 * "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the raw little-endian data), in parameter order, via a temporary name
 * and rename. Shards are verified while read. */
ZERO_API zero_status zero_checkpoint_consolidate(const char *path, const char *out_file);

/* Rewrite the checkpoint `path` into the step directory `out_dir` (created;
 * must not exist) as `world_size` shard files, rank r holding elements
 * [numel*r/world_size, numel*(r+1)/world_size) of every parameter. Any
 * engine loads either one; this is for handing a checkpoint to a job of
 * another size with one file per reader. */
ZERO_API zero_status zero_checkpoint_reshard(const char *path, const char *out_dir, int world_size);

/* Merge the checkpoints of a model's parts into one step directory `out_dir`
 * (created; must not exist) holding the whole model in one shard file (world
 * size 1, loadable like any checkpoint). `paths[0..n)` (step or checkpoint
 * directories) must be of one step, with the same parameter names, shapes,
 * state kinds and engine scalars (ZERO_MISMATCH naming the first difference
 * and the two paths). A parameter named in `stacked[0..n_stacked)` is split
 * along its flattened elements: input i holds elements [i numel, (i+1) numel)
 * of the whole (for a row-major tensor, rows along the first dimension), and
 * the output's first dimension is n times the inputs'. Every other parameter
 * is whole in each input: the output takes it from paths[0] after checking
 * that every input holds it bitwise (ZERO_MISMATCH naming it otherwise).
 * `user_json` (NULL: paths[0]'s) is the output's user object. The data is
 * streamed a tensor slice at a time (two buffers of the largest slice), each
 * segment's CRC32C checked as it is read. For the per-ep-rank checkpoints of
 * an expert-parallel MoE run (zero-ckpt merge-ep, docs/checkpoints.md). */
ZERO_API zero_status zero_checkpoint_merge(const char *const *paths, int n, const char *const *stacked, int n_stacked,
                                           const char *user_json, const char *out_dir);

/* Read one tensor of the checkpoint `path` without an engine: the whole of
 * parameter `name`'s state `kind` ("master", "exp_avg" or "exp_avg_sq") into
 * `out` (numel floats, which must be the parameter's element count). Every
 * segment read is checked against its CRC32C. ZERO_NOT_FOUND for an unknown
 * name or a kind the checkpoint does not hold. */
ZERO_API zero_status zero_checkpoint_read_tensor(const char *path, const char *name, const char *kind, float *out,
                                                 uint64_t numel);

ZERO_API void zero_checkpoint_free(void *p);


ZERO_EXTERN_C_END

#endif
