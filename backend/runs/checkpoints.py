"""What a run saved, and which of it a person can try, evaluate or merge (no torch: the panel lists it).

A LoRA/QLoRA run leaves its weights in the output folder (job.yaml's output_dir, relative
to the run folder as train.py sees it):
  output/adapter_model.safetensors   the final adapter (Trainer.save_model; ZeRO-3 and FSDP gather it)
  output/checkpoint-N/               one per save, in the layout of the strategy that wrote it:
      adapter_model.safetensors                           DDP, ZeRO-1/2: a plain PEFT adapter
      latest + global_stepN/zero_pp_rank_*_model_states   DeepSpeed: sharded (zero_to_fp32 gathers them)
      pytorch_model_fsdp_0/*.distcp                       FSDP SHARDED_STATE_DICT: torch.distributed.checkpoint
A sharded checkpoint is consolidated into a plain adapter once (backend/after/consolidate.py, in the
worker) under <run>/consolidated/checkpoint-N/, so every checkpoint, not only the final save,
can be loaded the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tunedeck.backend.spec import JobSpec

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-([0-9]+)$")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
CONSOLIDATED_DIR = "consolidated"  # under the run folder
ADAPTER_METHODS = ("lora", "qlora")


class AfterError(Exception):
    """Why a run's model cannot be tried, evaluated or merged; the message is for the user."""


@dataclass(frozen=True)
class Weights:
    """One loadable model of a run: the base alone, the final adapter, or a checkpoint's."""

    name: str  # "base", "final" or "checkpoint-N": the key in eval.json and in the page
    path: Path | None  # the folder holding it (None for the base)
    step: int | None  # the training step it was saved at (None for base and final)
    layout: str  # "base" | "adapter" | "deepspeed" | "fsdp"

    @property
    def is_base(self) -> bool:
        return self.layout == "base"

    @property
    def folder(self) -> Path:
        """The folder holding it; the base has none (it loads by the job's model name)."""
        if self.path is None:
            raise AfterError(f"{self.name}: the base model has no folder of its own; pick an adapter")
        return self.path

    @property
    def sharded(self) -> bool:
        return self.layout in ("deepspeed", "fsdp")

    def describe(self) -> str:
        if self.is_base:
            return "the base model alone"
        what = "the final adapter" if self.name == "final" else f"the adapter of {self.name}"
        sharded = {"deepspeed": " (DeepSpeed ZeRO shards)", "fsdp": " (FSDP shards)"}.get(self.layout, "")
        return what + sharded


def output_dir(run_dir: Path, job: JobSpec) -> Path:
    """The run's output folder: output_dir from job.yaml, relative ones taken from the run folder."""
    return (Path(run_dir) / Path(job.output_dir).expanduser()).resolve()


def base_model_path(run_dir: Path, job: JobSpec) -> str:
    """model.name_or_path as the run loaded it: a relative local folder is taken from the run folder."""
    name = job.model.name_or_path
    if not name:
        raise AfterError("job.yaml has no model.name_or_path: the run's job is damaged")
    local = Path(run_dir) / Path(name).expanduser()
    return str(local.resolve()) if local.exists() else name


def layout_of(folder: Path) -> str | None:
    """How a checkpoint folder holds its weights, or None when it holds no adapter.

    Shards win over a plain adapter file in the same folder: under ZeRO-3 with
    stage3_gather_16bit_weights_on_model_save=false the plain file is empty, and the
    fp32 shards are the master weights either way.
    """
    if (folder / "latest").is_file() and any(folder.glob("global_step*")):
        return "deepspeed"
    if (folder / "pytorch_model_fsdp_0" / ".metadata").is_file():
        return "fsdp"
    if any((folder / name).is_file() for name in ADAPTER_FILES):
        return "adapter"
    return None


def list_weights(run_dir: Path, job: JobSpec) -> list[Weights]:
    """The base, then every checkpoint by step, then the final adapter (when saved)."""
    found = [Weights("base", None, None, "base")]
    out = output_dir(run_dir, job)
    steps = []
    try:
        entries = list(out.iterdir())
    except OSError:  # nothing saved yet
        entries = []
    for entry in entries:
        match = CHECKPOINT_PATTERN.match(entry.name)
        layout = layout_of(entry) if match and entry.is_dir() else None
        if match and layout:
            steps.append(Weights(entry.name, entry, int(match.group(1)), layout))
    found += sorted(steps, key=lambda w: w.step)
    if any((out / name).is_file() for name in ADAPTER_FILES):
        found.append(Weights("final", out, None, "adapter"))
    return found


def check_adapter_run(job: JobSpec, run_id: str) -> None:
    method = job.method
    if method not in ADAPTER_METHODS:
        raise AfterError(
            f"run {run_id} trained the whole model (method {method}); trying, evaluating and merging cover LoRA "
            "and QLoRA runs: its output folder is already a standalone model that transformers loads"
        )


def select(run_dir: Path, job: JobSpec, run_id: str, checkpoint: int | None = None, base: bool = False) -> Weights:
    """The weights a command asked for: the base, checkpoint-N, or the final adapter (else the newest checkpoint)."""
    check_adapter_run(job, run_id)
    every = list_weights(run_dir, job)
    if base:
        return every[0]
    saved = [w for w in every if not w.is_base]
    if checkpoint is not None:
        match = next((w for w in saved if w.step == checkpoint), None)
        if match is None:
            steps = ", ".join(str(w.step) for w in saved if w.step is not None) or "none yet"
            raise AfterError(f"--checkpoint: run {run_id} has no checkpoint {checkpoint} (its checkpoints: {steps})")
        return match
    if not saved:
        every_n = job.training.save_steps
        raise AfterError(
            f"run {run_id} has saved no adapter yet (nothing in {output_dir(run_dir, job)}): wait for its first "
            f"checkpoint (training.save_steps = {every_n}) or for the end of training"
        )
    final = next((w for w in saved if w.name == "final"), None)
    return final or saved[-1]


def consolidated_dir(run_dir: Path, weights: Weights) -> Path:
    return Path(run_dir) / CONSOLIDATED_DIR / weights.name
