"""`tunedeck sweep SPEC --vary PATH=V1,V2 ...`: one run per combination of values, queued one after another.

Every combination is resolved, validated and checked (model, data, room) before the first run is queued:
a bad value queues nothing (backend/runs/sweep.py queues them). Each run is named after its values, so
`tunedeck runs`, the panel's run list and its loss overlay tell them apart; closing the terminal leaves
the sweep going. Ctrl-C stops the running one and takes the rest out of the queue.
"""

from __future__ import annotations

import argparse
import sys

from tunedeck.backend.cli import add_spec_arguments, load_spec_or_exit, print_problems
from tunedeck.backend.cli.runs import EXIT_CODES, _add_runs_dir, _manager
from tunedeck.backend.runs import SweepError, combinations, label, queue_sweep, sweep_specs


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


def cmd_sweep(args: argparse.Namespace) -> int:
    from tunedeck.backend.runs import RunError

    manager = _manager(args, create=True)
    try:
        grid = combinations(args.vary)
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    specs = _checked_specs(load_spec_or_exit(args), grid, manager.runs_dir)  # SPEC and --set: their errors once
    if specs is None:
        print("nothing queued: fix the errors above", file=sys.stderr)
        return 2
    try:
        queued = queue_sweep(manager, specs, [label(values) for values in grid])
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"sweep of {len(queued)} runs, each queued after the ones before it:")
    for run_id, values in zip(queued, grid):
        print(f"  {run_id}  {label(values)}")
    return _follow_all(manager, queued, grid)


def _checked_specs(base, grid: list[dict[str, str]], runs_dir) -> list | None:
    """Each combination's job, validated and checked; None (problems printed) if any has an error."""
    from tunedeck.backend.runs import job_problems
    from tunedeck.backend.spec import SpecError

    specs, failed, warned = [], False, set()
    for values in grid:
        try:
            [spec] = sweep_specs(base, [values])
        except SpecError as exc:
            print_problems((p.level, p.field, p.message) for p in exc.problems)
            failed = True
            continue
        for p in job_problems(spec, runs_dir):
            if p.level == "error":
                print_problems([(p.level, p.field, f"[{label(values)}] {p.message}")])
                failed = True
            elif (p.field, p.message) not in warned:  # a warning of every run is said once
                warned.add((p.field, p.message))
                print_problems([(p.level, p.field, p.message)])
        specs.append(spec)
    return None if failed else specs


def _follow_all(manager, queued: list[str], grid: list[dict[str, str]]) -> int:
    from tunedeck.backend.cli.follow import follow

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
    from tunedeck.backend.runs import format_clock, read_records, report, summarize

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
