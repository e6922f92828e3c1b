"""A resumed run's forebears: the runs whose checkpoints it continues, so its chart can draw their loss before its own.

A resumed run is a new run folder (backend/runs/resume.py) whose job.yaml sets training.resume_from_checkpoint and,
as output_dir, the output folder of the run it continues; its records begin at the step after that checkpoint
(its start record's resumed_from_step). The run it continues is the newest earlier run that wrote to the same
output folder; when that one was itself resumed, the chain goes on. All of it is read from the run folders,
not from notes.json (whose "Continues run ..." the user may rewrite).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from tunedeck.backend.runs.checkpoints import output_dir
from tunedeck.backend.runs.job_file import UnreadableJob
from tunedeck.backend.runs.manager import RunError, RunManager
from tunedeck.backend.runs.records import LogRecord, RunRecords
from tunedeck.backend.spec import JobSpec

MAX_CHAIN = 20  # resumes of resumes followed back, at most


def resumes(job: JobSpec | UnreadableJob) -> bool:
    """Whether a run's job continues from a checkpoint in its output folder."""
    return isinstance(job, JobSpec) and bool(job.training.resume_from_checkpoint)


def forebears(manager: RunManager, run_id: str) -> list[str]:
    """The runs `run_id` continues, newest first: the run whose output folder it resumed in, that run's, and so on."""
    ids = sorted(r.run_id for r in manager.list_runs())
    outputs: dict[str, Path | None] = {}  # each job.yaml read once

    def output_of(rid: str) -> Path | None:
        if rid not in outputs:
            try:
                job = manager.job(rid)
                outputs[rid] = output_dir(manager.run_dir(rid), job) if isinstance(job, JobSpec) else None
            except (RunError, OSError, ValueError):
                outputs[rid] = None
        return outputs[rid]

    chain, current = [], run_id
    while len(chain) < MAX_CHAIN and resumes(manager.job(current)):
        folder = output_of(current)
        parent = next((rid for rid in reversed(ids) if rid < current and output_of(rid) == folder), None)
        if parent is None:
            break
        chain.append(parent)
        current = parent
    return chain


def earlier_records(chain: list[str], read: Callable[[str], RunRecords], resumed_from: int | None) -> list[LogRecord]:
    """The log records before the resumed part, oldest first: each forebear's up to the step the runs after it
    resumed from (all of its records while none of them has said yet: no start record)."""
    segments, limit = [], resumed_from
    for rid in chain:  # newest first
        run = read(rid)
        segments.append([r for r in run.records if limit is None or (r.get("step") or 0) <= limit])
        step = (run.start or {}).get("resumed_from_step")
        if isinstance(step, int) and (limit is None or step < limit):
            limit = step
    return [record for segment in reversed(segments) for record in segment]


class Lineage:
    """The forebears of each run shown, found once per run (a run's forebears never change); shared by sessions."""

    def __init__(self, manager: RunManager):
        self.manager = manager
        self._chains: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def records_before(
        self, run_id: str, job: JobSpec | UnreadableJob | None, run: RunRecords, read: Callable[[str], RunRecords]
    ) -> list:
        """The forebears' log records before `run` (the records of run `run_id`, whose job is `job`); [] for a run
        that resumed nothing (or whose job is not read yet)."""
        if job is None or not resumes(job):
            return []
        with self._lock:
            chain = self._chains.get(run_id)
        if chain is None:
            chain = forebears(self.manager, run_id)
            with self._lock:
                self._chains[run_id] = chain
        return earlier_records(chain, read, (run.start or {}).get("resumed_from_step"))
