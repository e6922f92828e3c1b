"""Runs: a job started as a run folder, followed, stopped, resumed, compared, swept and smoke-tested, on this
machine or on Slurm. The run folder is the bus: the detached supervisor (supervisor.py, a bare script) writes it,
everything here reads it.

The face: the panel and the CLI import these names from `tunedeck.backend.runs`, never its modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tunedeck.backend.runs.answers import answers_markdown, latest_answers
from tunedeck.backend.runs.backends import UNAVAILABLE, fetch_weights
from tunedeck.backend.runs.checkpoints import AfterError, list_weights, output_dir, select
from tunedeck.backend.runs.compare import differences_line, job_differences, shown_value
from tunedeck.backend.runs.folder import ACTIVE_STATES, LAUNCHER_LOG, LOGS_DIR, NOTES_FILE, rank_log
from tunedeck.backend.runs.job_file import UnreadableJob, job_fields, read_job
from tunedeck.backend.runs.lineage import Lineage
from tunedeck.backend.runs.manager import RunError, RunManager, RunStatus
from tunedeck.backend.runs.network import network_line
from tunedeck.backend.runs.notes import NAME_MAX_CHARS, NotesError, RunNotes, read_notes, write_notes
from tunedeck.backend.runs.preflight import job_problems, needs_gpus_here, refusal_text
from tunedeck.backend.runs.preflight import preflight as preflight_problems
from tunedeck.backend.runs.records import (
    HealthRecord,
    LogRecord,
    MetricsReader,
    RunRecords,
    is_number,
    read_records,
    source_label,
)
from tunedeck.backend.runs.reshape import Shape, reshaped
from tunedeck.backend.runs.resume import RESUMABLE_STATES, newest_checkpoint, resume_run
from tunedeck.backend.runs.slow_rank import slow_rank_line
from tunedeck.backend.runs.speed import Calibration, calibration, compare_run
from tunedeck.backend.runs.stacks import StacksError, dump_stacks
from tunedeck.backend.runs.startup import (
    TRAINING,
    behind_now,
    breakdown,
    live_phase,
    phase_now,
    read_phases,
    starting_phase,
)
from tunedeck.backend.runs.status import DAMAGED, deleted_path
from tunedeck.backend.runs.summary import (
    RunSummary,
    facts_line,
    format_clock,
    health_lines,
    measured_peaks,
    report,
    restart_cost,
    summarize,
)
from tunedeck.backend.runs.sweep import SweepError, combinations, label, preview, queue_sweep, sweep_specs
from tunedeck.backend.runs.tail import TextTail
from tunedeck.backend.runs.telemetry import (
    Machine,
    RunTelemetry,
    machine_line,
    missing_machines,
    telemetry_warnings,
)

if TYPE_CHECKING:  # the lazy names' types, for the type checker
    from tunedeck.backend.runs.smoke import SmokeError, is_smoke_job, smoke_verdict, start_smoke_run

# smoke.py runs as `python -m tunedeck.backend.runs.smoke` (it builds a tiny model in a subprocess): imported here
# eagerly, runpy would find it loaded already and run a second copy ("found in sys.modules ... unpredictable
# behaviour"). Its names come on first use instead (PEP 562).
_LAZY = {
    "SmokeError": "tunedeck.backend.runs.smoke",
    "is_smoke_job": "tunedeck.backend.runs.smoke",
    "smoke_verdict": "tunedeck.backend.runs.smoke",
    "start_smoke_run": "tunedeck.backend.runs.smoke",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = [
    "ACTIVE_STATES",
    "DAMAGED",
    "LAUNCHER_LOG",
    "LOGS_DIR",
    "NAME_MAX_CHARS",
    "NOTES_FILE",
    "RESUMABLE_STATES",
    "TRAINING",
    "UNAVAILABLE",
    "AfterError",
    "Calibration",
    "HealthRecord",
    "Lineage",
    "LogRecord",
    "Machine",
    "MetricsReader",
    "NotesError",
    "RunError",
    "RunManager",
    "RunNotes",
    "RunRecords",
    "RunStatus",
    "RunSummary",
    "RunTelemetry",
    "Shape",
    "SmokeError",
    "StacksError",
    "SweepError",
    "TextTail",
    "UnreadableJob",
    "answers_markdown",
    "behind_now",
    "breakdown",
    "calibration",
    "combinations",
    "compare_run",
    "deleted_path",
    "differences_line",
    "dump_stacks",
    "facts_line",
    "fetch_weights",
    "format_clock",
    "health_lines",
    "is_number",
    "is_smoke_job",
    "job_differences",
    "job_fields",
    "job_problems",
    "label",
    "latest_answers",
    "list_weights",
    "live_phase",
    "machine_line",
    "measured_peaks",
    "missing_machines",
    "needs_gpus_here",
    "network_line",
    "newest_checkpoint",
    "output_dir",
    "phase_now",
    "preflight_problems",
    "preview",
    "queue_sweep",
    "rank_log",
    "read_job",
    "read_notes",
    "read_phases",
    "read_records",
    "refusal_text",
    "report",
    "reshaped",
    "restart_cost",
    "resume_run",
    "select",
    "shown_value",
    "slow_rank_line",
    "smoke_verdict",
    "source_label",
    "start_smoke_run",
    "starting_phase",
    "summarize",
    "sweep_specs",
    "telemetry_warnings",
    "write_notes",
]
