"""accelerate_config.yaml: the file `accelerate config` would write for this job.

The dict has the keys and value types of accelerate's ClusterConfig and is dumped the
way `ClusterConfig.to_yaml_file` dumps it (yaml.safe_dump, sorted keys), so a reader
who knows accelerate sees a familiar file. accelerate itself is not imported here:
the panel must stay light (tests load the result with accelerate's own loader).
"""

from __future__ import annotations

import yaml

from tunedeck.backend.spec import JobSpec
from tunedeck.backend.spec.engine_facts import fsdp_layer_cls

DEEPSPEED_CONFIG_FILE = "ds_config.json"

# Mixed precision names of `accelerate config` by training.precision.
_MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}


def distributed_type(spec: JobSpec) -> str:
    """accelerate's distributed_type for the job: the strategy table's, or NO for one plain process."""
    if spec.layout.wrapper == "none":
        # `accelerate config` refuses MULTI_GPU with one process on one machine.
        return "NO"
    return spec.strategy.facts.distributed_type


def accelerate_config_dict(spec: JobSpec) -> dict:
    launch, layout = spec.launch, spec.layout
    kind = distributed_type(spec)
    config: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": kind,
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "machine_rank": launch.machine_rank,
        "main_training_function": "main",
        "num_machines": launch.num_machines,
        "num_processes": launch.num_processes,
        "rdzv_backend": launch.rdzv_backend,
        "same_network": launch.same_network,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        # DeepSpeed on CPU runs with use_cpu false (the DeepSpeed CPU accelerator does the work).
        "use_cpu": launch.use_cpu and layout.is_ddp,
    }
    if not launch.use_cpu:
        config["gpu_ids"] = launch.gpu_ids
    if launch.num_machines > 1:
        config["main_process_ip"] = launch.main_process_ip
        config["main_process_port"] = launch.main_process_port
    if layout.is_deepspeed:
        # No mixed_precision here: with deepspeed_config_file accelerate refuses it; ds_config.json decides.
        config["deepspeed_config"] = _deepspeed_section(spec)
        if layout.sequence_parallel > 1:
            config["parallelism_config"] = _sequence_parallelism(spec)
    else:
        config["mixed_precision"] = _MIXED_PRECISION[spec.training.precision]
    if layout.is_fsdp:
        config["fsdp_config"] = _fsdp_section(spec)
        parallelism = _hybrid_shard_parallelism(spec)
        if parallelism:
            config["parallelism_config"] = parallelism
    return config


def _deepspeed_section(spec: JobSpec) -> dict:
    section: dict = {"deepspeed_config_file": DEEPSPEED_CONFIG_FILE}
    if spec.layout.is_zero3:
        # Build a 16-bit model already sharded (deepspeed.zero.Init). transformers skips it for quantized
        # models, which load whole on every rank before ZeRO-3 shards them (modeling_utils.get_init_context).
        section["zero3_init_flag"] = True
    if spec.launch.num_machines > 1:
        # One launcher per node, like torchrun: no pdsh hostfile needed.
        section["deepspeed_multinode_launcher"] = "standard"
    return section


def _fsdp_section(spec: JobSpec) -> dict:
    s = spec.strategy
    section: dict = {
        "fsdp_activation_checkpointing": s.fsdp_activation_checkpointing,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_cpu_ram_efficient_loading": s.fsdp_cpu_ram_efficient_loading,
        "fsdp_offload_params": s.offload_params == "cpu",
        "fsdp_state_dict_type": s.fsdp_state_dict_type,
        "fsdp_transformer_layer_cls_to_wrap": fsdp_layer_cls(spec),
        "fsdp_version": s.fsdp_version,
    }
    if s.fsdp_version == 2:
        # FSDP2 has no sharding-strategy enum: SHARD_GRAD_OP = keep parameters gathered after forward;
        # HYBRID_SHARD = FULL_SHARD inside a node + replication across nodes (parallelism_config).
        section["fsdp_reshard_after_forward"] = spec.layout.gathers_per_layer
    else:
        section["fsdp_reshard_after_forward"] = s.fsdp_sharding_strategy
        # accelerate 1.15's launcher always exports FSDP_SHARDING_STRATEGY (default FULL_SHARD) and the
        # FSDP1 plugin prefers it over reshard_after_forward: without this key SHARD_GRAD_OP is lost.
        section["fsdp_sharding_strategy"] = s.fsdp_sharding_strategy
        section["fsdp_backward_prefetch"] = "BACKWARD_PRE"
        section["fsdp_forward_prefetch"] = False
        section["fsdp_use_orig_params"] = True  # frozen base + trainable adapters in one unit need it
        section["fsdp_sync_module_states"] = True  # required by cpu_ram_efficient_loading; harmless otherwise
    return section


def _hybrid_shard_parallelism(spec: JobSpec) -> dict:
    layout = spec.layout
    if layout.fsdp_version != 2 or not layout.hybrid:
        return {}
    prefix = "parallelism_config_"
    return {
        prefix + "dp_replicate_size": layout.machines,
        prefix + "dp_shard_size": layout.shard_group_size,
        prefix + "tp_size": layout.tensor_parallel,
        prefix + "cp_size": 1,
    }


def _sequence_parallelism(spec: JobSpec) -> dict:
    """DeepSpeed Ulysses as accelerate's config file names it (transformers' deepspeed_alst guide)."""
    prefix = "parallelism_config_"
    return {
        prefix + "sp_size": spec.sequence_parallel,
        prefix + "sp_backend": "deepspeed",
        # Batches differ in length (rows are padded to the longest in their batch, not to max_length).
        prefix + "sp_seq_length_is_variable": True,
        prefix + "sp_attn_implementation": spec.model.attn_implementation,
    }


def render_accelerate_config(spec: JobSpec) -> str:
    return yaml.safe_dump(accelerate_config_dict(spec), sort_keys=True)
