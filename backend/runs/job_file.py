"""A run folder's job.yaml, read back as the JobSpec it was launched with.

The run side reads the job typed, so every reader gets the spec's own defaults (one `lora.r`, one
`model.dtype`) instead of stating its own fallback. A job.yaml that is not a job of this version
(missing, damaged, or written by another version of tunedeck, whose fields differ) is an
`UnreadableJob`: the listing still lists its run, and the page and the CLI say why in words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tunedeck.backend.render.launch import JOB_FILE
from tunedeck.backend.spec import JobSpec, SpecError, parse_spec


@dataclass(frozen=True)
class UnreadableJob:
    """A job.yaml that does not read as a job of this version."""

    path: Path
    reason: str  # in words, naming the fields: for the page and the CLI
    raw: dict = field(default_factory=dict, hash=False)  # what the file holds as YAML ({}: nothing readable)

    def explained(self) -> str:
        return f"{self.path} is not a job this version of tunedeck can read: {self.reason}"


def read_job(run_dir: Path) -> JobSpec | UnreadableJob:
    """The run's job.yaml as its JobSpec, or why it cannot be read as one."""
    path = Path(run_dir) / JOB_FILE
    raw = _load(path)
    if isinstance(raw, UnreadableJob):
        return raw
    try:
        return parse_spec(raw)
    except SpecError as exc:  # another version's fields, or a value this version refuses
        fields = "; ".join(f"{p.field or 'job'}: {p.message}" for p in exc.problems)
        return UnreadableJob(path, f"written by another version of tunedeck, or edited ({fields})", raw)


def job_fields(run_dir: Path) -> dict:
    """The run's job.yaml as the file spells it ({} when it does not read as YAML): for comparing two runs' files
    field by field (backend/runs/compare.py), where a field one version lacks shows as missing, not as the
    default this version would fill in."""
    raw = _load(Path(run_dir) / JOB_FILE)
    return raw.raw if isinstance(raw, UnreadableJob) else raw


def _load(path: Path) -> dict | UnreadableJob:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return UnreadableJob(path, "the file is missing")
    except (OSError, ValueError, yaml.YAMLError) as exc:
        return UnreadableJob(path, f"the file could not be read as YAML ({type(exc).__name__})")
    if not isinstance(raw, dict):
        return UnreadableJob(path, "the file is not a YAML mapping of job fields")
    return raw
