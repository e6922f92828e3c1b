"""What the run actually got, read from the live objects after setup: the start record's facts, and each rank's
memory peaks.
"""

from __future__ import annotations

import os
import time

from .ranks import _world_size, gather_from_ranks, node_name


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total), counting ZeRO-3 partitioned and 4-bit packed parameters at full size (as PEFT does)."""
    # A 4-bit weight holds in x out values, packed; under FSDP2 it is a DTensor, no longer a Params4bit.
    four_bit = {
        id(m.weight): m.in_features * m.out_features for m in model.modules() if type(m).__name__ == "Linear4bit"
    }
    trainable = total = 0
    for param in model.parameters():
        n = four_bit.get(id(param)) or (param.ds_numel if hasattr(param, "ds_numel") else param.numel())
        total += n
        if param.requires_grad:
            trainable += n
    return trainable, total


def describe_run(trainer, job: dict) -> dict:
    """The start record: facts read from the live objects, not from the config that asked for them.

    Every rank calls it: each rank's node name is gathered (a collective)."""
    import torch.distributed as dist

    wrapped = trainer.model_wrapped
    zero_stage = None
    if trainer.is_deepspeed_enabled:
        engine = trainer.deepspeed or wrapped
        zero_stage = int(engine.zero_optimization_stage())
    fsdp_version = _fsdp_version(wrapped)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    trainable, total = count_parameters(trainer.model)
    quantized: dict[str, int] = {}
    for module in trainer.model.modules():
        if type(module).__module__.startswith("bitsandbytes"):
            quantized[type(module).__name__] = quantized.get(type(module).__name__, 0) + 1
    return {
        "event": "start",
        "time": time.time(),
        "world_size": _world_size(),
        "nodes": gather_from_ranks(node_name()),  # rank i runs on nodes[i]
        "distributed_type": str(trainer.accelerator.distributed_type.value),
        "zero_stage": zero_stage,
        "sequence_parallel": sequence_parallel_size(trainer.accelerator),
        "environment": {name: os.environ.get(name) for name in environment_names(job)},
        "fsdp": fsdp_version is not None,
        "fsdp_version": fsdp_version,
        "model_class": type(wrapped).__name__,
        "optimizer_class": type(optimizer).__name__ if optimizer is not None else None,
        "device": str(trainer.args.device),
        "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
        "method": job.get("method", "lora"),
        "objective": job.get("objective") or "sft",
        "reference": reference_model(trainer),
        "quantized_modules": quantized,  # bitsandbytes layers actually in the model: {"Linear4bit": 21}
        "trainable_params": trainable,
        "total_params": total,
        "frozen_dtypes": frozen_dtypes(trainer.model),
        "lora_scaling": adapter_scaling(trainer.model),
        # transformers hooks NEFTune onto the input embeddings (of the base, under PEFT) before training begins
        "neftune_noise_alpha": getattr(unwrap_peft(trainer).get_input_embeddings(), "neftune_noise_alpha", None),
        "max_steps": trainer.state.max_steps,
        "resumed_from_step": trainer.state.global_step or None,
    }


def adapter_scaling(model) -> float | None:
    """The scale PEFT applies to the first LoRA layer's update (all layers share it); None without adapters."""
    for module in model.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and scaling:
            return float(next(iter(scaling.values())))
    return None


def unwrap_peft(trainer):
    """The transformers model inside the trainer's (a PeftModel's base model, as NEFTune's hook finds it)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return model.base_model.model if hasattr(model, "peft_config") else model


def environment_names(job: dict) -> list[str]:
    """The names the job sets for every rank (launch.env's NAME=VALUE entries)."""
    return [str(entry).partition("=")[0].strip() for entry in (job.get("launch") or {}).get("env") or []]


def sequence_parallel_size(accelerator) -> int:
    """GPUs sharing each sequence (DeepSpeed Ulysses), as accelerate set it up: 1 without."""
    config = getattr(accelerator, "parallelism_config", None)
    return int(config.sp_size) if config is not None and config.sp_enabled else 1


def reference_model(trainer) -> str | None:
    """What a DPO or KTO run scores its reference with: "adapters off" (the base, with PEFT), the reference's wrapped
    class (DeepSpeedEngine under ZeRO-3, as TRL prepares it), or "scored before training" (its scores are columns of
    the training rows, preference.precompute_ref_log_probs); None without one (SFT)."""
    if not hasattr(trainer, "ref_model") or getattr(trainer, "beta", None) == 0.0:  # GRPO without a KL weight
        return None
    columns = getattr(trainer.train_dataset, "column_names", None) or []
    if trainer.ref_model is None and any(c.startswith("ref_") and c.endswith("logps") for c in columns):
        return "scored before training"  # the reference's scores are in the rows: no reference during the steps
    return "adapters off" if trainer.ref_model is None else type(trainer.ref_model).__name__


def frozen_dtypes(model) -> dict[str, int]:
    """Frozen parameter tensors per storage dtype, e.g. {"bfloat16": 37}: sharded QLoRA needs one dtype throughout."""
    counts: dict[str, int] = {}
    for param in model.parameters():
        if not param.requires_grad:
            name = str(param.dtype).removeprefix("torch.")
            counts[name] = counts.get(name, 0) + 1
    return counts


def _fsdp_version(model) -> int | None:
    """2 when fully_shard wrapped the model (FSDP2), 1 for FullyShardedDataParallel, None when nothing is sharded."""
    from torch.distributed import fsdp

    modules = list(model.modules())
    if any(isinstance(m, fsdp.FSDPModule) for m in modules):
        return 2
    if any(isinstance(m, fsdp.FullyShardedDataParallel) for m in modules):
        return 1
    return None


def gpu_peaks_gb() -> tuple[list[float], list[float]] | None:
    """Peak allocated / reserved GPU memory of every rank (a collective: all ranks call it), or None on CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    everyone = gather_from_ranks([torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30])
    return [round(m[0], 3) for m in everyone], [round(m[1], 3) for m in everyone]


def load_peaks() -> dict:
    """Every rank's peak memory right after the model loaded, before any sharding (a collective)."""
    import resource

    import torch

    gpu = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    everyone = gather_from_ranks([gpu, host])
    return {
        "load_gpu_peak_allocated_gb": [round(g, 3) for g, _ in everyone] if gpu is not None else None,
        "load_host_peak_rss_gb": [round(h, 3) for _, h in everyone],
    }
