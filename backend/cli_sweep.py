"""`tunedeck sweep SPEC --vary PATH=V1,V2 ...`: one run per combination of values, queued one after another.

Every combination is resolved, validated and checked (model, data, room) before the first run is queued:
a bad value queues nothing. Each run is named after its values, so `tunedeck runs`, the panel's run list
and its loss overlay tell them apart; the runs queue as `tunedeck train --queue` does (each after the
ones before it), so closing the terminal leaves the sweep going. Ctrl-C stops the running one and takes
the rest out of the queue.
"""

from __future__ import annotations

import argparse
import itertools
import sys

from tunedeck.backend.cli import add_spec_arguments, print_problems
from tunedeck.backend.cli_runs import EXIT_CODES, _add_runs_dir, _manager

MAX_RUNS = 64  # more is a typo more often than a plan


class SweepError(ValueError):
    """A --vary that cannot be swept; the message names it and the fix."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="train one run per combination of --vary values, queued one after another, then a table of how each ended",
    )
    add_spec_arguments(p)
    p.add_argument(
        "--vary",
        action="append",
        required=True,
        metavar="PATH=V1,V2",
        help="the values of one field to try, e.g. --vary training.learning_rate=1e-4,2e-4 "
        "(repeatable: every combination of them)",
    )
    _add_runs_dir(p)
    p.set_defaults(handler=cmd_sweep)


def combinations(vary: list[str]) -> list[dict[str, str]]:
    """Every combination of the --vary values, the first --vary changing slowest: [{path: value}, ...]."""
    axes: dict[str, list[str]] = {}
    for item in vary:
        path, sep, values = item.partition("=")
        path = path.strip()
        choices = list(dict.fromkeys(v.strip() for v in values.split(",") if v.strip()))
        if not sep or not path or not choices:
            raise SweepError(f"--vary {item!r}: write PATH=V1,V2,..., e.g. --vary training.learning_rate=1e-4,2e-4")
        if path in axes:
            raise SweepError(f"--vary {path}: given twice; list all its values in one --vary")
        axes[path] = choices
    count = 1
    for choices in axes.values():
        count *= len(choices)
    if count > MAX_RUNS:
        raise SweepError(f"--vary: {count} combinations, at most {MAX_RUNS} runs in one sweep: try fewer values")
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def label(values: dict[str, str]) -> str:
    """A run's name in the sweep: 'learning_rate=1e-4 · r=8' (each field by its last part)."""
    return " · ".join(f"{path.rsplit('.', 1)[-1]}={value}" for path, value in values.items())


def cmd_sweep(args: argparse.Namespace) -> int:
    from tunedeck.backend.runs import RunError

    manager = _manager(args, create=True)
    try:
        grid = combinations(args.vary)
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    specs = _checked_specs(args, grid, manager.runs_dir)
    if specs is None:
        print("nothing queued: fix the errors above", file=sys.stderr)
        return 2
    queued: list[str] = []
    try:
        for values, spec in zip(grid, specs):
            queued.append(manager.start(spec, queue=True))
            _name(manager, queued[-1], label(values))
    except RunError as exc:
        for run_id in queued:  # a sweep starts whole or not at all
            manager.stop(run_id)
        print(
            f"error: {exc}\nnothing left queued: the {len(queued)} runs queued before it were taken out",
            file=sys.stderr,
        )
        return 2
    print(f"sweep of {len(queued)} runs, each queued after the ones before it:")
    for run_id, values in zip(queued, grid):
        print(f"  {run_id}  {label(values)}")
    return _follow_all(manager, queued, grid)


def _checked_specs(args, grid: list[dict[str, str]], runs_dir) -> list | None:
    """Each combination's job, resolved, validated and checked; None (problems printed) if any has an error."""
    from tunedeck.backend.preflight import preflight
    from tunedeck.backend.spec import SpecError, resolve_spec
    from tunedeck.backend.validate import validate

    try:  # SPEC and --set alone first: their own errors are said once, not once per run
        resolve_spec(args.spec, args.overrides)
    except SpecError as exc:
        print_problems(("error", path, message) for path, message in exc.problems)
        return None
    specs, failed, warned = [], False, set()
    for values in grid:
        where = f"[{label(values)}] "
        try:
            spec = resolve_spec(args.spec, [*args.overrides, *(f"{path}={value}" for path, value in values.items())])
        except SpecError as exc:
            print_problems(("error", path, where + message) for path, message in exc.problems)
            failed = True
            continue
        problems = validate(spec)
        if not any(p.level == "error" for p in problems):
            problems += preflight(spec, runs_dir)
        for p in problems:
            if p.level == "error":
                print_problems([(p.level, p.field, where + p.message)])
                failed = True
            elif (p.field, p.message) not in warned:  # a warning of every run is said once
                warned.add((p.field, p.message))
                print_problems([(p.level, p.field, p.message)])
        specs.append(spec)
    return None if failed else specs


def _name(manager, run_id: str, name: str) -> None:
    from tunedeck.backend.run_folder import NotesError, write_notes

    try:
        write_notes(manager.run_dir(run_id), name[:80], "")
    except NotesError as exc:  # a name is a convenience: the run goes on without it
        print(f"warning: run {run_id} is not named: {exc}", file=sys.stderr)


def _follow_all(manager, queued: list[str], grid: list[dict[str, str]]) -> int:
    from tunedeck.backend.cli_follow import follow

    ended = []
    for index, run_id in enumerate(queued):
        print(f"\nrun {index + 1}/{len(queued)} {run_id}: {label(grid[index])}", flush=True)
        status = follow(manager, run_id, also_stop=tuple(queued[index + 1 :]))
        if status is None:  # a second Ctrl-C: this one stops in the background, the rest were taken out
            return EXIT_CODES["stopped"]
        ended.append(status)
        print(f"{status.state}" + (f": {status.error.splitlines()[0]}" if status.error else ""), flush=True)
    _print_table(manager, queued, grid)
    states = {status.state for status in ended}
    return EXIT_CODES["failed"] if "failed" in states else EXIT_CODES["stopped"] if "stopped" in states else 0


def _print_table(manager, queued: list[str], grid: list[dict[str, str]]) -> None:
    from tunedeck.backend.run_folder import read_records
    from tunedeck.backend.run_summary import format_clock, report, summarize

    def number(value):
        return "-" if value is None else f"{value:.4f}"

    rows = [("RUN", *grid[0], "STATE", "STEPS", "LOSS", "BEST", "EVAL LOSS", "TIME")]
    for run_id, values in zip(queued, grid):
        status = manager.status(run_id)
        records = read_records(manager.run_dir(run_id))
        run = report(records, status.started_at, status.ended_at)
        rows.append(
            (
                run_id,
                *values.values(),
                status.state,
                summarize(records, status.started_at, status.ended_at).steps if records.records else "-",
                number(run.final_loss),
                number(run.best_loss),
                number(run.eval_loss),
                format_clock(run.wall_s) if run.wall_s else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print()
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
