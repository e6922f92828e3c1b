"""The job's local model and data checked before any library reads them, worded for the person who wrote the job.

Run here at start, and by tunedeck before launch (backend/runs/preflight_inputs.py), with the same wording:
a missing local model otherwise reads "Repo id must be in the form ...", and a bad JSONL file
StopIteration (empty) or "'list' object has no attribute 'endswith'" (wrong types) from the libraries.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from .data import DATA_FILE_BUILDERS, _where, looks_local, missing_path, mix_sources
from .formats import FORMAT_COLUMNS, KIND_NEEDS, _kind_of, as_label, cannot_join, column, format_by_columns, joins
from .general_text import sample_problem
from .job import JobError
from .rewards import REWARD_FUNCTIONS, reward_problem

ROWS_CHECKED = 100


def model_problem(name_or_path: str, base: Path) -> str | None:
    """Why model.name_or_path cannot be loaded, when that shows without the network."""
    path = base / Path(name_or_path).expanduser()
    fix = "give the folder a model was saved to (with config.json) or a Hugging Face hub id such as meta-llama/Llama-2-7b-hf"
    if path.is_dir():
        return None if (path / "config.json").is_file() else f"the folder {path} has no config.json: {fix}"
    if path.exists():
        return f"{path} is a file: {fix}"
    if looks_local(name_or_path):
        return f"{name_or_path} does not exist{_where(name_or_path, base)}: {fix}"
    return None


def _value_problem(value, kind: str) -> str | None:
    """Why a value is not of the kind a format needs ("text", "chat", ...), or None."""
    if kind == "optional text" and (value is None or isinstance(value, str)):
        return None
    if kind == "label":
        return None if as_label(value) is not None else (repr(value) if isinstance(value, str) else _kind_of(value))
    if "text" in kind and isinstance(value, str):
        return None
    if "chat" in kind and isinstance(value, list):
        bad = next(
            (i for i, m in enumerate(value) if not (isinstance(m, dict) and "role" in m and "content" in m)), None
        )
        if bad is None and value:
            return None
        return "an empty list" if not value else f"a list whose item {bad} is not a message with role and content"
    return _kind_of(value)


def _rows(path: Path, limit: int):
    """("line N" or, in a JSON array, "item N", row) of the file's first rows. JobError when one cannot be read."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        import csv

        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            reader = csv.DictReader(f)
            for count, row in enumerate(reader):
                if count >= limit:
                    return
                yield f"line {reader.line_num}", row
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(4096).lstrip()
        f.seek(0)
        if suffix == ".json" and head.startswith("["):
            try:
                items = json.load(f)
            except json.JSONDecodeError as exc:
                raise JobError(
                    f"dataset.path: {path} line {exc.lineno} is not valid JSON ({exc.msg}): fix the file"
                ) from None
            yield from ((f"item {i + 1}", item) for i, item in enumerate(items[:limit]))
            return
        seen = 0
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise JobError(
                    f"dataset.path: {path} line {number} is not valid JSON ({exc.msg}): fix or remove "
                    "that line; each line must be one JSON object"
                ) from None
            yield f"line {number}", row
            seen += 1
            if seen >= limit:
                return


def dataset_problems(
    dataset_cfg: dict, base: Path, limit: int = ROWS_CHECKED, needed: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """(field, message) for a local data file whose first rows do not parse or do not fit dataset.format.
    needed: optional columns the job needs all the same (GRPO's answer rewards read the reference answer)."""
    source = str(dataset_cfg.get("path") or "")
    path = base / Path(source).expanduser()
    if path.is_dir() or not (path.is_file() or looks_local(source) or path.suffix.lower() in DATA_FILE_BUILDERS):
        return []  # a folder or a hub dataset: the datasets library reads it at run time
    if not path.is_file():
        return [("dataset.path", missing_path(source, base))]
    if path.suffix.lower() not in (".json", ".jsonl", ".csv"):
        return []  # parquet: its columns are checked once loaded
    fmt = dataset_cfg.get("format", "text")
    columns = {field: (column(dataset_cfg, field), kind) for field, (_, kind) in FORMAT_COLUMNS.get(fmt, {}).items()}
    problems: dict[str, str] = {}  # one per field: the first row that shows it
    rows = 0
    try:
        for where, row in _rows(path, limit):
            rows += 1
            at = f"{path} {where}"
            if not isinstance(row, dict):
                problems.setdefault(
                    "dataset.path",
                    f"{at} holds {_kind_of(row)}, not a JSON object: each row must be an object of columns",
                )
                continue
            for field, (col, kind) in columns.items():
                if col not in row:
                    if kind != "optional text" or field in needed:
                        problems.setdefault(
                            f"dataset.{field}",
                            f"{at} has no column {col!r} (it has {', '.join(map(repr, row)) or 'none'}): set dataset.{field} "
                            f"to the column that holds the {field.removesuffix('_field')}, or change dataset.format",
                        )
                    continue
                wrong = _value_problem(row[col], kind)
                if wrong:
                    problems.setdefault(
                        f"dataset.{field}",
                        f"{at}: column {col!r} holds {wrong}, but dataset.format {fmt} needs {KIND_NEEDS[kind]} there; "
                        "fix the file or choose the dataset.format that matches it",
                    )
    except JobError as exc:
        return [("dataset.path", str(exc).removeprefix("dataset.path: "))]
    except (OSError, UnicodeDecodeError) as exc:
        return [("dataset.path", f"{path} cannot be read ({exc}); fix its permissions or point to another file")]
    if not rows:
        example = {c: "..." for c, _ in columns.values()}
        return [
            (
                "dataset.path",
                f"{path} has no rows: give a file with one JSON object per line, e.g. {json.dumps(example)}",
            )
        ]
    return list(problems.items())


def input_problems(job: dict, base: Path) -> list[tuple[str, str]]:
    """(field, message) for every problem of the job's local model and data that shows before loading them."""
    problems = []
    model = model_problem(str((job.get("model") or {}).get("name_or_path") or ""), base)
    if model:
        problems.append(("model.name_or_path", model))
    if (job.get("training") or {}).get("use_liger_kernel") and importlib.util.find_spec("liger_kernel") is None:
        # transformers would raise only once the trainer is built, after the model loaded.
        problems.append(
            (
                "training.use_liger_kernel",
                "needs the liger-kernel package, which is not installed: pip install liger-kernel, "
                "or set training.use_liger_kernel=false",
            )
        )
    needed = ()
    if job.get("objective") == "grpo":
        rewards = (job.get("grpo") or {}).get("rewards") or ["exact_answer"]
        problems += [("grpo.rewards", problem) for entry in rewards if (problem := reward_problem(entry))]
        needed = ("answer_field",) if any(entry in REWARD_FUNCTIONS for entry in rewards) else ()
    dataset_cfg = job.get("dataset") or {}
    problems += dataset_problems(dataset_cfg, base, needed=needed)
    if general := sample_problem(job, base):
        problems.append(("dataset.general_text", general))
    try:
        sources = mix_sources(dataset_cfg)
    except JobError as exc:
        return problems + [("dataset.mix", str(exc).removeprefix("dataset.mix: "))]
    for entry, config, _, _ in sources:  # each mixed-in file as the main one, or in the format its columns name
        problems += [("dataset.mix", f"{entry!r}: {message}") for message in mix_problems(config, base, needed)]
    return problems


def mix_problems(config: dict, base: Path, needed: tuple[str, ...]) -> list[str]:
    """A mixed-in local file's problems: in the job's format, or, when its columns name another, in that one (or
    that its rows cannot join the job's)."""
    found = [message for _, message in dataset_problems(config, base, needed=needed)]
    job_format = config.get("format", "text")
    own, columns = _first_row_format(config, base) if found else (None, [])
    if own is None or own == job_format:
        return found
    if not joins(own, job_format):
        return [cannot_join(columns, own, job_format)]
    return [message for _, message in dataset_problems({"path": config["path"], "format": own}, base)]


def _first_row_format(dataset_cfg: dict, base: Path) -> tuple[str | None, list[str]]:
    """(format_by_columns, the columns) of a local data file's first row; (None, []) for anything else or a file
    that does not read."""
    path = base / Path(str(dataset_cfg.get("path") or "")).expanduser()
    if not path.is_file() or path.suffix.lower() not in (".json", ".jsonl", ".csv"):
        return None, []
    try:
        row = next((row for _, row in _rows(path, 1)), None)
    except (JobError, OSError, UnicodeDecodeError):
        return None, []
    return (format_by_columns(row), list(row)) if isinstance(row, dict) else (None, [])
