"""A run's status as the manager reports it; damaged run folders; live runs whose folder is gone.

One damaged or foreign folder must never break the listing of the others: a run folder whose
status.json is missing, unreadable or of the wrong shape (run_folder.read_status_file) is one
run in state "damaged", with the reason. A run whose folder (or status.json) was deleted
while it ran is still found through its supervisor, whose command line names the run folder
(`python .../supervisor.py RUNS_DIR/RUN_ID`), so it can be listed and stopped.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tunedeck.backend.runs.folder import ACTIVE_STATES, STATUS_FILE
from tunedeck.backend.runs.supervisor import boot_id
from tunedeck.backend.spec.problem import Problem

DAMAGED = "damaged"
SUPERVISOR_SCRIPT = "supervisor.py"


class RunError(Exception):
    """Why a run cannot be started, found or stopped; the message is for the user."""

    # Start's refusal (backend/runs/preflight.py: refusal) also keeps its problems, which the page names by label.
    problems: list[Problem]
    head: str | None = None


@dataclass
class RunStatus:
    run_id: str
    state: str  # queued | running | stopping | finished | failed | stopped | damaged
    pid: int | None  # the launcher (`accelerate launch`), leader of the run's process group
    started_at: float | None  # seconds since the epoch
    ended_at: float | None
    exit_code: int | None
    error: str | None  # on failure: the error lines of the rank that failed first; damaged: why
    title: str  # one line: model, method, strategy
    gpu_ids: list[int] | None = None  # the GPUs the run holds (None: CPU, or unknown)
    folder_deleted: bool = False  # live, but its folder or status.json was deleted
    backend: str = "local"  # where it runs: local | slurm | skypilot (backend/runs/backends.py)
    slurm: dict | None = None  # a Slurm run: job_id, state, reason, nodes, expected_start (backend/runs/slurm_runs.py)
    skypilot: dict | None = None  # a SkyPilot managed job: job_id, name, state, reason (backend/runs/sky_runs.py)
    waits_for: list[str] | None = None  # a queued run: the runs ahead of it, which it starts after
    stalled: dict | None = None  # a live run with no training step for too long (run_folder.Stalled)
    warning: str | None = None  # the run's own latest warning (a reward that scored no answer of a step)
    attempts: list[dict] = field(default_factory=list)  # the attempts of a run started again (run_folder.Attempt)
    restarting: dict | None = None  # between two attempts: when the next starts (run_folder.Restarting)
    failure: dict | None = None  # a failed run: its failure's class and why it was not retried (run_folder.Failure)

    def attempt_lines(self) -> list[str]:
        """A line per attempt of a run started again (by a roll-back or after a failure), and the class of the
        failure that ended the run with why it was not started again."""
        lines = []
        for a in self.attempts:
            at = f" at step {a['step']}" if isinstance(a.get("step"), int) else ""
            then = " → started again from its newest checkpoint" if a.get("retried") else ""
            lines.append(f"attempt {a.get('attempt', '?')} ended {a.get('end', '?')}{at}: {a.get('reason', '')}{then}")
        if self.failure and self.state == "failed":
            lines.append(f"✗ {self.failure.get('kind')}: not started again: {self.failure.get('not_retried')}")
        return lines

    @property
    def place(self) -> str:
        """Where it runs, in a word: local, slurm:JOB_ID or skypilot:JOB_ID (`tunedeck runs`' WHERE)."""
        if self.slurm:
            return f"slurm:{self.slurm.get('job_id')}"
        if self.skypilot:
            return f"skypilot:{self.skypilot.get('job_id', '…')}"
        return self.backend

    @property
    def where(self) -> str:
        """One line on where the run is, for a Slurm run: 'Slurm job 12 · PENDING (Resources)'; for a run queued
        after others: 'waits for run 20261203-101500-ab12cd to end'; for a stalled run, what stalls; for a run that
        warned, its warning (also once it has ended: a run can finish having learned nothing)."""
        if self.state == "queued" and self.waits_for:
            runs = "run " + self.waits_for[0] if len(self.waits_for) == 1 else "runs " + ", ".join(self.waits_for)
            return f"waits for {runs} to end"
        if self.stalled and self.state in ("running", "stopping"):
            limit = float(self.stalled.get("limit_s") or 0)
            gap = f"{limit:.0f} s" if limit < 90 else f"{limit / 60:.0f} min"
            what = (
                f"{self.stalled['phase']} for over {gap}"
                if self.stalled.get("phase")
                else f"no training step for over {gap} after step {self.stalled.get('step')}"
            )
            return f"⚠ stalled: {what} · each rank writes its Python stack to its log (logs/rank<N>.log)"
        if self.restarting and self.state == "running":
            wait = max(0.0, float(self.restarting.get("at") or 0) - time.time())
            after = self.restarting.get("after")
            return f"↻ starts again from its newest checkpoint in {wait:.0f} s, after a {after} failure"
        if self.warning and not self.slurm:
            return f"⚠ {self.warning}"
        if self.skypilot:
            return skypilot_line(self.skypilot)
        if not self.slurm:
            return ""
        line = f"Slurm job {self.slurm.get('job_id')}"
        if self.slurm.get("state"):
            line += f" · {self.slurm['state']}"
        if self.slurm.get("reason"):
            line += f" ({self.slurm['reason']})"
        if self.slurm.get("nodes"):
            line += f" on {', '.join(self.slurm['nodes'])}"
        if self.state == "queued" and self.slurm.get("expected_start"):
            line += f" · expected start {self.slurm['expected_start']}"
        return line


def skypilot_line(skypilot: dict) -> str:
    """'SkyPilot job 3 (tunedeck-x) · STARTING · provisioning: ...', a SkyPilot run's `where`."""
    line = f"SkyPilot job {skypilot.get('job_id', '…')}"
    if skypilot.get("name"):
        line += f" ({skypilot['name']})"
    if skypilot.get("state"):
        line += f" · {skypilot['state']}"
    if skypilot.get("reason"):
        line += f" · {skypilot['reason']}"
    return line


# ---------------------------------------------------------------- its processes


def start_on_the_clock(identity: dict | None) -> float | None:
    """When a process recorded in this boot started, on the wall clock as it is set now (None: not known).

    A start time written down before a step of the clock is off by the step, and so would be the
    elapsed time of a live run computed from it (0:00 for ten minutes after a step back of ten).
    """
    if not identity or identity.get("since_boot") is None or not identity.get("boot_id"):
        return None
    return psutil.boot_time() + identity["since_boot"] if identity["boot_id"] == boot_id() else None


def from_status_file(run_id: str, data: dict) -> RunStatus:
    launcher = data.get("launcher") or {}
    started_at = data.get("started_at")
    if started_at is not None and data["state"] in ACTIVE_STATES:  # its elapsed time counts on
        started_at = start_on_the_clock(launcher) or started_at
    return RunStatus(
        run_id=run_id,
        state=data["state"],
        pid=launcher.get("pid"),
        started_at=started_at,
        ended_at=data.get("ended_at"),
        exit_code=data.get("exit_code"),
        error=data.get("error"),
        title=data.get("title") or "",
        gpu_ids=data.get("gpu_ids"),
        backend=data.get("backend") or "local",
        slurm=data.get("slurm") if isinstance(data.get("slurm"), dict) else None,
        skypilot=data.get("skypilot") if isinstance(data.get("skypilot"), dict) else None,
        waits_for=data.get("waits_for"),
        stalled=data.get("stalled") if isinstance(data.get("stalled"), dict) else None,
        warning=data.get("warning") if isinstance(data.get("warning"), str) else None,
        attempts=[a for a in data.get("attempts") or [] if isinstance(a, dict)],
        restarting=data.get("restarting") if isinstance(data.get("restarting"), dict) else None,
        failure=data.get("failure") if isinstance(data.get("failure"), dict) else None,
    )


def damaged(run_id: str, run_dir: Path, reason: str) -> RunStatus:
    return RunStatus(
        run_id=run_id,
        state=DAMAGED,
        pid=None,
        started_at=None,
        ended_at=None,
        exit_code=None,
        error=f"{reason}: tunedeck cannot follow this run; its files are in {run_dir} (delete the folder if you do not need them)",
        title="damaged run folder",
    )


# ---------------------------------------------------------------- runs whose folder was deleted


def live_supervisors(runs_dir: Path) -> dict[str, psutil.Process]:
    """Run id -> live supervisor process, for every supervisor whose command line names a folder in runs_dir."""
    found = {}
    for proc in psutil.process_iter(["cmdline"]):  # a zombie's command line is empty
        cmdline = proc.info["cmdline"] or []
        if (
            len(cmdline) >= 2
            and os.path.basename(cmdline[-2]) == SUPERVISOR_SCRIPT
            and Path(cmdline[-1]).parent == runs_dir
        ):
            found[Path(cmdline[-1]).name] = proc
    return found


def orphan_status(run_id: str, run_dir: Path, supervisor: psutil.Process) -> RunStatus:
    """A live run whose status.json is gone: what its processes still tell."""
    try:
        children = supervisor.children()
        gpus = supervisor.environ().get("CUDA_VISIBLE_DEVICES") or ""
        started = supervisor.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        children, gpus, started = [], "", None
    gone = deleted_path(run_dir)
    return RunStatus(
        run_id=run_id,
        state="running",
        pid=children[0].pid if children else None,
        started_at=started,
        ended_at=None,
        exit_code=None,
        error=(
            f"{gone} was deleted while the run was live: its processes still run (supervisor pid {supervisor.pid}), "
            f"but nothing of it can be recorded; stop it with `tunedeck runs stop {run_id}` or the Stop button"
        ),
        title=f"({gone.name if gone.name == STATUS_FILE else 'folder'} deleted)",
        gpu_ids=[int(i) for i in gpus.split(",") if i.strip().isdigit()] or None,
        folder_deleted=True,
    )


def deleted_path(run_dir: Path) -> Path:
    """What was deleted of a run: its whole folder, or only its status.json."""
    return run_dir if not run_dir.exists() else run_dir / STATUS_FILE


def ask_to_stop(supervisor: psutil.Process) -> bool:
    """SIGTERM to a run's supervisor is a stop request (supervisor.py); False if it is gone."""
    try:
        supervisor.send_signal(signal.SIGTERM)  # psutil checks the pid still names the same process
        return True
    except psutil.NoSuchProcess:
        return False
