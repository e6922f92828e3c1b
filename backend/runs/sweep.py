"""A sweep: one run per combination of values of some job fields, queued one after another (no CLI, no page).

Used by `tunedeck sweep` (backend/cli/sweep.py) and the panel's Sweep. The runs queue as `tunedeck train
--queue` does, each after the ones before it, and are named after their values; they are queued whole or
not at all: when one cannot start, those queued before it are taken out again.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

MAX_RUNS = 64  # more is a typo more often than a plan
_VALUES = re.compile(r"\[[^\]]*\]|[^,]+")  # comma-separated; a [list, of, values] is one value


class SweepError(ValueError):
    """A vary line that cannot be swept; the message names it and the fix."""


def combinations(vary: list[str]) -> list[dict[str, str]]:
    """Every combination of the values of each "PATH=V1,V2" (--vary, a line of the page's Vary box), the first
    changing slowest: [{path: value}, ...]."""
    if not vary:
        raise SweepError("vary: give a field and its values, e.g. training.learning_rate=1e-4,2e-4")
    axes: dict[str, list[str]] = {}
    for item in vary:
        path, sep, values = item.partition("=")
        path = path.strip()
        choices = list(dict.fromkeys(v.strip() for v in _VALUES.findall(values) if v.strip()))
        if not sep or not path or not choices:
            raise SweepError(f"vary {item!r}: write PATH=V1,V2,..., e.g. training.learning_rate=1e-4,2e-4")
        if path in axes:
            raise SweepError(f"vary {path}: given twice; list all its values at once")
        axes[path] = choices
    count = 1
    for choices in axes.values():
        count *= len(choices)
    if count > MAX_RUNS:
        raise SweepError(f"vary: {count} combinations, at most {MAX_RUNS} runs in one sweep: try fewer values")
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def label(values: dict[str, str]) -> str:
    """A run's name in the sweep: 'learning_rate=1e-4 · r=8' (each field by its last part)."""
    return " · ".join(f"{path.rsplit('.', 1)[-1]}={value}" for path, value in values.items())


def preview(grid: list[dict[str, str]], shown: int = 6) -> str:
    """'4 runs: learning_rate=1e-4 · r=8, learning_rate=1e-4 · r=16, ...' (the first `shown` of them)."""
    names = ", ".join(label(values) for values in grid[:shown])
    more = f", and {len(grid) - shown} more" if len(grid) > shown else ""
    return f"{len(grid)} run{'s' * (len(grid) != 1)}, queued one after another: {names}{more}"


def sweep_specs(spec, grid: list[dict[str, str]]) -> list:
    """The job of each combination: `spec` with its values set (SpecError names the field and the run)."""
    from tunedeck.backend.spec import SpecError, set_paths

    specs = []
    for values in grid:
        try:
            specs.append(set_paths(spec, values))
        except SpecError as exc:
            raise SpecError([replace(p, message=f"[{label(values)}] {p.message}") for p in exc.problems]) from None
    return specs


def queue_sweep(manager, specs: list, labels: list[str]) -> list[str]:
    """Queue each job after the ones before it, named by its label; RunError (and nothing left queued) when one
    cannot start."""
    from tunedeck.backend.runs.manager import RunError
    from tunedeck.backend.runs.notes import NotesError, write_notes

    queued: list[str] = []
    try:
        for spec, name in zip(specs, labels):
            queued.append(manager.start(spec, queue=True))
            try:
                write_notes(manager.run_dir(queued[-1]), name[:80], "")
            except NotesError:
                pass  # a name is a convenience: the run goes on without it
    except RunError as exc:
        for run_id in queued:
            manager.stop(run_id)
        raise RunError(f"[{labels[len(queued)]}] {exc} (the sweep was not queued)") from None
    return queued
