"""`tunedeck train SPEC`: check the job, start it here (or its smoke run), follow it with a progress bar
(Ctrl-C stops it gracefully) and exit with how the training ended."""

from __future__ import annotations

import argparse
import sys
import time

from tunedeck.backend.cli import add_spec_arguments, load_spec_or_exit, print_problems
from tunedeck.backend.cli.follow import follow
from tunedeck.backend.cli.runs import EXIT_CODES, _add_runs_dir, _manager
from tunedeck.backend.runs import LOGS_DIR, format_clock


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="run a job headless here, with a progress bar (Ctrl-C stops it gracefully)")
    add_spec_arguments(p)
    _add_runs_dir(p)
    p.add_argument(
        "--smoke",
        action="store_true",
        help="prove the job's exact path in about a minute: a tiny random-weight model of its architecture, a few "
        "rows and steps, 2 CPU processes (or this machine's GPUs); ends with a verdict line",
    )
    p.add_argument(
        "--queue",
        action="store_true",
        help="start it after the live runs that hold its GPUs (a CPU run: the other CPU runs) have ended, instead "
        "of refusing; it waits queued, and Ctrl-C takes it out of the queue (a Slurm run queues in Slurm)",
    )
    p.set_defaults(handler=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from tunedeck.backend.runs import RunError, job_problems
    from tunedeck.backend.validate import validate

    spec = load_spec_or_exit(args)
    manager = _manager(args, create=True)
    # The model, data and checkpoint room as the run sees them; a smoke run's own job is checked at its start.
    problems = validate(spec) if args.smoke else job_problems(spec, manager.runs_dir)
    print_problems((p.level, p.field, p.message) for p in problems)
    if any(p.level == "error" for p in problems):
        print("nothing started: fix the errors above", file=sys.stderr)
        return 2
    _say_if_building_demo(spec)
    try:
        run_id = _start_smoke(manager, spec) if args.smoke else manager.start(spec, queue=args.queue)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"run {run_id}: {manager.status(run_id).title}")
    print(f"folder {manager.run_dir(run_id)}", flush=True)
    _say_where_it_notifies()
    try:
        status = follow(manager, run_id)
    except RunError as exc:  # its folder was deleted while it ran, and now its processes are gone too
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CODES["failed"]
    if status is None:
        return EXIT_CODES["stopped"]  # left stopping in the background, as asked
    if status.state == "failed":
        print(f"failed: {status.error or 'see ' + str(manager.run_dir(run_id) / LOGS_DIR)}", file=sys.stderr)
    else:
        print(
            f"{status.state} in {format_clock((status.ended_at or time.time()) - (status.started_at or time.time()))}"
        )
    if args.smoke:
        from tunedeck.backend.runs import smoke_verdict

        verdict = smoke_verdict(manager.run_dir(run_id))
        print(verdict.line, file=sys.stdout if verdict.passed else sys.stderr)
        return 0 if verdict.passed else EXIT_CODES["failed"]
    return EXIT_CODES.get(status.state, 1)


def _start_smoke(manager, spec) -> str:
    """The job's smoke run; SmokeError becomes a RunError (printed, exit 2, nothing started)."""
    from tunedeck.backend.runs import RunError, SmokeError, start_smoke_run

    print("smoke run: the job's exact path on a tiny model of its architecture (the first one builds it)", flush=True)
    try:
        return start_smoke_run(manager, spec)
    except SmokeError as exc:
        raise RunError(str(exc)) from None


def _say_where_it_notifies() -> None:
    from tunedeck.backend.recipe import NOTIFY_ENV, notify_target

    try:
        target = notify_target()
    except ValueError as exc:
        print(f"warning: {exc}", file=sys.stderr, flush=True)
        return
    if target:
        print(f"when it ends, how it ended is posted to {target[1]} ({NOTIFY_ENV})", flush=True)


def _say_if_building_demo(spec) -> None:
    from tunedeck.backend.data import is_built
    from tunedeck.backend.spec import demo_home

    home = demo_home()
    if str(home) in (spec.model.name_or_path + spec.dataset.path) and not is_built(home):
        print(f"building the demo model and data in {home} (once, a few seconds)", flush=True)
