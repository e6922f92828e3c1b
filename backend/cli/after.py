"""After training: `tunedeck chat RUN`, `tunedeck eval RUN`, `tunedeck merge RUN -o DIR`, `tunedeck push DIR`.

The model work happens in a worker process (backend/after/worker.py), as it does for the panel; this
module only picks the run and its weights (so a wrong --checkpoint fails at once, before anything
loads), prints progress to stderr and the answer or the results to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tunedeck.backend.cli.runs import _add_runs_dir, _manager

CHAT_IDLE_TIMEOUT_S = 7 * 24 * 3600.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat", help="ask a run's fine-tuned model (or its base) and print the answer; interactive without --prompt"
    )
    _run_arguments(p)
    p.add_argument(
        "--prompt", help="the prompt; without it, read prompts from the terminal until /exit or end of input"
    )
    p.add_argument("--example", nargs="?", type=int, const=0, metavar="N",
                   help="ask with example N of the run's data (held-out rows first; without N, one at random) and "
                        "judge the answer against the data's")  # fmt: skip
    p.add_argument("--base", action="store_true", help="answer with the base model alone (no adapter)")
    p.add_argument("--system", metavar="TEXT", help="a system message sent before every prompt (the chat template "
                   "only; with --example, instead of the example's own)")  # fmt: skip
    p.add_argument("--template", choices=("auto", "chat", "alpaca", "plain"), default="auto",
                   help="how the prompt is wrapped: auto follows the run's dataset.format (messages: the chat template; "
                        "alpaca: its prompt; otherwise the text as typed)")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 (default) answers greedily")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R")
    p.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="end the answer before this text (repeatable)"
    )
    p.set_defaults(handler=cmd_chat)

    p = sub.add_parser(
        "eval",
        help="loss, perplexity, exact match and ROUGE-L of the base model and a run's adapter; saved in eval.json",
    )
    _run_arguments(p)
    p.add_argument("--all", action="store_true", help="also evaluate every checkpoint")
    p.add_argument(
        "--data",
        metavar="FILE",
        help="evaluate on this file (in the run's dataset format) instead of its eval data; "
        "prompts without answers are answered, not scored",
    )
    p.add_argument("--limit", type=int, metavar="N", help="only the first N rows")
    p.add_argument("--json", action="store_true", help='print {"base": {...}, "adapter": {...}} as JSON')
    p.set_defaults(handler=cmd_eval)

    p = sub.add_parser(
        "merge", help="merge a run's LoRA adapter into its base and save a standalone model (+ serve.sh)"
    )
    _run_arguments(p)
    p.add_argument(
        "-o", "--output", dest="out_dir", type=Path, required=True, metavar="DIR", help="a new folder for the model"
    )
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        help="dtype of the saved weights (default: the run's model.dtype)",
    )
    p.set_defaults(handler=cmd_merge)

    p = sub.add_parser(
        "push", help="upload a merged model folder to the Hugging Face Hub (token from HF_TOKEN or --token-file)"
    )
    p.add_argument("folder", type=Path, metavar="DIR")
    p.add_argument("--repo-id", required=True, metavar="OWNER/NAME")
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="a file holding a write token (default: $HF_TOKEN, or huggingface-cli login)",
    )
    p.add_argument("--public", action="store_true", help="make a new repository public (default private)")
    p.set_defaults(handler=cmd_push)


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN", help="a run id, as `tunedeck runs` lists them")
    parser.add_argument(
        "--checkpoint", type=int, metavar="N", help="the checkpoint saved at step N (default: the final adapter)"
    )
    _add_runs_dir(parser)


def _fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _resolve(args, base: bool = False):
    """(runs_dir, job, weights) of RUN and --checkpoint; AfterError when they do not exist."""
    from tunedeck.backend.runs.checkpoints import AfterError, select
    from tunedeck.backend.runs.manager import RunError

    manager = _manager(args)
    try:
        manager.status(args.run_id)
    except RunError as exc:
        raise AfterError(str(exc)) from None
    job = manager.job(args.run_id)
    if not job:
        raise AfterError(f"run {args.run_id} has no readable job.yaml")
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


def _handled(run):
    """Run a command body; AfterError/SettingsError are exit 2, WorkerError exit 1, each one clear line."""
    from tunedeck.backend.after.prompting import SettingsError
    from tunedeck.backend.after.worker_client import WorkerError
    from tunedeck.backend.runs.checkpoints import AfterError

    try:
        return run()
    except (AfterError, SettingsError) as exc:
        return _fail(str(exc))
    except WorkerError as exc:
        return _fail(str(exc), 130 if exc.cancelled else 1)


# ---------------------------------------------------------------- chat


def cmd_chat(args: argparse.Namespace) -> int:
    return _handled(lambda: _chat(args))


def _chat(args) -> int:
    from tunedeck.backend.after.examples import verdict
    from tunedeck.backend.after.prompting import GenerationSettings, transcript
    from tunedeck.backend.after.worker_client import ModelWorker

    settings = GenerationSettings(
        args.max_new_tokens, args.temperature, args.top_p, args.repetition_penalty, tuple(args.stop)
    )
    runs_dir, job, weights = _resolve(args, args.base)
    example = _example(runs_dir, job, args)
    _check_system(args, job)
    progress = Progress()
    print(f"loading {weights.describe()} of run {args.run_id}", file=sys.stderr, flush=True)
    # The session lasts as long as this command: no idle timeout to cut a slow typist off.
    worker = ModelWorker.open(
        runs_dir, args.run_id, args.checkpoint, args.base, on_event=progress, idle_timeout_s=CHAT_IDLE_TIMEOUT_S
    )
    progress.close()
    try:
        if example is not None:
            system = example.system if args.system is None else args.system
            context = system or example.turns  # a conversation shows as the Try box shows it
            shown = [f"system: {system}"] * bool(system) + [
                transcript(example.turns, example.prompt).rstrip("\n") if context else example.prompt
            ]
            print(f"{example.describe()}:", *shown, sep="\n", file=sys.stderr, flush=True)
            answer = _answer(worker, example.prompt, settings, args.template, list(example.turns), system)
            print(f"the data's answer: {example.expected}\n{verdict(answer, example.expected)}", file=sys.stderr)
            return 0
        if args.prompt is not None:
            _answer(worker, args.prompt, settings, args.template, [], args.system or "")
            return 0
        return _interactive(worker, settings, args.template, args.system or "")
    finally:
        worker.release()


def _answer(worker, prompt: str, settings, template: str, history: list, system: str = "") -> str:
    from tunedeck.backend.after.prompting import answer_line

    pieces = worker.generate(prompt, settings, template, history, system)
    try:
        while True:
            print(next(pieces), end="", flush=True)
    except StopIteration as done:
        print(flush=True)
        print(f"({answer_line(done.value)})", file=sys.stderr, flush=True)
        return done.value["text"]
    except KeyboardInterrupt:
        pieces.close()  # the worker stops generating; the session goes on
        print("\n(cancelled)", file=sys.stderr, flush=True)
        return ""


def _example(runs_dir, job: dict, args):
    """The example --example names (None without it); --prompt and --example exclude each other."""
    if args.example is None:
        return None
    if args.prompt is not None:
        from tunedeck.backend.runs.checkpoints import AfterError

        raise AfterError("--example: give --prompt or --example, not both")
    from tunedeck.backend.after.examples import data_examples, pick

    return pick(*data_examples(Path(runs_dir) / args.run_id, job), args.example or None)


def _check_system(args, job: dict) -> None:
    """--system needs the chat template: said before the model loads."""
    from tunedeck.backend.after.prompting import resolve_template
    from tunedeck.backend.runs.checkpoints import AfterError

    fmt = (job.get("dataset") or {}).get("format", "")
    if args.system is not None and resolve_template(args.template, fmt, has_chat_template=True) != "chat":
        raise AfterError(
            f"--system: the {fmt or 'run'} data's prompts are not wrapped in a chat template, which is where a "
            "system message goes; add --template chat (the model's tokenizer must have one) or leave --system out"
        )


def _interactive(worker, settings, template: str, system: str = "") -> int:
    chat = worker.info["template"] == "chat" if template == "auto" else template == "chat"
    note = "the conversation is kept (chat template)" if chat else "each prompt stands alone (no chat template)"
    print(
        f"{worker.info['description']} on {worker.info['device']}; {note}. /reset forgets, /exit or Ctrl-D ends.",
        file=sys.stderr,
    )
    history: list[tuple[str, str]] = []
    while True:
        try:
            prompt = input("> " if sys.stdin.isatty() else "")
        except EOFError:
            return 0
        if prompt.strip() in ("/exit", "/quit"):
            return 0
        if prompt.strip() == "/reset":
            history.clear()
            continue
        if not prompt.strip():
            continue
        answer = _answer(worker, prompt.replace("\\n", "\n"), settings, template, history, system)
        if chat:
            history.append((prompt, answer))


# ---------------------------------------------------------------- eval


def cmd_eval(args: argparse.Namespace) -> int:
    return _handled(lambda: _eval(args))


def _eval(args) -> int:
    from tunedeck.backend.after.eval_answers import ANSWERS_DIR
    from tunedeck.backend.after.eval_data import eval_source
    from tunedeck.backend.after.worker_client import run_task
    from tunedeck.backend.runs.checkpoints import list_weights
    from tunedeck.backend.runs.manager import RunManager

    if args.limit is not None and args.limit < 1:
        return _fail("--limit: give a positive number of rows")
    runs_dir, job, weights = _resolve(args)
    run_dir = RunManager(runs_dir).run_dir(args.run_id)
    names = [w.name for w in list_weights(run_dir, job)] if args.all else ["base", weights.name]
    data = str(Path(args.data).resolve()) if args.data else None
    eval_source(run_dir, job, data)  # no evaluation data: said before a model loads
    progress = Progress()
    outcome = run_task(
        "evaluate", {"run_id": args.run_id, "names": names, "data": data, "limit": args.limit}, job, runs_dir, progress
    )
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
        print(json.dumps(report, indent=2))
        return 0
    _print_table(results, outcome["data"])
    print(f"saved in {run_dir / 'eval.json'}")
    if any(r.get("answers_file") for r in results.values()):
        print(f"every answer, one file per model: {run_dir / ANSWERS_DIR}/<model>.jsonl")
    return 0


def _print_table(results: dict, data: str) -> None:
    from tunedeck.backend.after.eval_results import order_key

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


# ---------------------------------------------------------------- merge and push


def cmd_merge(args: argparse.Namespace) -> int:
    return _handled(lambda: _merge(args))


def _merge(args) -> int:
    from tunedeck.backend.after.merge import check_output_dir
    from tunedeck.backend.after.worker_client import run_task

    runs_dir, job, weights = _resolve(args)
    out_dir = check_output_dir(args.out_dir)  # before anything loads
    dtype = args.dtype or (job.get("model") or {}).get("dtype") or "bfloat16"
    if job.get("method") == "qlora":
        print(
            "QLoRA run: the adapter is merged into the base loaded in " + dtype + ", not into 4-bit weights",
            file=sys.stderr,
        )
    progress = Progress()
    request = {"run_id": args.run_id, "checkpoint": weights.step, "out_dir": str(out_dir), "dtype": dtype}
    result = run_task("merge", request, job, runs_dir, progress)
    progress.close()
    print(f"merged {weights.describe()} of run {args.run_id} into {result['base_model']} ({dtype})")
    print(f"saved to {result['out_dir']}: {', '.join(result['files'])}")
    print(
        f"serve it: bash {Path(result['out_dir']) / 'serve.sh'}   (or `bash serve.sh adapter` for the base + adapter)"
    )
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from tunedeck.backend.after.hub import push_folder

    token = None
    if args.token_file:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            return _fail(f"--token-file: cannot read {args.token_file} ({exc.strerror or exc})")
    token = token or os.environ.get("HF_TOKEN")
    return _handled(
        lambda: print(f"pushed to {push_folder(args.folder, args.repo_id, token, private=not args.public)}") or 0
    )
