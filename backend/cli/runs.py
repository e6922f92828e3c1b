"""Run commands: `tunedeck runs [show|stop|resume|note|stacks|diff]`, and the runs folder every run command
takes (--runs-dir). `tunedeck train` is backend/cli/train.py."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tunedeck.backend.cli.follow import follow
from tunedeck.backend.runs import (
    ACTIVE_STATES,
    RunSummary,
    RunTelemetry,
    UnreadableJob,
    breakdown,
    format_clock,
    health_lines,
    job_fields,
    machine_line,
    missing_machines,
    phase_now,
    read_notes,
    read_phases,
    read_records,
    report,
    restart_cost,
    slow_rank_line,
    starting_phase,
    summarize,
    telemetry_warnings,
)
from tunedeck.backend.spec import shown

# Exit codes of `tunedeck train` (and of `runs resume`, which follows the run): the training's own status.
EXIT_CODES = {"finished": 0, "failed": 1, "stopped": 130}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "runs",
        help="list runs; `runs show ID`, `runs stop ID`, `runs resume ID`, `runs note ID`, `runs diff ID ID`, "
        "`runs stacks ID`, `runs fetch ID`",
    )
    _add_runs_dir(p)
    p.set_defaults(handler=cmd_runs_list)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    show = actions.add_parser("show", help="a run's state, facts, last metrics and error")
    show.add_argument("run_id", metavar="ID")
    _add_runs_dir(show)
    show.set_defaults(handler=cmd_runs_show)
    stop = actions.add_parser("stop", help="stop a run: ranks finish their step and save a checkpoint")
    stop.add_argument("run_id", metavar="ID")
    stop.add_argument("--grace", type=float, default=60.0, metavar="S", help="seconds before a hard kill (default 60)")
    stop.add_argument("--no-wait", action="store_true", help="return once the stop is requested")
    _add_runs_dir(stop)
    stop.set_defaults(handler=cmd_runs_stop)
    resume = actions.add_parser(
        "resume", help="continue a stopped or failed run from its newest checkpoint, as a new run (and follow it)"
    )
    resume.add_argument("run_id", metavar="ID")
    resume.add_argument(
        "--num-processes",
        type=int,
        metavar="N",
        help="continue on N processes (GPUs) instead: gradient accumulation is re-solved so the global batch stays",
    )
    resume.add_argument("--num-machines", type=int, metavar="M", help="continue on M machines instead")
    _add_runs_dir(resume)
    resume.set_defaults(handler=cmd_runs_resume)
    note = actions.add_parser("note", help="set a run's name and notes (shown by `runs`, `runs show` and the panel)")
    note.add_argument("run_id", metavar="ID")
    note.add_argument("--name", help="one line (up to 80 characters)")
    note.add_argument("--notes", help="free text")
    _add_runs_dir(note)
    note.set_defaults(handler=cmd_runs_note)
    stacks = actions.add_parser(
        "stacks", help="every rank's Python stack now (a live run here): where it is, what it waits for"
    )
    stacks.add_argument("run_id", metavar="ID")
    _add_runs_dir(stacks)
    stacks.set_defaults(handler=cmd_runs_stacks)
    fetch = actions.add_parser(
        "fetch", help="bring a run's final model (or --checkpoint N) from the cluster it ran on over SSH"
    )
    fetch.add_argument("run_id", metavar="ID")
    fetch.add_argument("--checkpoint", type=int, metavar="N", help="the checkpoint of step N instead")
    _add_runs_dir(fetch)
    fetch.set_defaults(handler=cmd_runs_fetch)
    diff = actions.add_parser("diff", help="what two runs' jobs set differently (the fields that apply to either)")
    diff.add_argument("run_id", metavar="ID")
    diff.add_argument("other", metavar="OTHER")
    _add_runs_dir(diff)
    diff.set_defaults(handler=cmd_runs_diff)


def _add_runs_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="folder of the run folders (default: ./runs)",
    )


def _manager(args, create: bool = False):
    """The run manager of --runs-dir, or exit 2 when that is a file or cannot be created."""
    from tunedeck.backend.runs import RunError, RunManager

    manager = RunManager(getattr(args, "runs_dir", Path("runs")))
    try:
        manager.check_folder(create=create)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return manager


def _summary(manager, status) -> RunSummary | None:
    """The summary of a run that has logged a step; None before its first log record."""
    run = read_records(manager.run_dir(status.run_id))
    return summarize(run, status.started_at, status.ended_at) if run.records else None


def _starting(manager, status) -> str:
    """The STEP column of a run before its first log record: what a live run is doing ("0 · loading the model")."""
    phase = starting_phase(read_phases(manager.run_dir(status.run_id))) if status.state in ACTIVE_STATES else None
    return f"0 · {phase}" if phase else "-"


def cmd_runs_list(args: argparse.Namespace) -> int:
    manager = _manager(args)
    runs = manager.list_runs()
    if not runs:
        print(f"no runs in {manager.runs_dir}")
        return 0
    rows = [("ID", "NAME", "STATE", "WHERE", "STEP", "LOSS", "STARTED", "TITLE")]

    def unreadable(run) -> bool:
        return isinstance(manager.job(run.run_id), UnreadableJob)

    for run in runs:
        summary = _summary(manager, run)
        rows.append(
            (
                run.run_id,
                shown(read_notes(manager.run_dir(run.run_id)).name, limit=30) or "-",
                f"{run.state} (stalled)" if run.stalled else run.state,
                run.place,
                summary.steps if summary else _starting(manager, run),
                (summary.measure if summary else "") or "-",  # a GRPO run's: its last reward
                time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started_at)) if run.started_at else "-",
                run.title + (" (job.yaml not readable: see runs show)" if unreadable(run) else ""),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    return 0


def cmd_runs_show(args: argparse.Namespace) -> int:
    from tunedeck.backend.runs import RunError

    manager = _manager(args)
    try:
        status = manager.status(args.run_id)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run = read_records(manager.run_dir(args.run_id))
    job = manager.job(args.run_id)
    summary = summarize(run, status.started_at, status.ended_at, job=job)
    notes = read_notes(manager.run_dir(args.run_id))
    print(f"run      {status.run_id}")
    if notes.name:
        print(f"name     {notes.name}")
    print(f"title    {status.title}")
    print(f"state    {status.state}" + (f" (exit code {status.exit_code})" if status.exit_code is not None else ""))
    print(f"folder   {manager.run_dir(args.run_id)}")
    if isinstance(job, UnreadableJob):
        print(f"job      {shown(job.explained(), limit=600)}")
    if status.where:
        kinds = (
            ("slurm", status.slurm),
            ("skypilot", status.skypilot),
            ("stalled", status.stalled),
            ("restart", status.restarting),
        )
        label = next((name for name, on in (*kinds, ("warning", status.warning)) if on), "queue")
        print(f"{label:<8} {status.where}")
    if status.started_at:
        end = status.ended_at or time.time()
        print(
            f"started  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(status.started_at))}, ran {format_clock(end - status.started_at)}"
        )
    if summary.facts:
        print(f"got      {summary.facts}")
    if summary.network:
        print(f"network  {summary.network}")
    startup = breakdown(read_phases(manager.run_dir(args.run_id)))
    if startup:
        print(f"startup  {startup} before step 1")
    if run.records:
        loss = f", loss {summary.last_loss:.4f}" if summary.last_loss is not None else ""
        print(f"progress {summary.step_text}{loss}")
        print(f"summary  {report(run, status.started_at, status.ended_at).line()}")
    elif status.state in ACTIVE_STATES and (doing := phase_now(manager.run_dir(args.run_id))):
        print(f"progress step 0 · {doing}")  # what it does before step 1, and the ranks rank 0 waits for
    for line in health_lines(run):
        print(f"health   {line}")
    telemetry = RunTelemetry(manager.run_dir(args.run_id))
    telemetry.read()
    for machine in telemetry.listed():
        print(f"machine  {machine_line(machine)}")
    if not isinstance(job, UnreadableJob) and (
        missing := missing_machines(telemetry.listed(), job.launch.num_machines)
    ):
        print(f"machine  {missing}")
    for line in [*telemetry_warnings(telemetry.listed()), slow_rank_line(run.records) or ""]:
        if line:
            print(f"warning  {line}")
    for line in status.attempt_lines():
        print(f"attempt  {line.removeprefix('attempt ')}" if line.startswith("attempt ") else f"failure  {line}")
    if cost := restart_cost(run, status.attempts):
        print(f"restarts {cost}")
    _print_next_strategy(manager.run_dir(args.run_id), status, job)
    if notes.notes:
        print("notes:\n" + notes.notes)
    if status.error:
        print(("note:\n" if status.state in ACTIVE_STATES else "error:\n") + status.error)
    _print_smoke_verdict(manager, status)
    _print_speed(manager.run_dir(args.run_id), run)
    return 0


def _print_next_strategy(run_dir: Path, status, job) -> None:
    """A run that ran out of memory: the advisor's next strategy, and the command that runs it."""
    import shlex

    from tunedeck.backend.estimate import next_after_oom

    if not status.failure or status.failure.get("kind") != "oom" or isinstance(job, UnreadableJob):
        return
    offer = next_after_oom(job)
    if offer is None:
        print("next     the advisor has no strategy that needs less memory: lower the micro-batch or max_seq_length")
        return
    sets = " ".join(f"--set {shlex.quote(item)}" for item in offer.cli_sets())
    print(f"next     {offer.line}:")
    print(f"         tunedeck train {shlex.quote(str(run_dir / 'job.yaml'))} {sets}")


def _print_speed(run_dir, run) -> None:
    """MFU as logged, and a finished GPU run's speed and memory beside their prediction."""
    import statistics

    from tunedeck.backend.runs import compare_run

    mfu = [r["mfu"] for r in run.records if "mfu" in r]
    if mfu:
        hfu = [r["hfu"] for r in run.records if "hfu" in r]
        print(f"mfu      {statistics.median(mfu):.1%} median (hfu {statistics.median(hfu):.1%})")
    elif run.start and run.start.get("mfu_note"):
        print(f"mfu      {run.start['mfu_note']}")
    comparison = compare_run(run_dir)
    if comparison is not None:
        print(f"speed    {comparison.line()}")


def _print_smoke_verdict(manager, status) -> None:
    from tunedeck.backend.runs import is_smoke_job, smoke_verdict

    if status.state in ("finished", "failed") and is_smoke_job(manager.job(status.run_id)):
        print(f"verdict  {smoke_verdict(manager.run_dir(status.run_id)).line}")


def cmd_runs_stacks(args: argparse.Namespace) -> int:
    from tunedeck.backend.runs import RunError, StacksError, dump_stacks

    manager = _manager(args)
    try:
        stacks = dump_stacks(manager.status(args.run_id), manager.run_dir(args.run_id))
    except (RunError, StacksError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for rank, text in sorted(stacks.items()):
        print(f"=== rank {rank} (also in logs/rank{rank}.log)")
        print(text.strip() or "(no answer: the process is stopped, or stuck where no signal reaches it)")
    return 0


def cmd_runs_stop(args: argparse.Namespace) -> int:
    from tunedeck.backend.runs import RunError, deleted_path

    manager = _manager(args)
    try:
        status = manager.stop(args.run_id, grace_s=args.grace)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if status.state not in ACTIVE_STATES:
        print(f"run {args.run_id} is not running ({status.state})")
        return 0
    if args.no_wait:
        print(f"stop requested for run {args.run_id}")
        return 0
    if status.folder_deleted:
        gone = deleted_path(manager.run_dir(args.run_id))
        print(
            f"stopping run {args.run_id}: {gone} was deleted while it ran; its processes are asked to stop", flush=True
        )
    else:
        print(f"stopping run {args.run_id}: the ranks finish their step and save a checkpoint", flush=True)
    status = manager.wait(args.run_id, timeout=args.grace + 30)
    print(f"run {args.run_id}: {status.state}" + (f" ({status.error})" if status.folder_deleted else ""))
    return 0 if status.state in ("stopped", "finished", "failed") else 1


def cmd_runs_resume(args: argparse.Namespace) -> int:
    """Continue a stopped or failed run from its newest checkpoint (backend/runs/resume.py), then follow it."""
    from tunedeck.backend.runs import RunError, Shape, resume_run

    manager = _manager(args)
    try:
        run_id, step, said = resume_run(manager, args.run_id, Shape(args.num_processes, args.num_machines))
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"run {run_id}: continues run {args.run_id} from its checkpoint at step {step}" + (f", {said}" if said else "")
    )
    print(f"folder {manager.run_dir(run_id)}", flush=True)
    status = follow(manager, run_id)
    if status is None:
        return EXIT_CODES["stopped"]
    print(f"{status.state}" + (f": {status.error}" if status.state == "failed" and status.error else ""))
    return EXIT_CODES.get(status.state, 1)


def cmd_runs_fetch(args: argparse.Namespace) -> int:
    """A remote run's weights, copied into its local folder: Try, Evaluate and merge then find them there."""
    from tunedeck.backend.runs import UNAVAILABLE, RunError, fetch_weights

    manager = _manager(args)
    try:
        run_id = manager.status(args.run_id).run_id
        path = fetch_weights(manager.run_dir(run_id), args.checkpoint)
    except (RunError, *UNAVAILABLE) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"run {run_id}: {'checkpoint-' + str(args.checkpoint) if args.checkpoint else 'the final model'} is in {path}"
    )
    return 0


def cmd_runs_note(args: argparse.Namespace) -> int:
    from tunedeck.backend.runs import NotesError, RunError, write_notes

    manager = _manager(args)
    try:
        run_dir = manager.run_dir(args.run_id)
        old = read_notes(run_dir)
        name = old.name if args.name is None else args.name
        notes = write_notes(run_dir, name, old.notes if args.notes is None else args.notes)
    except (RunError, NotesError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"run {args.run_id}: name {notes.name!r}" + (f", notes of {len(notes.notes)} characters" if notes.notes else "")
    )
    return 0


def cmd_runs_diff(args: argparse.Namespace) -> int:
    from tunedeck.backend.runs import RunError, job_differences, shown_value

    manager = _manager(args)
    try:
        jobs = [job_fields(manager.run_dir(manager.status(run_id).run_id)) for run_id in (args.run_id, args.other)]
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    differences = job_differences(*jobs)
    if not differences:
        print(f"runs {args.run_id} and {args.other} ran the same job")
        return 0
    rows = [("FIELD", args.run_id, args.other), *((p, shown_value(a), shown_value(b)) for p, a, b in differences)]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    for row in rows:
        print(f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  {row[2]}".rstrip())
    return 0
