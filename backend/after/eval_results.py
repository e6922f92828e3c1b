"""eval.json in the run folder: what `tunedeck eval` measured, kept so the run shows it again (no torch).

    {"version": 1, "updated_at": 1733040000.0,
     "results": {"base": {...}, "checkpoint-30": {...}, "final": {...}}}

Each result: loss, perplexity (null when no row has an answer to score), tokens and examples scored,
exact_match and contains_match (fractions), rouge_l (mean ROUGE-L F1; all three null when no prompt has
the data's answer to judge by), preferred (of preference pairs: the share where the chosen answer is the more
likely; null for other data), generated (how many answers were generated), answers_file (every answer,
eval_answers.py), data (what it was measured on), by_source (a dataset.mix run's held-out rows: {source: loss,
perplexity, tokens, examples, exact_match, contains_match, rouge_l} of each source's rows; the table shows a row
each under its model),
device, seconds, evaluated_at, step. A new evaluation replaces the entries it measured and keeps
the others. Asked for, two more (backend/after/benchmarks.py, general_text.py):

    "benchmarks": {"demo_arith": {"metric": "exact_match", "score": 0.11, "scores": {...}, "samples": 20,
                                  "of": 131, "limit": 20}}
    "general_text": {"loss": 5.1, "perplexity": 164.0, "tokens": 5600, "source": "built-in"}

The table gives each benchmark task a column (its score) and the general-text loss one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tunedeck.backend.after.eval_answers import save_answers
from tunedeck.backend.after.scoring import order_key
from tunedeck.backend.runs.records import source_label

EVAL_FILE = "eval.json"
VERSION = 1
TABLE_COLUMNS = (
    "model", "loss", "perplexity", "exact_match", "contains_match", "rouge_l", "preferred", "examples", "data",
)  # fmt: skip
GENERAL_TEXT_COLUMN = "general_text_loss"  # the forgetting check's (backend/after/general_text.py)


def read_eval(run_dir: Path) -> dict:
    """{"results": {...}} of the run, or empty results when nothing was measured; a damaged file says so in "error"."""
    path = Path(run_dir) / EVAL_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"version": VERSION, "results": {}}
    except (OSError, ValueError) as exc:
        return {
            "version": VERSION,
            "results": {},
            "error": f"{path} cannot be read ({exc}); evaluate again to replace it",
        }
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        return {
            "version": VERSION,
            "results": {},
            "error": f"{path} is not an evaluation file; evaluate again to replace it",
        }
    return data


def save_results(run_dir: Path, results: dict[str, dict]) -> dict:
    """Merge these results into eval.json (written whole: a temporary file renamed over it), each one's answers
    into its own file; returns eval.json's content."""
    results = {name: dict(result) for name, result in results.items()}
    for name, result in results.items():
        if "answers" in result:
            result["answers_file"] = save_answers(run_dir, name, result.pop("answers"))
    data = read_eval(run_dir)
    data.pop("error", None)
    data["results"] = {**data["results"], **results}
    data["updated_at"] = time.time()
    path = Path(run_dir) / EVAL_FILE
    staging = path.with_name(f".{EVAL_FILE}.{os.getpid()}")
    staging.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(staging, path)
    return data


def benchmark_tasks(data: dict) -> list[str]:
    """The benchmark tasks any model was measured on, in the order first met."""
    results = data.get("results", {})
    return list(
        dict.fromkeys(task for name in sorted(results, key=order_key) for task in results[name].get("benchmarks") or {})
    )


def table_columns(data: dict) -> list[str]:
    """TABLE_COLUMNS with a column per benchmark task and one for the general-text loss, where measured."""
    extra = benchmark_tasks(data)
    if any(r.get("general_text") for r in data.get("results", {}).values()):
        extra.append(GENERAL_TEXT_COLUMN)
    return [*TABLE_COLUMNS[:-2], *extra, *TABLE_COLUMNS[-2:]]


def _extras(result: dict, tasks: list[str], general_text: bool) -> list:
    scores = [((result.get("benchmarks") or {}).get(task) or {}).get("score") for task in tasks]
    return scores + ([(result.get("general_text") or {}).get("loss")] if general_text else [])


def table_rows(data: dict) -> list[list]:
    """One row per measured model, in table_columns(data) order, for a table in the page or the terminal."""
    rows = []
    tasks, general_text = benchmark_tasks(data), GENERAL_TEXT_COLUMN in table_columns(data)
    for name in sorted(data.get("results", {}), key=order_key):
        r = data["results"][name]
        measures = [r.get(k) for k in ("loss", "perplexity", "exact_match", "contains_match", "rouge_l", "preferred")]
        rows.append([name, *measures, *_extras(r, tasks, general_text), r.get("examples"), r.get("data")])
        for source, m in (r.get("by_source") or {}).items():  # a mixed run's sources, each under its model
            scores = [m.get(k) for k in ("loss", "perplexity", "exact_match", "contains_match", "rouge_l")]
            extras = _extras({}, tasks, general_text)
            rows.append([f"{name} · {source_label(source)}", *scores, None, *extras, m.get("examples"), source])
    return rows
