"""Marks on the loss chart: where the training-health guard (training.health) warned, stopped or rolled the run back,
as dashed lines with their label above the plot."""

from __future__ import annotations

from collections.abc import Sequence

from tunedeck.app.untrusted_text import as_html
from tunedeck.backend.runs import HealthRecord

MARK_COLOR = "#b45309"  # amber: a warning, not a failure


def health_marks(health: Sequence[HealthRecord]) -> list[tuple[int, str]]:
    """(step, label) of each finding of the guard: where it rolled back, stopped or warned."""
    marks = []
    for record in health:
        if "step" not in record:
            continue
        if record.get("action") == "rolled back":
            marks.append((record["step"], f"↺ roll-back to step {record.get('checkpoint_step')}"))
        else:
            marks.append((record["step"], f"⚠ {record.get('text', 'unhealthy')}"))
    return marks


def with_marks(layout: dict, marks: Sequence[tuple[int, str]]) -> dict:
    """A chart layout (a plain dict, validated once) with a dashed line and a label at each mark's step."""
    if marks:
        line = dict(color=MARK_COLOR, dash="dash")
        layout["shapes"] = [
            dict(type="line", xref="x", yref="paper", x0=step, x1=step, y0=0, y1=1, line=line) for step, _ in marks
        ]
        layout["annotations"] = [
            dict(x=step, y=1, xref="x", yref="paper", text=as_html(text), showarrow=False, yanchor="bottom")
            | dict(font=dict(color=MARK_COLOR))
            for step, text in marks
        ]
    return layout
