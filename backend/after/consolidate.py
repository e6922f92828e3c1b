"""Turn a sharded checkpoint into a plain PEFT adapter folder, through the libraries' own APIs.

  DeepSpeed ZeRO (any stage): deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint,
      the function behind the zero_to_fp32.py script DeepSpeed writes into every checkpoint. It
      rebuilds the fp32 master weights of the trainable parameters (the adapter) from all ranks' shards.
  FSDP with SHARDED_STATE_DICT: accelerate.utils.merge_fsdp_weights (what `accelerate merge-weights`
      runs), which reads the torch.distributed.checkpoint folder on one process.

The result goes to <run>/consolidated/<checkpoint-N>/ (adapter_config.json, adapter_model.safetensors,
SOURCE.json), written under a hidden name and renamed, and is reused while the checkpoint is unchanged.
Imports torch: runs in the worker process, never in the panel.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tunedeck.backend.runs.checkpoints import AfterError, Weights, consolidated_dir, output_dir
from tunedeck.backend.spec import JobSpec

SOURCE_FILE = "SOURCE.json"


def adapter_folder(run_dir: Path, job: JobSpec, weights: Weights, progress=None) -> Path:
    """A folder PeftModel.from_pretrained loads: the checkpoint itself, or its consolidated copy."""
    if not weights.sharded:
        return weights.folder
    target = consolidated_dir(run_dir, weights)
    stamp = _source_stamp(weights)
    if _read_stamp(target) == stamp:
        return target
    if progress:
        progress(f"consolidating the {weights.layout} shards of {weights.name}", 0, 1)
    state = _deepspeed_state(weights.folder) if weights.layout == "deepspeed" else _fsdp_state(weights.folder, target)
    adapter = _adapter_state(state, weights)
    _write_adapter(target, adapter, _adapter_config(run_dir, job, weights), stamp)
    if progress:
        progress(f"consolidating the {weights.layout} shards of {weights.name}", 1, 1)
    return target


def _source_stamp(weights: Weights) -> dict:
    marker = weights.folder / ("latest" if weights.layout == "deepspeed" else "pytorch_model_fsdp_0/.metadata")
    return {"source": str(weights.path), "layout": weights.layout, "mtime_ns": marker.stat().st_mtime_ns}


def _read_stamp(target: Path) -> dict | None:
    try:
        return json.loads((target / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _deepspeed_state(folder: Path) -> dict:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # Trainable parameters only: the frozen base is not in the optimizer's fp32 partitions.
    state = get_fp32_state_dict_from_zero_checkpoint(str(folder), exclude_frozen_parameters=True)
    if state is None:  # typed Optional upstream; a checkpoint without ZeRO states
        raise AfterError(f"{folder}: no DeepSpeed ZeRO states to consolidate")
    return state


def _fsdp_state(folder: Path, target: Path) -> dict:
    from accelerate.utils import merge_fsdp_weights
    from safetensors.torch import load_file

    scratch = target.parent / f".{target.name}.fsdp-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    try:
        merge_fsdp_weights(str(folder / "pytorch_model_fsdp_0"), str(scratch), safe_serialization=True)
        return load_file(str(scratch / "model.safetensors"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _adapter_state(state: dict, weights: Weights) -> dict:
    """The LoRA tensors under the names PEFT saves them with.

    DeepSpeed names parameters as the live PeftModel does (`...lora_A.default.weight`); PEFT's
    get_peft_model_state_dict drops the adapter name when it saves (`.replace(f".{adapter_name}", "")`),
    and FSDP's sharded state dict already holds the saved names. Frozen base tensors are left out.
    """
    adapter = {}
    for key, tensor in state.items():
        if "lora_" not in key:
            continue
        adapter[key.replace(".default", "")] = tensor.detach().to("cpu").contiguous()
    if not adapter:
        raise AfterError(
            f"{weights.path}: its {weights.layout} shards hold no LoRA weights ({len(state)} other tensors); "
            "the checkpoint is not of a LoRA run or is damaged"
        )
    return adapter


def _adapter_config(run_dir: Path, job: JobSpec, weights: Weights) -> dict:
    """adapter_config.json: the checkpoint's own, else the final save's, else rebuilt from job.yaml as train.py builds it."""
    for folder in (weights.folder, output_dir(run_dir, job)):
        path = folder / "adapter_config.json"
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    from peft import LoraConfig

    from tunedeck.backend.runs.checkpoints import base_model_path

    config = LoraConfig(
        task_type="CAUSAL_LM", base_model_name_or_path=base_model_path(run_dir, job), **job.lora.model_dump()
    )
    return config.to_dict()


def _write_adapter(target: Path, adapter: dict, config: dict, stamp: dict) -> None:
    from safetensors.torch import save_file

    staging = target.parent / f".{target.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        save_file(adapter, str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
        (staging / "adapter_config.json").write_text(
            json.dumps(config, indent=2, default=_jsonable) + "\n", encoding="utf-8"
        )
        (staging / SOURCE_FILE).write_text(json.dumps(stamp) + "\n", encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise AfterError(
            f"cannot write the consolidated adapter to {target} ({exc.strerror or exc}): free space on its disk"
        ) from None


def _jsonable(value):
    return sorted(value) if isinstance(value, (set, frozenset)) else str(value)
