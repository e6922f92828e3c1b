"""Every rank's Python stack now, from a live run on this machine: where is it, what does it wait for?

train.py registers faulthandler on SIGUSR1, so a rank that gets it writes every thread's stack
to its own log (logs/rank<N>.log) and goes on; that works while its main thread is stuck in a
collective or in C++, which is when it is wanted. Only the ranks get the signal (the processes
running the bundle's training script): the launcher's elastic agent would die of it.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil

from tunedeck.backend.render.launch import TRAIN_SCRIPT
from tunedeck.backend.runs.folder import rank_log
from tunedeck.backend.runs.status import RunStatus
from tunedeck.backend.runs.supervisor import file_size

STACK_HEADER = "most recent call first"  # faulthandler's line before each thread's frames


class StacksError(RuntimeError):
    """Why no stacks can be asked for: the message says what to do instead."""


def rank_processes(status: RunStatus) -> dict[int, psutil.Process]:
    """Rank -> its process, for a live local run (its launcher's children that run the training script)."""
    if status.backend != "local" or status.state not in ("running", "stopping") or not status.pid:
        where = "on its Slurm nodes" if status.backend == "slurm" else "nowhere now"
        raise StacksError(
            f"run {status.run_id} is {status.state} and runs {where}: only a live run's ranks on this machine can "
            "be asked (on another machine, `kill -USR1 PID` of each rank writes its stack to its log)"
        )
    ranks = {}
    try:
        children = psutil.Process(status.pid).children()
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        try:
            if any(part.endswith(TRAIN_SCRIPT) for part in child.cmdline()):
                ranks[int(child.environ().get("RANK", "-1"))] = child
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            continue
    if not ranks:
        raise StacksError(f"run {status.run_id} has no rank processes yet: it is still starting")
    return ranks


def dump_stacks(status: RunStatus, run_dir: Path, wait_s: float = 5.0) -> dict[int, str]:
    """Ask every rank of the run for its stacks; rank -> what it wrote (empty if it did not answer in wait_s,
    as a rank stopped by SIGSTOP or in uninterruptible I/O does not)."""
    ranks = rank_processes(status)
    logs = {rank: Path(run_dir) / rank_log(rank) for rank in ranks}
    sizes = {rank: file_size(path) for rank, path in logs.items()}
    for process in ranks.values():
        try:
            process.send_signal(signal.SIGUSR1)
        except psutil.NoSuchProcess:
            continue
    deadline, written = time.monotonic() + wait_s, {}
    while time.monotonic() < deadline:
        written = {rank: _appended(path, sizes[rank]) for rank, path in logs.items()}
        if all(STACK_HEADER in text for text in written.values()):
            time.sleep(0.3)  # every thread's stack is written at once, but not in one write
            return {rank: _appended(path, sizes[rank]) for rank, path in logs.items()}
        time.sleep(0.1)
    return {rank: text if STACK_HEADER in text else "" for rank, text in written.items()}


def _appended(path: Path, since: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(since)
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
