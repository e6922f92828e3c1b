"""A problem of a job: its level, the field it names, a message that says the fix, and, where one
single change is the fix, that change as values (`fix`), which the page offers as a Fix button.

Any producer of problems (validation rules, the memory fit, preflight) may fill `fix`; the page
applies it as an edit of those fields (app/job_view.py), the CLI can print it.

An error is wrong wherever the job runs: Start and the bundle download are refused. A warning
with `refused_here` is about this machine (no GPU here, sbatch not installed): the bundle runs
on a machine that has what is missing, and only Start here refuses (backend/runs/preflight.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Problem:
    level: Literal["error", "warning"]
    field: str  # dotted path, e.g. "strategy.offload_params"
    message: str  # says the fix
    # {dotted path: spec value} that fixes it, when one change does; None when the person must choose.
    fix: dict[str, Any] | None = dataclasses.field(default=None, hash=False)  # `field` is the attribute above
    refused_here: bool = False  # Start on this machine refuses it (a warning: the bundle runs elsewhere)

    def fix_text(self) -> str:
        """The fix as --set spells it: `training.gradient_checkpointing=false, ...`."""
        return ", ".join(f"{path}={spelled(value)}" for path, value in (self.fix or {}).items())


def spelled(value: Any) -> str:
    """A value as --set and YAML spell it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return ",".join(value) if isinstance(value, list) else str(value)


def error(field: str, message: str, fix: dict[str, Any] | None = None) -> Problem:
    return Problem("error", field, message, fix)


def warning(field: str, message: str, fix: dict[str, Any] | None = None) -> Problem:
    return Problem("warning", field, message, fix)


def refused_here(field: str, message: str) -> Problem:
    """A warning that Start on this machine refuses: what this machine lacks, not what the job gets wrong."""
    return Problem("warning", field, message, refused_here=True)


def refuses_start(problems: list[Problem]) -> list[Problem]:
    """The problems Start refuses on: the errors, and the warnings about this machine."""
    return [p for p in problems if p.level == "error" or p.refused_here]


def has_errors(problems: list[Problem]) -> bool:
    return any(p.level == "error" for p in problems)
