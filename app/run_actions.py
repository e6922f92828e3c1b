"""What the page's buttons do to runs: Start, Queue, Sweep and Smoke test launch one (the Run tab then follows it),
and on the run in view Stop, Resume, and Stacks (every rank's Python stack, now)."""

from __future__ import annotations

from tunedeck.app.run_index import RunsIndex
from tunedeck.app.run_shown import RunShown
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.runs import (
    RunError,
    RunManager,
    Shape,
    StacksError,
    combinations,
    dump_stacks,
    label,
    queue_sweep,
    resume_run,
    start_smoke_run,
    sweep_specs,
)


def start_run(manager: RunManager, index: RunsIndex, spec, queue: bool = False) -> tuple[str, RunShown]:
    """Launch `spec` (RunError says why not), with `queue` once the live runs holding its GPUs have ended;
    the Run tab then follows the new run."""
    run_id = manager.start(spec, queue=queue)
    index.runs(fresh=True)
    return run_id, RunShown(run=run_id, follow=False)


def start_sweep(manager: RunManager, index: RunsIndex, spec, vary: str) -> tuple[list[str], RunShown]:
    """One run of `spec` per combination of the Vary box's values, queued one after another; follows the first."""
    grid = combinations([line for line in vary.splitlines() if line.strip()])
    queued = queue_sweep(manager, sweep_specs(spec, grid), [label(values) for values in grid])
    index.runs(fresh=True)
    return queued, RunShown(run=queued[0], follow=False)


def start_smoke(manager: RunManager, index: RunsIndex, spec) -> tuple[str, RunShown]:
    """Launch the smoke run of `spec` (SmokeError or RunError say why not); the Run tab then follows it."""
    run_id = start_smoke_run(manager, spec)
    index.runs(fresh=True)
    return run_id, RunShown(run=run_id, follow=False)


def stop_run(manager: RunManager, index: RunsIndex, shown: RunShown) -> str:
    """Ask the run in view to stop; the notice is only for what went wrong (the state line says the rest)."""
    if not shown.run:
        return "No run selected."
    manager.stop(shown.run, grace_s=30)
    index.runs(fresh=True)
    return ""


def resume_shown(
    manager: RunManager, index: RunsIndex, shown: RunShown, processes: float | None = None
) -> tuple[str, RunShown]:
    """Continue the run in view from its newest checkpoint, as a new run (on `processes` processes when given: the
    same global batch, backend/runs/reshape.py); the view then follows it."""
    if not shown.run:
        raise RunError("no run selected")
    if processes is not None and processes < 0:
        raise RunError(
            f"Resume on processes: {processes:g} is no number of processes: give 1 or more, or leave it empty"
        )
    shape = Shape(int(processes)) if processes else Shape()  # empty (or 0): on the processes it ran on
    new_id, step, said = resume_run(manager, shown.run, shape)
    index.runs(fresh=True)
    notice = f"Resumed run `{shown.run}` as run `{new_id}`, from its checkpoint at step {step}"
    return notice + (f", {said}." if said else "."), RunShown(run=new_id, follow=False)


def stacks_notice(manager: RunManager, shown: RunShown) -> str:
    """Ask every rank of the run in view for its stacks (backend/runs/stacks.py); the notice says who answered."""
    if not shown.run:
        return "No run selected."
    try:
        stacks = dump_stacks(manager.status(shown.run), manager.run_dir(shown.run), wait_s=3.0)
    except (RunError, StacksError) as exc:
        return f"✗ **No stacks:** {as_text(exc)}"
    answered = [rank for rank, text in sorted(stacks.items()) if text]
    silent = [rank for rank, text in sorted(stacks.items()) if not text]
    logs = "its log" if len(answered) == 1 else "their logs"
    notice = (
        f"**Stacks written** by rank {', '.join(map(str, answered))} to {logs} (rank 0's is at the end of the log "
        "below; the others in logs/rank&lt;N&gt;.log)."
        if answered
        else "**No rank answered.**"
    )
    if silent:
        notice += f" Rank {', '.join(map(str, silent))}: no answer (stopped, or stuck where no signal reaches it)."
    return notice
