"""Data files uploaded from the page, kept where runs read them (no datasets import: the panel stays light).

    <runs>/datasets/<digest>/<file name>                       one file, under its own name
    <runs>/datasets/<digest>/train.<ext>, validation.<ext>     a training file with its held-out file

A browser behind an SSH tunnel has no other way to put its data on the server. A held-out file
uploaded with the training file becomes the folder's `validation` split: the job's eval split, for
eval loss during training and for Evaluate. The same files uploaded again land in the same folder. A Slurm node reads them where it reads the runs folder. The row format is taken
from the training file's columns when they are one format's own (dataset.format's default columns).
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil
from pathlib import Path

from tunedeck.backend.train import DATA_FILE_BUILDERS
from tunedeck.backend.vocabulary import DATASET_FORMATS, OBJECTIVE_FORMATS

DATASETS_DIR = "datasets"
SUFFIXES = tuple(DATA_FILE_BUILDERS)  # what train_sft.py reads as dataset.path
HELD_OUT_NAMES = ("eval", "test", "validation", "valid", "dev")  # as the datasets library names splits by file name
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class UploadError(ValueError):
    """An upload that cannot be used; its message names the file and the fix."""


def keep_upload(files: list[Path], runs_dir: Path) -> tuple[Path, bool]:
    """Copy the uploaded files into <runs>/datasets/<digest>/; (what dataset.path names, held-out data beside it?).

    One file is kept under its own name and is dataset.path. A training file with its held-out file go into
    the folder as train.<ext> and validation.<ext>, the split names the datasets library reads from a folder:
    dataset.path is the folder, its `validation` split the evaluation split.
    """
    if not files:
        raise UploadError("data upload: no file received; pick a JSON, JSONL, CSV or Parquet file")
    names = [_safe_name(Path(f).name) for f in files]
    for name in names:
        if not name.lower().endswith(SUFFIXES):
            raise UploadError(
                f"data upload: {name} is not a data file; upload JSONL, JSON, CSV or Parquet (as dataset.path reads)"
            )
    if len(files) > 2 or len({Path(n).suffix.lower() for n in names}) > 1:
        raise UploadError(
            "data upload: upload one data file, or a training file with its held-out file of the same type "
            "(train.jsonl with eval.jsonl)"
        )
    kept = dict(zip(names, files))
    if len(files) == 2:
        train = _training_file(names)
        held_out = next(n for n in names if n != train)
        suffix = Path(train).suffix.lower()
        kept = {f"train{suffix}": kept[train], f"validation{suffix}": kept[held_out]}
    folder = _copy(kept, Path(runs_dir) / DATASETS_DIR)
    return (folder, True) if len(kept) == 2 else (folder / names[0], False)


def _copy(files: dict[str, Path], parent: Path) -> Path:
    """The files in a folder named by their names and contents (one already there is used as it is)."""
    digest = hashlib.sha256()
    for name, path in sorted(files.items()):
        digest.update(name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                digest.update(block)
    folder = parent / digest.hexdigest()[:16]
    if folder.is_dir():
        return folder
    parent.mkdir(parents=True, exist_ok=True)
    needed, free = sum(Path(p).stat().st_size for p in files.values()), shutil.disk_usage(parent).free
    if needed > free:
        raise UploadError(
            f"data upload: {needed / 2**20:.0f} MiB do not fit the {free / 2**20:.0f} MiB free in {parent}"
        )
    staging = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name, path in files.items():
        shutil.copyfile(path, staging / name)
    staging.replace(folder)  # a folder is there whole or not at all
    return folder


def _safe_name(name: str) -> str:
    cleaned = _UNSAFE.sub("_", name).lstrip(".")
    return cleaned[:100] or "data.jsonl"


def _training_file(names: list[str]) -> str:
    """Of two files, the one that is not named as held-out data."""
    training = [n for n in names if not _words(n) & set(HELD_OUT_NAMES)]
    if len(training) != 1:
        raise UploadError(
            f"data upload: of {' and '.join(names)}, which is the training data? Name the held-out file for its "
            f"split ({', '.join(HELD_OUT_NAMES)}), e.g. train.jsonl with eval.jsonl"
        )
    return training[0]


def _words(name: str) -> set[str]:
    return set(re.split(r"[^a-z]+", Path(name).stem.lower()))


def first_row_columns(path: Path) -> list[str] | None:
    """The columns of a JSON/JSONL/CSV file's first row; None where they cannot be read without the datasets library."""
    suffix = path.suffix.lower()
    try:
        with open(path, encoding="utf-8") as f:
            if suffix == ".csv":
                return next(csv.reader(f), None)
            if suffix == ".jsonl":
                line = next((line for line in f if line.strip()), "")
                row = json.loads(line) if line else None
            elif suffix == ".json" and path.stat().st_size <= 64 * 2**20:
                data = json.load(f)
                row = data[0] if isinstance(data, list) and data else None
            else:
                return None  # Parquet, or a JSON file too large to read whole in the panel
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return list(row) if isinstance(row, dict) else None


def format_of(columns: list[str] | None) -> str | None:
    """The row format whose default columns the data has (labelled answers, preference pairs, then messages,
    prompt-completion, alpaca, text, and prompts alone: the first whose columns are all there)."""
    if not columns:
        return None
    for name in ("unpaired-preference", "preference", "messages", "prompt-completion", "alpaca", "text", "prompt-only"):
        needed = [c.default for c in DATASET_FORMATS[name].columns if c.required]
        if all(column in columns for column in needed):
            return name
    return None


def dataset_changes(kept: Path, held_out: bool, objective: str = "sft") -> tuple[dict, str | None, list[str] | None]:
    """(the dataset fields that point the job at a kept upload, the format found or None, the columns read); the
    job's objective stays when it reads the format found (KTO reads pairs too), else the first that does."""
    train = next(kept.glob("train.*")) if held_out else kept
    columns = first_row_columns(train)
    found = format_of(columns)
    changes: dict = {
        "dataset.path": str(kept),
        "dataset.name": None,
        "dataset.split": "train",
        "dataset.eval_split": "validation" if held_out else None,  # a single file has no other split
    }
    if found:
        changes["dataset.format"] = found
        if found not in OBJECTIVE_FORMATS.get(objective, ()):
            changes["objective"] = next(o for o, formats in OBJECTIVE_FORMATS.items() if found in formats)
        changes.update({f"dataset.{c.field}": c.default for c in DATASET_FORMATS[found].columns})
    return changes, found, columns
