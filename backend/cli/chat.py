"""`tunedeck chat RUN`: ask a run's fine-tuned model (or its base) and print the answer; a conversation in the
terminal without --prompt; with --example, a row of the run's data, its answer judged against the data's.

The model answers in a worker process (backend/after/worker.py), as in the panel's Try box; the run,
its weights and the worker's progress are picked and shown as for eval and merge (backend/cli/after.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunedeck.backend.cli.after import Progress, add_run_arguments, handled, resolve_run
from tunedeck.backend.spec import JobSpec

# The session lasts as long as this command: no idle timeout to cut a slow typist off.
CHAT_IDLE_TIMEOUT_S = 7 * 24 * 3600.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat", help="ask a run's fine-tuned model (or its base) and print the answer; interactive without --prompt"
    )
    add_run_arguments(p)
    p.add_argument(
        "--prompt", help="the prompt; without it, read prompts from the terminal until /exit or end of input"
    )
    p.add_argument(
        "--example",
        nargs="?",
        type=int,
        const=0,
        metavar="N",
        help="ask with example N of the run's data (held-out rows first; without N, one at random) and "
        "judge the answer against the data's",
    )
    p.add_argument("--base", action="store_true", help="answer with the base model alone (no adapter)")
    p.add_argument(
        "--system",
        metavar="TEXT",
        help="a system message sent before every prompt (the chat template "
        "only; with --example, instead of the example's own)",
    )
    p.add_argument(
        "--template",
        choices=("auto", "chat", "alpaca", "plain"),
        default="auto",
        help="how the prompt is wrapped: auto follows the run's dataset.format (messages: the chat template; "
        "alpaca: its prompt; otherwise the text as typed)",
    )
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 (default) answers greedily")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R")
    p.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="end the answer before this text (repeatable)"
    )
    p.set_defaults(handler=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    return handled(lambda: _chat(args))


def _chat(args) -> int:
    from tunedeck.backend.after import GenerationSettings, ModelWorker, transcript, verdict

    settings = GenerationSettings(
        args.max_new_tokens, args.temperature, args.top_p, args.repetition_penalty, tuple(args.stop)
    )
    runs_dir, job, weights = resolve_run(args, args.base)
    example = _example(runs_dir, job, args)
    _check_system(args, job)
    progress = Progress()
    print(f"loading {weights.describe()} of run {args.run_id}", file=sys.stderr, flush=True)
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
            if example.expected is not None:  # (an example picked from the data always has its answer)
                print(f"the data's answer: {example.expected}\n{verdict(answer, example.expected)}", file=sys.stderr)
            return 0
        if args.prompt is not None:
            _answer(worker, args.prompt, settings, args.template, [], args.system or "")
            return 0
        return _interactive(worker, settings, args.template, args.system or "")
    finally:
        worker.release()


def _answer(worker, prompt: str, settings, template: str, history: list, system: str = "") -> str:
    from tunedeck.backend.after import answer_line

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


def _example(runs_dir, job: JobSpec, args):
    """The example --example names (None without it); --prompt and --example exclude each other."""
    if args.example is None:
        return None
    if args.prompt is not None:
        from tunedeck.backend.runs import AfterError

        raise AfterError("--example: give --prompt or --example, not both")
    from tunedeck.backend.after import data_examples, pick

    return pick(*data_examples(Path(runs_dir) / args.run_id, job), args.example or None)


def _check_system(args, job: JobSpec) -> None:
    """--system needs the chat template: said before the model loads."""
    from tunedeck.backend.after import resolve_template
    from tunedeck.backend.runs import AfterError

    fmt = job.dataset.format
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
