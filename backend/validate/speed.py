"""Validation rules of the speed switches: Liger kernels and torch.compile.

Each switch is checked against what the model and the stack support, so a job that cannot use
one says so before launch instead of failing (or silently doing nothing) after the model loaded.
Whether the liger-kernel package is installed is a fact of the machine that trains: train.py's
input checks ask it there (and tunedeck's pre-launch check, on this machine).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from tunedeck.backend.spec import JobSpec, catalog
from tunedeck.backend.spec.problem import Problem, error, warning

# The model types Liger patches (liger-kernel's MODEL_TYPE_TO_APPLY_LIGER_FN, in
# liger_kernel/transformers/monkey_patch.py), limited to the families tunedeck's catalog knows.
LIGER_MODEL_TYPES = ("llama", "mistral", "mixtral", "gemma", "gemma2", "qwen2", "qwen3", "phi3")


def speed(spec: JobSpec) -> Iterator[Problem]:
    t = spec.training
    if t.use_liger_kernel:
        yield from _liger(spec)
    if t.torch_compile and spec.quantization.bits:
        yield warning(
            "training.torch_compile",
            "bitsandbytes' quantized layers break the compiled graph into pieces, so compiling gains little and "
            "costs minutes: set training.torch_compile=false for quantized models.",
        )


def _liger(spec: JobSpec) -> Iterator[Problem]:
    if spec.launch.use_cpu:
        yield error(
            "training.use_liger_kernel",
            "Liger's kernels are Triton kernels for NVIDIA GPUs: set training.use_liger_kernel=false on CPU.",
        )
        return
    model_type = _model_type(spec.model.name_or_path)
    if model_type is None:
        yield warning(
            "training.use_liger_kernel",
            f"the architecture of {spec.model.name_or_path} is unknown here; Liger patches only model types "
            f"{', '.join(LIGER_MODEL_TYPES)} and leaves others as they are.",
        )
    elif model_type not in LIGER_MODEL_TYPES:
        yield error(
            "training.use_liger_kernel",
            f"Liger has no kernels for model type {model_type} (it patches {', '.join(LIGER_MODEL_TYPES)}): "
            "set training.use_liger_kernel=false.",
        )


def _model_type(name_or_path: str) -> str | None:
    """The model's type: from the catalog, or from a local folder's config.json (any type, known or not)."""
    arch = catalog.lookup(name_or_path)
    if arch is not None:
        return arch.model_type
    try:
        config = json.loads((Path(name_or_path).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return model_type if isinstance(model_type, str) and model_type else None
