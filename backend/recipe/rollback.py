"""A roll-back of the training-health guard (health.py): the request the attempt that blew up writes
(rollback.json: the checkpoint before the first bad step, the steps of data to skip, the learning rate's scale), and
what the next attempt does with it (TUNEDECK_ROLLBACK names the file): load that checkpoint, scale the learning rate,
skip the data window that preceded the blow-up. An attempt started again after a failure (a lost rank) keeps the
roll-back: the scaled learning rate and the skipped window stay, from the newest checkpoint saved since.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict
from pathlib import Path

from .health import Symptom, settings_of
from .records import ROLLBACK_FILE

ROLLBACK_ENV = "TUNEDECK_ROLLBACK"  # set by the supervisor for an attempt after a roll-back: rollback.json's path
ROLLBACK_EXIT = 3  # a rank's exit code when its attempt ends for a roll-back (1: failed)


def checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(N, folder) of every complete checkpoint-N in output_dir."""
    found = []
    for path in Path(output_dir).glob("checkpoint-*"):
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return found


def checkpoint_before(output_dir: str | Path, step: int) -> tuple[Path, int] | None:
    """The newest complete checkpoint-N in output_dir with N <= step."""
    found = [(number, path) for number, path in checkpoints(output_dir) if number <= step]
    if not found:
        return None
    number, path = max(found)
    return path, number


def current_rollback() -> dict | None:
    """The roll-back this attempt continues from (TUNEDECK_ROLLBACK), or None."""
    path = os.environ.get(ROLLBACK_ENV, "").strip()
    if not path:
        return None
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def rollback_checkpoint(rollback: dict, output_dir: str | Path, restarted: bool) -> str:
    """The checkpoint an attempt after a roll-back loads: the roll-back's own; or, for an attempt started again after
    a failure (restarted), the newest checkpoint the attempts since the roll-back saved, where there is one (never one
    saved before it: those after the first bad step hold the blow-up)."""
    if not restarted:
        return rollback["checkpoint"]
    since = float(rollback.get("written_at", 0.0))
    later = [(number, path) for number, path in checkpoints(output_dir) if path.stat().st_mtime > since]
    return str(max(later)[1].resolve()) if later else rollback["checkpoint"]


def plan_rollback(symptom: Symptom, job: dict, output_dir: str) -> tuple[dict | None, str]:
    """(rollback.json's content, why not) for a confirmed symptom under policy rollback."""
    settings = settings_of(job)
    before = current_rollback() or {}
    done = int(before.get("rollbacks", 0))
    if done >= int(settings["max_rollbacks"]):
        return None, f"it was rolled back {done} times already (training.health.max_rollbacks)"
    found = checkpoint_before(output_dir, symptom.last_good_step)
    if found is None:
        return None, (
            f"no checkpoint was saved at or before step {symptom.last_good_step} to roll back to: save more often "
            "(training.save_steps)"
        )
    path, step = found
    return {
        "rollbacks": done + 1,
        "checkpoint": str(path.resolve()),
        "checkpoint_step": step,
        "bad_step": symptom.step,
        "skip_steps": max(0, symptom.step - step),
        "lr_scale": float(settings["lr_scale"]) ** (done + 1),
        "symptom": asdict(symptom),
        "written_at": time.time(),  # checkpoints saved after it belong to the attempts that rolled back
    }, ""


def write_rollback(run_dir: Path, plan: dict) -> Path:
    path = run_dir / ROLLBACK_FILE
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(plan), encoding="utf-8")
    os.replace(staging, path)
    return path


def scale_learning_rate(optimizer, scheduler, job_lr: float, scale: float) -> None:
    """Set the learning rate to `scale` x the job's, whatever scale the loaded checkpoint's schedule holds: the
    schedule's base rates (LambdaLR multiplies them by its factor each step) and the optimizer's current rates."""
    inner = scheduler
    while inner is not None and not hasattr(inner, "base_lrs"):
        inner = getattr(inner, "scheduler", None)
    if inner is None or not inner.base_lrs or job_lr <= 0:
        return
    ratio = scale / (inner.base_lrs[0] / job_lr)
    inner.base_lrs = [lr * ratio for lr in inner.base_lrs]
    for group in optimizer.param_groups:
        group["lr"] *= ratio


def with_rollback_window(trainer_class, skip_steps: int):
    """trainer_class, which skips skip_steps optimizer steps' worth of batches after the checkpoint it resumes
    from (the data that preceded a blow-up), within the epoch; one more epoch keeps max_steps reachable."""
    if skip_steps <= 0:
        return trainer_class

    class SkipsTheWindow(trainer_class):
        skipped_steps = 0

        def set_initial_training_values(self, args, dataloader):
            values = list(super().set_initial_training_values(args, dataloader))
            values[0] += 1  # num_train_epochs: the steps skipped are trained in the next epoch
            return tuple(values)

        def _init_training_state(self, max_steps, num_update_steps_per_epoch, *args, **kwargs):
            epochs, batches = super()._init_training_state(max_steps, num_update_steps_per_epoch, *args, **kwargs)
            done = self.state.global_step % num_update_steps_per_epoch
            self.skipped_steps = max(0, min(skip_steps, num_update_steps_per_epoch - done - 1))
            return epochs, batches + self.skipped_steps * self.args.gradient_accumulation_steps

    return SkipsTheWindow
