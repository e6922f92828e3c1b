"""Data files uploaded from the page, kept where runs read them (no datasets import: the panel stays light).

    <runs>/datasets/<digest>/<file name>                       one file, under its own name
    <runs>/datasets/<digest>/train.<ext>, validation.<ext>     a training file with its held-out file

A browser behind an SSH tunnel has no other way to put its data on the server. A held-out file
uploaded with the training file becomes the folder's `validation` split: the job's eval split, for
eval loss during training and for Evaluate. The same files uploaded again land in the same folder. A Slurm node reads them where it reads the runs folder. The row format is taken
from the training file's columns when they are one format's own (dataset.format's default columns).

Nothing is kept that training cannot read (backend/data/sniff.py): each file's start is read first, at a bounded
cost, then the whole text in the pass that digests it; a refusal names the file, what it is and the fix, and
leaves nothing under the runs folder, so the dataset preview never measures it.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shutil
from pathlib import Path

from tunedeck.backend.data.sniff import BLOCK, NotData, TextScan, check_start, scan_for
from tunedeck.backend.recipe import DATA_FILE_BUILDERS
from tunedeck.backend.recipe.vocabulary import DATASET_FORMATS, OBJECTIVE_FORMATS
from tunedeck.backend.spec.problem import Problem
from tunedeck.backend.spec.untrusted import shown

DATASETS_DIR = "datasets"
SUFFIXES = tuple(DATA_FILE_BUILDERS)  # what train_sft.py reads as dataset.path
HELD_OUT_NAMES = ("eval", "test", "validation", "valid", "dev")  # as the datasets library names splits by file name
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_STEM = 100  # of a kept file's name, before its suffix


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
    for path in files:  # the name as uploaded: a long one keeps its suffix only until it is shortened
        if not Path(path).name.lower().endswith(SUFFIXES):
            raise UploadError(
                f"data upload: {shown(Path(path).name)} is not a data file; upload JSONL, JSON, CSV or Parquet "
                "(as dataset.path reads)"
            )
    names = [_safe_name(Path(f).name) for f in files]
    if len(files) > 2 or len({Path(n).suffix.lower() for n in names}) > 1:
        raise UploadError(
            "data upload: upload one data file, or a training file with its held-out file of the same type "
            "(train.jsonl with eval.jsonl)"
        )
    for path in files:  # the start of each file, at a bounded cost, before reading it whole
        try:
            check_start(Path(path), Path(path).name)
        except NotData as exc:
            raise UploadError(f"data upload: {exc}") from None
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
        scan = scan_for(Path(path), Path(path).name)  # the whole text read once: its encoding and its lines
        with open(path, "rb") as f:
            for block in iter(lambda f=f: f.read(BLOCK), b""):
                digest.update(block)
                _scanned(scan, block)
        _scanned(scan, None)
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
    try:
        for name, path in files.items():
            shutil.copyfile(path, staging / name)
        staging.replace(folder)  # a folder is there whole or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # a copy that failed (a full disk) leaves nothing behind
    return folder


def _scanned(scan: TextScan | None, block: bytes | None) -> None:
    """Feed one block to a file's scan (None: the file's end); what it finds is the upload's refusal."""
    try:
        if scan is not None and block is not None:
            scan.feed(block)
        elif scan is not None:
            scan.finish()
    except NotData as exc:
        raise UploadError(f"data upload: {exc}") from None


def _safe_name(name: str) -> str:
    """A short name of letters, digits, '.', '_' and '-' that keeps the data suffix (checked before)."""
    suffix = next(s for s in SUFFIXES if name.lower().endswith(s))
    stem = _UNSAFE.sub("_", name[: -len(suffix)]).lstrip("._")
    return (stem[:MAX_STEM] or "data") + suffix


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
    """The columns of a JSON/JSONL/CSV file's first row (read from its start only); None for Parquet, or where the
    start of the file is not data (an upload is refused before it gets here)."""
    try:
        return check_start(path, path.name)
    except (OSError, NotData):
        return None


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


HOLD_OUT_PERCENT = 5  # the share of an uploaded file's rows a Fix holds out for evaluation
_ROWS_COUNTED_UP_TO = 64 * 1024 * 1024  # bytes: a bigger upload's rows are not counted on every edit


def held_out_offer(spec, runs_dir: Path) -> Problem | None:
    """A warning with its Fix when the job trains on an uploaded file and holds nothing out: without held-out
    rows a run has no eval loss, and Evaluate afterwards could only use rows it trained on (issue 31). The Fix
    keeps the last HOLD_OUT_PERCENT% of the file apart with the datasets library's split slices."""
    data = spec.dataset
    if data.eval_split or not data.path:
        return None
    path = Path(data.path).expanduser()
    uploads = Path(runs_dir).resolve() / DATASETS_DIR
    if not path.is_file() or uploads not in path.resolve().parents:
        return None
    keep = 100 - HOLD_OUT_PERCENT
    rows = _rows(path)
    held = f"about {max(1, rows * HOLD_OUT_PERCENT // 100):,} of its {rows:,} rows" if rows else f"{HOLD_OUT_PERCENT}%"
    return Problem(
        "warning",
        "dataset.eval_split",
        f"{path.name} was uploaded without a held-out file: the run will show no eval loss, and Evaluate could then "
        f"only use rows it trained on; hold out {held} for evaluation (or upload a held-out file with it)",
        {"dataset.split": f"{data.split or 'train'}[:{keep}%]", "dataset.eval_split": f"train[{keep}%:]"},
    )


@functools.lru_cache(maxsize=16)
def _rows_of(path: str, size: int, mtime: float) -> int:
    if path.endswith((".jsonl", ".csv")):
        with open(path, "rb") as f:
            lines = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
        return max(0, lines - path.endswith(".csv"))
    return 0


def _rows(path: Path) -> int:
    """The rows of a JSONL or CSV upload (0: not counted), counted once per version of the file."""
    stat = path.stat()
    return _rows_of(str(path), stat.st_size, stat.st_mtime) if stat.st_size <= _ROWS_COUNTED_UP_TO else 0
