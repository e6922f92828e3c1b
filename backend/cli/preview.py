"""`tunedeck preview SPEC [--rows N] [--json]`: the dataset as the model will see it, and its lengths."""

from __future__ import annotations

import argparse
import json
import sys

from tunedeck.backend.cli import add_spec_arguments, load_spec_or_exit, print_problems


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "preview",
        help="show the first rows of the job's dataset as the model sees them, and their token lengths",
        description="The first rows after the dataset format and chat template, and token-length statistics "
        "(p50/p95/max against dataset.max_seq_length, rows truncated, padding with and without packing), "
        "for a local file or a hub dataset in the local Hugging Face cache, and a warning when more than 5% of "
        "the rows are cut (what of them is lost, and the max_seq_length that keeps 95% whole). Nothing is "
        "downloaded.",
    )
    add_spec_arguments(p)
    p.add_argument("--rows", type=int, default=3, metavar="N", help="rows to show (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object: rows, stats, tokenizer, problems")
    p.add_argument(
        "--lengths",
        action="store_true",
        help="with --json: also each measured row's tokens and the tokens before its answer (what the panel reads)",
    )
    p.set_defaults(handler=cmd_preview)


def cmd_preview(args: argparse.Namespace) -> int:
    from tunedeck.backend.data import PreviewError, ensure_demo_if_used, truncation_problems
    from tunedeck.backend.data import preview_rows as preview

    if not 0 <= args.rows <= 100:
        print_problems([("error", "--rows", f"{args.rows} rows: give 0 to 100")])
        return 2
    spec = load_spec_or_exit(args)
    ensure_demo_if_used(spec)
    try:
        result = preview(spec, rows=args.rows)
    except PreviewError as exc:
        if args.json:
            print(json.dumps({"error": {"field": exc.field, "message": str(exc)}}))
        print_problems([("error", exc.field, str(exc))])
        return 2
    problems = truncation_problems(spec, result)
    if args.json:
        if not args.lengths:
            result = {k: v for k, v in result.items() if k not in ("lengths", "answer_starts")}
        said = [{"level": p.level, "field": p.field, "message": p.message, "fix": p.fix} for p in problems]
        print(json.dumps({**result, "problems": said}, indent=2))
        return 0
    out = sys.stdout.write
    for i, text in enumerate(result["rows"], start=1):
        out(f"--- row {i} ---\n{text}\n")
    out(f"\n{stats_line(result)}\n")
    if result.get("mixed"):
        out(f"mixed in too (not shown or measured here): {', '.join(result['mixed'])}\n")
    labels = result.get("labels")
    if labels:
        out(f"labels: {labels['good']:,} good, {labels['bad']:,} bad\n")
        if labels["advice"]:
            out(f"warning: {labels['advice']}\n")
    sys.stdout.flush()
    print_with_fixes(problems)
    return 0


def print_with_fixes(problems: list) -> None:
    """Problems as print_problems prints them, each with its fix as --set spells it."""
    print_problems((p.level, p.field, p.message + (f" (--set {p.fix_text()})" if p.fix else "")) for p in problems)


def local_data_problems(spec) -> list:
    """The preview's warning for a job whose dataset is a local file or folder (what `tunedeck validate` adds:
    it reads the first rows and the tokenizer, seconds); [] for a hub dataset or data the preview cannot read
    (the input checks say why)."""
    from pathlib import Path

    from tunedeck.backend.data import PreviewError, truncation_problems
    from tunedeck.backend.data import preview_rows as preview

    if not Path(spec.dataset.path).expanduser().exists():
        return []
    try:
        return truncation_problems(spec, preview(spec, rows=0))
    except PreviewError:
        return []


def stats_line(result: dict) -> str:
    """The statistics in plain words, as the page says them too."""
    s = result["stats"]
    if not s.get("rows"):
        return "the split has no rows"
    unit = "tokens" if result["counted"] == "tokens" else "tokens (estimated)"
    if s.get("limit_field"):  # GRPO: the prompts' lengths; the answers are the model's to write
        return (
            f"{s['rows']:,} of {result['rows_in_split']:,} prompts measured, {unit}: p50 {s['p50']}, p95 {s['p95']}, "
            f"max {s['max']} ({s['limit_field']} {s['max_seq_length']}: {s['truncated']} longer, left out of "
            f"training); the answers are written by the model, {s['num_generations']} per prompt, up to "
            f"grpo.max_completion_length {s['max_completion_length']} tokens each; counted with {result['tokenizer']}"
        )
    return (
        f"{s['rows']:,} of {result['rows_in_split']:,} rows measured, {unit}: p50 {s['p50']}, p95 {s['p95']}, "
        f"max {s['max']} (max_seq_length {s['max_seq_length']}); {s['truncated']} truncated; padding "
        f"{s['padding_waste']:.0%} without packing, {s['padding_waste_packed']:.0%} with packing "
        f"(packing is {'on' if result['packing'] else 'off'}); counted with {result['tokenizer']}"
    )
