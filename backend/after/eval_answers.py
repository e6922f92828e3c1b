"""Every answer an evaluation generated, kept per model so the page can show where each one goes wrong (no torch).

    <run>/eval-answers/<model>.jsonl    one line per example: {"prompt", "expected", "answer",
                                        "exact_match", "contains_match", "rouge_l"}; the prompt as the data has it;
                                        a prompt the data has no answer to: expected and the scores null

A model's file is replaced whenever that model is evaluated again (removed when its data had no
answers to generate). The table joins the models of the newest evaluation row by row: they
answered the same rows of the same data, in order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tunedeck.backend.after.examples import typed
from tunedeck.backend.after.scoring import SCORES, order_key

ANSWERS_DIR = "eval-answers"
SHOW = {
    "all": "every example",
    "wrong": "where the last model is not exactly right",
    "differ": "where the models' answers differ",
}
ROWS_SHOWN = 500  # a longer evaluation shows its first rows; the download holds them all
MARKS = {"exact": "✓", "contains": "≈", "wrong": "✗"}  # the data's answer; contains it; neither


def answers_path(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / ANSWERS_DIR / f"{name}.jsonl"


def save_answers(run_dir: Path, name: str, rows: list[dict]) -> str | None:
    """Write a model's answers (a temporary file renamed over the old one); their path, or None for no answers."""
    path = answers_path(run_dir, name)
    if not rows:
        path.unlink(missing_ok=True)  # an older evaluation's answers would not match this one's data
        return None
    path.parent.mkdir(exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    os.replace(staging, path)
    return str(path)


def newest_answers(run_dir: Path, data: dict) -> dict[str, list[dict]]:
    """{model: its answers} of the newest evaluation in eval.json's `data` that generated answers, in table order."""
    results = {n: r for n, r in data.get("results", {}).items() if r.get("generated")}
    if not results:
        return {}
    newest = max(r.get("evaluated_at", 0) for r in results.values())
    found = {}
    for name in sorted(results, key=order_key):
        result = results[name]
        if result.get("evaluated_at", 0) != newest:
            continue
        try:
            lines = answers_path(run_dir, name).read_text(encoding="utf-8").splitlines()
            rows = [json.loads(line) for line in lines]
        except (OSError, ValueError):
            continue  # evaluated before answers were kept, or the file is damaged: the table goes without it
        if len(rows) == result["generated"]:
            found[name] = rows
    return found


def mark(row: dict) -> str:
    """✓ ≈ ✗ against the data's answer; nothing when the data has none."""
    if row.get("expected") is None:
        return ""
    kind = "exact" if row.get("exact_match") else "contains" if row.get("contains_match") else "wrong"
    return MARKS[kind]


def cell(row: dict) -> str:
    """A model's answer in the table: its mark, its ROUGE-L (answers kept before it was measured have none), itself."""
    score = f" {row['rouge_l']:.2f} ·" if isinstance(row.get("rouge_l"), (int, float)) else ""
    return f"{mark(row)}{score} {row['answer'].strip()}".strip()


def shown_prompt(prompt: object) -> str:
    """A prompt as the Try box takes it: a conversation's last user message, an alpaca row's instruction."""
    try:
        return typed(prompt)["prompt"]
    except Exception:  # noqa: BLE001 - a row the Try box cannot take is still shown, as the data has it
        return json.dumps(prompt, ensure_ascii=False) if not isinstance(prompt, str) else prompt


def answers_table(answers: dict[str, list[dict]], show: str = "all") -> tuple[list[str], list[list], str]:
    """(headers, rows, a line saying what is shown) of the answers side by side, filtered by `show` (SHOW)."""
    if show not in SHOW:
        raise ValueError(f"show: {show!r} is not one of {', '.join(SHOW)}")
    names = list(answers)
    headers = ["#", "prompt", "the data's answer", *names]
    if not names:
        return headers, [], "Evaluate to see each model's answers here."
    count = min(len(rows) for rows in answers.values())
    rows = []
    for i in range(count):
        got = [answers[name][i] for name in names]
        if show == "wrong" and (got[-1].get("exact_match") or got[-1].get("expected") is None):
            continue
        if show == "differ" and len({g["answer"].strip() for g in got}) < 2:
            continue
        first = got[0]
        cells = [cell(g) for g in got]
        expected = "—" if first["expected"] is None else first["expected"].strip()
        rows.append([i + 1, shown_prompt(first["prompt"]), expected, *cells])
    cut = f", the first {ROWS_SHOWN} here (the download has all)" if len(rows) > ROWS_SHOWN else ""
    which = f"{count} examples" if show == "all" else f"{len(rows)} of {count} examples {SHOW[show]}"
    judged = sum(row["expected"] is not None for row in answers[names[0]][:count])
    if not judged:
        return headers, rows[:ROWS_SHOWN], f"{which}{cut} · prompts without answers in the data: each model's answer"
    right = ", ".join(f"{name} {sum(bool(r.get('exact_match')) for r in answers[name][:count])}" for name in names)
    of = f" of the {judged} with one" if judged < count else ""
    line = f"{which}{cut} · the data's answer exactly (✓){of}: {right} · ≈ contains it · ✗ neither · then ROUGE-L"
    return headers, rows[:ROWS_SHOWN], line


def answers_jsonl(answers: dict[str, list[dict]]) -> str:
    """The answers side by side as JSON lines: {"prompt", "expected", "answers": {model: answer}, "exact_match": {...}}."""
    names = list(answers)
    count = min((len(rows) for rows in answers.values()), default=0)
    lines = []
    for i in range(count):
        first = answers[names[0]][i]
        row = {
            "prompt": first["prompt"],
            "expected": first["expected"],
            "answers": {name: answers[name][i]["answer"] for name in names},
            **{score: {name: answers[name][i].get(score) for name in names} for score in SCORES},
        }
        lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    return "".join(lines)
