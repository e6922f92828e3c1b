"""What a run does before its first step, from startup.json (train.py's StartupPhases, rank 0 only).

Loading a 70B model, tokenizing a large dataset or DeepSpeed compiling its ops can take many minutes
before step 1, and a run that shows "step 0" all that while reads as hung. train.py rewrites
startup.json as rank 0 enters each phase ({"phases": [{"phase", "at"}]}, "at" in seconds since the
epoch); the progress line names the phase it is in and for how long, and `tunedeck runs show` how long
each took ("training" closes the list: the first step is done).
"""

from __future__ import annotations

import json
import time
from itertools import pairwise
from pathlib import Path

from tunedeck.backend.run_folder import RunRecords, read_job
from tunedeck.backend.run_summary import format_clock

STARTUP_FILE = "startup.json"  # train.py's copy of the name: STARTUP_FILE
JOINING = "joining the other processes"  # the process group forms: every rank waits for the others
JOIN_HINT_AFTER_S = 120  # joining takes seconds when every rank is up: longer, the line says what to check
FIRST_STEP = "the first step"  # entered when training begins: the time before it is what the estimate calls startup
TRAINING = "training"  # the phase after the first step: startup is over


def read_phases(run_dir: Path | str) -> list[tuple[str, float]]:
    """[(phase, began at)] in order; [] when the run wrote none (yet) or the file is not what train.py writes."""
    try:
        data = json.loads((Path(run_dir) / STARTUP_FILE).read_text(encoding="utf-8"))
        phases = [(str(p["phase"]), float(p["at"])) for p in data["phases"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return phases


def phase_now(run_dir: Path | str, now: float | None = None) -> str | None:
    """The run's phase before its first step, for the progress line (None once training)."""
    now = time.time() if now is None else now
    phases = read_phases(run_dir)
    text = current_phase(phases, now)
    if text and phases[-1][0] == JOINING and now - phases[-1][1] > JOIN_HINT_AFTER_S:
        text += f" ({join_hint(read_job(Path(run_dir)))})"
    return text


def live_phase(run_dir: Path | str, run: RunRecords, ended_at: float | None) -> str | None:
    """phase_now for a run that has neither logged a step nor ended; None, without reading the file, otherwise
    (the panel asks every half second while a page follows the run)."""
    return phase_now(run_dir) if ended_at is None and not run.records else None


def starting_phase(phases: list[tuple[str, float]]) -> str | None:
    """The phase the run is in before its first step; None once training (or with no phases)."""
    return phases[-1][0] if phases and phases[-1][0] != TRAINING else None


def current_phase(phases: list[tuple[str, float]], now: float) -> str | None:
    """'loading the model for 0:42' while the run starts; None once training (or with no phases)."""
    phase = starting_phase(phases)
    return None if phase is None else f"{phase} for {format_clock(max(0.0, now - phases[-1][1]))}"


def join_hint(job: dict) -> str:
    """What keeps the process group from forming, for a run whose ranks have waited long: a machine not started
    (by hand), or one that cannot reach machine 0's port."""
    launch = job.get("launch") or {}
    machines, port = int(launch.get("num_machines") or 1), launch.get("main_process_port", 29500)
    if machines == 1:
        return "a process has not joined: its log under logs/ says why"
    if launch.get("backend") == "slurm":
        return f"the {machines} nodes must reach the first one on port {port} (launch.main_process_port)"
    where = f"{launch.get('main_process_ip') or 'machine 0'}:{port}"
    return f"each of the {machines} machines must run launch.sh with its own MACHINE_RANK and reach {where}"


def breakdown(phases: list[tuple[str, float]]) -> str | None:
    """'0:42 (loading the model 0:12, loading the data 0:05, ...)': the time before step 1 and each phase's part;
    None until training began."""
    if len(phases) < 2 or phases[-1][0] != TRAINING:
        return None
    spans = [(phase, later - began) for (phase, began), (_, later) in pairwise(phases)]
    total = phases[-1][1] - phases[0][1]
    return f"{format_clock(total)} (" + ", ".join(f"{p} {format_clock(s)}" for p, s in spans) + ")"
