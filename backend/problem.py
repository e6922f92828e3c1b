"""A problem of a job: its level, the field it names, a message that says the fix, and, where one
single change is the fix, that change as values (`fix`), which the page offers as a Fix button.

Any producer of problems (validation rules, the memory fit, preflight) may fill `fix`; the page
applies it as an edit of those fields (app/job_view.py), the CLI can print it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Problem:
    level: Literal["error", "warning"]
    field: str  # dotted path, e.g. "strategy.offload_params"
    message: str  # says the fix
    # {dotted path: spec value} that fixes it, when one change does; None when the person must choose.
    fix: dict[str, Any] | None = field(default=None, hash=False)

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


def has_errors(problems: list[Problem]) -> bool:
    return any(p.level == "error" for p in problems)
