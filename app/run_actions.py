"""The Run tab's buttons on the run in view: Stop, Resume, and Stacks (every rank's Python stack, now)."""

from __future__ import annotations

from tunedeck.app.run_index import RunsIndex
from tunedeck.app.run_shown import RunShown
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.runs import RunError, RunManager, StacksError, dump_stacks, resume_run


def stop_run(manager: RunManager, index: RunsIndex, shown: RunShown) -> str:
    """Ask the run in view to stop; the notice is only for what went wrong (the state line says the rest)."""
    if not shown.run:
        return "No run selected."
    manager.stop(shown.run, grace_s=30)
    index.runs(fresh=True)
    return ""


def resume_shown(manager: RunManager, index: RunsIndex, shown: RunShown) -> tuple[str, RunShown]:
    """Continue the run in view from its newest checkpoint, as a new run; the view then follows it."""
    if not shown.run:
        raise RunError("no run selected")
    new_id, step = resume_run(manager, shown.run)
    index.runs(fresh=True)
    return f"Resumed run `{shown.run}` as run `{new_id}`, from its checkpoint at step {step}.", RunShown(
        run=new_id, follow=False
    )


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
