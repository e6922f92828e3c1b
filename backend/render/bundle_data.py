"""The job's local files in a bundle that runs on other machines: small data files ride in its data/ folder,
the rest is named in its README.md with where to copy it.

A bundle used to name this machine's paths (an upload kept under the runs folder, a local model folder)
without carrying them or saying so, and a fresh cluster died at data loading (issue 31). Now:

- dataset.path and each local dataset.mix source, a data file or a folder of data files that is here, and the
  general-text check's own file (dataset.general_text), ride in data/ while they all stay within DATA_CAP_BYTES
  together; the bundle's job.yaml names it ./data/<name>, relative to the bundle's folder, where train_sft.py runs
  (launch.sh and slurm.sbatch start it there).
  Only the bundle's copy of the job is rewritten: Start runs the job as the form holds it, on this machine.
- everything else the job reads from this machine's disk (the model's folder, data over the cap or not here,
  a folder that holds more than data files, a reward function's file) is listed in README.md.

Only an absolute (or ~) path is this machine's: a relative one is taken from the run folder, which for a
bundle is its own folder. A name in data/ is the source's own name reduced to plain characters, so no
upload's name becomes a path outside data/; the files are copied into the bundle, never linked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tunedeck.backend.recipe import CUSTOM_REWARD, DATA_FILE_BUILDERS, GENERAL_TEXT_BUILTIN, MIX_ENTRY
from tunedeck.backend.render.bundle import render_bundle
from tunedeck.backend.render.carried import (
    DATA_CAP_BYTES,
    DATA_CAP_WORDS,
    DATA_DIR,
    Carried,
    DataPlan,
    LeftBehind,
    size_words,
)
from tunedeck.backend.render.carried import code_span as _code
from tunedeck.backend.render.launch import JOB_FILE
from tunedeck.backend.spec import JobSpec, SpecError, parse_spec, spec_from_yaml, spec_to_dict
from tunedeck.backend.spec.untrusted import shown

MAX_FILES = 1000  # in a carried folder; more is a dataset for shared storage (and the panel plans on every edit)
_UNPLAIN = re.compile(r"[^A-Za-z0-9._-]+")
PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # a name the bundle keeps as it is
NOT_HERE = "not on this machine: it must be at this path where the job trains"


def bundle_files(spec: JobSpec) -> tuple[dict[str, str], DataPlan]:
    """The bundle of `spec` as it travels, and what it carries (plan.files: bundle path -> file here) and leaves:
    job.yaml names the carried files in data/, README.md lists both. A job that reads nothing from this
    machine's disk gets the bundle render_bundle gives."""
    return _travelling(spec, None)


def carry(files: dict[str, str]) -> tuple[dict[str, str], DataPlan]:
    """bundle_files of a rendered bundle's job (its job.yaml); files whose job reads nothing from this machine's
    disk, or that have no readable job.yaml, go as they are."""
    try:
        spec = spec_from_yaml(files[JOB_FILE])
    except (KeyError, SpecError):
        return files, DataPlan()
    return _travelling(spec, files)


def _travelling(spec: JobSpec, files: dict[str, str] | None) -> tuple[dict[str, str], DataPlan]:
    plan = plan_data(spec)
    if not plan.carried and not plan.left:
        return (render_bundle(spec) if files is None else files), plan
    return render_bundle(carried_spec(spec, plan), plan), plan


def plan_data(spec: JobSpec) -> DataPlan:
    """What the bundle carries of the job's local files (dataset.path first, then dataset.mix, within the cap
    together) and what it leaves: the model's folder, the data it does not carry, reward files."""
    carried: dict[str, Carried] = {}  # by the file's real path: a source named twice rides once
    left: list[LeftBehind] = []
    room = DATA_CAP_BYTES
    names: set[str] = set()
    model = spec.model.name_or_path
    if (here := _on_this_machine(model)) is not None:
        left.append(_model_left(model, here))
    sources = [("dataset.path", spec.dataset.path)]
    sources += [("dataset.mix", m["path"].strip()) for e in spec.dataset.mix if (m := MIX_ENTRY.fullmatch(e.strip()))]
    if _own_general_text(spec):
        sources.append(("dataset.general_text", str(spec.dataset.general_text)))
    for field, source in sources:
        here = _on_this_machine(source)
        if here is None or _key(here) in carried:
            continue
        found = _carried(field, source, here, room, names)
        if isinstance(found, Carried):
            carried[_key(here)] = found
            room -= found.size
        else:
            left.append(LeftBehind(field, source, found, _if_here(here)))
    if spec.objective == "grpo":
        for entry in spec.grpo.rewards:
            if custom := CUSTOM_REWARD.match(entry):
                file = Path(custom["file"])
                why = "your reward function's file (train_sft.py loads it from this absolute path)"
                left.append(LeftBehind("grpo.rewards", str(file), why if _if_here(file) else NOT_HERE, _if_here(file)))
    return DataPlan(tuple(carried.values()), tuple(left))


def carried_spec(spec: JobSpec, plan: DataPlan) -> JobSpec:
    """The job as the bundle runs it: each carried source named by its path in the bundle (./data/...)."""
    moved = {  # (a carried source is always a path on this machine)
        _key(here): item.job_path for item in plan.carried if (here := _on_this_machine(item.source)) is not None
    }

    def where(source: str) -> str:
        here = _on_this_machine(source)
        return moved.get(_key(here), source) if here is not None else source

    def entry_where(entry: str) -> str:
        found = MIX_ENTRY.fullmatch(entry.strip())
        if not found or where(found["path"].strip()) == found["path"].strip():
            return entry
        return where(found["path"].strip()) + entry.strip()[found.end("path") :]

    data = spec_to_dict(spec)
    data["dataset"]["path"] = where(spec.dataset.path)
    data["dataset"]["mix"] = [entry_where(entry) for entry in spec.dataset.mix]
    if _own_general_text(spec):
        data["dataset"]["general_text"] = where(str(spec.dataset.general_text))
    return parse_spec(data)


def _own_general_text(spec: JobSpec) -> bool:
    """Whether the job's general-text check reads a file of the user's (the built-in sample rides as a file)."""
    return spec.dataset.general_text not in (None, GENERAL_TEXT_BUILTIN)


def _on_this_machine(source: str) -> Path | None:
    """The path an absolute (or ~) model or dataset source names here; None for a hub id or a relative path."""
    try:
        path = Path(source).expanduser()
    except RuntimeError:  # ~user of no user here
        return None
    return path if path.is_absolute() else None


def _key(path: Path) -> str:
    return os.path.realpath(path)


def _if_here(path: Path) -> str | None:
    """The path, where it is on this machine (None also where a folder above it cannot be read)."""
    try:
        return str(path) if path.exists() else None
    except OSError:
        return None


def _model_left(model: str, here: Path) -> LeftBehind:
    try:
        folder = here.is_dir()
    except OSError:  # a folder above it that cannot be read
        folder = False
    if not folder:
        why = "a file here, not the model's folder" if _if_here(here) else NOT_HERE
        return LeftBehind("model.name_or_path", model, f"the base model's folder, {why}", _if_here(here))
    size = _tree_size(here)
    said = f" ({size_words(size)})" if size is not None else ""
    return LeftBehind("model.name_or_path", model, f"the base model's folder{said}", str(here))


def _carried(field: str, source: str, here: Path, room: int, names: set[str]) -> Carried | str:
    """The source as the bundle carries it, or why it does not."""
    try:
        prose = field == "dataset.general_text"  # a plain-text file of any name
        if here.is_dir() and prose:
            return "a folder, not the plain-text file the general-text check reads"
        if here.is_dir():
            files = _folder_files(here)
            if isinstance(files, str):
                return files
            name = _unique(f"{DATA_DIR}/{_plain(here.name)}", names)
            inside = [(f"{name}/{rel.as_posix()}", path) for rel, path in files]
        elif here.is_file():
            if not prose and here.suffix.lower() not in DATA_FILE_BUILDERS:
                return "not a JSON, JSONL, CSV or Parquet file (train_sft.py reads only those)"
            name = _unique(f"{DATA_DIR}/{_plain(here.name)}", names)
            inside = [(name, here)]
        else:
            return NOT_HERE if not here.exists() else "neither a file nor a folder"
        size = sum(path.stat().st_size for _, path in inside)
    except OSError as exc:
        return f"cannot be read here ({exc.strerror or exc})"
    if size > room:
        cap = DATA_CAP_WORDS if room == DATA_CAP_BYTES else f"{size_words(room)} left of the {DATA_CAP_WORDS}"
        return f"{size_words(size)}: more than the {cap} of data a bundle carries"
    names.add(name)
    return Carried(field, source, name, tuple(inside), size)


def _folder_files(folder: Path) -> list[tuple[Path, Path]] | str:
    """(path inside the folder, file) of each data file in it, or why the folder does not ride as it is.

    The datasets library reads a folder by its files' names (train.jsonl, test/...) and skips hidden ones, as
    the bundle does; a folder that also holds other files (a loading script, a README.md with its own splits),
    links, or names the bundle would have to change would read otherwise in the bundle: it stays here."""
    found = []
    for root, dirs, files in os.walk(folder, onerror=_raise):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted([*dirs, *(f for f in files if not f.startswith("."))]):
            path = Path(root, name)
            if path.is_symlink():
                return "a folder holding a link; the bundle carries plain data files only"
            if not PLAIN_NAME.match(name):
                return f"a folder holding a name other than letters, digits, '.', '_' and '-' ({_code(shown(name))})"
            if name in files and (not path.is_file() or path.suffix.lower() not in DATA_FILE_BUILDERS):
                return f"a folder holding other files than JSON, JSONL, CSV or Parquet data ({_code(shown(name))})"
            if name in files:
                found.append((path.relative_to(folder), path))
        if len(found) > MAX_FILES:
            return f"a folder of more than {MAX_FILES} files"
    return found or "a folder without data files"


def _raise(error: OSError) -> None:
    raise error  # os.walk skips a folder it cannot read unless told; a folder carried in part would mislead


def _tree_size(folder: Path) -> int | None:
    """The bytes of the files under `folder`; None where it holds too many to add up on every edit."""
    total, count = 0, 0
    for root, _, files in os.walk(folder):
        for name in files:
            count += 1
            if count > 10 * MAX_FILES:
                return None
            try:
                total += Path(root, name).stat().st_size
            except OSError:
                pass
    return total


def _plain(name: str) -> str:
    """A file's own name as a plain one: letters, digits, '.', '_' and '-', starting with a letter or digit, at
    most 100 characters, its data suffix kept (train_sft.py picks the reader by it)."""
    suffix = Path(name).suffix if Path(name).suffix.lower() in DATA_FILE_BUILDERS else ""
    stem = _UNPLAIN.sub("_", name[: len(name) - len(suffix)]).lstrip("._-")[: 100 - len(suffix)] or "data"
    return stem + suffix.lower()


def _unique(name: str, taken: set[str]) -> str:
    """`name`, or name-2, name-3... (before the suffix) where another source took it."""
    suffix = Path(name).suffix if Path(name).suffix.lower() in DATA_FILE_BUILDERS else ""
    head, _, last = name[: len(name) - len(suffix)].rpartition("/")
    number = 1
    while name in taken:
        number += 1
        name = f"{head}/{last[: 94 - len(suffix)]}-{number}{suffix}"
    return name
