"""A run on this machine: tunedeck's own supervisor (backend/runs/supervisor.py) is its scheduler.

The supervisor runs as a bare script in a session of its own, starts `accelerate launch`, carries
out stops and restarts and records the end in status.json. An active state is trusted only while
that supervisor is alive; a supervisor killed by hand leaves a run whose end every reader works
out the same way from the run's own records.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tunedeck.backend.runs import folder as run_folder
from tunedeck.backend.runs import supervisor
from tunedeck.backend.runs.folder import ACTIVE_STATES, STATUS_FILE, STOP_FILE, read_status_file
from tunedeck.backend.runs.status import RunError
from tunedeck.backend.runs.supervisor import is_alive

BACKEND = "local"
UNAVAILABLE: tuple[type[Exception], ...] = ()  # nothing between tunedeck and its own supervisor can be out of reach
QUEUED_GRACE_S = 30.0  # a queued run's folder is written before its supervisor starts and records itself


def queued_for_s(status: dict) -> float:
    """How long ago the run was queued: on the monotonic clock in the boot it was queued in (a step of the wall
    clock must neither age a fresh run nor keep an abandoned one fresh), else on the wall clock."""
    if status.get("created_monotonic") is not None and status.get("created_in_boot") == supervisor.boot_id():
        return time.monotonic() - status["created_monotonic"]
    return time.time() - (status.get("created_at") or 0)


def submit(spec, run_dir: Path, inherited: dict[str, str], changes: dict[str, str]) -> subprocess.Popen:
    """Start the run folder's supervisor; from here on it is the only writer of status.json (it records itself
    first). It runs as a script (it needs only psutil), so it works whether or not tunedeck is installed."""
    try:
        with open(run_dir / run_folder.SUPERVISOR_LOG, "ab") as log:
            return subprocess.Popen(
                [sys.executable, supervisor.__file__, str(run_dir)],
                cwd=run_dir,
                env={**inherited, **changes},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # survives the manager (and a Ctrl-C in its terminal)
            )
    except OSError as exc:
        supervisor.record_end(
            run_dir,
            tries=2,
            retry_s=0,
            state="failed",
            ended_at=time.time(),
            error=f"could not start the supervisor: {exc}",
        )
        raise RunError(f"could not start the run: {exc}") from None


def follow(run_dir: Path, data: dict) -> dict:
    """Trust an active state only while the supervisor that owns the run is alive (pid + start time)."""
    if is_alive(data.get("supervisor")):
        if data["state"] == "running" and (run_dir / STOP_FILE).exists():
            data = {**data, "state": "stopping"}
        return data
    # Between write and spawn the supervisor is not recorded yet: a fresh queued run is still fine.
    if data["state"] == "queued" and not data.get("supervisor") and queued_for_s(data) < QUEUED_GRACE_S:
        return data
    data = read_status_file(run_dir)  # it may have finished between our two reads
    if data["state"] not in ACTIVE_STATES or is_alive(data.get("launcher")):
        return data  # ended, or the supervisor was killed but training goes on: still running
    state, error = supervisor.final_state(run_dir, None, (run_dir / STOP_FILE).exists())
    ended = {"state": state, "ended_at": data.get("ended_at") or run_folder.last_written(run_dir), "error": error}
    problem = supervisor.record_end(run_dir, tries=2, retry_s=0, **ended)
    if problem:  # e.g. a full disk: every reader works the end out the same way until it can be written
        ended["error"] = f"{error}\n(this end is not recorded in {STATUS_FILE}: {problem})"
    return {**data, **ended}


def stop(run_dir: Path, data: dict, grace_s: float) -> None:
    """stop.request for the supervisor (SIGTERM to it when the disk is full); without a live supervisor, the
    launcher's process tree is stopped here and the end recorded."""
    owner = data.get("supervisor")
    try:
        run_folder.write_stop_request(run_dir, grace_s)
    except OSError:  # a full disk: the request travels as a signal (an empty stop.request means the same)
        if is_alive(owner):
            os.kill(owner["pid"], signal.SIGTERM)
    if not is_alive(owner):
        _stop_without_supervisor(run_dir, grace_s)


def _stop_without_supervisor(run_dir: Path, grace_s: float) -> None:
    # Only when the supervisor died (killed by hand): stop the launcher's tree ourselves, then settle the status.
    import psutil

    launcher = run_folder.read_status_quietly(run_dir).get("launcher")
    if is_alive(launcher):
        root = psutil.Process(launcher["pid"])
        tree = [root, *root.children(recursive=True)]
        supervisor.kill_tree(root.children(), signal.SIGTERM, timeout=grace_s)
        supervisor.kill_tree(tree)
    state, error = supervisor.final_state(run_dir, None, stop_requested=True)
    supervisor.record_end(run_dir, tries=2, retry_s=0, state=state, ended_at=time.time(), error=error)


def fetch(run_dir: Path, data: dict, checkpoint: int | None) -> Path:
    """The weights of a run on this machine are already in its folder."""
    raise RunError(f"run {run_dir.name} ran on this machine: its weights are in its folder already")
