"""ds_config.json: the DeepSpeed config of DeepSpeed's docs, with the Hugging Face "auto" values.

"auto" is used exactly where the transformers integration fills the value from the
training arguments (batch sizes, accumulation, clipping) or from the model's hidden
size (bucket sizes), so the two files cannot disagree. Precision is written out
explicitly, so the file says what runs; transformers checks it against the arguments.
"""

from __future__ import annotations

import json

from tunedeck.backend.spec import JobSpec
from tunedeck.backend.spec.engine_facts import nvme_param_buffer_size


def _offload(device: str, nvme_path: str | None, buffer_size: int | None = None) -> dict:
    section: dict = {"device": device, "pin_memory": True}
    if device == "nvme":
        section["nvme_path"] = nvme_path
    if buffer_size is not None:
        section["buffer_size"] = buffer_size
    return section


def _zero_section(spec: JobSpec) -> dict:
    s = spec.strategy
    stage = s.zero_stage
    zero: dict = {"stage": stage}
    if s.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(s.offload_optimizer, s.nvme_path)
    if stage == 3 and s.offload_params != "none":
        buffer_size = nvme_param_buffer_size(spec) if s.offload_params == "nvme" else None
        zero["offload_param"] = _offload(s.offload_params, s.nvme_path, buffer_size)
    zero["overlap_comm"] = s.overlap_comm
    zero["contiguous_gradients"] = s.contiguous_gradients
    zero["reduce_bucket_size"] = s.reduce_bucket_size
    if stage == 3:
        zero["stage3_prefetch_bucket_size"] = s.stage3_prefetch_bucket_size
        zero["stage3_param_persistence_threshold"] = s.stage3_param_persistence_threshold
        zero["stage3_max_live_parameters"] = s.stage3_max_live_parameters
        zero["stage3_max_reuse_distance"] = s.stage3_max_reuse_distance
        zero["stage3_gather_16bit_weights_on_model_save"] = s.stage3_gather_16bit_weights_on_model_save
        zero["sub_group_size"] = 1_000_000_000
    else:
        zero["allgather_partitions"] = True
        zero["allgather_bucket_size"] = s.allgather_bucket_size
        zero["reduce_scatter"] = True
    return zero


def deepspeed_config_dict(spec: JobSpec) -> dict:
    """The ds_config.json content; only meaningful for strategy.kind zero1/zero2/zero3."""
    config: dict = {}
    precision = spec.training.precision
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        # Dynamic loss scaling (loss_scale 0), DeepSpeed's documented defaults.
        config["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "loss_scale_window": 1000,
            "initial_scale_power": 16,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    if spec.strategy.offload_optimizer != "none":
        # An offloaded optimizer must be DeepSpeed's CPU Adam (DeepSpeed refuses a torch optimizer
        # with ZeRO-Offload); hyper-parameters still come from the training arguments.
        config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    config["zero_optimization"] = _zero_section(spec)
    config["gradient_accumulation_steps"] = "auto"
    config["gradient_clipping"] = "auto"
    config["train_batch_size"] = "auto"
    config["train_micro_batch_size_per_gpu"] = "auto"
    config["wall_clock_breakdown"] = False
    return config


def render_deepspeed_json(spec: JobSpec) -> str:
    return json.dumps(deepspeed_config_dict(spec), indent=2) + "\n"
