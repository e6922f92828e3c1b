"""Checkpoints written whole or not at all, and which one a resumed run loads."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from .failures import ATTEMPT_ENV
from .job import JobError
from .records import write_progress
from .restore import write_position
from .watchdog import CHECKPOINT_SAVING

INCOMPLETE_DIR = ".incomplete"  # under output_dir: checkpoints being written

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def with_atomic_checkpoints(trainer_class):
    """trainer_class, writing each checkpoint under output_dir/.incomplete/ and renaming it into place when complete.

    transformers' Trainer._save_checkpoint writes straight into output_dir/checkpoint-N, and
    get_last_checkpoint (what resuming loads) takes the highest N that is a folder, complete or
    not: a save cut short by a full disk or a kill would be the checkpoint a resume loads.
    """
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

    class AtomicCheckpoints(trainer_class):
        _staging = None

        def _get_output_dir(self, trial):
            return self._staging or super()._get_output_dir(trial)

        def _save_checkpoint(self, model, trial):
            CHECKPOINT_SAVING.set()  # a large save is no stall (StallWatchdog)
            if self.is_world_process_zero():  # nor for the supervisor (on_save writes the step again after it)
                with contextlib.suppress(OSError):
                    write_progress(Path.cwd(), self.state.global_step, saving=True)
            try:
                self._save_atomically(model, trial)
            finally:
                CHECKPOINT_SAVING.clear()

        def _save_atomically(self, model, trial):
            root = super()._get_output_dir(trial)
            staging = os.path.join(root, INCOMPLETE_DIR)
            name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            self._staging = staging  # the parent saves, and rotates (a no-op), there
            try:
                super()._save_checkpoint(model, trial)
                if self.args.should_save:
                    write_position(self, os.path.join(staging, name))  # what a resume checks it got back
            except Exception as exc:
                full = _disk_full(root, exc)
                if self.args.should_save:
                    shutil.rmtree(staging, ignore_errors=True)  # give back the space a failed save took
                if not full:
                    raise
                # torch reports it as "[enforce fail at inline_container.cc] unexpected pos ...": say what happened.
                raise JobError(
                    f"output_dir: the disk holding {os.path.abspath(root)} is full: {name} did not fit "
                    f"({type(exc).__name__}: {exc}); free space or set output_dir to a disk with room, then resume "
                    "with training.resume_from_checkpoint (the checkpoints saved before are complete)"
                ) from exc
            finally:
                self._staging = None
            self.accelerator.wait_for_everyone()  # every rank's shards are written
            if not self.args.should_save:
                return
            final = os.path.join(root, name)
            if os.path.isdir(final):
                shutil.rmtree(final)  # an earlier run's checkpoint of the same step, in a reused output_dir
            os.replace(os.path.join(staging, name), final)
            shutil.rmtree(staging, ignore_errors=True)  # leftovers of saves cut short earlier
            best = self.state.best_model_checkpoint
            if best and best.startswith(staging):
                self.state.best_model_checkpoint = os.path.join(root, os.path.basename(best))
                self.state.save_to_json(os.path.join(final, TRAINER_STATE_NAME))
            rotate_checkpoints(root, self.args.save_total_limit, self.state.best_model_checkpoint, use_mtime=True)

    return AtomicCheckpoints


def _disk_full(folder: str, exc: BaseException) -> bool:
    if getattr(exc, "errno", None) in DISK_FULL:
        return True
    try:
        return shutil.disk_usage(folder).free < 2**20
    except OSError:  # the folder is gone (deleted under the run): not a full disk
        return False


def requeued() -> bool:
    """Whether this is a Slurm job started again after a requeue (its restart count is above 0)."""
    return os.environ.get("SLURM_RESTART_COUNT", "0").strip() not in ("", "0")


def resume_checkpoint(args, job: dict) -> str | None:
    """The newest checkpoint in output_dir when resuming was asked for, else None (a fresh start)."""
    wanted = args.resume_from_checkpoint or (job.get("training") or {}).get("resume_from_checkpoint")
    if not wanted and (requeued() or os.environ.get(ATTEMPT_ENV)):
        wanted = True  # started again (Slurm requeued it, or the supervisor after a failure): go on from there
    if not wanted:
        return None
    if isinstance(wanted, str) and wanted.lower() not in ("true", "last"):
        return wanted
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    if found is None:  # a first run (or a requeued job that never saved): say so, the step count starts at 0
        print(
            f"resume_from_checkpoint: no checkpoint in {os.path.abspath(args.output_dir)}; starting from step 0",
            flush=True,
        )
    return found
