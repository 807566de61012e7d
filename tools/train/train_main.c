/* zero-train: a GPT trained on the libzero engine (docs/zero-train.md).
 *
 *   tests/mpirun.sh 2 zero-train --config configs/stage3.json
 *   zero-train --print-config
 *
 * Rank 0 prints; every rank trains its slice of each batch. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zero/checkpoint.h>
#include <zero/zero.h>

#include "gpt.h"
#include "gpt_gemm.h"
#include "train_run.h"


double train_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f)
{
    fputs("usage: zero-train [--config FILE] [options]      (under mpirun: one process per rank)\n"
          "  --config FILE          DeepSpeed-style JSON config (default: the built-in small GPT)\n"
          "  --print-config         print the effective config (defaults filled in) as JSON and exit\n"
          "  --set KEY.PATH=VALUE   override any config key; VALUE is JSON or a bare string\n"
          "  --steps N              train.steps\n"
          "  --stage N              zero_optimization.stage\n"
          "  --micro-batch N        train_micro_batch_size_per_gpu\n"
          "  --grad-accum N         gradient_accumulation_steps\n"
          "  --data PATH            data.path (a file or a directory; \"auto\": the default corpus)\n"
          "  --seed N               train.seed\n"
          "  --device cpu|cuda      train.device\n"
          "  --log-every N          train.log_every\n"
          "  --checkpoint-dir DIR   train.checkpoint.dir\n"
          "  --checkpoint-every N   train.checkpoint.every\n"
          "  --resume PATH|auto     train.resume: a checkpoint, or the latest in the checkpoint dir\n"
          "  --metrics FILE         train.metrics_file (JSONL, one line per step)\n"
          "  --comm-timeout S       train.comm_timeout_s: deadline of every collective (default 120)\n"
          "  --check-collectives    train.check_collectives: debug mode; every collective's fingerprint\n"
          "                         (op, count, dtype, group, sequence) is checked across the group\n"
          "  --trace FILE           write the steps' timeline (pipeline ops, communication waits, optimizer;\n"
          "                         one track per rank) as Chrome trace-event JSON (Perfetto); needs\n"
          "                         model.tp or model.pp > 1 (the pipeline runtime); docs/pipeline.md\n"
          "  --plain                no progress bar even on a terminal\n"
          "  --dump-logits FILE     after training, rank 0 writes the logits of one fixed batch:\n"
          "                         i32 batch, seq, vocab; i32 tokens[batch*seq]; f32 logits[batch*seq*vocab]\n"
          "  --help\n",
          f);
}

/* ---------------------------------------------------------------- config overrides */

/* Set root[a][b]... = value for "a.b.c"; creates objects on the way. */
static int set_path(json_t *root, const char *path, json_t *value, char *err, size_t en)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *obj = root;
    char *save = NULL, *tok = strtok_r(buf, ".", &save);
    while (tok) {
        char *next = strtok_r(NULL, ".", &save);
        if (!next) {
            json_object_set_new(obj, tok, value);
            return 0;
        }
        json_t *child = json_object_get(obj, tok);
        if (!child) {
            child = json_object();
            json_object_set_new(obj, tok, child);
        } else if (!json_is_object(child)) {
            json_decref(value);
            snprintf(err, en, "--set %s: %s is not an object", path, tok);
            return -1;
        }
        obj = child;
        tok = next;
    }
    json_decref(value);
    snprintf(err, en, "--set %s: empty key", path);
    return -1;
}

static int apply_set(json_t *root, const char *kv, char *err, size_t en)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) {
        snprintf(err, en, "--set %s: expected KEY.PATH=VALUE", kv);
        return -1;
    }
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
    json_error_t je;
    json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, &je);
    if (!v) v = json_string(eq + 1); /* a bare word: a string */
    return set_path(root, key, v, err, en);
}

/* ---------------------------------------------------------------- the model and the engine config */

static gpt_config train_gpt_config(const train_config *c)
{
    return (gpt_config){.n_layer = c->n_layer, .n_head = c->n_head, .d_model = c->d_model, .seq_len = c->seq_len,
                        .vocab = c->vocab, .moe_experts = c->moe_experts, .moe_top_k = c->moe_top_k,
                        .moe_capacity_factor = (float)c->moe_capacity_factor,
                        .moe_aux_loss_coef = (float)c->moe_aux_loss_coef, .moe_ep = c->moe_ep};
}

/* stage3_prefetch_bucket_size "auto": the elements of two blocks (module 1 is block 0). */
static uint64_t train_prefetch_window(const gpt_config *g)
{
    return 2 * (uint64_t)gpt_module_elements(g, GPT_MODULE_EMBED + 1);
}

static json_t *engine_effective(const zero_config *z)
{
    json_t *e = json_object();
    json_object_set_new(e, "zero_optimization",
                        json_pack("{s:i,s:I,s:I,s:b,s:b,s:I,s:I,s:I}", "stage", z->stage, "reduce_bucket_size",
                                  (json_int_t)z->reduce_bucket_size, "allgather_bucket_size",
                                  (json_int_t)z->allgather_bucket_size, "overlap_comm", z->overlap_comm,
                                  "contiguous_gradients", z->contiguous_gradients, "stage3_prefetch_bucket_size",
                                  (json_int_t)z->stage3_prefetch_bucket_size, "stage3_max_live_parameters",
                                  (json_int_t)z->stage3_max_live_parameters, "stage3_param_persistence_threshold",
                                  (json_int_t)z->stage3_param_persistence_threshold));
    if (z->optimizer == ZERO_OPTIM_ADAMW)
        json_object_set_new(e, "optimizer",
                            json_pack("{s:s,s:{s:f,s:[f,f],s:f,s:f,s:b}}", "type", "AdamW", "params", "lr", z->lr,
                                      "betas", z->beta1, z->beta2, "eps", z->eps, "weight_decay", z->weight_decay,
                                      "fast", z->optimizer_fast));
    else
        json_object_set_new(e, "optimizer",
                            json_pack("{s:s,s:{s:f,s:f,s:f,s:b,s:f}}", "type", "SGD", "params", "lr", z->lr,
                                      "momentum", z->momentum, "dampening", z->dampening, "nesterov", z->nesterov,
                                      "weight_decay", z->weight_decay));
    static const char *const offload_names[] = {"none", "cpu", "nvme"};
    int od = (int)z->offload_optimizer_device;
    json_t *zo = json_object_get(e, "zero_optimization");
    json_object_set_new(zo, "sub_group_size", json_integer((json_int_t)z->sub_group_size));
    json_object_set_new(zo, "local_accumulation", json_boolean(z->local_accumulation));
    json_object_set_new(zo, "offload_optimizer",
                        json_pack("{s:s,s:o,s:b,s:i}", "device", od >= 0 && od < 3 ? offload_names[od] : "none",
                                  "nvme_path", z->offload_nvme_path[0] ? json_string(z->offload_nvme_path) : json_null(),
                                  "pin_memory", z->offload_pin_memory, "buffer_count", z->offload_buffer_count));
    int pd = (int)z->offload_param_device;
    json_object_set_new(zo, "offload_param",
                        json_pack("{s:s,s:o,s:b,s:i,s:I,s:I}", "device", pd >= 0 && pd < 3 ? offload_names[pd] : "none",
                                  "nvme_path",
                                  z->offload_param_nvme_path[0] ? json_string(z->offload_param_nvme_path) : json_null(),
                                  "pin_memory", z->offload_param_pin_memory, "buffer_count",
                                  z->offload_param_buffer_count, "buffer_size", (json_int_t)z->offload_param_buffer_size,
                                  "max_in_cpu", (json_int_t)z->offload_param_max_in_cpu));
    json_object_set_new(e, "aio", json_pack("{s:I,s:i}", "block_size", (json_int_t)z->aio_block_size, "queue_depth",
                                            z->aio_queue_depth));
    json_object_set_new(e, "gradient_clipping", json_real(z->gradient_clipping));
    json_object_set_new(e, "bf16", json_pack("{s:b}", "enabled", z->compute_dtype == ZERO_BF16));
    json_object_set_new(e, "fp16",
                        json_pack("{s:b,s:f,s:i,s:i,s:i,s:f}", "enabled", z->compute_dtype == ZERO_F16, "loss_scale",
                                  z->loss_scale, "initial_scale_power", z->initial_scale_power, "loss_scale_window",
                                  z->loss_scale_window, "hysteresis", z->hysteresis, "min_loss_scale",
                                  z->min_loss_scale));
    return e;
}

/* ---------------------------------------------------------------- shared helpers */

int r0printf(const run *r, FILE *f, const char *fmt, ...)
{
    if (r->rank != 0) return 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vfprintf(f, fmt, ap);
    va_end(ap);
    fflush(f);
    return n;
}

/* Every rank learns whether all ranks got this far; a rank that failed has
 * printed why. Keeps the others from waiting in the next collective until
 * its deadline. */
int all_ok(run *r, int ok)
{
    int32_t bad = !ok, any = bad;
    if (r->world > 1 && zero_allreduce(r->host_comm, &bad, &any, 1, ZERO_I32, ZERO_MAX) != ZERO_OK) return 0;
    return !any;
}

/* A failure on this rank: every rank may print (rank 0 without a prefix). */
void rank_error(const run *r, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (r->world > 1 && r->rank != 0) fprintf(stderr, "zero-train: rank %d: %s\n", r->rank, line);
    else fprintf(stderr, "zero-train: %s\n", line);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    const char *config_path = NULL, *dump_logits = NULL, *trace_path = NULL;
    int print_config = 0, plain = 0;
    char err[ERRMAX];
    json_t *sets = json_array();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        static const struct { const char *flag, *key; } map[] = {
            {"--steps", "train.steps"},
            {"--stage", "zero_optimization.stage"},
            {"--micro-batch", "train_micro_batch_size_per_gpu"},
            {"--grad-accum", "gradient_accumulation_steps"},
            {"--data", "data.path"},
            {"--seed", "train.seed"},
            {"--device", "train.device"},
            {"--log-every", "train.log_every"},
            {"--checkpoint-dir", "train.checkpoint.dir"},
            {"--checkpoint-every", "train.checkpoint.every"},
            {"--resume", "train.resume"},
            {"--metrics", "train.metrics_file"},
            {"--comm-timeout", "train.comm_timeout_s"},
        };
        int mapped = 0;
        for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
            if (strcmp(a, map[k].flag) != 0) continue;
            if (!v) {
                fprintf(stderr, "zero-train: %s needs a value\n", a);
                return 2;
            }
            char kv[1200];
            /* paths and names stay strings; numbers parse as JSON */
            int is_str = strstr(map[k].key, "path") || strstr(map[k].key, "dir") || strstr(map[k].key, "device") ||
                         strstr(map[k].key, "resume") || strstr(map[k].key, "file");
            if (is_str) {
                json_t *s = json_string(v);
                char *enc = json_dumps(s, JSON_ENCODE_ANY);
                snprintf(kv, sizeof kv, "%s=%s", map[k].key, enc);
                free(enc);
                json_decref(s);
            } else {
                snprintf(kv, sizeof kv, "%s=%s", map[k].key, v);
            }
            json_array_append_new(sets, json_string(kv));
            i++;
            mapped = 1;
            break;
        }
        if (mapped) continue;
        if (strcmp(a, "--config") == 0 && v) {
            config_path = v;
            i++;
        } else if (strcmp(a, "--set") == 0 && v) {
            json_array_append_new(sets, json_string(v));
            i++;
        } else if (strcmp(a, "--print-config") == 0) {
            print_config = 1;
        } else if (strcmp(a, "--dump-logits") == 0 && v) {
            dump_logits = v;
            i++;
        } else if (strcmp(a, "--trace") == 0 && v) {
            trace_path = v;
            i++;
        } else if (strcmp(a, "--plain") == 0) {
            plain = 1;
        } else if (strcmp(a, "--check-collectives") == 0) {
            json_array_append_new(sets, json_string("train.check_collectives=true"));
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "zero-train: unknown or incomplete argument %s\n", a);
            usage(stderr);
            return 2;
        }
    }

    /* the config document: file or built-in, then overrides */
    json_t *root = config_path ? train_config_load_file(config_path, err, sizeof err)
                               : json_loads(train_default_config_json, JSON_REJECT_DUPLICATES, NULL);
    if (!root) {
        fprintf(stderr, "zero-train: %s\n", config_path ? err : "the built-in config is not valid JSON");
        return 2;
    }
    size_t si;
    json_t *sv;
    json_array_foreach(sets, si, sv) {
        if (apply_set(root, json_string_value(sv), err, sizeof err) != 0) {
            fprintf(stderr, "zero-train: %s\n", err);
            return 2;
        }
    }
    json_decref(sets);
    /* the device decides the comm backend, so peek at it before the comm */
    json_t *tr = json_object_get(root, "train");
    const char *dev_name = json_is_object(tr) && json_is_string(json_object_get(tr, "device"))
                               ? json_string_value(json_object_get(tr, "device")) : "cpu";
    int cuda = strcmp(dev_name, "cuda") == 0;

    run r;
    memset(&r, 0, sizeof r);
    zero_set_log_handler(zero_log_to_stderr, ZERO_LOG_WARN, NULL);
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT;
    cc.timeout_s = TRAIN_DEFAULT_COMM_TIMEOUT_S; /* train.comm_timeout_s once the config is parsed */
    /* fingerprints are chosen when the world comm is made, before the config is
     * parsed: peek at train.check_collectives (its type is checked by the parser);
     * unset or false leaves the ZERO_COLL_FINGERPRINT environment default */
    if (json_is_object(tr) && json_is_true(json_object_get(tr, "check_collectives"))) cc.fingerprint = 1;
    if (zero_comm_create_world(&r.host_comm, &cc) != ZERO_OK) {
        fprintf(stderr, "zero-train: cannot start the world comm: %s\n", zero_last_error());
        return 1;
    }
    r.rank = zero_comm_get_rank(r.host_comm);
    r.world = zero_comm_get_size(r.host_comm);
    int rc = 1;
    if (train_config_parse(&r.cfg, root, r.world, err, sizeof err) != 0) {
        r0printf(&r, stderr, "zero-train: config%s%s: %s\n", config_path ? " " : "", config_path ? config_path : "",
                 err);
        goto done;
    }
    cc.timeout_s = r.cfg.comm_timeout_s;
    if (zero_comm_set_timeout(r.host_comm, cc.timeout_s) != ZERO_OK) {
        r0printf(&r, stderr, "zero-train: train.comm_timeout_s: %s\n", zero_last_error());
        goto done;
    }
    r.zcfg = (zero_config)ZERO_CONFIG_INIT;
    const gpt_config g = train_gpt_config(&r.cfg);
    if (r.cfg.prefetch_auto) {
        /* HF Trainer's "auto" is the trainer's to fill in: two blocks' parameters,
         * so the prefetcher keeps about one block ahead whatever the model's size
         * (HF's 0.9 x d_model^2 suits DeepSpeed's per-parameter prefetch; libzero
         * prefetches whole modules, and a window below one block prefetches none). */
        json_t *zo = json_object_get(r.cfg.engine_json, "zero_optimization");
        json_object_set_new(zo, "stage3_prefetch_bucket_size", json_integer((json_int_t)train_prefetch_window(&g)));
    }
    {
        char *engine_text = json_dumps(r.cfg.engine_json, JSON_COMPACT);
        zero_status s = zero_config_from_json(&r.zcfg, engine_text);
        free(engine_text);
        if (s != ZERO_OK) {
            r0printf(&r, stderr, "zero-train: config%s%s: %s\n", config_path ? " " : "",
                     config_path ? config_path : "", zero_last_error());
            goto done;
        }
    }
    r.zcfg.gradient_accumulation_steps = r.cfg.grad_accum;
    r.zcfg.lr = r.cfg.lr;
    const int model_parallel = r.cfg.tp * r.cfg.pp * r.cfg.cp > 1;
    if (model_parallel && r.zcfg.compute_dtype == ZERO_F16) {
        r0printf(&r, stderr, "zero-train: config: fp16.enabled: model.tp / model.pp > 1 compute in fp32 or bf16 "
                             "(fp16's loss scaling is not in the tensor/pipeline runtime)\n");
        goto done;
    }
    if (!model_parallel && trace_path) {
        r0printf(&r, stderr, "zero-train: --trace records the pipeline runtime's timeline: it needs model.tp or "
                             "model.pp > 1\n");
        goto done;
    }
    if (model_parallel && dump_logits) {
        r0printf(&r, stderr, "zero-train: --dump-logits is not supported with model.tp / model.pp > 1\n");
        goto done;
    }
    {
        json_t *eng = engine_effective(&r.zcfg);
        json_object_update(r.cfg.effective, eng);
        json_decref(eng);
    }
    if (print_config) {
        if (r.rank == 0) {
            char *t = train_config_dumps(r.cfg.effective);
            printf("%s\n", t);
            free(t);
        }
        rc = 0;
        goto done;
    }

    if (r.cfg.actckpt.notes[0]) r0printf(&r, stdout, "%s", r.cfg.actckpt.notes);

    /* device and engine comm */
    if (cuda) {
        if (!zero_cuda_available()) {
            r0printf(&r, stderr, "zero-train: --device cuda: %s\n",
                     ZERO_HAVE_CUDA_BUILD ? "no CUDA GPU is visible" : "this build has no CUDA (rebuild with -Dcuda=enabled)");
            goto done;
        }
    }
    {
        int ok = zero_device_create(&r.dev, cuda ? ZERO_DEVICE_CUDA : ZERO_DEVICE_CPU, -1) == ZERO_OK;
        if (!ok) rank_error(&r, "opening the %s device: %s", dev_name, zero_last_error());
        if (!all_ok(&r, ok)) goto done;
    }
    if (cuda) {
        zero_comm_config dc = cc;
        const char *cb = r.cfg.comm_backend;
        dc.backend = strcmp(cb, "staged") == 0 ? ZERO_BACKEND_STAGED
                     : strcmp(cb, "nccl") == 0 ? ZERO_BACKEND_NCCL
                     : ZERO_HAVE_NCCL_BUILD    ? ZERO_BACKEND_NCCL
                                               : ZERO_BACKEND_STAGED;
        if (zero_comm_create_world(&r.comm, &dc) != ZERO_OK) {
            r0printf(&r, stderr, "zero-train: device comm: %s\n", zero_last_error());
            goto done;
        }
    } else {
        r.comm = r.host_comm;
    }

    /* data */
    {
        char note[1200] = "";
        const char *path = r.cfg.data_path;
        int default_corpus = strcmp(path, "auto") == 0;
        if (default_corpus) {
            if (train_default_corpus(r.corpus, sizeof r.corpus, note, sizeof note) != 0) {
                r0printf(&r, stderr, "zero-train: %s\n", note);
                goto done;
            }
        } else {
            snprintf(r.corpus, sizeof r.corpus, "%s", path);
        }
        static const char *const py[] = {".py"};
        int auto_py = r.cfg.data_suffixes_auto && default_corpus && strstr(r.corpus, "python3");
        int nsfx = 0;
        if (r.cfg.data_suffixes)
            while (r.cfg.data_suffixes[nsfx]) nsfx++;
        train_data_config dc = {r.corpus, auto_py ? py : (const char *const *)r.cfg.data_suffixes, auto_py ? 1 : nsfx,
                                r.cfg.data_max_bytes, r.cfg.seq_len, r.cfg.seed};
        int ok = train_data_open(&r.data, &dc, err, sizeof err) == 0;
        if (!ok) rank_error(&r, "%s", err);
        if (!all_ok(&r, ok)) goto done;
        r.fingerprint = train_data_fingerprint(r.data);
        if (note[0]) r0printf(&r, stdout, "%s\n", note);
        r0printf(&r, stdout, "data: %d files, %.2f MB, %llu samples of %d+1 bytes per epoch (files sorted by path, "
                             "concatenated; first %s)\n",
                 train_data_files(r.data), train_data_bytes(r.data) / 1e6,
                 (unsigned long long)train_data_windows(r.data), r.cfg.seq_len, train_data_file(r.data, 0));
    }

    /* engine and model */
    /* activation_checkpointing: blocks 0 .. blocks-1 recomputed in backward */
    const gpt_checkpointing ckpt = {r.cfg.actckpt.enabled ? r.cfg.actckpt.blocks : 0, r.cfg.actckpt.cpu_checkpointing,
                                    r.cfg.actckpt.partition_activations};
    r.dp = r.world;
    r.dp_rank = r.rank;
    if (model_parallel) {
        /* the grid, the engine over its dp group, this rank's stage and tp shards (of
         * model.pp_virtual chunks for "interleaved"; set_schedule names a mismatch) */
        int chunks = strcmp(r.cfg.pp_schedule, "interleaved") == 0 ? r.cfg.pp_virtual : 1;
        /* on CUDA the grid is split from the device world (NCCL / STAGED): activations move as device buffers */
        int ok = train_parallel_create(&r.par, cuda ? r.comm : r.host_comm, &g, r.cfg.tp, r.cfg.pp, chunks, r.cfg.cp,
                                       r.cfg.sequence_parallel, r.cfg.micro_batch,
                                       r.cfg.grad_accum, r.cfg.seed, &r.zcfg, r.dev, &r.engine, &ckpt, err,
                                       sizeof err) == 0;
        if (ok && train_parallel_set_schedule(r.par, r.cfg.pp_schedule, r.cfg.pp_virtual, err, sizeof err) != 0)
            ok = 0;
        if (ok && train_parallel_note(r.par)[0]) r0printf(&r, stdout, "%s", train_parallel_note(r.par));
        if (ok && trace_path) train_parallel_enable_trace(r.par);
        if (!ok) rank_error(&r, "%s", err);
        if (!all_ok(&r, ok)) goto done;
        r.dp = train_parallel_dp_size(r.par);
        r.dp_rank = train_parallel_dp_rank(r.par);
    } else {
        if (r.cfg.moe_ep > 1) {
            /* DeepSpeed-MoE's groups: ep consecutive ranks share the experts
             * out; the engine runs over the ranks holding the same experts.
             * On CUDA both are split from the device comm (the MoE layer's
             * all-to-all-v and the engine take device buffers), and edp has a
             * host twin for the checkpoint. */
            int ep = r.cfg.moe_ep;
            zero_comm *parent = cuda ? r.comm : r.host_comm;
            if (cuda) r.dev_world = r.comm;
            int ok = zero_comm_split(parent, r.rank / ep, r.rank, &r.ep) == ZERO_OK &&
                     zero_comm_split(parent, r.rank % ep, r.rank, &r.comm) == ZERO_OK;
            if (ok && cuda)
                ok = zero_comm_split(r.host_comm, r.rank % ep, r.rank, &r.edp_host) == ZERO_OK &&
                     zero_comm_set_name(r.edp_host, "edp-host") == ZERO_OK;
            if (ok) ok = zero_comm_set_name(r.ep, "ep") == ZERO_OK && zero_comm_set_name(r.comm, "edp") == ZERO_OK;
            if (!ok) rank_error(&r, "model.moe.ep groups: %s", zero_last_error());
            if (!all_ok(&r, ok)) goto done;
        }
        int ok = zero_engine_create(&r.engine, &r.zcfg, r.comm, r.dev) == ZERO_OK;
        if (!ok) rank_error(&r, "engine: %s", zero_last_error());
        if (!all_ok(&r, ok)) goto done;
    }
    if (!model_parallel &&
        train_model_create(&r.model, &g, r.cfg.micro_batch, r.cfg.seed, r.engine, r.dev, cuda, &ckpt, r.ep, err,
                           sizeof err) !=
            ZERO_OK) {
        fprintf(stderr, "zero-train: rank %d: %s\n", r.rank, err);
        goto done;
    }
    {
        /* after finalize, before resume: a checkpoint restores the groups' hyperparameters by name */
        char gnote[2048];
        if (train_param_groups_apply(&r.cfg, r.engine, gnote, sizeof gnote, err, sizeof err) != 0) {
            fprintf(stderr, "zero-train: rank %d: %s\n", r.rank, err);
            goto done;
        }
        if (gnote[0]) r0printf(&r, stdout, "%s", gnote);
    }
    {
        zero_plan_info plan;
        zero_engine_get_plan_info(r.engine, &plan);
        double full_numel = 0;
        for (size_t i = 0; i < gpt_num_params(&g); i++) {
            gpt_param_info pi;
            if (gpt_param_info_get(&g, i, &pi) == ZERO_OK) full_numel += (double)pi.numel;
        }
        r0printf(&r, stdout,
                 "model: GPT %d layers, %d heads, d_model %d, seq_len %d, vocab %d: %.3f M parameters\n"
                 "engine: ZeRO stage %d on %d rank%s (%s), %s compute, micro-batch %d x %d accumulation x %d "
                 "ranks = %lld sequences per step\n",
                 g.n_layer, g.n_head, g.d_model, g.seq_len, g.vocab, full_numel / 1e6, plan.stage, r.dp,
                 r.dp > 1 ? "s" : "", cuda ? "cuda" : "cpu", zero_dtype_name(plan.compute_dtype),
                 r.cfg.micro_batch, r.cfg.grad_accum, r.dp, (long long)r.cfg.train_batch_size);
        if (!cuda) { /* which kernel the matmuls run on (docs/model.md, "CPU GEMM"; ZERO_CPU_GEMM chooses) */
            const int bf16 = plan.compute_dtype == ZERO_BF16;
            if (bf16 && !gpt_gemm_bf16_is_native())
                r0printf(&r, stdout,
                         "cpu gemm: %s (fp32 matmuls: no bf16 GEMM kernel runs here, so bf16 compute is fp32 math "
                         "on bf16 parameters: it saves memory, not time)\n",
                         gpt_gemm_kernel_name(GPT_GEMM_BF16));
            else
                r0printf(&r, stdout, "cpu gemm: %s (%s matmuls)\n",
                         gpt_gemm_kernel_name(bf16 ? GPT_GEMM_BF16 : GPT_GEMM_F32), bf16 ? "bf16" : "fp32");
        }
        if (g.moe_experts)
            r0printf(&r, stdout,
                     "moe: %d experts per block, top-%d, capacity factor %g, aux loss coef %g; expert parallel "
                     "%d x expert-data-parallel %d (ep consecutive ranks share the experts; the engine of each "
                     "holds its %d experts and the dense tensors, ZeRO over the expert-data-parallel group)\n",
                     g.moe_experts, g.moe_top_k, (double)g.moe_capacity_factor, (double)g.moe_aux_loss_coef,
                     r.cfg.moe_ep, r.dp / r.cfg.moe_ep, g.moe_experts / r.cfg.moe_ep);
        if (model_parallel)
            r0printf(&r, stdout,
                     "model parallel: tp %d x cp %d x pp %d x dp %d (Megatron-core order: tp fastest, then cp, "
                     "dp, pp)%s, %s (%d chunks per stage) over %d micro-batches; rank 0 holds %.3f M parameters of "
                     "its stage's tp shards\n",
                     r.cfg.tp, r.cfg.cp, r.cfg.pp, r.dp, r.cfg.sequence_parallel ? ", sequence parallel over tp" : "",
                     r.cfg.pp_schedule, r.cfg.pp_virtual, r.cfg.grad_accum,
                     plan.numel / 1e6);
    }

    /* resume */
    if (r.cfg.resume) {
        const char *path = r.cfg.resume;
        int try_auto = strcmp(path, "auto") == 0;
        char resolved[1024];
        if (try_auto) {
            if (!r.cfg.ckpt_dir) {
                r0printf(&r, stderr, "zero-train: train.resume \"auto\" needs train.checkpoint.dir\n");
                goto done;
            }
            path = r.cfg.ckpt_dir;
        }
        int found = 1;
        if (try_auto) {
            char sub[1100];
            (void)train_ckpt_position(&r, path, sub, sizeof sub);
            found = zero_checkpoint_resolve(sub, resolved, sizeof resolved) == ZERO_OK;
            if (r.par || r.ep) { /* every tp/pp (ep) position must agree: all resume or none */
                int32_t f[2] = {found, -found}, g2[2];
                if (zero_allreduce(r.host_comm, f, g2, 2, ZERO_I32, ZERO_MAX) != ZERO_OK) goto done;
                if (g2[0] != -g2[1]) {
                    r0printf(&r, stderr, "zero-train: train.resume \"auto\": only some %s positions have a "
                                         "checkpoint in %s/%s\n", r.par ? "tp/pp" : "ep", path,
                             r.par ? "tp*-pp*" : "ep*");
                    goto done;
                }
            }
        }
        if (!found) {
            r0printf(&r, stdout, "no checkpoint in %s yet: starting from step 0\n", path);
        } else if (train_resume(&r, path, try_auto) != 0) {
            goto done;
        }
    } else if (r.cfg.ckpt_dir && r.rank == 0) {
        /* a fresh run in a directory that holds checkpoints: allowed (its saves
         * are the newest there, and `--resume auto` finds them), but say so */
        char newest[1100], sub[1100];
        (void)train_ckpt_position(&r, r.cfg.ckpt_dir, sub, sizeof sub);
        if (zero_checkpoint_resolve(sub, newest, sizeof newest) == ZERO_OK)
            printf("warning: starting from step 0 although train.checkpoint.dir already holds checkpoints (newest: "
                   "%s); this run's saves replace any of the same step number, and keep_last counts every save "
                   "there, oldest first\n", newest);
    }

    if (train_progress_open(&r.progress, r.cfg.log_every, r.rank == 0 ? r.cfg.metrics_file : NULL, plain) != 0) {
        r0printf(&r, stderr, "zero-train: train.metrics_file %s: %s\n", r.cfg.metrics_file, strerror(errno));
        goto done;
    }
    train_install_stop_signals();
    rc = train_loop(&r) == 0 ? 0 : 1;
    if (rc == 0 && r.stopped_by) rc = 128 + r.stopped_by;
    train_progress_close(&r.progress);
    if (rc == 0 && dump_logits && train_write_logits(&r, dump_logits) != 0) rc = 1;
    if (rc == 0 && trace_path && r.par && train_parallel_write_trace(r.par, r.host_comm, trace_path, err, sizeof err) != 0) {
        r0printf(&r, stderr, "zero-train: %s\n", err);
        rc = 1;
    }

done:
    train_model_destroy(r.model);
    if (r.par) train_parallel_destroy(r.par); /* owns the engine */
    else zero_engine_destroy(r.engine);
    zero_comm_destroy(r.ep);
    train_data_close(r.data);
    if (r.comm && r.comm != r.host_comm) zero_comm_destroy(r.comm);
    zero_comm_destroy(r.edp_host);
    if (r.dev_world != r.comm) zero_comm_destroy(r.dev_world);
    zero_device_destroy(r.dev);
    train_config_free(&r.cfg);
    json_decref(root);
    /* Destroying the last comm finalizes MPI, and MPI_Finalize waits for every
     * rank: after a failure with a rank stopped, dead or cut off it would hang
     * for good. So a failed multi-rank run finalizes only if every rank gets
     * to this barrier (a failed comm refuses it at once); otherwise it exits
     * without finalizing and mpirun ends the job. */
    int finalize = rc == 0 || r.world <= 1 || !r.host_comm || zero_barrier(r.host_comm) == ZERO_OK;
    if (finalize) zero_comm_destroy(r.host_comm);
    return rc;
}
