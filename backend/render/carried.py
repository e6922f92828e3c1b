"""What a bundle carries of the job's local files, and what it leaves on the machine that made it.

Pure data: backend/render/bundle_data.py fills it from this machine's disk, bundle_readme.py lists it, and
zip_bundle / write_bundle copy the carried files into the bundle's data/ folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = "data"
# All carried files together: a bundle is downloaded whole through the browser, and a cluster job's data of
# more than this belongs on its shared storage anyway.
DATA_CAP_BYTES = 50 * 2**20
DATA_CAP_WORDS = "50 MiB"
# A bundle path of a carried file: data/ and plain names below it, none of them hidden, none of them `..`.
DATA_NAME = re.compile(r"^data(/[A-Za-z0-9][A-Za-z0-9._-]{0,99})+$")


@dataclass(frozen=True)
class Carried:
    """A local data file or folder of data files that rides in the bundle."""

    field: str  # dataset.path or dataset.mix
    source: str  # the path as the job names it on the machine that made the bundle
    name: str  # where it is in the bundle, e.g. data/train.jsonl (a file) or data/qa (a folder)
    files: tuple[tuple[str, Path], ...]  # (bundle path, file on this machine) of each file it holds
    size: int

    @property
    def job_path(self) -> str:
        """The path job.yaml names it by: relative to the bundle's folder, where train_sft.py runs."""
        return f"./{self.name}"


@dataclass(frozen=True)
class LeftBehind:
    """A local path the job reads that the bundle does not carry: it must be there where the job trains."""

    field: str  # model.name_or_path, dataset.path, dataset.mix or grpo.rewards
    path: str  # as job.yaml names it
    why: str  # what it is, and why it stays here
    here: str | None = None  # the path on this machine (~ expanded), None where it is not on this machine


@dataclass(frozen=True)
class DataPlan:
    carried: tuple[Carried, ...] = ()
    left: tuple[LeftBehind, ...] = ()

    @property
    def files(self) -> dict[str, Path]:
        """Every carried file: bundle path -> the file on this machine."""
        return {name: source for item in self.carried for name, source in item.files}


def size_words(size: int) -> str:
    """A size as people read it: 812 bytes, 3.4 KiB, 61.0 MiB, 13.5 GiB."""
    if size < 1024:
        return f"{size} bytes"
    value, unit = size / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def code_span(text: str) -> str:
    """Markdown inline code that holds any text: a fence longer than the text's own backtick runs."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
