"""Resume: a stopped or failed run goes on from the newest checkpoint in its own output folder, as a new run.

    resume_run(manager, run_id[, Shape(num_processes, num_machines)]) -> (new run id, checkpoint step, shape said)

A new run, not the same folder again: a run folder has one life (status.json goes from
queued to one end; metrics.jsonl holds one start and one end record; the logs are that
launch's), and every reader (the CLI, the panel, the supervisor, a Slurm follower) relies on
it. The new run is the old run's job.yaml with `training.resume_from_checkpoint: true` and
`output_dir` set to the old run's output folder as an absolute path, which is what
`tunedeck train --set ...` does by hand: train.py loads the newest checkpoint there
(weights, optimizer, scheduler, step), the new run's records begin at the step after it, its
checkpoints and final model go on in that same folder, and the old run stays as it was. Its
name and notes (notes.json) say which run it continues.
"""

from __future__ import annotations

from pathlib import Path

from tunedeck.backend.runs.checkpoints import CHECKPOINT_PATTERN, output_dir
from tunedeck.backend.runs.folder import ACTIVE_STATES
from tunedeck.backend.runs.job_file import UnreadableJob, read_job
from tunedeck.backend.runs.manager import RunError, RunManager
from tunedeck.backend.runs.notes import NAME_MAX_CHARS, read_notes, write_notes
from tunedeck.backend.runs.reshape import AS_IT_WAS, Shape, reshaped
from tunedeck.backend.spec import JobSpec

RESUMABLE_STATES = ("stopped", "failed")


def newest_checkpoint(output: Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest checkpoint-N in an output folder (each is complete: written, then renamed)."""
    try:
        found = [(int(m.group(1)), p) for p in output.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))]
    except OSError:
        return None
    found = [(step, folder) for step, folder in found if folder.is_dir()]
    return max(found, default=None)


def resume_spec(manager: RunManager, run_id: str, shape: Shape = AS_IT_WAS):
    """(the job that continues run `run_id`, the step of the checkpoint it starts from, what the new shape changed:
    backend/runs/reshape.py); RunError says why not."""
    from tunedeck.backend.spec import SpecError, set_paths

    status = manager.status(run_id)
    if status.state not in RESUMABLE_STATES:
        raise RunError(f"run {run_id} is {status.state}: only a stopped or failed run can be resumed")
    run_dir = manager.run_dir(run_id)
    job = read_job(run_dir)
    if isinstance(job, UnreadableJob):
        raise RunError(f"run {run_id} cannot be continued: {job.explained()}")
    output = output_dir(run_dir, job)
    found = newest_checkpoint(output)
    if found is None:
        raise RunError(
            f"run {run_id} saved no checkpoint in {output}: there is nothing to continue from; start the job "
            "again (training.save_steps sets how often a run saves)"
        )
    for other in manager.list_runs():
        if (
            other.state in ACTIVE_STATES
            and isinstance(other_job := manager.job(other.run_id), JobSpec)
            and output_dir(manager.run_dir(other.run_id), other_job) == output
        ):
            raise RunError(f"run {other.run_id} is already writing to {output}: stop it, or wait until it ends")
    try:
        spec = set_paths(job, {"training.resume_from_checkpoint": True, "output_dir": str(output)})
    except SpecError as exc:  # a value set_paths refuses in this job
        raise RunError(f"run {run_id}'s job.yaml is not a valid job for this tunedeck: {exc}") from None
    spec, said = reshaped(spec, shape.num_processes, shape.num_machines)
    return spec, found[0], said


def resume_run(manager: RunManager, run_id: str, shape: Shape = AS_IT_WAS) -> tuple[str, int, str]:
    """Start the run that continues `run_id` from its newest checkpoint (on another number of processes with
    `shape`); returns (new run id, checkpoint step, what the new shape changed)."""
    spec, step, said = resume_spec(manager, run_id, shape)
    new_id = manager.start(spec)
    old = read_notes(manager.run_dir(run_id))
    name = old.name.removesuffix(" (resumed)") + " (resumed)" if old.name else f"resumes {run_id}"  # once, in a chain
    try:
        write_notes(manager.run_dir(new_id), name[:NAME_MAX_CHARS], f"Continues run {run_id} from checkpoint-{step}.")
    except ValueError:
        pass  # the lineage note is a courtesy: the run itself started
    return new_id, step, said
