"""dataset.mix: more datasets mixed into the training rows, each in the job's format and columns or in another
SFT format its columns name (the recipe's in_job_format converts it).

An entry is SOURCE[@CONFIG][:SPLIT][#ROWS]: a local file or folder, or a hub dataset id, with the
hub configuration, the split (default train; slices work) and how many rows to take (fewer than the
source has: a seeded sample; more: the source repeated, then sampled; none: all of them), like
ms-swift's `dataset#N`. The rows join the main dataset's training rows, which the trainer shuffles;
with dataset.eval_split, each source's rows of that split join the held-out rows. An SFT run without packing logs
each source's training and held-out loss (backend/recipe/source_loss.py), and Evaluate scores each source's rows. The pattern is the recipe's (backend/recipe/data.py), which
reads the entries in every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunedeck.backend.recipe.data import MIX_ENTRY

MAX_ROWS = 100_000_000


@dataclass(frozen=True)
class MixSource:
    path: str
    config: str | None
    split: str
    rows: int | None  # None: all of the split's rows

    def __str__(self) -> str:
        return (
            self.path
            + (f"@{self.config}" if self.config else "")
            + f":{self.split}"
            + (f"#{self.rows}" if self.rows is not None else "")
        )


def parse_entry(entry: str) -> MixSource:
    """One entry as a source, or ValueError saying what is wrong with it."""
    match = MIX_ENTRY.fullmatch(entry.strip())
    if not match or not match["path"].strip():
        raise ValueError(f"{entry[:60]!r} is not SOURCE[@CONFIG][:SPLIT][#ROWS], e.g. /data/general.jsonl#2000")
    rows = int(match["rows"]) if match["rows"] else None
    if rows is not None and not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"{entry[:60]!r}: #ROWS must be 1 to {MAX_ROWS:,}")
    return MixSource(match["path"].strip(), match["config"], (match["split"] or "train").strip(), rows)


def rows_key(entry: str) -> tuple[str, str | None, str]:
    """What makes two entries the same rows, whatever their count: source, configuration and split."""
    source = parse_entry(entry)
    return source.path, source.config, source.split


def entries_from_text(value: Any) -> Any:
    """The form's box (entries joined by ", ") as a list; a list or anything else goes on as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def mix_sources(entries: list[str]) -> list[MixSource]:
    return [parse_entry(entry) for entry in entries]
