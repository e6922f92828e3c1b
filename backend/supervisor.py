"""The run supervisor: a small process that owns one run's launcher from start to exit.

    python backend/supervisor.py RUN_DIR     (it needs only psutil: no tunedeck import)

The run manager starts it in its own session and returns; the supervisor starts the
launcher (argv and environment prepared by the manager, recorded in status.json),
records pid and process start time, carries out a stop request (the manager drops a
`stop.request` file), and writes the final state and exit code to status.json when the
launcher exits. Because it outlives the manager, a panel restart loses nothing: the new
manager re-attaches by reading status.json and checking pids and start times.

Stop: SIGTERM to the ranks (the launcher's children), which finish their step, save a
checkpoint and exit; the launcher then exits by itself. The launcher itself is not
signalled first: torch's elastic agent answers SIGTERM by killing its workers 30 s later,
which could cut a large checkpoint in half. After the grace period, SIGKILL to every
process of the run. Signalling the launcher's process group would not do: the elastic
agent starts each rank in a session of its own. The supervisor is a child subreaper, so
ranks orphaned by a dead launcher stay its descendants; whatever is left when the
launcher exits is killed, so no process of a run outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

STATUS_FILE = "status.json"
STOP_FILE = "stop.request"
LAUNCHER_LOG = "logs/launcher.log"
ERRORS_FILE = "errors.jsonl"  # train.py: one line per failed rank
ACTIVE_STATES = ("queued", "running", "stopping")
POLL_S = 0.2
# After a rank has failed, the others get this long to finish on their own: a rank blocked in
# a collective on its dead peer ignores SIGTERM (gloo and NCCL can wait for many minutes).
FAILURE_GRACE_S = 5.0
ERROR_LINES = 20


# ---------------------------------------------------------------- status.json


def read_status(run_dir: Path) -> dict:
    return json.loads((run_dir / STATUS_FILE).read_text(encoding="utf-8"))


def write_status(run_dir: Path, status: dict) -> None:
    """Atomic replace: a reader never sees a half-written file."""
    tmp = run_dir / f".{STATUS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / STATUS_FILE)


def update_status(run_dir: Path, **changes) -> dict:
    status = read_status(run_dir)
    status.update(changes)
    write_status(run_dir, status)
    return status


def process_identity(pid: int) -> dict:
    """pid plus start time: a pid alone may have been reused by an unrelated process."""
    return {"pid": pid, "create_time": psutil.Process(pid).create_time()}


def is_alive(identity: dict | None) -> bool:
    if not identity or not identity.get("pid"):
        return False
    try:
        proc = psutil.Process(identity["pid"])
        return abs(proc.create_time() - identity["create_time"]) < 0.5 and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


# ---------------------------------------------------------------- how a run ended


def end_record(run_dir: Path) -> dict | None:
    """The training's own {"event": "end"} record from metrics.jsonl, if it wrote one."""
    try:
        with open(run_dir / "metrics.jsonl", "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 65536))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "end":
            return record
    return None


def first_failure(run_dir: Path) -> str | None:
    """The error lines of the rank that failed first (train.py's errors.jsonl), else the launcher log's tail."""
    failures = []
    try:
        for line in (run_dir / ERRORS_FILE).read_text(encoding="utf-8").splitlines():
            try:
                failures.append(json.loads(line))
            except ValueError:
                continue
    except FileNotFoundError:
        pass
    if failures:
        first = min(failures, key=lambda f: f.get("time", 0))
        trace = [l for l in (first.get("traceback") or "").splitlines() if l.strip()]
        if len(trace) > ERROR_LINES:
            trace = ["  ...", *trace[-ERROR_LINES:]]
        return "\n".join([f"rank {first.get('rank')} failed first: {first.get('error')}", *trace])
    try:
        lines = (run_dir / LAUNCHER_LOG).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return None
    lines = [l for l in lines if l.strip()][-ERROR_LINES:]
    return "\n".join(lines) or None


def final_state(run_dir: Path, exit_code: int | None, stop_requested: bool) -> tuple[str, str | None]:
    """(state, error) of a run whose launcher has exited."""
    end = end_record(run_dir)
    trained = end.get("status") if end else None
    if trained == "finished":
        return "finished", None
    if stop_requested:
        return "stopped", None
    if exit_code == 0 and trained in (None, "stopped"):
        return ("stopped" if trained == "stopped" else "finished"), None
    headline = f"the launcher exited with code {exit_code}" if exit_code is not None else "the run's processes are gone"
    return "failed", first_failure(run_dir) or headline


# ---------------------------------------------------------------- supervising


def _become_subreaper() -> None:
    """Adopt orphaned descendants (Linux): if the launcher dies first, its ranks become ours, not init's.

    torch's elastic agent starts every rank in a session of its own, so neither the launcher's
    process group nor its tree alone is a reliable handle on a run's processes.
    """
    try:
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the final sweep still kills the launcher's tree


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_tree(processes: list[psutil.Process], sig: int = signal.SIGKILL, timeout: float = 5.0) -> None:
    """Signal processes and wait (reaping our own children) until they are gone."""
    for proc in processes:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=timeout)


def _kill_run(launcher: subprocess.Popen) -> None:
    """SIGKILL every process of the run. The launcher is reaped by its Popen, which keeps its exit code."""
    others = [p for p in _descendants(os.getpid()) if p.pid != launcher.pid]
    launcher.kill()
    kill_tree(others)
    launcher.wait()


def supervise(run_dir: Path) -> int:
    run_dir = run_dir.resolve()
    status = update_status(run_dir, supervisor=process_identity(os.getpid()))
    (run_dir / "logs").mkdir(exist_ok=True)
    # The manager may be asked to stop before we even start: then there is nothing to run.
    if (run_dir / STOP_FILE).exists():
        update_status(run_dir, state="stopped", ended_at=time.time(), exit_code=None)
        return 0
    _become_subreaper()
    with open(run_dir / LAUNCHER_LOG, "ab") as log:
        try:
            launcher = subprocess.Popen(
                status["argv"],
                cwd=run_dir,
                # The manager started us with the run's environment; the launcher inherits it.
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C or signal meant for us does not reach the run
            )
        except OSError as exc:
            update_status(run_dir, state="failed", ended_at=time.time(), error=f"could not start {status['argv'][0]}: {exc}")
            return 1
    update_status(
        run_dir,
        state="running",
        started_at=time.time(),
        launcher={**process_identity(launcher.pid), "pgid": launcher.pid},
    )
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stray signal must not orphan the run
    stop_since = stop_deadline = failed_since = None
    signalled: set[int] = set()
    while launcher.poll() is None:
        if failed_since is None and (run_dir / ERRORS_FILE).exists():
            failed_since = time.monotonic()
        if failed_since is not None and time.monotonic() > failed_since + FAILURE_GRACE_S:
            _kill_run(launcher)
        stop_file = run_dir / STOP_FILE
        if stop_file.exists():
            if stop_deadline is None:
                stop_since = time.monotonic()
                stop_deadline = stop_since + _grace_seconds(stop_file)
                update_status(run_dir, state="stopping", stop_requested_at=time.time())
            # Ranks may still be starting: signal each one as it appears, once.
            for child in _children(launcher.pid):
                if child.pid not in signalled:
                    signalled.add(child.pid)
                    try:
                        child.send_signal(signal.SIGTERM)
                    except psutil.NoSuchProcess:
                        pass
            if time.monotonic() > stop_deadline:
                _kill_run(launcher)
            elif signalled and not _children(launcher.pid) and time.monotonic() > stop_since + 5:
                launcher.terminate()  # the ranks are gone but the launcher lingers
        time.sleep(POLL_S)
    exit_code = launcher.returncode
    kill_tree(_descendants(os.getpid()))  # nothing of the run outlives it (the launcher is reaped already)
    state, error = final_state(run_dir, exit_code, stop_deadline is not None)
    update_status(run_dir, state=state, ended_at=time.time(), exit_code=exit_code, error=error)
    return 0


def _grace_seconds(stop_file: Path) -> float:
    try:
        return float(json.loads(stop_file.read_text())["grace_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return 60.0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python supervisor.py RUN_DIR", file=sys.stderr)
        return 2
    return supervise(Path(args[0]))


if __name__ == "__main__":
    raise SystemExit(main())
