"""What a resumed run restored, measured, and the sanity gate's check of it.

Every checkpoint carries position.json, written with it: the step, the learning rate the schedule had reached, the
rows the optimizer steps had seen (step x global batch) and the processes it was saved on. A run that resumes reads
back from the objects themselves what it got: the optimizer's own step count (Adam's "step" in its state: zero when
its moments were not restored), the schedule's position (the scheduler's last_epoch) and learning rate, and the
rows the Trainer skips to reach its data position (the epochs and batches it fast-forwards past, times the rows each
batch holds over the data-parallel processes). The start record holds them as "restored"; the gate stops the run
when one disagrees with the checkpoint: moments lost, a schedule started again, or a data position that the new
shape's global batch moved.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

POSITION_FILE = "position.json"  # in each checkpoint-N


def with_restored_position(trainer_class):
    """trainer_class, which keeps the data position it fast-forwards to on a resume (resumed_batches: the
    micro-batches each process skips) for the start record."""

    class KeepsItsPosition(trainer_class):
        resumed_batches: int | None = None

        def _init_training_state(self, max_steps, num_update_steps_per_epoch, *args, **kwargs):
            epochs, batches = super()._init_training_state(max_steps, num_update_steps_per_epoch, *args, **kwargs)
            per_epoch = num_update_steps_per_epoch * self.args.gradient_accumulation_steps
            self.resumed_batches = epochs * per_epoch + batches
            return epochs, batches

    return KeepsItsPosition


def data_parallel_size(trainer) -> int:
    from .describe import sequence_parallel_size

    return trainer.accelerator.num_processes // sequence_parallel_size(trainer.accelerator)


def global_batch(trainer) -> int:
    """Rows per optimizer step: per-device rows x accumulation x data-parallel processes."""
    args = trainer.args
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * data_parallel_size(trainer)


def write_position(trainer, folder: str | Path) -> None:
    """position.json in a checkpoint being saved (rank 0)."""
    step = trainer.state.global_step
    position = {
        "step": step,
        "learning_rate": trainer._get_learning_rate() if trainer.lr_scheduler is not None else None,
        "rows": step * global_batch(trainer),
        "global_batch": global_batch(trainer),
        "data_parallel": data_parallel_size(trainer),
    }
    (Path(folder) / POSITION_FILE).write_text(json.dumps(position) + "\n")


def restored(trainer, optimizer, scheduler, checkpoint: str | None, saved_on: int | None) -> dict | None:
    """The start record's "restored": what this run got back from `checkpoint`; None on a fresh start."""
    step = trainer.state.global_step
    if not checkpoint or not step:
        return None
    try:
        saved = json.loads((Path(checkpoint) / POSITION_FILE).read_text())
    except (OSError, ValueError):
        saved = None  # a checkpoint from before tunedeck wrote one: the step alone is checked
    batches = getattr(trainer, "resumed_batches", None)
    return {
        "checkpoint": Path(checkpoint).name,
        "step": step,
        "optimizer_step": optimizer_step(optimizer),
        "lr_schedule_step": getattr(scheduler, "last_epoch", None),
        "learning_rate": _learning_rate(optimizer),
        "data_rows": None
        if batches is None
        else batches * trainer.args.per_device_train_batch_size * data_parallel_size(trainer),
        "ignore_data_skip": bool(trainer.args.ignore_data_skip),
        "resharded_from": saved_on,  # a ZeRO checkpoint of another data-parallel size, loaded in universal form
        "saved": saved,
    }


def optimizer_step(optimizer) -> int | None:
    """The step count in the optimizer's own state (torch's Adam family keeps one per parameter): the largest;
    0 when it holds no state; None for an optimizer that keeps no count."""
    inner = optimizer  # accelerate's AcceleratedOptimizer, DeepSpeed's ZeRO optimizers: the torch one is inside
    while inner is not None and not isinstance(getattr(inner, "state", None), dict):
        inner = getattr(inner, "optimizer", None)
    if inner is None:
        return None
    if not inner.state:
        return 0
    steps = [state["step"] for state in inner.state.values() if isinstance(state, dict) and "step" in state]
    return int(max(float(s) for s in steps)) if steps else None


def _learning_rate(optimizer) -> float | None:
    groups = getattr(optimizer, "param_groups", None)
    return float(groups[0]["lr"]) if groups else None


def restore_problems(record: dict) -> list[str]:
    """The gate's check of a resumed run's "restored" facts against its checkpoint; [] for a fresh start."""
    got = record.get("restored")
    if not got:
        return []
    step, problems = got["step"], []
    where = f"resumed from {got['checkpoint']} (step {step})"
    if got["optimizer_step"] is not None and got["optimizer_step"] != step:
        problems.append(
            f"{where}, but the optimizer's state is at step {got['optimizer_step']}: its moments were not restored"
        )
    if got["lr_schedule_step"] is not None and got["lr_schedule_step"] != step:
        problems.append(f"{where}, but the learning-rate schedule is at step {got['lr_schedule_step']}")
    saved = got.get("saved") or {}
    saved_lr, lr = saved.get("learning_rate"), got["learning_rate"]
    if saved_lr is not None and lr is not None and not math.isclose(saved_lr, lr, rel_tol=1e-6, abs_tol=1e-12):
        problems.append(
            f"{where}, but the learning rate is {lr:.3g} where the checkpoint's schedule had {saved_lr:.3g}"
        )
    if saved.get("rows") is not None and got["data_rows"] is not None and not got["ignore_data_skip"]:
        if got["data_rows"] != saved["rows"]:
            problems.append(
                f"{where}, but its data position is row {got['data_rows']} where the checkpoint had seen "
                f"{saved['rows']}: the global batch changed ({saved['global_batch']} rows a step then); resume "
                "with `tunedeck runs resume`, which keeps it"
            )
    return problems
