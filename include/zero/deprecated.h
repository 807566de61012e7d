/* Old names of functions renamed at 1.0 (docs/abi.md, "Renames"), kept as
 * deprecated aliases for one minor version: 1.0.x has them, 1.1 removes them.
 * They are macros, not symbols: code compiled with an old name calls the new
 * one. Define ZERO_NO_DEPRECATED to check that code no longer uses them.
 * Included by every public header (through export.h). */
#ifndef ZERO_DEPRECATED_H
#define ZERO_DEPRECATED_H

#ifndef ZERO_NO_DEPRECATED
/* lifecycle verbs: create / destroy */
#define zero_device_open zero_device_create
#define zero_device_close zero_device_destroy
#define zero_comm_init_world zero_comm_create_world
#define zero_topo_load zero_topo_create
#define zero_topo_load_synthetic zero_topo_create_synthetic
#define zero_nvme_store_open zero_nvme_store_create
#define zero_nvme_store_close zero_nvme_store_destroy
/* accessors: <object>_get_<what> */
#define zero_device_ordinal zero_device_get_ordinal
#define zero_comm_rank zero_comm_get_rank
#define zero_comm_size zero_comm_get_size
#define zero_comm_backend zero_comm_get_backend
#define zero_comm_world_rank zero_comm_get_world_rank
#define zero_comm_world_rank_of zero_comm_get_world_rank_of
#define zero_comm_timeout zero_comm_get_timeout
#define zero_comm_name zero_comm_get_name
#define zero_engine_loss_scale zero_engine_get_loss_scale
#define zero_engine_memory_report zero_engine_get_memory_report
#define zero_engine_offload_report zero_engine_get_offload_report
#define zero_engine_param_offload_report zero_engine_get_param_offload_report
#define zero_engine_plan_info zero_engine_get_plan_info
#define zero_engine_param_info zero_engine_get_param_info
#define zero_engine_bucket_info zero_engine_get_bucket_info
#define zero_engine_num_params zero_engine_get_num_params
#define zero_engine_num_modules zero_engine_get_num_modules
#define zero_engine_module_name zero_engine_get_module_name
#define zero_engine_param_owned_range zero_engine_get_param_owned_range
/* a fill with a value, not with zeros */
#define zero_fill zero_fill_value
#endif

#endif
