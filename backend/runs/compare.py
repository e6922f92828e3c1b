"""What two runs did differently: the fields of their job.yaml that differ, where they apply to either run.

An overlaid loss curve answers "which is better"; this answers "what changed" (the learning rate,
the rank, the strategy, the data). A field that applies to neither run (the LoRA rank of two full
fine-tunes, another format's column) is left out, as the form hides it (backend/spec/applies.py). A job
written by an older tunedeck may lack newer fields: they show as "-".
"""

from __future__ import annotations

import json
from typing import Any

from tunedeck.backend.spec.applies import applies

MISSING = object()


def flat_job(job: dict, prefix: str = "") -> dict[str, Any]:
    """{dotted path: value} of a job.yaml's nested sections (lists stay whole values)."""
    flat: dict[str, Any] = {}
    for key, value in job.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_job(value, path + "."))
        else:
            flat[path] = value
    return flat


def job_differences(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    """(dotted field, a's value, b's value) of each field the two jobs set differently (MISSING where one lacks it)."""
    flat_a, flat_b = flat_job(a), flat_job(b)
    fields = [*flat_a, *(p for p in flat_b if p not in flat_a)]
    found = []
    for path in fields:
        left, right = flat_a.get(path, MISSING), flat_b.get(path, MISSING)
        if left != right and (applies(path, flat_a) or applies(path, flat_b)):
            found.append((path, left, right))
    return found


def shown_value(value: Any) -> str:
    if value is MISSING:
        return "-"
    if isinstance(value, str):
        return value
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def differences_line(differences: list[tuple[str, Any, Any]], most: int = 8) -> str:
    """One line for the page: "training.learning_rate 0.0002 → 0.0001 · lora.r 16 → 32 · and 2 more"."""
    if not differences:
        return "the same job"
    parts = [f"{path} {shown_value(a)} → {shown_value(b)}" for path, a, b in differences[:most]]
    more = len(differences) - most
    return " · ".join(parts) + (f" · and {more} more (`tunedeck runs diff`)" if more > 0 else "")
