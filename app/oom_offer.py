"""After a run ran out of memory: the advisor's next strategy, said in the Run tab beside its error, and what the
button there ("Load the job with ZeRO-3") loads into the Job tab: the run's own job with that strategy. Such a run
is never started again as it was (backend/recipe/failures.py); the strategy is backend/estimate/after_oom.py's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import gradio as gr

from tunedeck.app.run_shown import RunShown
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.estimate import NextStrategy, next_after_oom
from tunedeck.backend.runs import RunManager, RunStatus, UnreadableJob
from tunedeck.backend.spec import JobSpec

BUTTON = "Load the job with it"  # the button's label while it is hidden


def offer_for(status: RunStatus, job: JobSpec | UnreadableJob | None) -> NextStrategy | None:
    """The next strategy for a run that failed out of memory, else None."""
    if not status.failure or status.failure.get("kind") != "oom" or not isinstance(job, JobSpec):
        return None
    with contextlib.suppress(Exception):  # advice: never let it break the run view
        return next_after_oom(job)
    return None


def offer_text(offer: NextStrategy | None) -> tuple[str, str]:
    """(the line beside the error, the button's label); an empty line without an offer."""
    if offer is None:
        return "", BUTTON
    return (
        f"**Out of memory, so not started again.** Next: {as_text(offer.line)}.",
        f"Load the job with {offer.strategy}",
    )


def next_updates(status: RunStatus, job: JobSpec | UnreadableJob | None) -> tuple[str, dict]:
    """The Run tab's next-strategy line and its button's update."""
    offer = offer_for(status, job)
    line, label = offer_text(offer)
    return line, gr.update(value=label, visible=offer is not None)


def job_with_offer(runs_dir: Path | None, shown: RunShown) -> tuple[JobSpec | None, str, dict]:
    """(the job of the run in view with its next strategy, what to say, the changes) for the Job tab; None when
    there is none."""
    if runs_dir is None or not shown.run:
        return None, "No run selected.", {}
    manager = RunManager(runs_dir)
    status, job = manager.status(shown.run), manager.job(shown.run)
    offer = offer_for(status, job)
    if offer is None or not isinstance(job, JobSpec):
        return None, f"Nothing loaded: run `{shown.run}` did not run out of memory, or nothing needs less.", {}
    return job, offer.strategy, offer.changes
