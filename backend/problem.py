"""A problem of a job: its level, the field it names and a message that says the fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Problem:
    level: Literal["error", "warning"]
    field: str  # dotted path, e.g. "strategy.offload_params"
    message: str  # says the fix
    fix: dict[str, Any] | None = None  # {dotted path: value} that resolves it, when there is one


def error(field: str, message: str) -> Problem:
    return Problem("error", field, message)


def warning(field: str, message: str) -> Problem:
    return Problem("warning", field, message)


def has_errors(problems: list[Problem]) -> bool:
    return any(p.level == "error" for p in problems)
