"""Where a worker puts its model: a GPU that no live run holds and that has room, else the CPU (no torch).

Room is judged by a rough inference estimate: the base's weights as the run loads them (the
training estimate's own terms, backend/estimate/memory_job.py), the adapter, a KV cache and logits for
a batch of full-length sequences, and the CUDA context; then NVML's free memory on each GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunedeck.backend.estimate.memory_job import (
    CUDA_CONTEXT_BYTES,
    GIB,
    Job,
    frozen_base_params,
    input_values,
    quant_stats_bytes,
)
from tunedeck.backend.machine.nvml import gpu_memory
from tunedeck.backend.spec import JobSpec

GENERATED_TOKENS = 512
HEADROOM = 1.15  # the allocator's fragmentation and what the estimate leaves out


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu" or "cuda:0" (the worker sees only its GPU)
    gpu: int | None  # the GPU's index on this machine
    warning: str | None  # why it runs on the CPU, in words
    need_gb: float | None


def inference_gb(job: JobSpec, batch: int = 1) -> float | None:
    """GiB a model of this job needs on one GPU to answer `batch` full-length prompts at once; None when its architecture is unknown."""
    try:
        est = Job.from_values(input_values(job))
    except (ValueError, KeyError, TypeError):
        return None
    arch = est.arch
    tokens = est.seq_len + GENERATED_TOKENS
    kv_cache = 2 * arch.num_hidden_layers * arch.kv_size * est.act_bytes * tokens * batch
    logits = batch * tokens * arch.vocab_size * 4  # scored in fp32
    adapter = (
        arch.lora_trainable(est.lora_r, est.lora_targets, est.use_dora) * est.weight_bytes
        if est.method != "full"
        else 0
    )
    total = frozen_base_params(est) + quant_stats_bytes(est) + adapter + kv_cache + logits + CUDA_CONTEXT_BYTES
    return HEADROOM * total / GIB


def held_gpus(runs_dir: Path) -> dict[int, str]:
    """GPU index -> the live run that holds it."""
    from tunedeck.backend.runs.folder import ACTIVE_STATES
    from tunedeck.backend.runs.manager import RunManager

    held = {}
    for run in RunManager(runs_dir).list_runs():
        if run.state in ACTIVE_STATES:
            for gpu in run.gpu_ids or []:
                held[gpu] = run.run_id
    return held


def _free_gb(nvml) -> dict[int, float]:
    """Free memory of every GPU (NVML), or {} without a GPU or driver."""
    return {gpu.index: gpu.free_gb for gpu in gpu_memory(nvml)}


def place(
    job: JobSpec, runs_dir: Path, taken: set[int] | frozenset = frozenset(), nvml=None, batch: int = 1
) -> Placement:
    """The GPU with the most free memory that fits and is free of runs and other workers, else the CPU with a warning."""
    free = _free_gb(nvml)
    if not free:
        return Placement("cpu", None, "no NVIDIA GPU found: the model runs on the CPU (slow for large models)", None)
    need = inference_gb(job, batch)
    if need is None:
        return Placement(
            "cpu", None, "the model's size is unknown (not in the catalog, no config.json): it runs on the CPU", None
        )
    held = held_gpus(runs_dir)
    usable = {i: gb for i, gb in free.items() if i not in held and i not in taken}
    fitting = {i: gb for i, gb in usable.items() if gb >= need}
    if fitting:
        gpu = max(fitting, key=lambda i: fitting[i])  # the most free memory
        return Placement("cuda:0", gpu, None, need)
    reasons = [f"GPU {i} is held by run {held[i]}" for i in sorted(free) if i in held]
    reasons += [f"GPU {i} serves another model" for i in sorted(free) if i in taken and i not in held]
    reasons += [f"GPU {i} has {gb:.1f} GiB free" for i, gb in sorted(usable.items())]
    return Placement(
        "cpu",
        None,
        f"the model needs about {need:.1f} GiB and no GPU has room ({'; '.join(reasons)}): it runs on the CPU",
        need,
    )
