"""After training: `tunedeck eval RUN`, and what it shares with `tunedeck chat RUN` (backend/cli/chat.py) and the
export commands (backend/cli/export.py): the run and its weights, the worker's progress, errors as one line.

The model work happens in a worker process (backend/after/worker.py), as it does for the panel; this
module only picks the run and its weights (so a wrong --checkpoint fails at once, before anything
loads), prints progress to stderr and the results to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tunedeck.backend.cli.runs import _add_runs_dir, _manager


def register(sub: argparse._SubParsersAction) -> None:
    from tunedeck.backend.after import DEFAULT_LIMIT

    p = sub.add_parser(
        "eval",
        help="loss, perplexity, exact match and ROUGE-L of the base model and a run's adapter, optionally benchmarks "
        "(lm-evaluation-harness) and a forgetting check; saved in eval.json",
    )
    add_run_arguments(p)
    p.add_argument("--all", action="store_true", help="also evaluate every checkpoint")
    p.add_argument(
        "--data",
        metavar="FILE",
        help="evaluate on this file (in the run's dataset format) instead of its eval data; "
        "prompts without answers are answered, not scored",
    )
    p.add_argument("--limit", type=int, metavar="N", help="only the first N rows")
    p.add_argument(
        "--tasks",
        metavar="NAMES",
        help="also run these lm-evaluation-harness tasks on each model, comma-separated: demo_arith (the demo's, "
        "offline), one of your --task-dir, or the harness's own (hellaswag, arc_easy...; their data from the Hub)",
    )
    p.add_argument(
        "--tasks-limit",
        default=str(DEFAULT_LIMIT),
        metavar="N|all",
        help=f"questions per task (default {DEFAULT_LIMIT}: a quick slice; all: the full task)",
    )
    p.add_argument("--task-dir", metavar="DIR", help="a folder of your own lm-evaluation-harness task YAMLs")
    p.add_argument(
        "--forgetting",
        action="store_true",
        help="also the loss on general text (a built-in sample of everyday English), base vs adapter: "
        "a rise flags forgetting",
    )
    p.add_argument("--general-text", metavar="FILE", help="the forgetting check on this plain-text file instead")
    p.add_argument("--json", action="store_true", help='print {"base": {...}, "adapter": {...}} as JSON')
    p.set_defaults(handler=cmd_eval)


def add_run_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "run_id", metavar="RUN", nargs=None if required else "?", help="a run id, as `tunedeck runs` lists them"
    )
    parser.add_argument(
        "--checkpoint", type=int, metavar="N", help="the checkpoint saved at step N (default: the final adapter)"
    )
    _add_runs_dir(parser)


def fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def resolve_run(args, base: bool = False):
    """(runs_dir, job, weights) of RUN and --checkpoint; AfterError when they do not exist."""
    from tunedeck.backend.runs import AfterError, RunError, UnreadableJob, select

    manager = _manager(args)
    try:
        manager.status(args.run_id)
    except RunError as exc:
        raise AfterError(str(exc)) from None
    job = manager.job(args.run_id)
    if isinstance(job, UnreadableJob):
        raise AfterError(f"run {args.run_id}: {job.explained()}")
    weights = select(manager.run_dir(args.run_id), job, args.run_id, args.checkpoint, base)
    return manager.runs_dir, job, weights


class Progress:
    """Progress events of the worker on stderr: one redrawn line on a terminal, a line per stage otherwise."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self.stage = None
        self.drawn = False

    def __call__(self, event: dict) -> None:
        if event.get("event") == "warning":
            self._line(f"warning: {event['message']}")
        elif event.get("event") == "progress":
            stage, done, total = event["stage"], event["done"], event["total"]
            if self.tty:
                self.stream.write(f"\r\033[K{stage} {done}/{total}")
                self.stream.flush()
                self.drawn = True
            elif stage != self.stage:
                self._line(f"{stage}...")
            self.stage = stage

    def _line(self, text: str) -> None:
        self.close()
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = False


def handled(run):
    """Run a command body; AfterError/SettingsError are exit 2, WorkerError exit 1, each one clear line."""
    from tunedeck.backend.after import SettingsError, WorkerError
    from tunedeck.backend.runs import AfterError

    try:
        return run()
    except (AfterError, SettingsError) as exc:
        return fail(str(exc))
    except WorkerError as exc:
        return fail(str(exc), 130 if exc.cancelled else 1)


# ---------------------------------------------------------------- eval


def cmd_eval(args: argparse.Namespace) -> int:
    return handled(lambda: _eval(args))


def _eval(args) -> int:
    from tunedeck.backend.after import ANSWERS_DIR, eval_source, forgetting_lines, run_task
    from tunedeck.backend.runs import RunManager, list_weights

    if args.limit is not None and args.limit < 1:
        return fail("--limit: give a positive number of rows")
    checks = _checks(args)  # a bad flag: said before anything loads
    runs_dir, job, weights = resolve_run(args)
    run_dir = RunManager(runs_dir).run_dir(args.run_id)
    names = [w.name for w in list_weights(run_dir, job)] if args.all else ["base", weights.name]
    data = str(Path(args.data).resolve()) if args.data else None
    eval_source(run_dir, job, data)  # no evaluation data: said before a model loads
    progress = Progress()
    request = {"run_id": args.run_id, "names": names, "data": data, "limit": args.limit, **checks}
    outcome = run_task("evaluate", request, job, runs_dir, progress)
    progress.close()
    results = outcome["results"]
    if args.json:
        report = {
            "base": results["base"],
            "adapter": {**results[weights.name], "name": weights.name},
            "data": outcome["data"],
        }
        if args.all:
            report["checkpoints"] = {n: r for n, r in results.items() if n.startswith("checkpoint-")}
        if checks.get("general_text"):
            report["forgetting"] = forgetting_lines(results)
        print(json.dumps(report, indent=2))
        return 0
    _print_table(results, outcome["data"])
    _print_checks(results)
    print(f"saved in {run_dir / 'eval.json'}")
    if any(r.get("answers_file") for r in results.values()):
        print(f"every answer, one file per model: {run_dir / ANSWERS_DIR}/<model>.jsonl")
    return 0


def _checks(args) -> dict:
    """The worker's arguments for --tasks, --tasks-limit, --task-dir, --forgetting and --general-text."""
    from tunedeck.backend.after import BUILTIN_NAME, check_task_dir, parse_tasks, read_general_text
    from tunedeck.backend.runs import AfterError

    checks: dict = {}
    tasks = parse_tasks(args.tasks)
    if args.tasks is not None and not tasks:
        raise AfterError("--tasks: give one or more task names, e.g. --tasks demo_arith")
    limit = args.tasks_limit.strip().lower()
    if limit != "all" and not (limit.isdigit() and int(limit) > 0):
        raise AfterError(f"--tasks-limit: {args.tasks_limit!r} is not a number of questions; give N > 0 or all")
    if tasks:
        checks.update(tasks=list(tasks), tasks_limit=None if limit == "all" else int(limit))
        checks["task_dir"] = check_task_dir(args.task_dir)
    elif args.task_dir:
        raise AfterError("--task-dir: name the tasks to run from it with --tasks NAMES")
    if args.general_text:
        read_general_text(args.general_text)  # unreadable or empty: said now
        checks["general_text"] = str(Path(args.general_text).expanduser().resolve())
    elif args.forgetting:
        checks["general_text"] = BUILTIN_NAME
    return checks


def _print_checks(results: dict) -> None:
    """Each benchmark's score per model, and the forgetting check's losses and verdict."""
    from tunedeck.backend.after import forgetting_lines, order_key

    names = sorted(results, key=order_key)
    tasks = dict.fromkeys(t for n in names for t in results[n].get("benchmarks") or {})
    for task in tasks:
        got = {n: results[n]["benchmarks"][task] for n in names if task in (results[n].get("benchmarks") or {})}
        first = next(iter(got.values()))
        limit = f"up to {first['limit']} questions a task" if first.get("limit") else "all questions"
        questions = f"{first['samples']} of {first['of']} questions" if first.get("of") else limit  # a group: no count
        shares = all(0 <= r["score"] <= 1 for r in got.values())  # accuracy, exact match...; not a perplexity
        scores = ", ".join(
            f"{n} {100 * r['score']:.1f}%" if shares else f"{n} {r['score']:.4g}" for n, r in got.items()
        )
        print(f"benchmark {task} ({first['metric']}, {questions}): {scores}")
    measured = {n: results[n]["general_text"] for n in names if results[n].get("general_text")}
    if measured:
        source = next(iter(measured.values()))["source"]
        losses = ", ".join(f"{n} {r['loss']:.4f}" for n, r in measured.items())
        print(f"general-text loss ({source}, {next(iter(measured.values()))['tokens']} tokens): {losses}")
        for line in forgetting_lines(results):
            print(line)


def _print_table(results: dict, data: str) -> None:
    from tunedeck.backend.after import order_key

    def pct(value):
        return "-" if value is None else f"{100 * value:.1f}%"

    def number(value, digits):
        return "-" if value is None else f"{value:.{digits}f}"

    pairs = any(r.get("preferred") is not None for r in results.values())  # preference data: chosen vs rejected
    rows = [("MODEL", "LOSS", "PERPLEXITY", "EXACT", "CONTAINS", "ROUGE-L", *("PREFERRED",) * pairs, "EXAMPLES")]
    for name in sorted(results, key=order_key):
        r = results[name]
        rows.append(
            (
                name,
                number(r["loss"], 4),
                number(r["perplexity"], 2),
                pct(r["exact_match"]),
                pct(r["contains_match"]),
                number(r.get("rouge_l"), 3),
                *(pct(r.get("preferred")),) * pairs,
                str(r["examples"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(f"evaluated on {data}")
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
