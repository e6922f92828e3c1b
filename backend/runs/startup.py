"""What a run does before its first step, from startup.json (train.py's StartupPhases) and the ranks behind rank 0.

Loading a 70B model, tokenizing a large dataset or DeepSpeed compiling its ops can take many minutes
before step 1, and a run that shows "step 0" all that while reads as hung. train.py rewrites
startup.json as rank 0 enters each phase ({"phases": [{"phase", "at"}]}, "at" in seconds since the
epoch); the progress line names the phase it is in and for how long, and `tunedeck runs show` how long
each took ("training" closes the list: the first step is done).

Every other rank writes its own phases to logs/rank<N>.startup.json, with its host. Rank 0 waits for the
others at each collective step (joining, DeepSpeed's or FSDP's wrapping), so a run held up by one slow
node reads as rank 0 "preparing the model" for minutes: the line then names the rank that is behind
("rank 9 on gpu-b still loading the model for 4:10"), or the ranks that never started.
"""

from __future__ import annotations

import json
import time
from itertools import pairwise
from pathlib import Path

from tunedeck.backend.recipe.records import RANK_STARTUP_FILE, STARTUP_FILE
from tunedeck.backend.runs.folder import LOGS_DIR
from tunedeck.backend.runs.job_file import UnreadableJob, read_job
from tunedeck.backend.runs.records import RunRecords
from tunedeck.backend.runs.summary import format_clock
from tunedeck.backend.spec import JobSpec

BEHIND_AFTER_S = 10  # rank 0 in a phase this long: the ranks behind it are named (not read at every poll before)
EARLIER_ATTEMPT_S = 60  # a rank's phases begun this long before rank 0's are a requeued job's earlier attempt
JOINING = "joining the other processes"  # the process group forms: every rank waits for the others
JOIN_HINT_AFTER_S = 120  # joining takes seconds when every rank is up: longer, the line says what to check
FIRST_STEP = "the first step"  # entered when training begins: the time before it is what the estimate calls startup
TRAINING = "training"  # the phase after the first step: startup is over


def read_phases(run_dir: Path | str) -> list[tuple[str, float]]:
    """Rank 0's [(phase, began at)] in order; [] when the run wrote none (yet) or the file is not what train.py
    writes."""
    return _read_phases_file(Path(run_dir) / STARTUP_FILE)[1]


def _read_phases_file(path: Path) -> tuple[str | None, list[tuple[str, float]]]:
    """(host, [(phase, began at)]) from one rank's file; (None, []) when missing or not what train.py writes."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        phases = [(str(p["phase"]), float(p["at"])) for p in data["phases"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, []
    host = data.get("host")
    return (str(host) if host else None), phases


def phase_now(run_dir: Path | str, now: float | None = None) -> str | None:
    """The run's phase before its first step, for the progress line (None once training), with the ranks behind
    rank 0 once it has waited a while."""
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    phases = read_phases(run_dir)
    text = current_phase(phases, now)
    if not text:
        return None
    behind = behind_now(run_dir, phases, now)
    text += f" · {behind}" if behind else ""
    if phases[-1][0] == JOINING and now - phases[-1][1] > JOIN_HINT_AFTER_S:
        text += f" ({join_hint(read_job(run_dir))})"
    return text


def behind_now(run_dir: Path, phases: list[tuple[str, float]], now: float) -> str | None:
    """ranks_behind once rank 0, starting, has waited BEHIND_AFTER_S in its phase; None before, or once training.
    job.yaml and the ranks' files are read only then: the page asks every half second."""
    if starting_phase(phases) is None or now - phases[-1][1] <= BEHIND_AFTER_S:
        return None
    return ranks_behind(run_dir, phases, read_job(run_dir), now)


def ranks_behind(
    run_dir: Path, phases: list[tuple[str, float]], job: JobSpec | UnreadableJob, now: float
) -> str | None:
    """'rank 3 on gpu-b still loading the model for 2:10 (2 ranks behind)' or 'ranks 4-7 of 8 have not started':
    the ranks that have entered fewer phases than rank 0 (whose `phases` these are); None when none is behind.

    A rank with no file has not started only where every rank writes to this run folder: one machine, or Slurm
    (whose runs folder every node shares). Machines started by hand may run the bundle in a folder of their own."""
    if isinstance(job, UnreadableJob):
        return None  # how many ranks there are is in the job
    world = job.launch.num_processes
    sees_every_rank = job.launch.num_machines == 1 or job.launch.backend == "slurm"
    host0 = _read_phases_file(run_dir / STARTUP_FILE)[0]
    behind, not_started = [], []
    for rank in range(1, world):
        host, own = _read_phases_file(run_dir / LOGS_DIR / RANK_STARTUP_FILE.format(rank=rank))
        if not own or own[0][1] < phases[0][1] - EARLIER_ATTEMPT_S:
            not_started.append(rank)
        elif len(own) < len(phases):
            behind.append((len(own), rank, host, own[-1]))
    if not_started and sees_every_rank:
        verb = "has" if len(not_started) == 1 else "have"
        return f"{_plural_ranks(not_started)} of {world} {verb} not started"
    if not behind:
        return None
    _, rank, host, (phase, began) = min(behind)
    where = f" on {host}" if host and host != host0 else ""
    doing = phase if phase.split()[0].endswith("ing") else f"in {phase}"
    more = f" ({len(behind)} ranks behind)" if len(behind) > 1 else ""
    return f"rank {rank}{where} still {doing} for {format_clock(max(0.0, now - began))}{more}"


def _plural_ranks(ranks: list[int]) -> str:
    """'rank 3', 'ranks 3-7', 'ranks 2, 5-6': sorted rank numbers, runs of them as ranges."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


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


def join_hint(job: JobSpec | UnreadableJob) -> str:
    """What keeps the process group from forming, for a run whose ranks have waited long: a machine not started
    (by hand), or one that cannot reach machine 0's port."""
    if isinstance(job, UnreadableJob) or job.launch.num_machines == 1:
        return "a process has not joined: its log under logs/ says why"
    launch = job.launch
    machines, port = launch.num_machines, launch.main_process_port
    if launch.backend == "slurm":
        return f"the {machines} nodes must reach the first one on port {port} (launch.main_process_port)"
    where = f"{launch.main_process_ip or 'machine 0'}:{port}"
    return f"each of the {machines} machines must run launch.sh with its own MACHINE_RANK and reach {where}"


def breakdown(phases: list[tuple[str, float]], least_s: float = 0.0) -> str | None:
    """'0:42 (loading the model 0:12, loading the data 0:05, ...)': the time before step 1 and each phase's part;
    None until training began. Phases shorter than `least_s` are counted, not named (the page's summary: a run
    of the demo spends its startup importing the libraries, and six "0:00" say nothing)."""
    if len(phases) < 2 or phases[-1][0] != TRAINING:
        return None
    spans = [(phase, later - began) for (phase, began), (_, later) in pairwise(phases)]
    total = phases[-1][1] - phases[0][1]
    named = [f"{p} {format_clock(s)}" for p, s in spans if s >= least_s]
    short = len(spans) - len(named)
    if short:
        named.append(f"{'the rest' if named else 'each phase'} under {least_s:g} s")
    return f"{format_clock(total)} (" + ", ".join(named) + ")"
