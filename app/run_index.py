"""The runs the Run tab lists: one shared, briefly cached listing, and what each run's row says.

A row's facts beyond status.json (a smoke run? its last loss, its name) are read from the run
folder once per state and notes.json version: an ended run's never change, so a table of
hundreds of past runs costs a stat per run, not a read.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tunedeck.app.untrusted_text import as_text, code_span
from tunedeck.backend.runs import ACTIVE_STATES as ACTIVE
from tunedeck.backend.runs import (
    DAMAGED,
    NOTES_FILE,
    RESUMABLE_STATES,
    RunManager,
    RunNotes,
    RunStatus,
    UnreadableJob,
    differences_line,
    format_clock,
    is_smoke_job,
    job_differences,
    job_fields,
    newest_checkpoint,
    output_dir,
    read_job,
    read_notes,
    read_records,
    summarize,
)
from tunedeck.backend.spec import JobSpec

RUNS_LIST_TTL_S = 2.0
TABLE_HEADERS = ["run", "name", "state", "job", "loss", "started", "duration"]
SMOKE_MARK = "smoke test · "
UNREADABLE_MARK = " · job.yaml not readable"
STATE_MARKS = {
    "queued": "⋯",  # in the fonts a bare Linux machine has (an hourglass emoji is not)
    "running": "▶",
    "stopping": "■",
    "finished": "✓",
    "failed": "✗",
    "stopped": "■",
    DAMAGED: "⚠",
}


@dataclass(frozen=True)
class RunFacts:
    """What the views say about a run beyond its status."""

    smoke: bool  # a smoke run (its model is one of the tiny ones)
    loss: float | None  # the last training loss of an ended run (a live run's moves: its progress line has it)
    checkpoint: int | None  # the step of the newest checkpoint a stopped or failed run can resume from
    notes: RunNotes
    job: JobSpec | UnreadableJob | None = None  # the run's job, or why its job.yaml does not read as one
    measure: str = ""  # the loss column's text: the last loss, or a GRPO run's last reward ('reward 0.846')


class RunsIndex:
    """list_runs(), shared by all sessions and refreshed at most every RUNS_LIST_TTL_S seconds."""

    def __init__(self, manager: RunManager):
        self.manager = manager
        self._runs: list[RunStatus] = []
        self._at = -1e9
        self._lock = threading.Lock()
        self._facts: dict[str, tuple[tuple, RunFacts]] = {}  # run id -> (what they were read at, facts)

    def runs(self, fresh: bool = False) -> list[RunStatus]:
        with self._lock:
            if fresh or time.monotonic() - self._at > RUNS_LIST_TTL_S:
                self._runs = self.manager.list_runs()
                self._at = time.monotonic()
            return self._runs

    def facts(self, run: RunStatus) -> RunFacts:
        """The run's facts, read again only when its state or its notes changed."""
        run_dir = self.manager.run_dir(run.run_id)
        try:
            notes_stamp = (run_dir / NOTES_FILE).stat().st_mtime_ns
        except OSError:
            notes_stamp = None
        key = (run.state, notes_stamp)
        with self._lock:
            known = self._facts.get(run.run_id)
        if known and known[0] == key:
            return known[1]
        job = read_job(run_dir)
        loss = checkpoint = None
        measure = ""
        if run.state not in ACTIVE:
            summary = summarize(read_records(run_dir), run.started_at, run.ended_at)
            loss, measure = summary.last_loss, summary.measure
        if run.state in RESUMABLE_STATES and isinstance(job, JobSpec):
            found = newest_checkpoint(output_dir(run_dir, job))
            checkpoint = found[0] if found else None
        facts = RunFacts(
            smoke=is_smoke_job(job),
            loss=loss,
            checkpoint=checkpoint,
            notes=read_notes(run_dir),
            job=job,
            measure=measure,
        )
        with self._lock:
            self._facts[run.run_id] = (key, facts)
        return facts


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""


def _duration(run: RunStatus) -> str:
    # Ended runs only: the table is redrawn when a run changes state, not every tick, so a live
    # run's clock would freeze here at its first value (its progress line shows the elapsed time).
    if not run.started_at or not run.ended_at:
        return ""
    return format_clock(run.ended_at - run.started_at)


def run_choices(index: RunsIndex, runs: list[RunStatus]) -> list[tuple[str, str]]:
    """The run picker's entries: state, id, and the run's name when it has one, else its job."""
    choices = []
    for run in runs:
        name = index.facts(run).notes.name or run.title
        choices.append((f"{STATE_MARKS.get(run.state, '')} {run.run_id} · {name}", run.run_id))
    return choices


def table_row(run: RunStatus, facts: RunFacts) -> list:
    loss = facts.measure or (f"{facts.loss:.4f}" if facts.loss is not None else "")
    title = SMOKE_MARK * facts.smoke + run.title
    if isinstance(facts.job, UnreadableJob):  # the run view says why (unreadable_line)
        title += UNREADABLE_MARK
    return [run.run_id, facts.notes.name, run.state, title, loss, _when(run.started_at), _duration(run)]


def unreadable_line(facts: RunFacts) -> str:
    """Why the run's job.yaml does not read as a job of this version, as text; "" when it reads."""
    return f"⚠ {facts.job.explained()}" if isinstance(facts.job, UnreadableJob) else ""


def compared_line(manager: RunManager, run_id: str, other: str | None) -> str:
    """What the overlaid run set differently from the run in view (nothing without an overlay)."""
    if not other:
        return ""
    differences = differences_line(
        job_differences(job_fields(manager.run_dir(run_id)), job_fields(manager.run_dir(other)))
    )
    return f"**Overlaid run {code_span(other)}** (this run's value → its own): {as_text(differences)}"
