"""The job's local model, data and reward files, checked from where its run will work.

train.py's own checks (it runs them again at start, for bundles run without tunedeck), so the
check before launch and the run say the same words; what differs is where the job runs:

- on this machine: every problem is an error (Start would refuse it);
- on other machines (a Slurm job, a GPU job prepared on a machine without one): a path that
  does not exist here is a warning, since it must exist there, not here; a file that exists here
  and is wrong is still an error.

The panel runs these on every edit, so the first rows of a data file are read once per file
version: the answer is kept by the stat of every path the check reads (INPUT_CACHE_SIZE answers).
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from collections import OrderedDict
from pathlib import Path

from tunedeck.backend import recipe
from tunedeck.backend.spec.problem import Problem, error, warning

INPUT_CACHE_SIZE = 64
_cache: OrderedDict[tuple, list[tuple[str, str]]] = OrderedDict()
_cache_lock = threading.Lock()


def input_problems(job: dict, base: Path, elsewhere: str | None) -> list[Problem]:
    """Problems of the job's local inputs (job: the spec as a dict; base: the folder relative paths start from).

    `elsewhere`: None when the job runs on this machine, else the machines it runs on, in words ("the cluster's
    nodes"): a missing path is then a warning that it must exist there."""
    job = {**job, "model": dict(job.get("model") or {}), "dataset": dict(job.get("dataset") or {})}
    missing = _take_missing(job, base, elsewhere) if elsewhere else []
    gone = {p.message.split(" does not exist ")[0] for p in missing if p.field == "grpo.rewards"}
    return [
        error(field, message)
        for field, message in _checked(job, base)
        if not (field == "grpo.rewards" and message.split(" cannot be read ")[0] in gone)  # its warning says it
    ] + missing


def _take_missing(job: dict, base: Path, elsewhere: str) -> list[Problem]:
    """Warnings for the paths that do not exist here; the model, data and mixed-in files among them are taken out
    of `job`, so that train's checks, run next, look only at what is here."""
    found = []

    def gone(field: str, source: str, path: str) -> None:
        relative = "" if Path(path).expanduser().is_absolute() else " (taken from the run's folder there)"
        found.append(warning(field, f"{source} does not exist on this machine; it must exist on {elsewhere}{relative}"))

    model = str(job["model"].get("name_or_path") or "")
    if model and recipe.looks_local(model) and not _here(base, model).exists():
        gone("model.name_or_path", model, model)
        job["model"]["name_or_path"] = ""
    dataset = job["dataset"]
    source = str(dataset.get("path") or "")
    if source and _data_path(source) and not _here(base, source).exists():
        gone("dataset.path", source, source)
        dataset["path"] = ""
    kept = []
    for entry in dataset.get("mix") or []:
        path = recipe.MIX_ENTRY.fullmatch(str(entry).strip())
        if path and _data_path(path["path"].strip()) and not _here(base, path["path"].strip()).exists():
            gone("dataset.mix", f"{str(entry).strip()!r}: {path['path'].strip()}", path["path"].strip())
        else:
            kept.append(entry)
    dataset["mix"] = kept
    sample = recipe.general_text_sample(job, base)
    if sample is not None and dataset["general_text"] != recipe.GENERAL_TEXT_BUILTIN and not sample.exists():
        gone("dataset.general_text", dataset["general_text"], dataset["general_text"])
        dataset["general_text"] = None
    rewards = (job.get("grpo") or {}).get("rewards") if job.get("objective") == "grpo" else None
    for entry in rewards or []:  # reward files are absolute paths
        custom = recipe.CUSTOM_REWARD.match(str(entry))
        if custom and not Path(custom["file"]).exists():
            gone("grpo.rewards", custom["file"], custom["file"])
    return found


def _here(base: Path, source: str) -> Path:
    return base / Path(source).expanduser()


def _data_path(source: str) -> bool:
    """Whether a dataset source names a local file or folder (else a hub id: nothing to check here)."""
    return recipe.looks_local(source) or Path(source).suffix.lower() in recipe.DATA_FILE_BUILDERS


def _checked(job: dict, base: Path) -> list[tuple[str, str]]:
    """recipe.input_problems, kept by the stat of every path it reads: a data file's rows are read once per version."""
    read = (  # what recipe.input_problems reads of the job
        job["model"].get("name_or_path"),
        job["dataset"],
        job.get("objective"),
        (job.get("grpo") or {}).get("rewards"),
        (job.get("training") or {}).get("use_liger_kernel"),
    )
    key = (
        json.dumps(read, default=str),
        str(base),
        _stats(job, base),
    )
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    found = recipe.input_problems(job, base)
    with _cache_lock:
        _cache[key] = found
        while len(_cache) > INPUT_CACHE_SIZE:
            _cache.popitem(last=False)
    return found


def _stats(job: dict, base: Path) -> tuple:
    """(path, what its stat says) of each path the input checks read; liger-kernel's presence."""
    model = _here(base, str(job["model"].get("name_or_path") or ""))
    paths = [model, model / "config.json", _here(base, str(job["dataset"].get("path") or ""))]
    for entry in job["dataset"].get("mix") or []:
        if match := recipe.MIX_ENTRY.fullmatch(str(entry).strip()):
            paths.append(_here(base, match["path"].strip()))
    for entry in (job.get("grpo") or {}).get("rewards") or []:
        if custom := recipe.CUSTOM_REWARD.match(str(entry)):
            paths.append(Path(custom["file"]))
    if (sample := recipe.general_text_sample(job, base)) is not None:
        paths.append(sample)
    liger = bool((job.get("training") or {}).get("use_liger_kernel")) and importlib.util.find_spec("liger_kernel")
    return (*map(_stat, paths), bool(liger))


def _stat(path: Path) -> tuple:
    try:
        found = os.stat(path)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return (str(path), None)
    return (str(path), found.st_mtime_ns, found.st_size, found.st_ino, found.st_mode)
