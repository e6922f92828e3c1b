"""The steps a job runs and what it does around them (evaluations, saves), for the speed model (backend/estimate/speed.py).

The steps come from training.max_steps, else from the dataset's row count (a local file's lines, or a hub
dataset in KNOWN_DATASET_ROWS) x epochs / global batch. The global batch counts the GPUs that share a
sequence (strategy.sequence_parallel) once: `Schedule.at` recounts the steps for an option with another
number of GPUs per sequence. With the rows' lengths measured (the dataset preview's stats), the schedule
carries how they fill a micro batch (backend/estimate/speed_data.py), and packed rows count as the fewer sequences
they make.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from tunedeck.backend.estimate.speed_data import DataShape, measured_shape
from tunedeck.backend.spec import flat_values
from tunedeck.backend.spec.applies import applies
from tunedeck.backend.spec.mix import mix_sources

# Row counts of hub datasets the presets use, from their dataset cards.
KNOWN_DATASET_ROWS = {
    "timdettmers/openassistant-guanaco": (9846, "https://huggingface.co/datasets/timdettmers/openassistant-guanaco"),
}


@dataclass(frozen=True)
class Schedule:
    """What the job runs around its steps, read from the spec (and the dataset's size when known)."""

    grad_accum: int
    steps: int | None  # optimizer steps, None when unknown
    steps_source: str  # how they were counted, in words
    eval_passes: int = 0
    eval_rows: int = 0
    saves: int = 0
    train_rows: int = 0  # the dataset's rows when known, else the rows the steps read
    sequence_parallel: int = 1  # GPUs per sequence the steps were counted with
    data: DataShape | None = None  # how measured rows fill a micro batch; None: not measured
    origin: Any = field(default=None, compare=False, repr=False)  # (spec, rows, rows_source, lengths) to recount

    def at(self, sequence_parallel: int) -> Schedule:
        """The same job's schedule with `sequence_parallel` GPUs per sequence: a smaller global batch, more steps."""
        if sequence_parallel == self.sequence_parallel or self.origin is None:
            return self
        spec, rows, rows_source, lengths = self.origin
        return schedule_of(spec, rows, rows_source, sequence_parallel=sequence_parallel, lengths=lengths)


def schedule_of(
    spec, rows: int | None, rows_source: str = "", *, sequence_parallel: int | None = None, lengths: dict | None = None
) -> Schedule:
    """The job's steps, evaluations and saves; rows: training rows when known. sequence_parallel: GPUs per
    sequence, when not the job's own (an advisor option's); lengths: the dataset preview's length stats of this
    job's data (backend/data/preview.py), when measured."""
    t = spec.training
    data = data_shape(spec, lengths)
    sp = spec.sequence_parallel if sequence_parallel is None else sequence_parallel
    global_batch = spec.global_batch_size  # the GPUs of a sequence read one row: the data-parallel size counts
    if sp != spec.sequence_parallel:
        global_batch = (
            t.per_device_train_batch_size * t.gradient_accumulation_steps * max(1, spec.launch.num_processes // sp)
        )
    if t.max_steps > 0:
        steps, source = t.max_steps, f"training.max_steps = {t.max_steps}"
    elif rows:
        answers = spec.grpo.num_generations if spec.objective == "grpo" else 1  # GRPO: a batch row is one answer
        sequences = rows * answers
        each = f" x {answers} answers" if answers > 1 else ""
        if data is not None and data.rows_per_sequence > 1:  # packed: several rows a sequence
            sequences = math.ceil(rows / data.rows_per_sequence)
            each = f" packed into {sequences:,} sequences"
        per_epoch = math.ceil(sequences / global_batch)
        steps = math.ceil(per_epoch * t.num_train_epochs)
        source = f"{rows:,} rows{rows_source}{each} x {t.num_train_epochs:g} epochs / global batch {global_batch}"
    else:
        steps, source = None, "unknown: set training.max_steps, or use a local dataset file"
    eval_rows = _slice_rows(spec.dataset.eval_split, rows) if spec.dataset.eval_split else 0
    evals = steps // (t.eval_steps or t.logging_steps) if steps and eval_rows else 0
    saves = (steps // t.save_steps + 1) if steps else 0  # and the final save
    return Schedule(
        grad_accum=t.gradient_accumulation_steps,
        steps=steps,
        steps_source=source,
        eval_passes=evals,
        eval_rows=eval_rows,
        saves=saves,
        train_rows=rows or (steps or 0) * global_batch,
        sequence_parallel=sp,
        data=data,
        origin=(spec, rows, rows_source, lengths),
    )


def data_shape(spec, lengths: dict | None) -> DataShape | None:
    """How this SFT job's measured rows fill a micro batch (None when not measured, or not SFT)."""
    if spec.objective != "sft" or not lengths:
        return None
    values = flat_values(spec)
    packing = spec.dataset.packing and applies("dataset.packing", values)
    grouped = spec.training.group_by_length and applies("training.group_by_length", values)
    return measured_shape(lengths, packing, grouped)


def _slice_rows(split: str, rows: int | None) -> int:
    """Rows of a sliced split such as train[95%:] or train[:200] (0 when it cannot be told)."""
    match = re.fullmatch(r"\w+\[(-?\d*)(%?):(-?\d*)(%?)\]", split.replace(" ", ""))
    if not match or not rows:
        return 0
    start, start_pct, end, end_pct = match.groups()
    bound = lambda v, pct, default: default if v == "" else rows * int(v) // 100 if pct else int(v)  # noqa: E731
    lo, hi = bound(start, start_pct, 0), bound(end, end_pct, rows)
    lo, hi = (lo + rows if lo < 0 else lo), (hi + rows if hi < 0 else hi)
    return max(0, min(hi, rows) - max(0, lo))


def dataset_rows(spec) -> tuple[int | None, str]:
    """(training rows, where the count comes from) of a local JSONL/CSV file or a known hub dataset, with the rows
    of each dataset.mix source (its #ROWS, else its own count); unknown when any count is."""
    rows, source = _rows_of(spec.dataset.path)
    if rows is None:
        return None, ""
    for mixed in mix_sources(spec.dataset.mix):
        more = mixed.rows if mixed.rows is not None else _rows_of(mixed.path)[0]
        if more is None:
            return None, ""
        rows += more
        source += f" + {more:,} mixed in from {Path(mixed.path).name}"
    return rows, source


def _rows_of(dataset: str) -> tuple[int | None, str]:
    try:
        path = Path(dataset).expanduser()
        if path.is_file() and path.suffix.lower() in (".jsonl", ".csv"):
            stat = path.stat()
            lines = _count_lines(str(path), stat.st_size, stat.st_mtime_ns)
            return (lines - 1 if path.suffix.lower() == ".csv" else lines), f" in {path.name}"
    except (OSError, RuntimeError):  # a name too long, an unknown ~user, a file that vanished: count unknown
        return None, ""
    known = KNOWN_DATASET_ROWS.get(dataset)
    if known:
        return known[0], f" ({dataset}'s dataset card)"
    return None, ""


@lru_cache(maxsize=32)
def _count_lines(path: str, size: int, mtime_ns: int) -> int:
    """Lines of a file (a last line without a newline counts), read once per version: the page asks on every change."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")
