/* A program built against an OLDER libzero header: copies of the versioned
 * structs as they were at an earlier version (OLD_CONFIG_VERSION 1..3 for
 * zero_config, version 1 of zero_comm_config), and the few calls
 * test_old_structs.c makes. Compiled instead of <zero/engine.h> and
 * <zero/comm.h>, so the test's structs have the old sizes a real old caller's
 * would. Field lists follow the version tables in engine.h and comm.h. */
#ifndef ZERO_TESTS_OLD_HEADER_H
#define ZERO_TESTS_OLD_HEADER_H

#include <stddef.h>
#include <stdint.h>
#include <zero/dtype.h>
#include <zero/status.h>

#ifndef OLD_CONFIG_VERSION
#error "define OLD_CONFIG_VERSION (1..3)"
#endif

typedef struct zero_comm zero_comm;
typedef struct zero_device zero_device;
typedef struct zero_engine zero_engine;

/* zero_comm_config, version 1: before `fingerprint` was appended. */
typedef struct zero_comm_config {
    size_t size;
    uint32_t version;
    int backend;
    int device;
    double timeout_s;
} zero_comm_config;
#define ZERO_COMM_CONFIG_VERSION 1u
#define ZERO_COMM_CONFIG_INIT { sizeof(zero_comm_config), ZERO_COMM_CONFIG_VERSION, 0, -1, 60.0 }

typedef struct zero_config {
    size_t size;
    uint32_t version;
    /* version 1 */
    int stage;
    uint64_t reduce_bucket_size;
    uint64_t allgather_bucket_size;
    int overlap_comm;
    int contiguous_gradients;
    uint64_t stage3_prefetch_bucket_size;
    uint64_t stage3_max_live_parameters;
    uint64_t stage3_param_persistence_threshold;
    int optimizer;
    double lr;
    double beta1, beta2;
    double eps;
    double weight_decay;
    double momentum;
    double dampening;
    int nesterov;
    double gradient_clipping;
    int gradient_accumulation_steps;
    zero_dtype compute_dtype;
    double loss_scale;
    int initial_scale_power;
    int loss_scale_window;
    int hysteresis;
    double min_loss_scale;
#if OLD_CONFIG_VERSION >= 2
    int offload_optimizer_device;
    char offload_nvme_path[256];
    int offload_pin_memory;
    int offload_buffer_count;
    uint64_t sub_group_size;
    uint64_t aio_block_size;
    int aio_queue_depth;
#endif
#if OLD_CONFIG_VERSION >= 3
    int offload_param_device;
    char offload_param_nvme_path[256];
    int offload_param_pin_memory;
    int offload_param_buffer_count;
    uint64_t offload_param_buffer_size;
    uint64_t offload_param_max_in_cpu;
#endif
} zero_config;

#define ZERO_CONFIG_VERSION_V1_INIT                                                                \
    sizeof(zero_config), OLD_CONFIG_VERSION, 0, 500000000u, 500000000u, 0, 1, 50000000u, 1000000000u, \
        100000u, 0, 1e-3, 0.9, 0.999, 1e-8, 0.01, 0.0, 0.0, 0, 0.0, 1, ZERO_F32, 0.0, 16, 1000, 2, 1.0
#if OLD_CONFIG_VERSION == 1
#define ZERO_CONFIG_INIT { ZERO_CONFIG_VERSION_V1_INIT }
#elif OLD_CONFIG_VERSION == 2
#define ZERO_CONFIG_INIT { ZERO_CONFIG_VERSION_V1_INIT, 0, "", 0, 4, 1000000000u, 1048576u, 8 }
#else
#define ZERO_CONFIG_INIT \
    { ZERO_CONFIG_VERSION_V1_INIT, 0, "", 0, 4, 1000000000u, 1048576u, 8, 0, "", 0, 5, 100000000u, 1000000000u }
#endif

zero_status zero_comm_create_world(zero_comm **out, const zero_comm_config *config);
void zero_comm_destroy(zero_comm *comm);
zero_status zero_device_create(zero_device **out, int kind, int ordinal);
void zero_device_destroy(zero_device *dev);
zero_status zero_config_from_json(zero_config *config, const char *json_text);
zero_status zero_engine_create(zero_engine **out, const zero_config *config, zero_comm *dp, zero_device *dev);
void zero_engine_destroy(zero_engine *e);
zero_status zero_engine_add_module(zero_engine *e, const char *name, int *module_id);
zero_status zero_engine_add_param(zero_engine *e, int module, const char *name, int ndim, const int64_t *shape,
                                  const float *init, int *param_id);
zero_status zero_engine_finalize(zero_engine *e);

#endif
