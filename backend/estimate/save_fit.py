"""Whether the job's saves fit its GPUs and host RAM, as a problem naming the setting that makes the save gather.

A job that trains within its memory can still fail when it saves (hiyouga/LlamaFactory#7532): the save peak
(backend/estimate/memory_save.py) is checked like the training peak, an error above the GPU's memory or the
machine's RAM and a warning above FIT_FRACTION, each with the change that stops the gather.
"""

from __future__ import annotations

from typing import Any, Literal

from tunedeck.backend.estimate.gpu_fit import FIT_FRACTION, format_gb
from tunedeck.backend.estimate.memory import Estimate
from tunedeck.backend.spec import JobSpec
from tunedeck.backend.spec.problem import Problem

ZERO3_SHARDS = (
    "each rank then saves its own shards, and DeepSpeed's zero_to_fp32.py, which every checkpoint carries, "
    "consolidates them after training on a machine with the RAM"
)


def save_problems(spec: JobSpec, est: Estimate, gpu_mem_gb: float, cpu_mem_gb: float | None) -> list[Problem]:
    """At most one problem: the host RAM's (where saves fail), else the GPU's."""
    if cpu_mem_gb is not None and est.save.host_gb > 0 and est.save_host_gb > FIT_FRACTION * cpu_mem_gb:
        level = _level(est.save_host_gb, cpu_mem_gb)
        return [_host_problem(spec, est, level, cpu_mem_gb)]
    if est.save.gpu_gb > 0 and est.save_gpu_gb > FIT_FRACTION * gpu_mem_gb:
        level = _level(est.save_gpu_gb, gpu_mem_gb)
        verdict = "does not fit" if level == "error" else f"may not fit (above {FIT_FRACTION:.0%})"
        return [
            Problem(
                level,
                "strategy.kind",
                f"Saving {verdict}: it needs {format_gb(est.save_gpu_gb)} per GPU of {gpu_mem_gb:g} GB ({est.save.how}; "
                f"{format_gb(est.save.gpu_gb)} gathered at once). Free GPU memory for it: offload the optimizer "
                "(strategy.offload_optimizer=cpu) or use more GPUs.",
            )
        ]
    return []


def _level(need: float, have: float) -> Literal["error", "warning"]:
    return "error" if need > have else "warning"


def _host_problem(spec: JobSpec, est: Estimate, level: Literal["error", "warning"], ram: float) -> Problem:
    verdict = "does not fit" if level == "error" else f"may not fit (above {FIT_FRACTION:.0%})"
    training = f", {est.cpu_gb:.0f} GB of it offloaded states" if est.cpu_gb >= 0.5 else ""
    field, fix, change = _way_out(spec, est, ram)
    return Problem(
        level,
        field,
        f"{field}: saving {verdict}: {est.save.how}, so a save needs {est.save_host_gb:.0f} GB of host RAM per "
        f"machine{training}, and the machine has {ram:.0f} GB; {change}.",
        fix=fix,
    )


def _way_out(spec: JobSpec, est: Estimate, ram: float) -> tuple[str, dict[str, Any] | None, str]:
    """(field, fix, sentence): the change that stops the save from gathering where it fails."""
    s, lora = spec.strategy, spec.method != "full"
    zero3 = "zero3, which gathers only the adapter (exclude_frozen_parameters)" if lora else "zero3"
    if s.facts.is_fsdp:
        final = est.cpu_gb + est.save.final_host_gb
        if s.fsdp_state_dict_type == "FULL_STATE_DICT" and final <= FIT_FRACTION * ram:
            return (
                "strategy.fsdp_state_dict_type",
                {"strategy.fsdp_state_dict_type": "SHARDED_STATE_DICT"},
                "use SHARDED_STATE_DICT: each rank writes its own shard, and the model is gathered once, at the "
                f"final save ({final:.0f} GB)",
            )
        return (
            "strategy.kind",
            None,
            "the final save gathers the whole model whatever strategy.fsdp_state_dict_type says (train_sft.py saves "
            f"it with FULL_STATE_DICT): use {zero3} with strategy.stage3_gather_16bit_weights_on_model_save=false "
            f"({ZERO3_SHARDS})",
        )
    if s.zero_stage == 3:
        return (
            "strategy.stage3_gather_16bit_weights_on_model_save",
            {"strategy.stage3_gather_16bit_weights_on_model_save": False},
            f"set it to false: {ZERO3_SHARDS}",
        )
    if s.is_deepspeed:
        return ("strategy.kind", None, f"use {zero3}: it gathers on rank 0 only")
    return (
        "strategy.kind",
        None,
        f"use zero3 with strategy.stage3_gather_16bit_weights_on_model_save=false ({ZERO3_SHARDS})",
    )
