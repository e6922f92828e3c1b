"""The run folder's files as the ranks write them: logs, metrics.jsonl lines, progress.json, startup.json, the stop
request; and TUNEDECK_FAULT, the fault injection the tests of the failure paths use.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

# Fault injection for testing the failure path: TUNEDECK_FAULT="rank=1,step=2" makes rank 1 raise at the end of
# step 2 (step 0: as training begins); "rank=*,step=0,exit=0" makes every rank leave then with os._exit(0), without
# a word, as user code may; "rank=1,seconds=20,phase=loading the model" makes rank 1 a slow node. Unset in normal use.
FAULT_ENV = "TUNEDECK_FAULT"


def redirect_output(run_dir: Path, rank: int):
    """Send this process's stdout and stderr (Python and C level) to logs/rank<N>.log.

    Returns a text stream on the original terminal for rank 0 when it is one (someone ran
    launch.sh by hand), so they still see progress; otherwise None.
    """
    logs = run_dir / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    terminal = None
    if rank == 0 and os.isatty(2):
        terminal = os.fdopen(os.dup(2), "w", buffering=1)
    fd = os.open(logs / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):  # typed TextIO; the interpreter's own streams are TextIOWrappers
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    faulthandler.enable()  # a crash in C code still leaves a Python stack in the log
    # Where is a stuck rank? `kill -USR1 PID` (or tunedeck, when the run stalls) writes every thread's stack here.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    show_each_warning_once()
    if terminal:
        print(f"rank 0 logs to {logs / 'rank0.log'}, metrics to {run_dir / METRICS_FILE}", file=terminal)
    return terminal


def show_each_warning_once() -> None:
    """Print each distinct warning once per process, however often the libraries raise it.

    Python's own once-per-place rule forgets what it showed whenever any code enters
    warnings.catch_warnings, which the stack does every step: under ZeRO-3 DeepSpeed's calls of
    collectives torch deprecated printed one FutureWarning per step and per rank, half the lines of a
    rank log. warnings.showwarning is the documented hook for how warnings are shown.
    """
    import warnings

    shown: set[tuple] = set()
    show = warnings.showwarning

    def show_once(message, category, filename, lineno, file=None, line=None):
        key = (str(message), category, filename, lineno)
        if key not in shown:
            shown.add(key)
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = show_once


class JsonlWriter:
    """Appends one JSON object per line; each record is one write(), so readers never see half a line."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, record: dict) -> None:
        line = (json.dumps(record, default=_json_default) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _json_default(value):
    if hasattr(value, "item"):  # tensors and numpy scalars
        return value.item()
    return str(value)


METRICS_FILE = "metrics.jsonl"  # rank 0's records: start, a log per logging step, end
ERRORS_FILE = "errors.jsonl"  # a line per rank that failed
LOGS_DIR = "logs"  # each rank's log, and every rank's but 0's startup phases
STOP_FILE = "stop.request"  # the run folder's stop request (backend/runs/folder.py)

PROGRESS_FILE = "progress.json"  # rank 0's last finished step (backend/runs/folder.py)


def write_progress(
    run_dir: Path, step: int, saving: bool = False, micro: int = 0, forwards: int = 0, warning: str | None = None
) -> None:
    """Rank 0's last finished step and when, the micro-batches it has done (a step of many is progress as they
    come), its forward passes (GRPO writes answers a token a pass, for minutes inside one micro-batch), and
    whether it is saving a checkpoint (which is no stall); replaced whole: never read half-written. `warning`: the
    run's latest warning (a reward that scored no answer), which the supervisor carries to the run's state line."""
    tmp = run_dir / f".{PROGRESS_FILE}.tmp"
    record = {"step": step, "micro": micro, "forwards": forwards, "time": time.time(), "saving": saving}
    if warning:
        record["warning"] = warning
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, run_dir / PROGRESS_FILE)


TELEMETRY_DIR = "telemetry"  # telemetry/<host>.jsonl: each machine's GPUs and host (telemetry.py)
STARTUP_FILE = "startup.json"  # rank 0's phases before its first step (backend/runs/startup.py)

RANK_STARTUP_FILE = "rank{rank}.startup.json"  # under logs/: every other rank's


class StartupPhases:
    """This rank's phases before its first step, each with when it began, rewritten whole as it enters each: rank
    0's in startup.json, the others' in logs/rank<N>.startup.json with their host. Loading a 70B model can take many
    minutes, and a run that says only "step 0" all that while reads as hung; the panel's progress line names rank
    0's phase, and the rank behind it when rank 0 waits. "training" closes the list once the first step is done.
    A rank below 0 writes nothing."""

    def __init__(self, run_dir: Path, rank: int):
        self.path = None
        if rank == 0:
            self.path = run_dir / STARTUP_FILE
        elif rank > 0:
            self.path = run_dir / LOGS_DIR / RANK_STARTUP_FILE.format(rank=rank)
        self.phases: list[dict] = []
        self._slow = _parse_slow_phase(os.environ.get(FAULT_ENV), rank)

    def enter(self, phase: str) -> None:
        if self.path is None or (self.phases and self.phases[-1]["phase"] == "training"):
            return
        self.phases.append({"phase": phase, "at": time.time()})
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with contextlib.suppress(OSError):  # a full disk must not stop the run for this
            tmp.write_text(json.dumps({"host": socket.gethostname(), "phases": self.phases}), encoding="utf-8")
            os.replace(tmp, self.path)
        if self._slow and self._slow[0] == phase:
            time.sleep(self._slow[1])  # fault injection: a slow node (see _parse_slow_phase)


class StopRequest:
    """Set by SIGTERM/SIGINT, or by a stop.request file in the run folder; the training loop acts on it
    at the next step boundary.

    The file reaches every node through the shared run folder without a signal: on Slurm a signal
    also reaches torch's elastic agent, which kills its ranks 30 s later, saved or not (slurm.sbatch
    writes the file when the time limit nears).
    """

    def __init__(self, run_dir: Path | None = None):
        self._set = False
        self._file = run_dir / STOP_FILE if run_dir is not None else None

    @property
    def requested(self) -> bool:
        if not self._set and self._file is not None and self._file.exists():
            print(f"found {STOP_FILE}: stopping after the current step", flush=True)
            self._set = True
        return self._set

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if not self._set:
            print(f"received {signal.Signals(signum).name}: stopping after the current step", flush=True)
        self._set = True


def _parse_fault(text: str | None) -> tuple[str, int, int | None] | None:
    """(rank, step, exit code) when TUNEDECK_FAULT="rank=1,step=2" names a step: that rank ("*": every rank) raises
    there, or with ",exit=0" leaves at once with that exit code."""
    parts = _fault_parts(text)
    if "step" not in parts:
        return None
    return parts["rank"], int(parts["step"]), int(parts["exit"]) if "exit" in parts else None


def _parse_slow_phase(text: str | None, rank: int) -> tuple[str, float] | None:
    """(phase, seconds) when TUNEDECK_FAULT="rank=1,seconds=20,phase=loading the model" names this rank: it stays
    that much longer in that phase, as a slow node would (the phase last: the rest of the text is its name)."""
    parts = _fault_parts(text)
    if "phase" not in parts or int(parts["rank"]) != rank:
        return None
    return parts["phase"], float(parts["seconds"])


def _fault_parts(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    head, _, phase = text.partition(",phase=")
    parts = dict(item.split("=", 1) for item in head.split(","))
    return {**parts, "phase": phase} if phase else parts


ROLLBACK_FILE = "rollback.json"  # a roll-back of the health guard: where the next attempt resumes (rollback.py)
ANSWERS_FILE = "answers.jsonl"  # rank 0, GRPO: what the model just wrote, scored


def last_record(path: Path, wanted, tail_bytes: int = 65536) -> dict | None:
    """The newest JSON object of a .jsonl file that wanted(record) accepts, read from its last tail_bytes."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the tail's first line may be cut
        if isinstance(record, dict) and wanted(record):
            return record
    return None
