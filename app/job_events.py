"""What a job event carries and what one browser's job outputs show: the types of app/job_view.py.

The rules they serve (one queue, the fill count, Start compares) are in job_view.py's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tunedeck.app.form_marks import FieldLook
from tunedeck.app.job_outputs import JobResult
from tunedeck.app.registry import Got, Updates
from tunedeck.backend.spec import Values

# Rule 1 of app/job_view.py: one first-in-first-out lane for every event that touches the job outputs.
JOB_QUEUE = {"concurrency_id": "job-view", "concurrency_limit": 1}


@dataclass
class JobShown:
    """What one browser's job outputs show (its gr.State): a handler sends only what differs."""

    painted: bool = False  # a job event has painted the outputs (a late page load then paints nothing)
    fills: int = 0  # fills sent to this browser (rule 2)
    looks: dict[str, tuple[bool, FieldLook]] = field(default_factory=dict)  # field path -> (visible, its problem look)
    values: Values = field(default_factory=dict)  # the form's values the outputs were computed from
    tabs: dict[str, str] = field(default_factory=dict)  # section title -> tab label ("Training ✗2")
    tabs_shown: dict[str, bool] = field(default_factory=dict)  # section title -> whether its tab shows
    fixes: list[tuple[str, dict]] = field(default_factory=list)  # (Fix button label, {path: value}) on display
    files: dict[str, str] = field(default_factory=dict)  # the bundle beside the form
    choice: str | None = None  # the file in the viewer
    code: tuple[str, str] | None = None  # (name, digest) of the viewer's text
    digest: str | None = None  # the bundle's digest in the hidden box Start sends (rule 3)
    issues: str | None = None
    batch: str | None = None
    startable: bool | None = None
    zip: str | None = None  # the zip offered for download; None: the button is disabled


class DerivedView:
    """Something else the page derives from the job (the memory estimate), in the same handler.

    `inputs` are its own controls (read with every job event, written back by a fill),
    `shown` its gr.State (what the browser shows, read and written with every job event),
    `outputs` what it shows; `context` turns its controls into arguments of
    job_outputs.evaluate, and `update` returns what changed for a result.
    """

    inputs: list
    shown: Any
    outputs: list

    def context(self, got: Got) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def update(self, result: JobResult, got: Got) -> Updates:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass
class JobEvent:
    """A job event's inputs: the form's widget values, what the browser shows, and all it sent."""

    raw: list  # the form's widget values, in FORM_FIELDS order
    shown: JobShown
    fills_seen: int  # the fills the browser had applied when the event fired
    got: Got  # everything the listener received (the derived views read their controls here)

    @property
    def stale(self) -> bool:
        """Fired before a fill that has been sent since: its form values are no longer on the page."""
        return int(self.fills_seen or 0) != self.shown.fills
