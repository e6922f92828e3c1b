"""The Run tab's state line and progress bar: what the run is doing and what its state means now."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tunedeck.app.run_index import STATE_MARKS, RunFacts
from tunedeck.app.run_watch import RunWatch
from tunedeck.app.untrusted_text import as_html, as_text
from tunedeck.backend.runs import ACTIVE_STATES as ACTIVE
from tunedeck.backend.runs import RunStatus, breakdown, read_phases, report, smoke_verdict


def progress_bar(fraction: float, text: str, state: str) -> dict:
    """The bar's parts: what app/live_progress.py sends the page between ticks, and progress_html draws."""
    color = {"failed": "#dc2626", "finished": "#16a34a"}.get(state, "#4f46e5")
    return {"width": f"{100 * fraction:.1f}%", "color": color, "text": text, "live": state in ACTIVE, "state": state}


def progress_html(fraction: float, text: str, state: str, run_id: str = "") -> str:
    """The bar; a live run's carries its id and state, for the page's progress stream (app/live_progress.py)."""
    bar = progress_bar(fraction, text, state)
    return (
        f"<div class='td-progress' data-run='{as_html(run_id)}' data-live='{int(bar['live'])}' data-state='{as_html(state)}'>"
        f"<div class='td-progress-track'><div class='td-progress-fill' "
        f"style='width:{bar['width']};background:{bar['color']}'></div></div>"
        f"<div class='td-progress-text'>{as_html(text)}</div></div>"
    )


def state_hint(status: RunStatus, facts: RunFacts, step: int) -> str:
    """What the run's state means for the reader now: drawn from the state, so it never outlives it."""
    if status.state == "queued" and status.waits_for:
        ahead = "that run has" if len(status.waits_for) == 1 else "those runs have"
        return (
            f"it starts by itself once {ahead} ended, with the panel open or not · **Stop** takes it out of the queue"
        )
    if status.state == "queued":
        return "waiting for its processes to start"
    if status.stalled and status.state == "running":
        return f"**{as_text(status.where)}**; the log below shows rank 0's · **Stop** ends it"
    if status.state == "stopping":
        return "stopping: each rank finishes its step and saves a checkpoint"
    if status.state in ("stopped", "failed") and facts.checkpoint is not None:
        where = f"stopped at step {step}" if status.state == "stopped" else "failed"
        return f"{where} · **↻ Resume** continues from its checkpoint at step {facts.checkpoint}"
    if status.state in ("stopped", "failed"):
        return "no checkpoint was saved: there is nothing to resume from"
    return ""


def smoke_line(run_dir, state: str) -> str:
    """A smoke run's verdict once it has ended, what it is doing until then."""
    if state in ACTIVE:
        return "**Smoke test**: the job's exact path on a tiny model of its architecture, for a few steps."
    verdict = smoke_verdict(run_dir)
    return f"**{'✓' if verdict.passed else '✗'} {as_text(verdict.line)}**"


def state_line(
    status: RunStatus, facts: RunFacts, step: int, run_id: str, run_dir: Path, health: Sequence[str] = ()
) -> str:
    """The line under the run picker: state, run id, name, title, where, then what the state means, then what the
    training-health guard saw and did (backend/runs/summary.py's health_lines) and the run's attempts."""
    name = f" · **{as_text(facts.notes.name)}**" if facts.notes.name else ""
    line = f"**{STATE_MARKS.get(status.state, '')} {status.state}** · run `{run_id}`{name} · {as_text(status.title)}"
    if status.state == "failed" and status.exit_code not in (None, 0):
        line += f" · exit code {status.exit_code}"
    if status.where and not status.stalled:  # a stall is said on a line of its own, below
        line += f" · {as_text(status.where)}"
    hint = state_hint(status, facts, step)
    if hint:
        line += f"\n\n{hint}"
    if facts.smoke:
        line += "\n\n" + smoke_line(run_dir, status.state)
    said = [f"**{as_text(text)}**" if not text.startswith("  ") else as_text(text.strip()) for text in health if text]
    if said:
        line += "\n\n" + "  \n".join(said)
    return line


# The bar's styles. No transition: a bar that moves every half second would animate (and lay out the page) all the
# time; the track's size never depends on its fill.
CSS = """
.td-progress-track {
  height: 14px; border-radius: 7px; background: var(--background-fill-secondary); overflow: hidden; contain: strict;
}
.td-progress-fill { height: 100%; }
.td-progress-text { font-size: 0.9em; margin-top: 4px; }
"""


def results_line(watch: RunWatch, status: RunStatus) -> str:
    """The summary's results (loss, speed, ...) and, after them, the startup phases that took a second or more."""
    if not watch.records:
        return ""
    results = as_text(report(watch, status.started_at, status.ended_at).line())
    startup = breakdown(read_phases(watch.run_dir), least_s=1.0)
    return results + (f" · **before step 1:** {as_text(startup)}" if results and startup else "")


def memory_line(peaks: dict) -> str:
    """The peak GPU memory each rank measured, when no estimate is there to set it beside."""
    if not peaks:
        return ""
    return "**Measured peak GPU memory per rank:** " + ", ".join(
        f"rank {i}: {gb:.2f} GB" for i, gb in enumerate(peaks.get("allocated", []))
    )
